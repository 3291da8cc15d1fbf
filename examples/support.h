// Helpers shared by the example kernels (not part of the examples' public header).
#pragma once

#include <functional>
#include <initializer_list>
#include <string>

#include "examples/examples.h"

namespace pallas::examples {

// `opts` set to run on run.backend ("reference" | "tpu-interpret" | "gpu"); for tpu-interpret,
// with InterpretParams from the run options (DMA mode, race detection and its sink, cores per
// device, the seed). The backends that do not exist yet are still selected here: pallas_call
// raises their NotSupportedError when the call runs, which is the error a user of that backend
// should see.
CallOptions on_backend(CallOptions opts, const RunOptions& run);

// Throws UsageError unless the example runs on the TPU interpret mode (its kernels use DMAs,
// semaphores or several devices, which only the simulated TPU has).
void require_tpu_interpret(const std::string& example, const RunOptions& opts);

// The number of simulated devices: opts.devices, or `default_devices` when it is 0. Fewer than
// `min_devices` or more than 64 is a UsageError.
int devices_or_default(const std::string& example, const RunOptions& opts, int default_devices,
                       int min_devices);
// Likewise for the cores per device (opts.cores), at most 16.
int cores_or_default(const std::string& example, const RunOptions& opts, int default_cores);

// Multi-device problems keep global arrays (the devices' shards stacked along axis 0):
// `split_rows(a, n)` cuts one into n equal shards, `concat_rows` stacks shards back.
std::vector<Array> split_rows(const Array& a, int64_t n);
Array concat_rows(const std::vector<Array>& parts);

// A Problem::runner for a call with one input and one output on a 1-D mesh of `n` devices
// along `axis`: device d gets shard d of the input; the result stacks the devices' outputs.
std::function<std::vector<Array>(const std::vector<Array>&)> mesh_runner(PallasCall call,
                                                                          std::string axis,
                                                                          int64_t n);

// SparseCore examples: the chunks w, w + W, w + 2W, ... of `chunks` for this vector subcore,
// w = core * subcores + subcore of W = workers; calls body(chunk index) in a fori_loop.
void for_each_subcore_chunk(int64_t chunks, int subcores, int64_t workers,
                            const std::function<void(Value)>& body);

// The problem size: opts.size, or `default_size` when it is 0. Negative sizes are a UsageError.
int64_t size_or_default(const std::string& example, const RunOptions& opts, int64_t default_size);

// Throws UsageError unless opts.dtype is one of `supported`.
void require_dtype(const std::string& example, const RunOptions& opts,
                   std::initializer_list<DType> supported);

// The matmul examples' problem: `call` computes f32[n, n] = x @ y for N(0, 1) inputs x, y of
// (n, n) in opts.dtype, checked against BLAS on f32 copies (bf16 and f16 values are exact in f32).
Problem square_matmul_problem(const std::string& name, const RunOptions& opts, int64_t n, PallasCall call,
                              Tolerance tolerance);

// The attention examples' problem: `call` computes softmax(q k^T / sqrt(d)) v of each head for
// N(0, 1) inputs q, k, v of `shape` (heads, seq, d) in opts.dtype, its output in that dtype;
// checked against plain C++ attention in double.
Problem attention_problem(const std::string& name, const RunOptions& opts, const Shape& shape, PallasCall call);

// "[512,512]": shapes in signatures, compact like the CLI's one-line report.
std::string dims(const Shape& shape);

// A fresh seed for each input, so inputs drawn from one --seed are independent.
inline uint64_t input_seed(const RunOptions& opts, int input) {
  return opts.seed * 1000003ULL + static_cast<uint64_t>(input);
}

}  // namespace pallas::examples
