// Transformations of a pallas_call (docs/TRANSFORMS.md): batching (vmap), forward-mode
// derivatives (jvp) and cost estimation.
//
//   pl::PallasCall batched = pl::vmap(call, {0, std::nullopt});  // x batched on axis 0, y not
//   std::vector<pl::Array> outs = batched(xs, y);                 // outputs batched on axis 0
//   pl::CostEstimate c = pl::estimate_cost(call, x, y);   // the arguments the call would take
//   std::cout << c.to_json();
//   auto [outs, touts] = pl::jvp(call, {x, y}, {dx, dy}); // forward-mode derivative
#pragma once

#include <optional>
#include <type_traits>
#include <vector>

#include "pallas/pallas_call.h"

namespace pallas {

// The call batched over a new axis: calling the result with arrays that carry a batch
// dimension runs `call` once per batch element, as ONE pallas_call whose grid has a new leading
// dimension of the batch size. Each batched operand's block gets a Squeezed dimension at its
// batch axis, selected by the new grid index; the kernel and its program_id / num_programs
// axes are the original ones (GridMapping::vmapped_dims lists the added grid dimensions).
//
// `in_axes`: one entry per argument of `call` (its dynamic grid sizes, scalar-prefetch operands,
// inputs): the argument's batch axis, or std::nullopt for an argument shared by every batch
// element. Negative axes count from the end. `out_axes`: where each output gets its batch
// dimension (empty: 0 for every output; one entry: for every output). `axis_size`: the batch
// size, needed when no argument is batched (otherwise it must agree with the arguments).
// An aliased input (input_output_aliases) is moved to its output's batch axis, and broadcast
// there when it is not batched, so the aliased output is batched too.
// Batched scalar-prefetch operands, dynamic grids and batch size 1 run `call` once per batch
// element instead and stack the results (same values, no single batched kernel).
PallasCall vmap(const PallasCall& call, std::vector<std::optional<int>> in_axes,
                std::vector<int> out_axes = {}, int64_t axis_size = -1, Loc loc = Loc::current());

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
