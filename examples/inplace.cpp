// Example `inplace`: input_output_aliases {0: 0} makes the output x's own buffer, so the call
// updates x in place (x += 2 * delta) over a grid of row blocks, without a second array.
#include "examples/registry.h"
#include "examples/support.h"

namespace pallas::examples::inplace {
namespace {

namespace pl = ::pallas;

constexpr int64_t kDefaultSize = 256;
constexpr int64_t kCols = 128, kBlockRows = 8;

void kernel(const pl::Ref& x, const pl::Ref& delta, const pl::Ref& o) {
  o[pl::all] = x[pl::all] + delta[pl::all] * 2.0f;
}

std::vector<Array> reference(const std::vector<Array>& in) {
  const std::vector<double> x = in[0].to_doubles(), d = in[1].to_doubles();
  Array out(in[0].shape(), DType::F64);
  double* o = out.data<double>();
  for (size_t k = 0; k < x.size(); ++k) o[k] = x[k] + 2 * d[k];
  return {out};
}

std::string check_aliasing(const std::vector<Array>& inputs, const std::vector<Array>& outputs) {
  if (outputs.at(0).shares_buffer_with(inputs.at(0))) return "";
  return "inplace: the output does not share x's buffer (input_output_aliases {0: 0} should "
         "update x in place)";
}

Problem build(const RunOptions& opts) {
  require_dtype("inplace", opts, {DType::F32, DType::BF16});
  const int64_t rows = size_or_default("inplace", opts, kDefaultSize);
  const pl::BlockSpec spec({kBlockRows, kCols}, [](pl::Value i) { return pl::Indices{i, 0}; });
  pl::PallasCall call = pl::pallas_call(
      kernel, pl::ShapeDtype({rows, kCols}, opts.dtype),
      on_backend({.grid = {pl::cdiv(rows, kBlockRows)},
                  .in_specs = {spec, spec},
                  .out_specs = {spec},
                  .input_output_aliases = {{0, 0}},
                  .name = "inplace"},
                 opts));
  const int64_t n = rows * kCols;
  return Problem{
      .name = "inplace",
      .signature = std::string(dtype_name(opts.dtype)) + dims({rows, kCols}) + " += 2*" +
                   dims({rows, kCols}),
      .backend = opts.backend,
      .call = call,
      .inputs = {Array::random_normal({rows, kCols}, opts.dtype, input_seed(opts, 0)),
                 Array::random_normal({rows, kCols}, opts.dtype, input_seed(opts, 1))},
      .reference = reference,
      // 2 * delta is exact; the sum rounds once to the dtype: half an ulp of the result.
      .tolerance = opts.dtype == DType::BF16 ? Tolerance{4e-3, 1e-30} : Tolerance{1e-6, 1e-30},
      .extra_check = check_aliasing,
      .flops = 2 * n,
      .bytes = 3 * n * itemsize(opts.dtype),
      .throughput = Throughput::Bytes,
  };
}

}  // namespace

Example example() {
  return {"inplace", "x += 2 * delta in place through input_output_aliases {0: 0}, row blocks",
          build};
}

}  // namespace pallas::examples::inplace
