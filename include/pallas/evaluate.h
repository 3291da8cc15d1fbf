// Evaluating a traced kernel directly on host Arrays (the sequential reference semantics).
#pragma once

#include <ostream>
#include <span>
#include <vector>

#include "pallas/array.h"
#include "pallas/ir/ir.h"

namespace pallas {

// Where in the grid a kernel body runs: what program_id / num_programs return.
struct GridPoint {
  std::vector<int64_t> program_ids;
  std::vector<int64_t> num_programs;
};

struct EvaluateOptions {
  GridPoint grid;
  std::ostream* debug_out = nullptr;  // debug_print output (default: std::cout)
  bool debug_checks = false;          // run debug_check ops (otherwise they are ignored)
};

// Runs kernel `k` once with its Ref parameters bound to `buffers` (one Array per parameter,
// same shape and dtype; they are read and written in place).
void evaluate(const ir::Kernel& k, std::span<Array> buffers, const EvaluateOptions& opts = {});
inline void evaluate(const ir::Kernel& k, std::vector<Array>& buffers,
                     const EvaluateOptions& opts = {}) {
  evaluate(k, std::span<Array>(buffers), opts);
}

}  // namespace pallas
