// The NVIDIA driver API, loaded with dlopen (libcuda.so.1 only, never the toolkit's stub), and
// what the GPU backend does with it: the primary context of device 0, device memory, module
// loading (cached per compiled image), launches with cuLaunchKernelEx. No CUDA header is needed to
// build this: the few types used are declared here with the driver ABI's layout.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpu/codegen.h"

namespace pallas::gpu {

struct DriverApi;  // the entry points (driver.cpp)

// Device 0 of this process, its primary context current on the calling thread.
class Device {
 public:
  // The process's device; throws pallas::Error saying what is missing (driver_unavailable_reason).
  static Device& get();
  int compute_capability() const { return cc_major_ * 10 + cc_minor_; }
  // The NVRTC target for this device: "sm_90a" on Hopper (wgmma, setmaxnreg need the a-variant),
  // else "sm_XY".
  std::string arch() const;
  int multiprocessors() const { return sms_; }
  int64_t max_shared_per_block() const { return max_smem_optin_; }
  // Whether kernels compiled for this device take the wgmma path: Hopper (arch() is sm_90a).
  bool runs_wgmma() const { return cc_major_ == 9 && cc_minor_ == 0; }
  const DriverApi& api() const { return *api_; }
  void make_current() const;
  // Waits for `stream` (null: the default stream).
  void synchronize(void* stream) const;
  // Throws pallas::Error naming the call and the driver's message when rc != 0.
  void check(int rc, const char* what) const;

 private:
  Device() = default;
  const DriverApi* api_ = nullptr;
  int device_ = 0;
  void* context_ = nullptr;
  int cc_major_ = 0, cc_minor_ = 0, sms_ = 0;
  int64_t max_smem_optin_ = 0;
};

// Device memory, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = 0, o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  uint64_t ptr() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  void upload(const void* src, size_t bytes, void* stream = nullptr);
  void download(void* dst, size_t bytes, void* stream = nullptr) const;
  // Copies `bytes` from device address `src` (stream-ordered).
  void copy_from(uint64_t src, size_t bytes, void* stream = nullptr);

 private:
  uint64_t ptr_ = 0;
  size_t bytes_ = 0;
};

// Stream-ordered copies from device address `src` (device memory not owned by a DeviceBuffer,
// e.g. imported with DLPack).
void copy_device_to_host(void* dst, uint64_t src, size_t bytes, void* stream);
void copy_device_to_device(uint64_t dst, uint64_t src, size_t bytes, void* stream);

// Loads a compiled image into the current context (kept loaded for the process) and returns its
// function `entry`: for hand-written reference kernels (the benchmarks' plain CUDA copy).
void* load_entry(const std::vector<char>& image, const std::string& entry);
// Launches `function` as blocks x threads with no dynamic shared memory on `stream`, without
// waiting; params as cuLaunchKernel takes them (one pointer per kernel parameter).
void launch_plain(void* function, unsigned blocks, unsigned threads, void** params, void* stream);

// Loads a compiled image (a cubin of `k`'s unit) into the current context and returns its entry
// function, with the dynamic shared memory limit raised when the arena needs more than 48 KiB.
// The module stays loaded for the process: callers keep the function (per traced call).
void* load_function(const std::vector<char>& image, const GeneratedKernel& k);

// Runs loaded kernel `function` of `k`: operands already on the device (`operand_ptrs`, in the
// kernel's order: prefetch, inputs, outputs), on `stream` (null: the default stream), and waits
// for it. Raises the interpreters' error when the kernel recorded one.
void launch_generated(const TracedCall& call, const GeneratedKernel& k, void* function,
                      const std::vector<uint64_t>& operand_ptrs, const std::vector<int64_t>& grid, void* stream);

}  // namespace pallas::gpu
