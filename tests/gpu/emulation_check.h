// Runs a pallas_call's generated CUDA under host emulation and compares every output with the
// reference interpreter's (the oracle, independent code). Shared by the op-family tests and the
// random-kernel tests. Where the process has a GPU (the driver loads and finds one), each unit also
// runs compiled on it and is compared the same way: host emulation cannot show what only warp
// scheduling, the memory model or the hardware's instructions do. PALLAS_TEST_NO_GPU=1 leaves the
// GPU out.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/call.h"
#include "gpu/backend.h"
#include "gpu/codegen.h"
#include "gpu/cuda_libs.h"
#include "gpu/host_emulation.h"
#include "pallas/pallas.h"

namespace test_util {

inline std::vector<pallas::Array> clone_all(const std::vector<pallas::Array>& a) {
  std::vector<pallas::Array> out;
  for (const pallas::Array& x : a) out.push_back(x.clone());
  return out;
}

// Whether expect_same also runs each unit on this process's GPU.
inline bool checks_on_gpu() {
  static const bool on_gpu = [] {
    const char* off = std::getenv("PALLAS_TEST_NO_GPU");
    return !(off && std::string(off) == "1") && pallas::gpu::driver_unavailable_reason().empty();
  }();
  return on_gpu;
}

// The archs expect_same also compiles each unit for with NVRTC, compile only: host emulation
// builds the runtime's host side, not the device side of its `#if` branches, nor does it run
// ptxas. PALLAS_TEST_NVRTC: 1 for sm_90a and sm_80, 0 for none, or a comma-separated list of
// archs; unset, what the innermost NvrtcChecks in scope says (none outside one: NVRTC takes
// 0.1-0.4 s a unit). Nothing where NVRTC is not there.
inline std::vector<std::string>*& nvrtc_checks_in_scope() {
  static std::vector<std::string>* archs = nullptr;
  return archs;
}
struct NvrtcChecks {
  explicit NvrtcChecks(std::vector<std::string> archs) : archs_(std::move(archs)), outer_(nvrtc_checks_in_scope()) {
    nvrtc_checks_in_scope() = &archs_;
  }
  ~NvrtcChecks() { nvrtc_checks_in_scope() = outer_; }
  NvrtcChecks(const NvrtcChecks&) = delete;
  NvrtcChecks& operator=(const NvrtcChecks&) = delete;

 private:
  std::vector<std::string> archs_;
  std::vector<std::string>* outer_;
};
inline std::vector<std::string> nvrtc_check_archs() {
  static const bool nvrtc_there = pallas::gpu::Nvrtc::unavailable_reason().empty();
  if (!nvrtc_there) return {};
  const char* v = std::getenv("PALLAS_TEST_NVRTC");
  if (!v || std::string(v).empty()) return nvrtc_checks_in_scope() ? *nvrtc_checks_in_scope() : std::vector<std::string>{};
  const std::string list = v;
  if (list == "0") return {};
  if (list == "1") return {"sm_90a", "sm_80"};
  std::vector<std::string> out;
  for (size_t at = 0; at <= list.size();) {
    size_t comma = list.find(',', at);
    if (comma == std::string::npos) comma = list.size();
    if (comma > at) out.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

// One thread per CTA checks the rules; three (an uneven split of every loop) check the barriers.
// A kernel with register tiles runs with the CTA's threads (their layout's), and also generated
// without them with the thread counts given. `context` goes into every failure message. Returns
// the kernel generated with `opts` (its counts of register tiles, carries, products...).
inline pallas::gpu::GeneratedKernel expect_same(const pallas::PallasCall& call, const std::vector<pallas::Array>& args, double rtol = 0,
                        double atol = 0, const pallas::gpu::CodegenOptions& opts = {},
                        const std::vector<int>& thread_counts = {1, 3}, const std::string& context = "") {
  using namespace pallas;
  std::vector<ShapeDtype> sig;
  for (const Array& a : args) sig.push_back(a.shape_dtype());
  std::shared_ptr<const TracedCall> tc = call.trace(sig);
  const std::vector<int64_t> grid = tc->grid_mapping.grid;
  std::vector<Array> want = interpret::run_reference(*tc, clone_all(args), grid, nullptr);
  auto compare = [&](const std::vector<Array>& got, const gpu::GeneratedKernel& k, const std::string& where) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      AllCloseResult r = allclose(got[i], want[i], rtol, atol);
      EXPECT_TRUE(r.ok) << context << where << ", " << k.register_tiles << " register tiles, output " << i << ": "
                        << r.message << "\n"
                        << k.source.substr(k.source.find("PL_DEV bool pl_grid_point"));
    }
  };
  auto check = [&](const gpu::GeneratedKernel& k, int threads) {
    compare(gpu::run_host_emulation(*tc, k, clone_all(args), grid, threads), k,
            std::to_string(threads) + " threads");
  };
  auto check_on_gpu = [&](const gpu::GeneratedKernel& k) {
    for (const std::string& arch : nvrtc_check_archs()) {
      try {
        EXPECT_TRUE(gpu::Nvrtc::get().compile(k.source, k.entry, arch).is_cubin) << context << arch;
      } catch (const Error& e) {
        ADD_FAILURE() << context << "NVRTC " << arch << ", " << k.register_tiles << " register tiles: " << e.what();
      }
    }
    if (!checks_on_gpu()) return;
    std::vector<Array> got;
    try {
      got = gpu::run_generated_on_gpu(*tc, k, clone_all(args), grid);
    } catch (const Error& e) {  // (with the context: a fuzz case's seed and steps)
      ADD_FAILURE() << context << "on the GPU, " << k.register_tiles << " register tiles: " << e.what();
      return;
    }
    compare(got, k, "on the GPU");
  };
  const gpu::GeneratedKernel k = gpu::generate_cuda(*tc, grid, opts);
  check_on_gpu(k);
  if (k.register_tiles == 0) {
    for (int threads : thread_counts) check(k, threads);
    return k;
  }
  check(k, k.threads_per_cta);
  gpu::CodegenOptions in_the_arena = opts;
  in_the_arena.register_tiles = false;
  const gpu::GeneratedKernel a = gpu::generate_cuda(*tc, grid, in_the_arena);
  check_on_gpu(a);
  for (int threads : thread_counts) check(a, threads);
  return k;
}

}  // namespace test_util
