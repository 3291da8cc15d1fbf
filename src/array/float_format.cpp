// Float format rounding (see float_format.h) and the public f16 / bf16 conversions.
#include "array/float_format.h"

#include <algorithm>
#include <bit>

#include "pallas/dtype.h"

namespace pallas {
namespace detail {

uint64_t round_to_format(bool negative, uint64_t sig, int e2, FloatFormat fmt) {
  const int M = fmt.mant_bits;
  const int E = fmt.exp_bits;
  const uint64_t sign_bit = static_cast<uint64_t>(negative) << (E + M);
  if (sig == 0) return sign_bit;
  const int bias = (1 << (E - 1)) - 1;
  const int exp_max = (1 << E) - 1;  // the Inf/NaN exponent
  const int p = 63 - std::countl_zero(sig);  // position of the leading 1 bit
  const int biased = p + e2 + bias;          // biased exponent if the result is normal
  if (biased >= exp_max) return sign_bit | (static_cast<uint64_t>(exp_max) << M);
  // Subnormals share the exponent of the smallest normal (biased 1) but have no implicit bit.
  const int biased_eff = std::max(biased, 1);
  // Number of low bits of `sig` that fall below the result's last mantissa bit.
  const int shift = p - M + (biased_eff - biased);
  uint64_t q;
  if (shift <= 0) {
    q = sig << -shift;  // exact: the leading bit lands at position <= M
  } else if (shift > p + 1) {
    return sign_bit;  // below half the smallest subnormal: rounds to (signed) zero
  } else {
    uint64_t rem, half;
    if (shift == 64) {  // only when p == 63; a 64-bit shift would be undefined
      q = 0;
      rem = sig;
      half = uint64_t{1} << 63;
    } else {
      q = sig >> shift;
      rem = sig & ((uint64_t{1} << shift) - 1);
      half = uint64_t{1} << (shift - 1);
    }
    if (rem > half || (rem == half && (q & 1))) ++q;  // round to nearest, ties to even
  }
  // For normals q carries the implicit bit (value 2^M), which adds 1 to the exponent field,
  // hence the -1. A mantissa that rounds up to 2^(M+1) carries into the exponent, which is
  // exactly right (and yields the Inf encoding when it overflows the largest exponent).
  // For subnormals biased_eff == 1 and q < 2^M (or == 2^M: the smallest normal, also right).
  return sign_bit | ((static_cast<uint64_t>(biased_eff - 1) << M) + q);
}

uint64_t double_to_format_bits(double d, FloatFormat fmt) {
  const uint64_t b = std::bit_cast<uint64_t>(d);
  const bool negative = (b >> 63) != 0;
  const int exp = static_cast<int>((b >> 52) & 0x7FF);
  const uint64_t mant = b & ((uint64_t{1} << 52) - 1);
  if (exp == 0x7FF) {
    const int M = fmt.mant_bits;
    const uint64_t sign_bit = static_cast<uint64_t>(negative) << (fmt.exp_bits + M);
    const uint64_t inf = sign_bit | (((uint64_t{1} << fmt.exp_bits) - 1) << M);
    if (mant == 0) return inf;
    // NaN: keep the top payload bits, force the quiet bit so it can never become Inf.
    return inf | (uint64_t{1} << (M - 1)) | (mant >> (52 - M));
  }
  if (exp == 0) return round_to_format(negative, mant, -1074, fmt);  // zero or subnormal
  return round_to_format(negative, mant | (uint64_t{1} << 52), exp - 1075, fmt);
}

double format_bits_to_double(uint64_t bits, FloatFormat fmt) {
  const int M = fmt.mant_bits;
  const int E = fmt.exp_bits;
  const bool negative = ((bits >> (E + M)) & 1) != 0;
  const int exp = static_cast<int>((bits >> M) & ((uint64_t{1} << E) - 1));
  const uint64_t mant = bits & ((uint64_t{1} << M) - 1);
  const int bias = (1 << (E - 1)) - 1;
  uint64_t out;
  if (exp == (1 << E) - 1) {  // Inf or NaN: keep the payload bits as they are
    out = (static_cast<uint64_t>(negative) << 63) | (uint64_t{0x7FF} << 52) | (mant << (52 - M));
  } else if (exp == 0) {  // zero or subnormal: mant * 2^(1 - bias - M), exact in double
    out = round_to_format(negative, mant, 1 - bias - M, kF64Format);
  } else {  // normal: every normal of a narrower format is a normal double; re-bias, widen
    out = (static_cast<uint64_t>(negative) << 63) |
          (static_cast<uint64_t>(exp - bias + 1023) << 52) | (mant << (52 - M));
  }
  return std::bit_cast<double>(out);
}

}  // namespace detail

// float -> double is exact, so rounding the double once is rounding the float once.
uint16_t float_to_f16_bits(float f) {
  return static_cast<uint16_t>(detail::double_to_format_bits(f, detail::kF16Format));
}
uint16_t double_to_f16_bits(double d) {
  return static_cast<uint16_t>(detail::double_to_format_bits(d, detail::kF16Format));
}
uint16_t float_to_bf16_bits(float f) {
  return static_cast<uint16_t>(detail::double_to_format_bits(f, detail::kBF16Format));
}
uint16_t double_to_bf16_bits(double d) {
  return static_cast<uint16_t>(detail::double_to_format_bits(d, detail::kBF16Format));
}

float f16_bits_to_float(uint16_t h) {
  // Widening is exact; NaN payloads (signalling or not) are kept bit for bit.
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  uint32_t out;
  if (exp == 0x1F) {
    out = sign | 0x7F800000u | (mant << 13);
  } else if (exp == 0) {  // zero or subnormal: mant * 2^-24, normal in f32
    out = static_cast<uint32_t>(detail::round_to_format(sign != 0, mant, -24, detail::kF32Format));
  } else {
    out = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(out);
}

float bf16_bits_to_float(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);  // bf16 is the top half of f32
}

}  // namespace pallas
