// The reference interpreter: the semantic oracle of pallas_call.
//
// Each operand lives in a working array padded to whole blocks (padding holds the uninitialized
// value). The grid is walked in row-major order; at each point every operand's block is a
// strided view into its working array (so reads and writes go straight to the array, which is
// exactly "copy the block in, run, copy it out"), and the kernel body is interpreted over those
// views plus the scratch buffers, which persist across points. Blocks whose BoundedSlice is
// shorter than the block are staged through a buffer. At the end, outputs are the logical part
// of their working arrays. An aliased input is updated in place: the output shares its buffer.
#include <map>
#include <set>
#include <sstream>

#include "core/blocks.h"
#include "core/call.h"
#include "ir/analysis.h"

namespace pallas::interpret {

using core::padded_layout;

namespace {

struct Operand {
  Array work;                 // padded working array
  Shape logical;              // the array's own shape
  std::vector<int64_t> low;   // where the logical array starts inside `work` (Element padding)
  std::vector<int64_t> strides;
};

eval::RefValue view_of(Array& a, MemorySpace space, const std::vector<int64_t>& low,
                       const Shape& shape) {
  eval::RefValue r = eval::RefValue::of_array(a, space);
  int64_t off = 0;
  for (size_t d = 0; d < low.size(); ++d) off += low[d] * r.strides[d];
  r.data += off * itemsize(a.dtype());
  r.shape = shape;
  return r;
}

// A working array holding `src` inside padding of the uninitialized value.
Array make_padded(const Array& src, const Shape& padded, const std::vector<int64_t>& low) {
  Array w = Array::uninitialized(padded, src.dtype());
  if (padded != src.shape()) eval::fill_uninitialized(w);
  Array s = src;
  eval::write(view_of(w, MemorySpace::Any, low, src.shape()), s);
  return w;
}

Array make_uninitialized(const Shape& shape, DType dtype) {
  Array a = Array::uninitialized(shape, dtype);
  eval::fill_uninitialized(a);
  return a;
}

}  // namespace

std::vector<Array> run_reference(const TracedCall& call, const std::vector<Array>& args,
                                 const std::vector<int64_t>& grid, std::ostream* debug_out) {
  const GridMapping& gm = call.grid_mapping;
  const ir::Kernel& k = call.kernel;
  const int num_index = gm.num_index_operands;
  const int num_in = gm.num_inputs, num_out = gm.num_outputs;
  std::vector<bool> written = ir::params_written(k);

  // ---- Working arrays.
  std::vector<eval::RtValue> prefetch;
  for (int i = 0; i < num_index; ++i) {
    Array a = written[i] ? args[i].clone() : args[i];
    prefetch.push_back(eval::RefValue::of_array(a, MemorySpace::Smem));
  }
  std::map<int, int> alias_of_output;  // output -> input
  std::set<int> aliased_inputs;
  for (auto [i, o] : call.input_output_aliases) {
    alias_of_output[o] = i - num_index;
    aliased_inputs.insert(i - num_index);
  }
  std::vector<Operand> ops(num_in + num_out);
  for (int j = 0; j < num_in + num_out; ++j) {
    const BlockMapping& bm = gm.block_mappings[j];
    Operand& op = ops[j];
    op.logical = bm.array.shape;
    Shape padded;
    padded_layout(bm, padded, op.low);
    if (j < num_in) {
      const Array& src = args[num_index + j];
      bool in_place = aliased_inputs.count(j) || !written[num_index + j];
      if (padded == src.shape() && in_place)
        op.work = src;  // zero-copy: read-only, or updated in place through its alias
      else
        op.work = make_padded(src, padded, op.low);
    } else {
      auto alias = alias_of_output.find(j - num_in);
      if (alias != alias_of_output.end()) {
        Operand& in = ops[alias->second];
        if (in.work.shape() == padded && in.low == op.low) {
          op.work = in.work;  // shares the buffer
        } else {
          Array logical = eval::read(view_of(in.work, MemorySpace::Any, in.low, in.logical));
          op.work = make_padded(logical, padded, op.low);
        }
      } else {
        op.work = make_uninitialized(padded, bm.array.dtype);
      }
    }
    op.strides = row_major_strides(op.work.shape());
  }
  std::vector<Array> scratch;
  for (const ir::Type& t : gm.scratch_types) scratch.push_back(make_uninitialized(t.shape, t.dtype));

  // ---- Per-point state, reused.
  std::vector<core::IndexMapEvaluator> index_maps;
  index_maps.reserve(gm.block_mappings.size());
  for (const BlockMapping& bm : gm.block_mappings) index_maps.emplace_back(bm.index_map);
  std::vector<eval::RtValue> params(k.body.args.size());
  for (int i = 0; i < num_index; ++i) params[i] = prefetch[i];
  for (size_t s = 0; s < scratch.size(); ++s)
    params[num_index + num_in + num_out + s] = eval::RefValue::of_array(scratch[s], gm.scratch_types[s].space);
  // Shared owners for the block views (one per operand), so per-point views do not allocate one.
  std::vector<std::shared_ptr<void>> owners;
  for (Operand& op : ops) owners.push_back(std::make_shared<Array>(op.work));

  eval::Interpreter interp(k);
  interp.set_debug_out(debug_out);
  interp.set_debug_checks(call.debug_checks);
  GridPoint point;
  point.num_programs = grid;
  point.program_ids.assign(grid.size(), 0);
  int64_t total = 1;
  for (int64_t g : grid) total *= g;
  std::vector<int64_t> indices, start, size;

  // Each operand's block view keeps its shape and strides for the whole call; only its data
  // pointer moves from point to point. A block with a BoundedSlice shorter than the block is
  // staged through a buffer of the full block shape.
  struct BlockView {
    eval::RefValue view;       // the block's region inside the working array
    bool staged = false;
    Array staging;             // staged blocks: the kernel's buffer
    eval::RefValue staged_part;  // its valid part
  };
  std::vector<BlockView> blocks(num_in + num_out);
  for (int j = 0; j < num_in + num_out; ++j) {
    const BlockMapping& bm = gm.block_mappings[j];
    BlockView& b = blocks[j];
    b.view.dtype = bm.array.dtype;
    b.view.space = bm.block_ref_type.space;
    b.view.owner = owners[j];
    for (size_t d = 0; d < bm.block_shape.size(); ++d) {
      const BlockDim& bd = bm.block_shape[d];
      if (bd.is_squeezed()) continue;
      int64_t size = core::block_extent(bm, d);
      b.view.shape.push_back(size);
      b.view.strides.push_back(ops[j].strides[d]);
      if (size != bd.size()) b.staged = true;
    }
    if (b.staged) {
      b.staging = make_uninitialized(bm.block_ref_type.shape, bm.array.dtype);
      params[num_index + j] = eval::RefValue::of_array(b.staging, b.view.space);
      b.staged_part = std::get<eval::RefValue>(params[num_index + j]);
      b.staged_part.shape = b.view.shape;
    } else {
      params[num_index + j] = b.view;
    }
  }

  for (int64_t linear = 0; linear < total; ++linear) {
    core::unravel_row_major(linear, grid, point.program_ids);
    for (int j = 0; j < num_in + num_out; ++j) {
      const BlockMapping& bm = gm.block_mappings[j];
      Operand& op = ops[j];
      index_maps[j].eval(point, prefetch, indices);
      core::block_region(bm, indices, start, size);
      int64_t offset = 0;
      for (size_t d = 0; d < bm.block_shape.size(); ++d) {
        if (start[d] < 0 || start[d] + size[d] > op.work.shape()[d])
          throw core::out_of_bounds_block_error(bm, j < num_in, indices, point.program_ids, "",
                                                start, size, op.low);
        offset += start[d] * op.strides[d];
      }
      BlockView& bv = blocks[j];
      bv.view.data = static_cast<std::byte*>(op.work.raw_data()) + offset * itemsize(bv.view.dtype);
      if (bv.staged) {
        eval::fill_uninitialized(bv.staging);
        eval::write(bv.staged_part, eval::read(bv.view));
      } else {
        std::get<eval::RefValue>(params[num_index + j]).data = bv.view.data;
      }
    }
    interp.run(params, point);
    for (const BlockView& bv : blocks)
      if (bv.staged) eval::write(bv.view, eval::read(bv.staged_part));
  }

  // ---- Results: the logical part of each output's working array. An aliased output is the
  // caller's input buffer: when it was worked on through a padded copy, copy the result back.
  std::vector<Array> out;
  for (int o = 0; o < num_out; ++o) {
    Operand& op = ops[num_in + o];
    bool whole = op.work.shape() == op.logical;
    for (int64_t l : op.low) whole = whole && l == 0;
    auto alias = alias_of_output.find(o);
    if (alias != alias_of_output.end()) {
      Array caller = args[num_index + alias->second];
      if (!op.work.shares_buffer_with(caller))
        eval::write(eval::RefValue::of_array(caller),
                    eval::read(view_of(op.work, MemorySpace::Any, op.low, op.logical)));
      out.push_back(caller);
      continue;
    }
    out.push_back(whole ? op.work
                        : eval::read(view_of(op.work, MemorySpace::Any, op.low, op.logical)));
  }
  return out;
}

}  // namespace pallas::interpret
