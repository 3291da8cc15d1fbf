// Reductions, arg-extrema and scans (src/eval/reduce.cpp) against plain loops written here:
// float references accumulate in double, integer ones use hand-computed wrapped values.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "eval/accumulate.h"
#include "eval/eval.h"
#include "tests/host/eval_test_util.h"

namespace pallas {
namespace {

using ir::AttrKey;
using ir::Ints;
using ir::OpCode;
using testutil::Index;
using testutil::same_bits;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

Array reduce(OpCode code, const Array& x, Ints axes) {
  return eval::reduce(code, x, ir::Attrs().set(AttrKey::Axes, std::move(axes)));
}
Array arg(OpCode code, const Array& x, int64_t axis, DType index = i32) {
  return eval::reduce(code, x, ir::Attrs().set(AttrKey::Axis, axis).set(AttrKey::DTypeAttr, index));
}
Array scan(OpCode code, const Array& x, int64_t axis, bool reverse = false) {
  return eval::scan(code, x,
                    ir::Attrs().set(AttrKey::Axis, axis).set(AttrKey::Reverse, int64_t{reverse}));
}

// Reference: x's elements (as double) folded with f from init into the element of the result
// that keeps x's non-reduced indices. Result f64.
Array ref_reduce(const Array& x, const Ints& axes, double init,
                 const std::function<double(double, double)>& f) {
  Shape out_shape;
  for (int64_t d = 0; d < x.rank(); ++d)
    if (std::find(axes.begin(), axes.end(), d) == axes.end()) out_shape.push_back(x.shape()[d]);
  Array out = Array::full(out_shape, f64, init);
  testutil::for_each_index(x.shape(), [&](const Index& i) {
    Index o;
    for (int64_t d = 0; d < x.rank(); ++d)
      if (std::find(axes.begin(), axes.end(), d) == axes.end()) o.push_back(i[d]);
    double& acc = out.data<double>()[testutil::flat_of(out_shape, o)];
    acc = f(acc, x.get_flat(testutil::flat_of(x.shape(), i)));
  });
  return out;
}

double ref_max(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return kNaN;
  if (a == b) return std::signbit(a) ? b : a;  // +0 beats -0
  return a > b ? a : b;
}
double ref_min(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return kNaN;
  if (a == b) return std::signbit(a) ? a : b;  // -0 beats +0
  return a < b ? a : b;
}

const std::vector<Ints> kAxisSets = {{0}, {3}, {1, 2}, {0, 2}, {1, 3}, {0, 3}, {0, 1, 3}, {0, 1, 2, 3}};

TEST(ReduceSum, FloatsOverAxisSubsetsMatchDoubleReference) {
  for (DType t : {f32, f64}) {
    Array x = Array::random_uniform({3, 4, 5, 6}, t, 1, 0.0, 1.0);
    for (const Ints& axes : kAxisSets) {
      Array got = reduce(OpCode::ReduceSum, x, axes);
      Array want = ref_reduce(x, axes, 0.0, [](double a, double b) { return a + b; });
      auto r = allclose(got.astype(f64), want, t == f32 ? 1e-6 : 1e-14, 0);
      EXPECT_TRUE(r.ok) << dtype_name(t) << " axes " << axes.size() << ": " << r.message;
      EXPECT_EQ(got.dtype(), t);
    }
  }
}

TEST(ReduceSum, LongF32SumIsAccurate) {
  // 2^20 values of 0.1f: a sequential f32 sum drifts by ~1e-3 relative; pairwise stays ~1e-7.
  const int64_t n = 1 << 20;
  Array x = Array::full({n}, f32, 0.1);
  double exact = static_cast<double>(0.1f) * n;
  double got = reduce(OpCode::ReduceSum, x, {0}).get_flat(0);
  EXPECT_NEAR(got, exact, exact * 1e-6);
}

TEST(ReduceSum, EmptyAxesIsAnIdentityCopy) {
  Array x = Array::from_values({2, 2}, f32, {-0.0, 1.5, kNaN, -3.0});
  for (OpCode c : {OpCode::ReduceSum, OpCode::ReduceProd, OpCode::ReduceMax, OpCode::ReduceMin})
    EXPECT_TRUE(same_bits(reduce(c, x, {}), x)) << ir::op_info(c).name;
  Array y = Array::from_values({3}, i8, {-5, 7, 0});
  EXPECT_TRUE(same_bits(reduce(OpCode::ReduceAnd, y, {}), y));
}

TEST(ReduceSum, SingleNegativeZeroStaysNegative) {
  Array x = Array::from_values({1, 1}, f32, {-0.0});
  EXPECT_TRUE(std::signbit(reduce(OpCode::ReduceSum, x, {0, 1}).get_flat(0)));
  Array y = Array::from_values({2}, f32, {-0.0, -0.0});
  EXPECT_TRUE(std::signbit(reduce(OpCode::ReduceSum, y, {0}).get_flat(0)));
}

TEST(ReduceSum, IntegersMatchReference) {
  for (DType t : {i8, i16, i32, i64, u8, u32, u64}) {
    // Values small enough that no sum wraps (8-bit: 120 elements of 0 or 1 stay below 128).
    Array x = itemsize(t) == 1 ? Array::random_uniform({2, 3, 4, 5}, t, 2, 0, 2)
                               : Array::random_uniform({3, 4, 5, 6}, t, 2, 0, 4);
    for (const Ints& axes : kAxisSets) {
      Array got = reduce(OpCode::ReduceSum, x, axes);
      Array want = ref_reduce(x, axes, 0.0, [](double a, double b) { return a + b; });
      EXPECT_TRUE(allclose(got.astype(f64), want, 0, 0).ok) << dtype_name(t);
      Array gmax = reduce(OpCode::ReduceMax, x, axes);
      EXPECT_TRUE(allclose(gmax.astype(f64), ref_reduce(x, axes, -kInf, ref_max), 0, 0).ok);
      Array gmin = reduce(OpCode::ReduceMin, x, axes);
      EXPECT_TRUE(allclose(gmin.astype(f64), ref_reduce(x, axes, kInf, ref_min), 0, 0).ok);
    }
  }
}

TEST(ReduceSum, IntegersWrapAround) {
  // 300 * 100 = 30000 = 117 * 256 + 48.
  EXPECT_EQ(reduce(OpCode::ReduceSum, Array::full({300}, i8, 100), {0}).get_flat(0), 48);
  // 10 * 200 = 2000 = 7 * 256 + 208.
  EXPECT_EQ(reduce(OpCode::ReduceSum, Array::full({10}, u8, 200), {0}).get_flat(0), 208);
  // 3e9 wraps to 3e9 - 2^32.
  EXPECT_EQ(reduce(OpCode::ReduceSum, Array::full({3}, i32, 1e9), {0}).get_flat(0),
            3e9 - 4294967296.0);
  Array big = Array::from_vector<int64_t>({2}, {std::numeric_limits<int64_t>::max(),
                                                std::numeric_limits<int64_t>::max()});
  EXPECT_EQ(reduce(OpCode::ReduceSum, big, {0}).data<int64_t>()[0], -2);
  // Over a non-inner axis too.
  EXPECT_EQ(reduce(OpCode::ReduceSum, Array::full({300, 2}, i8, 100), {0}).to_doubles(),
            (std::vector<double>{48, 48}));
}

TEST(ReduceProd, IntegersWrapAround) {
  // u16 * u16 promotes to (signed) int in C++: 65535^2 would overflow it. Mod 2^16 it is 1.
  EXPECT_EQ(reduce(OpCode::ReduceProd, Array::full({2}, u16, 65535), {0}).get_flat(0), 1);
  EXPECT_EQ(reduce(OpCode::ReduceProd, Array::from_values({2}, i8, {100, 3}), {0}).get_flat(0),
            44);  // 300 - 256
  EXPECT_EQ(reduce(OpCode::ReduceProd, Array::full({3}, i32, 65536), {0}).get_flat(0), 0);
  const int64_t p = (int64_t{1} << 62) + 1;
  Array x = Array::from_vector<int64_t>({2}, {3, p});
  const uint64_t want = 3u * static_cast<uint64_t>(p);  // modular
  EXPECT_EQ(reduce(OpCode::ReduceProd, x, {0}).data<int64_t>()[0], static_cast<int64_t>(want));
}

TEST(ReduceProd, FloatsMatchReference) {
  Array x = Array::random_uniform({4, 6, 5}, f32, 3, 0.5, 1.5);
  for (Ints axes : {Ints{0}, Ints{1}, Ints{2}, Ints{0, 2}, Ints{0, 1, 2}}) {
    Array want = ref_reduce(x, axes, 1.0, [](double a, double b) { return a * b; });
    auto r = allclose(reduce(OpCode::ReduceProd, x, axes).astype(f64), want, 1e-5, 0);
    EXPECT_TRUE(r.ok) << r.message;
  }
}

TEST(ReduceSum, HalfFloatsAccumulateInF32) {
  // A bf16 running sum of ones stalls at 256 (256 + 1 rounds back to 256); in f32 it is exact
  // and 1024 is representable in bf16.
  EXPECT_EQ(reduce(OpCode::ReduceSum, Array::full({1024}, bf16, 1.0), {0}).get_flat(0), 1024);
  EXPECT_EQ(reduce(OpCode::ReduceSum, Array::full({1024, 3}, bf16, 1.0), {0}).to_doubles(),
            (std::vector<double>{1024, 1024, 1024}));  // outer-axis accumulation
  EXPECT_EQ(reduce(OpCode::ReduceSum, Array::full({2, 512, 2}, bf16, 1.0), {0, 1}).to_doubles(),
            (std::vector<double>{1024, 1024}));
  // f16: a running f16 sum stalls at 2048; 4096 is representable.
  EXPECT_EQ(reduce(OpCode::ReduceSum, Array::full({4096}, f16, 1.0), {0}).get_flat(0), 4096);
  // Rounded once at the end: 0.1 * 1000 (in bf16) summed in f32, then rounded to bf16.
  Array tenth = Array::full({1000}, bf16, 0.1);
  const double exact = tenth.get_flat(0) * 1000;
  const double want = Array::from_values({}, bf16, {exact}).get_flat(0);
  EXPECT_EQ(reduce(OpCode::ReduceSum, tenth, {0}).get_flat(0), want);
}

TEST(ReduceSum, InlineBf16RoundingMatchesTheLibraryConversion) {
  // The reductions and dot round f32 -> bf16 with an inline bit trick; it must agree bit for bit
  // with float_to_bf16_bits everywhere: ties, carries into the exponent, overflow to Inf,
  // subnormals, NaN payloads of both signs.
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7F7FFFFFu,
                                0x7F7F8000u, 0x7F7F7FFFu, 0x3F808000u, 0x3F818000u, 0x3F80FFFFu,
                                0x00008000u, 0x00018000u, 0x807FFFFFu, 0x7FC00000u, 0xFFC00001u,
                                0x7F800001u, 0xFF812345u, 0x7FFFFFFFu};
  uint64_t s = 0x9E3779B97F4A7C15u;
  for (int i = 0; i < 200000; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    bits.push_back(static_cast<uint32_t>(s));
  }
  for (uint32_t b : bits) {
    float f;
    std::memcpy(&f, &b, sizeof f);
    ASSERT_EQ(eval::acc::f32_to_bf16_bits(f), float_to_bf16_bits(f)) << std::hex << b;
  }
}

TEST(ReduceEmpty, GivesTheIdentity) {
  Array e = Array({0, 3}, f32);
  Array s = reduce(OpCode::ReduceSum, e, {0});
  EXPECT_EQ(s.shape(), Shape{3});
  EXPECT_EQ(s.get_flat(0), 0.0);
  EXPECT_FALSE(std::signbit(s.get_flat(0)));  // +0, not the -0 accumulators start from
  EXPECT_EQ(reduce(OpCode::ReduceProd, e, {0}).get_flat(1), 1.0);
  EXPECT_EQ(reduce(OpCode::ReduceMax, e, {0}).get_flat(2), -kInf);
  EXPECT_EQ(reduce(OpCode::ReduceMin, e, {0}).get_flat(0), kInf);
  EXPECT_EQ(reduce(OpCode::ReduceMax, Array({3, 0}, i32), {1}).get_flat(0),
            std::numeric_limits<int32_t>::min());
  EXPECT_EQ(reduce(OpCode::ReduceMin, Array({0}, u8), {0}).get_flat(0), 255);
  EXPECT_EQ(reduce(OpCode::ReduceAnd, Array({0}, i16), {0}).get_flat(0), -1);
  EXPECT_EQ(reduce(OpCode::ReduceAnd, Array({0}, bool_), {0}).get_flat(0), 1);
  EXPECT_EQ(reduce(OpCode::ReduceOr, Array({0}, bool_), {0}).get_flat(0), 0);
  EXPECT_EQ(reduce(OpCode::ReduceMax, Array({0}, bool_), {0}).get_flat(0), 0);
  EXPECT_EQ(reduce(OpCode::ReduceMin, Array({0}, bf16), {0}).get_flat(0), kInf);
  Array all = reduce(OpCode::ReduceSum, Array({2, 0}, i64), {0, 1});
  EXPECT_EQ(all.shape(), Shape{});
  EXPECT_EQ(all.get_flat(0), 0);
}

TEST(ReduceMax, NaNPropagates) {
  for (DType t : {f32, f64, bf16, f16}) {
    for (int64_t pos : {0, 3, 6}) {
      std::vector<double> v = {1, -2, 5, 0.5, 7, -9, 3};
      v[static_cast<size_t>(pos)] = kNaN;
      Array x = Array::from_values({7}, t, v);
      EXPECT_TRUE(std::isnan(reduce(OpCode::ReduceMax, x, {0}).get_flat(0))) << dtype_name(t);
      EXPECT_TRUE(std::isnan(reduce(OpCode::ReduceMin, x, {0}).get_flat(0))) << dtype_name(t);
    }
  }
  // Only the row holding the NaN is NaN; along both axes.
  Array x = Array::from_values({2, 3}, f32, {1, kNaN, 3, 4, 5, 6});
  Array rows = reduce(OpCode::ReduceMax, x, {1});
  EXPECT_TRUE(std::isnan(rows.get_flat(0)));
  EXPECT_EQ(rows.get_flat(1), 6);
  Array cols = reduce(OpCode::ReduceMin, x, {0});
  EXPECT_EQ(cols.get_flat(0), 1);
  EXPECT_TRUE(std::isnan(cols.get_flat(1)));
  EXPECT_EQ(cols.get_flat(2), 3);
}

TEST(ReduceMax, SignedZeros) {
  for (DType t : {f32, f64, bf16}) {
    for (auto v : {std::vector<double>{-0.0, 0.0}, std::vector<double>{0.0, -0.0}}) {
      Array x = Array::from_values({2}, t, v);
      EXPECT_FALSE(std::signbit(reduce(OpCode::ReduceMax, x, {0}).get_flat(0)));
      EXPECT_TRUE(std::signbit(reduce(OpCode::ReduceMin, x, {0}).get_flat(0)));
      // Along the outer axis as well.
      Array col = Array::from_values({2, 1}, t, v);
      EXPECT_FALSE(std::signbit(reduce(OpCode::ReduceMax, col, {0}).get_flat(0)));
      EXPECT_TRUE(std::signbit(reduce(OpCode::ReduceMin, col, {0}).get_flat(0)));
    }
    Array neg = Array::from_values({2}, t, {-0.0, -0.0});
    EXPECT_TRUE(std::signbit(reduce(OpCode::ReduceMax, neg, {0}).get_flat(0)));
  }
}

TEST(ReduceMax, FloatsMatchReferenceWithNaNsInside) {
  Array x = Array::random_normal({3, 4, 5, 6}, f32, 4);
  x.data<float>()[17] = std::numeric_limits<float>::quiet_NaN();
  x.data<float>()[200] = -std::numeric_limits<float>::quiet_NaN();
  for (const Ints& axes : kAxisSets) {
    EXPECT_TRUE(allclose(reduce(OpCode::ReduceMax, x, axes).astype(f64),
                         ref_reduce(x, axes, -kInf, ref_max), 0, 0)
                    .ok);
    EXPECT_TRUE(allclose(reduce(OpCode::ReduceMin, x, axes).astype(f64),
                         ref_reduce(x, axes, kInf, ref_min), 0, 0)
                    .ok);
  }
}

TEST(ReduceAndOr, BitwiseForIntsLogicalForBool) {
  Array x = Array::from_values({2, 2}, i8, {0b1100, 0b1010, -1, 0b0110});
  EXPECT_EQ(reduce(OpCode::ReduceAnd, x, {1}).to_doubles(), (std::vector<double>{0b1000, 0b0110}));
  EXPECT_EQ(reduce(OpCode::ReduceOr, x, {1}).to_doubles(), (std::vector<double>{0b1110, -1}));
  EXPECT_EQ(reduce(OpCode::ReduceAnd, x, {0}).to_doubles(), (std::vector<double>{0b1100, 0b0010}));
  Array u = Array::from_vector<uint32_t>({3}, {0xF0F0F0F0u, 0xFF00FF00u, 0xFFFF0000u});
  EXPECT_EQ(reduce(OpCode::ReduceAnd, u, {0}).data<uint32_t>()[0], 0xF0000000u);
  EXPECT_EQ(reduce(OpCode::ReduceOr, u, {0}).data<uint32_t>()[0], 0xFFFFFFF0u);

  Array b = testutil::random_array({3, 4, 5}, bool_, 5);
  for (Ints axes : {Ints{0}, Ints{2}, Ints{0, 2}, Ints{0, 1, 2}}) {
    Array want_and = ref_reduce(b, axes, 1, [](double a, double v) { return a * v; });
    Array want_or = ref_reduce(b, axes, 0, [](double a, double v) { return std::max(a, v); });
    EXPECT_TRUE(allclose(reduce(OpCode::ReduceAnd, b, axes).astype(f64), want_and, 0, 0).ok);
    EXPECT_TRUE(allclose(reduce(OpCode::ReduceOr, b, axes).astype(f64), want_or, 0, 0).ok);
    EXPECT_TRUE(allclose(reduce(OpCode::ReduceMax, b, axes).astype(f64), want_or, 0, 0).ok);
    EXPECT_TRUE(allclose(reduce(OpCode::ReduceMin, b, axes).astype(f64), want_and, 0, 0).ok);
  }
}

// Reference argmax/argmin: first strict improvement wins; the first NaN wins outright.
Array ref_arg(const Array& x, int64_t axis, bool is_max) {
  Shape out_shape = x.shape();
  out_shape.erase(out_shape.begin() + axis);
  Array out(out_shape, i64);
  testutil::for_each_index(out_shape, [&](const Index& o) {
    Index i = o;
    i.insert(i.begin() + axis, 0);
    int64_t best = 0;
    double bv = x.get(i);
    for (int64_t j = 1; j < x.shape()[axis] && !std::isnan(bv); ++j) {
      i[axis] = j;
      double v = x.get(i);
      if (std::isnan(v) || (is_max ? v > bv : v < bv)) {
        bv = v;
        best = j;
      }
    }
    out.data<int64_t>()[testutil::flat_of(out_shape, o)] = best;
  });
  return out;
}

TEST(Argmax, FirstExtremeAlongEachAxisMatchesReference) {
  for (DType t : {f32, i32, u8, bf16, f64}) {
    // Few distinct values: many ties, so "first" matters.
    Array x = Array::random_uniform({4, 5, 6}, t, 6, 0, 4);
    if (is_float(t)) x = Array::random_uniform({4, 5, 6}, i32, 6, 0, 4).astype(t);
    for (int64_t axis = 0; axis < 3; ++axis) {
      EXPECT_TRUE(allclose(arg(OpCode::Argmax, x, axis, i64), ref_arg(x, axis, true), 0, 0).ok)
          << dtype_name(t) << " axis " << axis;
      EXPECT_TRUE(allclose(arg(OpCode::Argmin, x, axis, i64), ref_arg(x, axis, false), 0, 0).ok)
          << dtype_name(t) << " axis " << axis;
    }
  }
}

TEST(Argmax, NaNIsTheExtremeAndTheFirstNaNWins) {
  Array x = Array::from_values({5}, f32, {1, kNaN, 5, kNaN, -7});
  EXPECT_EQ(arg(OpCode::Argmax, x, 0).get_flat(0), 1);
  EXPECT_EQ(arg(OpCode::Argmin, x, 0).get_flat(0), 1);
  Array y = Array::from_values({2, 3}, f32, {3, 1, 3, 2, kNaN, kNaN});
  EXPECT_EQ(arg(OpCode::Argmax, y, 1).to_doubles(), (std::vector<double>{0, 1}));
  EXPECT_EQ(arg(OpCode::Argmin, y, 0).to_doubles(), (std::vector<double>{1, 1, 1}));
  // -0 and +0 are equal: the first one wins.
  Array z = Array::from_values({2}, f32, {-0.0, 0.0});
  EXPECT_EQ(arg(OpCode::Argmax, z, 0).get_flat(0), 0);
  EXPECT_EQ(arg(OpCode::Argmin, z, 0).get_flat(0), 0);
}

TEST(Argmax, BoolAndIndexDtypes) {
  Array b = Array::from_values({2, 4}, bool_, {0, 0, 1, 1, 0, 0, 0, 0});
  EXPECT_EQ(arg(OpCode::Argmax, b, 1).to_doubles(), (std::vector<double>{2, 0}));
  EXPECT_EQ(arg(OpCode::Argmin, b, 1).to_doubles(), (std::vector<double>{0, 0}));
  Array x = Array::iota({300}, i32);
  Array r = arg(OpCode::Argmax, x, 0, u8);
  EXPECT_EQ(r.dtype(), u8);
  EXPECT_EQ(r.get_flat(0), 299 - 256);  // wraps like convert
  EXPECT_EQ(arg(OpCode::Argmax, x, 0, i16).get_flat(0), 299);
}

// Reference scan along `axis` in double with f.
Array ref_scan(const Array& x, int64_t axis, bool reverse,
               const std::function<double(double, double)>& f) {
  Array out(x.shape(), f64);
  testutil::for_each_index(x.shape(), [&](const Index& i) {
    Index j = i;
    const int64_t n = x.shape()[axis];
    double acc = 0;
    bool first = true;
    for (int64_t s = 0; s < n; ++s) {
      j[axis] = reverse ? n - 1 - s : s;
      if (reverse ? j[axis] < i[axis] : j[axis] > i[axis]) break;
      acc = first ? x.get(j) : f(acc, x.get(j));
      first = false;
    }
    out.data<double>()[testutil::flat_of(x.shape(), i)] = acc;
  });
  return out;
}

TEST(Scan, FloatScansMatchReference) {
  Array x = Array::random_uniform({3, 5, 4}, f32, 7, 0.5, 1.5);
  x.data<float>()[22] = std::numeric_limits<float>::quiet_NaN();
  for (int64_t axis = 0; axis < 3; ++axis)
    for (bool rev : {false, true}) {
      auto check = [&](OpCode c, double rtol, const std::function<double(double, double)>& f) {
        auto r = allclose(scan(c, x, axis, rev).astype(f64), ref_scan(x, axis, rev, f), rtol, 0);
        EXPECT_TRUE(r.ok) << ir::op_info(c).name << " axis " << axis << " reverse " << rev << ": "
                          << r.message;
      };
      check(OpCode::Cumsum, 1e-6, [](double a, double b) { return a + b; });
      check(OpCode::Cumprod, 1e-6, [](double a, double b) { return a * b; });
      check(OpCode::Cummax, 0, ref_max);
      check(OpCode::Cummin, 0, ref_min);
    }
}

TEST(Scan, IntegerScansWrap) {
  EXPECT_EQ(scan(OpCode::Cumsum, Array::full({3}, i8, 100), 0).to_doubles(),
            (std::vector<double>{100, -56, 44}));
  EXPECT_EQ(scan(OpCode::Cumprod, Array::full({2}, u16, 65535), 0).to_doubles(),
            (std::vector<double>{65535, 1}));
  EXPECT_EQ(scan(OpCode::Cumsum, Array::from_values({4}, i32, {1, 2, 3, 4}), 0, true).to_doubles(),
            (std::vector<double>{10, 9, 7, 4}));
  EXPECT_EQ(scan(OpCode::Cummax, Array::from_values({4}, i16, {-5, 3, 1, 7}), 0).to_doubles(),
            (std::vector<double>{-5, 3, 3, 7}));
  EXPECT_EQ(scan(OpCode::Cummin, Array::from_values({4}, u32, {5, 3, 4, 1}), 0, true).to_doubles(),
            (std::vector<double>{1, 1, 1, 1}));
}

TEST(Scan, NaNPropagatesAndSignedZeros) {
  Array x = Array::from_values({5}, f32, {1, 3, kNaN, 2, 5});
  Array m = scan(OpCode::Cummax, x, 0);
  EXPECT_EQ(m.get_flat(1), 3);
  for (int k = 2; k < 5; ++k) EXPECT_TRUE(std::isnan(m.get_flat(k)));
  Array r = scan(OpCode::Cummax, x, 0, true);
  EXPECT_EQ(r.get_flat(4), 5);
  EXPECT_EQ(r.get_flat(3), 5);
  for (int k = 0; k < 3; ++k) EXPECT_TRUE(std::isnan(r.get_flat(k)));
  Array z = Array::from_values({2}, f32, {-0.0, 0.0});
  EXPECT_FALSE(std::signbit(scan(OpCode::Cummax, z, 0).get_flat(1)));
  EXPECT_TRUE(std::signbit(scan(OpCode::Cummin, z, 0).get_flat(1)));
  EXPECT_TRUE(std::signbit(scan(OpCode::Cumsum, z, 0).get_flat(0)));  // first output is x[0]
  Array b = Array::from_values({4}, bool_, {0, 1, 0, 1});
  EXPECT_EQ(scan(OpCode::Cummax, b, 0).to_doubles(), (std::vector<double>{0, 1, 1, 1}));
  EXPECT_EQ(scan(OpCode::Cummin, b, 0, true).to_doubles(), (std::vector<double>{0, 0, 0, 1}));
}

TEST(Scan, HalfFloatCumsumAccumulatesInF32AndRoundsEachOutput) {
  // Output k is bf16(k + 1): the running value is exact in f32. A bf16 running sum would stay
  // at 256 from k = 255 on.
  const int64_t n = 1024;
  std::vector<double> want(n);
  for (int64_t k = 0; k < n; ++k) want[static_cast<size_t>(k)] = static_cast<double>(k + 1);
  Array expected = Array::from_values({n}, bf16, want);
  EXPECT_TRUE(same_bits(scan(OpCode::Cumsum, Array::full({n}, bf16, 1.0), 0), expected));
  Array expected16 = Array::from_values({n}, f16, want);
  EXPECT_TRUE(same_bits(scan(OpCode::Cumsum, Array::full({n}, f16, 1.0), 0), expected16));
}

TEST(Scan, EmptyAxis) {
  EXPECT_EQ(scan(OpCode::Cumsum, Array({3, 0}, f32), 1).shape(), (Shape{3, 0}));
}

}  // namespace
}  // namespace pallas
