// dot_general: operands are brought to [B, M, K] x [B, K, N] (B = batch dims, M / N = the free
// dims of lhs / rhs, K = the contracting dims, each group flattened in the order the attributes
// give), then multiplied batch by batch.
//
// * Layout: an operand whose dims already lie in memory in that order is used in place; one laid
//   out as [B, K, M] (lhs) or [B, N, K] (rhs) is also used in place through BLAS's transpose
//   flag; anything else is permuted once into [B, M, K] / [B, K, N] with a strided copy.
// * Floats: f32, f16 and bf16 inputs compute with cblas_sgemm (f16/bf16 widened to f32 exactly,
//   products and sums in f32); f64 inputs, or an f64 result, use cblas_dgemm. The result is
//   rounded once to the result dtype (to nearest even for f16/bf16).
// * Integers: plain loops. With an integer result, inputs are converted to the result dtype
//   (wrapping, as convert does) and products accumulate in it with two's-complement wraparound;
//   with a float result, they accumulate in 64 bits and are converted (rounded) once at the end.
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <vector>

#include "eval/accumulate.h"
#include "eval/eval.h"
#include "eval/strided.h"

namespace pallas::eval {

namespace {

using ir::Ints;

// An operand in [B, rows, cols] (trans = false) or [B, cols, rows] (trans = true) row-major
// layout, with whatever array owns that memory.
struct Operand {
  Array holder;
  bool trans = false;
};

// Whether visiting x's dims in `order` visits them in memory (row-major) order. Size-1 dims do
// not move any element, so they may sit anywhere.
bool in_memory_order(const Shape& s, const Ints& order) {
  int64_t last = -1;
  for (int64_t d : order) {
    if (s[static_cast<size_t>(d)] == 1) continue;
    if (d < last) return false;
    last = d;
  }
  return true;
}

Ints concat(const Ints& a, const Ints& b, const Ints& c) {
  Ints r = a;
  r.insert(r.end(), b.begin(), b.end());
  r.insert(r.end(), c.begin(), c.end());
  return r;
}

Operand arrange(const Array& x, const Ints& batch, const Ints& rows, const Ints& cols,
                bool allow_trans) {
  const Ints straight = concat(batch, rows, cols);
  if (in_memory_order(x.shape(), straight)) return {x, false};
  if (allow_trans && in_memory_order(x.shape(), concat(batch, cols, rows))) return {x, true};
  return {permute_copy(x, straight), false};
}

// Float operand widened to W (f32 or f64); exact, so no rounding happens before the products.
template <class W> Array widen(const Array& x) {
  if (x.dtype() == dtype_of<W>()) return x;
  Array out(x.shape(), dtype_of<W>());
  W* o = static_cast<W*>(out.raw_data());
  visit_dtype(x.dtype(), [&]<class T>() {
    if constexpr (std::is_floating_point_v<T> || acc::is_half_v<T>) {
      const T* p = static_cast<const T*>(x.raw_data());
      for (int64_t i = 0; i < x.size(); ++i) o[i] = static_cast<W>(acc::load(p[i]));
    } else {
      throw InternalError("dot_general: widen of a non-float");
    }
  });
  return out;
}

// Integer operand converted to A with convert's rule (wrap / sign- or zero-extend).
template <class A> Array int_convert(const Array& x) {
  if (x.dtype() == dtype_of<A>()) return x;
  Array out(x.shape(), dtype_of<A>());
  A* o = static_cast<A*>(out.raw_data());
  visit_dtype(x.dtype(), [&]<class T>() {
    if constexpr (acc::is_int_v<T>) {
      const T* p = static_cast<const T*>(x.raw_data());
      for (int64_t i = 0; i < x.size(); ++i) o[i] = static_cast<A>(p[i]);
    } else {
      throw InternalError("dot_general: int_convert of a non-integer");
    }
  });
  return out;
}

// Result in W converted to `to`: f32 -> f16/bf16 here (hot in mixed-precision use), everything
// else through Array::astype (convert's rules: single rounding, float -> int saturates).
Array narrow(const Array& r, DType to) {
  if (r.dtype() == to) return r;
  if (r.dtype() == DType::F32 && (to == DType::F16 || to == DType::BF16)) {
    Array out(r.shape(), to);
    const float* p = static_cast<const float*>(r.raw_data());
    auto* o = static_cast<uint16_t*>(out.raw_data());
    for (int64_t i = 0; i < r.size(); ++i)
      o[i] = to == DType::F16 ? float_to_f16_bits(p[i]) : float_to_bf16_bits(p[i]);
    return out;
  }
  return r.astype(to);
}

int blas_int(int64_t v) {
  if (v > INT_MAX) throw NotSupportedError("dot_general: dimension " + std::to_string(v) +
                                           " exceeds the BLAS index range");
  return static_cast<int>(v);
}

struct Dims {
  int64_t B, M, N, K;
};

template <class W>
void gemm(const Operand& a, const Operand& b, Array& c, const Dims& d) {
  const W* ap = static_cast<const W*>(a.holder.raw_data());
  const W* bp = static_cast<const W*>(b.holder.raw_data());
  W* cp = static_cast<W*>(c.raw_data());
  const int M = blas_int(d.M), N = blas_int(d.N), K = blas_int(d.K);
  // Row-major leading dims: the row length of the matrix as stored (at least 1 for BLAS).
  const int lda = std::max(1, a.trans ? M : K);
  const int ldb = std::max(1, b.trans ? K : N);
  const int ldc = std::max(1, N);
  const CBLAS_TRANSPOSE ta = a.trans ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = b.trans ? CblasTrans : CblasNoTrans;
  for (int64_t i = 0; i < d.B; ++i) {
    const W* A = ap + i * d.M * d.K;
    const W* Bm = bp + i * d.K * d.N;
    W* C = cp + i * d.M * d.N;
    if constexpr (std::is_same_v<W, float>)
      cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, A, lda, Bm, ldb, 0.0f, C, ldc);
    else
      cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, 1.0, A, lda, Bm, ldb, 0.0, C, ldc);
  }
}

// C[b] = A[b] x B[b] with A [B, M, K], B [B, K, N] row-major, wrapping arithmetic in A's width.
template <class A>
void int_gemm(const Array& a, const Array& b, Array& c, const Dims& d) {
  using P = acc::Wide<A>;  // unsigned: wraps without UB, never promotes to int
  const A* ap = static_cast<const A*>(a.raw_data());
  const A* bp = static_cast<const A*>(b.raw_data());
  A* cp = static_cast<A*>(c.raw_data());
  std::vector<P> row(static_cast<size_t>(d.N));
  for (int64_t bi = 0; bi < d.B; ++bi)
    for (int64_t m = 0; m < d.M; ++m) {
      std::fill(row.begin(), row.end(), P(0));
      const A* arow = ap + (bi * d.M + m) * d.K;
      for (int64_t k = 0; k < d.K; ++k) {
        const P av = static_cast<P>(arow[k]);
        const A* brow = bp + (bi * d.K + k) * d.N;
        // i-k-j order: the innermost loop runs over contiguous rows of B and C (vectorizes).
        for (int64_t n = 0; n < d.N; ++n) row[static_cast<size_t>(n)] += av * static_cast<P>(brow[n]);
      }
      A* crow = cp + (bi * d.M + m) * d.N;
      for (int64_t n = 0; n < d.N; ++n) crow[n] = static_cast<A>(row[static_cast<size_t>(n)]);
    }
}

}  // namespace

Array dot_general(const Array& lhs, const Array& rhs, const ir::Attrs& attrs) {
  const Ints& lc = attrs.get_ints(ir::AttrKey::LhsContracting);
  const Ints& rc = attrs.get_ints(ir::AttrKey::RhsContracting);
  const Ints& lb = attrs.get_ints(ir::AttrKey::LhsBatch);
  const Ints& rb = attrs.get_ints(ir::AttrKey::RhsBatch);
  const DType out_dtype = attrs.get_dtype(ir::AttrKey::DTypeAttr);
  const DType in = lhs.dtype();
  if (rhs.dtype() != in) throw InternalError("dot_general: operand dtypes differ");

  auto free_dims = [](const Array& x, const Ints& c, const Ints& b) {
    Ints f;
    for (int64_t d = 0; d < x.rank(); ++d)
      if (std::find(c.begin(), c.end(), d) == c.end() && std::find(b.begin(), b.end(), d) == b.end())
        f.push_back(d);
    return f;
  };
  const Ints lf = free_dims(lhs, lc, lb), rf = free_dims(rhs, rc, rb);
  auto prod = [](const Array& x, const Ints& dims) {
    int64_t p = 1;
    for (int64_t d : dims) p *= x.shape()[static_cast<size_t>(d)];
    return p;
  };
  const Dims d{prod(lhs, lb), prod(lhs, lf), prod(rhs, rf), prod(lhs, lc)};
  Shape out_shape;
  for (int64_t x : lb) out_shape.push_back(lhs.shape()[static_cast<size_t>(x)]);
  for (int64_t x : lf) out_shape.push_back(lhs.shape()[static_cast<size_t>(x)]);
  for (int64_t x : rf) out_shape.push_back(rhs.shape()[static_cast<size_t>(x)]);

  if (d.B * d.M * d.N == 0) return Array(out_shape, out_dtype);
  if (d.K == 0) return Array::zeros(out_shape, out_dtype);  // empty sums

  if (is_float(in)) {
    if (in == DType::F64 || out_dtype == DType::F64) {
      Operand a = arrange(widen<double>(lhs), lb, lf, lc, true);
      Operand b = arrange(widen<double>(rhs), rb, rc, rf, true);
      Array c(out_shape, DType::F64);
      gemm<double>(a, b, c, d);
      return narrow(c, out_dtype);
    }
    Operand a = arrange(widen<float>(lhs), lb, lf, lc, true);
    Operand b = arrange(widen<float>(rhs), rb, rc, rf, true);
    Array c(out_shape, DType::F32);
    gemm<float>(a, b, c, d);
    return narrow(c, out_dtype);
  }
  if (!is_integer(in)) throw InternalError("dot_general: needs numeric operands");
  const DType acc_dtype = is_integer(out_dtype) ? out_dtype
                          : is_signed_int(in)   ? DType::I64
                                                : DType::U64;
  Array c(out_shape, acc_dtype);
  visit_dtype(acc_dtype, [&]<class A>() {
    if constexpr (acc::is_int_v<A>) {
      Operand a = arrange(int_convert<A>(lhs), lb, lf, lc, false);
      Operand b = arrange(int_convert<A>(rhs), rb, rc, rf, false);
      int_gemm<A>(a.holder, b.holder, c, d);
    } else {
      throw InternalError("dot_general: integer accumulator expected");
    }
  });
  return narrow(c, out_dtype);
}

}  // namespace pallas::eval
