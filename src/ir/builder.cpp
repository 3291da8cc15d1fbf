#include "ir/builder.h"

namespace pallas::ir {

Builder::Builder(std::string name, SourceLoc loc) {
  kernel_.name = std::move(name);
  kernel_.loc = std::move(loc);
  scope_open_.push_back(1);
  stack_.push_back(OpenRegion{Region{}, 0});
}

ValueId Builder::new_value(const Type& t) {
  kernel_.values.push_back(t);
  value_scope_.push_back(stack_.back().scope);
  return static_cast<ValueId>(kernel_.values.size() - 1);
}

ValueId Builder::add_param(const Type& t) {
  PALLAS_INTERNAL_CHECK(stack_.size() == 1 && stack_[0].region.ops.empty(),
                        "parameters must come before ops");
  ValueId v = new_value(t);
  stack_[0].region.args.push_back(v);
  return v;
}

ValueId Builder::add_late_param(const Type& t) {
  kernel_.values.push_back(t);
  value_scope_.push_back(0);  // the kernel body's scope, which stays open to the end
  const ValueId v = static_cast<ValueId>(kernel_.values.size() - 1);
  stack_[0].region.args.push_back(v);
  return v;
}

std::vector<ValueId> Builder::begin_region(const std::vector<Type>& arg_types) {
  int scope = static_cast<int>(scope_open_.size());
  scope_open_.push_back(1);
  stack_.push_back(OpenRegion{Region{}, scope});
  std::vector<ValueId> args;
  for (const Type& t : arg_types) args.push_back(new_value(t));
  stack_.back().region.args = args;
  return args;
}

Region Builder::end_region() {
  PALLAS_INTERNAL_CHECK(stack_.size() > 1, "no open region to end");
  OpenRegion r = std::move(stack_.back());
  stack_.pop_back();
  scope_open_[r.scope] = 0;
  return std::move(r.region);
}

void Builder::abandon_region() { end_region(); }

bool Builder::is_visible(ValueId v) const {
  if (v < 0 || v >= num_values()) return false;
  return scope_open_[value_scope_[v]] != 0;
}

RegionSignature region_signature(const std::vector<Type>& values, const Region& r) {
  RegionSignature sig;
  for (ValueId a : r.args) sig.args.push_back(values.at(a));
  if (!r.ops.empty() && r.ops.back().code == OpCode::Yield)
    for (ValueId y : r.ops.back().operands) sig.yields.push_back(values.at(y));
  return sig;
}

RegionSignature region_signature(const Kernel& k, const Region& r) {
  return region_signature(k.values, r);
}

std::vector<ValueId> Builder::add(OpCode code, std::vector<ValueId> operands, Attrs attrs,
                                  const SourceLoc& loc, std::vector<Region> regions) {
  std::vector<Type> operand_types;
  operand_types.reserve(operands.size());
  for (size_t i = 0; i < operands.size(); ++i) {
    ValueId v = operands[i];
    PALLAS_INTERNAL_CHECK(v >= 0 && v < num_values(), "operand id out of range");
    if (!is_visible(v))
      throw Error(std::string(op_info(code).name) + ": operand " + std::to_string(i) + " (" +
                      type(v).to_string() +
                      ") was defined inside a region that has ended (a loop body, a branch or "
                      "a scope) and cannot be used outside it; pass it out as a loop carry or a "
                      "branch result instead",
                  loc);
    operand_types.push_back(type(v));
  }
  std::vector<RegionSignature> sigs;
  for (const Region& r : regions) sigs.push_back(region_signature(kernel_.values, r));
  std::vector<Type> result_types = infer_result_types(code, operand_types, attrs, sigs, loc);
  Op op;
  op.code = code;
  op.operands = std::move(operands);
  op.attrs = std::move(attrs);
  op.regions = std::move(regions);
  op.loc = loc;
  for (const Type& t : result_types) op.results.push_back(new_value(t));
  std::vector<ValueId> results = op.results;
  stack_.back().region.ops.push_back(std::move(op));
  return results;
}

Kernel Builder::finish() {
  PALLAS_INTERNAL_CHECK(stack_.size() == 1, "unclosed regions at the end of a trace");
  kernel_.body = std::move(stack_[0].region);
  Kernel k = std::move(kernel_);
  kernel_ = Kernel{};
  stack_.clear();
  return k;
}

}  // namespace pallas::ir
