// gpu::emit_pipeline (Mosaic GPU's emit_pipeline): a software pipeline traced from the gpu::kernel
// primitives — run_scoped SMEM slots and barriers, copy_gmem_to_smem / copy_smem_to_gmem, a
// fori_loop over the steps — so the interpreter, host emulation and the GPU all run it as they
// run those primitives, with no rule of its own in any backend.
#include <string>
#include <vector>

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

}  // namespace

Pipeline make_pipeline(PipelineBody body, PipelineOptions opts, Loc loc) {
  const SourceLoc where = trace::src(loc);
  for (int64_t g : opts.grid)
    if (g <= 0) throw Error("emit_pipeline: every grid size must be positive, got " + shape_string(opts.grid), where);
  if (opts.max_concurrent_steps < 1)
    throw Error("emit_pipeline: max_concurrent_steps must be at least 1, got " + std::to_string(opts.max_concurrent_steps),
                where);
  if (!body) throw Error("emit_pipeline: the body is empty", where);
  return [body = std::move(body), opts = std::move(opts), loc, where](const std::vector<Ref>& operands) -> std::vector<Value> {
    const size_t num_in = opts.in_specs.size(), num_out = opts.out_specs.size();
    if (operands.size() != num_in + num_out)
      throw Error("emit_pipeline: the pipeline takes " + std::to_string(num_in) + " inputs and " + std::to_string(num_out) +
                      " outputs (one per BlockSpec), got " + std::to_string(operands.size()) + " operands",
                  where);
    std::vector<PipelineOperand> ops;
    for (size_t i = 0; i < operands.size(); ++i) {
      const bool in = i < num_in;
      const std::string who = in ? "input " + std::to_string(i) : "output " + std::to_string(i - num_in);
      ops.push_back(describe(in ? opts.in_specs[i] : opts.out_specs[i - num_in], operands[i], who, where));
    }
    int64_t steps = 1;
    for (int64_t g : opts.grid) {
      steps *= g;
      if (steps > INT32_MAX) throw NotSupportedError("emit_pipeline over more than 2^31 - 1 steps", where);
    }
    // (More slots than steps would only take memory.)
    const int slots = static_cast<int>(std::min<int64_t>(opts.max_concurrent_steps, steps));
    int copies_per_step = 0;
    bool staged_outputs = false;
    std::vector<ScopedAlloc> allocs;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (!ops[i].staged) continue;
      Shape shape = ops[i].block;
      if (i < num_in) {
        shape.insert(shape.begin(), slots);
        ++copies_per_step;
      } else {
        staged_outputs = true;
      }
      allocs.push_back(SMEM(shape, ops[i].gmem.dtype()));
    }
    if (copies_per_step > 0) allocs.push_back(Barrier{.num_arrivals = copies_per_step, .num_barriers = slots});

    const std::function<std::vector<Value>(std::vector<Ref>)> scoped = [&](std::vector<Ref> buffers) {
      std::vector<Ref> buffer_of(ops.size());
      for (size_t i = 0, b = 0; i < ops.size(); ++i)
        if (ops[i].staged) buffer_of[i] = buffers[b++];
      const Ref barriers = copies_per_step > 0 ? buffers.back() : Ref();
      const auto i32 = [](int64_t v) { return static_cast<int32_t>(v); };
      // The indices of a step (row-major over the grid).
      auto indices_of = [&](const Value& step) {
        std::vector<Value> idx(opts.grid.size());
        int64_t stride = 1;
        for (size_t d = opts.grid.size(); d-- > 0;) {
          idx[d] = step / i32(stride) % i32(opts.grid[d]);
          stride *= opts.grid[d];
        }
        return idx;
      };
      // An operand's block indices at a step's indices: its index map's results.
      auto block_indices = [&](const PipelineOperand& o, const std::vector<Value>& idx) {
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
      };
      auto gmem_block = [&](const PipelineOperand& o, const std::vector<Value>& bi) {
        Indices at;
        for (size_t d = 0; d < o.dims.size(); ++d) {
          if (o.dims[d] == 0) at.emplace_back(bi[d], loc);
          else at.emplace_back(ds(bi[d] * i32(o.dims[d]), o.dims[d]), loc);
        }
        return o.gmem.at(at, loc);
      };
      // Issues step `step`'s input copies into slot `slot`.
      auto copy_in = [&](const Value& slot, const Value& step) {
        const std::vector<Value> idx = indices_of(step);
        for (size_t i = 0; i < num_in; ++i)
          if (ops[i].staged)
            copy_gmem_to_smem(gmem_block(ops[i], block_indices(ops[i], idx)), buffer_of[i].at(Index(slot, loc), loc),
                              barriers.at(Index(slot, loc), loc), loc);
      };
      for (int s = 0; s < slots && copies_per_step > 0; ++s) copy_in(Operand(s).value(), Operand(s).value());
      auto step_body = [&](Value step, std::vector<Value> carry) {
        const Value slot = step % slots;
        if (copies_per_step > 0) barrier_wait(barriers.at(Index(slot, loc), loc), loc);
        const std::vector<Value> idx = indices_of(step);
        // An output buffer that starts a new block: the copy of its previous block (from an
        // earlier step) must have read it before the body writes it.
        auto output_changes = [&](const std::vector<Value>& a, const std::vector<Value>& b) {
          Value any = Operand(false).value();
          for (size_t i = num_in; i < ops.size(); ++i)
            if (ops[i].staged) any = any || differ(block_indices(ops[i], a), block_indices(ops[i], b));
          return any;
        };
        if (staged_outputs)
          when(step > 0 && output_changes(idx, indices_of(step - 1)), [&] { wait_smem_to_gmem(0, true, loc); }, loc);
        std::vector<Ref> blocks;
        for (size_t i = 0; i < ops.size(); ++i) {
          if (!ops[i].staged) blocks.push_back(ops[i].gmem);
          else if (i < num_in) blocks.push_back(buffer_of[i].at(Index(slot, loc), loc));
          else blocks.push_back(buffer_of[i]);
        }
        std::vector<Value> next_carry = body(idx, blocks, carry);
        if (next_carry.size() != carry.size())
          throw Error("emit_pipeline: the body returned " + std::to_string(next_carry.size()) + " carried values for the " +
                          std::to_string(carry.size()) + " of init_carry",
                      where);
        if (staged_outputs) {
          // An output's block is copied out after the last of the consecutive steps that map to it.
          commit_smem(loc);
          const Value last = step == i32(steps - 1);
          const std::vector<Value> next = indices_of(step + 1);
          for (size_t i = num_in; i < ops.size(); ++i) {
            if (!ops[i].staged) continue;
            const std::vector<Value> here = block_indices(ops[i], idx);
            when(last || differ(here, block_indices(ops[i], next)),
                 [&] { copy_smem_to_gmem(buffer_of[i], gmem_block(ops[i], here), loc); }, loc);
          }
        }
        // The slot this step read takes the step `slots` ahead.
        if (copies_per_step > 0) when(step + slots < i32(steps), [&] { copy_in(slot, step + slots); }, loc);
        return next_carry;
      };
      std::vector<Value> carry = fori_loop(0, i32(steps), opts.init_carry, step_body, loc);
      if (staged_outputs) wait_smem_to_gmem(0, false, loc);
      return carry;
    };
    return run_scoped(allocs, scoped, {}, loc);
  };
}

}  // namespace pallas::gpu::detail
