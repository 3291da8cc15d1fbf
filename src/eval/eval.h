// Evaluation rules of the IR ops over host tiles (Arrays), shared by every interpreter.
//
// Each function evaluates one op on whole tiles: dispatch on the op and dtype happens once per
// call, and the element loops are tight. Inputs are never modified; results are fresh Arrays,
// except that reshape, squeeze and expand_dims return a view of the operand's buffer (evaluation
// never writes into an Array it produced, so sharing is safe).
// Operand types have already been checked by the op's type rule (evaluation may assume them).
#pragma once

#include <span>
#include <vector>

#include "pallas/array.h"
#include "pallas/ir/ir.h"

namespace pallas::eval {

// ---- elementwise.cpp -------------------------------------------------------------------------
// Unary elementwise ops (kUnary): Neg ... MultipleOf. Attrs as in ops.def (Round: rounding,
// IntegerPow: exponent).
Array unary(ir::OpCode code, const Array& x, const ir::Attrs& attrs);
// Binary elementwise ops (kBinary) and comparisons (kCompare); a and b have the same shape/dtype.
Array binary(ir::OpCode code, const Array& a, const Array& b);
Array select(const Array& pred, const Array& on_true, const Array& on_false);
Array convert(const Array& x, DType to);
Array bitcast(const Array& x, DType to);
Array constant(const Scalar& value, const Shape& shape);
Array iota(DType dtype, const Shape& shape, int64_t axis);

// ---- shape_ops.cpp ---------------------------------------------------------------------------
Array broadcast_in_dim(const Array& x, const Shape& shape, const ir::Ints& dims);
Array reshape(const Array& x, const Shape& shape);
Array transpose(const Array& x, const ir::Ints& permutation);
Array squeeze(const Array& x, const ir::Ints& dims);
Array expand_dims(const Array& x, const ir::Ints& dims);
Array concatenate(std::span<const Array> xs, int64_t axis);
Array slice(const Array& x, const ir::Ints& start, const ir::Ints& limit, const ir::Ints& strides);
// XLA's rule: each start is clamped to [0, dim - size].
Array dynamic_slice(const Array& x, const ir::Ints& start, const ir::Ints& sizes);
Array rev(const Array& x, const ir::Ints& dims);

// ---- reduce.cpp ------------------------------------------------------------------------------
// ReduceSum/Max/Min/Prod/And/Or over `axes` (attr Axes); Argmax/Argmin (attrs Axis, DTypeAttr).
Array reduce(ir::OpCode code, const Array& x, const ir::Attrs& attrs);
// Cumsum/Cumprod/Cummax/Cummin (attrs Axis, Reverse).
Array scan(ir::OpCode code, const Array& x, const ir::Attrs& attrs);
// ---- sort.cpp --------------------------------------------------------------------------------
// Stable sort along the last axis (attrs NumKeys, Descending); returns one Array per operand.
std::vector<Array> sort(std::span<const Array> operands, const ir::Attrs& attrs);

// ---- sparse_core_ops.cpp ---------------------------------------------------------------------
// The pure SparseCore vector ops (sc_masked_scan, sc_scan_count, sc_sort_key_val,
// sc_all_reduce_*, sc_pack, sc_unpack, sc_dynamic_gather); one Array per result. The memory ops
// are the interpreter's (Interpreter::eval_sparse_core_ref_op).
std::vector<Array> sparse_core_op(const ir::Op& op, std::span<const Array* const> operands);
bool is_sparse_core_ref_op(ir::OpCode code);

// ---- dot.cpp ---------------------------------------------------------------------------------
// dot_general (attrs LhsContracting, RhsContracting, LhsBatch, RhsBatch, DTypeAttr = result).
Array dot_general(const Array& lhs, const Array& rhs, const ir::Attrs& attrs);

// ---- the generic op entry used by interpreters and constant folding -------------------------
// Evaluates a pure op without regions or refs (everything but ref ops, grid queries, control
// flow and debug_print). Throws InternalError for other ops. The pointer form avoids copying
// Array handles on the interpreters' hot path; `pure_op1` is for single-result ops (all but
// sort).
std::vector<Array> pure_op(const ir::Op& op, std::span<const Array> operands);
std::vector<Array> pure_op(const ir::Op& op, std::span<const Array* const> operands);
Array pure_op1(const ir::Op& op, std::span<const Array* const> operands);

}  // namespace pallas::eval
