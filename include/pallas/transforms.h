// Transformations of a pallas_call (docs/TRANSFORMS.md): cost estimation and jvp.
//
//   pl::CostEstimate c = pl::estimate_cost(call, x, y);   // the arguments the call would take
//   std::cout << c.to_json();
//   auto [outs, touts] = pl::jvp(call, {x, y}, {dx, dy}); // forward-mode derivative
#pragma once

#include <type_traits>
#include <vector>

#include "pallas/pallas_call.h"

namespace pallas {

// The cost of running `call` on these arguments, derived from the traced kernel IR and the
// grid: flops and transcendentals of every kernel invocation times the number of grid points;
// bytes_accessed = the HBM traffic of the block pipeline (a block is copied when its index
// changes between consecutive grid points) plus DMAs and direct accesses touching HBM / ANY
// memory; remote_bytes_transferred = the bytes of remote DMAs. The counting rules are in
// docs/TRANSFORMS.md. Nothing runs; CallOptions::cost_estimate is ignored (this is the derived
// estimate, to compare with or to fill it).
//
// `args` are what the call takes: the sizes of dynamic grid dimensions (leading i32 scalars),
// the scalar-prefetch operands, then the inputs. Argument errors are the call's own.
CostEstimate estimate_cost(const PallasCall& call, const std::vector<Array>& args);

// The same from shapes alone (what PallasCall::trace takes: no dynamic grid sizes among them;
// those go in `dynamic_grid_sizes`, one per dynamic grid dimension). Scalar-prefetch values are
// unknown here, so a block whose index map reads them is counted as copied at every grid point.
CostEstimate estimate_cost(const PallasCall& call, const std::vector<ShapeDtype>& args,
                           const std::vector<int64_t>& dynamic_grid_sizes = {});

template <class... A>
  requires(std::is_convertible_v<const A&, const Array&> && ...)
CostEstimate estimate_cost(const PallasCall& call, const A&... args) {
  return estimate_cost(call, std::vector<Array>{args...});
}
template <class... A>
  requires(sizeof...(A) > 0 && (std::is_same_v<A, ShapeDtype> && ...))
CostEstimate estimate_cost(const PallasCall& call, const A&... args) {
  return estimate_cost(call, std::vector<ShapeDtype>{args...});
}

// ---- jvp ---------------------------------------------------------------------------------------
// The outputs of `call` and their tangents. tangent_outputs[i] is an empty pl::Array() for an
// integer or bool output (it has no tangent).
struct JvpOutputs {
  std::vector<Array> primal_outputs;
  std::vector<Array> tangent_outputs;
};

// Forward-mode derivative of `call` at `primals` along `tangents` (one per input, of the input's
// shape and float dtype; an empty pl::Array() for an integer or bool input). Runs ONE
// pallas_call (see jvp_call) on the call's backend. Errors: mismatched or integer tangents
// (pallas::Error); dynamic grids, scalar prefetch, input_output_aliases, meshes and kernel ops
// without a derivative rule (NotSupportedError naming the op and its line).
JvpOutputs jvp(const PallasCall& call, const std::vector<Array>& primals,
               const std::vector<Array>& tangents);

// The derivative call itself, for these primal input shapes: it takes *primal_inputs,
// *tangent_inputs (float inputs only, in order) and returns *primal_outputs, *tangent_outputs
// (float outputs only); each tangent operand has its primal's BlockSpec, and each float scratch
// buffer gets a tangent scratch buffer after the primal ones.
PallasCall jvp_call(const PallasCall& call, const std::vector<ShapeDtype>& primals);

}  // namespace pallas
