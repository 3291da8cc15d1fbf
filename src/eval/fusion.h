// Fusions the interpreters apply to hot kernel patterns. They change no results beyond f32
// rounding order and are chosen statically, once per kernel.
//
// AccumulateDot: `acc[idx] += dot(x, y)` — traced as
//     %d = dot_general(%x, %y)    (2-D, [M,K]x[K,N], f32 result)
//     %a = load(%acc, idx)        (f32, unmasked)
//     %s = add(%a, %d)            (either order)
//     store(%acc, idx, %s)        (same ref and indexer, unmasked)
// with %d, %a, %s used only there — runs as one BLAS call accumulating into the ref's memory
// (C = A·B + C), instead of a dot result, a copy of the block, an add and a copy back.
#pragma once

#include <vector>

#include "pallas/ir/ir.h"

namespace pallas::eval {

struct AccumulateDot {
  const ir::Op* dot;
  const ir::Op* load;
  const ir::Op* add;
  const ir::Op* store;
};

struct FusionPlan {
  std::vector<char> skip;          // per ValueId: the op defining it is part of a fusion
  std::vector<int> store_fusion;   // per ValueId of a stored value: index into accumulate_dots
  std::vector<AccumulateDot> accumulate_dots;
};

FusionPlan plan_fusions(const ir::Kernel& k);

}  // namespace pallas::eval
