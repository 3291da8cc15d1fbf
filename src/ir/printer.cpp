// Placeholder until the printer lands.
#include "pallas/ir/ir.h"
namespace pallas::ir {
std::string print(const Kernel&, const PrintOptions&) { throw NotSupportedError("ir::print"); }
}  // namespace pallas::ir
