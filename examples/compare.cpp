// Checking an example's outputs against its reference.
#include <algorithm>

#include "examples/examples.h"

namespace pallas::examples {

std::vector<ShapeDtype> Problem::arg_shapes() const {
  if (!call_arg_shapes.empty()) return call_arg_shapes;
  std::vector<ShapeDtype> shapes;
  for (const Array& a : inputs) shapes.push_back(a.shape_dtype());
  return shapes;
}

Outcome compare(const Problem& p, const std::vector<Array>& inputs,
                const std::vector<Array>& outputs, const std::vector<Array>& expected) {
  Outcome o;
  if (outputs.size() != expected.size()) {
    o.ok = false;
    o.message = p.name + ": the call returned " + std::to_string(outputs.size()) +
                " outputs, the reference " + std::to_string(expected.size());
    return o;
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    AllCloseResult r = allclose(outputs[i], expected[i], p.tolerance.rtol, p.tolerance.atol);
    o.max_abs_error = std::max(o.max_abs_error, r.max_abs_error);
    o.max_rel_error = std::max(o.max_rel_error, r.max_rel_error);
    if (!r.ok && o.ok) {
      o.ok = false;
      o.message = (outputs.size() > 1 ? "output " + std::to_string(i) + ": " : "") + r.message;
    }
  }
  if (o.ok && p.extra_check) {
    std::string problem = p.extra_check(inputs, outputs);
    if (!problem.empty()) {
      o.ok = false;
      o.message = problem;
    }
  }
  return o;
}

std::vector<Array> execute(const Problem& p) {
  return p.runner ? p.runner(p.inputs) : p.call(p.inputs);
}

Outcome run(const Problem& p) {
  // The reference first: an aliased input is overwritten by the call.
  std::vector<Array> expected;
  if (p.reference) expected = p.reference(p.inputs);
  if (p.races) p.races->clear();
  std::vector<Array> outputs = execute(p);
  Outcome o;
  if (p.reference) {
    o = compare(p, p.inputs, outputs, expected);
  } else {
    o.checked = false;
    o.message = p.unchecked_note;
  }
  if (p.races && !p.races->empty()) {
    o.races = *p.races;
    o.ok = false;
    o.message = std::to_string(o.races.size()) + " race(s) detected" +
                (o.message.empty() ? "" : "; " + o.message);
  }
  return o;
}

}  // namespace pallas::examples
