// The dtype table: sizes, names, kinds.
#include "pallas/dtype.h"

#include <array>

#include "pallas/error.h"

namespace pallas {
namespace {

struct DTypeInfo {
  std::string_view name;
  int size;
  char kind;  // b, s, u, f, x (see PALLAS_DTYPES)
};

constexpr std::array<DTypeInfo, kNumDTypes> kInfo = {{
#define PALLAS_X(name, str, size, kind) {str, size, kind},
    PALLAS_DTYPES(PALLAS_X)
#undef PALLAS_X
}};
static_assert(kInfo.size() == static_cast<size_t>(DType::GpuBarrier) + 1,
              "kNumDTypes out of sync with PALLAS_DTYPES");

const DTypeInfo& info(DType t) {
  const auto i = static_cast<size_t>(t);
  PALLAS_INTERNAL_CHECK(i < kInfo.size(), "invalid DType value ", i);
  return kInfo[i];
}

// NumPy / JAX spellings accepted by parse_dtype in addition to the printed names.
struct Alias {
  std::string_view name;
  DType dtype;
};
constexpr Alias kAliases[] = {
    {"bool_", DType::Bool},     {"int8", DType::I8},       {"int16", DType::I16},
    {"int32", DType::I32},      {"int64", DType::I64},     {"uint8", DType::U8},
    {"uint16", DType::U16},     {"uint32", DType::U32},    {"uint64", DType::U64},
    {"float16", DType::F16},    {"half", DType::F16},      {"bfloat16", DType::BF16},
    {"float32", DType::F32},    {"float64", DType::F64},   {"pred", DType::Bool},
    {"s8", DType::I8},          {"s16", DType::I16},       {"s32", DType::I32},
    {"s64", DType::I64},
};

}  // namespace

int itemsize(DType t) { return info(t).size; }
std::string_view dtype_name(DType t) { return info(t).name; }

DType parse_dtype(std::string_view name) {
  for (size_t i = 0; i < kInfo.size(); ++i)
    if (kInfo[i].name == name) return static_cast<DType>(i);
  for (const Alias& a : kAliases)
    if (a.name == name) return a.dtype;
  std::string known;
  for (const DTypeInfo& d : kInfo) known += (known.empty() ? "" : ", ") + std::string(d.name);
  throw Error("unknown dtype '" + std::string(name) + "' (known dtypes: " + known +
              "; NumPy names like float32 and bfloat16 are accepted too)");
}

bool is_float(DType t) { return info(t).kind == 'f'; }
bool is_integer(DType t) { return info(t).kind == 's' || info(t).kind == 'u'; }
bool is_signed_int(DType t) { return info(t).kind == 's'; }
bool is_unsigned_int(DType t) { return info(t).kind == 'u'; }
bool is_semaphore(DType t) { return info(t).kind == 'x'; }
// The storage width: bool is stored in a byte, so 8 (as XLA's BitWidth(PRED)).
int bit_width(DType t) { return info(t).size * 8; }

}  // namespace pallas
