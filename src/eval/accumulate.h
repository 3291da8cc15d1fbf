// Accumulation rules shared by the reductions, scans and dot: the accumulator type of each
// element type, loads/stores through it, and the combining functions with the IR's semantics
// (integers wrap; float max/min propagate NaN and order -0 below +0).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "eval/scalar_ops.h"
#include "pallas/dtype.h"

namespace pallas::eval::acc {

// f16/bf16 accumulate in f32 (ir.h semantics); everything else in its own type.
template <class T> using Acc = scalar::Compute<T>;

using scalar::is_int_v;
template <class T> inline constexpr bool is_half_v =
    std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

// Wrapping integer arithmetic: the unsigned type of T's width, but at least `unsigned` so that
// narrow operands do not promote to (signed, overflowing) int — uint16 * uint16 would.
template <class T> using Wide =
    std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

template <class T> inline Acc<T> load(T v) {
  if constexpr (std::is_same_v<T, bfloat16>) {
    // bf16 is the top half of an f32: widening is a shift (exact, keeps NaN payloads).
    const uint32_t b = static_cast<uint32_t>(v.bits) << 16;
    float f;
    std::memcpy(&f, &b, sizeof f);
    return f;
  } else if constexpr (std::is_same_v<T, float16>) {
    return static_cast<float>(v);
  } else {
    return v;
  }
}

// f32 -> bf16 bits, to nearest even; bit-identical to float_to_bf16_bits (NaN: top payload bits
// kept, quiet bit set), but inline and branch-light: bf16 has f32's exponent range, so rounding
// is integer arithmetic on the bit pattern (a carry out of the mantissa bumps the exponent, and
// out of the largest finite value gives Inf, as it should). The generic converter goes through
// double and is several times slower, which shows in bf16 reductions and dot results.
inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((b >> 16) | 0x0040u);
  b += 0x7FFFu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}

// Rounds an accumulator to the element type (f16/bf16: to nearest even, once).
template <class T> inline T store(Acc<T> a) {
  if constexpr (std::is_same_v<T, bfloat16>)
    return bfloat16::from_bits(f32_to_bf16_bits(a));
  else if constexpr (std::is_same_v<T, float16>)
    return T(a);
  else
    return a;
}

enum class Kind { Sum, Prod, Max, Min, And, Or };

// Combining two accumulators: the elementwise ops' own scalar definitions (scalar_ops.h), so
// reductions, scans and the elementwise ops cannot disagree on wrapping, NaN or -0.
template <Kind K, class A> inline A combine(A a, A b) {
  if constexpr (K == Kind::Sum) {
    if constexpr (std::is_same_v<A, bool>) return a || b;
    else return scalar::Add{}(a, b);
  } else if constexpr (K == Kind::Prod) {
    if constexpr (std::is_same_v<A, bool>) return a && b;
    else return scalar::Mul{}(a, b);
  } else if constexpr (K == Kind::Max) {
    return scalar::Max{}(a, b);
  } else if constexpr (K == Kind::Min) {
    return scalar::Min{}(a, b);
  } else if constexpr (K == Kind::And) {
    return scalar::And{}(a, b);
  } else {
    return scalar::Or{}(a, b);
  }
}

// The value an accumulator starts from. Float sums start from -0, the exact additive identity
// (-0 + x == x for every x, including -0), so summing a single -0 gives -0 as an identity copy
// would; an empty sum is still +0 (see empty_value).
template <Kind K, class A> inline A identity() {
  if constexpr (K == Kind::Sum) {
    if constexpr (std::is_floating_point_v<A>)
      return -A(0);
    else
      return A(0);
  } else if constexpr (K == Kind::Prod) {
    return A(1);
  } else if constexpr (K == Kind::Max) {
    if constexpr (std::is_floating_point_v<A>)
      return -std::numeric_limits<A>::infinity();
    else
      return std::numeric_limits<A>::lowest();  // false for bool
  } else if constexpr (K == Kind::Min) {
    if constexpr (std::is_floating_point_v<A>)
      return std::numeric_limits<A>::infinity();
    else
      return std::numeric_limits<A>::max();  // true for bool
  } else if constexpr (K == Kind::And) {
    if constexpr (std::is_same_v<A, bool>)
      return true;
    else
      return static_cast<A>(~std::make_unsigned_t<A>(0));  // all bits set
  } else {
    return A(0);
  }
}

// Result of reducing nothing: the identity, with +0 for sums.
template <Kind K, class A> inline A empty_value() {
  if constexpr (K == Kind::Sum)
    return A(0);
  else
    return identity<K, A>();
}

// Which (element type, kind) pairs exist: sum/prod of bool are rejected by the type rules, and
// and/or are integer-or-bool only. Guarding instantiation keeps nonsense like bool * bool out.
template <Kind K, class T> inline constexpr bool supported_v =
    (K == Kind::Max || K == Kind::Min) ||
    ((K == Kind::Sum || K == Kind::Prod) && !std::is_same_v<T, bool>) ||
    ((K == Kind::And || K == Kind::Or) && (std::is_integral_v<T>));

}  // namespace pallas::eval::acc
