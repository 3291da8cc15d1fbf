// gpu::nd_loop and gpu::planar_snake (Mosaic GPU's helpers): index arithmetic over traced
// scalars and a fori_loop, nothing of their own in any backend.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/trace_env.h"
#include "pallas/error.h"
#include "pallas/gpu.h"
#include "pallas/pallas_call.h"
#include "trace/context.h"

namespace pallas::gpu {
namespace {

// The caller's combined index along `axes` (row-major) and their combined size.
std::pair<Value, Value> combined_axis(const std::vector<std::string>& axes, const Loc& loc) {
  const SourceLoc where = trace::src(loc);
  if (axes.empty()) throw Error("nd_loop: collective_axes is empty (name the mesh axes that share the loop)", where);
  const core::TraceEnv* env = core::current_trace_env();
  const std::vector<std::string> names = env ? env->grid_names : std::vector<std::string>{};
  std::string known;
  for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
  for (size_t i = 0; i < axes.size(); ++i) {
    if (std::find(names.begin(), names.end(), axes[i]) == names.end())
      throw Error("nd_loop: collective_axes names '" + axes[i] + "', which is not an axis of the kernel's mesh (" +
                      (known.empty() ? std::string("it has none") : known) + ")",
                  where);
    if (std::find(axes.begin(), axes.begin() + static_cast<std::ptrdiff_t>(i), axes[i]) != axes.begin() + static_cast<std::ptrdiff_t>(i))
      throw Error("nd_loop: collective_axes names '" + axes[i] + "' twice", where);
  }
  Value index = Operand(0, loc).value(), size = Operand(1, loc).value();
  for (const std::string& a : axes) {
    const Value n = num_programs(a, loc);
    index = index * n + axis_index(a, loc);
    size = size * n;
  }
  return {index, size};
}

std::vector<Value> run_nd_loop(const std::vector<Operand>& grid_in, const std::vector<std::string>& axes,
                               const std::vector<Value>& init,
                               const std::function<std::vector<Value>(const NDLoopInfo&, const std::vector<Value>&)>& body,
                               const NDLoopOptions& options, const Loc& loc) {
  const SourceLoc where = trace::src(loc);
  if (grid_in.empty()) throw Error("nd_loop: the grid is empty", where);
  // Sizes known when tracing must fit the loop's i32 arithmetic, their product too; traced ones
  // become i32 scalars (as Mosaic GPU converts them to the axis index's type).
  std::vector<Value> grid;
  int64_t known_points = 1;
  for (const Operand& g : grid_in) {
    if (g.kind() == Operand::Kind::Int) {
      if (g.int_literal() <= 0) throw Error("nd_loop: grid sizes must be positive, got " + std::to_string(g.int_literal()), where);
      if (g.int_literal() > INT32_MAX / known_points)
        throw Error("nd_loop: the grid has more than 2^31 - 1 points (its sizes are counted in i32)", where);
      known_points *= g.int_literal();
    }
    grid.push_back(pallas::detail::as_index_scalar(g, "nd_loop grid size").astype(DType::I32, loc));
  }
  const std::vector<int64_t>& tiling = options.tiling;
  if (!tiling.empty()) {
    if (tiling.size() != grid_in.size())
      throw Error("nd_loop: the tiling has " + std::to_string(tiling.size()) + " sizes for a grid of " +
                      std::to_string(grid_in.size()) + " dims",
                  where);
    for (size_t d = 0; d < tiling.size(); ++d) {
      if (tiling[d] <= 0 || tiling[d] > INT32_MAX)
        throw Error("nd_loop: tile sizes must be positive i32 values, got " + std::to_string(tiling[d]), where);
      if (grid_in[d].kind() == Operand::Kind::Int && grid_in[d].int_literal() % tiling[d] != 0)
        throw Error("nd_loop: the tile size " + std::to_string(tiling[d]) + " does not divide grid dim " + std::to_string(d) +
                        " (" + std::to_string(grid_in[d].int_literal()) + ")",
                    where);
    }
    // The tiles' grid, then the points within a tile.
    std::vector<Value> tiled;
    for (size_t d = 0; d < grid.size(); ++d) tiled.push_back(grid[d] / static_cast<int32_t>(tiling[d]));
    for (int64_t t : tiling) tiled.push_back(Operand(t, loc).value());
    grid = std::move(tiled);
  }
  Value total = Operand(1, loc).value();
  for (const Value& g : grid) total = total * g;
  const auto [me, callers] = combined_axis(axes, loc);
  // total / callers steps, one more for the first total % callers callers.
  const Value steps = total / callers + (me < total % callers).astype(DType::I32, loc);
  return fori_loop(0, steps, init, [&](Value local, std::vector<Value> carry) {
    Value flat = local * callers + me;
    std::vector<Value> index(grid.size());
    for (size_t d = grid.size(); d-- > 0;) {
      index[d] = flat % grid[d];
      flat = flat / grid[d];
    }
    if (!tiling.empty()) {
      const size_t n = tiling.size();
      std::vector<Value> untiled;
      for (size_t d = 0; d < n; ++d) untiled.push_back(index[d] * static_cast<int32_t>(tiling[d]) + index[n + d]);
      index = std::move(untiled);
    }
    std::vector<Value> next = body(NDLoopInfo{index, local, steps}, carry);
    if (next.size() != carry.size())
      throw Error("nd_loop: the body returned " + std::to_string(next.size()) + " carried values for the " +
                      std::to_string(carry.size()) + " of init_carry",
                  where);
    return next;
  }, loc);
}

}  // namespace

void nd_loop(const std::vector<Operand>& grid, const std::vector<std::string>& collective_axes,
             const std::function<void(const NDLoopInfo&)>& body, const NDLoopOptions& options, Loc loc) {
  run_nd_loop(grid, collective_axes, {},
              [&](const NDLoopInfo& info, const std::vector<Value>&) {
                body(info);
                return std::vector<Value>{};
              },
              options, loc);
}

std::vector<Value> nd_loop(const std::vector<Operand>& grid, const std::vector<std::string>& collective_axes,
                           const std::vector<Value>& init_carry,
                           const std::function<std::vector<Value>(const NDLoopInfo&, const std::vector<Value>&)>& body,
                           const NDLoopOptions& options, Loc loc) {
  return run_nd_loop(grid, collective_axes, init_carry, body, options, loc);
}

std::pair<Value, Value> planar_snake(const Operand& lin_idx, const std::pair<Operand, Operand>& shape, int minor_dim,
                                     int64_t tile_width, Loc loc) {
  const SourceLoc where = trace::src(loc);
  if (minor_dim != 0 && minor_dim != 1) throw Error("planar_snake: minor_dim must be 0 or 1, got " + std::to_string(minor_dim), where);
  if (tile_width <= 0 || tile_width > INT32_MAX)
    throw Error("planar_snake: tile_width must be a positive i32 value, got " + std::to_string(tile_width), where);
  const Value i = pallas::detail::as_index_scalar(lin_idx, "planar_snake index");
  const Value rows = pallas::detail::as_index_scalar(shape.first, "planar_snake shape");
  const Value cols = pallas::detail::as_index_scalar(shape.second, "planar_snake shape");
  const Value minor_size = minor_dim == 0 ? rows : cols, major_size = minor_dim == 0 ? cols : rows;
  const int32_t width = static_cast<int32_t>(tile_width);
  // The strip, and the position within it of an index of a strip `w` wide (the last strip may
  // be narrower: it takes the remainder with its own width).
  const Value full_strips = minor_size / width;
  const Value full_elements = full_strips * width * major_size;
  const Value in_full = i < full_elements;
  const Value strip = pallas::where(in_full, i / (width * major_size), full_strips);
  const Value w = pallas::where(in_full, Operand(width, loc).value(), minor_size - full_strips * width);
  const Value j = pallas::where(in_full, i, i - full_elements);
  const Value minor = strip * width + j % w;
  const Value forward = j / w % major_size;
  const Value major = pallas::where(strip % 2 == 0, forward, major_size - 1 - forward);
  return minor_dim == 0 ? std::pair{minor, major} : std::pair{major, minor};
}

}  // namespace pallas::gpu
