// gpu::kernel in the interpreter (.interpret = true): the semantics of Mosaic GPU's primitives
// on the CPU.
//
// The mesh is (grid..., cluster..., thread). Clusters run one after another, each a wave — but a
// kernel with semaphores of the whole grid (pl::get_global) runs its whole grid as one wave, since
// a wait on one may need any other CTA to go on. Inside a wave, every Pallas thread of every CTA is an OS thread,
// but they cooperate: exactly one runs at a time, and it hands over only when it must wait (a
// barrier_wait whose phase has not completed, a semaphore_wait for a count not yet reached) or
// when it ends. Handing over goes round-robin to the next thread that can go on, so a run is
// deterministic. When no thread can go on, the kernel would hang on a GPU: that is a
// pallas::Error listing what every thread waits for.
//
// Memory: operands are whole arrays in GMEM, shared by all threads; each CTA gets fresh scratch
// (SMEM and ACC arrays hold the uninitialized value; barriers start at phase 0) shared by its
// threads; gpu::Semaphore counters start at 0, one set per CTA (scratch_shapes, run_scoped) or
// one for the grid (pl::get_global). Copies and
// wgmma complete when issued (one valid timing of the asynchronous GPU operations; their wait ops
// have nothing left to wait for). Barriers follow the mbarrier rules
// that JAX's GPU interpret mode checks: a phase completes after num_arrivals arrivals; each
// thread's k-th wait on a barrier waits for the barrier's k-th phase; completing a phase again
// before any thread waited for the previous one, or waiting for a phase the barrier has already
// passed, is an error (on the GPU the phase is one parity bit, so either loses a phase).
//
// Races: copies and wgmma complete eagerly here, but on a GPU they run asynchronously until their
// barrier phase, wait_smem_to_gmem or wgmma_wait; the interpreter checks that the kernel does not
// depend on that timing. Every access (loads and stores of the threads; the reads and writes of
// each copy and wgmma, each its own actor, as the TPU machine does with DMAs) is checked for
// happens-before with vector clocks (tpu_interpret/races.h): a thread's arrival releases its
// clock into the barrier's phase, a wait for that phase acquires it; a copy to SMEM releases
// into its barrier; the waits for copies to GMEM and for wgmma acquire those operations' clocks;
// wgmmas of one thread are ordered among themselves (they chain on the accumulator). Two
// conflicting accesses not ordered that way are a pallas::Error naming both lines. A semaphore
// signal releases the thread's clock into the semaphore, a wait (or read) acquires every clock
// released into it so far (a join that may order more than the counts prove: it can miss a race,
// never report a false one). Races are checked with vector clocks within a wave. Waves run one
// after another here, but on a GPU clusters run at once and in any order, and without semaphores
// nothing orders one cluster's accesses against another's: so two accesses to an element of an
// operand from different waves, one of them a plain write, are a race too (CrossWaveAccesses).
//
// A gpu::ClusterBarrier is one BarrierState per CTA; an arrival goes to each peer CTA's (its
// `peers`), releasing the arriving thread's clock into every one of them.
#include <algorithm>
#include <condition_variable>
#include <deque>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "core/call.h"
#include "pallas/gpu.h"
#include "ir/analysis.h"
#include "tpu_interpret/races.h"

namespace pallas::interpret {
namespace {

using ir::AttrKey;
using ir::OpCode;
using tpu_interpret::VectorClock;

// Thrown in a waiting thread when another thread has failed: unwinds it quietly.
struct Aborted {};

struct BarrierState {
  int num_arrivals = 1;
  int arrivals = 0;           // in the current phase
  int64_t phase = 0;          // completed phases
  bool observed = true;       // some thread has waited for the latest completed phase
  // A copy to SMEM arrived in the current phase / in the latest completed one (where it was
  // issued): the CTA must not end before a thread waits for that phase (the copy may still be
  // landing on a GPU).
  std::optional<SourceLoc> copy_in_phase, copy_in_completed;
  std::string name;           // "scratch[2][1] of CTA (0, 1)"
  // A gpu::ClusterBarrier: this barrier in each CTA an arrival reaches (this one's included);
  // empty for a barrier of one CTA.
  std::vector<const std::byte*> peers;
  std::map<int, int64_t> next_phase;  // per thread of the wave: the phase its next wait awaits
  VectorClock arrived;                 // races: what the current phase's arrivals released
  std::map<int64_t, VectorClock> released;  // races: what each completed phase released
};

// Where a copy to SMEM completing on `b` was issued when no thread has waited for that phase (the
// current one, or the latest completed one nobody observed), and the phase: memory and barrier
// must outlive the copy, so the CTA (or the barrier's scope) must not end before a wait.
std::optional<std::pair<SourceLoc, int64_t>> unwaited_copy(const BarrierState& b) {
  if (b.copy_in_phase) return std::pair{*b.copy_in_phase, b.phase + 1};
  if (!b.observed && b.copy_in_completed) return std::pair{*b.copy_in_completed, b.phase};
  return std::nullopt;
}

// The threads of one wave, taking turns.
class Turns {
 public:
  explicit Turns(std::vector<std::string> names) : names_(std::move(names)), threads_(names_.size()) {}

  // Runs thread i's `body` when its turn comes; called on thread i.
  void run(int i, const std::function<void()>& body) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return current_ == i || aborted_; });
      if (aborted_) return;
    }
    try {
      body();
      std::lock_guard<std::mutex> lock(mu_);
      threads_[i].state = State::Done;
      if (!hand_over(i) && !all_done()) {
        // The others all wait for what nobody left can do.
        error_ = std::make_exception_ptr(Error(deadlock_message()));
        aborted_ = true;
        cv_.notify_all();
      }
    } catch (const Aborted&) {
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
      aborted_ = true;
      cv_.notify_all();
    }
  }

  // Called on thread i (during its turn): returns once `ready()` holds, letting the others run
  // meanwhile. `what` describes the wait for a deadlock report (called then, so that it tells the
  // state the threads are stuck in, not the one they began waiting in).
  void wait_until(int i, const std::function<bool()>& ready, const std::function<std::string()>& what) {
    std::unique_lock<std::mutex> lock(mu_);
    if (ready()) return;
    threads_[i].state = State::Waiting;
    threads_[i].ready = ready;
    threads_[i].what = what;
    if (!hand_over(i)) {
      aborted_ = true;
      cv_.notify_all();
      throw Error(deadlock_message());
    }
    cv_.wait(lock, [&] { return current_ == i || aborted_; });
    if (aborted_) throw Aborted{};
    threads_[i].state = State::Ready;
    threads_[i].ready = nullptr;
  }

  void rethrow_error() {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  enum class State { Ready, Waiting, Done };
  struct Thread {
    State state = State::Ready;
    std::function<bool()> ready;
    std::function<std::string()> what;
  };
  // Gives the turn to the next thread after i that can go on; false when none can (mu_ held).
  bool hand_over(int i) {
    const int n = static_cast<int>(threads_.size());
    for (int k = 1; k < n; ++k) {
      const int j = (i + k) % n;
      Thread& t = threads_[j];
      if (t.state == State::Ready || (t.state == State::Waiting && t.ready())) {
        current_ = j;
        cv_.notify_all();
        return true;
      }
    }
    return false;
  }
  bool all_done() const {
    for (const Thread& t : threads_)
      if (t.state != State::Done) return false;
    return true;
  }
  std::string deadlock_message() const {
    std::string msg = "gpu::kernel deadlock: no thread can go on (on a GPU the kernel would hang):";
    for (size_t t = 0; t < threads_.size(); ++t)
      msg += "\n  " + names_[t] + ": " +
             (threads_[t].state == State::Done ? std::string("finished") : threads_[t].what());
    return msg;
  }

  std::vector<std::string> names_;
  std::vector<Thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  int current_ = 0;
  bool aborted_ = false;
  std::exception_ptr error_;
};

// Races between waves (clusters of a kernel without semaphores): per element of each operand,
// the access (and so the wave) of its last plain write, of a plain read and of an atomic update
// (atomic_rmw, a reducing copy; kSeveral: by more than one wave, so a conflicting access of any
// wave conflicts with one of them) — 12 bytes an element. Atomic updates never race with each
// other, only with plain reads and writes. The waves run one at a time and a wave's threads take
// turns, so no lock.
class CrossWaveAccesses {
 public:
  void add_operand(const std::byte* base, int64_t elements, int64_t item, Shape shape, std::string name) {
    Operand& o = operands_[base];
    if (!o.elems.empty()) return;  // an aliased input and output: one operand
    o.elems.assign(static_cast<size_t>(elements), Elem{});
    o.item = item;
    o.shape = std::move(shape);
    o.name = std::move(name);
  }
  // The accesses of `view` (inside the operand at `base`) by wave `wave`; a conflict with another
  // wave's is a pallas::Error at `loc`.
  void access(const std::byte* base, const eval::RefValue& view, bool is_write, bool atomic, int32_t wave,
              const tpu_interpret::AccessInfo& who, const SourceLoc& loc) {
    auto it = operands_.find(base);
    if (it == operands_.end() || view.size() == 0) return;
    Operand& o = it->second;
    int32_t site = kNone;  // recorded on the first element that needs it
    auto site_of = [&] {
      if (site == kNone) {
        site = static_cast<int32_t>(sites_.size());
        sites_.push_back({who, wave});
      }
      return site;
    };
    auto other_wave = [&](int32_t s) { return s >= 0 && sites_[static_cast<size_t>(s)].wave != wave; };
    const size_t rank = view.shape.size();
    std::vector<int64_t> at(rank, 0);
    // (Through a bitcast view the elements are the view's: each touches the operand's elements
    // its bytes overlap.)
    const int64_t view_item = itemsize(view.dtype);
    while (true) {
      int64_t off = view.data - base;
      for (size_t d = 0; d < rank; ++d) off += at[d] * view.strides[d] * view_item;
      for (int64_t i = off / o.item; i <= (off + view_item - 1) / o.item; ++i) {
        Elem& e = o.elems[static_cast<size_t>(i)];
        if (other_wave(e.write)) report(o, i, e.write, true, who, is_write, loc);
        if ((is_write || atomic) && e.read != kNone && (e.read == kSeveral || other_wave(e.read)))
          report(o, i, e.read == kSeveral ? kSeveral : e.read, false, who, is_write, loc);
        if (!atomic && e.atomic != kNone && (e.atomic == kSeveral || other_wave(e.atomic)))
          report(o, i, e.atomic, true, who, is_write, loc);
        if (atomic)
          e.atomic = e.atomic == kNone || (e.atomic != kSeveral && !other_wave(e.atomic)) ? site_of() : kSeveral;
        else if (is_write)
          e.write = site_of();
        else if (e.read == kNone)
          e.read = site_of();
        else if (e.read != kSeveral && other_wave(e.read))
          e.read = kSeveral;
      }
      size_t d = rank;
      while (d > 0 && ++at[d - 1] == view.shape[d - 1]) at[--d] = 0;
      if (d == 0) break;
    }
  }

 private:
  static constexpr int32_t kNone = -1, kSeveral = -2;
  struct Elem {
    int32_t write = kNone, read = kNone, atomic = kNone;  // sites_ indices
  };
  struct Operand {
    std::vector<Elem> elems;
    int64_t item = 1;
    Shape shape;
    std::string name;
  };
  struct Site {
    tpu_interpret::AccessInfo who;
    int32_t wave;
  };
  [[noreturn]] void report(const Operand& o, int64_t element, int32_t first, bool first_wrote,
                           const tpu_interpret::AccessInfo& second, bool second_writes, const SourceLoc& loc) const {
    std::vector<int64_t> index;
    core::unravel_row_major(element, o.shape, index);
    std::ostringstream os;
    os << "gpu::kernel data race between clusters (on a GPU clusters run at once and in any order; only "
          "semaphores of the grid, pl::get_global, order them): RACE DETECTED on "
       << o.name << " " << shape_to_string(o.shape) << ", element " << shape_to_string(index) << "\n";
    if (first == kSeveral)
      os << "  " << (first_wrote ? "updated atomically" : "read") << " by CTAs of several clusters\n";
    else
      os << "  " << (first_wrote ? "write" : "read") << " by " << sites_[static_cast<size_t>(first)].who.actor_name
         << " (" << sites_[static_cast<size_t>(first)].who.what << ") at "
         << sites_[static_cast<size_t>(first)].who.loc.to_string() << "\n";
    os << "  " << (second_writes ? "write" : "read") << " by " << second.actor_name << " (" << second.what << ") at "
       << second.loc.to_string() << "\n";
    throw Error(os.str(), loc);
  }
  std::map<const std::byte*, Operand> operands_;
  std::vector<Site> sites_;
};

// The memory a wave's accesses may touch (operands, its CTAs' scratch), for race reports.
struct Buffer {
  const std::byte* base = nullptr;
  int64_t bytes = 0;
  Shape shape;
  std::string name;  // "input 0", "scratch[1] of CTA (0,)"
  // A gpu::Union's memory: its members' arrays overlap with different shapes and dtypes, so
  // accesses are checked as the bytes they touch (shape is {bytes}).
  bool by_bytes = false;
};

// A multicast copy (copy_gmem_to_smem with collective_axes) on its way into one receiving CTA:
// which peers' shares have landed there, and what the first one copied (every peer must copy the
// same source). Keyed by the receiving barrier and destination; gone once all shares landed and it
// arrived.
struct MulticastLanding {
  std::vector<bool> landed;  // by peer rank
  int count = 0;
  eval::RefValue src;         // the first share's whole source
  std::string first_issuer;   // "CTA (0, 1)"
  SourceLoc first_loc;        // where it issued
  VectorClock released;       // the shares' copies, released by the one arrival
};

// A gpu::Semaphore's counter (an i32 in the semaphore's array): what its signals released.
struct SemaphoreState {
  std::string name;      // "scratch[3][1]"
  VectorClock released;  // races: every signal's clock, joined (a wait acquires them all)
};

// A run_scoped collective over the thread axis: its buffers, shared by the CTA's threads from
// the first one's entry to the last one's exit, and the two meetings (no thread goes into the
// scope before all have entered, nor on past it before all have left).
struct SharedScope {
  std::vector<Array> buffers;
  int64_t entered = 0, left = 0;
  VectorClock entry, exit;  // races: what the threads released entering / leaving
  bool ended = false;       // every thread has left and one has let the buffers go
  int64_t smem_bytes = 0;   // of its buffers in shared memory
};

// The CTAs that run together — one cluster, or the whole grid when the kernel has semaphores —
// and what their threads share.
struct Wave {
  std::map<const std::byte*, BarrierState> barriers;  // by the barrier's address
  std::map<const std::byte*, SemaphoreState> semaphores;  // by the counter's address
  // Registers the counters of the semaphore array `a` of `shape`: counter [i, j] is named
  // prefix + "[i, j]" + suffix ("scratch[1][2] of CTA (3,)"; a single counter prefix + suffix).
  void add_semaphores(const Array& a, const Shape& shape, const std::string& prefix, const std::string& suffix) {
    std::vector<int64_t> at;
    for (int64_t k = 0; k < a.size(); ++k) {
      core::unravel_row_major(k, shape, at);
      semaphores[static_cast<const std::byte*>(a.raw_data()) + 4 * k].name =
          prefix + (shape.empty() ? std::string() : shape_to_string(at)) + suffix;
    }
  }
  Turns* turns = nullptr;
  std::map<const std::byte*, Buffer> buffers;  // by base address
  tpu_interpret::RaceDetector races;
  int next_actor = 0;  // threads are actors 0 .. n-1; each copy and wgmma gets the next one
  int32_t index = 0;                          // of the wave in the run
  CrossWaveAccesses* cross_wave = nullptr;    // when the run has several waves
  // Each thread's last gpu::set_max_registers (registers per thread, where), by thread index.
  std::map<int, std::pair<int64_t, SourceLoc>> register_requests;
  // What a multicast copy needs to find its peers and their memory. The wave's CTAs are its
  // clusters' in turn, each cluster's in row-major order (CTA c is at cluster_positions[c % n]
  // of its cluster, n of them), each CTA's threads threads_per_cta consecutive ones; per CTA its
  // name and its scratch arrays.
  int64_t threads_per_cta = 1;
  // Shared memory: what the scratch takes per CTA, the bytes of the shared run_scoped buffers
  // alive in each CTA of the wave, and of each thread's own scoped buffers alive (compiled, every
  // Pallas thread of a CTA reserves what its own scopes need: that times the CTA's threads).
  int64_t scratch_smem_bytes = 0;
  std::map<int64_t, int64_t> shared_scope_smem_bytes;  // by CTA of the wave
  std::map<int, int64_t> own_scope_smem_bytes;         // by thread of the wave
  const std::vector<std::vector<int64_t>>* cluster_positions = nullptr;
  std::vector<std::string> cta_names;
  const std::vector<std::vector<Array>>* scratch = nullptr;
  // By the receiving barrier and the copy's destination there (copies of x and y may complete on
  // one barrier, each multicast among its own peers).
  std::map<std::pair<const std::byte*, const std::byte*>, MulticastLanding> multicasts;
  // The run_scoped instances collective over the thread axis that a CTA's threads are entering or
  // leaving, by CTA (of the wave) and op.
  std::map<std::pair<int64_t, const ir::Op*>, std::shared_ptr<SharedScope>> shared_scopes;
};

class GpuThreadInterpreter : public eval::Interpreter {
 public:
  GpuThreadInterpreter(const TracedCall& call, int index) : Interpreter(call.kernel), call_(call), index_(index) {
    access_hooks_ = true;
  }
  void start(Wave* wave, std::string name) {
    wave_ = wave;
    name_ = std::move(name);
    clock_.clear();
    tpu_interpret::tick(clock_, index_);
    last_wgmma_.clear();
    copies_read_.clear();
    copies_written_.clear();
    uncommitted_read_.clear();
    uncommitted_written_.clear();
    wgmmas_.clear();
  }

 protected:
  bool eval_extension_op(const ir::Op& op) override {
    switch (op.code) {
      case OpCode::AxisIndex: {
        const std::string& name = op.attrs.get_string(AttrKey::AxisNames);
        const int axis = core::named_grid_axis(call_.grid_mapping, name);
        if (axis < 0) {
          std::string known;
          for (const std::string& n : call_.grid_mapping.grid_names) known += (known.empty() ? "" : ", ") + n;
          throw Error("axis_index(\"" + name + "\"): the mesh has no such axis (axes: " + known + ")", op.loc);
        }
        set(op.results[0], eval::constant(Scalar::of_int(grid_point().program_ids.at(axis), DType::I32), {}));
        return true;
      }
      case OpCode::GpuCopyGmemToSmem: {
        BarrierState& b = barrier(op, op.operands[2]);
        if (!b.peers.empty())
          throw Error(std::string(op.info().name) + ": the copy would arrive on barrier " + b.name +
                          ", a gpu::ClusterBarrier; copies arrive on a barrier of their own CTA (gpu::Barrier "
                          "or gpu::TMABarrier)",
                      op.loc);
        if (op.attrs.has(AttrKey::Axes)) {
          multicast_copy(op);
          return true;
        }
        const Actor copy = new_actor(clock_, "the copy to SMEM");
        record(op, ref(op.operands[0]), false, copy);
        record(op, ref(op.operands[1]), true, copy);
        eval::write(ref(op.operands[1]), eval::read(ref(op.operands[0])));
        b.copy_in_phase = op.loc;
        arrive(op, b, copy.clock);
        return true;
      }
      case OpCode::GpuCopySmemToGmem: {
        // Its reads of SMEM and its writes to GMEM complete separately (wait_smem_to_gmem's
        // read_only waits for the reads only).
        // A reduction (reduction_op) updates each element atomically: it races with plain accesses
        // of the destination only.
        const bool reduce = op.attrs.has(AttrKey::Kind);
        const Actor reads = new_actor(clock_, "the copy to GMEM (its reads)");
        const Actor writes = new_actor(clock_, reduce ? "the reducing copy to GMEM (its updates)" : "the copy to GMEM (its writes)");
        record(op, ref(op.operands[0]), false, reads);
        record(op, ref(op.operands[1]), true, writes.id, writes.name, writes.clock, reduce);
        if (reduce) {
          Array cur = eval::read(ref(op.operands[1]));
          eval::atomic_combine(op.attrs.get_string(AttrKey::Kind), cur, eval::read(ref(op.operands[0])));
          eval::write(ref(op.operands[1]), cur);
        } else {
          eval::write(ref(op.operands[1]), eval::read(ref(op.operands[0])));
        }
        // One group with the uncommitted copies before it (commit_group), else uncommitted.
        tpu_interpret::merge_into(uncommitted_read_, reads.clock);
        tpu_interpret::merge_into(uncommitted_written_, writes.clock);
        if (op.attrs.get_int_or(AttrKey::CommitGroup, 1) != 0) commit_copies_to_gmem();
        return true;
      }
      case OpCode::GpuCommitSmemToGmemGroup:
        commit_copies_to_gmem();  // (with none uncommitted, an empty group: it counts, as on the GPU)
        return true;
      case OpCode::GpuWaitSmemToGmem: {
        const size_t n = static_cast<size_t>(op.attrs.get_int(AttrKey::N));
        acquire_all_but(copies_read_, n);
        if (op.attrs.get_int(AttrKey::ReadOnly) == 0) acquire_all_but(copies_written_, n);
        return true;
      }
      case OpCode::GpuBarrierArrive: {
        BarrierState& b = barrier(op, op.operands[0]);
        if (b.peers.empty()) arrive(op, b, clock_);
        for (const std::byte* peer : b.peers) arrive(op, wave_->barriers.at(peer), clock_);
        tpu_interpret::tick(clock_, index_);  // later accesses are not covered by this release
        return true;
      }
      case OpCode::GpuBarrierWait:
        wait(op, barrier(op, op.operands[0]));
        return true;
      case OpCode::GpuWgmma:
        wgmma(op);
        return true;
      case OpCode::GpuClusterRef:
        set(op.results[0], cluster_ref(op));
        return true;
      case OpCode::GpuAsyncPrefetch:
        return true;  // (a cache hint: nothing to model)
      case OpCode::GpuWgmmaWait:
        acquire_all_but(wgmmas_, static_cast<size_t>(op.attrs.get_int(AttrKey::N)));
        return true;
      case OpCode::SemaphoreSignal: {
        if (op.attrs.get_int_or(AttrKey::HasCoreIndex, 0) != 0 || op.attrs.has(AttrKey::DeviceIdType))
          throw NotSupportedError("semaphore_signal to another core or device in a gpu::kernel", op.loc);
        const int64_t inc = scalar_int(op.operands[1]);
        if (inc < 0) throw Error(eval::negative_semaphore_amount(op.info().name, inc), op.loc);
        auto [count, sem] = semaphore(op);
        *count += static_cast<int32_t>(inc);
        tpu_interpret::merge_into(sem.released, clock_);
        tpu_interpret::tick(clock_, index_);  // later accesses are not covered by this release
        return true;
      }
      case OpCode::SemaphoreWait:
        semaphore_wait(op);
        return true;
      case OpCode::SemaphoreRead: {
        auto [count, sem] = semaphore(op);
        tpu_interpret::merge_into(clock_, sem.released);
        set(op.results[0], eval::constant(Scalar::of_int(*count, DType::I32), {}));
        return true;
      }
      case OpCode::GpuCommitSmem:
        return true;  // the thread's own stores are in program order here
      case OpCode::RunScoped:
        run_scoped(op);
        return true;
      case OpCode::GpuSetMaxRegisters:  // (checked when the wave is done: setmaxnreg_overflow)
        wave_->register_requests[index_] = {op.attrs.get_int(ir::AttrKey::N), op.loc};
        return true;
      default:
        return false;
    }
  }

 private:
  BarrierState& barrier(const ir::Op& op, ir::ValueId v) {
    const eval::RefValue& r = ref(v);
    auto it = wave_->barriers.find(r.data);
    if (it == wave_->barriers.end())
      throw Error(std::string(op.info().name) + ": the barrier is not alive (a run_scoped barrier used after its "
                      "scope ended?)",
                  op.loc);
    return it->second;
  }

  // run_scoped: fresh buffers (barriers with no phase completed, arrays uninitialized) that the
  // race check knows by name while the scope runs. Collective over the thread axis (gpu.h
  // ScopedOptions), the CTA's threads share one instance and meet at its entry and its exit.
  void run_scoped(const ir::Op& op) {
    const ir::Region& body = op.regions[0];
    const bool collective = op.attrs.has(AttrKey::Axes);
    const int64_t cta = index_ / wave_->threads_per_cta, n = collective ? wave_->threads_per_cta : 1;
    const std::string where = op.loc.to_string();
    const std::string of_whom = collective ? " of " + wave_->cta_names.at(static_cast<size_t>(cta)) : " of " + name_;
    std::shared_ptr<SharedScope> scope;
    if (collective) {
      std::shared_ptr<SharedScope>& slot = wave_->shared_scopes[{cta, &op}];
      if (!slot) slot = std::make_shared<SharedScope>();
      scope = slot;
    } else {
      scope = std::make_shared<SharedScope>();
    }
    if (scope->entered == 0) {
      // A CTA holds at most 227 KiB of shared memory: the scratch, the shared scopes alive, and
      // each Pallas thread's own scopes (as this thread's, once per thread). A lower bound of
      // what the compiled kernel needs (its arena also holds the body's tiles, aligned).
      int64_t bytes = 0;
      for (ir::ValueId a : body.args) {
        const ir::Type& t = kernel().type(a);
        if (t.space == MemorySpace::GpuShared || t.dtype == DType::Semaphore) bytes += t.size() * itemsize(t.dtype);
      }
      const int64_t shared = wave_->shared_scope_smem_bytes[cta], own = wave_->own_scope_smem_bytes[index_];
      const int64_t per_thread = wave_->threads_per_cta;
      const int64_t total = wave_->scratch_smem_bytes + shared + (collective ? bytes : 0) +
                            per_thread * (own + (collective ? 0 : bytes));
      if (total > gpu::kMaxSharedMemoryBytes)
        throw Error("gpu::kernel exceeds available shared memory: the run_scoped here needs " + std::to_string(bytes) +
                        " bytes of SMEM" + (collective || per_thread == 1 ? std::string() : " per Pallas thread (" +
                        std::to_string(per_thread) + " of them)") + ", which with the scratch's " +
                        std::to_string(wave_->scratch_smem_bytes) + " and the scopes around it makes " +
                        std::to_string(total) + ", more than the " + std::to_string(gpu::kMaxSharedMemoryBytes) +
                        " (227 KiB) a CTA may use; shrink the scoped or scratch SMEM arrays",
                    op.loc);
      scope->smem_bytes = bytes;
      (collective ? wave_->shared_scope_smem_bytes[cta] : wave_->own_scope_smem_bytes[index_]) += bytes;
      const ir::Ints* arrivals = op.attrs.has(AttrKey::Arrivals) ? &op.attrs.get_ints(AttrKey::Arrivals) : nullptr;
      for (size_t i = 0; i < body.args.size(); ++i) {
        const ir::Type& t = kernel().type(body.args[i]);
        Array a = Array::uninitialized(t.shape, t.dtype);
        auto* base = static_cast<std::byte*>(a.raw_data());
        const std::string name = "run_scoped[" + std::to_string(i) + "] at " + where;
        if (t.dtype == DType::GpuBarrier) {
          std::memset(base, 0, static_cast<size_t>(a.size()) * 8);
          for (int64_t k = 0; k < a.size(); ++k) {
            BarrierState st;
            st.num_arrivals = static_cast<int>(arrivals->at(i));
            st.name = name + (a.size() > 1 ? "[" + std::to_string(k) + "]" : std::string()) + of_whom;
            wave_->barriers[base + 8 * k] = st;
          }
        } else if (t.dtype == DType::Semaphore && t.space == MemorySpace::Gmem) {  // the CTA's counters, at 0
          a = Array::zeros(t.shape, DType::I32);
          // "run_scoped[1][0] at f.cpp:9 of CTA (2,)"
          wave_->add_semaphores(a, t.shape, "run_scoped[" + std::to_string(i) + "]", " at " + where + of_whom);
        } else {
          eval::fill_uninitialized(a);
          if (a.size() > 0) wave_->buffers[base] = {base, a.size() * itemsize(t.dtype), t.shape, name + of_whom};
        }
        scope->buffers.push_back(a);
      }
    }
    // Meets the CTA's other threads: returns once all n have arrived (`count` counts them),
    // knowing what each released before arriving.
    auto meet = [&](int64_t SharedScope::*count, VectorClock SharedScope::*released, const char* what) {
      ++((*scope).*count);
      tpu_interpret::merge_into((*scope).*released, clock_);
      if (n > 1) {
        SharedScope* sp = scope.get();
        const std::string whom = wave_->cta_names.at(static_cast<size_t>(cta));
        wave_->turns->wait_until(index_, [sp, count, n] { return (*sp).*count >= n; }, [sp, count, n, what, where, whom] {
          return "waits at " + where + " for every thread of " + whom + " to " + what + " the run_scoped (collective over the thread axis; " +
                 std::to_string((*sp).*count) + " of " + std::to_string(n) + " have)";
        });
      }
      tpu_interpret::merge_into(clock_, (*scope).*released);
      tpu_interpret::tick(clock_, index_);
    };
    meet(&SharedScope::entered, &SharedScope::entry, "enter");
    for (size_t i = 0; i < body.args.size(); ++i) {
      const ir::Type& t = kernel().type(body.args[i]);
      eval::RefValue r = eval::RefValue::of_array(scope->buffers[i], t.space);
      r.dtype = t.dtype;  // (a gpu::Semaphore's counters are an i32 array)
      set(body.args[i], r);
    }
    std::vector<Array> results = run_region_yield(body);
    meet(&SharedScope::left, &SharedScope::exit, "leave");
    for (ir::ValueId a : body.args) set(a, eval::RtValue{});  // the scope's buffers die here
    for (size_t i = 0; i < results.size(); ++i) set(op.results[i], results[i]);
    // The first thread past the exit (every thread has left) lets the buffers go. (Another may
    // already have entered the same op again: a new instance.)
    if (scope->ended) return;
    scope->ended = true;
    (collective ? wave_->shared_scope_smem_bytes[cta] : wave_->own_scope_smem_bytes[index_]) -= scope->smem_bytes;
    if (collective) {
      const auto it = wave_->shared_scopes.find({cta, &op});
      if (it != wave_->shared_scopes.end() && it->second == scope) wave_->shared_scopes.erase(it);
    }
    // The barriers first (a copy landing on one that no thread waited for is the more telling
    // report), then the arrays.
    for (const Array& a : scope->buffers) {
      if (a.dtype() != DType::GpuBarrier) continue;
      const auto* base = static_cast<const std::byte*>(a.raw_data());
      for (int64_t k = 0; k < a.size(); ++k) {
        const auto b = wave_->barriers.find(base + 8 * k);
        if (const auto copy = unwaited_copy(b->second))
          throw Error("copy_gmem_to_smem: the run_scoped at " + where + " ends before any thread waits for phase " +
                          std::to_string(copy->second) + " of its barrier " + b->second.name +
                          ", which a copy to SMEM completes: on a GPU the copy may still be landing when the barrier "
                          "and its memory are gone — wait for the barrier (barrier_wait) inside the scope",
                      copy->first);
        wave_->barriers.erase(b);
      }
    }
    for (Array& a : scope->buffers) {
      if (a.dtype() == DType::GpuBarrier) continue;
      const auto* base = static_cast<const std::byte*>(a.raw_data());
      if (wave_->semaphores.count(base)) {  // a gpu::Semaphore (i32 counters)
        // Mosaic GPU gives a scope's semaphores to the next scope as they are (it clears them once
        // per call): a kernel must leave them at 0. (Compiled here they are zeroed at each entry,
        // so the kernel would run — and differ on Mosaic GPU.)
        for (int64_t k = 0; k < a.size(); ++k) {
          const int32_t count = reinterpret_cast<const int32_t*>(base)[k];
          if (count != 0)
            throw Error("run_scoped: semaphore " + wave_->semaphores.at(base + 4 * k).name + " is " +
                            std::to_string(count) + " when the scope ends; a scope's semaphores must be back at 0 "
                            "by then (take every signal with a decrementing semaphore_wait: Mosaic GPU hands their "
                            "memory to the next scope without clearing it)",
                        op.loc);
          wave_->semaphores.erase(base + 4 * k);
        }
        continue;
      }
      // The memory is given back (compiled: refilled at the next entry, or another tile's) — a
      // write of it all, after what every thread knew when leaving: a copy to or from it or a
      // wgmma reading it that no thread waited for is a race here.
      if (a.size() > 0)
        record(op, eval::RefValue::of_array(a, MemorySpace::GpuShared), true, index_,
               "the end of the run_scoped at " + where + " (its memory given back)", clock_, false);
      wave_->buffers.erase(base);
      wave_->races.forget(base);
    }
  }

  // A gpu::Semaphore's counter and state (operand 0 of a semaphore op).
  std::pair<int32_t*, SemaphoreState&> semaphore(const ir::Op& op) {
    const eval::RefValue& r = ref(op.operands[0]);
    auto it = wave_->semaphores.find(r.data);
    if (it == wave_->semaphores.end())
      throw NotSupportedError(std::string(op.info().name) + " on a semaphore that is not a live gpu::Semaphore (of "
                                  "scratch_shapes, a run_scoped or pl::get_global)",
                              op.loc);
    return {reinterpret_cast<int32_t*>(const_cast<std::byte*>(r.data)), it->second};
  }

  void semaphore_wait(const ir::Op& op) {
    const int64_t value = scalar_int(op.operands[1]);
    if (value < 0) throw Error(eval::negative_semaphore_amount(op.info().name, value), op.loc);
    const bool decrement = op.attrs.get_int_or(AttrKey::Decrement, 1) != 0;
    auto [count, sem] = semaphore(op);
    const int32_t* c = count;
    const std::string where = op.loc.to_string(), name = sem.name;
    wave_->turns->wait_until(index_, [c, value] { return *c >= value; }, [c, value, where, name] {
      return "waits at " + where + " for semaphore " + name + " to reach " + std::to_string(value) + " (it is " +
             std::to_string(*c) + ")";
    });
    if (decrement) *count -= static_cast<int32_t>(value);
    tpu_interpret::merge_into(clock_, sem.released);
  }

  // An arrival releasing `released` (the thread's clock, or a copy's).
  void arrive(const ir::Op& op, BarrierState& b, const VectorClock& released) {
    tpu_interpret::merge_into(b.arrived, released);
    if (++b.arrivals < b.num_arrivals) return;
    if (!b.observed)
      throw Error(std::string(op.info().name) + ": barrier " + b.name + " completes phase " +
                      std::to_string(b.phase + 1) + " before any thread waited for phase " +
                      std::to_string(b.phase) + " (" + name_ +
                      "); on a GPU the phase is one parity bit, so that completion is lost — wait "
                      "for each phase before it completes again" + eval::at_grid_point(grid_point().program_ids),
                  op.loc);
    b.arrivals = 0;
    ++b.phase;
    b.observed = false;
    b.copy_in_completed = std::exchange(b.copy_in_phase, std::nullopt);
    b.released[b.phase] = std::move(b.arrived);
    b.arrived.clear();
  }

  // copy_gmem_to_smem with collective_axes (gpu.h): this CTA's share of the copy lands in every
  // peer's dst, a copy of its own (an actor) writing there; a peer's barrier gets the copy's one
  // arrival, releasing all the shares' copies, when the last share has landed in it.
  void multicast_copy(const ir::Op& op) {
    const std::string what = std::string(op.info().name) + " with collective_axes (" +
                             op.attrs.get_string(AttrKey::AxisNames) + ")";
    const size_t cta = static_cast<size_t>(index_ / wave_->threads_per_cta);
    const ir::Ints& axes = op.attrs.get_ints(AttrKey::Axes);
    const int64_t first_cluster_axis = call_.gpu_kernel->num_grid_axes;
    const std::vector<std::vector<int64_t>>& positions = *wave_->cluster_positions;
    const size_t cluster_ctas = positions.size(), first = cta / cluster_ctas * cluster_ctas;
    const std::vector<int64_t>& here = positions[cta % cluster_ctas];
    std::vector<int> collective;  // among the cluster axes
    for (int64_t axis : axes) collective.push_back(static_cast<int>(axis - first_cluster_axis));
    std::vector<size_t> peers;  // in row-major order of the cluster: a peer's rank is its place here
    for (size_t p = first; p < first + cluster_ctas; ++p)
      if (core::multicast_peers(positions[p % cluster_ctas], here, collective)) peers.push_back(p);
    const int64_t n = static_cast<int64_t>(peers.size());
    const int64_t rank = std::find(peers.begin(), peers.end(), cta) - peers.begin();
    const eval::RefValue& src = ref(op.operands[0]);
    const eval::RefValue& dst = ref(op.operands[1]);
    // The shares: equal parts along the first dimension the peers' count divides.
    const std::optional<size_t> share_dim = core::multicast_share_dim(dst.shape, n);
    if (!share_dim)
      throw Error(what + ": no dimension of the copy's shape " + shape_to_string(dst.shape) +
                      " divides into equal shares for its " + std::to_string(n) + " CTAs",
                  op.loc);
    const size_t dim = *share_dim;
    const int64_t len = dst.shape[dim] / n;
    auto share = [&](eval::RefValue v) {
      v.data += rank * len * v.strides[dim] * static_cast<int64_t>(itemsize(v.dtype));
      v.shape[dim] = len;
      return v;
    };
    const eval::RefValue src_share = share(src), dst_share = share(dst);
    const Actor copy = new_actor(clock_, "the multicast copy to SMEM");
    record(op, src_share, false, copy);
    const Array data = eval::read(src_share);
    const std::byte* barrier_here = ref(op.operands[2]).data;
    for (size_t p : peers) {
      eval::RefValue there = dst_share;
      there.data = in_cta(dst_share.data, cta, p);
      record(op, there, true, copy);
      eval::write(there, data);
      const std::byte* barrier_there = in_cta(barrier_here, cta, p);
      BarrierState& b = wave_->barriers.at(barrier_there);
      const std::pair<const std::byte*, const std::byte*> key{barrier_there, in_cta(dst.data, cta, p)};
      MulticastLanding& m = wave_->multicasts[key];
      if (m.count == 0) {
        m.landed.assign(static_cast<size_t>(n), false);
        m.src = src;
        m.first_issuer = wave_->cta_names[cta];
        m.first_loc = op.loc;
      } else if (m.src.data != src.data || m.src.shape != src.shape || m.src.strides != src.strides) {
        throw Error(what + ": " + wave_->cta_names[cta] + " copies " + describe(src) + ", but " + m.first_issuer +
                        " copied " + describe(m.src) + " in the same multicast (into barrier " + b.name +
                        "): every peer must copy the same source",
                    op.loc);
      }
      if (m.landed[static_cast<size_t>(rank)])
        throw Error(what + ": " + wave_->cta_names[cta] + " issues another multicast into barrier " + b.name +
                        " before all its peers issued the previous one",
                    op.loc);
      m.landed[static_cast<size_t>(rank)] = true;
      tpu_interpret::merge_into(m.released, copy.clock);
      if (++m.count < n) continue;
      const VectorClock released = std::move(m.released);
      wave_->multicasts.erase(key);
      b.copy_in_phase = op.loc;
      arrive(op, b, released);
    }
  }
  // cluster_ref: the same place in the scratch of the CTA at the index along the axis, this CTA's
  // place along the other cluster axes.
  eval::RefValue cluster_ref(const ir::Op& op) {
    const size_t cta = static_cast<size_t>(index_ / wave_->threads_per_cta);
    const std::vector<std::vector<int64_t>>& positions = *wave_->cluster_positions;
    const size_t cluster_ctas = positions.size(), first = cta / cluster_ctas * cluster_ctas;
    const size_t axis = static_cast<size_t>(op.attrs.get_ints(AttrKey::Axes).at(0) - call_.gpu_kernel->num_grid_axes);
    const int64_t index = scalar_int(op.operands[1]);
    std::vector<int64_t> there = positions[cta % cluster_ctas];
    const int64_t size = positions.back().at(axis) + 1;  // (row-major: the last CTA's coordinates are the largest)
    if (index < 0 || index >= size)
      throw Error("cluster_ref: index " + std::to_string(index) + " is outside the cluster axis '" +
                      op.attrs.get_string(AttrKey::AxisNames) + "' of size " + std::to_string(size) + " (in " +
                      wave_->cta_names[cta] + ")",
                  op.loc);
    there[axis] = index;
    const size_t peer = first + static_cast<size_t>(std::find(positions.begin(), positions.end(), there) - positions.begin());
    eval::RefValue r = ref(op.operands[0]);
    r.data = in_cta(r.data, cta, peer);
    return r;
  }
  // The address in CTA `to`'s scratch of `at` in CTA `from`'s (the same array, the same offset).
  const std::byte* in_cta(const std::byte* at, size_t from, size_t to) const {
    const std::vector<Array>& mine = (*wave_->scratch)[from];
    for (size_t s = 0; s < mine.size(); ++s) {
      const auto* base = static_cast<const std::byte*>(mine[s].raw_data());
      if (at >= base && at < base + mine[s].size() * itemsize(mine[s].dtype()))
        return static_cast<const std::byte*>((*wave_->scratch)[to][s].raw_data()) + (at - base);
    }
    throw InternalError("a multicast copy's destination (or a cluster_ref's array) is not in its CTA's scratch");
  }
  std::byte* in_cta(std::byte* at, size_t from, size_t to) const {
    return const_cast<std::byte*>(in_cta(static_cast<const std::byte*>(at), from, to));
  }
  // "input 0 from [64, 0], shape [64, 128]": where a view starts in its buffer.
  std::string describe(const eval::RefValue& v) const {
    auto it = wave_->buffers.upper_bound(v.data);
    if (it == wave_->buffers.begin()) return "a view " + shape_to_string(v.shape);
    const Buffer& b = std::prev(it)->second;
    std::vector<int64_t> start;
    core::unravel_row_major((v.data - b.base) / static_cast<int64_t>(itemsize(v.dtype)), b.shape, start);
    return b.name + " from " + shape_to_string(start) + ", shape " + shape_to_string(v.shape);
  }

  void wait(const ir::Op& op, BarrierState& b) {
    int64_t& next = b.next_phase.try_emplace(index_, 1).first->second;
    const int64_t want = next;
    auto missed = [&] {
      return Error(std::string(op.info().name) + ": " + name_ + " waits for phase " +
                       std::to_string(want) + " of barrier " + b.name + ", which has already completed " +
                       std::to_string(b.phase) + " phases: this thread missed a completion (on a GPU "
                       "the wait would return at the wrong phase or hang)",
                   op.loc);
    };
    if (b.phase > want) throw missed();
    BarrierState* bp = &b;
    const Wave* wave = wave_;
    const std::string where = op.loc.to_string();
    wave_->turns->wait_until(index_, [bp, want] { return bp->phase >= want; }, [bp, want, wave, where] {
      std::ostringstream what;
      what << "waits at " << where << " for phase " << want << " of barrier " << bp->name << " (" << bp->phase
           << " phases completed, " << bp->arrivals << " of " << bp->num_arrivals << " arrivals in the current one";
      for (const auto& [at, m] : wave->multicasts)
        if (&wave->barriers.at(at.first) == bp)
          what << "; a multicast copy into it has the shares of " << m.count << " of its " << m.landed.size()
               << " CTAs: a peer has not issued its copy_gmem_to_smem";
      return what.str() + ")";
    });
    if (b.phase > want) throw missed();
    b.observed = true;
    next = want + 1;
    tpu_interpret::merge_into(clock_, b.released.at(want));
  }

  // acc += a @ b: the interpreters' dot with an f32 result (the tensor cores accumulate in f32),
  // added to the accumulator in f32.
  void wgmma(const ir::Op& op) {
    const eval::RefValue& acc_ref = ref(op.operands[0]);
    VectorClock after = clock_;
    tpu_interpret::merge_into(after, last_wgmma_);  // wgmmas chain on the accumulator in order
    const Actor mma = new_actor(after, "the wgmma");
    // a is an SMEM Ref the wgmma reads while it runs, or a value (registers) taken as it is issued.
    const bool a_in_registers = !kernel().type(op.operands[1]).is_ref;
    if (!a_in_registers) record(op, ref(op.operands[1]), false, mma);
    record(op, ref(op.operands[2]), false, mma);
    record(op, acc_ref, true, mma);
    last_wgmma_ = mma.clock;
    wgmmas_.push_back(mma.clock);
    ir::Attrs dims;
    dims.set(AttrKey::LhsContracting, ir::Ints{1});
    dims.set(AttrKey::RhsContracting, ir::Ints{0});
    dims.set(AttrKey::LhsBatch, ir::Ints{});
    dims.set(AttrKey::RhsBatch, ir::Ints{});
    dims.set(AttrKey::DTypeAttr, DType::F32);
    const Array product =
        eval::dot_general(a_in_registers ? array(op.operands[1]) : eval::read(ref(op.operands[1])), eval::read(ref(op.operands[2])), dims);
    const Array sum = eval::binary(OpCode::Add, eval::convert(eval::read(acc_ref), DType::F32), product);
    eval::write(acc_ref, eval::convert(sum, acc_ref.dtype));
  }

  // ---- Races.
  struct Actor {
    int id;
    std::string name;
    VectorClock clock;
  };
  // An asynchronous operation issued now, knowing what `known` knows.
  Actor new_actor(const VectorClock& known, const std::string& what) {
    Actor a{wave_->next_actor++, what + " issued by " + name_, known};
    tpu_interpret::tick(a.clock, a.id);
    tpu_interpret::tick(clock_, index_);  // the issuer's later accesses are not covered by it
    return a;
  }
  void begin_access(const ir::Op& op, const eval::RefValue& view) override {
    // Atomic read-modify-writes never race with each other, only with plain accesses.
    const bool atomic = op.code == OpCode::AtomicRmw || op.code == OpCode::AtomicCas;
    record(op, view, op.code != OpCode::Load, index_, name_, clock_, atomic);
  }
  void record(const ir::Op& op, const eval::RefValue& view, bool is_write, const Actor& who) {
    record(op, view, is_write, who.id, who.name, who.clock, false);
  }
  // Checks an access against the wave's earlier ones; a race is an error at the user's line.
  void record(const ir::Op& op, const eval::RefValue& view, bool is_write, int actor, const std::string& actor_name,
              const VectorClock& clock, bool atomic) {
    auto it = wave_->buffers.upper_bound(view.data);
    if (it == wave_->buffers.begin()) return;
    const Buffer& b = std::prev(it)->second;
    if (view.data >= b.base + b.bytes) return;
    const tpu_interpret::AccessInfo who{actor, actor_name, std::string(op.info().name), op.loc};
    if (wave_->cross_wave) wave_->cross_wave->access(b.base, view, is_write, atomic, wave_->index, who, op.loc);
    int found = 0;
    if (b.by_bytes) {
      for (const tpu_interpret::Region& bytes : byte_regions(view, b.base))
        found += wave_->races.access(b.base, b.name, b.shape, bytes, is_write, clock, who, atomic);
    } else {
      const int64_t elements = num_elements(b.shape);
      found = wave_->races.access(b.base, b.name, b.shape,
                                  tpu_interpret::region_of(view, b.base, b.shape, nullptr, elements > 0 ? b.bytes / elements : 0),
                                  is_write, clock, who, atomic);
    }
    if (found > 0)
      throw Error("gpu::kernel data race (on a GPU the result would depend on timing): " +
                      wave_->races.reports().back().to_string() +
                      "order them with a barrier (copies to SMEM complete at their barrier's phase), a semaphore, "
                      "wait_smem_to_gmem or wgmma_wait",
                  op.loc);
  }
  // The bytes `view` touches from `base`, as regions of a 1-D byte buffer: per position of its
  // outer dimensions, its innermost row as one range when contiguous, else as one progression per
  // byte of the element (exact: the ranges cover the touched bytes and nothing else).
  static std::vector<tpu_interpret::Region> byte_regions(const eval::RefValue& view, const std::byte* base) {
    std::vector<tpu_interpret::Region> out;
    const int64_t item = itemsize(view.dtype);
    if (view.size() == 0) return out;
    const size_t rank = view.shape.size();
    const int64_t n = rank ? view.shape.back() : 1, step = rank ? view.strides.back() * item : item;
    std::vector<int64_t> at(rank > 0 ? rank - 1 : 0, 0);
    while (true) {
      int64_t start = view.data - base;
      for (size_t d = 0; d + 1 < rank; ++d) start += at[d] * view.strides[d] * item;
      if (step == item || n == 1)
        out.push_back({{start, n * item, 1}});
      else
        for (int64_t byte = 0; byte < item; ++byte) out.push_back({{start + byte, n, step}});
      size_t d = at.size();
      while (d > 0 && ++at[d - 1] == view.shape[d - 1]) at[--d] = 0;
      if (d == 0) break;
    }
    return out;
  }
  // Joins the clocks of all but the `keep` most recent operations of `pending` (then forgotten).
  void acquire_all_but(std::deque<VectorClock>& pending, size_t keep) {
    while (pending.size() > keep) {
      tpu_interpret::merge_into(clock_, pending.front());
      pending.pop_front();
    }
  }

  const TracedCall& call_;
  int index_;  // the thread's number within its wave
  Wave* wave_ = nullptr;
  std::string name_;
  VectorClock clock_;
  VectorClock last_wgmma_;
  std::deque<VectorClock> copies_read_, copies_written_, wgmmas_;  // in flight, oldest first
  // The copies to GMEM made with commit_group = false since the last group: no wait covers them.
  VectorClock uncommitted_read_, uncommitted_written_;
  void commit_copies_to_gmem() {
    copies_read_.push_back(std::exchange(uncommitted_read_, {}));
    copies_written_.push_back(std::exchange(uncommitted_written_, {}));
  }
};

// The most Pallas threads the interpreter runs at once (a wave; each is an OS thread).
constexpr int64_t kMaxWaveThreads = 4096;

std::string tuple(const std::vector<int64_t>& v, size_t from, size_t to) {
  std::string s = "(";
  for (size_t i = from; i < to; ++i) s += (i > from ? ", " : "") + std::to_string(v[i]);
  return s + (to - from == 1 ? ",)" : ")");
}

// Row-major points of a box of sizes `dims`.
std::vector<std::vector<int64_t>> points(const std::vector<int64_t>& dims) {
  int64_t total = 1;
  for (int64_t d : dims) total *= d;
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(total));
  for (int64_t linear = 0; linear < total; ++linear) core::unravel_row_major(linear, dims, out[linear]);
  return out;
}

}  // namespace

std::vector<Array> run_gpu_kernel(const TracedCall& call, const std::vector<Array>& args,
                                  const std::vector<int64_t>& grid, std::ostream* debug_out) {
  const GridMapping& gm = call.grid_mapping;
  const gpu::KernelLayout& layout = *call.gpu_kernel;
  const int num_in = gm.num_inputs, num_out = gm.num_outputs;
  const std::vector<bool> written = ir::params_written(call.kernel);

  // ---- Operands: whole arrays in GMEM.
  std::map<int, int> input_of_output;
  for (auto [i, o] : call.input_output_aliases) input_of_output[o] = i;
  std::vector<Array> operands;
  for (int i = 0; i < num_in; ++i) {
    bool aliased = false;
    for (auto [in, out] : call.input_output_aliases) aliased = aliased || in == i;
    operands.push_back(written[i] && !aliased ? args[i].clone() : args[i]);
  }
  for (int o = 0; o < num_out; ++o) {
    auto alias = input_of_output.find(o);
    if (alias != input_of_output.end()) {
      operands.push_back(operands[alias->second]);
      continue;
    }
    const ShapeDtype& s = gm.block_mappings[num_in + o].array;
    Array a = Array::uninitialized(s.shape, s.dtype);
    eval::fill_uninitialized(a);
    operands.push_back(a);
  }

  // ---- Semaphores of pl::get_global: one array each, shared by the whole grid and zero at the
  // start. A wait may need any other CTA to go on, so with them the whole grid is one wave;
  // without, each cluster is. (gpu::Semaphore scratch is one array per CTA, made with its scratch.)
  std::vector<Array> grid_semaphores(gm.scratch_types.size());
  const size_t first_global = static_cast<size_t>(
      std::find(gm.scratch_grid_wide.begin(), gm.scratch_grid_wide.end(), true) - gm.scratch_grid_wide.begin());
  bool whole_grid = false;
  for (size_t s = 0; s < gm.scratch_types.size(); ++s)
    if (gm.scratch_types[s].dtype == DType::Semaphore && gm.scratch_grid_wide[s]) {
      grid_semaphores[s] = Array::zeros(gm.scratch_types[s].shape, DType::I32);
      whole_grid = true;
    }

  // ---- The mesh: clusters of CTAs of threads.
  const size_t g_axes = static_cast<size_t>(layout.num_grid_axes);
  const size_t c_axes = static_cast<size_t>(layout.num_cluster_axes);
  std::vector<int64_t> grid_dims(grid.begin(), grid.begin() + g_axes);
  std::vector<int64_t> cluster_dims(grid.begin() + g_axes, grid.begin() + g_axes + c_axes);
  const int64_t num_threads = layout.has_thread_axis ? grid.back() : 1;
  const std::vector<std::vector<int64_t>> ctas = points(cluster_dims);
  const std::vector<std::vector<int64_t>> clusters = points(grid_dims);
  std::vector<std::vector<std::vector<int64_t>>> waves;  // the cluster indices of each wave
  if (whole_grid)
    waves.push_back(clusters);
  else
    for (const std::vector<int64_t>& c : clusters) waves.push_back({c});
  const int64_t threads_per_cluster = static_cast<int64_t>(ctas.size()) * num_threads;
  const int64_t wave_threads = threads_per_cluster * static_cast<int64_t>(waves.empty() ? 0 : waves[0].size());
  if (wave_threads > kMaxWaveThreads)
    throw Error("gpu::kernel with pl::get_global semaphores: the interpreter runs the whole grid at once (a wait "
                    "may need any CTA), here " + std::to_string(wave_threads) + " Pallas threads; it runs at most " +
                    std::to_string(kMaxWaveThreads) + " (a GPU could not hold that many CTAs at once either)",
                call.kernel.loc);

  std::vector<std::unique_ptr<GpuThreadInterpreter>> interps;
  for (int t = 0; t < wave_threads; ++t) {
    interps.push_back(std::make_unique<GpuThreadInterpreter>(call, t));
    interps.back()->set_debug_out(debug_out);
    interps.back()->set_debug_checks(call.debug_checks);
  }

  // "input 0", "output 1": how race reports name operand i.
  auto operand_name = [&](size_t i) {
    return static_cast<int>(i) < num_in ? "input " + std::to_string(i) : "output " + std::to_string(i - num_in);
  };
  // Operands' accesses across waves (one wave: the vector clocks see everything).
  CrossWaveAccesses cross_wave;
  for (size_t i = 0; i < operands.size() && waves.size() > 1; ++i) {
    const Array& a = operands[i];
    cross_wave.add_operand(static_cast<const std::byte*>(a.raw_data()), a.size(), itemsize(a.dtype()), a.shape(),
                           operand_name(i));
  }
  for (size_t w = 0; w < waves.size(); ++w) {
    const std::vector<std::vector<int64_t>>& wave_clusters = waves[w];
    Wave wave;
    wave.index = static_cast<int32_t>(w);
    if (waves.size() > 1) wave.cross_wave = &cross_wave;
    const size_t wave_ctas = wave_clusters.size() * ctas.size();
    std::vector<std::vector<Array>> scratch(wave_ctas);  // per CTA of the wave
    std::vector<std::vector<int64_t>> cta_index(wave_ctas);
    std::vector<std::vector<eval::RtValue>> params(static_cast<size_t>(wave_threads));
    std::vector<GridPoint> where(static_cast<size_t>(wave_threads));
    std::vector<std::string> names;
    wave.threads_per_cta = num_threads;
    // The scratch's shared memory (arrays and barriers; a union once, its largest member).
    std::set<int> unions_counted;
    for (size_t s = 0; s < gm.scratch_types.size(); ++s) {
      const ir::Type& t = gm.scratch_types[s];
      const ScratchUnionSlot& slot = gm.scratch_unions[s];
      // (The CTA's gpu::Semaphore counters are in its shared memory when compiled.)
      const bool cta_semaphore = t.dtype == DType::Semaphore && !gm.scratch_grid_wide[s];
      if (t.space != MemorySpace::GpuShared && !cta_semaphore) continue;
      if (slot.union_index >= 0) {
        if (unions_counted.insert(slot.union_index).second) wave.scratch_smem_bytes += slot.union_bytes;
        continue;
      }
      wave.scratch_smem_bytes += t.size() * itemsize(t.dtype);
    }
    wave.cluster_positions = &ctas;
    wave.scratch = &scratch;
    for (size_t c = 0; c < wave_ctas; ++c) {
      std::vector<int64_t>& cta = cta_index[c];
      cta = wave_clusters[c / ctas.size()];
      cta.insert(cta.end(), ctas[c % ctas.size()].begin(), ctas[c % ctas.size()].end());
      const std::string cta_name = cta.empty() ? "the CTA" : "CTA " + tuple(cta, 0, cta.size());
      wave.cta_names.push_back(cta_name);
      std::map<int, Array> unions;  // this CTA's memory of each gpu::Union
      for (size_t s = 0; s < gm.scratch_types.size(); ++s) {
        const ir::Type& t = gm.scratch_types[s];
        const ScratchUnionSlot& slot = gm.scratch_unions[s];
        Array a;
        if (t.dtype == DType::Semaphore) {
          a = gm.scratch_grid_wide[s] ? grid_semaphores[s] : Array::zeros(t.shape, DType::I32);
        } else if (slot.union_index >= 0) {
          auto [u, fresh] = unions.try_emplace(slot.union_index);
          if (fresh) u->second = Array::uninitialized({slot.union_bytes}, DType::U8);
          Array whole = u->second;
          a = Array::wrap(static_cast<std::byte*>(whole.raw_data()) + slot.offset, t.shape, t.dtype, [whole] {});
        } else {
          a = Array::uninitialized(t.shape, t.dtype);
        }
        if (t.dtype == DType::GpuBarrier) {
          std::memset(a.raw_data(), 0, static_cast<size_t>(a.size()) * 8);
          for (int64_t k = 0; k < a.size(); ++k) {
            BarrierState st;
            st.num_arrivals = gm.scratch_barrier_arrivals.at(s);
            st.name = "scratch[" + std::to_string(s) + "]" +
                      (a.size() > 1 ? "[" + std::to_string(k) + "]" : std::string()) +
                      (ctas.size() > 1 || !grid_dims.empty() ? " of " + cta_name : std::string());
            wave.barriers[static_cast<std::byte*>(a.raw_data()) + 8 * k] = st;
          }
        } else if (t.dtype == DType::Semaphore) {
          // "scratch[1][2] of CTA (3,)" (one per CTA), "get_global[0]" (the grid's, in the order
          // the body asked for them: the last scratch entries).
          const bool grid_wide = gm.scratch_grid_wide[s];
          const std::string of_cta = !grid_wide && (ctas.size() > 1 || !grid_dims.empty()) ? " of " + cta_name : "";
          wave.add_semaphores(a, t.shape,
                              grid_wide ? "get_global[" + std::to_string(s - first_global) + "]"
                                        : "scratch[" + std::to_string(s) + "]",
                              of_cta);
        } else {
          eval::fill_uninitialized(a);
        }
        scratch[c].push_back(a);
      }
      for (int64_t w = 0; w < num_threads; ++w) {
        const int t = static_cast<int>(static_cast<int64_t>(c) * num_threads + w);
        std::vector<eval::RtValue>& p = params[t];
        for (Array& a : operands) p.push_back(eval::RefValue::of_array(a, MemorySpace::Gmem));
        for (size_t s = 0; s < scratch[c].size(); ++s) {
          p.push_back(eval::RefValue::of_array(scratch[c][s], gm.scratch_types[s].space));
          if (gm.scratch_types[s].dtype == DType::Semaphore) std::get<eval::RefValue>(p.back()).dtype = DType::Semaphore;
        }
        where[t].num_programs = grid;
        where[t].program_ids = cta;
        if (layout.has_thread_axis) where[t].program_ids.push_back(w);
        names.push_back(layout.has_thread_axis ? "thread " + std::to_string(w) + " of " + cta_name : cta_name);
      }
    }
    // A cluster barrier's peers (core::cluster_barrier_peers): CTAs of the same cluster.
    for (size_t s = 0; s < gm.scratch_types.size(); ++s) {
      if (gm.scratch_barrier_collective_axes[s].empty()) continue;
      std::vector<int> collective;  // among the cluster axes
      for (int axis : gm.scratch_barrier_collective_axes[s]) collective.push_back(axis - static_cast<int>(g_axes));
      for (size_t c = 0; c < wave_ctas; ++c)
        for (size_t other = c / ctas.size() * ctas.size(); other < (c / ctas.size() + 1) * ctas.size(); ++other) {
          if (!core::cluster_barrier_peers(ctas[c % ctas.size()], ctas[other % ctas.size()], collective)) continue;
          auto* mine = static_cast<std::byte*>(scratch[c][s].raw_data());
          auto* theirs = static_cast<std::byte*>(scratch[other][s].raw_data());
          for (int64_t k = 0; k < scratch[c][s].size(); ++k) wave.barriers.at(mine + 8 * k).peers.push_back(theirs + 8 * k);
        }
    }
    for (size_t i = 0; i < operands.size(); ++i) {
      Array& a = operands[i];
      const auto* base = static_cast<const std::byte*>(a.raw_data());
      if (wave.buffers.count(base)) continue;  // an aliased input and output
      wave.buffers[base] = {base, a.size() * itemsize(a.dtype()), a.shape(), operand_name(i)};
    }
    for (size_t c = 0; c < wave_ctas; ++c)
      for (size_t s = 0; s < scratch[c].size(); ++s) {
        Array& a = scratch[c][s];
        if (gm.scratch_types[s].dtype == DType::GpuBarrier || gm.scratch_types[s].dtype == DType::Semaphore) continue;
        const auto* base = static_cast<const std::byte*>(a.raw_data());
        const std::vector<int64_t>& cta = cta_index[c];
        const std::string of_cta = cta.empty() ? std::string() : " of CTA " + tuple(cta, 0, cta.size());
        const ScratchUnionSlot& slot = gm.scratch_unions[s];
        if (slot.union_index < 0) {
          wave.buffers[base] = {base, a.size() * itemsize(a.dtype()), a.shape(), "scratch[" + std::to_string(s) + "]" + of_cta};
          continue;
        }
        // One buffer for the union (its arrays are consecutive scratch), named by them.
        if (s > 0 && gm.scratch_unions[s - 1].union_index == slot.union_index) continue;
        size_t last = s;
        while (last + 1 < scratch[c].size() && gm.scratch_unions[last + 1].union_index == slot.union_index) ++last;
        const std::byte* start = base - slot.offset;
        wave.buffers[start] = {start, slot.union_bytes, Shape{slot.union_bytes},
                               "the union of scratch[" + std::to_string(s) + ".." + std::to_string(last) +
                                   "] (bytes)" + of_cta,
                               true};
      }
    wave.next_actor = static_cast<int>(wave_threads);
    Turns turns(names);
    wave.turns = &turns;
    for (int t = 0; t < wave_threads; ++t) interps[t]->start(&wave, names[t]);
    auto body = [&](int t) { interps[t]->run(params[t], where[t]); };
    if (wave_threads == 1) {
      turns.run(0, [&] { body(0); });
    } else {
      std::vector<std::thread> threads;
      for (int t = 0; t < wave_threads; ++t) threads.emplace_back([&, t] { turns.run(t, [&] { body(t); }); });
      for (std::thread& th : threads) th.join();
    }
    turns.rethrow_error();
    // A copy into SMEM that no thread waited for: on a GPU the CTA could end (and its shared
    // memory go to the next CTA) while the copy lands.
    for (const auto& [at, m] : wave.multicasts) {
      const BarrierState& b = wave.barriers.at(at.first);
      throw Error("copy_gmem_to_smem with collective_axes: a multicast copy into barrier " + b.name + " has the shares of " +
                      std::to_string(m.count) + " of its " + std::to_string(m.landed.size()) +
                      " CTAs when the CTAs end (first issued by " + m.first_issuer +
                      "): every peer must issue its share, and a thread wait for the barrier",
                  m.first_loc);
    }
    for (const auto& [at, b] : wave.barriers) {
      const auto copy = unwaited_copy(b);
      if (!copy) continue;
      throw Error("copy_gmem_to_smem: the CTA ends before any of its threads waits for phase " +
                      std::to_string(copy->second) + " of barrier " + b.name +
                      ", which a copy to SMEM completes: on a GPU the copy may still be landing when the CTA "
                      "exits — wait for the barrier (barrier_wait) before the kernel ends",
                  copy->first);
    }
    // Each Pallas thread is a warpgroup: the registers its CTA's warpgroups end up asking for
    // must fit in what the CTA holds, or on a GPU an increase waits forever (the error names the
    // first warpgroup's increase past the entry).
    if (!wave.register_requests.empty()) {
      for (size_t c = 0; c < wave_ctas; ++c) {
        std::vector<int64_t> requests(static_cast<size_t>(num_threads), 0);
        std::vector<SourceLoc> where(requests.size());
        for (size_t w = 0; w < requests.size(); ++w)
          if (const auto it = wave.register_requests.find(static_cast<int>(c * requests.size() + w));
              it != wave.register_requests.end())
            std::tie(requests[w], where[w]) = it->second;
        size_t culprit = 0;
        if (const std::string e = eval::setmaxnreg_overflow(requests, &culprit); !e.empty()) throw Error(e, where[culprit]);
      }
    }
  }

  std::vector<Array> out(operands.begin() + num_in, operands.end());
  return out;
}

}  // namespace pallas::interpret
