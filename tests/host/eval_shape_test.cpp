// Shape op rules (src/eval/shape_ops.cpp) against per-element references: each expected array is
// built element by element from the op's definition (gather_reference), for every element size.
#include <gtest/gtest.h>

#include <cmath>

#include "eval/eval.h"
#include "tests/host/eval_test_util.h"

namespace pallas {
namespace {

using testutil::gather_reference;
using testutil::Index;
using testutil::random_array;
using testutil::same_bits;

// One dtype of each element size, plus bool and a 16-bit float.
const std::vector<DType> kDTypes = {f32, i8, bf16, f64, DType::Bool, i64, u16};

TEST(ShapeOps, BroadcastInDim) {
  for (DType t : kDTypes) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    Array x = random_array({3, 1, 4}, t, 1);
    Shape shape = {2, 3, 5, 4};
    ir::Ints dims = {1, 2, 3};
    Array expected = gather_reference(x, shape, [&](const Index& o) {
      Index i(3);
      for (size_t k = 0; k < 3; ++k) i[k] = x.shape()[k] == 1 ? 0 : o[dims[k]];
      return i;
    });
    EXPECT_TRUE(same_bits(eval::broadcast_in_dim(x, shape, dims), expected));
  }
}

TEST(ShapeOps, BroadcastScalarAndColumn) {
  Array s = Array::full({}, f32, 2.5);
  Array b = eval::broadcast_in_dim(s, {3, 4}, {});
  EXPECT_TRUE(same_bits(b, Array::full({3, 4}, f32, 2.5)));
  // A column [3] broadcast along a new last dim: x[i] -> out[i, j].
  Array col = Array::iota({3}, i32);
  Array e = gather_reference(col, {3, 5}, [](const Index& o) { return Index{o[0]}; });
  EXPECT_TRUE(same_bits(eval::broadcast_in_dim(col, {3, 5}, {0}), e));
  // A row along a new first dim.
  Array row = Array::iota({5}, i16);
  Array e2 = gather_reference(row, {3, 5}, [](const Index& o) { return Index{o[1]}; });
  EXPECT_TRUE(same_bits(eval::broadcast_in_dim(row, {3, 5}, {1}), e2));
  // Empty target.
  EXPECT_EQ(eval::broadcast_in_dim(row, {0, 5}, {1}).shape(), (Shape{0, 5}));
}

TEST(ShapeOps, Transpose) {
  for (DType t : kDTypes) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    Array x = random_array({2, 3, 4, 5}, t, 2);
    for (ir::Ints perm : {ir::Ints{3, 2, 1, 0}, ir::Ints{0, 2, 1, 3}, ir::Ints{1, 3, 0, 2},
                          ir::Ints{0, 1, 2, 3}, ir::Ints{2, 0, 1, 3}}) {
      Shape shape;
      for (int64_t p : perm) shape.push_back(x.shape()[static_cast<size_t>(p)]);
      Array expected = gather_reference(x, shape, [&](const Index& o) {
        Index i(4);
        for (size_t k = 0; k < 4; ++k) i[static_cast<size_t>(perm[k])] = o[k];
        return i;
      });
      EXPECT_TRUE(same_bits(eval::transpose(x, perm), expected));
    }
  }
}

TEST(ShapeOps, TransposeLargeMatrixWithPartialTiles) {
  // Sizes that are not multiples of any tile size, with batch dims around the transpose.
  for (DType t : {f32, u8, f64}) {
    Array x = random_array({2, 70, 45}, t, 3);
    Array expected = gather_reference(x, {2, 45, 70}, [](const Index& o) {
      return Index{o[0], o[2], o[1]};
    });
    EXPECT_TRUE(same_bits(eval::transpose(x, {0, 2, 1}), expected));
    Array expected2 = gather_reference(x, {45, 2, 70}, [](const Index& o) {
      return Index{o[1], o[2], o[0]};
    });
    EXPECT_TRUE(same_bits(eval::transpose(x, {2, 0, 1}), expected2));
  }
}

TEST(ShapeOps, ReshapeSqueezeExpandDimsAreRowMajorRelabelings) {
  Array x = random_array({2, 1, 6}, f32, 4);
  Array r = eval::reshape(x, {3, 4});
  EXPECT_EQ(r.shape(), (Shape{3, 4}));
  EXPECT_EQ(r.to_doubles(), x.to_doubles());
  Array s = eval::squeeze(x, {1});
  EXPECT_EQ(s.shape(), (Shape{2, 6}));
  EXPECT_EQ(s.to_doubles(), x.to_doubles());
  Array e = eval::expand_dims(x, {0, 4});
  EXPECT_EQ(e.shape(), (Shape{1, 2, 1, 6, 1}));
  EXPECT_EQ(e.to_doubles(), x.to_doubles());
  Array e2 = eval::expand_dims(Array::full({}, i32, 7), {0, 1});
  EXPECT_EQ(e2.shape(), (Shape{1, 1}));
  EXPECT_EQ(e2.get_flat(0), 7);
}

TEST(ShapeOps, Concatenate) {
  for (DType t : kDTypes) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    for (int64_t axis = 0; axis < 3; ++axis) {
      Shape sa = {2, 3, 4}, sb = {2, 3, 4}, sc = {2, 3, 4};
      sa[axis] = 1;
      sb[axis] = 3;
      sc[axis] = 0;  // an empty operand contributes nothing
      std::vector<Array> xs = {random_array(sa, t, 5), random_array(sc, t, 6),
                               random_array(sb, t, 7)};
      Shape shape = sa;
      shape[axis] = 4;
      // Reference: the operand whose range along `axis` holds the output index.
      Array expected(shape, t);
      testutil::for_each_index(shape, [&](const Index& o) {
        Index i = o;
        const Array* src = &xs[0];
        if (o[axis] >= 1) {
          src = &xs[2];
          i[axis] -= 1;
        }
        std::memcpy(static_cast<unsigned char*>(expected.raw_data()) +
                        testutil::flat_of(shape, o) * itemsize(t),
                    testutil::elem_ptr(*src, testutil::flat_of(src->shape(), i)),
                    static_cast<size_t>(itemsize(t)));
      });
      EXPECT_TRUE(same_bits(eval::concatenate(xs, axis), expected)) << "axis " << axis;
    }
  }
}

TEST(ShapeOps, Slice) {
  for (DType t : kDTypes) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    Array x = random_array({7, 8, 9}, t, 8);
    ir::Ints start = {1, 0, 2}, limit = {7, 8, 9}, strides = {2, 1, 3};
    Shape shape = {3, 8, 3};  // ceil(6/2), 8, ceil(7/3)
    Array expected = gather_reference(x, shape, [&](const Index& o) {
      return Index{start[0] + o[0] * strides[0], start[1] + o[1] * strides[1],
                   start[2] + o[2] * strides[2]};
    });
    EXPECT_TRUE(same_bits(eval::slice(x, start, limit, strides), expected));
  }
  Array x = random_array({4, 5}, f32, 9);
  EXPECT_EQ(eval::slice(x, {4, 0}, {4, 5}, {1, 1}).shape(), (Shape{0, 5}));  // empty, at the end
  Array inner = eval::slice(x, {1, 1}, {3, 4}, {1, 1});
  EXPECT_TRUE(same_bits(inner, gather_reference(x, {2, 3}, [](const Index& o) {
                          return Index{o[0] + 1, o[1] + 1};
                        })));
}

TEST(ShapeOps, DynamicSliceClampsStartsLikeXla) {
  Array x = Array::iota({6, 5}, i32);
  auto expect_window = [&](ir::Ints start, ir::Ints sizes, Index origin) {
    Array expected = gather_reference(x, sizes, [&](const Index& o) {
      return Index{origin[0] + o[0], origin[1] + o[1]};
    });
    EXPECT_TRUE(same_bits(eval::dynamic_slice(x, start, sizes), expected))
        << "start " << start[0] << "," << start[1];
  };
  expect_window({1, 2}, {2, 3}, {1, 2});    // in range
  expect_window({5, 4}, {2, 3}, {4, 2});    // clamped to dim - size
  expect_window({-3, -1}, {2, 3}, {0, 0});  // negative: clamped to 0
  expect_window({100, 0}, {6, 5}, {0, 0});  // full size: only 0 fits
  expect_window({2, 2}, {0, 3}, {0, 2});    // empty window
}

TEST(ShapeOps, Rev) {
  for (DType t : kDTypes) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    Array x = random_array({3, 4, 5}, t, 10);
    for (ir::Ints dims : {ir::Ints{}, ir::Ints{0}, ir::Ints{2}, ir::Ints{0, 2}, ir::Ints{0, 1, 2}}) {
      Array expected = gather_reference(x, x.shape(), [&](const Index& o) {
        Index i = o;
        for (int64_t d : dims) i[d] = x.shape()[d] - 1 - o[d];
        return i;
      });
      EXPECT_TRUE(same_bits(eval::rev(x, dims), expected));
    }
  }
  EXPECT_EQ(eval::rev(Array({0, 3}, f32), {0, 1}).shape(), (Shape{0, 3}));
}

TEST(ShapeOps, ResultsDoNotAliasOperandsExceptRelabelings) {
  Array x = random_array({4, 4}, f32, 11);
  EXPECT_FALSE(eval::transpose(x, {1, 0}).shares_buffer_with(x));
  EXPECT_FALSE(eval::slice(x, {0, 0}, {4, 4}, {1, 1}).shares_buffer_with(x));
  EXPECT_FALSE(eval::rev(x, {}).shares_buffer_with(x));
  EXPECT_TRUE(eval::reshape(x, {16}).shares_buffer_with(x));
}

}  // namespace
}  // namespace pallas
