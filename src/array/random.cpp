// Array::random_normal / random_uniform on a platform-independent generator (see prng.h).
#include <algorithm>
#include <bit>
#include <cmath>
#include <thread>
#include <vector>

#include "array/float_format.h"
#include "array/prng.h"
#include "pallas/array.h"

namespace pallas {
namespace detail {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Xoshiro256ss::Xoshiro256ss(uint64_t seed) {
  // SplitMix64 is a bijection of its counter, so the four words are never all zero
  // (the one state xoshiro cannot leave).
  for (uint64_t& s : s_) s = splitmix64(seed);
}

uint64_t Xoshiro256ss::next() {
  const uint64_t result = std::rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = std::rotl(s_[3], 45);
  return result;
}

double Xoshiro256ss::next_double() {
  return static_cast<double>(next() >> 11) * 0x1p-53;  // exact: a 53-bit integer times 2^-53
}

int& random_fill_threads() {
  static int threads = 0;
  return threads;
}

uint64_t Xoshiro256ss::next_below(uint64_t n) {
  const uint64_t threshold = rejection_threshold(n);
  for (;;) {
    const uint64_t x = next();
    if (x >= threshold) return x % n;
  }
}

void Xoshiro256ss::skip_below(uint64_t n_threshold) {
  while (next() < n_threshold) {
  }
}

double det_log(double x) {
  // x = m * 2^e with m in [sqrt(1/2), sqrt(2)); log(m) = 2 atanh(s), s = (m-1)/(m+1),
  // |s| <= 0.172, by its odd series up to s^27 (the next term is below 1e-19 relative).
  uint64_t bits = std::bit_cast<uint64_t>(x);
  int e = static_cast<int>((bits >> 52) & 0x7FF) - 1023;
  bits = (bits & ((uint64_t{1} << 52) - 1)) | (uint64_t{1023} << 52);  // m in [1, 2)
  double m = std::bit_cast<double>(bits);
  if (m > 1.4142135623730951) {
    m *= 0.5;  // exact
    ++e;
  }
  const double s = (m - 1) / (m + 1);  // m - 1 is exact (Sterbenz)
  const double z = s * s;
  double p = 1.0 / 27;
  for (int k = 25; k >= 1; k -= 2) p = p * z + 1.0 / k;
  constexpr double kLn2 = 0.6931471805599453;
  return e * kLn2 + 2 * s * p;
}

void det_sincos_2pi(double u, double* sin_out, double* cos_out) {
  // 2*pi*u = q*(pi/2) + r*(pi/2) with q = floor(4u), r in [0, 1); 4u and r are exact.
  // Fold r into [0, 1/2] (sin and cos swap under pi/2 - x) so the angle is at most pi/4,
  // where the Taylor series below converge to well under an ulp.
  const double t = 4 * u;
  const int q = static_cast<int>(t) & 3;
  const double r = t - static_cast<int>(t);
  const bool folded = r > 0.5;
  constexpr double kHalfPi = 1.5707963267948966;
  const double x = (folded ? 1 - r : r) * kHalfPi;
  const double x2 = x * x;
  double sp = 0, cp = 0;  // Horner, highest term first: sin up to x^19, cos up to x^20
  for (int n = 19; n >= 3; n -= 2) sp = (sp + 1) * x2 / ((n - 1) * n) * -1;  // -x^2/((n-1)n)
  const double sx = x * (1 + sp);
  for (int n = 20; n >= 2; n -= 2) cp = (cp + 1) * x2 / ((n - 1) * n) * -1;
  const double cx = 1 + cp;
  const double s0 = folded ? cx : sx;
  const double c0 = folded ? sx : cx;
  switch (q) {
    case 0: *sin_out = s0; *cos_out = c0; break;
    case 1: *sin_out = c0; *cos_out = -s0; break;
    case 2: *sin_out = -s0; *cos_out = -c0; break;
    default: *sin_out = -c0; *cos_out = s0; break;
  }
}

}  // namespace detail

namespace {

void check_random_dtype(DType dtype, const char* who) {
  if (is_semaphore(dtype))
    throw Error(std::string(who) + ": cannot fill a " + std::string(dtype_name(dtype)) + " array");
}

void store(Array& a, int64_t k, const Scalar& s) {
  s.store_to(static_cast<unsigned char*>(a.raw_data()) + k * itemsize(a.dtype()));
}

// The largest value of the float dtype t that is < hi.
double largest_below(double hi, DType t) {
  const detail::FloatFormat fmt = t == DType::F16    ? detail::kF16Format
                                  : t == DType::BF16 ? detail::kBF16Format
                                  : t == DType::F32  ? detail::kF32Format
                                                     : detail::kF64Format;
  double c = Scalar::from_double(hi, t).f;
  if (c < hi) return c;
  uint64_t b = detail::double_to_format_bits(c, fmt);
  const uint64_t sign = uint64_t{1} << (fmt.exp_bits + fmt.mant_bits);
  if (c > 0) --b;            // next smaller magnitude
  else if (c == 0) b = sign | 1;  // the negative subnormal nearest zero
  else ++b;                  // next larger magnitude, negative
  return detail::format_bits_to_double(b, fmt);
}

// Fills units [0, units) of an array from the one serial stream `rng`, in ranges on several
// threads, with the values a serial fill would give whatever the number of threads. `skip`
// steps a generator over one unit exactly as `fill` draws from it, which is cheap next to
// fill's work (a normal's log, sin and cos and its rounding cost ~50x the two draws), so this
// thread walks the stream to each range's start and hands its thread a copy of the generator.
template <class Skip, class Fill>
void fill_from_stream(int64_t units, detail::Xoshiro256ss rng, Skip skip, Fill fill) {
  constexpr int64_t kMinUnitsPerThread = int64_t{1} << 16;  // below this, a thread costs more
  const int forced = detail::random_fill_threads();
  const int64_t cores = std::clamp<int64_t>(forced > 0 ? forced : std::thread::hardware_concurrency(), 1, 64);
  const int64_t threads = std::clamp<int64_t>(units / kMinUnitsPerThread, 1, cores);
  std::vector<std::thread> workers;
  workers.reserve(static_cast<size_t>(threads - 1));  // (so that adding a thread cannot throw past the others)
  int64_t begin = 0;
  for (int64_t t = 0; t < threads; ++t) {
    const int64_t end = units * (t + 1) / threads;
    if (t + 1 == threads) {
      fill(begin, end, rng);
    } else {
      try {
        workers.emplace_back(fill, begin, end, rng);
      } catch (...) {  // no thread to be had (system_error, bad_alloc): this range here, serially
        fill(begin, end, rng);
      }
      for (int64_t u = begin; u < end; ++u) skip(rng);
    }
    begin = end;
  }
  for (std::thread& w : workers) w.join();
}

}  // namespace

Array Array::random_normal(Shape shape, DType dtype, uint64_t seed, double mean, double stddev) {
  check_random_dtype(dtype, "Array::random_normal");
  Array a(std::move(shape), dtype);
  // Box-Muller: two uniforms give two independent normals, values 2p and 2p + 1 of the array.
  // u1 in (0, 1] keeps log finite.
  const int64_t n = a.size();
  const auto fill = [&a, n, mean, stddev](int64_t first_pair, int64_t end_pair,
                                          detail::Xoshiro256ss rng) {
    for (int64_t k = 2 * first_pair; k < 2 * end_pair && k < n; k += 2) {
      const double u1 = static_cast<double>((rng.next() >> 11) + 1) * 0x1p-53;
      const double u2 = rng.next_double();
      const double radius = std::sqrt(-2 * detail::det_log(u1));  // sqrt is correctly rounded
      double s, c;
      detail::det_sincos_2pi(u2, &s, &c);
      store(a, k, Scalar::from_double(mean + stddev * (radius * c), a.dtype()));
      if (k + 1 < n) store(a, k + 1, Scalar::from_double(mean + stddev * (radius * s), a.dtype()));
    }
  };
  const auto skip = [](detail::Xoshiro256ss& rng) {
    rng.next();
    rng.next();
  };
  fill_from_stream((n + 1) / 2, detail::Xoshiro256ss(seed), skip, fill);
  return a;
}

Array Array::random_uniform(Shape shape, DType dtype, uint64_t seed, double lo, double hi) {
  check_random_dtype(dtype, "Array::random_uniform");
  const std::string range = "[" + Scalar::of_float(lo, DType::F64).to_string() + ", " +
                            Scalar::of_float(hi, DType::F64).to_string() + ")";
  if (!(std::isfinite(lo) && std::isfinite(hi) && lo < hi))
    throw Error("Array::random_uniform: need finite lo < hi, got " + range);
  Array a(std::move(shape), dtype);
  const detail::Xoshiro256ss rng(seed);
  if (is_float(dtype)) {
    // Rounding to a narrow dtype can round up to hi itself; cap so the range stays [lo, hi).
    const double cap = largest_below(hi, dtype);
    const auto fill = [&a, lo, hi, cap](int64_t begin, int64_t end, detail::Xoshiro256ss rng) {
      for (int64_t k = begin; k < end; ++k) {
        const double v = Scalar::from_double(lo + (hi - lo) * rng.next_double(), a.dtype()).f;
        store(a, k, Scalar::of_float(std::min(v, cap), a.dtype()));
      }
    };
    fill_from_stream(a.size(), rng, [](detail::Xoshiro256ss& r) { r.next(); }, fill);
    return a;
  }
  // Integers (and bools, as 0 / 1): uniform over the integers n with lo <= n < hi.
  const double first = std::ceil(lo), end = std::ceil(hi);
  const int w = dtype == DType::Bool ? 1 : bit_width(dtype);
  const double min = is_signed_int(dtype) ? -std::ldexp(1.0, w - 1) : 0.0;
  const double limit = is_signed_int(dtype) ? std::ldexp(1.0, w - 1) : std::ldexp(1.0, w);
  if (first >= end)
    throw Error("Array::random_uniform: no integers in " + range);
  if (first < min || end > limit)
    throw Error("Array::random_uniform: " + range + " does not fit in " +
                std::string(dtype_name(dtype)));
  const double count = end - first;
  const bool full = count >= 0x1p64;  // all 2^64 patterns (u64 or i64 over their whole range)
  const uint64_t n = full ? 0 : static_cast<uint64_t>(count);
  // The first integer as a two's complement pattern; adding offsets wraps correctly.
  const uint64_t base = first < 0 ? 0 - static_cast<uint64_t>(-first) : static_cast<uint64_t>(first);
  const auto fill = [&a, full, n, base](int64_t begin, int64_t end, detail::Xoshiro256ss rng) {
    for (int64_t k = begin; k < end; ++k) {
      const uint64_t offset = full ? rng.next() : rng.next_below(n);
      store(a, k, Scalar::of_uint(base + offset, DType::U64).convert_to(a.dtype()));
    }
  };
  const uint64_t threshold = full ? 0 : detail::Xoshiro256ss::rejection_threshold(n);
  const auto skip = [full, threshold](detail::Xoshiro256ss& r) {
    if (full) r.next();
    else r.skip_below(threshold);
  };
  fill_from_stream(a.size(), rng, skip, fill);
  return a;
}

}  // namespace pallas
