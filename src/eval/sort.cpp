// sort: stable, along the last axis, lexicographic over the first num_keys operands; the other
// operands are permuted alongside.
//
// Every key element is first mapped to an int64 whose signed order is the key's total order, so
// the comparator is the same cheap integer comparison for every dtype:
//  * floats: the sign-magnitude bit pattern, read as a two's-complement integer of the same
//    width, with the magnitude bits flipped when negative. This gives
//    -NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN (lax.sort's total order);
//  * u64: the top bit flipped (so 2^63.. sort above 0..2^63-1 in signed order);
//  * other integers and bool: their value.
#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "eval/eval.h"

namespace pallas::eval {

namespace {

template <class S, class U> int64_t float_key(U bits) {
  // S: the signed integer of the float's width; U: its unsigned bit pattern.
  const S i = static_cast<S>(bits);
  const S flipped = static_cast<S>(i ^ std::numeric_limits<S>::max());
  return i < 0 ? flipped : i;
}

template <class T> int64_t key_of(const T& v) {
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
    return float_key<int16_t>(v.bits);
  } else if constexpr (std::is_same_v<T, float>) {
    uint32_t b;
    std::memcpy(&b, &v, sizeof b);
    return float_key<int32_t>(b);
  } else if constexpr (std::is_same_v<T, double>) {
    uint64_t b;
    std::memcpy(&b, &v, sizeof b);
    return float_key<int64_t>(b);
  } else if constexpr (std::is_same_v<T, uint64_t>) {
    return static_cast<int64_t>(v ^ (uint64_t{1} << 63));
  } else {
    return static_cast<int64_t>(v);
  }
}

std::vector<int64_t> keys_of(const Array& x) {
  return visit_dtype(x.dtype(), [&]<class T>() {
    const T* p = static_cast<const T*>(x.raw_data());
    std::vector<int64_t> k(static_cast<size_t>(x.size()));
    for (size_t i = 0; i < k.size(); ++i) k[i] = key_of(p[i]);
    return k;
  });
}

// dst[i] = src[perm[i]] for one row of elements of size E.
template <int E> void gather_row(std::byte* dst, const std::byte* src, const std::vector<int64_t>& perm) {
  for (size_t i = 0; i < perm.size(); ++i)
    std::memcpy(dst + static_cast<int64_t>(i) * E, src + perm[i] * E, E);
}

void gather(std::byte* dst, const std::byte* src, const std::vector<int64_t>& perm, int esize) {
  switch (esize) {
    case 1: return gather_row<1>(dst, src, perm);
    case 2: return gather_row<2>(dst, src, perm);
    case 4: return gather_row<4>(dst, src, perm);
    case 8: return gather_row<8>(dst, src, perm);
    default: throw InternalError("sort: unsupported element size");
  }
}

}  // namespace

std::vector<Array> sort(std::span<const Array> operands, const ir::Attrs& attrs) {
  if (operands.empty()) throw InternalError("sort: no operands");
  const auto num_keys = static_cast<size_t>(attrs.get_int(ir::AttrKey::NumKeys));
  const bool descending = attrs.get_int_or(ir::AttrKey::Descending, 0) != 0;
  const Shape& shape = operands[0].shape();
  if (shape.empty()) throw InternalError("sort: cannot sort a scalar");
  const int64_t n = shape.back();
  const int64_t total = operands[0].size();
  std::vector<Array> out;
  for (const Array& x : operands) out.emplace_back(x.shape(), x.dtype());
  if (total == 0) return out;

  std::vector<std::vector<int64_t>> keys;
  for (size_t k = 0; k < num_keys; ++k) keys.push_back(keys_of(operands[k]));

  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t row = 0; row < total / n; ++row) {
    const int64_t base = row * n;
    std::iota(perm.begin(), perm.end(), int64_t{0});
    // Strict weak order on positions within the row. Descending flips the comparison (not the
    // sorted result), so equal keys keep their original order in both directions.
    auto less = [&](int64_t a, int64_t b) {
      for (const std::vector<int64_t>& key : keys) {
        const int64_t ka = key[static_cast<size_t>(base + a)];
        const int64_t kb = key[static_cast<size_t>(base + b)];
        if (ka != kb) return descending ? ka > kb : ka < kb;
      }
      return false;
    };
    std::stable_sort(perm.begin(), perm.end(), less);
    for (size_t i = 0; i < operands.size(); ++i) {
      const int esize = itemsize(operands[i].dtype());
      gather(static_cast<std::byte*>(out[i].raw_data()) + base * esize,
             static_cast<const std::byte*>(operands[i].raw_data()) + base * esize, perm, esize);
    }
  }
  return out;
}

}  // namespace pallas::eval
