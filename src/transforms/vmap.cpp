// pl::vmap: batching a pallas_call. The batched call is the inner call's traced form with a new
// leading grid dimension (the batch), each batched operand's block squeezed along its batch axis
// and selected by the new grid index, and the kernel's grid queries moved past the new axis.
// Cases a single batched kernel cannot express run one inner call per batch element.
#include <algorithm>

#include "core/call.h"
#include "eval/eval.h"
#include "pallas/transforms.h"

namespace pallas {
namespace transforms {

struct VmapInfo {
  std::shared_ptr<PallasCallImpl> inner;
  std::vector<std::optional<int>> in_axes;  // one per call argument, as given
  std::vector<int> out_axes;                // one per output, normalized (>= 0)
  std::vector<int> out_ranks;               // rank of each output of the batched call
  int64_t axis_size = -1;                   // -1: from the arguments
  int depth = 1;                            // 1 + how many vmaps the inner call has
  SourceLoc loc;                            // where vmap was called
};

namespace {

std::vector<int> output_ranks(const PallasCallImpl& c) {
  if (c.vmap) return c.vmap->out_ranks;
  std::vector<int> ranks;
  for (const ShapeDtype& s : c.out_shapes) ranks.push_back(s.rank());
  return ranks;
}

std::string call_name(const PallasCallImpl& c) { return "vmap of pallas_call " + c.func_src_info(); }

// ---- Host arrays: the evaluators' shape ops (src/eval/eval.h) --------------------------------------
// a[..., i, ...] with `axis` removed.
Array take(const Array& a, int axis, int64_t i) {
  const auto rank = static_cast<size_t>(a.rank());
  ir::Ints start(rank, 0), limit(a.shape().begin(), a.shape().end()), strides(rank, 1);
  start[static_cast<size_t>(axis)] = i;
  limit[static_cast<size_t>(axis)] = i + 1;
  Shape s = a.shape();
  s.erase(s.begin() + axis);
  return eval::reshape(eval::slice(a, start, limit, strides), s);
}

// The parts (all of one shape) stacked along a new axis `axis`.
Array stack(const std::vector<Array>& parts, int axis) {
  Shape s = parts.at(0).shape();
  s.insert(s.begin() + axis, 1);
  std::vector<Array> expanded;
  for (const Array& p : parts) expanded.push_back(eval::reshape(p, s));
  return eval::concatenate(expanded, axis);
}

Array move_axis(const Array& a, int from, int to) {
  if (from == to) return a;
  ir::Ints perm;
  for (int d = 0; d < a.rank(); ++d)
    if (d != from) perm.push_back(d);
  perm.insert(perm.begin() + to, from);
  return eval::transpose(a, perm);
}

// ---- The plan for one set of argument shapes ------------------------------------------------------
struct Plan {
  int64_t size = -1;
  std::vector<std::optional<int>> axes;      // per call argument, normalized
  std::vector<std::optional<int>> run_axes;  // per non-grid argument: where the batched kernel
                                             // finds the batch (aliased inputs moved there)
  std::vector<ShapeDtype> inner_args;        // the non-grid arguments of one batch element
  bool loop = false;        // run one inner call per batch element
  bool loop_only = false;   // ... because no single batched kernel expresses it
  std::string loop_reason;
};

void fall_back(Plan& p, bool only, const std::string& why) {
  p.loop = true;
  p.loop_only = p.loop_only || only;
  if (p.loop_reason.empty() || only) p.loop_reason = why;
}

// `shapes`: one per call argument; nullopt for the dynamic grid sizes when tracing from shapes.
Plan make_plan(const PallasCallImpl& c, const std::vector<std::optional<ShapeDtype>>& shapes) {
  const VmapInfo& v = *c.vmap;
  const size_t nd = c.num_dynamic_grid_dims();
  if (v.in_axes.size() != shapes.size())
    throw Error(call_name(c) + ": in_axes has " + std::to_string(v.in_axes.size()) +
                    " entries but the call got " + std::to_string(shapes.size()) +
                    " arguments (its " + std::to_string(nd) +
                    " dynamic grid sizes, scalar-prefetch operands and inputs); give one batch "
                    "axis, or std::nullopt, per argument",
                v.loc);
  Plan p;
  p.axes.resize(shapes.size());
  std::string sizes;
  bool conflict = false;
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (!v.in_axes[i]) continue;
    if (!shapes[i]) {
      fall_back(p, true, "a batched dynamic grid size");
      continue;
    }
    const int rank = shapes[i]->rank();
    const int a = *v.in_axes[i];
    const int na = a < 0 ? a + rank : a;
    if (na < 0 || na >= rank)
      throw Error(call_name(c) + ": in_axes[" + std::to_string(i) + "] = " + std::to_string(a) +
                      " is out of range for argument " + std::to_string(i) + " of type " +
                      shapes[i]->to_string() +
                      (rank == 0 ? " (a scalar has no axis to batch over)"
                                 : " (valid axes: " + std::to_string(-rank) + " to " +
                                       std::to_string(rank - 1) + ")"),
                  v.loc);
    p.axes[i] = na;
    const int64_t b = shapes[i]->shape[na];
    sizes += (sizes.empty() ? "" : ", ") + std::string("argument ") + std::to_string(i) + " " +
             shapes[i]->to_string() + " has " + std::to_string(b) + " along axis " +
             std::to_string(na);
    if (p.size < 0) p.size = b;
    conflict = conflict || p.size != b;
  }
  if (v.axis_size >= 0) {
    if (p.size >= 0 && p.size != v.axis_size) conflict = true;
    sizes += (sizes.empty() ? "" : ", ") + std::string("axis_size = ") + std::to_string(v.axis_size);
    p.size = v.axis_size;
  }
  if (conflict)
    throw Error(call_name(c) + " got inconsistent batch sizes: " + sizes +
                    "; every batched argument needs the same size along its batch axis",
                v.loc);
  if (p.size < 0) {
    if (sizes.empty() && !p.loop_only)
      throw Error(call_name(c) +
                      ": no argument is batched (every in_axes entry is std::nullopt) and no "
                      "axis_size was given, so the batch size is unknown; pass axis_size",
                  v.loc);
    throw NotSupportedError(call_name(c) + ": tracing from shapes when only a dynamic grid size "
                                           "is batched (the batch size is unknown); pass axis_size",
                            v.loc);
  }
  for (size_t i = nd; i < shapes.size(); ++i) {
    ShapeDtype s = *shapes[i];
    if (p.axes[i]) s.shape.erase(s.shape.begin() + *p.axes[i]);
    p.inner_args.push_back(s);
    p.run_axes.push_back(p.axes[i]);
  }
  for (int j = 0; j < c.grid_spec.num_scalar_prefetch && nd + j < shapes.size(); ++j)
    if (p.axes[nd + j] && p.size != 1) fall_back(p, true, "a batched scalar-prefetch operand");
  if (nd > 0) fall_back(p, false, "a dynamic grid");
  if (p.size == 1) fall_back(p, false, "batch size 1");
  if (p.loop_only && p.size == 0)
    throw NotSupportedError(call_name(c) + ": batch size 0 with " + p.loop_reason, v.loc);
  if (p.size == 0) p.loop = false;
  // An aliased input shares its output's buffer, so it must be batched where the output is.
  for (const auto& [i, o] : c.opts.input_output_aliases)
    if (i >= 0 && i < static_cast<int>(p.run_axes.size()) && o >= 0 &&
        o < static_cast<int>(v.out_axes.size()))
      p.run_axes[i] = v.out_axes[o];
  return p;
}

// ---- The batched traced call ------------------------------------------------------------------------
// program_id(k) / num_programs(k) of the inner kernel mean its axis k, now axis k + 1.
void shift_grid_axes(ir::Region& r) {
  for (ir::Op& op : r.ops) {
    if (op.code == ir::OpCode::ProgramId || op.code == ir::OpCode::NumPrograms)
      op.attrs.set(ir::AttrKey::Axis, op.attrs.get_int(ir::AttrKey::Axis) + 1);
    for (ir::Region& sub : op.regions) shift_grid_axes(sub);
  }
}

void batch_block_mapping(BlockMapping& bm, std::optional<int> axis, int64_t size) {
  ir::Kernel& k = bm.index_map;
  const auto batch_index = static_cast<ir::ValueId>(k.values.size());
  k.values.push_back(ir::Type::scalar(DType::I32));
  k.body.args.insert(k.body.args.begin(), batch_index);
  shift_grid_axes(k.body);
  if (!axis) return;  // the same block for every batch element
  PALLAS_INTERNAL_CHECK(!k.body.ops.empty() && k.body.ops.back().code == ir::OpCode::Yield,
                        "index map without yield");
  std::vector<ir::ValueId>& yields = k.body.ops.back().operands;
  yields.insert(yields.begin() + *axis, batch_index);
  bm.block_shape.insert(bm.block_shape.begin() + *axis, BlockDim(squeezed));
  bm.array.shape.insert(bm.array.shape.begin() + *axis, size);
  bm.slice_sizes.insert(bm.slice_sizes.begin() + *axis, -1);
  bm.index_map_is_default = false;
}

int64_t scaled(int64_t x, int64_t n) {
  if (n != 0 && x > INT64_MAX / n) return INT64_MAX;
  return x * n;
}

std::shared_ptr<TracedCall> batch_traced_call(const TracedCall& inner, const Plan& p,
                                              const VmapInfo& v) {
  auto tc = std::make_shared<TracedCall>(inner);
  shift_grid_axes(tc->kernel.body);
  GridMapping& gm = tc->grid_mapping;
  gm.grid.insert(gm.grid.begin(), p.size);
  if (!gm.grid_names.empty()) {
    std::string name = "vmap" + std::to_string(v.depth);
    while (std::find(gm.grid_names.begin(), gm.grid_names.end(), name) != gm.grid_names.end())
      name += "_";
    gm.grid_names.insert(gm.grid_names.begin(), name);
  }
  std::vector<int> vmapped = {0};
  for (int d : gm.vmapped_dims) vmapped.push_back(d + 1);
  gm.vmapped_dims = vmapped;
  gm.index_map_params.insert(gm.index_map_params.begin(), ir::Type::scalar(DType::I32));
  for (size_t k = 0; k < gm.block_mappings.size(); ++k) {
    const bool is_input = static_cast<int>(k) < gm.num_inputs;
    std::optional<int> axis = is_input ? p.run_axes.at(gm.num_index_operands + k)
                                       : std::optional<int>(v.out_axes.at(k - gm.num_inputs));
    batch_block_mapping(gm.block_mappings[k], axis, p.size);
  }
  gm.check_invariants();
  if (tc->cost_estimate) {  // a given estimate is per call: the batch runs `size` calls
    CostEstimate& c = *tc->cost_estimate;
    c.flops = scaled(c.flops, p.size);
    c.transcendentals = scaled(c.transcendentals, p.size);
    c.bytes_accessed = scaled(c.bytes_accessed, p.size);
    c.remote_bytes_transferred = scaled(c.remote_bytes_transferred, p.size);
  }
  return tc;
}

// The arguments of batch element b: batched arguments sliced, the others as they are.
std::vector<Array> element_args(const Plan& p, const std::vector<Array>& all_args, int64_t b) {
  std::vector<Array> args;
  for (size_t i = 0; i < all_args.size(); ++i)
    args.push_back(p.axes[i] ? take(all_args[i], *p.axes[i], b) : all_args[i]);
  return args;
}

std::vector<Array> run_loop(const PallasCallImpl& c, const Plan& p,
                            const std::vector<Array>& all_args) {
  const VmapInfo& v = *c.vmap;
  PallasCall inner(v.inner);
  std::vector<std::vector<Array>> per_output(v.out_axes.size());
  for (int64_t b = 0; b < p.size; ++b) {
    std::vector<Array> outs = inner(element_args(p, all_args, b));
    for (size_t o = 0; o < outs.size(); ++o) per_output.at(o).push_back(std::move(outs[o]));
  }
  std::vector<Array> result;
  for (size_t o = 0; o < per_output.size(); ++o) result.push_back(stack(per_output[o], v.out_axes[o]));
  return result;
}

}  // namespace

std::shared_ptr<TracedCall> trace_vmapped(const PallasCallImpl& c,
                                          const std::vector<ShapeDtype>& args) {
  std::vector<std::optional<ShapeDtype>> shapes(c.num_dynamic_grid_dims());
  shapes.insert(shapes.end(), args.begin(), args.end());
  Plan p = make_plan(c, shapes);
  if (p.loop_only)
    throw NotSupportedError(call_name(c) + " with " + p.loop_reason +
                                " as one batched kernel (calling it runs one call per batch "
                                "element instead, so it has no single traced form)",
                            c.vmap->loc);
  std::shared_ptr<const TracedCall> inner = c.vmap->inner->trace(p.inner_args);
  return batch_traced_call(*inner, p, *c.vmap);
}

void check_vmapped_in_place(const PallasCallImpl& c, const std::vector<ShapeDtype>& all_args,
                            const std::string& who) {
  const std::vector<std::optional<ShapeDtype>> shapes(all_args.begin(), all_args.end());
  const Plan p = make_plan(c, shapes);
  const size_t nd = c.num_dynamic_grid_dims();
  if (p.loop_only || nd > 0)
    throw NotSupportedError(who + ": a vmapped call with " + p.loop_reason +
                                " on device arrays (it runs one call per batch element; call it with host arrays)",
                            c.vmap->loc);
  for (size_t j = 0; j < p.run_axes.size(); ++j) {
    const std::optional<int>& given = p.axes[nd + j];
    if (given == p.run_axes[j]) continue;
    throw NotSupportedError(who + ": a vmapped call on device arrays whose input " + std::to_string(j) + " is " +
                                (given ? "batched along axis " + std::to_string(*given) : std::string("not batched")) +
                                " but aliased to an output batched along axis " + std::to_string(*p.run_axes[j]) +
                                " (device arrays are not copied to move it: batch the input along that axis, "
                                "or call with host arrays)",
                            c.vmap->loc);
  }
}

std::optional<CostEstimate> estimate_vmapped_loop(const PallasCallImpl& c,
                                                  const std::vector<Array>& all_args) {
  std::vector<std::optional<ShapeDtype>> shapes;
  for (const Array& a : all_args) shapes.emplace_back(a.shape_dtype());
  Plan p = make_plan(c, shapes);
  if (!p.loop) return std::nullopt;
  // The sum of the per-element calls' costs: that is how the call runs.
  PallasCall inner(c.vmap->inner);
  CostEstimate total{};
  for (int64_t b = 0; b < p.size; ++b) {
    CostEstimate e = estimate_cost(inner, element_args(p, all_args, b));
    total.flops += e.flops;
    total.transcendentals += e.transcendentals;
    total.bytes_accessed += e.bytes_accessed;
    total.remote_bytes_transferred += e.remote_bytes_transferred;
  }
  return total;
}

std::vector<Array> call_vmapped(PallasCallImpl& c, const std::vector<Array>& all_args) {
  std::vector<std::optional<ShapeDtype>> shapes;
  for (const Array& a : all_args) shapes.emplace_back(a.shape_dtype());
  Plan p = make_plan(c, shapes);
  if (p.loop) return run_loop(c, p, all_args);
  std::vector<int64_t> grid;
  std::vector<Array> args;
  std::shared_ptr<const TracedCall> tc = c.prepare(all_args, grid, args);
  const size_t nd = c.num_dynamic_grid_dims();
  for (size_t j = 0; j < args.size(); ++j) {
    const std::optional<int>& given = p.axes[nd + j];
    const std::optional<int>& wanted = p.run_axes[j];
    if (given == wanted) continue;
    if (given) {
      args[j] = move_axis(args[j], *given, *wanted);
    } else {
      std::vector<Array> copies(static_cast<size_t>(p.size), args[j]);
      args[j] = stack(copies, *wanted);
    }
  }
  return c.run(*tc, args, grid);
}

}  // namespace transforms

PallasCall vmap(const PallasCall& call, std::vector<std::optional<int>> in_axes,
                std::vector<int> out_axes, int64_t axis_size, Loc loc) {
  const std::shared_ptr<PallasCallImpl>& inner = call.impl();
  const SourceLoc where = SourceLoc::from(loc);
  const std::string name = "vmap of pallas_call " + inner->func_src_info();
  if (inner->opts.mesh_shape)
    throw NotSupportedError(name + ": batching a pallas_call with a mesh (core_map / run_on_mesh)",
                            where);
  if (axis_size < -1)
    throw Error(name + ": axis_size must be >= 0 (or -1: from the arguments), got " +
                    std::to_string(axis_size),
                where);
  std::vector<int> ranks = transforms::output_ranks(*inner);
  const size_t num_outputs = ranks.size();
  if (out_axes.empty()) out_axes.assign(num_outputs, 0);
  if (out_axes.size() == 1 && num_outputs != 1) out_axes.assign(num_outputs, out_axes[0]);
  if (out_axes.size() != num_outputs)
    throw Error(name + ": out_axes has " + std::to_string(out_axes.size()) +
                    " entries but the call has " + std::to_string(num_outputs) +
                    " outputs; give one per output, or one for all",
                where);
  for (size_t o = 0; o < num_outputs; ++o) {
    const int r = ranks[o] + 1;
    const int a = out_axes[o];
    out_axes[o] = a < 0 ? a + r : a;
    if (out_axes[o] < 0 || out_axes[o] >= r)
      throw Error(name + ": out_axes[" + std::to_string(o) + "] = " + std::to_string(a) +
                      " is out of range for output " + std::to_string(o) + ", which has rank " +
                      std::to_string(r) + " once batched (valid axes: " + std::to_string(-r) +
                      " to " + std::to_string(r - 1) + ")",
                  where);
    ranks[o] = r;
  }
  const GridSpec& gs = inner->grid_spec;
  if (gs.in_specs.given()) {
    const size_t expected = inner->num_dynamic_grid_dims() +
                            static_cast<size_t>(gs.num_scalar_prefetch) + gs.in_specs.size();
    if (in_axes.size() != expected)
      throw Error(name + ": in_axes has " + std::to_string(in_axes.size()) +
                      " entries but the call takes " + std::to_string(expected) +
                      " arguments (dynamic grid sizes, scalar-prefetch operands and inputs); "
                      "give one batch axis, or std::nullopt, per argument",
                  where);
  }

  auto impl = std::make_shared<PallasCallImpl>();
  impl->kernel = inner->kernel;
  impl->out_shapes = inner->out_shapes;
  impl->opts = inner->opts;
  impl->grid_spec = inner->grid_spec;
  impl->backend = inner->backend;
  impl->loc = inner->loc;
  impl->compiler_params = inner->compiler_params;
  // Batch elements are independent: the new leading grid dimension is parallel.
  for (auto& [backend, params] : impl->compiler_params)
    std::visit(
        [](auto& p) {
          if constexpr (requires { p.dimension_semantics; })
            if (!p.dimension_semantics.empty())
              p.dimension_semantics.insert(p.dimension_semantics.begin(), "parallel");
        },
        params);
  auto info = std::make_shared<transforms::VmapInfo>();
  info->inner = inner;
  info->in_axes = std::move(in_axes);
  info->out_axes = std::move(out_axes);
  info->out_ranks = std::move(ranks);
  info->axis_size = axis_size;
  info->depth = inner->vmap ? inner->vmap->depth + 1 : 1;
  info->loc = where;
  impl->vmap = info;
  return PallasCall(impl);
}

}  // namespace pallas
