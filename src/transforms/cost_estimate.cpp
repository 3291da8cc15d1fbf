// estimate_cost: a CostEstimate derived from a traced call's kernel IR and grid mapping.
//
// Two independent parts:
//  * the kernel's cost per invocation (flops, transcendentals, off-chip bytes of DMAs and direct
//    HBM accesses, remote DMA bytes), counted by walking the IR with loop trip counts folded
//    from trace-time constants; times the number of grid points;
//  * the block pipeline's traffic: each blocked operand's block bytes times the number of times
//    its block index changes along the row-major grid walk (the TPU pipeline copies a block in,
//    or out, only then), plus the scalar-prefetch operands once.
// The rules, and where they are approximations, are in docs/TRANSFORMS.md; keep the two in step.
#include <algorithm>
#include <bit>
#include <functional>
#include <limits>
#include <optional>
#include <unordered_map>

#include "core/blocks.h"
#include "core/call.h"
#include "pallas/transforms.h"
#include "transforms/cost_estimate.h"

namespace pallas {

using ir::AttrKey;
using ir::OpCode;

namespace {

// ---- Saturating arithmetic (a cost never wraps) -----------------------------------------------
constexpr int64_t kMaxCost = std::numeric_limits<int64_t>::max();

int64_t sat_add(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? kMaxCost : r;
}
int64_t sat_mul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? kMaxCost : r;
}

struct Cost {
  int64_t flops = 0;
  int64_t transcendentals = 0;
  int64_t bytes = 0;   // off-chip (HBM / ANY / GMEM) bytes read or written
  int64_t remote = 0;  // bytes sent to other devices

  Cost& operator+=(const Cost& o) {
    flops = sat_add(flops, o.flops);
    transcendentals = sat_add(transcendentals, o.transcendentals);
    bytes = sat_add(bytes, o.bytes);
    remote = sat_add(remote, o.remote);
    return *this;
  }
  Cost times(int64_t n) const {
    return {sat_mul(flops, n), sat_mul(transcendentals, n), sat_mul(bytes, n), sat_mul(remote, n)};
  }
  // Field by field: an upper bound of either.
  static Cost max(const Cost& a, const Cost& b) {
    return {std::max(a.flops, b.flops), std::max(a.transcendentals, b.transcendentals),
            std::max(a.bytes, b.bytes), std::max(a.remote, b.remote)};
  }
};

// Memory whose traffic bytes_accessed counts: off-chip memory.
bool off_chip(MemorySpace m) {
  return m == MemorySpace::Any || m == MemorySpace::Hbm || m == MemorySpace::Gmem;
}

int64_t bytes_of(const ir::Type& t) { return sat_mul(t.size(), itemsize(t.dtype)); }

// Multiplications of square-and-multiply for x^n, n >= 0.
int64_t pow_multiplies(uint64_t n) {
  if (n <= 1) return 0;
  return static_cast<int64_t>(std::bit_width(n) - 1 + std::popcount(n) - 1);
}

}  // namespace

// ---- The rule of each op (keyed by ops.def; a test walks the table) ---------------------------
CostRule cost_rule(ir::OpCode code) {
  switch (code) {
    // Changes of representation, hints, data movement inside on-chip memory, queries.
    case OpCode::Convert: case OpCode::Bitcast: case OpCode::MultipleOf:
    case OpCode::Constant: case OpCode::Iota: case OpCode::ProgramId: case OpCode::NumPrograms:
    case OpCode::AxisIndex: case OpCode::RefView: case OpCode::RefTranspose: case OpCode::RefReshape:
    case OpCode::RefBitcast:
    case OpCode::Yield: case OpCode::DebugPrint: case OpCode::DebugCheck:
    case OpCode::DmaWait: case OpCode::SemaphoreSignal: case OpCode::SemaphoreWait:
    case OpCode::SemaphoreRead: case OpCode::GetBarrierSemaphore: case OpCode::SubcoreBarrier:
      return CostRule::Free;
    case OpCode::IntegerPow: return CostRule::IntegerPow;
    case OpCode::DotGeneral: return CostRule::Dot;
    case OpCode::Sort: return CostRule::Sort;
    case OpCode::Load: case OpCode::Store: case OpCode::Swap: case OpCode::AtomicRmw:
    case OpCode::AtomicCas:
      return CostRule::RefAccess;
    // SparseCore vector ops. Their Refs are on chip (VMEM, SMEM): no off-chip bytes. Moving
    // lanes is free; adds, scans and counts cost one flop per lane.
    case OpCode::ScLoadGather: case OpCode::ScStoreScatter: case OpCode::ScLoadExpanded:
    case OpCode::ScStoreCompressed: case OpCode::ScPack: case OpCode::ScUnpack:
    case OpCode::ScDynamicGather:
      return CostRule::Free;
    case OpCode::ScAddupdateScatter: case OpCode::ScAddupdate: case OpCode::ScAddupdateCompressed:
    case OpCode::ScFetchAndAdd: case OpCode::ScMaskedScan: case OpCode::ScScanCount:
    case OpCode::ScAllReducePopulationCount: case OpCode::ScAllReduceFfs:
      return CostRule::PerLane;
    case OpCode::ScSortKeyVal: return CostRule::Sort;
    case OpCode::DmaStart: return CostRule::Dma;
    // GPU kernel primitives: the copies move bytes between global and shared memory; the
    // synchronisation is free.
    case OpCode::GpuCopyGmemToSmem: case OpCode::GpuCopySmemToGmem: return CostRule::Dma;
    case OpCode::GpuWgmma: return CostRule::Wgmma;
    case OpCode::GpuWaitSmemToGmem: case OpCode::GpuCommitSmemToGmemGroup: case OpCode::GpuCommitSmem: case OpCode::GpuBarrierArrive:
    case OpCode::GpuBarrierWait: case OpCode::GpuWgmmaWait: case OpCode::GpuSetMaxRegisters: case OpCode::GpuClusterRef:
    case OpCode::GpuAsyncPrefetch:
    case OpCode::NamedRegionBegin: case OpCode::NamedRegionEnd:
      return CostRule::Free;
    case OpCode::For: case OpCode::While: case OpCode::Cond: case OpCode::Switch:
    case OpCode::RunScoped:
      return CostRule::Control;
    default:
      break;
  }
  // The rest by category.
  const ir::OpInfo& info = ir::op_info(code);
  if (info.is(ir::kShape)) return CostRule::Free;
  if (info.is(ir::kReduce)) return CostRule::Reduce;
  if (info.is(ir::kScan)) return CostRule::Scan;
  if (info.is(ir::kTranscendental)) return CostRule::Transcendental;
  if (info.is(ir::kElementwise)) return CostRule::PerElement;
  return CostRule::Missing;
}

namespace {

// Counts one kernel invocation. Integer and bool scalars computed only from constants and grid
// sizes are folded (they cost nothing, and give static loop bounds and branch choices).
class KernelCounter {
 public:
  KernelCounter(const ir::Kernel& k, const std::vector<int64_t>& grid) : k_(k), grid_(grid) {}

  Cost region(const ir::Region& r) {
    Cost c;
    for (const ir::Op& op : r.ops) c += count(op);
    return c;
  }

 private:
  const ir::Kernel& k_;
  const std::vector<int64_t>& grid_;
  std::unordered_map<ir::ValueId, int64_t> known_;

  const ir::Type& type(ir::ValueId v) const { return k_.type(v); }
  const int64_t* known(ir::ValueId v) const {
    auto it = known_.find(v);
    return it == known_.end() ? nullptr : &it->second;
  }

  // Folds a scalar integer/bool op whose operands are all known; true if it did.
  bool fold(const ir::Op& op) {
    if (op.results.size() != 1) return false;
    const ir::Type& t = type(op.results[0]);
    if (!t.is_scalar() || is_float(t.dtype)) return false;
    if (op.code == OpCode::Constant) {
      known_[op.results[0]] = op.attrs.get_scalar(AttrKey::Value).as_int64();
      return true;
    }
    if (op.code == OpCode::NumPrograms) {
      int64_t axis = op.attrs.get_int(AttrKey::Axis);
      if (axis < 0 || axis >= static_cast<int64_t>(grid_.size())) return false;
      known_[op.results[0]] = grid_[static_cast<size_t>(axis)];
      return true;
    }
    std::vector<int64_t> v;
    for (ir::ValueId o : op.operands) {
      const int64_t* x = known(o);
      if (!x || is_float(type(o).dtype)) return false;
      v.push_back(*x);
    }
    int64_t r;
    switch (op.code) {
      case OpCode::Add: r = static_cast<int64_t>(static_cast<uint64_t>(v[0]) + static_cast<uint64_t>(v[1])); break;
      case OpCode::Sub: r = static_cast<int64_t>(static_cast<uint64_t>(v[0]) - static_cast<uint64_t>(v[1])); break;
      case OpCode::Mul: r = static_cast<int64_t>(static_cast<uint64_t>(v[0]) * static_cast<uint64_t>(v[1])); break;
      case OpCode::Div:
        if (v[1] == 0 || (v[1] == -1 && v[0] == std::numeric_limits<int64_t>::min())) return false;
        r = v[0] / v[1];
        break;
      case OpCode::Rem:
        if (v[1] == 0 || v[1] == -1) return false;
        r = v[0] % v[1];
        break;
      case OpCode::Max: r = std::max(v[0], v[1]); break;
      case OpCode::Min: r = std::min(v[0], v[1]); break;
      case OpCode::Neg: r = static_cast<int64_t>(0 - static_cast<uint64_t>(v[0])); break;
      case OpCode::Eq: r = v[0] == v[1]; break;
      case OpCode::Ne: r = v[0] != v[1]; break;
      case OpCode::Lt: r = v[0] < v[1]; break;
      case OpCode::Le: r = v[0] <= v[1]; break;
      case OpCode::Gt: r = v[0] > v[1]; break;
      case OpCode::Ge: r = v[0] >= v[1]; break;
      case OpCode::And: r = v[0] & v[1]; break;
      case OpCode::Or: r = v[0] | v[1]; break;
      case OpCode::Xor: r = v[0] ^ v[1]; break;
      case OpCode::Not: r = t.dtype == DType::Bool ? !v[0] : ~v[0]; break;
      case OpCode::Select: r = v[0] ? v[1] : v[2]; break;
      case OpCode::Convert: r = t.dtype == DType::Bool ? v[0] != 0 : v[0]; break;
      case OpCode::MultipleOf: r = v[0]; break;
      default: return false;
    }
    known_[op.results[0]] = r;
    return true;
  }

  Cost count(const ir::Op& op) {
    Cost c;
    if (fold(op)) return c;
    auto result_size = [&] { return type(op.results.at(0)).size(); };
    switch (cost_rule(op.code)) {
      case CostRule::Free:
        return c;
      case CostRule::PerElement:
        c.flops = result_size();
        return c;
      case CostRule::Transcendental:
        c.transcendentals = result_size();
        return c;
      case CostRule::PerLane:
        for (ir::ValueId v : op.operands)
          if (!type(v).is_ref) c.flops = std::max(c.flops, type(v).size());
        return c;
      case CostRule::Reduce:
        c.flops = std::max<int64_t>(0, type(op.operands[0]).size() - result_size());
        return c;
      case CostRule::Scan:
        c.flops = type(op.operands[0]).size();
        return c;
      case CostRule::IntegerPow: {
        int64_t n = op.attrs.get_int(AttrKey::Exponent);
        uint64_t mag = n < 0 ? 0 - static_cast<uint64_t>(n) : static_cast<uint64_t>(n);
        c.flops = sat_mul(result_size(), pow_multiplies(mag) + (n < 0 ? 1 : 0));
        return c;
      }
      case CostRule::Dot: {
        const ir::Type& lhs = type(op.operands[0]);
        int64_t k = 1;
        for (int64_t d : op.attrs.get_ints(AttrKey::LhsContracting)) k = sat_mul(k, lhs.shape.at(d));
        c.flops = sat_mul(sat_mul(2, result_size()), k);  // a multiply and an add per term
        return c;
      }
      case CostRule::Wgmma: {
        const ir::Type& acc = type(op.operands[0]);
        const ir::Type& a = type(op.operands[1]);
        c.flops = sat_mul(sat_mul(2, acc.size()), a.shape.back());
        return c;
      }
      case CostRule::Sort: {
        const ir::Type& keys = type(op.operands.at(0));
        int64_t n = keys.shape.empty() ? 1 : keys.shape.back();
        if (n > 1) {
          int64_t rows = keys.size() / n;
          c.flops = sat_mul(sat_mul(rows, n), std::bit_width(static_cast<uint64_t>(n - 1)));
        }
        return c;
      }
      case CostRule::RefAccess: {
        const ir::Type& ref = type(op.operands[0]);
        if (op.code == OpCode::AtomicRmw || op.code == OpCode::AtomicCas)
          c.flops = result_size();  // the update (or comparison) per element
        if (!off_chip(ref.space)) return c;
        Shape shape = op.attrs.get_indexer(AttrKey::Index).result_shape();
        int64_t b = sat_mul(num_elements(shape), itemsize(ref.dtype));
        bool reads = op.info().is(ir::kMemRead), writes = op.info().is(ir::kMemWrite);
        c.bytes = sat_mul(b, int64_t{reads} + int64_t{writes});
        return c;
      }
      case CostRule::Dma: {
        const ir::Type& src = type(op.operands[0]);
        const ir::Type& dst = type(op.operands[1]);
        // An indirect DMA moves the rows its indices pick: the bytes of the side not indexed.
        const int64_t indirect = op.attrs.get_int_or(AttrKey::Indirect, 0);
        int64_t b = bytes_of(indirect == 1 ? dst : src);
        if (op.attrs.get_int_or(AttrKey::AddAttr, 0) != 0) {
          // An adding DMA also reads the destination, and adds each element.
          const int64_t n = (indirect == 1 ? dst : src).size();
          c.flops = sat_add(c.flops, n);
          if (off_chip(dst.space)) c.bytes = sat_add(c.bytes, b);
        }
        if (op.attrs.has(AttrKey::DeviceIdType)) {
          // The destination is another device's memory: only the read is this device's.
          c.remote = b;
          if (off_chip(src.space)) c.bytes = b;
        } else {
          if (off_chip(src.space)) c.bytes = sat_add(c.bytes, b);
          if (off_chip(dst.space)) c.bytes = sat_add(c.bytes, b);
        }
        return c;
      }
      case CostRule::Control:
        break;
      case CostRule::Missing:
        throw InternalError("estimate_cost has no rule for op " + std::string(op.info().name));
    }
    switch (op.code) {
      case OpCode::For: {
        const int64_t* lo = known(op.operands.at(0));
        const int64_t* hi = known(op.operands.at(1));
        // Dynamic bounds: counted as one trip.
        int64_t trips = 1;
        if (lo && hi && __builtin_sub_overflow(*hi, *lo, &trips)) trips = *hi > *lo ? kMaxCost : 0;
        trips = std::max<int64_t>(0, trips);
        return region(op.regions.at(0)).times(trips);
      }
      case OpCode::While: {  // the trip count is unknown: one evaluation of cond and of body
        c = region(op.regions.at(0));
        c += region(op.regions.at(1));
        return c;
      }
      case OpCode::Cond: {
        if (const int64_t* pred = known(op.operands.at(0)))
          return region(op.regions.at(*pred ? 0 : 1));
        return branches(op);
      }
      case OpCode::Switch: {
        if (const int64_t* index = known(op.operands.at(0))) {
          int64_t last = static_cast<int64_t>(op.regions.size()) - 1;
          return region(op.regions.at(static_cast<size_t>(std::clamp<int64_t>(*index, 0, last))));
        }
        return branches(op);
      }
      case OpCode::RunScoped:
        return region(op.regions.at(0));
      default:
        throw InternalError("estimate_cost has no rule for control op " +
                            std::string(op.info().name));
    }
  }

  // A branch not known at trace time: the field-by-field maximum over the branches.
  Cost branches(const ir::Op& op) {
    Cost c;
    for (const ir::Region& r : op.regions) c = Cost::max(c, region(r));
    return c;
  }
};

// ---- The block pipeline ---------------------------------------------------------------------------
// Beyond this many grid points the grid is not walked: see count_block_changes.
constexpr int64_t kMaxWalkedPoints = int64_t{1} << 20;

bool is_pipelined(const BlockMapping& bm) { return !off_chip(bm.block_ref_type.space); }

int64_t block_bytes(const BlockMapping& bm) {
  int64_t n = 1;
  for (size_t d = 0; d < bm.block_shape.size(); ++d) n = sat_mul(n, core::block_extent(bm, d));
  return sat_mul(n, itemsize(bm.array.dtype));
}

// Does the index map read its scalar-prefetch parameters (those after the grid indices)?
bool reads_prefetch(const ir::Kernel& map, size_t num_grid_axes) {
  std::vector<ir::ValueId> prefetch(map.body.args.begin() + static_cast<long>(num_grid_axes),
                                    map.body.args.end());
  std::function<bool(const ir::Region&)> uses = [&](const ir::Region& r) {
    for (const ir::Op& op : r.ops) {
      for (ir::ValueId v : op.operands)
        if (std::find(prefetch.begin(), prefetch.end(), v) != prefetch.end()) return true;
      for (const ir::Region& sub : op.regions)
        if (uses(sub)) return true;
    }
    return false;
  };
  return !prefetch.empty() && uses(map.body);
}

// For an index map that yields only grid indices and constants: the last grid axis it forwards
// (-1: none). std::nullopt for any other map.
std::optional<int> last_forwarded_axis(const ir::Kernel& map, size_t num_grid_axes) {
  if (map.body.ops.empty() || map.body.ops.back().code != OpCode::Yield) return std::nullopt;
  int last = -1;
  for (ir::ValueId y : map.body.ops.back().operands) {
    auto p = std::find(map.body.args.begin(), map.body.args.end(), y);
    if (p != map.body.args.end() && static_cast<size_t>(p - map.body.args.begin()) < num_grid_axes) {
      last = std::max(last, static_cast<int>(p - map.body.args.begin()));
      continue;
    }
    bool constant = false;
    for (const ir::Op& op : map.body.ops)
      if (op.code == OpCode::Constant && !op.results.empty() && op.results[0] == y) constant = true;
    if (!constant) return std::nullopt;
  }
  return last;
}

// How many times each operand's block is copied (in for inputs, out for outputs) over the grid
// walk: the number of runs of equal consecutive block indices. Up to kMaxWalkedPoints points the
// index maps are evaluated at every point, and blocks outside their arrays raise the error the
// reference interpreter raises; beyond, maps that only forward grid indices are counted exactly
// (their block changes whenever an axis up to the last one they use does), others at every
// point. `prefetch` is empty when the scalar-prefetch values are unknown: maps reading them count
// a copy at every point.
std::vector<int64_t> count_block_changes(const GridMapping& gm, const std::vector<int64_t>& grid,
                                         const std::vector<Array>& prefetch_values,
                                         bool prefetch_known) {
  const size_t n = gm.block_mappings.size();
  int64_t total = 1;
  for (int64_t g : grid) total = sat_mul(total, g);
  std::vector<int64_t> changes(n, 0);
  if (total == 0) return changes;

  std::vector<bool> every_point(n, false);
  for (size_t j = 0; j < n; ++j)
    every_point[j] = !prefetch_known && reads_prefetch(gm.block_mappings[j].index_map, grid.size());

  if (total > kMaxWalkedPoints) {
    for (size_t j = 0; j < n; ++j) {
      std::optional<int> last = last_forwarded_axis(gm.block_mappings[j].index_map, grid.size());
      if (every_point[j] || !last) {
        changes[j] = total;
        continue;
      }
      int64_t runs = 1;
      for (int d = 0; d <= *last; ++d) runs = sat_mul(runs, grid[static_cast<size_t>(d)]);
      changes[j] = runs;
    }
    return changes;
  }

  std::vector<Array> prefetch_arrays = prefetch_values;
  std::vector<eval::RtValue> prefetch;
  for (Array& a : prefetch_arrays) prefetch.push_back(eval::RefValue::of_array(a, MemorySpace::Smem));
  std::vector<core::IndexMapEvaluator> maps;
  std::vector<Shape> padded(n);
  std::vector<std::vector<int64_t>> low(n);
  for (size_t j = 0; j < n; ++j) {
    maps.emplace_back(gm.block_mappings[j].index_map);
    core::padded_layout(gm.block_mappings[j], padded[j], low[j]);
  }
  GridPoint point;
  point.num_programs = grid;
  point.program_ids.assign(grid.size(), 0);
  std::vector<std::vector<int64_t>> prev(n);
  std::vector<int64_t> indices, start, size;
  for (int64_t linear = 0; linear < total; ++linear) {
    core::unravel_row_major(linear, grid, point.program_ids);
    for (size_t j = 0; j < n; ++j) {
      if (every_point[j]) {
        ++changes[j];
        continue;
      }
      const BlockMapping& bm = gm.block_mappings[j];
      maps[j].eval(point, prefetch, indices);
      core::block_region(bm, indices, start, size);
      for (size_t d = 0; d < start.size(); ++d)
        if (start[d] < 0 || start[d] + size[d] > padded[j][d])
          throw core::out_of_bounds_block_error(bm, static_cast<int>(j) < gm.num_inputs, indices,
                                                point.program_ids, "", start, size, low[j]);
      if (linear == 0 || indices != prev[j]) {
        ++changes[j];
        prev[j] = indices;
      }
    }
  }
  return changes;
}

CostEstimate estimate(const TracedCall& tc, const std::vector<int64_t>& grid,
                      const std::vector<ShapeDtype>& prefetch_shapes,
                      const std::vector<Array>& prefetch_values, bool prefetch_known) {
  const GridMapping& gm = tc.grid_mapping;
  int64_t points = 1;
  for (int64_t g : grid) points = sat_mul(points, g);
  CostEstimate out;
  if (points == 0) return out;  // the kernel never runs

  Cost per_point = KernelCounter(tc.kernel, grid).region(tc.kernel.body);
  Cost total = per_point.times(points);

  std::vector<int64_t> changes = count_block_changes(gm, grid, prefetch_values, prefetch_known);
  for (size_t j = 0; j < gm.block_mappings.size(); ++j) {
    const BlockMapping& bm = gm.block_mappings[j];
    if (is_pipelined(bm)) total.bytes = sat_add(total.bytes, sat_mul(block_bytes(bm), changes[j]));
  }
  for (const ShapeDtype& s : prefetch_shapes)  // copied to SMEM once, before the grid runs
    total.bytes = sat_add(total.bytes, sat_mul(s.size(), itemsize(s.dtype)));

  out.flops = total.flops;
  out.transcendentals = total.transcendentals;
  out.bytes_accessed = total.bytes;
  out.remote_bytes_transferred = total.remote;
  return out;
}

}  // namespace

CostEstimate estimate_cost(const PallasCall& call, const std::vector<Array>& all_args) {
  PallasCallImpl& impl = *call.impl();
  if (impl.vmap)
    if (std::optional<CostEstimate> loop = transforms::estimate_vmapped_loop(impl, all_args))
      return *loop;
  std::vector<int64_t> grid;
  std::vector<Array> args;
  std::shared_ptr<const TracedCall> tc = impl.prepare(all_args, grid, args);
  const int num_index = tc->grid_mapping.num_index_operands;
  std::vector<Array> prefetch(args.begin(), args.begin() + num_index);
  std::vector<ShapeDtype> prefetch_shapes;
  for (const Array& a : prefetch) prefetch_shapes.push_back(a.shape_dtype());
  return estimate(*tc, grid, prefetch_shapes, prefetch, true);
}

CostEstimate estimate_cost(const PallasCall& call, const std::vector<ShapeDtype>& args,
                           const std::vector<int64_t>& dynamic_grid_sizes) {
  PallasCallImpl& impl = *call.impl();
  const Grid& g = impl.grid_spec.grid;
  size_t num_dynamic = 0;
  for (const GridDim& d : g.dims) num_dynamic += d.is_dynamic();
  if (dynamic_grid_sizes.size() != num_dynamic)
    throw Error("estimate_cost of pallas_call " + impl.func_src_info() + ": the grid " +
                    g.to_string() + " has " + std::to_string(num_dynamic) +
                    " dynamic dimensions, so estimate_cost needs that many dynamic_grid_sizes; "
                    "got " + std::to_string(dynamic_grid_sizes.size()),
                impl.loc);
  std::vector<int64_t> grid;
  size_t next = 0;
  for (size_t d = 0; d < g.dims.size(); ++d) {
    if (!g.dims[d].is_dynamic()) {
      grid.push_back(g.dims[d].size());
      continue;
    }
    int64_t n = dynamic_grid_sizes[next++];
    if (n < 0)
      throw Error("pallas_call " + impl.func_src_info() + ": dynamic grid dimension " +
                      std::to_string(d) + " has negative size " + std::to_string(n),
                  impl.loc);
    grid.push_back(n);
  }
  std::shared_ptr<const TracedCall> tc = impl.trace(args);
  if (impl.vmap) {
    // The batch dimensions of a vmapped call lead the traced grid (grid_spec lists the rest).
    std::vector<int64_t> dynamic_sizes = dynamic_grid_sizes;
    grid.clear();
    size_t k = 0;
    for (int64_t n : tc->grid_mapping.grid) grid.push_back(n >= 0 ? n : dynamic_sizes.at(k++));
  }
  const int num_index = tc->grid_mapping.num_index_operands;
  std::vector<ShapeDtype> prefetch_shapes(args.begin(), args.begin() + num_index);
  // Index maps that do not read the prefetch values still take them: zeros stand in.
  std::vector<Array> stand_ins;
  for (const ShapeDtype& s : prefetch_shapes) stand_ins.push_back(Array::zeros(s.shape, s.dtype));
  return estimate(*tc, grid, prefetch_shapes, stand_ins, false);
}

}  // namespace pallas
