// The kernel IR: typed SSA over tiles (arrays with a static shape and dtype), scalars (rank-0
// tiles) and Refs (mutable buffers in a memory space), with ops that may own regions.
//
// ---- Semantics (what every pass and backend agrees on) ------------------------------------------
// * Evaluation order: ops run in order; an op's regions run as the op says (For runs its body for
//   i = lo, lo+1, ..., hi-1; While alternates cond and body; Cond/Switch run one region;
//   RunScoped runs its region once with fresh scratch Refs that die at its end).
// * Visibility: a value may be used in the region that defines it and in regions nested inside;
//   never outside. A region's results leave it only through its terminating `yield`.
// * Side effects: only the ref ops (load/store/swap/atomics, the SparseCore memory ops),
//   debug_print and ops with regions that contain them. Everything else is pure and may be reordered or removed when unused.
// * Elementwise binary ops take operands of identical type (broadcasting and dtype promotion are
//   done by tracing, which records explicit broadcast_in_dim / convert ops).
// * Integers wrap on overflow (two's complement). Integer division truncates toward zero; x / 0
//   is -1 (all bits set) for signed and unsigned; INT_MIN / -1 = INT_MIN; x % 0 = x;
//   INT_MIN % -1 = 0. The sign of `rem` follows the dividend. Shifts by an amount < 0 or >= the
//   bit width give 0 (left, logical right) or the sign fill (arithmetic right).
// * Floats follow IEEE 754 in the element type (f16/bf16 compute in f32 and round to nearest
//   even per op). max/min propagate NaN; max(-0, +0) = +0, min(-0, +0) = -0.
// * float -> int conversion truncates toward zero, saturates out-of-range values, NaN -> 0.
// * Reductions of f16/bf16 accumulate in f32; sums of f32 accumulate in f32 (order unspecified).
// * Out-of-bounds ref accesses are errors in the interpreters (what a block read past the end of
//   an array sees is decided by pallas_call, not by these ops).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "pallas/array.h"
#include "pallas/dtype.h"
#include "pallas/error.h"

namespace pallas {

// Where a Ref's buffer lives. TPU: Any/Hbm/Vmem/VmemShared/Smem/Semaphore. GPU: Gmem/GpuShared.
#define PALLAS_MEMORY_SPACES(X) \
  X(Any, "any")                 \
  X(Hbm, "hbm")                 \
  X(Vmem, "vmem")               \
  X(VmemShared, "vmem_shared")  \
  X(Smem, "smem")               \
  X(Semaphore, "semaphore_mem") \
  X(Gmem, "gmem")               \
  X(GpuShared, "gpu_smem")      \
  X(GpuAcc, "gpu_acc")          \
  X(Host, "host")

enum class MemorySpace : uint8_t {
#define PALLAS_X(name, str) name,
  PALLAS_MEMORY_SPACES(PALLAS_X)
#undef PALLAS_X
};
std::string_view memory_space_name(MemorySpace m);
MemorySpace parse_memory_space(std::string_view name);  // throws pallas::Error

namespace ir {

// ---- Op codes and categories ----------------------------------------------------------------
enum Category : uint32_t {
  kNoEffect = 0,
  kElementwise = 1u << 0,
  kUnaryFlag = 1u << 1,
  kBinaryFlag = 1u << 2,
  kCompareFlag = 1u << 3,
  kFloatOnly = 1u << 4,
  kIntOnly = 1u << 5,
  kIntOrBoolOnly = 1u << 6,
  kTranscendental = 1u << 7,
  kShape = 1u << 8,
  kReduce = 1u << 9,
  kScan = 1u << 10,
  kMemRead = 1u << 11,
  kMemWrite = 1u << 12,
  kControl = 1u << 13,
  kTerminator = 1u << 14,
  kSideEffect = 1u << 15,
  kGridQuery = 1u << 16,
  kUnary = kElementwise | kUnaryFlag,
  kBinary = kElementwise | kBinaryFlag,
  kCompare = kElementwise | kCompareFlag,
};

enum class OpCode : uint16_t {
#define PALLAS_OP(name, str, cat, nops, nres, nreg) name,
#include "pallas/ir/ops.def"
#undef PALLAS_OP
};
inline constexpr int kNumOpCodes = 0
#define PALLAS_OP(name, str, cat, nops, nres, nreg) +1
#include "pallas/ir/ops.def"
#undef PALLAS_OP
    ;

struct OpInfo {
  OpCode code;
  std::string_view name;
  uint32_t categories;
  int num_operands;  // -1: variable
  int num_results;   // -1: variable
  int num_regions;   // -1: variable
  bool is(uint32_t cat) const { return (categories & cat) == cat && cat != 0; }
};
const OpInfo& op_info(OpCode code);
std::optional<OpCode> op_from_name(std::string_view name);

// ---- Types ------------------------------------------------------------------------------------
struct Type {
  bool is_ref = false;
  DType dtype = DType::F32;
  Shape shape;
  MemorySpace space = MemorySpace::Any;  // meaningful for refs only

  static Type tensor(Shape s, DType d) { return Type{false, d, std::move(s), MemorySpace::Any}; }
  static Type scalar(DType d) { return Type{false, d, {}, MemorySpace::Any}; }
  static Type ref(Shape s, DType d, MemorySpace m = MemorySpace::Any) {
    return Type{true, d, std::move(s), m};
  }
  int rank() const { return static_cast<int>(shape.size()); }
  bool is_scalar() const { return !is_ref && shape.empty(); }
  int64_t size() const { return num_elements(shape); }
  // "f32[8,128]", "i32[]", "ref<f32[8,128], vmem>"
  std::string to_string() const;
  bool operator==(const Type& o) const {
    return is_ref == o.is_ref && dtype == o.dtype && shape == o.shape &&
           (!is_ref || space == o.space);
  }
};

// ---- Indexers (for ref ops) -----------------------------------------------------------------
// One entry per dimension of the indexed ref (tracing fills trailing dims with full slices).
// An integer entry selects one index and drops the dimension; a slice keeps it with `size`
// elements starting at `start` taking every `stride`-th. A dynamic start/index is operand
// number `dynamic` of the op (its position in the op's operand list).
struct IndexEntry {
  bool is_slice = false;
  int64_t start = 0;     // static index or slice start (used when dynamic < 0)
  int dynamic = -1;      // operand position of a dynamic i32 scalar, or -1
  int64_t size = 1;      // slices only
  int64_t stride = 1;    // slices only, >= 1
  bool operator==(const IndexEntry&) const = default;
};
struct Indexer {
  std::vector<IndexEntry> entries;
  // Shape of what the indexer selects from a ref (integer entries dropped).
  Shape result_shape() const;
  bool operator==(const Indexer&) const = default;
};

// ---- Attributes -----------------------------------------------------------------------------
// One row per attribute key: (enum name, printed name).
#define PALLAS_ATTRS(X)                  \
  X(Value, "value")                      \
  X(DTypeAttr, "dtype")                  \
  X(ShapeAttr, "shape")                  \
  X(Axis, "axis")                        \
  X(Axes, "axes")                        \
  X(Dims, "dims")                        \
  X(Permutation, "permutation")          \
  X(Start, "start")                      \
  X(Limit, "limit")                      \
  X(Strides, "strides")                  \
  X(Sizes, "sizes")                      \
  X(Exponent, "exponent")                \
  X(Rounding, "rounding")                \
  X(Reverse, "reverse")                  \
  X(NumKeys, "num_keys")                 \
  X(Descending, "descending")            \
  X(Parallel, "parallel")                \
  X(Unroll, "unroll")                    \
  X(Reduce, "reduce")                    \
  X(LhsContracting, "lhs_contracting")   \
  X(RhsContracting, "rhs_contracting")   \
  X(LhsBatch, "lhs_batch")               \
  X(RhsBatch, "rhs_batch")               \
  X(Index, "index")                      \
  X(Masked, "masked")                    \
  X(Kind, "kind")                        \
  X(Format, "format")                    \
  X(N, "n")                              \
  X(DeviceIdType, "device_id_type")      \
  X(AxisNames, "axis_names")             \
  X(HasCoreIndex, "has_core_index")      \
  X(Indirect, "indirect")                \
  X(AddAttr, "add")                      \
  X(ReadOnly, "read_only")               \
  X(Decrement, "decrement")              \
  X(Name, "name")                        \
  X(Arrivals, "arrivals")                \
  X(CommitGroup, "commit_group")

enum class AttrKey : uint8_t {
#define PALLAS_X(name, str) name,
  PALLAS_ATTRS(PALLAS_X)
#undef PALLAS_X
};
std::string_view attr_name(AttrKey k);
std::optional<AttrKey> attr_from_name(std::string_view name);

using Ints = std::vector<int64_t>;
using AttrValue = std::variant<int64_t, Ints, DType, Scalar, std::string, Indexer>;

// A small ordered list of (key, value); printed in key order.
class Attrs {
 public:
  Attrs() = default;
  Attrs& set(AttrKey k, AttrValue v);
  bool has(AttrKey k) const;
  const AttrValue* find(AttrKey k) const;
  // Typed getters: throw InternalError if missing or of another kind (the verifier reports
  // user-facing problems before evaluation ever asks).
  int64_t get_int(AttrKey k) const;
  int64_t get_int_or(AttrKey k, int64_t fallback) const;
  const Ints& get_ints(AttrKey k) const;
  DType get_dtype(AttrKey k) const;
  const Scalar& get_scalar(AttrKey k) const;
  const std::string& get_string(AttrKey k) const;
  const Indexer& get_indexer(AttrKey k) const;
  const std::vector<std::pair<AttrKey, AttrValue>>& items() const { return items_; }
  bool operator==(const Attrs& o) const;

 private:
  std::vector<std::pair<AttrKey, AttrValue>> items_;  // sorted by key
};

// ---- Ops, regions, kernels ------------------------------------------------------------------
using ValueId = int32_t;
struct Op;

struct Region {
  std::vector<ValueId> args;
  std::vector<Op> ops;  // when the region yields values, the last op is a Yield
};

struct Op {
  OpCode code;
  std::vector<ValueId> operands;
  std::vector<ValueId> results;
  Attrs attrs;
  std::vector<Region> regions;
  SourceLoc loc;
  const OpInfo& info() const { return op_info(code); }
};

// A Ref transform (ref_transpose, ref_reshape, ref_bitcast): the same memory under other strides
// (eval::transformed computes them, for the interpreters and the GPU code generator alike).
inline bool is_ref_transform(OpCode c) {
  return c == OpCode::RefTranspose || c == OpCode::RefReshape || c == OpCode::RefBitcast;
}
// Whether an op's result is a view of its first operand's memory (an index, a transform; the same
// array in a peer CTA): analyses that follow a Ref to its memory follow these.
inline bool is_ref_view(OpCode c) {
  return c == OpCode::RefView || is_ref_transform(c) || c == OpCode::GpuClusterRef;
}

// A traced function: a kernel body (a function of Refs returning nothing) or an index map (a
// function of grid indices and prefetch Refs whose body ends with a yield of the indices).
struct Kernel {
  std::string name = "kernel";
  std::vector<Type> values;  // type of each value, indexed by ValueId
  Region body;               // body.args are the kernel's parameters (Refs, or scalars)
  SourceLoc loc;             // where the kernel was traced / defined

  const Type& type(ValueId v) const { return values.at(static_cast<size_t>(v)); }
  std::vector<Type> param_types() const;
};

// ---- Result-type rules ------------------------------------------------------------------------
// The result types of an op with these operand types and attributes, or a pallas::Error (with
// `loc`) that names the op and what is wrong. For ops with regions, `region_yields` holds the
// types each region yields (and `region_args` the types of each region's arguments).
struct RegionSignature {
  std::vector<Type> args;
  std::vector<Type> yields;
};
std::vector<Type> infer_result_types(OpCode code, const std::vector<Type>& operands,
                                     const Attrs& attrs,
                                     const std::vector<RegionSignature>& regions,
                                     const SourceLoc& loc);

// ---- Printing, parsing, verifying ------------------------------------------------------------
struct PrintOptions {
  bool locations = false;  // append loc("file":line) to each op
};
std::string print(const Kernel& k, const PrintOptions& opts = {});
// Parses the text form; errors name the line and column of the text.
Kernel parse(std::string_view text);
// Checks the whole kernel: visibility, operand counts, types (by re-running each op's rule),
// terminators. Throws pallas::Error naming the op, the types and the source line.
void verify(const Kernel& k);

}  // namespace ir
}  // namespace pallas
