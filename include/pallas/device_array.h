// Device-resident arrays for the GPU backend: upload once, run pallas_calls on them with no host
// round trip (on a CUDA stream of the caller's), download at the end; DLPack both ways, so a
// PyTorch or CuPy CUDA tensor passes in (and a result passes out) without a copy.
//
//   namespace plgpu = pallas::gpu;
//   plgpu::DeviceArray x = plgpu::DeviceArray::to_gpu(host_x, stream);
//   plgpu::DeviceArray y = plgpu::call_on_device(add_one, {x}, stream).at(0);
//   plgpu::DeviceArray z = plgpu::call_on_device(add_one, {y}, stream).at(0);  // y never left the GPU
//   pallas::Array result = z.to_host(stream);
//
// The same code runs without a GPU against gpu_emulate (the generated CUDA compiled for the CPU):
// DeviceArray::emulated(a) is an array in the emulated device's memory — host memory — and
// call_on_device runs calls whose backend is "gpu_emulate" on such arrays. That is how the tests
// check the device path on machines without a GPU.
#pragma once

#include <memory>

#include "pallas/array.h"
#include "pallas/pallas_call.h"

struct DLManagedTensor;  // from dlpack/dlpack.h

namespace pallas::gpu {

class DeviceArray {
 public:
  DeviceArray() = default;

  // Copies `a` into new GPU memory (on `stream`, a CUstream; null: the default stream). Without
  // a GPU: pallas::Error saying what is missing.
  static DeviceArray to_gpu(const Array& a, void* stream = nullptr);
  // A copy of `a` in the emulated device's memory (for calls with backend "gpu_emulate").
  static DeviceArray emulated(const Array& a);
  // New, uninitialized device memory of this shape and dtype, on the GPU or emulated.
  // On the GPU the memory comes from the device's pool, ordered on `stream` (null: the default
  // stream), and goes back to it when the last handle is gone, ordered on the stream of the
  // array's last call_on_device.
  static DeviceArray uninitialized(const ShapeDtype& s, bool on_gpu, void* stream = nullptr);

  // Copies the data back to a new host Array (waits for `stream`).
  Array to_host(void* stream = nullptr) const;

  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  ShapeDtype shape_dtype() const { return {shape_, dtype_}; }
  int64_t size() const { return num_elements(shape_); }
  int64_t nbytes() const { return size() * itemsize(dtype_); }
  // True for GPU memory, false for the emulated device's (host) memory.
  bool on_gpu() const { return on_gpu_; }
  // The address of the first element (a CUdeviceptr on the GPU; a host address when emulated).
  uint64_t data_ptr() const { return ptr_; }
  bool shares_buffer_with(const DeviceArray& o) const { return storage_ && storage_ == o.storage_; }
  // Emulated arrays only: the host Array that is their memory (shares it; no copy).
  Array emulated_memory() const;

  // DLPack (zero copy), as Array's: export hands the consumer a tensor on kDLCUDA device 0 (GPU)
  // or kDLCPU (emulated) that keeps this memory alive until its deleter runs; import takes
  // ownership of a row-major contiguous tensor on kDLCUDA device 0 (or kDLCPU: an emulated
  // array) — when it throws, it has not taken ownership. Export first waits for the stream of
  // the array's last use (so an asynchronous call writing it has finished: the consumer may read
  // it on any stream): a synchronizing point like to_host, raising what asynchronous calls on it
  // recorded. An array must be let go before that stream is destroyed (its free is ordered there).
  DLManagedTensor* to_dlpack() const;
  static DeviceArray from_dlpack(DLManagedTensor* tensor);

  struct Storage;  // owns the memory (device_array.cpp)

 private:
  friend struct DeviceCalls;  // call_on_device and call_on_device_async (device_array.cpp)
  // An emulated array whose memory is `memory` (no copy).
  static DeviceArray over_host_memory(Array memory);
  std::shared_ptr<Storage> storage_;
  Shape shape_{0};
  DType dtype_ = DType::F32;
  bool on_gpu_ = false;
  uint64_t ptr_ = 0;
};

// Runs `call` on device-resident operands and returns its outputs as device arrays: on the GPU
// (the call's backend is "mosaic_gpu" and every operand on_gpu) on `stream` (a CUstream; null:
// the default stream), or emulated (backend "gpu_emulate", every operand emulated). Operands are
// checked as a call checks host arrays. An aliased output (input_output_aliases) is its input,
// updated in place. The call waits for the stream before it returns, to raise the errors the
// kernel recorded (out-of-bounds blocks, failed checks, deadlocks) as pallas::Error. Dynamic
// grid sizes come first, as with host arrays: device scalars, read back to the host (which waits
// for the stream). A vmapped call (pl::vmap) runs as its one batched kernel on the arrays as they
// lie; one that would run a call per batch element (a dynamic grid, a batched scalar-prefetch
// operand) or move a batch axis (an input aliased to an output batched along another axis) is
// not supported on device arrays: NotSupportedError saying which.
std::vector<DeviceArray> call_on_device(const PallasCall& call, const std::vector<DeviceArray>& args,
                                        void* stream = nullptr);
// The same without waiting: the kernel is queued on `stream` and its outputs come back at once,
// so calls chain on the GPU back to back with no host round trip between them. What a kernel
// records (an out-of-bounds block, a failed check, a deadlock) is raised at the stream's next
// synchronizing point instead — synchronize(stream), DeviceArray::to_host(stream), a waiting
// call_on_device on it — as pallas::Error naming the call: the first such error of the stream's
// calls since the last such point (the later calls ran on what it left). Errors in the call
// itself (shapes, dtypes, arrays on the wrong device) are raised at once, as by call_on_device.
// A call that profiles (gpu::CompilerParams::profile_space) waits; one with dynamic grid sizes
// waits for the stream before it launches (it reads them back). Each launch in flight holds its
// own workspace until it is seen to have finished (an event, checked at the stream's next call):
// past 32 of them, or 256 MiB, a call first waits for the oldest (what it recorded still waits for
// the next synchronizing point). Emulated (gpu_emulate), the kernel runs
// before the call returns and what it recorded waits the same way.
std::vector<DeviceArray> call_on_device_async(const PallasCall& call, const std::vector<DeviceArray>& args,
                                              void* stream = nullptr);
// Waits for `stream` and raises the first error the kernels of asynchronous calls on it recorded
// since the last synchronizing point, if one did.
void synchronize(void* stream = nullptr);

}  // namespace pallas::gpu
