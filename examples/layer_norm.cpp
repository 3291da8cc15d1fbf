// Example `layer_norm`: normalizes each row of a (size, 256) array to zero mean and unit
// variance, then scales by gamma and shifts by beta. Rows are blocked 8 at a time; gamma and
// beta are small, so every grid point sees them whole.
#include <cmath>

#include "examples/registry.h"
#include "examples/support.h"

namespace pallas::examples::layer_norm {
namespace {

namespace pl = ::pallas;

constexpr int64_t kDefaultSize = 64;
constexpr int64_t kCols = 256, kBlockRows = 8;
constexpr double kEps = 1e-5;

// Two passes (mean, then the mean of squared deviations) rather than E[x^2] - E[x]^2, which
// cancels badly when the mean is large. Math in f32, rounded to the output dtype at the end.
void kernel(const pl::Ref& x, const pl::Ref& gamma, const pl::Ref& beta, const pl::Ref& o) {
  const float inv_n = 1.0f / static_cast<float>(x.dim(1));
  pl::Value v = x[pl::all].astype(pl::f32);                          // (8, 256)
  pl::Value mean = pl::expand_dims(pl::sum(v, {1}), {1}) * inv_n;    // (8, 1)
  pl::Value c = v - mean;
  pl::Value var = pl::expand_dims(pl::sum(c * c, {1}), {1}) * inv_n;
  pl::Value y = c * pl::rsqrt(var + static_cast<float>(kEps));
  o[pl::all] = (y * gamma[pl::all].astype(pl::f32) + beta[pl::all].astype(pl::f32)).astype(o.dtype());
}

std::vector<Array> reference(const std::vector<Array>& in) {
  const std::vector<double> x = in[0].to_doubles(), g = in[1].to_doubles(), b = in[2].to_doubles();
  const int64_t rows = in[0].dim(0), cols = in[0].dim(1);
  Array out(in[0].shape(), DType::F64);
  double* o = out.data<double>();
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = &x[static_cast<size_t>(r * cols)];
    double mean = 0, var = 0;
    for (int64_t c = 0; c < cols; ++c) mean += row[c];
    mean /= static_cast<double>(cols);
    for (int64_t c = 0; c < cols; ++c) var += (row[c] - mean) * (row[c] - mean);
    var /= static_cast<double>(cols);
    const double inv_std = 1.0 / std::sqrt(var + kEps);
    for (int64_t c = 0; c < cols; ++c) o[r * cols + c] = (row[c] - mean) * inv_std * g[c] + b[c];
  }
  return {out};
}

Problem build(const RunOptions& opts) {
  require_dtype("layer_norm", opts, {DType::F32, DType::BF16});
  const int64_t rows = size_or_default("layer_norm", opts, kDefaultSize);
  const pl::BlockSpec rows_spec({kBlockRows, kCols}, [](pl::Value i) { return pl::Indices{i, 0}; });
  const pl::BlockSpec whole;  // no block shape: the whole array at every grid point
  pl::PallasCall call = pl::pallas_call(
      kernel, pl::ShapeDtype({rows, kCols}, opts.dtype),
      on_backend({.grid = {pl::cdiv(rows, kBlockRows)},
                  .in_specs = {rows_spec, whole, whole},
                  .out_specs = {rows_spec},
                  .name = "layer_norm"},
                 opts));
  const int64_t n = rows * kCols, item = itemsize(opts.dtype);
  return Problem{
      .name = "layer_norm",
      .signature = std::string(dtype_name(opts.dtype)) + dims({rows, kCols}) + " gamma,beta" +
                   dims({kCols}),
      .backend = opts.backend,
      .call = call,
      .inputs = {Array::random_normal({rows, kCols}, opts.dtype, input_seed(opts, 0)),
                 Array::random_uniform({kCols}, opts.dtype, input_seed(opts, 1), 0.5, 1.5),
                 Array::random_normal({kCols}, opts.dtype, input_seed(opts, 2))},
      .reference = reference,
      // Outputs are O(1) and may cancel to ~0 (y * gamma + beta), hence an atol as large as the
      // rtol; bf16's final rounding is half an ulp.
      .tolerance = opts.dtype == DType::BF16 ? Tolerance{5e-3, 5e-3} : Tolerance{2e-5, 2e-5},
      .flops = 8 * n,
      .bytes = 2 * n * item + 2 * kCols * item,
      .throughput = Throughput::Bytes,
  };
}

}  // namespace

Example example() {
  return {"layer_norm",
          "layer normalization of each row of a (size, 256) array with gamma and beta, eps 1e-5",
          build};
}

}  // namespace pallas::examples::layer_norm
