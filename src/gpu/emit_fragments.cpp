// Register tiles: array values that a gpu::kernel keeps in its warpgroups' registers, in wgmma's
// accumulator layout (Mosaic GPU's WGMMA layout; FragmentLayout in emitter.h), instead of in the
// arena in shared memory.
//
// Where they come from: a whole load of an ACC whose wgmma run in registers (`s = acc[...]`,
// attention's scores) copies the registers, and an elementwise op reading such values at its own
// index runs its loop over the thread's registers (each thread computes the elements it holds).
// What keeps a value in registers (plan_fragments): every use reads it in that layout — an
// elementwise op of its shape, a reduction of its rows (the quad of lanes holding a row combine by
// two shuffles), or a whole store to memory — in its own region (not a loop carry, not yielded).
// A value with any other use is a tile in the arena as before; an elementwise op reading register
// tiles but writing such a tile still runs in the registers' layout, then syncs the group (its
// threads wrote elements other threads own in the arena's loops).
//
// So attention's softmax runs in registers: its scores never go through shared memory, the row
// maxima and sums are shuffles, and the output accumulator goes from its registers to global
// memory in the epilogue. The layout is the same on every target (it is just an assignment of
// elements to threads): only the copy from an ACC's registers needs wgmma; where the ACC is in
// memory, the load reads it there in the registers' layout.
//
// A pallas_call (eight warps, one program) has no ACCs: its register tiles take the blocked
// layout (FragmentLayout::warps: a row per warp, a column per lane), starting from whole loads of
// its blocks, with rows and columns layouts of their own (a softmax's row maxima, a layer norm's
// gamma). The planning is the same; the loops, reductions and guards have a blocked branch.
#include "gpu/emitter.h"

#include <algorithm>

namespace pallas::gpu::detail {

using ir::OpCode;
using ir::ValueId;

namespace {
// A store of a value (operand 1) through a static view, unmasked: its loop can be the value's.
bool whole_value_store(const ir::Op& op) {
  return op.code == OpCode::Store && op.operands.size() == 2 && op.attrs.get_int_or(ir::AttrKey::Masked, 0) == 0;
}
bool reshapes(OpCode c) { return c == OpCode::Reshape || c == OpCode::Squeeze || c == OpCode::ExpandDims; }
// An op whose results are what a region of it yields, which may be register tiles: a loop's
// carries (a fori_loop's, a while_loop's), a run_scoped's results (its body runs once, in line),
// a cond's or switch's (what the branch taken yields).
bool carries_region_values(const ir::Op& op) {
  if (op.results.empty()) return false;
  if (op.code == OpCode::While) return op.regions.size() == 2;
  if (op.code == OpCode::Cond || op.code == OpCode::Switch) return !op.regions.empty();
  return (op.code == OpCode::For || op.code == OpCode::RunScoped) && op.regions.size() == 1;
}
// Those regions: a while_loop's body (its second, after the condition), each branch.
std::vector<const ir::Region*> yielding_regions(const ir::Op& op) {
  if (op.code == OpCode::While) return {&op.regions[1]};
  std::vector<const ir::Region*> out;
  for (const ir::Region& r : op.regions) out.push_back(&r);
  return out;
}
// The regions whose args from `first` on are a loop's carries: a fori_loop's body (after the
// index), a while_loop's condition and body (a run_scoped's body takes none).
std::vector<std::pair<const ir::Region*, size_t>> carry_takers(const ir::Op& loop) {
  if (loop.code == OpCode::For) return {{&loop.regions[0], 1}};
  if (loop.code == OpCode::While) return {{&loop.regions[0], 0}, {&loop.regions[1], 0}};
  return {};
}
// The reductions a register tile takes (fragment_reduction_kind says along which axes).
bool row_reduction(OpCode c) {
  return c == OpCode::ReduceSum || c == OpCode::ReduceMax || c == OpCode::ReduceMin || c == OpCode::ReduceProd ||
         c == OpCode::Argmax || c == OpCode::Argmin;
}
bool arg_reduction(OpCode c) { return c == OpCode::Argmax || c == OpCode::Argmin; }
// A scan a blocked tile takes in registers where its rows lie in one warp (Emitter::blocked_row_scan):
// along the rows, forward or reverse.
bool row_scan(const ir::Op& op) {
  const bool scan = op.code == OpCode::Cumsum || op.code == OpCode::Cumprod || op.code == OpCode::Cummax ||
                    op.code == OpCode::Cummin;
  return scan && op.operands.size() == 1 && op.attrs.get_int(ir::AttrKey::Axis) == 1;
}
}  // namespace

std::optional<FragmentLayout> rows_of(const FragmentLayout& t) {
  if (t.blocked()) {
    if (t.rows || t.cols) return std::nullopt;
    FragmentLayout r = t;
    r.n = 1;
    r.rows = true;
    return r;
  }
  if (t.rows || t.m % 64 != 0 || (t.warpgroups != 1 && t.blocks_n() != 1)) return std::nullopt;
  FragmentLayout r{t.m, 1, 0, t.warpgroups == 1 ? static_cast<int>(t.m / 64) : t.rounds, t.warpgroups, /*rows=*/true};
  return r;
}

std::optional<FragmentLayout> cols_of(const FragmentLayout& t) {
  if (!t.blocked() || t.rows || t.cols) return std::nullopt;
  FragmentLayout c = t;
  c.m = 1;
  c.cols = true;
  return c;
}

bool fits_layout(const FragmentLayout& l, const Shape& s) {
  if (l.cols) return s == Shape{l.n} || s == Shape{1, l.n};
  return l.rows ? s == Shape{l.m} || s == Shape{l.m, 1} : s == Shape{l.m, l.n};
}

void Emitter::FragmentReads::add_layout(const FragmentLayout& l) {
  if (layout && !(*layout == l)) conflict = true;
  layout = l;
}

FragmentLayout Emitter::acc_layout(const AccumulatorRegisters& a) const {
  return FragmentLayout{a.m, a.n, a.nc, a.rounds, std::max(1, ctx_.group_threads / 128)};
}

void Emitter::fragment_read(ValueId v, const std::function<const FragmentLayout*(ValueId)>& layout_of,
                            FragmentReads& reads) const {
  if (const FragmentLayout* l = layout_of(v)) return reads.add_layout(*l);
  const auto it = fused_producers_.find(v);
  if (it == fused_producers_.end()) {
    if (!type(v).shape.empty()) reads.across = reads.arena = true;  // a tile: written in another layout
    return;
  }
  const ir::Op& p = *it->second;
  if (p.code == OpCode::Load || p.code == OpCode::Constant) return;  // memory at the element's index
  // A rows value seen through reshapes between (m) and (m, 1), or a columns value between (n) and
  // (1, n): the same element at the same index.
  auto line_through_reshapes = [&](ValueId x) -> const FragmentLayout* {
    for (;;) {
      if (const FragmentLayout* l = layout_of(x))
        return (l->rows || l->cols) && fits_layout(*l, type(x).shape) ? l : nullptr;
      const auto f = fused_producers_.find(x);
      if (f == fused_producers_.end() || !reshapes(f->second->code)) return nullptr;
      x = f->second->operands[0];
    }
  };
  if (reshapes(p.code)) {
    if (const FragmentLayout* r = line_through_reshapes(p.operands[0]); r && fits_layout(*r, type(v).shape))
      return reads.add_layout(*r);
    // Between (k) and (k, 1), or (k) and (1, k): each element at the same index in the same line
    // layout (rows fit the first pair, columns the second) — `mx + log(l)` squeezed for a store.
    auto line_like = [](const Shape& s, size_t unit) { return s.size() == 1 || (s.size() == 2 && s[unit] == 1); };
    const Shape& xs = type(p.operands[0]).shape;
    const Shape& vs = type(v).shape;
    if (num_elements(xs) == num_elements(vs) && ((line_like(xs, 1) && line_like(vs, 1)) || (line_like(xs, 0) && line_like(vs, 0))))
      return fragment_read(p.operands[0], layout_of, reads);
  }
  if (p.code == OpCode::BroadcastInDim) {
    // A rows value along the rows of an (m, n) tile: in a loop of that tile, its register of the
    // element's row (rows_register).
    const ValueId x = p.operands[0];
    const Shape& xs = type(x).shape;
    const Shape& rs = type(v).shape;
    const ir::Ints& dims = p.attrs.get_ints(ir::AttrKey::Dims);
    const bool along_rows = rs.size() == 2 && !dims.empty() && dims[0] == 0 && (xs.size() == 1 || (xs.size() == 2 && xs[1] == 1));
    const FragmentLayout* r = line_through_reshapes(x);
    if (r && r->rows && along_rows && rs[0] == r->m) {
      if (reads.rows && !(*reads.rows == *r)) reads.conflict = true;
      reads.rows = *r;
      return;
    }
    // A columns value along the columns of a blocked tile: its register of the element's column.
    const bool along_cols = rs.size() == 2 && ((xs.size() == 1 && dims == ir::Ints{1}) ||
                                               (xs.size() == 2 && xs[0] == 1 && dims == ir::Ints{0, 1}));
    if (r && r->cols && along_cols && rs[1] == r->n) {
      if (reads.cols && !(*reads.cols == *r)) reads.conflict = true;
      reads.cols = *r;
      return;
    }
  }
  if (p.code == OpCode::BroadcastInDim || reshapes(p.code)) {
    // Reads its operand at other indices: a register tile there is not the loop's register.
    reads.across = true;
    FragmentReads under;
    fragment_read(p.operands[0], layout_of, under);
    if (under.layout || under.rows || under.cols || under.conflict) reads.conflict = true;
    reads.arena = reads.arena || under.arena;
    return;
  }
  for (ValueId o : p.operands) fragment_read(o, layout_of, reads);
}

Emitter::FragmentReads Emitter::fragment_reads(const ir::Op& op, size_t first,
                                               const std::function<const FragmentLayout*(ValueId)>& layout_of,
                                               const FragmentLayout* loop) const {
  FragmentReads reads;
  if (loop) reads.add_layout(*loop);
  for (size_t i = first; i < op.operands.size(); ++i) fragment_read(op.operands[i], layout_of, reads);
  if ((reads.rows || reads.cols) && !reads.layout) {
    // Rows broadcast along an (m, n) value that reads no register tile: its loop runs in a tile
    // layout of those rows (one block of n columns per row band; the blocked layout of those
    // rows), the compiler's choice.
    const ir::Type& t = type(op.code == OpCode::Store ? op.operands.back() : op.results.at(0));
    const Shape& shape = t.shape;
    if (!reads.rows || reads.rows->blocked()) {
      if (const std::optional<FragmentLayout> b = blocked_layout(t)) reads.layout = b;  // (checked below)
    } else if (shape.size() == 2 && shape[0] == reads.rows->m && shape[1] % 8 == 0 && shape[1] <= 256 &&
        reads.rows->rounds * shape[1] / 2 <= 128)  // (registers per thread: as an ACC's at most)
      reads.layout = FragmentLayout{reads.rows->m, shape[1], static_cast<int>(shape[1]), reads.rows->rounds, reads.rows->warpgroups};
  }
  if (reads.rows && (!reads.layout || rows_of(*reads.layout) != reads.rows)) reads.conflict = true;
  if (reads.cols && (!reads.layout || cols_of(*reads.layout) != reads.cols)) reads.conflict = true;
  return reads;
}

std::optional<FragmentLayout> Emitter::fragment_loop_of(const ir::Op& op, bool& across, const FragmentLayout* loop) const {
  auto layout_of = [this](ValueId v) { return register_layout(v); };
  const bool store = op.code == OpCode::Store;
  if (store && !whole_value_store(op)) return std::nullopt;
  const FragmentReads reads = fragment_reads(op, store ? 1 : 0, layout_of, loop);
  PALLAS_INTERNAL_CHECK(!reads.conflict, "gpu emitter: an op reads register tiles of two layouts");
  across = reads.across;
  if (!loop && !reads.layout && op.results.size() == 1) {
    // A register tile planned of an op reading none (a blocked tile's first op: plan_fragments).
    if (const auto it = fragments_.find(op.results[0]); it != fragments_.end()) return it->second;
  }
  if (!loop) return reads.layout;
  // In the given loop only where it reads register tiles.
  const FragmentReads own = fragment_reads(op, store ? 1 : 0, layout_of);
  return own.layout || own.rows || own.cols ? reads.layout : std::nullopt;
}

void Emitter::plan_fragments(const ir::Region& r, const std::function<const AccumulatorRegisters*(ValueId)>& acc_of) {
  // Forget an earlier plan of r (a loop's body is planned again for each try of its carries).
  for (ValueId a : r.args) fragments_.erase(a);
  for (const ir::Op& op : r.ops) {
    for (ValueId v : op.results) fragments_.erase(v), fragment_mirrors_.erase(v);
    for (const ir::Region& s : op.regions) captured_offers_.erase(&s);  // (offered again below)
  }
  captures_kept_.erase(&r);
  if (!ctx_.register_tiles || ctx_.group_threads <= 0 || ctx_.group_threads % (ctx_.blocked_tiles ? 32 : 128) != 0) return;
  const int warpgroups = ctx_.group_threads / 128;
  // Control ops more than kCarryPlanningDepth levels deep keep their carries and results in the
  // arena, and read what they capture there.
  const auto depth = region_depth_.find(&r);
  const bool plans_carries = depth == region_depth_.end() || depth->second < kCarryPlanningDepth;
  // The ops of r using each value, and making each; the ops of r whose regions read a value made
  // outside them (captured_by: offered to those regions in its layout, below) — past the depth
  // cap, such a value escapes r (it is in the arena).
  std::map<ValueId, std::vector<size_t>> users, captured_by;
  std::map<ValueId, size_t> made_by;
  std::set<ValueId> escapes;
  for (size_t i = 0; i < r.ops.size(); ++i) {
    const ir::Op& op = r.ops[i];
    for (ValueId v : op.operands) users[v].push_back(i);
    for (ValueId v : op.results) made_by[v] = i;
    for (const ir::Region& s : op.regions)
      for (ValueId v : outer_reads(s)) {
        if (!plans_carries) escapes.insert(v);
        else if (std::vector<size_t>& by = captured_by[v]; by.empty() || by.back() != i) by.push_back(i);
      }
  }
  // The register tiles of enclosing regions that r reads, offered in their layouts (roots of this
  // plan, as carried args are): r keeps those every use here reads so (captures_kept_).
  const std::map<ValueId, FragmentLayout> captured = [&] {
    const auto it = captured_offers_.find(&r);
    return it == captured_offers_.end() ? std::map<ValueId, FragmentLayout>{} : it->second;
  }();
  const auto yields_it = fragment_yields_.find(&r);
  const bool discovery = fragment_discovery_.count(&r) > 0;
  auto fused = [&](const ir::Op& op) { return op.results.size() == 1 && fused_producers_.count(op.results[0]); };
  // The roots: whole loads of an ACC in registers that nothing else takes (in a pallas_call, whole
  // loads of memory in the blocked layout), products on wgmma, r's args that its loop carries in
  // registers, and the results of r's loops whose carries may be.
  std::map<ValueId, FragmentLayout> roots;
  // A product's f32 result, on wgmma: in wgmma's accumulator layout, its 64 x nc blocks dealt to
  // the warpgroups in rounds as the register accumulator's (not one added in place to an
  // accumulator, accumulating_dots_; at most 128 registers a thread): attention's scores.
  std::map<int64_t, FragmentLayout> product_rows;  // (the rows layouts of those, by their rows)
  for (const ir::Op& op : r.ops) {
    MmaProduct p;
    if (warpgroups == 0 || op.results.size() != 1 || accumulating_dots_.count(&op) || !plain_product(op, p) ||
        !wgmma_shape(p) || p.d_dtype != DType::F32)
      continue;
    const int nc = static_cast<int>(wgmma_width(p.n));
    const int64_t blocks = p.m / 64 * (p.n / nc);
    const FragmentLayout l{p.m, p.n, nc, static_cast<int>((blocks + warpgroups - 1) / warpgroups), warpgroups};
    if (l.registers() > 128) continue;
    roots[op.results[0]] = l;
    if (const std::optional<FragmentLayout> rows = rows_of(l)) product_rows.emplace(p.m, *rows);
  }
  // The layout a value of r starts in (a whole load, an elementwise op of memory): an (m) or
  // (m, 1) value beside products of m rows takes their rows layout (below); an (n) or (1, n)
  // value broadcast along a tile's columns takes that tile's columns layout (its warps per row);
  // else the blocked layout of its type.
  auto blocked_start = [&](ValueId v) -> std::optional<FragmentLayout> {
    const Shape& s = type(v).shape;
    // An (m) or (m, 1) value beside products of m rows in registers takes their rows layout:
    // attention's running max and sum, loaded from scratch, meet the scores' row reductions.
    if (s.size() == 1 || (s.size() == 2 && s[1] == 1))
      if (const auto it = product_rows.find(s[0]); it != product_rows.end()) return it->second;
    std::optional<FragmentLayout> l = blocked_layout(type(v));
    if (!l || !(s.size() == 1 || (s.size() == 2 && s[0] == 1))) return l;
    for (size_t u : users[v]) {
      const ir::Op& b = r.ops[u];
      if (b.code != OpCode::BroadcastInDim) continue;
      const Shape& bs = type(b.results[0]).shape;
      if (bs.size() != 2 || bs[0] == 1) continue;
      if (const std::optional<FragmentLayout> t = blocked_layout(type(b.results[0]))) return cols_of(*t);
    }
    return l;
  };
  // The values of r a register reduction or row scan takes, directly or through
  // elementwise ops: a blocked tile may start at an elementwise op reading arena tiles where it
  // leads to one (the barrier before its loop is paid back by the reduction's or scan's own, in
  // the arena's code, and its traffic).
  std::set<ValueId> reduced;
  for (size_t i = r.ops.size(); i-- > 0;) {
    const ir::Op& op = r.ops[i];
    if (row_reduction(op.code) && op.operands.size() == 1) reduced.insert(op.operands[0]);
    if (row_scan(op)) reduced.insert(op.operands[0]);
    if (op.results.size() == 1 && is_elementwise(op) && reduced.count(op.results[0]) && !escapes.count(op.results[0]))
      reduced.insert(op.operands.begin(), op.operands.end());
  }
  for (ValueId a : r.args)
    if (const auto it = fragment_args_.find(a); it != fragment_args_.end()) roots[a] = it->second;
  for (const ir::Op& op : r.ops) {
    if (op.code != OpCode::Load || op.results.size() != 1 || fused(op) || register_updates_.count(&op) ||
        is_stored_from_registers(op) || op.attrs.get_int_or(ir::AttrKey::Masked, 0) != 0)
      continue;
    const AccumulatorRegisters* a = acc_of(op.operands[0]);
    const Shape& shape = type(op.operands[0]).shape;
    if (!whole_view(op.attrs.get_indexer(ir::AttrKey::Index), shape)) continue;
    if (!a) {
      // (Not the register accumulator's scratch: its whole loads read it in memory, emit_ref_op.)
      if (op.operands[0] == acc_regs_.ref) continue;
      if (const std::optional<FragmentLayout> b = ctx_.blocked_tiles ? blocked_start(op.results[0]) : std::nullopt)
        roots[op.results[0]] = *b;
      continue;
    }
    if (shape.size() != 2) continue;
    const FragmentLayout l = acc_layout(*a);
    if (l.rounds * warpgroups >= l.blocks() && type(op.results[0]).shape == Shape{a->m, a->n}) roots[op.results[0]] = l;
  }
  // A loop's carries: first the layouts its body yields when free to (discovery), then those the
  // body keeps with its args in registers too (plan_loop_carries).
  std::map<const ir::Op*, std::vector<std::optional<FragmentLayout>>> carries;
  // (Only a body that loads an ACC in registers somewhere can make wgmma-layout tiles to carry.)
  std::set<ValueId> acc_views;  // (views of one made in the body)
  std::function<bool(const ir::Region&)> loads_acc = [&](const ir::Region& sub) {
    for (const ir::Op& o : sub.ops) {
      const bool acc = !o.operands.empty() && (acc_of(o.operands[0]) || acc_views.count(o.operands[0]));
      if (o.code == OpCode::RefView && acc) acc_views.insert(o.results[0]);
      if (o.code == OpCode::Load && acc) return true;
      for (const ir::Region& s : o.regions)
        if (loads_acc(s)) return true;
    }
    return false;
  };
  // (In a pallas_call, loops carrying a value of a blocked layout: their bodies are small.)
  auto carries_blocked = [&](const ir::Op& op) {
    for (ValueId v : op.results)
      if (blocked_layout(type(v))) return true;
    return false;
  };
  auto plan_carries = [&] {
    for (const ir::Op& op : r.ops) {
      if (!plans_carries || !carries_region_values(op)) continue;
      const std::vector<const ir::Region*> yielding = yielding_regions(op);
      if (!carries_blocked(op) && std::none_of(yielding.begin(), yielding.end(), [&](const ir::Region* y) { return loads_acc(*y); }))
        continue;
      std::vector<std::optional<FragmentLayout>>& c = carries[&op];
      c = discover_loop_carries(op);
      while (plan_loop_carries(op, c)) {
      }
    }
  };
  std::set<ValueId> banned;
  std::map<ValueId, FragmentLayout> chosen;
  auto layout_of = [&](ValueId v) -> const FragmentLayout* {
    const auto it = chosen.find(v);
    return it == chosen.end() ? nullptr : &it->second;
  };
  // Whether op's loop (an elementwise op's, a store's) reads register tiles consistently.
  auto loop_fits = [&](const ir::Op& op) {
    if (op.code == OpCode::Store) {
      if (!whole_value_store(op)) return false;
      const AccumulatorRegisters* a = acc_of(op.operands[0]);
      // (A store into the register accumulator's scratch runs in memory, emit_ref_op: no
      // register tile reaches it — but an update of its registers, in their layout.)
      if (op.operands[0] == acc_regs_.ref) {
        const FragmentLayout l = acc_layout(acc_regs_.regs);
        return updates_registers(op) && l.rounds * warpgroups >= l.blocks() && !fragment_reads(op, 1, layout_of, &l).conflict;
      }
      if (!a) return !fragment_reads(op, 1, layout_of).conflict;
      // Into an ACC in registers (emit_store_into_registers): in its registers' layout.
      const Shape& shape = type(op.operands[0]).shape;
      if (shape.size() != 2 || !whole_view(op.attrs.get_indexer(ir::AttrKey::Index), shape) || is_uniform(op.operands[1]))
        return false;
      const FragmentLayout l = acc_layout(*a);
      return l.rounds * warpgroups >= l.blocks() && !fragment_reads(op, 1, layout_of, &l).conflict;
    }
    if (op.results.size() != 1 || !is_elementwise(op)) return false;
    const FragmentReads reads = fragment_reads(op, 0, layout_of);
    return !reads.conflict && (!reads.layout || fits_layout(*reads.layout, type(op.results[0]).shape));
  };
  // Whether the use of v by op u reads it in its layout l.
  auto use_fits = [&](ValueId v, const FragmentLayout& l, size_t u) {
    const ir::Op* op = &r.ops[u];
    // A fused op is computed in its user's loop: follow it there.
    while (fused(*op)) {
      if (op->code == OpCode::Load) return false;
      const std::vector<size_t>& next = users[op->results[0]];
      if (next.size() != 1 || escapes.count(op->results[0])) return false;
      op = &r.ops[next[0]];
    }
    if (op->code == OpCode::Store || (is_elementwise(*op) && op->code != OpCode::Constant)) return loop_fits(*op);
    if (op->code == OpCode::Yield) {  // r's loop carries it: in this layout
      if (captured.count(v)) return false;  // (an enclosing region's: never yielded in registers)
      for (size_t i = 0; i < op->operands.size(); ++i) {
        if (op->operands[i] != v) continue;
        const bool carried = yields_it != fragment_yields_.end() && i < yields_it->second.size() &&
                             yields_it->second[i] && *yields_it->second[i] == l;
        if (!discovery && !carried) return false;
      }
      return true;
    }
    if ((op->code == OpCode::For || op->code == OpCode::While) && carries.count(op)) {
      // An initial carry (a fori_loop's after its bounds): copied in its layout.
      const std::vector<std::optional<FragmentLayout>>& c = carries[op];
      const size_t first = op->code == OpCode::For ? 2 : 0;
      for (size_t i = first; i < op->operands.size(); ++i)
        if (op->operands[i] == v && !(c[i - first] && *c[i - first] == l)) return false;
      return true;
    }
    // wgmma's a, into an ACC in registers of the same rows (one warpgroup): from the registers.
    if (op->code == OpCode::GpuWgmma && op->operands.size() == 3 && op->operands[1] == v && op->operands[0] != v &&
        op->operands[2] != v) {
      const AccumulatorRegisters* acc = acc_of(op->operands[0]);
      const DType t = type(v).dtype;
      return !(l.rows || l.blocked() || !acc || acc->m != l.m || warpgroups != 1 || (t != DType::BF16 && t != DType::F16) ||
               l.n % 16 != 0 || l.n > 256 || l.nc % 16 != 0 || type(op->operands[2]).dtype != t);
    }
    // A product's a (bf16 / f16 in wgmma's accumulator layout of its rows), into a product in
    // registers whose rounds take the same rows of each warpgroup as a's (one warpgroup, or
    // blocks as wide as a and the result): wgmma takes it from the registers (attention's p in p v).
    if (op->code == OpCode::DotGeneral && op->operands[0] == v && op->operands[1] != v) {
      const FragmentLayout* d = layout_of(op->results[0]);
      const DType t = type(v).dtype;
      MmaProduct p;
      return d && !d->blocked() && !l.blocked() && !l.rows && plain_product(*op, p) && p.m == l.m &&
             (warpgroups == 1 || (l.blocks_n() == 1 && d->blocks_n() == 1 && l.rounds == d->rounds)) &&
             (t == DType::BF16 || t == DType::F16) && l.n % 16 == 0 && l.n <= 256 && l.nc % 16 == 0;
    }
    // A slice or concatenate moving whole registers (each of its operands a register tile).
    if (op->code == OpCode::Slice || op->code == OpCode::Concatenate)
      return register_piece_layout(*op, type(op->results[0]), layout_of).has_value();
    return op->operands.size() == 1 && op->operands[0] == v && reads_in_registers(*op, l);
  };
  // Whether every use of v reads it in its layout l.
  auto uses_fit = [&](ValueId v, const FragmentLayout& l) {
    if (escapes.count(v)) return false;
    for (size_t u : users[v])
      if (!use_fits(v, l, u)) return false;
    return true;
  };
  // Whether a blocked tile v on the way to a reduction, whose other uses fit, may keep its
  // registers with a copy in the arena for the uses that read it as an arena tile (Triton's
  // convert_layout): ops of r other than elementwise ops, stores that fit, loops and branches (a
  // dot's operand, a transpose, a reduction or scan of another axis, a partial store) —
  // attention's p, read by its row sums in registers and by p v from the arena.
  auto mirrorable = [&](ValueId v, const FragmentLayout& l) {
    // (Only on the way to a reduction: there the registers save its barriers and traffic; a
    // tile only read elementwise besides gains nothing worth the copy's barrier.)
    if (escapes.count(v) || captured_by.count(v) || !reduced.count(v) || !l.blocked() || l.rows || l.cols ||
        fragment_args_.count(v))
      return false;
    const auto maker = made_by.find(v);
    if (maker == made_by.end() || !r.ops[maker->second].regions.empty()) return false;  // (a loop's: its carries')
    for (size_t u : users[v]) {
      if (use_fits(v, l, u)) continue;
      const ir::Op& op = r.ops[u];
      if (!arena_reader_of_register_tile(op, l) || fused(op)) return false;
    }
    return true;
  };
  // A columns value is the same in every warp: worth its registers where a tile's loop reads it
  // (a broadcast along its columns: layer_norm's gamma), directly or through columns values made
  // of it, or where a tile's column reduction made it. Alone (a 1-D block's values) every warp
  // would compute all of it: the arena's loops share the work instead.
  auto drop_unanchored_columns = [&] {
    std::set<ValueId> anchored;
    // (One that a region of r reads: anchored or not there, by that region's plan.)
    for (const auto& [v, by] : captured_by) anchored.insert(v);
    // The columns values an element of v reads (through fused ops).
    std::function<void(ValueId, std::set<ValueId>&)> cols_read = [&](ValueId v, std::set<ValueId>& out) {
      if (const FragmentLayout* l = layout_of(v); l && l->cols) out.insert(v);
      if (layout_of(v)) return;
      const auto f = fused_producers_.find(v);
      if (f != fused_producers_.end())
        for (ValueId o : f->second->operands) cols_read(o, out);
    };
    for (size_t i = r.ops.size(); i-- > 0;) {
      const ir::Op& op = r.ops[i];
      if (op.results.size() == 1 && fused(op)) continue;  // (read where its user's loop runs)
      const FragmentLayout* made = op.results.size() == 1 ? layout_of(op.results[0]) : nullptr;
      if (made && made->cols && (row_reduction(op.code) || anchored.count(op.results[0]) == 0)) {
        if (row_reduction(op.code)) anchored.insert(op.results[0]);  // (a tile's columns)
        continue;  // (an unanchored columns value anchors nothing)
      }
      // (A loop of a tile: the op's result's, or a store's.)
      const auto tile = [](const std::optional<FragmentLayout>& l) { return l && !l->rows && !l->cols; };
      const bool tile_loop = made ? made->cols || tile(*made)
                                  : whole_value_store(op) && tile(fragment_reads(op, 1, layout_of).layout);
      if (!tile_loop) continue;
      std::set<ValueId> read;
      for (ValueId o : op.operands) cols_read(o, read);
      anchored.insert(read.begin(), read.end());
    }
    bool dropped = false;
    for (const auto& [v, l] : chosen)
      if (l.cols && !anchored.count(v)) banned.insert(v), dropped = true;
    return dropped;
  };
  // Grow the register tiles from the roots through the elementwise ops and row reductions, drop
  // those with a use that reads them otherwise, and again until none drops (a dropped value may
  // have made its users register tiles); then drop the loop carries whose results or bodies do
  // not keep them, and again.
  std::set<ValueId> mirrored;
  auto settle = [&] {
    for (;;) {
      for (;;) {
        chosen.clear();
        for (ValueId a : r.args)
          if (const auto it = roots.find(a); it != roots.end() && !banned.count(a)) chosen[a] = it->second;
        for (const auto& [v, l] : captured)
          if (!banned.count(v)) chosen[v] = l;
        for (const ir::Op& op : r.ops) {
          if (carries.count(&op)) {
            const std::vector<std::optional<FragmentLayout>>& c = carries[&op];
            for (size_t i = 0; i < c.size(); ++i)
              if (c[i] && !banned.count(op.results[i])) chosen[op.results[i]] = *c[i];
            continue;
          }
          if (op.results.size() != 1 || banned.count(op.results[0])) continue;
          const ValueId res = op.results[0];
          if (const auto it = roots.find(res); it != roots.end()) {
            chosen[res] = it->second;
            continue;
          }
          if (fused(op) || op.code == OpCode::Constant) continue;
          if (const FragmentLayout* x = op.operands.size() == 1 ? layout_of(op.operands[0]) : nullptr;
              x && (blocked_row_scan(op, *x) || blocked_column_rev(op, *x))) {
            chosen[res] = *x;
            continue;
          }
          if (const std::optional<FragmentLayout> piece = register_piece_layout(op, type(res), layout_of)) {
            chosen[res] = *piece;
            continue;
          }
          if (row_reduction(op.code) && op.operands.size() == 1) {
            const FragmentLayout* x = layout_of(op.operands[0]);
            const FragmentReduction kind = x ? fragment_reduction_kind(op, *x) : FragmentReduction::None;
            if (kind == FragmentReduction::Rows) chosen[res] = *rows_of(*x);
            if (kind == FragmentReduction::Columns && x->blocked()) chosen[res] = *cols_of(*x);
            continue;
          }
          if (!is_elementwise(op)) continue;
          const FragmentReads reads = fragment_reads(op, 0, layout_of);
          if (reads.layout && !reads.conflict && fits_layout(*reads.layout, type(res).shape)) {
            chosen[res] = *reads.layout;
          } else if (!reads.layout && !reads.rows && !reads.cols && (!reads.arena || discovery || reduced.count(res)) &&
                     ctx_.blocked_tiles) {
            // (In a pallas_call an elementwise op of memory and constants starts a blocked tile
            // too: `x[...].astype(f32)`, its load fused into it. One reading arena tiles only on
            // the way to a reduction (`reduced`): in another layout than theirs it needs a barrier
            // first — but for a loop body's first plan, whose args are arena tiles until it finds
            // which carries it keeps.)
            if (const std::optional<FragmentLayout> b = blocked_start(res)) chosen[res] = *b;
          }
        }
        // (Where a rows or columns value does not fit, it goes first: a tile reading it may fit
        // once it is in the arena.)
        std::vector<ValueId> misfits;
        bool lines = false;
        mirrored.clear();
        for (const auto& [v, l] : chosen)
          if (!uses_fit(v, l)) {
            if (mirrorable(v, l)) mirrored.insert(v);
            else misfits.push_back(v), lines = lines || l.rows || l.cols;
          }
        for (ValueId v : misfits)
          if (!lines || chosen.at(v).rows || chosen.at(v).cols) banned.insert(v);
        bool dropped = !misfits.empty();
        if (!dropped) dropped = drop_unanchored_columns();
        if (!dropped) break;
      }
      bool dropped = false;
      for (auto& [loop, c] : carries) {
        bool changed = false;
        for (size_t i = 0; i < c.size(); ++i)
          if (c[i] && !chosen.count(loop->results[i])) c[i].reset(), changed = true;
        if (changed) {
          while (plan_loop_carries(*loop, c)) {
          }
          dropped = true;  // (its initial values' uses changed: grow again)
        }
        for (size_t i = 0; i < c.size(); ++i)
          if (!c[i] && chosen.count(loop->results[i])) banned.insert(loop->results[i]), dropped = true;
      }
      // The register tiles that the regions of r's control ops read: offered to each region (it
      // plans again where its offer changed, its op's carries too); one a region does not keep
      // goes to the arena, and the plan settles again.
      for (const ir::Op& op : r.ops) {
        if (op.regions.empty() || !plans_carries) continue;
        bool offered_anew = false;
        for (const ir::Region& s : op.regions) {
          std::map<ValueId, FragmentLayout> offer;
          for (ValueId v : outer_reads(s))
            if (const FragmentLayout* l = layout_of(v)) offer.emplace(v, *l);
          std::map<ValueId, FragmentLayout>& current = captured_offers_[&s];
          if (offer != current) current = std::move(offer), offered_anew = true;
        }
        if (offered_anew) {
          std::vector<std::optional<FragmentLayout>> none(op.results.size());
          std::vector<std::optional<FragmentLayout>>& c = carries.count(&op) ? carries[&op] : none;
          const std::vector<std::optional<FragmentLayout>> before = c;
          while (plan_loop_carries(op, c)) {
          }
          if (c != before) dropped = true;  // (its results' plan changed: grow again)
        }
        for (const ir::Region& s : op.regions)
          for (const auto& [v, l] : captured_offers_[&s])
            if (!captures_kept_[&s].count(v)) banned.insert(v), dropped = true;
      }
      if (!dropped) break;
    }
  };
  // Where r's control ops read register tiles made outside them, the plan settles first without
  // carries, so that their regions find their carries with those tiles offered (a branch's
  // `x + 1` of a captured x is a register tile to yield only with x in registers); then afresh.
  const bool offers = std::any_of(captured_by.begin(), captured_by.end(), [&](const auto& by) {
    const ValueId v = by.first;
    return made_by.count(v) || captured.count(v) || std::find(r.args.begin(), r.args.end(), v) != r.args.end();
  });
  if (offers) {
    settle();
    banned.clear();
  }
  plan_carries();
  settle();
  // The register budget, a heuristic: the 32-bit registers of the register tiles live at once in
  // r, from the op making each to its last use in r. Past it, the largest tile live at the peak
  // (the longest lived of those) goes to the arena, and the plan settles again. Not counted: an
  // ACC's registers (a load of one is a copy the compiler renames away where the ACC is not read
  // again — attention's scores; an ACC kept across is the minority), the tiles of enclosing
  // regions live across r (a loop's carries: counted at the loop's op in its parent), a column
  // reduction's partials, and a fused use's own loop (the span ends at its user's op). A tile that
  // r's control ops read inside lives to the last of them; one r reads of an enclosing region is
  // that region's (not counted here, as carries are not). Measured with ptxas in PERFORMANCE.md,
  // stop 47.
  std::map<ValueId, size_t> defined = made_by;
  for (ValueId a : r.args) defined[a] = 0;
  for (;;) {
    std::vector<int64_t> live(r.ops.size() + 1, 0);
    std::map<ValueId, std::pair<size_t, size_t>> span;
    for (const auto& [v, l] : chosen) {
      if (captured.count(v)) continue;
      const size_t from = defined.at(v);
      size_t to = from;
      for (size_t u : users[v]) to = std::max(to, u);
      for (size_t u : captured_by[v]) to = std::max(to, u);
      span[v] = {from, to};
      const int64_t words = (l.registers() * itemsize(type(v).dtype) + 3) / 4;
      for (size_t i = from; i <= to; ++i) live[i] += words;
    }
    const size_t peak = static_cast<size_t>(std::max_element(live.begin(), live.end()) - live.begin());
    if (chosen.empty() || live[peak] <= ctx_.register_tile_budget) break;
    ValueId victim = -1;
    std::pair<int64_t, size_t> worst{-1, 0};
    for (const auto& [v, l] : chosen) {
      if (captured.count(v)) continue;
      const auto [from, to] = span[v];
      if (from > peak || to < peak) continue;
      const std::pair<int64_t, size_t> size{l.registers() * itemsize(type(v).dtype), to - from};
      if (size > worst) worst = size, victim = v;
    }
    if (victim < 0) break;  // (some tile spans the peak: it has registers)
    banned.insert(victim);
    settle();
  }
  for (const auto& [v, l] : chosen) {
    if (captured.count(v)) captures_kept_[&r].insert(v);
    else fragments_[v] = l;
  }
  for (ValueId v : mirrored)
    if (chosen.count(v)) fragment_mirrors_.insert(v);
}

bool Emitter::reads_in_registers(const ir::Op& op, const FragmentLayout& l) const {
  if (blocked_row_scan(op, l) || blocked_column_rev(op, l)) return true;
  return row_reduction(op.code) && fragment_reduction_kind(op, l) != FragmentReduction::None;
}

bool Emitter::arena_reader_of_register_tile(const ir::Op& op, const FragmentLayout& l) const {
  if (!op.regions.empty() || op.code == OpCode::Yield || op.code == OpCode::GpuWgmma || is_elementwise(op)) return false;
  // (While planning no operand is a register tile yet: a piece that did not fit reads the arena.)
  if (op.code == OpCode::Slice || op.code == OpCode::Concatenate) return !register_piece_layout(op);
  if (op.code == OpCode::Store) return !whole_value_store(op);
  return !reads_in_registers(op, l);
}

ValueInfo Emitter::arena_copy_of_register_tile(ValueId v, const std::string& name, const std::string& comment) {
  const ValueInfo& in_registers = info(v);
  const ValueInfo tile = arena_tile(v, name, comment);
  open_fragment_loop(in_registers.frag);
  line(tile.name + "[e] = " + in_registers.name + "[pl_k];");
  close_fragment_loop();
  after_tile_write();
  barrier();  // (its readers' loops take other elements than the registers' threads wrote)
  return tile;
}

void Emitter::emit_mirror(ValueId v) {
  mirrors_[v] = arena_copy_of_register_tile(v, info(v).name + "_tile", "  // its copy in the arena");
}

Emitter::FragmentReduction Emitter::fragment_reduction_kind(const ir::Op& op, const FragmentLayout& l) const {
  // (An argmax's candidates carry their index: the blocked layout's reductions of rows and columns
  // know it, the others do not.)
  const bool arg = arg_reduction(op.code);
  const ir::Ints axes = arg ? ir::Ints{op.attrs.get_int(ir::AttrKey::Axis)} : op.attrs.get_ints(ir::AttrKey::Axes);
  const Shape& shape = type(op.results.at(0)).shape;
  if (arg && (!l.blocked() || shape.empty())) return FragmentReduction::None;
  // (The thread's registers of a block's column or row are in one round, or its rounds of one
  // column of blocks: with one warpgroup, or a block per row band.)
  const bool whole_rows = l.warpgroups == 1 || l.blocks_n() == 1;
  if (shape.empty()) {
    // (pl_team_combine of the group: its warps a power of two.)
    const int g = ctx_.group_threads;
    return g > 0 && g <= 1024 && (g & (g - 1)) == 0 ? FragmentReduction::Total : FragmentReduction::None;
  }
  if (l.blocked()) {
    // A blocked tile's rows lie each with one warp (shuffles); its columns across the warps (their
    // partial results meet in the arena).
    if (l.rows || l.cols) return FragmentReduction::None;
    if (axes == ir::Ints{1} && fits_layout(*rows_of(l), shape)) return FragmentReduction::Rows;
    // (Its scratch: a row of partial results per warp row, at most 32 KiB.)
    const int64_t scratch = l.row_warps() * l.n * (arg ? 16 : std::max<int64_t>(4, itemsize(type(op.results.at(0)).dtype)));
    if (axes == ir::Ints{0} && fits_layout(*cols_of(l), shape) && scratch <= 32 * 1024) return FragmentReduction::Columns;
    return FragmentReduction::None;
  }
  if (l.rows || !whole_rows) return FragmentReduction::None;
  if (axes == ir::Ints{1} && fits_layout(*rows_of(l), shape)) return FragmentReduction::Rows;
  if (axes == ir::Ints{0} && shape == Shape{l.n}) return FragmentReduction::Columns;
  return FragmentReduction::None;
}

void Emitter::emit_reduction_of_fragment(const ir::Op& op, const TeamReduction& t) {
  const ValueId res = op.results[0];
  const FragmentReduction kind = fragment_reduction_kind(op, info(op.operands[0]).frag);
  PALLAS_INTERNAL_CHECK(kind != FragmentReduction::None, "gpu emitter: a reduction of a register tile it cannot take");
  if (kind == FragmentReduction::Total) return emit_fragment_total(op, t);
  if (const auto it = fragments_.find(res); it != fragments_.end())  // into registers (rows, columns)
    return (void)emit_register_reduction(op, kind, define_fragment(res, it->second), t, /*into_registers=*/true);
  const std::string out = define_tile(res);  // (rows or columns: not a scalar)
  const bool other_layout = emit_register_reduction(op, kind, out, t, /*into_registers=*/false);
  after_tile_write();
  if (other_layout) barrier();  // (the threads holding the results wrote them, not the arena's loops)
}

bool Emitter::emit_register_reduction(const ir::Op& op, FragmentReduction kind, const std::string& out,
                                      const TeamReduction& t, bool into_registers) {
  const bool blocked = info(op.operands[0]).frag.blocked();
  if (kind == FragmentReduction::Rows) {
    if (blocked) emit_blocked_row_reduction(op, out, t, into_registers);
    else emit_fragment_reduction(op, out, t, into_registers);
    return true;  // (a lane of each row's holders wrote it)
  }
  PALLAS_INTERNAL_CHECK(kind == FragmentReduction::Columns && (blocked || !into_registers),
                        "gpu emitter: a reduction of a register tile it cannot take");
  if (blocked) {
    emit_blocked_column_reduction(op, out, t, into_registers);
    return true;  // (the threads holding the columns wrote them)
  }
  emit_fragment_column_reduction(op, out, t);  // (a thread per column, the arena's loop)
  return false;
}

void Emitter::set_carried_args(const ir::Op& loop, const std::vector<std::optional<FragmentLayout>>& carries) {
  for (const auto& [region, first] : carry_takers(loop))
    for (size_t i = 0; i < carries.size(); ++i) {
      const ValueId arg = region->args[first + i];
      if (carries[i]) fragment_args_[arg] = *carries[i];
      else fragment_args_.erase(arg);
    }
}

std::vector<std::optional<FragmentLayout>> Emitter::discover_loop_carries(const ir::Op& loop) {
  const std::vector<const ir::Region*> yielding = yielding_regions(loop);
  std::vector<std::optional<FragmentLayout>> carries(loop.results.size());
  const bool all_yield = std::all_of(yielding.begin(), yielding.end(),
                                     [](const ir::Region* r) { return !r->ops.empty() && r->ops.back().code == OpCode::Yield; });
  // Free to yield anything, with the args found so far in registers, until no new one is (a
  // yield of another carry's arg is found once that carry is). A result is a candidate where
  // every region (each branch of a cond) yields it in one layout.
  for (const ir::Region* r : yielding) fragment_discovery_.insert(r), fragment_yields_.erase(r);
  for (bool found = all_yield; found;) {
    set_carried_args(loop, carries);
    std::vector<std::optional<FragmentLayout>> yielded(carries.size());
    std::vector<size_t> agreeing(carries.size(), 0);
    for (const ir::Region* r : yielding) {
      plan_fusion(*r);
      for (size_t i = 0; i < carries.size(); ++i) {
        const ValueId y = r->ops.back().operands[i];
        const auto it = outer_reads(*r).count(y) ? fragments_.end() : fragments_.find(y);  // (r's own)
        if (it == fragments_.end()) continue;
        if (!yielded[i]) yielded[i] = it->second;
        if (*yielded[i] == it->second) ++agreeing[i];
      }
    }
    found = false;
    for (size_t i = 0; i < carries.size(); ++i)
      if (!carries[i] && agreeing[i] == yielding.size()) carries[i] = yielded[i], found = true;
  }
  for (const ir::Region* r : yielding) fragment_discovery_.erase(r);
  return carries;
}

bool Emitter::plan_loop_carries(const ir::Op& loop, std::vector<std::optional<FragmentLayout>>& carries) {
  const std::vector<const ir::Region*> yielding = yielding_regions(loop);
  set_carried_args(loop, carries);
  std::vector<bool> kept(carries.size(), true);
  for (const ir::Region* r : yielding) {
    fragment_yields_[r] = carries;
    plan_fusion(*r);
    if (r->ops.empty()) continue;  // (a branch of a cond without results may be empty)
    const ir::Op& yield = r->ops.back();
    for (size_t i = 0; i < carries.size(); ++i) {
      const bool own = yield.code == OpCode::Yield && !outer_reads(*r).count(yield.operands[i]);
      const auto y = own ? fragments_.find(yield.operands[i]) : fragments_.end();
      if (carries[i] && (y == fragments_.end() || !(y->second == *carries[i]))) kept[i] = false;
    }
  }
  if (loop.code == OpCode::While) plan_fusion(loop.regions[0]);  // (the condition reads the carries too)
  bool dropped = false;
  for (size_t i = 0; i < carries.size(); ++i) {
    if (!carries[i]) continue;
    // (an arg no use keeps in registers is dropped by its region's plan when it has a use)
    for (const auto& [region, first] : carry_takers(loop)) kept[i] = kept[i] && fragments_.count(region->args[first + i]);
    if (!kept[i]) carries[i].reset(), dropped = true;
  }
  return dropped;  // (the caller plans again with the rest: the regions' plans are then theirs)
}

namespace {
// The block of a register tile that round pl_q of the thread's warpgroup takes.
std::string fragment_block(const FragmentLayout& l) {
  return l.warpgroups == 1 ? "pl_q" : "pl_q * " + std::to_string(l.warpgroups) + " + pl_tid() / 128";
}
// A blocked layout's warp row (of R) and warp column (of P) of the thread.
std::string warp_row(const FragmentLayout& l) {
  return l.warps_per_row == 1 ? "(pl_tid() >> 5)" : "((pl_tid() >> 5) / " + std::to_string(l.warps_per_row) + ")";
}
std::string warp_col(const FragmentLayout& l) {
  return l.warps_per_row == 1 ? "0" : "((pl_tid() >> 5) % " + std::to_string(l.warps_per_row) + ")";
}
// The thread's lane among its row's T lanes, and its row among its warp's L.
std::string lane_in_row(const FragmentLayout& l) {
  return "(pl_tid() & " + std::to_string(l.lanes_per_row - 1) + ")";  // (T 32: the lane)
}
std::string lane_row(const FragmentLayout& l) {
  return "((pl_tid() & 31) / " + std::to_string(l.lanes_per_row) + ")";
}
// Row pl_q x B + the thread's row in the band; the column of its register pl_i and lane.
std::string blocked_row(const FragmentLayout& l) {
  if (l.lane_rows() == 1) return "(pl_q * " + std::to_string(l.row_warps()) + " + " + warp_row(l) + ")";
  return "(pl_q * " + std::to_string(l.band_rows()) + " + " + warp_row(l) + " * " + std::to_string(l.lane_rows()) + " + " +
         lane_row(l) + ")";
}
std::string blocked_column(const FragmentLayout& l) {
  const std::string T = std::to_string(l.lanes_per_row);
  if (l.warps_per_row == 1) return "pl_i * " + T + " + " + lane_in_row(l);
  return "(pl_i * " + std::to_string(l.warps_per_row) + " + " + warp_col(l) + ") * " + T + " + " + lane_in_row(l);
}
// `if (...) ` for the first of a row's T lanes (in the first of its P warps with `first_warp`).
std::string first_of_row(const FragmentLayout& l, bool first_warp) {
  return first_warp && l.warps_per_row > 1 ? "if (" + lane_in_row(l) + " == 0 && " + warp_col(l) + " == 0) "
                                           : "if (" + lane_in_row(l) + " == 0) ";
}
}  // namespace

void Emitter::open_fragment_loop(const FragmentLayout& l, bool pairs, IdleWarpgroup idle) {
  if (l.blocked()) {
    PALLAS_INTERNAL_CHECK(!pairs, "gpu emitter: pairs of a blocked register tile");
    // pl_q: the thread's row band (its row pl_q B + warp row L + lane row); pl_i: its register of
    // T columns in it.
    const int64_t bands = l.cols ? 1 : l.m / l.band_rows(), per_row = l.rows ? 1 : l.registers_per_row();
    const std::string row = blocked_row(l), column = blocked_column(l);
    line("#pragma unroll");
    line("for (int pl_q = 0; pl_q < " + std::to_string(bands) + "; ++pl_q) {");
    ++indent_;
    line("#pragma unroll");
    line("for (int pl_i = 0; pl_i < " + std::to_string(per_row) + "; ++pl_i) {");
    ++indent_;
    line("const int pl_k = pl_q * " + std::to_string(per_row) + " + pl_i;");
    line("const pl_i64 e = " + (l.rows ? row : l.cols ? column : row + " * " + std::to_string(l.n) + " + " + column) + ";");
    fragment_loop_ = l;
    return;
  }
  line("#pragma unroll");
  line("for (int pl_q = 0; pl_q < " + std::to_string(l.rounds) + "; ++pl_q) {");
  ++indent_;
  line("const int pl_blk = " + fragment_block(l) + ";");
  // (A rows layout's pl_blk is the row band; the thread's rows in it are 16 w + l / 4 and + 8.)
  const int64_t count = l.rows ? l.m / 64 : l.blocks();
  if (l.rounds * l.warpgroups > count) {
    const std::string past = "pl_blk >= " + std::to_string(count);
    if (idle == IdleWarpgroup::Skip) line("if (" + past + ") continue;");
    else line("const bool pl_idle = " + past + ";"), fragment_loop_has_idle_ = true;
  }
  if (l.rows) {
    line("#pragma unroll");
    line("for (int pl_i = 0; pl_i < 2; ++pl_i) {");
    ++indent_;
    line("const int pl_k = pl_q * 2 + pl_i;");
    line("const pl_i64 e = pl_blk * 64 + 16 * ((pl_tid() & 127) >> 5) + ((pl_tid() & 31) >> 2) + 8 * pl_i;");
    fragment_loop_ = l;
    return;
  }
  const std::string half = std::to_string(l.nc / 2);
  const std::string bn = std::to_string(l.blocks_n());
  line("const pl_i64 pl_base = pl_wgmma_acc_base(pl_blk / " + bn + " * 64, pl_blk % " + bn + " * " + std::to_string(l.nc) +
       ", " + std::to_string(l.n) + ");");
  line("#pragma unroll");
  line("for (int pl_i = 0; pl_i < " + half + "; " + (pairs ? "pl_i += 2" : "++pl_i") + ") {");
  ++indent_;
  const std::string k = pairs ? "pl_k0" : "pl_k", e = pairs ? "pl_e0" : "e";
  line("const int " + k + " = pl_q * " + half + " + pl_i;");
  line("const pl_i64 " + e + " = pl_base + pl_wgmma_acc_off(pl_i, " + std::to_string(l.n) + ");");
  fragment_loop_ = l;
}

std::string Emitter::rows_register(const FragmentLayout& l) {
  if (l.blocked()) return "pl_q";  // (the row band of the loop: open_fragment_loop)
  // Register pl_k = round x nc / 2 + i of a tile holds row + 8 when bit 1 of i is set; the round's
  // band is its round / blocks_n (one warpgroup) or its round (a block per band).
  const std::string half = std::to_string(l.nc / 2), bn = std::to_string(l.blocks_n());
  return "(pl_k / " + half + (l.blocks_n() == 1 ? "" : " / " + bn) + " * 2 + ((pl_k % " + half + ") >> 1 & 1))";
}

std::string Emitter::replica_guard(const FragmentLayout& l) {
  // (Every warp row holds them, and each lane row of a warp: the first writes.)
  if (l.cols)
    return l.lane_rows() == 1 ? "if (" + warp_row(l) + " == 0) "
                              : "if (" + warp_row(l) + " == 0 && (pl_tid() & 31) < " + std::to_string(l.lanes_per_row) + ") ";
  if (!l.rows) return "";
  if (!l.blocked()) return "if ((pl_tid() & 3) == 0) ";
  return first_of_row(l, true);  // (a row's T lanes of each of its P warps hold it)
}

void Emitter::assign_register(const std::string& regs, DType dt, const std::string& value) {
  // (The conditional reads nothing for an idle warpgroup: no memory, no other register's value.
  // Both sides of type T: a value computed in f32 for a bf16 register would make `?:` ambiguous.)
  const std::string T = ctype(dt);
  line(regs + "[pl_k] = " + (fragment_loop_has_idle_ ? "pl_idle ? " + T + "{} : (" + T + ")(" + value + ")" : value) + ";");
}

void Emitter::close_fragment_loop() {
  fragment_loop_.reset();
  fragment_loop_has_idle_ = false;
  --indent_;
  line("}");
  --indent_;
  line("}");
}

void Emitter::copy_fragments(const std::vector<std::pair<std::string, ValueId>>& copies) {
  // (Through copies of their own: a value may be another carry's holder. They are registers, which
  // the compiler renames away.)
  std::vector<std::string> temps;
  for (const auto& [holder, v] : copies) {
    const ValueInfo& y = info(v);
    const std::string n = std::to_string(y.frag.registers());
    temps.push_back(fresh("f"));
    line(ctype(type(v).dtype) + " " + temps.back() + "[" + n + "];");
    line("#pragma unroll");
    line("for (int pl_r = 0; pl_r < " + n + "; ++pl_r) " + temps.back() + "[pl_r] = " + y.name + "[pl_r];");
  }
  for (size_t i = 0; i < copies.size(); ++i) {
    const std::string n = std::to_string(info(copies[i].second).frag.registers());
    line("#pragma unroll");
    line("for (int pl_r = 0; pl_r < " + n + "; ++pl_r) " + copies[i].first + "[pl_r] = " + temps[i] + "[pl_r];");
  }
}

std::string Emitter::define_fragment(ValueId v, const FragmentLayout& l) {
  ValueInfo& i = values_[static_cast<size_t>(v)];
  i.kind = ValueInfo::Kind::Fragment;
  i.frag = l;
  i.name = "v" + std::to_string(v);
  line(ctype(type(v).dtype) + " " + i.name + "[" + std::to_string(l.registers()) + "];  // a register tile");
  if (ctx_.register_tile_count) ++*ctx_.register_tile_count;
  return i.name;
}

void Emitter::emit_fragment_load(const ir::Op& load, const AccumulatorRegisters& a) {
  const FragmentLayout& l = fragments_.at(load.results[0]);
  const std::string regs = define_fragment(load.results[0], l);
  // Where the ACC's memory is current (its registers hold nothing newer): read it in their layout.
  emit_other_path("if (!pl_acc_to_fragment(" + a.var + ", " + regs + "))",
                  [&] {
                    before_mem_read();
                    open_fragment_loop(l, false, IdleWarpgroup::Zeros);
                    assign_register(regs, type(load.results[0]).dtype, info(load.operands[0]).ref.elem("e"));
                    close_fragment_loop();
                  });
  after_mem_read();
}

std::optional<FragmentLayout> Emitter::blocked_layout(const ir::Type& t) const {
  const int threads = ctx_.group_threads;
  if (!ctx_.blocked_tiles || threads <= 0 || threads % 32 != 0 || t.shape.empty() || t.shape.size() > 2) return std::nullopt;
  FragmentLayout l;
  l.warps = threads / 32;
  l.cols = t.shape.size() == 1;  // (an (n) array: its columns, in every warp)
  l.m = l.cols ? 1 : t.shape[0];
  l.n = t.shape.back();
  if (l.m <= 0 || l.n <= 0) return std::nullopt;
  // (128 words: as many as an ACC's registers at most; the register budget counts them too.)
  auto fits = [&] { return l.registers() * itemsize(t.dtype) <= 4 * 128; };
  // Wide runs of lanes first (a warp's accesses are runs of T words), then few warps a row (a row
  // reduction over P warps meets in the arena). An (n) array: the widest run, one warp a row.
  for (l.lanes_per_row = 32; l.lanes_per_row >= 1; l.lanes_per_row /= 2) {
    if (l.n % l.lanes_per_row != 0) continue;
    if (l.cols) return fits() ? std::optional(l) : std::nullopt;
    for (l.warps_per_row = 1; l.warps_per_row <= l.warps && l.warps % l.warps_per_row == 0; l.warps_per_row *= 2)
      if (l.m % l.band_rows() == 0 && (l.n / l.lanes_per_row) % l.warps_per_row == 0) return fits() ? std::optional(l) : std::nullopt;
  }
  return std::nullopt;
}

void Emitter::emit_blocked_load(const ir::Op& load) {
  const FragmentLayout& l = fragments_.at(load.results[0]);
  const std::string regs = define_fragment(load.results[0], l);
  before_mem_read(load.operands[0]);
  // (Through view(): a ring slot read so keeps the row-major layout, slot_layout.)
  const RefInfo v = view(load, info(load.operands[0]).ref, load.attrs.get_indexer(ir::AttrKey::Index));
  open_fragment_loop(l);
  line(regs + "[pl_k] = " + v.elem("e") + ";");
  close_fragment_loop();
  after_mem_read(load.operands[0]);
}

void Emitter::emit_fragment_elementwise(const ir::Op& op, const FragmentLayout& l, bool across) {
  if (across) before_cross_read();
  const ValueId res = op.results[0];
  const bool in_registers = fragments_.count(res) > 0;
  const std::string out = in_registers ? define_fragment(res, l) : define_tile(res);
  open_fragment_loop(l, false, in_registers ? IdleWarpgroup::Zeros : IdleWarpgroup::Skip);
  // (A rows layout's value is each quad's four lanes', in the blocked layout the T lanes' of each
  // of its P warps: one of them writes the tile.)
  if (in_registers) assign_register(out, type(res).dtype, elementwise_expr(op, "e"));
  else line(replica_guard(l) + out + "[e] = " + elementwise_expr(op, "e") + ";");
  close_fragment_loop();
  if (in_registers) return;
  // The tile's elements were written by the threads holding them in registers, not by those the
  // arena's loops give them to.
  after_tile_write();
  barrier();
}

void Emitter::emit_fragment_store(const ir::Op& store, const FragmentLayout& l, bool across) {
  before_mem_write(store.operands[0]);
  if (across) before_cross_read();
  const RefInfo v = view(store, info(store.operands[0]).ref, store.attrs.get_indexer(ir::AttrKey::Index));
  if (!l.rows && !l.blocked() && v.swizzled.empty() && !v.strides.empty() && v.strides.back() == 1 && itemsize(v.dtype) <= 4) {
    // Registers 2 j and 2 j + 1 are columns c and c + 1 of a row: stored as a pair.
    const std::string T = ctype(v.dtype);
    open_fragment_loop(l, /*pairs=*/true);
    line(T + " pl_pair[2];");
    line("#pragma unroll");
    line("for (int pl_h = 0; pl_h < 2; ++pl_h) {");
    ++indent_;
    line("const int pl_k = pl_k0 + pl_h;");
    line("const pl_i64 e = pl_e0 + pl_h;");
    line("pl_pair[pl_h] = " + at(store.operands[1], "e") + ";");
    --indent_;
    line("}");
    line("pl_store_pair(&" + v.elem("pl_e0") + ", pl_pair[0], pl_pair[1]);");
    close_fragment_loop();
  } else {
    open_fragment_loop(l);
    line(replica_guard(l) + v.elem("e") + " = " + at(store.operands[1], "e") + ";");
    close_fragment_loop();
  }
  if (!v.swizzled.empty()) line("pl_fence_proxy_async();");  // (wgmma reads it through the async proxy)
  after_mem_write(store.operands[0]);
  after_mem_read(store.operands[0]);
}

void Emitter::emit_fragment_reduction(const ir::Op& op, const std::string& out, const TeamReduction& t,
                                      bool into_registers) {
  const ValueInfo& x = info(op.operands[0]);
  const FragmentLayout& l = x.frag;
  const std::string A = t.acc_type, half = std::to_string(l.nc / 2), bn = std::to_string(l.blocks_n());
  line("{");
  ++indent_;
  line("auto pl_comb = [](" + A + " a, " + A + " b) { return " + t.combine + "; };");
  // The thread's two rows of a block: 16 warp + lane / 4 (registers 4 j, 4 j + 1) and 8 below.
  line(A + " pl_r0 = " + t.identity + ", pl_r1 = " + t.identity + ";");
  line("#pragma unroll");
  line("for (int pl_q = 0; pl_q < " + std::to_string(l.rounds) + "; ++pl_q) {");
  ++indent_;
  line("const int pl_blk = " + fragment_block(l) + ";");
  line("if (pl_blk < " + std::to_string(l.blocks()) + ") {");
  ++indent_;
  line("#pragma unroll");
  line("for (int pl_i = 0; pl_i < " + half + "; ++pl_i) {");
  ++indent_;
  line("const " + A + " pl_x = " + t.element(x.name + "[pl_q * " + half + " + pl_i]", "") + ";");
  line("if ((pl_i >> 1) & 1) pl_r1 = pl_comb(pl_r1, pl_x); else pl_r0 = pl_comb(pl_r0, pl_x);");
  --indent_;
  line("}");
  --indent_;
  line("}");
  // A row's blocks are this thread's consecutive rounds (one warpgroup), or its one block (a block
  // per row band): its last ends the row. Every thread of the group shuffles alike (host
  // emulation's shuffles sync the group).
  line("if (pl_q % " + bn + " == " + bn + " - 1) {");
  ++indent_;
  line("pl_r0 = pl_team_combine<false>(pl_r0, 4, pl_comb, (" + A + "*)0);");
  line("pl_r1 = pl_team_combine<false>(pl_r1, 4, pl_comb, (" + A + "*)0);");
  if (into_registers) {
    // (The quad's shuffles left its total with every lane.) Register 2 x band round + h.
    const std::string k = "pl_q / " + bn + " * 2";
    line(out + "[" + k + "] = " + t.result("pl_r0") + ";");
    line(out + "[" + k + " + 1] = " + t.result("pl_r1") + ";");
  } else {
    line("if (pl_blk < " + std::to_string(l.blocks()) + " && (pl_tid() & 3) == 0) {");
    ++indent_;
    line("const int pl_row = pl_blk / " + bn + " * 64 + 16 * ((pl_tid() & 127) >> 5) + ((pl_tid() & 31) >> 2);");
    line(out + "[pl_row] = " + t.result("pl_r0") + ";");
    line(out + "[pl_row + 8] = " + t.result("pl_r1") + ";");
    --indent_;
    line("}");
  }
  line("pl_r0 = pl_r1 = " + t.identity + ";");
  --indent_;
  line("}");
  --indent_;
  line("}");
  --indent_;
  line("}");
}

void Emitter::emit_blocked_row_reduction(const ir::Op& op, const std::string& out, const TeamReduction& t,
                                         bool into_registers) {
  const ValueInfo& x = info(op.operands[0]);
  const FragmentLayout& l = x.frag;
  const std::string A = t.acc_type, per_row = std::to_string(l.registers_per_row()), bands = std::to_string(l.m / l.band_rows());
  const int P = l.warps_per_row;
  const std::string row = blocked_row(l);
  // A row spread over P warps: their partial results meet in the arena.
  const int64_t bytes = P > 1 ? l.m * P * t.acc_bytes : 0, offset = P > 1 ? ctx_.arena->alloc(bytes) : 0;
  const std::string scratch = P > 1 ? fresh("rows") : "";
  line("{");
  ++indent_;
  line("auto pl_comb = [](" + A + " a, " + A + " b) { return " + t.combine + "; };");
  if (P > 1) line(A + "* " + scratch + " = (" + A + "*)(" + ctx_.arena_base + " + " + std::to_string(offset) + ");");
  line("#pragma unroll");
  line("for (int pl_q = 0; pl_q < " + bands + "; ++pl_q) {");
  ++indent_;
  // The thread's registers of its row, then the row's T lanes (each then has the warp's part of
  // the row). Every thread of the group shuffles alike.
  line(A + " pl_r = " + t.identity + ";");
  line("#pragma unroll");
  line("for (int pl_i = 0; pl_i < " + per_row + "; ++pl_i) pl_r = pl_comb(pl_r, " +
       t.element(x.name + "[pl_q * " + per_row + " + pl_i]", blocked_column(l)) + ");");
  line("pl_r = pl_team_combine<false>(pl_r, " + std::to_string(l.lanes_per_row) + ", pl_comb, (" + A + "*)0);");
  if (P > 1) line(first_of_row(l, false) + scratch + "[" + row + " * " + std::to_string(P) + " + " + warp_col(l) + "] = pl_r;");
  else if (into_registers) line(out + "[pl_q] = " + t.result("pl_r") + ";");
  else line(first_of_row(l, false) + out + "[" + row + "] = " + t.result("pl_r") + ";");
  --indent_;
  line("}");
  if (P > 1) {
    after_tile_write();
    barrier();
    // Every lane of the row's warps combines their parts (into registers), or the first writes.
    line("#pragma unroll");
    line("for (int pl_q = 0; pl_q < " + bands + "; ++pl_q) {");
    ++indent_;
    line(A + " pl_r = " + t.identity + ";");
    line("for (int pl_w = 0; pl_w < " + std::to_string(P) + "; ++pl_w) pl_r = pl_comb(pl_r, " + scratch + "[" + row + " * " +
         std::to_string(P) + " + pl_w]);");
    if (into_registers) line(out + "[pl_q] = " + t.result("pl_r") + ";");
    else line(replica_guard(*rows_of(l)) + out + "[" + row + "] = " + t.result("pl_r") + ";");
    --indent_;
    line("}");
  }
  --indent_;
  line("}");
  if (P > 1) ctx_.arena->release(offset, bytes);
}

void Emitter::emit_blocked_column_reduction(const ir::Op& op, const std::string& out, const TeamReduction& t,
                                            bool into_registers) {
  const ValueInfo& x = info(op.operands[0]);
  const FragmentLayout& l = x.frag;
  const std::string A = t.acc_type, n = std::to_string(l.n), per_row = std::to_string(l.registers_per_row());
  const std::string column = blocked_column(l), T = std::to_string(l.lanes_per_row);
  // (The first of a warp's L lane rows writes what they all hold.)
  const std::string first_lane_row = l.lane_rows() == 1 ? "" : "if ((pl_tid() & 31) < " + T + ") ";
  const bool across_warps = l.row_warps() > 1;
  const int64_t bytes = across_warps ? l.row_warps() * l.n * t.acc_bytes : 0, offset = across_warps ? ctx_.arena->alloc(bytes) : 0;
  const std::string scratch = across_warps ? fresh("cols") : "";
  line("{");
  ++indent_;
  line("auto pl_comb = [](" + A + " a, " + A + " b) { return " + t.combine + "; };");
  if (across_warps) line(A + "* " + scratch + " = (" + A + "*)(" + ctx_.arena_base + " + " + std::to_string(offset) + ");");
  // The thread's rows of each of its columns, then its warp's lane rows (shuffles), then — with
  // several warp rows — a row of partial results per warp row.
  line("#pragma unroll");
  line("for (int pl_i = 0; pl_i < " + per_row + "; ++pl_i) {");
  ++indent_;
  line(A + " pl_c = " + t.identity + ";");
  line("#pragma unroll");
  line("for (int pl_q = 0; pl_q < " + std::to_string(l.m / l.band_rows()) + "; ++pl_q) pl_c = pl_comb(pl_c, " +
       t.element(x.name + "[pl_q * " + per_row + " + pl_i]", blocked_row(l)) + ");");
  if (l.lane_rows() > 1) line("for (int pl_s = " + T + "; pl_s < 32; pl_s <<= 1) pl_c = pl_comb(pl_c, pl_shfl_xor(pl_c, pl_s));");
  if (across_warps) line(first_lane_row + scratch + "[" + warp_row(l) + " * " + n + " + " + column + "] = pl_c;");
  else if (into_registers) line(out + "[pl_i] = " + t.result("pl_c") + ";");
  else line(first_lane_row + out + "[" + column + "] = " + t.result("pl_c") + ";");
  --indent_;
  line("}");
  if (!across_warps) {  // (one warp row, a (1, n) block's: the threads have their columns' whole)
    --indent_;
    line("}");
    return;
  }
  after_tile_write();
  barrier();
  // Every warp's lanes combine the warp rows' partials of their columns (into registers), or the
  // first warp row's write the result.
  line("#pragma unroll");
  line("for (int pl_i = 0; pl_i < " + per_row + "; ++pl_i) {");
  ++indent_;
  line(A + " pl_c = " + t.identity + ";");
  line("for (int pl_w = 0; pl_w < " + std::to_string(l.row_warps()) + "; ++pl_w) pl_c = pl_comb(pl_c, " + scratch + "[pl_w * " +
       n + " + " + column + "]);");
  if (into_registers) line(out + "[pl_i] = " + t.result("pl_c") + ";");
  else line(replica_guard(*cols_of(l)) + out + "[" + column + "] = " + t.result("pl_c") + ";");
  --indent_;
  line("}");
  --indent_;
  line("}");
  ctx_.arena->release(offset, bytes);
}

bool Emitter::blocked_column_rev(const ir::Op& op, const FragmentLayout& l) {
  if (op.code != OpCode::Rev || op.operands.size() != 1 || !l.blocked() || l.rows || l.warps_per_row != 1) return false;
  return op.attrs.get_ints(ir::AttrKey::Dims) == ir::Ints{l.cols ? 0 : 1};
}

void Emitter::emit_blocked_column_rev(const ir::Op& op) {
  const FragmentLayout l = info(op.operands[0]).frag;
  const std::string x = info(op.operands[0]).name;
  const ValueId res = op.results[0];
  const bool in_registers = fragments_.count(res) > 0;
  const std::string out = in_registers ? define_fragment(res, l) : define_tile(res);
  const std::string per_row = std::to_string(l.registers_per_row()), last = std::to_string(l.n - 1);
  open_fragment_loop(l);
  if (in_registers) {
    // Column c = i T + t (register i, lane t of the row's T) of the result is column n - 1 - c =
    // (R - 1 - i) T + (T - 1 - t) of x: its register R - 1 - i in lane t ^ (T - 1). Every lane
    // shuffles alike.
    const std::string from = x + "[pl_q * " + per_row + " + " + per_row + " - 1 - pl_i]";
    line(out + "[pl_k] = " + (l.lanes_per_row == 1 ? from : "pl_shfl_xor(" + from + ", " + std::to_string(l.lanes_per_row - 1) + ")") + ";");
  } else {
    // (Each thread writes its elements where they go: the row's, the column reversed.)
    const std::string column = blocked_column(l);
    const std::string at = l.cols ? last + " - (" + column + ")"
                                  : blocked_row(l) + " * " + std::to_string(l.n) + " + " + last + " - (" + column + ")";
    line(replica_guard(l) + out + "[" + at + "] = " + x + "[pl_k];");
  }
  close_fragment_loop();
  if (in_registers) return;
  after_tile_write();
  barrier();  // (the threads holding the elements wrote them, not the arena's loops)
}

std::optional<FragmentLayout> Emitter::register_piece_layout(const ir::Op& op, const ir::Type& result,
                                                             const std::function<const FragmentLayout*(ValueId)>& layout_of) {
  if ((op.code != OpCode::Slice && op.code != OpCode::Concatenate) || op.operands.empty() || result.shape.size() != 2)
    return std::nullopt;
  const FragmentLayout* first = layout_of(op.operands[0]);
  if (!first || !first->blocked() || first->rows || first->cols) return std::nullopt;
  const int64_t band = first->band_rows(), run = int64_t{first->warps_per_row} * first->lanes_per_row;
  FragmentLayout l = *first;
  l.m = result.shape[0], l.n = result.shape[1];
  if (l.m % band != 0 || l.n % run != 0) return std::nullopt;
  if (op.code == OpCode::Slice) {
    const ir::Ints& start = op.attrs.get_ints(ir::AttrKey::Start);
    if (op.attrs.has(ir::AttrKey::Strides))
      for (int64_t step : op.attrs.get_ints(ir::AttrKey::Strides))
        if (step != 1) return std::nullopt;
    if (start.size() != 2 || start[0] % band != 0 || start[1] % run != 0) return std::nullopt;
  } else {
    const int64_t axis = op.attrs.get_int(ir::AttrKey::Axis);
    for (ValueId x : op.operands) {
      const FragmentLayout* o = layout_of(x);
      if (!o) return std::nullopt;
      FragmentLayout same = *o;
      (axis == 0 ? same.m : same.n) = axis == 0 ? l.m : l.n;
      if (!(same == l)) return std::nullopt;  // (the same warps, P and T, the other extent alike)
    }
  }
  // (At most 128 words a thread, as blocked_layout's.)
  if (l.registers() <= 0 || l.registers() * itemsize(result.dtype) > 4 * 128) return std::nullopt;
  return l;
}

std::optional<FragmentLayout> Emitter::register_piece_layout(const ir::Op& op) const {
  if (op.results.size() != 1) return std::nullopt;
  return register_piece_layout(op, type(op.results[0]), [this](ValueId v) { return register_layout(v); });
}

void Emitter::emit_register_piece(const ir::Op& op, const FragmentLayout& l) {
  const ValueId res = op.results[0];
  const bool in_registers = fragments_.count(res) > 0;
  PALLAS_INTERNAL_CHECK(!in_registers || fragments_.at(res) == l, "gpu emitter: a register slice or concatenate in another layout");
  const std::string out = in_registers ? define_fragment(res, l) : define_tile(res);
  const int64_t band = l.band_rows(), run = int64_t{l.warps_per_row} * l.lanes_per_row;
  // Element (row, column) of a blocked tile of n columns is in its register (row / B) (n / (P T))
  // + column / (P T) of the thread holding it: a piece B-aligned in rows and P T-aligned in
  // columns is in the same thread, `bands` bands and `registers` registers further on from the
  // loop's register (pl_q, pl_i) in a tile of layout `in`.
  auto shifted = [](const std::string& regs, const FragmentLayout& in, int64_t bands, int64_t registers) {
    return regs + "[(pl_q + " + std::to_string(bands) + ") * " + std::to_string(in.registers_per_row()) + " + pl_i + " +
           std::to_string(registers) + "]";
  };
  if (op.code == OpCode::Slice) {
    const ir::Ints& start = op.attrs.get_ints(ir::AttrKey::Start);
    const ValueInfo& x = info(op.operands[0]);
    open_fragment_loop(l);  // (the result's registers and elements e)
    line(out + (in_registers ? "[pl_k]" : "[e]") + " = " + shifted(x.name, x.frag, start[0] / band, start[1] / run) + ";");
    close_fragment_loop();
  } else {
    const bool rows = op.attrs.get_int(ir::AttrKey::Axis) == 0;
    int64_t at = 0;  // (the operand's first row or column in the result)
    for (ValueId xv : op.operands) {
      const ValueInfo& x = info(xv);
      open_fragment_loop(x.frag);  // (the operand's registers)
      if (in_registers) {
        line(shifted(out, l, rows ? at / band : 0, rows ? 0 : at / run) + " = " + x.name + "[pl_k];");
      } else {
        const std::string row = blocked_row(x.frag), column = blocked_column(x.frag);
        const std::string e = rows ? "(" + row + " + " + std::to_string(at) + ") * " + std::to_string(l.n) + " + " + column
                                   : row + " * " + std::to_string(l.n) + " + " + std::to_string(at) + " + " + column;
        line(out + "[" + e + "] = " + x.name + "[pl_k];");
      }
      close_fragment_loop();
      at += type(xv).shape[rows ? 0 : 1];
    }
  }
  if (in_registers) return;
  after_tile_write();
  barrier();  // (the threads holding the elements wrote them, not the arena's loops)
}

bool Emitter::blocked_row_scan(const ir::Op& op, const FragmentLayout& l) {
  return row_scan(op) && l.blocked() && !l.rows && !l.cols && l.warps_per_row == 1;
}

void Emitter::emit_blocked_row_scan(const ir::Op& op, const std::string& out, const TeamReduction& t, bool into_registers) {
  const ValueInfo& x = info(op.operands[0]);
  const FragmentLayout& l = x.frag;
  const int64_t registers = l.registers_per_row();
  const std::string A = t.acc_type, per_row = std::to_string(registers);
  // A reverse scan runs from the row's last column: the registers from the last, and in each
  // the higher lanes come first.
  const bool reverse = op.attrs.get_int_or(ir::AttrKey::Reverse, 0) != 0;
  line("{");
  ++indent_;
  line("auto pl_comb = [](" + A + " a, " + A + " b) { return " + t.combine + "; };");
  line("#pragma unroll");
  line("for (int pl_q = 0; pl_q < " + std::to_string(l.m / l.band_rows()) + "; ++pl_q) {");
  ++indent_;
  // Register pl_i of a row band holds columns pl_i T .. pl_i T + T - 1 in its T lanes: their
  // exclusive scan and total (every lane shuffles alike), after the earlier registers' carry.
  line(A + " pl_carry = " + t.identity + ";");
  line("#pragma unroll");
  if (reverse) {
    line("for (int pl_j = 0; pl_j < " + per_row + "; ++pl_j) {");
    ++indent_;
    line("const int pl_i = " + std::to_string(registers - 1) + " - pl_j;");
  } else {
    line("for (int pl_i = 0; pl_i < " + per_row + "; ++pl_i) {");
    ++indent_;
  }
  line("const int pl_k = pl_q * " + per_row + " + pl_i;");
  line("const " + A + " pl_v = " + t.element(x.name + "[pl_k]", "") + ";");
  line(A + " pl_total = pl_v, pl_before = " + t.identity + ";");
  line("for (int pl_m = 1; pl_m < " + std::to_string(l.lanes_per_row) + "; pl_m <<= 1) {");
  line("  const " + A + " pl_o = pl_shfl_xor(pl_total, pl_m);");
  // (The partner's half comes before this lane's where it is the lower one, or in reverse the higher.)
  line(std::string("  if (") + (reverse ? "!(pl_tid() & pl_m)" : "pl_tid() & pl_m") +
       ") pl_before = pl_comb(pl_o, pl_before), pl_total = pl_comb(pl_o, pl_total);");
  line("  else pl_total = pl_comb(pl_total, pl_o);");
  line("}");
  const std::string value = t.result("pl_comb(pl_carry, pl_comb(pl_before, pl_v))");
  if (into_registers) line(out + "[pl_k] = " + value + ";");
  else line(out + "[" + blocked_row(l) + " * " + std::to_string(l.n) + " + " + blocked_column(l) + "] = " + value + ";");
  line("pl_carry = pl_comb(pl_carry, pl_total);");
  --indent_;
  line("}");
  --indent_;
  line("}");
  --indent_;
  line("}");
}

void Emitter::emit_fragment_total(const ir::Op& op, const TeamReduction& t) {
  const ValueInfo& x = info(op.operands[0]);
  const FragmentLayout& l = x.frag;
  const std::string A = t.acc_type, total = fresh("total"), comb = fresh("comb");
  line("auto " + comb + " = [](" + A + " a, " + A + " b) { return " + t.combine + "; };");
  line(A + " " + total + " = " + t.identity + ";");
  open_fragment_loop(l);
  // (A rows value is the same in a quad's four lanes, or a warp's, a columns value in every warp:
  // the first counts it.)
  line(replica_guard(l) + total + " = " + comb + "(" + total + ", " +
       t.element(x.name + "[pl_k]", "") + ");");
  close_fragment_loop();
  // The group's threads combine theirs (warps by shuffles, then through a word per warp): every
  // thread has the total. (pl_team_combine's warps are a power of two: fragment_reduction_kind.)
  PALLAS_INTERNAL_CHECK(ctx_.group_threads > 0 && ctx_.group_threads <= 1024 && (ctx_.group_threads & (ctx_.group_threads - 1)) == 0,
                        "gpu emitter: a register tile's total over a group of " + std::to_string(ctx_.group_threads) + " threads");
  with_team_scratch(true, A, t.acc_bytes, [&](const std::string& scratch) {
    line(total + " = pl_team_combine<true>(" + total + ", pl_nthreads(), " + comb + ", " + scratch + ");");
  });
  define_scalar(op.results[0], t.result(total));
}

void Emitter::emit_fragment_column_reduction(const ir::Op& op, const std::string& out, const TeamReduction& t) {
  const ValueInfo& x = info(op.operands[0]);
  const FragmentLayout& l = x.frag;
  const int64_t per_block = l.nc / 4, columns = l.n / 4;  // a thread's columns: of a block, of all
  const std::string A = t.acc_type, C = std::to_string(columns), n = std::to_string(l.n);
  const std::string B = std::to_string(per_block);
  const int64_t warps = 4 * l.warpgroups, bytes = warps * l.n * t.acc_bytes, offset = ctx_.arena->alloc(bytes);
  line("{");
  ++indent_;
  line("auto pl_comb = [](" + A + " a, " + A + " b) { return " + t.combine + "; };");
  // Per column of the thread (of block column pl_q % blocks_n: one warpgroup, or the only one):
  // its registers of both rows and every row band.
  line(A + " pl_c[" + C + "];");
  line("#pragma unroll");
  line("for (int pl_j = 0; pl_j < " + C + "; ++pl_j) pl_c[pl_j] = " + t.identity + ";");
  open_fragment_loop(l);
  const std::string block_column = l.blocks_n() == 1 ? "" : "pl_q % " + std::to_string(l.blocks_n()) + " * " + B + " + ";
  const std::string c = "pl_c[" + block_column + "(pl_i >> 2) * 2 + (pl_i & 1)]";
  line(c + " = pl_comb(" + c + ", " + t.element(x.name + "[pl_k]", "") + ");");
  close_fragment_loop();
  // The warp's eight rows of a column (lanes l % 4 alike) by shuffles; lanes 0-3 write their
  // columns' totals of the warp, and a thread per column combines the warps'.
  line("#pragma unroll");
  line("for (int pl_j = 0; pl_j < " + C + "; ++pl_j)");
  line("  for (int pl_m = 4; pl_m < 32; pl_m <<= 1) pl_c[pl_j] = pl_comb(pl_c[pl_j], pl_shfl_xor(pl_c[pl_j], pl_m));");
  const std::string scratch = fresh("cols");
  line(A + "* " + scratch + " = (" + A + "*)(" + ctx_.arena_base + " + " + std::to_string(offset) + ");");
  line("if ((pl_tid() & 31) < 4) {");
  line("  #pragma unroll");
  line("  for (int pl_j = 0; pl_j < " + C + "; ++pl_j)");
  line("    " + scratch + "[(pl_tid() >> 5) * " + n + " + pl_j / " + B + " * " + std::to_string(l.nc) + " + pl_j % " + B +
       " / 2 * 8 + 2 * (pl_tid() & 3) + (pl_j & 1)] = pl_c[pl_j];");
  line("}");
  after_tile_write();
  barrier();
  open_thread_loop(l.n);
  line(A + " pl_a = " + t.identity + ";");
  line("for (int pl_w = 0; pl_w < " + std::to_string(warps) + "; ++pl_w) pl_a = pl_comb(pl_a, " + scratch + "[pl_w * " + n +
       " + e]);");
  line(out + "[e] = " + t.result("pl_a") + ";");
  close_loop();
  --indent_;
  line("}");
  ctx_.arena->release(offset, bytes);
}

void Emitter::emit_dot_into_registers(const ir::Op& dot, const FragmentLayout& l, bool rows_contiguous,
                                      const std::string& a, int64_t lda, const std::string& b, int64_t ldb,
                                      const std::function<void(const RefInfo&, const std::string&, bool)>& in_memory) {
  MmaProduct p;
  PALLAS_INTERNAL_CHECK(plain_product(dot, p) && wgmma_shape(p) && p.d_dtype == DType::F32 && !l.blocked(),
                        "gpu emitter: a product into a register tile");
  const ValueId res = dot.results[0];
  const ValueInfo& av = info(dot.operands[0]);
  const bool a_in_registers = av.kind == ValueInfo::Kind::Fragment;  // (of l's rows: plan_fragments)
  const std::string regs = define_fragment(res, l);
  // Elsewhere: the product in the arena (the tensor cores' or the CUDA cores' path of any dot),
  // a register tile a written there first; then each thread's elements of it.
  // (In the branch beside wgmma's path, `other_path`, its tiles are free again after its own
  // barrier: the other path never touched them.)
  auto through_the_arena = [&](bool other_path) {
    std::optional<ValueInfo> a_tile;
    if (a_in_registers) a_tile = arena_copy_of_register_tile(dot.operands[0], fresh("a"), "  // (a, from its registers)");
    const ir::Type& t = type(res);
    const ValueInfo tile = arena_tile(res, regs + "_product", "  // (the product, read into the registers)");
    in_memory(RefInfo{tile.name, t.dtype, t.shape, contiguous_strides(t.shape)}, a_tile ? a_tile->name : a, !other_path);
    after_tile_write();
    barrier();  // (written in the product's layout, read in the registers')
    open_fragment_loop(l, false, IdleWarpgroup::Zeros);
    assign_register(regs, t.dtype, tile.name + "[e]");
    close_fragment_loop();
    if (other_path) barrier();  // (the tiles' last reads, before the code after reuses their room)
    auto release = [&](const ValueInfo& x) {
      if (other_path) ctx_.arena->release_synced(x.offset, x.bytes);
      else ctx_.arena->release(x.offset, x.bytes);
    };
    release(tile);
    if (a_tile) release(*a_tile);
  };
  if (!rows_contiguous) return through_the_arena(false);
  note_slot_layouts(dot, p, true);
  auto s = [](int64_t v) { return std::to_string(v); };
  if (ctx_.register_dots) ++*ctx_.register_dots;
  if (a_in_registers && ctx_.register_a_products) ++*ctx_.register_a_products;
  const std::string targs = std::string(p.b_nk ? "true" : "false") + ", " + s(l.nc) + ", " + p.a_layout + ", " +
                            p.b_layout + ", " + s(l.rounds) + (a_in_registers ? ", " + s(av.frag.nc) : "");
  emit_other_path("if (!pl_tc_dot_fragment<" + targs + ">(" + regs + ", " + a + ", " + s(a_in_registers ? 0 : lda) + ", " +
                      b + ", " + s(ldb) + ", " + s(p.m) + ", " + s(p.n) + ", " + s(p.k) + "))",
                  [&] { through_the_arena(true); });
}

void Emitter::emit_wgmma_from_registers(const ir::Op& op) {
  const ValueInfo& av = info(op.operands[1]);
  const FragmentLayout& l = av.frag;
  const RefInfo& acc = info(op.operands[0]).ref;
  const RefInfo& b = info(op.operands[2]).ref;
  const AccumulatorRegisters* kacc = kernel_acc(op.operands[0]);
  PALLAS_INTERNAL_CHECK(kacc && av.kind == ValueInfo::Kind::Fragment, "gpu emitter: wgmma of a register tile");
  // b: what other threads wrote. (The product into the registers writes no memory: the other
  // path's product orders its writes after earlier reads itself, emit_wgmma.)
  before_mem_read();
  const bool b_kn = b.strides.at(1) == 1, b_nk = !b_kn && b.strides.at(0) == 1;
  // Elsewhere (the ACC in memory, a layout wgmma cannot take): a written to the arena, and the
  // product as any other.
  auto through_the_arena = [&] {
    const ir::Type& at = type(op.operands[1]);
    const ValueInfo tile = arena_copy_of_register_tile(op.operands[1], fresh("a"));
    emit_wgmma(op, RefInfo{tile.name, at.dtype, at.shape, contiguous_strides(at.shape)});
    ctx_.arena->release(tile.offset, tile.bytes);
  };
  if (acc.strides.at(1) != 1 || !(b_kn || b_nk)) return through_the_arena();
  auto s = [](int64_t v) { return std::to_string(v); };
  const std::string lb = b.swizzled.empty() ? "0" : "pl_swizzled_layout(" + b.swizzled + ", " + (b_nk ? "false" : "true") + ")";
  if (ctx_.register_a_products) ++*ctx_.register_a_products;
  emit_other_path("if (!pl_tc_dot_acc<" + std::string(b_nk ? "true" : "false") + ", " + s(kacc->nc) + ", 0, " + lb + ", " +
                      s(kacc->rounds) + ", PL_KERNEL_WGMMA_PENDING, " + s(l.nc) + ">(" + kacc->var + ", " + acc.ptr +
                      ", " + s(acc.strides[0]) + ", " + av.name + ", 0, " + b.ptr + ", " +
                      s(b_nk ? b.strides[1] : b.strides[0]) + ", " + s(l.m) + ", " + s(acc.shape.at(1)) + ", " + s(l.n) + "))",
                  through_the_arena);
  after_mem_read();  // (b, and the ACC's memory on the other path)
  after_mem_write();
}

}  // namespace pallas::gpu::detail
