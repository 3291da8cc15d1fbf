// Dtype promotion, weak literals and broadcasting for traced operators (rules in trace.h).
#include <algorithm>

#include "trace/context.h"

namespace pallas::trace {

namespace {
DType signed_of_bits(int bits) {
  switch (bits) {
    case 8: return DType::I8;
    case 16: return DType::I16;
    case 32: return DType::I32;
    default: return DType::I64;
  }
}
}  // namespace

// Two's complement truncation of v to integer dtype t (the `convert` rule for int -> int).
Scalar wrap_integer(int64_t v, DType t) {
  int bits = bit_width(t);
  uint64_t u = static_cast<uint64_t>(v);
  if (bits < 64) u &= (uint64_t{1} << bits) - 1;
  if (is_unsigned_int(t)) return Scalar::of_uint(u, t);
  if (bits < 64 && (u >> (bits - 1)) & 1) u |= ~((uint64_t{1} << bits) - 1);  // sign-extend
  return Scalar::of_int(static_cast<int64_t>(u), t);
}

DType promote_dtypes(DType a, DType b, const char* op, const Loc& loc) {
  if (a == b) return a;
  if (is_semaphore(a) || is_semaphore(b))
    throw Error(std::string(op) + ": semaphore values cannot be combined with other values",
                src(loc));
  if (a == DType::Bool) return b;
  if (b == DType::Bool) return a;
  bool fa = is_float(a), fb = is_float(b);
  if (fa && fb) {
    if ((a == DType::F16 && b == DType::BF16) || (a == DType::BF16 && b == DType::F16))
      return DType::F32;
    return bit_width(a) >= bit_width(b) ? a : b;
  }
  if (fa) return a;
  if (fb) return b;
  // Both integers.
  bool sa = is_signed_int(a), sb = is_signed_int(b);
  if (sa == sb) return bit_width(a) >= bit_width(b) ? a : b;
  DType u = sa ? b : a, s = sa ? a : b;
  if (u == DType::U64)
    throw Error(std::string(op) + ": no integer type holds both " +
                    std::string(dtype_name(a)) + " and " + std::string(dtype_name(b)) +
                    "; convert one of them explicitly (.astype)",
                src(loc));
  int bits = std::max(bit_width(s), 2 * bit_width(u));
  return signed_of_bits(bits);
}

DType weak_literal_dtype(Operand::Kind literal, DType other) {
  switch (literal) {
    case Operand::Kind::Bool: return other;
    case Operand::Kind::Int: return other == DType::Bool ? DType::I32 : other;
    case Operand::Kind::Float: return is_float(other) ? other : DType::F32;
    case Operand::Kind::Value: break;
  }
  return other;
}

Scalar literal_as(const Operand& o, DType t) {
  switch (o.kind()) {
    case Operand::Kind::Int:
    case Operand::Kind::Bool:
      if (is_float(t)) return Scalar::from_double(static_cast<double>(o.int_literal()), t);
      if (t == DType::Bool) return Scalar::of_int(o.int_literal() != 0, t);
      return wrap_integer(o.int_literal(), t);
    case Operand::Kind::Float: return Scalar::from_double(o.float_literal(), t);
    case Operand::Kind::Value: break;
  }
  throw InternalError("literal_as on a value");
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op, const Loc& loc) {
  size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i + a.size() >= rank ? a[i + a.size() - rank] : 1;
    int64_t db = i + b.size() >= rank ? b[i + b.size() - rank] : 1;
    if (da != db && da != 1 && db != 1)
      throw Error(std::string(op) + ": shapes " + shape_to_string(a) + " and " +
                      shape_to_string(b) + " do not broadcast (dimension " + std::to_string(i) +
                      ": " + std::to_string(da) + " vs " + std::to_string(db) + ")",
                  src(loc));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Value convert_to(const Value& v, DType t, const Loc& loc) {
  if (v.dtype() == t) return v;
  ir::Attrs a;
  a.set(ir::AttrKey::DTypeAttr, t);
  return add_op1(ir::OpCode::Convert, {v}, std::move(a), loc);
}

Value broadcast_value(const Value& v, const Shape& shape, const char* op, const Loc& loc) {
  const Shape& s = v.shape();
  if (s == shape) return v;
  if (s.size() > shape.size())
    throw Error(std::string(op) + ": cannot broadcast " + v.type().to_string() + " to shape " +
                    shape_to_string(shape) + " of lower rank",
                src(loc));
  broadcast_shapes(s, shape, op, loc);  // checks compatibility
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] != 1 && s[i] != shape[i + shape.size() - s.size()])
      throw Error(std::string(op) + ": cannot broadcast " + v.type().to_string() + " to shape " +
                      shape_to_string(shape),
                  src(loc));
  ir::Ints dims;
  for (size_t i = 0; i < s.size(); ++i) dims.push_back(static_cast<int64_t>(i + shape.size() - s.size()));
  ir::Attrs a;
  a.set(ir::AttrKey::ShapeAttr, shape);
  a.set(ir::AttrKey::Dims, dims);
  return add_op1(ir::OpCode::BroadcastInDim, {v}, std::move(a), loc);
}

Value constant(const Scalar& s, const Shape& shape, const Loc& loc) {
  ir::Attrs a;
  a.set(ir::AttrKey::Value, s);
  a.set(ir::AttrKey::ShapeAttr, shape);
  return add_op1(ir::OpCode::Constant, {}, std::move(a), loc);
}

}  // namespace pallas::trace
