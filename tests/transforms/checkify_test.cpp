// checkify's user half: pl::debug_check(pred, message) inside a kernel. With
// CallOptions::debug_checks a false predicate is a pallas::Error naming the message, the grid
// point and the line, on the reference interpreter, the TPU interpret mode and the GPU code
// generator (run under host emulation); without it every backend ignores the check.
#include <gtest/gtest.h>

#include <string>

#include "core/call.h"
#include "gpu/codegen.h"
#include "gpu/host_emulation.h"
#include "pallas/pallas.h"
#include "pallas/tpu.h"
#include "tests/test_util.h"

namespace pl = pallas;
namespace pltpu = pallas::tpu;

namespace {

using test_util::error_of;

int g_check_line = 0;  // the line of the debug_check below

// o = 2 * x over a (4, 2) grid of (8,) blocks of a (4, 16) array; each point checks its block's
// first element.
pl::PallasCall doubling_call(pl::InterpretMode mode, bool debug_checks) {
  auto map = [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; };
  return pl::pallas_call(
      [](pl::Ref x, pl::Ref o) {
        g_check_line = __LINE__ + 1;
        pl::debug_check(x[0] > 0, "x must be positive");
        o[pl::all] = x[pl::all] * 2.0f;
      },
      pl::ShapeDtype({4, 16}, pl::f32),
      {.grid = {4, 2},
       .in_specs = {pl::BlockSpec({pl::squeezed, 8}, map)},
       .out_specs = {pl::BlockSpec({pl::squeezed, 8}, map)},
       .interpret = mode,
       .debug_checks = debug_checks});
}

pl::Array good_data() { return pl::Array::full({4, 16}, pl::f32, 1.0); }

// Element [2, 8] is the first element of the block at grid point (2, 1).
pl::Array bad_data() {
  pl::Array x = pl::Array::full({4, 16}, pl::f32, 1.0);
  x.data<float>()[2 * 16 + 8] = -3.0f;
  return x;
}

std::string at_line() { return "checkify_test.cpp:" + std::to_string(g_check_line); }

pl::InterpretMode mode_of(bool tpu) {
  return tpu ? pl::InterpretMode(pltpu::InterpretParams{}) : pl::InterpretMode(true);
}

TEST(Checkify, PassingChecksRunOnBothInterpreters) {
  for (bool tpu : {false, true}) {
    SCOPED_TRACE(tpu ? "tpu interpret" : "reference");
    std::vector<pl::Array> out = doubling_call(mode_of(tpu), true)(good_data());
    ASSERT_EQ(out.size(), 1u);
    EXPECT_TRUE(pl::allclose(out[0], pl::Array::full({4, 16}, pl::f32, 2.0), 0, 0).ok);
  }
}

TEST(Checkify, FailingCheckOnTheReferenceInterpreterNamesMessagePointAndLine) {
  std::string e = error_of([&] { doubling_call(mode_of(false), true)(bad_data()); });
  EXPECT_CONTAINS(e, "debug_check failed: x must be positive at grid point (2, 1)");
  EXPECT_CONTAINS(e, at_line());
}

TEST(Checkify, FailingCheckOnTheTpuInterpretModeNamesDeviceAndCore) {
  std::string e = error_of([&] { doubling_call(mode_of(true), true)(bad_data()); });
  EXPECT_CONTAINS(e, "debug_check failed: x must be positive at grid point (2, 1)");
  EXPECT_CONTAINS(e, "device 0 core 0");
  EXPECT_CONTAINS(e, at_line());
}

TEST(Checkify, ChecksAreIgnoredWithoutDebugChecks) {
  for (bool tpu : {false, true}) {
    SCOPED_TRACE(tpu ? "tpu interpret" : "reference");
    std::vector<pl::Array> out = doubling_call(mode_of(tpu), false)(bad_data());
    EXPECT_FLOAT_EQ(out[0].data<float>()[2 * 16 + 8], -6.0f);
  }
}

// The generated CUDA under host emulation: a failed check writes an error record that the host
// turns into the same message.
std::vector<pl::Array> run_generated(bool debug_checks, const pl::Array& x, int threads) {
  pl::PallasCall call = doubling_call(mode_of(false), debug_checks);
  std::shared_ptr<const pl::TracedCall> tc = call.trace({x.shape_dtype()});
  const std::vector<int64_t> grid = tc->grid_mapping.grid;
  pl::gpu::GeneratedKernel k = pl::gpu::generate_cuda(*tc, grid, {});
  return pl::gpu::run_host_emulation(*tc, k, {x.clone()}, grid, threads);
}

TEST(Checkify, GpuCodegenReportsAFailedCheck) {
  for (int threads : {1, 3}) {
    SCOPED_TRACE(threads);
    std::vector<pl::Array> ok = run_generated(true, good_data(), threads);
    EXPECT_TRUE(pl::allclose(ok[0], pl::Array::full({4, 16}, pl::f32, 2.0), 0, 0).ok);
    std::string e = error_of([&] { run_generated(true, bad_data(), threads); });
    EXPECT_CONTAINS(e, "debug_check failed: x must be positive at grid point (2, 1)");
    EXPECT_CONTAINS(e, at_line());
  }
}

TEST(Checkify, GpuCodegenEmitsNothingWithoutDebugChecks) {
  pl::PallasCall call = doubling_call(mode_of(false), false);
  pl::Array x = bad_data();
  std::shared_ptr<const pl::TracedCall> tc = call.trace({x.shape_dtype()});
  pl::gpu::GeneratedKernel k = pl::gpu::generate_cuda(*tc, tc->grid_mapping.grid, {});
  for (const pl::gpu::ErrorSite& s : k.error_sites) EXPECT_NE(s.kind, pl::gpu::ErrorSite::Kind::DebugCheck);
  std::vector<pl::Array> out = pl::gpu::run_host_emulation(*tc, k, {x.clone()}, tc->grid_mapping.grid, 1);
  EXPECT_FLOAT_EQ(out[0].data<float>()[2 * 16 + 8], -6.0f);
}

TEST(Checkify, PredicateMustBeABoolScalar) {
  std::string e = error_of([&] {
    pl::trace_kernel([](pl::Ref x) { pl::debug_check(x[0], "not a bool"); },
                     {pl::ir::Type::ref({8}, pl::f32)}, "k");
  });
  EXPECT_CONTAINS(e, "debug_check predicate must be a bool scalar");
}

TEST(Checkify, EvaluateRunsChecksOnlyWhenAsked) {
  pl::ir::Kernel k = pl::trace_kernel(
      [](pl::Ref x) { pl::debug_check(x[0] > 0, "positive"); }, {pl::ir::Type::ref({8}, pl::f32)}, "k");
  std::vector<pl::Array> bufs{pl::Array::full({8}, pl::f32, -1.0)};
  pl::evaluate(k, bufs);  // ignored
  pl::EvaluateOptions o;
  o.debug_checks = true;
  o.grid.program_ids = {3};
  o.grid.num_programs = {4};
  EXPECT_CONTAINS(error_of([&] { pl::evaluate(k, bufs, o); }), "debug_check failed: positive at grid point (3)");
}

TEST(Checkify, DebugCheckPrintsAndParsesBack) {
  pl::ir::Kernel k = pl::trace_kernel(
      [](pl::Ref x) { pl::debug_check(x[0] > 0, "x \"must\" be {} positive\n"); },
      {pl::ir::Type::ref({8}, pl::f32)}, "k");
  for (bool locs : {false, true}) {
    pl::ir::PrintOptions opts{.locations = locs};
    std::string text = pl::ir::print(k, opts);
    EXPECT_CONTAINS(text, "debug_check");
    pl::ir::Kernel parsed = pl::ir::parse(text);
    EXPECT_EQ(pl::ir::print(parsed, opts), text);
    pl::ir::verify(parsed);
  }
}

}  // namespace
