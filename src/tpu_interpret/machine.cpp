// The simulated TPU: setup, grid execution on every core, semaphores, DMAs, barriers,
// deadlock detection and the checks at kernel exit (see machine.h and docs/TPU_INTERPRET.md).
#include "tpu_interpret/machine.h"

#include <algorithm>
#include <cstring>
#include <iostream>
#include <set>
#include <sstream>
#include <system_error>
#include <thread>

#include "core/blocks.h"
#include "eval/strided.h"
#include "tpu_interpret/core_runner.h"

namespace pallas::tpu_interpret {

using core::tuple_string;

namespace {
// `subcores`: per SparseCore on a VectorSubcoreMesh (0: not one), whose thread c is
// "core c / subcores, subcore c % subcores".
std::string description_of(const Buffer& b, int subcores) {
  std::string s = b.name + " (" + std::string(memory_space_name(b.space)) + ", device " +
                  std::to_string(b.device);
  if (b.core >= 0 && subcores > 0)
    s += ", core " + std::to_string(b.core / subcores) + ", subcore " + std::to_string(b.core % subcores);
  else if (b.core >= 0)
    s += ", core " + std::to_string(b.core);
  if (b.core < -1) s += ", SparseCore " + std::to_string(-2 - b.core);
  return s + ")";
}
}  // namespace

Buffer* buffer_of(const eval::RefValue& r) {
  PALLAS_INTERNAL_CHECK(r.owner != nullptr, "a TPU-interpret Ref without its buffer");
  return static_cast<Buffer*>(r.owner.get());
}

Shape tile_padded(const Shape& shape, DType dtype, MemorySpace space) {
  if (shape.empty() || space == MemorySpace::Smem || space == MemorySpace::Semaphore ||
      is_semaphore(dtype))
    return shape;
  const int64_t isz = itemsize(dtype);
  if (isz > 4)
    throw Error("InterpretParams.buffer_bounds = \"padded\": " + std::string(dtype_name(dtype)) +
                " has no TPU tiling (only dtypes of at most 32 bits)");
  const int64_t packing = 4 / isz;
  auto round_up = [](int64_t n, int64_t m) { return (n + m - 1) / m * m; };
  Shape out = shape;
  const size_t r = shape.size();
  if (r == 1) {
    out[0] = round_up(shape[0], 128 * packing);
    return out;
  }
  out[r - 1] = round_up(shape[r - 1], 128);
  int64_t f = packing;
  while (f < std::min<int64_t>(shape[r - 2], 8)) f *= 2;
  out[r - 2] = round_up(shape[r - 2], f);
  return out;
}

namespace {

// Barrier semaphores (get_barrier_semaphore) have fixed ids: this plus the collective id.
constexpr int64_t kBarrierSemaphoreBase = int64_t{1} << 40;

std::string semaphore_kind(DType t) {
  if (t == DType::DmaSemaphore) return "DMA semaphore";
  if (t == DType::BarrierSemaphore) return "barrier semaphore";
  return "regular semaphore";
}

void fill(Array& a, const tpu::InterpretParams& p) {
  if (p.uninitialized_memory == "zero") {
    if (a.size() > 0) std::memset(a.raw_data(), 0, static_cast<size_t>(a.size() * itemsize(a.dtype())));
  } else {
    eval::fill_uninitialized(a);
  }
}

eval::RefValue whole_ref(const std::shared_ptr<Buffer>& b) {
  eval::RefValue r;
  r.data = static_cast<std::byte*>(b->content.raw_data());
  r.dtype = b->content.dtype();
  r.shape = b->content.shape();
  r.strides = b->strides;
  r.space = b->space;
  r.owner = b;
  return r;
}

// A view of `shape` starting at `start` (one entry per buffer dim); dims in `drop` are left out.
eval::RefValue sub_ref(const eval::RefValue& whole, const std::vector<int64_t>& start,
                       const std::vector<int64_t>& size, const std::vector<bool>& drop) {
  eval::RefValue r = whole;
  r.shape.clear();
  r.strides.clear();
  int64_t off = 0;
  for (size_t d = 0; d < start.size(); ++d) {
    off += start[d] * whole.strides[d];
    if (drop.empty() || !drop[d]) {
      r.shape.push_back(size[d]);
      r.strides.push_back(whole.strides[d]);
    }
  }
  r.data = whole.data + off * itemsize(whole.dtype);
  return r;
}

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void check_choice(const std::string& field, const std::string& v,
                  std::initializer_list<const char*> allowed) {
  std::string names;
  for (const char* a : allowed) {
    if (v == a) return;
    names += std::string(names.empty() ? "" : ", ") + "\"" + a + "\"";
  }
  throw Error("InterpretParams." + field + " must be one of " + names + ", got \"" + v + "\"");
}

}  // namespace

// ---- Setup ---------------------------------------------------------------------------------------
Machine::Machine(const TracedCall& call, MachineConfig cfg, const SourceLoc& call_loc)
    : call_(call), cfg_(std::move(cfg)), call_loc_(call_loc) {
  const tpu::InterpretParams& p = cfg_.params;
  if (cfg_.num_cores < 1)
    throw Error("Number of cores or threads must be at least 1, but got " +
                std::to_string(cfg_.num_cores) + ".");
  check_choice("dma_execution_mode", p.dma_execution_mode, {"eager", "on_wait"});
  check_choice("out_of_bounds_reads", p.out_of_bounds_reads, {"raise", "uninitialized"});
  check_choice("uninitialized_memory", p.uninitialized_memory, {"nan", "zero"});
  check_choice("buffer_bounds", p.buffer_bounds, {"logical", "padded"});
  check_choice("nonzero_semaphores_at_exit", p.nonzero_semaphores_at_exit, {"error", "warn"});
  {
    std::stringstream ss(p.logging_mode);
    std::string item;
    while (std::getline(ss, item, ','))
      if (!item.empty()) {
        check_choice("logging_mode (each item)", item, {"semaphore", "shared_memory", "dma", "barrier"});
        log_kinds_.push_back(item);
      }
  }
  const int64_t total = cfg_.mesh.num_devices() * cfg_.num_cores;
  if (p.vector_clock_size) {
    if (*p.vector_clock_size < 1)
      throw Error("Vector clock size must be at least 1, but got " +
                  std::to_string(*p.vector_clock_size) + ".");
    if (*p.vector_clock_size <= total)
      throw Error("Vector clock size (" + std::to_string(*p.vector_clock_size) +
                  ") must be greater than the total number of cores/threads (" +
                  std::to_string(total) + ").");
  }
  int nparallel = 0;
  bool prefix = true;
  for (const std::string& s : cfg_.dimension_semantics) {
    bool par = s == "parallel";
    if (par && !prefix)
      throw Error("Dimensions with parallel semantics must form a prefix of the grid.", call_loc_);
    if (!par) prefix = false;
    nparallel += par;
  }
  if (p.detect_races) races_ = std::make_unique<RaceDetector>();
  num_threads_ = static_cast<int>(total);
}

Machine::~Machine() = default;

std::vector<int64_t> Machine::device_coords(int device) const {
  const auto& shape = cfg_.mesh.shape;
  std::vector<int64_t> c(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    c[d] = device % shape[d];
    device = static_cast<int>(device / shape[d]);
  }
  return c;
}

int Machine::device_from_coords(const std::vector<int64_t>& coords, const SourceLoc& loc) const {
  const auto& shape = cfg_.mesh.shape;
  int64_t id = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (coords[d] < 0 || coords[d] >= shape[d])
      throw Error("device coordinate " + std::to_string(coords[d]) + " along mesh axis '" +
                      cfg_.mesh.axis_names[d] + "' is out of range (the axis has " +
                      std::to_string(shape[d]) + " devices)",
                  loc);
    id = id * shape[d] + coords[d];
  }
  return static_cast<int>(id);
}

bool Machine::logging(const char* kind) const {
  if (log_kinds_.empty()) return false;
  for (const std::string& k : log_kinds_)
    if (k == kind) return true;
  return false;
}

void Machine::log(const CoreThread& t, const char* kind, const std::string& line) {
  if (!logging(kind)) return;
  std::lock_guard<std::mutex> lock(log_mu_);
  std::ostream& os = cfg_.params.log ? *cfg_.params.log : std::cerr;
  os << "Device " << t.device << ", core " << t.core << ": " << line << "\n";
}

eval::RefValue Machine::allocate(CoreThread& t, const ir::Type& type, const std::string& name,
                                 bool shared) {
  int64_t id = t.next_buffer_id++;
  // Who shares the buffer: its core (-1: the whole device; below -1: one SparseCore's subcores,
  // for VMEM_SHARED on a SparseCore mesh).
  int owner = shared ? -1 : t.core;
  int sharers = shared ? cfg_.num_cores : 1;
  if (shared && type.space == MemorySpace::VmemShared && !cfg_.sc_kind.empty()) {
    owner = -2 - t.sc_core;
    sharers = cfg_.subcores_per_core;
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto key = std::make_tuple(t.device, owner, id);
  auto it = buffers_.find(key);
  if (shared && it != buffers_.end()) return whole_ref(it->second);  // counted at creation
  auto b = std::make_shared<Buffer>();
  b->id = id;
  b->space = type.space;
  b->device = t.device;
  b->core = owner;
  b->name = name;
  b->description =
      description_of(*b, cfg_.vector_subcore_mesh() ? cfg_.subcores_per_core : 0);  // race reports name it on every access: built once
  b->logical = type.shape;
  Shape stored = cfg_.params.buffer_bounds == "padded"
                     ? tile_padded(type.shape, type.dtype, type.space)
                     : type.shape;
  b->content = Array::uninitialized(stored, is_semaphore(type.dtype) ? DType::I32 : type.dtype);
  b->strides = row_major_strides(stored);
  if (is_semaphore(type.dtype)) {
    std::memset(b->content.raw_data(), 0, static_cast<size_t>(b->content.size() * 4));
    b->sem_base = t.next_sem_id;
    t.next_sem_id += std::max<int64_t>(b->content.size(), 1);
    for (int64_t i = 0; i < b->content.size(); ++i) {
      std::string n = name + (type.shape.empty() ? "" : "[" + std::to_string(i) + "]");
      Semaphore& s = sem_locked(b->sem_base + i, n.c_str(), type.dtype);
      s.name = n;
      s.kind = type.dtype;
    }
  } else {
    fill(b->content, cfg_.params);
  }
  // A shared buffer is created by the first core to get here and lives until every core of the
  // device has released it: counting only the cores that have arrived so far would free it
  // when an early core leaves its run_scoped before a later core enters (which then got a
  // fresh, uninitialised buffer instead of the shared one).
  b->refs = sharers;
  buffers_[key] = b;
  eval::RefValue r = whole_ref(b);
  r.dtype = type.dtype;
  return r;
}

void Machine::release(const eval::RefValue& r) {
  Buffer* b = buffer_of(r);
  std::lock_guard<std::mutex> lock(mu_);
  auto key = std::make_tuple(b->device, b->core, b->id);
  auto it = buffers_.find(key);
  if (it == buffers_.end()) return;
  if (--it->second->refs <= 0) buffers_.erase(it);
}

Semaphore& Machine::sem_locked(int64_t id, const char* name, DType kind) {
  auto it = sems_.find(id);
  if (it != sems_.end()) return it->second;
  Semaphore& s = sems_[id];
  // Allocation names its semaphores first; one created here (a signal to a semaphore its core
  // has not allocated) is named by its id.
  s.name = name ? std::string(name) : "semaphore " + std::to_string(id);
  s.kind = kind;
  s.count.assign(static_cast<size_t>(num_threads_), 0);
  s.clock.assign(static_cast<size_t>(num_threads_), VectorClock{});
  s.tasks.resize(static_cast<size_t>(num_threads_));
  return s;
}

// ---- Failure ------------------------------------------------------------------------------------
void Machine::fail(std::exception_ptr e, const std::string& where) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failed_) {
    failed_ = true;
    first_error_ = e;
    first_error_where_ = where;
  }
  cv_.notify_all();
}

void Machine::check_failed() {
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_) throw Cancelled{};
}

// ---- Semaphores ----------------------------------------------------------------------------------
int64_t Machine::semaphore_id(const eval::RefValue& r) const {
  Buffer* b = buffer_of(r);
  PALLAS_INTERNAL_CHECK(b->sem_base != -1, "not a semaphore buffer");
  return b->sem_base + (r.data - static_cast<std::byte*>(b->content.raw_data())) / 4;
}

void Machine::signal(CoreThread& t, int64_t sem, int target_gcid, int64_t inc,
                     const SourceLoc& loc) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_) throw Cancelled{};
  Semaphore& s = sem_locked(sem, nullptr, DType::Semaphore);
  s.count[static_cast<size_t>(target_gcid)] += inc;
  if (races_) {
    merge_into(s.clock[static_cast<size_t>(target_gcid)], t.clock);
    tick(t.clock, t.actor);
  }
  if (logging("semaphore"))
    log(t, "semaphore",
        "semaphore_signal " + s.name + " += " + std::to_string(inc) + " on global core " +
            std::to_string(target_gcid) + " (now " +
            std::to_string(s.count[static_cast<size_t>(target_gcid)]) + ") at " + loc.to_string());
  cv_.notify_all();
}

void Machine::wait(CoreThread& t, int64_t sem, int64_t value, const SourceLoc& loc,
                   const char* what) {
  std::unique_lock<std::mutex> lk(mu_);
  const size_t g = static_cast<size_t>(t.gcid);
  while (true) {
    if (failed_) throw Cancelled{};
    Semaphore& s = sem_locked(sem, nullptr, DType::Semaphore);
    if (s.count[g] >= value) {
      s.count[g] -= value;
      if (races_) merge_into(t.clock, s.clock[g]);
      if (logging("semaphore"))
        log(t, "semaphore",
            std::string(what) + " " + s.name + " -= " + std::to_string(value) + " (now " +
                std::to_string(s.count[g]) + ") at " + loc.to_string());
      return;
    }
    if (!s.tasks[g].empty()) {
      auto task = s.tasks[g].back();  // LIFO, as the reference
      s.tasks[g].pop_back();
      lk.unlock();
      execute_dma(task.first, task.second);
      lk.lock();
      continue;
    }
    t.state = CoreThread::State::WaitingSemaphore;
    t.wait_sem = sem;
    t.wait_value = value;
    t.wait_loc = loc;
    t.wait_what = what;
    check_deadlock_locked();
    if (!failed_) cv_.wait(lk);
    t.state = CoreThread::State::Running;
  }
}

int64_t Machine::read_semaphore(CoreThread& t, int64_t sem) {
  std::unique_lock<std::mutex> lk(mu_);
  const size_t g = static_cast<size_t>(t.gcid);
  // A kernel may poll a semaphore: it must see a failure elsewhere (and stop), DMAs queued on
  // the semaphore run first (in on_wait mode nothing else would run them), and what it reads
  // orders it after the signals that produced the count (an acquire, as a wait is).
  while (true) {
    if (failed_) throw Cancelled{};
    Semaphore& s = sem_locked(sem, nullptr, DType::Semaphore);
    if (s.tasks[g].empty()) {
      if (races_) merge_into(t.clock, s.clock[g]);
      return s.count[g];
    }
    auto task = s.tasks[g].back();
    s.tasks[g].pop_back();
    lk.unlock();
    execute_dma(task.first, task.second);
    lk.lock();
  }
}

int64_t Machine::barrier_semaphore(const SourceLoc& loc) {
  if (!cfg_.collective_id)
    throw Error(
        "get_barrier_semaphore needs a collective id: pass .compiler_params = "
        "pltpu::CompilerParams{.collective_id = 0}",
        loc);
  // Fixed-id barrier semaphores get ids far above the per-core counters (which start at 2000
  // and grow by allocation sizes), never negative: -1 marks "no semaphore" (Buffer::sem_base,
  // Dma::send_sem), which collective_id 0 used to collide with.
  int64_t id = kBarrierSemaphoreBase + *cfg_.collective_id;
  std::lock_guard<std::mutex> lock(mu_);
  const std::string name =
      "barrier semaphore (collective_id " + std::to_string(*cfg_.collective_id) + ")";
  sem_locked(id, name.c_str(), DType::BarrierSemaphore);
  return id;
}

void Machine::check_deadlock_locked() {
  if (failed_) return;
  int live = 0;
  for (const auto& tp : threads_) {
    const CoreThread& t = *tp;
    if (t.state == CoreThread::State::Done) continue;
    ++live;
    if (t.state == CoreThread::State::Running) return;
    if (t.state == CoreThread::State::WaitingSemaphore) {
      const Semaphore& s = sems_.at(t.wait_sem);
      const size_t g = static_cast<size_t>(t.gcid);
      if (s.count[g] >= t.wait_value || !s.tasks[g].empty()) return;
    }
  }
  if (live == 0) return;
  std::ostringstream os;
  os << "deadlock: every running core of the simulated TPU is waiting, and nothing can wake any "
        "of them:";
  for (const auto& tp : threads_) {
    const CoreThread& t = *tp;
    if (t.state == CoreThread::State::WaitingSemaphore) {
      const Semaphore& s = sems_.at(t.wait_sem);
      os << "\n  " << t.name << ": " << t.wait_what << " on " << s.name << " ("
         << semaphore_kind(s.kind) << ") at " << t.wait_loc.to_string() << ": count "
         << s.count[static_cast<size_t>(t.gcid)] << ", waiting for " << t.wait_value;
    } else if (t.state == CoreThread::State::WaitingBarrier) {
      os << "\n  " << t.name << ": at " << t.wait_what << " (" << t.wait_loc.to_string()
         << "), which " << barriers_[t.wait_barrier].arrived << " of "
         << barrier_members(t.wait_barrier) << " " << (t.wait_barrier < 0 ? "cores" : "subcores")
         << " have reached";
    } else if (t.state == CoreThread::State::Done) {
      os << "\n  " << t.name << ": finished";
    }
  }
  int queued = 0;
  for (const auto& [id, s] : sems_)
    for (const auto& q : s.tasks) queued += static_cast<int>(q.size());
  if (queued > 0)
    os << "\n  (" << queued << " DMA step(s) are queued on semaphores nobody waits on)";
  failed_ = true;
  first_error_ = std::make_exception_ptr(tpu::DeadlockError(os.str()));
  first_error_where_.clear();
  cv_.notify_all();
}

void Machine::barrier_all(CoreThread& t, const SourceLoc& loc) {
  barrier(t, -1, loc, "the implicit barrier of all devices (before the first grid step)");
}

void Machine::subcore_barrier(CoreThread& t, const SourceLoc& loc) {
  if (!cfg_.vector_subcore_mesh())
    throw Error("subcore_barrier() is only available in a kernel on a VectorSubcoreMesh", loc);
  barrier(t, t.device * (cfg_.num_cores / cfg_.subcores_per_core) + t.sc_core, loc,
          "subcore_barrier");
}

void Machine::barrier(CoreThread& t, int group, const SourceLoc& loc, const char* what) {
  const int members = barrier_members(group);
  auto in_group = [&](const CoreThread& o) {
    return group < 0 || (o.device == t.device && o.sc_core == t.sc_core);
  };
  std::unique_lock<std::mutex> lk(mu_);
  if (failed_) throw Cancelled{};
  BarrierState& b = barriers_[group];
  int64_t gen = b.generation;
  if (++b.arrived == members) {
    b.arrived = 0;
    ++b.generation;
    // The waiters are released now, before they wake up: a thread that finishes meanwhile must
    // not take them for stuck at the barrier (the deadlock check reads these states).
    for (const auto& tp : threads_)
      if (in_group(*tp) && tp->state == CoreThread::State::WaitingBarrier)
        tp->state = CoreThread::State::Running;
    if (races_) {
      VectorClock all;
      for (const auto& tp : threads_)
        if (in_group(*tp)) merge_into(all, tp->clock);
      for (const auto& tp : threads_) {
        if (!in_group(*tp)) continue;
        tp->clock = all;
        tick(tp->clock, tp->actor);
      }
    }
    log(t, "barrier", std::string(what) + " passed");
    cv_.notify_all();
    return;
  }
  t.state = CoreThread::State::WaitingBarrier;
  t.wait_loc = loc;
  t.wait_what = what;
  t.wait_barrier = group;
  check_deadlock_locked();
  while (gen == b.generation) {
    if (failed_) {
      t.state = CoreThread::State::Running;
      throw Cancelled{};
    }
    cv_.wait(lk);
  }
  t.state = CoreThread::State::Running;
}

// ---- DMAs ----------------------------------------------------------------------------------------
std::string Machine::dma_name(const Dma& d) const {
  return "DMA " + std::to_string(d.id) + " (started by " +
         threads_[static_cast<size_t>(d.send_gcid)]->name + " at " + d.loc.to_string() + ")";
}

void Machine::check_access(Buffer* b, const eval::RefValue& view, bool is_write,
                           const VectorClock& clock, const AccessInfo& who, bool atomic_add) {
  if (!races_) return;
  int n = races_->access(b, b->describe(), b->content.shape(),
                         region_of(view, static_cast<std::byte*>(b->content.raw_data()),
                                   b->content.shape(), nullptr, itemsize(b->content.dtype())),
                         is_write, clock, who, atomic_add);
  if (n && cfg_.params.races_are_errors) throw tpu::RaceError(races_->reports().back().to_string());
}

void Machine::copy_region(const eval::RefValue& src, Buffer* sb, const eval::RefValue& dst,
                          Buffer* db, int actor, const VectorClock* clock,
                          const std::string& actor_name, const std::string& what,
                          const SourceLoc& loc) {
  Array tmp;
  {
    std::lock_guard<std::mutex> lock(sb->mu);
    if (clock) check_access(sb, src, false, *clock, {actor, actor_name, what, loc});
    tmp = eval::read(src);
  }
  std::lock_guard<std::mutex> lock(db->mu);
  if (clock) check_access(db, dst, true, *clock, {actor, actor_name, what, loc});
  eval::write(dst, tmp);
}

void Machine::execute_dma(const std::shared_ptr<Dma>& dma, bool write) {
  std::lock_guard<std::mutex> lock(dma->mu);
  if (dma->state == Dma::State::Started) {
    {
      std::lock_guard<std::mutex> l2(dma->src_buffer->mu);
      if (dma->indirect == 1) {
        gather_rows(*dma);
      } else {
        if (races_)
          check_access(dma->src_buffer, dma->src, false, dma->clock,
                       {dma->actor, dma->actor_name, "DMA read", dma->loc});
        dma->staged = eval::read(dma->src);
      }
    }
    dma->state = Dma::State::Read;
    if (dma->send_sem >= 0) {
      std::lock_guard<std::mutex> l3(mu_);
      Semaphore& s = sem_locked(dma->send_sem, nullptr, DType::DmaSemaphore);
      s.count[static_cast<size_t>(dma->send_gcid)] += dma->nbytes;
      if (races_) merge_into(s.clock[static_cast<size_t>(dma->send_gcid)], dma->clock);
      cv_.notify_all();
    }
    // The send semaphore publishes the read, not the write still to come: the write gets a
    // later clock, so whoever learns of the read through it is not ordered after the write.
    if (races_) tick(dma->clock, dma->actor);
  }
  if (write && dma->state == Dma::State::Read) {
    {
      std::lock_guard<std::mutex> l2(dma->dst_buffer->mu);
      if (dma->indirect == 2) {
        scatter_rows(*dma);
      } else {
        if (races_)
          check_access(dma->dst_buffer, dma->dst, true, dma->clock,
                       {dma->actor, dma->actor_name, dma->add ? "DMA add" : "DMA write", dma->loc},
                       dma->add);
        if (dma->add)
          eval::add_to(dma->dst, static_cast<const std::byte*>(dma->staged.raw_data()));
        else
          eval::write(dma->dst, dma->staged);
      }
    }
    dma->staged = Array();
    dma->state = Dma::State::Done;
    // Done: the buffers may go (a long grid of scoped copies must not keep them all alive).
    dma->src.owner.reset();
    dma->dst.owner.reset();
    dma->src_buffer = dma->dst_buffer = nullptr;
    std::lock_guard<std::mutex> l3(mu_);
    Semaphore& s = sem_locked(dma->recv_sem, nullptr, DType::DmaSemaphore);
    s.count[static_cast<size_t>(dma->recv_gcid)] += dma->nbytes;
    if (races_) merge_into(s.clock[static_cast<size_t>(dma->recv_gcid)], dma->clock);
    cv_.notify_all();
  }
}

// ---- Indirect (SparseCore) DMAs ------------------------------------------------------------------
namespace {
// Row i (of the major dimension) of `r`, as a view of the remaining dimensions.
eval::RefValue row_of(const eval::RefValue& r, int64_t i) {
  eval::RefValue row = r;
  row.data = r.data + i * r.strides[0] * itemsize(r.dtype);
  row.shape.erase(row.shape.begin());
  row.strides.erase(row.strides.begin());
  return row;
}

}  // namespace

void Machine::gather_rows(Dma& dma) {
  Shape shape = dma.src.shape;
  shape[0] = static_cast<int64_t>(dma.rows.size());
  dma.staged = Array::uninitialized(shape, dma.src.dtype);
  const int esize = static_cast<int>(itemsize(dma.src.dtype));
  const int64_t row_bytes = dma.staged.size() / std::max<int64_t>(shape[0], 1) * esize;
  std::byte* out = static_cast<std::byte*>(dma.staged.raw_data());
  for (size_t i = 0; i < dma.rows.size(); ++i) {
    eval::RefValue row = row_of(dma.src, dma.rows[i]);
    if (races_)
      check_access(dma.src_buffer, row, false, dma.clock,
                   {dma.actor, dma.actor_name, "gather DMA read", dma.loc});
    eval::strided_copy(out + static_cast<int64_t>(i) * row_bytes, row.data, row.shape, row.strides, esize);
  }
}

void Machine::scatter_rows(Dma& dma) {
  const int64_t n = static_cast<int64_t>(dma.rows.size());
  const int64_t row_bytes = n ? dma.staged.size() / n * itemsize(dma.staged.dtype()) : 0;
  const std::byte* in = static_cast<const std::byte*>(dma.staged.raw_data());
  for (int64_t i = 0; i < n; ++i) {
    eval::RefValue row = row_of(dma.dst, dma.rows[static_cast<size_t>(i)]);
    if (races_)
      check_access(dma.dst_buffer, row, true, dma.clock,
                   {dma.actor, dma.actor_name, dma.add ? "scatter-add DMA write" : "scatter DMA write",
                    dma.loc},
                   dma.add);
    if (dma.add)
      eval::add_to(row, in + i * row_bytes);
    else
      eval::write(row, Array::wrap(const_cast<std::byte*>(in + i * row_bytes), row.shape, row.dtype, [] {}));
  }
}

void Machine::indirect_dma_start(CoreThread& t, const eval::RefValue& src,
                                 const eval::RefValue& dst, int64_t recv_sem, int indirect,
                                 bool add, std::vector<int64_t> rows, const SourceLoc& loc) {
  const eval::RefValue& data = indirect == 1 ? src : dst;
  const int64_t limit = data.shape.at(0);
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i] < 0 || rows[i] >= limit)
      throw Error(std::string(indirect == 1 ? "gather" : "scatter") + " index " +
                      std::to_string(rows[i]) + " (at position " + std::to_string(i) +
                      " of the indices) is out of bounds for the major dimension of " +
                      buffer_of(data)->describe() + ", of size " + std::to_string(limit),
                  loc);
  auto dma = std::make_shared<Dma>();
  dma->src = src;
  dma->dst = dst;
  dma->src_buffer = buffer_of(src);
  dma->dst_buffer = buffer_of(dst);
  dma->loc = loc;
  dma->indirect = indirect;
  dma->add = add;
  const eval::RefValue& direct = indirect == 1 ? dst : src;
  dma->nbytes = direct.size() * itemsize(direct.dtype);
  dma->rows = std::move(rows);
  dma->recv_sem = recv_sem;
  dma->send_gcid = t.gcid;
  dma->recv_gcid = t.gcid;
  enqueue_dma(t, dma);
}

void Machine::enqueue_dma(CoreThread& t, const std::shared_ptr<Dma>& dma) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_) throw Cancelled{};
    dma->id = next_dma_id_++;
    // Names are for race reports and logs only: building one per DMA costs more than the copy.
    if (races_ || logging("dma")) dma->actor_name = dma_name(*dma);
    if (races_) {
      dma->actor = num_threads_ + static_cast<int>(dma->id);
      dma->clock = t.clock;
      tick(dma->clock, dma->actor);
      tick(t.clock, t.actor);
    }
    sem_locked(dma->recv_sem, nullptr, DType::DmaSemaphore);
    if (dma->send_sem >= 0) sem_locked(dma->send_sem, nullptr, DType::DmaSemaphore);
    dmas_.push_back(dma);
    if (cfg_.params.dma_execution_mode == "on_wait") {
      sems_.at(dma->recv_sem).tasks[static_cast<size_t>(dma->recv_gcid)].emplace_back(dma, true);
      if (dma->send_sem >= 0)
        sems_.at(dma->send_sem).tasks[static_cast<size_t>(dma->send_gcid)].emplace_back(dma, false);
      cv_.notify_all();
    }
  }
  if (logging("dma"))
    log(t, "dma", "dma_start " + dma->actor_name + ": " + std::to_string(dma->nbytes) + " bytes to " +
                    dma->dst_buffer->describe());
  if (cfg_.params.dma_execution_mode == "eager") execute_dma(dma, true);
}

eval::RefValue Machine::counterpart_locked(const eval::RefValue& view, int device, int core,
                                          const std::string& what, const std::string& who,
                                          const SourceLoc& loc) {
  Buffer* local = buffer_of(view);
  auto it = buffers_.find(std::make_tuple(device, core, local->id));
  if (it == buffers_.end())
    throw Error(what + ": " + local->describe() + " has no counterpart there (it is not " +
                    "allocated there now; use an input, output or scratch buffer)",
                loc);
  Buffer* other = it->second.get();
  // Ids agree only while every thread allocates the same buffers in the same order; a
  // conditional allocation breaks that, and the access must not land in a stranger.
  if (other->content.shape() != local->content.shape() ||
      other->content.dtype() != local->content.dtype() || other->space != local->space)
    throw Error(what + ": buffer " + std::to_string(local->id) + " there is " + other->describe() +
                    " " + other->content.shape_dtype().to_string() + ", not the counterpart of " +
                    local->describe() + " " + local->content.shape_dtype().to_string() + " (" + who +
                    " allocated different buffers, e.g. a run_scoped under a condition)",
                loc);
  eval::RefValue r = view;
  r.data = static_cast<std::byte*>(other->content.raw_data()) +
           (view.data - static_cast<std::byte*>(local->content.raw_data()));
  r.owner = it->second;
  return r;
}

eval::RefValue Machine::subcore_counterpart(CoreThread& t, const eval::RefValue& view,
                                            int64_t subcore, const SourceLoc& loc) {
  const std::string what = "fetch_and_add on subcore " + std::to_string(subcore);
  if (subcore < 0 || subcore >= cfg_.subcores_per_core)
    throw Error(what + ": subcore_id out of range; this SparseCore has " +
                    std::to_string(cfg_.subcores_per_core) + " vector subcores",
                loc);
  std::lock_guard<std::mutex> lock(mu_);
  return counterpart_locked(view, t.device, t.sc_core * cfg_.subcores_per_core + static_cast<int>(subcore),
                            what, "the subcores", loc);
}

void Machine::dma_start(CoreThread& t, const eval::RefValue& src, const eval::RefValue& dst,
                        int64_t recv_sem, std::optional<int64_t> send_sem, int target_device,
                        const SourceLoc& loc) {
  auto dma = std::make_shared<Dma>();
  dma->src = src;
  dma->src_buffer = buffer_of(src);
  dma->loc = loc;
  dma->nbytes = src.size() * itemsize(src.dtype);
  dma->recv_sem = recv_sem;
  dma->send_sem = send_sem.value_or(-1);
  dma->send_gcid = t.gcid;
  Buffer* local_dst = buffer_of(dst);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_) throw Cancelled{};
    if (target_device != t.device) {
      dma->dst = counterpart_locked(dst, target_device, local_dst->core,
                                    "remote DMA to device " + std::to_string(target_device),
                                    "the devices", loc);
      dma->dst_buffer = buffer_of(dma->dst);
    } else {
      dma->dst = dst;
      dma->dst_buffer = local_dst;
    }
    dma->recv_gcid = target_device * cfg_.num_cores + t.core;
  }
  enqueue_dma(t, dma);
}

// ---- Grid execution -------------------------------------------------------------------------------
void Machine::run_core(CoreThread& t, const std::vector<int64_t>& grid) {
  const GridMapping& gm = call_.grid_mapping;
  const int num_index = gm.num_index_operands;
  const int nblocks = gm.num_inputs + gm.num_outputs;
  CoreRunner runner(call_.kernel, *this, t);
  if (num_devices() > 1 && !cfg_.collective_id) barrier_all(t, call_loc_);

  // This core's share of the iterations.
  int64_t total = 1;
  for (int64_t g : grid) total *= g;
  int64_t parallel = 1;
  size_t nparallel = 0;
  for (size_t d = 0; d < cfg_.dimension_semantics.size() && d < grid.size(); ++d)
    if (cfg_.dimension_semantics[d] == "parallel") {
      parallel *= grid[d];
      ++nparallel;
    }
  int64_t begin = 0, end = total;
  if (nparallel == 0) {
    if (t.core != 0) end = 0;
  } else if (parallel > 0) {
    int64_t per_core_points = (parallel + cfg_.num_cores - 1) / cfg_.num_cores;
    int64_t iters_per_core = per_core_points * (total / parallel);
    begin = std::min(total, t.core * iters_per_core);
    end = std::min(total, (t.core + 1) * iters_per_core);
  }

  std::vector<core::IndexMapEvaluator> index_maps;
  for (const BlockMapping& bm : gm.block_mappings) index_maps.emplace_back(bm.index_map);
  std::vector<eval::RtValue> prefetch(t.params.begin(), t.params.begin() + num_index);

  auto point_of = [&](int64_t linear, std::vector<int64_t>& loop_idx, GridPoint& p) {
    loop_idx.assign(grid.size(), 0);
    for (int d = static_cast<int>(grid.size()) - 1; d >= 0; --d) {
      loop_idx[d] = linear % grid[d];
      linear /= grid[d];
    }
    p.num_programs = grid;
    p.program_ids.resize(grid.size());
    for (size_t d = 0; d < grid.size(); ++d) p.program_ids[d] = perm_[d][loop_idx[d]];
  };
  // out_of_bounds_reads = "uninitialized": an input block partly outside the (padded) input is
  // copied in clipped, the rest holding the uninitialized value, as for kernel reads (a block
  // entirely outside is still an error). Output blocks must always be inside.
  const bool fill_oob_inputs = cfg_.params.out_of_bounds_reads == "uninitialized";
  auto block_inside = [&](int j, const std::vector<int64_t>& start) {
    const BlockMapping& bm = gm.block_mappings[j];
    for (size_t d = 0; d < start.size(); ++d)
      if (start[d] < 0 || start[d] + core::block_extent(bm, d) > padded_[j][d]) return false;
    return true;
  };
  // Block starts of every operand at a grid point (checked against the padded array).
  std::vector<int64_t> indices, size;
  auto starts_at = [&](const GridPoint& p, std::vector<std::vector<int64_t>>& starts) {
    starts.resize(static_cast<size_t>(nblocks));
    for (int j = 0; j < nblocks; ++j) {
      const BlockMapping& bm = gm.block_mappings[j];
      index_maps[j].eval(p, prefetch, indices);
      core::block_region(bm, indices, starts[j], size);
      for (size_t d = 0; d < size.size(); ++d) {
        if (starts[j][d] >= 0 && starts[j][d] + size[d] <= padded_[j][d]) continue;
        bool is_input = j < gm.num_inputs;
        if (is_input && fill_oob_inputs && starts[j][d] < padded_[j][d] &&
            starts[j][d] + size[d] > 0)
          continue;  // partly outside: filled in copy_in_partial
        throw core::out_of_bounds_block_error(
            bm, is_input, indices, p.program_ids,
            " on device " + std::to_string(t.device) + " (core " + std::to_string(t.core) + ")",
            starts[j], size, low_[j]);
      }
    }
  };
  // The HBM side of operand j's block at `start`, and the kernel buffer side.
  auto block_views = [&](int j, const std::vector<int64_t>& start, eval::RefValue& hbm,
                         eval::RefValue& kernel_side) {
    const BlockMapping& bm = gm.block_mappings[j];
    std::vector<int64_t> sz(bm.block_shape.size());
    std::vector<bool> drop(bm.block_shape.size());
    for (size_t d = 0; d < bm.block_shape.size(); ++d) {
      sz[d] = core::block_extent(bm, d);
      drop[d] = bm.block_shape[d].is_squeezed();
    }
    hbm = sub_ref(whole_ref(devices_[t.device].operands[j]), start, sz, drop);
    kernel_side = std::get<eval::RefValue>(t.params[num_index + j]);
    kernel_side.shape = hbm.shape;  // BoundedSlice blocks fill the leading part
  };

  // Copy-in of an input block partly outside the input: the uninitialized value, then the part
  // inside over it.
  auto copy_in_partial = [&](int j, const std::vector<int64_t>& start, const std::string& what) {
    const BlockMapping& bm = gm.block_mappings[j];
    const size_t rank = bm.block_shape.size();
    std::vector<int64_t> lo(rank), sz(rank), kstart, ksize, kshape;
    std::vector<bool> drop(rank);
    for (size_t d = 0; d < rank; ++d) {
      int64_t n = core::block_extent(bm, d);
      lo[d] = std::max<int64_t>(start[d], 0);
      sz[d] = std::min(start[d] + n, padded_[j][d]) - lo[d];
      drop[d] = bm.block_shape[d].is_squeezed();
      if (drop[d]) continue;
      kstart.push_back(lo[d] - start[d]);
      ksize.push_back(sz[d]);
      kshape.push_back(n);
    }
    Buffer* kb = t.block_buffers[j];
    eval::RefValue ks = std::get<eval::RefValue>(t.params[num_index + j]);
    ks.shape = kshape;
    Array uninit = Array::uninitialized(kshape, ks.dtype);
    fill(uninit, cfg_.params);
    {
      std::lock_guard<std::mutex> lock(kb->mu);
      check_access(kb, ks, true, t.clock, {t.actor, t.name, what, call_loc_});
      eval::write(ks, uninit);
    }
    eval::RefValue hbm = sub_ref(whole_ref(devices_[t.device].operands[j]), lo, sz, drop);
    eval::RefValue part = sub_ref(ks, kstart, ksize, {});
    copy_region(hbm, buffer_of(hbm), part, kb, t.actor, races_ ? &t.clock : nullptr, t.name,
                what, call_loc_);
  };

  // Revisit check: per output, where each block was visited.
  struct Visit {
    std::vector<int64_t> first, last;
  };
  std::vector<std::map<std::vector<int64_t>, Visit>> visits(static_cast<size_t>(gm.num_outputs));
  std::set<int> aliased;
  for (auto [i, o] : call_.input_output_aliases) aliased.insert(o);

  GridPoint point, next_point;
  std::vector<int64_t> loop_idx, next_loop_idx;
  std::vector<std::vector<int64_t>> cur_starts, next_starts, prev_starts;
  if (begin < end) {
    point_of(begin, loop_idx, point);
    starts_at(point, cur_starts);
  }
  for (int64_t it = begin; it < end; ++it) {
    check_failed();  // another core failed: stop at the next grid step
    if (cfg_.params.grid_point_recorder) {
      std::lock_guard<std::mutex> lock(recorder_mu_);
      cfg_.params.grid_point_recorder(point.program_ids, t.core);
    }
    bool last = it + 1 == end;
    if (!last) {
      point_of(it + 1, next_loop_idx, next_point);
      starts_at(next_point, next_starts);
    }
    // Copy in the inputs whose block changed.
    for (int j = 0; j < gm.num_inputs; ++j) {
      if (!t.block_buffers[j]) continue;
      if (it != begin && prev_starts[j] == cur_starts[j]) continue;
      std::string what = "copy-in of input " + gm.block_mappings[j].origin;
      if (fill_oob_inputs && !block_inside(j, cur_starts[j])) {
        copy_in_partial(j, cur_starts[j], what);
        continue;
      }
      eval::RefValue hbm, ks;
      block_views(j, cur_starts[j], hbm, ks);
      copy_region(hbm, buffer_of(hbm), ks, t.block_buffers[j], t.actor, races_ ? &t.clock : nullptr,
                  t.name, what, call_loc_);
    }
    runner.run(t.params, point);
    // Copy out the outputs whose block changes next (or at the end).
    for (int o = 0; o < gm.num_outputs; ++o) {
      int j = gm.num_inputs + o;
      if (!t.block_buffers[j]) continue;
      if (!last && next_starts[j] == cur_starts[j]) continue;
      eval::RefValue hbm, ks;
      block_views(j, cur_starts[j], hbm, ks);
      std::string what = "copy-out of output " + gm.block_mappings[j].origin;
      copy_region(ks, t.block_buffers[j], hbm, buffer_of(hbm), t.actor,
                  races_ ? &t.clock : nullptr, t.name, what, call_loc_);
    }
    // Revisiting check (the accumulator pattern revisits consecutively, which is fine).
    for (int o = 0; o < gm.num_outputs; ++o) {
      int j = gm.num_inputs + o;
      if (!t.block_buffers[j] || aliased.count(o)) continue;
      auto& seen = visits[o];
      auto v = seen.find(cur_starts[j]);
      if (v == seen.end()) {
        seen[cur_starts[j]] = Visit{loop_idx, loop_idx};
      } else if (it != begin && prev_starts[j] == cur_starts[j]) {
        v->second.last = loop_idx;
      } else {
        const BlockMapping& bm = gm.block_mappings[j];
        std::vector<int64_t> sz;
        for (size_t d = 0; d < bm.block_shape.size(); ++d) sz.push_back(core::block_extent(bm, d));
        throw Error("Revisited block [" + core::block_range_string(cur_starts[j], sz, low_[j]) +
                        "] of output " + std::to_string(o) + " in iteration " +
                        tuple_string(loop_idx) + ". The block was previously visited in " +
                        "iterations " + tuple_string(v->second.first) + " through " +
                        tuple_string(v->second.last) + ".",
                    bm.index_map.loc);
      }
    }
    prev_starts = cur_starts;
    if (!last) {
      std::swap(cur_starts, next_starts);
      std::swap(point, next_point);
      std::swap(loop_idx, next_loop_idx);
    }
  }
}

std::vector<std::vector<Array>> Machine::run(const std::vector<std::vector<Array>>& args,
                                             const std::vector<int64_t>& grid) {
  const GridMapping& gm = call_.grid_mapping;
  const int num_index = gm.num_index_operands;
  const int nblocks = gm.num_inputs + gm.num_outputs;
  const int ndev = num_devices();
  const tpu::InterpretParams& p = cfg_.params;
  for (int64_t g : grid)
    if (g < 0) throw InternalError("negative grid dim");

  // Parallel dims are permuted (a seeded shuffle); a core_map runs in order.
  perm_.assign(grid.size(), {});
  uint64_t state = p.random_seed.value_or(0);
  for (size_t d = 0; d < grid.size(); ++d) {
    perm_[d].resize(static_cast<size_t>(grid[d]));
    for (int64_t i = 0; i < grid[d]; ++i) perm_[d][i] = i;
    bool par = d < cfg_.dimension_semantics.size() && cfg_.dimension_semantics[d] == "parallel";
    if (!par || cfg_.core_map) continue;
    for (int64_t i = grid[d] - 1; i > 0; --i)
      std::swap(perm_[d][i], perm_[d][splitmix64(state) % static_cast<uint64_t>(i + 1)]);
  }

  // HBM operand buffers, per device (inputs padded to whole blocks).
  padded_.assign(static_cast<size_t>(nblocks), {});
  low_.assign(static_cast<size_t>(nblocks), {});
  for (int j = 0; j < nblocks; ++j) core::padded_layout(gm.block_mappings[j], padded_[j], low_[j]);
  std::map<int, int> alias_of_output;
  for (auto [i, o] : call_.input_output_aliases) alias_of_output[o] = i - num_index;
  devices_.assign(static_cast<size_t>(ndev), {});
  threads_.clear();
  for (int d = 0; d < ndev; ++d) {
    for (int c = 0; c < cfg_.num_cores; ++c) {
      auto t = std::make_unique<CoreThread>();
      t->device = d;
      t->core = c;
      t->gcid = d * cfg_.num_cores + c;
      t->actor = t->gcid;
      t->sc_core = c / cfg_.subcores_per_core;
      t->subcore = c % cfg_.subcores_per_core;
      t->name = "device " + std::to_string(d) + ", core " + std::to_string(t->sc_core);
      if (cfg_.vector_subcore_mesh()) t->name += ", subcore " + std::to_string(t->subcore);
      if (races_) tick(t->clock, t->actor);
      threads_.push_back(std::move(t));
    }
  }
  for (int d = 0; d < ndev; ++d) {
    DeviceState& ds = devices_[d];
    CoreThread& t0 = *threads_[static_cast<size_t>(d * cfg_.num_cores)];
    for (int j = 0; j < nblocks; ++j) {
      const BlockMapping& bm = gm.block_mappings[j];
      auto alias = alias_of_output.find(j - gm.num_inputs);
      if (j >= gm.num_inputs && alias != alias_of_output.end()) {
        ds.operands.push_back(ds.operands[alias->second]);
        continue;
      }
      ir::Type t = ir::Type::ref(padded_[j], bm.array.dtype, MemorySpace::Hbm);
      std::string name = (j < gm.num_inputs ? "input " : "output ") + bm.origin;
      eval::RefValue r = allocate(t0, t, name, true);
      std::shared_ptr<Buffer> b = std::static_pointer_cast<Buffer>(r.owner);
      if (j < gm.num_inputs) {
        const Array& src = args[d][num_index + j];
        eval::RefValue logical = sub_ref(r, low_[j], src.shape(), {});
        eval::write(logical, src);
      }
      ds.operands.push_back(b);
    }
  }
  // Each core's kernel Refs, allocated in the same order on every core (so ids agree).
  for (auto& tp : threads_) tp->next_buffer_id = threads_.front()->next_buffer_id;
  for (auto& tp : threads_) {
    CoreThread& t = *tp;
    DeviceState& ds = devices_[t.device];
    for (int i = 0; i < num_index; ++i) {
      const Array& a = args[t.device][i];
      eval::RefValue r = allocate(t, ir::Type::ref(a.shape(), a.dtype(), MemorySpace::Smem),
                                  "scalar prefetch " + std::to_string(i), false);
      eval::write(r, a);
      t.params.push_back(r);
    }
    for (int j = 0; j < nblocks; ++j) {
      const BlockMapping& bm = gm.block_mappings[j];
      MemorySpace space = bm.block_ref_type.space;
      if (space == MemorySpace::Any || space == MemorySpace::Hbm) {
        if (bm.block_ref_type.shape != bm.array.shape)
          throw Error(std::string("Kernel ") + (j < gm.num_inputs ? "input " : "output ") +
                          std::to_string(j < gm.num_inputs ? j : j - gm.num_inputs) +
                          " in HBM but does not have trivial BlockSpec.",
                      bm.index_map.loc);
        // The kernel sees the whole array (with the tile padding, in "padded" mode: a DMA may
        // read it, as on a TPU).
        Shape seen = bm.array.shape;
        const Shape& stored = ds.operands[j]->content.shape();
        if (cfg_.params.buffer_bounds == "padded")
          for (size_t d = 0; d < seen.size(); ++d) seen[d] = stored[d] - low_[j][d];
        eval::RefValue r = sub_ref(whole_ref(ds.operands[j]), low_[j], seen, {});
        r.space = space;
        t.params.push_back(r);
        t.block_buffers.push_back(nullptr);
        continue;
      }
      std::string name = "block of " + std::string(j < gm.num_inputs ? "input " : "output ") + bm.origin;
      eval::RefValue r = allocate(t, bm.block_ref_type, name, false);
      t.block_buffers.push_back(buffer_of(r));
      t.params.push_back(r);
    }
    for (size_t s = 0; s < gm.scratch_types.size(); ++s) {
      const ir::Type& st = gm.scratch_types[s];
      bool shared = st.space == MemorySpace::VmemShared || st.space == MemorySpace::Hbm ||
                    st.space == MemorySpace::Any;
      t.params.push_back(allocate(t, st, "scratch " + std::to_string(s), shared));
    }
  }

  // Run every core: the calling thread runs the last one.
  if (races_ && p.races) p.races->clear();
  auto body = [&](CoreThread& t) {
    try {
      run_core(t, grid);
    } catch (const Cancelled&) {
    } catch (...) {
      fail(std::current_exception(), t.name);
    }
    std::lock_guard<std::mutex> lock(mu_);
    t.state = CoreThread::State::Done;
    check_deadlock_locked();
  };
  std::vector<std::thread> workers;
  try {
    for (size_t i = 0; i + 1 < threads_.size(); ++i)
      workers.emplace_back(body, std::ref(*threads_[i]));
  } catch (const std::system_error& e) {
    // Too many threads for this host: stop the cores already started, then report.
    fail(std::make_exception_ptr(Error(std::string("cannot start a thread for every simulated "
                                                   "core (") + e.what() + "); use fewer devices "
                                                   "or cores")),
         "");
    for (size_t i = workers.size(); i < threads_.size(); ++i) {
      std::lock_guard<std::mutex> lock(mu_);
      threads_[i]->state = CoreThread::State::Done;
    }
    for (std::thread& w : workers) w.join();
    std::rethrow_exception(first_error_);
  }
  body(*threads_.back());
  for (std::thread& w : workers) w.join();

  // Races, then failures, then the exit checks.
  if (races_) {
    std::vector<tpu::RaceReport> reps = races_->reports();
    if (p.races)
      p.races->insert(p.races->end(), reps.begin(), reps.end());
    else
      for (const tpu::RaceReport& r : reps) std::cerr << r.to_string();
  }
  if (failed_) {
    if (num_threads_ == 1 || first_error_where_.empty()) std::rethrow_exception(first_error_);
    try {
      std::rethrow_exception(first_error_);
    } catch (const tpu::RaceError&) {
      throw;
    } catch (const NotSupportedError&) {
      throw;
    } catch (const Error& e) {
      throw Error("on " + first_error_where_ + ": " + e.what());
    }
  }
  check_exit_state();

  std::vector<std::vector<Array>> out(static_cast<size_t>(ndev));
  for (int d = 0; d < ndev; ++d) {
    for (int o = 0; o < gm.num_outputs; ++o) {
      int j = gm.num_inputs + o;
      const BlockMapping& bm = gm.block_mappings[j];
      Array result = eval::read(sub_ref(whole_ref(devices_[d].operands[j]), low_[j], bm.array.shape, {}));
      auto alias = alias_of_output.find(o);
      if (alias != alias_of_output.end()) {
        // In place, as the reference interpreter: the caller's input holds the result.
        Array caller = args[d][num_index + alias->second];
        eval::RefValue whole = eval::RefValue::of_array(caller);
        eval::write(whole, result);
        out[d].push_back(caller);
      } else {
        out[d].push_back(result);
      }
    }
  }
  return out;
}

void Machine::check_exit_state() {
  std::ostringstream os;
  int problems = 0;
  for (const auto& dma : dmas_) {
    if (dma->state == Dma::State::Done) continue;
    ++problems;
    os << "\n  " << dma_name(*dma) << " never completed: nothing waited on its receive semaphore"
       << (cfg_.params.dma_execution_mode == "on_wait"
               ? " (in on_wait mode a DMA runs when its semaphore is waited on)"
               : "");
  }
  std::vector<std::pair<int64_t, const Semaphore*>> sorted;
  for (const auto& [id, s] : sems_) sorted.emplace_back(id, &s);
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [id, s] : sorted) {
    for (size_t g = 0; g < s->count.size(); ++g) {
      if (s->count[g] == 0) continue;
      ++problems;
      os << "\n  " << s->name << " (" << semaphore_kind(s->kind) << ") has count " << s->count[g]
         << " on " << threads_[g]->name;
    }
  }
  if (problems == 0) return;
  std::string msg = "the kernel ended with unfinished synchronisation (every signal must be "
                    "waited for, every DMA waited on):" + os.str();
  if (cfg_.params.nonzero_semaphores_at_exit == "warn") {
    std::cerr << "warning: " << msg << "\n";
    return;
  }
  throw Error(msg, call_loc_);
}

}  // namespace pallas::tpu_interpret
