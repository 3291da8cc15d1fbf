// The GPU backend of pallas_call (backend "mosaic_gpu"): generate CUDA for the traced call,
// compile it for the device's arch (cached), move the operands to the device, launch, bring the
// outputs back. Aliased inputs are updated in place, as in the interpreters.
#include "gpu/backend.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "core/call.h"
#include "gpu/codegen.h"
#include "gpu/cuda_libs.h"
#include "gpu/driver.h"
#include "gpu/host_emulation.h"
#include "gpu/kernel_cache.h"

namespace pallas::gpu {

namespace {
// What the call keeps per traced call and grid (PallasCallImpl::compiled), made once by `make`:
// a warm call neither generates, hashes, compiles nor loads anything.
template <class T, class Make>
std::shared_ptr<const T> kept_by_call(PallasCallImpl& c, const TracedCall& tc, const std::vector<int64_t>& grid,
                                      Make&& make) {
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.compiled.find({&tc, grid});
    if (it != c.compiled.end()) return std::static_pointer_cast<const T>(it->second);
  }
  std::shared_ptr<const T> fresh = make();
  std::lock_guard<std::mutex> lock(c.mu);
  c.compiled[{&tc, grid}] = fresh;
  return fresh;
}

}  // namespace

void check_compilable_kernel(const TracedCall& tc, const SourceLoc& loc) {
  const KernelLayout& layout = *tc.gpu_kernel;
  const std::vector<int64_t>& grid = tc.grid_mapping.grid;
  // Each Pallas thread is a warpgroup; a CTA has at most 1024 threads.
  constexpr int64_t kMaxGroups = 1024 / kWarpgroupThreads;
  if (layout.has_thread_axis && grid.back() > kMaxGroups)
    throw Error("a gpu::kernel compiled for the GPU has at most " + std::to_string(kMaxGroups) +
                    " Pallas threads per CTA (each is a warpgroup of " + std::to_string(kWarpgroupThreads) +
                    " threads, and a CTA has at most 1024), got " + std::to_string(grid.back()),
                loc);
}

namespace {
// Unit k compiled for this process's GPU (through the kernel cache) and loaded: its entry.
void* function_for_this_gpu(const GeneratedKernel& k) {
  const Nvrtc& nvrtc = Nvrtc::get();
  const std::string arch = Device::get().arch();
  std::shared_ptr<const CompiledKernel> image = KernelCache::global().get_or_compile(
      k.source, arch, {}, nvrtc.version(), [&] { return nvrtc.compile(k.source, k.entry, arch); });
  return load_function(image->image, k);
}
}  // namespace

std::shared_ptr<const LoadedKernel> loaded_kernel(PallasCallImpl& c, const TracedCall& tc,
                                                  const std::vector<int64_t>& grid) {
  return kept_by_call<LoadedKernel>(c, tc, grid, [&] {
    auto fresh = std::make_shared<LoadedKernel>();
    // Generate first: a kernel the GPU cannot run is reported as such even without a GPU.
    CodegenOptions opts = codegen_options(c.compiler_params);
    fresh->kernel = generate_cuda(tc, grid, opts);
    Device& device = Device::get();
    if (device.max_shared_per_block() != opts.max_shared_bytes) {
      // The device's budget, not H100's (a device with less shared memory than the default arena
      // budget keeps the arena in global memory).
      opts.max_shared_bytes = device.max_shared_per_block();
      opts.max_shared_arena_bytes = std::min(opts.max_shared_arena_bytes, opts.max_shared_bytes);
      fresh->kernel = generate_cuda(tc, grid, opts);
    }
    const GeneratedKernel& k = fresh->kernel;
    if (k.cluster_ctas > 1 && device.compute_capability() < 90)
      throw Error("a gpu::kernel with clusters of " + std::to_string(k.cluster_ctas) +
                      " CTAs needs a GPU with thread-block clusters (compute capability 9.0 or later); this "
                      "one is " + std::to_string(device.compute_capability() / 10) + "." +
                      std::to_string(device.compute_capability() % 10),
                  tc.kernel.loc);
    fresh->function = function_for_this_gpu(k);
    return fresh;
  });
}

std::shared_ptr<const GeneratedKernel> emulated_kernel(PallasCallImpl& c, const TracedCall& tc,
                                                       const std::vector<int64_t>& grid) {
  return kept_by_call<GeneratedKernel>(c, tc, grid, [&] {
    CodegenOptions options = codegen_options(c.compiler_params);
    auto k = std::make_shared<const GeneratedKernel>(generate_cuda(tc, grid, options));
    // Register tiles take all the CTA's threads (emulation_threads): past the emulation's thread
    // limit (a large cluster, a co-resident grid), the kernel without them runs with fewer
    // threads instead, computing the same values.
    if (k->register_tiles > 0 && k->host_ctas * k->threads_per_cta > kMaxHostEmulationThreads) {
      options.register_tiles = false;
      k = std::make_shared<const GeneratedKernel>(generate_cuda(tc, grid, options));
    }
    return k;
  });
}

int emulation_threads(const GeneratedKernel& k) {
  // A warp per group where tensor-core dots need whole warps (fewer threads take the CUDA-core
  // fallback, leaving the mma path unexercised).
  // A co-resident kernel runs all its CTAs at once: two threads per group when warps would be
  // too many.
  const int fewest = k.num_groups > 1 ? 2 * k.num_groups : 4;
  // Register tiles are laid out over the CTA's threads (whole warpgroups; a pallas_call's eight
  // warps): nothing else computes them (emulated_kernel leaves them out where that many threads
  // are too many).
  if (k.register_tiles > 0) return k.threads_per_cta;
  // A warpgroup per group where they run on wgmma (its accumulator in registers, as on the GPU).
  if (k.uses_wgmma && k.host_ctas * 128 * std::max(1, k.num_groups) <= kMaxHostEmulationThreads)
    return 128 * std::max(1, k.num_groups);
  if (k.tensor_core_dots > 0 && k.host_ctas * 32 * std::max(1, k.num_groups) <= kMaxHostEmulationThreads)
    return 32 * std::max(1, k.num_groups);
  return fewest;
}

namespace {
// Runs loaded kernel `function` of `k` on the device: uploads `args`, launches, waits, downloads
// the outputs (aliased inputs updated in the caller's arrays, as the interpreters do).
std::vector<Array> run_loaded(const TracedCall& tc, const GeneratedKernel& k, void* function,
                              const std::vector<Array>& args, const std::vector<int64_t>& grid) {
  Device& device = Device::get();
  const GridMapping& gm = tc.grid_mapping;
  std::map<int, int> alias_of_output;
  for (auto [i, o] : tc.input_output_aliases) alias_of_output[o] = i;
  std::vector<DeviceBuffer> inputs;
  std::vector<uint64_t> ptrs;
  for (const Array& a : args) {
    const size_t bytes = static_cast<size_t>(a.size() * itemsize(a.dtype()));
    inputs.emplace_back(bytes);
    inputs.back().upload(a.raw_data(), bytes);
    ptrs.push_back(inputs.back().ptr());
  }
  std::vector<DeviceBuffer> outputs(static_cast<size_t>(gm.num_outputs));
  for (int o = 0; o < gm.num_outputs; ++o) {
    auto alias = alias_of_output.find(o);
    if (alias != alias_of_output.end()) {
      ptrs.push_back(inputs[static_cast<size_t>(alias->second)].ptr());
      continue;
    }
    const ShapeDtype& s = gm.block_mappings[static_cast<size_t>(gm.num_inputs + o)].array;
    outputs[static_cast<size_t>(o)] = DeviceBuffer(static_cast<size_t>(num_elements(s.shape) * itemsize(s.dtype)));
    ptrs.push_back(outputs[static_cast<size_t>(o)].ptr());
  }
  launch_generated(tc, k, function, ptrs, grid, nullptr);
  std::vector<Array> result;
  for (int o = 0; o < gm.num_outputs; ++o) {
    auto alias = alias_of_output.find(o);
    if (alias != alias_of_output.end()) {
      Array caller = args[static_cast<size_t>(alias->second)];
      inputs[static_cast<size_t>(alias->second)].download(caller.raw_data(),
                                                           static_cast<size_t>(caller.size() * itemsize(caller.dtype())));
      result.push_back(caller);
      continue;
    }
    const ShapeDtype& s = gm.block_mappings[static_cast<size_t>(gm.num_inputs + o)].array;
    Array a = Array::uninitialized(s.shape, s.dtype);
    outputs[static_cast<size_t>(o)].download(a.raw_data(), static_cast<size_t>(a.size() * itemsize(a.dtype())));
    result.push_back(a);
  }
  device.synchronize(nullptr);
  return result;
}
}  // namespace

std::vector<Array> run_gpu(PallasCallImpl& c, const TracedCall& tc, const std::vector<Array>& args,
                           const std::vector<int64_t>& grid) {
  std::shared_ptr<const LoadedKernel> loaded = loaded_kernel(c, tc, grid);
  return run_loaded(tc, loaded->kernel, loaded->function, args, grid);
}

std::vector<Array> run_generated_on_gpu(const TracedCall& tc, const GeneratedKernel& k, const std::vector<Array>& args,
                                        const std::vector<int64_t>& grid) {
  return run_loaded(tc, k, function_for_this_gpu(k), args, grid);
}

std::vector<Array> run_gpu_emulated(PallasCallImpl& c, const TracedCall& tc, const std::vector<Array>& args,
                                    const std::vector<int64_t>& grid) {
  std::shared_ptr<const GeneratedKernel> k = emulated_kernel(c, tc, grid);
  return run_host_emulation(tc, *k, args, grid, emulation_threads(*k));
}

}  // namespace pallas::gpu
