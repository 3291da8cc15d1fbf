// Strided byte copies shared by the shape ops and dot_general's operand layout changes.
//
// Every shape op that only moves elements (broadcast, transpose, slice, rev, ...) is "read the
// operand through a strided view, write a fresh row-major array". This is that one loop, written
// once and dtype-agnostic by element size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "pallas/array.h"

namespace pallas::eval {

// Copies the view of `shape` whose element (i0, i1, ...) is at src + (sum_d i_d * strides[d]) *
// esize into dst, contiguous and row-major. Strides are in elements and may be 0 (broadcast) or
// negative (rev); every addressed element must lie inside src's buffer. Size-1 dims are dropped
// and dims that are contiguous with each other are merged, so the inner loop is a memcpy of the
// longest run the view allows.
void strided_copy(void* dst, const void* src, std::span<const int64_t> shape,
                  std::span<const int64_t> strides, int esize);

// The strides (in elements) under which a view of `shape` with `strides` reads as `new_shape`
// (same element count), its elements in the same row-major order — or nullopt where the dims
// merged into one are not evenly spaced (NumPy's no-copy reshape rule). Dims of size 1 are free;
// an empty view reshapes to any shape.
std::optional<std::vector<int64_t>> reshaped_strides(std::span<const int64_t> shape, std::span<const int64_t> strides,
                                                     std::span<const int64_t> new_shape);

// x with its dimensions permuted (result dim i = x dim perm[i]), as a fresh array.
Array permute_copy(const Array& x, std::span<const int64_t> perm);

}  // namespace pallas::eval
