// Tracing of the SparseCore vector subcore ops (include/pallas/sparse_core_ops.h). The ops' type
// rules (src/ir/type_rules.cpp) check ranks, dtypes, masks and memory spaces; this file adds the
// checks that depend on the SparseCore's configuration (the legal vector shapes), fills in JAX's
// defaults, and builds the composite ops (bitcast, unmasked scans, parallel loops).
#include <algorithm>

#include "core/blocks.h"
#include "pallas/pallas_call.h"
#include "pallas/sparse_core_ops.h"
#include "trace/context.h"

namespace pallas::tpu_sc {

using ir::AttrKey;
using ir::Attrs;
using ir::OpCode;

namespace {

[[noreturn]] void fail(const char* op, const std::string& msg, const Loc& loc) {
  throw Error(std::string(op) + ": " + msg, trace::src(loc));
}

// `shape` must be one of the SparseCore's vector shapes for `dtype`.
void check_vector_shape(const char* op, const Shape& shape, DType dtype, const Loc& loc) {
  const std::vector<Shape> legal = vector_shapes(dtype);
  if (std::find(legal.begin(), legal.end(), shape) != legal.end()) return;
  const std::string dt(dtype_name(dtype));
  if (legal.empty()) fail(op, "does not support " + dt + " arrays", loc);
  std::string list;
  for (const Shape& s : legal) list += (list.empty() ? "" : ", ") + core::tuple_string(s);
  fail(op, "only supports " + dt + " arrays of shapes [" + list + "], got " + core::tuple_string(shape) +
               " (the SparseCore has " + std::to_string(sparse_core_info().num_lanes) + " lanes)",
       loc);
}

bool is_vmem(const Ref& r) { return r.memory_space() == MemorySpace::Vmem; }

// An all-true mask of `shape` (what JAX passes when no mask is given).
Value all_true(const Shape& shape, const Loc& loc) {
  return trace::constant(Scalar::of_int(1, DType::Bool), shape, loc);
}

void gather_scatter(OpCode code, const char* name, const Ref& ref, const std::vector<Value>& indices,
                    const Value* x, const std::optional<Value>& mask, const Loc& loc, Value* result) {
  // The lane count is the index vectors' length; malformed indices are the type rule's to report.
  if (!indices.empty() && indices[0].rank() == 1 && is_vmem(ref) &&
      (ref.dtype() == DType::I32 || ref.dtype() == DType::F32))
    check_vector_shape(name, indices[0].shape(), ref.dtype(), loc);
  std::vector<Value> ops = {ref.handle()};
  ops.insert(ops.end(), indices.begin(), indices.end());
  if (x) ops.push_back(*x);
  Attrs a;
  if (mask) {
    ops.push_back(*mask);
    a.set(AttrKey::Masked, int64_t{1});
  }
  std::vector<Value> res = trace::add_op(code, ops, std::move(a), loc);
  if (result) *result = res.at(0);
}

// A vector ref for the expanded / compressed accesses: its shape is the vector's.
void check_vector_ref(const char* name, const Ref& ref, const Loc& loc) {
  if (is_vmem(ref) && ref.dtype() != DType::Bool && !is_semaphore(ref.dtype()))
    check_vector_shape(name, ref.shape(), ref.dtype(), loc);
}

// The dtype and shape rules shared by cumsum / cummax / cummin.
void check_scan_operand(const char* name, const Value& x, const Loc& loc) {
  if (x.rank() != 1) fail(name, "x must be rank 1, got " + x.type().to_string(), loc);
  DType t = x.dtype();
  if (t != DType::U32 && t != DType::I32 && t != DType::F32)
    fail(name, "x's dtype must be u32, i32 or f32, got " + std::string(dtype_name(t)), loc);
  check_vector_shape(name, x.shape(), t, loc);
}

Value masked_scan(const char* name, const char* kind, const Value& x, const std::optional<Value>& mask,
                  const Loc& loc) {
  check_scan_operand(name, x, loc);
  if (!mask) {
    // Without a mask the SparseCore scan is the generic one along the only axis.
    const Operand o(x, loc);
    if (std::string_view(kind) == "sum") return pallas::cumsum(o, 0);
    if (std::string_view(kind) == "max") return pallas::cummax(o, 0);
    return pallas::cummin(o, 0);
  }
  Attrs a;
  a.set(AttrKey::Kind, std::string(kind));
  return trace::add_op1(OpCode::ScMaskedScan, {x, *mask}, std::move(a), loc);
}

Value all_reduce(OpCode code, const char* name, const Value& x, int64_t reduce, const Loc& loc) {
  if (x.rank() == 1 && x.dtype() == DType::Bool) check_vector_shape(name, x.shape(), DType::Bool, loc);
  Attrs a;
  a.set(AttrKey::Reduce, reduce);
  return trace::add_op1(code, {x}, std::move(a), loc);
}


// An i32 scalar operand: an integer literal, or a traced scalar (the type rule checks it is i32).
Value i32_scalar(const Operand& o, const char* op, const char* what, const Loc& loc) {
  if (o.is_value()) return o.as_value();
  if (o.kind() != Operand::Kind::Int) fail(op, std::string(what) + " must be an i32 scalar", loc);
  return trace::constant(trace::literal_as(o, DType::I32), {}, loc);
}

}  // namespace

// ---- Gathers and scatters -------------------------------------------------------------------------
Value load_gather(const Ref& ref, const std::vector<Value>& indices, std::optional<Value> mask, Loc loc) {
  Value out;
  gather_scatter(OpCode::ScLoadGather, "load_gather", ref, indices, nullptr, mask, loc, &out);
  return out;
}

void store_scatter(const Ref& ref, const std::vector<Value>& indices, const Value& x,
                   std::optional<Value> mask, Loc loc) {
  gather_scatter(OpCode::ScStoreScatter, "store_scatter", ref, indices, &x, mask, loc, nullptr);
}

void addupdate_scatter(const Ref& ref, const std::vector<Value>& indices, const Value& x,
                       std::optional<Value> mask, Loc loc) {
  gather_scatter(OpCode::ScAddupdateScatter, "addupdate_scatter", ref, indices, &x, mask, loc, nullptr);
}

// ---- Expanded and compressed accesses -------------------------------------------------------------
Value load_expanded(const Ref& ref, const Value& mask, Loc loc) {
  check_vector_ref("load_expanded", ref, loc);
  return trace::add_op1(OpCode::ScLoadExpanded, {ref.handle(), mask}, {}, loc);
}

void store_compressed(const Ref& ref, const Value& x, const Value& mask, Loc loc) {
  check_vector_ref("store_compressed", ref, loc);
  trace::add_op(OpCode::ScStoreCompressed, {ref.handle(), x, mask}, {}, loc);
}

void addupdate(const Ref& ref, const Value& x, Loc loc) {
  check_vector_ref("addupdate", ref, loc);
  trace::add_op(OpCode::ScAddupdate, {ref.handle(), x}, {}, loc);
}

void addupdate_compressed(const Ref& ref, const Value& x, const Value& mask, Loc loc) {
  check_vector_ref("addupdate_compressed", ref, loc);
  trace::add_op(OpCode::ScAddupdateCompressed, {ref.handle(), x, mask}, {}, loc);
}

// ---- Lane ops -------------------------------------------------------------------------------------
// The same bits with the rank kept: lax's bitcast (which adds or removes a trailing dimension of
// the width ratio) with a reshape that folds that dimension into the last one.
Value bitcast(const Value& x, DType dtype, Loc loc) {
  if (x.dtype() == dtype) return x;
  if (x.dtype() == DType::Bool || dtype == DType::Bool || is_semaphore(x.dtype()) || is_semaphore(dtype))
    fail("bitcast", "needs numeric dtypes, got " + std::string(dtype_name(x.dtype())) + " -> " +
                        std::string(dtype_name(dtype)),
         loc);
  const int from = bit_width(x.dtype()), to = bit_width(dtype);
  const Operand o(x, loc);
  if (from == to) return pallas::bitcast(o, dtype);
  if (x.rank() == 0)
    fail("bitcast", "cannot bitcast the scalar " + x.type().to_string() + " to " + std::string(dtype_name(dtype)) +
                        " (" + std::to_string(from) + " bits to " + std::to_string(to) + ")",
         loc);
  Shape shape = x.shape();
  const int64_t last = shape.back();
  if (last * from % to != 0)
    fail("bitcast", "cannot bitcast " + x.type().to_string() + " to " + std::string(dtype_name(dtype)) +
                        ": the last dimension holds " + std::to_string(last) + " x " + std::to_string(from) +
                        " bits, not a multiple of " + std::to_string(to),
         loc);
  if (from > to) {
    shape.back() = last * (from / to);
    return pallas::reshape(Operand(pallas::bitcast(o, dtype), loc), shape);
  }
  Shape split = shape;
  split.back() = last / (to / from);
  split.push_back(to / from);
  return pallas::bitcast(Operand(pallas::reshape(o, split), loc), dtype);
}

Value cumsum(const Value& x, std::optional<Value> mask, Loc loc) { return masked_scan("cumsum", "sum", x, mask, loc); }
Value cummax(const Value& x, std::optional<Value> mask, Loc loc) { return masked_scan("cummax", "max", x, mask, loc); }
Value cummin(const Value& x, std::optional<Value> mask, Loc loc) { return masked_scan("cummin", "min", x, mask, loc); }

ScanCountResult scan_count(const Value& x, std::optional<Value> mask, Loc loc) {
  if (x.rank() == 1 && (x.dtype() == DType::U32 || x.dtype() == DType::I32 || x.dtype() == DType::F32))
    check_vector_shape("scan_count", x.shape(), x.dtype(), loc);
  Value m = mask ? *mask : all_true(x.shape(), loc);
  std::vector<Value> r = trace::add_op(OpCode::ScScanCount, {x, m}, {}, loc);
  return {r.at(0), r.at(1)};
}

Value all_reduce_population_count(const Value& x, int64_t reduce, Loc loc) {
  return all_reduce(OpCode::ScAllReducePopulationCount, "all_reduce_population_count", x, reduce, loc);
}

Value all_reduce_ffs(const Value& x, int64_t reduce, Loc loc) {
  return all_reduce(OpCode::ScAllReduceFfs, "all_reduce_ffs", x, reduce, loc);
}

std::vector<Value> sort_key_val(const Value& keys, const Value& values, SortOptions opts, Loc loc) {
  return sort_key_val(keys, std::vector<Value>{values}, std::move(opts), loc);
}

std::vector<Value> sort_key_val(const Value& keys, const std::vector<Value>& values, SortOptions opts, Loc loc) {
  const Shape lanes = {sparse_core_info().num_lanes};
  auto check = [&](const Value& v, const std::string& what) {
    if (v.shape() != lanes)
      fail("sort_key_val", what + " shape " + core::tuple_string(v.shape()) + " must be " + core::tuple_string(lanes),
           loc);
  };
  check(keys, "keys");
  for (const Value& v : values) check(v, "values");
  if (opts.mask) check(*opts.mask, "mask");
  std::vector<Value> ops = {keys};
  ops.insert(ops.end(), values.begin(), values.end());
  Attrs a;
  a.set(AttrKey::Descending, int64_t{opts.descending});
  if (opts.mask) {
    ops.push_back(*opts.mask);
    a.set(AttrKey::Masked, int64_t{1});
  }
  return trace::add_op(OpCode::ScSortKeyVal, ops, std::move(a), loc);
}

Value dynamic_gather(const Value& x, const Value& indices, Loc loc) {
  if (x.rank() == 1 && x.dtype() != DType::Bool && !is_semaphore(x.dtype()))
    check_vector_shape("dynamic_gather", x.shape(), x.dtype(), loc);
  return trace::add_op1(OpCode::ScDynamicGather, {x, indices}, {}, loc);
}

// ---- Packing ----------------------------------------------------------------------------------
namespace {
// The op's attributes: the format and the result dtype, `preferred` or JAX's default pairing
// (f32 <-> bf16, i32 <-> i16) of `from`.
Attrs packing_attrs(const char* op, PackFormat format, DType from, std::optional<DType> preferred, bool packing,
                    const Loc& loc) {
  static const std::pair<DType, DType> defaults[] = {{DType::F32, DType::BF16}, {DType::I32, DType::I16}};
  std::optional<DType> to = preferred;
  for (const auto& [wide, narrow] : defaults)
    if (!to && from == (packing ? wide : narrow)) to = packing ? narrow : wide;
  if (!to)
    fail(op, std::string(packing ? "only f32 and i32 arrays pack" : "only bf16 and i16 arrays unpack") +
                 " without preferred_element_type, got " + std::string(dtype_name(from)),
         loc);
  Attrs a;
  a.set(AttrKey::Format, std::string(format == PackFormat::INTERLEAVED ? "interleaved" : "compressed"));
  a.set(AttrKey::DTypeAttr, *to);
  return a;
}
}  // namespace

Value pack(const Value& a, const Value& b, PackFormat format, std::optional<DType> preferred_element_type,
           Loc loc) {
  Attrs at = packing_attrs("pack", format, a.dtype(), preferred_element_type, true, loc);
  if (a.rank() == 1 && a.dtype() != DType::Bool && !is_semaphore(a.dtype()))
    check_vector_shape("pack", a.shape(), a.dtype(), loc);
  return trace::add_op1(OpCode::ScPack, {a, b}, std::move(at), loc);
}

std::pair<Value, Value> unpack(const Value& ab, PackFormat format, std::optional<DType> preferred_element_type,
                               Loc loc) {
  Attrs at = packing_attrs("unpack", format, ab.dtype(), preferred_element_type, false, loc);
  std::vector<Value> r = trace::add_op(OpCode::ScUnpack, {ab}, std::move(at), loc);
  return {r.at(0), r.at(1)};
}

// ---- SMEM atomics ---------------------------------------------------------------------------------
Value fetch_and_add(const Ref& smem_ref, Operand value, std::optional<Operand> subcore_id, Loc loc) {
  std::vector<Value> ops = {smem_ref.handle(), i32_scalar(value, "fetch_and_add", "the value", loc)};
  if (subcore_id) ops.push_back(i32_scalar(*subcore_id, "fetch_and_add", "subcore_id", loc));
  return trace::add_op1(OpCode::ScFetchAndAdd, ops, {}, loc);
}

// ---- Parallel loops -------------------------------------------------------------------------------
namespace detail {

ParallelLoop parallel_loop_bounds(const Operand& lo, const Operand& hi, const ParallelLoopOptions& opts,
                                  const Loc& loc) {
  if (opts.step < 1) fail("parallel_loop", "step must be >= 1, got " + std::to_string(opts.step), loc);
  if (opts.unroll < 1) fail("parallel_loop", "unroll must be >= 1, got " + std::to_string(opts.unroll), loc);
  ParallelLoop l;
  l.lo = pallas::detail::as_index_scalar(lo, "parallel_loop lower bound");
  Value h = pallas::detail::as_index_scalar(hi, "parallel_loop upper bound");
  l.step = opts.step;
  l.attrs.set(AttrKey::Parallel, int64_t{1});
  l.attrs.set(AttrKey::Unroll, opts.unroll);
  if (opts.step == 1) {
    l.start = l.lo;
    l.stop = h;
    return l;
  }
  // The trip count, as pl::loop counts it: ceil((hi - lo) / step), at least 0.
  l.start = trace::constant(Scalar::of_int(0, l.lo.dtype()), {}, loc);
  Value span = Operand(h, loc) - Operand(l.lo, loc);
  l.stop = pallas::maximum(Operand(pallas::cdiv(Operand(span, loc), Operand(opts.step, loc)), loc), Operand(0, loc));
  return l;
}

Value ParallelLoop::index(const Value& trip, const Loc& loc) const {
  if (step == 1) return trip;
  return Operand(lo, loc) + Operand(Operand(trip, loc) * Operand(step, loc), loc);
}

void check_parallel_loop_carries(const std::vector<Value>& carries, const Loc& loc) {
  for (const Value& c : carries)
    if (c.type().is_ref)
      fail("parallel_loop", "carried values may not be Refs, got " + c.type().to_string(), loc);
}

}  // namespace detail

}  // namespace pallas::tpu_sc
