// gpu::emit_pipeline: a software pipeline inside a gpu::kernel, on the interpreter, under host
// emulation and (with a GPU) compiled. Every result is checked against plain loops over the
// inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/call.h"
#include "gpu/codegen.h"
#include "gpu/cuda_libs.h"
#include "pallas/gpu.h"
#include "pallas/pallas.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

namespace {

namespace pl = ::pallas;
namespace plgpu = ::pallas::gpu;
using test_util::run_on;

using test_util::random_f32;

// out (rows, w) is the sum of x's column blocks of width w (a double loop, summing in block
// order as the kernels do, so the f32 results agree exactly).
void expect_sum_of_column_blocks(const pl::Array& x, const pl::Array& out) {
  const int64_t rows = x.shape()[0], cols = x.shape()[1], w = out.shape()[1];
  ASSERT_EQ(out.shape()[0], rows);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < w; ++c) {
      float want = 0;
      for (int64_t j = 0; j < cols / w; ++j) want += x.data<float>()[r * cols + j * w + c];
      ASSERT_EQ(out.data<float>()[r * w + c], want) << r << "," << c;
    }
}

// A body accumulating its (32, 128) input block into its output block over the grid's j: the
// first step of each row of the grid starts from zero.
void accumulate_over_j(const std::vector<pl::Value>& idx, const std::vector<pl::Ref>& b) {
  pl::when(idx[1] == 0, [&] { b[1][pl::all] = pl::zeros({32, 128}, pl::f32); });
  b[1][pl::all] = b[1][pl::all] + b[0][pl::all];
}

class Pipeline : public test_util::OnGpuBackends {};
INSTANTIATE_TEST_SUITE_P(Backends, Pipeline, testing::Values("interpret", "gpu_emulate", "mosaic_gpu"),
                         test_util::backend_name);

// out = 2 x + y + bias over (32, 64) blocks of a (64, 256) grid of 2 x 4 steps, with 1, 2 and 3
// slots per input; bias stays in GMEM (a gpu::GMEM spec: the body gets the whole operand) and is
// read directly. Each CTA runs the pipeline over half of the rows.
TEST_P(Pipeline, StreamsBlocksThroughSharedMemory) {
  const pl::Array x = random_f32({128, 256}, 1), y = random_f32({128, 256}, 2), bias = random_f32({1, 64}, 3);
  for (int slots : {1, 2, 3}) {
    SCOPED_TRACE(slots);
    pl::PallasCall call = plgpu::kernel(
        [slots](pl::Ref x, pl::Ref y, pl::Ref bias, pl::Ref out) {
          const pl::Value half = plgpu::axis_index("h");
          const pl::Ref xs = x.at(pl::ds(half * 64, 64), pl::all), ys = y.at(pl::ds(half * 64, 64), pl::all),
                       os = out.at(pl::ds(half * 64, 64), pl::all);
          const pl::BlockSpec block({32, 64}, [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; });
          plgpu::emit_pipeline(
              [](const std::vector<pl::Value>&, const std::vector<pl::Ref>& b) {
                b[3][pl::all] = b[0][pl::all] * 2.0f + b[1][pl::all] + b[2][pl::all];
              },
              {.grid = {2, 4},
               .in_specs = {block, block, pl::BlockSpec(plgpu::GMEM)},
               .out_specs = {block},
               .max_concurrent_steps = slots})({xs, ys, bias, os});
        },
        {pl::ShapeDtype({128, 256}, pl::f32)}, plgpu::Mesh{.grid = {2}, .grid_names = {"h"}}, run_on(GetParam(), {}));
    const pl::Array out = call(x, y, bias).at(0);
    for (int64_t r = 0; r < 128; ++r)
      for (int64_t c = 0; c < 256; ++c) {
        const float want = x.data<float>()[r * 256 + c] * 2.0f + y.data<float>()[r * 256 + c] + bias.data<float>()[c % 64];
        ASSERT_EQ(out.data<float>()[r * 256 + c], want) << r << "," << c;
      }
  }
}

// An output block that consecutive steps map to stays in its buffer between them: a row sum
// over the 3 column blocks of each of 2 row blocks (out's index map ignores j), accumulated in
// the block by the steps; the block is copied out when i moves on and at the end.
TEST_P(Pipeline, ConsecutiveStepsOfAnOutputBlockAccumulateInIt) {
  const pl::Array x = random_f32({64, 384}, 4);
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref out) {
        plgpu::emit_pipeline(
            accumulate_over_j,
            {.grid = {2, 3},
             .in_specs = {pl::BlockSpec({32, 128}, [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; })},
             .out_specs = {pl::BlockSpec({32, 128}, [](pl::Value i, pl::Value) { return pl::Indices{i, 0}; })},
             .max_concurrent_steps = 2})({x, out});
      },
      {pl::ShapeDtype({64, 128}, pl::f32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"b"}}, run_on(GetParam(), {}));
  const pl::Array out = call(x).at(0);
  expect_sum_of_column_blocks(x, out);
}

// A carried value: the sum of the 4 (32, 64) slices of x (a squeezed leading dim), carried
// through the steps as a tile and stored to the output after the pipeline.
TEST_P(Pipeline, ACarryRunsThroughTheStepsAndSqueezedDimsIndexTheArray) {
  const pl::Array x = random_f32({4, 32, 64}, 5);
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref out) {
        const std::vector<pl::Value> total = plgpu::emit_pipeline(
            [](const std::vector<pl::Value>&, const std::vector<pl::Ref>& b, const std::vector<pl::Value>& carry) {
              return std::vector<pl::Value>{carry[0] + b[0][pl::all]};
            },
            {.grid = {4},
             .in_specs = {pl::BlockSpec({pl::squeezed, 32, 64}, [](pl::Value s) { return pl::Indices{s, 0, 0}; })},
             .max_concurrent_steps = 3,
             .init_carry = {pl::zeros({32, 64}, pl::f32)}})({x});
        out[pl::all] = total.at(0);
      },
      {pl::ShapeDtype({32, 64}, pl::f32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"b"}}, run_on(GetParam(), {}));
  const pl::Array out = call(x).at(0);
  for (int64_t e = 0; e < 32 * 64; ++e) {
    float want = 0;
    for (int64_t s = 0; s < 4; ++s) want += x.data<float>()[s * 32 * 64 + e];
    ASSERT_EQ(out.data<float>()[e], want) << e;
  }
}

// A matmul on wgmma over the K steps: each step's product reads its slots and is left running
// (wgmma_wait(1) waits only for the step before), so the slots are released a step late
// (delay_release = 1; 3 slots keep 2 steps of copies ahead). Against a double-precision loop.
pl::Array random_bf16(pl::Shape s, uint32_t seed) { return random_f32(s, seed).astype(pl::bf16); }

void expect_product(const pl::Array& x, const pl::Array& y, const pl::Array& out) {
  const int64_t m = x.shape()[0], k = x.shape()[1], n = y.shape()[1];
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double want = 0;
      for (int64_t q = 0; q < k; ++q) want += x.get({i, q}) * y.get({q, j});
      ASSERT_NEAR(out.get({i, j}), want, 1e-3 * (1 + std::abs(want))) << i << "," << j;
    }
}

TEST_P(Pipeline, DelayedReleaseKeepsAWgmmasSlotsUntilTheNextStep) {
  const pl::Array x = random_bf16({128, 256}, 8), y = random_bf16({256, 128}, 9);
  for (auto [slots, delay] : {std::pair{3, 1}, std::pair{2, 1}, std::pair{2, 0}}) {
    SCOPED_TRACE(std::to_string(slots) + " slots, delay " + std::to_string(delay));
    pl::PallasCall call = plgpu::kernel(
        [slots, delay](pl::Ref x, pl::Ref y, pl::Ref out, pl::Ref acc) {
          acc[pl::all] = pl::zeros({128, 128}, pl::f32);
          plgpu::emit_pipeline(
              [delay, &acc](const std::vector<pl::Value>&, const std::vector<pl::Ref>& b) {
                plgpu::wgmma(acc, b[0], b[1]);
                plgpu::wgmma_wait(delay);
              },
              {.grid = {4},
               .in_specs = {pl::BlockSpec({128, 64}, [](pl::Value k) { return pl::Indices{0, k}; }),
                            pl::BlockSpec({64, 128}, [](pl::Value k) { return pl::Indices{k, 0}; })},
               .max_concurrent_steps = slots,
               .delay_release = delay})({x, y});
          plgpu::wgmma_wait(0);
          out[pl::all] = acc[pl::all];
        },
        {pl::ShapeDtype({128, 128}, pl::f32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"b"}},
        run_on(GetParam(), {plgpu::ACC({128, 128})}));
    expect_product(x, y, call(x, y).at(0));
  }
}

// Fewer steps than slots (the slots shrink to the steps) with delay_release at or past them:
// grids of 1 to 5 steps, 3 slots, delay 2, in both forms.
TEST_P(Pipeline, FewerStepsThanSlotsWithALongDelay) {
  for (int steps : {1, 2, 3, 5}) {
    SCOPED_TRACE(steps);
    const pl::Array x = random_f32({32 * steps, 64}, 12);
    const pl::BlockSpec block({32, 64}, [](pl::Value i) { return pl::Indices{i, 0}; });
    auto body = [](const std::vector<pl::Value>&, const std::vector<pl::Ref>& b) { b[1][pl::all] = b[0][pl::all] * 2.0f; };
    for (bool warp_specialized : {false, true}) {
      pl::PallasCall call = plgpu::kernel(
          [&](pl::Ref x, pl::Ref out) {
            if (warp_specialized)
              plgpu::emit_pipeline_warp_specialized(body, {.grid = {steps}, .in_specs = {block}, .out_specs = {block},
                                                           .max_concurrent_steps = 3, .delay_release = 2, .wg_axis = "wg"})({x, out});
            else
              plgpu::emit_pipeline(body, {.grid = {steps}, .in_specs = {block}, .out_specs = {block}, .max_concurrent_steps = 3,
                                          .delay_release = 2})({x, out});
          },
          {pl::ShapeDtype({32 * steps, 64}, pl::f32)},
          warp_specialized ? plgpu::Mesh{.grid = {1}, .grid_names = {"b"}, .num_threads = 2, .thread_name = "wg"}
                           : plgpu::Mesh{.grid = {1}, .grid_names = {"b"}},
          run_on(GetParam(), {}));
      const pl::Array out = call(x).at(0);
      for (int64_t e = 0; e < x.size(); ++e) ASSERT_EQ(out.data<float>()[e], 2.0f * x.data<float>()[e]) << warp_specialized;
    }
  }
}

// Outputs only (no input copies, no barrier), and two outputs whose blocks change at different
// steps (one every step, one per row of the grid).
TEST_P(Pipeline, OutputsOnlyAndOutputsChangingAtDifferentSteps) {
  pl::PallasCall fill = plgpu::kernel(
      [](pl::Ref out) {
        plgpu::emit_pipeline(
            [](const std::vector<pl::Value>& idx, const std::vector<pl::Ref>& b) {
              b[0][pl::all] = pl::zeros({32, 64}, pl::f32) + idx[0].astype(pl::f32);
            },
            {.grid = {4}, .out_specs = {pl::BlockSpec({32, 64}, [](pl::Value i) { return pl::Indices{i, 0}; })}, .max_concurrent_steps = 2})(
            {out});
      },
      {pl::ShapeDtype({128, 64}, pl::f32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"b"}}, run_on(GetParam(), {}));
  const pl::Array filled = fill().at(0);
  for (int64_t e = 0; e < filled.size(); ++e) ASSERT_EQ(filled.data<float>()[e], static_cast<float>(e / (32 * 64))) << e;

  const pl::Array x = random_f32({64, 384}, 13);
  pl::PallasCall two = plgpu::kernel(
      [](pl::Ref x, pl::Ref plus_one, pl::Ref row_sums) {
        plgpu::emit_pipeline(
            [](const std::vector<pl::Value>& idx, const std::vector<pl::Ref>& b) {
              b[1][pl::all] = b[0][pl::all] + 1.0f;
              pl::when(idx[1] == 0, [&] { b[2][pl::all] = pl::zeros({32, 128}, pl::f32); });
              b[2][pl::all] = b[2][pl::all] + b[0][pl::all];
            },
            {.grid = {2, 3},
             .in_specs = {pl::BlockSpec({32, 128}, [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; })},
             .out_specs = {pl::BlockSpec({32, 128}, [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; }),
                           pl::BlockSpec({32, 128}, [](pl::Value i, pl::Value) { return pl::Indices{i, 0}; })},
             .max_concurrent_steps = 2})({x, plus_one, row_sums});
      },
      {pl::ShapeDtype({64, 384}, pl::f32), pl::ShapeDtype({64, 128}, pl::f32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"b"}},
      run_on(GetParam(), {}));
  const std::vector<pl::Array> outs = two(x);
  for (int64_t e = 0; e < x.size(); ++e) ASSERT_EQ(outs[0].data<float>()[e], x.data<float>()[e] + 1.0f) << e;
  expect_sum_of_column_blocks(x, outs[1]);
}

// Index maps that read a table (SMEM scratch, at the step's index): blocks in reverse order. The
// pipeline calls them with real steps' indices only (at step 0 it compares with the last step's,
// not with step -1's, which would read the table out of bounds).
TEST_P(Pipeline, IndexMapsThatReadATableSeeOnlyRealSteps) {
  const pl::Array x = random_f32({128, 64}, 14);
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref out, pl::Ref table) {
        for (int i = 0; i < 4; ++i) table.store({pl::Index(i)}, 3 - i);
        const pl::BlockSpec reversed({32, 64}, [&](pl::Value i) { return pl::Indices{table.load({pl::Index(i)}), 0}; });
        plgpu::emit_pipeline([](const std::vector<pl::Value>&, const std::vector<pl::Ref>& b) { b[1][pl::all] = b[0][pl::all] * 3.0f; },
                             {.grid = {4}, .in_specs = {reversed}, .out_specs = {reversed}, .max_concurrent_steps = 2})({x, out});
      },
      {pl::ShapeDtype({128, 64}, pl::f32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"b"}},
      run_on(GetParam(), {plgpu::SMEM({4}, pl::i32)}));
  const pl::Array out = call(x).at(0);
  for (int64_t e = 0; e < x.size(); ++e) ASSERT_EQ(out.data<float>()[e], 3.0f * x.data<float>()[e]) << e;
}

// A grid known only when the kernel runs (an i32 read from an operand): the first n of x's row
// blocks are doubled, in both forms, for n below, equal to and above the 2 slots. Rows past the
// n blocks are not written (the output aliases a zero input, so they stay 0).
TEST_P(Pipeline, ADynamicGridRunsTheStepsTheKernelReads) {
  const pl::Array x = random_f32({32 * 5, 64}, 18);
  const pl::BlockSpec block({32, 64}, [](pl::Value i) { return pl::Indices{i, 0}; });
  auto body = [](const std::vector<pl::Value>&, const std::vector<pl::Ref>& b) { b[1][pl::all] = b[0][pl::all] * 2.0f; };
  for (int32_t n : {1, 2, 5})
    for (bool warp_specialized : {false, true}) {
      SCOPED_TRACE(std::to_string(n) + (warp_specialized ? " warp-specialized" : ""));
      pl::CallOptions o = run_on(GetParam(), {});
      o.input_output_aliases = {{2, 0}};
      pl::PallasCall call = plgpu::kernel(
          [&](pl::Ref count, pl::Ref x, pl::Ref, pl::Ref out) {
            const pl::Value steps = count.load({pl::Index(0)});
            if (warp_specialized)
              plgpu::emit_pipeline_warp_specialized(body, {.grid = {steps}, .in_specs = {block}, .out_specs = {block},
                                                           .max_concurrent_steps = 2, .wg_axis = "wg"})({x, out});
            else
              plgpu::emit_pipeline(body, {.grid = {steps}, .in_specs = {block}, .out_specs = {block}, .max_concurrent_steps = 2})(
                  {x, out});
          },
          {pl::ShapeDtype({32 * 5, 64}, pl::f32)},
          warp_specialized ? plgpu::Mesh{.grid = {1}, .grid_names = {"b"}, .num_threads = 2, .thread_name = "wg"}
                           : plgpu::Mesh{.grid = {1}, .grid_names = {"b"}},
          o);
      pl::Array count = pl::Array::zeros({1}, pl::i32);
      count.data<int32_t>()[0] = n;
      const pl::Array out = call(count, x, pl::Array::zeros({32 * 5, 64}, pl::f32)).at(0);
      for (int64_t e = 0; e < x.size(); ++e)
        ASSERT_EQ(out.data<float>()[e], e < n * 32 * 64 ? 2.0f * x.data<float>()[e] : 0.0f) << e;
    }
}

// Warp-specialized: two compute warpgroups, each doubling its half of the rows of every (64, 64)
// block of x into out (a gpu::GMEM output the body writes itself), and a memory warpgroup that
// keeps 2 or 3 slots filled; with and without setmaxnreg.
TEST_P(Pipeline, WarpSpecializedComputeWarpgroupsShareTheMemoryWarpgroupsSlots) {
  const pl::Array x = random_f32({128, 256}, 6);
  for (auto [slots, registers] : {std::pair{2, 0}, std::pair{3, 40}}) {
    SCOPED_TRACE(slots);
    pl::PallasCall call = plgpu::kernel(
        [slots, registers](pl::Ref x, pl::Ref out) {
          plgpu::emit_pipeline_warp_specialized(
              [&](const std::vector<pl::Value>& idx, const std::vector<pl::Ref>& b) {
                const pl::Value wg = plgpu::axis_index("wg");
                const pl::Value rows = idx[0] * 64 + wg * 32, cols = idx[1] * 64;
                b[1].at(pl::ds(rows, 32), pl::ds(cols, 64))[pl::all] = b[0].at(pl::ds(wg * 32, 32), pl::all)[pl::all] * 2.0f;
              },
              {.grid = {2, 4},
               .in_specs = {pl::BlockSpec({64, 64}, [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; })},
               .out_specs = {pl::BlockSpec(plgpu::GMEM)},
               .max_concurrent_steps = slots,
               .wg_axis = "wg",
               .num_compute_wgs = 2,
               .memory_registers = registers})({x, out});
        },
        {pl::ShapeDtype({128, 256}, pl::f32)},
        plgpu::Mesh{.grid = {1}, .grid_names = {"b"}, .num_threads = 3, .thread_name = "wg"}, run_on(GetParam(), {}));
    const pl::Array out = call(x).at(0);
    for (int64_t e = 0; e < 128 * 256; ++e) ASSERT_EQ(out.data<float>()[e], 2.0f * x.data<float>()[e]) << e;
  }
}

// Warp-specialized matmul: two compute warpgroups, each a 64-row half of the 128 x 128 product
// on wgmma into its own accumulator, releasing each step's slots a step late (delay_release 1,
// wgmma_wait(1)); the memory warpgroup keeps 3 slots of x's and y's K blocks.
TEST_P(Pipeline, WarpSpecializedMatmulReleasesSlotsAStepLate) {
  const pl::Array x = random_bf16({128, 256}, 10), y = random_bf16({256, 128}, 11);
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref y, pl::Ref out, pl::Ref acc) {
        const pl::Value wg = plgpu::axis_index("wg");
        pl::when(wg < 2, [&] { acc.at(wg)[pl::all] = pl::zeros({64, 128}, pl::f32); });
        plgpu::emit_pipeline_warp_specialized(
            [&](const std::vector<pl::Value>&, const std::vector<pl::Ref>& b) {
              plgpu::wgmma(acc.at(wg), b[0].at(pl::ds(wg * 64, 64), pl::all), b[1]);
              plgpu::wgmma_wait(1);
            },
            {.grid = {4},
             .in_specs = {pl::BlockSpec({128, 64}, [](pl::Value k) { return pl::Indices{0, k}; }),
                          pl::BlockSpec({64, 128}, [](pl::Value k) { return pl::Indices{k, 0}; })},
             .max_concurrent_steps = 3,
             .delay_release = 1,
             .wg_axis = "wg",
             .num_compute_wgs = 2})({x, y});
        pl::when(wg < 2, [&] { out.at(pl::ds(wg * 64, 64), pl::all)[pl::all] = acc.at(wg)[pl::all]; });
      },
      {pl::ShapeDtype({128, 128}, pl::f32)},
      plgpu::Mesh{.grid = {1}, .grid_names = {"b"}, .num_threads = 3, .thread_name = "wg"},
      run_on(GetParam(), {plgpu::ACC({2, 64, 128})}));
  expect_product(x, y, call(x, y).at(0));
}

// Warp-specialized with a carry (compute_context): each of two compute warpgroups sums its 32
// rows of x's 4 column blocks in a carried tile, which its compute_context stores after run.
TEST_P(Pipeline, WarpSpecializedComputeContextCarriesEachWarpgroupsValues) {
  const pl::Array x = random_f32({64, 256}, 15);
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref out) {
        const pl::Value wg = plgpu::axis_index("wg");
        plgpu::emit_pipeline_warp_specialized(
            [&](const std::vector<pl::Value>&, const std::vector<pl::Ref>& b, const std::vector<pl::Value>& carry) {
              return std::vector<pl::Value>{carry[0] + b[0].at(pl::ds(wg * 32, 32), pl::all)[pl::all]};
            },
            {.grid = {4},
             .in_specs = {pl::BlockSpec({64, 64}, [](pl::Value k) { return pl::Indices{0, k}; })},
             .out_specs = {pl::BlockSpec(plgpu::GMEM)},
             .wg_axis = "wg",
             .num_compute_wgs = 2,
             .compute_context =
                 [&](const auto& run) {
                   const std::vector<pl::Value> sum = run({pl::zeros({32, 64}, pl::f32)});
                   out.at(pl::ds(wg * 32, 32), pl::all)[pl::all] = sum[0];
                 }})({x, out});
      },
      {pl::ShapeDtype({64, 64}, pl::f32)},
      plgpu::Mesh{.grid = {1}, .grid_names = {"b"}, .num_threads = 3, .thread_name = "wg"}, run_on(GetParam(), {}));
  const pl::Array out = call(x).at(0);
  expect_sum_of_column_blocks(x, out);
}

// Manual consumed barriers: each of two compute warpgroups releases x's slot as soon as it has
// read its rows of x, then y's after reading y (the barriers come after the blocks); the memory
// warpgroup refills each input's slot on its own barrier. out = x * y, through GMEM.
TEST_P(Pipeline, WarpSpecializedManualConsumedBarriersReleaseEachInput) {
  const pl::Array x = random_f32({64, 256}, 16), y = random_f32({64, 256}, 17);
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref y, pl::Ref out) {
        const pl::Value wg = plgpu::axis_index("wg");
        const pl::BlockSpec block({64, 64}, [](pl::Value k) { return pl::Indices{0, k}; });
        plgpu::emit_pipeline_warp_specialized(
            [&](const std::vector<pl::Value>& idx, const std::vector<pl::Ref>& b) {
              // b: x's block, y's block, out (GMEM), x's consumed barrier, y's.
              const pl::Value xs = b[0].at(pl::ds(wg * 32, 32), pl::all)[pl::all];
              plgpu::barrier_arrive(b[3]);
              const pl::Value ys = b[1].at(pl::ds(wg * 32, 32), pl::all)[pl::all];
              plgpu::barrier_arrive(b[4]);
              b[2].at(pl::ds(wg * 32, 32), pl::ds(idx[0] * 64, 64))[pl::all] = xs * ys;
            },
            {.grid = {4}, .in_specs = {block, block}, .out_specs = {pl::BlockSpec(plgpu::GMEM)}, .max_concurrent_steps = 2,
             .wg_axis = "wg", .num_compute_wgs = 2, .manual_consumed_barriers = true})({x, y, out});
      },
      {pl::ShapeDtype({64, 256}, pl::f32)},
      plgpu::Mesh{.grid = {1}, .grid_names = {"b"}, .num_threads = 3, .thread_name = "wg"}, run_on(GetParam(), {}));
  const pl::Array out = call(x, y).at(0);
  for (int64_t e = 0; e < x.size(); ++e) ASSERT_EQ(out.data<float>()[e], x.data<float>()[e] * y.data<float>()[e]) << e;
}

// Warp-specialized with one compute warpgroup and an SMEM output that consecutive steps
// accumulate into (a row sum over 3 column blocks, as above).
TEST_P(Pipeline, WarpSpecializedOutputsAccumulateAndAreCopiedOut) {
  const pl::Array x = random_f32({64, 384}, 7);
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref out) {
        plgpu::emit_pipeline_warp_specialized(
            accumulate_over_j,
            {.grid = {2, 3},
             .in_specs = {pl::BlockSpec({32, 128}, [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; })},
             .out_specs = {pl::BlockSpec({32, 128}, [](pl::Value i, pl::Value) { return pl::Indices{i, 0}; })},
             .max_concurrent_steps = 2,
             .wg_axis = "wg"})({x, out});
      },
      {pl::ShapeDtype({64, 128}, pl::f32)},
      plgpu::Mesh{.grid = {1}, .grid_names = {"b"}, .num_threads = 2, .thread_name = "wg"}, run_on(GetParam(), {}));
  const pl::Array out = call(x).at(0);
  expect_sum_of_column_blocks(x, out);
}

// The pipeline's generated unit compiles with NVRTC for sm_90a and sm_80, and its input copies
// and output copies go by the TMA unit on Hopper (UTMALDG / UTMASTG in the SASS): its slots
// are boxes of the arrays.
TEST(PipelineCodegen, CompilesForHopperAndAmpereWithTmaCopies) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref out) {
        const pl::BlockSpec block({32, 64}, [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; });
        plgpu::emit_pipeline([](const std::vector<pl::Value>&, const std::vector<pl::Ref>& b) { b[1][pl::all] = b[0][pl::all] + 1.0f; },
                             {.grid = {4, 4}, .in_specs = {block}, .out_specs = {block}, .max_concurrent_steps = 2})({x, out});
      },
      {pl::ShapeDtype({128, 256}, pl::f32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"b"}}, run_on("mosaic_gpu", {}));
  std::shared_ptr<const pl::TracedCall> tc = call.trace({pl::ShapeDtype({128, 256}, pl::f32)});
  const std::string source =
      plgpu::generate_cuda(*tc, tc->grid_mapping.grid, plgpu::codegen_options(call.impl()->compiler_params)).source;
  if (std::string why = plgpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  for (const char* arch : {"sm_90a", "sm_80"}) EXPECT_NO_THROW(plgpu::Nvrtc::get().compile(source, "pipeline.cu", arch)) << arch;
  if (test_util::find_cuobjdump().empty()) GTEST_SKIP() << "no cuobjdump (run scripts/get_cuda_tools.sh)";
  const std::string sass = test_util::sass_of(source, "sm_90a");
  EXPECT_CONTAINS(sass, "UTMALDG");
  EXPECT_CONTAINS(sass, "UTMASTG");
}

// A dynamic grid's unit too (the prologue is a loop over min(slots, steps)).
TEST(PipelineCodegen, ADynamicGridCompiles) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref count, pl::Ref x, pl::Ref out) {
        const pl::BlockSpec block({32, 64}, [](pl::Value i) { return pl::Indices{i, 0}; });
        plgpu::emit_pipeline([](const std::vector<pl::Value>&, const std::vector<pl::Ref>& b) { b[1][pl::all] = b[0][pl::all] + 1.0f; },
                             {.grid = {count.load({pl::Index(0)})}, .in_specs = {block}, .out_specs = {block},
                              .max_concurrent_steps = 3})({x, out});
      },
      {pl::ShapeDtype({256, 64}, pl::f32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"b"}}, run_on("mosaic_gpu", {}));
  std::shared_ptr<const pl::TracedCall> tc = call.trace({pl::ShapeDtype({1}, pl::i32), pl::ShapeDtype({256, 64}, pl::f32)});
  const std::string source =
      plgpu::generate_cuda(*tc, tc->grid_mapping.grid, plgpu::codegen_options(call.impl()->compiler_params)).source;
  if (std::string why = plgpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  for (const char* arch : {"sm_90a", "sm_80"}) EXPECT_NO_THROW(plgpu::Nvrtc::get().compile(source, "dynamic.cu", arch)) << arch;
}

// The warp-specialized form's unit too, with its register split emitted as setmaxnreg (the
// requests follow from the thread index: USETMAXREG in the SASS).
TEST(PipelineCodegen, WarpSpecializedCompilesWithItsRegisterSplit) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref out) {
        plgpu::emit_pipeline_warp_specialized(
            [](const std::vector<pl::Value>& idx, const std::vector<pl::Ref>& b) {
              const pl::Value rows = idx[0] * 64 + plgpu::axis_index("wg") * 32;
              b[1].at(pl::ds(rows, 32), pl::ds(idx[1] * 64, 64))[pl::all] =
                  b[0].at(pl::ds(plgpu::axis_index("wg") * 32, 32), pl::all)[pl::all] + 1.0f;
            },
            {.grid = {2, 4},
             .in_specs = {pl::BlockSpec({64, 64}, [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; })},
             .out_specs = {pl::BlockSpec(plgpu::GMEM)},
             .wg_axis = "wg",
             .num_compute_wgs = 2,
             .memory_registers = 40})({x, out});
      },
      {pl::ShapeDtype({128, 256}, pl::f32)},
      plgpu::Mesh{.grid = {1}, .grid_names = {"b"}, .num_threads = 3, .thread_name = "wg"}, run_on("mosaic_gpu", {}));
  std::shared_ptr<const pl::TracedCall> tc = call.trace({pl::ShapeDtype({128, 256}, pl::f32)});
  const std::string source =
      plgpu::generate_cuda(*tc, tc->grid_mapping.grid, plgpu::codegen_options(call.impl()->compiler_params)).source;
  EXPECT_CONTAINS(source, "pl_setmaxnreg<40, false>");
  EXPECT_CONTAINS(source, "pl_setmaxnreg<232, true>");  // (512 - 40) / 2, to a multiple of 8
  if (std::string why = plgpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  for (const char* arch : {"sm_90a", "sm_80"}) EXPECT_NO_THROW(plgpu::Nvrtc::get().compile(source, "ws_pipeline.cu", arch)) << arch;
  if (test_util::find_cuobjdump().empty()) GTEST_SKIP() << "no cuobjdump (run scripts/get_cuda_tools.sh)";
  const std::string sass = test_util::sass_of(source, "sm_90a");
  EXPECT_CONTAINS(sass, "USETMAXREG");
  EXPECT_CONTAINS(sass, "UTMALDG");
}

// What emit_pipeline refuses, each at the line that built the pipeline.
TEST(PipelineErrors, BadGridsSpecsAndOperandsNameTheLine) {
  auto error_of = [](const plgpu::PipelineOptions& o, int operands, int line_offset = 0) {
    std::string line;
    std::string e = test_util::error_of([&] {
      pl::PallasCall call = plgpu::kernel(
          [&](pl::Ref x, pl::Ref out) {
            line = "pipeline_test.cpp:" + std::to_string(__LINE__ + 1 + line_offset);
            plgpu::Pipeline p = plgpu::emit_pipeline([](const std::vector<pl::Value>&, const std::vector<pl::Ref>&) {}, o);
            p(operands == 2 ? std::vector<pl::Ref>{x, out} : std::vector<pl::Ref>{x});
          },
          {pl::ShapeDtype({64, 96}, pl::f32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"b"}}, run_on("interpret", {}));
      call(pl::Array::zeros({64, 96}, pl::f32));
    });
    EXPECT_CONTAINS(e, line);
    return e;
  };
  const pl::BlockSpec ok({32, 32}, [](pl::Value i) { return pl::Indices{i, 0}; });
  EXPECT_CONTAINS(error_of({.grid = {0}, .in_specs = {ok}, .out_specs = {ok}}, 2),
                  "emit_pipeline: every grid size must be positive, got [0]");
  EXPECT_CONTAINS(error_of({.grid = {2}, .in_specs = {ok}, .out_specs = {ok}, .max_concurrent_steps = 0}, 2),
                  "max_concurrent_steps must be at least 1, got 0");
  EXPECT_CONTAINS(error_of({.grid = {2}, .in_specs = {ok}, .out_specs = {ok}, .max_concurrent_steps = 2, .delay_release = 2}, 2),
                  "delay_release must be at least 0 and less than max_concurrent_steps (2), got 2");
  const std::string no_init = test_util::error_of([&] {
    plgpu::kernel(
        [](pl::Ref x, pl::Ref out) {
          plgpu::emit_pipeline([](const std::vector<pl::Value>&, const std::vector<pl::Ref>&, const std::vector<pl::Value>& c) { return c; },
                               {.grid = {2}, .in_specs = {pl::BlockSpec(plgpu::GMEM)}, .out_specs = {pl::BlockSpec(plgpu::GMEM)}})(
              {x, out});
        },
        {pl::ShapeDtype({64, 96}, pl::f32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"b"}}, run_on("interpret", {}))(
        pl::Array::zeros({64, 96}, pl::f32));
  });
  EXPECT_CONTAINS(no_init, "emit_pipeline: the body takes a carry but init_carry is empty");
  // Too many slots for a CTA's shared memory (8 x 32 KiB of x, and out's 32 KiB): said in the
  // pipeline's terms, at its line, on the interpreter and when compiling.
  for (const char* backend : {"interpret", "gpu_emulate"}) {
    const int line = __LINE__ + 4;
    const std::string big = test_util::error_of([&] {
      plgpu::kernel(
          [](pl::Ref x, pl::Ref out) {
            plgpu::emit_pipeline([](const std::vector<pl::Value>&, const std::vector<pl::Ref>& b) { b[1][pl::all] = b[0][pl::all]; },
                                 {.grid = {16},
                                  .in_specs = {pl::BlockSpec({128, 64}, [](pl::Value i) { return pl::Indices{i, 0}; })},
                                  .out_specs = {pl::BlockSpec({128, 64}, [](pl::Value i) { return pl::Indices{i, 0}; })},
                                  .max_concurrent_steps = 8})({x, out});
          },
          {pl::ShapeDtype({2048, 64}, pl::f32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"b"}}, run_on(backend, {}))(
          pl::Array::zeros({2048, 64}, pl::f32));
    });
    EXPECT_CONTAINS(big, "emit_pipeline: its SMEM needs 294976 bytes (8 slots of 32768 bytes of input blocks, then the output "
                         "buffers and barriers), more than the 232448 (227 KiB) a CTA may use; lower max_concurrent_steps or the "
                         "block sizes");
    EXPECT_CONTAINS(big, "pipeline_test.cpp:" + std::to_string(line));
  }
  EXPECT_CONTAINS(error_of({.grid = {2}, .in_specs = {ok}, .out_specs = {ok}}, 1),
                  "the pipeline takes 1 inputs and 1 outputs (one per BlockSpec), got 1 operands");
  EXPECT_CONTAINS(error_of({.grid = {2}, .in_specs = {pl::BlockSpec({32, 64}, [](pl::Value i) { return pl::Indices{i, 0}; })},
                            .out_specs = {ok}},
                           2),
                  "not supported yet: input 0's dim 1 (96) is not a multiple of its block size 64: ragged blocks in emit_pipeline");
  EXPECT_CONTAINS(error_of({.grid = {2}, .in_specs = {pl::BlockSpec({pl::Element{32}, 32}, [](pl::Value i) { return pl::Indices{i, 0}; })},
                            .out_specs = {ok}},
                           2),
                  "input 0's block dim 0 is Element(32) in emit_pipeline (it takes Blocked sizes and squeezed dims)");
  EXPECT_CONTAINS(error_of({.grid = {2}, .in_specs = {pl::BlockSpec({32}, [](pl::Value i) { return pl::Indices{i}; })},
                            .out_specs = {ok}},
                           2),
                  "input 0's block shape has 1 dims, its array [64, 96] has 2");
}

// In a pallas_call body (interpreted or compiled) the pipelines say where they belong.
TEST(PipelineErrors, APallasCallBodyIsNotAGpuKernel) {
  for (const char* backend : {"interpret", "mosaic_gpu"}) {
    pl::CallOptions o = run_on(backend, {});
    o.in_specs = {pl::BlockSpec(plgpu::GMEM)};
    o.out_specs = {pl::BlockSpec(plgpu::GMEM)};
    const int line = __LINE__ + 3;
    pl::PallasCall call = pl::pallas_call(
        [](pl::Ref x, pl::Ref out) {
          plgpu::emit_pipeline([](const std::vector<pl::Value>&, const std::vector<pl::Ref>& b) { b[1][pl::all] = b[0][pl::all]; },
                               {.grid = {2},
                                .in_specs = {pl::BlockSpec({32, 64}, [](pl::Value i) { return pl::Indices{i, 0}; })},
                                .out_specs = {pl::BlockSpec({32, 64}, [](pl::Value i) { return pl::Indices{i, 0}; })}})({x, out});
        },
        pl::ShapeDtype({64, 64}, pl::f32), o);
    const std::string e = test_util::error_of([&] { call(pl::Array::zeros({64, 64}, pl::f32)); });
    EXPECT_CONTAINS(e, "emit_pipeline runs in a gpu::kernel's body");
    EXPECT_CONTAINS(e, "pipeline_test.cpp:" + std::to_string(line));
  }
}

TEST(PipelineErrors, WarpSpecializedRefusesSharedOutputsAndOddRegisterCounts) {
  auto error_of = [](int compute, int registers, pl::BlockSpec out_spec) {
    std::string line;
    std::string e = test_util::error_of([&] {
      pl::PallasCall call = plgpu::kernel(
          [&](pl::Ref x, pl::Ref out) {
            line = "pipeline_test.cpp:" + std::to_string(__LINE__ + 1);
            plgpu::WarpSpecializedPipeline p = plgpu::emit_pipeline_warp_specialized(
                [](const std::vector<pl::Value>&, const std::vector<pl::Ref>&) {},
                {.grid = {2},
                 .in_specs = {pl::BlockSpec({32, 96}, [](pl::Value i) { return pl::Indices{i, 0}; })},
                 .out_specs = {out_spec},
                 .wg_axis = "wg",
                 .num_compute_wgs = compute,
                 .memory_registers = registers});
            p({x, out});
          },
          {pl::ShapeDtype({64, 96}, pl::f32)},
          plgpu::Mesh{.grid = {1}, .grid_names = {"b"}, .num_threads = compute + 1, .thread_name = "wg"},
          run_on("interpret", {}));
      call(pl::Array::zeros({64, 96}, pl::f32));
    });
    EXPECT_CONTAINS(e, line);
    return e;
  };
  const pl::BlockSpec smem_out({32, 96}, [](pl::Value i) { return pl::Indices{i, 0}; });
  EXPECT_CONTAINS(error_of(2, 0, smem_out),
                  "not supported yet: emit_pipeline_warp_specialized with SMEM outputs and 2 compute warpgroups");
  EXPECT_CONTAINS(error_of(1, 30, pl::BlockSpec(plgpu::GMEM)),
                  "memory_registers must be 0 (no setmaxnreg) or a multiple of 8 in [24, 256], got 30");
  // The mesh's thread axis must hold the compute warpgroups and the memory one, no more.
  for (auto [threads, message] : {std::pair{2, "the mesh has 2 Pallas threads along 'wg'; the pipeline needs num_compute_wgs + 1 = 3"},
                                  std::pair{4, "the mesh has 4 Pallas threads along 'wg'; the pipeline needs num_compute_wgs + 1 = 3"}}) {
    const std::string e = test_util::error_of([&] {
      plgpu::kernel(
          [](pl::Ref x, pl::Ref out) {
            plgpu::emit_pipeline_warp_specialized(
                [](const std::vector<pl::Value>&, const std::vector<pl::Ref>&) {},
                {.grid = {2}, .in_specs = {pl::BlockSpec({32, 96}, [](pl::Value i) { return pl::Indices{i, 0}; })},
                 .out_specs = {pl::BlockSpec(plgpu::GMEM)}, .wg_axis = "wg", .num_compute_wgs = 2})({x, out});
          },
          {pl::ShapeDtype({64, 96}, pl::f32)},
          plgpu::Mesh{.grid = {1}, .grid_names = {"b"}, .num_threads = threads, .thread_name = "wg"}, run_on("interpret", {}))(
          pl::Array::zeros({64, 96}, pl::f32));
    });
    EXPECT_CONTAINS(e, message);
  }
  const std::string no_axis = test_util::error_of([&] {
    plgpu::kernel(
        [](pl::Ref x, pl::Ref out) {
          plgpu::emit_pipeline_warp_specialized(
              [](const std::vector<pl::Value>&, const std::vector<pl::Ref>&) {},
              {.grid = {2}, .in_specs = {pl::BlockSpec({32, 96}, [](pl::Value i) { return pl::Indices{i, 0}; })},
               .out_specs = {pl::BlockSpec(plgpu::GMEM)}, .wg_axis = "b"})({x, out});
        },
        {pl::ShapeDtype({64, 96}, pl::f32)}, plgpu::Mesh{.grid = {2}, .grid_names = {"b"}}, run_on("interpret", {}))(
        pl::Array::zeros({64, 96}, pl::f32));
  });
  EXPECT_CONTAINS(no_axis, "wg_axis 'b' is not the kernel's thread axis (its mesh has none: give it num_threads and thread_name)");
  // A carry needs a compute_context, which must call run once.
  auto carry_error = [](int runs, bool context) {
    return test_util::error_of([&] {
      plgpu::kernel(
          [&](pl::Ref x, pl::Ref out) {
            plgpu::WarpSpecializedPipelineOptions o{
                .grid = {2}, .in_specs = {pl::BlockSpec({32, 96}, [](pl::Value i) { return pl::Indices{i, 0}; })},
                .out_specs = {pl::BlockSpec(plgpu::GMEM)}, .wg_axis = "wg"};
            if (context)
              o.compute_context = [&](const auto& run) {
                for (int r = 0; r < runs; ++r) run({pl::full({}, pl::f32, 0.0f)});
              };
            plgpu::emit_pipeline_warp_specialized(
                [](const std::vector<pl::Value>&, const std::vector<pl::Ref>&, const std::vector<pl::Value>& c) { return c; },
                o)({x, out});
          },
          {pl::ShapeDtype({64, 96}, pl::f32)},
          plgpu::Mesh{.grid = {1}, .grid_names = {"b"}, .num_threads = 2, .thread_name = "wg"}, run_on("interpret", {}))(
          pl::Array::zeros({64, 96}, pl::f32));
    });
  };
  EXPECT_CONTAINS(carry_error(1, false), "the body takes a carry, which needs a compute_context");
  EXPECT_CONTAINS(carry_error(0, true), "compute_context never called run");
  EXPECT_CONTAINS(carry_error(2, true), "compute_context called run more than once");
  // A run kept past compute_context (it refers to the pipeline's scope) refuses to run.
  const std::string late = test_util::error_of([&] {
    plgpu::kernel(
        [&](pl::Ref x, pl::Ref out) {
          std::function<std::vector<pl::Value>(const std::vector<pl::Value>&)> kept;
          plgpu::emit_pipeline_warp_specialized(
              [](const std::vector<pl::Value>&, const std::vector<pl::Ref>&, const std::vector<pl::Value>& c) { return c; },
              {.grid = {2}, .in_specs = {pl::BlockSpec({32, 96}, [](pl::Value i) { return pl::Indices{i, 0}; })},
               .out_specs = {pl::BlockSpec(plgpu::GMEM)}, .wg_axis = "wg",
               .compute_context = [&](const auto& run) {
                 run({pl::full({}, pl::f32, 0.0f)});
                 kept = run;
               }})({x, out});
          kept({pl::full({}, pl::f32, 0.0f)});
        },
        {pl::ShapeDtype({64, 96}, pl::f32)},
        plgpu::Mesh{.grid = {1}, .grid_names = {"b"}, .num_threads = 2, .thread_name = "wg"}, run_on("interpret", {}))(
        pl::Array::zeros({64, 96}, pl::f32));
  });
  EXPECT_CONTAINS(late, "run called after compute_context returned");
}

}  // namespace
