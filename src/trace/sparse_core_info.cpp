#include "pallas/sparse_core_info.h"

#include <mutex>

#include "pallas/error.h"

namespace pallas::tpu_sc {
namespace {
std::mutex g_mu;
SparseCoreInfo g_info;
}  // namespace

SparseCoreInfo sparse_core_info() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_info;
}

void set_sparse_core_info(SparseCoreInfo info) {
  if (info.num_cores < 1 || info.num_subcores < 1 || info.num_lanes < 1 ||
      (info.num_lanes & (info.num_lanes - 1)) != 0)
    throw Error("set_sparse_core_info: num_cores and num_subcores must be >= 1 and num_lanes a "
                "power of two");
  std::lock_guard<std::mutex> lock(g_mu);
  g_info = info;
}

std::vector<Shape> vector_shapes(DType dtype) {
  const int64_t lanes = sparse_core_info().num_lanes;
  const int64_t size = itemsize(dtype);
  if (size >= 4) return {{lanes}};
  const int64_t p = 4 / size;
  return {{lanes * p}, {p, lanes}};
}

}  // namespace pallas::tpu_sc
