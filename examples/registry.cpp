// The list of bundled examples. Each example lives in its own file and exposes one factory.
#include "examples/registry.h"

namespace pallas::examples {

const std::vector<Example>& all() {
  static const std::vector<Example> examples = {
      add::example(),    matmul::example(), softmax::example(),
      layer_norm::example(), gather::example(), inplace::example(),
  };
  return examples;
}

const Example& find(const std::string& name) {
  std::string known;
  for (const Example& e : all()) {
    if (e.name == name) return e;
    known += (known.empty() ? "" : ", ") + e.name;
  }
  throw UsageError("unknown example '" + name + "' (known: " + known + ")");
}

}  // namespace pallas::examples
