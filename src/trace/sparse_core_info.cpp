// The simulated SparseCore's geometry: one process-wide value behind a mutex.
#include "pallas/sparse_core_info.h"

#include <bit>
#include <mutex>
#include <string>

#include "pallas/error.h"

namespace pallas::tpu_sc {

namespace {
std::mutex info_mutex;
SparseCoreInfo current_info;
}  // namespace

SparseCoreInfo sparse_core_info() {
  std::lock_guard<std::mutex> lock(info_mutex);
  return current_info;
}

void set_sparse_core_info(SparseCoreInfo info) {
  auto check = [](int v, const char* what) {
    if (v < 1) throw Error("set_sparse_core_info: " + std::string(what) + " must be >= 1, got " + std::to_string(v));
  };
  check(info.num_cores, "num_cores");
  check(info.num_subcores, "num_subcores");
  check(info.num_lanes, "num_lanes");
  if (!std::has_single_bit(static_cast<unsigned>(info.num_lanes)))
    throw Error("set_sparse_core_info: num_lanes must be a power of two, got " + std::to_string(info.num_lanes));
  std::lock_guard<std::mutex> lock(info_mutex);
  current_info = info;
}

std::vector<Shape> vector_shapes(DType dtype) {
  const int64_t lanes = sparse_core_info().num_lanes;
  if (dtype == DType::Bool) return {{lanes}, {2 * lanes}, {2, lanes}, {4 * lanes}, {4, lanes}};
  if (is_semaphore(dtype)) return {};
  const int size = itemsize(dtype);
  if (size == 4) return {{lanes}};
  if (size > 4) return {};
  const int64_t packing = 4 / size;
  return {{lanes * packing}, {packing, lanes}};
}

}  // namespace pallas::tpu_sc
