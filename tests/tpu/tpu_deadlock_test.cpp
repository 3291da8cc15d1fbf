// Deadlock detection in the TPU interpret mode: every report names each stuck device and core,
// the semaphore, its count and the awaited value, and the source line; nothing ever hangs.
#include <chrono>

#include "tests/tpu/tpu_test_util.h"

using namespace tpu_test;

namespace {
const auto DMA = pltpu::SemaphoreType::DMA;
const auto REGULAR = pltpu::SemaphoreType::REGULAR;

const char* const kHeader =
    "deadlock: every running core of the simulated TPU is waiting, and nothing can wake any of them:";
}  // namespace

TEST(TpuDeadlock, SingleCoreWaitingOnItself) {
  HangGuard guard;
  const int line = __LINE__ + 2;
  auto kernel = [](pl::Ref o, pl::Ref sem) {
    pltpu::semaphore_wait(sem, 1);
    o[pl::all] = pl::zeros({8, 128}, pl::f32);
  };
  pl::CallOptions opts;
  opts.scratch_shapes = {pltpu::semaphores(REGULAR)};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
  EXPECT_EQ(error_of<pltpu::DeadlockError>([&] { call(); }),
            std::string(kHeader) + "\n  device 0, core 0: semaphore_wait on scratch 0 (regular semaphore) at " +
                line_ref(__FILE__, line) + ": count 0, waiting for 1");
}

TEST(TpuDeadlock, WaitingForMoreThanWillEverBeSignalled) {
  HangGuard guard;
  const int line = __LINE__ + 4;
  auto kernel = [](pl::Ref o, pl::Ref sems) {
    pltpu::semaphore_signal(sems.at(0), 5);
    pltpu::semaphore_signal(sems.at(1), 2);
    pltpu::semaphore_wait(sems.at(1), 3);
    o[pl::all] = pl::zeros({8, 128}, pl::f32);
  };
  pl::CallOptions opts;
  opts.scratch_shapes = {pltpu::semaphores(REGULAR, {2})};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
  EXPECT_EQ(error_of<pltpu::DeadlockError>([&] { call(); }),
            std::string(kHeader) + "\n  device 0, core 0: semaphore_wait on scratch 0[1] (regular semaphore) at " +
                line_ref(__FILE__, line) + ": count 2, waiting for 3");
}

TEST(TpuDeadlock, DmaWaitWithNoDmaStarted) {
  HangGuard guard;
  const int line = __LINE__ + 3;
  auto kernel = [](pl::Ref x_hbm, pl::Ref o, pl::Ref buf, pl::Ref sem) {
    auto c = pltpu::make_async_copy(x_hbm, buf, sem);
    c.wait();
    o[pl::all] = buf[pl::all];
  };
  for (const char* mode : kModes) {
    pl::CallOptions opts;
    opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
    opts.scratch_shapes = {pltpu::VMEM({8, 128}, pl::f32), pltpu::semaphores(DMA)};
    pltpu::InterpretParams p;
    p.dma_execution_mode = mode;
    opts.interpret = p;
    auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
    EXPECT_EQ(error_of<pltpu::DeadlockError>([&] { call(iota_f32({8, 128})); }),
              std::string(kHeader) + "\n  device 0, core 0: dma_wait on scratch 1 (DMA semaphore) at " +
                  line_ref(__FILE__, line) + ": count 0, waiting for 4096")
        << mode;
  }
}

TEST(TpuDeadlock, TwoDevicesEachWaitingForTheOther) {
  HangGuard guard;
  const int line = __LINE__ + 4;
  auto kernel = [](pl::Ref o, pl::Ref sem) {
    pl::Value other = 1 - pltpu::axis_index("x");
    // Each waits for the other's signal before sending its own.
    pltpu::semaphore_wait(sem, 1);
    pltpu::semaphore_signal(sem, 1, {.device_id = pltpu::DeviceId(other)});
    o[pl::all] = pl::zeros({8, 128}, pl::f32);
  };
  pl::CallOptions opts;
  opts.scratch_shapes = {pltpu::semaphores(REGULAR)};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
  auto t0 = std::chrono::steady_clock::now();
  std::string msg = error_of<pltpu::DeadlockError>(
      [&] { pltpu::run_on_mesh(call, pltpu::Mesh{{"x"}, {2}}, std::vector<std::vector<pl::Array>>(2)); });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  const std::string where = " (regular semaphore) at " + line_ref(__FILE__, line) + ": count 0, waiting for 1";
  EXPECT_EQ(msg, std::string(kHeader) + "\n  device 0, core 0: semaphore_wait on scratch 0" + where +
                     "\n  device 1, core 0: semaphore_wait on scratch 0" + where);
}

TEST(TpuDeadlock, OneCoreFinishedTheOtherWaits) {
  HangGuard guard;
  const int line = __LINE__ + 4;
  auto body = [](pl::Ref o_hbm, pl::Ref sem) {
    (void)o_hbm;
    pl::Value core = pltpu::axis_index("core");
    pl::when(core == 1, [&] { pltpu::semaphore_wait(sem, 2); });
    // Core 0 signals only once.
    pl::when(core == 0, [&] { pltpu::semaphore_signal(sem, 1, {.core_index = pl::Operand(1)}); });
  };
  auto call = pltpu::core_map(body, {pl::ShapeDtype({8, 128}, pl::f32)}, pltpu::TensorCoreMesh{"core", 2},
                              {.scratch_shapes = {pltpu::semaphores(REGULAR)}});
  EXPECT_EQ(error_of<pltpu::DeadlockError>([&] { call(); }),
            std::string(kHeader) + "\n  device 0, core 0: finished\n  device 0, core 1: semaphore_wait on scratch 0 "
                                   "(regular semaphore) at " + line_ref(__FILE__, line) + ": count 1, waiting for 2");
}

TEST(TpuDeadlock, RingWhereOneDeviceNeverSignals) {
  // 4 devices; device 3 skips its signal, so device 0 waits forever, and the others finish.
  HangGuard guard;
  const int line = __LINE__ + 5;
  auto kernel = [](pl::Ref o, pl::Ref sem) {
    pl::Value me = pltpu::axis_index("x");
    pl::when(me != 3,
             [&] { pltpu::semaphore_signal(sem, 1, {.device_id = pltpu::DeviceId((me + 1) % 4)}); });
    pltpu::semaphore_wait(sem, 1);
    o[pl::all] = pl::zeros({8, 128}, pl::f32);
  };
  pl::CallOptions opts;
  opts.scratch_shapes = {pltpu::semaphores(REGULAR)};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
  std::string msg = error_of<pltpu::DeadlockError>(
      [&] { pltpu::run_on_mesh(call, pltpu::Mesh{{"x"}, {4}}, std::vector<std::vector<pl::Array>>(4)); });
  EXPECT_EQ(msg, std::string(kHeader) + "\n  device 0, core 0: semaphore_wait on scratch 0 (regular semaphore) at " +
                     line_ref(__FILE__, line) +
                     ": count 0, waiting for 1\n  device 1, core 0: finished\n  device 2, core 0: finished\n"
                     "  device 3, core 0: finished");
}

TEST(TpuDeadlock, RemoteDmaNobodyWaitsOnTheReceivingSide) {
  // on_wait mode: device 0's copy to device 1 only runs when someone waits; device 0 waits for
  // a reply that device 1 sends only after its own (never satisfied) wait for a signal.
  HangGuard guard;
  auto kernel = [](pl::Ref x, pl::Ref o, pl::Ref send, pl::Ref recv, pl::Ref sem) {
    pl::Value me = pltpu::axis_index("x");
    pl::when(me == 0, [&] {
      pltpu::async_remote_copy(x, o, send, recv, pltpu::DeviceId(1));
      pltpu::semaphore_wait(sem, 1);
    });
    pl::when(me == 1, [&] {
      pltpu::semaphore_wait(sem, 1);
      pltpu::semaphore_signal(sem, 1, {.device_id = pltpu::DeviceId(0)});
    });
  };
  pl::CallOptions opts;
  opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
  opts.out_specs = {pl::BlockSpec(pltpu::ANY)};
  opts.scratch_shapes = {pltpu::semaphores(DMA), pltpu::semaphores(DMA), pltpu::semaphores(REGULAR)};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
  std::string msg = error_of<pltpu::DeadlockError>([&] {
    pltpu::run_on_mesh(call, pltpu::Mesh{{"x"}, {2}}, {{iota_f32({8, 128})}, {iota_f32({8, 128})}});
  });
  EXPECT_CONTAINS(msg, "\n  device 0, core 0: semaphore_wait on scratch 2 (regular semaphore) at ");
  EXPECT_CONTAINS(msg, "\n  device 1, core 0: semaphore_wait on scratch 2 (regular semaphore) at ");
  EXPECT_CONTAINS(msg, "\n  (2 DMA step(s) are queued on semaphores nobody waits on)");
}

TEST(TpuDeadlock, TheNextCallWorks) {
  HangGuard guard;
  auto bad = pl::pallas_call(
      [](pl::Ref o, pl::Ref sem) {
        pltpu::semaphore_wait(sem, 1);
        o[pl::all] = pl::zeros({8, 128}, pl::f32);
      },
      pl::ShapeDtype({8, 128}, pl::f32),
      {.scratch_shapes = {pltpu::semaphores(REGULAR)}, .interpret = pltpu::InterpretParams{}});
  for (int i = 0; i < 3; ++i) EXPECT_THROW(bad(), pltpu::DeadlockError);
  auto good = pl::pallas_call(
      [](pl::Ref o, pl::Ref sem) {
        pltpu::semaphore_signal(sem, 1);
        pltpu::semaphore_wait(sem, 1);
        o[pl::all] = pl::full({8, 128}, pl::f32, 4.0);
      },
      pl::ShapeDtype({8, 128}, pl::f32),
      {.scratch_shapes = {pltpu::semaphores(REGULAR)}, .interpret = pltpu::InterpretParams{}});
  EXPECT_EQ(good()[0].data<float>()[5], 4.0f);
}
