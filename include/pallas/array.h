// Host arrays: a shape, a dtype and a contiguous row-major buffer.
//
// An Array is a handle: copying an Array shares its buffer (like a NumPy view of the whole
// array or a torch.Tensor). Use `clone()` for a deep copy. Buffers are 64-byte aligned.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "pallas/dtype.h"
#include "pallas/error.h"

struct DLManagedTensor;  // from dlpack/dlpack.h

namespace pallas {

using Shape = std::vector<int64_t>;

int64_t num_elements(const Shape& shape);
std::string shape_to_string(const Shape& shape);  // "[8, 128]"
// Row-major strides in elements.
std::vector<int64_t> row_major_strides(const Shape& shape);

// Shape and dtype of an array, without data (like jax.ShapeDtypeStruct).
struct ShapeDtype {
  Shape shape;
  DType dtype = DType::F32;
  ShapeDtype() = default;
  ShapeDtype(Shape s, DType d) : shape(std::move(s)), dtype(d) {}
  int64_t size() const { return num_elements(shape); }
  int rank() const { return static_cast<int>(shape.size()); }
  std::string to_string() const;  // "f32[8, 128]"
  bool operator==(const ShapeDtype&) const = default;
};

// Arrays with more elements print summarized (Array::to_string; NumPy's threshold).
inline constexpr int64_t kPrintMaxElements = 1000;

class Array {
 public:
  // An empty f32 array of shape [0].
  Array();
  // Uninitialized contents.
  Array(Shape shape, DType dtype);

  // ---- Creation
  static Array zeros(Shape shape, DType dtype);
  // Contents unspecified (not even zeroed): for producers that overwrite every element.
  static Array uninitialized(Shape shape, DType dtype);
  static Array full(Shape shape, DType dtype, double value);
  static Array full(Shape shape, const Scalar& value);
  // 0, 1, 2, ... in row-major order (converted to dtype).
  static Array iota(Shape shape, DType dtype);
  // Values converted to dtype (round to nearest even for floats, as `convert`).
  static Array from_values(Shape shape, DType dtype, std::span<const double> values);
  static Array from_values(Shape shape, DType dtype, std::initializer_list<double> values);
  // Copies a typed vector; dtype from T.
  template <class T> static Array from_vector(Shape shape, const std::vector<T>& values);
  // Deterministic, platform-independent random numbers (xoshiro256** + Box-Muller),
  // generated in double and rounded to dtype. Same seed → same bits on every machine.
  static Array random_normal(Shape shape, DType dtype, uint64_t seed, double mean = 0.0,
                             double stddev = 1.0);
  // Uniform in [lo, hi): float values that round up to hi are capped at the largest value
  // below hi; integer dtypes (and bool, as 0 / 1) draw the integers n with lo <= n < hi.
  // random_normal on an integer dtype converts the normal draws (truncating toward zero).
  static Array random_uniform(Shape shape, DType dtype, uint64_t seed, double lo = 0.0,
                              double hi = 1.0);
  // Wraps memory that someone else owns; `keep_alive` is called when the last handle dies.
  static Array wrap(void* data, Shape shape, DType dtype, std::function<void()> keep_alive);

  // ---- Properties
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int axis) const;  // negative axes count from the end
  int64_t size() const { return size_; }
  int64_t nbytes() const { return size_ * itemsize(dtype_); }
  ShapeDtype shape_dtype() const { return {shape_, dtype_}; }

  // ---- Data
  void* raw_data() { return data_; }
  const void* raw_data() const { return data_; }
  template <class T> T* data() { check_type(dtype_of<T>()); return static_cast<T*>(data_); }
  template <class T> const T* data() const {
    check_type(dtype_of<T>());
    return static_cast<const T*>(data_);
  }
  // Element access by multi-index (bounds-checked; throws pallas::Error).
  template <class T> T& at(std::initializer_list<int64_t> index) {
    return data<T>()[flat_index(index)];
  }
  // Generic element access through double (exact for every dtype but 64-bit ints > 2^53).
  double get(std::span<const int64_t> index) const;
  double get(std::initializer_list<int64_t> index) const;
  double get_flat(int64_t flat) const;
  void set(std::span<const int64_t> index, double value);
  void set(std::initializer_list<int64_t> index, double value);
  void set_flat(int64_t flat, double value);
  Scalar scalar_at_flat(int64_t flat) const;
  std::vector<double> to_doubles() const;
  template <class T> std::vector<T> to_vector() const {
    const T* p = data<T>();
    return std::vector<T>(p, p + size_);
  }

  // ---- Copies and views
  Array clone() const;
  // Same buffer, new shape with the same number of elements.
  Array reshaped(Shape shape) const;
  // Converts every element (rules of the `convert` op).
  Array astype(DType dtype) const;
  bool shares_buffer_with(const Array& other) const;

  // ---- DLPack (zero copy). Export: the consumer owns the returned tensor and must call its
  // deleter; the buffer stays alive until then. Import: takes ownership of `tensor` (its deleter
  // runs when the last Array handle dies). Only CPU, contiguous row-major tensors of a supported
  // dtype are accepted; anything else is a pallas::Error naming what is wrong. When
  // from_dlpack throws, it has not taken ownership: the caller must still call the deleter.
  // DLPack 0.6 has no bool code: bool exports as kDLUInt/8 (and imports back as u8);
  // code 6 (kDLBool in DLPack >= 0.8) with 8 bits imports as bool. Imported buffers are only
  // guaranteed aligned to the element size, not to 64 bytes.
  DLManagedTensor* to_dlpack() const;
  static Array from_dlpack(DLManagedTensor* tensor);

  // "f32[2, 3]\n[[0, 1, 2],\n [3, 4, 5]]" (summarized with ... beyond `max_elements`).
  std::string to_string(int64_t max_elements = kPrintMaxElements) const;

 private:
  int64_t flat_index(std::initializer_list<int64_t> index) const;
  int64_t flat_index(std::span<const int64_t> index) const;
  void check_type(DType t) const;

  Shape shape_{0};
  DType dtype_ = DType::F32;
  int64_t size_ = 0;
  std::shared_ptr<void> storage_;  // owns (or keeps alive) the buffer
  void* data_ = nullptr;
};

std::ostream& operator<<(std::ostream& os, const Array& a);

template <class T> Array Array::from_vector(Shape shape, const std::vector<T>& values) {
  Array a(std::move(shape), dtype_of<T>());
  if (static_cast<int64_t>(values.size()) != a.size())
    throw Error("Array::from_vector: " + std::to_string(values.size()) +
                " values for shape " + shape_to_string(a.shape()));
  std::copy(values.begin(), values.end(), a.data<T>());
  return a;
}

// Result of comparing two arrays elementwise: |actual - expected| <= atol + rtol * |expected|.
// NaN matches NaN only when `equal_nan`. Reports the worst element.
struct AllCloseResult {
  bool ok = true;
  std::string message;             // empty when ok; else what failed, with the worst element
  double max_abs_error = 0;        // over all elements (inf if a NaN mismatch)
  double max_rel_error = 0;        // |a-e| / |e| (elements with e == 0 count |a-e|)
  int64_t worst_flat_index = -1;   // element with the largest excess over tolerance
  std::vector<int64_t> worst_index;
  double worst_actual = 0, worst_expected = 0;
  int64_t num_mismatched = 0;
  explicit operator bool() const { return ok; }
};
AllCloseResult allclose(const Array& actual, const Array& expected, double rtol = 1e-5,
                        double atol = 1e-8, bool equal_nan = true);

}  // namespace pallas
