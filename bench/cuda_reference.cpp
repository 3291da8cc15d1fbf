#include "bench/cuda_reference.h"

#include <dlfcn.h>

#include <stdexcept>

#include "gpu/cuda_libs.h"
#include "gpu/driver.h"

namespace bench {

namespace {
// cublas_api.h's values.
constexpr int kOpN = 0, kR16BF = 14, kR32F = 0, kCompute32F = 68, kGemmDefault = -1;

struct Loaded {
  void* handle = nullptr;
  void* gemm_ex = nullptr;
  std::string why;
};

const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded r;
    if (std::string why = pallas::gpu::driver_unavailable_reason(); !why.empty()) {
      r.why = why;
      return r;
    }
    pallas::gpu::Device::get();  // the primary context, current: cuBLAS's runtime shares it
    void* lib = nullptr;
    for (const char* name : {"libcublas.so.13", "libcublas.so.12", "/usr/local/cuda/lib64/libcublas.so.13",
                             "/usr/local/cuda/lib64/libcublas.so.12"})
      if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
    if (!lib) {
      r.why = "libcublas.so.13 / .12 not found";
      return r;
    }
    auto create = reinterpret_cast<int (*)(void**)>(dlsym(lib, "cublasCreate_v2"));
    r.gemm_ex = dlsym(lib, "cublasGemmEx");
    if (!create || !r.gemm_ex) {
      r.why = "libcublas lacks cublasCreate_v2 or cublasGemmEx";
      return r;
    }
    if (int rc = create(&r.handle); rc != 0) r.why = "cublasCreate failed: status " + std::to_string(rc);
    return r;
  }();
  return l;
}
}  // namespace

std::string Cublas::unavailable_reason() { return loaded().why; }

Cublas& Cublas::get() {
  static Cublas* c = [] {
    const Loaded& l = loaded();
    if (!l.why.empty()) throw std::runtime_error("cuBLAS: " + l.why);
    auto* c = new Cublas;
    c->handle_ = l.handle;
    c->gemm_ex_ = reinterpret_cast<decltype(c->gemm_ex_)>(l.gemm_ex);
    return c;
  }();
  return *c;
}

void Cublas::gemm_bf16_f32(int64_t m, int64_t n, int64_t k, uint64_t a, uint64_t b, uint64_t c) {
  // Column-major cuBLAS computes C^T = B^T A^T, which is row-major C = A B.
  const float alpha = 1.0f, beta = 0.0f;
  int rc = gemm_ex_(handle_, kOpN, kOpN, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha,
                    reinterpret_cast<const void*>(b), kR16BF, static_cast<int>(n), reinterpret_cast<const void*>(a),
                    kR16BF, static_cast<int>(k), &beta, reinterpret_cast<void*>(c), kR32F, static_cast<int>(n),
                    kCompute32F, kGemmDefault);
  if (rc != 0) throw std::runtime_error("cublasGemmEx failed: status " + std::to_string(rc));
}

void plain_copy_kernel(uint64_t dst, uint64_t src, int64_t bytes) {
  static void* fn = [] {
    const char* source = R"(
struct __align__(16) V16 { unsigned long long lo, hi; };
extern "C" __global__ void plain_copy(const V16* __restrict__ src, V16* __restrict__ dst, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    dst[i] = src[i];
}
)";
    pallas::gpu::Device& d = pallas::gpu::Device::get();
    return pallas::gpu::load_entry(pallas::gpu::Nvrtc::get().compile(source, "plain_copy", d.arch()).image, "plain_copy");
  }();
  long long n = bytes / 16;
  void* params[] = {&src, &dst, &n};
  const unsigned blocks = static_cast<unsigned>(pallas::gpu::Device::get().multiprocessors()) * 8;
  pallas::gpu::launch_plain(fn, blocks, 256, params, nullptr);
}

}  // namespace bench
