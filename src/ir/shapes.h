// Shape computations shared by the type rules and the evaluation rules.
#pragma once

#include <algorithm>

#include "pallas/ir/ir.h"

namespace pallas::ir {

// The shape of expand_dims: size-1 dimensions at the result positions `dims` (assumed distinct
// and in range), the operand's dimensions in order elsewhere.
inline Shape expanded_shape(const Shape& operand, const Ints& dims) {
  const int out_rank = static_cast<int>(operand.size() + dims.size());
  Shape shape;
  size_t next = 0;
  for (int d = 0; d < out_rank; ++d) {
    if (std::find(dims.begin(), dims.end(), d) != dims.end())
      shape.push_back(1);
    else
      shape.push_back(operand[next++]);
  }
  return shape;
}

}  // namespace pallas::ir
