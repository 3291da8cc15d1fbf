// The kernel interpreter of one simulated core: the shared interpreter plus the TPU ops (DMAs,
// semaphores, axis indices), machine-managed run_scoped allocations, and access hooks that
// serialise buffer contents and feed the race detector.
#pragma once

#include "tpu_interpret/machine.h"

namespace pallas::tpu_interpret {

class CoreRunner : public eval::Interpreter {
 public:
  CoreRunner(const ir::Kernel& k, Machine& m, CoreThread& t);

 protected:
  bool eval_extension_op(const ir::Op& op) override;
  void begin_access(const ir::Op& op, const eval::RefValue& view) override;
  void end_access(const ir::Op& op, const eval::RefValue& view) override;
  [[noreturn]] void out_of_bounds(const ir::Op& op, const eval::RefValue& base,
                                  std::span<const int64_t> dynamic, const Error& e) override;
  std::string debug_check_context() const override;
  eval::RefValue subcore_ref(const ir::Op& op, const eval::RefValue& local, int64_t subcore_id) override;

 private:
  void run_scoped(const ir::Op& op);
  void dma_start(const ir::Op& op);
  std::vector<int64_t> indirect_rows(ir::ValueId indices, const SourceLoc& loc);
  void semaphore_signal(const ir::Op& op);
  int target_device(const ir::Op& op, size_t first_operand);
  bool skip_float_op(const ir::Op& op);
  bool load_with_uninitialized_fill(const ir::Op& op);
  bool store_dropping_padding(const ir::Op& op);

  Machine& m_;
  CoreThread& t_;
  std::unique_lock<std::mutex> held_;  // the accessed buffer's lock, between begin and end
  eval::RefValue barrier_ref_;         // the barrier semaphore, once asked for
  bool padded_ = false, fill_oob_reads_ = false, skip_float_ = false;  // the params' modes
};

}  // namespace pallas::tpu_interpret
