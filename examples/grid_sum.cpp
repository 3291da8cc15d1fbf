// Example `grid_sum`: column sums of x (n, 256) with a persistent gpu::kernel and a semaphore of
// the whole grid (pl::get_global(gpu::Semaphore{}), Mosaic GPU's pl.get_global(SemaphoreType.
// REGULAR)) — the shape of a split reduction that needs no second kernel launch.
//
// The grid is a fixed number of CTAs, whatever n is (a persistent grid: each CTA loops over its
// share of the row blocks, CTA c taking blocks c, c + kCtas, c + 2 kCtas, ... so neighbouring
// CTAs read neighbouring memory). Each CTA accumulates its blocks in f32 registers, reduces them
// to one row, writes that row to `partials`, and — unless it is CTA 0 — signals the semaphore.
// CTA 0 waits until all kCtas - 1 others have signalled (the wait orders their writes of
// `partials` before its reads) and adds their rows to its own.
//
// Because CTA 0 waits for the others, every CTA must run at the same time: the backends make a
// kernel with pl::get_global semaphores co-resident (and the GPU launch checks that the device
// holds all kCtas CTAs at once).
#include "examples/registry.h"
#include "examples/support.h"
#include "pallas/gpu.h"

namespace pallas::examples::grid_sum {
namespace {

namespace pl = ::pallas;
namespace plgpu = ::pallas::gpu;

constexpr int64_t kCols = 256;      // the row's width
constexpr int64_t kBlockRows = 8;   // rows per loop step
constexpr int64_t kCtas = 16;       // the persistent grid
constexpr int64_t kDefaultRows = 2048;

void kernel(int64_t steps, const pl::Ref& x, const pl::Ref& sums, const pl::Ref& partials) {
  const pl::Value c = plgpu::axis_index("c");
  const pl::Ref sem = pl::get_global(plgpu::Semaphore{});  // the grid's (a scratch one is the CTA's)
  pl::Value acc = pl::fori_loop(0, static_cast<int>(steps), pl::zeros({kBlockRows, kCols}, pl::f32),
                                [&](pl::Value k, pl::Value acc) {
                                  pl::Value row = (k * static_cast<int32_t>(kCtas) + c) * static_cast<int32_t>(kBlockRows);
                                  return acc + x.at(pl::ds(row, kBlockRows), pl::all)[pl::all].astype(pl::f32);
                                });
  const pl::Value mine = pl::sum(acc, {0});
  partials.at(c)[pl::all] = mine;
  pl::when(c != 0, [&] { plgpu::semaphore_signal(sem); });
  pl::when(c == 0, [&] {
    plgpu::semaphore_wait(sem, static_cast<int32_t>(kCtas - 1));
    pl::Value total = mine;
    for (int64_t other = 1; other < kCtas; ++other) total = total + partials.at(other)[pl::all];
    sums[pl::all] = total;
  });
}

// The expected outputs in double: each CTA's rows, then the whole column.
std::vector<Array> reference(const std::vector<Array>& in) {
  const Array x = in.at(0).astype(DType::F32);
  const int64_t rows = x.dim(0);
  std::vector<double> part(kCtas * kCols, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t cta = (r / kBlockRows) % kCtas;
    for (int64_t j = 0; j < kCols; ++j) part[cta * kCols + j] += x.data<float>()[r * kCols + j];
  }
  Array sums({kCols}, DType::F32), partials({kCtas, kCols}, DType::F32);
  for (int64_t j = 0; j < kCols; ++j) {
    double total = 0;
    for (int64_t cta = 0; cta < kCtas; ++cta) {
      total += part[cta * kCols + j];
      partials.data<float>()[cta * kCols + j] = static_cast<float>(part[cta * kCols + j]);
    }
    sums.data<float>()[j] = static_cast<float>(total);
  }
  return {sums, partials};
}

Problem build(const RunOptions& opts) {
  require_dtype("grid_sum", opts, {DType::F32, DType::BF16});
  if (opts.backend == "tpu-interpret")
    throw UsageError("grid_sum is a gpu::kernel (a persistent grid with a GMEM semaphore): run it with "
                     "--backend reference (the GPU interpreter), gpu or gpu-emulate, not tpu-interpret");
  const int64_t n = size_or_default("grid_sum", opts, kDefaultRows);
  constexpr int64_t kRowsPerRound = kCtas * kBlockRows;
  if (n <= 0 || n % kRowsPerRound != 0)
    throw UsageError("grid_sum: size (the rows) must be a positive multiple of " + std::to_string(kRowsPerRound) +
                     " (" + std::to_string(kCtas) + " CTAs x " + std::to_string(kBlockRows) +
                     " rows per step), got " + std::to_string(n));
  const int64_t steps = n / kRowsPerRound;
  pl::CallOptions options = on_backend({.name = "grid_sum"}, opts);
  pl::PallasCall call = plgpu::kernel(
      [steps](pl::Ref x, pl::Ref sums, pl::Ref partials) { kernel(steps, x, sums, partials); },
      {pl::ShapeDtype({kCols}, pl::f32), pl::ShapeDtype({kCtas, kCols}, pl::f32)},
      plgpu::Mesh{.grid = {kCtas}, .grid_names = {"c"}}, options);
  // f32 sums of n values in another order than the double reference: slack growing with n.
  const Tolerance tolerance{1e-5, 2e-7 * static_cast<double>(n)};
  return Problem{
      .name = "grid_sum",
      .signature = std::string(dtype_name(opts.dtype)) + dims({n, kCols}),
      .backend = opts.backend,
      .call = std::move(call),
      .inputs = {Array::random_normal({n, kCols}, opts.dtype, input_seed(opts, 0))},
      .reference = reference,
      .tolerance = tolerance,
      .flops = n * kCols,
      .bytes = n * kCols * itemsize(opts.dtype) + (kCtas + 1) * kCols * 4,
      .throughput = Throughput::Bytes,
  };
}

}  // namespace

Example example() {
  return {"grid_sum",
          "persistent gpu::kernel column sums: each of 16 CTAs reduces its share of the rows, a GMEM "
          "semaphore hands the partial sums to CTA 0",
          build};
}

}  // namespace pallas::examples::grid_sum
