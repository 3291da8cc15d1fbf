// The emitter's core: values and their storage, synchronisation, Refs, control flow.
//
// Synchronisation: every tile op's loop gives thread t the elements t, t + T, ... of its result,
// so an elementwise consumer reads only what its own thread wrote and needs no barrier. A barrier
// goes in before an op that reads other threads' tile elements (reductions, shape ops, dot) after
// a tile write, before a memory read after a memory write, and before a memory write after any
// memory access. Loop bodies end with a barrier, so each iteration starts clean; a branch that
// may not run never frees arena ranges released outside it.
#include "gpu/emitter.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <set>

#include "eval/interpreter.h"
#include "eval/strided.h"
#include "pallas/error.h"

namespace pallas::gpu::detail {

using ir::OpCode;
using ir::ValueId;

// ---- Types and literals -----------------------------------------------------------------------

std::string ctype(DType t) {
  switch (t) {
    case DType::Bool: return "bool";
    case DType::I8: return "pl_i8";
    case DType::I16: return "pl_i16";
    case DType::I32: return "pl_i32";
    case DType::I64: return "pl_i64";
    case DType::U8: return "pl_u8";
    case DType::U16: return "pl_u16";
    case DType::U32: return "pl_u32";
    case DType::U64: return "pl_u64";
    case DType::F16: return "pl_f16";
    case DType::BF16: return "pl_bf16";
    case DType::F32: return "float";
    case DType::F64: return "double";
    case DType::GpuBarrier: return "pl_u64";  // an mbarrier
    case DType::Semaphore: return "pl_i32";   // a gpu::Semaphore counter
    default: break;
  }
  throw NotSupportedError("the dtype " + std::string(dtype_name(t)) + " on the GPU backend");
}

bool is_half(DType t) { return t == DType::F16 || t == DType::BF16; }
std::string ccompute(DType t) { return is_half(t) ? "float" : ctype(t); }
std::string widen(DType t, const std::string& e) { return is_half(t) ? "pl_ld(" + e + ")" : e; }
std::string narrow(DType t, const std::string& c) {
  if (t == DType::F16) return "pl_to_f16(" + c + ")";
  if (t == DType::BF16) return "pl_to_bf16(" + c + ")";
  return "(" + ctype(t) + ")(" + c + ")";
}

std::string literal(const Scalar& s, DType t) {
  unsigned char bytes[8] = {};
  s.convert_to(t).store_to(bytes);
  uint64_t bits = 0;
  std::memcpy(&bits, bytes, static_cast<size_t>(itemsize(t)));
  char buf[64];
  switch (t) {
    case DType::Bool: return bits ? "true" : "false";
    case DType::F32:
      std::snprintf(buf, sizeof buf, "pl_f32_of_bits(0x%08llXu)", static_cast<unsigned long long>(bits));
      return buf;
    case DType::F64:
      std::snprintf(buf, sizeof buf, "pl_bitcast<double>(0x%016llXull)", static_cast<unsigned long long>(bits));
      return buf;
    case DType::F16:
    case DType::BF16:
      std::snprintf(buf, sizeof buf, "%s{(pl_u16)0x%04llX}", ctype(t).c_str(), static_cast<unsigned long long>(bits));
      return buf;
    case DType::I64:
      std::snprintf(buf, sizeof buf, "(pl_i64)0x%016llXull", static_cast<unsigned long long>(bits));
      return buf;
    case DType::U64:
      std::snprintf(buf, sizeof buf, "0x%016llXull", static_cast<unsigned long long>(bits));
      return buf;
    default:
      std::snprintf(buf, sizeof buf, "(%s)0x%llXu", ctype(t).c_str(), static_cast<unsigned long long>(bits));
      return buf;
  }
}

bool whole_dim(const ir::IndexEntry& e, int64_t size) {
  return e.is_slice && e.dynamic < 0 && e.start == 0 && e.stride == 1 && e.size == size;
}

bool whole_view(const ir::Indexer& idx, const Shape& shape) {
  for (size_t d = 0; d < idx.entries.size(); ++d)
    if (!whole_dim(idx.entries[d], shape.at(d))) return false;
  return true;
}

std::vector<int64_t> contiguous_strides(const Shape& s) {
  std::vector<int64_t> st(s.size());
  int64_t acc = 1;
  for (size_t d = s.size(); d-- > 0;) {
    st[d] = acc;
    acc *= s[d];
  }
  return st;
}

std::vector<std::string> index_exprs(const Shape& shape, const std::string& flat) {
  std::vector<std::string> idx(shape.size());
  int64_t inner = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    std::string i = inner == 1 ? flat : "(" + flat + " / " + std::to_string(inner) + ")";
    idx[d] = d == 0 ? i : "(" + i + " % " + std::to_string(shape[d]) + ")";
    inner *= shape[d];
  }
  return idx;
}

std::string sum_of(const std::vector<std::string>& idx, const std::vector<int64_t>& strides) {
  std::string out;
  for (size_t d = 0; d < idx.size(); ++d) {
    if (strides[d] == 0 || idx[d] == "0") continue;
    out += (out.empty() ? "" : " + ") + idx[d] + " * " + std::to_string(strides[d]) + "LL";  // (64-bit: see view)
  }
  return out.empty() ? "0" : "(" + out + ")";
}

std::string offset_of(const Shape& shape, const std::vector<int64_t>& strides, const std::string& flat) {
  if (strides == contiguous_strides(shape)) return flat;
  std::vector<std::string> idx = index_exprs(shape, flat);
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] == 1) idx[d] = "0";  // a size-1 dim moves nothing
  return sum_of(idx, strides);
}

// ---- Arena --------------------------------------------------------------------------------------

int64_t Arena::alloc(int64_t bytes, int64_t align) {
  bytes = std::max<int64_t>(16, (bytes + 15) / 16 * 16);
  const int64_t off = take(bytes, align);
  for (std::vector<Range>& log : logs_) log.push_back({off, bytes});
  return off;
}

int64_t Arena::take(int64_t bytes, int64_t align) {
  for (size_t i = 0; i < free_.size(); ++i) {
    // The first aligned place in the range (its head below stays free: an aligned array need not
    // pass over a range whose start a small tile took).
    const Range r = free_[i];
    const int64_t off = (r.offset + align - 1) / align * align, tail = r.offset + r.bytes - (off + bytes);
    if (tail < 0) continue;
    if (off == r.offset) {
      free_[i] = {off + bytes, tail};
      if (tail == 0) free_.erase(free_.begin() + static_cast<long>(i));
    } else {
      free_[i].bytes = off - r.offset;
      if (tail > 0) free_.insert(free_.begin() + static_cast<long>(i) + 1, {off + bytes, tail});
    }
    return off;
  }
  int64_t off = (top_ + align - 1) / align * align;
  top_ = off + bytes;
  peak_ = std::max(peak_, top_);
  return off;
}

void Arena::release(int64_t offset, int64_t bytes) {
  pending_.push_back({offset, std::max<int64_t>(16, (bytes + 15) / 16 * 16)});
}

void Arena::on_barrier() {
  free_.insert(free_.end(), pending_.begin(), pending_.end());
  pending_.clear();
  merge_free();
}

void Arena::release_synced(int64_t offset, int64_t bytes) {
  free_.push_back({offset, std::max<int64_t>(16, (bytes + 15) / 16 * 16)});
  merge_free();
}

void Arena::settle_pending_since(size_t mark) {
  if (mark >= pending_.size()) return;
  free_.insert(free_.end(), pending_.begin() + static_cast<long>(mark), pending_.end());
  pending_.resize(mark);
  merge_free();
}

Arena::Alternatives Arena::begin_alternatives() {
  logs_.emplace_back();
  return {free_, pending_, top_, logs_.size() - 1};
}

bool Arena::all_given_back(const std::vector<Range>& ranges) const {
  std::vector<Range> back = free_;
  back.insert(back.end(), pending_.begin(), pending_.end());
  std::sort(back.begin(), back.end(), [](const Range& a, const Range& b) { return a.offset < b.offset; });
  for (const Range& r : ranges) {
    int64_t at = r.offset;  // (the first byte of r not yet seen given back)
    for (const Range& o : back)
      if (o.offset <= at && o.offset + o.bytes > at) at = o.offset + o.bytes;
    if (at < r.offset + r.bytes && at < top_) return false;
  }
  return true;
}

void Arena::next_alternative(const Alternatives& a) {
  if (!all_given_back(logs_[a.log])) return;  // (the next branch goes on from here)
  free_ = a.free, pending_ = a.pending, top_ = a.top;
}

void Arena::end_alternatives(const Alternatives& a) {
  std::vector<Range> taken = std::move(logs_[a.log]);
  logs_.pop_back();
  for (const Range& r : taken) {
    const int64_t end = r.offset + r.bytes;
    if (end > top_) {  // (taken by a branch before the arena was rewound)
      free_.push_back({top_, end - top_});
      top_ = end;
      peak_ = std::max(peak_, top_);
    }
    // r's free parts become pending; held parts stay held.
    std::vector<Range> kept;
    for (const Range& f : free_) {
      const int64_t lo = std::max(f.offset, r.offset), hi = std::min(f.offset + f.bytes, end);
      if (lo >= hi) {
        kept.push_back(f);
        continue;
      }
      if (f.offset < lo) kept.push_back({f.offset, lo - f.offset});
      if (f.offset + f.bytes > hi) kept.push_back({hi, f.offset + f.bytes - hi});
      pending_.push_back({lo, hi - lo});
    }
    free_ = std::move(kept);
  }
  merge_free();  // (an enclosing begin_alternatives' log has these too: alloc wrote every log)
}

void Arena::merge_free() {
  std::sort(free_.begin(), free_.end(), [](const Range& a, const Range& b) { return a.offset < b.offset; });
  std::vector<Range> merged;
  for (const Range& r : free_) {
    if (!merged.empty() && merged.back().offset + merged.back().bytes == r.offset)
      merged.back().bytes += r.bytes;
    else
      merged.push_back(r);
  }
  free_ = std::move(merged);
  // A free range at the top shrinks the arena back.
  if (!free_.empty() && free_.back().offset + free_.back().bytes == top_) {
    top_ = free_.back().offset;
    free_.pop_back();
  }
}

// ---- Emitter ------------------------------------------------------------------------------------

Emitter::Emitter(const ir::Kernel& k, EmitContext ctx, int indent)
    : k_(k), ctx_(std::move(ctx)), indent_(indent), values_(k.values.size()) {
  std::function<void(const ir::Region&, int)> nest = [&](const ir::Region& r, int depth) {
    region_depth_[&r] = depth;
    for (const ir::Op& op : r.ops)
      for (const ir::Region& sub : op.regions) nest(sub, depth + 1);
  };
  nest(k.body, 0);
}

const std::set<ValueId>& Emitter::outer_reads(const ir::Region& r) {
  if (const auto it = outer_reads_.find(&r); it != outer_reads_.end()) return it->second;
  std::set<ValueId> reads;
  for (const ir::Op& op : r.ops) {
    reads.insert(op.operands.begin(), op.operands.end());
    for (const ir::Region& sub : op.regions) {
      const std::set<ValueId>& inner = outer_reads(sub);
      reads.insert(inner.begin(), inner.end());
    }
  }
  for (ValueId a : r.args) reads.erase(a);
  for (const ir::Op& op : r.ops)
    for (ValueId v : op.results) reads.erase(v);
  return outer_reads_[&r] = std::move(reads);
}

void Emitter::line(const std::string& s) {
  if (s.rfind("//", 0) != 0) just_synced_ = false;  // a comment after a barrier: still synced
  *ctx_.out << std::string(static_cast<size_t>(indent_) * 2, ' ') << s << "\n";
}

std::string Emitter::fresh(const std::string& prefix) { return prefix + std::to_string(counter_++); }

void Emitter::bind_ref(ValueId v, RefInfo r) {
  ValueInfo& i = values_[static_cast<size_t>(v)];
  i.kind = ValueInfo::Kind::Ref;
  i.ref = std::move(r);
}

void Emitter::bind_scalar(ValueId v, const std::string& expr) {
  const ir::Type& t = type(v);
  std::string name = "v" + std::to_string(v);
  line("[[maybe_unused]] " + ctype(t.dtype) + " " + name + " = " + expr + ";");
  ValueInfo& i = values_[static_cast<size_t>(v)];
  i.kind = ValueInfo::Kind::Scalar;
  i.name = name;
}

ValueInfo Emitter::arena_tile(ValueId v, const std::string& name, const std::string& comment) {
  const ir::Type& t = type(v);
  ValueInfo i;
  i.kind = ValueInfo::Kind::Tile;
  i.bytes = std::max<int64_t>(1, t.size()) * itemsize(t.dtype);
  i.offset = ctx_.arena->alloc(i.bytes);
  i.name = name;
  line(ctype(t.dtype) + "* " + i.name + " = (" + ctype(t.dtype) + "*)(" + ctx_.arena_base + " + " +
       std::to_string(i.offset) + ");" + comment);
  return i;
}

std::string Emitter::define_tile(ValueId v) {
  const ValueInfo t = arena_tile(v, "v" + std::to_string(v));
  ValueInfo& i = values_[static_cast<size_t>(v)];
  i.kind = t.kind;
  i.bytes = t.bytes;
  i.offset = t.offset;
  i.owns_slot = true;
  i.name = t.name;
  return i.name;
}

std::string Emitter::define_scalar(ValueId v, const std::string& expr) {
  bind_scalar(v, expr);
  return info(v).name;
}

std::string Emitter::at(ValueId v, const std::string& flat) const {
  const ValueInfo& i = info(v);
  if (i.kind == ValueInfo::Kind::Scalar) return i.name;
  if (i.kind == ValueInfo::Kind::Tile) return i.name + "[" + flat + "]";
  if (i.kind == ValueInfo::Kind::Fused) {
    if (i.producer->code == OpCode::Load)
      return reading_old_registers_ && register_updates_.count(i.producer) ? "pl_old" : i.ref.elem(flat);
    if (i.producer->code == OpCode::BroadcastInDim) return broadcast_element(*i.producer, flat);
    return "(" + elementwise_expr(*i.producer, flat) + ")";
  }
  if (i.kind == ValueInfo::Kind::Fragment) {
    // Only a loop over the registers of its layout reads it, each element at its own index; a rows
    // value also a loop of its tile, at the element's row (a broadcast: plan_fragments).
    PALLAS_INTERNAL_CHECK(fragment_loop_, "gpu emitter: register tile %" + std::to_string(v) + " read outside its layout's loop");
    if (i.frag.cols && !fragment_loop_->cols) {
      PALLAS_INTERNAL_CHECK(cols_of(*fragment_loop_) == i.frag,
                            "gpu emitter: columns %" + std::to_string(v) + " read in a loop of another tile");
      return i.name + "[pl_i]";  // (the loop's column of 32: open_fragment_loop)
    }
    if (i.frag.rows && !fragment_loop_->rows) {
      PALLAS_INTERNAL_CHECK(rows_of(*fragment_loop_) == i.frag,
                            "gpu emitter: rows %" + std::to_string(v) + " read in a loop of another tile");
      return i.name + "[" + rows_register(*fragment_loop_) + "]";
    }
    PALLAS_INTERNAL_CHECK(*fragment_loop_ == i.frag && flat == "e",
                          "gpu emitter: register tile %" + std::to_string(v) + " read outside its layout's loop");
    return i.name + "[pl_k]";
  }
  throw InternalError("gpu emitter: value %" + std::to_string(v) + " is not an array value");
}

void Emitter::open_thread_loop(int64_t n, const std::string& var) {
  // Not unrolled: NVVM otherwise unrolls every such loop by 4 with a remainder loop, which was a
  // third to a half of the cold NVRTC compile of the examples (docs/PERFORMANCE.md, stop 17).
  // The loops that move an operand's blocks are batched instead (batched_store_loop).
  line("#pragma unroll 1");
  line("for (pl_i64 " + var + " = pl_tid(); " + var + " < " + std::to_string(n) + "; " + var +
       " += pl_nthreads()) {");
  ++indent_;
}

void Emitter::batched_store_loop(int64_t n, const std::string& T, const std::string& value, const std::string& cond,
                                 const std::string& target, const std::function<void()>& prelude) {
  const std::string B = std::to_string(kStoreBatch), N = std::to_string(n);
  // Whole batches for every thread on the GPU (n a multiple of a batch of the group): the bound
  // check is left to host emulation (PL_IN_BATCH).
  const bool whole = ctx_.group_threads > 0 && n % (kStoreBatch * ctx_.group_threads) == 0;
  line("#pragma unroll 1");
  line("for (pl_i64 e0 = pl_tid(); e0 < " + N + "; e0 += " + B + " * pl_nthreads()) {");
  ++indent_;
  line(T + " pl_v[" + B + "];");
  if (!cond.empty()) line("bool pl_m[" + B + "];");
  auto phase = [&](const std::string& guard, const std::string& body) {
    line("#pragma unroll");
    line("for (int u = 0; u < " + B + "; ++u) {");
    ++indent_;
    line("const pl_i64 e = e0 + u * pl_nthreads();");
    line("if (" + guard + ") {");
    ++indent_;
    if (prelude) prelude();
    line(body);
    --indent_;
    line("}");
    --indent_;
    line("}");
  };
  const std::string in_range = whole ? "PL_IN_BATCH(e < " + N + ")" : "e < " + N;
  phase(in_range, "pl_v[u] = " + value + ";" + (cond.empty() ? "" : " pl_m[u] = " + cond + ";"));
  phase(in_range + (cond.empty() ? "" : " && pl_m[u]"), target + " = pl_v[u];");
  --indent_;
  line("}");
}

void Emitter::open_block(const std::string& header) {
  line(header + " {");
  ++indent_;
}

void Emitter::else_block() {
  --indent_;
  line("} else {");
  ++indent_;
  // The else branch starts where the if branch did: just after the caller's barrier.
  just_synced_ = true;
  tile_written_ = mem_written_ = mem_read_ = false;
  groups_read_.clear();
  groups_written_.clear();
}

void Emitter::close_loop() {
  --indent_;
  line("}");
}

std::string Emitter::scalar_slot_begin(ValueId v) {
  const ir::Type& t = type(v);
  int64_t off = ctx_.arena->alloc(itemsize(t.dtype));
  std::string slot = fresh("slot");
  line(ctype(t.dtype) + "* " + slot + " = (" + ctype(t.dtype) + "*)(" + ctx_.arena_base + " + " +
       std::to_string(off) + ");");
  values_[static_cast<size_t>(v)].offset = off;  // remembered for the release
  return slot;
}

void Emitter::scalar_slot_end(ValueId v, const std::string& slot) {
  after_tile_write();
  barrier();
  int64_t off = values_[static_cast<size_t>(v)].offset;
  bind_scalar(v, slot + "[0]");
  values_[static_cast<size_t>(v)].offset = -1;
  ctx_.arena->release(off, itemsize(type(v).dtype));
}

void Emitter::barrier() {
  if (!just_synced_) line("pl_sync();");
  just_synced_ = true;
  tile_written_ = mem_written_ = mem_read_ = false;
  groups_read_.clear();
  groups_written_.clear();
  if (conditional_depth_ == 0) ctx_.arena->on_barrier();
}

void Emitter::before_cross_read() {
  if (tile_written_) barrier();
}
void Emitter::before_mem_read() {
  fold_memory_groups();
  if (mem_written_ || tile_written_) barrier();
}
void Emitter::before_mem_write() {
  fold_memory_groups();
  if (mem_written_ || mem_read_) barrier();
}
void Emitter::fold_memory_groups() {
  mem_read_ = mem_read_ || !groups_read_.empty();
  mem_written_ = mem_written_ || !groups_written_.empty();
  groups_read_.clear();
  groups_written_.clear();
}
void Emitter::before_mem_read(ValueId ref) {
  const int* g = memory_group_of(ref);
  if (!g) return before_mem_read();
  // (No tile is such memory: the arena's slots are not scratch or blocks.)
  if (mem_written_ || groups_written_.count(*g)) barrier();
}
void Emitter::before_mem_write(ValueId ref) {
  const int* g = memory_group_of(ref);
  if (!g) return before_mem_write();
  if (mem_written_ || mem_read_ || groups_written_.count(*g) || groups_read_.count(*g)) barrier();
}
void Emitter::after_mem_read(ValueId ref) {
  if (const int* g = memory_group_of(ref)) groups_read_.insert(*g);
  else after_mem_read();
}
void Emitter::after_mem_write(ValueId ref) {
  if (const int* g = memory_group_of(ref)) groups_written_.insert(*g), ++writes_;
  else after_mem_write();
}

// ---- Liveness: a tile's slot is released after the last op (of its own region) that uses it,
// directly or inside a nested region.
namespace {
void collect_uses(const ir::Op& op, std::set<ValueId>& out) {
  for (ValueId v : op.operands) out.insert(v);
  for (const ir::Region& r : op.regions)
    for (const ir::Op& o : r.ops) collect_uses(o, out);
}
}  // namespace

void Emitter::compute_last_uses(const ir::Region& r) {
  std::map<ValueId, const ir::Op*> last;
  std::set<ValueId> defined;
  for (ValueId a : r.args) defined.insert(a);
  for (const ir::Op& op : r.ops) {
    for (ValueId res : op.results) {
      defined.insert(res);
      last[res] = &op;  // unused results die right after their op
    }
    std::set<ValueId> uses;
    collect_uses(op, uses);
    // A fused value's operands are read where its user reads it: they live until then.
    std::vector<ValueId> pending(uses.begin(), uses.end());
    while (!pending.empty()) {
      auto it = fused_producers_.find(pending.back());
      pending.pop_back();
      if (it == fused_producers_.end()) continue;
      for (ValueId o : it->second->operands)
        if (uses.insert(o).second) pending.push_back(o);
    }
    for (ValueId u : uses)
      if (defined.count(u)) last[u] = &op;
  }
  // What the region yields must survive until the parent has copied it.
  if (!r.ops.empty() && r.ops.back().code == OpCode::Yield)
    for (ValueId y : r.ops.back().operands) last.erase(y);
  for (const auto& [v, op] : last) dies_after_[op].push_back(v);
}

void Emitter::release_value(ValueId v) {
  ValueInfo& i = values_[static_cast<size_t>(v)];
  if (i.kind == ValueInfo::Kind::Tile && i.owns_slot) {
    ctx_.arena->release(i.offset, i.bytes);
    i.owns_slot = false;
  }
  if (const auto m = mirrors_.find(v); m != mirrors_.end()) {  // (a register tile's arena copy)
    ctx_.arena->release(m->second.offset, m->second.bytes);
    mirrors_.erase(m);
  }
}

void Emitter::release_dead(const ir::Op& op) {
  auto it = dies_after_.find(&op);
  if (it == dies_after_.end()) return;
  for (ValueId v : it->second) release_value(v);
}

void Emitter::release_yielded(const ir::Region& r, const std::vector<ValueId>& ys) {
  std::set<ValueId> made_here;  // (not the region's arguments or an enclosing region's values)
  for (const ir::Op& op : r.ops) made_here.insert(op.results.begin(), op.results.end());
  for (ValueId y : ys)
    if (made_here.count(y)) release_value(y);
}

// ---- Fusion: an array value with one use, by an op of the same region that reads it element by
// element at the flat index it writes (an elementwise op; the value or mask of a store or swap),
// gets no loop and no arena tile of its own: its user computes each element from the
// producer's expression (at()). `o[...] = o[...] + x` becomes one loop of `o[e] = o[e] + x[e]`.
// Fewer loops make the generated code faster and its cold compile shorter (NVVM and ptxas time
// grows with the number of loops; docs/PERFORMANCE.md, stop 19).
// A load fuses under two more conditions, since the memory it reads is read later, in the
// user's loop: every op between the load and that loop is a fused elementwise op or a load
// (nothing writes memory in between), and when the loop is a store's or swap's, the load reads
// the very view the store writes (same ref, same indexer and dynamic indices), or memory the
// store cannot reach (two operands' blocks that are not an aliased input/output pair:
// set_memory_group): each thread then reads and writes its own elements, so no barrier is needed
// between them. A load from any other view stays a tile: a store through a different view of the
// same memory (or an aliased operand, or an overlapping Union member) could overwrite an element
// another thread has not read yet.
namespace {
bool reads_element_at_its_own_index(const ir::Op& user, ValueId v, bool user_elementwise) {
  if (user_elementwise) return true;
  if (user.code != OpCode::Store && user.code != OpCode::Swap) return false;
  return user.operands.empty() || user.operands[0] != v;  // the value or the mask, never the ref
}
bool same_view(const ir::Op& load, const ir::Op& store) {
  if (load.operands.empty() || store.operands.empty() || load.operands[0] != store.operands[0]) return false;
  const ir::Indexer& a = load.attrs.get_indexer(ir::AttrKey::Index);
  if (!(a == store.attrs.get_indexer(ir::AttrKey::Index))) return false;
  for (const ir::IndexEntry& e : a.entries)
    if (e.dynamic >= 0 && (static_cast<size_t>(e.dynamic) >= load.operands.size() ||
                           static_cast<size_t>(e.dynamic) >= store.operands.size() ||
                           load.operands[static_cast<size_t>(e.dynamic)] !=
                               store.operands[static_cast<size_t>(e.dynamic)]))
      return false;
  return true;
}
}  // namespace

void Emitter::plan_fusion(const ir::Region& r) {
  constexpr size_t kNested = static_cast<size_t>(-1);
  // Each value's uses in r (an op using it twice counts twice) and the op of r using it.
  std::map<ValueId, int> uses;
  std::map<ValueId, size_t> user;
  std::function<void(const ir::Op&)> count_nested = [&](const ir::Op& op) {
    for (const ir::Region& sub : op.regions)
      for (const ir::Op& o : sub.ops) {
        for (ValueId v : o.operands) ++uses[v], user[v] = kNested;
        count_nested(o);
      }
  };
  for (size_t i = 0; i < r.ops.size(); ++i) {
    for (ValueId v : r.ops[i].operands) ++uses[v], user[v] = i;
    count_nested(r.ops[i]);
  }
  auto single_user = [&](ValueId v) -> size_t {
    auto u = uses.find(v);
    return u == uses.end() || u->second != 1 ? kNested : user[v];
  };
  auto distinct_memory = [&](ValueId a, ValueId b) {
    const int *ga = memory_group_of(a), *gb = memory_group_of(b);
    return ga && gb && *ga != *gb;
  };
  // The gpu::kernel ACCs in registers that r's ops read: a view made in r (not emitted yet) of
  // one has its registers — also for the loop bodies in r that plan_fragments plans before r is
  // emitted (planned_acc_views_, r's views while r is planned), so that they plan as they will
  // when emitted.
  struct RestoreViews {
    std::map<ValueId, const AccumulatorRegisters*>& views;
    std::map<ValueId, const AccumulatorRegisters*> saved;
    ~RestoreViews() { views = std::move(saved); }
  } restore{planned_acc_views_, planned_acc_views_};
  auto acc_of = [&](ValueId v) -> const AccumulatorRegisters* {
    const auto it = planned_acc_views_.find(v);
    return it != planned_acc_views_.end() ? it->second : kernel_acc(v);
  };
  for (const ir::Op& op : r.ops)
    if (op.code == OpCode::RefView && acc_of(op.operands[0])) planned_acc_views_[op.results[0]] = acc_of(op.operands[0]);
  auto whole = [&](const ir::Op& op) {
    return whole_view(op.attrs.get_indexer(ir::AttrKey::Index), type(op.operands[0]).shape) &&
           op.attrs.get_int_or(ir::AttrKey::Masked, 0) == 0;
  };
  std::vector<bool> elementwise(r.ops.size()), fused(r.ops.size());
  for (size_t i = 0; i < r.ops.size(); ++i) elementwise[i] = is_elementwise(r.ops[i]);
  // Whether the ops strictly between `from` and `to` write no memory: fused ops, loads, and ops
  // of values only (no region, no side effect, no Ref operand: elementwise ops, reductions,
  // products — attention's p.astype(bf16) between v's load and p v; not a wgmma_wait).
  auto is_quiet = [&](size_t from, size_t to) {
    for (size_t j = from + 1; j < to; ++j) {
      const ir::Op& op = r.ops[j];
      bool values_only = op.regions.empty() && !op.info().is(ir::kSideEffect);
      for (ValueId o : op.operands) values_only = values_only && !type(o).is_ref;
      if (!fused[j] && op.code != OpCode::Load && !values_only) return false;
    }
    return true;
  };
  // Whether op i's result can be computed by its single user (the user's kind and shape).
  auto fusible_into_user = [&](size_t i) -> size_t {
    const ir::Op& op = r.ops[i];
    if (op.results.size() != 1 || type(op.results[0]).shape.empty() || type(op.results[0]).is_ref) return kNested;
    const size_t u = single_user(op.results[0]);
    if (u == kNested || u <= i) return kNested;
    if (!reads_element_at_its_own_index(r.ops[u], op.results[0], elementwise[u])) return kNested;
    return u;
  };
  for (size_t i = 0; i < r.ops.size(); ++i) {
    const ir::Op& op = r.ops[i];
    fused[i] = elementwise[i] && fusible_into_user(i) != kNested;
    // A broadcast into an elementwise op or a store: its user's loop reads the operand's elements
    // where they are (reads_across: that loop starts with before_cross_read), instead of a pass
    // writing the broadcast tile.
    if (op.code == OpCode::BroadcastInDim && fusible_into_user(i) != kNested) fused[i] = true;
  }
  for (size_t i = 0; i < r.ops.size(); ++i) {
    const ir::Op& op = r.ops[i];
    if (op.code != OpCode::Load || op.attrs.get_int_or(ir::AttrKey::Masked, 0) != 0) continue;
    // A whole ACC in registers goes into a tile of its own straight from them
    // (emit_load_from_registers), rather than being flushed to its memory for the user to read —
    // unless elementwise ops take it to a whole store into the same ACC, which then reads each
    // register in place (register_updates_).
    // (The pallas_call's register accumulator too, for its update stores only,
    // choose_register_accumulator: its other loads read its memory, flushed.)
    const bool ring_acc = acc_regs_.ref >= 0 && op.operands[0] == acc_regs_.ref;
    const bool acc_in_registers = (acc_of(op.operands[0]) || ring_acc) && whole(op) && type(op.operands[0]).shape.size() == 2;
    size_t u = fusible_into_user(i);
    if (acc_in_registers) {
      size_t last = u;
      while (last != kNested && fused[last] && r.ops[last].code != OpCode::BroadcastInDim)
        last = single_user(r.ops[last].results[0]);
      if (last != kNested && r.ops[last].code == OpCode::Store && r.ops[last].operands.size() == 2 &&
          same_view(op, r.ops[last]) && whole(r.ops[last]) && is_quiet(i, last)) {
        fused[i] = true;
        register_updates_.insert(&op);
        continue;
      }
      if (!ring_acc) continue;
    }
    if (u == kNested) continue;
    // Follow the fused ops to the op whose loop computes the element (a fused op has one user,
    // later in r). Past a broadcast, that loop reads the load's elements at other indices.
    bool across = false;
    while (fused[u]) {
      across = across || r.ops[u].code == OpCode::BroadcastInDim;
      u = single_user(r.ops[u].results[0]);
    }
    const bool stores = r.ops[u].code == OpCode::Store || r.ops[u].code == OpCode::Swap;
    fused[i] = is_quiet(i, u) && (!stores || (!across && same_view(op, r.ops[u])) ||
                                  distinct_memory(op.operands[0], r.ops[u].operands[0]));
  }
  // A reshape (squeeze, expand_dims) is the same elements at the same flat indices: it also fuses
  // into a user that reads its operand's elements through at() in any order (a broadcast, a
  // reduction), which syncs for such reads itself (before_cross_read) — when its operand is a
  // value of its own (not fused: a broadcast would evaluate a fused expression once per element
  // of its result, and a fused load would be read in a later loop than its checks assumed).
  std::map<ValueId, size_t> producer;  // the op of r computing each single result
  for (size_t j = 0; j < r.ops.size(); ++j)
    if (r.ops[j].results.size() == 1) producer[r.ops[j].results[0]] = j;
  auto producer_in_r = [&](ValueId v) {
    auto it = producer.find(v);
    return it == producer.end() ? kNested : it->second;
  };
  auto reads_through_at = [&](const ir::Op& user) {
    return user.code == OpCode::BroadcastInDim || user.info().is(ir::kReduce);
  };
  for (size_t i = 0; i < r.ops.size(); ++i) {
    const ir::Op& op = r.ops[i];
    const bool reshape = op.code == OpCode::Reshape || op.code == OpCode::Squeeze || op.code == OpCode::ExpandDims;
    if (!reshape || fused[i] || !elementwise[i] || type(op.results[0]).shape.empty()) continue;
    const size_t u = single_user(op.results[0]), p = producer_in_r(op.operands[0]);
    fused[i] = u != kNested && u > i && reads_through_at(r.ops[u]) && (p == kNested || !fused[p]);
  }
  // A tensor-core product reads its operands where they are: a load whose only use is such a dot
  // (nothing writing memory in between) is a view of the ref, not a tile — wgmma's staging and
  // ldmatrix read each element once, so the copy would be a pass over memory for nothing.
  for (size_t i = 0; i < r.ops.size(); ++i) {
    const ir::Op& op = r.ops[i];
    if (op.code != OpCode::Load || fused[i] || op.attrs.get_int_or(ir::AttrKey::Masked, 0) != 0 ||
        op.results.size() != 1 || type(op.results[0]).shape.size() != 2)
      continue;
    const size_t u = single_user(op.results[0]);
    if (u == kNested || u <= i || r.ops[u].code != OpCode::DotGeneral) continue;
    MmaProduct p;
    fused[i] = plain_product(r.ops[u], p) && tensor_core_shape(p) && is_quiet(i, u);
  }
  // `acc[v] = acc[v] + dot(a, b)` in f32 (the accumulator of a blocked matmul): the dot adds its
  // products to acc[v] in place, so neither the product nor the sum is a pass over a tile. The
  // add and the load are fused into the store already; the store's view must be the load's, the
  // ops from the dot to the store all fused (nothing else runs in between), and the dot's
  // operands tiles or views of memory the store cannot reach (another operand's block, another
  // scratch buffer).
  for (size_t d = 0; d < r.ops.size(); ++d) {
    const ir::Op& dot = r.ops[d];
    MmaProduct p;
    if (dot.code != OpCode::DotGeneral || !plain_product(dot, p) || p.d_dtype != DType::F32) continue;
    const ValueId prod = dot.results[0];
    const size_t a = single_user(prod);
    if (a == kNested || a <= d || r.ops[a].code != OpCode::Add || !fused[a]) continue;
    const ValueId other = r.ops[a].operands[0] == prod ? r.ops[a].operands[1] : r.ops[a].operands[0];
    const size_t s = single_user(r.ops[a].results[0]), l = producer_in_r(other);
    if (other == prod || s == kNested || l == kNested || r.ops[s].code != OpCode::Store ||
        r.ops[s].attrs.get_int_or(ir::AttrKey::Masked, 0) != 0)
      continue;
    const ir::Op& store = r.ops[s];
    if (r.ops[l].code != OpCode::Load || !fused[l] || !same_view(r.ops[l], store) ||
        type(other).dtype != DType::F32 || type(store.operands.back()).shape != type(prod).shape)
      continue;
    bool ok = true;
    for (size_t j = d + 1; j < s && ok; ++j) ok = fused[j];
    for (ValueId o : dot.operands) {
      const size_t src = producer_in_r(o);
      if (src != kNested && fused[src] && !distinct_memory(r.ops[src].operands[0], store.operands[0])) ok = false;
    }
    if (!ok) continue;
    accumulating_dots_[&dot] = &store;
    absorbed_.insert({&store, &r.ops[a], &r.ops[l]});
  }
  for (size_t i = 0; i < r.ops.size(); ++i)
    if (fused[i]) fused_producers_[r.ops[i].results[0]] = &r.ops[i];
  // The op whose loop reads each fused load's memory (past the fused ops between): the read is
  // pending until that op is emitted, not the next op (value-only ops may come between, is_quiet).
  for (size_t i = 0; i < r.ops.size(); ++i) {
    if (!fused[i] || r.ops[i].code != OpCode::Load) continue;
    size_t u = single_user(r.ops[i].results[0]);
    while (u != kNested && fused[u]) u = single_user(r.ops[u].results[0]);
    fused_load_users_[&r.ops[i]] = u == kNested || absorbed_.count(&r.ops[u]) ? nullptr : &r.ops[u];
  }
  // `dst[...] = acc[...]`, a whole gpu::kernel ACC matrix in registers stored right away to
  // other memory (unmasked): the registers go to dst.
  for (size_t l = 0; l < r.ops.size(); ++l) {
    const ir::Op& load = r.ops[l];
    if (load.code != OpCode::Load || !acc_of(load.operands[0]) || !whole(load) || l + 1 == r.ops.size()) continue;
    const ir::Op& store = r.ops[l + 1];
    if (store.code != OpCode::Store || store.operands.size() != 2 || store.operands[1] != load.results[0] ||
        single_user(load.results[0]) != l + 1 || store.attrs.get_int_or(ir::AttrKey::Masked, 0) != 0 ||
        acc_of(store.operands[0]))
      continue;
    stores_from_registers_[&store] = &load;
  }
  plan_fragments(r, acc_of);
}

bool Emitter::updates_registers(const ir::Op& store) const {
  std::function<bool(ValueId)> reads = [&](ValueId v) {
    const auto f = fused_producers_.find(v);
    if (f == fused_producers_.end()) return false;
    const ir::Op& op = *f->second;
    if (op.code == OpCode::Load) return register_updates_.count(&op) > 0 && op.operands[0] == store.operands[0];
    for (ValueId o : op.operands)
      if (reads(o)) return true;
    return false;
  };
  return store.code == OpCode::Store && store.operands.size() == 2 && reads(store.operands[1]);
}

Emitter::RegisterAccumulator Emitter::choose_register_accumulator(const ir::Region& body,
                                                                 const std::set<ValueId>& scratch) {
  RegisterAccumulator none;
  const int threads = ctx_.group_threads;
  if (threads <= 0 || threads % 128 != 0) return none;
  // A view made of the scratch (RefView, a transform) would be read later without view() flushing first.
  std::set<ValueId> viewed;
  std::function<void(const ir::Region&)> scan = [&](const ir::Region& r) {
    for (const ir::Op& op : r.ops) {
      if (ir::is_ref_view(op.code)) viewed.insert(op.operands[0]);
      for (const ir::Region& sub : op.regions) scan(sub);
    }
  };
  scan(body);
  plan_fusion(body);  // (emit_region plans the body again, alike)
  for (const ir::Op& dot : body.ops) {
    const auto it = accumulating_dots_.find(&dot);
    if (it == accumulating_dots_.end()) continue;
    const ir::Op& store = *it->second;
    const ValueId ref = store.operands[0];
    MmaProduct p;
    if (!scratch.count(ref) || viewed.count(ref) || !plain_product(dot, p) || !wgmma_shape(p))
      continue;
    const ir::Type& t = type(ref);
    if (t.shape != type(dot.results[0]).shape) continue;  // the store's view is the whole buffer
    RegisterAccumulator a;
    a.ref = ref, a.ptr = info(ref).ref.ptr;
    AccumulatorRegisters& r = a.regs;
    r.var = "pl_acc", r.m = p.m, r.n = p.n;
    r.nc = static_cast<int>(wgmma_width(p.n));
    const int64_t blocks = p.m / 64 * (p.n / r.nc), warpgroups = threads / 128;
    r.rounds = static_cast<int>((blocks + warpgroups - 1) / warpgroups);
    if (r.rounds * r.nc / 2 > 128) continue;  // more registers than a thread should hold
    acc_regs_ = a;
    return a;
  }
  // Else `acc[...] = f(acc[...], dot(a, b))`, elementwise (attention's `acc * alpha + p v`): a
  // whole store of the scratch whose value reads the scratch's whole load and a product on wgmma
  // of its shape. The registers take the store in place (emit_store_into_registers: the product
  // is a register tile of their layout, the load reads each register's old value), the first
  // store of a run fills them, and any other access flushes them (view()).
  for (const ir::Op& store : body.ops) {
    if (store.code != OpCode::Store || store.operands.size() != 2 || !scratch.count(store.operands[0]) ||
        viewed.count(store.operands[0]) || store.attrs.get_int_or(ir::AttrKey::Masked, 0) != 0 ||
        !whole_view(store.attrs.get_indexer(ir::AttrKey::Index), type(store.operands[0]).shape))
      continue;
    const ValueId ref = store.operands[0];
    bool reads_itself = false;
    std::optional<MmaProduct> product;
    std::function<bool(ValueId)> walk = [&](ValueId v) {  // (an elementwise tree of fused ops)
      const auto f = fused_producers_.find(v);
      if (f == fused_producers_.end()) {
        for (const ir::Op& op : body.ops) {
          MmaProduct p;
          if (op.results.size() == 1 && op.results[0] == v && plain_product(op, p) && wgmma_shape(p) &&
              p.d_dtype == DType::F32 && type(v).shape == type(ref).shape)
            product = p;
        }
        return true;  // (another value: read in the registers' loop, where its layout allows)
      }
      const ir::Op& op = *f->second;
      if (op.code == OpCode::Load) {
        if (op.operands[0] != ref) return true;
        reads_itself = reads_itself || whole_view(op.attrs.get_indexer(ir::AttrKey::Index), type(ref).shape);
        return op.operands.size() == 1;
      }
      for (ValueId o : op.operands)
        if (!walk(o)) return false;
      return true;
    };
    if (!walk(store.operands[1]) || !reads_itself || !product) continue;
    RegisterAccumulator a;
    a.ref = ref, a.ptr = info(ref).ref.ptr;
    AccumulatorRegisters& r = a.regs;
    r.var = "pl_acc", r.m = product->m, r.n = product->n;
    r.nc = static_cast<int>(wgmma_width(product->n));
    const int64_t blocks = r.m / 64 * (r.n / r.nc), warpgroups = threads / 128;
    r.rounds = static_cast<int>((blocks + warpgroups - 1) / warpgroups);
    if (r.rounds * r.nc / 2 > 128) continue;
    acc_regs_ = a;
    return a;
  }
  return none;
}

int Emitter::slot_layout(int j) const {
  const auto it = slot_uses_.find(j);
  if (it == slot_uses_.end()) return 0;
  const SlotUses& u = it->second;
  return u.tensor_core > 0 && u.tensor_core == u.views && u.layout > 0 ? u.layout : 0;
}

bool Emitter::is_operand_block(ValueId ref) const {
  const int* g = memory_group_of(ref);
  return g && *g >= 0;
}

bool Emitter::reads_operand_memory(ValueId v) const {
  auto it = fused_producers_.find(v);
  if (it == fused_producers_.end()) return false;
  const ir::Op& op = *it->second;
  if (op.code == OpCode::Load) return is_operand_block(op.operands[0]);
  for (ValueId o : op.operands)
    if (reads_operand_memory(o)) return true;
  return false;
}

void Emitter::emit_fused(const ir::Op& op) {
  line("// " + std::string(op.info().name) + (op.loc.file.empty() ? "" : "  " + op.loc.to_string()) +
       "  (fused into its use)");
  ValueInfo fused;
  fused.kind = ValueInfo::Kind::Fused;
  fused.producer = &op;
  if (op.code == OpCode::Load && register_updates_.count(&op)) {
    // An ACC's registers updated in place are not flushed: the whole view is the ACC itself,
    // read in its registers — its memory only on emit_store_into_registers' other path, which
    // orders that read itself.
    fused.ref = info(op.operands[0]).ref;
  } else if (op.code == OpCode::Load) {
    before_mem_read(op.operands[0]);  // what other threads wrote before is visible to the user's loop
    const auto user = fused_load_users_.find(&op);
    fused_read_refs_.push_back({op.operands[0], user == fused_load_users_.end() ? nullptr : user->second});
    fused.ref = view(op, info(op.operands[0]).ref, op.attrs.get_indexer(ir::AttrKey::Index));
  }
  values_[static_cast<size_t>(op.results[0])] = std::move(fused);
}

bool Emitter::touches_no_memory(const ir::Op& op) const {
  if (!op.regions.empty()) return false;
  if (op.code == OpCode::RefView) return true;  // (its checks read indices only)
  if (!is_elementwise(op)) return false;
  for (ValueId v : op.operands)
    if (type(v).is_ref || !type(v).shape.empty()) return false;
  for (ValueId v : op.results)
    if (type(v).is_ref || !type(v).shape.empty()) return false;
  return true;
}

bool Emitter::is_bulk_copy(const ir::Op& op) {
  return (op.code == OpCode::GpuCopyGmemToSmem || op.code == OpCode::GpuCopySmemToGmem) && !op.attrs.has(ir::AttrKey::Kind);
}

std::vector<ValueId> Emitter::emit_region(const ir::Region& r) {
  bulk_fenced_ = false;  // (a Cond's other branch, the body emitted again: not after this one's copies)
  plan_fusion(r);
  if (const auto kept = captures_kept_.find(&r); kept != captures_kept_.end() && ctx_.register_captures)
    for (ValueId v : kept->second) *ctx_.register_captures += counted_captures_.insert(v).second;
  compute_last_uses(r);
  std::vector<ValueId> yielded;
  const size_t enclosing_reads = fused_read_refs_.size();  // (an enclosing region's, pending past this one)
  for (const ir::Op& op : r.ops) {
    if (op.code == OpCode::Yield) {
      yielded = op.operands;
      continue;
    }
    if (!is_bulk_copy(op) && !touches_no_memory(op)) bulk_fenced_ = false;
    if (absorbed_.count(&op)) {
      line("// " + std::string(op.info().name) + (op.loc.file.empty() ? "" : "  " + op.loc.to_string()) +
           "  (part of the dot's accumulation in place)");
    } else if (op.code == OpCode::Load && !op.results.empty() && is_stored_from_registers(op)) {
      line("// " + std::string(op.info().name) + (op.loc.file.empty() ? "" : "  " + op.loc.to_string()) +
           "  (its store takes the ACC's registers)");
    } else if (!op.results.empty() && fused_producers_.count(op.results[0])) {
      emit_fused(op);
    } else {
      // A register tile's use that reads it as a tile reads its arena copy (emit_mirror).
      std::vector<std::pair<ValueId, ValueInfo>> swapped;
      for (ValueId o : op.operands)
        if (const auto m = mirrors_.find(o); m != mirrors_.end() && info(o).kind == ValueInfo::Kind::Fragment &&
                                             arena_reader_of_register_tile(op, info(o).frag)) {
          swapped.emplace_back(o, info(o));
          values_[static_cast<size_t>(o)] = m->second;
        }
      emit_op(op);
      for (const auto& [o, i] : swapped) values_[static_cast<size_t>(o)] = i;
      for (ValueId v : op.results)
        if (fragment_mirrors_.count(v) && info(v).kind == ValueInfo::Kind::Fragment) emit_mirror(v);
      if (!op.regions.empty()) bulk_fenced_ = false;  // (a branch may not have run, or fenced)
      // The loop that read a fused load's memory has run (its user's; where that is unknown, the
      // next op's).
      for (size_t f = 0; f < fused_read_refs_.size();) {
        const auto [ref, user] = fused_read_refs_[f];
        if (user && user != &op) {
          ++f;
          continue;
        }
        after_mem_read(ref);
        fused_read_refs_.erase(fused_read_refs_.begin() + static_cast<long>(f));
      }
    }
    release_dead(op);
  }
  // (A fused load whose user never came: read by now.)
  for (size_t f = enclosing_reads; f < fused_read_refs_.size(); ++f) after_mem_read(fused_read_refs_[f].first);
  fused_read_refs_.resize(enclosing_reads);
  // (What the region's ops accessed, as plain pending accesses for the code around it: a branch,
  // a loop's body.)
  fold_memory_groups();
  return yielded;
}

void Emitter::emit_op(const ir::Op& op) {
  line("// " + std::string(op.info().name) + (op.loc.file.empty() ? "" : "  " + op.loc.to_string()));
  const uint32_t cat = op.info().categories;
  const bool plain = op.code == OpCode::Load || op.code == OpCode::Store ||
                     (cat & (ir::kMemRead | ir::kMemWrite | ir::kControl | ir::kSideEffect)) == 0;
  if (!plain || !op.regions.empty()) fold_memory_groups();
  switch (op.code) {
    case OpCode::AxisIndex: {
      // A named grid axis (gpu::kernel's mesh axes, a pallas_call's grid names): its program id.
      const std::string& name = op.attrs.get_string(ir::AttrKey::AxisNames);
      for (size_t i = 0; i < ctx_.grid_names.size(); ++i)
        if (ctx_.grid_names[i] == name) {
          bind_scalar(op.results[0], "(pl_i32)" + ctx_.grid_ids + "[" + std::to_string(i) + "]");
          return;
        }
      throw NotSupportedError("axis_index(\"" + name + "\") on the GPU backend: not a grid axis (device-mesh "
                                  "axes are TPU operations: run the kernel with "
                                  ".interpret = pltpu::InterpretParams{})",
                              op.loc);
    }
    case OpCode::DmaStart: case OpCode::DmaWait: case OpCode::GetBarrierSemaphore: case OpCode::SubcoreBarrier:
      throw NotSupportedError(std::string(op.info().name) +
                                  " on the GPU backend (a TPU operation: run the kernel with "
                                  ".interpret = pltpu::InterpretParams{})",
                              op.loc);
    case OpCode::GpuCopyGmemToSmem: case OpCode::GpuCopySmemToGmem: case OpCode::GpuWaitSmemToGmem: case OpCode::GpuCommitSmemToGmemGroup:
    case OpCode::GpuCommitSmem: case OpCode::GpuBarrierArrive: case OpCode::GpuBarrierWait:
    case OpCode::GpuWgmma: case OpCode::GpuWgmmaWait: case OpCode::GpuSetMaxRegisters: case OpCode::GpuAsyncPrefetch:
    case OpCode::NamedRegionBegin: case OpCode::NamedRegionEnd: case OpCode::SemaphoreSignal:
    case OpCode::SemaphoreWait: case OpCode::SemaphoreRead:
      emit_gpu_op(op);
      return;
    case OpCode::ScLoadGather: case OpCode::ScStoreScatter: case OpCode::ScAddupdateScatter:
    case OpCode::ScLoadExpanded: case OpCode::ScStoreCompressed: case OpCode::ScAddupdate:
    case OpCode::ScAddupdateCompressed: case OpCode::ScFetchAndAdd: case OpCode::ScMaskedScan:
    case OpCode::ScScanCount: case OpCode::ScSortKeyVal: case OpCode::ScAllReducePopulationCount:
    case OpCode::ScAllReduceFfs: case OpCode::ScPack: case OpCode::ScUnpack: case OpCode::ScDynamicGather:
      throw NotSupportedError(std::string(op.info().name) +
                                  " on the GPU backend (a TPU SparseCore operation: run the kernel with "
                                  ".interpret = pltpu::InterpretParams{})",
                              op.loc);
    case OpCode::ProgramId:
    case OpCode::NumPrograms: {
      const std::string& arr = op.code == OpCode::ProgramId ? ctx_.grid_ids : ctx_.grid_sizes;
      bind_scalar(op.results[0], "(pl_i32)" + arr + "[" + std::to_string(op.attrs.get_int(ir::AttrKey::Axis)) + "]");
      return;
    }
    case OpCode::DebugPrint: emit_debug_print(op); return;
    case OpCode::DebugCheck: emit_debug_check(op); return;
    default: break;
  }
  if (cat & (ir::kControl | ir::kTerminator)) return emit_control(op);
  if (cat & (ir::kMemRead | ir::kMemWrite) || op.code == OpCode::RefView) return emit_ref_op(op);
  if (ir::is_ref_transform(op.code)) return emit_ref_transform(op);
  if (op.code == OpCode::GpuClusterRef) return emit_cluster_ref(op);
  emit_pure(op);
}

// ---- Refs ---------------------------------------------------------------------------------------

RefInfo Emitter::view(const ir::Op& op, const RefInfo& base, const ir::Indexer& idx) {
  // Any access to the register accumulator's scratch but its products' finds it current.
  if (acc_regs_.ref >= 0 && op.operands[0] == acc_regs_.ref) line(acc_regs_.flush(acc_regs_.ptr));
  // A gpu::kernel ACC in registers: its thread's matrix is a view of it (register_accumulators
  // admits no other); a load or store flushes the registers into the matrix first.
  if (const AccumulatorRegisters* a = kernel_acc(op.operands[0])) {
    if (op.code == OpCode::RefView)
      kernel_accs_[op.results[0]] = *a;
    else
      line(a->flush(base.ptr, base.strides.at(0)));
  }
  RefInfo out;
  out.dtype = base.dtype;
  out.operand = base.operand;
  out.operand_shape = base.operand_shape;
  out.swizzled = base.swizzled;
  out.panel_rows = base.panel_rows, out.panel_cols = base.panel_cols;
  out.tile = base.tile;
  std::string offset;
  for (size_t d = 0; d < idx.entries.size(); ++d) {
    const ir::IndexEntry& e = idx.entries[d];
    const int64_t dim = base.shape[d];
    std::string start = e.dynamic >= 0 ? "(pl_i64)" + info(op.operands[static_cast<size_t>(e.dynamic)]).name
                                       : std::to_string(e.start);
    if (e.dynamic >= 0) {
      // The interpreters' bounds check, recorded for the host to report.
      const int64_t span = e.is_slice ? (e.size - 1) * e.stride : 0;
      if (!e.is_slice || e.size > 0) {
        int site = static_cast<int>(ctx_.error_sites->size());
        ctx_.error_sites->push_back({ErrorSite::Kind::RefIndex, -1, std::string(op.info().name), op.loc,
                                     static_cast<int64_t>(d), e.is_slice, e.size, e.stride, base.shape});
        std::string s = fresh("ix");
        line("{ pl_i64 " + s + " = " + start + ";");
        line("  if (" + s + " < 0 || " + s + " + " + std::to_string(span) + " >= " + std::to_string(dim) + ") " +
             record_failure(site, {s}) + " }");
      }
    }
    if (e.is_slice) {
      out.shape.push_back(e.size);
      out.strides.push_back(base.strides[d] * e.stride);
    }
    // (A 64-bit constant: a static start times a stride may pass 2^31.)
    if (start != "0") offset += (offset.empty() ? "" : " + ") + start + " * " + std::to_string(base.strides[d]) + "LL";
  }
  if (base.slot_input >= 0) {
    // Every access to a ring slot starts with a view of it; only a view of the whole block may
    // be read in a canonical layout (slot_layout), so a part of it keeps the slot row-major.
    ++slot_uses_[base.slot_input].views;
    if (whole_view(idx, base.shape)) out.slot_input = base.slot_input;
  }
  // (A swizzled tile's elements are placed by their index in the whole tile.)
  out.tile_offset = base.tile_offset;
  if (!base.swizzled.empty() && !offset.empty())
    out.tile_offset += (out.tile_offset.empty() ? "(" : " + (") + offset + ")";
  if (offset.empty()) {
    out.ptr = base.ptr;
  } else {
    out.ptr = fresh("r");
    line(ctype(base.dtype) + "* " + out.ptr + " = " + base.ptr + " + (" + offset + ");");
  }
  return out;
}

bool Emitter::is_uniform(ValueId v) const {
  if (type(v).shape.empty()) return true;
  const auto it = fused_producers_.find(v);
  if (it == fused_producers_.end()) return false;  // a tile: its elements are its own
  const ir::Op& op = *it->second;
  if (op.code == OpCode::Constant) return true;
  if (op.code == OpCode::BroadcastInDim) return is_uniform(op.operands[0]);
  if (!is_elementwise(op)) return false;
  for (ValueId o : op.operands)
    if (!is_uniform(o)) return false;
  return true;
}

bool Emitter::is_stored_from_registers(const ir::Op& load) const {
  for (const auto& [store, l] : stores_from_registers_)
    if (l == &load) return true;
  return false;
}

void Emitter::emit_store_from_registers(const ir::Op& store, const ir::Op& load) {
  const AccumulatorRegisters& a = *kernel_acc(load.operands[0]);
  const RefInfo& acc = info(load.operands[0]).ref;  // the thread's matrix
  const RefInfo d = view(store, info(store.operands[0]).ref, store.attrs.get_indexer(ir::AttrKey::Index));
  // (An f32 ACC's matrix goes to f32 memory: never a swizzled tile, whose elements are 2 bytes.)
  PALLAS_INTERNAL_CHECK(d.swizzled.empty());
  if (d.strides.empty() || d.strides.back() != 1) {
    // pl_acc_store writes rows of consecutive elements: into any other view (a transpose, a
    // strided slice) the registers go through the ACC's memory, then the group copies.
    line(a.flush(acc.ptr, acc.strides.at(0)));
    barrier();
    before_mem_write();
    before_mem_read();
    open_thread_loop(a.m * a.n);
    line(d.ptr + "[" + offset_of(d.shape, d.strides, "e") + "] = " + acc.ptr + "[" + offset_of(acc.shape, acc.strides, "e") + "];");
    close_loop();
    after_mem_write();
    after_mem_read();
    return;
  }
  before_mem_write();
  // (Pairs of registers as one store where rows are an even number of elements apart.)
  const char* store_fn = d.strides.at(0) % 2 == 0 ? "pl_acc_store<true>(" : "pl_acc_store(";
  line("if (!" + std::string(store_fn) + a.var + ", " + d.ptr + ", " + std::to_string(d.strides.at(0)) + ", " + std::to_string(a.m) +
       ", " + std::to_string(a.n) + ")) {");
  ++indent_;
  // The ACC's memory is current (nothing in the registers is newer): copy it.
  before_mem_read();
  open_thread_loop(a.m * a.n);
  line(d.ptr + "[" + offset_of(d.shape, d.strides, "e") + "] = " + acc.ptr + "[" + offset_of(acc.shape, acc.strides, "e") + "];");
  close_loop();
  --indent_;
  line("}");
  after_mem_write();
  after_mem_read();
}

void Emitter::emit_ref_transform(const ir::Op& op) {
  const ValueId v = op.operands[0];
  // (register_accumulators and choose_register_accumulator keep an ACC that is transformed in
  // memory.)
  PALLAS_INTERNAL_CHECK(!kernel_acc(v) && !(acc_regs_.ref >= 0 && v == acc_regs_.ref),
                        "a transformed view of an accumulator in registers");
  const RefInfo& base = info(v).ref;
  RefInfo out = base;  // the same pointer, swizzled tile and offset in it: elem() follows strides
  if (base.slot_input >= 0) {
    // Read other than as a whole block: the slot stays row-major (slot_layout).
    ++slot_uses_[base.slot_input].views;
    out.slot_input = -1;
  }
  // The interpreters' rule (and error) on the view's strides; the pointer stays, or is cast.
  eval::RefValue r;
  r.dtype = base.dtype, r.shape = base.shape, r.strides = base.strides;
  const eval::RefValue t = eval::transformed(r, op);
  out.dtype = t.dtype, out.shape = t.shape, out.strides = t.strides;
  if (op.code == OpCode::RefBitcast) {
    // (swizzled_smem_tiles keeps a bitcast tile row-major: its swizzle is in elements of its dtype.)
    PALLAS_INTERNAL_CHECK(base.swizzled.empty(), "a bitcast view of a swizzled tile");
    // A wider element must start on a multiple of its size, as the interpreters check (a
    // misaligned load or store would fault the GPU: "misaligned address", the context lost).
    if (const int64_t size = itemsize(t.dtype); size > itemsize(base.dtype)) {
      ErrorSite site;
      site.kind = ErrorSite::Kind::BitcastAlignment;
      site.op_name = eval::bitcast_not_whole(base.shape, t.dtype);
      site.loc = op.loc;
      ctx_.error_sites->push_back(site);
      line("if (((pl_u64)(" + base.ptr + ") & " + std::to_string(size - 1) + "u) != 0) " +
           record_failure(static_cast<int>(ctx_.error_sites->size()) - 1, {}));
    }
    out.ptr = "((" + ctype(t.dtype) + "*)(" + base.ptr + "))";
    out.operand = -1, out.operand_shape.clear();  // (the operand's TMA boxes count its own elements)
  }
  bind_ref(op.results[0], std::move(out));
}

Emitter::ClusterAxis Emitter::cluster_axis(int64_t mesh_axis) const {
  const size_t a = static_cast<size_t>(mesh_axis - ctx_.first_cluster_axis);
  PALLAS_INTERNAL_CHECK(a < ctx_.cluster_shape.size(), "not a cluster axis");
  ClusterAxis out;
  out.size = ctx_.cluster_shape[a];
  for (size_t d = a + 1; d < ctx_.cluster_shape.size(); ++d) out.stride *= ctx_.cluster_shape[d];
  out.coordinate = "pl_cluster_rank() / " + std::to_string(out.stride) + " % " + std::to_string(out.size);
  return out;
}

void Emitter::emit_cluster_ref(const ir::Op& op) {
  // The CTA at `index` along the axis, at this one's place along the others: its rank in the
  // row-major cluster is this CTA's plus (index - this CTA's coordinate) times the axis's stride.
  // (check_peer_refs lets only loads, stores and atomics take the view: elem() through the
  // pointer, swizzled tiles by their offset, as every CTA lays its shared memory out alike.)
  const RefInfo& base = info(op.operands[0]).ref;
  RefInfo out = base;
  const ClusterAxis axis = cluster_axis(op.attrs.get_ints(ir::AttrKey::Axes).at(0));
  const int64_t size = axis.size;
  ErrorSite site;
  site.kind = ErrorSite::Kind::ClusterIndex;
  site.op_name = op.attrs.get_string(ir::AttrKey::AxisNames);
  site.size = size;
  site.loc = op.loc;
  const int site_no = static_cast<int>(ctx_.error_sites->size());
  ctx_.error_sites->push_back(site);
  const std::string index = "(int)" + info(op.operands[1]).name, rank = fresh("rank");
  line("if (" + index + " < 0 || " + index + " >= " + std::to_string(size) + ") " +
       record_failure(site_no, {"(pl_i64)" + index}));
  line("const int " + rank + " = pl_cluster_rank() + (" + index + " - " + axis.coordinate + ") * " +
       std::to_string(axis.stride) + ";");
  out.ptr = fresh("r");
  line(ctype(base.dtype) + "* " + out.ptr + " = pl_cluster_peer(" + base.ptr + ", " + rank + ");");
  if (!base.tile.empty()) {  // (a swizzled tile: its elements by their offset from the peer's tile start)
    out.tile = fresh("r");
    line(ctype(base.dtype) + "* " + out.tile + " = pl_cluster_peer(" + base.tile + ", " + rank + ");");
  }
  out.operand = -1, out.operand_shape.clear();
  bind_ref(op.results[0], std::move(out));
}

void Emitter::emit_ref_op(const ir::Op& op) {
  if (const auto it = stores_from_registers_.find(&op); it != stores_from_registers_.end())
    return emit_store_from_registers(op, *it->second);
  // A store of one value to the whole of the register accumulator's scratch (`acc[...] = 0`,
  // the zeroing before the first step) sets the registers instead, newer than the scratch:
  // nothing written to it, and the next product does not reload it (pl_acc_fill). Where the
  // products run in memory instead, the store does too.
  // A gpu::kernel's ACC in registers likewise (its thread's matrix).
  const ir::Indexer& idx = op.attrs.get_indexer(ir::AttrKey::Index);
  const bool ring_acc = acc_regs_.ref >= 0 && op.operands[0] == acc_regs_.ref;
  const AccumulatorRegisters* kacc = ring_acc ? &acc_regs_.regs : kernel_acc(op.operands[0]);
  const bool whole_acc = kacc && op.attrs.get_int_or(ir::AttrKey::Masked, 0) == 0 &&
                         whole_view(idx, type(op.operands[0]).shape);
  const bool store_value = op.code == OpCode::Store && op.operands.size() == 2;  // (no dynamic index)
  // A whole load of a gpu::kernel ACC in registers (`s = acc[...]`, attention's scores) takes
  // them straight into the value's tile, and a whole store (`acc[...] = acc[...] * alpha`) sets
  // them from the value: no trip through the ACC's memory (in global memory), which the
  // registers stay newer than.
  if (whole_acc && !ring_acc && type(op.operands[0]).shape.size() == 2) {
    if (op.code == OpCode::Load)
      return fragments_.count(op.results[0]) ? emit_fragment_load(op, *kacc) : emit_load_from_registers(op, *kacc);
    if (store_value && !is_uniform(op.operands[1])) return emit_store_into_registers(op, *kacc);
  }
  // The register accumulator's update (`acc[...] = acc[...] * alpha + p v`, its load fused in):
  // in its registers likewise.
  if (whole_acc && ring_acc && store_value && !is_uniform(op.operands[1]) && updates_registers(op))
    return emit_store_into_registers(op, *kacc);
  // A pallas_call's whole load of a block into a register tile (the blocked layout).
  if (!kacc && op.code == OpCode::Load && op.results.size() == 1 && fragments_.count(op.results[0]))
    return emit_blocked_load(op);
  // A store of register tiles (or of elementwise ops of them) writes each thread's registers.
  if (!kacc && op.code == OpCode::Store) {
    bool across = false;
    if (const std::optional<FragmentLayout> l = fragment_loop_of(op, across)) return emit_fragment_store(op, *l, across);
  }
  if (whole_acc && store_value && is_uniform(op.operands[1])) {
    // Only this branch writes memory: its barrier there, so that where the registers took the
    // value (the tensor cores' path) what follows needs none for it. (pl_acc_fill's answer is
    // the same for the whole group.)
    return emit_other_path("if (!pl_acc_fill(" + kacc->var + ", (float)(" + at(op.operands[1], "0") + "), " +
                               std::to_string(kacc->m) + ", " + std::to_string(kacc->n) + "))",
                           [&] {
                             emit_ref_op_in_memory(op);
                             barrier();
                           });
  }
  emit_ref_op_in_memory(op);
}

void Emitter::emit_load_from_registers(const ir::Op& load, const AccumulatorRegisters& a) {
  const RefInfo& acc = info(load.operands[0]).ref;  // the thread's matrix (its memory)
  const std::string out = define_tile(load.results[0]);
  const std::string n = std::to_string(a.n);
  // Where the ACC's memory is current (nothing in the registers is newer): load it.
  emit_other_path("if (!pl_acc_store(" + a.var + ", " + out + ", " + n + ", " + std::to_string(a.m) + ", " + n + "))", [&] {
    before_mem_read();
    open_thread_loop(a.m * a.n);
    line(out + "[e] = " + acc.ptr + "[" + offset_of(acc.shape, acc.strides, "e") + "];");
    close_loop();
  });
  // Each thread wrote its registers' elements, which other threads read next.
  barrier();
}

void Emitter::emit_store_into_registers(const ir::Op& store, const AccumulatorRegisters& a) {
  // Each thread reads the value's elements of its registers, which other threads computed — or
  // which it holds itself, where the value reads register tiles (of the ACC's layout).
  const FragmentLayout layout = acc_layout(a);
  bool across = true;
  const std::optional<FragmentLayout> frag = fragment_loop_of(store, across, &layout);
  if (!frag || across) before_cross_read();
  fragment_loop_ = layout;  // (the callback's pl_k is the register)
  reading_old_registers_ = true;
  const std::string value = at(store.operands[1], "e");
  reading_old_registers_ = false;
  fragment_loop_.reset();
  emit_other_path("if (!pl_acc_assign(" + a.var + ", " + std::to_string(a.m) + ", " + std::to_string(a.n) +
                      ", [&](pl_i64 e, [[maybe_unused]] float pl_old, [[maybe_unused]] int pl_k) { return (float)(" +
                      value + "); }))",
                  [&] {
                    before_mem_read();  // (the value's load of the ACC reads its memory here)
                    if (frag) {
                      // Register tiles are read in their loop: each thread writes its elements.
                      before_mem_write();
                      const RefInfo& acc = info(store.operands[0]).ref;
                      open_fragment_loop(layout);
                      line(acc.ptr + "[" + offset_of(acc.shape, acc.strides, "e") + "] = " + at(store.operands[1], "e") + ";");
                      close_fragment_loop();
                      after_mem_write();
                      after_mem_read();
                    } else {
                      emit_ref_op_in_memory(store);
                    }
                    barrier();  // (this path wrote the ACC's memory: synced here, so the registers' path needs none)
                  });
  // The registers' path has no barrier of its own: what the value read (other threads' tiles,
  // memory) is written over only after one — a loop carry's holder at the iteration's end
  // (assign_carries syncs before its copies), memory by before_mem_write (the ACC's fused load
  // counts as a read, emit_region), the arena's ranges after the next barrier.
}

void Emitter::emit_other_path(const std::string& header, const std::function<void()>& body) {
  line(header + " {");
  ++indent_;
  ++conditional_depth_;
  const PendingSyncs pending = pending_syncs();
  body();
  --conditional_depth_;
  --indent_;
  line("}");
  restore_pending(pending);
}

void Emitter::emit_ref_op_in_memory(const ir::Op& op) {
  const RefInfo& base = info(op.operands[0]).ref;
  const ir::Indexer& idx = op.attrs.get_indexer(ir::AttrKey::Index);
  RefInfo v = view(op, base, idx);
  if (op.code == OpCode::RefView) {
    bind_ref(op.results[0], v);
    return;
  }
  size_t ndyn = 0;
  for (const ir::IndexEntry& e : idx.entries) ndyn += e.dynamic >= 0;
  const size_t next = 1 + ndyn;
  const bool masked = op.attrs.get_int_or(ir::AttrKey::Masked, 0) != 0;
  const int64_t n = num_elements(v.shape);
  const bool scalar = v.shape.empty();
  const std::string T = ctype(v.dtype);
  auto mem = [&](const std::string& flat) { return v.elem(flat); };

  switch (op.code) {
    case OpCode::Load: {
      before_mem_read();
      ValueId res = op.results[0];
      if (scalar) {
        std::string x = mem("0");
        if (masked) x = "(" + info(op.operands[next]).name + " ? " + x + " : " + info(op.operands[next + 1]).name + ")";
        bind_scalar(res, x);
      } else {
        std::string out = define_tile(res);
        open_thread_loop(n);
        std::string x = mem("e");
        if (masked) x = "(" + at(op.operands[next], "e") + " ? " + x + " : " + at(op.operands[next + 1], "e") + ")";
        line(out + "[e] = " + x + ";");
        close_loop();
        after_tile_write();
      }
      after_mem_read();
      return;
    }
    case OpCode::Store:
    case OpCode::Swap: {
      before_mem_write();
      ValueId val = op.operands[next];
      if (reads_across(val) || (masked && reads_across(op.operands[next + 1]))) before_cross_read();
      std::string mask = masked ? at(op.operands[next + 1], scalar ? "0" : "e") : "";
      if (scalar) {
        if (op.code == OpCode::Swap) bind_scalar(op.results[0], mem("0"));
        // Every thread has read the old value before thread 0 replaces it.
        if (op.code == OpCode::Swap) barrier();
        line("if (pl_tid() == 0" + (masked ? " && " + mask : std::string()) + ") " + mem("0") + " = " +
             info(val).name + ";");
      } else {
        std::string old;
        if (op.code == OpCode::Swap) old = define_tile(op.results[0]);
        if (op.code == OpCode::Store && is_operand_block(op.operands[0]) && reads_operand_memory(val)) {
          // A store to an operand's block of values read from operands' blocks (the loads fused
          // into it): the loop an elementwise kernel's bandwidth depends on. Other loops stay
          // rolled, to keep the cold compile short (batching every load and store made the bf16
          // matmul 1.7x faster but its cold compile 45% longer and softmax 2.7x slower; stop 20).
          batched_store_loop(n, T, at(val, "e"), mask, mem("e"));
        } else {
          open_thread_loop(n);
          if (op.code == OpCode::Swap) line(old + "[e] = " + mem("e") + ";");
          line((masked ? "if (" + mask + ") " : std::string()) + mem("e") + " = " + at(val, "e") + ";");
          close_loop();
        }
        if (op.code == OpCode::Swap) after_tile_write();
      }
      // wgmma reads a swizzled tile in place, through the async proxy: each writer fences its
      // writes before the barrier the reader passes after them.
      if (!v.swizzled.empty()) line("pl_fence_proxy_async();");
      after_mem_write();
      after_mem_read();
      return;
    }
    case OpCode::AtomicRmw:
    case OpCode::AtomicCas: {
      before_mem_write();
      const std::string kind = op.code == OpCode::AtomicRmw ? op.attrs.get_string(ir::AttrKey::Kind) : "cas";
      const std::string fn = atomic_new_value(v.dtype, kind);
      if (fn.empty())
        throw NotSupportedError("atomic_rmw kind '" + kind + "' on " + std::string(dtype_name(v.dtype)), op.loc);
      auto emit_one = [&](const std::string& target, const std::string& x, const std::string& y) {
        std::string lambda = "[&](" + T + " c) -> " + T + " { " + T + " x = " + x + ";" +
                             (y.empty() ? "" : " " + T + " y = " + y + ";") + " return " + fn + "; }";
        return "pl_atomic_update(&" + target + ", " + lambda + ")";
      };
      std::string x0 = at(op.operands[next], scalar ? "0" : "e");
      std::string y0 = op.code == OpCode::AtomicCas ? at(op.operands[next + 1], scalar ? "0" : "e") : "";
      if (scalar) {
        std::string slot = scalar_slot_begin(op.results[0]);
        line("if (pl_tid() == 0) " + slot + "[0] = " + emit_one(mem("0"), x0, y0) + ";");
        after_mem_write();
        scalar_slot_end(op.results[0], slot);
      } else {
        std::string old = define_tile(op.results[0]);
        open_thread_loop(n);
        line(old + "[e] = " + emit_one(mem("e"), x0, y0) + ";");
        close_loop();
        after_tile_write();
      }
      after_mem_write();
      after_mem_read();
      return;
    }
    default: break;
  }
  throw InternalError("gpu emitter: ref op " + std::string(op.info().name));
}

// ---- Control flow -------------------------------------------------------------------------------

std::string Emitter::declare_result_holder(ValueId v) {
  const ir::Type& t = type(v);
  if (t.is_ref) throw NotSupportedError("a control-flow op returning a Ref on the GPU backend");
  if (t.shape.empty()) {
    std::string name = "v" + std::to_string(v);
    line(ctype(t.dtype) + " " + name + ";");
    ValueInfo& i = values_[static_cast<size_t>(v)];
    i.kind = ValueInfo::Kind::Scalar;
    i.name = name;
    return name;
  }
  if (const auto it = fragments_.find(v); it != fragments_.end()) {  // a loop's carry, a branch's result
    if (ctx_.register_carries) ++*ctx_.register_carries;
    return define_fragment(v, it->second);
  }
  return define_tile(v);
}

// dst (a tile holder) = src, element by element (thread-owned: no barrier needed before).
void Emitter::copy_into(ValueId dst, const std::string& dst_name, ValueId src) {
  const ValueInfo& s = info(src);
  if (s.kind == ValueInfo::Kind::Scalar) {
    line(dst_name + " = " + s.name + ";");
    return;
  }
  if (s.name == dst_name) return;
  // (The plan gives a holder in registers what is yielded in registers: plan_loop_carries.)
  PALLAS_INTERNAL_CHECK(s.kind != ValueInfo::Kind::Fragment || info(dst).kind == ValueInfo::Kind::Fragment,
                        "gpu emitter: a register tile copied into an arena holder");
  if (info(dst).kind == ValueInfo::Kind::Fragment) {  // registers: each thread its own elements
    if (s.kind != ValueInfo::Kind::Fragment) before_cross_read();
    open_fragment_loop(info(dst).frag, false, IdleWarpgroup::Zeros);
    assign_register(dst_name, type(dst).dtype, at(src, "e"));
    close_fragment_loop();
    return;
  }
  open_thread_loop(std::max<int64_t>(1, type(dst).size()));
  line(dst_name + "[e] = " + s.name + "[e];");
  close_loop();
  after_tile_write();
}

void Emitter::emit_control(const ir::Op& op) {
  switch (op.code) {
    case OpCode::Yield: return;
    case OpCode::For: {
      const ir::Region& body = op.regions[0];
      std::string it = fresh("it");
      const OpenLoop loop = open_loop(
          op, 2, "for (pl_i64 " + it + " = " + info(op.operands[0]).name + "; " + it + " < " + info(op.operands[1]).name + "; ++" + it + ") {");
      bind_scalar(body.args[0], "(" + ctype(type(body.args[0]).dtype) + ")" + it);
      bind_carries(body, 1, op.results);
      const size_t mark = ctx_.arena->pending_mark();
      close_loop_body(op, body, mark, loop, emit_region(body));
      return;
    }
    case OpCode::While: {
      const ir::Region& cond = op.regions[0];
      const ir::Region& body = op.regions[1];
      const OpenLoop loop = open_loop(op, 0, "while (true) {");
      bind_carries(cond, 0, op.results);
      std::vector<ValueId> pred = emit_region(cond);
      line("if (!" + info(pred.at(0)).name + ") break;");
      // The loop leaves through the break, after the last barrier of its body: what the last
      // condition read or wrote is what the code after the loop must order itself after (else a
      // thread that left could write what a slower one's condition is still reading, which then
      // goes round once more, to a barrier the others never reach).
      const bool cond_tile_written = tile_written_, cond_mem_written = mem_written_, cond_mem_read = mem_read_;
      bind_carries(body, 0, op.results);
      // (Not the condition's tiles: the last condition runs after the body's last barrier.)
      const size_t mark = ctx_.arena->pending_mark();
      close_loop_body(op, body, mark, loop, emit_region(body));
      tile_written_ |= cond_tile_written, mem_written_ |= cond_mem_written, mem_read_ |= cond_mem_read;
      return;
    }
    case OpCode::Cond:
    case OpCode::Switch: {
      std::vector<std::string> holders;
      for (ValueId r : op.results) holders.push_back(declare_result_holder(r));
      std::string sel;
      const int nreg = static_cast<int>(op.regions.size());
      if (op.code == OpCode::Switch) {
        sel = fresh("sw");
        line("pl_i64 " + sel + " = (pl_i64)" + info(op.operands[0]).name + ";");
        line("if (" + sel + " < 0) " + sel + " = 0; if (" + sel + " > " + std::to_string(nreg - 1) + ") " + sel +
             " = " + std::to_string(nreg - 1) + ";");
      }
      const bool tw = tile_written_, mw = mem_written_, mr = mem_read_;
      bool otw = tw, omw = mw, omr = mr;
      ++conditional_depth_;
      const Arena::Alternatives branches = ctx_.arena->begin_alternatives();
      for (int b = 0; b < nreg; ++b) {
        if (b > 0) ctx_.arena->next_alternative(branches);
        // Cond: region 0 runs when the predicate holds. A switch's last branch is its `else` (the
        // index is clamped: every path defines the results' holders, registers included).
        std::string test = op.code == OpCode::Cond ? (b == 0 ? info(op.operands[0]).name : "")
                           : b > 0 && b == nreg - 1 ? ""
                                                    : sel + " == " + std::to_string(b);
        line(b == 0 ? "if (" + test + ") {" : (test.empty() ? "} else {" : "} else if (" + test + ") {"));
        ++indent_;
        tile_written_ = tw, mem_written_ = mw, mem_read_ = mr;
        emit_region_into(op.regions[static_cast<size_t>(b)], op, holders);
        otw |= tile_written_, omw |= mem_written_, omr |= mem_read_;
        --indent_;
      }
      line("}");
      ctx_.arena->end_alternatives(branches);
      --conditional_depth_;
      tile_written_ = otw, mem_written_ = omw, mem_read_ = omr;
      return;
    }
    case OpCode::RunScoped: {
      const ir::Region& body = op.regions[0];
      std::vector<std::string> holders;
      for (ValueId r : op.results) holders.push_back(declare_result_holder(r));
      std::vector<std::pair<int64_t, int64_t>> scoped;
      for (ValueId a : body.args)
        if (type(a).space == MemorySpace::Semaphore ||
            (is_semaphore(type(a).dtype) && type(a).dtype != DType::GpuBarrier && type(a).dtype != DType::Semaphore))
          throw NotSupportedError("semaphores on the GPU backend (a TPU feature)", op.loc);
      const auto laid_out = ctx_.scoped_layouts ? ctx_.scoped_layouts->find(&op) : decltype(ctx_.scoped_layouts->end()){};
      if (ctx_.scoped_layouts && laid_out != ctx_.scoped_layouts->end()) {
        emit_scope_with_barriers_or_shared(op, laid_out->second, holders);
        return;
      }
      for (ValueId a : body.args) {
        const ir::Type& t = type(a);
        PALLAS_INTERNAL_CHECK(t.dtype != DType::GpuBarrier, "a scoped barrier that was not laid out");
        RefInfo r{fresh("s"), t.dtype, t.shape, contiguous_strides(t.shape)};
        scoped.push_back(own_scoped_array(a, r, op));
        fill_uninitialized(r.ptr, t.dtype, t.size());  // (every element alike: swizzled or not)
        bind_ref(a, r);
      }
      emit_scope_body(op, holders);
      for (auto [off, bytes] : scoped) ctx_.arena->release(off, bytes);
      return;
    }
    default: break;
  }
  throw InternalError("gpu emitter: control op " + std::string(op.info().name));
}

std::string scoped_swizzle_macro(ValueId v) { return "PL_SMEM_SWIZZLED_V" + std::to_string(v); }

// A Pallas thread's own run_scoped array a, from its tile arena (swizzled ones on a 1024-byte
// boundary: the swizzle's pattern repeats every 8 rows of 128 bytes); declares r.ptr. Host
// emulation checks the boundary of every warpgroup's copy (its shared memory is 1024-aligned as
// the GPU's): the swizzle is address-based on both sides there, so a misplaced copy would give
// right answers on the CPU and scrambled ones on the GPU; the GPU itself checks the base only.
std::pair<int64_t, int64_t> Emitter::own_scoped_array(ValueId a, RefInfo& r, const ir::Op& scope) {
  const ir::Type& t = type(a);
  const int64_t bytes = std::max<int64_t>(1, t.size()) * itemsize(t.dtype);
  const bool swizzled = ctx_.swizzled_own_scoped && ctx_.swizzled_own_scoped->count(a) > 0;
  const int64_t off = ctx_.arena->alloc(bytes, swizzled ? 1024 : 16);
  line(ctype(t.dtype) + "* " + r.ptr + " = (" + ctype(t.dtype) + "*)(" + ctx_.arena_base + " + " + std::to_string(off) + ");");
  if (swizzled) {
    make_swizzled(r, scoped_swizzle_macro(a));
    const int site = add_op_site(*ctx_.error_sites, ErrorSite::Kind::SlotAlignment, scope);
    line("if (PL_HOST_EMULATION && " + r.swizzled + " && ((pl_u64)" + r.ptr + " & 1023) != 0) " + record_failure(site, {}));
  }
  return {off, bytes};
}

std::string make_swizzled(RefInfo& ref, const std::string& macro) {
  ref.swizzled = macro;
  ref.tile = ref.ptr;
  const int64_t row_bytes = ref.shape.back() * itemsize(ref.dtype);
  if (row_bytes > 128) ref.panel_rows = ref.shape[ref.shape.size() - 2], ref.panel_cols = ref.shape.back();
  return "#define " + macro + " (PL_HAS_WGMMA ? " + std::to_string(std::min<int64_t>(row_bytes, 128)) + " : 0)\n";
}

// run_scoped laid out before the body (ScopedLayout): barriers in pl_mbar and, shared by the CTA's
// Pallas threads, arrays in the CTA's arena. At entry one thread makes the barriers new (an
// mbarrier is invalidated before it is initialized again) and the arrays are filled with the
// uninitialized value, then each group syncs and — shared by several groups — the groups meet on
// the scope's meeting mbarrier, and each thread expects phase 0 of every barrier; at exit they
// sync and meet again, so that no thread enters the scope anew (making its barriers new, filling
// its bytes) while another still uses them.
void Emitter::emit_scope_with_barriers_or_shared(const ir::Op& op, const ScopedLayout& layout,
                                                 const std::vector<std::string>& holders) {
  const ir::Region& body = op.regions[0];
  const std::string first = layout.shared ? "pl_cta_tid() == 0" : "pl_tid() == 0";
  // A sync of the group; shared by several Pallas threads, then a meeting of the CTA's groups on
  // an mbarrier (arrive: release; wait: acquire), which gives up after the wait limit — a thread
  // that skips the scope is an error at its line, not a hang (a bar.sync has no time limit).
  auto sync = [&](const char* what) {
    barrier();
    if (layout.meeting < 0) return;
    const std::string m = ctx_.barriers + " + " + std::to_string(layout.meeting);
    ErrorSite site;
    site.kind = ErrorSite::Kind::ScopeMeeting;
    site.op_name = what;
    site.loc = op.loc;
    ctx_.error_sites->push_back(site);
    line("if (pl_tid() == 0) pl_mbar_arrive(" + m + ");");
    line("if (!pl_group_all(pl_mbar_wait(" + m + ", " + ctx_.phases + ", " + std::to_string(layout.meeting) + ", " +
         ctx_.params + ".err))) " + record_failure(static_cast<int>(ctx_.error_sites->size()) - 1, {}));
    just_synced_ = true;
  };
  line(std::string("// (") + (layout.shared ? "shared by the CTA's Pallas threads" : "barriers of this Pallas thread") + ")");
  std::vector<std::pair<int64_t, int64_t>> own;  // the thread's own arrays (offset, bytes) in its tile arena
  std::vector<std::pair<std::string, int64_t>> barriers;  // (pointer, count)
  for (size_t i = 0; i < body.args.size(); ++i) {
    const ir::Type& t = type(body.args[i]);
    const int64_t n = std::max<int64_t>(1, t.size());
    RefInfo r{fresh("s"), t.dtype, t.shape, contiguous_strides(t.shape)};
    if (t.dtype == DType::GpuBarrier) {
      const std::string group = layout.shared ? "" : " + (pl_i64)pl_group() * " + std::to_string(n);
      line("pl_u64* " + r.ptr + " = " + ctx_.barriers + " + " + std::to_string(layout.where[i]) + group + ";");
      barriers.emplace_back(r.ptr, n);
      line("if (" + first + ") for (int i = 0; i < " + std::to_string(n) + "; ++i) { pl_mbar_inval(" + r.ptr +
           " + i); pl_mbar_init(" + r.ptr + " + i, " + std::to_string(layout.arrivals[i]) + "); }");
    } else {
      const std::string T = ctype(t.dtype);
      if (layout.where[i] < 0) {
        own.push_back(own_scoped_array(body.args[i], r, op));
      } else {
        line(T + "* " + r.ptr + " = (" + T + "*)(cta_arena + " + std::to_string(layout.where[i]) + ");");
        if (!layout.swizzled[i].empty()) make_swizzled(r, layout.swizzled[i]);  // (every element filled alike below)
      }
      const std::string tid = layout.shared ? "pl_cta_tid()" : "pl_tid()", nthreads = layout.shared ? "pl_cta_nthreads()" : "pl_nthreads()";
      line("for (pl_i64 e = " + tid + "; e < " + std::to_string(n) + "; e += " + nthreads + ") " + r.ptr + "[e] = " +
           uninitialized_literal(t.dtype) + ";");
    }
    bind_ref(body.args[i], r);
  }
  // (As at the CTA's start: the writes above before what copies and wgmma do to the same bytes,
  // the barriers' init before the copies completing on them.)
  line("pl_fence_before_bulk_copy();");
  if (!barriers.empty()) line("if (" + first + ") pl_fence_mbar_init();");
  sync("entered");
  for (const auto& [ptr, n] : barriers)
    line("for (int i = 0; i < " + std::to_string(n) + "; ++i) { const pl_i64 j = " + ptr + " + i - " + ctx_.barriers +
         "; " + ctx_.phases + "[j >> 5] &= ~(1u << (j & 31)); }");
  emit_scope_body(op, holders);
  sync("left");
  for (auto [off, bytes] : own) ctx_.arena->release(off, bytes);
}

void Emitter::emit_region_into(const ir::Region& r, const ir::Op& op, const std::vector<std::string>& holders) {
  const std::vector<ValueId> ys = emit_region(r);
  for (size_t i = 0; i < ys.size(); ++i) copy_into(op.results[i], holders[i], ys[i]);
  release_yielded(r, ys);  // (pending: reusable after a barrier)
}

// A run_scoped's body in a block of its own; what it yields goes into the op's result holders.
void Emitter::emit_scope_body(const ir::Op& op, const std::vector<std::string>& holders) {
  line("{");
  ++indent_;
  emit_region_into(op.regions[0], op, holders);
  --indent_;
  line("}");
}

namespace {
// Whether ops of r (and of its loops and branches) are all ones that cannot write memory or
// tiles by their kind: values, loads, views, control flow — not stores, atomics, products, sorts,
// scopes or GPU primitives (their barriers and async state are their own protocol).
bool writes_nothing(const ir::Region& r) {
  for (const ir::Op& op : r.ops) {
    if (op.code == OpCode::Yield) continue;
    const bool control = op.code == OpCode::For || op.code == OpCode::While || op.code == OpCode::Cond || op.code == OpCode::Switch;
    if (control) {
      if (!std::all_of(op.regions.begin(), op.regions.end(), writes_nothing)) return false;
      continue;
    }
    if (!op.regions.empty() || op.info().is(ir::kSideEffect) || op.info().is(ir::kMemWrite) ||
        op.code == OpCode::DotGeneral || op.code == OpCode::Sort)
      return false;
  }
  return true;
}
}  // namespace

// A loop's carries live in holders (its results), initialised from the operands from
// `first_carry` on; the loop starts after a barrier, so every iteration starts clean — but for a
// loop whose regions write nothing (register tiles, loads, scalars): only writes pending before it
// need one (its reads of what they wrote), reads pending do not (they are pending after the loop
// too, close_loop_body: its body's barriers may never run).
Emitter::OpenLoop Emitter::open_loop(const ir::Op& op, size_t first_carry, const std::string& header) {
  OpenLoop loop;
  for (size_t c = 0; c < op.results.size(); ++c) {
    loop.holders.push_back(declare_result_holder(op.results[c]));
    copy_into(op.results[c], loop.holders.back(), op.operands[first_carry + c]);
  }
  loop.writes_nothing = std::all_of(op.regions.begin(), op.regions.end(), writes_nothing);
  if (loop.writes_nothing) fold_memory_groups();
  if (tile_written_ || mem_written_ || (mem_read_ && !loop.writes_nothing)) barrier();
  loop.at_entry = pending_syncs();
  loop.writes = writes_;
  loop.pending = ctx_.arena->pending_mark();
  line(header);
  ++indent_;
  ++conditional_depth_;
  return loop;
}

// The yields become the next carries; a barrier ends every iteration — but one of a loop whose
// regions wrote nothing and released no arena range (only registers, scalars and reads: the next
// iteration has no write to order after this one's reads, and the state it starts from is the
// one the body was emitted for, reads pending at most).
void Emitter::close_loop_body(const ir::Op& op, const ir::Region& body, size_t arena_mark, const OpenLoop& loop,
                              const std::vector<ValueId>& ys) {
  assign_carries(op.results, loop.holders, ys);
  release_yielded(body, ys);
  const bool wrote = !loop.writes_nothing || writes_ != loop.writes || ctx_.arena->pending_mark() != loop.pending;
  if (wrote) barrier();
  // What the body released is free past the loop: every access to it was before an iteration's
  // last barrier (a barrier inside the loop frees nothing: conditional_depth_).
  ctx_.arena->settle_pending_since(arena_mark);
  --conditional_depth_;
  --indent_;
  line("}");  // after a loop of zero iterations no barrier ran: line() clears just_synced_
  restore_pending(loop.at_entry);
}

// Region args of a loop: scalar carries are copies of the holders, tile carries share them.
void Emitter::bind_carries(const ir::Region& r, size_t first, const std::vector<ValueId>& holders) {
  for (size_t c = 0; c < holders.size(); ++c) {
    ValueId a = r.args[first + c];
    const ValueInfo& h = info(holders[c]);
    if (h.kind == ValueInfo::Kind::Scalar) {
      bind_scalar(a, h.name);
    } else {
      ValueInfo& i = values_[static_cast<size_t>(a)];
      i = h;
      i.owns_slot = false;
    }
  }
}

// The loop's yields become the next carries: read them all, then write them all.
void Emitter::assign_carries(const std::vector<ValueId>& results, const std::vector<std::string>& holders,
                             const std::vector<ValueId>& ys) {
  std::vector<std::string> temps;
  for (size_t c = 0; c < ys.size(); ++c) {
    const ValueInfo& y = info(ys[c]);
    if (y.kind == ValueInfo::Kind::Scalar) {
      temps.push_back(fresh("t"));
      line(ctype(type(ys[c]).dtype) + " " + temps.back() + " = " + y.name + ";");
    } else {
      temps.push_back("");
    }
  }
  // Register tiles: each thread's own registers, no barrier.
  std::vector<std::pair<std::string, ValueId>> fragment_copies;
  for (size_t c = 0; c < ys.size(); ++c) {
    if (info(results[c]).kind != ValueInfo::Kind::Fragment) continue;
    const ValueInfo& y = info(ys[c]);
    PALLAS_INTERNAL_CHECK(y.kind == ValueInfo::Kind::Fragment && y.frag == info(results[c]).frag,
                          "gpu emitter: a loop carries register tiles its body does not yield");
    if (y.name != holders[c]) fragment_copies.emplace_back(holders[c], ys[c]);
  }
  copy_fragments(fragment_copies);
  bool tiles = false, crossed = false;
  const std::set<std::string> holder_names(holders.begin(), holders.end());
  for (size_t c = 0; c < ys.size(); ++c) {
    const ValueInfo& y = info(ys[c]);
    if (y.kind != ValueInfo::Kind::Tile || y.name == holders[c]) continue;
    tiles = true;
    crossed |= holder_names.count(y.name) > 0;  // another carry's holder
  }
  if (tiles && !crossed) {
    // Each yield is a tile of the body's: copy it into its holder element by element (thread t
    // wrote, or has seen since a barrier, the elements it copies), once every thread is done
    // reading the holders.
    barrier();
    for (size_t c = 0; c < ys.size(); ++c) {
      const ValueInfo& y = info(ys[c]);
      if (y.kind != ValueInfo::Kind::Tile || y.name == holders[c]) continue;
      open_thread_loop(std::max<int64_t>(1, type(results[c]).size()));
      line(holders[c] + "[e] = " + y.name + "[e];");
      close_loop();
    }
    after_tile_write();
  } else if (tiles) {
    // Stage the yielded tiles first: a yield names another carry, whose holder the copies below
    // overwrite.
    barrier();
    std::vector<std::pair<std::string, int64_t>> staged(ys.size());
    for (size_t c = 0; c < ys.size(); ++c) {
      const ValueInfo& y = info(ys[c]);
      if (y.kind != ValueInfo::Kind::Tile || y.name == holders[c]) continue;
      const ir::Type& t = type(results[c]);
      int64_t bytes = std::max<int64_t>(1, t.size()) * itemsize(t.dtype);
      int64_t off = ctx_.arena->alloc(bytes);
      std::string tmp = fresh("stage");
      line(ctype(t.dtype) + "* " + tmp + " = (" + ctype(t.dtype) + "*)(" + ctx_.arena_base + " + " +
           std::to_string(off) + ");");
      open_thread_loop(std::max<int64_t>(1, t.size()));
      line(tmp + "[e] = " + y.name + "[e];");
      close_loop();
      staged[c] = {tmp, off};
      ctx_.arena->release(off, bytes);
    }
    barrier();
    for (size_t c = 0; c < ys.size(); ++c) {
      if (staged[c].first.empty()) continue;
      open_thread_loop(std::max<int64_t>(1, type(results[c]).size()));
      line(holders[c] + "[e] = " + staged[c].first + "[e];");
      close_loop();
    }
    after_tile_write();
  }
  for (size_t c = 0; c < ys.size(); ++c)
    if (!temps[c].empty()) line(holders[c] + " = " + temps[c] + ";");
}

void Emitter::fill_uninitialized(const std::string& ptr, DType t, int64_t n) {
  if (n <= 0) return;
  open_thread_loop(n);
  line(ptr + "[e] = " + uninitialized_literal(t) + ";");
  close_loop();
  after_tile_write();
  after_mem_write();
}

std::string atomic_new_value(DType t, const std::string& kind) {
  const std::string T = ctype(t), wc = widen(t, "c"), wx = widen(t, "x");
  const bool is_f = is_float(t), is_b = t == DType::Bool;
  if (kind == "xchg") return "x";
  if (kind == "cas") return "(pl_same_bytes(&c, &x, (int)sizeof c) ? y : c)";
  if (is_b && (kind == "add" || kind == "or" || kind == "max")) return "(c || x)";
  if (is_b && (kind == "and" || kind == "min")) return "(c && x)";
  if (is_b && kind == "xor") return "(c != x)";
  if (kind == "add") return is_f ? narrow(t, wc + " + " + wx) : "pl_iadd<" + T + ">(c, x)";
  if (kind == "max") return is_f ? "((pl_isnan(" + wc + ") || " + wc + " >= " + wx + ") ? c : x)" : "(c >= x ? c : x)";
  if (kind == "min") return is_f ? "((pl_isnan(" + wc + ") || " + wc + " <= " + wx + ") ? c : x)" : "(c <= x ? c : x)";
  if (!is_f && (kind == "and" || kind == "or" || kind == "xor"))
    return "(" + T + ")(c " + std::string(kind == "and" ? "&" : kind == "or" ? "|" : "^") + " x)";
  return "";
}

std::string uninitialized_literal(DType t) {
  if (t == DType::Semaphore) return "0";  // a gpu::Semaphore's counters start at 0
  return literal(eval::uninitialized_value(t), t);
}

void Emitter::emit_debug_print(const ir::Op& op) {
  // One thread of the group prints, under the runtime's print lock: the format's text as string
  // literals, scalars with pl_print_value, arrays as Array::to_string lays them out (header line,
  // nested brackets, summarized past 1000 elements) with pl_print_array.
  const std::string& fmt = op.attrs.get_string(ir::AttrKey::Format);
  auto literal_text = [](const std::string& s) {
    std::string o = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') o += std::string("\\") + c;
      else if (c == '\n') o += "\\n";
      else if (c == '%') o += "%%";
      else o += c;
    }
    return o + "\"";
  };
  auto print_text = [&](const std::string& s) {
    if (!s.empty()) line("printf(" + literal_text(s) + ");");
  };
  // The value `e` of dtype t as pl_print_value takes it.
  auto printable = [&](DType t, const std::string& e) {
    if (is_float(t)) return "(double)" + widen(t, e);
    if (t == DType::Bool) return "(bool)(" + e + ")";
    if (t == DType::U64) return "(unsigned long long)(" + e + ")";
    return "(long long)(" + e + ")";
  };
  bool reads_arrays = false;
  for (ValueId v : op.operands) reads_arrays |= !type(v).shape.empty();
  if (reads_arrays) before_mem_read();  // every thread's part of the tiles (and stores) is in
  line("if (pl_tid() == 0) {");
  ++indent_;
  line("pl_print_lock();");
  size_t pos = 0, k = 0;
  for (size_t p = fmt.find("{}"); p != std::string::npos; p = fmt.find("{}", pos)) {
    print_text(fmt.substr(pos, p - pos));
    ValueId v = op.operands[k++];
    const ir::Type& t = type(v);
    if (t.shape.empty()) {
      line("pl_print_value(" + printable(t.dtype, info(v).name) + ");");
    } else if (t.size() == 0) {
      print_text(Array::zeros(t.shape, t.dtype).to_string());  // no values: the text is known here
    } else {
      if (t.shape.size() > 16)
        throw NotSupportedError("debug_print of an array of rank " + std::to_string(t.shape.size()) +
                                    " on the GPU backend (at most 16)",
                                op.loc);
      print_text(ShapeDtype{t.shape, t.dtype}.to_string() + "\n");
      std::string dims;
      for (int64_t d : t.shape) dims += (dims.empty() ? "" : ", ") + std::to_string(d) + "LL";
      line("{");
      ++indent_;
      line("const pl_i64 shape[" + std::to_string(t.shape.size()) + "] = {" + dims + "};");
      line("pl_print_array(shape, " + std::string(t.size() > kPrintMaxElements ? "true" : "false") +
           ", [&](pl_i64 e) { pl_print_value(" + printable(t.dtype, at(v, "e")) + "); });");
      --indent_;
      line("}");
    }
    pos = p + 2;
  }
  print_text(fmt.substr(pos) + "\n");
  line("pl_print_unlock();");
  --indent_;
  line("}");
  if (reads_arrays) after_mem_read();
}

// A failed check records the grid point (the kernel's program ids) for the host's message.
void Emitter::emit_debug_check(const ir::Op& op) {
  if (!ctx_.debug_checks) return;
  int site = static_cast<int>(ctx_.error_sites->size());
  ctx_.error_sites->push_back(
      {ErrorSite::Kind::DebugCheck, -1, op.attrs.get_string(ir::AttrKey::Format), op.loc});
  line("if (!(" + info(op.operands[0]).name + ")) " + record_failure(site, {}));
}

std::string Emitter::record_failure(int site, const std::vector<std::string>& values) const {
  std::string vals;
  for (int a = 0; a < ctx_.num_grid_dims; ++a) vals += ctx_.grid_ids + "[" + std::to_string(a) + "], ";
  for (const std::string& v : values) vals += v + ", ";
  return "{ pl_i64 ev[] = {" + vals + "0}; pl_fail(" + ctx_.params + ".err, " + std::to_string(site) + ", ev, " +
         std::to_string(ctx_.num_grid_dims + static_cast<int>(values.size())) + "); " + ctx_.fail_return + " }";
}

}  // namespace pallas::gpu::detail
