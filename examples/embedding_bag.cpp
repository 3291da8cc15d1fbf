// Example `embedding_bag`: an embedding-bag lookup on the SparseCore's vector subcores
// (plsc::kernel over a VectorSubcoreMesh of --cores SparseCores x 16 subcores). Bag b sums the
// rows ids[b*8 .. b*8+8) of the table: out[b] = sum_l table[ids[b*8 + l]].
//
// The bags are cut into chunks of 8 bags (64 ids); worker w = core * 16 + subcore takes chunks
// w, w + W, w + 2W, ... (W workers). Per chunk: the ids are copied into VMEM, the 64 rows are
// gathered from HBM by one indirect DMA (`table.at(ids)`), summed per bag, and the 8 sums copied
// to the output. --size is the number of bags (a multiple of 8); the vocabulary has
// clamp(ids / 10, 1024, 100000) rows of 128 f32. TPU interpret mode only.
#include <algorithm>

#include "examples/registry.h"
#include "examples/support.h"
#include "pallas/sparse_core.h"

namespace pallas::examples::embedding_bag {
namespace {

namespace pl = ::pallas;
namespace pltpu = ::pallas::tpu;
namespace plsc = ::pallas::tpu_sc;

constexpr int64_t kBag = 8;          // ids per bag
constexpr int64_t kChunkBags = 8;    // bags per gather
constexpr int64_t kDim = 128;        // embedding width
constexpr int64_t kDefaultBags = 512;

// Refs: table, ids, out (HBM); scratch: ids of one chunk, its gathered rows, its bag sums.
void body(int64_t chunks, int subcores, int64_t workers, const pl::Ref& table, const pl::Ref& ids,
          const pl::Ref& out, const pl::Ref& idx, const pl::Ref& rows, const pl::Ref& sums) {
  for_each_subcore_chunk(chunks, subcores, workers, [&](pl::Value k) {
    pltpu::sync_copy(ids.at(pl::ds(k * (kChunkBags * kBag), kChunkBags * kBag)), idx);
    pltpu::sync_copy(table.at(idx), rows);
    sums[pl::all] = pl::sum(pl::reshape(rows[pl::all], {kChunkBags, kBag, kDim}), {1});
    pltpu::sync_copy(sums, out.at(pl::ds(k * kChunkBags, kChunkBags)));
  });
}

std::vector<Array> reference(const std::vector<Array>& in) {
  const Array& table = in[0];
  const Array& ids = in[1];
  const int64_t bags = ids.size() / kBag;
  std::vector<double> out(static_cast<size_t>(bags * kDim), 0.0);
  const float* t = table.data<float>();
  const int32_t* id = ids.data<int32_t>();
  for (int64_t b = 0; b < bags; ++b)
    for (int64_t l = 0; l < kBag; ++l) {
      const float* row = t + static_cast<int64_t>(id[b * kBag + l]) * kDim;
      for (int64_t c = 0; c < kDim; ++c) out[static_cast<size_t>(b * kDim + c)] += row[c];
    }
  return {Array::from_values({bags, kDim}, DType::F64, out)};
}

Problem build(const RunOptions& opts) {
  require_tpu_interpret("embedding_bag", opts);
  require_dtype("embedding_bag", opts, {DType::F32});
  const int cores = cores_or_default("embedding_bag", opts, plsc::sparse_core_info().num_cores);
  const int subcores = plsc::sparse_core_info().num_subcores;
  const int64_t bags = size_or_default("embedding_bag", opts, kDefaultBags);
  if (bags < kChunkBags || bags % kChunkBags != 0)
    throw UsageError("embedding_bag: size (the number of bags) must be a positive multiple of 8, got " +
                     std::to_string(bags));
  const int64_t num_ids = bags * kBag;
  const int64_t vocab = std::clamp<int64_t>(num_ids / 10, 1024, 100000);
  const int64_t chunks = bags / kChunkBags;
  const int64_t workers = static_cast<int64_t>(cores) * subcores;
  CallOptions o = on_backend(
      {.scratch_shapes = {pltpu::VMEM({kChunkBags * kBag}, pl::i32),
                          pltpu::VMEM({kChunkBags * kBag, kDim}, pl::f32),
                          pltpu::VMEM({kChunkBags, kDim}, pl::f32)},
       .name = "embedding_bag"},
      opts);
  pl::PallasCall call = plsc::kernel(
      [=](pl::Ref table, pl::Ref ids, pl::Ref out, pl::Ref idx, pl::Ref rows, pl::Ref sums) {
        body(chunks, subcores, workers, table, ids, out, idx, rows, sums);
      },
      {pl::ShapeDtype({bags, kDim}, pl::f32)},
      plsc::VectorSubcoreMesh{.num_cores = cores, .num_subcores = subcores}, o);
  Array ids = Array::random_uniform({num_ids}, pl::i32, input_seed(opts, 1), 0, static_cast<double>(vocab));
  return Problem{
      .name = "embedding_bag",
      .signature = "f32" + dims({vocab, kDim}) + " gather i32" + dims({num_ids}) + " on " +
                   std::to_string(cores) + "x" + std::to_string(subcores) + " subcores",
      .backend = opts.backend,
      .call = call,
      .inputs = {Array::random_normal({vocab, kDim}, pl::f32, input_seed(opts, 0)), ids},
      .reference = reference,
      // Eight f32 additions per output, of N(0, 1) values.
      .tolerance = {1e-5, 1e-5},
      .flops = num_ids * kDim,
      .bytes = num_ids * kDim * 4 + num_ids * 4 + bags * kDim * 4,
      .throughput = Throughput::Bytes,
  };
}

}  // namespace

Example example() {
  return {"embedding_bag",
          "SparseCore embedding-bag: gathers 8 table rows per bag by indirect DMA and sums them "
          "(--cores SparseCores x 16 subcores, tpu-interpret)",
          build};
}

}  // namespace pallas::examples::embedding_bag
