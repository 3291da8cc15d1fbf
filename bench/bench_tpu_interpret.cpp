// The TPU interpret mode: a blocked matmul next to the reference interpreter running the same
// kernel (with and without race detection), the cost of one DMA start+wait pair, a ring
// all-gather over 8 simulated devices, and the simulator's peak memory.
#include <malloc.h>

#include <fstream>
#include <iomanip>
#include <sstream>
#include <string>

#include "bench/bench.h"
#include "examples/examples.h"
#include "pallas/pallas.h"
#include "pallas/tpu.h"

namespace pl = pallas;
namespace pltpu = pallas::tpu;

namespace {

// `pairs` DMA start+wait pairs of an (8, 128) f32 block from HBM into VMEM.
pl::PallasCall dma_pairs(int pairs, const std::string& dma_mode) {
  auto kernel = [pairs](pl::Ref x_hbm, pl::Ref o, pl::Ref buf, pl::Ref sem) {
    pl::fori_loop(0, pairs, [&](pl::Value) {
      auto c = pltpu::make_async_copy(x_hbm, buf, sem);
      c.start();
      c.wait();
    });
    o[pl::all] = buf[pl::all];
  };
  pltpu::InterpretParams p;
  p.dma_execution_mode = dma_mode;
  return pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32),
                         {.in_specs = {pl::BlockSpec(pltpu::ANY)},
                          .scratch_shapes = {pltpu::VMEM({8, 128}, pl::f32),
                                             pltpu::semaphores(pltpu::SemaphoreType::DMA)},
                          .interpret = p});
}

// Peak resident memory (VmHWM) in bytes, after resetting it; Linux only.
void reset_peak_memory() {
  std::ofstream("/proc/self/clear_refs") << "5";
}
int64_t status_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field, 0) == 0) {
      std::istringstream ss(line.substr(std::string(field).size()));
      int64_t kib = 0;
      ss >> kib;
      return kib;
    }
  return -1;
}

}  // namespace

void bench_tpu_interpret(std::ostream& report) {
  const int64_t n = 1024, b = 256;
  pl::Array x = pl::Array::random_normal({n, n}, pl::f32, 1);
  pl::Array y = pl::Array::random_normal({n, n}, pl::f32, 2);
  const double flops = 2.0 * n * n * n;
  pltpu::InterpretParams plain;
  pltpu::InterpretParams racy = plain;
  racy.detect_races = true;
  pl::PallasCall ref_call = bench::blocked_matmul(n, b, true);
  pl::PallasCall tpu_call = bench::blocked_matmul(n, b, plain);
  pl::PallasCall race_call = bench::blocked_matmul(n, b, racy);
  // Interleaved rounds, so a slow phase of the machine hits all three alike.
  std::vector<double> t_ref, t_tpu, t_race;
  for (int round = 0; round < 5; ++round) {
    t_ref.push_back(bench::median_seconds(1, [&] { ref_call(x, y); }));
    t_tpu.push_back(bench::median_seconds(1, [&] { tpu_call(x, y); }));
    t_race.push_back(bench::median_seconds(1, [&] { race_call(x, y); }));
  }
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  double r = med(t_ref), t = med(t_tpu), rr = med(t_race);
  report << "| blocked matmul 1024^3 f32, 256 blocks (grid 4x4x4) | time | GFLOP/s | speed vs reference |\n"
         << "|---|---|---|---|\n"
         << std::fixed;
  auto row = [&](const char* what, double secs) {
    report << "| " << what << " | " << std::setprecision(1) << secs * 1e3 << " ms | "
           << flops / secs * 1e-9 << " | " << std::setprecision(0) << 100.0 * r / secs << "% |\n";
  };
  row("reference interpreter", r);
  row("TPU interpret, 1 core", t);
  row("TPU interpret, 1 core, detect_races", rr);
  report << "\nRace detection slowdown: " << std::setprecision(2) << rr / t << "x (target <= 3x).\n";

  report << "\n| DMA start+wait of an (8,128) f32 block, HBM -> VMEM | us per pair | target |\n|---|---|---|\n";
  for (const char* mode : {"eager", "on_wait"}) {
    pl::PallasCall few = dma_pairs(1, mode), many = dma_pairs(1001, mode);
    pl::Array src = pl::Array::random_normal({8, 128}, pl::f32, 4);
    double t1 = bench::median_seconds(9, [&] { few(src); });
    double t2 = bench::median_seconds(9, [&] { many(src); });
    report << "| " << mode << " | " << std::setprecision(2) << (t2 - t1) / 1000 * 1e6 << " | <= 5 |\n";
  }

  // Ring all-gather on 8 devices of 1 MiB shards (the bundled example), with peak memory.
  namespace ex = pallas::examples;
  ex::RunOptions opts;
  opts.backend = "tpu-interpret";
  opts.devices = 8;
  opts.size = 2048;  // (2048, 128) f32 shards = 1 MiB
  ex::Problem p = ex::find("all_gather").build(opts);
  ex::Outcome warm = ex::run(p);
  if (!warm.ok) {
    report << "\nall_gather FAILED: " << warm.message << "\n";
    return;
  }
  double secs = bench::median_seconds(5, [&] { ex::execute(p); });
  // Peak memory of one call: freed heap goes back to the system first, so the growth of the
  // resident set over the call is what the call itself holds at its peak (the simulated
  // devices' HBM, kernel buffers, DMA staging, and the outputs it returns).
  malloc_trim(0);
  const int64_t before = status_kib("VmRSS:");
  reset_peak_memory();
  ex::execute(p);
  const int64_t peak = status_kib("VmHWM:");
  const double shard = 1 << 20;
  const double moved = 8 * 7 * shard;  // each device receives the 7 other shards
  const double operands = 8 * (shard + 8 * shard);  // per device: its shard in, the gather out
  report << "\n| ring all-gather, 8 devices, 1 MiB f32 shards | value |\n|---|---|\n"
         << "| wall time per call | " << std::setprecision(1) << secs * 1e3 << " ms |\n"
         << "| bytes moved by simulated DMAs per call | " << std::setprecision(0) << moved / shard
         << " MiB |\n"
         << "| simulated bandwidth | " << std::setprecision(2) << moved / secs / 1e9 << " GB/s |\n"
         << "| operands' bytes (8 x (1 MiB in + 8 MiB out)) | " << std::setprecision(0)
         << operands / shard << " MiB |\n"
         << "| peak RSS growth during one call | " << (peak - before) / 1024
         << " MiB (" << std::setprecision(2) << (peak - before) * 1024.0 / operands
         << "x the operands) |\n";
}
