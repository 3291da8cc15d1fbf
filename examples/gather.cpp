// Example `gather`: scalar prefetch. A table of block indices (i32), known before the grid runs,
// chooses which block of the input each output block copies: out block i = x block table[i].
// The index map reads the table, so the data movement itself is data-dependent.
#include "examples/registry.h"
#include "examples/support.h"

namespace pallas::examples::gather {
namespace {

namespace pl = ::pallas;

constexpr int64_t kDefaultSize = 256;
constexpr int64_t kCols = 128, kBlockRows = 8;

// Refs: the prefetched table (whole, in SMEM), then the chosen x block, then the output block.
void kernel(const pl::Ref& /*table*/, const pl::Ref& x, const pl::Ref& o) { o[pl::all] = x[pl::all]; }

std::vector<Array> reference(const std::vector<Array>& in) {
  const Array& table = in[0];
  const Array& x = in[1];
  Array out(x.shape(), x.dtype());
  const int64_t rows = x.dim(0), cols = x.dim(1);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t src =
        static_cast<int64_t>(table.get({r / kBlockRows})) * kBlockRows + r % kBlockRows;
    for (int64_t c = 0; c < cols; ++c) out.set({r, c}, x.get({src, c}));
  }
  return {out};
}

Problem build(const RunOptions& opts) {
  require_dtype("gather", opts, {DType::F32, DType::BF16});
  const int64_t rows = size_or_default("gather", opts, kDefaultSize);
  if (rows % kBlockRows != 0)
    throw UsageError("gather: size (the number of rows) must be a multiple of " +
                     std::to_string(kBlockRows) + " (the block height), got " + std::to_string(rows));
  const int64_t blocks = rows / kBlockRows;
  pl::PallasCall call = pl::pallas_call(
      kernel, pl::ShapeDtype({rows, kCols}, opts.dtype),
      on_backend(
          {.grid_spec = pl::PrefetchScalarGridSpec(
               1, {blocks},
               {pl::BlockSpec({kBlockRows, kCols}, [](pl::Value i, pl::Ref table) { return pl::Indices{table[i], 0}; })},
               {pl::BlockSpec({kBlockRows, kCols}, [](pl::Value i, pl::Ref) { return pl::Indices{i, 0}; })}),
           .name = "gather"},
          opts));
  const int64_t n = rows * kCols;
  return Problem{
      .name = "gather",
      .signature = std::string(dtype_name(opts.dtype)) + dims({rows, kCols}) + " table i32" +
                   dims({blocks}),
      .backend = opts.backend,
      .call = call,
      .inputs = {Array::random_uniform({blocks}, DType::I32, input_seed(opts, 0), 0,
                                       static_cast<double>(blocks)),
                 Array::random_normal({rows, kCols}, opts.dtype, input_seed(opts, 1))},
      .reference = reference,
      .tolerance = {0, 0},  // a copy is exact
      .flops = 0,
      .bytes = 2 * n * itemsize(opts.dtype) + blocks * 4,
      .throughput = Throughput::Bytes,
  };
}

}  // namespace

Example example() {
  return {"gather", "scalar prefetch: output block i copies input block table[i] (random i32 table)",
          build};
}

}  // namespace pallas::examples::gather
