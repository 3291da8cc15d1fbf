// Example `lane_sort`: sorts keys with their values, one vector of 16 lanes at a time, on the
// SparseCore's vector subcores (plsc::kernel over a VectorSubcoreMesh of --cores SparseCores x
// 16 subcores). Chunk k of the arrays (lanes k*L .. k*L+L, L = num_lanes) comes out sorted by
// key, descending, with each value still beside its key; equal keys keep their order (the sort
// is stable). Lanes whose key is negative are masked off and go last, in their original order;
// the third output marks the valid lanes.
//
// Worker w = core * 16 + subcore takes chunks w, w + W, ...: copies the keys and values into
// VMEM, loads them as vectors, plsc::sort_key_val, stores and copies back. --size is the number
// of chunks. TPU interpret mode only.
#include <algorithm>
#include <numeric>

#include "examples/registry.h"
#include "examples/support.h"
#include "pallas/sparse_core.h"

namespace pallas::examples::lane_sort {
namespace {

namespace pl = ::pallas;
namespace pltpu = ::pallas::tpu;
namespace plsc = ::pallas::tpu_sc;

constexpr int64_t kDefaultChunks = 64;

// Refs: keys, values (HBM), then the outputs: keys, values, valid (HBM); scratch: one chunk
// of keys, values and the valid flags (as i32) in VMEM.
void body(int64_t chunks, int64_t lanes, int subcores, int64_t workers, const pl::Ref& keys,
          const pl::Ref& values, const pl::Ref& out_keys, const pl::Ref& out_values,
          const pl::Ref& out_valid, const pl::Ref& k_buf, const pl::Ref& v_buf, const pl::Ref& m_buf) {
  for_each_subcore_chunk(chunks, subcores, workers, [&](pl::Value chunk) {
    const pl::Value at = chunk * static_cast<int32_t>(lanes);
    pltpu::sync_copy(keys.at(pl::ds(at, lanes)), k_buf);
    pltpu::sync_copy(values.at(pl::ds(at, lanes)), v_buf);
    pl::Value k = k_buf[pl::all];
    std::vector<pl::Value> sorted =
        plsc::sort_key_val(k, v_buf[pl::all], {.mask = k >= 0.0f, .descending = true});
    k_buf[pl::all] = sorted[0];
    v_buf[pl::all] = sorted[1];
    m_buf[pl::all] = sorted[2].astype(pl::i32);
    pltpu::sync_copy(k_buf, out_keys.at(pl::ds(at, lanes)));
    pltpu::sync_copy(v_buf, out_values.at(pl::ds(at, lanes)));
    pltpu::sync_copy(m_buf, out_valid.at(pl::ds(at, lanes)));
  });
}

// Per chunk: a stable sort of the valid lanes by descending key, then the others in order.
std::vector<Array> reference(int64_t lanes, const std::vector<Array>& in) {
  const float* k = in[0].data<float>();
  const int32_t* v = in[1].data<int32_t>();
  const int64_t n = in[0].size();
  std::vector<double> ok(static_cast<size_t>(n)), ov(static_cast<size_t>(n)), om(static_cast<size_t>(n));
  for (int64_t c = 0; c < n; c += lanes) {
    std::vector<int64_t> order(static_cast<size_t>(lanes));
    std::iota(order.begin(), order.end(), c);
    std::stable_partition(order.begin(), order.end(), [&](int64_t i) { return k[i] >= 0.0f; });
    auto valid_end = std::find_if(order.begin(), order.end(), [&](int64_t i) { return k[i] < 0.0f; });
    std::stable_sort(order.begin(), valid_end, [&](int64_t a, int64_t b) { return k[a] > k[b]; });
    for (int64_t i = 0; i < lanes; ++i) {
      const int64_t src = order[static_cast<size_t>(i)];
      ok[static_cast<size_t>(c + i)] = k[src];
      ov[static_cast<size_t>(c + i)] = v[src];
      om[static_cast<size_t>(c + i)] = k[src] >= 0.0f ? 1 : 0;
    }
  }
  return {Array::from_values({n}, DType::F64, ok), Array::from_values({n}, DType::F64, ov),
          Array::from_values({n}, DType::F64, om)};
}

Problem build(const RunOptions& opts) {
  require_tpu_interpret("lane_sort", opts);
  require_dtype("lane_sort", opts, {DType::F32});
  const int cores = cores_or_default("lane_sort", opts, plsc::sparse_core_info().num_cores);
  const int subcores = plsc::sparse_core_info().num_subcores;
  const int64_t lanes = plsc::sparse_core_info().num_lanes;
  const int64_t chunks = size_or_default("lane_sort", opts, kDefaultChunks);
  if (chunks < 1) throw UsageError("lane_sort: size (the number of chunks) must be positive");
  const int64_t n = chunks * lanes;
  const int64_t workers = static_cast<int64_t>(cores) * subcores;
  CallOptions o = on_backend({.scratch_shapes = {pltpu::VMEM({lanes}, pl::f32), pltpu::VMEM({lanes}, pl::i32),
                                                 pltpu::VMEM({lanes}, pl::i32)},
                              .name = "lane_sort"},
                             opts);
  pl::PallasCall call = plsc::kernel(
      [=](pl::Ref keys, pl::Ref values, pl::Ref ok, pl::Ref ov, pl::Ref om, pl::Ref kb, pl::Ref vb,
          pl::Ref mb) { body(chunks, lanes, subcores, workers, keys, values, ok, ov, om, kb, vb, mb); },
      {pl::ShapeDtype({n}, pl::f32), pl::ShapeDtype({n}, pl::i32), pl::ShapeDtype({n}, pl::i32)},
      plsc::VectorSubcoreMesh{.num_cores = cores, .num_subcores = subcores}, o);
  // Small integer keys (many ties, so stability shows) from -3 to 8; negative ones masked off.
  Array keys = Array::random_uniform({n}, pl::i32, input_seed(opts, 0), -3, 9).astype(pl::f32);
  Array values = Array::random_uniform({n}, pl::i32, input_seed(opts, 1), 0, 1 << 20);
  return Problem{
      .name = "lane_sort",
      .signature = "f32" + dims({n}) + " keys, i32 values, " + std::to_string(lanes) +
                   " lanes on " + std::to_string(cores) + "x" + std::to_string(subcores) + " subcores",
      .backend = opts.backend,
      .call = call,
      .inputs = {keys, values},
      .reference = [lanes](const std::vector<Array>& in) { return reference(lanes, in); },
      .tolerance = {0, 0},
      .flops = 0,
      .bytes = n * 4 * 5,
      .throughput = Throughput::Bytes,
  };
}

}  // namespace

Example example() {
  return {"lane_sort",
          "SparseCore lane sort: sort_key_val of 16-lane key/value vectors, masked, descending, "
          "stable (--cores SparseCores x 16 subcores, tpu-interpret)",
          build};
}

}  // namespace pallas::examples::lane_sort
