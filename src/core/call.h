// Internals of pallas_call shared by the driver and the backends.
#pragma once

#include <functional>
#include <mutex>
#include <optional>

#include "eval/interpreter.h"
#include "pallas/pallas_call.h"
#include "pallas/tpu.h"

namespace pallas {

namespace transforms {
// What pl::vmap recorded (src/transforms/vmap.cpp): the call it batches and the axes.
struct VmapInfo;
}  // namespace transforms

class PallasCallImpl {
 public:
  KernelFn kernel;
  std::vector<ShapeDtype> out_shapes;
  CallOptions opts;
  GridSpec grid_spec;       // canonical: opts.grid/specs/scratch or opts.grid_spec
  CompilerParamsMap compiler_params;
  std::string backend;      // resolved at creation: "reference", "tpu_interpret", ...
  SourceLoc loc;            // where pallas_call was called
  // Set for a call made by pl::vmap: tracing batches the inner call's traced form, calling
  // runs that (or, for the cases the batching rule cannot express, one inner call per element).
  std::shared_ptr<const transforms::VmapInfo> vmap;

  std::mutex mu;
  std::map<std::string, std::shared_ptr<const TracedCall>> cache;  // keyed by argument signature
  // What a compiling backend keeps per traced call and grid (the GPU: generated source and
  // cubin), so a warm call neither generates nor hashes anything. Guarded by `mu`.
  std::map<std::pair<const TracedCall*, std::vector<int64_t>>, std::shared_ptr<const void>> compiled;

  std::shared_ptr<const TracedCall> trace(const std::vector<ShapeDtype>& args);
  // Splits the leading dynamic grid sizes off `all_args` (into `grid`, the rest into `args`)
  // and traces for the remaining arguments' shapes.
  std::shared_ptr<const TracedCall> prepare(const std::vector<Array>& all_args,
                                            std::vector<int64_t>& grid, std::vector<Array>& args);
  // The same from the signatures of the leading `size_args` (as many as the grid has dynamic
  // dimensions, or fewer: an error) and of the other arguments, `sig`; `size_of(i)` reads the value
  // of size argument i once its signature has passed (an integer scalar). For operands that are
  // not host arrays (device arrays).
  std::shared_ptr<const TracedCall> prepare(const std::vector<ShapeDtype>& size_args,
                                            const std::function<int64_t(size_t)>& size_of,
                                            const std::vector<ShapeDtype>& sig, std::vector<int64_t>& grid);
  // How many leading arguments are dynamic grid sizes.
  size_t num_dynamic_grid_dims() const;
  // Runs a prepared call on its backend (the one dispatch, for plain and vmapped calls).
  std::vector<Array> run(const TracedCall& tc, const std::vector<Array>& args, const std::vector<int64_t>& grid);
  // "name at file.cc:12" for messages.
  std::string func_src_info() const;
};

namespace core {
// Mesh entry points (core_map, SparseCore and GPU kernels): the mesh's (name, size) axes become
// the call's named grid and its mesh shape. `who` names the entry point in the error raised when
// the options also give a grid or BlockSpecs.
void use_mesh_as_grid(CallOptions& opts, const std::vector<std::pair<std::string, int64_t>>& axes,
                      const std::string& who, const SourceLoc& loc);
// The grid axis called `name` (axis_index of a named grid axis); -1 when there is none.
int named_grid_axis(const GridMapping& gm, const std::string& name);
// The row-major multi-index of point `linear` of a box of sizes `dims`, into `out` (its size is
// dims.size()): grid traversal in the interpreters.
void unravel_row_major(int64_t linear, const std::vector<int64_t>& dims, std::vector<int64_t>& out);
// gpu::ClusterBarrier's peer rule, for the interpreter, the codegen and the arrival count: CTAs
// `a` and `b` of a cluster (their coordinates along the cluster axes) are peers when they differ
// along at most one axis and that axis is in `collective` (indices into the coordinates); a CTA
// is its own peer.
bool cluster_barrier_peers(const std::vector<int64_t>& a, const std::vector<int64_t>& b,
                           const std::vector<int>& collective);
// A multicast copy's peer rule (copy_gmem_to_smem with collective_axes), likewise: CTAs that
// differ along no axis but those in `collective` (a closed set: all of them copy together).
bool multicast_peers(const std::vector<int64_t>& a, const std::vector<int64_t>& b, const std::vector<int>& collective);
// How a multicast copy of `shape` splits among its `peers` CTAs: equal shares along the first
// dimension `peers` divides (the dim; nullopt when none does). Share k is k * shape[dim] / peers ..
// of that dim, the whole of the others.
std::optional<size_t> multicast_share_dim(const std::vector<int64_t>& shape, int64_t peers);

// Builds the grid mapping for these (non-dynamic-grid) argument shapes: traces every index map
// and checks every BlockSpec. Throws pallas::Error with the seed's messages.
GridMapping build_grid_mapping(const PallasCallImpl& call, const std::vector<ShapeDtype>& args);

// The index map's block indices at one grid point: one value per block dimension (for
// BoundedSlice dims the slice start), computed with a fast path for maps that only forward grid
// indices and constants.
class IndexMapEvaluator {
 public:
  explicit IndexMapEvaluator(const ir::Kernel& index_map);
  ~IndexMapEvaluator();
  IndexMapEvaluator(IndexMapEvaluator&&) noexcept;
  // `prefetch` holds the scalar-prefetch Refs; `grid` the program ids and grid sizes.
  void eval(const GridPoint& grid, const std::vector<eval::RtValue>& prefetch,
            std::vector<int64_t>& out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
}  // namespace core

namespace transforms {
// The batched TracedCall of a vmapped call for these (user-given) argument shapes.
std::shared_ptr<TracedCall> trace_vmapped(const PallasCallImpl& call,
                                          const std::vector<ShapeDtype>& args);
// Whether one batched kernel runs a vmapped call on its arguments as they lie, as
// gpu::call_on_device needs: throws NotSupportedError (its message starting with `who`) where
// calling it would loop over the batch (a dynamic grid, a batched scalar-prefetch operand) or move
// a batch axis (an input aliased to an output batched along another axis). `all_args`: the
// signatures of all the call's arguments.
void check_vmapped_in_place(const PallasCallImpl& call, const std::vector<ShapeDtype>& all_args,
                            const std::string& who);
// Runs a vmapped call on the arguments the user passed (dynamic grid sizes included).
std::vector<Array> call_vmapped(PallasCallImpl& call, const std::vector<Array>& all_args);
// The cost of a vmapped call that runs one inner call per batch element (batched scalar
// prefetch, dynamic grids, batch size 1): the sum of those calls' costs; nullopt for the others.
std::optional<CostEstimate> estimate_vmapped_loop(const PallasCallImpl& call,
                                                  const std::vector<Array>& all_args);
}  // namespace transforms

namespace interpret {
// The reference interpreter: runs a traced call on host arrays. `args` excludes the dynamic
// grid sizes, which are folded into `grid`.
std::vector<Array> run_reference(const TracedCall& call, const std::vector<Array>& args,
                                 const std::vector<int64_t>& grid, std::ostream* debug_out);
// A gpu::kernel (call.gpu_kernel set) in the interpreter: src/interpret/gpu_kernel.cpp.
std::vector<Array> run_gpu_kernel(const TracedCall& call, const std::vector<Array>& args,
                                  const std::vector<int64_t>& grid, std::ostream* debug_out);
}  // namespace interpret

namespace tpu_interpret {
// Rejects what the TPU interpret mode cannot run, at trace time (direct loads and stores of
// HBM/ANY Refs, with the reference's message).
void check_kernel(const ir::Kernel& k);
// Runs a traced call on the simulated TPU: `args[d]` are device d's operands on `mesh` (one
// device when the mesh is empty).
std::vector<std::vector<Array>> run(const PallasCallImpl& c, const TracedCall& call,
                                    const std::vector<std::vector<Array>>& args,
                                    const std::vector<int64_t>& grid, const tpu::Mesh& mesh);
}  // namespace tpu_interpret

namespace gpu {
// Runs a traced call on the NVIDIA GPU (src/gpu/backend.cpp): generates and compiles (cached) the
// CUDA, moves the operands, launches. Without a GPU it raises the error saying what is missing.
std::vector<Array> run_gpu(PallasCallImpl& c, const TracedCall& call, const std::vector<Array>& args,
                           const std::vector<int64_t>& grid);
// Backend "gpu_emulate": the same generated CUDA, compiled by the host C++ compiler and run on the
// CPU (src/gpu/host_emulation.h) with 4 threads per CTA — to debug generated kernels without a GPU.
std::vector<Array> run_gpu_emulated(PallasCallImpl& c, const TracedCall& call, const std::vector<Array>& args,
                                    const std::vector<int64_t>& grid);
// A gpu::kernel compiles when each CTA runs one Pallas thread and clusters are single CTAs (its
// grid axes become parallel CTAs); otherwise NotSupportedError. Its primitives (barriers, copies,
// wgmma) are reported by the code generator.
void check_compilable_kernel(const TracedCall& call, const SourceLoc& loc);
// At trace time: what only loads, stores and atomics may take (gpu::cluster_ref's views of a peer
// CTA's memory) reaching another op is a NotSupportedError naming that op's line
// (src/trace/gpu_ops.cpp).
void check_peer_refs(const ir::Kernel& k);
}  // namespace gpu

}  // namespace pallas
