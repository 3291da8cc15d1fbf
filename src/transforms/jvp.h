// Internals of pl::jvp (src/transforms/jvp.cpp): how each IR op is differentiated. A test walks
// the op table (ops.def) and fails for an op that falls through to kMissing.
#pragma once

#include "pallas/ir/ir.h"

namespace pallas::jvp_detail {

enum class JvpRule {
  kRule,              // a tangent rule (or, for refs and control flow, a structural rule)
  kZeroTangent,       // results carry no tangent: non-float results, or piecewise-constant ops
  kNotDifferentiable, // raises NotSupportedError when a tangent reaches it
  kMissing,           // no entry: a bug (the op-table test fails)
};

JvpRule jvp_rule(ir::OpCode code);

}  // namespace pallas::jvp_detail
