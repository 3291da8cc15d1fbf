// pallas::Array: creation, element access, copies and conversions.
// (Printing is in array_format.cpp, random numbers in random.cpp, DLPack in dlpack.cpp.)
#include "pallas/array.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <vector>

namespace pallas {
namespace {

constexpr size_t kAlignment = 64;

// Buffers are recycled through per-thread caches: the interpreters create one result buffer per
// op, and reusing freed ones keeps the per-op cost of small tiles far below a malloc/free pair of
// an aligned block, and spares large tiles the page faults of fresh memory on every op.
//  - up to 1 MiB: free lists of power-of-two size classes (at most 8 MiB kept per class);
//  - larger: a few buffers kept by exact size (rounded to 64 KiB), at most 1 GiB in all.
// A freed buffer joins the cache of the thread that frees it. After a thread's cache has been
// destroyed (thread exit), its frees go straight to the allocator.
constexpr int kMinClassLog2 = 6;   // 64 bytes
constexpr int kMaxClassLog2 = 20;  // 1 MiB
constexpr size_t kMaxCachedBytesPerClass = size_t{8} << 20;
constexpr size_t kLargeGranule = size_t{64} << 10;
constexpr size_t kMaxLargeCached = 4;
constexpr size_t kMaxLargeCachedBytes = size_t{1} << 30;

void free_aligned(void* p) { ::operator delete(p, std::align_val_t{kAlignment}); }

thread_local bool t_cache_alive = false;

struct BufferCache {
  std::vector<void*> free_lists[kMaxClassLog2 + 1];
  std::vector<std::pair<size_t, void*>> large;  // (size, buffer)
  size_t large_bytes = 0;
  BufferCache() { t_cache_alive = true; }
  ~BufferCache() {
    t_cache_alive = false;
    for (auto& list : free_lists)
      for (void* p : list) free_aligned(p);
    for (auto& [n, p] : large) free_aligned(p);
  }
};

BufferCache* buffer_cache() {
  thread_local BufferCache cache;
  return t_cache_alive ? &cache : nullptr;
}

int size_class(size_t n) {
  int c = kMinClassLog2;
  while ((size_t{1} << c) < n) ++c;
  return c;
}

void release_small(int c, void* q) {
  BufferCache* cache = t_cache_alive ? buffer_cache() : nullptr;
  if (cache && cache->free_lists[c].size() < std::max<size_t>(8, kMaxCachedBytesPerClass >> c))
    cache->free_lists[c].push_back(q);
  else
    free_aligned(q);
}

void release_large(size_t n, void* q) {
  BufferCache* cache = t_cache_alive ? buffer_cache() : nullptr;
  if (!cache || n > kMaxLargeCachedBytes) return free_aligned(q);
  while (!cache->large.empty() && (cache->large.size() >= kMaxLargeCached ||
                                   cache->large_bytes + n > kMaxLargeCachedBytes)) {
    cache->large_bytes -= cache->large.front().first;
    free_aligned(cache->large.front().second);
    cache->large.erase(cache->large.begin());
  }
  cache->large.emplace_back(n, q);
  cache->large_bytes += n;
}

// A 64-byte-aligned buffer of at least `nbytes` bytes (never a null pointer, even for empty
// arrays, so raw_data() of a created array is always usable), zero-filled unless `zero` is false.
std::shared_ptr<void> allocate(int64_t nbytes, bool zero = true) {
  size_t n = static_cast<size_t>(nbytes);
  n = n == 0 ? kAlignment : (n + kAlignment - 1) / kAlignment * kAlignment;
  void* p = nullptr;
  std::shared_ptr<void> out;
  BufferCache* cache = buffer_cache();
  if (n <= (size_t{1} << kMaxClassLog2)) {
    int c = size_class(n);
    n = size_t{1} << c;
    if (cache && !cache->free_lists[c].empty()) {
      p = cache->free_lists[c].back();
      cache->free_lists[c].pop_back();
    } else {
      p = ::operator new(n, std::align_val_t{kAlignment});
    }
    out = std::shared_ptr<void>(p, [c](void* q) { release_small(c, q); });
  } else {
    n = (n + kLargeGranule - 1) / kLargeGranule * kLargeGranule;
    if (cache) {
      for (size_t i = 0; i < cache->large.size(); ++i)
        if (cache->large[i].first == n) {
          p = cache->large[i].second;
          cache->large_bytes -= n;
          cache->large.erase(cache->large.begin() + static_cast<long>(i));
          break;
        }
    }
    if (!p) p = ::operator new(n, std::align_val_t{kAlignment});
    out = std::shared_ptr<void>(p, [n](void* q) { release_large(n, q); });
  }
  // The contents are "unspecified" by contract; zero them anyway so that a forgotten
  // initialization shows up as a deterministic value rather than garbage. Array::uninitialized
  // skips this for callers that overwrite every element (the evaluators' results).
  if (zero) std::memset(p, 0, n);
  return out;
}

std::string index_to_string(std::span<const int64_t> index) {
  std::string s = "[";
  for (size_t i = 0; i < index.size(); ++i) s += (i ? ", " : "") + std::to_string(index[i]);
  return s + "]";
}

// Number of elements of a shape, checking that every dimension is >= 0 and that the element
// and byte counts fit in int64 (for dtypes up to 8 bytes).
int64_t checked_num_elements(const Shape& shape, const char* who) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0)
      throw Error(std::string(who) + ": invalid shape " + shape_to_string(shape) +
                  ": dimensions must be >= 0");
    if (__builtin_mul_overflow(n, d, &n) || n > (INT64_MAX / 8))
      throw Error(std::string(who) + ": shape " + shape_to_string(shape) +
                  " has too many elements");
  }
  return n;
}

}  // namespace

int64_t num_elements(const Shape& shape) { return checked_num_elements(shape, "num_elements"); }

std::string shape_to_string(const Shape& shape) { return index_to_string(shape); }

std::vector<int64_t> row_major_strides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

std::string ShapeDtype::to_string() const {
  return std::string(dtype_name(dtype)) + shape_to_string(shape);
}

// ---- Construction ------------------------------------------------------------------------------

Array::Array() = default;

Array::Array(Shape shape, DType dtype)
    : shape_(std::move(shape)), dtype_(dtype), size_(checked_num_elements(shape_, "Array")) {
  storage_ = allocate(nbytes());
  data_ = storage_.get();
}

Array Array::zeros(Shape shape, DType dtype) { return Array(std::move(shape), dtype); }

Array Array::uninitialized(Shape shape, DType dtype) {
  Array a;
  a.shape_ = std::move(shape);
  a.dtype_ = dtype;
  a.size_ = checked_num_elements(a.shape_, "Array");
  a.storage_ = allocate(a.nbytes(), /*zero=*/false);
  a.data_ = a.storage_.get();
  return a;
}

Array Array::full(Shape shape, DType dtype, double value) {
  return full(std::move(shape), Scalar::from_double(value, dtype));
}

Array Array::full(Shape shape, const Scalar& value) {
  Array a(std::move(shape), value.dtype);
  const int isz = itemsize(a.dtype_);
  unsigned char element[8];
  value.store_to(element);
  auto* dst = static_cast<unsigned char*>(a.data_);
  for (int64_t k = 0; k < a.size_; ++k) std::memcpy(dst + k * isz, element, isz);
  return a;
}

Array Array::iota(Shape shape, DType dtype) {
  Array a(std::move(shape), dtype);
  const int isz = itemsize(dtype);
  auto* dst = static_cast<unsigned char*>(a.data_);
  for (int64_t k = 0; k < a.size_; ++k)
    Scalar::of_int(k, DType::I64).convert_to(dtype).store_to(dst + k * isz);
  return a;
}

Array Array::from_values(Shape shape, DType dtype, std::span<const double> values) {
  Array a(std::move(shape), dtype);
  if (static_cast<int64_t>(values.size()) != a.size_)
    throw Error("Array::from_values: " + std::to_string(values.size()) + " values for shape " +
                shape_to_string(a.shape_) + " (" + std::to_string(a.size_) + " elements)");
  for (int64_t k = 0; k < a.size_; ++k) a.set_flat(k, values[k]);
  return a;
}

Array Array::from_values(Shape shape, DType dtype, std::initializer_list<double> values) {
  return from_values(std::move(shape), dtype, std::span<const double>(values.begin(), values.size()));
}

Array Array::wrap(void* data, Shape shape, DType dtype, std::function<void()> keep_alive) {
  Array a;
  a.size_ = checked_num_elements(shape, "Array::wrap");
  a.shape_ = std::move(shape);
  a.dtype_ = dtype;
  if (data == nullptr && a.size_ > 0)
    throw Error("Array::wrap: null data pointer for shape " + shape_to_string(a.shape_));
  // The deleter runs when the last handle dies (even for a null pointer); it must not throw.
  a.storage_ = std::shared_ptr<void>(data, [keep = std::move(keep_alive)](void*) {
    if (keep) keep();
  });
  a.data_ = data;
  return a;
}

// ---- Properties and element access ----------------------------------------------------------

int64_t Array::dim(int axis) const {
  const int r = rank();
  if (axis < -r || axis >= r)
    throw Error("Array::dim: axis " + std::to_string(axis) + " is out of range for an array of rank " +
                std::to_string(r) + " (shape " + shape_to_string(shape_) + ")");
  return shape_[axis < 0 ? axis + r : axis];
}

void Array::check_type(DType t) const {
  // Semaphore arrays hold int32 counters; reading them as int32 is fine.
  if (t == dtype_ || (t == DType::I32 && is_semaphore(dtype_))) return;
  throw Error("Array::data<T>: T is " + std::string(dtype_name(t)) + " but the array's dtype is " +
              std::string(dtype_name(dtype_)) + " (use astype() to convert)");
}

int64_t Array::flat_index(std::initializer_list<int64_t> index) const {
  return flat_index(std::span<const int64_t>(index.begin(), index.size()));
}

int64_t Array::flat_index(std::span<const int64_t> index) const {
  if (static_cast<int>(index.size()) != rank())
    throw Error("Array: index " + index_to_string(index) + " has " + std::to_string(index.size()) +
                " entries but the array has rank " + std::to_string(rank()) + " (shape " +
                shape_to_string(shape_) + ")");
  int64_t flat = 0;
  for (size_t i = 0; i < index.size(); ++i) {
    if (index[i] < 0 || index[i] >= shape_[i])
      throw Error("Array: index " + index_to_string(index) + " is out of bounds for shape " +
                  shape_to_string(shape_) + " (axis " + std::to_string(i) + " has size " +
                  std::to_string(shape_[i]) + ")");
    flat = flat * shape_[i] + index[i];
  }
  return flat;
}

static void check_flat(int64_t flat, const Array& a, const char* who) {
  if (flat < 0 || flat >= a.size())
    throw Error(std::string(who) + ": flat index " + std::to_string(flat) +
                " is out of bounds for shape " + shape_to_string(a.shape()) + " (" +
                std::to_string(a.size()) + " elements)");
}

Scalar Array::scalar_at_flat(int64_t flat) const {
  check_flat(flat, *this, "Array::scalar_at_flat");
  return Scalar::load_from(static_cast<const unsigned char*>(data_) + flat * itemsize(dtype_), dtype_);
}

double Array::get_flat(int64_t flat) const {
  check_flat(flat, *this, "Array::get_flat");
  return scalar_at_flat(flat).as_double();
}
double Array::get(std::span<const int64_t> index) const { return get_flat(flat_index(index)); }
double Array::get(std::initializer_list<int64_t> index) const { return get_flat(flat_index(index)); }

void Array::set_flat(int64_t flat, double value) {
  check_flat(flat, *this, "Array::set_flat");
  Scalar::from_double(value, dtype_)
      .store_to(static_cast<unsigned char*>(data_) + flat * itemsize(dtype_));
}
void Array::set(std::span<const int64_t> index, double value) { set_flat(flat_index(index), value); }
void Array::set(std::initializer_list<int64_t> index, double value) {
  set_flat(flat_index(index), value);
}

std::vector<double> Array::to_doubles() const {
  std::vector<double> out(static_cast<size_t>(size_));
  for (int64_t k = 0; k < size_; ++k) out[k] = scalar_at_flat(k).as_double();
  return out;
}

// ---- Copies and views ----------------------------------------------------------------------

Array Array::clone() const {
  Array c(shape_, dtype_);
  if (size_ > 0) std::memcpy(c.data_, data_, static_cast<size_t>(nbytes()));
  return c;
}

Array Array::reshaped(Shape shape) const {
  // One dimension may be -1: it is inferred from the others (as NumPy's reshape).
  int inferred = -1;
  int64_t known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1 && inferred < 0) {
      inferred = static_cast<int>(i);
    } else if (shape[i] < 0) {
      throw Error("Array::reshaped: invalid shape " + shape_to_string(shape) +
                  " (dimensions must be >= 0; at most one may be -1)");
    } else {
      known *= shape[i];
    }
  }
  if (inferred >= 0) {
    if (known == 0 || size_ % known != 0)
      throw Error("Array::reshaped: cannot reshape " + shape_dtype().to_string() + " (" +
                  std::to_string(size_) + " elements) to " + shape_to_string(shape));
    shape[inferred] = size_ / known;
  }
  const int64_t n = checked_num_elements(shape, "Array::reshaped");
  if (n != size_)
    throw Error("Array::reshaped: cannot reshape " + shape_dtype().to_string() + " (" +
                std::to_string(size_) + " elements) to " + shape_to_string(shape) + " (" +
                std::to_string(n) + " elements)");
  Array r = *this;
  r.shape_ = std::move(shape);
  return r;
}

Array Array::astype(DType dtype) const {
  if (dtype == dtype_) return clone();
  Array out(shape_, dtype);
  const int src_size = itemsize(dtype_), dst_size = itemsize(dtype);
  const auto* src = static_cast<const unsigned char*>(data_);
  auto* dst = static_cast<unsigned char*>(out.data_);
  for (int64_t k = 0; k < size_; ++k)
    Scalar::load_from(src + k * src_size, dtype_).convert_to(dtype).store_to(dst + k * dst_size);
  return out;
}

bool Array::shares_buffer_with(const Array& other) const {
  // Same allocation (handle copies, reshaped views), or overlapping bytes (e.g. a buffer that
  // came back through DLPack). Compare addresses as integers: relational comparison of
  // pointers into different objects is unspecified.
  const bool same_owner = !storage_.owner_before(other.storage_) && !other.storage_.owner_before(storage_);
  if (same_owner && storage_ != nullptr) return true;
  if (data_ == nullptr || other.data_ == nullptr) return false;
  const auto a = reinterpret_cast<uintptr_t>(data_), b = reinterpret_cast<uintptr_t>(other.data_);
  if (a == b) return true;
  return a < b + static_cast<uintptr_t>(other.nbytes()) && b < a + static_cast<uintptr_t>(nbytes());
}

}  // namespace pallas
