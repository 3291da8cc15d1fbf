// Bundled example kernels: each builds a pallas_call, fresh random inputs and an independent
// reference (plain C++ loops in double, or BLAS), so it can be run, checked, benchmarked and
// its IR printed — from C++ (this header) or from the `pallas` CLI (list / run / ir / bench).
//
//   namespace ex = pallas::examples;
//   ex::Problem p = ex::find("matmul").build({.seed = 1, .size = 256});
//   ex::Outcome o = ex::run(p);   // o.ok, o.max_abs_error, o.message
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "pallas/pallas.h"

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
  // (an aliased input is overwritten by the call).
  std::function<std::vector<Array>(const std::vector<Array>& inputs)> reference;
  Tolerance tolerance;
  // Checks beyond the values (e.g. that an aliased output is the input's buffer): an empty
  // string when fine, else what is wrong. Optional.
  std::function<std::string(const std::vector<Array>& inputs, const std::vector<Array>& outputs)>
      extra_check;
  int64_t flops = 0;
  int64_t bytes = 0;  // bytes read and written by one call
  Throughput throughput = Throughput::Bytes;

  std::vector<ShapeDtype> arg_shapes() const;
};

struct Example {
  std::string name;
  std::string description;  // one line
  std::function<Problem(const RunOptions&)> build;
};

// Every bundled example, in a stable order.
const std::vector<Example>& all();
// The example called `name`; throws UsageError (listing the known names) when there is none.
const Example& find(const std::string& name);

// The result of checking a call's outputs against the reference.
struct Outcome {
  bool ok = true;
  double max_abs_error = 0;
  double max_rel_error = 0;
  std::string message;  // empty when ok; else the first mismatch (allclose's message)
};

// Compares `outputs` with `expected` (and runs the problem's extra check).
Outcome compare(const Problem& p, const std::vector<Array>& inputs,
                const std::vector<Array>& outputs, const std::vector<Array>& expected);
// Computes the reference, runs the call once on p.inputs and compares.
Outcome run(const Problem& p);

}  // namespace pallas::examples
