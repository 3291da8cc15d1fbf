// The NVIDIA driver API, loaded with dlopen (libcuda.so.1 only, never the toolkit's stub), and
// what the GPU backend does with it: the primary context of device 0, device memory, module
// loading (cached per compiled image), launches with cuLaunchKernelEx. No CUDA header is needed to
// build this: the few types used are declared here with the driver ABI's layout.
#pragma once

#include <atomic>
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
  // Whether device memory comes from a stream-ordered pool (cuMemAllocFromPoolAsync /
  // cuMemFreeAsync), which keeps what is freed for the next allocation instead of giving it back
  // to the driver: a pool of the library's own (cuMemPoolCreate; the device's default pool is left
  // as it is), its release threshold at "keep everything" (so synchronizing does not trim it).
  // False without pool support, with a driver lacking the entry points, or with
  // PALLAS_GPU_NO_POOL=1 (then cuMemAlloc / cuMemFree).
  bool pooled() const { return pooled_; }
  void* pool() const { return pool_; }  // the CUmemoryPool device memory comes from, when pooled()

 private:
  Device() = default;
  const DriverApi* api_ = nullptr;
  int device_ = 0;
  void* context_ = nullptr;
  int cc_major_ = 0, cc_minor_ = 0, sms_ = 0;
  int64_t max_smem_optin_ = 0;
  bool pooled_ = false;
  void* pool_ = nullptr;
};

// Device memory, freed on destruction. From the device's pool (Device::pooled) the allocation is
// ordered on `stream` and so is the free, on the stream of the buffer's last use (use_on): what
// was enqueued there before still reads it, and a later allocation on that stream may take the
// memory at once. Memory handed to another library (DLPack) is freed after a device-wide
// synchronize instead (free_after_device_sync): its work may be on streams we do not know. The
// stream of the last use must outlive the buffer (a free ordered on a destroyed stream is
// undefined: cuMemFreeAsync does not promise to report it).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes, void* stream = nullptr) : DeviceBuffer(bytes, stream, true) {}
  // Memory outside the pool (cuMemAlloc), for buffers kept across calls on any stream (a pool
  // allocation is ordered on one stream).
  static DeviceBuffer outside_pool(size_t bytes) { return DeviceBuffer(bytes, nullptr, false); }
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(o.ptr_), bytes_(o.bytes_), stream_(o.stream_.load()), pooled_(o.pooled_), sync_free_(o.sync_free_.load()) {
    o.ptr_ = 0, o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  uint64_t ptr() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  void upload(const void* src, size_t bytes, void* stream = nullptr);
  void download(void* dst, size_t bytes, void* stream = nullptr) const;
  // Copies `bytes` from device address `src` (stream-ordered).
  void copy_from(uint64_t src, size_t bytes, void* stream = nullptr);
  // The buffer is (also) used on `stream` from now on: its free is ordered there.
  void use_on(void* stream) { stream_ = stream; }
  void* last_stream() const { return stream_; }
  void free_after_device_sync() { sync_free_ = true; }

 private:
  DeviceBuffer(size_t bytes, void* stream, bool from_pool);
  void release() noexcept;
  uint64_t ptr_ = 0;
  size_t bytes_ = 0;
  // (Atomic: calls on several host threads may share an array.)
  std::atomic<void*> stream_{nullptr};
  bool pooled_ = false;
  std::atomic<bool> sync_free_{false};
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
// for it. Raises the interpreters' error when the kernel recorded one — after the error of an
// earlier asynchronous launch on the stream, if one recorded any. With an `owner` (keeping `call`
// and `k` alive) it returns once the kernel is queued (unless it profiles): what the kernel
// records is raised at the stream's next synchronizing point (synchronize_stream, a waiting
// launch, DeviceArray::to_host). Its buffers and `owner` are let go once it has finished (seen at
// a later launch on the stream, by its event, or at a synchronizing point); with 32 launches or
// 256 MiB of workspace pending on the stream, the next launch first waits for the oldest.
void launch_generated(const TracedCall& call, const GeneratedKernel& k, void* function,
                      const std::vector<uint64_t>& operand_ptrs, const std::vector<int64_t>& grid, void* stream,
                      std::shared_ptr<const void> owner = nullptr);
// Waits for `stream` (where a GPU is present or launches are pending on it) and raises the first
// error its asynchronous launches — GPU or emulated (async_calls) — recorded since the last time.
void synchronize_stream(void* stream);

}  // namespace pallas::gpu
