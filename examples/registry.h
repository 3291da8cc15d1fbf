// One factory per bundled example (each defined in examples/<name>.cpp), for registry.cpp.
#pragma once

#include "examples/examples.h"

namespace pallas::examples {
namespace add { Example example(); }
namespace matmul { Example example(); }
namespace softmax { Example example(); }
namespace layer_norm { Example example(); }
namespace gather { Example example(); }
namespace inplace { Example example(); }
}  // namespace pallas::examples
