// Example `ws_matmul`: a warp-specialized matmul written with gpu::kernel (Mosaic GPU's
// plgpu.kernel), the structure of Hopper matmul kernels. Each CTA computes a (128, N) tile of
// the output (N = 128 by default for bf16 / f16, 64 for f32; `--tile-n`) with three Pallas
// threads (warpgroups): thread 2, the producer, streams K-steps of x and y into a ring of
// shared-memory slots (4 by default, fewer where the GPU's shared memory holds fewer, 2 for f32;
// `--stages`); threads 0 and 1, the consumers, each accumulate 64 rows of the tile with wgmma
// into an f32 accumulator (registers on the GPU) and hand each slot
// back once the wgmma reading it is done, one step later (wgmma_wait(1)). A slot's "full"
// barrier completes when both of its copies have landed, its "free" barrier when both consumers
// are done with it. Each consumer writes its rows out through shared memory: it stores the
// accumulator to an SMEM tile and copies that to z (bulk copies on sm_90, as Hopper kernels'
// epilogues do), waiting for the copy before the CTA ends. With N = 256 (bf16 / f16: each
// consumer's 64 x 256 accumulator is 128 registers a thread, one m64n256k16 wgmma per 16 of K)
// that tile would not fit beside the slots: the consumers store their registers to z directly.
// With `--cluster N` the CTAs come in clusters of N along j (sm_90 and later on the GPU): they
// need the same rows of x, so each producer copies 1/N of a step's x block for all of them (a
// multicast copy, collective along the cluster axis "c"; TMA multicast on the GPU, which reads x
// from L2 once per cluster instead of once per CTA), and a slot is free only when the consumers
// of every CTA of the cluster are done with it (a gpu::ClusterBarrier along "c"). Without it the
// clusters are of one CTA, which the sm_80 path compiles too. `--cluster-rows M` adds M CTAs along
// i, which share y's blocks the same way (multicast along "r"); a slot is then free when the
// consumers of the CTAs sharing either block with this one are done (the ClusterBarrier along
// both axes: the CTAs differing from this one along one of them).
// With `--persistent P` the grid is P CTAs (a GPU's SM count, say) that loop over the tiles: the
// ring's steps run on from one tile to the next, and the consumers hand back a tile's last slot
// before its epilogue, so the producer loads the next tile's first steps while they store.
#include <functional>

#include "examples/registry.h"
#include "examples/support.h"
#include "pallas/gpu.h"

namespace pallas::examples::ws_matmul {
namespace {

namespace pl = ::pallas;
namespace plgpu = ::pallas::gpu;

constexpr int64_t kDefaultSize = 256;
// K-steps of 64: with bf16 / f16 a slot's rows are 128 bytes, which the GPU backend keeps 128-byte
// swizzled (the widest pattern: no bank conflicts), so TMA lands them in wgmma's layout and wgmma
// reads them in place (docs/GPU.md, "Swizzled SMEM tiles").
// Tiles of 128 x 128 for bf16 / f16: y's slots are two 128-byte panels (64 columns each), a TMA
// box per panel; 128 x 64 for f32 (twice the bytes, whose accumulator stays in shared memory).
// Slots: while the consumers' wgmma read two of them (this step's and the previous one's, handed
// back at the next wgmma_wait(1)), the producer fills the others — with 4, two steps ahead, which
// hides a TMA load's latency behind two steps of wgmma (with 2 it has none: a slot is refilled
// only after the step before the one that needs it). f32 (no tensor cores: the CTA's products and
// their accumulator go through shared memory too) keeps 2.
constexpr int64_t kTileM = 128, kStepK = 64, kDefaultStages = 4, kDefaultStagesF32 = 2;
constexpr int64_t kConsumerRows = kTileM / 2;
// Tiles wider than this write the accumulator from registers (no SMEM tile for the epilogue).
constexpr int64_t kWidestSmemEpilogue = 128;

// The CTA's tiling: its output tile's columns, and its ring's slots.
struct Tiling {
  int64_t tile_n = 0, slots = 0;
  bool smem_epilogue() const { return tile_n <= kWidestSmemEpilogue; }
};

// The kernel's scratch: x's and y's ring slots, the consumers' accumulators, each slot's "full"
// and "free" barriers, and (tiles up to 128 columns) the epilogue's SMEM tile.
std::vector<pl::ScratchShape> scratch_of(const Tiling& t, DType dtype) {
  const int64_t slots = t.slots;
  std::vector<pl::ScratchShape> scratch = {plgpu::SMEM({slots, kTileM, kStepK}, dtype),
                                           plgpu::SMEM({slots, kStepK, t.tile_n}, dtype),
                                           plgpu::ACC({2, kConsumerRows, t.tile_n}),
                                           plgpu::Barrier{.num_arrivals = 2, .num_barriers = static_cast<int>(slots)},
                                           plgpu::ClusterBarrier{.collective_axes = {"r", "c"}, .num_arrivals = 2,
                                                                 .num_barriers = static_cast<int>(slots)}};
  if (t.smem_epilogue()) scratch.push_back(plgpu::SMEM({2, kConsumerRows, t.tile_n}, pl::f32));
  return scratch;
}

// Without --stages: 4 slots (2 for f32), or as many as the device's shared memory holds, down to
// 2 — an A100's 163 KiB holds 3 of bf16's 128 x 128 tiles beside the epilogue's (4 take 192 KiB).
// (1 KiB spare for what the code generator adds: alignment of the swizzled slots.)
int64_t default_slots(const RunOptions& opts, int64_t tile_n) {
  const int64_t most = opts.dtype == DType::F32 ? kDefaultStagesF32 : kDefaultStages;
  int64_t limit = opts.shared_memory_limit;
  if (limit == 0 && opts.backend == "gpu") limit = plgpu::device_shared_memory_limit().value_or(0);
  if (limit == 0) return most;
  for (int64_t slots = most; slots > 2; --slots)
    if (plgpu::shared_memory_bytes(scratch_of({.tile_n = tile_n, .slots = slots}, opts.dtype)) + 1024 <= limit)
      return slots;
  return 2;
}

// Which output tiles a CTA computes: its own, from its grid indices i and j; or, in a persistent
// grid (`--persistent P`: P CTAs, P / (M N) clusters), the cluster tiles (M row blocks along i and
// N column blocks along j) c, c + P / (M N), ... of cluster c, in order.
struct Tiles {
  int64_t rows = 1, cluster = 1;    // CTAs per cluster along i (M), along j (N)
  int64_t persistent_clusters = 0;  // 0: a CTA per tile
  int64_t per_row = 0, count = 0;   // cluster tiles along j, in all
};
// Calls f(first_step, i, j) for each of the CTA's tiles: the index of the tile's first K-step among
// all the CTA makes (the ring's slots and phases run on across tiles), its row and column blocks.
void for_each_tile(const Tiles& t, int64_t k_steps, const std::function<void(pl::Value, pl::Value, pl::Value)>& f) {
  const pl::Value r = plgpu::axis_index("r"), c = plgpu::axis_index("c");
  if (t.persistent_clusters == 0) {
    f(pl::full({}, pl::i32, 0), plgpu::axis_index("i") * t.rows + r, plgpu::axis_index("j") * t.cluster + c);
    return;
  }
  const pl::Value q = plgpu::axis_index("p");
  const int32_t clusters = static_cast<int32_t>(t.persistent_clusters);
  const pl::Value mine = (static_cast<int32_t>(t.count) - q + (clusters - 1)) / clusters;
  pl::fori_loop(0, mine, [&](pl::Value u) {
    const pl::Value tile = q + u * clusters;
    f(u * static_cast<int32_t>(k_steps), tile / static_cast<int32_t>(t.per_row) * t.rows + r,
      tile % static_cast<int32_t>(t.per_row) * t.cluster + c);
  });
}

void kernel(int64_t k_steps, const Tiling& tiling, const Tiles& tiles, const pl::Ref& x, const pl::Ref& y, const pl::Ref& z,
            const pl::Ref& x_s, const pl::Ref& y_s, const pl::Ref& acc, const pl::Ref* out_s, const pl::Ref& full,
            const pl::Ref& free) {
  const int64_t tile_n = tiling.tile_n, slots = tiling.slots;
  pl::Value wg = plgpu::axis_index("wg");
  // Named regions (gpu::named_region) show in the trace of `pallas run ws_matmul --backend
  // gpu-emulate --profile DIR`; they change nothing else.
  pl::when(wg == 2, [&] {  // the producer
    plgpu::named_region("produce", [&] { for_each_tile(tiles, k_steps, [&](pl::Value first, pl::Value i, pl::Value j) {
      pl::fori_loop(0, static_cast<int>(k_steps), [&](pl::Value k) {
        pl::Value step = first + k, slot = step % slots;
        // The slot's previous contents must have been consumed (not on the first pass).
        pl::when(step >= slots, [&] { plgpu::barrier_wait(free.at(slot)); });
        plgpu::copy_gmem_to_smem(x.at(pl::ds(i * kTileM, kTileM), pl::ds(k * kStepK, kStepK)), x_s.at(slot),
                                 full.at(slot), {"c"});
        plgpu::copy_gmem_to_smem(y.at(pl::ds(k * kStepK, kStepK), pl::ds(j * tile_n, tile_n)), y_s.at(slot),
                                 full.at(slot), {"r"});
      });
    }); });
  });
  pl::when(wg < 2, [&] {  // a consumer: rows wg * 64 ... of the tile
    pl::Ref my_acc = acc.at(wg);
    for_each_tile(tiles, k_steps, [&](pl::Value first, pl::Value i, pl::Value j) {
      my_acc[pl::all] = pl::zeros({kConsumerRows, tile_n}, pl::f32);
      plgpu::named_region("mainloop", [&] { pl::fori_loop(0, static_cast<int>(k_steps), [&](pl::Value k) {
        pl::Value step = first + k, slot = step % slots;
        plgpu::barrier_wait(full.at(slot));
        plgpu::wgmma(my_acc, x_s.at(slot, pl::ds(wg * kConsumerRows, kConsumerRows), pl::all), y_s.at(slot));
        // This step's wgmma runs on; the previous step's is done, so its slot goes back to the
        // producer while the tensor cores work.
        plgpu::wgmma_wait(1);
        pl::when(k > 0, [&] { plgpu::barrier_arrive(free.at((step + slots - 1) % slots)); });
      }); });
      plgpu::wgmma_wait(0);  // the accumulator is whole: the last step's slot goes back too (the
      // producer fills it with the next tile's steps during this tile's epilogue)
      plgpu::barrier_arrive(free.at((first + static_cast<int32_t>(k_steps - 1)) % slots));
      plgpu::named_region("epilogue", [&] {
        pl::Ref my_z = z.at(pl::ds(i * kTileM + wg * kConsumerRows, kConsumerRows), pl::ds(j * tile_n, tile_n));
        if (out_s == nullptr) {
          my_z[pl::all] = my_acc[pl::all];  // from the registers, 8 bytes a store
          return;
        }
        pl::Ref my_out = out_s->at(wg);
        my_out[pl::all] = my_acc[pl::all];
        plgpu::commit_smem();  // the stores before the copy reads them
        plgpu::copy_smem_to_gmem(my_out, my_z);
        plgpu::wait_smem_to_gmem(0);  // (my_out is rewritten by the next tile)
      });
    });
  });
}

Problem build(const RunOptions& opts) {
  require_dtype("ws_matmul", opts, {DType::F32, DType::BF16, DType::F16});
  if (opts.backend == "tpu-interpret")
    throw UsageError("ws_matmul is a gpu::kernel (warpgroups, barriers, wgmma): run it with --backend "
                     "reference (the GPU interpreter), gpu or gpu-emulate, not tpu-interpret");
  const int64_t n = size_or_default("ws_matmul", opts, kDefaultSize);
  if (n <= 0 || n % kTileM != 0)
    throw UsageError("ws_matmul: size must be a positive multiple of " + std::to_string(kTileM) +
                     " (the CTA's tile), got " + std::to_string(n));
  const int64_t k_steps = n / kStepK;
  const int64_t tile_n = opts.tile_n != 0 ? opts.tile_n : opts.dtype == DType::F32 ? 64 : 128;
  if (tile_n != 64 && tile_n != 128 && tile_n != 256)
    throw UsageError("ws_matmul: --tile-n must be 64, 128 or 256 (columns of the CTA's output tile), got " +
                     std::to_string(tile_n));
  if (tile_n != 64 && opts.dtype == DType::F32)
    throw UsageError("ws_matmul: f32 takes --tile-n 64 only (without tensor cores its products and accumulator go "
                     "through shared memory, which a wider tile overflows beside the slots), got " + std::to_string(tile_n));
  if (n % tile_n != 0)
    throw UsageError("ws_matmul: size must be a multiple of --tile-n (" + std::to_string(tile_n) + "), got " +
                     std::to_string(n));
  const Tiling tiling{.tile_n = tile_n,
                      .slots = opts.stages != 0 ? opts.stages : default_slots(opts, tile_n)};
  if (tiling.slots < 2)
    throw UsageError("ws_matmul: --stages must be at least 2 (a consumer holds two slots: the step its wgmma "
                     "reads and the one before, until its wgmma_wait(1)), got " + std::to_string(tiling.slots));
  const int64_t cluster = opts.cluster == 0 ? 1 : opts.cluster;  // CTAs along j sharing x's blocks
  const int64_t rows = opts.cluster_rows == 0 ? 1 : opts.cluster_rows;  // CTAs along i sharing y's
  if ((n / tile_n) % cluster != 0 || (cluster & (cluster - 1)) != 0)
    throw UsageError("ws_matmul: --cluster must be a power of two dividing the " + std::to_string(n / tile_n) +
                     " column blocks of the output (size / " + std::to_string(tile_n) + "), got " + std::to_string(cluster));
  if ((n / kTileM) % rows != 0 || (rows & (rows - 1)) != 0 || rows * cluster > 16)
    throw UsageError("ws_matmul: --cluster-rows must be a power of two dividing the " + std::to_string(n / kTileM) +
                     " row blocks of the output (size / " + std::to_string(kTileM) +
                     "), with at most 16 CTAs per cluster, got " + std::to_string(rows));
  Tiles tiles{.rows = rows, .cluster = cluster};
  const int64_t cluster_ctas = rows * cluster;
  if (opts.persistent != 0) {
    tiles.per_row = n / tile_n / cluster;
    tiles.count = n / kTileM / rows * tiles.per_row;
    if (opts.persistent % cluster_ctas != 0 || opts.persistent / cluster_ctas > tiles.count)
      throw UsageError("ws_matmul: --persistent takes a number of CTAs that is a multiple of the cluster size (" +
                       std::to_string(cluster_ctas) + ") and at most " + std::to_string(tiles.count * cluster_ctas) +
                       " (a cluster per tile), got " + std::to_string(opts.persistent));
    tiles.persistent_clusters = opts.persistent / cluster_ctas;
  }
  pl::CallOptions options = on_backend({.scratch_shapes = scratch_of(tiling, opts.dtype), .name = "ws_matmul"}, opts);
  pl::PallasCall call = plgpu::kernel(
      [k_steps, tiling, tiles](const std::vector<pl::Ref>& refs) {
        // x, y, z; x_s, y_s, acc, full, free [, out_s]
        kernel(k_steps, tiling, tiles, refs[0], refs[1], refs[2], refs[3], refs[4], refs[5],
               refs.size() > 8 ? &refs[8] : nullptr, refs[6], refs[7]);
      },
      {pl::ShapeDtype({n, n}, pl::f32)},
      tiles.persistent_clusters == 0
          ? plgpu::Mesh{.grid = {n / kTileM / rows, n / tile_n / cluster}, .grid_names = {"i", "j"}, .cluster = {rows, cluster},
                        .cluster_names = {"r", "c"}, .num_threads = 3, .thread_name = "wg"}
          : plgpu::Mesh{.grid = {tiles.persistent_clusters}, .grid_names = {"p"}, .cluster = {rows, cluster},
                        .cluster_names = {"r", "c"}, .num_threads = 3, .thread_name = "wg"},
      options);
  // f32 sums of exact products in another order than BLAS: slack proportional to K.
  return square_matmul_problem("ws_matmul", opts, n, call, {1e-4, 4e-6 * static_cast<double>(n)});
}

}  // namespace

Example example() {
  return {"ws_matmul",
          "warp-specialized gpu::kernel matmul: a producer warpgroup streams K-steps into SMEM slots on "
          "barriers, two consumer warpgroups wgmma into f32 (--cluster N, --cluster-rows M: clusters sharing x, y by multicast; "
          "--persistent P: P CTAs looping over the tiles)",
          build, /*multi_device=*/false, /*gpu_grid_options=*/true};
}

}  // namespace pallas::examples::ws_matmul
