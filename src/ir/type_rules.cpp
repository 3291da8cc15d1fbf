// Result-type rules: one per op, keyed by the op table. Tracing calls them when it builds an op
// (so a user mistake is reported at trace time, at the user's line) and the verifier calls them
// again on a whole kernel (so a parsed or transformed kernel is checked the same way).
#include <algorithm>
#include <set>

#include "ir/shapes.h"
#include "pallas/ir/ir.h"

#pragma GCC diagnostic error "-Wswitch"

namespace pallas::ir {

namespace {

struct RuleContext {
  OpCode code;
  const std::vector<Type>& operands;
  const Attrs& attrs;
  const std::vector<RegionSignature>& regions;
  const SourceLoc& loc;

  [[noreturn]] void fail(const std::string& msg) const {
    throw Error(std::string(op_info(code).name) + ": " + msg, loc);
  }
  const Type& operand(size_t i) const {
    if (i >= operands.size())
      fail("expected at least " + std::to_string(i + 1) + " operands, got " +
           std::to_string(operands.size()));
    return operands[i];
  }
  void expect_num_operands(size_t n) const {
    if (operands.size() != n)
      fail("expected " + std::to_string(n) + " operands, got " + std::to_string(operands.size()));
  }
  void expect_num_regions(size_t n) const {
    if (regions.size() != n)
      fail("expected " + std::to_string(n) + " regions, got " + std::to_string(regions.size()));
  }
  const Type& tensor(size_t i) const {
    const Type& t = operand(i);
    if (t.is_ref)
      fail("operand " + std::to_string(i) + " must be an array value, got the Ref " +
           t.to_string() + " (load from it first)");
    return t;
  }
  const Type& ref(size_t i) const {
    const Type& t = operand(i);
    if (!t.is_ref) fail("operand " + std::to_string(i) + " must be a Ref, got " + t.to_string());
    return t;
  }
  void expect_int_scalar(size_t i, const char* what) const {
    const Type& t = tensor(i);
    if (!t.is_scalar() || !is_integer(t.dtype))
      fail(std::string(what) + " must be an integer scalar, got " + t.to_string());
  }
  int64_t int_attr(AttrKey k) const {
    const AttrValue* v = attrs.find(k);
    if (!v || !std::holds_alternative<int64_t>(*v))
      fail("missing integer attribute '" + std::string(attr_name(k)) + "'");
    return std::get<int64_t>(*v);
  }
  const Ints& ints_attr(AttrKey k) const {
    const AttrValue* v = attrs.find(k);
    if (!v || !std::holds_alternative<Ints>(*v))
      fail("missing integer-list attribute '" + std::string(attr_name(k)) + "'");
    return std::get<Ints>(*v);
  }
  DType dtype_attr(AttrKey k) const {
    const AttrValue* v = attrs.find(k);
    if (!v || !std::holds_alternative<DType>(*v))
      fail("missing dtype attribute '" + std::string(attr_name(k)) + "'");
    return std::get<DType>(*v);
  }
  const std::string& string_attr(AttrKey k) const {
    const AttrValue* v = attrs.find(k);
    if (!v || !std::holds_alternative<std::string>(*v))
      fail("missing string attribute '" + std::string(attr_name(k)) + "'");
    return std::get<std::string>(*v);
  }
  const Indexer& indexer_attr() const {
    const AttrValue* v = attrs.find(AttrKey::Index);
    if (!v || !std::holds_alternative<Indexer>(*v)) fail("missing attribute 'index'");
    return std::get<Indexer>(*v);
  }
  int64_t axis_in(int64_t axis, int rank, const char* what = "axis") const {
    if (axis < 0 || axis >= rank)
      fail(std::string(what) + " " + std::to_string(axis) + " is out of range for rank " +
           std::to_string(rank));
    return axis;
  }
  // Distinct axes, each in [0, rank).
  void axes_in(const Ints& axes, int rank, const char* what) const {
    std::set<int64_t> seen;
    for (int64_t a : axes) {
      axis_in(a, rank, what);
      if (!seen.insert(a).second) fail(std::string(what) + " repeats axis " + std::to_string(a));
    }
  }
};

// A semaphore Ref of rank 0 (index an array of semaphores first: sem.at(i)).
void expect_semaphore(const RuleContext& c, size_t i, const char* what, bool any_kind) {
  const Type& t = c.ref(i);
  if (!is_semaphore(t.dtype) || t.dtype == DType::GpuBarrier ||
      (!any_kind && t.dtype == DType::BarrierSemaphore))
    c.fail(std::string(what) + " must be a " + (any_kind ? "semaphore" : "DMA or regular semaphore") +
           " Ref, got " + t.to_string());
  if (t.rank() != 0)
    c.fail(std::string(what) + " must be a single semaphore, got the array " + t.to_string() +
           " (index it: sem.at(i))");
}

// ---- gpu::kernel primitives ---------------------------------------------------------------------
// One barrier: a gpu_barrier Ref of one element (rank 0, or an array of one).
void expect_gpu_barrier(const RuleContext& c, size_t i) {
  const Type& t = c.ref(i);
  if (t.dtype != DType::GpuBarrier)
    c.fail("the barrier must be a gpu::Barrier Ref, got " + t.to_string());
  if (t.size() != 1)
    c.fail("the barrier must be a single barrier, got the array " + t.to_string() +
           " (index it: barriers.at(i))");
}

void expect_space(const RuleContext& c, size_t i, MemorySpace space, const char* what) {
  const Type& t = c.ref(i);
  const bool ok = t.space == space || (space == MemorySpace::Gmem && t.space == MemorySpace::Any);
  if (!ok)
    c.fail(std::string(what) + " must be a Ref in " + std::string(memory_space_name(space)) + ", got " +
           t.to_string());
  if (is_semaphore(t.dtype)) c.fail(std::string(what) + " cannot be a barrier or semaphore Ref");
}

std::vector<Type> gpu_kernel_rule(const RuleContext& c) {
  switch (c.code) {
    case OpCode::GpuCopyGmemToSmem: case OpCode::GpuCopySmemToGmem: {
      const bool to_smem = c.code == OpCode::GpuCopyGmemToSmem;
      c.expect_num_operands(to_smem ? 3 : 2);
      expect_space(c, 0, to_smem ? MemorySpace::Gmem : MemorySpace::GpuShared, "the source");
      expect_space(c, 1, to_smem ? MemorySpace::GpuShared : MemorySpace::Gmem, "the destination");
      const Type& src = c.ref(0);
      const Type& dst = c.ref(1);
      if (src.shape != dst.shape || src.dtype != dst.dtype)
        c.fail("the source " + src.to_string() + " and the destination " + dst.to_string() +
               " need the same shape and dtype");
      if (to_smem) expect_gpu_barrier(c, 2);
      if (!to_smem && c.attrs.has(AttrKey::Kind)) {  // a reduction into the destination
        const std::string& kind = c.string_attr(AttrKey::Kind);
        static const std::set<std::string> kinds = {"add", "max", "min", "and", "or", "xor"};
        if (!kinds.count(kind))
          c.fail("unknown reduction_op '" + kind + "' (add, min, max, and, or, xor)");
        if ((kind == "and" || kind == "or" || kind == "xor") && !is_integer(dst.dtype))
          c.fail("reduction_op '" + kind + "' needs an integer destination, got " + dst.to_string());
        if (dst.dtype == DType::Bool) c.fail("a reduction into a bool destination");
      }
      return {};
    }
    case OpCode::GpuCommitSmemToGmemGroup:
      c.expect_num_operands(0);
      return {};
    case OpCode::GpuWaitSmemToGmem:
      c.expect_num_operands(0);
      if (c.int_attr(AttrKey::N) < 0)
        c.fail("n (the copies that may stay in flight) must be >= 0, got " + std::to_string(c.int_attr(AttrKey::N)));
      (void)c.int_attr(AttrKey::ReadOnly);
      return {};
    case OpCode::GpuWgmmaWait:
      c.expect_num_operands(0);
      if (c.int_attr(AttrKey::N) < 0)
        c.fail("n (the wgmmas that may stay in flight) must be >= 0, got " + std::to_string(c.int_attr(AttrKey::N)));
      return {};
    case OpCode::GpuCommitSmem:
      c.expect_num_operands(0);
      return {};
    case OpCode::GpuAsyncPrefetch:
      c.expect_num_operands(1);
      expect_space(c, 0, MemorySpace::Gmem, "the prefetched Ref");
      return {};
    case OpCode::GpuClusterRef: {
      c.expect_num_operands(2);
      const Type& r = c.ref(0);
      if (r.space != MemorySpace::GpuShared || is_semaphore(r.dtype) || r.dtype == DType::GpuBarrier)
        c.fail("the Ref must be an SMEM array (a barrier reaches its peers as a gpu::ClusterBarrier), got " +
               r.to_string());
      c.expect_int_scalar(1, "the cluster index");
      if (c.ints_attr(AttrKey::Axes).size() != 1) c.fail("names one cluster axis");
      return {r};
    }
    case OpCode::GpuBarrierArrive: case OpCode::GpuBarrierWait:
      c.expect_num_operands(1);
      expect_gpu_barrier(c, 0);
      return {};
    case OpCode::GpuSetMaxRegisters: {
      c.expect_num_operands(0);
      const int64_t n = c.int_attr(AttrKey::N);
      const std::string& kind = c.string_attr(AttrKey::Kind);
      if (kind != "increase" && kind != "decrease")
        c.fail("kind must be \"increase\" or \"decrease\", got \"" + kind + "\"");
      if (n < 24 || n > 256 || n % 8 != 0)
        c.fail("the register count must be a multiple of 8 in [24, 256] (setmaxnreg), got " +
               std::to_string(n));
      return {};
    }
    case OpCode::GpuWgmma: {
      c.expect_num_operands(3);
      const Type& acc = c.ref(0);
      if (acc.space != MemorySpace::GpuAcc)
        c.fail("the accumulator must be a gpu::ACC Ref, got " + acc.to_string());
      // a: an SMEM Ref, or a value (registers).
      const bool a_in_registers = !c.operand(1).is_ref;
      if (!a_in_registers) expect_space(c, 1, MemorySpace::GpuShared, "a");
      expect_space(c, 2, MemorySpace::GpuShared, "b");
      const Type& lhs = c.operand(1);
      const Type& rhs = c.ref(2);
      if (acc.rank() != 2 || lhs.rank() != 2 || rhs.rank() != 2)
        c.fail("acc, a and b must be 2-D (M x N, M x K, K x N), got " + acc.to_string() + ", " +
               lhs.to_string() + ", " + rhs.to_string());
      const int64_t m = acc.shape[0], n = acc.shape[1], k = lhs.shape[1];
      if (lhs.shape[0] != m || rhs.shape[0] != k || rhs.shape[1] != n)
        c.fail("shapes do not chain: acc " + acc.to_string() + " += a " + lhs.to_string() +
               " @ b " + rhs.to_string());
      if (lhs.dtype != rhs.dtype)
        c.fail("a and b need the same dtype, got " + lhs.to_string() + " and " + rhs.to_string());
      if (lhs.dtype != DType::F16 && lhs.dtype != DType::BF16 && lhs.dtype != DType::F32)
        c.fail("a and b must be f16, bf16 or f32 (tf32), got " + std::string(dtype_name(lhs.dtype)));
      if (acc.dtype != DType::F32 && !(acc.dtype == DType::F16 && lhs.dtype == DType::F16))
        c.fail("the accumulator must be f32 (or f16 with f16 inputs), got " + acc.to_string());
      if (m % 64 != 0)
        c.fail("M (acc rows) must be a multiple of 64 (one warpgroup's wgmma), got " + std::to_string(m));
      if (n % 8 != 0 || n > 256)
        c.fail("N (acc columns) must be a multiple of 8 and at most 256, got " + std::to_string(n));
      const int64_t k_step = 32 / itemsize(lhs.dtype);  // one wgmma instruction consumes 32 bytes of K
      if (k % k_step != 0)
        c.fail("K must be a multiple of " + std::to_string(k_step) + " for " +
               std::string(dtype_name(lhs.dtype)) + " inputs, got " + std::to_string(k));
      return {};
    }
    default: break;
  }
  throw InternalError("gpu_kernel_rule called on " + std::string(op_info(c.code).name));
}

// Operands from `first` on are the device id: one integer scalar (logical), or one per mesh axis.
void expect_device_id(const RuleContext& c, size_t first) {
  const std::string& kind = c.string_attr(AttrKey::DeviceIdType);
  if (kind != "mesh" && kind != "logical")
    c.fail("device_id_type must be \"mesh\" or \"logical\", got \"" + kind + "\"");
  if (c.operands.size() <= first) c.fail("missing the device id");
  if (kind == "logical" && c.operands.size() != first + 1)
    c.fail("a logical device id is one integer scalar");
  for (size_t i = first; i < c.operands.size(); ++i) c.expect_int_scalar(i, "a device id");
}

std::string ints_to_string(const Ints& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string types_to_string(const std::vector<Type>& ts) {
  std::string s = "(";
  for (size_t i = 0; i < ts.size(); ++i) s += (i ? ", " : "") + ts[i].to_string();
  return s + ")";
}

// transpose's rule, for a value or a Ref: the dims in the permutation's order.
Type transposed_type(const RuleContext& c, Type t) {
  const Ints& perm = c.ints_attr(AttrKey::Permutation);
  if (static_cast<int>(perm.size()) != t.rank())
    c.fail("permutation " + ints_to_string(perm) + " does not match the rank of " + t.to_string());
  c.axes_in(perm, t.rank(), "permutation");
  Shape shape;
  for (int64_t p : perm) shape.push_back(t.shape[static_cast<size_t>(p)]);
  t.shape = std::move(shape);
  return t;
}

// reshape's rule, for a value or a Ref: the same number of elements.
Type reshaped_type(const RuleContext& c, Type t) {
  Shape shape = c.ints_attr(AttrKey::ShapeAttr);
  for (int64_t d : shape)
    if (d < 0) c.fail("negative dimension in " + ints_to_string(shape));
  if (num_elements(shape) != t.size())
    c.fail("cannot reshape " + t.to_string() + " (" + std::to_string(t.size()) + " elements) to " +
           ints_to_string(shape) + " (" + std::to_string(num_elements(shape)) + " elements)");
  t.shape = std::move(shape);
  return t;
}

// lax.bitcast_convert_type's rule, for a value or a Ref: the same width keeps the shape, a
// narrower dtype adds a last dim of the ratio, a wider one takes a last dim of it away.
Type bitcast_type(const RuleContext& c, Type t) {
  DType to = c.dtype_attr(AttrKey::DTypeAttr);
  if (t.dtype == DType::Bool || to == DType::Bool || is_semaphore(t.dtype) || is_semaphore(to))
    c.fail("bitcast needs numeric dtypes, got " + std::string(dtype_name(t.dtype)) + " -> " +
           std::string(dtype_name(to)));
  int from_bits = bit_width(t.dtype), to_bits = bit_width(to);
  if (from_bits > to_bits) {
    t.shape.push_back(from_bits / to_bits);
  } else if (from_bits < to_bits) {
    int64_t ratio = to_bits / from_bits;
    if (t.shape.empty() || t.shape.back() != ratio)
      c.fail("bitcast from " + std::string(dtype_name(t.dtype)) + " to " + std::string(dtype_name(to)) +
             " needs a last dimension of " + std::to_string(ratio) + ", got " + t.to_string());
    t.shape.pop_back();
  }
  t.dtype = to;
  return t;
}

void check_elementwise_dtype(const RuleContext& c, DType t) {
  const OpInfo& info = op_info(c.code);
  std::string dt(dtype_name(t));
  if (is_semaphore(t)) c.fail("semaphore values support no arithmetic");
  if (info.is(kFloatOnly) && !is_float(t)) c.fail("needs a floating-point operand, got " + dt);
  if (info.is(kIntOnly) && !is_integer(t)) c.fail("needs an integer operand, got " + dt);
  if (info.is(kIntOrBoolOnly) && !is_integer(t) && t != DType::Bool)
    c.fail("needs an integer or bool operand, got " + dt);
  bool arithmetic = info.is(kUnary) || info.is(kBinary) || info.is(kReduce) || info.is(kScan);
  bool bool_ok = info.is(kIntOrBoolOnly) || c.code == OpCode::Max || c.code == OpCode::Min ||
                 c.code == OpCode::ReduceMax || c.code == OpCode::ReduceMin ||
                 c.code == OpCode::Cummax || c.code == OpCode::Cummin ||
                 c.code == OpCode::Argmax || c.code == OpCode::Argmin;
  if (arithmetic && t == DType::Bool && !bool_ok) c.fail("does not accept bool operands");
}

Type same_types(const RuleContext& c, size_t first, size_t count) {
  const Type& a = c.tensor(first);
  for (size_t i = first + 1; i < first + count; ++i) {
    const Type& b = c.tensor(i);
    if (!(a == b))
      c.fail("operand types differ: " + a.to_string() + " vs " + b.to_string());
  }
  return a;
}

// The shape of what `index` selects from a ref of type `ref`, after checking the entries and
// that dynamic entries refer to integer scalar operands 1..n in order. Returns the number of
// dynamic operands.
int check_indexer(const RuleContext& c, const Type& ref, const Indexer& index) {
  if (static_cast<int>(index.entries.size()) != ref.rank())
    c.fail("indexer has " + std::to_string(index.entries.size()) + " entries for a ref of rank " +
           std::to_string(ref.rank()) + " (" + ref.to_string() + ")");
  int next_dynamic = 1;
  for (size_t d = 0; d < index.entries.size(); ++d) {
    const IndexEntry& e = index.entries[d];
    int64_t dim = ref.shape[d];
    std::string where = "index entry " + std::to_string(d);
    if (e.dynamic >= 0) {
      if (e.dynamic != next_dynamic)
        c.fail(where + " refers to operand $" + std::to_string(e.dynamic) + ", expected $" +
               std::to_string(next_dynamic));
      c.expect_int_scalar(static_cast<size_t>(e.dynamic), "a dynamic index");
      ++next_dynamic;
    }
    if (e.is_slice) {
      if (e.size < 0) c.fail(where + ": negative slice size " + std::to_string(e.size));
      if (e.stride < 1) c.fail(where + ": slice stride must be >= 1, got " + std::to_string(e.stride));
      if (e.size > dim) c.fail(where + ": slice size " + std::to_string(e.size) +
                               " exceeds dimension " + std::to_string(dim) + " of " + ref.to_string());
      if (e.dynamic < 0 && e.size > 0) {
        // last = start + (size - 1) * stride, without overflow for hostile (parsed) values.
        int64_t span = 0, last = 0;
        bool overflow = __builtin_mul_overflow(e.size - 1, e.stride, &span) ||
                        __builtin_add_overflow(e.start, span, &last);
        if (overflow || e.start < 0 || last >= dim)
          c.fail(where + ": ds(" + std::to_string(e.start) + ", " + std::to_string(e.size) +
                 (e.stride != 1 ? ", " + std::to_string(e.stride) : std::string()) +
                 ") is out of bounds for dimension " + std::to_string(d) + " of size " +
                 std::to_string(dim));
      }
    } else if (e.dynamic < 0 && (e.start < 0 || e.start >= dim)) {
      c.fail(where + ": index " + std::to_string(e.start) + " is out of bounds for dimension " +
             std::to_string(d) + " of size " + std::to_string(dim));
    }
  }
  return next_dynamic - 1;
}

void check_region_yields(const RuleContext& c, size_t r, const std::vector<Type>& expected,
                         const char* what) {
  const std::vector<Type>& got = c.regions[r].yields;
  if (got != expected)
    c.fail(std::string(what) + " yields " + types_to_string(got) + ", expected " +
           types_to_string(expected));
}

void check_region_args(const RuleContext& c, size_t r, const std::vector<Type>& expected) {
  if (c.regions[r].args != expected)
    c.fail("region " + std::to_string(r) + " takes " + types_to_string(c.regions[r].args) +
           ", expected " + types_to_string(expected));
}

// ---- SparseCore vector subcore ops ------------------------------------------------------------
// The structural rules (ranks, dtypes, memory spaces, masks). The lane shapes depend on the
// SparseCore's configuration and are checked by tracing (src/trace/sc_ops.cpp).
const Type& sc_ref(const RuleContext& c, MemorySpace space) {
  const Type& r = c.ref(0);
  if (r.space != space)
    c.fail("only " + std::string(space == MemorySpace::Smem ? "SMEM" : "VMEM") + " refs are supported, got " +
           r.to_string() + (space == MemorySpace::Vmem ? " (copy the data to VMEM first, e.g. with pltpu::sync_copy)" : ""));
  return r;
}

const Type& sc_vector(const RuleContext& c, size_t i, const char* what) {
  const Type& t = c.tensor(i);
  if (t.rank() != 1) c.fail(std::string(what) + " must be a 1-D vector, got " + t.to_string());
  if (is_semaphore(t.dtype)) c.fail(std::string(what) + " cannot hold semaphores");
  return t;
}

void sc_mask(const RuleContext& c, size_t i, const Shape& shape) {
  const Type& m = c.tensor(i);
  if (m.dtype != DType::Bool) c.fail("the mask must be a bool array, got " + m.to_string());
  if (m.shape != shape)
    c.fail("the mask must have the shape " + ints_to_string(shape) + ", got " + m.to_string());
}

bool sc_scan_dtype(DType t) { return t == DType::U32 || t == DType::I32 || t == DType::F32; }

void sc_expect_scan_dtype(const RuleContext& c, const Type& t, const char* what) {
  if (!sc_scan_dtype(t.dtype))
    c.fail(std::string(what) + " must be u32, i32 or f32, got " + std::string(dtype_name(t.dtype)));
}

void sc_expect_numeric(const RuleContext& c, DType t, const char* what) {
  if (t == DType::Bool || is_semaphore(t))
    c.fail(std::string(what) + " must have a numeric dtype, got " + std::string(dtype_name(t)));
}

// The vector a value operand of a compressed / expanded access must match: the ref's region.
void sc_value_matches_ref(const RuleContext& c, size_t i, const Type& r) {
  const Type& x = c.tensor(i);
  if (x.dtype != r.dtype)
    c.fail("the ref and the value must have the same dtype, got " + r.to_string() + " and " + x.to_string());
  if (x.shape != r.shape)
    c.fail("the value must have the ref's shape " + ints_to_string(r.shape) + ", got " + x.to_string());
}

const std::string& sc_pack_format(const RuleContext& c) {
  const std::string& f = c.string_attr(AttrKey::Format);
  if (f != "interleaved" && f != "compressed")
    c.fail("format must be \"interleaved\" or \"compressed\", got \"" + f + "\"");
  return f;
}

std::vector<Type> sc_gather_scatter_rule(const RuleContext& c) {
  const Type& r = sc_ref(c, MemorySpace::Vmem);
  if (r.dtype != DType::I32 && r.dtype != DType::F32)
    c.fail("the ref's dtype must be i32 or f32, got " + r.to_string());
  if (r.rank() < 1) c.fail("cannot index the scalar ref " + r.to_string());
  const bool load = c.code == OpCode::ScLoadGather;
  const bool masked = c.attrs.get_int_or(AttrKey::Masked, 0) != 0;
  const size_t extra = 1 + (load ? 0 : 1) + (masked ? 1 : 0);
  const size_t num_indices = c.operands.size() >= extra ? c.operands.size() - extra : 0;
  if (num_indices != static_cast<size_t>(r.rank()))
    c.fail("needs one index vector per dimension of the ref " + r.to_string() + ", got " +
           std::to_string(num_indices));
  int64_t n = -1;
  for (size_t d = 0; d < num_indices; ++d) {
    const Type& ix = c.tensor(1 + d);
    if (ix.rank() != 1) c.fail("indices must be 1-D vectors, got an index of type " + ix.to_string());
    if (ix.dtype != DType::I32) c.fail("indices must be i32, got an index of type " + ix.to_string());
    if (n >= 0 && ix.shape[0] != n)
      c.fail("index vectors must have the same length, got " + std::to_string(n) + " and " +
             std::to_string(ix.shape[0]));
    n = ix.shape[0];
  }
  Type value = Type::tensor({n}, r.dtype);
  size_t next = 1 + num_indices;
  if (!load) {
    const Type& x = c.tensor(next++);
    if (x.dtype != r.dtype)
      c.fail("the value's dtype " + std::string(dtype_name(x.dtype)) + " differs from the ref's " + r.to_string());
    if (x.shape != value.shape)
      c.fail("the value must have the indices' shape " + ints_to_string(value.shape) + ", got " + x.to_string());
  }
  if (masked) sc_mask(c, next, value.shape);
  if (load) return {value};
  return {};
}

std::vector<Type> sparse_core_rule(const RuleContext& c) {
  const Attrs& a = c.attrs;
  switch (c.code) {
    case OpCode::ScLoadGather: case OpCode::ScStoreScatter: case OpCode::ScAddupdateScatter:
      return sc_gather_scatter_rule(c);
    case OpCode::ScLoadExpanded: case OpCode::ScStoreCompressed: case OpCode::ScAddupdate:
    case OpCode::ScAddupdateCompressed: {
      const Type& r = sc_ref(c, MemorySpace::Vmem);
      sc_expect_numeric(c, r.dtype, "the ref");
      if (r.rank() < 1) c.fail("needs a vector ref, got the scalar ref " + r.to_string());
      if (c.code == OpCode::ScLoadExpanded) {
        sc_mask(c, 1, r.shape);
        return {Type::tensor(r.shape, r.dtype)};
      }
      sc_value_matches_ref(c, 1, r);
      if (c.code != OpCode::ScAddupdate) sc_mask(c, 2, r.shape);
      return {};
    }
    case OpCode::ScFetchAndAdd: {
      const Type& r = sc_ref(c, MemorySpace::Smem);
      if (r.dtype != DType::I32) c.fail("only i32 refs are supported, got " + r.to_string());
      if (r.size() != 1) c.fail("expected a ref of one element (index it: ref.at(i)), got " + r.to_string());
      if (c.operands.size() != 2 && c.operands.size() != 3)
        c.fail("expected 2 or 3 operands (ref, value, [subcore_id]), got " + std::to_string(c.operands.size()));
      const Type& v = c.tensor(1);
      if (!(v == Type::scalar(DType::I32))) c.fail("the value must be an i32 scalar, got " + v.to_string());
      if (c.operands.size() == 3 && !(c.tensor(2) == Type::scalar(DType::I32)))
        c.fail("subcore_id must be an i32 scalar, got " + c.operands[2].to_string());
      return {Type::scalar(DType::I32)};
    }
    case OpCode::ScMaskedScan: case OpCode::ScScanCount: {
      const Type& x = sc_vector(c, 0, "x");
      sc_expect_scan_dtype(c, x, "x");
      sc_mask(c, 1, x.shape);
      if (c.code == OpCode::ScScanCount)
        return {Type::tensor(x.shape, DType::I32), Type::tensor(x.shape, DType::Bool)};
      const std::string& kind = c.string_attr(AttrKey::Kind);
      if (kind != "sum" && kind != "max" && kind != "min")
        c.fail("kind must be \"sum\", \"max\" or \"min\", got \"" + kind + "\"");
      return {x};
    }
    case OpCode::ScSortKeyVal: {
      const bool masked = a.get_int_or(AttrKey::Masked, 0) != 0;
      if (c.operands.size() < (masked ? 3u : 2u)) c.fail("needs the keys and at least one value vector");
      const Type& keys = sc_vector(c, 0, "the keys");
      sc_expect_scan_dtype(c, keys, "the keys");
      const size_t num_values = c.operands.size() - 1 - (masked ? 1 : 0);
      std::vector<Type> out = {keys};
      for (size_t i = 1; i <= num_values; ++i) {
        const Type& v = c.tensor(i);
        if (v.shape != keys.shape)
          c.fail("values " + v.to_string() + " must have the keys' shape " + ints_to_string(keys.shape));
        if (bit_width(v.dtype) != 32 || is_semaphore(v.dtype))
          c.fail("values must have a 32-bit dtype, got " + v.to_string());
        out.push_back(v);
      }
      if (masked) {
        sc_mask(c, c.operands.size() - 1, keys.shape);
        out.push_back(c.operands.back());
      }
      return out;
    }
    case OpCode::ScAllReducePopulationCount: case OpCode::ScAllReduceFfs: {
      c.expect_num_operands(1);
      const Type& x = sc_vector(c, 0, "the mask");
      if (x.dtype != DType::Bool) c.fail("needs a bool vector, got " + x.to_string());
      const int64_t reduce = c.int_attr(AttrKey::Reduce);
      if (reduce < 1) c.fail("reduce must be >= 1, got " + std::to_string(reduce));
      if (x.shape[0] % reduce != 0)
        c.fail("reduce=" + std::to_string(reduce) + " must divide the vector's length " + std::to_string(x.shape[0]));
      return {Type::tensor({x.shape[0] / reduce}, DType::I32)};
    }
    case OpCode::ScPack: {
      Type x = same_types(c, 0, 2);
      sc_vector(c, 0, "the packed arrays");
      sc_expect_numeric(c, x.dtype, "the packed arrays");
      const DType to = c.dtype_attr(AttrKey::DTypeAttr);
      sc_expect_numeric(c, to, "the packed dtype");
      if (2 * bit_width(to) != bit_width(x.dtype))
        c.fail("the packed dtype must have half the bit width of " + std::string(dtype_name(x.dtype)) + " (" +
               std::to_string(bit_width(x.dtype) / 2) + " bits), got " + std::string(dtype_name(to)));
      const int64_t n = x.shape[0];
      return {Type::tensor(sc_pack_format(c) == "interleaved" ? Shape{2 * n} : Shape{n, 2}, to)};
    }
    case OpCode::ScUnpack: {
      const Type& ab = c.tensor(0);
      sc_expect_numeric(c, ab.dtype, "the packed array");
      if (sc_pack_format(c) == "interleaved") {
        if (ab.rank() != 1 || ab.shape[0] % 2 != 0)
          c.fail("an interleaved unpack needs a 1-D array of even length, got " + ab.to_string());
      } else if (ab.rank() != 2 || ab.shape[1] != 2) {
        c.fail("a compressed unpack needs an array of shape [n, 2], got " + ab.to_string());
      }
      const DType to = c.dtype_attr(AttrKey::DTypeAttr);
      sc_expect_numeric(c, to, "the unpacked dtype");
      if (bit_width(to) != 2 * bit_width(ab.dtype))
        c.fail("the unpacked dtype must have twice the bit width of " + std::string(dtype_name(ab.dtype)) + " (" +
               std::to_string(bit_width(ab.dtype) * 2) + " bits), got " + std::string(dtype_name(to)));
      Type half = Type::tensor({ab.size() / 2}, to);
      return {half, half};
    }
    case OpCode::ScDynamicGather: {
      const Type& x = sc_vector(c, 0, "the gathered vector");
      const Type& ix = c.tensor(1);
      if (ix.dtype != DType::I32 || ix.shape != x.shape)
        c.fail("the indices must be i32 with the vector's shape " + ints_to_string(x.shape) + ", got " + ix.to_string());
      return {x};
    }
    default: break;
  }
  throw InternalError("sparse_core_rule on " + std::string(op_info(c.code).name));
}

std::vector<Type> rule(const RuleContext& c) {
  const Attrs& a = c.attrs;
  switch (c.code) {
    case OpCode::Constant: {
      c.expect_num_operands(0);
      const AttrValue* v = a.find(AttrKey::Value);
      if (!v || !std::holds_alternative<Scalar>(*v)) c.fail("missing attribute 'value'");
      Shape shape = c.ints_attr(AttrKey::ShapeAttr);
      for (int64_t d : shape) if (d < 0) c.fail("negative dimension in shape " + ints_to_string(shape));
      return {Type::tensor(shape, std::get<Scalar>(*v).dtype)};
    }
    case OpCode::Iota: {
      c.expect_num_operands(0);
      DType t = c.dtype_attr(AttrKey::DTypeAttr);
      Shape shape = c.ints_attr(AttrKey::ShapeAttr);
      if (!is_integer(t) && !is_float(t)) c.fail("needs an integer or float dtype");
      c.axis_in(c.int_attr(AttrKey::Axis), static_cast<int>(shape.size()));
      return {Type::tensor(shape, t)};
    }
    case OpCode::ProgramId:
    case OpCode::NumPrograms: {
      c.expect_num_operands(0);
      int64_t axis = c.int_attr(AttrKey::Axis);
      if (axis < 0) c.fail("grid axis must be >= 0, got " + std::to_string(axis));
      return {Type::scalar(DType::I32)};
    }
    case OpCode::Neg: case OpCode::Abs: case OpCode::Sign: case OpCode::Floor:
    case OpCode::Ceil: case OpCode::Round: case OpCode::Exp: case OpCode::Exp2:
    case OpCode::Log: case OpCode::Log1p: case OpCode::Sqrt: case OpCode::Rsqrt:
    case OpCode::Reciprocal: case OpCode::Tanh: case OpCode::Logistic: case OpCode::Sin:
    case OpCode::Cos: case OpCode::Erf: case OpCode::IsFinite: case OpCode::Not:
    case OpCode::IntegerPow: case OpCode::MultipleOf: {
      c.expect_num_operands(1);
      Type t = c.tensor(0);
      check_elementwise_dtype(c, t.dtype);
      if (c.code == OpCode::IntegerPow) {
        int64_t e = c.int_attr(AttrKey::Exponent);
        if (e < 0 && !is_float(t.dtype))
          c.fail("negative exponent " + std::to_string(e) + " needs a float operand, got " +
                 std::string(dtype_name(t.dtype)));
      }
      if (c.code == OpCode::MultipleOf && c.int_attr(AttrKey::N) < 1)
        c.fail("n must be >= 1");
      if (c.code == OpCode::Round) {
        int64_t r = a.get_int_or(AttrKey::Rounding, 0);
        if (r != 0 && r != 1) c.fail("rounding must be 0 (away from zero) or 1 (to nearest even)");
      }
      if (c.code == OpCode::IsFinite) t.dtype = DType::Bool;
      return {t};
    }
    case OpCode::Add: case OpCode::Sub: case OpCode::Mul: case OpCode::Div: case OpCode::Rem:
    case OpCode::Pow: case OpCode::Max: case OpCode::Min: case OpCode::And: case OpCode::Or:
    case OpCode::Xor: case OpCode::ShiftLeft: case OpCode::ShiftRightLogical:
    case OpCode::ShiftRightArithmetic: {
      c.expect_num_operands(2);
      Type t = same_types(c, 0, 2);
      check_elementwise_dtype(c, t.dtype);
      return {t};
    }
    case OpCode::Eq: case OpCode::Ne: case OpCode::Lt: case OpCode::Le: case OpCode::Gt:
    case OpCode::Ge: {
      c.expect_num_operands(2);
      Type t = same_types(c, 0, 2);
      if (is_semaphore(t.dtype)) c.fail("semaphore values cannot be compared");
      t.dtype = DType::Bool;
      return {t};
    }
    case OpCode::Select: {
      c.expect_num_operands(3);
      const Type& p = c.tensor(0);
      Type t = same_types(c, 1, 2);
      if (p.dtype != DType::Bool) c.fail("predicate must be bool, got " + p.to_string());
      if (p.shape != t.shape)
        c.fail("predicate shape " + p.to_string() + " differs from the operands' " + t.to_string());
      return {t};
    }
    case OpCode::Convert: {
      c.expect_num_operands(1);
      Type t = c.tensor(0);
      DType to = c.dtype_attr(AttrKey::DTypeAttr);
      if (is_semaphore(t.dtype) || is_semaphore(to)) c.fail("cannot convert semaphore values");
      t.dtype = to;
      return {t};
    }
    case OpCode::Bitcast:
      c.expect_num_operands(1);
      return {bitcast_type(c, c.tensor(0))};
    case OpCode::RefBitcast:
      c.expect_num_operands(1);
      return {bitcast_type(c, c.ref(0))};
    case OpCode::BroadcastInDim: {
      c.expect_num_operands(1);
      const Type& x = c.tensor(0);
      Shape shape = c.ints_attr(AttrKey::ShapeAttr);
      const Ints& dims = c.ints_attr(AttrKey::Dims);
      if (static_cast<int>(dims.size()) != x.rank())
        c.fail("dims " + ints_to_string(dims) + " must have one entry per operand dimension (" +
               x.to_string() + ")");
      for (size_t i = 0; i < dims.size(); ++i) {
        c.axis_in(dims[i], static_cast<int>(shape.size()), "broadcast dimension");
        if (i > 0 && dims[i] <= dims[i - 1]) c.fail("dims must be strictly increasing");
        if (x.shape[i] != 1 && x.shape[i] != shape[dims[i]])
          c.fail("cannot broadcast " + x.to_string() + " to shape " + ints_to_string(shape) +
                 ": dimension " + std::to_string(i) + " has size " + std::to_string(x.shape[i]) +
                 " but the target has " + std::to_string(shape[dims[i]]));
      }
      return {Type::tensor(shape, x.dtype)};
    }
    case OpCode::Reshape:
      c.expect_num_operands(1);
      return {reshaped_type(c, c.tensor(0))};
    case OpCode::Transpose:
      c.expect_num_operands(1);
      return {transposed_type(c, c.tensor(0))};
    case OpCode::Squeeze: {
      c.expect_num_operands(1);
      const Type& x = c.tensor(0);
      const Ints& dims = c.ints_attr(AttrKey::Dims);
      c.axes_in(dims, x.rank(), "squeezed dimension");
      Shape shape;
      for (int d = 0; d < x.rank(); ++d) {
        bool squeezed = std::find(dims.begin(), dims.end(), d) != dims.end();
        if (squeezed && x.shape[d] != 1)
          c.fail("cannot squeeze dimension " + std::to_string(d) + " of size " +
                 std::to_string(x.shape[d]) + " in " + x.to_string());
        if (!squeezed) shape.push_back(x.shape[d]);
      }
      return {Type::tensor(shape, x.dtype)};
    }
    case OpCode::ExpandDims: {
      c.expect_num_operands(1);
      const Type& x = c.tensor(0);
      const Ints& dims = c.ints_attr(AttrKey::Dims);
      c.axes_in(dims, x.rank() + static_cast<int>(dims.size()), "new dimension");
      return {Type::tensor(expanded_shape(x.shape, dims), x.dtype)};
    }
    case OpCode::Concatenate: {
      if (c.operands.empty()) c.fail("needs at least one operand");
      Type t = c.tensor(0);
      int64_t axis = c.axis_in(c.int_attr(AttrKey::Axis), t.rank());
      for (size_t i = 1; i < c.operands.size(); ++i) {
        const Type& u = c.tensor(i);
        bool ok = u.dtype == t.dtype && u.rank() == t.rank();
        for (int d = 0; ok && d < t.rank(); ++d)
          if (d != axis && u.shape[d] != t.shape[d]) ok = false;
        if (!ok)
          c.fail("operand " + std::to_string(i) + " " + u.to_string() +
                 " does not match operand 0 " + c.operands[0].to_string() +
                 " outside axis " + std::to_string(axis));
        t.shape[axis] += u.shape[axis];
      }
      return {t};
    }
    case OpCode::Slice: {
      c.expect_num_operands(1);
      const Type& x = c.tensor(0);
      const Ints& start = c.ints_attr(AttrKey::Start);
      const Ints& limit = c.ints_attr(AttrKey::Limit);
      const Ints& strides = c.ints_attr(AttrKey::Strides);
      if (static_cast<int>(start.size()) != x.rank() || limit.size() != start.size() ||
          strides.size() != start.size())
        c.fail("start/limit/strides need one entry per dimension of " + x.to_string());
      Shape shape;
      for (int d = 0; d < x.rank(); ++d) {
        if (strides[d] < 1) c.fail("strides must be >= 1");
        if (start[d] < 0 || start[d] > limit[d] || limit[d] > x.shape[d])
          c.fail("slice [" + std::to_string(start[d]) + ", " + std::to_string(limit[d]) +
                 ") is out of bounds for dimension " + std::to_string(d) + " of " + x.to_string());
        int64_t extent = limit[d] - start[d];  // >= 0 and no overflow: checked above
        shape.push_back(extent / strides[d] + (extent % strides[d] != 0));
      }
      return {Type::tensor(shape, x.dtype)};
    }
    case OpCode::DynamicSlice: {
      const Type& x = c.tensor(0);
      c.expect_num_operands(1 + x.rank());
      for (int d = 0; d < x.rank(); ++d) c.expect_int_scalar(1 + d, "a start index");
      const Ints& sizes = c.ints_attr(AttrKey::Sizes);
      if (static_cast<int>(sizes.size()) != x.rank())
        c.fail("sizes need one entry per dimension of " + x.to_string());
      for (int d = 0; d < x.rank(); ++d)
        if (sizes[d] < 0 || sizes[d] > x.shape[d])
          c.fail("size " + std::to_string(sizes[d]) + " does not fit dimension " +
                 std::to_string(d) + " of " + x.to_string());
      return {Type::tensor(sizes, x.dtype)};
    }
    case OpCode::Rev: {
      c.expect_num_operands(1);
      const Type& x = c.tensor(0);
      c.axes_in(c.ints_attr(AttrKey::Dims), x.rank(), "reversed dimension");
      return {x};
    }
    case OpCode::ReduceSum: case OpCode::ReduceMax: case OpCode::ReduceMin:
    case OpCode::ReduceProd: case OpCode::ReduceAnd: case OpCode::ReduceOr: {
      c.expect_num_operands(1);
      const Type& x = c.tensor(0);
      check_elementwise_dtype(c, x.dtype);
      const Ints& axes = c.ints_attr(AttrKey::Axes);
      c.axes_in(axes, x.rank(), "reduction axis");
      Shape shape;
      for (int d = 0; d < x.rank(); ++d)
        if (std::find(axes.begin(), axes.end(), d) == axes.end()) shape.push_back(x.shape[d]);
      return {Type::tensor(shape, x.dtype)};
    }
    case OpCode::Argmax: case OpCode::Argmin: {
      c.expect_num_operands(1);
      const Type& x = c.tensor(0);
      check_elementwise_dtype(c, x.dtype);
      int64_t axis = c.axis_in(c.int_attr(AttrKey::Axis), x.rank());
      if (x.shape[axis] == 0) c.fail("cannot take the arg-extremum of an empty axis");
      DType index = c.dtype_attr(AttrKey::DTypeAttr);
      if (!is_integer(index)) c.fail("index dtype must be an integer type");
      Shape shape = x.shape;
      shape.erase(shape.begin() + axis);
      return {Type::tensor(shape, index)};
    }
    case OpCode::Cumsum: case OpCode::Cumprod: case OpCode::Cummax: case OpCode::Cummin: {
      c.expect_num_operands(1);
      const Type& x = c.tensor(0);
      check_elementwise_dtype(c, x.dtype);
      c.axis_in(c.int_attr(AttrKey::Axis), x.rank());
      return {x};
    }
    case OpCode::Sort: {
      if (c.operands.empty()) c.fail("needs at least one operand");
      const Type& k = c.tensor(0);
      if (k.rank() < 1) c.fail("cannot sort a scalar");
      for (size_t i = 1; i < c.operands.size(); ++i)
        if (c.tensor(i).shape != k.shape)
          c.fail("operand " + std::to_string(i) + " " + c.operands[i].to_string() +
                 " has another shape than the keys " + k.to_string());
      int64_t num_keys = c.int_attr(AttrKey::NumKeys);
      if (num_keys < 1 || num_keys > static_cast<int64_t>(c.operands.size()))
        c.fail("num_keys " + std::to_string(num_keys) + " must be in [1, " +
               std::to_string(c.operands.size()) + "]");
      for (const Type& t : c.operands)
        if (is_semaphore(t.dtype)) c.fail("cannot sort semaphores");
      return c.operands;
    }
    case OpCode::DotGeneral: {
      c.expect_num_operands(2);
      const Type& l = c.tensor(0);
      const Type& r = c.tensor(1);
      if (l.dtype != r.dtype)
        c.fail("operand dtypes differ: " + l.to_string() + " vs " + r.to_string() +
               " (convert one first)");
      if (l.dtype == DType::Bool || is_semaphore(l.dtype)) c.fail("needs numeric operands");
      const Ints& lc = c.ints_attr(AttrKey::LhsContracting);
      const Ints& rc = c.ints_attr(AttrKey::RhsContracting);
      const Ints& lb = c.ints_attr(AttrKey::LhsBatch);
      const Ints& rb = c.ints_attr(AttrKey::RhsBatch);
      if (lc.size() != rc.size()) c.fail("lhs and rhs need the same number of contracting dims");
      if (lb.size() != rb.size()) c.fail("lhs and rhs need the same number of batch dims");
      Ints lall = lc, rall = rc;
      lall.insert(lall.end(), lb.begin(), lb.end());
      rall.insert(rall.end(), rb.begin(), rb.end());
      c.axes_in(lall, l.rank(), "lhs dimension");
      c.axes_in(rall, r.rank(), "rhs dimension");
      for (size_t i = 0; i < lc.size(); ++i)
        if (l.shape[lc[i]] != r.shape[rc[i]])
          c.fail("contracting dimensions differ: lhs " + l.to_string() + " dim " +
                 std::to_string(lc[i]) + " vs rhs " + r.to_string() + " dim " +
                 std::to_string(rc[i]));
      Shape shape;
      for (size_t i = 0; i < lb.size(); ++i) {
        if (l.shape[lb[i]] != r.shape[rb[i]])
          c.fail("batch dimensions differ: lhs " + l.to_string() + " dim " +
                 std::to_string(lb[i]) + " vs rhs " + r.to_string() + " dim " +
                 std::to_string(rb[i]));
        shape.push_back(l.shape[lb[i]]);
      }
      for (int d = 0; d < l.rank(); ++d)
        if (std::find(lall.begin(), lall.end(), d) == lall.end()) shape.push_back(l.shape[d]);
      for (int d = 0; d < r.rank(); ++d)
        if (std::find(rall.begin(), rall.end(), d) == rall.end()) shape.push_back(r.shape[d]);
      DType out = c.dtype_attr(AttrKey::DTypeAttr);
      if (out == DType::Bool || is_semaphore(out)) c.fail("result dtype must be numeric");
      return {Type::tensor(shape, out)};
    }
    case OpCode::RefView: {
      const Type& r = c.ref(0);
      int ndyn = check_indexer(c, r, c.indexer_attr());
      c.expect_num_operands(1 + ndyn);
      return {Type::ref(c.indexer_attr().result_shape(), r.dtype, r.space)};
    }
    case OpCode::RefTranspose:
      c.expect_num_operands(1);
      return {transposed_type(c, c.ref(0))};
    case OpCode::RefReshape:
      c.expect_num_operands(1);
      return {reshaped_type(c, c.ref(0))};
    case OpCode::Load: case OpCode::Store: case OpCode::Swap: {
      const Type& r = c.ref(0);
      const Indexer& index = c.indexer_attr();
      int ndyn = check_indexer(c, r, index);
      bool masked = a.get_int_or(AttrKey::Masked, 0) != 0;
      Type value = Type::tensor(index.result_shape(), r.dtype);
      size_t next = 1 + ndyn;
      if (c.code == OpCode::Load) {
        c.expect_num_operands(next + (masked ? 2 : 0));
      } else {
        c.expect_num_operands(next + 1 + (masked ? 1 : 0));
        if (!(c.tensor(next) == value))
          c.fail("value " + c.operands[next].to_string() + " does not match the indexed region " +
                 value.to_string() + " of " + r.to_string());
        ++next;
      }
      if (masked) {
        const Type& m = c.tensor(next);
        if (m.dtype != DType::Bool || m.shape != value.shape)
          c.fail("mask must be bool with shape of the indexed region " + value.to_string() +
                 ", got " + m.to_string());
        if (c.code == OpCode::Load && !(c.tensor(next + 1) == value))
          c.fail("fill value " + c.operands[next + 1].to_string() + " must be " + value.to_string());
      }
      if (c.code == OpCode::Store) return {};
      return {value};
    }
    case OpCode::AtomicRmw: {
      const Type& r = c.ref(0);
      const Indexer& index = c.indexer_attr();
      int ndyn = check_indexer(c, r, index);
      c.expect_num_operands(2 + ndyn);
      Type value = Type::tensor(index.result_shape(), r.dtype);
      if (!(c.tensor(1 + ndyn) == value))
        c.fail("value " + c.operands[1 + ndyn].to_string() + " does not match the indexed region " +
               value.to_string());
      const std::string& kind = c.string_attr(AttrKey::Kind);
      static const std::set<std::string> kinds = {"add", "max", "min", "and", "or", "xor", "xchg"};
      if (!kinds.count(kind)) c.fail("unknown atomic kind '" + kind + "'");
      if ((kind == "and" || kind == "or" || kind == "xor") && !is_integer(r.dtype) &&
          r.dtype != DType::Bool)
        c.fail("atomic " + kind + " needs an integer ref, got " + r.to_string());
      return {value};
    }
    case OpCode::AtomicCas: {
      const Type& r = c.ref(0);
      const Indexer& index = c.indexer_attr();
      int ndyn = check_indexer(c, r, index);
      c.expect_num_operands(3 + ndyn);
      Type value = Type::tensor(index.result_shape(), r.dtype);
      for (int i = 1; i <= 2; ++i)
        if (!(c.tensor(ndyn + i) == value))
          c.fail("operand " + c.operands[ndyn + i].to_string() +
                 " does not match the indexed region " + value.to_string());
      return {value};
    }
    case OpCode::For: {
      c.expect_num_regions(1);
      c.expect_int_scalar(0, "the lower bound");
      c.expect_int_scalar(1, "the upper bound");
      if (c.operands[0].dtype != c.operands[1].dtype)
        c.fail("loop bounds have different dtypes: " + c.operands[0].to_string() + " vs " +
               c.operands[1].to_string());
      std::vector<Type> carries(c.operands.begin() + 2, c.operands.end());
      std::vector<Type> args = {c.operands[0]};
      args.insert(args.end(), carries.begin(), carries.end());
      check_region_args(c, 0, args);
      check_region_yields(c, 0, carries, "the loop body");
      if (a.get_int_or(AttrKey::Parallel, 0) != 0 && a.get_int_or(AttrKey::Parallel, 0) != 1)
        c.fail("parallel must be 0 or 1");
      if (a.has(AttrKey::Unroll) && c.int_attr(AttrKey::Unroll) < 1)
        c.fail("unroll must be >= 1, got " + std::to_string(c.int_attr(AttrKey::Unroll)));
      return carries;
    }
    case OpCode::While: {
      c.expect_num_regions(2);
      const std::vector<Type>& carries = c.operands;
      check_region_args(c, 0, carries);
      check_region_args(c, 1, carries);
      check_region_yields(c, 0, {Type::scalar(DType::Bool)}, "the loop condition");
      check_region_yields(c, 1, carries, "the loop body");
      return carries;
    }
    case OpCode::Cond: {
      c.expect_num_regions(2);
      c.expect_num_operands(1);
      const Type& p = c.tensor(0);
      if (!p.is_scalar() || p.dtype != DType::Bool)
        c.fail("the predicate must be a bool scalar, got " + p.to_string());
      check_region_args(c, 0, {});
      check_region_args(c, 1, {});
      check_region_yields(c, 1, c.regions[0].yields, "the false branch");
      return c.regions[0].yields;
    }
    case OpCode::Switch: {
      c.expect_num_operands(1);
      c.expect_int_scalar(0, "the branch index");
      if (c.regions.empty()) c.fail("needs at least one branch");
      for (size_t r = 0; r < c.regions.size(); ++r) {
        check_region_args(c, r, {});
        check_region_yields(c, r, c.regions[0].yields,
                            ("branch " + std::to_string(r)).c_str());
      }
      return c.regions[0].yields;
    }
    case OpCode::RunScoped: {
      c.expect_num_operands(0);
      c.expect_num_regions(1);
      for (const Type& t : c.regions[0].args)
        if (!t.is_ref) c.fail("scoped allocations must be Refs, got " + t.to_string());
      const bool has_barrier = std::any_of(c.regions[0].args.begin(), c.regions[0].args.end(),
                                           [](const Type& t) { return t.dtype == DType::GpuBarrier; });
      if (has_barrier && !a.has(AttrKey::Arrivals))
        c.fail("a scoped barrier needs its arrivals (an `arrivals` attribute; gpu::Barrier{...} sets it)");
      if (a.has(AttrKey::Arrivals)) {
        // A barrier's arrivals per phase, per allocation (0 for what is not a barrier).
        const Ints& arrivals = a.get_ints(AttrKey::Arrivals);
        if (arrivals.size() != c.regions[0].args.size())
          c.fail("arrivals has " + std::to_string(arrivals.size()) + " entries for " +
                 std::to_string(c.regions[0].args.size()) + " allocations");
        for (size_t i = 0; i < arrivals.size(); ++i)
          if ((arrivals[i] > 0) != (c.regions[0].args[i].dtype == DType::GpuBarrier))
            c.fail("arrivals[" + std::to_string(i) + "] = " + std::to_string(arrivals[i]) + " for a " +
                   c.regions[0].args[i].to_string());
      }
      for (const Type& t : c.regions[0].yields)
        if (t.is_ref) c.fail("a scoped Ref cannot leave its scope");
      return c.regions[0].yields;
    }
    case OpCode::Yield:
      return {};
    case OpCode::DmaStart: {
      const Type& src = c.ref(0);
      const Type& dst = c.ref(1);
      if (is_semaphore(src.dtype) || is_semaphore(dst.dtype))
        c.fail("cannot copy semaphores (src " + src.to_string() + ", dst " + dst.to_string() + ")");
      const int64_t indirect = a.get_int_or(AttrKey::Indirect, 0);
      if (indirect != 0) {
        // A gather (1: the source's major dim indexed) or a scatter (2: the destination's).
        if (indirect != 1 && indirect != 2) c.fail("indirect must be 1 (gather) or 2 (scatter)");
        if (a.has(AttrKey::DeviceIdType)) c.fail("an indirect DMA cannot be remote");
        c.expect_num_operands(4);
        expect_semaphore(c, 2, "the receive semaphore", false);
        const Type& idx = c.operand(3);
        if (idx.dtype != DType::I32 || idx.rank() != 1)
          c.fail("the indices must be a 1-D i32 ref or vector, got " + idx.to_string());
        const Type& data = indirect == 1 ? src : dst;
        const Type& other = indirect == 1 ? dst : src;
        if (data.rank() < 1) c.fail("the indexed ref must have a major dimension");
        Shape expected = data.shape;
        expected[0] = idx.shape[0];
        if (other.shape != expected || other.dtype != data.dtype)
          c.fail(std::string(indirect == 1 ? "destination " : "source ") + other.to_string() +
                 " must have the shape and dtype of the indexed " +
                 (indirect == 1 ? "source " : "destination ") + Type::ref(expected, data.dtype, data.space).to_string());
        return {};
      }
      if (a.get_int_or(AttrKey::AddAttr, 0) != 0) c.fail("add = 1 needs an indirect DMA");
      if (src.shape != dst.shape || src.dtype != dst.dtype)
        c.fail("source " + src.to_string() + " and destination " + dst.to_string() +
               " must have the same shape and dtype");
      expect_semaphore(c, 2, "the receive semaphore", false);
      if (a.has(AttrKey::DeviceIdType)) {
        expect_semaphore(c, 3, "the send semaphore", false);
        expect_device_id(c, 4);
      } else {
        c.expect_num_operands(3);
      }
      return {};
    }
    case OpCode::DmaWait:
      expect_semaphore(c, 0, "the semaphore", false);
      c.ref(1);
      return {};
    case OpCode::SemaphoreSignal: {
      expect_semaphore(c, 0, "the semaphore", true);
      c.expect_int_scalar(1, "the increment");
      size_t next = 2;
      if (c.int_attr(AttrKey::HasCoreIndex) != 0) c.expect_int_scalar(next++, "the core index");
      if (a.has(AttrKey::DeviceIdType))
        expect_device_id(c, next);
      else
        c.expect_num_operands(next);
      return {};
    }
    case OpCode::SemaphoreWait:
      expect_semaphore(c, 0, "the semaphore", true);
      c.expect_int_scalar(1, "the value");
      return {};
    case OpCode::SemaphoreRead:
      expect_semaphore(c, 0, "the semaphore", true);
      return {Type::scalar(DType::I32)};
    case OpCode::GetBarrierSemaphore:
      return {Type::ref({}, DType::BarrierSemaphore, MemorySpace::Semaphore)};
    case OpCode::AxisIndex:
      if (c.string_attr(AttrKey::AxisNames).empty()) c.fail("needs an axis name");
      return {Type::scalar(DType::I32)};
    case OpCode::SubcoreBarrier:
      c.expect_num_operands(0);
      return {};
    case OpCode::GpuCopyGmemToSmem: case OpCode::GpuCopySmemToGmem: case OpCode::GpuWaitSmemToGmem:
    case OpCode::GpuCommitSmemToGmemGroup: case OpCode::GpuCommitSmem: case OpCode::GpuBarrierArrive: case OpCode::GpuBarrierWait:
    case OpCode::GpuClusterRef: case OpCode::GpuAsyncPrefetch: case OpCode::GpuWgmma: case OpCode::GpuWgmmaWait: case OpCode::GpuSetMaxRegisters:
      return gpu_kernel_rule(c);
    case OpCode::NamedRegionBegin: case OpCode::NamedRegionEnd:
      c.expect_num_operands(0);
      if (c.string_attr(AttrKey::Name).empty()) c.fail("needs a region name");
      return {};
    case OpCode::DebugCheck: {
      const Type& t = c.tensor(0);
      if (!t.is_scalar() || t.dtype != DType::Bool)
        c.fail("the predicate must be a bool scalar (bool[]), got " + t.to_string());
      (void)c.string_attr(AttrKey::Format);
      return {};
    }
    case OpCode::ScLoadGather: case OpCode::ScStoreScatter: case OpCode::ScAddupdateScatter:
    case OpCode::ScLoadExpanded: case OpCode::ScStoreCompressed: case OpCode::ScAddupdate:
    case OpCode::ScAddupdateCompressed: case OpCode::ScFetchAndAdd: case OpCode::ScMaskedScan:
    case OpCode::ScScanCount: case OpCode::ScSortKeyVal: case OpCode::ScAllReducePopulationCount:
    case OpCode::ScAllReduceFfs: case OpCode::ScPack: case OpCode::ScUnpack: case OpCode::ScDynamicGather:
      return sparse_core_rule(c);
    case OpCode::DebugPrint: {
      const std::string& fmt = c.string_attr(AttrKey::Format);
      size_t holes = 0;
      for (size_t p = fmt.find("{}"); p != std::string::npos; p = fmt.find("{}", p + 2)) ++holes;
      if (holes != c.operands.size())
        c.fail("format \"" + fmt + "\" has " + std::to_string(holes) + " placeholders {} for " +
               std::to_string(c.operands.size()) + " values");
      for (size_t i = 0; i < c.operands.size(); ++i) c.tensor(i);
      return {};
    }
  }
  throw InternalError("no result-type rule for an op");
}

}  // namespace

std::vector<Type> infer_result_types(OpCode code, const std::vector<Type>& operands,
                                     const Attrs& attrs,
                                     const std::vector<RegionSignature>& regions,
                                     const SourceLoc& loc) {
  RuleContext c{code, operands, attrs, regions, loc};
  const OpInfo& info = op_info(code);
  if (info.num_operands >= 0) c.expect_num_operands(static_cast<size_t>(info.num_operands));
  if (info.num_regions >= 0) c.expect_num_regions(static_cast<size_t>(info.num_regions));
  return rule(c);
}

}  // namespace pallas::ir
