// The CUDA libraries the GPU backend needs, loaded with dlopen at run time (never linked, never
// the toolkit's stub): NVRTC to compile generated CUDA C++, and the driver (libcuda.so.1) to
// load and launch it. Every binary runs on a machine without them; asking for what is missing
// raises a pallas::Error that says what is missing and how to get it.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace pallas::gpu {

struct CompiledKernel {
  std::vector<char> image;  // a cubin (ELF) for sm_* targets, PTX text for compute_* targets
  bool is_cubin = false;
  std::string log;          // NVRTC's log (warnings)
};

class Nvrtc {
 public:
  // The process's NVRTC, loaded on first use (thread-safe); throws pallas::Error when it cannot
  // be found (the message lists where it looked).
  static const Nvrtc& get();
  // Whether NVRTC can be loaded, and why not ("" when it can).
  static std::string unavailable_reason();

  std::pair<int, int> version() const;
  std::vector<int> supported_archs() const;  // e.g. 75, 80, 86, ..., 90, 100, ...
  // Compiles `source` for `arch`: "sm_90a" / "sm_80" give a cubin, "compute_90a" gives PTX.
  // A compile error throws pallas::Error with NVRTC's log; an arch NVRTC does not know throws
  // one listing the archs it knows.
  CompiledKernel compile(const std::string& source, const std::string& name,
                         const std::string& arch, const std::vector<std::string>& options = {}) const;

  struct Api;  // the NVRTC entry points (cuda_libs.cpp)

 private:
  Nvrtc() = default;
  const Api* api_ = nullptr;
};

// The NVIDIA driver: "" when libcuda.so.1 loads and cuInit finds a device; otherwise why not
// ("libcuda.so.1 (the NVIDIA driver) could not be loaded: ...", "no CUDA-capable device").
std::string driver_unavailable_reason();

}  // namespace pallas::gpu
