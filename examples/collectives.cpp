// Examples `right_permute`, `all_gather`, `all_reduce` and `reduce_scatter`: collectives over a
// 1-D ring of simulated TPU devices (pltpu::run_on_mesh, mesh axis "x"), written with remote
// DMAs and semaphores. Each device holds a (size, 128) shard; the Problem's inputs and outputs
// are the devices' arrays stacked along rows.
//
// The rules every kernel here follows (and which --detect-races checks):
// * Handshake first: each device tells both neighbours, on the barrier semaphore, that it has
//   entered the kernel, and waits for both: no DMA lands in a device that is not there yet.
// * A DMA semaphore counts bytes, so two copies in flight on one semaphore would be ambiguous (a
//   wait could be satisfied by the wrong one). Each receive buffer therefore has its own DMA
//   semaphore, and a buffer is refilled only after its previous copy was waited for.
// * A device never overwrites a buffer its neighbour still reads: a receiver hands its sender
//   a credit (a remote semaphore_signal on a REGULAR semaphore) once it is done with a slot,
//   and the sender waits for that credit before sending into the slot again.
// TPU interpret mode only.
#include "examples/registry.h"
#include "examples/support.h"

namespace pallas::examples {
namespace {

namespace pl = ::pallas;
namespace pltpu = ::pallas::tpu;

constexpr int kDefaultDevices = 4;
constexpr int64_t kDefaultRows = 8;
constexpr int64_t kCols = 128;
const char* const kAxis = "x";

// This device's place in the ring of n devices.
struct Ring {
  int64_t n;
  pl::Value me, left, right;
};

Ring ring(int64_t n) {
  const pl::Value me = pltpu::axis_index(kAxis);
  return {n, me, (me + (n - 1)) % n, (me + 1) % n};
}

// Tells both neighbours "I am in the kernel" and waits until both have said so (for n = 2 they
// are the same device, which then signals twice: the count is still 2).
void handshake(const Ring& r) {
  const pl::Ref barrier = pltpu::get_barrier_semaphore();
  pltpu::semaphore_signal(barrier, 1, {.device_id = pltpu::DeviceId(r.left)});
  pltpu::semaphore_signal(barrier, 1, {.device_id = pltpu::DeviceId(r.right)});
  pltpu::semaphore_wait(barrier, 2);
}

// One direction of a double-buffered ring pass. `slots` is a VMEM {2, rows, cols} scratch: at
// step s the device sends slot (s + 1) % 2 to `to`'s slot s % 2 and receives `from`'s into its
// own slot s % 2, so slot 1 must hold what step 0 sends.
struct Direction {
  pl::Ref slots, send_sem, recv_sems /* DMA {2} */, credit /* REGULAR */;
  pl::Value to, from;
};

// Runs the n - 1 steps of every direction in lock step (all DMAs of a step in flight together);
// `received(d, s, slot)` is called once direction d's data of step s sits in `slot`. It may
// update the slot in place: the slot is sent on at step s + 1.
//
// Credits: at step s this device fills `to`'s slot s % 2, the slot `to` sent from at step s - 1.
// So every step s >= 1 first waits for a credit from `to`, which `to` grants once its step s - 1
// send has read the slot (after wait_send): each device ends every step s <= n - 3 by granting
// one to `from` (n - 2 credits granted and taken per device and direction).
void ring_pass(int64_t n, const std::vector<Direction>& dirs,
               const std::function<void(size_t, const pl::Value&, const pl::Ref&)>& received) {
  pl::fori_loop(0, n - 1, [&](pl::Value s) {
    const pl::Value slot = s % 2, prev = 1 - slot;
    auto copy = [&](const Direction& d) {
      return pltpu::make_async_remote_copy(d.slots.at(prev), d.slots.at(slot), d.send_sem,
                                           d.recv_sems.at(slot), pltpu::DeviceId(d.to));
    };
    for (const Direction& d : dirs) pl::when(s >= 1, [&] { pltpu::semaphore_wait(d.credit, 1); });
    for (const Direction& d : dirs) copy(d).start();
    for (size_t i = 0; i < dirs.size(); ++i) {
      const Direction& d = dirs[i];
      copy(d).wait_recv();  // `from`'s data of step s is in our slot
      received(i, s, d.slots.at(slot));
      copy(d).wait_send();  // our slot `prev` has been read: `from` may refill it
      pl::when(s <= n - 3, [&] {
        pltpu::semaphore_signal(d.credit, 1, {.device_id = pltpu::DeviceId(d.from)});
      });
    }
  });
}

// The CallOptions every collective shares: the backend's, plus a collective id (for the barrier
// semaphore; with one, the simulator also drops its implicit barrier at the start of the call,
// so the handshake above is what orders the devices). Any id would do.
constexpr int kCollectiveId = 0;
CallOptions collective_options(CallOptions o, const RunOptions& opts) {
  o.compiler_params = pltpu::CompilerParams{.collective_id = kCollectiveId};
  return on_backend(std::move(o), opts);
}

// What the collectives share in their Problem: the TPU-only check, the ring size and the shard.
struct Setup {
  int64_t n, rows;
  DType dtype;
};
Setup setup(const std::string& name, const RunOptions& opts, std::initializer_list<DType> dtypes) {
  require_tpu_interpret(name, opts);
  require_dtype(name, opts, dtypes);
  return {devices_or_default(name, opts, kDefaultDevices, 2),
          size_or_default(name, opts, kDefaultRows), opts.dtype};
}

// Device d's shard of a stacked array.
std::vector<double> shard(const std::vector<double>& all, int64_t d, int64_t shard_size) {
  return {all.begin() + d * shard_size, all.begin() + (d + 1) * shard_size};
}

Problem collective_problem(const std::string& name, const Setup& s, const RunOptions& opts,
                           pl::PallasCall call, Shape global_in, Shape shard_in,
                           std::function<std::vector<Array>(const std::vector<Array>&)> reference,
                           int64_t bytes_moved) {
  return Problem{
      .name = name,
      .signature = std::string(dtype_name(s.dtype)) + dims(shard_in) + " on " +
                   std::to_string(s.n) + " devices",
      .backend = opts.backend,
      .call = call,
      .inputs = {Array::random_normal(global_in, s.dtype, input_seed(opts, 0))},
      .reference = std::move(reference),
      .runner = mesh_runner(call, kAxis, s.n),
      .call_arg_shapes = {ShapeDtype(shard_in, s.dtype)},
      // Data movement is exact; the sums add n f32 terms in a different order than the reference.
      .tolerance = {1e-5, 1e-5 * static_cast<double>(s.n)},
      .flops = 0,
      .bytes = bytes_moved,
      .throughput = Throughput::Bytes,
  };
}

}  // namespace

// ---- right_permute: device d's shard goes to device d + 1 ---------------------------------------
namespace right_permute {
namespace {

void kernel(int64_t n, const pl::Ref& x, const pl::Ref& out, const pl::Ref& send_sem,
            const pl::Ref& recv_sem) {
  const Ring r = ring(n);
  handshake(r);
  auto copy = pltpu::make_async_remote_copy(x, out, send_sem, recv_sem, pltpu::DeviceId(r.right));
  copy.start();
  copy.wait();  // our x has been read, and our left neighbour's x has arrived in our out
}

Problem build(const RunOptions& opts) {
  const Setup s = setup("right_permute", opts, {DType::F32, DType::BF16});
  const int64_t n = s.n, rows = s.rows;
  pl::PallasCall call = pl::pallas_call(
      [n](pl::Ref x, pl::Ref o, pl::Ref ss, pl::Ref rs) { kernel(n, x, o, ss, rs); },
      pl::ShapeDtype({rows, kCols}, s.dtype),
      collective_options({.in_specs = {pl::BlockSpec(pltpu::ANY)},
                          .out_specs = {pl::BlockSpec(pltpu::ANY)},
                          .scratch_shapes = {pltpu::semaphores(pltpu::SemaphoreType::DMA),
                                             pltpu::semaphores(pltpu::SemaphoreType::DMA)},
                          .name = "right_permute"},
                         opts));
  auto reference = [n, rows](const std::vector<Array>& in) {
    const std::vector<double> x = in[0].to_doubles();
    const int64_t m = rows * kCols;
    std::vector<double> out;
    for (int64_t d = 0; d < n; ++d) {
      const std::vector<double> from = shard(x, (d + n - 1) % n, m);
      out.insert(out.end(), from.begin(), from.end());
    }
    return std::vector<Array>{Array::from_values(in[0].shape(), DType::F64, out)};
  };
  return collective_problem("right_permute", s, opts, call, {n * rows, kCols}, {rows, kCols},
                            reference, n * rows * kCols * itemsize(s.dtype));
}

}  // namespace

Example example() {
  return {"right_permute",
          "each device sends its (size, 128) shard to its right ring neighbour (--devices, "
          "tpu-interpret)",
          build, /*multi_device=*/true};
}

}  // namespace right_permute

// ---- all_gather: every device ends with every shard, in device order ------------------------------
// Ring: at step s device d forwards chunk (d - s) of its output, which it owns (s = 0) or
// received at step s - 1, into the same chunk of its right neighbour's output. Every chunk of the
// output is written once, so no credits are needed; each chunk has its own receive semaphore,
// since a fast left neighbour may have several chunks in flight towards us.
namespace all_gather {
namespace {

void kernel(int64_t n, int64_t rows, const pl::Ref& x, const pl::Ref& out, const pl::Ref& send_sem,
            const pl::Ref& recv_sems) {
  const Ring r = ring(n);
  handshake(r);
  pltpu::sync_copy(x, out.at(pl::ds(r.me * rows, rows)));
  pl::fori_loop(0, n - 1, [&](pl::Value s) {
    // The chunk we forward, and the one our left neighbour forwards to us at this step.
    const pl::Value send_chunk = (r.me + (n - s)) % n;
    const pl::Value recv_chunk = (r.me + (n - 1 - s)) % n;
    auto chunk_copy = [&](const pl::Value& c) {
      const pl::Ref part = out.at(pl::ds(c * rows, rows));
      return pltpu::make_async_remote_copy(part, part, send_sem, recv_sems.at(c),
                                           pltpu::DeviceId(r.right));
    };
    chunk_copy(send_chunk).start();
    chunk_copy(recv_chunk).wait_recv();
    chunk_copy(send_chunk).wait_send();
  });
}

Problem build(const RunOptions& opts) {
  const Setup s = setup("all_gather", opts, {DType::F32, DType::BF16});
  const int64_t n = s.n, rows = s.rows;
  pl::PallasCall call = pl::pallas_call(
      [n, rows](pl::Ref x, pl::Ref o, pl::Ref ss, pl::Ref rs) { kernel(n, rows, x, o, ss, rs); },
      pl::ShapeDtype({n * rows, kCols}, s.dtype),
      collective_options({.in_specs = {pl::BlockSpec(pltpu::ANY)},
                          .out_specs = {pl::BlockSpec(pltpu::ANY)},
                          .scratch_shapes = {pltpu::semaphores(pltpu::SemaphoreType::DMA),
                                             pltpu::semaphores(pltpu::SemaphoreType::DMA, {n})},
                          .name = "all_gather"},
                         opts));
  auto reference = [n](const std::vector<Array>& in) {
    const std::vector<double> x = in[0].to_doubles();
    std::vector<double> out;
    for (int64_t d = 0; d < n; ++d) out.insert(out.end(), x.begin(), x.end());
    return std::vector<Array>{Array::from_values({n * in[0].dim(0), kCols}, DType::F64, out)};
  };
  return collective_problem("all_gather", s, opts, call, {n * rows, kCols}, {rows, kCols},
                            reference, n * (n - 1) * rows * kCols * itemsize(s.dtype));
}

}  // namespace

Example example() {
  return {"all_gather",
          "ring all-gather of (size, 128) shards straight into every device's output "
          "(--devices, tpu-interpret)",
          build, /*multi_device=*/true};
}

}  // namespace all_gather

// ---- all_reduce: every device ends with the sum of all shards --------------------------------------
// Ring: each device forwards the shard it received at the step before (its own at step 0) to its
// right neighbour and adds what it receives to its sum; after n - 1 steps every device has added
// every shard. Two receive slots with credits (ring_pass).
namespace all_reduce {
namespace {

void kernel(int64_t n, const pl::Ref& x, const pl::Ref& out, const pl::Ref& slots,
            const pl::Ref& send_sem, const pl::Ref& recv_sems, const pl::Ref& credit) {
  const Ring r = ring(n);
  handshake(r);
  out[pl::all] = x[pl::all];
  slots.at(1)[pl::all] = x[pl::all];  // what step 0 sends
  ring_pass(n, {Direction{slots, send_sem, recv_sems, credit, r.right, r.left}},
            [&](size_t, const pl::Value&, const pl::Ref& got) { out[pl::all] += got[pl::all]; });
}

Problem build(const RunOptions& opts) {
  const Setup s = setup("all_reduce", opts, {DType::F32});
  const int64_t n = s.n, rows = s.rows;
  pl::PallasCall call = pl::pallas_call(
      [n](pl::Ref x, pl::Ref o, pl::Ref slots, pl::Ref ss, pl::Ref rs, pl::Ref credit) {
        kernel(n, x, o, slots, ss, rs, credit);
      },
      pl::ShapeDtype({rows, kCols}, pl::f32),
      collective_options({.scratch_shapes = {pltpu::VMEM({2, rows, kCols}, pl::f32),
                                             pltpu::semaphores(pltpu::SemaphoreType::DMA),
                                             pltpu::semaphores(pltpu::SemaphoreType::DMA, {2}),
                                             pltpu::semaphores(pltpu::SemaphoreType::REGULAR)},
                          .name = "all_reduce"},
                         opts));
  auto reference = [n, rows](const std::vector<Array>& in) {
    const std::vector<double> x = in[0].to_doubles();
    const int64_t m = rows * kCols;
    std::vector<double> sum(static_cast<size_t>(m), 0.0), out;
    for (int64_t d = 0; d < n; ++d)
      for (int64_t k = 0; k < m; ++k) sum[k] += x[d * m + k];
    for (int64_t d = 0; d < n; ++d) out.insert(out.end(), sum.begin(), sum.end());
    return std::vector<Array>{Array::from_values(in[0].shape(), DType::F64, out)};
  };
  return collective_problem("all_reduce", s, opts, call, {n * rows, kCols}, {rows, kCols},
                            reference, n * (n - 1) * rows * kCols * 4);
}

}  // namespace

Example example() {
  return {"all_reduce",
          "ring all-reduce (sum) of (size, 128) f32 shards, double-buffered with credits "
          "(--devices, tpu-interpret)",
          build, /*multi_device=*/true};
}

}  // namespace all_reduce

// ---- reduce_scatter: device d ends with chunk d of the sum -----------------------------------------
// Each device holds n chunks of (size, 128); device d's result is the sum over devices of their
// chunk d. Bidirectional: the left half of the columns travels right around the ring, the right
// half travels left, so both links of every device carry data at each step. In direction dir
// (+1: right, -1: left) step s sends the partial sum of chunk d - dir * (s + 1) and receives that
// of chunk d - dir * (s + 2), to which the device adds its own part; after n - 1 steps the
// received chunk is d itself, complete.
namespace reduce_scatter {
namespace {

void kernel(int64_t n, int64_t rows, const pl::Ref& x, const pl::Ref& out, const pl::Ref& slots_r,
            const pl::Ref& slots_l, const pl::Ref& send_sems, const pl::Ref& recv_sems_r,
            const pl::Ref& recv_sems_l, const pl::Ref& credits) {
  const Ring r = ring(n);
  const int64_t half = kCols / 2;
  const int64_t dir_of[2] = {+1, -1};
  const int64_t col_of[2] = {0, half};
  // Our part of chunk `c` in direction i's half of the columns.
  auto own = [&](size_t i, const pl::Value& c) {
    return x(pl::ds(c * rows, rows), pl::ds(col_of[i], half));
  };
  // (me - dir * k) mod n, for 0 <= k <= n.
  auto chunk = [&](size_t i, const pl::Operand& k) {
    return dir_of[i] > 0 ? (r.me + n - k) % n : (r.me + k) % n;
  };
  handshake(r);
  const Direction dirs[2] = {
      {slots_r, send_sems.at(0), recv_sems_r, credits.at(0), r.right, r.left},
      {slots_l, send_sems.at(1), recv_sems_l, credits.at(1), r.left, r.right}};
  for (size_t i = 0; i < 2; ++i) dirs[i].slots.at(1)[pl::all] = own(i, chunk(i, 1));
  ring_pass(n, {dirs[0], dirs[1]}, [&](size_t i, const pl::Value& s, const pl::Ref& got) {
    got[pl::all] += own(i, chunk(i, s + 2));
  });
  // The last step (n - 2) received the complete sum of our own chunk.
  for (size_t i = 0; i < 2; ++i)
    out(pl::all, pl::ds(col_of[i], half)) = dirs[i].slots.at((n - 2) % 2)[pl::all];
}

Problem build(const RunOptions& opts) {
  const Setup s = setup("reduce_scatter", opts, {DType::F32});
  const int64_t n = s.n, rows = s.rows, half = kCols / 2;
  pl::PallasCall call = pl::pallas_call(
      [n, rows](pl::Ref x, pl::Ref o, pl::Ref sr, pl::Ref sl, pl::Ref ss, pl::Ref rr, pl::Ref rl,
                pl::Ref credits) { kernel(n, rows, x, o, sr, sl, ss, rr, rl, credits); },
      pl::ShapeDtype({rows, kCols}, pl::f32),
      collective_options(
          {.scratch_shapes = {pltpu::VMEM({2, rows, half}, pl::f32),
                              pltpu::VMEM({2, rows, half}, pl::f32),
                              pltpu::semaphores(pltpu::SemaphoreType::DMA, {2}),
                              pltpu::semaphores(pltpu::SemaphoreType::DMA, {2}),
                              pltpu::semaphores(pltpu::SemaphoreType::DMA, {2}),
                              pltpu::semaphores(pltpu::SemaphoreType::REGULAR, {2})},
           .name = "reduce_scatter"},
          opts));
  auto reference = [n, rows](const std::vector<Array>& in) {
    const std::vector<double> x = in[0].to_doubles();
    const int64_t m = rows * kCols;  // one chunk
    std::vector<double> out(static_cast<size_t>(n * m), 0.0);
    for (int64_t e = 0; e < n; ++e)      // the device contributing
      for (int64_t d = 0; d < n; ++d)    // the chunk (= the device receiving it)
        for (int64_t k = 0; k < m; ++k) out[d * m + k] += x[(e * n + d) * m + k];
    return std::vector<Array>{Array::from_values({n * rows, kCols}, DType::F64, out)};
  };
  return collective_problem("reduce_scatter", s, opts, call, {n * n * rows, kCols},
                            {n * rows, kCols}, reference, n * (n - 1) * rows * kCols * 4);
}

}  // namespace

Example example() {
  return {"reduce_scatter",
          "bidirectional ring reduce-scatter (sum): half of each chunk goes left, half right "
          "(--devices, tpu-interpret)",
          build, /*multi_device=*/true};
}

}  // namespace reduce_scatter

}  // namespace pallas::examples
