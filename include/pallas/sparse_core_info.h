// The simulated SparseCore's geometry (see docs/SPARSE_CORE.md).
#pragma once

#include <vector>

#include "pallas/array.h"

namespace pallas::tpu_sc {

// Defaults: 2 SparseCores per device, 16 vector subcores each, 16 lanes.
struct SparseCoreInfo {
  int num_cores = 2;
  int num_subcores = 16;
  int num_lanes = 16;
};
SparseCoreInfo sparse_core_info();          // the current configuration
void set_sparse_core_info(SparseCoreInfo);  // all >= 1, num_lanes a power of two; else pallas::Error
// The legal vector shapes for dtype: {num_lanes} for 32-bit types; for sub-32-bit types with
// packing p = 4 / itemsize: {num_lanes * p} or {p, num_lanes}.
std::vector<Shape> vector_shapes(DType dtype);

}  // namespace pallas::tpu_sc
