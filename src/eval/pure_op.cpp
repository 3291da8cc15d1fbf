// Dispatch of pure ops to their evaluation rules. One switch over the op table: an op with no
// rule here is a compile-time warning turned error (-Wswitch), and the ops test walks the table.
#include "eval/eval.h"

#pragma GCC diagnostic error "-Wswitch"

namespace pallas::eval {

using ir::AttrKey;
using ir::OpCode;

namespace {
std::vector<Array> copies(std::span<const Array* const> in) {
  std::vector<Array> out;
  out.reserve(in.size());
  for (const Array* a : in) out.push_back(*a);
  return out;
}
}  // namespace

std::vector<Array> pure_op(const ir::Op& op, std::span<const Array> operands) {
  std::vector<const Array*> ptrs;
  for (const Array& a : operands) ptrs.push_back(&a);
  return pure_op(op, std::span<const Array* const>(ptrs));
}

std::vector<Array> pure_op(const ir::Op& op, std::span<const Array* const> in) {
  if (op.code == OpCode::Sort) return sort(copies(in), op.attrs);
  if (op.code == OpCode::ScScanCount || op.code == OpCode::ScSortKeyVal || op.code == OpCode::ScUnpack)
    return sparse_core_op(op, in);
  return {pure_op1(op, in)};
}

Array pure_op1(const ir::Op& op, std::span<const Array* const> p) {
  const ir::Attrs& a = op.attrs;
  auto in = [&](size_t i) -> const Array& { return *p[i]; };
  switch (op.code) {
    case OpCode::Sort: return sort(copies(p), a).at(0);  // a sort with one operand has one result
    case OpCode::Constant:
      return constant(a.get_scalar(AttrKey::Value), a.get_ints(AttrKey::ShapeAttr));
    case OpCode::Iota:
      return {iota(a.get_dtype(AttrKey::DTypeAttr), a.get_ints(AttrKey::ShapeAttr),
                   a.get_int(AttrKey::Axis))};
    case OpCode::Neg: case OpCode::Abs: case OpCode::Sign: case OpCode::Floor:
    case OpCode::Ceil: case OpCode::Round: case OpCode::Exp: case OpCode::Exp2:
    case OpCode::Log: case OpCode::Log1p: case OpCode::Sqrt: case OpCode::Rsqrt:
    case OpCode::Reciprocal: case OpCode::Tanh: case OpCode::Logistic: case OpCode::Sin:
    case OpCode::Cos: case OpCode::Erf: case OpCode::IsFinite: case OpCode::Not:
    case OpCode::IntegerPow: case OpCode::MultipleOf:
      return unary(op.code, in(0), a);
    case OpCode::Add: case OpCode::Sub: case OpCode::Mul: case OpCode::Div: case OpCode::Rem:
    case OpCode::Pow: case OpCode::Max: case OpCode::Min: case OpCode::And: case OpCode::Or:
    case OpCode::Xor: case OpCode::ShiftLeft: case OpCode::ShiftRightLogical:
    case OpCode::ShiftRightArithmetic: case OpCode::Eq: case OpCode::Ne: case OpCode::Lt:
    case OpCode::Le: case OpCode::Gt: case OpCode::Ge:
      return binary(op.code, in(0), in(1));
    case OpCode::Select: return select(in(0), in(1), in(2));
    case OpCode::Convert: return convert(in(0), a.get_dtype(AttrKey::DTypeAttr));
    case OpCode::Bitcast: return bitcast(in(0), a.get_dtype(AttrKey::DTypeAttr));
    case OpCode::BroadcastInDim:
      return broadcast_in_dim(in(0), a.get_ints(AttrKey::ShapeAttr), a.get_ints(AttrKey::Dims));
    case OpCode::Reshape: return reshape(in(0), a.get_ints(AttrKey::ShapeAttr));
    case OpCode::Transpose: return transpose(in(0), a.get_ints(AttrKey::Permutation));
    case OpCode::Squeeze: return squeeze(in(0), a.get_ints(AttrKey::Dims));
    case OpCode::ExpandDims: return expand_dims(in(0), a.get_ints(AttrKey::Dims));
    case OpCode::Concatenate: return concatenate(copies(p), a.get_int(AttrKey::Axis));
    case OpCode::Slice:
      return {slice(in(0), a.get_ints(AttrKey::Start), a.get_ints(AttrKey::Limit),
                    a.get_ints(AttrKey::Strides))};
    case OpCode::DynamicSlice: {
      ir::Ints start;
      for (size_t i = 1; i < p.size(); ++i) start.push_back(in(i).scalar_at_flat(0).as_int64());
      return dynamic_slice(in(0), start, a.get_ints(AttrKey::Sizes));
    }
    case OpCode::Rev: return rev(in(0), a.get_ints(AttrKey::Dims));
    case OpCode::ReduceSum: case OpCode::ReduceMax: case OpCode::ReduceMin:
    case OpCode::ReduceProd: case OpCode::ReduceAnd: case OpCode::ReduceOr:
    case OpCode::Argmax: case OpCode::Argmin:
      return reduce(op.code, in(0), a);
    case OpCode::Cumsum: case OpCode::Cumprod: case OpCode::Cummax: case OpCode::Cummin:
      return scan(op.code, in(0), a);
    case OpCode::DotGeneral: return dot_general(in(0), in(1), a);
    case OpCode::ScMaskedScan: case OpCode::ScScanCount: case OpCode::ScSortKeyVal:
    case OpCode::ScAllReducePopulationCount: case OpCode::ScAllReduceFfs: case OpCode::ScPack:
    case OpCode::ScUnpack: case OpCode::ScDynamicGather:
      return sparse_core_op(op, p).at(0);
    // Not pure: handled by the interpreter.
    case OpCode::ProgramId: case OpCode::NumPrograms: case OpCode::RefView: case OpCode::RefTranspose:
    case OpCode::RefReshape: case OpCode::RefBitcast: case OpCode::Load:
    case OpCode::Store: case OpCode::Swap: case OpCode::AtomicRmw: case OpCode::AtomicCas:
    case OpCode::For: case OpCode::While: case OpCode::Cond: case OpCode::Switch:
    case OpCode::RunScoped: case OpCode::Yield: case OpCode::DebugPrint: case OpCode::DebugCheck:
    case OpCode::DmaStart: case OpCode::DmaWait: case OpCode::SemaphoreSignal:
    case OpCode::SemaphoreWait: case OpCode::SemaphoreRead: case OpCode::GetBarrierSemaphore:
    case OpCode::SubcoreBarrier:
    case OpCode::AxisIndex: case OpCode::ScLoadGather: case OpCode::ScStoreScatter:
    case OpCode::ScAddupdateScatter: case OpCode::ScLoadExpanded: case OpCode::ScStoreCompressed:
    case OpCode::ScAddupdate: case OpCode::ScAddupdateCompressed: case OpCode::ScFetchAndAdd:
    case OpCode::GpuCopyGmemToSmem: case OpCode::GpuCopySmemToGmem: case OpCode::GpuWaitSmemToGmem: case OpCode::GpuCommitSmemToGmemGroup:
    case OpCode::GpuCommitSmem: case OpCode::GpuBarrierArrive: case OpCode::GpuBarrierWait:
    case OpCode::GpuWgmma: case OpCode::GpuWgmmaWait: case OpCode::GpuSetMaxRegisters:
    case OpCode::GpuClusterRef: case OpCode::GpuAsyncPrefetch: case OpCode::NamedRegionBegin: case OpCode::NamedRegionEnd:
      break;
  }
  throw InternalError("pure_op1 called on " + std::string(op.info().name));
}

}  // namespace pallas::eval
