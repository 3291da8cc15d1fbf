// Shared by the GPU test suites: a test parametrized by where a kernel runs ("interpret",
// "gpu_emulate", "mosaic_gpu"); the "mosaic_gpu" cases skip, saying why, without a GPU (they run
// on one through scripts/gpu_validate.sh).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "gpu/cuda_libs.h"

namespace test_util {

class OnGpuBackends : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() != "mosaic_gpu") return;
    if (std::string why = pallas::gpu::driver_unavailable_reason(); !why.empty()) GTEST_SKIP() << "no GPU: " << why;
  }
};

// The parameter as the case's name ("gpu_emulate").
inline std::string backend_name(const testing::TestParamInfo<std::string>& i) { return i.param; }

}  // namespace test_util
