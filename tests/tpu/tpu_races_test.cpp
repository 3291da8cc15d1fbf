// The race detector of the TPU interpret mode: silent on correct kernels (double buffering,
// collectives, strided accesses that do not overlap), and reporting races between a core and a
// DMA, between cores, between devices and between DMAs, with the buffer, both actors and both
// source lines.
#include "tests/tpu/tpu_test_util.h"

using namespace tpu_test;

namespace {
const auto DMA = pltpu::SemaphoreType::DMA;
const auto REGULAR = pltpu::SemaphoreType::REGULAR;
}  // namespace

// ---- Correct kernels: no races ---------------------------------------------------------------------
TEST(TpuRaces, DoubleBufferingHasNoRace) {
  // Grid of 4 steps over an HBM input: step i waits for slot i%2 (started by step i-1, or by
  // step 0 for itself) and starts the copy of block i+1 into the other slot.
  auto kernel = [](pl::Ref x_hbm, pl::Ref o, pl::Ref buf, pl::Ref sems) {
    pl::Value i = pl::program_id(0);
    pl::Value n = pl::num_programs(0);
    pl::Value slot = i % 2;
    auto copy_of = [&](pl::Value step, pl::Value s) {
      return pltpu::make_async_copy(x_hbm.at(pl::ds(step * 8, 8)), buf.at(s), sems.at(s));
    };
    pl::when(i == 0, [&] { copy_of(i, slot).start(); });
    pl::when(i + 1 < n, [&] { copy_of(i + 1, 1 - slot).start(); });
    copy_of(i, slot).wait();
    o[pl::all] = buf[slot] * 3.0f;
  };
  for (const char* mode : kModes) {
    std::shared_ptr<std::vector<pltpu::RaceReport>> races;
    pl::CallOptions opts;
    opts.grid = {4};
    opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
    opts.out_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })};
    opts.scratch_shapes = {pltpu::VMEM({2, 8, 128}, pl::f32), pltpu::semaphores(DMA, {2})};
    opts.interpret = race_params(races, mode);
    pl::Array x = iota_f32({32, 128});
    pl::Array o = pl::pallas_call(kernel, pl::ShapeDtype({32, 128}, pl::f32), opts)(x)[0];
    for (int64_t i = 0; i < x.size(); ++i) ASSERT_EQ(o.data<float>()[i], 3.0f * i) << mode;
    EXPECT_TRUE(races->empty()) << mode << "\n" << all_reports(*races);
  }
}

TEST(TpuRaces, RingAllGatherHasNoRace) {
  // 4 devices: o[k] ends as device k's x on every device. Step s forwards slot (me - s) to the
  // right, with one receive semaphore per step (byte counts of different steps must not mix).
  auto kernel = [](pl::Ref x, pl::Ref o, pl::Ref send, pl::Ref recv) {
    pl::Value me = pltpu::axis_index("x");
    pl::Value right = (me + 1) % 4;
    pltpu::sync_copy(x, o.at(me));
    for (int s = 0; s < 3; ++s) {
      pl::Value slot = (me + 4 - s) % 4;
      auto c = pltpu::make_async_remote_copy(o.at(slot), o.at(slot), send.at(s), recv.at(s),
                                             pltpu::DeviceId(right));
      c.start();
      c.wait_send();
      c.wait_recv();  // the same size arrives from the left, for slot (me - s - 1)
    }
  };
  for (const char* mode : kModes) {
    std::shared_ptr<std::vector<pltpu::RaceReport>> races;
    pl::CallOptions opts;
    opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
    opts.out_specs = {pl::BlockSpec(pltpu::ANY)};
    opts.scratch_shapes = {pltpu::semaphores(DMA, {3}), pltpu::semaphores(DMA, {3})};
    opts.interpret = race_params(races, mode);
    auto call = pl::pallas_call(kernel, pl::ShapeDtype({4, 8, 128}, pl::f32), opts);
    std::vector<std::vector<pl::Array>> args;
    for (int d = 0; d < 4; ++d) args.push_back({iota_f32({8, 128}, 10000.0f * d)});
    HangGuard guard;
    auto out = pltpu::run_on_mesh(call, pltpu::Mesh{{"x"}, {4}}, args);
    for (int d = 0; d < 4; ++d)
      for (int k = 0; k < 4; ++k)
        for (int64_t i = 0; i < 8 * 128; i += 7)
          ASSERT_EQ(out[d][0].data<float>()[k * 1024 + i], args[k][0].data<float>()[i])
              << mode << " device " << d << " slot " << k;
    EXPECT_TRUE(races->empty()) << mode << "\n" << all_reports(*races);
  }
}

TEST(TpuRaces, RingAllReduceWithBarrierHasNoRace) {
  // Sum over 4 devices: each step sends the running partial to the right into a per-step
  // landing slot, after a barrier with the neighbours (the collective pattern).
  auto kernel = [](pl::Ref x, pl::Ref o, pl::Ref landing, pl::Ref acc, pl::Ref send, pl::Ref recv) {
    pl::Value me = pltpu::axis_index("x");
    pl::Value right = (me + 1) % 4, left = (me + 3) % 4;
    pl::Ref barrier = pltpu::get_barrier_semaphore();
    pltpu::semaphore_signal(barrier, 1, {.device_id = pltpu::DeviceId(left)});
    pltpu::semaphore_signal(barrier, 1, {.device_id = pltpu::DeviceId(right)});
    pltpu::semaphore_wait(barrier, 2);
    pltpu::sync_copy(x, acc);
    pltpu::sync_copy(x, landing.at(3));
    for (int s = 0; s < 3; ++s) {
      // Forward what arrived last (slot s-1, or my own x first) into the right's slot s.
      pl::Ref from = landing.at(s == 0 ? 3 : s - 1);
      auto c = pltpu::make_async_remote_copy(from, landing.at(s), send.at(s), recv.at(s), pltpu::DeviceId(right));
      c.start();
      c.wait();
      acc[pl::all] = acc[pl::all] + landing[s];
    }
    pltpu::sync_copy(acc, o);
  };
  for (const char* mode : kModes) {
    std::shared_ptr<std::vector<pltpu::RaceReport>> races;
    pl::CallOptions opts;
    opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
    opts.out_specs = {pl::BlockSpec(pltpu::ANY)};
    opts.scratch_shapes = {pltpu::VMEM({4, 8, 128}, pl::f32), pltpu::VMEM({8, 128}, pl::f32),
                           pltpu::semaphores(DMA, {3}), pltpu::semaphores(DMA, {3})};
    opts.compiler_params = pltpu::CompilerParams{.collective_id = 0};
    opts.interpret = race_params(races, mode);
    auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
    std::vector<std::vector<pl::Array>> args;
    for (int d = 0; d < 4; ++d) args.push_back({iota_f32({8, 128}, 3.0f * d)});
    HangGuard guard;
    auto out = pltpu::run_on_mesh(call, pltpu::Mesh{{"x"}, {4}}, args);
    for (int d = 0; d < 4; ++d)
      for (int64_t i = 0; i < 8 * 128; ++i) {
        float want = 0;
        for (int k = 0; k < 4; ++k) want += args[k][0].data<float>()[i];
        ASSERT_EQ(out[d][0].data<float>()[i], want) << mode << " device " << d;
      }
    EXPECT_TRUE(races->empty()) << mode << "\n" << all_reports(*races);
  }
}

TEST(TpuRaces, StridedDmasThatDoNotOverlapDoNotRace) {
  // Two DMAs in flight at once into the even and the odd rows of one buffer.
  auto kernel = [](pl::Ref x_hbm, pl::Ref o, pl::Ref buf, pl::Ref sems) {
    auto a = pltpu::async_copy(x_hbm.at(pl::ds(0, 4)), buf.at(pl::ds(0, 4, 2)), sems.at(0));
    auto b = pltpu::async_copy(x_hbm.at(pl::ds(4, 4)), buf.at(pl::ds(1, 4, 2)), sems.at(1));
    a.wait();
    b.wait();
    o[pl::all] = buf[pl::all];
  };
  for (const char* mode : kModes) {
    std::shared_ptr<std::vector<pltpu::RaceReport>> races;
    pl::CallOptions opts;
    opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
    opts.scratch_shapes = {pltpu::VMEM({8, 128}, pl::f32), pltpu::semaphores(DMA, {2})};
    opts.interpret = race_params(races, mode);
    pl::Array x = iota_f32({8, 128});
    pl::Array o = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts)(x)[0];
    for (int64_t r = 0; r < 8; ++r)
      ASSERT_EQ(o.data<float>()[r * 128 + 1], x.data<float>()[((r % 2) * 4 + r / 2) * 128 + 1]) << mode;
    EXPECT_TRUE(races->empty()) << mode << "\n" << all_reports(*races);
  }
}

// ---- Races found ---------------------------------------------------------------------------------------
TEST(TpuRaces, ReadBetweenStartAndWaitOfADma) {
  const int start_line = __LINE__ + 3;
  const int read_line = __LINE__ + 3;
  auto kernel = [](pl::Ref x_hbm, pl::Ref o, pl::Ref buf, pl::Ref sem) {
    auto copy = pltpu::async_copy(x_hbm, buf, sem);
    o[pl::all] = buf[pl::all];
    copy.wait();
  };
  for (const char* mode : kModes) {
    std::shared_ptr<std::vector<pltpu::RaceReport>> races;
    pl::CallOptions opts;
    opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
    opts.scratch_shapes = {pltpu::VMEM({8, 128}, pl::f32), pltpu::semaphores(DMA)};
    opts.interpret = race_params(races, mode);
    pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts)(iota_f32({8, 128}));
    ASSERT_EQ(races->size(), 1u) << mode << "\n" << all_reports(*races);
    const pltpu::RaceReport& r = races->front();
    EXPECT_EQ(r.buffer.rfind("scratch 0 (vmem, device 0, core 0)", 0), 0u) << r.buffer;
    EXPECT_EQ(r.buffer_shape, pl::Shape({8, 128}));
    std::vector<std::pair<int64_t, int64_t>> whole = {{0, 8}, {0, 128}};
    EXPECT_EQ(r.overlap, whole);
    const std::string dma = "DMA 1 (started by device 0, core 0 at " + line_ref(__FILE__, start_line) + ")";
    // eager: the DMA wrote during start, then the core read; on_wait: the other way round.
    const pltpu::RaceAccess& dma_side = std::string(mode) == "eager" ? r.first : r.second;
    const pltpu::RaceAccess& core_side = std::string(mode) == "eager" ? r.second : r.first;
    EXPECT_TRUE(dma_side.is_write);
    EXPECT_EQ(dma_side.actor, dma);
    EXPECT_EQ(dma_side.what, "DMA write");
    EXPECT_EQ(dma_side.loc.to_string(), line_ref(__FILE__, start_line));
    EXPECT_FALSE(core_side.is_write);
    EXPECT_EQ(core_side.actor, "device 0, core 0");
    EXPECT_EQ(core_side.loc.to_string(), line_ref(__FILE__, read_line));
    std::string text = r.to_string();
    EXPECT_CONTAINS(text, "RACE DETECTED on scratch 0 (vmem, device 0, core 0) [8, 128], elements [0:8, 0:128]\n");
    EXPECT_CONTAINS(text, "  write by " + dma + " (DMA write) at " + line_ref(__FILE__, start_line) + "\n");
    EXPECT_CONTAINS(text, "  read by device 0, core 0 (");
    EXPECT_CONTAINS(text, ") at " + line_ref(__FILE__, read_line) + "\n");
  }
}

TEST(TpuRaces, TwoCoresWritingTheSameOutputBlock) {
  auto kernel = [](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all]; };
  pl::CallOptions opts;
  opts.grid = {2};
  opts.in_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })};
  opts.out_specs = {pl::BlockSpec({8, 128}, [](pl::Value) { return pl::Indices{0, 0}; })};
  opts.compiler_params = pltpu::CompilerParams{.dimension_semantics = {"parallel"}};
  std::shared_ptr<std::vector<pltpu::RaceReport>> races;
  pltpu::InterpretParams p = race_params(races);
  p.num_cores_per_device = 2;
  opts.interpret = p;
  const int call_line = __LINE__ + 1;
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
  call(iota_f32({16, 128}));
  ASSERT_EQ(races->size(), 1u) << all_reports(*races);
  const pltpu::RaceReport& r = races->front();
  EXPECT_EQ(r.buffer, "output outputs[0] (hbm, device 0)");
  std::set<std::string> actors = {r.first.actor, r.second.actor};
  EXPECT_EQ(actors, (std::set<std::string>{"device 0, core 0", "device 0, core 1"}));
  EXPECT_TRUE(r.first.is_write && r.second.is_write);
  EXPECT_EQ(r.first.what, "copy-out of output outputs[0]");
  EXPECT_EQ(r.second.what, "copy-out of output outputs[0]");
  // Machine copies are attributed to the pallas_call.
  EXPECT_EQ(r.first.loc.to_string(), line_ref(__FILE__, call_line));
  // The same kernel on one core has no race (the revisit is consecutive).
  p.num_cores_per_device = 1;
  opts.interpret = p;
  pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts)(iota_f32({16, 128}));
  EXPECT_TRUE(races->empty()) << all_reports(*races);
}

TEST(TpuRaces, TwoDevicesWritingTheSameRemoteBuffer) {
  // Devices 1 and 2 both send into the same rows of device 0's output, unsynchronised.
  const int line = __LINE__ + 4;
  auto kernel = [](pl::Ref x, pl::Ref o, pl::Ref send, pl::Ref recv) {
    pl::Value me = pltpu::axis_index("x");
    pl::when(me != 0, [&] {
      auto c = pltpu::async_remote_copy(x, o, send, recv, pltpu::DeviceId(0));
      c.wait_send();
    });
    pl::when(me == 0, [&] {
      pltpu::semaphore_wait(recv, 2 * 8 * 128 * 4);
    });
  };
  for (const char* mode : kModes) {
    std::shared_ptr<std::vector<pltpu::RaceReport>> races;
    pl::CallOptions opts;
    opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
    opts.out_specs = {pl::BlockSpec(pltpu::ANY)};
    opts.scratch_shapes = {pltpu::semaphores(DMA), pltpu::semaphores(DMA)};
    opts.interpret = race_params(races, mode);
    auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
    std::vector<std::vector<pl::Array>> args;
    for (int d = 0; d < 3; ++d) args.push_back({iota_f32({8, 128}, 1000.0f * d)});
    HangGuard guard;
    auto out = pltpu::run_on_mesh(call, pltpu::Mesh{{"x"}, {3}}, args);
    float v = out[0][0].data<float>()[0];
    EXPECT_TRUE(v == 1000.0f || v == 2000.0f) << v;
    ASSERT_EQ(races->size(), 1u) << mode << "\n" << all_reports(*races);
    const pltpu::RaceReport& r = races->front();
    EXPECT_EQ(r.buffer, "output outputs[0] (hbm, device 0)");
    EXPECT_TRUE(r.first.is_write && r.second.is_write);
    EXPECT_EQ(r.first.what, "DMA write");
    EXPECT_EQ(r.second.what, "DMA write");
    std::set<std::string> starters;
    for (const pltpu::RaceAccess* a : {&r.first, &r.second}) {
      EXPECT_EQ(a->loc.to_string(), line_ref(__FILE__, line));
      EXPECT_CONTAINS(a->actor, " at " + line_ref(__FILE__, line) + ")");
      starters.insert(a->actor.substr(a->actor.find("(started by ")));
    }
    EXPECT_EQ(starters, (std::set<std::string>{"(started by device 1, core 0 at " + line_ref(__FILE__, line) + ")",
                                               "(started by device 2, core 0 at " + line_ref(__FILE__, line) + ")"}));
  }
}

TEST(TpuRaces, OverlappingStridedDmasRace) {
  // Rows 0,2,4,6 and 2,4,6,8: rows 2..6 are written by both DMAs at once.
  const int line_a = __LINE__ + 2;
  auto kernel = [](pl::Ref x_hbm, pl::Ref o, pl::Ref buf, pl::Ref sems) {
    auto a = pltpu::async_copy(x_hbm.at(pl::ds(0, 4)), buf.at(pl::ds(0, 4, 2)), sems.at(0));
    auto b = pltpu::async_copy(x_hbm.at(pl::ds(4, 4)), buf.at(pl::ds(2, 4, 2)), sems.at(1));
    a.wait();
    b.wait();
    o[pl::all] = buf[pl::ds(0, 8)];
  };
  for (const char* mode : kModes) {
    std::shared_ptr<std::vector<pltpu::RaceReport>> races;
    pl::CallOptions opts;
    opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
    opts.scratch_shapes = {pltpu::VMEM({9, 128}, pl::f32), pltpu::semaphores(DMA, {2})};
    opts.interpret = race_params(races, mode);
    pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts)(iota_f32({8, 128}));
    ASSERT_EQ(races->size(), 1u) << mode << "\n" << all_reports(*races);
    const pltpu::RaceReport& r = races->front();
    std::vector<std::pair<int64_t, int64_t>> box = {{2, 7}, {0, 128}};
    EXPECT_EQ(r.overlap, box);
    std::set<int> lines = {r.first.loc.line, r.second.loc.line};
    EXPECT_EQ(lines, (std::set<int>{line_a, line_a + 1}));
  }
}

TEST(TpuRaces, StridedStoresByTwoCores) {
  // Core 0 stores the even rows, core 1 the odd rows (no race), or rows 2, 4, 6 (a race).
  for (int64_t second_start : {1, 2}) {
    auto body = [second_start](pl::Ref o_hbm, pl::Ref shared) {
      pl::Value core = pltpu::axis_index("core");
      pl::when(core == 0, [&] { shared[pl::ds(0, 4, 2)] = pl::full({4, 128}, pl::f32, 1.0); });
      pl::when(core == 1, [&] { shared[pl::ds(second_start, 3, 2)] = pl::full({3, 128}, pl::f32, 2.0); });
      (void)o_hbm;
    };
    std::shared_ptr<std::vector<pltpu::RaceReport>> races;
    auto call = pltpu::core_map(body, {pl::ShapeDtype({8, 128}, pl::f32)}, pltpu::TensorCoreMesh{"core", 2},
                                {.scratch_shapes = {pltpu::VMEM_SHARED({8, 128}, pl::f32)},
                                 .interpret = race_params(races)});
    call();
    if (second_start == 1) {
      EXPECT_TRUE(races->empty()) << all_reports(*races);
    } else {
      ASSERT_EQ(races->size(), 1u) << all_reports(*races);
      const pltpu::RaceReport& r = races->front();
      EXPECT_EQ(r.buffer, "scratch 0 (vmem_shared, device 0)");
      std::vector<std::pair<int64_t, int64_t>> box = {{2, 7}, {0, 128}};
      EXPECT_EQ(r.overlap, box);
      std::set<std::string> actors = {r.first.actor, r.second.actor};
      EXPECT_EQ(actors, (std::set<std::string>{"device 0, core 0", "device 0, core 1"}));
    }
  }
}

TEST(TpuRaces, UnsynchronisedSharedScratchBetweenCores) {
  // As VmemSharedScratchIsSharedByTheCores, without the semaphore: core 1's read races with
  // core 0's write.
  const int write_line = __LINE__ + 4;
  const int read_line = __LINE__ + 5;
  auto body = [](pl::Ref o_hbm, pl::Ref shared, pl::Ref local) {
    pl::Value core = pltpu::axis_index("core");
    pl::when(core == 0, [&] { shared[pl::all] = pl::full({8, 128}, pl::f32, 1.0); });
    pl::when(core == 1, [&] {
      local[pl::all] = shared[pl::all];
      pltpu::sync_copy(local, o_hbm);
    });
  };
  std::shared_ptr<std::vector<pltpu::RaceReport>> races;
  auto call = pltpu::core_map(body, {pl::ShapeDtype({8, 128}, pl::f32)}, pltpu::TensorCoreMesh{"core", 2},
                              {.scratch_shapes = {pltpu::VMEM_SHARED({8, 128}, pl::f32), pltpu::VMEM({8, 128}, pl::f32)},
                               .interpret = race_params(races)});
  call();
  ASSERT_EQ(races->size(), 1u) << all_reports(*races);
  const pltpu::RaceReport& r = races->front();
  EXPECT_EQ(r.buffer, "scratch 0 (vmem_shared, device 0)");
  const pltpu::RaceAccess& w = r.first.is_write ? r.first : r.second;
  const pltpu::RaceAccess& rd = r.first.is_write ? r.second : r.first;
  EXPECT_FALSE(rd.is_write);
  EXPECT_EQ(w.actor, "device 0, core 0");
  EXPECT_EQ(rd.actor, "device 0, core 1");
  EXPECT_EQ(w.loc.to_string(), line_ref(__FILE__, write_line));
  EXPECT_EQ(rd.loc.to_string(), line_ref(__FILE__, read_line));
}

TEST(TpuRaces, RacesAreErrors) {
  auto kernel = [](pl::Ref x_hbm, pl::Ref o, pl::Ref buf, pl::Ref sem) {
    auto copy = pltpu::async_copy(x_hbm, buf, sem);
    o[pl::all] = buf[pl::all];
    copy.wait();
  };
  for (const char* mode : kModes) {
    std::shared_ptr<std::vector<pltpu::RaceReport>> races;
    pltpu::InterpretParams p = race_params(races, mode);
    p.races_are_errors = true;
    pl::CallOptions opts;
    opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
    opts.scratch_shapes = {pltpu::VMEM({8, 128}, pl::f32), pltpu::semaphores(DMA)};
    opts.interpret = p;
    auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
    std::string msg = error_of<pltpu::RaceError>([&] { call(iota_f32({8, 128})); });
    EXPECT_CONTAINS(msg, "RACE DETECTED on scratch 0 (vmem, device 0, core 0) [8, 128], elements [0:8, 0:128]");
  }
}

TEST(TpuRaces, ReportsGoToStderrWithoutACollector) {
  auto kernel = [](pl::Ref x_hbm, pl::Ref o, pl::Ref buf, pl::Ref sem) {
    auto copy = pltpu::async_copy(x_hbm, buf, sem);
    o[pl::all] = buf[pl::all];
    copy.wait();
  };
  pltpu::InterpretParams p;
  p.detect_races = true;
  pl::CallOptions opts;
  opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
  opts.scratch_shapes = {pltpu::VMEM({8, 128}, pl::f32), pltpu::semaphores(DMA)};
  opts.interpret = p;
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
  testing::internal::CaptureStderr();
  call(iota_f32({8, 128}));
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_CONTAINS(err, "RACE DETECTED on scratch 0 (vmem, device 0, core 0)");
  // Detection off: nothing is reported.
  opts.interpret = pltpu::InterpretParams{};
  testing::internal::CaptureStderr();
  pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts)(iota_f32({8, 128}));
  EXPECT_NOT_CONTAINS(testing::internal::GetCapturedStderr(), "RACE");
}

TEST(TpuRaces, CollectorIsClearedWhenACallStarts) {
  auto racy = [](pl::Ref x_hbm, pl::Ref o, pl::Ref buf, pl::Ref sem) {
    auto copy = pltpu::async_copy(x_hbm, buf, sem);
    o[pl::all] = buf[pl::all];
    copy.wait();
  };
  auto clean = [](pl::Ref x_hbm, pl::Ref o, pl::Ref buf, pl::Ref sem) {
    pltpu::async_copy(x_hbm, buf, sem).wait();
    o[pl::all] = buf[pl::all];
  };
  std::shared_ptr<std::vector<pltpu::RaceReport>> races;
  pl::CallOptions opts;
  opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
  opts.scratch_shapes = {pltpu::VMEM({8, 128}, pl::f32), pltpu::semaphores(DMA)};
  opts.interpret = race_params(races);
  pl::pallas_call(racy, pl::ShapeDtype({8, 128}, pl::f32), opts)(iota_f32({8, 128}));
  EXPECT_EQ(races->size(), 1u);
  pl::Array o = pl::pallas_call(clean, pl::ShapeDtype({8, 128}, pl::f32), opts)(iota_f32({8, 128}))[0];
  EXPECT_TRUE(races->empty()) << all_reports(*races);
  EXPECT_EQ(o.data<float>()[999], 999.0f);
}

TEST(TpuRaces, SignalBeforeTheWriteDoesNotOrderIt) {
  // Core 0 signals first and writes after: core 1's read (after its wait) is not ordered after
  // that write. Signalling after the write (the correct order) is race free.
  for (bool signal_first : {true, false}) {
    auto body = [signal_first](pl::Ref o_hbm, pl::Ref shared, pl::Ref local, pl::Ref sem) {
      pl::Value core = pltpu::axis_index("core");
      pl::when(core == 0, [&] {
        if (signal_first) pltpu::semaphore_signal(sem, 1, {.core_index = pl::Operand(1)});
        shared[pl::all] = pl::full({8, 128}, pl::f32, 1.0);
        if (!signal_first) pltpu::semaphore_signal(sem, 1, {.core_index = pl::Operand(1)});
      });
      pl::when(core == 1, [&] {
        pltpu::semaphore_wait(sem, 1);
        local[pl::all] = shared[pl::all];
        pltpu::sync_copy(local, o_hbm);
      });
    };
    std::shared_ptr<std::vector<pltpu::RaceReport>> races;
    auto call = pltpu::core_map(body, {pl::ShapeDtype({8, 128}, pl::f32)}, pltpu::TensorCoreMesh{"core", 2},
                                {.scratch_shapes = {pltpu::VMEM_SHARED({8, 128}, pl::f32), pltpu::VMEM({8, 128}, pl::f32),
                                                    pltpu::semaphores(REGULAR)},
                                 .interpret = race_params(races)});
    HangGuard guard;
    call();
    if (signal_first) {
      ASSERT_EQ(races->size(), 1u) << all_reports(*races);
      EXPECT_EQ(races->front().buffer, "scratch 0 (vmem_shared, device 0)");
    } else {
      EXPECT_TRUE(races->empty()) << all_reports(*races);
    }
  }
}

TEST(TpuRaces, WritingTheSourceOfADmaInFlight) {
  // The core overwrites the DMA's source between start and wait.
  const int start_line = __LINE__ + 3;
  const int store_line = __LINE__ + 3;
  auto kernel = [](pl::Ref x, pl::Ref o_hbm, pl::Ref sem) {
    auto c = pltpu::async_copy(x, o_hbm, sem);
    x[pl::all] = pl::zeros({8, 128}, pl::f32);
    c.wait();
  };
  for (const char* mode : kModes) {
    std::shared_ptr<std::vector<pltpu::RaceReport>> races;
    pl::CallOptions opts;
    opts.out_specs = {pl::BlockSpec(pltpu::ANY)};
    opts.scratch_shapes = {pltpu::semaphores(DMA)};
    opts.interpret = race_params(races, mode);
    pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts)(iota_f32({8, 128}));
    ASSERT_EQ(races->size(), 1u) << mode << "\n" << all_reports(*races);
    const pltpu::RaceReport& r = races->front();
    EXPECT_EQ(r.buffer, "block of input args[0] (vmem, device 0, core 0)");
    std::set<std::string> whats = {r.first.what, r.second.what};
    EXPECT_EQ(whats, (std::set<std::string>{"DMA read", "store"})) << r.to_string();
    std::set<int> lines = {r.first.loc.line, r.second.loc.line};
    EXPECT_EQ(lines, (std::set<int>{start_line, store_line}));
  }
}

TEST(TpuRaces, ReadOfADeviceBufferBeforeTheIncomingCopyIsWaitedFor) {
  // Device 1 copies into device 0's scratch; device 0 reads the scratch before it waits on
  // its receive semaphore: the remote DMA's write and the read are unordered.
  auto kernel = [](pl::Ref o, pl::Ref buf, pl::Ref send, pl::Ref recv) {
    pl::Value me = pltpu::axis_index("x");
    pl::when(me == 1, [&] {
      buf[pl::all] = pl::full({8, 128}, pl::f32, 5.0);
      auto c = pltpu::async_remote_copy(buf, buf, send, recv, pltpu::DeviceId(0));
      c.wait_send();
    });
    pl::when(me == 0, [&] {
      // Reads buf before waiting for the incoming copy: a race with the remote DMA's write.
      o[pl::all] = buf[pl::all];
      pltpu::semaphore_wait(recv, 8 * 128 * 4);
    });
    pl::when(me == 1, [&] { o[pl::all] = buf[pl::all]; });
  };
  std::shared_ptr<std::vector<pltpu::RaceReport>> races;
  pl::CallOptions opts;
  opts.scratch_shapes = {pltpu::VMEM({8, 128}, pl::f32), pltpu::semaphores(DMA), pltpu::semaphores(DMA)};
  pltpu::InterpretParams p = race_params(races, "eager");
  p.uninitialized_memory = "zero";
  opts.interpret = p;
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
  HangGuard guard;
  pltpu::run_on_mesh(call, pltpu::Mesh{{"x"}, {2}}, std::vector<std::vector<pl::Array>>(2));
  ASSERT_EQ(races->size(), 1u) << all_reports(*races);
  const pltpu::RaceReport& r = races->front();
  EXPECT_EQ(r.buffer, "scratch 0 (vmem, device 0, core 0)");
  std::set<std::string> whats = {r.first.what, r.second.what};
  EXPECT_EQ(whats, (std::set<std::string>{"DMA write", "load"})) << r.to_string();
}
