#include "examples/support.h"

#include <cblas.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace pallas::examples {

CallOptions on_backend(CallOptions opts, const RunOptions& run) {
  const std::string& backend = run.backend;
  if (backend == "reference") {
    opts.interpret = true;
  } else if (backend == "tpu-interpret") {
    tpu::InterpretParams p;
    if (!run.dma_mode.empty()) p.dma_execution_mode = run.dma_mode;
    p.random_seed = run.seed;
    p.detect_races = run.detect_races;
    p.races = run.races;
    if (run.cores > 0) p.num_cores_per_device = run.cores;
    opts.interpret = p;
  } else if (backend == "gpu") {
    opts.backend = "mosaic_gpu";
  } else if (backend == "gpu-emulate") {
    opts.backend = "gpu_emulate";
  } else {
    throw UsageError("unknown backend '" + backend + "' (known: reference, tpu-interpret, gpu, gpu-emulate)");
  }
  if (!run.profile_dir.empty() || run.approx_math) {
    const bool on_gpu = backend == "gpu" || backend == "gpu-emulate";
    if (!on_gpu && !run.profile_dir.empty())
      throw UsageError("--profile needs --backend gpu or gpu-emulate (the on-device profiler), got '" + backend + "'");
    if (!on_gpu)
      throw UsageError("--approx-math needs --backend gpu or gpu-emulate (the interpreters compute exactly), got '" +
                       backend + "'");
    // The GPU params the example gave (if any), with the profiler or the approximate math switched on.
    gpu::CompilerParams params;
    if (opts.compiler_params) {
      if (const auto* p = std::get_if<gpu::CompilerParams>(&*opts.compiler_params))
        params = *p;
      else
        opts.compiler_params_by_backend[compiler_params_backend(*opts.compiler_params)] = *opts.compiler_params;
      opts.compiler_params.reset();
    } else if (auto it = opts.compiler_params_by_backend.find("mosaic_gpu"); it != opts.compiler_params_by_backend.end()) {
      params = std::get<gpu::CompilerParams>(it->second);
    }
    if (!run.profile_dir.empty()) {
      params.profile_dir = run.profile_dir;
      params.profile_space = run.profile_space;
    }
    params.approx_math = params.approx_math || run.approx_math;
    opts.compiler_params_by_backend["mosaic_gpu"] = params;
  }
  return opts;
}

void require_tpu_interpret(const std::string& example, const RunOptions& opts) {
  if (opts.backend != "tpu-interpret")
    throw UsageError(example + " needs the TPU interpret mode (--backend tpu-interpret): its "
                     "kernel uses DMAs and semaphores of the simulated TPU; got backend '" +
                     opts.backend + "'");
}

int devices_or_default(const std::string& example, const RunOptions& opts, int default_devices,
                       int min_devices) {
  const int n = opts.devices == 0 ? default_devices : opts.devices;
  if (n < min_devices || n > 64)
    throw UsageError(example + ": --devices must be between " + std::to_string(min_devices) +
                     " and 64, got " + std::to_string(n));
  return n;
}

int cores_or_default(const std::string& example, const RunOptions& opts, int default_cores) {
  const int n = opts.cores == 0 ? default_cores : opts.cores;
  if (n < 1 || n > 16)
    throw UsageError(example + ": --cores must be between 1 and 16, got " + std::to_string(n));
  return n;
}

std::vector<Array> split_rows(const Array& a, int64_t n) {
  PALLAS_INTERNAL_CHECK(a.rank() >= 1 && a.dim(0) % n == 0, "split_rows: uneven shards");
  Shape shard = a.shape();
  shard[0] /= n;
  const size_t bytes = static_cast<size_t>(a.nbytes() / n);
  std::vector<Array> parts;
  for (int64_t d = 0; d < n; ++d) {
    Array part(shard, a.dtype());
    std::memcpy(part.raw_data(), static_cast<const std::byte*>(a.raw_data()) + d * bytes, bytes);
    parts.push_back(part);
  }
  return parts;
}

Array concat_rows(const std::vector<Array>& parts) {
  Shape shape = parts.at(0).shape();
  shape[0] *= static_cast<int64_t>(parts.size());
  Array out(shape, parts[0].dtype());
  auto* dst = static_cast<std::byte*>(out.raw_data());
  for (const Array& p : parts) {
    PALLAS_INTERNAL_CHECK(p.shape_dtype() == parts[0].shape_dtype(), "concat_rows: shard shapes differ");
    std::memcpy(dst, p.raw_data(), static_cast<size_t>(p.nbytes()));
    dst += p.nbytes();
  }
  return out;
}

std::function<std::vector<Array>(const std::vector<Array>&)> mesh_runner(PallasCall call,
                                                                          std::string axis,
                                                                          int64_t n) {
  return [call, axis, n](const std::vector<Array>& inputs) {
    std::vector<std::vector<Array>> args;
    for (const Array& shard : split_rows(inputs.at(0), n)) args.push_back({shard});
    std::vector<std::vector<Array>> outs = tpu::run_on_mesh(call, tpu::Mesh{{axis}, {n}}, args);
    std::vector<Array> per_device;
    for (const std::vector<Array>& o : outs) per_device.push_back(o.at(0));
    return std::vector<Array>{concat_rows(per_device)};
  };
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

Problem square_matmul_problem(const std::string& name, const RunOptions& opts, int64_t n, PallasCall call,
                              Tolerance tolerance) {
  auto blas = [](const std::vector<Array>& in) -> std::vector<Array> {
    const Array x = in.at(0).astype(DType::F32), y = in.at(1).astype(DType::F32);
    const int m = static_cast<int>(x.dim(0)), k = static_cast<int>(x.dim(1)), cols = static_cast<int>(y.dim(1));
    Array z({m, cols}, DType::F32);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, cols, k, 1.0f, x.data<float>(), k, y.data<float>(), cols,
                0.0f, z.data<float>(), cols);
    return {z};
  };
  return Problem{
      .name = name,
      .signature = std::string(dtype_name(opts.dtype)) + dims({n, n}) + "x" + dims({n, n}),
      .backend = opts.backend,
      .call = std::move(call),
      .inputs = opts.with_inputs ? std::vector<Array>{Array::random_normal({n, n}, opts.dtype, input_seed(opts, 0)),
                                                      Array::random_normal({n, n}, opts.dtype, input_seed(opts, 1))}
                                 : std::vector<Array>{},
      .reference = blas,
      .tolerance = tolerance,
      .flops = 2 * n * n * n,
      .bytes = 2 * n * n * itemsize(opts.dtype) + n * n * 4,
      .throughput = Throughput::Flops,
  };
}

std::string dims(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

void for_each_subcore_chunk(int64_t chunks, int subcores, int64_t workers,
                            const std::function<void(Value)>& body) {
  const Value w = tpu::axis_index("core") * subcores + tpu::axis_index("subcore");
  // ceil((chunks - w) / workers), never negative as w < workers.
  const Value mine = (static_cast<int32_t>(chunks) - w + static_cast<int32_t>(workers - 1)) /
                     static_cast<int32_t>(workers);
  fori_loop(0, mine, [&](Value j) { body(w + j * static_cast<int32_t>(workers)); });
}

namespace {

// softmax(q k^T / sqrt(d)) v of each head, in double (k and v may be longer than q).
std::vector<Array> attention_reference(const std::vector<Array>& in) {
  const std::vector<double> q = in[0].to_doubles(), k = in[1].to_doubles(), v = in[2].to_doubles();
  const int64_t heads = in[0].dim(0), s_len = in[0].dim(1), t_len = in[1].dim(1), d = in[0].dim(2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  Array out({heads, s_len, d}, DType::F64);
  double* o = out.data<double>();
  std::vector<double> p(static_cast<size_t>(t_len));
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < s_len; ++i) {
      const double* qi = &q[static_cast<size_t>((h * s_len + i) * d)];
      double m = -std::numeric_limits<double>::infinity(), l = 0;
      for (int64_t j = 0; j < t_len; ++j) {
        const double* kj = &k[static_cast<size_t>((h * t_len + j) * d)];
        double s = 0;
        for (int64_t c = 0; c < d; ++c) s += qi[c] * kj[c];
        p[static_cast<size_t>(j)] = s * scale;
        m = std::max(m, s * scale);
      }
      for (int64_t j = 0; j < t_len; ++j) l += p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - m);
      for (int64_t c = 0; c < d; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < t_len; ++j) acc += p[static_cast<size_t>(j)] * v[static_cast<size_t>((h * t_len + j) * d + c)];
        o[(h * s_len + i) * d + c] = acc / l;
      }
    }
  return {out};
}

}  // namespace

Problem attention_problem(const std::string& name, const RunOptions& opts, const Shape& shape, PallasCall call) {
  const DType dt = opts.dtype;
  const int64_t heads = shape.at(0), seq = shape.at(1), d = shape.at(2);
  return Problem{
      .name = name,
      .signature = std::string(dtype_name(dt)) + dims(shape) + "x3",
      .backend = opts.backend,
      .call = std::move(call),
      .inputs = {Array::random_normal(shape, dt, input_seed(opts, 0)), Array::random_normal(shape, dt, input_seed(opts, 1)),
                 Array::random_normal(shape, dt, input_seed(opts, 2))},
      .reference = attention_reference,
      // f32: exp and f32 sums over the sequence. 16-bit inputs: p is rounded to them for its
      // product with v (half an ulp, 2^-9 for bf16, on each weight) and so is the output.
      .tolerance = dt == DType::F32 ? Tolerance{1e-4, 1e-5} : Tolerance{2e-2, 1e-2},
      .flops = 4 * heads * seq * seq * d,
      .bytes = 4 * num_elements(shape) * itemsize(dt),
      .throughput = Throughput::Flops,
  };
}

}  // namespace pallas::examples
