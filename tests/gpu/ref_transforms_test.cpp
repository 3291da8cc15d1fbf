// Ref transforms (JAX's ref.T / ref.transpose / ref.reshape): views of the same memory with the
// dims permuted or reshaped, on the reference interpreter, the TPU interpret mode (with its race
// detection seeing through them), host emulation of the generated CUDA and (with a GPU) compiled;
// wgmma reading a transposed SMEM tile as its b (attention's q k^T). Expected values come from
// plain C++ loops over the inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/call.h"
#include "gpu/codegen.h"
#include "gpu/cuda_libs.h"
#include "gpu/host_emulation.h"
#include "pallas/gpu.h"
#include "pallas/pallas.h"
#include "pallas/tpu.h"
#include "pallas/transforms.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"
#include "tests/tpu/tpu_test_util.h"

namespace {

namespace pl = ::pallas;
namespace plgpu = ::pallas::gpu;
namespace pltpu = ::pallas::tpu;
using test_util::random_f32;

// Where a pallas_call runs: the OnGpuBackends places plus the TPU interpret mode.
pl::CallOptions options_for(const std::string& how) {
  if (how == "tpu_interpret") {
    pl::CallOptions o;
    o.interpret = pltpu::InterpretParams{};
    return o;
  }
  return test_util::run_on(how, {});
}

class RefTransforms : public test_util::OnGpuBackends {};
INSTANTIATE_TEST_SUITE_P(Backends, RefTransforms, testing::Values("interpret", "tpu_interpret", "gpu_emulate", "mosaic_gpu"),
                         test_util::backend_name);

// Loads and stores through transposes and reshapes, of whole Refs and of views, with static and
// dynamic indices after the transform.
TEST_P(RefTransforms, LoadsAndStoresSeeTheElementsInTheNewOrder) {
  auto kernel = [](pl::Ref x, pl::Ref y, pl::Ref t, pl::Ref r, pl::Ref s, pl::Ref p, pl::Ref v, pl::Ref w, pl::Ref u,
                   pl::Ref q) {
    t[pl::all] = x.T()[pl::all];
    r.reshape({8, 16})[pl::all] = x[pl::all] * 2.0f;         // a store through a reshape
    s.T()[pl::all] = x.T()[pl::all] + 1.0f;                   // and through a transpose
    p[pl::all] = y.transpose({2, 0, 1})[pl::all];
    v[pl::all] = x.at(pl::ds(2, 4), pl::ds(0, 4, 2)).T()[pl::all];  // a strided view's transpose
    w[pl::all] = y.at(1).reshape({12})[pl::all];                    // a view of whole trailing dims
    u[pl::all] = x.at(pl::ds(0, 3)).reshape({3, 2, 8}).at(pl::all, 1)[pl::all];  // a split dim, indexed
    pl::fori_loop(0, 16, [&](pl::Value i) { q.at(i)[pl::all] = x.T().at(i)[pl::all] - 1.0f; });
  };
  const std::vector<pl::ShapeDtype> outs = {{{16, 8}, pl::f32}, {{4, 32}, pl::f32}, {{8, 16}, pl::f32},
                                            {{4, 2, 3}, pl::f32}, {{4, 4}, pl::f32}, {{12}, pl::f32},
                                            {{3, 8}, pl::f32},   {{16, 8}, pl::f32}};
  pl::PallasCall call = pl::pallas_call(kernel, outs, options_for(GetParam()));
  const pl::Array x = random_f32({8, 16}, 1), y = random_f32({2, 3, 4}, 2);
  const std::vector<pl::Array> out = call(x, y);
  auto X = [&](int64_t i, int64_t j) { return x.data<float>()[i * 16 + j]; };
  auto Y = [&](int64_t a, int64_t b, int64_t c) { return y.data<float>()[(a * 3 + b) * 4 + c]; };
  for (int64_t i = 0; i < 16; ++i)
    for (int64_t j = 0; j < 8; ++j) {
      EXPECT_EQ(out[0].get({i, j}), X(j, i)) << i << "," << j;
      EXPECT_EQ(out[7].get({i, j}), X(j, i) - 1.0f) << i << "," << j;
    }
  for (int64_t e = 0; e < 128; ++e) EXPECT_EQ(out[1].data<float>()[e], x.data<float>()[e] * 2.0f) << e;
  for (int64_t e = 0; e < 128; ++e) EXPECT_EQ(out[2].data<float>()[e], x.data<float>()[e] + 1.0f) << e;
  for (int64_t a = 0; a < 4; ++a)
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(out[3].get({a, b, c}), Y(b, c, a)) << a << b << c;
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(out[4].get({i, j}), X(2 + j, 2 * i)) << i << "," << j;
  for (int64_t e = 0; e < 12; ++e) EXPECT_EQ(out[5].get({e}), Y(1, e / 4, e % 4)) << e;
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 8; ++j) EXPECT_EQ(out[6].get({i, j}), X(i, 8 + j)) << i << "," << j;
}

// Pipelined blocks (a grid over x's rows, a sequential axis over K): a dot of x's block with the
// transpose of y's (n, k) block, accumulated in scratch — the ring's slots read through a
// transposed view (on the GPU the slot stays row-major and the product reads it by its strides).
TEST_P(RefTransforms, ADotOfATransposedPipelinedBlock) {
  constexpr int64_t M = 128, N = 64, K = 128, bm = 64, bk = 64;
  pl::CallOptions opts = options_for(GetParam());
  opts.grid = {M / bm, K / bk};
  opts.in_specs = {pl::BlockSpec({bm, bk}, [](pl::Value i, pl::Value k) { return pl::Indices{i, k}; }),
                   pl::BlockSpec({N, bk}, [](pl::Value, pl::Value k) { return pl::Indices{0, k}; })};
  opts.out_specs = {pl::BlockSpec({bm, N}, [](pl::Value i, pl::Value) { return pl::Indices{i, 0}; })};
  opts.scratch_shapes = {pltpu::VMEM({bm, N}, pl::f32)};
  pl::PallasCall call = pl::pallas_call(
      [](pl::Ref x, pl::Ref y, pl::Ref o, pl::Ref acc) {
        pl::when(pl::program_id(1) == 0, [&] { acc[pl::all] = 0.0f; });
        acc[pl::all] += pl::dot(x[pl::all], y.T()[pl::all], {.preferred = pl::f32});
        pl::when(pl::program_id(1) == pl::num_programs(1) - 1, [&] { o[pl::all] = acc[pl::all]; });
      },
      pl::ShapeDtype({M, N}, pl::f32), opts);
  const pl::Array x = random_f32({M, K}, 21).astype(pl::bf16), y = random_f32({N, K}, 22).astype(pl::bf16);
  const pl::Array out = call(x, y).at(0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double want = 0;
      for (int64_t q = 0; q < K; ++q) want += x.get({i, q}) * y.get({j, q});
      ASSERT_NEAR(out.get({i, j}), want, 1e-4 * (1 + std::abs(want))) << i << "," << j;
    }
}

// A reshape that would merge dims that are not evenly spaced (rows 0-2 of each of 4 planes of 6)
// has no strides: the same message on every backend, naming the line.
TEST_P(RefTransforms, AReshapeStridesCannotExpressIsAnErrorNamingTheLine) {
  const int line = __LINE__ + 2;
  auto kernel = [](pl::Ref x, pl::Ref o) {
    o[pl::all] = x.at(pl::all, pl::ds(0, 3), pl::all).reshape({12, 8})[pl::all];
  };
  pl::PallasCall call = pl::pallas_call(kernel, pl::ShapeDtype({12, 8}, pl::f32), options_for(GetParam()));
  const std::string e = test_util::error_of([&] { call(random_f32({4, 6, 8}, 3)); });
  EXPECT_CONTAINS(e, "ref_reshape: a view of shape [4, 3, 8] with element strides [48, 8, 1] cannot be reshaped to [12, 8]");
  EXPECT_CONTAINS(e, "ref_transforms_test.cpp:" + std::to_string(line));
  // The dims it keeps apart need no even spacing: [4, 3, 8] -> [4, 24] is a view.
  pl::PallasCall fine = pl::pallas_call([](pl::Ref x, pl::Ref o) { o[pl::all] = x.at(pl::all, pl::ds(0, 3), pl::all).reshape({4, 24})[pl::all]; },
                                        pl::ShapeDtype({4, 24}, pl::f32), options_for(GetParam()));
  const pl::Array x = random_f32({4, 6, 8}, 3);
  const pl::Array o = fine(x).at(0);
  for (int64_t a = 0; a < 4; ++a)
    for (int64_t e = 0; e < 24; ++e) EXPECT_EQ(o.get({a, e}), x.data<float>()[a * 48 + e]) << a << "," << e;
}

// Bitcasts, against the inputs' bytes: the same width, a wider dtype (bf16 pairs as u32, of a
// whole Ref and of a view of some rows), a narrower one (f32 as bf16 halves), and a store through
// one.
TEST_P(RefTransforms, BitcastsReadAndWriteTheSameBytes) {
  auto kernel = [](pl::Ref x, pl::Ref y, pl::Ref bits, pl::Ref pairs, pl::Ref rows, pl::Ref halves, pl::Ref stored) {
    bits[pl::all] = x.bitcast(pl::i32)[pl::all];
    pairs[pl::all] = y.bitcast(pl::u32)[pl::all];
    rows[pl::all] = y.at(pl::ds(1, 2)).bitcast(pl::u32)[pl::all];
    halves[pl::all] = x.bitcast(pl::bf16)[pl::all];
    stored.bitcast(pl::f32)[pl::all] = x[pl::all] * 2.0f;
  };
  const std::vector<pl::ShapeDtype> outs = {{{4, 8}, pl::i32},     {{4, 4}, pl::u32}, {{2, 4}, pl::u32},
                                            {{4, 8, 2}, pl::bf16}, {{4, 8, 2}, pl::bf16}};
  pl::PallasCall call = pl::pallas_call(kernel, outs, options_for(GetParam()));
  const pl::Array x = random_f32({4, 8}, 11), y = random_f32({4, 4, 2}, 12).astype(pl::bf16);
  const std::vector<pl::Array> out = call(x, y);
  auto bytes_equal = [](const pl::Array& a, const void* want, size_t n) { return std::memcmp(a.raw_data(), want, n) == 0; };
  EXPECT_TRUE(bytes_equal(out[0], x.raw_data(), 128));
  EXPECT_TRUE(bytes_equal(out[1], y.raw_data(), 64));
  EXPECT_TRUE(bytes_equal(out[2], static_cast<const std::byte*>(y.raw_data()) + 16, 32));
  EXPECT_TRUE(bytes_equal(out[3], x.raw_data(), 128));
  std::vector<float> twice(32);
  for (int e = 0; e < 32; ++e) twice[static_cast<size_t>(e)] = x.data<float>()[e] * 2.0f;
  EXPECT_TRUE(bytes_equal(out[4], twice.data(), 128));
  // The bytes are the point: a value check of one element too, so a wrong byte order shows.
  uint32_t word;
  std::memcpy(&word, y.raw_data(), 4);
  EXPECT_EQ(out[1].data<uint32_t>()[0], word);
}

// A wider bitcast needs its elements' runs contiguous: of every other bf16 it is an error naming
// the line, on every backend. (Its start must be aligned too: the interpreters check it, below.)
TEST_P(RefTransforms, AWiderBitcastOfAStridedViewIsAnErrorNamingTheLine) {
  const int line = __LINE__ + 1;
  auto kernel = [](pl::Ref y, pl::Ref o) { o[pl::all] = y.at(pl::all, pl::ds(0, 2, 2)).bitcast(pl::u32)[pl::all]; };
  pl::PallasCall call = pl::pallas_call(kernel, pl::ShapeDtype({4}, pl::u32), options_for(GetParam()));
  const std::string e = test_util::error_of([&] { call(random_f32({4, 4}, 13).astype(pl::bf16)); });
  EXPECT_CONTAINS(e, "ref_bitcast");
  EXPECT_CONTAINS(e, "as u32");
  EXPECT_CONTAINS(e, "ref_transforms_test.cpp:" + std::to_string(line));
}

// A wider bitcast from an odd bf16 is misaligned (a misaligned-address fault on the GPU): every
// backend refuses it with the same message, naming the line (the GPU kernels check where the
// view starts when it runs).
TEST_P(RefTransforms, AMisalignedWiderBitcastIsAnErrorNamingTheLine) {
  const int line = __LINE__ + 1;
  auto kernel = [](pl::Ref y, pl::Ref o) { o[pl::all] = y.at(pl::all, pl::ds(1, 2)).bitcast(pl::u32)[pl::all]; };
  pl::PallasCall call = pl::pallas_call(kernel, pl::ShapeDtype({4}, pl::u32), options_for(GetParam()));
  const std::string e = test_util::error_of([&] { call(random_f32({4, 4}, 19).astype(pl::bf16)); });
  EXPECT_CONTAINS(e, "ref_bitcast: a view of shape [4, 2] as u32: the last dim, which the wider dtype's elements take, "
                     "must be contiguous, the view must start on a multiple of the wider element's size");
  EXPECT_CONTAINS(e, "ref_transforms_test.cpp:" + std::to_string(line));
  // From an even bf16 it is aligned, and reads the same bytes as the C++ below.
  auto even = [](pl::Ref y, pl::Ref o) { o[pl::all] = y.at(pl::all, pl::ds(2, 2)).bitcast(pl::u32)[pl::all]; };
  const pl::Array y = random_f32({4, 4}, 19).astype(pl::bf16);
  const pl::Array out = pl::pallas_call(even, pl::ShapeDtype({4}, pl::u32), options_for(GetParam()))(y)[0];
  for (int64_t r = 0; r < 4; ++r) {
    uint32_t want = 0;
    std::memcpy(&want, static_cast<const char*>(y.raw_data()) + (r * 4 + 2) * 2, 4);
    EXPECT_EQ(out.data<uint32_t>()[r], want) << r;
  }
}

// ---- wgmma's b as a transposed SMEM tile --------------------------------------------------------
class RefTransformsWgmma : public test_util::OnGpuBackends {};
INSTANTIATE_TEST_SUITE_P(Backends, RefTransformsWgmma, testing::Values("interpret", "gpu_emulate", "mosaic_gpu"),
                         test_util::backend_name);

// out = q @ k^T: q (64 x K) and k (N x K) copied into SMEM, wgmma(acc, q_s, k_s.T()).
pl::PallasCall q_kt(int64_t k_dim, int64_t n, pl::CallOptions opts) {
  opts.scratch_shapes = {plgpu::SMEM({64, k_dim}, pl::bf16), plgpu::SMEM({n, k_dim}, pl::bf16), plgpu::ACC({64, n}),
                         plgpu::Barrier{.num_arrivals = 2}};
  return plgpu::kernel(
      [=](pl::Ref q, pl::Ref k, pl::Ref out, pl::Ref q_s, pl::Ref k_s, pl::Ref acc, pl::Ref bar) {
        plgpu::copy_gmem_to_smem(q, q_s, bar);
        plgpu::copy_gmem_to_smem(k, k_s, bar);
        plgpu::barrier_wait(bar);
        acc[pl::all] = pl::zeros({64, n}, pl::f32);
        plgpu::wgmma(acc, q_s, k_s.T());
        plgpu::wgmma_wait(0);
        out[pl::all] = acc[pl::all];
      },
      {pl::ShapeDtype({64, n}, pl::f32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"b"}}, opts);
}

void expect_q_kt(const pl::Array& q, const pl::Array& k, const pl::Array& out) {
  const int64_t m = q.shape()[0], d = q.shape()[1], n = k.shape()[0];
  ASSERT_EQ(out.shape(), pl::Shape({m, n}));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double want = 0;
      for (int64_t c = 0; c < d; ++c) want += q.get({i, c}) * k.get({j, c});
      EXPECT_NEAR(out.get({i, j}), want, 1e-4 * (1 + std::abs(want))) << i << "," << j;
    }
}

// K of 32, 64 and 128 columns: k's rows are 64 bytes (a 64-byte swizzle), one 128-byte panel, or
// two panels.
TEST_P(RefTransformsWgmma, WgmmaReadsATransposedTileAsItsB) {
  for (int64_t k_dim : {32, 64, 128}) {
    SCOPED_TRACE("K " + std::to_string(k_dim));
    const pl::Array q = random_f32({64, k_dim}, 5).astype(pl::bf16), k = random_f32({64, k_dim}, 6).astype(pl::bf16);
    expect_q_kt(q, k, q_kt(k_dim, 64, test_util::run_on(GetParam(), {}))(q, k).at(0));
  }
}

// Compiled for sm_90a, the transposed tile stays swizzled and wgmma reads it in place, K-major
// (layout false in pl_swizzled_layout), with no staging; host emulation with a whole warpgroup
// runs wgmma from those descriptors. Read MN-major instead, the numbers are wrong (the test can
// fail).
TEST(RefTransformsCodegen, ATransposedSwizzledTileIsWgmmasKMajorB) {
  for (int64_t k_dim : {32, 64, 128}) {
    SCOPED_TRACE("K " + std::to_string(k_dim));
    const int64_t n = 128;
    const pl::Array q = random_f32({64, k_dim}, 7).astype(pl::bf16), k = random_f32({n, k_dim}, 8).astype(pl::bf16);
    pl::PallasCall call = q_kt(k_dim, n, test_util::run_on("gpu_emulate", {}));
    std::shared_ptr<const pl::TracedCall> tc = call.trace({q.shape_dtype(), k.shape_dtype()});
    plgpu::GeneratedKernel gk = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
    const std::string row_bytes = std::to_string(std::min<int64_t>(128, 2 * k_dim));
    EXPECT_CONTAINS(gk.source, "#define PL_SMEM_SWIZZLED_1 (PL_HAS_WGMMA ? " + row_bytes + " : 0)");
    const std::string layouts = "pl_swizzled_layout(PL_SMEM_SWIZZLED_0, false), pl_swizzled_layout(PL_SMEM_SWIZZLED_1, false)";
    EXPECT_CONTAINS(gk.source, layouts);
    EXPECT_EQ(gk.wgmma_staging_bytes, 0);
    plgpu::HostEmulationStats stats;
    expect_q_kt(q, k, plgpu::run_host_emulation(*tc, gk, {q, k}, tc->grid_mapping.grid, 128, &stats).at(0));
    EXPECT_EQ(stats.wgmma_instructions, k_dim / 16);  // (one 64 x 128 instruction per 16 of K)
    for (const char* arch : {"sm_90a", "sm_80"}) EXPECT_TRUE(plgpu::Nvrtc::get().compile(gk.source, "q_kt.cu", arch).is_cubin) << arch;
    if (k_dim != 64) continue;
    plgpu::GeneratedKernel wrong = gk;
    const std::string mn_major = "pl_swizzled_layout(PL_SMEM_SWIZZLED_0, false), pl_swizzled_layout(PL_SMEM_SWIZZLED_1, true)";
    wrong.source.replace(wrong.source.find(layouts), layouts.size(), mn_major);
    const pl::Array good = plgpu::run_host_emulation(*tc, gk, {q, k}, tc->grid_mapping.grid, 128, nullptr).at(0);
    const pl::Array bad = plgpu::run_host_emulation(*tc, wrong, {q, k}, tc->grid_mapping.grid, 128, nullptr).at(0);
    double diff = 0;
    for (int64_t e = 0; e < bad.size(); ++e)
      diff = std::max<double>(diff, std::abs(bad.data<float>()[e] - good.data<float>()[e]));
    EXPECT_GT(diff, 0.1);
  }
}

// An ACC kept in registers, stored whole into a transposed view (and a strided one): the
// registers go through the ACC's memory (pl_acc_store writes rows of consecutive elements).
TEST(RefTransformsCodegen, AnAccInRegistersIsStoredThroughATransposedView) {
  constexpr int64_t n = 64;
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref a, pl::Ref b, pl::Ref out_t, pl::Ref out_every_other, pl::Ref a_s, pl::Ref b_s, pl::Ref acc, pl::Ref bar) {
        plgpu::copy_gmem_to_smem(a, a_s, bar);
        plgpu::copy_gmem_to_smem(b, b_s, bar);
        plgpu::barrier_wait(bar);
        acc[pl::all] = pl::zeros({n, n}, pl::f32);
        plgpu::wgmma(acc, a_s, b_s);
        plgpu::wgmma_wait(0);
        out_t.T()[pl::all] = acc[pl::all];
        out_every_other.at(pl::all, pl::ds(0, n, 2))[pl::all] = acc[pl::all];
      },
      {pl::ShapeDtype({n, n}, pl::f32), pl::ShapeDtype({n, 2 * n}, pl::f32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"b"}},
      test_util::run_on("gpu_emulate", {plgpu::SMEM({n, n}, pl::bf16), plgpu::SMEM({n, n}, pl::bf16), plgpu::ACC({n, n}),
                                        plgpu::Barrier{.num_arrivals = 2}}));
  const pl::Array a = random_f32({n, n}, 17).astype(pl::bf16), b = random_f32({n, n}, 18).astype(pl::bf16);
  std::shared_ptr<const pl::TracedCall> tc = call.trace({a.shape_dtype(), b.shape_dtype()});
  const plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
  EXPECT_EQ(k.accumulators_in_registers.size(), 1u);
  for (int threads : {128, 2}) {  // whole warpgroups (wgmma, the registers), and the CUDA-core loop
    SCOPED_TRACE(std::to_string(threads) + " host threads");
    const std::vector<pl::Array> out = plgpu::run_host_emulation(*tc, k, {a, b}, tc->grid_mapping.grid, threads, nullptr);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double want = 0;
        for (int64_t q = 0; q < n; ++q) want += a.get({i, q}) * b.get({q, j});
        ASSERT_NEAR(out[0].get({j, i}), want, 1e-4 * (1 + std::abs(want))) << i << "," << j;
        ASSERT_NEAR(out[1].get({i, 2 * j}), want, 1e-4 * (1 + std::abs(want))) << i << "," << j;
      }
  }
}

// ---- The TPU interpret mode's race detection through transforms --------------------------------
// A DMA writes rows 0-3 of an (8, 128) VMEM buffer while the kernel reads it through a transpose
// or a reshape: rows 4-7 do not race with it, rows 2-5 do.
TEST(RefTransformsRaces, ADmaRacesOnlyWithTheElementsItWrites) {
  using View = std::function<pl::Value(const pl::Ref& buf)>;
  struct Case {
    const char* what;
    View read;
    bool races;
  };
  const Case cases[] = {
      {"transposed, rows 4-7", [](const pl::Ref& b) { return b.T().at(pl::all, pl::ds(4, 4))[pl::all]; }, false},
      {"transposed, rows 2-5", [](const pl::Ref& b) { return b.T().at(pl::all, pl::ds(2, 4))[pl::all]; }, true},
      {"split, rows 4-7", [](const pl::Ref& b) { return b.reshape({2, 4, 128}).at(1)[pl::all]; }, false},
      {"split, rows 2-3", [](const pl::Ref& b) { return b.reshape({4, 2, 128}).at(1)[pl::all]; }, true},
      {"merged, rows 4-7", [](const pl::Ref& b) { return b.reshape({1024}).at(pl::ds(512, 512))[pl::all]; }, false},
      {"merged, rows 3-4", [](const pl::Ref& b) { return b.reshape({1024}).at(pl::ds(384, 256))[pl::all]; }, true},
      // f32 as bf16 halves: a new last dim inside each f32.
      {"narrower, rows 4-7", [](const pl::Ref& b) { return b.bitcast(pl::bf16).at(pl::ds(4, 4))[pl::all].astype(pl::f32); }, false},
      {"narrower, row 3", [](const pl::Ref& b) { return b.bitcast(pl::bf16).at(3)[pl::all].astype(pl::f32); }, true},
      {"narrower, row 3's second halves",
       [](const pl::Ref& b) { return b.bitcast(pl::bf16).at(3, pl::all, 1)[pl::all].astype(pl::f32); }, true},
      // Bytes of row 3's first two f32s as (2, 3): each row of 3 bytes inside one f32 or not —
      // together they reach into the second (bytes 0-5), so the access is both (a review's case).
      {"narrower, bytes 0-5 of row 3 as (2, 3)",
       [](const pl::Ref& b) {
         return b.at(3).bitcast(pl::u8).reshape({512}).at(pl::ds(0, 6)).reshape({2, 3})[pl::all].astype(pl::f32);
       },
       true},
      {"narrower, bytes 0-5 of row 4 as (2, 3)",
       [](const pl::Ref& b) {
         return b.at(4).bitcast(pl::u8).reshape({512}).at(pl::ds(0, 6)).reshape({2, 3})[pl::all].astype(pl::f32);
       },
       false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::shared_ptr<std::vector<pltpu::RaceReport>> races;
    pl::CallOptions opts;
    opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
    opts.scratch_shapes = {pltpu::VMEM({8, 128}, pl::f32), pltpu::semaphores(pltpu::SemaphoreType::DMA)};
    opts.interpret = tpu_test::race_params(races);
    View read = c.read;
    auto kernel = [read](pl::Ref x_hbm, pl::Ref o, pl::Ref buf, pl::Ref sem) {
      buf[pl::all] = pl::zeros({8, 128}, pl::f32);
      auto copy = pltpu::async_copy(x_hbm.at(pl::ds(0, 4)), buf.at(pl::ds(0, 4)), sem);
      o[pl::all] = pl::sum(read(buf)) + pl::zeros({8, 128}, pl::f32);
      copy.wait();
    };
    pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts)(tpu_test::iota_f32({8, 128}));
    EXPECT_EQ(races->size(), c.races ? 1u : 0u) << tpu_test::all_reports(*races);
  }
}

// A wider bitcast (bf16 pairs as one f32) counts as both bf16s it covers.
TEST(RefTransformsRaces, AWiderBitcastCoversTheElementsOfItsBytes) {
  for (bool racy : {false, true}) {
    std::shared_ptr<std::vector<pltpu::RaceReport>> races;
    pl::CallOptions opts;
    opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
    opts.scratch_shapes = {pltpu::VMEM({8, 64, 2}, pl::bf16), pltpu::semaphores(pltpu::SemaphoreType::DMA)};
    opts.interpret = tpu_test::race_params(races);
    auto kernel = [racy](pl::Ref x_hbm, pl::Ref o, pl::Ref buf, pl::Ref sem) {
      buf[pl::all] = pl::zeros({8, 64, 2}, pl::bf16);
      // The DMA writes the second bf16 of each pair of rows 0-3 (or of row 4 onwards: none).
      auto copy = pltpu::async_copy(x_hbm.at(pl::ds(0, 4), pl::all, pl::ds(1, 1)),
                                    buf.at(pl::ds(racy ? 0 : 4, 4), pl::all, pl::ds(1, 1)), sem);
      o[pl::all] = pl::sum(buf.bitcast(pl::f32).at(pl::ds(0, 4))[pl::all]) + pl::zeros({8, 128}, pl::f32);
      copy.wait();
    };
    pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts)(random_f32({8, 64, 2}, 14).astype(pl::bf16));
    EXPECT_EQ(races->size(), racy ? 1u : 0u) << tpu_test::all_reports(*races);
  }
}

// In a gpu::kernel (the interpreter's race check): reading the copy's destination through a
// bitcast before the copy's barrier is waited on races with the copy; after, it does not.
TEST(RefTransformsRaces, AGpuKernelReadingThroughABitcastBeforeTheCopyLandsRaces) {
  for (bool wait_first : {true, false}) {
    SCOPED_TRACE(wait_first ? "wait first" : "read first");
    pl::PallasCall call = plgpu::kernel(
        [wait_first](pl::Ref x, pl::Ref out, pl::Ref x_s, pl::Ref bar) {
          plgpu::copy_gmem_to_smem(x, x_s, bar);
          if (wait_first) plgpu::barrier_wait(bar);
          out[pl::all] = x_s.at(pl::ds(8, 8)).bitcast(pl::u32)[pl::all];
          if (!wait_first) plgpu::barrier_wait(bar);
        },
        {pl::ShapeDtype({8}, pl::u32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"b"}},
        test_util::run_on("interpret", {plgpu::SMEM({64, 2}, pl::bf16), plgpu::Barrier{}}));
    const pl::Array x = random_f32({64, 2}, 16).astype(pl::bf16);
    if (wait_first) {
      const pl::Array out = call(x).at(0);
      EXPECT_EQ(std::memcmp(out.raw_data(), static_cast<const std::byte*>(x.raw_data()) + 32, 32), 0);
    } else {
      EXPECT_CONTAINS(test_util::error_of([&] { call(x); }), "gpu::kernel data race");
    }
  }
}

// ---- Trace-time errors --------------------------------------------------------------------------
TEST(RefTransformErrors, BadPermutationsAndShapesNameTheLine) {
  auto error_of = [](const std::function<void(pl::Ref)>& body) {
    return test_util::error_of([&] {
      pl::pallas_call([&](pl::Ref x, pl::Ref) { body(x); }, pl::ShapeDtype({1}, pl::f32), {.interpret = true})(
          random_f32({2, 3, 4}, 9));
    });
  };
  int line = __LINE__ + 1;
  std::string e = error_of([](pl::Ref x) { x.T(); });
  EXPECT_CONTAINS(e, "T: the matrix transpose of a Ref of rank 2");
  EXPECT_CONTAINS(e, "ref_transforms_test.cpp:" + std::to_string(line));
  line = __LINE__ + 1;
  e = error_of([](pl::Ref x) { x.transpose({0, 1}); });
  EXPECT_CONTAINS(e, "permutation [0, 1] does not match the rank of ref<f32[2,3,4]");
  EXPECT_CONTAINS(e, "ref_transforms_test.cpp:" + std::to_string(line));
  EXPECT_CONTAINS(error_of([](pl::Ref x) { x.transpose({0, 1, 1}); }), "permutation repeats axis 1");
  line = __LINE__ + 1;
  e = error_of([](pl::Ref x) { x.reshape({5, 5}); });
  EXPECT_CONTAINS(e, "cannot reshape ref<f32[2,3,4]");
  EXPECT_CONTAINS(e, "to [5, 5] (25 elements)");
  EXPECT_CONTAINS(e, "ref_transforms_test.cpp:" + std::to_string(line));
  EXPECT_CONTAINS(error_of([](pl::Ref x) { x.reshape({-1, -1}); }), "reshape: at most one dimension may be -1, got [-1, -1]");
  EXPECT_CONTAINS(error_of([](pl::Ref x) { x.reshape({5, -1}); }), "reshape: [5, -1] does not divide the 24 elements");
  line = __LINE__ + 1;
  e = error_of([](pl::Ref x) { x.bitcast(pl::u64); });
  EXPECT_CONTAINS(e, "bitcast from f32 to u64 needs a last dimension of 2, got ref<f32[2,3,4]");
  EXPECT_CONTAINS(e, "ref_transforms_test.cpp:" + std::to_string(line));
  EXPECT_CONTAINS(error_of([](pl::Ref x) { x.bitcast(pl::bool_); }), "bitcast needs numeric dtypes, got f32 -> bool");
}

// A bitcast has no derivative: jvp refuses it on a Ref that carries a tangent (the kernel runs
// when the data is integer).
TEST(RefTransformErrors, JvpRefusesABitcastOfAFloatRef) {
  auto call = pl::pallas_call([](pl::Ref x, pl::Ref o) { o[pl::all] = x.bitcast(pl::i32)[pl::all]; },
                              pl::ShapeDtype({4, 8}, pl::i32), {.interpret = true});
  const pl::Array x = random_f32({4, 8}, 15);
  const std::string e = test_util::error_of<pl::NotSupportedError>([&] { pl::jvp(call, {x}, {x}); });
  EXPECT_CONTAINS(e, "`ref_bitcast` has no derivative rule");
}

}  // namespace
