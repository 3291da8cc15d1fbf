// Placeholder until the reduction rules land.
#include "eval/eval.h"
namespace pallas::eval {
Array reduce(ir::OpCode code, const Array&, const ir::Attrs&) { throw NotSupportedError(std::string(ir::op_info(code).name)); }
Array scan(ir::OpCode code, const Array&, const ir::Attrs&) { throw NotSupportedError(std::string(ir::op_info(code).name)); }
std::vector<Array> sort(std::span<const Array>, const ir::Attrs&) { throw NotSupportedError("sort"); }
}  // namespace pallas::eval
