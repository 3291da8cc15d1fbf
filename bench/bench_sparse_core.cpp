// SparseCore in the TPU interpret mode: the embedding_bag example (1M ids gathered from a
// 100k x 128 f32 table on 2 x 16 simulated vector subcores, summed in bags of 8) next to a
// plain C++ loop doing the same gathers and sums, in the same run; then the same kernel with
// race detection on a smaller problem.
#include <iomanip>
#include <string>

#include "bench/bench.h"
#include "examples/examples.h"
#include "pallas/pallas.h"

namespace ex = pallas::examples;

namespace {

// out[b] = sum of the 8 table rows of bag b: the computation the kernel does, in plain C++.
void plain_embedding_bag(const pallas::Array& table, const pallas::Array& ids, std::vector<float>& out) {
  const int64_t dim = table.dim(1);
  const int64_t bags = ids.size() / 8;
  out.assign(static_cast<size_t>(bags * dim), 0.0f);
  const float* t = table.data<float>();
  const int32_t* id = ids.data<int32_t>();
  for (int64_t b = 0; b < bags; ++b) {
    float* o = out.data() + b * dim;
    for (int64_t l = 0; l < 8; ++l) {
      const float* row = t + static_cast<int64_t>(id[b * 8 + l]) * dim;
      for (int64_t c = 0; c < dim; ++c) o[c] += row[c];
    }
  }
}

}  // namespace

void bench_sparse_core(std::ostream& report) {
  const int64_t bags = 131072;  // 1,048,576 ids
  ex::Problem p = ex::find("embedding_bag").build({.seed = 1, .size = bags, .backend = "tpu-interpret"});
  const double ids = static_cast<double>(p.inputs[1].size());
  std::vector<float> plain_out;
  // Interleaved rounds, so a slow phase of the machine hits both alike.
  std::vector<double> t_sim, t_plain;
  for (int round = 0; round < 3; ++round) {
    t_sim.push_back(bench::median_seconds(1, [&] { p.call(p.inputs); }));
    t_plain.push_back(bench::median_seconds(3, [&] { plain_embedding_bag(p.inputs[0], p.inputs[1], plain_out); }));
  }
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double sim = med(t_sim), plain = med(t_plain);
  // With race detection, on 1/16 of the bags (the detector records every row access).
  ex::Problem small = ex::find("embedding_bag").build(
      {.seed = 1, .size = bags / 16, .backend = "tpu-interpret", .detect_races = true});
  const double small_ids = static_cast<double>(small.inputs[1].size());
  const double racy = bench::median_seconds(1, [&] { small.call(small.inputs); });
  report << std::fixed << std::setprecision(3);
  report << "| embedding bag, " << p.signature << " | time (s) | rows/s (M) | vs plain C++ |\n"
         << "|---|---:|---:|---:|\n"
         << "| plain C++ loop (1 thread) | " << plain << " | " << ids / plain / 1e6 << " | 1.000 |\n"
         << "| TPU interpret mode, no race detection | " << sim << " | " << ids / sim / 1e6 << " | "
         << plain / sim << " |\n"
         << "| TPU interpret mode, race detection (" << static_cast<int64_t>(small_ids) << " ids) | "
         << racy << " | " << small_ids / racy / 1e6 << " | " << (small_ids / racy) / (ids / plain)
         << " |\n";
}
