// allclose: elementwise comparison with tolerances, reporting the worst element.
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include "pallas/array.h"

namespace pallas {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string short_number(double v) {  // errors: 6 significant digits are plenty
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
  std::vector<int64_t> index(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    index[i] = flat % shape[i];
    flat /= shape[i];
  }
  return index;
}

}  // namespace

AllCloseResult allclose(const Array& actual, const Array& expected, double rtol, double atol,
                        bool equal_nan) {
  AllCloseResult r;
  if (actual.shape() != expected.shape()) {
    // Not comparable: no element is "worst"; errors are infinite, every element counts.
    r.ok = false;
    r.max_abs_error = kInf;
    r.max_rel_error = kInf;
    r.num_mismatched = std::max(actual.size(), expected.size());
    r.message = "shape mismatch: actual " + actual.shape_dtype().to_string() + " vs expected " +
                expected.shape_dtype().to_string();
    return r;
  }
  double worst_excess = -kInf;  // largest (error - tolerance) seen so far
  for (int64_t k = 0; k < actual.size(); ++k) {
    const double a = actual.get_flat(k);  // dtypes may differ: compare as double
    const double e = expected.get_flat(k);
    double abs_err, rel_err, excess;
    bool match;
    if (std::isnan(a) || std::isnan(e)) {
      match = std::isnan(a) && std::isnan(e) && equal_nan;
      abs_err = rel_err = match ? 0 : kInf;
      excess = match ? -kInf : kInf;
    } else if (std::isinf(a) || std::isinf(e)) {
      match = a == e;  // infinities must match exactly (same sign)
      abs_err = rel_err = match ? 0 : kInf;
      excess = match ? -kInf : kInf;
    } else {
      abs_err = std::fabs(a - e);
      const double tol = atol + rtol * std::fabs(e);
      match = abs_err <= tol;
      rel_err = e != 0 ? abs_err / std::fabs(e) : abs_err;
      excess = abs_err - tol;
    }
    if (!match) ++r.num_mismatched;
    r.max_abs_error = std::max(r.max_abs_error, abs_err);
    r.max_rel_error = std::max(r.max_rel_error, rel_err);
    // The first element with the largest excess; a mismatch always beats a match.
    if (r.worst_flat_index < 0 || excess > worst_excess) {
      worst_excess = excess;
      r.worst_flat_index = k;
      r.worst_actual = a;
      r.worst_expected = e;
    }
  }
  r.ok = r.num_mismatched == 0;
  if (r.worst_flat_index >= 0) r.worst_index = unravel(r.worst_flat_index, actual.shape());
  if (!r.ok) {
    const double abs_err = std::fabs(r.worst_actual - r.worst_expected);
    const double rel_err =
        r.worst_expected != 0 ? abs_err / std::fabs(r.worst_expected) : abs_err;
    r.message = "mismatch at " + shape_to_string(r.worst_index) + ": actual " +
                actual.scalar_at_flat(r.worst_flat_index).to_string() + ", expected " +
                expected.scalar_at_flat(r.worst_flat_index).to_string() + " (abs err " +
                short_number(std::isnan(abs_err) ? kInf : abs_err) + ", rel err " +
                short_number(std::isnan(rel_err) ? kInf : rel_err) + "); " +
                std::to_string(r.num_mismatched) + " of " + std::to_string(actual.size()) +
                " elements mismatched; max abs err " + short_number(r.max_abs_error) +
                ", max rel err " + short_number(r.max_rel_error);
  }
  return r;
}

}  // namespace pallas
