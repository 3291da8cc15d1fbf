#include "examples/support.h"

namespace pallas::examples {

CallOptions on_backend(CallOptions opts, const std::string& backend) {
  if (backend == "reference") {
    opts.interpret = true;
  } else if (backend == "tpu-interpret") {
    opts.interpret = tpu::InterpretParams{};
  } else if (backend == "gpu") {
    opts.backend = "mosaic_gpu";
  } else {
    throw UsageError("unknown backend '" + backend + "' (known: reference, tpu-interpret, gpu)");
  }
  return opts;
}

int64_t size_or_default(const std::string& example, const RunOptions& opts, int64_t default_size) {
  if (opts.size < 0)
    throw UsageError(example + ": size must be positive, got " + std::to_string(opts.size));
  return opts.size == 0 ? default_size : opts.size;
}

void require_dtype(const std::string& example, const RunOptions& opts,
                   std::initializer_list<DType> supported) {
  std::string names;
  for (DType t : supported) {
    if (t == opts.dtype) return;
    names += (names.empty() ? "" : ", ") + std::string(dtype_name(t));
  }
  throw UsageError(example + ": dtype " + std::string(dtype_name(opts.dtype)) +
                   " is not supported (supported: " + names + ")");
}

std::string dims(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace pallas::examples
