// Exhaustive and randomized sweeps of the elementwise rules, complementing the hand-picked cases
// of eval_elementwise_test.cpp:
// * f16/bf16: every unary op on all 65536 bit patterns, and binary ops on many random pairs,
//   against a double-precision reference rounded once to the dtype (by the array module's
//   conversions, which are tested in dtype_test.cpp). Ops that are correctly rounded in f32
//   (+ - * / sqrt fmod floor ...) must match bit for bit: rounding an f32 result again to f16 or
//   bf16 equals rounding the exact value once, because f32 carries more than 2p+2 bits of an
//   11- or 8-bit format. libm-based ops may be off by one unit in the last place of the dtype.
// * integers: every int dtype, edge values and random pairs, against 128-bit reference arithmetic.
// * convert: every (from, to) dtype pair against Scalar::convert_to.
// * the op table: every elementwise op on every dtype its type rule accepts evaluates, and its
//   result has the type the rule infers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "eval/eval.h"
#include "pallas/pallas.h"

namespace pl = pallas;
namespace ev = pallas::eval;
using pl::DType;
using pl::ir::OpCode;

namespace {

const std::vector<DType> kAllDTypes = {pl::bool_, pl::i8,  pl::i16, pl::i32, pl::i64,
                                       pl::u8,    pl::u16, pl::u32, pl::u64, pl::f16,
                                       pl::bf16,  pl::f32, pl::f64};
const std::vector<DType> kInts = {pl::i8, pl::i16, pl::i32, pl::i64, pl::u8, pl::u16, pl::u32, pl::u64};

// Deterministic 64-bit generator for test inputs (splitmix64).
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

pl::ir::Attrs attrs_with(pl::ir::AttrKey k, int64_t v) {
  pl::ir::Attrs a;
  a.set(k, v);
  return a;
}

// ---- 16-bit floats ----------------------------------------------------------------------------

double half_to_double(DType t, uint16_t b) {
  return t == pl::f16 ? pl::f16_bits_to_float(b) : pl::bf16_bits_to_float(b);
}
uint16_t double_to_half(DType t, double v) {
  return t == pl::f16 ? pl::double_to_f16_bits(v) : pl::double_to_bf16_bits(v);
}
bool half_is_nan(DType t, uint16_t b) { return std::isnan(half_to_double(t, b)); }
// Position on the number line in units in the last place (+0 and -0 both at 0).
int32_t half_order(uint16_t b) {
  const int32_t mag = b & 0x7FFF;
  return (b & 0x8000) ? -mag : mag;
}

pl::Array half_array(DType t, const std::vector<uint16_t>& bits) {
  pl::Array a({static_cast<int64_t>(bits.size())}, t);
  std::memcpy(a.raw_data(), bits.data(), bits.size() * 2);
  return a;
}
uint16_t half_at(const pl::Array& a, int64_t i) {
  uint16_t b;
  std::memcpy(&b, static_cast<const unsigned char*>(a.raw_data()) + 2 * i, 2);
  return b;
}

// Compares results to reference values; reports the first few mismatches.
class HalfChecker {
 public:
  HalfChecker(DType t, std::string what, int max_ulps) : t_(t), what_(std::move(what)), ulps_(max_ulps) {}
  void check(uint16_t got, double want, const std::string& inputs) {
    const uint16_t w = double_to_half(t_, want);
    bool ok;
    if (std::isnan(want)) ok = half_is_nan(t_, got);
    else if (half_is_nan(t_, got)) ok = false;
    else if (ulps_ == 0) ok = got == w;  // bit for bit: also the sign of zero
    else ok = std::abs(half_order(got) - half_order(w)) <= ulps_;
    if (!ok && ++failures_ <= 5)
      ADD_FAILURE() << what_ << " " << pl::dtype_name(t_) << " of " << inputs << ": got bits 0x"
                    << std::hex << got << " (" << half_to_double(t_, got) << "), want 0x" << w
                    << std::dec << " (" << want << ")";
  }
  int failures() const { return failures_; }

 private:
  DType t_;
  std::string what_;
  int ulps_;
  int failures_ = 0;
};

std::vector<uint16_t> all_half_bits() {
  std::vector<uint16_t> v(65536);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint16_t>(i);
  return v;
}

double sign_ref(double x) { return (std::isnan(x) || x == 0) ? x : std::copysign(1.0, x); }

}  // namespace

TEST(ElementwiseSweep, HalfFloatUnaryOpsOnEveryBitPattern) {
  struct Case {
    OpCode op;
    pl::ir::Attrs attrs;
    double (*ref)(double);
    int ulps;
  };
  const std::vector<Case> cases = {
      {OpCode::Neg, {}, [](double x) { return -x; }, 0},
      {OpCode::Abs, {}, [](double x) { return std::fabs(x); }, 0},
      {OpCode::Sign, {}, sign_ref, 0},
      {OpCode::Floor, {}, [](double x) { return std::floor(x); }, 0},
      {OpCode::Ceil, {}, [](double x) { return std::ceil(x); }, 0},
      {OpCode::Round, attrs_with(pl::ir::AttrKey::Rounding, 0), [](double x) { return std::round(x); }, 0},
      {OpCode::Round, attrs_with(pl::ir::AttrKey::Rounding, 1), [](double x) { return std::nearbyint(x); }, 0},
      {OpCode::Sqrt, {}, [](double x) { return std::sqrt(x); }, 0},
      {OpCode::Reciprocal, {}, [](double x) { return 1 / x; }, 0},
      {OpCode::IntegerPow, attrs_with(pl::ir::AttrKey::Exponent, 2), [](double x) { return x * x; }, 0},
      // integer_pow is one op computed in f32: x*x (exact in double) becomes Inf where it
      // overflows f32, which matters for bf16 (same exponent range as f32): bf16 2^64 ^ -2 is 0.
      {OpCode::IntegerPow, attrs_with(pl::ir::AttrKey::Exponent, 3),
       [](double x) { return static_cast<double>(static_cast<float>(x * x)) * x; }, 0},
      {OpCode::IntegerPow, attrs_with(pl::ir::AttrKey::Exponent, -2),
       [](double x) { return 1 / static_cast<double>(static_cast<float>(x * x)); }, 0},
      {OpCode::IntegerPow, attrs_with(pl::ir::AttrKey::Exponent, 0), [](double) { return 1.0; }, 0},
      {OpCode::Rsqrt, {}, [](double x) { return 1 / std::sqrt(x); }, 1},
      {OpCode::Exp, {}, [](double x) { return std::exp(x); }, 1},
      {OpCode::Exp2, {}, [](double x) { return std::exp2(x); }, 1},
      {OpCode::Log, {}, [](double x) { return std::log(x); }, 1},
      {OpCode::Log1p, {}, [](double x) { return std::log1p(x); }, 1},
      {OpCode::Tanh, {}, [](double x) { return std::tanh(x); }, 1},
      {OpCode::Logistic, {}, [](double x) { return 1 / (1 + std::exp(-x)); }, 1},
      {OpCode::Sin, {}, [](double x) { return std::sin(x); }, 1},
      {OpCode::Cos, {}, [](double x) { return std::cos(x); }, 1},
      {OpCode::Erf, {}, [](double x) { return std::erf(x); }, 1},
  };
  const std::vector<uint16_t> bits = all_half_bits();
  for (DType t : {pl::f16, pl::bf16}) {
    const pl::Array x = half_array(t, bits);
    for (const Case& c : cases) {
      const pl::Array y = ev::unary(c.op, x, c.attrs);
      ASSERT_EQ(y.dtype(), t);
      ASSERT_EQ(y.shape(), x.shape());
      HalfChecker check(t, std::string(pl::ir::op_info(c.op).name), c.ulps);
      for (int64_t i = 0; i < x.size(); ++i) {
        const double xv = half_to_double(t, bits[i]);
        check.check(half_at(y, i), c.ref(xv), std::to_string(xv));
      }
    }
    // is_finite: bool result.
    const pl::Array f = ev::unary(OpCode::IsFinite, x, {});
    ASSERT_EQ(f.dtype(), pl::bool_);
    int wrong = 0;
    for (int64_t i = 0; i < x.size(); ++i)
      wrong += f.get_flat(i) != (std::isfinite(half_to_double(t, bits[i])) ? 1.0 : 0.0);
    EXPECT_EQ(wrong, 0) << "is_finite " << pl::dtype_name(t);
  }
}

TEST(ElementwiseSweep, HalfFloatBinaryOpsOnRandomPairs) {
  const double nan = std::nan("");
  struct Case {
    OpCode op;
    double (*ref)(double, double);
    int ulps;
  };
  const std::vector<Case> cases = {
      {OpCode::Add, [](double a, double b) { return a + b; }, 0},
      {OpCode::Sub, [](double a, double b) { return a - b; }, 0},
      {OpCode::Mul, [](double a, double b) { return a * b; }, 0},
      {OpCode::Div, [](double a, double b) { return a / b; }, 0},
      {OpCode::Rem, [](double a, double b) { return std::fmod(a, b); }, 0},
      {OpCode::Max,
       [](double a, double b) {
         if (std::isnan(a) || std::isnan(b)) return std::nan("");
         if (a == 0 && b == 0) return (std::signbit(a) && std::signbit(b)) ? -0.0 : 0.0;
         return a > b ? a : b;
       },
       0},
      {OpCode::Min,
       [](double a, double b) {
         if (std::isnan(a) || std::isnan(b)) return std::nan("");
         if (a == 0 && b == 0) return (std::signbit(a) || std::signbit(b)) ? -0.0 : 0.0;
         return a < b ? a : b;
       },
       0},
      {OpCode::Pow, [](double a, double b) { return std::pow(a, b); }, 1},
  };
  (void)nan;
  // Random bit patterns (every exponent, NaNs and infinities included) plus pairs of specials.
  Rng rng{42};
  std::vector<uint16_t> a, b;
  const std::vector<uint16_t> specials = {0x0000, 0x8000, 0x0001, 0x8001, 0x3C00, 0xBC00,
                                          0x7C00, 0xFC00, 0x7E00, 0x7F80, 0xFF80, 0x7FC0};
  for (uint16_t x : specials)
    for (uint16_t y : specials) a.push_back(x), b.push_back(y);
  for (int i = 0; i < 50000; ++i) {
    const uint64_t r = rng.next();
    a.push_back(static_cast<uint16_t>(r));
    b.push_back(static_cast<uint16_t>(r >> 16));
  }
  for (DType t : {pl::f16, pl::bf16}) {
    const pl::Array xa = half_array(t, a), xb = half_array(t, b);
    for (const Case& c : cases) {
      const pl::Array y = ev::binary(c.op, xa, xb);
      ASSERT_EQ(y.dtype(), t);
      HalfChecker check(t, std::string(pl::ir::op_info(c.op).name), c.ulps);
      for (size_t i = 0; i < a.size(); ++i) {
        const double av = half_to_double(t, a[i]), bv = half_to_double(t, b[i]);
        check.check(half_at(y, static_cast<int64_t>(i)), c.ref(av, bv),
                    std::to_string(av) + ", " + std::to_string(bv));
      }
    }
    // Comparisons: exact, bool results; NaN is unordered.
    struct Cmp {
      OpCode op;
      bool (*ref)(double, double);
    };
    const std::vector<Cmp> cmps = {
        {OpCode::Eq, [](double p, double q) { return p == q; }},
        {OpCode::Ne, [](double p, double q) { return p != q; }},
        {OpCode::Lt, [](double p, double q) { return p < q; }},
        {OpCode::Le, [](double p, double q) { return p <= q; }},
        {OpCode::Gt, [](double p, double q) { return p > q; }},
        {OpCode::Ge, [](double p, double q) { return p >= q; }},
    };
    for (const Cmp& c : cmps) {
      const pl::Array y = ev::binary(c.op, xa, xb);
      ASSERT_EQ(y.dtype(), pl::bool_);
      int wrong = 0;
      for (size_t i = 0; i < a.size(); ++i)
        wrong += (y.get_flat(static_cast<int64_t>(i)) != 0) !=
                 c.ref(half_to_double(t, a[i]), half_to_double(t, b[i]));
      EXPECT_EQ(wrong, 0) << pl::ir::op_info(c.op).name << " " << pl::dtype_name(t);
    }
  }
}

TEST(ElementwiseSweep, HalfFloatLongTilesCrossChunkBoundaries) {
  // Tiles are processed in chunks internally; lengths around typical chunk sizes must still be
  // element-exact at every position.
  for (int64_t n : {1, 255, 256, 257, 511, 512, 513, 1000, 4099}) {
    std::vector<double> av(static_cast<size_t>(n)), bv(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) av[i] = static_cast<double>(i % 97) * 0.25, bv[i] = 1.0 + static_cast<double>(i % 5);
    const pl::Array a = pl::Array::from_values({n}, pl::bf16, av), b = pl::Array::from_values({n}, pl::bf16, bv);
    const pl::Array y = ev::binary(OpCode::Mul, a, b);
    int wrong = 0;
    for (int64_t i = 0; i < n; ++i)
      wrong += half_at(y, i) != pl::double_to_bf16_bits(a.get_flat(i) * b.get_flat(i));
    EXPECT_EQ(wrong, 0) << "n = " << n;
  }
}

// ---- Integers -----------------------------------------------------------------------------------

namespace {

using i128 = __int128;
using u128 = unsigned __int128;

// An integer dtype's value set: w bits, signed or not.
struct IntType {
  DType t;
  int w;
  bool is_signed;
  u128 mask() const { return (u128{1} << w) - 1; }
  // The value of the w-bit pattern `bits`.
  i128 value(u128 bits) const {
    bits &= mask();
    if (is_signed && (bits >> (w - 1)) & 1) return static_cast<i128>(bits) - (i128{1} << w);
    return static_cast<i128>(bits);
  }
  i128 wrap(i128 v) const { return value(static_cast<u128>(v)); }
  i128 min() const { return is_signed ? -(i128{1} << (w - 1)) : 0; }
  i128 max() const { return is_signed ? (i128{1} << (w - 1)) - 1 : (i128{1} << w) - 1; }
};

IntType int_type(DType t) { return {t, pl::bit_width(t), pl::is_signed_int(t)}; }

pl::Array int_array(const IntType& it, const std::vector<i128>& v) {
  pl::Array a({static_cast<int64_t>(v.size())}, it.t);
  for (size_t i = 0; i < v.size(); ++i) {
    const u128 bits = static_cast<u128>(v[i]);
    const uint64_t low = static_cast<uint64_t>(bits);  // little-endian: the low bytes first
    std::memcpy(static_cast<unsigned char*>(a.raw_data()) + i * (it.w / 8), &low, static_cast<size_t>(it.w / 8));
  }
  return a;
}
i128 int_at(const IntType& it, const pl::Array& a, int64_t i) {
  uint64_t low = 0;
  std::memcpy(&low, static_cast<const unsigned char*>(a.raw_data()) + i * (it.w / 8), static_cast<size_t>(it.w / 8));
  return it.value(low);
}
std::string str(i128 v) {
  if (v == 0) return "0";
  std::string s;
  const bool neg = v < 0;
  u128 m = neg ? static_cast<u128>(0) - static_cast<u128>(v) : static_cast<u128>(v);
  while (m) s.insert(s.begin(), static_cast<char>('0' + static_cast<int>(m % 10))), m /= 10;
  return neg ? "-" + s : s;
}

// Edge values of the type plus random ones.
std::vector<i128> int_values(const IntType& it, Rng& rng, int n_random) {
  std::vector<i128> v = {it.min(), it.min() + 1, it.max(), it.max() - 1, 0, 1, 2, 3, 7,
                         it.w - 1, it.w, it.w + 1};
  if (it.is_signed) v.insert(v.end(), {-1, -2, -7, -it.w});
  for (int i = 0; i < n_random; ++i) v.push_back(it.value(rng.next()));
  return v;
}

}  // namespace

TEST(ElementwiseSweep, IntegerBinaryOpsMatch128BitReferenceInEveryIntDtype) {
  struct Case {
    OpCode op;
    i128 (*ref)(const IntType&, i128, i128);
  };
  const std::vector<Case> cases = {
      {OpCode::Add, [](const IntType& it, i128 a, i128 b) { return it.wrap(a + b); }},
      {OpCode::Sub, [](const IntType& it, i128 a, i128 b) { return it.wrap(a - b); }},
      // The low w bits of a product only depend on the low bits of the factors: multiply mod 2^128.
      {OpCode::Mul, [](const IntType& it, i128 a, i128 b) {
         return it.value(static_cast<u128>(a) * static_cast<u128>(b));
       }},
      {OpCode::Div, [](const IntType& it, i128 a, i128 b) -> i128 {
         if (b == 0) return it.value(~u128{0});  // all bits set
         return it.wrap(a / b);                   // INT_MIN / -1 = 2^(w-1) wraps to INT_MIN
       }},
      {OpCode::Rem, [](const IntType&, i128 a, i128 b) -> i128 { return b == 0 ? a : a % b; }},
      {OpCode::Max, [](const IntType&, i128 a, i128 b) { return a > b ? a : b; }},
      {OpCode::Min, [](const IntType&, i128 a, i128 b) { return a < b ? a : b; }},
      {OpCode::And, [](const IntType& it, i128 a, i128 b) { return it.value(static_cast<u128>(a) & static_cast<u128>(b)); }},
      {OpCode::Or, [](const IntType& it, i128 a, i128 b) { return it.value(static_cast<u128>(a) | static_cast<u128>(b)); }},
      {OpCode::Xor, [](const IntType& it, i128 a, i128 b) { return it.value(static_cast<u128>(a) ^ static_cast<u128>(b)); }},
      // Shift amounts are read as unsigned w-bit numbers.
      {OpCode::ShiftLeft, [](const IntType& it, i128 a, i128 b) -> i128 {
         const u128 s = static_cast<u128>(b) & it.mask();
         return s >= static_cast<u128>(it.w) ? 0 : it.value(static_cast<u128>(a) << static_cast<int>(s));
       }},
      {OpCode::ShiftRightLogical, [](const IntType& it, i128 a, i128 b) -> i128 {
         const u128 s = static_cast<u128>(b) & it.mask();
         return s >= static_cast<u128>(it.w) ? 0 : it.value((static_cast<u128>(a) & it.mask()) >> static_cast<int>(s));
       }},
      // The w-bit pattern read as signed, shifted with sign fill.
      {OpCode::ShiftRightArithmetic, [](const IntType& it, i128 a, i128 b) -> i128 {
         const u128 s = static_cast<u128>(b) & it.mask();
         const IntType signed_view{it.t, it.w, true};
         const i128 sa = signed_view.value(static_cast<u128>(a));
         const i128 r = s >= static_cast<u128>(it.w) ? (sa < 0 ? -1 : 0) : sa >> static_cast<int>(s);
         return it.wrap(r);
       }},
  };
  Rng rng{7};
  for (DType t : kInts) {
    const IntType it = int_type(t);
    const std::vector<i128> vals = int_values(it, rng, 40);
    std::vector<i128> a, b;
    for (i128 x : vals)
      for (i128 y : vals) a.push_back(x), b.push_back(y);
    const pl::Array xa = int_array(it, a), xb = int_array(it, b);
    for (const Case& c : cases) {
      const pl::Array y = ev::binary(c.op, xa, xb);
      ASSERT_EQ(y.dtype(), t);
      int failures = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        const i128 got = int_at(it, y, static_cast<int64_t>(i)), want = c.ref(it, a[i], b[i]);
        if (got != want && ++failures <= 5)
          ADD_FAILURE() << pl::ir::op_info(c.op).name << " " << pl::dtype_name(t) << "(" << str(a[i])
                        << ", " << str(b[i]) << "): got " << str(got) << ", want " << str(want);
      }
    }
    struct Cmp {
      OpCode op;
      bool (*ref)(i128, i128);
    };
    for (const Cmp& c : std::vector<Cmp>{{OpCode::Eq, [](i128 p, i128 q) { return p == q; }},
                                         {OpCode::Ne, [](i128 p, i128 q) { return p != q; }},
                                         {OpCode::Lt, [](i128 p, i128 q) { return p < q; }},
                                         {OpCode::Le, [](i128 p, i128 q) { return p <= q; }},
                                         {OpCode::Gt, [](i128 p, i128 q) { return p > q; }},
                                         {OpCode::Ge, [](i128 p, i128 q) { return p >= q; }}}) {
      const pl::Array y = ev::binary(c.op, xa, xb);
      ASSERT_EQ(y.dtype(), pl::bool_);
      int wrong = 0;
      for (size_t i = 0; i < a.size(); ++i) wrong += (y.get_flat(static_cast<int64_t>(i)) != 0) != c.ref(a[i], b[i]);
      EXPECT_EQ(wrong, 0) << pl::ir::op_info(c.op).name << " " << pl::dtype_name(t);
    }
  }
}

TEST(ElementwiseSweep, IntegerUnaryOpsMatch128BitReferenceInEveryIntDtype) {
  struct Case {
    OpCode op;
    pl::ir::Attrs attrs;
    i128 (*ref)(const IntType&, i128);
  };
  const std::vector<Case> cases = {
      {OpCode::Neg, {}, [](const IntType& it, i128 x) { return it.wrap(-x); }},
      {OpCode::Abs, {}, [](const IntType& it, i128 x) { return it.wrap(x < 0 ? -x : x); }},
      {OpCode::Sign, {}, [](const IntType&, i128 x) -> i128 { return x > 0 ? 1 : x < 0 ? -1 : 0; }},
      {OpCode::Not, {}, [](const IntType& it, i128 x) { return it.value(~static_cast<u128>(x)); }},
      {OpCode::IntegerPow, attrs_with(pl::ir::AttrKey::Exponent, 0), [](const IntType&, i128) -> i128 { return 1; }},
      {OpCode::IntegerPow, attrs_with(pl::ir::AttrKey::Exponent, 1), [](const IntType&, i128 x) { return x; }},
      {OpCode::IntegerPow, attrs_with(pl::ir::AttrKey::Exponent, 5), [](const IntType& it, i128 x) {
         const u128 u = static_cast<u128>(x);
         return it.value(u * u * u * u * u);
       }},
      {OpCode::IntegerPow, attrs_with(pl::ir::AttrKey::Exponent, 12), [](const IntType& it, i128 x) {
         u128 r = 1;
         for (int k = 0; k < 12; ++k) r *= static_cast<u128>(x);
         return it.value(r);
       }},
      {OpCode::MultipleOf, attrs_with(pl::ir::AttrKey::N, 8), [](const IntType&, i128 x) { return x; }},
  };
  Rng rng{11};
  for (DType t : kInts) {
    const IntType it = int_type(t);
    const std::vector<i128> vals = int_values(it, rng, 200);
    const pl::Array x = int_array(it, vals);
    for (const Case& c : cases) {
      const pl::Array y = ev::unary(c.op, x, c.attrs);
      ASSERT_EQ(y.dtype(), t);
      int failures = 0;
      for (size_t i = 0; i < vals.size(); ++i) {
        const i128 got = int_at(it, y, static_cast<int64_t>(i)), want = c.ref(it, vals[i]);
        if (got != want && ++failures <= 5)
          ADD_FAILURE() << pl::ir::op_info(c.op).name << " " << pl::dtype_name(t) << "(" << str(vals[i])
                        << "): got " << str(got) << ", want " << str(want);
      }
    }
  }
}

// ---- Bool -------------------------------------------------------------------------------------

TEST(ElementwiseSweep, BoolOpsAreLogical) {
  const pl::Array a = pl::Array::from_values({4}, pl::bool_, {0, 0, 1, 1});
  const pl::Array b = pl::Array::from_values({4}, pl::bool_, {0, 1, 0, 1});
  auto v = [](const pl::Array& x) { return x.to_doubles(); };
  EXPECT_EQ(v(ev::binary(OpCode::Max, a, b)), (std::vector<double>{0, 1, 1, 1}));  // or
  EXPECT_EQ(v(ev::binary(OpCode::Min, a, b)), (std::vector<double>{0, 0, 0, 1}));  // and
  EXPECT_EQ(v(ev::binary(OpCode::Lt, a, b)), (std::vector<double>{0, 1, 0, 0}));   // false < true
  EXPECT_EQ(v(ev::binary(OpCode::Ge, a, b)), (std::vector<double>{1, 0, 1, 1}));
  EXPECT_EQ(v(ev::binary(OpCode::Eq, a, b)), (std::vector<double>{1, 0, 0, 1}));
  EXPECT_EQ(ev::binary(OpCode::Max, a, b).dtype(), pl::bool_);
  // Results are stored as the bytes 0 / 1.
  const pl::Array n = ev::unary(OpCode::Not, a, {});
  const auto* bytes = static_cast<const uint8_t*>(n.raw_data());
  EXPECT_EQ((std::vector<int>{bytes[0], bytes[1], bytes[2], bytes[3]}), (std::vector<int>{1, 1, 0, 0}));
}

// ---- Select, constant, iota, bitcast ---------------------------------------------------------------

TEST(ElementwiseSweep, SelectMovesBitsExactlyInEveryDtype) {
  Rng rng{3};
  for (DType t : kAllDTypes) {
    const int64_t n = 37;
    const int es = pl::itemsize(t);
    pl::Array x({n}, t), y({n}, t), p({n}, pl::bool_);
    std::vector<unsigned char> xb(static_cast<size_t>(n * es)), yb(xb.size());
    for (auto& c : xb) c = static_cast<unsigned char>(rng.next());
    for (auto& c : yb) c = static_cast<unsigned char>(rng.next());
    if (t == pl::bool_)
      for (size_t i = 0; i < xb.size(); ++i) xb[i] &= 1, yb[i] &= 1;  // valid bools only
    std::memcpy(x.raw_data(), xb.data(), xb.size());
    std::memcpy(y.raw_data(), yb.data(), yb.size());
    std::vector<bool> pv(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pv[i] = (rng.next() & 1) != 0, p.set_flat(i, pv[i]);
    const pl::Array r = ev::select(p, x, y);
    ASSERT_EQ(r.shape_dtype(), x.shape_dtype());
    const auto* rb = static_cast<const unsigned char*>(r.raw_data());
    int wrong = 0;
    for (int64_t i = 0; i < n; ++i)
      wrong += std::memcmp(rb + i * es, (pv[i] ? xb.data() : yb.data()) + i * es, static_cast<size_t>(es)) != 0;
    EXPECT_EQ(wrong, 0) << pl::dtype_name(t);  // NaN payloads, -0 and all included
  }
}

TEST(ElementwiseSweep, ConstantSplatsTheRoundedValue) {
  const pl::Array h = ev::constant(pl::Scalar::of_float(1.0 / 3.0, pl::bf16), {3, 2});
  ASSERT_EQ(h.shape_dtype(), pl::ShapeDtype({3, 2}, pl::bf16));
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(half_at(h, i), 0x3EAB);  // bf16(1/3), RNE
  const pl::Array e = ev::constant(pl::Scalar::of_int(1, pl::bool_), {0, 5});
  EXPECT_EQ(e.size(), 0);
  const pl::Array s = ev::constant(pl::Scalar::of_uint(0xFFFFFFFFFFFFFFFFull, pl::u64), {});
  EXPECT_EQ(s.to_vector<uint64_t>(), (std::vector<uint64_t>{0xFFFFFFFFFFFFFFFFull}));
}

TEST(ElementwiseSweep, IotaAlongEveryAxisAndRoundingInF16) {
  const pl::Shape shape = {2, 3, 4};
  for (int64_t axis = 0; axis < 3; ++axis) {
    const pl::Array it = ev::iota(pl::i64, shape, axis);
    ASSERT_EQ(it.shape(), shape);
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < 3; ++j)
        for (int64_t k = 0; k < 4; ++k) {
          const int64_t want = axis == 0 ? i : axis == 1 ? j : k;
          EXPECT_EQ(it.get({i, j, k}), static_cast<double>(want)) << "axis " << axis;
        }
  }
  // f16 holds integers exactly only up to 2048; 2049 is a tie and rounds to even (2048), 2051
  // rounds to 2052.
  const pl::Array h = ev::iota(pl::f16, {2052}, 0);
  EXPECT_EQ(h.get({2047}), 2047);
  EXPECT_EQ(h.get({2049}), 2048);
  EXPECT_EQ(h.get({2051}), 2052);
}

TEST(ElementwiseSweep, BitcastShapesAndLittleEndianOrder) {
  const pl::Array d = pl::Array::from_values({2}, pl::f64, {1.0, -0.0});
  const pl::Array bytes = ev::bitcast(d, pl::u8);
  ASSERT_EQ(bytes.shape(), (pl::Shape{2, 8}));
  EXPECT_EQ(bytes.to_vector<uint8_t>(),
            (std::vector<uint8_t>{0, 0, 0, 0, 0, 0, 0xF0, 0x3F, 0, 0, 0, 0, 0, 0, 0, 0x80}));
  // Narrow -> wide consumes a trailing dimension of the ratio.
  const pl::Array words = ev::bitcast(bytes.reshaped({2, 2, 4}), pl::u32);
  ASSERT_EQ(words.shape(), (pl::Shape{2, 2}));
  EXPECT_EQ(words.to_vector<uint32_t>(), (std::vector<uint32_t>{0, 0x3FF00000u, 0, 0x80000000u}));
  // Same width keeps the shape; bf16 1.0 is 0x3F80.
  const pl::Array h = ev::bitcast(pl::Array::from_values({1}, pl::bf16, {1.0}), pl::i16);
  EXPECT_EQ(h.to_vector<int16_t>(), (std::vector<int16_t>{0x3F80}));
  // Scalars gain a dimension.
  const pl::Array s = ev::bitcast(pl::Array::from_values({}, pl::u16, {0xABCD}), pl::u8);
  EXPECT_EQ(s.shape(), (pl::Shape{2}));
  EXPECT_EQ(s.to_vector<uint8_t>(), (std::vector<uint8_t>{0xCD, 0xAB}));
}

// ---- Convert -----------------------------------------------------------------------------------

TEST(ElementwiseSweep, ConvertMatchesScalarConvertForEveryDtypePair) {
  const double inf = std::numeric_limits<double>::infinity();
  // Values chosen around every rounding and saturation boundary of the dtypes.
  const std::vector<double> doubles = {
      0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 1.5, -1.5, 2.5, 2.9, -2.9, 127.5, 128.0, -128.5, -129.0,
      255.5, 256.0, 32767.9, 32768.0, -32769.0, 65504.0, 65519.0, 65520.0, 1e10, -1e10,
      2147483647.0, 2147483648.0, -2147483649.0, 4294967296.0, 16777217.0, 9.2233720368547758e18,
      -9.2233720368547758e18, 1.8446744073709552e19, 1e30, -1e30, 3.5e38, 1e-8, 6e-8, 1e-40,
      1 + std::ldexp(1.0, -8), 1 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40), inf, -inf, std::nan("")};
  std::vector<pl::Scalar> extra_ints = {
      pl::Scalar::of_int(std::numeric_limits<int64_t>::min(), pl::i64),
      pl::Scalar::of_int(std::numeric_limits<int64_t>::max(), pl::i64),
      pl::Scalar::of_int((int64_t{1} << 60) + (int64_t{1} << 52) + 1, pl::i64),  // just above a bf16 tie
      pl::Scalar::of_int((int64_t{1} << 60) + (int64_t{1} << 52), pl::i64),      // exactly a bf16 tie
      pl::Scalar::of_int(16777217, pl::i32),
      pl::Scalar::of_uint(0xFFFFFFFFFFFFFFFFull, pl::u64),
      pl::Scalar::of_uint(0x8000008000000001ull, pl::u64),  // f32 needs a sticky bit here
      pl::Scalar::of_uint(0xFFFFFFFFull, pl::u32)};
  for (DType from : kAllDTypes) {
    std::vector<pl::Scalar> src;
    for (double d : doubles) src.push_back(pl::Scalar::from_double(d, from));
    for (const pl::Scalar& s : extra_ints) src.push_back(s.convert_to(from));
    pl::Array x({static_cast<int64_t>(src.size())}, from);
    const int fs = pl::itemsize(from);
    for (size_t i = 0; i < src.size(); ++i)
      src[i].store_to(static_cast<unsigned char*>(x.raw_data()) + i * fs);
    for (DType to : kAllDTypes) {
      const pl::Array y = ev::convert(x, to);
      ASSERT_EQ(y.shape_dtype(), pl::ShapeDtype(x.shape(), to));
      const int ts = pl::itemsize(to);
      int failures = 0;
      for (size_t i = 0; i < src.size(); ++i) {
        const pl::Scalar in = x.scalar_at_flat(static_cast<int64_t>(i));
        const pl::Scalar want = in.convert_to(to);
        const pl::Scalar got = y.scalar_at_flat(static_cast<int64_t>(i));
        unsigned char wb[8] = {}, gb[8] = {};
        want.store_to(wb);
        std::memcpy(gb, static_cast<const unsigned char*>(y.raw_data()) + i * ts, static_cast<size_t>(ts));
        const bool both_nan = pl::is_float(to) && std::isnan(want.f) && std::isnan(got.f);
        if (!both_nan && std::memcmp(wb, gb, static_cast<size_t>(ts)) != 0 && ++failures <= 3)
          ADD_FAILURE() << "convert " << pl::dtype_name(from) << " " << in.to_string() << " -> "
                        << pl::dtype_name(to) << ": got " << got.to_string() << ", want " << want.to_string();
      }
    }
  }
}

// ---- The op table -------------------------------------------------------------------------------

TEST(ElementwiseSweep, EveryElementwiseOpEvaluatesOnEveryDtypeItsTypeRuleAccepts) {
  int evaluated = 0;
  for (int c = 0; c < pl::ir::kNumOpCodes; ++c) {
    const auto code = static_cast<OpCode>(c);
    const pl::ir::OpInfo& info = pl::ir::op_info(code);
    if (!(info.is(pl::ir::kUnary) || info.is(pl::ir::kBinary) || info.is(pl::ir::kCompare))) continue;
    for (DType t : kAllDTypes) {
      pl::ir::Op op;
      op.code = code;
      op.attrs.set(pl::ir::AttrKey::Exponent, int64_t{2});
      op.attrs.set(pl::ir::AttrKey::N, int64_t{2});
      const pl::ir::Type in_type = pl::ir::Type::tensor({3, 5}, t);
      std::vector<pl::ir::Type> result;
      try {
        result = pl::ir::infer_result_types(code, std::vector<pl::ir::Type>(info.num_operands, in_type),
                                            op.attrs, {}, {});
      } catch (const pl::Error&) {
        continue;  // the type rule rejects this dtype: nothing to evaluate
      }
      const pl::Array x = pl::Array::full({3, 5}, t, 1);
      std::vector<pl::Array> in(static_cast<size_t>(info.num_operands), x);
      std::vector<pl::Array> out;
      try {
        out = ev::pure_op(op, in);
      } catch (const std::exception& e) {
        ADD_FAILURE() << info.name << " on " << pl::dtype_name(t) << ": " << e.what();
        continue;
      }
      ASSERT_EQ(out.size(), 1u);
      EXPECT_EQ(out[0].shape(), result[0].shape) << info.name << " " << pl::dtype_name(t);
      EXPECT_EQ(out[0].dtype(), result[0].dtype) << info.name << " " << pl::dtype_name(t);
      ++evaluated;
    }
  }
  EXPECT_GT(evaluated, 200);  // the sweep really ran (about 40 ops x their dtypes)
}
