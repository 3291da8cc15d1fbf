// The GPU code generator's driver: the grid split, the index maps, block placement (in place or
// staged), scratch, the entry points. See codegen.h for the execution model.
#include "gpu/codegen.h"

#include <algorithm>
#include <array>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <cctype>
#include <cstdlib>
#include <set>
#include <sstream>
#include <tuple>

#include "core/blocks.h"
#include "core/call.h"
#include "eval/interpreter.h"
#include "ir/analysis.h"
#include "gpu/emitter.h"
#include "pallas/error.h"

namespace pallas::gpu {

using detail::Emitter;
using detail::EmitContext;
using detail::RefInfo;
using detail::ctype;

namespace {

// Whether any value the index map yields depends on its parameter `arg`.
bool yields_depend_on(const ir::Kernel& m, size_t arg) {
  std::set<ir::ValueId> dep = {m.body.args.at(arg)};
  std::function<bool(const ir::Op&)> touches = [&](const ir::Op& op) {
    for (ir::ValueId v : op.operands)
      if (dep.count(v)) return true;
    for (const ir::Region& r : op.regions)
      for (const ir::Op& o : r.ops)
        if (touches(o)) return true;
    return false;
  };
  std::function<void(const ir::Region&)> walk = [&](const ir::Region& r) {
    for (const ir::Op& op : r.ops) {
      for (const ir::Region& sub : op.regions) walk(sub);
      if (touches(op)) dep.insert(op.results.begin(), op.results.end());
    }
  };
  walk(m.body);
  const ir::Op& y = m.body.ops.back();
  for (ir::ValueId v : y.operands)
    if (dep.count(v)) return true;
  return false;
}

// Parallel axes go to CTAs; the others run in order inside each CTA.
void split_axes(const TracedCall& call, const std::vector<std::string>& semantics,
                std::vector<int>& parallel, std::vector<int>& sequential) {
  const GridMapping& gm = call.grid_mapping;
  const int rank = static_cast<int>(gm.grid.size());
  for (int a = 0; a < rank; ++a) {
    bool seq;
    if (!semantics.empty()) {
      const std::string& s = semantics[static_cast<size_t>(a)];
      seq = s != "parallel";
    } else {
      // An axis some output's block ignores accumulates into that block: it must run in order.
      seq = false;
      for (int o = 0; o < gm.num_outputs; ++o) {
        const BlockMapping& bm = gm.block_mappings[static_cast<size_t>(gm.num_inputs + o)];
        if (!yields_depend_on(bm.index_map, static_cast<size_t>(a))) seq = true;
      }
    }
    (seq ? sequential : parallel).push_back(a);
  }
}

bool needs_staging(const BlockMapping& bm) {
  for (size_t d = 0; d < bm.block_shape.size(); ++d) {
    const BlockDim& b = bm.block_shape[d];
    const int64_t n = bm.array.shape[d];
    if (b.is_blocked() && b.size() > 0 && n % b.size() != 0) return true;
    if (b.is_element() && (b.element().padding.first != 0 || b.element().padding.second != 0)) return true;
    if (b.is_bounded_slice() && bm.slice_sizes[d] != b.size()) return true;
  }
  return false;
}

std::string sanitize(const std::string& name) {
  std::string s;
  for (char c : name) s += (std::isalnum(static_cast<unsigned char>(c)) ? c : '_');
  return s.empty() ? "kernel" : s;
}

}  // namespace

int64_t parallel_points(const GeneratedKernel& k, const std::vector<int64_t>& grid) {
  int64_t points = 1;
  for (int a : k.parallel_axes) points *= grid[static_cast<size_t>(a)];
  return points;
}

int64_t launch_ctas(const TracedCall& call, const GeneratedKernel& k, int64_t points, int64_t multiprocessors,
                    int64_t resident_per_sm, int64_t max_active_clusters) {
  const int64_t cluster = k.cluster_ctas;
  if (k.co_resident()) {
    int64_t fit = multiprocessors * resident_per_sm / cluster * cluster;
    std::string why = std::to_string(multiprocessors) + " SMs x " + std::to_string(resident_per_sm) +
                      " per SM, as the kernel's threads, registers and shared memory allow";
    if (cluster > 1 && max_active_clusters > 0 && max_active_clusters * cluster < fit) {
      fit = max_active_clusters * cluster;
      why = std::to_string(max_active_clusters) + " clusters of " + std::to_string(cluster) +
            " CTAs, as cuOccupancyMaxActiveClusters places them: a cluster's CTAs share one GPC";
    }
    if (points > fit)
      throw Error("gpu::kernel \"" + call.name + "\" has semaphores of the whole grid (pl::get_global), so all of its " +
                      std::to_string(points) + " CTAs must run at once (a semaphore wait may wait for any of "
                      "them), but this GPU holds at most " + std::to_string(fit) + " of them at a time (" + why +
                      "): use a grid of at most " + std::to_string(fit) +
                      " CTAs, each looping over its share of the work",
                  call.kernel.loc);
    return points;
  }
  // Each SM needs several CTAs to hide memory latency: 4 per SM left a copy at ~30% of
  // cudaMemcpy's bandwidth on an H100.
  const int64_t per_sm = k.arena_in_shared ? resident_per_sm : std::min<int64_t>(resident_per_sm, 4);
  return std::max<int64_t>(cluster, std::min<int64_t>(points, multiprocessors * per_sm) / cluster * cluster);
}

std::vector<uint64_t> pack_params(const GeneratedKernel& k, const std::vector<uint64_t>& operand_ptrs,
                                  uint64_t workspace, uint64_t error_record, uint64_t profile,
                                  const std::vector<int64_t>& grid, const TensorMapEncoder& encode) {
  // The grid sizes are constants of the generated source (GeneratedKernel::grid).
  if (grid != k.grid)
    throw InternalError("gpu: a kernel generated for grid " + shape_to_string(k.grid) + " launched with grid " +
                        shape_to_string(grid));
  std::vector<uint64_t> words(operand_ptrs);
  if (words.empty()) words.push_back(0);
  words.push_back(workspace);
  words.push_back(error_record);
  words.push_back(profile);
  for (int64_t g : grid) words.push_back(static_cast<uint64_t>(g));
  if (grid.empty()) words.push_back(0);
  words.push_back(static_cast<uint64_t>(parallel_points(k, grid)));
  if (k.tensor_maps.empty()) return words;
  const size_t ok_word = words.size();
  words.push_back(0);
  words.resize((words.size() + 7) / 8 * 8 + 16 * k.tensor_maps.size(), 0);  // (the maps: alignas(64))
  uint64_t* maps = words.data() + (words.size() - 16 * k.tensor_maps.size());
  for (size_t m = 0; m < k.tensor_maps.size(); ++m) {
    const TensorMapSpec& spec = k.tensor_maps[m];
    if (encode && encode(spec, operand_ptrs.at(static_cast<size_t>(spec.operand)), maps + 16 * m))
      words[ok_word] |= uint64_t{1} << m;
  }
  return words;
}

TensorMapEncoder cached_tensor_map_encoder(TensorMapEncoder encode) {
  using Key = std::tuple<int, std::vector<uint64_t>, std::vector<uint64_t>, std::vector<uint32_t>, int, uint64_t>;
  struct Cache {
    std::mutex mu;
    std::map<Key, std::pair<bool, std::array<uint64_t, 16>>> maps;
  };
  auto cache = std::make_shared<Cache>();
  return [cache, encode = std::move(encode)](const TensorMapSpec& spec, uint64_t address, uint64_t* map) {
    Key key{spec.elem_bytes, spec.dims, spec.strides, spec.box, spec.swizzle_bytes, address};
    std::lock_guard<std::mutex> lock(cache->mu);
    auto it = cache->maps.find(key);
    if (it == cache->maps.end()) {
      if (cache->maps.size() >= 1024) cache->maps.clear();  // (bounded: arrays come and go)
      std::pair<bool, std::array<uint64_t, 16>> made{false, {}};
      made.first = encode(spec, address, made.second.data());
      it = cache->maps.emplace(std::move(key), made).first;
    }
    if (it->second.first) std::copy(it->second.second.begin(), it->second.second.end(), map);
    return it->second.first;
  };
}

CodegenOptions codegen_options(const CompilerParamsMap& params) {
  CodegenOptions o;
  auto it = params.find("mosaic_gpu");
  if (it != params.end()) {
    const auto& p = std::get<gpu::CompilerParams>(it->second);
    o.dimension_semantics = p.dimension_semantics;
    o.profile_space = p.profile_space;
    if (p.max_concurrent_steps) o.default_buffer_count = *p.max_concurrent_steps;
    o.profile_dir = p.profile_dir;
    o.approx_math = p.approx_math;
  }
  // A developer's switch for measuring what async wgmma brings (docs/GPU.md).
  if (const char* v = std::getenv("PALLAS_GPU_SYNC_WGMMA"); v && std::string(v) == "1") o.async_wgmma = false;
  if (const char* v = std::getenv("PALLAS_GPU_NO_TMA"); v && std::string(v) == "1") o.tma = false;
  if (const char* v = std::getenv("PALLAS_GPU_NO_SWIZZLE"); v && std::string(v) == "1") o.swizzle = false;
  if (const char* v = std::getenv("PALLAS_GPU_NO_MULTICAST"); v && std::string(v) == "1") o.multicast = false;
  if (const char* v = std::getenv("PALLAS_GPU_NO_REGISTER_TILES"); v && std::string(v) == "1") o.register_tiles = false;
  return o;
}

bool cuda_emitter_supports(ir::OpCode code) {
  switch (code) {
    case ir::OpCode::DmaStart: case ir::OpCode::DmaWait: case ir::OpCode::GetBarrierSemaphore:
    case ir::OpCode::SubcoreBarrier:
      return false;  // TPU operations: the GPU has its own primitives
    case ir::OpCode::ScLoadGather: case ir::OpCode::ScStoreScatter: case ir::OpCode::ScAddupdateScatter:
    case ir::OpCode::ScLoadExpanded: case ir::OpCode::ScStoreCompressed: case ir::OpCode::ScAddupdate:
    case ir::OpCode::ScAddupdateCompressed: case ir::OpCode::ScFetchAndAdd: case ir::OpCode::ScMaskedScan:
    case ir::OpCode::ScScanCount: case ir::OpCode::ScSortKeyVal: case ir::OpCode::ScAllReducePopulationCount:
    case ir::OpCode::ScAllReduceFfs: case ir::OpCode::ScPack: case ir::OpCode::ScUnpack:
    case ir::OpCode::ScDynamicGather:
      return false;  // TPU SparseCore vector subcore operations
    default: return true;
  }
}

// The values result d of a block's index map takes over `grid`, when the map returns a program
// id or an integer constant as it is (the common maps: `(i, k)`, `(i, 0)`); nullopt otherwise.
// A block whose index ranges are known to lie inside the array needs no bounds check in the
// generated kernel (fewer branches and error paths to run and to compile; the source is
// generated per grid, so the proof holds for the grid the kernel runs on).
std::optional<std::pair<int64_t, int64_t>> static_block_index_range(const ir::Kernel& map, size_t d,
                                                                    const std::vector<int64_t>& grid) {
  const ir::Region& body = map.body;
  if (body.ops.empty() || body.ops.back().code != ir::OpCode::Yield || d >= body.ops.back().operands.size())
    return std::nullopt;
  const ir::ValueId v = body.ops.back().operands[d];
  for (size_t a = 0; a < grid.size() && a < body.args.size(); ++a)
    if (body.args[a] == v) {
      if (grid[a] < 1) return std::nullopt;
      return std::make_pair<int64_t, int64_t>(0, grid[a] - 1);
    }
  for (const ir::Op& op : body.ops)
    if (op.code == ir::OpCode::Constant && op.results.size() == 1 && op.results[0] == v) {
      const Scalar c = op.attrs.get_scalar(ir::AttrKey::Value);
      if (!is_integer(c.dtype)) return std::nullopt;
      return std::make_pair(c.as_int64(), c.as_int64());
    }
  return std::nullopt;
}

// Whether dim d of every block the grid visits starts at 0 or later and ends by `limit` (the
// padded array for the bounds check, the array itself for the in-place test), as far as the
// index map's static range shows.
bool grid_keeps_blocks_within(const BlockMapping& bm, size_t d, const std::vector<int64_t>& grid, int64_t limit) {
  const BlockDim& bd = bm.block_shape[d];
  const auto range = static_block_index_range(bm.index_map, d, grid);
  return range && range->first >= 0 && range->second * (bd.is_blocked() ? bd.size() : 1) + core::block_extent(bm, d) <= limit;
}

// The start of a block along one dim, from its block index `index`: a Blocked dim counts blocks,
// the others elements.
std::string block_start(const BlockDim& bd, const std::string& index) {
  // (64-bit constants: an index map may return a constant, and constant products pass 2^31.)
  return bd.is_blocked() ? index + " * " + std::to_string(bd.size()) + "LL" : index;
}

// A block in place in its array: its start as an element offset (from each dim's start
// expression) and the strides of the kernel's view of it (squeezed dims dropped).
std::pair<std::string, std::vector<int64_t>> in_place_layout(const BlockMapping& bm, const std::vector<int64_t>& array_strides,
                                                             const std::function<std::string(size_t)>& start) {
  std::string off;
  std::vector<int64_t> strides;
  for (size_t d = 0; d < bm.block_shape.size(); ++d) {
    off += (off.empty() ? "" : " + ") + start(d) + " * " + std::to_string(array_strides[d]) + "LL";
    if (!bm.block_shape[d].is_squeezed()) strides.push_back(array_strides[d]);
  }
  return {off, strides};
}

GeneratedKernel generate_cuda(const TracedCall& call, const std::vector<int64_t>& grid,
                              const CodegenOptions& opts) {
  const GridMapping& gm = call.grid_mapping;
  const ir::Kernel& k = call.kernel;
  GeneratedKernel out;
  out.threads_per_cta = opts.threads_per_cta;
  const int num_operands = gm.num_index_operands + gm.num_inputs + gm.num_outputs;
  out.num_grid_dims = static_cast<int>(grid.size());
  out.grid = grid;
  out.entry = "pallas_" + sanitize(call.name);
  out.host_entry = out.entry + "_host";
  const std::vector<std::string>& semantics = opts.dimension_semantics;
  if (!semantics.empty() && semantics.size() != grid.size())
    throw Error("dimension_semantics has " + std::to_string(semantics.size()) + " entries but the grid has " +
                    std::to_string(grid.size()) + " dimensions",
                call.kernel.loc);
  for (const std::string& s : semantics)
    if (s != "parallel" && s != "arbitrary" && s != "sequential")
      throw Error("dimension_semantics entries must be \"parallel\", \"arbitrary\" or \"sequential\", got \"" + s + "\"",
                  call.kernel.loc);
  if (opts.profile_space < 0)
    throw Error("profile_space must be >= 0 (the region events each Pallas thread may record), got " +
                    std::to_string(opts.profile_space),
                call.kernel.loc);
  if ((opts.profile_space > 0) != !opts.profile_dir.empty())
    throw Error(opts.profile_space > 0
                    ? "profile_space is set but profile_dir is empty: name the directory the trace goes to"
                    : "profile_dir is set but profile_space is 0: say how many region events each Pallas "
                      "thread may record",
                call.kernel.loc);
  out.profile_space = opts.profile_space;
  out.profile_dir = opts.profile_dir;
  const bool gpu_kernel = call.gpu_kernel.has_value();
  const int thread_axis = gpu_kernel && call.gpu_kernel->has_thread_axis ? static_cast<int>(grid.size()) - 1 : -1;
  const std::string thread_axis_name = thread_axis >= 0 && static_cast<size_t>(thread_axis) < gm.grid_names.size()
                                           ? gm.grid_names[static_cast<size_t>(thread_axis)]
                                           : "";
  if (gpu_kernel) {
    // Every mesh axis is a parallel CTA axis, so each CTA has its own scratch and barriers, as in
    // the interpreter (split_axes would take the whole-array blocks for accumulating ones) — but
    // the thread axis: each of its Pallas threads is a group of the CTA's threads (a warpgroup),
    // which reads its index from pl_group().
    for (int a = 0; a < static_cast<int>(grid.size()); ++a)
      if (a != thread_axis) out.parallel_axes.push_back(a);
    if (thread_axis >= 0) out.num_groups = static_cast<int>(grid[static_cast<size_t>(thread_axis)]);
    out.threads_per_cta = kWarpgroupThreads * out.num_groups;
  } else {
    split_axes(call, semantics, out.parallel_axes, out.sequential_axes);
  }

  detail::Arena arena;
  std::ostringstream body;
  EmitContext ctx;
  ctx.out = &body;
  ctx.arena = &arena;
  ctx.error_sites = &out.error_sites;
  ctx.fail_return = "return false;";
  ctx.debug_checks = call.debug_checks;
  ctx.num_grid_dims = out.num_grid_dims;
  ctx.grid_names = gm.grid_names;
  ctx.barriers = "pl_mbar";
  ctx.phases = "pl_phase";
  const int G = std::max(1, out.num_grid_dims);

  // ---- Index maps: one function each, computing the block's start in the padded array.
  std::ostringstream maps;
  for (size_t j = 0; j < gm.block_mappings.size(); ++j) {
    const BlockMapping& bm = gm.block_mappings[j];
    maps << "PL_DEV bool pl_index_map_" << j << "(const PlParams& p, const pl_i64* g, const pl_i64* G, pl_i64* out) {\n";
    EmitContext mctx = ctx;
    mctx.out = &maps;
    Emitter em(bm.index_map, mctx, 1);
    for (size_t a = 0; a < grid.size(); ++a) em.bind_scalar(bm.index_map.body.args[a], "(pl_i32)g[" + std::to_string(a) + "]");
    for (int i = 0; i < gm.num_index_operands; ++i) {
      const ir::Type& t = bm.index_map.type(bm.index_map.body.args[grid.size() + static_cast<size_t>(i)]);
      RefInfo r{"((" + ctype(t.dtype) + "*)p.op[" + std::to_string(i) + "])", t.dtype, t.shape, detail::contiguous_strides(t.shape)};
      em.bind_ref(bm.index_map.body.args[grid.size() + static_cast<size_t>(i)], r);
    }
    mctx.region_names = nullptr;  // regions are the kernel body's
    std::vector<ir::ValueId> ys = em.emit_region(bm.index_map.body);
    for (size_t d = 0; d < ys.size(); ++d) em.line("out[" + std::to_string(d) + "] = (pl_i64)" + em.info(ys[d]).name + ";");
    em.line("return true;");
    maps << "}\n\n";
  }

  // ---- Persistent per-CTA memory first: scratch and staging buffers live for the whole call.
  struct Block {
    bool staged = false;
    int64_t offset = -1;
    Shape padded;
    std::vector<int64_t> low, array_strides;
  };
  std::vector<Block> blocks(gm.block_mappings.size());
  // An input block the kernel writes (not aliased to an output) is staged at every point: in
  // place, the write would change the caller's array (a device array passed without a copy) and
  // race with other CTAs reading the same block. Each point's block starts from the array.
  const std::vector<bool> params_written = ir::params_written(k);
  std::map<int, int> input_of_output;  // input_output_aliases, by output
  for (auto [in, o] : call.input_output_aliases) input_of_output[o] = in;
  auto aliased_input = [&](int j) {
    return std::any_of(input_of_output.begin(), input_of_output.end(),
                       [&](const auto& io) { return io.second - gm.num_index_operands == j; });
  };
  bool written_input_staged = false;
  for (size_t j = 0; j < blocks.size(); ++j) {
    const BlockMapping& bm = gm.block_mappings[j];
    Block& b = blocks[j];
    core::padded_layout(bm, b.padded, b.low);
    b.array_strides = detail::contiguous_strides(bm.array.shape);
    const bool written_input = static_cast<int>(j) < gm.num_inputs && !gpu_kernel &&
                               params_written[static_cast<size_t>(gm.num_index_operands) + j] &&
                               !aliased_input(static_cast<int>(j));
    written_input_staged = written_input_staged || written_input;
    b.staged = needs_staging(bm) || written_input;
    if (b.staged)
      b.offset = arena.alloc(std::max<int64_t>(1, bm.block_ref_type.size()) * itemsize(bm.array.dtype));
  }
  // Barriers live apart, in static shared memory (an mbarrier must be in shared memory even when
  // the arena is not): scratch_offsets of a barrier scratch is its first index in pl_mbar.
  std::vector<int64_t> scratch_offsets;
  std::map<int, int64_t> union_offsets;  // a gpu::Union's start in the arena
  // A gpu::kernel's SMEM tiles that wgmma reads, of rows of 128, 64 or 32 bytes or of several
  // 128-byte panels (2-byte elements, whole 8-row groups) otherwise only copied, loaded and
  // stored (element by element at their swizzled places), are kept swizzled by their row's
  // (panel's) bytes (swizzled_smem_tiles), each from a 1024-byte boundary: TMA boxes land in
  // wgmma's layout and wgmma reads them in place, with no staging copy. The choice is the
  // backend's, as Mosaic GPU infers its SMEM transforms; the kernel's results do not depend on it.
  const size_t first_scratch = static_cast<size_t>(gm.num_index_operands) + blocks.size();
  // A run_scoped laid out for the CTA before the body (its barriers; or shared by several Pallas
  // threads): its SMEM arrays may be swizzled too, its other scopes live in a thread's tiles.
  auto shared_scope = [&](const ir::Op& op) { return op.attrs.has(ir::AttrKey::Axes) || out.num_groups == 1; };
  auto laid_out_scope = [&](const ir::Op& op) {
    return op.code == ir::OpCode::RunScoped &&
           (op.attrs.has(ir::AttrKey::Arrivals) || (shared_scope(op) && out.num_groups > 1));
  };
  std::set<ir::ValueId> swizzled_tiles, own_scoped_arrays;
  if (gpu_kernel && opts.swizzle) {
    std::set<ir::ValueId> candidates;
    auto consider = [&](ir::ValueId v, const ir::Type& t) {
      const size_t r = t.shape.size();
      if (t.space == MemorySpace::GpuShared && (t.dtype == DType::BF16 || t.dtype == DType::F16) && r >= 2 &&
          (t.shape[r - 1] % 64 == 0 || t.shape[r - 1] == 32 || t.shape[r - 1] == 16) && t.shape[r - 2] % 8 == 0)
        candidates.insert(v);
    };
    for (size_t s = 0; s < gm.scratch_types.size(); ++s)
      if (gm.scratch_unions[s].union_index < 0) consider(k.body.args[first_scratch + s], gm.scratch_types[s]);
    std::function<void(const ir::Region&)> scopes = [&](const ir::Region& r) {
      for (const ir::Op& op : r.ops) {
        if (op.code == ir::OpCode::RunScoped)
          for (ir::ValueId a : op.regions[0].args) {
            consider(a, k.type(a));
            // Not in the shared area: a Pallas thread's own (its tile arena), or a plain scope's.
            if (!(laid_out_scope(op) && shared_scope(op))) own_scoped_arrays.insert(a);
          }
        for (const ir::Region& inner : op.regions) scopes(inner);
      }
    };
    scopes(k.body);
    swizzled_tiles = detail::swizzled_smem_tiles(k, candidates);
  }
  // A Pallas thread's own scoped arrays among them (allocated in its tiles, EmitContext).
  std::set<ir::ValueId> swizzled_own_scoped;
  std::set_intersection(swizzled_tiles.begin(), swizzled_tiles.end(), own_scoped_arrays.begin(), own_scoped_arrays.end(),
                        std::inserter(swizzled_own_scoped, swizzled_own_scoped.end()));
  auto is_swizzled = [&](size_t s) { return swizzled_tiles.count(k.body.args[first_scratch + s]) > 0; };
  // A gpu::kernel's f32 ACC scratch that wgmma accumulates into, each Pallas thread its own
  // matrix, lives in registers, as on Mosaic GPU (register_accumulators): its memory holds it
  // only while something else reads or writes it, and serves the products where wgmma does not
  // run (sm_80; host emulation with threads that are not warpgroups). That memory is in the
  // workspace, not in shared memory (GeneratedKernel::acc_memory_bytes).
  std::map<ir::ValueId, detail::AccumulatorRegisters> register_accs;
  if (gpu_kernel) {
    std::set<ir::ValueId> candidates;
    for (size_t s = 0; s < gm.scratch_types.size(); ++s) {
      const ir::Type& t = gm.scratch_types[s];
      if (t.space == MemorySpace::GpuAcc && t.dtype == DType::F32 && gm.scratch_unions[s].union_index < 0)
        candidates.insert(k.body.args[first_scratch + s]);
    }
    register_accs = detail::register_accumulators(k, candidates, thread_axis_name, out.num_groups, swizzled_tiles);
  }
  auto in_registers = [&](size_t s) { return register_accs.count(k.body.args[first_scratch + s]) > 0; };
  // A gpu::kernel's shared-memory scratch starts at 128-byte boundaries: what TMA copies need
  // (1024 for the swizzled tiles, and then the arena is whole KiB: each CTA's in host emulation).
  const int64_t scratch_align = gpu_kernel && opts.tma ? 128 : 16;
  const int64_t arena_align = swizzled_tiles.empty() ? scratch_align : 1024;
  for (size_t s = 0; s < gm.scratch_types.size(); ++s) {
    const ir::Type& t = gm.scratch_types[s];
    const ScratchUnionSlot& slot = gm.scratch_unions[s];
    if (slot.union_index >= 0) {
      auto [u, fresh] = union_offsets.try_emplace(slot.union_index);
      if (fresh) u->second = arena.alloc(std::max<int64_t>(1, slot.union_bytes), scratch_align);
      scratch_offsets.push_back(u->second + slot.offset);
      continue;
    }
    if (t.dtype == DType::GpuBarrier) {
      scratch_offsets.push_back(out.num_barriers);
      out.num_barriers += std::max<int64_t>(1, t.size());
      continue;
    }
    if (t.dtype == DType::Semaphore && t.space == MemorySpace::Gmem) {
      if (!gpu_kernel)
        throw NotSupportedError("gpu::Semaphore scratch in a pallas_call on the GPU backend (gpu::kernel has them)",
                                k.loc);
      if (gm.scratch_grid_wide[s]) {  // pl::get_global's: the grid's, in the workspace
        scratch_offsets.push_back(out.semaphore_bytes);
        out.semaphore_bytes += std::max<int64_t>(1, t.size()) * 4;
        continue;
      }
      // The CTA's (only its Pallas threads signal and wait): i32 counters in its shared memory,
      // zeroed with the scratch (pl_init_scratch, at each point: a point is a CTA of the grid).
    } else if (t.space == MemorySpace::Semaphore || is_semaphore(t.dtype)) {
      throw NotSupportedError("semaphore scratch on the GPU backend (a TPU feature)", k.loc);
    }
    if (in_registers(s)) {
      scratch_offsets.push_back(out.acc_memory_bytes);  // in the workspace
      out.acc_memory_bytes += (t.size() * itemsize(t.dtype) + 127) / 128 * 128;
      continue;
    }
    scratch_offsets.push_back(
        arena.alloc(std::max<int64_t>(1, t.size()) * itemsize(t.dtype), is_swizzled(s) ? 1024 : scratch_align));
  }
  // run_scoped with barriers, or shared by several Pallas threads: its arrays in the CTA's arena
  // and its barriers in pl_mbar, for the whole call (ScopedLayout); initialized with the scratch
  // barriers, and again at each entry of the scope. The shared arrays are stacked in one area of
  // the arena: a scope's lie above those of the scopes around it, and scopes one after another
  // (or in different branches) reuse the same bytes — every thread has left one (its exit
  // meeting) before any enters the next.
  std::map<const ir::Op*, detail::ScopedLayout> scoped_layouts;
  std::vector<std::pair<int64_t, int64_t>> scoped_barriers;  // (index, arrivals) of each
  {
    auto align_up = [&](int64_t x) { return (x + scratch_align - 1) / scratch_align * scratch_align; };
    // Lays out the scopes of region r whose shared arrays start at `base` (offsets in the area);
    // returns the end of the highest.
    std::function<int64_t(const ir::Region&, int64_t)> lay_out = [&](const ir::Region& r, int64_t base) {
      int64_t top = base;
      for (const ir::Op& op : r.ops) {
        int64_t inner_base = base;
        const bool shared = shared_scope(op);
        if (laid_out_scope(op)) {
          detail::ScopedLayout layout;
          layout.shared = shared;
          if (shared && out.num_groups > 1) {  // one arrival per Pallas thread, at the entry and at the exit
            layout.meeting = out.num_barriers;
            scoped_barriers.emplace_back(out.num_barriers++, out.num_groups);
          }
          layout.arrivals = op.attrs.has(ir::AttrKey::Arrivals) ? op.attrs.get_ints(ir::AttrKey::Arrivals)
                                                                 : ir::Ints(op.regions[0].args.size(), 0);
          for (size_t i = 0; i < op.regions[0].args.size(); ++i) {
            const ir::Type& t = k.type(op.regions[0].args[i]);
            const int64_t n = std::max<int64_t>(1, t.size());
            if (t.dtype == DType::GpuBarrier) {
              layout.where.push_back(out.num_barriers);
              for (int64_t b = 0; b < n * (shared ? 1 : out.num_groups); ++b)
                scoped_barriers.emplace_back(out.num_barriers++, layout.arrivals[i]);
            } else if (shared) {
              const bool swizzled = swizzled_tiles.count(op.regions[0].args[i]) > 0;
              if (swizzled) inner_base = (inner_base + 1023) / 1024 * 1024;  // (the swizzle's pattern)
              layout.where.push_back(inner_base);
              inner_base = align_up(inner_base + n * itemsize(t.dtype));
              if (swizzled) layout.swizzled.resize(i + 1), layout.swizzled[i] = detail::scoped_swizzle_macro(op.regions[0].args[i]);
            } else {
              layout.where.push_back(-1);
            }
          }
          layout.swizzled.resize(op.regions[0].args.size());
          scoped_layouts[&op] = std::move(layout);
        }
        top = std::max(top, inner_base);
        for (const ir::Region& inner : op.regions) top = std::max(top, lay_out(inner, inner_base));
      }
      return top;
    };
    const int64_t area_bytes = lay_out(k.body, 0);
    if (area_bytes > 0) {
      const int64_t area = arena.alloc(area_bytes, swizzled_tiles.empty() ? scratch_align : 1024);
      for (auto& [op, layout] : scoped_layouts)
        for (size_t i = 0; i < layout.where.size(); ++i)
          if (layout.shared && k.type(op->regions[0].args[i]).dtype != DType::GpuBarrier) layout.where[i] += area;
    }
  }
  // The memory of ACC scratch s kept in registers: this CTA's share of the workspace.
  auto acc_memory = [&](size_t s) {
    return "((float*)(p.workspace + " + std::to_string(out.arena_offset()) + " + pl_launch_cta() * " +
           std::to_string(out.acc_memory_bytes) + "LL + " + std::to_string(scratch_offsets[s]) + "))";
  };
  // ---- The pipeline of the innermost sequential axis. An input whose block moves along that axis
  // is copied ahead into a ring of shared-memory slots (cp.async): while the body runs step k,
  // the copies of steps k + 1 .. k + depth - 1 are in flight, and the body reads its block from
  // shared memory instead of global memory. An input qualifies when its block lies inside the
  // array at every point (the static proof of grid_keeps_blocks_within: the copy never needs a
  // check or a padding value), its rows are whole 16-byte chunks (the last dim blocked, the block's
  // and the array's rows multiples of 16 bytes), and nothing writes it (not aliased to an output,
  // not stored to by the kernel: a write to a slot would not reach the array). Depth: the largest
  // Buffered(count) among them (by default gpu::CompilerParams::max_concurrent_steps, else 2;
  // Buffered(1) opts an input out). The ring must fit
  // in shared memory beside the barriers and wgmma's staging; inputs that do not fit stay in place.
  std::vector<int64_t> slot_offset(blocks.size(), -1), slot_block_bytes(blocks.size(), 0);
  // A pipelined input's slot `slot` (an int expression) of its ring.
  auto slot_pointer = [&](size_t j, const std::string& slot) {
    return "pl_slots + " + std::to_string(slot_offset[j]) + " + (pl_i64)" + slot + " * " + std::to_string(slot_block_bytes[j]);
  };
  // What wgmma's staging would take beside them, if the kernel has a dot at its top level.
  bool has_dot = false;
  for (const ir::Op& op : k.body.ops) has_dot = has_dot || op.code == ir::OpCode::DotGeneral;
  const int64_t staging_reserve = has_dot ? wgmma_stage_bytes() * std::max(1, out.threads_per_cta / 128) : 0;
  // A pipelined 2-D block of 2-byte elements (the kernel's view: leading dims squeezed, as an
  // attention head's) may be kept in a slot in wgmma's canonical layout (pl_slot_elem), when the
  // body only reads it as a tensor-core operand: the emitter decides (Emitter::slot_layout), after
  // the body; until then the code names it PL_SLOT_LAYOUT_j.
  auto layout_candidate = [&](int j) {
    const BlockMapping& bm = gm.block_mappings[static_cast<size_t>(j)];
    const size_t rank = bm.block_shape.size();
    bool squeezed = rank >= 2;
    for (size_t d = 0; d + 2 < rank; ++d) squeezed = squeezed && bm.block_shape[d].is_squeezed();
    return squeezed && bm.block_ref_type.shape.size() == 2 && itemsize(bm.array.dtype) == 2;
  };
  // Input j's blocks as TMA boxes: the tensor map of boxes of its block (of `columns` columns
  // each, a slot in a canonical layout; 0: the whole block), or nullopt past a map's limits.
  auto block_box = [&](int j, int64_t columns = 0, int swizzle_bytes = 0) {
    const BlockMapping& bm = gm.block_mappings[static_cast<size_t>(j)];
    std::vector<int64_t> box;
    for (size_t d = 0; d < bm.block_shape.size(); ++d) box.push_back(core::block_extent(bm, d));
    if (columns > 0) box.back() = columns;
    return detail::tensor_map_for_boxes(gm.num_index_operands + j, bm.array.dtype, bm.array.shape, box, swizzle_bytes);
  };
  // The layout of input j's slot (pl_slot_elem) where wgmma runs, once the body has chosen a
  // canonical one (Emitter::slot_layout: 1 K-major, 2 MN-major; 0 row-major): its swizzled twin
  // when the block is whole panels of whole 8-row groups — 3, 4 for 128-byte panel rows (64
  // columns), else 5, 6 for 64 bytes, 7, 8 for 32 (the device runtime's pl_swizzled_layout).
  auto canonical_layout = [&](const Emitter& em, int j) {
    const int layout = em.slot_layout(j);
    const BlockMapping& bm = gm.block_mappings[static_cast<size_t>(j)];
    const size_t rank = bm.block_shape.size();  // (the last two dims: layout_candidate's)
    const int64_t rows = core::block_extent(bm, rank - 2), row_bytes = core::block_extent(bm, rank - 1) * itemsize(bm.array.dtype);
    if (layout == 0 || !opts.swizzle || rows % 8 != 0) return layout;
    for (int w : {128, 64, 32})
      if (row_bytes % w == 0) return (w == 128 ? 3 : w == 64 ? 5 : 7) + (layout == 2 ? 1 : 0);
    return layout;
  };
  // The bytes of a panel's rows in a slot of layout L (0: not swizzled).
  auto swizzle_of = [](int layout) { return layout >= 7 ? 32 : layout >= 5 ? 64 : layout >= 3 ? 128 : 0; };
  auto is_resident = [&](int j) {
    return std::find(out.resident_inputs.begin(), out.resident_inputs.end(), j) != out.resident_inputs.end();
  };
  if (!gpu_kernel && !out.sequential_axes.empty()) {
    const int axis = out.sequential_axes.back();
    std::vector<int> candidates;
    int depth = 0;
    for (int j = 0; j < gm.num_inputs; ++j) {
      const BlockMapping& bm = gm.block_mappings[static_cast<size_t>(j)];
      const int count = bm.pipeline_mode ? bm.pipeline_mode->buffer_count : opts.default_buffer_count;
      const int64_t item = itemsize(bm.array.dtype);
      const size_t rank = bm.block_shape.size();
      if (count < 2 || rank == 0 || blocks[static_cast<size_t>(j)].staged || aliased_input(j) ||
          !bm.block_shape.back().is_blocked() || (bm.block_shape.back().size() * item) % 16 != 0 ||
          (bm.array.shape.back() * item) % 16 != 0 || params_written[static_cast<size_t>(gm.num_index_operands + j)])
        continue;
      bool inside = true;
      for (size_t d = 0; d < rank; ++d) inside = inside && grid_keeps_blocks_within(bm, d, grid, bm.array.shape[d]);
      if (!inside) continue;
      candidates.push_back(j);
      // A block the same at every step of the axis (its index map does not read it: attention's q)
      // is resident: one slot, filled with the first step's copies of each run of the axis.
      if (yields_depend_on(bm.index_map, static_cast<size_t>(axis)))
        depth = std::max(depth, count);
      else
        out.resident_inputs.push_back(j);
    }
    if (depth == 0) candidates.clear(), out.resident_inputs.clear();  // (no ring: nothing moves along the axis)
    // A step's wgmma may still be reading its slots when the next step begins (async_wgmma: the
    // register accumulator's products, operands in ring slots). Those slots must not be the
    // ones the next step refills, so such a ring has one slot more than its depth: a slot is
    // refilled two steps after its use, when the wait of the step between has retired its wgmma
    // (Mosaic GPU's delay_release). Decided before the body, for any ring that may feed wgmma.
    const bool feeds_async_wgmma =
        opts.async_wgmma && has_dot && std::any_of(candidates.begin(), candidates.end(), layout_candidate);
    const int slots = depth + (feeds_async_wgmma ? 1 : 0);
    // (Beside the ring: the static shared memory — the barriers, the ring's own — and up to the
    // next 1024-byte boundary, where dynamic shared memory starts when a slot is swizzled.)
    const int64_t budget = opts.max_shared_bytes - static_shared_reserve(out.num_barriers) - staging_reserve;
    for (int j : candidates) {
      const BlockMapping& bm = gm.block_mappings[static_cast<size_t>(j)];
      const int64_t align = GeneratedKernel::kSlotAlign;
      const int64_t bytes = (std::max<int64_t>(1, bm.block_ref_type.size()) * itemsize(bm.array.dtype) + align - 1) / align * align;
      const int copies = is_resident(j) ? 1 : slots;
      if (out.pipeline_slot_bytes + copies * bytes > budget) {
        if (is_resident(j)) out.resident_inputs.erase(std::find(out.resident_inputs.begin(), out.resident_inputs.end(), j));
        continue;
      }
      slot_offset[static_cast<size_t>(j)] = out.pipeline_slot_bytes;
      slot_block_bytes[static_cast<size_t>(j)] = is_resident(j) ? 0 : bytes;  // (a resident block's slot: any slot index)
      out.pipeline_slot_bytes += copies * bytes;
      out.pipelined_inputs.push_back(j);
    }
    if (!out.pipelined_inputs.empty()) {
      out.pipeline_depth = depth;
      out.pipeline_slots = slots;
    }
    // The TMA unit copies the blocks that are boxes of their arrays (every dim blocked or
    // squeezed, within a map's limits: detail::tensor_map_for_boxes), with at most 32 slots (each
    // thread keeps a parity bit per slot's barrier).
    for (int j : out.pipelined_inputs) {
      const BlockMapping& bm = gm.block_mappings[static_cast<size_t>(j)];
      bool box = opts.tma && out.pipeline_slots <= 32;
      for (const BlockDim& bd : bm.block_shape) box = box && (bd.is_blocked() || bd.is_squeezed());
      if (box && block_box(j)) out.tma_inputs.push_back(j);
    }
    out.tensor_maps.resize(out.tma_inputs.size());  // (theirs come first; the body's copies add theirs)
  }
  // Which of the TMA inputs' maps input j's is (-1: none).
  auto tma_map_of = [&](int j) {
    const auto it = std::find(out.tma_inputs.begin(), out.tma_inputs.end(), j);
    return it == out.tma_inputs.end() ? -1 : static_cast<int>(it - out.tma_inputs.begin());
  };
  // pl_prefetch: the pipelined inputs' blocks at point g into slot `slot` of their rings, the
  // CTA's threads taking 16-byte chunks in turn. An array whose base is not 16-byte aligned (a
  // DLPack import of an offset view) is copied element by element instead, synchronously.
  std::ostringstream prefetch;
  // A TMA input's block: the bytes of its boxes (the whole block).
  auto block_bytes = [&](int j) {
    const BlockMapping& bm = gm.block_mappings[static_cast<size_t>(j)];
    return std::max<int64_t>(1, bm.block_ref_type.size()) * itemsize(bm.array.dtype);
  };
  if (out.pipeline_depth > 0) {
    prefetch << "PL_DEV void pl_prefetch(const PlParams& p, const pl_i64* g, const pl_i64* G, int slot) {\n";
    // (Resident blocks come with the first step's copies, into their one slot.)
    if (!out.resident_inputs.empty())
      prefetch << "  [[maybe_unused]] const bool first = g[" << out.sequential_axes.back() << "] == 0;\n";
    if (!out.tma_inputs.empty()) {
      // Which inputs the TMA unit copies this launch: their maps were encoded, and the slot's layout
      // in this compile is the one the map's boxes were made for (PL_TMA_LAYOUT_j).
      std::string bytes;
      prefetch << "#if PL_HAS_BULK_COPY\n";
      for (size_t m = 0; m < out.tma_inputs.size(); ++m) {
        const std::string J = std::to_string(out.tma_inputs[m]), M = std::to_string(m);
        prefetch << "  const bool tma_" << M << " = ((p.tma_ok >> " << M << ") & 1u) && PL_TMA_LAYOUT_" << J
                 << " == " << (layout_candidate(out.tma_inputs[m]) ? "PL_SLOT_LAYOUT_" + J : "0") << ";\n";
        bytes += (bytes.empty() ? "" : " + ") + std::string("(tma_") + M + (is_resident(out.tma_inputs[m]) ? " && first" : "") +
                 " ? " + std::to_string(block_bytes(out.tma_inputs[m])) + "u : 0u)";
      }
      prefetch << "  if (pl_cta_tid() == 0) pl_expect_tx(pl_ring_mbar + slot, " << bytes << ");\n#endif\n";
    }
    for (int j : out.pipelined_inputs) {
      const BlockMapping& bm = gm.block_mappings[static_cast<size_t>(j)];
      const Block& b = blocks[static_cast<size_t>(j)];
      const size_t rank = bm.block_shape.size();
      const std::string T = ctype(bm.array.dtype), J = std::to_string(j);
      const std::string op = "p.op[" + std::to_string(gm.num_index_operands + j) + "]";
      const auto [start, view_strides] = in_place_layout(
          bm, b.array_strides, [&](size_t d) { return block_start(bm.block_shape[d], "bi[" + std::to_string(d) + "]"); });
      const Shape& shape = bm.block_ref_type.shape;
      const int64_t row = shape.back(), rows = std::max<int64_t>(1, bm.block_ref_type.size()) / row;
      const int64_t chunks_per_row = row * itemsize(bm.array.dtype) / 16;
      const Shape row_shape(shape.begin(), shape.end() - 1);
      const std::vector<int64_t> row_strides(view_strides.begin(), view_strides.end() - 1);
      prefetch << (is_resident(j) ? "  if (first) {  // (resident) " : "  {  // ") << bm.origin << "\n    pl_i64 bi[" << rank
               << "];\n    pl_index_map_" << J << "(p, g, G, bi);\n"
               << "    const " << T << "* src = ((const " << T << "*)" << op << ") + (" << start << ");\n"
               << "    pl_u8* dst = " << slot_pointer(static_cast<size_t>(j), "slot") << ";\n";
      if (const int m = tma_map_of(j); m >= 0) {
        // Thread 0 issues the boxes: the block's start, innermost dim first; a slot in a canonical
        // layout (2-D) takes a box of all rows per 8 columns (no swizzle: a 16-byte column chunk)
        // or per panel (swizzled: 64, 32 or 16 columns).
        const std::string M = std::to_string(m), map = "&p.tmap[" + M + "]", bar = "pl_ring_mbar + slot";
        std::string coords;
        for (size_t d = rank; d-- > 0;)
          coords += (coords.empty() ? "" : ", ") + std::string("(int)(") + block_start(bm.block_shape[d], "bi[" + std::to_string(d) + "]") + ")";
        prefetch << "#if PL_HAS_BULK_COPY\n    if (tma_" << M << ") {\n      if (pl_cta_tid() == 0) {\n"
                 << "        const int c[" << rank << "] = {" << coords << "};\n";
        if (layout_candidate(j))
          prefetch << "        if (PL_TMA_LAYOUT_" << J << " != 0) {\n"
                   << "          constexpr int box_cols = PL_TMA_LAYOUT_" << J << " >= 3 ? pl_layout_swizzle(PL_TMA_LAYOUT_" << J
                   << ") / 2 : 8;\n"
                   << "          for (int q = 0; q < " << row << " / box_cols; ++q) {\n"
                   << "            int cq[" << rank << "];\n"
                   << "            for (int d = 0; d < " << rank << "; ++d) cq[d] = c[d];\n"
                   << "            cq[0] += box_cols * q;\n"
                   << "            pl_tma_load<" << rank << ">(dst + q * box_cols * " << rows * itemsize(bm.array.dtype) << ", "
                   << map << ", cq, " << bar << ");\n"
                   << "          }\n        } else\n  ";
        prefetch << "        pl_tma_load<" << rank << ">(dst, " << map << ", c, " << bar << ");\n      }\n    } else\n#endif\n";
      }
      prefetch << "    if (((pl_u64)" << op << " & 15) == 0) {\n"
               << "      #pragma unroll 1\n"  // (unrolled, the copies were a third of the matmul's cold compile)
               << "      for (pl_i64 c = pl_cta_tid(); c < " << rows * chunks_per_row << "; c += pl_cta_nthreads()) {\n";
      // Destination chunk c holds the block's chunk (r, q) of the slot's layout (row-major: 0).
      const std::string R = std::to_string(rows), CPR = std::to_string(chunks_per_row);
      const std::string L = layout_candidate(j) ? "PL_SLOT_LAYOUT_" + J : "0";
      const std::string elem = layout_candidate(j)
                                   ? "pl_slot_elem<" + L + ">(e / " + std::to_string(row) + ", e % " + std::to_string(row) + ", " + R + ", " + CPR + ")"
                                   : "e";
      prefetch << "        pl_i64 r, q;\n        pl_slot_chunk<" << L << ">(c, " << R << ", " << CPR << ", r, q);\n"
               << "        pl_cp_async16(dst + 16 * c, (const pl_u8*)(src + "
               << (row_shape.empty() ? "0" : detail::offset_of(row_shape, row_strides, "r")) << ") + 16 * q);\n      }\n"
               << "    } else {\n"
               << "      #pragma unroll 1\n"
               << "      for (pl_i64 e = pl_cta_tid(); e < " << rows * row << "; e += pl_cta_nthreads()) ((" << T << "*)dst)["
               << elem << "] = src[" << detail::offset_of(shape, view_strides, "e") << "];\n"
               << "    }\n  }\n";
    }
    prefetch << "}\n\n";
  }
  // gpu::ClusterBarrier in clusters of several CTAs: pl_mbar_peers(i) is the mask of cluster ranks
  // an arrival on barrier i reaches from this CTA — the CTAs differing from it along at most one
  // of the barrier's collective axes (a rank is the row-major index of the cluster axes, which are
  // the innermost parallel axes: rank == point % cluster_ctas == %cluster_ctarank).
  std::string peers;
  if (gpu_kernel) {
    const KernelLayout& layout = *call.gpu_kernel;
    const std::vector<int64_t> cluster(grid.begin() + layout.num_grid_axes,
                                       grid.begin() + layout.num_grid_axes + layout.num_cluster_axes);
    for (int64_t c : cluster) out.cluster_ctas *= static_cast<int>(c);
    ctx.cluster_shape = cluster, ctx.first_cluster_axis = layout.num_grid_axes;
    if (out.cluster_ctas > 1 && opts.multicast) ctx.cluster_dims = cluster;
    std::vector<std::vector<int64_t>> coords(static_cast<size_t>(out.cluster_ctas));
    for (int r = 0; r < out.cluster_ctas; ++r) core::unravel_row_major(r, cluster, coords[static_cast<size_t>(r)]);
    std::string cases;
    for (size_t s = 0; s < gm.scratch_types.size() && out.cluster_ctas > 1; ++s) {
      if (gm.scratch_barrier_collective_axes[s].empty()) continue;
      std::vector<int> collective;  // among the cluster axes
      for (int axis : gm.scratch_barrier_collective_axes[s]) collective.push_back(axis - layout.num_grid_axes);
      std::vector<int64_t> masks;
      for (size_t r = 0; r < coords.size(); ++r) {
        int64_t mask = 0;
        for (size_t q = 0; q < coords.size(); ++q)
          if (core::cluster_barrier_peers(coords[r], coords[q], collective)) mask |= int64_t{1} << q;
        masks.push_back(mask);
      }
      const int64_t first = scratch_offsets[s], end = first + std::max<int64_t>(1, gm.scratch_types[s].size());
      cases += "  if (i >= " + std::to_string(first) + " && i < " + std::to_string(end) + ") return " +
               detail::table_entry(masks, "u", "pl_cluster_rank()") + ";  // scratch[" + std::to_string(s) + "]\n";
    }
    if (!cases.empty()) {
      ctx.cluster_barriers = true;
      peers = "// The cluster ranks an arrival on barrier i reaches (gpu::ClusterBarrier; 0: this CTA's only).\n"
              "PL_DEV pl_u32 pl_mbar_peers(pl_i64 i) {\n" + cases + "  return 0;\n}\n\n";
    }
  }
  // Up to here the arena is the CTA's (scratch, staging); tiles come after it, one range per group.
  const int64_t cta_bytes = arena.peak();

  // ---- One grid point: block indices, checks, block pointers, staging, the body.
  if (out.profile_space > 0) ctx.region_names = &out.region_names;
  ctx.tensor_core_dots = &out.tensor_core_dots;
  ctx.staged_tensor_core_dots = &out.staged_tensor_core_dots;
  ctx.bulk_stores = &out.bulk_stores;
  if (opts.tma) ctx.tensor_maps = &out.tensor_maps;
  ctx.group_threads = out.threads_per_cta / std::max(1, out.num_groups);
  ctx.num_groups = out.num_groups;
  ctx.scoped_layouts = &scoped_layouts;
  ctx.swizzled_own_scoped = &swizzled_own_scoped;
  // Register tiles: a gpu::kernel's in wgmma's layout, a pallas_call's in the blocked one.
  ctx.register_tiles = opts.register_tiles;
  ctx.blocked_tiles = !gpu_kernel;
  ctx.register_tile_budget = opts.register_tile_budget;
  ctx.register_tile_count = &out.register_tiles;
  ctx.register_dots = &out.register_dots;
  ctx.register_carries = &out.register_carries;
  ctx.register_captures = &out.register_captures;
  ctx.register_a_products = &out.register_a_products;
  if (gpu_kernel) {
    ctx.registers = detail::register_reallocation(k, thread_axis_name, out.num_groups);
    out.reallocates_registers = ctx.registers.emit;
  }
  Emitter em(k, ctx, 1);
  em.line("[[maybe_unused]] char* arena = cta_arena + (pl_i64)pl_group() * PL_GROUP_TILE_BYTES;");
  const size_t num_index = static_cast<size_t>(gm.num_index_operands);
  for (size_t i = 0; i < num_index; ++i) {
    const ir::Type& t = k.type(k.body.args[i]);
    em.bind_ref(k.body.args[i], RefInfo{"((" + ctype(t.dtype) + "*)p.op[" + std::to_string(i) + "])", t.dtype, t.shape,
                                        detail::contiguous_strides(t.shape)});
  }
  // A staged block whose window lies inside the array at a point (every dim blocked, no padding
  // below) is the array's own elements there: such points may skip staging and address the
  // arrays in place (`inside`, below), which is an edge-overhanging kernel's interior.
  std::vector<RefInfo> in_place(blocks.size()), staged_ref(blocks.size());
  std::string inside;
  bool interior_fast_path = !gpu_kernel && !written_input_staged;
  for (size_t j = 0; j < blocks.size(); ++j) {
    const BlockMapping& bm = gm.block_mappings[j];
    const Block& b = blocks[j];
    const size_t rank = bm.block_shape.size();
    if (slot_offset[j] >= 0) {
      // Pipelined: this step's slot of the ring, the block contiguous (pl_prefetch filled it; the
      // block is known to lie inside the array, so there is nothing to check here).
      const std::string T = ctype(bm.array.dtype);
      RefInfo r{"blk" + std::to_string(j), bm.array.dtype, bm.block_ref_type.shape,
                detail::contiguous_strides(bm.block_ref_type.shape)};
      if (layout_candidate(static_cast<int>(j))) r.slot_input = static_cast<int>(j);
      em.line(T + "* " + r.ptr + " = (" + T + "*)(" + slot_pointer(j, "pl_slot") + ");");
      em.bind_ref(k.body.args[num_index + j], r);
      em.set_memory_group(k.body.args[num_index + j], static_cast<int>(j));
      continue;
    }
    const std::string bi = "bi" + std::to_string(j), st = "st" + std::to_string(j);
    em.line("pl_i64 " + bi + "[" + std::to_string(std::max<size_t>(1, rank)) + "];");
    em.line("if (!pl_index_map_" + std::to_string(j) + "(p, g, G, " + bi + ")) return false;");
    em.line("pl_i64 " + st + "[" + std::to_string(std::max<size_t>(1, rank)) + "];");
    // The interpreters' check: the block must lie inside the padded array (left out for the
    // dims whose index range over the grid is known to be inside).
    std::string cond;
    for (size_t d = 0; d < rank; ++d) {
      const BlockDim& bd = bm.block_shape[d];
      const int64_t size = core::block_extent(bm, d);
      em.line(st + "[" + std::to_string(d) + "] = " + block_start(bd, bi + "[" + std::to_string(d) + "]") + ";");
      if (grid_keeps_blocks_within(bm, d, grid, b.padded[d])) continue;
      cond += std::string(cond.empty() ? "" : " || ") + st + "[" + std::to_string(d) + "] < 0 || " + st + "[" +
              std::to_string(d) + "] + " + std::to_string(size) + " > " + std::to_string(b.padded[d]);
    }
    if (!cond.empty()) {
      const int site = static_cast<int>(out.error_sites.size());
      out.error_sites.push_back({ErrorSite::Kind::BlockIndex, static_cast<int>(j), "", bm.index_map.loc});
      std::vector<std::string> indices;
      for (size_t d = 0; d < rank; ++d) indices.push_back(bi + "[" + std::to_string(d) + "]");
      em.line("if (" + cond + ") " + em.record_failure(site, indices));
    }
    const std::string T = ctype(bm.array.dtype);
    const std::string base = "((" + T + "*)p.op[" + std::to_string(num_index + j) + "])";
    const ir::Type& rt = bm.block_ref_type;
    // The block in place in its array: a strided view from the block's start.
    auto declare_in_place = [&](const std::string& name) {
      const auto [off, strides] = in_place_layout(bm, b.array_strides, [&](size_t d) { return st + "[" + std::to_string(d) + "]"; });
      em.line(T + "* " + name + " = " + base + (off.empty() ? "" : " + (" + off + ")") + ";");
      RefInfo r{name, bm.array.dtype, rt.shape, strides};
      r.operand = static_cast<int>(num_index + j);
      r.operand_shape = bm.array.shape;
      return r;
    };
    RefInfo r;
    if (!b.staged) {
      r = declare_in_place("blk" + std::to_string(j));
    } else {
      r = RefInfo{"blk" + std::to_string(j), bm.array.dtype, rt.shape, detail::contiguous_strides(rt.shape)};
      em.line(T + "* " + r.ptr + " = (" + T + "*)(cta_arena + " + std::to_string(b.offset) + ");");
      staged_ref[j] = r;
      in_place[j] = declare_in_place(r.ptr + "_in_place");
      for (size_t d = 0; d < rank; ++d) {
        const BlockDim& bd = bm.block_shape[d];
        if (!(bd.is_blocked() || bd.is_squeezed()) || b.low[d] != 0) interior_fast_path = false;
        if (grid_keeps_blocks_within(bm, d, grid, bm.array.shape[d])) continue;  // no run-time test
        inside += std::string(inside.empty() ? "" : " && ") + st + "[" + std::to_string(d) + "] + " +
                  std::to_string(core::block_extent(bm, d)) + " <= " + std::to_string(bm.array.shape[d]);
      }
    }
    em.bind_ref(k.body.args[num_index + j], r);
    // Each operand's blocks are memory of their own (distinct allocations, or distinct arena
    // ranges when staged) but for an output aliased to an input, which shares the input's.
    const auto aliased = input_of_output.find(static_cast<int>(j) - gm.num_inputs);
    em.set_memory_group(k.body.args[num_index + j],
                        aliased != input_of_output.end() ? aliased->second - gm.num_index_operands : static_cast<int>(j));
  }
  // Staging in: the valid part from the array, the rest the uninitialized value. Outputs too,
  // so a block revisited along a sequential axis sees what the previous points wrote.
  auto staged_loop = [&](size_t j, bool in) {
    const BlockMapping& bm = gm.block_mappings[j];
    const Block& b = blocks[j];
    const size_t rank = bm.block_shape.size();
    const std::string st = "st" + std::to_string(j), blk = "blk" + std::to_string(j);
    const std::string base = "((" + ctype(bm.array.dtype) + "*)p.op[" + std::to_string(num_index + j) + "])";
    // Block-local index of each array dim (squeezed: 0), then the array coordinate.
    const std::vector<std::string> kernel_idx = detail::index_exprs(bm.block_ref_type.shape, "e");
    std::string valid = "true", off;
    std::vector<std::string> coords;
    size_t kd = 0;
    for (size_t d = 0; d < rank; ++d) {
      const std::string local = bm.block_shape[d].is_squeezed() ? "0" : kernel_idx[kd++];
      const std::string c = "c" + std::to_string(d);
      coords.push_back("pl_i64 " + c + " = " + st + "[" + std::to_string(d) + "] - " + std::to_string(b.low[d]) + " + " + local + ";");
      valid += " && " + local + " < " + std::to_string(core::block_extent(bm, d)) + " && " + c + " >= 0 && " + c +
               " < " + std::to_string(bm.array.shape[d]);
      off += (off.empty() ? "" : " + ") + c + " * " + std::to_string(b.array_strides[d]);
    }
    if (off.empty()) off = "0";
    auto prelude = [&] {
      for (const std::string& c : coords) em.line(c);
    };
    const int64_t n = std::max<int64_t>(1, bm.block_ref_type.size());
    const std::string T = ctype(bm.array.dtype);
    if (in)
      em.batched_store_loop(n, T, "(" + valid + ") ? " + base + "[" + off + "] : " + detail::uninitialized_literal(bm.array.dtype), "",
                            blk + "[e]", prelude);
    else
      em.batched_store_loop(n, T, blk + "[e]", valid, base + "[" + off + "]", prelude);
  };
  // An output block visited once (no sequential axes) and not aliased to an input holds nothing
  // the kernel may rely on: it starts as the uninitialized value, as in the interpreter, without
  // reading the array (a third of the edge-block traffic of an elementwise kernel).
  auto stage_in = [&] {
    for (size_t j = 0; j < blocks.size(); ++j) {
      if (!blocks[j].staged) continue;
      const int o = static_cast<int>(j) - gm.num_inputs;
      if (o >= 0 && out.sequential_axes.empty() && !input_of_output.count(o)) {
        const BlockMapping& bm = gm.block_mappings[j];
        em.fill_uninitialized("blk" + std::to_string(j), bm.array.dtype, std::max<int64_t>(1, bm.block_ref_type.size()));
      } else {
        staged_loop(j, true);
      }
    }
  };
  std::string smem_layouts;  // PL_SMEM_SWIZZLED_s, and PL_SMEM_SWIZZLED_Vv of a scope's array v
  for (const auto& [op, layout] : scoped_layouts)
    for (size_t i = 0; i < layout.swizzled.size(); ++i)
      if (!layout.swizzled[i].empty()) {
        RefInfo r{"", k.type(op->regions[0].args[i]).dtype, k.type(op->regions[0].args[i]).shape, {}};
        smem_layouts += make_swizzled(r, layout.swizzled[i]);
      }
  for (ir::ValueId v : swizzled_own_scoped) {
    RefInfo r{"", k.type(v).dtype, k.type(v).shape, {}};
    smem_layouts += make_swizzled(r, detail::scoped_swizzle_macro(v));
  }
  for (size_t s = 0; s < gm.scratch_types.size(); ++s) {
    const ir::Type& t = gm.scratch_types[s];
    const std::string ptr = t.dtype == DType::GpuBarrier  ? "(pl_mbar + " + std::to_string(scratch_offsets[s]) + ")"
                            : gm.scratch_grid_wide[s]     ? "((pl_i32*)(p.workspace + " + std::to_string(scratch_offsets[s]) + "))"
                            : in_registers(s)             ? acc_memory(s)
                                                          : "((" + ctype(t.dtype) + "*)(cta_arena + " +
                                                                std::to_string(scratch_offsets[s]) + "))";
    RefInfo ref{ptr, t.dtype, t.shape, detail::contiguous_strides(t.shape)};
    // Swizzled by its rows' bytes where wgmma runs (the sm_90a code, and host emulation);
    // row-major (0) elsewhere.
    if (is_swizzled(s)) smem_layouts += make_swizzled(ref, "PL_SMEM_SWIZZLED_" + std::to_string(s));
    em.bind_ref(k.body.args[first_scratch + s], ref);
    // A scratch buffer is memory of its own too, but for a Union's members, which overlap
    // (negative groups: not an operand's block).
    if (gm.scratch_unions[s].union_index < 0)
      em.set_memory_group(k.body.args[first_scratch + s], -1 - static_cast<int>(s));
  }
  // The ACCs in registers (register_accs): a PlAccRegs each, per Pallas thread.
  std::string kernel_acc_decls;
  for (size_t s = 0; s < gm.scratch_types.size(); ++s) {
    const auto it = register_accs.find(k.body.args[first_scratch + s]);
    if (it == register_accs.end()) continue;
    detail::AccumulatorRegisters a = it->second;
    a.var = "pl_acc_" + std::to_string(s);
    em.bind_kernel_accumulator(it->first, a);
    out.accumulators_in_registers.push_back(static_cast<int>(s));
    kernel_acc_decls += "  PlAccRegs<" + std::to_string(a.nc) + ", " + std::to_string(a.rounds) + "> " + a.var + ";\n  pl_acc_start(" +
                        a.var + ", " + std::to_string(a.m) + ", " + std::to_string(a.n) + ");\n";
  }
  // The register accumulator (Emitter::choose_register_accumulator), among the f32 matrices of
  // scratch that nothing overlaps; pallas_call only (a gpu::kernel's are above).
  std::set<ir::ValueId> accumulator_candidates;
  for (size_t s = 0; s < gm.scratch_types.size() && !gpu_kernel; ++s) {
    const ir::Type& t = gm.scratch_types[s];
    if (t.dtype == DType::F32 && t.shape.size() == 2 && gm.scratch_unions[s].union_index < 0)
      accumulator_candidates.insert(k.body.args[first_scratch + s]);
  }
  const Emitter::RegisterAccumulator acc_regs = em.choose_register_accumulator(k.body, accumulator_candidates);
  std::string acc_type, acc_scratch;
  if (acc_regs.ref >= 0) {
    acc_type = "PlAccRegs<" + std::to_string(acc_regs.regs.nc) + ", " + std::to_string(acc_regs.regs.rounds) + ">";
    for (size_t s = 0; s < gm.scratch_types.size(); ++s)
      if (k.body.args[first_scratch + s] == acc_regs.ref) {
        out.register_accumulator = static_cast<int>(s);
        acc_scratch = "(float*)(arena + " + std::to_string(scratch_offsets[s]) + ")";
      }
  }
  auto staged_body = [&] {
    // A step of the pipeline starts just after the loop's CTA barrier (below), and nothing the
    // point's start computes (block pointers, index maps) touches memory.
    if (out.pipeline_depth > 0) em.assume_synced();
    stage_in();
    em.barrier();
    em.emit_region(k.body);
    em.barrier();
    for (size_t j = static_cast<size_t>(gm.num_inputs); j < blocks.size(); ++j)
      if (blocks[j].staged) staged_loop(j, false);
    em.barrier();
  };
  bool any_staged = false;
  for (const Block& b : blocks) any_staged = any_staged || b.staged;
  auto in_place_body = [&] {
    for (size_t j = 0; j < blocks.size(); ++j)
      if (blocks[j].staged) em.bind_ref(k.body.args[num_index + j], in_place[j]);
    em.emit_region(k.body);
    em.barrier();
  };
  if (interior_fast_path && any_staged && inside.empty()) {
    // Every point's blocks lie inside their arrays (the grid never reaches the ragged edge).
    em.barrier();
    in_place_body();
  } else if (interior_fast_path && any_staged) {
    // The body twice: in place where every staged block lies inside its array (all but the edge
    // points of a grid that overhangs), staged at the edges. The condition is the same for the
    // whole CTA, so the barriers inside either branch are reached by all of its threads.
    em.barrier();
    em.open_block("if (" + inside + ")");
    in_place_body();
    em.else_block();
    for (size_t j = 0; j < blocks.size(); ++j)
      if (blocks[j].staged) em.bind_ref(k.body.args[num_index + j], staged_ref[j]);
    staged_body();
    em.close_loop();
  } else {
    staged_body();
  }
  em.line("return true;");
  body << "}\n";
  // The slots' layouts, now that the body has made every access to them (canonical ones only
  // where wgmma runs: the mma.sync path and the CUDA-core loops read row-major blocks).
  std::string slot_layouts;
  bool swizzled_slots = false;
  for (int j : out.pipelined_inputs) {
    if (!layout_candidate(j)) continue;
    const int layout = canonical_layout(em, j);
    if (layout > 0) out.tensor_core_slots.push_back(j);
    swizzled_slots = swizzled_slots || layout >= 3;
    slot_layouts += "#define PL_SLOT_LAYOUT_" + std::to_string(j) + " (PL_HAS_WGMMA ? " + std::to_string(layout) + " : 0)\n";
  }
  // (Whole KiB when a Pallas thread's own scoped array is swizzled: every group's copy of it then
  // starts on a 1024-byte boundary, as group 0's does.)
  int64_t group_tile_bytes = out.num_groups > 1 ? arena.peak() - cta_bytes : 0;
  if (!swizzled_own_scoped.empty()) group_tile_bytes = (group_tile_bytes + 1023) / 1024 * 1024;
  out.arena_bytes = std::max<int64_t>(16, arena.peak() + (out.num_groups - 1) * group_tile_bytes);
  out.arena_bytes = (out.arena_bytes + arena_align - 1) / arena_align * arena_align;  // (each CTA's)
  // Scratch is fresh for every CTA of a gpu::kernel (as in the interpreter), and barriers must
  // start their phases with the phase bits each thread keeps: both are set up per parallel point.
  const bool fresh_scratch_per_point = gpu_kernel || out.num_barriers > 0;
  // The ring comes first: the arena goes to global memory when both do not fit. A gpu::kernel's
  // arena holds its SMEM scratch, which its bulk and TMA copies and wgmma address as shared
  // memory: it stays there up to the device's limit, and past it the kernel cannot run.
  const int64_t static_bytes = out.pipeline_slot_bytes > 0 || !swizzled_tiles.empty() ? static_shared_reserve(out.num_barriers)
                                                                                       : static_shared_bytes(out.num_barriers);
  const int64_t align = GeneratedKernel::kSlotAlign;
  out.arena_in_shared = out.arena_bytes <= opts.max_shared_arena_bytes &&
                        (out.pipeline_slot_bytes == 0 || (out.arena_bytes + align - 1) / align * align + out.pipeline_slot_bytes +
                                                                 staging_reserve + static_bytes <=
                                                             opts.max_shared_bytes);
  if (gpu_kernel) {
    // (Swizzled tiles: dynamic shared memory starts on a 1024-byte boundary after the barriers.)
    const int64_t barrier_bytes = swizzled_tiles.empty() ? static_shared_bytes(out.num_barriers) : static_shared_reserve(out.num_barriers);
    if (out.arena_bytes + barrier_bytes > opts.max_shared_bytes && opts.register_tiles &&
        opts.register_tile_budget < CodegenOptions::kNoRegisterBudget) {
      // The tiles the register budget sent to the arena may be what does not fit: registers
      // (spilling, maybe) rather than no kernel.
      CodegenOptions unbudgeted = opts;
      unbudgeted.register_tile_budget = CodegenOptions::kNoRegisterBudget;
      return generate_cuda(call, grid, unbudgeted);
    }
    if (out.arena_bytes + barrier_bytes > opts.max_shared_bytes && !swizzled_tiles.empty()) {
      // The swizzle's KiB alignment may be what does not fit: the kernel runs unswizzled then.
      CodegenOptions unswizzled = opts;
      unswizzled.swizzle = false;
      return generate_cuda(call, grid, unswizzled);
    }
    if (out.arena_bytes + barrier_bytes > opts.max_shared_bytes)
      throw Error("gpu::kernel exceeds available shared memory: its SMEM scratch, run_scoped buffers and the tiles of its body need " +
                      std::to_string(out.arena_bytes) + " bytes (and " + std::to_string(barrier_bytes) +
                      " of barriers), a CTA may use at most " + std::to_string(opts.max_shared_bytes) +
                      "; shrink the SMEM scratch or the arrays the body computes (smaller tiles)",
                  call.kernel.loc);
    out.arena_in_shared = true;
  }
  // wgmma stages its operands in shared memory after the arena (dynamic shared memory), a stage
  // per warpgroup, when there is room beside the arena and the barriers; else sm_90a takes the
  // mma.sync path too.
  if (out.tensor_core_dots > 0 && out.threads_per_cta % 128 == 0) {
    const int64_t staging = out.staged_tensor_core_dots > 0 ? wgmma_stage_bytes() * (out.threads_per_cta / 128) : 0;
    const int64_t used = static_bytes + out.wgmma_staging_offset();  // (the arena, rounded up)
    if (used + staging <= opts.max_shared_bytes) out.uses_wgmma = true, out.wgmma_staging_bytes = staging;
  }
  // The TMA inputs' maps. A slot's layout is canonical where wgmma runs — on the devices the
  // host encodes maps for (Hopper, sm_90a), where PL_HAS_WGMMA is whether there is wgmma staging
  // — and its boxes follow it: all rows x 8 columns for a no-swizzle canonical layout, x a panel
  // for a swizzled one, else the block. The kernel checks the two agree (PL_TMA_LAYOUT_j
  // against PL_SLOT_LAYOUT_j) before using a map.
  for (int j : out.tma_inputs) {
    const int layout = layout_candidate(j) && out.uses_wgmma ? canonical_layout(em, j) : 0;
    const int swizzle = swizzle_of(layout);
    out.tensor_maps[static_cast<size_t>(tma_map_of(j))] = *block_box(j, swizzle > 0 ? swizzle / 2 : layout > 0 ? 8 : 0, swizzle);
    slot_layouts += "#define PL_TMA_LAYOUT_" + std::to_string(j) + " " + std::to_string(layout) + "\n";
  }

  // ---- The translation unit.
  std::ostringstream src;
  auto axes = [](const std::vector<int>& a) { return core::tuple_string(std::vector<int64_t>(a.begin(), a.end())); };
  src << "// Generated by Pallas in C++ for pallas_call \"" << call.name << "\" (grid " << core::tuple_string(grid)
      << "; parallel axes " << axes(out.parallel_axes) << ", sequential axes " << axes(out.sequential_axes) << "; arena "
      << out.arena_bytes << " bytes per CTA in " << (out.arena_in_shared ? "shared" : "global") << " memory).\n"
      << "// Compile: nvcc -cubin -arch=sm_90a FILE.cu   (or NVRTC; no include path needed)\n";
  src << "#define PL_NUM_GROUPS " << out.num_groups << "\n";
  src << "#define PL_CTA_THREADS " << out.threads_per_cta << "\n";
  src << "#define PL_ARENA_IN_SHARED " << (out.arena_in_shared ? 1 : 0) << "\n";
  const bool swizzled_smem = swizzled_slots || !swizzled_tiles.empty();
  if (swizzled_smem) src << "#define PL_SMEM_ALIGN 1024\n";  // (codegen.h's static_shared_reserve)
  // Host emulation keeps a gpu::kernel's arena (its SMEM scratch) in the emulated shared memory,
  // where wgmma's descriptors can address it.
  if (gpu_kernel) src << "#define PL_HOST_ARENA_SPAN " << (out.arena_bytes + 1023) / 1024 * 1024 << "\n";
  if (out.profile_space > 0) src << "#define PL_PROF_SPACE " << out.profile_space << "\n";
  if (opts.approx_math) src << "#define PL_APPROX_MATH 1\n";
  if (out.num_barriers > 0) src << "#define PL_NUM_MBARRIERS " << out.num_barriers << "\n";
  if (out.cluster_ctas > 1) src << "#define PL_CLUSTER_CTAS " << out.cluster_ctas << "\n";
  out.host_ctas = out.cluster_ctas;
  if (out.co_resident()) {
    out.host_ctas = parallel_points(out, grid);
    src << "#define PL_HOST_CTAS " << out.host_ctas << "\n";
  }
  if (!opts.async_wgmma) src << "#define PL_WGMMA_ASYNC 0\n";
  if (out.register_a_products > 0) src << "#define PL_WGMMA_RS 1\n";  // (wgmma with a in registers)
  for (const auto& [ref, a] : register_accs)
    if (a.nc > 128) {
      src << "#define PL_WGMMA_WIDE 1\n";  // (m64n256k16: the runtime's widest wgmma, parsed only then)
      break;
    }
  // (No staging, PL_WGMMA_STAGES 0: every product reads both operands in place.)
  if (out.uses_wgmma)
    src << "#define PL_WGMMA_STAGES " << out.wgmma_staging_bytes / wgmma_stage_bytes() << "\n#define PL_WG_KC "
        << kWgmmaStepK << "\n#define PL_WG_STAGE_BYTES " << (out.wgmma_staging_bytes > 0 ? wgmma_stage_bytes() : 0)
        << "\n#define PL_WGMMA_STAGING_OFFSET "
        << out.wgmma_staging_offset() << "\n";
  if (out.pipeline_slot_bytes > 0)
    src << "#define PL_SLOT_BYTES " << out.pipeline_slot_bytes << "\n#define PL_SLOTS_OFFSET " << out.slots_offset() << "\n";
  if (!out.tma_inputs.empty()) src << "#define PL_RING_SLOTS " << out.pipeline_slots << "\n";
  src << device_runtime_source();
  src << "\nstruct PlParams {\n  void* op[" << std::max(1, num_operands) << "];\n  char* workspace;\n  pl_i64* err;\n  pl_u64* prof;\n  pl_i64 grid["
      << G << "];\n  pl_i64 num_points;\n";
  if (!out.tensor_maps.empty())
    src << "  pl_u64 tma_ok;  // bit m: tmap[m] is encoded\n  PlTensorMap tmap[" << out.tensor_maps.size() << "];\n";
  src << "};\n\n";
  src << "\n#define PL_GROUP_TILE_BYTES " << group_tile_bytes << "LL\n";
  // (The signature last: the body chose the register accumulator.)
  src << peers << maps.str() << slot_layouts << smem_layouts << prefetch.str()
      << "PL_DEV bool pl_grid_point(const PlParams& p, const pl_i64* g, const pl_i64* G, char* cta_arena, "
         "[[maybe_unused]] pl_u32* pl_phase, [[maybe_unused]] pl_u64* pl_prof, [[maybe_unused]] int pl_slot"
      << (acc_type.empty() ? "" : ", " + acc_type + "& pl_acc") << ") {\n"
      << kernel_acc_decls << body.str() << "\n";
  // A run-time check of the generated code itself (a fault of the backend, named by the call):
  // its error site's number.
  auto backend_fault_site = [&](ErrorSite::Kind kind) {
    ErrorSite e;
    e.kind = kind;
    e.op_name = call.name;
    e.loc = call.kernel.loc;
    out.error_sites.push_back(e);
    return static_cast<int>(out.error_sites.size()) - 1;
  };
  // The CTA: decode its parallel point, walk the sequential axes in order.
  src << "PL_DEV void pl_cta(const PlParams& p, pl_i64 point, char* arena, [[maybe_unused]] pl_u32& pl_ring_phase) {\n";
  // The grid sizes as constants (p.grid holds the same): the decode of the point, the loops of the
  // sequential axes and num_programs fold, at run time and in NVVM (docs/PERFORMANCE.md, stop 19).
  std::string sizes;
  for (int64_t n : grid) sizes += (sizes.empty() ? "" : ", ") + std::to_string(n);
  src << "  const pl_i64 G[" << G << "] = {" << (sizes.empty() ? "1" : sizes) << "};\n  pl_i64 g[" << G
      << "] = {0};\n  pl_i64 rest = point;\n";
  src << "  pl_u32 pl_phase[" << std::max<int64_t>(1, (out.num_barriers + 31) / 32) << "] = {0};\n";
  if (thread_axis >= 0) src << "  g[" << thread_axis << "] = pl_group();\n";
  if (!acc_type.empty()) src << "  " << acc_type << " pl_acc;\n  pl_acc.dirty = 0;\n";
  const std::string acc_arg = acc_type.empty() ? "" : ", pl_acc";
  // Leaving a point early (a failed block index): no wgmma may still be running.
  const std::string drain = acc_type.empty() ? "" : "pl_acc_drain(pl_acc); ";
  // This Pallas thread's profile slot for the point (see pl_prof_record).
  if (out.profile_space > 0)
    src << "  pl_u64* pl_prof = p.prof + (point * PL_NUM_GROUPS + pl_group()) * (1 + 2 * PL_PROF_SPACE);\n";
  else
    src << "  pl_u64* pl_prof = 0;\n";
  for (auto it = out.parallel_axes.rbegin(); it != out.parallel_axes.rend(); ++it)
    src << "  g[" << *it << "] = rest % G[" << *it << "]; rest /= G[" << *it << "];\n";
  std::string indent = "  ";
  const size_t plain_loops = out.sequential_axes.size() - (out.pipeline_depth > 0 ? 1 : 0);
  for (size_t i = 0; i < plain_loops; ++i) {
    const int a = out.sequential_axes[i];
    src << indent << "for (g[" << a << "] = 0; g[" << a << "] < G[" << a << "]; ++g[" << a << "]) {\n";
    indent += "  ";
  }
  if (out.pipeline_depth > 0) {
    // The innermost sequential axis with its ring of `slots` slots: iteration s issues the copies
    // of step s into slot s % slots, then runs step k = s - (depth - 1) once its copies (the
    // oldest group in flight) have landed. The slot refilled was last read by step s - slots,
    // which ran in iteration s + depth - 1 - slots: with slots == depth the iteration just
    // before (every thread is done with it: the barrier after each step); with slots == depth +
    // 1 the one before that, so a step's wgmma left running into the next step (pl_wgmma_block's
    // ASYNC) has been retired by that next step's wait before its slots are refilled. A group is
    // committed every iteration, empty past the last step, so the count holds. One call site
    // each for pl_prefetch and pl_grid_point (each is inlined: two would double their share of
    // the cold compile).
    const std::string a = std::to_string(out.sequential_axes.back()), D = std::to_string(out.pipeline_depth);
    const std::string S = std::to_string(out.pipeline_slots);
    const std::string ga = "g[" + a + "]", Ga = "G[" + a + "]";
    // With TMA inputs every thread also waits for the step's slot barrier; a point left early
    // first waits for the copies still landing (the steps after this one already issued).
    std::string ring_wait, ring_drain;
    if (!out.tma_inputs.empty()) {
      const int site = backend_fault_site(ErrorSite::Kind::PipelineWait);
      std::string ids;
      for (int d = 0; d < G; ++d) ids += "g[" + std::to_string(d) + "], ";
      // Failing (another CTA failed, or the wait limit), the step's copies and the later ones
      // already issued are still landing: the point waits for them before it leaves — from this
      // step where this thread's own wait did not see it land (the threads' phases stay in step
      // with the barriers) — and for every warpgroup's wgmma, so that nothing writes the slots
      // of the next point's copies or runs on after the CTA has left.
      const std::string last = "s < " + Ga + " ? s : " + Ga + " - 1";
      ring_wait = indent + "  { const bool pl_landed = pl_ring_wait(p.err, pl_ring_phase, (int)(" + ga + " % " + S +
                  "));\n" + indent + "    if (!pl_group_all(pl_landed)) { pl_i64 ev[] = {" + ids +
                  "0}; pl_fail(p.err, " + std::to_string(site) + ", ev, " + std::to_string(G) +
                  "); pl_cp_async_wait<0>(); pl_ring_drain(pl_ring_phase, " + ga + " + (pl_landed ? 1 : 0), " + last +
                  "); " + drain + "pl_cta_sync(); return; } }\n";
      ring_drain = "pl_ring_drain(pl_ring_phase, " + ga + " + 1, " + last + "); ";
    }
    // The step's barrier is ring_wait's vote (pl_group_all: a barrier of the CTA, pallas_call's
    // only group) or a pl_cta_sync; pl_grid_point ends with one (its emitter's last barrier), so
    // the next step's copies cannot overwrite a slot a thread still reads.
    PALLAS_INTERNAL_CHECK(out.num_groups == 1, "a pipelined pallas_call with several thread groups");
    // A run of the axis after another (an outer sequential axis): the previous run's last wgmma
    // into the register accumulator may still read its slots — ring or resident — which this
    // run's first copies refill: every warpgroup waits for its own, then the CTA syncs before
    // any thread issues a copy.
    if (!acc_type.empty() && plain_loops > 0) src << indent << drain << "pl_cta_sync();\n";
    src << indent << "for (pl_i64 s = 0; s < " << Ga << " + " << D << " - 1; ++s) {\n"
        << indent << "  if (s < " << Ga << ") { " << ga << " = s; pl_prefetch(p, g, G, (int)(s % " << S << ")); }\n"
        << indent << "  pl_cp_async_commit();\n"
        << indent << "  if (s < " << D << " - 1) continue;\n"
        << indent << "  " << ga << " = s - (" << D << " - 1);\n"
        << indent << "  pl_cp_async_wait<" << D << " - 1>();\n"
        << (out.tensor_core_slots.empty() ? "" : indent + "  pl_fence_proxy_async();  // (for the in-place wgmma)\n")
        << (ring_wait.empty() ? indent + "  pl_cta_sync();\n" : ring_wait)
        << indent << "  if (!pl_grid_point(p, g, G, arena, pl_phase, pl_prof, (int)(" << ga << " % " << S << ")" << acc_arg
        << ")) { pl_cp_async_wait<0>(); " << ring_drain << drain << "pl_cta_sync(); return; }\n"
        << indent << "}\n";
  } else {
    src << indent << "if (!pl_grid_point(p, g, G, arena, pl_phase, pl_prof, 0" << acc_arg << ")) { " << drain
        << "return; }\n";
  }
  for (size_t i = 0; i < plain_loops; ++i) {
    indent.resize(indent.size() - 2);
    src << indent << "}\n";
  }
  // The scratch holds the accumulator when the point is done, as it would without registers.
  if (!acc_type.empty()) src << "  " << acc_regs.flush(acc_scratch) << "\n";
  src << "}\n\n";
  // Scratch starts as the uninitialized value, once per CTA (it persists across its points).
  src << "PL_DEV void pl_init_scratch([[maybe_unused]] const PlParams& p, [[maybe_unused]] char* arena) {\n";
  for (size_t s = 0; s < gm.scratch_types.size(); ++s) {
    const ir::Type& t = gm.scratch_types[s];
    if (t.dtype == DType::GpuBarrier) {
      src << "  if (pl_cta_tid() == 0) for (int i = 0; i < " << std::max<int64_t>(1, t.size()) << "; ++i) pl_mbar_init(pl_mbar + "
          << scratch_offsets[s] << " + i, " << gm.scratch_barrier_arrivals.at(s) << ");\n";
      continue;
    }
    if (gm.scratch_grid_wide[s]) continue;  // zeroed before the launch, for the whole grid
    std::string where = "((" + ctype(t.dtype) + "*)(arena + " + std::to_string(scratch_offsets[s]) + "))";
    if (in_registers(s)) {  // (pl_acc_start: in the registers where they hold it)
      const detail::AccumulatorRegisters& a = register_accs.at(k.body.args[first_scratch + s]);
      src << "  if (!pl_acc_in_registers<" << a.nc << ", " << a.rounds << ">(" << a.m << ", " << a.n << "))\n  ";
      where = acc_memory(s);
    }
    src << "  for (pl_i64 e = pl_cta_tid(); e < " << t.size() << "; e += pl_cta_nthreads()) " << where << "[e] = "
        << detail::uninitialized_literal(t.dtype) << ";\n";
  }
  if (!scoped_barriers.empty()) {
    src << "  if (pl_cta_tid() == 0) {  // run_scoped barriers (again at each entry of their scope)\n";
    for (const auto& [index, arrivals] : scoped_barriers)
      src << "    pl_mbar_init(pl_mbar + " << index << ", " << arrivals << ");\n";
    src << "  }\n";
  }
  // The fill above is ordered before what the async proxy does to the same bytes next — copies
  // into SMEM (completing on barriers; a peer's multicast too) and wgmma reads — by each writer's
  // proxy fence before the sync (a fence after the barrier by another thread would not order it).
  if (out.num_barriers > 0 || out.uses_wgmma) src << "  pl_fence_before_bulk_copy();\n";
  // The barriers' init is fenced for the copies completing on them (the async proxy) and, with
  // clusters, for peers: no CTA may arrive on a peer's barriers before the peer initialized them.
  if (out.num_barriers > 0) src << "  if (pl_cta_tid() == 0) pl_fence_mbar_init();\n";
  src << (out.cluster_ctas > 1 ? "  pl_cluster_sync();\n}\n\n" : "  pl_cta_sync();\n}\n\n");
  // After a point whose scratch is fresh: every thread is done with it before it is set up again
  // (with clusters: every thread of the cluster, which may still arrive on this CTA's barriers).
  // (Bulk copies to global memory still reading the scratch are waited for first.)
  // (After a failed point, copies may still be landing on the barriers: pl_mbar_settle.)
  src << "PL_DEV void pl_end_scratch([[maybe_unused]] const PlParams& p) {\n"
      << (out.bulk_stores > 0 ? "  if (pl_tid() == 0) { pl_bulk_store_commit(); pl_bulk_store_wait<0, false>(); }\n" : "") << "  "
      << (out.cluster_ctas > 1 ? "pl_cluster_sync" : "pl_cta_sync") << "();\n";
  if (out.num_barriers > 0)
    src << "  if (pl_cta_tid() == 0) {\n    pl_mbar_settle(pl_mbar, " << out.num_barriers << ", p.err);\n"
        << "    for (int i = 0; i < " << out.num_barriers << "; ++i) pl_mbar_inval(pl_mbar + i);\n  }\n"
        << "  pl_cta_sync();\n";
  src << "}\n\n";
  const std::string point_body = fresh_scratch_per_point
                                     ? "{ pl_init_scratch(p, arena); pl_cta(p, point, arena, ring_phase); pl_end_scratch(p); }"
                                     : "pl_cta(p, point, arena, ring_phase);";
  // The ring's barriers (TMA inputs) and the parities each thread awaits next: per CTA, not per point.
  // (Indented by the caller: the second line takes `indent` too.)
  auto ring_setup = [&](const std::string& indent) {
    return indent + "pl_u32 ring_phase = 0;\n" + (out.tma_inputs.empty() ? "" : indent + "pl_ring_init();\n");
  };
  // The workspace holds the semaphores first, then the CTAs' arenas.
  const std::string arena_after_semaphores = out.co_resident() ? std::to_string(out.arena_offset()) + " + " : "";
  src << "#if !PL_HOST_EMULATION\n";
  if (out.arena_in_shared) src << "extern __shared__ __align__(PL_SMEM_ALIGN) char pl_smem[];\n";
  // (__grid_constant__: the parameters stay where the launch put them, so the TMA unit can read
  // the tensor maps there.)
  // (With a minimum of one CTA per SM ptxas knows the registers a thread has at the entry, which
  // setmaxnreg needs: it ignores it otherwise, its note C7508.)
  src << "extern \"C\" __global__ void __launch_bounds__(" << out.threads_per_cta << (out.reallocates_registers ? ", 1" : "")
      << ") " << out.entry
      << "(const __grid_constant__ PlParams p) {\n";
  // The runtime takes the block size as the constant PL_CTA_THREADS; a hand launch with another
  // (of this source compiled by nvcc) stops here instead of computing garbage.
  src << "  if (blockDim.x != PL_CTA_THREADS || blockDim.y * blockDim.z != 1) __trap();\n";
  if (!out.tensor_maps.empty()) src << "  pl_prefetch_tensor_maps(p.tmap, " << out.tensor_maps.size() << ", p.tma_ok);\n";
  if (swizzled_smem) {
    // The swizzle's pattern comes from the address bits: the slots' and the swizzled tiles'
    // offsets are multiples of 1024 from a base that __align__(PL_SMEM_ALIGN) should put on a
    // 1024-byte boundary; if it does not, the kernel stops rather than reading scrambled blocks.
    const int site = backend_fault_site(ErrorSite::Kind::SlotAlignment);
    std::string swizzled;
    for (int j : out.tensor_core_slots)
      swizzled += (swizzled.empty() ? "" : " || ") + std::string("PL_SLOT_LAYOUT_") + std::to_string(j) + " >= 3";
    for (size_t s = 0; s < gm.scratch_types.size(); ++s)
      if (is_swizzled(s)) swizzled += (swizzled.empty() ? "" : " || ") + std::string("PL_SMEM_SWIZZLED_") + std::to_string(s);
    for (const auto& [op, layout] : scoped_layouts)
      for (const std::string& macro : layout.swizzled)
        if (!macro.empty()) swizzled += (swizzled.empty() ? "" : " || ") + macro;
    for (ir::ValueId v : swizzled_own_scoped) swizzled += (swizzled.empty() ? "" : " || ") + detail::scoped_swizzle_macro(v);
    src << "  if ((" << swizzled << ") && (pl_smem_u32(" << (swizzled_slots ? "pl_slots" : "pl_smem") << ") & 1023u) != 0) { const pl_i64 ev["
        << G << "] = {0}; pl_fail(p.err, " << site << ", ev, " << G << "); return; }\n";
  }
  if (out.arena_in_shared)
    src << "  char* arena = pl_smem;\n";
  else
    src << "  char* arena = p.workspace + " << arena_after_semaphores << "(pl_i64)blockIdx.x * " << out.arena_bytes << "LL;\n";
  if (!fresh_scratch_per_point) src << "  pl_init_scratch(p, arena);\n";
  src << ring_setup("  ");
  src << "  for (pl_i64 point = blockIdx.x; point < p.num_points; point += gridDim.x) " << point_body << "\n}\n";
  src << "#else\n";
  // Host emulation: one cluster of CTAs at a time (all CTAs when co-resident), their threads host
  // threads meeting at real barriers; the CTAs take the points in turn, as the GPU's grid-stride
  // loop does.
  src << "extern \"C\" void " << out.host_entry << "(const pl_u64* words, int nthreads) {\n";
  src << "  PlParams p;\n  memcpy(&p, words, sizeof p);\n";
  src << "  pl_host_start(nthreads, p.err);\n";
  src << "  auto run = [&](int t) {\n    pl_host_set_tid(t);\n";
  if (gpu_kernel)
    src << "    char* arena = (char*)pl_host_shared_base;\n";
  else
    src << "    char* arena = p.workspace + " << arena_after_semaphores << "(pl_i64)pl_host_cta() * " << out.arena_bytes
        << "LL;\n";
  if (!fresh_scratch_per_point) src << "    pl_init_scratch(p, arena);\n";
  src << ring_setup("    ");
  src << "    for (pl_i64 point = pl_host_cta(); point < p.num_points; point += PL_HOST_CTAS) " << point_body
      << "\n  };\n";
  src << "  std::vector<std::thread> threads;\n  for (int t = 1; t < nthreads * PL_HOST_CTAS; ++t) threads.emplace_back(run, t);\n";
  src << "  run(0);\n  for (std::thread& t : threads) t.join();\n}\n";
  src << "#endif\n";
  out.source = src.str();
  return out;
}

std::exception_ptr kernel_error(const TracedCall& call, const GeneratedKernel& k, const int64_t* err) {
  try {
    throw_kernel_error(call, k, err);
  } catch (...) {
    return std::current_exception();
  }
}

void throw_kernel_error(const TracedCall& call, const GeneratedKernel& k, const int64_t* err) {
  const int64_t site_no = err[0] - 1;
  if (site_no < 0 || site_no >= static_cast<int64_t>(k.error_sites.size()))
    throw InternalError("the GPU kernel reported an unknown error site " + std::to_string(site_no));
  const ErrorSite& site = k.error_sites[static_cast<size_t>(site_no)];
  const int64_t* v = err + 1;
  if (site.kind == ErrorSite::Kind::BlockIndex) {
    const GridMapping& gm = call.grid_mapping;
    const BlockMapping& bm = gm.block_mappings[static_cast<size_t>(site.operand)];
    const size_t g = static_cast<size_t>(k.num_grid_dims), rank = bm.block_shape.size();
    std::vector<int64_t> point(v, v + g), indices(v + g, v + g + rank), start, size, low;
    Shape padded;
    core::padded_layout(bm, padded, low);
    core::block_region(bm, indices, start, size);
    throw core::out_of_bounds_block_error(bm, site.operand < gm.num_inputs, indices, point, "", start, size, low);
  }
  const std::span<const int64_t> point(v, static_cast<size_t>(k.num_grid_dims));
  if (site.kind == ErrorSite::Kind::BarrierWait)
    throw Error(site.op_name + ": the barrier wait did not complete within the wait limit (20 s; "
                    "$PALLAS_GPU_WAIT_TIMEOUT_MS under gpu_emulate): the kernel deadlocks — run it with "
                    ".interpret = true to see what each thread waits for" + eval::at_grid_point(point),
                site.loc);
  if (site.kind == ErrorSite::Kind::ScopeMeeting)
    throw Error("run_scoped with collective_axes: not every Pallas thread of the CTA " + site.op_name +
                    " the scope within the wait limit (20 s; $PALLAS_GPU_WAIT_TIMEOUT_MS under gpu_emulate): a thread "
                    "that never enters or leaves a shared scope deadlocks the kernel — run it with .interpret = true to "
                    "see what each thread waits for" + eval::at_grid_point(point),
                site.loc);
  if (site.kind == ErrorSite::Kind::SemaphoreWait)
    throw Error(site.op_name + ": the semaphore did not reach the awaited count within the wait limit (20 s; "
                    "$PALLAS_GPU_WAIT_TIMEOUT_MS under gpu_emulate): the kernel deadlocks (a signal that never "
                    "comes) — run it with .interpret = true to see what each thread waits for" + eval::at_grid_point(point),
                site.loc);
  if (site.kind == ErrorSite::Kind::SemaphoreValue)
    throw Error(eval::negative_semaphore_amount(site.op_name, v[k.num_grid_dims]) + eval::at_grid_point(point),
                site.loc);
  if (site.kind == ErrorSite::Kind::PipelineWait)
    throw InternalError("gpu: the TMA copies of a pipeline step of pallas_call \"" + site.op_name +
                        "\" did not land within the wait limit" + eval::at_grid_point(point) +
                        " (a fault of the GPU backend; PALLAS_GPU_NO_TMA=1 copies by cp.async instead)");
  if (site.kind == ErrorSite::Kind::SlotAlignment)
    throw InternalError("gpu: the swizzled shared memory (ring slots, SMEM tiles, scoped arrays) of \"" + site.op_name +
                        "\" does not start on a 1024-byte boundary (a fault of the GPU backend; "
                        "PALLAS_GPU_NO_SWIZZLE=1 keeps shared memory unswizzled)");
  if (site.kind == ErrorSite::Kind::ClusterIndex)
    throw Error("cluster_ref: index " + std::to_string(v[k.num_grid_dims]) + " is outside the cluster axis '" +
                    site.op_name + "' of size " + std::to_string(site.size) + eval::at_grid_point(point),
                site.loc);
  if (site.kind == ErrorSite::Kind::DebugCheck)
    throw Error("debug_check failed: " + site.op_name + eval::at_grid_point(point), site.loc);
  if (site.kind == ErrorSite::Kind::BitcastAlignment) throw Error(site.op_name + eval::at_grid_point(point), site.loc);
  // RefIndex: {program ids..., start}
  const int64_t start = v[k.num_grid_dims];
  throw Error(site.op_name + ": " +
                  eval::ref_index_out_of_bounds(site.dim, start, site.is_slice, site.size, site.stride, site.ref_shape) +
                  eval::at_grid_point(point),
              site.loc);
}

}  // namespace pallas::gpu
