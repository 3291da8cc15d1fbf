// Deterministic random numbers (private to the library; tests use it directly).
//
// Everything here uses only integer operations and IEEE-754 +, -, *, / and sqrt, which are
// exactly specified, so the same seed gives the same bits on every platform. (libm's log,
// sin and cos are not correctly rounded and differ between C libraries, hence det_log and
// det_sincos_2pi.) Assumes the compiler does not contract a*b+c into FMA; GCC does not in
// ISO mode (-std=c++20, which this project uses).
#pragma once

#include <cstdint>

namespace pallas::detail {

// SplitMix64 (Steele, Lea, Flood 2014): advances `state` and returns the next output.
uint64_t splitmix64(uint64_t& state);

// xoshiro256** 1.0 (Blackman, Vigna 2018), seeded with four SplitMix64 outputs.
class Xoshiro256ss {
 public:
  explicit Xoshiro256ss(uint64_t seed);
  Xoshiro256ss(uint64_t s0, uint64_t s1, uint64_t s2, uint64_t s3) : s_{s0, s1, s2, s3} {}
  uint64_t next();
  // Uniform in [0, 1): the top 53 bits times 2^-53.
  double next_double();
  // Uniform integer in [0, n), unbiased (rejection); n > 0.
  uint64_t next_below(uint64_t n);
  // next_below(n) rejects the draws below this (2^64 mod n): every residue is equally likely.
  static uint64_t rejection_threshold(uint64_t n) { return (0 - n) % n; }
  // Advances the generator exactly as next_below(n) would, without the result, given
  // rejection_threshold(n) (a fill skipping many values computes it once).
  void skip_below(uint64_t n_threshold);

 private:
  uint64_t s_[4];
};

// The most threads Array::random_normal / random_uniform fill an array with (0: the cores); the
// values do not depend on it. Tests set it to reach more ranges than CI's cores give.
int& random_fill_threads();

// Natural logarithm of a finite, positive, normal x; accurate to a few ulp.
double det_log(double x);
// sin and cos of 2*pi*u for u in [0, 1); accurate to a few ulp.
void det_sincos_2pi(double u, double* sin_out, double* cos_out);

}  // namespace pallas::detail
