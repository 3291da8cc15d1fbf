// The CUDA libraries, loaded at run time: NVRTC compiles for sm_90a / sm_80 / PTX where the
// toolkit is installed (every CI machine of this project has it); the driver is reported as
// missing, clearly, where there is no GPU.
#include <gtest/gtest.h>

#include "gpu/cuda_libs.h"
#include "tests/test_util.h"
#include "pallas/pallas.h"

namespace pl = pallas;
namespace gpu = pallas::gpu;

namespace {

const char* kSaxpy = R"(
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
)";

#define SKIP_WITHOUT_NVRTC()                                                           \
  if (std::string why = gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why

TEST(CudaLibs, NvrtcCompilesCubinsForHopperAndAmpere) {
  SKIP_WITHOUT_NVRTC();
  const gpu::Nvrtc& nvrtc = gpu::Nvrtc::get();
  EXPECT_GE(nvrtc.version().first, 12);
  for (const char* arch : {"sm_90a", "sm_80"}) {
    gpu::CompiledKernel k = nvrtc.compile(kSaxpy, "saxpy", arch);
    ASSERT_TRUE(k.is_cubin);
    ASSERT_GT(k.image.size(), 4u) << arch;
    EXPECT_EQ(std::string(k.image.data(), 4), "\x7f" "ELF") << arch;
  }
}

TEST(CudaLibs, NvrtcEmitsPtxForComputeTargets) {
  SKIP_WITHOUT_NVRTC();
  gpu::CompiledKernel k = gpu::Nvrtc::get().compile(kSaxpy, "saxpy", "compute_90a");
  ASSERT_FALSE(k.is_cubin);
  std::string ptx(k.image.begin(), k.image.end());
  EXPECT_NE(ptx.find(".target sm_90a"), std::string::npos) << ptx.substr(0, 400);
  EXPECT_NE(ptx.find(".entry saxpy"), std::string::npos);
}

TEST(CudaLibs, CompileErrorsCarryTheLog) {
  SKIP_WITHOUT_NVRTC();
  std::string m = test_util::error_of(
      [] { gpu::Nvrtc::get().compile("__global__ void k() { undefined_thing(); }", "broken", "sm_80"); });
  EXPECT_CONTAINS(m, "NVRTC failed to compile broken for sm_80");
  EXPECT_CONTAINS(m, "undefined_thing");
}

TEST(CudaLibs, UnknownArchListsTheKnownOnes) {
  SKIP_WITHOUT_NVRTC();
  std::string m = test_util::error_of([] { gpu::Nvrtc::get().compile(kSaxpy, "saxpy", "sm_10"); });
  EXPECT_CONTAINS(m, "cannot compile for 'sm_10'");
  EXPECT_CONTAINS(m, "90");
}

TEST(CudaLibs, GpuBackendRunsOrSaysWhatIsMissing) {
  auto call = pl::pallas_call([](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all] * 2.0f; },
                              pl::ShapeDtype({8, 128}, pl::f32), {.backend = "mosaic_gpu"});
  pl::Array x = pl::Array::random_normal({8, 128}, pl::f32, 3);
  std::string driver = gpu::driver_unavailable_reason();
  if (driver.empty()) {  // a GPU: the kernel runs
    pl::Array o = call(x)[0];
    for (int64_t i = 0; i < x.size(); ++i) EXPECT_EQ(o.data<float>()[i], 2.0f * x.data<float>()[i]);
    return;
  }
  EXPECT_CONTAINS(test_util::error_of([&] { call(x); }), "the GPU backend needs an NVIDIA GPU: " + driver);
}

TEST(CudaLibs, DriverReasonIsEmptyOnlyWithADevice) {
  std::string why = gpu::driver_unavailable_reason();
  // On a machine without a GPU (CI), the reason names the driver library; with one, it is "".
  if (!why.empty()) {
    EXPECT_NE(why.find("libcuda.so.1"), std::string::npos) << why;
  }
  EXPECT_EQ(why, gpu::driver_unavailable_reason());  // stable (computed once)
}

}  // namespace
