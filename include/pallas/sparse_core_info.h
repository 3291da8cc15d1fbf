// The geometry of the simulated SparseCore (plsc.get_sparse_core_info): how many SparseCores a
// device has, how many vector subcores each has, and how many lanes a vector register holds.
// The vector subcore ops (pallas/sparse_core_ops.h) check their vector shapes against it at
// trace time; the SparseCore meshes take their default sizes from it.
#pragma once

#include <vector>

#include "pallas/array.h"
#include "pallas/dtype.h"

namespace pallas::tpu_sc {

// The simulated SparseCore's geometry. Defaults: 2 SparseCores per device, 16 vector subcores
// each, 16 lanes.
struct SparseCoreInfo {
  int num_cores = 2;
  int num_subcores = 16;
  int num_lanes = 16;
};

// The current configuration (process-wide; reading and setting it are thread-safe).
SparseCoreInfo sparse_core_info();
// Replaces the configuration. Throws pallas::Error (and keeps the old one) unless every field is
// >= 1 and num_lanes is a power of two. Kernels already traced keep the shapes they were traced
// with.
void set_sparse_core_info(SparseCoreInfo info);

// The legal vector shapes for `dtype`, with L = num_lanes:
//   * 32-bit types: {L};
//   * 8- and 16-bit types, with packing p = 4 / itemsize: {L * p} and {p, L};
//   * bool (masks): the shapes of every data vector, {L}, {2L}, {2, L}, {4L}, {4, L} (a mask has
//     the shape of the vector it selects from);
//   * 64-bit types and semaphores: none (the SparseCore has no such vectors).
std::vector<Shape> vector_shapes(DType dtype);

}  // namespace pallas::tpu_sc
