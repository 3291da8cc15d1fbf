// Example `deadlock`: a deliberately broken kernel. Every device of a ring (--devices, default
// 2) first waits for a signal from its left neighbour and only then signals its right one — so
// every device waits first, and nobody ever signals. The TPU interpret mode notices that every
// core is blocked on something no running core can provide and ends the call with a
// pltpu::DeadlockError naming each core's wait (`pallas run` prints it and exits 4).
//
// The fix is to signal before waiting (or to let one device go first).
// TPU interpret mode only.
#include "examples/registry.h"
#include "examples/support.h"

namespace pallas::examples::deadlock {
namespace {

namespace pl = ::pallas;
namespace pltpu = ::pallas::tpu;

constexpr int kDefaultDevices = 2;
constexpr int64_t kDefaultRows = 8, kCols = 128;

void kernel(int64_t n, const pl::Ref& x, const pl::Ref& o, const pl::Ref& go) {
  const pl::Value me = pltpu::axis_index("x");
  pltpu::semaphore_wait(go, 1);  // BUG: waits for the left neighbour, which waits too
  pltpu::semaphore_signal(go, 1, {.device_id = pltpu::DeviceId((me + 1) % n)});
  o[pl::all] = x[pl::all];
}

Problem build(const RunOptions& opts) {
  require_tpu_interpret("deadlock", opts);
  require_dtype("deadlock", opts, {DType::F32});
  const int64_t n = devices_or_default("deadlock", opts, kDefaultDevices, 2);
  const int64_t rows = size_or_default("deadlock", opts, kDefaultRows);
  pl::PallasCall call = pl::pallas_call(
      [n](pl::Ref x, pl::Ref o, pl::Ref go) { kernel(n, x, o, go); },
      pl::ShapeDtype({rows, kCols}, pl::f32),
      on_backend({.scratch_shapes = {pltpu::semaphores(pltpu::SemaphoreType::REGULAR)},
                  // A collective id, as for any kernel that signals other devices (it also
                  // drops the implicit start barrier, so the report shows only the ring).
                  .compiler_params = pltpu::CompilerParams{.collective_id = 0},
                  .name = "deadlock"},
                 opts));
  return Problem{
      .name = "deadlock",
      .signature = "f32" + dims({rows, kCols}) + " on " + std::to_string(n) + " devices",
      .backend = opts.backend,
      .call = call,
      .inputs = {Array::random_normal({n * rows, kCols}, pl::f32, input_seed(opts, 0))},
      // Were the kernel correct, each device would return its shard.
      .reference = [](const std::vector<Array>& in) { return in; },
      .runner = mesh_runner(call, "x", n),
      .call_arg_shapes = {ShapeDtype({rows, kCols}, pl::f32)},
      .bytes = 2 * n * rows * kCols * 4,
      .throughput = Throughput::Bytes,
  };
}

}  // namespace

Example example() {
  return {"deadlock",
          "a deliberately deadlocking ring: each device waits for its left neighbour before "
          "signalling (tpu-interpret)",
          build, /*multi_device=*/true};
}

}  // namespace pallas::examples::deadlock
