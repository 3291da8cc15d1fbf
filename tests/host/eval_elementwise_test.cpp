// Elementwise evaluation rules against hand-computed values and plain C++ references, over the
// dtypes each op accepts, with the edge cases: NaN, -0, integer wraparound, division by zero,
// oversized shifts, f16/bf16 rounding, conversion saturation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "eval/eval.h"
#include "pallas/pallas.h"

namespace pl = pallas;
namespace ev = pallas::eval;
using pl::ir::OpCode;

namespace {

pl::Array arr(pl::DType t, std::vector<double> v) {
  return pl::Array::from_values({static_cast<int64_t>(v.size())}, t, v);
}

template <class T> pl::Array typed(std::vector<T> v) {
  return pl::Array::from_vector<T>({static_cast<int64_t>(v.size())}, v);
}

pl::Array un(OpCode c, const pl::Array& x, pl::ir::Attrs a = {}) { return ev::unary(c, x, a); }
pl::Array bin(OpCode c, const pl::Array& x, const pl::Array& y) { return ev::binary(c, x, y); }

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

const std::vector<pl::DType> kFloats = {pl::f16, pl::bf16, pl::f32, pl::f64};
const std::vector<pl::DType> kInts = {pl::i8, pl::i16, pl::i32, pl::i64, pl::u8, pl::u16, pl::u32, pl::u64};

}  // namespace

TEST(ElementwiseFloat, TranscendentalsMatchLibmInEveryFloatDtype) {
  std::vector<double> xs = {-3.5, -1, -0.25, 0, 0.5, 1, 2.75, 10};
  struct Case { OpCode op; double (*ref)(double); bool positive_only; };
  std::vector<Case> cases = {
      {OpCode::Exp, [](double x) { return std::exp(x); }, false},
      {OpCode::Exp2, [](double x) { return std::exp2(x); }, false},
      {OpCode::Log, [](double x) { return std::log(x); }, true},
      {OpCode::Log1p, [](double x) { return std::log1p(x); }, true},
      {OpCode::Sqrt, [](double x) { return std::sqrt(x); }, true},
      {OpCode::Rsqrt, [](double x) { return 1 / std::sqrt(x); }, true},
      {OpCode::Reciprocal, [](double x) { return 1 / x; }, true},
      {OpCode::Tanh, [](double x) { return std::tanh(x); }, false},
      {OpCode::Logistic, [](double x) { return 1 / (1 + std::exp(-x)); }, false},
      {OpCode::Sin, [](double x) { return std::sin(x); }, false},
      {OpCode::Cos, [](double x) { return std::cos(x); }, false},
      {OpCode::Erf, [](double x) { return std::erf(x); }, false},
      {OpCode::Floor, [](double x) { return std::floor(x); }, false},
      {OpCode::Ceil, [](double x) { return std::ceil(x); }, false},
      {OpCode::Abs, [](double x) { return std::fabs(x); }, false},
      {OpCode::Neg, [](double x) { return -x; }, false},
  };
  for (pl::DType t : kFloats)
    for (const Case& c : cases) {
      std::vector<double> in;
      for (double x : xs)
        if (!c.positive_only || x > 0) in.push_back(x);
      pl::Array x = arr(t, in);
      pl::Array got = un(c.op, x);
      pl::Array want({x.size()}, pl::f64);
      for (int64_t i = 0; i < x.size(); ++i) want.set_flat(i, c.ref(x.get_flat(i)));
      // Round the reference through the dtype, then allow one ulp of the dtype.
      double tol = t == pl::f64 ? 1e-14 : t == pl::f32 ? 3e-7 : t == pl::f16 ? 2e-3 : 1.6e-2;
      auto r = pl::allclose(got, want.astype(t), tol, tol);
      EXPECT_TRUE(r.ok) << pl::ir::op_info(c.op).name << " " << pl::dtype_name(t) << ": " << r.message;
    }
}

TEST(ElementwiseFloat, LogisticIsStableForLargeMagnitudes) {
  pl::Array y = un(OpCode::Logistic, arr(pl::f32, {-1000, -100, 100, 1000}));
  EXPECT_EQ(y.get({0}), 0.0);
  EXPECT_GT(y.get({1}), 0.0);
  EXPECT_LT(y.get({1}), 1e-40);
  EXPECT_EQ(y.get({2}), 1.0);
  EXPECT_EQ(y.get({3}), 1.0);
}

TEST(ElementwiseFloat, RoundingModes) {
  pl::Array x = arr(pl::f32, {0.5, 1.5, 2.5, -0.5, -2.5, 2.4});
  pl::ir::Attrs away, even;
  away.set(pl::ir::AttrKey::Rounding, int64_t{0});
  even.set(pl::ir::AttrKey::Rounding, int64_t{1});
  EXPECT_EQ(un(OpCode::Round, x, away).to_vector<float>(), (std::vector<float>{1, 2, 3, -1, -3, 2}));
  EXPECT_EQ(un(OpCode::Round, x, even).to_vector<float>(), (std::vector<float>{0, 2, 2, -0.0f, -2, 2}));
}

TEST(ElementwiseFloat, MaxMinPropagateNaNAndOrderSignedZeros) {
  const double nan = std::nan("");
  pl::Array a = arr(pl::f32, {nan, 1, -0.0, 0.0, 3});
  pl::Array b = arr(pl::f32, {1, nan, 0.0, -0.0, -3});
  pl::Array mx = bin(OpCode::Max, a, b), mn = bin(OpCode::Min, a, b);
  EXPECT_TRUE(std::isnan(mx.get({0})) && std::isnan(mx.get({1})));
  EXPECT_TRUE(std::isnan(mn.get({0})) && std::isnan(mn.get({1})));
  EXPECT_EQ(bits_of(mx.data<float>()[2]), 0x00000000u);  // +0
  EXPECT_EQ(bits_of(mx.data<float>()[3]), 0x00000000u);
  EXPECT_EQ(bits_of(mn.data<float>()[2]), 0x80000000u);  // -0
  EXPECT_EQ(bits_of(mn.data<float>()[3]), 0x80000000u);
  EXPECT_EQ(mx.get({4}), 3);
  EXPECT_EQ(mn.get({4}), -3);
}

TEST(ElementwiseFloat, SignKeepsNaNAndSignedZero) {
  pl::Array s = un(OpCode::Sign, arr(pl::f32, {std::nan(""), -0.0, 0.0, -7, 2}));
  EXPECT_TRUE(std::isnan(s.get({0})));
  EXPECT_EQ(bits_of(s.data<float>()[1]), 0x80000000u);
  EXPECT_EQ(bits_of(s.data<float>()[2]), 0u);
  EXPECT_EQ(s.get({3}), -1);
  EXPECT_EQ(s.get({4}), 1);
  EXPECT_EQ(un(OpCode::Sign, typed<int32_t>({-5, 0, 9})).to_vector<int32_t>(), (std::vector<int32_t>{-1, 0, 1}));
}

TEST(ElementwiseFloat, Bf16ResultsRoundToNearestEven) {
  // 1 + 2^-8 is a tie between bf16 1.0 (even) and 1.0078125: it stays 1.0.
  pl::Array one = arr(pl::bf16, {1, 1});
  pl::Array small = arr(pl::bf16, {std::ldexp(1.0, -8), std::ldexp(3.0, -8)});
  pl::Array sum = bin(OpCode::Add, one, small);
  EXPECT_EQ(sum.data<pl::bfloat16>()[0].bits, 0x3F80);  // 1.0
  EXPECT_EQ(sum.data<pl::bfloat16>()[1].bits, 0x3F82);  // 1 + 3*2^-8 -> tie -> even 1.015625
  // f16: 2048 + 1 = 2049 is a tie between 2048 and 2050: even mantissa -> 2048.
  pl::Array h = bin(OpCode::Add, arr(pl::f16, {2048}), arr(pl::f16, {1}));
  EXPECT_EQ(h.get({0}), 2048);
}

TEST(ElementwiseFloat, RemIsFmodAndPowIsPow) {
  pl::Array r = bin(OpCode::Rem, arr(pl::f32, {5.5, -5.5, 5.5}), arr(pl::f32, {2, 2, -2}));
  EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{1.5f, -1.5f, 1.5f}));
  pl::Array p = bin(OpCode::Pow, arr(pl::f64, {2, 9, 2}), arr(pl::f64, {10, 0.5, -1}));
  EXPECT_EQ(p.to_vector<double>(), (std::vector<double>{1024, 3, 0.5}));
}

TEST(ElementwiseInt, ArithmeticWrapsOnOverflow) {
  const int32_t mx = std::numeric_limits<int32_t>::max(), mn = std::numeric_limits<int32_t>::min();
  EXPECT_EQ(bin(OpCode::Add, typed<int32_t>({mx}), typed<int32_t>({1})).to_vector<int32_t>()[0], mn);
  EXPECT_EQ(bin(OpCode::Sub, typed<int32_t>({mn}), typed<int32_t>({1})).to_vector<int32_t>()[0], mx);
  EXPECT_EQ(bin(OpCode::Mul, typed<int32_t>({65536}), typed<int32_t>({65536})).to_vector<int32_t>()[0], 0);
  EXPECT_EQ(bin(OpCode::Mul, typed<int8_t>({100}), typed<int8_t>({3})).to_vector<int8_t>()[0], 44);  // 300-256
  EXPECT_EQ(bin(OpCode::Mul, typed<uint16_t>({65535}), typed<uint16_t>({65535})).to_vector<uint16_t>()[0], 1);
  EXPECT_EQ(un(OpCode::Neg, typed<int32_t>({mn})).to_vector<int32_t>()[0], mn);
  EXPECT_EQ(un(OpCode::Abs, typed<int32_t>({mn})).to_vector<int32_t>()[0], mn);
  EXPECT_EQ(un(OpCode::Neg, typed<uint8_t>({1})).to_vector<uint8_t>()[0], 255);
}

TEST(ElementwiseInt, DivisionAndRemainderFollowXla) {
  const int32_t mn = std::numeric_limits<int32_t>::min();
  pl::Array a = typed<int32_t>({7, -7, 7, -7, 5, mn, mn});
  pl::Array b = typed<int32_t>({2, 2, -2, -2, 0, -1, 0});
  EXPECT_EQ(bin(OpCode::Div, a, b).to_vector<int32_t>(), (std::vector<int32_t>{3, -3, -3, 3, -1, mn, -1}));
  EXPECT_EQ(bin(OpCode::Rem, a, b).to_vector<int32_t>(), (std::vector<int32_t>{1, -1, 1, -1, 5, 0, mn}));
  pl::Array ua = typed<uint32_t>({7, 9}), ub = typed<uint32_t>({0, 4});
  EXPECT_EQ(bin(OpCode::Div, ua, ub).to_vector<uint32_t>(), (std::vector<uint32_t>{0xFFFFFFFFu, 2}));
  EXPECT_EQ(bin(OpCode::Rem, ua, ub).to_vector<uint32_t>(), (std::vector<uint32_t>{7, 1}));
}

TEST(ElementwiseInt, ShiftsSaturateForOversizedAmounts) {
  pl::Array a = typed<int32_t>({1, -8, -8, 1, -1});
  pl::Array s = typed<int32_t>({31, 1, 32, -1, 40});
  EXPECT_EQ(bin(OpCode::ShiftLeft, a, s).to_vector<int32_t>(),
            (std::vector<int32_t>{std::numeric_limits<int32_t>::min(), -16, 0, 0, 0}));
  EXPECT_EQ(bin(OpCode::ShiftRightArithmetic, a, s).to_vector<int32_t>(), (std::vector<int32_t>{0, -4, -1, 0, -1}));
  EXPECT_EQ(bin(OpCode::ShiftRightLogical, a, s).to_vector<int32_t>(),
            (std::vector<int32_t>{0, 0x7FFFFFFC, 0, 0, 0}));
  pl::Array u = typed<uint8_t>({0x80, 0x80}), us = typed<uint8_t>({7, 8});
  EXPECT_EQ(bin(OpCode::ShiftRightArithmetic, u, us).to_vector<uint8_t>(), (std::vector<uint8_t>{0xFF, 0xFF}));
  EXPECT_EQ(bin(OpCode::ShiftRightLogical, u, us).to_vector<uint8_t>(), (std::vector<uint8_t>{1, 0}));
}

TEST(ElementwiseInt, BitwiseLogicalAndIntegerPow) {
  EXPECT_EQ(bin(OpCode::And, typed<uint8_t>({0xF0}), typed<uint8_t>({0x3C})).to_vector<uint8_t>()[0], 0x30);
  EXPECT_EQ(bin(OpCode::Or, typed<uint8_t>({0xF0}), typed<uint8_t>({0x0C})).to_vector<uint8_t>()[0], 0xFC);
  EXPECT_EQ(bin(OpCode::Xor, typed<uint8_t>({0xFF}), typed<uint8_t>({0x0F})).to_vector<uint8_t>()[0], 0xF0);
  EXPECT_EQ(un(OpCode::Not, typed<int32_t>({0})).to_vector<int32_t>()[0], -1);
  pl::Array t = arr(pl::bool_, {1, 1, 0, 0}), f = arr(pl::bool_, {1, 0, 1, 0});
  EXPECT_EQ(bin(OpCode::And, t, f).to_vector<bool>(), (std::vector<bool>{true, false, false, false}));
  EXPECT_EQ(bin(OpCode::Or, t, f).to_vector<bool>(), (std::vector<bool>{true, true, true, false}));
  EXPECT_EQ(bin(OpCode::Xor, t, f).to_vector<bool>(), (std::vector<bool>{false, true, true, false}));
  EXPECT_EQ(un(OpCode::Not, t).to_vector<bool>(), (std::vector<bool>{false, false, true, true}));
  pl::ir::Attrs p3, pm2, p0;
  p3.set(pl::ir::AttrKey::Exponent, int64_t{3});
  pm2.set(pl::ir::AttrKey::Exponent, int64_t{-2});
  p0.set(pl::ir::AttrKey::Exponent, int64_t{0});
  EXPECT_EQ(un(OpCode::IntegerPow, typed<int32_t>({-3, 1291}), p3).to_vector<int32_t>(),
            (std::vector<int32_t>{-27, static_cast<int32_t>(2151685171u)}));  // 1291^3 wraps
  EXPECT_EQ(un(OpCode::IntegerPow, arr(pl::f32, {2, -4}), pm2).to_vector<float>(), (std::vector<float>{0.25f, 0.0625f}));
  EXPECT_EQ(un(OpCode::IntegerPow, arr(pl::f32, {0, 5}), p0).to_vector<float>(), (std::vector<float>{1, 1}));
}

TEST(ElementwiseCompare, NaNComparesFalseExceptNe) {
  const double nan = std::nan("");
  pl::Array a = arr(pl::f32, {nan, 1, 2, -0.0});
  pl::Array b = arr(pl::f32, {nan, 1, 1, 0.0});
  EXPECT_EQ(bin(OpCode::Eq, a, b).to_vector<bool>(), (std::vector<bool>{false, true, false, true}));
  EXPECT_EQ(bin(OpCode::Ne, a, b).to_vector<bool>(), (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ(bin(OpCode::Lt, a, b).to_vector<bool>(), (std::vector<bool>{false, false, false, false}));
  EXPECT_EQ(bin(OpCode::Le, a, b).to_vector<bool>(), (std::vector<bool>{false, true, false, true}));
  EXPECT_EQ(bin(OpCode::Gt, a, b).to_vector<bool>(), (std::vector<bool>{false, false, true, false}));
  EXPECT_EQ(bin(OpCode::Ge, a, b).to_vector<bool>(), (std::vector<bool>{false, true, true, true}));
  // Unsigned comparisons do not go through a signed type.
  EXPECT_EQ(bin(OpCode::Lt, typed<uint32_t>({1}), typed<uint32_t>({0x80000000u})).to_vector<bool>()[0], true);
}

TEST(ElementwiseSelect, PicksPerElement) {
  pl::Array p = arr(pl::bool_, {1, 0, 1});
  EXPECT_EQ(ev::select(p, arr(pl::f64, {1, 2, 3}), arr(pl::f64, {-1, -2, -3})).to_vector<double>(),
            (std::vector<double>{1, -2, 3}));
  EXPECT_EQ(ev::select(p, typed<int8_t>({1, 2, 3}), typed<int8_t>({-1, -2, -3})).to_vector<int8_t>(),
            (std::vector<int8_t>{1, -2, 3}));
}

TEST(ElementwiseConvert, FloatToIntTruncatesSaturatesAndMapsNaNToZero) {
  const double inf = std::numeric_limits<double>::infinity();
  pl::Array x = arr(pl::f32, {2.9, -2.9, 1e20, -1e20, std::nan(""), inf, -inf});
  EXPECT_EQ(ev::convert(x, pl::i32).to_vector<int32_t>(),
            (std::vector<int32_t>{2, -2, 2147483647, -2147483647 - 1, 0, 2147483647, -2147483647 - 1}));
  EXPECT_EQ(ev::convert(x, pl::u8).to_vector<uint8_t>(), (std::vector<uint8_t>{2, 0, 255, 0, 0, 255, 0}));
  EXPECT_EQ(ev::convert(arr(pl::f64, {9.3e18, -9.3e18}), pl::i64).to_vector<int64_t>(),
            (std::vector<int64_t>{std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()}));
}

TEST(ElementwiseConvert, IntWrapsBoolIsNonZeroFloatsRoundToNearestEven) {
  EXPECT_EQ(ev::convert(typed<int32_t>({300, -1, 255}), pl::u8).to_vector<uint8_t>(), (std::vector<uint8_t>{44, 255, 255}));
  EXPECT_EQ(ev::convert(typed<int32_t>({200}), pl::i8).to_vector<int8_t>()[0], -56);
  EXPECT_EQ(ev::convert(arr(pl::f32, {0, -0.0, 0.5, std::nan("")}), pl::bool_).to_vector<bool>(),
            (std::vector<bool>{false, false, true, true}));
  EXPECT_EQ(ev::convert(arr(pl::bool_, {1, 0}), pl::f32).to_vector<float>(), (std::vector<float>{1, 0}));
  // f32 -> bf16: 1 + 2^-8 ties to even (1.0); 1 + 3*2^-8 ties to even (1 + 2^-6).
  pl::Array b = ev::convert(arr(pl::f32, {1 + std::ldexp(1.0, -8), 1 + 3 * std::ldexp(1.0, -8)}), pl::bf16);
  EXPECT_EQ(b.data<pl::bfloat16>()[0].bits, 0x3F80);
  EXPECT_EQ(b.data<pl::bfloat16>()[1].bits, 0x3F82);
  // f64 -> f16 rounds once: 1 + 2^-11 + 2^-40 is just above the tie, so it rounds up.
  pl::Array h = ev::convert(arr(pl::f64, {1 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)}), pl::f16);
  EXPECT_EQ(h.data<pl::float16>()[0].bits, 0x3C01);
  // i32 -> f32 rounds to nearest even: 2^24 + 1 -> 2^24.
  EXPECT_EQ(ev::convert(typed<int32_t>({16777217}), pl::f32).to_vector<float>()[0], 16777216.0f);
}

TEST(ElementwiseBitcast, SameWidthAndWidthChanges) {
  pl::Array one = arr(pl::f32, {1.0, -2.0});
  EXPECT_EQ(ev::bitcast(one, pl::u32).to_vector<uint32_t>(), (std::vector<uint32_t>{0x3F800000u, 0xC0000000u}));
  pl::Array halves = ev::bitcast(one, pl::u16);
  EXPECT_EQ(halves.shape(), (pl::Shape{2, 2}));
  EXPECT_EQ(halves.to_vector<uint16_t>(), (std::vector<uint16_t>{0x0000, 0x3F80, 0x0000, 0xC000}));  // little-endian
  pl::Array back = ev::bitcast(halves, pl::f32);
  EXPECT_EQ(back.shape(), (pl::Shape{2}));
  EXPECT_EQ(back.to_vector<float>(), (std::vector<float>{1.0f, -2.0f}));
}

TEST(ElementwiseCreate, ConstantAndIota) {
  pl::Array c = ev::constant(pl::Scalar::of_int(-3, pl::i16), {2, 3});
  EXPECT_EQ(c.to_vector<int16_t>(), (std::vector<int16_t>(6, -3)));
  pl::Array i0 = ev::iota(pl::i32, {2, 3}, 0), i1 = ev::iota(pl::f32, {2, 3}, 1);
  EXPECT_EQ(i0.to_vector<int32_t>(), (std::vector<int32_t>{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(i1.to_vector<float>(), (std::vector<float>{0, 1, 2, 0, 1, 2}));
}

TEST(ElementwiseTable, EveryElementwiseOpHasAnEvaluationRule) {
  // Walk ops.def: each unary/binary/compare op must evaluate on a dtype its type rule accepts.
  for (int c = 0; c < pl::ir::kNumOpCodes; ++c) {
    auto code = static_cast<OpCode>(c);
    const auto& info = pl::ir::op_info(code);
    if (!(info.is(pl::ir::kUnary) || info.is(pl::ir::kBinary) || info.is(pl::ir::kCompare))) continue;
    pl::DType t = info.is(pl::ir::kFloatOnly) ? pl::f32 : pl::i32;
    pl::ir::Op op;
    op.code = code;
    op.attrs.set(pl::ir::AttrKey::Exponent, int64_t{2});
    op.attrs.set(pl::ir::AttrKey::N, int64_t{1});
    pl::Array x = pl::Array::full({4}, t, 3);
    std::vector<pl::Array> in(info.num_operands, x);
    EXPECT_NO_THROW(ev::pure_op(op, in)) << info.name;
  }
}
