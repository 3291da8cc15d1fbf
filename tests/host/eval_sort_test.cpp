// sort (src/eval/sort.cpp) against an insertion sort written here (stable by construction) and
// hand-written expected orders.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "eval/eval.h"
#include "tests/host/eval_test_util.h"

namespace pallas {
namespace {

using ir::AttrKey;
using testutil::same_bits;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<Array> sort(std::vector<Array> xs, int64_t num_keys, bool descending = false) {
  return eval::sort(xs, ir::Attrs()
                            .set(AttrKey::NumKeys, num_keys)
                            .set(AttrKey::Descending, int64_t{descending}));
}

// Reference: stable insertion sort of positions 0..n-1 of each row by `before(a, b)` (strictly
// before), then every operand gathered by the resulting order.
std::vector<Array> ref_sort(const std::vector<Array>& xs,
                            const std::function<bool(int64_t, int64_t)>& before) {
  const int64_t n = xs[0].shape().back();
  const int64_t rows = xs[0].size() / n;
  std::vector<Array> out;
  for (const Array& x : xs) out.emplace_back(x.shape(), x.dtype());
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> order;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t e = r * n + i;
      size_t pos = order.size();
      while (pos > 0 && before(e, order[pos - 1])) --pos;  // only move past strictly-after ones
      order.insert(order.begin() + static_cast<int64_t>(pos), e);
    }
    for (size_t k = 0; k < xs.size(); ++k) {
      const int es = itemsize(xs[k].dtype());
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(static_cast<unsigned char*>(out[k].raw_data()) + (r * n + i) * es,
                    testutil::elem_ptr(xs[k], order[static_cast<size_t>(i)]),
                    static_cast<size_t>(es));
    }
  }
  return out;
}

TEST(Sort, StableWithDuplicatesCarriesValues) {
  Array keys = Array::from_values({10}, i32, {3, 1, 2, 3, 1, 2, 0, 3, 1, 0});
  Array vals = Array::iota({10}, f32);
  auto got = sort({keys, vals}, 1);
  EXPECT_EQ(got[0].to_doubles(), (std::vector<double>{0, 0, 1, 1, 1, 2, 2, 3, 3, 3}));
  EXPECT_EQ(got[1].to_doubles(), (std::vector<double>{6, 9, 1, 4, 8, 2, 5, 0, 3, 7}));
}

TEST(Sort, DescendingStaysStable) {
  Array keys = Array::from_values({10}, i32, {3, 1, 2, 3, 1, 2, 0, 3, 1, 0});
  Array vals = Array::iota({10}, i32);
  auto got = sort({keys, vals}, 1, true);
  EXPECT_EQ(got[0].to_doubles(), (std::vector<double>{3, 3, 3, 2, 2, 1, 1, 1, 0, 0}));
  EXPECT_EQ(got[1].to_doubles(), (std::vector<double>{0, 3, 7, 2, 5, 1, 4, 8, 6, 9}));
}

TEST(Sort, RandomRowsMatchReferenceForEveryDtype) {
  for (DType t : {i8, i16, i32, i64, u8, u16, u32, u64, f16, bf16, f32, f64, bool_}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    // Few distinct values per row so stability is exercised.
    Array keys = is_float(t) ? Array::random_uniform({4, 33}, i32, 1, -4, 4).astype(t)
                             : testutil::random_array({4, 33}, t, 1);
    if (is_integer(t)) keys = Array::random_uniform({4, 33}, t, 1, 0, 5);
    Array vals = Array::iota({4, 33}, i32);
    for (bool desc : {false, true}) {
      auto want = ref_sort({keys, vals}, [&](int64_t a, int64_t b) {
        const double ka = keys.get_flat(a), kb = keys.get_flat(b);
        return desc ? ka > kb : ka < kb;
      });
      auto got = sort({keys, vals}, 1, desc);
      EXPECT_TRUE(same_bits(got[0], want[0])) << "descending " << desc;
      EXPECT_TRUE(same_bits(got[1], want[1])) << "descending " << desc;
    }
  }
}

TEST(Sort, FloatTotalOrderPlacesNaNsAndSignedZeros) {
  for (DType t : {f32, f64, bf16, f16}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    Array x = Array::from_values({9}, t, {kNaN, 1, -kNaN, -0.0, kInf, 0.0, -1, -kInf, -0.0});
    Array vals = Array::iota({9}, i32);
    auto got = sort({x, vals}, 1);
    // -NaN < -inf < -1 < -0 (twice, in input order) < +0 < 1 < inf < NaN.
    EXPECT_EQ(got[1].to_doubles(), (std::vector<double>{2, 7, 6, 3, 8, 5, 1, 4, 0}));
    EXPECT_TRUE(std::isnan(got[0].get_flat(0)) && std::signbit(got[0].get_flat(0)));
    EXPECT_TRUE(std::signbit(got[0].get_flat(3)));
    EXPECT_FALSE(std::signbit(got[0].get_flat(5)));
    EXPECT_TRUE(std::isnan(got[0].get_flat(8)) && !std::signbit(got[0].get_flat(8)));
    auto desc = sort({x, vals}, 1, true);
    EXPECT_EQ(desc[1].to_doubles(), (std::vector<double>{0, 4, 1, 5, 3, 8, 6, 7, 2}));
  }
}

TEST(Sort, FullRangeIntegers) {
  const uint64_t big = uint64_t{1} << 63;
  Array u = Array::from_vector<uint64_t>({4}, {big + 5, 3, ~uint64_t{0}, big});
  EXPECT_EQ(sort({u}, 1)[0].to_vector<uint64_t>(),
            (std::vector<uint64_t>{3, big, big + 5, ~uint64_t{0}}));
  const int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  Array s = Array::from_vector<int64_t>({4}, {hi, -1, lo, 0});
  EXPECT_EQ(sort({s}, 1)[0].to_vector<int64_t>(), (std::vector<int64_t>{lo, -1, 0, hi}));
  Array b = Array::from_values({5}, i8, {127, -128, 0, -1, 1});
  EXPECT_EQ(sort({b}, 1)[0].to_doubles(), (std::vector<double>{-128, -1, 0, 1, 127}));
}

TEST(Sort, MultipleKeysAreLexicographic) {
  Array k0 = Array::from_values({3, 6}, i32, {1, 0, 1, 0, 1, 0,  //
                                              2, 2, 1, 1, 0, 0,  //
                                              5, 5, 5, 5, 5, 5});
  Array k1 = Array::from_values({3, 6}, f32, {3, 2, 1, 2, 3, 1,  //
                                              9, 8, 7, 6, 5, 4,  //
                                              1, 0, 1, 0, 1, 0});
  Array v = Array::iota({3, 6}, u8);
  for (bool desc : {false, true}) {
    auto want = ref_sort({k0, k1, v}, [&](int64_t a, int64_t b) {
      double a0 = k0.get_flat(a), b0 = k0.get_flat(b), a1 = k1.get_flat(a), b1 = k1.get_flat(b);
      if (a0 != b0) return desc ? a0 > b0 : a0 < b0;
      return desc ? a1 > b1 : a1 < b1;
    });
    auto got = sort({k0, k1, v}, 2, desc);
    for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(same_bits(got[i], want[i])) << i;
  }
  // Row 0 ascending by hand: (0,1)@5 (0,2)@1 (0,2)@3 (1,1)@2 (1,3)@0 (1,3)@4.
  EXPECT_EQ(sort({k0, k1, v}, 2)[2].to_doubles()[0], 5);
  EXPECT_EQ(sort({k0, k1, v}, 2)[2].to_doubles()[1], 1);
  EXPECT_EQ(sort({k0, k1, v}, 2)[2].to_doubles()[2], 3);
}

TEST(Sort, KeyOnlyAndEmpty) {
  Array x = Array::from_values({2, 3}, f32, {3, 1, 2, -1, -3, -2});
  EXPECT_EQ(sort({x}, 1)[0].to_doubles(), (std::vector<double>{1, 2, 3, -3, -2, -1}));
  EXPECT_EQ(sort({Array({2, 0}, f32)}, 1)[0].shape(), (Shape{2, 0}));
}

}  // namespace
}  // namespace pallas
