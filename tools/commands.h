// The `pallas` CLI's subcommands. Each returns the process exit code (0 ok, 1 failed); a
// pallas::examples::UsageError escaping one means a bad option value (exit 2), any other error
// a runtime failure (exit 1) — pallas_main.cpp maps them.
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
};

int demo(uint64_t seed);
int list();
int run(const ExampleArgs& args);
int ir(const ExampleArgs& args);
int bench(const ExampleArgs& args);

}  // namespace pallas::cli
