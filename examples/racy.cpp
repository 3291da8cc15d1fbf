// Example `racy`: a deliberately broken kernel — the classic manual-DMA bug of using a DMA's
// destination before waiting for the copy. It starts copying x from HBM into a VMEM buffer, then
// reads the buffer at once (and only then waits):
//
//   copy.start();
//   o = buf * 2;   // BUG: buf is still being written by the DMA
//   copy.wait();
//
// What it computes depends on when the simulated DMA happens to run: in --dma-mode eager the copy
// is done at start() and the bug hides (o = 2x); in on_wait mode (the default) it runs inside
// wait() and o is read from uninitialized memory (NaN). So the result is not checked: the
// example runs, prints a note and exits 0. With --detect-races the TPU interpret mode reports
// the race (the DMA's write and the kernel's load are not ordered) in both modes, and
// `pallas run` exits 3.
// TPU interpret mode only.
#include "examples/registry.h"
#include "examples/support.h"

namespace pallas::examples::racy {
namespace {

namespace pl = ::pallas;
namespace pltpu = ::pallas::tpu;

constexpr int64_t kDefaultRows = 8, kCols = 128;

void kernel(const pl::Ref& x_hbm, const pl::Ref& o, const pl::Ref& buf, const pl::Ref& sem) {
  auto copy = pltpu::make_async_copy(x_hbm, buf, sem);
  copy.start();
  o[pl::all] = buf[pl::all] * 2.0f;  // the race: the fix is to wait before this line
  copy.wait();
}

Problem build(const RunOptions& opts) {
  require_tpu_interpret("racy", opts);
  require_dtype("racy", opts, {DType::F32});
  const int64_t rows = size_or_default("racy", opts, kDefaultRows);
  pl::PallasCall call = pl::pallas_call(
      kernel, pl::ShapeDtype({rows, kCols}, pl::f32),
      on_backend({.in_specs = {pl::BlockSpec(pltpu::ANY)},
                  .scratch_shapes = {pltpu::VMEM({rows, kCols}, pl::f32),
                                     pltpu::semaphores(pltpu::SemaphoreType::DMA)},
                  .name = "racy"},
                 opts));
  return Problem{
      .name = "racy",
      .signature = "f32" + dims({rows, kCols}),
      .backend = opts.backend,
      .call = call,
      .inputs = {Array::random_normal({rows, kCols}, pl::f32, input_seed(opts, 0))},
      .unchecked_note = "racy by design, so its result depends on the DMA timing; run it with "
                        "--detect-races to see the race",
      .flops = rows * kCols,
      .bytes = 2 * rows * kCols * 4,
      .throughput = Throughput::Bytes,
  };
}

}  // namespace

Example example() {
  return {"racy",
          "a deliberately racy kernel (reads a DMA's destination before waiting); try "
          "--detect-races (tpu-interpret)",
          build};
}

}  // namespace pallas::examples::racy
