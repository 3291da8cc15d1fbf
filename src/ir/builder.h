// ir::Builder: the one way ops are added to a kernel under construction. Each add() checks the
// operands' visibility and runs the op's result-type rule, so user mistakes surface at trace
// time with the user's source line.
#pragma once

#include <vector>

#include "pallas/ir/ir.h"

namespace pallas::ir {

class Builder {
 public:
  Builder(std::string name, SourceLoc loc);

  // A parameter of the kernel (only before any op is added to the body).
  ValueId add_param(const Type& t);
  // A parameter appended while the body is being traced (pl::get_global): visible everywhere,
  // as every parameter is, wherever the trace is at the moment.
  ValueId add_late_param(const Type& t);

  // Regions nest: begin_region opens a region whose arguments have these types (returned ids),
  // end_region closes the innermost one and hands it back (to be given to add()).
  std::vector<ValueId> begin_region(const std::vector<Type>& arg_types);
  Region end_region();
  // Abandons the innermost open region (used when tracing its body threw).
  void abandon_region();

  // Adds an op to the innermost open region and returns its results.
  std::vector<ValueId> add(OpCode code, std::vector<ValueId> operands, Attrs attrs,
                           const SourceLoc& loc, std::vector<Region> regions = {});
  ValueId add1(OpCode code, std::vector<ValueId> operands, Attrs attrs, const SourceLoc& loc) {
    return add(code, std::move(operands), std::move(attrs), loc).at(0);
  }

  const Type& type(ValueId v) const { return kernel_.values.at(static_cast<size_t>(v)); }
  bool is_visible(ValueId v) const;
  int num_values() const { return static_cast<int>(kernel_.values.size()); }

  // Closes the kernel body. The builder is empty afterwards.
  Kernel finish();

 private:
  ValueId new_value(const Type& t);
  struct OpenRegion {
    Region region;
    int scope;
  };
  Kernel kernel_;
  std::vector<OpenRegion> stack_;      // stack_[0] is the kernel body
  std::vector<int> value_scope_;       // scope id of each value's defining region
  std::vector<char> scope_open_;       // scope id -> still open (its values are visible)
};

// Signature of a finished region as the type rules see it.
RegionSignature region_signature(const Kernel& k, const Region& r);
RegionSignature region_signature(const std::vector<Type>& values, const Region& r);

}  // namespace pallas::ir
