// The verifier: walks a whole kernel and re-checks what the builder checks while tracing, so
// parsed and transformed kernels meet the same bar.
#include <set>

#include "ir/builder.h"
#include "pallas/ir/ir.h"

namespace pallas::ir {

namespace {

class Verifier {
 public:
  explicit Verifier(const Kernel& k) : k_(k), defined_(k.values.size(), 0) {}

  void run() {
    region(k_.body, /*must_yield=*/false);
  }

 private:
  [[noreturn]] void fail(const Op* op, const std::string& msg) {
    std::string prefix = op ? std::string(op->info().name) + ": " : std::string();
    throw Error("verifier: " + prefix + msg, op ? op->loc : k_.loc);
  }

  void define(ValueId v, const SourceLoc&) {
    if (v < 0 || static_cast<size_t>(v) >= k_.values.size())
      fail(nullptr, "value id " + std::to_string(v) + " has no type");
    if (defined_[v]) fail(nullptr, "value %" + std::to_string(v) + " is defined twice");
    defined_[v] = 1;
    visible_.back().insert(v);
  }

  bool visible(ValueId v) const {
    for (const auto& scope : visible_)
      if (scope.count(v)) return true;
    return false;
  }

  void region(const Region& r, bool /*nested*/) {
    visible_.emplace_back();
    for (ValueId a : r.args) define(a, k_.loc);
    for (size_t i = 0; i < r.ops.size(); ++i) {
      const Op& op = r.ops[i];
      bool last = i + 1 == r.ops.size();
      if (op.code == OpCode::Yield && !last) fail(&op, "yield must be the last op of its region");
      check_op(op);
    }
    visible_.pop_back();
  }

  void check_op(const Op& op) {
    std::vector<Type> operand_types;
    for (size_t i = 0; i < op.operands.size(); ++i) {
      ValueId v = op.operands[i];
      if (v < 0 || static_cast<size_t>(v) >= k_.values.size() || !defined_[v])
        fail(&op, "operand " + std::to_string(i) + " is used before it is defined");
      if (!visible(v))
        fail(&op, "operand " + std::to_string(i) + " (" + k_.type(v).to_string() +
                      ") is defined in a region that does not enclose this op");
      operand_types.push_back(k_.type(v));
    }
    for (const Region& r : op.regions) region(r, true);
    std::vector<RegionSignature> sigs;
    for (const Region& r : op.regions) sigs.push_back(region_signature(k_, r));
    std::vector<Type> expected = infer_result_types(op.code, operand_types, op.attrs, sigs, op.loc);
    if (expected.size() != op.results.size())
      fail(&op, "has " + std::to_string(op.results.size()) + " results, its rule gives " +
                    std::to_string(expected.size()));
    for (size_t i = 0; i < expected.size(); ++i) {
      const Type& got = k_.type(op.results[i]);
      if (!(got == expected[i]))
        fail(&op, "result " + std::to_string(i) + " has type " + got.to_string() +
                      " but the op's rule gives " + expected[i].to_string());
    }
    for (ValueId res : op.results) define(res, op.loc);
  }

  const Kernel& k_;
  std::vector<char> defined_;
  std::vector<std::set<ValueId>> visible_;
};

}  // namespace

void verify(const Kernel& k) { Verifier(k).run(); }

}  // namespace pallas::ir
