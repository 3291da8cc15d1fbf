// What the GPU benchmark compares our kernels with, in the same process on the same data: cuBLAS
// (loaded with dlopen, like the driver: the library never links it) and a plain CUDA copy kernel.
#pragma once
#include <cstdint>
#include <string>

namespace bench {

// cuBLAS's row-major C[m,n] (f32) = A[m,k] (bf16) . B[k,n] (bf16), f32 accumulation
// (cublasGemmEx, CUBLAS_COMPUTE_32F), on the default stream; returns without waiting.
class Cublas {
 public:
  // Empty when libcublas loads and a handle is made; else why not.
  static std::string unavailable_reason();
  static Cublas& get();
  void gemm_bf16_f32(int64_t m, int64_t n, int64_t k, uint64_t a, uint64_t b, uint64_t c);

 private:
  Cublas() = default;
  void* handle_ = nullptr;
  int (*gemm_ex_)(void*, int, int, int, int, int, const void*, const void*, int, int, const void*, int, int,
                  const void*, void*, int, int, int, int) = nullptr;
};

// A grid-stride copy of `bytes` (a multiple of 16) from src to dst in 16-byte vectors, compiled
// with NVRTC for this device; returns without waiting.
void plain_copy_kernel(uint64_t dst, uint64_t src, int64_t bytes);

}  // namespace bench
