// BlockSpec → BlockMapping and GridSpec → GridMapping: tracing the index maps and every check
// the seed makes, with its wording.
#include <algorithm>

#include "core/call.h"
#include "core/trace_env.h"

namespace pallas {
namespace core {

namespace {

std::string shape_tuple(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  if (s.size() == 1) out += ",";
  return out + ")";
}

std::string block_shape_tuple(const BlockShape& b) {
  std::string s = "(";
  for (size_t i = 0; i < b.size(); ++i) s += (i ? ", " : "") + b[i].to_string();
  if (b.size() == 1) s += ",";
  return s + ")";
}

const char* index_kind_name(const Index& i) {
  switch (i.kind()) {
    case Index::Kind::Int: return i.start().is_value() ? "Value" : "int";
    case Index::Kind::Slice: return "Slice";
    case Index::Kind::All: return "all";
  }
  return "?";
}

BlockMapping make_block_mapping(const BlockSpec& spec, const std::string& origin,
                                const ShapeDtype& array, const GridMapping& gm,
                                const std::vector<std::string>& grid_names) {
  BlockMapping bm;
  bm.origin = origin;
  bm.array = array;
  bm.pipeline_mode = spec.pipeline_mode;
  if (spec.block_shape) {
    bm.block_shape = *spec.block_shape;
    if (bm.block_shape.size() != array.shape.size())
      throw Error("Block shape for " + origin + " (= " + block_shape_tuple(bm.block_shape) +
                      ") must have the same number of dimensions as the array shape " +
                      shape_tuple(array.shape) + ".",
                  spec.loc);
  } else {
    for (int64_t d : array.shape) bm.block_shape.emplace_back(d);
  }
  Shape ref_shape;
  for (size_t d = 0; d < bm.block_shape.size(); ++d) {
    const BlockDim& b = bm.block_shape[d];
    if (!b.is_squeezed() && b.size() < 0)
      throw Error("Block shape for " + origin + " has a negative size in dimension " +
                      std::to_string(d) + ": " + block_shape_tuple(bm.block_shape),
                  spec.loc);
    if (b.is_element() && (b.element().padding.first < 0 || b.element().padding.second < 0))
      throw Error("Block shape for " + origin + " has negative Element padding in dimension " +
                      std::to_string(d),
                  spec.loc);
    if (!b.is_squeezed()) ref_shape.push_back(b.size());
  }
  MemorySpace space = spec.memory_space.value_or(MemorySpace::Vmem);
  bm.block_ref_type = ir::Type::ref(ref_shape, array.dtype, space);

  // Trace the index map: params are the grid indices and the prefetch refs.
  std::string src_info = "at " + spec.loc.to_string();
  TraceEnv env{TraceEnv::Kind::IndexMap, grid_names, src_info, origin};
  ScopedTraceEnv scoped(&env);
  detail::TraceScope scope("index_map_" + origin, std::source_location::current());
  std::vector<Value> params = scope.add_params(gm.index_map_params);
  Indices indices;
  if (spec.index_map) {
    std::vector<IndexMapArg> args(params.begin(), params.end());
    indices = spec.index_map(args);
  } else {
    bm.index_map_is_default = true;
    indices.assign(bm.block_shape.size(), Index(0));
  }
  if (indices.size() != bm.block_shape.size())
    throw Error("Index map function " + src_info + " for " + origin + " must return " +
                    std::to_string(bm.block_shape.size()) + " values to match block_shape=" +
                    block_shape_tuple(bm.block_shape) + ". Currently returning " +
                    std::to_string(indices.size()) + " values.",
                spec.loc);
  std::vector<Value> yields;
  bm.slice_sizes.assign(indices.size(), -1);
  for (size_t i = 0; i < indices.size(); ++i) {
    const Index& idx = indices[i];
    const BlockDim& bd = bm.block_shape[i];
    if (bd.is_bounded_slice()) {
      if (idx.kind() != Index::Kind::Slice)
        throw Error("index_map returned a value of type " + std::string(index_kind_name(idx)) +
                        " at position " + std::to_string(i) + " with block dimension " +
                        bd.to_string() + " when it should be pl.Slice (pl::ds(start, size))",
                    spec.loc);
      if (idx.size() > bd.size() || idx.size() < 0)
        throw Error("index_map for " + origin + " returned ds(..., " + std::to_string(idx.size()) +
                        ") at position " + std::to_string(i) + ", larger than its block dimension " +
                        bd.to_string(),
                    spec.loc);
      if (idx.stride() != 1)
        throw NotSupportedError("BoundedSlice index maps with a stride", spec.loc);
      bm.slice_sizes[i] = idx.size();
    } else if (idx.kind() != Index::Kind::Int) {
      throw Error("index_map returned a value of type " + std::string(index_kind_name(idx)) +
                      " at position " + std::to_string(i) + " with block dimension " +
                      bd.to_string() + " when it should be a scalar",
                  spec.loc);
    }
    Value v;
    if (idx.start().is_value()) {
      v = idx.start().as_value();
    } else if (idx.start().kind() == Operand::Kind::Int) {
      v = scalar(static_cast<double>(idx.start().int_literal()), DType::I32);
    } else {
      throw Error("Index map function " + src_info + " for " + origin +
                      " must return integer scalars. Output[" + std::to_string(i) +
                      "] is a floating-point literal.",
                  spec.loc);
    }
    const ir::Type& t = v.type();
    if (t.rank() != 0 || (t.dtype != DType::I32 && t.dtype != DType::I64))
      throw Error("Index map function " + src_info + " for " + origin +
                      " must return integer scalars. Output[" + std::to_string(i) +
                      "] has type " + t.to_string() + ".",
                  spec.loc);
    yields.push_back(v);
  }
  bm.index_map = scope.finish(yields, std::source_location::current());
  bm.index_map.loc = spec.loc;
  bm.check_invariants();
  return bm;
}

std::string specs_mismatch(const char* what1, size_t n1, const char* what2, size_t n2,
                           const char* items2) {
  return std::string("Pytree for ") + what1 + " and " + what2 +
         " do not match. There are 1 mismatches, including:\n    * " + what1 + " is a list of " +
         std::to_string(n1) + " BlockSpecs but " + what2 + " is a list of " + std::to_string(n2) +
         " " + items2 + ", so the lengths do not match";
}

}  // namespace

GridMapping build_grid_mapping(const PallasCallImpl& call, const std::vector<ShapeDtype>& args) {
  const GridSpec& gs = call.grid_spec;
  GridMapping gm;
  for (const GridDim& d : gs.grid.dims) gm.grid.push_back(d.is_dynamic() ? -1 : d.size());
  gm.grid_names = gs.grid.names;
  gm.num_index_operands = gs.num_scalar_prefetch;
  if (gs.num_scalar_prefetch < 0 || gs.num_scalar_prefetch > static_cast<int>(args.size()))
    throw Error("num_scalar_prefetch=" + std::to_string(gs.num_scalar_prefetch) + " but only " +
                    std::to_string(args.size()) + " inputs were given",
                call.loc);
  for (size_t i = 0; i < gm.grid.size(); ++i) gm.index_map_params.push_back(ir::Type::scalar(DType::I32));
  for (int i = 0; i < gs.num_scalar_prefetch; ++i)
    gm.index_map_params.push_back(ir::Type::ref(args[i].shape, args[i].dtype, MemorySpace::Smem));
  for (const ScratchShape& s : gs.scratch_shapes) {
    gm.scratch_types.push_back(ir::Type::ref(s.shape, s.dtype, s.space));
    gm.scratch_barrier_arrivals.push_back(s.barrier_arrivals);
    if (s.union_members)
      throw NotSupportedError("gpu::Union scratch outside gpu::kernel (pallas_call scratch is separate arrays)",
                              call.loc);
    gm.scratch_unions.push_back(s.in_union);
    std::vector<int> collective;
    for (const std::string& axis : s.collective_axes) {
      if (!call.opts.gpu_kernel)
        throw NotSupportedError("gpu::ClusterBarrier scratch outside gpu::kernel (a pallas_call has no clusters)",
                                call.loc);
      const auto at = std::find(gm.grid_names.begin(), gm.grid_names.end(), axis);
      PALLAS_INTERNAL_CHECK(at != gm.grid_names.end(), "a collective axis gpu::kernel checked");
      collective.push_back(static_cast<int>(at - gm.grid_names.begin()));
    }
    gm.scratch_barrier_collective_axes.push_back(std::move(collective));
    gm.scratch_grid_wide.push_back(false);
  }

  size_t num_in = args.size() - gs.num_scalar_prefetch;
  gm.num_inputs = static_cast<int>(num_in);
  gm.num_outputs = static_cast<int>(call.out_shapes.size());
  if (gs.in_specs.given() && gs.in_specs.size() != num_in)
    throw Error(specs_mismatch("`in_specs`", gs.in_specs.size(), "`inputs`", num_in, "arrays"),
                call.loc);
  if (gs.out_specs.given() && gs.out_specs.size() != call.out_shapes.size())
    throw Error(specs_mismatch("`out_specs`", gs.out_specs.size(), "`out_shape`",
                               call.out_shapes.size(), "ShapeDtypes"),
                call.loc);
  BlockSpec whole;
  whole.loc = call.loc;
  whole.memory_space = call.opts.default_memory_space;
  for (size_t i = 0; i < num_in; ++i) {
    const BlockSpec& spec = gs.in_specs.given() ? gs.in_specs.specs()[i] : whole;
    gm.block_mappings.push_back(make_block_mapping(
        spec, "args[" + std::to_string(i + gs.num_scalar_prefetch) + "]",
        args[i + gs.num_scalar_prefetch], gm, gm.grid_names));
  }
  for (size_t i = 0; i < call.out_shapes.size(); ++i) {
    const BlockSpec& spec = gs.out_specs.given() ? gs.out_specs.specs()[i] : whole;
    gm.block_mappings.push_back(make_block_mapping(spec, "outputs[" + std::to_string(i) + "]",
                                                   call.out_shapes[i], gm, gm.grid_names));
  }
  gm.check_invariants();
  return gm;
}

// ---- Index map evaluation ---------------------------------------------------------------------------
struct IndexMapEvaluator::Impl {
  const ir::Kernel& k;
  // Fast path: each yielded value is a grid index (param k >= 0) or a constant.
  bool simple = true;
  std::vector<int> param;       // grid param index, or -1
  std::vector<int64_t> value;   // constant value when param < 0
  std::unique_ptr<eval::Interpreter> interp;
  explicit Impl(const ir::Kernel& kernel) : k(kernel) {}
};

IndexMapEvaluator::IndexMapEvaluator(const ir::Kernel& index_map)
    : impl_(std::make_unique<Impl>(index_map)) {
  const ir::Kernel& k = index_map;
  PALLAS_INTERNAL_CHECK(!k.body.ops.empty() && k.body.ops.back().code == ir::OpCode::Yield,
                        "index map without yield");
  std::map<ir::ValueId, int64_t> constants;
  for (const ir::Op& op : k.body.ops)
    if (op.code == ir::OpCode::Constant && k.type(op.results[0]).is_scalar())
      constants[op.results[0]] = op.attrs.get_scalar(ir::AttrKey::Value).as_int64();
  for (ir::ValueId y : k.body.ops.back().operands) {
    auto p = std::find(k.body.args.begin(), k.body.args.end(), y);
    if (p != k.body.args.end()) {
      impl_->param.push_back(static_cast<int>(p - k.body.args.begin()));
      impl_->value.push_back(0);
    } else if (constants.count(y)) {
      impl_->param.push_back(-1);
      impl_->value.push_back(constants[y]);
    } else {
      impl_->simple = false;
    }
  }
  if (!impl_->simple) impl_->interp = std::make_unique<eval::Interpreter>(k);
}

IndexMapEvaluator::~IndexMapEvaluator() = default;
IndexMapEvaluator::IndexMapEvaluator(IndexMapEvaluator&&) noexcept = default;

void IndexMapEvaluator::eval(const GridPoint& grid, const std::vector<eval::RtValue>& prefetch,
                             std::vector<int64_t>& out) {
  out.clear();
  if (impl_->simple) {
    for (size_t i = 0; i < impl_->param.size(); ++i)
      out.push_back(impl_->param[i] >= 0 ? grid.program_ids[impl_->param[i]] : impl_->value[i]);
    return;
  }
  std::vector<eval::RtValue> params;
  for (int64_t g : grid.program_ids) params.emplace_back(Array::full({}, Scalar::of_int(g, DType::I32)));
  params.insert(params.end(), prefetch.begin(), prefetch.end());
  std::vector<Array> res = impl_->interp->run(params, grid);
  for (const Array& a : res) out.push_back(a.scalar_at_flat(0).as_int64());
}


void use_mesh_as_grid(CallOptions& opts, const std::vector<std::pair<std::string, int64_t>>& axes,
                      const std::string& who, const SourceLoc& loc) {
  if (!opts.grid.empty() || opts.grid_spec || opts.in_specs.given() || opts.out_specs.given())
    throw Error(who + " takes no grid or BlockSpecs: the mesh is the grid, and the body sees "
                      "whole-array Refs",
                loc);
  Grid grid;
  std::vector<int64_t> shape;
  for (const auto& [name, size] : axes) {
    grid.dims.emplace_back(size);
    grid.names.push_back(name);
    shape.push_back(size);
  }
  opts.grid = std::move(grid);
  opts.mesh_shape = std::move(shape);
}

int named_grid_axis(const GridMapping& gm, const std::string& name) {
  for (size_t i = 0; i < gm.grid_names.size(); ++i)
    if (gm.grid_names[i] == name) return static_cast<int>(i);
  return -1;
}

bool cluster_barrier_peers(const std::vector<int64_t>& a, const std::vector<int64_t>& b,
                           const std::vector<int>& collective) {
  int differ = 0;
  for (size_t d = 0; d < a.size(); ++d) {
    if (a[d] == b[d]) continue;
    if (++differ > 1 || std::find(collective.begin(), collective.end(), static_cast<int>(d)) == collective.end())
      return false;
  }
  return true;
}

bool multicast_peers(const std::vector<int64_t>& a, const std::vector<int64_t>& b, const std::vector<int>& collective) {
  for (size_t d = 0; d < a.size(); ++d)
    if (a[d] != b[d] && std::find(collective.begin(), collective.end(), static_cast<int>(d)) == collective.end())
      return false;
  return true;
}

std::optional<size_t> multicast_share_dim(const std::vector<int64_t>& shape, int64_t peers) {
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] % peers == 0) return d;
  return std::nullopt;
}

void unravel_row_major(int64_t linear, const std::vector<int64_t>& dims, std::vector<int64_t>& out) {
  out.resize(dims.size());
  for (int d = static_cast<int>(dims.size()) - 1; d >= 0; --d) {
    out[d] = linear % dims[d];
    linear /= dims[d];
  }
}

}  // namespace core
}  // namespace pallas
