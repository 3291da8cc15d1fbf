// The SparseCore entry points (include/pallas/sparse_core.h): kernels on scalar- and
// vector-subcore meshes, run by the TPU interpret mode with one thread per (sub)core.
#include "core/call.h"
#include "pallas/sparse_core.h"

namespace pallas::tpu_sc {
namespace detail {
namespace {

bool has_dimension_semantics(const CallOptions& opts) {
  auto given = [](const CompilerParams& p) {
    const auto* tp = std::get_if<tpu::CompilerParams>(&p);
    return tp && !tp->dimension_semantics.empty();
  };
  if (opts.compiler_params && given(*opts.compiler_params)) return true;
  for (const auto& [backend, p] : opts.compiler_params_by_backend)
    if (given(p)) return true;
  return false;
}

PallasCall make(KernelFn body, std::vector<ShapeDtype> out_shapes, const char* mesh_name,
                std::vector<std::pair<std::string, int>> axes, const std::string& kind,
                CallOptions opts, const SourceLoc& loc) {
  for (size_t i = 0; i < axes.size(); ++i) {
    if (axes[i].first.empty()) throw Error(std::string(mesh_name) + ": an axis name is empty", loc);
    if (axes[i].second < 1)
      throw Error(std::string(mesh_name) + ": axis '" + axes[i].first + "' has size " +
                      std::to_string(axes[i].second) + "; it needs at least 1",
                  loc);
    for (size_t j = 0; j < i; ++j)
      if (axes[i].first == axes[j].first)
        throw Error(std::string(mesh_name) + ": the core and subcore axes need different names, "
                    "both are '" + axes[i].first + "'",
                    loc);
  }
  if (has_dimension_semantics(opts))
    throw Error(std::string("dimension_semantics cannot be given for a kernel on a ") + mesh_name +
                    ": its core (and subcore) axes are always parallel",
                loc);
  for (size_t s = 0; s < opts.scratch_shapes.size(); ++s)
    if (kind == "sc_scalar_subcore" && opts.scratch_shapes[s].space == MemorySpace::Vmem)
      throw Error("scratch_shapes[" + std::to_string(s) + "]: a ScalarSubcoreMesh kernel has no " +
                      "VMEM (the vector subcores' memory); use VMEM_SHARED or SMEM",
                  loc);
  std::vector<std::pair<std::string, int64_t>> grid_axes(axes.begin(), axes.end());
  core::use_mesh_as_grid(opts, grid_axes, std::string("a kernel on a ") + mesh_name, loc);
  opts.mesh_kind = kind;
  opts.default_memory_space = MemorySpace::Hbm;
  if (!opts.interpret.tpu()) {
    if (opts.interpret.enabled() || opts.backend)
      throw Error(std::string("a kernel on a ") + mesh_name +
                      " runs in the TPU interpret mode: leave .interpret unset or pass "
                      "pltpu::InterpretParams{...}",
                  loc);
    opts.interpret = tpu::InterpretParams{};
  }
  return pallas::detail::make_pallas_call(std::move(body), std::move(out_shapes), std::move(opts),
                                          loc);
}

int or_default(int given, int fallback) { return given == 0 ? fallback : given; }

// A mesh may not ask for more (sub)cores than the simulated chip has.
void check_fits(const char* mesh_name, int cores, int subcores, const SparseCoreInfo& info,
                const SourceLoc& loc) {
  if (cores > info.num_cores)
    throw Error(std::string(mesh_name) + " has " + std::to_string(cores) +
                    " cores, but the simulated chip has only " + std::to_string(info.num_cores) +
                    " SparseCores (plsc::set_sparse_core_info changes that)",
                loc);
  if (subcores > info.num_subcores)
    throw Error(std::string(mesh_name) + " has " + std::to_string(subcores) +
                    " subcores per core, but each simulated SparseCore has only " +
                    std::to_string(info.num_subcores) +
                    " vector subcores (plsc::set_sparse_core_info changes that)",
                loc);
}

}  // namespace

PallasCall make_sc_kernel(KernelFn body, std::vector<ShapeDtype> out_shapes,
                          const ScalarSubcoreMesh& mesh, CallOptions opts, const SourceLoc& loc) {
  const SparseCoreInfo info = sparse_core_info();
  check_fits("ScalarSubcoreMesh", or_default(mesh.num_cores, info.num_cores), 0, info, loc);
  return make(std::move(body), std::move(out_shapes), "ScalarSubcoreMesh",
              {{mesh.axis_name, or_default(mesh.num_cores, info.num_cores)}}, "sc_scalar_subcore",
              std::move(opts), loc);
}

PallasCall make_sc_kernel(KernelFn body, std::vector<ShapeDtype> out_shapes,
                          const VectorSubcoreMesh& mesh, CallOptions opts, const SourceLoc& loc) {
  const SparseCoreInfo info = sparse_core_info();
  check_fits("VectorSubcoreMesh", or_default(mesh.num_cores, info.num_cores),
             or_default(mesh.num_subcores, info.num_subcores), info, loc);
  return make(std::move(body), std::move(out_shapes), "VectorSubcoreMesh",
              {{mesh.core_axis_name, or_default(mesh.num_cores, info.num_cores)},
               {mesh.subcore_axis_name, or_default(mesh.num_subcores, info.num_subcores)}},
              "sc_vector_subcore", std::move(opts), loc);
}

}  // namespace detail
}  // namespace pallas::tpu_sc

namespace pallas::tpu_sc {

void check_compatible(const ScalarSubcoreMesh& scalar, const VectorSubcoreMesh& vector) {
  const SparseCoreInfo info = sparse_core_info();
  if (scalar.axis_name != vector.core_axis_name)
    throw Error("ScalarSubcoreMesh axis '" + scalar.axis_name +
                "' must be the VectorSubcoreMesh's core axis '" + vector.core_axis_name +
                "': both meshes run on the same SparseCores");
  const int a = scalar.num_cores == 0 ? info.num_cores : scalar.num_cores;
  const int b = vector.num_cores == 0 ? info.num_cores : vector.num_cores;
  if (a != b)
    throw Error("ScalarSubcoreMesh has " + std::to_string(a) + " cores but the VectorSubcoreMesh " +
                std::to_string(b) + "; meshes of the same SparseCores need the same core count");
}

void check_compatible(const tpu::TensorCoreMesh& tc, const ScalarSubcoreMesh& sc) {
  if (tc.axis_name == sc.axis_name)
    throw Error("TensorCoreMesh and ScalarSubcoreMesh both name an axis '" + tc.axis_name +
                "'; TensorCore and SparseCore axes need different names");
}

void check_compatible(const tpu::TensorCoreMesh& tc, const VectorSubcoreMesh& sc) {
  if (tc.axis_name == sc.core_axis_name || tc.axis_name == sc.subcore_axis_name)
    throw Error("TensorCoreMesh and VectorSubcoreMesh both name an axis '" + tc.axis_name +
                "'; TensorCore and SparseCore axes need different names");
}

}  // namespace pallas::tpu_sc
