// Entry points of the TPU interpret mode: pallas_call with InterpretParams, core_map, and
// run_on_mesh (SPMD over simulated devices).
#include "core/blocks.h"
#include "core/call.h"
#include "pallas/sparse_core_info.h"
#include "tpu_interpret/machine.h"

namespace pallas {

namespace tpu_interpret {

namespace {
void check_region(const ir::Kernel& k, const ir::Region& r) {
  for (const ir::Op& op : r.ops) {
    for (const ir::Region& sub : op.regions) check_region(k, sub);
    bool direct = op.code == ir::OpCode::Load || op.code == ir::OpCode::Store ||
                  op.code == ir::OpCode::Swap || op.code == ir::OpCode::AtomicRmw ||
                  op.code == ir::OpCode::AtomicCas;
    if (!direct) continue;
    MemorySpace s = k.type(op.operands[0]).space;
    if (s != MemorySpace::Hbm && s != MemorySpace::Any) continue;
    // JAX's names: a load is load_p; stores, swaps and atomics are swap_p.
    const char* prim = op.code == ir::OpCode::Load ? "load_p" : "swap_p";
    throw Error(std::string(prim) +
                    ": Buffers with a memory space of HBM or ANY cannot be referenced directly. "
                    "Instead, use `pltpu::sync_copy` or `pltpu::async_copy`.",
                op.loc);
  }
}

MachineConfig config_of(const PallasCallImpl& c, const tpu::Mesh& mesh) {
  MachineConfig cfg;
  cfg.params = c.opts.interpret.tpu().value_or(tpu::InterpretParams{});
  cfg.mesh = mesh;
  cfg.num_cores = cfg.params.num_cores_per_device;
  auto it = c.compiler_params.find("mosaic_tpu");
  if (it != c.compiler_params.end()) {
    const auto& tp = std::get<tpu::CompilerParams>(it->second);
    cfg.dimension_semantics = tp.dimension_semantics;
    cfg.collective_id = tp.collective_id;
  }
  if (c.opts.mesh_shape) {
    // One thread per mesh point (a core, or a SparseCore's vector subcore); every mesh axis is
    // parallel, so thread t runs the t-th point in row-major order.
    cfg.core_map = true;
    cfg.sc_kind = c.opts.mesh_kind;
    cfg.num_cores = 1;
    for (int64_t m : *c.opts.mesh_shape) cfg.num_cores *= static_cast<int>(m);
    if (c.opts.mesh_kind == "sc_vector_subcore")
      cfg.subcores_per_core = static_cast<int>(c.opts.mesh_shape->at(1));
    cfg.dimension_semantics.assign(c.opts.mesh_shape->size(),
                                   cfg.num_cores > 1 ? "parallel" : "arbitrary");
  }
  return cfg;
}

// Whether the call runs on a SparseCore's vector subcores (a VectorSubcoreMesh kernel or a
// pallas_call of kernel_type SC_VECTOR_SUBCORE), and whether on a SparseCore at all.
bool on_sparse_core(const PallasCallImpl& c, bool vector_only) {
  if (c.opts.mesh_kind == "sc_vector_subcore") return true;
  if (c.opts.mesh_kind == "sc_scalar_subcore") return !vector_only;
  auto it = c.compiler_params.find("mosaic_tpu");
  if (it == c.compiler_params.end()) return false;
  const tpu::KernelType t = std::get<tpu::CompilerParams>(it->second).kernel_type;
  return t == tpu::KernelType::SC_VECTOR_SUBCORE || (!vector_only && t == tpu::KernelType::SC_SCALAR_SUBCORE);
}

// What a vector subcore can sort and reverse (the seed's SparseCore lowering of lax.sort and
// lax.rev): one key, every operand one (num_lanes,) vector; rev of that vector's only dim.
void check_sparse_core_region(const ir::Kernel& k, const ir::Region& r, int64_t lanes) {
  for (const ir::Op& op : r.ops) {
    for (const ir::Region& sub : op.regions) check_sparse_core_region(k, sub, lanes);
    if (op.code == ir::OpCode::Sort) {
      if (op.attrs.get_int(ir::AttrKey::NumKeys) != 1)
        throw NotSupportedError("a sort with " + std::to_string(op.attrs.get_int(ir::AttrKey::NumKeys)) +
                                    " keys on a SparseCore vector subcore (one key only)",
                                op.loc);
      for (size_t i = 0; i < op.operands.size(); ++i)
        if (k.type(op.operands[i]).shape != Shape{lanes})
          throw NotSupportedError("operand " + std::to_string(i) + " of a sort on a SparseCore "
                                  "vector subcore has shape " +
                                      core::tuple_string(k.type(op.operands[i]).shape) +
                                      " (only (" + std::to_string(lanes) + ",) vectors)",
                                  op.loc);
    }
    if (op.code == ir::OpCode::Rev &&
        (op.attrs.get_ints(ir::AttrKey::Dims) != ir::Ints{0} || k.type(op.operands[0]).shape != Shape{lanes}))
      throw NotSupportedError("rev of " + core::tuple_string(k.type(op.operands[0]).shape) +
                                  " on a SparseCore vector subcore (only dimension 0 of a (" +
                                  std::to_string(lanes) + ",) vector)",
                              op.loc);
  }
}

void check_sparse_core_kernel(const PallasCallImpl& c, const TracedCall& call) {
  if (!on_sparse_core(c, true)) return;
  check_sparse_core_region(call.kernel, call.kernel.body, tpu_sc::sparse_core_info().num_lanes);
}

// The block rules of a SparseCore pallas_call (kernel_type SC_*): Blocked dims only, and a
// minor dimension that is a multiple of 8 for blocks of rank > 1.
void check_sparse_core_blocks(const PallasCallImpl& c, const TracedCall& call) {
  if (!on_sparse_core(c, false) || !c.opts.mesh_kind.empty()) return;
  const GridMapping& gm = call.grid_mapping;
  if (gm.grid.empty() && gm.num_index_operands > 0)
    throw Error("a SparseCore kernel with an empty grid cannot take scalar-prefetch (index) "
                "operands",
                c.loc);
  for (const BlockMapping& bm : gm.block_mappings) {
    std::vector<int64_t> shape;
    for (size_t d = 0; d < bm.block_shape.size(); ++d) {
      const BlockDim& b = bm.block_shape[d];
      if (!b.is_blocked())
        throw NotSupportedError(std::string(b.is_squeezed() ? "a Squeezed"
                                            : b.is_element() ? "an Element"
                                                             : "a BoundedSlice") +
                                    " block dimension (dimension " + std::to_string(d) + " of " +
                                    bm.origin + ") in a SparseCore kernel, which takes Blocked "
                                    "dimensions only",
                                bm.index_map.loc);
      shape.push_back(core::block_extent(bm, d));
    }
    if (shape.size() > 1 && shape.back() % 8 != 0)
      throw Error("the minor-most dimension of a block of " + bm.origin +
                      " must be a multiple of 8 on a SparseCore, got block shape " +
                      core::tuple_string(shape),
                  bm.index_map.loc);
  }
}
}  // namespace

void check_kernel(const ir::Kernel& k) { check_region(k, k.body); }

std::vector<std::vector<Array>> run(const PallasCallImpl& c, const TracedCall& call,
                                    const std::vector<std::vector<Array>>& args,
                                    const std::vector<int64_t>& grid, const tpu::Mesh& mesh) {
  check_sparse_core_blocks(c, call);
  check_sparse_core_kernel(c, call);
  Machine m(call, config_of(c, mesh), c.loc);
  return m.run(args, grid);
}

}  // namespace tpu_interpret

namespace tpu {

int64_t Mesh::num_devices() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::vector<std::vector<Array>> run_on_mesh(const PallasCall& call, const Mesh& mesh,
                                            const std::vector<std::vector<Array>>& args) {
  PallasCallImpl& c = *call.impl();
  if (mesh.axis_names.size() != mesh.shape.size())
    throw Error("run_on_mesh: the mesh needs one name per axis (" +
                std::to_string(mesh.axis_names.size()) + " names for " +
                std::to_string(mesh.shape.size()) + " axes)");
  for (size_t i = 0; i < mesh.shape.size(); ++i) {
    if (mesh.shape[i] < 1)
      throw Error("run_on_mesh: mesh axis '" + mesh.axis_names[i] + "' has size " +
                  std::to_string(mesh.shape[i]));
    for (size_t j = 0; j < i; ++j)
      if (mesh.axis_names[i] == mesh.axis_names[j])
        throw Error("run_on_mesh: mesh axis name '" + mesh.axis_names[i] + "' is repeated");
  }
  if (c.backend != "tpu_interpret")
    throw Error("run_on_mesh runs calls in the TPU interpret mode; this call runs on '" +
                    c.backend + "' (pass .interpret = pltpu::InterpretParams{})",
                c.loc);
  const int64_t n = mesh.num_devices();
  if (static_cast<int64_t>(args.size()) != n)
    throw Error("run_on_mesh: the mesh has " + std::to_string(n) + " devices but " +
                    std::to_string(args.size()) + " argument lists were given (one per device)",
                c.loc);
  std::vector<int64_t> grid;
  std::vector<std::vector<Array>> per_device(args.size());
  std::shared_ptr<const TracedCall> tc;
  for (size_t d = 0; d < args.size(); ++d) {
    std::vector<int64_t> g;
    std::shared_ptr<const TracedCall> t = c.prepare(args[d], g, per_device[d]);
    if (d == 0) {
      tc = t;
      grid = g;
    } else if (t != tc || g != grid) {
      throw Error("run_on_mesh: device " + std::to_string(d) +
                      "'s arguments differ in shape, dtype or dynamic grid size from device 0's "
                      "(every device runs the same program)",
                  c.loc);
    }
  }
  return tpu_interpret::run(c, *tc, per_device, grid, mesh);
}

namespace detail {
PallasCall make_core_map(KernelFn body, std::vector<ShapeDtype> out_shapes,
                         const TensorCoreMesh& mesh, CallOptions opts, const SourceLoc& loc) {
  if (mesh.num_cores < 1)
    throw Error("TensorCoreMesh needs at least one core, got " + std::to_string(mesh.num_cores), loc);
  core::use_mesh_as_grid(opts, {{mesh.axis_name, mesh.num_cores}}, "core_map", loc);
  opts.default_memory_space = MemorySpace::Any;
  if (!opts.interpret.tpu()) {
    if (opts.interpret.enabled() || opts.backend)
      throw Error("core_map runs in the TPU interpret mode: leave .interpret unset or pass "
                  "pltpu::InterpretParams{...}",
                  loc);
    opts.interpret = InterpretParams{};
  }
  return pallas::detail::make_pallas_call(std::move(body), std::move(out_shapes), std::move(opts),
                                          loc);
}
}  // namespace detail

}  // namespace tpu
}  // namespace pallas
