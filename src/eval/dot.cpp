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
#include <cstddef>
#include <memory>
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

// Per-thread scratch for the float path's temporaries that never leave dot_general: widened
// operands and the f32/f64 result before it is rounded to the result dtype. Array buffers are
// fresh, zero-filled memory, and at 512^3 the page faults and memsets of three 1 MB temporaries
// cost ~10% next to the GEMM itself; reused scratch costs nothing after the first call.
// Scratch above kKeepBytes is dropped after the call, so one huge product does not pin its
// memory for the thread's lifetime. dot_general never calls itself, so one set per thread is
// enough.
class Scratch {
 public:
  static constexpr size_t kKeepBytes = size_t{64} << 20;
  void* get(size_t bytes) {
    if (bytes > cap_) {
      buf_.reset();  // free first: never hold the old and the new buffer at once
      buf_.reset(new std::byte[bytes]);  // uninitialized: every byte is written before use
      cap_ = bytes;
    }
    return buf_.get();
  }
  void trim() {
    if (cap_ > kKeepBytes) {
      buf_.reset();
      cap_ = 0;
    }
  }

 private:
  std::unique_ptr<std::byte[]> buf_;
  size_t cap_ = 0;
};

thread_local Scratch tl_scratch[3];  // lhs, rhs, result

struct TrimScratch {  // on every exit, exceptions included
  ~TrimScratch() {
    for (Scratch& s : tl_scratch) s.trim();
  }
};

// x's elements widened to W (f32 or f64), in scratch unless x already is W. Exact, so nothing
// is rounded before the products.
template <class W> const W* widen(const Array& x, Scratch& scratch) {
  if (x.dtype() == dtype_of<W>()) return static_cast<const W*>(x.raw_data());
  W* o = static_cast<W*>(scratch.get(static_cast<size_t>(x.size()) * sizeof(W)));
  visit_dtype(x.dtype(), [&]<class T>() {
    if constexpr (std::is_floating_point_v<T> || acc::is_half_v<T>) {
      const T* p = static_cast<const T*>(x.raw_data());
      const int64_t n = x.size();
      int64_t i = 0;
      // Blocks of a fixed 16 elements: at -O2 GCC only vectorizes loops whose vector code
      // replaces the scalar code entirely, which a constant trip count allows (bf16 -> f32
      // becomes a few shuffles per 16 elements instead of one shift each).
      for (; i + 16 <= n; i += 16)
        for (int64_t k = 0; k < 16; ++k) o[i + k] = static_cast<W>(acc::load(p[i + k]));
      for (; i < n; ++i) o[i] = static_cast<W>(acc::load(p[i]));
    } else {
      throw InternalError("dot_general: widen of a non-float");
    }
  });
  return o;
}

// The W result at p converted to `to`: f32 -> bf16/f16 here (the mixed-precision case), every
// other pair through Array::astype (convert's rules: one rounding, float -> int saturates).
template <class W> Array narrow(const W* p, const Shape& shape, DType to) {
  const int64_t n = num_elements(shape);
  if constexpr (std::is_same_v<W, float>) {
    if (to == DType::BF16 || to == DType::F16) {
      Array out(shape, to);
      auto* o = static_cast<uint16_t*>(out.raw_data());
      if (to == DType::BF16) {
        int64_t i = 0;
        for (; i + 16 <= n; i += 16)  // fixed-size blocks vectorize at -O2 (see widen)
          for (int64_t k = 0; k < 16; ++k) o[i + k] = acc::f32_to_bf16_bits(p[i + k]);
        for (; i < n; ++i) o[i] = acc::f32_to_bf16_bits(p[i]);
      } else {
        for (int64_t i = 0; i < n; ++i) o[i] = float_to_f16_bits(p[i]);
      }
      return out;
    }
  }
  // astype only reads its source: the const_cast never leads to a write.
  return Array::wrap(const_cast<W*>(p), shape, dtype_of<W>(), [] {}).astype(to);
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

int blas_int(int64_t v) {
  if (v > INT_MAX) throw NotSupportedError("dot_general: dimension " + std::to_string(v) +
                                           " exceeds the BLAS index range");
  return static_cast<int>(v);
}

struct Dims {
  int64_t B, M, N, K;
};

// C[b] = op(A[b]) x op(B[b]) for every batch b, op = transpose where the operand is stored
// transposed.
template <class W>
void gemm(const W* ap, bool a_trans, const W* bp, bool b_trans, W* cp, const Dims& d) {
  const int M = blas_int(d.M), N = blas_int(d.N), K = blas_int(d.K);
  // Row-major leading dims: the row length of the matrix as stored (at least 1 for BLAS).
  const int lda = std::max(1, a_trans ? M : K);
  const int ldb = std::max(1, b_trans ? K : N);
  const int ldc = std::max(1, N);
  const CBLAS_TRANSPOSE ta = a_trans ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = b_trans ? CblasTrans : CblasNoTrans;
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

// The float path: layout (in the operands' own dtype, so a needed permutation moves the fewest
// bytes), widening to W, one GEMM per batch, then one rounding to the result dtype.
template <class W>
Array float_dot(const Operand& a, const Operand& b, const Dims& d, const Shape& out_shape,
                DType out_dtype) {
  TrimScratch trim;
  const W* ap = widen<W>(a.holder, tl_scratch[0]);
  const W* bp = widen<W>(b.holder, tl_scratch[1]);
  if (out_dtype == dtype_of<W>()) {
    Array c(out_shape, out_dtype);
    gemm<W>(ap, a.trans, bp, b.trans, static_cast<W*>(c.raw_data()), d);
    return c;
  }
  W* cp = static_cast<W*>(tl_scratch[2].get(static_cast<size_t>(d.B * d.M * d.N) * sizeof(W)));
  gemm<W>(ap, a.trans, bp, b.trans, cp, d);
  return narrow<W>(cp, out_shape, out_dtype);
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
    const Operand a = arrange(lhs, lb, lf, lc, true);
    const Operand b = arrange(rhs, rb, rc, rf, true);
    if (in == DType::F64 || out_dtype == DType::F64)
      return float_dot<double>(a, b, d, out_shape, out_dtype);
    return float_dot<float>(a, b, d, out_shape, out_dtype);
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
  return acc_dtype == out_dtype ? c : c.astype(out_dtype);
}

}  // namespace pallas::eval
