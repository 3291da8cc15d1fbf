// Benchmarks of the pallas_bench executable. Each writes a Markdown table to `report`.
#pragma once

#include <algorithm>
#include <chrono>
#include <ostream>
#include <vector>

#include "pallas/pallas_call.h"

void bench_elementwise(std::ostream& report);
void bench_dot(std::ostream& report);
void bench_interpreter(std::ostream& report);
void bench_pallas_call(std::ostream& report);
void bench_tpu_interpret(std::ostream& report);
void bench_gpu(std::ostream& report);
// The GPU launch overhead table alone (gpu_validate.sh runs it with and without the memory pool).
void bench_gpu_launch(std::ostream& report);
void bench_sparse_core(std::ostream& report);

namespace bench {
// An n x n x n f32 matmul over b x b blocks with a VMEM accumulator, run in `mode`.
pallas::PallasCall blocked_matmul(int64_t n, int64_t b, pallas::InterpretMode mode);

// Median wall time in seconds of `repeats` runs of fn (after one warm-up run).
template <class F> double median_seconds(int repeats, F&& fn) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    auto start = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
}  // namespace bench
