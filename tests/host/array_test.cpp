// pallas::Array (creation, access, errors, copies, conversion, printing), random numbers, and
// allclose.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <sstream>

#include "array/prng.h"
#include "pallas/array.h"

namespace pallas {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Runs f, expects a pallas::Error whose message contains every one of `parts`.
template <class F> void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "expected a pallas::Error";
  } catch (const Error& e) {
    for (const std::string& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message '" << e.what() << "' lacks '" << p << "'";
  }
}

bool same_bits(const Array& a, const Array& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// ---- Shapes -----------------------------------------------------------------------------------

TEST(Array, ShapeHelpers) {
  EXPECT_EQ(num_elements({2, 3, 4}), 24);
  EXPECT_EQ(num_elements({}), 1);
  EXPECT_EQ(num_elements({5, 0}), 0);
  EXPECT_EQ(shape_to_string({8, 128}), "[8, 128]");
  EXPECT_EQ(shape_to_string({}), "[]");
  EXPECT_EQ(row_major_strides({2, 3, 4}), (std::vector<int64_t>{12, 4, 1}));
  EXPECT_EQ(ShapeDtype({8, 128}, f32).to_string(), "f32[8, 128]");
  EXPECT_EQ(ShapeDtype({}, bf16).to_string(), "bf16[]");
  EXPECT_EQ(ShapeDtype({2, 3}, i8).size(), 6);
}

TEST(Array, Construction) {
  Array empty;
  EXPECT_EQ(empty.shape(), Shape{0});
  EXPECT_EQ(empty.dtype(), f32);
  EXPECT_EQ(empty.size(), 0);

  Array a({2, 3}, f32);
  EXPECT_EQ(a.size(), 6);
  EXPECT_EQ(a.nbytes(), 24);
  EXPECT_EQ(a.rank(), 2);
  EXPECT_EQ(a.dim(0), 2);
  EXPECT_EQ(a.dim(1), 3);
  EXPECT_EQ(a.dim(-1), 3);
  EXPECT_EQ(a.dim(-2), 2);
  EXPECT_EQ(a.shape_dtype(), ShapeDtype({2, 3}, f32));
  expect_error([&] { a.dim(2); }, {"axis 2", "rank 2", "[2, 3]"});
  expect_error([&] { a.dim(-3); }, {"axis -3", "rank 2"});
  expect_error([] { Array({2, -1}, f32); }, {"[2, -1]"});

  for (DType t : {bool_, i8, f16, f32, f64})
    for (Shape s : {Shape{}, Shape{0}, Shape{1}, Shape{3, 5}, Shape{1000}}) {
      Array b(s, t);
      EXPECT_NE(b.raw_data(), nullptr);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b.raw_data()) % 64, 0u) << b.shape_dtype().to_string();
    }
  Array scalar(Shape{}, i32);
  EXPECT_EQ(scalar.size(), 1);
  EXPECT_EQ(scalar.rank(), 0);
}

TEST(Array, CreationHelpers) {
  const Array z = Array::zeros({3}, i32);
  EXPECT_EQ(z.to_vector<int32_t>(), (std::vector<int32_t>{0, 0, 0}));

  const Array h = Array::full({2, 2}, f16, 1.0);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(h.data<float16>()[k].bits, 0x3C00);
  const Array b = Array::full({2}, Scalar::from_double(0.1, bf16));
  EXPECT_EQ(b.dtype(), bf16);
  EXPECT_EQ(b.data<bfloat16>()[1].bits, 0x3DCD);
  EXPECT_EQ(Array::full({2}, u8, 300.0).get({0}), 255.0);  // saturates, as convert

  EXPECT_EQ(Array::iota({5}, i8).to_vector<int8_t>(), (std::vector<int8_t>{0, 1, 2, 3, 4}));
  const Array wrapped = Array::iota({300}, u8);
  EXPECT_EQ(wrapped.get({299}), 43.0);  // 299 wraps to 43
  EXPECT_EQ(Array::iota({2, 2}, f32).to_doubles(), (std::vector<double>{0, 1, 2, 3}));

  const Array v = Array::from_values({2, 2}, f16, {0.1, -2.0, 65520.0, 1.0 / 3});
  const float16* p = v.data<float16>();
  EXPECT_EQ(p[0].bits, 0x2E66);
  EXPECT_EQ(p[1].bits, 0xC000);
  EXPECT_EQ(p[2].bits, 0x7C00);
  EXPECT_EQ(p[3].bits, 0x3555);
  expect_error([] { Array::from_values({2, 2}, f32, {1.0, 2.0, 3.0}); }, {"3 values", "[2, 2]"});

  const Array fv = Array::from_vector<int16_t>({3}, {-1, 2, -3});
  EXPECT_EQ(fv.dtype(), i16);
  EXPECT_EQ(fv.get({2}), -3.0);
  expect_error([] { Array::from_vector<float>({4}, {1.0f}); }, {"[4]"});
}

TEST(Array, ElementAccess) {
  Array a = Array::from_values({2, 3}, f32, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(a.get({1, 2}), 6.0);
  EXPECT_EQ(a.get({0, 0}), 1.0);
  EXPECT_EQ(a.at<float>({0, 1}), 2.0f);
  a.at<float>({0, 1}) = 20.0f;
  EXPECT_EQ(a.get_flat(1), 20.0);
  a.set({1, 0}, 0.1);
  EXPECT_EQ(a.get({1, 0}), 0.100000001490116119384765625);  // rounded to f32
  a.set_flat(5, -7.0);
  EXPECT_EQ(a.data<float>()[5], -7.0f);
  const std::vector<int64_t> idx{1, 1};
  EXPECT_EQ(a.get(std::span<const int64_t>(idx)), 5.0);
  EXPECT_EQ(a.scalar_at_flat(2).dtype, f32);
  EXPECT_EQ(a.scalar_at_flat(2).f, 3.0);

  expect_error([&] { a.get({2, 0}); }, {"[2, 0]", "[2, 3]", "axis 0"});
  expect_error([&] { a.get({0, 3}); }, {"[0, 3]", "axis 1 has size 3"});
  expect_error([&] { a.get({-1, 0}); }, {"[-1, 0]"});
  expect_error([&] { a.get({1}); }, {"[1]", "rank 2"});
  expect_error([&] { a.set({0, 0, 0}, 1.0); }, {"rank 2"});
  expect_error([&] { a.get_flat(6); }, {"flat index 6", "[2, 3]"});
  expect_error([&] { a.set_flat(-1, 0); }, {"flat index -1"});
  expect_error([&] { a.at<float>({5, 5}); }, {"[5, 5]"});
  expect_error([&] { a.data<int32_t>(); }, {"i32", "f32"});
  expect_error([&] { a.at<double>({0, 0}); }, {"f64", "f32"});

  Array big = Array::full({1}, u64, 0);
  big.data<uint64_t>()[0] = UINT64_MAX;
  EXPECT_EQ(big.scalar_at_flat(0).u, UINT64_MAX);

  Array sem({2}, DType::Semaphore);
  sem.data<int32_t>()[1] = 3;  // semaphores are int32 counters
  EXPECT_EQ(sem.get({1}), 3.0);
}

TEST(Array, HandleSemanticsAndClone) {
  Array a = Array::iota({4}, i32);
  Array b = a;  // shares the buffer
  b.set({0}, 100);
  EXPECT_EQ(a.get({0}), 100.0);
  EXPECT_TRUE(a.shares_buffer_with(b));
  Array c = a.clone();
  EXPECT_FALSE(c.shares_buffer_with(a));
  EXPECT_TRUE(same_bits(a, c));
  c.set({1}, -5);
  EXPECT_EQ(a.get({1}), 1.0);
  EXPECT_EQ(c.get({1}), -5.0);
  EXPECT_FALSE(Array::zeros({4}, i32).shares_buffer_with(a));
  EXPECT_FALSE(Array().shares_buffer_with(Array()));
}

TEST(Array, Reshaped) {
  Array a = Array::iota({2, 6}, f32);
  Array r = a.reshaped({3, 4});
  EXPECT_EQ(r.shape(), (Shape{3, 4}));
  EXPECT_TRUE(r.shares_buffer_with(a));
  EXPECT_EQ(r.get({2, 3}), 11.0);
  r.set({0, 0}, 42);
  EXPECT_EQ(a.get({0, 0}), 42.0);
  EXPECT_EQ(a.reshaped({-1, 3}).shape(), (Shape{4, 3}));
  EXPECT_EQ(a.reshaped({12}).shape(), (Shape{12}));
  EXPECT_EQ(Array::iota({1}, f32).reshaped({}).rank(), 0);
  expect_error([&] { a.reshaped({4, 2}); }, {"f32[2, 6]", "12 elements", "[4, 2]", "8 elements"});
  expect_error([&] { a.reshaped({-1, 5}); }, {"[-1, 5]"});
  expect_error([&] { a.reshaped({-1, -1}); }, {"[-1, -1]"});
}

TEST(Array, Astype) {
  const Array f = Array::from_values({6}, f32, {1.5, -1.5, 300, kNaN, kInf, -1e10});
  EXPECT_EQ(f.astype(i8).to_vector<int8_t>(), (std::vector<int8_t>{1, -1, 127, 0, 127, -128}));
  EXPECT_EQ(f.astype(u8).to_vector<uint8_t>(), (std::vector<uint8_t>{1, 0, 255, 0, 255, 0}));
  EXPECT_EQ(f.astype(bool_).to_doubles(), (std::vector<double>{1, 1, 1, 1, 1, 1}));
  const Array i = Array::from_vector<int32_t>({3}, {300, -1, 0});
  EXPECT_EQ(i.astype(i8).to_vector<int8_t>(), (std::vector<int8_t>{44, -1, 0}));
  EXPECT_EQ(i.astype(u16).to_vector<uint16_t>(), (std::vector<uint16_t>{300, 65535, 0}));
  EXPECT_EQ(i.astype(bool_).to_doubles(), (std::vector<double>{1, 1, 0}));
  const Array d = Array::from_values({2}, f64, {0.1, 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)});
  const Array h = d.astype(f16);
  EXPECT_EQ(h.data<float16>()[0].bits, 0x2E66);
  EXPECT_EQ(h.data<float16>()[1].bits, 0x3C01);  // one rounding from double
  const Array back = h.astype(f32);
  EXPECT_EQ(back.data<float>()[0], 0.0999755859375f);
  const Array big = Array::from_vector<int64_t>({1}, {(int64_t{1} << 62) + (int64_t{1} << 38) + 1});
  EXPECT_EQ(big.astype(f32).data<float>()[0], std::ldexp(1.0f, 62) + std::ldexp(1.0f, 39));
  const Array same = f.astype(f32);
  EXPECT_FALSE(same.shares_buffer_with(f));
  EXPECT_TRUE(same_bits(same, f));
}

TEST(Array, Wrap) {
  int released = 0;
  alignas(8) float buf[4] = {1, 2, 3, 4};
  {
    Array a = Array::wrap(buf, {2, 2}, f32, [&] { ++released; });
    Array b = a;
    EXPECT_EQ(a.get({1, 1}), 4.0);
    b.set({0, 0}, 9);
    EXPECT_EQ(buf[0], 9.0f);
    a = Array();
    EXPECT_EQ(released, 0);
  }
  EXPECT_EQ(released, 1);
  expect_error([] { Array::wrap(nullptr, {3}, f32, nullptr); }, {"null"});
}

TEST(Array, ToString) {
  EXPECT_EQ(Array::iota({2, 3}, f32).to_string(), "f32[2, 3]\n[[0, 1, 2],\n [3, 4, 5]]");
  EXPECT_EQ(Array::iota({2, 2, 2}, i32).to_string(),
            "i32[2, 2, 2]\n[[[0, 1],\n  [2, 3]],\n\n [[4, 5],\n  [6, 7]]]");
  EXPECT_EQ(Array::iota({10}, i32).to_string(5), "i32[10]\n[0, 1, 2, ..., 7, 8, 9]");
  EXPECT_EQ(Array::iota({10}, i32).to_string(), "i32[10]\n[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]");
  EXPECT_EQ(Array::iota({8, 2}, i32).to_string(4),
            "i32[8, 2]\n[[0, 1],\n [2, 3],\n [4, 5],\n ...,\n [10, 11],\n [12, 13],\n [14, 15]]");
  EXPECT_EQ(Array::full({}, f32, 2.5).to_string(), "f32[]\n2.5");
  EXPECT_EQ(Array(Shape{0}, f32).to_string(), "f32[0]\n[]");
  EXPECT_EQ(Array(Shape{2, 0}, f32).to_string(), "f32[2, 0]\n[[],\n []]");
  EXPECT_EQ(Array::from_values({3}, bool_, {1, 0, 1}).to_string(), "bool[3]\n[true, false, true]");
  EXPECT_EQ(Array::from_values({3}, f16, {0.1, kNaN, -kInf}).to_string(), "f16[3]\n[0.1, nan, -inf]");
  std::ostringstream os;
  os << Array::iota({2}, u8);
  EXPECT_EQ(os.str(), "u8[2]\n[0, 1]");
}

// ---- Random numbers ------------------------------------------------------------------------

TEST(Array, PrngReferenceVectors) {
  // Published reference outputs (Vigna's splitmix64.c / xoshiro256starstar.c).
  uint64_t state = 0;
  EXPECT_EQ(detail::splitmix64(state), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(detail::splitmix64(state), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(detail::splitmix64(state), 0x06C45D188009454Full);
  detail::Xoshiro256ss x(1, 2, 3, 4);
  EXPECT_EQ(x.next(), 11520u);
  EXPECT_EQ(x.next(), 0u);
  EXPECT_EQ(x.next(), 1509978240u);
  EXPECT_EQ(x.next(), 1215971899390074240u);
}

TEST(Array, DeterministicMathMatchesLibm) {
  for (int k = 1; k <= 20000; ++k) {
    const double x = std::ldexp(static_cast<double>(k) * 0.61803398875, -(k % 60));
    const double want = std::log(x);
    EXPECT_NEAR(detail::det_log(x), want, 4e-16 * std::max(1.0, std::fabs(want))) << x;
  }
  EXPECT_EQ(detail::det_log(1.0), 0.0);
  for (int k = 0; k < 20000; ++k) {
    const double u = k / 20000.0;
    double s, c;
    detail::det_sincos_2pi(u, &s, &c);
    EXPECT_NEAR(s, std::sin(2 * std::numbers::pi * u), 1e-15) << u;
    EXPECT_NEAR(c, std::cos(2 * std::numbers::pi * u), 1e-15) << u;
  }
}

TEST(Array, RandomIsDeterministic) {
  for (DType t : {f32, f16, bf16, f64, i32}) {
    const Array a = Array::random_normal({1001}, t, 7);
    const Array b = Array::random_normal({1001}, t, 7);
    const Array c = Array::random_normal({1001}, t, 8);
    EXPECT_TRUE(same_bits(a, b)) << dtype_name(t);
    EXPECT_FALSE(same_bits(a, c)) << dtype_name(t);
    const Array u = Array::random_uniform({1001}, t, 7, -10, 10);
    EXPECT_TRUE(same_bits(u, Array::random_uniform({1001}, t, 7, -10, 10))) << dtype_name(t);
    EXPECT_FALSE(same_bits(u, Array::random_uniform({1001}, t, 9, -10, 10))) << dtype_name(t);
  }
  // The stream does not depend on the shape, only on the element count.
  EXPECT_TRUE(same_bits(Array::random_normal({6}, f32, 3).reshaped({2, 3}),
                        Array::random_normal({2, 3}, f32, 3)));
}

TEST(Array, LargeRandomArraysAreTheSerialStream) {
  // Large arrays are filled by several threads (one per 2^16 values, up to the cores; here 4,
  // whatever the machine, so that ranges in the middle are filled too); every value must still
  // be the serial stream's, which this recomputes one value after another.
  struct Threads {
    Threads() { detail::random_fill_threads() = 4; }
    ~Threads() { detail::random_fill_threads() = 0; }
  } four;
  const int64_t n = 600001;  // odd: the last Box-Muller pair has one value; 4 ranges of each kind
  Array normal = Array::random_normal({n}, f32, 42, 1.0, 2.0);
  detail::Xoshiro256ss rng(42);
  for (int64_t k = 0; k < n; k += 2) {
    const double u1 = static_cast<double>((rng.next() >> 11) + 1) * 0x1p-53;
    const double radius = std::sqrt(-2 * detail::det_log(u1));
    double s, c;
    detail::det_sincos_2pi(rng.next_double(), &s, &c);
    ASSERT_EQ(normal.at<float>({k}), static_cast<float>(1.0 + 2.0 * (radius * c))) << k;
    if (k + 1 < n) {
      ASSERT_EQ(normal.at<float>({k + 1}), static_cast<float>(1.0 + 2.0 * (radius * s)));
    }
  }
  Array uniform = Array::random_uniform({n}, f64, 43, -1.0, 1.0);
  rng = detail::Xoshiro256ss(43);
  for (int64_t k = 0; k < n; ++k) ASSERT_EQ(uniform.at<double>({k}), -1.0 + 2.0 * rng.next_double());
  // [0, 3 * 2^62): a quarter of the draws are rejected, so values and draws do not line up.
  const uint64_t count = uint64_t{3} << 62;
  Array ints = Array::random_uniform({n}, u64, 44, 0.0, std::ldexp(3.0, 62));
  rng = detail::Xoshiro256ss(44);
  for (int64_t k = 0; k < n; ++k) ASSERT_EQ(ints.at<uint64_t>({k}), rng.next_below(count)) << k;
}

TEST(Array, RandomNormalStatistics) {
  const int64_t n = 100000;
  for (auto [mean, stddev] : {std::pair{0.0, 1.0}, std::pair{3.0, 2.0}}) {
    const std::vector<double> v = Array::random_normal({n}, f32, 1234, mean, stddev).to_doubles();
    double sum = 0, sum_sq = 0;
    int64_t within_one = 0;
    for (double x : v) {
      sum += x;
      sum_sq += x * x;
      within_one += std::fabs(x - mean) < stddev;
    }
    const double m = sum / n;
    const double sd = std::sqrt(sum_sq / n - m * m);
    // Standard errors: mean stddev/316, stddev ~stddev/447, fraction 0.0015. Bounds are >6 sigma.
    EXPECT_NEAR(m, mean, 0.02 * stddev);
    EXPECT_NEAR(sd, stddev, 0.015 * stddev);
    EXPECT_NEAR(static_cast<double>(within_one) / n, 0.682689, 0.01);
  }
}

TEST(Array, RandomUniform) {
  const int64_t n = 100000;
  const std::vector<double> v = Array::random_uniform({n}, f32, 5, 2.0, 4.0).to_doubles();
  double sum = 0;
  for (double x : v) {
    ASSERT_GE(x, 2.0);
    ASSERT_LT(x, 4.0);
    sum += x;
  }
  EXPECT_NEAR(sum / n, 3.0, 0.02);  // standard error 0.0018
  // In f16 about 1 in 4096 draws would round up to 1.0; the range must stay half-open.
  const std::vector<double> h = Array::random_uniform({n}, f16, 5).to_doubles();
  for (double x : h) {
    ASSERT_GE(x, 0.0);
    ASSERT_LT(x, 1.0);
  }
  // Integers: every value of [-3, 4) about equally often.
  const std::vector<double> ints = Array::random_uniform({70000}, i32, 11, -3, 4).to_doubles();
  int counts[7] = {};
  for (double x : ints) {
    ASSERT_GE(x, -3.0);
    ASSERT_LT(x, 4.0);
    ASSERT_EQ(x, std::floor(x));
    ++counts[static_cast<int>(x) + 3];
  }
  for (int c : counts) EXPECT_NEAR(c, 10000, 500);
  const std::vector<double> bools = Array::random_uniform({1000}, bool_, 1, 0, 2).to_doubles();
  int trues = 0;
  for (double x : bools) trues += x == 1.0;
  EXPECT_GT(trues, 400);
  EXPECT_LT(trues, 600);
  const Array all_u8 = Array::random_uniform({1000}, u8, 2, 0, 256);
  EXPECT_EQ(all_u8.dtype(), u8);
  const Array all_u64 = Array::random_uniform({4}, u64, 2, 0, 18446744073709551616.0);
  EXPECT_EQ(all_u64.size(), 4);
  const std::vector<double> neg = Array::random_uniform({100}, i8, 3, -128, -127).to_doubles();
  for (double x : neg) EXPECT_EQ(x, -128.0);
  expect_error([] { Array::random_uniform({4}, f32, 0, 1.0, 1.0); }, {"lo < hi"});
  expect_error([] { Array::random_uniform({4}, i8, 0, 0.0, 1000.0); }, {"i8"});
  expect_error([] { Array::random_uniform({4}, i32, 0, 0.2, 0.7); }, {"no integers"});
  expect_error([] { Array::random_normal({4}, DType::Semaphore, 0); }, {"semaphore"});
}

// ---- allclose ------------------------------------------------------------------------------

TEST(AllClose, EqualArrays) {
  const Array a = Array::iota({3, 4}, f32);
  const AllCloseResult r = allclose(a, a.clone());
  EXPECT_TRUE(r.ok);
  EXPECT_TRUE(static_cast<bool>(r));
  EXPECT_EQ(r.message, "");
  EXPECT_EQ(r.num_mismatched, 0);
  EXPECT_EQ(r.max_abs_error, 0.0);
  EXPECT_EQ(r.max_rel_error, 0.0);
  EXPECT_GE(r.worst_flat_index, 0);
}

TEST(AllClose, ReportsWorstElement) {
  Array expected = Array::full({32, 32}, f32, 1.25);
  Array actual = expected.clone();
  actual.set({0, 1}, 1.3);
  actual.set({5, 5}, 1.2);
  actual.set({3, 7}, 1.5);
  actual.set({31, 31}, 1.375);
  const AllCloseResult r = allclose(actual, expected);
  EXPECT_FALSE(r.ok);
  EXPECT_FALSE(static_cast<bool>(r));
  EXPECT_EQ(r.num_mismatched, 4);
  EXPECT_EQ(r.worst_flat_index, 3 * 32 + 7);
  EXPECT_EQ(r.worst_index, (std::vector<int64_t>{3, 7}));
  EXPECT_EQ(r.worst_actual, 1.5);
  EXPECT_EQ(r.worst_expected, 1.25);
  EXPECT_EQ(r.max_abs_error, 0.25);
  EXPECT_DOUBLE_EQ(r.max_rel_error, 0.2);
  EXPECT_EQ(r.message,
            "mismatch at [3, 7]: actual 1.5, expected 1.25 (abs err 0.25, rel err 0.2); 4 of 1024 "
            "elements mismatched; max abs err 0.25, max rel err 0.2");
}

TEST(AllClose, ToleranceBoundaries) {
  const Array e = Array::from_values({1}, f64, {1.0});
  const Array a = Array::from_values({1}, f64, {1.5});
  EXPECT_TRUE(allclose(a, e, 0.5, 0.0).ok);   // |a-e| == rtol*|e|: inclusive
  EXPECT_TRUE(allclose(a, e, 0.25, 0.25).ok);
  EXPECT_FALSE(allclose(a, e, 0.25, 0.24).ok);
  EXPECT_FALSE(allclose(a, e, 0.0, 0.0).ok);
  // Tolerance scales with |expected|, not |actual|: swapping the arguments matters.
  EXPECT_TRUE(allclose(Array::from_values({1}, f64, {2.0}), Array::from_values({1}, f64, {3.0}), 0.34, 0).ok);
  EXPECT_FALSE(allclose(Array::from_values({1}, f64, {3.0}), Array::from_values({1}, f64, {2.0}), 0.34, 0).ok);
  // expected == 0: the relative error is the absolute error.
  const AllCloseResult z = allclose(Array::from_values({1}, f64, {0.5}), Array::zeros({1}, f64));
  EXPECT_EQ(z.max_rel_error, 0.5);
  EXPECT_EQ(z.max_abs_error, 0.5);
}

TEST(AllClose, NaNAndInf) {
  const Array nan2 = Array::from_values({2}, f32, {kNaN, 1.0});
  EXPECT_TRUE(allclose(nan2, nan2.clone(), 1e-5, 1e-8, true).ok);
  const AllCloseResult strict = allclose(nan2, nan2.clone(), 1e-5, 1e-8, false);
  EXPECT_FALSE(strict.ok);
  EXPECT_EQ(strict.num_mismatched, 1);
  EXPECT_EQ(strict.max_abs_error, kInf);
  EXPECT_EQ(strict.worst_flat_index, 0);
  const AllCloseResult one_nan = allclose(Array::from_values({2}, f32, {1.0, kNaN}),
                                          Array::from_values({2}, f32, {1.0, 2.0}));
  EXPECT_FALSE(one_nan.ok);
  EXPECT_EQ(one_nan.worst_index, (std::vector<int64_t>{1}));
  EXPECT_NE(one_nan.message.find("actual nan, expected 2"), std::string::npos) << one_nan.message;
  const Array inf = Array::from_values({2}, f32, {kInf, -kInf});
  EXPECT_TRUE(allclose(inf, inf.clone()).ok);
  EXPECT_FALSE(allclose(inf, Array::from_values({2}, f32, {kInf, kInf})).ok);
  EXPECT_FALSE(allclose(Array::from_values({1}, f64, {kInf}), Array::from_values({1}, f64, {1e308}),
                        1.0, 1e308).ok);
  EXPECT_FALSE(allclose(Array::from_values({1}, f64, {1e308}), Array::from_values({1}, f64, {kInf}),
                        1.0, 1e308).ok);
}

TEST(AllClose, ShapeMismatchDoesNotThrow) {
  const AllCloseResult r = allclose(Array::zeros({2, 3}, f32), Array::zeros({3, 2}, f32));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("[2, 3]"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("[3, 2]"), std::string::npos) << r.message;
  EXPECT_EQ(r.worst_flat_index, -1);
}

TEST(AllClose, MixedDtypes) {
  const Array h = Array::from_values({3}, f16, {0.1, 1.0, -2.0});
  const Array d = Array::from_values({3}, f64, {0.1, 1.0, -2.0});
  EXPECT_TRUE(allclose(h, d, 1e-3, 0).ok);
  EXPECT_FALSE(allclose(h, d, 1e-5, 0).ok);  // f16(0.1) is off by 2.4e-4 relative
  EXPECT_TRUE(allclose(Array::iota({4}, i32), Array::iota({4}, f32), 0, 0).ok);
}

}  // namespace
}  // namespace pallas
