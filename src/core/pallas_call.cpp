// The pallas_call driver: option validation, tracing (cached per argument signature), alias
// checks and backend dispatch.
#include <iostream>
#include <set>

#include "core/call.h"
#include "core/trace_env.h"

namespace pallas {

namespace {

CompilerParamsMap normalize_compiler_params(const CallOptions& opts, const SourceLoc& loc) {
  CompilerParamsMap out = opts.compiler_params_by_backend;
  if (opts.compiler_params) {
    std::string b = compiler_params_backend(*opts.compiler_params);
    out[b] = *opts.compiler_params;
  }
  static const std::set<std::string> known = {"mosaic_tpu", "mosaic_gpu", "triton"};
  for (const auto& [backend, params] : out) {
    if (!known.count(backend))
      throw Error("Unknown backend in compiler_params: " + backend, loc);
    std::string actual = compiler_params_backend(params);
    if (actual != backend)
      throw Error("Inconsistent backend in compiler_params: " + actual + " != " + backend, loc);
    if (const auto* gpu = std::get_if<gpu::CompilerParams>(&params)) {
      if (gpu->cluster)
        throw NotSupportedError("gpu::CompilerParams::cluster (clusters of a pallas_call's CTAs); a gpu::kernel "
                                "takes clusters in its Mesh (cluster, cluster_names)",
                                loc);
      if (gpu->max_concurrent_steps && *gpu->max_concurrent_steps < 1)
        throw Error("gpu::CompilerParams::max_concurrent_steps must be at least 1 (1: no pipeline), got " +
                        std::to_string(*gpu->max_concurrent_steps),
                    loc);
    }
  }
  return out;
}

std::string grid_tuple(const Grid& g) { return g.to_string(); }

std::string resolve_backend(const CallOptions& opts, const SourceLoc& loc) {
  if (opts.interpret.tpu()) return "tpu_interpret";
  if (opts.interpret.enabled()) return "reference";
  std::string b = opts.backend.value_or("");
  if (b.empty() && opts.compiler_params) b = compiler_params_backend(*opts.compiler_params);
  if (b == "reference" || b == "interpret") return "reference";
  if (b == "tpu_interpret") return "tpu_interpret";
  if (b == "mosaic_gpu" || b == "gpu") return "mosaic_gpu";
  if (b == "gpu_emulate") return "gpu_emulate";
  if (b == "mosaic_tpu")
    throw Error(
        "backend mosaic_tpu needs a TPU, and none is reachable from this process; run the kernel "
        "in the simulated TPU with .interpret = pltpu::InterpretParams{} (or the reference "
        "interpreter with .interpret = true)",
        loc);
  if (b == "triton") throw NotSupportedError("the triton backend (use mosaic_gpu)", loc);
  if (b.empty())
    throw Error(
        "pallas_call has no backend to run on: pass .interpret = true (the reference "
        "interpreter), .interpret = pltpu::InterpretParams{} (the simulated TPU) or "
        ".backend = \"mosaic_gpu\" (an NVIDIA GPU)",
        loc);
  throw Error("Unsupported backend: " + b +
                  " (known: reference, tpu_interpret, mosaic_tpu, mosaic_gpu, gpu_emulate, triton)",
              loc);
}

}  // namespace

namespace detail {

PallasCall make_pallas_call(KernelFn kernel, std::vector<ShapeDtype> out_shapes, CallOptions opts,
                            const SourceLoc& loc) {
  auto impl = std::make_shared<PallasCallImpl>();
  impl->loc = loc;
  if (opts.grid_spec) {
    if (!opts.grid.empty())
      throw Error("If `grid_spec` is specified, then `grid` must be `()`. It is " +
                      grid_tuple(opts.grid),
                  loc);
    if (opts.in_specs.given())
      throw Error("If `grid_spec` is specified, then `in_specs` must be `no_block_spec`. It is a "
                  "list of " + std::to_string(opts.in_specs.size()) + " BlockSpecs",
                  loc);
    if (opts.out_specs.given())
      throw Error("If `grid_spec` is specified, then `out_specs` must be `no_block_spec`. It is a "
                  "list of " + std::to_string(opts.out_specs.size()) + " BlockSpecs",
                  loc);
    if (!opts.scratch_shapes.empty())
      throw Error("If `grid_spec` is specified, then `scratch_shapes` must be `()`. It has " +
                      std::to_string(opts.scratch_shapes.size()) + " entries",
                  loc);
    impl->grid_spec = *opts.grid_spec;
  } else {
    impl->grid_spec = GridSpec{opts.grid, opts.in_specs, opts.out_specs, opts.scratch_shapes, 0};
  }
  const Grid& g = impl->grid_spec.grid;
  if (!g.names.empty() && g.names.size() != g.dims.size())
    throw Error("a named grid needs one name per dimension", loc);
  for (const GridDim& d : g.dims)
    if (!d.is_dynamic() && d.size() < 0)
      throw Error("Grid must be a tuple of non-negative integers or pl::dynamic, got " +
                      grid_tuple(g),
                  loc);
  impl->compiler_params = normalize_compiler_params(opts, loc);
  if (opts.mesh_shape) {
    std::vector<int64_t> grid;
    for (const GridDim& d : g.dims) grid.push_back(d.size());
    if (*opts.mesh_shape != grid) {
      Grid mesh;
      for (int64_t m : *opts.mesh_shape) mesh.dims.emplace_back(m);
      throw Error("Mesh shape " + mesh.to_string() + " does not match grid shape " +
                      grid_tuple(g) + ".",
                  loc);
    }
    // (gpu::kernel chooses its backend itself: the GPU unless .interpret is set.)
    if (opts.backend && !opts.gpu_kernel)
      throw Error("If `mesh` is specified, then `backend` must be `None`.", loc);
  }
  impl->backend = resolve_backend(opts, loc);
  for (const ShapeDtype& s : out_shapes)
    for (int64_t d : s.shape)
      if (d < 0) throw Error("out_shape " + s.to_string() + " has a negative dimension", loc);
  impl->kernel = std::move(kernel);
  impl->out_shapes = std::move(out_shapes);
  impl->opts = std::move(opts);
  return PallasCall(impl);
}

}  // namespace detail

std::string PallasCallImpl::func_src_info() const {
  std::string n = opts.name.empty() ? "kernel" : opts.name;
  return n + " at " + loc.to_string();
}

std::shared_ptr<const TracedCall> PallasCallImpl::trace(const std::vector<ShapeDtype>& args) {
  std::string key;
  for (const ShapeDtype& a : args) key += a.to_string() + ";";
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  if (vmap) {
    std::shared_ptr<const TracedCall> batched = transforms::trace_vmapped(*this, args);
    std::lock_guard<std::mutex> lock(mu);
    auto [it, inserted] = cache.emplace(key, batched);
    return it->second;
  }
  auto tc = std::make_shared<TracedCall>();
  tc->name = opts.name.empty() ? "kernel" : opts.name;
  tc->backend = backend;
  tc->debug_checks = opts.debug_checks;
  tc->gpu_kernel = opts.gpu_kernel;
  tc->cost_estimate = opts.cost_estimate;
  tc->grid_mapping = core::build_grid_mapping(*this, args);
  const GridMapping& gm = tc->grid_mapping;

  // Aliases (the seed's checks and wording).
  size_t num_in = args.size();
  std::set<int> aliased_outputs;
  for (const auto& [i, o] : opts.input_output_aliases) {
    std::string mapping = "'" + std::to_string(i) + ":" + std::to_string(o) + "'";
    if (i < 0 || i >= static_cast<int>(num_in))
      throw Error("input_output_aliases contains the mapping " + mapping + " with input index " +
                      std::to_string(i) + " outside the range [0, " + std::to_string(num_in) + ")",
                  loc);
    if (o < 0 || o >= static_cast<int>(out_shapes.size()))
      throw Error("input_output_aliases contains the mapping " + mapping + " with output index " +
                      std::to_string(o) + " outside the range [0, " +
                      std::to_string(out_shapes.size()) + ")",
                  loc);
    if (!(args[i] == out_shapes[o]))
      throw Error("input_output_aliases contains the mapping " + mapping + " referring to input[" +
                      std::to_string(i) + "] with abstract value " + args[i].to_string() +
                      " and to output[" + std::to_string(o) + "] with a different abstract value " +
                      out_shapes[o].to_string() + ".",
                  loc);
    if (i < gm.num_index_operands)
      throw NotSupportedError("aliasing a scalar-prefetch operand (input " + std::to_string(i) + ")",
                              loc);
    if (!aliased_outputs.insert(o).second)
      throw Error("input_output_aliases maps two inputs to output " + std::to_string(o), loc);
    tc->input_output_aliases.emplace_back(i, o);
  }

  // The kernel: *index, *inputs, *outputs, *scratch.
  std::vector<ir::Type> params;
  for (int i = 0; i < gm.num_index_operands; ++i) params.push_back(gm.index_map_params[gm.grid.size() + i]);
  for (const BlockMapping& bm : gm.block_mappings) params.push_back(bm.block_ref_type);
  for (const ir::Type& t : gm.scratch_types) params.push_back(t);
  {
    core::TraceEnv env{core::TraceEnv::Kind::Kernel, gm.grid_names, func_src_info(), ""};
    if (opts.gpu_kernel) {
      env.cluster_axes_begin = opts.gpu_kernel->num_grid_axes;
      env.cluster_axes_end = env.cluster_axes_begin + opts.gpu_kernel->num_cluster_axes;
      env.gpu_kernel = true;
      if (opts.gpu_kernel->has_thread_axis) {
        env.thread_axis = env.cluster_axes_end;
        env.num_threads = gm.grid.at(static_cast<size_t>(env.thread_axis));
      }
    }
    core::ScopedTraceEnv scoped(&env);
    detail::TraceScope scope(tc->name, std::source_location::current());
    std::vector<Value> handles = scope.add_params(params);
    std::vector<Ref> refs;
    for (const Value& h : handles) refs.emplace_back(h);
    // pl::get_global's buffers become scratch after the declared ones (gpu::kernel only, so far).
    std::vector<ir::Type> globals;
    if (opts.gpu_kernel) scope.collect_globals(&globals);
    kernel(refs);
    tc->kernel = scope.finish();
    if (opts.gpu_kernel) gpu::check_peer_refs(tc->kernel);
    tc->kernel.loc = loc;
    GridMapping& mapping = tc->grid_mapping;
    for (const ir::Type& t : globals) {
      mapping.scratch_types.push_back(t);
      mapping.scratch_barrier_arrivals.push_back(0);
      mapping.scratch_unions.emplace_back();
      mapping.scratch_barrier_collective_axes.emplace_back();
      mapping.scratch_grid_wide.push_back(true);
    }
  }
  if (backend == "tpu_interpret") tpu_interpret::check_kernel(tc->kernel);
  if (opts.debug) {
    std::ostream& os = opts.debug_out ? *opts.debug_out : std::cout;
    os << "The kernel IR of " << func_src_info() << ":\n"
       << ir::print(tc->kernel) << "\n"
       << tc->grid_mapping.to_string();
  }
  std::lock_guard<std::mutex> lock(mu);
  auto [it, inserted] = cache.emplace(key, tc);
  return it->second;
}

std::shared_ptr<const TracedCall> PallasCall::trace(const std::vector<ShapeDtype>& args) const {
  return impl_->trace(args);
}

int PallasCall::cache_size() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return static_cast<int>(impl_->cache.size());
}

size_t PallasCallImpl::num_dynamic_grid_dims() const {
  size_t n = 0;
  for (const GridDim& d : grid_spec.grid.dims) n += d.is_dynamic();
  return n;
}

std::shared_ptr<const TracedCall> PallasCallImpl::prepare(const std::vector<Array>& all_args,
                                                         std::vector<int64_t>& grid,
                                                         std::vector<Array>& args) {
  const long num_sizes = static_cast<long>(std::min(num_dynamic_grid_dims(), all_args.size()));
  std::vector<ShapeDtype> size_args, sig;
  for (long i = 0; i < static_cast<long>(all_args.size()); ++i)
    (i < num_sizes ? size_args : sig).push_back(all_args[static_cast<size_t>(i)].shape_dtype());
  args.assign(all_args.begin() + num_sizes, all_args.end());
  return prepare(
      size_args, [&](size_t i) { return all_args[i].scalar_at_flat(0).as_int64(); }, sig, grid);
}

std::shared_ptr<const TracedCall> PallasCallImpl::prepare(const std::vector<ShapeDtype>& size_args,
                                                         const std::function<int64_t(size_t)>& size_of,
                                                         const std::vector<ShapeDtype>& sig,
                                                         std::vector<int64_t>& grid) {
  const Grid& g = grid_spec.grid;
  const size_t num_dynamic = num_dynamic_grid_dims();
  if (size_args.size() < num_dynamic)
    throw Error("pallas_call " + func_src_info() + ": the grid has " +
                    std::to_string(num_dynamic) +
                    " dynamic dimensions, so the call needs that many leading i32 scalar sizes; got " +
                    std::to_string(size_args.size() + sig.size()) + " arguments",
                loc);
  grid.clear();
  size_t next = 0;
  for (size_t d = 0; d < g.dims.size(); ++d) {
    if (!g.dims[d].is_dynamic()) {
      grid.push_back(g.dims[d].size());
      continue;
    }
    const ShapeDtype& s = size_args[next];
    if (s.rank() != 0 || !is_integer(s.dtype))
      throw Error("pallas_call " + func_src_info() + ": argument " + std::to_string(next) +
                      " must be an integer scalar (the size of dynamic grid dimension " +
                      std::to_string(d) + "), got " + s.to_string(),
                  loc);
    int64_t n = size_of(next);
    if (n < 0)
      throw Error("pallas_call " + func_src_info() + ": dynamic grid dimension " +
                      std::to_string(d) + " has negative size " + std::to_string(n),
                  loc);
    grid.push_back(n);
    ++next;
  }
  std::shared_ptr<const TracedCall> tc = trace(sig);
  if (vmap) {
    // A vmapped call's grid has leading batch dimensions that grid_spec does not list: take the
    // traced grid, with the dynamic sizes in their places.
    std::vector<int64_t> dynamic_sizes;
    for (size_t d = 0; d < g.dims.size(); ++d)
      if (g.dims[d].is_dynamic()) dynamic_sizes.push_back(grid[d]);
    grid.clear();
    size_t k = 0;
    for (int64_t n : tc->grid_mapping.grid) grid.push_back(n >= 0 ? n : dynamic_sizes.at(k++));
  }
  return tc;
}

std::vector<Array> PallasCallImpl::run(const TracedCall& tc, const std::vector<Array>& args,
                                       const std::vector<int64_t>& grid) {
  if (tc.gpu_kernel) {
    if (backend == "reference") return interpret::run_gpu_kernel(tc, args, grid, opts.debug_out);
    gpu::check_compilable_kernel(tc, loc);
  }
  if (backend == "reference") return interpret::run_reference(tc, args, grid, opts.debug_out);
  if (backend == "tpu_interpret") return tpu_interpret::run(*this, tc, {args}, grid, tpu::Mesh{}).at(0);
  if (backend == "mosaic_gpu") return gpu::run_gpu(*this, tc, args, grid);
  if (backend == "gpu_emulate") return gpu::run_gpu_emulated(*this, tc, args, grid);
  throw InternalError("unknown backend " + backend);
}

std::vector<Array> PallasCall::operator()(const std::vector<Array>& all_args) const {
  PallasCallImpl& c = *impl_;
  if (c.vmap) return transforms::call_vmapped(c, all_args);
  std::vector<int64_t> grid;
  std::vector<Array> args;
  std::shared_ptr<const TracedCall> tc = c.prepare(all_args, grid, args);
  return c.run(*tc, args, grid);
}

}  // namespace pallas
