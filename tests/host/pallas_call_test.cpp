// pallas_call on the reference interpreter: grids, every BlockDim kind, padding, scalar
// prefetch, aliasing, dynamic and named grids, caching. Expected values come from plain C++.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "pallas/pallas.h"

namespace pl = pallas;

namespace {
pl::Array iota_f32(pl::Shape s) { return pl::Array::iota(std::move(s), pl::f32); }
}  // namespace

TEST(PallasCall, UnevenElementwiseAddWithPaddedBlocks) {
  const int64_t R = 20, C = 130;
  auto call = pl::pallas_call(
      [](pl::Ref x, pl::Ref y, pl::Ref o) { o[pl::all] = x[pl::all] + y[pl::all]; },
      pl::ShapeDtype({R, C}, pl::f32),
      {.grid = {pl::cdiv(R, 8), pl::cdiv(C, 128)},
       .in_specs = {pl::BlockSpec({8, 128}, [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; }),
                    pl::BlockSpec({8, 128}, [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; })},
       .out_specs = {pl::BlockSpec({8, 128}, [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; })},
       .interpret = true});
  pl::Array x = pl::Array::random_normal({R, C}, pl::f32, 1);
  pl::Array y = pl::Array::random_normal({R, C}, pl::f32, 2);
  pl::Array o = call(x, y).at(0);
  ASSERT_EQ(o.shape(), (pl::Shape{R, C}));
  for (int64_t i = 0; i < R * C; ++i)
    ASSERT_EQ(o.data<float>()[i], x.data<float>()[i] + y.data<float>()[i]) << i;
}

TEST(PallasCall, PaddingReadsAsNaNAndOverhangingWritesAreDropped) {
  // x has 10 elements, blocks of 8: block 1 sees x[8:10] then 6 padding NaNs.
  auto call = pl::pallas_call(
      [](pl::Ref x, pl::Ref nan_count, pl::Ref o) {
        pl::Value v = x[pl::all];
        nan_count[pl::program_id(0)] = pl::sum(pl::where(v != v, 1, 0));
        o[pl::all] = pl::iota(pl::f32, {8}, 0) + pl::program_id(0).astype(pl::f32) * 8.0f;
      },
      std::vector<pl::ShapeDtype>{{{2}, pl::i32}, {{10}, pl::f32}},
      {.grid = {2},
       .in_specs = {pl::BlockSpec({8}, [](pl::Value i) { return pl::Indices{i}; })},
       .out_specs = {pl::BlockSpec({2}, [](pl::Value) { return pl::Indices{0}; }),
                     pl::BlockSpec({8}, [](pl::Value i) { return pl::Indices{i}; })},
       .interpret = true});
  auto out = call(iota_f32({10}));
  EXPECT_EQ(out[0].to_vector<int32_t>(), (std::vector<int32_t>{0, 6}));
  EXPECT_EQ(out[1].shape(), (pl::Shape{10}));
  for (int i = 0; i < 10; ++i) EXPECT_EQ(out[1].get({i}), i);
}

TEST(PallasCall, BlockedMatmulWithScratchAccumulatorOverK) {
  const int64_t M = 64, N = 48, K = 96, bm = 32, bn = 16, bk = 32;
  auto kernel = [](pl::Ref x, pl::Ref y, pl::Ref z, pl::Ref acc) {
    pl::when(pl::program_id(2) == 0, [&] { acc[pl::all] = 0.0f; });
    acc[pl::all] += pl::dot(x[pl::all], y[pl::all], {.preferred = pl::f32});
    pl::when(pl::program_id(2) == pl::num_programs(2) - 1, [&] { z[pl::all] = acc[pl::all]; });
  };
  for (pl::DType t : {pl::f32, pl::bf16}) {
    auto call = pl::pallas_call(
        kernel, pl::ShapeDtype({M, N}, pl::f32),
        {.grid = {M / bm, N / bn, K / bk},
         .in_specs = {pl::BlockSpec({bm, bk}, [](pl::Value i, pl::Value, pl::Value k) { return pl::Indices{i, k}; }),
                      pl::BlockSpec({bk, bn}, [](pl::Value, pl::Value j, pl::Value k) { return pl::Indices{k, j}; })},
         .out_specs = {pl::BlockSpec({bm, bn}, [](pl::Value i, pl::Value j, pl::Value) { return pl::Indices{i, j}; })},
         .scratch_shapes = {{{bm, bn}, pl::f32, pl::MemorySpace::Vmem}},
         .interpret = true});
    pl::Array x = pl::Array::random_normal({M, K}, t, 3);
    pl::Array y = pl::Array::random_normal({K, N}, t, 4);
    pl::Array z = call(x, y)[0];
    pl::Array ref({M, N}, pl::f32);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += x.get({i, k}) * y.get({k, j});
        ref.set({i, j}, s);
      }
    auto r = pl::allclose(z, ref, 1e-4, 1e-4);
    EXPECT_TRUE(r.ok) << pl::dtype_name(t) << ": " << r.message;
  }
}

TEST(PallasCall, SqueezedDimsDropFromTheKernelRef) {
  // Each grid point sees one row (squeezed) of x and writes its sum.
  auto call = pl::pallas_call(
      [](pl::Ref x, pl::Ref o) {
        EXPECT_EQ(x.shape(), (pl::Shape{16}));
        EXPECT_EQ(o.shape(), (pl::Shape{}));
        o[pl::all] = pl::sum(x[pl::all]);
      },
      pl::ShapeDtype({4}, pl::f32),
      {.grid = {4},
       .in_specs = {pl::BlockSpec({pl::squeezed, 16}, [](pl::Value i) { return pl::Indices{i, 0}; })},
       .out_specs = {pl::BlockSpec({pl::squeezed}, [](pl::Value i) { return pl::Indices{i}; })},
       .interpret = true});
  pl::Array x = iota_f32({4, 16});
  pl::Array o = call(x)[0];
  for (int r = 0; r < 4; ++r) {
    double s = 0;
    for (int c = 0; c < 16; ++c) s += r * 16 + c;
    EXPECT_EQ(o.get({r}), s);
  }
}

TEST(PallasCall, ElementDimsWithPaddingGiveOverlappingWindows) {
  // A 3-tap moving sum: window i covers padded elements [i, i+3) of x padded by (1, 1) zeros...
  // the padding holds the uninitialized value (NaN), so the kernel masks it with an iota test.
  const int64_t n = 8;
  auto call = pl::pallas_call(
      [](pl::Ref x, pl::Ref o) {
        pl::Value i = pl::program_id(0);
        pl::Value pos = pl::iota(pl::i32, {3}, 0) + i - 1;  // logical positions of the window
        pl::Value v = pl::where((pos >= 0) && (pos < 8), x[pl::all], 0.0f);
        o[pl::all] = pl::sum(v);
      },
      pl::ShapeDtype({n}, pl::f32),
      {.grid = {n},
       .in_specs = {pl::BlockSpec({pl::Element{3, {1, 1}}}, [](pl::Value i) { return pl::Indices{i}; })},
       .out_specs = {pl::BlockSpec({pl::squeezed}, [](pl::Value i) { return pl::Indices{i}; })},
       .interpret = true});
  pl::Array x = pl::Array::from_values({n}, pl::f32, {1, 2, 3, 4, 5, 6, 7, 8});
  pl::Array o = call(x)[0];
  for (int i = 0; i < n; ++i) {
    double s = 0;
    for (int k = i - 1; k <= i + 1; ++k)
      if (k >= 0 && k < n) s += k + 1;
    EXPECT_EQ(o.get({i}), s) << i;
  }
}

TEST(PallasCall, BoundedSliceBlocksCoverRaggedSegments) {
  // Segments of x given by static offsets: the kernel sees up to 4 elements, only `size` valid.
  const std::vector<int64_t> starts = {0, 3, 5};
  const std::vector<int64_t> sizes = {3, 2, 4};
  for (size_t seg = 0; seg < starts.size(); ++seg) {
    int64_t start = starts[seg], size = sizes[seg];
    auto call = pl::pallas_call(
        [](pl::Ref x, pl::Ref o) {
          EXPECT_EQ(x.shape(), (pl::Shape{4}));
          o[pl::all] = x[pl::all] * 10.0f;
        },
        pl::ShapeDtype({9}, pl::f32),
        {.grid = {1},
         .in_specs = {pl::BlockSpec({pl::BoundedSlice{4}}, [=](pl::Value) { return pl::Indices{pl::ds(start, size)}; })},
         .out_specs = {pl::BlockSpec({pl::BoundedSlice{4}}, [=](pl::Value) { return pl::Indices{pl::ds(start, size)}; })},
         .interpret = true});
    pl::Array o = call(iota_f32({9}))[0];
    for (int64_t i = start; i < start + size; ++i) EXPECT_EQ(o.get({i}), 10.0 * i) << seg << " " << i;
    for (int64_t i = 0; i < 9; ++i)
      if (i < start || i >= start + size) {
        EXPECT_TRUE(std::isnan(o.get({i}))) << seg << " " << i;
      }
  }
}

TEST(PallasCall, ScalarPrefetchChoosesBlocks) {
  // out block i = x block table[i]; the kernel also reads the table.
  auto call = pl::pallas_call(
      [](pl::Ref table, pl::Ref x, pl::Ref o) {
        o[pl::all] = x[pl::all] + table[pl::program_id(0)].astype(pl::f32) * 1000.0f;
      },
      pl::ShapeDtype({4, 8}, pl::f32),
      {.grid_spec = pl::PrefetchScalarGridSpec(
           1, {4},
           {pl::BlockSpec({1, 8}, [](pl::Value i, pl::Ref t) { return pl::Indices{t[i], 0}; })},
           {pl::BlockSpec({1, 8}, [](pl::Value i, pl::Ref) { return pl::Indices{i, 0}; })}),
       .interpret = true});
  pl::Array table = pl::Array::from_vector<int32_t>({4}, {2, 0, 3, 2});
  pl::Array x = iota_f32({4, 8});
  pl::Array o = call(table, x)[0];
  std::vector<int> t = {2, 0, 3, 2};
  for (int i = 0; i < 4; ++i)
    for (int c = 0; c < 8; ++c) EXPECT_EQ(o.get({i, c}), t[i] * 8 + c + 1000.0 * t[i]);
}

TEST(PallasCall, InputOutputAliasUpdatesInPlace) {
  auto call = pl::pallas_call(
      [](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all] * 2.0f; },
      pl::ShapeDtype({16, 8}, pl::f32),
      {.grid = {2},
       .in_specs = {pl::BlockSpec({8, 8}, [](pl::Value i) { return pl::Indices{i, 0}; })},
       .out_specs = {pl::BlockSpec({8, 8}, [](pl::Value i) { return pl::Indices{i, 0}; })},
       .input_output_aliases = {{0, 0}},
       .interpret = true});
  pl::Array x = iota_f32({16, 8});
  pl::Array o = call(x)[0];
  EXPECT_TRUE(o.shares_buffer_with(x));
  for (int i = 0; i < 128; ++i) EXPECT_EQ(x.get_flat(i), 2.0 * i);
}

TEST(PallasCall, DynamicGridSizeComesFromTheCall) {
  auto call = pl::pallas_call(
      [](pl::Ref o) { o[pl::program_id(0)] = pl::num_programs(0) * 100 + pl::program_id(0); },
      pl::ShapeDtype({8}, pl::i32), {.grid = {pl::dynamic}, .interpret = true});
  pl::Array n = pl::Array::full({}, pl::i32, 5);
  pl::Array o = call(n)[0];
  for (int i = 0; i < 5; ++i) EXPECT_EQ(o.get({i}), 500 + i);
  for (int i = 5; i < 8; ++i) EXPECT_EQ(o.get({i}), 2147483647) << "untouched: uninitialized value";
}

TEST(PallasCall, NamedGridAxes) {
  auto call = pl::pallas_call(
      [](pl::Ref o) { o(pl::program_id("row"), pl::program_id("col")) = pl::program_id("row") * 10 + pl::program_id("col"); },
      pl::ShapeDtype({3, 2}, pl::i32), {.grid = {{"row", 3}, {"col", 2}}, .interpret = true});
  pl::Array o = call()[0];
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 2; ++c) EXPECT_EQ(o.get({r, c}), r * 10 + c);
}

TEST(PallasCall, DefaultSpecsAreWholeArraysAndTracingIsCached) {
  auto call = pl::pallas_call([](pl::Ref x, pl::Ref o) { o[pl::all] = -x[pl::all]; },
                              pl::ShapeDtype({4}, pl::f32), {.interpret = true});
  pl::Array a = iota_f32({4});
  EXPECT_EQ(call(a)[0].to_vector<float>(), (std::vector<float>{0, -1, -2, -3}));
  call(a);
  EXPECT_EQ(call.cache_size(), 1);
  call(iota_f32({4}).astype(pl::f32));
  EXPECT_EQ(call.cache_size(), 1);
}

TEST(PallasCall, RowRangeGridWithRevisitedOutputAccumulates) {
  // Output block (0) is revisited on consecutive iterations: the accumulator pattern.
  auto call = pl::pallas_call(
      [](pl::Ref x, pl::Ref o) {
        pl::when(pl::program_id(0) == 0, [&] { o[pl::all] = 0.0f; });
        o[pl::all] += x[pl::all];
      },
      pl::ShapeDtype({8}, pl::f32),
      {.grid = {4},
       .in_specs = {pl::BlockSpec({pl::squeezed, 8}, [](pl::Value i) { return pl::Indices{i, 0}; })},
       .out_specs = {pl::BlockSpec({8}, [](pl::Value) { return pl::Indices{0}; })},
       .interpret = true});
  pl::Array o = call(iota_f32({4, 8}))[0];
  for (int c = 0; c < 8; ++c) EXPECT_EQ(o.get({c}), 4 * c + 8 * (0 + 1 + 2 + 3));
}

TEST(PallasCall, BufferedPipelineModeIsRecordedAndDebugPrintsTheMapping) {
  std::ostringstream os;
  auto call = pl::pallas_call(
      [](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all]; }, pl::ShapeDtype({16}, pl::f32),
      {.grid = {2},
       .in_specs = {pl::BlockSpec({8}, [](pl::Value i) { return pl::Indices{i}; }).with_pipeline_mode(pl::Buffered{3})},
       .out_specs = {pl::BlockSpec({8}, [](pl::Value i) { return pl::Indices{i}; })},
       .interpret = true,
       .name = "copy",
       .debug = true,
       .debug_out = &os});
  call(iota_f32({16}));
  auto tc = call.trace({{{16}, pl::f32}});
  ASSERT_TRUE(tc->grid_mapping.block_mappings[0].pipeline_mode.has_value());
  EXPECT_EQ(tc->grid_mapping.block_mappings[0].pipeline_mode->buffer_count, 3);
  std::string text = os.str();
  EXPECT_NE(text.find("kernel @copy"), std::string::npos) << text;
  EXPECT_NE(text.find("Buffered(3)"), std::string::npos) << text;
  EXPECT_NE(text.find("GridMapping(grid=(2,)"), std::string::npos) << text;
}

TEST(PallasCall, CostEstimateJsonMatchesTheSeedsFormat) {
  pl::CostEstimate c{.flops = 10, .transcendentals = 2, .bytes_accessed = 300};
  EXPECT_EQ(c.to_json(),
            "{\"flops\": 10, \"transcendentals\": 2, \"bytes_accessed\": 300, "
            "\"remote_bytes_transferred\": 0}");
}

TEST(PallasCall, CompilerParamsAreAcceptedPerBackend) {
  auto call = pl::pallas_call(
      [](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all]; }, pl::ShapeDtype({4}, pl::f32),
      {.compiler_params = pl::tpu::CompilerParams{.dimension_semantics = {"parallel"}}, .interpret = true});
  EXPECT_EQ(call(iota_f32({4}))[0].to_vector<float>(), (std::vector<float>{0, 1, 2, 3}));
}

TEST(PallasCall, KernelHelpers) {
  EXPECT_EQ(pl::cdiv(10, 4), 3);
  EXPECT_EQ(pl::cdiv(8, 4), 2);
  auto call = pl::pallas_call(
      [](pl::Ref o) {
        o[pl::all] = 0;
        pl::loop(1, 10, [&](pl::Value i) { o[pl::all] += pl::multiple_of(i, 1); }, 3);  // 1, 4, 7
        o[pl::all] += pl::cdiv(pl::scalar(10, pl::i32), 4) * 100;
      },
      pl::ShapeDtype({}, pl::i32), {.interpret = true});
  EXPECT_EQ(call()[0].get_flat(0), 12 + 300);
}
