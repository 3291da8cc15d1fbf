// The thread-local trace context, Values, Operands, and the region plumbing of control flow.
#include "trace/context.h"

#include <atomic>

namespace pallas {
namespace trace {

namespace {
thread_local TraceState* g_current = nullptr;
std::atomic<uint64_t> g_next_trace_id{1};
}  // namespace

TraceState& current(const Loc& loc) {
  if (!g_current)
    throw Error(
        "no kernel is being traced: operations on pallas Values and Refs can only run inside a "
        "kernel function that pallas_call (or trace_kernel) is tracing",
        src(loc));
  return *g_current;
}

ir::Builder& builder(const Loc& loc) { return current(loc).builder; }

Value wrap(ir::ValueId id) { return Value::from_id(id); }

std::vector<ir::ValueId> ids(const std::vector<Value>& vs) {
  std::vector<ir::ValueId> out;
  out.reserve(vs.size());
  for (const Value& v : vs) {
    v.type();  // checks that v belongs to the active trace
    out.push_back(v.id());
  }
  return out;
}

std::vector<Value> add_op(ir::OpCode code, const std::vector<Value>& operands, ir::Attrs attrs,
                          const Loc& loc) {
  std::vector<ir::ValueId> res = builder(loc).add(code, ids(operands), std::move(attrs), src(loc));
  std::vector<Value> out;
  for (ir::ValueId r : res) out.push_back(wrap(r));
  return out;
}

Value add_op1(ir::OpCode code, const std::vector<Value>& operands, ir::Attrs attrs,
              const Loc& loc) {
  return add_op(code, operands, std::move(attrs), loc).at(0);
}

}  // namespace trace

// ---- Value ------------------------------------------------------------------------------------
const ir::Type& Value::type() const {
  if (id_ < 0) throw Error("use of an empty pallas::Value (default-constructed, never assigned)");
  trace::TraceState* t = trace::g_current;
  if (!t || t->id != trace_)
    throw Error(
        "a pallas::Value was used outside the kernel trace that created it (Values live only "
        "while their kernel is being traced; do not keep them across traces or threads)");
  return t->builder.type(id_);
}

int64_t Value::dim(int axis) const {
  const ir::Type& t = type();
  int a = axis < 0 ? axis + t.rank() : axis;
  if (a < 0 || a >= t.rank())
    throw Error("axis " + std::to_string(axis) + " is out of range for " + t.to_string());
  return t.shape[a];
}

Value Value::from_id(ir::ValueId id) {
  Value v;
  v.trace_ = trace::current(Loc::current()).id;
  v.id_ = id;
  return v;
}

Value Value::astype(DType t, Loc loc) const { return trace::convert_to(*this, t, loc); }

// ---- Operand ----------------------------------------------------------------------------------
Operand::Operand(const Value& v, Loc loc) : kind_(Kind::Value), v_(v), loc_(loc) {}
Operand::Operand(const RefSlot& s, Loc loc) : kind_(Kind::Value), v_(s.load()), loc_(loc) {}

Value Operand::value() const {
  switch (kind_) {
    case Kind::Value: return v_;
    case Kind::Int: return trace::constant(Scalar::of_int(i_, DType::I32), {}, loc_);
    case Kind::Bool: return trace::constant(Scalar::of_int(i_, DType::Bool), {}, loc_);
    case Kind::Float: return trace::constant(Scalar::from_double(f_, DType::F32), {}, loc_);
  }
  throw InternalError("bad operand kind");
}

Value Operand::value_as(DType t, const Shape& shape) const {
  if (kind_ == Kind::Value) {
    Value v = v_.dtype() == t ? v_ : trace::convert_to(v_, t, loc_);
    return v.shape() == shape ? v : trace::broadcast_value(v, shape, "broadcast", loc_);
  }
  return trace::constant(trace::literal_as(*this, t), shape, loc_);
}

// ---- Control-flow plumbing -----------------------------------------------------------------------
namespace detail {

std::vector<Value> begin_region(const std::vector<ir::Type>& arg_types) {
  std::vector<ir::ValueId> args = trace::builder(Loc::current()).begin_region(arg_types);
  std::vector<Value> out;
  for (ir::ValueId a : args) out.push_back(trace::wrap(a));
  return out;
}

void end_region_yield(const std::vector<Value>& yields, const Loc& loc) {
  trace::TraceState& t = trace::current(loc);
  t.builder.add(ir::OpCode::Yield, trace::ids(yields), {}, trace::src(loc));
  t.pending_regions.push_back(t.builder.end_region());
}

void abandon_region() {
  trace::TraceState& t = trace::current(Loc::current());
  t.builder.abandon_region();
}

std::vector<Value> finish_control_op(ir::OpCode code, const std::vector<Value>& operands,
                                     int num_regions, ir::Attrs attrs, const Loc& loc) {
  trace::TraceState& t = trace::current(loc);
  PALLAS_INTERNAL_CHECK(static_cast<int>(t.pending_regions.size()) >= num_regions,
                        "missing regions");
  std::vector<ir::Region> regions(
      std::make_move_iterator(t.pending_regions.end() - num_regions),
      std::make_move_iterator(t.pending_regions.end()));
  t.pending_regions.resize(t.pending_regions.size() - num_regions);
  std::vector<ir::ValueId> res = t.builder.add(code, trace::ids(operands), std::move(attrs),
                                               trace::src(loc), std::move(regions));
  std::vector<Value> out;
  for (ir::ValueId r : res) out.push_back(trace::wrap(r));
  return out;
}

Value as_carry(const Operand& o) { return o.value(); }

Value as_bool_pred(const Operand& o, const char* what) {
  Value v = o.value();
  if (v.dtype() != DType::Bool || v.rank() != 0)
    throw Error(std::string(what) + " must be a bool scalar, got " + v.type().to_string(),
                trace::src(o.loc()));
  return v;
}

Value as_index_scalar(const Operand& o, const char* what) {
  Value v = o.kind() == Operand::Kind::Value ? o.as_value()
                                             : o.value_as(DType::I32, {});
  if (v.rank() != 0 || !is_integer(v.dtype()))
    throw Error(std::string(what) + " must be an integer scalar, got " + v.type().to_string(),
                trace::src(o.loc()));
  return v;
}

std::vector<ir::Type> types_of(const std::vector<Value>& vs) {
  std::vector<ir::Type> out;
  for (const Value& v : vs) out.push_back(v.type());
  return out;
}

// ---- TraceScope ---------------------------------------------------------------------------------
TraceScope::TraceScope(std::string name, const Loc& loc) : saved_(trace::g_current) {
  trace::g_current = new trace::TraceState(std::move(name), trace::src(loc), trace::g_next_trace_id++);
}

TraceScope::~TraceScope() {
  delete trace::g_current;
  trace::g_current = static_cast<trace::TraceState*>(saved_);
}

std::vector<Value> TraceScope::add_params(const std::vector<ir::Type>& types) {
  std::vector<Value> out;
  for (const ir::Type& t : types) out.push_back(trace::wrap(trace::g_current->builder.add_param(t)));
  return out;
}

void TraceScope::collect_globals(std::vector<ir::Type>* sink) { trace::g_current->globals = sink; }

ir::Kernel TraceScope::finish() {
  PALLAS_INTERNAL_CHECK(trace::g_current->pending_regions.empty(), "dangling regions");
  ir::Kernel k = trace::g_current->builder.finish();
  ir::verify(k);
  return k;
}

ir::Kernel TraceScope::finish(const std::vector<Value>& yields, const Loc& loc) {
  trace::g_current->builder.add(ir::OpCode::Yield, trace::ids(yields), {}, trace::src(loc));
  return finish();
}

}  // namespace detail
}  // namespace pallas
