// Traced array operations: operators, elementwise functions, shapes, reductions, dot.
#include <algorithm>
#include <numeric>
#include <set>

#include "core/trace_env.h"
#include "trace/context.h"

namespace pallas {

using ir::AttrKey;
using ir::Attrs;
using ir::OpCode;
using trace::add_op1;

namespace {

const char* op_name(OpCode c) { return ir::op_info(c).name.data(); }

// Brings two operands to a common dtype and shape (promotion + broadcasting).
std::pair<Value, Value> unify(const Operand& a, const Operand& b, const char* op, const Loc& loc) {
  DType t;
  if (a.is_value() && b.is_value())
    t = trace::promote_dtypes(a.as_value().dtype(), b.as_value().dtype(), op, loc);
  else if (a.is_value())
    t = trace::weak_literal_dtype(b.kind(), a.as_value().dtype());
  else if (b.is_value())
    t = trace::weak_literal_dtype(a.kind(), b.as_value().dtype());
  else
    t = a.value().dtype() == b.value().dtype()
            ? a.value().dtype()
            : trace::promote_dtypes(a.value().dtype(), b.value().dtype(), op, loc);
  Shape sa = a.is_value() ? a.as_value().shape() : Shape{};
  Shape sb = b.is_value() ? b.as_value().shape() : Shape{};
  Shape shape = trace::broadcast_shapes(sa, sb, op, loc);
  return {a.value_as(t, shape), b.value_as(t, shape)};
}

Value binary(OpCode code, const Operand& a, const Operand& b) {
  const Loc& loc = a.loc();
  auto [x, y] = unify(a, b, op_name(code), loc);
  return add_op1(code, {x, y}, {}, loc);
}

Value unary(OpCode code, const Operand& a, Attrs attrs = {}) {
  const Loc& loc = a.loc();
  Value x = a.value();
  // Like jnp: float-only functions of integers compute in f32.
  if (ir::op_info(code).is(ir::kFloatOnly) && !is_float(x.dtype()) && !is_semaphore(x.dtype()))
    x = trace::convert_to(x, DType::F32, loc);
  return add_op1(code, {x}, std::move(attrs), loc);
}

int64_t normalize_axis(int64_t axis, int rank, const char* what, const Loc& loc) {
  int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank)
    throw Error(std::string(what) + ": axis " + std::to_string(axis) +
                    " is out of range for rank " + std::to_string(rank),
                trace::src(loc));
  return a;
}

ir::Ints normalize_axes(std::vector<int64_t> axes, int rank, const char* what, const Loc& loc) {
  if (axes.empty()) {
    axes.resize(rank);
    std::iota(axes.begin(), axes.end(), 0);
    return axes;
  }
  for (int64_t& a : axes) a = normalize_axis(a, rank, what, loc);
  std::sort(axes.begin(), axes.end());
  return axes;
}

Value reduce(OpCode code, const Operand& x, std::vector<int64_t> axes, bool keepdims) {
  Value v = x.value();
  ir::Ints norm = normalize_axes(std::move(axes), v.rank(), op_name(code), x.loc());
  Attrs a;
  a.set(AttrKey::Axes, norm);
  Value r = add_op1(code, {v}, std::move(a), x.loc());
  if (!keepdims || norm.empty()) return r;
  Attrs e;
  e.set(AttrKey::Dims, norm);  // the reduced axes, as positions in the kept-dims result
  return add_op1(OpCode::ExpandDims, {r}, std::move(e), x.loc());
}

Value arg_extremum(OpCode code, const Operand& x, int64_t axis, DType index_dtype) {
  Value v = x.value();
  Attrs a;
  a.set(AttrKey::Axis, normalize_axis(axis, v.rank(), op_name(code), x.loc()));
  a.set(AttrKey::DTypeAttr, index_dtype);
  return add_op1(code, {v}, std::move(a), x.loc());
}

Value scan(OpCode code, const Operand& x, int64_t axis, bool reverse) {
  Value v = x.value();
  Attrs a;
  a.set(AttrKey::Axis, normalize_axis(axis, v.rank(), op_name(code), x.loc()));
  a.set(AttrKey::Reverse, int64_t{reverse});
  return add_op1(code, {v}, std::move(a), x.loc());
}

}  // namespace

// ---- Operators ------------------------------------------------------------------------------------
Value operator+(const Operand& a, const Operand& b) { return binary(OpCode::Add, a, b); }
Value operator-(const Operand& a, const Operand& b) { return binary(OpCode::Sub, a, b); }
Value operator*(const Operand& a, const Operand& b) { return binary(OpCode::Mul, a, b); }
Value operator/(const Operand& a, const Operand& b) { return binary(OpCode::Div, a, b); }
Value operator%(const Operand& a, const Operand& b) { return binary(OpCode::Rem, a, b); }
Value operator&(const Operand& a, const Operand& b) { return binary(OpCode::And, a, b); }
Value operator|(const Operand& a, const Operand& b) { return binary(OpCode::Or, a, b); }
Value operator^(const Operand& a, const Operand& b) { return binary(OpCode::Xor, a, b); }
Value operator<<(const Operand& a, const Operand& b) { return binary(OpCode::ShiftLeft, a, b); }
Value operator>>(const Operand& a, const Operand& b) {
  auto [x, y] = unify(a, b, ">>", a.loc());
  OpCode code = is_unsigned_int(x.dtype()) ? OpCode::ShiftRightLogical : OpCode::ShiftRightArithmetic;
  return add_op1(code, {x, y}, {}, a.loc());
}
Value operator&&(const Operand& a, const Operand& b) {
  auto [x, y] = unify(a, b, "&&", a.loc());
  if (x.dtype() != DType::Bool)
    throw Error("&&: needs bool operands, got " + x.type().to_string() + " (use & for bits)",
                trace::src(a.loc()));
  return add_op1(OpCode::And, {x, y}, {}, a.loc());
}
Value operator||(const Operand& a, const Operand& b) {
  auto [x, y] = unify(a, b, "||", a.loc());
  if (x.dtype() != DType::Bool)
    throw Error("||: needs bool operands, got " + x.type().to_string() + " (use | for bits)",
                trace::src(a.loc()));
  return add_op1(OpCode::Or, {x, y}, {}, a.loc());
}
Value operator==(const Operand& a, const Operand& b) { return binary(OpCode::Eq, a, b); }
Value operator!=(const Operand& a, const Operand& b) { return binary(OpCode::Ne, a, b); }
Value operator<(const Operand& a, const Operand& b) { return binary(OpCode::Lt, a, b); }
Value operator<=(const Operand& a, const Operand& b) { return binary(OpCode::Le, a, b); }
Value operator>(const Operand& a, const Operand& b) { return binary(OpCode::Gt, a, b); }
Value operator>=(const Operand& a, const Operand& b) { return binary(OpCode::Ge, a, b); }
Value operator-(const Operand& a) { return unary(OpCode::Neg, a); }
Value operator~(const Operand& a) { return unary(OpCode::Not, a); }
Value operator!(const Operand& a) {
  Value v = a.value();
  if (v.dtype() != DType::Bool)
    throw Error("!: needs a bool operand, got " + v.type().to_string() + " (use ~ for bits)",
                trace::src(a.loc()));
  return add_op1(OpCode::Not, {v}, {}, a.loc());
}

// ---- Elementwise functions ------------------------------------------------------------------------
Value neg(const Operand& x) { return unary(OpCode::Neg, x); }
Value abs(const Operand& x) { return unary(OpCode::Abs, x); }
Value sign(const Operand& x) { return unary(OpCode::Sign, x); }
Value floor(const Operand& x) { return unary(OpCode::Floor, x); }
Value ceil(const Operand& x) { return unary(OpCode::Ceil, x); }
Value exp(const Operand& x) { return unary(OpCode::Exp, x); }
Value exp2(const Operand& x) { return unary(OpCode::Exp2, x); }
Value log(const Operand& x) { return unary(OpCode::Log, x); }
Value log1p(const Operand& x) { return unary(OpCode::Log1p, x); }
Value sqrt(const Operand& x) { return unary(OpCode::Sqrt, x); }
Value rsqrt(const Operand& x) { return unary(OpCode::Rsqrt, x); }
Value reciprocal(const Operand& x) { return unary(OpCode::Reciprocal, x); }
Value tanh(const Operand& x) { return unary(OpCode::Tanh, x); }
Value logistic(const Operand& x) { return unary(OpCode::Logistic, x); }
Value sigmoid(const Operand& x) { return unary(OpCode::Logistic, x); }
Value sin(const Operand& x) { return unary(OpCode::Sin, x); }
Value cos(const Operand& x) { return unary(OpCode::Cos, x); }
Value erf(const Operand& x) { return unary(OpCode::Erf, x); }
Value is_finite(const Operand& x) { return unary(OpCode::IsFinite, x); }
Value logical_not(const Operand& x) { return !x; }
Value round(const Operand& x, RoundingMethod method) {
  Attrs a;
  a.set(AttrKey::Rounding, static_cast<int64_t>(method));
  return unary(OpCode::Round, x, std::move(a));
}
Value integer_pow(const Operand& x, int64_t exponent) {
  Attrs a;
  a.set(AttrKey::Exponent, exponent);
  return unary(OpCode::IntegerPow, x, std::move(a));
}
Value pow(const Operand& x, const Operand& y) {
  auto [a, b] = unify(x, y, "pow", x.loc());
  if (!is_float(a.dtype())) {
    a = trace::convert_to(a, DType::F32, x.loc());
    b = trace::convert_to(b, DType::F32, x.loc());
  }
  return add_op1(OpCode::Pow, {a, b}, {}, x.loc());
}
Value maximum(const Operand& a, const Operand& b) { return binary(OpCode::Max, a, b); }
Value minimum(const Operand& a, const Operand& b) { return binary(OpCode::Min, a, b); }
Value shift_left(const Operand& a, const Operand& b) { return binary(OpCode::ShiftLeft, a, b); }
Value shift_right_logical(const Operand& a, const Operand& b) {
  return binary(OpCode::ShiftRightLogical, a, b);
}
Value shift_right_arithmetic(const Operand& a, const Operand& b) {
  return binary(OpCode::ShiftRightArithmetic, a, b);
}

Value where(const Operand& pred, const Operand& a, const Operand& b) {
  const Loc& loc = pred.loc();
  Value p = pred.value();
  if (p.dtype() != DType::Bool)
    throw Error("where: the predicate must be bool, got " + p.type().to_string(), trace::src(loc));
  auto [x, y] = unify(a, b, "where", loc);
  Shape shape = trace::broadcast_shapes(p.shape(), x.shape(), "where", loc);
  p = trace::broadcast_value(p, shape, "where", loc);
  x = trace::broadcast_value(x, shape, "where", loc);
  y = trace::broadcast_value(y, shape, "where", loc);
  return add_op1(OpCode::Select, {p, x, y}, {}, loc);
}

Value convert(const Operand& x, DType t) {
  if (!x.is_value()) return trace::constant(trace::literal_as(x, t), {}, x.loc());
  return trace::convert_to(x.as_value(), t, x.loc());
}

Value bitcast(const Operand& x, DType t) {
  Attrs a;
  a.set(AttrKey::DTypeAttr, t);
  return add_op1(OpCode::Bitcast, {x.value()}, std::move(a), x.loc());
}

Value multiple_of(const Operand& x, int64_t n) {
  Attrs a;
  a.set(AttrKey::N, n);
  return add_op1(OpCode::MultipleOf, {x.value()}, std::move(a), x.loc());
}

// ---- Creation -------------------------------------------------------------------------------------
Value full(Shape shape, DType t, double value, Loc loc) {
  return trace::constant(Scalar::from_double(value, t), shape, loc);
}
Value full(Shape shape, const Scalar& value, Loc loc) { return trace::constant(value, shape, loc); }
Value zeros(Shape shape, DType t, Loc loc) { return full(std::move(shape), t, 0.0, loc); }
Value scalar(double value, DType t, Loc loc) { return full({}, t, value, loc); }
Value iota(DType t, Shape shape, int axis, Loc loc) {
  Attrs a;
  a.set(AttrKey::DTypeAttr, t);
  a.set(AttrKey::Axis, normalize_axis(axis, static_cast<int>(shape.size()), "iota", loc));
  a.set(AttrKey::ShapeAttr, std::move(shape));
  return add_op1(OpCode::Iota, {}, std::move(a), loc);
}

// ---- Shapes ---------------------------------------------------------------------------------------
Value broadcast_in_dim(const Operand& x, Shape shape, std::vector<int64_t> dims) {
  Attrs a;
  a.set(AttrKey::ShapeAttr, std::move(shape));
  a.set(AttrKey::Dims, std::move(dims));
  return add_op1(OpCode::BroadcastInDim, {x.value()}, std::move(a), x.loc());
}
Value broadcast_to(const Operand& x, Shape shape) {
  return trace::broadcast_value(x.value(), shape, "broadcast_to", x.loc());
}
Value reshape(const Operand& x, Shape shape) {
  Value v = x.value();
  // One -1 entry takes the remaining size, as in NumPy.
  auto minus = std::count(shape.begin(), shape.end(), -1);
  if (minus == 1) {
    int64_t known = 1;
    for (int64_t d : shape) if (d != -1) known *= d;
    if (known > 0 && v.type().size() % known == 0)
      *std::find(shape.begin(), shape.end(), -1) = v.type().size() / known;
  }
  Attrs a;
  a.set(AttrKey::ShapeAttr, std::move(shape));
  return add_op1(OpCode::Reshape, {v}, std::move(a), x.loc());
}
Value transpose(const Operand& x, std::vector<int64_t> permutation) {
  Value v = x.value();
  if (permutation.empty()) {
    permutation.resize(v.rank());
    std::iota(permutation.rbegin(), permutation.rend(), 0);
  }
  Attrs a;
  a.set(AttrKey::Permutation, std::move(permutation));
  return add_op1(OpCode::Transpose, {v}, std::move(a), x.loc());
}
Value squeeze(const Operand& x, std::vector<int64_t> dims) {
  Value v = x.value();
  if (dims.empty()) {
    for (int d = 0; d < v.rank(); ++d)
      if (v.shape()[d] == 1) dims.push_back(d);
  }
  Attrs a;
  a.set(AttrKey::Dims, normalize_axes(std::move(dims), v.rank(), "squeeze", x.loc()));
  return add_op1(OpCode::Squeeze, {v}, std::move(a), x.loc());
}
Value expand_dims(const Operand& x, std::vector<int64_t> dims) {
  Value v = x.value();
  int out_rank = v.rank() + static_cast<int>(dims.size());
  Attrs a;
  a.set(AttrKey::Dims, normalize_axes(std::move(dims), out_rank, "expand_dims", x.loc()));
  return add_op1(OpCode::ExpandDims, {v}, std::move(a), x.loc());
}
Value concatenate(const std::vector<Value>& xs, int axis, Loc loc) {
  if (xs.empty()) throw Error("concatenate: needs at least one value", trace::src(loc));
  Attrs a;
  a.set(AttrKey::Axis, normalize_axis(axis, xs[0].rank(), "concatenate", loc));
  return add_op1(OpCode::Concatenate, xs, std::move(a), loc);
}
Value slice(const Operand& x, std::vector<int64_t> start, std::vector<int64_t> limit,
            std::vector<int64_t> strides) {
  if (strides.empty()) strides.assign(start.size(), 1);
  Attrs a;
  a.set(AttrKey::Start, std::move(start));
  a.set(AttrKey::Limit, std::move(limit));
  a.set(AttrKey::Strides, std::move(strides));
  return add_op1(OpCode::Slice, {x.value()}, std::move(a), x.loc());
}
Value dynamic_slice(const Operand& x, std::vector<Operand> start, std::vector<int64_t> sizes) {
  std::vector<Value> ops = {x.value()};
  for (const Operand& s : start) {
    Value v = detail::as_index_scalar(s, "dynamic_slice start");
    ops.push_back(trace::convert_to(v, DType::I32, x.loc()));
  }
  Attrs a;
  a.set(AttrKey::Sizes, std::move(sizes));
  return add_op1(OpCode::DynamicSlice, ops, std::move(a), x.loc());
}
Value rev(const Operand& x, std::vector<int64_t> dims) {
  Value v = x.value();
  Attrs a;
  a.set(AttrKey::Dims, normalize_axes(std::move(dims), v.rank(), "rev", x.loc()));
  return add_op1(OpCode::Rev, {v}, std::move(a), x.loc());
}

// ---- Reductions, scans, sort ------------------------------------------------------------------------
Value sum(const Operand& x, std::vector<int64_t> axes, bool keepdims) { return reduce(OpCode::ReduceSum, x, std::move(axes), keepdims); }
Value max(const Operand& x, std::vector<int64_t> axes, bool keepdims) { return reduce(OpCode::ReduceMax, x, std::move(axes), keepdims); }
Value min(const Operand& x, std::vector<int64_t> axes, bool keepdims) { return reduce(OpCode::ReduceMin, x, std::move(axes), keepdims); }
Value prod(const Operand& x, std::vector<int64_t> axes, bool keepdims) { return reduce(OpCode::ReduceProd, x, std::move(axes), keepdims); }
Value reduce_and(const Operand& x, std::vector<int64_t> axes, bool keepdims) { return reduce(OpCode::ReduceAnd, x, std::move(axes), keepdims); }
Value reduce_or(const Operand& x, std::vector<int64_t> axes, bool keepdims) { return reduce(OpCode::ReduceOr, x, std::move(axes), keepdims); }
Value argmax(const Operand& x, int64_t axis, DType t) { return arg_extremum(OpCode::Argmax, x, axis, t); }
Value argmin(const Operand& x, int64_t axis, DType t) { return arg_extremum(OpCode::Argmin, x, axis, t); }
Value cumsum(const Operand& x, int64_t axis, bool reverse) { return scan(OpCode::Cumsum, x, axis, reverse); }
Value cumprod(const Operand& x, int64_t axis, bool reverse) { return scan(OpCode::Cumprod, x, axis, reverse); }
Value cummax(const Operand& x, int64_t axis, bool reverse) { return scan(OpCode::Cummax, x, axis, reverse); }
Value cummin(const Operand& x, int64_t axis, bool reverse) { return scan(OpCode::Cummin, x, axis, reverse); }

std::vector<Value> sort(const std::vector<Value>& operands, int num_keys, bool descending, Loc loc) {
  Attrs a;
  a.set(AttrKey::NumKeys, int64_t{num_keys});
  a.set(AttrKey::Descending, int64_t{descending});
  return trace::add_op(OpCode::Sort, operands, std::move(a), loc);
}
Value sort(const Operand& x, bool descending) {
  return sort(std::vector<Value>{x.value()}, 1, descending, x.loc()).at(0);
}

// ---- Matrix products ----------------------------------------------------------------------------------
Value dot_general(const Operand& lhs, const Operand& rhs, const DotDims& dims,
                  std::optional<DType> preferred) {
  auto [l, r] = [&] {
    Value a = lhs.value(), b = rhs.value();
    DType t = trace::promote_dtypes(a.dtype(), b.dtype(), "dot_general", lhs.loc());
    return std::pair{trace::convert_to(a, t, lhs.loc()), trace::convert_to(b, t, lhs.loc())};
  }();
  Attrs a;
  a.set(AttrKey::LhsContracting, dims.lhs_contracting);
  a.set(AttrKey::RhsContracting, dims.rhs_contracting);
  a.set(AttrKey::LhsBatch, dims.lhs_batch);
  a.set(AttrKey::RhsBatch, dims.rhs_batch);
  a.set(AttrKey::DTypeAttr, preferred.value_or(l.dtype()));
  return add_op1(OpCode::DotGeneral, {l, r}, std::move(a), lhs.loc());
}

Value dot(const Operand& a, const Operand& b, DotOptions opts) {
  Value x = a.value(), y = b.value();
  DotDims d;
  if (x.rank() == 2 && y.rank() == 2) {
    d.lhs_contracting = {opts.trans_a ? 0 : 1};
    d.rhs_contracting = {opts.trans_b ? 1 : 0};
  } else if (x.rank() == 3 && y.rank() == 3) {
    d.lhs_batch = {0};
    d.rhs_batch = {0};
    d.lhs_contracting = {opts.trans_a ? 1 : 2};
    d.rhs_contracting = {opts.trans_b ? 2 : 1};
  } else if (x.rank() == 1 && y.rank() == 1) {
    d.lhs_contracting = {0};
    d.rhs_contracting = {0};
  } else {
    throw Error("dot: needs two 2-D (or two batched 3-D, or two 1-D) operands, got " +
                    x.type().to_string() + " and " + y.type().to_string() +
                    " (use dot_general for other layouts)",
                trace::src(a.loc()));
  }
  return dot_general(Operand(x, a.loc()), Operand(y, a.loc()), d, opts.preferred);
}

// ---- Grid ---------------------------------------------------------------------------------------------
Value program_id(int axis, Loc loc) {
  Attrs a;
  a.set(AttrKey::Axis, int64_t{axis});
  return add_op1(OpCode::ProgramId, {}, std::move(a), loc);
}
Value num_programs(int axis, Loc loc) {
  Attrs a;
  a.set(AttrKey::Axis, int64_t{axis});
  return add_op1(OpCode::NumPrograms, {}, std::move(a), loc);
}

// ---- Control flow helpers that are not templates -----------------------------------------------------
std::vector<Value> switch_case(const Operand& index,
                               const std::vector<std::function<std::vector<Value>()>>& branches,
                               Loc loc) {
  if (branches.empty()) throw Error("switch_case: needs at least one branch", trace::src(loc));
  Value i = trace::convert_to(detail::as_index_scalar(index, "switch_case index"), DType::I32, loc);
  for (const auto& branch : branches)
    detail::trace_region({}, loc, [&](const std::vector<Value>&) { return branch(); });
  return detail::finish_control_op(OpCode::Switch, {i}, static_cast<int>(branches.size()), {}, loc);
}

namespace {
// A multicast copy (copy_gmem_to_smem with collective_axes) lands in the peers' memory and
// arrives on the peers' barriers, which a scope makes new at its entry without waiting for the
// cluster: not supported into a scope's arrays or onto its barriers (or views of them). Nor is a
// cluster_ref of a scope's array: the peer's scope is its own, entered at its own time.
void reject_multicasts_into_scope(const ir::Region& body) {
  std::set<ir::ValueId> scoped(body.args.begin(), body.args.end());
  std::function<void(const ir::Region&)> walk = [&](const ir::Region& r) {
    for (const ir::Op& op : r.ops) {
      if (ir::is_ref_view(op.code) && scoped.count(op.operands[0])) scoped.insert(op.results[0]);
      if (op.code == OpCode::GpuClusterRef && scoped.count(op.operands[0]))
        throw NotSupportedError("cluster_ref of a run_scoped array (each CTA's scope is its own: declare the array "
                                "in the kernel's scratch_shapes)",
                                op.loc);
      if (op.code == OpCode::GpuCopyGmemToSmem && op.attrs.has(AttrKey::Axes) &&
          (scoped.count(op.operands[1]) || scoped.count(op.operands[2])))
        throw NotSupportedError("copy_gmem_to_smem with collective_axes (a multicast) into a run_scoped array or "
                                "onto a run_scoped barrier (declare them in the kernel's scratch_shapes)",
                                op.loc);
      for (const ir::Region& inner : op.regions) walk(inner);
    }
  };
  walk(body);
}
}  // namespace

std::vector<Value> run_scoped(const std::vector<ScopedAlloc>& allocs,
                              const std::function<std::vector<Value>(std::vector<Ref>)>& fn,
                              const ScopedOptions& options, Loc loc) {
  const SourceLoc at = trace::src(loc);
  const core::TraceEnv* env = core::current_trace_env();
  const bool in_gpu_kernel = core::gpu_kernel_body_env() != nullptr;
  std::vector<ir::Type> types;
  ir::Ints arrivals;
  bool any_barrier = false;
  for (size_t i = 0; i < allocs.size(); ++i) {
    const ScopedAlloc& s = allocs[i];
    const std::string which = "run_scoped: allocation " + std::to_string(i);
    if (s.union_members)
      throw NotSupportedError(which + " is a gpu::Union in run_scoped (declare it in scratch_shapes)", at);
    const bool gpu_semaphore = s.dtype == DType::Semaphore && s.space == MemorySpace::Gmem;
    if (in_gpu_kernel && !gpu_semaphore && s.dtype != DType::GpuBarrier &&
        (s.space == MemorySpace::Semaphore || is_semaphore(s.dtype)))
      throw NotSupportedError(which + " is a TPU semaphore in a gpu::kernel's run_scoped (a gpu::kernel's semaphores are "
                                      "gpu::Semaphore{...})",
                              at);
    if (gpu_semaphore) {
      // The CTA's counters, as gpu::Semaphore scratch is (Mosaic GPU: thread-collective only).
      if (!in_gpu_kernel) throw Error(which + " is a gpu::Semaphore, which only a gpu::kernel's body can allocate", at);
      if (env->thread_axis >= 0 && options.collective_axes.empty())
        throw Error(which + " is a gpu::Semaphore, which the CTA's Pallas threads share: give the run_scoped "
                            "collective_axes = {\"" + env->grid_names.at(static_cast<size_t>(env->thread_axis)) +
                        "\"} (for semaphores of the whole grid, use pl::get_global)",
                    at);
    }
    if (s.dtype == DType::GpuBarrier) {
      if (!s.collective_axes.empty())
        throw NotSupportedError(which + " is a gpu::ClusterBarrier in run_scoped (declare it in scratch_shapes)", at);
      if (!in_gpu_kernel) throw Error(which + " is a gpu::Barrier, which only a gpu::kernel's body can allocate", at);
      if (s.barrier_arrivals < 1) throw Error(which + ": make barriers with gpu::Barrier{...}", at);
      any_barrier = true;
    }
    arrivals.push_back(s.dtype == DType::GpuBarrier ? s.barrier_arrivals : 0);
    types.push_back(ir::Type::ref(s.shape, s.dtype, s.space));
  }
  Attrs attrs;
  if (any_barrier) attrs.set(AttrKey::Arrivals, arrivals);
  if (!options.collective_axes.empty()) {
    if (!in_gpu_kernel)
      throw Error("run_scoped with collective_axes: only a gpu::kernel's body shares scoped buffers among its "
                  "threads",
                  at);
    const std::string thread = env->thread_axis >= 0 ? env->grid_names.at(static_cast<size_t>(env->thread_axis)) : "";
    for (const std::string& name : options.collective_axes)
      if (name != thread)
        throw Error("run_scoped: collective_axes names '" + name + "', which is not the mesh's thread axis" +
                        (thread.empty() ? std::string(" (the mesh has none: give it num_threads and thread_name)")
                                        : " ('" + thread + "')") +
                        "; scoped buffers are shared by the Pallas threads of one CTA",
                    at);
    if (options.collective_axes.size() > 1)
      throw Error("run_scoped: collective_axes names the thread axis '" + thread + "' more than once", at);
    attrs.set(AttrKey::Axes, ir::Ints{env->thread_axis});
    attrs.set(AttrKey::AxisNames, thread);
  }
  detail::trace_region(types, loc, [&](const std::vector<Value>& args) {
    std::vector<Ref> refs;
    for (const Value& v : args) refs.emplace_back(v);
    return fn(refs);
  });
  if (in_gpu_kernel) reject_multicasts_into_scope(trace::current(loc).pending_regions.back());
  return detail::finish_control_op(OpCode::RunScoped, {}, 1, std::move(attrs), loc);
}

void debug_print(const std::string& format, const std::vector<Value>& values, Loc loc) {
  Attrs a;
  a.set(AttrKey::Format, format);
  trace::add_op(OpCode::DebugPrint, values, std::move(a), loc);
}

void debug_check(const Operand& pred, const std::string& message, Loc loc) {
  Attrs a;
  a.set(AttrKey::Format, message);
  trace::add_op(OpCode::DebugCheck, {detail::as_bool_pred(pred, "debug_check predicate")}, std::move(a), loc);
}

}  // namespace pallas
