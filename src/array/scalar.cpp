// pallas::Scalar: exact storage of one value of any dtype, and the `convert` rules.
#include <bit>
#include <charconv>
#include <cfenv>
#include <cmath>
#include <limits>
#include <type_traits>

#include "array/float_format.h"
#include "pallas/dtype.h"
#include "pallas/error.h"

namespace pallas {
namespace {

using detail::FloatFormat;

FloatFormat format_of(DType t) {
  switch (t) {
    case DType::F16: return detail::kF16Format;
    case DType::BF16: return detail::kBF16Format;
    case DType::F32: return detail::kF32Format;
    case DType::F64: return detail::kF64Format;
    default: break;
  }
  throw InternalError("format_of: not a float dtype: " + std::string(dtype_name(t)));
}

// Rounds `v` to the float dtype t and returns the (exact) double value of the result.
double round_to_dtype(double v, DType t) {
  if (t == DType::F64) return v;
  // IEEE-754 specifies double -> float conversion exactly (in the default rounding, to nearest,
  // ties to even), so the hardware's is round_to_format's, several times faster — where the
  // result is a normal float: subnormal results are what flush-to-zero (-ffast-math in the
  // program) changes, values past FLT_MAX would be an undefined cast, and another rounding mode
  // set with fesetround changes every inexact result. Those, and NaNs (their payload and quiet
  // bit), keep the portable path, which depends on none of it.
  if (t == DType::F32) {
    constexpr double kMinNormal = 0x1p-126, kMaxFinite = 0x1.fffffep127;
    const double magnitude = std::fabs(v);
    if (magnitude >= kMinNormal && magnitude <= kMaxFinite && std::fegetround() == FE_TONEAREST)
      return static_cast<float>(v);
    if (v == 0) return v;  // (exact, either sign)
  }
  const FloatFormat fmt = format_of(t);
  return detail::format_bits_to_double(detail::double_to_format_bits(v, fmt), fmt);
}

// Two's complement truncation of a 64-bit pattern to the integer dtype t.
Scalar wrap_to(uint64_t bits, DType t) {
  const int w = bit_width(t);
  if (is_unsigned_int(t)) {
    return Scalar::of_uint(w == 64 ? bits : bits & ((uint64_t{1} << w) - 1), t);
  }
  if (w == 64) return Scalar::of_int(static_cast<int64_t>(bits), t);  // modular since C++20
  const uint64_t mask = (uint64_t{1} << w) - 1;
  uint64_t low = bits & mask;
  if (low & (uint64_t{1} << (w - 1))) low |= ~mask;  // sign-extend
  return Scalar::of_int(static_cast<int64_t>(low), t);
}

// The shortest decimal text that reads back (through Scalar::parse) as the same value of
// the 16-bit format `fmt`. std::to_chars only knows float and double, so try increasing
// precision; then print the double nearest that decimal in shortest form, so that 10000
// prints as "10000" rather than "1e+04".
std::string shortest_for_format(double v, FloatFormat fmt) {
  const uint64_t target = detail::double_to_format_bits(v, fmt);
  char buf[64];
  for (int digits = 1; digits <= 17; ++digits) {
    auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific, digits - 1);
    double back = 0;
    std::from_chars(buf, r.ptr, back);
    if (detail::double_to_format_bits(back, fmt) == target) {
      r = std::to_chars(buf, buf + sizeof buf, back);
      return std::string(buf, r.ptr);
    }
  }
  auto r = std::to_chars(buf, buf + sizeof buf, v);  // unreachable: 17 digits round-trip a double
  return std::string(buf, r.ptr);
}

[[noreturn]] void bad_literal(std::string_view text, DType t, const std::string& why) {
  throw Error("Scalar::parse: '" + std::string(text) + "' is not a valid " +
              std::string(dtype_name(t)) + " literal" + (why.empty() ? "" : " (" + why + ")"));
}

}  // namespace

Scalar Scalar::from_double(double v, DType t) {
  if (t == DType::Bool) return of_int(v != 0 ? 1 : 0, t);  // NaN != 0: true
  if (is_float(t)) return of_float(round_to_dtype(v, t), t);
  // float -> int: truncate toward zero; NaN -> 0; out of range saturates to the type's
  // min / max (as XLA's convert). Comparisons are done in double before any cast, so no
  // out-of-range float -> int cast (undefined behaviour) is ever evaluated.
  if (std::isnan(v)) return is_unsigned_int(t) ? of_uint(0, t) : of_int(0, t);
  const int w = bit_width(t);
  const double tv = std::trunc(v);
  if (is_unsigned_int(t)) {
    if (tv <= 0) return of_uint(0, t);
    if (tv >= std::ldexp(1.0, w))  // 2^w, exact in double
      return of_uint(w == 64 ? ~uint64_t{0} : (uint64_t{1} << w) - 1, t);
    return of_uint(static_cast<uint64_t>(tv), t);
  }
  const double limit = std::ldexp(1.0, w - 1);  // 2^(w-1): max + 1, and -min
  if (tv >= limit) return of_int(static_cast<int64_t>((uint64_t{1} << (w - 1)) - 1), t);
  if (tv < -limit) return of_int(-static_cast<int64_t>((uint64_t{1} << (w - 1)) - 1) - 1, t);
  return of_int(static_cast<int64_t>(tv), t);
}

Scalar Scalar::convert_to(DType t) const {
  if (is_float(dtype)) return from_double(f, t);
  // Integer or bool source: a 64-bit two's complement pattern, plus sign and magnitude.
  const bool is_unsigned = is_unsigned_int(dtype);
  const uint64_t bits = is_unsigned ? u : static_cast<uint64_t>(i);
  const bool negative = !is_unsigned && i < 0;
  const uint64_t magnitude = negative ? 0 - bits : bits;  // unsigned negation: no overflow
  if (t == DType::Bool) return of_int(bits != 0 ? 1 : 0, t);
  if (is_float(t)) {
    // Round the exact integer once (int64 -> double -> f32 could round twice).
    const FloatFormat fmt = format_of(t);
    return of_float(
        detail::format_bits_to_double(detail::round_to_format(negative, magnitude, 0, fmt), fmt),
        t);
  }
  return wrap_to(bits, t);
}

double Scalar::as_double() const {
  if (is_float(dtype)) return f;
  if (is_unsigned_int(dtype)) return static_cast<double>(u);
  return static_cast<double>(i);
}

int64_t Scalar::as_int64() const {
  if (is_float(dtype)) return from_double(f, DType::I64).i;  // truncates, saturates, NaN -> 0
  if (is_unsigned_int(dtype)) return static_cast<int64_t>(u);  // wraps above INT64_MAX
  return i;
}

void Scalar::store_to(void* dst) const {
  visit_dtype(dtype, [&]<class T>() {
    T v;
    if constexpr (std::is_same_v<T, bool>) {
      v = i != 0;
    } else if constexpr (std::is_same_v<T, float16>) {
      v = float16::from_bits(double_to_f16_bits(f));
    } else if constexpr (std::is_same_v<T, bfloat16>) {
      v = bfloat16::from_bits(double_to_bf16_bits(f));
    } else if constexpr (std::is_same_v<T, float>) {
      // Not a plain cast: a double outside float's range would make the cast undefined.
      v = std::bit_cast<float>(
          static_cast<uint32_t>(detail::double_to_format_bits(f, detail::kF32Format)));
    } else if constexpr (std::is_same_v<T, double>) {
      v = f;
    } else if constexpr (std::is_unsigned_v<T>) {
      v = static_cast<T>(u);  // keeps the low bits
    } else {
      v = static_cast<T>(i);  // modular since C++20
    }
    std::memcpy(dst, &v, sizeof(T));
  });
}

Scalar Scalar::load_from(const void* src, DType t) {
  return visit_dtype(t, [&]<class T>() -> Scalar {
    if constexpr (std::is_same_v<T, bool>) {
      uint8_t byte;  // read the byte: a bool object holding 2..255 would be undefined
      std::memcpy(&byte, src, 1);
      return of_int(byte != 0 ? 1 : 0, t);
    } else {
      T v;
      std::memcpy(&v, src, sizeof(T));
      if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
        return of_float(static_cast<double>(v), t);
      } else if constexpr (std::is_floating_point_v<T>) {
        return of_float(v, t);
      } else if constexpr (std::is_unsigned_v<T>) {
        return of_uint(v, t);
      } else {
        return of_int(v, t);
      }
    }
  });
}

std::string Scalar::to_string() const {
  if (dtype == DType::Bool) return i != 0 ? "true" : "false";
  if (is_unsigned_int(dtype)) return std::to_string(u);
  if (!is_float(dtype)) return std::to_string(i);
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  std::to_chars_result r;
  switch (dtype) {
    case DType::F64: r = std::to_chars(buf, buf + sizeof buf, f); break;
    case DType::F32:
      r = std::to_chars(buf, buf + sizeof buf,
                        std::bit_cast<float>(static_cast<uint32_t>(
                            detail::double_to_format_bits(f, detail::kF32Format))));
      break;
    default: return shortest_for_format(f, format_of(dtype));
  }
  return std::string(buf, r.ptr);
}

Scalar Scalar::parse(std::string_view text, DType t) {
  std::string_view s = text;
  if (t == DType::Bool) {
    if (s == "true" || s == "1") return of_int(1, t);
    if (s == "false" || s == "0") return of_int(0, t);
    bad_literal(text, t, "expected true or false");
  }
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  if (s.empty() || s[0] == '+') bad_literal(text, t, "");
  const char* first = s.data();
  const char* last = s.data() + s.size();
  if (is_float(t)) {
    std::from_chars_result r;
    double v = 0;
    if (t == DType::F32) {
      float fv = 0;  // read as float directly: decimal -> double -> float could round twice
      r = std::from_chars(first, last, fv);
      v = fv;
    } else {
      r = std::from_chars(first, last, v);
    }
    if (r.ec == std::errc::result_out_of_range) bad_literal(text, t, "out of range");
    if (r.ec != std::errc() || r.ptr != last) bad_literal(text, t, "");
    return from_double(v, t);
  }
  const int w = bit_width(t);
  if (is_unsigned_int(t)) {
    uint64_t v = 0;
    auto r = std::from_chars(first, last, v);
    const uint64_t max = w == 64 ? ~uint64_t{0} : (uint64_t{1} << w) - 1;
    if (r.ec == std::errc() && r.ptr == last && v > max) r.ec = std::errc::result_out_of_range;
    if (r.ec == std::errc::result_out_of_range)
      bad_literal(text, t, "out of range [0, " + std::to_string(max) + "]");
    if (r.ec != std::errc() || r.ptr != last) bad_literal(text, t, "");
    return of_uint(v, t);
  }
  int64_t v = 0;
  auto r = std::from_chars(first, last, v);
  const int64_t max = static_cast<int64_t>((uint64_t{1} << (w - 1)) - 1);
  const int64_t min = -max - 1;
  if (r.ec == std::errc() && r.ptr == last && (v > max || v < min))
    r.ec = std::errc::result_out_of_range;
  if (r.ec == std::errc::result_out_of_range)
    bad_literal(text, t,
                "out of range [" + std::to_string(min) + ", " + std::to_string(max) + "]");
  if (r.ec != std::errc() || r.ptr != last) bad_literal(text, t, "");
  return of_int(v, t);
}

bool Scalar::bitwise_equal(const Scalar& o) const {
  // All members of the union are 8 bytes: compare the representation.
  return dtype == o.dtype && u == o.u;
}

}  // namespace pallas
