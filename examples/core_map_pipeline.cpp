// Example `core_map_pipeline`: a pipeline across the cores of one device (pltpu::core_map over
// a TensorCoreMesh of --cores cores). The input is cut into (8, 128) tiles; core c is stage c:
// it takes each tile from the stage before (core 0: from HBM), applies
// f_c(v) = 1.5 * v + c, and hands it to core c + 1 (the last core: to the output in HBM).
//
// Between cores c and c + 1 sits a two-slot buffer in VMEM_SHARED (memory the device's cores
// share). Tile t uses slot t % 2. Two regular semaphores per slot and core tell the cores when to
// go, always signalled on the other core (semaphore_signal with .core_index):
// * `full[slot]` of core c + 1: core c has put a tile in the slot (one signal per tile);
// * `empty[slot]` of core c: core c + 1 has taken the tile out, so core c may refill the slot
//   (the first two tiles find both slots empty, so only tiles t >= 2 wait for it).
// TPU interpret mode only.
#include <algorithm>

#include "examples/registry.h"
#include "examples/support.h"

namespace pallas::examples::core_map_pipeline {
namespace {

namespace pl = ::pallas;
namespace pltpu = ::pallas::tpu;

constexpr int kDefaultCores = 2;
constexpr int64_t kDefaultRows = 64;
constexpr int64_t kTileRows = 8, kCols = 128;
constexpr double kScale = 1.5;

// Refs: x, out (HBM), then the scratch: this core's tile (VMEM), the links between cores
// (VMEM_SHARED {cores - 1, 2, 8, 128}) and the semaphores full {2}, empty {2}.
void body(int64_t cores, int64_t tiles, const pl::Ref& x, const pl::Ref& out, const pl::Ref& tile,
          const pl::Ref& links, const pl::Ref& full, const pl::Ref& empty) {
  const pl::Value c = pltpu::axis_index("core");
  pl::fori_loop(0, tiles, [&](pl::Value t) {
    const pl::Value slot = t % 2;
    const pl::Ref rows = x.at(pl::ds(t * kTileRows, kTileRows));
    // Take tile t from the previous stage.
    pl::cond(
        c == 0, [&] { pltpu::sync_copy(rows, tile); },
        [&] {
          pltpu::semaphore_wait(full.at(slot), 1);
          tile[pl::all] = links.at(c - 1, slot)[pl::all];
          pl::when(t + 2 < tiles, [&] {
            pltpu::semaphore_signal(empty.at(slot), 1, {.core_index = c - 1});
          });
        });
    tile[pl::all] = tile[pl::all] * static_cast<float>(kScale) + c.astype(pl::f32);
    // Hand it to the next stage.
    pl::cond(
        c == cores - 1, [&] { pltpu::sync_copy(tile, out.at(pl::ds(t * kTileRows, kTileRows))); },
        [&] {
          pl::when(t >= 2, [&] { pltpu::semaphore_wait(empty.at(slot), 1); });
          links.at(c, slot)[pl::all] = tile[pl::all];
          pltpu::semaphore_signal(full.at(slot), 1, {.core_index = c + 1});
        });
  });
}

std::vector<Array> reference(int64_t cores, const std::vector<Array>& in) {
  std::vector<double> v = in[0].to_doubles();
  for (double& e : v)
    for (int64_t c = 0; c < cores; ++c) e = kScale * e + static_cast<double>(c);
  return {Array::from_values(in[0].shape(), DType::F64, v)};
}

Problem build(const RunOptions& opts) {
  require_tpu_interpret("core_map_pipeline", opts);
  require_dtype("core_map_pipeline", opts, {DType::F32});
  const int64_t cores = cores_or_default("core_map_pipeline", opts, kDefaultCores);
  const int64_t rows = size_or_default("core_map_pipeline", opts, kDefaultRows);
  if (rows % kTileRows != 0)
    throw UsageError("core_map_pipeline: size must be a multiple of 8 (the tile's rows), got " +
                     std::to_string(rows));
  const int64_t tiles = rows / kTileRows;
  // core_map takes its cores from the mesh; the other interpret options come from on_backend.
  CallOptions o = on_backend(
      {.scratch_shapes = {pltpu::VMEM({kTileRows, kCols}, pl::f32),
                          pltpu::VMEM_SHARED({std::max<int64_t>(cores - 1, 1), 2, kTileRows, kCols},
                                             pl::f32),
                          pltpu::semaphores(pltpu::SemaphoreType::REGULAR, {2}),
                          pltpu::semaphores(pltpu::SemaphoreType::REGULAR, {2})},
       .name = "core_map_pipeline"},
      opts);
  pl::PallasCall call = pltpu::core_map(
      [cores, tiles](pl::Ref x, pl::Ref out, pl::Ref tile, pl::Ref links, pl::Ref full,
                     pl::Ref empty) { body(cores, tiles, x, out, tile, links, full, empty); },
      {pl::ShapeDtype({rows, kCols}, pl::f32)},
      pltpu::TensorCoreMesh{"core", static_cast<int>(cores)}, o);
  const int64_t n = rows * kCols;
  return Problem{
      .name = "core_map_pipeline",
      .signature = "f32" + dims({rows, kCols}) + " on " + std::to_string(cores) + (cores == 1 ? " core" : " cores"),
      .backend = opts.backend,
      .call = call,
      .inputs = {Array::random_normal({rows, kCols}, pl::f32, input_seed(opts, 0))},
      .reference = [cores](const std::vector<Array>& in) { return reference(cores, in); },
      // One f32 rounding per stage, relative to values that grow by 1.5 per stage.
      .tolerance = {1e-5 * static_cast<double>(cores), 1e-5},
      .flops = 2 * n * cores,
      .bytes = 2 * n * 4,
      .throughput = Throughput::Bytes,
  };
}

}  // namespace

Example example() {
  return {"core_map_pipeline",
          "core_map pipeline: core c applies 1.5*v + c to each tile and passes it to core c+1 "
          "(--cores, tpu-interpret)",
          build};
}

}  // namespace pallas::examples::core_map_pipeline
