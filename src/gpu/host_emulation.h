// Host emulation of the GPU backend: the generated CUDA translation unit compiled as plain C++
// by the host's compiler (CTAs one after another, each with 1 or more host threads) and run on
// host arrays.
// It executes exactly the code the GPU would (the same index arithmetic, staging, predication,
// scalar rules and error checks), so the tests check the code generator against the reference
// interpreter on a machine without a GPU. It is not a performance path.
#pragma once

#include <chrono>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "gpu/codegen.h"

namespace pallas::gpu {

// The host C++ compiler: $PALLAS_HOST_CXX, else $CXX, else "c++".
std::string host_compiler();

// Compiles `k` for the host (cached per source within the process) and runs it on `args`
// (excluding dynamic grid sizes, as the backends take them). Aliased inputs are updated in place,
// as on the GPU; other inputs are never written. Throws the interpreters' error when the kernel
// records one, and pallas::Error with the compiler's output when the source does not compile.
// `threads`: the CTA's threads (host threads meeting at real barriers); 1 runs the kernel
// single-threaded. Under ThreadSanitizer builds the kernel is compiled with it too, so a missing
// barrier in generated code is reported as a data race.
// What the emulated hardware did during one run (the tests check that a path was taken).
struct HostEmulationStats {
  int64_t mma_instructions = 0;    // warp-wide mma.sync instructions (tensor-core dots)
  int64_t wgmma_instructions = 0;  // warpgroup-wide wgmma.mma_async instructions
  int64_t tma_boxes = 0;           // TMA tensor copies (cp.async.bulk.tensor) of the ring
  int64_t shuffles = 0;            // warp shuffles (shfl.sync, one per warp) of thread-team reductions
  int64_t acc_flushes = 0;         // an ACC's registers written back to its memory (per Pallas thread)
};
// `deferred_error` (asynchronous calls on device arrays): the error the kernel recorded goes
// there instead of being thrown (errors found before the kernel runs are still thrown).
std::vector<Array> run_host_emulation(const TracedCall& call, const GeneratedKernel& k,
                                      const std::vector<Array>& args, const std::vector<int64_t>& grid,
                                      int threads = 1, HostEmulationStats* stats = nullptr,
                                      std::exception_ptr* deferred_error = nullptr);
// The most host threads one run starts (CTAs at once x threads each; a co-resident kernel runs
// all its CTAs at once, and a larger grid is a pallas::Error).
inline constexpr int64_t kMaxHostEmulationThreads = 4096;

// Host emulation precompiles the standard headers of the device runtime into files of this user's
// temp directory, 60-70 MB each, one per compiler, flags and header text. Before it builds a new
// one it removes from `dir` those no process has used (the use touches them) for `max_age` (a
// week), each with its header, and the temporary files of builds that died over an hour ago.
void evict_unused_precompiled_headers(const std::filesystem::path& dir, std::chrono::hours max_age);

}  // namespace pallas::gpu
