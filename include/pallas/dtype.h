// Element types ("dtypes") of Pallas arrays, and the 16-bit float formats.
//
// Conversions to float16 / bfloat16 round to nearest, ties to even, keep the sign of zero,
// map overflow to ±Inf, produce (and read) subnormals, and keep NaN a NaN (quiet).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace pallas {

// One row per dtype: enum name, printed name, size in bytes, kind.
// kind: b = bool, s = signed int, u = unsigned int, f = float, x = semaphore (opaque counter).
// gpu_barrier: an mbarrier in GPU shared memory (gpu::Barrier; 8 bytes, as on the GPU).
#define PALLAS_DTYPES(X)                  \
  X(Bool, "bool", 1, 'b')                 \
  X(I8, "i8", 1, 's')                     \
  X(I16, "i16", 2, 's')                   \
  X(I32, "i32", 4, 's')                   \
  X(I64, "i64", 8, 's')                   \
  X(U8, "u8", 1, 'u')                     \
  X(U16, "u16", 2, 'u')                   \
  X(U32, "u32", 4, 'u')                   \
  X(U64, "u64", 8, 'u')                   \
  X(F16, "f16", 2, 'f')                   \
  X(BF16, "bf16", 2, 'f')                 \
  X(F32, "f32", 4, 'f')                   \
  X(F64, "f64", 8, 'f')                   \
  X(Semaphore, "semaphore", 4, 'x')       \
  X(DmaSemaphore, "dma_semaphore", 4, 'x') \
  X(BarrierSemaphore, "barrier_semaphore", 4, 'x') \
  X(GpuBarrier, "gpu_barrier", 8, 'x')

enum class DType : uint8_t {
#define PALLAS_X(name, str, size, kind) name,
  PALLAS_DTYPES(PALLAS_X)
#undef PALLAS_X
};

inline constexpr int kNumDTypes = 17;

inline constexpr DType bool_ = DType::Bool;
inline constexpr DType i8 = DType::I8;
inline constexpr DType i16 = DType::I16;
inline constexpr DType i32 = DType::I32;
inline constexpr DType i64 = DType::I64;
inline constexpr DType u8 = DType::U8;
inline constexpr DType u16 = DType::U16;
inline constexpr DType u32 = DType::U32;
inline constexpr DType u64 = DType::U64;
inline constexpr DType f16 = DType::F16;
inline constexpr DType bf16 = DType::BF16;
inline constexpr DType f32 = DType::F32;
inline constexpr DType f64 = DType::F64;

// Size of one element in bytes.
int itemsize(DType t);
// Printed name ("f32", "bf16", ...). Stable: used by the IR text form.
std::string_view dtype_name(DType t);
// Inverse of dtype_name; also accepts numpy-style names ("float32", "int8", "bfloat16").
// Throws pallas::Error for an unknown name.
DType parse_dtype(std::string_view name);
bool is_float(DType t);
bool is_integer(DType t);  // signed or unsigned, not bool
bool is_signed_int(DType t);
bool is_unsigned_int(DType t);
bool is_semaphore(DType t);
int bit_width(DType t);

// ----------------------------------------------------------------------------------------------
// 16-bit floats. Storage types with explicit conversions; arithmetic goes through float.

// Bit-exact conversions. `from_double` rounds once (no double rounding through float).
uint16_t float_to_f16_bits(float f);
uint16_t double_to_f16_bits(double d);
float f16_bits_to_float(uint16_t h);
uint16_t float_to_bf16_bits(float f);
uint16_t double_to_bf16_bits(double d);
float bf16_bits_to_float(uint16_t b);

struct float16 {
  uint16_t bits = 0;
  float16() = default;
  explicit float16(float f) : bits(float_to_f16_bits(f)) {}
  explicit float16(double d) : bits(double_to_f16_bits(d)) {}
  static float16 from_bits(uint16_t b) {
    float16 h;
    h.bits = b;
    return h;
  }
  explicit operator float() const { return f16_bits_to_float(bits); }
  explicit operator double() const { return f16_bits_to_float(bits); }
};

struct bfloat16 {
  uint16_t bits = 0;
  bfloat16() = default;
  explicit bfloat16(float f) : bits(float_to_bf16_bits(f)) {}
  explicit bfloat16(double d) : bits(double_to_bf16_bits(d)) {}
  static bfloat16 from_bits(uint16_t b) {
    bfloat16 h;
    h.bits = b;
    return h;
  }
  explicit operator float() const { return bf16_bits_to_float(bits); }
  explicit operator double() const { return bf16_bits_to_float(bits); }
};

// C++ storage type of a dtype, for templates: CType<DType::F32> == float.
template <DType T> struct CTypeOf;
template <> struct CTypeOf<DType::Bool> { using type = bool; };
template <> struct CTypeOf<DType::I8> { using type = int8_t; };
template <> struct CTypeOf<DType::I16> { using type = int16_t; };
template <> struct CTypeOf<DType::I32> { using type = int32_t; };
template <> struct CTypeOf<DType::I64> { using type = int64_t; };
template <> struct CTypeOf<DType::U8> { using type = uint8_t; };
template <> struct CTypeOf<DType::U16> { using type = uint16_t; };
template <> struct CTypeOf<DType::U32> { using type = uint32_t; };
template <> struct CTypeOf<DType::U64> { using type = uint64_t; };
template <> struct CTypeOf<DType::F16> { using type = float16; };
template <> struct CTypeOf<DType::BF16> { using type = bfloat16; };
template <> struct CTypeOf<DType::F32> { using type = float; };
template <> struct CTypeOf<DType::F64> { using type = double; };
template <> struct CTypeOf<DType::Semaphore> { using type = int32_t; };
template <> struct CTypeOf<DType::DmaSemaphore> { using type = int32_t; };
template <> struct CTypeOf<DType::BarrierSemaphore> { using type = int32_t; };
template <> struct CTypeOf<DType::GpuBarrier> { using type = int64_t; };
template <DType T> using CType = typename CTypeOf<T>::type;

// dtype of a C++ type: dtype_of<float>() == f32.
template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<bool>() { return DType::Bool; }
template <> constexpr DType dtype_of<int8_t>() { return DType::I8; }
template <> constexpr DType dtype_of<int16_t>() { return DType::I16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::I64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::U8; }
template <> constexpr DType dtype_of<uint16_t>() { return DType::U16; }
template <> constexpr DType dtype_of<uint32_t>() { return DType::U32; }
template <> constexpr DType dtype_of<uint64_t>() { return DType::U64; }
template <> constexpr DType dtype_of<float16>() { return DType::F16; }
template <> constexpr DType dtype_of<bfloat16>() { return DType::BF16; }
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<double>() { return DType::F64; }

// Calls f.template operator()<T>() with T the storage type of `t` (a generic lambda:
// `visit_dtype(t, [&]<class T>() { ... })`). Semaphore dtypes visit as int32_t, gpu_barrier as int64_t.
template <class F> decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::Bool: return f.template operator()<bool>();
    case DType::I8: return f.template operator()<int8_t>();
    case DType::I16: return f.template operator()<int16_t>();
    case DType::I32: return f.template operator()<int32_t>();
    case DType::I64: return f.template operator()<int64_t>();
    case DType::U8: return f.template operator()<uint8_t>();
    case DType::U16: return f.template operator()<uint16_t>();
    case DType::U32: return f.template operator()<uint32_t>();
    case DType::U64: return f.template operator()<uint64_t>();
    case DType::F16: return f.template operator()<float16>();
    case DType::BF16: return f.template operator()<bfloat16>();
    case DType::F32: return f.template operator()<float>();
    case DType::F64: return f.template operator()<double>();
    case DType::Semaphore:
    case DType::DmaSemaphore:
    case DType::BarrierSemaphore: return f.template operator()<int32_t>();
    case DType::GpuBarrier: return f.template operator()<int64_t>();
  }
  __builtin_unreachable();
}

// ----------------------------------------------------------------------------------------------
// A scalar of any dtype, stored exactly: integers as 64-bit patterns, floats as double
// (every f16/bf16/f32 value is exact in a double).
struct Scalar {
  DType dtype = DType::F32;
  union {
    int64_t i;   // signed ints and bool
    uint64_t u;  // unsigned ints
    double f;    // floats
  };
  Scalar() : i(0) {}
  static Scalar of_int(int64_t v, DType t) { Scalar s; s.dtype = t; s.i = v; return s; }
  static Scalar of_uint(uint64_t v, DType t) { Scalar s; s.dtype = t; s.u = v; return s; }
  static Scalar of_float(double v, DType t) { Scalar s; s.dtype = t; s.f = v; return s; }
  // Converts `v` to dtype t with the rules of `convert` (see ir/ops.def semantics).
  static Scalar from_double(double v, DType t);
  // This value converted to dtype t with the rules of `convert`: int -> int wraps (two's
  // complement truncation), int -> float rounds once to nearest even, float -> float rounds to
  // nearest even, float -> int truncates toward zero and saturates (NaN -> 0), anything ->
  // bool is (v != 0), bool -> number is 0 / 1.
  Scalar convert_to(DType t) const;
  double as_double() const;
  int64_t as_int64() const;  // integer/bool value; floats truncate toward zero
  // Writes the value as one element of dtype `dtype` at `dst`.
  void store_to(void* dst) const;
  static Scalar load_from(const void* src, DType t);
  // Text form: integers in decimal, floats with enough digits to round-trip ("inf", "-inf",
  // "nan" for the specials), bools as true/false.
  std::string to_string() const;
  // Inverse of to_string. Also accepts a leading '+', exponents ("1e-3"), "infinity", "-nan",
  // and 1 / 0 for bools. Integers must fit the dtype. Throws pallas::Error on bad text.
  static Scalar parse(std::string_view text, DType t);
  bool bitwise_equal(const Scalar& o) const;
};

}  // namespace pallas
