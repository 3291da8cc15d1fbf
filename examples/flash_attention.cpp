// Example `flash_attention`: attention softmax(q k^T / sqrt(d)) v written as a gpu::kernel, the
// shape of Mosaic GPU's attention kernel (flash attention's online softmax). q, k and v are
// (heads, seq, 64); each CTA (one Pallas thread: a warpgroup) owns 64 rows of q of one head, keeps
// them in shared memory, and streams k and v through gpu::emit_pipeline in blocks of 64 rows (two
// slots each, so the next block's copies run under this block's math). Per block:
//   s = q k^T on the tensor cores — wgmma(s_acc, q_s, k_s.T()): k's block read through a
//       transposed view, as wgmma's K-major b;
//   the running row max m and row sum l are updated, the output accumulator rescaled by
//   exp(m_old - m_new), and p = exp(s - m_new) (cast to the inputs' dtype) times v's block is
//   added to it — wgmma with p in registers;
// and at the end the accumulator divided by l is the CTA's rows of the output. The math runs in
// f32 whatever the inputs' dtype; the output has the inputs' dtype.
#include <cmath>
#include <limits>

#include "examples/registry.h"
#include "examples/support.h"
#include "pallas/gpu.h"

namespace pallas::examples::flash_attention {
namespace {

namespace pl = ::pallas;
namespace plgpu = ::pallas::gpu;

constexpr int64_t kHeadDim = 64, kBlockQ = 64, kBlockKv = 64, kHeads = 2;
constexpr int64_t kDefaultSize = 128;  // the sequence length of q and of k / v

Problem build(const RunOptions& opts) {
  require_dtype("flash_attention", opts, {DType::F32, DType::BF16, DType::F16});
  if (opts.backend == "tpu-interpret")
    throw UsageError("flash_attention is a gpu::kernel (wgmma around gpu::emit_pipeline): run it with --backend "
                     "reference (the GPU interpreter), gpu or gpu-emulate, not tpu-interpret");
  if (opts.cluster != 0 || opts.cluster_rows != 0 || opts.persistent != 0 || opts.tile_n != 0 || opts.stages != 0)
    throw UsageError("flash_attention takes --size (the sequence length) only; --cluster, --cluster-rows, --persistent, "
                     "--tile-n and --stages are the matmuls'");
  const int64_t seq = size_or_default("flash_attention", opts, kDefaultSize);
  if (seq <= 0 || seq % kBlockQ != 0 || seq % kBlockKv != 0)
    throw UsageError("flash_attention: size (the sequence length) must be a positive multiple of " +
                     std::to_string(kBlockQ) + ", got " + std::to_string(seq));
  const DType dt = opts.dtype;
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  pl::CallOptions options = on_backend(
      {.scratch_shapes = {plgpu::SMEM({kBlockQ, kHeadDim}, dt), plgpu::ACC({kBlockQ, kBlockKv}), plgpu::ACC({kBlockQ, kHeadDim}),
                          plgpu::Barrier{}},
       .name = "flash_attention"},
      opts);
  pl::PallasCall call = plgpu::kernel(
      [=](pl::Ref q, pl::Ref k, pl::Ref v, pl::Ref out, pl::Ref q_s, pl::Ref s_acc, pl::Ref o_acc, pl::Ref bar) {
        const pl::Value qi = plgpu::axis_index("q"), h = plgpu::axis_index("h");
        plgpu::copy_gmem_to_smem(q.at(h, pl::ds(qi * kBlockQ, kBlockQ), pl::all), q_s, bar);
        plgpu::barrier_wait(bar);
        o_acc[pl::all] = pl::zeros({kBlockQ, kHeadDim}, pl::f32);
        const pl::BlockSpec kv_block({pl::squeezed, kBlockKv, kHeadDim}, [h](pl::Value j) { return pl::Indices{h, j, 0}; });
        const std::vector<pl::Value> last = plgpu::emit_pipeline(
            [&](const std::vector<pl::Value>&, const std::vector<pl::Ref>& blocks, const std::vector<pl::Value>& carry) {
              const pl::Ref& k_s = blocks[0];
              const pl::Ref& v_s = blocks[1];
              const pl::Value& m = carry[0];  // (rows, 1): the running row max of s
              const pl::Value& l = carry[1];  // (rows, 1): the running row sum of exp(s - m)
              s_acc[pl::all] = pl::zeros({kBlockQ, kBlockKv}, pl::f32);
              plgpu::wgmma(s_acc, q_s, k_s.T());
              plgpu::wgmma_wait(0);
              const pl::Value s = s_acc[pl::all] * scale;
              const pl::Value m_new = pl::maximum(m, pl::max(s, {1}, /*keepdims=*/true));
              const pl::Value alpha = pl::exp(m - m_new);
              const pl::Value p = pl::exp(s - m_new);
              o_acc[pl::all] = o_acc[pl::all] * alpha;
              plgpu::wgmma(o_acc, p.astype(dt), v_s);
              plgpu::wgmma_wait(0);  // (the step's slots go back after the body)
              return std::vector<pl::Value>{m_new, l * alpha + pl::sum(p, {1}, /*keepdims=*/true)};
            },
            {.grid = {seq / kBlockKv},
             .in_specs = {kv_block, kv_block},
             .max_concurrent_steps = 2,
             .init_carry = {pl::full({kBlockQ, 1}, pl::f32, -std::numeric_limits<double>::infinity()),
                            pl::zeros({kBlockQ, 1}, pl::f32)}})({k, v});
        out.at(h, pl::ds(qi * kBlockQ, kBlockQ), pl::all)[pl::all] = (o_acc[pl::all] / last[1]).astype(dt);
      },
      {pl::ShapeDtype({kHeads, seq, kHeadDim}, dt)},
      plgpu::Mesh{.grid = {seq / kBlockQ, kHeads}, .grid_names = {"q", "h"}}, options);
  const Shape shape{kHeads, seq, kHeadDim};
  return attention_problem("flash_attention", opts, shape, call);
}

}  // namespace

Example example() {
  return {"flash_attention",
          "gpu::kernel attention (online softmax): q k^T by wgmma through k's transposed SMEM view, p v with p in "
          "registers, k and v streamed by gpu::emit_pipeline",
          build};
}

}  // namespace pallas::examples::flash_attention
