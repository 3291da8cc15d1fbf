// GPU kernels at the level of Mosaic GPU's `plgpu.kernel`: the body runs once per Pallas thread
// (a warpgroup: 128 CUDA threads) of every CTA of an explicit grid (and cluster), sees its
// inputs and outputs as whole-array Refs in global memory (GMEM), and moves data itself:
// asynchronous copies into shared memory (SMEM) that complete on barriers, copies back, wgmma
// on an accumulator, barriers between the warpgroups of a CTA.
//
//   namespace plgpu = pallas::gpu;
//   auto call = plgpu::kernel(
//       [](pl::Ref x, pl::Ref out, pl::Ref x_smem, pl::Ref bar) {
//         auto b = pl::program_id(0);        // or plgpu::axis_index("b")
//         plgpu::copy_gmem_to_smem(x.at(pl::ds(b * 128, 128)), x_smem, bar);
//         plgpu::barrier_wait(bar);
//         x_smem[pl::all] = x_smem[pl::all] * 2.0f;
//         plgpu::commit_smem();
//         plgpu::copy_smem_to_gmem(x_smem, out.at(pl::ds(b * 128, 128)));
//         plgpu::wait_smem_to_gmem(0);
//       },
//       {pl::ShapeDtype({1024}, pl::f32)},
//       plgpu::Mesh{.grid = {8}, .grid_names = {"b"}},
//       {.scratch_shapes = {plgpu::SMEM({128}, pl::f32), plgpu::Barrier{}}, .interpret = true});
//
// With `.interpret = true` the kernel runs in the interpreter (docs/GPU.md, "gpu::kernel"): the
// Pallas threads of a cluster's CTAs (of the whole grid, when it has pl::get_global semaphores) run
// as cooperating threads that switch only where one must wait, copies and wgmma complete when
// issued, and barrier misuse that hangs or races on a GPU (a wait that nothing will complete, a
// phase completed twice before anyone waited for it) is a pallas::Error naming the barrier, the
// thread and the line.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "pallas/pallas_call.h"

namespace pallas::gpu {

// ---- Memory spaces and scratch --------------------------------------------------------------
// GMEM: the GPU's global memory (where the kernel's operands live). SMEM: a CTA's shared memory,
// shared by its Pallas threads. ACC: a wgmma accumulator (registers on the GPU).
inline constexpr MemorySpace GMEM = MemorySpace::Gmem;
inline constexpr MemorySpace SMEM_SPACE = MemorySpace::GpuShared;
inline constexpr MemorySpace ACC_SPACE = MemorySpace::GpuAcc;

inline ScratchShape SMEM(Shape shape, DType dtype) { return {std::move(shape), dtype, MemorySpace::GpuShared}; }
inline ScratchShape ACC(Shape shape, DType dtype = DType::F32) {
  return {std::move(shape), dtype, MemorySpace::GpuAcc};
}

// `num_barriers` mbarriers in shared memory (a Ref of shape {num_barriers}; pass one of them to
// the barrier ops: bars.at(i), or the Ref itself when there is one). A phase completes after
// `num_arrivals` arrivals: barrier_arrive calls, and one per copy_gmem_to_smem naming it.
struct Barrier {
  int num_arrivals = 1;
  int num_barriers = 1;
  operator ScratchShape() const;  // checks the counts (pallas::Error)
};

// `num_barriers` barriers for copies (Mosaic GPU's TMABarrier): a phase completes when one
// copy_gmem_to_smem naming the barrier has landed — gpu::Barrier{1, num_barriers}.
struct TMABarrier {
  int num_barriers = 1;
  operator ScratchShape() const;  // checks the count (pallas::Error)
};

// Barriers across the CTAs of a cluster (Mosaic GPU's ClusterBarrier). Every CTA has its own
// `num_barriers` mbarriers. barrier_arrive on one arrives on that barrier in each of the caller's
// peers: the CTAs of its cluster that differ from it along at most one of `collective_axes`
// (cluster axis names; the caller's CTA included; with one axis, the CTAs along that axis).
// barrier_wait waits for the caller's own CTA's barrier. A phase completes after `num_arrivals`
// arrivals from each peer — so when every Pallas thread counted in num_arrivals, in every CTA
// along the axes, arrives and then waits, no CTA passes the wait before all have arrived (what
// each wrote to GMEM before arriving is visible to the others after it). Copies do not arrive on
// cluster barriers (give them a gpu::Barrier or TMABarrier). Along several axes the peer sets
// overlap without being closed (a CTA does not wait for its peers' peers), so reusing such a
// barrier round after round races; along one axis it does not (docs/GPU.md).
struct ClusterBarrier {
  std::vector<std::string> collective_axes;
  int num_arrivals = 1;
  int num_barriers = 1;
  operator ScratchShape() const;  // checks the counts (pallas::Error); gpu::kernel checks the axes
};

// SMEM arrays that share memory (Mosaic GPU's Union), for kernels whose phases need different
// buffers at different times: each member is a list of SMEM arrays (or nested Unions) laid out
// one after another from the union's start, each at a 16-byte boundary; the union takes the
// bytes of its largest member. The kernel receives every member's arrays in order, as if they
// were listed in place of the union. Bytes written through one member read back through another
// as those bytes (the interpreter too); the race check sees the shared bytes, so an access
// through one member that is not ordered against another thread's access through another
// member to the same bytes is a data race.
struct Union {
  std::vector<std::vector<ScratchShape>> members;
  operator ScratchShape() const;  // checks the members (pallas::Error)
};

// Semaphores (Mosaic GPU's SemaphoreType.REGULAR): `shape` counters (one for {}; pass one to the
// semaphore ops: sems.at(i)). One Pallas thread signals, another waits: what the signalling thread
// wrote before the signal is visible to the waiting one after the wait. Two scopes, as Mosaic GPU
// has them:
//  * in scratch_shapes (or a run_scoped collective over the thread axis): the CTA's own counters,
//    0 when the CTA starts (at each entry of the scope, and due back at 0 when it ends: Mosaic GPU
//    hands them to the next scope uncleared), for its Pallas threads (warpgroups) to
//    order each other; another CTA's are out of reach. (Compiled: in the CTA's shared memory.)
//  * pl::get_global(gpu::Semaphore{...}) in the body (Mosaic GPU's pl.get_global): counters of the
//    whole grid, 0 at the start of every call — one CTA signals, another waits. A wait for another
//    CTA needs that CTA to be running, so a kernel with them runs its whole grid at once: the GPU
//    launch checks that every CTA fits on the device at the same time (an error says how many
//    fit), and the interpreter runs all CTAs together (not cluster by cluster), checking races
//    between them through GMEM.
struct Semaphore {
  Shape shape = {};
  operator ScratchShape() const;
};

// ---- The mesh and the entry point -------------------------------------------------------------
// The grid counts clusters: the CUDA grid is grid x cluster per dimension. Each CTA runs
// `num_threads` Pallas threads (warpgroups; at most 16), numbered along `thread_name`. Every
// axis name can be read with axis_index(name); pl::program_id(i) reads the i-th axis of
// (grid..., cluster..., thread).
struct Mesh {
  std::vector<int64_t> grid;
  std::vector<std::string> grid_names;
  std::vector<int64_t> cluster;
  std::vector<std::string> cluster_names;
  std::optional<int> num_threads;
  std::optional<std::string> thread_name;
};

// The largest shared-memory scratch a CTA may use: 227 KiB (Hopper's opt-in maximum per block).
inline constexpr int64_t kMaxSharedMemoryBytes = 227 * 1024;
// The bytes of shared memory a scratch list takes (arrays, then 8 bytes per barrier, each
// barrier aligned to 8 bytes; a Union its largest member, starting 16-byte aligned; 4 bytes per
// gpu::Semaphore counter, the CTA's); ACC scratch (registers) is not counted.
int64_t shared_memory_bytes(const std::vector<ScratchShape>& scratch);
// The shared memory a CTA may use on this machine's GPU (the driver's opt-in limit per block:
// 227 KiB on an H100, 163 KiB on an A100); nullopt without a usable GPU. For kernels that size
// their scratch to the device (ws_matmul's default pipeline depth).
std::optional<int64_t> device_shared_memory_limit();

namespace detail {
PallasCall make_gpu_kernel(KernelFn body, std::vector<ShapeDtype> out_shapes, const Mesh& mesh,
                           CallOptions opts, const SourceLoc& loc);
}  // namespace detail

// plgpu.kernel: `body(inputs..., outputs..., scratch...)` on every Pallas thread of the mesh.
// Options: scratch_shapes (SMEM, ACC, Barrier, TMABarrier, ClusterBarrier, Union, Semaphore),
// input_output_aliases, name, debug, debug_checks, and interpret (true: the interpreter;
// otherwise the GPU backend). No grid or BlockSpecs: the mesh is the grid and operands are whole
// arrays in GMEM.
template <class F>
PallasCall kernel(F body, std::vector<ShapeDtype> out_shapes, Mesh mesh, CallOptions opts = {},
                  Loc loc = Loc::current()) {
  return detail::make_gpu_kernel(pallas::detail::make_kernel_fn(std::move(body)),
                                 std::move(out_shapes), mesh, std::move(opts), SourceLoc::from(loc));
}

// The index along a named mesh axis (grid, cluster or thread axis).
Value axis_index(const std::string& axis, Loc loc = Loc::current());

// ---- Copies -----------------------------------------------------------------------------------
// Copies `src` (a GMEM Ref, views allowed) into `dst` (an SMEM Ref of the same shape and dtype)
// asynchronously (TMA on Hopper); when the data is in, the copy arrives once on `barrier`. Read
// `dst` only after barrier_wait on that barrier.
void copy_gmem_to_smem(const Ref& src, const Ref& dst, const Ref& barrier, Loc loc = Loc::current());
// The same as a multicast (Mosaic GPU's collective_axes): every CTA of the caller's cluster that
// differs from it only along `collective_axes` (cluster axis names) — its peers, the caller's CTA
// included — makes this call with the same `src`, and each peer's `dst` receives the whole of it.
// The copy is split among the peers along the first dimension their count divides: each
// peer's share lands in every peer's `dst` when that peer issues its call (so no peer may issue
// into a `dst` that another still reads: order them with a gpu::ClusterBarrier), and a peer's
// `barrier` (its own CTA's, as for a plain copy) gets the copy's one arrival when all the shares
// have landed in it. A peer that never makes the call leaves the others waiting (an error in the
// interpreter, as is a peer that copies another `src`). On Hopper one TMA load per peer feeds
// them all, which halves (for two peers) what a matmul's operand costs L2.
void copy_gmem_to_smem(const Ref& src, const Ref& dst, const Ref& barrier, std::vector<std::string> collective_axes,
                       Loc loc = Loc::current());
// Copies `src` (SMEM) to `dst` (GMEM) asynchronously. Call commit_smem() after writing `src`
// with ordinary stores and before the copy; wait_smem_to_gmem before reusing `src` or ending.
struct CopyToGmemOptions {
  // Mosaic GPU's reduction_op: dst op= src element by element — "add", "min", "max" (NaN wins, as
  // atomic_rmw), or "and" / "or" / "xor" on integers — each element's update atomic, so copies of
  // several CTAs may reduce into one GMEM block (a split-K matmul's partial sums) without
  // ordering them; a plain access of the block unordered with one races. "": a plain copy.
  std::string reduction_op;
  // Mosaic GPU's commit_group: true, this copy and the uncommitted ones before it become one
  // group, which wait_smem_to_gmem counts; false, it stays uncommitted (no wait covers it) until a
  // copy with commit_group or commit_smem_to_gmem_group().
  bool commit_group = true;
};
void copy_smem_to_gmem(const Ref& src, const Ref& dst, const CopyToGmemOptions& options = {}, Loc loc = Loc::current());
// Makes this Pallas thread's uncommitted copies to GMEM one group (Mosaic GPU's
// commit_smem_to_gmem_group).
void commit_smem_to_gmem_group(Loc loc = Loc::current());
// Waits until at most `n` of this thread's groups of copy_smem_to_gmem copies are still in flight
// (`wait_read_only`: only until they have read their source). A copy with commit_group (the
// default) is one group with the uncommitted copies before it; an uncommitted copy is covered by
// no wait.
void wait_smem_to_gmem(int n, bool wait_read_only = false, Loc loc = Loc::current());
// Makes this thread's ordinary shared-memory stores visible to the asynchronous engines (copies
// to GMEM, wgmma) and waits for the warpgroup.
void commit_smem(Loc loc = Loc::current());

// ---- Barriers ---------------------------------------------------------------------------------
// One arrival on `barrier` (a single barrier: bars.at(i)).
void barrier_arrive(const Ref& barrier, Loc loc = Loc::current());
// Waits for the barrier's next phase: each thread's k-th wait on a barrier waits for its k-th
// completed phase. A thread must wait for every phase (on the GPU the phase is one parity bit).
void barrier_wait(const Ref& barrier, Loc loc = Loc::current());

// ---- Semaphores (gpu::Semaphore: scratch_shapes, run_scoped, pl::get_global) -----------------------
// Mosaic GPU's async_prefetch: asks the GPU to bring `ref`, a GMEM Ref or a view of one, into the
// L2 cache ahead of the copies that will read it — `prefetch.global.L2` of each 128-byte line,
// spread over the Pallas thread's CUDA threads. With `collective_axes` (cluster axes) the CTAs
// that differ only along them split the lines: each prefetches its share (line l by the CTA of
// rank l mod their number along those axes), as when they will multicast-copy the Ref — so they
// must all pass the same Ref (a CTA prefetching a block of its own gets only its share). No value
// changes; the interpreter does nothing.
void async_prefetch(const Ref& ref, std::vector<std::string> collective_axes = {}, Loc loc = Loc::current());
// Mosaic GPU's cluster_ref: the SMEM array `ref` (scratch, or a view of it) in another CTA of the
// cluster — distributed shared memory: the CTA at `index` (an int or an i32 scalar, in [0, the
// axis's size)) along the cluster axis `axis`, at this CTA's place along the others. Loads and
// stores (and atomics) go through it; order them with the peer's accesses by a gpu::ClusterBarrier
// (the interpreter reports the race otherwise). Copies, wgmma and barrier ops do not take it.
Ref cluster_ref(const Ref& ref, const std::string& axis, Operand index, Loc loc = Loc::current());
// Adds `inc` (>= 0) to `sem`, after this Pallas thread's earlier writes (a release).
void semaphore_signal(const Ref& sem, Operand inc = 1, Loc loc = Loc::current());
// Waits until `sem` is at least `value` (>= 0), then subtracts `value` — unless `decrement` is
// false, which leaves the count as it is (every waiter sees it: a flag for "all have arrived").
// What the signals counted released is visible after the wait (an acquire).
void semaphore_wait(const Ref& sem, Operand value = 1, bool decrement = true, Loc loc = Loc::current());
// The semaphore's current count (an acquire).
Value semaphore_read(const Ref& sem, Loc loc = Loc::current());

// ---- Tensor cores and registers -----------------------------------------------------------------
// acc += a @ b on the tensor cores (wgmma): acc an ACC Ref (M x N, f32, or f16 for f16 inputs),
// a (M x K) and b (K x N) SMEM Refs of f16, bf16 or f32; M a multiple of 64, N a multiple of 8 up
// to 256, K a multiple of 32 bytes' worth of elements. b may be the transpose of an (N x K) tile,
// `k_s.T()` (attention's q k^T): wgmma reads it K-major. f32 products run on CUDA cores in f32
// (not tf32). Read acc only after wgmma_wait.
void wgmma(const Ref& acc, const Ref& a, const Ref& b, Loc loc = Loc::current());
// The same with a in registers (a value, as Mosaic GPU's wgmma takes an array for a): its value
// when the wgmma is issued, so it may be computed just before (attention's softmax(q k^T) @ v)
// and nothing waits to reuse it. On the GPU it is staged into shared memory for wgmma.
void wgmma(const Ref& acc, const Value& a, const Ref& b, Loc loc = Loc::current());
// Waits until at most `n` of this thread's wgmmas are still running.
void wgmma_wait(int n, Loc loc = Loc::current());
// setmaxnreg: raises or lowers this warpgroup's registers per thread (24..256, a multiple of 8);
// a hint for warp-specialized kernels, with no effect on results.
void set_max_registers(int n, bool increase, Loc loc = Loc::current());

// ---- Pipelines ----------------------------------------------------------------------------------
// A software pipeline inside a gpu::kernel's body (Mosaic GPU's emit_pipeline): the pipeline
// steps over `grid` (row-major: the last axis fastest; sizes may be traced i32 scalars) and, at
// each step, calls the body with the step's indices (i32 scalars, one per axis) and one Ref per
// operand — inputs first, then outputs — for the step's block:
//  * an input's block in SMEM, already landed. Inputs are copied ahead: max_concurrent_steps
//    slots per input, the first steps' copies issued before the loop, step s + slots' copy
//    issued into step s's slot right after step s's body (so the body must be done with its
//    blocks when it returns — wgmma_wait on products that read them — unless delay_release);
//  * an output's block in SMEM (one buffer per output), which the body writes; it is copied to
//    the output after the last of the consecutive steps that map to the same block (its content
//    carries over between them, so a step may accumulate into it), and before a step that
//    starts a new block writes it, the previous copy has read it. All copies have landed when
//    the pipeline returns. A block visited again after other blocks is copied out again, and on
//    the GPU the two copies may land in either order (as in Mosaic GPU): give each output block
//    one run of consecutive steps.
// Block indices come from each spec's index map called with the step's indices (no index map:
// block 0). Block dims are ints (Blocked) or squeezed (the dim is indexed, not in the block);
// the array's dims must be multiples of them. A spec in gpu::GMEM is not copied: the body gets
// the operand itself. Each Pallas thread that calls the pipeline runs its own (its own SMEM).
// With init_carry, the body takes the carry as a third argument and returns the next one; the
// pipeline returns the last.
struct PipelineOptions {
  std::vector<Operand> grid;  // sizes: ints, or i32 scalars traced in the kernel (a dynamic grid)
  std::vector<BlockSpec> in_specs;
  std::vector<BlockSpec> out_specs;
  int max_concurrent_steps = 1;  // input slots (with a grid of ints, at most its number of steps)
  // Steps an input's slot is kept after its step (Mosaic GPU's delay_release, here for all
  // inputs), less than max_concurrent_steps: a body may leave the wgmmas reading its blocks
  // running if it waits with wgmma_wait(delay_release) — step s's slot is refilled after step
  // s + delay_release's body; the pipeline then ends with a wgmma_wait(0) before giving its
  // slots back.
  int delay_release = 0;
  std::vector<Value> init_carry;
};
using PipelineBody = std::function<std::vector<Value>(const std::vector<Value>& indices, const std::vector<Ref>& blocks,
                                                      const std::vector<Value>& carry)>;
// Runs the pipeline over its GMEM operands (the inputs, then the outputs); returns the carry.
using Pipeline = std::function<std::vector<Value>(const std::vector<Ref>& operands)>;
namespace detail {
// A pipeline body as a PipelineBody, and whether it takes a carry: body(indices, blocks), or
// body(indices, blocks, carry) returning the next carry.
template <class F>
std::pair<PipelineBody, bool> pipeline_body(F body) {
  using Indices = const std::vector<Value>&;
  using Blocks = const std::vector<Ref>&;
  if constexpr (std::is_invocable_v<F&, Indices, Blocks, const std::vector<Value>&>) {
    static_assert(std::is_convertible_v<std::invoke_result_t<F&, Indices, Blocks, const std::vector<Value>&>, std::vector<Value>>,
                  "a pipeline body that takes a carry returns the next carry (a std::vector<Value>)");
    return {PipelineBody(std::move(body)), true};
  } else if constexpr (std::is_invocable_v<F&, Indices, Blocks>) {
    return {[body = std::move(body)](Indices i, Blocks b, const std::vector<Value>&) mutable {
              body(i, b);
              return std::vector<Value>{};
            },
            false};
  } else {
    static_assert(std::is_invocable_v<F&, Indices, Blocks>,
                  "a pipeline's body takes (indices, blocks), or (indices, blocks, carry) returning the next carry");
    return {};
  }
}
Pipeline make_pipeline(PipelineBody body, bool body_takes_carry, PipelineOptions opts, Loc loc);
}  // namespace detail
// body(indices, blocks), or body(indices, blocks, carry) -> next carry (with init_carry).
template <class F>
Pipeline emit_pipeline(F body, PipelineOptions opts, Loc loc = Loc::current()) {
  auto [wrapped, takes_carry] = detail::pipeline_body(std::move(body));
  return detail::make_pipeline(std::move(wrapped), takes_carry, std::move(opts), loc);
}

// The warp-specialized form (Mosaic GPU's emit_pipeline_warp_specialized), for a kernel whose
// mesh has a thread axis `wg_axis` of num_compute_wgs + 1 Pallas threads: threads 0 ..
// num_compute_wgs - 1 compute — each runs body(indices, blocks) at every step, on the same
// blocks — and the last one, the memory warpgroup, only copies: the first steps' inputs, then
// step s + slots' into a slot as soon as every compute thread has finished step s (a barrier per
// slot each way). Every thread of the CTA calls the pipeline; its buffers are shared (a
// collective run_scoped over wg_axis). With memory_registers (a multiple of 8 in [24, 256]) the
// memory warpgroup lowers its registers to that and the compute ones raise theirs to an equal
// share of the rest (set_max_registers). Outputs in SMEM need a single compute warpgroup (as in
// Mosaic GPU); in gpu::GMEM the body writes them itself.
// A carry (Mosaic GPU's compute_context): give compute_context, and a body that takes the carry
// as a third argument and returns the next one. compute_context runs in the compute warpgroups
// only — set up the carry, call `run(init)` exactly once (it runs the steps and returns the last
// carry, each compute warpgroup its own), use the result — so what it computes before and after
// costs the memory warpgroup nothing.
using ComputeContext = std::function<void(const std::function<std::vector<Value>(const std::vector<Value>&)>& run)>;
struct WarpSpecializedPipelineOptions {
  std::vector<Operand> grid;  // as PipelineOptions::grid
  std::vector<BlockSpec> in_specs;
  std::vector<BlockSpec> out_specs;
  int max_concurrent_steps = 2;
  int delay_release = 0;  // as PipelineOptions::delay_release: the compute warpgroups release a slot that many steps late
  std::string wg_axis;
  int num_compute_wgs = 1;
  int memory_registers = 0;  // 0: no setmaxnreg
  ComputeContext compute_context;
  // Mosaic GPU's manual_consumed_barriers: each staged input gets a consumed barrier of its own,
  // handed to the body after its blocks (blocks = inputs, outputs, then one barrier per staged
  // input, for this step's slot); every compute warpgroup must barrier_arrive on each of them
  // at every step — as soon as it is done with that input (after the wgmma reading it, say) —
  // and the memory warpgroup refills each input's slot when its own barrier completes. Not with
  // delay_release.
  bool manual_consumed_barriers = false;
};
using WarpSpecializedPipeline = std::function<void(const std::vector<Ref>& operands)>;
namespace detail {
WarpSpecializedPipeline make_warp_specialized_pipeline(PipelineBody body, bool body_takes_carry,
                                                       WarpSpecializedPipelineOptions opts, Loc loc);
}  // namespace detail
// body(indices, blocks), or body(indices, blocks, carry) -> next carry (with compute_context).
template <class F>
WarpSpecializedPipeline emit_pipeline_warp_specialized(F body, WarpSpecializedPipelineOptions opts, Loc loc = Loc::current()) {
  auto [wrapped, takes_carry] = detail::pipeline_body(std::move(body));
  return detail::make_warp_specialized_pipeline(std::move(wrapped), takes_carry, std::move(opts), loc);
}

// ---- Loops over work (Mosaic GPU's nd_loop, planar_snake) ---------------------------------------
// One iteration of nd_loop: the grid index it visits (one i32 scalar per grid dim), and this
// caller's iteration count so far and in all.
struct NDLoopInfo {
  std::vector<Value> index;
  Value local_index;
  Value num_local_steps;
};
struct NDLoopOptions {
  // Visits the grid in tiles of these sizes (one per dim, each dividing its dim: the tiles in
  // row-major order, each tile's points in row-major order), so consecutive steps stay close.
  std::vector<int64_t> tiling;
};
// A loop over the points of `grid` (row-major; sizes are ints or i32 scalars) shared among the
// mesh points along `collective_axes` (axis names; their combined index is row-major): the
// caller at combined index a of A visits flat points a, a + A, a + 2A, ... (a persistent
// kernel's CTAs taking the work in turn). body(info).
void nd_loop(const std::vector<Operand>& grid, const std::vector<std::string>& collective_axes,
             const std::function<void(const NDLoopInfo&)>& body, const NDLoopOptions& options = {},
             Loc loc = Loc::current());
// With carried values: carry = body(info, carry); returns the last carry.
std::vector<Value> nd_loop(const std::vector<Operand>& grid, const std::vector<std::string>& collective_axes,
                           const std::vector<Value>& init_carry,
                           const std::function<std::vector<Value>(const NDLoopInfo&, const std::vector<Value>&)>& body,
                           const NDLoopOptions& options = {}, Loc loc = Loc::current());
// The (row, column) of flat index `lin_idx` in a `shape` = {rows, cols} grid walked as a snake
// for locality: the `minor_dim` (0: rows, 1: columns) is cut into strips `tile_width` wide; a
// strip is walked with its minor coordinate fastest, and every other strip walks the major
// dimension backwards, so consecutive strips meet at the same end (a last, narrower strip takes
// the remainder).
std::pair<Value, Value> planar_snake(const Operand& lin_idx, const std::pair<Operand, Operand>& shape, int minor_dim,
                                     int64_t tile_width, Loc loc = Loc::current());

// ---- Profiling ----------------------------------------------------------------------------------
namespace detail {
void named_region_begin(const std::string& name, const Loc& loc);
void named_region_end(const std::string& name, const Loc& loc);
}  // namespace detail
// Traces `body` as a region named `name` (regions nest). With gpu::CompilerParams{.profile_space
// = N, .profile_dir = "dir"} the GPU backend (and gpu_emulate) records when each Pallas thread —
// a warpgroup of a gpu::kernel, a pallas_call's CTA — enters and leaves every region, up to N
// events per thread and CTA, and after the call writes a Chrome/Perfetto trace JSON into dir
// (docs/GPU.md, "Profiling"). Usable in any kernel: the interpreters run the body and record
// nothing.
template <class F>
void named_region(const std::string& name, F&& body, Loc loc = Loc::current()) {
  detail::named_region_begin(name, loc);
  std::forward<F>(body)();
  detail::named_region_end(name, loc);
}

}  // namespace pallas::gpu
