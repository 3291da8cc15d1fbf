// Placeholder until dot lands.
#include "eval/eval.h"
namespace pallas::eval {
Array dot_general(const Array&, const Array&, const ir::Attrs&) { throw NotSupportedError("dot_general"); }
}  // namespace pallas::eval
