// Helpers for the eval rule tests: plain multi-index loops and exact comparisons. Nothing here
// uses the code under test (src/eval), so the references built from them are independent.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "pallas/array.h"

namespace pallas::testutil {

using Index = std::vector<int64_t>;

// Calls f(index) for every multi-index of `shape` in row-major order.
inline void for_each_index(const Shape& shape, const std::function<void(const Index&)>& f) {
  for (int64_t n : shape)
    if (n == 0) return;
  Index idx(shape.size(), 0);
  for (;;) {
    f(idx);
    size_t d = shape.size();
    for (; d > 0; --d) {
      if (++idx[d - 1] < shape[d - 1]) break;
      idx[d - 1] = 0;
    }
    if (d == 0) return;
  }
}

inline int64_t flat_of(const Shape& shape, const Index& idx) {
  int64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + idx[d];
  return f;
}

inline const unsigned char* elem_ptr(const Array& a, int64_t flat) {
  return static_cast<const unsigned char*>(a.raw_data()) + flat * itemsize(a.dtype());
}

// Same dtype, shape and bytes; on failure names the first differing element.
inline ::testing::AssertionResult same_bits(const Array& actual, const Array& expected) {
  if (actual.dtype() != expected.dtype() || actual.shape() != expected.shape())
    return ::testing::AssertionFailure()
           << "got " << actual.shape_dtype().to_string() << ", expected "
           << expected.shape_dtype().to_string();
  const int es = itemsize(actual.dtype());
  for (int64_t i = 0; i < actual.size(); ++i)
    if (std::memcmp(elem_ptr(actual, i), elem_ptr(expected, i), static_cast<size_t>(es)) != 0)
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << actual.scalar_at_flat(i).to_string()
             << ", expected " << expected.scalar_at_flat(i).to_string();
  return ::testing::AssertionSuccess();
}

// An array of `shape` whose element at index i is x's element at src(i) (byte copy): the
// reference for every shape op.
inline Array gather_reference(const Array& x, const Shape& shape,
                              const std::function<Index(const Index&)>& src) {
  Array out(shape, x.dtype());
  const int es = itemsize(x.dtype());
  for_each_index(shape, [&](const Index& i) {
    std::memcpy(static_cast<unsigned char*>(out.raw_data()) + flat_of(shape, i) * es,
                elem_ptr(x, flat_of(x.shape(), src(i))), static_cast<size_t>(es));
  });
  return out;
}

// A random array of any dtype (bool as 0/1, ints over a small signed range, floats normal).
inline Array random_array(const Shape& shape, DType t, uint64_t seed) {
  if (t == DType::Bool) return Array::random_uniform(shape, t, seed, 0, 2);
  if (is_unsigned_int(t)) return Array::random_uniform(shape, t, seed, 0, 100);
  if (is_integer(t)) return Array::random_uniform(shape, t, seed, -100, 100);
  return Array::random_normal(shape, t, seed);
}

}  // namespace pallas::testutil
