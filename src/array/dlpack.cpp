// DLPack (v0.6) export and zero-copy import of host arrays.
#include "array/dlpack_layout.h"

#include "pallas/array.h"

namespace pallas {
namespace {

// Code 6 is kDLBool from DLPack 0.8 on; the 0.6 header has no bool type code. We export bool
// as kDLUInt/8 (what 0.6-era frameworks did) and accept code 6 on import for newer producers.
constexpr uint8_t kDLBoolCode = 6;

}  // namespace

namespace detail {
DLDataType to_dl_dtype(DType t) {
  DLDataType d;
  d.lanes = 1;
  d.bits = static_cast<uint8_t>(bit_width(t));
  if (t == DType::Bool) d.code = kDLUInt;
  else if (is_signed_int(t)) d.code = kDLInt;
  else if (is_unsigned_int(t)) d.code = kDLUInt;
  else if (t == DType::BF16) d.code = kDLBfloat;
  else if (is_float(t)) d.code = kDLFloat;
  else
    throw Error("to_dlpack: dtype " + std::string(dtype_name(t)) +
                " has no DLPack equivalent (semaphores are not exportable)");
  return d;
}

std::string dl_dtype_to_string(DLDataType d) {
  return "code " + std::to_string(d.code) + ", bits " + std::to_string(d.bits) + ", lanes " +
         std::to_string(d.lanes);
}

DType from_dl_dtype(DLDataType d) {
  if (d.lanes != 1)
    throw Error("from_dlpack: vector dtypes are not supported (lanes = " + std::to_string(d.lanes) +
                ", need 1)");
  switch (d.code) {
    case kDLInt:
      switch (d.bits) {
        case 8: return DType::I8;
        case 16: return DType::I16;
        case 32: return DType::I32;
        case 64: return DType::I64;
      }
      break;
    case kDLUInt:
      switch (d.bits) {
        case 8: return DType::U8;
        case 16: return DType::U16;
        case 32: return DType::U32;
        case 64: return DType::U64;
      }
      break;
    case kDLFloat:
      switch (d.bits) {
        case 16: return DType::F16;
        case 32: return DType::F32;
        case 64: return DType::F64;
      }
      break;
    case kDLBfloat:
      if (d.bits == 16) return DType::BF16;
      break;
    case kDLBoolCode:
      if (d.bits == 8) return DType::Bool;
      break;
    default: break;
  }
  throw Error("from_dlpack: unsupported DLPack dtype (" + dl_dtype_to_string(d) +
              "); supported: int/uint 8-64, float 16/32/64, bfloat 16, bool 8");
}

std::string dlpack_device_name(int type) {
  switch (type) {
    case kDLCPU: return "CPU";
    case kDLCUDA: return "CUDA";
    case kDLCUDAHost: return "CUDAHost";
    case kDLOpenCL: return "OpenCL";
    case kDLVulkan: return "Vulkan";
    case kDLMetal: return "Metal";
    case kDLVPI: return "VPI";
    case kDLROCM: return "ROCM";
    case kDLROCMHost: return "ROCMHost";
    case kDLExtDev: return "ExtDev";
    case kDLCUDAManaged: return "CUDAManaged";
    default: return "unknown";
  }
}

DlpackLayout dlpack_layout(const DLTensor& t) {
  DlpackLayout l;
  l.dtype = from_dl_dtype(t.dtype);
  if (t.ndim < 0) throw Error("from_dlpack: negative ndim " + std::to_string(t.ndim));
  if (t.ndim > 0 && t.shape == nullptr) throw Error("from_dlpack: null shape with ndim > 0");
  l.shape = Shape(t.shape, t.shape + t.ndim);
  for (int64_t d : l.shape)
    if (d < 0) throw Error("from_dlpack: negative dimension in shape " + shape_to_string(l.shape));
  const int64_t size = num_elements(l.shape);
  if (t.strides != nullptr && size > 0) {
    // Row-major contiguous; a dimension of size 1 may carry any stride (it is never stepped).
    const std::vector<int64_t> expected = row_major_strides(l.shape);
    for (int i = 0; i < t.ndim; ++i) {
      if (l.shape[i] != 1 && t.strides[i] != expected[i]) {
        throw Error("from_dlpack: strides " + shape_to_string(Shape(t.strides, t.strides + t.ndim)) +
                    " for shape " + shape_to_string(l.shape) + " are not row-major contiguous (expected " +
                    shape_to_string(expected) + "); make the tensor contiguous first");
      }
    }
  }
  if (t.data == nullptr && size > 0) throw Error("from_dlpack: null data pointer");
  l.data = t.data == nullptr ? nullptr : static_cast<char*>(t.data) + t.byte_offset;
  if (reinterpret_cast<uintptr_t>(l.data) % static_cast<uintptr_t>(itemsize(l.dtype)) != 0)
    throw Error("from_dlpack: data pointer is not aligned to the " + std::to_string(itemsize(l.dtype)) +
                "-byte element size of " + std::string(dtype_name(l.dtype)));
  return l;
}
}  // namespace detail

namespace {
// Owns everything an exported tensor points to: what keeps the memory alive and the shape /
// strides arrays. The DLManagedTensor lives inside it too, so the deleter frees all of it at once.
struct ExportContext {
  std::shared_ptr<const void> keep_alive;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  DLManagedTensor tensor{};
};
}  // namespace

DLManagedTensor* detail::export_dlpack(std::shared_ptr<const void> keep_alive, void* data, DLDevice device,
                                       const Shape& shape, DType dtype) {
  const DLDataType dl_dtype = to_dl_dtype(dtype);
  auto ctx = std::make_unique<ExportContext>();
  ctx->keep_alive = std::move(keep_alive);
  ctx->shape = shape;
  ctx->strides = row_major_strides(shape);  // explicit: some consumers require strides
  DLTensor& t = ctx->tensor.dl_tensor;
  t.data = data;  // DLPack has no const; consumers writing through it write into the memory
  t.device = device;
  t.ndim = static_cast<int32_t>(shape.size());
  t.dtype = dl_dtype;
  t.shape = ctx->shape.data();
  t.strides = ctx->strides.data();
  t.byte_offset = 0;
  ctx->tensor.manager_ctx = ctx.get();
  ctx->tensor.deleter = [](DLManagedTensor* self) { delete static_cast<ExportContext*>(self->manager_ctx); };
  return &ctx.release()->tensor;
}

DLManagedTensor* Array::to_dlpack() const {
  return detail::export_dlpack(std::make_shared<const Array>(*this), data_, DLDevice{kDLCPU, 0}, shape_, dtype_);
}

Array Array::from_dlpack(DLManagedTensor* tensor) {
  // On error we throw before taking ownership: the caller still owns `tensor` and must call
  // its deleter.
  if (tensor == nullptr) throw Error("from_dlpack: null tensor");
  const DLTensor& t = tensor->dl_tensor;
  if (t.device.device_type != kDLCPU)
    throw Error("from_dlpack: tensor is on device type " + std::to_string(t.device.device_type) +
                " (" + detail::dlpack_device_name(t.device.device_type) + "); host Arrays need kDLCPU");
  const detail::DlpackLayout l = detail::dlpack_layout(t);
  // From here on we own the tensor: its deleter runs when the last handle dies.
  return wrap(l.data, l.shape, l.dtype, [tensor] {
    if (tensor->deleter != nullptr) tensor->deleter(tensor);
  });
}

}  // namespace pallas
