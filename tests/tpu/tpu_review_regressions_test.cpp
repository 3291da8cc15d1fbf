// Regression tests for defects found in review of the TPU interpret mode.
#include <functional>

#include "tpu_test_util.h"

using namespace tpu_test;

namespace {

constexpr pltpu::SemaphoreType DMA = pltpu::SemaphoreType::DMA;

TEST(TpuRaces, SendSemaphoreDoesNotPublishTheWrite) {
  // Device 0 copies into device 1's buffer, waits for the send side only (the source has been
  // read), then tells device 1 through a regular semaphore. Device 1 reads the buffer before
  // waiting for its receive semaphore: nothing orders that read after the DMA's write (on a
  // TPU the data may still be in flight), in either DMA mode.
  for (const char* mode : kModes) {
    auto kernel = [](pl::Ref o, pl::Ref src, pl::Ref buf, pl::Ref send, pl::Ref recv, pl::Ref flag) {
      pl::Value me = pltpu::axis_index("x");
      pl::when(me == 0, [&] {
        src[pl::all] = pl::full({8, 128}, pl::f32, 5.0);
        auto c = pltpu::async_remote_copy(src, buf, send, recv, pltpu::DeviceId(1));
        c.wait_send();
        pltpu::semaphore_signal(flag, 1, {.device_id = pltpu::DeviceId(1)});
        o[pl::all] = src[pl::all];
      });
      pl::when(me == 1, [&] {
        pltpu::semaphore_wait(flag, 1);
        o[pl::all] = buf[pl::all];  // before waiting on recv: races with the DMA's write
        pltpu::semaphore_wait(recv, 8 * 128 * 4);
      });
    };
    std::shared_ptr<std::vector<pltpu::RaceReport>> races;
    pl::CallOptions opts;
    opts.scratch_shapes = {pltpu::VMEM({8, 128}, pl::f32), pltpu::VMEM({8, 128}, pl::f32),
                           pltpu::semaphores(DMA), pltpu::semaphores(DMA),
                           pltpu::semaphores(pltpu::SemaphoreType::REGULAR)};
    pltpu::InterpretParams p = race_params(races, mode);
    p.uninitialized_memory = "zero";
    opts.interpret = p;
    auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
    HangGuard guard;
    pltpu::run_on_mesh(call, pltpu::Mesh{{"x"}, {2}}, std::vector<std::vector<pl::Array>>(2));
    ASSERT_EQ(races->size(), 1u) << mode << "\n" << all_reports(*races);
    std::set<std::string> whats = {races->front().first.what, races->front().second.what};
    EXPECT_EQ(whats, (std::set<std::string>{"DMA write", "load"})) << races->front().to_string();
  }
}

TEST(TpuDma, PollingASemaphoreRunsQueuedDmas) {
  // In on_wait mode a DMA runs when its semaphore is waited on; a kernel that polls with
  // semaphore_read must also drive it (else the loop would spin forever).
  auto kernel = [](pl::Ref x_hbm, pl::Ref o, pl::Ref buf, pl::Ref sem) {
    auto c = pltpu::make_async_copy(x_hbm, buf, sem);
    c.start();
    pl::while_loop(pl::scalar(0, pl::i32),
                   [&](pl::Value) { return pltpu::semaphore_read(sem) < 8 * 128 * 4; },
                   [&](pl::Value i) { return i + 1; });
    c.wait();
    o[pl::all] = buf[pl::all];
  };
  std::shared_ptr<std::vector<pltpu::RaceReport>> races;
  pl::CallOptions opts;
  opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
  opts.scratch_shapes = {pltpu::VMEM({8, 128}, pl::f32), pltpu::semaphores(DMA)};
  opts.interpret = race_params(races, "on_wait");
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
  HangGuard guard;
  pl::Array x = iota_f32({8, 128});
  pl::Array o = call(x)[0];
  for (int64_t i = 0; i < x.size(); ++i) ASSERT_EQ(o.data<float>()[i], x.data<float>()[i]);
  EXPECT_TRUE(races->empty()) << all_reports(*races);
}

TEST(TpuDma, RemoteCopyIntoADivergedAllocationIsAnError) {
  // Both devices enter two nested scopes, but of different shapes: the ids agree, the buffers
  // do not. Device 1 tells device 0 when it is inside; device 0's copy into "the same" buffer
  // on device 1 must be refused rather than land in a buffer of another shape.
  auto kernel = [](pl::Ref o, pl::Ref send, pl::Ref recv, pl::Ref ready) {
    pl::Value me = pltpu::axis_index("x");
    auto nested = [&](pl::Shape inner, const std::function<void(pl::Ref)>& body) {
      pl::run_scoped({{{4, 128}, pl::f32, pl::MemorySpace::Vmem}}, [&](std::vector<pl::Ref>) {
        pl::run_scoped({{inner, pl::f32, pl::MemorySpace::Vmem}}, [&](std::vector<pl::Ref> r) {
          body(r[0]);
          return std::vector<pl::Value>{};
        });
        return std::vector<pl::Value>{};
      });
    };
    pl::when(me == 0, [&] {
      nested({64, 128}, [&](pl::Ref big) {
        big[pl::all] = pl::full({64, 128}, pl::f32, 2.0);
        pltpu::semaphore_wait(ready, 1);
        auto c = pltpu::async_remote_copy(big, big, send, recv, pltpu::DeviceId(1));
        c.wait();
      });
    });
    pl::when(me == 1, [&] {
      nested({8, 128}, [&](pl::Ref small) {
        small[pl::all] = pl::full({8, 128}, pl::f32, 3.0);
        pltpu::semaphore_signal(ready, 1, {.device_id = pltpu::DeviceId(0)});
        pltpu::semaphore_wait(recv, 64 * 128 * 4);  // never satisfied: device 0 fails first
      });
    });
    o[pl::all] = pl::full({8, 128}, pl::f32, 0.0);
  };
  pl::CallOptions opts;
  opts.scratch_shapes = {pltpu::semaphores(DMA), pltpu::semaphores(DMA),
                         pltpu::semaphores(pltpu::SemaphoreType::REGULAR)};
  opts.compiler_params = pltpu::CompilerParams{.collective_id = 0};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
  HangGuard guard;
  std::string msg = error_of([&] {
    pltpu::run_on_mesh(call, pltpu::Mesh{{"x"}, {2}}, std::vector<std::vector<pl::Array>>(2));
  });
  EXPECT_CONTAINS(msg, "on device 0, core 0: remote DMA to device 1");
  EXPECT_CONTAINS(msg, "f32[8, 128], not the counterpart of");
  EXPECT_CONTAINS(msg, "the devices allocated different buffers");
}

TEST(TpuRaces, ZeroSizedBuffersAreNotAnError) {
  auto kernel = [](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all]; };
  std::shared_ptr<std::vector<pltpu::RaceReport>> races;
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 0}, pl::f32),
                              {.interpret = race_params(races)});
  pl::Array o = call(pl::Array::zeros({8, 0}, pl::f32))[0];
  EXPECT_EQ(o.shape(), (pl::Shape{8, 0}));
  EXPECT_TRUE(races->empty());
}

}  // namespace
