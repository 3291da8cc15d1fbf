// Bit-level rounding into binary floating-point formats (private to the library).
//
// Every conversion into a narrower float format (double -> f32/f16/bf16, int -> any float)
// goes through `round_to_format`, which rounds an exact value sig * 2^e2 once, to nearest,
// ties to even. Rounding once from the exact source value is the point: converting
// double -> float -> f16 can round twice and give a different (wrong) answer.
// Only integer arithmetic is used, so results are identical on every platform and no
// out-of-range float->float cast (undefined behaviour in C++) is ever evaluated.
#pragma once

#include <cstdint>

namespace pallas::detail {

// An IEEE-754-style binary format: 1 sign bit, `exp_bits` exponent bits, `mant_bits` stored
// mantissa bits, subnormals, Inf and NaN (all-ones exponent).
struct FloatFormat {
  int exp_bits;
  int mant_bits;
};
inline constexpr FloatFormat kF16Format{5, 10};
inline constexpr FloatFormat kBF16Format{8, 7};
inline constexpr FloatFormat kF32Format{8, 23};
inline constexpr FloatFormat kF64Format{11, 52};

// Bits of the value (-1)^negative * sig * 2^e2 rounded to `fmt` (RNE; overflow -> ±Inf;
// underflow -> subnormal or ±0, sign kept).
uint64_t round_to_format(bool negative, uint64_t sig, int e2, FloatFormat fmt);

// Bits of `d` rounded to `fmt`. NaN stays NaN: the top payload bits are kept, the quiet bit
// is set, and the sign is kept.
uint64_t double_to_format_bits(double d, FloatFormat fmt);

// The exact double value of `bits` in `fmt` (every format above is a subset of double).
// NaN payloads are kept (shifted to the top of the double's mantissa).
double format_bits_to_double(uint64_t bits, FloatFormat fmt);

}  // namespace pallas::detail
