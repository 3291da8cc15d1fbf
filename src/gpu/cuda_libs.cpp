#include "gpu/cuda_libs.h"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <mutex>

#include "pallas/error.h"

namespace pallas::gpu {

namespace {

// NVRTC's C API, declared here (not from nvrtc.h) so the build needs no CUDA headers.
using nvrtcResult = int;
using nvrtcProgram = struct _nvrtcProgram*;

void* open_first(const std::vector<std::string>& names, std::string& tried) {
  for (const std::string& n : names) {
    if (void* h = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    const char* err = dlerror();
    tried += "\n  " + n + ": " + (err ? err : "not found");
  }
  return nullptr;
}

std::vector<std::string> nvrtc_candidates() {
  std::vector<std::string> names = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
  std::vector<std::string> dirs;
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
    if (const char* d = std::getenv(var); d && *d) {
      dirs.push_back(std::string(d) + "/lib64");
      dirs.push_back(std::string(d) + "/lib");
    }
  dirs.push_back("/usr/local/cuda/lib64");
  dirs.push_back("/usr/local/cuda/lib");
  std::vector<std::string> out = names;
  for (const std::string& d : dirs)
    for (const std::string& n : names) out.push_back(d + "/" + n);
  return out;
}

}  // namespace

struct Nvrtc::Api {
  const char* (*GetErrorString)(nvrtcResult);
  nvrtcResult (*Version)(int*, int*);
  nvrtcResult (*GetNumSupportedArchs)(int*);
  nvrtcResult (*GetSupportedArchs)(int*);
  nvrtcResult (*CreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                               const char* const*);
  nvrtcResult (*DestroyProgram)(nvrtcProgram*);
  nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char* const*);
  nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t*);
  nvrtcResult (*GetProgramLog)(nvrtcProgram, char*);
  nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t*);
  nvrtcResult (*GetCUBIN)(nvrtcProgram, char*);
  nvrtcResult (*GetPTXSize)(nvrtcProgram, size_t*);
  nvrtcResult (*GetPTX)(nvrtcProgram, char*);
};

namespace {

struct Loaded {
  Nvrtc::Api api{};
  std::string error;  // why NVRTC is unavailable ("" when loaded)
};

template <class F> bool bind(void* h, const char* name, F& fn, std::string& error) {
  fn = reinterpret_cast<F>(dlsym(h, name));
  if (!fn) error = std::string("NVRTC was found but lacks ") + name;
  return fn != nullptr;
}

const Loaded& loaded_nvrtc() {
  static Loaded l = [] {
    Loaded out;
    std::string tried;
    void* h = open_first(nvrtc_candidates(), tried);
    if (!h) {
      out.error = "NVRTC (libnvrtc.so from the CUDA toolkit) could not be loaded; install the CUDA "
                  "toolkit or set CUDA_HOME. Tried:" + tried;
      return out;
    }
    Nvrtc::Api& a = out.api;
    std::string& e = out.error;
    bind(h, "nvrtcGetErrorString", a.GetErrorString, e) && bind(h, "nvrtcVersion", a.Version, e) &&
        bind(h, "nvrtcGetNumSupportedArchs", a.GetNumSupportedArchs, e) &&
        bind(h, "nvrtcGetSupportedArchs", a.GetSupportedArchs, e) &&
        bind(h, "nvrtcCreateProgram", a.CreateProgram, e) &&
        bind(h, "nvrtcDestroyProgram", a.DestroyProgram, e) &&
        bind(h, "nvrtcCompileProgram", a.CompileProgram, e) &&
        bind(h, "nvrtcGetProgramLogSize", a.GetProgramLogSize, e) &&
        bind(h, "nvrtcGetProgramLog", a.GetProgramLog, e) &&
        bind(h, "nvrtcGetCUBINSize", a.GetCUBINSize, e) && bind(h, "nvrtcGetCUBIN", a.GetCUBIN, e) &&
        bind(h, "nvrtcGetPTXSize", a.GetPTXSize, e) && bind(h, "nvrtcGetPTX", a.GetPTX, e);
    return out;
  }();
  return l;
}

}  // namespace

std::string Nvrtc::unavailable_reason() { return loaded_nvrtc().error; }

const Nvrtc& Nvrtc::get() {
  const Loaded& l = loaded_nvrtc();
  if (!l.error.empty()) throw Error(l.error);
  static Nvrtc n = [&] {
    Nvrtc x;
    x.api_ = &l.api;
    return x;
  }();
  return n;
}

std::pair<int, int> Nvrtc::version() const {
  int major = 0, minor = 0;
  api_->Version(&major, &minor);
  return {major, minor};
}

std::vector<int> Nvrtc::supported_archs() const {
  int n = 0;
  api_->GetNumSupportedArchs(&n);
  std::vector<int> archs(static_cast<size_t>(n));
  if (n > 0) api_->GetSupportedArchs(archs.data());
  return archs;
}

CompiledKernel Nvrtc::compile(const std::string& source, const std::string& name,
                              const std::string& arch, const std::vector<std::string>& options) const {
  // "sm_90a" -> 90: the arch must be one NVRTC knows.
  const bool cubin = arch.rfind("sm_", 0) == 0;
  const bool ptx = arch.rfind("compute_", 0) == 0;
  int number = -1;
  if (cubin || ptx) {
    std::string digits = arch.substr(cubin ? 3 : 8);
    while (!digits.empty() && !std::isdigit(static_cast<unsigned char>(digits.back()))) digits.pop_back();
    if (!digits.empty() && digits.size() <= 4) number = std::atoi(digits.c_str());
  }
  std::vector<int> known = supported_archs();
  if (number < 0 || std::find(known.begin(), known.end(), number) == known.end()) {
    std::string list;
    for (int k : known) list += (list.empty() ? "" : ", ") + std::to_string(k);
    auto [major, minor] = version();
    throw Error("NVRTC " + std::to_string(major) + "." + std::to_string(minor) +
                " cannot compile for '" + arch + "' (give sm_XX[a] for a cubin or compute_XX[a] "
                "for PTX; it knows " + list + ")");
  }
  nvrtcProgram prog = nullptr;
  if (int r = api_->CreateProgram(&prog, source.c_str(), (name + ".cu").c_str(), 0, nullptr, nullptr))
    throw Error("NVRTC could not create a program for " + name + ": " + api_->GetErrorString(r));
  std::vector<std::string> opts = {"--gpu-architecture=" + arch, "-default-device", "-std=c++17"};
  opts.insert(opts.end(), options.begin(), options.end());
  std::vector<const char*> argv;
  for (const std::string& o : opts) argv.push_back(o.c_str());
  int rc = api_->CompileProgram(prog, static_cast<int>(argv.size()), argv.data());
  CompiledKernel out;
  size_t log_size = 0;
  api_->GetProgramLogSize(prog, &log_size);
  if (log_size > 1) {
    out.log.resize(log_size);
    api_->GetProgramLog(prog, out.log.data());
    out.log.resize(log_size - 1);
  }
  if (rc != 0) {
    std::string msg = "NVRTC failed to compile " + name + " for " + arch + " (" +
                      api_->GetErrorString(rc) + "):\n" + out.log;
    api_->DestroyProgram(&prog);
    throw Error(msg);
  }
  size_t size = 0;
  out.is_cubin = cubin;
  if (cubin) {
    api_->GetCUBINSize(prog, &size);
    out.image.resize(size);
    api_->GetCUBIN(prog, out.image.data());
  } else {
    api_->GetPTXSize(prog, &size);
    out.image.resize(size);
    api_->GetPTX(prog, out.image.data());
  }
  api_->DestroyProgram(&prog);
  return out;
}

std::string driver_unavailable_reason() {
  static const std::string reason = [] {
    // Only the real driver's SONAME: the toolkit's stub (lib64/stubs/libcuda.so) loads but can
    // run nothing, and must never be on the run path.
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* err = dlerror();
      return std::string("libcuda.so.1 (the NVIDIA driver) could not be loaded: ") +
             (err ? err : "not found") + " — this machine has no NVIDIA driver";
    }
    using Init = int (*)(unsigned);
    using Count = int (*)(int*);
    auto init = reinterpret_cast<Init>(dlsym(h, "cuInit"));
    auto count = reinterpret_cast<Count>(dlsym(h, "cuDeviceGetCount"));
    if (!init || !count) return std::string("libcuda.so.1 lacks cuInit / cuDeviceGetCount");
    int rc = init(0);
    if (rc == 34)
      return std::string("libcuda.so.1 is the CUDA toolkit's stub library (CUDA_ERROR_STUB_LIBRARY): "
                         "remove the stubs directory from LD_LIBRARY_PATH; no NVIDIA driver is "
                         "installed");
    if (rc == 100) return std::string("cuInit: no CUDA-capable device is detected");
    if (rc != 0) return "cuInit failed with CUDA error " + std::to_string(rc);
    int n = 0;
    if (count(&n) != 0 || n == 0) return std::string("the NVIDIA driver reports no devices");
    return std::string();
  }();
  return reason;
}

}  // namespace pallas::gpu
