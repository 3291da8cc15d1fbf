// The GPU backend: code generation and NVRTC compile time per example (cold, no cache), and —
// only where a GPU is present — GB/s of the copy-like examples and TFLOP/s of the matmul. Without
// a GPU the device rows say so; no number is printed that was not measured.
#include <iostream>
#include <sstream>

#include "bench/bench.h"
#include "bench/cuda_reference.h"
#include "core/call.h"
#include "examples/examples.h"
#include "gpu/backend.h"
#include "gpu/codegen.h"
#include "gpu/cuda_libs.h"
#include "gpu/driver.h"
#include "pallas/device_array.h"

namespace ex = pallas::examples;
namespace gpu = pallas::gpu;
namespace pl = pallas;

namespace {

// One compiled pallas_call on device buffers the caller keeps: launches go straight to the
// loaded kernel (launch_generated: clearing the error record, the launch, reading the record
// back, the wait), so the time is the kernel's plus that per-launch overhead, without
// call_on_device's output allocation.
struct ResidentCall {
  std::shared_ptr<const pallas::TracedCall> tc;
  std::shared_ptr<const gpu::LoadedKernel> loaded;
  std::vector<int64_t> grid;
  std::vector<gpu::DeviceBuffer> buffers;  // inputs, then outputs
  std::vector<uint64_t> ptrs;

  // `arena_limit` > 0: generated with that CodegenOptions::max_shared_arena_bytes instead of the
  // backend's choice (the benchmark compares placements of the arena).
  ResidentCall(const pl::PallasCall& call, const std::vector<pl::Array>& inputs, int64_t arena_limit = 0) {
    std::vector<pl::ShapeDtype> sig;
    for (const pl::Array& a : inputs) sig.push_back({a.shape(), a.dtype()});
    tc = call.impl()->trace(sig);
    for (const pl::GridDim& d : call.impl()->grid_spec.grid.dims) grid.push_back(d.size());
    if (arena_limit > 0) {
      auto own = std::make_shared<gpu::LoadedKernel>();
      gpu::CodegenOptions opts = gpu::codegen_options(call.impl()->compiler_params);
      gpu::Device& d = gpu::Device::get();
      opts.max_shared_bytes = d.max_shared_per_block();
      opts.max_shared_arena_bytes = arena_limit;
      own->kernel = gpu::generate_cuda(*tc, grid, opts);
      own->function = gpu::load_function(gpu::Nvrtc::get().compile(own->kernel.source, own->kernel.entry, d.arch()).image,
                                         own->kernel);
      loaded = own;
    } else {
      loaded = gpu::loaded_kernel(*call.impl(), *tc, grid);
    }
    for (const pl::Array& a : inputs) {
      const size_t bytes = static_cast<size_t>(a.size() * pl::itemsize(a.dtype()));
      buffers.emplace_back(bytes);
      buffers.back().upload(a.raw_data(), bytes);
    }
    const pl::GridMapping& gm = tc->grid_mapping;
    for (int o = 0; o < gm.num_outputs; ++o) {
      const pl::ShapeDtype& s = gm.block_mappings[static_cast<size_t>(gm.num_inputs + o)].array;
      buffers.emplace_back(static_cast<size_t>(pl::num_elements(s.shape) * pl::itemsize(s.dtype)));
    }
    for (const gpu::DeviceBuffer& b : buffers) ptrs.push_back(b.ptr());
    gpu::Device::get().synchronize(nullptr);
  }
  void launch() const { gpu::launch_generated(*tc, loaded->kernel, loaded->function, ptrs, grid, nullptr); }
};

// Host wall time of fn() followed by a wait for the default stream: median of `repeats`.
template <class F> double synced_seconds(int repeats, F&& fn) {
  return bench::median_seconds(repeats, [&] {
    fn();
    gpu::Device::get().synchronize(nullptr);
  });
}

pl::PallasCall elementwise_call(const char* name, int64_t rows, int64_t cols, int64_t br, int64_t bc, bool add) {
  const pl::BlockSpec spec({br, bc}, [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; });
  pl::CallOptions o{.grid = {pl::cdiv(rows, br), pl::cdiv(cols, bc)},
                    .in_specs = add ? std::vector<pl::BlockSpec>{spec, spec} : std::vector<pl::BlockSpec>{spec},
                    .out_specs = {spec},
                    .backend = "mosaic_gpu",
                    .name = name};
  if (add)
    return pl::pallas_call([](pl::Ref x, pl::Ref y, pl::Ref z) { z[pl::all] = x[pl::all] + y[pl::all]; },
                           pl::ShapeDtype({rows, cols}, pl::f32), o);
  return pl::pallas_call([](pl::Ref x, pl::Ref z) { z[pl::all] = x[pl::all]; }, pl::ShapeDtype({rows, cols}, pl::f32), o);
}

// The matmul example's kernel (acc += x @ y over a sequential K axis, z = acc at the last step)
// with blocks (bm, bk) of x, (bk, bn) of y and `depth` buffers for both: the block shapes the
// example's fixed 128 x 128 x 128 does not try. Per K step a (bm, bn) block of z does
// 2 * bm * bn * bk FLOPs on (bm + bn) * bk * 2 bytes of L2 reads: 64 FLOP per byte for 128 x 128,
// 85 for 128 x 256 (what cuBLAS' fastest Hopper tiles have), which decides how close to the
// tensor cores' peak L2's bandwidth lets a kernel without clusters come.
pl::PallasCall blocked_matmul(int64_t n, int64_t bm, int64_t bn, int64_t bk, int depth) {
  auto kernel = [](const pl::Ref& x, const pl::Ref& y, const pl::Ref& z, const pl::Ref& acc) {
    pl::when(pl::program_id(2) == 0, [&] { acc[pl::all] = 0.0f; });
    acc[pl::all] += pl::dot(x[pl::all], y[pl::all], {.preferred = pl::f32});
    pl::when(pl::program_id(2) == pl::num_programs(2) - 1, [&] { z[pl::all] = acc[pl::all]; });
  };
  const pl::Buffered buffers{depth};
  pl::CallOptions o{
      .grid = {n / bm, n / bn, n / bk},
      .in_specs = {pl::BlockSpec({bm, bk}, [](pl::Value i, pl::Value, pl::Value k) { return pl::Indices{i, k}; })
                       .with_pipeline_mode(buffers),
                   pl::BlockSpec({bk, bn}, [](pl::Value, pl::Value j, pl::Value k) { return pl::Indices{k, j}; })
                       .with_pipeline_mode(buffers)},
      .out_specs = {pl::BlockSpec({bm, bn}, [](pl::Value i, pl::Value j, pl::Value) { return pl::Indices{i, j}; })},
      .scratch_shapes = {{{bm, bn}, pl::f32, pl::MemorySpace::Vmem}},
      .backend = "mosaic_gpu",
      .name = "matmul_blocks"};
  return pl::pallas_call(kernel, pl::ShapeDtype({n, n}, pl::f32), o);
}

// Copy and elementwise bandwidth, bf16 matmul against cuBLAS, launch overhead: each row measured
// in this one process, next to its reference (issue 5's targets are ratios of these).
// Launch overhead: a kernel that does nothing, and the smallest pallas_call (add of 8 x 45), on
// resident operands with and without an output to allocate (device memory from the pool, or with
// PALLAS_GPU_NO_POOL=1 cuMemAlloc / cuMemFree).
void launch_overhead(std::ostream& report) {
  report << "\nLaunch overhead, host time of a call on a tiny problem + wait (median of 200; device memory "
         << (gpu::Device::get().pooled() ? "from the stream-ordered pool" : "by cuMemAlloc / cuMemFree") << "):\n\n| what | µs |\n|---|---|\n";
  gpu::DeviceBuffer a = gpu::DeviceBuffer::outside_pool(16), b = gpu::DeviceBuffer::outside_pool(16);
  report << "| plain CUDA kernel, no work (cuLaunchKernelEx + cuStreamSynchronize) | "
         << synced_seconds(200, [&] { bench::plain_copy_kernel(b.ptr(), a.ptr(), 0); }) * 1e6 << " |\n";
  ex::RunOptions tiny;
  tiny.backend = "gpu";
  tiny.size = 8;
  ex::Problem t = ex::find("add").build(tiny);
  ResidentCall tiny_call(t.call, t.inputs);
  report << "| pallas add [8, 45]: launch_generated (clear error record, launch, read it back, wait) | "
         << synced_seconds(200, [&] { tiny_call.launch(); }) * 1e6 << " |\n";
  std::vector<gpu::DeviceArray> args;
  for (const pl::Array& x : t.inputs) args.push_back(gpu::DeviceArray::to_gpu(x));
  report << "| pallas add [8, 45]: gpu::call_on_device (+ output allocation, argument checks) | "
         << synced_seconds(200, [&] { gpu::call_on_device(t.call, args); }) * 1e6 << " |\n";
  // The output aliased to input 0 (updated in place): no allocation per call.
  const pl::BlockSpec spec({8, 45}, [](pl::Value i) { return pl::Indices{i, 0}; });
  pl::PallasCall in_place = pl::pallas_call([](pl::Ref x, pl::Ref y, pl::Ref z) { z[pl::all] = x[pl::all] + y[pl::all]; },
                                            pl::ShapeDtype({8, 45}, pl::f32),
                                            pl::CallOptions{.grid = {1}, .in_specs = {spec, spec}, .out_specs = {spec},
                                                            .input_output_aliases = {{0, 0}}, .backend = "mosaic_gpu",
                                                            .name = "add_in_place"});
  report << "| pallas add [8, 45], output aliased to x: gpu::call_on_device (no allocation) | "
         << synced_seconds(200, [&] { gpu::call_on_device(in_place, args); }) * 1e6 << " |\n";
  // Without waiting: 16 calls queued back to back, then one synchronize, per call (the host's
  // cost of a call in a chain; the kernels overlap it).
  report << "| the same, gpu::call_on_device_async: 16 calls + one gpu::synchronize, per call | "
         << synced_seconds(50, [&] {
              for (int i = 0; i < 16; ++i) gpu::call_on_device_async(in_place, args);
              gpu::synchronize();
            }) * 1e6 / 16 << " |\n";
}

void side_by_side(std::ostream& report) {
  gpu::Device& d = gpu::Device::get();
  const int64_t rows = 16384, cols = 16384, elems = rows * cols, bytes = elems * 4;  // 1 GiB per array
  gpu::DeviceBuffer a(static_cast<size_t>(bytes)), b(static_cast<size_t>(bytes));
  {
    std::vector<float> host(static_cast<size_t>(elems), 1.5f);
    a.upload(host.data(), static_cast<size_t>(bytes));
    d.synchronize(nullptr);
  }
  report << "\nBandwidth, bytes read + written, f32 [" << rows << ", " << cols
         << "] (1 GiB per array; host time of launch + wait, median of 20):\n\n"
         << "| kernel | ms | GB/s | of the best reference |\n|---|---|---|---|\n";
  const double memcpy_s = synced_seconds(20, [&] { gpu::copy_device_to_device(b.ptr(), a.ptr(), static_cast<size_t>(bytes), nullptr); });
  const double plain_s = synced_seconds(20, [&] { bench::plain_copy_kernel(b.ptr(), a.ptr(), bytes); });
  const double best = 2.0 * static_cast<double>(bytes) / std::min(memcpy_s, plain_s) / 1e9;
  auto row = [&](const std::string& name, double secs, double moved) {
    const double gbs = moved / secs / 1e9;
    report << "| " << name << " | " << secs * 1e3 << " | " << gbs << " | " << gbs / best * 100 << "% |\n";
  };
  row("cuMemcpyDtoD (reference)", memcpy_s, 2.0 * static_cast<double>(bytes));
  row("plain CUDA copy kernel, 16-byte vectors (reference)", plain_s, 2.0 * static_cast<double>(bytes));
  struct Case { const char* name; int64_t r, c, br, bc; bool add; };
  for (Case k : {Case{"pallas copy, (64, 512) blocks", rows, cols, 64, 512, false},
                 Case{"pallas add, (64, 128) blocks", rows, cols, 64, 128, true},
                 Case{"pallas add, (64, 128) blocks, [16384, 16421]: ragged edges (the add example)", rows, cols + 37, 64, 128, true}}) {
    // Constant inputs (1, 2): bandwidth does not depend on the values, and the result is checked
    // whole (3 or 1 everywhere) without a host reference of a GiB.
    std::vector<pl::Array> in;
    for (int i = 0; i < (k.add ? 2 : 1); ++i) in.push_back(pl::Array::full({k.r, k.c}, pl::f32, 1.0 + i));
    ResidentCall call(elementwise_call(k.add ? "add" : "copy", k.r, k.c, k.br, k.bc, k.add), in);
    const double t = synced_seconds(20, [&] { call.launch(); });
    std::vector<float> out(static_cast<size_t>(k.r * k.c));
    call.buffers.back().download(out.data(), out.size() * 4);
    d.synchronize(nullptr);
    const float want = k.add ? 3.0f : 1.0f;
    const bool right = std::all_of(out.begin(), out.end(), [&](float v) { return v == want; });
    row(std::string(k.name) + (right ? "" : " **WRONG RESULT**"), t, (k.add ? 3.0 : 2.0) * static_cast<double>(k.r * k.c * 4));
  }

  // bf16 matmul: the matmul example's kernel at 8192^3 and cuBLAS on the same device inputs.
  const int64_t n = 8192;
  ex::RunOptions o;
  o.backend = "gpu";
  o.size = n;
  o.dtype = pl::DType::BF16;
  ex::Problem p = ex::find("matmul").build(o);
  ResidentCall ours(p.call, p.inputs);
  {
    // Where the arena goes: each limit's kernel on the same inputs.
    report << "\nThe matmul example by where its arena lives (launch + wait, median of 5):\n\n"
           << "| problem | arena limit (KiB) | arena | ms | TFLOP/s |\n|---|---|---|---|---|\n";
    ex::RunOptions o32;
    o32.backend = "gpu";
    o32.size = 2048;
    ex::Problem p32 = ex::find("matmul").build(o32);
    for (auto [prob, kib] : {std::pair{&p, 96}, std::pair{&p, 200}, std::pair{&p32, 96}, std::pair{&p32, 200}}) {
      const ex::Problem& q = *prob;
      const int64_t m = q.inputs[0].shape()[0];
      ResidentCall v(q.call, q.inputs, kib * 1024);
      report << "| " << pl::dtype_name(q.inputs[0].dtype()) << " " << m << "^3 ";
      const double s = synced_seconds(5, [&] { v.launch(); });
      report << "| " << kib << " | " << (v.loaded->kernel.arena_in_shared ? "shared" : "global") << ", "
             << v.loaded->kernel.arena_bytes / 1024 << " KiB" << (v.loaded->kernel.wgmma_staging_bytes > 0 ? ", wgmma" : ", mma.sync")
             << " | " << s * 1e3 << " | " << 2.0 * m * m * m / s / 1e12 << " |\n";
    }
  }
  gpu::DeviceBuffer c_ref(static_cast<size_t>(n * n * 4));
  const double flops = 2.0 * static_cast<double>(n) * n * n;
  const double ours_s = synced_seconds(5, [&] { ours.launch(); });
  std::string cublas_why = bench::Cublas::unavailable_reason();
  report << "\nbf16 matmul " << n << "^3, f32 accumulation and output, N(0,1) inputs (host time of launch + wait, "
            "median of 5; the same device inputs for both):\n\n| kernel | ms | TFLOP/s | of cuBLAS |\n|---|---|---|---|\n";
  if (!cublas_why.empty()) {
    report << "| pallas matmul example (128 blocks) | " << ours_s * 1e3 << " | " << flops / ours_s / 1e12 << " | (no cuBLAS: "
           << cublas_why << ") |\n";
  } else {
    bench::Cublas& cb = bench::Cublas::get();
    const uint64_t A = ours.ptrs[0], B = ours.ptrs[1], C = c_ref.ptr();
    const double cublas_s = synced_seconds(5, [&] { cb.gemm_bf16_f32(n, n, n, A, B, C); });
    report << "| cuBLAS cublasGemmEx (reference) | " << cublas_s * 1e3 << " | " << flops / cublas_s / 1e12 << " | 100% |\n"
           << "| pallas matmul example (128 blocks) | " << ours_s * 1e3 << " | " << flops / ours_s / 1e12 << " | "
           << cublas_s / ours_s * 100 << "% |\n";
    // The two results agree (they sum the K products in different orders).
    std::vector<float> x(static_cast<size_t>(n * n)), y(static_cast<size_t>(n * n));
    ours.buffers[2].download(x.data(), x.size() * 4);
    c_ref.download(y.data(), y.size() * 4);
    d.synchronize(nullptr);
    double diff = 0, mag = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      diff = std::max(diff, static_cast<double>(std::abs(x[i] - y[i])));
      mag = std::max(mag, static_cast<double>(std::abs(y[i])));
    }
    report << "\nmax |pallas - cuBLAS| = " << diff << " (max |cuBLAS| = " << mag << ")\n";

    // Other block shapes of the same kernel on the same inputs, each beside cuBLAS.
    report << "\nThe same product by block shape (x (bm, bk), y (bk, bn), Buffered(depth); median of 5):\n\n"
           << "| bm x bn x bk, depth | slots | ms | TFLOP/s | of cuBLAS (ms) | max abs diff |\n|---|---|---|---|---|---|\n";
    struct Blocks { int64_t bm, bn, bk; int depth; };
    // A call on the same inputs, timed next to a fresh cuBLAS time (the machine is shared: a ratio
    // is of two numbers taken a second apart), its result checked against cuBLAS': the row's cells
    // "ms | TFLOP/s | of cuBLAS (ms) | max abs diff |".
    auto versus_cublas = [&](ResidentCall& v) {
      const double t = synced_seconds(5, [&] { v.launch(); });
      const double ref = synced_seconds(5, [&] { cb.gemm_bf16_f32(n, n, n, A, B, C); });
      v.buffers[2].download(x.data(), x.size() * 4);
      d.synchronize(nullptr);
      double worst = 0;
      for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, static_cast<double>(std::abs(x[i] - y[i])));
      std::ostringstream cells;
      cells << t * 1e3 << " | " << flops / t / 1e12 << " | " << ref / t * 100 << "% (" << ref * 1e3 << ") | " << worst << " |\n";
      return cells.str();
    };
    for (Blocks s : {Blocks{128, 128, 128, 2}, Blocks{128, 128, 64, 4}, Blocks{128, 256, 64, 3}}) {
      ResidentCall v(blocked_matmul(n, s.bm, s.bn, s.bk, s.depth), p.inputs);
      report << "| " << s.bm << " x " << s.bn << " x " << s.bk << ", " << s.depth << " | " << v.loaded->kernel.pipeline_slots
             << " | " << versus_cublas(v);
    }

    // The ws_matmul example (gpu::kernel: a producer warpgroup, two consumers) on the same inputs:
    // 128 x 128 tiles with the old ring of 2 slots and the default 4, and 128 x 256 tiles (one
    // m64n256k16 wgmma block a consumer, the epilogue from registers); alone and in clusters that
    // share x's blocks along j (`--cluster N`) and y's along i (`--cluster-rows M`) by TMA
    // multicast, with a CTA per tile or a persistent grid of one CTA per SM (`--persistent`).
    report << "\nThe ws_matmul example on the same inputs, by tiling, cluster and grid (median of 5):\n\n"
           << "| tile, slots | cluster (i x j) | persistent CTAs | ms | TFLOP/s | of cuBLAS (ms) | max abs diff |\n"
           << "|---|---|---|---|---|---|---|\n";
    const int sms = d.multiprocessors();
    struct Config { int tile_n, stages, rows, cluster, persistent; };
    for (Config g : {Config{128, 2, 1, 1, 0}, Config{128, 4, 1, 1, 0}, Config{128, 4, 1, 2, 0}, Config{128, 4, 1, 4, 0},
                     Config{128, 4, 2, 2, 0}, Config{128, 4, 1, 1, sms}, Config{128, 4, 1, 2, sms}, Config{256, 4, 1, 1, 0},
                     Config{256, 3, 1, 1, 0}, Config{256, 4, 1, 2, 0}, Config{256, 4, 2, 1, 0}, Config{256, 4, 1, 2, sms},
                     Config{256, 4, 2, 1, sms}}) {
      ex::Problem w = ex::find("ws_matmul").build({.size = n, .dtype = pl::bf16, .backend = "gpu", .cluster = g.cluster,
                                                   .cluster_rows = g.rows, .persistent = g.persistent,
                                                   .tile_n = g.tile_n, .stages = g.stages,
                                                   .with_inputs = false});
      ResidentCall v(w.call, p.inputs);
      report << "| 128 x " << g.tile_n << ", " << g.stages << " | " << g.rows << " x " << g.cluster << " | "
             << (g.persistent ? std::to_string(g.persistent) : "-") << " | " << versus_cublas(v);
    }

    // The pipeline_matmul example (gpu::emit_pipeline around wgmma: one warpgroup per 128 x 128
    // tile, the "one warpgroup TMA+wgmma pipeline") on the same inputs, by depth.
    report << "\nThe pipeline_matmul example on the same inputs, by pipeline depth (median of 5):\n\n"
           << "| slots | ms | TFLOP/s | of cuBLAS (ms) | max abs diff |\n|---|---|---|---|---|\n";
    for (int stages : {2, 3, 4}) {
      ex::Problem w = ex::find("pipeline_matmul").build({.size = n, .dtype = pl::bf16, .backend = "gpu", .stages = stages,
                                                         .with_inputs = false});
      ResidentCall v(w.call, p.inputs);
      report << "| " << stages << " | " << versus_cublas(v);
    }
  }

  // The flash_attention example (a gpu::kernel: q k^T by wgmma through k's transposed SMEM view,
  // the online softmax, p v from registers; 2 heads of d = 64) and the attention example (the
  // same math as a pallas_call, its products in registers) on the same inputs, by sequence
  // length. No library attention is linked to compare with; their values are checked by the
  // examples' runs.
  report << "\nThe flash_attention (gpu::kernel) and attention (pallas_call) examples on the same inputs (bf16, 2 "
            "heads, d = 64; median of 5):\n\n"
         << "| seq | flash_attention ms | TFLOP/s | attention ms | TFLOP/s |\n|---|---|---|---|---|\n";
  for (int64_t seq : {1024, 4096, 8192}) {
    ex::Problem a = ex::find("flash_attention").build({.seed = 1, .size = seq, .dtype = pl::bf16, .backend = "gpu"});
    ex::Problem b = ex::find("attention").build({.seed = 1, .size = seq, .dtype = pl::bf16, .backend = "gpu"});
    ResidentCall v(a.call, a.inputs), w(b.call, a.inputs);
    const double t = synced_seconds(5, [&] { v.launch(); }), u = synced_seconds(5, [&] { w.launch(); });
    report << "| " << seq << " | " << t * 1e3 << " | " << static_cast<double>(a.flops) / t / 1e12 << " | " << u * 1e3
           << " | " << static_cast<double>(b.flops) / u / 1e12 << " |\n";
  }

  launch_overhead(report);
}

}  // namespace

void bench_gpu_launch(std::ostream& report) {
  if (const std::string why = gpu::driver_unavailable_reason(); !why.empty()) {
    report << "Launch overhead: not measured (" << why << ").\n";
    return;
  }
  launch_overhead(report);
}

void bench_gpu(std::ostream& report) {
  report << "Code generation and cold NVRTC compile (median of 3; one thread; no kernel cache):\n\n"
         << "| example | source lines | codegen ms | NVRTC sm_90a ms | NVRTC sm_80 ms | cubin bytes |\n"
         << "|---|---|---|---|---|---|\n";
  const bool nvrtc = gpu::Nvrtc::unavailable_reason().empty();
  // "matmul bf16": the same example with bf16 inputs, its dot on tensor cores (mma.sync).
  struct Row { const char* name; pallas::DType dtype; const char* label; };
  for (Row row : {Row{"add", pallas::DType::F32, "add"}, Row{"matmul", pallas::DType::F32, "matmul"},
                  Row{"matmul", pallas::DType::BF16, "matmul bf16"}, Row{"softmax", pallas::DType::F32, "softmax"},
                  Row{"layer_norm", pallas::DType::F32, "layer_norm"}, Row{"gather", pallas::DType::F32, "gather"},
                  Row{"inplace", pallas::DType::F32, "inplace"}, Row{"ws_matmul", pallas::DType::BF16, "ws_matmul bf16"},
                  Row{"pipeline_matmul", pallas::DType::BF16, "pipeline_matmul bf16"},
                  Row{"flash_attention", pallas::DType::BF16, "flash_attention bf16"},
                  Row{"attention", pallas::DType::BF16, "attention bf16"}}) {
    const char* name = row.label;
    ex::RunOptions o;
    o.backend = "gpu";
    o.dtype = row.dtype;
    ex::Problem p = ex::find(row.name).build(o);
    auto tc = p.call.trace(p.arg_shapes());
    gpu::GeneratedKernel k;
    double gen = bench::median_seconds(3, [&] {
      k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, gpu::codegen_options(p.call.impl()->compiler_params));
    });
    int64_t lines = std::count(k.source.begin(), k.source.end(), '\n');
    report << "| " << name << " | " << lines << " | " << gen * 1e3 << " | ";
    if (!nvrtc) {
      report << "no NVRTC | | |\n";
      continue;
    }
    size_t bytes = 0;
    for (const char* arch : {"sm_90a", "sm_80"}) {
      double t = bench::median_seconds(3, [&] { bytes = gpu::Nvrtc::get().compile(k.source, name, arch).image.size(); });
      report << t * 1e3 << " | ";
    }
    report << bytes << " |\n";
  }
  const std::string why = gpu::driver_unavailable_reason();
  if (!why.empty()) {
    report << "\nDevice timings: not measured (" << why << ").\n";
    return;
  }
  report << "\nOn the GPU (median of 10 calls, host arrays in and out, so transfers included):\n\n"
         << "| example | size | ms per call | GB/s or GFLOP/s (incl. transfers) |\n|---|---|---|---|\n";
  struct Sized { const char* name; int64_t size; pallas::DType dtype; };
  for (Sized row : {Sized{"add", 4096, pallas::DType::F32}, Sized{"matmul", 2048, pallas::DType::F32},
                    Sized{"matmul", 2048, pallas::DType::BF16}, Sized{"softmax", 8192, pallas::DType::F32}}) {
    const std::string name = std::string(row.name) + (row.dtype == pallas::DType::F32 ? "" : " bf16");
    const int64_t size = row.size;
    ex::RunOptions o;
    o.backend = "gpu";
    o.size = size;
    o.dtype = row.dtype;
    ex::Problem p = ex::find(row.name).build(o);
    double t = bench::median_seconds(10, [&] { ex::execute(p); });
    double rate = p.throughput == ex::Throughput::Flops ? p.flops / t / 1e9 : p.bytes / t / 1e9;
    report << "| " << name << " | " << size << " | " << t * 1e3 << " | " << rate << " |\n";
  }
  // The same calls on device-resident operands (no transfers): the kernel plus the host's launch
  // and error-record overhead; the tiny `add` shows that overhead alone.
  report << "\nOn the GPU, operands resident (gpu::call_on_device; median of 20 calls):\n\n"
         << "| example | size | µs per call | GB/s or GFLOP/s |\n|---|---|---|---|\n";
  for (auto [name, size] : {std::pair{"add", 8}, std::pair{"add", 4096}, std::pair{"matmul", 2048},
                            std::pair{"softmax", 8192}}) {
    ex::RunOptions o;
    o.backend = "gpu";
    o.size = size;
    ex::Problem p = ex::find(name).build(o);
    std::vector<gpu::DeviceArray> args;
    for (const pallas::Array& a : p.inputs) args.push_back(gpu::DeviceArray::to_gpu(a));
    gpu::call_on_device(p.call, args);  // warm: compiled, loaded
    double t = bench::median_seconds(20, [&] { gpu::call_on_device(p.call, args); });
    double rate = p.throughput == ex::Throughput::Flops ? p.flops / t / 1e9 : p.bytes / t / 1e9;
    report << "| " << name << " | " << size << " | " << t * 1e6 << " | " << rate << " |\n";
  }
  side_by_side(report);
}
