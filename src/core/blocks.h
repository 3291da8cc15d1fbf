// How pallas_call lays out an operand and cuts it into blocks: shared by the reference
// interpreter and the TPU interpret mode.
#pragma once

#include <string>
#include <vector>

#include "pallas/pallas_call.h"

namespace pallas::core {

// "(1, 2)", "(3,)", "()": Python's tuple spelling, used in the seed's messages.
std::string tuple_string(const std::vector<int64_t>& v);

// The operand's array padded so every block lies inside it: Blocked dims round up to a whole
// number of blocks, Element dims add their (low, high) padding. `low` is where the logical
// array starts inside the padded one.
void padded_layout(const BlockMapping& bm, Shape& padded, std::vector<int64_t>& low);

// The block's extent along array dimension d: the BoundedSlice's ds size, 1 for Squeezed, else
// the block size.
inline int64_t block_extent(const BlockMapping& bm, size_t d) {
  return bm.block_shape[d].is_bounded_slice() ? bm.slice_sizes[d] : bm.block_shape[d].size();
}

// Where the block with these index-map results starts in the padded array, and its size, per
// array dimension (Squeezed dims: size 1).
void block_region(const BlockMapping& bm, const std::vector<int64_t>& indices,
                  std::vector<int64_t>& start, std::vector<int64_t>& size);

// "0:8, 128:256": the block's range in the logical array's coordinates.
std::string block_range_string(const std::vector<int64_t>& start, const std::vector<int64_t>& size,
                               const std::vector<int64_t>& low);

// The error for a block that does not lie inside its padded array at grid point `iteration`
// (the seed's wording). `where` follows the iteration: "" for the reference interpreter (and
// estimate_cost), " on device 0 (core 1)" for the TPU interpret mode.
Error out_of_bounds_block_error(const BlockMapping& bm, bool is_input,
                                const std::vector<int64_t>& indices,
                                const std::vector<int64_t>& iteration, const std::string& where,
                                const std::vector<int64_t>& start, const std::vector<int64_t>& size,
                                const std::vector<int64_t>& low);

}  // namespace pallas::core
