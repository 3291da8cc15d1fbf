// gpu::emit_pipeline and gpu::emit_pipeline_warp_specialized (Mosaic GPU's): software pipelines
// traced from the gpu::kernel primitives — run_scoped SMEM slots and barriers,
// copy_gmem_to_smem / copy_smem_to_gmem, a fori_loop over the steps — so the interpreter, host
// emulation and the GPU all run them as they run those primitives, with no rule of their own in
// any backend.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/trace_env.h"
#include "pallas/error.h"
#include "pallas/gpu.h"
#include "trace/context.h"

namespace pallas::gpu::detail {
namespace {

std::string shape_string(const Shape& s) { return ShapeDtype(s, DType::F32).to_string().substr(3); }

// One operand of the pipeline as the code below needs it: whether it is staged through SMEM, its
// block's dims (each Blocked size, or 0 for a squeezed dim) and its block's SMEM shape.
struct PipelineOperand {
  const BlockSpec* spec = nullptr;
  Ref gmem;
  bool staged = true;
  std::vector<int64_t> dims;  // per array dim: the block size, 0 where squeezed
  Shape block;                // the staged block's shape (squeezed dims left out)
};

PipelineOperand describe(const BlockSpec& spec, const Ref& gmem, const std::string& who, const SourceLoc& where) {
  PipelineOperand o;
  o.spec = &spec;
  o.gmem = gmem;
  if (gmem.indirect() || gmem.memory_space() != MemorySpace::Gmem)
    throw Error(who + " is " + (gmem.indirect() ? std::string("indirectly indexed")
                                                : "in " + std::string(memory_space_name(gmem.memory_space()))) +
                    "; emit_pipeline's operands are the kernel's GMEM Refs (or views of them)",
                where);
  if (spec.memory_space) {
    const MemorySpace m = *spec.memory_space;
    if (m == MemorySpace::Gmem || m == MemorySpace::Any) {
      o.staged = false;
      return o;
    }
    if (m != MemorySpace::GpuShared)
      throw Error(who + "'s BlockSpec asks for " + std::string(memory_space_name(m)) +
                      "; emit_pipeline stages blocks in gpu::SMEM, or passes a gpu::GMEM one through",
                  where);
  }
  if (spec.pipeline_mode)
    throw NotSupportedError(who + "'s BlockSpec with a pipeline_mode in emit_pipeline (max_concurrent_steps sets the slots)",
                            where);
  const Shape& shape = gmem.shape();
  if (!spec.block_shape) {
    o.dims = shape;
    o.block = shape;
    return o;
  }
  if (static_cast<int>(spec.block_shape->size()) != gmem.rank())
    throw Error(who + "'s block shape has " + std::to_string(spec.block_shape->size()) + " dims, its array " +
                    shape_string(shape) + " has " + std::to_string(gmem.rank()),
                where);
  for (size_t d = 0; d < shape.size(); ++d) {
    const BlockDim& bd = (*spec.block_shape)[d];
    if (bd.is_squeezed()) {
      o.dims.push_back(0);
      continue;
    }
    if (!bd.is_blocked())
      throw NotSupportedError(who + "'s block dim " + std::to_string(d) + " is " + bd.to_string() +
                                  " in emit_pipeline (it takes Blocked sizes and squeezed dims)",
                              where);
    const int64_t b = bd.size();
    if (b <= 0 || shape[d] % b != 0)
      throw NotSupportedError(who + "'s dim " + std::to_string(d) + " (" + std::to_string(shape[d]) +
                                  ") is not a multiple of its block size " + std::to_string(b) +
                                  ": ragged blocks in emit_pipeline",
                              where);
    o.dims.push_back(b);
    o.block.push_back(b);
  }
  return o;
}

// Whether any pair of block indices differs (a bool scalar).
Value differ(const std::vector<Value>& a, const std::vector<Value>& b) {
  Value any = Operand(false).value();
  for (size_t d = 0; d < a.size(); ++d) any = any || (a[d] != b[d]);
  return any;
}

int32_t i32(int64_t v) { return static_cast<int32_t>(v); }

// What both pipelines share: the operands, the steps, and the buffers once allocated.
class PipelineSteps {
 public:
  PipelineSteps(const char* who, const std::vector<Operand>& grid, const std::vector<BlockSpec>& in_specs,
                const std::vector<BlockSpec>& out_specs, int max_concurrent_steps, const std::vector<Ref>& operands, Loc loc)
      : num_in_(in_specs.size()), loc_(loc), where_(trace::src(loc)) {
    if (!core::gpu_kernel_body_env())
      throw Error(std::string(who) + " runs in a gpu::kernel's body (its copies and barriers are gpu::kernel "
                                     "primitives); a pallas_call pipelines its grid's sequential axis through its BlockSpecs",
                  where_);
    const size_t num_out = out_specs.size();
    if (operands.size() != num_in_ + num_out)
      throw Error(std::string(who) + ": the pipeline takes " + std::to_string(num_in_) + " inputs and " +
                      std::to_string(num_out) + " outputs (one per BlockSpec), got " + std::to_string(operands.size()) +
                      " operands",
                  where_);
    for (size_t i = 0; i < operands.size(); ++i) {
      const bool in = i < num_in_;
      const std::string name = in ? "input " + std::to_string(i) : "output " + std::to_string(i - num_in_);
      ops_.push_back(describe(in ? in_specs[i] : out_specs[i - num_in_], operands[i], name, where_));
    }
    // Sizes known when tracing keep the step arithmetic in constants (and the slots no more
    // than the steps); a traced size (an i32 scalar) makes the steps a traced count.
    int64_t known = 1;
    bool dynamic = false;
    for (const Operand& g : grid) {
      if (g.kind() == Operand::Kind::Int) {
        known *= g.int_literal();
        if (known > INT32_MAX) throw NotSupportedError(std::string(who) + " over more than 2^31 - 1 steps", where_);
        static_grid_.push_back(g.int_literal());
      } else {
        dynamic = true;
      }
      grid_.push_back(pallas::detail::as_index_scalar(g, "pipeline grid size").astype(DType::I32, loc));
    }
    if (dynamic) {
      static_grid_.clear();
      steps_ = Operand(1, loc).value();
      for (const Value& g : grid_) steps_ = steps_ * g;
      slots_ = max_concurrent_steps;
    } else {
      static_steps_ = known;
      steps_ = Operand(i32(known), loc).value();
      // (More slots than steps would only take memory.)
      slots_ = static_cast<int>(std::min<int64_t>(max_concurrent_steps, known));
    }
    for (size_t i = 0; i < ops_.size(); ++i) {
      if (!ops_[i].staged) continue;
      if (i < num_in_) ++copies_per_step_;
      else staged_outputs_ = true;
    }
  }

  // The step count (an i32 scalar).
  const Value& steps() const { return steps_; }
  int slots() const { return slots_; }
  int copies_per_step() const { return copies_per_step_; }
  // The operand indices of the staged inputs.
  std::vector<size_t> staged_inputs() const {
    std::vector<size_t> out;
    for (size_t i = 0; i < num_in_; ++i)
      if (ops_[i].staged) out.push_back(i);
    return out;
  }
  bool staged_outputs() const { return staged_outputs_; }

  // The scope's allocations both pipelines make: `slots` blocks per staged input, one block per
  // staged output, then (with staged inputs) the ready barriers their copies arrive on, one a slot.
  std::vector<ScopedAlloc> allocs() const {
    std::vector<ScopedAlloc> allocs;
    for (size_t i = 0; i < ops_.size(); ++i) {
      if (!ops_[i].staged) continue;
      Shape shape = ops_[i].block;
      if (i < num_in_) shape.insert(shape.begin(), slots_);
      allocs.push_back(SMEM(shape, ops_[i].gmem.dtype()));
    }
    if (copies_per_step_ > 0) allocs.push_back(Barrier{.num_arrivals = copies_per_step_, .num_barriers = slots_});
    return allocs;
  }
  // The pipeline's own SMEM (slots, output buffers, barriers) against a CTA's limit, named for
  // what the user can change (the scope's own check counts what is around it too).
  void check_shared_memory(const char* who, const std::vector<ScopedAlloc>& allocs) const {
    const int64_t bytes = shared_memory_bytes(allocs);
    if (bytes <= kMaxSharedMemoryBytes) return;
    int64_t per_slot = 0;
    for (size_t i = 0; i < num_in_; ++i)
      if (ops_[i].staged) {
        int64_t n = itemsize(ops_[i].gmem.dtype());
        for (int64_t d : ops_[i].block) n *= d;
        per_slot += n;
      }
    throw Error(std::string(who) + ": its SMEM needs " + std::to_string(bytes) + " bytes (" + std::to_string(slots_) +
                    " slots of " + std::to_string(per_slot) + " bytes of input blocks, then the output buffers and barriers), more "
                    "than the " + std::to_string(kMaxSharedMemoryBytes) +
                    " (227 KiB) a CTA may use; lower max_concurrent_steps or the block sizes",
                where_);
  }

  // Takes the scope's refs of allocs() (from the front of `refs`); returns where the caller's
  // own allocations, after them, start.
  size_t take(const std::vector<Ref>& refs) {
    buffer_of_.assign(ops_.size(), Ref());
    size_t b = 0;
    for (size_t i = 0; i < ops_.size(); ++i)
      if (ops_[i].staged) buffer_of_[i] = refs[b++];
    if (copies_per_step_ > 0) ready_ = refs[b++];
    return b;
  }
  // A slot's ready barrier (the step's copies have landed).
  Ref ready(const Value& slot) const { return ready_.at(Index(slot, loc_), loc_); }

  // The indices of a step (row-major over the grid).
  std::vector<Value> indices_of(const Value& step) const {
    std::vector<Value> idx(grid_.size());
    if (static_steps_) {
      int64_t stride = 1;
      for (size_t d = grid_.size(); d-- > 0;) {
        idx[d] = step / i32(stride) % i32(static_grid_[d]);
        stride *= static_grid_[d];
      }
      return idx;
    }
    Value stride = Operand(1, loc_).value();
    for (size_t d = grid_.size(); d-- > 0;) {
      idx[d] = step / stride % grid_[d];
      stride = stride * grid_[d];
    }
    return idx;
  }

  // Issues step `step`'s input copies into slot `slot`, arriving on the slot's ready barrier
  // (only operand `only`'s, when given).
  void copy_in(const Value& slot, const Value& step, std::optional<size_t> only = std::nullopt) const {
    const std::vector<Value> idx = indices_of(step);
    for (size_t i = 0; i < num_in_; ++i)
      if (ops_[i].staged && (!only || *only == i))
        copy_gmem_to_smem(gmem_block(ops_[i], block_indices(ops_[i], idx)), buffer_of_[i].at(Index(slot, loc_), loc_),
                          ready(slot), loc_);
  }
  // The first steps' copies (one per slot, as far as there are steps).
  void prologue() const {
    if (copies_per_step_ == 0) return;
    if (static_steps_) {
      for (int s = 0; s < slots_; ++s) copy_in(Operand(s).value(), Operand(s).value());
      return;
    }
    fori_loop(0, minimum(Operand(slots_, loc_), Operand(steps_, loc_)), [&](Value s) { copy_in(s, s); }, loc_);
  }

  // The body's blocks at a step: the input slots, the output buffers, GMEM operands whole.
  std::vector<Ref> blocks(const Value& slot) const {
    std::vector<Ref> out;
    for (size_t i = 0; i < ops_.size(); ++i) {
      if (!ops_[i].staged) out.push_back(ops_[i].gmem);
      else if (i < num_in_) out.push_back(buffer_of_[i].at(Index(slot, loc_), loc_));
      else out.push_back(buffer_of_[i]);
    }
    return out;
  }

  // Before a step's body: an output buffer that starts a new block must have been read by the
  // copy of its previous block (an earlier step's).
  void before_body(const Value& step, const std::vector<Value>& idx) const {
    if (!staged_outputs_) return;
    // (Step 0 compares with the last step, a valid index for the index maps, and waits for nothing.)
    const std::vector<Value> prev = indices_of((step + steps_ - 1) % steps_);
    Value changes = Operand(false).value();
    for (size_t i = num_in_; i < ops_.size(); ++i)
      if (ops_[i].staged) changes = changes || differ(block_indices(ops_[i], idx), block_indices(ops_[i], prev));
    when(step > 0 && changes, [&] { wait_smem_to_gmem(0, true, loc_); }, loc_);
  }
  // After it: an output's block is copied out after the last of the consecutive steps that map
  // to it.
  void after_body(const Value& step, const std::vector<Value>& idx) const {
    if (!staged_outputs_) return;
    commit_smem(loc_);
    const Value last = step == steps_ - 1;
    const std::vector<Value> next = indices_of(step + 1);
    for (size_t i = num_in_; i < ops_.size(); ++i) {
      if (!ops_[i].staged) continue;
      const std::vector<Value> here = block_indices(ops_[i], idx);
      when(last || differ(here, block_indices(ops_[i], next)),
           [&] { copy_smem_to_gmem(buffer_of_[i], gmem_block(ops_[i], here), {}, loc_); }, loc_);
    }
  }
  // After the last step: every output copy has landed.
  void epilogue() const {
    if (staged_outputs_) wait_smem_to_gmem(0, false, loc_);
  }

 private:
  // An operand's block indices at a step's indices: its index map's results.
  std::vector<Value> block_indices(const PipelineOperand& o, const std::vector<Value>& idx) const {
    std::vector<Value> out;
    if (!o.spec->index_map) {
      for (size_t d = 0; d < o.dims.size(); ++d) out.push_back(Operand(0).value());
      return out;
    }
    const Indices got = o.spec->index_map(std::vector<IndexMapArg>(idx.begin(), idx.end()));
    if (got.size() != o.dims.size())
      throw Error("emit_pipeline: an index map returned " + std::to_string(got.size()) + " indices for a block of " +
                      std::to_string(o.dims.size()) + " dims",
                  o.spec->loc);
    for (const Index& i : got) {
      if (i.kind() != Index::Kind::Int)
        throw Error("emit_pipeline: an index map returns block indices (ints or i32 scalars), not slices", o.spec->loc);
      out.push_back(pallas::detail::as_index_scalar(i.start(), "emit_pipeline's block index"));
    }
    return out;
  }
  Ref gmem_block(const PipelineOperand& o, const std::vector<Value>& bi) const {
    Indices at;
    for (size_t d = 0; d < o.dims.size(); ++d) {
      if (o.dims[d] == 0) at.emplace_back(bi[d], loc_);
      else at.emplace_back(ds(bi[d] * i32(o.dims[d]), o.dims[d]), loc_);
    }
    return o.gmem.at(at, loc_);
  }

  std::vector<Value> grid_;          // i32 scalars
  std::vector<int64_t> static_grid_;  // the sizes, when all are known
  size_t num_in_;
  Loc loc_;
  SourceLoc where_;
  std::vector<PipelineOperand> ops_;
  Value steps_;
  std::optional<int64_t> static_steps_;
  int slots_ = 1;
  int copies_per_step_ = 0;
  bool staged_outputs_ = false;
  std::vector<Ref> buffer_of_;
  Ref ready_;
};

void check_steps(const char* who, const std::vector<Operand>& grid, int max_concurrent_steps, int delay_release,
                 const SourceLoc& where) {
  std::string sizes;
  for (const Operand& g : grid)
    sizes += (sizes.empty() ? "" : ", ") + (g.kind() == Operand::Kind::Int ? std::to_string(g.int_literal()) : std::string("?"));
  for (const Operand& g : grid) {
    if (g.kind() == Operand::Kind::Int && g.int_literal() <= 0)
      throw Error(std::string(who) + ": every grid size must be positive, got [" + sizes + "]", where);
    if (g.kind() == Operand::Kind::Float || g.kind() == Operand::Kind::Bool)
      throw Error(std::string(who) + ": grid sizes are ints or i32 scalars, got [" + sizes + "]", where);
  }
  if (max_concurrent_steps < 1)
    throw Error(std::string(who) + ": max_concurrent_steps must be at least 1, got " + std::to_string(max_concurrent_steps),
                where);
  if (delay_release < 0 || delay_release >= max_concurrent_steps)
    throw Error(std::string(who) + ": delay_release must be at least 0 and less than max_concurrent_steps (" +
                    std::to_string(max_concurrent_steps) + "), got " + std::to_string(delay_release),
                where);
}

}  // namespace

Pipeline make_pipeline(PipelineBody body, bool body_takes_carry, PipelineOptions opts, Loc loc) {
  const SourceLoc where = trace::src(loc);
  check_steps("emit_pipeline", opts.grid, opts.max_concurrent_steps, opts.delay_release, where);
  if (!body) throw Error("emit_pipeline: the body is empty", where);
  if (body_takes_carry && opts.init_carry.empty())
    throw Error("emit_pipeline: the body takes a carry but init_carry is empty (give the first carry)", where);
  return [body = std::move(body), opts = std::move(opts), loc, where](const std::vector<Ref>& operands) -> std::vector<Value> {
    PipelineSteps p("emit_pipeline", opts.grid, opts.in_specs, opts.out_specs, opts.max_concurrent_steps, operands, loc);
    const std::vector<ScopedAlloc> allocs = p.allocs();
    p.check_shared_memory("emit_pipeline", allocs);
    const std::function<std::vector<Value>(std::vector<Ref>)> scoped = [&](std::vector<Ref> refs) {
      p.take(refs);
      p.prologue();
      auto step_body = [&](Value step, std::vector<Value> carry) {
        const Value slot = step % p.slots();
        if (p.copies_per_step() > 0) barrier_wait(p.ready(slot), loc);
        const std::vector<Value> idx = p.indices_of(step);
        p.before_body(step, idx);
        std::vector<Value> next_carry = body(idx, p.blocks(slot), carry);
        if (next_carry.size() != carry.size())
          throw Error("emit_pipeline: the body returned " + std::to_string(next_carry.size()) + " carried values for the " +
                          std::to_string(carry.size()) + " of init_carry",
                      where);
        p.after_body(step, idx);
        // The slot step s - delay_release read takes the step `slots` after that one.
        const int d = opts.delay_release;
        if (p.copies_per_step() > 0)
          when(step >= d && step + (p.slots() - d) < p.steps(),
               [&] { p.copy_in((step - d) % p.slots(), step + (p.slots() - d)); }, loc);
        return next_carry;
      };
      std::vector<Value> carry = fori_loop(0, p.steps(), opts.init_carry, step_body, loc);
      // Products the body left running may still read the last slots, which the scope gives back.
      if (opts.delay_release > 0) wgmma_wait(0, loc);
      p.epilogue();
      return carry;
    };
    return run_scoped(allocs, scoped, {}, loc);
  };
}

WarpSpecializedPipeline make_warp_specialized_pipeline(PipelineBody body, bool body_takes_carry,
                                                       WarpSpecializedPipelineOptions opts, Loc loc) {
  const char* who = "emit_pipeline_warp_specialized";
  const SourceLoc where = trace::src(loc);
  check_steps(who, opts.grid, opts.max_concurrent_steps, opts.delay_release, where);
  if (!body) throw Error(std::string(who) + ": the body is empty", where);
  if (body_takes_carry && !opts.compute_context)
    throw Error(std::string(who) + ": the body takes a carry, which needs a compute_context (it gives run the first carry)",
                where);
  if (opts.wg_axis.empty()) throw Error(std::string(who) + ": wg_axis (the mesh's thread axis) is empty", where);
  if (opts.num_compute_wgs < 1)
    throw Error(std::string(who) + ": num_compute_wgs must be at least 1, got " + std::to_string(opts.num_compute_wgs), where);
  if (opts.manual_consumed_barriers && opts.delay_release > 0)
    throw NotSupportedError(std::string(who) + " with manual_consumed_barriers and delay_release (arrive on a step's "
                                               "barriers when its products are done instead)",
                            where);
  if (opts.memory_registers != 0 && (opts.memory_registers < 24 || opts.memory_registers > 256 || opts.memory_registers % 8 != 0))
    throw Error(std::string(who) + ": memory_registers must be 0 (no setmaxnreg) or a multiple of 8 in [24, 256], got " +
                    std::to_string(opts.memory_registers),
                where);
  return [body = std::move(body), opts = std::move(opts), loc, where, who](const std::vector<Ref>& operands) {
    PipelineSteps p(who, opts.grid, opts.in_specs, opts.out_specs, opts.max_concurrent_steps, operands, loc);
    const core::TraceEnv* env = core::current_trace_env();
    const std::string thread_axis = env->thread_axis >= 0 ? env->grid_names.at(static_cast<size_t>(env->thread_axis)) : "";
    if (opts.wg_axis != thread_axis)
      throw Error(std::string(who) + ": wg_axis '" + opts.wg_axis + "' is not the kernel's thread axis" +
                      (thread_axis.empty() ? std::string(" (its mesh has none: give it num_threads and thread_name)")
                                           : " '" + thread_axis + "'"),
                  where);
    if (env->num_threads != opts.num_compute_wgs + 1)
      throw Error(std::string(who) + ": the mesh has " + std::to_string(env->num_threads) + " Pallas threads along '" +
                      thread_axis + "'; the pipeline needs num_compute_wgs + 1 = " + std::to_string(opts.num_compute_wgs + 1) +
                      " (the last one copies)",
                  where);
    if (p.staged_outputs() && opts.num_compute_wgs > 1)
      throw NotSupportedError(std::string(who) + " with SMEM outputs and " + std::to_string(opts.num_compute_wgs) +
                                  " compute warpgroups (one compute warpgroup, or outputs in gpu::GMEM)",
                              where);
    if (p.copies_per_step() == 0)
      throw Error(std::string(who) + ": no input is staged in SMEM, so the memory warpgroup has nothing to copy", where);
    std::vector<ScopedAlloc> allocs = p.allocs();
    // One consumed barrier per slot for all inputs, or (manual) one per staged input.
    const std::vector<size_t> staged = p.staged_inputs();
    const size_t consumed_count = opts.manual_consumed_barriers ? staged.size() : 1;
    for (size_t k = 0; k < consumed_count; ++k)
      allocs.push_back(Barrier{.num_arrivals = opts.num_compute_wgs, .num_barriers = p.slots()});
    p.check_shared_memory(who, allocs);
    const std::function<std::vector<Value>(std::vector<Ref>)> scoped = [&](std::vector<Ref> refs) {
      // consumed_of[0]: the one consumed barrier array, or input staged[0]'s (manual).
      const std::vector<Ref> consumed_of(refs.begin() + static_cast<std::ptrdiff_t>(p.take(refs)), refs.end());
      const Value wg = axis_index(opts.wg_axis, loc);
      // The memory warpgroup (the one after the compute ones): fills the slots ahead, each again
      // once every compute warpgroup has consumed it.
      when(wg == opts.num_compute_wgs, [&] {
        if (opts.memory_registers > 0) set_max_registers(opts.memory_registers, false, loc);
        p.prologue();
        // Every consumed phase is waited for: one per step but the last delay_release (whose
        // slots the compute warpgroups never release).
        fori_loop(0, p.steps() - opts.delay_release, [&](Value step) {
          const Value slot = step % p.slots();
          if (!opts.manual_consumed_barriers) {
            barrier_wait(consumed_of[0].at(Index(slot, loc), loc), loc);
            when(step + p.slots() < p.steps(), [&] { p.copy_in(slot, step + p.slots()); }, loc);
            return;
          }
          // Each input's slot as soon as that input is consumed.
          for (size_t k = 0; k < staged.size(); ++k) {
            barrier_wait(consumed_of[k].at(Index(slot, loc), loc), loc);
            when(step + p.slots() < p.steps(), [&] { p.copy_in(slot, step + p.slots(), staged[k]); }, loc);
          }
        }, loc);
      }, loc);
      when(wg < opts.num_compute_wgs, [&] {
        if (opts.memory_registers > 0) {
          // The register file (512 a thread for one warpgroup) less the memory warpgroup's, shared.
          const int regs = std::min(256, (512 - opts.memory_registers) / opts.num_compute_wgs) / 8 * 8;
          set_max_registers(regs, true, loc);
        }
        // The steps, from a carry to the last one (compute_context's `run`).
        auto run = [&](const std::vector<Value>& init) {
          std::vector<Value> last = fori_loop(0, p.steps(), init, [&](Value step, std::vector<Value> carry) {
            const Value slot = step % p.slots();
            barrier_wait(p.ready(slot), loc);
            const std::vector<Value> idx = p.indices_of(step);
            p.before_body(step, idx);
            std::vector<Ref> blocks = p.blocks(slot);
            if (opts.manual_consumed_barriers)
              for (const Ref& c : consumed_of) blocks.push_back(c.at(Index(slot, loc), loc));
            std::vector<Value> next = body(idx, blocks, carry);
            if (next.size() != carry.size())
              throw Error(std::string(who) + ": the body returned " + std::to_string(next.size()) +
                              " carried values for the " + std::to_string(carry.size()) + " run was given",
                          where);
            // The body is done with the slot of step s - delay_release (products that read it
            // waited for): it goes back.
            // (With manual consumed barriers the body arrived itself.)
            const int d = opts.delay_release;
            if (!opts.manual_consumed_barriers) {
              if (d == 0) barrier_arrive(consumed_of[0].at(Index(slot, loc), loc), loc);
              else when(step >= d, [&] { barrier_arrive(consumed_of[0].at(Index((step - d) % p.slots(), loc), loc), loc); }, loc);
            }
            p.after_body(step, idx);
            return next;
          }, loc);
          if (opts.delay_release > 0) wgmma_wait(0, loc);  // (as emit_pipeline's; before the carry is used)
          return last;
        };
        if (opts.compute_context) {
          // (run refers to this scope: a copy kept past compute_context finds `open` false.)
          struct RunState {
            int runs = 0;
            bool open = true;
          };
          const auto state = std::make_shared<RunState>();
          opts.compute_context([state, &run, who, where](const std::vector<Value>& init) {
            if (!state->open) throw Error(std::string(who) + ": run called after compute_context returned", where);
            if (++state->runs > 1) throw Error(std::string(who) + ": compute_context called run more than once", where);
            return run(init);
          });
          state->open = false;
          if (state->runs == 0) throw Error(std::string(who) + ": compute_context never called run", where);
        } else {
          run({});
        }
        p.epilogue();
      }, loc);
      return std::vector<Value>{};
    };
    run_scoped(allocs, scoped, ScopedOptions{.collective_axes = {opts.wg_axis}}, loc);
  };
}

}  // namespace pallas::gpu::detail
