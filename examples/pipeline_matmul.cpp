// Example `pipeline_matmul`: a matmul written as a gpu::kernel around gpu::emit_pipeline (Mosaic
// GPU's plgpu.emit_pipeline), the shape of Mosaic GPU's matmul tutorial. Each CTA (one Pallas
// thread: a warpgroup) owns a (128, N) tile of the output (N = 128 for bf16 / f16, 64 for f32,
// whose slots are twice as wide in bytes); the pipeline steps over K, keeping `--stages` K-steps of
// x's and y's blocks in shared-memory slots (4 by default, 3 for f32), and its body issues the
// step's wgmma into the f32 accumulator and waits only for the step before (wgmma_wait(1)), so
// each slot is released a step late (delay_release = 1). After the pipeline the accumulator is
// stored to the output tile. Compare ws_matmul, which writes the same product by hand with a
// producer warpgroup and two consumers.
#include "examples/registry.h"
#include "examples/support.h"
#include "pallas/gpu.h"

namespace pallas::examples::pipeline_matmul {
namespace {

namespace pl = ::pallas;
namespace plgpu = ::pallas::gpu;

constexpr int64_t kTileM = 128;
constexpr int64_t kDefaultSize = 256;
constexpr int64_t kStepBytes = 128;  // a K-step is one 128-byte row of x's block: wgmma's swizzle panel

Problem build(const RunOptions& opts) {
  require_dtype("pipeline_matmul", opts, {DType::F32, DType::BF16, DType::F16});
  if (opts.backend == "tpu-interpret")
    throw UsageError("pipeline_matmul is a gpu::kernel (an emit_pipeline around wgmma): run it with --backend "
                     "reference (the GPU interpreter), gpu or gpu-emulate, not tpu-interpret");
  if (opts.cluster != 0 || opts.cluster_rows != 0 || opts.persistent != 0 || opts.tile_n != 0)
    throw UsageError("pipeline_matmul takes --stages only (its tiles are fixed; --cluster, --cluster-rows, "
                     "--persistent and --tile-n are ws_matmul's)");
  const int64_t n = size_or_default("pipeline_matmul", opts, kDefaultSize);
  const bool f32 = opts.dtype == DType::F32;
  const int64_t tile_n = f32 ? 64 : 128, step_k = kStepBytes / itemsize(opts.dtype);
  if (n <= 0 || n % kTileM != 0)
    throw UsageError("pipeline_matmul: size must be a positive multiple of " + std::to_string(kTileM) +
                     " (the CTA's tile), got " + std::to_string(n));
  const int stages = opts.stages != 0 ? opts.stages : (f32 ? 3 : 4);
  if (stages < 2)
    throw UsageError("pipeline_matmul: --stages must be at least 2 (a slot is released a step late, after the "
                     "wgmma reading it), got " + std::to_string(stages));
  const int64_t k_steps = n / step_k;
  pl::CallOptions options = on_backend({.scratch_shapes = {plgpu::ACC({kTileM, tile_n})}, .name = "pipeline_matmul"}, opts);
  pl::PallasCall call = plgpu::kernel(
      [=](pl::Ref x, pl::Ref y, pl::Ref z, pl::Ref acc) {
        const pl::Value i = plgpu::axis_index("i"), j = plgpu::axis_index("j");
        acc[pl::all] = pl::zeros({kTileM, tile_n}, pl::f32);
        plgpu::emit_pipeline(
            [&](const std::vector<pl::Value>&, const std::vector<pl::Ref>& blocks) {
              plgpu::wgmma(acc, blocks[0], blocks[1]);
              plgpu::wgmma_wait(1);  // the step before's product is done: its slots go back
            },
            {.grid = {k_steps},
             .in_specs = {pl::BlockSpec({kTileM, step_k}, [i](pl::Value k) { return pl::Indices{i, k}; }),
                          pl::BlockSpec({step_k, tile_n}, [j](pl::Value k) { return pl::Indices{k, j}; })},
             .max_concurrent_steps = stages,
             .delay_release = 1})({x, y});
        // (The pipeline waited for the last product.)
        z.at(pl::ds(i * kTileM, kTileM), pl::ds(j * tile_n, tile_n))[pl::all] = acc[pl::all];
      },
      {pl::ShapeDtype({n, n}, pl::f32)}, plgpu::Mesh{.grid = {n / kTileM, n / tile_n}, .grid_names = {"i", "j"}}, options);
  // f32 sums of exact products in another order than BLAS: slack proportional to K.
  return square_matmul_problem("pipeline_matmul", opts, n, call, {1e-4, 4e-6 * static_cast<double>(n)});
}

}  // namespace

Example example() {
  return {"pipeline_matmul",
          "gpu::kernel matmul around gpu::emit_pipeline: the pipeline keeps --stages K-steps of x and y in SMEM "
          "slots while each step's wgmma runs on, its slots released a step late",
          build, /*multi_device=*/false, /*gpu_grid_options=*/true};
}

}  // namespace pallas::examples::pipeline_matmul
