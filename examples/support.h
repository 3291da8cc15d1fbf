// Helpers shared by the example kernels (not part of the examples' public header).
#pragma once

#include <initializer_list>
#include <string>

#include "examples/examples.h"

namespace pallas::examples {

// `opts` set to run on `backend` ("reference" | "tpu-interpret" | "gpu"). The backends that do
// not exist yet are still selected here: pallas_call raises their NotSupportedError when the
// call runs, which is the error a user of that backend should see.
CallOptions on_backend(CallOptions opts, const std::string& backend);

// The problem size: opts.size, or `default_size` when it is 0. Negative sizes are a UsageError.
int64_t size_or_default(const std::string& example, const RunOptions& opts, int64_t default_size);

// Throws UsageError unless opts.dtype is one of `supported`.
void require_dtype(const std::string& example, const RunOptions& opts,
                   std::initializer_list<DType> supported);

// "[512,512]": shapes in signatures, compact like the CLI's one-line report.
std::string dims(const Shape& shape);

// A fresh seed for each input, so inputs drawn from one --seed are independent.
inline uint64_t input_seed(const RunOptions& opts, int input) {
  return opts.seed * 1000003ULL + static_cast<uint64_t>(input);
}

}  // namespace pallas::examples
