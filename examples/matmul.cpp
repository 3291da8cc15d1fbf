// Example `matmul`: a blocked (size x size) @ (size x size) matmul over a 3-D grid (i, j, k),
// accumulating in an f32 VMEM scratch across the K axis — the canonical Pallas TPU matmul.
#include <algorithm>

#include "examples/registry.h"
#include "examples/support.h"

namespace pallas::examples::matmul {
namespace {

namespace pl = ::pallas;

constexpr int64_t kDefaultSize = 512;
constexpr int64_t kMaxBlock = 128;

// The kernel at grid point (i, j, k): acc += x[i, k] @ y[k, j]; acc starts at 0 for k == 0 and
// is written to z[i, j] after the last k. The scratch persists across grid points, and k is
// the fastest axis, so each (i, j) sees all its k steps in a row.
void kernel(const pl::Ref& x, const pl::Ref& y, const pl::Ref& z, const pl::Ref& acc) {
  pl::when(pl::program_id(2) == 0, [&] { acc[pl::all] = 0.0f; });
  acc[pl::all] += pl::dot(x[pl::all], y[pl::all], {.preferred = pl::f32});
  pl::when(pl::program_id(2) == pl::num_programs(2) - 1, [&] { z[pl::all] = acc[pl::all]; });
}

// The kernel and BLAS sum the K products in different orders (f32 either way): the difference
// grows with K and with the size of the terms, not with |z| (which may be ~0), hence an atol
// proportional to K. bf16 inputs make exact f32 products, so only a little more slack for
// backends that round partial sums differently.
Tolerance tolerance(DType t, int64_t k) {
  const double per_term = t == DType::BF16 ? 4e-6 : 2e-6;
  return {1e-4, per_term * static_cast<double>(k)};
}

Problem build(const RunOptions& opts) {
  require_dtype("matmul", opts, {DType::F32, DType::BF16});
  const int64_t n = size_or_default("matmul", opts, kDefaultSize);
  const int64_t b = std::min(kMaxBlock, n);
  if (n % b != 0)
    throw UsageError("matmul: size must be at most " + std::to_string(kMaxBlock) +
                     " or a multiple of " + std::to_string(kMaxBlock) + " (the block size), got " +
                     std::to_string(n));
  pl::PallasCall call = pl::pallas_call(
      kernel, pl::ShapeDtype({n, n}, pl::f32),
      on_backend(
          {.grid = {n / b, n / b, n / b},
           .in_specs = {pl::BlockSpec({b, b}, [](pl::Value i, pl::Value, pl::Value k) { return pl::Indices{i, k}; }),
                        pl::BlockSpec({b, b}, [](pl::Value, pl::Value j, pl::Value k) { return pl::Indices{k, j}; })},
           .out_specs = {pl::BlockSpec({b, b}, [](pl::Value i, pl::Value j, pl::Value) { return pl::Indices{i, j}; })},
           .scratch_shapes = {{{b, b}, pl::f32, pl::MemorySpace::Vmem}},
           .name = "matmul"},
          opts));
  return square_matmul_problem("matmul", opts, n, call, tolerance(opts.dtype, n));
}

}  // namespace

Example example() {
  return {"matmul",
          "blocked f32 / bf16 matmul (size^3, 128-blocks) with an f32 scratch accumulator over K",
          build};
}

}  // namespace pallas::examples::matmul
