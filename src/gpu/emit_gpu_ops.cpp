// The CUDA rules of gpu::kernel's primitives (copies through shared memory, mbarriers, wgmma).
//
// Each Pallas thread is a group of the CTA's threads (a warpgroup), and a primitive is what that
// group does together:
//  * copy_gmem_to_smem: one arrival on the barrier per copy, as the interpreter (and Mosaic GPU's
//    expect-tx arrival) counts it; the copy has landed when the barrier's phase completes. A box
//    of an operand into dense shared memory (tma_box) is one TMA copy on sm_90 when its tensor map
//    was encoded and the shared memory is 128-byte aligned (checked at run time): one thread
//    arrives with the box's bytes as expected transactions and issues it. Else, when the views
//    are rows of whole 16-byte chunks (bulk_rows) and the addresses are 16-byte aligned (checked
//    at run time), one thread starts a bulk copy per row on sm_90 (cp.async.bulk, completing on
//    the barrier likewise) and the group goes on without waiting; otherwise the group copies the
//    elements, syncs, and one thread arrives. A multicast copy (collective_axes) whose shares
//    are boxes: each peer's thread arrives with the whole copy's bytes on its own barrier and
//    issues its share once for all peers (TMA multicast); else each CTA copies the whole block.
//  * copy_smem_to_gmem: a box as above is one TMA store (cp.async.bulk.tensor ... bulk_group),
//    else with whole 16-byte rows (bulk_rows) and aligned addresses thread 0 starts a bulk copy
//    per row on sm_90 (cp.async.bulk ... bulk_group); either way thread 0 commits them as one
//    group; wait_smem_to_gmem(n) is thread 0's cp.async.bulk.wait_group(.read) n, then a group
//    sync; each CTA waits for all of them at its end. Otherwise the group copies the elements
//    (and thread 0 commits an empty group, so waits count copies).
//  * barrier_arrive: the group syncs (its writes happen before the arrival), one thread arrives
//    (on a gpu::ClusterBarrier: on the barrier of each peer CTA, pl_mbar_arrive_peers).
//    barrier_wait: every thread of the group waits for the phase it awaits next (a parity bit
//    per barrier and thread), with a time limit that turns a deadlock into an error.
//  * wgmma: acc += a @ b. bf16 / f16 operands go to the tensor cores (pl_tc_dot: the wgmma
//    instruction on sm_90a, each warpgroup staging its operands in wgmma's shared-memory layout;
//    mma.sync on sm_80); otherwise the group's threads sum the products in f32 (the
//    interpreter's order: the sum of the products, then added to the accumulator).
//  * commit_smem syncs the group; wgmma_wait waits for the products left running into an ACC in
//    registers. set_max_registers is setmaxnreg where register_reallocation finds every
//    warpgroup's request and room for them all (setmaxnreg.inc waits until the CTA has the
//    registers: forever where it never will), else a hint that is not emitted.
//  * semaphore_signal / semaphore_wait / semaphore_read (gpu::Semaphore: the CTA's counters in its
//    shared memory, pl::get_global's in the launch's workspace): the group syncs, so its writes come before the signal; one thread signals (a
//    release at GPU scope) or waits (acquiring loads, then a compare-and-swap that takes the
//    count; a time limit turns a deadlock into an error), and the group syncs again after a wait
//    or a read (the read's value goes to every thread through a slot of the arena).
//  * named_region begin/end (any kernel): when profiling, thread 0 of the group records the
//    region's number and the time into the thread's profile slot (gpu/profiler.h).
#include <algorithm>
#include <climits>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "core/call.h"
#include "eval/interpreter.h"
#include "gpu/emitter.h"
#include "ir/analysis.h"
#include "pallas/error.h"

namespace pallas::gpu::detail {

using ir::OpCode;
using ir::ValueId;

namespace {
const RefInfo& ref_operand(const Emitter& em, const ir::Op& op, size_t i) {
  const ValueInfo& v = em.info(op.operands[i]);
  if (v.kind != ValueInfo::Kind::Ref)
    throw NotSupportedError(std::string(op.info().name) + " on an operand that is not a Ref, on the GPU backend",
                            op.loc);
  return v.ref;
}

// A copy as rows for bulk copies: `rows` rows of `row_bytes` contiguous bytes, `stride` bytes
// apart in each of the two views.
struct BulkRows {
  int64_t rows = 1, row_bytes = 0, src_stride = 0, dst_stride = 0;
};
// The row stride (elements) of a view whose last dim is contiguous and whose leading dims step
// uniformly (dim i's stride is dim i + 1's times its size: one sequence of rows), else nullopt.
std::optional<int64_t> uniform_row_stride(const RefInfo& r) {
  const size_t n = r.shape.size();
  if (n == 0 || r.strides.back() != 1) return std::nullopt;
  if (n == 1) return 0;
  for (size_t i = 0; i + 2 < n; ++i)
    if (r.strides[i] != r.strides[i + 1] * r.shape[i + 1]) return std::nullopt;
  return r.strides[n - 2];
}
// Whether a copy from `src` to `dst` can be bulk copies (cp.async.bulk: sizes and addresses
// multiples of 16 bytes; the addresses are checked when the kernel runs).
std::optional<BulkRows> bulk_rows(const RefInfo& src, const RefInfo& dst) {
  if (src.shape != dst.shape || src.dtype != dst.dtype || src.shape.empty()) return std::nullopt;
  const std::optional<int64_t> s = uniform_row_stride(src), d = uniform_row_stride(dst);
  if (!s || !d) return std::nullopt;
  const int64_t item = itemsize(src.dtype);
  BulkRows b;
  for (size_t i = 0; i + 1 < src.shape.size(); ++i) b.rows *= src.shape[i];
  b.row_bytes = src.shape.back() * item;
  b.src_stride = *s * item;
  b.dst_stride = *d * item;
  const bool aligned = b.row_bytes % 16 == 0 && b.src_stride % 16 == 0 && b.dst_stride % 16 == 0;
  // A phase's expected transactions count at most 2^20 - 1 bytes.
  if (!aligned || b.rows * b.row_bytes >= (int64_t{1} << 20)) return std::nullopt;
  return b;
}

// A copy between a box of an operand array (`gmem`: a view whose dims step as the array's do, in
// order, the last one the array's last) and a dense row-major view of shared memory (`smem`) as
// one TMA box (cp.async.bulk.tensor): the tensor map it needs (1 in the box where the view drops
// a dim), or nullopt — past the limits of tensor_map_for_boxes, or of a phase's expected
// transactions (fewer than 2^20 bytes). `swizzle_bytes` 32, 64, 128: into a swizzled tile (rows
// of that many bytes), whose map makes the box land swizzled. `panel_cols` > 0: the box is that
// many of the view's columns (one panel of a tile of several; the caller issues one per panel).
std::optional<TensorMapSpec> tma_box(const RefInfo& gmem, const RefInfo& smem, int swizzle_bytes, int64_t panel_cols = 0) {
  const Shape& a = gmem.operand_shape;
  const size_t rank = a.size();
  if (gmem.operand < 0 || rank == 0 || gmem.shape != smem.shape || gmem.dtype != smem.dtype || gmem.shape.empty() ||
      smem.strides != contiguous_strides(smem.shape))
    return std::nullopt;
  const std::vector<int64_t> as = contiguous_strides(a);
  std::vector<int64_t> box(rank, 1);
  size_t d = 0;
  for (size_t v = 0; v < gmem.shape.size(); ++v) {
    while (d < rank && as[d] != gmem.strides[v]) ++d;
    if (d == rank || gmem.shape[v] > a[d]) return std::nullopt;
    box[d++] = gmem.shape[v];
  }
  if (num_elements(box) * itemsize(gmem.dtype) >= (int64_t{1} << 20)) return std::nullopt;
  if (panel_cols > 0) {
    if (box.back() != gmem.shape.back() || box.back() % panel_cols != 0) return std::nullopt;
    box.back() = panel_cols;
  }
  return tensor_map_for_boxes(gmem.operand, gmem.dtype, a, box, swizzle_bytes);
}

// A multicast copy (copy_gmem_to_smem with collective_axes) in a cluster of several CTAs, as the
// interpreter splits it (core::multicast_share_dim): per cluster rank, the mask of the ranks
// copying together (its peers, itself included) and its share's index among them (rank order).
struct MulticastPeers {
  int64_t count = 1;  // CTAs per copy (the same for every rank)
  std::vector<int64_t> mask;
  std::vector<int64_t> share;
};
MulticastPeers multicast_peers(const EmitContext& ctx, const ir::Op& op) {
  MulticastPeers out;
  if (ctx.cluster_dims.empty() || !op.attrs.has(ir::AttrKey::Axes)) return out;
  std::vector<int> collective;  // among the cluster axes
  for (int64_t axis : op.attrs.get_ints(ir::AttrKey::Axes)) collective.push_back(static_cast<int>(axis) - ctx.first_cluster_axis);
  const int64_t ctas = num_elements(ctx.cluster_dims);
  std::vector<std::vector<int64_t>> coords(static_cast<size_t>(ctas));
  for (int64_t r = 0; r < ctas; ++r) core::unravel_row_major(r, ctx.cluster_dims, coords[static_cast<size_t>(r)]);
  for (int64_t r = 0; r < ctas; ++r) {
    int64_t mask = 0;
    int64_t count = 0, share = 0;
    for (int64_t q = 0; q < ctas; ++q) {
      if (!core::multicast_peers(coords[static_cast<size_t>(r)], coords[static_cast<size_t>(q)], collective)) continue;
      mask |= int64_t{1} << q;
      if (q < r) ++share;
      ++count;
    }
    out.mask.push_back(mask);
    out.share.push_back(share);
    out.count = count;
  }
  return out;
}

// A multicast copy's share as one TMA box (per panel, in a tile of several): the box's map and
// where share k starts, k steps in (elements) in the GMEM view and in the SMEM tile. Where the
// share is a box landing densely from an aligned start: the dims before the one it splits are 1;
// a swizzled tile's share is whole rows from a multiple of the pattern's 8 of them; an
// unswizzled one starts on a 128-byte boundary. nullopt otherwise.
struct MulticastShare {
  TensorMapSpec box;
  int64_t gmem_step = 0, smem_step = 0;
};
std::optional<MulticastShare> multicast_share(const RefInfo& gmem, const RefInfo& smem, int64_t peers, int swizzle_bytes,
                                              int64_t panel_cols) {
  if (gmem.shape != smem.shape || smem.strides != contiguous_strides(smem.shape)) return std::nullopt;
  const std::optional<size_t> dim = core::multicast_share_dim(smem.shape, peers);
  if (!dim) return std::nullopt;
  for (size_t d = 0; d < *dim; ++d)
    if (smem.shape[d] != 1) return std::nullopt;
  const bool swizzled = !smem.swizzled.empty();
  if (swizzled && *dim + 2 != smem.shape.size()) return std::nullopt;  // (not rows)
  const int64_t len = smem.shape[*dim] / peers;
  MulticastShare out;
  out.smem_step = panel_cols > 0 ? len * panel_cols : len * smem.strides[*dim];  // (per panel: `len` of its rows)
  out.gmem_step = len * gmem.strides[*dim];
  if ((out.smem_step * itemsize(smem.dtype)) % (swizzled ? 8 * swizzle_bytes : 128) != 0) return std::nullopt;
  RefInfo gmem_share = gmem, smem_share = smem;
  gmem_share.shape[*dim] = smem_share.shape[*dim] = len;
  smem_share.strides = contiguous_strides(smem_share.shape);
  const std::optional<TensorMapSpec> box = tma_box(gmem_share, smem_share, swizzle_bytes, panel_cols);
  if (!box) return std::nullopt;
  out.box = *box;
  return out;
}
}  // namespace

// Records a run-time check of `op` (a wait that gave up, a bad value) and returns its number.
int add_op_site(std::vector<ErrorSite>& sites, ErrorSite::Kind kind, const ir::Op& op) {
  ErrorSite s;
  s.kind = kind;
  s.op_name = std::string(op.info().name);
  s.loc = op.loc;
  sites.push_back(s);
  return static_cast<int>(sites.size()) - 1;
}

std::string table_entry(const std::vector<int64_t>& table, const char* suffix, const std::string& index) {
  if (std::all_of(table.begin(), table.end(), [&](int64_t x) { return x == table[0]; }))
    return std::to_string(table[0]) + suffix;
  std::string out = "(";
  for (size_t i = 0; i + 1 < table.size(); ++i)
    out += index + " == " + std::to_string(i) + " ? " + std::to_string(table[i]) + suffix + " : ";
  return out + std::to_string(table.back()) + suffix + ")";
}

std::optional<TensorMapSpec> tensor_map_for_boxes(int operand, DType dtype, const Shape& array,
                                                  const std::vector<int64_t>& box, int swizzle_bytes) {
  const size_t rank = array.size();
  const int64_t item = itemsize(dtype);
  if (rank == 0 || rank > 5 || box.size() != rank || (box.back() * item) % 16 != 0 || (array.back() * item) % 16 != 0)
    return std::nullopt;
  if (swizzle_bytes != 0 && ((swizzle_bytes != 32 && swizzle_bytes != 64 && swizzle_bytes != 128) ||
                             box.back() * item != swizzle_bytes))
    return std::nullopt;
  const std::vector<int64_t> strides = contiguous_strides(array);
  TensorMapSpec spec;
  spec.operand = operand;
  spec.elem_bytes = static_cast<int>(item);
  for (size_t i = 0; i < rank; ++i) {
    const size_t d = rank - 1 - i;
    // (The driver takes dims up to 2^32, but the copies' coordinates are signed 32-bit.)
    if (box[d] < 1 || box[d] > 256 || array[d] > INT32_MAX) return std::nullopt;
    spec.dims.push_back(static_cast<uint64_t>(array[d]));
    if (i > 0) spec.strides.push_back(static_cast<uint64_t>(strides[d] * item));
    spec.box.push_back(static_cast<uint32_t>(box[d]));
  }
  spec.swizzle_bytes = swizzle_bytes;
  return spec;
}

std::string RefInfo::at_offset(const std::string& offset) const {
  if (swizzled.empty()) return ptr + "[" + offset + "]";
  const std::string panels =
      panel_cols > 0 ? ", " + std::to_string(panel_cols) + ", " + std::to_string(panel_rows) : std::string();
  const std::string e = tile_offset.empty() ? offset : tile_offset + " + " + offset;
  return tile + "[pl_smem_elem<" + swizzled + ", " + ctype(dtype) + panels + ">(" + e + ")]";
}

std::string RefInfo::elem(const std::string& flat) const { return at_offset(offset_of(shape, strides, flat)); }

std::set<ValueId> swizzled_smem_tiles(const ir::Kernel& k, const std::set<ValueId>& candidates) {
  const std::vector<const ir::Op*> producer = ir::defining_ops(k);
  // Whether a dynamic index is a multiple of 8 by construction: a constant, a product with one,
  // a sum of two, pl::multiple_of(x, 8k).
  std::function<bool(ValueId)> multiple_of_8 = [&](ValueId v) {
    if (!producer[static_cast<size_t>(v)]) return false;
    const ir::Op& op = *producer[static_cast<size_t>(v)];
    switch (op.code) {
      case OpCode::Constant: return op.attrs.get_scalar(ir::AttrKey::Value).as_int64() % 8 == 0;
      case OpCode::MultipleOf: return op.attrs.get_int(ir::AttrKey::N) % 8 == 0 || multiple_of_8(op.operands[0]);
      case OpCode::Mul: return multiple_of_8(op.operands[0]) || multiple_of_8(op.operands[1]);
      case OpCode::Add: return multiple_of_8(op.operands[0]) && multiple_of_8(op.operands[1]);
      default: return false;
    }
  };
  std::map<ValueId, ValueId> root_of;  // a candidate, or a view of one
  std::set<ValueId> unaligned;         // views where the swizzle's pattern does not start
  std::set<ValueId> transposed;       // matrix transposes of aligned views (wgmma's K-major b)
  std::set<ValueId> refused, fed_wgmma;
  for (ValueId c : candidates) root_of[c] = c;
  std::function<void(const ir::Region&)> scan = [&](const ir::Region& region) {
    for (const ir::Op& op : region.ops) {
      if ((op.code == OpCode::RefTranspose || op.code == OpCode::RefReshape) && root_of.count(op.operands[0])) {
        // The same tile under other strides: loads and stores place each element (elem). Only a
        // matrix's transpose is still read by start, by wgmma as a K-major b (an (n, k) tile).
        const ValueId base = op.operands[0];
        root_of[op.results[0]] = root_of[base];
        const bool matrix_transpose = op.code == OpCode::RefTranspose && k.values.at(static_cast<size_t>(base)).rank() == 2 &&
                                      !transposed.count(base);
        if (unaligned.count(base) || !matrix_transpose)
          unaligned.insert(op.results[0]);
        else
          transposed.insert(op.results[0]);
        continue;
      }
      if (op.code == OpCode::RefView && root_of.count(op.operands[0])) {
        // Aligned: leading dims any way; the rows a stride-1 slice from a multiple of 8; the row
        // whole. Any view works for loads and stores (RefInfo::elem places each element).
        const ValueId base = op.operands[0];
        root_of[op.results[0]] = root_of[base];
        const Shape& shape = k.values.at(static_cast<size_t>(base)).shape;
        // (A view of an unaligned view, of a transposed one, or of one without rows, is unaligned.)
        if (unaligned.count(base) || transposed.count(base) || shape.size() < 2) {
          unaligned.insert(op.results[0]);
          continue;
        }
        const std::vector<ir::IndexEntry>& e = op.attrs.get_indexer(ir::AttrKey::Index).entries;
        const size_t rows = shape.size() - 2, row = shape.size() - 1;
        // Rows wider than 128 bytes are several panels, each all the rows of its columns: a view
        // keeps every row.
        const bool panels = shape[row] * itemsize(k.values.at(static_cast<size_t>(base)).dtype) > 128;
        bool keeps = true;
        if (e.size() > rows) {
          const ir::IndexEntry& r = e[rows];
          const bool start_ok = r.dynamic >= 0 ? multiple_of_8(op.operands.at(static_cast<size_t>(r.dynamic)))
                                               : r.start % 8 == 0;
          keeps = r.is_slice && r.stride == 1 && start_ok && (!panels || whole_dim(r, shape[rows]));
        }
        if (keeps && e.size() > row) keeps = whole_dim(e[row], shape[row]);
        if (!keeps) unaligned.insert(op.results[0]);
        continue;
      }
      for (size_t i = 0; i < op.operands.size(); ++i) {
        const auto it = root_of.find(op.operands[i]);
        if (it == root_of.end()) continue;
        const bool aligned = !unaligned.count(op.operands[i]);
        // (A transposed tile is read in place as wgmma's b only: the emitter's a is row-major, and
        // a copy lands a box by rows.)
        const bool as_b = i == 2 || !transposed.count(op.operands[i]);
        if (op.code == OpCode::GpuWgmma && i >= 1 && aligned && as_b)
          fed_wgmma.insert(it->second);
        else if (!(i == 0 && (op.code == OpCode::Load || op.code == OpCode::Store || op.code == OpCode::Swap)) &&
                 !(aligned && !transposed.count(op.operands[i]) && ((op.code == OpCode::GpuCopyGmemToSmem && i == 1) ||
                               (op.code == OpCode::GpuCopySmemToGmem && i == 0))))
          refused.insert(it->second);
      }
      for (const ir::Region& sub : op.regions) scan(sub);
    }
  };
  scan(k.body);
  std::set<ValueId> out;
  for (ValueId c : candidates)
    if (fed_wgmma.count(c) && !refused.count(c)) out.insert(c);
  return out;
}

std::map<ValueId, AccumulatorRegisters> register_accumulators(const ir::Kernel& k, const std::set<ValueId>& candidates,
                                                          const std::string& thread_axis, int num_groups,
                                                          const std::set<ValueId>& swizzled_tiles) {
  const std::vector<const ir::Op*> producer = ir::defining_ops(k);
  std::map<ValueId, ValueId> matrix_of;  // a thread's matrix (a candidate, or a view of one) -> the candidate
  std::set<ValueId> refused;
  std::set<ValueId> swizzled_views(swizzled_tiles);  // the swizzled tiles and their views
  std::set<ValueId> swizzled_b_views;                 // their transposes
  std::set<ValueId> staged;  // candidates a product with an operand not in place accumulates into
  std::map<ValueId, AccumulatorRegisters> fed;  // the candidates a wgmma accumulates into
  const auto shape_of = [&](ValueId v) -> const Shape& { return k.values.at(static_cast<size_t>(v)).shape; };
  for (ValueId c : candidates)
    if (shape_of(c).size() == 2 && num_groups == 1) matrix_of[c] = c;  // the CTA's only thread's
  // The thread's index, or it plus or minus a constant (`acc.at(wg - 1)` where the producer is
  // thread 0): a different matrix for every thread. Returns the constant (0 for the index).
  std::function<std::optional<int64_t>(ValueId, bool)> thread_index = [&](ValueId v,
                                                                         bool shifted_ok) -> std::optional<int64_t> {
    if (thread_axis.empty() || !producer[static_cast<size_t>(v)]) return std::nullopt;
    const ir::Op& op = *producer[static_cast<size_t>(v)];
    if (op.code == OpCode::AxisIndex)
      return op.attrs.get_string(ir::AttrKey::AxisNames) == thread_axis ? std::optional<int64_t>(0) : std::nullopt;
    const auto constant = [&](ValueId c) -> std::optional<int64_t> {
      const ir::Op* p = producer[static_cast<size_t>(c)];
      if (!p || p->code != OpCode::Constant) return std::nullopt;
      return p->attrs.get_scalar(ir::AttrKey::Value).as_int64();
    };
    if (!shifted_ok || (op.code != OpCode::Add && op.code != OpCode::Sub)) return std::nullopt;
    if (thread_index(op.operands[0], false))
      if (const std::optional<int64_t> c = constant(op.operands[1])) return op.code == OpCode::Add ? *c : -*c;
    if (op.code == OpCode::Add && thread_index(op.operands[1], false)) return constant(op.operands[0]);
    return std::nullopt;
  };
  // Each (threads, M, N) candidate's shift: all its views must name the same matrix of a thread
  // (`acc.at(wg)` and `acc.at(wg - 1)` together would be two threads' matrices in one thread's
  // registers).
  std::map<ValueId, int64_t> shift_of;
  // A bf16 / f16 product of wgmma's shapes into the M x N matrix acc.
  const auto wgmma_product = [&](const ir::Op& op) {
    const ir::Type& a = k.type(op.operands[1]);
    const ir::Type& b = k.type(op.operands[2]);
    const Shape& d = shape_of(op.operands[0]);
    MmaProduct p;
    p.a_dtype = a.dtype, p.b_dtype = b.dtype, p.d_dtype = k.type(op.operands[0]).dtype;
    p.m = d.at(0), p.n = d.at(1), p.k = a.shape.at(1);
    return Emitter::wgmma_shape(p) && p.n <= 256;
  };
  std::function<void(const ir::Region&)> scan = [&](const ir::Region& region) {
    for (const ir::Op& op : region.ops) {
      if (op.code == OpCode::RefView && swizzled_views.count(op.operands[0])) swizzled_views.insert(op.results[0]);
      // (A swizzled matrix's transpose is read in place as b, K-major: swizzled_smem_tiles.)
      if (op.code == OpCode::RefTranspose && swizzled_views.count(op.operands[0]) && shape_of(op.operands[0]).size() == 2)
        swizzled_b_views.insert(op.results[0]);
      if (op.code == OpCode::RefView && candidates.count(op.operands[0]) && shape_of(op.operands[0]).size() == 3) {
        // (threads, M, N): the thread's own matrix, acc.at(thread index).
        const std::vector<ir::IndexEntry>& e = op.attrs.get_indexer(ir::AttrKey::Index).entries;
        const Shape& shape = shape_of(op.operands[0]);
        const std::optional<int64_t> shift =
            !e.empty() && !e[0].is_slice && e[0].dynamic >= 0
                ? thread_index(op.operands.at(static_cast<size_t>(e[0].dynamic)), true)
                : std::nullopt;
        bool own = shift.has_value() && shift_of.emplace(op.operands[0], shift.value_or(0)).first->second == *shift;
        for (size_t d = 1; d < e.size() && own; ++d) own = whole_dim(e[d], shape[d]);
        if (own)
          matrix_of[op.results[0]] = op.operands[0];
        else
          refused.insert(op.operands[0]);
        continue;
      }
      for (size_t i = 0; i < op.operands.size(); ++i) {
        const ValueId v = op.operands[i];
        if (candidates.count(v) && !matrix_of.count(v)) {
          refused.insert(v);  // a (threads, M, N) buffer itself, or a matrix shared by threads
          continue;
        }
        const auto it = matrix_of.find(v);
        if (it == matrix_of.end()) continue;
        if (op.code == OpCode::GpuWgmma && i == 0 && wgmma_product(op)) {
          AccumulatorRegisters& a = fed[it->second];
          a.m = shape_of(v).at(0), a.n = shape_of(v).at(1);
          if (!swizzled_views.count(op.operands[1]) ||
              !(swizzled_views.count(op.operands[2]) || swizzled_b_views.count(op.operands[2])))
            staged.insert(it->second);
        } else if (!((op.code == OpCode::Load || op.code == OpCode::Store) && i == 0)) {
          refused.insert(it->second);
        }
      }
      for (const ir::Region& sub : op.regions) scan(sub);
    }
  };
  scan(k.body);
  std::map<ValueId, AccumulatorRegisters> out;
  for (auto& [c, a] : fed) {
    if (refused.count(c)) continue;
    // Products reading both operands where they are (swizzled tiles: no staging, which holds at
    // most 128 columns of b) may use wgmma's widest instruction, m64n256k16: half as many
    // instructions, each reading a's 64 rows once for 256 columns instead of twice.
    a.nc = static_cast<int>(Emitter::wgmma_width(a.n, /*in_place=*/!staged.count(c)));
    a.rounds = static_cast<int>(a.m / 64 * (a.n / a.nc));  // one warpgroup's blocks
    if (a.rounds * a.nc / 2 <= 128) out[c] = a;  // (registers per thread, as the ring's)
  }
  return out;
}

RegisterReallocation register_reallocation(const ir::Kernel& k, const std::string& thread_axis, int num_groups) {
  RegisterReallocation out;
  std::function<bool(const ir::Region&)> has_request = [&](const ir::Region& region) {
    for (const ir::Op& op : region.ops) {
      if (op.code == OpCode::GpuSetMaxRegisters) return true;
      for (const ir::Region& sub : op.regions)
        if (has_request(sub)) return true;
    }
    return false;
  };
  if (!has_request(k.body)) return out;
  const std::vector<const ir::Op*> producer = ir::defining_ops(k);
  // A scalar's value in warpgroup w, where it follows from the thread index and constants.
  std::function<std::optional<int64_t>(ValueId, int)> value = [&](ValueId v, int w) -> std::optional<int64_t> {
    const ir::Type& t = k.type(v);
    if (!producer[static_cast<size_t>(v)] || !t.shape.empty() || !(is_integer(t.dtype) || t.dtype == DType::Bool))
      return std::nullopt;
    const ir::Op& op = *producer[static_cast<size_t>(v)];
    if (op.code == OpCode::Constant) return op.attrs.get_scalar(ir::AttrKey::Value).as_int64();
    if (op.code == OpCode::AxisIndex)
      return op.attrs.get_string(ir::AttrKey::AxisNames) == thread_axis ? std::optional<int64_t>(w) : std::nullopt;
    if (op.code == OpCode::Convert || op.code == OpCode::Not) {
      const std::optional<int64_t> a = value(op.operands[0], w);
      if (!a || op.code == OpCode::Convert) return a;
      return k.type(v).dtype == DType::Bool ? int64_t{*a == 0} : ~*a;
    }
    if (op.operands.size() != 2) return std::nullopt;
    const std::optional<int64_t> a = value(op.operands[0], w), b = value(op.operands[1], w);
    if (!a || !b) return std::nullopt;
    switch (op.code) {
      case OpCode::Add: return *a + *b;
      case OpCode::Sub: return *a - *b;
      case OpCode::Mul: return *a * *b;
      case OpCode::Div: return *b != 0 ? std::optional<int64_t>(*a / *b) : std::nullopt;  // (integers: toward zero)
      case OpCode::Rem: return *b != 0 ? std::optional<int64_t>(*a % *b) : std::nullopt;
      case OpCode::Eq: return int64_t{*a == *b};
      case OpCode::Ne: return int64_t{*a != *b};
      case OpCode::Lt: return int64_t{*a < *b};
      case OpCode::Le: return int64_t{*a <= *b};
      case OpCode::Gt: return int64_t{*a > *b};
      case OpCode::Ge: return int64_t{*a >= *b};
      case OpCode::And: return *a & *b;
      case OpCode::Or: return *a | *b;
      default: return std::nullopt;
    }
  };
  // The requests warpgroup w makes, following the branches it takes.
  std::vector<const ir::Op*> requests;
  std::function<bool(const ir::Region&, int)> follow = [&](const ir::Region& region, int w) {
    for (const ir::Op& op : region.ops) {
      if (op.code == OpCode::GpuSetMaxRegisters) {
        requests.push_back(&op);
        continue;
      }
      if (op.regions.empty() || !std::any_of(op.regions.begin(), op.regions.end(), has_request)) continue;
      // A run_scoped's body runs once, in line (emit_pipeline_warp_specialized's requests are there).
      if (op.code == OpCode::RunScoped) {
        if (!follow(op.regions[0], w)) return false;
        continue;
      }
      if (op.code != OpCode::Cond) {
        out.not_emitted = "a set_max_registers inside a " + std::string(op.info().name) + " (" + op.loc.to_string() + ")";
        return false;
      }
      const std::optional<int64_t> taken = value(op.operands[0], w);
      if (!taken) {
        out.not_emitted = "a set_max_registers under a condition (" + op.loc.to_string() + ") that does not follow from the thread index";
        return false;
      }
      if (!follow(op.regions[*taken ? 0 : 1], w)) return false;
    }
    return true;
  };
  // Each warpgroup's registers after its request (0: it makes none), against the CTA's.
  const size_t groups = static_cast<size_t>(std::max(1, num_groups));
  std::vector<int64_t> held(groups, 0);
  std::vector<const ir::Op*> request_of(groups, nullptr);
  for (size_t w = 0; w < groups; ++w) {
    requests.clear();
    if (!follow(k.body, static_cast<int>(w))) return out;
    if (requests.size() > 1) {
      out.not_emitted = "warpgroup " + std::to_string(w) + " sets its registers more than once";
      return out;
    }
    if (!requests.empty()) request_of[w] = requests[0], held[w] = requests[0]->attrs.get_int(ir::AttrKey::N);
  }
  size_t culprit = 0;
  if (const std::string e = eval::setmaxnreg_overflow(held, &culprit); !e.empty()) throw Error(e, request_of[culprit]->loc);
  out.emit = true;
  return out;
}

void Emitter::emit_gpu_op(const ir::Op& op) {
  auto barrier_index = [&](const RefInfo& b) { return "(" + b.ptr + " - " + ctx_.barriers + ")"; };
  switch (op.code) {
    case OpCode::GpuCopyGmemToSmem:
    case OpCode::GpuCopySmemToGmem: {
      const RefInfo& src = ref_operand(*this, op, 0);
      const RefInfo& dst = ref_operand(*this, op, 1);
      const bool to_gmem = op.code == OpCode::GpuCopySmemToGmem;
      // To or from a swizzled tile by a swizzled TMA box, or element by element at the swizzled
      // places; bulk rows cannot permute their chunks.
      const RefInfo& gmem = to_gmem ? dst : src;
      const RefInfo& smem = to_gmem ? src : dst;
      // (commit_group = false: the copy joins the thread's uncommitted bulk copies, no group yet.)
      const bool commit = op.attrs.get_int_or(ir::AttrKey::CommitGroup, 1) != 0;
      if (to_gmem && op.attrs.has(ir::AttrKey::Kind)) {
        // A reduction (reduction_op): each element an atomic update of the destination by the
        // group's threads — done when issued, one valid timing of the asynchronous copy — and an
        // empty bulk group (with commit_group), which wait_smem_to_gmem(n) counts. (cp.reduce.async.bulk
        // would do it in one instruction where the rows allow: not yet.)
        const std::string kind = op.attrs.get_string(ir::AttrKey::Kind), T = ctype(dst.dtype);
        const std::string fn = atomic_new_value(dst.dtype, kind);
        if (fn.empty())
          throw NotSupportedError("copy_smem_to_gmem with reduction_op '" + kind + "' on " +
                                      std::string(dtype_name(dst.dtype)),
                                  op.loc);
        bulk_fenced_ = false;
        before_mem_read();
        before_mem_write();
        open_thread_loop(num_elements(src.shape));
        line("pl_atomic_update(&" + dst.elem("e") + ", [&](" + T + " c) -> " + T + " { " + T + " x = " + src.elem("e") +
             "; return " + fn + "; });");
        close_loop();
        after_mem_read();
        after_mem_write();
        if (commit) line("if (pl_tid() == 0) pl_bulk_store_commit();");
        return;
      }
      const std::string& swizzled = smem.swizzled;
      const std::optional<BulkRows> bulk = swizzled.empty() ? bulk_rows(src, dst) : std::nullopt;
      // A swizzled tile is read in place by wgmma (the async proxy), which does not fence for
      // it: each thread that copied elements into one fences its writes before the group syncs
      // and the copy completes (CUTLASS's order: writers fence, then the barrier).
      auto copy_elements = [&] {  // the group's threads copy the elements
        open_thread_loop(num_elements(src.shape));
        line(dst.elem("e") + " = " + src.elem("e") + ";");
        close_loop();
      };
      // To SMEM, a copy completes on its barrier: thread 0 arrives (with the bytes as expected
      // transactions when bulk). To GMEM, it is one group of thread 0's bulk groups, which
      // wait_smem_to_gmem awaits; a copy the group makes itself commits an empty one, so
      // wait_smem_to_gmem(n) counts copies — groups of them, with commit_group = false.
      const std::string done = to_gmem ? (commit ? "pl_bulk_store_commit()" : "(void)0")
                                       : "pl_mbar_arrive(" + ref_operand(*this, op, 2).ptr + ")";
      // On sm_90 a box of an operand goes by TMA when its map was encoded and the shared memory is
      // 128-byte aligned (checked when running), as one box; else as bulk rows or elements.
      // A tile of several panels (rows wider than 128 bytes) takes a box per panel, a matrix at a
      // time (its views keep every row; leading dims of one).
      const int64_t row_bytes = swizzled.empty() ? 0 : smem.shape.back() * itemsize(smem.dtype);
      const int swizzle_bytes = static_cast<int>(std::min<int64_t>(row_bytes, 128));
      const int64_t panels = smem.panel_cols > 0 ? row_bytes / 128 : 1, panel_cols = 128 / itemsize(smem.dtype);
      bool one_matrix = true;
      for (size_t d = 0; d + 2 < smem.shape.size(); ++d) one_matrix = one_matrix && smem.shape[d] == 1;
      std::optional<TensorMapSpec> tma = !ctx_.tensor_maps || (panels > 1 && !one_matrix)
                                             ? std::nullopt
                                             : tma_box(gmem, smem, swizzle_bytes, panels > 1 ? panel_cols : 0);
      // A multicast copy goes as TMA's: each peer copies its share (a box) into the same place of
      // every peer's shared memory (cp.async.bulk.tensor ... multicast::cluster), completing on
      // each one's barrier there, and expects the whole copy's bytes on its own. Where the share
      // is a box landing densely from an aligned start — the dims before the one it splits are
      // 1; a swizzled tile's share is whole rows from a multiple of 8 of them — else each CTA
      // copies the whole block itself, as for a plain copy: the same bytes land, with no peer to
      // wait for. (Whether the TMA branch runs is the same in every CTA: the host's encoded maps,
      // addresses in scratch laid out alike, compile-time layouts.)
      const MulticastPeers peers = to_gmem ? MulticastPeers{} : multicast_peers(ctx_, op);
      std::optional<MulticastShare> share;
      if (ctx_.tensor_maps && (panels == 1 || one_matrix) && peers.count > 1)
        share = multicast_share(gmem, smem, peers.count, swizzle_bytes, panels > 1 ? panel_cols : 0);
      if (share) tma = share->box;  // (else the whole block, a box or not, as for a plain copy)
      const bool multicast = share.has_value();
      int map = -1;
      if (tma) {
        std::vector<TensorMapSpec>& maps = *ctx_.tensor_maps;
        if (const auto same = std::find(maps.begin(), maps.end(), *tma); same != maps.end())
          map = static_cast<int>(same - maps.begin());
        if (map < 0 && maps.size() < 64) {  // (PlParams::tma_ok has a bit per map)
          map = static_cast<int>(maps.size());
          maps.push_back(*tma);
        }
        if (map < 0) tma.reset();
      }
      if (tma || bulk) {
        // The group's earlier accesses (a consumer's reads of the slot, writes of the source)
        // come before the copy: each thread fences its own, then the group syncs.
        if (to_gmem && ctx_.bulk_stores) ++*ctx_.bulk_stores;
        // (Not again for the next copy where no access came in between: the pipeline's copies of
        // a step's blocks.)
        if (!bulk_fenced_ || tile_written_ || mem_written_ || mem_read_) {
          line("pl_fence_before_bulk_copy();");
          just_synced_ = false;
          barrier();
        }
        bulk_fenced_ = true;
        if (tma) {
          // The box's start in the array, innermost dim first, from the view's element offset.
          const size_t rank = tma->dims.size();
          const std::vector<int64_t> as = contiguous_strides(gmem.operand_shape);
          const std::string T = ctype(gmem.dtype), M = std::to_string(map), P = ctx_.params;
          std::string coords;
          for (size_t i = 0; i < rank; ++i) {
            const size_t d = rank - 1 - i;
            coords += (i ? ", " : "") + std::string("(int)(off / ") + std::to_string(as[d]) + " % " +
                      std::to_string(gmem.operand_shape[d]) + ")";
          }
          // (A swizzled box lands by its address bits: only where the tile is swizzled, from a
          // boundary of its pattern, 8 rows.)
          const std::string layout_ok = swizzled.empty() ? "" : swizzled + " && ";
          const std::string align_mask = std::to_string(swizzle_bytes ? 8 * swizzle_bytes - 1 : 127);
          line("if (PL_HAS_BULK_COPY && " + layout_ok + "((" + P + ".tma_ok >> " + M + ") & 1u) && ((pl_u64)" + smem.ptr + " & " +
               align_mask + ") == 0) {");
          line("  if (pl_tid() == 0) {");
          std::string smem_start = smem.ptr, share_offset;
          if (multicast) {  // by the cluster rank: the peers, this CTA's share among them
            line("    const int rank = pl_cluster_rank();");
            line("    const pl_u32 peers = " + table_entry(peers.mask, "u", "rank") + ";");
            line("    const pl_i64 share = " + table_entry(peers.share, "", "rank") + ";  // (of " +
                 std::to_string(peers.count) + ")");
            share_offset = " + share * " + std::to_string(share->gmem_step);
            smem_start = "(" + smem.ptr + " + share * " + std::to_string(share->smem_step) + ")";
          }
          line("    const pl_i64 off = (pl_i64)(" + gmem.ptr + " - (" + T + "*)" + P + ".op[" + std::to_string(gmem.operand) +
               "])" + share_offset + ";");
          line("    const int c[" + std::to_string(rank) + "] = {" + coords + "};");
          const std::string R = std::to_string(rank), map_ptr = "&" + P + ".tmap[" + M + "]";
          // One box (panel 0), or panel q: columns q P.. of every row, after q panels of the matrix.
          auto each_box = [&](const std::function<std::string(const std::string& smem_at, const std::string& c)>& issue) {
            if (panels == 1) return line("    " + issue(smem_start, "c"));
            const std::string n = std::to_string(panel_cols);
            line("    for (int q = 0; q < " + std::to_string(panels) + "; ++q) {");
            line("      int cq[" + R + "];");
            line("      for (int d = 0; d < " + R + "; ++d) cq[d] = c[d] + (d == 0 ? q * " + n + " : 0);");
            line("      " + issue(smem_start + " + q * " + std::to_string(smem.panel_rows) + " * " + n, "cq"));
            line("    }");
          };
          if (to_gmem) {
            each_box([&](const std::string& at, const std::string& c) {
              return "pl_tma_store<" + R + ">(" + map_ptr + ", " + c + ", " + at + ");";
            });
            if (commit) line("    pl_bulk_store_commit();");
          } else {
            const std::string b = ref_operand(*this, op, 2).ptr;
            int64_t bytes = tma->elem_bytes * panels * (multicast ? peers.count : 1);  // (every peer's share)
            for (uint32_t x : tma->box) bytes *= x;
            line("    pl_expect_tx(" + b + ", " + std::to_string(bytes) + "u);");
            each_box([&](const std::string& at, const std::string& c) {
              if (multicast)
                return "pl_tma_load_multicast<" + R + ">(" + at + ", " + map_ptr + ", " + c + ", " + b + ", peers);";
              return "pl_tma_load<" + R + ">(" + at + ", " + map_ptr + ", " + c + ", " + b + ");";
            });
          }
          line("  }");
          line(bulk ? "} else" : "} else {");
        }
        // The last branch: the group copies the elements, syncs, and thread 0 completes the copy.
        auto elements_branch = [&] {
          ++indent_;
          copy_elements();
          if (!swizzled.empty() && !to_gmem) line("pl_fence_proxy_async();");  // (wgmma reads the tile in place)
          line("pl_sync();");
          line("if (pl_tid() == 0) " + done + ";");
          --indent_;
          line("}");
        };
        if (!bulk) {
          elements_branch();
          return;
        }
        const std::string rows = std::to_string(bulk->dst_stride) + ", " + src.ptr + ", " +
                                 std::to_string(bulk->src_stride) + ", " + std::to_string(bulk->rows) + ", " +
                                 std::to_string(bulk->row_bytes) + "u";
        line("if (pl_bulk_ok(" + src.ptr + ", " + dst.ptr + ")) {");
        line(to_gmem ? "  if (pl_tid() == 0) pl_bulk_store_rows(" + dst.ptr + ", " + rows + ", " + (commit ? "true" : "false") + ");"
                     : "  if (pl_tid() == 0) pl_bulk_copy_rows(" + dst.ptr + ", " + rows + ", " +
                           ref_operand(*this, op, 2).ptr + ");");
        line("} else {");
        elements_branch();
        return;
      }
      bulk_fenced_ = false;  // (generic accesses, unfenced)
      before_mem_read();
      before_mem_write();
      copy_elements();
      after_mem_read();
      after_mem_write();
      if (!swizzled.empty() && !to_gmem) line("pl_fence_proxy_async();");  // (wgmma reads the tile in place)
      if (!to_gmem) barrier();
      line("if (pl_tid() == 0) " + done + ";");
      return;
    }
    case OpCode::NamedRegionBegin:
    case OpCode::NamedRegionEnd: {
      if (!ctx_.region_names) return;  // not profiling
      std::vector<std::string>& names = *ctx_.region_names;
      const std::string& name = op.attrs.get_string(ir::AttrKey::Name);
      const size_t id = static_cast<size_t>(std::find(names.begin(), names.end(), name) - names.begin());
      if (id == names.size()) names.push_back(name);
      const bool exit = op.code == OpCode::NamedRegionEnd;
      // A region ends when the whole group is done with its work (tile ops are loops of the
      // group's threads), so its exit time covers them all.
      if (exit) barrier();
      line("pl_prof_record(" + ctx_.profile_slot + ", " + std::to_string(2 * id + (exit ? 1 : 0)) + "ull);");
      return;
    }
    case OpCode::GpuBarrierArrive: {
      barrier();
      const RefInfo& b = ref_operand(*this, op, 0);
      if (ctx_.cluster_barriers)
        line("if (pl_tid() == 0) pl_mbar_arrive_peers(" + b.ptr + ", pl_mbar_peers(" + barrier_index(b) + "));");
      else
        line("if (pl_tid() == 0) pl_mbar_arrive(" + b.ptr + ");");
      return;
    }
    case OpCode::GpuBarrierWait: {
      const RefInfo& b = ref_operand(*this, op, 0);
      const int site = add_op_site(*ctx_.error_sites, ErrorSite::Kind::BarrierWait, op);
      // The group decides together: a thread whose wait gave up takes its whole group out, so no
      // thread is left at a group barrier the others never reach.
      line("if (!pl_group_all(pl_mbar_wait(" + b.ptr + ", " + ctx_.phases + ", " + barrier_index(b) + ", " +
           ctx_.params + ".err))) " + record_failure(site, {}));
      return;
    }
    case OpCode::SemaphoreSignal:
    case OpCode::SemaphoreWait:
    case OpCode::SemaphoreRead:
      emit_semaphore_op(op);
      return;
    case OpCode::GpuCommitSmem:
      barrier();
      return;
    case OpCode::GpuAsyncPrefetch: {
      // Each 128-byte line of the view, the group's threads in turn: rows of consecutive
      // elements by their lines, any other view element by element (each element's line).
      // With collective_axes, the CTAs differing only along those cluster axes split them: the
      // CTA whose index among them is `share` takes lines share, share + peers, ...
      const RefInfo& g = ref_operand(*this, op, 0);
      const int64_t item = itemsize(g.dtype);
      int64_t peers = 1;
      std::string share = "0";
      if (op.attrs.has(ir::AttrKey::Axes)) {
        share.clear();
        for (int64_t mesh_axis : op.attrs.get_ints(ir::AttrKey::Axes)) {
          const ClusterAxis axis = cluster_axis(mesh_axis);
          share = (share.empty() ? "" : "(" + share + ") * " + std::to_string(axis.size) + " + ") + axis.coordinate;
          peers *= axis.size;
        }
      }
      auto open_share_loop = [&](int64_t n) {
        if (peers == 1) return open_thread_loop(n);
        const std::string P = std::to_string(peers);
        line("#pragma unroll 1");
        line("for (pl_i64 e = (" + share + ") + pl_tid() * " + P + "LL; e < " + std::to_string(n) + "; e += pl_nthreads() * " +
             P + "LL) {");
        ++indent_;
      };
      const std::optional<int64_t> row_stride = uniform_row_stride(g);
      if (row_stride && !g.shape.empty()) {
        const int64_t row = g.shape.back(), rows = num_elements(g.shape) / std::max<int64_t>(row, 1);
        const int64_t per_line = std::max<int64_t>(1, 128 / item), lines = (row + per_line - 1) / per_line;
        open_share_loop(rows * lines);
        line("pl_prefetch_l2(" + g.ptr + " + (e / " + std::to_string(lines) + ") * " + std::to_string(*row_stride) +
             "LL + (e % " + std::to_string(lines) + ") * " + std::to_string(per_line) + "LL);");
        close_loop();
      } else {
        open_share_loop(num_elements(g.shape));
        line("pl_prefetch_l2(&" + g.elem("e") + ");");
        close_loop();
      }
      return;
    }
    case OpCode::GpuCommitSmemToGmemGroup:
      // Thread 0 issued the group's bulk copies: it commits them (an empty group when there are
      // none: wait_smem_to_gmem counts it, as the interpreter does). The group's element copies
      // and its earlier writes are ordered before a later copy's reads by that copy's own sync.
      line("if (pl_tid() == 0) pl_bulk_store_commit();");
      return;
    case OpCode::GpuWaitSmemToGmem: {
      // Thread 0 issued the group's bulk copies; it waits, then the group syncs.
      const std::string n = std::to_string(op.attrs.get_int(ir::AttrKey::N));
      const bool read_only = op.attrs.get_int(ir::AttrKey::ReadOnly) != 0;
      line(std::string("if (pl_tid() == 0) pl_bulk_store_wait<") + n + ", " + (read_only ? "true" : "false") + ">();");
      just_synced_ = false;
      barrier();
      return;
    }
    case OpCode::GpuWgmmaWait: {
      // The products into ACCs in registers run on (pl_tc_dot_acc); any other is done when issued.
      const std::string n = std::to_string(op.attrs.get_int(ir::AttrKey::N));
      std::set<std::string> vars;
      for (const auto& [ref, acc] : kernel_accs_) vars.insert(acc.var);
      for (const std::string& var : vars) line("pl_acc_wait<" + n + ">(" + var + ");");
      if (vars.empty()) line("// complete: the group's products are done when issued");
      return;
    }
    case OpCode::GpuSetMaxRegisters: {
      const bool increase = op.attrs.get_string(ir::AttrKey::Kind) == "increase";
      const std::string n = std::to_string(op.attrs.get_int(ir::AttrKey::N));
      if (ctx_.registers.emit)
        line("pl_setmaxnreg<" + n + ", " + (increase ? "true" : "false") + ">();");
      else
        line("// setmaxnreg." + std::string(increase ? "inc " : "dec ") + n + ": a hint, not emitted: " + ctx_.registers.not_emitted);
      return;
    }
    case OpCode::GpuWgmma: {
      // a in registers: a register tile (emit_wgmma_from_registers), else its tile (row-major in
      // the group's arena; not swizzled, so staged for wgmma, which copies it before the
      // instruction is issued: nothing reads the tile after).
      const ValueInfo& av = info(op.operands[1]);
      if (av.kind == ValueInfo::Kind::Fragment) return emit_wgmma_from_registers(op);
      PALLAS_INTERNAL_CHECK(av.kind == ValueInfo::Kind::Ref || av.kind == ValueInfo::Kind::Tile,
                            "wgmma's a is neither a Ref nor a tile");
      const ir::Type& at = type(op.operands[1]);
      return emit_wgmma(op, av.kind == ValueInfo::Kind::Ref ? av.ref : RefInfo{av.name, at.dtype, at.shape, contiguous_strides(at.shape)});
    }
    default: break;
  }
  throw InternalError("gpu emitter: " + std::string(op.info().name) + " is not a gpu::kernel primitive");
}

void Emitter::emit_wgmma(const ir::Op& op, const RefInfo& a) {
  const RefInfo& acc = ref_operand(*this, op, 0);
  const RefInfo& b = ref_operand(*this, op, 2);
  const int64_t m = acc.shape.at(0), n = acc.shape.at(1), k = a.shape.at(1);
  const AccumulatorRegisters* kacc = kernel_acc(op.operands[0]);
  before_mem_read();
  before_mem_write();
  // On tensor cores (wgmma / mma.sync) when the layouts allow: row-major a and acc, b
  // row-major or (n, k) strides; else (and for a group that is not whole warps) the loop below.
  bool on_tensor_cores = false;
  const bool b_kn = b.strides.at(1) == 1, b_nk = !b_kn && b.strides.at(0) == 1;
  if (a.strides.at(1) == 1 && acc.strides.at(1) == 1 && (b_kn || b_nk)) {
    MmaProduct p;
    p.d = acc.ptr, p.a = a.ptr, p.b = b.ptr;
    p.ldd = acc.strides[0], p.lda = a.strides[0], p.ldb = b_nk ? b.strides[1] : b.strides[0];
    p.b_nk = b_nk;
    p.d_dtype = acc.dtype, p.a_dtype = a.dtype, p.b_dtype = b.dtype;
    p.m = m, p.n = n, p.k = k;
    p.accumulate = true;
    // A swizzled tile (one panel: k or n is its row) is read in place: a K-major, b (k x n)
    // MN-major — wgmma's swizzled layouts, which store a single panel alike.
    // A transposed (n, k) tile (b.T()) is b K-major, as a is.
    if (!a.swizzled.empty()) p.a_layout = "pl_swizzled_layout(" + a.swizzled + ", false)";
    if (!b.swizzled.empty()) p.b_layout = "pl_swizzled_layout(" + b.swizzled + ", " + (b_nk ? "false" : "true") + ")";
    // Into an ACC in registers: left running until the kernel's wgmma_wait.
    if (kacc && tensor_core_shape(p))
      p.acc_rounds = kacc->rounds, p.acc_nc = kacc->nc, p.acc_var = kacc->var, p.acc_pending = "PL_KERNEL_WGMMA_PENDING";
    on_tensor_cores = open_tensor_core_product(p);
  }
  // The loop below reads and writes the ACC's memory: the registers go there first.
  if (kacc && !on_tensor_cores)
    line(kacc->flush(acc.ptr, acc.strides[0]));
  // The group's loop (where the tensor cores do not run), reading swizzled tiles where they are.
  auto element = [&](const RefInfo& r, const std::string& offset) { return widen(r.dtype, r.at_offset(offset)); };
  open_thread_loop(m * n);
  line("const pl_i64 i = e / " + std::to_string(n) + ", j = e % " + std::to_string(n) + ";");
  line("float s = 0;");
  line("for (pl_i64 k = 0; k < " + std::to_string(k) + "; ++k) s += (float)" +
       element(a, "i * " + std::to_string(a.strides[0]) + " + k * " + std::to_string(a.strides[1])) + " * (float)" +
       element(b, "k * " + std::to_string(b.strides[0]) + " + j * " + std::to_string(b.strides[1])) + ";");
  const std::string c = acc.ptr + "[i * " + std::to_string(acc.strides[0]) + " + j * " + std::to_string(acc.strides[1]) + "]";
  line(c + " = " + narrow(acc.dtype, "(float)" + widen(acc.dtype, c) + " + s") + ";");
  close_loop();
  if (on_tensor_cores) close_loop();
  after_mem_read();
  after_mem_write();
}

void Emitter::emit_semaphore_op(const ir::Op& op) {
  const std::string name(op.info().name);
  const RefInfo& sem = ref_operand(*this, op, 0);
  if (sem.dtype != DType::Semaphore || !sem.shape.empty())
    throw NotSupportedError(name + " on the GPU backend on " + std::string(dtype_name(sem.dtype)) +
                                " (a TPU semaphore: run the kernel with .interpret = pltpu::InterpretParams{}); "
                                "a gpu::kernel's semaphores are gpu::Semaphore{...}",
                            op.loc);
  if (op.code == OpCode::SemaphoreSignal &&
      (op.attrs.get_int_or(ir::AttrKey::HasCoreIndex, 0) != 0 || op.attrs.has(ir::AttrKey::DeviceIdType)))
    throw NotSupportedError("semaphore_signal to another core or device on the GPU backend", op.loc);
  const std::string counter = "(" + sem.ptr + ")";
  if (op.code == OpCode::SemaphoreRead) {
    before_mem_read();  // (the group's writes of the counters before, a scope's zeroing among them)
    std::string slot = scalar_slot_begin(op.results[0]);
    line("if (pl_tid() == 0) " + slot + "[0] = pl_sem_read(" + counter + ");");
    scalar_slot_end(op.results[0], slot);
    return;
  }
  const std::string n = "(pl_i32)" + at(op.operands[1], "0");
  const bool signal = op.code == OpCode::SemaphoreSignal;
  // The group's barrier that checks the count also orders its earlier writes before a signal.
  const int bad = add_op_site(*ctx_.error_sites, ErrorSite::Kind::SemaphoreValue, op);
  line("if (!pl_group_all(" + n + " >= 0)) " + record_failure(bad, {"(pl_i64)" + n}));
  if (signal) {
    line("if (pl_tid() == 0) pl_sem_signal(" + counter + ", " + n + ");");
    return;
  }
  const bool decrement = op.attrs.get_int_or(ir::AttrKey::Decrement, 1) != 0;
  const int stuck = add_op_site(*ctx_.error_sites, ErrorSite::Kind::SemaphoreWait, op);
  line("if (!pl_group_all(pl_tid() != 0 || pl_sem_wait(" + counter + ", " + n + ", " + (decrement ? "true" : "false") +
       ", " + ctx_.params + ".err))) " + record_failure(stuck, {}));
}

}  // namespace pallas::gpu::detail
