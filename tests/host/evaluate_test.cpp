// Evaluating traced kernels on host Arrays: refs, views, control flow, atomics, grid queries.
// Expected values are computed by hand or with plain C++ loops in the test.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "pallas/pallas.h"

namespace pl = pallas;
using pl::ir::Type;

namespace {
Type ref(pl::Shape s, pl::DType t) { return Type::ref(std::move(s), t, pl::MemorySpace::Vmem); }
}  // namespace

TEST(Evaluate, ElementwiseKernelMatchesPlainLoop) {
  auto k = pl::trace_kernel(
      [](pl::Ref x, pl::Ref y, pl::Ref o) {
        o[pl::all] = pl::exp(x[pl::all]) * 2.0f + y[pl::all];
      },
      {ref({8, 128}, pl::f32), ref({8, 128}, pl::f32), ref({8, 128}, pl::f32)});
  std::vector<pl::Array> bufs = {pl::Array::random_normal({8, 128}, pl::f32, 1),
                                 pl::Array::random_normal({8, 128}, pl::f32, 2),
                                 pl::Array::zeros({8, 128}, pl::f32)};
  pl::evaluate(k, bufs);
  pl::Array expected({8, 128}, pl::f32);
  const float* x = bufs[0].data<float>();
  const float* y = bufs[1].data<float>();
  for (int64_t i = 0; i < 8 * 128; ++i) expected.data<float>()[i] = std::exp(x[i]) * 2.0f + y[i];
  auto r = pl::allclose(bufs[2], expected, 1e-6, 1e-6);
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(Evaluate, ForLoopWithCarrySumsIndices) {
  auto k = pl::trace_kernel(
      [](pl::Ref o) {
        o[pl::all] = pl::fori_loop(0, 10, 0, [](pl::Value i, pl::Value acc) { return acc + i * i; });
      },
      {ref({}, pl::i32)});
  std::vector<pl::Array> bufs = {pl::Array::zeros({}, pl::i32)};
  pl::evaluate(k, bufs);
  EXPECT_EQ(bufs[0].get_flat(0), 285);  // sum of squares 0..9
}

TEST(Evaluate, ForLoopWithSeveralCarriesAndDynamicStores) {
  // Fibonacci numbers written one per iteration into o[i].
  auto k = pl::trace_kernel(
      [](pl::Ref o) {
        std::vector<pl::Value> init = {pl::scalar(0, pl::i32), pl::scalar(1, pl::i32)};
        pl::fori_loop(0, 10, init, [&](pl::Value i, std::vector<pl::Value> c) {
          o[i] = c[0];
          return std::vector<pl::Value>{c[1], c[0] + c[1]};
        });
      },
      {ref({10}, pl::i32)});
  std::vector<pl::Array> bufs = {pl::Array::zeros({10}, pl::i32)};
  pl::evaluate(k, bufs);
  std::vector<int32_t> fib = {0, 1, 1, 2, 3, 5, 8, 13, 21, 34};
  EXPECT_EQ(bufs[0].to_vector<int32_t>(), fib);
}

TEST(Evaluate, WhileLoopCollatz) {
  auto k = pl::trace_kernel(
      [](pl::Ref n, pl::Ref steps) {
        auto r = pl::while_loop(
            std::vector<pl::Value>{n[pl::all], pl::scalar(0, pl::i32)},
            [](const std::vector<pl::Value>& c) { return c[0] != 1; },
            [](const std::vector<pl::Value>& c) {
              pl::Value x = c[0];
              pl::Value next = pl::where(x % 2 == 0, x / 2, x * 3 + 1);
              return std::vector<pl::Value>{next, c[1] + 1};
            });
        steps[pl::all] = r[1];
      },
      {ref({}, pl::i32), ref({}, pl::i32)});
  std::vector<pl::Array> bufs = {pl::Array::full({}, pl::i32, 27), pl::Array::zeros({}, pl::i32)};
  pl::evaluate(k, bufs);
  EXPECT_EQ(bufs[1].get_flat(0), 111);  // 27 takes 111 steps to reach 1
}

TEST(Evaluate, CondSwitchAndWhen) {
  auto k = pl::trace_kernel(
      [](pl::Ref sel, pl::Ref o) {
        pl::Value s = sel[pl::all];
        pl::Value a = pl::cond(s > 0, [] { return pl::scalar(10, pl::i32); },
                               [] { return pl::scalar(20, pl::i32); });
        auto b = pl::switch_case(s, {[] { return std::vector<pl::Value>{pl::scalar(100, pl::i32)}; },
                                     [] { return std::vector<pl::Value>{pl::scalar(200, pl::i32)}; },
                                     [] { return std::vector<pl::Value>{pl::scalar(300, pl::i32)}; }});
        o[0] = a;
        o[1] = b[0];
        o[2] = 0;
        pl::when(s == 1, [&] { o[2] = 7; });
      },
      {ref({}, pl::i32), ref({3}, pl::i32)});
  struct Case { int sel, a, b, c; };
  // switch clamps its index: -5 -> branch 0, 9 -> branch 2.
  for (Case c : {Case{0, 20, 100, 0}, Case{1, 10, 200, 7}, Case{2, 10, 300, 0}, Case{-5, 20, 100, 0},
                 Case{9, 10, 300, 0}}) {
    std::vector<pl::Array> bufs = {pl::Array::full({}, pl::i32, c.sel), pl::Array::zeros({3}, pl::i32)};
    pl::evaluate(k, bufs);
    EXPECT_EQ(bufs[1].to_vector<int32_t>(), (std::vector<int32_t>{c.a, c.b, c.c})) << "sel " << c.sel;
  }
}

TEST(Evaluate, ComposedViewsAndStridedSlicesWriteTheRightElements) {
  auto k = pl::trace_kernel(
      [](pl::Ref x) {
        x.at(pl::ds(2, 4)).at(1)[pl::all] = 1.0f;          // row 3
        x.at(pl::all, pl::ds(0, 4, 4))[pl::all] = 2.0f;     // columns 0, 4, 8, 12 of every row
        pl::Value i = pl::program_id(0);
        x(i, pl::ds(i, 2)) = 3.0f;                          // row i, columns i, i+1
      },
      {ref({8, 16}, pl::f32)});
  std::vector<pl::Array> bufs = {pl::Array::zeros({8, 16}, pl::f32)};
  pl::EvaluateOptions opts;
  opts.grid = {{5}, {8}};
  pl::evaluate(k, bufs, opts);
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 16; ++c) {
      float e = 0;
      if (r == 3) e = 1;
      if (c % 4 == 0) e = 2;
      if (r == 5 && (c == 5 || c == 6)) e = 3;
      EXPECT_EQ(bufs[0].get({r, c}), e) << r << "," << c;
    }
}

TEST(Evaluate, MaskedLoadAndStore) {
  auto k = pl::trace_kernel(
      [](pl::Ref x, pl::Ref o) {
        pl::Value idx = pl::iota(pl::i32, {8}, 0);
        pl::Value v = x.load_masked({pl::all}, idx < 5, -1.0f);
        o.store_masked({pl::all}, v * 10.0f, idx % 2 == 0);
      },
      {ref({8}, pl::f32), ref({8}, pl::f32)});
  std::vector<pl::Array> bufs = {pl::Array::iota({8}, pl::f32), pl::Array::full({8}, pl::f32, 99)};
  pl::evaluate(k, bufs);
  std::vector<float> expected = {0, 99, 20, 99, 40, 99, -10, 99};
  EXPECT_EQ(bufs[1].to_vector<float>(), expected);
}

TEST(Evaluate, SwapAtomicsAndCas) {
  auto k = pl::trace_kernel(
      [](pl::Ref x, pl::Ref old) {
        old[0] = x.atomic_add({0}, 5);
        old[1] = x.atomic_rmw("max", {1}, 3);
        old[2] = x.atomic_cas({2}, 7, 42);   // matches: stores 42
        old[3] = x.atomic_cas({3}, 7, 42);   // does not match
        old[4] = x.swap({4}, 11);
        old[5] = x.atomic_rmw("xor", {5}, 6);
      },
      {ref({6}, pl::i32), ref({6}, pl::i32)});
  std::vector<pl::Array> bufs = {pl::Array::from_vector<int32_t>({6}, {1, 9, 7, 8, 10, 5}),
                                 pl::Array::zeros({6}, pl::i32)};
  pl::evaluate(k, bufs);
  EXPECT_EQ(bufs[0].to_vector<int32_t>(), (std::vector<int32_t>{6, 9, 42, 8, 11, 3}));
  EXPECT_EQ(bufs[1].to_vector<int32_t>(), (std::vector<int32_t>{1, 9, 7, 8, 10, 5}));
}

TEST(Evaluate, RunScopedGivesFreshScratch) {
  auto k = pl::trace_kernel(
      [](pl::Ref x, pl::Ref o) {
        auto r = pl::run_scoped({{{4}, pl::f32, pl::MemorySpace::Vmem}}, [&](std::vector<pl::Ref> s) {
          s[0][pl::all] = x[pl::all] + 1.0f;
          return std::vector<pl::Value>{pl::sum(s[0][pl::all])};
        });
        // `{}` is the options (no Loc overload to be ambiguous with).
        auto twice = pl::run_scoped(
            {{{}, pl::f32, pl::MemorySpace::Vmem}},
            [&](std::vector<pl::Ref> s) {
              s[0][pl::all] = r[0] * 2.0f;
              return std::vector<pl::Value>{s[0][pl::all]};
            },
            {});
        o[pl::all] = twice[0];
      },
      {ref({4}, pl::f32), ref({}, pl::f32)});
  std::vector<pl::Array> bufs = {pl::Array::from_values({4}, pl::f32, {1, 2, 3, 4}),
                                 pl::Array::zeros({}, pl::f32)};
  pl::evaluate(k, bufs);
  EXPECT_EQ(bufs[1].get_flat(0), 28.0);
}

TEST(Evaluate, ProgramIdAndNumPrograms) {
  auto k = pl::trace_kernel(
      [](pl::Ref o) {
        o[0] = pl::program_id(0);
        o[1] = pl::program_id(1);
        o[2] = pl::num_programs(0) * pl::num_programs(1);
      },
      {ref({3}, pl::i32)});
  std::vector<pl::Array> bufs = {pl::Array::zeros({3}, pl::i32)};
  pl::EvaluateOptions opts;
  opts.grid = {{2, 3}, {4, 5}};
  pl::evaluate(k, bufs, opts);
  EXPECT_EQ(bufs[0].to_vector<int32_t>(), (std::vector<int32_t>{2, 3, 20}));
}

TEST(Evaluate, DynamicIndexOutOfBoundsIsAnErrorWithTheUsersLine) {
  int line = 0;
  auto k = pl::trace_kernel(
      [&](pl::Ref x) {
        line = __LINE__ + 1;
        x[pl::program_id(0)] = 1.0f;
      },
      {ref({4}, pl::f32)});
  std::vector<pl::Array> bufs = {pl::Array::zeros({4}, pl::f32)};
  pl::EvaluateOptions opts;
  opts.grid = {{4}, {5}};
  try {
    pl::evaluate(k, bufs, opts);
    FAIL();
  } catch (const pl::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("out of bounds"), std::string::npos) << msg;
    EXPECT_NE(msg.find("index 4"), std::string::npos) << msg;
    EXPECT_NE(msg.find("evaluate_test.cpp:" + std::to_string(line)), std::string::npos) << msg;
  }
}

TEST(Evaluate, DebugPrintFormatsValues) {
  auto k = pl::trace_kernel(
      [](pl::Ref x) { pl::debug_print("x0={} pid={}", {x[0], pl::program_id(0)}); },
      {ref({2}, pl::f32)});
  std::vector<pl::Array> bufs = {pl::Array::from_values({2}, pl::f32, {1.5, 2})};
  std::ostringstream os;
  pl::EvaluateOptions opts;
  opts.grid = {{3}, {4}};
  opts.debug_out = &os;
  pl::evaluate(k, bufs, opts);
  EXPECT_EQ(os.str(), "x0=1.5 pid=3\n");
}

TEST(Evaluate, BufferMismatchIsAnError) {
  auto k = pl::trace_kernel([](pl::Ref x) { x[pl::all] = 0.0f; }, {ref({4}, pl::f32)});
  std::vector<pl::Array> bufs = {pl::Array::zeros({5}, pl::f32)};
  try {
    pl::evaluate(k, bufs);
    FAIL();
  } catch (const pl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("f32[4]"), std::string::npos) << e.what();
  }
}

TEST(Evaluate, AccumulateDotFusionMatchesPlainLoopsIncludingStridedFallback) {
  // acc[...] += dot(x, y) runs fused (one sgemm with beta = 1); through a strided view it falls
  // back to the unfused ops. Both must equal plain C++.
  auto k = pl::trace_kernel(
      [](pl::Ref x, pl::Ref y, pl::Ref acc, pl::Ref acc2) {
        acc[pl::all] += pl::dot(x[pl::all], y[pl::all]);
        acc2.at(pl::all, pl::ds(0, 4, 2))[pl::all] += pl::dot(x[pl::all], y[pl::all]);
      },
      {ref({4, 3}, pl::f32), ref({3, 4}, pl::f32), ref({4, 4}, pl::f32), ref({4, 8}, pl::f32)});
  std::vector<pl::Array> bufs = {pl::Array::random_normal({4, 3}, pl::f32, 5),
                                 pl::Array::random_normal({3, 4}, pl::f32, 6),
                                 pl::Array::full({4, 4}, pl::f32, 1), pl::Array::full({4, 8}, pl::f32, 2)};
  pl::evaluate(k, bufs);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) {
      double s = 0;
      for (int kk = 0; kk < 3; ++kk) s += bufs[0].get({i, kk}) * bufs[1].get({kk, j});
      EXPECT_NEAR(bufs[2].get({i, j}), 1 + s, 1e-5);
      EXPECT_NEAR(bufs[3].get({i, 2 * j}), 2 + s, 1e-5);
      EXPECT_EQ(bufs[3].get({i, 2 * j + 1}), 2.0);
    }
}
