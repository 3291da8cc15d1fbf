// estimate_cost against hand counts. Each expected value is written as arithmetic on the
// problem's sizes, with a comment deriving it from the kernel (the counting rules are in
// docs/TRANSFORMS.md). On a mismatch the kernel IR is printed, to see what was counted.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "tests/test_util.h"
#include "examples/examples.h"
#include "pallas/pallas.h"
#include "pallas/sparse_core.h"
#include "pallas/tpu.h"
#include "transforms/cost_estimate.h"

namespace pl = pallas;
namespace pltpu = pallas::tpu;
namespace ex = pallas::examples;

namespace {

constexpr int64_t F32 = 4, BF16 = 2;  // bytes per element

std::string kernel_ir(const pl::PallasCall& call, const std::vector<pl::ShapeDtype>& shapes) {
  return pl::ir::print(call.trace(shapes)->kernel);
}

std::vector<pl::ShapeDtype> shapes_of(const std::vector<pl::Array>& args) {
  std::vector<pl::ShapeDtype> s;
  for (const pl::Array& a : args) s.push_back(a.shape_dtype());
  return s;
}

#define EXPECT_COST(actual, expected, ir)                                                      \
  do {                                                                                         \
    const pl::CostEstimate a_ = (actual), e_ = (expected);                                     \
    EXPECT_EQ(a_.flops, e_.flops) << (ir);                                                     \
    EXPECT_EQ(a_.transcendentals, e_.transcendentals) << (ir);                                 \
    EXPECT_EQ(a_.bytes_accessed, e_.bytes_accessed) << (ir);                                   \
    EXPECT_EQ(a_.remote_bytes_transferred, e_.remote_bytes_transferred) << (ir);               \
  } while (0)

using test_util::error_of;

pl::Array iota_f32(pl::Shape s) { return pl::Array::iota(std::move(s), pl::f32); }

}  // namespace

// ---- The bundled examples -------------------------------------------------------------------------

TEST(CostEstimate, MatmulExampleMatchesHandCount) {
  ex::Problem p = ex::find("matmul").build({.size = 384});
  const int64_t n = 384, b = 128, g = n / b;  // grid (g, g, g), k fastest
  const int64_t points = g * g * g;
  // Per grid point: `program_id(2) == 0` (1 compare); the init branch stores a constant (0);
  // dot of (b, b) @ (b, b): 2*b*b*b; `acc += ...`: b*b adds; `num_programs(2) - 1` is folded
  // (a trace-time constant) and `program_id(2) == it` is 1 compare; the copy-out branch 0.
  const int64_t flops = points * (2 * b * b * b + b * b + 2);
  // x's block (i, k) and y's block (k, j) change at every point (k is the fastest axis); z's
  // block (i, j) changes g*g times (once per (i, j), after its k steps). The f32 scratch
  // accumulator is VMEM and costs nothing.
  const int64_t bytes = points * b * b * F32 + points * b * b * F32 + g * g * b * b * F32;
  const std::string ir = kernel_ir(p.call, p.arg_shapes());
  EXPECT_COST(pl::estimate_cost(p.call, p.inputs), (pl::CostEstimate{flops, 0, bytes, 0}), ir);
  // From shapes alone: the same.
  EXPECT_COST(pl::estimate_cost(p.call, p.arg_shapes()), (pl::CostEstimate{flops, 0, bytes, 0}), ir);
}

TEST(CostEstimate, MatmulExampleBf16InputsHalveTheInputBytes) {
  ex::Problem p = ex::find("matmul").build({.size = 256, .dtype = pl::bf16});
  const int64_t n = 256, b = 128, g = n / b, points = g * g * g;
  // The output is f32 whatever the inputs; the inputs' blocks are bf16.
  const int64_t bytes = 2 * points * b * b * BF16 + g * g * b * b * F32;
  const pl::CostEstimate c = pl::estimate_cost(p.call, p.inputs);
  EXPECT_EQ(c.bytes_accessed, bytes) << kernel_ir(p.call, p.arg_shapes());
  // bf16 x bf16 with an f32 result still counts 2*M*N*K (plus the same adds and compares).
  EXPECT_EQ(c.flops, points * (2 * b * b * b + b * b + 2)) << kernel_ir(p.call, p.arg_shapes());
}

TEST(CostEstimate, SoftmaxExampleMatchesHandCount) {
  ex::Problem p = ex::find("softmax").build({.size = 64});
  const int64_t rows = 64, R = 8, C = 256, points = rows / R;  // grid (8,), blocks (8, 256)
  // Per point: reduce_max over rows (R*C - R compares), v - m (R*C), exp (R*C
  // transcendentals), reduce_sum (R*C - R adds), e / s (R*C); expand_dims and broadcasts 0.
  const int64_t flops = points * ((R * C - R) + R * C + (R * C - R) + R * C);
  const int64_t transcendentals = points * R * C;
  // The input block and the output block change at every point: each array once.
  const int64_t bytes = 2 * rows * C * F32;
  EXPECT_COST(pl::estimate_cost(p.call, p.inputs), (pl::CostEstimate{flops, transcendentals, bytes, 0}),
              kernel_ir(p.call, p.arg_shapes()));
}

TEST(CostEstimate, SoftmaxExampleWithPaddedLastBlockAndBf16) {
  // 20 rows in blocks of 8: grid (3,), the last block padded. The pipeline moves whole blocks,
  // so 3 blocks each way; the kernel computes on whole blocks too. bf16 in and out: the two
  // converts (to f32 and back) cost nothing.
  ex::Problem p = ex::find("softmax").build({.size = 20, .dtype = pl::bf16});
  const int64_t R = 8, C = 256, points = 3;
  const int64_t flops = points * (4 * R * C - 2 * R);
  const int64_t bytes = 2 * points * R * C * BF16;
  EXPECT_COST(pl::estimate_cost(p.call, p.inputs), (pl::CostEstimate{flops, points * R * C, bytes, 0}),
              kernel_ir(p.call, p.arg_shapes()));
}

TEST(CostEstimate, LayerNormExampleMatchesHandCount) {
  ex::Problem p = ex::find("layer_norm").build({.size = 64});
  const int64_t rows = 64, R = 8, C = 256, points = rows / R;
  // Per point: sum(x) R*C - R; * inv_n R; x - mean R*C; c * c R*C; sum R*C - R; * inv_n R;
  // + eps R; rsqrt R transcendentals; c * rstd R*C; * gamma R*C; + beta R*C.
  const int64_t flops = points * ((R * C - R) + R + R * C + R * C + (R * C - R) + R + R +
                                  R * C + R * C + R * C);
  EXPECT_EQ(flops, points * (7 * R * C + R));  // the same, summed
  const int64_t transcendentals = points * R;
  // x's blocks and the output's blocks: each array once. gamma and beta are whole-array blocks
  // with a constant index: copied in once, not once per point.
  const int64_t bytes = 2 * rows * C * F32 + 2 * C * F32;
  EXPECT_COST(pl::estimate_cost(p.call, p.inputs), (pl::CostEstimate{flops, transcendentals, bytes, 0}),
              kernel_ir(p.call, p.arg_shapes()));
}

TEST(CostEstimate, EveryOpHasACostRule) {
  // Walk ops.def: a new op must get a rule (cost_rule in src/transforms/cost_estimate.cpp).
  for (int c = 0; c < pl::ir::kNumOpCodes; ++c) {
    auto code = static_cast<pl::ir::OpCode>(c);
    EXPECT_NE(pl::cost_rule(code), pl::CostRule::Missing) << pl::ir::op_info(code).name;
  }
  EXPECT_EQ(pl::cost_rule(pl::ir::OpCode::Exp), pl::CostRule::Transcendental);
  EXPECT_EQ(pl::cost_rule(pl::ir::OpCode::Reciprocal), pl::CostRule::PerElement);
  EXPECT_EQ(pl::cost_rule(pl::ir::OpCode::Select), pl::CostRule::PerElement);
  EXPECT_EQ(pl::cost_rule(pl::ir::OpCode::Convert), pl::CostRule::Free);
  EXPECT_EQ(pl::cost_rule(pl::ir::OpCode::Transpose), pl::CostRule::Free);
}

// ---- Synthetic kernels ------------------------------------------------------------------------------

TEST(CostEstimate, ElementwiseAddOnAGridReadsAndWritesEachArrayOnce) {
  const int64_t M = 16, N = 256;
  auto spec = pl::BlockSpec({8, 128}, [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; });
  auto call = pl::pallas_call([](pl::Ref x, pl::Ref y, pl::Ref o) { o[pl::all] = x[pl::all] + y[pl::all]; },
                              pl::ShapeDtype({M, N}, pl::f32),
                              {.grid = {M / 8, N / 128}, .in_specs = {spec, spec}, .out_specs = {spec},
                               .interpret = true});
  // One add per element of the output; x, y and o each move once.
  const pl::CostEstimate expected{M * N, 0, 3 * M * N * F32, 0};
  pl::Array x = iota_f32({M, N}), y = iota_f32({M, N});
  EXPECT_COST(pl::estimate_cost(call, x, y), expected, kernel_ir(call, {x.shape_dtype(), y.shape_dtype()}));
  EXPECT_COST(pl::estimate_cost(call, x.shape_dtype(), y.shape_dtype()), expected, "");
}

TEST(CostEstimate, BlockUnchangedAlongTheInnerAxisIsCopiedOncePerChange) {
  // Grid (4, 3), j fastest. x's block depends on i only: it changes 4 times, not 12. y's block
  // depends on j only: it changes at every point (j cycles 0, 1, 2, 0, ...), 12 times, though
  // there are only 3 distinct blocks. o's block (i, j): 12 times.
  const int64_t GI = 4, GJ = 3, B = 8 * 128;
  auto call = pl::pallas_call(
      [](pl::Ref x, pl::Ref y, pl::Ref o) { o[pl::all] = x[pl::all] * y[pl::all]; },
      pl::ShapeDtype({GI * 8, GJ * 128}, pl::f32),
      {.grid = {GI, GJ},
       .in_specs = {pl::BlockSpec({8, 128}, [](pl::Value i, pl::Value) { return pl::Indices{i, 0}; }),
                    pl::BlockSpec({8, 128}, [](pl::Value, pl::Value j) { return pl::Indices{0, j}; })},
       .out_specs = {pl::BlockSpec({8, 128}, [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; })},
       .interpret = true});
  std::vector<pl::ShapeDtype> shapes = {{{GI * 8, 128}, pl::f32}, {{8, GJ * 128}, pl::f32}};
  const int64_t bytes = GI * B * F32 + GI * GJ * B * F32 + GI * GJ * B * F32;
  EXPECT_COST(pl::estimate_cost(call, shapes), (pl::CostEstimate{GI * GJ * B, 0, bytes, 0}),
              kernel_ir(call, shapes));
}

TEST(CostEstimate, StaticForLoopMultipliesItsBody) {
  const int64_t S = 8 * 128;
  auto call = pl::pallas_call(
      [](pl::Ref x, pl::Ref o) {
        // 5 trips of a multiply and an add per element.
        o[pl::all] = pl::fori_loop(0, 5, x[pl::all], [](pl::Value, pl::Value c) { return c * 2.0f + 1.0f; });
        // pl::loop with a step: trips = cdiv(10 - 0, 3) = 4, folded at trace time (free); each
        // trip computes its index lo + t * 3 (a scalar multiply and add: 2 flops) and one add
        // per element.
        pl::loop(0, 10, [&](pl::Value) { o[pl::all] = o[pl::all] + 1.0f; }, 3);
        // Nested static loops: 2 * 3 trips of one subtract per element.
        pl::fori_loop(0, 2, [&](pl::Value) {
          pl::fori_loop(1, 4, [&](pl::Value) { o[pl::all] = o[pl::all] - 1.0f; });
        });
      },
      pl::ShapeDtype({8, 128}, pl::f32), {.interpret = true});
  std::vector<pl::ShapeDtype> shapes = {{{8, 128}, pl::f32}};
  const int64_t flops = 5 * 2 * S + 4 * (2 + S) + 2 * 3 * S;
  // No grid: one point; x in and o out once.
  EXPECT_COST(pl::estimate_cost(call, shapes), (pl::CostEstimate{flops, 0, 2 * S * F32, 0}),
              kernel_ir(call, shapes));
}

TEST(CostEstimate, DynamicLoopsAndWhileCountOneTrip) {
  const int64_t S = 128;
  auto call = pl::pallas_call(
      [](pl::Ref x, pl::Ref o) {
        // Bounds depend on the grid point: one trip is counted (one add per element).
        pl::Value v = pl::fori_loop(0, pl::program_id(0), x[pl::all],
                                    [](pl::Value, pl::Value c) { return c + 1.0f; });
        // A while loop: its condition once (1 compare) and its body once (1 add).
        pl::Value n = pl::while_loop(pl::Operand(0), [](pl::Value i) { return i < 7; },
                                     [](pl::Value i) { return i + 1; });
        o[pl::all] = v * n.astype(pl::f32);  // convert: 0; multiply: S
      },
      pl::ShapeDtype({S}, pl::f32),
      {.grid = {3},
       .in_specs = {pl::BlockSpec({S}, [](pl::Value) { return pl::Indices{0}; })},
       .out_specs = {pl::BlockSpec({S}, [](pl::Value) { return pl::Indices{0}; })},
       .interpret = true});
  std::vector<pl::ShapeDtype> shapes = {{{S}, pl::f32}};
  const int64_t points = 3;
  // Both blocks keep index 0: x is read once and o written once.
  EXPECT_COST(pl::estimate_cost(call, shapes),
              (pl::CostEstimate{points * (S + 1 + 1 + S), 0, 2 * S * F32, 0}), kernel_ir(call, shapes));
}

TEST(CostEstimate, TranscendentalsCountSeparately) {
  const int64_t S = 8 * 128;
  auto call = pl::pallas_call(
      [](pl::Ref x, pl::Ref o) { o[pl::all] = pl::tanh(x[pl::all]) + pl::exp(x[pl::all]); },
      pl::ShapeDtype({16, 128}, pl::f32),
      {.grid = {2},
       .in_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })},
       .out_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })},
       .interpret = true});
  std::vector<pl::ShapeDtype> shapes = {{{16, 128}, pl::f32}};
  // Per point: tanh and exp S transcendentals each, the add S flops.
  EXPECT_COST(pl::estimate_cost(call, shapes), (pl::CostEstimate{2 * S, 2 * 2 * S, 2 * 2 * S * F32, 0}),
              kernel_ir(call, shapes));
}

TEST(CostEstimate, CondTakesTheBranchMaximumUnlessThePredicateIsKnown) {
  const int64_t S = 128;
  auto call = pl::pallas_call(
      [](pl::Ref x, pl::Ref o) {
        pl::Value v = x[pl::all];
        // Unknown at trace time: 1 compare, then per field the maximum of the branches:
        // flops max(0, 2S) = 2S, transcendentals max(S, 0) = S.
        o[pl::all] = pl::cond(pl::program_id(0) == 0, [&] { return pl::exp(v); }, [&] { return v * v + v; });
        // Known at trace time (num_programs(0) == 2 > 1, folded): only the taken branch, S.
        pl::when(pl::num_programs(0) > 1, [&] { o[pl::all] = o[pl::all] * 3.0f; });
        pl::when(pl::num_programs(0) > 5, [&] { o[pl::all] = pl::exp(o[pl::all]) * 3.0f; });
      },
      pl::ShapeDtype({S}, pl::f32),
      {.grid = {2},
       .in_specs = {pl::BlockSpec({S}, [](pl::Value) { return pl::Indices{0}; })},
       .out_specs = {pl::BlockSpec({S}, [](pl::Value) { return pl::Indices{0}; })},
       .interpret = true});
  std::vector<pl::ShapeDtype> shapes = {{{S}, pl::f32}};
  EXPECT_COST(pl::estimate_cost(call, shapes),
              (pl::CostEstimate{2 * (1 + 2 * S + S), 2 * S, 2 * S * F32, 0}), kernel_ir(call, shapes));
}

TEST(CostEstimate, DotGeneralWithBatchAndReductionsAndScans) {
  auto call = pl::pallas_call(
      [](pl::Ref a, pl::Ref b, pl::Ref o, pl::Ref s) {
        // (4, 8, 16) x (4, 16, 32) -> (4, 8, 32), batch 4, K 16: 2 * 4 * 8 * 32 * 16.
        pl::Value d = pl::dot_general(a[pl::all], b[pl::all],
                                      {.lhs_contracting = {2}, .rhs_contracting = {1}, .lhs_batch = {0}, .rhs_batch = {0}});
        o[pl::all] = d;
        // reduce over axis 2 of (4, 8, 32): 4*8*32 - 4*8; cumsum over (4, 8): 4*8.
        s[pl::all] = pl::cumsum(pl::sum(d, {2}), 1);
      },
      std::vector<pl::ShapeDtype>{{{4, 8, 32}, pl::f32}, {{4, 8}, pl::f32}}, {.interpret = true});
  std::vector<pl::ShapeDtype> shapes = {{{4, 8, 16}, pl::f32}, {{4, 16, 32}, pl::f32}};
  const int64_t flops = 2 * 4 * 8 * 32 * 16 + (4 * 8 * 32 - 4 * 8) + 4 * 8;
  const int64_t bytes = (4 * 8 * 16 + 4 * 16 * 32 + 4 * 8 * 32 + 4 * 8) * F32;
  EXPECT_COST(pl::estimate_cost(call, shapes), (pl::CostEstimate{flops, 0, bytes, 0}), kernel_ir(call, shapes));
}

TEST(CostEstimate, LocalDmaFromAnyCountsItsHbmSide) {
  // The DESIGN sketch: x stays in HBM (ANY); each point DMAs its 8 rows into a VMEM scratch.
  const int64_t S = 8 * 128, G = 4;
  auto call = pl::pallas_call(
      [](pl::Ref x_hbm, pl::Ref o, pl::Ref buf, pl::Ref sem) {
        auto copy = pltpu::make_async_copy(x_hbm.at(pl::ds(pl::program_id(0) * 8, 8)), buf, sem);
        copy.start();
        copy.wait();
        o[pl::all] = buf[pl::all] * 2.0f;
      },
      pl::ShapeDtype({G * 8, 128}, pl::f32),
      {.grid = {G},
       .in_specs = {pl::BlockSpec(pltpu::ANY)},
       .out_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })},
       .scratch_shapes = {pltpu::VMEM({8, 128}, pl::f32), pltpu::semaphores(pltpu::SemaphoreType::DMA)},
       .interpret = pltpu::InterpretParams{}});
  std::vector<pl::ShapeDtype> shapes = {{{G * 8, 128}, pl::f32}};
  // Per point: program_id * 8 (1 scalar multiply) and buf * 2 (S); the DMA reads S elements of
  // HBM (its VMEM side is on-chip). The output's blocks are pipelined: G blocks of S.
  EXPECT_COST(pl::estimate_cost(call, shapes),
              (pl::CostEstimate{G * (1 + S), 0, G * S * F32 + G * S * F32, 0}), kernel_ir(call, shapes));
}

TEST(CostEstimate, IndirectDmasCountTheRowsTheyMove) {
  // On 2 x 2 subcores, each gathers 8 of the table's 1000 rows (8 x 16 f32) into VMEM and
  // scatter-adds them back: HBM bytes are the 8 rows read, then read and written by the add.
  const int64_t R = 8 * 16;
  auto call = pallas::tpu_sc::kernel(
      [](pl::Ref table, pl::Ref idx, pl::Ref rows, pl::Ref sem) {
        auto g = pltpu::make_async_copy(table.at(idx), rows, sem.at(0));
        g.start();
        g.wait();
        auto s = pltpu::make_async_copy(rows, table.at(idx), sem.at(1), {.add = true});
        s.start();
        s.wait();
      },
      {}, pallas::tpu_sc::VectorSubcoreMesh{.num_cores = 2, .num_subcores = 2},
      {.scratch_shapes = {pltpu::VMEM({8}, pl::i32), pltpu::VMEM({8, 16}, pl::f32),
                          pltpu::semaphores(pltpu::SemaphoreType::DMA, {2})}});
  std::vector<pl::ShapeDtype> shapes = {{{1000, 16}, pl::f32}};
  EXPECT_COST(pl::estimate_cost(call, shapes), (pl::CostEstimate{4 * R, 0, 4 * 3 * R * F32, 0}),
              kernel_ir(call, shapes));
}

TEST(CostEstimate, RemoteDmaCountsRemoteBytes) {
  // As the TPU tests' swap between two devices: x (ANY) is sent to the other device's o (ANY).
  auto call = pl::pallas_call(
      [](pl::Ref x, pl::Ref o, pl::Ref send, pl::Ref recv) {
        auto c = pltpu::make_async_remote_copy(x, o, send, recv, pltpu::DeviceId(1));
        c.start();
        c.wait_send();
        c.wait_recv();
      },
      pl::ShapeDtype({8, 128}, pl::f32),
      {.in_specs = {pl::BlockSpec(pltpu::ANY)},
       .out_specs = {pl::BlockSpec(pltpu::ANY)},
       .scratch_shapes = {pltpu::semaphores(pltpu::SemaphoreType::DMA),
                          pltpu::semaphores(pltpu::SemaphoreType::DMA)},
       .interpret = pltpu::InterpretParams{}});
  std::vector<pl::ShapeDtype> shapes = {{{8, 128}, pl::f32}};
  const int64_t bytes = 8 * 128 * F32;
  // The copy sends `bytes` to the other device and reads them from this device's HBM; its write
  // lands in the other device's memory, so it is not this device's bytes_accessed.
  EXPECT_COST(pl::estimate_cost(call, shapes), (pl::CostEstimate{0, 0, bytes, bytes}), kernel_ir(call, shapes));
}

TEST(CostEstimate, DynamicGridSizesComeFirstAsWithTheCall) {
  const int64_t S = 128;
  auto call = pl::pallas_call(
      [](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all] + 1.0f; }, pl::ShapeDtype({5 * S}, pl::f32),
      {.grid = {pl::dynamic},
       .in_specs = {pl::BlockSpec({S}, [](pl::Value i) { return pl::Indices{i}; })},
       .out_specs = {pl::BlockSpec({S}, [](pl::Value i) { return pl::Indices{i}; })},
       .interpret = true});
  pl::Array x = iota_f32({5 * S});
  // 3 of the 5 blocks: 3 points of S adds, 3 blocks in and 3 out.
  const pl::CostEstimate expected{3 * S, 0, 2 * 3 * S * F32, 0};
  EXPECT_COST(pl::estimate_cost(call, pl::Array::full({}, pl::i32, 3), x), expected, "");
  EXPECT_COST(pl::estimate_cost(call, {x.shape_dtype()}, {3}), expected, "");
  // Sizes missing: the call's own error, and estimate_cost's for shapes.
  EXPECT_EQ(error_of([&] { pl::estimate_cost(call, x); }), error_of([&] { call(x); }));
  EXPECT_NE(error_of([&] { pl::estimate_cost(call, {x.shape_dtype()}); }).find("dynamic_grid_sizes"),
            std::string::npos);
}

TEST(CostEstimate, ScalarPrefetchIndexMapsUseTheValuesWhenGiven) {
  // Block of x chosen by a prefetched table: {0, 0, 1, 1} changes twice over 4 points.
  const int64_t S = 128;
  auto call = pl::pallas_call(
      [](pl::Ref, pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all]; }, pl::ShapeDtype({4 * S}, pl::f32),
      {.grid_spec = pl::PrefetchScalarGridSpec(
           1, {4}, {pl::BlockSpec({S}, [](pl::Value i, pl::Ref table) { return pl::Indices{table[i]}; })},
           {pl::BlockSpec({S}, [](pl::Value i, pl::Ref) { return pl::Indices{i}; })}),
       .interpret = true});
  pl::Array table = pl::Array::from_values({4}, pl::i32, {0, 0, 1, 1});
  pl::Array x = iota_f32({2 * S});
  const int64_t table_bytes = 4 * 4;  // copied to SMEM once
  EXPECT_COST(pl::estimate_cost(call, table, x),
              (pl::CostEstimate{0, 0, table_bytes + 2 * S * F32 + 4 * S * F32, 0}), "");
  // Without the values, x's block counts as changing at every point.
  EXPECT_COST(pl::estimate_cost(call, table.shape_dtype(), x.shape_dtype()),
              (pl::CostEstimate{0, 0, table_bytes + 4 * S * F32 + 4 * S * F32, 0}), "");
}

TEST(CostEstimate, LargeGridsAreCountedWithoutWalkingThem) {
  // 2048 x 1024 points, beyond the walk (about a million points). Index maps that forward grid
  // indices are still exact: x's block (i, 0) changes 2048 times, o's (i, j) at every point; a
  // computed index (y's i / 2) counts every point.
  const int64_t GI = 2048, GJ = 1024, B = 128;
  auto call = pl::pallas_call(
      [](pl::Ref x, pl::Ref y, pl::Ref o) { o[pl::all] = x[pl::all] + y[pl::all]; },
      pl::ShapeDtype({GI, GJ * B}, pl::f32),
      {.grid = {GI, GJ},
       .in_specs = {pl::BlockSpec({1, B}, [](pl::Value i, pl::Value) { return pl::Indices{i, 0}; }),
                    pl::BlockSpec({1, B}, [](pl::Value i, pl::Value) { return pl::Indices{i / 2, 0}; })},
       .out_specs = {pl::BlockSpec({1, B}, [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; })},
       .interpret = true});
  std::vector<pl::ShapeDtype> shapes = {{{GI, B}, pl::f32}, {{GI / 2, B}, pl::f32}};
  const int64_t points = GI * GJ;
  EXPECT_COST(pl::estimate_cost(call, shapes),
              (pl::CostEstimate{points * B, 0, (GI + points + points) * B * F32, 0}), "");
}

TEST(CostEstimate, UserGivenEstimateIsNotUsed) {
  auto call = pl::pallas_call([](pl::Ref x, pl::Ref o) { o[pl::all] = -x[pl::all]; },
                              pl::ShapeDtype({128}, pl::f32),
                              {.interpret = true, .cost_estimate = pl::CostEstimate{1, 2, 3, 4}});
  EXPECT_COST(pl::estimate_cost(call, pl::ShapeDtype({128}, pl::f32)),
              (pl::CostEstimate{128, 0, 2 * 128 * F32, 0}), "");
  EXPECT_EQ(pl::estimate_cost(call, pl::ShapeDtype({128}, pl::f32)).to_json(),
            "{\"flops\": 128, \"transcendentals\": 0, \"bytes_accessed\": 1024, "
            "\"remote_bytes_transferred\": 0}");
}

TEST(CostEstimate, EmptyGridCostsNothing) {
  auto call = pl::pallas_call([](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all] * 2.0f; },
                              pl::ShapeDtype({0, 128}, pl::f32),
                              {.grid = {0},
                               .in_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })},
                               .out_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })},
                               .interpret = true});
  EXPECT_EQ(pl::estimate_cost(call, pl::ShapeDtype({0, 128}, pl::f32)), pl::CostEstimate{});
}

// ---- Bad input: the call's own errors -------------------------------------------------------------

TEST(CostEstimate, WrongArgumentCountGivesTheCallsError) {
  ex::Problem p = ex::find("layer_norm").build({.size = 16});
  std::vector<pl::Array> too_few(p.inputs.begin(), p.inputs.begin() + 2);
  const std::string expected = error_of([&] { p.call(too_few); });
  ASSERT_NE(expected, "");
  EXPECT_EQ(error_of([&] { pl::estimate_cost(p.call, too_few); }), expected);
  EXPECT_EQ(error_of([&] { pl::estimate_cost(p.call, shapes_of(too_few)); }), expected);
}

TEST(CostEstimate, WrongShapeGivesTheCallsError) {
  // Built for 64 rows (grid (8,)), given 32: the call fails at grid point (4,) with the
  // out-of-bounds block error; estimate_cost walks the grid and says the same.
  ex::Problem p = ex::find("softmax").build({.size = 64});
  pl::Array small = pl::Array::zeros({32, 256}, pl::f32);
  const std::string expected = error_of([&] { p.call(small); });
  ASSERT_NE(expected.find("Out-of-bounds block index"), std::string::npos) << expected;
  EXPECT_EQ(error_of([&] { pl::estimate_cost(p.call, small); }), expected);
  // A wrong rank fails when tracing, the same way.
  pl::Array flat = pl::Array::zeros({64 * 256}, pl::f32);
  const std::string rank_error = error_of([&] { p.call(flat); });
  ASSERT_NE(rank_error, "");
  EXPECT_EQ(error_of([&] { pl::estimate_cost(p.call, flat); }), rank_error);
}

TEST(CostEstimate, DocumentationExample) {
  // docs/TRANSFORMS.md's example, kept honest.
  auto call = pl::pallas_call(
      [](pl::Ref x, pl::Ref o) { o[pl::all] = pl::exp(x[pl::all]) * 2.0f; },
      pl::ShapeDtype({64, 256}, pl::f32),
      {.grid = {8},
       .in_specs = {pl::BlockSpec({8, 256}, [](pl::Value i) { return pl::Indices{i, 0}; })},
       .out_specs = {pl::BlockSpec({8, 256}, [](pl::Value i) { return pl::Indices{i, 0}; })},
       .interpret = true});
  pl::Array x = pl::Array::zeros({64, 256}, pl::f32);
  pl::CostEstimate c = pl::estimate_cost(call, x);
  EXPECT_EQ(c, pl::estimate_cost(call, x.shape_dtype()));
  EXPECT_EQ(c, (pl::CostEstimate{8 * 2048, 8 * 2048, 2 * 64 * 256 * 4, 0}));
  EXPECT_EQ(c.to_json(), "{\"flops\": 16384, \"transcendentals\": 16384, \"bytes_accessed\": 131072, "
                         "\"remote_bytes_transferred\": 0}");
}

TEST(CostEstimate, IntegerPowAndSort) {
  auto call = pl::pallas_call(
      [](pl::Ref x, pl::Ref o, pl::Ref s) {
        // x^3: 2 multiplies; x^8: 3 (squarings); x^-2: 1 multiply and 1 division; x^1: 0. Then
        // the 3 adds.
        pl::Value v = x[pl::all];
        o[pl::all] = pl::integer_pow(v, 3) + pl::integer_pow(v, 8) + pl::integer_pow(v, -2) +
                     pl::integer_pow(v, 1);
        // Sorting 4 rows of 8: 4 * 8 * log2(8) comparisons.
        s[pl::all] = pl::sort(v);
      },
      std::vector<pl::ShapeDtype>{{{4, 8}, pl::f32}, {{4, 8}, pl::f32}}, {.interpret = true});
  std::vector<pl::ShapeDtype> shapes = {{{4, 8}, pl::f32}};
  const int64_t S = 4 * 8;
  EXPECT_COST(pl::estimate_cost(call, shapes),
              (pl::CostEstimate{S * (2 + 3 + 2 + 0) + 3 * S + 4 * 8 * 3, 0, 3 * S * F32, 0}),
              kernel_ir(call, shapes));
}
