// Device arrays (include/pallas/device_array.h): GPU memory (or the emulated device's host
// memory), DLPack both ways, and pallas_calls run on them with no host round trip.
#include "pallas/device_array.h"

#include <dlpack/dlpack.h>

#include <map>
#include <set>

#include "array/dlpack_layout.h"
#include "core/call.h"
#include "gpu/async_calls.h"
#include "gpu/backend.h"
#include "gpu/driver.h"
#include "gpu/host_emulation.h"
#include "ir/analysis.h"

namespace pallas::gpu {

// Exactly one of the three owns the memory.
struct DeviceArray::Storage {
  DeviceBuffer gpu;                      // allocated here, on the GPU
  Array host;                            // the emulated device's memory
  DLManagedTensor* imported = nullptr;   // from DLPack: its deleter runs with the last handle
  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage() {
    if (imported && imported->deleter) imported->deleter(imported);
  }
};

DeviceArray DeviceArray::over_host_memory(Array memory) {
  DeviceArray d;
  d.storage_ = std::make_shared<Storage>();
  d.storage_->host = std::move(memory);
  d.shape_ = d.storage_->host.shape();
  d.dtype_ = d.storage_->host.dtype();
  d.ptr_ = reinterpret_cast<uint64_t>(d.storage_->host.raw_data());
  return d;
}

DeviceArray DeviceArray::uninitialized(const ShapeDtype& s, bool on_gpu, void* stream) {
  if (!on_gpu) return over_host_memory(Array::uninitialized(s.shape, s.dtype));
  DeviceArray d;
  d.storage_ = std::make_shared<Storage>();
  d.shape_ = s.shape;
  d.dtype_ = s.dtype;
  d.on_gpu_ = true;
  d.storage_->gpu = DeviceBuffer(static_cast<size_t>(d.nbytes()), stream);
  d.ptr_ = d.storage_->gpu.ptr();
  return d;
}

DeviceArray DeviceArray::to_gpu(const Array& a, void* stream) {
  DeviceArray d = uninitialized(a.shape_dtype(), true, stream);
  if (d.nbytes() > 0) d.storage_->gpu.upload(a.raw_data(), static_cast<size_t>(d.nbytes()), stream);
  return d;
}

DeviceArray DeviceArray::emulated(const Array& a) { return over_host_memory(a.clone()); }

Array DeviceArray::emulated_memory() const {
  if (!storage_) throw Error("DeviceArray: an empty (default-constructed) device array has no memory");
  if (on_gpu_) throw Error("DeviceArray::emulated_memory: the array is in GPU memory (use to_host)");
  if (!storage_->imported) return storage_->host;
  return Array::wrap(reinterpret_cast<void*>(ptr_), shape_, dtype_, [keep = storage_] {});
}

Array DeviceArray::to_host(void* stream) const {
  if (!storage_) throw Error("DeviceArray::to_host: an empty (default-constructed) device array");
  if (!on_gpu_) {
    async_calls::raise_pending(stream);
    return emulated_memory().clone();
  }
  Array out = Array::uninitialized(shape_, dtype_);
  if (nbytes() > 0) copy_device_to_host(out.raw_data(), ptr_, static_cast<size_t>(nbytes()), stream);
  synchronize_stream(stream);  // (raising what the asynchronous calls before recorded)
  return out;
}

DLManagedTensor* DeviceArray::to_dlpack() const {
  if (!storage_) throw Error("DeviceArray::to_dlpack: an empty (default-constructed) device array");
  // The importer reads it on a stream of its own: what was queued to write it (an asynchronous
  // call) has finished first — a synchronizing point, raising what those calls recorded.
  synchronize_stream(storage_->gpu.last_stream());
  // The importer's work may be on any stream: the memory is freed only once the device is idle.
  if (on_gpu_) storage_->gpu.free_after_device_sync();
  return detail::export_dlpack(storage_, reinterpret_cast<void*>(ptr_),
                               on_gpu_ ? DLDevice{kDLCUDA, 0} : DLDevice{kDLCPU, 0}, shape_, dtype_);
}

DeviceArray DeviceArray::from_dlpack(DLManagedTensor* tensor) {
  // Until the end nothing takes ownership: on an error the caller still owns `tensor`.
  if (tensor == nullptr) throw Error("DeviceArray::from_dlpack: null tensor");
  const DLTensor& t = tensor->dl_tensor;
  const int type = t.device.device_type;
  if (type != kDLCUDA && type != kDLCPU)
    throw Error("DeviceArray::from_dlpack: tensor is on device type " + std::to_string(type) + " (" +
                detail::dlpack_device_name(type) + "); device arrays take kDLCUDA (or kDLCPU: emulated)");
  if (type == kDLCUDA && t.device.device_id != 0)
    throw Error("DeviceArray::from_dlpack: tensor is on CUDA device " + std::to_string(t.device.device_id) +
                "; the GPU backend runs on device 0");
  const detail::DlpackLayout l = detail::dlpack_layout(t);
  DeviceArray d;
  d.storage_ = std::make_shared<Storage>();
  d.storage_->imported = tensor;
  d.shape_ = l.shape;
  d.dtype_ = l.dtype;
  d.on_gpu_ = type == kDLCUDA;
  d.ptr_ = reinterpret_cast<uint64_t>(l.data);
  return d;
}

// call_on_device (`wait`) and call_on_device_async.
struct DeviceCalls {
  static std::vector<DeviceArray> run(const PallasCall& call, const std::vector<DeviceArray>& all_args, void* stream,
                                      bool wait);
};

std::vector<DeviceArray> DeviceCalls::run(const PallasCall& call, const std::vector<DeviceArray>& all_args,
                                          void* stream, bool wait) {
  PallasCallImpl& c = *call.impl();
  const std::string who = std::string(wait ? "call_on_device(" : "call_on_device_async(") + c.func_src_info() + ")";
  if (c.backend != "mosaic_gpu" && c.backend != "gpu_emulate")
    throw Error(who + ": device arrays run on the GPU backend (backend \"mosaic_gpu\") or its emulation "
                      "(\"gpu_emulate\"); this call's backend is \"" + c.backend + "\"",
                c.loc);
  const bool gpu = c.backend == "mosaic_gpu";
  std::vector<ShapeDtype> all_sig;
  for (size_t i = 0; i < all_args.size(); ++i) {
    if (!all_args[i].storage_)
      throw Error(who + ": argument " + std::to_string(i) + " is an empty (default-constructed) device array", c.loc);
    if (all_args[i].on_gpu() != gpu)
      throw Error(who + ": argument " + std::to_string(i) + " is in " +
                      (all_args[i].on_gpu() ? "GPU memory" : "the emulated device's (host) memory") +
                      " but the call runs " + (gpu ? "on the GPU (backend mosaic_gpu)" : "emulated (backend gpu_emulate)"),
                  c.loc);
    all_sig.push_back(all_args[i].shape_dtype());
  }
  // A vmapped call runs as its one batched kernel, on the arrays as they lie.
  if (c.vmap) transforms::check_vmapped_in_place(c, all_sig, who);
  // The leading dynamic grid sizes are read back to the host (on the GPU: waiting for `stream`).
  const size_t num_sizes = std::min(c.num_dynamic_grid_dims(), all_args.size());
  const std::vector<ShapeDtype> size_sig(all_sig.begin(), all_sig.begin() + static_cast<long>(num_sizes));
  const std::vector<ShapeDtype> sig(all_sig.begin() + static_cast<long>(num_sizes), all_sig.end());
  const std::vector<DeviceArray> args(all_args.begin() + static_cast<long>(num_sizes), all_args.end());
  std::vector<int64_t> grid;
  std::shared_ptr<const TracedCall> tc = c.prepare(
      size_sig, [&](size_t i) { return all_args[i].to_host(stream).scalar_at_flat(0).as_int64(); }, sig, grid);
  if (tc->gpu_kernel) check_compilable_kernel(*tc, c.loc);
  const GridMapping& gm = tc->grid_mapping;
  std::map<int, int> alias_of_output;
  for (auto [i, o] : tc->input_output_aliases) alias_of_output[o] = i;

  // The arrays are used on `stream` now: their memory goes back to the pool in its order, and an
  // export waits for it (emulated arrays keep the stream for that too).
  for (const DeviceArray& a : args) a.storage_->gpu.use_on(stream);

  if (!gpu) {
    std::vector<Array> host_args;
    for (const DeviceArray& a : args) host_args.push_back(a.emulated_memory());
    std::shared_ptr<const GeneratedKernel> k = emulated_kernel(c, *tc, grid);
    // (It runs now either way; without waiting, what it records waits for the stream's next
    // synchronizing point, as on the GPU. Waiting, an earlier asynchronous call's error comes first.)
    std::exception_ptr recorded;
    std::vector<Array> outs = run_host_emulation(*tc, *k, host_args, grid, emulation_threads(*k), nullptr, &recorded);
    async_calls::note_error(stream, recorded);
    if (wait) async_calls::raise_pending(stream);
    std::vector<DeviceArray> result;
    for (int o = 0; o < gm.num_outputs; ++o) {
      auto alias = alias_of_output.find(o);
      if (alias != alias_of_output.end()) {
        result.push_back(args[static_cast<size_t>(alias->second)]);  // updated in place
        continue;
      }
      result.push_back(DeviceArray::over_host_memory(outs[static_cast<size_t>(o)]));
      result.back().storage_->gpu.use_on(stream);
    }
    return result;
  }

  std::shared_ptr<const LoadedKernel> loaded = loaded_kernel(c, *tc, grid);
  // An input the kernel writes (and does not alias to an output) gets a private copy, as with
  // host arrays: the caller's array is not changed.
  const std::vector<bool> written = ir::params_written(tc->kernel);
  std::set<int> aliased_inputs;
  for (auto [i, o] : tc->input_output_aliases) aliased_inputs.insert(i);
  std::vector<DeviceArray> private_copies;
  std::vector<uint64_t> ptrs;
  for (size_t i = 0; i < args.size(); ++i) {
    if (i < written.size() && written[i] && !aliased_inputs.count(static_cast<int>(i))) {
      private_copies.push_back(DeviceArray::uninitialized(args[i].shape_dtype(), true, stream));
      if (args[i].nbytes() > 0)
        private_copies.back().storage_->gpu.copy_from(args[i].data_ptr(), static_cast<size_t>(args[i].nbytes()), stream);
      ptrs.push_back(private_copies.back().data_ptr());
    } else {
      ptrs.push_back(args[i].data_ptr());
    }
  }
  std::vector<DeviceArray> result;
  for (int o = 0; o < gm.num_outputs; ++o) {
    auto alias = alias_of_output.find(o);
    if (alias != alias_of_output.end()) {
      result.push_back(args[static_cast<size_t>(alias->second)]);
    } else {
      result.push_back(DeviceArray::uninitialized(gm.block_mappings[static_cast<size_t>(gm.num_inputs + o)].array, true, stream));
    }
    ptrs.push_back(result.back().data_ptr());
  }
  // Without waiting, the launch keeps the traced call, the kernel and every array it uses alive
  // until it is retired: a private copy (dropped here) or an array its caller drops must not be
  // freed under the running kernel where freeing is not stream-ordered (outside the pool).
  std::shared_ptr<const void> owner;
  if (!wait) {
    struct InFlight {
      std::shared_ptr<const TracedCall> tc;
      std::shared_ptr<const LoadedKernel> loaded;
      std::vector<DeviceArray> arrays;
    };
    auto in_flight = std::make_shared<InFlight>(InFlight{tc, loaded, args});
    in_flight->arrays.insert(in_flight->arrays.end(), private_copies.begin(), private_copies.end());
    in_flight->arrays.insert(in_flight->arrays.end(), result.begin(), result.end());
    owner = std::move(in_flight);
  }
  launch_generated(*tc, loaded->kernel, loaded->function, ptrs, grid, stream, std::move(owner));
  return result;
}

std::vector<DeviceArray> call_on_device(const PallasCall& call, const std::vector<DeviceArray>& args, void* stream) {
  return DeviceCalls::run(call, args, stream, /*wait=*/true);
}

std::vector<DeviceArray> call_on_device_async(const PallasCall& call, const std::vector<DeviceArray>& args,
                                              void* stream) {
  return DeviceCalls::run(call, args, stream, /*wait=*/false);
}

void synchronize(void* stream) { synchronize_stream(stream); }

}  // namespace pallas::gpu
