// gpu::cluster_ref (Mosaic GPU's cluster_ref): loads and stores of another CTA's shared memory in
// the cluster, ordered by a gpu::ClusterBarrier — on the interpreter (which reports the race when
// the barrier is missing), under host emulation and (with a GPU) compiled; values against plain
// C++.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/call.h"
#include "gpu/codegen.h"
#include "gpu/cuda_libs.h"
#include "gpu/host_emulation.h"
#include "pallas/gpu.h"
#include "pallas/pallas.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

namespace {

namespace pl = ::pallas;
namespace plgpu = ::pallas::gpu;
using test_util::random_f32;
using test_util::run_on;

class ClusterRef : public test_util::OnGpuBackends {};
INSTANTIATE_TEST_SUITE_P(Backends, ClusterRef, testing::Values("interpret", "gpu_emulate", "mosaic_gpu"),
                         test_util::backend_name);

constexpr int64_t kGrid = 3, kPart = 64;

// Clusters of 2 CTAs along "c", 3 clusters: each CTA puts its part of x (times 2) in its own SMEM
// `mine` and x + 1 into its peer's `theirs` (a store through cluster_ref); after the cluster
// barrier it reads its peer's `mine` (a load through cluster_ref) and its own `theirs`, and a
// second phase keeps each CTA's memory alive until its peer is done reading it.
TEST_P(ClusterRef, CtasOfAClusterLoadAndStoreEachOthersSharedMemory) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref from_peer, pl::Ref sent_to_me, pl::Ref mine, pl::Ref theirs, pl::Ref bar) {
        const pl::Value g = plgpu::axis_index("g"), c = plgpu::axis_index("c");
        const pl::Value part = (g * 2 + c) * kPart;
        mine[pl::all] = x[pl::ds(part, kPart)] * 2.0f;
        plgpu::cluster_ref(theirs, "c", 1 - c)[pl::all] = x[pl::ds(part, kPart)] + 1.0f;
        plgpu::barrier_arrive(bar);
        plgpu::barrier_wait(bar);
        from_peer[pl::ds(part, kPart)] = plgpu::cluster_ref(mine, "c", 1 - c)[pl::all];
        sent_to_me[pl::ds(part, kPart)] = theirs[pl::all];
        plgpu::barrier_arrive(bar);
        plgpu::barrier_wait(bar);
      },
      {pl::ShapeDtype({kGrid * 2 * kPart}, pl::f32), pl::ShapeDtype({kGrid * 2 * kPart}, pl::f32)},
      plgpu::Mesh{.grid = {kGrid}, .grid_names = {"g"}, .cluster = {2}, .cluster_names = {"c"}},
      run_on(GetParam(), {plgpu::SMEM({kPart}, pl::f32), plgpu::SMEM({kPart}, pl::f32),
                          plgpu::ClusterBarrier{.collective_axes = {"c"}}}));
  const pl::Array x = random_f32({kGrid * 2 * kPart}, 1);
  const std::vector<pl::Array> out = call(x);
  for (int64_t g = 0; g < kGrid; ++g)
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t i = 0; i < kPart; ++i) {
        const int64_t at = (g * 2 + c) * kPart + i, peer = (g * 2 + 1 - c) * kPart + i;
        EXPECT_EQ(out[0].data<float>()[at], 2.0f * x.data<float>()[peer]) << at;
        EXPECT_EQ(out[1].data<float>()[at], x.data<float>()[peer] + 1.0f) << at;
      }
}

// A 2 x 2 cluster: cluster_ref along one axis keeps this CTA's place along the other. Each CTA
// writes its (x, y) into its SMEM; it reads its y-neighbour's and its x-neighbour's. Each sync
// point has a barrier of its own: an arrival reaches only the two neighbours, so with one barrier
// a fast neighbour's second arrival could complete a CTA's first phase before its other
// neighbour wrote (an mbarrier counts arrivals, not who made them; host emulation showed it).
TEST_P(ClusterRef, AnIndexAlongOneAxisKeepsThePlaceAlongTheOthers) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref along_y, pl::Ref along_x, pl::Ref id, pl::Ref bar) {
        const pl::Value cx = plgpu::axis_index("x"), cy = plgpu::axis_index("y");
        const pl::Value me = cx * 2 + cy;
        id[pl::all] = pl::broadcast_to(me * 10, {8});
        plgpu::barrier_arrive(bar.at(0));
        plgpu::barrier_wait(bar.at(0));
        along_y[pl::ds(me * 8, 8)] = plgpu::cluster_ref(id, "y", 1 - cy)[pl::all];
        along_x[pl::ds(me * 8, 8)] = plgpu::cluster_ref(id, "x", 1 - cx)[pl::all];
        plgpu::barrier_arrive(bar.at(1));
        plgpu::barrier_wait(bar.at(1));
      },
      {pl::ShapeDtype({32}, pl::i32), pl::ShapeDtype({32}, pl::i32)},
      plgpu::Mesh{.grid = {1}, .grid_names = {"g"}, .cluster = {2, 2}, .cluster_names = {"x", "y"}},
      run_on(GetParam(), {plgpu::SMEM({8}, pl::i32), plgpu::ClusterBarrier{.collective_axes = {"x", "y"}, .num_barriers = 2}}));
  const std::vector<pl::Array> out = call();
  for (int x = 0; x < 2; ++x)
    for (int y = 0; y < 2; ++y)
      for (int i = 0; i < 8; ++i) {
        const int at = (x * 2 + y) * 8 + i;
        EXPECT_EQ(out[0].data<int32_t>()[at], (x * 2 + 1 - y) * 10) << at;
        EXPECT_EQ(out[1].data<int32_t>()[at], ((1 - x) * 2 + y) * 10) << at;
      }
}

// Compiled: the peer's address by mapa (NVRTC for sm_90a; a unit with clusters refuses sm_80
// with its own #error), the index checked when the kernel runs.
TEST(ClusterRefCodegen, ThePeersAddressComesFromMapa) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref out, pl::Ref buf, pl::Ref bar) {
        const pl::Value c = plgpu::axis_index("c");
        buf[pl::all] = pl::full({8}, pl::f32, 1.0);
        plgpu::barrier_arrive(bar);
        plgpu::barrier_wait(bar);
        out[pl::ds(c * 8, 8)] = plgpu::cluster_ref(buf, "c", 1 - c)[pl::all];
        plgpu::barrier_arrive(bar);
        plgpu::barrier_wait(bar);
      },
      {pl::ShapeDtype({16}, pl::f32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"g"}, .cluster = {2}, .cluster_names = {"c"}},
      run_on("gpu_emulate", {plgpu::SMEM({8}, pl::f32), plgpu::ClusterBarrier{.collective_axes = {"c"}}}));
  std::shared_ptr<const pl::TracedCall> tc = call.trace({});
  const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
  EXPECT_CONTAINS(k.source, "= pl_cluster_peer(");
  EXPECT_CONTAINS(k.source, "mapa.u64");
  if (!plgpu::Nvrtc::unavailable_reason().empty()) GTEST_SKIP() << "no NVRTC: " << plgpu::Nvrtc::unavailable_reason();
  EXPECT_TRUE(plgpu::Nvrtc::get().compile(k.source, "cluster_ref.cu", "sm_90a").is_cubin);
  const plgpu::CompiledKernel ptx = plgpu::Nvrtc::get().compile(k.source, "cluster_ref.cu", "compute_90a");
  EXPECT_CONTAINS(std::string(ptx.image.begin(), ptx.image.end()), "mapa.u64");
}

// Without TMA multicast (CodegenOptions::multicast = false, PALLAS_GPU_NO_MULTICAST=1) the peers
// are the same; and a cluster of one CTA is its own peer.
TEST(ClusterRefCodegen, PeersDoNotDependOnMulticastAndAClusterOfOneIsItself) {
  auto kernel = [](int64_t ctas) {
    return plgpu::kernel(
        [ctas](pl::Ref out, pl::Ref buf, pl::Ref bar) {
          const pl::Value c = plgpu::axis_index("c");
          buf[pl::all] = pl::broadcast_to((c + 1).astype(pl::f32), {8});
          plgpu::barrier_arrive(bar);
          plgpu::barrier_wait(bar);
          out[pl::ds(c * 8, 8)] = plgpu::cluster_ref(buf, "c", (c + 1) % ctas)[pl::all];
          plgpu::barrier_arrive(bar);
          plgpu::barrier_wait(bar);
        },
        {pl::ShapeDtype({ctas * 8}, pl::f32)},
        plgpu::Mesh{.grid = {1}, .grid_names = {"g"}, .cluster = {ctas}, .cluster_names = {"c"}},
        run_on("gpu_emulate", {plgpu::SMEM({8}, pl::f32), plgpu::ClusterBarrier{.collective_axes = {"c"}}}));
  };
  for (int64_t ctas : {1, 2}) {
    SCOPED_TRACE(std::to_string(ctas) + " CTAs");
    pl::PallasCall call = kernel(ctas);
    std::shared_ptr<const pl::TracedCall> tc = call.trace({});
    for (bool multicast : {true, false}) {
      const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid, {.multicast = multicast});
      const pl::Array out = plgpu::run_host_emulation(*tc, k, {}, tc->grid_mapping.grid, 2, nullptr).at(0);
      for (int64_t c = 0; c < ctas; ++c)
        for (int i = 0; i < 8; ++i) EXPECT_EQ(out.get({c * 8 + i}), static_cast<double>((c + 1) % ctas + 1)) << c << "," << i;
    }
  }
}

// An index outside the axis: the same message on every backend, naming the line.
TEST_P(ClusterRef, AnIndexOutsideTheAxisIsAnErrorNamingTheLine) {
  const int line = __LINE__ + 4;
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref out, pl::Ref buf) {
        const pl::Value c = plgpu::axis_index("c");
        out[pl::ds(c * 8, 8)] = plgpu::cluster_ref(buf, "c", c + 1)[pl::all];
      },
      {pl::ShapeDtype({16}, pl::f32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"g"}, .cluster = {2}, .cluster_names = {"c"}},
      run_on(GetParam(), {plgpu::SMEM({8}, pl::f32)}));
  const std::string e = test_util::error_of([&] { call(); });
  EXPECT_CONTAINS(e, "cluster_ref: index 2 is outside the cluster axis 'c' of size 2");
  EXPECT_CONTAINS(e, "cluster_ref_test.cpp:" + std::to_string(line));
}

// Without the barrier between the peer's store and this CTA's load, the interpreter reports the
// race (on a GPU the load could see either value).
TEST(ClusterRefErrors, AReadOfThePeersMemoryWithoutTheBarrierRaces) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref out, pl::Ref buf, pl::Ref bar) {
        const pl::Value c = plgpu::axis_index("c");
        buf[pl::all] = pl::full({8}, pl::f32, 1.0);
        out[pl::ds(c * 8, 8)] = plgpu::cluster_ref(buf, "c", 1 - c)[pl::all];
        plgpu::barrier_arrive(bar);
        plgpu::barrier_wait(bar);
      },
      {pl::ShapeDtype({16}, pl::f32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"g"}, .cluster = {2}, .cluster_names = {"c"}},
      run_on("interpret", {plgpu::SMEM({8}, pl::f32), plgpu::ClusterBarrier{.collective_axes = {"c"}}}));
  EXPECT_CONTAINS(test_util::error_of([&] { call(); }), "gpu::kernel data race");
}

// What cluster_ref refuses, each naming the line: a kernel without clusters, an unknown axis, a
// barrier, a run_scoped array, and the ops that do not take a peer's memory.
TEST(ClusterRefErrors, MisusesNameTheLine) {
  const plgpu::Mesh clustered{.grid = {1}, .grid_names = {"g"}, .cluster = {2}, .cluster_names = {"c"}};
  auto error_of = [&](const plgpu::Mesh& mesh, const std::function<void(pl::Ref, pl::Ref, pl::Ref)>& body) {
    return test_util::error_of([&] {
      plgpu::kernel([&](pl::Ref x, pl::Ref out, pl::Ref buf, pl::Ref bar) { body(x, buf, bar), (void)out; },
                    {pl::ShapeDtype({8}, pl::f32)}, mesh,
                    run_on("interpret", {plgpu::SMEM({8}, pl::f32), plgpu::Barrier{}}))(random_f32({8}, 2));
    });
  };
  int line = __LINE__ + 1;
  std::string e = error_of(plgpu::Mesh{.grid = {2}, .grid_names = {"g"}}, [](pl::Ref, pl::Ref buf, pl::Ref) { plgpu::cluster_ref(buf, "g", 0); });
  EXPECT_CONTAINS(e, "cluster_ref: only a gpu::kernel whose mesh has cluster axes has peer CTAs");
  EXPECT_CONTAINS(e, "cluster_ref_test.cpp:" + std::to_string(line));
  EXPECT_CONTAINS(error_of(clustered, [](pl::Ref, pl::Ref buf, pl::Ref) { plgpu::cluster_ref(buf, "g", 0); }),
                  "cluster_ref: the collective axis 'g' is not a cluster axis of the mesh (cluster axes: c)");
  EXPECT_CONTAINS(error_of(clustered, [](pl::Ref, pl::Ref, pl::Ref bar) { plgpu::cluster_ref(bar, "c", 0); }),
                  "the Ref must be an SMEM array (a barrier reaches its peers as a gpu::ClusterBarrier)");
  line = __LINE__ + 2;
  e = error_of(clustered, [](pl::Ref, pl::Ref buf, pl::Ref) {
    plgpu::cluster_ref(plgpu::cluster_ref(buf, "c", 0), "c", 1)[pl::all] = pl::zeros({8}, pl::f32);
  });
  EXPECT_CONTAINS(e, "cluster_ref of a cluster_ref");
  EXPECT_CONTAINS(e, "cluster_ref_test.cpp:" + std::to_string(line));
  line = __LINE__ + 2;
  e = error_of(clustered, [](pl::Ref x, pl::Ref buf, pl::Ref bar) {
    plgpu::copy_gmem_to_smem(x, plgpu::cluster_ref(buf, "c", 0), bar);
  });
  EXPECT_CONTAINS(e, "gpu_copy_gmem_to_smem on a cluster_ref (another CTA's shared memory): only loads, stores and atomics");
  EXPECT_CONTAINS(e, "cluster_ref_test.cpp:" + std::to_string(line));
  EXPECT_CONTAINS(error_of(clustered,
                           [](pl::Ref, pl::Ref, pl::Ref) {
                             pl::run_scoped({plgpu::SMEM({8}, pl::f32)}, [](std::vector<pl::Ref> s) {
                               plgpu::cluster_ref(s[0], "c", 0)[pl::all] = pl::zeros({8}, pl::f32);
                               return std::vector<pl::Value>{};
                             });
                           }),
                  "cluster_ref of a run_scoped array");
}

}  // namespace
