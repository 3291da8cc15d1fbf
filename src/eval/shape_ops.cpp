// Shape ops: each result is the operand read through a strided view (strided_copy), except
// reshape / squeeze / expand_dims, which only relabel a row-major buffer and so share it.
//
// Sharing is safe because evaluation never writes into an Array it produced (Refs get their own
// buffers), exactly as Array::reshaped is meant to be used.
#include <algorithm>
#include <cstring>

#include "eval/eval.h"
#include "ir/shapes.h"
#include "eval/strided.h"

namespace pallas::eval {

namespace {

const std::byte* bytes(const Array& x) { return static_cast<const std::byte*>(x.raw_data()); }

// A fresh array of `shape` holding the view of x starting at element offset `offset` with
// `strides` (in elements).
Array copy_view(const Array& x, const Shape& shape, int64_t offset,
                const std::vector<int64_t>& strides) {
  Array out(shape, x.dtype());
  if (out.size() == 0) return out;  // the offset may point past the end; never form it
  const int esize = itemsize(x.dtype());
  strided_copy(out.raw_data(), bytes(x) + offset * esize, shape, strides, esize);
  return out;
}

}  // namespace

Array broadcast_in_dim(const Array& x, const Shape& shape, const ir::Ints& dims) {
  // Result dims not named in `dims`, and size-1 operand dims, read with stride 0.
  const std::vector<int64_t> xs = row_major_strides(x.shape());
  std::vector<int64_t> strides(shape.size(), 0);
  for (size_t i = 0; i < dims.size(); ++i)
    if (x.shape()[i] != 1) strides[static_cast<size_t>(dims[i])] = xs[i];
  return copy_view(x, shape, 0, strides);
}

Array reshape(const Array& x, const Shape& shape) { return x.reshaped(shape); }

Array transpose(const Array& x, const ir::Ints& permutation) {
  return permute_copy(x, permutation);
}

Array squeeze(const Array& x, const ir::Ints& dims) {
  Shape shape;
  for (int d = 0; d < x.rank(); ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) shape.push_back(x.shape()[d]);
  return x.reshaped(shape);
}

Array expand_dims(const Array& x, const ir::Ints& dims) {
  Shape shape = ir::expanded_shape(x.shape(), dims);
  return x.reshaped(shape);
}

Array concatenate(std::span<const Array> xs, int64_t axis) {
  if (xs.empty()) throw InternalError("concatenate: no operands");
  Shape shape = xs[0].shape();
  const auto ax = static_cast<size_t>(axis);
  shape[ax] = 0;
  for (const Array& x : xs) shape[ax] += x.shape()[ax];
  Array out(shape, xs[0].dtype());
  if (out.size() == 0) return out;
  // Viewed as [outer, axis * inner]: each operand contributes one contiguous chunk per outer
  // index, so the whole op is a sequence of memcpys.
  int64_t outer = 1;
  for (size_t d = 0; d < ax; ++d) outer *= shape[d];
  const int64_t esize = itemsize(out.dtype());
  std::vector<int64_t> chunk(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) chunk[i] = xs[i].size() / outer * esize;
  auto* dst = static_cast<std::byte*>(out.raw_data());
  for (int64_t o = 0; o < outer; ++o)
    for (size_t i = 0; i < xs.size(); ++i) {
      if (chunk[i] == 0) continue;
      std::memcpy(dst, bytes(xs[i]) + o * chunk[i], static_cast<size_t>(chunk[i]));
      dst += chunk[i];
    }
  return out;
}

Array slice(const Array& x, const ir::Ints& start, const ir::Ints& limit, const ir::Ints& strides) {
  const std::vector<int64_t> xs = row_major_strides(x.shape());
  Shape shape(xs.size());
  std::vector<int64_t> st(xs.size());
  int64_t offset = 0;
  for (size_t d = 0; d < xs.size(); ++d) {
    shape[d] = (limit[d] - start[d] + strides[d] - 1) / strides[d];
    st[d] = xs[d] * strides[d];
    offset += start[d] * xs[d];
  }
  return copy_view(x, shape, offset, st);
}

Array dynamic_slice(const Array& x, const ir::Ints& start, const ir::Ints& sizes) {
  const std::vector<int64_t> xs = row_major_strides(x.shape());
  int64_t offset = 0;
  for (size_t d = 0; d < xs.size(); ++d) {
    // XLA clamps so the window fits: start in [0, dim - size].
    const int64_t s = std::clamp<int64_t>(start[d], 0, x.shape()[d] - sizes[d]);
    offset += s * xs[d];
  }
  return copy_view(x, sizes, offset, xs);
}

Array rev(const Array& x, const ir::Ints& dims) {
  std::vector<int64_t> st = row_major_strides(x.shape());
  if (x.size() == 0) return Array(x.shape(), x.dtype());
  int64_t offset = 0;
  for (int64_t d : dims) {
    const auto k = static_cast<size_t>(d);
    offset += (x.shape()[k] - 1) * st[k];  // start at the last element, walk backwards
    st[k] = -st[k];
  }
  return copy_view(x, x.shape(), offset, st);
}

}  // namespace pallas::eval
