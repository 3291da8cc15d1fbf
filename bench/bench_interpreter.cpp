// Per-op dispatch overhead of the kernel evaluator: a kernel that applies a chain of adds to an
// (8, 128) f32 tile, evaluated repeatedly; time per op = time per evaluation / number of ops.
#include <iomanip>

#include "bench/bench.h"
#include "pallas/pallas.h"

namespace pl = pallas;

void bench_interpreter(std::ostream& report) {
  constexpr int kOps = 200;
  using pl::ir::Type;
  auto k = pl::trace_kernel(
      [](pl::Ref x, pl::Ref o) {
        pl::Value a = x[pl::all];
        pl::Value b = a;
        for (int i = 0; i < kOps; ++i) b = b + a;
        o[pl::all] = b;
      },
      {Type::ref({8, 128}, pl::f32, pl::MemorySpace::Vmem), Type::ref({8, 128}, pl::f32, pl::MemorySpace::Vmem)});
  std::vector<pl::Array> bufs = {pl::Array::random_normal({8, 128}, pl::f32, 1),
                                 pl::Array::zeros({8, 128}, pl::f32)};
  double t = bench::median_seconds(51, [&] { pl::evaluate(k, bufs); });
  // An empty-ish kernel (load + store) gives the fixed cost of one evaluate() call.
  auto k0 = pl::trace_kernel([](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all]; },
                             {Type::ref({8, 128}, pl::f32, pl::MemorySpace::Vmem),
                              Type::ref({8, 128}, pl::f32, pl::MemorySpace::Vmem)});
  double t0 = bench::median_seconds(51, [&] { pl::evaluate(k0, bufs); });
  double per_op_ns = (t - t0) / kOps * 1e9;
  report << "| measurement | value | target |\n|---|---|---|\n";
  report << std::fixed << std::setprecision(1);
  report << "| evaluator time per op, 8x128 f32 add (chain of " << kOps << ") | " << per_op_ns
         << " ns | <= 300 ns |\n";
  report << "| fixed cost of one evaluate() call (load + store kernel) | " << t0 * 1e9 << " ns | - |\n";
}
