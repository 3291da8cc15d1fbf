#include "gpu/driver.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "gpu/async_calls.h"
#include "gpu/cuda_libs.h"
#include "gpu/profiler.h"
#include "pallas/error.h"
#include "pallas/gpu.h"

namespace pallas::gpu {

namespace {
// The driver ABI's types, as cuda.h declares them.
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = void*;
using CUmodule = void*;
using CUfunction = void*;
using CUstream = void*;
// CUlaunchAttribute: an id, padded to 8 bytes, and a 64-byte union of values (clusterDim: x, y, z).
struct alignas(8) CUlaunchAttribute {
  int id;
  char pad[4];
  union {
    char bytes[64];
    struct {
      unsigned x, y, z;
    } clusterDim;
    int cooperative;
  } value;
};
static_assert(sizeof(CUlaunchAttribute) == 72, "the driver's CUlaunchAttribute layout");
constexpr int CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4;
struct CUlaunchConfig {
  unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
  CUstream hStream;
  CUlaunchAttribute* attrs;
  unsigned numAttrs;
};
constexpr int kAttrMultiprocessors = 16, kAttrCcMajor = 75, kAttrCcMinor = 76, kAttrMaxSmemOptin = 97;
constexpr int kFuncAttrMaxDynamicSmem = 8, kFuncAttrNonPortableClusterSizeAllowed = 14;
constexpr unsigned kMemHostAllocDeviceMap = 0x02;
constexpr int kAttrMemoryPoolsSupported = 115, kMemPoolAttrReleaseThreshold = 4;
constexpr unsigned kEventDisableTiming = 0x2;
constexpr CUresult kErrorOutOfMemory = 2, kErrorNotReady = 600;  // (cuEventQuery's "not yet")
// cuda.h's CUmemPoolProps (CUDA 13.0): pinned device memory (allocType 1) on device `id`
// (location type 1), no export handles (0).
struct CUmemPoolProps {
  int allocType = 1, handleTypes = 0, locationType = 1, locationId = 0;
  void* win32SecurityAttributes = nullptr;
  size_t maxSize = 0;  // (0: the system's default)
  unsigned short usage = 0;
  unsigned char reserved[54] = {};
};
static_assert(sizeof(CUmemPoolProps) == 88, "the driver's CUmemPoolProps layout");
}  // namespace

struct DriverApi {
  CUresult (*Init)(unsigned);
  CUresult (*DeviceGet)(CUdevice*, int);
  CUresult (*DeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*ModuleLoadData)(CUmodule*, const void*);
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*FuncSetAttribute)(CUfunction, int, int);
  CUresult (*LaunchKernelEx)(const CUlaunchConfig*, CUfunction, void**, void**);
  CUresult (*OccupancyMaxActiveBlocksPerMultiprocessor)(int*, CUfunction, int, size_t);
  CUresult (*OccupancyMaxActiveClusters)(int*, CUfunction, const CUlaunchConfig*);  // null: unknown
  // cuTensorMapEncodeTiled (null: unknown; the ring's inputs then take cp.async). The enums are
  // passed as their values (cuda.h's CUtensorMapDataType, ...), the map as 16 words.
  CUresult (*TensorMapEncodeTiled)(void*, int, unsigned, void*, const uint64_t*, const uint64_t*, const unsigned*,
                                   const unsigned*, int, int, int, int);
  CUresult (*MemAlloc)(CUdeviceptr*, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemHostAlloc)(void**, size_t, unsigned);
  CUresult (*MemHostGetDevicePointer)(CUdeviceptr*, void*, unsigned);
  CUresult (*MemFreeHost)(void*);
  CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream);
  CUresult (*MemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream);
  CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*StreamSynchronize)(CUstream);
  CUresult (*CtxSynchronize)();
  CUresult (*GetErrorString)(CUresult, const char**);
  // The stream-ordered allocator (CUDA 11.2; null: unknown). The pool is a CUmemoryPool handle.
  CUresult (*MemPoolCreate)(void**, const CUmemPoolProps*);
  CUresult (*MemPoolSetAttribute)(void*, int, void*);
  CUresult (*MemAllocFromPoolAsync)(CUdeviceptr*, size_t, void*, CUstream);
  CUresult (*MemFreeAsync)(CUdeviceptr, CUstream);
  CUresult (*MemPoolTrimTo)(void*, size_t);
  // Events (a CUevent handle each; null: unknown — pending launches then retire only when their
  // stream synchronizes).
  CUresult (*EventCreate)(void**, unsigned);
  CUresult (*EventRecord)(void*, CUstream);
  CUresult (*EventQuery)(void*);
  CUresult (*EventDestroy)(void*);
};

Device& Device::get() {
  static Device* device = [] {
    if (std::string why = driver_unavailable_reason(); !why.empty())
      throw Error("the GPU backend needs an NVIDIA GPU: " + why);
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    auto* api = new DriverApi;
    auto sym = [&](const char* name) {
      void* p = dlsym(h, name);
      if (!p) throw Error(std::string("libcuda.so.1 lacks ") + name + " (the driver is too old for CUDA 12)");
      return p;
    };
#define PALLAS_SYM(field, name) api->field = reinterpret_cast<decltype(api->field)>(sym(name))
    PALLAS_SYM(Init, "cuInit");
    PALLAS_SYM(DeviceGet, "cuDeviceGet");
    PALLAS_SYM(DeviceGetAttribute, "cuDeviceGetAttribute");
    PALLAS_SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    PALLAS_SYM(CtxSetCurrent, "cuCtxSetCurrent");
    PALLAS_SYM(ModuleLoadData, "cuModuleLoadData");
    PALLAS_SYM(ModuleGetFunction, "cuModuleGetFunction");
    PALLAS_SYM(FuncSetAttribute, "cuFuncSetAttribute");
    PALLAS_SYM(LaunchKernelEx, "cuLaunchKernelEx");
    PALLAS_SYM(OccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor");
    api->OccupancyMaxActiveClusters =
        reinterpret_cast<decltype(api->OccupancyMaxActiveClusters)>(dlsym(h, "cuOccupancyMaxActiveClusters"));
    api->TensorMapEncodeTiled =
        reinterpret_cast<decltype(api->TensorMapEncodeTiled)>(dlsym(h, "cuTensorMapEncodeTiled"));
    PALLAS_SYM(MemAlloc, "cuMemAlloc_v2");
    PALLAS_SYM(MemFree, "cuMemFree_v2");
    PALLAS_SYM(MemHostAlloc, "cuMemHostAlloc");
    PALLAS_SYM(MemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2");
    PALLAS_SYM(MemFreeHost, "cuMemFreeHost");
    PALLAS_SYM(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
    PALLAS_SYM(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
    PALLAS_SYM(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
    PALLAS_SYM(MemsetD8Async, "cuMemsetD8Async");
    PALLAS_SYM(StreamSynchronize, "cuStreamSynchronize");
    PALLAS_SYM(CtxSynchronize, "cuCtxSynchronize");
    PALLAS_SYM(GetErrorString, "cuGetErrorString");
#undef PALLAS_SYM
#define PALLAS_OPTIONAL_SYM(field, name) api->field = reinterpret_cast<decltype(api->field)>(dlsym(h, name))
    PALLAS_OPTIONAL_SYM(MemPoolCreate, "cuMemPoolCreate");
    PALLAS_OPTIONAL_SYM(MemPoolSetAttribute, "cuMemPoolSetAttribute");
    PALLAS_OPTIONAL_SYM(MemAllocFromPoolAsync, "cuMemAllocFromPoolAsync");
    PALLAS_OPTIONAL_SYM(MemFreeAsync, "cuMemFreeAsync");
    PALLAS_OPTIONAL_SYM(MemPoolTrimTo, "cuMemPoolTrimTo");
    PALLAS_OPTIONAL_SYM(EventCreate, "cuEventCreate");
    PALLAS_OPTIONAL_SYM(EventRecord, "cuEventRecord");
    PALLAS_OPTIONAL_SYM(EventQuery, "cuEventQuery");
    PALLAS_OPTIONAL_SYM(EventDestroy, "cuEventDestroy_v2");
#undef PALLAS_OPTIONAL_SYM
    auto* d = new Device;
    d->api_ = api;
    d->check(api->Init(0), "cuInit");
    d->check(api->DeviceGet(&d->device_, 0), "cuDeviceGet");
    d->check(api->DevicePrimaryCtxRetain(&d->context_, d->device_), "cuDevicePrimaryCtxRetain");
    int v = 0;
    d->check(api->DeviceGetAttribute(&d->cc_major_, kAttrCcMajor, d->device_), "cuDeviceGetAttribute");
    d->check(api->DeviceGetAttribute(&d->cc_minor_, kAttrCcMinor, d->device_), "cuDeviceGetAttribute");
    d->check(api->DeviceGetAttribute(&d->sms_, kAttrMultiprocessors, d->device_), "cuDeviceGetAttribute");
    d->check(api->DeviceGetAttribute(&v, kAttrMaxSmemOptin, d->device_), "cuDeviceGetAttribute");
    d->max_smem_optin_ = v;
    // The pool: a call allocating its outputs then costs no cuMemAlloc (a driver round trip) and
    // its free no cuMemFree (which waits for the device). A pool of our own, which keeps what is
    // freed (release threshold: all) — not the device's default pool, whose settings belong to
    // whoever else in the process allocates from it (cudaMallocAsync: CuPy, JAX's allocator).
    const char* no_pool = std::getenv("PALLAS_GPU_NO_POOL");
    int pools = 0;
    void* pool = nullptr;
    CUmemPoolProps props;
    props.locationId = d->device_;
    if (api->MemPoolCreate && api->MemPoolSetAttribute && api->MemAllocFromPoolAsync && api->MemFreeAsync &&
        !(no_pool && std::string(no_pool) == "1") &&
        api->DeviceGetAttribute(&pools, kAttrMemoryPoolsSupported, d->device_) == 0 && pools != 0 &&
        api->MemPoolCreate(&pool, &props) == 0) {
      uint64_t keep_all = ~uint64_t{0};
      d->pooled_ = api->MemPoolSetAttribute(pool, kMemPoolAttrReleaseThreshold, &keep_all) == 0;
      d->pool_ = d->pooled_ ? pool : nullptr;  // (never destroyed: the process's, as the device)
    }
    return d;
  }();
  device->make_current();
  return *device;
}

std::string Device::arch() const {
  std::string a = "sm_" + std::to_string(compute_capability());
  return runs_wgmma() ? a + "a" : a;  // sm_90a: Hopper's arch-specific instructions
}

void Device::synchronize(void* stream) const { check(api_->StreamSynchronize(stream), "cuStreamSynchronize"); }

void Device::make_current() const { check(api_->CtxSetCurrent(context_), "cuCtxSetCurrent"); }

void Device::check(int rc, const char* what) const {
  if (rc == 0) return;
  const char* msg = nullptr;
  if (api_ && api_->GetErrorString) api_->GetErrorString(rc, &msg);
  throw Error(std::string(what) + " failed: CUDA error " + std::to_string(rc) + (msg ? std::string(" (") + msg + ")" : ""));
}

DeviceBuffer::DeviceBuffer(size_t bytes, void* stream, bool from_pool) : bytes_(bytes), stream_(stream) {
  Device& d = Device::get();
  CUdeviceptr p = 0;
  const size_t n = std::max<size_t>(bytes, 1);
  // (A pool allocation that fails, e.g. out of memory while the pool holds freed blocks another
  // stream has not released yet, gets one more chance from cuMemAlloc.)
  pooled_ = from_pool && d.pooled() && d.api().MemAllocFromPoolAsync(&p, n, d.pool(), stream) == 0;
  if (!pooled_) {
    int rc = d.api().MemAlloc(&p, n);
    if (rc == kErrorOutOfMemory && d.pooled() && d.api().MemPoolTrimTo) {
      // The pool keeps what was freed (its release threshold): hand that back to the driver once
      // its frees have happened, and try again.
      d.check(d.api().CtxSynchronize(), "cuCtxSynchronize (out of device memory)");
      d.api().MemPoolTrimTo(d.pool(), 0);
      rc = d.api().MemAlloc(&p, n);
    }
    d.check(rc, "cuMemAlloc");
  }
  ptr_ = p;
}

void DeviceBuffer::release() noexcept {
  if (!ptr_) return;
  const DriverApi& api = Device::get().api();
  if (!pooled_) {
    api.MemFree(ptr_);
  } else if (sync_free_ || api.MemFreeAsync(ptr_, stream_) != 0) {
    api.CtxSynchronize();
    api.MemFreeAsync(ptr_, nullptr);
  }
  ptr_ = 0;
}

DeviceBuffer::~DeviceBuffer() { release(); }

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    release();
    ptr_ = o.ptr_, bytes_ = o.bytes_, stream_ = o.stream_.load(), pooled_ = o.pooled_, sync_free_ = o.sync_free_.load();
    o.ptr_ = 0, o.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::upload(const void* src, size_t bytes, void* stream) {
  Device& d = Device::get();
  d.check(d.api().MemcpyHtoDAsync(ptr_, src, bytes, stream), "cuMemcpyHtoDAsync");
}

void DeviceBuffer::download(void* dst, size_t bytes, void* stream) const {
  copy_device_to_host(dst, ptr_, bytes, stream);
}

void DeviceBuffer::copy_from(uint64_t src, size_t bytes, void* stream) {
  copy_device_to_device(ptr_, src, bytes, stream);
}

void copy_device_to_host(void* dst, uint64_t src, size_t bytes, void* stream) {
  Device& d = Device::get();
  d.check(d.api().MemcpyDtoHAsync(dst, src, bytes, stream), "cuMemcpyDtoHAsync");
}

void copy_device_to_device(uint64_t dst, uint64_t src, size_t bytes, void* stream) {
  Device& d = Device::get();
  d.check(d.api().MemcpyDtoDAsync(dst, src, bytes, stream), "cuMemcpyDtoDAsync");
}

void* load_entry(const std::vector<char>& image, const std::string& entry) {
  Device& d = Device::get();
  CUmodule mod = nullptr;
  CUfunction fn = nullptr;
  d.check(d.api().ModuleLoadData(&mod, image.data()), "cuModuleLoadData");
  d.check(d.api().ModuleGetFunction(&fn, mod, entry.c_str()), "cuModuleGetFunction");
  return fn;
}

void launch_plain(void* function, unsigned blocks, unsigned threads, void** params, void* stream) {
  Device& d = Device::get();
  CUlaunchConfig cfg{blocks, 1, 1, threads, 1, 1, 0, stream, nullptr, 0};
  d.check(d.api().LaunchKernelEx(&cfg, function, params, nullptr), "cuLaunchKernelEx");
}

void* load_function(const std::vector<char>& image, const GeneratedKernel& k) {
  Device& d = Device::get();
  const DriverApi& api = d.api();
  CUfunction fn = load_entry(image, k.entry);
  // Above 48 KiB less the static shared memory (the mbarriers: the kernel's, the ring's, and
  // their alignment) a kernel must opt in; opting in below that changes nothing, so any kernel
  // with dynamic shared memory does (counting the static bytes here would be one more place to
  // keep in step with the runtime's declarations).
  const int64_t dynamic = k.dynamic_shared_bytes(d.runs_wgmma());
  if (dynamic > 0)
    d.check(api.FuncSetAttribute(fn, kFuncAttrMaxDynamicSmem, static_cast<int>(dynamic)),
            "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
  if (k.cluster_ctas > 8)  // beyond the portable cluster size (H100 allows 16)
    d.check(api.FuncSetAttribute(fn, kFuncAttrNonPortableClusterSizeAllowed, 1),
            "cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)");
  return fn;
}

namespace {

// What a launch needs besides its operands: the global-memory arena (16 bytes when the arena is
// in shared memory) and the error record. A cuMemAlloc / cuMemFree pair per call for each would
// cost more than the whole warm-launch budget, so launches borrow them from a pool: a set per
// launch in flight (calls from several host threads get their own), growing the arena when a
// kernel needs more. The pool lives as long as the process and is never destroyed (its device
// memory goes with the context; a static destructor could run after libcuda is gone).
//
// The error record stays in device memory (pl_fail claims it with an atomic, which memory on
// the host cannot be relied on for over PCIe), but a launch need not copy it back: its last word
// holds the device address of a flag in page-locked host memory mapped into the GPU's address
// space, which pl_fail sets (a plain store) after writing the record. A launch that failed
// nothing costs its launch and its wait only — a copy back per launch was ~12 µs of an H100's
// warm call (docs/PERFORMANCE.md, stop 20). The record is cleared only after a launch wrote it:
// a kernel that fails nothing leaves it 0 (pl_fail writes the values only after winning word 0).
// Where mapped host memory cannot be had, every launch copies the record back instead.
struct LaunchBuffers {
  DeviceBuffer workspace, err;
  int64_t* host = nullptr;  // page-locked: the record's copy, then the flag (kErrorRecordWords + 1 words)
  bool mapped = false;      // pl_fail sets host[kErrorRecordWords]
  bool err_dirty = false;
  // Recorded after an asynchronous launch (and its record's copy): once it has completed, the
  // buffers may be retired without synchronizing the stream. Null without the driver's events.
  void* done = nullptr;
  // Made for a launch on `stream`: the record's first contents are copied in that stream's order
  // (before the kernel), without waiting for anything.
  explicit LaunchBuffers(void* stream) {
    Device& d = Device::get();
    const DriverApi& api = d.api();
    err = DeviceBuffer::outside_pool(kErrorRecordWords * sizeof(int64_t));
    const size_t bytes = (kErrorRecordWords + 1) * sizeof(int64_t);
    void* p = nullptr;
    CUdeviceptr flag = 0;
    if (api.MemHostAlloc(&p, bytes, kMemHostAllocDeviceMap) == 0) {
      mapped = api.MemHostGetDevicePointer(&flag, static_cast<int64_t*>(p) + kErrorRecordWords, 0) == 0;
    } else {
      p = nullptr;
      d.check(api.MemHostAlloc(&p, bytes, 0), "cuMemHostAlloc");
    }
    host = static_cast<int64_t*>(p);
    std::fill(host, host + kErrorRecordWords + 1, 0);
    if (api.EventCreate && api.EventRecord && api.EventQuery && api.EventDestroy &&
        api.EventCreate(&done, kEventDisableTiming) != 0)
      done = nullptr;
    // The flag's device address, staged in host[] (page-locked): that word is not read again, and
    // a later copy of the record into host[] is ordered after this one on the stream.
    host[kErrorFlagWord] = mapped ? static_cast<int64_t>(flag) : 0;
    try {
      err.upload(host, kErrorRecordWords * sizeof(int64_t), stream);
    } catch (...) {
      release();
      throw;
    }
  }
  ~LaunchBuffers() { release(); }
  void release() noexcept {
    const DriverApi& api = Device::get().api();
    if (done) api.EventDestroy(done);
    if (host) api.MemFreeHost(host);
    done = nullptr, host = nullptr;
  }
  LaunchBuffers(const LaunchBuffers&) = delete;
  LaunchBuffers& operator=(const LaunchBuffers&) = delete;
};

class LaunchBufferPool {
 public:
  static LaunchBufferPool& get() {
    static LaunchBufferPool* pool = new LaunchBufferPool;
    return *pool;
  }
  std::unique_ptr<LaunchBuffers> take(size_t workspace_bytes, void* stream) {
    std::unique_ptr<LaunchBuffers> b;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        b = std::move(free_.back());
        free_.pop_back();
      }
    }
    if (!b) b = std::make_unique<LaunchBuffers>(stream);
    if (b->workspace.bytes() < workspace_bytes) b->workspace = DeviceBuffer::outside_pool(workspace_bytes);
    return b;
  }
  // Only once the launch has finished (retire_launch): nothing on the device uses them any more.
  void give_back(std::unique_ptr<LaunchBuffers> b) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(std::move(b));
  }

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<LaunchBuffers>> free_;
};


// How many CTAs of `function` fit on one SM at once (its registers, threads and shared memory),
// asked of the driver once per loaded function.
int64_t resident_ctas_per_sm(const Device& d, void* function, const GeneratedKernel& k) {
  static std::mutex mu;
  static std::map<void*, int64_t>* known = new std::map<void*, int64_t>;  // never destroyed, as the pool
  std::lock_guard<std::mutex> lock(mu);
  auto it = known->find(function);
  if (it != known->end()) return it->second;
  int n = 0;
  d.check(d.api().OccupancyMaxActiveBlocksPerMultiprocessor(&n, function, k.threads_per_cta,
                                                             static_cast<size_t>(k.dynamic_shared_bytes(d.runs_wgmma()))),
          "cuOccupancyMaxActiveBlocksPerMultiprocessor");
  return (*known)[function] = std::max(1, n);
}

// A launch of `ctas` CTAs of the generated kernel (1-D clusters of k.cluster_ctas, when more
// than one); the config points at the attribute it holds, so it stays where it was made.
//
// A kernel whose CTAs must all run at once (pl::get_global semaphores: co_resident) without clusters
// is launched cooperatively: launch_ctas made its grid fit the device, and the driver then holds
// it to that — all its CTAs scheduled together, or the launch refused — instead of CTAs spinning
// on semaphores while others wait for SMs that another stream's kernel holds (then the wait
// limit's "deadlock"). (With clusters the occupancy query of max_active_clusters is what bounds
// the grid; cooperative cluster launches are left alone.)
struct LaunchShape {
  CUlaunchAttribute attrs[1]{};
  CUlaunchConfig cfg{};
  LaunchShape(const Device& d, const GeneratedKernel& k, int64_t ctas, CUstream stream) {
    unsigned n = 0;
    if (k.cluster_ctas > 1) {
      CUlaunchAttribute& a = attrs[n++];
      a.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      a.value.clusterDim.x = static_cast<unsigned>(k.cluster_ctas);
      a.value.clusterDim.y = a.value.clusterDim.z = 1;
    } else if (k.co_resident()) {
      CUlaunchAttribute& a = attrs[n++];
      a.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
      a.value.cooperative = 1;
    }
    cfg = CUlaunchConfig{static_cast<unsigned>(ctas), 1, 1, static_cast<unsigned>(k.threads_per_cta), 1, 1,
                         static_cast<unsigned>(k.dynamic_shared_bytes(d.runs_wgmma())), stream,
                         n > 0 ? attrs : nullptr, n};
  }
  LaunchShape(const LaunchShape&) = delete;
  LaunchShape& operator=(const LaunchShape&) = delete;
};

// How many clusters of a co-resident kernel's launch the device can hold at once (their CTAs must
// share a GPC, which SMs x CTAs per SM does not see); 0 when there are no clusters or the driver
// cannot say.
int64_t max_active_clusters(const Device& d, void* function, const GeneratedKernel& k, int64_t points) {
  if (!k.co_resident() || k.cluster_ctas <= 1 || !d.api().OccupancyMaxActiveClusters) return 0;
  const LaunchShape launch(d, k, points, nullptr);
  const CUlaunchConfig& cfg = launch.cfg;
  int n = 0;
  d.check(d.api().OccupancyMaxActiveClusters(&n, function, &cfg), "cuOccupancyMaxActiveClusters");
  return n;
}

// Tensor maps for the kernel's TMA copies, on Hopper (the sm_90a code, whose slot layouts the
// maps' boxes were made for). An array whose address is not 16-byte aligned (a DLPack import of an
// offset view), or a map the driver refuses, leaves its input to cp.async.
const TensorMapEncoder& tensor_map_encoder(const Device& d) {
  static const TensorMapEncoder none;
  if (!d.runs_wgmma() || !d.api().TensorMapEncodeTiled) return none;
  // (One cache for the process: the device is the process's one.)
  static const TensorMapEncoder cached = cached_tensor_map_encoder([&d](const TensorMapSpec& spec, uint64_t address,
                                                                         uint64_t* map) {
    if (address % 16 != 0) return false;
    // CU_TENSOR_MAP_DATA_TYPE_UINT8 / UINT16 / UINT32 / UINT64 (the bits are copied, not converted).
    const int type = spec.elem_bytes == 1 ? 0 : spec.elem_bytes == 2 ? 1 : spec.elem_bytes == 4 ? 2 : 4;
    const std::vector<unsigned> box(spec.box.begin(), spec.box.end()), element_strides(spec.box.size(), 1);
    const uint64_t no_strides[1] = {0};  // (rank 1: none, but not a null pointer)
    // The driver writes the map only to a 64-byte aligned address; the parameter words are not.
    alignas(64) uint64_t encoded[16] = {};
    // interleave NONE (0), swizzle NONE (0), 32B (1), 64B (2) or 128B (3), L2 promotion 128B (2),
    // out-of-bounds fill NONE (0).
    const int swizzle = spec.swizzle_bytes == 128 ? 3 : spec.swizzle_bytes == 64 ? 2 : spec.swizzle_bytes == 32 ? 1 : 0;
    const int rc = d.api().TensorMapEncodeTiled(encoded, type, static_cast<unsigned>(spec.dims.size()),
                                                reinterpret_cast<void*>(address), spec.dims.data(),
                                                spec.strides.empty() ? no_strides : spec.strides.data(), box.data(),
                                                element_strides.data(), 0, swizzle, 2, 0);
    if (rc != 0) {
      // Not wrong (the copy takes cp.async), but slower than it should be: say so, once.
      static std::atomic<bool> told{false};
      if (!told.exchange(true))
        std::fprintf(stderr, "pallas: the driver refused a TMA tensor map (cuTensorMapEncodeTiled: error %d); "
                     "the pipelined blocks are copied by cp.async instead\n", rc);
      return false;
    }
    std::copy(encoded, encoded + 16, map);
    return true;
  });
  return cached;
}

// The error record of a launch that has finished — its stream synchronized or its event completed
// (the record's copy enqueued after the kernel when the flag is not mapped): the error it names
// (null if none). Gives the buffers back.
std::exception_ptr retire_launch(std::unique_ptr<LaunchBuffers> buffers, const TracedCall& call,
                                 const GeneratedKernel& k, void* stream) {
  Device& d = Device::get();
  const volatile int64_t* flag = buffers->host + kErrorRecordWords;
  if (buffers->mapped && *flag != 0) {
    buffers->err.download(buffers->host, kErrorRecordWords * sizeof(int64_t), stream);
    d.check(d.api().StreamSynchronize(stream), "cuStreamSynchronize (the error record)");
  }
  int64_t record[kErrorRecordWords] = {};
  if (!buffers->mapped || *flag != 0) std::copy(buffers->host, buffers->host + kErrorFlagWord, record);
  buffers->err_dirty = record[0] != 0;
  LaunchBufferPool::get().give_back(std::move(buffers));
  return record[0] == 0 ? nullptr : kernel_error(call, k, record);
}

// Launches queued without waiting (launch_generated with an owner), oldest first: their buffers
// stay theirs until the launch is known to have finished (its event has completed, or its stream
// has synchronized since it was queued).
struct PendingLaunch {
  void* stream;
  uint64_t ticket;  // (queued before a synchronize began when below its cutoff: see queue_cutoff)
  std::unique_ptr<LaunchBuffers> buffers;
  std::shared_ptr<const void> owner;  // keeps `call` and `k` alive
  const TracedCall* call;
  const GeneratedKernel* k;
};
std::mutex pending_mu;
uint64_t next_ticket = 0;  // (under pending_mu)
std::vector<PendingLaunch>& pending_launches() {
  static std::vector<PendingLaunch>* launches = new std::vector<PendingLaunch>;
  return *launches;
}
// Held while launches' errors are noted, so that a stream's are noted in launch order when
// several host threads retire on it. (Nothing waits for the device while holding it, and what
// the retired launches kept alive — arrays, whose DLPack deleters run foreign code — is let go
// after it is released.)
std::mutex retire_mu;
// At most this many launches, or workspace bytes, wait on a stream; the next one first waits for
// the oldest to finish: a bound on the buffers held.
constexpr size_t kMaxPendingLaunches = 32;
constexpr size_t kMaxPendingWorkspaceBytes = size_t{256} << 20;

// Held from a launch on a stream until it is entered in the pending list, so that the list holds
// one stream's launches in the stream's order even when host threads launch on it at once (its
// retirement, oldest first, and "the first error" of the stream go by that order). One of a few
// mutexes by the stream's address: threads launching on different streams seldom share one.
std::mutex& launch_order_mutex(void* stream) {
  static std::array<std::mutex, 16> stripes;
  return stripes[std::hash<void*>{}(stream) % stripes.size()];
}

// The ticket the next queued launch gets: taken before synchronizing a stream, it marks the
// launches that synchronize has waited for (another thread may queue more meanwhile).
uint64_t queue_cutoff() {
  std::lock_guard<std::mutex> lock(pending_mu);
  return next_ticket;
}

// Retires launches pending on `stream` that have finished: those queued before `synchronized_below`
// (a queue_cutoff taken before the stream synchronized), and those whose events have completed,
// oldest first up to the first still running (a stream finishes its work in order). The first
// error they recorded becomes the stream's pending error (async_calls), raised at its next
// synchronizing point.
void retire_pending_launches(void* stream, uint64_t synchronized_below = 0) {
  const DriverApi& api = Device::get().api();
  std::vector<PendingLaunch> mine;  // (destroyed last: after retire_mu is released)
  std::lock_guard<std::mutex> retiring(retire_mu);
  {
    std::lock_guard<std::mutex> lock(pending_mu);
    std::vector<PendingLaunch>& all = pending_launches();
    for (auto it = all.begin(); it != all.end();) {
      if (it->stream != stream) {
        ++it;
        continue;
      }
      // (An event query that fails — a faulted context — leaves the launch to the synchronize
      // that will report the fault.)
      if (it->ticket >= synchronized_below && (!it->buffers->done || api.EventQuery(it->buffers->done) != 0)) break;
      mine.push_back(std::move(*it));
      it = all.erase(it);
    }
  }
  for (PendingLaunch& p : mine)
    async_calls::note_error(stream, retire_launch(std::move(p.buffers), *p.call, *p.k, stream));
}

// Synchronizes `stream` and retires what was pending on it.
void synchronize_and_retire(void* stream) {
  const uint64_t cutoff = queue_cutoff();
  Device::get().synchronize(stream);
  retire_pending_launches(stream, cutoff);
}

// Waits until the oldest launch pending on `stream` has finished (polling its event, as
// cuEventSynchronize spins by default, holding no lock) and retires what has finished; the
// stream is synchronized instead when the launch has no event or the query reports a fault.
void wait_for_oldest_launch(void* stream) {
  const Device& d = Device::get();
  for (;;) {
    int rc = kErrorNotReady;
    {
      std::lock_guard<std::mutex> lock(pending_mu);
      const auto& all = pending_launches();
      auto oldest = std::find_if(all.begin(), all.end(), [&](const PendingLaunch& p) { return p.stream == stream; });
      if (oldest == all.end()) return;
      rc = oldest->buffers->done ? d.api().EventQuery(oldest->buffers->done) : -1;
    }
    if (rc == 0) break;
    if (rc != kErrorNotReady) {
      synchronize_and_retire(stream);  // (raises the fault, if that is what it was)
      return;
    }
    std::this_thread::yield();
  }
  retire_pending_launches(stream);
}

size_t pending_launches_on(void* stream, size_t* workspace_bytes = nullptr) {
  std::lock_guard<std::mutex> lock(pending_mu);
  size_t n = 0, bytes = 0;
  for (const PendingLaunch& p : pending_launches())
    if (p.stream == stream) ++n, bytes += p.buffers->workspace.bytes();
  if (workspace_bytes) *workspace_bytes = bytes;
  return n;
}

}  // namespace

std::optional<int64_t> device_shared_memory_limit() {
  if (!driver_unavailable_reason().empty()) return std::nullopt;
  try {
    return Device::get().max_shared_per_block();
  } catch (const Error&) {  // (a driver but no usable device)
    return std::nullopt;
  }
}

void synchronize_stream(void* stream) {
  if (pending_launches_on(stream) > 0 || driver_unavailable_reason().empty()) synchronize_and_retire(stream);
  async_calls::raise_pending(stream);
}

void launch_generated(const TracedCall& call, const GeneratedKernel& k, void* function,
                      const std::vector<uint64_t>& operand_ptrs, const std::vector<int64_t>& grid, void* stream,
                      std::shared_ptr<const void> owner) {
  Device& d = Device::get();
  const DriverApi& api = d.api();
  const int64_t points = parallel_points(k, grid);
  if (points == 0) return;
  // Profiling reads its buffer back after the kernel: such a launch waits.
  const size_t profile_words = profile_buffer_words(k, grid);
  const bool wait = !owner || profile_words > 0;
  if (!wait) {
    // Launches that have finished give their buffers back (a loop of calls reuses a few sets);
    // over the bound, this one waits for the oldest (the rest stay queued: the GPU keeps busy).
    retire_pending_launches(stream);
    size_t held = 0;
    while (pending_launches_on(stream, &held) >= kMaxPendingLaunches || held >= kMaxPendingWorkspaceBytes)
      wait_for_oldest_launch(stream);
  }
  // A grid-stride loop over the parallel points (launch_ctas). With clusters, a whole number of
  // them (the points are too): a CTA's rank in its 1-D cluster is then its point's rank, which the
  // kernel decodes the cluster axes from.
  const int64_t ctas = launch_ctas(call, k, points, d.multiprocessors(), resident_ctas_per_sm(d, function, k),
                                   max_active_clusters(d, function, k, points));
  // Dropped (freed) instead of given back when anything below throws before the stream syncs.
  std::unique_ptr<LaunchBuffers> buffers = LaunchBufferPool::get().take(
      static_cast<size_t>(k.arena_offset() + (k.arena_in_shared ? 16 + k.acc_memory_bytes * ctas : k.arena_bytes * ctas)),
      stream);
  const DeviceBuffer& workspace = buffers->workspace;
  DeviceBuffer& err = buffers->err;
  if (k.semaphore_bytes > 0)  // every call's semaphores start at 0
    d.check(api.MemsetD8Async(workspace.ptr(), 0, static_cast<size_t>(k.semaphore_bytes), stream), "cuMemsetD8Async");
  if (buffers->err_dirty) {  // the words before the flag's address
    d.check(api.MemsetD8Async(err.ptr(), 0, kErrorFlagWord * sizeof(int64_t), stream), "cuMemsetD8Async");
    buffers->host[kErrorRecordWords] = 0;
    buffers->err_dirty = false;
  }
  prepare_profile_dir(k, call.kernel.loc);
  DeviceBuffer profile;  // only when profiling: every allocation adds to the launch overhead
  if (profile_words > 0) {
    profile = DeviceBuffer(profile_words * sizeof(uint64_t), stream);
    d.check(api.MemsetD8Async(profile.ptr(), 0, profile_words * sizeof(uint64_t), stream), "cuMemsetD8Async");
  }
  std::vector<uint64_t> words = pack_params(k, operand_ptrs, workspace.ptr(), err.ptr(),
                                            profile_words > 0 ? profile.ptr() : 0, grid, tensor_map_encoder(d));
  void* params[] = {words.data()};
  const LaunchShape launch(d, k, ctas, stream);
  std::unique_lock<std::mutex> in_stream_order(launch_order_mutex(stream));
  d.check(api.LaunchKernelEx(&launch.cfg, function, params, nullptr), "cuLaunchKernelEx");
  try {
    if (!buffers->mapped) err.download(buffers->host, kErrorRecordWords * sizeof(int64_t), stream);
    if (!wait) {
      if (buffers->done) d.check(api.EventRecord(buffers->done, stream), "cuEventRecord");
      std::lock_guard<std::mutex> lock(pending_mu);
      pending_launches().push_back({stream, next_ticket++, std::move(buffers), std::move(owner), &call, &k});
      return;
    }
  } catch (...) {
    // The kernel is queued: what it uses (the buffers, the arrays `owner` holds) is dropped only
    // once it has run.
    in_stream_order.unlock();
    api.StreamSynchronize(stream);
    throw;
  }
  in_stream_order.unlock();
  // Earlier asynchronous calls on the stream finish too (retired here): their error comes first.
  synchronize_and_retire(stream);
  const std::exception_ptr error = retire_launch(std::move(buffers), call, k, stream);
  async_calls::raise_pending(stream);
  if (error) std::rethrow_exception(error);
  if (profile_words > 0) {
    std::vector<uint64_t> events(profile_words);
    profile.download(events.data(), profile_words * sizeof(uint64_t), stream);
    d.check(api.StreamSynchronize(stream), "cuStreamSynchronize (the profile)");
    write_profile_trace(call, k, grid, events.data());
  }
}

}  // namespace pallas::gpu
