// `pallas demo`: trace one kernel, print its IR, evaluate it directly and check it.
#include <algorithm>
#include <cmath>
#include <iostream>

#include "pallas/pallas.h"
#include "tools/commands.h"

namespace pallas::cli {
namespace {

namespace pl = ::pallas;

// The demo kernel: a numerically stable row softmax of an (8, 128) tile, written with a loop
// over rows to show regions, dynamic indexing and reductions.
pl::ir::Kernel trace_demo_kernel() {
  using pl::ir::Type;
  return pl::trace_kernel(
      [](pl::Ref x, pl::Ref o) {
        pl::fori_loop(0, x.dim(0), [&](pl::Value row) {
          pl::Value v = x(row, pl::all);             // (128,)
          pl::Value e = pl::exp(v - pl::max(v));     // (128,)
          o(row, pl::all) = e / pl::sum(e);
        });
      },
      {Type::ref({8, 128}, pl::f32, pl::MemorySpace::Vmem), Type::ref({8, 128}, pl::f32, pl::MemorySpace::Vmem)},
      "row_softmax");
}

}  // namespace

int demo(uint64_t seed) {
  pl::ir::Kernel k = trace_demo_kernel();
  std::cout << pl::ir::print(k) << "\n";
  std::vector<pl::Array> bufs = {pl::Array::random_normal({8, 128}, pl::f32, seed),
                                 pl::Array::zeros({8, 128}, pl::f32)};
  pl::evaluate(k, bufs);
  // Independent reference: plain C++ in double.
  pl::Array expected({8, 128}, pl::f32);
  for (int r = 0; r < 8; ++r) {
    double m = -INFINITY, s = 0;
    for (int c = 0; c < 128; ++c) m = std::max(m, bufs[0].get({r, c}));
    for (int c = 0; c < 128; ++c) s += std::exp(bufs[0].get({r, c}) - m);
    for (int c = 0; c < 128; ++c) expected.set({r, c}, std::exp(bufs[0].get({r, c}) - m) / s);
  }
  pl::AllCloseResult res = pl::allclose(bufs[1], expected, 1e-5, 1e-6);
  std::cout << "row_softmax f32[8,128] (reference evaluation): max abs err " << res.max_abs_error
            << ", max rel err " << res.max_rel_error << "  " << (res.ok ? "ok" : "FAILED") << "\n";
  if (!res.ok) std::cout << res.message << "\n";
  return res.ok ? 0 : 1;
}

}  // namespace pallas::cli
