// gpu::Semaphore (Mosaic GPU's SemaphoreType.REGULAR) in its two scopes: the CTA's own counters
// (scratch_shapes, run_scoped), which order its Pallas threads, and the whole grid's
// (pl::get_global), which order CTAs. The grid's kernels here only work when CTAs run at the same
// time and the semaphores order what they write: values are checked against plain C++ loops, and
// the misuse cases (a wait that nothing satisfies, a missing wait, a negative count, a grid too
// large to be resident) against the errors' text.
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/call.h"
#include "gpu/codegen.h"
#include "gpu/cuda_libs.h"
#include "pallas/gpu.h"
#include "pallas/pallas.h"
#include "pallas/tpu.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

namespace pl = pallas;
namespace plgpu = pallas::gpu;
using test_util::error_of;

namespace {

using test_util::run_on;

pl::Array random_f32(pl::Shape s, uint64_t seed) { return pl::Array::random_normal(std::move(s), pl::f32, seed); }

class GpuSemaphore : public test_util::OnGpuBackends {};
INSTANTIATE_TEST_SUITE_P(Backends, GpuSemaphore, testing::Values("interpret", "gpu_emulate", "mosaic_gpu"),
                         test_util::backend_name);

constexpr int kCtas = 4, kChunk = 8;

// A suffix sum over chunks, computed from the last CTA to the first: CTA i waits until CTA i + 1
// has written its chunk of `out` and signalled sems[i], adds x's chunk to it, and signals CTA
// i - 1. CTA 0 waits first and the last CTA never waits, so this finishes only when the CTAs run
// at the same time; the reads of another CTA's chunk are ordered by the semaphores (no race).
void suffix_sum_body(const pl::Ref& x, const pl::Ref& out, const pl::Ref& sems, bool wait) {
  pl::Value i = plgpu::axis_index("i");
  pl::Value mine = i * kChunk;
  pl::when(i == kCtas - 1, [&] { out[pl::ds(mine, kChunk)] = x[pl::ds(mine, kChunk)]; });
  pl::when(i < kCtas - 1, [&] {
    if (wait) plgpu::semaphore_wait(sems.at(i));
    out[pl::ds(mine, kChunk)] = x[pl::ds(mine, kChunk)] + out[pl::ds(mine + kChunk, kChunk)];
  });
  pl::when(i > 0, [&] { plgpu::semaphore_signal(sems.at(i - 1)); });
}

pl::PallasCall suffix_sum(const std::string& how, bool wait) {
  return plgpu::kernel(
      [wait](pl::Ref x, pl::Ref out) {
        suffix_sum_body(x, out, pl::get_global(plgpu::Semaphore{.shape = {kCtas}}), wait);
      },
      {pl::ShapeDtype({kCtas * kChunk}, pl::f32)}, plgpu::Mesh{.grid = {kCtas}, .grid_names = {"i"}}, run_on(how, {}));
}

void expect_suffix_sums(const pl::Array& x, const pl::Array& out) {
  for (int e = 0; e < kChunk; ++e) {
    float want = 0;
    for (int c = kCtas - 1; c >= 0; --c) {
      want += x.data<float>()[c * kChunk + e];  // the kernel's order of the sums
      EXPECT_EQ(out.data<float>()[c * kChunk + e], want) << c << "," << e;
    }
  }
}

TEST_P(GpuSemaphore, CtasWaitForEachOtherInReverseOrder) {
  pl::Array x = random_f32({kCtas * kChunk}, 3);
  pl::PallasCall call = suffix_sum(GetParam(), true);
  expect_suffix_sums(x, call(x)[0]);
  expect_suffix_sums(x, call(x)[0]);  // 0 again at the start of the next call
}

// Each get_global is a new semaphore of the grid; the scratch_shapes one is each CTA's own: CTA 1
// signals its scratch semaphore 5 times and the first global one 3 times; CTA 0 waits for the
// global one and reads the counts it can see — its own scratch semaphore, which CTA 1's signals
// did not reach, is 0 (as the second global one, never signalled) — and CTA 1 reads its own
// scratch semaphore, 5.
TEST_P(GpuSemaphore, EachGetGlobalIsANewSemaphoreOfTheGridAndScratchOnesAreTheCtas) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref out, pl::Ref declared) {
        pl::Value i = plgpu::axis_index("i");
        pl::Ref first = pl::get_global(plgpu::Semaphore{});
        pl::Ref second = pl::get_global(plgpu::Semaphore{.shape = {2}});
        pl::when(i == 1, [&] {
          plgpu::semaphore_signal(declared, 5);
          plgpu::semaphore_signal(first, 3);
          out[3] = plgpu::semaphore_read(declared);
        });
        pl::when(i == 0, [&] {
          plgpu::semaphore_wait(first, 3, /*decrement=*/false);
          out[0] = plgpu::semaphore_read(declared);
          out[1] = plgpu::semaphore_read(first);
          out[2] = plgpu::semaphore_read(second.at(1));
        });
      },
      {pl::ShapeDtype({4}, pl::i32)}, plgpu::Mesh{.grid = {2}, .grid_names = {"i"}},
      run_on(GetParam(), {plgpu::Semaphore{}}));
  pl::Array out = call()[0];
  EXPECT_EQ(out.data<int32_t>()[0], 0);
  EXPECT_EQ(out.data<int32_t>()[1], 3);
  EXPECT_EQ(out.data<int32_t>()[2], 0);
  EXPECT_EQ(out.data<int32_t>()[3], 5);
  std::shared_ptr<const pl::TracedCall> tc = call.trace({});
  EXPECT_EQ(tc->grid_mapping.scratch_types.size(), 3u);  // the declared one, then both globals
  EXPECT_EQ(tc->grid_mapping.scratch_grid_wide, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(tc->kernel.body.args.size(), 4u);
}

// A producer and a consumer Pallas thread in each CTA, handing over SMEM through the CTA's scratch
// semaphores (Mosaic GPU's scratch SemaphoreType.REGULAR): thread 0 writes 3 x its CTA's chunk of
// x into `buf` and signals `ready` by 1 + the CTA's index; thread 1 waits for that count (taking
// it), copies `buf` out, and reads what is left: 0 (no other CTA's signals reach this CTA's
// counters; with one counter for the grid the counts would add up). Then it signals `done` by 2
// and thread 0 waits for 2 without taking them, so its read sees 2.
TEST_P(GpuSemaphore, ScratchSemaphoresOrderTheCtasOwnThreads) {
  constexpr int kN = 64;
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref out, pl::Ref left, pl::Ref buf, pl::Ref sems) {
        pl::Value c = plgpu::axis_index("c"), t = plgpu::axis_index("t");
        pl::Ref ready = sems.at(0), done = sems.at(1);
        pl::when(t == 0, [&] {
          buf[pl::all] = x[pl::ds(c * kN, kN)] * 3.0f;
          plgpu::semaphore_signal(ready, c + 1);
          plgpu::semaphore_wait(done, 2, /*decrement=*/false);
          left[c * 2] = plgpu::semaphore_read(done);
        });
        pl::when(t == 1, [&] {
          plgpu::semaphore_wait(ready, c + 1);
          out[pl::ds(c * kN, kN)] = buf[pl::all];
          left[c * 2 + 1] = plgpu::semaphore_read(ready);
          plgpu::semaphore_signal(done, 2);
        });
      },
      {pl::ShapeDtype({kCtas * kN}, pl::f32), pl::ShapeDtype({kCtas * 2}, pl::i32)},
      plgpu::Mesh{.grid = {kCtas}, .grid_names = {"c"}, .num_threads = 2, .thread_name = "t"},
      run_on(GetParam(), {plgpu::SMEM({kN}, pl::f32), plgpu::Semaphore{.shape = {2}}}));
  pl::Array x = random_f32({kCtas * kN}, 11);
  std::vector<pl::Array> r = call(x);
  for (int e = 0; e < kCtas * kN; ++e) EXPECT_EQ(r[0].data<float>()[e], 3.0f * x.data<float>()[e]) << e;
  for (int c = 0; c < kCtas; ++c) {
    EXPECT_EQ(r[1].data<int32_t>()[c * 2], 2) << c;
    EXPECT_EQ(r[1].data<int32_t>()[c * 2 + 1], 0) << c;
  }
  // The CTA's counters do not make the grid co-resident (no CTA waits for another).
  std::shared_ptr<const pl::TracedCall> tc = call.trace({x.shape_dtype()});
  plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
  EXPECT_FALSE(k.co_resident());
  EXPECT_EQ(k.semaphore_bytes, 0);
}

// A run_scoped's semaphores (Mosaic GPU's run_scoped with a SemaphoreType.REGULAR, collective over
// the thread axis): the CTA's, 0 at each entry, and due back at 0 when the scope ends. In each of
// two scopes one after the other, thread 0 writes (round + 1) x its CTA's chunk of x into the
// scope's buffer and signals; thread 1 takes the signal (a decrementing wait: the count is 0
// again) and copies the buffer out. Beside the scopes a semaphore of the grid (get_global) counts
// every thread's signal: 2 x kCtas. A scope whose semaphore is left at 2 is an error naming it.
TEST_P(GpuSemaphore, RunScopedSemaphoresHandOverInsideTheScope) {
  constexpr int kThreads = 2, kN = 32;
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref out, pl::Ref count) {
        pl::Ref all = pl::get_global(plgpu::Semaphore{});
        pl::Value c = plgpu::axis_index("c"), t = plgpu::axis_index("t");
        for (int round = 0; round < 2; ++round)
          pl::run_scoped(
              {plgpu::SMEM({kN}, pl::f32), plgpu::Semaphore{}},
              [&](std::vector<pl::Ref> s) {
                pl::when(t == 0, [&] {
                  s[0][pl::all] = x[pl::ds(c * kN, kN)] * static_cast<float>(round + 1);
                  plgpu::semaphore_signal(s[1]);
                });
                pl::when(t == 1, [&] {
                  plgpu::semaphore_wait(s[1]);
                  out.at(round)[pl::ds(c * kN, kN)] = s[0][pl::all];
                });
                return std::vector<pl::Value>{};
              },
              {.collective_axes = {"t"}});
        plgpu::semaphore_signal(all);
        plgpu::semaphore_wait(all, kCtas * kThreads, /*decrement=*/false);
        count[c * kThreads + t] = plgpu::semaphore_read(all);
      },
      {pl::ShapeDtype({2, kCtas * kN}, pl::f32), pl::ShapeDtype({kCtas * kThreads}, pl::i32)},
      plgpu::Mesh{.grid = {kCtas}, .grid_names = {"c"}, .num_threads = kThreads, .thread_name = "t"},
      run_on(GetParam(), {}));
  const pl::Array x = random_f32({kCtas * kN}, 17);
  std::vector<pl::Array> r = call(x);
  for (int round = 0; round < 2; ++round)
    for (int e = 0; e < kCtas * kN; ++e)
      EXPECT_EQ(r[0].data<float>()[round * kCtas * kN + e], x.data<float>()[e] * static_cast<float>(round + 1)) << e;
  for (int k = 0; k < kCtas * kThreads; ++k) EXPECT_EQ(r[1].data<int32_t>()[k], kCtas * kThreads) << k;
}

TEST(GpuSemaphoreErrors, AScopesSemaphoreLeftAboveZeroIsAnError) {
  const int line = __LINE__ + 4;
  std::string e = error_of([] {
    plgpu::kernel(
        [](pl::Ref out) {
          pl::run_scoped(
              {plgpu::Semaphore{.shape = {2}}},
              [&](std::vector<pl::Ref> s) {
                plgpu::semaphore_signal(s[0].at(1));
                out[plgpu::axis_index("t")] = plgpu::semaphore_read(s[0].at(0));
                return std::vector<pl::Value>{};
              },
              {.collective_axes = {"t"}});
        },
        {pl::ShapeDtype({2}, pl::i32)}, plgpu::Mesh{.num_threads = 2, .thread_name = "t"}, run_on("interpret", {}))();
  });
  EXPECT_CONTAINS(e, "run_scoped: semaphore run_scoped[0][1] at semaphore_test.cpp:" + std::to_string(line) +
                         " of the CTA is 2 when the scope ends; a scope's semaphores must be back at 0");
  // A TPU semaphore is not a gpu::kernel's, in a scope as in scratch_shapes.
  e = error_of([] {
    plgpu::kernel(
        [](pl::Ref out) {
          pl::run_scoped({pl::tpu::semaphores(pl::tpu::SemaphoreType::REGULAR)},
                         [&](std::vector<pl::Ref>) { return std::vector<pl::Value>{}; });
          out[0] = 1;
        },
        {pl::ShapeDtype({1}, pl::i32)}, plgpu::Mesh{}, run_on("interpret", {}))();
  });
  EXPECT_CONTAINS(e, "not supported yet: run_scoped: allocation 0 is a TPU semaphore in a gpu::kernel's run_scoped");
}

// Every Pallas thread (2 per CTA) writes its slot of `mid`, signals, and waits without
// decrementing until all 2 x kCtas have signalled: a grid-wide barrier. Then each reads every
// slot (written by the other CTAs) and the count, which stays at 2 x kCtas.
TEST_P(GpuSemaphore, AWaitWithoutDecrementIsAGridBarrier) {
  constexpr int kThreads = 2, kAll = kCtas * kThreads;
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref mid, pl::Ref sum, pl::Ref count) {
        pl::Ref sem = pl::get_global(plgpu::Semaphore{});
        pl::Value me = plgpu::axis_index("i") * kThreads + plgpu::axis_index("t");
        mid[me] = x[me] * 2.0f;
        plgpu::semaphore_signal(sem);
        plgpu::semaphore_wait(sem, kAll, /*decrement=*/false);
        pl::Value total = mid[0];
        for (int k = 1; k < kAll; ++k) total = total + mid[k];
        sum[me] = total;
        count[me] = plgpu::semaphore_read(sem);
      },
      {pl::ShapeDtype({kAll}, pl::f32), pl::ShapeDtype({kAll}, pl::f32), pl::ShapeDtype({kAll}, pl::i32)},
      plgpu::Mesh{.grid = {kCtas}, .grid_names = {"i"}, .num_threads = kThreads, .thread_name = "t"},
      run_on(GetParam(), {}));
  pl::Array x = random_f32({kAll}, 7);
  std::vector<pl::Array> r = call(x);
  float want = 2.0f * x.data<float>()[0];
  for (int k = 1; k < kAll; ++k) want += 2.0f * x.data<float>()[k];
  for (int k = 0; k < kAll; ++k) {
    EXPECT_EQ(r[0].data<float>()[k], 2.0f * x.data<float>()[k]) << k;
    EXPECT_EQ(r[1].data<float>()[k], want) << k;
    EXPECT_EQ(r[2].data<int32_t>()[k], kAll) << k;
  }
  // The counters start at 0 in every call.
  EXPECT_EQ(call(x)[2].data<int32_t>()[0], kAll);
}

// Without the waits the reads of the next CTA's chunk are not ordered after its writes.
TEST(GpuSemaphoreErrors, ReadingAnotherCtasWritesWithoutWaitingIsARace) {
  std::string e = error_of([] { suffix_sum("interpret", false)(random_f32({kCtas * kChunk}, 3)); });
  EXPECT_CONTAINS(e, "gpu::kernel data race");
  EXPECT_CONTAINS(e, "output 0");
}

pl::PallasCall waits_for_two(const std::string& how) {
  return plgpu::kernel(
      [](pl::Ref out) {
        pl::Ref sem = pl::get_global(plgpu::Semaphore{});
        pl::Value i = plgpu::axis_index("i");
        pl::when(i == 1, [&] { plgpu::semaphore_signal(sem); });
        pl::when(i == 0, [&] { plgpu::semaphore_wait(sem, 2); });
        out[i] = i;
      },
      {pl::ShapeDtype({2}, pl::i32)}, plgpu::Mesh{.grid = {2}, .grid_names = {"i"}}, run_on(how, {}));
}

TEST(GpuSemaphoreErrors, AWaitNoSignalsSatisfyIsADeadlockNamingTheLine) {
  const std::string line = "semaphore_test.cpp:" + std::to_string(__LINE__ - 7);
  std::string e = error_of([] { waits_for_two("interpret")(); });
  EXPECT_CONTAINS(e, "gpu::kernel deadlock");
  EXPECT_CONTAINS(e, "CTA (0,): waits at ");
  // (As it is when the deadlock is found: CTA 1 signalled after CTA 0 began waiting.)
  EXPECT_CONTAINS(e, line + " for semaphore get_global[0] to reach 2 (it is 1)");
  EXPECT_CONTAINS(e, "CTA (1,): finished");
  // Compiled, the wait gives up after the wait limit (shortened here) instead of hanging.
  setenv("PALLAS_GPU_WAIT_TIMEOUT_MS", "200", 1);
  e = error_of([] { waits_for_two("gpu_emulate")(); });
  unsetenv("PALLAS_GPU_WAIT_TIMEOUT_MS");
  EXPECT_CONTAINS(e, "semaphore_wait: the semaphore did not reach the awaited count");
  EXPECT_CONTAINS(e, line);
}

TEST(GpuSemaphoreErrors, NegativeCountsAreErrors) {
  for (const char* how : {"interpret", "gpu_emulate"}) {
    auto make = [how](int inc, int value) {
      return plgpu::kernel(
          [inc, value](pl::Ref out, pl::Ref sem) {
            pl::Value i = plgpu::axis_index("i");
            plgpu::semaphore_signal(sem, i + inc);
            plgpu::semaphore_wait(sem, i + value);
            out[i] = i;
          },
          {pl::ShapeDtype({2}, pl::i32)}, plgpu::Mesh{.grid = {2}, .grid_names = {"i"}},
          run_on(how, {plgpu::Semaphore{}}));
    };
    SCOPED_TRACE(how);
    const std::string bad_inc = error_of([&] { make(-1, 0)(); });
    const std::string bad_value = error_of([&] { make(1, -1)(); });
    EXPECT_CONTAINS(bad_inc, "semaphore_signal: the increment must be >= 0, got -1");
    EXPECT_CONTAINS(bad_value, "semaphore_wait: the value must be >= 0, got -1");
  }
}

TEST(GpuSemaphoreErrors, GetGlobalTakesSemaphoresInAGpuKernelsBody) {
  const std::string line = "semaphore_test.cpp:" + std::to_string(__LINE__ + 4);
  std::string e = error_of([] {
    plgpu::kernel(
        [](pl::Ref out) {
          pl::Ref s = pl::get_global(plgpu::SMEM({8}, pl::f32));
          out[0] = 1;
          (void)s;
        },
        {pl::ShapeDtype({1}, pl::i32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"i"}}, run_on("interpret", {}))();
  });
  EXPECT_CONTAINS(e, "not supported yet: pl::get_global of f32[8] in ");
  EXPECT_CONTAINS(e, "it allocates gpu::Semaphore{...}");
  EXPECT_CONTAINS(e, line);
  EXPECT_CONTAINS(error_of([] {
                    pl::Ref s = pl::get_global(pl::tpu::semaphores(pl::tpu::SemaphoreType::REGULAR));
                    (void)s;
                  }),
                  "no kernel is being traced");
  // A pallas_call body cannot ask for one yet.
  e = error_of([] {
    pl::pallas_call(
        [](pl::Ref, pl::Ref o) {
          pl::Ref s = pl::get_global(plgpu::Semaphore{});
          o[pl::all] = pl::zeros({8}, pl::f32);
          (void)s;
        },
        {pl::ShapeDtype({8}, pl::f32)}, {.interpret = true})(random_f32({8}, 1));
  });
  EXPECT_CONTAINS(e, "not supported yet: pl::get_global outside a gpu::kernel's body");
}

TEST(GpuSemaphoreErrors, ScratchAndGridChecks) {
  auto body = [](pl::Ref out, pl::Ref) { out[0] = 1; };
  // A TPU semaphore is not a gpu::kernel's.
  EXPECT_CONTAINS(error_of([&] {
                    plgpu::kernel(body, {pl::ShapeDtype({1}, pl::i32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"i"}},
                                  run_on("interpret", {pl::tpu::semaphores(pl::tpu::SemaphoreType::REGULAR)}))();
                  }),
                  "is a TPU semaphore (pltpu::semaphores); a gpu::kernel's scratch is");
  EXPECT_CONTAINS(error_of([] {
                    pl::ScratchShape s = plgpu::Semaphore{.shape = {0}};
                    (void)s;
                  }),
                  "gpu::Semaphore: the shape [0] has a dimension below 1");
  // With semaphores of the grid the interpreter runs the whole grid at once: a bounded number of
  // threads. (The CTA's own semaphores do not: each CTA runs in turn.)
  auto with_global = [](pl::Ref out) {
    pl::Ref s = pl::get_global(plgpu::Semaphore{});
    (void)s;
    out[0] = 1;
  };
  EXPECT_CONTAINS(error_of([&] {
                    plgpu::kernel(with_global, {pl::ShapeDtype({1}, pl::i32)},
                                  plgpu::Mesh{.grid = {5000}, .grid_names = {"i"}}, run_on("interpret", {}))();
                  }),
                  "with pl::get_global semaphores: the interpreter runs the whole grid at once");
  const pl::Array ones = plgpu::kernel([](pl::Ref out, pl::Ref) { out[plgpu::axis_index("i")] = 1; },
                                      {pl::ShapeDtype({5000}, pl::i32)}, plgpu::Mesh{.grid = {5000}, .grid_names = {"i"}},
                                      run_on("interpret", {plgpu::Semaphore{}}))()[0];
  EXPECT_EQ(ones.data<int32_t>()[4999], 1);
}

// The launch runs one CTA per point when the kernel has semaphores, and refuses a grid that the
// GPU cannot hold at once; without semaphores it is a grid-stride loop over as many as fit.
TEST(GpuSemaphoreErrors, ACoResidentLaunchChecksThatEveryCtaFits) {
  pl::PallasCall call = suffix_sum("mosaic_gpu", true);
  std::shared_ptr<const pl::TracedCall> tc = call.trace({pl::ShapeDtype({kCtas * kChunk}, pl::f32)});
  plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
  ASSERT_TRUE(k.co_resident());
  EXPECT_EQ(k.semaphore_bytes, kCtas * 4);
  EXPECT_EQ(plgpu::launch_ctas(*tc, k, 300, 132, 3), 300);
  std::string e = error_of([&] { plgpu::launch_ctas(*tc, k, 300, 132, 2); });
  EXPECT_CONTAINS(e, "has semaphores of the whole grid (pl::get_global), so all of its 300 CTAs must run at once");
  EXPECT_CONTAINS(e, "holds at most 264 of them at a time (132 SMs x 2 per SM");
  // In clusters of 2 CTAs, which must share a GPC: the driver's count of active clusters bounds
  // them further when it is the smaller (100 x 2 < 132 x 2), and is ignored when it is not.
  k.cluster_ctas = 2;
  e = error_of([&] { plgpu::launch_ctas(*tc, k, 300, 132, 2, 100); });
  EXPECT_CONTAINS(e, "holds at most 200 of them at a time (100 clusters of 2 CTAs, as cuOccupancyMaxActiveClusters");
  EXPECT_EQ(plgpu::launch_ctas(*tc, k, 200, 132, 2, 100), 200);
  EXPECT_EQ(plgpu::launch_ctas(*tc, k, 264, 132, 2, 500), 264);
  EXPECT_CONTAINS(error_of([&] { plgpu::launch_ctas(*tc, k, 266, 132, 2, 500); }), "(132 SMs x 2 per SM");
  k.cluster_ctas = 1;
  k.semaphore_bytes = 0;  // the same kernel without: a grid-stride loop
  EXPECT_EQ(plgpu::launch_ctas(*tc, k, 300, 132, 2), 264);
  EXPECT_EQ(plgpu::launch_ctas(*tc, k, 100, 132, 2), 100);
}

TEST(GpuSemaphore, CompilesWithNvrtcForHopperAndAmpere) {
  if (std::string why = pl::gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  pl::PallasCall call = suffix_sum("mosaic_gpu", true);
  std::shared_ptr<const pl::TracedCall> tc = call.trace({pl::ShapeDtype({kCtas * kChunk}, pl::f32)});
  plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
  EXPECT_CONTAINS(k.source, "pl_sem_wait(");
  EXPECT_CONTAINS(k.source, "pl_sem_signal(");
  // The CTA's counters (scratch, and a run_scoped's shared by two warpgroups) are in its shared
  // memory: zeroed with the scratch and at the scope's entry, signalled through the same runtime.
  pl::PallasCall own = plgpu::kernel(
      [](pl::Ref out, pl::Ref sem) {
        pl::Value t = plgpu::axis_index("t");
        pl::when(t == 0, [&] { plgpu::semaphore_signal(sem); });
        pl::when(t == 1, [&] { plgpu::semaphore_wait(sem); });
        pl::run_scoped(
            {plgpu::Semaphore{.shape = {2}}},
            [&](std::vector<pl::Ref> s) {
              plgpu::semaphore_signal(s[0].at(1));
              out[t] = plgpu::semaphore_read(s[0].at(1));
              return std::vector<pl::Value>{};
            },
            {.collective_axes = {"t"}});
      },
      {pl::ShapeDtype({2}, pl::i32)},
      plgpu::Mesh{.grid = {8}, .grid_names = {"c"}, .num_threads = 2, .thread_name = "t"},
      run_on("mosaic_gpu", {plgpu::Semaphore{}}));
  std::shared_ptr<const pl::TracedCall> own_tc = own.trace({});
  plgpu::GeneratedKernel own_k = plgpu::generate_cuda(*own_tc, own_tc->grid_mapping.grid);
  EXPECT_FALSE(own_k.co_resident());
  EXPECT_CONTAINS(own_k.source, "((pl_i32*)(cta_arena + ");
  EXPECT_EQ(own_k.source.find("p.workspace + 0))"), std::string::npos);
  for (const char* arch : {"sm_90a", "sm_80"}) {
    plgpu::CompiledKernel c = plgpu::Nvrtc::get().compile(k.source, "semaphores.cu", arch);
    EXPECT_TRUE(c.is_cubin) << arch;
    c = plgpu::Nvrtc::get().compile(own_k.source, "cta_semaphores.cu", arch);
    EXPECT_TRUE(c.is_cubin) << arch;
  }
}

}  // namespace
