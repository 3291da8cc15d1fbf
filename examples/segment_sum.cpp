// Example `segment_sum`: a segment sum by scatter-add DMAs on the SparseCore's vector subcores
// (plsc::kernel over a VectorSubcoreMesh of --cores SparseCores x 16 subcores):
// out[s] = init[s] + sum of values[i] over the rows i with segment_ids[i] == s.
//
// The rows are cut into chunks of 16; worker w = core * 16 + subcore takes chunks w, w + W, ...
// Per chunk it copies the 16 rows and their segment ids into VMEM and scatter-adds the rows into
// the output in HBM (`sync_copy(rows, out.at(ids), {.add = true})`). The output is `init`
// (aliased), so every worker adds into the same array at once: the DMA engine's adds are
// atomic, and the race detector accepts concurrent scatter-adds (it reports a scatter-add that
// meets a plain read or write). --size is the number of rows (a multiple of 16); there are
// max(1, rows / 16) segments of 32 f32. TPU interpret mode only.
#include <algorithm>

#include "examples/registry.h"
#include "examples/support.h"
#include "pallas/sparse_core.h"

namespace pallas::examples::segment_sum {
namespace {

namespace pl = ::pallas;
namespace pltpu = ::pallas::tpu;
namespace plsc = ::pallas::tpu_sc;

constexpr int64_t kChunk = 16;  // rows per scatter-add
constexpr int64_t kDim = 32;
constexpr int64_t kDefaultRows = 1024;

// Refs: values, segment ids, init (aliased to out), out (HBM); scratch: a chunk's ids and rows.
void body(int64_t chunks, int subcores, int64_t workers, const pl::Ref& values,
          const pl::Ref& segment_ids, const pl::Ref& out, const pl::Ref& idx, const pl::Ref& rows) {
  for_each_subcore_chunk(chunks, subcores, workers, [&](pl::Value k) {
    pltpu::sync_copy(segment_ids.at(pl::ds(k * kChunk, kChunk)), idx);
    pltpu::sync_copy(values.at(pl::ds(k * kChunk, kChunk)), rows);
    pltpu::sync_copy(rows, out.at(idx), {.add = true});
  });
}

std::vector<Array> reference(const std::vector<Array>& in) {
  const Array& values = in[0];
  const Array& ids = in[1];
  const Array& init = in[2];
  std::vector<double> out = init.to_doubles();
  const float* v = values.data<float>();
  const int32_t* id = ids.data<int32_t>();
  for (int64_t i = 0; i < ids.size(); ++i)
    for (int64_t c = 0; c < kDim; ++c) out[static_cast<size_t>(id[i] * kDim + c)] += v[i * kDim + c];
  return {Array::from_values(init.shape(), DType::F64, out)};
}

Problem build(const RunOptions& opts) {
  require_tpu_interpret("segment_sum", opts);
  require_dtype("segment_sum", opts, {DType::F32});
  const int cores = cores_or_default("segment_sum", opts, plsc::sparse_core_info().num_cores);
  const int subcores = plsc::sparse_core_info().num_subcores;
  const int64_t rows = size_or_default("segment_sum", opts, kDefaultRows);
  if (rows < kChunk || rows % kChunk != 0)
    throw UsageError("segment_sum: size (the number of rows) must be a positive multiple of 16, got " +
                     std::to_string(rows));
  const int64_t segments = std::max<int64_t>(1, rows / 16);
  const int64_t chunks = rows / kChunk;
  const int64_t workers = static_cast<int64_t>(cores) * subcores;
  CallOptions o = on_backend({.scratch_shapes = {pltpu::VMEM({kChunk}, pl::i32),
                                                 pltpu::VMEM({kChunk, kDim}, pl::f32)},
                              .input_output_aliases = {{2, 0}},
                              .name = "segment_sum"},
                             opts);
  pl::PallasCall call = plsc::kernel(
      [=](pl::Ref values, pl::Ref ids, pl::Ref init, pl::Ref out, pl::Ref idx, pl::Ref chunk) {
        (void)init;  // aliased to out
        body(chunks, subcores, workers, values, ids, out, idx, chunk);
      },
      {pl::ShapeDtype({segments, kDim}, pl::f32)},
      plsc::VectorSubcoreMesh{.num_cores = cores, .num_subcores = subcores}, o);
  return Problem{
      .name = "segment_sum",
      .signature = "f32" + dims({rows, kDim}) + " into " + std::to_string(segments) +
                   " segments on " + std::to_string(cores) + "x" + std::to_string(subcores) +
                   " subcores",
      .backend = opts.backend,
      .call = call,
      .inputs = {Array::random_normal({rows, kDim}, pl::f32, input_seed(opts, 0)),
                 Array::random_uniform({rows}, pl::i32, input_seed(opts, 1), 0,
                                       static_cast<double>(segments)),
                 Array::random_normal({segments, kDim}, pl::f32, input_seed(opts, 2))},
      .reference = reference,
      // About 16 f32 additions per output in an order the schedule picks.
      .tolerance = {1e-5, 1e-4},
      .flops = rows * kDim,
      .bytes = rows * kDim * 4 * 2 + rows * 4 + segments * kDim * 4,
      .throughput = Throughput::Bytes,
  };
}

}  // namespace

Example example() {
  return {"segment_sum",
          "SparseCore segment sum: scatter-adds rows into their segments by indirect DMA from "
          "every subcore at once (--cores SparseCores x 16 subcores, tpu-interpret)",
          build};
}

}  // namespace pallas::examples::segment_sum
