// Example `add`: elementwise add with (64, 128) blocks that do not divide the (size, size + 37)
// arrays, so the last row and column of blocks hang over the edge: their reads see padding and
// their writes past the end are dropped.
#include "examples/registry.h"
#include "examples/support.h"

namespace pallas::examples::add {
namespace {

namespace pl = ::pallas;

constexpr int64_t kDefaultSize = 300;
constexpr int64_t kBlockRows = 64, kBlockCols = 128;

std::vector<Array> reference(const std::vector<Array>& in) {
  std::vector<double> x = in[0].to_doubles(), y = in[1].to_doubles();
  Array out(in[0].shape(), DType::F64);
  double* o = out.data<double>();
  for (size_t k = 0; k < x.size(); ++k) o[k] = x[k] + y[k];
  return {out};
}

Problem build(const RunOptions& opts) {
  require_dtype("add", opts, {DType::F32, DType::BF16});
  const int64_t rows = size_or_default("add", opts, kDefaultSize), cols = rows + 37;
  const pl::BlockSpec spec({kBlockRows, kBlockCols},
                           [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; });
  pl::PallasCall call = pl::pallas_call(
      [](pl::Ref x, pl::Ref y, pl::Ref o) { o[pl::all] = x[pl::all] + y[pl::all]; },
      pl::ShapeDtype({rows, cols}, opts.dtype),
      on_backend({.grid = {pl::cdiv(rows, kBlockRows), pl::cdiv(cols, kBlockCols)},
                  .in_specs = {spec, spec},
                  .out_specs = {spec},
                  .name = "add"},
                 opts));
  const int64_t n = rows * cols, item = itemsize(opts.dtype);
  return Problem{
      .name = "add",
      .signature = std::string(dtype_name(opts.dtype)) + dims({rows, cols}) + "+" +
                   dims({rows, cols}),
      .backend = opts.backend,
      .call = call,
      .inputs = {Array::random_normal({rows, cols}, opts.dtype, input_seed(opts, 0)),
                 Array::random_normal({rows, cols}, opts.dtype, input_seed(opts, 1))},
      .reference = reference,
      // One rounding of an exact sum to the output dtype: half an ulp, relative to the result.
      .tolerance = opts.dtype == DType::BF16 ? Tolerance{4e-3, 1e-30} : Tolerance{1e-6, 1e-30},
      .flops = n,
      .bytes = 3 * n * item,
      .throughput = Throughput::Bytes,
  };
}

}  // namespace

Example example() {
  return {"add", "elementwise add of two (size, size+37) arrays in (64, 128) blocks (padded edges)",
          build};
}

}  // namespace pallas::examples::add
