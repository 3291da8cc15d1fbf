// The GPU backend: code generation and NVRTC compile time per example (cold, no cache), and —
// only where a GPU is present — GB/s of the copy-like examples and TFLOP/s of the matmul. Without
// a GPU the device rows say so; no number is printed that was not measured.
#include <iostream>

#include "bench/bench.h"
#include "core/call.h"
#include "examples/examples.h"
#include "gpu/codegen.h"
#include "gpu/cuda_libs.h"
#include "pallas/device_array.h"

namespace ex = pallas::examples;
namespace gpu = pallas::gpu;

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
                  Row{"inplace", pallas::DType::F32, "inplace"}}) {
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
}
