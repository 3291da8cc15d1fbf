#include "eval/fusion.h"


namespace pallas::eval {

using ir::AttrKey;
using ir::OpCode;

namespace {

void count_uses(const ir::Region& r, std::vector<int>& uses) {
  for (const ir::Op& op : r.ops) {
    for (ir::ValueId v : op.operands) ++uses[v];
    for (const ir::Region& sub : op.regions) count_uses(sub, uses);
  }
}

bool is_plain_matmul(const ir::Kernel& k, const ir::Op& d) {
  const ir::Attrs& a = d.attrs;
  return a.get_ints(AttrKey::LhsContracting) == ir::Ints{1} &&
         a.get_ints(AttrKey::RhsContracting) == ir::Ints{0} && a.get_ints(AttrKey::LhsBatch).empty() &&
         a.get_ints(AttrKey::RhsBatch).empty() && a.get_dtype(AttrKey::DTypeAttr) == DType::F32 &&
         k.type(d.operands[0]).rank() == 2 && k.type(d.operands[1]).rank() == 2 &&
         is_float(k.type(d.operands[0]).dtype);
}

void plan_region(const ir::Kernel& k, const ir::Region& r, const std::vector<int>& uses,
                 FusionPlan& plan) {
  for (size_t i = 0; i < r.ops.size(); ++i) {
    const ir::Op& op = r.ops[i];
    for (const ir::Region& sub : op.regions) plan_region(k, sub, uses, plan);
    // store(%acc, idx, %s) at i, add at i-1, load at i-2.
    if (op.code != OpCode::Store || i < 2 || op.attrs.get_int_or(AttrKey::Masked, 0)) continue;
    const ir::Op& add = r.ops[i - 1];
    const ir::Op& load = r.ops[i - 2];
    ir::ValueId s = op.operands.back();
    if (add.code != OpCode::Add || add.results[0] != s || uses[s] != 1) continue;
    if (load.code != OpCode::Load || load.attrs.get_int_or(AttrKey::Masked, 0) || uses[load.results[0]] != 1)
      continue;
    if (k.type(op.operands[0]).dtype != DType::F32) continue;
    // Same ref, same indexer, same dynamic index values.
    if (load.operands[0] != op.operands[0] ||
        !(load.attrs.get_indexer(AttrKey::Index) == op.attrs.get_indexer(AttrKey::Index)) ||
        !std::equal(load.operands.begin(), load.operands.end(), op.operands.begin()))
      continue;
    ir::ValueId other = add.operands[0] == load.results[0] ? add.operands[1] : add.operands[0];
    if (add.operands[0] != load.results[0] && add.operands[1] != load.results[0]) continue;
    // The dot must be an earlier op of this region.
    const ir::Op* dot = nullptr;
    for (size_t j = i - 2; j-- > 0 && !dot;)
      if (r.ops[j].results.size() == 1 && r.ops[j].results[0] == other) dot = &r.ops[j];
    if (!dot || dot->code != OpCode::DotGeneral || uses[other] != 1 || !is_plain_matmul(k, *dot))
      continue;
    plan.skip[other] = plan.skip[load.results[0]] = plan.skip[s] = 1;
    plan.store_fusion[s] = static_cast<int>(plan.accumulate_dots.size());
    plan.accumulate_dots.push_back({dot, &load, &add, &op});
  }
}

}  // namespace

FusionPlan plan_fusions(const ir::Kernel& k) {
  FusionPlan plan;
  plan.skip.assign(k.values.size(), 0);
  plan.store_fusion.assign(k.values.size(), -1);
  std::vector<int> uses(k.values.size(), 0);
  count_uses(k.body, uses);
  plan_region(k, k.body, uses, plan);
  return plan;
}

}  // namespace pallas::eval
