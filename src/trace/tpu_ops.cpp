// Tracing of the TPU surface (include/pallas/tpu.h): DMAs (gather/scatter ones included),
// semaphores, axis indices; and the SparseCore's subcore_barrier.
#include "pallas/tpu.h"

#include <algorithm>
#include <cctype>

#include "core/blocks.h"
#include "pallas/sparse_core.h"
#include "trace/context.h"

namespace pallas::tpu {

using ir::AttrKey;
using ir::Attrs;
using ir::OpCode;

DType semaphore_dtype(SemaphoreType t) {
  switch (t) {
    case SemaphoreType::REGULAR: return DType::Semaphore;
    case SemaphoreType::DMA: return DType::DmaSemaphore;
    case SemaphoreType::BARRIER: return DType::BarrierSemaphore;
  }
  throw InternalError("semaphore type");
}

DeviceId DeviceId::named(std::vector<std::pair<std::string, Operand>> coords) {
  std::vector<Operand> ids;
  std::vector<std::string> axes;
  for (auto& [axis, id] : coords) {
    axes.push_back(axis);
    ids.push_back(std::move(id));
  }
  DeviceId d(std::move(ids));
  d.axes = std::move(axes);
  return d;
}

namespace {

std::string join(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i].empty() || names[i].find(',') != std::string::npos)
      throw Error("a mesh axis name must be non-empty and contain no comma, got \"" + names[i] +
                  "\"");
    s += (i ? "," : "") + names[i];
  }
  return s;
}

// Appends the device id's operands (as i32 scalars) and records how to read them.
void add_device_id(const DeviceId& id, DeviceIdType type, std::vector<Value>& ops, Attrs& attrs,
                   const Loc& loc) {
  if (id.ids.empty()) throw Error("a device id needs at least one coordinate", trace::src(loc));
  if (type == DeviceIdType::LOGICAL && (id.ids.size() != 1 || !id.axes.empty()))
    throw Error("a LOGICAL device id is one integer (the row-major device number)",
                trace::src(loc));
  for (const Operand& o : id.ids) ops.push_back(trace::index_scalar(o, "a device id", loc));
  attrs.set(AttrKey::DeviceIdType, std::string(type == DeviceIdType::LOGICAL ? "logical" : "mesh"));
  if (!id.axes.empty()) attrs.set(AttrKey::AxisNames, join(id.axes));
}

}  // namespace

void semaphore_signal(const Ref& sem, Operand inc, SignalOptions opts, Loc loc) {
  std::vector<Value> ops = {sem.handle(), trace::index_scalar(inc, "semaphore_signal increment", loc)};
  Attrs a;
  a.set(AttrKey::HasCoreIndex, int64_t{opts.core_index.has_value()});
  if (opts.core_index) ops.push_back(trace::index_scalar(*opts.core_index, "semaphore_signal core_index", loc));
  if (opts.device_id) add_device_id(*opts.device_id, opts.device_id_type, ops, a, loc);
  trace::add_op(OpCode::SemaphoreSignal, ops, std::move(a), loc);
}

void semaphore_wait(const Ref& sem, Operand value, Loc loc) { trace::semaphore_wait(sem, value, true, loc); }

Value semaphore_read(const Ref& sem, Loc loc) {
  return trace::add_op1(OpCode::SemaphoreRead, {sem.handle()}, {}, loc);
}

Ref get_barrier_semaphore(Loc loc) {
  return Ref(trace::add_op1(OpCode::GetBarrierSemaphore, {}, {}, loc));
}

Value axis_index(const std::string& axis, Loc loc) {
  Attrs a;
  a.set(AttrKey::AxisNames, axis);
  if (axis.empty()) throw Error("axis_index needs an axis name", trace::src(loc));
  return trace::add_op1(OpCode::AxisIndex, {}, std::move(a), loc);
}

// ---- DMAs -----------------------------------------------------------------------------------------
AsyncCopy make_async_copy(const Ref& src, const Ref& dst, const Ref& sem) {
  AsyncCopy c;
  c.src = src;
  c.dst = dst;
  c.recv_sem = sem;
  return c;
}

AsyncCopy make_async_remote_copy(const Ref& src, const Ref& dst, const Ref& send_sem,
                                 const Ref& recv_sem, DeviceId device_id,
                                 DeviceIdType device_id_type) {
  AsyncCopy c = make_async_copy(src, dst, recv_sem);
  c.send_sem = send_sem;
  c.device_id = std::move(device_id);
  c.device_id_type = device_id_type;
  return c;
}

AsyncCopy make_async_copy(const Ref& src, const Ref& dst, const Ref& sem, CopyOptions opts) {
  AsyncCopy c = make_async_copy(src, dst, sem);
  c.add = opts.add;
  return c;
}

namespace {

bool is_hbm_like(MemorySpace s) {
  return s == MemorySpace::Hbm || s == MemorySpace::Any || s == MemorySpace::VmemShared;
}

std::string space_name(MemorySpace s) {
  std::string n(memory_space_name(s));
  for (char& ch : n) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return n;
}

// The checks of an indirect (gather / scatter) or adding DMA, then its dma_start: operands src,
// dst, sem, indices; attrs indirect (1: gather, 2: scatter) and add.
void start_indirect_dma(const AsyncCopy& c, const Loc& loc) {
  const Ref::Indirect* gather = c.src.indirect();
  const Ref::Indirect* scatter = c.dst.indirect();
  const MemorySpace ss = c.src.memory_space(), ds = c.dst.memory_space();
  auto fail = [&](const std::string& msg) { throw Error(msg, trace::src(loc)); };
  if (is_hbm_like(ss) && ds == MemorySpace::Vmem) {
    if (scatter)
      fail("only the source can be indexed in a gather (an async_copy/sync_copy from " +
           space_name(ss) + " to VMEM); the destination " + c.dst.type().to_string() + " is indexed");
  } else if (ss == MemorySpace::Vmem && is_hbm_like(ds)) {
    if (gather)
      fail("only the destination can be indexed in a scatter (an async_copy/sync_copy from VMEM "
           "to " + space_name(ds) + "); the source " + c.src.type().to_string() + " is indexed");
  } else {
    if (gather || scatter)
      throw NotSupportedError("a gather/scatter DMA from " + space_name(ss) + " to " +
                                  space_name(ds) + " (only HBM/VMEM_SHARED to VMEM gathers and "
                                  "VMEM to HBM/VMEM_SHARED scatters exist)",
                              trace::src(loc));
    fail("DMAs with add = true only run between VMEM and HBM/VMEM_SHARED; this one copies " +
         space_name(ss) + " to " + space_name(ds));
  }
  const Ref::Indirect* ind = gather ? gather : scatter;
  if (!ind)
    throw NotSupportedError("a DMA with add = true whose major dimension is not indexed: index "
                            "it with the row offsets, e.g. dst.at(indices) with indices = "
                            "0, 1, ..., n-1 in a VMEM ref",
                            trace::src(loc));
  if (c.send_sem)
    throw NotSupportedError("a gather/scatter DMA to or from a remote device", trace::src(loc));
  const ir::Type& it = ind->indices.type();
  if (it.dtype != DType::I32)
    throw NotSupportedError("gather/scatter indices of dtype " + std::string(dtype_name(it.dtype)) +
                                " (only int32 indices)",
                            trace::src(loc));
  if (it.is_ref && it.space != MemorySpace::Vmem)
    throw NotSupportedError("gather/scatter indices in " + space_name(it.space) +
                                " (they must be in VMEM)",
                            trace::src(loc));
  const Ref& other = gather ? c.dst : c.src;
  if (other.shape() != ind->type.shape)
    fail(std::string("the indexed ") + (gather ? "source" : "destination") + " has shape " +
         core::tuple_string(ind->type.shape) + " but the " + (gather ? "destination" : "source") +
         " has shape " + core::tuple_string(other.shape()) + "; they must match");
  if (other.dtype() != ind->type.dtype)
    fail(std::string("the ") + (gather ? "source" : "destination") + " holds " +
         std::string(dtype_name(ind->type.dtype)) + " but the " + (gather ? "destination" : "source") +
         " holds " + std::string(dtype_name(other.dtype())));
  static const DType addable[] = {DType::F32, DType::F64, DType::I32, DType::U32, DType::I64};
  if (c.add && std::find(std::begin(addable), std::end(addable), other.dtype()) == std::end(addable))
    throw NotSupportedError("a DMA with add = true on " + std::string(dtype_name(other.dtype())) +
                                " data (f32, f64, i32, u32 and i64 can be added)",
                            trace::src(loc));
  std::vector<Value> ops = {gather ? gather->data : c.src.handle(),
                            scatter ? scatter->data : c.dst.handle(), c.recv_sem.handle(),
                            ind->indices};
  Attrs a;
  a.set(AttrKey::Indirect, int64_t{gather ? 1 : 2});
  if (c.add) a.set(AttrKey::AddAttr, int64_t{1});
  trace::add_op(OpCode::DmaStart, ops, std::move(a), loc);
}

}  // namespace

const Ref& AsyncCopy::direct_side() const { return src.indirect() ? dst : src; }

void AsyncCopy::start(Loc loc) const {
  if (add || src.indirect() || dst.indirect()) {
    start_indirect_dma(*this, loc);
    return;
  }
  std::vector<Value> ops = {src.handle(), dst.handle(), recv_sem.handle()};
  Attrs a;
  if (send_sem) {
    ops.push_back(send_sem->handle());
    add_device_id(*device_id, device_id_type, ops, a, loc);
  }
  trace::add_op(OpCode::DmaStart, ops, std::move(a), loc);
}

// The receiver waits for the bytes of the source; the sender for the bytes of the destination
// (equal: the type rule makes both the same shape and dtype).
void AsyncCopy::wait_recv(Loc loc) const {
  trace::add_op(OpCode::DmaWait, {recv_sem.handle(), direct_side().handle()}, {}, loc);
}

void AsyncCopy::wait_send(Loc loc) const {
  if (!send_sem)
    throw Error("wait_send: this is a local copy (make_async_copy); use wait()", trace::src(loc));
  trace::add_op(OpCode::DmaWait, {send_sem->handle(), dst.handle()}, {}, loc);
}

void AsyncCopy::wait(Loc loc) const {
  if (send_sem) wait_send(loc);
  wait_recv(loc);
}

AsyncCopy async_copy(const Ref& src, const Ref& dst, const Ref& sem, Loc loc) {
  return async_copy(src, dst, sem, CopyOptions{}, loc);
}

AsyncCopy async_remote_copy(const Ref& src, const Ref& dst, const Ref& send_sem,
                            const Ref& recv_sem, DeviceId device_id, DeviceIdType device_id_type,
                            Loc loc) {
  AsyncCopy c = make_async_remote_copy(src, dst, send_sem, recv_sem, std::move(device_id),
                                       device_id_type);
  c.start(loc);
  return c;
}

AsyncCopy async_copy(const Ref& src, const Ref& dst, const Ref& sem, CopyOptions opts, Loc loc) {
  AsyncCopy c = make_async_copy(src, dst, sem, opts);
  c.start(loc);
  return c;
}

void sync_copy(const Ref& src, const Ref& dst, Loc loc) { sync_copy(src, dst, CopyOptions{}, loc); }

void sync_copy(const Ref& src, const Ref& dst, CopyOptions opts, Loc loc) {
  run_scoped(
      {scoped_semaphores(SemaphoreType::DMA)},
      [&](std::vector<Ref> sems) {
        AsyncCopy c = make_async_copy(src, dst, sems[0], opts);
        c.start(loc);
        c.wait(loc);
        return std::vector<Value>{};
      },
      {}, loc);
}

void run_on_first_core(const std::string& core_axis, const std::function<void()>& fn, Loc loc) {
  when(axis_index(core_axis, loc) == 0, fn, loc);
}

}  // namespace pallas::tpu

namespace pallas::tpu_sc {

void subcore_barrier(Loc loc) { trace::add_op(ir::OpCode::SubcoreBarrier, {}, {}, loc); }

}  // namespace pallas::tpu_sc

namespace pallas::trace {

Value index_scalar(const Operand& o, const char* what, const Loc& loc) {
  Value v = pallas::detail::as_index_scalar(o, what);
  return v.dtype() == DType::I32 ? v : convert_to(v, DType::I32, loc);
}

void semaphore_wait(const Ref& sem, const Operand& value, bool decrement, const Loc& loc) {
  ir::Attrs a;
  if (!decrement) a.set(ir::AttrKey::Decrement, int64_t{0});
  add_op(ir::OpCode::SemaphoreWait, {sem.handle(), index_scalar(value, "semaphore_wait value", loc)}, std::move(a),
         loc);
}

}  // namespace pallas::trace
