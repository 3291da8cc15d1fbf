// Placeholder until the shape rules land.
#include "eval/eval.h"
namespace pallas::eval {
Array broadcast_in_dim(const Array&, const Shape&, const ir::Ints&) { throw NotSupportedError("broadcast_in_dim"); }
Array reshape(const Array& x, const Shape& shape) { return x.reshaped(shape); }
Array transpose(const Array&, const ir::Ints&) { throw NotSupportedError("transpose"); }
Array squeeze(const Array&, const ir::Ints&) { throw NotSupportedError("squeeze"); }
Array expand_dims(const Array&, const ir::Ints&) { throw NotSupportedError("expand_dims"); }
Array concatenate(std::span<const Array>, int64_t) { throw NotSupportedError("concatenate"); }
Array slice(const Array&, const ir::Ints&, const ir::Ints&, const ir::Ints&) { throw NotSupportedError("slice"); }
Array dynamic_slice(const Array&, const ir::Ints&, const ir::Ints&) { throw NotSupportedError("dynamic_slice"); }
Array rev(const Array&, const ir::Ints&) { throw NotSupportedError("rev"); }
}  // namespace pallas::eval
