// The examples that need the TPU interpret mode: the collectives on 2, 4 and 8 simulated devices
// and the core_map pipeline on 2 and 4 cores, in both DMA modes with race detection on (they
// must pass and race-free); dma_matmul; the deliberately broken `racy` and `deadlock`; and the
// usage errors of the TPU-only options.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <tuple>

#include "examples/examples.h"

namespace ex = pallas::examples;
namespace pl = pallas;
namespace pltpu = pallas::tpu;

namespace {

std::string first_race(const ex::Outcome& o) { return o.races.empty() ? "" : o.races[0].to_string(); }

// ---- Collectives: every ring size and DMA mode, race detection on --------------------------------
using CollectiveCase = std::tuple<std::string, int, std::string>;  // example, devices, DMA mode

class Collectives : public testing::TestWithParam<CollectiveCase> {};

TEST_P(Collectives, PassWithoutRaces) {
  const auto& [name, devices, mode] = GetParam();
  ex::Problem p = ex::find(name).build(
      {.seed = 11, .backend = "tpu-interpret", .devices = devices, .dma_mode = mode,
       .detect_races = true});
  ex::Outcome o = ex::run(p);
  EXPECT_TRUE(o.ok) << o.message;
  EXPECT_TRUE(o.races.empty()) << first_race(o);
}

INSTANTIATE_TEST_SUITE_P(
    , Collectives,
    testing::Combine(testing::Values("right_permute", "all_gather", "all_reduce", "reduce_scatter"),
                     testing::Values(2, 4, 8), testing::Values("eager", "on_wait")),
    [](const testing::TestParamInfo<CollectiveCase>& info) {
      return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) +
             "_devices_" + std::get<2>(info.param);
    });

// The shard size scales (odd sizes too), and the global arrays have one shard per device.
TEST(TpuExamples, CollectiveShapes) {
  const ex::RunOptions o{.size = 3, .backend = "tpu-interpret", .devices = 4};
  EXPECT_EQ(ex::find("right_permute").build(o).inputs[0].shape(), (pl::Shape{12, 128}));
  EXPECT_EQ(ex::find("all_gather").build(o).reference(ex::find("all_gather").build(o).inputs)[0].shape(),
            (pl::Shape{48, 128}));
  ex::Problem rs = ex::find("reduce_scatter").build(o);
  EXPECT_EQ(rs.inputs[0].shape(), (pl::Shape{48, 128}));  // 4 devices x 4 chunks x 3 rows
  EXPECT_EQ(rs.arg_shapes(), (std::vector<pl::ShapeDtype>{{{12, 128}, pl::f32}}));
  ex::Outcome out = ex::run(rs);
  EXPECT_TRUE(out.ok) << out.message;
  EXPECT_EQ(ex::find("all_reduce").build({.backend = "tpu-interpret"}).signature,
            "f32[8,128] on 4 devices");
}

// A collective's reference can fail: a wrong value in one device's result is reported.
TEST(TpuExamples, CollectiveMismatchIsReported) {
  for (const char* name : {"all_gather", "all_reduce", "reduce_scatter"}) {
    ex::Problem p = ex::find(name).build({.backend = "tpu-interpret", .devices = 2});
    std::vector<pl::Array> out = ex::execute(p);
    const std::vector<pl::Array> expected = p.reference(p.inputs);
    ASSERT_TRUE(ex::compare(p, p.inputs, out, expected).ok) << name;
    const int64_t last = out[0].size() - 1;  // in the last device's part
    out[0].set_flat(last, out[0].get_flat(last) + 1);
    EXPECT_FALSE(ex::compare(p, p.inputs, out, expected).ok) << name;
  }
}

TEST(TpuExamples, CollectivesTraceOneDevicesShard) {
  ex::Problem p = ex::find("all_gather").build({.backend = "tpu-interpret", .devices = 8});
  auto traced = p.call.trace(p.arg_shapes());
  EXPECT_EQ(traced->grid_mapping.block_mappings.at(1).array.shape, (pl::Shape{64, 128}));
}

// ---- core_map pipeline ----------------------------------------------------------------------------
TEST(TpuExamples, CoreMapPipelineOnTwoAndFourCores) {
  for (int cores : {2, 4}) {
    for (const char* mode : {"eager", "on_wait"}) {
      ex::Problem p = ex::find("core_map_pipeline").build(
          {.seed = 2, .size = 40, .backend = "tpu-interpret", .cores = cores, .dma_mode = mode,
           .detect_races = true});
      ex::Outcome o = ex::run(p);
      EXPECT_TRUE(o.ok) << cores << " cores, " << mode << ": " << o.message;
      EXPECT_TRUE(o.races.empty()) << first_race(o);
    }
  }
}

TEST(TpuExamples, CoreMapPipelineNeedsWholeTiles) {
  EXPECT_THROW(ex::find("core_map_pipeline").build({.size = 20, .backend = "tpu-interpret"}),
               ex::UsageError);
}

// ---- dma_matmul ----------------------------------------------------------------------------------
TEST(TpuExamples, DmaMatmulPassesWithoutRaces) {
  // 64: 32-tiles, two K steps; 256: 128-tiles. On one and on two cores (parallel output tiles).
  for (int64_t size : {64, 256}) {
    for (int cores : {1, 2}) {
      for (const char* mode : {"eager", "on_wait"}) {
        ex::Problem p = ex::find("dma_matmul").build(
            {.seed = 5, .size = size, .backend = "tpu-interpret", .cores = cores,
             .dma_mode = mode, .detect_races = true});
        ex::Outcome o = ex::run(p);
        EXPECT_TRUE(o.ok) << size << ", " << cores << " cores, " << mode << ": " << o.message;
        EXPECT_TRUE(o.races.empty()) << first_race(o);
      }
    }
  }
  ex::Outcome bf16 = ex::run(ex::find("dma_matmul").build(
      {.size = 64, .dtype = pl::bf16, .backend = "tpu-interpret"}));
  EXPECT_TRUE(bf16.ok) << bf16.message;
}

TEST(TpuExamples, DmaMatmulGridAndScratch) {
  ex::Problem p = ex::find("dma_matmul").build({.size = 256, .backend = "tpu-interpret"});
  auto traced = p.call.trace(p.arg_shapes());
  EXPECT_EQ(traced->grid_mapping.grid, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(traced->grid_mapping.scratch_types.size(), 5u);  // 2 slot arrays, acc, 2 semaphores
  EXPECT_THROW(ex::find("dma_matmul").build({.size = 100, .backend = "tpu-interpret"}),
               ex::UsageError);
  EXPECT_THROW(ex::find("dma_matmul").build({.size = 320, .backend = "tpu-interpret"}),
               ex::UsageError);
}

// ---- The broken ones -------------------------------------------------------------------------------
TEST(TpuExamples, RacyReportsItsRaceInBothModes) {
  for (const char* mode : {"eager", "on_wait"}) {
    ex::Problem p = ex::find("racy").build(
        {.backend = "tpu-interpret", .dma_mode = mode, .detect_races = true});
    ex::Outcome o = ex::run(p);
    EXPECT_FALSE(o.ok) << mode;
    ASSERT_EQ(o.races.size(), 1u) << mode;
    const std::string r = o.races[0].to_string();
    EXPECT_NE(r.find("DMA write"), std::string::npos) << r;
    EXPECT_NE(r.find("racy.cpp"), std::string::npos) << r;
  }
}

TEST(TpuExamples, RacyWithoutDetectionRunsUnchecked) {
  ex::Outcome o = ex::run(ex::find("racy").build({.backend = "tpu-interpret"}));
  EXPECT_TRUE(o.ok);
  EXPECT_FALSE(o.checked);
  EXPECT_TRUE(o.races.empty());
  EXPECT_NE(o.message.find("--detect-races"), std::string::npos) << o.message;
}

TEST(TpuExamples, DeadlockIsReportedQuickly) {
  for (int devices : {2, 4}) {
    ex::Problem p = ex::find("deadlock").build({.backend = "tpu-interpret", .devices = devices});
    const auto start = std::chrono::steady_clock::now();
    try {
      ex::run(p);
      FAIL() << "no deadlock on " << devices << " devices";
    } catch (const pltpu::DeadlockError& e) {
      const std::string what = e.what();
      for (int d = 0; d < devices; ++d)
        EXPECT_NE(what.find("device " + std::to_string(d) + ", core 0: semaphore_wait"),
                  std::string::npos)
            << what;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  }
}

// ---- Usage errors ------------------------------------------------------------------------------------
TEST(TpuExamples, TpuOnlyExamplesRejectOtherBackends) {
  for (const char* name : {"dma_matmul", "right_permute", "all_gather", "all_reduce",
                           "reduce_scatter", "core_map_pipeline", "racy", "deadlock",
                           "embedding_bag", "segment_sum", "lane_sort"}) {
    for (const char* backend : {"reference", "gpu"}) {
      try {
        ex::find(name).build({.backend = backend});
        ADD_FAILURE() << name << " on " << backend << ": no error";
      } catch (const ex::UsageError& e) {
        EXPECT_NE(std::string(e.what()).find("needs the TPU interpret mode"), std::string::npos)
            << e.what();
      }
    }
  }
}

TEST(TpuExamples, TpuOptionsNeedTheTpuBackend) {
  EXPECT_THROW(ex::find("add").build({.backend = "reference", .devices = 4}), ex::UsageError);
  EXPECT_THROW(ex::find("add").build({.backend = "reference", .cores = 2}), ex::UsageError);
  EXPECT_THROW(ex::find("add").build({.backend = "reference", .dma_mode = "eager"}), ex::UsageError);
  EXPECT_THROW(ex::find("add").build({.backend = "gpu", .detect_races = true}), ex::UsageError);
  // Single-device examples take no --devices; a ring needs two.
  EXPECT_THROW(ex::find("add").build({.backend = "tpu-interpret", .devices = 2}), ex::UsageError);
  EXPECT_THROW(ex::find("dma_matmul").build({.backend = "tpu-interpret", .devices = 2}),
               ex::UsageError);
  EXPECT_THROW(ex::find("all_reduce").build({.backend = "tpu-interpret", .devices = 1}),
               ex::UsageError);
  EXPECT_THROW(ex::find("all_reduce").build({.backend = "tpu-interpret", .dma_mode = "lazy"}),
               ex::UsageError);
  EXPECT_THROW(ex::find("all_reduce").build({.dtype = pl::bf16, .backend = "tpu-interpret"}),
               ex::UsageError);
  EXPECT_THROW(ex::find("core_map_pipeline").build({.backend = "tpu-interpret", .cores = 17}),
               ex::UsageError);
}

// A caller may bring its own race sink; it receives the reports.
TEST(TpuExamples, CallerSuppliedRaceSink) {
  auto sink = std::make_shared<std::vector<pltpu::RaceReport>>();
  ex::Problem p = ex::find("racy").build(
      {.backend = "tpu-interpret", .detect_races = true, .races = sink});
  ex::run(p);
  EXPECT_EQ(sink->size(), 1u);
}

}  // namespace

// ---- SparseCore examples ------------------------------------------------------------------------------
TEST(TpuExamples, SparseCoreExamplesMatchTheirReferencesInBothDmaModesWithoutRaces) {
  for (const char* name : {"embedding_bag", "segment_sum", "lane_sort"}) {
    for (const char* mode : {"eager", "on_wait"}) {
      for (int cores : {1, 2}) {
        ex::Problem p = ex::find(name).build({.seed = 3, .size = 256, .backend = "tpu-interpret",
                                              .cores = cores, .dma_mode = mode, .detect_races = true});
        ex::Outcome o = ex::run(p);
        EXPECT_TRUE(o.ok) << name << " " << mode << " " << cores << ": " << o.message;
        EXPECT_TRUE(o.races.empty()) << name << " " << mode;
      }
    }
  }
  EXPECT_THROW(ex::find("embedding_bag").build({.size = 12, .backend = "tpu-interpret"}), ex::UsageError);
  EXPECT_THROW(ex::find("segment_sum").build({.size = 24, .backend = "tpu-interpret"}), ex::UsageError);
  EXPECT_THROW(ex::find("segment_sum").build({.dtype = pl::bf16, .backend = "tpu-interpret"}),
               ex::UsageError);
}
