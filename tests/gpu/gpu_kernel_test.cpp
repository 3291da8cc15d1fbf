// gpu::kernel (plgpu.kernel) in the interpreter: meshes of CTAs, clusters and Pallas threads,
// copies through shared memory on barriers, warp-specialized producer/consumer pipelines, wgmma,
// and the errors for misuse (deadlocks, lost barrier phases, shared memory, shapes). Values are
// checked against plain C++ loops.
#include <functional>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <regex>
#include <tuple>

#include "core/call.h"
#include "gpu/codegen.h"
#include "gpu/cuda_libs.h"
#include "gpu/host_emulation.h"
#include "pallas/gpu.h"
#include "pallas/pallas.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

namespace pl = pallas;
namespace plgpu = pallas::gpu;
using test_util::error_of;

namespace {

using test_util::random_f32;

// A generated unit with wgmma compiles with NVRTC for sm_90a and sm_80, and its sm_90a SASS has
// HGMMA. Returns why it could not check ("": checked).
std::string check_compiles_to_hgmma(const std::string& source, const char* name) {
  if (std::string why = pl::gpu::Nvrtc::unavailable_reason(); !why.empty()) return why;
  for (const char* arch : {"sm_90a", "sm_80"}) EXPECT_NO_THROW(pl::gpu::Nvrtc::get().compile(source, name, arch)) << arch;
  if (test_util::find_cuobjdump().empty()) return "no cuobjdump (run scripts/get_cuda_tools.sh)";
  EXPECT_CONTAINS(test_util::sass_of(source, "sm_90a"), "HGMMA");
  return "";
}

// The run_scoped arrays a generated unit keeps in wgmma's 128-byte swizzle (their macros).
std::ptrdiff_t swizzled_scope_arrays(const std::string& source) {
  const std::regex macro(R"(#define PL_SMEM_SWIZZLED_V\d+ \(PL_HAS_WGMMA \? 128 : 0\))");
  return std::distance(std::sregex_iterator(source.begin(), source.end(), macro), std::sregex_iterator());
}

// out (m x n, f32) is the product of a (m x k) and b (k x n): a plain double-precision loop over
// the inputs' values.
void expect_product_of(const pl::Array& a, const pl::Array& b, const pl::Array& out) {
  const int64_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
  ASSERT_EQ(out.shape(), pl::Shape({m, n}));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double want = 0;
      for (int64_t q = 0; q < k; ++q) want += a.get({i, q}) * b.get({q, j});
      EXPECT_NEAR(out.get({i, j}), want, 1e-4 * (1 + std::abs(want))) << i << "," << j;
    }
}

pl::CallOptions interpreted(std::vector<pl::ScratchShape> scratch) {
  pl::CallOptions o;
  o.scratch_shapes = std::move(scratch);
  o.interpret = true;
  return o;
}

// The kernels that both run in the interpreter and compile: "interpret", "gpu_emulate" (two
// host threads per Pallas thread), or "mosaic_gpu" (a GPU: skipped, saying why, where there is
// none; scripts/gpu_validate.sh).
using test_util::run_on;

// A copy of k whose source has `from` (which it must contain) replaced by `to` once: a test's
// deliberately broken or differently built unit.
plgpu::GeneratedKernel with_source_edit(const plgpu::GeneratedKernel& k, const std::string& from, const std::string& to) {
  plgpu::GeneratedKernel edited = k;
  const size_t at = edited.source.find(from);
  EXPECT_NE(at, std::string::npos) << "missing '" << from << "'";
  if (at != std::string::npos) edited.source.replace(at, from.size(), to);
  return edited;
}

// The opening of the ACC tests' kernels: a and b copied into a_s and b_s on `bar` and awaited,
// then acc = 0 and a wgmma of acc += a_s b_s, left running.
void zeroed_product(const pl::Ref& a, const pl::Ref& b, const pl::Ref& a_s, const pl::Ref& b_s, const pl::Ref& acc,
                    const pl::Ref& bar) {
  plgpu::copy_gmem_to_smem(a, a_s, bar);
  plgpu::copy_gmem_to_smem(b, b_s, bar);
  plgpu::barrier_wait(bar);
  acc[pl::all] = pl::zeros(acc.shape(), pl::f32);
  plgpu::wgmma(acc, a_s, b_s);
}

class GpuKernelBoth : public test_util::OnGpuBackends {};
INSTANTIATE_TEST_SUITE_P(Backends, GpuKernelBoth, testing::Values("interpret", "gpu_emulate", "mosaic_gpu"),
                         test_util::backend_name);

// async_prefetch (an L2 hint) of a CTA's chunk — rows of lines — and of a transposed view (each
// element's line) changes nothing: the copies that follow see x. Compiled: prefetch.global.L2.
TEST_P(GpuKernelBoth, AsyncPrefetchChangesNoValue) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref out, pl::Ref x_s, pl::Ref bar) {
        const pl::Value b = pl::program_id(0);
        plgpu::async_prefetch(x.at(pl::ds(b * 8, 8), pl::all));
        plgpu::async_prefetch(x.T().at(pl::all, pl::ds(b * 8, 8)));
        plgpu::copy_gmem_to_smem(x.at(pl::ds(b * 8, 8), pl::all), x_s, bar);
        plgpu::barrier_wait(bar);
        out.at(pl::ds(b * 8, 8), pl::all)[pl::all] = x_s[pl::all] + 1.0f;
      },
      {pl::ShapeDtype({16, 64}, pl::f32)}, plgpu::Mesh{.grid = {2}, .grid_names = {"b"}},
      run_on(GetParam(), {plgpu::SMEM({8, 64}, pl::f32), plgpu::Barrier{}}));
  const pl::Array x = random_f32({16, 64}, 41);
  const pl::Array out = call(x).at(0);
  for (int64_t e = 0; e < x.size(); ++e) EXPECT_EQ(out.data<float>()[e], x.data<float>()[e] + 1.0f) << e;
  if (GetParam() != "gpu_emulate") return;
  std::shared_ptr<const pl::TracedCall> tc = call.trace({x.shape_dtype()});
  const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
  EXPECT_CONTAINS(k.source, "pl_prefetch_l2(");
  if (!plgpu::Nvrtc::unavailable_reason().empty()) return;
  for (const char* arch : {"sm_90a", "sm_80"}) EXPECT_TRUE(plgpu::Nvrtc::get().compile(k.source, "prefetch.cu", arch).is_cubin) << arch;
  const plgpu::CompiledKernel ptx = plgpu::Nvrtc::get().compile(k.source, "prefetch.cu", "compute_90a");
  EXPECT_CONTAINS(std::string(ptx.image.begin(), ptx.image.end()), "prefetch.global.L2");
}

// With collective_axes the cluster's CTAs split the lines (Mosaic GPU's async_prefetch with
// collective_axes): CTA r of the 2-CTA cluster prefetches lines r, r + 2, ... of the whole x,
// which both then read. Values unchanged; compiled, the loop starts at the CTA's rank along "c".
TEST_P(GpuKernelBoth, AsyncPrefetchWithCollectiveAxesSplitsTheLines) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref out) {
        plgpu::async_prefetch(x, {"c"});
        const pl::Value r = plgpu::axis_index("g") * 2 + plgpu::axis_index("c");
        out.at(pl::ds(r * 4, 4), pl::all)[pl::all] = x.at(pl::ds(r * 4, 4), pl::all)[pl::all] * 2.0f;
      },
      {pl::ShapeDtype({16, 64}, pl::f32)},
      plgpu::Mesh{.grid = {2}, .grid_names = {"g"}, .cluster = {2}, .cluster_names = {"c"}}, run_on(GetParam(), {}));
  const pl::Array x = random_f32({16, 64}, 43);
  const pl::Array out = call(x).at(0);
  for (int64_t e = 0; e < x.size(); ++e) EXPECT_EQ(out.data<float>()[e], 2.0f * x.data<float>()[e]) << e;
  if (GetParam() != "gpu_emulate") return;
  std::shared_ptr<const pl::TracedCall> tc = call.trace({x.shape_dtype()});
  const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
  // 16 rows of 2 lines (64 f32 = 256 bytes), every other line from this CTA's rank on.
  EXPECT_CONTAINS(k.source, "for (pl_i64 e = (pl_cluster_rank() / 1 % 2) + pl_tid() * 2LL; e < 32; e += pl_nthreads() * 2LL) {");
  if (!plgpu::Nvrtc::unavailable_reason().empty()) return;
  EXPECT_TRUE(plgpu::Nvrtc::get().compile(k.source, "prefetch.cu", "sm_90a").is_cubin);
}

TEST(GpuKernelErrors, AsyncPrefetchTakesGmemInAGpuKernel) {
  int line = __LINE__ + 2;
  std::string e = test_util::error_of([] {
    plgpu::kernel([](pl::Ref out, pl::Ref s) { plgpu::async_prefetch(s), (void)out; }, {pl::ShapeDtype({8}, pl::f32)},
                  plgpu::Mesh{.grid = {1}, .grid_names = {"b"}}, interpreted({plgpu::SMEM({8}, pl::f32)}))();
  });
  EXPECT_CONTAINS(e, "the prefetched Ref must be a Ref in gmem");
  EXPECT_CONTAINS(e, "gpu_kernel_test.cpp:" + std::to_string(line));
  line = __LINE__ + 1;
  e = test_util::error_of([] { pl::pallas_call([](pl::Ref x, pl::Ref) { plgpu::async_prefetch(x); }, pl::ShapeDtype({8}, pl::f32), {.interpret = true})(random_f32({8}, 1)); });
  EXPECT_CONTAINS(e, "async_prefetch: only a gpu::kernel's body prefetches");
  EXPECT_CONTAINS(e, "gpu_kernel_test.cpp:" + std::to_string(line));
  line = __LINE__ + 2;
  e = test_util::error_of([] {
    plgpu::kernel([](pl::Ref x, pl::Ref out) { plgpu::async_prefetch(x, {"b"}), (void)out; }, {pl::ShapeDtype({8}, pl::f32)},
                  plgpu::Mesh{.grid = {1}, .grid_names = {"b"}}, interpreted({}))(random_f32({8}, 1));
  });
  EXPECT_CONTAINS(e, "async_prefetch: the collective axis 'b' is not a cluster axis of the mesh (cluster axes: none)");
  EXPECT_CONTAINS(e, "gpu_kernel_test.cpp:" + std::to_string(line));
}

// out = 2 x, one 128-element chunk per CTA: copy in on a barrier, compute in SMEM, copy out.
TEST_P(GpuKernelBoth, CopiesThroughSharedMemoryOnBarriers) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref out, pl::Ref buf, pl::Ref bar) {
        pl::Value b = plgpu::axis_index("b");
        plgpu::copy_gmem_to_smem(x.at(pl::ds(b * 128, 128)), buf, bar);
        plgpu::barrier_wait(bar);
        buf[pl::all] = buf[pl::all] * 2.0f;
        plgpu::commit_smem();
        plgpu::copy_smem_to_gmem(buf, out.at(pl::ds(b * 128, 128)));
        plgpu::wait_smem_to_gmem(0);
      },
      {pl::ShapeDtype({1024}, pl::f32)}, plgpu::Mesh{.grid = {8}, .grid_names = {"b"}},
      run_on(GetParam(), {plgpu::SMEM({128}, pl::f32), plgpu::Barrier{}}));
  pl::Array x = random_f32({1024}, 1);
  pl::Array out = call(x).at(0);
  for (int64_t i = 0; i < 1024; ++i) EXPECT_EQ(out.data<float>()[i], 2.0f * x.data<float>()[i]) << i;
}

// Three copies land on one barrier (3 arrivals): rows of whole 16-byte chunks at an aligned
// address (compiled: a TMA box on sm_90 and in host emulation, else bulk copies), the same rows
// one element to the right (a TMA box too; without TMA not 16-byte aligned: the group copies the
// elements) and rows of 12 bytes (never TMA or bulk).
pl::PallasCall copies_of_every_alignment(const std::string& how) {
  constexpr int64_t kRows = 4;
  return plgpu::kernel(
      [](pl::Ref x, pl::Ref out_a, pl::Ref out_b, pl::Ref out_c, pl::Ref a, pl::Ref b, pl::Ref c, pl::Ref bar) {
        pl::Value r0 = plgpu::axis_index("i") * kRows;
        plgpu::copy_gmem_to_smem(x.at(pl::ds(r0, kRows), pl::ds(0, 8)), a, bar);
        plgpu::copy_gmem_to_smem(x.at(pl::ds(r0, kRows), pl::ds(1, 8)), b, bar);
        plgpu::copy_gmem_to_smem(x.at(pl::ds(r0, kRows), pl::ds(0, 3)), c, bar);
        plgpu::barrier_wait(bar);
        out_a.at(pl::ds(r0, kRows), pl::all)[pl::all] = a[pl::all];
        out_b.at(pl::ds(r0, kRows), pl::all)[pl::all] = b[pl::all];
        out_c.at(pl::ds(r0, kRows), pl::all)[pl::all] = c[pl::all];
      },
      {pl::ShapeDtype({3 * kRows, 8}, pl::f32), pl::ShapeDtype({3 * kRows, 8}, pl::f32),
       pl::ShapeDtype({3 * kRows, 3}, pl::f32)},
      plgpu::Mesh{.grid = {3}, .grid_names = {"i"}},
      run_on(how, {plgpu::SMEM({kRows, 8}, pl::f32), plgpu::SMEM({kRows, 8}, pl::f32), plgpu::SMEM({kRows, 3}, pl::f32),
                   plgpu::Barrier{.num_arrivals = 3}}));
}

// What copies_of_every_alignment writes for x (12 x 20): its copies of x's rows, column 0 on, 1 on,
// and the first 3 columns.
void expect_copies_of_every_alignment(const pl::Array& x, const std::vector<pl::Array>& out) {
  for (int64_t r = 0; r < 12; ++r) {
    for (int64_t c = 0; c < 8; ++c) {
      EXPECT_EQ(out[0].get({r, c}), x.get({r, c})) << r << "," << c;
      EXPECT_EQ(out[1].get({r, c}), x.get({r, c + 1})) << r << "," << c;
    }
    for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(out[2].get({r, c}), x.get({r, c})) << r << "," << c;
  }
}

TEST_P(GpuKernelBoth, CopiesOfEveryAlignmentLandOnTheBarrier) {
  pl::Array x = random_f32({12, 20}, 9);
  expect_copies_of_every_alignment(x, copies_of_every_alignment(GetParam())(x));
}

TEST(GpuKernel, CopiesOfWhole16ByteRowsCompileToBulkCopies) {
  pl::PallasCall call = copies_of_every_alignment("mosaic_gpu");
  std::shared_ptr<const pl::TracedCall> tc = call.trace({pl::ShapeDtype({12, 20}, pl::f32)});
  const std::string src = plgpu::generate_cuda(*tc, tc->grid_mapping.grid).source;
  size_t bulk = 0;
  const std::string call_site = "if (pl_tid() == 0) pl_bulk_copy_rows(";
  for (size_t at = src.find(call_site); at != std::string::npos; at = src.find(call_site, at + 1)) ++bulk;
  EXPECT_EQ(bulk, 2u);  // the 12-byte rows are never bulk copies
  EXPECT_CONTAINS(src, ", 80, 4, 32u, ");  // source rows 80 bytes apart, 4 rows of 32 bytes
  // The barriers' init is fenced for the copies completing on them (the async proxy), clusters or not.
  EXPECT_CONTAINS(src, "if (pl_cta_tid() == 0) pl_fence_mbar_init();");
  // After a failed point the copies still landing on the barriers land before they are invalidated.
  const size_t settle = src.find("pl_mbar_settle(pl_mbar, "), inval = src.find("pl_mbar_inval(pl_mbar + i)");
  ASSERT_NE(settle, std::string::npos);
  EXPECT_LT(settle, inval);
  if (std::string why = pl::gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  for (const char* arch : {"sm_90a", "sm_80"}) EXPECT_NO_THROW(pl::gpu::Nvrtc::get().compile(src, "bulk.cu", arch)) << arch;
  const pl::gpu::CompiledKernel ptx = pl::gpu::Nvrtc::get().compile(src, "bulk.cu", "compute_90a");
  EXPECT_CONTAINS(std::string(ptx.image.begin(), ptx.image.end()), "fence.mbarrier_init.release.cluster");
  // The machine code has the bulk copies (UBLKCP, shared <- global) and the expect-tx arrival.
  if (test_util::find_cuobjdump().empty()) GTEST_SKIP() << "no cuobjdump (run scripts/get_cuda_tools.sh)";
  const std::string sass = test_util::sass_of(src, "sm_90a");
  EXPECT_CONTAINS(sass, "UBLKCP.S.G");
  EXPECT_CONTAINS(sass, "SYNCS.ARRIVE.TRANS");
}

// Host emulation lands a bulk copy into SMEM only when a thread tests its barrier (reading the
// source then), and its destination reads as all ones before: the same generated source with the
// barrier_wait taken out reads NaN where the asynchronous copies go. With TMA (the default) those
// are the boxes a and b (coordinates need no alignment); without it (CodegenOptions::tma = false)
// a's bulk copies by rows, and b, not 16-byte aligned, is copied by the group at once — as the
// 12-byte rows of c always are.
TEST(GpuKernel, HostEmulationLandsABulkCopyOnlyWhenItsBarrierIsAwaited) {
  pl::PallasCall call = copies_of_every_alignment("mosaic_gpu");
  std::shared_ptr<const pl::TracedCall> tc = call.trace({pl::ShapeDtype({12, 20}, pl::f32)});
  pl::Array x = random_f32({12, 20}, 11);
  for (bool tma : {true, false}) {
    SCOPED_TRACE(tma ? "TMA" : "no TMA");
    plgpu::CodegenOptions options;
    options.tma = tma;
    const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid, options);
    EXPECT_EQ(k.tensor_maps.size(), tma ? 1u : 0u);
    plgpu::GeneratedKernel no_wait = k;
    const std::string wait = "pl_group_all(pl_mbar_wait(";
    const size_t at = no_wait.source.find(wait);
    ASSERT_NE(at, std::string::npos);
    no_wait.source.replace(at, wait.size(), "pl_group_all(true || pl_mbar_wait(");
    for (bool waits : {true, false}) {
      std::vector<pl::Array> out = plgpu::run_host_emulation(*tc, waits ? k : no_wait, {x}, tc->grid_mapping.grid, 2);
      for (int64_t r = 0; r < 12; ++r) {
        for (int64_t c = 0; c < 8; ++c) {
          if (waits) {
            EXPECT_EQ(out[0].get({r, c}), x.get({r, c})) << r << "," << c;
          } else {
            EXPECT_TRUE(std::isnan(out[0].get({r, c}))) << r << "," << c;
          }
          if (waits || !tma) {
            EXPECT_EQ(out[1].get({r, c}), x.get({r, c + 1})) << r << "," << c;
          } else {
            EXPECT_TRUE(std::isnan(out[1].get({r, c}))) << r << "," << c;
          }
        }
        for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(out[2].get({r, c}), x.get({r, c})) << r << "," << c;
      }
    }
  }
}

// Three copies to GMEM, each one group of wait_smem_to_gmem: rows of whole 16-byte chunks at
// aligned addresses (compiled: bulk copies on sm_90 and in host emulation, asynchronous until the
// wait), the same rows to a destination one element to the right (the group copies the elements
// at run time) and rows of 12 bytes (never bulk). wait_smem_to_gmem(2, read_only) must have
// retired the first copy's reads, so overwriting its source is safe — unless a copy that was not
// a bulk copy failed to count as a group (host emulation would then copy the overwritten values).
pl::PallasCall copies_to_gmem_of_every_alignment(const std::string& how) {
  constexpr int64_t kRows = 4;
  return plgpu::kernel(
      [](pl::Ref x, pl::Ref out_a, pl::Ref out_b, pl::Ref out_c, pl::Ref a, pl::Ref b, pl::Ref c) {
        pl::Value r0 = plgpu::axis_index("i") * kRows;
        a[pl::all] = x.at(pl::ds(r0, kRows), pl::ds(0, 8))[pl::all];
        b[pl::all] = x.at(pl::ds(r0, kRows), pl::ds(8, 8))[pl::all];
        c[pl::all] = x.at(pl::ds(r0, kRows), pl::ds(0, 3))[pl::all];
        plgpu::commit_smem();
        plgpu::copy_smem_to_gmem(a, out_a.at(pl::ds(r0, kRows), pl::all));
        plgpu::copy_smem_to_gmem(b, out_b.at(pl::ds(r0, kRows), pl::ds(1, 8)));
        plgpu::copy_smem_to_gmem(c, out_c.at(pl::ds(r0, kRows), pl::all));
        plgpu::wait_smem_to_gmem(2, /*wait_read_only=*/true);
        a[pl::all] = a[pl::all] * -1.0f;
        plgpu::wait_smem_to_gmem(0);
      },
      {pl::ShapeDtype({3 * kRows, 8}, pl::f32), pl::ShapeDtype({3 * kRows, 12}, pl::f32),
       pl::ShapeDtype({3 * kRows, 3}, pl::f32)},
      plgpu::Mesh{.grid = {3}, .grid_names = {"i"}},
      run_on(how, {plgpu::SMEM({kRows, 8}, pl::f32), plgpu::SMEM({kRows, 8}, pl::f32), plgpu::SMEM({kRows, 3}, pl::f32)}));
}

// What copies_to_gmem_of_every_alignment writes for x (12 x 20): x's first 8 columns, the next 8
// one column to the right, and the first 3.
void expect_copies_to_gmem_of_every_alignment(const pl::Array& x, const std::vector<pl::Array>& out) {
  for (int64_t r = 0; r < 12; ++r) {
    for (int64_t c = 0; c < 8; ++c) {
      EXPECT_EQ(out[0].get({r, c}), x.get({r, c})) << r << "," << c;
      EXPECT_EQ(out[1].get({r, c + 1}), x.get({r, c + 8})) << r << "," << c;
    }
    for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(out[2].get({r, c}), x.get({r, c})) << r << "," << c;
  }
}

TEST_P(GpuKernelBoth, CopiesToGmemOfEveryAlignmentAreOneGroupEach) {
  pl::Array x = random_f32({12, 20}, 10);
  expect_copies_to_gmem_of_every_alignment(x, copies_to_gmem_of_every_alignment(GetParam())(x));
}

TEST(GpuKernel, CopiesToGmemOfWhole16ByteRowsCompileToBulkCopies) {
  pl::PallasCall call = copies_to_gmem_of_every_alignment("mosaic_gpu");
  std::shared_ptr<const pl::TracedCall> tc = call.trace({pl::ShapeDtype({12, 20}, pl::f32)});
  const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
  EXPECT_EQ(k.bulk_stores, 2);  // the 12-byte rows are never bulk copies
  EXPECT_CONTAINS(k.source, ", 48, (");  // destination rows 48 bytes apart (out_b)
  EXPECT_CONTAINS(k.source, "pl_bulk_store_wait<2, true>()");
  EXPECT_CONTAINS(k.source, "if (pl_tid() == 0) { pl_bulk_store_commit(); pl_bulk_store_wait<0, false>(); }\n  pl_cta_sync();");  // the CTA's end
  if (std::string why = pl::gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  const pl::gpu::CompiledKernel ptx = pl::gpu::Nvrtc::get().compile(k.source, "bulk.cu", "compute_90a");
  const std::string text(ptx.image.begin(), ptx.image.end());
  EXPECT_CONTAINS(text, "cp.async.bulk.global.shared::cta.bulk_group");
  EXPECT_CONTAINS(text, "cp.async.bulk.wait_group.read 2");
  for (const char* arch : {"sm_90a", "sm_80"}) EXPECT_NO_THROW(pl::gpu::Nvrtc::get().compile(k.source, "bulk.cu", arch)) << arch;
  // The machine code has the bulk copies (UBLKCP, global <- shared).
  if (test_util::find_cuobjdump().empty()) GTEST_SKIP() << "no cuobjdump (run scripts/get_cuda_tools.sh)";
  EXPECT_CONTAINS(test_util::sass_of(k.source, "sm_90a"), "UBLKCP.G.S");
}

// On sm_90 a copy of a box of an operand goes by TMA (cp.async.bulk.tensor) when the box's rows
// are whole 16-byte chunks and its shared memory side is dense: one instruction per copy, through
// a tensor map per operand and box (maps shared between copies of the same box shape). Box
// coordinates need no alignment, so the copy one element to the right is a box too. Checked: the
// maps (by hand), one box per copy and CTA in host emulation, the results, and the machine code
// (UTMALDG, UTMASTG). The 12-byte rows never go by TMA.
TEST(GpuKernel, CopiesOfBoxesOfOperandsGoByTma) {
  // The map of f32 boxes of operand `operand` (dims, byte strides, box: innermost first).
  auto f32_map = [](int operand, std::vector<uint64_t> dims, std::vector<uint64_t> strides, std::vector<uint32_t> box) {
    return plgpu::TensorMapSpec{operand, 4, std::move(dims), std::move(strides), std::move(box)};
  };
  const pl::Array x = random_f32({12, 20}, 12);
  std::shared_ptr<const pl::TracedCall> to_smem = copies_of_every_alignment("mosaic_gpu").trace({x.shape_dtype()});
  std::shared_ptr<const pl::TracedCall> to_gmem = copies_to_gmem_of_every_alignment("mosaic_gpu").trace({x.shape_dtype()});
  const plgpu::GeneratedKernel load = plgpu::generate_cuda(*to_smem, to_smem->grid_mapping.grid);
  const plgpu::GeneratedKernel store = plgpu::generate_cuda(*to_gmem, to_gmem->grid_mapping.grid);
  ASSERT_EQ(load.tensor_maps.size(), 1u);  // a and b: boxes of 8 x 4 of x
  EXPECT_EQ(load.tensor_maps[0], f32_map(0, {20, 12}, {80}, {8, 4}));
  ASSERT_EQ(store.tensor_maps.size(), 2u);  // out_a's and out_b's
  EXPECT_EQ(store.tensor_maps[0], f32_map(1, {8, 12}, {32}, {8, 4}));
  EXPECT_EQ(store.tensor_maps[1], f32_map(2, {12, 12}, {48}, {8, 4}));
  auto count_of = [](const std::string& text, const std::string& what) {
    int n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count_of(load.source, "pl_tma_load<2>("), 2);
  EXPECT_EQ(count_of(store.source, "pl_tma_store<2>("), 2);
  plgpu::HostEmulationStats loads, stores;
  std::vector<pl::Array> a = plgpu::run_host_emulation(*to_smem, load, {x}, to_smem->grid_mapping.grid, 2, &loads);
  std::vector<pl::Array> b = plgpu::run_host_emulation(*to_gmem, store, {x}, to_gmem->grid_mapping.grid, 2, &stores);
  EXPECT_EQ(loads.tma_boxes, 6);  // 3 CTAs x 2 copies
  EXPECT_EQ(stores.tma_boxes, 6);
  expect_copies_of_every_alignment(x, a);
  expect_copies_to_gmem_of_every_alignment(x, b);
  if (std::string why = pl::gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  for (const char* arch : {"sm_90a", "sm_80"}) {
    EXPECT_NO_THROW(pl::gpu::Nvrtc::get().compile(load.source, "tma.cu", arch)) << arch;
    EXPECT_NO_THROW(pl::gpu::Nvrtc::get().compile(store.source, "tma.cu", arch)) << arch;
  }
  if (test_util::find_cuobjdump().empty()) GTEST_SKIP() << "no cuobjdump (run scripts/get_cuda_tools.sh)";
  EXPECT_CONTAINS(test_util::sass_of(load.source, "sm_90a"), "UTMALDG.2D");
  EXPECT_CONTAINS(test_util::sass_of(store.source, "sm_90a"), "UTMASTG.2D");
}

// A consumer may test the barrier between the producer's expect-tx arrival and its TMA copy. On
// the GPU the phase then still waits for the box's bytes (the transaction count); host emulation
// keeps that count too. Shown by the generated source with a pause between the two: the consumer
// warpgroup still reads the landed box (2 x), not the scratch before it (NaN).
TEST(GpuKernel, AnExpectTxArrivalWaitsForItsBytesInHostEmulation) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref out, pl::Ref buf, pl::Ref bar) {
        pl::Value b = plgpu::axis_index("b"), wg = plgpu::axis_index("wg");
        pl::when(wg == 0, [&] { plgpu::copy_gmem_to_smem(x.at(pl::ds(b * 128, 128)), buf, bar); });
        pl::when(wg == 1, [&] {
          plgpu::barrier_wait(bar);
          out.at(pl::ds(b * 128, 128))[pl::all] = buf[pl::all] * 2.0f;
        });
      },
      {pl::ShapeDtype({256}, pl::f32)},
      plgpu::Mesh{.grid = {2}, .grid_names = {"b"}, .num_threads = 2, .thread_name = "wg"},
      run_on("mosaic_gpu", {plgpu::SMEM({128}, pl::f32), plgpu::Barrier{}}));
  const pl::Array x = random_f32({256}, 13);
  std::shared_ptr<const pl::TracedCall> tc = call.trace({x.shape_dtype()});
  plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
  const std::string issue = "pl_tma_load<1>(";
  const size_t at = k.source.find(issue);
  ASSERT_NE(at, std::string::npos);
  k.source.insert(at, "std::this_thread::sleep_for(std::chrono::milliseconds(30)); ");
  plgpu::HostEmulationStats stats;
  const pl::Array out = plgpu::run_host_emulation(*tc, k, {x}, tc->grid_mapping.grid, 4, &stats)[0];
  EXPECT_EQ(stats.tma_boxes, 2);
  for (int64_t i = 0; i < 256; ++i) EXPECT_EQ(out.data<float>()[i], 2.0f * x.data<float>()[i]) << i;
}

// A gpu::kernel's SMEM scratch is shared memory whatever its size up to the device's limit (its
// copies are bulk and TMA copies into shared memory, its mbarriers wait on them), not only up
// to the budget past which a pallas_call's arena moves to global memory (96 KiB).
TEST(GpuKernel, SharedMemoryScratchStaysInSharedMemoryUpToTheLimit) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref out, pl::Ref buf, pl::Ref bar) {
        plgpu::copy_gmem_to_smem(x, buf, bar);
        plgpu::barrier_wait(bar);
        out.at(pl::ds(0, 64))[pl::all] = buf.at(pl::ds(32704, 64))[pl::all];
      },
      {pl::ShapeDtype({64}, pl::f32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"b"}},
      run_on("mosaic_gpu", {plgpu::SMEM({32768}, pl::f32), plgpu::Barrier{}}));  // 128 KiB
  const pl::Array x = random_f32({32768}, 14);
  std::shared_ptr<const pl::TracedCall> tc = call.trace({x.shape_dtype()});
  const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
  EXPECT_TRUE(k.arena_in_shared);
  EXPECT_GE(k.dynamic_shared_bytes(true), 128 * 1024);
  const pl::Array out = plgpu::run_host_emulation(*tc, k, {x}, tc->grid_mapping.grid, 2)[0];
  for (int64_t i = 0; i < 64; ++i) EXPECT_EQ(out.data<float>()[i], x.data<float>()[32704 + i]) << i;
  // 224 KiB of scratch passes the scratch's own check (227 KiB), but with a 16 KiB tile of the
  // body beside it the CTA's shared memory would not hold both: an error, not global memory.
  pl::PallasCall big = plgpu::kernel(
      [](pl::Ref out, pl::Ref buf) {
        pl::Value v = buf.at(pl::ds(0, 4096))[pl::all];
        out[pl::all] = v + pl::sum(v, {0});
      },
      {pl::ShapeDtype({4096}, pl::f32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"b"}},
      run_on("mosaic_gpu", {plgpu::SMEM({57344}, pl::f32)}));
  std::shared_ptr<const pl::TracedCall> bt = big.trace({});
  const std::string e = error_of([&] { plgpu::generate_cuda(*bt, bt->grid_mapping.grid); });
  EXPECT_CONTAINS(e, "gpu::kernel exceeds available shared memory");
  EXPECT_CONTAINS(e, "a CTA may use at most 232448");
  EXPECT_CONTAINS(e, "gpu_kernel_test.cpp:");
}

// The largest SMEM scratch a kernel with one barrier is generated for leaves room for the static
// shared memory as ptxas lays it out: the barrier's 8 bytes padded to the 128-byte boundary where
// dynamic shared memory starts (without TMA the arena is in 16-byte steps, so 8 bytes of barrier
// beside it would pass a check that counted them as 8, and the launch's cuFuncSetAttribute fail).
TEST(GpuKernelErrors, TheSharedMemoryCheckCountsTheBarriersPadding) {
  plgpu::CodegenOptions no_tma;
  no_tma.tma = false;
  auto generated = [&](int64_t floats) -> std::optional<plgpu::GeneratedKernel> {
    try {  // (the kernel's own check counts the scratch alone; the generator's the whole CTA)
      pl::PallasCall call = plgpu::kernel(
          [](pl::Ref x, pl::Ref out, pl::Ref buf, pl::Ref bar) {
            plgpu::copy_gmem_to_smem(x, buf.at(pl::ds(0, 64)), bar);
            plgpu::barrier_wait(bar);
            out[pl::all] = buf.at(pl::ds(0, 64))[pl::all];
          },
          {pl::ShapeDtype({64}, pl::f32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"b"}},
          run_on("mosaic_gpu", {plgpu::SMEM({floats}, pl::f32), plgpu::Barrier{}}));
      std::shared_ptr<const pl::TracedCall> tc = call.trace({pl::ShapeDtype({64}, pl::f32)});
      return plgpu::generate_cuda(*tc, tc->grid_mapping.grid, no_tma);
    } catch (const pl::Error& e) {
      EXPECT_CONTAINS(std::string(e.what()), "exceeds available shared memory");
      return std::nullopt;
    }
  };
  int64_t lo = 64, hi = 227 * 1024 / 4;  // generated for lo floats, not for hi
  ASSERT_TRUE(generated(lo).has_value());
  ASSERT_FALSE(generated(hi).has_value());
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    (generated(mid) ? lo : hi) = mid;
  }
  const plgpu::GeneratedKernel k = *generated(lo);
  EXPECT_TRUE(k.arena_in_shared);
  EXPECT_LE(k.dynamic_shared_bytes(true) + 128, 227 * 1024);  // 128: one barrier, padded
  EXPECT_GT(k.dynamic_shared_bytes(true) + 128 + 16, 227 * 1024) << "(the largest scratch: 16 bytes more fail)";
}

// Reductions inside the Pallas threads of a gpu::kernel: each warpgroup's teams shuffle and meet
// in its own part of the arena, and sync on its own barrier. Two Pallas threads reduce one row of x
// each (a sum to a scalar: one team of the whole warpgroup; 8 maxima and argmaxes of 125: teams
// of 8), run with a warpgroup of host threads each and checked against plain loops.
TEST(GpuKernel, ReductionsByTeamsInsideEachWarpgroup) {
  constexpr int64_t kRow = 1000;
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref total, pl::Ref maxima, pl::Ref where) {
        pl::Value wg = plgpu::axis_index("wg");
        pl::Value row = pl::reshape(x.at(pl::ds(wg, 1), pl::all)[pl::all], {8, 125});
        total.at(pl::ds(wg, 1))[pl::all] = pl::broadcast_to(pl::sum(row, {0, 1}), {1});
        maxima.at(pl::ds(wg, 1), pl::all)[pl::all] = pl::expand_dims(pl::max(row, {1}), {0});
        where.at(pl::ds(wg, 1), pl::all)[pl::all] = pl::expand_dims(pl::argmax(row, 1, pl::i32), {0});
      },
      {pl::ShapeDtype({2}, pl::f32), pl::ShapeDtype({2, 8}, pl::f32), pl::ShapeDtype({2, 8}, pl::i32)},
      plgpu::Mesh{.grid = {1}, .grid_names = {"b"}, .num_threads = 2, .thread_name = "wg"}, run_on("mosaic_gpu", {}));
  const pl::Array x = random_f32({2, kRow}, 21);
  std::shared_ptr<const pl::TracedCall> tc = call.trace({x.shape_dtype()});
  const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
  plgpu::HostEmulationStats stats;
  const std::vector<pl::Array> out = plgpu::run_host_emulation(*tc, k, {x}, tc->grid_mapping.grid, 256, &stats);
  EXPECT_GT(stats.shuffles, 0);
  for (int64_t w = 0; w < 2; ++w) {
    double sum = 0;
    for (int64_t i = 0; i < kRow; ++i) sum += x.get({w, i});
    EXPECT_NEAR(out[0].get({w}), sum, 1e-4) << w;
    for (int64_t r = 0; r < 8; ++r) {
      int64_t best = 0;
      for (int64_t i = 1; i < 125; ++i)
        if (x.get({w, r * 125 + i}) > x.get({w, r * 125 + best})) best = i;
      EXPECT_EQ(out[1].get({w, r}), x.get({w, r * 125 + best})) << w << "," << r;
      EXPECT_EQ(out[2].get({w, r}), best) << w << "," << r;
    }
  }
}

// Axis indices of grid, cluster and thread axes, and program_id in mesh-axis order.
TEST(GpuKernel, AxisIndicesNameGridClusterAndThreadAxes) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref out) {
        pl::Value g = plgpu::axis_index("g"), c = plgpu::axis_index("c"), w = plgpu::axis_index("wg");
        pl::Value flat = (g * 2 + c) * 3 + w;
        out[flat] = g * 100 + c * 10 + w + pl::program_id(2) * 1000;
      },
      {pl::ShapeDtype({4 * 2 * 3}, pl::i32)},
      plgpu::Mesh{.grid = {4}, .grid_names = {"g"}, .cluster = {2}, .cluster_names = {"c"},
                  .num_threads = 3, .thread_name = "wg"},
      interpreted({}));
  pl::Array out = call().at(0);
  for (int g = 0; g < 4; ++g)
    for (int c = 0; c < 2; ++c)
      for (int w = 0; w < 3; ++w)
        EXPECT_EQ(out.data<int32_t>()[(g * 2 + c) * 3 + w], g * 100 + c * 10 + w + w * 1000);
}

// Warp specialization: thread 1 (the producer) streams row blocks of x into a ring of 2 SMEM
// slots; thread 0 (the consumer) sums them. "full" barriers complete when a copy lands, "free"
// barriers when the consumer is done with a slot.
TEST_P(GpuKernelBoth, ProducerConsumerPipelineOverARingOfSlots) {
  constexpr int kSteps = 7, kSlots = 2, kRows = 8, kCols = 32;
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref out, pl::Ref slots, pl::Ref acc, pl::Ref full, pl::Ref free) {
        pl::Value wg = plgpu::axis_index("wg");
        pl::when(wg == 1, [&] {  // producer
          pl::fori_loop(0, kSteps, [&](pl::Value step) {
            pl::Value slot = step % kSlots;
            pl::when(step >= kSlots, [&] { plgpu::barrier_wait(free.at(slot)); });
            plgpu::copy_gmem_to_smem(x.at(pl::ds(step * kRows, kRows)), slots.at(slot), full.at(slot));
          });
        });
        pl::when(wg == 0, [&] {  // consumer
          acc[pl::all] = pl::zeros({kRows, kCols}, pl::f32);
          pl::fori_loop(0, kSteps, [&](pl::Value step) {
            pl::Value slot = step % kSlots;
            plgpu::barrier_wait(full.at(slot));
            acc[pl::all] = acc[pl::all] + slots.at(slot)[pl::all];
            plgpu::barrier_arrive(free.at(slot));
          });
          out[pl::all] = acc[pl::all];
        });
      },
      {pl::ShapeDtype({kRows, kCols}, pl::f32)}, plgpu::Mesh{.num_threads = 2, .thread_name = "wg"},
      run_on(GetParam(), {plgpu::SMEM({kSlots, kRows, kCols}, pl::f32), plgpu::SMEM({kRows, kCols}, pl::f32),
                   plgpu::Barrier{.num_barriers = kSlots}, plgpu::Barrier{.num_barriers = kSlots}}));
  pl::Array x = random_f32({kSteps * kRows, kCols}, 2);
  pl::Array out = call(x).at(0);
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c) {
      float want = 0;
      for (int s = 0; s < kSteps; ++s) want += x.data<float>()[(s * kRows + r) * kCols + c];
      EXPECT_EQ(out.data<float>()[r * kCols + c], want) << r << "," << c;
    }
}

// A bf16 matmul tile per CTA: K streamed in 16-wide steps through SMEM, wgmma into an f32
// accumulator, then written out.
TEST_P(GpuKernelBoth, WgmmaAccumulatesBf16ProductsInF32) {
  constexpr int M = 64, N = 32, K = 64, kStep = 16, kTiles = 2;
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref a, pl::Ref b, pl::Ref out, pl::Ref a_s, pl::Ref b_s, pl::Ref acc, pl::Ref bar) {
        pl::Value t = plgpu::axis_index("t");
        acc[pl::all] = pl::zeros({M, N}, pl::f32);
        pl::fori_loop(0, K / kStep, [&](pl::Value k) {
          plgpu::copy_gmem_to_smem(a.at(pl::ds(t * M, M), pl::ds(k * kStep, kStep)), a_s, bar);
          plgpu::copy_gmem_to_smem(b.at(pl::ds(k * kStep, kStep), pl::all), b_s, bar);
          plgpu::barrier_wait(bar);
          plgpu::wgmma(acc, a_s, b_s);
          plgpu::wgmma_wait(0);
        });
        out.at(pl::ds(t * M, M), pl::all)[pl::all] = acc[pl::all];
      },
      {pl::ShapeDtype({kTiles * M, N}, pl::f32)}, plgpu::Mesh{.grid = {kTiles}, .grid_names = {"t"}},
      run_on(GetParam(), {plgpu::SMEM({M, kStep}, pl::bf16), plgpu::SMEM({kStep, N}, pl::bf16),
                   plgpu::ACC({M, N}), plgpu::Barrier{.num_arrivals = 2}}));
  pl::Array a = random_f32({kTiles * M, K}, 3).astype(pl::bf16);
  pl::Array b = random_f32({K, N}, 4).astype(pl::bf16);
  expect_product_of(a, b, call(a, b).at(0));
}

// wgmma's a in registers (attention's p @ v): a value the kernel computes, taken when the wgmma is
// issued — the second step computes its p while the first step's wgmma may still run.
TEST_P(GpuKernelBoth, WgmmaTakesItsLeftOperandFromRegisters) {
  constexpr int M = 64, K = 64, N = 32, kSteps = 2;
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref v, pl::Ref out, pl::Ref v_s, pl::Ref acc, pl::Ref bar) {
        plgpu::copy_gmem_to_smem(v, v_s, bar);
        plgpu::barrier_wait(bar);
        acc[pl::all] = pl::zeros({M, N}, pl::f32);
        for (int step = 0; step < kSteps; ++step) {
          pl::Value p = (x.at(pl::ds(step * M, M), pl::all)[pl::all] * 0.5f + float(step)).astype(pl::bf16);
          plgpu::wgmma(acc, p, v_s);
          plgpu::wgmma_wait(1);
        }
        plgpu::wgmma_wait(0);
        out[pl::all] = acc[pl::all];
      },
      {pl::ShapeDtype({M, N}, pl::f32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"b"}},
      run_on(GetParam(), {plgpu::SMEM({K, N}, pl::bf16), plgpu::ACC({M, N}), plgpu::Barrier{}}));
  const pl::Array x = random_f32({kSteps * M, K}, 31), v = random_f32({K, N}, 32).astype(pl::bf16);
  const pl::Array out = call(x, v).at(0);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double want = 0;
      for (int step = 0; step < kSteps; ++step)
        for (int k = 0; k < K; ++k) {
          const double p = pl::Array::from_values({}, pl::bf16, {x.get({step * M + i, k}) * 0.5 + step}).get({});
          want += p * v.get({k, j});
        }
      EXPECT_NEAR(out.get({i, j}), want, 1e-4 * (1 + std::abs(want))) << i << "," << j;
    }
  if (GetParam() != "gpu_emulate") return;
  std::shared_ptr<const pl::TracedCall> tc = call.trace({x.shape_dtype(), v.shape_dtype()});
  const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
  EXPECT_EQ(k.tensor_core_dots, kSteps);
  // With a whole warpgroup of host threads the products run as emulated wgmma instructions, a
  // staged through shared memory: each step one 64 x 32 block over K = 64, 4 k16 instructions.
  pl::gpu::HostEmulationStats stats;
  const pl::Array on_wgmma = pl::gpu::run_host_emulation(*tc, k, {x, v}, tc->grid_mapping.grid, 128, &stats).at(0);
  EXPECT_EQ(stats.wgmma_instructions, kSteps * K / 16);
  for (int64_t e = 0; e < M * N; ++e) EXPECT_NEAR(on_wgmma.get_flat(e), out.get_flat(e), 1e-4 * (1 + std::abs(out.get_flat(e)))) << e;
  if (std::string why = check_compiles_to_hgmma(k.source, "wgmma_a_regs.cu"); !why.empty()) GTEST_SKIP() << why;
}

// A gpu::kernel without the primitives compiles: its grid axes become parallel CTAs. Here the
// generated CUDA runs under host emulation (the same source NVRTC compiles for a GPU).
TEST(GpuKernel, PlainKernelRunsCompiledUnderHostEmulation) {
  pl::CallOptions o;
  o.backend = "gpu_emulate";
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref out) {
        pl::Value b = plgpu::axis_index("b");
        out.at(pl::ds(b * 8, 8))[pl::all] = x.at(pl::ds(b * 8, 8))[pl::all] * 2.0f + b.astype(pl::f32);
      },
      {pl::ShapeDtype({32}, pl::f32)}, plgpu::Mesh{.grid = {4}, .grid_names = {"b"}}, o);
  pl::Array x = random_f32({32}, 5);
  pl::Array out = call(x).at(0);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(out.data<float>()[i], x.data<float>()[i] * 2.0f + float(i / 8)) << i;
}

// ---- Errors ------------------------------------------------------------------------------------

TEST(GpuKernelErrors, AWaitNothingWillCompleteIsADeadlockNamingTheLine) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref out, pl::Ref bar) {
        out[0] = pl::full({}, pl::f32, 1.0);
        plgpu::barrier_wait(bar);  // nobody arrives
      },
      {pl::ShapeDtype({1}, pl::f32)}, plgpu::Mesh{}, interpreted({plgpu::Barrier{}}));
  std::string e = error_of([&] { call(); });
  EXPECT_CONTAINS(e, "deadlock");
  EXPECT_CONTAINS(e, "gpu_kernel_test.cpp:" + std::to_string(__LINE__ - 5));
  EXPECT_CONTAINS(e, "phase 1 of barrier scratch[0]");
  EXPECT_CONTAINS(e, "0 of 1 arrivals");
}

// The deadlock report tells each wait as it stands when no thread can go on: here thread 1's
// arrival came after thread 0 began waiting, and the report counts it.
TEST(GpuKernelErrors, ADeadlockReportCountsArrivalsMadeAfterTheWaitBegan) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref out, pl::Ref bar) {
        pl::Value wg = plgpu::axis_index("wg");
        pl::when(wg == 0, [&] { plgpu::barrier_wait(bar); });
        pl::when(wg == 1, [&] { plgpu::barrier_arrive(bar); });  // one of the two arrivals it needs
        out[wg] = wg;
      },
      {pl::ShapeDtype({2}, pl::i32)}, plgpu::Mesh{.num_threads = 2, .thread_name = "wg"},
      interpreted({plgpu::Barrier{.num_arrivals = 2}}));
  std::string e = error_of([&] { call(); });
  EXPECT_CONTAINS(e, "gpu::kernel deadlock");
  EXPECT_CONTAINS(e, "(0 phases completed, 1 of 2 arrivals in the current one)");
}

// A copy into SMEM that no thread waits for before the CTA ends is an error naming the copy: on a
// GPU the CTA could exit (and its shared memory go to the next CTA) while the copy lands. Also a
// copy whose phase never completes, and a multicast copy that lacks a peer's share at the end.
TEST(GpuKernelErrors, ACopyNoThreadWaitsForBeforeTheEndIsAnError) {
  auto make = [](std::function<void(pl::Ref, pl::Ref, pl::Ref, pl::Ref)> body, plgpu::Mesh mesh, int arrivals = 1) {
    return plgpu::kernel([body](pl::Ref x, pl::Ref out, pl::Ref s, pl::Ref bar) { body(x, out, s, bar); },
                         {pl::ShapeDtype({8}, pl::f32)}, std::move(mesh),
                         interpreted({plgpu::SMEM({8}, pl::f32), plgpu::Barrier{.num_arrivals = arrivals}}));
  };
  const pl::Array x = random_f32({8}, 41);
  const std::string line = "gpu_kernel_test.cpp:" + std::to_string(__LINE__ + 3);
  std::string e = error_of([&] {
    make([](pl::Ref x, pl::Ref out, pl::Ref s, pl::Ref bar) {
      plgpu::copy_gmem_to_smem(x, s, bar);  // never waited for
      out[pl::all] = x[pl::all];
    }, plgpu::Mesh{})(x);
  });
  EXPECT_CONTAINS(e, "copy_gmem_to_smem: the CTA ends before any of its threads waits for phase 1 of barrier scratch[1]");
  EXPECT_CONTAINS(e, "the copy may still be landing when the CTA exits");
  EXPECT_CONTAINS(e, line);
  e = error_of([&] {
    make([](pl::Ref x, pl::Ref out, pl::Ref s, pl::Ref bar) {
      plgpu::copy_gmem_to_smem(x, s, bar);  // one of the phase's two arrivals
      out[pl::all] = x[pl::all];
    }, plgpu::Mesh{}, 2)(x);
  });
  EXPECT_CONTAINS(e, "waits for phase 1 of barrier scratch[1]");
  e = error_of([&] {
    make([](pl::Ref x, pl::Ref out, pl::Ref s, pl::Ref bar) {
      pl::when(plgpu::axis_index("c") == 0, [&] {
        plgpu::copy_gmem_to_smem(x, s, bar, {"c"});
        out[pl::all] = x[pl::all];
      });
    }, plgpu::Mesh{.cluster = {2}, .cluster_names = {"c"}})(x);
  });
  EXPECT_CONTAINS(e, "has the shares of 1 of its 2 CTAs when the CTAs end (first issued by CTA (0,))");
  EXPECT_CONTAINS(e, "gpu_kernel_test.cpp:");  // the copy's line
  // Waited for, the same copy is fine.
  const pl::Array out = make([](pl::Ref x, pl::Ref out, pl::Ref s, pl::Ref bar) {
    plgpu::copy_gmem_to_smem(x, s, bar);
    plgpu::barrier_wait(bar);
    out[pl::all] = s[pl::all];
  }, plgpu::Mesh{})(x).at(0);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(out.data<float>()[i], x.data<float>()[i]);
}

TEST(GpuKernelErrors, TwoThreadsWaitingForEachOtherDeadlock) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref out, pl::Ref bars) {
        pl::Value wg = plgpu::axis_index("wg");
        plgpu::barrier_wait(bars.at(wg));          // each waits for the other's arrival...
        plgpu::barrier_arrive(bars.at(1 - wg));    // ...which comes only after its own wait
        out[wg] = wg;
      },
      {pl::ShapeDtype({2}, pl::i32)}, plgpu::Mesh{.num_threads = 2, .thread_name = "wg"},
      interpreted({plgpu::Barrier{.num_barriers = 2}}));
  std::string e = error_of([&] { call(); });
  EXPECT_CONTAINS(e, "deadlock");
  EXPECT_CONTAINS(e, "thread 0 of the CTA");
  EXPECT_CONTAINS(e, "thread 1 of the CTA");
  EXPECT_CONTAINS(e, "barrier scratch[0][0]");
  EXPECT_CONTAINS(e, "barrier scratch[0][1]");
}

TEST(GpuKernelErrors, APhaseCompletedTwiceBeforeAnyWaitIsLost) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref out, pl::Ref bar) {
        plgpu::barrier_arrive(bar);
        plgpu::barrier_arrive(bar);  // completes phase 2; nobody waited for phase 1
        out[0] = 1;
      },
      {pl::ShapeDtype({1}, pl::i32)}, plgpu::Mesh{}, interpreted({plgpu::Barrier{}}));
  std::string e = error_of([&] { call(); });
  EXPECT_CONTAINS(e, "completes phase 2 before any thread waited for phase 1");
  EXPECT_CONTAINS(e, "gpu_kernel_test.cpp:" + std::to_string(__LINE__ - 6));
}

TEST(GpuKernelErrors, AThreadThatMissedAPhaseIsReported) {
  // Thread 1 waits for phase 1, then thread 0 completes phase 2 and only then waits: its first
  // wait is for phase 1, which it can no longer tell apart on a GPU.
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref out, pl::Ref bar, pl::Ref go) {
        pl::Value wg = plgpu::axis_index("wg");
        pl::when(wg == 1, [&] {
          plgpu::barrier_wait(bar);
          plgpu::barrier_arrive(go);
        });
        pl::when(wg == 0, [&] {
          plgpu::barrier_arrive(bar);
          plgpu::barrier_wait(go);
          plgpu::barrier_arrive(bar);
          plgpu::barrier_wait(bar);
        });
        out[wg] = wg;
      },
      {pl::ShapeDtype({2}, pl::i32)}, plgpu::Mesh{.num_threads = 2, .thread_name = "wg"},
      interpreted({plgpu::Barrier{}, plgpu::Barrier{}}));
  std::string e = error_of([&] { call(); });
  EXPECT_CONTAINS(e, "thread 0 of the CTA waits for phase 1 of barrier scratch[0], which has already completed 2 phases");
}

// Atomic adds to one GMEM counter from every thread of every CTA: they never race with each
// other. The counter is an input aliased to the output, holding 0.
TEST_P(GpuKernelBoth, AtomicAddsFromEveryThreadSum) {
  pl::CallOptions o = run_on(GetParam(), {});
  o.input_output_aliases = {{0, 0}};
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref, pl::Ref counter) {
        pl::Value g = plgpu::axis_index("g"), w = plgpu::axis_index("wg");
        counter.atomic_add({0}, g * 10 + w + 1);
      },
      {pl::ShapeDtype({1}, pl::i32)},
      plgpu::Mesh{.grid = {4}, .grid_names = {"g"}, .num_threads = 2, .thread_name = "wg"}, o);
  pl::Array out = call(pl::Array::zeros({1}, pl::i32)).at(0);
  int want = 0;
  for (int g = 0; g < 4; ++g)
    for (int w = 0; w < 2; ++w) want += g * 10 + w + 1;
  EXPECT_EQ(out.data<int32_t>()[0], want);
}

// copy_smem_to_gmem with reduction_op (Mosaic GPU's): every Pallas thread of every CTA reduces its
// SMEM row into one GMEM block, aliased to an input holding the start values — a split-K sum
// ("add", f32, against a C++ sum in double), an i32 "max" and an i32 "xor" (exact). The updates of
// different copies never race with each other.
TEST_P(GpuKernelBoth, ReducingCopiesToGmemCombineEveryCtasBlock) {
  constexpr int kCtas = 4, kThreads = 2, kN = 64;
  auto make = [&](const std::string& op, pl::DType t) {
    pl::CallOptions o = run_on(GetParam(), {plgpu::SMEM({kThreads, kN}, t)});
    o.input_output_aliases = {{1, 0}};
    return plgpu::kernel(
        [=](pl::Ref x, pl::Ref, pl::Ref out, pl::Ref s) {
          pl::Value g = plgpu::axis_index("g"), w = plgpu::axis_index("wg");
          pl::Ref mine = s.at(w);
          mine[pl::all] = t == pl::f32 ? x.at(g * kThreads + w)[pl::all] * 2.0f : x.at(g * kThreads + w)[pl::all];
          plgpu::commit_smem();
          plgpu::copy_smem_to_gmem(mine, out, {.reduction_op = op});
          plgpu::wait_smem_to_gmem(0);
        },
        {pl::ShapeDtype({kN}, t)},
        plgpu::Mesh{.grid = {kCtas}, .grid_names = {"g"}, .num_threads = kThreads, .thread_name = "wg"}, o);
  };
  const pl::Array x = random_f32({kCtas * kThreads, kN}, 81), start = random_f32({kN}, 82);
  const pl::Array sum = make("add", pl::f32)(x, start.clone()).at(0);
  for (int j = 0; j < kN; ++j) {
    double want = start.data<float>()[j];
    for (int r = 0; r < kCtas * kThreads; ++r) want += 2.0 * x.data<float>()[r * kN + j];
    EXPECT_NEAR(sum.data<float>()[j], want, 1e-4 * (1 + std::abs(want))) << j;
  }
  pl::Array xi({kCtas * kThreads, kN}, pl::i32), si({kN}, pl::i32);
  for (int64_t e = 0; e < xi.size(); ++e) xi.data<int32_t>()[e] = static_cast<int32_t>((e * 7919) % 1000) - 500;
  for (int64_t e = 0; e < si.size(); ++e) si.data<int32_t>()[e] = static_cast<int32_t>(e * 13) - 400;
  const pl::Array mx = make("max", pl::i32)(xi, si.clone()).at(0);
  const pl::Array xr = make("xor", pl::i32)(xi, si.clone()).at(0);
  for (int j = 0; j < kN; ++j) {
    int32_t want_max = si.data<int32_t>()[j], want_xor = si.data<int32_t>()[j];
    for (int r = 0; r < kCtas * kThreads; ++r) {
      want_max = std::max(want_max, xi.data<int32_t>()[r * kN + j]);
      want_xor ^= xi.data<int32_t>()[r * kN + j];
    }
    EXPECT_EQ(mx.data<int32_t>()[j], want_max) << j;
    EXPECT_EQ(xr.data<int32_t>()[j], want_xor) << j;
  }
  if (GetParam() != "gpu_emulate" || !plgpu::Nvrtc::unavailable_reason().empty()) return;
  for (auto [op, t] : {std::pair{"add", pl::f32}, std::pair{"max", pl::i32}}) {
    std::shared_ptr<const pl::TracedCall> tc = make(op, t).trace({pl::ShapeDtype({kCtas * kThreads, kN}, t), pl::ShapeDtype({kN}, t)});
    const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
    EXPECT_CONTAINS(k.source, "pl_atomic_update(&");
    for (const char* arch : {"sm_90a", "sm_80"}) EXPECT_TRUE(plgpu::Nvrtc::get().compile(k.source, "reduce.cu", arch).is_cubin) << op << arch;
  }
}

// A plain store to a block that a reducing copy updates, unordered with it, races; a reduction
// that needs integers, and an unknown one, are errors naming the line.
TEST(GpuKernelErrors, ReducingCopiesRaceWithPlainAccessesAndCheckTheirOp) {
  pl::CallOptions o = interpreted({plgpu::SMEM({16}, pl::f32)});
  o.input_output_aliases = {{0, 0}};
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref, pl::Ref out, pl::Ref s) {
        pl::Value w = plgpu::axis_index("wg");
        pl::when(w == 0, [&] {
          s[pl::all] = pl::full({16}, pl::f32, 1.0);
          plgpu::commit_smem();
          plgpu::copy_smem_to_gmem(s, out, {.reduction_op = "add"});
          plgpu::wait_smem_to_gmem(0);
        });
        pl::when(w == 1, [&] { out[pl::all] = pl::full({16}, pl::f32, 5.0); });
      },
      {pl::ShapeDtype({16}, pl::f32)}, plgpu::Mesh{.num_threads = 2, .thread_name = "wg"}, o);
  std::string e = error_of([&] { call(pl::Array::zeros({16}, pl::f32)); });
  EXPECT_CONTAINS(e, "gpu::kernel data race");
  EXPECT_CONTAINS(e, "the reducing copy to GMEM (its updates)");
  // Across clusters (each its own wave here) too: CTA 0 zeroes the block that both CTAs reduce
  // into, which nothing orders (a split-K kernel must clear its output before the launch).
  pl::CallOptions waves = interpreted({plgpu::SMEM({16}, pl::f32)});
  waves.input_output_aliases = {{0, 0}};
  e = error_of([&] {
    plgpu::kernel(
        [](pl::Ref, pl::Ref out, pl::Ref s) {
          pl::when(plgpu::axis_index("g") == 0, [&] { out[pl::all] = pl::zeros({16}, pl::f32); });
          s[pl::all] = pl::full({16}, pl::f32, 1.0);
          plgpu::commit_smem();
          plgpu::copy_smem_to_gmem(s, out, {.reduction_op = "add"});
          plgpu::wait_smem_to_gmem(0);
        },
        {pl::ShapeDtype({16}, pl::f32)}, plgpu::Mesh{.grid = {2}, .grid_names = {"g"}}, waves)(pl::Array::zeros({16}, pl::f32));
  });
  EXPECT_CONTAINS(e, "gpu::kernel data race between clusters");
  EXPECT_CONTAINS(e, "the reducing copy to GMEM (its updates)");
  for (const char* op : {"xor", "mul"}) {
    const int line = __LINE__ + 2;
    e = error_of([&] {
      plgpu::kernel([op](pl::Ref out, pl::Ref s) { plgpu::copy_smem_to_gmem(s, out, {.reduction_op = op}); }, {pl::ShapeDtype({16}, pl::f32)},
                    plgpu::Mesh{}, interpreted({plgpu::SMEM({16}, pl::f32)}))();
    });
    EXPECT_CONTAINS(e, std::string(op) == "xor" ? "reduction_op 'xor' needs an integer destination"
                                                : "unknown reduction_op 'mul' (add, min, max, and, or, xor)");
    EXPECT_CONTAINS(e, "gpu_kernel_test.cpp:" + std::to_string(line));
  }
}

// Copies to GMEM with commit_group = false join one group at commit_smem_to_gmem_group (Mosaic
// GPU's): wait_smem_to_gmem(1) then covers both, not the copy after them — out1 and out2 are read
// back after it. (Host emulation lands a bulk copy only when a wait retires its group.)
TEST_P(GpuKernelBoth, CopiesToGmemCommittedAsOneGroup) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref out1, pl::Ref out2, pl::Ref out3, pl::Ref sums, pl::Ref x_s, pl::Ref bar) {
        plgpu::copy_gmem_to_smem(x, x_s, bar);
        plgpu::barrier_wait(bar);
        plgpu::copy_smem_to_gmem(x_s.at(0), out1, {.commit_group = false});
        plgpu::copy_smem_to_gmem(x_s.at(1), out2, {.commit_group = false});
        plgpu::commit_smem_to_gmem_group();
        plgpu::copy_smem_to_gmem(x_s.at(2), out3);
        plgpu::wait_smem_to_gmem(1);
        sums[pl::all] = out1[pl::all] + out2[pl::all];
        plgpu::wait_smem_to_gmem(0);
      },
      {pl::ShapeDtype({8, 64}, pl::f32), pl::ShapeDtype({8, 64}, pl::f32), pl::ShapeDtype({8, 64}, pl::f32),
       pl::ShapeDtype({8, 64}, pl::f32)},
      plgpu::Mesh{}, run_on(GetParam(), {plgpu::SMEM({3, 8, 64}, pl::f32), plgpu::Barrier{}}));
  const pl::Array x = random_f32({3, 8, 64}, 91);
  const std::vector<pl::Array> r = call(x);
  for (int64_t e = 0; e < 8 * 64; ++e) {
    for (int k = 0; k < 3; ++k) EXPECT_EQ(r[static_cast<size_t>(k)].data<float>()[e], x.data<float>()[k * 512 + e]) << k << "," << e;
    EXPECT_EQ(r[3].data<float>()[e], x.data<float>()[e] + x.data<float>()[512 + e]) << e;
  }
}

// A copy left uncommitted is covered by no wait: reading its destination after
// wait_smem_to_gmem(0) races with it.
TEST(GpuKernelErrors, AnUncommittedCopyToGmemIsNotWaitedFor) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref out, pl::Ref back, pl::Ref s) {
        s[pl::all] = pl::full({16}, pl::f32, 2.0);
        plgpu::commit_smem();
        plgpu::copy_smem_to_gmem(s, out, {.commit_group = false});
        plgpu::wait_smem_to_gmem(0);
        back[pl::all] = out[pl::all];
      },
      {pl::ShapeDtype({16}, pl::f32), pl::ShapeDtype({16}, pl::f32)}, plgpu::Mesh{},
      interpreted({plgpu::SMEM({16}, pl::f32)}));
  const std::string e = error_of([&] { call(); });
  EXPECT_CONTAINS(e, "gpu::kernel data race");
  EXPECT_CONTAINS(e, "the copy to GMEM (its writes)");
}

// The groups are what waits count: two uncommitted copies and their commit make one group, so
// wait_smem_to_gmem(1) leaves it in flight (were each copy its own group, it would retire both):
// reading out1 then races (the interpreter says so). A reducing copy is one group too (done when
// issued): a copy,
// then a reduction, then wait_smem_to_gmem(1) retires the copy, whose destination reads back.
TEST(GpuKernel, WaitsCountGroupsOfCopiesToGmem) {
  auto pending = [](const std::string& how) {
    return plgpu::kernel(
        [](pl::Ref x, pl::Ref out1, pl::Ref out2, pl::Ref back, pl::Ref x_s, pl::Ref bar) {
          plgpu::copy_gmem_to_smem(x, x_s, bar);
          plgpu::barrier_wait(bar);
          plgpu::copy_smem_to_gmem(x_s.at(0), out1, {.commit_group = false});
          plgpu::copy_smem_to_gmem(x_s.at(1), out2, {.commit_group = false});
          plgpu::commit_smem_to_gmem_group();
          plgpu::wait_smem_to_gmem(1);
          back[pl::all] = out1[pl::all];
          plgpu::wait_smem_to_gmem(0);
        },
        {pl::ShapeDtype({8, 64}, pl::f32), pl::ShapeDtype({8, 64}, pl::f32), pl::ShapeDtype({8, 64}, pl::f32)},
        plgpu::Mesh{}, run_on(how, {plgpu::SMEM({2, 8, 64}, pl::f32), plgpu::Barrier{}}));
  };
  const pl::Array x = random_f32({2, 8, 64}, 93);
  // (Host emulation's result is timing-dependent here, as a GPU's would be: thread 0 may retire
  // the group at the next wait while other threads still read.)
  EXPECT_CONTAINS(error_of([&] { pending("interpret")(x); }), "gpu::kernel data race");
  auto reduced = [](const std::string& how) {
    pl::CallOptions o = run_on(how, {plgpu::SMEM({2, 8, 64}, pl::f32), plgpu::Barrier{}});
    o.input_output_aliases = {{1, 1}};
    return plgpu::kernel(
        [](pl::Ref x, pl::Ref, pl::Ref out1, pl::Ref sum, pl::Ref back, pl::Ref x_s, pl::Ref bar) {
          plgpu::copy_gmem_to_smem(x, x_s, bar);
          plgpu::barrier_wait(bar);
          plgpu::copy_smem_to_gmem(x_s.at(0), out1);
          plgpu::copy_smem_to_gmem(x_s.at(1), sum, {.reduction_op = "add"});
          plgpu::wait_smem_to_gmem(1);
          back[pl::all] = out1[pl::all];
          plgpu::wait_smem_to_gmem(0);
        },
        {pl::ShapeDtype({8, 64}, pl::f32), pl::ShapeDtype({8, 64}, pl::f32), pl::ShapeDtype({8, 64}, pl::f32)},
        plgpu::Mesh{}, o);
  };
  for (const char* how : {"interpret", "gpu_emulate"}) {
    const std::vector<pl::Array> r = reduced(how)(x, pl::Array::zeros({8, 64}, pl::f32));
    for (int64_t e = 0; e < 8 * 64; ++e) {
      EXPECT_EQ(r[2].data<float>()[e], x.data<float>()[e]) << how << " " << e;
      EXPECT_EQ(r[1].data<float>()[e], x.data<float>()[512 + e]) << how << " " << e;
    }
  }
}

// ---- Races: asynchronous copies and wgmma may not be relied on before their waits --------------

TEST(GpuKernelErrors, ReadingACopysDestinationBeforeItsBarrierIsARace) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref out, pl::Ref buf, pl::Ref bar) {
        plgpu::copy_gmem_to_smem(x, buf, bar);
        out[pl::all] = buf[pl::all];  // the copy may not have landed yet
        plgpu::barrier_wait(bar);
      },
      {pl::ShapeDtype({16}, pl::f32)}, plgpu::Mesh{}, interpreted({plgpu::SMEM({16}, pl::f32), plgpu::Barrier{}}));
  std::string e = error_of([&] { call(random_f32({16}, 1)); });
  EXPECT_CONTAINS(e, "gpu::kernel data race");
  EXPECT_CONTAINS(e, "on scratch[0] [16], elements [0:16]");
  EXPECT_CONTAINS(e, "write by the copy to SMEM issued by the CTA (gpu_copy_gmem_to_smem) at gpu_kernel_test.cpp:" +
                         std::to_string(__LINE__ - 9));
  EXPECT_CONTAINS(e, "read by the CTA (load) at gpu_kernel_test.cpp:" + std::to_string(__LINE__ - 9));
}

// The producer refills a slot without waiting for the consumer to release it: its second copy is
// not ordered after the first (nor after the consumer's reads).
TEST(GpuKernelErrors, RefillingASlotWithoutWaitingForItsReleaseIsARace) {
  auto make = [](bool wait_for_free) {
    return plgpu::kernel(
        [wait_for_free](pl::Ref x, pl::Ref out, pl::Ref slot, pl::Ref full, pl::Ref free) {
          pl::Value wg = plgpu::axis_index("wg");
          pl::when(wg == 1, [&] {
            pl::fori_loop(0, 2, [&](pl::Value k) {
              if (wait_for_free) pl::when(k > 0, [&] { plgpu::barrier_wait(free); });
              plgpu::copy_gmem_to_smem(x.at(pl::ds(k * 8, 8)), slot, full);
            });
          });
          pl::when(wg == 0, [&] {
            pl::fori_loop(0, 2, [&](pl::Value k) {
              plgpu::barrier_wait(full);
              out.at(pl::ds(k * 8, 8))[pl::all] = slot[pl::all];
              plgpu::barrier_arrive(free);
            });
          });
        },
        {pl::ShapeDtype({16}, pl::f32)}, plgpu::Mesh{.num_threads = 2, .thread_name = "wg"},
        interpreted({plgpu::SMEM({8}, pl::f32), plgpu::Barrier{}, plgpu::Barrier{}}));
  };
  pl::Array x = random_f32({16}, 2);
  pl::Array out = make(true)(x).at(0);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(out.data<float>()[i], x.data<float>()[i]);
  std::string e = error_of([&] { make(false)(x); });
  EXPECT_CONTAINS(e, "gpu::kernel data race");
  EXPECT_CONTAINS(e, "write by the copy to SMEM issued by thread 1 of the CTA (gpu_copy_gmem_to_smem) at "
                     "gpu_kernel_test.cpp:" + std::to_string(__LINE__ - 20));
}

TEST(GpuKernelErrors, ReadingTheAccumulatorBeforeWgmmaWaitIsARace) {
  auto make = [](bool wait) {
    return plgpu::kernel(
        [wait](pl::Ref a, pl::Ref b, pl::Ref out, pl::Ref a_s, pl::Ref b_s, pl::Ref acc, pl::Ref bar) {
          zeroed_product(a, b, a_s, b_s, acc, bar);
          if (wait) plgpu::wgmma_wait(0);
          out[pl::all] = acc[pl::all];
        },
        {pl::ShapeDtype({64, 8}, pl::f32)}, plgpu::Mesh{},
        interpreted({plgpu::SMEM({64, 16}, pl::bf16), plgpu::SMEM({16, 8}, pl::bf16), plgpu::ACC({64, 8}),
                     plgpu::Barrier{.num_arrivals = 2}}));
  };
  pl::Array a = random_f32({64, 16}, 3).astype(pl::bf16), b = random_f32({16, 8}, 4).astype(pl::bf16);
  EXPECT_NO_THROW(make(true)(a, b));
  std::string e = error_of([&] { make(false)(a, b); });
  EXPECT_CONTAINS(e, "write by the wgmma issued by the CTA (gpu_wgmma)");
  EXPECT_CONTAINS(e, "read by the CTA (load)");
}

// Overwriting the source of a copy to GMEM before waiting for its reads; wait_smem_to_gmem with
// read_only is enough to reuse the buffer.
TEST(GpuKernelErrors, ReusingACopysSourceBeforeWaitSmemToGmemIsARace) {
  auto make = [](int mode) {  // 0: no wait, 1: read_only wait, 2: full wait
    return plgpu::kernel(
        [mode](pl::Ref out, pl::Ref buf) {
          buf[pl::all] = pl::full({8}, pl::f32, 1.0);
          plgpu::commit_smem();
          plgpu::copy_smem_to_gmem(buf, out.at(pl::ds(0, 8)));
          if (mode > 0) plgpu::wait_smem_to_gmem(0, /*wait_read_only=*/mode == 1);
          buf[pl::all] = pl::full({8}, pl::f32, 2.0);
          plgpu::commit_smem();
          plgpu::copy_smem_to_gmem(buf, out.at(pl::ds(8, 8)));
          plgpu::wait_smem_to_gmem(0);
        },
        {pl::ShapeDtype({16}, pl::f32)}, plgpu::Mesh{}, interpreted({plgpu::SMEM({8}, pl::f32)}));
  };
  for (int mode : {1, 2}) {
    pl::Array out = make(mode)().at(0);
    for (int i = 0; i < 16; ++i) EXPECT_EQ(out.data<float>()[i], i < 8 ? 1.0f : 2.0f) << mode;
  }
  std::string e = error_of([&] { make(0)(); });
  EXPECT_CONTAINS(e, "read by the copy to GMEM (its reads) issued by the CTA");
  EXPECT_CONTAINS(e, "write by the CTA (store)");
}

// CTAs of different clusters run at once and in any order on a GPU (the interpreter runs a
// cluster at a time): two of them writing the same element of an output, or one reading what
// another writes, is a race, reported with both lines. Disjoint writes and shared reads are not.
TEST(GpuKernelErrors, AccessesOfDifferentClustersToOneElementRace) {
  auto make = [](int mode) {  // 0: each CTA its own rows; 1: both write row 0; 2: CTA 1 reads CTA 0's row
    return plgpu::kernel(
        [mode](pl::Ref x, pl::Ref out, pl::Ref buf) {
          pl::Value c = plgpu::axis_index("c");
          pl::Value row = mode == 1 ? c * 0 : c;
          buf[pl::all] = x.at(row, pl::all)[pl::all];
          if (mode == 2) pl::when(c == 1, [&] { buf[pl::all] = buf[pl::all] + out.at(0, pl::all)[pl::all]; });
          out.at(row, pl::all)[pl::all] = buf[pl::all] * 2.0f;
        },
        {pl::ShapeDtype({4, 8}, pl::f32)}, plgpu::Mesh{.grid = {2}, .grid_names = {"c"}},
        interpreted({plgpu::SMEM({8}, pl::f32)}));
  };
  pl::Array x = random_f32({4, 8}, 12);
  pl::Array out = make(0)(x).at(0);
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t c = 0; c < 8; ++c) EXPECT_EQ(out.get({r, c}), 2 * x.get({r, c})) << r << "," << c;
  const std::string both = error_of([&] { make(1)(x); });
  EXPECT_CONTAINS(both, "gpu::kernel data race between clusters");
  EXPECT_CONTAINS(both, "RACE DETECTED on output 0 [4, 8], element [0, 0]");
  EXPECT_CONTAINS(both, "write by CTA (0,) (store)");
  EXPECT_CONTAINS(both, "write by CTA (1,) (store)");
  const std::string read = error_of([&] { make(2)(x); });
  EXPECT_CONTAINS(read, "RACE DETECTED on output 0 [4, 8], element [0, 0]");
  EXPECT_CONTAINS(read, "write by CTA (0,) (store)");
  EXPECT_CONTAINS(read, "read by CTA (1,) (load)");
}

TEST(GpuKernelErrors, SharedMemoryBeyondTheLimitNamesTheBuffers) {
  std::string e = error_of([&] {
    plgpu::kernel([](pl::Ref, pl::Ref, pl::Ref) {}, {pl::ShapeDtype({1}, pl::f32)}, plgpu::Mesh{},
                  interpreted({plgpu::SMEM({1024, 64}, pl::f32), plgpu::Barrier{}}));
  });
  EXPECT_CONTAINS(e, "exceeds available shared memory");
  EXPECT_CONTAINS(e, "262152 bytes");
  EXPECT_CONTAINS(e, "at most 232448");
  EXPECT_CONTAINS(e, "scratch[0] f32[1024, 64] = 262144 B");
  EXPECT_EQ(plgpu::shared_memory_bytes({plgpu::SMEM({3}, pl::f16), plgpu::Barrier{.num_barriers = 2},
                                        plgpu::ACC({64, 64})}),
            8 + 16);
}

// A gpu::Union's members share memory: member 1's first array (b) lies over a[0:30], its
// second (c, i32) over a[32:48] (16-byte aligned after b's 120 bytes). What is written through
// one member reads back through the other as the same bytes.
TEST_P(GpuKernelBoth, UnionMembersShareTheirBytes) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref y, pl::Ref out, pl::Ref a, pl::Ref b, pl::Ref c) {
        a[pl::all] = x[pl::all] * 2.0f;
        b[pl::all] = b[pl::all] + 1.0f;  // a[0:30] through the other member
        c[pl::all] = y[pl::all];         // i32 bits into a[32:48]
        out[pl::all] = a[pl::all];
      },
      {pl::ShapeDtype({64}, pl::f32)}, plgpu::Mesh{},
      run_on(GetParam(), {plgpu::Union{{{plgpu::SMEM({64}, pl::f32)},
                                        {plgpu::SMEM({30}, pl::f32), plgpu::SMEM({16}, pl::i32)}}}}));
  pl::Array x = random_f32({64}, 3);
  pl::Array y = pl::Array::zeros({16}, pl::i32);
  for (int i = 0; i < 16; ++i) {
    const float f = 0.25f * static_cast<float>(i) - 1.5f;
    std::memcpy(&y.data<int32_t>()[i], &f, 4);
  }
  pl::Array out = call(x, y).at(0);
  for (int i = 0; i < 64; ++i) {
    float want = 2.0f * x.data<float>()[i];
    if (i < 30) want += 1.0f;
    else if (i >= 32 && i < 48) std::memcpy(&want, &y.data<int32_t>()[i - 32], 4);
    EXPECT_EQ(out.data<float>()[i], want) << i;
  }
}

// Two Pallas threads touching the same bytes through different members, unordered: a race the
// interpreter reports on the union's bytes; disjoint bytes (a[0:32] vs c over a[32:48]) are not.
TEST(GpuKernelErrors, UnorderedAccessesThroughTwoUnionMembersRace) {
  auto make = [](bool overlap) {
    return plgpu::kernel(
        [overlap](pl::Ref out, pl::Ref a, pl::Ref b, pl::Ref c) {
          pl::Value t = plgpu::axis_index("t");
          pl::when(t == 0, [&] { a[pl::ds(0, 32)] = pl::full({32}, pl::f32, 1.0); });
          pl::when(t == 1, [&] {
            if (overlap) b[pl::ds(8, 4)] = pl::full({4}, pl::f32, 2.0);
            else c[pl::all] = pl::full({16}, pl::i32, 3);
          });
          out[t] = t;
        },
        {pl::ShapeDtype({2}, pl::i32)}, plgpu::Mesh{.num_threads = 2, .thread_name = "t"},
        interpreted({plgpu::Union{{{plgpu::SMEM({64}, pl::f32)},
                                   {plgpu::SMEM({32}, pl::f32), plgpu::SMEM({16}, pl::i32)}}}}));
  };
  EXPECT_NO_THROW(make(false)());
  std::string e = error_of([&] { make(true)(); });
  EXPECT_CONTAINS(e, "gpu::kernel data race");
  EXPECT_CONTAINS(e, "the union of scratch[0..2] (bytes)");
  EXPECT_CONTAINS(e, "[32:48]");  // b[8:12]'s bytes
}

// The race check on a union's bytes is exact for partial rows and strided views: columns 0-3
// vs 4-7 of a 2-D member, or even vs odd elements of a 1-D member, are disjoint; element 8 of the
// 1-D member is (1, 0) of the 2-D one.
TEST(GpuKernelErrors, UnionRaceCheckSeesExactBytesOfRowsAndStridedViews) {
  auto make = [](int mode) {
    return plgpu::kernel(
        [mode](pl::Ref out, pl::Ref m2, pl::Ref flat) {
          pl::Value t = plgpu::axis_index("t");
          pl::when(t == 0, [&] {
            if (mode == 0) m2.at(pl::ds(0, 8), pl::ds(0, 4)).store({}, pl::full({8, 4}, pl::f32, 1.0));
            else flat[pl::ds(0, 32, 2)] = pl::full({32}, pl::f32, 1.0);
          });
          pl::when(t == 1, [&] {
            if (mode == 0) m2.at(pl::ds(0, 8), pl::ds(4, 4)).store({}, pl::full({8, 4}, pl::f32, 2.0));
            else if (mode == 1) flat[pl::ds(1, 32, 2)] = pl::full({32}, pl::f32, 2.0);
            else m2.at(pl::ds(1, 1), pl::ds(0, 1)).store({}, pl::full({1, 1}, pl::f32, 2.0));
          });
          out[t] = t;
        },
        {pl::ShapeDtype({2}, pl::i32)}, plgpu::Mesh{.num_threads = 2, .thread_name = "t"},
        interpreted({plgpu::Union{{{plgpu::SMEM({8, 8}, pl::f32)}, {plgpu::SMEM({64}, pl::f32)}}}}));
  };
  EXPECT_NO_THROW(make(0)());
  EXPECT_NO_THROW(make(1)());
  std::string e = error_of([&] { make(2)(); });
  EXPECT_CONTAINS(e, "gpu::kernel data race");
  // Element 8 is bytes 32-35; thread 0's strided write is one progression per byte, and the report
  // names the first that meets it.
  EXPECT_CONTAINS(e, "the union of scratch[0..1] (bytes) [256], elements [32:33]");
}

// Union sizes and placement: the largest member, its arrays 16-byte aligned; the shared-memory
// check and its message count a union once; unions take only SMEM arrays.
TEST(GpuKernelErrors, UnionSizesAndMembersAreChecked) {
  const plgpu::Union u{{{plgpu::SMEM({3}, pl::f16), plgpu::SMEM({5}, pl::f32)},  // 6 -> 16 + 20 = 36
                        {plgpu::SMEM({8}, pl::f32)}}};                             // 32
  EXPECT_EQ(plgpu::shared_memory_bytes({u}), 36);
  EXPECT_EQ(plgpu::shared_memory_bytes({plgpu::SMEM({1}, pl::i8), u, plgpu::Barrier{}}), 16 + 36 + 4 + 8);
  std::string e = error_of([&] {
    plgpu::kernel([](pl::Ref, pl::Ref, pl::Ref) {}, {pl::ShapeDtype({1}, pl::f32)}, plgpu::Mesh{},
                  interpreted({plgpu::Union{{{plgpu::SMEM({1024, 64}, pl::f32)}, {plgpu::SMEM({4}, pl::f32)}}}}));
  });
  EXPECT_CONTAINS(e, "exceeds available shared memory");
  EXPECT_CONTAINS(e, "scratch[0] Union of 2 members = 262144 B");
  EXPECT_CONTAINS(error_of([] { pl::ScratchShape s = plgpu::Union{{{plgpu::SMEM({4}, pl::f32), plgpu::Barrier{}}}}; }),
                  "member 0's entry 1 is a gpu::Barrier");
  EXPECT_CONTAINS(error_of([] { pl::ScratchShape s = plgpu::Union{{{plgpu::ACC({64, 8})}}}; }), "a union overlays gpu::SMEM arrays");
  EXPECT_CONTAINS(error_of([] { pl::ScratchShape s = plgpu::Union{}; }), "needs at least one member");
  pl::CallOptions o;
  o.grid = {1};
  o.interpret = true;
  o.scratch_shapes = {plgpu::Union{{{plgpu::SMEM({4}, pl::f32)}}}};
  EXPECT_CONTAINS(error_of([&] {
                    pl::pallas_call([](pl::Ref, pl::Ref) {}, {pl::ShapeDtype({1}, pl::f32)}, o)();
                  }),
                  "not supported yet: gpu::Union scratch outside gpu::kernel");
}

// A gpu::ClusterBarrier across the 2 CTAs of each cluster, 2 Pallas threads per CTA: every thread
// writes its quarter of the cluster's row of `mid` (GMEM), arrives (num_arrivals = 2: both threads
// of each CTA), waits, and then reads the other CTA's half. The phase needs all 4 arrivals, so the
// reads see the writes and do not race. Compiled, the clusters launch as such and the arrivals
// reach the other CTA's barrier remotely.
TEST_P(GpuKernelBoth, ClusterBarrierOrdersTheCtasOfAClusterThroughGmem) {
  constexpr int kGrid = 3, kQuarter = 8;
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref mid, pl::Ref out, pl::Ref bar) {
        pl::Value g = plgpu::axis_index("g"), c = plgpu::axis_index("c"), t = plgpu::axis_index("t");
        pl::Value mine = (g * 4 + c * 2 + t) * kQuarter;
        mid[pl::ds(mine, kQuarter)] = x[pl::ds(mine, kQuarter)] * 2.0f;
        plgpu::barrier_arrive(bar);
        plgpu::barrier_wait(bar);
        pl::Value theirs = (g * 4 + (1 - c) * 2 + t) * kQuarter;
        out[pl::ds(mine, kQuarter)] = mid[pl::ds(theirs, kQuarter)] + 1.0f;
      },
      {pl::ShapeDtype({kGrid * 4 * kQuarter}, pl::f32), pl::ShapeDtype({kGrid * 4 * kQuarter}, pl::f32)},
      plgpu::Mesh{.grid = {kGrid}, .grid_names = {"g"}, .cluster = {2}, .cluster_names = {"c"},
                  .num_threads = 2, .thread_name = "t"},
      run_on(GetParam(), {plgpu::ClusterBarrier{.collective_axes = {"c"}, .num_arrivals = 2}}));
  pl::Array x = random_f32({kGrid * 4 * kQuarter}, 5);
  std::vector<pl::Array> r = call(x);
  for (int g = 0; g < kGrid; ++g)
    for (int c = 0; c < 2; ++c)
      for (int i = 0; i < 2 * kQuarter; ++i) {
        const int at = (g * 4 + c * 2) * kQuarter + i, from = (g * 4 + (1 - c) * 2) * kQuarter + i;
        EXPECT_EQ(r[0].data<float>()[at], 2.0f * x.data<float>()[at]) << at;
        EXPECT_EQ(r[1].data<float>()[at], 2.0f * x.data<float>()[from] + 1.0f) << at;
      }
}

// In a 2 x 2 cluster, an arrival reaches the CTAs that differ from the caller along at most one of
// the collective axes: with {"x"} the x-neighbour, with {"x", "y"} both neighbours but not the
// diagonal CTA. Reading what a CTA outside that set wrote before its arrival is a race.
TEST(GpuKernelErrors, ClusterBarrierReachesOnlyItsPeers) {
  auto make = [](std::vector<std::string> axes, int dx, int dy) {
    return plgpu::kernel(
        [dx, dy](pl::Ref mid, pl::Ref out, pl::Ref bar) {
          pl::Value x = plgpu::axis_index("x"), y = plgpu::axis_index("y");
          mid[x * 2 + y] = x * 10 + y + 1;
          plgpu::barrier_arrive(bar);
          plgpu::barrier_wait(bar);
          pl::Value seen = mid[((x + dx) % 2) * 2 + (y + dy) % 2];
          out[x * 2 + y] = seen;
        },
        {pl::ShapeDtype({4}, pl::i32), pl::ShapeDtype({4}, pl::i32)},
        plgpu::Mesh{.cluster = {2, 2}, .cluster_names = {"x", "y"}},
        interpreted({plgpu::ClusterBarrier{.collective_axes = std::move(axes)}}));
  };
  auto expect_reads = [](pl::PallasCall call, int dx, int dy) {
    pl::Array out = call().at(1);
    for (int x = 0; x < 2; ++x)
      for (int y = 0; y < 2; ++y)
        EXPECT_EQ(out.data<int32_t>()[x * 2 + y], ((x + dx) % 2) * 10 + (y + dy) % 2 + 1) << x << y;
  };
  expect_reads(make({"x"}, 1, 0), 1, 0);
  expect_reads(make({"y"}, 0, 1), 0, 1);
  expect_reads(make({"x", "y"}, 1, 0), 1, 0);
  expect_reads(make({"x", "y"}, 0, 1), 0, 1);
  for (auto [axes, dx, dy] : {std::tuple<std::vector<std::string>, int, int>{{"x"}, 0, 1},
                              {{"y"}, 1, 0}, {{"x", "y"}, 1, 1}}) {
    std::string e = error_of([&] { make(axes, dx, dy)(); });
    EXPECT_CONTAINS(e, "gpu::kernel data race");
    EXPECT_CONTAINS(e, "on output 0 [4]");
  }
}

// A multicast copy (copy_gmem_to_smem with collective_axes) in 2 x 2 clusters, collective along x:
// the two CTAs of each y copy the same rows of `x` (chosen by the cluster and y), each issuing its
// share, and each gets all of them in its own SMEM; then every CTA writes its SMEM scaled by its
// own factor. Twice in a row on two buffers, the second time after a gpu::ClusterBarrier tells both
// peers that the first buffer is no longer read.
constexpr int kMulticastRows = 16, kMulticastCols = 8;
pl::PallasCall multicast_copies(const std::string& how) {
  constexpr int kGrid = 2, kRows = kMulticastRows, kCols = kMulticastCols;
  return plgpu::kernel(
      [](pl::Ref x, pl::Ref out, pl::Ref a, pl::Ref b, pl::Ref bars, pl::Ref done) {
        pl::Value g = plgpu::axis_index("g"), cx = plgpu::axis_index("x"), cy = plgpu::axis_index("y");
        pl::Value block = g * 2 + cy, cta = (g * 2 + cy) * 2 + cx;
        plgpu::copy_gmem_to_smem(x.at(pl::ds(block * kRows, kRows), pl::ds(0, kCols)), a, bars.at(0), {"x"});
        plgpu::barrier_wait(bars.at(0));
        pl::Value scale = (cx + 1).astype(pl::f32);
        out.at(pl::ds(cta * kRows, kRows), pl::ds(0, kCols))[pl::all] = a[pl::all] * scale;
        plgpu::barrier_arrive(done);  // a is read: the peers may fill b
        plgpu::barrier_wait(done);
        plgpu::copy_gmem_to_smem(x.at(pl::ds(block * kRows, kRows), pl::ds(kCols, kCols)), b, bars.at(1), {"x"});
        plgpu::barrier_wait(bars.at(1));
        out.at(pl::ds(cta * kRows, kRows), pl::ds(kCols, kCols))[pl::all] = b[pl::all] * scale;
      },
      {pl::ShapeDtype({kGrid * 4 * kRows, 2 * kCols}, pl::f32)},
      plgpu::Mesh{.grid = {kGrid}, .grid_names = {"g"}, .cluster = {2, 2}, .cluster_names = {"x", "y"}},
      run_on(how, {plgpu::SMEM({kRows, kCols}, pl::f32), plgpu::SMEM({kRows, kCols}, pl::f32),
                   plgpu::Barrier{.num_barriers = 2}, plgpu::ClusterBarrier{.collective_axes = {"x"}}}));
}
pl::Array multicast_copies_input() { return random_f32({2 * 2 * kMulticastRows, 2 * kMulticastCols}, 9); }
void expect_multicast_copies(const pl::Array& x, const pl::Array& out) {
  for (int g = 0; g < 2; ++g)
    for (int cy = 0; cy < 2; ++cy)
      for (int cx = 0; cx < 2; ++cx)
        for (int r = 0; r < kMulticastRows; ++r)
          for (int c = 0; c < 2 * kMulticastCols; ++c) {
            const int cta = (g * 2 + cy) * 2 + cx, block = g * 2 + cy;
            EXPECT_EQ(out.get({cta * kMulticastRows + r, c}), x.get({block * kMulticastRows + r, c}) * (cx + 1))
                << "CTA " << cta << " [" << r << ", " << c << "]";
          }
}

TEST_P(GpuKernelBoth, MulticastCopiesLandInEveryPeer) {
  const pl::Array x = multicast_copies_input();
  expect_multicast_copies(x, multicast_copies(GetParam())(x).at(0));
}

// Compiled, a multicast copy whose shares are boxes goes by TMA multicast: each CTA arrives with
// the whole block's bytes on its own barrier and issues its share (8 of the 16 rows) once, landing
// in its peer's SMEM and completing on the peer's barrier too. Along x in 2 x 2 clusters (ranks
// row-major over (x, y)) the peers are ranks 0 and 2, 1 and 3. Checked: the map (an 8 x 8 box),
// the peers' masks and shares, one box per CTA and copy in host emulation (each share written
// into both CTAs, which each then read it all), the PTX and the machine code. Without multicast
// (PALLAS_GPU_NO_MULTICAST=1) each CTA copies the whole block, a 16 x 8 box.
TEST(GpuKernel, MulticastCopiesGoByTmaMulticast) {
  const pl::Array x = multicast_copies_input();
  std::shared_ptr<const pl::TracedCall> tc = multicast_copies("mosaic_gpu").trace({x.shape_dtype()});
  plgpu::CodegenOptions whole;
  whole.multicast = false;
  for (bool multicast : {false, true}) {
    SCOPED_TRACE(multicast ? "multicast" : "whole copies");
    const plgpu::GeneratedKernel k =
        plgpu::generate_cuda(*tc, tc->grid_mapping.grid, multicast ? plgpu::CodegenOptions{} : whole);
    ASSERT_EQ(k.tensor_maps.size(), 1u);
    const uint32_t rows = multicast ? kMulticastRows / 2 : kMulticastRows;
    EXPECT_EQ(k.tensor_maps[0], (plgpu::TensorMapSpec{0, 4, {2 * kMulticastCols, 2 * 2 * kMulticastRows},
                                                       {2 * kMulticastCols * 4}, {kMulticastCols, rows}}));
    EXPECT_EQ(k.source.find("pl_tma_load_multicast<2>(") != std::string::npos, multicast);
    EXPECT_EQ(k.source.find("const pl_u32 peers = (rank == 0 ? 5u : rank == 1 ? 10u : rank == 2 ? 5u : 10u);") !=
                  std::string::npos,
              multicast);
    EXPECT_EQ(k.source.find("const pl_i64 share = (rank == 0 ? 0 : rank == 1 ? 0 : rank == 2 ? 1 : 1);") != std::string::npos,
              multicast);
    EXPECT_CONTAINS(k.source, "pl_expect_tx((pl_mbar + 0), 512u);");  // the whole block's bytes (16 x 8 x 4)
    plgpu::HostEmulationStats stats;
    const pl::Array out = plgpu::run_host_emulation(*tc, k, {x}, tc->grid_mapping.grid, 4, &stats).at(0);
    EXPECT_EQ(stats.tma_boxes, 16);  // 8 CTAs x 2 copies: a share each, or the whole block each
    expect_multicast_copies(x, out);
    if (!multicast) continue;
    if (std::string why = pl::gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
    const pl::gpu::CompiledKernel ptx = pl::gpu::Nvrtc::get().compile(k.source, "multicast.cu", "compute_90a");
    EXPECT_CONTAINS(std::string(ptx.image.begin(), ptx.image.end()),
                    "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster");
    if (test_util::find_cuobjdump().empty()) GTEST_SKIP() << "no cuobjdump (run scripts/get_cuda_tools.sh)";
    EXPECT_CONTAINS(test_util::sass_of(k.source, "sm_90a"), "UTMALDG.2D.MULTICAST");
  }
}

// Collective along both axes of 2 x 2 clusters: the four CTAs of a cluster copy one block
// together, a quarter each (4 of its 16 rows), and each gets all of it. Compiled: every rank's
// peers are all four (mask 15), its share its rank.
pl::PallasCall multicast_along_both_axes(const std::string& how) {
  return plgpu::kernel(
      [](pl::Ref x, pl::Ref out, pl::Ref s, pl::Ref bar) {
        pl::Value g = plgpu::axis_index("g"), cx = plgpu::axis_index("x"), cy = plgpu::axis_index("y");
        pl::Value cta = (g * 2 + cx) * 2 + cy;
        plgpu::copy_gmem_to_smem(x.at(pl::ds(g * 16, 16), pl::all), s, bar, {"x", "y"});
        plgpu::barrier_wait(bar);
        out.at(pl::ds(cta * 16, 16), pl::all)[pl::all] = s[pl::all] * (cta + 1).astype(pl::f32);
      },
      {pl::ShapeDtype({2 * 4 * 16, 8}, pl::f32)},
      plgpu::Mesh{.grid = {2}, .grid_names = {"g"}, .cluster = {2, 2}, .cluster_names = {"x", "y"}},
      run_on(how, {plgpu::SMEM({16, 8}, pl::f32), plgpu::Barrier{}}));
}

TEST_P(GpuKernelBoth, MulticastCopyAlongBothClusterAxes) {
  const pl::Array x = random_f32({32, 8}, 33);
  const pl::Array out = multicast_along_both_axes(GetParam())(x).at(0);
  for (int cta = 0; cta < 8; ++cta)
    for (int e = 0; e < 16 * 8; ++e)
      EXPECT_EQ(out.data<float>()[cta * 128 + e], x.data<float>()[cta / 4 * 128 + e] * float(cta + 1)) << cta << " " << e;
  if (GetParam() != "gpu_emulate") return;
  std::shared_ptr<const pl::TracedCall> tc = multicast_along_both_axes("mosaic_gpu").trace({x.shape_dtype()});
  const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
  EXPECT_CONTAINS(k.source, "const pl_u32 peers = 15u;");
  EXPECT_CONTAINS(k.source, "const pl_i64 share = (rank == 0 ? 0 : rank == 1 ? 1 : rank == 2 ? 2 : 3);");
  ASSERT_EQ(k.tensor_maps.size(), 1u);
  EXPECT_EQ(k.tensor_maps[0], (plgpu::TensorMapSpec{0, 4, {8, 32}, {32}, {8, 4}}));
  plgpu::HostEmulationStats stats;
  plgpu::run_host_emulation(*tc, k, {x}, tc->grid_mapping.grid, 4, &stats);
  EXPECT_EQ(stats.tma_boxes, 8);  // one share per CTA
}

// Two multicast copies completing on one barrier, each among its own peers: a along x, b along
// y, in 2 x 2 clusters (the 2-D cluster matmul's x and y blocks). Each lands where its own
// peers put it; the barrier's phase takes both copies' arrivals.
pl::PallasCall two_multicasts_into_one_barrier(const std::string& how) {
  return plgpu::kernel(
      [](pl::Ref x, pl::Ref y, pl::Ref out, pl::Ref a, pl::Ref b, pl::Ref bar) {
        pl::Value cx = plgpu::axis_index("x"), cy = plgpu::axis_index("y");
        pl::Value cta = cx * 2 + cy;
        plgpu::copy_gmem_to_smem(x.at(pl::ds(cy * 16, 16), pl::all), a, bar, {"x"});  // same for both x-peers
        plgpu::copy_gmem_to_smem(y.at(pl::ds(cx * 16, 16), pl::all), b, bar, {"y"});  // same for both y-peers
        plgpu::barrier_wait(bar);
        out.at(pl::ds(cta * 16, 16), pl::all)[pl::all] = a[pl::all] * 10.0f + b[pl::all];
      },
      {pl::ShapeDtype({4 * 16, 8}, pl::f32)}, plgpu::Mesh{.cluster = {2, 2}, .cluster_names = {"x", "y"}},
      run_on(how, {plgpu::SMEM({16, 8}, pl::f32), plgpu::SMEM({16, 8}, pl::f32), plgpu::Barrier{.num_arrivals = 2}}));
}

TEST_P(GpuKernelBoth, TwoMulticastCopiesAlongDifferentAxesCompleteOnOneBarrier) {
  const pl::Array x = random_f32({32, 8}, 51), y = random_f32({32, 8}, 52);
  const pl::Array out = two_multicasts_into_one_barrier(GetParam())(x, y).at(0);
  for (int cx = 0; cx < 2; ++cx)
    for (int cy = 0; cy < 2; ++cy)
      for (int e = 0; e < 16 * 8; ++e)
        EXPECT_EQ(out.data<float>()[(cx * 2 + cy) * 128 + e],
                  x.data<float>()[cy * 128 + e] * 10.0f + y.data<float>()[cx * 128 + e])
            << cx << cy << " " << e;
}

// A block too tall for one TMA box (512 rows; a box dim holds at most 256) still multicasts: each
// of the two CTAs' shares is a box of 256 rows.
TEST(GpuKernel, AMulticastCopyWhoseSharesAreBoxesGoesByTmaWhenTheWholeIsNot) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref out, pl::Ref s, pl::Ref bar) {
        pl::Value c = plgpu::axis_index("c");
        plgpu::copy_gmem_to_smem(x, s, bar, {"c"});
        plgpu::barrier_wait(bar);
        out.at(pl::ds(c * 512, 512), pl::all)[pl::all] = s[pl::all] + c.astype(pl::f32);
      },
      {pl::ShapeDtype({1024, 4}, pl::f32)}, plgpu::Mesh{.cluster = {2}, .cluster_names = {"c"}},
      run_on("mosaic_gpu", {plgpu::SMEM({512, 4}, pl::f32), plgpu::Barrier{}}));
  const pl::Array x = random_f32({512, 4}, 31);
  std::shared_ptr<const pl::TracedCall> tc = call.trace({x.shape_dtype()});
  const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
  ASSERT_EQ(k.tensor_maps.size(), 1u);
  EXPECT_EQ(k.tensor_maps[0], (plgpu::TensorMapSpec{0, 4, {4, 512}, {16}, {4, 256}}));
  plgpu::HostEmulationStats stats;
  const pl::Array out = plgpu::run_host_emulation(*tc, k, {x}, tc->grid_mapping.grid, 4, &stats).at(0);
  EXPECT_EQ(stats.tma_boxes, 2);
  for (int c = 0; c < 2; ++c)
    for (int e = 0; e < 512 * 4; ++e)
      EXPECT_EQ(out.data<float>()[c * 2048 + e], x.data<float>()[e] + float(c)) << c << " " << e;
}

// A multicast copy into a tile wgmma reads in place: y's (64, 128) bf16 block, which both CTAs of
// a 2-CTA cluster multiply their own x rows by. Compiled, the tile is 128-byte swizzled in two
// 64-column panels, and each CTA's share is 32 rows of each panel (a box per panel, from a
// multiple of the swizzle's 8 rows), landing swizzled in both CTAs.
pl::PallasCall multicast_into_wgmma_tile(const std::string& how) {
  constexpr int M = 64, N = 128, K = 64;
  return plgpu::kernel(
      [](pl::Ref x, pl::Ref y, pl::Ref out, pl::Ref x_s, pl::Ref y_s, pl::Ref acc, pl::Ref bar) {
        pl::Value c = plgpu::axis_index("c");
        plgpu::copy_gmem_to_smem(x.at(pl::ds(c * M, M), pl::all), x_s, bar);
        plgpu::copy_gmem_to_smem(y, y_s, bar, {"c"});
        plgpu::barrier_wait(bar);
        acc[pl::all] = pl::zeros({M, N}, pl::f32);
        plgpu::wgmma(acc, x_s, y_s);
        plgpu::wgmma_wait(0);
        out.at(pl::ds(c * M, M), pl::all)[pl::all] = acc[pl::all];
      },
      {pl::ShapeDtype({2 * M, N}, pl::f32)}, plgpu::Mesh{.cluster = {2}, .cluster_names = {"c"}},
      run_on(how, {plgpu::SMEM({M, K}, pl::bf16), plgpu::SMEM({K, N}, pl::bf16), plgpu::ACC({M, N}),
                   plgpu::Barrier{.num_arrivals = 2}}));
}

TEST_P(GpuKernelBoth, MulticastCopyIntoASwizzledTileOfTwoPanels) {
  pl::Array x = random_f32({128, 64}, 21).astype(pl::bf16), y = random_f32({64, 128}, 22).astype(pl::bf16);
  expect_product_of(x, y, multicast_into_wgmma_tile(GetParam())(x, y).at(0));
}

TEST(GpuKernel, MulticastCopyIntoASwizzledTileGoesAsBoxesPerPanel) {
  pl::Array x = random_f32({128, 64}, 21).astype(pl::bf16), y = random_f32({64, 128}, 22).astype(pl::bf16);
  std::shared_ptr<const pl::TracedCall> tc = multicast_into_wgmma_tile("mosaic_gpu").trace({x.shape_dtype(), y.shape_dtype()});
  const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
  // x's box (64 x 64, swizzled), y's share: 32 rows of a 64-column panel (swizzled).
  ASSERT_EQ(k.tensor_maps.size(), 2u);
  EXPECT_EQ(k.tensor_maps[0], (plgpu::TensorMapSpec{0, 2, {64, 128}, {128}, {64, 64}, 128}));
  EXPECT_EQ(k.tensor_maps[1], (plgpu::TensorMapSpec{1, 2, {128, 64}, {256}, {64, 32}, 128}));
  EXPECT_CONTAINS(k.source, "pl_expect_tx((pl_mbar + 0), 16384u);");  // all of y: 64 x 128 x 2 bytes
  EXPECT_CONTAINS(k.source, "const pl_i64 share = (rank == 0 ? 0 : 1);");
  plgpu::HostEmulationStats stats;
  const pl::Array out = plgpu::run_host_emulation(*tc, k, {x, y}, tc->grid_mapping.grid, 128, &stats).at(0);
  EXPECT_EQ(stats.tma_boxes, 2 * (1 + 2));  // per CTA: x's box, y's share in each of 2 panels
  EXPECT_GT(stats.wgmma_instructions, 0);
  expect_product_of(x, y, out);
  // A peer's share may land before this CTA's own expect-tx arrival: the barrier's transaction
  // count goes negative meanwhile, and host emulation keeps it so. Shown with CTA 1's issuing
  // thread paused before its x copy (CTA 0's share of y is in by then) and again before its
  // multicast, while its other threads test the barrier: landing x's arrival and box with CTA 0's
  // share leaves the count at -8192, not complete — the phase still waits for all of y.
  plgpu::GeneratedKernel paused = k;
  for (const std::string issue : {"pl_expect_tx((pl_mbar + 0), 16384u);", "pl_expect_tx((pl_mbar + 0), 8192u);"}) {
    const size_t at = paused.source.find(issue);
    ASSERT_NE(at, std::string::npos);
    paused.source.insert(at, "if (pl_cluster_rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50)); ");
  }
  expect_product_of(x, y, plgpu::run_host_emulation(*tc, paused, {x, y}, tc->grid_mapping.grid, 128).at(0));
}

// What goes wrong with multicast copies is an error naming it: a peer that never issues its share
// (the others' barrier never completes), peers copying different sources, a share issued into a
// buffer a peer still reads (a race: its copy writes the peer's SMEM), a copy that does not split
// among the peers, and collective axes that are not the mesh's cluster axes.
TEST(GpuKernelErrors, MulticastCopyMisuse) {
  auto make = [](std::function<void(pl::Ref, pl::Ref, pl::Ref, pl::Ref, pl::Value)> body, pl::Shape smem = {8}) {
    return plgpu::kernel(
        [body](pl::Ref x, pl::Ref out, pl::Ref s, pl::Ref bar) { body(x, out, s, bar, plgpu::axis_index("c")); },
        {pl::ShapeDtype({16}, pl::f32)}, plgpu::Mesh{.cluster = {2}, .cluster_names = {"c"}},
        interpreted({plgpu::SMEM(std::move(smem), pl::f32), plgpu::Barrier{}}));
  };
  const pl::Array x = random_f32({16}, 3);
  std::string e = error_of([&] {
    make([](pl::Ref x, pl::Ref out, pl::Ref s, pl::Ref bar, pl::Value c) {
      pl::when(c == 0, [&] { plgpu::copy_gmem_to_smem(x.at(pl::ds(0, 8)), s, bar, {"c"}); });
      plgpu::barrier_wait(bar);
      out.at(pl::ds(c * 8, 8))[pl::all] = s[pl::all];
    })(x);
  });
  EXPECT_CONTAINS(e, "a multicast copy into it has the shares of 1 of its 2 CTAs: a peer has not issued its copy_gmem_to_smem");
  e = error_of([&] {
    make([](pl::Ref x, pl::Ref out, pl::Ref s, pl::Ref bar, pl::Value c) {
      plgpu::copy_gmem_to_smem(x.at(pl::ds(c * 8, 8)), s, bar, {"c"});
      plgpu::barrier_wait(bar);
      out.at(pl::ds(c * 8, 8))[pl::all] = s[pl::all];
    })(x);
  });
  EXPECT_CONTAINS(e, "copy_gmem_to_smem with collective_axes (c): CTA (1,) copies input 0 from [8], shape [8], but "
                     "CTA (0,) copied input 0 from [0], shape [8]");
  EXPECT_CONTAINS(e, "every peer must copy the same source");
  e = error_of([&] {
    make([](pl::Ref x, pl::Ref out, pl::Ref s, pl::Ref bar, pl::Value c) {
      for (int round = 0; round < 2; ++round) {  // no cluster barrier between the rounds
        plgpu::copy_gmem_to_smem(x.at(pl::ds(round * 8, 8)), s, bar, {"c"});
        plgpu::barrier_wait(bar);
        out.at(pl::ds(c * 8, 8))[pl::all] = s[pl::all];
      }
    })(x);
  });
  EXPECT_CONTAINS(e, "gpu::kernel data race");
  EXPECT_CONTAINS(e, "the multicast copy to SMEM issued by CTA");
  e = error_of([&] {
    make(
        [](pl::Ref x, pl::Ref out, pl::Ref s, pl::Ref bar, pl::Value) {
          plgpu::copy_gmem_to_smem(x.at(pl::ds(0, 3)), s, bar, {"c"});
          plgpu::barrier_wait(bar);
          out.at(pl::ds(0, 3))[pl::all] = s[pl::all];
        },
        {3})(x);
  });
  EXPECT_CONTAINS(e, "copy_gmem_to_smem with collective_axes (c): no dimension of the copy's shape [3] divides into "
                     "equal shares for its 2 CTAs");
  e = error_of([&] {
    make([](pl::Ref x, pl::Ref, pl::Ref s, pl::Ref bar, pl::Value) {
      plgpu::copy_gmem_to_smem(x.at(pl::ds(0, 8)), s, bar, {"g"});
    })(x);
  });
  EXPECT_CONTAINS(e, "copy_gmem_to_smem: the collective axis 'g' is not a cluster axis of the mesh (cluster axes: c)");
  e = error_of([&] {
    plgpu::kernel(
        [](pl::Ref x, pl::Ref, pl::Ref s, pl::Ref bar) { plgpu::copy_gmem_to_smem(x.at(pl::ds(0, 8)), s, bar, {"c"}); },
        {pl::ShapeDtype({16}, pl::f32)}, plgpu::Mesh{.grid = {2}, .grid_names = {"c"}},
        interpreted({plgpu::SMEM({8}, pl::f32), plgpu::Barrier{}}))(x);
  });
  EXPECT_CONTAINS(e, "only a gpu::kernel whose mesh has cluster axes can multicast a copy");
}

// A ClusterBarrier whose phase counts only one CTA's arrivals (a cluster of 1 CTA) runs compiled as
// a barrier of the CTA: both Pallas threads write half of a buffer, arrive, wait, and read the
// other half. TMABarrier is a barrier that one copy completes.
TEST_P(GpuKernelBoth, ClusterBarrierOfOneCtaAndTmaBarrier) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref out, pl::Ref buf, pl::Ref bar, pl::Ref copied) {
        pl::Value t = plgpu::axis_index("t");
        pl::when(t == 0, [&] {
          plgpu::copy_gmem_to_smem(x, buf, copied);
          plgpu::barrier_wait(copied);
        });
        pl::when(t == 1, [&] { plgpu::barrier_wait(copied); });
        out[pl::ds(t * 32, 32)] = buf[pl::ds(t * 32, 32)] * 3.0f;
        plgpu::barrier_arrive(bar);
        plgpu::barrier_wait(bar);
        out[pl::ds(64 + t * 32, 32)] = out[pl::ds((1 - t) * 32, 32)] + 1.0f;
      },
      {pl::ShapeDtype({128}, pl::f32)},
      plgpu::Mesh{.cluster = {1}, .cluster_names = {"c"}, .num_threads = 2, .thread_name = "t"},
      run_on(GetParam(), {plgpu::SMEM({64}, pl::f32), plgpu::ClusterBarrier{.collective_axes = {"c"}, .num_arrivals = 2},
                          plgpu::TMABarrier{}}));
  pl::Array x = random_f32({64}, 6);
  pl::Array out = call(x).at(0);
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(out.data<float>()[i], 3.0f * x.data<float>()[i]) << i;
    const int other = i < 32 ? i + 32 : i - 32;
    EXPECT_EQ(out.data<float>()[64 + i], 3.0f * x.data<float>()[other] + 1.0f) << i;
  }
}

TEST(GpuKernelErrors, ClusterAndTmaBarrierChecks) {
  auto make = [](plgpu::ClusterBarrier b) {
    plgpu::kernel([](pl::Ref, pl::Ref) {}, {pl::ShapeDtype({1}, pl::f32)},
                  plgpu::Mesh{.grid = {2}, .grid_names = {"g"}, .cluster = {2, 4}, .cluster_names = {"c", "d"}},
                  interpreted({b}));
  };
  EXPECT_CONTAINS(error_of([&] { make({.collective_axes = {"g"}}); }),
                  "scratch_shapes[0] (gpu::ClusterBarrier): the collective axis 'g' is not a cluster axis of the "
                  "mesh (cluster axes: c, d)");
  EXPECT_CONTAINS(error_of([&] { make({.collective_axes = {"c", "c"}}); }), "'c' is named twice");
  EXPECT_CONTAINS(error_of([&] { make({}); }), "needs at least one collective axis");
  EXPECT_CONTAINS(error_of([&] { make({.collective_axes = {"c"}, .num_arrivals = 0}); }),
                  "gpu::ClusterBarrier: num_arrivals must be at least 1");
  // 4 peers along c and d (2 + 4 - 1 = 5 CTAs) x 20000 arrivals is beyond an mbarrier's count.
  EXPECT_CONTAINS(error_of([&] { make({.collective_axes = {"c", "d"}, .num_arrivals = 20000}); }),
                  "a phase needs 20000 arrivals from each of 5 CTAs");
  EXPECT_NO_THROW(make({.collective_axes = {"c", "d"}, .num_arrivals = 13107}));
  EXPECT_CONTAINS(error_of([] { (void)pl::ScratchShape(plgpu::TMABarrier{0}); }),
                  "gpu::TMABarrier: num_barriers must be at least 1");
  // Copies arrive on barriers of their own CTA.
  pl::PallasCall copy = plgpu::kernel(
      [](pl::Ref x, pl::Ref out, pl::Ref buf, pl::Ref bar) {
        plgpu::copy_gmem_to_smem(x, buf, bar);
        plgpu::barrier_wait(bar);
        out[pl::all] = buf[pl::all];
      },
      {pl::ShapeDtype({8}, pl::f32)}, plgpu::Mesh{.cluster = {2}, .cluster_names = {"c"}},
      interpreted({plgpu::SMEM({8}, pl::f32), plgpu::ClusterBarrier{.collective_axes = {"c"}}}));
  std::string e = error_of([&] { copy(random_f32({8}, 1)); });
  EXPECT_CONTAINS(e, "gpu_copy_gmem_to_smem: the copy would arrive on barrier scratch[1] of CTA (0,), a "
                     "gpu::ClusterBarrier; copies arrive on a barrier of their own CTA");
  EXPECT_CONTAINS(e, "gpu_kernel_test.cpp:" + std::to_string(__LINE__ - 9));
  pl::CallOptions o;
  o.grid = {1};
  o.interpret = true;
  o.scratch_shapes = {plgpu::ClusterBarrier{.collective_axes = {"c"}}};
  EXPECT_CONTAINS(error_of([&] {
                    pl::pallas_call([](pl::Ref, pl::Ref) {}, {pl::ShapeDtype({1}, pl::f32)}, o)();
                  }),
                  "not supported yet: gpu::ClusterBarrier scratch outside gpu::kernel");
}

TEST(GpuKernelErrors, MeshChecks) {
  auto make = [](plgpu::Mesh m) {
    plgpu::kernel([](pl::Ref) {}, {pl::ShapeDtype({1}, pl::f32)}, m, interpreted({}));
  };
  EXPECT_CONTAINS(error_of([&] { make({.num_threads = 2}); }), "num_threads and thread_name go together");
  EXPECT_CONTAINS(error_of([&] { make({.num_threads = 17, .thread_name = "wg"}); }), "1 to 16");
  EXPECT_CONTAINS(error_of([&] { make({.grid = {2, 2}, .grid_names = {"x"}}); }), "one name per grid dimension");
  EXPECT_CONTAINS(error_of([&] { make({.cluster = {2, 1, 1, 1}, .cluster_names = {"a", "b", "c", "d"}}); }),
                  "at most 3 dimensions");
  EXPECT_CONTAINS(error_of([&] { make({.grid = {2}, .grid_names = {"x"}, .num_threads = 2, .thread_name = "x"}); }),
                  "'x' is used twice");
  EXPECT_CONTAINS(error_of([&] { (void)pl::ScratchShape(plgpu::Barrier{.num_arrivals = 0}); }),
                  "num_arrivals must be at least 1");
}

TEST(GpuKernelErrors, PrimitivesCheckTheirOperandsAtTheUsersLine) {
  auto run = [](std::function<void(pl::Ref, pl::Ref, pl::Ref, pl::Ref, pl::Ref)> body) {
    pl::PallasCall call = plgpu::kernel(
        [body](pl::Ref x, pl::Ref smem, pl::Ref acc, pl::Ref bars, pl::Ref b16) { body(x, smem, acc, bars, b16); },
        {}, plgpu::Mesh{},
        interpreted({plgpu::SMEM({64, 16}, pl::bf16), plgpu::ACC({32, 8}), plgpu::Barrier{.num_barriers = 2},
                     plgpu::SMEM({16, 8}, pl::bf16)}));
    call(pl::Array::zeros({64, 16}, pl::bf16));
  };
  EXPECT_CONTAINS(error_of([&] { run([](pl::Ref x, pl::Ref s, pl::Ref, pl::Ref bars, pl::Ref) {
                    plgpu::copy_gmem_to_smem(x, s, bars);
                  }); }),
                  "the barrier must be a single barrier, got the array");
  EXPECT_CONTAINS(error_of([&] { run([](pl::Ref x, pl::Ref s, pl::Ref, pl::Ref bars, pl::Ref) {
                    plgpu::copy_gmem_to_smem(s, x, bars.at(0));
                  }); }),
                  "the source must be a Ref in gmem");
  EXPECT_CONTAINS(error_of([&] { run([](pl::Ref x, pl::Ref s, pl::Ref, pl::Ref bars, pl::Ref) {
                    plgpu::copy_gmem_to_smem(x.at(pl::ds(0, 32)), s, bars.at(0));
                  }); }),
                  "need the same shape and dtype");
  std::string e = error_of([&] { run([](pl::Ref, pl::Ref s, pl::Ref acc, pl::Ref, pl::Ref b16) {
                    plgpu::wgmma(acc, s.at(pl::ds(0, 32)), b16);
                  }); });
  EXPECT_CONTAINS(e, "M (acc rows) must be a multiple of 64");
  EXPECT_CONTAINS(e, "gpu_kernel_test.cpp:" + std::to_string(__LINE__ - 3));
  // a in registers takes the same rules: b's dtype, M x K.
  auto run_acc64 = [](std::function<void(pl::Ref, pl::Ref)> body) {
    pl::PallasCall call = plgpu::kernel([body](pl::Ref acc, pl::Ref b16) { body(acc, b16); }, {}, plgpu::Mesh{},
                                        interpreted({plgpu::ACC({64, 8}), plgpu::SMEM({16, 8}, pl::bf16)}));
    call();
  };
  e = error_of([&] { run_acc64([](pl::Ref acc, pl::Ref b16) { plgpu::wgmma(acc, pl::zeros({64, 16}, pl::f32), b16); }); });
  EXPECT_CONTAINS(e, "a and b need the same dtype, got f32[64,16] and ref<bf16[16,8], gpu_smem>");
  EXPECT_CONTAINS(e, "gpu_kernel_test.cpp:" + std::to_string(__LINE__ - 2));
  EXPECT_CONTAINS(error_of([&] { run_acc64([](pl::Ref acc, pl::Ref b16) { plgpu::wgmma(acc, pl::zeros({64, 32}, pl::bf16), b16); }); }),
                  "shapes do not chain");
  EXPECT_CONTAINS(error_of([&] { run([](pl::Ref, pl::Ref, pl::Ref, pl::Ref, pl::Ref) {
                    plgpu::set_max_registers(20, false);
                  }); }),
                  "multiple of 8 in [24, 256]");
}

TEST(GpuKernelErrors, CompiledCtasHoldAtMostEightWarpgroups) {
  pl::PallasCall nine = plgpu::kernel([](pl::Ref out) { out[plgpu::axis_index("wg")] = 1; },
                                      {pl::ShapeDtype({9}, pl::i32)},
                                      plgpu::Mesh{.num_threads = 9, .thread_name = "wg"});
  std::string e = error_of([&] { nine(); });
  EXPECT_CONTAINS(e, "at most 8 Pallas threads per CTA");
  EXPECT_CONTAINS(e, "got 9");
}

// A deadlock in the compiled kernel does not hang: the wait gives up after the wait limit (here
// shortened for the test) and the call raises an error naming the wait's line.
TEST(GpuKernelErrors, ACompiledDeadlockIsReportedAfterTheWaitLimit) {
  setenv("PALLAS_GPU_WAIT_TIMEOUT_MS", "200", 1);
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref out, pl::Ref bars) {
        pl::Value wg = plgpu::axis_index("wg");
        plgpu::barrier_wait(bars.at(wg));
        plgpu::barrier_arrive(bars.at(1 - wg));
        out[wg] = wg;
      },
      {pl::ShapeDtype({2}, pl::i32)}, plgpu::Mesh{.num_threads = 2, .thread_name = "wg"},
      run_on("gpu_emulate", {plgpu::Barrier{.num_barriers = 2}}));
  std::string e = error_of([&] { call(); });
  // Again, in the same loaded kernel: the failed run left nothing behind (either thread may be
  // the one that reports).
  EXPECT_CONTAINS(error_of([&] { call(); }), "the kernel deadlocks");
  unsetenv("PALLAS_GPU_WAIT_TIMEOUT_MS");
  EXPECT_CONTAINS(e, "gpu_barrier_wait: the barrier wait did not complete");
  EXPECT_CONTAINS(e, "deadlocks");
  EXPECT_CONTAINS(e, "gpu_kernel_test.cpp:" + std::to_string(__LINE__ - 13));
}

// Compiled, a Pallas thread that skips a shared scope does not hang the kernel either: the
// others' meeting gives up after the wait limit, an error at the scope's line.
TEST(GpuKernelErrors, ACompiledThreadSkippingASharedScopeIsReportedAfterTheWaitLimit) {
  setenv("PALLAS_GPU_WAIT_TIMEOUT_MS", "200", 1);
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref out) {
        pl::Value wg = plgpu::axis_index("wg");
        pl::when(wg == 0, [&] {
          pl::run_scoped(
              {plgpu::SMEM({2}, pl::i32)},
              [&](std::vector<pl::Ref> s) {
                s[0][pl::all] = pl::zeros({2}, pl::i32);
                return std::vector<pl::Value>{};
              },
              {.collective_axes = {"wg"}});
        });
        out[wg] = wg;
      },
      {pl::ShapeDtype({2}, pl::i32)}, plgpu::Mesh{.num_threads = 2, .thread_name = "wg"}, run_on("gpu_emulate", {}));
  std::string e = error_of([&] { call(); });
  unsetenv("PALLAS_GPU_WAIT_TIMEOUT_MS");
  EXPECT_CONTAINS(e, "run_scoped with collective_axes: not every Pallas thread of the CTA entered the scope within the wait limit");
  EXPECT_CONTAINS(e, "gpu_kernel_test.cpp:" + std::to_string(__LINE__ - 14));
}

// ---- Compiled ----------------------------------------------------------------------------------

// Grid and thread axes of a compiled kernel: the grid spreads over CTAs, the threads are the
// CTA's warpgroups.
TEST(GpuKernel, CompiledAxisIndicesOfGridAndThreadAxes) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref out) {
        pl::Value g = plgpu::axis_index("g"), w = plgpu::axis_index("wg");
        out[g * 3 + w] = g * 100 + w + pl::program_id(1) * 1000;
      },
      {pl::ShapeDtype({4 * 3}, pl::i32)},
      plgpu::Mesh{.grid = {4}, .grid_names = {"g"}, .num_threads = 3, .thread_name = "wg"},
      run_on("gpu_emulate", {}));
  pl::Array out = call().at(0);
  for (int g = 0; g < 4; ++g)
    for (int w = 0; w < 3; ++w) EXPECT_EQ(out.data<int32_t>()[g * 3 + w], g * 100 + w + w * 1000);
}

// Mosaic GPU's warp specialization: one producer warpgroup streams K-steps of a and b into a ring
// of slots; two consumer warpgroups each accumulate half of the output columns with wgmma and
// release a slot when both are done with it (the "free" barriers count 2 arrivals).
pl::PallasCall warp_specialized_matmul(const std::string& how) {
  constexpr int M = 64, N = 32, K = 96, kStep = 32, kSlots = 2, kHalf = N / 2;
  return plgpu::kernel(
      [](pl::Ref a, pl::Ref b, pl::Ref out, pl::Ref a_s, pl::Ref b_s, pl::Ref acc, pl::Ref full, pl::Ref free) {
        pl::Value wg = plgpu::axis_index("wg");
        pl::when(wg == 2, [&] {
          plgpu::set_max_registers(40, /*increase=*/false);
          pl::fori_loop(0, K / kStep, [&](pl::Value k) {
            pl::Value slot = k % kSlots;
            pl::when(k >= kSlots, [&] { plgpu::barrier_wait(free.at(slot)); });
            plgpu::copy_gmem_to_smem(a.at(pl::all, pl::ds(k * kStep, kStep)), a_s.at(slot), full.at(slot));
            plgpu::copy_gmem_to_smem(b.at(pl::ds(k * kStep, kStep), pl::all), b_s.at(slot), full.at(slot));
          });
        });
        pl::when(wg < 2, [&] {
          plgpu::set_max_registers(232, /*increase=*/true);
          pl::Ref my_acc = acc.at(wg);
          my_acc[pl::all] = pl::zeros({M, kHalf}, pl::f32);
          pl::fori_loop(0, K / kStep, [&](pl::Value k) {
            pl::Value slot = k % kSlots;
            plgpu::barrier_wait(full.at(slot));
            plgpu::wgmma(my_acc, a_s.at(slot), b_s.at(slot, pl::all, pl::ds(wg * kHalf, kHalf)));
            plgpu::wgmma_wait(0);
            plgpu::barrier_arrive(free.at(slot));
          });
          out.at(pl::all, pl::ds(wg * kHalf, kHalf))[pl::all] = my_acc[pl::all];
        });
      },
      {pl::ShapeDtype({M, N}, pl::f32)}, plgpu::Mesh{.num_threads = 3, .thread_name = "wg"},
      run_on(how, {plgpu::SMEM({kSlots, M, kStep}, pl::bf16), plgpu::SMEM({kSlots, kStep, N}, pl::bf16),
                   plgpu::ACC({2, M, kHalf}), plgpu::Barrier{.num_arrivals = 2, .num_barriers = kSlots},
                   plgpu::Barrier{.num_arrivals = 2, .num_barriers = kSlots}}));
}

TEST_P(GpuKernelBoth, WarpSpecializedMatmulWithOneProducerAndTwoConsumers) {
  pl::Array a = random_f32({64, 96}, 11).astype(pl::bf16);
  pl::Array b = random_f32({96, 32}, 12).astype(pl::bf16);
  expect_product_of(a, b, warp_specialized_matmul(GetParam())(a, b).at(0));
}

// wgmma on the tensor cores: with whole warpgroups (128 host threads each, as on the GPU) the
// consumers' products run as wgmma instructions (emulated from their shared-memory descriptors):
// each of the 3 wgmmas per consumer is one 64x16 block over 32 k-columns, 2 m64n16k16 steps.
TEST(GpuKernel, WgmmaRunsOnTensorCoresWithWholeWarpgroupsUnderHostEmulation) {
  pl::PallasCall call = warp_specialized_matmul("gpu_emulate");
  pl::Array a = random_f32({64, 96}, 13).astype(pl::bf16);
  pl::Array b = random_f32({96, 32}, 14).astype(pl::bf16);
  std::shared_ptr<const pl::TracedCall> tc = call.trace({a.shape_dtype(), b.shape_dtype()});
  pl::gpu::GeneratedKernel k = pl::gpu::generate_cuda(*tc, tc->grid_mapping.grid);
  EXPECT_EQ(k.tensor_core_dots, 1);
  pl::gpu::HostEmulationStats stats;
  pl::Array out = pl::gpu::run_host_emulation(*tc, k, {a, b}, tc->grid_mapping.grid, 3 * 128, &stats).at(0);
  EXPECT_EQ(stats.wgmma_instructions, 2 * 3 * 2);
  EXPECT_EQ(stats.mma_instructions, 0);
  expect_product_of(a, b, out);
}

// wgmma's staging reads a view of a that starts one column in (not 16-byte aligned: element by
// element, not in 16-byte chunks) and b's (k, n) rows (transposed into the K-major staging). One
// warpgroup of 128 host threads; values against C++, and the instruction count (one 64x32 block
// over 32 k-columns: 2 instructions).
TEST(GpuKernel, WgmmaStagesAMisalignedView) {
  constexpr int M = 64, K = 32, N = 32;
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref a, pl::Ref b, pl::Ref out, pl::Ref a_s, pl::Ref b_s, pl::Ref acc, pl::Ref bar) {
        plgpu::copy_gmem_to_smem(a, a_s, bar.at(0));
        plgpu::copy_gmem_to_smem(b, b_s, bar.at(0));
        plgpu::barrier_wait(bar.at(0));
        acc[pl::all] = pl::zeros({M, N}, pl::f32);
        plgpu::wgmma(acc, a_s.at(pl::all, pl::ds(1, K)), b_s);
        plgpu::wgmma_wait(0);
        out[pl::all] = acc[pl::all];
      },
      {pl::ShapeDtype({M, N}, pl::f32)}, plgpu::Mesh{},
      run_on("gpu_emulate", {plgpu::SMEM({M, K + 8}, pl::bf16), plgpu::SMEM({K, N}, pl::bf16), plgpu::ACC({M, N}),
                             plgpu::Barrier{.num_arrivals = 2}}));
  pl::Array a = random_f32({M, K + 8}, 15).astype(pl::bf16);
  pl::Array b = random_f32({K, N}, 16).astype(pl::bf16);
  std::shared_ptr<const pl::TracedCall> tc = call.trace({a.shape_dtype(), b.shape_dtype()});
  pl::gpu::GeneratedKernel k = pl::gpu::generate_cuda(*tc, tc->grid_mapping.grid);
  EXPECT_EQ(k.tensor_core_dots, 1);
  pl::gpu::HostEmulationStats stats;
  pl::Array out = pl::gpu::run_host_emulation(*tc, k, {a, b}, tc->grid_mapping.grid, 128, &stats).at(0);
  EXPECT_EQ(stats.wgmma_instructions, 2);
  pl::Array a_view = pl::Array::zeros({M, K}, pl::f32);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t q = 0; q < K; ++q) a_view.set({i, q}, a.get({i, q + 1}));
  expect_product_of(a_view, b, out);
}

// Thread 0 (wg) copies every K-step of a (its k_step columns) and b (its rows) into slot k of
// a_s and b_s, the two copies of a step completing on full[k].
void copy_steps_into_slots(const pl::Value& wg, const pl::Ref& a, const pl::Ref& b, const pl::Ref& a_s, const pl::Ref& b_s,
                           const pl::Ref& full, int64_t steps, int64_t k_step) {
  pl::when(wg == 0, [&] {
    for (int64_t k = 0; k < steps; ++k) {
      plgpu::copy_gmem_to_smem(a.at(pl::all, pl::ds(k * k_step, k_step)), a_s.at(k), full.at(k));
      plgpu::copy_gmem_to_smem(b.at(pl::ds(k * k_step, k_step), pl::all), b_s.at(k), full.at(k));
    }
  });
}

// SMEM tiles whose rows are 128, 64 or 32 bytes, that only copies from GMEM write and only wgmma
// reads, are kept swizzled by their rows' bytes (swizzled_smem_tiles): a's 128 x kStep slots
// K-major, b's kStep x N slots MN-major, each consumer warpgroup reading its 64 rows of a (a view
// at row 64 wg) in place. The copies are swizzled TMA boxes (one per slot and step) or, without
// maps, element copies to the swizzled positions; wgmma's descriptors say layout type 1, 2 or 3
// (emulated from them). Each way against a plain product; with the swizzle off the tiles are
// row-major and staged. A load from one (b's row k_step + 3, a view where the swizzle's pattern
// does not start) reads each element at its swizzled place.
pl::PallasCall swizzled_tiles_matmul(int64_t k_step, int64_t n, bool b_also_loaded) {
  constexpr int64_t M = 128, K = 128;
  const int64_t steps = K / k_step;
  return plgpu::kernel(
      [=](pl::Ref a, pl::Ref b, pl::Ref out, pl::Ref b_row, pl::Ref a_s, pl::Ref b_s, pl::Ref acc, pl::Ref full) {
        pl::Value wg = plgpu::axis_index("wg");
        copy_steps_into_slots(wg, a, b, a_s, b_s, full, steps, k_step);
        pl::Ref my_acc = acc.at(wg);
        my_acc[pl::all] = pl::zeros({M / 2, n}, pl::f32);
        for (int64_t k = 0; k < steps; ++k) {
          plgpu::barrier_wait(full.at(k));
          plgpu::wgmma(my_acc, a_s.at(k, pl::ds(wg * (M / 2), M / 2), pl::all), b_s.at(k));
          plgpu::wgmma_wait(0);
        }
        out.at(pl::ds(wg * (M / 2), M / 2), pl::all)[pl::all] = my_acc[pl::all];
        pl::when(wg == 0, [&] {
          b_row[pl::all] = b_also_loaded ? b_s.at(1, 3, pl::all)[pl::all].astype(pl::f32) : pl::zeros({n}, pl::f32);
        });
      },
      {pl::ShapeDtype({M, n}, pl::f32), pl::ShapeDtype({n}, pl::f32)}, plgpu::Mesh{.num_threads = 2, .thread_name = "wg"},
      run_on("gpu_emulate", {plgpu::SMEM({steps, M, k_step}, pl::bf16), plgpu::SMEM({steps, k_step, n}, pl::bf16),
                             plgpu::ACC({2, M / 2, n}), plgpu::Barrier{.num_arrivals = 2, .num_barriers = static_cast<int>(steps)}}));
}

TEST(GpuKernel, WgmmaReadsSwizzledSharedMemoryTilesInPlace) {
  pl::Array a = random_f32({128, 128}, 21).astype(pl::bf16);
  auto count_of = [](const std::string& text, const std::string& what) {
    int n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  struct Case {
    int64_t k_step, n;  // a's rows are 2 k_step bytes, b's 2 n
    bool b_also_loaded, every_path;
  };
  // (64, 128): b's rows are two 128-byte panels, a box each; wgmma's 64 x 128 blocks span both.
  for (Case c : {Case{64, 64, false, true}, Case{64, 64, true, true}, Case{32, 32, false, false}, Case{16, 16, false, false},
                 Case{32, 64, false, false}, Case{64, 128, false, false}}) {
    SCOPED_TRACE("k_step " + std::to_string(c.k_step) + ", n " + std::to_string(c.n) + (c.b_also_loaded ? ", b also loaded" : ""));
    pl::Array b = random_f32({128, c.n}, 22).astype(pl::bf16);
    pl::PallasCall call = swizzled_tiles_matmul(c.k_step, c.n, c.b_also_loaded);
    std::shared_ptr<const pl::TracedCall> tc = call.trace({a.shape_dtype(), b.shape_dtype()});
    // Every way: values against C++; b's row k_step + 3 read back by a load.
    auto run = [&](const plgpu::GeneratedKernel& k, plgpu::HostEmulationStats* stats) {
      std::vector<pl::Array> out = plgpu::run_host_emulation(*tc, k, {a, b}, tc->grid_mapping.grid, 2 * 128, stats);
      expect_product_of(a, b, out.at(0));
      if (!c.b_also_loaded) return;
      for (int64_t j = 0; j < c.n; ++j) EXPECT_EQ(out.at(1).get({j}), b.get({c.k_step + 3, j})) << j;
    };
    const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
    const int64_t b_panels = std::max<int64_t>(1, c.n / 64), panel_n = c.n / b_panels;
    const std::string wa = std::to_string(2 * c.k_step), wb = std::to_string(2 * panel_n);
    EXPECT_CONTAINS(k.source, "#define PL_SMEM_SWIZZLED_0 (PL_HAS_WGMMA ? " + wa + " : 0)");
    EXPECT_CONTAINS(k.source, "#define PL_SMEM_SWIZZLED_1 (PL_HAS_WGMMA ? " + wb + " : 0)");
    EXPECT_CONTAINS(k.source, "pl_tc_dot_acc<false, " + std::to_string(c.n) +
                                  ", pl_swizzled_layout(PL_SMEM_SWIZZLED_0, false), pl_swizzled_layout(PL_SMEM_SWIZZLED_1, true)"
                                  ", 1, PL_KERNEL_WGMMA_PENDING>(pl_acc_2, ");
    // Both operands in place: wgmma needs no staging.
    EXPECT_TRUE(k.uses_wgmma);
    EXPECT_EQ(k.wgmma_staging_bytes, 0);
    // The maps, by hand: a's boxes k_step columns x 128 rows, b's n x k_step, swizzled or not.
    ASSERT_EQ(k.tensor_maps.size(), 2u);
    const uint32_t ks = static_cast<uint32_t>(c.k_step), n = static_cast<uint32_t>(c.n);
    EXPECT_EQ(k.tensor_maps[0], (plgpu::TensorMapSpec{0, 2, {128, 128}, {256}, {ks, 128}, 2 * static_cast<int>(ks)}));
    const uint32_t pn = static_cast<uint32_t>(panel_n);
    EXPECT_EQ(k.tensor_maps[1], (plgpu::TensorMapSpec{1, 2, {n, 128}, {2 * n}, {pn, ks}, 2 * static_cast<int>(pn)}));
    if (b_panels > 1) {
      EXPECT_CONTAINS(k.source, "pl_smem_elem<PL_SMEM_SWIZZLED_1, pl_bf16, " + std::to_string(c.n) + ", " +
                                    std::to_string(c.k_step) + ">(");
    }
    plgpu::HostEmulationStats stats;
    run(k, &stats);
    EXPECT_EQ(stats.tma_boxes, (1 + b_panels) * 128 / c.k_step);  // a step's a and b (a box per panel)
    // Per consumer: a 64 x n block over K 128 in 16-deep instructions.
    EXPECT_EQ(stats.wgmma_instructions, 2 * 128 / 16);
    // Without tensor maps the copies write the swizzled positions element by element.
    const plgpu::GeneratedKernel no_maps = plgpu::generate_cuda(*tc, tc->grid_mapping.grid, {.tma = false});
    EXPECT_CONTAINS(no_maps.source, "[pl_smem_elem<PL_SMEM_SWIZZLED_0, pl_bf16>(");
    // wgmma reads them in place with no fence of its own: the threads that wrote the elements of
    // a swizzled tile (a line `tile[pl_smem_elem<...>(e)] = ...` per copy) fence them for the
    // async proxy before the group's sync and the copy's arrival.
    const std::string unindented = std::regex_replace(no_maps.source, std::regex("\n +"), "\n");
    const std::regex element_copy("\n[^\n=]*\\[pl_smem_elem<PL_SMEM_SWIZZLED_[^\n]*e\\)\\] = ");
    const auto copies = std::distance(std::sregex_iterator(unindented.begin(), unindented.end(), element_copy),
                                      std::sregex_iterator());
    EXPECT_GT(copies, 0);
    EXPECT_EQ(count_of(unindented, "pl_fence_proxy_async();\npl_sync();\nif (pl_tid() == 0) pl_mbar_arrive("), copies);
    plgpu::HostEmulationStats element_stats;
    run(no_maps, &element_stats);
    EXPECT_EQ(element_stats.tma_boxes, 0);
    if (!c.every_path) continue;
    // The CUDA-core loop (fewer host threads than warpgroups) reads them where they are too.
    std::vector<pl::Array> few = plgpu::run_host_emulation(*tc, k, {a, b}, tc->grid_mapping.grid, 2, nullptr);
    expect_product_of(a, b, few.at(0));
    // No swizzle: row-major tiles, unswizzled maps.
    const plgpu::GeneratedKernel plain = plgpu::generate_cuda(*tc, tc->grid_mapping.grid, {.swizzle = false});
    EXPECT_EQ(count_of(plain.source, "#define PL_SMEM_SWIZZLED_"), 0);
    EXPECT_EQ(plain.tensor_maps[0].swizzle_bytes, 0);
    run(plain, nullptr);
    // Where the swizzle's KiB alignment (here the static shared memory padded to 1 KiB) is what
    // does not fit in the device's shared memory, the kernel is generated unswizzled instead.
    const plgpu::GeneratedKernel tight = plgpu::generate_cuda(*tc, tc->grid_mapping.grid,
                                                              {.max_shared_bytes = plain.arena_bytes + 512});
    EXPECT_EQ(count_of(tight.source, "#define PL_SMEM_SWIZZLED_"), 0);
    EXPECT_THROW(plgpu::generate_cuda(*tc, tc->grid_mapping.grid, {.max_shared_bytes = plain.arena_bytes}), pl::Error);
  }
  // A swizzled tile's descriptor read as unswizzled gives other numbers (the test can fail).
  pl::Array b = random_f32({128, 32}, 22).astype(pl::bf16);
  std::shared_ptr<const pl::TracedCall> tc = swizzled_tiles_matmul(32, 32, false).trace({a.shape_dtype(), b.shape_dtype()});
  plgpu::GeneratedKernel wrong = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
  const std::string desc = "16, 8 * WA, WA)";  // (pl_wgmma_block: a K-major swizzled a)
  ASSERT_NE(wrong.source.find(desc), std::string::npos);
  wrong.source.replace(wrong.source.find(desc), desc.size(), "16, 8 * WA, 0)");
  const pl::Array bad = plgpu::run_host_emulation(*tc, wrong, {a, b}, tc->grid_mapping.grid, 2 * 128, nullptr).at(0);
  double diff = 0;
  for (int64_t i = 0; i < 128; ++i)
    for (int64_t j = 0; j < 32; ++j) {
      double want = 0;
      for (int64_t q = 0; q < 128; ++q) want += a.get({i, q}) * b.get({q, j});
      diff = std::max(diff, std::abs(bad.get({i, j}) - want));
    }
  EXPECT_GT(diff, 1.0);
  if (std::string why = pl::gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  for (const char* arch : {"sm_90a", "sm_80"}) EXPECT_NO_THROW(pl::gpu::Nvrtc::get().compile(wrong.source, "sw.cu", arch)) << arch;
  if (test_util::find_cuobjdump().empty()) GTEST_SKIP() << "no cuobjdump (run scripts/get_cuda_tools.sh)";
  const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
  const std::string sass = test_util::sass_of(k.source, "sm_90a");
  EXPECT_CONTAINS(sass, "HGMMA.64x32x16");
  EXPECT_CONTAINS(sass, "UTMALDG.2D");
}

// A swizzled tile (one wgmma reads) may also be stored to, loaded from and copied to GMEM, through
// any view: a_s is written by stores (2 a, then 3 a into rows 3-4, columns 16-47: a view where
// the swizzle's pattern does not start), b_s by a TMA copy; wgmma reads both in place, a dot
// reads their loads, a load reads part of a row of a_s, and b_s goes back to GMEM (a TMA store
// per 128-byte panel, or element by element). Each way against C++ values; NVRTC for sm_90a and
// sm_80; the SASS has HGMMA and the TMA store.
pl::PallasCall stored_swizzled_tiles(int64_t n, const std::string& how) {
  constexpr int64_t M = 64, K = 64;
  return plgpu::kernel(
      [=](pl::Ref a, pl::Ref b, pl::Ref out, pl::Ref dot_out, pl::Ref b_back, pl::Ref a_part, pl::Ref a_s, pl::Ref b_s,
          pl::Ref acc, pl::Ref full) {
        plgpu::copy_gmem_to_smem(b, b_s, full);
        a_s[pl::all] = (a[pl::all].astype(pl::f32) * 2.0f).astype(pl::bf16);
        a_s.at(pl::ds(3, 2), pl::ds(16, 32))[pl::all] =
            (a.at(pl::ds(3, 2), pl::ds(16, 32))[pl::all].astype(pl::f32) * 3.0f).astype(pl::bf16);
        plgpu::barrier_wait(full);
        acc[pl::all] = pl::zeros({M, n}, pl::f32);
        plgpu::wgmma(acc, a_s, b_s);
        plgpu::wgmma_wait(0);
        out[pl::all] = acc[pl::all];
        dot_out[pl::all] = pl::dot(a_s[pl::all], b_s[pl::all], {.preferred = pl::f32});
        a_part[pl::all] = a_s.at(4, pl::ds(8, 16))[pl::all].astype(pl::f32);
        plgpu::copy_smem_to_gmem(b_s, b_back);
        plgpu::wait_smem_to_gmem(0);
      },
      {pl::ShapeDtype({M, n}, pl::f32), pl::ShapeDtype({M, n}, pl::f32), pl::ShapeDtype({K, n}, pl::bf16),
       pl::ShapeDtype({16}, pl::f32)},
      plgpu::Mesh{.num_threads = 1, .thread_name = "wg"},
      run_on(how, {plgpu::SMEM({M, K}, pl::bf16), plgpu::SMEM({K, n}, pl::bf16), plgpu::ACC({M, n}),
                             plgpu::Barrier{.num_arrivals = 1}}));
}

TEST(GpuKernel, SwizzledTilesAreStoredLoadedAndCopiedOutInPlace) {
  constexpr int64_t M = 64, K = 64;
  pl::Array a = random_f32({M, K}, 31).astype(pl::bf16);
  pl::Array a_stored = pl::Array::zeros({M, K}, pl::f32);  // what the stores leave in a_s
  for (int64_t i = 0; i < M; ++i)
    for (int64_t q = 0; q < K; ++q) a_stored.set({i, q}, a.get({i, q}) * ((i == 3 || i == 4) && q >= 16 && q < 48 ? 3 : 2));
  a_stored = a_stored.astype(pl::bf16).astype(pl::f32);  // (3 a rounded to bf16)
  for (int64_t n : {int64_t{32}, int64_t{128}}) {  // b's rows: one 64-byte panel; two 128-byte ones
    SCOPED_TRACE("n " + std::to_string(n));
    pl::Array b = random_f32({K, n}, 32).astype(pl::bf16);
    std::shared_ptr<const pl::TracedCall> tc = stored_swizzled_tiles(n, "gpu_emulate").trace({a.shape_dtype(), b.shape_dtype()});
    auto check = [&](const std::vector<pl::Array>& out) {
      expect_product_of(a_stored, b, out.at(0));
      expect_product_of(a_stored, b, out.at(1));
      for (int64_t q = 0; q < K; ++q)
        for (int64_t j = 0; j < n; ++j) ASSERT_EQ(out.at(2).get({q, j}), b.get({q, j})) << q << "," << j;
      for (int64_t j = 0; j < 16; ++j) EXPECT_EQ(out.at(3).get({j}), a_stored.get({4, 8 + j})) << j;
    };
    check(stored_swizzled_tiles(n, "interpret")(a, b));
    const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
    // Both tiles swizzled, read by the wgmma in place (the dot's tiles are staged); each store to
    // a_s fenced for it.
    EXPECT_CONTAINS(k.source, "#define PL_SMEM_SWIZZLED_0 (PL_HAS_WGMMA ? 128 : 0)");
    EXPECT_CONTAINS(k.source, "#define PL_SMEM_SWIZZLED_1 (PL_HAS_WGMMA ? " + std::to_string(std::min<int64_t>(2 * n, 128)) + " : 0)");
    EXPECT_CONTAINS(k.source, "pl_tc_dot_acc<false, " + std::to_string(n) +
                                  ", pl_swizzled_layout(PL_SMEM_SWIZZLED_0, false), pl_swizzled_layout(PL_SMEM_SWIZZLED_1, true)");
    const std::string unindented = std::regex_replace(k.source, std::regex("\n +"), "\n");
    const std::regex fenced_store("\\[pl_smem_elem<PL_SMEM_SWIZZLED_0, pl_bf16>\\([^\n]*\n\\}\npl_fence_proxy_async\\(\\);");
    EXPECT_EQ(std::distance(std::sregex_iterator(unindented.begin(), unindented.end(), fenced_store), std::sregex_iterator()), 2);
    // b_s out by TMA: its map swizzled, a box per panel.
    ASSERT_EQ(k.tensor_maps.size(), 2u);
    EXPECT_EQ(k.tensor_maps[1].swizzle_bytes, static_cast<int>(std::min<int64_t>(2 * n, 128)));
    EXPECT_EQ(k.tensor_maps[1].operand, 4);  // (operands: a, b, out, dot_out, b_back, a_part)
    plgpu::HostEmulationStats stats;
    check(plgpu::run_host_emulation(*tc, k, {a, b}, tc->grid_mapping.grid, 128, &stats));
    const int64_t panels = n == 128 ? 2 : 1;
    EXPECT_EQ(stats.tma_boxes, 2 * panels);  // b in, b_back out
    EXPECT_EQ(stats.wgmma_instructions, 2 * K / 16);  // the wgmma's and the dot's
    // Without maps: element copies from and to the swizzled places; on the CUDA-core path (fewer
    // host threads than a warpgroup) every access reads the tiles where they are too.
    const plgpu::GeneratedKernel no_maps = plgpu::generate_cuda(*tc, tc->grid_mapping.grid, {.tma = false});
    check(plgpu::run_host_emulation(*tc, no_maps, {a, b}, tc->grid_mapping.grid, 128, nullptr));
    // (Generated without register tiles: the dot's result is one, laid out over a warpgroup.)
    check(plgpu::run_host_emulation(*tc, plgpu::generate_cuda(*tc, tc->grid_mapping.grid, {.register_tiles = false}), {a, b},
                                    tc->grid_mapping.grid, 2, nullptr));
    // Stored row-major, the tile wgmma reads swizzled gives other numbers (the test can fail).
    const plgpu::GeneratedKernel wrong = with_source_edit(k, "[pl_smem_elem<PL_SMEM_SWIZZLED_0, pl_bf16>(e)] = (pl_to_bf16", "[e] = (pl_to_bf16");
    const pl::Array bad = plgpu::run_host_emulation(*tc, wrong, {a, b}, tc->grid_mapping.grid, 128, nullptr).at(0);
    double diff = 0;
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double want = 0;
        for (int64_t q = 0; q < K; ++q) want += a_stored.get({i, q}) * b.get({q, j});
        diff = std::max(diff, std::abs(bad.get({i, j}) - want));
      }
    EXPECT_GT(diff, 1.0);
    if (std::string why = pl::gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
    for (const char* arch : {"sm_90a", "sm_80"}) EXPECT_NO_THROW(pl::gpu::Nvrtc::get().compile(k.source, "stored.cu", arch)) << arch;
    if (test_util::find_cuobjdump().empty()) GTEST_SKIP() << "no cuobjdump (run scripts/get_cuda_tools.sh)";
    const std::string sass = test_util::sass_of(k.source, "sm_90a");
    EXPECT_CONTAINS(sass, "HGMMA.64x" + std::to_string(n) + "x16");
    EXPECT_CONTAINS(sass, "UTMASTG.2D");  // b_s out
  }
}

// A gpu::kernel's f32 ACC whose every Pallas thread uses only its own matrix (acc.at(wg)) lives in
// registers where wgmma runs, as on Mosaic GPU: each wgmma accumulates into the thread's PlAccRegs
// and is left running until wgmma_wait (here wgmma_wait(1) in the loop retires the step before);
// a load of the ACC flushes the registers to its memory, and a store to it (acc *= 2, in memory)
// makes the next wgmma reload them. Two consumer warpgroups, K 128 in two swizzled 64-column
// steps, then one more product of step 0's tiles: out1 = a b, out2 = 2 a b + a[:, :64] b[:64].
// Values against C++ loops: in the interpreter, on wgmma (whole warpgroups) and on the CUDA-core
// path (2 host threads: the products run in memory); NVRTC for sm_90a and sm_80.
pl::PallasCall register_acc_matmul(const std::string& how) {
  constexpr int64_t M = 128, N = 64, kStep = 64, steps = 2;
  return plgpu::kernel(
      [=](pl::Ref a, pl::Ref b, pl::Ref out1, pl::Ref out2, pl::Ref a_s, pl::Ref b_s, pl::Ref acc, pl::Ref full) {
        pl::Value wg = plgpu::axis_index("wg");
        copy_steps_into_slots(wg, a, b, a_s, b_s, full, steps, kStep);
        pl::Ref my_acc = acc.at(wg);
        my_acc[pl::all] = pl::zeros({M / 2, N}, pl::f32);
        pl::fori_loop(0, static_cast<int>(steps), [&](pl::Value k) {
          plgpu::barrier_wait(full.at(k));
          plgpu::wgmma(my_acc, a_s.at(k, pl::ds(wg * (M / 2), M / 2), pl::all), b_s.at(k));
          plgpu::wgmma_wait(1);
        });
        plgpu::wgmma_wait(0);
        out1.at(pl::ds(wg * (M / 2), M / 2), pl::all)[pl::all] = my_acc[pl::all];
        my_acc[pl::all] = my_acc[pl::all] * 2.0f;
        plgpu::wgmma(my_acc, a_s.at(0, pl::ds(wg * (M / 2), M / 2), pl::all), b_s.at(0));
        plgpu::wgmma_wait(0);
        out2.at(pl::ds(wg * (M / 2), M / 2), pl::all)[pl::all] = my_acc[pl::all];
      },
      {pl::ShapeDtype({M, N}, pl::f32), pl::ShapeDtype({M, N}, pl::f32)}, plgpu::Mesh{.num_threads = 2, .thread_name = "wg"},
      run_on(how, {plgpu::SMEM({steps, M, kStep}, pl::bf16), plgpu::SMEM({steps, kStep, N}, pl::bf16),
                   plgpu::ACC({2, M / 2, N}), plgpu::Barrier{.num_arrivals = 2, .num_barriers = static_cast<int>(steps)}}));
}

TEST(GpuKernel, WgmmaAccumulatesInRegistersUntilTheKernelReadsTheAcc) {
  pl::Array a = random_f32({128, 128}, 31).astype(pl::bf16);
  pl::Array b = random_f32({128, 64}, 32).astype(pl::bf16);
  // out2 = 2 a b + a[:, :64] b[:64]: the product of [2a, a[:, :64]] and [b; b[:64]].
  pl::Array a2 = pl::Array::zeros({128, 192}, pl::f32), b2 = pl::Array::zeros({192, 64}, pl::f32);
  for (int64_t i = 0; i < 128; ++i)
    for (int64_t q = 0; q < 192; ++q) a2.set({i, q}, q < 128 ? 2 * a.get({i, q}) : a.get({i, q - 128}));
  for (int64_t q = 0; q < 192; ++q)
    for (int64_t j = 0; j < 64; ++j) b2.set({q, j}, b.get({q < 128 ? q : q - 128, j}));
  auto check = [&](const std::vector<pl::Array>& out) {
    expect_product_of(a, b, out.at(0));
    expect_product_of(a2, b2, out.at(1));
  };
  check(register_acc_matmul("interpret")(a, b));
  std::shared_ptr<const pl::TracedCall> tc = register_acc_matmul("gpu_emulate").trace({a.shape_dtype(), b.shape_dtype()});
  const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
  EXPECT_EQ(k.accumulators_in_registers, std::vector<int>{2});
  EXPECT_CONTAINS(k.source, "PlAccRegs<64, 1> pl_acc_2;");
  EXPECT_CONTAINS(k.source, "pl_acc_wait<1>(pl_acc_2);");
  EXPECT_CONTAINS(k.source, "1, PL_KERNEL_WGMMA_PENDING>(pl_acc_2, ");
  EXPECT_CONTAINS(k.source, "pl_acc_fill(pl_acc_2, ");
  plgpu::HostEmulationStats stats;
  check(plgpu::run_host_emulation(*tc, k, {a, b}, tc->grid_mapping.grid, 2 * 128, &stats));
  EXPECT_EQ(stats.wgmma_instructions, 2 * (128 / 16 + 64 / 16));  // per consumer: K 128, then 64
  EXPECT_EQ(stats.acc_flushes, 0);  // (`acc = acc * 2` in the registers; the stores take them)
  EXPECT_CONTAINS(k.source, "pl_acc_assign(pl_acc_2, ");
  check(plgpu::run_host_emulation(*tc, k, {a, b}, tc->grid_mapping.grid, 2, nullptr));
  // The ACC's memory is in the workspace, not shared memory: the arena holds the two tiles only.
  EXPECT_EQ(k.acc_memory_bytes, 2 * 64 * 64 * 4);
  EXPECT_EQ(k.arena_bytes, 2 * 128 * 64 * 2 + 2 * 64 * 64 * 2);
  if (std::string why = pl::gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  for (const char* arch : {"sm_90a", "sm_80"}) EXPECT_NO_THROW(pl::gpu::Nvrtc::get().compile(k.source, "acc.cu", arch)) << arch;
}

// An ACC in registers starts as the uninitialized value, as in the interpreter (NaN): read before
// anything is written to it, then accumulated into from a fill. Interpreted, on wgmma (NaN in the
// registers) and on the CUDA-core path (NaN in its memory).
TEST(GpuKernel, AnAccInRegistersStartsUninitialized) {
  auto make = [](const std::string& how) {
    return plgpu::kernel(
        [](pl::Ref a, pl::Ref b, pl::Ref before, pl::Ref after, pl::Ref a_s, pl::Ref b_s, pl::Ref acc, pl::Ref bar) {
          plgpu::copy_gmem_to_smem(a, a_s, bar);
          plgpu::copy_gmem_to_smem(b, b_s, bar);
          plgpu::barrier_wait(bar);
          before[pl::all] = acc[pl::all];
          acc[pl::all] = pl::zeros({64, 16}, pl::f32);
          plgpu::wgmma(acc, a_s, b_s);
          plgpu::wgmma_wait(0);
          after[pl::all] = acc[pl::all];
        },
        {pl::ShapeDtype({64, 16}, pl::f32), pl::ShapeDtype({64, 16}, pl::f32)}, plgpu::Mesh{},
        run_on(how, {plgpu::SMEM({64, 16}, pl::bf16), plgpu::SMEM({16, 16}, pl::bf16), plgpu::ACC({64, 16}),
                     plgpu::Barrier{.num_arrivals = 2}}));
  };
  pl::Array a = random_f32({64, 16}, 51).astype(pl::bf16), b = random_f32({16, 16}, 52).astype(pl::bf16);
  auto check = [&](const std::vector<pl::Array>& out) {
    for (int64_t i = 0; i < out.at(0).size(); ++i) EXPECT_TRUE(std::isnan(out.at(0).get_flat(i))) << i;
    expect_product_of(a, b, out.at(1));
  };
  check(make("interpret")(a, b));
  std::shared_ptr<const pl::TracedCall> tc = make("gpu_emulate").trace({a.shape_dtype(), b.shape_dtype()});
  const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
  EXPECT_EQ(k.accumulators_in_registers, std::vector<int>{2});
  plgpu::HostEmulationStats stats;
  check(plgpu::run_host_emulation(*tc, k, {a, b}, tc->grid_mapping.grid, 128, &stats));
  EXPECT_EQ(stats.wgmma_instructions, 1);
  check(plgpu::run_host_emulation(*tc, k, {a, b}, tc->grid_mapping.grid, 2, nullptr));
}

// A whole load of an ACC in registers takes them into a value straight from the registers, a
// whole store of a value sets them, and `acc[...] = f(acc[...])` updates each register in place:
// none goes through the ACC's memory (in global memory: attention's scores and the rescaling of
// its output would otherwise make two trips a step). Checked against C++ products: s = a b,
// out1 = 3 s, then acc = acc / 2 + s (in place) and another a b: out2 = 2.5 s; then acc = 2 s
// (a store of a value) read with + 1: out3 = 2 s + 1. On wgmma (host emulation, a warpgroup: no
// flush at all) and on the CUDA-core path (two host threads: the ACC in memory).
TEST(GpuKernel, AccRegistersGoToAndFromValuesWithoutTheirMemory) {
  auto make = [](const std::string& how) {
    return plgpu::kernel(
        [](pl::Ref a, pl::Ref b, pl::Ref out1, pl::Ref out2, pl::Ref out3, pl::Ref a_s, pl::Ref b_s, pl::Ref acc,
           pl::Ref bar) {
          zeroed_product(a, b, a_s, b_s, acc, bar);
          plgpu::wgmma_wait(0);
          pl::Value s = acc[pl::all];
          out1[pl::all] = s * 3.0f;
          acc[pl::all] = acc[pl::all] * 0.5f + s;
          plgpu::wgmma(acc, a_s, b_s);
          plgpu::wgmma_wait(0);
          out2[pl::all] = acc[pl::all];
          acc[pl::all] = s * 2.0f;
          out3[pl::all] = acc[pl::all] + 1.0f;
        },
        {pl::ShapeDtype({64, 32}, pl::f32), pl::ShapeDtype({64, 32}, pl::f32), pl::ShapeDtype({64, 32}, pl::f32)},
        plgpu::Mesh{},
        run_on(how, {plgpu::SMEM({64, 32}, pl::bf16), plgpu::SMEM({32, 32}, pl::bf16), plgpu::ACC({64, 32}),
                     plgpu::Barrier{.num_arrivals = 2}}));
  };
  pl::Array a = random_f32({64, 32}, 61).astype(pl::bf16), b = random_f32({32, 32}, 62).astype(pl::bf16);
  auto check = [&](const std::vector<pl::Array>& out) {
    for (int64_t i = 0; i < 64; ++i)
      for (int64_t j = 0; j < 32; ++j) {
        double s = 0;
        for (int64_t q = 0; q < 32; ++q) s += a.get({i, q}) * b.get({q, j});
        const double tol = 1e-4 * (1 + std::abs(s));
        EXPECT_NEAR(out.at(0).get({i, j}), 3 * s, 3 * tol) << i << "," << j;
        EXPECT_NEAR(out.at(1).get({i, j}), 2.5 * s, 3 * tol) << i << "," << j;
        EXPECT_NEAR(out.at(2).get({i, j}), 2 * s + 1, 3 * tol) << i << "," << j;
      }
  };
  check(make("interpret")(a, b));
  std::shared_ptr<const pl::TracedCall> tc = make("gpu_emulate").trace({a.shape_dtype(), b.shape_dtype()});
  const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
  EXPECT_EQ(k.accumulators_in_registers, std::vector<int>{2});
  EXPECT_CONTAINS(k.source, "int pl_k) { return (float)(((float)((((float)((pl_old * (pl_f32_of_bits(0x3F000000u)))))");
  EXPECT_CONTAINS(k.source, "if (!pl_acc_to_fragment(pl_acc_2, v");  // the load of s, into registers
  plgpu::HostEmulationStats stats;
  check(plgpu::run_host_emulation(*tc, k, {a, b}, tc->grid_mapping.grid, 128, &stats));
  EXPECT_EQ(stats.wgmma_instructions, 2 * 2);  // two products of K 32
  EXPECT_EQ(stats.acc_flushes, 0);
  EXPECT_EQ(k.register_tiles, 2);  // s, and acc + 1 (stored to out3); register tiles take whole warpgroups
  // For a target without wgmma (the ACC in memory): the stores of values reading s write the
  // ACC's memory in s's layout.
  const plgpu::GeneratedKernel no_wgmma = with_source_edit(k, "#define PL_WGMMA_STAGES ", "#define PL_NO_WGMMA_STAGES ");
  check(plgpu::run_host_emulation(*tc, no_wgmma, {a, b}, tc->grid_mapping.grid, 128, nullptr));
  const plgpu::GeneratedKernel arena = plgpu::generate_cuda(*tc, tc->grid_mapping.grid, {.register_tiles = false});
  check(plgpu::run_host_emulation(*tc, arena, {a, b}, tc->grid_mapping.grid, 2, nullptr));
  if (std::string why = pl::gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  for (const char* arch : {"sm_90a", "sm_80"}) EXPECT_NO_THROW(pl::gpu::Nvrtc::get().compile(k.source, "acc.cu", arch)) << arch;
}

// Register tiles: `s = acc[...]` of an ACC in registers and the elementwise ops on it stay in the
// warpgroup's registers in wgmma's layout, a row reduction of them is a quad's shuffles, and a
// store writes each thread's registers: attention's softmax without shared memory. u is stored
// transposed (not a register tile's use): it is a tile, computed in the registers' layout. Four
// layouts: 64 x 64 (one block), 128 x 64 (two blocks, a row band each), 64 x 256 (one block of
// 256 columns: both operands read in place) and, unswizzled (b staged), two 128-column blocks
// of one row band, which the reduction combines across rounds. Against C++ from a b: on
// the interpreter; host emulated with the ACC in registers (nothing flushed) and, the unit built
// as for a target without wgmma (no PL_WGMMA_STAGES: the ACC in memory, read in the registers'
// layout), and without register tiles; NVRTC for sm_90a and sm_80.
TEST(GpuKernel, RegisterTilesKeepTheSoftmaxOfAnAccInRegisters) {
  struct Case {
    int64_t M, N;
    bool swizzle;
    const char* registers;  // the ACC's
  };
  for (const Case& c : {Case{64, 64, true, "PlAccRegs<64, 1>"}, Case{128, 64, true, "PlAccRegs<64, 2>"},
                        Case{64, 256, true, "PlAccRegs<256, 1>"}, Case{64, 256, false, "PlAccRegs<128, 2>"}}) {
    const int64_t M = c.M, N = c.N;
    SCOPED_TRACE(std::to_string(M) + "x" + std::to_string(N) + (c.swizzle ? "" : " unswizzled"));
    constexpr int64_t K = 32;
    auto make = [M = M, N = N](const std::string& how) {
      return plgpu::kernel(
          [=](pl::Ref a, pl::Ref b, pl::Ref probs, pl::Ref row_max, pl::Ref u_t, pl::Ref a_s, pl::Ref b_s, pl::Ref acc,
              pl::Ref bar) {
            zeroed_product(a, b, a_s, b_s, acc, bar);
            plgpu::wgmma_wait(0);
            const pl::Value s = acc[pl::all];
            const pl::Value t = s * 0.5f + 1.0f;
            const pl::Value m = pl::max(t, {1}, /*keepdims=*/true);
            const pl::Value p = pl::exp(t - m);
            probs[pl::all] = p / pl::sum(p, {1}, /*keepdims=*/true);
            row_max[pl::all] = m;
            u_t[pl::all] = pl::transpose(s + 2.0f, {1, 0});
          },
          {pl::ShapeDtype({M, N}, pl::f32), pl::ShapeDtype({M, 1}, pl::f32), pl::ShapeDtype({N, M}, pl::f32)},
          plgpu::Mesh{},
          run_on(how, {plgpu::SMEM({M, K}, pl::bf16), plgpu::SMEM({K, N}, pl::bf16), plgpu::ACC({M, N}),
                       plgpu::Barrier{.num_arrivals = 2}}));
    };
    pl::Array a = random_f32({M, K}, 71).astype(pl::bf16), b = random_f32({K, N}, 72).astype(pl::bf16);
    auto check = [&, M = M, N = N](const std::vector<pl::Array>& out) {
      for (int64_t i = 0; i < M; ++i) {
        std::vector<double> t(static_cast<size_t>(N));
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < N; ++j) {
          double s = 0;
          for (int64_t q = 0; q < K; ++q) s += a.get({i, q}) * b.get({q, j});
          EXPECT_NEAR(out.at(2).get({j, i}), s + 2, 1e-4 * (1 + std::abs(s))) << i << "," << j;
          t[static_cast<size_t>(j)] = s * 0.5 + 1;
          mx = std::max(mx, t[static_cast<size_t>(j)]);
        }
        EXPECT_NEAR(out.at(1).get({i, 0}), mx, 1e-4 * (1 + std::abs(mx))) << i;
        for (double x : t) sum += std::exp(x - mx);
        for (int64_t j = 0; j < N; ++j) {
          const double want = std::exp(t[static_cast<size_t>(j)] - mx) / sum;
          EXPECT_NEAR(out.at(0).get({i, j}), want, 1e-5 + 1e-4 * want) << i << "," << j;
        }
      }
    };
    check(make("interpret")(a, b));
    std::shared_ptr<const pl::TracedCall> tc = make("gpu_emulate").trace({a.shape_dtype(), b.shape_dtype()});
    // (Past the register budget for 64 x 256: s, t and p would take 128 registers each. The
    // budget's own check is below.)
    const plgpu::GeneratedKernel k =
        plgpu::generate_cuda(*tc, tc->grid_mapping.grid, {.swizzle = c.swizzle, .register_tile_budget = plgpu::CodegenOptions::kNoRegisterBudget});
    EXPECT_CONTAINS(k.source, c.registers);
    // Within the default budget (192 registers of tiles live at once) 64 x 256 keeps its tiles in
    // the arena: with them in registers ptxas spilled (255 registers, 148 bytes of spill stores;
    // within it 156 and none: PERFORMANCE.md, stop 47).
    const plgpu::GeneratedKernel budgeted = plgpu::generate_cuda(*tc, tc->grid_mapping.grid, {.swizzle = c.swizzle});
    EXPECT_EQ(budgeted.register_tiles, N == 256 ? 0 : k.register_tiles);
    if (N == 256) check(plgpu::run_host_emulation(*tc, budgeted, {a, b}, tc->grid_mapping.grid, 128, nullptr));
    // s, t and p; exp's and the store's operand t - m and p / sum are fused into their loops. The
    // rows: m's reduction and its expand_dims (stored and broadcast: a value of its own), p's sum.
    EXPECT_EQ(k.register_tiles, 6);
    EXPECT_CONTAINS(k.source, "pl_acc_to_fragment(pl_acc_");
    EXPECT_CONTAINS(k.source, "pl_team_combine<false>(pl_r0, 4, pl_comb");
    plgpu::HostEmulationStats stats;
    check(plgpu::run_host_emulation(*tc, k, {a, b}, tc->grid_mapping.grid, 128, &stats));
    EXPECT_EQ(stats.acc_flushes, 0);
    EXPECT_GT(stats.shuffles, 0);
    // Register tiles take whole warpgroups: another count is refused, not computed in part.
    try {
      plgpu::run_host_emulation(*tc, k, {a, b}, tc->grid_mapping.grid, 2, nullptr);
      ADD_FAILURE() << "two host threads ran a kernel with register tiles";
    } catch (const pl::Error& e) {
      EXPECT_CONTAINS(e.what(), "register tiles");
    }
    const plgpu::GeneratedKernel no_wgmma = with_source_edit(k, "#define PL_WGMMA_STAGES ", "#define PL_NO_WGMMA_STAGES ");
    plgpu::HostEmulationStats in_memory;
    check(plgpu::run_host_emulation(*tc, no_wgmma, {a, b}, tc->grid_mapping.grid, 128, &in_memory));
    EXPECT_EQ(in_memory.wgmma_instructions, 0);  // (the products in memory: the loads read it there)
    const plgpu::GeneratedKernel arena =
        plgpu::generate_cuda(*tc, tc->grid_mapping.grid, {.swizzle = c.swizzle, .register_tiles = false});
    EXPECT_EQ(arena.register_tiles, 0);
    check(plgpu::run_host_emulation(*tc, arena, {a, b}, tc->grid_mapping.grid, 2, nullptr));
    // A row reduction that took the registers of the row 8 below (registers 4 j + 2, + 3) for its
    // own gives other maxima (the test can fail).
    const plgpu::GeneratedKernel wrong = with_source_edit(k, "if ((pl_i >> 1) & 1) pl_r1", "if (pl_i & 1) pl_r1");
    const pl::Array bad = plgpu::run_host_emulation(*tc, wrong, {a, b}, tc->grid_mapping.grid, 128, nullptr).at(1);
    const pl::Array good = make("interpret")(a, b).at(1);
    double diff = 0;
    for (int64_t i = 0; i < M; ++i) diff = std::max(diff, std::abs(bad.get({i, 0}) - good.get({i, 0})));
    EXPECT_GT(diff, 0.1);
    if (std::string why = pl::gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
    for (const char* arch : {"sm_90a", "sm_80"})
      EXPECT_NO_THROW(pl::gpu::Nvrtc::get().compile(k.source, "frag.cu", arch)) << arch;
    // probs' store writes each thread's neighbouring registers (columns c, c + 1) as one 8-byte
    // access where aligned (pl_store_pair; host emulation stores them one by one).
    EXPECT_CONTAINS(k.source, "pl_store_pair(&");
  }
}

// A register tile's loop that reads a tile the arena's loops wrote (other threads' elements) waits
// for them, also after a load of an ACC whose memory-path branch has a barrier of its own (that
// one syncs only where the ACC is in memory). y = a b + c^T, with c^T transposed before the load.
TEST(GpuKernel, RegisterTilesWaitForTilesWrittenBeforeTheAccLoad) {
  auto make = [](const std::string& how) {
    return plgpu::kernel(
        [](pl::Ref a, pl::Ref b, pl::Ref c, pl::Ref out1, pl::Ref out2, pl::Ref a_s, pl::Ref b_s, pl::Ref acc, pl::Ref bar) {
          zeroed_product(a, b, a_s, b_s, acc, bar);
          const pl::Value ct = pl::transpose(c[pl::all], {1, 0});
          plgpu::wgmma_wait(0);
          const pl::Value y = acc[pl::all] + ct;
          out1[pl::all] = y;
          out2[pl::all] = y * 2.0f;
        },
        {pl::ShapeDtype({64, 64}, pl::f32), pl::ShapeDtype({64, 64}, pl::f32)}, plgpu::Mesh{},
        run_on(how, {plgpu::SMEM({64, 32}, pl::bf16), plgpu::SMEM({32, 64}, pl::bf16), plgpu::ACC({64, 64}),
                     plgpu::Barrier{.num_arrivals = 2}}));
  };
  pl::Array a = random_f32({64, 32}, 81).astype(pl::bf16), b = random_f32({32, 64}, 82).astype(pl::bf16);
  pl::Array c = random_f32({64, 64}, 83);
  auto check = [&](const std::vector<pl::Array>& out) {
    for (int64_t i = 0; i < 64; ++i)
      for (int64_t j = 0; j < 64; ++j) {
        double y = c.get({j, i});
        for (int64_t q = 0; q < 32; ++q) y += a.get({i, q}) * b.get({q, j});
        EXPECT_NEAR(out.at(0).get({i, j}), y, 1e-4 * (1 + std::abs(y))) << i << "," << j;
        EXPECT_NEAR(out.at(1).get({i, j}), 2 * y, 2e-4 * (1 + std::abs(y))) << i << "," << j;
      }
  };
  check(make("interpret")(a, b, c));
  std::shared_ptr<const pl::TracedCall> tc = make("gpu_emulate").trace({a.shape_dtype(), b.shape_dtype(), c.shape_dtype()});
  const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
  EXPECT_EQ(k.register_tiles, 2);  // the load and y
  // Between the load and y's loop: the barrier of the memory path, and then the one every path takes.
  const size_t load = k.source.find("if (!pl_acc_to_fragment(");
  ASSERT_NE(load, std::string::npos);
  const size_t y = k.source.find("// a register tile", load);
  ASSERT_NE(y, std::string::npos);
  const std::string between = k.source.substr(load, y - load);
  size_t syncs = 0;
  for (size_t at = between.find("pl_sync();"); at != std::string::npos; at = between.find("pl_sync();", at + 1)) ++syncs;
  EXPECT_EQ(syncs, 2u) << between;
  for (int run = 0; run < 3; ++run) check(plgpu::run_host_emulation(*tc, k, {a, b, c}, tc->grid_mapping.grid, 128, nullptr));
}

// wgmma whose a is a register tile (attention's p v): taken from the registers (wgmma's a in
// registers: four 32-bit pairs per 16 columns, the accumulator's layout), where the ACC is in
// registers; written to the arena for the product otherwise. out = bf16(exp(a b / 4)) c (a M x 32,
// b 32 x K, c K x N), against C++: M x K x N 64 x 64 x 64, 64 x 64 x 128, 128 x 128 x 64 (two row
// bands, a's blocks 128 wide), 64 x 192 x 64 (three blocks of a), and c staged (unswizzled: K
// in two steps). Host emulated with the ACCs in registers, the unit built as for a target without
// wgmma (the fallback), and with a's registers taken in the wrong order (the test can fail);
// NVRTC for sm_90a (the SASS has wgmma with a in registers) and sm_80.
TEST(GpuKernel, RegisterTilesFeedWgmmaFromTheirRegisters) {
  struct Case {
    int64_t M, K, N;
    bool swizzle;
  };
  for (const Case& cs : {Case{64, 64, 64, true}, Case{64, 64, 128, true}, Case{128, 128, 64, true},
                         Case{64, 192, 64, true}, Case{64, 64, 64, false}}) {
    const int64_t M = cs.M, K = cs.K, N = cs.N;
    SCOPED_TRACE(std::to_string(M) + "x" + std::to_string(K) + "x" + std::to_string(N) + (cs.swizzle ? "" : " unswizzled"));
    auto make = [M, K, N](const std::string& how) {
      return plgpu::kernel(
          [M, K, N](pl::Ref a, pl::Ref b, pl::Ref c, pl::Ref out, pl::Ref a_s, pl::Ref b_s, pl::Ref c_s, pl::Ref s_acc,
              pl::Ref o_acc, pl::Ref bar) {
            plgpu::copy_gmem_to_smem(a, a_s, bar);
            plgpu::copy_gmem_to_smem(b, b_s, bar);
            plgpu::copy_gmem_to_smem(c, c_s, bar);
            plgpu::barrier_wait(bar);
            s_acc[pl::all] = pl::zeros({M, K}, pl::f32);
            plgpu::wgmma(s_acc, a_s, b_s);
            plgpu::wgmma_wait(0);
            const pl::Value p = pl::exp(s_acc[pl::all] * 0.25f);
            o_acc[pl::all] = pl::zeros({M, N}, pl::f32);
            plgpu::wgmma(o_acc, p.astype(pl::bf16), c_s);
            plgpu::wgmma_wait(0);
            out[pl::all] = o_acc[pl::all];
          },
          {pl::ShapeDtype({M, N}, pl::f32)}, plgpu::Mesh{},
          run_on(how, {plgpu::SMEM({M, 32}, pl::bf16), plgpu::SMEM({32, K}, pl::bf16), plgpu::SMEM({K, N}, pl::bf16),
                       plgpu::ACC({M, K}), plgpu::ACC({M, N}), plgpu::Barrier{.num_arrivals = 3}}));
    };
    pl::Array a = random_f32({M, 32}, 91).astype(pl::bf16), b = random_f32({32, K}, 92).astype(pl::bf16);
    pl::Array c = random_f32({K, N}, 93).astype(pl::bf16);
    // p rounded to bf16 as the kernel rounds it (from f32 exp).
    pl::Array p = pl::Array::zeros({M, K}, pl::f32);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < K; ++j) {
        double s = 0;
        for (int64_t q = 0; q < 32; ++q) s += a.get({i, q}) * b.get({q, j});
        p.set({i, j}, std::exp(static_cast<float>(s) * 0.25f));
      }
    p = p.astype(pl::bf16);
    auto error = [&](const pl::Array& out) {
      double worst = 0;
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double want = 0, size = 0;
          for (int64_t q = 0; q < K; ++q) want += p.get({i, q}) * c.get({q, j}), size += std::abs(p.get({i, q}) * c.get({q, j}));
          worst = std::max(worst, std::abs(out.get({i, j}) - want) / (1 + size));
        }
      return worst;
    };
    EXPECT_LT(error(make("interpret")(a, b, c).at(0)), 1e-2);
    std::shared_ptr<const pl::TracedCall> tc = make("gpu_emulate").trace({a.shape_dtype(), b.shape_dtype(), c.shape_dtype()});
    const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid, {.swizzle = cs.swizzle});
    EXPECT_EQ(k.register_a_products, 1);
    EXPECT_CONTAINS(k.source, "PL_KERNEL_WGMMA_PENDING, " + std::string(K == 128 ? "128" : "64") + ">(pl_acc_");
    plgpu::HostEmulationStats stats;
    EXPECT_LT(error(plgpu::run_host_emulation(*tc, k, {a, b, c}, tc->grid_mapping.grid, 128, &stats).at(0)), 1e-2);
    auto width = [](int64_t n) {  // wgmma's instruction width: the widest of 128, 64, ... dividing n
      int64_t w = 128;
      while (n % w != 0) w /= 2;
      return w;
    };
    EXPECT_EQ(stats.wgmma_instructions, M / 64 * (K / width(K) * 32 / 16 + N / width(N) * K / 16));
    EXPECT_EQ(stats.acc_flushes, 0);
    const plgpu::GeneratedKernel no_wgmma = with_source_edit(k, "#define PL_WGMMA_STAGES ", "#define PL_NO_WGMMA_STAGES ");
    EXPECT_LT(error(plgpu::run_host_emulation(*tc, no_wgmma, {a, b, c}, tc->grid_mapping.grid, 128, nullptr).at(0)), 1e-2);
    // a's pairs for rows r and r + 8 exchanged: other products.
    if (M != 64 || K != 64 || N != 64 || !cs.swizzle) continue;
    const plgpu::GeneratedKernel wrong = with_source_edit(
        k, "aw[ks / 16 * 4 + j] = (pl_u32)a[r + 2 * j].bits", "aw[ks / 16 * 4 + (j ^ 1)] = (pl_u32)a[r + 2 * j].bits");
    EXPECT_GT(error(plgpu::run_host_emulation(*tc, wrong, {a, b, c}, tc->grid_mapping.grid, 128, nullptr).at(0)), 0.1);
    if (std::string why = pl::gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
    for (const char* arch : {"sm_90a", "sm_80"})
      EXPECT_NO_THROW(pl::gpu::Nvrtc::get().compile(k.source, "rs.cu", arch)) << arch;
    if (test_util::find_cuobjdump().empty()) GTEST_SKIP() << "no cuobjdump (run scripts/get_cuda_tools.sh)";
    const std::string sass = test_util::sass_of(k.source, "sm_90a");
    // `HGMMA.64xNx16.F32.BF16 Rd, Ra, gdesc[..]`: a in registers (from shared memory: Rd, gdesc, gdesc).
    EXPECT_TRUE(std::regex_search(sass, std::regex("HGMMA\\.64x" + std::to_string(N) + "x16\\.F32\\.BF16 R[0-9]+, R[0-9]+, gdesc")))
        << sass;
  }
}

// Register tiles of two Pallas threads (warpgroups), each its own ACC matrix (acc.at(wg)): each
// thread's softmax of its 64 rows of a b runs in its warpgroup's registers, against C++.
TEST(GpuKernel, RegisterTilesOfEachPallasThreadAreItsOwn) {
  auto make = [](const std::string& how) {
    return plgpu::kernel(
        [](pl::Ref a, pl::Ref b, pl::Ref probs, pl::Ref a_s, pl::Ref b_s, pl::Ref acc, pl::Ref bar) {
          const pl::Value wg = plgpu::axis_index("wg");
          plgpu::copy_gmem_to_smem(a.at(pl::ds(wg * 64, 64), pl::all), a_s.at(wg), bar.at(wg));
          plgpu::copy_gmem_to_smem(b, b_s.at(wg), bar.at(wg));
          plgpu::barrier_wait(bar.at(wg));
          pl::Ref my_acc = acc.at(wg);
          my_acc[pl::all] = pl::zeros({64, 64}, pl::f32);
          plgpu::wgmma(my_acc, a_s.at(wg), b_s.at(wg));
          plgpu::wgmma_wait(0);
          const pl::Value s = my_acc[pl::all];
          const pl::Value p = pl::exp(s - pl::max(s, {1}, /*keepdims=*/true));
          probs.at(pl::ds(wg * 64, 64), pl::all)[pl::all] = p / pl::sum(p, {1}, /*keepdims=*/true);
        },
        {pl::ShapeDtype({128, 64}, pl::f32)}, plgpu::Mesh{.num_threads = 2, .thread_name = "wg"},
        run_on(how, {plgpu::SMEM({2, 64, 32}, pl::bf16), plgpu::SMEM({2, 32, 64}, pl::bf16), plgpu::ACC({2, 64, 64}),
                     plgpu::Barrier{.num_arrivals = 2, .num_barriers = 2}}));
  };
  pl::Array a = random_f32({128, 32}, 101).astype(pl::bf16), b = random_f32({32, 64}, 102).astype(pl::bf16);
  auto check = [&](const std::vector<pl::Array>& out) {
    for (int64_t i = 0; i < 128; ++i) {
      std::vector<double> s(64);
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < 64; ++j) {
        for (int64_t q = 0; q < 32; ++q) s[static_cast<size_t>(j)] += a.get({i, q}) * b.get({q, j});
        mx = std::max(mx, s[static_cast<size_t>(j)]);
      }
      for (double x : s) sum += std::exp(x - mx);
      for (int64_t j = 0; j < 64; ++j) {
        const double want = std::exp(s[static_cast<size_t>(j)] - mx) / sum;
        EXPECT_NEAR(out.at(0).get({i, j}), want, 1e-5 + 1e-4 * want) << i << "," << j;
      }
    }
  };
  check(make("interpret")(a, b));
  std::shared_ptr<const pl::TracedCall> tc = make("gpu_emulate").trace({a.shape_dtype(), b.shape_dtype()});
  const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
  EXPECT_EQ(k.register_tiles, 4);  // s and p, the rows max(s) and sum(p)
  plgpu::HostEmulationStats stats;
  check(plgpu::run_host_emulation(*tc, k, {a, b}, tc->grid_mapping.grid, 2 * 128, &stats));
  EXPECT_EQ(stats.acc_flushes, 0);
}

// Rows in registers through a loop: attention's online softmax over J blocks of keys. Per block
// s = a b_j (an ACC in registers), the carries m (running row max) and l (running row sum) and
// the rows alpha = exp(m - m_new) stay in each thread's registers (Mosaic GPU's WGMMA_ROW layout:
// its two rows per band, alike in a quad); o = o alpha rescales an ACC in its registers with
// alpha's rows broadcast along them, then o += p v_j with p in registers. A third carry takes m's
// previous value: a yield naming another carry's holder, read before any holder is written. After
// the loop o / l is stored in a layout the compiler chose for l's rows (o's load is fused into the
// store). Against C++ from a, b and v: on the interpreter; host emulated with the ACCs in
// registers, with them in memory (a target without wgmma: the rescaling's memory path runs in the
// registers' layout) and without register tiles; NVRTC for sm_90a and sm_80. Rows read from the
// wrong one of a thread's two rows give other results (the test can fail).
TEST(GpuKernel, RegisterTilesCarryRowsThroughALoop) {
  struct Case {
    int64_t M, N;
    bool swizzle;
    const char* registers;  // s's ACC
  };
  for (const Case& c : {Case{64, 64, true, "PlAccRegs<64, 1>"}, Case{128, 64, true, "PlAccRegs<64, 2>"},
                        Case{64, 256, false, "PlAccRegs<128, 2>"}}) {
    const int64_t M = c.M, N = c.N;
    SCOPED_TRACE(std::to_string(M) + "x" + std::to_string(N) + (c.swizzle ? "" : " unswizzled"));
    constexpr int64_t K = 32, J = 3, D = 64;
    auto make = [M = M, N = N](const std::string& how) {
      return plgpu::kernel(
          [=](pl::Ref a, pl::Ref b, pl::Ref v, pl::Ref out, pl::Ref m_out, pl::Ref l_out, pl::Ref prev_out, pl::Ref a_s,
              pl::Ref b_s, pl::Ref v_s, pl::Ref s_acc, pl::Ref o_acc, pl::Ref bar) {
            plgpu::copy_gmem_to_smem(a, a_s, bar);
            plgpu::copy_gmem_to_smem(b, b_s, bar);
            plgpu::copy_gmem_to_smem(v, v_s, bar);
            plgpu::barrier_wait(bar);
            o_acc[pl::all] = pl::zeros({M, D}, pl::f32);
            const pl::Value minus_inf = pl::full({M, 1}, pl::f32, -INFINITY);
            const std::vector<pl::Value> last = pl::fori_loop(
                0, J, {minus_inf, pl::zeros({M, 1}, pl::f32), minus_inf},
                [&](pl::Value j, const std::vector<pl::Value>& carry) {
                  s_acc[pl::all] = pl::zeros({M, N}, pl::f32);
                  plgpu::wgmma(s_acc, a_s, b_s.at(j));
                  plgpu::wgmma_wait(0);
                  const pl::Value s = s_acc[pl::all];
                  const pl::Value m_new = pl::maximum(carry[0], pl::max(s, {1}, /*keepdims=*/true));
                  const pl::Value alpha = pl::exp(carry[0] - m_new);
                  const pl::Value p = pl::exp(s - m_new);
                  o_acc[pl::all] = o_acc[pl::all] * alpha;
                  plgpu::wgmma(o_acc, p.astype(pl::bf16), v_s.at(j));
                  plgpu::wgmma_wait(0);
                  return std::vector<pl::Value>{m_new, carry[1] * alpha + pl::sum(p, {1}, /*keepdims=*/true), carry[0]};
                });
            out[pl::all] = o_acc[pl::all] / last[1];
            m_out[pl::all] = last[0];
            l_out[pl::all] = last[1];
            prev_out[pl::all] = last[2];
          },
          {pl::ShapeDtype({M, D}, pl::f32), pl::ShapeDtype({M, 1}, pl::f32), pl::ShapeDtype({M, 1}, pl::f32),
           pl::ShapeDtype({M, 1}, pl::f32)},
          plgpu::Mesh{},
          run_on(how, {plgpu::SMEM({M, K}, pl::bf16), plgpu::SMEM({J, K, N}, pl::bf16), plgpu::SMEM({J, N, D}, pl::bf16),
                       plgpu::ACC({M, N}), plgpu::ACC({M, D}), plgpu::Barrier{.num_arrivals = 3}}));
    };
    pl::Array a = random_f32({M, K}, 111).astype(pl::bf16), b = random_f32({J, K, N}, 112).astype(pl::bf16);
    pl::Array v = random_f32({J, N, D}, 113).astype(pl::bf16);
    // out = sum_j exp(s_j - m) v_j / l, with m the row max over every block and l the row sum of
    // exp(s - m). p is rounded to bf16 for its product (2^-9 of each weight).
    auto check = [&, M = M, N = N](const std::vector<pl::Array>& out) {
      for (int64_t i = 0; i < M; ++i) {
        std::vector<double> s(static_cast<size_t>(J * N));
        std::vector<double> block_max(J, -INFINITY);
        for (int64_t j = 0; j < J; ++j)
          for (int64_t col = 0; col < N; ++col) {
            double x = 0;
            for (int64_t q = 0; q < K; ++q) x += a.get({i, q}) * b.get({j, q, col});
            s[static_cast<size_t>(j * N + col)] = x;
            block_max[static_cast<size_t>(j)] = std::max(block_max[static_cast<size_t>(j)], x);
          }
        const double mx = *std::max_element(block_max.begin(), block_max.end());
        const double prev = std::max(block_max[0], block_max[1]);  // m before the last block
        double l = 0;
        for (double x : s) l += std::exp(x - mx);
        EXPECT_NEAR(out.at(1).get({i, 0}), mx, 1e-4 * (1 + std::abs(mx))) << i;
        EXPECT_NEAR(out.at(2).get({i, 0}), l, 1e-4 * l) << i;
        EXPECT_NEAR(out.at(3).get({i, 0}), prev, 1e-4 * (1 + std::abs(prev))) << i;
        for (int64_t d = 0; d < D; ++d) {
          double want = 0, scale = 0;
          for (int64_t j = 0; j < J; ++j)
            for (int64_t col = 0; col < N; ++col) {
              const double w = std::exp(s[static_cast<size_t>(j * N + col)] - mx) * v.get({j, col, d});
              want += w, scale += std::abs(w);
            }
          EXPECT_NEAR(out.at(0).get({i, d}), want / l, 1e-5 + 4e-3 * scale / l) << i << "," << d;
        }
      }
    };
    check(make("interpret")(a, b, v));
    std::shared_ptr<const pl::TracedCall> tc = make("gpu_emulate").trace({a.shape_dtype(), b.shape_dtype(), v.shape_dtype()});
    // (64 x 256 is past the register budget: its tiles' layout is what this tests.)
    const plgpu::GeneratedKernel k =
        plgpu::generate_cuda(*tc, tc->grid_mapping.grid, {.swizzle = c.swizzle, .register_tile_budget = plgpu::CodegenOptions::kNoRegisterBudget});
    EXPECT_CONTAINS(k.source, c.registers);
    // The loop's three carries (holders), s, m's row max and m_new, alpha, p, p in bf16, p's row
    // sum and the sum l_new; o's load after the loop.
    EXPECT_EQ(k.register_tiles, 12);
    // Within the register budget 64 x 256's s, p and p in bf16 would go to the arena, which would
    // then outgrow shared memory: the kernel is generated again without the budget.
    EXPECT_EQ(plgpu::generate_cuda(*tc, tc->grid_mapping.grid, {.swizzle = c.swizzle}).register_tiles, 12);
    // The rescaling reads alpha's register of each of the ACC's registers' rows.
    EXPECT_CONTAINS(k.source, "int pl_k) { return (float)(((float)((pl_old * v");
    plgpu::HostEmulationStats stats;
    check(plgpu::run_host_emulation(*tc, k, {a, b, v}, tc->grid_mapping.grid, 128, &stats));
    EXPECT_EQ(stats.acc_flushes, 0);
    const plgpu::GeneratedKernel no_wgmma = with_source_edit(k, "#define PL_WGMMA_STAGES ", "#define PL_NO_WGMMA_STAGES ");
    plgpu::HostEmulationStats in_memory;
    check(plgpu::run_host_emulation(*tc, no_wgmma, {a, b, v}, tc->grid_mapping.grid, 128, &in_memory));
    EXPECT_EQ(in_memory.wgmma_instructions, 0);
    if (N <= 64) {  // (64 x 256: s, p and p in bf16 as tiles would outgrow shared memory)
      const plgpu::GeneratedKernel arena =
          plgpu::generate_cuda(*tc, tc->grid_mapping.grid, {.swizzle = c.swizzle, .register_tiles = false});
      EXPECT_EQ(arena.register_tiles, 0);
      check(plgpu::run_host_emulation(*tc, arena, {a, b, v}, tc->grid_mapping.grid, 2, nullptr));
    }
    // The rescaling's rows read from the other row of the thread's two (bit 1 of the register's
    // index within its round flipped) rescale o wrongly.
    const plgpu::GeneratedKernel wrong = with_source_edit(k, ">> 1 & 1))])))); }))", ">> 1 & 1 ^ 1))])))); }))");
    const pl::Array bad = plgpu::run_host_emulation(*tc, wrong, {a, b, v}, tc->grid_mapping.grid, 128, nullptr).at(0);
    const pl::Array good = make("interpret")(a, b, v).at(0);
    double diff = 0;
    for (int64_t i = 0; i < M; ++i)
      for (int64_t d = 0; d < D; ++d) diff = std::max(diff, std::abs(bad.get({i, d}) - good.get({i, d})));
    EXPECT_GT(diff, 0.05);
    if (std::string why = pl::gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
    for (const char* arch : {"sm_90a", "sm_80"})
      EXPECT_NO_THROW(pl::gpu::Nvrtc::get().compile(k.source, "rows.cu", arch)) << arch;
  }
}

// A loop whose carry cannot stay in registers (its result is transposed) starts from rows that
// could: the initial value goes to the arena too, and the holder copies it from there (not from
// the registers of another layout). out = transpose of the row max of max(s, 2 s), s = a b.
TEST(GpuKernel, RegisterTilesLeaveALoopCarryTheArenaNeeds) {
  auto make = [](const std::string& how) {
    return plgpu::kernel(
        [](pl::Ref a, pl::Ref b, pl::Ref out, pl::Ref a_s, pl::Ref b_s, pl::Ref acc, pl::Ref bar) {
          zeroed_product(a, b, a_s, b_s, acc, bar);
          plgpu::wgmma_wait(0);
          const pl::Value m0 = pl::max(acc[pl::all], {1}, /*keepdims=*/true);
          const pl::Value last = pl::fori_loop(1, 3, m0, [&](pl::Value j, pl::Value m) {
            return pl::maximum(m, pl::max(acc[pl::all] * j.astype(pl::f32), {1}, /*keepdims=*/true));
          });
          out[pl::all] = pl::transpose(last, {1, 0});
        },
        {pl::ShapeDtype({1, 64}, pl::f32)}, plgpu::Mesh{},
        run_on(how, {plgpu::SMEM({64, 32}, pl::bf16), plgpu::SMEM({32, 64}, pl::bf16), plgpu::ACC({64, 64}),
                     plgpu::Barrier{.num_arrivals = 2}}));
  };
  pl::Array a = random_f32({64, 32}, 131).astype(pl::bf16), b = random_f32({32, 64}, 132).astype(pl::bf16);
  auto check = [&](const std::vector<pl::Array>& out) {
    for (int64_t i = 0; i < 64; ++i) {
      double want = -INFINITY;
      for (int64_t j = 0; j < 64; ++j) {
        double x = 0;
        for (int64_t q = 0; q < 32; ++q) x += a.get({i, q}) * b.get({q, j});
        want = std::max({want, x, 2 * x});
      }
      EXPECT_NEAR(out.at(0).get({0, i}), want, 1e-4 * (1 + std::abs(want))) << i;
    }
  };
  check(make("interpret")(a, b));
  std::shared_ptr<const pl::TracedCall> tc = make("gpu_emulate").trace({a.shape_dtype(), b.shape_dtype()});
  const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
  // acc's load and its row max before the loop, the load, acc * j and its row max in it; not m0
  // (its expand_dims) nor the carry.
  EXPECT_EQ(k.register_tiles, 5);
  check(plgpu::run_host_emulation(*tc, k, {a, b}, tc->grid_mapping.grid, 128, nullptr));
}

// Register tiles reduced along their columns and whole: s = a b in registers (an ACC's), its
// column sums and maxima (each thread's registers of a column, the warp's rows by shuffles, the
// warps' totals through shared memory), its total (every thread gets it: the group's shuffles and
// a word per warp) and the total of its rows' maxima (rows in registers: a quad's lanes count
// once), each stored and the totals also used by a register tile's loop. Three layouts: 64 x 64, 128 x 64 (two row bands), 64 x 256 unswizzled (two 128-column
// blocks per band). Against C++ from a and b: on the interpreter, host emulated; columns mixed
// up within a quad give other sums; NVRTC for sm_90a.
TEST(GpuKernel, RegisterTilesReduceTheirColumnsAndTotals) {
  struct Case {
    int64_t M, N;
    bool swizzle;
  };
  for (const Case& c : {Case{64, 64, true}, Case{128, 64, true}, Case{64, 256, false}}) {
    const int64_t M = c.M, N = c.N;
    SCOPED_TRACE(std::to_string(M) + "x" + std::to_string(N) + (c.swizzle ? "" : " unswizzled"));
    constexpr int64_t K = 32;
    auto make = [M = M, N = N](const std::string& how) {
      return plgpu::kernel(
          [=](pl::Ref a, pl::Ref b, pl::Ref col_sum, pl::Ref col_max, pl::Ref scaled, pl::Ref totals, pl::Ref a_s, pl::Ref b_s,
              pl::Ref acc, pl::Ref bar) {
            zeroed_product(a, b, a_s, b_s, acc, bar);
            plgpu::wgmma_wait(0);
            const pl::Value s = acc[pl::all];
            col_sum[pl::all] = pl::sum(s * 2.0f, {0});
            col_max[pl::all] = pl::max(s, {0});
            const pl::Value total = pl::sum(s, {0, 1});
            const pl::Value max_total = pl::sum(pl::max(s, {1}), {0});
            scaled[pl::all] = s * total - max_total;
            totals[pl::all] = pl::concatenate({pl::broadcast_to(total, {1}), pl::broadcast_to(max_total, {1})}, 0);
          },
          {pl::ShapeDtype({N}, pl::f32), pl::ShapeDtype({N}, pl::f32), pl::ShapeDtype({M, N}, pl::f32),
           pl::ShapeDtype({2}, pl::f32)},
          plgpu::Mesh{},
          run_on(how, {plgpu::SMEM({M, K}, pl::bf16), plgpu::SMEM({K, N}, pl::bf16), plgpu::ACC({M, N}),
                       plgpu::Barrier{.num_arrivals = 2}}));
    };
    pl::Array a = random_f32({M, K}, 121).astype(pl::bf16), b = random_f32({K, N}, 122).astype(pl::bf16);
    auto check = [&, M = M, N = N](const std::vector<pl::Array>& out) {
      std::vector<double> s(static_cast<size_t>(M * N));
      double total = 0, max_total = 0, magnitude = 0;
      for (int64_t i = 0; i < M; ++i) {
        double row_max = -INFINITY;
        for (int64_t j = 0; j < N; ++j) {
          double x = 0;
          for (int64_t q = 0; q < K; ++q) x += a.get({i, q}) * b.get({q, j});
          s[static_cast<size_t>(i * N + j)] = x;
          total += x, magnitude += std::abs(x);
          row_max = std::max(row_max, x);
        }
        max_total += row_max;
      }
      for (int64_t j = 0; j < N; ++j) {
        double sum = 0, mx = -INFINITY, mag = 0;
        for (int64_t i = 0; i < M; ++i) {
          const double x = s[static_cast<size_t>(i * N + j)];
          sum += 2 * x, mx = std::max(mx, x), mag += 2 * std::abs(x);
        }
        EXPECT_NEAR(out.at(0).get({j}), sum, 1e-5 * (1 + mag)) << j;
        EXPECT_NEAR(out.at(1).get({j}), mx, 1e-5 * (1 + std::abs(mx))) << j;
      }
      double max_magnitude = 0;
      for (int64_t i = 0; i < M; ++i) {
        double row_max = -INFINITY;
        for (int64_t j = 0; j < N; ++j) row_max = std::max(row_max, s[static_cast<size_t>(i * N + j)]);
        max_magnitude += std::abs(row_max);
      }
      EXPECT_NEAR(out.at(3).get({0}), total, 1e-5 * (1 + magnitude));
      EXPECT_NEAR(out.at(3).get({1}), max_total, 1e-5 * (1 + max_magnitude));
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          const double x = s[static_cast<size_t>(i * N + j)], want = x * total - max_total;
          EXPECT_NEAR(out.at(2).get({i, j}), want, 1e-5 * (1 + std::abs(x) * magnitude + max_magnitude)) << i << "," << j;
        }
    };
    check(make("interpret")(a, b));
    std::shared_ptr<const pl::TracedCall> tc = make("gpu_emulate").trace({a.shape_dtype(), b.shape_dtype()});
    // (64 x 256 is past the register budget: its tiles' layout is what this tests.)
    const plgpu::GeneratedKernel k =
        plgpu::generate_cuda(*tc, tc->grid_mapping.grid, {.swizzle = c.swizzle, .register_tile_budget = plgpu::CodegenOptions::kNoRegisterBudget});
    // s, s * 2 (its only use the column sums: in registers too), the rows max(s, 1).
    EXPECT_EQ(k.register_tiles, 3);
    EXPECT_CONTAINS(k.source, "= pl_team_combine<true>(total");
    EXPECT_CONTAINS(k.source, "pl_shfl_xor(pl_c[pl_j], pl_m)");
    plgpu::HostEmulationStats stats;
    check(plgpu::run_host_emulation(*tc, k, {a, b}, tc->grid_mapping.grid, 128, &stats));
    EXPECT_EQ(stats.acc_flushes, 0);
    // Columns mixed up across the quad (a lane's totals written as its neighbour's columns: a
    // permutation, no two lanes on one place) give other column sums.
    const plgpu::GeneratedKernel wrong =
        with_source_edit(k, " + 2 * (pl_tid() & 3) + (pl_j & 1)]", " + 2 * ((pl_tid() + 1) & 3) + (pl_j & 1)]");
    const pl::Array bad = plgpu::run_host_emulation(*tc, wrong, {a, b}, tc->grid_mapping.grid, 128, nullptr).at(0);
    const pl::Array good = make("interpret")(a, b).at(0);
    double diff = 0;
    for (int64_t j = 0; j < N; ++j) diff = std::max(diff, std::abs(bad.get({j}) - good.get({j})));
    EXPECT_GT(diff, 0.1);
    if (N == 64 && M == 64) {
      // A total of one warp's registers only gives another total.
      const plgpu::GeneratedKernel one_warp = with_source_edit(k, ", pl_nthreads(), comb", ", 32, comb");
      const pl::Array t = plgpu::run_host_emulation(*tc, one_warp, {a, b}, tc->grid_mapping.grid, 128, nullptr).at(3);
      EXPECT_GT(std::abs(t.get({0}) - make("interpret")(a, b).at(3).get({0})), 0.1);
    }
    if (std::string why = pl::gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
    EXPECT_NO_THROW(pl::gpu::Nvrtc::get().compile(k.source, "cols.cu", "sm_90a"));
  }
}

// After a store to part of an ACC in registers (which goes to its memory: the memory is then the
// newer copy), `acc = acc * 2` must double what the memory holds, not the registers from before.
// Two Pallas threads each read acc.at(t) and, after a meeting, thread 1 reads acc.at(t - 1),
// thread 0's matrix: that buffer is viewed at two places of the thread index, so it stays in
// memory (one thread's registers cannot hold another's matrix). Interpreter against host
// emulation on wgmma (warpgroups) and against C++.
TEST(GpuKernel, AccRegistersFollowTheirMemoryAndOneMatrixPerThread) {
  pl::Array a = random_f32({64, 32}, 71).astype(pl::bf16), b = random_f32({32, 32}, 72).astype(pl::bf16);
  std::vector<double> s(64 * 32, 0.0);
  for (int64_t i = 0; i < 64; ++i)
    for (int64_t j = 0; j < 32; ++j)
      for (int64_t q = 0; q < 32; ++q) s[i * 32 + j] += a.get({i, q}) * b.get({q, j});
  auto run_both = [&](const std::function<pl::PallasCall(const std::string&)>& make, int threads,
                      const std::function<double(int64_t, int64_t)>& want, bool registers) {
    auto check = [&](const pl::Array& out) {
      for (int64_t i = 0; i < 64; ++i)
        for (int64_t j = 0; j < 32; ++j)
          EXPECT_NEAR(out.get({i, j}), want(i, j), 1e-3 * (1 + std::abs(want(i, j)))) << i << "," << j;
    };
    check(make("interpret")(a, b)[0]);
    std::shared_ptr<const pl::TracedCall> tc = make("gpu_emulate").trace({a.shape_dtype(), b.shape_dtype()});
    const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
    EXPECT_EQ(k.accumulators_in_registers.empty(), !registers);
    check(plgpu::run_host_emulation(*tc, k, {a, b}, tc->grid_mapping.grid, threads, nullptr)[0]);
  };
  // (1) acc = a b; acc[0:32] = 1 (to memory); acc = acc * 2: rows 0..31 are 2, the rest 2 s.
  run_both(
      [](const std::string& how) {
        return plgpu::kernel(
            [](pl::Ref a, pl::Ref b, pl::Ref out, pl::Ref a_s, pl::Ref b_s, pl::Ref acc, pl::Ref bar) {
              zeroed_product(a, b, a_s, b_s, acc, bar);
              plgpu::wgmma_wait(0);
              acc[pl::ds(0, 32)] = pl::full({32, 32}, pl::f32, 1.0);
              acc[pl::all] = acc[pl::all] * 2.0f;
              out[pl::all] = acc[pl::all];
            },
            {pl::ShapeDtype({64, 32}, pl::f32)}, plgpu::Mesh{},
            run_on(how, {plgpu::SMEM({64, 32}, pl::bf16), plgpu::SMEM({32, 32}, pl::bf16), plgpu::ACC({64, 32}),
                         plgpu::Barrier{.num_arrivals = 2}}));
      },
      128, [&](int64_t i, int64_t j) { return i < 32 ? 2.0 : 2.0 * s[i * 32 + j]; }, true);
  // (2) thread t's matrix is (t + 1) a b; thread 1 stores thread 0's: a b.
  run_both(
      [](const std::string& how) {
        return plgpu::kernel(
            [](pl::Ref a, pl::Ref b, pl::Ref out, pl::Ref a_s, pl::Ref b_s, pl::Ref acc, pl::Ref bar, pl::Ref meet) {
              pl::Value t = plgpu::axis_index("t");
              pl::when(t == 0, [&] {
                plgpu::copy_gmem_to_smem(a, a_s, bar);
                plgpu::copy_gmem_to_smem(b, b_s, bar);
              });
              plgpu::barrier_wait(bar);
              pl::Ref mine = acc.at(t);
              mine[pl::all] = pl::zeros({64, 32}, pl::f32);
              plgpu::wgmma(mine, a_s, b_s);
              plgpu::wgmma_wait(0);
              mine[pl::all] = mine[pl::all] * (t + 1).astype(pl::f32);
              plgpu::barrier_arrive(meet);
              plgpu::barrier_wait(meet);
              pl::when(t == 1, [&] { out[pl::all] = acc.at(t - 1)[pl::all]; });
            },
            {pl::ShapeDtype({64, 32}, pl::f32)}, plgpu::Mesh{.num_threads = 2, .thread_name = "t"},
            run_on(how, {plgpu::SMEM({64, 32}, pl::bf16), plgpu::SMEM({32, 32}, pl::bf16), plgpu::ACC({2, 64, 32}),
                         plgpu::Barrier{.num_arrivals = 2}, plgpu::Barrier{.num_arrivals = 2}}));
      },
      256, [&](int64_t i, int64_t j) { return s[i * 32 + j]; }, false);
}

// A wgmma into registers runs until wgmma_wait: here the program refills b's tile (a second copy)
// while the wgmma reading it may still run — a race, which the interpreter reports. Host
// emulation retires the wgmma at the wgmma_wait, after the copy landed, so its product is a c: the
// wgmma did not wait when issued (nor at wgmma_wait(1)); with CodegenOptions::async_wgmma off it
// does, and the product is a b. With the ACC shared by two threads
// (a 2-D ACC in a two-thread CTA), one matrix for every thread (acc.at(wg * 0)) or an f16 ACC, the
// ACC stays in memory; acc.at(wg + 1) is in registers.
TEST(GpuKernel, AWgmmaIntoRegistersRunsUntilWgmmaWait) {
  auto make = [](const std::string& how) {
    return plgpu::kernel(
        [](pl::Ref a, pl::Ref b, pl::Ref c, pl::Ref out, pl::Ref a_s, pl::Ref b_s, pl::Ref acc, pl::Ref both,
           pl::Ref one) {
          zeroed_product(a, b, a_s, b_s, acc, both);
          plgpu::wgmma_wait(1);
          plgpu::copy_gmem_to_smem(c, b_s, one);
          plgpu::barrier_wait(one);
          plgpu::wgmma_wait(0);
          out[pl::all] = acc[pl::all];
        },
        {pl::ShapeDtype({64, 16}, pl::f32)}, plgpu::Mesh{},
        run_on(how, {plgpu::SMEM({64, 16}, pl::bf16), plgpu::SMEM({16, 16}, pl::bf16), plgpu::ACC({64, 16}),
                     plgpu::Barrier{.num_arrivals = 2}, plgpu::Barrier{.num_arrivals = 1}}));
  };
  pl::Array a = random_f32({64, 16}, 41).astype(pl::bf16), b = random_f32({16, 16}, 42).astype(pl::bf16);
  pl::Array c = random_f32({16, 16}, 43).astype(pl::bf16);
  std::string e = error_of([&] { make("interpret")(a, b, c); });
  EXPECT_CONTAINS(e, "data race");
  EXPECT_CONTAINS(e, "the wgmma issued by");
  std::shared_ptr<const pl::TracedCall> tc = make("gpu_emulate").trace({a.shape_dtype(), b.shape_dtype(), c.shape_dtype()});
  const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
  EXPECT_EQ(k.accumulators_in_registers, std::vector<int>{2});
  expect_product_of(a, c, plgpu::run_host_emulation(*tc, k, {a, b, c}, tc->grid_mapping.grid, 128, nullptr).at(0));
  // With async_wgmma off, each wgmma is done when issued: the product is a b.
  const plgpu::GeneratedKernel sync = plgpu::generate_cuda(*tc, tc->grid_mapping.grid, {.async_wgmma = false});
  expect_product_of(a, b, plgpu::run_host_emulation(*tc, sync, {a, b, c}, tc->grid_mapping.grid, 128, nullptr).at(0));

  // Kept in memory: each way still the product (interpreter and host emulation).
  // (kShifted, acc.at(wg + 1): another matrix for every thread, in registers too.)
  enum Way { kShared2d, kOneMatrixForAll, kF16, kShifted };
  for (Way way : {kShared2d, kOneMatrixForAll, kF16, kShifted}) {
    SCOPED_TRACE(static_cast<int>(way));
    auto kernel = [way](const std::string& how) {
      return plgpu::kernel(
          [way](pl::Ref a, pl::Ref b, pl::Ref out, pl::Ref a_s, pl::Ref b_s, pl::Ref acc, pl::Ref bar) {
            pl::Value wg = plgpu::axis_index("wg");
            pl::when(wg == 0, [&] {
              plgpu::copy_gmem_to_smem(a, a_s, bar.at(0));
              plgpu::copy_gmem_to_smem(b, b_s, bar.at(0));
              plgpu::barrier_wait(bar.at(0));
              pl::Ref mine = way == kShared2d ? acc : acc.at(way == kOneMatrixForAll ? wg * 0 : way == kShifted ? wg + 1 : wg);
              mine[pl::all] = pl::zeros({64, 16}, way == kF16 ? pl::f16 : pl::f32);
              plgpu::wgmma(mine, a_s, b_s);
              plgpu::wgmma_wait(0);
              out[pl::all] = mine[pl::all].astype(pl::f32);
            });
          },
          {pl::ShapeDtype({64, 16}, pl::f32)}, plgpu::Mesh{.num_threads = 2, .thread_name = "wg"},
          run_on(how, {plgpu::SMEM({64, 16}, pl::f16), plgpu::SMEM({16, 16}, pl::f16),
                       way == kShared2d ? plgpu::ACC({64, 16}) : plgpu::ACC({2, 64, 16}, way == kF16 ? pl::f16 : pl::f32),
                       plgpu::Barrier{.num_arrivals = 2}}));
    };
    pl::Array x = random_f32({64, 16}, 44).astype(pl::f16), y = random_f32({16, 16}, 45).astype(pl::f16);
    std::vector<pl::Array> want = kernel("interpret")(x, y);
    std::shared_ptr<const pl::TracedCall> t = kernel("gpu_emulate").trace({x.shape_dtype(), y.shape_dtype()});
    const plgpu::GeneratedKernel g = plgpu::generate_cuda(*t, t->grid_mapping.grid);
    EXPECT_EQ(g.accumulators_in_registers.empty(), way != kShifted);
    if (way != kF16) expect_product_of(x, y, want.at(0));
    const pl::Array got = plgpu::run_host_emulation(*t, g, {x, y}, t->grid_mapping.grid, 2 * 128, nullptr).at(0);
    // (The interpreter's product is a BLAS sgemm, whose order of sums depends on the CPU: f32
    // sums agree to rounding, the f16 ACC's to an f16 rounding.)
    const double tolerance = way == kF16 ? 2e-3 : 1e-5;
    for (int64_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got.get_flat(i), want.at(0).get_flat(i), tolerance * (1 + std::abs(want.at(0).get_flat(i)))) << i;
  }
}

// The generated CUDA of the primitives (mbarrier PTX, named barriers per warpgroup) is valid for
// the GPUs: NVRTC compiles it to a cubin for Hopper and Ampere.
TEST(GpuKernel, PrimitivesCompileWithNvrtcForHopperAndAmpere) {
  if (std::string why = pl::gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  pl::PallasCall call = warp_specialized_matmul("mosaic_gpu");
  std::shared_ptr<const pl::TracedCall> tc =
      call.trace({pl::ShapeDtype({64, 96}, pl::bf16), pl::ShapeDtype({96, 32}, pl::bf16)});
  pl::gpu::GeneratedKernel k = pl::gpu::generate_cuda(*tc, tc->grid_mapping.grid);
  EXPECT_EQ(k.threads_per_cta, 3 * 128);
  EXPECT_EQ(k.num_barriers, 4);
  EXPECT_CONTAINS(k.source, "mbarrier.test_wait.parity");
  EXPECT_CONTAINS(k.source, "bar.sync");
  for (const char* arch : {"sm_90a", "sm_80"}) {
    pl::gpu::CompiledKernel c = pl::gpu::Nvrtc::get().compile(k.source, "warp_specialized.cu", arch);
    EXPECT_TRUE(c.is_cubin) << arch;
  }
}

// set_max_registers becomes setmaxnreg where every warpgroup's request follows from its thread
// index and they all fit: 3 warpgroups start with 168 registers a thread (65536 / 384, in steps
// of 8); the producer's 40 and the consumers' 232 are 40 + 2 x 232 = 3 x 168. The kernel is then
// declared with a minimum of one CTA per SM (ptxas ignores setmaxnreg without it: C7508), and
// its sm_90a SASS has the two USETMAXREG. Requests that cannot fit (on a GPU an increase would
// wait forever) are an error at the user's line; requests the code generator cannot follow stay
// hints.
TEST(GpuKernel, SetMaxRegistersBecomesSetmaxnregWhereTheRequestsFit) {
  std::shared_ptr<const pl::TracedCall> tc = warp_specialized_matmul("mosaic_gpu").trace(
      {pl::ShapeDtype({64, 96}, pl::bf16), pl::ShapeDtype({96, 32}, pl::bf16)});
  const pl::gpu::GeneratedKernel k = pl::gpu::generate_cuda(*tc, tc->grid_mapping.grid);
  EXPECT_TRUE(k.reallocates_registers);
  EXPECT_CONTAINS(k.source, "pl_setmaxnreg<40, false>();");
  EXPECT_CONTAINS(k.source, "pl_setmaxnreg<232, true>();");
  EXPECT_CONTAINS(k.source, "__launch_bounds__(384, 1)");
  // Three warpgroups: wg 2 lowers to `low`, the others raise to `high` (`where`: a condition on
  // something else than the thread index; `loop`: the request inside a loop).
  auto count_of = [](const std::string& text, const std::string& what) {
    int n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  int high_line = 0;  // (where the consumers' request is)
  auto kernel = [&high_line](int low, int high, bool where = false, bool loop = false) {
    return plgpu::kernel(
        [=, &high_line](pl::Ref x, pl::Ref out) {
          pl::Value wg = plgpu::axis_index("wg");
          pl::when(wg == 2, [&] { plgpu::set_max_registers(low, /*increase=*/false); });
          high_line = __LINE__ + 1;
          auto raise = [&] { plgpu::set_max_registers(high, /*increase=*/true); };
          if (where)
            pl::when(x[0] > 0, raise);
          else if (loop)
            pl::fori_loop(0, 1, [&](pl::Value) { pl::when(wg != 2, raise); });
          else
            pl::when(1 - (wg / 2) == 1, raise);
          out[wg] = x[wg];
        },
        {pl::ShapeDtype({3}, pl::f32)}, plgpu::Mesh{.num_threads = 3, .thread_name = "wg"}, run_on("interpret", {}));
  };
  auto generated = [&](int low, int high, bool where = false, bool loop = false) {
    std::shared_ptr<const pl::TracedCall> t = kernel(low, high, where, loop).trace({pl::ShapeDtype({3}, pl::f32)});
    return pl::gpu::generate_cuda(*t, t->grid_mapping.grid);
  };
  EXPECT_TRUE(generated(24, 240).reallocates_registers);  // 24 + 2 x 240 = 504 = 3 x 168
  // 40 + 2 x 240 > 504: an error of the code generator, and of the interpreter (which follows
  // any kernel: here one whose requests are under a loop).
  const pl::Array x = random_f32({3}, 5);
  for (const std::string& e : {error_of([&] { generated(40, 240); }), error_of([&] { kernel(40, 240, false, true)(x); })}) {
    EXPECT_CONTAINS(e, "would hold 66560 registers in all, more than the 64512 of the CTA (384 threads x 168)");
    EXPECT_CONTAINS(e, "wait forever");
    EXPECT_CONTAINS(e, "gpu_kernel_test.cpp:" + std::to_string(high_line));
  }
  EXPECT_EQ(kernel(40, 232, false, true)(x).at(0).get({1}), x.get({1}));  // (fits)
  EXPECT_TRUE(generated(40, 160).reallocates_registers);  // (ptxas starts them all with 160)
  for (bool where : {true, false}) {
    const pl::gpu::GeneratedKernel hint = generated(40, 232, where, !where);
    EXPECT_FALSE(hint.reallocates_registers);
    EXPECT_EQ(count_of(hint.source, "pl_setmaxnreg<"), 0);
    EXPECT_EQ(count_of(hint.source, "__launch_bounds__(384)"), 1);
    EXPECT_CONTAINS(hint.source, where ? "a hint, not emitted: a set_max_registers under a condition (gpu_kernel_test.cpp:"
                                       : "a hint, not emitted: a set_max_registers inside a for (gpu_kernel_test.cpp:");
  }
  if (pl::gpu::Nvrtc::unavailable_reason().empty() && !test_util::find_cuobjdump().empty()) {
    const std::string sass = test_util::sass_of(k.source, "sm_90a");
    EXPECT_EQ(count_of(sass, "USETMAXREG"), 2) << sass.substr(0, 2000);
    // A kernel without tensor-core products reallocates too (one request per branch).
    const std::string plain = test_util::sass_of(generated(24, 240).source, "sm_90a");
    EXPECT_EQ(count_of(plain, "USETMAXREG"), 2) << plain.substr(0, 2000);
  }
}

// Compiled clusters: the grid, cluster and thread axes of every CTA (the cluster axes decoded from
// the CTA's rank in its cluster), over more points than the emulated cluster has CTAs at once.
TEST(GpuKernel, CompiledAxisIndicesOfClusterAxes) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref out) {
        pl::Value g = plgpu::axis_index("g"), x = plgpu::axis_index("x"), y = plgpu::axis_index("y");
        pl::Value w = plgpu::axis_index("wg");
        out[((g * 2 + x) * 3 + y) * 2 + w] = g * 1000 + x * 100 + y * 10 + w;
      },
      {pl::ShapeDtype({5 * 2 * 3 * 2}, pl::i32)},
      plgpu::Mesh{.grid = {5}, .grid_names = {"g"}, .cluster = {2, 3}, .cluster_names = {"x", "y"},
                  .num_threads = 2, .thread_name = "wg"},
      run_on("gpu_emulate", {}));
  pl::Array out = call().at(0);
  for (int g = 0; g < 5; ++g)
    for (int x = 0; x < 2; ++x)
      for (int y = 0; y < 3; ++y)
        for (int w = 0; w < 2; ++w)
          EXPECT_EQ(out.data<int32_t>()[((g * 2 + x) * 3 + y) * 2 + w], g * 1000 + x * 100 + y * 10 + w);
}

// Rounds through ClusterBarriers of a 2 x 2 cluster. Along x, the peers are pairs: each round a
// CTA writes its cell, arrives on itself and its x-neighbour, waits, and reads the neighbour's
// cell. Then one phase along x and y (3 arrivals: itself and both neighbours) orders the last
// round's cells for reading both neighbours'.
pl::PallasCall cluster_rounds(const std::string& how, bool rounds_along_both_axes) {
  constexpr int kRounds = 3, kGrid = 2;
  return plgpu::kernel(
      [rounds_along_both_axes](pl::Ref x_in, pl::Ref mid, pl::Ref out, pl::Ref bar_x, pl::Ref bar_xy) {
        pl::Value g = plgpu::axis_index("g"), x = plgpu::axis_index("x"), y = plgpu::axis_index("y");
        pl::Value cell = g * 4 + x * 2 + y;
        const pl::Ref& bar = rounds_along_both_axes ? bar_xy : bar_x;
        pl::fori_loop(0, kRounds, [&](pl::Value r) {
          pl::Value v = x_in[cell];
          mid[r * kGrid * 4 + cell] = v * (r + 1);
          plgpu::barrier_arrive(bar);
          plgpu::barrier_wait(bar);
          pl::Value nx = mid[r * kGrid * 4 + g * 4 + (1 - x) * 2 + y];
          out[r * kGrid * 4 + cell] = nx * 100;
        });
        if (!rounds_along_both_axes) {
          plgpu::barrier_arrive(bar_xy);
          plgpu::barrier_wait(bar_xy);
        }
        pl::Value last = (kRounds - 1) * kGrid * 4 + g * 4;
        pl::Value nx = mid[last + (1 - x) * 2 + y], ny = mid[last + x * 2 + (1 - y)];
        out[kRounds * kGrid * 4 + cell] = nx * 100 + ny;
      },
      {pl::ShapeDtype({kRounds * kGrid * 4}, pl::i32), pl::ShapeDtype({(kRounds + 1) * kGrid * 4}, pl::i32)},
      plgpu::Mesh{.grid = {kGrid}, .grid_names = {"g"}, .cluster = {2, 2}, .cluster_names = {"x", "y"}},
      run_on(how, {plgpu::ClusterBarrier{.collective_axes = {"x"}}, plgpu::ClusterBarrier{.collective_axes = {"x", "y"}}}));
}

TEST_P(GpuKernelBoth, ClusterBarrierRoundsAlongOneAxisThenBoth) {
  constexpr int kRounds = 3, kGrid = 2;
  pl::Array x = pl::Array::zeros({kGrid * 4}, pl::i32);
  for (int i = 0; i < kGrid * 4; ++i) x.data<int32_t>()[i] = 3 + 7 * i;
  pl::Array out = cluster_rounds(GetParam(), false)(x).at(1);
  for (int g = 0; g < kGrid; ++g)
    for (int cx = 0; cx < 2; ++cx)
      for (int cy = 0; cy < 2; ++cy) {
        const int cell = g * 4 + cx * 2 + cy;
        for (int r = 0; r < kRounds; ++r)
          EXPECT_EQ(out.data<int32_t>()[r * kGrid * 4 + cell], x.data<int32_t>()[g * 4 + (1 - cx) * 2 + cy] * (r + 1) * 100)
              << r << g << cx << cy;
        const int nx = x.data<int32_t>()[g * 4 + (1 - cx) * 2 + cy] * kRounds;
        const int ny = x.data<int32_t>()[g * 4 + cx * 2 + (1 - cy)] * kRounds;
        EXPECT_EQ(out.data<int32_t>()[kRounds * kGrid * 4 + cell], nx * 100 + ny) << g << cx << cy;
      }
}

// Along x and y the peers overlap without being closed: CTA (0, 1) does not wait for (1, 0), so it
// can arrive for its next round on (1, 1) before (1, 0)'s arrival of this round — completing
// (1, 1)'s phase without it (as the mbarrier would on a GPU). Reusing such a barrier round after
// round races, and the interpreter says so.
TEST(GpuKernelErrors, ClusterBarrierRoundsAlongTwoAxesRace) {
  pl::Array x = pl::Array::zeros({8}, pl::i32);
  std::string e = error_of([&] { cluster_rounds("interpret", true)(x); });
  EXPECT_CONTAINS(e, "gpu::kernel data race");
  EXPECT_CONTAINS(e, "on output 0 [24]");
}

// The peers of each CTA (ranks row-major over the cluster axes), worked out by hand for a 2 x 2
// cluster: along x, rank 0 = (0, 0) reaches ranks 0 and 2 (mask 5); along x and y, ranks 0, 1, 2
// (mask 7). The cluster code compiles for sm_90a (mapa, cluster-scope arrive and wait,
// barrier.cluster) and is refused for sm_80, which has no clusters.
TEST(GpuKernel, ClusterBarrierPeersAndNvrtc) {
  auto generated = [](std::vector<std::string> axes) {
    pl::PallasCall call = plgpu::kernel(
        [](pl::Ref out, pl::Ref bar) {
          plgpu::barrier_arrive(bar);
          plgpu::barrier_wait(bar);
          out[plgpu::axis_index("x") * 2 + plgpu::axis_index("y")] = 1;
        },
        {pl::ShapeDtype({4}, pl::i32)}, plgpu::Mesh{.cluster = {2, 2}, .cluster_names = {"x", "y"}},
        run_on("gpu_emulate", {plgpu::ClusterBarrier{.collective_axes = std::move(axes)}}));
    std::shared_ptr<const pl::TracedCall> tc = call.trace({});
    return pl::gpu::generate_cuda(*tc, tc->grid_mapping.grid);
  };
  pl::gpu::GeneratedKernel along_x = generated({"x"});
  EXPECT_EQ(along_x.cluster_ctas, 4);
  EXPECT_CONTAINS(along_x.source,
                  "return (pl_cluster_rank() == 0 ? 5u : pl_cluster_rank() == 1 ? 10u : pl_cluster_rank() == 2 ? 5u : 10u);");
  EXPECT_CONTAINS(along_x.source, "pl_mbar_arrive_peers(");
  pl::gpu::GeneratedKernel both = generated({"x", "y"});
  EXPECT_CONTAINS(both.source,
                  "return (pl_cluster_rank() == 0 ? 7u : pl_cluster_rank() == 1 ? 11u : pl_cluster_rank() == 2 ? 13u : 14u);");
  if (std::string why = pl::gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  EXPECT_TRUE(pl::gpu::Nvrtc::get().compile(both.source, "cluster.cu", "sm_90a").is_cubin);
  const std::vector<char> image = pl::gpu::Nvrtc::get().compile(both.source, "cluster.cu", "compute_90a").image;
  const std::string ptx(image.begin(), image.end());
  EXPECT_CONTAINS(ptx, "mapa.shared::cluster");
  EXPECT_CONTAINS(ptx, "mbarrier.arrive.release.cluster.shared::cluster");
  EXPECT_CONTAINS(ptx, "barrier.cluster.arrive");
  EXPECT_CONTAINS(ptx, "fence.mbarrier_init.release.cluster");
  EXPECT_CONTAINS(ptx, "mbarrier.test_wait.parity.acquire.cluster");
  EXPECT_CONTAINS(error_of([&] { pl::gpu::Nvrtc::get().compile(both.source, "cluster.cu", "sm_80"); }),
                  "clusters of more than one CTA needs sm_90");
}

}  // namespace

// ---- run_scoped in a gpu::kernel: SMEM buffers and barriers for the scope (Mosaic GPU kernels
// allocate their whole pipeline so, collective over the thread axis).

// A producer thread fills two slots of a scoped buffer by copies on scoped "full" barriers, a
// consumer computes from them and frees each slot on an "empty" barrier — all three allocated by
// one run_scoped that both warpgroups share. Entered twice (a loop around it): the second time
// the barriers are fresh again (the waits count phases from 1). out is checked against a plain loop.
pl::PallasCall shared_scope_pipeline(const std::string& how) {
  constexpr int kSteps = 4;
  return plgpu::kernel(
      [](pl::Ref x, pl::Ref out) {
        pl::Value b = plgpu::axis_index("b"), wg = plgpu::axis_index("wg");
        pl::fori_loop(0, 2, [&](pl::Value round) {
          pl::run_scoped(
              {plgpu::SMEM({2, 64}, pl::f32), plgpu::Barrier{.num_barriers = 2}, plgpu::Barrier{.num_barriers = 2}},
              [&](std::vector<pl::Ref> s) {
                const pl::Ref& buf = s[0];
                const pl::Ref& full = s[1];
                const pl::Ref& empty = s[2];
                for (int step = 0; step < kSteps; ++step) {
                  const int slot = step % 2;
                  pl::Value chunk = ((b * 2 + round) * kSteps + step) * 64;
                  pl::when(wg == 0, [&] {
                    if (step >= 2) plgpu::barrier_wait(empty.at(slot));
                    plgpu::copy_gmem_to_smem(x.at(pl::ds(chunk, 64)), buf.at(slot), full.at(slot));
                  });
                  pl::when(wg == 1, [&] {
                    plgpu::barrier_wait(full.at(slot));
                    out.at(pl::ds(chunk, 64))[pl::all] = buf.at(slot)[pl::all] * 2.0f + static_cast<float>(step);
                    plgpu::barrier_arrive(empty.at(slot));
                  });
                }
                return std::vector<pl::Value>{};
              },
              {.collective_axes = {"wg"}});
        });
      },
      {pl::ShapeDtype({3 * 2 * kSteps * 64}, pl::f32)},
      plgpu::Mesh{.grid = {3}, .grid_names = {"b"}, .num_threads = 2, .thread_name = "wg"}, run_on(how, {}));
}

TEST_P(GpuKernelBoth, ScopedBuffersAndBarriersAreSharedByTheThreadsOfACta) {
  const pl::Array x = random_f32({3 * 2 * 4 * 64}, 21);
  const pl::Array out = shared_scope_pipeline(GetParam())(x).at(0);
  for (int64_t i = 0; i < x.size(); ++i)
    ASSERT_EQ(out.data<float>()[i], 2.0f * x.data<float>()[i] + static_cast<float>(i / 64 % 4)) << i;
  if (GetParam() != "gpu_emulate") return;
  // The generated unit: the scope's barriers are made new and its syncs span the CTA.
  std::shared_ptr<const pl::TracedCall> tc = shared_scope_pipeline(GetParam()).trace({x.shape_dtype()});
  const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
  EXPECT_CONTAINS(k.source, "// (shared by the CTA's Pallas threads)");
  EXPECT_CONTAINS(k.source, "pl_mbar_inval(");
  EXPECT_CONTAINS(k.source, "pl_mbar_wait(pl_mbar + 0, pl_phase, 0, p.err)");  // the meeting (the scope's first barrier)
  if (std::string why = pl::gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  for (const char* arch : {"sm_90a", "sm_80"}) EXPECT_NO_THROW(pl::gpu::Nvrtc::get().compile(k.source, "scoped.cu", arch)) << arch;
}

// Without collective_axes each Pallas thread's scope is its own: here each warpgroup copies its
// own chunk into its own buffer on its own barrier (compiled: a barrier per warpgroup), twice.
TEST_P(GpuKernelBoth, EachThreadsScopeHasBarriersOfItsOwn) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref out) {
        pl::Value b = plgpu::axis_index("b"), wg = plgpu::axis_index("wg");
        for (int round = 0; round < 2; ++round)
          pl::run_scoped({plgpu::SMEM({32}, pl::f32), plgpu::TMABarrier{}}, [&](std::vector<pl::Ref> s) {
            pl::Value chunk = ((b * 2 + wg) * 2 + round) * 32;
            plgpu::copy_gmem_to_smem(x.at(pl::ds(chunk, 32)), s[0], s[1]);
            plgpu::barrier_wait(s[1]);
            out.at(pl::ds(chunk, 32))[pl::all] = s[0][pl::all] - 1.0f;
            return std::vector<pl::Value>{};
          });
      },
      {pl::ShapeDtype({2 * 2 * 2 * 32}, pl::f32)},
      plgpu::Mesh{.grid = {2}, .grid_names = {"b"}, .num_threads = 2, .thread_name = "wg"}, run_on(GetParam(), {}));
  const pl::Array x = random_f32({256}, 23);
  const pl::Array out = call(x).at(0);
  for (int64_t i = 0; i < 256; ++i) EXPECT_EQ(out.data<float>()[i], x.data<float>()[i] - 1.0f) << i;
}

// With one Pallas thread per CTA a scope shared along the thread axis is the thread's own; with a
// barrier it is laid out for the CTA (its barrier made new at each entry: a loop of 3).
TEST_P(GpuKernelBoth, AScopeOfAOneThreadCtaCompiles) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref out) {
        pl::Value b = plgpu::axis_index("b");
        pl::run_scoped(
            {plgpu::SMEM({128}, pl::f32)},
            [&](std::vector<pl::Ref> s) {
              s[0][pl::all] = x.at(pl::ds(b * 128, 128))[pl::all] * 3.0f;
              out.at(pl::ds(b * 128, 128))[pl::all] = s[0][pl::all] + 1.0f;
              return std::vector<pl::Value>{};
            },
            {.collective_axes = {"wg"}});
        pl::fori_loop(0, 3, [&](pl::Value i) {
          pl::run_scoped(
              {plgpu::SMEM({128}, pl::f32), plgpu::Barrier{}},
              [&](std::vector<pl::Ref> s) {
                plgpu::copy_gmem_to_smem(x.at(pl::ds(b * 128, 128)), s[0], s[1]);
                plgpu::barrier_wait(s[1]);
                out.at(pl::ds(512 + (b * 3 + i) * 128, 128))[pl::all] = s[0][pl::all] * pl::convert(i, pl::f32);
                return std::vector<pl::Value>{};
              },
              {.collective_axes = {"wg"}});
        });
      },
      {pl::ShapeDtype({512 + 4 * 3 * 128}, pl::f32)},
      plgpu::Mesh{.grid = {4}, .grid_names = {"b"}, .num_threads = 1, .thread_name = "wg"}, run_on(GetParam(), {}));
  const pl::Array x = random_f32({512}, 22);
  const pl::Array out = call(x).at(0);
  for (int64_t i = 0; i < 512; ++i) EXPECT_EQ(out.data<float>()[i], x.data<float>()[i] * 3.0f + 1.0f) << i;
  for (int64_t b = 0; b < 4; ++b)
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t i = 0; i < 128; ++i)
        EXPECT_EQ(out.data<float>()[512 + (b * 3 + r) * 128 + i], x.data<float>()[b * 128 + i] * static_cast<float>(r));
}

// Compiled, shared scopes one after another reuse the same bytes; a scope inside another lies
// above it. Each warpgroup's body touches only its half of each array, but the entry's fill is
// spread over the whole CTA, so the entry meeting is what orders it before the other group's
// writes; the outer scope's data must survive the inner one, and the sibling gets fresh (NaN)
// memory.
TEST_P(GpuKernelBoth, SiblingScopesShareMemoryAndNestedScopesDoNot) {
  auto shared = [](pl::Shape shape, std::function<void(pl::Ref)> body) {
    pl::run_scoped(
        {plgpu::SMEM(shape, pl::f32)},
        [&](std::vector<pl::Ref> s) {
          body(s[0]);
          return std::vector<pl::Value>{};
        },
        {.collective_axes = {"wg"}});
  };
  pl::PallasCall call = plgpu::kernel(
      [&](pl::Ref x, pl::Ref outer, pl::Ref inner, pl::Ref kept, pl::Ref sibling) {
        pl::Value half = plgpu::axis_index("wg") * 32;
        auto mine = [&](const pl::Ref& r) { return r.at(pl::ds(half, 32)); };
        shared({64}, [&](pl::Ref a) {
          mine(a)[pl::all] = mine(x)[pl::all] * 2.0f;
          mine(outer)[pl::all] = mine(a)[pl::all];
          shared({64}, [&](pl::Ref b) {
            mine(b)[pl::all] = mine(x)[pl::all] + 1.0f;
            mine(inner)[pl::all] = mine(b)[pl::all];
          });
          mine(kept)[pl::all] = mine(a)[pl::all];
        });
        shared({64}, [&](pl::Ref c) { mine(sibling)[pl::all] = mine(c)[pl::all]; });  // uninitialized: NaN
      },
      {pl::ShapeDtype({64}, pl::f32), pl::ShapeDtype({64}, pl::f32), pl::ShapeDtype({64}, pl::f32), pl::ShapeDtype({64}, pl::f32)},
      plgpu::Mesh{.num_threads = 2, .thread_name = "wg"}, run_on(GetParam(), {}));
  const pl::Array x = random_f32({64}, 31);
  const std::vector<pl::Array> out = call(x);
  for (int64_t i = 0; i < 64; ++i) {
    const float v = x.data<float>()[i];
    EXPECT_EQ(out[0].data<float>()[i], v * 2.0f) << i;
    EXPECT_EQ(out[1].data<float>()[i], v + 1.0f) << i;
    EXPECT_EQ(out[2].data<float>()[i], v * 2.0f) << i;
    EXPECT_TRUE(std::isnan(out[3].data<float>()[i])) << i;
  }
  if (GetParam() != "gpu_emulate") return;
  std::shared_ptr<const pl::TracedCall> tc = call.trace({x.shape_dtype()});
  const std::string src = plgpu::generate_cuda(*tc, tc->grid_mapping.grid).source;
  std::vector<std::string> at;  // the three scopes' arrays, in order
  const std::regex array(R"(float\* s\d+ = \(float\*\)\(cta_arena \+ (\d+)\);)");
  for (std::sregex_iterator it(src.begin(), src.end(), array), end; it != end; ++it) at.push_back((*it)[1]);
  ASSERT_EQ(at.size(), 3u) << src;
  EXPECT_EQ(at[0], at[2]);                          // the siblings
  EXPECT_EQ(std::stoi(at[1]), std::stoi(at[0]) + 256);  // the inner scope above the outer
}

TEST(GpuKernelErrors, ScopedBuffersAndBarriersMisused) {
  const plgpu::Mesh two{.grid = {1}, .grid_names = {"b"}, .num_threads = 2, .thread_name = "wg"};
  auto scoped = [](std::vector<pl::ScopedAlloc> allocs, std::function<void(std::vector<pl::Ref>)> body,
                   std::vector<std::string> axes = {"wg"}) {
    pl::run_scoped(
        allocs,
        [&](std::vector<pl::Ref> s) {
          body(s);
          return std::vector<pl::Value>{};
        },
        {.collective_axes = axes});
  };
  auto run = [&](std::function<void(pl::Ref, pl::Ref)> kernel, const plgpu::Mesh& mesh) {
    return error_of([&] {
      plgpu::kernel(kernel, {pl::ShapeDtype({64}, pl::f32)}, mesh, interpreted({}))(random_f32({64}, 3));
    });
  };
  // A thread that never enters a shared scope: the other waits forever.
  std::string e = run(
      [&](pl::Ref, pl::Ref) {
        pl::when(plgpu::axis_index("wg") == 0, [&] { scoped({plgpu::SMEM({64}, pl::f32)}, [](std::vector<pl::Ref>) {}); });
      },
      two);
  EXPECT_CONTAINS(e, "gpu::kernel deadlock");
  EXPECT_CONTAINS(e, "for every thread of CTA (0,) to enter the run_scoped (collective over the thread axis; 1 of 2 have)");
  // One thread writes the shared buffer, the other reads it with nothing ordering them.
  e = run(
      [&](pl::Ref x, pl::Ref out) {
        pl::Value wg = plgpu::axis_index("wg");
        scoped({plgpu::SMEM({64}, pl::f32)}, [&](std::vector<pl::Ref> s) {
          pl::when(wg == 0, [&] { s[0][pl::all] = x[pl::all]; });
          pl::when(wg == 1, [&] { out[pl::all] = s[0][pl::all]; });
        });
      },
      two);
  EXPECT_CONTAINS(e, "gpu::kernel data race");
  EXPECT_CONTAINS(e, "run_scoped[0] at gpu_kernel_test.cpp:");
  // A copy into the scope's memory that nobody waits for before the scope ends.
  e = run(
      [&](pl::Ref x, pl::Ref) {
        scoped({plgpu::SMEM({64}, pl::f32), plgpu::Barrier{}},
               [&](std::vector<pl::Ref> s) { plgpu::copy_gmem_to_smem(x, s[0], s[1]); }, {});
      },
      plgpu::Mesh{.grid = {1}, .grid_names = {"b"}});
  EXPECT_CONTAINS(e, "ends before any thread waits for phase 1 of its barrier run_scoped[1] at gpu_kernel_test.cpp:");
  // A copy out of the scope's memory that nobody waits for before the scope gives it back.
  e = run(
      [&](pl::Ref x, pl::Ref out) {
        scoped({plgpu::SMEM({64}, pl::f32)},
               [&](std::vector<pl::Ref> s) {
                 s[0][pl::all] = x[pl::all];
                 plgpu::commit_smem();
                 plgpu::copy_smem_to_gmem(s[0], out);
               },
               {});
      },
      plgpu::Mesh{.grid = {1}, .grid_names = {"b"}});
  EXPECT_CONTAINS(e, "gpu::kernel data race");
  EXPECT_CONTAINS(e, "the end of the run_scoped at gpu_kernel_test.cpp:");
  // A multicast into a scope's memory (its peers remake their scopes without waiting for it).
  e = run(
      [&](pl::Ref x, pl::Ref) {
        scoped({plgpu::SMEM({64}, pl::f32), plgpu::Barrier{}}, [&](std::vector<pl::Ref> s) {
          plgpu::copy_gmem_to_smem(x, s[0], s[1], {"c"});
          plgpu::barrier_wait(s[1]);
        }, {});
      },
      plgpu::Mesh{.cluster = {2}, .cluster_names = {"c"}});
  EXPECT_CONTAINS(e, "not supported yet: copy_gmem_to_smem with collective_axes (a multicast) into a run_scoped array");
  // A barrier used after its scope.
  e = run(
      [&](pl::Ref, pl::Ref) {
        pl::Ref kept;
        scoped({plgpu::Barrier{}}, [&](std::vector<pl::Ref> s) { kept = s[0]; }, {});
        plgpu::barrier_arrive(kept);
      },
      plgpu::Mesh{.grid = {1}, .grid_names = {"b"}});
  EXPECT_CONTAINS(e, "was defined inside a region that has ended (a loop body, a branch or a scope)");
  // Names and kinds.
  e = run([&](pl::Ref, pl::Ref) { scoped({plgpu::SMEM({64}, pl::f32)}, [](std::vector<pl::Ref>) {}, {"b"}); }, two);
  EXPECT_CONTAINS(e, "run_scoped: collective_axes names 'b', which is not the mesh's thread axis ('wg')");
  e = run([&](pl::Ref, pl::Ref) { scoped({plgpu::SMEM({64}, pl::f32)}, [](std::vector<pl::Ref>) {}); },
          plgpu::Mesh{.grid = {1}, .grid_names = {"b"}});
  EXPECT_CONTAINS(e, "(the mesh has none: give it num_threads and thread_name)");
  e = run([&](pl::Ref, pl::Ref) { scoped({plgpu::Union{.members = {{plgpu::SMEM({4}, pl::f32)}}}}, [](std::vector<pl::Ref>) {}); }, two);
  EXPECT_CONTAINS(e, "not supported yet: run_scoped: allocation 0 is a gpu::Union in run_scoped");
  // A scope's semaphores are the CTA's (Mosaic GPU: thread-collective only).
  e = run([&](pl::Ref, pl::Ref) { scoped({plgpu::Semaphore{}}, [](std::vector<pl::Ref>) {}, {}); }, two);
  EXPECT_CONTAINS(e, "run_scoped: allocation 0 is a gpu::Semaphore, which the CTA's Pallas threads share: give the "
                     "run_scoped collective_axes = {\"wg\"}");
  e = error_of([] {
    pl::pallas_call(
        [](pl::Ref, pl::Ref o) {
          pl::run_scoped({plgpu::Semaphore{}}, [](std::vector<pl::Ref>) { return std::vector<pl::Value>{}; });
          o[pl::all] = pl::zeros({8}, pl::f32);
        },
        {pl::ShapeDtype({8}, pl::f32)}, {.interpret = true})(random_f32({8}, 1));
  });
  EXPECT_CONTAINS(e, "run_scoped: allocation 0 is a gpu::Semaphore, which only a gpu::kernel's body can allocate");
  // Scoped buffers count toward the CTA's 227 KiB of shared memory, beside the scratch.
  e = error_of([&] {
    plgpu::kernel(
        [&](pl::Ref, pl::Ref, pl::Ref) { scoped({plgpu::SMEM({16384}, pl::f32)}, [](std::vector<pl::Ref>) {}); },
        {pl::ShapeDtype({64}, pl::f32)}, two, interpreted({plgpu::SMEM({51200}, pl::f32)}))(random_f32({64}, 3));
  });
  EXPECT_CONTAINS(e, "gpu::kernel exceeds available shared memory: the run_scoped here needs 65536 bytes of SMEM, which "
                     "with the scratch's 204800 and the scopes around it makes 270336, more than the 232448");
  // A thread's own scopes count once per Pallas thread (compiled, each warpgroup reserves its own).
  e = error_of([&] {
    plgpu::kernel([&](pl::Ref, pl::Ref) { scoped({plgpu::SMEM({30720}, pl::f32)}, [](std::vector<pl::Ref>) {}, {}); },
                  {pl::ShapeDtype({64}, pl::f32)}, two, interpreted({}))(random_f32({64}, 3));
  });
  EXPECT_CONTAINS(e, "needs 122880 bytes of SMEM per Pallas thread (2 of them)");
  // Scopes one after another give their bytes back: two of 120 KiB in turn fit.
  EXPECT_NO_THROW(plgpu::kernel(
      [&](pl::Ref, pl::Ref) {
        scoped({plgpu::SMEM({30720}, pl::f32)}, [](std::vector<pl::Ref>) {});
        scoped({plgpu::SMEM({30720}, pl::f32)}, [](std::vector<pl::Ref>) {});
      },
      {pl::ShapeDtype({64}, pl::f32)}, two, interpreted({}))(random_f32({64}, 3)));
  // Barriers and shared scopes belong to gpu::kernel.
  pl::CallOptions o;
  o.interpret = true;
  e = error_of([&] {
    pl::pallas_call(
        [&](pl::Ref, pl::Ref) { scoped({plgpu::Barrier{}}, [](std::vector<pl::Ref>) {}, {}); },
        pl::ShapeDtype({64}, pl::f32), o)(random_f32({64}, 3));
  });
  EXPECT_CONTAINS(e, "run_scoped: allocation 0 is a gpu::Barrier, which only a gpu::kernel's body can allocate");
  e = error_of([&] {
    pl::pallas_call([&](pl::Ref, pl::Ref) { scoped({pl::tpu::VMEM({8}, pl::f32)}, [](std::vector<pl::Ref>) {}); },
                    pl::ShapeDtype({64}, pl::f32), o)(random_f32({64}, 3));
  });
  EXPECT_CONTAINS(e, "run_scoped with collective_axes: only a gpu::kernel's body shares scoped buffers");
}
// A scope may hold the operands, the accumulator and the barrier of a product (Mosaic GPU kernels
// allocate their ACC so): compiled, the scoped ACC is memory in the arena (not registers).
TEST_P(GpuKernelBoth, AScopeHoldsAProductsOperandsAndAccumulator) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref a, pl::Ref b, pl::Ref out) {
        pl::run_scoped({plgpu::SMEM({64, 64}, pl::bf16), plgpu::SMEM({64, 64}, pl::bf16), plgpu::ACC({64, 64}), plgpu::Barrier{.num_arrivals = 2}},
                       [&](std::vector<pl::Ref> s) {
                         plgpu::copy_gmem_to_smem(a, s[0], s[3]);
                         plgpu::copy_gmem_to_smem(b, s[1], s[3]);
                         plgpu::barrier_wait(s[3]);
                         s[2][pl::all] = pl::full({64, 64}, pl::f32, 0.0);
                         plgpu::wgmma(s[2], s[0], s[1]);
                         plgpu::wgmma_wait(0);
                         out[pl::all] = s[2][pl::all];
                         return std::vector<pl::Value>{};
                       });
      },
      {pl::ShapeDtype({64, 64}, pl::f32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"b"}}, run_on(GetParam(), {}));
  const pl::Array a = random_f32({64, 64}, 1).astype(pl::bf16), b = random_f32({64, 64}, 2).astype(pl::bf16);
  expect_product_of(a, b, call(a, b).at(0));
  if (GetParam() != "gpu_emulate") return;
  // Compiled, the scope's operands are swizzled tiles (each from a 1024-byte boundary) that the
  // copies fill in wgmma's layout and wgmma reads in place: no staging copy.
  std::shared_ptr<const pl::TracedCall> tc = call.trace({a.shape_dtype(), b.shape_dtype()});
  const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
  EXPECT_EQ(k.tensor_core_dots, 1);
  EXPECT_EQ(k.staged_tensor_core_dots, 0);
  EXPECT_EQ(swizzled_scope_arrays(k.source), 2) << k.source.substr(0, 4000);
  if (std::string why = check_compiles_to_hgmma(k.source, "scoped_wgmma.cu"); !why.empty()) GTEST_SKIP() << why;
}

// A Pallas thread's own scopes (with a barrier: laid out, the arrays still the thread's; without:
// plain) hold its product's operands; one or two Pallas threads per CTA, each its own rows of a.
TEST_P(GpuKernelBoth, EachThreadsOwnScopeHoldsItsProductsOperands) {
  std::string skipped;  // why the compiled unit could not be checked on this machine
  for (int threads : {1, 2}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    pl::PallasCall call = plgpu::kernel(
        [](pl::Ref a, pl::Ref b, pl::Ref copied, pl::Ref stored) {
          pl::Value rows = plgpu::axis_index("wg") * 64;
          pl::run_scoped({plgpu::SMEM({64, 64}, pl::bf16), plgpu::SMEM({64, 64}, pl::bf16), plgpu::ACC({64, 64}),
                          plgpu::Barrier{.num_arrivals = 2}},
                         [&](std::vector<pl::Ref> s) {
                           plgpu::copy_gmem_to_smem(a.at(pl::ds(rows, 64)), s[0], s[3]);
                           plgpu::copy_gmem_to_smem(b, s[1], s[3]);
                           plgpu::barrier_wait(s[3]);
                           s[2][pl::all] = pl::full({64, 64}, pl::f32, 0.0);
                           plgpu::wgmma(s[2], s[0], s[1]);
                           plgpu::wgmma_wait(0);
                           copied.at(pl::ds(rows, 64))[pl::all] = s[2][pl::all];
                           return std::vector<pl::Value>{};
                         });
          // (The last array, 1040 bytes, leaves a thread's tiles short of a whole KiB.)
          pl::run_scoped({plgpu::SMEM({64, 64}, pl::bf16), plgpu::SMEM({64, 64}, pl::bf16), plgpu::ACC({64, 64}),
                          plgpu::SMEM({260}, pl::f32)},
                         [&](std::vector<pl::Ref> s) {
                           s[0][pl::all] = a.at(pl::ds(rows, 64))[pl::all];
                           s[1][pl::all] = b[pl::all] * 2.0f;
                           s[2][pl::all] = pl::full({64, 64}, pl::f32, 0.0);
                           plgpu::wgmma(s[2], s[0], s[1]);
                           plgpu::wgmma_wait(0);
                           stored.at(pl::ds(rows, 64))[pl::all] = s[2][pl::all];
                           return std::vector<pl::Value>{};
                         });
        },
        {pl::ShapeDtype({64 * threads, 64}, pl::f32), pl::ShapeDtype({64 * threads, 64}, pl::f32)},
        plgpu::Mesh{.grid = {1}, .grid_names = {"b"}, .num_threads = threads, .thread_name = "wg"},
        run_on(GetParam(), {}));
    const pl::Array a = random_f32({64 * threads, 64}, 3).astype(pl::bf16), b = random_f32({64, 64}, 4).astype(pl::bf16);
    const std::vector<pl::Array> outs = call(a, b);
    expect_product_of(a, b, outs.at(0));
    std::vector<double> twice_b = b.to_doubles();
    for (double& v : twice_b) v *= 2;  // (exact in bf16)
    expect_product_of(a, pl::Array::from_values(b.shape(), pl::bf16, twice_b), outs.at(1));
    if (GetParam() != "gpu_emulate") continue;
    // Compiled, all four operands are swizzled tiles in the thread's tile arena (1024-byte
    // boundaries; each Pallas thread's copy a whole number of KiB further): no staging copy.
    std::shared_ptr<const pl::TracedCall> tc = call.trace({a.shape_dtype(), b.shape_dtype()});
    const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
    EXPECT_EQ(k.tensor_core_dots, 2);
    EXPECT_EQ(k.staged_tensor_core_dots, 0);
    EXPECT_EQ(swizzled_scope_arrays(k.source), 4) << k.source.substr(0, 4000);
    std::smatch group_bytes;
    ASSERT_TRUE(std::regex_search(k.source, group_bytes, std::regex(R"(#define PL_GROUP_TILE_BYTES (\d+)LL)")));
    EXPECT_EQ(std::stoll(group_bytes[1]) % 1024, 0);
    // Whole warpgroups of host threads: the products are emulated wgmma instructions reading the
    // swizzled arrays in place (each product one 64 x 64 block over K = 64: 4 k16 instructions).
    pl::gpu::HostEmulationStats stats;
    const std::vector<pl::Array> on_wgmma =
        pl::gpu::run_host_emulation(*tc, k, {a, b}, tc->grid_mapping.grid, 128 * threads, &stats);
    EXPECT_EQ(stats.wgmma_instructions, 2 * threads * 4);
    expect_product_of(a, b, on_wgmma.at(0));
    expect_product_of(a, pl::Array::from_values(b.shape(), pl::bf16, twice_b), on_wgmma.at(1));
    skipped = check_compiles_to_hgmma(k.source, "own_scope_wgmma.cu");
  }
  if (!skipped.empty()) GTEST_SKIP() << skipped;  // (after both thread counts have run)
}
