// pallas_call on the reference interpreter: a blocked matmul next to one direct BLAS call on the
// whole problem, and the per-grid-point overhead of the interpreter.
#include <cblas.h>

#include <iomanip>

#include "bench/bench.h"
#include "pallas/pallas.h"

namespace pl = pallas;

// The blocked matmul both interpreters are measured on: acc += x_ik · y_kj over the k axis.
pl::PallasCall bench::blocked_matmul(int64_t n, int64_t b, pl::InterpretMode mode) {
  auto kernel = [](pl::Ref x, pl::Ref y, pl::Ref z, pl::Ref acc) {
    pl::when(pl::program_id(2) == 0, [&] { acc[pl::all] = 0.0f; });
    acc[pl::all] += pl::dot(x[pl::all], y[pl::all]);
    pl::when(pl::program_id(2) == pl::num_programs(2) - 1, [&] { z[pl::all] = acc[pl::all]; });
  };
  return pl::pallas_call(
      kernel, pl::ShapeDtype({n, n}, pl::f32),
      {.grid = {n / b, n / b, n / b},
       .in_specs = {pl::BlockSpec({b, b}, [](pl::Value i, pl::Value, pl::Value k) { return pl::Indices{i, k}; }),
                    pl::BlockSpec({b, b}, [](pl::Value, pl::Value j, pl::Value k) { return pl::Indices{k, j}; })},
       .out_specs = {pl::BlockSpec({b, b}, [](pl::Value i, pl::Value j, pl::Value) { return pl::Indices{i, j}; })},
       .scratch_shapes = {{{b, b}, pl::f32, pl::MemorySpace::Vmem}},
       .interpret = std::move(mode)});
}

void bench_pallas_call(std::ostream& report) {
  const int64_t n = 1024;
  pl::Array x = pl::Array::random_normal({n, n}, pl::f32, 1);
  pl::Array y = pl::Array::random_normal({n, n}, pl::f32, 2);
  pl::Array z({n, n}, pl::f32);
  const double flops = 2.0 * n * n * n;
  double t_blas = bench::median_seconds(5, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, x.data<float>(), n,
                y.data<float>(), n, 0.0f, z.data<float>(), n);
  });
  report << "| measurement | time | GFLOP/s | vs BLAS |\n|---|---|---|---|\n" << std::fixed;
  report << "| cblas_sgemm 1024^3 f32, one call | " << std::setprecision(2) << t_blas * 1e3
         << " ms | " << std::setprecision(1) << flops / t_blas * 1e-9 << " | 100% |\n";
  for (int64_t b : {256, 128}) {
    pl::PallasCall call = bench::blocked_matmul(n, b, true);
    double t = bench::median_seconds(5, [&] { call(x, y); });
    report << "| reference interpret blocked matmul 1024^3 f32, blocks " << b << "x" << b << " (grid "
           << n / b << "x" << n / b << "x" << n / b << ") | " << std::setprecision(2) << t * 1e3
           << " ms | " << std::setprecision(1) << flops / t * 1e-9 << " | " << std::setprecision(0)
           << 100.0 * t_blas / t << "% |\n";
  }

  // Per-grid-point overhead: 64x64 grid of (8, 128) blocks; an empty kernel (machinery only)
  // and a copy kernel.
  const int64_t g = 64;
  pl::Array big = pl::Array::random_normal({g * 8, g * 128}, pl::f32, 3);
  auto spec = [] { return pl::BlockSpec({8, 128}, [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; }); };
  auto empty = pl::pallas_call([](pl::Ref, pl::Ref) {}, pl::ShapeDtype({g * 8, g * 128}, pl::f32),
                               {.grid = {g, g}, .in_specs = {spec()}, .out_specs = {spec()}, .interpret = true});
  auto copy = pl::pallas_call([](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all]; },
                              pl::ShapeDtype({g * 8, g * 128}, pl::f32),
                              {.grid = {g, g}, .in_specs = {spec()}, .out_specs = {spec()}, .interpret = true});
  double t_empty = bench::median_seconds(5, [&] { empty(big); });
  double t_copy = bench::median_seconds(5, [&] { copy(big); });
  report << "\n| per-grid-point overhead, 64x64 grid, (8,128) f32 blocks | us per point | target |\n|---|---|---|\n";
  report << std::setprecision(2) << "| empty kernel (index maps + block views + dispatch) | "
         << t_empty / (g * g) * 1e6 << " | <= 2 |\n";
  report << "| copy kernel (o = x) | " << t_copy / (g * g) * 1e6 << " | - |\n";
}
