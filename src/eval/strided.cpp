#include "eval/strided.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "pallas/error.h"

namespace pallas::eval {

namespace {

// Elements are moved as E-byte blobs through memcpy: no aliasing or alignment assumptions (a
// DLPack-imported buffer is only element-aligned), and a fixed-size memcpy compiles to one
// load and one store.
template <int E>
void copy_run(std::byte* dst, const std::byte* src, int64_t n, int64_t stride) {
  if (stride == 1) {
    std::memcpy(dst, src, static_cast<size_t>(n) * E);
  } else if (stride == 0) {  // broadcast: one element repeated
    for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * E, src, E);
  } else {
    for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * E, src + i * stride * E, E);
  }
}

// The last two view dims are a transpose (source stride 1 on the outer one, not on the inner
// one): copy in square tiles so each source cache line is used for a whole tile row instead of
// one element.
template <int E>
void copy_transposed(std::byte* dst, const std::byte* src, int64_t n0, int64_t n1, int64_t s1) {
  constexpr int64_t kTile = 32;
  for (int64_t i0 = 0; i0 < n0; i0 += kTile) {
    const int64_t i1 = std::min(n0, i0 + kTile);
    for (int64_t j0 = 0; j0 < n1; j0 += kTile) {
      const int64_t j1 = std::min(n1, j0 + kTile);
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t j = j0; j < j1; ++j)
          std::memcpy(dst + (i * n1 + j) * E, src + (i + j * s1) * E, E);
    }
  }
}

template <int E>
void copy_view(std::byte* dst, const std::byte* src, const std::vector<int64_t>& shp,
               const std::vector<int64_t>& str) {
  const size_t r = shp.size();
  // Innermost block handled by one call: the last dim, or the last two for a transpose.
  const bool transposed = r >= 2 && str[r - 1] != 1 && str[r - 2] == 1;
  const size_t inner_dims = transposed ? 2 : 1;
  const size_t outer = r - inner_dims;
  const int64_t block = transposed ? shp[r - 2] * shp[r - 1] : shp[r - 1];
  std::vector<int64_t> idx(outer, 0);
  int64_t off = 0;  // element offset of the current block in the source
  for (;;) {
    if (transposed)
      copy_transposed<E>(dst, src + off * E, shp[r - 2], shp[r - 1], str[r - 1]);
    else
      copy_run<E>(dst, src + off * E, shp[r - 1], str[r - 1]);
    dst += block * E;
    // Odometer over the outer dims.
    size_t d = outer;
    for (; d > 0; --d) {
      const size_t k = d - 1;
      if (++idx[k] < shp[k]) {
        off += str[k];
        break;
      }
      off -= (shp[k] - 1) * str[k];
      idx[k] = 0;
    }
    if (d == 0) return;
  }
}

}  // namespace

void strided_copy(void* dst, const void* src, std::span<const int64_t> shape,
                  std::span<const int64_t> strides, int esize) {
  if (shape.size() != strides.size()) throw InternalError("strided_copy: rank mismatch");
  for (int64_t n : shape)
    if (n == 0) return;
  // Simplify the view: drop size-1 dims; merge a dim into the previous (outer) one when the
  // outer stride is exactly the inner dim's extent (they then walk memory as one dim). This also
  // merges broadcast dims (stride 0) and reversed contiguous dims (negative strides).
  std::vector<int64_t> shp, str;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!shp.empty() && str.back() == strides[d] * shape[d]) {
      shp.back() *= shape[d];
      str.back() = strides[d];
    } else {
      shp.push_back(shape[d]);
      str.push_back(strides[d]);
    }
  }
  if (shp.empty()) {  // a single element
    shp.push_back(1);
    str.push_back(1);
  }
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  switch (esize) {
    case 1: return copy_view<1>(d, s, shp, str);
    case 2: return copy_view<2>(d, s, shp, str);
    case 4: return copy_view<4>(d, s, shp, str);
    case 8: return copy_view<8>(d, s, shp, str);
    default: throw InternalError("strided_copy: unsupported element size " + std::to_string(esize));
  }
}

std::optional<std::vector<int64_t>> reshaped_strides(std::span<const int64_t> shape, std::span<const int64_t> strides,
                                                     std::span<const int64_t> new_shape) {
  const size_t n = new_shape.size();
  std::vector<int64_t> out(n, 0);
  // Dims of size 1 take the stride that makes them contiguous with the next dim (any would do:
  // nothing steps along them), so a reshape that only adds or drops them keeps rows uniform.
  auto fill_size_one = [&] {
    for (size_t k = n; k-- > 0;)
      if (new_shape[k] == 1) out[k] = k + 1 < n ? out[k + 1] * new_shape[k + 1] : 1;
  };
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) {  // nothing is addressed
    int64_t s = 1;
    for (size_t k = n; k-- > 0;) out[k] = s, s *= std::max<int64_t>(new_shape[k], 1);
    return out;
  }
  std::vector<int64_t> old, old_strides;  // the old dims that step
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] != 1) old.push_back(shape[d]), old_strides.push_back(strides[d]);
  // Walk matching groups: old dims [oi, oj) hold the same elements as new dims [ni, nj).
  size_t oi = 0, ni = 0;
  while (oi < old.size() && ni < n) {
    size_t oj = oi + 1, nj = ni + 1;
    int64_t op = old[oi], np = new_shape[ni];
    while (op != np) {
      if (np < op) {
        if (nj == n) return std::nullopt;  // (counts differ: the type rule prevents it)
        np *= new_shape[nj++];
      } else {
        if (oj == old.size()) return std::nullopt;
        op *= old[oj++];
      }
    }
    // The old dims of the group must be one evenly spaced run.
    for (size_t k = oi; k + 1 < oj; ++k)
      if (old_strides[k] != old_strides[k + 1] * old[k + 1]) return std::nullopt;
    out[nj - 1] = old_strides[oj - 1];
    for (size_t k = nj - 1; k > ni; --k) out[k - 1] = out[k] * new_shape[k];
    oi = oj, ni = nj;
  }
  fill_size_one();
  return out;
}

Array permute_copy(const Array& x, std::span<const int64_t> perm) {
  const std::vector<int64_t> xs = row_major_strides(x.shape());
  Shape shape(perm.size());
  std::vector<int64_t> strides(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) {
    shape[i] = x.shape()[static_cast<size_t>(perm[i])];
    strides[i] = xs[static_cast<size_t>(perm[i])];
  }
  Array out(shape, x.dtype());
  strided_copy(out.raw_data(), x.raw_data(), shape, strides, itemsize(x.dtype()));
  return out;
}

}  // namespace pallas::eval
