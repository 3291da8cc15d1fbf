// pallas_bench: runs the benchmarks named on the command line (default: all) and prints their
// Markdown tables (the figures in docs/PERFORMANCE.md come from here).
#include <cstring>
#include <iostream>
#include <map>
#include <string>

#include "bench/bench.h"

int main(int argc, char** argv) {
  const std::map<std::string, void (*)(std::ostream&)> benches = {
      {"elementwise", bench_elementwise}, {"dot", bench_dot}, {"interpreter", bench_interpreter}, {"pallas_call", bench_pallas_call},
      {"tpu_interpret", bench_tpu_interpret}, {"gpu", bench_gpu}, {"gpu_launch", bench_gpu_launch}, {"sparse_core", bench_sparse_core}};
  std::vector<std::string> names;
  for (int i = 1; i < argc; ++i) names.push_back(argv[i]);
  if (names.empty())
    for (const auto& [name, fn] : benches) names.push_back(name);
  for (const std::string& n : names) {
    auto it = benches.find(n);
    if (it == benches.end()) {
      std::cerr << "unknown benchmark '" << n << "'; known:";
      for (const auto& [name, fn] : benches) std::cerr << " " << name;
      std::cerr << "\n";
      return 2;
    }
    std::cout << "## " << n << "\n\n";
    it->second(std::cout);
    std::cout << "\n";
  }
  return 0;
}
