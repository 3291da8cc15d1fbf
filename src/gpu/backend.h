// What the GPU backend's entry points share (backend.cpp): the compiled and loaded kernel of a
// traced call and grid, or its generated unit for host emulation — each made once per call and
// kept by it (PallasCallImpl::compiled) — for host arrays (run_gpu) and device arrays
// (call_on_device, device_array.cpp) alike.
#pragma once

#include <memory>
#include <vector>

#include "core/call.h"
#include "gpu/codegen.h"

namespace pallas::gpu {

struct LoadedKernel {
  GeneratedKernel kernel;
  void* function = nullptr;  // the loaded entry (its module stays loaded)
};

// Generates, compiles (through the kernel cache) and loads; a warm call does none of it.
std::shared_ptr<const LoadedKernel> loaded_kernel(PallasCallImpl& c, const TracedCall& tc,
                                                  const std::vector<int64_t>& grid);
// The generated unit that host emulation compiles (gpu_emulate).
std::shared_ptr<const GeneratedKernel> emulated_kernel(PallasCallImpl& c, const TracedCall& tc,
                                                       const std::vector<int64_t>& grid);
// Host threads per emulated CTA: two per group at least, so the emitted barriers are exercised,
// and a whole warp per group when the kernel has tensor-core dots.
int emulation_threads(const GeneratedKernel& k);

// Compiles unit `k` (generated with whatever options) for this process's GPU through the kernel
// cache, runs it on `args` and returns its outputs, as run_gpu does for a call's own unit: for
// tests that check a unit on a real GPU beside its host emulation (tests/gpu/emulation_check.h).
// Without a GPU it raises the error saying what is missing. (Each distinct unit's module stays
// loaded for the process.)
std::vector<Array> run_generated_on_gpu(const TracedCall& tc, const GeneratedKernel& k, const std::vector<Array>& args,
                                        const std::vector<int64_t>& grid);

}  // namespace pallas::gpu
