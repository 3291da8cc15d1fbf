// Shared by the GPU test suites: a test parametrized by where a kernel runs ("interpret",
// "gpu_emulate", "mosaic_gpu"); the "mosaic_gpu" cases skip, saying why, without a GPU (they run
// on one through scripts/gpu_validate.sh).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu/cuda_libs.h"
#include "pallas/pallas_call.h"

namespace test_util {

class OnGpuBackends : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() != "mosaic_gpu") return;
    if (std::string why = pallas::gpu::driver_unavailable_reason(); !why.empty()) GTEST_SKIP() << "no GPU: " << why;
  }
};

// Options that run a kernel where the parameter says: "interpret" (the interpreter),
// "gpu_emulate" (the generated CUDA compiled as C++ and run on the CPU) or "mosaic_gpu".
inline pallas::CallOptions run_on(const std::string& how, std::vector<pallas::ScratchShape> scratch) {
  pallas::CallOptions o;
  o.scratch_shapes = std::move(scratch);
  if (how == "interpret")
    o.interpret = true;
  else
    o.backend = how;
  return o;
}

// The parameter as the case's name ("gpu_emulate").
inline std::string backend_name(const testing::TestParamInfo<std::string>& i) { return i.param; }

}  // namespace test_util
