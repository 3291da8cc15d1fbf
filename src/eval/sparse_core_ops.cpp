// Evaluation of the SparseCore vector subcore ops (ops.def's last section), shared by the
// reference interpreter and the TPU interpret mode. docs/SPARSE_CORE.md states the semantics;
// in short: lanes run in increasing order, inactive (masked-off) lanes touch no memory and read
// as 0, and every index is bounds-checked before any memory is touched.
#include <cstring>
#include <unordered_map>

#include "core/blocks.h"
#include "eval/interpreter.h"
#include "eval/scalar_ops.h"

namespace pallas::eval {

using ir::AttrKey;
using ir::OpCode;

namespace {

// a + b in the element type (integers wrap; f16/bf16 add in f32 and round back).
template <class T> T add_element(T a, T b) {
  if constexpr (std::is_same_v<T, bool>) {
    throw InternalError("a SparseCore add on bool");
  } else {
    using C = scalar::Compute<T>;
    return static_cast<T>(scalar::Add{}(static_cast<C>(a), static_cast<C>(b)));
  }
}

// *dst += *src for one element of dtype t.
void add_into(std::byte* dst, const std::byte* src, DType t) {
  visit_dtype(t, [&]<class T>() {
    T a, b;
    std::memcpy(&a, dst, sizeof(T));
    std::memcpy(&b, src, sizeof(T));
    T r = add_element(a, b);
    std::memcpy(dst, &r, sizeof(T));
  });
}

const bool* mask_data(const Array& m) { return m.data<bool>(); }

}  // namespace

std::vector<int64_t> element_offsets(const RefValue& r) {
  std::vector<int64_t> out(static_cast<size_t>(r.size()));
  std::vector<int64_t> idx(r.shape.size(), 0);
  for (size_t k = 0; k < out.size(); ++k) {
    int64_t off = 0;
    for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * r.strides[d];
    out[k] = off;
    for (size_t d = idx.size(); d-- > 0;) {
      if (++idx[d] < r.shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

void add_to(const RefValue& r, const std::byte* src) {
  const int64_t isz = itemsize(r.dtype);
  const std::vector<int64_t> offsets = element_offsets(r);
  for (size_t k = 0; k < offsets.size(); ++k)
    add_into(r.data + offsets[k] * isz, src + static_cast<int64_t>(k) * isz, r.dtype);
}

namespace {

// ---- Pure ops ---------------------------------------------------------------------------------

// sum: inactive lanes add nothing (0 before the first active lane). max / min: inactive lanes
// pass x through until the first active lane, then hold the running extremum.
Array masked_scan(const Array& x, const Array& mask, const std::string& kind) {
  Array out = Array::uninitialized(x.shape(), x.dtype());
  const bool* m = mask_data(mask);
  visit_dtype(x.dtype(), [&]<class T>() {
    if constexpr (scalar::is_int_v<T> || scalar::is_float_v<T>) {
      const T* in = x.data<T>();
      T* o = out.data<T>();
      const bool sum = kind == "sum";
      bool seen = sum;
      T acc = T(0);
      for (int64_t i = 0; i < x.size(); ++i) {
        if (m[i]) {
          if (!seen) acc = in[i];
          else if (sum) acc = scalar::Add{}(acc, in[i]);
          else if (kind == "max") acc = scalar::Max{}(acc, in[i]);
          else acc = scalar::Min{}(acc, in[i]);
          seen = true;
        }
        o[i] = seen ? acc : in[i];
      }
    } else {
      throw InternalError("sc_masked_scan on " + std::string(dtype_name(x.dtype())));
    }
  });
  return out;
}

// counts[i]: how many active lanes j <= i hold x[i] (bit for bit); last[i]: lane i is active and
// no later active lane holds x[i]. Inactive lanes: count 0, last false.
std::vector<Array> scan_count(const Array& x, const Array& mask) {
  const int64_t n = x.size();
  Array counts = Array::zeros(x.shape(), DType::I32);
  Array last = Array::zeros(x.shape(), DType::Bool);
  const bool* m = mask_data(mask);
  std::vector<uint32_t> bits(static_cast<size_t>(n));
  std::memcpy(bits.data(), x.raw_data(), static_cast<size_t>(n) * 4);
  std::unordered_map<uint32_t, int32_t> seen, remaining;
  for (int64_t i = 0; i < n; ++i)
    if (m[i]) ++remaining[bits[i]];
  int32_t* c = counts.data<int32_t>();
  bool* l = last.data<bool>();
  for (int64_t i = 0; i < n; ++i) {
    if (!m[i]) continue;
    c[i] = ++seen[bits[i]];
    l[i] = --remaining[bits[i]] == 0;
  }
  return {counts, last};
}

// Stable; valid lanes first (in key order), then the invalid lanes in their original order; the
// output mask marks the valid prefix.
std::vector<Array> sort_key_val(std::span<const Array* const> in, const ir::Attrs& attrs) {
  const bool masked = attrs.get_int_or(AttrKey::Masked, 0) != 0;
  const bool descending = attrs.get_int_or(AttrKey::Descending, 0) != 0;
  const size_t num_data = in.size() - (masked ? 1 : 0);
  ir::Attrs sort_attrs;
  sort_attrs.set(AttrKey::Descending, int64_t{descending});
  std::vector<Array> operands;
  if (!masked) {
    for (size_t i = 0; i < num_data; ++i) operands.push_back(*in[i]);
    sort_attrs.set(AttrKey::NumKeys, int64_t{1});
    return sort(operands, sort_attrs);
  }
  // Two keys: a rank that puts the valid lanes first in the sort's direction, then the keys with
  // every invalid lane's key replaced by one value (so invalid lanes keep their order). The real
  // keys ride along as the first value.
  const bool* m = mask_data(*in.back());
  const Array& keys = *in[0];
  Array rank = Array::uninitialized(keys.shape(), DType::I32);
  Array sort_keys = keys.clone();
  for (int64_t i = 0; i < keys.size(); ++i) {
    rank.data<int32_t>()[i] = m[i] == descending ? 1 : 0;
    if (!m[i]) std::memset(static_cast<std::byte*>(sort_keys.raw_data()) + i * 4, 0, 4);
  }
  operands = {rank, sort_keys};
  for (size_t i = 0; i < num_data; ++i) operands.push_back(*in[i]);
  sort_attrs.set(AttrKey::NumKeys, int64_t{2});
  std::vector<Array> sorted = sort(operands, sort_attrs);
  sorted.erase(sorted.begin(), sorted.begin() + 2);
  int64_t valid = 0;
  for (int64_t i = 0; i < keys.size(); ++i) valid += m[i];
  Array out_mask = Array::zeros(keys.shape(), DType::Bool);
  for (int64_t i = 0; i < valid; ++i) out_mask.data<bool>()[i] = true;
  sorted.push_back(out_mask);
  return sorted;
}

// Every output lane holds the number of true lanes (population count) or the index of the first
// true lane, x.size() when there is none (find-first-set).
Array all_reduce(OpCode code, const Array& x, int64_t reduce) {
  const bool* p = x.data<bool>();
  int64_t r = 0;
  if (code == OpCode::ScAllReducePopulationCount) {
    for (int64_t i = 0; i < x.size(); ++i) r += p[i] != 0;
  } else {
    while (r < x.size() && !p[r]) ++r;
  }
  return constant(Scalar::of_int(r, DType::I32), {x.size() / reduce});
}

// interleaved: [a0, b0, a1, b1, ...]; compressed: [a0, a1, ..., b0, b1, ...] as shape [n, 2].
Array pack(const Array& a, const Array& b, const std::string& format, DType to) {
  const int64_t n = a.size();
  if (format == "interleaved") {
    Array pair[] = {reshape(convert(a, to), {n, 1}), reshape(convert(b, to), {n, 1})};
    return reshape(concatenate(pair, 1), {2 * n});
  }
  Array halves[] = {convert(a, to), convert(b, to)};
  return reshape(concatenate(halves, 0), {n, 2});
}

std::vector<Array> unpack(const Array& ab, const std::string& format, DType to) {
  const int64_t n = ab.size() / 2;
  if (format == "interleaved") {
    Array pairs = reshape(ab, {n, 2});
    return {convert(reshape(slice(pairs, {0, 0}, {n, 1}, {1, 1}), {n}), to),
            convert(reshape(slice(pairs, {0, 1}, {n, 2}, {1, 1}), {n}), to)};
  }
  Array flat = reshape(ab, {2 * n});
  return {convert(slice(flat, {0}, {n}, {1}), to), convert(slice(flat, {n}, {2 * n}, {1}), to)};
}

// out[i] = x[indices[i]]; a negative index counts from the end (NumPy), anything outside
// [-n, n) is an error.
Array dynamic_gather(const ir::Op& op, const Array& x, const Array& indices) {
  const int64_t n = x.size();
  const int64_t isz = itemsize(x.dtype());
  const int32_t* ix = indices.data<int32_t>();
  Array out = Array::uninitialized(x.shape(), x.dtype());
  const auto* src = static_cast<const std::byte*>(x.raw_data());
  auto* dst = static_cast<std::byte*>(out.raw_data());
  for (int64_t i = 0; i < n; ++i) {
    int64_t j = ix[i] < 0 ? ix[i] + n : ix[i];
    if (j < 0 || j >= n)
      throw Error("sc_dynamic_gather: lane " + std::to_string(i) + " has index " + std::to_string(ix[i]) +
                      ", out of range for a vector of " + std::to_string(n) + " lanes",
                  op.loc);
    std::memcpy(dst + i * isz, src + j * isz, static_cast<size_t>(isz));
  }
  return out;
}

}  // namespace

bool is_sparse_core_ref_op(OpCode code) {
  switch (code) {
    case OpCode::ScLoadGather: case OpCode::ScStoreScatter: case OpCode::ScAddupdateScatter:
    case OpCode::ScLoadExpanded: case OpCode::ScStoreCompressed: case OpCode::ScAddupdate:
    case OpCode::ScAddupdateCompressed: case OpCode::ScFetchAndAdd:
      return true;
    default: return false;
  }
}

std::vector<Array> sparse_core_op(const ir::Op& op, std::span<const Array* const> in) {
  const ir::Attrs& a = op.attrs;
  switch (op.code) {
    case OpCode::ScMaskedScan: return {masked_scan(*in[0], *in[1], a.get_string(AttrKey::Kind))};
    case OpCode::ScScanCount: return scan_count(*in[0], *in[1]);
    case OpCode::ScSortKeyVal: return sort_key_val(in, a);
    case OpCode::ScAllReducePopulationCount: case OpCode::ScAllReduceFfs:
      return {all_reduce(op.code, *in[0], a.get_int(AttrKey::Reduce))};
    case OpCode::ScPack:
      return {pack(*in[0], *in[1], a.get_string(AttrKey::Format), a.get_dtype(AttrKey::DTypeAttr))};
    case OpCode::ScUnpack: return unpack(*in[0], a.get_string(AttrKey::Format), a.get_dtype(AttrKey::DTypeAttr));
    case OpCode::ScDynamicGather: return {dynamic_gather(op, *in[0], *in[1])};
    default: break;
  }
  throw InternalError("sparse_core_op called on " + std::string(op.info().name));
}

// ---- Ref ops --------------------------------------------------------------------------------------

RefValue Interpreter::subcore_ref(const ir::Op& op, const RefValue& local, int64_t subcore_id) {
  if (subcore_id == 0) return local;
  throw Error(std::string(op.info().name) + ": subcore_id " + std::to_string(subcore_id) +
                  " names another vector subcore's SMEM, but this kernel runs on one subcore (subcore 0): "
                  "run it on a VectorSubcoreMesh in the TPU interpret mode, or pass subcore_id 0",
              op.loc);
}

void Interpreter::eval_sparse_core_ref_op(const ir::Op& op) {
  // The Ref's logical shape (in the TPU machine's "padded" mode a whole buffer's RefValue also
  // spans its tile padding, which these ops neither index nor count).
  RefValue base = ref(op.operands[0]);
  base.shape = kernel().type(op.operands[0]).shape;
  const int64_t isz = itemsize(base.dtype);
  // One element of the Ref, touched through the access hooks.
  RefValue element;
  element.dtype = base.dtype;
  element.space = base.space;
  element.owner = base.owner;
  auto at = [&](int64_t offset) -> RefValue& {
    element.data = base.data + offset * isz;
    return element;
  };

  switch (op.code) {
    case OpCode::ScLoadGather: case OpCode::ScStoreScatter: case OpCode::ScAddupdateScatter: {
      const size_t rank = base.shape.size();
      const bool load = op.code == OpCode::ScLoadGather;
      const bool masked = op.attrs.get_int_or(AttrKey::Masked, 0) != 0;
      const int64_t n = array(op.operands[1]).size();
      const bool* m = masked ? mask_data(array(op.operands.back())) : nullptr;
      // Every active lane's index is checked before memory is touched.
      std::vector<int64_t> offsets(static_cast<size_t>(n), -1);
      for (int64_t i = 0; i < n; ++i) {
        if (m && !m[i]) continue;
        int64_t off = 0;
        std::vector<int64_t> index(rank);
        for (size_t d = 0; d < rank; ++d) index[d] = array(op.operands[1 + d]).data<int32_t>()[i];
        for (size_t d = 0; d < rank; ++d) {
          if (index[d] < 0 || index[d] >= base.shape[d])
            throw Error(std::string(op.info().name) + ": lane " + std::to_string(i) + " indexes " +
                            core::tuple_string(index) + ", out of bounds for the ref of shape " +
                            core::tuple_string(base.shape),
                        op.loc);
          off += index[d] * base.strides[d];
        }
        offsets[static_cast<size_t>(i)] = off;
      }
      if (load) {
        Array out = Array::zeros({n}, base.dtype);
        auto* dst = static_cast<std::byte*>(out.raw_data());
        for (int64_t i = 0; i < n; ++i) {
          if (offsets[static_cast<size_t>(i)] < 0) continue;
          AccessScope scope(*this, op, at(offsets[static_cast<size_t>(i)]));
          std::memcpy(dst + i * isz, element.data, static_cast<size_t>(isz));
        }
        set(op.results[0], std::move(out));
        return;
      }
      const auto* src = static_cast<const std::byte*>(array(op.operands[1 + rank]).raw_data());
      for (int64_t i = 0; i < n; ++i) {
        if (offsets[static_cast<size_t>(i)] < 0) continue;
        AccessScope scope(*this, op, at(offsets[static_cast<size_t>(i)]));
        if (op.code == OpCode::ScStoreScatter)
          std::memcpy(element.data, src + i * isz, static_cast<size_t>(isz));
        else
          add_into(element.data, src + i * isz, base.dtype);
      }
      return;
    }
    case OpCode::ScLoadExpanded: case OpCode::ScStoreCompressed: case OpCode::ScAddupdate:
    case OpCode::ScAddupdateCompressed: {
      // Lane i of the vector (row-major over the Ref's shape) pairs with the k-th element of the
      // Ref, where k counts the active lanes before i (every lane is active for sc_addupdate).
      const std::vector<int64_t> offsets = element_offsets(base);
      const bool* m = op.code == OpCode::ScAddupdate ? nullptr : mask_data(array(op.operands.back()));
      if (op.code == OpCode::ScLoadExpanded) {
        Array out = Array::zeros(base.shape, base.dtype);
        auto* dst = static_cast<std::byte*>(out.raw_data());
        for (size_t i = 0, k = 0; i < offsets.size(); ++i) {
          if (!m[i]) continue;
          AccessScope scope(*this, op, at(offsets[k++]));
          std::memcpy(dst + static_cast<int64_t>(i) * isz, element.data, static_cast<size_t>(isz));
        }
        set(op.results[0], std::move(out));
        return;
      }
      const auto* src = static_cast<const std::byte*>(array(op.operands[1]).raw_data());
      for (size_t i = 0, k = 0; i < offsets.size(); ++i) {
        if (m && !m[i]) continue;
        AccessScope scope(*this, op, at(offsets[k++]));
        if (op.code == OpCode::ScStoreCompressed)
          std::memcpy(element.data, src + static_cast<int64_t>(i) * isz, static_cast<size_t>(isz));
        else
          add_into(element.data, src + static_cast<int64_t>(i) * isz, base.dtype);
      }
      return;
    }
    case OpCode::ScFetchAndAdd: {
      RefValue target = base;
      if (op.operands.size() == 3) target = subcore_ref(op, base, scalar_int(op.operands[2]));
      const int32_t value = static_cast<int32_t>(scalar_int(op.operands[1]));
      int32_t old;
      {
        // The read and the write happen under one access: atomic for the TPU machine, which
        // holds the buffer's lock between begin_access and end_access.
        AccessScope scope(*this, op, target);
        std::memcpy(&old, target.data, sizeof old);
        const int32_t updated = add_element(old, value);
        std::memcpy(target.data, &updated, sizeof updated);
      }
      set(op.results[0], constant(Scalar::of_int(old, DType::I32), {}));
      return;
    }
    default: break;
  }
  throw InternalError("eval_sparse_core_ref_op on " + std::string(op.info().name));
}

}  // namespace pallas::eval
