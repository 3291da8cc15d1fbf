// Bundled example kernels: each builds a pallas_call, fresh random inputs and an independent
// reference (plain C++ loops in double, or BLAS), so it can be run, checked, benchmarked and
// its IR printed — from C++ (this header) or from the `pallas` CLI (list / run / ir / bench).
//
//   namespace ex = pallas::examples;
//   ex::Problem p = ex::find("matmul").build({.seed = 1, .size = 256});
//   ex::Outcome o = ex::run(p);   // o.ok, o.max_abs_error, o.message
//
// Examples that run on several simulated devices (pltpu::run_on_mesh) keep the same shape: their
// `inputs` are the global arrays (the devices' shards concatenated), and their `runner` splits
// them, runs the mesh and concatenates the devices' outputs, so `reference` and `compare` see
// global arrays too.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pallas/pallas.h"
#include "pallas/tpu.h"

namespace pallas::examples {

// An option the example cannot honour (a size it cannot tile, a dtype it does not support, an
// unknown backend): the caller's mistake, which the CLI reports with exit code 2.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& what) : Error(what) {}
};

struct RunOptions {
  uint64_t seed = 0;
  int64_t size = 0;                  // 0: the example's default
  DType dtype = DType::F32;          // the inputs' dtype, where the example supports several
  std::string backend = "reference";  // "reference" | "tpu-interpret" | "gpu"

  // The TPU interpret mode's knobs (backend "tpu-interpret" only; with any other backend a
  // non-default value is a UsageError). `seed` above also seeds the simulator's shuffling of
  // parallel grid dimensions there.
  int devices = 0;           // simulated devices, for the multi-device examples (0: default)
  int cores = 0;             // cores per device (0: the example's default, usually 1)
  std::string dma_mode;      // "eager" | "on_wait" ("": the simulator's default, on_wait)
  bool detect_races = false;
  // Where detected races go. find()'s examples make one when detect_races is set; a caller
  // may pass its own.
  std::shared_ptr<std::vector<tpu::RaceReport>> races;

  // The GPU backends' on-device profiler (gpu, gpu-emulate only; elsewhere a UsageError): the
  // directory each run writes its Chrome trace to, and the region events each Pallas thread may
  // record per CTA (gpu::CompilerParams::profile_dir / profile_space).
  std::string profile_dir;
  int profile_space = 256;
  // gpu::CompilerParams::approx_math (gpu, gpu-emulate only; elsewhere a UsageError: the
  // interpreters compute exactly whatever the flag says).
  bool approx_math = false;

  // The grid of the gpu::kernel examples written for it (elsewhere a non-default value is a
  // UsageError): CTAs per cluster (0: the example's default; several need sm_90 or later on the
  // GPU), and the CTAs of a persistent grid that loops over the work (0: a CTA per piece of work).
  int cluster = 0;
  int cluster_rows = 0;  // CTAs per cluster along a second axis (0: one)
  int persistent = 0;
  // Their tiling (likewise): the CTA's output tile's columns, and the K-steps its pipeline keeps in
  // flight (its ring's slots); 0: the example's default.
  int tile_n = 0;
  int stages = 0;
  // The shared memory a CTA may use where the kernel runs, for the examples whose default
  // pipeline depth follows it (ws_matmul); 0: with backend "gpu", this machine's GPU's
  // (gpu::device_shared_memory_limit), else an H100's 227 KiB.
  int64_t shared_memory_limit = 0;
  // false: the problem's call without its random inputs, for a caller that has its own (pallas_bench
  // times ws_matmul's variants on matmul's inputs: drawing 2 x 8192^2 normals takes ~15 s of one
  // core). Honoured by the square matmuls (matmul, ws_matmul, pipeline_matmul); other problems
  // draw them anyway.
  bool with_inputs = true;

  bool uses_tpu_interpret_options() const {
    return devices != 0 || cores != 0 || !dma_mode.empty() || detect_races;
  }
};

// |actual - expected| <= atol + rtol * |expected|, elementwise.
struct Tolerance {
  double rtol = 1e-5;
  double atol = 1e-6;
};

// What the bench reports: GFLOP/s for compute-bound kernels, GB/s for memory-bound ones.
enum class Throughput { Flops, Bytes };

// One instance of an example: a call, its inputs and how to check its outputs.
struct Problem {
  std::string name;
  std::string signature;  // "f32[512,512]x[512,512]": the operands, for messages
  std::string backend;    // as given in RunOptions
  PallasCall call;
  std::vector<Array> inputs;  // in call order (scalar-prefetch operands first)
  // Expected outputs from `inputs`, computed without the kernel. Called before the kernel runs
  // (an aliased input is overwritten by the call). Empty: the outputs are not checked (the
  // `racy` example, whose result depends on the race), and `unchecked_note` says why.
  std::function<std::vector<Array>(const std::vector<Array>& inputs)> reference;
  std::string unchecked_note;
  // How the problem runs when it is not simply call(inputs) — e.g. split the global inputs into
  // per-device shards, pltpu::run_on_mesh, concatenate the devices' outputs. Optional.
  std::function<std::vector<Array>(const std::vector<Array>& inputs)> runner;
  // The argument shapes `call` is traced with, when they are not the inputs' (multi-device
  // problems: one device's shards). Optional.
  std::vector<ShapeDtype> call_arg_shapes;
  // With RunOptions::detect_races: where the TPU interpret mode reports races (the sink from
  // the RunOptions; null otherwise).
  std::shared_ptr<std::vector<tpu::RaceReport>> races;
  Tolerance tolerance;
  // Checks beyond the values (e.g. that an aliased output is the input's buffer): an empty
  // string when fine, else what is wrong. Optional.
  std::function<std::string(const std::vector<Array>& inputs, const std::vector<Array>& outputs)>
      extra_check;
  int64_t flops = 0;
  int64_t bytes = 0;  // bytes read and written by one call
  Throughput throughput = Throughput::Bytes;

  // What `call` is traced with: call_arg_shapes, else the inputs' shapes.
  std::vector<ShapeDtype> arg_shapes() const;
};

struct Example {
  std::string name;
  std::string description;  // one line
  std::function<Problem(const RunOptions&)> build;
  // Runs on a mesh of simulated devices (accepts RunOptions::devices).
  bool multi_device = false;
  // Its grid is the user's to shape (accepts RunOptions::cluster and ::persistent).
  bool gpu_grid_options = false;
};

// Every bundled example, in a stable order. Their `build` also checks the options every example
// shares (TPU interpret knobs only with that backend, --devices only for multi-device examples)
// and attaches a race sink when detect_races is set.
const std::vector<Example>& all();
// The example called `name`; throws UsageError (listing the known names) when there is none.
const Example& find(const std::string& name);

// The result of checking a call's outputs against the reference.
struct Outcome {
  bool ok = true;
  double max_abs_error = 0;
  double max_rel_error = 0;
  std::string message;  // empty when ok; else the first mismatch (allclose's message)
  bool checked = true;  // false: the problem has no reference (message says why)
  // Races the TPU interpret mode detected (with detect_races); any race makes ok false.
  std::vector<tpu::RaceReport> races;
};

// Compares `outputs` with `expected` (and runs the problem's extra check).
Outcome compare(const Problem& p, const std::vector<Array>& inputs,
                const std::vector<Array>& outputs, const std::vector<Array>& expected);
// Runs the problem once on p.inputs (its runner, else its call) and returns the outputs.
std::vector<Array> execute(const Problem& p);
// Computes the reference, runs the problem once and compares. A tpu::DeadlockError (or any other
// error of the run) propagates.
Outcome run(const Problem& p);

}  // namespace pallas::examples
