// The `pallas` command-line tool.
#include <CLI/CLI.hpp>

#include <cmath>
#include <iostream>

#include "pallas/pallas.h"

namespace pl = pallas;

namespace {

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

int run_demo(uint64_t seed) {
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pallas: write accelerator kernels in the Pallas model, run them anywhere"};
  app.require_subcommand(1);
  uint64_t seed = 0;
  CLI::App* demo = app.add_subcommand("demo", "trace a kernel, print its IR, evaluate it and check it");
  demo->add_option("--seed", seed, "random seed for the inputs");
  CLI::App* version = app.add_subcommand("version", "print the version");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    if (*version) {
      std::cout << "pallas 0.1.0\n";
      return 0;
    }
    if (*demo) return run_demo(seed);
  } catch (const pl::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
