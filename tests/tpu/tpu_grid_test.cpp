// Grid execution in the TPU interpret mode: when input blocks are copied in and output blocks
// copied out, output buffers that persist, accumulators, scalar prefetch, the revisit check and
// out-of-bounds block indices.
#include <cmath>

#include "tests/tpu/tpu_test_util.h"

using namespace tpu_test;

TEST(TpuGrid, InputBlockIsCopiedInOnlyWhenItsIndexChanges) {
  // x's block depends on i only: during j = 1, 2 the kernel sees its own earlier writes to the
  // input buffer; a new i brings a fresh copy.
  auto kernel = [](pl::Ref x, pl::Ref o) {
    o[pl::all] = x[pl::all];
    x[pl::all] = x[pl::all] + 100.0f;
  };
  pl::CallOptions opts;
  opts.grid = {2, 3};
  opts.in_specs = {pl::BlockSpec({8, 128}, [](pl::Value i, pl::Value) { return pl::Indices{i, 0}; })};
  opts.out_specs = {pl::BlockSpec({8, 128}, [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; })};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({16, 384}, pl::f32), opts);
  pl::Array x = iota_f32({16, 128});
  pl::Array o = call(x)[0];
  for (int64_t r = 0; r < 16; ++r)
    for (int64_t c = 0; c < 384; ++c)
      ASSERT_EQ(o.data<float>()[r * 384 + c], x.data<float>()[r * 128 + c % 128] + 100.0f * (c / 128))
          << r << "," << c;
  // The caller's input is untouched.
  EXPECT_EQ(x.data<float>()[5], 5.0f);
}

TEST(TpuGrid, OutputBlockIsCopiedOutWhenTheNextBlockDiffers) {
  // The output aliases an HBM input the kernel copies in whole each step: HBM shows an output
  // block's value only after the last step that visits it.
  auto kernel = [](pl::Ref x_hbm, pl::Ref o, pl::Ref seen, pl::Ref whole) {
    pltpu::sync_copy(x_hbm, whole);
    seen[pl::ds(0, 1)] = whole[pl::ds(0, 1)];
    seen[pl::ds(1, 1)] = whole[pl::ds(8, 1)];
    o[pl::all] = pl::full({8, 128}, pl::f32, 1.0) * (pl::program_id(0) + 1).astype(pl::f32);
  };
  pl::CallOptions opts;
  opts.grid = {4};
  opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
  opts.out_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i / 2, 0}; }),
                    pl::BlockSpec({2, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })};
  opts.scratch_shapes = {pltpu::VMEM({16, 128}, pl::f32)};
  opts.input_output_aliases = {{0, 0}};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, {pl::ShapeDtype({16, 128}, pl::f32), pl::ShapeDtype({8, 128}, pl::f32)},
                              opts);
  pl::Array x = iota_f32({16, 128});
  auto out = call(x);
  const float x0 = 0.0f, x8 = 8.0f * 128;
  // (row 0, row 8) of HBM as seen at each step.
  const float want[4][2] = {{x0, x8}, {x0, x8}, {2.0f, x8}, {2.0f, x8}};
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(out[1].data<float>()[(2 * s) * 128], want[s][0]) << "step " << s;
    EXPECT_EQ(out[1].data<float>()[(2 * s + 1) * 128], want[s][1]) << "step " << s;
  }
  for (int64_t r = 0; r < 16; ++r)
    ASSERT_EQ(out[0].data<float>()[r * 128 + 3], r < 8 ? 2.0f : 4.0f) << r;
}

TEST(TpuGrid, OutputBufferIsNotReinitialisedBetweenBlocks) {
  auto kernel = [](pl::Ref o) {
    pl::Value i = pl::program_id(0);
    pl::when(i == 0, [&] { o[pl::all] = pl::full({8, 128}, pl::f32, 7.0); });
    pl::when(i == 1, [&] { o[pl::ds(0, 4)] = pl::full({4, 128}, pl::f32, 9.0); });
  };
  pl::CallOptions opts;
  opts.grid = {2};
  opts.out_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })};
  opts.interpret = pltpu::InterpretParams{};
  pl::Array o = pl::pallas_call(kernel, pl::ShapeDtype({16, 128}, pl::f32), opts)()[0];
  for (int64_t r = 0; r < 16; ++r)
    ASSERT_EQ(o.data<float>()[r * 128 + 10], r < 8 ? 7.0f : (r < 12 ? 9.0f : 7.0f)) << r;
}

TEST(TpuGrid, AccumulatorOverAnArbitraryDimension) {
  auto kernel = [](pl::Ref x, pl::Ref o) {
    pl::when(pl::program_id(1) == 0, [&] { o[pl::all] = pl::zeros({8, 128}, pl::f32); });
    o[pl::all] += x[pl::all];
  };
  pl::Array x = iota_f32({32, 384});
  for (int cores : {1, 2, 4}) {
    pl::CallOptions opts;
    opts.grid = {4, 3};
    opts.in_specs = {pl::BlockSpec({8, 128}, [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; })};
    opts.out_specs = {pl::BlockSpec({8, 128}, [](pl::Value i, pl::Value) { return pl::Indices{i, 0}; })};
    opts.compiler_params = pltpu::CompilerParams{.dimension_semantics = {"parallel", "arbitrary"}};
    pltpu::InterpretParams p;
    p.num_cores_per_device = cores;
    opts.interpret = p;
    pl::Array o = pl::pallas_call(kernel, pl::ShapeDtype({32, 128}, pl::f32), opts)(x)[0];
    for (int64_t r = 0; r < 32; ++r)
      for (int64_t c = 0; c < 128; ++c) {
        float want = 0;
        for (int64_t j = 0; j < 3; ++j) want += x.data<float>()[r * 384 + j * 128 + c];
        ASSERT_EQ(o.data<float>()[r * 128 + c], want) << cores << " cores, " << r << "," << c;
      }
  }
}

TEST(TpuGrid, ScalarPrefetchDrivesTheIndexMap) {
  // Block i of the output comes from block order[i] of x.
  auto kernel = [](pl::Ref order, pl::Ref x, pl::Ref o) {
    o[pl::all] = x[pl::all] + order[pl::program_id(0)].astype(pl::f32);
  };
  pl::CallOptions opts;
  opts.grid_spec = pl::PrefetchScalarGridSpec(
      1, {3}, {pl::BlockSpec({8, 128}, [](pl::Value i, pl::Ref order) { return pl::Indices{order[i], 0}; })},
      {pl::BlockSpec({8, 128}, [](pl::Value i, pl::Ref) { return pl::Indices{i, 0}; })});
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({24, 128}, pl::f32), opts);
  pl::Array order = pl::Array::from_values({3}, pl::i32, {2, 0, 1});
  pl::Array x = iota_f32({24, 128});
  pl::Array o = call(order, x)[0];
  const int ord[3] = {2, 0, 1};
  for (int64_t r = 0; r < 24; ++r)
    for (int64_t c = 0; c < 128; ++c)
      ASSERT_EQ(o.data<float>()[r * 128 + c],
                x.data<float>()[(ord[r / 8] * 8 + r % 8) * 128 + c] + static_cast<float>(ord[r / 8]));
}

TEST(TpuGrid, RevisitingAnOutputBlockIsAnError) {
  auto kernel = [](pl::Ref o) { o[pl::all] = pl::full({8, 128}, pl::f32, 1.0); };
  pl::CallOptions opts;
  opts.grid = {3};
  const int line = __LINE__ + 1;
  opts.out_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i % 2, 0}; })};
  opts.compiler_params = pltpu::CompilerParams{.dimension_semantics = {"arbitrary"}};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({16, 128}, pl::f32), opts);
  EXPECT_EQ(error_of([&] { call(); }),
            "Revisited block [0:8, 0:128] of output 0 in iteration (2,). The block was previously "
            "visited in iterations (0,) through (0,). (at " + line_ref(__FILE__, line) + ")");
}

TEST(TpuGrid, RevisitAfterConsecutiveVisitsNamesTheFirstAndLastIteration) {
  // Over the linear iterations (0,0) (0,1) (1,0) (1,1) the block indices are 0 0 1 0: block 0
  // is visited twice in a row (fine), then again at (1, 1).
  auto kernel = [](pl::Ref o) { o[pl::all] = pl::full({8, 128}, pl::f32, 1.0); };
  pl::CallOptions opts;
  opts.grid = {2, 2};
  const int line = __LINE__ + 2;
  opts.out_specs = {pl::BlockSpec(
      {8, 128}, [](pl::Value i, pl::Value j) { return pl::Indices{pl::where(i * 2 + j == 2, 1, 0), 0}; })};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({16, 128}, pl::f32), opts);
  EXPECT_EQ(error_of([&] { call(); }),
            "Revisited block [0:8, 0:128] of output 0 in iteration (1, 1). The block was previously "
            "visited in iterations (0, 0) through (0, 1). (at " + line_ref(__FILE__, line) + ")");
}

TEST(TpuGrid, OutOfBoundsInputBlockIndex) {
  auto kernel = [](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all]; };
  pl::CallOptions opts;
  opts.grid = {2};
  const int line = __LINE__ + 1;
  opts.in_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i + 1, 0}; })};
  opts.out_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({16, 128}, pl::f32), opts);
  EXPECT_EQ(error_of([&] { call(iota_f32({16, 128})); }),
            "Out-of-bounds block index (2, 0) for input \"args[0]\" in iteration (1,) on device 0 "
            "(core 0): reading [16:24, 0:128] but input has shape (16, 128). (at " +
                line_ref(__FILE__, line) + ")");
}

TEST(TpuGrid, OutOfBoundsOutputBlockIndex) {
  auto kernel = [](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all]; };
  pl::CallOptions opts;
  opts.grid = {2};
  opts.in_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })};
  const int line = __LINE__ + 1;
  opts.out_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{0, i * 3}; })};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 256}, pl::f32), opts);
  EXPECT_EQ(error_of([&] { call(iota_f32({16, 128})); }),
            "Out-of-bounds block index (0, 3) for output \"outputs[0]\" in iteration (1,) on device 0 "
            "(core 0): writing [0:8, 384:512] but output has shape (8, 256). (at " +
                line_ref(__FILE__, line) + ")");
}

TEST(TpuGrid, EmptyGridRunsOnce) {
  int calls = 0;
  pltpu::InterpretParams p;
  p.grid_point_recorder = [&](const std::vector<int64_t>& pt, int core) {
    EXPECT_TRUE(pt.empty());
    EXPECT_EQ(core, 0);
    ++calls;
  };
  auto call = pl::pallas_call([](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all] * 2.0f; },
                              pl::ShapeDtype({8, 128}, pl::f32), {.interpret = p});
  pl::Array o = call(iota_f32({8, 128}))[0];
  EXPECT_EQ(calls, 1);
  for (int64_t i = 0; i < 8 * 128; ++i) ASSERT_EQ(o.data<float>()[i], 2.0f * i);
}

namespace {
// Element(8) rows at offsets 0, 6, 12 of a 16-row input: the last block, rows 12..19, is partly
// outside.
const int kElementLine = __LINE__ + 5;
pl::PallasCall element_call(const pltpu::InterpretParams& p) {
  pl::CallOptions opts;
  opts.grid = {3};
  opts.in_specs = {
      pl::BlockSpec({pl::Element(8), 128}, [](pl::Value i) { return pl::Indices{i * 6, 0}; })};
  opts.out_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })};
  opts.interpret = p;
  return pl::pallas_call([](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all]; },
                         pl::ShapeDtype({24, 128}, pl::f32), opts);
}
}  // namespace

TEST(TpuGrid, InputBlockPartlyOutsideRaisesByDefault) {
  EXPECT_EQ(error_of([&] { element_call(pltpu::InterpretParams{})(iota_f32({16, 128})); }),
            "Out-of-bounds block index (12, 0) for input \"args[0]\" in iteration (2,) on device 0 "
            "(core 0): reading [12:20, 0:128] but input has shape (16, 128). (at " +
                line_ref(__FILE__, kElementLine) + ")");
}

TEST(TpuGrid, InputBlockPartlyOutsideReadsTheFillValueWhenUninitialized) {
  for (const char* fill : {"nan", "zero"}) {
    pltpu::InterpretParams p;
    p.out_of_bounds_reads = "uninitialized";
    p.uninitialized_memory = fill;
    pl::Array x = iota_f32({16, 128}, 1.0f);
    pl::Array o = element_call(p)(x)[0];
    for (int64_t r = 0; r < 24; ++r)
      for (int64_t c = 0; c < 128; ++c) {
        int64_t src = (r / 8) * 6 + r % 8;  // the input row block r/8 shows at row r%8
        float v = o.data<float>()[r * 128 + c];
        if (src < 16)
          ASSERT_EQ(v, x.data<float>()[src * 128 + c]) << fill << " " << r << "," << c;
        else if (std::string(fill) == "nan")
          ASSERT_TRUE(std::isnan(v)) << r << "," << c;
        else
          ASSERT_EQ(v, 0.0f) << r << "," << c;
      }
  }
}

TEST(TpuGrid, InputBlockEntirelyOutsideRaisesEvenWhenUninitialized) {
  pltpu::InterpretParams p;
  p.out_of_bounds_reads = "uninitialized";
  auto kernel = [](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all]; };
  pl::CallOptions opts;
  opts.grid = {2};
  opts.in_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i + 1, 0}; })};
  opts.out_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })};
  opts.interpret = p;
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({16, 128}, pl::f32), opts);
  EXPECT_CONTAINS(error_of([&] { call(iota_f32({16, 128})); }),
                  "Out-of-bounds block index (2, 0) for input \"args[0]\" in iteration (1,) on device 0 "
                  "(core 0): reading [16:24, 0:128] but input has shape (16, 128).");
}

TEST(TpuGrid, ElementBlocksWithPaddingMatchTheReferenceInterpreter) {
  // Element(4, padding (2, 2)) over 8 rows: block i covers padded rows [4i, 4i+4), i.e. input
  // rows 4i-2 .. 4i+1; the padding reads as the uninitialized value (NaN).
  auto kernel = [](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all] + 1.0f; };
  pl::CallOptions opts;
  opts.grid = {3};
  opts.in_specs = {pl::BlockSpec({pl::Element(4, {2, 2}), 128}, [](pl::Value i) { return pl::Indices{i * 4, 0}; })};
  opts.out_specs = {pl::BlockSpec({4, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })};
  pl::Array x = iota_f32({8, 128});
  opts.interpret = pltpu::InterpretParams{};
  pl::Array o = pl::pallas_call(kernel, pl::ShapeDtype({12, 128}, pl::f32), opts)(x)[0];
  opts.interpret = true;
  pl::Array ref = pl::pallas_call(kernel, pl::ShapeDtype({12, 128}, pl::f32), opts)(x)[0];
  for (int64_t r = 0; r < 12; ++r)
    for (int64_t c = 0; c < 128; ++c) {
      float v = o.data<float>()[r * 128 + c], w = ref.data<float>()[r * 128 + c];
      if (r >= 2 && r < 10) {
        ASSERT_EQ(v, x.data<float>()[(r - 2) * 128 + c] + 1.0f) << r;
      } else {
        ASSERT_TRUE(std::isnan(v)) << r << "," << c << " " << v;
      }
      ASSERT_TRUE(v == w || (std::isnan(v) && std::isnan(w))) << r << "," << c;
    }
}

TEST(TpuGrid, SqueezedAndBoundedSliceBlocks) {
  // Squeezed row i of x (a (128,) block), and BoundedSlice rows ds(i, 2) of y.
  auto kernel = [](pl::Ref x, pl::Ref y, pl::Ref o) {
    o[pl::ds(0, 1)] = pl::reshape(x[pl::all], {1, 128});
    o[pl::ds(1, 2)] = y[pl::ds(0, 2)];
  };
  pl::CallOptions opts;
  opts.grid = {4};
  opts.in_specs = {pl::BlockSpec({pl::squeezed, 128}, [](pl::Value i) { return pl::Indices{i, 0}; }),
                   pl::BlockSpec({pl::BoundedSlice(4), 128}, [](pl::Value i) { return pl::Indices{pl::ds(i, 2), 0}; })};
  opts.out_specs = {pl::BlockSpec({pl::squeezed, 3, 128}, [](pl::Value i) { return pl::Indices{i, 0, 0}; })};
  opts.interpret = pltpu::InterpretParams{};
  pl::Array x = iota_f32({4, 128}), y = iota_f32({8, 128}, 1000.0f);
  pl::Array o = pl::pallas_call(kernel, pl::ShapeDtype({4, 3, 128}, pl::f32), opts)(x, y)[0];
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t c = 0; c < 128; ++c) {
      ASSERT_EQ(o.data<float>()[(i * 3) * 128 + c], x.data<float>()[i * 128 + c]);
      ASSERT_EQ(o.data<float>()[(i * 3 + 1) * 128 + c], y.data<float>()[i * 128 + c]);
      ASSERT_EQ(o.data<float>()[(i * 3 + 2) * 128 + c], y.data<float>()[(i + 1) * 128 + c]);
    }
}

TEST(TpuGrid, DynamicGridSize) {
  // A dynamic grid dimension: its size is the leading scalar argument.
  auto kernel = [](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all] * 2.0f; };
  pl::CallOptions opts;
  opts.grid = {pl::dynamic};
  opts.in_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })};
  opts.out_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })};
  int points = 0;
  pltpu::InterpretParams p;
  p.grid_point_recorder = [&](const std::vector<int64_t>&, int) { ++points; };
  opts.interpret = p;
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({32, 128}, pl::f32), opts);
  pl::Array x = iota_f32({32, 128});
  pl::Array o = call(pl::Array::from_values({}, pl::i32, {3}), x)[0];
  EXPECT_EQ(points, 3);
  for (int64_t r = 0; r < 24; ++r) ASSERT_EQ(o.data<float>()[r * 128 + 1], 2.0f * (r * 128 + 1)) << r;
}

TEST(TpuGrid, InputOutputAliasing) {
  // In place: o aliases x; each block is incremented once.
  auto kernel = [](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all] + 1.0f; };
  pl::CallOptions opts;
  opts.grid = {4};
  opts.in_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })};
  opts.out_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })};
  opts.input_output_aliases = {{0, 0}};
  opts.compiler_params = pltpu::CompilerParams{.dimension_semantics = {"parallel"}};
  pltpu::InterpretParams p;
  p.num_cores_per_device = 2;
  opts.interpret = p;
  pl::Array x = iota_f32({32, 128});
  pl::Array o = pl::pallas_call(kernel, pl::ShapeDtype({32, 128}, pl::f32), opts)(x)[0];
  for (int64_t i = 0; i < 32 * 128; ++i) ASSERT_EQ(o.data<float>()[i], i + 1.0f);
}

TEST(TpuGrid, TiledMatmulOverAThreeDimensionalGrid) {
  // o = a @ b in (8, 128) x (128, 128) tiles over grid (M/8, N/128, K/128), accumulating over
  // the last (arbitrary) dimension; the same on 1, 2 and 4 cores.
  const int64_t M = 16, N = 256, K = 384;
  pl::Array a = pl::Array::random_uniform({M, K}, pl::f32, 1, -4, 4);
  pl::Array b = pl::Array::random_uniform({K, N}, pl::f32, 2, -4, 4);
  // Small integers: every partial sum is exact in f32, whatever the order.
  for (pl::Array* m : {&a, &b})
    for (int64_t i = 0; i < m->size(); ++i) m->data<float>()[i] = std::floor(m->data<float>()[i]);
  std::vector<float> want(M * N, 0.0f);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j)
      for (int64_t k = 0; k < K; ++k) want[i * N + j] += a.data<float>()[i * K + k] * b.data<float>()[k * N + j];
  auto kernel = [](pl::Ref x, pl::Ref y, pl::Ref o, pl::Ref acc) {
    pl::when(pl::program_id(2) == 0, [&] { acc[pl::all] = pl::zeros({8, 128}, pl::f32); });
    acc[pl::all] = acc[pl::all] + pl::dot(x[pl::all], y[pl::all]);
    pl::when(pl::program_id(2) == pl::num_programs(2) - 1, [&] { o[pl::all] = acc[pl::all]; });
  };
  for (int cores : {1, 2, 4}) {
    pl::CallOptions opts;
    opts.grid = {M / 8, N / 128, K / 128};
    opts.in_specs = {pl::BlockSpec({8, 128}, [](pl::Value i, pl::Value, pl::Value k) { return pl::Indices{i, k}; }),
                     pl::BlockSpec({128, 128}, [](pl::Value, pl::Value j, pl::Value k) { return pl::Indices{k, j}; })};
    opts.out_specs = {pl::BlockSpec({8, 128}, [](pl::Value i, pl::Value j, pl::Value) { return pl::Indices{i, j}; })};
    opts.scratch_shapes = {pltpu::VMEM({8, 128}, pl::f32)};
    opts.compiler_params = pltpu::CompilerParams{.dimension_semantics = {"parallel", "parallel", "arbitrary"}};
    std::shared_ptr<std::vector<pltpu::RaceReport>> races;
    pltpu::InterpretParams p = race_params(races);
    p.num_cores_per_device = cores;
    p.random_seed = 3;
    opts.interpret = p;
    pl::Array o = pl::pallas_call(kernel, pl::ShapeDtype({M, N}, pl::f32), opts)(a, b)[0];
    for (int64_t i = 0; i < M * N; ++i) ASSERT_EQ(o.data<float>()[i], want[i]) << cores << " cores, " << i;
    EXPECT_TRUE(races->empty()) << all_reports(*races);
  }
}

TEST(TpuGrid, EmptyGridDimensionRunsNothing) {
  int points = 0;
  pltpu::InterpretParams p;
  p.uninitialized_memory = "zero";
  p.grid_point_recorder = [&](const std::vector<int64_t>&, int) { ++points; };
  pl::CallOptions opts;
  opts.grid = {0};
  opts.out_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })};
  opts.interpret = p;
  pl::Array o = pl::pallas_call([](pl::Ref o) { o[pl::all] = pl::full({8, 128}, pl::f32, 1.0); },
                                pl::ShapeDtype({8, 128}, pl::f32), opts)()[0];
  EXPECT_EQ(points, 0);
  for (int64_t i = 0; i < 8 * 128; ++i) ASSERT_EQ(o.data<float>()[i], 0.0f);
}

TEST(TpuGrid, NamedGridAxes) {
  // axis_index and program_id of a named grid axis give the grid point.
  auto kernel = [](pl::Ref o) {
    pl::Value lane = pl::iota(pl::i32, {1, 128}, 1);
    o[pl::all] = pl::where(lane == 0, pltpu::axis_index("i"), pl::where(lane == 1, pl::program_id("j"), 0));
  };
  pl::CallOptions opts;
  opts.grid = pl::Grid{{"i", 2}, {"j", 3}};
  opts.out_specs = {pl::BlockSpec({1, 128}, [](pl::Value i, pl::Value j) { return pl::Indices{i * 3 + j, 0}; })};
  opts.interpret = pltpu::InterpretParams{};
  pl::Array o = pl::pallas_call(kernel, pl::ShapeDtype({6, 128}, pl::i32), opts)()[0];
  for (int r = 0; r < 6; ++r) {
    EXPECT_EQ(o.data<int32_t>()[r * 128], r / 3);
    EXPECT_EQ(o.data<int32_t>()[r * 128 + 1], r % 3);
  }
}
