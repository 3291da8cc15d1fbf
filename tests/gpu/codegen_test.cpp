// The CUDA code generator, checked without a GPU: every example's generated unit compiles with
// NVRTC for sm_90a and sm_80, and runs under host emulation (the same source compiled as C++)
// with results that match the examples' independent references.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>

#include "core/call.h"
#include "examples/examples.h"
#include "gpu/backend.h"
#include "gpu/codegen.h"
#include "gpu/cuda_libs.h"
#include "gpu/emitter.h"
#include "gpu/host_emulation.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"
#include "pallas/tpu.h"

namespace pallas {
namespace {

namespace ex = examples;

// The examples whose kernels use only what a GPU has (no DMAs, semaphores or devices).
const std::vector<std::string> kGpuExamples = {"add",    "matmul",  "softmax",  "layer_norm",
                                               "gather", "inplace", "ws_matmul", "grid_sum", "pipeline_matmul",
                                               "flash_attention", "attention"};

ex::Problem small(const std::string& name, DType dtype = DType::F32) {
  ex::RunOptions o;
  o.seed = 7;
  o.dtype = dtype;
  if (name == "matmul") o.size = 256;
  return ex::find(name).build(o);
}

std::vector<int64_t> static_grid(const TracedCall& tc) { return tc.grid_mapping.grid; }

// The arena's first-fit: an aligned array takes the first aligned place inside a free range
// (a small tile took the range's start), keeping the head and the tail free; 16-byte allocations
// take a range's start, as before.
TEST(GpuCodegen, TheArenaPlacesAlignedArraysInsideFreeRanges) {
  gpu::detail::Arena arena;
  EXPECT_EQ(arena.alloc(1024), 0);
  const int64_t scope = arena.alloc(32768, 1024);  // a scope's swizzled array, freed below
  EXPECT_EQ(scope, 1024);
  EXPECT_EQ(arena.alloc(16), 33792);  // a tile that stays
  arena.release(scope, 32768);
  arena.on_barrier();                         // free: [1024, 33792)
  EXPECT_EQ(arena.alloc(16), 1024);           // a small tile takes the range's start
  EXPECT_EQ(arena.alloc(8192, 1024), 2048);   // inside the range, not on top
  EXPECT_EQ(arena.alloc(16), 1040);           // the head before it stays free
  EXPECT_EQ(arena.alloc(4096, 1024), 10240);  // the next aligned place: in the tail
  EXPECT_EQ(arena.peak(), 33808);             // the arena did not grow
  EXPECT_EQ(arena.alloc(40000, 1024), 34816); // no room inside: on top, aligned
}

TEST(GpuCodegen, EveryGpuExampleRunsUnderHostEmulation) {
  for (const std::string& name : kGpuExamples) {
    for (DType dt : {DType::F32, DType::BF16}) {
      std::optional<ex::Problem> maybe;
      try {
        maybe = small(name, dt);
      } catch (const ex::UsageError&) {
        continue;  // the example does not take this dtype
      }
      ex::Problem& p = *maybe;
      SCOPED_TRACE(name + " " + std::string(dtype_name(dt)));
      std::shared_ptr<const TracedCall> tc = p.call.trace(p.arg_shapes());
      std::vector<Array> inputs;
      for (const Array& a : p.inputs) inputs.push_back(a.clone());
      std::vector<Array> expected = p.reference(inputs);
      // Four threads per CTA: the barriers the emitter placed are exercised too. Register tiles
      // take the CTA's threads (their layout's): then the kernel without them runs too.
      auto check = [&](const gpu::GeneratedKernel& k) {
        const int threads = k.register_tiles > 0 ? k.threads_per_cta : 4;
        std::vector<Array> args;  // (a copy each run: `inplace` writes its input)
        for (const Array& a : inputs) args.push_back(a.clone());
        std::vector<Array> outs = gpu::run_host_emulation(*tc, k, args, static_grid(*tc), threads);
        ex::Outcome o = ex::compare(p, args, outs, expected);
        EXPECT_TRUE(o.ok) << k.register_tiles << " register tiles: " << o.message;
      };
      const gpu::GeneratedKernel k = gpu::generate_cuda(*tc, static_grid(*tc));
      check(k);
      if (k.register_tiles > 0) check(gpu::generate_cuda(*tc, static_grid(*tc), {.register_tiles = false}));
    }
  }
}

// The precompiled headers of host emulation (60-70 MB each) do not pile up in the temp directory:
// one unused for the given age goes with its header, a recent one stays, as do other files; a
// dead build's temporary file goes after an hour.
TEST(GpuCodegen, HostEmulationEvictsUnusedPrecompiledHeaders) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("pallas-evict-test-" + std::to_string(static_cast<long>(::getpid())));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto touch = [&](const std::string& name, std::chrono::hours age) {
    std::ofstream(dir / name) << "x";
    fs::last_write_time(dir / name, fs::file_time_type::clock::now() - age);
  };
  touch("old.h", std::chrono::hours(0));
  touch("old.h.gch", std::chrono::hours(24 * 8));
  touch("new.h", std::chrono::hours(24 * 8));  // (a header's own time does not count)
  touch("new.h.gch", std::chrono::hours(24 * 6));
  touch("dead.h.gch.123.tmp", std::chrono::hours(2));
  touch("live.h.gch.456.tmp", std::chrono::hours(0));
  touch("other.txt", std::chrono::hours(24 * 30));
  gpu::evict_unused_precompiled_headers(dir, std::chrono::hours(24 * 7));
  std::vector<std::string> left;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"live.h.gch.456.tmp", "new.h", "new.h.gch", "other.txt"}));
  fs::remove_all(dir);
}

TEST(GpuCodegen, EveryGpuExampleCompilesWithNvrtcForHopperAndAmpere) {
  if (std::string why = gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  for (const std::string& name : kGpuExamples) {
    SCOPED_TRACE(name);
    ex::Problem p = small(name);
    std::shared_ptr<const TracedCall> tc = p.call.trace(p.arg_shapes());
    gpu::GeneratedKernel k = gpu::generate_cuda(*tc, static_grid(*tc));
    for (const char* arch : {"sm_90a", "sm_80"}) {
      gpu::CompiledKernel c = gpu::Nvrtc::get().compile(k.source, name + ".cu", arch);
      EXPECT_TRUE(c.is_cubin);
      EXPECT_GT(c.image.size(), 1000u);
    }
  }
}

// flash_attention (bf16) keeps its softmax and its running statistics in registers: the scores,
// their scaling and exponentials, p in bf16 (the second wgmma's a, from registers), the row max
// and sum and alpha (rows), the loop's two carries and the run_scoped's two results, and o's load
// for the epilogue. A change that sends one of them to shared memory shows here first.
TEST(GpuCodegen, FlashAttentionKeepsItsSoftmaxAndCarriesInRegisters) {
  ex::Problem p = small("flash_attention", DType::BF16);
  std::shared_ptr<const TracedCall> tc = p.call.trace(p.arg_shapes());
  gpu::GeneratedKernel k = gpu::generate_cuda(*tc, static_grid(*tc));
  // s, s * scale, max(s), m_new, alpha, p, p in bf16, sum(p), l_new; two carries, two results; o.
  EXPECT_EQ(k.register_tiles, 14);
  EXPECT_EQ(k.register_a_products, 1);
  // Without register tiles every one of them is an arena tile.
  EXPECT_EQ(gpu::generate_cuda(*tc, static_grid(*tc), {.register_tiles = false}).register_tiles, 0);
}

// The pallas_call attention (bf16) on wgmma with both products' results in registers (q k^T and
// p v, p taken from its registers), its softmax and running statistics too: the (m, 1) scratch
// values in the scores' rows layout, and its output accumulator (acc = acc * alpha + p v) in the
// register accumulator's registers across the k steps. k's and v's blocks (a head squeezed) come by TMA into
// 128-byte swizzled ring slots that wgmma reads in place, and so does q's, into a resident slot
// once a point; the arena (the scratch; the other path's product tiles) fits in shared memory. Host emulation: every product on wgmma, the blocks by TMA,
// the output right. Without register tiles, none.
TEST(GpuCodegen, AttentionKeepsItsProductsInRegisters) {
  ex::Problem p = small("attention", DType::BF16);
  std::shared_ptr<const TracedCall> tc = p.call.trace(p.arg_shapes());
  gpu::GeneratedKernel k = gpu::generate_cuda(*tc, static_grid(*tc));
  EXPECT_EQ(k.register_dots, 2);
  EXPECT_EQ(k.register_a_products, 1);
  // s, s * scale, m_prev, max(s), m_new, alpha, p, p in bf16, sum(p), p v.
  EXPECT_GE(k.register_tiles, 10);
  EXPECT_TRUE(k.arena_in_shared);
  EXPECT_EQ(k.tma_inputs, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(k.resident_inputs, std::vector<int>{0});  // q: the same block at every k step
  EXPECT_CONTAINS(k.source, "#define PL_SLOT_LAYOUT_0 (PL_HAS_WGMMA ? 3 : 0)");  // q: K-major, 128-byte swizzle
  EXPECT_CONTAINS(k.source, "#define PL_SLOT_LAYOUT_1 (PL_HAS_WGMMA ? 3 : 0)");  // k: K-major
  EXPECT_CONTAINS(k.source, "#define PL_SLOT_LAYOUT_2 (PL_HAS_WGMMA ? 4 : 0)");  // v: MN-major
  const std::string body = k.source.substr(k.source.find("PL_DEV bool pl_grid_point"));
  EXPECT_CONTAINS(body, "pl_tc_dot_fragment<true, 64, PL_SLOT_LAYOUT_0, PL_SLOT_LAYOUT_1, 1>(");  // q k^T
  EXPECT_CONTAINS(body, "pl_tc_dot_fragment<false, 64, 0, PL_SLOT_LAYOUT_2, 1, 64>(");            // p v
  // acc = acc * alpha + p v in the registers of the register accumulator (scratch 2), across steps.
  EXPECT_EQ(k.register_accumulator, 2);
  EXPECT_CONTAINS(body, "if (!pl_acc_assign(pl_acc, 128, 64, ");
  gpu::HostEmulationStats stats;
  const std::vector<Array> outs = gpu::run_host_emulation(*tc, k, p.inputs, static_grid(*tc), k.threads_per_cta, &stats);
  const int64_t points = 2 * (p.inputs[0].dim(1) / 128), steps = p.inputs[0].dim(1) / 64;
  EXPECT_EQ(stats.tma_boxes, points * (1 + steps * 2));  // q's block once a point; k's and v's each step
  EXPECT_EQ(stats.wgmma_instructions, points * steps * 2 * 2 * (64 / 16));  // 2 warpgroups x 2 products x K / 16
  EXPECT_EQ(stats.acc_flushes, points);  // (once a point: the last step's o = acc / l reads the scratch)
  ex::Outcome o = ex::compare(p, p.inputs, outs, p.reference(p.inputs));
  EXPECT_TRUE(o.ok) << o.message;
  const gpu::GeneratedKernel a = gpu::generate_cuda(*tc, static_grid(*tc), {.register_tiles = false});
  EXPECT_EQ(a.register_tiles, 0);
  EXPECT_EQ(a.register_dots, 0);
}

// ws_matmul in clusters of two along j (`--cluster 2`): each producer copies 64 of the 128 rows
// of a step's x block for both CTAs, by TMA multicast into the 128-byte swizzled slots (a 64 x 64
// box of x); y's two panels stay a box each. Host emulation lands each share in both CTAs and
// matches the independent reference; the sm_90a unit has the multicast TMA loads. Clusters need
// sm_90: the sm_80 compile says so.
TEST(GpuCodegen, WsMatmulInClustersSharesXByTmaMulticast) {
  ex::Problem p = ex::find("ws_matmul").build({.seed = 3, .size = 256, .dtype = DType::BF16, .backend = "gpu", .cluster = 2});
  std::shared_ptr<const TracedCall> tc = p.call.trace(p.arg_shapes());
  gpu::GeneratedKernel k = gpu::generate_cuda(*tc, static_grid(*tc));
  EXPECT_EQ(k.cluster_ctas, 2);
  const gpu::TensorMapSpec x_share{0, 2, {256, 256}, {512}, {64, 64}, 128}, y_panel{1, 2, {256, 256}, {512}, {64, 64}, 128},
      z_rows{2, 4, {256, 256}, {1024}, {128, 64}, 0};
  ASSERT_EQ(k.tensor_maps.size(), 3u);
  EXPECT_EQ(k.tensor_maps[0], x_share);
  EXPECT_EQ(k.tensor_maps[1], y_panel);
  EXPECT_EQ(k.tensor_maps[2], z_rows);  // (the epilogue's store: a consumer's 64 rows)
  EXPECT_NE(k.source.find("const pl_u32 peers = 3u;"), std::string::npos);
  EXPECT_NE(k.source.find("const pl_i64 share = (rank == 0 ? 0 : 1);"), std::string::npos);
  EXPECT_NE(k.source.find("pl_tma_load_multicast<2>("), std::string::npos);
  gpu::HostEmulationStats stats;
  std::vector<Array> outs = gpu::run_host_emulation(*tc, k, p.inputs, static_grid(*tc), 4, &stats);
  // 4 CTAs x (4 K-steps x (x's share, y's two panels) + 2 consumers' stores)
  EXPECT_EQ(stats.tma_boxes, 4 * (4 * (1 + 2) + 2));
  ex::Outcome o = ex::compare(p, p.inputs, outs, p.reference(p.inputs));
  EXPECT_TRUE(o.ok) << o.message;
  if (std::string why = gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  EXPECT_NO_THROW(gpu::Nvrtc::get().compile(k.source, "ws_matmul.cu", "sm_90a"));
  try {
    gpu::Nvrtc::get().compile(k.source, "ws_matmul.cu", "sm_80");
    ADD_FAILURE() << "a kernel with clusters compiled for sm_80";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("clusters of more than one CTA needs sm_90 or later"), std::string::npos) << e.what();
  }
}

// ws_matmul in 2 x 2 clusters (`--cluster 2 --cluster-rows 2`): x multicast along j (ranks r * 2 +
// c: peers {0, 1} and {2, 3}), y along i (peers {0, 2} and {1, 3}); the sm_90a unit has one
// multicast TMA load for x's share and one per panel of y's (SASS UTMALDG.2D.MULTICAST).
TEST(GpuCodegen, WsMatmulInTwoByTwoClustersSharesXAndY) {
  ex::Problem p = ex::find("ws_matmul").build(
      {.seed = 5, .size = 256, .dtype = DType::BF16, .backend = "gpu", .cluster = 2, .cluster_rows = 2});
  std::shared_ptr<const TracedCall> tc = p.call.trace(p.arg_shapes());
  gpu::GeneratedKernel k = gpu::generate_cuda(*tc, static_grid(*tc));
  EXPECT_EQ(k.cluster_ctas, 4);
  EXPECT_NE(k.source.find("const pl_u32 peers = (rank == 0 ? 3u : rank == 1 ? 3u : rank == 2 ? 12u : 12u);"), std::string::npos);
  EXPECT_NE(k.source.find("const pl_u32 peers = (rank == 0 ? 5u : rank == 1 ? 10u : rank == 2 ? 5u : 10u);"), std::string::npos);
  gpu::HostEmulationStats stats;
  std::vector<Array> outs = gpu::run_host_emulation(*tc, k, p.inputs, static_grid(*tc), 4, &stats);
  EXPECT_EQ(stats.tma_boxes, 4 * (4 * (1 + 2) + 2));  // per CTA and K step: x's share, y's share per panel
  ex::Outcome o = ex::compare(p, p.inputs, outs, p.reference(p.inputs));
  EXPECT_TRUE(o.ok) << o.message;
  if (std::string why = gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  EXPECT_TRUE(gpu::Nvrtc::get().compile(k.source, "ws_matmul.cu", "sm_90a").is_cubin);
  if (test_util::find_cuobjdump().empty()) GTEST_SKIP() << "no cuobjdump (run scripts/get_cuda_tools.sh)";
  const std::string sass = test_util::sass_of(k.source, "sm_90a");
  int multicasts = 0;
  for (size_t at = sass.find("UTMALDG.2D.MULTICAST"); at != std::string::npos; at = sass.find("UTMALDG.2D.MULTICAST", at + 1))
    ++multicasts;
  EXPECT_EQ(multicasts, 3);
}

// ws_matmul in a persistent grid (`--persistent`): compiles for sm_90a with clusters, and for
// sm_80 without (one CTA per cluster), and runs under host emulation.
TEST(GpuCodegen, WsMatmulInAPersistentGridCompiles) {
  for (int cluster : {1, 2}) {
    SCOPED_TRACE("cluster " + std::to_string(cluster));
    ex::Problem p = ex::find("ws_matmul").build(
        {.seed = 4, .size = 512, .dtype = DType::BF16, .backend = "gpu", .cluster = cluster, .persistent = 4});
    std::shared_ptr<const TracedCall> tc = p.call.trace(p.arg_shapes());
    gpu::GeneratedKernel k = gpu::generate_cuda(*tc, static_grid(*tc));
    std::vector<Array> outs = gpu::run_host_emulation(*tc, k, p.inputs, static_grid(*tc), 4);
    ex::Outcome o = ex::compare(p, p.inputs, outs, p.reference(p.inputs));
    EXPECT_TRUE(o.ok) << o.message;
    if (std::string why = gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
    EXPECT_TRUE(gpu::Nvrtc::get().compile(k.source, "ws_matmul.cu", "sm_90a").is_cubin);
    if (cluster == 1) {
      EXPECT_TRUE(gpu::Nvrtc::get().compile(k.source, "ws_matmul.cu", "sm_80").is_cubin);
    }
  }
}

// ws_matmul with 128 x 256 tiles (`--tile-n 256`): each consumer's 64 x 256 accumulator is one
// m64n256k16 wgmma block (PlAccRegs<256, 1>: both operands are swizzled tiles read in place), y's
// slot four 64-column panels, and the epilogue stores the registers to z (no SMEM tile, no TMA
// store). Without swizzled tiles (staged operands) the same kernel takes two m64n128k16 blocks.
TEST(GpuCodegen, WsMatmulWithWideTilesUsesTheWidestWgmma) {
  ex::Problem p = ex::find("ws_matmul").build({.seed = 6, .size = 256, .dtype = DType::BF16, .backend = "gpu", .tile_n = 256});
  std::shared_ptr<const TracedCall> tc = p.call.trace(p.arg_shapes());
  gpu::GeneratedKernel k = gpu::generate_cuda(*tc, static_grid(*tc));
  EXPECT_EQ(k.accumulators_in_registers, std::vector<int>{2});
  EXPECT_NE(k.source.find("PlAccRegs<256, 1>"), std::string::npos);
  EXPECT_NE(k.source.find("pl_tc_dot_acc<false, 256, "), std::string::npos);
  EXPECT_EQ(k.tensor_maps.size(), 2u);  // x's and y's (z is stored from the registers)
  // Whole warpgroups (3 x 128 host threads a CTA), so that the wgmma run on the registers.
  gpu::HostEmulationStats stats;
  std::vector<Array> outs = gpu::run_host_emulation(*tc, k, p.inputs, static_grid(*tc), 384, &stats);
  EXPECT_EQ(stats.tma_boxes, 2 * 4 * (1 + 4));         // 2 CTAs x 4 K-steps x (x's box, y's 4 panels)
  EXPECT_EQ(stats.wgmma_instructions, 2 * 2 * 4 * 4);  // 2 CTAs x 2 consumers x 4 K-steps x 64 / 16
  ex::Outcome o = ex::compare(p, p.inputs, outs, p.reference(p.inputs));
  EXPECT_TRUE(o.ok) << o.message;

  // In a cluster of 2 sharing x by multicast, persistent (2 CTAs looping over 4 cluster tiles: the
  // registers refilled per tile, the ring running on across tiles), on whole warpgroups too.
  ex::Problem pc = ex::find("ws_matmul").build({.seed = 7, .size = 512, .dtype = DType::BF16, .backend = "gpu",
                                                .cluster = 2, .persistent = 2, .tile_n = 256});
  std::shared_ptr<const TracedCall> tcc = pc.call.trace(pc.arg_shapes());
  gpu::GeneratedKernel kc = gpu::generate_cuda(*tcc, static_grid(*tcc));
  EXPECT_NE(kc.source.find("PlAccRegs<256, 1>"), std::string::npos);
  stats = {};
  outs = gpu::run_host_emulation(*tcc, kc, pc.inputs, static_grid(*tcc), 384, &stats);
  EXPECT_EQ(stats.wgmma_instructions, 2 * 2 * 4 * 8 * 4);  // 2 CTAs x 2 consumers x 4 tiles x 8 K-steps x 4
  o = ex::compare(pc, pc.inputs, outs, pc.reference(pc.inputs));
  EXPECT_TRUE(o.ok) << o.message;

  // (2 slots: the staging of three warpgroups fits beside them.)
  ex::Problem p2 = ex::find("ws_matmul").build(
      {.seed = 6, .size = 256, .dtype = DType::BF16, .backend = "gpu", .tile_n = 256, .stages = 2});
  std::shared_ptr<const TracedCall> tc2 = p2.call.trace(p2.arg_shapes());
  gpu::GeneratedKernel staged = gpu::generate_cuda(*tc2, static_grid(*tc2), {.swizzle = false});
  EXPECT_NE(staged.source.find("PlAccRegs<128, 2>"), std::string::npos);
  EXPECT_EQ(staged.source.find("PlAccRegs<256"), std::string::npos);
  stats = {};
  outs = gpu::run_host_emulation(*tc2, staged, p2.inputs, static_grid(*tc2), 384, &stats);
  EXPECT_EQ(stats.wgmma_instructions, 2 * 2 * 2 * 4 * 4);  // twice as many, half as wide
  o = ex::compare(p2, p2.inputs, outs, p2.reference(p2.inputs));
  EXPECT_TRUE(o.ok) << o.message;

  if (std::string why = gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  EXPECT_TRUE(gpu::Nvrtc::get().compile(k.source, "ws_matmul.cu", "sm_80").is_cubin);
  EXPECT_TRUE(gpu::Nvrtc::get().compile(staged.source, "ws_matmul.cu", "sm_90a").is_cubin);
  if (test_util::find_cuobjdump().empty()) GTEST_SKIP() << "no cuobjdump (run scripts/get_cuda_tools.sh)";
  const std::string sass = test_util::sass_of(k.source, "sm_90a");
  EXPECT_NE(sass.find("HGMMA.64x256x16.F32"), std::string::npos);
  EXPECT_EQ(sass.find("HGMMA.64x128x16"), std::string::npos);
  EXPECT_NE(sass.find("STG.E.64"), std::string::npos);  // the epilogue's register pairs
}

// gpu_emulate's host threads: a warpgroup per Pallas thread where the products run on wgmma (so
// the accumulator's registers are exercised as on the GPU), two per Pallas thread without
// tensor-core products (f32).
TEST(GpuCodegen, HostEmulationRunsWgmmaOnWholeWarpgroups) {
  ex::Problem ws = ex::find("ws_matmul").build({.size = 256, .dtype = DType::BF16, .backend = "gpu"});
  std::shared_ptr<const TracedCall> tc = ws.call.trace(ws.arg_shapes());
  gpu::GeneratedKernel k = gpu::generate_cuda(*tc, static_grid(*tc));
  ASSERT_TRUE(k.uses_wgmma);
  EXPECT_EQ(gpu::emulation_threads(k), 3 * 128);
  ex::Problem f32 = ex::find("ws_matmul").build({.size = 256, .dtype = DType::F32, .backend = "gpu"});
  tc = f32.call.trace(f32.arg_shapes());
  k = gpu::generate_cuda(*tc, static_grid(*tc));
  EXPECT_FALSE(k.uses_wgmma);
  EXPECT_EQ(gpu::emulation_threads(k), 2 * 3);
}

TEST(GpuCodegen, TpuOnlyExamplesAreRejectedByName) {
  for (std::string name : {"dma_matmul", "right_permute"}) {
    ex::RunOptions o;
    o.backend = "tpu-interpret";
    ex::Problem p = ex::find(name).build(o);
    std::shared_ptr<const TracedCall> tc = p.call.trace(p.arg_shapes());
    try {
      gpu::generate_cuda(*tc, static_grid(*tc));
      ADD_FAILURE() << name << " generated CUDA";
    } catch (const NotSupportedError& e) {
      EXPECT_NE(std::string(e.what()).find("on the GPU backend"), std::string::npos) << e.what();
    }
  }
}

// TPU operations that need no scratch reach the emitter itself: each is refused by its name.
TEST(GpuCodegen, TpuOperationsInTheBodyAreRefusedByName) {
  PallasCall call = pallas_call(
      [](Ref out) { out[0] = tpu::semaphore_read(tpu::get_barrier_semaphore()); },
      ShapeDtype({1}, DType::I32), CallOptions{.backend = "mosaic_gpu", .name = "tpu_ops"});
  std::shared_ptr<const TracedCall> tc = call.trace({});
  try {
    gpu::generate_cuda(*tc, static_grid(*tc));
    ADD_FAILURE() << "generated CUDA";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("get_barrier_semaphore on the GPU backend"), std::string::npos) << e.what();
  }
}

TEST(GpuCodegen, EveryNonTpuOpHasACudaRule) {
  for (int c = 0; c < ir::kNumOpCodes; ++c) {
    auto code = static_cast<ir::OpCode>(c);
    const ir::OpInfo& info = ir::op_info(code);
    // (semaphore_signal / wait / read run on gpu::Semaphore counters in GMEM.)
    bool tpu = info.name.find("dma") != std::string::npos || info.name == "get_barrier_semaphore" ||
               info.name == "subcore_barrier" || info.name.starts_with("sc_");
    EXPECT_EQ(gpu::cuda_emitter_supports(code), !tpu) << info.name;
  }
}

}  // namespace
}  // namespace pallas
