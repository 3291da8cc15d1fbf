// The `pallas` CLI's subcommands. Each returns the process exit code (0 ok, 1 failed, 3 races
// detected, 4 deadlock); a pallas::examples::UsageError escaping one means a bad option value
// (exit 2), any other error a runtime failure (exit 1) — pallas_main.cpp maps them.
#pragma once

#include <cstdint>
#include <string>

namespace pallas::cli {

// The options of the example subcommands (run, ir, bench); each uses the ones it declares.
struct ExampleArgs {
  std::string name;
  uint64_t seed = 0;
  int64_t size = 0;  // 0: the example's default
  std::string dtype = "f32";
  std::string backend = "reference";
  int iters = 5;
  // The TPU interpret mode's knobs (--backend tpu-interpret only).
  int devices = 0;
  int cores = 0;
  std::string dma_mode;
  bool detect_races = false;
  // The GPU backends' on-device profiler (`pallas run --profile DIR`).
  std::string profile_dir;
  int profile_space = 256;
  bool approx_math = false;  // `--approx-math`: gpu::CompilerParams::approx_math
  int cluster = 0;     // CTAs per cluster (`--cluster`; 0: the example's default)
  int cluster_rows = 0;  // CTAs per cluster along a second axis (`--cluster-rows`)
  int persistent = 0;  // CTAs of a persistent grid (`--persistent`; 0: none)
  int tile_n = 0;      // the output tile's columns (`--tile-n`; 0: the example's default)
  int stages = 0;      // K-steps in flight (`--stages`; 0: the example's default)
  // `pallas cuda`: the target arch, and whether to compile the unit with NVRTC as a check.
  std::string arch = "sm_90a";
  bool compile = false;
  std::string image_path;  // --image: where --compile writes the cubin / PTX
};

// Exit codes beyond 0 (ok), 1 (failed) and 2 (usage error).
inline constexpr int kExitRaces = 3;
inline constexpr int kExitDeadlock = 4;

int demo(uint64_t seed);
int list();
int run(const ExampleArgs& args);
int ir(const ExampleArgs& args);
int bench(const ExampleArgs& args);
// Prints the example's generated CUDA translation unit (--compile: also compiles it with NVRTC).
int cuda(const ExampleArgs& args);

}  // namespace pallas::cli
