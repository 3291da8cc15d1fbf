// Example `dma_matmul`: the matmul of `matmul`, but with the K loop written by hand. x and y stay
// in HBM (BlockSpec(ANY)); each grid point (i, j) walks k with fori_loop and moves the tiles
// x[i, k] and y[k, j] into VMEM itself, double-buffered: while it multiplies the tiles of step k
// (slot k % 2), the DMAs for step k + 1 fill the other slot. Each slot has its own DMA
// semaphore, so a wait can only be satisfied by the copy into that slot.
//
// Why each step is safe (and why --detect-races finds nothing):
// * the copies into slot 1 - s start after the dot of step k - 1 read that slot (program order);
// * the dot of step k reads slot s only after waiting for its copies.
// TPU interpret mode only.
#include <algorithm>

#include "examples/registry.h"
#include "examples/support.h"

namespace pallas::examples::dma_matmul {
namespace {

namespace pl = ::pallas;
namespace pltpu = ::pallas::tpu;

constexpr int64_t kDefaultSize = 256;
constexpr int64_t kMaxTile = 128;

// The tile: 128, or half the size for small problems (so there are always at least two K steps
// and the double buffering is exercised).
int64_t tile_of(int64_t n) { return std::min(kMaxTile, n / 2); }

// Kernel refs: x, y (HBM), the output tile z (VMEM), then the scratch: two slots of x tiles and
// of y tiles, the f32 accumulator and one DMA semaphore per slot for each operand.
void kernel(int64_t tile, int64_t k_steps, const pl::Ref& x, const pl::Ref& y, const pl::Ref& z,
            const pl::Ref& x_slots, const pl::Ref& y_slots, const pl::Ref& acc,
            const pl::Ref& x_sems, const pl::Ref& y_sems) {
  const pl::Value i = pl::program_id(0), j = pl::program_id(1);
  // The two copies that bring the tiles of step k into `slot`. Rebuilding the descriptors for
  // the wait is fine: a wait needs only the semaphore and the byte count.
  auto copy_x = [&](const pl::Value& k, const pl::Value& slot) {
    return pltpu::make_async_copy(x.at(pl::ds(i * tile, tile), pl::ds(k * tile, tile)),
                                  x_slots.at(slot), x_sems.at(slot));
  };
  auto copy_y = [&](const pl::Value& k, const pl::Value& slot) {
    return pltpu::make_async_copy(y.at(pl::ds(k * tile, tile), pl::ds(j * tile, tile)),
                                  y_slots.at(slot), y_sems.at(slot));
  };
  const pl::Value zero = pl::scalar(0, pl::i32);
  copy_x(zero, zero).start();
  copy_y(zero, zero).start();
  acc[pl::all] = 0.0f;
  pl::fori_loop(0, k_steps, [&](pl::Value k) {
    const pl::Value slot = k % 2;
    // Prefetch step k + 1 into the other slot before computing with this one.
    pl::when(k + 1 < k_steps, [&] {
      copy_x(k + 1, 1 - slot).start();
      copy_y(k + 1, 1 - slot).start();
    });
    copy_x(k, slot).wait();
    copy_y(k, slot).wait();
    acc[pl::all] += pl::dot(x_slots.at(slot)[pl::all], y_slots.at(slot)[pl::all],
                            {.preferred = pl::f32});
  });
  z[pl::all] = acc[pl::all];
}

// Plain loops in double: an independent check of the tiling and the DMA choreography.
std::vector<Array> reference(const std::vector<Array>& in) {
  const std::vector<double> x = in[0].to_doubles(), y = in[1].to_doubles();
  const int64_t m = in[0].dim(0), k = in[0].dim(1), n = in[1].dim(1);
  Array z({m, n}, DType::F64);
  double* o = z.data<double>();
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < n; ++c) o[r * n + c] = 0;
    for (int64_t q = 0; q < k; ++q) {
      const double a = x[r * k + q];
      for (int64_t c = 0; c < n; ++c) o[r * n + c] += a * y[q * n + c];
    }
  }
  return {z};
}

Problem build(const RunOptions& opts) {
  require_tpu_interpret("dma_matmul", opts);
  require_dtype("dma_matmul", opts, {DType::F32, DType::BF16});
  const int64_t n = size_or_default("dma_matmul", opts, kDefaultSize);
  const int64_t tile = tile_of(n);
  if (n < 16 || n % 16 != 0 || n % tile != 0)
    throw UsageError("dma_matmul: size must be a multiple of 16 (and of 128 above 256), got " +
                     std::to_string(n));
  const int64_t tiles = n / tile;
  const DType t = opts.dtype;
  pl::PallasCall call = pl::pallas_call(
      [tile, tiles](pl::Ref x, pl::Ref y, pl::Ref z, pl::Ref xs, pl::Ref ys, pl::Ref acc,
                    pl::Ref xsem, pl::Ref ysem) { kernel(tile, tiles, x, y, z, xs, ys, acc, xsem, ysem); },
      pl::ShapeDtype({n, n}, pl::f32),
      on_backend(
          {.grid = {tiles, tiles},
           .in_specs = {pl::BlockSpec(pltpu::ANY), pl::BlockSpec(pltpu::ANY)},
           .out_specs = {pl::BlockSpec({tile, tile}, [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; })},
           .scratch_shapes = {pltpu::VMEM({2, tile, tile}, t), pltpu::VMEM({2, tile, tile}, t),
                              pltpu::VMEM({tile, tile}, pl::f32),
                              pltpu::semaphores(pltpu::SemaphoreType::DMA, {2}),
                              pltpu::semaphores(pltpu::SemaphoreType::DMA, {2})},
           // Output tiles are independent: with --cores they are shared out among the cores.
           .compiler_params = pltpu::CompilerParams{.dimension_semantics = {"parallel", "parallel"}},
           .name = "dma_matmul"},
          opts));
  return Problem{
      .name = "dma_matmul",
      .signature = std::string(dtype_name(t)) + dims({n, n}) + "x" + dims({n, n}) + " tiles " +
                   dims({tile, tile}),
      .backend = opts.backend,
      .call = call,
      .inputs = {Array::random_normal({n, n}, t, input_seed(opts, 0)),
                 Array::random_normal({n, n}, t, input_seed(opts, 1))},
      .reference = reference,
      // f32 products summed in f32 (bf16 inputs are exact in f32): the error grows with K.
      .tolerance = {1e-4, 2e-6 * static_cast<double>(n)},
      .flops = 2 * n * n * n,
      .bytes = 2 * n * n * itemsize(t) * tiles + n * n * 4,  // every tile is fetched `tiles` times
      .throughput = Throughput::Flops,
  };
}

}  // namespace

Example example() {
  return {"dma_matmul",
          "matmul with x, y in HBM and a hand-written double-buffered DMA loop over K "
          "(tpu-interpret)",
          build};
}

}  // namespace pallas::examples::dma_matmul
