// The SparseCore vector subcore ops (JAX's jax.experimental.pallas.tpu_sc, "plsc"): gathers and
// scatters into VMEM, compressed and expanded accesses, masked scans, lane sorts, mask
// reductions, packing, fetch_and_add on SMEM and parallel loops.
//
//   namespace plsc = pallas::tpu_sc;
//   auto kernel = [](pl::Ref table, pl::Ref ids, pl::Ref out) {
//     pl::Value idx = ids[pl::all];                      // (16,) i32
//     pl::Value rows = plsc::load_gather(table, {idx});  // table[idx[i]] for each lane i
//     plsc::addupdate(out, rows);                         // out += rows
//   };
//
// Vectors have the SparseCore's shapes (sparse_core_info.h: (num_lanes,) for 32-bit types,
// packed shapes for narrower ones); every op checks its shapes, dtypes, masks and memory spaces
// when it is traced and reports a pallas::Error at the user's line. The ops run in the
// reference interpreter and the TPU interpret mode (not on the GPU backend). Semantics that JAX
// leaves open (inactive lanes, duplicate indices, ...) are written down in docs/SPARSE_CORE.md.
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "pallas/sparse_core_info.h"
#include "pallas/trace.h"

namespace pallas::tpu_sc {

// ---- Gathers and scatters (VMEM refs of i32 or f32) --------------------------------------------
// One i32 index vector per dimension of `ref`, all of one length n (a legal vector shape); lane i
// addresses ref[indices[0][i], indices[1][i], ...]. A `mask` (bool, shape (n,)) selects the
// active lanes: the others touch no memory. Indices of active lanes must be inside the ref.

// The gathered vector; inactive lanes hold 0.
Value load_gather(const Ref& ref, const std::vector<Value>& indices,
                  std::optional<Value> mask = std::nullopt, Loc loc = Loc::current());
// ref[indices...] = x. With repeated indices the highest active lane's value is stored.
void store_scatter(const Ref& ref, const std::vector<Value>& indices, const Value& x,
                   std::optional<Value> mask = std::nullopt, Loc loc = Loc::current());
// ref[indices...] += x, lane by lane: repeated indices add every active lane's value.
void addupdate_scatter(const Ref& ref, const std::vector<Value>& indices, const Value& x,
                       std::optional<Value> mask = std::nullopt, Loc loc = Loc::current());

// ---- Expanded and compressed accesses (a VMEM ref of a legal vector shape) ----------------------
// The k-th active lane (row-major over the ref's shape) pairs with the k-th element of the ref.

// Lane i of the result (active) holds ref[k] where k counts the active lanes before i; inactive
// lanes hold 0. `mask` has the ref's shape.
Value load_expanded(const Ref& ref, const Value& mask, Loc loc = Loc::current());
// Writes the active lanes of x to ref[0], ref[1], ... (the rest of ref keeps its values).
void store_compressed(const Ref& ref, const Value& x, const Value& mask, Loc loc = Loc::current());
// ref += x (x has the ref's shape and dtype).
void addupdate(const Ref& ref, const Value& x, Loc loc = Loc::current());
// Adds the active lanes of x to ref[0], ref[1], ...
void addupdate_compressed(const Ref& ref, const Value& x, const Value& mask, Loc loc = Loc::current());

// ---- Lane ops -------------------------------------------------------------------------------------
// Reinterprets x's bits as `dtype`, keeping the rank: the last dimension scales by the ratio of
// the bit widths (i32[16] -> i8[64], i16[32] -> i32[16]). x.shape[-1] * old bits must be a
// multiple of the new bit width.
Value bitcast(const Value& x, DType dtype, Loc loc = Loc::current());

// Running sum / max / min over a rank-1 u32, i32 or f32 vector. With a mask, only active lanes
// take part: the sum adds 0 for inactive lanes; max and min pass x through at inactive lanes
// before the first active one and hold the running extremum after it.
Value cumsum(const Value& x, std::optional<Value> mask = std::nullopt, Loc loc = Loc::current());
Value cummax(const Value& x, std::optional<Value> mask = std::nullopt, Loc loc = Loc::current());
Value cummin(const Value& x, std::optional<Value> mask = std::nullopt, Loc loc = Loc::current());

// The running duplicate count of x (u32, i32 or f32, values compared bit for bit): counts[i] is
// how many active lanes j <= i hold x[i] (1 for a first occurrence); last[i] says lane i is the
// last active occurrence of its value. Inactive lanes: count 0, last false.
struct ScanCountResult {
  Value counts;  // i32, x's shape
  Value last;    // bool, x's shape
};
ScanCountResult scan_count(const Value& x, std::optional<Value> mask = std::nullopt,
                           Loc loc = Loc::current());

// The number of true lanes of a bool vector, in every lane of an i32 vector of length
// x.size / reduce.
Value all_reduce_population_count(const Value& x, int64_t reduce = 1, Loc loc = Loc::current());
// The index of the first true lane (x.size when there is none), in every lane of an i32 vector
// of length x.size / reduce.
Value all_reduce_ffs(const Value& x, int64_t reduce = 1, Loc loc = Loc::current());

struct SortOptions {
  std::optional<Value> mask;  // the valid lanes (default: all)
  bool descending = false;
};
// Sorts (num_lanes,) keys (u32, i32 or f32) and carries 32-bit value vectors along; stable, and
// the invalid (masked-off) lanes go last in their original order. Returns {keys, values...} and,
// when a mask is given, the output mask (true for the valid prefix) last.
std::vector<Value> sort_key_val(const Value& keys, const Value& values, SortOptions opts = {},
                                Loc loc = Loc::current());
std::vector<Value> sort_key_val(const Value& keys, const std::vector<Value>& values,
                                SortOptions opts = {}, Loc loc = Loc::current());

// out[i] = x[indices[i]] on a (num_lanes,) vector (lax.gather / take_along_axis on lanes); a
// negative index counts from the end, and an index outside [-n, n) is an error when it runs.
Value dynamic_gather(const Value& x, const Value& indices, Loc loc = Loc::current());

// ---- Packing ----------------------------------------------------------------------------------
enum class PackFormat {
  COMPRESSED,   // [a0, a1], [b0, b1] -> [[a0, a1], [b0, b1]]: a's lanes, then b's, shape (n, 2)
  INTERLEAVED,  // [a0, a1], [b0, b1] -> [a0, b0, a1, b1], shape (2n,)
};
// Packs two 1-D vectors of one dtype into elements of half the width: by default f32 -> bf16 and
// i32 -> i16 (converted as convert() does: floats round to nearest even, integers wrap);
// `preferred_element_type` picks another type of half the bit width.
Value pack(const Value& a, const Value& b, PackFormat format,
           std::optional<DType> preferred_element_type = std::nullopt, Loc loc = Loc::current());
// The inverse: bf16 -> f32 and i16 -> i32 by default, or `preferred_element_type` (twice the
// bit width).
std::pair<Value, Value> unpack(const Value& ab, PackFormat format,
                               std::optional<DType> preferred_element_type = std::nullopt,
                               Loc loc = Loc::current());

// ---- SMEM atomics ---------------------------------------------------------------------------------
// Atomically adds `value` to the i32 SMEM element `smem_ref` (a Ref of one element, e.g.
// smem.at(0)) and returns the old value. `subcore_id` names the vector subcore whose SMEM is
// updated (default: this one); the reference interpreter is subcore 0.
Value fetch_and_add(const Ref& smem_ref, Operand value, std::optional<Operand> subcore_id = std::nullopt,
                    Loc loc = Loc::current());

// ---- Parallel loops -------------------------------------------------------------------------------
struct ParallelLoopOptions {
  int64_t step = 1;    // > 0
  int64_t unroll = 1;  // a hint (recorded in the IR), >= 1
};
namespace detail {
// The loop as the IR's `for` runs it: over [start, stop) = [lo, hi) when step is 1, else over
// the trip numbers [0, ceil((hi - lo) / step)), which index() maps to lo + trip * step.
struct ParallelLoop {
  Value start, stop, lo;
  int64_t step = 1;
  ir::Attrs attrs;  // parallel = 1, unroll
  Value index(const Value& trip, const Loc& loc) const;
};
ParallelLoop parallel_loop_bounds(const Operand& lo, const Operand& hi, const ParallelLoopOptions& opts,
                                  const Loc& loc);
void check_parallel_loop_carries(const std::vector<Value>& carries, const Loc& loc);
}  // namespace detail

// for (i = lo; i < hi; i += step) body(i), where iterations must not depend on each other's
// memory effects (the SparseCore may overlap them); the interpreters run them in order. The loop
// is the IR's `for` with {parallel = 1, unroll = n}.
template <class F>
  requires std::is_invocable_v<F, Value>
void parallel_loop(const Operand& lo, const Operand& hi, F&& body, ParallelLoopOptions opts = {},
                   Loc loc = Loc::current()) {
  detail::ParallelLoop l = detail::parallel_loop_bounds(lo, hi, opts, loc);
  pallas::detail::trace_region({l.start.type()}, loc, [&](const std::vector<Value>& args) {
    body(l.index(args[0], loc));
    return std::vector<Value>{};
  });
  pallas::detail::finish_control_op(ir::OpCode::For, {l.start, l.stop}, 1, l.attrs, loc);
}

// With carried values (as fori_loop): carry = body(i, carry); returns the final carry. Carries
// flow from one iteration to the next in order; Refs cannot be carried.
template <class F>
  requires std::is_invocable_v<F, Value, Value>
Value parallel_loop(const Operand& lo, const Operand& hi, const Operand& carry, F&& body,
                    ParallelLoopOptions opts = {}, Loc loc = Loc::current()) {
  detail::ParallelLoop l = detail::parallel_loop_bounds(lo, hi, opts, loc);
  Value c = pallas::detail::as_carry(carry);
  detail::check_parallel_loop_carries({c}, loc);
  pallas::detail::trace_region({l.start.type(), c.type()}, loc, [&](const std::vector<Value>& args) {
    return pallas::detail::to_values(body(l.index(args[0], loc), args[1]));
  });
  return pallas::detail::finish_control_op(ir::OpCode::For, {l.start, l.stop, c}, 1, l.attrs, loc).at(0);
}

template <class F>
  requires std::is_invocable_v<F, Value, std::vector<Value>>
std::vector<Value> parallel_loop(const Operand& lo, const Operand& hi, const std::vector<Value>& carry,
                                 F&& body, ParallelLoopOptions opts = {}, Loc loc = Loc::current()) {
  detail::ParallelLoop l = detail::parallel_loop_bounds(lo, hi, opts, loc);
  detail::check_parallel_loop_carries(carry, loc);
  std::vector<ir::Type> arg_types = {l.start.type()};
  for (const ir::Type& t : pallas::detail::types_of(carry)) arg_types.push_back(t);
  pallas::detail::trace_region(arg_types, loc, [&](const std::vector<Value>& args) {
    return pallas::detail::to_values(
        body(l.index(args[0], loc), std::vector<Value>(args.begin() + 1, args.end())));
  });
  std::vector<Value> ops = {l.start, l.stop};
  ops.insert(ops.end(), carry.begin(), carry.end());
  return pallas::detail::finish_control_op(ir::OpCode::For, ops, 1, l.attrs, loc);
}

}  // namespace pallas::tpu_sc
