// The thread-local trace context shared by the tracing files.
#pragma once

#include <vector>

#include "ir/builder.h"
#include "pallas/trace.h"

namespace pallas::trace {

struct TraceState {
  ir::Builder builder;
  uint64_t id;
  std::vector<ir::Region> pending_regions;  // finished regions waiting for their control op
  // Where pl::get_global records the parameters it adds (null: this body may not use it).
  std::vector<ir::Type>* globals = nullptr;
  TraceState(std::string name, SourceLoc loc, uint64_t id_)
      : builder(std::move(name), std::move(loc)), id(id_) {}
};

// The active trace; throws a pallas::Error (at `loc`) when no kernel is being traced.
TraceState& current(const Loc& loc);
ir::Builder& builder(const Loc& loc);
inline SourceLoc src(const Loc& l) { return SourceLoc::from(l); }

Value wrap(ir::ValueId id);
std::vector<ir::ValueId> ids(const std::vector<Value>& vs);

// Adds an op and wraps its results.
std::vector<Value> add_op(ir::OpCode code, const std::vector<Value>& operands, ir::Attrs attrs,
                          const Loc& loc);
Value add_op1(ir::OpCode code, const std::vector<Value>& operands, ir::Attrs attrs, const Loc& loc);

// Dtype promotion (see trace.h) and broadcasting.
DType promote_dtypes(DType a, DType b, const char* op, const Loc& loc);
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op, const Loc& loc);
Value convert_to(const Value& v, DType t, const Loc& loc);
Value broadcast_value(const Value& v, const Shape& shape, const char* op, const Loc& loc);
Value constant(const Scalar& s, const Shape& shape, const Loc& loc);
// The literal of `o` as a scalar of dtype t.
Scalar literal_as(const Operand& o, DType t);
Scalar wrap_integer(int64_t v, DType t);
// Dtype a literal gets when it meets a value of dtype `other` (weak typing).
DType weak_literal_dtype(Operand::Kind literal, DType other);

// `o` (an integer literal or traced integer scalar) as an i32 scalar; `what` names it in errors.
Value index_scalar(const Operand& o, const char* what, const Loc& loc);

// The semaphore_wait op (tpu::semaphore_wait, and gpu::semaphore_wait, which may not decrement).
void semaphore_wait(const Ref& sem, const Operand& value, bool decrement, const Loc& loc);

}  // namespace pallas::trace
