// User errors specific to the TPU interpret mode: direct access to HBM/ANY buffers (rejected
// when the call is traced), HBM operands with non-trivial BlockSpecs, bad semaphore values,
// core_map misuse, and swaps out of bounds.
#include "tests/tpu/tpu_test_util.h"

using namespace tpu_test;

namespace {
const auto REGULAR = pltpu::SemaphoreType::REGULAR;
const char* const kDirect =
    ": Buffers with a memory space of HBM or ANY cannot be referenced directly. Instead, use "
    "`pltpu::sync_copy` or `pltpu::async_copy`.";
}  // namespace

TEST(TpuErrors, DirectLoadOfAnHbmRefIsRejectedWhenTraced) {
  const int line = __LINE__ + 1;
  auto kernel = [](pl::Ref x_hbm, pl::Ref o) { o[pl::all] = x_hbm[pl::all] + 1.0f; };
  pl::CallOptions opts;
  opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
  // Tracing alone raises it (nothing runs).
  EXPECT_EQ(error_of([&] { call.trace({pl::ShapeDtype({8, 128}, pl::f32)}); }),
            std::string("load_p") + kDirect + " (at " + line_ref(__FILE__, line) + ")");
  EXPECT_EQ(error_of([&] { call(iota_f32({8, 128})); }),
            std::string("load_p") + kDirect + " (at " + line_ref(__FILE__, line) + ")");
}

TEST(TpuErrors, DirectStoreToAnHbmRefIsRejected) {
  const int line = __LINE__ + 1;
  auto kernel = [](pl::Ref x, pl::Ref o_hbm) { o_hbm[pl::ds(0, 4)] = x[pl::ds(0, 4)]; };
  pl::CallOptions opts;
  opts.out_specs = {pl::BlockSpec(pltpu::HBM)};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
  EXPECT_EQ(error_of([&] { call.trace({pl::ShapeDtype({8, 128}, pl::f32)}); }),
            std::string("swap_p") + kDirect + " (at " + line_ref(__FILE__, line) + ")");
}

TEST(TpuErrors, DirectAccessInsideControlFlowAndRunScoped) {
  // The check looks inside nested regions (a loop body) and run_scoped HBM buffers.
  const int line = __LINE__ + 3;
  auto kernel = [](pl::Ref x_hbm, pl::Ref o) {
    pl::fori_loop(0, 2, [&](pl::Value) {
      o[pl::all] = x_hbm[pl::all];
    });
  };
  pl::CallOptions opts;
  opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
  EXPECT_EQ(error_of([&] { call(iota_f32({8, 128})); }),
            std::string("load_p") + kDirect + " (at " + line_ref(__FILE__, line) + ")");

  const int line2 = __LINE__ + 3;
  auto scoped = [](pl::Ref o) {
    pl::run_scoped({{{8, 128}, pl::f32, pltpu::HBM}}, [&](std::vector<pl::Ref> s) {
      s[0][pl::all] = pl::zeros({8, 128}, pl::f32);
      return std::vector<pl::Value>{};
    });
    o[pl::all] = pl::zeros({8, 128}, pl::f32);
  };
  pltpu::InterpretParams p;
  p.allow_hbm_allocation_in_run_scoped = true;
  auto call2 = pl::pallas_call(scoped, pl::ShapeDtype({8, 128}, pl::f32), {.interpret = p});
  EXPECT_EQ(error_of([&] { call2(); }), std::string("swap_p") + kDirect + " (at " + line_ref(__FILE__, line2) + ")");
}

TEST(TpuErrors, DirectAccessIsFineInTheReferenceInterpreter) {
  // The same kernel, run by the reference interpreter (interpret = true), is not a TPU program.
  auto kernel = [](pl::Ref x_hbm, pl::Ref o) { o[pl::all] = x_hbm[pl::all] + 1.0f; };
  pl::CallOptions opts;
  opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
  opts.interpret = true;
  pl::Array o = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts)(iota_f32({8, 128}))[0];
  EXPECT_EQ(o.data<float>()[10], 11.0f);
}

TEST(TpuErrors, HbmOperandNeedsATrivialBlockSpec) {
  auto kernel = [](pl::Ref x_hbm, pl::Ref o) {
    (void)x_hbm;
    o[pl::all] = pl::zeros({8, 128}, pl::f32);
  };
  pl::CallOptions opts;
  opts.grid = {2};
  const int line = __LINE__ + 1;
  opts.in_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; }).with_memory_space(pltpu::ANY)};
  opts.out_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({16, 128}, pl::f32), opts);
  EXPECT_EQ(error_of([&] { call(iota_f32({16, 128})); }),
            "Kernel input 0 in HBM but does not have trivial BlockSpec. (at " + line_ref(__FILE__, line) + ")");
}

TEST(TpuErrors, NegativeSemaphoreAmounts) {
  const int line = __LINE__ + 2;
  auto bad_signal = [](pl::Ref o, pl::Ref sem) {
    pltpu::semaphore_signal(sem, pl::program_id(0) - 1);
    o[pl::all] = pl::zeros({8, 128}, pl::f32);
  };
  auto call = pl::pallas_call(bad_signal, pl::ShapeDtype({8, 128}, pl::f32),
                              {.grid = {1}, .scratch_shapes = {pltpu::semaphores(REGULAR)}, .interpret = pltpu::InterpretParams{}});
  EXPECT_EQ(error_of([&] { call(); }),
            "semaphore_signal: the increment must be >= 0, got -1 (at " + line_ref(__FILE__, line) + ")");
  const int line2 = __LINE__ + 2;
  auto bad_wait = [](pl::Ref o, pl::Ref sem) {
    pltpu::semaphore_wait(sem, pl::program_id(0) - 2);
    o[pl::all] = pl::zeros({8, 128}, pl::f32);
  };
  auto call2 = pl::pallas_call(bad_wait, pl::ShapeDtype({8, 128}, pl::f32),
                               {.grid = {1}, .scratch_shapes = {pltpu::semaphores(REGULAR)}, .interpret = pltpu::InterpretParams{}});
  EXPECT_EQ(error_of([&] { call2(); }),
            "semaphore_wait: the value must be >= 0, got -2 (at " + line_ref(__FILE__, line2) + ")");
}

TEST(TpuErrors, WaitSendOnALocalCopy) {
  auto kernel = [](pl::Ref x_hbm, pl::Ref o, pl::Ref buf, pl::Ref sem) {
    auto c = pltpu::async_copy(x_hbm, buf, sem);
    c.wait_send();
    o[pl::all] = buf[pl::all];
  };
  pl::CallOptions opts;
  opts.in_specs = {pl::BlockSpec(pltpu::ANY)};
  opts.scratch_shapes = {pltpu::VMEM({8, 128}, pl::f32), pltpu::semaphores(pltpu::SemaphoreType::DMA)};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
  EXPECT_CONTAINS(error_of([&] { call(iota_f32({8, 128})); }),
                  "wait_send: this is a local copy (make_async_copy); use wait()");
}

TEST(TpuErrors, CoreMapMisuse) {
  auto body = [](pl::Ref o) { (void)o; };
  EXPECT_CONTAINS(error_of([&] {
                    pltpu::core_map(body, {pl::ShapeDtype({8, 128}, pl::f32)}, pltpu::TensorCoreMesh{"core", 0});
                  }),
                  "TensorCoreMesh needs at least one core, got 0");
  EXPECT_CONTAINS(error_of([&] {
                    pltpu::core_map(body, {pl::ShapeDtype({8, 128}, pl::f32)}, pltpu::TensorCoreMesh{"core", 2},
                                    {.grid = {2}});
                  }),
                  "core_map takes no grid or BlockSpecs");
  EXPECT_CONTAINS(error_of([&] {
                    pltpu::core_map(body, {pl::ShapeDtype({8, 128}, pl::f32)}, pltpu::TensorCoreMesh{"core", 2},
                                    {.interpret = true});
                  }),
                  "core_map runs in the TPU interpret mode");
}

TEST(TpuErrors, OutOfBoundsSwap) {
  const int line = __LINE__ + 3;
  auto kernel = [](pl::Ref x, pl::Ref o, pl::Ref s) {
    s[pl::all] = x[pl::all];
    pl::Value old = s.swap({pl::ds(pl::program_id(0) + 5, 4)}, x[pl::ds(0, 4)]);
    o[pl::all] = x[pl::all];
    (void)old;
  };
  pl::CallOptions opts;
  opts.grid = {1};
  opts.scratch_shapes = {pltpu::VMEM({8, 128}, pl::f32)};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts);
  std::string msg = error_of([&] { call(iota_f32({8, 128})); });
  EXPECT_CONTAINS(msg, "Out-of-bounds swap of (device 0 core 0 vmem ");
  EXPECT_CONTAINS(msg, "): swapping [5:9, 0:128] but buffer has shape (8, 128) at grid point (0). (at " +
                           line_ref(__FILE__, line) + ")");
}

TEST(TpuErrors, DeviceIdsAreCheckedWhenTraced) {
  auto trace_with = [](std::function<void(pl::Ref, pl::Ref)> body) {
    auto kernel = [body](pl::Ref o, pl::Ref sem) {
      body(o, sem);
      o[pl::all] = pl::zeros({8, 128}, pl::f32);
    };
    pl::CallOptions opts;
    opts.scratch_shapes = {pltpu::semaphores(REGULAR)};
    opts.interpret = pltpu::InterpretParams{};
    pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts).trace({});
  };
  // (Outside EXPECT_*: a source location inside a macro argument is the macro's line.)
  const int line = __LINE__ + 3;
  std::string msg = error_of([&] {
    trace_with([](pl::Ref, pl::Ref sem) {
      pltpu::semaphore_signal(sem, 1, {.device_id = pltpu::DeviceId(std::vector<pl::Operand>{0, 1}),
                                       .device_id_type = pltpu::DeviceIdType::LOGICAL});
    });
  });
  EXPECT_EQ(msg, "a LOGICAL device id is one integer (the row-major device number) (at " + line_ref(__FILE__, line) + ")");
  EXPECT_CONTAINS(error_of([&] {
                    trace_with([](pl::Ref, pl::Ref sem) {
                      pltpu::semaphore_signal(sem, 1, {.device_id = pltpu::DeviceId(std::vector<pl::Operand>{})});
                    });
                  }),
                  "a device id needs at least one coordinate");
  EXPECT_CONTAINS(error_of([&] {
                    trace_with([](pl::Ref, pl::Ref sem) {
                      pltpu::semaphore_signal(sem, 1, {.device_id = pltpu::DeviceId::named({{"x,y", 0}})});
                    });
                  }),
                  "a mesh axis name must be non-empty and contain no comma, got \"x,y\"");
  EXPECT_CONTAINS(error_of([&] { trace_with([](pl::Ref, pl::Ref) { (void)pltpu::axis_index(""); }); }),
                  "axis_index needs an axis name");
}

TEST(TpuErrors, SemaphoreOpsNeedSemaphores) {
  auto kernel = [](pl::Ref o) {
    pltpu::semaphore_signal(o, 1);
  };
  pl::CallOptions opts;
  opts.interpret = pltpu::InterpretParams{};
  std::string msg = error_of([&] { pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32), opts).trace({}); });
  EXPECT_CONTAINS(msg, "semaphore_signal: the semaphore must be a semaphore Ref, got ref<f32[8,128], vmem> (at tpu_errors_test.cpp:");
  auto wait_kernel = [](pl::Ref o) { pltpu::semaphore_wait(o, 1); };
  msg = error_of([&] { pl::pallas_call(wait_kernel, pl::ShapeDtype({8, 128}, pl::f32), opts).trace({}); });
  EXPECT_CONTAINS(msg, "semaphore_wait: the semaphore must be a semaphore Ref, got ref<f32[8,128], vmem>");
  auto dma_kernel = [](pl::Ref o, pl::Ref buf) { pltpu::async_copy(buf, o, buf); };
  opts.scratch_shapes = {pltpu::VMEM({8, 128}, pl::f32)};
  msg = error_of([&] { pl::pallas_call(dma_kernel, pl::ShapeDtype({8, 128}, pl::f32), opts).trace({}); });
  EXPECT_CONTAINS(msg, "dma_start: the receive semaphore must be a DMA or regular semaphore Ref, got ref<f32[8,128], vmem>");
}

TEST(TpuErrors, AliasingAScalarPrefetchOperand) {
  const int line = __LINE__ + 10;
  auto kernel = [](pl::Ref idx, pl::Ref x, pl::Ref o) {
    (void)x;
    o[pl::all] = pl::zeros({8}, pl::i32) + idx[0];
  };
  pl::CallOptions opts;
  opts.grid_spec = pl::PrefetchScalarGridSpec(1, {1}, {pl::BlockSpec({8}, [](pl::Value, pl::Ref) { return pl::Indices{0}; })},
                                              {pl::BlockSpec({8}, [](pl::Value, pl::Ref) { return pl::Indices{0}; })});
  opts.input_output_aliases = {{0, 0}};
  opts.interpret = pltpu::InterpretParams{};
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8}, pl::i32), opts);
  EXPECT_EQ(error_of<pl::NotSupportedError>([&] { call(iota_i32({8}), iota_i32({8})); }),
            "not supported yet: aliasing a scalar-prefetch operand (input 0) (at " + line_ref(__FILE__, line) + ")");
}
