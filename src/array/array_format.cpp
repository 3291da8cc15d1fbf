// Array::to_string: NumPy-like text, summarized with "..." for large arrays.
#include "pallas/array.h"

namespace pallas {
namespace {

constexpr int64_t kEdgeItems = 3;  // elements shown at each end of a summarized axis (NumPy's)

struct Printer {
  const Array& a;
  std::vector<int64_t> strides;
  bool summarize;
  std::string out;

  void print(int axis, int64_t offset) {
    const int rank = a.rank();
    const int64_t n = a.shape()[axis];
    // Between elements: ", " on the last axis; else a newline per remaining axis (blank lines
    // between 2-D blocks, as NumPy) and an indent matching the brackets already open.
    const std::string sep = axis == rank - 1
                                ? std::string(", ")
                                : "," + std::string(rank - 1 - axis, '\n') + std::string(axis + 1, ' ');
    out += '[';
    for (int64_t i = 0; i < n; ++i) {
      if (i > 0) out += sep;
      if (summarize && n > 2 * kEdgeItems && i == kEdgeItems) {
        out += "...";
        out += sep;
        i = n - kEdgeItems;
      }
      const int64_t elem = offset + i * strides[axis];
      if (axis == rank - 1) {
        out += a.scalar_at_flat(elem).to_string();
      } else {
        print(axis + 1, elem);
      }
    }
    out += ']';
  }
};

}  // namespace

std::string Array::to_string(int64_t max_elements) const {
  Printer p{*this, row_major_strides(shape_), size_ > max_elements, shape_dtype().to_string() + "\n"};
  if (rank() == 0) {
    p.out += scalar_at_flat(0).to_string();
  } else {
    p.print(0, 0);
  }
  return p.out;
}

std::ostream& operator<<(std::ostream& os, const Array& a) { return os << a.to_string(); }

}  // namespace pallas
