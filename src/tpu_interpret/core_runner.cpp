#include "tpu_interpret/core_runner.h"

#include <cmath>
#include <limits>
#include <sstream>

#include "core/blocks.h"
#include "eval/eval.h"

namespace pallas::tpu_interpret {

using ir::AttrKey;
using ir::OpCode;

CoreRunner::CoreRunner(const ir::Kernel& k, Machine& m, CoreThread& t)
    : eval::Interpreter(k), m_(m), t_(t) {
  access_hooks_ = true;
  set_debug_checks(m.call().debug_checks);
  const tpu::InterpretParams& p = m.config().params;
  padded_ = p.buffer_bounds == "padded";
  fill_oob_reads_ = p.out_of_bounds_reads == "uninitialized";
  skip_float_ = p.skip_floating_point_ops;
}

namespace {

std::vector<std::string> split_names(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}

std::string join_names(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& n : v) s += (s.empty() ? "" : ", ") + n;
  return s.empty() ? "none" : s;
}

// "0:8, 3, 0:128:2": an indexer's range, for the out-of-bounds messages.
std::string range_string(const ir::Indexer& index, std::span<const int64_t> dynamic) {
  std::string s;
  for (size_t d = 0; d < index.entries.size(); ++d) {
    const ir::IndexEntry& e = index.entries[d];
    int64_t start = e.dynamic >= 0 ? dynamic[static_cast<size_t>(e.dynamic - 1)] : e.start;
    s += d ? ", " : "";
    if (!e.is_slice) {
      s += std::to_string(start);
      continue;
    }
    s += std::to_string(start) + ":" + std::to_string(start + e.size * e.stride);
    if (e.stride != 1) s += ":" + std::to_string(e.stride);
  }
  return s;
}

std::vector<int64_t> dynamic_values(const ir::Op& op, const std::function<int64_t(ir::ValueId)>& get) {
  std::vector<int64_t> dyn;
  for (const ir::IndexEntry& e : op.attrs.get_indexer(AttrKey::Index).entries)
    if (e.dynamic >= 0) dyn.push_back(get(op.operands[static_cast<size_t>(e.dynamic)]));
  return dyn;
}

}  // namespace

// ---- Memory accesses ----------------------------------------------------------------------------
void CoreRunner::begin_access(const ir::Op& op, const eval::RefValue& view) {
  Buffer* b = buffer_of(view);
  // fetch_and_add is an atomic add: it never races with another add, only with plain accesses.
  if (m_.races())
    m_.check_access(b, view, op.info().is(ir::kMemWrite), t_.clock,
                    {t_.actor, t_.name, std::string(op.info().name), op.loc},
                    op.code == OpCode::ScFetchAndAdd);
  held_ = std::unique_lock<std::mutex>(b->mu);
}

eval::RefValue CoreRunner::subcore_ref(const ir::Op& op, const eval::RefValue& local,
                                       int64_t subcore_id) {
  // Outside a vector-subcore mesh there is one subcore: the interpreter's rule (only id 0).
  if (!m_.config().vector_subcore_mesh())
    return eval::Interpreter::subcore_ref(op, local, subcore_id);
  return m_.subcore_counterpart(t_, local, subcore_id, op.loc);
}

std::string CoreRunner::debug_check_context() const {
  return " (device " + std::to_string(t_.device) + " core " + std::to_string(t_.core) + ")";
}

void CoreRunner::end_access(const ir::Op&, const eval::RefValue&) {
  if (held_.owns_lock()) held_.unlock();
}

void CoreRunner::out_of_bounds(const ir::Op& op, const eval::RefValue& base,
                               std::span<const int64_t> dynamic, const Error&) {
  Buffer* b = buffer_of(base);
  std::string who = "(device " + std::to_string(t_.device) + " core " + std::to_string(t_.core) +
                    " " + std::string(memory_space_name(b->space)) + " " + std::to_string(b->id) +
                    ", " + b->name + ")";
  std::string range = range_string(op.attrs.get_indexer(AttrKey::Index), dynamic);
  // A tuple, "(8, 128)", as the block index messages and the reference's IndexError print it;
  // then the grid point, as the other backends name it.
  std::string shape_at = core::tuple_string(base.shape) + eval::at_grid_point(grid_point().program_ids) + ".";
  bool masked = op.attrs.get_int_or(AttrKey::Masked, 0) != 0;
  switch (op.code) {
    case OpCode::Load:
      throw Error("Out-of-bounds read of " + who + ": reading [" + range +
                      "] but buffer has shape " + shape_at,
                  op.loc);
    case OpCode::Store:
      throw Error(std::string("Out-of-bounds ") + (masked ? "masked " : "") + "write of " + who +
                      ": writing [" + range + "] but buffer has shape " + shape_at,
                  op.loc);
    case OpCode::Swap:
      throw Error(std::string("Out-of-bounds ") + (masked ? "masked " : "") + "swap of " + who +
                      ": swapping [" + range + "] but buffer has shape " + shape_at,
                  op.loc);
    default:
      throw Error("Out-of-bounds " + std::string(op.info().name) + " of " + who + ": indexing [" +
                      range + "] but buffer has shape " + shape_at,
                  op.loc);
  }
}

// out_of_bounds_reads = "uninitialized": the part of a read outside the buffer holds the
// uninitialized value; a read entirely outside is still an error.
bool CoreRunner::load_with_uninitialized_fill(const ir::Op& op) {
  const eval::RefValue& base = ref(op.operands[0]);
  const ir::Indexer& index = op.attrs.get_indexer(AttrKey::Index);
  std::vector<int64_t> dyn = dynamic_values(op, [&](ir::ValueId v) { return scalar_int(v); });
  ir::Indexer clipped = index;
  std::vector<int64_t> out_start;  // per result dim: where the valid part starts
  bool inside = true;
  for (size_t d = 0; d < index.entries.size(); ++d) {
    ir::IndexEntry& e = clipped.entries[d];
    int64_t start = e.dynamic >= 0 ? dyn[static_cast<size_t>(e.dynamic - 1)] : e.start;
    e.dynamic = -1;
    e.start = start;
    int64_t dim = base.shape[d];
    if (!e.is_slice) {
      if (start < 0 || start >= dim) return false;  // entirely outside: the normal error
      continue;
    }
    int64_t k0 = 0, k1 = e.size;
    while (k0 < k1 && start + k0 * e.stride < 0) ++k0;
    while (k1 > k0 && start + (k1 - 1) * e.stride >= dim) --k1;
    if (k0 == k1 && e.size > 0) return false;
    if (k0 != 0 || k1 != e.size) inside = false;
    e.start = start + k0 * e.stride;
    e.size = k1 - k0;
    out_start.push_back(k0);
  }
  if (inside) return false;
  eval::RefValue part = eval::view(base, clipped, {});
  Array result = Array::uninitialized(index.result_shape(), base.dtype);
  if (m_.config().params.uninitialized_memory == "zero")
    result = eval::constant(Scalar::of_int(0, base.dtype), index.result_shape());
  else
    eval::fill_uninitialized(result);
  {
    begin_access(op, part);
    Array got;
    try {
      got = eval::read(part);
    } catch (...) {
      end_access(op, part);
      throw;
    }
    end_access(op, part);
    eval::RefValue dst = eval::RefValue::of_array(result);
    int64_t off = 0;
    for (size_t d = 0; d < out_start.size(); ++d) off += out_start[d] * dst.strides[d];
    dst.data += off * itemsize(base.dtype);
    dst.shape = part.shape;
    eval::write(dst, got);
  }
  if (op.attrs.get_int_or(AttrKey::Masked, 0) != 0) {
    size_t next = 1 + dyn.size();
    result = eval::select(array(op.operands[next]), result, array(op.operands[next + 1]));
  }
  set(op.results[0], std::move(result));
  return true;
}

// buffer_bounds = "padded": a store or swap that reaches into a buffer's tile padding writes
// only the part inside the buffer's logical shape (the padding keeps what it holds).
bool CoreRunner::store_dropping_padding(const ir::Op& op) {
  const eval::RefValue& base = ref(op.operands[0]);
  Buffer* b = buffer_of(base);
  if (b->logical == b->content.shape()) return false;
  const ir::Indexer& index = op.attrs.get_indexer(AttrKey::Index);
  std::vector<int64_t> dyn = dynamic_values(op, [&](ir::ValueId v) { return scalar_int(v); });
  eval::RefValue v;
  try {
    v = eval::view(base, index, dyn);
  } catch (const Error&) {
    return false;  // out of bounds: the normal path reports it
  }
  std::vector<int> dims;
  Region r = region_of(v, static_cast<std::byte*>(b->content.raw_data()), b->content.shape(), &dims,
                       itemsize(b->content.dtype()));
  if (std::find(dims.begin(), dims.end(), kSharedDim) != dims.end()) {
    // A reshaped or bitcast view whose dims do not map one to one onto the buffer's: inside the
    // logical shape, the plain store; otherwise (or where the region is the conservative whole
    // buffer) there is no box to clip it to.
    bool inside = true;
    for (size_t d = 0; d < r.size(); ++d)
      inside = inside && (r[d].count == 0 || r[d].start + (r[d].count - 1) * r[d].step < b->logical[d]);
    if (inside) return false;
    throw NotSupportedError(std::string(op.info().name) +
                                " through a reshaped or bitcast Ref view of a padded buffer (buffer_bounds = \"padded\") "
                                "that may reach into the padding: the part inside the logical shape is not a box of the "
                                "view",
                            op.loc);
  }
  bool none = false;
  std::vector<bool> mapped(r.size(), false);
  Shape keep = v.shape;
  for (size_t k = 0; k < v.shape.size(); ++k) {
    if (dims[k] < 0) continue;
    const DimRange& d = r[static_cast<size_t>(dims[k])];
    mapped[static_cast<size_t>(dims[k])] = true;
    int64_t room = b->logical[static_cast<size_t>(dims[k])] - d.start;
    keep[k] = room <= 0 ? 0 : std::min(v.shape[k], (room + d.step - 1) / d.step);
  }
  for (size_t d = 0; d < r.size(); ++d)
    if (!mapped[d] && r[d].start >= b->logical[d]) none = true;
  if (!none && keep == v.shape) return false;
  size_t next = 1 + dyn.size();
  bool masked = op.attrs.get_int_or(AttrKey::Masked, 0) != 0;
  Array value = array(op.operands[next]);
  begin_access(op, v);
  try {
    Array old = eval::read(v);
    if (masked) value = eval::select(array(op.operands[next + 1]), value, old);
    if (!none && num_elements(keep) > 0) {
      eval::RefValue src = eval::RefValue::of_array(value);
      src.shape = keep;
      eval::RefValue dst = v;
      dst.shape = keep;
      eval::write(dst, eval::read(src));
    }
    end_access(op, v);
    if (op.code == OpCode::Swap) set(op.results[0], std::move(old));
  } catch (...) {
    end_access(op, v);
    throw;
  }
  return true;
}

// ---- TPU ops --------------------------------------------------------------------------------------
int CoreRunner::target_device(const ir::Op& op, size_t first) {
  const std::string& kind = op.attrs.get_string(AttrKey::DeviceIdType);
  std::vector<int64_t> values;
  for (size_t i = first; i < op.operands.size(); ++i) values.push_back(scalar_int(op.operands[i]));
  const tpu::Mesh& mesh = m_.config().mesh;
  const int ndev = m_.num_devices();
  if (kind == "logical") {
    if (values[0] < 0 || values[0] >= ndev)
      throw Error(std::string(op.info().name) + ": device id " + std::to_string(values[0]) +
                      " is out of range (the mesh has " + std::to_string(ndev) + " devices)",
                  op.loc);
    return static_cast<int>(values[0]);
  }
  std::vector<int64_t> coords = m_.device_coords(t_.device);
  if (!op.attrs.has(AttrKey::AxisNames)) {
    if (mesh.shape.empty() && values.size() == 1) {
      if (values[0] != 0)
        throw Error(std::string(op.info().name) + ": device " + std::to_string(values[0]) +
                        " does not exist: this call runs on one device (use "
                        "pltpu::run_on_mesh for several)",
                    op.loc);
      return 0;
    }
    if (values.size() != mesh.shape.size())
      throw Error(std::string(op.info().name) + ": a MESH device id needs one coordinate per mesh "
                      "axis (" + join_names(mesh.axis_names) + "), got " +
                      std::to_string(values.size()),
                  op.loc);
    return m_.device_from_coords(values, op.loc);
  }
  std::vector<std::string> names = split_names(op.attrs.get_string(AttrKey::AxisNames));
  for (size_t i = 0; i < names.size(); ++i) {
    auto it = std::find(mesh.axis_names.begin(), mesh.axis_names.end(), names[i]);
    if (it == mesh.axis_names.end())
      throw Error(std::string(op.info().name) + ": '" + names[i] +
                      "' is not a device mesh axis (the mesh's axes: " +
                      join_names(mesh.axis_names) + ")",
                  op.loc);
    coords[static_cast<size_t>(it - mesh.axis_names.begin())] = values[i];
  }
  return m_.device_from_coords(coords, op.loc);
}

// The row indices of an indirect DMA, read when it starts: from a VMEM ref (a read of that
// buffer, for the race detector) or a vector value.
std::vector<int64_t> CoreRunner::indirect_rows(ir::ValueId indices, const SourceLoc& loc) {
  Array a;
  if (kernel().type(indices).is_ref) {
    const eval::RefValue& r = ref(indices);
    Buffer* b = buffer_of(r);
    std::lock_guard<std::mutex> lock(b->mu);
    if (m_.races())
      m_.check_access(b, r, false, t_.clock, {t_.actor, t_.name, "read of gather/scatter indices", loc});
    a = eval::read(r);
  } else {
    a = array(indices);
  }
  const int32_t* p = static_cast<const int32_t*>(a.raw_data());
  return std::vector<int64_t>(p, p + a.size());
}

void CoreRunner::dma_start(const ir::Op& op) {
  // The copy covers the Refs' logical shapes (in "padded" mode a whole buffer's RefValue also
  // spans its tile padding, which DMAs neither read nor write).
  eval::RefValue src = ref(op.operands[0]);
  eval::RefValue dst = ref(op.operands[1]);
  src.shape = kernel().type(op.operands[0]).shape;
  dst.shape = kernel().type(op.operands[1]).shape;
  int64_t recv = m_.semaphore_id(ref(op.operands[2]));
  if (const int64_t indirect = op.attrs.get_int_or(AttrKey::Indirect, 0)) {
    m_.indirect_dma_start(t_, src, dst, recv, static_cast<int>(indirect),
                          op.attrs.get_int_or(AttrKey::AddAttr, 0) != 0,
                          indirect_rows(op.operands[3], op.loc), op.loc);
    return;
  }
  std::optional<int64_t> send;
  int device = t_.device;
  if (op.attrs.has(AttrKey::DeviceIdType)) {
    send = m_.semaphore_id(ref(op.operands[3]));
    device = target_device(op, 4);
  }
  m_.dma_start(t_, src, dst, recv, send, device, op.loc);
}

void CoreRunner::semaphore_signal(const ir::Op& op) {
  int64_t sem = m_.semaphore_id(ref(op.operands[0]));
  int64_t inc = scalar_int(op.operands[1]);
  size_t next = 2;
  int64_t core = t_.core;
  if (op.attrs.get_int(AttrKey::HasCoreIndex) != 0) {
    core = scalar_int(op.operands[next++]);
    if (core < 0 || core >= m_.config().num_cores)
      throw Error("semaphore_signal: core_index " + std::to_string(core) +
                      " is out of range (each device has " +
                      std::to_string(m_.config().num_cores) + " cores)",
                  op.loc);
  }
  int device = op.attrs.has(AttrKey::DeviceIdType) ? target_device(op, next) : t_.device;
  if (inc < 0)
    throw Error(eval::negative_semaphore_amount(op.info().name, inc), op.loc);
  m_.signal(t_, sem, device * m_.config().num_cores + static_cast<int>(core), inc, op.loc);
}

void CoreRunner::run_scoped(const ir::Op& op) {
  const ir::Region& body = op.regions[0];
  const tpu::InterpretParams& p = m_.config().params;
  std::vector<eval::RefValue> allocated;
  std::string name = "run_scoped at " + op.loc.to_string();
  auto release_all = [&] {
    for (auto it = allocated.rbegin(); it != allocated.rend(); ++it) m_.release(*it);
  };
  try {
    for (size_t i = 0; i < body.args.size(); ++i) {
      const ir::Type& t = kernel().type(body.args[i]);
      bool hbm = t.space == MemorySpace::Hbm || t.space == MemorySpace::Any;
      if (hbm && !p.allow_hbm_allocation_in_run_scoped)
        throw Error("Cannot allocate HBM in `run_scoped`. (set "
                    "InterpretParams.allow_hbm_allocation_in_run_scoped to allow it)",
                    op.loc);
      bool shared = hbm || t.space == MemorySpace::VmemShared;
      if (shared) m_.log(t_, "shared_memory", "allocate " + t.to_string() + " in " + name);
      allocated.push_back(m_.allocate(t_, t, name + (body.args.size() > 1 ? " #" + std::to_string(i) : ""),
                                      shared));
      set(body.args[i], allocated.back());
    }
    std::vector<Array> res = run_region_yield(body);
    for (ir::ValueId a : body.args) set(a, eval::RtValue{});
    release_all();
    for (size_t i = 0; i < res.size(); ++i) set(op.results[i], res[i]);
  } catch (...) {
    release_all();
    throw;
  }
}

bool CoreRunner::skip_float_op(const ir::Op& op) {
  const uint32_t cat = op.info().categories;
  if (op.results.empty()) return false;
  for (ir::ValueId r : op.results) {
    const ir::Type& t = kernel().type(r);
    if (t.is_ref || !is_float(t.dtype)) return false;
  }
  auto inf = [&](ir::ValueId r) {
    const ir::Type& t = kernel().type(r);
    return eval::constant(Scalar::of_float(std::numeric_limits<double>::infinity(), t.dtype), t.shape);
  };
  if (op.code == OpCode::Load || op.code == OpCode::Swap) {
    eval_ref_op(op);  // the access happens; the value is a placeholder
    set(op.results[0], inf(op.results[0]));
    return true;
  }
  if (cat & (ir::kControl | ir::kTerminator | ir::kMemRead | ir::kMemWrite | ir::kSideEffect |
             ir::kGridQuery))
    return false;
  for (ir::ValueId r : op.results) set(r, inf(r));
  return true;
}

bool CoreRunner::eval_extension_op(const ir::Op& op) {
  switch (op.code) {
    case OpCode::RunScoped: run_scoped(op); return true;
    case OpCode::DmaStart: dma_start(op); return true;
    case OpCode::DmaWait: {
      // The byte count of the Ref's logical shape (its RefValue may span tile padding).
      const ir::Type& r = kernel().type(op.operands[1]);
      m_.wait(t_, m_.semaphore_id(ref(op.operands[0])), r.size() * itemsize(r.dtype), op.loc,
              "dma_wait");
      return true;
    }
    case OpCode::SemaphoreSignal: semaphore_signal(op); return true;
    case OpCode::SubcoreBarrier: m_.subcore_barrier(t_, op.loc); return true;
    case OpCode::SemaphoreWait: {
      if (op.attrs.get_int_or(AttrKey::Decrement, 1) == 0)
        throw NotSupportedError("semaphore_wait with decrement = false (gpu::semaphore_wait) in the TPU interpret mode",
                                op.loc);
      int64_t value = scalar_int(op.operands[1]);
      if (value < 0)
        throw Error(eval::negative_semaphore_amount(op.info().name, value), op.loc);
      m_.wait(t_, m_.semaphore_id(ref(op.operands[0])), value, op.loc, "semaphore_wait");
      return true;
    }
    case OpCode::SemaphoreRead: {
      int64_t n = m_.read_semaphore(t_, m_.semaphore_id(ref(op.operands[0])));
      set(op.results[0], eval::constant(Scalar::of_int(n, DType::I32), {}));
      return true;
    }
    case OpCode::GetBarrierSemaphore: {
      if (!barrier_ref_.owner) {
        int64_t id = m_.barrier_semaphore(op.loc);
        auto b = std::make_shared<Buffer>();
        b->id = id;
        b->space = MemorySpace::Semaphore;
        b->device = t_.device;
        b->core = t_.core;
        b->name = "barrier semaphore";
        b->description = "barrier semaphore (semaphore_mem, device " + std::to_string(t_.device) +
                         ", core " + std::to_string(t_.core) + ")";
        b->content = Array::uninitialized({}, DType::I32);
        b->sem_base = id;
        barrier_ref_ = eval::RefValue::of_array(b->content, MemorySpace::Semaphore);
        barrier_ref_.dtype = DType::BarrierSemaphore;
        barrier_ref_.owner = b;
      }
      set(op.results[0], barrier_ref_);
      return true;
    }
    case OpCode::AxisIndex: {
      const std::string& name = op.attrs.get_string(AttrKey::AxisNames);
      const auto& grid_names = m_.call().grid_mapping.grid_names;
      if (const int axis = core::named_grid_axis(m_.call().grid_mapping, name); axis >= 0) {
        set(op.results[0], eval::constant(Scalar::of_int(grid_point().program_ids.at(axis), DType::I32), {}));
        return true;
      }
      const tpu::Mesh& mesh = m_.config().mesh;
      for (size_t i = 0; i < mesh.axis_names.size(); ++i)
        if (mesh.axis_names[i] == name) {
          set(op.results[0],
              eval::constant(Scalar::of_int(m_.device_coords(t_.device)[i], DType::I32), {}));
          return true;
        }
      throw Error("axis_index(\"" + name + "\"): no such axis (grid axes: " +
                      join_names(grid_names) + "; device mesh axes: " +
                      join_names(mesh.axis_names) + ")",
                  op.loc);
    }
    case OpCode::Store:
    case OpCode::Swap:
      if (padded_ && store_dropping_padding(op)) return true;
      break;
    case OpCode::Load:
      if (fill_oob_reads_ && load_with_uninitialized_fill(op))
        return true;
      break;
    default: break;
  }
  if (skip_float_) return skip_float_op(op);
  return false;
}

}  // namespace pallas::tpu_interpret
