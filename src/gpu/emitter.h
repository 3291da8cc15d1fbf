// Internals of the CUDA code generator: the emitter of one traced function (the kernel body, or
// an index map) into C++ statements of the generated unit. codegen.cpp drives it (grid, blocks,
// staging, entry points); emit_ops.cpp holds the per-op rules for pure ops (elementwise, shape,
// reductions, scans, sort, dot), emitter.cpp the rest (refs, control flow, synchronisation,
// the arena).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gpu/codegen.h"
#include "pallas/ir/ir.h"

namespace pallas::gpu::detail {

std::string ctype(DType t);     // storage type: "float", "pl_bf16", "pl_i32", "bool", ...
std::string ccompute(DType t);  // compute type: "float" for f16 / bf16, else ctype
bool is_half(DType t);
// A literal of the storage type (bit-exact for floats: NaN payloads, -0, inf).
std::string literal(const Scalar& s, DType t);
// `e` (an expression of storage type t) as its compute type, and back.
std::string widen(DType t, const std::string& e);
std::string narrow(DType t, const std::string& compute_expr);
// atomic_rmw's new value of an element of dtype t from its current value `c` and the operand `x`
// (the interpreters' rules) for `kind` ("cas": `y` when c's bytes are x's); "" where there is none.
std::string atomic_new_value(DType t, const std::string& kind);
// Row-major multi-index expressions of flat index `flat` over `shape`.
std::vector<std::string> index_exprs(const Shape& shape, const std::string& flat);
// sum(idx[d] * strides[d]), skipping zero terms.
std::string sum_of(const std::vector<std::string>& idx, const std::vector<int64_t>& strides);
// The memory offset of row-major flat index `flat` of `shape` laid out with `strides`.
std::string offset_of(const Shape& shape, const std::vector<int64_t>& strides,
                      const std::string& flat);
std::vector<int64_t> contiguous_strides(const Shape& s);
// Whether an index entry takes all of a dim of `size` (the static slice 0:size:1).
bool whole_dim(const ir::IndexEntry& e, int64_t size);
// Whether every entry of `idx` takes all of its dim of `shape` (a view, load or store of all of it).
bool whole_view(const ir::Indexer& idx, const Shape& shape);
// The TMA tensor map of boxes `box` (elements per dim, in the array's dim order) of operand
// `operand`'s row-major array, or nullopt past TMA's limits: rank 1 to 5, 1 to 256 elements a box
// dim, 2^32 a dim, rows of the box and of the array whole 16-byte chunks (the map's strides).
// `swizzle_bytes` 32, 64 or 128: the boxes land swizzled so, so their rows must be that many bytes.
std::optional<TensorMapSpec> tensor_map_for_boxes(int operand, DType dtype, const Shape& array,
                                                  const std::vector<int64_t>& box, int swizzle_bytes = 0);
std::string uninitialized_literal(DType t);     // what the interpreters fill fresh buffers with
// Entry `index` (an expression) of a table of constants by cluster rank, as an expression:
// "(r == 0 ? 5u : r == 1 ? 10u : 5u)", or the entry when all are equal — not an array indexed at
// run time, which would live on the stack (local memory).
std::string table_entry(const std::vector<int64_t>& table, const char* suffix, const std::string& index);
// The gpu::kernel SMEM scratch buffers (of `candidates`: 2-byte elements, whole tiles of rows of
// 128, 64 or 32 bytes, 8 rows at a time) that can be kept swizzled so that wgmma reads them where
// they are (emit_gpu_ops.cpp): each feeds a wgmma, and is otherwise only loaded and stored
// (through any view) and copied to or from GMEM; wgmma and the copies get views where the
// pattern repeats (whole rows from a row that is a multiple of 8; every row of several panels).
std::set<ir::ValueId> swizzled_smem_tiles(const ir::Kernel& k, const std::set<ir::ValueId>& candidates);
// An f32 accumulator matrix kept in registers: a PlAccRegs variable `var` of `rounds` wgmma blocks
// NC columns wide holding an M x N matrix — each Pallas thread's matrix of a gpu::kernel ACC, or
// a pallas_call's register accumulator (Emitter::RegisterAccumulator).
struct AccumulatorRegisters {
  std::string var;
  int64_t m = 0, n = 0;
  int nc = 0, rounds = 0;
  // The statement that writes the registers (where newer) into the matrix at `ptr`, rows `ld`
  // elements apart.
  std::string flush(const std::string& ptr, int64_t ld) const {
    return "pl_acc_flush(" + var + ", " + ptr + ", " + std::to_string(ld) + ", " + std::to_string(m) + ", " +
           std::to_string(n) + ");";
  }
};
// The gpu::kernel ACC scratch buffers (of `candidates`: f32, not in a Union) whose wgmma
// accumulate in registers, as on Mosaic GPU (emit_gpu_ops.cpp): each Pallas thread touches only
// its own matrix of one — the whole buffer when the CTA has one Pallas thread (`num_groups`), else
// `acc.at(axis_index(thread_axis) [+- a constant])` of a (threads, M, N) buffer — and only by wgmma (as the
// accumulator of a bf16 / f16 product of wgmma's shapes), loads and stores. Their `var` is empty.
// Their instruction width `nc` may be 256 where every product reads both operands in place (views
// of `swizzled_tiles`), else at most 128.
std::map<ir::ValueId, AccumulatorRegisters> register_accumulators(const ir::Kernel& k,
                                                               const std::set<ir::ValueId>& candidates,
                                                               const std::string& thread_axis, int num_groups,
                                                               const std::set<ir::ValueId>& swizzled_tiles);
// Whether a gpu::kernel's set_max_registers become setmaxnreg (emit_gpu_ops.cpp).
// setmaxnreg.inc waits until the CTA has room, forever where it never will: so it is emitted
// only where every warpgroup's request follows from its thread index (branches on axis_index and
// constants, no loop), at most one per warpgroup, and they fit (eval::setmaxnreg_overflow) — an
// error where all could be followed and do not fit (a GPU would hang), a hint that is not emitted
// where they cannot be followed (`not_emitted` says why).
struct RegisterReallocation {
  bool emit = false;
  std::string not_emitted;
};
RegisterReallocation register_reallocation(const ir::Kernel& k, const std::string& thread_axis, int num_groups);

// A matrix product d (+)= a . b for the runtime's pl_mma_dot (mma.sync tensor cores): row-major
// operands given by pointer expressions and row strides in elements; b is k x n, or n x k when
// b_nk (a transposed view).
struct MmaProduct {
  std::string d, a, b;
  // The operands' layouts, a template argument of pl_tc_dot each: "0" (row-major with the
  // strides below) or a ring slot's PL_SLOT_LAYOUT_j (Emitter::slot_layout).
  std::string a_layout = "0", b_layout = "0";
  // d is the register accumulator's scratch (Emitter::RegisterAccumulator, or a gpu::kernel's
  // ACC in registers): pl_tc_dot_acc adds to the registers, `rounds` of them, in the PlAccRegs
  // variable acc_var, leaving acc_pending groups of wgmma running (empty: the ring's default).
  int acc_rounds = 0, acc_nc = 0;  // (acc_nc: the registers' instruction width, register_accumulators')
  std::string acc_var = "pl_acc", acc_pending;
  int64_t ldd = 0, lda = 0, ldb = 0;
  bool b_nk = false;
  DType d_dtype = DType::F32, a_dtype = DType::F32, b_dtype = DType::F32;
  int64_t m = 0, n = 0, k = 0;
  bool accumulate = false;
};

// Per-CTA memory for tiles and scratch: first-fit over freed ranges. A freed range becomes
// reusable only after a barrier every thread has passed since its last access, so no thread
// overwrites a tile another is still reading: the next barrier outside control flow
// (on_barrier), or where that is known otherwise, sooner (release_synced, settle_pending_since,
// and the branches of begin_alternatives, one of which runs).
class Arena {
 public:
  int64_t alloc(int64_t bytes, int64_t align = 16);  // align: a power of 2, at least 16
  void release(int64_t offset, int64_t bytes);  // pending until on_barrier()
  void on_barrier();
  // Reusable at once: a range that a branch (Emitter::emit_other_path, whose barriers free
  // nothing) allocated and has synced after its last access — on the other paths it was never
  // touched.
  void release_synced(int64_t offset, int64_t bytes);
  // Ranges released (pending) since pending_mark() returned `mark` become reusable at once: a loop
  // body's, at the end of the loop — each iteration ends at a barrier after its last access, and
  // a loop of no iterations never touched them (Emitter::close_loop_body).
  size_t pending_mark() const { return pending_.size(); }
  void settle_pending_since(size_t mark);
  int64_t peak() const { return peak_; }

  struct Range { int64_t offset, bytes; };
  // A Cond's or Switch's branches: one of them runs, so each may take the ranges the ones before
  // it took. begin_alternatives before the first branch, next_alternative before each other one,
  // end_alternatives after the last. Where the branches so far gave back all they took, the next
  // starts from the arena as it was before the first (else it goes on from where it is); past the
  // branches, every range one of them took and gave back is pending (reusable after a barrier:
  // whichever branch ran may have touched it since the last one).
  struct Alternatives {
    std::vector<Range> free, pending;
    int64_t top = 0;
    size_t log = 0;  // (its index in logs_: what the branches allocated)
  };
  Alternatives begin_alternatives();
  void next_alternative(const Alternatives& a);
  void end_alternatives(const Alternatives& a);

 private:
  void merge_free();  // (sorted, neighbours joined, the top given back)
  int64_t take(int64_t bytes, int64_t align);  // (alloc without the log)
  // Whether every byte of the ranges is free or pending (none held by a tile).
  bool all_given_back(const std::vector<Range>& ranges) const;
  std::vector<Range> free_, pending_;
  int64_t top_ = 0, peak_ = 0;
  std::vector<std::vector<Range>> logs_;  // what was allocated in each open begin_alternatives
};

// A Ref as the emitter knows it: a pointer variable and a static layout.
struct RefInfo {
  std::string ptr;  // a T* expression
  DType dtype = DType::F32;
  Shape shape;
  std::vector<int64_t> strides;  // in elements
  // Pipelined input j's ring slot (the whole block; -1: other memory). Its layout is decided
  // after the body is emitted (Emitter::slot_layout): the code names it PL_SLOT_LAYOUT_j.
  int slot_input = -1;
  // The operand array this Ref views (an index of PlParams::op; -1: other memory) and the array's
  // shape: a copy of a box of it may go through a TMA tensor map (emit_gpu_ops.cpp).
  int operand = -1;
  Shape operand_shape;
  // A gpu::kernel SMEM tile kept swizzled where wgmma runs (swizzled_smem_tiles): the macro
  // saying by how many bytes (PL_SMEM_SWIZZLED_s: its rows' 128, 64 or 32; 0: row-major); empty
  // for other memory. Element e of the tile (row-major from its start, a 1024-byte boundary) is
  // at pl_smem_elem<PL_SMEM_SWIZZLED_s, T>(e) — or, where its rows are wider than 128 bytes
  // (several panels, each all the rows of its columns), at pl_smem_elem<PL_SMEM_SWIZZLED_s, T,
  // panel_cols, panel_rows>(e), panel_rows x panel_cols its matrices (the last two dims).
  // `tile` is the tile's start and `tile_offset` the view's first element in it (empty: 0), so
  // element access (elem) works for any view. The ops that address the view by its start (TMA
  // boxes, wgmma's descriptors) get only views where the pattern repeats — whole rows from a
  // multiple of 8 of them, every row of a multi-panel tile (swizzled_smem_tiles) — from which
  // pl_smem_elem of the offset from ptr is the element's place too.
  std::string swizzled;
  int64_t panel_rows = 0, panel_cols = 0;  // (several panels only)
  std::string tile, tile_offset;
  // The element at row-major index `flat` of the view, and the one `offset` elements from ptr
  // (strides counted): lvalue expressions.
  std::string elem(const std::string& flat) const;
  std::string at_offset(const std::string& offset) const;
};

// A register tile's layout (Mosaic GPU's WGMMA layout): an m x n array spread over the
// registers of the Pallas thread's warpgroups as wgmma's accumulator is — blocks of 64 rows x nc
// columns, block b taken by warpgroup b % warpgroups in round b / warpgroups, and in a block
// thread (warp w, lane l) holding rows 16 w + l / 4 and + 8, columns 2 (l % 4) + 8 j and + 1
// (register i of the round at pl_wgmma_acc_base + pl_wgmma_acc_off(i)). So a row's elements lie
// with the four lanes of a quad, and an ACC's registers are such a tile.
// `rows`: a column of m values, one per row (an (m) or (m, 1) array; Mosaic GPU's WGMMA_ROW
// layout), as a reduction of such a tile's rows leaves it: each thread holds the values of its
// rows, 16 w + l / 4 and + 8 of each 64-row band it takes (band warpgroup + warpgroups x round,
// register 2 round + h), the same in the quad's four lanes. n is 1 and nc 0.
// `warps` > 0: the blocked layout instead (Triton's blocked layout; a pallas_call's register
// tiles, whose CTAs are eight warps of one program). A row's columns lie with T `lanes_per_row`
// lanes of P `warps_per_row` warps; a warp holds L = 32 / T rows of a band of B = R L rows, with
// R = warps / P row warps. Element (r, c) of the m x n array lies with warp
// ((r % B) / L) P + (c / T) % P, lane ((r % L) T + c % T), in register (r / B) x (n / T P) +
// c / T P — a warp's loads and stores are runs of T consecutive words. T is the largest power of
// two up to 32 dividing n (a (16, 48) block's: 16); P is 1 unless the rows are fewer than a band
// (a (1, n) block spreads its row over all the warps) — and with T < 32 it is always 1 (were (T, P)
// a fit, so would (2T, P / 2), which blocked_layout tries first). Its rows (an (m) or (m, 1) array): register r / B of the T lanes of row r in each
// of its P warps. Its columns (`cols`: an (n) or (1, n) array, m 1): register c / T P of the L
// lanes of column c in each of its R warps. nc, rounds and warpgroups are unused.
struct FragmentLayout {
  int64_t m = 0, n = 0;
  int nc = 0, rounds = 0, warpgroups = 1;
  bool rows = false;
  int warps = 0;          // > 0: the blocked layout over this many warps
  int warps_per_row = 1;  // blocked: P, the warps a row's columns spread over
  int lanes_per_row = 32;  // blocked: T, the lanes of a warp a row's columns spread over
  bool cols = false;
  bool blocked() const { return warps > 0; }
  int row_warps() const { return warps / warps_per_row; }  // blocked: R
  int lane_rows() const { return 32 / lanes_per_row; }     // blocked: L, the rows of a warp
  int64_t band_rows() const { return int64_t{row_warps()} * lane_rows(); }  // blocked: B
  int64_t registers_per_row() const { return n / (int64_t{lanes_per_row} * warps_per_row); }  // blocked: of a band
  int registers() const {  // per thread
    if (blocked()) return static_cast<int>(rows ? m / band_rows() : cols ? registers_per_row() : m / band_rows() * registers_per_row());
    return rows ? 2 * rounds : rounds * nc / 2;
  }
  int64_t blocks_n() const { return n / nc; }
  int64_t blocks() const { return m / 64 * blocks_n(); }
  bool operator==(const FragmentLayout&) const = default;
};
// The rows layout of tile t's rows, where a thread's registers of a row band hold whole rows of it
// (one warpgroup, or a block per band); nullopt elsewhere.
std::optional<FragmentLayout> rows_of(const FragmentLayout& t);
// The columns layout of a blocked tile t (each lane's registers of its columns); nullopt elsewhere.
std::optional<FragmentLayout> cols_of(const FragmentLayout& t);
// Whether a register tile of shape `s` can have layout l.
bool fits_layout(const FragmentLayout& l, const Shape& s);

// An SSA value: a scalar register, a tile in the arena, a Ref, a register tile (an array in the
// group's registers, FragmentLayout), or a fused array value — one that has no storage of its
// own: its single user computes each element where it needs it (Emitter::plan_fusion).
struct ValueInfo {
  enum class Kind { None, Scalar, Tile, Ref, Fused, Fragment } kind = Kind::None;
  std::string name;         // scalar: the variable; tile: the T* variable
  int64_t offset = -1;      // tile: arena offset (owned when owns_slot)
  int64_t bytes = 0;
  bool owns_slot = false;
  RefInfo ref;              // a Ref; a fused load: the view it reads
  const ir::Op* producer = nullptr;  // fused: the elementwise op or load computing an element
  FragmentLayout frag;      // a register tile: its layout (name: the thread's register array)
};

// Makes `ref` (a whole SMEM tile at ref.ptr) the swizzled tile that the macro `macro` describes
// (swizzled_smem_tiles; rows wider than 128 bytes are panels); returns the macro's #define: the
// rows' bytes, at most 128, where wgmma runs, else 0 (row-major).
std::string make_swizzled(RefInfo& ref, const std::string& macro);
// The swizzle macro of a run_scoped SMEM array (value v of the scope's region).
std::string scoped_swizzle_macro(ir::ValueId v);
// Records a run-time check of `op` (a wait that gave up, a bad value, a misplaced swizzled array)
// and returns its number.
int add_op_site(std::vector<ErrorSite>& sites, ErrorSite::Kind kind, const ir::Op& op);

// Where a run_scoped's buffers live when the scope has barriers or is shared by the CTA's Pallas
// threads (collective over the thread axis; with one Pallas thread per CTA every scope with
// barriers is): laid out before the body is emitted (codegen.cpp), the CTA's for the whole call.
struct ScopedLayout {
  bool shared = false;  // one instance for the CTA (else one per Pallas thread)
  // Per allocation: a shared array's offset in the CTA's arena (-1: the thread's own, from its
  // tile arena as plain scopes have); a barrier's first index in pl_mbar (a thread's own: its
  // group's copy follows at + group x count).
  std::vector<int64_t> where;
  std::vector<int64_t> arrivals;  // per allocation (0: not a barrier)
  std::vector<std::string> swizzled;  // per allocation: the swizzle macro of a shared array ("": none)
  // Shared by several Pallas threads: the mbarrier (index in pl_mbar) where they meet at the
  // entry and at the exit, one arrival each, waited for with the wait limit (-1: none).
  int64_t meeting = -1;
};

struct EmitContext {
  std::ostringstream* out = nullptr;
  Arena* arena = nullptr;
  std::vector<ErrorSite>* error_sites = nullptr;
  std::string params = "p";      // the PlParams expression
  std::string arena_base = "arena";
  std::string grid_ids = "g";    // pl_i64 g[] of program ids
  std::string grid_sizes = "G";  // pl_i64 G[] of grid sizes
  std::string fail_return = "return;";  // what a failed check does after recording
  bool debug_checks = false;  // emit debug_check ops (TracedCall::debug_checks); else skip them
  int num_grid_dims = 0;      // entries of grid_ids (recorded by a failed debug_check)
  std::vector<std::string> grid_names;  // axis_index(name) of a named grid axis reads its program id
  std::string barriers;  // the pl_u64 array of the kernel's mbarriers (gpu::Barrier scratch)
  std::string phases;    // the pl_u32 bits of the phase parities this thread awaits next
  // Some barrier is a gpu::ClusterBarrier of a multi-CTA cluster: barrier_arrive goes to the
  // peers pl_mbar_peers(index) names.
  bool cluster_barriers = false;
  // A gpu::kernel's cluster, for multicast copies: its sizes along the cluster axes (a CTA's rank
  // in it is its row-major index there, %cluster_ctarank) and the first cluster axis among the
  // mesh's axes (multicast copies name theirs so). Empty: one CTA, or no TMA multicast
  // (CodegenOptions::multicast).
  std::vector<int64_t> cluster_dims;
  int first_cluster_axis = 0;  // (set for every gpu::kernel)
  // The cluster's sizes whether or not multicast copies use them (gpu::cluster_ref's peer ranks).
  std::vector<int64_t> cluster_shape;
  // Profiling (gpu::CompilerParams::profile_space): the names of the kernel's named regions, a
  // region's number is its index (the emitter adds names as it meets them). nullptr: not
  // profiling, named regions emit nothing.
  std::vector<std::string>* region_names = nullptr;
  std::string profile_slot = "pl_prof";  // the pl_u64* slot of this Pallas thread and point
  // Counts the products emitted for the tensor cores (GeneratedKernel::tensor_core_dots).
  int* tensor_core_dots = nullptr;
  int* staged_tensor_core_dots = nullptr;  // (GeneratedKernel::staged_tensor_core_dots)
  // Counts the copy_smem_to_gmem emitted as bulk copies (GeneratedKernel::bulk_stores).
  int* bulk_stores = nullptr;
  // The kernel's TMA tensor maps (GeneratedKernel::tensor_maps): a copy of a box of an operand
  // adds the map it needs (nullptr: no TMA).
  std::vector<TensorMapSpec>* tensor_maps = nullptr;
  int group_threads = 0;  // pl_nthreads() of the generated unit (0: unknown)
  int num_groups = 1;     // Pallas threads per CTA (GeneratedKernel::num_groups)
  const std::map<const ir::Op*, ScopedLayout>* scoped_layouts = nullptr;  // (ScopedLayout)
  // A Pallas thread's own run_scoped SMEM arrays kept swizzled where wgmma runs: allocated from
  // its tile arena on a 1024-byte boundary, named by PL_SMEM_SWIZZLED_V<value> (own_scoped_array).
  const std::set<ir::ValueId>* swizzled_own_scoped = nullptr;
  RegisterReallocation registers;  // (set_max_registers)
  // Arrays may live in registers in wgmma's layout (plan_fragments; CodegenOptions::register_tiles):
  // a gpu::kernel whose Pallas threads are whole warpgroups. Counts them (GeneratedKernel::register_tiles).
  bool register_tiles = false;
  // And in the blocked layout (FragmentLayout::warps): a pallas_call's whole loads of blocks and
  // the elementwise ops and row reductions on them.
  bool blocked_tiles = false;
  int register_tile_budget = 192;  // (CodegenOptions::register_tile_budget)
  int* register_tile_count = nullptr;
  int* register_a_products = nullptr;  // wgmma taking a from registers (GeneratedKernel::register_a_products)
  int* register_dots = nullptr;  // dot results made in registers (GeneratedKernel::register_dots)
  int* register_carries = nullptr;  // control-flow results in registers (GeneratedKernel::register_carries)
  int* register_captures = nullptr;  // register tiles read inside control flow (GeneratedKernel::register_captures)
};

class Emitter {
 public:
  Emitter(const ir::Kernel& k, EmitContext ctx, int indent);
  // Binds a parameter of the function to a Ref or a scalar expression.
  void bind_ref(ir::ValueId v, RefInfo r);
  // Ref v is memory that no ref of another group overlaps: an operand's whole block (pallas_call's
  // in-place or staged blocks; group >= 0) or a scratch buffer that is not a Union member (group
  // < 0). Lets a load of it fuse into a store to another group's ref, and a dot accumulate into
  // it in place (plan_fusion). Refs never declared (Union members; views made inside the
  // kernel) may overlap anything.
  void set_memory_group(ir::ValueId v, int group) { memory_group_[v] = group; }
  void bind_scalar(ir::ValueId v, const std::string& expr);
  // The layout pipelined input j's slot may take (pl_slot_elem; 0: row-major) after the body is
  // emitted: wgmma's canonical K-major (1) or MN-major (2) one when every access the body makes
  // to the slot is as that operand of a tensor-core product (the whole block, viewed in place).
  int slot_layout(int j) const;
  // `acc[...] += dot(a, b)` into a whole f32 scratch buffer on wgmma, at the top of the body: the
  // accumulator may live in registers across the grid steps (pl_tc_dot_acc; the generated
  // pl_grid_point takes `PlAccRegs<nc, rounds>& pl_acc`). Every other access to the scratch
  // flushes the registers to it first (pl_acc_flush, emitted by view()).
  struct RegisterAccumulator {
    ir::ValueId ref = -1;  // the scratch Ref (-1: none)
    std::string ptr;       // its pointer in the body
    AccumulatorRegisters regs;  // the registers: the variable pl_acc, a row-major m x n matrix
    // The statement writing the registers back to the scratch at `scratch` (a float*), if newer.
    std::string flush(const std::string& scratch) const { return regs.flush(scratch, regs.n); }
  };
  // Chooses it among `scratch` (f32 2-D scratch Refs, bound with their memory groups), before
  // the body `body` is emitted; returns it (ref -1: none qualifies).
  RegisterAccumulator choose_register_accumulator(const ir::Region& body, const std::set<ir::ValueId>& scratch);
  // Whether `store`'s value reads its own Ref's registers in place (a fused load of it in
  // register_updates_: `acc[...] = acc[...] * alpha + p v` of an ACC or the register accumulator).
  bool updates_registers(const ir::Op& store) const;
  // Binds a gpu::kernel ACC scratch Ref kept in registers (register_accumulators); its views
  // follow it. Every access but a wgmma into it or a fill of it first flushes the registers.
  void bind_kernel_accumulator(ir::ValueId ref, const AccumulatorRegisters& a) { kernel_accs_[ref] = a; }
  // Whether the tensor cores can compute such a product (dtypes and shape).
  static bool tensor_core_shape(const MmaProduct& p);  // emit_ops.cpp
  // Whether wgmma can compute it (a tensor-core shape with m % 64 == 0).
  static bool wgmma_shape(const MmaProduct& p);  // emit_ops.cpp
  // wgmma's instruction width for a product with n columns: the widest of 128, 64, ... 8 dividing n
  // — or 256 where both operands are read in place (the staging holds at most 128 columns of b).
  static int64_t wgmma_width(int64_t n, bool in_place = false);  // emit_ops.cpp
  // Emits the ops of `r` (not its yield); returns the yielded values.
  std::vector<ir::ValueId> emit_region(const ir::Region& r);
  // A scalar op (or a ref view) that reads and writes no memory; a copy that may go by TMA or bulk.
  bool touches_no_memory(const ir::Op& op) const;
  static bool is_bulk_copy(const ir::Op& op);
  const ValueInfo& info(ir::ValueId v) const { return values_.at(static_cast<size_t>(v)); }
  // A barrier when writes (or reads, for a following write) may be pending.
  void barrier();
  // The caller of the code being emitted has just synced the group, and nothing since has
  // accessed memory: a barrier() now emits nothing.
  void assume_synced() { just_synced_ = true; }
  void line(const std::string& s);
  // The statement a failed check runs: it records, for throw_kernel_error, error site `site`
  // with the grid point's program ids followed by `values`, then leaves (ctx.fail_return).
  std::string record_failure(int site, const std::vector<std::string>& values) const;

  // ---- used by the per-op rules (emit_ops.cpp)
  const ir::Type& type(ir::ValueId v) const { return k_.type(v); }
  std::string fresh(const std::string& prefix);
  // Declares a tile result (arena slot) or a scalar result; returns its name.
  std::string define_tile(ir::ValueId v);
  // A tile of v's type in the arena, declared as `name` (a pointer; `comment` ends its line): not
  // bound to v (define_tile binds it; a register tile's copy is kept beside, emit_mirror).
  ValueInfo arena_tile(ir::ValueId v, const std::string& name, const std::string& comment = "");
  std::string define_scalar(ir::ValueId v, const std::string& expr);
  // Element `flat` of a value (a scalar's name, tile[flat], or a fused value's expression).
  std::string at(ir::ValueId v, const std::string& flat) const;
  // Whether `op` computes each result element from its operands' elements at the same flat
  // index, as one expression (emit_pure's elementwise rule; elementwise_expr): the elementwise
  // ops, and reshape / squeeze / expand_dims into a tile (row-major either side: the same flat
  // index, so the thread that wrote an element reads it).
  bool is_elementwise(const ir::Op& op) const;
  // The expression of element `e` of such an op's result, of its storage type.
  std::string elementwise_expr(const ir::Op& op, const std::string& e) const;
  // Opens / closes `for (pl_i64 e = tid; e < n; e += nthreads)` over a result's elements.
  void open_thread_loop(int64_t n, const std::string& var = "e");
  // `header {` ... `} else {` ... (close_loop): two branches that every thread of the CTA takes
  // alike, each starting right after a barrier the caller emitted before the header.
  void open_block(const std::string& header);
  void else_block();
  // `target(e) = value(e)` (only where `cond(e)`, when given) for this thread's elements e of
  // [0, n), kStoreBatch at a time: first every value and condition of the batch into registers,
  // then every write. Written as one loop, the compiler must assume each write may change what
  // the next element reads (the pointers may alias), so each thread had one load in flight;
  // batched, it has a batch's (a copy on an H100: 76% -> 91% of cuMemcpyDtoD; PERFORMANCE.md).
  static constexpr int kStoreBatch = 4;
  // Only for writes that no value of the batch reads back: a store's value reads other memory or
  // the very element it replaces (plan_fusion's rules), staging copies between distinct memory.
  // `prelude` emits lines that value, cond and target need (declarations from e), in each phase.
  void batched_store_loop(int64_t n, const std::string& T, const std::string& value, const std::string& cond,
                          const std::string& target, const std::function<void()>& prelude = {});
  void close_loop();
  // A scalar computed by a tile op: emit the op into a one-element slot (thread 0), then
  // broadcast it to every thread's register.
  std::string scalar_slot_begin(ir::ValueId v);
  void scalar_slot_end(ir::ValueId v, const std::string& slot);
  // Before an op that reads tiles written by other threads / memory, or writes memory.
  void before_cross_read();
  void before_mem_read();
  void before_mem_write();
  // The same for a register tile's loop reading or writing the whole of ref (a pallas_call's
  // block, a scratch buffer): memory of a group of its own (set_memory_group) orders only after
  // the accesses to that group since the last barrier (a softmax's store after its block's load
  // needs none), others as above.
  void before_mem_read(ir::ValueId ref);
  void before_mem_write(ir::ValueId ref);
  void after_mem_read(ir::ValueId ref);
  void after_mem_write(ir::ValueId ref);
  // The memory group of ref (set_memory_group), or nullptr.
  const int* memory_group_of(ir::ValueId ref) const {
    const auto it = memory_group_.find(ref);
    return it == memory_group_.end() ? nullptr : &it->second;
  }
  // Makes the accesses of known groups plain pending memory accesses (the flags above), for code
  // that reads those: every op but plain loads, stores and ops without memory effects or regions
  // (emit_op).
  void fold_memory_groups();
  // What the next barrier must order (tile and memory writes, memory reads). A branch that only
  // some paths take (the memory path beside an ACC's registers) may sync on its own: after it,
  // restore_pending(saved) keeps what was pending before it, which the other paths did not sync.
  struct PendingSyncs {
    bool tile_written = false, mem_written = false, mem_read = false;
  };
  PendingSyncs pending_syncs() {
    fold_memory_groups();
    return {tile_written_, mem_written_, mem_read_};
  }
  void restore_pending(const PendingSyncs& p) {
    tile_written_ = tile_written_ || p.tile_written;
    mem_written_ = mem_written_ || p.mem_written;
    mem_read_ = mem_read_ || p.mem_read;
  }
  // `header {` body `}`: such a branch (every thread of the group takes it alike). Its barriers
  // sync only its path: the arena frees nothing at them, and what was pending before it still is
  // after it.
  void emit_other_path(const std::string& header, const std::function<void()>& body);
  void after_tile_write() { tile_written_ = true, ++writes_; }
  void after_mem_write() { mem_written_ = true, ++writes_; }
  void after_mem_read() { mem_read_ = true; }
  int indent() const { return indent_; }

 private:
  void emit_op(const ir::Op& op);
  void emit_pure(const ir::Op& op);  // emit_ops.cpp
  void emit_ref_op(const ir::Op& op);
  void emit_ref_op_in_memory(const ir::Op& op);
  // ref_transpose / ref_reshape / ref_bitcast: the same memory under the strides
  // eval::transformed gives (a bitcast through a pointer of its type).
  void emit_ref_transform(const ir::Op& op);
  // gpu_cluster_ref: the same array in a peer CTA (pl_cluster_peer, the index checked at run time).
  void emit_cluster_ref(const ir::Op& op);
  // A cluster axis of the mesh (its index among the mesh axes): this CTA's place along it (an
  // expression of pl_cluster_rank(), the row-major rank in the cluster), its size, and its stride
  // in that rank.
  struct ClusterAxis {
    std::string coordinate;
    int64_t size = 1, stride = 1;
  };
  ClusterAxis cluster_axis(int64_t mesh_axis) const;
  // stores_from_registers_: whether `load` is one (emitted as nothing), and its store.
  bool is_stored_from_registers(const ir::Op& load) const;
  void emit_store_from_registers(const ir::Op& store, const ir::Op& load);
  // Whether every element of value v is the same (a scalar, a fused constant, a broadcast of a
  // scalar, elementwise ops of such): `at(v, "0")` is all of it.
  bool is_uniform(ir::ValueId v) const;
  void emit_control(const ir::Op& op);
  void emit_debug_print(const ir::Op& op);
  void emit_debug_check(const ir::Op& op);
  // A reduction of x's elements over the axes `reduced` (ascending) into `out` (x's other axes,
  // in order; a one-element slot for a scalar): thread teams of pl_reduce_team, each combining
  // with pl_team_combine. Returns whether teams were emitted: a team's first thread writes its
  // result, so a tile result then needs a barrier before other threads read it.
  struct TeamReduction {
    std::string acc_type, identity;
    int64_t acc_bytes = 0;
    std::string combine;  // the combination of accumulators `a` and `b`
    // The accumulator of element (storage-typed expression) v at flat reduced index j.
    std::function<std::string(const std::string& v, const std::string& j)> element;
    std::function<std::string(const std::string& acc)> result;  // stored into out[e]
  };
  bool emit_team_reduction(ir::ValueId x, const std::vector<size_t>& reduced, const std::string& out,
                           const TeamReduction& r);  // emit_ops.cpp
  // The loop that reductions and scans share (emit_ops.cpp): `results` lines of `count` elements
  // each, e the line, S the team size of pl_reduce_team (teams only when `team`). With S > 1 every
  // thread of the group runs exactly one round, those past the lines too (the team's shuffles and
  // syncs are the group's). Opens `{` and the loop; the caller closes both.
  void open_team_loop(int64_t results, int64_t count, bool team);
  // Emits what `use(scratch)` gives, scratch being 32 accumulators of type A in the arena when a
  // team may be wider than a warp (`wide`), else a null pointer; `use` calls a runtime function
  // that syncs the group after its last access of the scratch (pl_team_combine,
  // pl_team_exclusive_scan), so the range is free again right after.
  void with_team_scratch(bool wide, const std::string& A, int64_t acc_bytes,
                         const std::function<void(const std::string& scratch)>& use);
  void emit_gpu_op(const ir::Op& op);  // emit_gpu_ops.cpp: gpu::kernel's primitives
  // wgmma into acc (operand 0) of a (a Ref, or a tile as a row-major Ref) and b (operand 2).
  void emit_wgmma(const ir::Op& op, const RefInfo& a);  // emit_gpu_ops.cpp
  // wgmma whose a is a register tile: taken from the registers where the ACC is in registers
  // (pl_tc_dot_acc's NCA), else written to the arena for emit_wgmma (emit_fragments.cpp).
  void emit_wgmma_from_registers(const ir::Op& op);
  // A register tile v written to a new arena tile (declared `name`; `comment` ends its line),
  // the group synced after: for loops that read it in another layout. The caller releases it.
  ValueInfo arena_copy_of_register_tile(ir::ValueId v, const std::string& name, const std::string& comment = "");
  // A Pallas thread's own scoped array: (offset, bytes) in its tile arena, released at the end.
  std::pair<int64_t, int64_t> own_scoped_array(ir::ValueId a, RefInfo& r, const ir::Op& scope);
  void emit_scope_with_barriers_or_shared(const ir::Op& op, const ScopedLayout& layout,
                                          const std::vector<std::string>& holders);
  void emit_scope_body(const ir::Op& op, const std::vector<std::string>& holders);
  // Region r of op (a branch, a run_scoped body), what it yields copied into op's result
  // holders and then released.
  void emit_region_into(const ir::Region& r, const ir::Op& op, const std::vector<std::string>& holders);
  // A whole load of a gpu::kernel ACC in registers into a value, a whole store of a value into one.
  void emit_load_from_registers(const ir::Op& load, const AccumulatorRegisters& a);
  void emit_store_into_registers(const ir::Op& store, const AccumulatorRegisters& a);
  void emit_semaphore_op(const ir::Op& op);  // emit_gpu_ops.cpp: gpu::Semaphore signal, wait, read
  // ---- Register tiles (emit_fragments.cpp). Chooses the array values of r kept in the group's
  // registers in wgmma's layout (fragments_): a whole load of an ACC in registers (in a
  // pallas_call, the blocked layout's: a whole load of a block, an elementwise op), the reductions
  // of such a value's rows (a rows layout), elementwise ops of such values, and the carries of r's
  // loops whose bodies yield such values, where every use of the value reads it in that layout —
  // in r itself, by an elementwise op of its shape (whose loop then runs over the thread's
  // registers; a rows value also broadcast along the rows of a tile), a reduction of its rows, its
  // columns or every element (fragment_reduction_kind), a whole store (into memory, or into an ACC in registers), wgmma's a, a loop's initial carry in
  // the same layout, or r's yield where r's loop carries it so (fragment_yields_).
  void plan_fragments(const ir::Region& r, const std::function<const AccumulatorRegisters*(ir::ValueId)>& acc_of);
  // What computing an element of an op reads of register tiles, through its fused ops.
  struct FragmentReads {
    std::optional<FragmentLayout> layout;  // the tiles read at the element's own index
    std::optional<FragmentLayout> rows;    // a rows value read through a broadcast along the rows
    std::optional<FragmentLayout> cols;    // a columns value read through a broadcast along the columns
    bool conflict = false;  // two layouts, a register tile read at other indices, rows of no tile
    bool across = false;    // also reads a tile or broadcast (elements other threads wrote)
    bool arena = false;     // reads an arena tile (through a broadcast or not)
    void add_layout(const FragmentLayout& l);
  };
  // Adds what element e of v reads (`layout_of` says which values are register tiles).
  void fragment_read(ir::ValueId v, const std::function<const FragmentLayout*(ir::ValueId)>& layout_of,
                     FragmentReads& reads) const;
  // What op's loop reads: its operands from `first` on, in a loop of layout `loop` when given (a
  // store into an ACC in registers); conflict where a rows value is not read in a loop of its tile.
  FragmentReads fragment_reads(const ir::Op& op, size_t first, const std::function<const FragmentLayout*(ir::ValueId)>& layout_of,
                               const FragmentLayout* loop = nullptr) const;
  // The layout an op's loop runs in when it reads register tiles (nullopt: none).
  std::optional<FragmentLayout> fragment_loop_of(const ir::Op& op, bool& across, const FragmentLayout* loop = nullptr) const;
  // The register tile layout of an ACC in registers of the group.
  FragmentLayout acc_layout(const AccumulatorRegisters& a) const;
  // The layouts loop's body yields when free to (fragment_discovery_): its carries' candidates.
  std::vector<std::optional<FragmentLayout>> discover_loop_carries(const ir::Op& loop);
  // Plans the carries of loop op (in r) kept in registers: `carries` are the candidates' layouts,
  // dropped (reset) where the body does not keep them so; true when it dropped one (then plan
  // again with the rest).
  bool plan_loop_carries(const ir::Op& loop, std::vector<std::optional<FragmentLayout>>& carries);
  // fragment_args_ of loop's body args: the carries in registers.
  void set_carried_args(const ir::Op& loop, const std::vector<std::optional<FragmentLayout>>& carries);
  // The layouts of the body args of loops planned in registers (the roots of the body's plan),
  // and of a loop body's yields (nullopt: not in registers); a body in fragment_discovery_ may yield
  // register tiles of any layout (the first try of a loop's carries).
  std::map<ir::ValueId, FragmentLayout> fragment_args_;
  std::map<const ir::Region*, std::vector<std::optional<FragmentLayout>>> fragment_yields_;
  std::set<const ir::Region*> fragment_discovery_;
  // Each region's control-flow nesting in the kernel (the body 0). Planning an op's carries plans
  // its regions two or three times over, and theirs inside each: ops in regions nested deeper than
  // kCarryPlanningDepth keep their carries and results in the arena, so that a deep nest costs the
  // planner some 3^6 region plans at most, not 3^depth (12 nested conds took 11 s). By the kernel's
  // structure, so that a region plans alike whoever plans it.
  static constexpr int kCarryPlanningDepth = 6;
  std::map<const ir::Region*, int> region_depth_;
  // Captured register tiles: a value of an enclosing region that a loop's body, a condition or a
  // branch reads (a load made before the loop, read in each iteration) stays in its registers
  // where every read inside keeps it so. Per region of a control op: the values it reads that
  // are made outside it (outer_reads, by the kernel's structure), the register tiles its
  // enclosing region offers it in their layouts (captured_offers_: the roots of its plan, as its
  // loop's carried args are), and those its last plan kept (captures_kept_; the enclosing plan
  // sends the others to the arena and plans again). A captured tile is never yielded in registers.
  const std::set<ir::ValueId>& outer_reads(const ir::Region& r);  // (memoized in outer_reads_)
  std::map<const ir::Region*, std::set<ir::ValueId>> outer_reads_;
  std::map<const ir::Region*, std::map<ir::ValueId, FragmentLayout>> captured_offers_;
  std::map<const ir::Region*, std::set<ir::ValueId>> captures_kept_;
  std::set<ir::ValueId> counted_captures_;  // (GeneratedKernel::register_captures, once each)
  // `for` this thread's elements of a register tile's layout: pl_k its register, e the element's
  // row-major index (each with its own #pragma unroll, so pl_k is a constant and the registers stay
  // registers); at() reads a register tile as its register pl_k. `pairs`: for each even register
  // pl_k0 and its element pl_e0, whose neighbours pl_k0 + 1 and pl_e0 + 1 are the next column (the
  // caller defines pl_k and e for each).
  // Where the group's warpgroups outnumber a round's blocks (a wgmma-layout tile), a warpgroup
  // without a block either skips the round (`Skip`: a loop that writes memory or counts into a
  // total) or runs it with `pl_idle` set (`Zeros`: a loop that writes a register tile, each
  // register through assign_register, which gives such a warpgroup zeros without computing or
  // reading anything). A skip per op leaves each register tile defined on one side of a branch,
  // which ptxas pays for in registers (stop 51: 171 in the one-block attention probe at 256
  // threads; 82 with the zeros). The warpgroup cannot just leave: it meets the CTA's barriers.
  enum class IdleWarpgroup { Skip, Zeros };
  void open_fragment_loop(const FragmentLayout& l, bool pairs = false, IdleWarpgroup idle = IdleWarpgroup::Skip);
  // `regs[pl_k] = value` (a register tile of dtype dt) in a register tile's loop; in one opened with
  // IdleWarpgroup::Zeros, an idle warpgroup's register gets zero.
  void assign_register(const std::string& regs, DType dt, const std::string& value);
  void close_fragment_loop();
  void emit_fragment_load(const ir::Op& load, const AccumulatorRegisters& a);
  // The blocked layout an (m, n) array of type t may take in a pallas_call (ctx_.blocked_tiles):
  // the widest runs of lanes a row's columns divide into (32, 16, ... 1), then the fewest warps a
  // row spreads over, such that every thread holds whole registers, at most 128 words of them;
  // an (n) array's: the columns layout.
  std::optional<FragmentLayout> blocked_layout(const ir::Type& t) const;
  // A whole load of memory (a pallas_call's block) into a blocked register tile.
  void emit_blocked_load(const ir::Op& load);
  // `if (...) ` keeping the writes of a rows value to one of the lanes that hold it alike ("" for a
  // tile: each element has one thread).
  static std::string replica_guard(const FragmentLayout& l);
  // An elementwise op (or a store of value `stored`) whose loop reads register tiles.
  void emit_fragment_elementwise(const ir::Op& op, const FragmentLayout& l, bool across);
  void emit_fragment_store(const ir::Op& store, const FragmentLayout& l, bool across);
  // A reduction of a register tile's rows (reduction rule t) into out: each thread combines its
  // registers of each of its two rows per block, the quad by two shuffles; then a lane per quad
  // writes the tile out, or (into_registers) every lane its rows layout registers out.
  void emit_fragment_reduction(const ir::Op& op, const std::string& out, const TeamReduction& t, bool into_registers);
  // The same in the blocked layout: each row's registers of the thread, then the row's T lanes by
  // log2 T shuffles, then (a row over P > 1 warps) their parts through the arena; every lane has
  // the row (into_registers), or one lane of the row writes it to out.
  void emit_blocked_row_reduction(const ir::Op& op, const std::string& out, const TeamReduction& t, bool into_registers);
  // A blocked tile's columns: each thread's rows of its columns, a warp's L lane rows by shuffles
  // (xor T .. 16), the warp rows' partial results through the arena (none with one warp row);
  // every warp's lanes then hold their columns
  // (into_registers: the columns layout), or the first warp row writes them to out.
  void emit_blocked_column_reduction(const ir::Op& op, const std::string& out, const TeamReduction& t, bool into_registers);
  // Whether op reverses the columns of a blocked tile of layout l (or a columns value) whose rows
  // lie each in one warp (P 1): it then reads the registers (a shuffle within each row's T lanes).
  static bool blocked_column_rev(const ir::Op& op, const FragmentLayout& l);
  // That reversal, into a register tile of l where the plan keeps the result in registers, else
  // into its arena tile (each thread writes its elements where they go).
  void emit_blocked_column_rev(const ir::Op& op);
  // Whether op (a slice, or a concatenate) of blocked register tiles (their layouts: layout_of)
  // moves whole registers — rows in whole row bands (B rows), columns in whole runs of the P x T
  // lanes of a row — so each thread keeps the elements it holds: then the result's layout (its
  // operands' with its shape), else nullopt. A 2-D tile, not a rows or columns value.
  static std::optional<FragmentLayout> register_piece_layout(const ir::Op& op, const ir::Type& result,
                                                             const std::function<const FragmentLayout*(ir::ValueId)>& layout_of);
  // Its result's layout where op's operands are register tiles now (their ValueInfo).
  std::optional<FragmentLayout> register_piece_layout(const ir::Op& op) const;
  // v's layout where it is a register tile now, else null.
  const FragmentLayout* register_layout(ir::ValueId v) const {
    const ValueInfo& i = info(v);
    return i.kind == ValueInfo::Kind::Fragment ? &i.frag : nullptr;
  }
  // That slice or concatenate (its result's layout l): register moves into a register tile where
  // the plan keeps the result in registers, else each thread writes its elements into the
  // result's arena tile.
  void emit_register_piece(const ir::Op& op, const FragmentLayout& l);
  // Whether op is a scan (cumsum, cumprod, cummax, cummin; forward or reverse) along the rows of a
  // blocked tile of layout l whose rows lie each in one warp (P 1): it then runs in registers.
  static bool blocked_row_scan(const ir::Op& op, const FragmentLayout& l);
  // Whether op (a reduction or scan of its one operand, a register tile of layout l) reads it in
  // its registers.
  bool reads_in_registers(const ir::Op& op, const FragmentLayout& l) const;
  // Whether op reads a register tile of layout l as an arena tile once it has a copy there (not
  // an elementwise op, a loop or branch, a yield, a whole store, or a register reduction or scan).
  bool arena_reader_of_register_tile(const ir::Op& op, const FragmentLayout& l) const;
  // The arena copy of register tile v (fragment_mirrors_), after the op making it; a barrier.
  void emit_mirror(ir::ValueId v);
  // That scan, into register tile `out` (into_registers) or tile out: each register's T lanes by
  // an xor butterfly (the exclusive scan and the lanes' total), a register after another.
  void emit_blocked_row_scan(const ir::Op& op, const std::string& out, const TeamReduction& t, bool into_registers);
  // What a reduction (sum, max, min, prod; argmax and argmin of a blocked tile) of a register tile
  // of layout l computes in registers: its rows (axes {1}: rows in registers, or a tile), its
  // columns (axes {0}), its total (every axis: a scalar), or None (the tile goes to the arena for
  // it).
  enum class FragmentReduction { None, Rows, Columns, Total };
  FragmentReduction fragment_reduction_kind(const ir::Op& op, const FragmentLayout& l) const;
  // A reduction (op, by t) of a register tile: into registers where the plan put its result
  // there, else into its tile or scalar.
  void emit_reduction_of_fragment(const ir::Op& op, const TeamReduction& t);
  // A reduction of a register tile's rows or columns (kind) into out, by its layout's function
  // below; true where out is a tile the arena's loops did not write (the caller syncs after it).
  bool emit_register_reduction(const ir::Op& op, FragmentReduction kind, const std::string& out, const TeamReduction& t,
                               bool into_registers);
  // A reduction of every element of a register tile into its scalar result: each thread's
  // registers, then the group's threads (pl_team_combine).
  void emit_fragment_total(const ir::Op& op, const TeamReduction& t);
  // A reduction of a register tile's columns into tile out: each thread's registers of a column,
  // the warp's eight rows by shuffles, the warps' totals through the arena.
  void emit_fragment_column_reduction(const ir::Op& op, const std::string& out, const TeamReduction& t);
  // The rows layout register of register pl_k of a loop of tile layout l.
  static std::string rows_register(const FragmentLayout& l);
  // Copies register tiles into holder registers (a loop's carries): all read, then all written.
  void copy_fragments(const std::vector<std::pair<std::string, ir::ValueId>>& copies);
  std::map<ir::ValueId, FragmentLayout> fragments_;  // the planned register tiles
  // Register tiles that also get a copy in the arena (plan_fragments' `mirrorable`) for their
  // uses that read them as tiles, and those copies once made (emit_mirror).
  std::set<ir::ValueId> fragment_mirrors_;
  std::map<ir::ValueId, ValueInfo> mirrors_;
  std::optional<FragmentLayout> fragment_loop_;      // the layout of the loop being emitted
  bool fragment_loop_has_idle_ = false;             // it defines pl_idle (IdleWarpgroup::Zeros)
  // Declares v's registers (a register tile of layout l); returns their name.
  std::string define_fragment(ir::ValueId v, const FragmentLayout& l);
  // Opens `if (!pl_mma_dot(...)) {` around the CUDA-core loop that follows, when tensor cores can
  // compute the product (f32 accumulation of bf16 or f16 inputs into an f32, bf16 or f16 result,
  // m % 16 == n % 8 == k % 16 == 0), and counts it; the caller closes it when this returned true.
  bool open_tensor_core_product(const MmaProduct& p);  // emit_ops.cpp
  // A 2-D matrix product (lhs m x k, rhs k x n or n x k, no batch dims): p's dims, dtypes and
  // b_nk; false for any other dot_general. Pointers and strides are the caller's.
  bool plain_product(const ir::Op& dot, MmaProduct& p) const;  // emit_ops.cpp
  // The ring-slot layouts of a wgmma product's operands read in place (p.a_layout / b_layout:
  // PL_SLOT_LAYOUT_j, which slot_layout decides after the body), counted as the slot's tensor-core
  // uses when `count` (once per product). emit_ops.cpp
  void note_slot_layouts(const ir::Op& dot, MmaProduct& p, bool count);
  // A dot whose result is a register tile of wgmma's accumulator layout l (plan_fragments):
  // wgmma into the registers (pl_tc_dot_fragment) where the group's warpgroups run it and its
  // operands' rows are contiguous (`a`, `b` with row strides lda, ldb; a may be a register tile
  // of that layout, plan_fragments'); else `in_memory` (the product into a row-major f32 tile of
  // a row-major a, counting no slot use) computes it in the arena and the threads read it in l.
  // emit_fragments.cpp
  void emit_dot_into_registers(const ir::Op& dot, const FragmentLayout& l, bool rows_contiguous, const std::string& a,
                               int64_t lda, const std::string& b, int64_t ldb,
                               const std::function<void(const RefInfo& d, const std::string& a, bool count)>& in_memory);
  RefInfo view(const ir::Op& op, const RefInfo& base, const ir::Indexer& idx);
  void copy_into(ir::ValueId dst_slot_owner, const std::string& dst, ir::ValueId src);
  void release_dead(const ir::Op& op);
  // v's arena slot, when it owns one, and its arena copy, when it has one (pending until a barrier).
  void release_value(ir::ValueId v);
  // What region r yields and made itself, once the parent has copied it into its holders:
  // liveness (compute_last_uses) keeps yields alive to the region's end and no further.
  void release_yielded(const ir::Region& r, const std::vector<ir::ValueId>& ys);
  void compute_last_uses(const ir::Region& r);
  // Chooses the ops of `r` whose results are fused into their user (fused_producers_).
  void plan_fusion(const ir::Region& r);
  // Whether ref v is an operand's block (its memory group is >= 0).
  bool is_operand_block(ir::ValueId ref) const;
  // Whether fused value v reads an operand's block (a fused load of one).
  bool reads_operand_memory(ir::ValueId v) const;
  // Whether fused value v reads elements other threads wrote (a fused broadcast in it): its user's
  // loop needs before_cross_read.
  bool reads_across(ir::ValueId v) const;
  // Element `flat` (an expression) of broadcast_in_dim op's result: its operand's element.
  std::string broadcast_element(const ir::Op& op, const std::string& flat) const;
  // Binds a fused op's result (no code but a comment, and a load's barrier and view pointer).
  void emit_fused(const ir::Op& op);
  std::string declare_result_holder(ir::ValueId v);
  // A loop being emitted: its carries' holders, and whether its regions write nothing (writes_
  // when they began; writes_nothing): then no barrier ends an iteration that wrote nothing.
  struct OpenLoop {
    std::vector<std::string> holders;
    bool writes_nothing = false;
    int64_t writes = 0;
    size_t pending = 0;  // (Arena::pending_mark() then)
    // What was pending at the loop's entry, past its entry barrier (the reads a loop that writes
    // nothing starts without syncing): still pending after a loop of no iterations, whatever
    // barriers its body has.
    PendingSyncs at_entry;
  };
  OpenLoop open_loop(const ir::Op& op, size_t first_carry, const std::string& header);
  // (arena_mark: Arena::pending_mark() before the body was emitted.)
  void close_loop_body(const ir::Op& op, const ir::Region& body, size_t arena_mark, const OpenLoop& loop,
                       const std::vector<ir::ValueId>& ys);
  void bind_carries(const ir::Region& r, size_t first, const std::vector<ir::ValueId>& holders);
  void assign_carries(const std::vector<ir::ValueId>& results, const std::vector<std::string>& holders,
                      const std::vector<ir::ValueId>& ys);
 public:
  // Fills n elements at `ptr` with the uninitialized value (fresh scratch, staged padding).
  void fill_uninitialized(const std::string& ptr, DType t, int64_t n);

 private:

  const ir::Kernel& k_;
  EmitContext ctx_;
  int indent_;
  int counter_ = 0;
  std::vector<ValueInfo> values_;
  std::map<const ir::Op*, std::vector<ir::ValueId>> dies_after_;
  std::map<ir::ValueId, const ir::Op*> fused_producers_;  // fused value -> the op computing it
  std::map<ir::ValueId, int> memory_group_;                // set_memory_group
  // `ref[v] += dot(a, b)` (f32): the dot accumulates into the ref's view in place, and the load,
  // the add and the store emit nothing (plan_fusion).
  std::map<const ir::Op*, const ir::Op*> accumulating_dots_;  // dot -> the store it replaces
  std::set<const ir::Op*> absorbed_;
  // `dst[...] = acc[...]` of a gpu::kernel ACC matrix in registers: the store (key) writes the
  // registers to dst (pl_acc_store) for the load (value), which makes no tile.
  std::map<const ir::Op*, const ir::Op*> stores_from_registers_;
  // `acc[...] = f(acc[...])` of a gpu::kernel ACC matrix in registers (attention's rescaling):
  // the load, fused into the store, reads each register's own value (pl_acc_assign's `pl_old`)
  // where the registers hold the ACC — no flush — and its memory where they do not.
  std::set<const ir::Op*> register_updates_;
  bool reading_old_registers_ = false;  // at() renders those loads as `pl_old`
  // Per pipelined input: views made of its slot, how many were tensor-core operands, and the
  // layout those asked for (-1: two different ones).
  struct SlotUses {
    int views = 0, tensor_core = 0, layout = 0;
  };
  std::map<int, SlotUses> slot_uses_;
  RegisterAccumulator acc_regs_;
  std::map<ir::ValueId, AccumulatorRegisters> kernel_accs_;  // gpu::kernel ACC Refs (and views) in registers
  // Views of them made in the regions being planned (plan_fusion), not emitted yet.
  std::map<ir::ValueId, const AccumulatorRegisters*> planned_acc_views_;
  const AccumulatorRegisters* kernel_acc(ir::ValueId v) const {
    const auto it = kernel_accs_.find(v);
    return it == kernel_accs_.end() ? nullptr : &it->second;
  }
  // The group fenced its accesses and synced for a bulk copy, and no op since has accessed
  // memory (emit_region): the next bulk copy needs neither again.
  bool bulk_fenced_ = false;
  // Fused loads' memory and the op whose loop reads it (plan_fusion's fused_load_users_; null:
  // the next op emitted), pending until that op is emitted.
  std::vector<std::pair<ir::ValueId, const ir::Op*>> fused_read_refs_;
  std::map<const ir::Op*, const ir::Op*> fused_load_users_;
  bool tile_written_ = false, mem_written_ = false, mem_read_ = false;
  std::set<int> groups_read_, groups_written_;  // memory groups accessed since the last barrier
  int64_t writes_ = 0;  // tile and memory writes emitted so far (a loop whose body added none: OpenLoop)
  int conditional_depth_ = 0;
  bool just_synced_ = false;  // the last line emitted is a barrier  // inside a loop body or a branch that may not run
};

}  // namespace pallas::gpu::detail
