// The TPU programming surface (pltpu): memory spaces, semaphores, DMAs, remote copies between
// devices, core meshes, and the SPMD entry point that runs a call on a mesh of simulated
// devices. Kernels using these run in the TPU interpret mode (.interpret = InterpretParams{}),
// a simulated TPU on the CPU; see docs/TPU_INTERPRET.md.
//
//   auto kernel = [](pl::Ref x_hbm, pl::Ref o, pl::Ref buf, pl::Ref sem) {
//     auto copy = pltpu::make_async_copy(x_hbm.at(pl::ds(pl::program_id(0) * 8, 8)), buf, sem);
//     copy.start();
//     copy.wait();
//     o[pl::all] = buf[pl::all] * 2.0f;
//   };
//   // in_specs = {pl::BlockSpec(pltpu::ANY)},
//   // scratch_shapes = {pltpu::VMEM({8, 128}, pl::f32), pltpu::semaphores(pltpu::SemaphoreType::DMA)}
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "pallas/pallas_call.h"

namespace pallas::tpu {

// ---- Memory spaces ----------------------------------------------------------------------------
// ANY / HBM: the device's main memory, shared by its cores; kernels reach it only through DMAs.
// VMEM: a core's vector memory. VMEM_SHARED: vector memory shared by a device's cores.
// SMEM: a core's scalar memory. SEMAPHORE: semaphores.
inline constexpr MemorySpace ANY = MemorySpace::Any;
inline constexpr MemorySpace HBM = MemorySpace::Hbm;
inline constexpr MemorySpace VMEM_SPACE = MemorySpace::Vmem;
inline constexpr MemorySpace VMEM_SHARED_SPACE = MemorySpace::VmemShared;
inline constexpr MemorySpace SMEM_SPACE = MemorySpace::Smem;
inline constexpr MemorySpace SEMAPHORE = MemorySpace::Semaphore;

// Scratch buffers in a memory space (for scratch_shapes and run_scoped).
inline ScratchShape VMEM(Shape shape, DType dtype) { return {std::move(shape), dtype, MemorySpace::Vmem}; }
inline ScratchShape VMEM_SHARED(Shape shape, DType dtype) {
  return {std::move(shape), dtype, MemorySpace::VmemShared};
}
inline ScratchShape SMEM(Shape shape, DType dtype) { return {std::move(shape), dtype, MemorySpace::Smem}; }
inline ScratchShape HBM_SCRATCH(Shape shape, DType dtype) {
  return {std::move(shape), dtype, MemorySpace::Hbm};
}

// ---- Semaphores -------------------------------------------------------------------------------
// REGULAR: signalled and waited on by kernels. DMA: counts the bytes DMAs deliver.
// BARRIER: the collective barrier semaphore (get_barrier_semaphore).
enum class SemaphoreType { REGULAR, DMA, BARRIER };
DType semaphore_dtype(SemaphoreType t);
// A scratch array of semaphores (shape {} for one).
inline ScratchShape semaphores(SemaphoreType t, Shape shape = {}) {
  return {std::move(shape), semaphore_dtype(t), MemorySpace::Semaphore};
}
inline ScopedAlloc scoped_semaphores(SemaphoreType t, Shape shape = {}) {
  return {std::move(shape), semaphore_dtype(t), MemorySpace::Semaphore};
}

// Which device a remote operation targets. MESH: coordinates in the device mesh (one per mesh
// axis, or named axes; unnamed axes keep the caller's coordinate). LOGICAL: the row-major id.
enum class DeviceIdType { MESH, LOGICAL };
struct DeviceId {
  std::vector<Operand> ids;
  std::vector<std::string> axes;  // empty: one id per mesh axis (or one logical id)
  DeviceId(Operand id) : ids{std::move(id)} {}
  DeviceId(const Value& id, Loc loc = Loc::current()) : ids{Operand(id, loc)} {}
  template <class T>
    requires std::is_integral_v<T>
  DeviceId(T id, Loc loc = Loc::current()) : ids{Operand(id, loc)} {}
  DeviceId(std::vector<Operand> coords) : ids(std::move(coords)) {}
  // {{"x", i}, {"y", j}}: coordinates along the named axes.
  static DeviceId named(std::vector<std::pair<std::string, Operand>> coords);
};

struct SignalOptions {
  std::optional<DeviceId> device_id;  // default: this device
  DeviceIdType device_id_type = DeviceIdType::MESH;
  std::optional<Operand> core_index;  // default: this core
};
// Adds `inc` to `sem` (on another device and/or core when given).
void semaphore_signal(const Ref& sem, Operand inc = 1, SignalOptions opts = {},
                      Loc loc = Loc::current());
// Blocks until `sem` >= value, then subtracts value.
void semaphore_wait(const Ref& sem, Operand value = 1, Loc loc = Loc::current());
// The semaphore's current count on this core.
Value semaphore_read(const Ref& sem, Loc loc = Loc::current());
// The barrier semaphore of CompilerParams.collective_id (a BARRIER semaphore of this core).
Ref get_barrier_semaphore(Loc loc = Loc::current());

// ---- Devices and cores --------------------------------------------------------------------------
// The index along a named axis: a device-mesh axis (this device's coordinate), a core_map
// axis (this core), or a named grid axis (the program id).
Value axis_index(const std::string& axis, Loc loc = Loc::current());

// ---- DMAs ---------------------------------------------------------------------------------------
// A copy between two Refs of the same shape and dtype (any memory spaces; views allowed). When
// it completes it adds its byte count to the receive semaphore (and, for remote copies, to the
// send semaphore once the source is read); waits wait for that byte count.
//
// SparseCore indirect DMAs: `src.at(indices)` (a gather, into VMEM) or `dst.at(indices)` (a
// scatter, from VMEM) pick rows of the HBM / VMEM_SHARED side's major dimension; the indices are
// a 1-D i32 Ref in VMEM or a 1-D i32 vector. With CopyOptions{.add = true} the copy adds into the
// destination (gather-add, scatter-add); adds of concurrent DMAs are atomic (docs/SPARSE_CORE.md).
struct CopyOptions {
  bool add = false;
};
class AsyncCopy {
 public:
  void start(Loc loc = Loc::current()) const;
  // Local copies: waits for the data to arrive. Remote copies: wait_send, then wait_recv.
  void wait(Loc loc = Loc::current()) const;
  void wait_send(Loc loc = Loc::current()) const;
  void wait_recv(Loc loc = Loc::current()) const;

  Ref src, dst, recv_sem;
  std::optional<Ref> send_sem;
  std::optional<DeviceId> device_id;
  DeviceIdType device_id_type = DeviceIdType::MESH;
  bool add = false;  // gather-add / scatter-add

 private:
  const Ref& direct_side() const;  // the side that is not indirectly indexed (for waits)
};
AsyncCopy make_async_copy(const Ref& src, const Ref& dst, const Ref& sem);
AsyncCopy make_async_copy(const Ref& src, const Ref& dst, const Ref& sem, CopyOptions opts);
AsyncCopy make_async_remote_copy(const Ref& src, const Ref& dst, const Ref& send_sem,
                                 const Ref& recv_sem, DeviceId device_id,
                                 DeviceIdType device_id_type = DeviceIdType::MESH);
// make_async_copy(...) and start.
AsyncCopy async_copy(const Ref& src, const Ref& dst, const Ref& sem, Loc loc = Loc::current());
AsyncCopy async_remote_copy(const Ref& src, const Ref& dst, const Ref& send_sem, const Ref& recv_sem,
                            DeviceId device_id, DeviceIdType device_id_type = DeviceIdType::MESH,
                            Loc loc = Loc::current());
AsyncCopy async_copy(const Ref& src, const Ref& dst, const Ref& sem, CopyOptions opts,
                     Loc loc = Loc::current());
// A copy that completes before returning (uses a scoped DMA semaphore).
void sync_copy(const Ref& src, const Ref& dst, Loc loc = Loc::current());
void sync_copy(const Ref& src, const Ref& dst, CopyOptions opts, Loc loc = Loc::current());

// ---- Core meshes --------------------------------------------------------------------------------
struct TensorCoreMesh {
  std::string axis_name = "core";
  int num_cores = 1;
};

namespace detail {
PallasCall make_core_map(KernelFn body, std::vector<ShapeDtype> out_shapes,
                         const TensorCoreMesh& mesh, CallOptions opts, const SourceLoc& loc);
}
// pl.kernel / core_map: runs `body` once on every core of the mesh. The body receives every
// input and output as a whole-array Ref in ANY (HBM), then the scratch Refs; axis_index(mesh
// axis) tells the core. Runs in the TPU interpret mode with num_cores_per_device = the mesh's.
template <class F>
PallasCall core_map(F body, std::vector<ShapeDtype> out_shapes, TensorCoreMesh mesh,
                    CallOptions opts = {}, Loc loc = Loc::current()) {
  return detail::make_core_map(pallas::detail::make_kernel_fn(std::move(body)),
                               std::move(out_shapes), mesh, std::move(opts), SourceLoc::from(loc));
}
// pl.kernel: the same as core_map.
template <class F>
PallasCall kernel(F body, std::vector<ShapeDtype> out_shapes, TensorCoreMesh mesh,
                  CallOptions opts = {}, Loc loc = Loc::current()) {
  return core_map(std::move(body), std::move(out_shapes), std::move(mesh), std::move(opts), loc);
}
// Runs `fn` only on core 0 of the core_map axis.
void run_on_first_core(const std::string& core_axis, const std::function<void()>& fn,
                       Loc loc = Loc::current());

// ---- SPMD over simulated devices --------------------------------------------------------------
// A named mesh of devices; logical device ids are row-major over the axes.
struct Mesh {
  std::vector<std::string> axis_names;
  std::vector<int64_t> shape;
  int64_t num_devices() const;
};
// Runs `call` (a TPU-interpret pallas_call or core_map) on every device of `mesh` at once:
// args[d] holds device d's operands (its shards); returns each device's outputs. Remote DMAs and
// remote semaphore signals move data between the devices.
std::vector<std::vector<Array>> run_on_mesh(const PallasCall& call, const Mesh& mesh,
                                            const std::vector<std::vector<Array>>& args);

// ---- Errors --------------------------------------------------------------------------------------
// Every live thread of the simulated machine waits for something that can no longer happen.
class DeadlockError : public Error {
 public:
  explicit DeadlockError(const std::string& what) : Error(what) {}
};
// A race was detected and InterpretParams.races_are_errors is set.
class RaceError : public Error {
 public:
  explicit RaceError(const std::string& what) : Error(what) {}
};

}  // namespace pallas::tpu
