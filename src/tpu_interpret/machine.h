// The simulated TPU: devices x cores, each core a thread running the kernel interpreter over
// its own buffers; HBM (and VMEM_SHARED) shared by a device's cores; a DMA engine; semaphores;
// barriers; a race detector (vector clocks) and a deadlock detector. One Machine per call: all
// state belongs to it, so nothing needs resetting after an error.
//
// Locking: `mu_` guards semaphores, DMA task queues, the buffer tables, thread states and the
// failure; each Buffer's own mutex serialises accesses to its contents (so a racy kernel is
// still a well-defined C++ program); the race detector has its own mutex; each Dma has one that
// makes its read and write steps run once. Lock order: Dma::mu -> Buffer::mu -> detector, and
// Dma::mu -> mu_; a kernel access holds only its buffer's lock (then the detector's).
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "core/call.h"
#include "eval/interpreter.h"
#include "pallas/tpu.h"
#include "tpu_interpret/races.h"

namespace pallas::tpu_interpret {

// One allocation: the contents and what the reports call it.
struct Buffer {
  int64_t id = 0;
  MemorySpace space = MemorySpace::Vmem;
  int device = 0;
  int core = -1;      // -1: shared by the device's cores (HBM, ANY, VMEM_SHARED)
  std::string name;   // "input x", "scratch 2", "run_scoped at k.cc:12"
  Array content;                 // buffer_bounds = "padded": padded to the TPU tile
  Shape logical;                 // the shape the program sees (== content's when not padded)
  std::vector<int64_t> strides;  // of `content`, row-major
  int64_t sem_base = -1;         // semaphore buffers: the id of element 0
  int refs = 1;                  // shared run_scoped allocations: cores still inside the scope
  std::mutex mu;                 // serialises accesses to `content`
  std::string description;       // "input x (hbm, device 0)": set once, when allocated
  const std::string& describe() const { return description; }
};
Buffer* buffer_of(const eval::RefValue& r);
// buffer_bounds = "padded": `shape` padded to the TPU tile of `dtype` (SMEM, semaphores and
// scalars are never padded). Rank >= 2: the last dim to a multiple of 128, the second-minor to
// a multiple of f, where f starts at the packing (4 / itemsize) and doubles while it is below
// min(second-minor, 8); rank 1: a multiple of 128 * packing.
Shape tile_padded(const Shape& shape, DType dtype, MemorySpace space);

// The thread executing one (device, core).
struct CoreThread {
  int device = 0, core = 0, gcid = 0;
  int sc_core = 0, subcore = 0;  // SparseCore vector meshes: core = sc_core * subcores + subcore
  int actor = 0;                 // race-detector actor (= gcid)
  int64_t next_buffer_id = 100;
  int64_t next_sem_id = 2000;
  VectorClock clock;                   // race detection: this core's vector clock
  std::vector<eval::RtValue> params;   // the kernel's Refs on this core
  std::vector<Buffer*> block_buffers;  // per block mapping: the kernel buffer (null: HBM)
  std::string name;                    // "device 0, core 1"
  // What the thread is doing, for the deadlock detector (guarded by Machine::mu_).
  enum class State { Running, WaitingSemaphore, WaitingBarrier, Done } state = State::Running;
  int64_t wait_sem = 0;
  int64_t wait_value = 0;
  SourceLoc wait_loc;
  std::string wait_what;
  int wait_barrier = -1;  // WaitingBarrier: the barrier group (-1: every thread)
};

struct Dma;

// A semaphore id's counts on every global core.
struct Semaphore {
  std::string name;
  DType kind = DType::Semaphore;
  std::vector<int64_t> count;                          // per global core
  std::vector<VectorClock> clock;                      // per global core (race detection)
  std::vector<std::vector<std::pair<std::shared_ptr<Dma>, bool>>> tasks;  // per core: (dma, write too?)
};

struct Dma {
  int64_t id = 0;
  int actor = -1;
  eval::RefValue src, dst;
  Buffer* src_buffer = nullptr;
  Buffer* dst_buffer = nullptr;
  int64_t recv_sem = -1, send_sem = -1;
  int recv_gcid = 0, send_gcid = 0;
  int64_t nbytes = 0;
  VectorClock clock;
  SourceLoc loc;
  std::string actor_name;  // dma_name(), set when races are detected or DMAs logged
  std::mutex mu;
  enum class State { Started, Read, Done } state = State::Started;
  Array staged;
  // Indirect DMAs: 1 gathers src rows `rows`, 2 scatters to dst rows `rows`; `add` accumulates.
  int indirect = 0;
  bool add = false;
  std::vector<int64_t> rows;
};

struct MachineConfig {
  tpu::InterpretParams params;
  tpu::Mesh mesh;                 // the devices
  int num_cores = 1;              // per device
  bool core_map = false;          // a core_map: grid = cores, no permutation
  // SparseCore meshes: "sc_scalar_subcore" or "sc_vector_subcore" (empty otherwise). A vector
  // mesh's threads are its subcores, `subcores_per_core` per SparseCore; VMEM_SHARED and
  // subcore_barrier are per SparseCore.
  std::string sc_kind;
  int subcores_per_core = 1;
  bool vector_subcore_mesh() const { return sc_kind == "sc_vector_subcore"; }
  std::optional<int> collective_id;
  std::vector<std::string> dimension_semantics;
};

class Machine {
 public:
  Machine(const TracedCall& call, MachineConfig cfg, const SourceLoc& call_loc);
  ~Machine();
  // args[d]: device d's operands (dynamic grid sizes excluded; `grid` is concrete).
  std::vector<std::vector<Array>> run(const std::vector<std::vector<Array>>& args,
                                      const std::vector<int64_t>& grid);

  // ---- Used by the core interpreters.
  const MachineConfig& config() const { return cfg_; }
  const TracedCall& call() const { return call_; }
  RaceDetector* races() { return races_.get(); }
  void check_failed();
  // Allocation (run_scoped and setup). `shared`: one buffer per device, ref-counted by cores.
  eval::RefValue allocate(CoreThread& t, const ir::Type& type, const std::string& name, bool shared);
  void release(const eval::RefValue& r);
  // Semaphores.
  int64_t semaphore_id(const eval::RefValue& sem_ref) const;
  void signal(CoreThread& t, int64_t sem, int target_gcid, int64_t inc, const SourceLoc& loc);
  void wait(CoreThread& t, int64_t sem, int64_t value, const SourceLoc& loc, const char* what);
  int64_t read_semaphore(CoreThread& t, int64_t sem);
  int64_t barrier_semaphore(const SourceLoc& loc);
  // DMAs.
  void dma_start(CoreThread& t, const eval::RefValue& src, const eval::RefValue& dst,
                 int64_t recv_sem, std::optional<int64_t> send_sem, int target_device,
                 const SourceLoc& loc);
  // A SparseCore gather (indirect = 1: dst[i] = src[rows[i]]) or scatter (2: dst[rows[i]] =
  // src[i]); `add`: += instead of =. `rows` are checked against the indexed side's major dim.
  void indirect_dma_start(CoreThread& t, const eval::RefValue& src, const eval::RefValue& dst,
                          int64_t recv_sem, int indirect, bool add, std::vector<int64_t> rows,
                          const SourceLoc& loc);
  // fetch_and_add(..., subcore_id) on a VectorSubcoreMesh: `view` of t's buffer, in the same
  // buffer of vector subcore `subcore` of t's SparseCore.
  eval::RefValue subcore_counterpart(CoreThread& t, const eval::RefValue& view, int64_t subcore,
                                     const SourceLoc& loc);
  // subcore_barrier(): the vector subcores of t's SparseCore.
  void subcore_barrier(CoreThread& t, const SourceLoc& loc);
  // Devices.
  int num_devices() const { return static_cast<int>(cfg_.mesh.num_devices()); }
  std::vector<int64_t> device_coords(int device) const;
  int device_from_coords(const std::vector<int64_t>& coords, const SourceLoc& loc) const;
  void log(const CoreThread& t, const char* kind, const std::string& line);
  // Race detection (when on): checks and records an access to `view` of buffer `b`; with
  // races_are_errors a race throws RaceError.
  void check_access(Buffer* b, const eval::RefValue& view, bool is_write, const VectorClock& clock,
                    const AccessInfo& who, bool atomic_add = false);
  bool logging(const char* kind) const;

 private:
  void run_core(CoreThread& t, const std::vector<int64_t>& grid);
  void fail(std::exception_ptr e, const std::string& where);
  void check_deadlock_locked();
  void barrier_all(CoreThread& t, const SourceLoc& loc);
  // Waits for the threads of barrier `group` (-1: every thread; else a SparseCore's vector
  // subcores); merges their clocks.
  void barrier(CoreThread& t, int group, const SourceLoc& loc, const char* what);
  // How many threads barrier `group` waits for.
  int barrier_members(int group) const { return group < 0 ? num_threads_ : cfg_.subcores_per_core; }
  // The semaphore `id`, created (named `name`, or by its id when null) if new. Under mu_.
  Semaphore& sem_locked(int64_t id, const char* name, DType kind);
  // `view` (of a buffer of this thread) in the buffer with the same id of (device, core); `what`
  // and `who` word the errors when there is none or it differs. Under mu_.
  eval::RefValue counterpart_locked(const eval::RefValue& view, int device, int core,
                                    const std::string& what, const std::string& who,
                                    const SourceLoc& loc);
  void execute_dma(const std::shared_ptr<Dma>& dma, bool write);
  // Registers a started DMA (id, clocks, semaphore queues) and runs it now in eager mode.
  void enqueue_dma(CoreThread& t, const std::shared_ptr<Dma>& dma);
  // Indirect DMAs' read and write steps (under the buffer's lock), row by row.
  void gather_rows(Dma& dma);
  void scatter_rows(Dma& dma);
  void copy_region(const eval::RefValue& src, Buffer* sb, const eval::RefValue& dst, Buffer* db,
                   int actor, const VectorClock* clock, const std::string& actor_name,
                   const std::string& what, const SourceLoc& loc);
  void check_exit_state();
  // "DMA 3 (started by device 0, core 1 at k.cc:12)"
  std::string dma_name(const Dma& d) const;

  const TracedCall& call_;
  MachineConfig cfg_;
  SourceLoc call_loc_;
  int num_threads_ = 0;
  std::vector<std::unique_ptr<CoreThread>> threads_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool failed_ = false;
  std::exception_ptr first_error_;
  std::string first_error_where_;
  std::unordered_map<int64_t, Semaphore> sems_;
  // Buffers by (device, core or -1, id).
  std::map<std::tuple<int, int, int64_t>, std::shared_ptr<Buffer>> buffers_;
  std::vector<std::shared_ptr<Dma>> dmas_;  // every DMA started (for the exit check)
  int64_t next_dma_id_ = 1;
  struct BarrierState {
    int arrived = 0;
    int64_t generation = 0;
  };
  std::map<int, BarrierState> barriers_;  // by group (-1: all threads; else a SparseCore)
  std::mutex recorder_mu_;
  std::mutex log_mu_;
  std::unique_ptr<RaceDetector> races_;
  std::vector<std::string> log_kinds_;  // logging_mode, split

  // Per-device call state, set up by run().
  struct DeviceState {
    std::vector<std::shared_ptr<Buffer>> operands;  // HBM buffer of each input and output
    std::vector<std::shared_ptr<Buffer>> prefetch;  // per core: scalar-prefetch SMEM buffers
  };
  std::vector<DeviceState> devices_;
  std::vector<Shape> padded_;                 // per block mapping
  std::vector<std::vector<int64_t>> low_;     // per block mapping
  std::vector<std::vector<int64_t>> perm_;    // per grid dim: the order of its indices
};

// Thrown inside a core when another core failed: unwinds quietly.
struct Cancelled {};

}  // namespace pallas::tpu_interpret
