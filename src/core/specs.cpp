// Small value types of pallas_call: block dims, grids, cost estimates, compiler params, and the
// text form and invariants of BlockMapping / GridMapping.
#include <sstream>

#include "pallas/pallas_call.h"

namespace pallas {

int64_t BlockDim::size() const {
  return std::visit(
      [](const auto& d) -> int64_t {
        using T = std::decay_t<decltype(d)>;
        if constexpr (std::is_same_v<T, Squeezed>)
          return 1;
        else
          return d.block_size;
      },
      v_);
}

std::string BlockDim::to_string() const {
  return std::visit(
      [](const auto& d) -> std::string {
        using T = std::decay_t<decltype(d)>;
        if constexpr (std::is_same_v<T, Squeezed>) {
          return "Squeezed";
        } else if constexpr (std::is_same_v<T, Blocked>) {
          return "Blocked(" + std::to_string(d.block_size) + ")";
        } else if constexpr (std::is_same_v<T, BoundedSlice>) {
          return "BoundedSlice(" + std::to_string(d.block_size) + ")";
        } else {
          std::string s = "Element(" + std::to_string(d.block_size);
          if (d.padding != std::pair<int64_t, int64_t>{0, 0})
            s += ", padding=(" + std::to_string(d.padding.first) + ", " +
                 std::to_string(d.padding.second) + ")";
          return s + ")";
        }
      },
      v_);
}

Grid::Grid(std::initializer_list<std::pair<std::string, int64_t>> named) {
  for (const auto& [name, size] : named) {
    names.push_back(name);
    dims.emplace_back(size);
  }
}

std::string Grid::to_string() const {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    if (!names.empty()) s += names[i] + "=";
    s += dims[i].is_dynamic() ? "dynamic" : std::to_string(dims[i].size());
  }
  if (dims.size() == 1 && names.empty()) s += ",";
  return s + ")";
}

std::string CostEstimate::to_json() const {
  return "{\"flops\": " + std::to_string(flops) + ", \"transcendentals\": " +
         std::to_string(transcendentals) + ", \"bytes_accessed\": " +
         std::to_string(bytes_accessed) + ", \"remote_bytes_transferred\": " +
         std::to_string(remote_bytes_transferred) + "}";
}

std::string compiler_params_backend(const CompilerParams& p) {
  return std::visit([](const auto& x) -> std::string { return std::decay_t<decltype(x)>::kBackend; },
                    p);
}

namespace {
std::string block_shape_string(const BlockShape& b) {
  std::string s = "(";
  for (size_t i = 0; i < b.size(); ++i) s += (i ? ", " : "") + b[i].to_string();
  if (b.size() == 1) s += ",";
  return s + ")";
}
}  // namespace

void BlockMapping::check_invariants() const {
  PALLAS_INTERNAL_CHECK(block_shape.size() == array.shape.size(), origin, ": block rank");
  Shape ref_shape;
  for (const BlockDim& d : block_shape)
    if (!d.is_squeezed()) ref_shape.push_back(d.size());
  PALLAS_INTERNAL_CHECK(block_ref_type.is_ref && block_ref_type.shape == ref_shape &&
                            block_ref_type.dtype == array.dtype,
                        origin, ": block ref type ", block_ref_type.to_string());
}

std::string BlockMapping::to_string() const {
  std::string s = "BlockMapping(" + origin + ": " + array.to_string() +
                  ", block_shape=" + block_shape_string(block_shape) +
                  ", ref=" + block_ref_type.to_string();
  if (pipeline_mode)
    s += ", pipeline_mode=Buffered(" + std::to_string(pipeline_mode->buffer_count) +
         (pipeline_mode->use_lookahead ? ", use_lookahead=True" : "") + ")";
  s += index_map_is_default ? ", index_map=zeros)" : ")";
  return s;
}

int GridMapping::num_dynamic_grid_bounds() const {
  int n = 0;
  for (int64_t g : grid) n += g < 0;
  return n;
}

void GridMapping::check_invariants() const {
  PALLAS_INTERNAL_CHECK(static_cast<int>(block_mappings.size()) == num_inputs + num_outputs,
                        "block mapping count");
  PALLAS_INTERNAL_CHECK(index_map_params.size() == grid.size() + num_index_operands,
                        "index map params");
  for (size_t i = 0; i < grid.size(); ++i)
    PALLAS_INTERNAL_CHECK(index_map_params[i] == ir::Type::scalar(DType::I32), "grid index type");
  PALLAS_INTERNAL_CHECK(grid_names.empty() || grid_names.size() == grid.size(), "grid names");
  PALLAS_INTERNAL_CHECK(scratch_barrier_arrivals.size() == scratch_types.size() &&
                            scratch_unions.size() == scratch_types.size() &&
                            scratch_barrier_collective_axes.size() == scratch_types.size() &&
                            scratch_grid_wide.size() == scratch_types.size(),
                        "per-scratch records");
  for (int d : vmapped_dims)
    PALLAS_INTERNAL_CHECK(d >= 0 && d < static_cast<int>(grid.size()), "vmapped dim");
  for (const BlockMapping& bm : block_mappings) {
    bm.check_invariants();
    PALLAS_INTERNAL_CHECK(bm.index_map.param_types() == index_map_params, bm.origin,
                          ": index map params");
  }
}

std::string GridMapping::to_string() const {
  std::ostringstream os;
  os << "GridMapping(grid=(";
  for (size_t i = 0; i < grid.size(); ++i) {
    if (i) os << ", ";
    if (!grid_names.empty()) os << grid_names[i] << "=";
    if (grid[i] < 0)
      os << "dynamic";
    else
      os << grid[i];
  }
  if (grid.size() == 1) os << ",";
  os << "), num_index_operands=" << num_index_operands << ", num_inputs=" << num_inputs
     << ", num_outputs=" << num_outputs << ", num_scratch_operands=" << scratch_types.size()
     << ")\n";
  for (const BlockMapping& bm : block_mappings) {
    os << "  " << bm.to_string() << "\n";
    if (!bm.index_map_is_default) {
      std::string im = ir::print(bm.index_map);
      std::istringstream lines(im);
      for (std::string line; std::getline(lines, line);) os << "    " << line << "\n";
    }
  }
  for (size_t i = 0; i < scratch_types.size(); ++i)
    os << "  scratch[" << i << "]: " << scratch_types[i].to_string()
       << (scratch_grid_wide[i] ? " (pl::get_global: one for the grid)" : "") << "\n";
  return os.str();
}

}  // namespace pallas
