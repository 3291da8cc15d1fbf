// Example `softmax`: a numerically stable softmax of each row of a (size, 256) array, in blocks
// of 8 whole rows (a row never spans two blocks, so each grid point finishes its rows).
#include <cmath>

#include "examples/registry.h"
#include "examples/support.h"

namespace pallas::examples::softmax {
namespace {

namespace pl = ::pallas;

constexpr int64_t kDefaultSize = 64;
constexpr int64_t kCols = 256, kBlockRows = 8;

// Subtracting the row max keeps exp() from overflowing; the math runs in f32 whatever the
// input dtype, and the result is rounded to it once at the end.
void kernel(const pl::Ref& x, const pl::Ref& o) {
  pl::Value v = x[pl::all].astype(pl::f32);                   // (8, 256)
  pl::Value m = pl::expand_dims(pl::max(v, {1}), {1});        // (8, 1)
  pl::Value e = pl::exp(v - m);
  pl::Value s = pl::expand_dims(pl::sum(e, {1}), {1});
  o[pl::all] = (e / s).astype(o.dtype());
}

std::vector<Array> reference(const std::vector<Array>& in) {
  const std::vector<double> x = in[0].to_doubles();
  const int64_t rows = in[0].dim(0), cols = in[0].dim(1);
  Array out(in[0].shape(), DType::F64);
  double* o = out.data<double>();
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = &x[static_cast<size_t>(r * cols)];
    double m = row[0], s = 0;
    for (int64_t c = 1; c < cols; ++c) m = std::max(m, row[c]);
    for (int64_t c = 0; c < cols; ++c) s += std::exp(row[c] - m);
    for (int64_t c = 0; c < cols; ++c) o[r * cols + c] = std::exp(row[c] - m) / s;
  }
  return {out};
}

Problem build(const RunOptions& opts) {
  require_dtype("softmax", opts, {DType::F32, DType::BF16});
  const int64_t rows = size_or_default("softmax", opts, kDefaultSize);
  const pl::BlockSpec spec({kBlockRows, kCols}, [](pl::Value i) { return pl::Indices{i, 0}; });
  pl::PallasCall call = pl::pallas_call(
      kernel, pl::ShapeDtype({rows, kCols}, opts.dtype),
      on_backend({.grid = {pl::cdiv(rows, kBlockRows)},
                  .in_specs = {spec},
                  .out_specs = {spec},
                  .name = "softmax"},
                 opts));
  const int64_t n = rows * kCols;
  return Problem{
      .name = "softmax",
      .signature = std::string(dtype_name(opts.dtype)) + dims({rows, kCols}),
      .backend = opts.backend,
      .call = call,
      .inputs = {Array::random_normal({rows, kCols}, opts.dtype, input_seed(opts, 0))},
      .reference = reference,
      // f32: exp and a 256-term f32 sum (its rounding grows with the row length, bounded by
      // 256 ulps, ~1e-6 in practice); bf16: the final rounding (half an ulp) dominates.
      .tolerance = opts.dtype == DType::BF16 ? Tolerance{5e-3, 1e-6} : Tolerance{3e-5, 1e-8},
      .flops = 5 * n,
      .bytes = 2 * n * itemsize(opts.dtype),
      .throughput = Throughput::Bytes,
  };
}

}  // namespace

Example example() {
  return {"softmax", "numerically stable row softmax of a (size, 256) array, 8 rows per block",
          build};
}

}  // namespace pallas::examples::softmax
