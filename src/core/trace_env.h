// What pallas_call is tracing right now (thread-local): the grid's axis names, and whether a
// kernel body or an index map is being traced (for the seed's constant-capture errors).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pallas::core {

struct TraceEnv {
  enum class Kind { Kernel, IndexMap } kind = Kind::Kernel;
  std::vector<std::string> grid_names;
  std::string func_src_info;  // "kernel at file.cc:12" / "at file.cc:30"
  std::string origin;         // for index maps: "args[0]"
  // A gpu::kernel's cluster axes: grid_names[cluster_axes_begin, cluster_axes_end) (empty
  // elsewhere), for the ops that name them (copy_gmem_to_smem's collective_axes).
  int cluster_axes_begin = 0, cluster_axes_end = 0;
  bool gpu_kernel = false;  // tracing a gpu::kernel's body
  int thread_axis = -1;     // a gpu::kernel's thread axis in grid_names (-1: none)
  int64_t num_threads = 0;  // its size: the Pallas threads of a CTA
};

// The innermost active environment, or nullptr outside pallas_call tracing.
const TraceEnv* current_trace_env();
// It, where it is a gpu::kernel's body being traced (not an index map); else nullptr.
const TraceEnv* gpu_kernel_body_env();

class ScopedTraceEnv {
 public:
  explicit ScopedTraceEnv(const TraceEnv* env);
  ~ScopedTraceEnv();
  ScopedTraceEnv(const ScopedTraceEnv&) = delete;
  ScopedTraceEnv& operator=(const ScopedTraceEnv&) = delete;

 private:
  const TraceEnv* saved_;
};

}  // namespace pallas::core
