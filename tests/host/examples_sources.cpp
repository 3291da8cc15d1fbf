// Compiles the bundled examples into the test binary. They are sources of the CLI target, not
// of the library, and the test target takes its sources from tests/ only; including them here
// keeps CMakeLists.txt as it is. Each example keeps its helpers in its own namespace, so they
// can share this translation unit. Add new examples here too (examples_test.cpp checks that
// every registered example runs).
#include "examples/add.cpp"
#include "examples/compare.cpp"
#include "examples/gather.cpp"
#include "examples/inplace.cpp"
#include "examples/layer_norm.cpp"
#include "examples/matmul.cpp"
#include "examples/registry.cpp"
#include "examples/softmax.cpp"
#include "examples/support.cpp"
