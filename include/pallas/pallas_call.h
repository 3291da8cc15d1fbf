// pallas_call: run a kernel over a grid, each grid point seeing blocks of its operands.
//
// The equivalent loop nest of a call with grid (G0, G1), one input x and one output o:
//
//   for i in range(G0):            # row-major, last axis fastest
//     for j in range(G1):
//       bx = x_spec.index_map(i, j)                       # block indices of x
//       bo = o_spec.index_map(i, j)
//       kernel(x[block bx of shape x_spec.block_shape],   # Refs to the blocks
//              o[block bo of shape o_spec.block_shape],
//              *scratch)                                   # scratch persists across points
//
// A Blocked(b) dimension with block index k covers elements [k*b, (k+1)*b); an Element(b)
// dimension's index is an element offset; a Squeezed dimension selects one element and is
// dropped from the kernel's Ref; a BoundedSlice(b) dimension's index map returns ds(start, size)
// with size <= b. Arrays whose shape is not a multiple of the block shape are padded: reads
// past the end see the uninitialized value (NaN / int max / true), writes past the end are
// dropped.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <variant>
#include <vector>

#include "pallas/array.h"
#include "pallas/ir/ir.h"
#include "pallas/trace.h"

namespace pallas {

// ---- Block dimensions ---------------------------------------------------------------------------
struct Blocked {
  int64_t block_size;
};
struct Squeezed {};
inline constexpr Squeezed squeezed{};
struct Element {
  int64_t block_size;
  std::pair<int64_t, int64_t> padding{0, 0};  // (low, high) padding of the array's dimension
};
struct BoundedSlice {
  int64_t block_size;
};

// One dimension of a block shape: an int is Blocked(int), `squeezed` (or std::nullopt) is
// Squeezed.
class BlockDim {
 public:
  template <class T>
    requires std::is_integral_v<T>
  BlockDim(T n) : v_(Blocked{static_cast<int64_t>(n)}) {}
  BlockDim(Blocked b) : v_(b) {}
  BlockDim(Squeezed s) : v_(s) {}
  BlockDim(std::nullopt_t) : v_(Squeezed{}) {}
  BlockDim(Element e) : v_(e) {}
  BlockDim(BoundedSlice b) : v_(b) {}
  bool is_blocked() const { return std::holds_alternative<Blocked>(v_); }
  bool is_squeezed() const { return std::holds_alternative<Squeezed>(v_); }
  bool is_element() const { return std::holds_alternative<Element>(v_); }
  bool is_bounded_slice() const { return std::holds_alternative<BoundedSlice>(v_); }
  // Size of the block along this dimension (1 for Squeezed).
  int64_t size() const;
  const Element& element() const { return std::get<Element>(v_); }
  // "Blocked(8)", "Squeezed", "Element(8, padding=(1, 2))", "BoundedSlice(8)"
  std::string to_string() const;
  bool operator==(const BlockDim& o) const { return to_string() == o.to_string(); }

 private:
  std::variant<Blocked, Squeezed, Element, BoundedSlice> v_;
};
using BlockShape = std::vector<BlockDim>;

// Pipelining hint: how many buffers a block gets (recorded; the backends that pipeline use it).
struct Buffered {
  int buffer_count = 2;
  bool use_lookahead = false;
};

// ---- Index maps ---------------------------------------------------------------------------------
// An index map receives the grid indices (i32 scalars) and then the scalar-prefetch Refs, and
// returns one entry per block dimension: a block index (Blocked), an element offset (Element),
// the selected element (Squeezed), or ds(start, size) (BoundedSlice). Each parameter may be
// declared as pl::Value (grid indices) or pl::Ref (prefetch operands).
struct IndexMapArg : Value {
  IndexMapArg(const Value& v) : Value(v) {}
  operator Ref() const { return Ref(static_cast<const Value&>(*this)); }
};
using IndexMapFn = std::function<Indices(const std::vector<IndexMapArg>&)>;

namespace detail {
template <class F, size_t... I>
Indices call_index_map(F& f, const std::vector<IndexMapArg>& a, std::index_sequence<I...>) {
  return Indices(f(a[I]...));
}
template <size_t> using IndexArgOf = const IndexMapArg&;
template <class F, size_t N = 0> Indices dispatch_index_map(F& f, const std::vector<IndexMapArg>& a) {
  if constexpr (N > 12) {
    throw Error("an index map cannot be called with " + std::to_string(a.size()) +
                " arguments: it takes one per grid axis, then one per scalar-prefetch operand");
  } else {
    if (a.size() == N) {
      if constexpr ([]<size_t... I>(std::index_sequence<I...>) {
                      return std::is_invocable_v<F&, IndexArgOf<I>...>;
                    }(std::make_index_sequence<N>{})) {
        return call_index_map(f, a, std::make_index_sequence<N>{});
      } else {
        throw Error("an index map cannot be called with " + std::to_string(N) +
                    " arguments: it takes one per grid axis, then one per scalar-prefetch "
                    "operand");
      }
    }
    return dispatch_index_map<F, N + 1>(f, a);
  }
}
template <class F> IndexMapFn make_index_map(F f) {
  if constexpr (std::is_invocable_v<F&, const std::vector<IndexMapArg>&>)
    return [f](const std::vector<IndexMapArg>& a) mutable { return Indices(f(a)); };
  else
    return [f](const std::vector<IndexMapArg>& a) mutable { return dispatch_index_map(f, a); };
}
}  // namespace detail

// ---- BlockSpec ----------------------------------------------------------------------------------
// How an operand is cut into blocks. No block shape: the whole array. No index map: all zeros.
struct BlockSpec {
  std::optional<BlockShape> block_shape;
  IndexMapFn index_map;  // empty: every block index is 0
  std::optional<MemorySpace> memory_space;
  std::optional<Buffered> pipeline_mode;
  SourceLoc loc;  // where the spec was written (names the index map in errors)

  BlockSpec(Loc loc = Loc::current()) : loc(SourceLoc::from(loc)) {}
  // A whole-array operand in a memory space, e.g. BlockSpec(MemorySpace::Any) for manual DMAs.
  BlockSpec(MemorySpace space, Loc loc = Loc::current())
      : memory_space(space), loc(SourceLoc::from(loc)) {}
  BlockSpec(BlockShape shape, Loc loc = Loc::current())
      : block_shape(std::move(shape)), loc(SourceLoc::from(loc)) {}
  template <class F>
    requires(!std::is_convertible_v<F, Loc>)
  BlockSpec(BlockShape shape, F index_map, Loc loc = Loc::current())
      : block_shape(std::move(shape)),
        index_map(detail::make_index_map(std::move(index_map))),
        loc(SourceLoc::from(loc)) {}
  BlockSpec with_memory_space(MemorySpace m) const {
    BlockSpec s = *this;
    s.memory_space = m;
    return s;
  }
  BlockSpec with_pipeline_mode(Buffered b) const {
    BlockSpec s = *this;
    s.pipeline_mode = b;
    return s;
  }
};

// A list of BlockSpecs that knows whether it was given at all (`.in_specs = {a, b}`); when not
// given, every operand is a whole-array block.
class BlockSpecs {
 public:
  BlockSpecs() = default;
  BlockSpecs(std::initializer_list<BlockSpec> specs) : specs_(specs), given_(true) {}
  BlockSpecs(std::vector<BlockSpec> specs) : specs_(std::move(specs)), given_(true) {}
  bool given() const { return given_; }
  const std::vector<BlockSpec>& specs() const { return specs_; }
  size_t size() const { return specs_.size(); }

 private:
  std::vector<BlockSpec> specs_;
  bool given_ = false;
};

// ---- Grids ----------------------------------------------------------------------------------------
// A grid dimension whose size is given when the call runs (a leading i32 scalar argument).
struct DynamicDim {};
inline constexpr DynamicDim dynamic{};

class GridDim {
 public:
  template <class T>
    requires std::is_integral_v<T>
  GridDim(T n) : size_(static_cast<int64_t>(n)) {}
  GridDim(DynamicDim) : size_(-1) {}
  bool is_dynamic() const { return size_ < 0; }
  int64_t size() const { return size_; }

 private:
  int64_t size_;
};

struct Grid {
  std::vector<GridDim> dims;
  std::vector<std::string> names;  // empty, or one name per dimension (a named grid)
  Grid() = default;
  Grid(std::initializer_list<GridDim> d) : dims(d) {}
  Grid(std::vector<GridDim> d) : dims(std::move(d)) {}
  // A named grid: {{"x", 4}, {"y", 2}}.
  Grid(std::initializer_list<std::pair<std::string, int64_t>> named);
  bool empty() const { return dims.empty(); }
  std::string to_string() const;  // "(2, 3)", "(x=2, y=3)", "(dynamic, 4)"
};

// pl.get_global: a buffer of the kind `what` that every program of the grid shares and that
// lives for the whole call — scratch that the body asks for where it needs it, instead of in
// scratch_shapes. Each call returns a new buffer (traced once inside a loop: one buffer). On the
// GPU backends what = gpu::Semaphore{...} in a gpu::kernel's body: counters of the whole grid, 0
// at the start of every call (a gpu::Semaphore in scratch_shapes is the CTA's own); other kinds,
// and a pallas_call body, raise "not supported yet".
Ref get_global(const ScratchShape& what, Loc loc = Loc::current());

// grid / in_specs / out_specs / scratch_shapes in one object (like pl.GridSpec), with
// num_scalar_prefetch leading operands (like pltpu.PrefetchScalarGridSpec): those are passed
// whole to the kernel (as SMEM Refs, first) and to every index map (after the grid indices).
struct GridSpec {
  Grid grid;
  BlockSpecs in_specs;
  BlockSpecs out_specs;
  std::vector<ScratchShape> scratch_shapes;
  int num_scalar_prefetch = 0;
};
inline GridSpec PrefetchScalarGridSpec(int num_scalar_prefetch, Grid grid, BlockSpecs in_specs = {},
                                       BlockSpecs out_specs = {},
                                       std::vector<ScratchShape> scratch = {}) {
  return GridSpec{std::move(grid), std::move(in_specs), std::move(out_specs), std::move(scratch),
                  num_scalar_prefetch};
}

// ---- Compiler params, interpret modes, cost estimates -----------------------------------------
namespace tpu {
// dimension_semantics: "parallel" | "arbitrary" (also "core_parallel", "subcore_parallel").
// Which TPU core runs a pallas_call: the TensorCore, or a SparseCore's scalar or vector
// subcores (SparseCore blocks must be Blocked with a minor dimension that is a multiple of 8).
enum class KernelType { TC, SC_SCALAR_SUBCORE, SC_VECTOR_SUBCORE };
struct CompilerParams {
  static constexpr const char* kBackend = "mosaic_tpu";
  std::vector<std::string> dimension_semantics;
  std::optional<int> collective_id;
  std::optional<int64_t> vmem_limit_bytes;
  bool allow_input_fusion = false;
  KernelType kernel_type = KernelType::TC;
};
// One access involved in a race (see RaceReport).
struct RaceAccess {
  bool is_write = false;
  std::string actor;     // "device 0, core 1" or "DMA 3 (started by device 0, core 1)"
  std::string what;      // "load", "store", "DMA read", "copy-in of input x", ...
  SourceLoc loc;         // the user's line (for machine copies: the pallas_call)
  std::vector<int64_t> clock;  // the actor's vector clock at the access
};
// Two accesses to overlapping elements of one buffer, at least one a write, with neither
// ordered before the other by semaphores, barriers or DMA completion.
struct RaceReport {
  std::string buffer;    // "input x (hbm, device 0)", "scratch 1 (vmem, device 0, core 1)"
  Shape buffer_shape;
  RaceAccess first, second;  // `first` happened earlier in the simulation
  // The overlapping elements, per buffer dimension: [begin, end) (a bounding box of the
  // elements both accesses touch).
  std::vector<std::pair<int64_t, int64_t>> overlap;
  std::string to_string() const;
};

// The TPU interpret mode's parameters (docs/TPU_INTERPRET.md). Invalid values raise errors when
// the call runs.
struct InterpretParams {
  std::string dma_execution_mode = "on_wait";  // "eager" | "on_wait"
  std::optional<uint64_t> random_seed;         // permutes parallel grid dims (none: seed 0)
  bool detect_races = false;
  std::string out_of_bounds_reads = "raise";   // "raise" | "uninitialized"
  std::string uninitialized_memory = "nan";    // "nan" | "zero"
  bool skip_floating_point_ops = false;
  int num_cores_per_device = 1;
  std::optional<int> vector_clock_size;        // validated; the detector's clocks are exact
  std::string buffer_bounds = "logical";       // "logical" | "padded"
  bool allow_hbm_allocation_in_run_scoped = false;
  // Called once per grid point, in each core's execution order (serialised across cores).
  std::function<void(const std::vector<int64_t>& grid_point, int core)> grid_point_recorder;
  // "" or a comma-separated set of "semaphore", "shared_memory", "dma", "barrier": lines go to
  // `log` (default std::cerr) prefixed "Device d, core c: ".
  std::string logging_mode;
  std::ostream* log = nullptr;
  // Where detected races go: appended here when set (cleared when a call starts); otherwise
  // printed to std::cerr.
  std::shared_ptr<std::vector<RaceReport>> races;
  bool races_are_errors = false;               // a detected race ends the call with RaceError
  // A semaphore with a non-zero count when the kernel ends: "error" or "warn" (print).
  std::string nonzero_semaphores_at_exit = "error";
};
}  // namespace tpu
namespace gpu {
// How a gpu::kernel's mesh maps onto the call's grid: the grid axes, then the cluster axes, then
// (when the mesh has one) the thread axis; every point is one Pallas thread (a warpgroup).
struct KernelLayout {
  int num_grid_axes = 0;
  int num_cluster_axes = 0;
  bool has_thread_axis = false;
};
struct CompilerParams {
  static constexpr const char* kBackend = "mosaic_gpu";
  std::vector<std::string> dimension_semantics;
  // A pallas_call's pipeline depth (Mosaic GPU's max_concurrent_steps): how many steps of the
  // innermost sequential axis the ring of an input holds — the block the body reads and the ones
  // being copied ahead — for inputs whose BlockSpec has no Buffered(count) of its own; 1 turns
  // the ring off. Unset: 2. (A gpu::kernel pipelines by hand: an error there.)
  std::optional<int> max_concurrent_steps;
  // Clusters of a pallas_call's CTAs: not supported yet (an error naming it); a gpu::kernel takes
  // clusters in its Mesh (cluster, cluster_names).
  std::optional<std::vector<int64_t>> cluster;
  // Lets the GPU backend compute exp, exp2, log, tanh, sin, cos and rsqrt of floats (f32, and
  // f16 / bf16, computed in f32) with the GPU's approximate instructions (PTX ex2, lg2, tanh,
  // sin, cos, rsqrt .approx: exp2 within 2 ulp; log2 within 2^-22 absolute on (0.5, 2), 2^-22
  // relative elsewhere; tanh about 2^-11 relative; rsqrt 2^-22.9 relative; sin and cos 2^-20.5
  // absolute on [-2 pi, 2 pi], 2^-14.7 on [-100 pi, 100 pi] and nothing promised beyond — large
  // angles (rotary embeddings at far positions) want the exact functions. exp is
  // exp2(x log2 e), whose error grows with |x|, and log is log2(x) ln 2). exp's subnormal
  // results and log's subnormal inputs flush to zero. f64 stays exact, and so do the interpreters, where the flag changes nothing.
  // Logistic, which is computed from exp, follows it. As Mosaic GPU's approx_math.
  bool approx_math = false;
  // The on-device profiler (gpu::named_region, docs/GPU.md "Profiling"): how many region events
  // (an entry or an exit each) every Pallas thread may record per CTA — 0 turns it off — and the
  // directory each call's Chrome/Perfetto trace JSON is written to. Set both or neither.
  int profile_space = 0;
  std::string profile_dir;
};
}  // namespace gpu
namespace triton {
struct CompilerParams {
  static constexpr const char* kBackend = "triton";
  int num_warps = 4;
  int num_stages = 3;
};
}  // namespace triton

using CompilerParams = std::variant<tpu::CompilerParams, gpu::CompilerParams, triton::CompilerParams>;
std::string compiler_params_backend(const CompilerParams& p);
// Keyed by backend name: "mosaic_tpu", "mosaic_gpu" or "triton".
using CompilerParamsMap = std::map<std::string, CompilerParams>;

// How to run: `false` — a compiled backend; `true` — the reference interpreter;
// `tpu::InterpretParams{...}` — the TPU interpret mode (the simulated TPU).
class InterpretMode {
 public:
  InterpretMode() = default;
  InterpretMode(bool enabled) : enabled_(enabled) {}
  InterpretMode(tpu::InterpretParams p) : enabled_(true), tpu_(std::move(p)) {}
  bool enabled() const { return enabled_; }
  const std::optional<tpu::InterpretParams>& tpu() const { return tpu_; }

 private:
  bool enabled_ = false;
  std::optional<tpu::InterpretParams> tpu_;
};

struct CostEstimate {
  int64_t flops = 0;
  int64_t transcendentals = 0;
  int64_t bytes_accessed = 0;
  int64_t remote_bytes_transferred = 0;
  std::string to_json() const;
  bool operator==(const CostEstimate&) const = default;
};

// ---- The call -------------------------------------------------------------------------------------
struct CallOptions {
  Grid grid;
  BlockSpecs in_specs;
  BlockSpecs out_specs;
  std::vector<ScratchShape> scratch_shapes;
  std::optional<GridSpec> grid_spec;  // alternative to the four fields above
  std::map<int, int> input_output_aliases;  // input index -> output index
  std::optional<CompilerParams> compiler_params;
  CompilerParamsMap compiler_params_by_backend;
  InterpretMode interpret;
  std::optional<std::string> backend;  // "reference", "tpu_interpret", "mosaic_tpu", "mosaic_gpu", "triton"
  std::string name;
  std::map<std::string, std::string> metadata;
  std::optional<CostEstimate> cost_estimate;
  std::optional<std::vector<int64_t>> mesh_shape;  // set by core_map-style entry points
  // Set by the SparseCore entry points: "sc_scalar_subcore" or "sc_vector_subcore".
  std::string mesh_kind;
  // Set by gpu::kernel: the call is a GPU kernel on a mesh (pallas/gpu.h).
  std::optional<gpu::KernelLayout> gpu_kernel;
  // The memory space of operands whose BlockSpec names none (default VMEM; core_map: ANY).
  std::optional<MemorySpace> default_memory_space;
  bool debug = false;  // print the traced IR and the grid mapping
  // Run the kernel's debug_check ops: a false predicate raises pallas::Error naming the message,
  // the grid point and the line. When false (the default) every backend ignores them.
  bool debug_checks = false;
  std::ostream* debug_out = nullptr;  // where debug output goes (default std::cout)
};

// The canonical form of one operand's BlockSpec.
struct BlockMapping {
  BlockShape block_shape;
  ShapeDtype array;                // the whole array
  ir::Type block_ref_type;         // what the kernel sees (squeezed dims dropped)
  ir::Kernel index_map;            // params: grid indices, prefetch refs; yields the indices
  std::string origin;              // "args[1]", "outputs[0]"
  std::vector<int64_t> slice_sizes;  // per dim: the ds size of a BoundedSlice dim, else -1
  std::optional<Buffered> pipeline_mode;
  bool index_map_is_default = false;
  void check_invariants() const;
  std::string to_string() const;
};

// The calling convention of a pallas_call. The kernel receives *index, *inputs, *outputs,
// *scratch Refs; index maps receive *grid_indices, *index.
struct GridMapping {
  std::vector<int64_t> grid;       // -1 for a dynamic dimension
  std::vector<std::string> grid_names;
  std::vector<BlockMapping> block_mappings;  // inputs, then outputs
  std::vector<ir::Type> index_map_params;    // i32[] per grid axis, then the prefetch refs
  std::vector<int> vmapped_dims;
  std::vector<ir::Type> scratch_types;
  std::vector<int> scratch_barrier_arrivals;  // per scratch: gpu::Barrier's arrivals, else 0
  std::vector<ScratchUnionSlot> scratch_unions;  // per scratch: its gpu::Union, if any
  // per scratch: a gpu::ClusterBarrier's collective axes (indices into grid), else empty
  std::vector<std::vector<int>> scratch_barrier_collective_axes;
  // per scratch: a pl::get_global buffer, one for the whole grid (the last entries); the declared
  // scratch is one per CTA (per program)
  std::vector<bool> scratch_grid_wide;
  int num_index_operands = 0;
  int num_inputs = 0;
  int num_outputs = 0;
  int num_dynamic_grid_bounds() const;
  void check_invariants() const;
  // A stable text form (used by `pallas ir` and debug output).
  std::string to_string() const;
};

// A traced call: the kernel IR and its grid mapping, for one set of input shapes.
struct TracedCall {
  ir::Kernel kernel;
  GridMapping grid_mapping;
  std::vector<std::pair<int, int>> input_output_aliases;
  std::optional<CostEstimate> cost_estimate;
  std::string name;
  std::string backend;  // which backend runs it
  bool debug_checks = false;  // CallOptions::debug_checks: run the kernel's debug_check ops
  std::optional<gpu::KernelLayout> gpu_kernel;  // CallOptions::gpu_kernel
};

class PallasCallImpl;

// The callable pallas_call returns. Calling it with host Arrays traces (once per distinct input
// shapes/dtypes, then cached) and runs. Arguments: *dynamic_grid_sizes (i32 scalars), *inputs
// (the scalar-prefetch operands first).
class PallasCall {
 public:
  explicit PallasCall(std::shared_ptr<PallasCallImpl> impl) : impl_(std::move(impl)) {}
  std::vector<Array> operator()(const std::vector<Array>& args) const;
  template <class... A>
    requires(std::is_convertible_v<const A&, const Array&> && ...)
  std::vector<Array> operator()(const A&... args) const {
    return (*this)(std::vector<Array>{args...});
  }
  // Traces (or finds in the cache) the call for these argument shapes without running it.
  std::shared_ptr<const TracedCall> trace(const std::vector<ShapeDtype>& args) const;
  int cache_size() const;
  // Internal: the call's state (used by entry points such as pltpu::run_on_mesh).
  const std::shared_ptr<PallasCallImpl>& impl() const { return impl_; }

 private:
  std::shared_ptr<PallasCallImpl> impl_;
};

using KernelFn = std::function<void(std::vector<Ref>&)>;

namespace detail {
template <class F> KernelFn make_kernel_fn(F f) {
  if constexpr (std::is_invocable_v<F&, std::vector<Ref>&>)
    return [f](std::vector<Ref>& refs) mutable { f(refs); };
  else
    return [f](std::vector<Ref>& refs) mutable { dispatch_refs<0>(f, refs); };
}
PallasCall make_pallas_call(KernelFn kernel, std::vector<ShapeDtype> out_shapes, CallOptions opts,
                            const SourceLoc& loc);
}  // namespace detail

// Creates a call of `kernel` (a callable taking one Ref per operand: *index, *inputs,
// *outputs, *scratch) producing arrays of `out_shapes`.
template <class F>
PallasCall pallas_call(F kernel, std::vector<ShapeDtype> out_shapes, CallOptions opts = {},
                       Loc loc = Loc::current()) {
  return detail::make_pallas_call(detail::make_kernel_fn(std::move(kernel)), std::move(out_shapes),
                                  std::move(opts), SourceLoc::from(loc));
}
template <class F>
PallasCall pallas_call(F kernel, ShapeDtype out_shape, CallOptions opts = {},
                       Loc loc = Loc::current()) {
  return pallas_call(std::move(kernel), std::vector<ShapeDtype>{std::move(out_shape)},
                     std::move(opts), loc);
}

// ---- Kernel helpers -------------------------------------------------------------------------------
inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
// ceil-div of traced integers.
Value cdiv(const Operand& a, const Operand& b);
// program_id of a named grid axis.
Value program_id(const std::string& axis_name, Loc loc = Loc::current());
Value num_programs(const std::string& axis_name, Loc loc = Loc::current());
// for (i = lo; i < hi; i += step) body(i)   (pl.loop)
void loop(const Operand& lo, const Operand& hi, const std::function<void(Value)>& body,
          int64_t step = 1, Loc loc = Loc::current());
// A host array used inside a kernel or index map. Scalars become constants; anything else is
// an error telling the user to pass it as an input (as the seed requires).
Value constant(const Array& a, Loc loc = Loc::current());

}  // namespace pallas
