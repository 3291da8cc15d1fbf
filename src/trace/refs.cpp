// Traced Refs: indexers, views, loads, stores, swaps and atomics.
#include <algorithm>
#include <numeric>

#include "trace/context.h"

namespace pallas {

using ir::AttrKey;
using ir::Attrs;
using ir::OpCode;

Index::Index(const RefSlot& s, Loc loc) : kind_(Kind::Int), start_(s.load(), loc), loc_(loc) {}

namespace {

struct Lowered {
  ir::Indexer indexer;
  std::vector<Value> dynamic;  // operands $1..$n
};

// Turns user indices into one IR entry per dimension of `ref`.
//   - an integer (static or traced) selects one element and drops the dimension;
//   - ds(start, size, stride) keeps `size` elements;
//   - `all` as the last entry covers every remaining dimension; elsewhere it covers one;
//   - missing trailing entries are full slices (NumPy's rule).
Lowered lower_indices(const ir::Type& ref, const Indices& idx, const char* op, const Loc& loc) {
  Lowered out;
  int rank = ref.rank();
  auto fail = [&](const std::string& msg) -> void {
    throw Error(std::string(op) + ": " + msg + " (indexing " + ref.to_string() + ")",
                trace::src(loc));
  };
  auto start_of = [&](const Operand& o, ir::IndexEntry& e) {
    if (o.is_value()) {
      Value v = o.as_value();
      if (v.rank() != 0 || !is_integer(v.dtype()))
        fail("a dynamic index must be an integer scalar, got " + v.type().to_string());
      if (v.dtype() != DType::I32) v = trace::convert_to(v, DType::I32, loc);
      out.dynamic.push_back(v);
      e.dynamic = static_cast<int>(out.dynamic.size());  // operand 0 is the ref
    } else if (o.kind() == Operand::Kind::Int) {
      e.start = o.int_literal();
    } else {
      fail("an index must be an integer, a traced integer scalar, ds(...) or all");
    }
  };
  size_t dim = 0;
  for (size_t k = 0; k < idx.size(); ++k) {
    const Index& i = idx[k];
    if (i.kind() == Index::Kind::All) {
      size_t remaining = k + 1 == idx.size() ? rank - dim : 1;
      if (dim + remaining > static_cast<size_t>(rank)) fail("too many indices");
      for (size_t r = 0; r < remaining; ++r, ++dim)
        out.indexer.entries.push_back({true, 0, -1, ref.shape[dim], 1});
      continue;
    }
    if (dim >= static_cast<size_t>(rank))
      fail("too many indices: " + std::to_string(idx.size()) + " for a ref of rank " +
           std::to_string(rank));
    ir::IndexEntry e;
    e.is_slice = i.kind() == Index::Kind::Slice;
    start_of(i.start(), e);
    if (e.is_slice) {
      e.size = i.size();
      e.stride = i.stride();
    }
    if (e.dynamic < 0 && e.start < 0)
      fail("negative index " + std::to_string(e.start) + " in dimension " + std::to_string(dim));
    out.indexer.entries.push_back(e);
    ++dim;
  }
  for (; dim < static_cast<size_t>(rank); ++dim)
    out.indexer.entries.push_back({true, 0, -1, ref.shape[dim], 1});
  return out;
}

std::vector<Value> with_ref(const Ref& r, const Lowered& l) {
  std::vector<Value> ops = {r.handle()};
  ops.insert(ops.end(), l.dynamic.begin(), l.dynamic.end());
  return ops;
}

Value value_for_region(const Operand& v, const ir::Type& ref, const Shape& region, const char* op,
                       const Loc& loc) {
  if (v.is_value()) {
    const Value& x = v.as_value();
    if (x.dtype() != ref.dtype)
      throw Error(std::string(op) + ": value dtype " + std::string(dtype_name(x.dtype())) +
                      " does not match the ref's " + ref.to_string() + "; convert it with .astype(" +
                      std::string(dtype_name(ref.dtype)) + ")",
                  trace::src(loc));
    return trace::broadcast_value(x, region, op, loc);
  }
  return trace::constant(trace::literal_as(v, ref.dtype), region, loc);
}

}  // namespace

Ref::Ref(const Value& handle) : handle_(handle) {
  if (!handle.type().is_ref)
    throw Error("pallas::Ref made from a non-Ref value " + handle.type().to_string());
}

const Value& Ref::handle() const {
  if (indirect_)
    throw Error("an indirectly indexed Ref (" + indirect_->type.to_string() +
                    ", made by x.at(indices)) can only be the source of a DMA (a gather) or its "
                    "destination (a scatter)",
                indirect_->loc);
  return handle_;
}

Ref Ref::make_indirect(const Value& indices, const Loc& loc) const {
  const ir::Type& data = handle().type();
  const ir::Type& it = indices.type();
  if (it.rank() != 1)
    throw Error("at: the indices of a gather/scatter must be 1-D, got " + it.to_string(),
                trace::src(loc));
  if (data.rank() < 1)
    throw Error("at: a gather/scatter needs a major dimension to index; " + data.to_string() +
                    " has none",
                trace::src(loc));
  Ref r = *this;
  Shape shape = data.shape;
  shape[0] = it.shape[0];
  r.indirect_ = std::make_shared<Indirect>(
      Indirect{handle_, indices, ir::Type::ref(shape, data.dtype, data.space), trace::src(loc)});
  return r;
}

Ref Ref::at(const Ref& indices, Loc loc) const { return make_indirect(indices.handle(), loc); }

Ref Ref::at(Indices idx, Loc loc) const {
  if (indirect_)
    throw Error("at: the ref indexed for a gather/scatter (" + indirect_->type.to_string() +
                    ") cannot be indexed further; index the data ref first, then by the indices",
                trace::src(loc));
  // A 1-D integer vector as the first index: a gather/scatter of the major dimension.
  if (!idx.empty() && idx[0].kind() == Index::Kind::Int && idx[0].start().is_value() &&
      idx[0].start().as_value().rank() == 1) {
    for (size_t k = 1; k < idx.size(); ++k) {
      const Index& i = idx[k];
      bool full = i.kind() == Index::Kind::All ||
                  (i.kind() == Index::Kind::Slice && !i.start().is_value() &&
                   i.start().int_literal() == 0 && i.stride() == 1 &&
                   static_cast<int>(k) < rank() && i.size() == dim(static_cast<int>(k)));
      if (!full)
        throw Error("at: only indexing along the major dimension is supported in a gather/scatter "
                    "(the other dimensions must be whole: pl::all)",
                    trace::src(loc));
    }
    return make_indirect(idx[0].start().as_value(), loc);
  }
  Lowered l = lower_indices(type(), idx, "at", loc);
  Attrs a;
  a.set(AttrKey::Index, l.indexer);
  return Ref(trace::add_op1(OpCode::RefView, with_ref(*this, l), std::move(a), loc));
}

Ref Ref::transpose(std::vector<int64_t> permutation, Loc loc) const {
  const ir::Type& t = handle().type();
  if (permutation.empty()) {
    permutation.resize(static_cast<size_t>(t.rank()));
    std::iota(permutation.rbegin(), permutation.rend(), 0);
  }
  Attrs a;
  a.set(AttrKey::Permutation, std::move(permutation));
  return Ref(trace::add_op1(OpCode::RefTranspose, {handle()}, std::move(a), loc));
}

Ref Ref::T(Loc loc) const {
  if (handle().type().rank() != 2)
    throw Error("T: the matrix transpose of a Ref of rank 2; " + handle().type().to_string() +
                    " has rank " + std::to_string(handle().type().rank()) + " (use transpose(permutation))",
                trace::src(loc));
  return transpose({1, 0}, loc);
}

Ref Ref::reshape(Shape shape, Loc loc) const {
  const ir::Type& t = handle().type();
  // One -1 entry takes what is left, as in NumPy.
  if (std::count(shape.begin(), shape.end(), -1) > 1)
    throw Error("reshape: at most one dimension may be -1, got " + shape_to_string(shape), trace::src(loc));
  if (const auto minus = std::find(shape.begin(), shape.end(), -1); minus != shape.end()) {
    int64_t known = 1;
    for (int64_t d : shape)
      if (d != -1) known *= d;
    if (known <= 0 || t.size() % known != 0)
      throw Error("reshape: " + shape_to_string(shape) + " does not divide the " + std::to_string(t.size()) +
                      " elements of " + t.to_string(),
                  trace::src(loc));
    *minus = t.size() / known;
  }
  Attrs a;
  a.set(AttrKey::ShapeAttr, std::move(shape));
  return Ref(trace::add_op1(OpCode::RefReshape, {handle()}, std::move(a), loc));
}

Ref Ref::bitcast(DType dtype, Loc loc) const {
  Attrs a;
  a.set(AttrKey::DTypeAttr, dtype);
  return Ref(trace::add_op1(OpCode::RefBitcast, {handle()}, std::move(a), loc));
}

RefSlot Ref::operator[](Index i) const { return RefSlot(*this, {i}, i.loc()); }
RefSlot Ref::operator()(Index i0) const { return RefSlot(*this, {i0}, i0.loc()); }
RefSlot Ref::operator()(Index i0, Index i1) const { return RefSlot(*this, {i0, i1}, i0.loc()); }
RefSlot Ref::operator()(Index i0, Index i1, Index i2) const {
  return RefSlot(*this, {i0, i1, i2}, i0.loc());
}
RefSlot Ref::operator()(Index i0, Index i1, Index i2, Index i3) const {
  return RefSlot(*this, {i0, i1, i2, i3}, i0.loc());
}

Value Ref::load(Indices idx, Loc loc) const {
  Lowered l = lower_indices(type(), idx, "load", loc);
  Attrs a;
  a.set(AttrKey::Index, l.indexer);
  return trace::add_op1(OpCode::Load, with_ref(*this, l), std::move(a), loc);
}

Value Ref::load_masked(Indices idx, const Value& mask, Operand other, Loc loc) const {
  Lowered l = lower_indices(type(), idx, "load", loc);
  Shape region = l.indexer.result_shape();
  std::vector<Value> ops = with_ref(*this, l);
  ops.push_back(trace::broadcast_value(mask, region, "load", loc));
  ops.push_back(value_for_region(other, type(), region, "load", loc));
  Attrs a;
  a.set(AttrKey::Index, l.indexer);
  a.set(AttrKey::Masked, int64_t{1});
  return trace::add_op1(OpCode::Load, ops, std::move(a), loc);
}

namespace {
// store / masked store / swap: ref, dynamic indices, the value (broadcast to the region), and
// for masked forms the mask.
std::vector<Value> write_op(const Ref& r, OpCode code, const char* name, const Indices& idx,
                            const Operand& value, const Value* mask, const Loc& loc) {
  Lowered l = lower_indices(r.type(), idx, name, loc);
  Shape region = l.indexer.result_shape();
  std::vector<Value> ops = with_ref(r, l);
  ops.push_back(value_for_region(value, r.type(), region, name, loc));
  Attrs a;
  a.set(AttrKey::Index, l.indexer);
  if (mask) {
    ops.push_back(trace::broadcast_value(*mask, region, name, loc));
    a.set(AttrKey::Masked, int64_t{1});
  }
  return trace::add_op(code, ops, std::move(a), loc);
}
}  // namespace

void Ref::store(Indices idx, Operand value, Loc loc) const {
  write_op(*this, OpCode::Store, "store", idx, value, nullptr, loc);
}

void Ref::store_masked(Indices idx, Operand value, const Value& mask, Loc loc) const {
  write_op(*this, OpCode::Store, "store", idx, value, &mask, loc);
}

Value Ref::swap(Indices idx, Operand value, Loc loc) const {
  return write_op(*this, OpCode::Swap, "swap", idx, value, nullptr, loc).at(0);
}

Value Ref::atomic_rmw(const std::string& kind, Indices idx, Operand value, Loc loc) const {
  Lowered l = lower_indices(type(), idx, "atomic_rmw", loc);
  std::vector<Value> ops = with_ref(*this, l);
  ops.push_back(value_for_region(value, type(), l.indexer.result_shape(), "atomic_rmw", loc));
  Attrs a;
  a.set(AttrKey::Index, l.indexer);
  a.set(AttrKey::Kind, kind);
  return trace::add_op1(OpCode::AtomicRmw, ops, std::move(a), loc);
}

Value Ref::atomic_cas(Indices idx, Operand expected, Operand desired, Loc loc) const {
  Lowered l = lower_indices(type(), idx, "atomic_cas", loc);
  Shape region = l.indexer.result_shape();
  std::vector<Value> ops = with_ref(*this, l);
  ops.push_back(value_for_region(expected, type(), region, "atomic_cas", loc));
  ops.push_back(value_for_region(desired, type(), region, "atomic_cas", loc));
  Attrs a;
  a.set(AttrKey::Index, l.indexer);
  return trace::add_op1(OpCode::AtomicCas, ops, std::move(a), loc);
}

const RefSlot& RefSlot::operator=(Operand v) const {
  ref_.store(idx_, std::move(v), loc_);
  return *this;
}
const RefSlot& RefSlot::operator+=(Operand v) const {
  ref_.store(idx_, Operand(load(), loc_) + v, loc_);
  return *this;
}
const RefSlot& RefSlot::operator-=(Operand v) const {
  ref_.store(idx_, Operand(load(), loc_) - v, loc_);
  return *this;
}
const RefSlot& RefSlot::operator*=(Operand v) const {
  ref_.store(idx_, Operand(load(), loc_) * v, loc_);
  return *this;
}

}  // namespace pallas
