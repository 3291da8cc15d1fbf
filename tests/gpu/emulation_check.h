// Runs a pallas_call's generated CUDA under host emulation and compares every output with the
// reference interpreter's (the oracle, independent code). Shared by the op-family tests and the
// random-kernel tests.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/call.h"
#include "gpu/codegen.h"
#include "gpu/host_emulation.h"
#include "pallas/pallas.h"

namespace test_util {

inline std::vector<pallas::Array> clone_all(const std::vector<pallas::Array>& a) {
  std::vector<pallas::Array> out;
  for (const pallas::Array& x : a) out.push_back(x.clone());
  return out;
}

// One thread per CTA checks the rules; three (an uneven split of every loop) check the barriers.
// A kernel with register tiles runs with the CTA's threads (their layout's), and also generated
// without them with the thread counts given. `context` goes into every failure message. Returns
// the generated kernel's count of register tiles.
inline int expect_same(const pallas::PallasCall& call, const std::vector<pallas::Array>& args, double rtol = 0,
                        double atol = 0, const pallas::gpu::CodegenOptions& opts = {},
                        const std::vector<int>& thread_counts = {1, 3}, const std::string& context = "") {
  using namespace pallas;
  std::vector<ShapeDtype> sig;
  for (const Array& a : args) sig.push_back(a.shape_dtype());
  std::shared_ptr<const TracedCall> tc = call.trace(sig);
  const std::vector<int64_t> grid = tc->grid_mapping.grid;
  std::vector<Array> want = interpret::run_reference(*tc, clone_all(args), grid, nullptr);
  auto check = [&](const gpu::GeneratedKernel& k, int threads) {
    std::vector<Array> got = gpu::run_host_emulation(*tc, k, clone_all(args), grid, threads);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      AllCloseResult r = allclose(got[i], want[i], rtol, atol);
      EXPECT_TRUE(r.ok) << context << threads << " threads, " << k.register_tiles << " register tiles, output " << i
                        << ": " << r.message << "\n"
                        << k.source.substr(k.source.find("PL_DEV bool pl_grid_point"));
    }
  };
  const gpu::GeneratedKernel k = gpu::generate_cuda(*tc, grid, opts);
  if (k.register_tiles == 0) {
    for (int threads : thread_counts) check(k, threads);
    return 0;
  }
  check(k, k.threads_per_cta);
  gpu::CodegenOptions in_the_arena = opts;
  in_the_arena.register_tiles = false;
  const gpu::GeneratedKernel a = gpu::generate_cuda(*tc, grid, in_the_arena);
  for (int threads : thread_counts) check(a, threads);
  return k.register_tiles;
}

}  // namespace test_util
