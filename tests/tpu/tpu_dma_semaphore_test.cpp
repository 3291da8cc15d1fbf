// DMAs and semaphores in the TPU interpret mode: sync and async copies, strided views, byte
// counting DMA semaphores, remote copies, signals to other cores and devices, semaphore arrays,
// barrier semaphores, and the checks at kernel exit.
#include <sstream>

#include "tests/tpu/tpu_test_util.h"

using namespace tpu_test;

namespace {
pl::CallOptions any_io(int num_inputs, int num_outputs, std::vector<pl::ScratchShape> scratch,
                       const pltpu::InterpretParams& p) {
  pl::CallOptions opts;
  std::vector<pl::BlockSpec> in(num_inputs, pl::BlockSpec(pltpu::ANY));
  std::vector<pl::BlockSpec> out(num_outputs, pl::BlockSpec(pltpu::ANY));
  opts.in_specs = in;
  opts.out_specs = out;
  opts.scratch_shapes = std::move(scratch);
  opts.interpret = p;
  return opts;
}
pltpu::InterpretParams mode_params(const char* mode) {
  pltpu::InterpretParams p;
  p.dma_execution_mode = mode;
  return p;
}
const auto DMA = pltpu::SemaphoreType::DMA;
const auto REGULAR = pltpu::SemaphoreType::REGULAR;
}  // namespace

// ---- Local copies ----------------------------------------------------------------------------------
TEST(TpuDma, SyncCopyThroughVmem) {
  auto kernel = [](pl::Ref x_hbm, pl::Ref o_hbm, pl::Ref buf) {
    pltpu::sync_copy(x_hbm, buf);
    buf[pl::all] = buf[pl::all] * 2.0f + 1.0f;
    pltpu::sync_copy(buf, o_hbm);
  };
  for (const char* mode : kModes) {
    auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32),
                                any_io(1, 1, {pltpu::VMEM({8, 128}, pl::f32)}, mode_params(mode)));
    pl::Array x = iota_f32({8, 128});
    pl::Array o = call(x)[0];
    for (int64_t i = 0; i < x.size(); ++i) ASSERT_EQ(o.data<float>()[i], 2.0f * i + 1.0f) << mode;
  }
}

TEST(TpuDma, StridedAndSlicedViewsAsSourceAndDestination) {
  // buf rows 0..3 <- x rows 1,3,5,7; buf rows 4..7 <- x rows 0,2,4,6; o even rows <- x;
  // o odd rows <- buf; cols: o2 <- x's odd columns.
  auto kernel = [](pl::Ref x_hbm, pl::Ref o_hbm, pl::Ref o2_hbm, pl::Ref buf, pl::Ref cols,
                   pl::Ref sems) {
    auto a = pltpu::async_copy(x_hbm.at(pl::ds(1, 4, 2)), buf.at(pl::ds(0, 4)), sems.at(0));
    auto b = pltpu::async_copy(x_hbm.at(pl::ds(0, 4, 2)), buf.at(pl::ds(4, 4)), sems.at(1));
    auto c = pltpu::async_copy(x_hbm.at(pl::all, pl::ds(1, 64, 2)), cols, sems.at(2));
    b.wait();
    a.wait();
    c.wait();
    pltpu::sync_copy(x_hbm, o_hbm.at(pl::ds(0, 8, 2)));
    pltpu::sync_copy(buf, o_hbm.at(pl::ds(1, 8, 2)));
    pltpu::sync_copy(cols, o2_hbm);
  };
  for (const char* mode : kModes) {
    auto call = pl::pallas_call(
        kernel, {pl::ShapeDtype({16, 128}, pl::f32), pl::ShapeDtype({8, 64}, pl::f32)},
        any_io(1, 2,
               {pltpu::VMEM({8, 128}, pl::f32), pltpu::VMEM({8, 64}, pl::f32), pltpu::semaphores(DMA, {3})},
               mode_params(mode)));
    pl::Array x = iota_f32({8, 128});
    auto out = call(x);
    auto X = [&](int64_t r, int64_t c) { return x.data<float>()[r * 128 + c]; };
    for (int64_t r = 0; r < 16; ++r)
      for (int64_t c = 0; c < 128; ++c) {
        int64_t k = r / 2;
        float want = r % 2 == 0 ? X(k, c) : (k < 4 ? X(2 * k + 1, c) : X(2 * (k - 4), c));
        ASSERT_EQ(out[0].data<float>()[r * 128 + c], want) << mode << " " << r << "," << c;
      }
    for (int64_t r = 0; r < 8; ++r)
      for (int64_t c = 0; c < 64; ++c) ASSERT_EQ(out[1].data<float>()[r * 64 + c], X(r, 2 * c + 1)) << mode;
  }
}

TEST(TpuDma, CopiesBetweenScratchSpaces) {
  // VMEM -> SMEM -> VMEM_SHARED -> HBM output, each a DMA.
  auto kernel = [](pl::Ref x_hbm, pl::Ref o_hbm, pl::Ref v, pl::Ref s, pl::Ref shared) {
    pltpu::sync_copy(x_hbm, v);
    pltpu::sync_copy(v, s);
    s[3] = s[3] + 10;
    pltpu::sync_copy(s, shared);
    pltpu::sync_copy(shared, o_hbm);
  };
  for (const char* mode : kModes) {
    auto call = pl::pallas_call(kernel, pl::ShapeDtype({16}, pl::i32),
                                any_io(1, 1,
                                       {pltpu::VMEM({16}, pl::i32), pltpu::SMEM({16}, pl::i32),
                                        pltpu::VMEM_SHARED({16}, pl::i32)},
                                       mode_params(mode)));
    pl::Array o = call(iota_i32({16}, 5))[0];
    for (int i = 0; i < 16; ++i) ASSERT_EQ(o.data<int32_t>()[i], 5 + i + (i == 3 ? 10 : 0)) << mode;
  }
}

// ---- DMA semaphores count bytes -------------------------------------------------------------------
TEST(TpuDma, DmaSemaphoreCountsBytes) {
  // lane 0: the count right after start; lane 1: after the wait; lane 2: after a 2-row copy
  // (before its wait).
  auto kernel = [](pl::Ref x_hbm, pl::Ref o, pl::Ref buf, pl::Ref sem) {
    auto c = pltpu::async_copy(x_hbm, buf, sem);
    pl::Value after_start = pltpu::semaphore_read(sem);
    c.wait();
    pl::Value after_wait = pltpu::semaphore_read(sem);
    auto d = pltpu::async_copy(x_hbm.at(pl::ds(0, 2)), buf.at(pl::ds(4, 2)), sem);
    pl::Value small = pltpu::semaphore_read(sem);
    d.wait();
    pl::Value lane = pl::iota(pl::i32, {1, 128}, 1);
    o[pl::all] = pl::where(lane == 0, after_start, pl::where(lane == 1, after_wait, pl::where(lane == 2, small, -1)));
  };
  for (const char* mode : kModes) {
    pl::CallOptions opts = any_io(1, 0, {pltpu::VMEM({8, 128}, pl::f32), pltpu::semaphores(DMA)},
                                  mode_params(mode));
    opts.out_specs = {};
    auto call = pl::pallas_call(kernel, pl::ShapeDtype({1, 128}, pl::i32), opts);
    pl::Array o = call(iota_f32({8, 128}))[0];
    // eager: the DMA is done inside start, so its 8*128*4 bytes are there before the wait;
    // on_wait: reading the semaphore runs the DMAs queued on it (as a wait would), so a kernel
    // that polls makes progress — the same counts.
    EXPECT_EQ(o.data<int32_t>()[0], 8 * 128 * 4) << mode;
    EXPECT_EQ(o.data<int32_t>()[1], 0) << mode;
    EXPECT_EQ(o.data<int32_t>()[2], 2 * 128 * 4) << mode;
    EXPECT_EQ(o.data<int32_t>()[3], -1) << mode;
  }
}

TEST(TpuSemaphore, RegularSemaphoreReadSignalWait) {
  auto kernel = [](pl::Ref o, pl::Ref sem) {
    pl::Value r0 = pltpu::semaphore_read(sem);
    pltpu::semaphore_signal(sem, 3);
    pl::Value r1 = pltpu::semaphore_read(sem);
    pltpu::semaphore_wait(sem, 2);
    pl::Value r2 = pltpu::semaphore_read(sem);
    pltpu::semaphore_wait(sem);  // value 1
    pl::Value r3 = pltpu::semaphore_read(sem);
    pl::Value lane = pl::iota(pl::i32, {1, 128}, 1);
    o[pl::all] = pl::where(lane == 0, r0, pl::where(lane == 1, r1, pl::where(lane == 2, r2, r3)));
  };
  pl::CallOptions opts;
  opts.scratch_shapes = {pltpu::semaphores(REGULAR)};
  opts.interpret = pltpu::InterpretParams{};
  pl::Array o = pl::pallas_call(kernel, pl::ShapeDtype({1, 128}, pl::i32), opts)()[0];
  EXPECT_EQ(o.data<int32_t>()[0], 0);
  EXPECT_EQ(o.data<int32_t>()[1], 3);
  EXPECT_EQ(o.data<int32_t>()[2], 1);
  EXPECT_EQ(o.data<int32_t>()[3], 0);
}

TEST(TpuSemaphore, SemaphoreArrays) {
  // sems[i] gets i + 1 signals; DMA sems[0] and [1] carry two copies.
  auto kernel = [](pl::Ref x_hbm, pl::Ref o, pl::Ref buf, pl::Ref sems, pl::Ref dsems) {
    for (int i = 0; i < 3; ++i) pltpu::semaphore_signal(sems.at(i), i + 1);
    pl::Value lane = pl::iota(pl::i32, {1, 128}, 1);
    pl::Value row = pl::zeros({1, 128}, pl::i32);
    for (int i = 0; i < 3; ++i) row = pl::where(lane == i, pltpu::semaphore_read(sems.at(i)), row);
    // A traced index into the array.
    pl::fori_loop(0, 3, [&](pl::Value i) { pltpu::semaphore_wait(sems.at(i), i + 1); });
    auto a = pltpu::async_copy(x_hbm.at(pl::ds(0, 4)), buf.at(pl::ds(4, 4)), dsems.at(1));
    auto b = pltpu::async_copy(x_hbm.at(pl::ds(4, 4)), buf.at(pl::ds(0, 4)), dsems.at(0));
    a.wait();
    b.wait();
    o[pl::ds(0, 1)] = row.astype(pl::f32);
    o[pl::ds(1, 8)] = buf[pl::all];
  };
  for (const char* mode : kModes) {
    pl::CallOptions opts;
    opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
    opts.scratch_shapes = {pltpu::VMEM({8, 128}, pl::f32), pltpu::semaphores(REGULAR, {3}),
                           pltpu::semaphores(DMA, {2})};
    opts.interpret = mode_params(mode);
    pl::Array x = iota_f32({8, 128});
    pl::Array o = pl::pallas_call(kernel, pl::ShapeDtype({9, 128}, pl::f32), opts)(x)[0];
    for (int i = 0; i < 3; ++i) EXPECT_EQ(o.data<float>()[i], i + 1.0f) << mode;
    for (int64_t r = 0; r < 8; ++r)
      for (int64_t c = 0; c < 128; ++c)
        ASSERT_EQ(o.data<float>()[(r + 1) * 128 + c], x.data<float>()[((r + 4) % 8) * 128 + c]) << mode;
  }
}

// ---- Remote copies and signals between devices ---------------------------------------------------
TEST(TpuDma, RemoteCopyWithWaitSendAndWaitRecv) {
  // Two devices swap their inputs.
  auto kernel = [](pl::Ref x, pl::Ref o, pl::Ref send, pl::Ref recv) {
    pl::Value other = 1 - pltpu::axis_index("x");
    auto c = pltpu::make_async_remote_copy(x, o, send, recv, pltpu::DeviceId(other));
    c.start();
    c.wait_send();
    c.wait_recv();
  };
  for (const char* mode : kModes) {
    auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32),
                                any_io(1, 1, {pltpu::semaphores(DMA), pltpu::semaphores(DMA)},
                                       mode_params(mode)));
    std::vector<std::vector<pl::Array>> args = {{iota_f32({8, 128})}, {iota_f32({8, 128}, 5000)}};
    auto out = pltpu::run_on_mesh(call, pltpu::Mesh{{"x"}, {2}}, args);
    for (int d = 0; d < 2; ++d)
      for (int64_t i = 0; i < 8 * 128; ++i)
        ASSERT_EQ(out[d][0].data<float>()[i], args[1 - d][0].data<float>()[i]) << mode << " device " << d;
  }
}

TEST(TpuDma, RemoteCopyOfSlicesWithLogicalDeviceIds) {
  // Each of 4 devices sends rows [2d, 2d+2) of its input into the same rows of device 0's
  // output (disjoint rows, so no race); device 0 waits for the three incoming copies.
  auto kernel = [](pl::Ref x, pl::Ref o, pl::Ref send, pl::Ref recv) {
    pl::Value me = pltpu::axis_index("x");
    pl::when(me == 0, [&] { pltpu::sync_copy(x.at(pl::ds(0, 2)), o.at(pl::ds(0, 2))); });
    pl::when(me != 0, [&] {
      auto c = pltpu::async_remote_copy(x.at(pl::ds(me * 2, 2)), o.at(pl::ds(me * 2, 2)), send, recv,
                                        pltpu::DeviceId(0), pltpu::DeviceIdType::LOGICAL);
      c.wait_send();
    });
    pl::when(me == 0, [&] {
      // Three copies of 2 rows arrive on device 0's receive semaphore.
      auto r = pltpu::make_async_copy(x.at(pl::ds(0, 6)), o.at(pl::ds(0, 6)), recv);
      r.wait_recv();
    });
    pl::when(me != 0, [&] { pltpu::sync_copy(x, o); });
  };
  for (const char* mode : kModes) {
    std::shared_ptr<std::vector<pltpu::RaceReport>> races;
    auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32),
                                any_io(1, 1, {pltpu::semaphores(DMA), pltpu::semaphores(DMA)},
                                       race_params(races, mode)));
    std::vector<std::vector<pl::Array>> args;
    for (int d = 0; d < 4; ++d) args.push_back({iota_f32({8, 128}, 10000.0f * d)});
    auto out = pltpu::run_on_mesh(call, pltpu::Mesh{{"x"}, {4}}, args);
    for (int64_t r = 0; r < 8; ++r)
      for (int64_t c = 0; c < 128; ++c)
        ASSERT_EQ(out[0][0].data<float>()[r * 128 + c], args[r / 2][0].data<float>()[r * 128 + c])
            << mode << " row " << r;
    for (int d = 1; d < 4; ++d)
      ASSERT_EQ(out[d][0].data<float>()[300], args[d][0].data<float>()[300]);
    EXPECT_TRUE(races->empty()) << all_reports(*races);
  }
}

TEST(TpuDma, RemoteCopyOnATwoDimensionalMesh) {
  // A 2x2 mesh (x, y): every device sends to the device with the same x and the other y, named
  // by axis ({"y": 1 - y}); x is kept.
  auto kernel = [](pl::Ref in, pl::Ref o, pl::Ref send, pl::Ref recv) {
    pl::Value y = pltpu::axis_index("y");
    auto c = pltpu::make_async_remote_copy(in, o, send, recv, pltpu::DeviceId::named({{"y", 1 - y}}));
    c.start();
    c.wait();
  };
  for (const char* mode : kModes) {
    auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32),
                                any_io(1, 1, {pltpu::semaphores(DMA), pltpu::semaphores(DMA)},
                                       mode_params(mode)));
    std::vector<std::vector<pl::Array>> args;
    for (int d = 0; d < 4; ++d) args.push_back({iota_f32({8, 128}, 1000.0f * d)});
    auto out = pltpu::run_on_mesh(call, pltpu::Mesh{{"x", "y"}, {2, 2}}, args);
    for (int d = 0; d < 4; ++d) {
      int x = d / 2, y = d % 2;
      int from = x * 2 + (1 - y);
      for (int64_t i = 0; i < 8 * 128; i += 37)
        ASSERT_EQ(out[d][0].data<float>()[i], args[from][0].data<float>()[i]) << mode << " device " << d;
    }
  }
}

TEST(TpuSemaphore, SignalOtherDevicesByLogicalAndMeshIds) {
  // Ring of 4: each device signals its right neighbour with (its id + 1) and waits for exactly
  // what its left neighbour sends. Too little would deadlock, too much would fail the exit
  // check. The second signal uses MESH coordinates.
  auto kernel = [](pl::Ref o, pl::Ref sem) {
    pl::Value me = pltpu::axis_index("x");
    pl::Value right = (me + 1) % 4, left = (me + 3) % 4;
    pltpu::semaphore_signal(sem, me + 1, {.device_id = pltpu::DeviceId(right),
                                          .device_id_type = pltpu::DeviceIdType::LOGICAL});
    pltpu::semaphore_signal(sem, 10 * (me + 1), {.device_id = pltpu::DeviceId(std::vector<pl::Operand>{right})});
    pltpu::semaphore_wait(sem, 11 * (left + 1));
    o[pl::all] = pl::full({1, 128}, pl::i32, 0) + left;
  };
  pl::CallOptions opts;
  opts.scratch_shapes = {pltpu::semaphores(REGULAR)};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({1, 128}, pl::i32), opts);
  HangGuard guard;
  auto out = pltpu::run_on_mesh(call, pltpu::Mesh{{"x"}, {4}}, std::vector<std::vector<pl::Array>>(4));
  for (int d = 0; d < 4; ++d) EXPECT_EQ(out[d][0].data<int32_t>()[7], (d + 3) % 4);
}

TEST(TpuSemaphore, SignalOnATwoDimensionalMeshByNamedAxis) {
  // 2x4 mesh: each device signals the device at (x, (y + 1) % 4) (x kept) with 1 + x * 4 + y.
  auto kernel = [](pl::Ref o, pl::Ref sem) {
    pl::Value x = pltpu::axis_index("x"), y = pltpu::axis_index("y");
    pltpu::semaphore_signal(sem, 1 + x * 4 + y, {.device_id = pltpu::DeviceId::named({{"y", (y + 1) % 4}})});
    pl::Value from = 1 + x * 4 + (y + 3) % 4;
    pltpu::semaphore_wait(sem, from);
    o[pl::all] = pl::full({1, 128}, pl::i32, 0) + x * 100 + y;
  };
  pl::CallOptions opts;
  opts.scratch_shapes = {pltpu::semaphores(REGULAR)};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({1, 128}, pl::i32), opts);
  HangGuard guard;
  auto out = pltpu::run_on_mesh(call, pltpu::Mesh{{"x", "y"}, {2, 4}}, std::vector<std::vector<pl::Array>>(8));
  for (int d = 0; d < 8; ++d) EXPECT_EQ(out[d][0].data<int32_t>()[0], (d / 4) * 100 + d % 4);
}

// ---- Signals between cores --------------------------------------------------------------------------
TEST(TpuSemaphore, SignalAnotherCoreWithCoreIndex) {
  // Core 0 signals core 1's semaphore by 3; core 1 waits for 3. Each core writes its own half.
  auto body = [](pl::Ref o_hbm, pl::Ref buf, pl::Ref sem) {
    pl::Value core = pltpu::axis_index("core");
    pl::when(core == 0, [&] { pltpu::semaphore_signal(sem, 3, {.core_index = pl::Operand(1)}); });
    pl::when(core == 1, [&] { pltpu::semaphore_wait(sem, 3); });
    buf[pl::all] = pl::full({4, 128}, pl::f32, 1.0) * (core + 1).astype(pl::f32);
    pltpu::sync_copy(buf, o_hbm.at(pl::ds(core * 4, 4)));
  };
  auto call = pltpu::core_map(body, {pl::ShapeDtype({8, 128}, pl::f32)}, pltpu::TensorCoreMesh{"core", 2},
                              {.scratch_shapes = {pltpu::VMEM({4, 128}, pl::f32), pltpu::semaphores(REGULAR)}});
  HangGuard guard;
  pl::Array o = call()[0];
  for (int64_t r = 0; r < 8; ++r) ASSERT_EQ(o.data<float>()[r * 128 + 5], r < 4 ? 1.0f : 2.0f);
}

TEST(TpuSemaphore, SignalDefaultsToTheCurrentCore) {
  // Every core signals without core_index, then waits: each signal must reach its own core.
  auto body = [](pl::Ref o_hbm, pl::Ref buf, pl::Ref sem) {
    pl::Value core = pltpu::axis_index("core");
    pltpu::semaphore_signal(sem, 2);
    pltpu::semaphore_wait(sem, 2);
    buf[pl::all] = pl::full({1, 128}, pl::i32, 0) + core;
    pltpu::sync_copy(buf, o_hbm.at(pl::ds(core, 1)));
  };
  auto call = pltpu::core_map(body, {pl::ShapeDtype({4, 128}, pl::i32)}, pltpu::TensorCoreMesh{"core", 4},
                              {.scratch_shapes = {pltpu::VMEM({1, 128}, pl::i32), pltpu::semaphores(REGULAR)}});
  HangGuard guard;
  pl::Array o = call()[0];
  for (int r = 0; r < 4; ++r) EXPECT_EQ(o.data<int32_t>()[r * 128], r);
}

TEST(TpuSemaphore, CoreIndexOutOfRange) {
  auto body = [](pl::Ref o_hbm, pl::Ref sem) {
    (void)o_hbm;
    pltpu::semaphore_signal(sem, 1, {.core_index = pl::Operand(2)});
  };
  auto call = pltpu::core_map(body, {pl::ShapeDtype({8, 128}, pl::f32)}, pltpu::TensorCoreMesh{"core", 2},
                              {.scratch_shapes = {pltpu::semaphores(REGULAR)}});
  HangGuard guard;
  EXPECT_CONTAINS(error_of([&] { call(); }), "semaphore_signal: core_index 2 is out of range (each device has 2 cores)");
}

// ---- Barrier semaphores -----------------------------------------------------------------------------
TEST(TpuSemaphore, BarrierSemaphoreBetweenNeighbours) {
  // The collective pattern: signal both neighbours' barrier semaphore, wait for 2, then a
  // remote copy to the right.
  auto kernel = [](pl::Ref x, pl::Ref o, pl::Ref send, pl::Ref recv) {
    pl::Value me = pltpu::axis_index("x");
    pl::Value right = (me + 1) % 4, left = (me + 3) % 4;
    pl::Ref barrier = pltpu::get_barrier_semaphore();
    pltpu::semaphore_signal(barrier, 1, {.device_id = pltpu::DeviceId(left)});
    pltpu::semaphore_signal(barrier, 1, {.device_id = pltpu::DeviceId(right)});
    pltpu::semaphore_wait(barrier, 2);
    auto c = pltpu::make_async_remote_copy(x, o, send, recv, pltpu::DeviceId(right));
    c.start();
    c.wait();
  };
  for (const char* mode : kModes) {
    std::shared_ptr<std::vector<pltpu::RaceReport>> races;
    pl::CallOptions opts = any_io(1, 1, {pltpu::semaphores(DMA), pltpu::semaphores(DMA)}, race_params(races, mode));
    opts.compiler_params = pltpu::CompilerParams{.collective_id = 7};
    auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
    std::vector<std::vector<pl::Array>> args;
    for (int d = 0; d < 4; ++d) args.push_back({iota_f32({8, 128}, 100.0f * d)});
    HangGuard guard;
    auto out = pltpu::run_on_mesh(call, pltpu::Mesh{{"x"}, {4}}, args);
    for (int d = 0; d < 4; ++d)
      for (int64_t i = 0; i < 8 * 128; i += 11)
        ASSERT_EQ(out[d][0].data<float>()[i], args[(d + 3) % 4][0].data<float>()[i]) << mode;
    EXPECT_TRUE(races->empty()) << all_reports(*races);
  }
}

TEST(TpuSemaphore, BarrierSemaphoreNeedsACollectiveId) {
  const int line = __LINE__ + 2;
  auto kernel = [](pl::Ref o) {
    pl::Ref barrier = pltpu::get_barrier_semaphore();
    pltpu::semaphore_signal(barrier, 1);
    pltpu::semaphore_wait(barrier, 1);
    o[pl::all] = pl::zeros({8, 128}, pl::f32);
  };
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), {.interpret = pltpu::InterpretParams{}});
  EXPECT_EQ(error_of([&] { call(); }),
            "get_barrier_semaphore needs a collective id: pass .compiler_params = "
            "pltpu::CompilerParams{.collective_id = 0} (at " + line_ref(__FILE__, line) + ")");
}

// ---- Exit checks ---------------------------------------------------------------------------------
TEST(TpuSemaphore, NonZeroSemaphoreAtExitIsAnErrorOrAWarning) {
  auto kernel = [](pl::Ref o, pl::Ref sems) {
    pltpu::semaphore_signal(sems.at(1), 2);
    o[pl::all] = pl::full({8, 128}, pl::f32, 3.0);
  };
  pl::CallOptions opts;
  opts.scratch_shapes = {pltpu::semaphores(REGULAR, {2})};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
  std::string msg = error_of([&] { call(); });
  EXPECT_CONTAINS(msg, "the kernel ended with unfinished synchronisation");
  EXPECT_CONTAINS(msg, "scratch 0[1] (regular semaphore) has count 2 on device 0, core 0");
  EXPECT_NOT_CONTAINS(msg, "scratch 0[0]");

  pltpu::InterpretParams warn;
  warn.nonzero_semaphores_at_exit = "warn";
  opts.interpret = warn;
  auto call2 = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
  testing::internal::CaptureStderr();
  pl::Array o = call2()[0];
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_CONTAINS(err, "warning: the kernel ended with unfinished synchronisation");
  EXPECT_CONTAINS(err, "scratch 0[1] (regular semaphore) has count 2 on device 0, core 0");
  EXPECT_EQ(o.data<float>()[100], 3.0f);
}

TEST(TpuDma, DmaNeverWaitedOnIsReportedAtExit) {
  const int line = __LINE__ + 2;
  auto kernel = [](pl::Ref x_hbm, pl::Ref o, pl::Ref buf, pl::Ref sem) {
    pltpu::async_copy(x_hbm, buf, sem);
    o[pl::all] = pl::zeros({8, 128}, pl::f32);
  };
  for (const char* mode : kModes) {
    pl::CallOptions opts;
    opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
    opts.scratch_shapes = {pltpu::VMEM({8, 128}, pl::f32), pltpu::semaphores(DMA)};
    opts.interpret = mode_params(mode);
    auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
    std::string msg = error_of([&] { call(iota_f32({8, 128})); });
    EXPECT_CONTAINS(msg, "the kernel ended with unfinished synchronisation");
    if (std::string(mode) == "on_wait") {
      // Never waited on, so never run.
      EXPECT_CONTAINS(msg, "DMA 1 (started by device 0, core 0 at " + line_ref(__FILE__, line) +
                               ") never completed");
    } else {
      // Done inside start, but its bytes were never waited for.
      EXPECT_NOT_CONTAINS(msg, "never completed");
      EXPECT_CONTAINS(msg, "scratch 1 (DMA semaphore) has count 4096 on device 0, core 0");
    }
  }
}

TEST(TpuDma, ByteCountsFollowTheDtype) {
  // A bf16 (8, 128) copy is 2048 bytes, an i8 (4, 128) copy 512.
  auto kernel = [](pl::Ref a_hbm, pl::Ref b_hbm, pl::Ref o, pl::Ref abuf, pl::Ref bbuf, pl::Ref sem) {
    pltpu::async_copy(a_hbm, abuf, sem);
    pl::Value na = pltpu::semaphore_read(sem);
    pltpu::semaphore_wait(sem, na);
    pltpu::async_copy(b_hbm, bbuf, sem);
    pl::Value nb = pltpu::semaphore_read(sem);
    pltpu::semaphore_wait(sem, nb);
    pl::Value lane = pl::iota(pl::i32, {1, 128}, 1);
    o[pl::all] = pl::where(lane == 0, na, pl::where(lane == 1, nb, 0));
  };
  pl::CallOptions opts;
  opts.in_specs = {pl::BlockSpec(pltpu::ANY), pl::BlockSpec(pltpu::ANY)};
  opts.scratch_shapes = {pltpu::VMEM({8, 128}, pl::bf16), pltpu::VMEM({4, 128}, pl::i8), pltpu::semaphores(DMA)};
  opts.interpret = mode_params("eager");
  pl::Array o = pl::pallas_call(kernel, pl::ShapeDtype({1, 128}, pl::i32), opts)(
      pl::Array::zeros({8, 128}, pl::bf16), pl::Array::zeros({4, 128}, pl::i8))[0];
  EXPECT_EQ(o.data<int32_t>()[0], 2048);
  EXPECT_EQ(o.data<int32_t>()[1], 512);
}

TEST(TpuDma, MismatchedCopyShapesAreRejectedWhenTraced) {
  const int line = __LINE__ + 2;
  auto kernel = [](pl::Ref x_hbm, pl::Ref o, pl::Ref buf, pl::Ref sem) {
    pltpu::async_copy(x_hbm, buf, sem).wait();
    o[pl::all] = buf[pl::all];
  };
  pl::CallOptions opts;
  opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
  opts.scratch_shapes = {pltpu::VMEM({4, 128}, pl::f32), pltpu::semaphores(DMA)};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({4, 128}, pl::f32), opts);
  std::string msg = error_of([&] { call.trace({pl::ShapeDtype({8, 128}, pl::f32)}); });
  EXPECT_EQ(msg, "dma_start: source ref<f32[8,128], any> and destination ref<f32[4,128], vmem> must have the "
                 "same shape and dtype (at " + line_ref(__FILE__, line) + ")");
}

TEST(TpuSemaphore, LoggingModeWritesPrefixedLines) {
  auto kernel = [](pl::Ref x_hbm, pl::Ref o, pl::Ref buf, pl::Ref sem, pl::Ref dsem) {
    pltpu::semaphore_signal(sem, 2);
    pltpu::semaphore_wait(sem, 2);
    pltpu::async_copy(x_hbm, buf, dsem).wait();
    o[pl::all] = buf[pl::all];
  };
  std::ostringstream log;
  pltpu::InterpretParams p;
  p.logging_mode = "semaphore,dma";
  p.log = &log;
  pl::CallOptions opts;
  opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
  opts.scratch_shapes = {pltpu::VMEM({8, 128}, pl::f32), pltpu::semaphores(REGULAR), pltpu::semaphores(DMA)};
  opts.interpret = p;
  pl::Array o = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts)(iota_f32({8, 128}))[0];
  EXPECT_EQ(o.data<float>()[9], 9.0f);
  std::string text = log.str();
  EXPECT_CONTAINS(text, "Device 0, core 0: semaphore_signal scratch 1 += 2 on global core 0 (now 2) at tpu_dma_semaphore_test.cpp:");
  EXPECT_CONTAINS(text, "Device 0, core 0: semaphore_wait scratch 1 -= 2 (now 0) at ");
  EXPECT_CONTAINS(text, "Device 0, core 0: dma_start DMA 1 (started by device 0, core 0 at ");
  EXPECT_CONTAINS(text, "4096 bytes to scratch 0 (vmem, device 0, core 0)");
  EXPECT_CONTAINS(text, "Device 0, core 0: dma_wait scratch 2 -= 4096 (now 0) at ");
  // Every line has the prefix.
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) EXPECT_EQ(line.rfind("Device 0, core 0: ", 0), 0u) << line;
  pltpu::InterpretParams bad;
  bad.logging_mode = "semaphore,verbose";
  opts.interpret = bad;
  EXPECT_CONTAINS(error_of([&] { pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts)(iota_f32({8, 128})); }),
                  "InterpretParams.logging_mode (each item) must be one of \"semaphore\", \"shared_memory\", \"dma\", "
                  "\"barrier\", got \"verbose\"");
}

TEST(TpuSemaphore, ExitCheckNamesTheDeviceAndCoreOfALeftoverSignal) {
  // Device 0 signals device 1 (core 1 of it), which never waits.
  auto body = [](pl::Ref o_hbm, pl::Ref sem) {
    (void)o_hbm;
    pl::Value dev = pltpu::axis_index("d"), core = pltpu::axis_index("core");
    pl::when((dev == 0) && (core == 0), [&] {
      pltpu::semaphore_signal(sem, 4, {.device_id = pltpu::DeviceId(1), .core_index = pl::Operand(1)});
    });
  };
  auto call = pltpu::core_map(body, {pl::ShapeDtype({8, 128}, pl::f32)}, pltpu::TensorCoreMesh{"core", 2},
                              {.scratch_shapes = {pltpu::semaphores(REGULAR)}});
  HangGuard guard;
  std::string msg = error_of([&] {
    pltpu::run_on_mesh(call, pltpu::Mesh{{"d"}, {2}}, std::vector<std::vector<pl::Array>>(2));
  });
  EXPECT_CONTAINS(msg, "the kernel ended with unfinished synchronisation");
  EXPECT_CONTAINS(msg, "\n  scratch 0 (regular semaphore) has count 4 on device 1, core 1");
  EXPECT_NOT_CONTAINS(msg, "on device 0");
}
