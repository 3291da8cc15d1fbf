// The bundled examples through the C++ API: every portable example passes against its reference
// at a small size, and every reference is able to fail (a corrupted output is reported). The
// TPU-interpret-only examples have their own tests in tpu_examples_test.cpp.
#include <gtest/gtest.h>

#include <set>

#include "examples/examples.h"
#include "gpu/cuda_libs.h"

namespace ex = pallas::examples;
namespace pl = pallas;

namespace {

// Small but not trivial: several grid points, and padded edge blocks where the example allows.
int64_t small_size(const std::string& name) {
  if (name == "matmul") return 256;  // grid (2, 2, 2): the accumulator crosses K steps
  if (name == "add") return 100;     // (100, 137) in (64, 128) blocks: both edges padded
  if (name == "gather") return 32;   // 4 blocks of 8 rows
  if (name == "inplace") return 24;  // whole blocks: see InplaceWithPaddedBlocks below
  if (name == "ws_matmul") return 256;  // 2 x 4 CTAs, 4 K-steps through 2 slots
  if (name == "grid_sum") return 256;   // 16 CTAs, 2 loop steps each
  if (name == "pipeline_matmul") return 256;  // 2 x 2 CTAs (bf16), 4 K-steps through 4 slots
  if (name == "flash_attention") return 128;  // 2 x 2 CTAs, 2 k / v blocks each through 2 slots
  if (name == "attention") return 256;  // grid (2 heads, 2 q blocks, 4 k blocks)
  return 20;                         // 3 row blocks of 8, the last one padded
}

// Whether building `name` with `backend` is refused with a UsageError containing `why`.
bool refused(const ex::Example& e, const std::string& backend, const std::string& why) {
  try {
    e.build({.size = small_size(e.name), .backend = backend});
  } catch (const ex::UsageError& err) {
    if (std::string(err.what()).find(why) != std::string::npos) return true;
    throw;
  }
  return false;
}

// The examples that run on every backend (the others need the TPU interpret mode, or are
// gpu::kernels, which the TPU interpret mode does not run).
std::vector<std::string> example_names() {
  std::vector<std::string> names;
  for (const ex::Example& e : ex::all()) {
    if (refused(e, "reference", "needs the TPU interpret mode")) continue;
    if (refused(e, "tpu-interpret", "is a gpu::kernel")) continue;
    names.push_back(e.name);
  }
  return names;
}

ex::Problem small_problem(const std::string& name, pl::DType t = pl::f32, uint64_t seed = 7) {
  return ex::find(name).build({.seed = seed, .size = small_size(name), .dtype = t});
}

class ExamplesEach : public testing::TestWithParam<std::string> {};

TEST_P(ExamplesEach, PassesInF32) {
  ex::Outcome o = ex::run(small_problem(GetParam()));
  EXPECT_TRUE(o.ok) << o.message;
}

TEST_P(ExamplesEach, PassesInBf16) {
  ex::Outcome o = ex::run(small_problem(GetParam(), pl::bf16));
  EXPECT_TRUE(o.ok) << o.message;
}

TEST_P(ExamplesEach, CorruptedOutputIsReported) {
  ex::Problem p = small_problem(GetParam());
  std::vector<pl::Array> expected = p.reference(p.inputs);
  std::vector<pl::Array> outputs = p.call(p.inputs);
  ASSERT_TRUE(ex::compare(p, p.inputs, outputs, expected).ok);
  pl::Array& out = outputs.at(0);
  const int64_t k = out.size() / 2;
  out.set_flat(k, out.get_flat(k) + 1);
  ex::Outcome o = ex::compare(p, p.inputs, outputs, expected);
  EXPECT_FALSE(o.ok);
  EXPECT_NE(o.message.find("mismatch"), std::string::npos) << o.message;
  EXPECT_GE(o.max_abs_error, 0.5);
}

TEST_P(ExamplesEach, TracesWithoutRunning) {
  ex::Problem p = small_problem(GetParam());
  auto traced = p.call.trace(p.arg_shapes());
  EXPECT_EQ(traced->grid_mapping.num_inputs, static_cast<int>(p.inputs.size()) -
                                                 traced->grid_mapping.num_index_operands);
  EXPECT_EQ(traced->grid_mapping.num_outputs, 1);
}

TEST_P(ExamplesEach, SeedChoosesTheInputs) {
  ex::Problem a = small_problem(GetParam(), pl::f32, 1), b = small_problem(GetParam(), pl::f32, 1),
              c = small_problem(GetParam(), pl::f32, 2);
  const pl::Array& last_a = a.inputs.back();
  EXPECT_TRUE(pl::allclose(last_a, b.inputs.back(), 0, 0).ok);
  EXPECT_FALSE(pl::allclose(last_a, c.inputs.back(), 0, 0).ok);
}

// The portable examples also run on the simulated TPU, with its knobs.
TEST_P(ExamplesEach, PassesInTheTpuInterpretMode) {
  for (const char* mode : {"eager", "on_wait"}) {
    ex::Problem p = ex::find(GetParam()).build(
        {.seed = 3, .size = small_size(GetParam()), .backend = "tpu-interpret", .cores = 2,
         .dma_mode = mode, .detect_races = true});
    ex::Outcome o = ex::run(p);
    EXPECT_TRUE(o.ok) << mode << ": " << o.message;
    EXPECT_TRUE(o.races.empty()) << mode;
  }
}

INSTANTIATE_TEST_SUITE_P(, ExamplesEach, testing::ValuesIn(example_names()),
                         [](const testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace

TEST(Examples, RegistryHasEveryExampleOnceWithADescription) {
  std::set<std::string> names;
  for (const ex::Example& e : ex::all()) {
    EXPECT_TRUE(names.insert(e.name).second) << e.name;
    EXPECT_FALSE(e.description.empty()) << e.name;
    EXPECT_EQ(e.description.find('\n'), std::string::npos) << e.name;
  }
  EXPECT_EQ(names, (std::set<std::string>{"add", "matmul", "softmax", "layer_norm", "gather",
                                          "inplace", "dma_matmul", "right_permute", "all_gather",
                                          "all_reduce", "reduce_scatter", "core_map_pipeline",
                                          "racy", "deadlock", "embedding_bag", "segment_sum",
                                          "lane_sort", "ws_matmul", "grid_sum", "pipeline_matmul",
                                          "flash_attention", "attention"}));
  EXPECT_EQ(example_names(), (std::vector<std::string>{"add", "matmul", "softmax", "layer_norm",
                                                       "gather", "inplace", "attention"}));
}

TEST(Examples, UnknownNameIsAUsageErrorListingTheKnownOnes) {
  try {
    ex::find("nope");
    FAIL() << "no error";
  } catch (const ex::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown example 'nope'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("matmul"), std::string::npos) << e.what();
  }
}

TEST(Examples, MatmulRejectsASizeItCannotTile) {
  try {
    ex::find("matmul").build({.size = 300});
    FAIL() << "no error";
  } catch (const ex::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 128"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(ex::find("matmul").build({.size = 96}));  // one block
  EXPECT_NO_THROW(ex::find("matmul").build({.size = 384}));
}

TEST(Examples, DefaultSizes) {
  EXPECT_EQ(ex::find("matmul").build({}).signature, "f32[512,512]x[512,512]");
  EXPECT_EQ(ex::find("add").build({}).signature, "f32[300,337]+[300,337]");
  EXPECT_EQ(ex::find("softmax").build({}).inputs.at(0).shape(), (pl::Shape{64, 256}));
}

TEST(Examples, BadOptionsAreUsageErrors) {
  EXPECT_THROW(ex::find("add").build({.size = -1}), ex::UsageError);
  EXPECT_THROW(ex::find("add").build({.dtype = pl::i32}), ex::UsageError);
  EXPECT_THROW(ex::find("add").build({.backend = "cuda"}), ex::UsageError);
  EXPECT_THROW(ex::find("gather").build({.size = 30}), ex::UsageError);
}

TEST(Examples, GpuBackendRunsOrSaysWhatIsMissing) {
  ex::Problem p = ex::find("add").build({.size = 8, .backend = "gpu"});
  if (pallas::gpu::driver_unavailable_reason().empty()) {
    EXPECT_TRUE(ex::run(p).ok);
  } else {
    EXPECT_THROW(ex::run(p), pl::Error);
  }
}

TEST(Examples, MatmulGridAndScratch) {
  ex::Problem p = ex::find("matmul").build({.size = 256});
  auto traced = p.call.trace(p.arg_shapes());
  EXPECT_EQ(traced->grid_mapping.grid, (std::vector<int64_t>{2, 2, 2}));
  ASSERT_EQ(traced->grid_mapping.scratch_types.size(), 1u);
}

TEST(Examples, InplaceNoticesAnOutputThatIsNotTheInputBuffer) {
  ex::Problem p = ex::find("inplace").build({.size = 16});
  std::vector<pl::Array> expected = p.reference(p.inputs);
  std::vector<pl::Array> copy = {expected[0].astype(pl::f32)};  // right values, wrong buffer
  ex::Outcome o = ex::compare(p, p.inputs, copy, expected);
  EXPECT_FALSE(o.ok);
  EXPECT_NE(o.message.find("buffer"), std::string::npos) << o.message;
}

// Regression: when the aliased array is not a multiple of the block shape, the interpreter works
// on a padded copy; the result must still land in x, and the output must be x's buffer.
TEST(Examples, InplaceWithPaddedBlocksStillUpdatesTheInput) {
  ex::Problem p = ex::find("inplace").build({.size = 20});  // 20 rows in blocks of 8
  ex::Outcome o = ex::run(p);
  EXPECT_TRUE(o.ok) << o.message;
}

// The warp-specialized gpu::kernel example on the GPU interpreter and compiled (host emulation;
// the GPU itself in scripts/gpu_validate.sh), and the options it refuses.
TEST(Examples, WsMatmulRunsInterpretedAndCompiled) {
  for (const char* backend : {"reference", "gpu-emulate"})
    for (pl::DType t : {pl::bf16, pl::f16, pl::f32}) {
      SCOPED_TRACE(std::string(backend) + " " + std::string(pl::dtype_name(t)));
      ex::Problem p = ex::find("ws_matmul").build({.seed = 5, .size = 256, .dtype = t, .backend = backend});
      ex::Outcome o = ex::run(p);
      EXPECT_TRUE(o.ok) << o.message;
    }
  ex::Problem p = ex::find("ws_matmul").build({.seed = 5, .size = 128});
  std::vector<pl::Array> outputs = p.call(p.inputs);
  outputs[0].set_flat(77, outputs[0].get_flat(77) + 1);
  EXPECT_FALSE(ex::compare(p, p.inputs, outputs, p.reference(p.inputs)).ok);
  EXPECT_THROW(ex::find("ws_matmul").build({.size = 200}), ex::UsageError);
  EXPECT_THROW(ex::find("ws_matmul").build({.size = 256, .backend = "tpu-interpret"}), ex::UsageError);
}

// The emit_pipeline example, the same way, and what it refuses.
TEST(Examples, PipelineMatmulRunsInterpretedAndCompiled) {
  for (const char* backend : {"reference", "gpu-emulate"})
    for (pl::DType t : {pl::bf16, pl::f16, pl::f32}) {
      SCOPED_TRACE(std::string(backend) + " " + std::string(pl::dtype_name(t)));
      ex::Problem p = ex::find("pipeline_matmul").build({.seed = 5, .size = 256, .dtype = t, .backend = backend});
      ex::Outcome o = ex::run(p);
      EXPECT_TRUE(o.ok) << o.message;
    }
  ex::Problem two = ex::find("pipeline_matmul").build({.seed = 6, .size = 256, .dtype = pl::bf16, .stages = 2});
  EXPECT_TRUE(ex::run(two).ok);
  ex::Problem p = ex::find("pipeline_matmul").build({.seed = 5, .size = 128});
  std::vector<pl::Array> outputs = p.call(p.inputs);
  outputs[0].set_flat(77, outputs[0].get_flat(77) + 1);
  EXPECT_FALSE(ex::compare(p, p.inputs, outputs, p.reference(p.inputs)).ok);
  EXPECT_THROW(ex::find("pipeline_matmul").build({.size = 200}), ex::UsageError);
  EXPECT_THROW(ex::find("pipeline_matmul").build({.size = 256, .backend = "tpu-interpret"}), ex::UsageError);
  EXPECT_THROW(ex::find("pipeline_matmul").build({.size = 256, .stages = 1}), ex::UsageError);
  EXPECT_THROW(ex::find("pipeline_matmul").build({.size = 256, .cluster = 2}), ex::UsageError);
}

// The attention example, the same way: its online softmax against plain C++ attention in double,
// over 4 blocks of k and v (size 256) and one (64); a wrong element fails the comparison.
TEST(Examples, FlashAttentionRunsInterpretedAndCompiled) {
  for (const char* backend : {"reference", "gpu-emulate"})
    for (pl::DType t : {pl::bf16, pl::f16, pl::f32})
      for (int64_t size : {64, 256}) {
        SCOPED_TRACE(std::string(backend) + " " + std::string(pl::dtype_name(t)) + " " + std::to_string(size));
        ex::Problem p = ex::find("flash_attention").build({.seed = 8, .size = size, .dtype = t, .backend = backend});
        ex::Outcome o = ex::run(p);
        EXPECT_TRUE(o.ok) << o.message;
      }
  ex::Problem p = ex::find("flash_attention").build({.seed = 5, .size = 128, .dtype = pl::bf16});
  std::vector<pl::Array> outputs = p.call(p.inputs);
  outputs[0].set_flat(77, outputs[0].get_flat(77) + 0.05);
  EXPECT_FALSE(ex::compare(p, p.inputs, outputs, p.reference(p.inputs)).ok);
  EXPECT_THROW(ex::find("flash_attention").build({.size = 100}), ex::UsageError);
  EXPECT_THROW(ex::find("flash_attention").build({.size = 128, .backend = "tpu-interpret"}), ex::UsageError);
  EXPECT_THROW(ex::find("flash_attention").build({.size = 128, .stages = 2}), ex::UsageError);
}

// The pallas_call attention (ExamplesEach runs it on the interpreters): compiled and run under
// host emulation in each dtype, over one k block (128) and two; a size that is not whole q blocks
// is a UsageError.
TEST(Examples, AttentionRunsCompiled) {
  for (pl::DType t : {pl::bf16, pl::f16, pl::f32})
    for (int64_t size : {128, 256}) {
      SCOPED_TRACE(std::string(pl::dtype_name(t)) + " " + std::to_string(size));
      ex::Outcome o = ex::run(ex::find("attention").build({.seed = 4, .size = size, .dtype = t, .backend = "gpu-emulate"}));
      EXPECT_TRUE(o.ok) << o.message;
    }
  EXPECT_THROW(ex::find("attention").build({.size = 200}), ex::UsageError);
}

// ws_matmul with clusters (`--cluster N`): the producers share x's blocks by multicast and a slot
// frees only when every consumer of the cluster is done with it — race-free in the interpreter
// (which checks that a multicast share lands only in a slot no peer still reads) and right on
// both backends; and in a persistent grid (`--persistent P`). Cluster sizes that do not split the
// output's column blocks, grids that do not fit the tiles, or examples without these options are
// usage errors.
TEST(Examples, WsMatmulRunsInClusters) {
  for (const char* backend : {"reference", "gpu-emulate"})
    for (auto [t, size, cluster] : {std::tuple{pl::bf16, 256, 2}, std::tuple{pl::bf16, 512, 4}, std::tuple{pl::f32, 256, 4}}) {
      SCOPED_TRACE(std::string(backend) + " " + std::string(pl::dtype_name(t)) + " cluster " + std::to_string(cluster));
      ex::Problem p =
          ex::find("ws_matmul").build({.seed = 6, .size = size, .dtype = t, .backend = backend, .cluster = cluster});
      ex::Outcome o = ex::run(p);
      EXPECT_TRUE(o.ok) << o.message;
    }
  // A persistent grid: CTAs looping over the tiles, the ring running on across them — evenly (16
  // tiles, 4 CTAs), unevenly (3 CTAs: 6, 5, 5 tiles) and in clusters (4 CTAs in 2 clusters of 2,
  // 8 cluster tiles). And 2 x 2 clusters (`--cluster-rows 2`): y's blocks multicast along the
  // rows too, into the same "full" barriers as x's, and the slots freed by a ClusterBarrier along
  // both axes; alone and persistent (8 CTAs, 2 clusters).
  for (const char* backend : {"reference", "gpu-emulate"})
    for (auto [rows, cluster, persistent] :
         {std::tuple{0, 1, 4}, std::tuple{0, 1, 3}, std::tuple{0, 2, 4}, std::tuple{2, 2, 0}, std::tuple{2, 2, 8}}) {
      SCOPED_TRACE(std::string(backend) + " cluster " + std::to_string(rows) + " x " + std::to_string(cluster) +
                   " persistent " + std::to_string(persistent));
      ex::Problem p = ex::find("ws_matmul").build({.seed = 8, .size = 512, .dtype = pl::bf16, .backend = backend,
                                                   .cluster = cluster, .cluster_rows = rows, .persistent = persistent});
      ex::Outcome o = ex::run(p);
      EXPECT_TRUE(o.ok) << o.message;
    }
  EXPECT_THROW(ex::find("ws_matmul").build({.size = 512, .dtype = pl::bf16, .cluster = 2, .persistent = 3}), ex::UsageError);
  EXPECT_THROW(ex::find("ws_matmul").build({.size = 256, .dtype = pl::bf16, .persistent = 5}), ex::UsageError);  // 4 tiles
  EXPECT_THROW(ex::find("ws_matmul").build({.size = 256, .dtype = pl::bf16, .cluster = 4}), ex::UsageError);  // 2 blocks
  EXPECT_THROW(ex::find("ws_matmul").build({.size = 384, .dtype = pl::bf16, .cluster = 3}), ex::UsageError);
  EXPECT_THROW(ex::find("add").build({.cluster = 2}), ex::UsageError);
  EXPECT_THROW(ex::find("add").build({.persistent = 2}), ex::UsageError);
  EXPECT_THROW(ex::find("add").build({.cluster_rows = 2}), ex::UsageError);
  EXPECT_THROW(ex::find("ws_matmul").build({.size = 384, .dtype = pl::bf16, .cluster_rows = 3}), ex::UsageError);
  EXPECT_THROW(ex::find("ws_matmul").build({.size = 1024, .dtype = pl::bf16, .cluster = 8, .cluster_rows = 4}),
               ex::UsageError);  // 32 CTAs a cluster
}

// ws_matmul's tiling (`--tile-n`, `--stages`): 128 x 256 tiles (the epilogue from the
// accumulator straight to z), alone, in clusters and persistent; narrower tiles and other ring
// depths (3 slots: the steps' slots and phases wrap unevenly across a persistent CTA's tiles).
// Tiles that are not 64, 128 or 256 columns, or do not divide the output, f32 wider than 64, fewer
// than 2 stages, and configurations past the shared memory are errors.
TEST(Examples, WsMatmulTakesOtherTilings) {
  for (const char* backend : {"reference", "gpu-emulate"})
    for (auto [tile_n, stages, cluster, persistent, t] :
         {std::tuple{256, 0, 1, 0, pl::bf16}, std::tuple{256, 0, 2, 4, pl::f16}, std::tuple{256, 3, 1, 3, pl::bf16},
          std::tuple{64, 3, 1, 0, pl::bf16}, std::tuple{128, 2, 1, 3, pl::bf16}, std::tuple{128, 3, 2, 0, pl::f16}}) {
      SCOPED_TRACE(std::string(backend) + " tile_n " + std::to_string(tile_n) + " stages " + std::to_string(stages) +
                   " cluster " + std::to_string(cluster) + " persistent " + std::to_string(persistent));
      ex::Problem p = ex::find("ws_matmul").build({.seed = 9, .size = 512, .dtype = t, .backend = backend,
                                                   .cluster = cluster, .persistent = persistent, .tile_n = tile_n,
                                                   .stages = stages});
      ex::Outcome o = ex::run(p);
      EXPECT_TRUE(o.ok) << o.message;
    }
  EXPECT_THROW(ex::find("ws_matmul").build({.size = 256, .dtype = pl::bf16, .tile_n = 96}), ex::UsageError);
  EXPECT_THROW(ex::find("ws_matmul").build({.size = 384, .dtype = pl::bf16, .tile_n = 256}), ex::UsageError);
  EXPECT_THROW(ex::find("ws_matmul").build({.size = 256, .dtype = pl::f32, .tile_n = 128}), ex::UsageError);
  EXPECT_THROW(ex::find("ws_matmul").build({.size = 256, .dtype = pl::bf16, .stages = 1}), ex::UsageError);
  EXPECT_THROW(ex::find("add").build({.tile_n = 128}), ex::UsageError);
  EXPECT_THROW(ex::find("add").build({.stages = 2}), ex::UsageError);
  try {
    ex::find("ws_matmul").build({.size = 256, .dtype = pl::bf16, .tile_n = 256, .stages = 5});
    ADD_FAILURE() << "5 slots of 48 KiB were taken";
  } catch (const pl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds available shared memory"), std::string::npos) << e.what();
  }
}

// Without --stages ws_matmul takes as many ring slots as the device's shared memory holds, up to
// 4 (2 for f32): by hand, a bf16 128 x 128 slot pair is 32 KiB beside the 64 KiB epilogue tile
// (4: 192 KiB, 3: 160 KiB), a 128 x 256 one 48 KiB with no epilogue tile (4: 192, 3: 144).
TEST(Examples, WsMatmulsDefaultDepthFollowsTheDevicesSharedMemory) {
  struct Case { int64_t limit; int tile_n; pl::DType t; int64_t slots; };
  for (const Case& c : {Case{0, 0, pl::bf16, 4}, Case{227 * 1024, 0, pl::bf16, 4}, Case{163 * 1024, 0, pl::bf16, 3},
                        Case{99 * 1024, 0, pl::bf16, 2}, Case{163 * 1024, 256, pl::f16, 3},
                        Case{227 * 1024, 256, pl::bf16, 4}, Case{227 * 1024, 0, pl::f32, 2}}) {
    SCOPED_TRACE("limit " + std::to_string(c.limit) + " tile_n " + std::to_string(c.tile_n) + " " +
                 std::string(pl::dtype_name(c.t)));
    ex::Problem p = ex::find("ws_matmul").build(
        {.seed = 5, .size = 256, .dtype = c.t, .tile_n = c.tile_n, .shared_memory_limit = c.limit});
    std::vector<pl::ShapeDtype> sig;
    for (const pl::Array& a : p.inputs) sig.push_back(a.shape_dtype());
    const pl::Shape& x_slots = p.call.trace(sig)->grid_mapping.scratch_types.at(0).shape;
    EXPECT_EQ(x_slots.at(0), c.slots);
    if (c.limit == 163 * 1024 && c.tile_n == 0) {  // (what an A100 gets runs)
      ex::Outcome o = ex::run(p);
      EXPECT_TRUE(o.ok) << o.message;
    }
  }
  // --stages still decides where given (the launch then checks it against the device).
  ex::Problem p = ex::find("ws_matmul").build({.size = 256, .dtype = pl::bf16, .stages = 4, .shared_memory_limit = 163 * 1024});
  EXPECT_EQ(p.call.trace({p.inputs[0].shape_dtype(), p.inputs[1].shape_dtype()})->grid_mapping.scratch_types.at(0).shape.at(0), 4);
}

// The persistent-grid reduction with a GMEM semaphore, interpreted and compiled (host emulation;
// the GPU in scripts/gpu_validate.sh). Both outputs are checked: the column sums and each CTA's
// partial row, which only come out right if CTA c summed blocks c, c + 16, ...
TEST(Examples, GridSumRunsInterpretedAndCompiled) {
  for (const char* backend : {"reference", "gpu-emulate"})
    for (pl::DType t : {pl::f32, pl::bf16}) {
      SCOPED_TRACE(std::string(backend) + " " + std::string(pl::dtype_name(t)));
      ex::Outcome o = ex::run(ex::find("grid_sum").build({.seed = 4, .size = 384, .dtype = t, .backend = backend}));
      EXPECT_TRUE(o.ok) << o.message;
    }
  ex::Problem p = ex::find("grid_sum").build({.seed = 4, .size = 128});
  std::vector<pl::Array> outputs = p.call(p.inputs);
  ASSERT_TRUE(ex::compare(p, p.inputs, outputs, p.reference(p.inputs)).ok);
  outputs[1].set_flat(300, outputs[1].get_flat(300) + 1);  // CTA 1's partial row
  EXPECT_FALSE(ex::compare(p, p.inputs, outputs, p.reference(p.inputs)).ok);
  EXPECT_THROW(ex::find("grid_sum").build({.size = 200}), ex::UsageError);
  EXPECT_THROW(ex::find("grid_sum").build({.size = 256, .dtype = pl::f16}), ex::UsageError);
  EXPECT_THROW(ex::find("grid_sum").build({.size = 256, .backend = "tpu-interpret"}), ex::UsageError);
}
