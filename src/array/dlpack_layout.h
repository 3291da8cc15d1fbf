// DLPack helpers shared by host Arrays (src/array/dlpack.cpp) and the GPU backend's device
// arrays (src/gpu/device_array.cpp): dtype codes both ways, and the checks every import makes.
#pragma once

#include <dlpack/dlpack.h>

#include <memory>
#include <string>

#include "pallas/array.h"

namespace pallas::detail {

DLDataType to_dl_dtype(DType t);   // pallas::Error for dtypes DLPack cannot describe
DType from_dl_dtype(DLDataType d);  // pallas::Error for unsupported codes / lanes
std::string dlpack_device_name(int device_type);  // "CPU", "CUDA", ...

// What an imported tensor holds, checked: a supported dtype, a valid shape, row-major contiguous
// strides, a non-null data pointer (unless empty) aligned to the element size. The device type
// is the caller's to check.
struct DlpackLayout {
  DType dtype = DType::F32;
  Shape shape;
  void* data = nullptr;  // data + byte_offset
};
DlpackLayout dlpack_layout(const DLTensor& t);

// A row-major tensor over `data` on `device` for a consumer, who owns it and calls its deleter;
// `keep_alive` holds the memory until then.
DLManagedTensor* export_dlpack(std::shared_ptr<const void> keep_alive, void* data, DLDevice device,
                               const Shape& shape, DType dtype);

}  // namespace pallas::detail
