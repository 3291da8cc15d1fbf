// dot_general (src/eval/dot.cpp) against a reference written here: for every result element, a
// loop over the contracting indices in double (floats) or wrapping uint64 (integers).
#include <gtest/gtest.h>

#include <cmath>

#include "eval/eval.h"
#include "tests/host/eval_test_util.h"

namespace pallas {
namespace {

using ir::AttrKey;
using ir::Ints;
using testutil::Index;

struct DotDims {
  Ints lc, rc, lb, rb;
};

Array dot(const Array& l, const Array& r, const DotDims& d, DType out) {
  return eval::dot_general(l, r,
                           ir::Attrs()
                               .set(AttrKey::LhsContracting, d.lc)
                               .set(AttrKey::RhsContracting, d.rc)
                               .set(AttrKey::LhsBatch, d.lb)
                               .set(AttrKey::RhsBatch, d.rb)
                               .set(AttrKey::DTypeAttr, out));
}

bool contains(const Ints& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// Calls f(lhs flat index, rhs flat index, result flat index) for every product term.
void for_each_term(const Array& l, const Array& r, const DotDims& d,
                   const std::function<void(int64_t, int64_t, int64_t)>& f) {
  Ints lf, rf;
  for (int64_t k = 0; k < l.rank(); ++k)
    if (!contains(d.lc, k) && !contains(d.lb, k)) lf.push_back(k);
  for (int64_t k = 0; k < r.rank(); ++k)
    if (!contains(d.rc, k) && !contains(d.rb, k)) rf.push_back(k);
  Shape out_shape, c_shape;
  for (int64_t k : d.lb) out_shape.push_back(l.shape()[k]);
  for (int64_t k : lf) out_shape.push_back(l.shape()[k]);
  for (int64_t k : rf) out_shape.push_back(r.shape()[k]);
  for (int64_t k : d.lc) c_shape.push_back(l.shape()[k]);
  testutil::for_each_index(out_shape, [&](const Index& o) {
    Index li(l.rank()), ri(r.rank());
    size_t p = 0;
    for (size_t k = 0; k < d.lb.size(); ++k, ++p) li[d.lb[k]] = ri[d.rb[k]] = o[p];
    for (int64_t k : lf) li[k] = o[p++];
    for (int64_t k : rf) ri[k] = o[p++];
    testutil::for_each_index(c_shape, [&](const Index& c) {
      for (size_t k = 0; k < c.size(); ++k) li[d.lc[k]] = ri[d.rc[k]] = c[k];
      f(testutil::flat_of(l.shape(), li), testutil::flat_of(r.shape(), ri),
        testutil::flat_of(out_shape, o));
    });
  });
}

Shape result_shape(const Array& l, const Array& r, const DotDims& d) {
  Shape s;
  for (int64_t k : d.lb) s.push_back(l.shape()[k]);
  for (int64_t k = 0; k < l.rank(); ++k)
    if (!contains(d.lc, k) && !contains(d.lb, k)) s.push_back(l.shape()[k]);
  for (int64_t k = 0; k < r.rank(); ++k)
    if (!contains(d.rc, k) && !contains(d.rb, k)) s.push_back(r.shape()[k]);
  return s;
}

// Float reference in double.
Array ref_dot(const Array& l, const Array& r, const DotDims& d) {
  Array out = Array::zeros(result_shape(l, r, d), f64);
  std::vector<double> lv = l.to_doubles(), rv = r.to_doubles();
  for_each_term(l, r, d, [&](int64_t a, int64_t b, int64_t o) {
    out.data<double>()[o] += lv[static_cast<size_t>(a)] * rv[static_cast<size_t>(b)];
  });
  return out;
}

void expect_close(const Array& got, const Array& want, double rtol, double atol) {
  auto r = allclose(got.astype(f64), want, rtol, atol);
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(DotGeneral, MatmulF32AllLayouts) {
  const int64_t M = 37, K = 53, N = 29;
  Array a = Array::random_normal({M, K}, f32, 1), at = Array::random_normal({K, M}, f32, 2);
  Array b = Array::random_normal({K, N}, f32, 3), bt = Array::random_normal({N, K}, f32, 4);
  struct Case { const Array& l; const Array& r; DotDims d; const char* name; };
  for (const Case& c : {Case{a, b, {{1}, {0}, {}, {}}, "[M,K]x[K,N]"},
                        Case{at, b, {{0}, {0}, {}, {}}, "[K,M]x[K,N]"},
                        Case{a, bt, {{1}, {1}, {}, {}}, "[M,K]x[N,K]"},
                        Case{at, bt, {{0}, {1}, {}, {}}, "[K,M]x[N,K]"},
                        Case{b, a, {{0}, {1}, {}, {}}, "[K,N]x[M,K] -> [N,M]"}}) {
    Array got = dot(c.l, c.r, c.d, f32);
    EXPECT_EQ(got.shape(), result_shape(c.l, c.r, c.d)) << c.name;
    SCOPED_TRACE(c.name);
    expect_close(got, ref_dot(c.l, c.r, c.d), 1e-4, 1e-4);
  }
}

TEST(DotGeneral, BatchDimsAnywhere) {
  // Standard [B,M,K] x [B,K,N].
  Array l = Array::random_normal({3, 4, 5}, f32, 5), r = Array::random_normal({3, 5, 6}, f32, 6);
  DotDims d{{2}, {1}, {0}, {0}};
  Array got = dot(l, r, d, f32);
  EXPECT_EQ(got.shape(), (Shape{3, 4, 6}));
  expect_close(got, ref_dot(l, r, d), 1e-5, 1e-5);
  // Batch in the middle of lhs and last in rhs, contracting first in lhs: needs copies.
  Array l2 = Array::random_normal({5, 3, 4}, f32, 7), r2 = Array::random_normal({6, 5, 3}, f32, 8);
  DotDims d2{{0}, {1}, {1}, {2}};
  Array got2 = dot(l2, r2, d2, f32);
  EXPECT_EQ(got2.shape(), (Shape{3, 4, 6}));
  expect_close(got2, ref_dot(l2, r2, d2), 1e-5, 1e-5);
  // Two batch dims, two contracting dims in swapped order, several free dims.
  Array l3 = Array::random_normal({2, 3, 4, 5, 2}, f64, 9);
  Array r3 = Array::random_normal({5, 2, 2, 4, 3}, f64, 10);
  DotDims d3{{3, 2}, {0, 3}, {0, 4}, {1, 2}};
  Array got3 = dot(l3, r3, d3, f64);
  EXPECT_EQ(got3.shape(), (Shape{2, 2, 3, 3}));
  expect_close(got3, ref_dot(l3, r3, d3), 1e-12, 1e-12);
}

TEST(DotGeneral, VectorsAndMatrixVector) {
  Array x = Array::random_normal({100}, f32, 11), y = Array::random_normal({100}, f32, 12);
  DotDims d{{0}, {0}, {}, {}};
  Array s = dot(x, y, d, f32);
  EXPECT_EQ(s.shape(), Shape{});
  expect_close(s, ref_dot(x, y, d), 1e-5, 1e-5);
  Array m = Array::random_normal({7, 100}, f32, 13);
  expect_close(dot(m, y, {{1}, {0}, {}, {}}, f32), ref_dot(m, y, {{1}, {0}, {}, {}}), 1e-5, 1e-5);
  expect_close(dot(y, m, {{0}, {1}, {}, {}}, f32), ref_dot(y, m, {{0}, {1}, {}, {}}), 1e-5, 1e-5);
  // Outer product: no contracting dims at all.
  Array p = dot(x, y, {{}, {}, {}, {}}, f32);
  EXPECT_EQ(p.shape(), (Shape{100, 100}));
  expect_close(p, ref_dot(x, y, {{}, {}, {}, {}}), 1e-7, 0);
}

TEST(DotGeneral, Int8ToInt32IsExact) {
  Array l = Array::random_uniform({9, 64}, i8, 14, -128, 128);
  Array r = Array::random_uniform({64, 11}, i8, 15, -128, 128);
  DotDims d{{1}, {0}, {}, {}};
  Array got = dot(l, r, d, i32);
  ASSERT_EQ(got.dtype(), i32);
  Array want = Array::zeros({9, 11}, i64);
  for_each_term(l, r, d, [&](int64_t a, int64_t b, int64_t o) {
    want.data<int64_t>()[o] += int64_t{l.data<int8_t>()[a]} * r.data<int8_t>()[b];
  });
  EXPECT_TRUE(allclose(got.astype(f64), want.astype(f64), 0, 0).ok);
  // Extremes: (-128)*(-128)*64 = 2^20.
  Array m = Array::full({1, 64}, i8, -128);
  EXPECT_EQ(dot(m, m, {{1}, {1}, {}, {}}, i32).get_flat(0), 1 << 20);
}

TEST(DotGeneral, IntegerResultsWrap) {
  // i32: products and sums wrap mod 2^32.
  Array l = Array::random_uniform({5, 7}, i32, 16, -2e9, 2e9);
  Array r = Array::random_uniform({7, 3}, i32, 17, -2e9, 2e9);
  DotDims d{{1}, {0}, {}, {}};
  std::vector<uint32_t> want(15, 0);
  for_each_term(l, r, d, [&](int64_t a, int64_t b, int64_t o) {
    want[static_cast<size_t>(o)] += static_cast<uint32_t>(l.data<int32_t>()[a]) *
                                    static_cast<uint32_t>(r.data<int32_t>()[b]);
  });
  Array got = dot(l, r, d, i32);
  for (size_t i = 0; i < 15; ++i)
    EXPECT_EQ(got.data<int32_t>()[i], static_cast<int32_t>(want[i])) << i;
  // i8 result from i8 inputs: 100 * 100 * 3 = 30000 = 117 * 256 + 48.
  Array h = Array::full({1, 3}, i8, 100);
  EXPECT_EQ(dot(h, h, {{1}, {1}, {}, {}}, i8).get_flat(0), 48);
  // u16 x u16 (promotes to int in C++): 65535 * 65535 mod 2^16 = 1, times 2 terms = 2.
  Array u = Array::full({2}, u16, 65535);
  EXPECT_EQ(dot(u, u, {{0}, {0}, {}, {}}, u16).get_flat(0), 2);
}

TEST(DotGeneral, IntegerInputsFloatResult) {
  Array l = Array::random_uniform({4, 6}, i16, 18, -1000, 1000);
  Array r = Array::random_uniform({6, 5}, i16, 19, -1000, 1000);
  DotDims d{{1}, {0}, {}, {}};
  Array got = dot(l, r, d, f32);
  ASSERT_EQ(got.dtype(), f32);
  expect_close(got, ref_dot(l, r, d), 1e-7, 0);  // exact sums, rounded once to f32
  Array u = Array::full({2}, u64, 1e19);  // above 2^63: accumulates unsigned
  Array one = Array::full({2}, u64, 1);
  EXPECT_EQ(dot(u, one, {{0}, {0}, {}, {}}, f64).get_flat(0),
            static_cast<double>(static_cast<uint64_t>(2e19 - 18446744073709551616.0)));
}

TEST(DotGeneral, Bf16InputsF32ResultAgainstFloat64Reference) {
  const int64_t M = 33, K = 300, N = 17;
  Array l = Array::random_normal({M, K}, bf16, 20), r = Array::random_normal({K, N}, bf16, 21);
  DotDims d{{1}, {0}, {}, {}};
  Array got = dot(l, r, d, f32);
  ASSERT_EQ(got.dtype(), f32);
  // bf16 products are exact in f32; only the f32 summation rounds (relative ~1e-6 of the sum of
  // |terms|, which is ~sqrt(K) times |result|).
  expect_close(got, ref_dot(l, r, d), 1e-4, 1e-4);
  // bf16 result: each element is the f32 result rounded once.
  Array gotb = dot(l, r, d, bf16);
  ASSERT_EQ(gotb.dtype(), bf16);
  EXPECT_TRUE(testutil::same_bits(gotb, got.astype(bf16)));
}

TEST(DotGeneral, F32InputsF16ResultRoundsOnce) {
  Array l = Array::random_normal({8, 40}, f32, 22), r = Array::random_normal({40, 8}, f32, 23);
  DotDims d{{1}, {0}, {}, {}};
  Array got = dot(l, r, d, f16);
  ASSERT_EQ(got.dtype(), f16);
  Array want = ref_dot(l, r, d);
  EXPECT_TRUE(testutil::same_bits(got, dot(l, r, d, f32).astype(f16)));
  expect_close(got, want, 1e-3, 1e-3);  // f16 has 11 significant bits
  // f16 inputs, f16 result.
  Array lh = l.astype(f16), rh = r.astype(f16);
  expect_close(dot(lh, rh, d, f16), ref_dot(lh, rh, d), 2e-3, 2e-3);
}

TEST(DotGeneral, OtherResultDtypes) {
  Array l = Array::random_normal({6, 30}, f32, 24), r = Array::random_normal({30, 5}, f32, 25);
  DotDims d{{1}, {0}, {}, {}};
  // f64 result: computed in f64, where f32 products are exact.
  expect_close(dot(l, r, d, f64), ref_dot(l, r, d), 1e-13, 1e-13);
  Array lb = l.astype(bf16), rb = r.astype(bf16);
  expect_close(dot(lb, rb, d, f64), ref_dot(lb, rb, d), 1e-13, 1e-13);
  // Integer result from floats: the f32 result converted (truncated toward zero).
  Array big = dot(l, r, d, f32);
  EXPECT_TRUE(testutil::same_bits(dot(l, r, d, i32), big.astype(i32)));
  // f64 inputs, f32 result: rounded once from f64.
  Array ld = l.astype(f64), rd = r.astype(f64);
  EXPECT_TRUE(testutil::same_bits(dot(ld, rd, d, f32), ref_dot(ld, rd, d).astype(f32)) ||
              allclose(dot(ld, rd, d, f32).astype(f64), ref_dot(ld, rd, d), 1e-7, 1e-7).ok);
  // Repeated calls of different sizes reuse scratch: results stay right.
  for (int64_t n : {3, 70, 5}) {
    Array a = Array::random_normal({n, n}, bf16, 26), b = Array::random_normal({n, n}, bf16, 27);
    expect_close(dot(a, b, d, bf16), ref_dot(a, b, d), 1e-2, 1e-2);
  }
}

TEST(DotGeneral, EmptyDims) {
  Array l({3, 0}, f32), r({0, 4}, f32);
  Array z = dot(l, r, {{1}, {0}, {}, {}}, f32);
  EXPECT_EQ(z.shape(), (Shape{3, 4}));
  for (double v : z.to_doubles()) EXPECT_EQ(v, 0.0);  // empty sums
  Array zi = dot(Array({2, 0}, i8), Array({0, 2}, i8), {{1}, {0}, {}, {}}, i32);
  for (double v : zi.to_doubles()) EXPECT_EQ(v, 0.0);
  EXPECT_EQ(dot(Array({0, 5}, f32), Array({5, 4}, f32), {{1}, {0}, {}, {}}, f32).shape(),
            (Shape{0, 4}));
}

}  // namespace
}  // namespace pallas
