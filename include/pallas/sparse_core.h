// SparseCore kernels (plsc): scalar- and vector-subcore meshes, subcore barriers, and the
// vector subcore ops; indirect gather/scatter DMAs are pltpu's async_copy/sync_copy with an
// index-vector view (`table.at(indices)`, see pallas/tpu.h). They run in the TPU interpret mode,
// where every subcore is a thread of the simulated machine (docs/SPARSE_CORE.md).
//
//   namespace plsc = pallas::tpu_sc;
//   auto call = plsc::kernel(
//       [](pl::Ref table_hbm, pl::Ref ids_hbm, pl::Ref out_hbm, pl::Ref ids, pl::Ref rows) {
//         auto w = pltpu::axis_index("core") * 16 + pltpu::axis_index("subcore");
//         pltpu::sync_copy(ids_hbm.at(pl::ds(w * 8, 8)), ids);
//         pltpu::sync_copy(table_hbm.at(ids), rows);      // a gather of 8 rows
//         pltpu::sync_copy(rows, out_hbm.at(pl::ds(w * 8, 8)));
//       },
//       {pl::ShapeDtype({256, 128}, pl::f32)}, plsc::VectorSubcoreMesh{},
//       {.scratch_shapes = {pltpu::VMEM({8}, pl::i32), pltpu::VMEM({8, 128}, pl::f32)}});
#pragma once

#include <string>
#include <vector>

#include "pallas/sparse_core_info.h"
#include "pallas/sparse_core_ops.h"
#include "pallas/tpu.h"

namespace pallas::tpu_sc {

// One thread per SparseCore's scalar subcore. Memory: VMEM_SHARED, SMEM, semaphores, HBM.
// num_cores = 0: sparse_core_info().num_cores.
struct ScalarSubcoreMesh {
  std::string axis_name = "core";
  int num_cores = 0;
};
// One thread per vector subcore: shape {core: num_cores, subcore: num_subcores}. Memory: VMEM
// (per subcore), VMEM_SHARED (shared by the subcores of one SparseCore), SMEM (per subcore),
// semaphores, HBM (the default). 0: the sparse_core_info() value.
struct VectorSubcoreMesh {
  std::string core_axis_name = "core";
  std::string subcore_axis_name = "subcore";
  int num_cores = 0;
  int num_subcores = 0;
};

namespace detail {
PallasCall make_sc_kernel(KernelFn body, std::vector<ShapeDtype> out_shapes,
                          const ScalarSubcoreMesh& mesh, CallOptions opts, const SourceLoc& loc);
PallasCall make_sc_kernel(KernelFn body, std::vector<ShapeDtype> out_shapes,
                          const VectorSubcoreMesh& mesh, CallOptions opts, const SourceLoc& loc);
}  // namespace detail

// pl.kernel / core_map on a SparseCore mesh: `body` runs once on every (sub)core, receiving
// every input and output as a whole-array Ref in HBM, then the scratch Refs. No grid or
// BlockSpecs; dimension_semantics cannot be given (the mesh says what runs in parallel).
template <class F, class Mesh>
  requires std::is_same_v<Mesh, ScalarSubcoreMesh> || std::is_same_v<Mesh, VectorSubcoreMesh>
PallasCall kernel(F body, std::vector<ShapeDtype> out_shapes, Mesh mesh, CallOptions opts = {},
                  Loc loc = Loc::current()) {
  return detail::make_sc_kernel(pallas::detail::make_kernel_fn(std::move(body)),
                                std::move(out_shapes), mesh, std::move(opts),
                                SourceLoc::from(loc));
}
template <class F, class Mesh>
  requires std::is_same_v<Mesh, ScalarSubcoreMesh> || std::is_same_v<Mesh, VectorSubcoreMesh>
PallasCall core_map(F body, std::vector<ShapeDtype> out_shapes, Mesh mesh, CallOptions opts = {},
                    Loc loc = Loc::current()) {
  return kernel(std::move(body), std::move(out_shapes), std::move(mesh), std::move(opts), loc);
}

// Mesh compatibility, for kernels that use TensorCore and SparseCore meshes together: a scalar
// and a vector mesh must share the core axis (name and size); a TensorCoreMesh's axis must differ
// from the SparseCore meshes' axes. Each throws pallas::Error saying which rule fails.
void check_compatible(const ScalarSubcoreMesh& scalar, const VectorSubcoreMesh& vector);
void check_compatible(const tpu::TensorCoreMesh& tc, const ScalarSubcoreMesh& sc);
void check_compatible(const tpu::TensorCoreMesh& tc, const VectorSubcoreMesh& sc);

// Waits until every vector subcore of this SparseCore has arrived (a vector-subcore kernel only).
// It orders their memory accesses: what one subcore wrote before it is seen by all after it.
void subcore_barrier(Loc loc = Loc::current());

}  // namespace pallas::tpu_sc
