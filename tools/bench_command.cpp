// `pallas bench`: time an example's call (median of K runs after a checked warm-up).
#include <algorithm>
#include <chrono>
#include <iostream>
#include <vector>

#include "examples/examples.h"
#include "tools/commands.h"
#include "tools/report.h"

namespace pallas::cli {

namespace ex = ::pallas::examples;

namespace {

double seconds_of(const ex::Problem& p) {
  const auto start = std::chrono::steady_clock::now();
  ex::execute(p);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string throughput(const ex::Problem& p, double secs) {
  if (p.throughput == ex::Throughput::Flops)
    return short_number(static_cast<double>(p.flops) / secs / 1e9) + " GFLOP/s";
  return short_number(static_cast<double>(p.bytes) / secs / 1e9) + " GB/s";
}

}  // namespace

int bench(const ExampleArgs& args) {
  const ex::Problem p = ex::find(args.name).build(options_to_run(args));
  // The warm-up (which also traces) is checked: a fast wrong kernel is not worth timing.
  const ex::Outcome warm = ex::run(p);  // (an unchecked problem, `racy`, is timed as it is)
  if (warm.checked && !warm.ok) {
    std::cout << headline(p) << ": FAILED (not timed)\n" << warm.message << "\n";
    return 1;
  }
  std::vector<double> times;
  for (int i = 0; i < args.iters; ++i) times.push_back(seconds_of(p));
  const double t = median(times);
  std::cout << headline(p) << ": median " << short_number(t * 1e3) << " ms over " << args.iters
            << " iters, " << throughput(p, t) << "\n";
  return 0;
}

}  // namespace pallas::cli
