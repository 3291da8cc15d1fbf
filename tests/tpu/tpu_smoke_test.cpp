// Smoke tests of the TPU interpret mode: DMAs, semaphores, devices, races, deadlocks.
#include <gtest/gtest.h>

#include "pallas/pallas.h"
#include "pallas/tpu.h"

namespace pl = pallas;
namespace pltpu = pallas::tpu;

namespace {

pl::Array iota_f32(pl::Shape s, float base = 0) {
  pl::Array a = pl::Array::zeros(s, pl::f32);
  float* p = a.data<float>();
  for (int64_t i = 0; i < a.size(); ++i) p[i] = base + static_cast<float>(i);
  return a;
}

TEST(TpuSmoke, ManualDmaFromHbm) {
  for (const char* mode : {"eager", "on_wait"}) {
    auto kernel = [](pl::Ref x_hbm, pl::Ref o, pl::Ref buf, pl::Ref sem) {
      auto copy = pltpu::make_async_copy(x_hbm.at(pl::ds(pl::program_id(0) * 8, 8)), buf, sem);
      copy.start();
      copy.wait();
      o[pl::all] = buf[pl::all] * 2.0f;
    };
    pl::CallOptions opts;
    opts.grid = {2};
    opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
    opts.out_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })};
    opts.scratch_shapes = {pltpu::VMEM({8, 128}, pl::f32), pltpu::semaphores(pltpu::SemaphoreType::DMA)};
    pltpu::InterpretParams p;
    p.dma_execution_mode = mode;
    p.detect_races = true;
    auto races = std::make_shared<std::vector<pltpu::RaceReport>>();
    p.races = races;
    opts.interpret = p;
    auto call = pl::pallas_call(kernel, pl::ShapeDtype({16, 128}, pl::f32), opts);
    pl::Array x = iota_f32({16, 128});
    pl::Array o = call(x)[0];
    for (int64_t i = 0; i < x.size(); ++i) ASSERT_EQ(o.data<float>()[i], 2 * x.data<float>()[i]);
    EXPECT_TRUE(races->empty()) << (races->empty() ? "" : races->front().to_string());
  }
}

TEST(TpuSmoke, RightPermuteOnFourDevices) {
  for (const char* mode : {"eager", "on_wait"}) {
    auto kernel = [](pl::Ref x, pl::Ref o, pl::Ref send, pl::Ref recv) {
      pl::Value me = pltpu::axis_index("x");
      pl::Value right = (me + 1) % 4;
      auto c = pltpu::make_async_remote_copy(x, o, send, recv, pltpu::DeviceId(right));
      c.start();
      c.wait();
    };
    pl::CallOptions opts;
    opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
    opts.out_specs = {pl::BlockSpec(pltpu::ANY)};
    opts.scratch_shapes = {pltpu::semaphores(pltpu::SemaphoreType::DMA),
                           pltpu::semaphores(pltpu::SemaphoreType::DMA)};
    pltpu::InterpretParams p;
    p.dma_execution_mode = mode;
    p.detect_races = true;
    auto races = std::make_shared<std::vector<pltpu::RaceReport>>();
    p.races = races;
    opts.interpret = p;
    auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
    std::vector<std::vector<pl::Array>> args;
    for (int d = 0; d < 4; ++d) args.push_back({iota_f32({8, 128}, 1000.0f * d)});
    auto out = pltpu::run_on_mesh(call, pltpu::Mesh{{"x"}, {4}}, args);
    for (int d = 0; d < 4; ++d) {
      int from = (d + 3) % 4;
      ASSERT_EQ(out[d][0].data<float>()[5], args[from][0].data<float>()[5]) << mode << " device " << d;
    }
    EXPECT_TRUE(races->empty()) << (races->empty() ? "" : races->front().to_string());
  }
}

TEST(TpuSmoke, DeadlockIsReported) {
  auto kernel = [](pl::Ref x, pl::Ref o, pl::Ref sem) {
    pltpu::semaphore_wait(sem, 1);
    o[pl::all] = x[pl::all];
  };
  pl::CallOptions opts;
  opts.scratch_shapes = {pltpu::semaphores(pltpu::SemaphoreType::REGULAR)};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
  try {
    call(iota_f32({8, 128}));
    FAIL() << "no deadlock reported";
  } catch (const pltpu::DeadlockError& e) {
    EXPECT_NE(std::string(e.what()).find("semaphore_wait on scratch 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("count 0, waiting for 1"), std::string::npos) << e.what();
  }
  // The next call works (state belongs to the call).
  auto ok = pl::pallas_call([](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all] + 1.0f; },
                            pl::ShapeDtype({8, 128}, pl::f32), {.interpret = pltpu::InterpretParams{}});
  EXPECT_EQ(ok(iota_f32({8, 128}))[0].data<float>()[3], 4.0f);
}

TEST(TpuSmoke, ReadBetweenStartAndWaitRaces) {
  auto kernel = [](pl::Ref x_hbm, pl::Ref o, pl::Ref buf, pl::Ref sem) {
    auto copy = pltpu::make_async_copy(x_hbm, buf, sem);
    copy.start();
    o[pl::all] = buf[pl::all];  // reads buf while the DMA writes it
    copy.wait();
  };
  pl::CallOptions opts;
  opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
  opts.scratch_shapes = {pltpu::VMEM({8, 128}, pl::f32), pltpu::semaphores(pltpu::SemaphoreType::DMA)};
  for (const char* mode : {"eager", "on_wait"}) {
    pltpu::InterpretParams p;
    p.detect_races = true;
    p.dma_execution_mode = mode;
    auto races = std::make_shared<std::vector<pltpu::RaceReport>>();
    p.races = races;
    opts.interpret = p;
    auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
    call(iota_f32({8, 128}));
    if (std::string(mode) == "eager") {
      ASSERT_EQ(races->size(), 1u) << mode;
      EXPECT_NE(races->front().to_string().find("DMA write"), std::string::npos) << races->front().to_string();
    } else {
      // In on_wait mode the DMA runs inside the wait, after the read: still a race (unordered).
      ASSERT_EQ(races->size(), 1u) << mode;
    }
  }
}

TEST(TpuSmoke, TwoCoresWritingTheSameOutputBlockRace) {
  auto kernel = [](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all]; };
  pl::CallOptions opts;
  opts.grid = {2};
  opts.in_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })};
  opts.out_specs = {pl::BlockSpec({8, 128}, [](pl::Value) { return pl::Indices{0, 0}; })};
  opts.compiler_params = pltpu::CompilerParams{.dimension_semantics = {"parallel"}};
  pltpu::InterpretParams p;
  p.detect_races = true;
  p.num_cores_per_device = 2;
  auto races = std::make_shared<std::vector<pltpu::RaceReport>>();
  p.races = races;
  opts.interpret = p;
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
  call(iota_f32({16, 128}));
  ASSERT_EQ(races->size(), 1u);
  EXPECT_NE(races->front().to_string().find("copy-out of output outputs[0]"), std::string::npos)
      << races->front().to_string();
}

}  // namespace
