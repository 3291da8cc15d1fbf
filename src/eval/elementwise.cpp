// Placeholder until the elementwise rules land.
#include "eval/eval.h"
namespace pallas::eval {
Array unary(ir::OpCode code, const Array&, const ir::Attrs&) { throw NotSupportedError(std::string(ir::op_info(code).name)); }
Array binary(ir::OpCode code, const Array&, const Array&) { throw NotSupportedError(std::string(ir::op_info(code).name)); }
Array select(const Array&, const Array&, const Array&) { throw NotSupportedError("select"); }
Array convert(const Array&, DType) { throw NotSupportedError("convert"); }
Array bitcast(const Array&, DType) { throw NotSupportedError("bitcast"); }
Array constant(const Scalar& value, const Shape& shape) { return Array::full(shape, value); }
Array iota(DType, const Shape&, int64_t) { throw NotSupportedError("iota"); }
}  // namespace pallas::eval
