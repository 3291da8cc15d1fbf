// dot_general (the evaluation rule every interpreter uses) next to a direct cblas_sgemm call on
// the same data, in the same run. Rounds interleave the variants (one timing of each per round)
// so drift in clock speed or load hits all of them alike; each figure is the median over rounds.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <iomanip>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "eval/eval.h"
#include "pallas/array.h"

namespace pl = pallas;

namespace {

struct Variant {
  std::string name;
  std::function<void()> run;
  int baseline;  // index of the variant this one is compared with (itself for a baseline)
  std::vector<double> times;
};

pl::ir::Attrs dot_attrs(pl::ir::Ints lc, pl::ir::Ints rc, pl::DType out) {
  using pl::ir::AttrKey;
  return pl::ir::Attrs()
      .set(AttrKey::LhsContracting, std::move(lc))
      .set(AttrKey::RhsContracting, std::move(rc))
      .set(AttrKey::LhsBatch, pl::ir::Ints{})
      .set(AttrKey::RhsBatch, pl::ir::Ints{})
      .set(AttrKey::DTypeAttr, out);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

void bench_dot(std::ostream& report) {
  const int n = 512;
  const double flops = 2.0 * n * n * n;
  pl::Array a = pl::Array::random_normal({n, n}, pl::f32, 1);
  pl::Array b = pl::Array::random_normal({n, n}, pl::f32, 2);
  pl::Array c({n, n}, pl::f32);
  pl::Array a16 = a.astype(pl::bf16), b16 = b.astype(pl::bf16);
  // The bf16 operands widened to f32: what the direct call multiplies for the bf16 comparison.
  pl::Array a16w = a16.astype(pl::f32), b16w = b16.astype(pl::f32);
  const pl::ir::Attrs nn = dot_attrs({1}, {0}, pl::f32);
  const pl::ir::Attrs tn = dot_attrs({0}, {0}, pl::f32);  // lhs stored [K, M]
  const pl::ir::Attrs nn_bf16_out = dot_attrs({1}, {0}, pl::bf16);

  auto sgemm = [&](const pl::Array& x, const pl::Array& y, CBLAS_TRANSPOSE ta) {
    return [&x, &y, &c, ta, n] {
      cblas_sgemm(CblasRowMajor, ta, CblasNoTrans, n, n, n, 1.0f, x.data<float>(), n,
                  y.data<float>(), n, 0.0f, c.data<float>(), n);
    };
  };
  pl::Array sink;  // keeps results alive until the next run, as a caller would
  std::vector<Variant> vs;
  vs.push_back({"cblas_sgemm f32 [M,K]x[K,N] (direct)", sgemm(a, b, CblasNoTrans), 0, {}});
  vs.push_back({"dot_general f32 [M,K]x[K,N] -> f32", [&] { sink = pl::eval::dot_general(a, b, nn); }, 0, {}});
  // The direct call again, but writing into a freshly allocated Array as dot_general must:
  // separates the cost of a new 1 MB result (zero fill, page faults) from dot_general's own.
  vs.push_back({"cblas_sgemm f32 into a new Array (direct + result allocation)", [&] {
                  sink = pl::Array({n, n}, pl::f32);
                  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f,
                              a.data<float>(), n, b.data<float>(), n, 0.0f, sink.data<float>(), n);
                }, 0, {}});
  vs.push_back({"cblas_sgemm f32 [K,M]^T x[K,N] (direct)", sgemm(a, b, CblasTrans), 3, {}});
  vs.push_back({"dot_general f32 [K,M]x[K,N], lhs contracting dim 0", [&] { sink = pl::eval::dot_general(a, b, tn); }, 3, {}});
  vs.push_back({"cblas_sgemm on bf16 data widened beforehand (direct)", sgemm(a16w, b16w, CblasNoTrans), 5, {}});
  vs.push_back({"dot_general bf16 x bf16 -> f32", [&] { sink = pl::eval::dot_general(a16, b16, nn); }, 5, {}});
  vs.push_back({"dot_general bf16 x bf16 -> bf16", [&] { sink = pl::eval::dot_general(a16, b16, nn_bf16_out); }, 5, {}});

  const int rounds = 101;
  for (Variant& v : vs) v.run();  // warm-up: threads started, pages touched
  for (int r = 0; r < rounds; ++r)
    for (Variant& v : vs) {
      auto t0 = std::chrono::steady_clock::now();
      v.run();
      v.times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }

  report << "512x512x512, OpenBLAS threads: " << openblas_get_num_threads()
         << " (OPENBLAS_NUM_THREADS or its default; the same for every row); median and minimum of " << rounds
         << " interleaved rounds\n\n";
  // The minimum is shown too: on a shared machine it is the figure least disturbed by others.
  report << "| measurement | median | GFLOP/s | vs direct sgemm | min | vs direct (min) |\n"
         << "|---|---|---|---|---|---|\n" << std::fixed;
  for (const Variant& v : vs) {
    const Variant& b = vs[static_cast<size_t>(v.baseline)];
    const double t = median(v.times), base = median(b.times);
    const double tmin = *std::min_element(v.times.begin(), v.times.end());
    const double bmin = *std::min_element(b.times.begin(), b.times.end());
    report << "| " << v.name << " | " << std::setprecision(3) << t * 1e3 << " ms | "
           << std::setprecision(1) << flops / t * 1e-9 << " | " << 100.0 * base / t << "% | "
           << std::setprecision(3) << tmin * 1e3 << " ms | " << std::setprecision(1)
           << 100.0 * bmin / tmin << "% |\n";
  }
}
