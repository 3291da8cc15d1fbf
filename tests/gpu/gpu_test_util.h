// Shared by the GPU test suites: a test parametrized by where a kernel runs ("interpret",
// "gpu_emulate", "mosaic_gpu"); the "mosaic_gpu" cases skip, saying why, without a GPU (they run
// on one through scripts/gpu_validate.sh).
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
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

// N(0, 1) f32 values from a std::mt19937 seeded with `seed` (test inputs independent of the
// library's own generator).
inline pallas::Array random_f32(pallas::Shape s, uint32_t seed) {
  pallas::Array a = pallas::Array::zeros(std::move(s), pallas::DType::F32);
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  for (int64_t i = 0; i < a.size(); ++i) a.data<float>()[i] = d(rng);
  return a;
}

// The parameter as the case's name ("gpu_emulate").
inline std::string backend_name(const testing::TestParamInfo<std::string>& i) { return i.param; }

// cuobjdump, to read the machine code of generated units: the CUDA toolkit's, or the one
// scripts/get_cuda_tools.sh fetches into .tools/ (as scripts/build.sh does); "" if none.
inline std::string find_cuobjdump() {
  std::vector<std::string> places;
  if (const char* env = std::getenv("PALLAS_CUOBJDUMP")) places.emplace_back(env);
  places.emplace_back(std::string(PALLAS_SOURCE_DIR) + "/.tools/cuobjdump");
  places.emplace_back("/usr/local/cuda/bin/cuobjdump");
  for (const std::string& p : places)
    if (!p.empty() && std::filesystem::exists(p)) return p;
  return std::system("command -v cuobjdump >/dev/null 2>&1") == 0 ? "cuobjdump" : "";
}

// The SASS of a generated unit compiled with NVRTC for `arch` ("" when there is no cuobjdump).
inline std::string sass_of(const std::string& source, const char* arch) {
  const std::string cuobjdump = find_cuobjdump();
  if (cuobjdump.empty()) return "";
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("pallas_sass_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  pallas::gpu::CompiledKernel c = pallas::gpu::Nvrtc::get().compile(source, "sass.cu", arch);
  const std::filesystem::path cubin = dir / (std::string(arch) + ".cubin"), text = dir / (std::string(arch) + ".sass");
  std::ofstream(cubin, std::ios::binary).write(c.image.data(), static_cast<std::streamsize>(c.image.size()));
  const std::string cmd = "'" + cuobjdump + "' -sass '" + cubin.string() + "' > '" + text.string() + "' 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(text);
  std::string out(std::istreambuf_iterator<char>(in), {});
  std::filesystem::remove_all(dir);
  return out;
}

}  // namespace test_util
