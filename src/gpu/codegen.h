// The GPU backend's code generator: a traced pallas_call (kernel IR + grid mapping) becomes one
// self-contained CUDA C++ translation unit — the device runtime (device_runtime.cpp) followed by
// the kernel — that NVRTC or `nvcc -cubin` compiles with no include path, and that also compiles
// as plain C++ for host emulation (see PALLAS_HOST_EMULATION in the runtime).
//
// The execution model (docs/GPU.md):
//  * Parallel grid axes are spread over CTAs (a grid-stride loop over their points); sequential
//    axes — those that some output's index map ignores (an accumulation axis), or those marked
//    "arbitrary"/"sequential" in gpu::CompilerParams::dimension_semantics — run in order inside
//    the CTA, so scratch buffers and revisited output blocks carry over as in the interpreters.
//  * Every block whose array region lies inside the array is used in place in global memory;
//    a block that may overhang the array (a ragged edge, Element padding, a BoundedSlice) is
//    staged through the CTA's arena: read with the uninitialized value past the end, written
//    back only where it lies inside the array.
//  * Tiles (array values of the kernel) live in a per-CTA arena — shared memory when it fits,
//    else a slice of a global workspace — and each tile op is a loop of the CTA's threads over
//    its elements, thread t owning elements t, t + T, ...; scalars live in registers, computed
//    identically by every thread, so control flow stays uniform across the CTA.
//  * Block indices past the array and dynamic Ref indices past a Ref make the kernel record the
//    failing site; the host turns the record into the interpreters' pallas::Error.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "pallas/pallas_call.h"

namespace pallas::gpu {

// The runtime every generated unit begins with (also useful to inspect: `pallas cuda --runtime`).
const char* device_runtime_source();

// wgmma's operand staging (sm_90a; see the device runtime): each warpgroup copies a 64-row slice
// of a and a slice of up to 128 rows of b, kWgmmaStepK columns each, into shared memory of its own
// in the instruction's layout.
constexpr int64_t kWgmmaStepK = 32;
constexpr int64_t wgmma_stage_bytes() { return (64 + 128) * kWgmmaStepK * 2; }
// What a kernel with a ring keeps before its dynamic shared memory: its static shared memory (8
// bytes a barrier, and the ring's barriers, at most 32), up to the 1024-byte boundary where the
// dynamic part starts when a slot is swizzled (PL_SMEM_ALIGN).
constexpr int64_t static_shared_reserve(int64_t num_barriers) { return (8 * (num_barriers + 32) + 1023) / 1024 * 1024; }
// Without swizzled slots or tiles dynamic shared memory starts on the device runtime's default
// PL_SMEM_ALIGN (128 bytes) after the barriers: ptxas counts that padding in the static size, and
// the dynamic size may be at most the device's limit less the static one.
constexpr int64_t kDefaultSmemAlign = 128;
constexpr int64_t static_shared_bytes(int64_t num_barriers) {
  return (8 * num_barriers + kDefaultSmemAlign - 1) / kDefaultSmemAlign * kDefaultSmemAlign;
}

struct CodegenOptions {
  int threads_per_cta = 256;
  // An arena up to this size lives in dynamic shared memory; a larger one in global memory.
  int64_t max_shared_arena_bytes = 96 * 1024;
  // The shared memory a CTA may use in all (the device's opt-in limit; H100's by default): bounds
  // what is added beside the arena (wgmma's staging).
  int64_t max_shared_bytes = 227 * 1024;
  // gpu::CompilerParams::dimension_semantics: "parallel" axes go to CTAs, "arbitrary" (or
  // "sequential") ones run in order inside each CTA. Empty: inferred (see split in codegen.cpp).
  std::vector<std::string> dimension_semantics;
  // The ring depth of a pipelined input without a Buffered(count) of its own
  // (gpu::CompilerParams::max_concurrent_steps).
  int default_buffer_count = 2;
  // The on-device profiler (gpu::CompilerParams::profile_space / profile_dir; gpu/profiler.h).
  int profile_space = 0;
  std::string profile_dir;
  // gpu::CompilerParams::approx_math: float exp, exp2, log, tanh, sin, cos and rsqrt on the
  // special function unit's approximate instructions (PL_APPROX_MATH in the device runtime).
  bool approx_math = false;
  // A product accumulated in registers across the steps of a pipelined axis (the register
  // accumulator, operands in ring slots) leaves its wgmma running into the next step, which
  // waits for it before the ring refills its slots; a gpu::kernel's wgmma into an ACC in
  // registers runs until the kernel's wgmma_wait. false (or PALLAS_GPU_SYNC_WGMMA=1 in the
  // environment, read by codegen_options): each step, and each wgmma, waits for its own.
  bool async_wgmma = true;
  // The ring's blocks copied by the TMA unit on sm_90 (tensor maps), where they are boxes of their
  // arrays. false (or PALLAS_GPU_NO_TMA=1): by cp.async, as on sm_80.
  bool tma = true;
  // Ring slots that wgmma reads in place take its 128-byte swizzled layouts where their rows
  // allow (64-column panels): a TMA box per panel, reads without bank conflicts; so do a
  // gpu::kernel's SMEM tiles of 128-byte rows that feed wgmma (swizzled_smem_tiles), which wgmma
  // then reads in place. false (or PALLAS_GPU_NO_SWIZZLE=1): the no-swizzle layouts, a TMA box
  // per 8 columns; gpu::kernel tiles row-major, staged for wgmma.
  bool swizzle = true;
  // A gpu::kernel's multicast copies (copy_gmem_to_smem with collective_axes) go as TMA
  // multicast, each peer copying its share for all, where the shares are boxes. false (or
  // PALLAS_GPU_NO_MULTICAST=1): each CTA copies the whole block itself.
  bool multicast = true;
  // A gpu::kernel keeps array values in its warpgroups' registers in wgmma's layout where every use
  // allows (register tiles: an ACC's scores and the softmax on them; emit_fragments.cpp), a
  // pallas_call its blocks' values in the blocked layout (a softmax's rows). false (or
  // PALLAS_GPU_NO_REGISTER_TILES=1): every array value is a tile in the arena (shared memory).
  bool register_tiles = true;
  // The 32-bit registers per thread that register tiles may take at once, as the planner counts
  // them (the tiles live at each op of a region); past it the largest live tile goes to the
  // arena. ptxas has 255: the rest are for ACCs kept across, addresses and temporaries. A
  // gpu::kernel whose arena then outgrows shared memory is generated again without the budget.
  static constexpr int kNoRegisterBudget = 1 << 30;
  int register_tile_budget = 192;
};

// A TMA tensor map the kernel's ring copies through (sm_90; the device runtime's pl_tma_load):
// the array of operand `operand` (an index of PlParams::op), dims innermost first, boxes of
// `box` elements. The host encodes it for each launch (the array's address changes), into the
// parameters after the fixed fields (pack_params).
struct TensorMapSpec {
  int operand = 0;
  int elem_bytes = 0;
  std::vector<uint64_t> dims;     // elements, innermost first
  std::vector<uint64_t> strides;  // bytes, of dims 1.. (rank - 1 entries)
  std::vector<uint32_t> box;      // elements, innermost first
  // 0, or 32, 64, 128: the box lands in shared memory with that swizzle (its rows are that many
  // bytes; the device runtime's pl_swizzle), as a swizzled ring slot or SMEM tile holds it.
  int swizzle_bytes = 0;
  bool operator==(const TensorMapSpec&) const = default;
};

// A run-time check of the generated kernel. When it fails the kernel stores 1 + the site's
// number and the site's values in the error record (see throw_kernel_error): the program ids of
// the failing grid point first, then, for BlockIndex, the block indices and, for RefIndex, the
// index's start. What is known when generating the code stays here.
struct ErrorSite {
  // BarrierWait: a gpu::kernel's barrier wait that did not complete in the wait limit (a deadlock);
  // SemaphoreWait: the same for a semaphore wait. SemaphoreValue: a negative semaphore increment
  // or awaited value (the value follows the program ids).
  // PipelineWait: the ring's TMA copies of a step did not land within the wait limit;
  // SlotAlignment: the swizzled ring slots do not start on a 1024-byte boundary (both faults of
  // the backend, reported as internal errors).
  // ScopeMeeting: not every Pallas thread of the CTA reached a shared run_scoped's entry or exit
  // within the wait limit. BitcastAlignment: a view bitcast to a wider dtype does not start on a
  // multiple of its size (op_name holds the message; a misaligned access would fault the GPU).
  enum class Kind { BlockIndex, RefIndex, DebugCheck, BarrierWait, SemaphoreWait, SemaphoreValue, PipelineWait, SlotAlignment,
                    ScopeMeeting, ClusterIndex, BitcastAlignment };
  Kind kind = Kind::BlockIndex;
  int operand = -1;      // BlockIndex: the block mapping (inputs, then outputs)
  std::string op_name;   // RefIndex, BarrierWait, SemaphoreWait: the op; DebugCheck: the message
  SourceLoc loc;         // all but BlockIndex: the user's line
  // RefIndex: the checked (dynamic) index entry, its dimension and the indexed Ref's shape.
  // ClusterIndex: op_name is the cluster axis, size its size.
  int64_t dim = 0;
  bool is_slice = false;
  int64_t size = 1, stride = 1;
  std::vector<int64_t> ref_shape;
};

struct GeneratedKernel {
  std::string source;       // the translation unit
  std::string entry;        // the __global__ function (extern "C")
  std::string host_entry;   // host emulation: void host_entry(const pl_u64* params, int threads)
  int threads_per_cta = 0;
  // Groups of the CTA's threads, each running the body on its own (a gpu::kernel's Pallas
  // threads); 1 for a pallas_call. The CTA's threads split evenly between them.
  int num_groups = 1;
  int64_t num_barriers = 0;  // mbarriers (gpu::Barrier scratch), in static shared memory
  std::vector<int> parallel_axes, sequential_axes;
  int64_t arena_bytes = 0;  // per CTA
  bool arena_in_shared = false;
  std::vector<ErrorSite> error_sites;
  int num_grid_dims = 0;
  // The grid sizes the source was generated for (constants in it): it runs with these only.
  std::vector<int64_t> grid;
  // Matrix products emitted for the tensor cores (pl_tc_dot; each falls back to a CUDA-core
  // loop at run time only when the group is not whole warps, as host emulation may run it).
  int tensor_core_dots = 0;
  // Of those, the ones that may stage an operand for wgmma (all but a gpu::kernel's products of
  // two swizzled SMEM tiles, which wgmma reads in place): without any, wgmma needs no staging.
  int staged_tensor_core_dots = 0;
  // gpu::kernel copy_smem_to_gmem emitted as bulk copies (cp.async.bulk ... bulk_group on sm_90,
  // where the addresses allow): asynchronous until wait_smem_to_gmem, drained at each CTA's end.
  int bulk_stores = 0;
  // A gpu::kernel's CTAs per cluster (launched as 1-D clusters of this size; 1: no clusters).
  int cluster_ctas = 1;
  // Semaphores of the whole grid (pl::get_global): their counters (i32) at the start of the
  // launch's workspace, zeroed before every launch; the arena (when in global memory) follows at
  // arena_offset(). A kernel with them is co-resident: every CTA of its grid runs at once, one
  // point each (a wait may need any of them) — the launch checks that they fit; host emulation
  // runs them all together. (gpu::Semaphore scratch is the CTA's, in its shared memory.)
  int64_t semaphore_bytes = 0;
  bool co_resident() const { return semaphore_bytes > 0; }
  // gpu::kernel ACC scratch kept in registers (accumulators_in_registers) has its memory — where
  // flushes go, and the products where wgmma does not run — in the workspace at arena_offset(),
  // acc_memory_bytes per launched CTA, not in shared memory (where a Hopper kernel's tiles need
  // the room). (The arena of a gpu::kernel is always in shared memory.)
  int64_t acc_memory_bytes = 0;
  int64_t arena_offset() const { return (semaphore_bytes + 127) / 128 * 128; }
  // The CTAs host emulation runs at once: a cluster, or the whole grid when co-resident.
  int64_t host_ctas = 1;
  // Whether sm_90a runs tensor-core dots on wgmma (PL_HAS_WGMMA): they exist, the CTA is whole
  // warpgroups, and the staging they need fits beside the arena; else sm_90a runs mma.sync too.
  bool uses_wgmma = false;
  // Array values kept in registers (register tiles, emit_fragments.cpp): a gpu::kernel's in wgmma's
  // layout, a pallas_call's in the blocked one. Their layouts assume the CTA's threads_per_cta, so
  // host emulation runs that many.
  int register_tiles = 0;
  // wgmma products whose a is a register tile (the unit defines PL_WGMMA_RS for their instructions).
  int register_a_products = 0;
  // dot results made in registers (a register tile of wgmma's accumulator layout, plan_fragments;
  // pl_tc_dot_fragment where wgmma runs).
  int register_dots = 0;
  // Results of control flow held in registers: a fori_loop's or while_loop's carries, a cond's,
  // switch's or run_scoped's results (plan_loop_carries).
  int register_carries = 0;
  // Register tiles made outside a loop's body, a condition or a branch and read inside it in their
  // registers (captured_offers_ in emitter.h).
  int register_captures = 0;
  // The gpu::kernel's set_max_registers are setmaxnreg (register_reallocation in emitter.h), and
  // the kernel is declared with __launch_bounds__(threads_per_cta, 1).
  bool reallocates_registers = false;
  // Shared memory for wgmma's operand staging (0: none needed or no wgmma). It follows the arena
  // in the dynamic shared memory of launches on sm_90 devices only.
  int64_t wgmma_staging_bytes = 0;
  // The pipeline of the innermost sequential axis (codegen.cpp): the inputs whose blocks are
  // copied ahead into a ring of pipeline_depth shared-memory slots each (none: depth 0), and the
  // ring's bytes. Dynamic shared memory holds the arena (when in shared memory), the ring, then
  // wgmma's staging, each from a 128-byte boundary.
  std::vector<int> pipelined_inputs;
  // Those of them whose block is the same at every step of the axis (their index maps do not
  // read it: attention's q): one slot each, filled with the copies of the axis's first step.
  std::vector<int> resident_inputs;
  // Those of them whose slots hold wgmma's canonical layout on sm_90a, read by the tensor cores
  // where they are (no staging copy); row-major on other targets.
  std::vector<int> tensor_core_slots;
  // The scratch buffer (its index) whose `+= dot` accumulator stays in registers across the grid
  // steps where wgmma runs (-1: none).
  int register_accumulator = -1;
  // A gpu::kernel's ACC scratch buffers (their indices) that wgmma accumulates into in registers
  // where it runs (register_accumulators in emitter.h).
  std::vector<int> accumulators_in_registers;
  int pipeline_depth = 0;
  // Slots per pipelined input: pipeline_depth, or one more when the ring may feed wgmma left
  // running into the next step (the slots of the step before stay untouched one step longer).
  int pipeline_slots = 0;
  // The pipelined inputs copied by the TMA unit where it can (each a box per slot; a slot in a
  // canonical layout a box per 8 columns, or per 64 when swizzled), their maps in this order
  // (PlParams::tmap).
  std::vector<int> tma_inputs;
  std::vector<TensorMapSpec> tensor_maps;
  int64_t pipeline_slot_bytes = 0;
  // The ring starts on a 1024-byte boundary (a swizzled slot's pattern repeats every 1024 bytes;
  // dynamic shared memory starts on one when PL_SMEM_ALIGN says so), and each input's slots are
  // whole 1024 bytes.
  static constexpr int64_t kSlotAlign = 1024;
  int64_t slots_offset() const { return arena_in_shared ? (arena_bytes + kSlotAlign - 1) / kSlotAlign * kSlotAlign : 0; }
  int64_t wgmma_staging_offset() const { return slots_offset() + (pipeline_slot_bytes + 127) / 128 * 128; }
  // The dynamic shared memory a launch asks for (`wgmma`: on a device that runs the sm_90a code).
  int64_t dynamic_shared_bytes(bool wgmma) const {
    if (wgmma && wgmma_staging_bytes > 0) return wgmma_staging_offset() + wgmma_staging_bytes;
    if (pipeline_slot_bytes > 0) return slots_offset() + pipeline_slot_bytes;
    return arena_in_shared ? arena_bytes : 0;
  }
  // Profiling: events per Pallas thread and parallel point (0: off), the named regions (an
  // event's region number indexes them) and where the trace goes.
  int profile_space = 0;
  std::vector<std::string> region_names;
  std::string profile_dir;
};

// Writes the 16 words of `spec`'s tensor map for the array at `address` into `map` (64-byte
// aligned); false when it cannot (the address is not 16-byte aligned, the device has no TMA):
// the kernel then copies that input by cp.async.
using TensorMapEncoder = std::function<bool(const TensorMapSpec& spec, uint64_t address, uint64_t* map)>;

// `encode` behind a cache of the maps it made, keyed by what determines a map (the element size,
// dims, strides and box, and the address): launches over the same arrays encode nothing again
// (the driver's encoding is host time in every launch). A refusal is remembered too. Thread-safe.
TensorMapEncoder cached_tensor_map_encoder(TensorMapEncoder encode);

// The kernel's parameter block (its PlParams struct: one 8-byte word per field, arrays padded to
// one entry at least): operands (prefetch, inputs, outputs), workspace, error record, profile
// buffer (0 when not profiling), grid sizes, number of parallel points; with tensor maps, then a
// word of their "encoded" bits, and the maps from the next 64-byte boundary, 16 words each,
// written by `encode` (none when it is empty: every input takes cp.async).
std::vector<uint64_t> pack_params(const GeneratedKernel& k, const std::vector<uint64_t>& operand_ptrs,
                                  uint64_t workspace, uint64_t error_record, uint64_t profile,
                                  const std::vector<int64_t>& grid, const TensorMapEncoder& encode = {});
// The points of the kernel's parallel axes (one per CTA iteration).
int64_t parallel_points(const GeneratedKernel& k, const std::vector<int64_t>& grid);
// How many CTAs a launch of `points` parallel points runs, on a GPU of `multiprocessors` SMs that
// hold `resident_per_sm` CTAs of the kernel each: a grid-stride loop over the points by as many
// CTAs as fit (at most 4 per SM when the arena is in global memory, which it then bounds), a
// whole number of clusters. A co-resident kernel (pl::get_global) runs one CTA per point, and
// when they cannot all be resident at once — a semaphore wait could wait for a CTA that never
// starts — that is a pallas::Error at the kernel's line saying how many fit. With clusters,
// `max_active_clusters` (cuOccupancyMaxActiveClusters: a cluster's CTAs must share a GPC, so fewer
// may fit than SMs x per SM) bounds them further; 0 when unknown.
int64_t launch_ctas(const TracedCall& call, const GeneratedKernel& k, int64_t points, int64_t multiprocessors,
                    int64_t resident_per_sm, int64_t max_active_clusters = 0);

// The options a call's compiler params ask for (gpu::CompilerParams under "mosaic_gpu").
CodegenOptions codegen_options(const CompilerParamsMap& params);

// A gpu::kernel's Pallas thread is a warpgroup on the GPU, as in Mosaic GPU.
inline constexpr int kWarpgroupThreads = 128;

// Words of the error record the kernel writes (err[0] = 1 + site, err[1..] = values).
inline constexpr int kErrorRecordWords = 32;
// The record's last word: the device address of the host's "a launch failed" flag (driver.cpp),
// which pl_fail sets; never a value (pl_fail writes at most 30, after word 0).
inline constexpr int kErrorFlagWord = kErrorRecordWords - 1;

// Generates the CUDA C++ of `call` for grid sizes `grid` (dynamic dims resolved: the sizes are
// passed at launch, the axis split is decided from the mapping). Throws NotSupportedError naming
// the op or feature for what has no GPU lowering yet (TPU DMAs and semaphores, ...).
GeneratedKernel generate_cuda(const TracedCall& call, const std::vector<int64_t>& grid,
                              const CodegenOptions& opts = {});

// Raises the pallas::Error the interpreters raise for the failure a kernel recorded in `err`.
[[noreturn]] void throw_kernel_error(const TracedCall& call, const GeneratedKernel& k,
                                     const int64_t* err);
// The same error as an exception_ptr, to raise later (asynchronous calls on device arrays).
std::exception_ptr kernel_error(const TracedCall& call, const GeneratedKernel& k, const int64_t* err);

// Whether the emitter has a lowering for the op (the op-table test walks every op).
bool cuda_emitter_supports(ir::OpCode code);

}  // namespace pallas::gpu
