// Example `attention`: attention softmax(q k^T / sqrt(d)) v written as a pallas_call, the shape of
// Pallas TPU's flash attention: a grid of (head, q block, k block), the k axis sequential (each
// output block sees its k blocks in a row), the running row max m, row sum l and output
// accumulator in scratch across it (the online softmax). Per k block:
//   s = q k^T / sqrt(d)                   (128 x 64 scores, f32)
//   m_new = max(m, rowmax(s)), alpha = exp(m - m_new), p = exp(s - m_new)
//   l = alpha l + rowsum(p), acc = alpha acc + p v, m = m_new
// and after the last, o = acc / l. The same source runs on every backend; compiled for a GPU with
// bf16 or f16 inputs, both products run on wgmma with their results in registers, p taken from
// its registers by p v (docs/GPU.md, register tiles). The math runs in f32 whatever the inputs'
// dtype; the output has the inputs' dtype.
#include <cmath>
#include <limits>

#include "examples/registry.h"
#include "examples/support.h"

namespace pallas::examples::attention {
namespace {

namespace pl = ::pallas;

constexpr int64_t kHeadDim = 64, kBlockQ = 128, kBlockKv = 64, kHeads = 2;
constexpr int64_t kDefaultSize = 256;  // the sequence length of q and of k / v

void kernel(const pl::Ref& q, const pl::Ref& k, const pl::Ref& v, const pl::Ref& o, const pl::Ref& m_scr,
            const pl::Ref& l_scr, const pl::Ref& acc) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  pl::when(pl::program_id(2) == 0, [&] {
    m_scr[pl::all] = pl::full({kBlockQ, 1}, pl::f32, -std::numeric_limits<double>::infinity());
    l_scr[pl::all] = 0.0f;
    acc[pl::all] = 0.0f;
  });
  const pl::Value s = pl::dot(q[pl::all], k[pl::all], {.trans_b = true, .preferred = pl::f32}) * scale;
  const pl::Value m_prev = m_scr[pl::all];
  const pl::Value m_new = pl::maximum(m_prev, pl::max(s, {1}, /*keepdims=*/true));
  const pl::Value alpha = pl::exp(m_prev - m_new);
  const pl::Value p = pl::exp(s - m_new);
  l_scr[pl::all] = alpha * l_scr[pl::all] + pl::sum(p, {1}, /*keepdims=*/true);
  acc[pl::all] = acc[pl::all] * alpha + pl::dot(p.astype(q.dtype()), v[pl::all], {.preferred = pl::f32});
  m_scr[pl::all] = m_new;
  pl::when(pl::program_id(2) == pl::num_programs(2) - 1,
           [&] { o[pl::all] = (acc[pl::all] / l_scr[pl::all]).astype(o.dtype()); });
}

Problem build(const RunOptions& opts) {
  require_dtype("attention", opts, {DType::F32, DType::BF16, DType::F16});
  const int64_t seq = size_or_default("attention", opts, kDefaultSize);
  if (seq % kBlockQ != 0)
    throw UsageError("attention: size (the sequence length) must be a multiple of " + std::to_string(kBlockQ) +
                     " (the q block), got " + std::to_string(seq));
  const DType dt = opts.dtype;
  const pl::BlockSpec q_block({pl::squeezed, kBlockQ, kHeadDim},
                              [](pl::Value h, pl::Value i, pl::Value) { return pl::Indices{h, i, 0}; });
  const pl::BlockSpec kv_block({pl::squeezed, kBlockKv, kHeadDim},
                               [](pl::Value h, pl::Value, pl::Value j) { return pl::Indices{h, j, 0}; });
  const Shape shape{kHeads, seq, kHeadDim};
  pl::PallasCall call = pl::pallas_call(
      kernel, pl::ShapeDtype(shape, dt),
      on_backend({.grid = {kHeads, seq / kBlockQ, seq / kBlockKv},
                  .in_specs = {q_block, kv_block, kv_block},
                  .out_specs = {q_block},
                  .scratch_shapes = {{{kBlockQ, 1}, pl::f32, pl::MemorySpace::Vmem},
                                     {{kBlockQ, 1}, pl::f32, pl::MemorySpace::Vmem},
                                     {{kBlockQ, kHeadDim}, pl::f32, pl::MemorySpace::Vmem}},
                  .name = "attention"},
                 opts));
  return attention_problem("attention", opts, shape, call);
}

}  // namespace

Example example() {
  return {"attention",
          "pallas_call attention (online softmax over a sequential k axis, Pallas TPU's flash attention form): on a "
          "GPU both products on wgmma into registers, p v with p in registers",
          build};
}

}  // namespace pallas::examples::attention
