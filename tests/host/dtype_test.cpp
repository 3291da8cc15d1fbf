// dtype table, f16 / bf16 bit-exact conversions, and Scalar (convert rules, text form).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "pallas/dtype.h"
#include "pallas/error.h"

namespace pallas {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

float bits_to_float(uint32_t b) { return std::bit_cast<float>(b); }
uint32_t float_bits(float f) { return std::bit_cast<uint32_t>(f); }

// Reference decoders written from the format definitions (not from the code under test).
double f16_value(uint16_t h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const double mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -mag : mag;
}
double bf16_value(uint16_t b) {
  const int e = (b >> 7) & 0xFF, m = b & 0x7F;
  const double mag = e == 0 ? std::ldexp(m, -133) : std::ldexp(128 + m, e - 134);
  return (b & 0x8000) ? -mag : mag;
}
bool is_f16_nan(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0; }
bool is_bf16_nan(uint16_t b) { return (b & 0x7F80) == 0x7F80 && (b & 0x7F) != 0; }

// ---- dtype table --------------------------------------------------------------------------

TEST(Dtype, SizesAndNames) {
  EXPECT_EQ(itemsize(bool_), 1);
  EXPECT_EQ(itemsize(i8), 1);
  EXPECT_EQ(itemsize(i16), 2);
  EXPECT_EQ(itemsize(u32), 4);
  EXPECT_EQ(itemsize(i64), 8);
  EXPECT_EQ(itemsize(f16), 2);
  EXPECT_EQ(itemsize(bf16), 2);
  EXPECT_EQ(itemsize(f32), 4);
  EXPECT_EQ(itemsize(f64), 8);
  EXPECT_EQ(itemsize(DType::Semaphore), 4);
  EXPECT_EQ(dtype_name(f32), "f32");
  EXPECT_EQ(dtype_name(bf16), "bf16");
  EXPECT_EQ(dtype_name(bool_), "bool");
  EXPECT_EQ(dtype_name(DType::DmaSemaphore), "dma_semaphore");
  EXPECT_EQ(bit_width(f16), 16);
  EXPECT_EQ(bit_width(u64), 64);
  EXPECT_EQ(bit_width(bool_), 8);
}

TEST(Dtype, ParseNamesAndAliases) {
  for (int k = 0; k < kNumDTypes; ++k) {
    const auto t = static_cast<DType>(k);
    EXPECT_EQ(parse_dtype(dtype_name(t)), t) << dtype_name(t);
  }
  EXPECT_EQ(parse_dtype("float32"), f32);
  EXPECT_EQ(parse_dtype("bfloat16"), bf16);
  EXPECT_EQ(parse_dtype("float16"), f16);
  EXPECT_EQ(parse_dtype("int8"), i8);
  EXPECT_EQ(parse_dtype("uint64"), u64);
  EXPECT_EQ(parse_dtype("float64"), f64);
  try {
    parse_dtype("float128");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'float128'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
}

TEST(Dtype, Predicates) {
  EXPECT_TRUE(is_float(bf16));
  EXPECT_FALSE(is_float(i32));
  EXPECT_TRUE(is_integer(u8));
  EXPECT_FALSE(is_integer(bool_));
  EXPECT_FALSE(is_integer(DType::Semaphore));
  EXPECT_TRUE(is_signed_int(i64));
  EXPECT_FALSE(is_signed_int(u64));
  EXPECT_TRUE(is_unsigned_int(u16));
  EXPECT_TRUE(is_semaphore(DType::BarrierSemaphore));
  EXPECT_FALSE(is_semaphore(i32));
}

TEST(Dtype, ErrorLocation) {
  EXPECT_EQ(SourceLoc("/a/b/kernel.cc", 12).to_string(), "kernel.cc:12");
  EXPECT_EQ(SourceLoc().to_string(), "<unknown>");
  Error e("bad thing", SourceLoc("/x/y.cc", 3));
  EXPECT_STREQ(e.what(), "bad thing (at y.cc:3)");
  EXPECT_EQ(e.location().line, 3);
  EXPECT_STREQ(Error("plain", SourceLoc()).what(), "plain");
}

// ---- float16 --------------------------------------------------------------------------------

TEST(Dtype, F16FromFloatBitPatterns) {
  EXPECT_EQ(float_to_f16_bits(1.0f), 0x3C00);
  EXPECT_EQ(float_to_f16_bits(-2.0f), 0xC000);
  EXPECT_EQ(float_to_f16_bits(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_f16_bits(65519.0f), 0x7BFF);
  EXPECT_EQ(float_to_f16_bits(65520.0f), 0x7C00);  // the midpoint to 2^16 rounds to inf
  EXPECT_EQ(float_to_f16_bits(1e10f), 0x7C00);
  EXPECT_EQ(float_to_f16_bits(-1e10f), 0xFC00);
  EXPECT_EQ(float_to_f16_bits(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(float_to_f16_bits(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_EQ(float_to_f16_bits(0.0f), 0x0000);
  EXPECT_EQ(float_to_f16_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.0f, -25)), 0x0000);  // tie, to even (0)
  EXPECT_EQ(float_to_f16_bits(-std::ldexp(1.0f, -25)), 0x8000);
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.0f, -25) * 1.0000001f), 0x0001);
  EXPECT_EQ(float_to_f16_bits(std::ldexp(3.0f, -25)), 0x0002);  // tie, to even (2)
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25)), 0x0400);
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.0f, -40)), 0x0000);
  // Midpoints around 0x3C01 (1 + 2^-10): ties go to the even neighbour both ways.
  EXPECT_EQ(float_to_f16_bits(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  EXPECT_EQ(float_to_f16_bits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_EQ(float_to_f16_bits(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3C01);
  EXPECT_EQ(float_to_f16_bits(1.0f + 3 * std::ldexp(1.0f, -11) - std::ldexp(1.0f, -20)), 0x3C01);
  EXPECT_EQ(float_to_f16_bits(0.1f), 0x2E66);
}

TEST(Dtype, F16NaN) {
  const uint16_t h = float_to_f16_bits(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(is_f16_nan(h)) << std::hex << h;
  EXPECT_TRUE(h & 0x0200) << "quiet bit";
  EXPECT_FALSE(h & 0x8000);
  EXPECT_TRUE(float_to_f16_bits(-std::numeric_limits<float>::quiet_NaN()) & 0x8000);
  // A NaN whose payload lives only in low bits must not turn into Inf.
  const uint16_t low = float_to_f16_bits(bits_to_float(0x7F800001u));
  EXPECT_TRUE(is_f16_nan(low)) << std::hex << low;
  const uint16_t d = double_to_f16_bits(std::bit_cast<double>(0x7FF0000000000001ull));
  EXPECT_TRUE(is_f16_nan(d)) << std::hex << d;
  EXPECT_TRUE(std::isnan(f16_bits_to_float(0x7E00)));
  EXPECT_TRUE(std::isnan(f16_bits_to_float(0xFC01)));
}

TEST(Dtype, F16FromDoubleRoundsOnce) {
  // 1 + 2^-11 + 2^-40 is just above the midpoint between 0x3C00 and 0x3C01. Rounding to float
  // first drops the 2^-40 and leaves an exact tie, which would then go to 0x3C00.
  const double d = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  EXPECT_EQ(double_to_f16_bits(d), 0x3C01);
  EXPECT_EQ(float_to_f16_bits(static_cast<float>(d)), 0x3C00);  // the double-rounding trap
  // Float rounding would give 65520 (-> inf); the double is below the midpoint.
  EXPECT_EQ(double_to_f16_bits(65519.999), 0x7BFF);
  EXPECT_EQ(double_to_f16_bits(65520.0), 0x7C00);
  EXPECT_EQ(double_to_f16_bits(std::ldexp(1.0, -25) + std::ldexp(1.0, -60)), 0x0001);
  EXPECT_EQ(double_to_f16_bits(std::ldexp(1.0, -25)), 0x0000);
  EXPECT_EQ(double_to_f16_bits(-0.0), 0x8000);
  EXPECT_EQ(double_to_f16_bits(1e300), 0x7C00);
  EXPECT_EQ(double_to_f16_bits(-1e300), 0xFC00);
  EXPECT_EQ(double_to_f16_bits(4.9e-324), 0x0000);  // double subnormal
  EXPECT_EQ(double_to_f16_bits(-4.9e-324), 0x8000);
  EXPECT_EQ(double_to_f16_bits(0.1), 0x2E66);
  EXPECT_EQ(double_to_f16_bits(1.0 / 3), 0x3555);
}

TEST(Dtype, F16ToFloat) {
  EXPECT_EQ(f16_bits_to_float(0x3C00), 1.0f);
  EXPECT_EQ(f16_bits_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_bits_to_float(0x03FF), std::ldexp(1023.0f, -24));
  EXPECT_EQ(f16_bits_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(f16_bits_to_float(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(float_bits(f16_bits_to_float(0x8000)), 0x80000000u);
  EXPECT_EQ(f16_bits_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(static_cast<double>(float16::from_bits(0xC000)), -2.0);
  EXPECT_EQ(float16(1.0).bits, 0x3C00);
  EXPECT_EQ(float16(65520.0f).bits, 0x7C00);
}

// Every f16 pattern decodes to the value given by the format definition, and encodes back.
TEST(Dtype, F16ExhaustiveRoundTrip) {
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const auto h = static_cast<uint16_t>(b);
    const float f = f16_bits_to_float(h);
    if (is_f16_nan(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << b;
      const uint16_t back = float_to_f16_bits(f);
      ASSERT_TRUE(is_f16_nan(back)) << std::hex << b;
      ASSERT_EQ(back & 0x8000, h & 0x8000) << std::hex << b;
      ASSERT_TRUE(is_f16_nan(double_to_f16_bits(f))) << std::hex << b;
      continue;
    }
    if ((h & 0x7FFF) == 0x7C00) {
      ASSERT_TRUE(std::isinf(f)) << std::hex << b;
    } else {
      ASSERT_EQ(static_cast<double>(f), f16_value(h)) << std::hex << b;
    }
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << b;
    ASSERT_EQ(float_to_f16_bits(f), h) << std::hex << b;
    ASSERT_EQ(double_to_f16_bits(f), h) << std::hex << b;
  }
}

// For every pair of adjacent finite f16 values (and the largest one next to 2^16, the
// overflow threshold), the exact midpoint goes to the even one and anything off the midpoint
// to the nearer one.
TEST(Dtype, F16AllMidpoints) {
  for (uint16_t h = 0; h < 0x7C00; ++h) {
    const uint16_t even = (h & 1) ? h + 1 : h;
    const double lo = f16_value(h), hi = f16_value(h + 1);  // f16_value(0x7C00) == 65536
    const double mid = (lo + hi) / 2;                        // exact in float and double
    ASSERT_EQ(double_to_f16_bits(mid), even) << std::hex << h;
    ASSERT_EQ(float_to_f16_bits(static_cast<float>(mid)), even) << std::hex << h;
    ASSERT_EQ(double_to_f16_bits(std::nextafter(mid, 0.0)), h) << std::hex << h;
    ASSERT_EQ(double_to_f16_bits(std::nextafter(mid, kInf)), h + 1) << std::hex << h;
    ASSERT_EQ(float_to_f16_bits(std::nextafter(static_cast<float>(mid), 0.0f)), h);
    ASSERT_EQ(float_to_f16_bits(std::nextafter(static_cast<float>(mid), 1e30f)), h + 1);
    ASSERT_EQ(double_to_f16_bits(-mid), even | 0x8000) << std::hex << h;
  }
}

// ---- bfloat16 ----------------------------------------------------------------------------

TEST(Dtype, BF16FromFloatBitPatterns) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16_bits(-1.0f), 0xBF80);
  EXPECT_EQ(float_to_bf16_bits(bits_to_float(0x3F808000u)), 0x3F80);  // tie, to even
  EXPECT_EQ(float_to_bf16_bits(bits_to_float(0x3F808001u)), 0x3F81);
  EXPECT_EQ(float_to_bf16_bits(bits_to_float(0x3F818000u)), 0x3F82);  // tie, to even
  EXPECT_EQ(float_to_bf16_bits(bits_to_float(0x3F817FFFu)), 0x3F81);
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::max()), 0x7F80);  // RNE overflows
  EXPECT_EQ(float_to_bf16_bits(-std::numeric_limits<float>::max()), 0xFF80);
  EXPECT_EQ(float_to_bf16_bits(bits_to_float(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::quiet_NaN()), 0x7FC0);
  EXPECT_EQ(float_to_bf16_bits(-std::numeric_limits<float>::quiet_NaN()), 0xFFC0);
  // Low-payload NaNs would round to Inf with a naive "add 0x7FFF and shift".
  EXPECT_TRUE(is_bf16_nan(float_to_bf16_bits(bits_to_float(0x7F800001u))));
  EXPECT_TRUE(is_bf16_nan(float_to_bf16_bits(bits_to_float(0x7FFFFFFFu))));
  EXPECT_EQ(float_to_bf16_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16_bits(std::ldexp(1.0f, -133)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_bf16_bits(std::ldexp(1.0f, -134)), 0x0000);  // tie, to even
  EXPECT_EQ(float_to_bf16_bits(std::ldexp(3.0f, -134)), 0x0002);
  EXPECT_EQ(float_to_bf16_bits(1.0f / 3), 0x3EAB);
}

TEST(Dtype, BF16FromDoubleRoundsOnce) {
  // 1 + 2^-8 is the midpoint between 0x3F80 and 0x3F81; + 2^-40 lifts it above. Rounding to
  // float first would lose the 2^-40 and tie to 0x3F80.
  const double d = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  EXPECT_EQ(double_to_bf16_bits(d), 0x3F81);
  EXPECT_EQ(float_to_bf16_bits(static_cast<float>(d)), 0x3F80);
  EXPECT_EQ(double_to_bf16_bits(1e300), 0x7F80);
  EXPECT_EQ(double_to_bf16_bits(-1e-300), 0x8000);
  EXPECT_EQ(double_to_bf16_bits(kNaN), 0x7FC0);
  EXPECT_EQ(double_to_bf16_bits(1.0), 0x3F80);
  EXPECT_EQ(bfloat16(1.0).bits, 0x3F80);
  EXPECT_EQ(static_cast<float>(bfloat16::from_bits(0x4049)), 3.140625f);
}

TEST(Dtype, BF16ExhaustiveRoundTrip) {
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const auto h = static_cast<uint16_t>(b);
    const float f = bf16_bits_to_float(h);
    EXPECT_EQ(float_bits(f), b << 16);
    if (is_bf16_nan(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << b;
      const uint16_t back = float_to_bf16_bits(f);
      ASSERT_TRUE(is_bf16_nan(back)) << std::hex << b;
      ASSERT_EQ(back & 0x8000, h & 0x8000) << std::hex << b;
      continue;
    }
    if ((h & 0x7FFF) != 0x7F80) {
      ASSERT_EQ(static_cast<double>(f), bf16_value(h)) << std::hex << b;
    }
    ASSERT_EQ(float_to_bf16_bits(f), h) << std::hex << b;
    ASSERT_EQ(double_to_bf16_bits(f), h) << std::hex << b;
  }
}

TEST(Dtype, BF16AllMidpoints) {
  for (uint16_t h = 0; h < 0x7F80; ++h) {
    const uint16_t even = (h & 1) ? h + 1 : h;
    const double lo = bf16_value(h), hi = bf16_value(h + 1);  // bf16_value(0x7F80) == 2^128
    const double mid = (lo + hi) / 2;
    ASSERT_EQ(double_to_bf16_bits(mid), even) << std::hex << h;
    ASSERT_EQ(double_to_bf16_bits(std::nextafter(mid, 0.0)), h) << std::hex << h;
    ASSERT_EQ(double_to_bf16_bits(std::nextafter(mid, kInf)), h + 1) << std::hex << h;
    if (mid < std::numeric_limits<float>::max()) {
      ASSERT_EQ(float_to_bf16_bits(static_cast<float>(mid)), even) << std::hex << h;
      ASSERT_EQ(float_to_bf16_bits(std::nextafter(static_cast<float>(mid), 0.0f)), h);
      ASSERT_EQ(float_to_bf16_bits(std::nextafter(static_cast<float>(mid), 1e38f * 10)), h + 1);
    }
  }
}

// ---- Scalar ------------------------------------------------------------------------------

TEST(Scalar, FloatToIntTruncatesAndSaturates) {
  EXPECT_EQ(Scalar::from_double(3.7, i32).i, 3);
  EXPECT_EQ(Scalar::from_double(-3.7, i32).i, -3);
  EXPECT_EQ(Scalar::from_double(1e10, i32).i, 2147483647);
  EXPECT_EQ(Scalar::from_double(-1e10, i32).i, -2147483648LL);
  EXPECT_EQ(Scalar::from_double(kNaN, i32).i, 0);
  EXPECT_EQ(Scalar::from_double(kInf, i8).i, 127);
  EXPECT_EQ(Scalar::from_double(-kInf, i8).i, -128);
  EXPECT_EQ(Scalar::from_double(127.99, i8).i, 127);
  EXPECT_EQ(Scalar::from_double(128.0, i8).i, 127);
  EXPECT_EQ(Scalar::from_double(-128.99, i8).i, -128);
  EXPECT_EQ(Scalar::from_double(-129.0, i8).i, -128);
  EXPECT_EQ(Scalar::from_double(-5.0, u8).u, 0u);
  EXPECT_EQ(Scalar::from_double(-0.9, u8).u, 0u);
  EXPECT_EQ(Scalar::from_double(300.0, u8).u, 255u);
  EXPECT_EQ(Scalar::from_double(255.9, u8).u, 255u);
  EXPECT_EQ(Scalar::from_double(kNaN, u16).u, 0u);
  EXPECT_EQ(Scalar::from_double(9223372036854775808.0, i64).i, INT64_MAX);  // 2^63
  EXPECT_EQ(Scalar::from_double(-9223372036854775808.0, i64).i, INT64_MIN);
  EXPECT_EQ(Scalar::from_double(-1e19, i64).i, INT64_MIN);
  EXPECT_EQ(Scalar::from_double(18446744073709551616.0, u64).u, UINT64_MAX);  // 2^64
  EXPECT_EQ(Scalar::from_double(1e19, u64).u, 10000000000000000000ull);
  EXPECT_EQ(Scalar::from_double(1e30, DType::Semaphore).i, 2147483647);
}

TEST(Scalar, ToBoolAndFromBool) {
  EXPECT_EQ(Scalar::from_double(kNaN, bool_).i, 1);
  EXPECT_EQ(Scalar::from_double(0.0, bool_).i, 0);
  EXPECT_EQ(Scalar::from_double(-0.0, bool_).i, 0);
  EXPECT_EQ(Scalar::from_double(0.25, bool_).i, 1);
  EXPECT_EQ(Scalar::of_int(256, i32).convert_to(bool_).i, 1);  // != 0, not truncation
  EXPECT_EQ(Scalar::of_int(1, bool_).convert_to(f32).f, 1.0);
  EXPECT_EQ(Scalar::of_int(1, bool_).convert_to(i64).i, 1);
  EXPECT_EQ(Scalar::of_int(0, bool_).convert_to(u8).u, 0u);
}

TEST(Scalar, FloatToFloatRoundsToNearestEven) {
  EXPECT_EQ(Scalar::from_double(0.1, f32).f, 0.100000001490116119384765625);
  EXPECT_EQ(Scalar::from_double(0.1, f16).f, 0.0999755859375);
  EXPECT_EQ(Scalar::from_double(0.1, bf16).f, 0.10009765625);
  EXPECT_EQ(Scalar::from_double(0.1, f64).f, 0.1);
  EXPECT_EQ(Scalar::from_double(1e300, f32).f, kInf);
  EXPECT_EQ(Scalar::from_double(-1e300, f32).f, -kInf);
  EXPECT_EQ(Scalar::from_double(1e-50, f32).f, 0.0);
  EXPECT_TRUE(std::signbit(Scalar::from_double(-1e-50, f32).f));
  EXPECT_TRUE(std::isnan(Scalar::from_double(kNaN, f16).f));
  EXPECT_EQ(Scalar::of_float(0.1, f64).convert_to(f32).f, 0.100000001490116119384765625);
  // double -> f16 in one rounding (see Dtype.F16FromDoubleRoundsOnce)
  EXPECT_EQ(Scalar::from_double(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40), f16).f,
            1.0 + std::ldexp(1.0, -10));
}

TEST(Scalar, IntToIntWraps) {
  EXPECT_EQ(Scalar::of_int(300, i32).convert_to(i8).i, 44);
  EXPECT_EQ(Scalar::of_int(128, i64).convert_to(i8).i, -128);
  EXPECT_EQ(Scalar::of_int(-1, i32).convert_to(u8).u, 255u);
  EXPECT_EQ(Scalar::of_int(-1, i8).convert_to(u64).u, UINT64_MAX);
  EXPECT_EQ(Scalar::of_uint(UINT64_MAX, u64).convert_to(i64).i, -1);
  EXPECT_EQ(Scalar::of_uint(0x12345678u, u32).convert_to(i16).i, 0x5678);
  EXPECT_EQ(Scalar::of_uint(0x8000u, u16).convert_to(i16).i, -32768);
  EXPECT_EQ(Scalar::of_int(INT64_MIN, i64).convert_to(i32).i, 0);
  EXPECT_EQ(Scalar::of_int(-70000, i32).convert_to(u16).u, 61072u);  // -70000 + 2*65536
}

TEST(Scalar, IntToFloatRoundsOnce) {
  EXPECT_EQ(Scalar::of_int(16777217, i32).convert_to(f32).f, 16777216.0);  // tie, to even
  EXPECT_EQ(Scalar::of_int(16777219, i32).convert_to(f32).f, 16777220.0);
  EXPECT_EQ(Scalar::of_int((int64_t{1} << 53) + 1, i64).convert_to(f64).f, 9007199254740992.0);
  EXPECT_EQ(Scalar::of_int((int64_t{1} << 53) + 3, i64).convert_to(f64).f, 9007199254740996.0);
  // 2^62 + 2^38 + 1 is just above the f32 midpoint 2^62 + 2^38; through double it would
  // become exactly the midpoint and tie down to 2^62.
  const int64_t v = (int64_t{1} << 62) + (int64_t{1} << 38) + 1;
  EXPECT_EQ(Scalar::of_int(v, i64).convert_to(f32).f, std::ldexp(1.0, 62) + std::ldexp(1.0, 39));
  EXPECT_EQ(Scalar::of_int(-v, i64).convert_to(f32).f, -(std::ldexp(1.0, 62) + std::ldexp(1.0, 39)));
  EXPECT_EQ(Scalar::of_uint(UINT64_MAX, u64).convert_to(f32).f, std::ldexp(1.0, 64));
  EXPECT_EQ(Scalar::of_int(INT64_MIN, i64).convert_to(f64).f, -std::ldexp(1.0, 63));
  EXPECT_EQ(Scalar::of_int(70000, i32).convert_to(f16).f, kInf);
  EXPECT_EQ(Scalar::of_int(2049, i32).convert_to(f16).f, 2048.0);  // tie, to even
  EXPECT_EQ(Scalar::of_int(-3, i8).convert_to(bf16).f, -3.0);
  EXPECT_EQ(Scalar::of_int(0, i8).convert_to(f32).f, 0.0);
  EXPECT_FALSE(std::signbit(Scalar::of_int(0, i8).convert_to(f32).f));
}

TEST(Scalar, AsDoubleAndInt64) {
  EXPECT_EQ(Scalar::of_uint(UINT64_MAX, u64).as_double(), std::ldexp(1.0, 64));
  EXPECT_EQ(Scalar::of_int(-7, i8).as_double(), -7.0);
  EXPECT_EQ(Scalar::of_float(-2.9, f64).as_int64(), -2);
  EXPECT_EQ(Scalar::of_float(1e30, f64).as_int64(), INT64_MAX);
  EXPECT_EQ(Scalar::of_float(kNaN, f32).as_int64(), 0);
  EXPECT_EQ(Scalar::of_int(1, bool_).as_int64(), 1);
}

TEST(Scalar, StoreAndLoad) {
  unsigned char buf[8] = {};
  Scalar::from_double(1.0, f16).store_to(buf);
  uint16_t h;
  std::memcpy(&h, buf, 2);
  EXPECT_EQ(h, 0x3C00);
  Scalar::from_double(1.0, bf16).store_to(buf);
  std::memcpy(&h, buf, 2);
  EXPECT_EQ(h, 0x3F80);
  Scalar::from_double(-2.0, i16).store_to(buf);
  int16_t s16;
  std::memcpy(&s16, buf, 2);
  EXPECT_EQ(s16, -2);
  Scalar::from_double(0.5, f32).store_to(buf);
  float f;
  std::memcpy(&f, buf, 4);
  EXPECT_EQ(f, 0.5f);
  unsigned char b = 2;  // not a canonical bool byte: still reads as true
  EXPECT_EQ(Scalar::load_from(&b, bool_).i, 1);
  const uint16_t nan_bits = 0x7E00;
  EXPECT_TRUE(std::isnan(Scalar::load_from(&nan_bits, f16).f));
  const uint64_t big = UINT64_MAX;
  EXPECT_EQ(Scalar::load_from(&big, u64).u, UINT64_MAX);
  const int8_t neg = -5;
  EXPECT_EQ(Scalar::load_from(&neg, i8).i, -5);
}

TEST(Scalar, BitwiseEqual) {
  EXPECT_TRUE(Scalar::of_float(kNaN, f32).bitwise_equal(Scalar::of_float(kNaN, f32)));
  EXPECT_FALSE(Scalar::of_float(0.0, f32).bitwise_equal(Scalar::of_float(-0.0, f32)));
  EXPECT_FALSE(Scalar::of_int(1, i32).bitwise_equal(Scalar::of_int(1, i64)));
  EXPECT_TRUE(Scalar::of_int(-1, i64).bitwise_equal(Scalar::of_int(-1, i64)));
}

TEST(Scalar, ToString) {
  EXPECT_EQ(Scalar::from_double(0.1, f32).to_string(), "0.1");
  EXPECT_EQ(Scalar::from_double(0.1, f64).to_string(), "0.1");
  EXPECT_EQ(Scalar::from_double(1.0 / 3, f32).to_string(), "0.33333334");
  EXPECT_EQ(Scalar::from_double(1.0 / 3, f64).to_string(), "0.3333333333333333");
  EXPECT_EQ(Scalar::from_double(1.0 / 3, f16).to_string(), "0.3333");
  EXPECT_EQ(Scalar::from_double(1.0 / 3, bf16).to_string(), "0.334");
  EXPECT_EQ(Scalar::from_double(0.1, f16).to_string(), "0.1");
  EXPECT_EQ(Scalar::from_double(65504, f16).to_string(), "65500");
  EXPECT_EQ(Scalar::from_double(10000, f16).to_string(), "10000");
  EXPECT_EQ(Scalar::from_double(1.5, bf16).to_string(), "1.5");
  EXPECT_EQ(Scalar::from_double(-0.0, f32).to_string(), "-0");
  EXPECT_EQ(Scalar::from_double(1e300, f64).to_string(), "1e+300");
  EXPECT_EQ(Scalar::from_double(kInf, f16).to_string(), "inf");
  EXPECT_EQ(Scalar::from_double(-kInf, f32).to_string(), "-inf");
  EXPECT_EQ(Scalar::from_double(kNaN, bf16).to_string(), "nan");
  EXPECT_EQ(Scalar::from_double(-kNaN, f64).to_string(), "nan");
  EXPECT_EQ(Scalar::of_int(-128, i8).to_string(), "-128");
  EXPECT_EQ(Scalar::of_uint(UINT64_MAX, u64).to_string(), "18446744073709551615");
  EXPECT_EQ(Scalar::of_int(INT64_MIN, i64).to_string(), "-9223372036854775808");
  EXPECT_EQ(Scalar::of_int(1, bool_).to_string(), "true");
  EXPECT_EQ(Scalar::of_int(0, bool_).to_string(), "false");
}

TEST(Scalar, Parse) {
  EXPECT_EQ(Scalar::parse("1.5", f32).f, 1.5);
  EXPECT_EQ(Scalar::parse("+2", i32).i, 2);
  EXPECT_EQ(Scalar::parse("-128", i8).i, -128);
  EXPECT_EQ(Scalar::parse("255", u8).u, 255u);
  EXPECT_EQ(Scalar::parse("18446744073709551615", u64).u, UINT64_MAX);
  EXPECT_EQ(Scalar::parse("-9223372036854775808", i64).i, INT64_MIN);
  EXPECT_EQ(Scalar::parse("1e-3", f64).f, 0.001);
  EXPECT_EQ(Scalar::parse("0.1", f32).f, 0.100000001490116119384765625);
  EXPECT_EQ(Scalar::parse("0.1", f16).f, 0.0999755859375);
  EXPECT_EQ(Scalar::parse("inf", f16).f, kInf);
  EXPECT_EQ(Scalar::parse("-inf", bf16).f, -kInf);
  EXPECT_TRUE(std::isnan(Scalar::parse("nan", f32).f));
  EXPECT_TRUE(std::isnan(Scalar::parse("-nan", f64).f));
  EXPECT_EQ(Scalar::parse("70000", f16).f, kInf);  // rounds like convert
  EXPECT_EQ(Scalar::parse("true", bool_).i, 1);
  EXPECT_EQ(Scalar::parse("false", bool_).i, 0);
  EXPECT_EQ(Scalar::parse("7", DType::Semaphore).i, 7);
  EXPECT_EQ(Scalar::parse("1.5", f32).dtype, f32);
  // Decimal -> f32 rounds once: 1 + 2^-24 + 2^-60 in decimal is above the f32 midpoint.
  EXPECT_EQ(Scalar::parse("1.000000059604644776257986737988403547205962240695953369140625", f32).f,
            1.0 + std::ldexp(1.0, -23));
  for (auto [text, t] : std::initializer_list<std::pair<const char*, DType>>{
           {"-129", i8}, {"128", i8}, {"256", u8}, {"-1", u8}, {"9223372036854775808", i64},
           {"abc", f32}, {"1.5x", f32}, {"", f32}, {"", i32}, {" 1", i32}, {"1.5", i32},
           {"++1", i32}, {"maybe", bool_}, {"1e400", f64}, {"0x10", i32}}) {
    try {
      Scalar::parse(text, t);
      ADD_FAILURE() << "no error for '" << text << "' as " << dtype_name(t);
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("'" + std::string(text) + "'"), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::string(dtype_name(t))), std::string::npos) << msg;
    }
  }
}

// to_string -> parse gives back the same bits, for random values of every float dtype and
// for every f16 / bf16 pattern.
TEST(Scalar, TextRoundTrip) {
  std::mt19937_64 gen(42);
  std::uniform_real_distribution<double> mant(-1.0, 1.0);
  std::uniform_int_distribution<int> exp(-160, 160);
  for (DType t : {f16, bf16, f32, f64}) {
    for (int k = 0; k < 20000; ++k) {
      const Scalar s = Scalar::from_double(std::ldexp(mant(gen), exp(gen)), t);
      const std::string text = s.to_string();
      const Scalar back = Scalar::parse(text, t);
      ASSERT_TRUE(back.bitwise_equal(s)) << dtype_name(t) << " " << text;
    }
  }
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const auto h = static_cast<uint16_t>(b);
    for (DType t : {f16, bf16}) {
      if (t == f16 ? is_f16_nan(h) : is_bf16_nan(h)) continue;
      const Scalar s = Scalar::load_from(&h, t);
      const Scalar back = Scalar::parse(s.to_string(), t);
      uint16_t out = 0;
      back.store_to(&out);
      ASSERT_EQ(out, h) << dtype_name(t) << " " << s.to_string();
    }
  }
}

}  // namespace
}  // namespace pallas
