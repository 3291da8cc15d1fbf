#include "core/blocks.h"

#include <sstream>

namespace pallas::core {

std::string tuple_string(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  if (v.size() == 1) s += ",";
  return s + ")";
}

void padded_layout(const BlockMapping& bm, Shape& padded, std::vector<int64_t>& low) {
  padded.clear();
  low.clear();
  for (size_t d = 0; d < bm.array.shape.size(); ++d) {
    int64_t n = bm.array.shape[d];
    const BlockDim& b = bm.block_shape[d];
    if (b.is_blocked() && b.size() > 0) {
      padded.push_back(cdiv(n, b.size()) * b.size());
      low.push_back(0);
    } else if (b.is_element()) {
      auto [lo, hi] = b.element().padding;
      padded.push_back(lo + n + hi);
      low.push_back(lo);
    } else {
      padded.push_back(n);
      low.push_back(0);
    }
  }
}

void block_region(const BlockMapping& bm, const std::vector<int64_t>& indices,
                  std::vector<int64_t>& start, std::vector<int64_t>& size) {
  start.resize(bm.block_shape.size());
  size.resize(bm.block_shape.size());
  for (size_t d = 0; d < bm.block_shape.size(); ++d) {
    const BlockDim& b = bm.block_shape[d];
    start[d] = b.is_blocked() ? indices[d] * b.size() : indices[d];
    size[d] = block_extent(bm, d);
  }
}

std::string block_range_string(const std::vector<int64_t>& start, const std::vector<int64_t>& size,
                               const std::vector<int64_t>& low) {
  std::ostringstream range;
  for (size_t e = 0; e < start.size(); ++e)
    range << (e ? ", " : "") << start[e] - low[e] << ":" << start[e] - low[e] + size[e];
  return range.str();
}

Error out_of_bounds_block_error(const BlockMapping& bm, bool is_input,
                                const std::vector<int64_t>& indices,
                                const std::vector<int64_t>& iteration, const std::string& where,
                                const std::vector<int64_t>& start, const std::vector<int64_t>& size,
                                const std::vector<int64_t>& low) {
  return Error("Out-of-bounds block index " + tuple_string(indices) + " for " +
                   (is_input ? "input \"" : "output \"") + bm.origin + "\" in iteration " +
                   tuple_string(iteration) + where + ": " + (is_input ? "reading [" : "writing [") +
                   block_range_string(start, size, low) + "] but " +
                   (is_input ? "input" : "output") + " has shape " + tuple_string(bm.array.shape) +
                   ".",
               bm.index_map.loc);
}

}  // namespace pallas::core
