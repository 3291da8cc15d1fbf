// The kernel-body interpreter shared by the reference interpreter and the TPU interpret mode:
// walks the IR, evaluates pure ops with src/eval's rules and performs ref ops on strided views.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <variant>
#include <vector>

#include "eval/eval.h"
#include "eval/fusion.h"
#include "pallas/evaluate.h"

namespace pallas::eval {

// A runtime Ref: a strided view into a buffer someone owns.
struct RefValue {
  std::byte* data = nullptr;      // address of element (0, ..., 0)
  DType dtype = DType::F32;
  Shape shape;
  std::vector<int64_t> strides;   // in elements
  MemorySpace space = MemorySpace::Any;
  std::shared_ptr<void> owner;    // keeps the buffer alive (may be null for borrowed memory)

  static RefValue of_array(Array& a, MemorySpace space = MemorySpace::Any);
  int64_t size() const { return num_elements(shape); }
  bool is_contiguous() const;
};

using RtValue = std::variant<std::monostate, Array, RefValue>;

class Interpreter {
 public:
  explicit Interpreter(const ir::Kernel& kernel);
  virtual ~Interpreter() = default;

  // Runs the kernel body once with these parameters (one per kernel parameter); returns what
  // the body yields (index maps), or nothing.
  std::vector<Array> run(const std::vector<RtValue>& params, const GridPoint& grid);
  void set_debug_out(std::ostream* os) { debug_out_ = os; }
  // Whether debug_check ops run (otherwise they are skipped).
  void set_debug_checks(bool on) { debug_checks_ = on; }

 protected:
  // Hook for backends that add ops (DMAs, semaphores): return true if handled. Called before
  // every op (except ops fused away).
  virtual bool eval_extension_op(const ir::Op&) { return false; }
  // When `access_hooks_` is set, every load/store/swap/atomic calls begin_access with the
  // indexed view before touching memory and end_access after (also when the access throws).
  // The TPU machine checks races and serialises shared buffers there.
  bool access_hooks_ = false;
  virtual void begin_access(const ir::Op&, const RefValue&) {}
  virtual void end_access(const ir::Op&, const RefValue&) {}
  // begin_access for its lifetime (when access_hooks_ is set): end_access runs on every exit.
  class AccessScope {
   public:
    AccessScope(Interpreter& self, const ir::Op& op, const RefValue& view) : self_(self), op_(op), view_(view) {
      if (self_.access_hooks_) self_.begin_access(op_, view_);
    }
    ~AccessScope() {
      if (self_.access_hooks_) self_.end_access(op_, view_);
    }
    AccessScope(const AccessScope&) = delete;
    AccessScope& operator=(const AccessScope&) = delete;

   private:
    Interpreter& self_;
    const ir::Op& op_;
    const RefValue& view_;
  };
  // The Ref that sc_fetch_and_add with a subcore_id reaches: `local` (this subcore's SMEM view)
  // as seen on vector subcore `subcore_id`. The default is one subcore, number 0: another id is
  // a pallas::Error. The TPU machine maps the view into the target subcore's SMEM.
  virtual RefValue subcore_ref(const ir::Op& op, const RefValue& local, int64_t subcore_id);
  // An index outside its Ref: the default rethrows `e` (from `view`) with the op's name, the
  // grid point and the op's line.
  [[noreturn]] virtual void out_of_bounds(const ir::Op& op, const RefValue& base,
                                          std::span<const int64_t> dynamic, const Error& e);

  // Words appended to a failed debug_check's message (the TPU machine names the device and core).
  virtual std::string debug_check_context() const { return ""; }

  const Array& array(ir::ValueId v) const;
  const RefValue& ref(ir::ValueId v) const;
  void set(ir::ValueId v, RtValue x) { env_[static_cast<size_t>(v)] = std::move(x); }
  int64_t scalar_int(ir::ValueId v) const;
  void eval_ref_op(const ir::Op& op);
  // The SparseCore memory ops (gathers, scatters, compressed and expanded accesses,
  // fetch_and_add), in src/eval/sparse_core_ops.cpp.
  void eval_sparse_core_ref_op(const ir::Op& op);
  std::vector<Array> run_region_yield(const ir::Region& r);
  const ir::Kernel& kernel() const { return kernel_; }
  const GridPoint& grid_point() const { return *grid_; }

 private:
  void run_region(const ir::Region& r);
  void eval_op(const ir::Op& op);
  void eval_control(const ir::Op& op);

  void run_accumulate_dot(const AccumulateDot& f, const RefValue& acc);

  const ir::Kernel& kernel_;
  FusionPlan fusions_;
  // Per region, per op: the values whose last use is that op, released right after it so that
  // dead tiles return their buffers (small working set, recycled buffers).
  std::map<const ir::Region*, std::vector<std::vector<ir::ValueId>>> releases_;
  void plan_releases(const ir::Region& r);
  std::vector<const ir::Region*> def_region_;  // planning tables, per ValueId
  std::vector<size_t> last_use_;
  std::vector<RtValue> env_;
  const GridPoint* grid_ = nullptr;
  std::ostream* debug_out_ = nullptr;
  bool debug_checks_ = false;
};

// Ref operations on runtime Refs (exposed for the TPU interpreter and tests).
// `dynamic` holds the values of the indexer's dynamic entries ($1..$n in order). An index outside
// `r` throws an Error with the ref_index_out_of_bounds message and no location: the op that
// indexes adds its name, the grid point and its line (Interpreter::out_of_bounds).
RefValue view(const RefValue& r, const ir::Indexer& index, std::span<const int64_t> dynamic);
// `r` through a ref_transpose, ref_reshape or ref_bitcast op (only r's dtype, shape, strides and
// data pointer are read); a reshape the strides cannot express, or a wider bitcast of a strided or
// misaligned view, is an Error with the op's line — the same on every backend.
RefValue transformed(const RefValue& r, const ir::Op& op);
// `r` read as `to` (bitcast's shape rule; the strides in the new elements), or nullopt where a
// wider dtype's elements would not be whole runs of the view (its last dim strided, or another
// dim stepping by part of one).
std::optional<RefValue> bitcast_view(const RefValue& r, DType to);
// `cur` op= `value` elementwise by atomic_rmw's rule for `kind` (add, min, max, and, or, xor,
// xchg): in place. (A reduction of a copy to GMEM too.)
void atomic_combine(const std::string& kind, Array& cur, const Array& value);
// The message of a bitcast view bitcast_view refuses: shared by the interpreters and the GPU
// kernels' run-time check of where the view starts.
std::string bitcast_not_whole(const Shape& shape, DType to);
// The message of a reshape of a view whose merged dims are not evenly spaced: shared by the
// interpreters and the GPU code generator.
std::string reshape_not_strided(const Shape& shape, std::span<const int64_t> strides, const Shape& new_shape);
// The message of an index entry outside its Ref (dimension `dim` of `ref_shape`): shared by the
// interpreters' `view` and the GPU kernels' run-time check.
std::string ref_index_out_of_bounds(int64_t dim, int64_t start, bool is_slice, int64_t size, int64_t stride,
                                    const Shape& ref_shape);
// " at grid point (2, 1)": how a failure at run time (a debug_check, an out-of-bounds Ref index)
// names the program ids of the point that raised it, on every backend; "" without a grid (its
// one point needs no name).
std::string at_grid_point(std::span<const int64_t> program_ids);
// "semaphore_signal: the increment must be >= 0, got -1" (or semaphore_wait's value): a negative
// semaphore amount, on every backend that runs semaphores.
std::string negative_semaphore_amount(std::string_view op_name, int64_t amount);
// gpu::set_max_registers (setmaxnreg), the GPU interpreter's and the code generator's rule:
// requests[w] is warpgroup w's registers per thread after its request (0: it makes none). With
// __launch_bounds__(threads, 1) ptxas starts each thread with the largest request or its code's
// need, at most 65536 / threads in steps of 8 (at most 256), and the CTA holds that many per
// thread; an increase past what the CTA holds waits forever on a GPU. Returns "" where the
// requests fit, else the error, with *culprit the first warpgroup asking for more than the entry.
std::string setmaxnreg_overflow(const std::vector<int64_t>& requests, size_t* culprit);
Array read(const RefValue& r);             // copies a view into a fresh contiguous Array
void write(const RefValue& r, const Array& value);
// The offsets (in elements) of a view's elements, in row-major order.
std::vector<int64_t> element_offsets(const RefValue& r);
// r += the contiguous elements at src, with the IR's add (integers wrap; f16/bf16 add in f32):
// SparseCore addupdates and the DMA engine's adds.
void add_to(const RefValue& r, const std::byte* src);
// What a fresh (uninitialized) buffer, block padding and out-of-bounds reads hold in the
// interpreters (JAX interpret mode's "nan" policy): NaN for floats, the maximum for integers,
// true for bool — so reading one by mistake shows up.
Scalar uninitialized_value(DType t);
void fill_uninitialized(Array& a);

}  // namespace pallas::eval
