// The CUDA rules of the pure ops: each writes its result's elements from a loop of the CTA's
// threads (thread t: elements t, t + T, ...), or a register when every operand is a scalar. The
// arithmetic is the device runtime's, which mirrors src/eval/scalar_ops.h.
#include <algorithm>
#include <functional>
#include <limits>

#include "gpu/emitter.h"
#include "pallas/error.h"

namespace pallas::gpu::detail {

using ir::AttrKey;
using ir::OpCode;
using ir::ValueId;

namespace {

// The compute-typed expression of an elementwise op on compute-typed operands.
std::string unary_expr(const ir::Op& op, DType t, const std::string& a) {
  const std::string T = ctype(t), C = ccompute(t);
  const bool f = is_float(t), b = t == DType::Bool;
  switch (op.code) {
    case OpCode::Neg: return f ? "(-" + a + ")" : "pl_ineg<" + T + ">(" + a + ")";
    case OpCode::Abs: return f ? "pl_fabs(" + a + ")" : "pl_iabs<" + T + ">(" + a + ")";
    case OpCode::Sign: return f ? "pl_fsign(" + a + ")" : "pl_isign<" + T + ">(" + a + ")";
    case OpCode::Floor: return "pl_floor(" + a + ")";
    case OpCode::Ceil: return "pl_ceil(" + a + ")";
    case OpCode::Round:
      return (op.attrs.get_int_or(AttrKey::Rounding, 0) == 0 ? "pl_round_away(" : "pl_round_even(") + a + ")";
    case OpCode::Exp: return "pl_exp(" + a + ")";
    case OpCode::Exp2: return "pl_exp2(" + a + ")";
    case OpCode::Log: return "pl_log(" + a + ")";
    case OpCode::Log1p: return "pl_log1p(" + a + ")";
    case OpCode::Sqrt: return "pl_sqrt(" + a + ")";
    case OpCode::Rsqrt: return "pl_rsqrt(" + a + ")";
    case OpCode::Reciprocal: return "(" + C + "(1) / " + a + ")";
    case OpCode::Tanh: return "pl_tanh(" + a + ")";
    case OpCode::Logistic: return "pl_logistic(" + a + ")";
    case OpCode::Sin: return "pl_sin(" + a + ")";
    case OpCode::Cos: return "pl_cos(" + a + ")";
    case OpCode::Erf: return "pl_erf(" + a + ")";
    case OpCode::IsFinite: return "pl_isfinite(" + a + ")";
    case OpCode::Not: return b ? "(!" + a + ")" : "(" + T + ")(~" + a + ")";
    case OpCode::IntegerPow: {
      std::string n = std::to_string(op.attrs.get_int(AttrKey::Exponent)) + "LL";
      return f ? "pl_fpow_int(" + a + ", " + n + ")" : "pl_ipow<" + T + ">(" + a + ", " + n + ")";
    }
    case OpCode::MultipleOf: return a;
    default: break;
  }
  throw InternalError("gpu emitter: unary " + std::string(op.info().name));
}

std::string binary_expr(OpCode code, DType t, const std::string& a, const std::string& b) {
  const std::string T = ctype(t);
  const bool f = is_float(t), bo = t == DType::Bool;
  auto infix = [&](const char* o) { return "(" + a + " " + o + " " + b + ")"; };
  auto call = [&](const std::string& fn) { return fn + "(" + a + ", " + b + ")"; };
  switch (code) {
    case OpCode::Add: return f ? infix("+") : call("pl_iadd<" + T + ">");
    case OpCode::Sub: return f ? infix("-") : call("pl_isub<" + T + ">");
    case OpCode::Mul: return f ? infix("*") : call("pl_imul<" + T + ">");
    case OpCode::Div: return f ? infix("/") : call("pl_idiv<" + T + ">");
    case OpCode::Rem: return f ? call("pl_fmod") : call("pl_irem<" + T + ">");
    case OpCode::Pow: return call("pl_pow");
    case OpCode::Max: return bo ? infix("||") : f ? call("pl_fmax") : call("pl_imax<" + T + ">");
    case OpCode::Min: return bo ? infix("&&") : f ? call("pl_fmin") : call("pl_imin<" + T + ">");
    case OpCode::And: return bo ? infix("&&") : "(" + T + ")" + infix("&");
    case OpCode::Or: return bo ? infix("||") : "(" + T + ")" + infix("|");
    case OpCode::Xor: return bo ? infix("!=") : "(" + T + ")" + infix("^");
    case OpCode::ShiftLeft: return call("pl_shl<" + T + ">");
    case OpCode::ShiftRightLogical: return call("pl_shr_logical<" + T + ">");
    case OpCode::ShiftRightArithmetic: return call("pl_shr_arith<" + T + ">");
    case OpCode::Eq: return infix("==");
    case OpCode::Ne: return infix("!=");
    case OpCode::Lt: return infix("<");
    case OpCode::Le: return infix("<=");
    case OpCode::Gt: return infix(">");
    case OpCode::Ge: return infix(">=");
    default: break;
  }
  throw InternalError("gpu emitter: binary op");
}

// `x` (storage type `from`) converted with the `convert` op's rules; storage type `to`.
std::string convert_expr(DType from, DType to, const std::string& x) {
  if (from == to) return x;
  const std::string wx = widen(from, x);
  if (to == DType::Bool) return "(" + wx + " != 0)";
  if (from == DType::Bool) return narrow(to, "(" + ccompute(to) + ")(" + x + " ? 1 : 0)");
  if (is_half(to)) {
    // One rounding: from f32 exactly; from f64 and integers through round-to-odd in f32, which
    // keeps the sticky bit so the final rounding to 16 bits is the correct single rounding.
    if (from == DType::F32 || is_half(from)) return narrow(to, wx);
    return narrow(to, "pl_f32_round_odd((double)(" + wx + "))");
  }
  if (is_integer(to) && is_float(from)) return "pl_f2i<" + ctype(to) + ">(" + wx + ")";
  return "(" + ctype(to) + ")(" + wx + ")";
}

// Combining rule, identity and accumulator type of a reduction kind on element type t.
struct ReduceRule {
  std::string acc_type;
  std::string identity;
  std::function<std::string(const std::string&, const std::string&)> combine;
};

ReduceRule reduce_rule(OpCode code, DType t, int64_t count) {
  ReduceRule r;
  r.acc_type = ccompute(t);
  const bool f = is_float(t), bo = t == DType::Bool;
  const std::string T = ctype(t), A = r.acc_type;
  auto op = [&](OpCode c) {
    return [c, t](const std::string& a, const std::string& b) { return binary_expr(c, t, a, b); };
  };
  const DType acc_dtype = is_half(t) ? DType::F32 : t;
  const double inf = std::numeric_limits<double>::infinity();
  std::string hi = f ? literal(Scalar::of_float(inf, acc_dtype), acc_dtype) : bo ? "true" : "pl_int<" + T + ">::hi()";
  std::string lo = f ? literal(Scalar::of_float(-inf, acc_dtype), acc_dtype) : bo ? "false" : "pl_int<" + T + ">::lo()";
  switch (code) {
    case OpCode::ReduceSum: case OpCode::Cumsum:
      r.combine = bo ? op(OpCode::Or) : op(OpCode::Add);
      // -0 is the exact additive identity; an empty sum is +0.
      r.identity = f ? (count > 0 ? "(" + A + ")(-0.0)" : "(" + A + ")(0.0)") : bo ? "false" : "(" + A + ")0";
      break;
    case OpCode::ReduceProd: case OpCode::Cumprod:
      r.combine = bo ? op(OpCode::And) : op(OpCode::Mul);
      r.identity = bo ? "true" : "(" + A + ")1";
      break;
    case OpCode::ReduceMax: case OpCode::Cummax:
      r.combine = op(OpCode::Max);
      r.identity = lo;
      break;
    case OpCode::ReduceMin: case OpCode::Cummin:
      r.combine = op(OpCode::Min);
      r.identity = hi;
      break;
    case OpCode::ReduceAnd:
      r.combine = op(OpCode::And);
      r.identity = bo ? "true" : "(" + T + ")~(" + T + ")0";
      break;
    case OpCode::ReduceOr:
      r.combine = op(OpCode::Or);
      r.identity = bo ? "false" : "(" + T + ")0";
      break;
    default: throw InternalError("gpu emitter: reduce rule");
  }
  return r;  // half types: the combining ops take float (compute-typed) operands
}

}  // namespace

bool Emitter::is_elementwise(const ir::Op& op) const {
  if (op.code == OpCode::Reshape || op.code == OpCode::Squeeze || op.code == OpCode::ExpandDims)
    // (Not a tile to a scalar: a scalar result is a register every thread holds.)
    return !type(op.results[0]).shape.empty() || type(op.operands[0]).shape.empty();
  return (op.info().categories & ir::kElementwise) || op.code == OpCode::Constant ||
         (op.code == OpCode::Bitcast && itemsize(type(op.operands[0]).dtype) == itemsize(type(op.results[0]).dtype));
}

std::string Emitter::broadcast_element(const ir::Op& op, const std::string& flat) const {
  const ValueId x = op.operands[0];
  const ir::Type& xt = type(x);
  const bool plain = flat.find_first_of(" +-*/%") == std::string::npos;
  const std::vector<std::string> oi = index_exprs(type(op.results[0]).shape, plain ? flat : "(" + flat + ")");
  const ir::Ints& dims = op.attrs.get_ints(AttrKey::Dims);
  std::vector<std::string> si;
  for (size_t i = 0; i < xt.shape.size(); ++i) si.push_back(xt.shape[i] == 1 ? "0" : oi[static_cast<size_t>(dims[i])]);
  return at(x, sum_of(si, contiguous_strides(xt.shape)));
}

bool Emitter::reads_across(ValueId v) const {
  const auto it = fused_producers_.find(v);
  if (it == fused_producers_.end()) return false;
  const ir::Op& op = *it->second;
  if (op.code == OpCode::BroadcastInDim) return true;
  if (op.code == OpCode::Load) return false;
  for (ValueId o : op.operands)
    if (reads_across(o)) return true;
  return false;
}

std::string Emitter::elementwise_expr(const ir::Op& op, const std::string& e) const {
  const uint32_t cat = op.info().categories;
  const DType rdt = type(op.results[0]).dtype;
  auto arg = [&](size_t i) { return at(op.operands[i], e); };
  switch (op.code) {
    case OpCode::Constant: return literal(op.attrs.get_scalar(AttrKey::Value), rdt);
    case OpCode::Select: return "(" + arg(0) + " ? " + arg(1) + " : " + arg(2) + ")";
    case OpCode::Convert: return convert_expr(type(op.operands[0]).dtype, rdt, arg(0));
    case OpCode::Bitcast: return "pl_bitcast<" + ctype(rdt) + ">(" + arg(0) + ")";
    case OpCode::Reshape: case OpCode::Squeeze: case OpCode::ExpandDims: return arg(0);
    default: break;
  }
  const DType t = type(op.operands[0]).dtype;
  if (cat & ir::kUnaryFlag) {
    std::string c = unary_expr(op, t, widen(t, arg(0)));
    return op.code == OpCode::IsFinite ? c : narrow(t, c);
  }
  std::string c = binary_expr(op.code, t, widen(t, arg(0)), widen(t, arg(1)));
  return cat & ir::kCompareFlag ? c : narrow(t, c);
}

// Where pl_reduce_team may form teams (some group could have more threads than results: a group
// has at most 1024) and where they may be wider than a warp: its S (S x results <= threads <=
// 1024, S <= count) is 64 or more only for at most 16 results of at least 64 elements.
namespace {
struct TeamBounds {
  bool team, wide;
};
TeamBounds team_bounds(int64_t results, int64_t count) {
  const bool team = results < 1024 && count >= 2;
  return {team, team && results <= 16 && count >= 64};
}
}  // namespace

void Emitter::open_team_loop(int64_t results, int64_t count, bool team) {
  const std::string N = std::to_string(results);
  line("{");
  ++indent_;
  line(std::string("const int S = ") + (team ? "pl_reduce_team(" + N + ", " + std::to_string(count) + ")" : "1") + ";");
  line("#pragma unroll 1");
  line("for (pl_i64 e = pl_tid() / S; e < " + N + (team ? " || (S > 1 && e < pl_nthreads() / S)" : "") +
       "; e += pl_nthreads() / S) {");
  ++indent_;
}

void Emitter::with_team_scratch(bool wide, const std::string& A, int64_t acc_bytes,
                                const std::function<void(const std::string& scratch)>& use) {
  if (!wide) return use("(" + A + "*)0");
  const int64_t bytes = 32 * acc_bytes, offset = ctx_.arena->alloc(bytes);
  use("(" + A + "*)(" + ctx_.arena_base + " + " + std::to_string(offset) + ")");
  // (Free at once: the team's runtime functions sync after their last read of it — a loop of
  // register tiles reducing them is still a loop that writes nothing, close_loop_body.)
  ctx_.arena->release_synced(offset, bytes);
}

bool Emitter::emit_team_reduction(ValueId x, const std::vector<size_t>& reduced, const std::string& out,
                                  const TeamReduction& r) {
  const ir::Type& xt = type(x);
  const std::vector<int64_t> xs = contiguous_strides(xt.shape);
  Shape kept_shape, reduced_shape;
  std::vector<int64_t> kept_strides, reduced_strides;
  for (size_t d = 0; d < xt.shape.size(); ++d) {
    const bool red = std::find(reduced.begin(), reduced.end(), d) != reduced.end();
    (red ? reduced_shape : kept_shape).push_back(xt.shape[d]);
    (red ? reduced_strides : kept_strides).push_back(xs[d]);
  }
  const int64_t results = std::max<int64_t>(1, num_elements(kept_shape)), count = num_elements(reduced_shape);
  const auto [team, wide] = team_bounds(results, count);
  const std::string N = std::to_string(results), C = std::to_string(count), A = r.acc_type;
  open_team_loop(results, count, team);
  line("auto pl_comb = [](" + A + " a, " + A + " b) { return " + r.combine + "; };");
  line(A + " acc = " + r.identity + ";");
  line("if (e < " + N + ") {");
  ++indent_;
  line("pl_i64 base = " + sum_of(index_exprs(kept_shape, "e"), kept_strides) + ";");
  line("for (pl_i64 j = pl_tid() % S; j < " + C + "; j += S) acc = pl_comb(acc, " +
       r.element(at(x, "base + " + sum_of(index_exprs(reduced_shape, "j"), reduced_strides)), "j") + ");");
  --indent_;
  line("}");
  std::string store_if = "e < " + N;
  if (team) {
    with_team_scratch(wide, A, r.acc_bytes, [&](const std::string& scratch) {
      line("acc = pl_team_combine<" + std::string(wide ? "true" : "false") + ">(acc, S, pl_comb, " + scratch + ");");
    });
    store_if += " && pl_tid() % S == 0";
  }
  line("if (" + store_if + ") " + out + "[e] = " + r.result("acc") + ";");
  --indent_;
  line("}");
  --indent_;
  line("}");
  return team;
}

void Emitter::emit_pure(const ir::Op& op) {
  const ValueId res = op.results.empty() ? -1 : op.results[0];
  const ir::Type rt = res >= 0 ? type(res) : ir::Type{};
  const bool scalar_result = res >= 0 && rt.shape.empty();
  auto all_scalar = [&] {
    for (ValueId v : op.operands)
      if (info(v).kind != ValueInfo::Kind::Scalar) return false;
    return true;
  };

  // ---- Elementwise: one expression per element.
  if (is_elementwise(op)) {
    if (scalar_result && all_scalar()) {
      define_scalar(res, elementwise_expr(op, ""));
      return;
    }
    bool across = false;
    if (const std::optional<FragmentLayout> l = fragment_loop_of(op, across))
      return emit_fragment_elementwise(op, *l, across);
    for (ValueId o : op.operands)
      if (reads_across(o)) before_cross_read();
    std::string out = define_tile(res);
    open_thread_loop(std::max<int64_t>(1, rt.size()));
    line(out + "[e] = " + elementwise_expr(op, "e") + ";");
    close_loop();
    after_tile_write();
    return;
  }

  // Everything below reads its operands' elements in another order than it writes its own (but a
  // reduction of a register tile's rows reads the thread's own registers).
  if (op.operands.empty() || info(op.operands[0]).kind != ValueInfo::Kind::Fragment) before_cross_read();
  // The result's storage: a tile, or a one-element slot broadcast to a register at the end.
  std::string out, slot;
  auto begin_result = [&](ValueId v) {
    if (type(v).shape.empty()) {
      slot = scalar_slot_begin(v);
      return slot;
    }
    return define_tile(v);
  };
  auto end_result = [&](ValueId v) {
    after_tile_write();
    if (type(v).shape.empty()) scalar_slot_end(v, slot);
  };
  auto src = [&](ValueId v, const std::string& offset) { return at(v, offset); };
  // A reduction (or scan) of elements of type t by `rule`, as team loops and register tiles take it.
  auto rule_reduction = [](const ReduceRule& rule, DType t) {
    TeamReduction r;
    r.acc_type = rule.acc_type;
    r.acc_bytes = is_half(t) ? 4 : itemsize(t);
    r.identity = rule.identity;
    r.combine = rule.combine("a", "b");
    r.element = [t](const std::string& v, const std::string&) { return widen(t, v); };
    r.result = [t](const std::string& acc) { return is_half(t) ? narrow(t, acc) : acc; };
    return r;
  };

  switch (op.code) {
    case OpCode::Iota: {
      out = begin_result(res);
      const int64_t axis = op.attrs.get_int(AttrKey::Axis);
      open_thread_loop(std::max<int64_t>(1, rt.size()));
      std::string i = index_exprs(rt.shape, "e")[static_cast<size_t>(axis)];
      line(out + "[e] = " + narrow(rt.dtype, "(" + ccompute(rt.dtype) + ")" + i) + ";");
      close_loop();
      end_result(res);
      return;
    }
    case OpCode::Bitcast: {  // itemsizes differ: the bytes are the same, the element grid is not
      out = define_tile(res);
      const int64_t bytes = rt.size() * itemsize(rt.dtype);
      open_thread_loop(bytes, "b");
      line("((char*)" + out + ")[b] = ((const char*)" + info(op.operands[0]).name + ")[b];");
      close_loop();
      after_tile_write();
      barrier();  // byte ownership is not element ownership
      return;
    }
    case OpCode::BroadcastInDim: case OpCode::Reshape: case OpCode::Squeeze:
    case OpCode::ExpandDims: case OpCode::Transpose: case OpCode::Slice: case OpCode::DynamicSlice:
    case OpCode::Rev: case OpCode::Concatenate: {
      const ValueId x = op.operands[0];
      if (info(x).kind == ValueInfo::Kind::Fragment && blocked_column_rev(op, info(x).frag))
        return emit_blocked_column_rev(op);  // (plan_fragments': a reversal of columns in their registers)
      if (const std::optional<FragmentLayout> piece = register_piece_layout(op)) return emit_register_piece(op, *piece);  // (plan_fragments': a slice or concatenate of whole registers)
      const ir::Type& xt = type(x);
      const std::vector<int64_t> xs = contiguous_strides(xt.shape);
      std::vector<std::string> dyn_start;
      if (op.code == OpCode::DynamicSlice) {
        // XLA clamps each start so the window fits.
        const ir::Ints& sizes = op.attrs.get_ints(AttrKey::Sizes);
        for (size_t d = 0; d < xt.shape.size(); ++d) {
          std::string s = fresh("ds");
          line("pl_i64 " + s + " = (pl_i64)" + info(op.operands[1 + d]).name + "; if (" + s + " < 0) " + s +
               " = 0; if (" + s + " > " + std::to_string(xt.shape[d] - sizes[d]) + ") " + s + " = " +
               std::to_string(xt.shape[d] - sizes[d]) + ";");
          dyn_start.push_back(s);
        }
      }
      out = begin_result(res);
      open_thread_loop(std::max<int64_t>(1, rt.size()));
      const std::vector<std::string> oi = index_exprs(rt.shape, "e");
      std::string value;
      switch (op.code) {
        case OpCode::Reshape: case OpCode::Squeeze: case OpCode::ExpandDims:
          value = src(x, "e");
          break;
        case OpCode::BroadcastInDim:
          value = broadcast_element(op, "e");
          break;
        case OpCode::Transpose: {
          const ir::Ints& perm = op.attrs.get_ints(AttrKey::Permutation);
          std::vector<int64_t> st;
          for (int64_t p : perm) st.push_back(xs[static_cast<size_t>(p)]);
          value = src(x, sum_of(oi, st));
          break;
        }
        case OpCode::Slice: {
          const ir::Ints& start = op.attrs.get_ints(AttrKey::Start);
          const ir::Ints* strides = op.attrs.has(AttrKey::Strides) ? &op.attrs.get_ints(AttrKey::Strides) : nullptr;
          std::vector<std::string> si;
          for (size_t d = 0; d < oi.size(); ++d) {
            int64_t step = strides && !strides->empty() ? (*strides)[d] : 1;
            si.push_back("(" + std::to_string(start[d]) + " + " + oi[d] + " * " + std::to_string(step) + ")");
          }
          value = src(x, sum_of(si, xs));
          break;
        }
        case OpCode::DynamicSlice: {
          std::vector<std::string> si;
          for (size_t d = 0; d < oi.size(); ++d) si.push_back("(" + dyn_start[d] + " + " + oi[d] + ")");
          value = src(x, sum_of(si, xs));
          break;
        }
        case OpCode::Rev: {
          const ir::Ints& dims = op.attrs.get_ints(AttrKey::Dims);
          std::vector<std::string> si = oi;
          for (int64_t d : dims)
            si[static_cast<size_t>(d)] = "(" + std::to_string(xt.shape[static_cast<size_t>(d)] - 1) + " - " +
                                         oi[static_cast<size_t>(d)] + ")";
          value = src(x, sum_of(si, xs));
          break;
        }
        case OpCode::Concatenate: {
          const auto axis = static_cast<size_t>(op.attrs.get_int(AttrKey::Axis));
          line("pl_i64 ca = " + oi[axis] + ";");
          int64_t base = 0;
          for (size_t k = 0; k < op.operands.size(); ++k) {
            const ir::Type& kt = type(op.operands[k]);
            std::vector<std::string> si = oi;
            si[axis] = "(ca - " + std::to_string(base) + ")";
            line(std::string(k ? "else " : "") + "if (ca < " + std::to_string(base + kt.shape[axis]) + ") " + out +
                 "[e] = " + src(op.operands[k], sum_of(si, contiguous_strides(kt.shape))) + ";");
            base += kt.shape[axis];
          }
          break;
        }
        default: break;
      }
      if (!value.empty()) line(out + "[e] = " + value + ";");
      close_loop();
      end_result(res);
      return;
    }
    case OpCode::ReduceSum: case OpCode::ReduceMax: case OpCode::ReduceMin:
    case OpCode::ReduceProd: case OpCode::ReduceAnd: case OpCode::ReduceOr: {
      const ir::Type& xt = type(op.operands[0]);
      const ir::Ints& axes = op.attrs.get_ints(AttrKey::Axes);
      std::vector<size_t> reduced;
      int64_t count = 1;
      for (int64_t a : axes) {
        reduced.push_back(static_cast<size_t>(a));
        count *= xt.shape[static_cast<size_t>(a)];
      }
      std::sort(reduced.begin(), reduced.end());
      const TeamReduction t = rule_reduction(reduce_rule(op.code, xt.dtype, count), xt.dtype);
      if (info(op.operands[0]).kind == ValueInfo::Kind::Fragment) return emit_reduction_of_fragment(op, t);  // plan_fragments'
      out = begin_result(res);
      const bool team = emit_team_reduction(op.operands[0], reduced, out, t);
      end_result(res);
      if (team && !rt.shape.empty()) barrier();  // a team's first thread wrote its result
      return;
    }
    case OpCode::Argmax: case OpCode::Argmin: {
      const ir::Type& xt = type(op.operands[0]);
      const auto axis = static_cast<size_t>(op.attrs.get_int(AttrKey::Axis));
      const std::string A = ccompute(xt.dtype), best = "pl_arg_best<" + A + ">";
      TeamReduction t;
      t.acc_type = best;
      t.acc_bytes = 16;
      t.identity = best + "{" + A + "(0), -1}";  // none yet
      t.combine = std::string("pl_arg_better<") + (op.code == OpCode::Argmax ? "true" : "false") + ">(a, b)";
      t.element = [&](const std::string& v, const std::string& j) { return best + "{" + widen(xt.dtype, v) + ", " + j + "}"; };
      t.result = [&](const std::string& acc) { return "(" + ctype(rt.dtype) + ")" + acc + ".i"; };
      if (info(op.operands[0]).kind == ValueInfo::Kind::Fragment) return emit_reduction_of_fragment(op, t);  // plan_fragments'
      out = begin_result(res);
      const bool team = emit_team_reduction(op.operands[0], {axis}, out, t);
      end_result(res);
      if (team && !rt.shape.empty()) barrier();
      return;
    }
    case OpCode::Cumsum: case OpCode::Cumprod: case OpCode::Cummax: case OpCode::Cummin: {
      const ValueId x = op.operands[0];
      const ir::Type& xt = type(x);
      const auto axis = static_cast<size_t>(op.attrs.get_int(AttrKey::Axis));
      const bool reverse = op.attrs.get_int_or(AttrKey::Reverse, 0) != 0;
      const std::vector<int64_t> xs = contiguous_strides(xt.shape);
      Shape lines_shape;
      std::vector<int64_t> line_strides;
      for (size_t d = 0; d < xt.shape.size(); ++d)
        if (d != axis) lines_shape.push_back(xt.shape[d]), line_strides.push_back(xs[d]);
      const ReduceRule rule = reduce_rule(op.code, xt.dtype, 1);
      const std::string A = rule.acc_type;
      if (info(x).kind == ValueInfo::Kind::Fragment) {  // plan_fragments': a blocked tile's rows
        PALLAS_INTERNAL_CHECK(blocked_row_scan(op, info(x).frag), "gpu emitter: a scan of a register tile it cannot take");
        const TeamReduction t = rule_reduction(rule, xt.dtype);
        if (const auto it = fragments_.find(res); it != fragments_.end())
          return emit_blocked_row_scan(op, define_fragment(res, it->second), t, /*into_registers=*/true);
        out = define_tile(res);
        emit_blocked_row_scan(op, out, t, /*into_registers=*/false);
        after_tile_write();
        barrier();  // (the threads holding the elements wrote them, not the arena's loops)
        return;
      }
      out = define_tile(res);
      const int64_t lines = std::max<int64_t>(1, num_elements(lines_shape)), n = xt.shape[axis];
      const std::string L = std::to_string(lines), N = std::to_string(n);
      // With fewer lines than threads, a team of S threads scans each line (as reductions share
      // theirs): each thread combines its chunk of consecutive elements, the team's exclusive
      // scan of those totals starts each chunk's own scan.
      const auto [team, wide] = team_bounds(lines, n);
      open_team_loop(lines, n, team);
      line("auto pl_comb = [](" + A + " a, " + A + " b) { return " + rule.combine("a", "b") + "; };");
      line("const pl_i64 chunk = (" + N + " + S - 1) / S;");
      line("const pl_i64 base = " + sum_of(index_exprs(lines_shape, "e"), line_strides) + ";");
      line("const pl_i64 first = pl_tid() % S * chunk, last = e >= " + L + " ? first : first + chunk < " + N +
           " ? first + chunk : " + N + ";");
      const std::string at_j = "base + (" + (reverse ? N + " - 1 - j" : std::string("j")) + ") * " +
                               std::to_string(xs[axis]);
      const std::string element = widen(xt.dtype, info(x).name + "[" + at_j + "]");
      line(A + " acc = " + rule.identity + ";");
      if (team) {
        line("if (S > 1) {");
        line("  for (pl_i64 j = first; j < last; ++j) acc = pl_comb(acc, " + element + ");");
        with_team_scratch(wide, A, is_half(xt.dtype) ? 4 : itemsize(xt.dtype), [&](const std::string& scratch) {
          line("  acc = pl_team_exclusive_scan<" + std::string(wide ? "true" : "false") + ">(acc, (" + A + ")" +
               rule.identity + ", S, pl_comb, " + scratch + ");");
        });
        line("}");
      }
      line("for (pl_i64 j = first; j < last; ++j) {");
      line("  acc = pl_comb(acc, " + element + ");");
      line("  " + out + "[" + at_j + "] = " + (is_half(xt.dtype) ? narrow(xt.dtype, "acc") : "acc") + ";");
      line("}");
      --indent_;
      line("}");
      --indent_;
      line("}");
      after_tile_write();
      barrier();  // each thread wrote whole lines or chunks, not its own elements
      return;
    }
    case OpCode::Sort: {
      const ir::Type& kt = type(op.operands[0]);
      const int64_t n = kt.shape.back(), rows = kt.size() / std::max<int64_t>(1, n);
      const int64_t num_keys = op.attrs.get_int(AttrKey::NumKeys);
      const bool descending = op.attrs.get_int_or(AttrKey::Descending, 0) != 0;
      const std::string N = std::to_string(n);
      std::vector<std::string> outs, ins;
      for (ValueId r : op.results) outs.push_back(define_tile(r));
      for (ValueId o : op.operands) ins.push_back(info(o).name);
      if (kt.size() == 0) return;  // (nothing to sort)
      // The keys of elements a and b of a row compared lexicographically (total orders): sets
      // `before` when a sorts before b, and leaves it when they tie.
      auto compare = [&](const std::vector<std::string>& arrays, const std::string& a, const std::string& b) {
        std::string close;
        for (int64_t k = 0; k < num_keys; ++k) {
          const std::string& o = arrays[static_cast<size_t>(k)];
          line("  { pl_i64 ka = pl_sort_key(" + o + "[" + a + "]), kb = pl_sort_key(" + o + "[" + b + "]);");
          line(std::string("    if (ka != kb) before = ") + (descending ? "ka > kb" : "ka < kb") + ";");
          line("    else");
          close += "}";
        }
        line("    {}" + close);
      };
      // Fewer rows than threads: every element finds its place by counting the elements of its row
      // that sort before it (ties: the earlier index, so the sort is stable) — n comparisons per
      // element, all threads busy. Otherwise a thread sorts each row by insertion (n^2 / 4
      // comparisons on average, n when nearly sorted).
      line("if (" + std::to_string(rows) + " < pl_nthreads()) {");
      ++indent_;
      open_thread_loop(std::max<int64_t>(1, rows * n), "at");
      line("const pl_i64 base = at - at % " + N + ", j = at - base;");
      line("pl_i64 rank = 0;");
      line("for (pl_i64 k = 0; k < " + N + "; ++k) {");
      line("  bool before = k < j;");
      compare(ins, "base + k", "at");
      line("  rank += before;");
      line("}");
      for (size_t i = 0; i < outs.size(); ++i) line(outs[i] + "[base + rank] = " + ins[i] + "[at];");
      close_loop();
      --indent_;
      line("} else {");
      ++indent_;
      open_thread_loop(std::max<int64_t>(1, rows), "row");
      line("pl_i64 base = row * " + N + ";");
      line("for (pl_i64 j = 0; j < " + N + "; ++j) {");
      for (size_t i = 0; i < outs.size(); ++i) line("  " + outs[i] + "[base + j] = " + ins[i] + "[base + j];");
      line("}");
      line("for (pl_i64 i = 1; i < " + N + "; ++i) {");
      line("  for (pl_i64 j = i; j > 0; --j) {");
      line("    pl_i64 a = base + j, b = base + j - 1;");
      line("    bool before = false;");
      compare(outs, "a", "b");
      line("    if (!before) break;");
      for (size_t i = 0; i < outs.size(); ++i) {
        const std::string T = ctype(type(op.results[i]).dtype);
        line("    { " + T + " t = " + outs[i] + "[a]; " + outs[i] + "[a] = " + outs[i] + "[b]; " + outs[i] + "[b] = t; }");
      }
      line("  }");
      line("}");
      close_loop();
      --indent_;
      line("}");
      after_tile_write();
      barrier();
      return;
    }
    case OpCode::DotGeneral: {
      const ValueId l = op.operands[0], r = op.operands[1];
      const ir::Type& lt = type(l);
      const ir::Type& rtt = type(r);
      const ir::Ints& lc = op.attrs.get_ints(AttrKey::LhsContracting);
      const ir::Ints& rc = op.attrs.get_ints(AttrKey::RhsContracting);
      const ir::Ints& lb = op.attrs.get_ints(AttrKey::LhsBatch);
      const ir::Ints& rb = op.attrs.get_ints(AttrKey::RhsBatch);
      // A load of a swizzled SMEM tile is not where its strides say (RefInfo::elem), which the
      // dot reads by: it is emitted as a load of its own (a tile) after all.
      bool loaded = false;
      for (ValueId v : {l, r})
        if (info(v).kind == ValueInfo::Kind::Fused && !info(v).ref.swizzled.empty()) {
          emit_ref_op_in_memory(*info(v).producer);
          loaded = true;
        }
      // (b is read across even where a is a register tile, which the rule above skips.)
      if (loaded || info(l).kind == ValueInfo::Kind::Fragment) before_cross_read();
      // An operand is a tile, or a load viewed in place (plan_fusion): its pointer and strides.
      auto operand = [&](ValueId v) -> std::pair<std::string, std::vector<int64_t>> {
        const ValueInfo& i = info(v);
        if (i.kind == ValueInfo::Kind::Fused) return {i.ref.ptr, i.ref.strides};
        return {i.name, contiguous_strides(type(v).shape)};
      };
      const auto [lhs, ls] = operand(l);
      const auto [rp, rs] = operand(r);
      auto in = [](const ir::Ints& v, size_t d) { return std::find(v.begin(), v.end(), static_cast<int64_t>(d)) != v.end(); };
      // Result dims: batch, lhs free, rhs free. Each contributes to the lhs and/or rhs offsets.
      std::vector<int64_t> lstr, rstr;  // per result dim
      for (size_t i = 0; i < lb.size(); ++i) {
        lstr.push_back(ls[static_cast<size_t>(lb[i])]);
        rstr.push_back(rs[static_cast<size_t>(rb[i])]);
      }
      for (size_t d = 0; d < lt.shape.size(); ++d)
        if (!in(lc, d) && !in(lb, d)) lstr.push_back(ls[d]), rstr.push_back(0);
      for (size_t d = 0; d < rtt.shape.size(); ++d)
        if (!in(rc, d) && !in(rb, d)) lstr.push_back(0), rstr.push_back(rs[d]);
      const DType xt = lt.dtype, R = rt.dtype;
      std::string A;  // accumulator type
      if (is_float(xt)) A = (xt == DType::F64 || R == DType::F64) ? "double" : "float";
      else A = is_float(R) ? "pl_i64" : ctype(R);
      // The result: a tile, a register tile (plan_fragments: of wgmma's accumulator layout), or
      // (`acc[v] += dot`, plan_fusion) the accumulator's view, added to.
      const auto acc_store = accumulating_dots_.find(&op);
      const bool accumulate = acc_store != accumulating_dots_.end();
      // Into the register accumulator: its scratch as it is (the whole buffer; view() would
      // flush the registers).
      const bool into_registers = accumulate && acc_store->second->operands[0] == acc_regs_.ref;
      // The product into d (row-major, its rows d.strides[0] apart), added to it when accumulating.
      auto product_into = [&](const RefInfo& d, const std::string& lp, bool count) {
        // A plain matrix product (lhs m x k, rhs k x n or n x k) goes to the tensor cores when it
        // can (rows of each matrix contiguous); the loop below is its fallback, and every other dot.
        bool on_tensor_cores = false;
        MmaProduct p;
        if (plain_product(op, p) && ls[1] == 1 && rs[1] == 1 && (d.strides.size() < 2 || d.strides[1] == 1)) {
          p.d = d.ptr, p.a = lp, p.b = rp;
          p.ldd = d.strides.size() < 2 ? p.n : d.strides[0], p.lda = ls[0], p.ldb = rs[0];
          p.accumulate = accumulate;
          note_slot_layouts(op, p, count);
          if (into_registers) p.acc_rounds = acc_regs_.regs.rounds;
          on_tensor_cores = open_tensor_core_product(p);
        }
        open_thread_loop(std::max<int64_t>(1, rt.size()));
        const std::vector<std::string> oi = index_exprs(rt.shape, "e");
        line("pl_i64 lo = " + sum_of(oi, lstr) + ", ro = " + sum_of(oi, rstr) + ";");
        line(A + " acc = 0;");
        std::string loff = "lo", roff = "ro";
        for (size_t k = 0; k < lc.size(); ++k) {
          std::string i = "k" + std::to_string(k);
          line("#pragma unroll 4");  // NVVM unrolls a constant count fully: slow to compile, no faster
          line("for (pl_i64 " + i + " = 0; " + i + " < " + std::to_string(lt.shape[static_cast<size_t>(lc[k])]) + "; ++" + i + ") {");
          ++indent_;
          loff += " + " + i + " * " + std::to_string(ls[static_cast<size_t>(lc[k])]);
          roff += " + " + i + " * " + std::to_string(rs[static_cast<size_t>(rc[k])]);
        }
        std::string a = lp + "[" + loff + "]", b = rp + "[" + roff + "]";
        if (is_float(xt)) {
          line("acc += (" + A + ")" + widen(xt, a) + " * (" + A + ")" + widen(xt, b) + ";");
        } else {
          // Integers wrap in the accumulator's type (the inputs converted to it first).
          line("acc = pl_iadd<" + A + ">(acc, pl_imul<" + A + ">((" + A + ")" + a + ", (" + A + ")" + b + "));");
        }
        for (size_t k = 0; k < lc.size(); ++k) close_loop();
        std::string result = "acc";
        if (is_half(R)) result = narrow(R, "(float)acc");
        else if (is_integer(R) && is_float(xt)) result = "pl_f2i<" + ctype(R) + ">(acc)";
        else result = "(" + ctype(R) + ")acc";
        const std::string target = d.ptr + "[" + offset_of(rt.shape, d.strides, "e") + "]";
        // In place: the product rounded to f32, then the sum (the unfused ops' order).
        line(target + " = " + (accumulate ? "(float)(" + target + " + " + result + ")" : result) + ";");
        close_loop();
        if (on_tensor_cores) close_loop();
      };
      if (accumulate) {
        const ir::Op& st = *acc_store->second;
        before_mem_read();
        before_mem_write();
        product_into(into_registers ? info(acc_regs_.ref).ref : view(st, info(st.operands[0]).ref, st.attrs.get_indexer(AttrKey::Index)),
                     lhs, true);
        after_mem_write();
        after_mem_read();
      } else if (const auto frag = fragments_.find(res); frag != fragments_.end()) {
        emit_dot_into_registers(op, frag->second, ls[1] == 1 && rs[1] == 1, lhs, ls[0], rp, rs[0], product_into);
      } else {
        out = begin_result(res);
        product_into(RefInfo{out, R, rt.shape, contiguous_strides(rt.shape)}, lhs, true);
        end_result(res);
      }
      return;
    }
    default: break;
  }
  throw NotSupportedError(std::string(op.info().name) + " on the GPU backend", op.loc);
}

bool Emitter::plain_product(const ir::Op& dot, MmaProduct& p) const {
  if (dot.code != OpCode::DotGeneral) return false;
  const ir::Type& lt = type(dot.operands[0]);
  const ir::Type& rt = type(dot.operands[1]);
  const ir::Ints& lc = dot.attrs.get_ints(AttrKey::LhsContracting);
  const ir::Ints& rc = dot.attrs.get_ints(AttrKey::RhsContracting);
  if (lt.shape.size() != 2 || rt.shape.size() != 2 || !dot.attrs.get_ints(AttrKey::LhsBatch).empty() ||
      lc != ir::Ints{1} || (rc != ir::Ints{0} && rc != ir::Ints{1}))
    return false;
  p.b_nk = rc[0] == 1;
  p.m = lt.shape[0], p.k = lt.shape[1], p.n = rt.shape[p.b_nk ? 0 : 1];
  p.d_dtype = type(dot.results[0]).dtype, p.a_dtype = lt.dtype, p.b_dtype = rt.dtype;
  return true;
}

void Emitter::note_slot_layouts(const ir::Op& dot, MmaProduct& p, bool count) {
  if (!wgmma_shape(p)) return;
  // An operand read in place from a ring slot, where wgmma can run (m % 64 == 0), may have the
  // slot in wgmma's canonical layout: a's K-major, b's K-major when it is n x k, else MN-major.
  auto note = [&](ValueId v, int layout, std::string& name) {
    const int j = info(v).kind == ValueInfo::Kind::Fused ? info(v).ref.slot_input : -1;
    if (j < 0) return;
    name = "PL_SLOT_LAYOUT_" + std::to_string(j);
    if (!count) return;
    SlotUses& u = slot_uses_[j];
    ++u.tensor_core;
    u.layout = u.layout == 0 || u.layout == layout ? layout : -1;
  };
  note(dot.operands[0], 1, p.a_layout);
  note(dot.operands[1], p.b_nk ? 1 : 2, p.b_layout);
}

bool Emitter::tensor_core_shape(const MmaProduct& p) {
  const bool half_inputs = p.a_dtype == p.b_dtype && (p.a_dtype == DType::BF16 || p.a_dtype == DType::F16);
  const bool result_ok = p.d_dtype == DType::F32 || p.d_dtype == DType::BF16 || p.d_dtype == DType::F16;
  return half_inputs && result_ok && p.m > 0 && p.n > 0 && p.k > 0 && p.m % 16 == 0 && p.n % 8 == 0 && p.k % 16 == 0;
}

bool Emitter::wgmma_shape(const MmaProduct& p) { return tensor_core_shape(p) && p.m % 64 == 0; }

int64_t Emitter::wgmma_width(int64_t n, bool in_place) {
  if (in_place && n % 256 == 0) return 256;
  int64_t nc = 128;
  while (nc > 8 && n % nc != 0) nc /= 2;
  return nc;
}

bool Emitter::open_tensor_core_product(const MmaProduct& p) {
  if (!tensor_core_shape(p)) return false;
  if (ctx_.tensor_core_dots) ++*ctx_.tensor_core_dots;
  // (A swizzled gpu::kernel tile is in wgmma's layout wherever wgmma runs; a ring slot's layout is
  // decided later and may be row-major.)
  const bool in_place = p.a_layout.rfind("pl_swizzled_layout(", 0) == 0 && p.b_layout.rfind("pl_swizzled_layout(", 0) == 0;
  if (ctx_.staged_tensor_core_dots && !in_place) ++*ctx_.staged_tensor_core_dots;
  auto s = [](int64_t v) { return std::to_string(v); };
  // pl_tc_dot (wgmma, else mma.sync) is false only for a group that is not whole warps (host
  // emulation): the loop runs. nc: wgmma's instruction width, the widest that tiles N (one
  // instantiation per product keeps NVRTC's compile short).
  // Into the register accumulator: pl_tc_dot_acc, which always accumulates.
  const bool regs = p.acc_rounds > 0;
  // (A gpu::kernel's ACC in registers has its width, 256 only where its products are in place.)
  PALLAS_INTERNAL_CHECK(p.acc_nc <= 128 || in_place);
  std::string targs = std::string(p.b_nk ? "true" : "false") + ", " + s(p.acc_nc > 0 ? p.acc_nc : wgmma_width(p.n));
  if (regs || p.a_layout != "0" || p.b_layout != "0") targs += ", " + p.a_layout + ", " + p.b_layout;
  if (regs) targs += ", " + s(p.acc_rounds) + (p.acc_pending.empty() ? "" : ", " + p.acc_pending);
  const std::string args = p.d + ", " + s(p.ldd) + ", " + p.a + ", " + s(p.lda) + ", " + p.b + ", " + s(p.ldb) + ", " + s(p.m) +
                           ", " + s(p.n) + ", " + s(p.k);
  line(regs ? "if (!pl_tc_dot_acc<" + targs + ">(" + p.acc_var + ", " + args + ")) {"
            : "if (!pl_tc_dot<" + targs + ">(" + args + ", " + (p.accumulate ? "true" : "false") + ")) {");
  ++indent_;
  return true;
}

}  // namespace pallas::gpu::detail
