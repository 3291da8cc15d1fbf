// pl::jvp: forward-mode derivative of a pallas_call as an IR -> IR pass.
//
// The call is traced for the primal shapes; the derivative kernel is then emitted, op by op, into
// the trace of a new pallas_call: each op's primal copy followed by its tangent rule. Tangents
// are per value (kNoTangent = a symbolic zero, made concrete only where an op needs a value) and
// per Ref (every float Ref — input, output, scratch, scoped, view — has a tangent Ref of the same
// type, so loads and stores simply repeat on it at the same index). The new call takes
// *primal_inputs, *tangent_inputs (float inputs only), and writes *primal_outputs,
// *tangent_outputs (float outputs only), each tangent with its primal's BlockSpec.
#include "transforms/jvp.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/call.h"
#include "pallas/transforms.h"
#include "trace/context.h"

namespace pallas {

namespace jvp_detail {

JvpRule jvp_rule(ir::OpCode code) {
  using ir::OpCode;
  switch (code) {
    // SparseCore vector subcore ops: counts and masks carry no tangent; the rest has no rule.
    case OpCode::ScScanCount: case OpCode::ScAllReducePopulationCount: case OpCode::ScAllReduceFfs:
      return JvpRule::kZeroTangent;
    case OpCode::ScLoadGather: case OpCode::ScStoreScatter: case OpCode::ScAddupdateScatter:
    case OpCode::ScLoadExpanded: case OpCode::ScStoreCompressed: case OpCode::ScAddupdate:
    case OpCode::ScAddupdateCompressed: case OpCode::ScFetchAndAdd: case OpCode::ScMaskedScan:
    case OpCode::ScSortKeyVal: case OpCode::ScPack: case OpCode::ScUnpack: case OpCode::ScDynamicGather:
      return JvpRule::kNotDifferentiable;
    // Linear or smooth: a tangent rule.
    case OpCode::Neg: case OpCode::Abs: case OpCode::Exp: case OpCode::Exp2: case OpCode::Log:
    case OpCode::Log1p: case OpCode::Sqrt: case OpCode::Rsqrt: case OpCode::Reciprocal:
    case OpCode::Tanh: case OpCode::Logistic: case OpCode::Sin: case OpCode::Cos:
    case OpCode::Erf: case OpCode::IntegerPow:
    case OpCode::Add: case OpCode::Sub: case OpCode::Mul: case OpCode::Div: case OpCode::Rem:
    case OpCode::Pow: case OpCode::Max: case OpCode::Min:
    case OpCode::Select: case OpCode::Convert:
    case OpCode::BroadcastInDim: case OpCode::Reshape: case OpCode::Transpose:
    case OpCode::Squeeze: case OpCode::ExpandDims: case OpCode::Concatenate: case OpCode::Slice:
    case OpCode::DynamicSlice: case OpCode::Rev:
    case OpCode::ReduceSum: case OpCode::ReduceMax: case OpCode::ReduceMin:
    case OpCode::ReduceProd: case OpCode::Cumsum: case OpCode::Cumprod: case OpCode::Cummax:
    case OpCode::Cummin: case OpCode::DotGeneral: case OpCode::Sort:
    case OpCode::RefView: case OpCode::RefTranspose: case OpCode::RefReshape:
    case OpCode::Load: case OpCode::Store: case OpCode::Swap:
    case OpCode::For: case OpCode::While: case OpCode::Cond: case OpCode::Switch:
    case OpCode::RunScoped: case OpCode::Yield:
      return JvpRule::kRule;
    // No tangent: constants, grid queries, integer/bool results, piecewise-constant functions,
    // and side effects that carry no float data.
    case OpCode::Constant: case OpCode::Iota: case OpCode::ProgramId: case OpCode::NumPrograms:
    case OpCode::AxisIndex:
    case OpCode::Sign: case OpCode::Floor: case OpCode::Ceil: case OpCode::Round:
    case OpCode::IsFinite: case OpCode::Not: case OpCode::MultipleOf:
    case OpCode::And: case OpCode::Or: case OpCode::Xor: case OpCode::ShiftLeft:
    case OpCode::ShiftRightLogical: case OpCode::ShiftRightArithmetic:
    case OpCode::Eq: case OpCode::Ne: case OpCode::Lt: case OpCode::Le: case OpCode::Gt:
    case OpCode::Ge:
    case OpCode::ReduceAnd: case OpCode::ReduceOr: case OpCode::Argmax: case OpCode::Argmin:
    case OpCode::DebugPrint: case OpCode::DebugCheck:
    case OpCode::SemaphoreSignal: case OpCode::SemaphoreWait: case OpCode::SemaphoreRead:
    case OpCode::GetBarrierSemaphore: case OpCode::SubcoreBarrier:
    case OpCode::GpuWaitSmemToGmem: case OpCode::GpuCommitSmemToGmemGroup: case OpCode::GpuCommitSmem: case OpCode::GpuBarrierArrive:
    case OpCode::GpuBarrierWait: case OpCode::GpuWgmmaWait: case OpCode::GpuSetMaxRegisters:
    case OpCode::NamedRegionBegin: case OpCode::NamedRegionEnd: case OpCode::GpuAsyncPrefetch:
      return JvpRule::kZeroTangent;
    // No rule yet: fine on integer data, an error once a tangent reaches them.
    case OpCode::Bitcast: case OpCode::RefBitcast: case OpCode::AtomicRmw: case OpCode::AtomicCas:
    case OpCode::DmaStart: case OpCode::DmaWait:
    case OpCode::GpuCopyGmemToSmem: case OpCode::GpuCopySmemToGmem: case OpCode::GpuWgmma: case OpCode::GpuClusterRef:
      return JvpRule::kNotDifferentiable;
  }
  return JvpRule::kMissing;
}

}  // namespace jvp_detail

namespace {

using ir::AttrKey;
using ir::Attrs;
using ir::Ints;
using ir::OpCode;
using ir::Type;
using ir::ValueId;
using jvp_detail::JvpRule;

constexpr ValueId kNoTangent = -1;

bool differentiable(const Type& t) { return is_float(t.dtype); }

// Emits the derivative of `src` into the builder of the trace under way.
class JvpEmitter {
 public:
  JvpEmitter(const ir::Kernel& src, ir::Builder& b, std::string call_info)
      : src_(src),
        b_(b),
        call_info_(std::move(call_info)),
        primal_(src.values.size(), -1),
        tangent_(src.values.size(), kNoTangent) {}

  void bind(ValueId src_id, ValueId primal, ValueId tangent) {
    primal_.at(static_cast<size_t>(src_id)) = primal;
    tangent_.at(static_cast<size_t>(src_id)) = tangent;
  }

  // Emits every op of `r` but a trailing yield, which is returned (or null).
  const ir::Op* emit_region_ops(const ir::Region& r) {
    for (const ir::Op& op : r.ops) {
      if (op.code == OpCode::Yield) return &op;
      emit(op);
    }
    return nullptr;
  }

 private:
  const ir::Kernel& src_;
  ir::Builder& b_;
  std::string call_info_;
  std::vector<ValueId> primal_;   // source value -> its copy
  std::vector<ValueId> tangent_;  // source value -> its tangent (value or Ref), or kNoTangent
  SourceLoc loc_;                 // the op being differentiated (emitted ops carry its line)

  ValueId p(ValueId s) const { return primal_.at(static_cast<size_t>(s)); }
  ValueId t(ValueId s) const { return tangent_.at(static_cast<size_t>(s)); }
  const Type& type(ValueId new_id) const { return b_.type(new_id); }

  // ---- emitting helpers (all on new ids) --------------------------------------------------------
  ValueId op1(OpCode c, std::vector<ValueId> operands, Attrs a = {}) {
    return b_.add1(c, std::move(operands), std::move(a), loc_);
  }
  ValueId full(const Type& ty, double v) {
    Attrs a;
    a.set(AttrKey::Value, Scalar::from_double(v, ty.dtype));
    a.set(AttrKey::ShapeAttr, Ints(ty.shape));
    return op1(OpCode::Constant, {}, std::move(a));
  }
  ValueId full_like(ValueId like, double v) { return full(type(like), v); }
  // The tangent of source value `s` as a value (zeros when symbolic).
  ValueId concrete(ValueId s) { return t(s) != kNoTangent ? t(s) : full_like(p(s), 0.0); }
  ValueId add(ValueId a, ValueId b) {
    if (a == kNoTangent) return b;
    if (b == kNoTangent) return a;
    return op1(OpCode::Add, {a, b});
  }
  ValueId mul(ValueId a, ValueId b) {
    if (a == kNoTangent || b == kNoTangent) return kNoTangent;
    return op1(OpCode::Mul, {a, b});
  }
  ValueId neg(ValueId a) { return a == kNoTangent ? kNoTangent : op1(OpCode::Neg, {a}); }
  ValueId scale(ValueId a, double c) { return a == kNoTangent ? a : mul(a, full_like(a, c)); }
  ValueId as_dtype(ValueId v, DType d) {
    Attrs a;
    a.set(AttrKey::DTypeAttr, d);
    return op1(OpCode::Convert, {v}, std::move(a));
  }
  ValueId select(ValueId pred, ValueId a, ValueId b) { return op1(OpCode::Select, {pred, a, b}); }

  [[noreturn]] void not_differentiable(const ir::Op& op) const {
    throw NotSupportedError("jvp of pallas_call " + call_info_ + ": the kernel op `" +
                                std::string(op.info().name) +
                                "` has no derivative rule, and a tangent reaches it (it is fine "
                                "on integer data or on values that do not depend on the inputs)",
                            op.loc);
  }

  std::vector<ValueId> primal_operands(const ir::Op& op) const {
    std::vector<ValueId> v;
    v.reserve(op.operands.size());
    for (ValueId s : op.operands) v.push_back(p(s));
    return v;
  }
  bool any_tangent(const ir::Op& op) const {
    for (ValueId s : op.operands)
      if (t(s) != kNoTangent) return true;
    return false;
  }
  // The primal copy of an op without regions.
  std::vector<ValueId> emit_primal(const ir::Op& op) {
    std::vector<ValueId> r = b_.add(op.code, primal_operands(op), op.attrs, op.loc);
    for (size_t i = 0; i < r.size(); ++i) bind(op.results[i], r[i], kNoTangent);
    return r;
  }

  void emit(const ir::Op& op) {
    loc_ = op.loc;
    switch (op.code) {
      case OpCode::For: return emit_for(op);
      case OpCode::While: return emit_while(op);
      case OpCode::Cond: case OpCode::Switch: return emit_branches(op);
      case OpCode::RunScoped: return emit_run_scoped(op);
      case OpCode::RefView: case OpCode::RefTranspose: case OpCode::RefReshape:
      case OpCode::Load: case OpCode::Store: case OpCode::Swap:
        return emit_ref_op(op);
      case OpCode::Sort: return emit_sort(op);
      default: break;
    }
    switch (jvp_detail::jvp_rule(op.code)) {
      case JvpRule::kZeroTangent:
        emit_primal(op);
        return;
      case JvpRule::kNotDifferentiable:
        if (any_tangent(op)) not_differentiable(op);
        emit_primal(op);
        return;
      case JvpRule::kMissing:
        throw InternalError("jvp: no rule for op " + std::string(op.info().name));
      case JvpRule::kRule: break;
    }
    std::vector<ValueId> out = emit_primal(op);
    // Pure ops are linear in their tangents: no tangent in, none out.
    if (!any_tangent(op) || out.size() != 1 || !differentiable(type(out[0]))) return;
    tangent_[static_cast<size_t>(op.results[0])] = tangent_of_pure_op(op, out[0]);
  }

  // sort permutes every operand the same way: each float operand's tangent rides along as an
  // extra (non-key) operand of the same sort, and comes out permuted like its primal.
  void emit_sort(const ir::Op& op) {
    std::vector<ValueId> ops = primal_operands(op);
    std::vector<size_t> with_tangent;
    for (size_t i = 0; i < op.operands.size(); ++i)
      if (t(op.operands[i]) != kNoTangent) {
        with_tangent.push_back(i);
        ops.push_back(t(op.operands[i]));
      }
    std::vector<ValueId> r = b_.add(op.code, std::move(ops), op.attrs, op.loc);
    for (size_t i = 0; i < op.results.size(); ++i) bind(op.results[i], r[i], kNoTangent);
    for (size_t k = 0; k < with_tangent.size(); ++k)
      tangent_[static_cast<size_t>(op.results[with_tangent[k]])] = r[op.results.size() + k];
  }

  // The tangent of a pure, single-result op whose operands carry at least one tangent.
  ValueId tangent_of_pure_op(const ir::Op& op, ValueId y) {
    const std::vector<ValueId>& s = op.operands;
    ValueId x = p(s[0]), tx = t(s[0]);
    switch (op.code) {
      // ---- unary ----------------------------------------------------------------------------
      case OpCode::Neg: return neg(tx);
      case OpCode::Abs: return mul(tx, op1(OpCode::Sign, {x}));
      case OpCode::Exp: return mul(tx, y);
      case OpCode::Exp2: return mul(tx, mul(y, full_like(y, std::numbers::ln2)));
      case OpCode::Log: return op1(OpCode::Div, {tx, x});
      case OpCode::Log1p: return op1(OpCode::Div, {tx, op1(OpCode::Add, {x, full_like(x, 1.0)})});
      case OpCode::Sqrt: return op1(OpCode::Div, {tx, scale(y, 2.0)});
      case OpCode::Rsqrt:  // d/dx x^-1/2 = -1/2 * y / x
        return mul(tx, scale(op1(OpCode::Div, {y, x}), -0.5));
      case OpCode::Reciprocal: return neg(mul(tx, mul(y, y)));
      case OpCode::Tanh: return mul(tx, op1(OpCode::Sub, {full_like(y, 1.0), mul(y, y)}));
      case OpCode::Logistic:
        return mul(tx, mul(y, op1(OpCode::Sub, {full_like(y, 1.0), y})));
      case OpCode::Sin: return mul(tx, op1(OpCode::Cos, {x}));
      case OpCode::Cos: return neg(mul(tx, op1(OpCode::Sin, {x})));
      case OpCode::Erf: {
        ValueId g = op1(OpCode::Exp, {neg(mul(x, x))});
        return mul(tx, scale(g, 2.0 / std::sqrt(std::numbers::pi)));
      }
      case OpCode::IntegerPow: {
        int64_t n = op.attrs.get_int(AttrKey::Exponent);
        if (n == 0) return kNoTangent;
        ValueId d;
        if (n == 1) return tx;
        if (n == 2) {
          d = x;
        } else {
          Attrs a;
          a.set(AttrKey::Exponent, n - 1);
          d = op1(OpCode::IntegerPow, {x}, std::move(a));
        }
        return mul(tx, scale(d, static_cast<double>(n)));
      }
      case OpCode::Convert:
        // float -> float only (a float result from an integer operand has no tangent in).
        return as_dtype(tx, type(y).dtype);
      // ---- binary ---------------------------------------------------------------------------
      case OpCode::Add: return add(tx, t(s[1]));
      case OpCode::Sub: return add(tx, neg(t(s[1])));
      case OpCode::Mul: return add(mul(tx, p(s[1])), mul(x, t(s[1])));
      case OpCode::Div: {  // (tx - ty * y) / b
        ValueId b = p(s[1]);
        ValueId num = add(tx, neg(mul(t(s[1]), y)));
        return op1(OpCode::Div, {num, b});
      }
      case OpCode::Rem: {  // rem(a, b) = a - b * trunc(a / b): d/db = -trunc(a / b)
        ValueId ty = t(s[1]);
        ValueId part = kNoTangent;
        if (ty != kNoTangent) {
          ValueId q = op1(OpCode::Div, {x, p(s[1])});
          ValueId trunc = mul(op1(OpCode::Sign, {q}), op1(OpCode::Floor, {op1(OpCode::Abs, {q})}));
          part = neg(mul(ty, trunc));
        }
        return add(tx, part);
      }
      case OpCode::Pow: {  // d/da = b * a^(b-1) (0 where b == 0); d/db = log(a) * y (a == 0: 0)
        ValueId a = x, b = p(s[1]), ty = t(s[1]);
        ValueId part_a = kNoTangent, part_b = kNoTangent;
        if (tx != kNoTangent) {
          ValueId bm1 = op1(OpCode::Sub, {b, full_like(b, 1.0)});
          ValueId d = mul(b, op1(OpCode::Pow, {a, bm1}));
          ValueId b_zero = op1(OpCode::Eq, {b, full_like(b, 0.0)});
          part_a = mul(tx, select(b_zero, full_like(d, 0.0), d));
        }
        if (ty != kNoTangent) {
          ValueId a_zero = op1(OpCode::Eq, {a, full_like(a, 0.0)});
          ValueId safe_a = select(a_zero, full_like(a, 1.0), a);
          part_b = mul(ty, mul(op1(OpCode::Log, {safe_a}), y));
        }
        return add(part_a, part_b);
      }
      case OpCode::Max: case OpCode::Min: return extremum_tangent(op.code, x, tx, p(s[1]), t(s[1]));
      case OpCode::Select: {
        return select(p(s[0]), concrete(s[1]), concrete(s[2]));
      }
      // ---- shape ops: the same op on the tangent --------------------------------------------
      case OpCode::BroadcastInDim: case OpCode::Reshape: case OpCode::Transpose:
      case OpCode::Squeeze: case OpCode::ExpandDims: case OpCode::Slice: case OpCode::Rev:
      case OpCode::ReduceSum: case OpCode::Cumsum:
        return op1(op.code, {tx}, op.attrs);
      case OpCode::DynamicSlice: {
        std::vector<ValueId> ops = primal_operands(op);
        ops[0] = tx;  // the start indices are integers (no tangent)
        return op1(op.code, std::move(ops), op.attrs);
      }
      case OpCode::Concatenate: {
        std::vector<ValueId> ops;
        for (ValueId v : s) ops.push_back(concrete(v));
        return op1(op.code, std::move(ops), op.attrs);
      }
      case OpCode::ReduceMax: case OpCode::ReduceMin: {
        // The tangent at the selected element; ties share it evenly: sum(tx * hit) / sum(hit).
        const Type& xt = type(x);
        const Ints& axes = op.attrs.get_ints(AttrKey::Axes);
        Ints kept;
        for (int d = 0; d < xt.rank(); ++d)
          if (std::find(axes.begin(), axes.end(), d) == axes.end()) kept.push_back(d);
        Attrs ba;
        ba.set(AttrKey::ShapeAttr, Ints(xt.shape));
        ba.set(AttrKey::Dims, kept);
        ValueId y_wide = op1(OpCode::BroadcastInDim, {y}, std::move(ba));
        ValueId hit = as_dtype(op1(OpCode::Eq, {x, y_wide}), xt.dtype);
        Attrs ra;
        ra.set(AttrKey::Axes, axes);
        ValueId count = op1(OpCode::ReduceSum, {hit}, ra);
        ValueId picked = op1(OpCode::ReduceSum, {mul(tx, hit)}, ra);
        return op1(OpCode::Div, {picked, count});
      }
      case OpCode::ReduceProd: return reduce_prod_tangent(x, tx, op.attrs.get_ints(AttrKey::Axes), y);
      case OpCode::Cumprod: case OpCode::Cummax: case OpCode::Cummin: {
        int64_t axis = op.attrs.get_int(AttrKey::Axis);
        bool reverse = op.attrs.get_int(AttrKey::Reverse) != 0;
        OpCode combine = op.code == OpCode::Cumprod ? OpCode::Mul
                         : op.code == OpCode::Cummax ? OpCode::Max : OpCode::Min;
        return scan_tangent(combine, {x, tx}, static_cast<int>(axis), reverse);
      }
      case OpCode::DotGeneral: {
        ValueId a = x, b = p(s[1]), tb = t(s[1]);
        ValueId l = tx == kNoTangent ? kNoTangent : op1(OpCode::DotGeneral, {tx, b}, op.attrs);
        ValueId r = tb == kNoTangent ? kNoTangent : op1(OpCode::DotGeneral, {a, tb}, op.attrs);
        return add(l, r);
      }
      default:
        throw InternalError("jvp: op " + std::string(op.info().name) +
                            " is marked as having a rule but has none");
    }
  }

  // max / min: the winning side's tangent; on a tie, the average of both (jax's balanced rule).
  ValueId extremum_tangent(OpCode code, ValueId a, ValueId ta, ValueId b, ValueId tb) {
    ValueId wins = op1(code == OpCode::Max ? OpCode::Gt : OpCode::Lt, {a, b});
    ValueId tie = op1(OpCode::Eq, {a, b});
    ValueId w = select(wins, full_like(a, 1.0), select(tie, full_like(a, 0.5), full_like(a, 0.0)));
    ValueId w_other = op1(OpCode::Sub, {full_like(a, 1.0), w});
    return add(mul(ta, w), mul(tb, w_other));
  }

  // ---- Products and running extrema ------------------------------------------------------------
  // jax differentiates reduce_prod through a halving tree of products and cumprod / cummax /
  // cummin through its associative scan, op by op. The same trees are replayed here on (primal,
  // tangent) pairs, so the tangents are exact without dividing by x (zeros are fine) and ties of
  // cummax / cummin are shared with jax's weights (which follow the scan's tree, not an even
  // split: the tangent of cummax([1, 1, 1]) is (t0, (t0 + t1) / 2, (t0 + t1) / 4 + t2 / 2)).
  struct Dual {
    ValueId x, t;  // both concrete
  };
  Dual combine(OpCode code, Dual a, Dual b) {
    if (code == OpCode::Mul)
      return {op1(OpCode::Mul, {a.x, b.x}), add(mul(a.t, b.x), mul(a.x, b.t))};
    return {op1(code, {a.x, b.x}), extremum_tangent(code, a.x, a.t, b.x, b.t)};
  }
  ValueId slice_axis(ValueId v, int axis, int64_t start, int64_t limit, int64_t stride = 1) {
    const Shape& shape = type(v).shape;
    Ints lo(shape.size(), 0), hi(shape.begin(), shape.end()), st(shape.size(), 1);
    lo[static_cast<size_t>(axis)] = start;
    hi[static_cast<size_t>(axis)] = limit;
    st[static_cast<size_t>(axis)] = stride;
    Attrs a;
    a.set(AttrKey::Start, std::move(lo));
    a.set(AttrKey::Limit, std::move(hi));
    a.set(AttrKey::Strides, std::move(st));
    return op1(OpCode::Slice, {v}, std::move(a));
  }
  Dual slice_axis(Dual d, int axis, int64_t start, int64_t limit, int64_t stride = 1) {
    return {slice_axis(d.x, axis, start, limit, stride), slice_axis(d.t, axis, start, limit, stride)};
  }
  ValueId concat(std::vector<ValueId> vs, int axis) {
    Attrs a;
    a.set(AttrKey::Axis, int64_t{axis});
    return op1(OpCode::Concatenate, std::move(vs), std::move(a));
  }
  Dual concat(Dual a, Dual b, int axis) { return {concat({a.x, b.x}, axis), concat({a.t, b.t}, axis)}; }
  ValueId reshape(ValueId v, const Shape& shape) {
    if (type(v).shape == shape) return v;
    Attrs a;
    a.set(AttrKey::ShapeAttr, Ints(shape));
    return op1(OpCode::Reshape, {v}, std::move(a));
  }
  ValueId rev(ValueId v, int axis) {
    Attrs a;
    a.set(AttrKey::Dims, Ints{axis});
    return op1(OpCode::Rev, {v}, std::move(a));
  }
  int64_t dim(ValueId v, int axis) const { return type(v).shape[static_cast<size_t>(axis)]; }

  // r[2k] = even[k], r[2k + 1] = odd[k] along `axis` (even has as many elements as odd, or one
  // more).
  ValueId interleave(ValueId even, ValueId odd, int axis) {
    const int64_t n = dim(even, axis) + dim(odd, axis);
    if (dim(even, axis) != dim(odd, axis))  // pad odd with any element, cut it off after
      odd = concat({odd, slice_axis(even, axis, 0, 1)}, axis);
    Attrs e;
    e.set(AttrKey::Dims, Ints{axis + 1});
    ValueId pairs = concat({op1(OpCode::ExpandDims, {even}, e), op1(OpCode::ExpandDims, {odd}, e)}, axis + 1);
    Shape shape = type(even).shape;
    shape[static_cast<size_t>(axis)] *= 2;
    ValueId r = reshape(pairs, shape);
    return shape[static_cast<size_t>(axis)] == n ? r : slice_axis(r, axis, 0, n);
  }

  // The inclusive scan of `e` along `axis` with `code` (mul, max or min), as jax's
  // associative_scan: combine neighbours, scan the half, then fill in the even positions.
  Dual associative_scan(OpCode code, Dual e, int axis) {
    const int64_t n = dim(e.x, axis);
    if (n < 2) return e;
    Dual odd = associative_scan(
        code, combine(code, slice_axis(e, axis, 0, n - 1, 2), slice_axis(e, axis, 1, n, 2)), axis);
    Dual even = slice_axis(e, axis, 0, 1);
    if (n > 2) {
      Dual prev = n % 2 == 0 ? slice_axis(odd, axis, 0, n / 2 - 1) : odd;
      even = concat(even, combine(code, prev, slice_axis(e, axis, 2, n, 2)), axis);
    }
    return {interleave(even.x, odd.x, axis), interleave(even.t, odd.t, axis)};
  }

  // The tangent of cumprod / cummax / cummin (combine: mul / max / min) of `e`.
  ValueId scan_tangent(OpCode code, Dual e, int axis, bool reverse) {
    if (type(e.x).size() == 0) return e.t;
    if (reverse) e = {rev(e.x, axis), rev(e.t, axis)};
    ValueId t = associative_scan(code, e, axis).t;
    return reverse ? rev(t, axis) : t;
  }

  // The tangent of reduce_prod(x, axes) = y: the reduced axes moved to the front and flattened,
  // then halved until one row is left (an odd half padded with a row of ones), as jax.
  ValueId reduce_prod_tangent(ValueId x, ValueId tx, const Ints& axes, ValueId y) {
    if (axes.empty()) return tx;
    const Shape& xs = type(x).shape;
    Ints perm(axes.begin(), axes.end());
    Shape flat = {1};
    for (int64_t a : axes) flat[0] *= xs[static_cast<size_t>(a)];
    for (int d = 0; d < static_cast<int>(xs.size()); ++d)
      if (std::find(axes.begin(), axes.end(), d) == axes.end()) {
        perm.push_back(d);
        flat.push_back(xs[static_cast<size_t>(d)]);
      }
    if (num_elements(flat) == 0) return full_like(y, 0.0);  // an empty product is the constant 1
    auto to_rows = [&](ValueId v) {
      if (std::is_sorted(perm.begin(), perm.end())) return reshape(v, flat);
      Attrs a;
      a.set(AttrKey::Permutation, perm);
      return reshape(op1(OpCode::Transpose, {v}, std::move(a)), flat);
    };
    Dual e = {to_rows(x), to_rows(tx)};
    for (int64_t n = flat[0]; n > 1; n = (n + 1) / 2) {
      const int64_t n1 = (n + 1) / 2;
      Dual hi = slice_axis(e, 0, n1, n);
      if (n - n1 != n1) {
        Shape row = type(hi.x).shape;
        row[0] = 1;
        const DType dt = type(x).dtype;
        hi = concat(hi, Dual{full(Type::tensor(row, dt), 1.0), full(Type::tensor(row, dt), 0.0)}, 0);
      }
      e = combine(OpCode::Mul, slice_axis(e, 0, 0, n1), hi);
    }
    return reshape(e.t, type(y).shape);
  }

  // ---- Refs: the same access on the tangent Ref, at the same index ------------------------------
  void emit_ref_op(const ir::Op& op) {
    emit_primal(op);
    // A Ref without a tangent holds integer or bool data (values stored there have its dtype).
    ValueId tref = t(op.operands[0]);
    if (tref == kNoTangent) return;
    std::vector<ValueId> ops = primal_operands(op);
    ops[0] = tref;
    bool masked = op.attrs.get_int_or(AttrKey::Masked, 0) != 0;
    size_t n = op.operands.size();
    switch (op.code) {
      case OpCode::RefView: case OpCode::RefTranspose: case OpCode::RefReshape: case OpCode::Load: {
        if (op.code == OpCode::Load && masked) ops[n - 1] = concrete(op.operands[n - 1]);
        tangent_[static_cast<size_t>(op.results[0])] = op1(op.code, std::move(ops), op.attrs);
        return;
      }
      case OpCode::Store: case OpCode::Swap: {
        size_t vi = n - 1 - (masked ? 1 : 0);
        ops[vi] = concrete(op.operands[vi]);
        std::vector<ValueId> r = b_.add(op.code, std::move(ops), op.attrs, loc_);
        if (op.code == OpCode::Swap) tangent_[static_cast<size_t>(op.results[0])] = r.at(0);
        return;
      }
      default: throw InternalError("jvp: not a ref op");
    }
  }

  // ---- Control flow: tangents travel beside the primal values ----------------------------------
  // For each source value (carries, results, scoped Refs): a float one gets a tangent slot.
  std::vector<Type> with_tangent_types(const std::vector<ValueId>& src_vals) const {
    std::vector<Type> types;
    for (ValueId v : src_vals) types.push_back(src_.type(v));
    for (ValueId v : src_vals)
      if (differentiable(src_.type(v))) types.push_back(src_.type(v));
    return types;
  }
  // Binds region arguments laid out as with_tangent_types(src_args).
  void bind_laid_out(const std::vector<ValueId>& src_vals, const std::vector<ValueId>& new_vals) {
    size_t k = src_vals.size();
    for (size_t i = 0; i < src_vals.size(); ++i) {
      ValueId tv = kNoTangent;
      if (differentiable(src_.type(src_vals[i]))) tv = new_vals.at(k++);
      bind(src_vals[i], new_vals.at(i), tv);
    }
    PALLAS_INTERNAL_CHECK(k == new_vals.size(), "jvp: region layout mismatch");
  }
  // Primal values then concrete tangents of the float ones.
  std::vector<ValueId> with_tangents(const std::vector<ValueId>& src_vals) {
    std::vector<ValueId> out;
    for (ValueId v : src_vals) out.push_back(p(v));
    for (ValueId v : src_vals)
      if (differentiable(src_.type(v))) out.push_back(concrete(v));
    return out;
  }
  void check_no_refs(const ir::Op& op, const std::vector<ValueId>& vals) const {
    for (ValueId v : vals)
      if (src_.type(v).is_ref)
        throw NotSupportedError("jvp of pallas_call " + call_info_ + ": a Ref carried by `" +
                                    std::string(op.info().name) + "`",
                                op.loc);
  }
  // Emits region `r` with arguments laid out as with_tangent_types(r.args); yields the primal
  // yields and their tangents (when the source region yields), or just the primal yields when
  // `primal_only_yield`.
  ir::Region emit_region(const ir::Region& r, std::vector<Type> arg_types, size_t num_plain_args,
                         bool primal_only_yield = false) {
    std::vector<ValueId> args = b_.begin_region(arg_types);
    try {
      // Leading plain arguments (a loop index) carry no tangent.
      for (size_t i = 0; i < num_plain_args; ++i) bind(r.args[i], args[i], kNoTangent);
      std::vector<ValueId> src_rest(r.args.begin() + static_cast<long>(num_plain_args), r.args.end());
      std::vector<ValueId> new_rest(args.begin() + static_cast<long>(num_plain_args), args.end());
      bind_laid_out(src_rest, new_rest);
      const ir::Op* y = emit_region_ops(r);
      if (y) {
        loc_ = y->loc;
        std::vector<ValueId> ys = primal_only_yield ? primal_operands(*y) : with_tangents(y->operands);
        b_.add(OpCode::Yield, std::move(ys), {}, y->loc);
      }
    } catch (...) {
      b_.abandon_region();
      throw;
    }
    return b_.end_region();
  }
  // Binds the results of a new control op laid out as with_tangent_types(op.results).
  void bind_results(const ir::Op& op, const std::vector<ValueId>& r) { bind_laid_out(op.results, r); }

  void emit_for(const ir::Op& op) {
    std::vector<ValueId> carries(op.operands.begin() + 2, op.operands.end());
    check_no_refs(op, carries);
    const ir::Region& body = op.regions.at(0);
    std::vector<ValueId> operands = {p(op.operands[0]), p(op.operands[1])};
    for (ValueId v : with_tangents(carries)) operands.push_back(v);
    std::vector<Type> arg_types = {src_.type(body.args.at(0))};
    std::vector<ValueId> src_carry_args(body.args.begin() + 1, body.args.end());
    for (const Type& ty : with_tangent_types(src_carry_args)) arg_types.push_back(ty);
    std::vector<ir::Region> regions;
    regions.push_back(emit_region(body, arg_types, 1));
    loc_ = op.loc;
    bind_results(op, b_.add(op.code, std::move(operands), op.attrs, op.loc, std::move(regions)));
  }

  void emit_while(const ir::Op& op) {
    check_no_refs(op, op.operands);
    std::vector<ValueId> operands = with_tangents(op.operands);
    std::vector<ir::Region> regions;
    const ir::Region& cond = op.regions.at(0);
    const ir::Region& body = op.regions.at(1);
    regions.push_back(emit_region(cond, with_tangent_types(cond.args), 0, /*primal_only_yield=*/true));
    regions.push_back(emit_region(body, with_tangent_types(body.args), 0));
    loc_ = op.loc;
    bind_results(op, b_.add(op.code, std::move(operands), op.attrs, op.loc, std::move(regions)));
  }

  void emit_branches(const ir::Op& op) {
    check_no_refs(op, op.results);
    std::vector<ir::Region> regions;
    for (const ir::Region& r : op.regions) regions.push_back(emit_region(r, {}, 0));
    loc_ = op.loc;
    bind_results(op, b_.add(op.code, primal_operands(op), op.attrs, op.loc, std::move(regions)));
  }

  void emit_run_scoped(const ir::Op& op) {
    check_no_refs(op, op.results);
    const ir::Region& body = op.regions.at(0);
    std::vector<ir::Region> regions;
    regions.push_back(emit_region(body, with_tangent_types(body.args), 0));
    loc_ = op.loc;
    bind_results(op, b_.add(op.code, {}, op.attrs, op.loc, std::move(regions)));
  }
};

std::string call_info(const PallasCallImpl& c) { return c.func_src_info(); }

}  // namespace

PallasCall jvp_call(const PallasCall& call, const std::vector<ShapeDtype>& primals) {
  const PallasCallImpl& impl = *call.impl();
  const std::string info = call_info(impl);
  // The seed's restrictions, in its order.
  for (const GridDim& d : impl.grid_spec.grid.dims)
    if (d.is_dynamic())
      throw NotSupportedError("jvp of pallas_call " + info + " with dynamic grid bounds",
                              impl.loc);
  if (impl.grid_spec.num_scalar_prefetch > 0)
    throw NotSupportedError("jvp of pallas_call " + info + " with scalar-prefetch operands (" +
                                std::to_string(impl.grid_spec.num_scalar_prefetch) + ")",
                            impl.loc);
  if (!impl.opts.input_output_aliases.empty())
    throw NotSupportedError("JVP with aliasing (input_output_aliases) in pallas_call " + info,
                            impl.loc);
  if (impl.opts.mesh_shape)
    throw NotSupportedError("pallas_call with a mesh (core_map) does not support JVP: " + info,
                            impl.loc);

  std::shared_ptr<const TracedCall> tc = call.trace(primals);
  const GridMapping& gm = tc->grid_mapping;
  const GridSpec& gs = impl.grid_spec;
  const int nin = gm.num_inputs, nout = gm.num_outputs;

  // Which operands get tangents: the float ones.
  std::vector<int> float_ins, float_outs, float_scratch;
  for (int i = 0; i < nin; ++i)
    if (is_float(primals[static_cast<size_t>(i)].dtype)) float_ins.push_back(i);
  for (int o = 0; o < nout; ++o)
    if (is_float(impl.out_shapes[static_cast<size_t>(o)].dtype)) float_outs.push_back(o);
  for (size_t s = 0; s < gm.scratch_types.size(); ++s)
    if (is_float(gm.scratch_types[s].dtype)) float_scratch.push_back(static_cast<int>(s));

  CallOptions o = impl.opts;
  o.grid_spec.reset();
  o.grid = gs.grid;
  if (gs.in_specs.given()) {
    std::vector<BlockSpec> specs = gs.in_specs.specs();
    for (int i : float_ins) specs.push_back(gs.in_specs.specs().at(static_cast<size_t>(i)));
    o.in_specs = BlockSpecs(std::move(specs));
  } else {
    o.in_specs = BlockSpecs();
  }
  if (gs.out_specs.given()) {
    std::vector<BlockSpec> specs = gs.out_specs.specs();
    for (int i : float_outs) specs.push_back(gs.out_specs.specs().at(static_cast<size_t>(i)));
    o.out_specs = BlockSpecs(std::move(specs));
  } else {
    o.out_specs = BlockSpecs();
  }
  o.scratch_shapes = gs.scratch_shapes;
  for (int s : float_scratch) o.scratch_shapes.push_back(gs.scratch_shapes.at(static_cast<size_t>(s)));
  o.input_output_aliases.clear();
  if (o.cost_estimate) {  // as the seed: the derivative costs about twice the primal
    CostEstimate& c = *o.cost_estimate;
    c.flops *= 2;
    c.transcendentals *= 2;
    c.bytes_accessed *= 2;
  }
  std::vector<ShapeDtype> out_shapes = impl.out_shapes;
  for (int i : float_outs) out_shapes.push_back(impl.out_shapes.at(static_cast<size_t>(i)));

  const size_t nscratch = gm.scratch_types.size();
  KernelFn kernel = [tc, info, nin, nout, nscratch, float_ins, float_outs,
                     float_scratch](std::vector<Ref>& refs) {
    const ir::Kernel& src = tc->kernel;
    ir::Builder& b = trace::builder(std::source_location::current());
    size_t expected = static_cast<size_t>(nin + nout) + nscratch + float_ins.size() +
                      float_outs.size() + float_scratch.size();
    if (refs.size() != expected)
      throw InternalError("jvp kernel of " + info + ": got " + std::to_string(refs.size()) +
                          " Refs, expected " + std::to_string(expected));
    JvpEmitter e(src, b, info);
    // New layout: ins, tangent ins, outs, tangent outs, scratch, tangent scratch.
    size_t k = 0;
    auto bind_group = [&](size_t src_first, int count, const std::vector<int>& with_tangent) {
      size_t primal_first = k;
      k += static_cast<size_t>(count);
      std::vector<ValueId> tangents(static_cast<size_t>(count), kNoTangent);
      for (int i : with_tangent) tangents[static_cast<size_t>(i)] = refs.at(k++).handle().id();
      for (int i = 0; i < count; ++i) {
        ValueId s = src.body.args.at(src_first + static_cast<size_t>(i));
        const Ref& r = refs.at(primal_first + static_cast<size_t>(i));
        if (!(r.type() == src.type(s)))
          throw Error("the jvp of pallas_call " + info + " was built for other shapes: Ref " +
                      std::to_string(primal_first + static_cast<size_t>(i)) + " is " +
                      r.type().to_string() + ", expected " + src.type(s).to_string() +
                      "; call pl::jvp again for these shapes");
        e.bind(s, r.handle().id(), tangents[static_cast<size_t>(i)]);
      }
    };
    bind_group(0, nin, float_ins);
    bind_group(static_cast<size_t>(nin), nout, float_outs);
    bind_group(static_cast<size_t>(nin + nout), static_cast<int>(nscratch), float_scratch);
    e.emit_region_ops(src.body);
  };
  return detail::make_pallas_call(std::move(kernel), std::move(out_shapes), std::move(o), impl.loc);
}

JvpOutputs jvp(const PallasCall& call, const std::vector<Array>& primals,
               const std::vector<Array>& tangents) {
  const PallasCallImpl& impl = *call.impl();
  const std::string info = impl.func_src_info();
  if (primals.size() != tangents.size())
    throw Error("jvp of pallas_call " + info + ": got " + std::to_string(primals.size()) +
                    " primals but " + std::to_string(tangents.size()) +
                    " tangents; pass one tangent per primal input (an empty pl::Array() for an "
                    "integer or bool input)",
                impl.loc);
  std::vector<ShapeDtype> shapes;
  std::vector<Array> args = primals;
  for (size_t i = 0; i < primals.size(); ++i) {
    const Array& x = primals[i];
    const Array& tx = tangents[i];
    shapes.push_back(x.shape_dtype());
    std::string which = "tangent " + std::to_string(i) + " (" + tx.shape_dtype().to_string() +
                        ") of primal input " + std::to_string(i) + " (" +
                        x.shape_dtype().to_string() + ")";
    if (!is_float(x.dtype())) {
      if (!(tx.shape() == Shape{0} && tx.dtype() == DType::F32))
        throw Error("jvp of pallas_call " + info + ": " + which + ": an input of dtype " +
                        std::string(dtype_name(x.dtype())) +
                        " has no tangent; pass an empty pl::Array() in its place",
                    impl.loc);
      continue;
    }
    if (!is_float(tx.dtype()))
      throw Error("jvp of pallas_call " + info + ": " + which + ": tangents must be floating " +
                      "point, of the primal's dtype " + std::string(dtype_name(x.dtype())) +
                      "; integer and bool tangents are not allowed",
                  impl.loc);
    if (tx.dtype() != x.dtype() || tx.shape() != x.shape())
      throw Error("jvp of pallas_call " + info + ": " + which +
                      ": a tangent must have its primal's shape and dtype",
                  impl.loc);
  }
  PallasCall d = jvp_call(call, shapes);
  for (size_t i = 0; i < primals.size(); ++i)
    if (is_float(primals[i].dtype())) args.push_back(tangents[i]);
  std::vector<Array> flat = d(args);
  JvpOutputs out;
  size_t nout = impl.out_shapes.size();
  out.primal_outputs.assign(flat.begin(), flat.begin() + static_cast<long>(nout));
  size_t k = nout;
  for (size_t o = 0; o < nout; ++o)
    out.tangent_outputs.push_back(is_float(impl.out_shapes[o].dtype) ? flat.at(k++) : Array());
  return out;
}

}  // namespace pallas
