#include "eval/interpreter.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <mutex>

#include "eval/strided.h"

#pragma GCC diagnostic error "-Wswitch"

namespace pallas::eval {

using ir::AttrKey;
using ir::OpCode;

// ---- Runtime refs ---------------------------------------------------------------------------------
RefValue RefValue::of_array(Array& a, MemorySpace space) {
  RefValue r;
  r.data = static_cast<std::byte*>(a.raw_data());
  r.dtype = a.dtype();
  r.shape = a.shape();
  r.strides = row_major_strides(a.shape());
  r.space = space;
  // Keep the buffer alive through a copy of the handle.
  r.owner = std::make_shared<Array>(a);
  return r;
}

bool RefValue::is_contiguous() const { return strides == row_major_strides(shape); }

std::string ref_index_out_of_bounds(int64_t dim, int64_t start, bool is_slice, int64_t size, int64_t stride,
                                    const Shape& ref_shape) {
  std::string what = is_slice ? "slice of " + std::to_string(size) + " elements from " + std::to_string(start) +
                                    " (stride " + std::to_string(stride) + ")"
                              : "index " + std::to_string(start);
  return "ref index out of bounds: " + what + " in dimension " + std::to_string(dim) + " of size " +
         std::to_string(ref_shape[static_cast<size_t>(dim)]) + " (ref " + shape_to_string(ref_shape) + ")";
}

std::string at_grid_point(std::span<const int64_t> program_ids) {
  if (program_ids.empty()) return "";
  std::string point;
  for (int64_t i : program_ids) point += (point.empty() ? "" : ", ") + std::to_string(i);
  return " at grid point (" + point + ")";
}

std::string negative_semaphore_amount(std::string_view op_name, int64_t amount) {
  return std::string(op_name) + (op_name == "semaphore_signal" ? ": the increment" : ": the value") +
         " must be >= 0, got " + std::to_string(amount);
}

std::string setmaxnreg_overflow(const std::vector<int64_t>& requests, size_t* culprit) {
  const int64_t threads = 128 * static_cast<int64_t>(requests.size());
  const int64_t entry = std::min<int64_t>(256, 65536 / std::max<int64_t>(1, threads) / 8 * 8);
  int64_t total = 0;
  bool blamed = false;
  for (size_t w = 0; w < requests.size(); ++w) {
    total += 128 * (requests[w] > 0 ? requests[w] : entry);
    if (requests[w] > entry && !blamed) *culprit = w, blamed = true;
  }
  if (total <= entry * threads) return "";
  return "set_max_registers: the warpgroups would hold " + std::to_string(total) + " registers in all, more than the " +
         std::to_string(entry * threads) + " of the CTA (" + std::to_string(threads) + " threads x " +
         std::to_string(entry) + "): on a GPU a setmaxnreg.inc would wait forever; lower the increases or raise the decreases";
}

RefValue view(const RefValue& r, const ir::Indexer& index, std::span<const int64_t> dynamic) {
  PALLAS_INTERNAL_CHECK(index.entries.size() == r.shape.size(), "indexer rank mismatch");
  RefValue out;
  out.dtype = r.dtype;
  out.space = r.space;
  out.owner = r.owner;
  int64_t offset = 0;
  for (size_t d = 0; d < index.entries.size(); ++d) {
    const ir::IndexEntry& e = index.entries[d];
    int64_t start = e.dynamic >= 0 ? dynamic[static_cast<size_t>(e.dynamic - 1)] : e.start;
    int64_t dim = r.shape[d];
    if (e.is_slice) {
      int64_t last = start + (e.size - 1) * e.stride;
      if (e.size > 0 && (start < 0 || last >= dim))
        throw Error(ref_index_out_of_bounds(static_cast<int64_t>(d), start, true, e.size, e.stride, r.shape));
      out.shape.push_back(e.size);
      out.strides.push_back(r.strides[d] * e.stride);
    } else if (start < 0 || start >= dim) {
      throw Error(ref_index_out_of_bounds(static_cast<int64_t>(d), start, false, 1, 1, r.shape));
    }
    offset += start * r.strides[d];
  }
  out.data = r.data + offset * itemsize(r.dtype);
  return out;
}

RefValue transformed(const RefValue& r, const ir::Op& op) {
  RefValue out = r;
  if (op.code == OpCode::RefTranspose) {
    const ir::Ints& perm = op.attrs.get_ints(AttrKey::Permutation);
    for (size_t i = 0; i < perm.size(); ++i) {
      out.shape[i] = r.shape[static_cast<size_t>(perm[i])];
      out.strides[i] = r.strides[static_cast<size_t>(perm[i])];
    }
    return out;
  }
  if (op.code == OpCode::RefBitcast) {
    std::optional<RefValue> cast = bitcast_view(r, op.attrs.get_dtype(AttrKey::DTypeAttr));
    if (!cast) throw Error(bitcast_not_whole(r.shape, op.attrs.get_dtype(AttrKey::DTypeAttr)), op.loc);
    return *cast;
  }
  PALLAS_INTERNAL_CHECK(op.code == OpCode::RefReshape, "not a Ref transform");
  out.shape = op.attrs.get_ints(AttrKey::ShapeAttr);
  std::optional<std::vector<int64_t>> strides = reshaped_strides(r.shape, r.strides, out.shape);
  if (!strides)
    throw Error(reshape_not_strided(r.shape, r.strides, out.shape), op.loc);
  out.strides = std::move(*strides);
  return out;
}

std::optional<RefValue> bitcast_view(const RefValue& r, DType to) {
  RefValue out = r;
  out.dtype = to;
  const int64_t from_size = itemsize(r.dtype), to_size = itemsize(to);
  if (from_size > to_size) {  // each element becomes `ratio` along a new last dim
    const int64_t ratio = from_size / to_size;
    for (int64_t& s : out.strides) s *= ratio;
    out.shape.push_back(ratio);
    out.strides.push_back(1);
  } else if (from_size < to_size) {  // the last dim's `ratio` elements become one
    const int64_t ratio = to_size / from_size;
    if (r.shape.empty() || r.shape.back() != ratio || (ratio > 1 && r.strides.back() != 1)) return std::nullopt;
    // (A wider element starts on a multiple of its size, as the GPU needs; buffers are aligned.)
    if (reinterpret_cast<uintptr_t>(r.data) % static_cast<uintptr_t>(to_size) != 0) return std::nullopt;
    out.shape.pop_back();
    out.strides.pop_back();
    for (size_t d = 0; d < out.shape.size(); ++d) {
      if (out.shape[d] != 1 && out.strides[d] % ratio != 0) return std::nullopt;
      out.strides[d] /= ratio;
    }
  }
  return out;
}

std::string bitcast_not_whole(const Shape& shape, DType to) {
  return "ref_bitcast: a view of shape " + shape_to_string(shape) + " as " + std::string(dtype_name(to)) +
         ": the last dim, which the wider dtype's elements take, must be contiguous, the view must start on a "
         "multiple of the wider element's size, and the other strides must be whole elements of it (bitcast the "
         "whole Ref, or a view of whole rows)";
}

std::string reshape_not_strided(const Shape& shape, std::span<const int64_t> strides, const Shape& new_shape) {
  std::string s = "ref_reshape: a view of shape " + shape_to_string(shape) + " with element strides [";
  for (size_t i = 0; i < strides.size(); ++i) s += (i ? ", " : "") + std::to_string(strides[i]);
  return s + "] cannot be reshaped to " + shape_to_string(new_shape) +
         " in place: the dims it merges are not evenly spaced in memory. Reshape the whole Ref (or a view "
         "of whole trailing dims) and index the result instead";
}

namespace {

// Calls fn(ref_ptr, flat_index) for every element of a strided view, in row-major order, with
// the innermost dimension as a tight loop over contiguous runs when possible.
template <class Fn> void for_each_run(const RefValue& r, Fn&& fn) {
  const int rank = static_cast<int>(r.shape.size());
  const int64_t isz = itemsize(r.dtype);
  if (num_elements(r.shape) == 0) return;
  if (rank == 0) {
    fn(r.data, int64_t{0}, int64_t{1}, int64_t{1});
    return;
  }
  const int64_t inner = r.shape[rank - 1];
  const int64_t inner_stride = r.strides[rank - 1];
  std::vector<int64_t> idx(rank, 0);
  int64_t flat = 0;
  while (true) {
    int64_t off = 0;
    for (int d = 0; d < rank - 1; ++d) off += idx[d] * r.strides[d];
    fn(r.data + off * isz, flat, inner, inner_stride);
    flat += inner;
    int d = rank - 2;
    for (; d >= 0; --d) {
      if (++idx[d] < r.shape[d]) break;
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace

Array read(const RefValue& r) {
  Array out = Array::uninitialized(r.shape, r.dtype);
  const int64_t isz = itemsize(r.dtype);
  auto* dst = static_cast<std::byte*>(out.raw_data());
  for_each_run(r, [&](std::byte* src, int64_t flat, int64_t n, int64_t stride) {
    if (stride == 1) {
      std::memcpy(dst + flat * isz, src, static_cast<size_t>(n * isz));
    } else {
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(dst + (flat + i) * isz, src + i * stride * isz, static_cast<size_t>(isz));
    }
  });
  return out;
}

void write(const RefValue& r, const Array& value) {
  PALLAS_INTERNAL_CHECK(value.shape() == r.shape && value.dtype() == r.dtype,
                        "write of mismatched value");
  const int64_t isz = itemsize(r.dtype);
  const auto* src = static_cast<const std::byte*>(value.raw_data());
  for_each_run(r, [&](std::byte* dst, int64_t flat, int64_t n, int64_t stride) {
    if (stride == 1) {
      std::memmove(dst, src + flat * isz, static_cast<size_t>(n * isz));
    } else {
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(dst + i * stride * isz, src + (flat + i) * isz, static_cast<size_t>(isz));
    }
  });
}

Scalar uninitialized_value(DType t) {
  if (is_float(t)) return Scalar::of_float(std::numeric_limits<double>::quiet_NaN(), t);
  if (t == DType::Bool) return Scalar::of_int(1, t);
  return visit_dtype(t, [&]<class T>() {
    if constexpr (std::is_integral_v<T> && std::is_signed_v<T>)
      return Scalar::of_int(std::numeric_limits<T>::max(), t);
    else if constexpr (std::is_integral_v<T>)
      return Scalar::of_uint(std::numeric_limits<T>::max(), t);
    else
      return Scalar::of_int(0, t);
  });
}

void fill_uninitialized(Array& a) {
  if (a.size() == 0) return;
  const int64_t isz = itemsize(a.dtype());
  auto* p = static_cast<std::byte*>(a.raw_data());
  uninitialized_value(a.dtype()).store_to(p);
  for (int64_t filled = 1; filled < a.size();) {  // doubling copies
    int64_t n = std::min(filled, a.size() - filled);
    std::memcpy(p + filled * isz, p, static_cast<size_t>(n * isz));
    filled += n;
  }
}

// ---- Interpreter ------------------------------------------------------------------------------------
Interpreter::Interpreter(const ir::Kernel& kernel) : kernel_(kernel), fusions_(plan_fusions(kernel)) {
  plan_releases(kernel.body);
}

namespace {
// Values an op reads, directly or from its nested regions (where they are defined outside).
void collect_uses(const ir::Op& op, std::vector<ir::ValueId>& out) {
  out.insert(out.end(), op.operands.begin(), op.operands.end());
  for (const ir::Region& r : op.regions)
    for (const ir::Op& inner : r.ops) collect_uses(inner, out);
}
}  // namespace

void Interpreter::plan_releases(const ir::Region& r) {
  // Every value is defined in exactly one region, so one table of "defining region" and one of
  // "index of the last user in that region" serve all regions.
  if (def_region_.empty()) {
    def_region_.assign(kernel_.values.size(), nullptr);
    last_use_.assign(kernel_.values.size(), 0);
  }
  std::vector<ir::ValueId> uses, defined;
  for (size_t i = 0; i < r.ops.size(); ++i) {
    const ir::Op& op = r.ops[i];
    for (const ir::Region& sub : op.regions) plan_releases(sub);
    uses.clear();
    collect_uses(op, uses);
    // A fused accumulate-dot reads the dot's operands at its store.
    if (op.code == ir::OpCode::Store) {
      int f = fusions_.store_fusion[static_cast<size_t>(op.operands.back())];
      if (f >= 0) {
        const ir::Op* dot = fusions_.accumulate_dots[static_cast<size_t>(f)].dot;
        uses.insert(uses.end(), dot->operands.begin(), dot->operands.end());
      }
    }
    for (ir::ValueId v : uses)
      if (def_region_[v] == &r) last_use_[v] = i;
    for (ir::ValueId res : op.results) {
      def_region_[res] = &r;
      last_use_[res] = i;
      defined.push_back(res);
    }
  }
  std::vector<std::vector<ir::ValueId>> rel(r.ops.size());
  for (ir::ValueId v : defined) {
    size_t i = last_use_[v];
    if (r.ops[i].code == ir::OpCode::Yield) continue;  // the enclosing op reads yielded values
    rel[i].push_back(v);
  }
  releases_[&r] = std::move(rel);
}

// acc += x·y as one sgemm with beta = 1 into the ref's memory when its rows are contiguous;
// otherwise the unfused ops.
void Interpreter::run_accumulate_dot(const AccumulateDot& f, const RefValue& acc) {
  Array x = array(f.dot->operands[0]), y = array(f.dot->operands[1]);
  if (x.dtype() != DType::F32) x = convert(x, DType::F32);
  if (y.dtype() != DType::F32) y = convert(y, DType::F32);
  const int64_t m = x.dim(0), kk = x.dim(1), n = y.dim(1);
  if (acc.shape.size() == 2 && acc.strides[1] == 1 && acc.shape[0] == m && acc.shape[1] == n &&
      m > 0 && n > 0) {
    if (kk > 0)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                  static_cast<int>(kk), 1.0f, x.data<float>(), static_cast<int>(kk), y.data<float>(),
                  static_cast<int>(n), 1.0f, reinterpret_cast<float*>(acc.data),
                  static_cast<int>(acc.strides[0]));
    return;
  }
  Array d = dot_general(array(f.dot->operands[0]), array(f.dot->operands[1]), f.dot->attrs);
  write(acc, binary(ir::OpCode::Add, read(acc), d));
}

const Array& Interpreter::array(ir::ValueId v) const {
  const Array* a = std::get_if<Array>(&env_[static_cast<size_t>(v)]);
  PALLAS_INTERNAL_CHECK(a != nullptr, "value is not an array at run time");
  return *a;
}

const RefValue& Interpreter::ref(ir::ValueId v) const {
  const RefValue* r = std::get_if<RefValue>(&env_[static_cast<size_t>(v)]);
  PALLAS_INTERNAL_CHECK(r != nullptr, "value is not a ref at run time");
  return *r;
}

int64_t Interpreter::scalar_int(ir::ValueId v) const { return array(v).scalar_at_flat(0).as_int64(); }

std::vector<Array> Interpreter::run(const std::vector<RtValue>& params, const GridPoint& grid) {
  const auto& args = kernel_.body.args;
  if (params.size() != args.size())
    throw Error("kernel '" + kernel_.name + "' takes " + std::to_string(args.size()) +
                " parameters, got " + std::to_string(params.size()));
  // Values are SSA: every slot is written before it is read, so slots are not reset between
  // runs (assigning into a slot that holds the same kind of value reuses its storage).
  if (env_.size() != kernel_.values.size()) env_.assign(kernel_.values.size(), RtValue{});
  for (size_t i = 0; i < args.size(); ++i) env_[args[i]] = params[i];
  grid_ = &grid;
  return run_region_yield(kernel_.body);
}

void Interpreter::run_region(const ir::Region& r) {
  const std::vector<std::vector<ir::ValueId>>& rel = releases_.at(&r);
  for (size_t i = 0; i < r.ops.size(); ++i) {
    eval_op(r.ops[i]);
    for (ir::ValueId v : rel[i]) env_[static_cast<size_t>(v)] = RtValue{};
  }
}

std::vector<Array> Interpreter::run_region_yield(const ir::Region& r) {
  run_region(r);
  std::vector<Array> out;
  if (!r.ops.empty() && r.ops.back().code == OpCode::Yield)
    for (ir::ValueId v : r.ops.back().operands) out.push_back(array(v));
  return out;
}

void Interpreter::eval_op(const ir::Op& op) {
  if (op.results.size() == 1 && fusions_.skip[static_cast<size_t>(op.results[0])]) return;
  if (eval_extension_op(op)) return;
  const uint32_t cat = op.info().categories;
  // Named regions only annotate the kernel for the GPU backend's profiler.
  if (op.code == OpCode::NamedRegionBegin || op.code == OpCode::NamedRegionEnd) return;
  if ((cat & ir::kSideEffect && op.code != OpCode::DebugPrint && op.code != OpCode::DebugCheck) ||
      op.code == OpCode::AxisIndex)
    throw NotSupportedError(std::string(op.info().name) +
                                " outside the TPU interpret mode (run the call with .interpret = "
                                "pltpu::InterpretParams{})",
                            op.loc);
  if (cat & (ir::kControl | ir::kTerminator)) return eval_control(op);
  if (is_sparse_core_ref_op(op.code)) return eval_sparse_core_ref_op(op);
  if (cat & (ir::kMemRead | ir::kMemWrite) || op.code == OpCode::RefView) return eval_ref_op(op);
  if (ir::is_ref_transform(op.code)) {
    set(op.results[0], transformed(ref(op.operands[0]), op));
    return;
  }
  switch (op.code) {
    case OpCode::ProgramId:
    case OpCode::NumPrograms: {
      int64_t axis = op.attrs.get_int(AttrKey::Axis);
      const auto& v = op.code == OpCode::ProgramId ? grid_->program_ids : grid_->num_programs;
      if (axis >= static_cast<int64_t>(v.size()))
        throw Error(std::string(op.info().name) + "(" + std::to_string(axis) + "): the grid has " +
                        std::to_string(v.size()) + " axes",
                    op.loc);
      set(op.results[0], constant(Scalar::of_int(v[axis], DType::I32), {}));
      return;
    }
    case OpCode::DebugCheck: {
      if (!debug_checks_ || scalar_int(op.operands[0]) != 0) return;
      throw Error("debug_check failed: " + op.attrs.get_string(AttrKey::Format) +
                      at_grid_point(grid_->program_ids) + debug_check_context(),
                  op.loc);
    }
    case OpCode::DebugPrint: {
      const std::string& fmt = op.attrs.get_string(AttrKey::Format);
      std::string out;
      size_t pos = 0, k = 0;
      for (size_t p = fmt.find("{}"); p != std::string::npos; p = fmt.find("{}", pos)) {
        out += fmt.substr(pos, p - pos);
        const Array& a = array(op.operands[k++]);
        out += a.rank() == 0 ? a.scalar_at_flat(0).to_string() : a.to_string();
        pos = p + 2;
      }
      out += fmt.substr(pos);
      static std::mutex print_mutex;
      std::lock_guard<std::mutex> lock(print_mutex);
      (debug_out_ ? *debug_out_ : std::cout) << out << "\n";
      return;
    }
    default: break;
  }
  // Pure ops: operands by pointer (no handle copies on this hot path).
  const Array* small[8];
  std::vector<const Array*> big;
  std::span<const Array* const> in;
  if (op.operands.size() <= 8) {
    for (size_t i = 0; i < op.operands.size(); ++i) small[i] = &array(op.operands[i]);
    in = std::span<const Array* const>(small, op.operands.size());
  } else {
    for (ir::ValueId v : op.operands) big.push_back(&array(v));
    in = big;
  }
  if (op.results.size() == 1) {
    set(op.results[0], pure_op1(op, in));
    return;
  }
  std::vector<Array> res = pure_op(op, in);
  for (size_t i = 0; i < res.size(); ++i) set(op.results[i], std::move(res[i]));
}

void Interpreter::eval_control(const ir::Op& op) {
  switch (op.code) {
    case OpCode::Yield: return;  // read by the enclosing op
    case OpCode::For: {
      const ir::Region& body = op.regions[0];
      int64_t lo = scalar_int(op.operands[0]);
      int64_t hi = scalar_int(op.operands[1]);
      DType index_dtype = array(op.operands[0]).dtype();
      std::vector<Array> carries;
      for (size_t i = 2; i < op.operands.size(); ++i) carries.push_back(array(op.operands[i]));
      for (int64_t i = lo; i < hi; ++i) {
        set(body.args[0], constant(Scalar::of_int(i, index_dtype), {}));
        for (size_t c = 0; c < carries.size(); ++c) set(body.args[c + 1], carries[c]);
        carries = run_region_yield(body);
      }
      for (size_t c = 0; c < carries.size(); ++c) set(op.results[c], carries[c]);
      return;
    }
    case OpCode::While: {
      const ir::Region& cond = op.regions[0];
      const ir::Region& body = op.regions[1];
      std::vector<Array> carries;
      for (ir::ValueId v : op.operands) carries.push_back(array(v));
      while (true) {
        for (size_t c = 0; c < carries.size(); ++c) set(cond.args[c], carries[c]);
        if (run_region_yield(cond).at(0).get_flat(0) == 0) break;
        for (size_t c = 0; c < carries.size(); ++c) set(body.args[c], carries[c]);
        carries = run_region_yield(body);
      }
      for (size_t c = 0; c < carries.size(); ++c) set(op.results[c], carries[c]);
      return;
    }
    case OpCode::Cond:
    case OpCode::Switch: {
      int64_t index;
      if (op.code == OpCode::Cond) {
        index = array(op.operands[0]).get_flat(0) != 0 ? 0 : 1;
      } else {
        index = std::clamp<int64_t>(scalar_int(op.operands[0]), 0,
                                    static_cast<int64_t>(op.regions.size()) - 1);
      }
      std::vector<Array> res = run_region_yield(op.regions[static_cast<size_t>(index)]);
      for (size_t i = 0; i < res.size(); ++i) set(op.results[i], res[i]);
      return;
    }
    case OpCode::RunScoped: {
      const ir::Region& body = op.regions[0];
      for (ir::ValueId a : body.args) {
        const ir::Type& t = kernel_.type(a);
        Array buf = Array::uninitialized(t.shape, t.dtype);
        fill_uninitialized(buf);
        set(a, RefValue::of_array(buf, t.space));
      }
      std::vector<Array> res = run_region_yield(body);
      for (ir::ValueId a : body.args) set(a, RtValue{});  // the scope's buffers die here
      for (size_t i = 0; i < res.size(); ++i) set(op.results[i], res[i]);
      return;
    }
    default: break;
  }
  throw InternalError("eval_control on " + std::string(op.info().name));
}

namespace {

// Applies an atomic read-modify-write elementwise; returns nothing (new values in `cur`).
template <class T> T rmw(const std::string& kind, T cur, T v) {
  if (kind == "xchg") return v;
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
    float a = static_cast<float>(cur), b = static_cast<float>(v);
    if (kind == "add") return T(a + b);
    if (kind == "max") return T(std::isnan(a) || a >= b ? a : b);
    if (kind == "min") return T(std::isnan(a) || a <= b ? a : b);
  } else if constexpr (std::is_same_v<T, bool>) {
    if (kind == "add" || kind == "or" || kind == "max") return cur || v;
    if (kind == "and" || kind == "min") return cur && v;
    if (kind == "xor") return cur != v;
  } else {
    if (kind == "add") {
      if constexpr (std::is_integral_v<T>)
        return static_cast<T>(static_cast<std::make_unsigned_t<T>>(cur) +
                              static_cast<std::make_unsigned_t<T>>(v));
      else
        return cur + v;
    }
    if (kind == "max") return std::isnan(static_cast<double>(cur)) || cur >= v ? cur : v;
    if (kind == "min") return std::isnan(static_cast<double>(cur)) || cur <= v ? cur : v;
    if constexpr (std::is_integral_v<T>) {
      if (kind == "and") return cur & v;
      if (kind == "or") return cur | v;
      if (kind == "xor") return cur ^ v;
    }
  }
  throw InternalError("atomic kind " + kind);
}

}  // namespace

void atomic_combine(const std::string& kind, Array& cur, const Array& value) {
  visit_dtype(cur.dtype(), [&]<class T>() {
    T* c = cur.data<T>();
    const T* v = value.data<T>();
    for (int64_t i = 0; i < cur.size(); ++i) c[i] = rmw<T>(kind, c[i], v[i]);
  });
}

void Interpreter::out_of_bounds(const ir::Op& op, const RefValue&, std::span<const int64_t>,
                                const Error& e) {
  throw Error(std::string(op.info().name) + ": " + e.what() + at_grid_point(grid_->program_ids), op.loc);
}

void Interpreter::eval_ref_op(const ir::Op& op) {
  const RefValue& base = ref(op.operands[0]);
  const ir::Indexer& index = op.attrs.get_indexer(AttrKey::Index);
  size_t ndyn = 0;
  int64_t dyn[16];
  std::vector<int64_t> dyn_big;
  for (const ir::IndexEntry& e : index.entries)
    if (e.dynamic >= 0) ++ndyn;
  std::span<const int64_t> dynamic;
  if (ndyn <= 16) {
    for (size_t i = 0; i < ndyn; ++i) dyn[i] = scalar_int(op.operands[1 + i]);
    dynamic = std::span<const int64_t>(dyn, ndyn);
  } else {
    for (size_t i = 0; i < ndyn; ++i) dyn_big.push_back(scalar_int(op.operands[1 + i]));
    dynamic = dyn_big;
  }
  RefValue v;
  try {
    v = view(base, index, dynamic);
  } catch (const Error& e) {
    out_of_bounds(op, base, dynamic, e);
  }
  size_t next = 1 + ndyn;
  bool masked = op.attrs.get_int_or(AttrKey::Masked, 0) != 0;
  if (op.code == OpCode::RefView) {
    set(op.results[0], std::move(v));
    return;
  }
  AccessScope scope(*this, op, v);
  switch (op.code) {
    case OpCode::RefView: break;
    case OpCode::Load: {
      Array x = read(v);
      if (masked) x = select(array(op.operands[next]), x, array(op.operands[next + 1]));
      set(op.results[0], std::move(x));
      return;
    }
    case OpCode::Store:
    case OpCode::Swap: {
      if (op.code == OpCode::Store) {
        int fused = fusions_.store_fusion[static_cast<size_t>(op.operands[next])];
        if (fused >= 0) return run_accumulate_dot(fusions_.accumulate_dots[fused], v);
      }
      if (op.code == OpCode::Store && !masked) return write(v, array(op.operands[next]));
      Array value = array(op.operands[next]);
      Array old = read(v);
      if (masked) value = select(array(op.operands[next + 1]), value, old);
      write(v, value);
      if (op.code == OpCode::Swap) set(op.results[0], std::move(old));
      return;
    }
    case OpCode::AtomicRmw:
    case OpCode::AtomicCas: {
      Array old = read(v);
      Array updated = old.clone();
      const std::string kind =
          op.code == OpCode::AtomicRmw ? op.attrs.get_string(AttrKey::Kind) : std::string("cas");
      visit_dtype(v.dtype, [&]<class T>() {
        T* cur = updated.data<T>();
        if (op.code == OpCode::AtomicRmw) {
          atomic_combine(kind, updated, array(op.operands[next]));
        } else {
          const T* expected = array(op.operands[next]).data<T>();
          const T* desired = array(op.operands[next + 1]).data<T>();
          for (int64_t i = 0; i < updated.size(); ++i)
            if (std::memcmp(&cur[i], &expected[i], sizeof(T)) == 0) cur[i] = desired[i];
        }
      });
      write(v, updated);
      set(op.results[0], std::move(old));
      return;
    }
    default: break;
  }
  throw InternalError("eval_ref_op on " + std::string(op.info().name));
}

}  // namespace pallas::eval

namespace pallas {

void evaluate(const ir::Kernel& k, std::span<Array> buffers, const EvaluateOptions& opts) {
  const auto& args = k.body.args;
  if (buffers.size() != args.size())
    throw Error("evaluate: kernel '" + k.name + "' takes " + std::to_string(args.size()) +
                " Refs, got " + std::to_string(buffers.size()) + " buffers");
  std::vector<eval::RtValue> params;
  for (size_t i = 0; i < args.size(); ++i) {
    const ir::Type& t = k.type(args[i]);
    Array& b = buffers[i];
    if (!t.is_ref)
      throw Error("evaluate: parameter " + std::to_string(i) + " of kernel '" + k.name +
                  "' is not a Ref");
    if (b.shape() != t.shape || b.dtype() != t.dtype)
      throw Error("evaluate: buffer " + std::to_string(i) + " is " + b.shape_dtype().to_string() +
                  " but kernel '" + k.name + "' expects " + t.to_string());
    params.push_back(eval::RefValue::of_array(b, t.space));
  }
  eval::Interpreter interp(k);
  interp.set_debug_out(opts.debug_out);
  interp.set_debug_checks(opts.debug_checks);
  interp.run(params, opts.grid);
}

}  // namespace pallas
