// Cores and devices in the TPU interpret mode: parallel grids over several cores, core_map,
// VMEM_SHARED and run_scoped HBM shared by a device's cores, run_on_mesh over 1-D and 2-D
// meshes, device id errors, and failure on one core or device ending the whole call.
#include <chrono>

#include "tests/tpu/tpu_test_util.h"

using namespace tpu_test;

namespace {
const auto REGULAR = pltpu::SemaphoreType::REGULAR;
}

// ---- Cores ---------------------------------------------------------------------------------------------
TEST(TpuCores, ParallelGridGivesTheSameResultOnAnyNumberOfCores) {
  // o[i] = x[i] * 2 + i over a parallel grid, including a grid that does not divide evenly.
  auto kernel = [](pl::Ref x, pl::Ref o) {
    o[pl::all] = x[pl::all] * 2.0f + pl::program_id(0).astype(pl::f32);
  };
  for (int64_t n : {8, 5}) {
    pl::Array x = iota_f32({n * 8, 128}, -300.0f);
    for (int cores : {1, 2, 4}) {
      pl::CallOptions opts;
      opts.grid = {n};
      opts.in_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })};
      opts.out_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })};
      opts.compiler_params = pltpu::CompilerParams{.dimension_semantics = {"parallel"}};
      std::shared_ptr<std::vector<pltpu::RaceReport>> races;
      pltpu::InterpretParams p = race_params(races);
      p.num_cores_per_device = cores;
      opts.interpret = p;
      pl::Array o = pl::pallas_call(kernel, pl::ShapeDtype({n * 8, 128}, pl::f32), opts)(x)[0];
      for (int64_t r = 0; r < n * 8; ++r)
        for (int64_t c = 0; c < 128; ++c)
          ASSERT_EQ(o.data<float>()[r * 128 + c], x.data<float>()[r * 128 + c] * 2.0f + static_cast<float>(r / 8))
              << cores << " cores, grid " << n;
      EXPECT_TRUE(races->empty()) << all_reports(*races);
    }
  }
}

TEST(TpuCores, CoreMapAxisIndexAndRunOnFirstCore) {
  // Each of 4 cores writes row `core` of o (core * 10 + column); only core 0 writes `first`.
  auto body = [](pl::Ref x_hbm, pl::Ref o_hbm, pl::Ref first_hbm, pl::Ref row) {
    pl::Value core = pltpu::axis_index("core");
    pltpu::sync_copy(x_hbm.at(pl::ds(core, 1)), row);
    row[pl::all] = row[pl::all] + core * 10;
    pltpu::sync_copy(row, o_hbm.at(pl::ds(core, 1)));
    pltpu::run_on_first_core("core", [&] {
      row[pl::all] = pl::full({1, 128}, pl::i32, 0) - 7 + core;
      pltpu::sync_copy(row, first_hbm);
    });
  };
  std::vector<std::pair<std::vector<int64_t>, int>> seen;
  pltpu::InterpretParams p;
  p.grid_point_recorder = [&](const std::vector<int64_t>& pt, int core) { seen.emplace_back(pt, core); };
  auto call = pltpu::core_map(body, {pl::ShapeDtype({4, 128}, pl::i32), pl::ShapeDtype({1, 128}, pl::i32)},
                              pltpu::TensorCoreMesh{"core", 4},
                              {.scratch_shapes = {pltpu::VMEM({1, 128}, pl::i32)}, .interpret = p});
  pl::Array x = iota_i32({4, 128});
  auto out = call(x);
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 128; ++c) ASSERT_EQ(out[0].data<int32_t>()[r * 128 + c], r * 128 + c + r * 10);
  for (int c = 0; c < 128; ++c) ASSERT_EQ(out[1].data<int32_t>()[c], -7);
  // A core_map runs one grid point per core, unpermuted: point (c,) on core c.
  ASSERT_EQ(seen.size(), 4u);
  std::sort(seen.begin(), seen.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  for (int c = 0; c < 4; ++c) EXPECT_EQ(seen[c], std::make_pair(std::vector<int64_t>{c}, c));
}

TEST(TpuCores, VmemSharedScratchIsSharedByTheCores) {
  // Core 0 writes the shared scratch and signals core 1, which reads it.
  auto body = [](pl::Ref x_hbm, pl::Ref o_hbm, pl::Ref shared, pl::Ref local, pl::Ref sem) {
    pl::Value core = pltpu::axis_index("core");
    pl::when(core == 0, [&] {
      pltpu::sync_copy(x_hbm, local);
      shared[pl::all] = local[pl::all] + 1.0f;
      pltpu::semaphore_signal(sem, 1, {.core_index = pl::Operand(1)});
    });
    pl::when(core == 1, [&] {
      pltpu::semaphore_wait(sem, 1);
      local[pl::all] = shared[pl::all] * 2.0f;
      pltpu::sync_copy(local, o_hbm);
    });
  };
  for (const char* mode : kModes) {
    std::shared_ptr<std::vector<pltpu::RaceReport>> races;
    auto call = pltpu::core_map(body, {pl::ShapeDtype({8, 128}, pl::f32)}, pltpu::TensorCoreMesh{"core", 2},
                                {.scratch_shapes = {pltpu::VMEM_SHARED({8, 128}, pl::f32), pltpu::VMEM({8, 128}, pl::f32),
                                                    pltpu::semaphores(REGULAR)},
                                 .interpret = race_params(races, mode)});
    HangGuard guard;
    pl::Array x = iota_f32({8, 128});
    pl::Array o = call(x)[0];
    for (int64_t i = 0; i < 8 * 128; ++i) ASSERT_EQ(o.data<float>()[i], (i + 1.0f) * 2.0f) << mode;
    EXPECT_TRUE(races->empty()) << all_reports(*races);
  }
}

TEST(TpuCores, RunScopedHbmIsSharedByTheCoresWhenAllowed) {
  // Core 0 fills a run_scoped HBM buffer and leaves the scope before core 1 (woken by a signal)
  // enters it: the buffer is one per device and lives until every core has left it.
  auto body = [](pl::Ref x_hbm, pl::Ref o_hbm, pl::Ref sem) {
    pl::Value core = pltpu::axis_index("core");
    pl::when(core == 1, [&] { pltpu::semaphore_wait(sem, 1); });
    pl::run_scoped({{{8, 128}, pl::f32, pltpu::HBM}}, [&](std::vector<pl::Ref> s) {
      pl::when(core == 0, [&] { pltpu::sync_copy(x_hbm, s[0]); });
      pl::when(core == 1, [&] { pltpu::sync_copy(s[0], o_hbm); });
      return std::vector<pl::Value>{};
    });
    pl::when(core == 0, [&] { pltpu::semaphore_signal(sem, 1, {.core_index = pl::Operand(1)}); });
  };
  pltpu::InterpretParams p;
  p.allow_hbm_allocation_in_run_scoped = true;
  auto call = pltpu::core_map(body, {pl::ShapeDtype({8, 128}, pl::f32)}, pltpu::TensorCoreMesh{"core", 2},
                              {.scratch_shapes = {pltpu::semaphores(REGULAR)}, .interpret = p});
  HangGuard guard;
  pl::Array x = iota_f32({8, 128}, 3.0f);
  for (int rep = 0; rep < 3; ++rep) {
    pl::Array o = call(x)[0];
    for (int64_t i = 0; i < 8 * 128; ++i) ASSERT_EQ(o.data<float>()[i], i + 3.0f) << "rep " << rep;
  }
}

TEST(TpuCores, RunScopedHbmIsRejectedByDefault) {
  const int line = __LINE__ + 2;
  auto kernel = [](pl::Ref x_hbm, pl::Ref o) {
    pl::run_scoped({{{8, 128}, pl::f32, pltpu::HBM}}, [&](std::vector<pl::Ref> s) {
      pltpu::sync_copy(x_hbm, s[0]);
      return std::vector<pl::Value>{};
    });
    o[pl::all] = pl::zeros({8, 128}, pl::f32);
  };
  pl::CallOptions opts;
  opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
  EXPECT_EQ(error_of([&] { call(iota_f32({8, 128})); }),
            "Cannot allocate HBM in `run_scoped`. (set InterpretParams.allow_hbm_allocation_in_run_scoped "
            "to allow it) (at " + line_ref(__FILE__, line) + ")");
}

// ---- Devices ---------------------------------------------------------------------------------------------
TEST(TpuDevices, RunOnMeshOneDimensional) {
  auto kernel = [](pl::Ref x, pl::Ref o) {
    o[pl::all] = x[pl::all] + (pltpu::axis_index("x") * 1000).astype(pl::f32);
  };
  for (int64_t n : {1, 2, 4, 8}) {
    auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), {.interpret = pltpu::InterpretParams{}});
    std::vector<std::vector<pl::Array>> args;
    for (int64_t d = 0; d < n; ++d) args.push_back({iota_f32({8, 128}, static_cast<float>(d))});
    auto out = pltpu::run_on_mesh(call, pltpu::Mesh{{"x"}, {n}}, args);
    ASSERT_EQ(static_cast<int64_t>(out.size()), n);
    for (int64_t d = 0; d < n; ++d)
      for (int64_t i = 0; i < 8 * 128; i += 13)
        ASSERT_EQ(out[d][0].data<float>()[i], static_cast<float>(d + i + d * 1000)) << n << " devices";
  }
}

TEST(TpuDevices, RunOnMeshTwoDimensional) {
  // Logical ids are row-major over (x, y).
  auto kernel = [](pl::Ref o) {
    pl::Value x = pltpu::axis_index("x"), y = pltpu::axis_index("y");
    pl::Value lane = pl::iota(pl::i32, {1, 128}, 1);
    o[pl::all] = pl::where(lane == 0, x, pl::where(lane == 1, y, -1));
  };
  for (auto shape : std::vector<std::vector<int64_t>>{{2, 2}, {2, 4}, {4, 2}, {1, 8}}) {
    auto call = pl::pallas_call(kernel, pl::ShapeDtype({1, 128}, pl::i32), {.interpret = pltpu::InterpretParams{}});
    int64_t n = shape[0] * shape[1];
    auto out = pltpu::run_on_mesh(call, pltpu::Mesh{{"x", "y"}, shape}, std::vector<std::vector<pl::Array>>(n));
    for (int64_t d = 0; d < n; ++d) {
      EXPECT_EQ(out[d][0].data<int32_t>()[0], d / shape[1]);
      EXPECT_EQ(out[d][0].data<int32_t>()[1], d % shape[1]);
      EXPECT_EQ(out[d][0].data<int32_t>()[2], -1);
    }
  }
}

TEST(TpuDevices, DevicesWithSeveralCoresEach) {
  // 2 devices x 2 cores: a parallel grid on each device, then the result goes to the other
  // device's second output.
  auto kernel = [](pl::Ref x, pl::Ref o) {
    o[pl::all] = x[pl::all] + (pltpu::axis_index("d") * 100 + pl::program_id(0)).astype(pl::f32);
  };
  pl::CallOptions opts;
  opts.grid = {4};
  opts.in_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })};
  opts.out_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })};
  opts.compiler_params = pltpu::CompilerParams{.dimension_semantics = {"parallel"}};
  std::shared_ptr<std::vector<pltpu::RaceReport>> races;
  pltpu::InterpretParams p = race_params(races);
  p.num_cores_per_device = 2;
  opts.interpret = p;
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({32, 128}, pl::f32), opts);
  std::vector<std::vector<pl::Array>> args = {{iota_f32({32, 128})}, {iota_f32({32, 128}, 1.0f)}};
  auto out = pltpu::run_on_mesh(call, pltpu::Mesh{{"d"}, {2}}, args);
  for (int d = 0; d < 2; ++d)
    for (int64_t r = 0; r < 32; ++r)
      ASSERT_EQ(out[d][0].data<float>()[r * 128 + 9], static_cast<float>(d + r * 128 + 9 + d * 100 + r / 8));
  EXPECT_TRUE(races->empty()) << all_reports(*races);
}

TEST(TpuDevices, WrongNumberOfArgumentLists) {
  // Copies the first 8 rows: traceable for any number of input rows.
  auto call = pl::pallas_call([](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::ds(0, 8)]; },
                              pl::ShapeDtype({8, 128}, pl::f32), {.interpret = pltpu::InterpretParams{}});
  std::vector<std::vector<pl::Array>> args(3, {iota_f32({8, 128})});
  EXPECT_CONTAINS(error_of([&] { pltpu::run_on_mesh(call, pltpu::Mesh{{"x"}, {4}}, args); }),
                  "run_on_mesh: the mesh has 4 devices but 3 argument lists were given (one per device)");
  args.push_back({iota_f32({16, 128})});
  EXPECT_CONTAINS(error_of([&] { pltpu::run_on_mesh(call, pltpu::Mesh{{"x"}, {4}}, args); }),
                  "run_on_mesh: device 3's arguments differ in shape, dtype or dynamic grid size from device 0's");
  EXPECT_CONTAINS(error_of([&] { pltpu::run_on_mesh(call, pltpu::Mesh{{"x", "y"}, {4}}, args); }),
                  "run_on_mesh: the mesh needs one name per axis (2 names for 1 axes)");
  auto ref = pl::pallas_call([](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all]; },
                             pl::ShapeDtype({8, 128}, pl::f32), {.interpret = true});
  EXPECT_CONTAINS(error_of([&] { pltpu::run_on_mesh(ref, pltpu::Mesh{{"x"}, {1}}, {{iota_f32({8, 128})}}); }),
                  "run_on_mesh runs calls in the TPU interpret mode");
}

namespace {
// A kernel that signals a device given by `target` and never waits (errors come first).
template <class F> std::string signal_error(F target, pltpu::Mesh mesh) {
  auto kernel = [target](pl::Ref o, pl::Ref sem) {
    target(sem);
    o[pl::all] = pl::zeros({1, 128}, pl::i32);
  };
  pl::CallOptions opts;
  opts.scratch_shapes = {pltpu::semaphores(REGULAR)};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({1, 128}, pl::i32), opts);
  HangGuard guard;
  return error_of([&] { pltpu::run_on_mesh(call, mesh, std::vector<std::vector<pl::Array>>(mesh.num_devices())); });
}
}  // namespace

TEST(TpuDevices, OutOfRangeDeviceIds) {
  const int logical_line = __LINE__ + 3;
  std::string msg = signal_error(
      [](pl::Ref sem) {
        pltpu::semaphore_signal(sem, 1, {.device_id = pltpu::DeviceId(pltpu::axis_index("x") + 3),
                                         .device_id_type = pltpu::DeviceIdType::LOGICAL});
      },
      pltpu::Mesh{{"x"}, {4}});
  // Devices 1, 2, 3 target 4, 5, 6: whichever fails first is reported.
  EXPECT_CONTAINS(msg, "semaphore_signal: device id ");
  EXPECT_CONTAINS(msg, " is out of range (the mesh has 4 devices) (at " + line_ref(__FILE__, logical_line) + ")");

  msg = signal_error(
      [](pl::Ref sem) {
        pl::when(pltpu::axis_index("x") == 0, [&] {
          pltpu::semaphore_signal(sem, 1, {.device_id = pltpu::DeviceId(std::vector<pl::Operand>{0, 5})});
        });
      },
      pltpu::Mesh{{"x", "y"}, {2, 4}});
  EXPECT_CONTAINS(msg, "device coordinate 5 along mesh axis 'y' is out of range (the axis has 4 devices)");

  msg = signal_error(
      [](pl::Ref sem) {
        pl::when(pltpu::axis_index("x") == 0, [&] {
          pltpu::semaphore_signal(sem, 1, {.device_id = pltpu::DeviceId(std::vector<pl::Operand>{1})});
        });
      },
      pltpu::Mesh{{"x", "y"}, {2, 4}});
  EXPECT_CONTAINS(msg, "semaphore_signal: a MESH device id needs one coordinate per mesh axis (x, y), got 1");

  msg = signal_error(
      [](pl::Ref sem) {
        pltpu::semaphore_signal(sem, 1, {.device_id = pltpu::DeviceId::named({{"z", 0}})});
      },
      pltpu::Mesh{{"x", "y"}, {2, 2}});
  EXPECT_CONTAINS(msg, "semaphore_signal: 'z' is not a device mesh axis (the mesh's axes: x, y)");
}

TEST(TpuDevices, RemoteTargetOnASingleDeviceCall) {
  auto kernel = [](pl::Ref x, pl::Ref o, pl::Ref send, pl::Ref recv) {
    auto c = pltpu::make_async_remote_copy(x, o, send, recv, pltpu::DeviceId(1));
    c.start();
    c.wait();
  };
  pl::CallOptions opts;
  opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
  opts.out_specs = {pl::BlockSpec(pltpu::ANY)};
  opts.scratch_shapes = {pltpu::semaphores(pltpu::SemaphoreType::DMA), pltpu::semaphores(pltpu::SemaphoreType::DMA)};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
  EXPECT_CONTAINS(error_of([&] { call(iota_f32({8, 128})); }),
                  "dma_start: device 1 does not exist: this call runs on one device (use pltpu::run_on_mesh for "
                  "several)");
}

TEST(TpuDevices, UnknownAxisName) {
  const int line = __LINE__ + 1;
  auto kernel = [](pl::Ref o) { o[pl::all] = pl::zeros({1, 128}, pl::i32) + pltpu::axis_index("z"); };
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({1, 128}, pl::i32), {.interpret = pltpu::InterpretParams{}});
  EXPECT_CONTAINS(error_of([&] { pltpu::run_on_mesh(call, pltpu::Mesh{{"x", "y"}, {2, 1}}, {{}, {}}); }),
                  "axis_index(\"z\"): no such axis (grid axes: none; device mesh axes: x, y) (at " +
                      line_ref(__FILE__, line) + ")");
}

// ---- Failure on one device or core ------------------------------------------------------------------------
TEST(TpuFailure, AnErrorOnOneDeviceEndsTheWholeCall) {
  // Device 2 stores out of bounds; the others wait for a signal from it that never comes. The
  // call must end promptly with device 2's error.
  const int line = __LINE__ + 4;
  auto kernel = [](pl::Ref o, pl::Ref scratch, pl::Ref sem) {
    pl::Value me = pltpu::axis_index("x");
    pl::when(me == 2, [&] {
      scratch[pl::ds(me + 4, 4)] = pl::zeros({4, 128}, pl::f32);
    });
    pltpu::semaphore_signal(sem, 1, {.device_id = pltpu::DeviceId((me + 1) % 4)});
    pltpu::semaphore_wait(sem, 1);
    o[pl::all] = pl::zeros({8, 128}, pl::f32) + me.astype(pl::f32);
  };
  pl::CallOptions opts;
  opts.scratch_shapes = {pltpu::VMEM({8, 128}, pl::f32), pltpu::semaphores(REGULAR)};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
  HangGuard guard;
  auto t0 = std::chrono::steady_clock::now();
  std::string msg = error_of([&] { pltpu::run_on_mesh(call, pltpu::Mesh{{"x"}, {4}}, std::vector<std::vector<pl::Array>>(4)); });
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 2.0);
  EXPECT_CONTAINS(msg, "on device 2, core 0: Out-of-bounds write of (device 2 core 0 vmem ");
  EXPECT_CONTAINS(msg, "writing [6:10, 0:128] but buffer has shape (8, 128). (at " + line_ref(__FILE__, line) + ")");
  // The next call works.
  auto ok = pl::pallas_call([](pl::Ref o) { o[pl::all] = pl::zeros({8, 128}, pl::f32) + pltpu::axis_index("x").astype(pl::f32); },
                            pl::ShapeDtype({8, 128}, pl::f32), {.interpret = pltpu::InterpretParams{}});
  auto out = pltpu::run_on_mesh(ok, pltpu::Mesh{{"x"}, {4}}, std::vector<std::vector<pl::Array>>(4));
  for (int d = 0; d < 4; ++d) EXPECT_EQ(out[d][0].data<float>()[17], static_cast<float>(d));
}

TEST(TpuFailure, AnErrorOnOneCoreEndsTheWholeCall) {
  // Core 1 reads out of bounds while core 0 waits for it.
  auto body = [](pl::Ref o_hbm, pl::Ref buf, pl::Ref sem) {
    pl::Value core = pltpu::axis_index("core");
    pl::when(core == 1, [&] {
      buf[pl::all] = buf[pl::ds(core * 8, 8)];
      pltpu::semaphore_signal(sem, 1, {.core_index = pl::Operand(0)});
    });
    pl::when(core == 0, [&] {
      pltpu::semaphore_wait(sem, 1);
      pltpu::sync_copy(buf, o_hbm);
    });
  };
  auto call = pltpu::core_map(body, {pl::ShapeDtype({8, 128}, pl::f32)}, pltpu::TensorCoreMesh{"core", 2},
                              {.scratch_shapes = {pltpu::VMEM({8, 128}, pl::f32), pltpu::semaphores(REGULAR)}});
  HangGuard guard;
  auto t0 = std::chrono::steady_clock::now();
  std::string msg = error_of([&] { call(); });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  EXPECT_CONTAINS(msg, "on device 0, core 1: Out-of-bounds read of (device 0 core 1 vmem ");
  EXPECT_CONTAINS(msg, "reading [8:16, 0:128] but buffer has shape (8, 128) at grid point (1).");  // core 1's point
}

TEST(TpuDevices, CoreMapOnAMeshOfDevices) {
  // 2 devices x 2 cores: every (device, core) writes row core of its device's output, and core
  // 1 of each device also sends its row to the other device's row 2.
  auto body = [](pl::Ref o_hbm, pl::Ref row, pl::Ref send, pl::Ref recv) {
    pl::Value core = pltpu::axis_index("core"), dev = pltpu::axis_index("d");
    row[pl::all] = pl::full({1, 128}, pl::i32, 0) + dev * 10 + core;
    pltpu::sync_copy(row, o_hbm.at(pl::ds(core, 1)));
    pl::when(core == 1, [&] {
      auto c = pltpu::make_async_remote_copy(row, o_hbm.at(pl::ds(2, 1)), send, recv, pltpu::DeviceId(1 - dev));
      c.start();
      c.wait();
    });
  };
  for (const char* mode : kModes) {
    std::shared_ptr<std::vector<pltpu::RaceReport>> races;
    auto call = pltpu::core_map(body, {pl::ShapeDtype({3, 128}, pl::i32)}, pltpu::TensorCoreMesh{"core", 2},
                                {.scratch_shapes = {pltpu::VMEM({1, 128}, pl::i32), pltpu::semaphores(pltpu::SemaphoreType::DMA),
                                                    pltpu::semaphores(pltpu::SemaphoreType::DMA)},
                                 .interpret = race_params(races, mode)});
    HangGuard guard;
    auto out = pltpu::run_on_mesh(call, pltpu::Mesh{{"d"}, {2}}, std::vector<std::vector<pl::Array>>(2));
    for (int d = 0; d < 2; ++d) {
      EXPECT_EQ(out[d][0].data<int32_t>()[0 * 128 + 4], d * 10 + 0) << mode;
      EXPECT_EQ(out[d][0].data<int32_t>()[1 * 128 + 4], d * 10 + 1) << mode;
      EXPECT_EQ(out[d][0].data<int32_t>()[2 * 128 + 4], (1 - d) * 10 + 1) << mode;
    }
    EXPECT_TRUE(races->empty()) << all_reports(*races);
  }
}

TEST(TpuCores, ManualDmasOnEveryCoreOfAParallelGrid) {
  // Each core has its own scratch and semaphore; a parallel grid of 6 steps over 1, 2, 4 cores.
  auto kernel = [](pl::Ref x_hbm, pl::Ref o, pl::Ref buf, pl::Ref sem) {
    pl::Value i = pl::program_id(0);
    pltpu::async_copy(x_hbm.at(pl::ds(i * 8, 8)), buf, sem).wait();
    o[pl::all] = buf[pl::all] - 1.0f;
  };
  pl::Array x = iota_f32({48, 128});
  for (int cores : {1, 2, 4})
    for (const char* mode : kModes) {
      pl::CallOptions opts;
      opts.grid = {6};
      opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
      opts.out_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })};
      opts.scratch_shapes = {pltpu::VMEM({8, 128}, pl::f32), pltpu::semaphores(pltpu::SemaphoreType::DMA)};
      opts.compiler_params = pltpu::CompilerParams{.dimension_semantics = {"parallel"}};
      std::shared_ptr<std::vector<pltpu::RaceReport>> races;
      pltpu::InterpretParams p = race_params(races, mode);
      p.num_cores_per_device = cores;
      opts.interpret = p;
      HangGuard guard;
      pl::Array o = pl::pallas_call(kernel, pl::ShapeDtype({48, 128}, pl::f32), opts)(x)[0];
      for (int64_t k = 0; k < x.size(); ++k) ASSERT_EQ(o.data<float>()[k], k - 1.0f) << cores << " " << mode;
      EXPECT_TRUE(races->empty()) << all_reports(*races);
    }
}

TEST(TpuDevices, BarrierSemaphoreOnATwoDimensionalMesh) {
  // 2x2 mesh: each device synchronises with its neighbour along y through the barrier
  // semaphore, then sends its input there.
  auto kernel = [](pl::Ref x, pl::Ref o, pl::Ref send, pl::Ref recv) {
    pl::Value y = pltpu::axis_index("y");
    pltpu::DeviceId peer = pltpu::DeviceId::named({{"y", 1 - y}});
    pl::Ref barrier = pltpu::get_barrier_semaphore();
    pltpu::semaphore_signal(barrier, 1, {.device_id = peer});
    pltpu::semaphore_wait(barrier, 1);
    auto c = pltpu::make_async_remote_copy(x, o, send, recv, peer);
    c.start();
    c.wait();
  };
  for (const char* mode : kModes) {
    std::shared_ptr<std::vector<pltpu::RaceReport>> races;
    pl::CallOptions opts;
    opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
    opts.out_specs = {pl::BlockSpec(pltpu::ANY)};
    opts.scratch_shapes = {pltpu::semaphores(pltpu::SemaphoreType::DMA), pltpu::semaphores(pltpu::SemaphoreType::DMA)};
    opts.compiler_params = pltpu::CompilerParams{.collective_id = 1};
    opts.interpret = race_params(races, mode);
    auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
    std::vector<std::vector<pl::Array>> args;
    for (int d = 0; d < 4; ++d) args.push_back({iota_f32({8, 128}, 100.0f * d)});
    HangGuard guard;
    auto out = pltpu::run_on_mesh(call, pltpu::Mesh{{"x", "y"}, {2, 2}}, args);
    for (int d = 0; d < 4; ++d)
      ASSERT_EQ(out[d][0].data<float>()[77], args[(d / 2) * 2 + (1 - d % 2)][0].data<float>()[77]) << mode;
    EXPECT_TRUE(races->empty()) << all_reports(*races);
  }
}
