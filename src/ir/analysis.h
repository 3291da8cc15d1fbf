// Small analyses over kernels that the interpreters and backends share.
#pragma once

#include <vector>

#include "pallas/ir/ir.h"

namespace pallas::ir {

// For each kernel parameter: may the kernel write through it (a store, swap or atomic on the
// parameter or a view of it, or any op that takes it that is not a load or a view)?
std::vector<bool> params_written(const Kernel& k);

// The op each value is a result of, indexed by ValueId (nullptr: a region's argument).
std::vector<const Op*> defining_ops(const Kernel& k);

}  // namespace pallas::ir
