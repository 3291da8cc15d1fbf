// Internals of estimate_cost shared with its tests.
#pragma once

#include "pallas/ir/ir.h"

namespace pallas {

// How estimate_cost counts an op (docs/TRANSFORMS.md has the rules in words).
enum class CostRule {
  Free,            // 0
  PerElement,      // 1 flop per result element
  Transcendental,  // 1 transcendental per result element
  PerLane,         // 1 flop per element of the largest array operand (SparseCore vector ops)
  IntegerPow,      // the multiplies of square-and-multiply per element
  Dot,             // 2 x result elements x contracted size
  Wgmma,           // 2 x M x N x K (acc M x N, a M x K; all on chip)
  Reduce,          // input elements - output elements
  Scan,            // input elements
  Sort,            // n log n comparisons per row
  RefAccess,       // off-chip bytes (and 1 flop per element for atomics)
  Dma,             // off-chip and remote bytes
  Control,         // its regions: loops multiplied, branches maximized
  Missing,         // no rule: estimate_cost raises InternalError
};
CostRule cost_rule(ir::OpCode code);

}  // namespace pallas
