#include "ir/analysis.h"

#include <map>

namespace pallas::ir {

namespace {
// The ref operand an op writes, for ops that read some Ref operands and write one (-1: unknown).
int written_operand(OpCode code) {
  switch (code) {
    case OpCode::GpuCopyGmemToSmem: case OpCode::GpuCopySmemToGmem: return 1;
    case OpCode::GpuWgmma: return 0;
    default: return -1;
  }
}

void walk(const Kernel& k, const Region& r, std::map<ValueId, int>& origin, std::vector<bool>& out) {
  for (const Op& op : r.ops) {
    for (size_t i = 0; i < op.operands.size(); ++i) {
      auto it = origin.find(op.operands[i]);
      if (it == origin.end()) continue;
      if (is_ref_view(op.code) && i == 0) {
        origin[op.results[0]] = it->second;
      } else if (i == 0 && op.info().is(kMemRead) && !op.info().is(kMemWrite)) {
        // reads only (load, sc_load_gather, sc_load_expanded)
      } else if (written_operand(op.code) >= 0 && written_operand(op.code) != static_cast<int>(i)) {
        // read by an op that writes another of its operands
      } else if (k.type(op.operands[i]).is_ref) {
        out[it->second] = true;  // a write, or an op we do not model: assume it writes
      }
    }
    for (const Region& sub : op.regions) walk(k, sub, origin, out);
  }
}
}  // namespace

std::vector<bool> params_written(const Kernel& k) {
  std::vector<bool> out(k.body.args.size(), false);
  std::map<ValueId, int> origin;
  for (size_t i = 0; i < k.body.args.size(); ++i) origin[k.body.args[i]] = static_cast<int>(i);
  walk(k, k.body, origin, out);
  return out;
}

namespace {
void record_definitions(const Region& r, std::vector<const Op*>& out) {
  for (const Op& op : r.ops) {
    for (ValueId v : op.results) out.at(static_cast<size_t>(v)) = &op;
    for (const Region& sub : op.regions) record_definitions(sub, out);
  }
}
}  // namespace

std::vector<const Op*> defining_ops(const Kernel& k) {
  std::vector<const Op*> out(k.values.size(), nullptr);
  record_definitions(k.body, out);
  return out;
}

}  // namespace pallas::ir
