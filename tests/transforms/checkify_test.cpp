// checkify's user half: pl::debug_check(pred, message) inside a kernel. With
// CallOptions::debug_checks a false predicate is a pallas::Error naming the message, the grid
// point and the line, on the reference interpreter, the TPU interpret mode and the GPU code
// generator (run under host emulation); without it every backend ignores the check.
// The other half, always on: a dynamic Ref index out of bounds names the op, the index, the grid
// point and the line on the same three.
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

// The generated CUDA of `call` under host emulation: a failed check writes an error record that
// the host turns into the same message.
std::vector<pl::Array> run_generated(const pl::PallasCall& call, const std::vector<pl::Array>& args,
                                     int threads) {
  std::vector<pl::ShapeDtype> shapes;
  std::vector<pl::Array> copies;
  for (const pl::Array& a : args) {
    shapes.push_back(a.shape_dtype());
    copies.push_back(a.clone());
  }
  std::shared_ptr<const pl::TracedCall> tc = call.trace(shapes);
  const std::vector<int64_t> grid = tc->grid_mapping.grid;
  pl::gpu::GeneratedKernel k = pl::gpu::generate_cuda(*tc, grid, {});
  return pl::gpu::run_host_emulation(*tc, k, std::move(copies), grid, threads);
}
std::vector<pl::Array> run_generated(const pl::PallasCall& call, const pl::Array& x, int threads) {
  return run_generated(call, std::vector<pl::Array>{x}, threads);
}
std::vector<pl::Array> run_generated(bool debug_checks, const pl::Array& x, int threads) {
  return run_generated(doubling_call(mode_of(false), debug_checks), x, threads);
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

// ---- Out-of-bounds Ref indices ------------------------------------------------------------------

// Every grid point of doubling_call's (4, 2) grid indexes its (8,) blocks at k = 0, but point
// (2, 1) at k = 8: one past the end, through each kind of Ref op.
enum class RefOp { Load, Store, Swap, View, Atomic };
int g_ref_op_line = 0;

pl::PallasCall out_of_bounds_call(pl::InterpretMode mode, RefOp which) {
  auto map = [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; };
  return pl::pallas_call(
      [which](pl::Ref x, pl::Ref o) {
        pl::Value k = pl::where(pl::program_id(0) == 2, pl::program_id(1) * 8, 0);
        o[pl::all] = x[pl::all];
        switch (which) {
          case RefOp::Load: g_ref_op_line = __LINE__ + 1;
            o[0] = x[k] * 2.0f;
            break;
          case RefOp::Store: g_ref_op_line = __LINE__ + 1;
            o[pl::ds(k, 4)] = x[pl::ds(0, 4)];
            break;
          case RefOp::Swap: g_ref_op_line = __LINE__ + 1;
            o[1] = o.swap(pl::Indices{k}, 1.0f);
            break;
          case RefOp::View: g_ref_op_line = __LINE__ + 1;
            o[pl::ds(0, 2)] = x.at(pl::ds(k, 2, 3))[pl::all];
            break;
          case RefOp::Atomic: g_ref_op_line = __LINE__ + 1;
            o.atomic_add(pl::Indices{k}, 1.0f);
            break;
        }
      },
      pl::ShapeDtype({4, 16}, pl::f32),
      {.grid = {4, 2},
       .in_specs = {pl::BlockSpec({pl::squeezed, 8}, map)},
       .out_specs = {pl::BlockSpec({pl::squeezed, 8}, map)},
       .interpret = mode});
}

struct OutOfBoundsCase {
  RefOp op;
  std::string name;
  std::string reference;  // the reference interpreter's (and the GPU kernel's) message, up to the Ref
  std::string tpu;        // the TPU interpret mode's, up to the buffer's shape
};
void PrintTo(const OutOfBoundsCase& c, std::ostream* os) { *os << c.name; }
class CheckifyRefIndex : public testing::TestWithParam<OutOfBoundsCase> {};

std::string ref_op_line() { return "checkify_test.cpp:" + std::to_string(g_ref_op_line); }

TEST_P(CheckifyRefIndex, ReferenceInterpreterNamesOpIndexGridPointAndLine) {
  const OutOfBoundsCase& c = GetParam();
  std::string e = error_of([&] { out_of_bounds_call(mode_of(false), c.op)(good_data()); });
  EXPECT_CONTAINS(e, c.reference + " (ref [8]) at grid point (2, 1) (at " + ref_op_line() + ")");
}

TEST_P(CheckifyRefIndex, TpuInterpretModeNamesBufferGridPointAndLine) {
  const OutOfBoundsCase& c = GetParam();
  std::string e = error_of([&] { out_of_bounds_call(mode_of(true), c.op)(good_data()); });
  EXPECT_CONTAINS(e, c.tpu + " but buffer has shape (8,) at grid point (2, 1). (at " + ref_op_line() + ")");
}

TEST_P(CheckifyRefIndex, GpuCodegenRecordsTheGridPoint) {
  const OutOfBoundsCase& c = GetParam();
  std::string want = error_of([&] { out_of_bounds_call(mode_of(false), c.op)(good_data()); });
  for (int threads : {1, 3}) {
    SCOPED_TRACE(threads);
    EXPECT_EQ(error_of([&] { run_generated(out_of_bounds_call(mode_of(false), c.op), good_data(), threads); }),
              want);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Ops, CheckifyRefIndex,
    testing::Values(
        OutOfBoundsCase{RefOp::Load, "load", "load: ref index out of bounds: index 8 in dimension 0 of size 8",
                        "Out-of-bounds read of (device 0 core 0 vmem 102, block of input args[0]): reading [8]"},
        OutOfBoundsCase{RefOp::Store, "store",
                        "store: ref index out of bounds: slice of 4 elements from 8 (stride 1) in dimension 0 "
                        "of size 8",
                        "Out-of-bounds write of (device 0 core 0 vmem 103, block of output outputs[0]): writing [8:12]"},
        OutOfBoundsCase{RefOp::Swap, "swap", "swap: ref index out of bounds: index 8 in dimension 0 of size 8",
                        "Out-of-bounds swap of (device 0 core 0 vmem 103, block of output outputs[0]): swapping [8]"},
        OutOfBoundsCase{RefOp::View, "view",
                        "ref_view: ref index out of bounds: slice of 2 elements from 8 (stride 3) in dimension 0 "
                        "of size 8",
                        "Out-of-bounds ref_view of (device 0 core 0 vmem 102, block of input args[0]): indexing "
                        "[8:14:3]"},
        OutOfBoundsCase{RefOp::Atomic, "atomic", "atomic_rmw: ref index out of bounds: index 8 in dimension 0 of size 8",
                        "Out-of-bounds atomic_rmw of (device 0 core 0 vmem 103, block of output outputs[0]): "
                        "indexing [8]"}),
    [](const testing::TestParamInfo<OutOfBoundsCase>& i) { return i.param.name; });

// An index map reading a scalar-prefetch operand past its end: at grid point (2), order[3].
TEST(Checkify, IndexMapReadingPastAPrefetchOperandNamesTheGridPoint) {
  const int line = __LINE__ + 2;
  auto call_on = [&](pl::InterpretMode mode) {
    pl::BlockSpec next({8}, [](pl::Value i, pl::Ref order) { return pl::Indices{order[i + 1]}; });
    pl::BlockSpec same({8}, [](pl::Value i, pl::Ref) { return pl::Indices{i}; });
    return pl::pallas_call([](pl::Ref, pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all]; },
                           pl::ShapeDtype({24}, pl::f32),
                           {.grid_spec = pl::PrefetchScalarGridSpec(1, {3}, {next}, {same}), .interpret = mode});
  };
  std::vector<pl::Array> args = {pl::Array::from_values({3}, pl::i32, {0, 1, 2}), pl::Array::zeros({24}, pl::f32)};
  const std::string want = "load: ref index out of bounds: index 3 in dimension 0 of size 3 (ref [3]) at grid point (2) (at "
                           "checkify_test.cpp:" + std::to_string(line) + ")";
  for (bool tpu : {false, true}) {
    SCOPED_TRACE(tpu ? "tpu interpret" : "reference");
    EXPECT_CONTAINS(error_of([&] { call_on(mode_of(tpu))(args); }), want);
  }
  EXPECT_CONTAINS(error_of([&] { run_generated(call_on(mode_of(false)), args, 3); }), want);
}

// pl::evaluate names the grid point it was given, and a kernel without a grid names none.
TEST(Checkify, EvaluateNamesTheGridPointOfAnOutOfBoundsIndex) {
  pl::ir::Kernel k = pl::trace_kernel(
      [](pl::Ref x) { x[pl::program_id(0) + 7] = 1.0f; }, {pl::ir::Type::ref({8}, pl::f32)}, "k");
  std::vector<pl::Array> bufs{pl::Array::zeros({8}, pl::f32)};
  pl::EvaluateOptions o;
  o.grid.program_ids = {3};
  o.grid.num_programs = {4};
  EXPECT_CONTAINS(error_of([&] { pl::evaluate(k, bufs, o); }),
                  "store: ref index out of bounds: index 10 in dimension 0 of size 8 (ref [8]) at grid point (3) (at ");
  pl::ir::Kernel gridless = pl::trace_kernel(
      [](pl::Ref x, pl::Ref i) { x[i[0]] = 1.0f; }, {pl::ir::Type::ref({8}, pl::f32), pl::ir::Type::ref({1}, pl::i32)},
      "k");
  std::vector<pl::Array> bufs2{pl::Array::zeros({8}, pl::f32), pl::Array::full({1}, pl::i32, 9)};
  std::string e = error_of([&] { pl::evaluate(gridless, bufs2); });
  EXPECT_CONTAINS(e, "store: ref index out of bounds: index 9 in dimension 0 of size 8 (ref [8]) (at ");
  EXPECT_EQ(e.find("grid point"), std::string::npos) << e;
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
