// Tables generated from ops.def and the attribute list, plus small helpers of the IR types.
#include "pallas/ir/ir.h"

#include <algorithm>
#include <array>

namespace pallas {

namespace {
constexpr std::array<std::string_view, 10> kMemorySpaceNames = {
#define PALLAS_X(name, str) str,
    PALLAS_MEMORY_SPACES(PALLAS_X)
#undef PALLAS_X
};
}  // namespace

std::string_view memory_space_name(MemorySpace m) {
  return kMemorySpaceNames.at(static_cast<size_t>(m));
}

MemorySpace parse_memory_space(std::string_view name) {
  for (size_t i = 0; i < kMemorySpaceNames.size(); ++i)
    if (kMemorySpaceNames[i] == name) return static_cast<MemorySpace>(i);
  throw Error("unknown memory space '" + std::string(name) + "'");
}

namespace ir {

namespace {
const OpInfo kOpInfos[] = {
#define PALLAS_OP(name, str, cat, nops, nres, nreg) \
  OpInfo{OpCode::name, str, static_cast<uint32_t>(cat), nops, nres, nreg},
#include "pallas/ir/ops.def"
#undef PALLAS_OP
};
static_assert(sizeof(kOpInfos) / sizeof(kOpInfos[0]) == kNumOpCodes);

constexpr std::string_view kAttrNames[] = {
#define PALLAS_X(name, str) str,
    PALLAS_ATTRS(PALLAS_X)
#undef PALLAS_X
};
}  // namespace

const OpInfo& op_info(OpCode code) { return kOpInfos[static_cast<size_t>(code)]; }

std::optional<OpCode> op_from_name(std::string_view name) {
  for (const OpInfo& info : kOpInfos)
    if (info.name == name) return info.code;
  return std::nullopt;
}

std::string_view attr_name(AttrKey k) { return kAttrNames[static_cast<size_t>(k)]; }

std::optional<AttrKey> attr_from_name(std::string_view name) {
  for (size_t i = 0; i < std::size(kAttrNames); ++i)
    if (kAttrNames[i] == name) return static_cast<AttrKey>(i);
  return std::nullopt;
}

std::string Type::to_string() const {
  std::string s(dtype_name(dtype));
  s += "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(shape[i]);
  }
  s += "]";
  if (!is_ref) return s;
  return "ref<" + s + ", " + std::string(memory_space_name(space)) + ">";
}

Shape Indexer::result_shape() const {
  Shape out;
  for (const IndexEntry& e : entries)
    if (e.is_slice) out.push_back(e.size);
  return out;
}

Attrs& Attrs::set(AttrKey k, AttrValue v) {
  auto it = std::lower_bound(items_.begin(), items_.end(), k,
                             [](const auto& item, AttrKey key) { return item.first < key; });
  if (it != items_.end() && it->first == k)
    it->second = std::move(v);
  else
    items_.insert(it, {k, std::move(v)});
  return *this;
}

const AttrValue* Attrs::find(AttrKey k) const {
  for (const auto& [key, value] : items_)
    if (key == k) return &value;
  return nullptr;
}

bool Attrs::has(AttrKey k) const { return find(k) != nullptr; }

namespace {
template <class T> const T& get_as(const Attrs& a, AttrKey k) {
  const AttrValue* v = a.find(k);
  PALLAS_INTERNAL_CHECK(v != nullptr, "missing attribute ", attr_name(k));
  const T* t = std::get_if<T>(v);
  PALLAS_INTERNAL_CHECK(t != nullptr, "attribute ", attr_name(k), " has another kind");
  return *t;
}
}  // namespace

int64_t Attrs::get_int(AttrKey k) const { return get_as<int64_t>(*this, k); }
int64_t Attrs::get_int_or(AttrKey k, int64_t fallback) const {
  const AttrValue* v = find(k);
  if (!v) return fallback;
  const int64_t* i = std::get_if<int64_t>(v);
  return i ? *i : fallback;
}
const Ints& Attrs::get_ints(AttrKey k) const { return get_as<Ints>(*this, k); }
DType Attrs::get_dtype(AttrKey k) const { return get_as<DType>(*this, k); }
const Scalar& Attrs::get_scalar(AttrKey k) const { return get_as<Scalar>(*this, k); }
const std::string& Attrs::get_string(AttrKey k) const { return get_as<std::string>(*this, k); }
const Indexer& Attrs::get_indexer(AttrKey k) const { return get_as<Indexer>(*this, k); }

bool Attrs::operator==(const Attrs& o) const {
  if (items_.size() != o.items_.size()) return false;
  for (size_t i = 0; i < items_.size(); ++i) {
    if (items_[i].first != o.items_[i].first) return false;
    const AttrValue& a = items_[i].second;
    const AttrValue& b = o.items_[i].second;
    if (a.index() != b.index()) return false;
    bool same = std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          const T& y = std::get<T>(b);
          if constexpr (std::is_same_v<T, Scalar>)
            return x.bitwise_equal(y);
          else
            return x == y;
        },
        a);
    if (!same) return false;
  }
  return true;
}

std::vector<Type> Kernel::param_types() const {
  std::vector<Type> out;
  for (ValueId v : body.args) out.push_back(type(v));
  return out;
}

}  // namespace ir
}  // namespace pallas
