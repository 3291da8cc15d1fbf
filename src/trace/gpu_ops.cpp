// Tracing of gpu::kernel and its primitives (include/pallas/gpu.h). The ops' type rules
// (src/ir/type_rules.cpp) check shapes, dtypes and memory spaces at the user's line; the mesh
// and scratch checks here follow Mosaic GPU's wording where it has one.
#include "pallas/gpu.h"

#include <algorithm>
#include <functional>
#include <set>

#include "core/call.h"
#include "core/trace_env.h"
#include "pallas/tpu.h"
#include "trace/context.h"

namespace pallas::gpu {

using ir::AttrKey;
using ir::Attrs;
using ir::OpCode;

namespace {
constexpr int kMaxBarrierArrivals = 65535;  // an mbarrier's count

ScratchShape barriers(const char* what, int num_arrivals, int num_barriers) {
  if (num_arrivals < 1)
    throw Error(std::string(what) + ": num_arrivals must be at least 1, got " + std::to_string(num_arrivals));
  if (num_arrivals > kMaxBarrierArrivals)
    throw Error(std::string(what) + ": num_arrivals must be at most " + std::to_string(kMaxBarrierArrivals) +
                " (an mbarrier's count), got " + std::to_string(num_arrivals));
  if (num_barriers < 1)
    throw Error(std::string(what) + ": num_barriers must be at least 1, got " + std::to_string(num_barriers));
  return ScratchShape{{num_barriers}, DType::GpuBarrier, MemorySpace::GpuShared, num_arrivals};
}
}  // namespace

Barrier::operator ScratchShape() const { return barriers("gpu::Barrier", num_arrivals, num_barriers); }

TMABarrier::operator ScratchShape() const { return barriers("gpu::TMABarrier", 1, num_barriers); }

ClusterBarrier::operator ScratchShape() const {
  if (collective_axes.empty())
    throw Error("gpu::ClusterBarrier needs at least one collective axis (a cluster axis name); for "
                "a barrier of one CTA use gpu::Barrier");
  ScratchShape s = barriers("gpu::ClusterBarrier", num_arrivals, num_barriers);
  s.collective_axes = collective_axes;
  return s;
}

Semaphore::operator ScratchShape() const {
  for (int64_t d : shape)
    if (d < 1) throw Error("gpu::Semaphore: the shape " + shape_to_string(shape) + " has a dimension below 1");
  return ScratchShape{shape, DType::Semaphore, MemorySpace::Gmem};
}

namespace {

constexpr int64_t kUnionAlignment = 16;  // each array of a union member starts on it
int64_t align_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }
int64_t array_bytes(const ScratchShape& s) { return num_elements(s.shape) * itemsize(s.dtype); }

// The placement rule of a union, in one place: each member's arrays (and nested unions) one
// after another from `base`, each 16-byte aligned. Appends the arrays to `flat` when given, each
// recording its union `index` and offset (union_bytes is left for the caller), and returns where
// the union ends (base + its largest member).
int64_t lay_out_union(const ScratchShape& u, int index, int64_t base, std::vector<ScratchShape>* flat) {
  int64_t end = base;
  for (const std::vector<ScratchShape>& member : *u.union_members) {
    int64_t at = base;
    for (const ScratchShape& s : member) {
      at = align_up(at, kUnionAlignment);
      if (s.union_members) {
        at = lay_out_union(s, index, at, flat);
        continue;
      }
      if (flat) {
        flat->push_back(s);
        flat->back().in_union = {index, at, 0};
      }
      at += array_bytes(s);
    }
    end = std::max(end, at);
  }
  return end;
}
int64_t union_bytes(const ScratchShape& u) { return lay_out_union(u, -1, 0, nullptr); }

}  // namespace

Union::operator ScratchShape() const {
  if (members.empty()) throw Error("gpu::Union needs at least one member (a list of SMEM arrays)");
  for (size_t m = 0; m < members.size(); ++m)
    for (size_t i = 0; i < members[m].size(); ++i) {
      const ScratchShape& s = members[m][i];
      if (s.union_members) continue;  // checked when it was made
      if (s.space != MemorySpace::GpuShared || s.dtype == DType::GpuBarrier)
        throw Error("gpu::Union: member " + std::to_string(m) + "'s entry " + std::to_string(i) + " is " +
                    (s.dtype == DType::GpuBarrier ? std::string("a gpu::Barrier")
                                                  : "in " + std::string(memory_space_name(s.space))) +
                    "; a union overlays gpu::SMEM arrays (and unions of them): give barriers and ACC "
                    "scratch their own scratch_shapes entries");
    }
  ScratchShape u;
  u.dtype = DType::U8;
  u.space = MemorySpace::GpuShared;
  u.union_members = std::make_shared<const std::vector<std::vector<ScratchShape>>>(members);
  return u;
}

int64_t shared_memory_bytes(const std::vector<ScratchShape>& scratch) {
  int64_t bytes = 0;
  for (const ScratchShape& s : scratch) {
    // (gpu::Semaphore counters are the CTA's, in its shared memory when compiled.)
    if (s.space != MemorySpace::GpuShared && s.dtype != DType::Semaphore) continue;
    if (s.union_members) {
      bytes = align_up(bytes, kUnionAlignment) + union_bytes(s);
      continue;
    }
    if (s.dtype == DType::GpuBarrier) bytes = (bytes + 7) / 8 * 8;  // mbarriers are 8-byte aligned
    bytes += array_bytes(s);
  }
  return bytes;
}

namespace detail {
namespace {

void check_names(const char* what, const std::vector<int64_t>& sizes,
                 const std::vector<std::string>& names, const SourceLoc& loc) {
  if (sizes.size() != names.size())
    throw Error(std::string("gpu::Mesh: ") + what + "_names needs one name per " + what +
                    " dimension: " + std::to_string(sizes.size()) + " sizes, " +
                    std::to_string(names.size()) + " names",
                loc);
  for (size_t i = 0; i < sizes.size(); ++i)
    if (sizes[i] < 1)
      throw Error(std::string("gpu::Mesh: ") + what + " dimension '" + names[i] + "' has size " +
                      std::to_string(sizes[i]) + "; it needs at least 1",
                  loc);
}

// The positions among `cluster_names` of the collective axes `axes` (a ClusterBarrier's, a
// multicast copy's); `what` names the asker in the errors: an axis that is not a cluster axis,
// or one named twice.
std::vector<int> collective_cluster_axes(const std::vector<std::string>& axes, const std::vector<std::string>& cluster_names,
                                         const std::string& what, const SourceLoc& loc) {
  std::vector<int> out;
  for (const std::string& axis : axes) {
    const auto at = std::find(cluster_names.begin(), cluster_names.end(), axis);
    if (at == cluster_names.end()) {
      std::string known;
      for (const std::string& n : cluster_names) known += (known.empty() ? "" : ", ") + n;
      throw Error(what + ": the collective axis '" + axis + "' is not a cluster axis of the mesh (cluster axes: " +
                      (known.empty() ? "none" : known) + ")",
                  loc);
    }
    const int position = static_cast<int>(at - cluster_names.begin());
    if (std::find(out.begin(), out.end(), position) != out.end())
      throw Error(what + ": the collective axis '" + axis + "' is named twice", loc);
    out.push_back(position);
  }
  return out;
}

// How many CTAs a gpu::ClusterBarrier's arrival reaches (core::cluster_barrier_peers; the same for
// every CTA of the cluster, so counted for the first). Checks the axes.
int64_t cluster_peers(const Mesh& mesh, const ScratchShape& s, size_t index, const SourceLoc& loc) {
  const std::string what = "scratch_shapes[" + std::to_string(index) + "] (gpu::ClusterBarrier)";
  const std::vector<int> collective = collective_cluster_axes(s.collective_axes, mesh.cluster_names, what, loc);
  int64_t ctas = 1, peers = 0;
  for (int64_t c : mesh.cluster) ctas *= c;
  const std::vector<int64_t> first(mesh.cluster.size(), 0);
  std::vector<int64_t> other;
  for (int64_t r = 0; r < ctas; ++r) {
    core::unravel_row_major(r, mesh.cluster, other);
    peers += core::cluster_barrier_peers(first, other, collective) ? 1 : 0;
  }
  if (s.barrier_arrivals * peers > kMaxBarrierArrivals)
    throw Error(what + ": a phase needs " + std::to_string(s.barrier_arrivals) + " arrivals from each of " +
                    std::to_string(peers) + " CTAs, more than an mbarrier counts (" +
                    std::to_string(kMaxBarrierArrivals) + ")",
                loc);
  return peers;
}

std::string describe_scratch(const std::vector<ScratchShape>& scratch) {
  std::string s;
  for (size_t i = 0; i < scratch.size(); ++i) {
    if (scratch[i].space != MemorySpace::GpuShared && scratch[i].dtype != DType::Semaphore) continue;
    if (scratch[i].union_members) {
      s += (s.empty() ? "" : ", ") + std::string("scratch[") + std::to_string(i) + "] Union of " +
           std::to_string(scratch[i].union_members->size()) + " members = " +
           std::to_string(union_bytes(scratch[i])) + " B";
      continue;
    }
    s += (s.empty() ? "" : ", ") + std::string("scratch[") + std::to_string(i) + "] " +
         (scratch[i].dtype == DType::GpuBarrier ? "Barrier x" + std::to_string(num_elements(scratch[i].shape))
                                                : ShapeDtype(scratch[i].shape, scratch[i].dtype).to_string()) +
         " = " + std::to_string(array_bytes(scratch[i])) + " B";
  }
  return s;
}

}  // namespace

PallasCall make_gpu_kernel(KernelFn body, std::vector<ShapeDtype> out_shapes, const Mesh& mesh,
                           CallOptions opts, const SourceLoc& loc) {
  check_names("grid", mesh.grid, mesh.grid_names, loc);
  check_names("cluster", mesh.cluster, mesh.cluster_names, loc);
  if (mesh.cluster.size() > 3)
    throw Error("gpu::Mesh: a cluster has at most 3 dimensions, got " + std::to_string(mesh.cluster.size()), loc);
  if (mesh.num_threads.has_value() != mesh.thread_name.has_value())
    throw Error("gpu::Mesh: num_threads and thread_name go together: give both or neither", loc);
  constexpr int kMaxThreads = 2048 / 128;  // a CTA has at most 2048 CUDA threads, 128 per warpgroup
  if (mesh.num_threads && (*mesh.num_threads < 1 || *mesh.num_threads > kMaxThreads))
    throw Error("gpu::Mesh: num_threads is " + std::to_string(*mesh.num_threads) +
                    "; each Pallas thread is a warpgroup of 128 CUDA threads, so a CTA has 1 to " +
                    std::to_string(kMaxThreads),
                loc);
  int64_t cluster_size = 1;
  for (int64_t c : mesh.cluster) cluster_size *= c;
  if (cluster_size > 16)
    throw Error("gpu::Mesh: a cluster of " + std::to_string(cluster_size) +
                    " CTAs; the GPU allows at most 16 (8 portably)",
                loc);
  std::vector<std::string> names = mesh.grid_names;
  names.insert(names.end(), mesh.cluster_names.begin(), mesh.cluster_names.end());
  if (mesh.thread_name) names.push_back(*mesh.thread_name);
  std::set<std::string> seen;
  for (const std::string& n : names) {
    if (n.empty()) throw Error("gpu::Mesh: an axis name is empty", loc);
    if (!seen.insert(n).second) throw Error("gpu::Mesh: the axis name '" + n + "' is used twice", loc);
  }
  if (opts.interpret.tpu())
    throw Error("gpu::kernel runs in the interpreter (.interpret = true) or on the GPU, not in the "
                "TPU interpret mode",
                loc);
  for (size_t i = 0; i < opts.scratch_shapes.size(); ++i) {
    const ScratchShape& s = opts.scratch_shapes[i];
    const bool semaphore = s.space == MemorySpace::Gmem && s.dtype == DType::Semaphore;
    const bool ok = s.space == MemorySpace::GpuShared || s.space == MemorySpace::GpuAcc || semaphore;
    if (!ok)
      throw Error("scratch_shapes[" + std::to_string(i) + "] is " +
                      (s.space == MemorySpace::Semaphore ? std::string("a TPU semaphore (pltpu::semaphores)")
                                                         : "in " + std::string(memory_space_name(s.space))) +
                      "; a gpu::kernel's scratch is gpu::SMEM, gpu::ACC, gpu::Barrier, gpu::Union or "
                      "gpu::Semaphore (the CTA's semaphores)",
                  loc);
    if ((s.dtype == DType::GpuBarrier) != (s.barrier_arrivals > 0))
      throw Error("scratch_shapes[" + std::to_string(i) + "]: make barriers with gpu::Barrier{...}", loc);
    if (!s.collective_axes.empty()) opts.scratch_shapes[i].barrier_arrivals *= cluster_peers(mesh, s, i, loc);
  }
  const int64_t smem = shared_memory_bytes(opts.scratch_shapes);
  if (smem > kMaxSharedMemoryBytes)
    throw Error("gpu::kernel exceeds available shared memory: the scratch needs " +
                    std::to_string(smem) + " bytes, a CTA may use at most " +
                    std::to_string(kMaxSharedMemoryBytes) + " (227 KiB); shrink the SMEM scratch (" +
                    describe_scratch(opts.scratch_shapes) +
                    ") — smaller tiles or fewer pipeline slots",
                loc);

  // Unions become their members' arrays (the kernel's scratch parameters), in order.
  std::vector<ScratchShape> flat;
  int unions = 0;
  for (const ScratchShape& s : opts.scratch_shapes) {
    if (!s.union_members) {
      flat.push_back(s);
      continue;
    }
    const size_t first = flat.size();
    const int64_t total = lay_out_union(s, unions++, 0, &flat);
    for (size_t k = first; k < flat.size(); ++k) flat[k].in_union.union_bytes = total;
  }
  opts.scratch_shapes = std::move(flat);

  KernelLayout layout;
  layout.num_grid_axes = static_cast<int>(mesh.grid.size());
  layout.num_cluster_axes = static_cast<int>(mesh.cluster.size());
  layout.has_thread_axis = mesh.num_threads.has_value();
  std::vector<std::pair<std::string, int64_t>> axes;
  for (size_t i = 0; i < mesh.grid.size(); ++i) axes.emplace_back(mesh.grid_names[i], mesh.grid[i]);
  for (size_t i = 0; i < mesh.cluster.size(); ++i) axes.emplace_back(mesh.cluster_names[i], mesh.cluster[i]);
  if (mesh.num_threads) axes.emplace_back(*mesh.thread_name, *mesh.num_threads);
  core::use_mesh_as_grid(opts, axes, "gpu::kernel", loc);
  opts.gpu_kernel = layout;
  opts.default_memory_space = MemorySpace::Gmem;
  // Compiled, every mesh axis is parallel: each point is its own CTA (or warpgroup).
  {
    CompilerParams params;
    if (opts.compiler_params && std::holds_alternative<CompilerParams>(*opts.compiler_params)) {
      params = std::get<CompilerParams>(*opts.compiler_params);
      opts.compiler_params.reset();
    }
    auto given = opts.compiler_params_by_backend.find("mosaic_gpu");
    if (given != opts.compiler_params_by_backend.end())
      if (const auto* p = std::get_if<CompilerParams>(&given->second)) params = *p;
    if (!params.dimension_semantics.empty())
      throw Error("dimension_semantics cannot be given for a gpu::kernel: every mesh axis is parallel", loc);
    if (params.max_concurrent_steps)
      throw Error("max_concurrent_steps cannot be given for a gpu::kernel: it sets a pallas_call's pipeline depth, "
                  "and a gpu::kernel pipelines by hand (copies and barriers)",
                  loc);
    params.dimension_semantics.assign(axes.size(), "parallel");
    opts.compiler_params_by_backend["mosaic_gpu"] = params;
  }
  if (!opts.interpret.enabled() && !opts.backend) opts.backend = "mosaic_gpu";
  if (opts.backend && *opts.backend != "mosaic_gpu" && *opts.backend != "gpu" &&
      *opts.backend != "gpu_emulate" && *opts.backend != "reference")
    throw Error("gpu::kernel runs on the GPU backend or in the interpreter (.interpret = true), "
                "not on backend " + *opts.backend,
                loc);
  return pallas::detail::make_pallas_call(std::move(body), std::move(out_shapes), std::move(opts), loc);
}

}  // namespace detail

Value axis_index(const std::string& axis, Loc loc) { return tpu::axis_index(axis, loc); }

void copy_gmem_to_smem(const Ref& src, const Ref& dst, const Ref& barrier, Loc loc) {
  trace::add_op(OpCode::GpuCopyGmemToSmem, {src.handle(), dst.handle(), barrier.handle()}, {}, loc);
}

namespace {
// Sets `a`'s Axes to the mesh axes (grid..., cluster..., thread) of the named cluster axes of the
// kernel being traced (collective_cluster_axes' errors for unknown or repeated names), and its
// AxisNames to the names, comma-separated.
void set_cluster_axes(Attrs& a, const core::TraceEnv& env, const std::vector<std::string>& names, const std::string& what,
                      const SourceLoc& at) {
  const std::vector<std::string> cluster_names(env.grid_names.begin() + env.cluster_axes_begin,
                                               env.grid_names.begin() + env.cluster_axes_end);
  ir::Ints axes;
  for (int position : detail::collective_cluster_axes(names, cluster_names, what, at))
    axes.push_back(env.cluster_axes_begin + position);
  std::string joined;
  for (const std::string& name : names) joined += (joined.empty() ? "" : ",") + name;
  a.set(AttrKey::Axes, axes);
  a.set(AttrKey::AxisNames, joined);
}
}  // namespace

void copy_gmem_to_smem(const Ref& src, const Ref& dst, const Ref& barrier, std::vector<std::string> collective_axes,
                       Loc loc) {
  const SourceLoc at = trace::src(loc);
  const core::TraceEnv* env = core::current_trace_env();
  if (!env || env->cluster_axes_begin == env->cluster_axes_end)
    throw Error("copy_gmem_to_smem with collective_axes: only a gpu::kernel whose mesh has cluster axes can "
                "multicast a copy",
                at);
  if (collective_axes.empty())
    throw Error("copy_gmem_to_smem: collective_axes is empty (name cluster axes, or make a plain copy)", at);
  Attrs a;
  set_cluster_axes(a, *env, collective_axes, "copy_gmem_to_smem", at);
  trace::add_op(OpCode::GpuCopyGmemToSmem, {src.handle(), dst.handle(), barrier.handle()}, std::move(a), loc);
}

void check_peer_refs(const ir::Kernel& k) {
  std::set<ir::ValueId> peer;  // cluster_ref results and views of them
  std::function<void(const ir::Region&)> walk = [&](const ir::Region& r) {
    for (const ir::Op& op : r.ops) {
      const bool memory_access = op.code == OpCode::Load || op.code == OpCode::Store || op.code == OpCode::Swap ||
                                 op.code == OpCode::AtomicRmw || op.code == OpCode::AtomicCas;
      for (size_t i = 0; i < op.operands.size(); ++i) {
        if (!peer.count(op.operands[i])) continue;
        if (i == 0 && op.code == OpCode::GpuClusterRef)
          throw NotSupportedError("cluster_ref of a cluster_ref: name the peer CTA's place along one cluster axis in "
                                  "one cluster_ref (Mosaic GPU overrides a single axis too)",
                                  op.loc);
        if (i == 0 && ir::is_ref_view(op.code)) {
          peer.insert(op.results[0]);
        } else if (!(i == 0 && memory_access)) {
          throw NotSupportedError(std::string(op.info().name) + " on a cluster_ref (another CTA's shared memory): only "
                                  "loads, stores and atomics reach a peer's memory; copy through this CTA's own",
                                  op.loc);
        }
      }
      if (op.code == OpCode::GpuClusterRef) peer.insert(op.results[0]);
      for (const ir::Region& inner : op.regions) walk(inner);
    }
  };
  walk(k.body);
}

Ref cluster_ref(const Ref& ref, const std::string& axis, Operand index, Loc loc) {
  const SourceLoc at = trace::src(loc);
  const core::TraceEnv* env = core::current_trace_env();
  if (!env || env->cluster_axes_begin == env->cluster_axes_end)
    throw Error("cluster_ref: only a gpu::kernel whose mesh has cluster axes has peer CTAs", at);
  Attrs a;
  set_cluster_axes(a, *env, {axis}, "cluster_ref", at);
  return Ref(trace::add_op1(OpCode::GpuClusterRef, {ref.handle(), trace::index_scalar(index, "the cluster_ref index", loc)},
                            std::move(a), loc));
}

void async_prefetch(const Ref& ref, std::vector<std::string> collective_axes, Loc loc) {
  const core::TraceEnv* env = core::gpu_kernel_body_env();
  const SourceLoc at = trace::src(loc);
  if (!env)
    throw Error("async_prefetch: only a gpu::kernel's body prefetches (a pallas_call's pipeline copies its blocks itself)",
                at);
  Attrs a;
  if (!collective_axes.empty()) set_cluster_axes(a, *env, collective_axes, "async_prefetch", at);
  trace::add_op(OpCode::GpuAsyncPrefetch, {ref.handle()}, std::move(a), loc);
}

void copy_smem_to_gmem(const Ref& src, const Ref& dst, const CopyToGmemOptions& options, Loc loc) {
  Attrs a;
  if (!options.reduction_op.empty()) a.set(AttrKey::Kind, options.reduction_op);
  if (!options.commit_group) a.set(AttrKey::CommitGroup, int64_t{0});
  trace::add_op(OpCode::GpuCopySmemToGmem, {src.handle(), dst.handle()}, std::move(a), loc);
}

void commit_smem_to_gmem_group(Loc loc) {
  if (!core::gpu_kernel_body_env())
    throw Error("commit_smem_to_gmem_group: only a gpu::kernel's body copies to GMEM in groups", trace::src(loc));
  trace::add_op(OpCode::GpuCommitSmemToGmemGroup, {}, {}, loc);
}

void wait_smem_to_gmem(int n, bool wait_read_only, Loc loc) {
  Attrs a;
  a.set(AttrKey::N, int64_t{n});
  a.set(AttrKey::ReadOnly, int64_t{wait_read_only});
  trace::add_op(OpCode::GpuWaitSmemToGmem, {}, std::move(a), loc);
}

void commit_smem(Loc loc) { trace::add_op(OpCode::GpuCommitSmem, {}, {}, loc); }

void barrier_arrive(const Ref& barrier, Loc loc) {
  trace::add_op(OpCode::GpuBarrierArrive, {barrier.handle()}, {}, loc);
}

void barrier_wait(const Ref& barrier, Loc loc) {
  trace::add_op(OpCode::GpuBarrierWait, {barrier.handle()}, {}, loc);
}

void semaphore_signal(const Ref& sem, Operand inc, Loc loc) { tpu::semaphore_signal(sem, std::move(inc), {}, loc); }

void semaphore_wait(const Ref& sem, Operand value, bool decrement, Loc loc) {
  trace::semaphore_wait(sem, value, decrement, loc);
}

Value semaphore_read(const Ref& sem, Loc loc) { return tpu::semaphore_read(sem, loc); }

void wgmma(const Ref& acc, const Ref& a, const Ref& b, Loc loc) {
  trace::add_op(OpCode::GpuWgmma, {acc.handle(), a.handle(), b.handle()}, {}, loc);
}

void wgmma(const Ref& acc, const Value& a, const Ref& b, Loc loc) {
  trace::add_op(OpCode::GpuWgmma, {acc.handle(), a, b.handle()}, {}, loc);
}

void wgmma_wait(int n, Loc loc) {
  Attrs a;
  a.set(AttrKey::N, int64_t{n});
  trace::add_op(OpCode::GpuWgmmaWait, {}, std::move(a), loc);
}

namespace detail {
void named_region_begin(const std::string& name, const Loc& loc) {
  if (name.empty()) throw Error("named_region: the region needs a name", SourceLoc::from(loc));
  Attrs a;
  a.set(AttrKey::Name, name);
  trace::add_op(OpCode::NamedRegionBegin, {}, std::move(a), loc);
}
void named_region_end(const std::string& name, const Loc& loc) {
  Attrs a;
  a.set(AttrKey::Name, name);
  trace::add_op(OpCode::NamedRegionEnd, {}, std::move(a), loc);
}
}  // namespace detail

void set_max_registers(int n, bool increase, Loc loc) {
  Attrs a;
  a.set(AttrKey::N, int64_t{n});
  a.set(AttrKey::Kind, std::string(increase ? "increase" : "decrease"));
  trace::add_op(OpCode::GpuSetMaxRegisters, {}, std::move(a), loc);
}

}  // namespace pallas::gpu

namespace pallas {

Ref get_global(const ScratchShape& what, Loc loc) {
  trace::TraceState& t = trace::current(loc);
  if (what.space != MemorySpace::Gmem || what.dtype != DType::Semaphore)
    throw NotSupportedError(
        "pl::get_global of " +
            (what.space == MemorySpace::Semaphore
                 ? std::string("a TPU semaphore")
                 : ShapeDtype(what.shape, what.dtype).to_string() + " in " + std::string(memory_space_name(what.space))) +
            " (it allocates gpu::Semaphore{...}, in a gpu::kernel's body)",
        trace::src(loc));
  if (!t.globals)
    throw NotSupportedError("pl::get_global outside a gpu::kernel's body (in a pallas_call body, an index map, "
                            "or a vmapped or differentiated kernel)",
                            trace::src(loc));
  const ir::Type type = ir::Type::ref(what.shape, what.dtype, what.space);
  t.globals->push_back(type);
  return Ref(trace::wrap(t.builder.add_late_param(type)));
}

}  // namespace pallas
