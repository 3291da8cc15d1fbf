// Elementwise evaluation rules: generic tile loops that lift the scalar functors of
// scalar_ops.h. Dispatch (op, dtype) happens once per call; the element loops are plain loops
// over raw pointers with the functor inlined, so the compiler vectorizes them. float16/bfloat16
// are widened to float in small chunks, computed, and rounded back.
#include <algorithm>
#include <cstring>

#include "eval/eval.h"
#include "eval/scalar_ops.h"

namespace pallas::eval {

using ir::AttrKey;
using ir::OpCode;
namespace s = scalar;

namespace {

constexpr int64_t kChunk = 256;  // f16/bf16 elements widened at a time

template <class T> constexpr bool is_half_v = std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

// Loops run in blocks of kBlock elements with a constant-trip-count inner loop, then a scalar
// tail. Why: at -O2 (the RelWithDebInfo default) GCC uses its "very cheap" vectorizer cost
// model, which refuses loops whose trip count is not known to be a multiple of the vector
// width, so a plain `for (i < n)` loop stays scalar (about 3x slower for f32 add on a tile).
// A fixed 16-element inner loop is vectorized at -O2 and at -O3 alike. `__restrict`: results
// are fresh buffers that never overlap the operands, and without it the compiler would need
// runtime overlap checks, which the cheap cost model also refuses.
constexpr int64_t kBlock = 16;
static_assert(kChunk % kBlock == 0);

template <class T, class R, class F>
void map_unary_plain(const T* __restrict x, R* __restrict out, int64_t n, F f) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock)
    for (int64_t j = 0; j < kBlock; ++j) out[i + j] = f(x[i + j]);
  for (; i < n; ++i) out[i] = f(x[i]);
}

template <class T, class R, class F>
void map_binary_plain(const T* __restrict a, const T* __restrict b, R* __restrict out, int64_t n,
                      F f) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock)
    for (int64_t j = 0; j < kBlock; ++j) out[i + j] = f(a[i + j], b[i + j]);
  for (; i < n; ++i) out[i] = f(a[i], b[i]);
}

// f16/bf16: widen a chunk to float, run the op on the float buffers (the vectorizable part),
// round back. The widening/rounding calls are out of line and stay scalar.
template <class T, class F> void map_unary(const T* x, T* out, int64_t n, F f) {
  if constexpr (is_half_v<T>) {
    float in[kChunk], res[kChunk];
    for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
      const int64_t m = std::min(kChunk, n - i0);
      for (int64_t i = 0; i < m; ++i) in[i] = static_cast<float>(x[i0 + i]);
      map_unary_plain(in, res, m, f);
      for (int64_t i = 0; i < m; ++i) out[i0 + i] = T(res[i]);
    }
  } else {
    map_unary_plain(x, out, n, f);
  }
}

template <class T, class R, class F> void map_binary(const T* a, const T* b, R* out, int64_t n, F f) {
  if constexpr (is_half_v<T>) {
    float fa[kChunk], fb[kChunk];
    for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
      const int64_t m = std::min(kChunk, n - i0);
      for (int64_t i = 0; i < m; ++i) {
        fa[i] = static_cast<float>(a[i0 + i]);
        fb[i] = static_cast<float>(b[i0 + i]);
      }
      if constexpr (std::is_same_v<R, bool>) {
        map_binary_plain(fa, fb, out + i0, m, f);
      } else {
        float res[kChunk];
        map_binary_plain(fa, fb, res, m, f);
        for (int64_t i = 0; i < m; ++i) out[i0 + i] = T(res[i]);
      }
    }
  } else {
    map_binary_plain(a, b, out, n, f);
  }
}

[[noreturn]] void bad_dtype(OpCode code, DType t) {
  throw InternalError(std::string(ir::op_info(code).name) + " on " + std::string(dtype_name(t)));
}

// Dtype classes an op accepts (the type rules have already checked; a mismatch here is a bug).
template <class T> struct FloatType : std::bool_constant<s::is_float_v<s::Compute<T>>> {};
template <class T> struct IntType : std::bool_constant<s::is_int_v<T>> {};
template <class T> struct IntOrBoolType : std::bool_constant<std::is_integral_v<T>> {};

template <template <class> class Accepts, class F>
Array unary_if(OpCode code, const Array& x, F f) {
  Array out = Array::uninitialized(x.shape(), x.dtype());
  visit_dtype(x.dtype(), [&]<class T>() {
    if constexpr (Accepts<T>::value)
      map_unary(x.data<T>(), out.data<T>(), x.size(), f);
    else
      bad_dtype(code, x.dtype());
  });
  return out;
}

template <template <class> class Accepts, class F>
Array binary_if(OpCode code, const Array& a, const Array& b, F f) {
  Array out = Array::uninitialized(a.shape(), a.dtype());
  visit_dtype(a.dtype(), [&]<class T>() {
    if constexpr (Accepts<T>::value)
      map_binary(a.data<T>(), b.data<T>(), out.data<T>(), a.size(), f);
    else
      bad_dtype(code, a.dtype());
  });
  return out;
}

// Ops defined on every numeric type (and, where the functor allows, bool).
template <class F> Array unary_numeric(OpCode code, const Array& x, F f, bool allow_bool = false) {
  Array out = Array::uninitialized(x.shape(), x.dtype());
  visit_dtype(x.dtype(), [&]<class T>() {
    if constexpr (std::is_same_v<T, bool>) {
      if (!allow_bool) bad_dtype(code, x.dtype());
      if constexpr (std::is_invocable_v<F, bool>) map_unary(x.data<T>(), out.data<T>(), x.size(), f);
    } else {
      map_unary(x.data<T>(), out.data<T>(), x.size(), f);
    }
  });
  return out;
}

template <class F> Array binary_arith(OpCode code, const Array& a, const Array& b, F f) {
  Array out = Array::uninitialized(a.shape(), a.dtype());
  visit_dtype(a.dtype(), [&]<class T>() {
    if constexpr (std::is_invocable_v<F, s::Compute<T>, s::Compute<T>>)
      map_binary(a.data<T>(), b.data<T>(), out.data<T>(), a.size(), f);
    else
      bad_dtype(code, a.dtype());
  });
  return out;
}

template <class F> Array compare(const Array& a, const Array& b, F f) {
  Array out = Array::uninitialized(a.shape(), DType::Bool);
  visit_dtype(a.dtype(), [&]<class T>() {
    map_binary(a.data<T>(), b.data<T>(), out.data<bool>(), a.size(), f);
  });
  return out;
}

}  // namespace

Array unary(OpCode code, const Array& x, const ir::Attrs& attrs) {
  switch (code) {
    case OpCode::Neg: return unary_numeric(code, x, s::Neg{});
    case OpCode::Abs: return unary_numeric(code, x, s::Abs{});
    case OpCode::Sign: return unary_numeric(code, x, s::Sign{});
    case OpCode::Floor: return unary_if<FloatType>(code, x, s::Floor{});
    case OpCode::Ceil: return unary_if<FloatType>(code, x, s::Ceil{});
    case OpCode::Round:
      if (attrs.get_int_or(AttrKey::Rounding, 0) == 1) return unary_if<FloatType>(code, x, s::RoundEven{});
      return unary_if<FloatType>(code, x, s::RoundAway{});
    case OpCode::Exp: return unary_if<FloatType>(code, x, s::Exp{});
    case OpCode::Exp2: return unary_if<FloatType>(code, x, s::Exp2{});
    case OpCode::Log: return unary_if<FloatType>(code, x, s::Log{});
    case OpCode::Log1p: return unary_if<FloatType>(code, x, s::Log1p{});
    case OpCode::Sqrt: return unary_if<FloatType>(code, x, s::Sqrt{});
    case OpCode::Rsqrt: return unary_if<FloatType>(code, x, s::Rsqrt{});
    case OpCode::Reciprocal: return unary_if<FloatType>(code, x, s::Reciprocal{});
    case OpCode::Tanh: return unary_if<FloatType>(code, x, s::Tanh{});
    case OpCode::Logistic: return unary_if<FloatType>(code, x, s::Logistic{});
    case OpCode::Sin: return unary_if<FloatType>(code, x, s::Sin{});
    case OpCode::Cos: return unary_if<FloatType>(code, x, s::Cos{});
    case OpCode::Erf: return unary_if<FloatType>(code, x, s::Erf{});
    case OpCode::IsFinite: {
      Array out = Array::uninitialized(x.shape(), DType::Bool);
      bool* o = out.data<bool>();
      visit_dtype(x.dtype(), [&]<class T>() {
        if constexpr (s::is_float_v<s::Compute<T>>) {
          const T* p = x.data<T>();
          for (int64_t i = 0; i < x.size(); ++i) o[i] = std::isfinite(static_cast<s::Compute<T>>(p[i]));
        } else {
          bad_dtype(code, x.dtype());
        }
      });
      return out;
    }
    case OpCode::Not: return unary_if<IntOrBoolType>(code, x, s::Not{});
    case OpCode::IntegerPow:
      return unary_numeric(code, x, s::IntegerPow{attrs.get_int(AttrKey::Exponent)});
    case OpCode::MultipleOf: return x;  // a hint: same values (and the same buffer: values are immutable)
    default: break;
  }
  throw InternalError("eval::unary on " + std::string(ir::op_info(code).name));
}

Array binary(OpCode code, const Array& a, const Array& b) {
  switch (code) {
    case OpCode::Add: return binary_arith(code, a, b, s::Add{});
    case OpCode::Sub: return binary_arith(code, a, b, s::Sub{});
    case OpCode::Mul: return binary_arith(code, a, b, s::Mul{});
    case OpCode::Div: return binary_arith(code, a, b, s::Div{});
    case OpCode::Rem: return binary_arith(code, a, b, s::Rem{});
    case OpCode::Pow: return binary_if<FloatType>(code, a, b, s::Pow{});
    case OpCode::Max: return binary_arith(code, a, b, s::Max{});
    case OpCode::Min: return binary_arith(code, a, b, s::Min{});
    case OpCode::And: return binary_if<IntOrBoolType>(code, a, b, s::And{});
    case OpCode::Or: return binary_if<IntOrBoolType>(code, a, b, s::Or{});
    case OpCode::Xor: return binary_if<IntOrBoolType>(code, a, b, s::Xor{});
    case OpCode::ShiftLeft: return binary_if<IntType>(code, a, b, s::ShiftLeft{});
    case OpCode::ShiftRightLogical: return binary_if<IntType>(code, a, b, s::ShiftRightLogical{});
    case OpCode::ShiftRightArithmetic: return binary_if<IntType>(code, a, b, s::ShiftRightArithmetic{});
    case OpCode::Eq: return compare(a, b, s::Eq{});
    case OpCode::Ne: return compare(a, b, s::Ne{});
    case OpCode::Lt: return compare(a, b, s::Lt{});
    case OpCode::Le: return compare(a, b, s::Le{});
    case OpCode::Gt: return compare(a, b, s::Gt{});
    case OpCode::Ge: return compare(a, b, s::Ge{});
    default: break;
  }
  throw InternalError("eval::binary on " + std::string(ir::op_info(code).name));
}

Array select(const Array& pred, const Array& on_true, const Array& on_false) {
  Array out = Array::uninitialized(on_true.shape(), on_true.dtype());
  const bool* p = pred.data<bool>();
  auto run = [&]<class U>() {
    const U* a = static_cast<const U*>(on_true.raw_data());
    const U* b = static_cast<const U*>(on_false.raw_data());
    U* o = static_cast<U*>(out.raw_data());
    for (int64_t i = 0; i < out.size(); ++i) o[i] = p[i] ? a[i] : b[i];
  };
  switch (itemsize(on_true.dtype())) {  // select only moves bits
    case 1: run.operator()<uint8_t>(); break;
    case 2: run.operator()<uint16_t>(); break;
    case 4: run.operator()<uint32_t>(); break;
    default: run.operator()<uint64_t>(); break;
  }
  return out;
}

Array convert(const Array& x, DType to) {
  if (x.dtype() == to) return x;
  Array out = Array::uninitialized(x.shape(), to);
  visit_dtype(x.dtype(), [&]<class From>() {
    visit_dtype(to, [&]<class To>() {
      const From* src = x.data<From>();
      To* dst = out.data<To>();
      for (int64_t i = 0; i < x.size(); ++i) dst[i] = s::convert_value<To>(src[i]);
    });
  });
  return out;
}

Array bitcast(const Array& x, DType to) {
  Shape shape = x.shape();
  int from_bits = bit_width(x.dtype()), to_bits = bit_width(to);
  if (from_bits > to_bits) shape.push_back(from_bits / to_bits);
  if (from_bits < to_bits) shape.pop_back();
  Array out = Array::uninitialized(shape, to);
  PALLAS_INTERNAL_CHECK(out.nbytes() == x.nbytes(), "bitcast size");
  std::memcpy(out.raw_data(), x.raw_data(), static_cast<size_t>(x.nbytes()));
  return out;
}

Array constant(const Scalar& value, const Shape& shape) {
  Array out = Array::uninitialized(shape, value.dtype);
  visit_dtype(value.dtype, [&]<class T>() {
    T v;
    value.store_to(&v);
    T* o = out.data<T>();
    for (int64_t i = 0; i < out.size(); ++i) o[i] = v;
  });
  return out;
}

Array iota(DType dtype, const Shape& shape, int64_t axis) {
  Array out = Array::uninitialized(shape, dtype);
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(axis) + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t dim = shape[static_cast<size_t>(axis)];
  visit_dtype(dtype, [&]<class T>() {
    T* o = out.data<T>();
    for (int64_t i = 0; i < out.size(); ++i) o[i] = s::convert_value<T>((i / inner) % dim);
  });
  return out;
}

}  // namespace pallas::eval
