// pl::jvp against central finite differences in float64: for a call f, primals x and tangents t,
// (f(x + h t) - f(x - h t)) / 2h must match the jvp's tangent outputs, and its primal outputs
// must equal f(x). One small kernel per op family, then the bundled softmax, layer_norm and
// matmul kernels, then the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <tuple>
#include <utility>

#include "tests/test_util.h"
#include "examples/examples.h"
#include "pallas/pallas.h"
#include "pallas/tpu.h"
#include "transforms/jvp.h"

namespace pl = pallas;
namespace pltpu = pallas::tpu;
namespace ex = pallas::examples;

namespace {

using Kernel = std::function<void(std::vector<pl::Ref>&)>;

pl::Array axpy(const pl::Array& x, double a, const pl::Array& t) {
  pl::Array r = x.clone();
  for (int64_t i = 0; i < x.size(); ++i) r.set_flat(i, x.get_flat(i) + a * t.get_flat(i));
  return r;
}

std::string kernel_ir(const pl::PallasCall& call, const std::vector<pl::Array>& xs) {
  std::vector<pl::ShapeDtype> s;
  for (const pl::Array& x : xs) s.push_back(x.shape_dtype());
  return pl::ir::print(pl::jvp_call(call, s).trace([&] {
    std::vector<pl::ShapeDtype> all = s;
    for (const pl::ShapeDtype& d : s)
      if (pl::is_float(d.dtype)) all.push_back(d);
    return all;
  }())->kernel);
}

// Checks pl::jvp(call, xs, ts) against central differences (f64 inputs) and the primal outputs
// against call(xs).
void expect_jvp_matches_fd(const pl::PallasCall& call, const std::vector<pl::Array>& xs,
                           const std::vector<pl::Array>& ts, double rtol = 1e-6,
                           double atol = 1e-7) {
  const double h = 1e-6;
  pl::JvpOutputs d = pl::jvp(call, xs, ts);
  std::vector<pl::Array> f = call(xs);
  std::vector<pl::Array> plus_in, minus_in;
  for (size_t i = 0; i < xs.size(); ++i) {
    bool fl = pl::is_float(xs[i].dtype());
    plus_in.push_back(fl ? axpy(xs[i], h, ts[i]) : xs[i]);
    minus_in.push_back(fl ? axpy(xs[i], -h, ts[i]) : xs[i]);
  }
  std::vector<pl::Array> plus = call(plus_in), minus = call(minus_in);
  ASSERT_EQ(d.primal_outputs.size(), f.size());
  ASSERT_EQ(d.tangent_outputs.size(), f.size());
  for (size_t o = 0; o < f.size(); ++o) {
    ASSERT_EQ(d.primal_outputs[o].shape_dtype(), f[o].shape_dtype());
    for (int64_t i = 0; i < f[o].size(); ++i)
      ASSERT_EQ(d.primal_outputs[o].get_flat(i), f[o].get_flat(i))
          << "primal output " << o << " element " << i;
    if (!pl::is_float(f[o].dtype())) {
      EXPECT_EQ(d.tangent_outputs[o].size(), 0);
      continue;
    }
    ASSERT_EQ(d.tangent_outputs[o].shape_dtype(), f[o].shape_dtype());
    for (int64_t i = 0; i < f[o].size(); ++i) {
      double fd = (plus[o].get_flat(i) - minus[o].get_flat(i)) / (2 * h);
      double got = d.tangent_outputs[o].get_flat(i);
      ASSERT_LE(std::abs(got - fd), atol + rtol * std::abs(fd))
          << "output " << o << " element " << i << ": jvp " << got << ", finite difference " << fd
          << "\n" << kernel_ir(call, xs);
    }
  }
}

pl::CallOptions one_block() { return {.interpret = true}; }

// A whole-array call with f64 (8, 16) output.
pl::PallasCall call1(Kernel k, pl::Shape out = {8, 16}, pl::CallOptions o = one_block()) {
  return pl::pallas_call(std::move(k), pl::ShapeDtype(out, pl::f64), std::move(o));
}

pl::Array normal(pl::Shape s, uint64_t seed) { return pl::Array::random_normal(s, pl::f64, seed); }
pl::Array positive(pl::Shape s, uint64_t seed) {
  return pl::Array::random_uniform(s, pl::f64, seed, 0.5, 2.0);
}

// ---- the op table ------------------------------------------------------------------------------

TEST(Jvp, EveryOpHasARuleOrIsMarkedNotDifferentiable) {
  for (int c = 0; c < pl::ir::kNumOpCodes; ++c) {
    auto code = static_cast<pl::ir::OpCode>(c);
    EXPECT_NE(pallas::jvp_detail::jvp_rule(code), pallas::jvp_detail::JvpRule::kMissing)
        << "op `" << pl::ir::op_info(code).name
        << "` has no jvp entry: give it a tangent rule in src/transforms/jvp.cpp or mark it "
           "kZeroTangent / kNotDifferentiable";
  }
}

// ---- elementwise -------------------------------------------------------------------------------

struct UnaryCase {
  std::string name;
  std::function<pl::Value(pl::Value)> f;
  bool positive_only = false;
};

void PrintTo(const UnaryCase& c, std::ostream* os) { *os << c.name; }
class JvpUnary : public testing::TestWithParam<UnaryCase> {};

TEST_P(JvpUnary, MatchesFiniteDifferences) {
  const UnaryCase& c = GetParam();
  auto call = call1([f = c.f](std::vector<pl::Ref>& r) { r[1][pl::all] = f(r[0][pl::all]); });
  pl::Array x = c.positive_only ? positive({8, 16}, 1) : normal({8, 16}, 1);
  expect_jvp_matches_fd(call, {x}, {normal({8, 16}, 2)});
}

INSTANTIATE_TEST_SUITE_P(
    Ops, JvpUnary,
    testing::Values(
        UnaryCase{"neg", [](pl::Value x) { return -x; }},
        UnaryCase{"abs", [](pl::Value x) { return pl::abs(x); }},
        UnaryCase{"exp", [](pl::Value x) { return pl::exp(x); }},
        UnaryCase{"exp2", [](pl::Value x) { return pl::exp2(x); }},
        UnaryCase{"log", [](pl::Value x) { return pl::log(x); }, true},
        UnaryCase{"log1p", [](pl::Value x) { return pl::log1p(x); }, true},
        UnaryCase{"sqrt", [](pl::Value x) { return pl::sqrt(x); }, true},
        UnaryCase{"rsqrt", [](pl::Value x) { return pl::rsqrt(x); }, true},
        UnaryCase{"reciprocal", [](pl::Value x) { return pl::reciprocal(x); }, true},
        UnaryCase{"tanh", [](pl::Value x) { return pl::tanh(x); }},
        UnaryCase{"logistic", [](pl::Value x) { return pl::logistic(x); }},
        UnaryCase{"sin", [](pl::Value x) { return pl::sin(x); }},
        UnaryCase{"cos", [](pl::Value x) { return pl::cos(x); }},
        UnaryCase{"erf", [](pl::Value x) { return pl::erf(x); }},
        UnaryCase{"integer_pow_0", [](pl::Value x) { return pl::integer_pow(x, 0); }},
        UnaryCase{"integer_pow_1", [](pl::Value x) { return pl::integer_pow(x, 1); }},
        UnaryCase{"integer_pow_2", [](pl::Value x) { return pl::integer_pow(x, 2); }},
        UnaryCase{"integer_pow_5", [](pl::Value x) { return pl::integer_pow(x, 5); }},
        UnaryCase{"integer_pow_m2", [](pl::Value x) { return pl::integer_pow(x, -2); }, true},
        // Piecewise constant: zero tangent (the inputs are away from the jumps).
        UnaryCase{"sign", [](pl::Value x) { return pl::sign(x) * x; }},
        UnaryCase{"floor", [](pl::Value x) { return pl::floor(x * 4.0 + 0.5) + x; }},
        UnaryCase{"ceil", [](pl::Value x) { return pl::ceil(x * 4.0 + 0.5) * x; }},
        UnaryCase{"round", [](pl::Value x) { return pl::round(x * 4.0 + 0.5) * x; }},
        UnaryCase{"convert_f64_f64", [](pl::Value x) { return pl::convert(x, pl::f64) * 2.0; }},
        UnaryCase{"convert_through_int",
                  [](pl::Value x) { return pl::convert(pl::convert(x * 3.0 + 0.5, pl::i32), pl::f64) + x; }},
        UnaryCase{"is_finite", [](pl::Value x) { return pl::where(pl::is_finite(x), x * x, x); }}),
    [](const testing::TestParamInfo<UnaryCase>& i) { return i.param.name; });

struct BinaryCase {
  std::string name;
  std::function<pl::Value(pl::Value, pl::Value)> f;
  bool positive_only = false;
};

void PrintTo(const BinaryCase& c, std::ostream* os) { *os << c.name; }
class JvpBinary : public testing::TestWithParam<BinaryCase> {};

TEST_P(JvpBinary, MatchesFiniteDifferences) {
  const BinaryCase& c = GetParam();
  auto call = call1([f = c.f](std::vector<pl::Ref>& r) {
    r[2][pl::all] = f(r[0][pl::all], r[1][pl::all]);
  });
  pl::Array a = c.positive_only ? positive({8, 16}, 3) : normal({8, 16}, 3);
  pl::Array b = c.positive_only ? positive({8, 16}, 4) : normal({8, 16}, 4);
  expect_jvp_matches_fd(call, {a, b}, {normal({8, 16}, 5), normal({8, 16}, 6)});
  // One tangent zero (a symbolic zero for the other side).
  expect_jvp_matches_fd(call, {a, b}, {normal({8, 16}, 5), pl::Array::zeros({8, 16}, pl::f64)});
}

INSTANTIATE_TEST_SUITE_P(
    Ops, JvpBinary,
    testing::Values(
        BinaryCase{"add", [](pl::Value a, pl::Value b) { return a + b; }},
        BinaryCase{"sub", [](pl::Value a, pl::Value b) { return a - b; }},
        BinaryCase{"mul", [](pl::Value a, pl::Value b) { return a * b; }},
        BinaryCase{"div", [](pl::Value a, pl::Value b) { return a / b; }, true},
        BinaryCase{"rem", [](pl::Value a, pl::Value b) { return (a * 5.0) % b; }, true},
        BinaryCase{"pow", [](pl::Value a, pl::Value b) { return pl::pow(a, b); }, true},
        BinaryCase{"max", [](pl::Value a, pl::Value b) { return pl::maximum(a, b); }},
        BinaryCase{"min", [](pl::Value a, pl::Value b) { return pl::minimum(a, b); }},
        BinaryCase{"select", [](pl::Value a, pl::Value b) { return pl::where(a > b, a * b, b); }},
        BinaryCase{"scalar_literal", [](pl::Value a, pl::Value b) { return a * 3.0 + 1.0 - b / 2.0; }},
        BinaryCase{"dot", [](pl::Value a, pl::Value b) {
                     pl::Value d = pl::dot(a, b, {.trans_b = true});  // (8, 16) x (8, 16)^T
                     return pl::concatenate({d, d * pl::exp(d)}, 1);    // (8, 16)
                   }}),
    [](const testing::TestParamInfo<BinaryCase>& i) { return i.param.name; });

TEST(Jvp, DotGeneralBatched) {
  auto call = pl::pallas_call(
      [](pl::Ref a, pl::Ref b, pl::Ref o) {
        o[pl::all] = pl::dot_general(a[pl::all], b[pl::all], {{2}, {1}, {0}, {0}});
      },
      pl::ShapeDtype({2, 3, 5}, pl::f64), one_block());
  expect_jvp_matches_fd(call, {normal({2, 3, 4}, 1), normal({2, 4, 5}, 2)},
                        {normal({2, 3, 4}, 3), normal({2, 4, 5}, 4)});
}

TEST(Jvp, MaxTiesShareTheTangentEvenly) {
  // max(a, a) and reduce_max over equal elements: the tangents are averaged (jax's rule).
  auto call = pl::pallas_call(
      [](pl::Ref a, pl::Ref o, pl::Ref m) {
        pl::Value x = a[pl::all];
        o[pl::all] = pl::maximum(x, pl::full({4}, pl::f64, 1.0));
        m[pl::all] = pl::max(x, {0}, true);
      },
      std::vector<pl::ShapeDtype>{{{4}, pl::f64}, {{1}, pl::f64}}, one_block());
  pl::Array x = pl::Array::from_values({4}, pl::f64, {1.0, 1.0, 0.0, -1.0});
  pl::Array t = pl::Array::from_values({4}, pl::f64, {2.0, 6.0, 1.0, 1.0});
  pl::JvpOutputs d = pl::jvp(call, {x}, {t});
  EXPECT_EQ(d.tangent_outputs[0].get_flat(0), 1.0);  // tie with the constant 1: half of 2
  EXPECT_EQ(d.tangent_outputs[0].get_flat(2), 0.0);  // the constant wins
  EXPECT_EQ(d.tangent_outputs[1].get_flat(0), 4.0);  // two maxima: (2 + 6) / 2
}

// ---- shapes, reductions, scans -----------------------------------------------------------------

TEST(Jvp, ShapeOps) {
  auto call = pl::pallas_call(
      [](pl::Ref a, pl::Ref o1, pl::Ref o2, pl::Ref o3) {
        pl::Value x = a[pl::all];                                          // (4, 6)
        pl::Value t = pl::transpose(x, {1, 0});                            // (6, 4)
        pl::Value r = pl::reshape(t, {3, 8});
        pl::Value e = pl::expand_dims(pl::slice(r, {0, 1}, {3, 7}, {1, 2}), {0});  // (1, 3, 3)
        pl::Value s = pl::squeeze(e, {0});
        pl::Value b = pl::broadcast_in_dim(pl::rev(s, {1}), {2, 3, 3}, {1, 2});
        o1[pl::all] = b * b;
        o2[pl::all] = pl::concatenate({x, pl::sin(x)}, 0);                   // (8, 6)
        o3[pl::all] = pl::dynamic_slice(x, {pl::program_id(0) + 1, 2}, {2, 3});
      },
      std::vector<pl::ShapeDtype>{{{2, 3, 3}, pl::f64}, {{8, 6}, pl::f64}, {{2, 3}, pl::f64}},
      {.grid = {1}, .interpret = true});
  expect_jvp_matches_fd(call, {normal({4, 6}, 1)}, {normal({4, 6}, 2)});
}

// Loads and stores through Ref transforms carry tangents through the same views of the tangent
// Refs.
TEST(Jvp, ThroughTransposedAndReshapedRefs) {
  auto call = pl::pallas_call(
      [](pl::Ref x, pl::Ref o1, pl::Ref o2) {
        o1.T()[pl::all] = pl::sin(x[pl::all]);                          // (6, 4) written as (4, 6)
        o2[pl::all] = x.reshape({2, 12}).at(pl::all, pl::ds(1, 8))[pl::all] * x.reshape({3, 8}).at(pl::ds(1, 2))[pl::all];
      },
      std::vector<pl::ShapeDtype>{{{6, 4}, pl::f64}, {{2, 8}, pl::f64}}, {.interpret = true});
  expect_jvp_matches_fd(call, {normal({4, 6}, 1)}, {normal({4, 6}, 2)});
}

TEST(Jvp, ConcatenateWithAConstant) {
  auto call = call1([](std::vector<pl::Ref>& r) {
    r[1][pl::all] = pl::concatenate({r[0][pl::all], pl::full({4, 16}, pl::f64, 2.0)}, 0);
  });
  expect_jvp_matches_fd(call, {normal({4, 16}, 1)}, {normal({4, 16}, 2)});
}

TEST(Jvp, Reductions) {
  auto call = pl::pallas_call(
      [](pl::Ref a, pl::Ref s, pl::Ref mx, pl::Ref mn, pl::Ref cs) {
        pl::Value x = a[pl::all];
        s[pl::all] = pl::sum(x * x, {1});
        mx[pl::all] = pl::max(x, {0});
        mn[pl::all] = pl::min(pl::exp(x), {0, 1}, true);
        cs[pl::all] = pl::cumsum(x, 1) + pl::cumsum(x * x, 0, true);
      },
      std::vector<pl::ShapeDtype>{
          {{8}, pl::f64}, {{16}, pl::f64}, {{1, 1}, pl::f64}, {{8, 16}, pl::f64}},
      one_block());
  expect_jvp_matches_fd(call, {normal({8, 16}, 1)}, {normal({8, 16}, 2)});
}

// reduce_prod over one, several (unsorted) and all axes of odd and even lengths, cumprod /
// cummax / cummin both ways along both axes of a (6, 7) input.
void products_and_scans_kernel(pl::Ref a, pl::Ref p1, pl::Ref p2, pl::Ref p3, pl::Ref cp, pl::Ref cm) {
  pl::Value x = a[pl::all];                                                       // (6, 7)
  p1[pl::all] = pl::prod(x, {1}) + pl::prod(pl::reshape(x, {6, 1, 7}), {1, 2});   // (6,)
  p2[pl::all] = pl::prod(x, {}, true) + pl::prod(a(2, 3)) + pl::prod(x, {0, 1}, true);  // (1, 1)
  p3[pl::all] = pl::prod(pl::reshape(x, {2, 3, 7}), {2, 0});                      // (3,)
  cp[pl::all] = pl::cumprod(x, 1) + pl::cumprod(x, 0, true) * pl::cumprod(x, 1, true);
  cm[pl::all] = pl::cummax(x, 1) + pl::cummin(x, 0, true) + pl::cummax(x, 0, true) * pl::cummin(x, 1);
}

// On `backend`: "reference", "tpu_interpret" or "gpu_emulate" (the generated CUDA, run on the host).
pl::PallasCall products_and_scans_call(const std::string& backend) {
  pl::ShapeDtype t({6, 7}, pl::f64);
  pl::CallOptions o{.grid = {1}};
  if (backend == "tpu_interpret")
    o.interpret = pltpu::InterpretParams{};
  else
    o.backend = backend;
  return pl::pallas_call(products_and_scans_kernel,
                         std::vector<pl::ShapeDtype>{{{6}, pl::f64}, {{1, 1}, pl::f64}, {{3}, pl::f64}, t, t},
                         std::move(o));
}

// A (6, 7) input with exact zeros: rows with none, one (row 1) and two (rows 2 and 4), no two in
// one column; the entries between two zeros of a row have both signs, so that no running
// extremum ties at 0.
pl::Array with_zeros(uint64_t seed) {
  pl::Array x = normal({6, 7}, seed);
  for (auto [r, c] : std::vector<std::pair<int, int>>{{1, 4}, {2, 0}, {2, 5}, {4, 1}, {4, 6}})
    x.set_flat(r * 7 + c, 0.0);
  for (auto [r, c, v] : std::vector<std::tuple<int, int, double>>{{2, 1, 1.5}, {2, 2, -1.5}, {4, 2, 1.25}, {4, 3, -1.25}})
    x.set_flat(r * 7 + c, v);
  return x;
}

class JvpProductsAndScans : public testing::TestWithParam<std::string> {};

TEST_P(JvpProductsAndScans, MatchFiniteDifferences) {
  pl::PallasCall call = products_and_scans_call(GetParam());
  expect_jvp_matches_fd(call, {normal({6, 7}, 1)}, {normal({6, 7}, 2)});
  // Products through zeros are exact (no division by x); the extrema are away from ties.
  expect_jvp_matches_fd(call, {with_zeros(3)}, {normal({6, 7}, 4)});
}

INSTANTIATE_TEST_SUITE_P(Backends, JvpProductsAndScans,
                         testing::Values("reference", "tpu_interpret", "gpu_emulate"),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

// Exact values from jax.jvp (float64) of lax.cumprod / cummax / cummin and jnp.prod.
struct ScanCase {
  std::string name;
  std::function<pl::Value(pl::Value)> f;
  std::vector<double> x, want;
};

void PrintTo(const ScanCase& c, std::ostream* os) { *os << c.name; }
class JvpScanAgainstJax : public testing::TestWithParam<ScanCase> {};

TEST_P(JvpScanAgainstJax, SameTangents) {
  const ScanCase& c = GetParam();
  const int64_t n = static_cast<int64_t>(c.x.size()), m = static_cast<int64_t>(c.want.size());
  for (bool tpu : {false, true}) {
    SCOPED_TRACE(tpu ? "tpu interpret" : "reference");
    auto call = pl::pallas_call([f = c.f](pl::Ref a, pl::Ref o) { o[pl::all] = f(a[pl::all]); },
                                pl::ShapeDtype({m}, pl::f64),
                                {.interpret = tpu ? pl::InterpretMode(pltpu::InterpretParams{})
                                                  : pl::InterpretMode(true)});
    pl::Array t = pl::Array::zeros({n}, pl::f64);
    for (int64_t i = 0; i < n; ++i) t.set_flat(i, std::ldexp(1.0, static_cast<int>(i)));  // 1, 2, 4, ...
    pl::JvpOutputs d = pl::jvp(call, {pl::Array::from_values({n}, pl::f64, c.x)}, {t});
    for (int64_t i = 0; i < m; ++i)
      EXPECT_EQ(d.tangent_outputs[0].get_flat(i), c.want[static_cast<size_t>(i)]) << "element " << i;
  }
}

// Ties of cummax / cummin are shared with the weights of jax's associative scan (not evenly).
INSTANTIATE_TEST_SUITE_P(
    Ops, JvpScanAgainstJax,
    testing::Values(
        ScanCase{"cummax_ties", [](pl::Value x) { return pl::cummax(x, 0); },
                 {1, 3, 3, 2, 3, 5, 5, 0}, {1, 2, 3, 3, 9.5, 32, 48, 48}},
        ScanCase{"cummax_ties_reverse", [](pl::Value x) { return pl::cummax(x, 0, true); },
                 {1, 3, 3, 2, 3, 5, 5, 0}, {48, 48, 48, 48, 48, 48, 64, 128}},
        ScanCase{"cummin_ties", [](pl::Value x) { return pl::cummin(x, 0); },
                 {-1, -3, -3, -2, -3, -5, -5, 0}, {1, 2, 3, 3, 9.5, 32, 48, 48}},
        ScanCase{"cummin_ties_reverse", [](pl::Value x) { return pl::cummin(x, 0, true); },
                 {-1, -3, -3, -2, -3, -5, -5, 0}, {48, 48, 48, 48, 48, 48, 64, 128}},
        ScanCase{"cummax_all_equal", [](pl::Value x) { return pl::cummax(x, 0); },
                 {1, 1, 1, 1, 1, 1, 1}, {1, 1.5, 2.75, 3.75, 9.875, 13.875, 38.9375}},
        ScanCase{"cummax_all_equal_reverse", [](pl::Value x) { return pl::cummax(x, 0, true); },
                 {1, 1, 1, 1, 1, 1, 1}, {8.75, 16.5, 17, 30, 32, 48, 64}},
        ScanCase{"cumprod_zeros", [](pl::Value x) { return pl::cumprod(x, 0); },
                 {2, 0, 3, 0, 5}, {1, 4, 12, 0, 0}},
        ScanCase{"cumprod_zeros_reverse", [](pl::Value x) { return pl::cumprod(x, 0, true); },
                 {2, 0, 3, 0, 5}, {0, 0, 120, 40, 16}},
        ScanCase{"prod_one_zero", [](pl::Value x) { return pl::prod(x, {0}, true); },
                 {2, 0, 3, 4, 5}, {240}},
        ScanCase{"prod_two_zeros", [](pl::Value x) { return pl::prod(x, {0}, true); },
                 {2, 0, 3, 0, 5}, {0}}),
    [](const testing::TestParamInfo<ScanCase>& i) { return i.param.name; });

// ---- Refs ----------------------------------------------------------------------------------------

TEST(Jvp, LoadsStoresSwapsAndViewsAtIndices) {
  auto call = pl::pallas_call(
      [](pl::Ref a, pl::Ref o) {
        o[pl::all] = pl::zeros({8, 16}, pl::f64);
        pl::Ref row = a.at(pl::ds(2, 4));                     // a view: rows 2..5
        o(pl::ds(0, 4), pl::ds(0, 16)) = row[pl::all] * a(pl::ds(4, 4), pl::all);
        pl::Value old = o.swap(pl::Indices{pl::ds(4, 4), pl::all}, pl::exp(a(pl::ds(0, 4), pl::all)));
        o(pl::ds(0, 4), pl::all) = o(pl::ds(0, 4), pl::all) + old;
        pl::Value i = pl::program_id(0);
        o(i + 7, 3) = a(i, 3) * a(i + 1, 4);                  // scalar accesses, dynamic index
      },
      pl::ShapeDtype({8, 16}, pl::f64), {.grid = {1}, .interpret = true});
  expect_jvp_matches_fd(call, {normal({8, 16}, 1)}, {normal({8, 16}, 2)});
}

TEST(Jvp, MaskedLoadAndStore) {
  auto call = pl::pallas_call(
      [](pl::Ref a, pl::Ref o) {
        pl::Value m = pl::iota(pl::i32, {8, 16}, 1) < 10;
        o[pl::all] = pl::zeros({8, 16}, pl::f64);
        pl::Value x = a.load_masked(pl::Indices{pl::all}, m, 3.0);
        o.store_masked(pl::Indices{pl::all}, x * x, pl::iota(pl::i32, {8, 16}, 0) > 2);
      },
      pl::ShapeDtype({8, 16}, pl::f64), one_block());
  expect_jvp_matches_fd(call, {normal({8, 16}, 1)}, {normal({8, 16}, 2)});
}

// ---- grids, scratch, control flow --------------------------------------------------------------

pl::CallOptions row_blocks(pl::InterpretMode mode, int n_in = 1) {
  pl::BlockSpec spec({2, 16}, [](pl::Value i) { return pl::Indices{i, 0}; });
  std::vector<pl::BlockSpec> ins(static_cast<size_t>(n_in), spec);
  return {.grid = {4}, .in_specs = ins, .out_specs = {spec}, .interpret = std::move(mode)};
}

void control_flow_kernel(pl::Ref a, pl::Ref o) {
  pl::Value x = a[pl::all];
  // for: x <- sin(x) * 1.1, three times
  pl::Value f = pl::fori_loop(0, 3, x, [](pl::Value, pl::Value c) { return pl::sin(c) * 1.1; });
  // while with two carries (an integer counter and a float)
  std::vector<pl::Value> w = pl::while_loop(
      {pl::scalar(0, pl::i32), f},
      [](const std::vector<pl::Value>& c) { return c[0] < 2; },
      [](const std::vector<pl::Value>& c) {
        return std::vector<pl::Value>{c[0] + 1, c[1] * c[1] + 0.5};
      });
  pl::Value i = pl::program_id(0);
  pl::Value c = pl::cond(i % 2 == 0, [&] { return pl::exp(w[1]); }, [&] { return w[1] * x; });
  std::vector<pl::Value> s = pl::switch_case(
      i, {[&] { return std::vector<pl::Value>{c}; },
          [&] { return std::vector<pl::Value>{c + pl::tanh(x)}; },
          [&] { return std::vector<pl::Value>{pl::full({2, 16}, pl::f64, 1.0)}; }});
  std::vector<pl::Value> scoped = pl::run_scoped(
      {{{2, 16}, pl::f64}}, [&](std::vector<pl::Ref> buf) {
        buf[0][pl::all] = s[0] * 2.0;
        buf[0][pl::all] += x;
        return std::vector<pl::Value>{buf[0][pl::all]};
      });
  o[pl::all] = scoped[0];
  pl::when(i == 3, [&] { o[pl::all] = o[pl::all] * x; });
}

TEST(Jvp, ControlFlowOnTheReferenceInterpreter) {
  auto call = pl::pallas_call(control_flow_kernel, pl::ShapeDtype({8, 16}, pl::f64),
                              row_blocks(true));
  expect_jvp_matches_fd(call, {normal({8, 16}, 1)}, {normal({8, 16}, 2)});
}

TEST(Jvp, ControlFlowOnTheTpuInterpretMode) {
  auto call = pl::pallas_call(control_flow_kernel, pl::ShapeDtype({8, 16}, pl::f64),
                              row_blocks(pltpu::InterpretParams{}));
  expect_jvp_matches_fd(call, {normal({8, 16}, 1)}, {normal({8, 16}, 2)});
}

TEST(Jvp, IntegerInputsAndOutputsHaveNoTangent) {
  auto call2 = pl::pallas_call(
      [](pl::Ref a, pl::Ref k, pl::Ref o, pl::Ref idx) {
        pl::Value x = a[pl::all];
        o[pl::all] = x * pl::convert(k[pl::all], pl::f64);
        idx[pl::all] = pl::argmax(x * pl::convert(k[pl::all], pl::f64), 1);
      },
      std::vector<pl::ShapeDtype>{{{8, 16}, pl::f64}, {{8}, pl::i32}}, one_block());
  pl::Array k = pl::Array::iota({8, 16}, pl::i32);
  expect_jvp_matches_fd(call2, {normal({8, 16}, 1), k}, {normal({8, 16}, 2), pl::Array()});
}

TEST(Jvp, FloatScratchGetsATangentScratch) {
  // Accumulate over the grid in a scratch buffer (the matmul pattern, elementwise).
  auto call = pl::pallas_call(
      [](pl::Ref a, pl::Ref o, pl::Ref acc) {
        pl::when(pl::program_id(0) == 0, [&] { acc[pl::all] = pl::zeros({2, 16}, pl::f64); });
        acc[pl::all] += pl::sin(a[pl::all]);
        pl::when(pl::program_id(0) == pl::num_programs(0) - 1,
                 [&] { o[pl::all] = acc[pl::all] * acc[pl::all]; });
      },
      pl::ShapeDtype({2, 16}, pl::f64),
      {.grid = {4},
       .in_specs = {pl::BlockSpec({2, 16}, [](pl::Value i) { return pl::Indices{i, 0}; })},
       .out_specs = {pl::BlockSpec({2, 16}, [](pl::Value) { return pl::Indices{0, 0}; })},
       .scratch_shapes = {{{2, 16}, pl::f64, pl::MemorySpace::Vmem}},
       .interpret = true});
  expect_jvp_matches_fd(call, {normal({8, 16}, 1)}, {normal({8, 16}, 2)});
}

TEST(Jvp, DerivativeCallHasDoubledOperandsInTheSeedsOrder) {
  auto call = pl::pallas_call(
      [](pl::Ref a, pl::Ref b, pl::Ref o) { o[pl::all] = a[pl::all] * b[pl::all]; },
      pl::ShapeDtype({8, 16}, pl::f64),
      {.grid = {4},
       .in_specs = {pl::BlockSpec({2, 16}, [](pl::Value i) { return pl::Indices{i, 0}; }),
                    pl::BlockSpec({2, 16}, [](pl::Value i) { return pl::Indices{i, 0}; })},
       .out_specs = {pl::BlockSpec({2, 16}, [](pl::Value i) { return pl::Indices{i, 0}; })},
       .interpret = true,
       .cost_estimate = pl::CostEstimate{10, 2, 100, 0}});
  pl::ShapeDtype s({8, 16}, pl::f64);
  pl::PallasCall d = pl::jvp_call(call, {s, s});
  auto tc = d.trace({s, s, s, s});
  EXPECT_EQ(tc->grid_mapping.num_inputs, 4);
  EXPECT_EQ(tc->grid_mapping.num_outputs, 2);
  EXPECT_EQ(tc->cost_estimate->flops, 20);
  // Operand order: a, b, ta, tb -> o, to. Tangent inputs of 0 give a zero output tangent.
  pl::Array a = normal({8, 16}, 1), b = normal({8, 16}, 2), z = pl::Array::zeros({8, 16}, pl::f64);
  pl::Array one = pl::Array::full({8, 16}, pl::f64, 1.0);
  std::vector<pl::Array> r = d({a, b, one, z});  // d/da (a * b) . 1 = b
  ASSERT_EQ(r.size(), 2u);
  for (int64_t i = 0; i < b.size(); ++i) EXPECT_EQ(r[1].get_flat(i), b.get_flat(i));
}

// ---- the bundled examples ------------------------------------------------------------------------

// f64 twins of the examples' kernels (they accept f32/bf16 only, and compute in f32).
void softmax64(const pl::Ref& x, const pl::Ref& o) {
  pl::Value v = x[pl::all];
  pl::Value m = pl::expand_dims(pl::max(v, {1}), {1});
  pl::Value e = pl::exp(v - m);
  pl::Value s = pl::expand_dims(pl::sum(e, {1}), {1});
  o[pl::all] = e / s;
}
void layer_norm64(const pl::Ref& x, const pl::Ref& gamma, const pl::Ref& beta, const pl::Ref& o) {
  const double inv_n = 1.0 / static_cast<double>(x.dim(1));
  pl::Value v = x[pl::all];
  pl::Value mean = pl::expand_dims(pl::sum(v, {1}), {1}) * inv_n;
  pl::Value c = v - mean;
  pl::Value var = pl::expand_dims(pl::sum(c * c, {1}), {1}) * inv_n;
  pl::Value y = c * pl::rsqrt(var + 1e-5);
  o[pl::all] = y * gamma[pl::all] + beta[pl::all];
}
void matmul64(const pl::Ref& x, const pl::Ref& y, const pl::Ref& z, const pl::Ref& acc) {
  pl::when(pl::program_id(2) == 0, [&] { acc[pl::all] = 0.0; });
  acc[pl::all] += pl::dot(x[pl::all], y[pl::all]);
  pl::when(pl::program_id(2) == pl::num_programs(2) - 1, [&] { z[pl::all] = acc[pl::all]; });
}

pl::BlockSpec rows8() { return pl::BlockSpec({8, 256}, [](pl::Value i) { return pl::Indices{i, 0}; }); }

pl::PallasCall softmax_call(pl::InterpretMode m) {
  return pl::pallas_call(softmax64, pl::ShapeDtype({32, 256}, pl::f64),
                         {.grid = {4}, .in_specs = {rows8()}, .out_specs = {rows8()},
                          .interpret = std::move(m)});
}
pl::PallasCall layer_norm_call(pl::InterpretMode m) {
  return pl::pallas_call(layer_norm64, pl::ShapeDtype({32, 256}, pl::f64),
                         {.grid = {4}, .in_specs = {rows8(), pl::BlockSpec(), pl::BlockSpec()},
                          .out_specs = {rows8()}, .interpret = std::move(m)});
}
pl::PallasCall matmul_call(pl::InterpretMode m) {
  const int64_t b = 16;
  return pl::pallas_call(
      matmul64, pl::ShapeDtype({32, 32}, pl::f64),
      {.grid = {2, 2, 2},
       .in_specs = {pl::BlockSpec({b, b}, [](pl::Value i, pl::Value, pl::Value k) { return pl::Indices{i, k}; }),
                    pl::BlockSpec({b, b}, [](pl::Value, pl::Value j, pl::Value k) { return pl::Indices{k, j}; })},
       .out_specs = {pl::BlockSpec({b, b}, [](pl::Value i, pl::Value j, pl::Value) { return pl::Indices{i, j}; })},
       .scratch_shapes = {{{b, b}, pl::f64, pl::MemorySpace::Vmem}},
       .interpret = std::move(m)});
}

TEST(Jvp, SoftmaxMatchesFiniteDifferences) {
  expect_jvp_matches_fd(softmax_call(true), {normal({32, 256}, 1)}, {normal({32, 256}, 2)});
}
TEST(Jvp, LayerNormMatchesFiniteDifferences) {
  expect_jvp_matches_fd(layer_norm_call(true),
                        {normal({32, 256}, 1), positive({256}, 2), normal({256}, 3)},
                        {normal({32, 256}, 4), normal({256}, 5), normal({256}, 6)});
}
TEST(Jvp, MatmulMatchesFiniteDifferences) {
  expect_jvp_matches_fd(matmul_call(true), {normal({32, 32}, 1), normal({32, 32}, 2)},
                        {normal({32, 32}, 3), normal({32, 32}, 4)});
}
TEST(Jvp, ExamplesOnTheTpuInterpretMode) {
  expect_jvp_matches_fd(softmax_call(pltpu::InterpretParams{}), {normal({32, 256}, 1)},
                        {normal({32, 256}, 2)});
  expect_jvp_matches_fd(matmul_call(pltpu::InterpretParams{.detect_races = true}),
                        {normal({32, 32}, 1), normal({32, 32}, 2)},
                        {normal({32, 32}, 3), normal({32, 32}, 4)});
}

// The bundled f32 examples themselves: their jvp agrees with the f64 twins' (to f32 accuracy).
TEST(Jvp, BundledExamplesAgreeWithTheirF64Twins) {
  struct Case {
    std::string name;
    pl::PallasCall twin;
  };
  for (const Case& c : {Case{"softmax", softmax_call(true)}, Case{"layer_norm", layer_norm_call(true)},
                        Case{"matmul", matmul_call(true)}}) {
    SCOPED_TRACE(c.name);
    ex::Problem p = ex::find(c.name).build({.seed = 3, .size = 32, .dtype = pl::f32});
    std::vector<pl::Array> xs64, ts64, xs32, ts32;
    for (size_t i = 0; i < p.inputs.size(); ++i) {
      pl::Array x = p.inputs[i].astype(pl::f64);
      pl::Array t = pl::Array::random_normal(x.shape(), pl::f32, 10 + i).astype(pl::f64);
      xs64.push_back(x);
      ts64.push_back(t);
      xs32.push_back(p.inputs[i]);
      ts32.push_back(t.astype(pl::f32));
    }
    pl::JvpOutputs d32 = pl::jvp(p.call, xs32, ts32);
    pl::JvpOutputs d64 = pl::jvp(c.twin, xs64, ts64);
    std::vector<pl::Array> f32 = p.call(xs32);
    for (int64_t i = 0; i < f32[0].size(); ++i)
      ASSERT_EQ(d32.primal_outputs[0].get_flat(i), f32[0].get_flat(i));
    double scale = 0;
    for (int64_t i = 0; i < d64.tangent_outputs[0].size(); ++i)
      scale = std::max(scale, std::abs(d64.tangent_outputs[0].get_flat(i)));
    for (int64_t i = 0; i < d64.tangent_outputs[0].size(); ++i)
      ASSERT_NEAR(d32.tangent_outputs[0].get_flat(i), d64.tangent_outputs[0].get_flat(i),
                  2e-4 * scale)
          << "element " << i;
  }
}

// ---- errors --------------------------------------------------------------------------------------

using test_util::error_of;

pl::PallasCall square_call(pl::CallOptions o = one_block()) {
  return pl::pallas_call([](pl::Ref a, pl::Ref b) { b[pl::all] = a[pl::all] * a[pl::all]; },
                         pl::ShapeDtype({8, 16}, pl::f64), std::move(o));
}

TEST(JvpErrors, TangentsThatDoNotMatchThePrimals) {
  pl::PallasCall call = square_call();
  pl::Array x = normal({8, 16}, 1);
  EXPECT_NE(error_of([&] { pl::jvp(call, {x}, {normal({8, 8}, 2)}); })
                .find("a tangent must have its primal's shape and dtype"),
            std::string::npos);
  EXPECT_NE(error_of([&] { pl::jvp(call, {x}, {x.astype(pl::f32)}); })
                .find("a tangent must have its primal's shape and dtype"),
            std::string::npos);
  EXPECT_NE(error_of([&] { pl::jvp(call, {x}, {x.astype(pl::i32)}); })
                .find("integer and bool tangents are not allowed"),
            std::string::npos);
  EXPECT_NE(error_of([&] { pl::jvp(call, {x}, {}); }).find("one tangent per primal input"),
            std::string::npos);
  auto int_call = pl::pallas_call(
      [](pl::Ref a, pl::Ref k, pl::Ref b) { b[pl::all] = a[pl::all] * k[pl::all].astype(pl::f64); },
      pl::ShapeDtype({8, 16}, pl::f64), one_block());
  pl::Array k = pl::Array::zeros({8, 16}, pl::i32);
  EXPECT_NE(error_of([&] { pl::jvp(int_call, {x, k}, {x, k}); })
                .find("has no tangent; pass an empty pl::Array() in its place"),
            std::string::npos);
}

TEST(JvpErrors, UnsupportedCallFeatures) {
  pl::Array x = normal({8, 16}, 1);
  pl::CallOptions aliased = one_block();
  aliased.input_output_aliases = {{0, 0}};
  EXPECT_NE(error_of<pl::NotSupportedError>([&] { pl::jvp(square_call(aliased), {x}, {x}); })
                .find("JVP with aliasing"),
            std::string::npos);

  auto dyn = pl::pallas_call([](pl::Ref a, pl::Ref b) { b[pl::all] = a[pl::all]; },
                             pl::ShapeDtype({8, 16}, pl::f64),
                             {.grid = {pl::dynamic}, .interpret = true});
  EXPECT_NE(error_of<pl::NotSupportedError>([&] { pl::jvp(dyn, {x}, {x}); })
                .find("dynamic grid bounds"),
            std::string::npos);

  auto prefetch = pl::pallas_call(
      [](pl::Ref, pl::Ref a, pl::Ref b) { b[pl::all] = a[pl::all]; },
      pl::ShapeDtype({8, 16}, pl::f64),
      {.grid_spec = pl::PrefetchScalarGridSpec(1, {1}), .interpret = true});
  EXPECT_NE(error_of<pl::NotSupportedError>([&] {
              pl::jvp(prefetch, {pl::Array::zeros({1}, pl::i32), x}, {pl::Array(), x});
            }).find("scalar-prefetch"),
            std::string::npos);

  pl::CallOptions mesh = {.grid = {2}, .interpret = true, .mesh_shape = std::vector<int64_t>{2}};
  EXPECT_NE(error_of<pl::NotSupportedError>([&] { pl::jvp(square_call(mesh), {x}, {x}); })
                .find("does not support JVP"),
            std::string::npos);
}

TEST(JvpErrors, AnOpWithoutARuleNamesTheOpAndTheLine) {
  const int line = __LINE__ + 2;
  auto call = call1([](std::vector<pl::Ref>& r) {
    r[1][pl::all] = pl::convert(pl::bitcast(r[0][pl::all], pl::i64), pl::f64);
  });
  pl::Array x = normal({8, 16}, 1);
  std::string e = error_of<pl::NotSupportedError>([&] { pl::jvp(call, {x}, {x}); });
  EXPECT_NE(e.find("`bitcast`"), std::string::npos) << e;
  EXPECT_NE(e.find("jvp_test.cpp:" + std::to_string(line)), std::string::npos) << e;
  // On integer data it is fine: no tangent reaches it.
  auto int_bits = call1([](std::vector<pl::Ref>& r) {
    pl::Value bits = pl::bitcast(pl::iota(pl::i64, {8, 16}, 1) + 0x3ff0000000000000LL, pl::f64);  // 1 + 2^-52 k
    r[1][pl::all] = bits * r[0][pl::all];
  });
  expect_jvp_matches_fd(int_bits, {x}, {normal({8, 16}, 2)});
}

// sort permutes the tangents with their primals: keys with a tangent, and a float payload.
TEST(Jvp, SortPermutesTangentsWithThePrimals) {
  auto call = call1([](std::vector<pl::Ref>& r) {
    std::vector<pl::Value> s = pl::sort({r[0][pl::all], pl::sin(r[0][pl::all])}, 1);
    r[1][pl::all] = s[0] * 2.0 + s[1];
  });
  expect_jvp_matches_fd(call, {normal({8, 16}, 3)}, {normal({8, 16}, 4)});
}

}  // namespace
