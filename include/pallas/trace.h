// Tracing: kernel bodies are C++ lambdas over Refs; operations on Values record IR ops.
//
// Broadcasting and dtype rules (what `a + b` does when a and b differ):
// * Shapes broadcast as in NumPy: the shorter shape is padded with leading 1s, then each
//   dimension must be equal or 1; size-1 dimensions stretch (recorded as broadcast_in_dim).
// * C++ literals are "weak": `x * 2.0f`, `x + 1` keep x's dtype when x is a float (for any
//   literal) or an integer (for integer literals). An integer or bool value with a floating
//   literal becomes f32; a bool value with an integer literal becomes i32.
// * Two values of different dtypes promote as JAX does: bool < any number; unsigned with
//   unsigned or signed with signed → the wider; u8/u16/u32 with a signed type → the smallest
//   signed type that holds both (u32 + i32 → i64); any integer with a float → the float;
//   f16 with bf16 → f32; floats → the wider. u64 with a signed integer has no integer type that
//   holds both: it is an error (cast explicitly).
// * `/` is lax.div: integer division truncates toward zero (C++'s rule), floats divide.
//   `%` is lax.rem (the sign follows the dividend, as in C++). `>>` is arithmetic for signed
//   and logical for unsigned integers.
//
// Every traced op records the user's source line (std::source_location), so errors, race and
// deadlock reports name the user's file:line.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <source_location>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "pallas/array.h"
#include "pallas/ir/ir.h"

namespace pallas {

using Loc = std::source_location;

class Ref;
class RefSlot;

// A traced array value (a tile, or a scalar when its rank is 0). Cheap to copy.
class Value {
 public:
  Value() = default;
  const ir::Type& type() const;
  DType dtype() const { return type().dtype; }
  const Shape& shape() const { return type().shape; }
  int rank() const { return type().rank(); }
  int64_t dim(int axis) const;
  bool valid() const { return id_ >= 0; }
  ir::ValueId id() const { return id_; }

  Value astype(DType t, Loc loc = Loc::current()) const;

  // Internal: wraps an id of the active trace.
  static Value from_id(ir::ValueId id);

 private:
  uint64_t trace_ = 0;
  ir::ValueId id_ = -1;
  friend class Ref;
};

// An operand of an operator: a Value, a Ref slot (loaded), or a weak C++ literal. Captures the
// user's source line when it is created (implicitly, at the operator's call site).
class Operand {
 public:
  Operand(const Value& v, Loc loc = Loc::current());
  Operand(const RefSlot& s, Loc loc = Loc::current());
  template <class T>
    requires std::is_arithmetic_v<T>
  Operand(T literal, Loc loc = Loc::current()) : loc_(loc) {
    if constexpr (std::is_same_v<T, bool>) {
      kind_ = Kind::Bool;
      i_ = literal ? 1 : 0;
    } else if constexpr (std::is_integral_v<T>) {
      kind_ = Kind::Int;
      i_ = static_cast<int64_t>(literal);
    } else {
      kind_ = Kind::Float;
      f_ = static_cast<double>(literal);
    }
  }
  const Loc& loc() const { return loc_; }
  bool is_value() const { return kind_ == Kind::Value; }
  // The operand as a Value; literals become constants of their default dtype (i32, f32, bool).
  Value value() const;
  // The operand as a Value of dtype t (literals are converted; values must already be t).
  Value value_as(DType t, const Shape& shape) const;
  enum class Kind { Value, Int, Float, Bool };
  Kind kind() const { return kind_; }
  const Value& as_value() const { return v_; }
  int64_t int_literal() const { return i_; }
  double float_literal() const { return f_; }

 private:
  Kind kind_ = Kind::Value;
  Value v_;
  int64_t i_ = 0;
  double f_ = 0;
  Loc loc_;
};

// ---- Indexers -------------------------------------------------------------------------------
struct AllTag {};
// Selects everything in the remaining dimensions: `x[pl::all]`, `x.at(i, pl::all)`.
inline constexpr AllTag all{};

// A dynamic slice: `size` elements from `start` (an int or a traced i32 scalar), every `stride`.
struct Slice {
  Operand start;
  int64_t size;
  int64_t stride = 1;
};
inline Slice ds(Operand start, int64_t size, int64_t stride = 1) {
  return Slice{std::move(start), size, stride};
}

// One entry of an indexer: an integer (static or traced), a slice, or `all`.
class Index {
 public:
  template <class T>
    requires std::is_integral_v<T>
  Index(T i, Loc loc = Loc::current()) : kind_(Kind::Int), start_(static_cast<int64_t>(i), loc), loc_(loc) {}
  Index(const Value& v, Loc loc = Loc::current()) : kind_(Kind::Int), start_(v, loc), loc_(loc) {}
  Index(const RefSlot& s, Loc loc = Loc::current());
  Index(Slice s, Loc loc = Loc::current())
      : kind_(Kind::Slice), start_(s.start), size_(s.size), stride_(s.stride), loc_(loc) {}
  Index(AllTag, Loc loc = Loc::current()) : kind_(Kind::All), start_(0, loc), loc_(loc) {}
  enum class Kind { Int, Slice, All };
  Kind kind() const { return kind_; }
  const Operand& start() const { return start_; }
  int64_t size() const { return size_; }
  int64_t stride() const { return stride_; }
  const Loc& loc() const { return loc_; }

 private:
  Kind kind_;
  Operand start_;
  int64_t size_ = 1;
  int64_t stride_ = 1;
  Loc loc_;
};
using Indices = std::vector<Index>;

// ---- Refs -----------------------------------------------------------------------------------
// A traced reference to a mutable buffer (a kernel parameter, a view of one, or a scoped
// allocation). `x[i]`, `x(i, j)` name a region to load or store; `x.at(...)` makes a view Ref.
class Ref {
 public:
  Ref() = default;
  explicit Ref(const Value& handle);
  const ir::Type& type() const { return indirect_ ? indirect_->type : handle_.type(); }
  const Shape& shape() const { return type().shape; }
  DType dtype() const { return type().dtype; }
  MemorySpace memory_space() const { return type().space; }
  int rank() const { return type().rank(); }
  int64_t dim(int axis) const { return handle_.dim(axis); }
  // The traced ref value. An indirectly indexed Ref (below) has none: using it anywhere but as
  // a DMA's source or destination raises pallas::Error.
  const Value& handle() const;

  // A view of part of this Ref (composes: x.at(i).at(ds(0, 8))).
  Ref at(Indices idx, Loc loc = Loc::current()) const;
  Ref at(Index i0, Loc loc = Loc::current()) const { return at(Indices{i0}, loc); }
  Ref at(Index i0, Index i1, Loc loc = Loc::current()) const { return at(Indices{i0, i1}, loc); }
  Ref at(Index i0, Index i1, Index i2, Loc loc = Loc::current()) const {
    return at(Indices{i0, i1, i2}, loc);
  }

  // The same memory with its dims permuted (result dim i is this Ref's dim permutation[i]; empty:
  // reversed), as JAX's `ref.transpose(...)` / `ref.T`. Loads, stores, DMAs and copies through it
  // see the elements in the new order; on the GPU, wgmma(acc, q, k.T()) reads an (n x k) SMEM
  // tile as the (k x n) b, K-major (attention's q k^T).
  Ref transpose(std::vector<int64_t> permutation = {}, Loc loc = Loc::current()) const;
  // The matrix transpose of a rank-2 Ref (its dims reversed).
  Ref T(Loc loc = Loc::current()) const;
  // The same elements in row-major order under another shape (one entry may be -1: what is
  // left), as JAX's `ref.reshape(...)`. The view must be expressible by strides: dims merged
  // must be evenly spaced in memory (a whole Ref, or a view of whole trailing dims, always is);
  // where they are not, using the view raises pallas::Error naming the line (on every backend).
  Ref reshape(Shape shape, Loc loc = Loc::current()) const;
  // The same bytes read as `dtype` (JAX's `ref.bitcast`), with bitcast's shape rule: the same
  // width keeps the shape; a narrower dtype adds a last dim of the ratio (an f32 Ref as bf16:
  // (m, n) -> (m, n, 2)); a wider one takes away a last dim of the ratio, which must be
  // contiguous, and the view must start on a multiple of the wider element's size (on the GPU a
  // misaligned start is the device's misaligned-address fault). Not differentiable (jvp
  // refuses it on a Ref with a tangent).
  Ref bitcast(DType dtype, Loc loc = Loc::current()) const;

  // Indirect (gather / scatter) indexing, as SparseCore DMAs do it: `data.at(indices)` picks
  // rows of the major dimension by a 1-D i32 index Ref in VMEM (or a 1-D i32 vector: `at(v)`
  // with a rank-1 Value as the first index). The result has shape (len(indices), rest of data)
  // and can only be the source of a DMA (a gather) or its destination (a scatter).
  Ref at(const Ref& indices, Loc loc = Loc::current()) const;
  struct Indirect {
    Value data;       // the indexed ref
    Value indices;    // an i32[n] ref or vector
    ir::Type type;    // ref<(n, data.shape[1:]...), data.dtype, data.space>
    SourceLoc loc;
  };
  // Set on an indirectly indexed Ref.
  const Indirect* indirect() const { return indirect_.get(); }

  RefSlot operator[](Index i) const;
  RefSlot operator()(Index i0) const;
  RefSlot operator()(Index i0, Index i1) const;
  RefSlot operator()(Index i0, Index i1, Index i2) const;
  RefSlot operator()(Index i0, Index i1, Index i2, Index i3) const;

  Value load(Indices idx = {}, Loc loc = Loc::current()) const;
  // Elements where `mask` is false read as `other`.
  Value load_masked(Indices idx, const Value& mask, Operand other, Loc loc = Loc::current()) const;
  void store(Indices idx, Operand value, Loc loc = Loc::current()) const;
  void store_masked(Indices idx, Operand value, const Value& mask, Loc loc = Loc::current()) const;
  // Stores `value` and returns what was there.
  Value swap(Indices idx, Operand value, Loc loc = Loc::current()) const;
  // Atomic read-modify-write; returns the old values. kind: add, max, min, and, or, xor, xchg.
  Value atomic_rmw(const std::string& kind, Indices idx, Operand value, Loc loc = Loc::current()) const;
  Value atomic_add(Indices idx, Operand value, Loc loc = Loc::current()) const {
    return atomic_rmw("add", std::move(idx), std::move(value), loc);
  }
  // Where the old value equals `expected`, stores `desired`. Returns the old values.
  Value atomic_cas(Indices idx, Operand expected, Operand desired, Loc loc = Loc::current()) const;

 private:
  Ref make_indirect(const Value& indices, const Loc& loc) const;
  Value handle_;
  std::shared_ptr<const Indirect> indirect_;
};

// `x[i]` / `x(i, j)`: loads when used as a value, stores when assigned.
// Each use as a value records a fresh load (store-then-use sees the stored data).
class RefSlot {
 public:
  RefSlot(Ref ref, Indices idx, Loc loc) : ref_(std::move(ref)), idx_(std::move(idx)), loc_(loc) {}
  operator Value() const { return load(); }
  Value load() const { return ref_.load(idx_, loc_); }
  Value astype(DType t) const { return load().astype(t, loc_); }
  const RefSlot& operator=(Operand v) const;
  const RefSlot& operator=(const RefSlot& other) const { return *this = Operand(other, loc_); }
  const RefSlot& operator+=(Operand v) const;
  const RefSlot& operator-=(Operand v) const;
  const RefSlot& operator*=(Operand v) const;
  const Loc& loc() const { return loc_; }

 private:
  Ref ref_;
  Indices idx_;
  Loc loc_;
};

// ---- Operators --------------------------------------------------------------------------------
Value operator+(const Operand& a, const Operand& b);
Value operator-(const Operand& a, const Operand& b);
Value operator*(const Operand& a, const Operand& b);
Value operator/(const Operand& a, const Operand& b);
Value operator%(const Operand& a, const Operand& b);
Value operator&(const Operand& a, const Operand& b);
Value operator|(const Operand& a, const Operand& b);
Value operator^(const Operand& a, const Operand& b);
Value operator<<(const Operand& a, const Operand& b);
Value operator>>(const Operand& a, const Operand& b);
Value operator&&(const Operand& a, const Operand& b);
Value operator||(const Operand& a, const Operand& b);
Value operator==(const Operand& a, const Operand& b);
Value operator!=(const Operand& a, const Operand& b);
Value operator<(const Operand& a, const Operand& b);
Value operator<=(const Operand& a, const Operand& b);
Value operator>(const Operand& a, const Operand& b);
Value operator>=(const Operand& a, const Operand& b);
Value operator-(const Operand& a);
Value operator~(const Operand& a);
Value operator!(const Operand& a);

// ---- Elementwise functions --------------------------------------------------------------------
#define PALLAS_UNARY_FN(fn) Value fn(const Operand& x);
PALLAS_UNARY_FN(neg)
PALLAS_UNARY_FN(abs)
PALLAS_UNARY_FN(sign)
PALLAS_UNARY_FN(floor)
PALLAS_UNARY_FN(ceil)
PALLAS_UNARY_FN(exp)
PALLAS_UNARY_FN(exp2)
PALLAS_UNARY_FN(log)
PALLAS_UNARY_FN(log1p)
PALLAS_UNARY_FN(sqrt)
PALLAS_UNARY_FN(rsqrt)
PALLAS_UNARY_FN(reciprocal)
PALLAS_UNARY_FN(tanh)
PALLAS_UNARY_FN(logistic)
PALLAS_UNARY_FN(sigmoid)  // = logistic
PALLAS_UNARY_FN(sin)
PALLAS_UNARY_FN(cos)
PALLAS_UNARY_FN(erf)
PALLAS_UNARY_FN(is_finite)
PALLAS_UNARY_FN(logical_not)
#undef PALLAS_UNARY_FN
enum class RoundingMethod { AwayFromZero = 0, ToNearestEven = 1 };
Value round(const Operand& x, RoundingMethod method = RoundingMethod::AwayFromZero);
Value integer_pow(const Operand& x, int64_t exponent);
Value pow(const Operand& x, const Operand& y);
Value maximum(const Operand& a, const Operand& b);
Value minimum(const Operand& a, const Operand& b);
Value shift_left(const Operand& a, const Operand& b);
Value shift_right_logical(const Operand& a, const Operand& b);
Value shift_right_arithmetic(const Operand& a, const Operand& b);
// pred ? a : b, elementwise, with broadcasting and promotion of a and b.
Value where(const Operand& pred, const Operand& a, const Operand& b);
inline Value select(const Operand& pred, const Operand& a, const Operand& b) {
  return where(pred, a, b);
}
Value convert(const Operand& x, DType t);
// lax.bitcast_convert_type: same width keeps the shape; narrower adds a trailing dimension.
Value bitcast(const Operand& x, DType t);
// A hint that x (an integer) is a multiple of n; the value is unchanged.
Value multiple_of(const Operand& x, int64_t n);

// ---- Creation ---------------------------------------------------------------------------------
Value full(Shape shape, DType t, double value, Loc loc = Loc::current());
Value full(Shape shape, const Scalar& value, Loc loc = Loc::current());
Value zeros(Shape shape, DType t, Loc loc = Loc::current());
Value scalar(double value, DType t, Loc loc = Loc::current());
Value iota(DType t, Shape shape, int axis, Loc loc = Loc::current());

// ---- Shapes -----------------------------------------------------------------------------------
Value broadcast_in_dim(const Operand& x, Shape shape, std::vector<int64_t> dims);
// NumPy-style broadcast of x to `shape`.
Value broadcast_to(const Operand& x, Shape shape);
Value reshape(const Operand& x, Shape shape);
Value transpose(const Operand& x, std::vector<int64_t> permutation);
Value squeeze(const Operand& x, std::vector<int64_t> dims);
Value expand_dims(const Operand& x, std::vector<int64_t> dims);
Value concatenate(const std::vector<Value>& xs, int axis, Loc loc = Loc::current());
Value slice(const Operand& x, std::vector<int64_t> start, std::vector<int64_t> limit,
            std::vector<int64_t> strides = {});
// Start indices are clamped so the slice fits (XLA's rule).
Value dynamic_slice(const Operand& x, std::vector<Operand> start, std::vector<int64_t> sizes);
Value rev(const Operand& x, std::vector<int64_t> dims);

// ---- Reductions, scans, sort ------------------------------------------------------------------
// Negative axes count from the end; an empty list reduces over every axis. With keepdims the
// reduced axes stay as size-1 dimensions (so the result broadcasts against x).
Value sum(const Operand& x, std::vector<int64_t> axes = {}, bool keepdims = false);
Value max(const Operand& x, std::vector<int64_t> axes = {}, bool keepdims = false);
Value min(const Operand& x, std::vector<int64_t> axes = {}, bool keepdims = false);
Value prod(const Operand& x, std::vector<int64_t> axes = {}, bool keepdims = false);
Value reduce_and(const Operand& x, std::vector<int64_t> axes = {}, bool keepdims = false);
Value reduce_or(const Operand& x, std::vector<int64_t> axes = {}, bool keepdims = false);
// Index of the first maximum (NaN counts as the maximum) along `axis`.
Value argmax(const Operand& x, int64_t axis, DType index_dtype = DType::I32);
Value argmin(const Operand& x, int64_t axis, DType index_dtype = DType::I32);
Value cumsum(const Operand& x, int64_t axis, bool reverse = false);
Value cumprod(const Operand& x, int64_t axis, bool reverse = false);
Value cummax(const Operand& x, int64_t axis, bool reverse = false);
Value cummin(const Operand& x, int64_t axis, bool reverse = false);
// Stable sort along the last axis; floats in total order (-NaN < -inf < ... < -0 < +0 < ... <
// inf < NaN). The first `num_keys` operands are keys (lexicographic); the rest follow along.
std::vector<Value> sort(const std::vector<Value>& operands, int num_keys = 1,
                        bool descending = false, Loc loc = Loc::current());
Value sort(const Operand& x, bool descending = false);

// ---- Matrix products --------------------------------------------------------------------------
struct DotDims {
  std::vector<int64_t> lhs_contracting, rhs_contracting, lhs_batch, rhs_batch;
};
// Result dims: batch, then lhs free dims, then rhs free dims. `preferred` (the accumulation and
// result dtype, e.g. f32 for bf16 inputs) defaults to the inputs' dtype.
Value dot_general(const Operand& lhs, const Operand& rhs, const DotDims& dims,
                  std::optional<DType> preferred = std::nullopt);
struct DotOptions {
  bool trans_a = false;
  bool trans_b = false;
  std::optional<DType> preferred;
};
// 2-D (or batched 3-D) matrix product, like pl.dot.
Value dot(const Operand& a, const Operand& b, DotOptions opts = {});

// ---- Grid -------------------------------------------------------------------------------------
Value program_id(int axis, Loc loc = Loc::current());
Value num_programs(int axis, Loc loc = Loc::current());

// ---- Control flow -----------------------------------------------------------------------------
namespace detail {
// Region plumbing used by the control-flow templates below.
std::vector<Value> begin_region(const std::vector<ir::Type>& arg_types);
void end_region_yield(const std::vector<Value>& yields, const Loc& loc);
void abandon_region();
std::vector<Value> finish_control_op(ir::OpCode code, const std::vector<Value>& operands,
                                     int num_regions, ir::Attrs attrs, const Loc& loc);
Value as_carry(const Operand& o);
Value as_bool_pred(const Operand& o, const char* what);
Value as_index_scalar(const Operand& o, const char* what);

// Runs fn inside an open region; closes it (with the yields) or abandons it on an exception.
template <class Fn> void trace_region(const std::vector<ir::Type>& arg_types, const Loc& loc,
                                      Fn&& fn) {
  std::vector<Value> args = begin_region(arg_types);
  std::vector<Value> yields;
  try {
    yields = fn(args);
  } catch (...) {
    abandon_region();
    throw;
  }
  end_region_yield(yields, loc);
}

template <class R> std::vector<Value> to_values(R&& r) {
  using T = std::decay_t<R>;
  if constexpr (std::is_same_v<T, std::vector<Value>>)
    return std::forward<R>(r);
  else
    return {as_carry(Operand(r))};
}

std::vector<ir::Type> types_of(const std::vector<Value>& vs);
}  // namespace detail

// for (i = lo; i < hi; ++i) body(i)  — no carries.
template <class F>
  requires std::is_invocable_v<F, Value>
void fori_loop(const Operand& lo, const Operand& hi, F&& body, Loc loc = Loc::current()) {
  Value l = detail::as_index_scalar(lo, "fori_loop lower bound");
  Value h = detail::as_index_scalar(hi, "fori_loop upper bound");
  detail::trace_region({l.type()}, loc, [&](const std::vector<Value>& args) {
    body(args[0]);
    return std::vector<Value>{};
  });
  detail::finish_control_op(ir::OpCode::For, {l, h}, 1, {}, loc);
}

// carry = init; for (i = lo; i < hi; ++i) carry = body(i, carry); return carry.
template <class F>
  requires std::is_invocable_v<F, Value, Value>
Value fori_loop(const Operand& lo, const Operand& hi, const Operand& init, F&& body,
                Loc loc = Loc::current()) {
  Value l = detail::as_index_scalar(lo, "fori_loop lower bound");
  Value h = detail::as_index_scalar(hi, "fori_loop upper bound");
  Value c = detail::as_carry(init);
  detail::trace_region({l.type(), c.type()}, loc, [&](const std::vector<Value>& args) {
    return detail::to_values(body(args[0], args[1]));
  });
  return detail::finish_control_op(ir::OpCode::For, {l, h, c}, 1, {}, loc).at(0);
}

// Several carries, as a vector.
template <class F>
  requires std::is_invocable_v<F, Value, std::vector<Value>>
std::vector<Value> fori_loop(const Operand& lo, const Operand& hi, const std::vector<Value>& init,
                             F&& body, Loc loc = Loc::current()) {
  Value l = detail::as_index_scalar(lo, "fori_loop lower bound");
  Value h = detail::as_index_scalar(hi, "fori_loop upper bound");
  std::vector<ir::Type> arg_types = {l.type()};
  for (const ir::Type& t : detail::types_of(init)) arg_types.push_back(t);
  detail::trace_region(arg_types, loc, [&](const std::vector<Value>& args) {
    return detail::to_values(body(args[0], std::vector<Value>(args.begin() + 1, args.end())));
  });
  std::vector<Value> ops = {l, h};
  ops.insert(ops.end(), init.begin(), init.end());
  return detail::finish_control_op(ir::OpCode::For, ops, 1, {}, loc);
}

// while (cond(carries)) carries = body(carries); return carries.
template <class C, class B>
std::vector<Value> while_loop(const std::vector<Value>& init, C&& cond, B&& body,
                              Loc loc = Loc::current()) {
  std::vector<ir::Type> types = detail::types_of(init);
  detail::trace_region(types, loc, [&](const std::vector<Value>& args) {
    return std::vector<Value>{detail::as_bool_pred(Operand(cond(args)), "while_loop condition")};
  });
  detail::trace_region(types, loc, [&](const std::vector<Value>& args) {
    return detail::to_values(body(args));
  });
  return detail::finish_control_op(ir::OpCode::While, init, 2, {}, loc);
}

template <class C, class B>
  requires std::is_invocable_v<C, Value>
Value while_loop(const Operand& init, C&& cond, B&& body, Loc loc = Loc::current()) {
  Value c = detail::as_carry(init);
  return while_loop(
             std::vector<Value>{c}, [&](const std::vector<Value>& v) { return cond(v[0]); },
             [&](const std::vector<Value>& v) { return detail::to_values(body(v[0])); }, loc)
      .at(0);
}

// if (pred) then_fn(); — the branch returns nothing.
template <class F> void when(const Operand& pred, F&& then_fn, Loc loc = Loc::current()) {
  Value p = detail::as_bool_pred(pred, "when predicate");
  detail::trace_region({}, loc, [&](const std::vector<Value>&) {
    then_fn();
    return std::vector<Value>{};
  });
  detail::trace_region({}, loc, [&](const std::vector<Value>&) { return std::vector<Value>{}; });
  detail::finish_control_op(ir::OpCode::Cond, {p}, 2, {}, loc);
}

// pred ? true_fn() : false_fn(). Both branches return the same kind of thing: nothing, a Value,
// or a std::vector<Value>; the result has the same form.
template <class T, class F>
auto cond(const Operand& pred, T&& true_fn, F&& false_fn, Loc loc = Loc::current()) {
  using R = std::invoke_result_t<T>;
  Value p = detail::as_bool_pred(pred, "cond predicate");
  auto run = [&](auto& fn) {
    return [&](const std::vector<Value>&) {
      if constexpr (std::is_void_v<R>) {
        fn();
        return std::vector<Value>{};
      } else {
        return detail::to_values(fn());
      }
    };
  };
  detail::trace_region({}, loc, run(true_fn));
  detail::trace_region({}, loc, run(false_fn));
  std::vector<Value> out = detail::finish_control_op(ir::OpCode::Cond, {p}, 2, {}, loc);
  if constexpr (std::is_void_v<R>)
    return;
  else if constexpr (std::is_same_v<std::decay_t<R>, std::vector<Value>>)
    return out;
  else
    return out.at(0);
}

// Runs branches[clamp(index, 0, n-1)](); each branch returns std::vector<Value> (maybe empty).
std::vector<Value> switch_case(const Operand& index,
                               const std::vector<std::function<std::vector<Value>()>>& branches,
                               Loc loc = Loc::current());

// Where a gpu::kernel's scratch array lives when it belongs to a gpu::Union: the union (0, 1, ...
// in scratch order), the array's byte offset from the union's start, and the union's bytes (its
// largest member).
struct ScratchUnionSlot {
  int union_index = -1;  // -1: not in a union
  int64_t offset = 0;
  int64_t union_bytes = 0;
};

// A scratch buffer: in a call's scratch_shapes it lives for the whole call (and persists across
// grid points); given to run_scoped it lives while the scope runs. tpu::VMEM(...), gpu::SMEM(...),
// gpu::Barrier{...} and the like make them.
struct ScratchShape {
  Shape shape;
  DType dtype = DType::F32;
  MemorySpace space = MemorySpace::Vmem;
  int barrier_arrivals = 0;  // gpu::Barrier: the arrivals that complete a phase
  // gpu::ClusterBarrier: the cluster axes along which an arrival reaches the other CTAs'
  // barriers (barrier_arrivals then counts per CTA until gpu::kernel multiplies it out).
  std::vector<std::string> collective_axes;
  // gpu::Union (gpu::kernel only): lists of arrays laid over the same shared memory; shape and
  // dtype are unused. gpu::kernel flattens it into its members' arrays, in order, each of which
  // then records its place in `in_union`.
  std::shared_ptr<const std::vector<std::vector<ScratchShape>>> union_members;
  ScratchUnionSlot in_union;
};

using ScopedAlloc = ScratchShape;  // (run_scoped's name for it)

struct ScopedOptions {
  // Mosaic GPU's collective_axes: the axes whose threads share the scope's buffers. In a
  // gpu::kernel, the thread axis (Mesh::thread_name): every Pallas thread of the CTA enters the
  // scope, they all get the same buffers and barriers, and none goes on into the scope before all
  // have entered, nor past its end before all have left it (without it, each Pallas thread's
  // buffers are its own).
  std::vector<std::string> collective_axes;
};
// Calls fn(refs) with fresh buffers that live until fn returns; returns what fn returns (values,
// not refs). fn takes a std::vector<Ref>. In a gpu::kernel the buffers may be gpu::SMEM arrays,
// gpu::Barrier / gpu::TMABarrier barriers (a fresh barrier: no phase completed) and gpu::Semaphore
// counters (0 at each entry and due back at 0 at the exit; the CTA's, so collective over the
// thread axis when the mesh has one). One signature, so that `run_scoped(allocs, fn, {})` means
// the options (a Loc overload made `{}` ambiguous); a helper forwarding its caller's line writes
// `run_scoped(allocs, fn, {}, loc)`.
std::vector<Value> run_scoped(const std::vector<ScopedAlloc>& allocs,
                              const std::function<std::vector<Value>(std::vector<Ref>)>& fn,
                              const ScopedOptions& options = {}, Loc loc = Loc::current());

// Prints "{}"-formatted values when the kernel runs (interpreters: to stdout).
void debug_print(const std::string& format, const std::vector<Value>& values = {},
                 Loc loc = Loc::current());

// Checks `pred` (a bool scalar) when the kernel runs with CallOptions::debug_checks: a false
// predicate raises pallas::Error "debug_check failed: <message> at grid point (...)" at this line.
// Without debug_checks the check is ignored by every backend.
void debug_check(const Operand& pred, const std::string& message, Loc loc = Loc::current());

// ---- Tracing entry point ----------------------------------------------------------------------
namespace detail {
// Owns the thread-local trace for its lifetime; unwinds cleanly on exceptions.
class TraceScope {
 public:
  TraceScope(std::string name, const Loc& loc);
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;
  std::vector<Value> add_params(const std::vector<ir::Type>& types);
  // Lets pl::get_global add parameters to this trace (after the others), recording their types
  // in *sink. Without it, get_global in this trace is an error.
  void collect_globals(std::vector<ir::Type>* sink);
  ir::Kernel finish();
  // Ends the body with a yield of these values (functions that return values: index maps).
  ir::Kernel finish(const std::vector<Value>& yields, const Loc& loc);

 private:
  void* saved_;  // the enclosing trace (traces nest: index maps traced inside a call's setup)
};

inline constexpr size_t kMaxKernelParams = 24;
template <size_t> using RefOf = const Ref&;

template <class F, size_t... I>
void call_with_refs(F& fn, const std::vector<Ref>& refs, std::index_sequence<I...>) {
  fn(refs[I]...);
}

template <size_t N, class F> void dispatch_refs(F& fn, const std::vector<Ref>& refs) {
  if constexpr (N > kMaxKernelParams) {
    throw Error("the kernel function cannot be called with " + std::to_string(refs.size()) +
                " Refs: check that it takes one Ref per input, output and scratch buffer");
  } else {
    if (refs.size() == N) {
      if constexpr ([]<size_t... I>(std::index_sequence<I...>) {
                      return std::is_invocable_v<F&, RefOf<I>...>;
                    }(std::make_index_sequence<N>{})) {
        call_with_refs(fn, refs, std::make_index_sequence<N>{});
        return;
      } else {
        throw Error("the kernel function cannot be called with " + std::to_string(N) +
                    " Refs: check that it takes one Ref per input, output and scratch buffer");
      }
    }
    dispatch_refs<N + 1>(fn, refs);
  }
}
}  // namespace detail

// Traces `fn` (a callable taking one Ref per entry of `params`, or a std::vector<Ref>) into a
// verified kernel.
template <class F>
ir::Kernel trace_kernel(F&& fn, const std::vector<ir::Type>& params, std::string name = "kernel",
                        Loc loc = Loc::current()) {
  detail::TraceScope scope(std::move(name), loc);
  std::vector<Value> handles = scope.add_params(params);
  std::vector<Ref> refs;
  for (const Value& h : handles) refs.emplace_back(h);
  if constexpr (std::is_invocable_v<F&, std::vector<Ref>>)
    fn(refs);
  else
    detail::dispatch_refs<0>(fn, refs);
  return scope.finish();
}

}  // namespace pallas
