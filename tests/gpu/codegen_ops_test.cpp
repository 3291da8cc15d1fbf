// The CUDA rules of the ops, op family by op family: each kernel runs on the reference
// interpreter (the oracle, independent code) and as generated CUDA under host emulation; the
// outputs must agree (bit for bit for integers and exact float ops, within a few ulps for
// transcendentals). Also the run-time errors of generated kernels and the grid split.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <sstream>
#include <unistd.h>

#include "core/call.h"
#include "gpu/codegen.h"
#include "gpu/cuda_libs.h"
#include "gpu/host_emulation.h"
#include "pallas/gpu.h"
#include "pallas/pallas.h"
#include "tests/gpu/emulation_check.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

namespace pallas {
namespace {

namespace pl = ::pallas;

using test_util::clone_all;
using test_util::expect_same;

// For each `// load` comment of a generated unit, in order: whether the load was fused.
std::vector<bool> fused_loads(const std::string& src) {
  std::vector<bool> fused;
  for (size_t at = src.find("// load  "); at != std::string::npos; at = src.find("// load  ", at + 1))
    fused.push_back(src.substr(at, src.find('\n', at) - at).find("fused") != std::string::npos);
  return fused;
}

// The text of a generated unit's grid-point function (pl_grid_point, to its closing brace).
std::string grid_point_function(const std::string& src) {
  const std::string from = src.substr(src.find("PL_DEV bool pl_grid_point"));
  return from.substr(0, from.find("\n}\n"));
}

int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The lines of a generated unit that write a register tile (`vN[pl_k] = `) inside a register
// tile's loop that a warpgroup without a block skips (`if (pl_blk >= B) continue;`, up to the
// loop's closing brace).
std::vector<std::string> register_writes_a_warpgroup_skips(const std::string& src) {
  static const std::regex register_write(R"(\bv\d+\[pl_k\] = )");
  std::vector<std::string> found;
  std::istringstream lines(src);
  size_t skip_indent = std::string::npos;  // (the skip's, while inside its loop)
  for (std::string l; std::getline(lines, l);) {
    const size_t indent = l.find_first_not_of(' ');
    if (indent == std::string::npos) continue;
    if (skip_indent != std::string::npos && indent < skip_indent) skip_indent = std::string::npos;
    if (l.find("if (pl_blk >= ") != std::string::npos && l.find("continue;") != std::string::npos) skip_indent = indent;
    else if (skip_indent != std::string::npos && std::regex_search(l, register_write)) found.push_back(l);
  }
  return found;
}

CallOptions opts(Grid grid, BlockSpecs in, BlockSpecs out, std::vector<ScratchShape> scratch = {}) {
  CallOptions o;
  o.grid = std::move(grid);
  o.in_specs = std::move(in);
  o.out_specs = std::move(out);
  o.scratch_shapes = std::move(scratch);
  o.interpret = true;
  return o;
}

TEST(GpuCodegenOps, ElementwiseOnEveryFloatDtype) {
  for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    auto kernel = [](const pl::Ref& x, const pl::Ref& y, const pl::Ref& o) {
      pl::Value a = x[pl::all], b = y[pl::all];
      pl::Value r = a * b + a / (pl::abs(b) + 1.0f) - pl::maximum(a, b) + pl::minimum(a, b);
      r = r + pl::floor(a) + pl::ceil(b) + pl::round(a) + pl::sign(b) + pl::integer_pow(a, 3);
      o[pl::all] = r + pl::where(a > b, a, -b) + pl::convert(a < b, a.dtype());
    };
    PallasCall call = pl::pallas_call(kernel, ShapeDtype({16, 40}, dt),
                                      opts({2}, {BlockSpec({8, 40}, [](Value i) { return Indices{i, 0}; }),
                                                 BlockSpec({8, 40}, [](Value i) { return Indices{i, 0}; })},
                                           {BlockSpec({8, 40}, [](Value i) { return Indices{i, 0}; })}));
    expect_same(call, {Array::random_normal({16, 40}, dt, 1), Array::random_normal({16, 40}, dt, 2)});
  }
}

TEST(GpuCodegenOps, TranscendentalsWithinUlps) {
  auto kernel = [](const pl::Ref& x, const pl::Ref& o) {
    pl::Value a = x[pl::all];
    pl::Value pos = pl::abs(a) + 0.5f;
    o[pl::all] = pl::exp(a) + pl::log(pos) + pl::sqrt(pos) + pl::rsqrt(pos) + pl::tanh(a) + pl::logistic(a) +
                 pl::sin(a) + pl::cos(a) + pl::erf(a) + pl::log1p(pos) + pl::exp2(a) + pl::pow(pos, a);
  };
  PallasCall call = pl::pallas_call(kernel, ShapeDtype({64, 32}, DType::F32), opts({}, {}, {}));
  expect_same(call, {Array::random_normal({64, 32}, DType::F32, 3)}, 1e-5, 1e-6);
}

// gpu::CompilerParams::approx_math: the functions it names, one row of o each, of x (1024 f32).
// x[0] = -100 (exp's result, 3.8e-44, is subnormal) and x[1] = 1e-40 (a subnormal input of log);
// the rest spread over [-3, 3]. `approx` sets the flag; `backend` runs it ("interpret", or a
// CallOptions backend).
PallasCall approx_math_call(const std::string& backend, bool approx) {
  auto kernel = [](const pl::Ref& x, const pl::Ref& o) {
    pl::Value a = x[pl::all];
    o(0, pl::all) = pl::exp(a);
    o(1, pl::all) = pl::exp2(a);
    o(2, pl::all) = pl::log(pl::abs(a));
    o(3, pl::all) = pl::tanh(a);
    o(4, pl::all) = pl::sin(a);
    o(5, pl::all) = pl::cos(a);
    o(6, pl::all) = pl::rsqrt(pl::abs(a));
  };
  CallOptions o;
  if (backend == "interpret")
    o.interpret = true;
  else
    o.backend = backend;
  o.compiler_params = gpu::CompilerParams{.approx_math = approx};
  return pl::pallas_call(kernel, ShapeDtype({7, 1024}, DType::F32), o);
}

Array approx_math_input() {
  Array x = Array::zeros({1024}, DType::F32);
  float* v = x.data<float>();
  v[0] = -100.0f;
  v[1] = 1e-40f;
  for (int i = 2; i < 1024; ++i) v[i] = -3.0f + 6.0f * static_cast<float>(i - 2) / 1021.0f;
  return x;
}

class ApproxMath : public test_util::OnGpuBackends {};

// Within each instruction's documented bound of the double-precision function (the bounds hold
// on a GPU; host emulation computes exactly), and flushing where the hardware does: exp(-100)
// is 0 and log(1e-40) is -inf with the flag; without it (and in the interpreter, which ignores
// it) they are the subnormal 3.8e-44 and -92.1.
TEST_P(ApproxMath, FastFunctionsStayWithinTheirBoundsAndFlushSubnormals) {
  const Array x = approx_math_input();
  const float* v = x.data<float>();
  const bool flag_applies = GetParam() != "interpret";
  const Array got = approx_math_call(GetParam(), true)(x).at(0);
  const float* r = got.data<float>();
  struct Row {
    const char* name;
    double (*f)(double);
    double rtol, atol;
  };
  const Row rows[] = {
      {"exp", [](double a) { return std::exp(a); }, 2e-6, 0},
      {"exp2", [](double a) { return std::exp2(a); }, 1e-6, 0},
      {"log", [](double a) { return std::log(std::abs(a)); }, 1e-6, 1e-6},
      {"tanh", [](double a) { return std::tanh(a); }, 1e-3, 1e-7},
      {"sin", [](double a) { return std::sin(a); }, 0, 2e-6},
      {"cos", [](double a) { return std::cos(a); }, 0, 2e-6},
      {"rsqrt", [](double a) { return 1 / std::sqrt(std::abs(a)); }, 1e-6, 0},
  };
  for (int k = 0; k < 7; ++k)
    for (int i = 2; i < 1024; ++i) {
      const double want = rows[k].f(v[i]);
      EXPECT_NEAR(r[k * 1024 + i], want, rows[k].atol + rows[k].rtol * std::abs(want)) << rows[k].name << "(" << v[i] << ")";
    }
  const float exp_subnormal = std::exp(-100.0f), log_subnormal = std::log(1e-40f);
  ASSERT_GT(exp_subnormal, 0.0f);
  EXPECT_EQ(r[0 * 1024 + 0], flag_applies ? 0.0f : exp_subnormal);
  EXPECT_EQ(r[2 * 1024 + 1], flag_applies ? -INFINITY : log_subnormal);
  EXPECT_EQ(r[0 * 1024 + 1], 1.0f);                             // exp(1e-40)
  EXPECT_NEAR(r[2 * 1024 + 0], std::log(100.0), 1e-5);          // log(100)
  EXPECT_NEAR(r[6 * 1024 + 0], 0.1, 1e-7);                      // rsqrt(100)
  if (!flag_applies) return;
  // The same kernel without the flag keeps the subnormal and the finite log.
  const Array exact = approx_math_call(GetParam(), false)(x).at(0);
  EXPECT_GT(exact.data<float>()[0], 0.0f);  // (a subnormal: CUDA's expf need not round it as the host's)
  EXPECT_LT(exact.data<float>()[0], 1.17549435e-38f);
  EXPECT_NEAR(exact.data<float>()[2 * 1024 + 1], log_subnormal, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Backends, ApproxMath, testing::Values("interpret", "gpu_emulate", "mosaic_gpu"),
                         test_util::backend_name);

// The flag reaches the unit (PL_APPROX_MATH) of a pallas_call and of a gpu::kernel, both compile
// with NVRTC for sm_90a and sm_80, and the SASS shows the instructions: MUFU.TANH (tanh.approx)
// only with it, and fewer instructions in all (no range reductions or polynomials).
TEST(GpuCodegenOps, ApproxMathTakesTheSpecialFunctionUnitsInstructions) {
  auto unit = [](bool approx) {
    PallasCall call = approx_math_call("mosaic_gpu", approx);
    std::shared_ptr<const TracedCall> tc = call.trace({ShapeDtype({1024}, DType::F32)});
    return gpu::generate_cuda(*tc, tc->grid_mapping.grid, gpu::codegen_options(call.impl()->compiler_params)).source;
  };
  const std::string fast = unit(true), exact = unit(false);
  EXPECT_CONTAINS(fast, "#define PL_APPROX_MATH 1\n");
  EXPECT_EQ(exact.find("#define PL_APPROX_MATH 1"), std::string::npos);
  // A gpu::kernel takes the flag from its compiler_params too.
  CallOptions ko;
  ko.compiler_params = gpu::CompilerParams{.approx_math = true};
  ko.backend = "mosaic_gpu";
  PallasCall k = gpu::kernel([](pl::Ref x, pl::Ref o) { o[pl::all] = pl::exp(x[pl::all]); }, {ShapeDtype({128}, DType::F32)},
                             gpu::Mesh{.grid = {1}, .grid_names = {"b"}}, ko);
  std::shared_ptr<const TracedCall> ktc = k.trace({ShapeDtype({128}, DType::F32)});
  EXPECT_CONTAINS(gpu::generate_cuda(*ktc, ktc->grid_mapping.grid, gpu::codegen_options(k.impl()->compiler_params)).source,
                  "#define PL_APPROX_MATH 1\n");
  if (std::string why = gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  for (const char* arch : {"sm_90a", "sm_80"}) {
    EXPECT_NO_THROW(gpu::Nvrtc::get().compile(fast, "approx.cu", arch)) << arch;
    EXPECT_NO_THROW(gpu::Nvrtc::get().compile(exact, "exact.cu", arch)) << arch;
  }
  if (test_util::find_cuobjdump().empty()) GTEST_SKIP() << "no cuobjdump (run scripts/get_cuda_tools.sh)";
  const std::string fast_sass = test_util::sass_of(fast, "sm_90a"), exact_sass = test_util::sass_of(exact, "sm_90a");
  EXPECT_CONTAINS(fast_sass, "MUFU.TANH");
  EXPECT_EQ(exact_sass.find("MUFU.TANH"), std::string::npos);
  EXPECT_LT(count_of(fast_sass, "\n        /*"), count_of(exact_sass, "\n        /*"));
}

TEST(GpuCodegenOps, IntegerRulesWrapDivideAndShiftLikeXla) {
  for (DType dt : {DType::I32, DType::I8, DType::U16, DType::I64, DType::U32}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    auto kernel = [](const pl::Ref& x, const pl::Ref& y, const pl::Ref& o, const pl::Ref& o2) {
      pl::Value a = x[pl::all], b = y[pl::all];
      o[pl::all] = (a * b) + (a / b) + (a % b) - (a & b) + (a | b) + (a ^ b) + pl::maximum(a, b) + pl::abs(a) -
                   pl::shift_left(a, b) + pl::shift_right_logical(a, b) + pl::shift_right_arithmetic(a, b) + (~a) +
                   pl::integer_pow(a, 5);
      o2[pl::all] = pl::convert(a, DType::F32) * 0.5f + pl::convert(pl::convert(b, DType::F32) * 1e10f, DType::I32)
                                                            .astype(DType::F32);
    };
    PallasCall call = pl::pallas_call(kernel, {ShapeDtype({8, 33}, dt), ShapeDtype({8, 33}, DType::F32)},
                                      opts({}, {}, {}));
    // Include zeros, -1 and extremes: x / 0, INT_MIN / -1, shifts past the width.
    const bool sgn = dt == DType::I32 || dt == DType::I8 || dt == DType::I64;
    Array x = Array::random_uniform({8, 33}, dt, 4, sgn ? -100 : 0, 100);
    Array y = Array::random_uniform({8, 33}, dt, 5, sgn ? -10 : 0, 40);
    expect_same(call, {x, y});
  }
}

TEST(GpuCodegenOps, ConversionsBetweenAllNumericDtypes) {
  const std::vector<DType> types = {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I8,
                                    DType::I32, DType::U8,  DType::I64,  DType::U64, DType::Bool};
  for (DType from : types) {
    SCOPED_TRACE("from " + std::string(dtype_name(from)));
    // One kernel per source dtype, one output per target dtype (one host compile each).
    std::vector<ShapeDtype> outs;
    for (DType to : types) outs.emplace_back(Shape{4, 64}, to);
    auto kernel = [types](std::vector<pl::Ref>& refs) {
      for (size_t t = 0; t < types.size(); ++t) refs[1 + t][pl::all] = pl::convert(refs[0][pl::all], types[t]);
    };
    PallasCall call = pl::pallas_call(kernel, outs, opts({}, {}, {}));
    // Large magnitudes too: saturation, rounding of big integers to 16-bit floats, wraparound.
    Array x = from == DType::Bool ? Array::random_uniform({4, 64}, DType::I32, 6, 0, 2).astype(DType::Bool)
                                  : Array::random_normal({4, 64}, from, 6, 0, 1000);
    expect_same(call, {x});
  }
}

TEST(GpuCodegenOps, ReductionsScansAndArgExtremes) {
  for (DType dt : {DType::F32, DType::BF16, DType::I32}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    auto kernel = [](const pl::Ref& x, const pl::Ref& s, const pl::Ref& m, const pl::Ref& c, const pl::Ref& a,
                     const pl::Ref& t) {
      pl::Value v = x[pl::all];  // (4, 6, 10)
      s[pl::all] = pl::sum(v, {0, 2}) + pl::prod(pl::slice(v, {0, 0, 0}, {1, 6, 3}), {0, 2});
      m[pl::all] = pl::max(v, {2}) + pl::min(v, {2});
      c[pl::all] = pl::cumsum(v, 2) + pl::cummax(v, 1, /*reverse=*/true);
      a[pl::all] = pl::argmax(v, 2, DType::I32) * 100 + pl::argmin(v, 2, DType::I32);
      t[pl::all] = pl::sum(v, {0, 1, 2}) + pl::prod(pl::max(v, {0, 1, 2}));  // a reduction of a scalar
    };
    PallasCall call = pl::pallas_call(
        kernel,
        {ShapeDtype({6}, dt), ShapeDtype({4, 6}, dt), ShapeDtype({4, 6, 10}, dt), ShapeDtype({4, 6}, DType::I32),
         ShapeDtype({}, dt)},
        opts({}, {}, {}));
    Array x = Array::random_normal({4, 6, 10}, dt, 7, 0, dt == DType::I32 ? 50 : 1);
    expect_same(call, {x}, dt == DType::I32 ? 0 : 2e-6, dt == DType::I32 ? 0 : 1e-5);
  }
}

// Fewer results than threads: teams of threads share each result (shuffles, and for teams wider
// than a warp a scratch meeting). 2 and 4 threads make teams of 2 and 4 lanes; 64 and 256 make
// teams of whole warps and of several (one scalar of every thread, 2 results of 128 threads
// each). The values are small integers, so that the maxima and minima tie often (the lowest
// index wins) and every float sum is exact in any order.
TEST(GpuCodegenOps, ReductionsWithFewerResultsThanThreadsAreSharedByTeams) {
  for (DType dt : {DType::F32, DType::BF16, DType::I32, DType::I8}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    auto kernel = [](const pl::Ref& x, const pl::Ref& total, const pl::Ref& planes, const pl::Ref& rows,
                     const pl::Ref& cols, const pl::Ref& arg, const pl::Ref& bits) {
      pl::Value v = x[pl::all];  // (2, 3, 96)
      total[pl::all] = pl::sum(v, {0, 1, 2});
      planes[pl::all] = pl::max(v, {1, 2}) * 100 + pl::min(v, {1, 2});
      rows[pl::all] = pl::sum(v, {2});
      cols[pl::all] = pl::max(v, {0, 2}) + pl::prod(pl::slice(v, {0, 0, 0}, {2, 3, 4}), {0, 2});
      arg[pl::all] = pl::argmax(v, 2, DType::I32) * 1000 + pl::argmin(v, 2, DType::I32);
      pl::Value positive = v > 0;
      bits[pl::all] = pl::reduce_and(positive, {2}).astype(DType::I32) * 2 + pl::reduce_or(positive, {2}).astype(DType::I32);
    };
    PallasCall call = pl::pallas_call(kernel,
                                      {ShapeDtype({}, dt), ShapeDtype({2}, dt), ShapeDtype({2, 3}, dt), ShapeDtype({3}, dt),
                                       ShapeDtype({2, 3}, DType::I32), ShapeDtype({2, 3}, DType::I32)},
                                      opts({}, {}, {}));
    std::vector<double> values;
    for (int64_t i = 0; i < 2 * 3 * 96; ++i) values.push_back(static_cast<double>((i * 7919 + i / 96 * 13) % 9) - 3);
    values[5] = 0;  // (0, 0, :) has a negative: its and is false
    for (int64_t i = 96; i < 192; ++i) values[i] = std::abs(values[i]) + 1;  // (0, 1, :) is all positive
    Array x = Array::from_values({2, 3, 96}, dt, values);
    expect_same(call, {x}, 0, 0, {}, {2, 4, 64, 256});
    // The team path ran (the counts of shuffles), and the wide teams met in scratch.
    std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype()});
    gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, {});
    EXPECT_CONTAINS(k.source, "pl_team_combine<true>");
    for (int threads : {1, 3, 4, 256}) {
      gpu::HostEmulationStats stats;
      gpu::run_host_emulation(*tc, k, {x}, tc->grid_mapping.grid, threads, &stats);
      EXPECT_EQ(stats.shuffles > 0, threads % 2 == 0) << threads << " threads";
    }
    // The GPU's shuffles: NVRTC compiles them (the PTX has the butterfly).
    if (!gpu::Nvrtc::unavailable_reason().empty()) continue;
    const gpu::Nvrtc& nvrtc = gpu::Nvrtc::get();
    for (const char* arch : {"sm_90a", "sm_80"}) EXPECT_TRUE(nvrtc.compile(k.source, "teams.cu", arch).is_cubin) << arch;
    gpu::CompiledKernel ptx = nvrtc.compile(k.source, "teams.cu", "compute_90a");
    EXPECT_CONTAINS(std::string(ptx.image.begin(), ptx.image.end()), "shfl.sync.bfly.b32");
  }
}

// Fewer lines than threads: each line of a cumulative op is scanned by a team (chunks, then the
// team's exclusive scan of their totals, by shuffles and for teams wider than a warp through
// scratch). 2, 4, 64 and 256 threads make teams of 2, 4, 32 (6 lines of 96) and of up to 256
// lanes (one line of 576); 1024 threads make teams of 64 for 16 lines of 64 (the wide bound).
// Small integer values, so that every float sum is exact in any order; products of +-1 and 2.
TEST(GpuCodegenOps, ScansWithFewerLinesThanThreadsAreSharedByTeams) {
  for (DType dt : {DType::F32, DType::BF16, DType::I32, DType::I8}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    auto kernel = [dt](const pl::Ref& x, const pl::Ref& rows, const pl::Ref& flat, const pl::Ref& cols,
                     const pl::Ref& prods, const pl::Ref& bits) {
      pl::Value v = x[pl::all];  // (2, 3, 96)
      rows[pl::all] = pl::cumsum(v, 2) + pl::cummax(v, 2, /*reverse=*/true);
      flat[pl::all] = pl::cumsum(pl::reshape(v, {576}), 0, /*reverse=*/true) + pl::cummin(pl::reshape(v, {576}), 0);
      cols[pl::all] = pl::cumsum(v, 0) + pl::cummin(v, 1);
      auto full = [&](double c) { return pl::full({2, 3, 96}, dt, c); };
      pl::Value two = pl::where(v > 2, full(2), pl::where(v < 0, full(-1), full(1)));
      prods[pl::all] = pl::cumprod(pl::slice(two, {0, 0, 0}, {1, 1, 40}), 2);
      bits[pl::all] = pl::cummax(v > 3, 2).astype(DType::I32) + pl::cummin(v > -3, 2, true).astype(DType::I32) * 2;
    };
    PallasCall call = pl::pallas_call(kernel,
                                      {ShapeDtype({2, 3, 96}, dt), ShapeDtype({576}, dt), ShapeDtype({2, 3, 96}, dt),
                                       ShapeDtype({1, 1, 40}, dt), ShapeDtype({2, 3, 96}, DType::I32)},
                                      opts({}, {}, {}));
    std::vector<double> values;
    for (int64_t i = 0; i < 2 * 3 * 96; ++i) values.push_back(static_cast<double>((i * 7919 + i / 96 * 13) % 9) - 3);
    Array x = Array::from_values({2, 3, 96}, dt, values);
    expect_same(call, {x}, 0, 0, {}, {1, 2, 4, 64, 256});
    std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype()});
    gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, {});
    EXPECT_CONTAINS(k.source, "pl_team_exclusive_scan<true>");
    gpu::HostEmulationStats stats;
    gpu::run_host_emulation(*tc, k, {x}, tc->grid_mapping.grid, 256, &stats);
    EXPECT_GT(stats.shuffles, 0);
    if (!gpu::Nvrtc::unavailable_reason().empty()) continue;
    for (const char* arch : {"sm_90a", "sm_80"})
      EXPECT_TRUE(gpu::Nvrtc::get().compile(k.source, "scans.cu", arch).is_cubin) << arch;
  }
  auto wide = [](const pl::Ref& x, const pl::Ref& o) { o[pl::all] = pl::cumsum(x[pl::all], 1) * 1000 + pl::cummax(x[pl::all], 1); };
  PallasCall call = pl::pallas_call(wide, {ShapeDtype({16, 64}, DType::I32)}, opts({}, {}, {}));
  expect_same(call, {Array::random_normal({16, 64}, DType::I32, 5, 0, 50)}, 0, 0, {}, {128, 1024});
}

// A broadcast used once by an elementwise op or a store is read where its operand lies (no pass
// writing the broadcast tile), and a reshape / expand_dims / squeeze is its operand's elements at
// the same flat index (no copy) — but not of a fused expression under a broadcast, which would
// evaluate it once per element of the broadcast. The operand of each broadcast here was written by other threads
// just before (a slice, a reduction), so the fused loop must start with a barrier: 3 and 64
// threads check it (and ThreadSanitizer, which the emulated kernel is built with under TSan).
TEST(GpuCodegenOps, BroadcastsAndReshapesFuseIntoTheLoopsThatReadThem) {
  auto kernel = [](const pl::Ref& x, const pl::Ref& o, const pl::Ref& o2, const pl::Ref& o3, const pl::Ref& o4) {
    pl::Value v = x[pl::all];                              // (8, 32)
    pl::Value first = pl::slice(v, {0, 0}, {8, 1});        // (8, 1): another thread's elements
    pl::Value centered = v - pl::broadcast_to(first, {8, 32});  // fused into the sub's loop
    o[pl::all] = centered * centered + centered;
    o2[pl::all] = pl::broadcast_to(pl::expand_dims(pl::max(v, {1}), {1}), {8, 32});  // into the store
    o3[pl::all] = pl::sum(pl::reshape(v, {16, 16}), {1}) +  // fused into the reduction
                  pl::squeeze(pl::slice(v, {0, 0}, {1, 16}), {0});  // fused into the add
    o4[pl::all] = pl::reshape(pl::sum(v, {0}), {4, 8}) * 3 +  // reshape of a reduction, fused
                  pl::reshape(pl::broadcast_to(pl::reshape(pl::exp(pl::convert(pl::sum(v, {1}), DType::F32)) > 1.0f,
                                                           {8, 1}),  // a tile of its own (the exp's loop)
                                               {8, 4}),
                              {4, 8})
                      .astype(DType::I32);
  };
  PallasCall call = pl::pallas_call(kernel,
                                    {ShapeDtype({8, 32}, DType::I32), ShapeDtype({8, 32}, DType::I32),
                                     ShapeDtype({16}, DType::I32), ShapeDtype({4, 8}, DType::I32)},
                                    opts({}, {}, {}));
  Array x = Array::random_normal({8, 32}, DType::I32, 11, 0, 100);
  expect_same(call, {x}, 0, 0, {}, {1, 3, 64});
  std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype()});
  const std::string src = gpu::generate_cuda(*tc, tc->grid_mapping.grid, {}).source;
  EXPECT_EQ(count_of(src, "// broadcast_in_dim"), 3);
  for (const char* op : {"// expand_dims", "// reshape", "// squeeze", "// broadcast_in_dim"}) {
    int unfused = 0;
    for (size_t at = src.find(op); at != std::string::npos; at = src.find(op, at + 1))
      unfused += src.substr(at, src.find('\n', at) - at).find("(fused into its use)") == std::string::npos;
    EXPECT_EQ(unfused, std::string(op) == "// reshape" ? 1 : 0) << op;  // the exp's reshape
  }
}

// A pallas_call's values stay in registers in the blocked layout (a row per warp, a column per
// lane): the block's load, the elementwise ops, the reductions of rows (shuffles of the warp, in
// registers), rows broadcast along the rows, a rows value stored by one lane, a total. Two rows
// per warp (16 rows, 8 warps) and two registers a row (64 columns). Checked against a softmax in
// plain C++ and against the reference interpreter (expect_same: with register tiles on the CTA's
// 256 threads, and without them).
TEST(GpuCodegenOps, PallasCallBlocksStayInRegisters) {
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    auto kernel = [](const pl::Ref& x, const pl::Ref& o, const pl::Ref& rows, const pl::Ref& spread, const pl::Ref& total) {
      pl::Value v = x[pl::all].astype(DType::F32);          // (16, 64): bf16's convert of a fused load
      pl::Value m = pl::expand_dims(pl::max(v, {1}), {1});  // (16, 1) in registers
      pl::Value e = pl::exp(v - m);
      pl::Value s = pl::sum(e, {1});                        // (16)
      o[pl::all] = (e / pl::expand_dims(s, {1})).astype(o.dtype());
      rows[pl::all] = s * 2.0f + pl::min(v, {1});           // rows stored by a lane per warp
      spread[pl::all] = pl::broadcast_to(m, {16, 64}) * 2.0f;  // rows broadcast, no tile read
      total[pl::all] = pl::sum(v * v, {0, 1});              // every thread's registers, then the CTA
    };
    PallasCall call = pl::pallas_call(kernel,
                                      {ShapeDtype({16, 64}, dt), ShapeDtype({16}, DType::F32), ShapeDtype({16, 64}, DType::F32),
                                       ShapeDtype({}, DType::F32)},
                                      opts({}, {}, {}));
    const Array x = Array::random_normal({16, 64}, dt, 5);
    expect_same(call, {x}, 2e-6, 1e-6);
    std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype()});
    const gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, {});
    // v (or its convert), the max, m, e, s, the min, the square: no tile in the arena (the total's
    // warps meet in a word each), and no barrier from the load to the first store.
    EXPECT_EQ(k.register_tiles, 7);
    const std::string point = grid_point_function(k.source);
    EXPECT_EQ(count_of(point, "float* v"), 0) << point;
    const size_t load = point.find("// load"), store = point.find("// store");
    EXPECT_EQ(count_of(point.substr(load, store - load), "pl_sync();"), 0) << point;
    EXPECT_EQ(count_of(point, "pl_team_combine<false>(pl_r, 32"), 3) << point;  // max, sum, min
    // The softmax against plain C++ (the emulation's registers computed it; bf16 rounds o).
    const std::vector<Array> got = gpu::run_host_emulation(*tc, k, {x.clone()}, tc->grid_mapping.grid, k.threads_per_cta);
    const std::vector<double> xs = x.to_doubles(), os = got[0].to_doubles(), rs = got[1].to_doubles();
    for (int64_t r = 0; r < 16; ++r) {
      double mx = -INFINITY, mn = INFINITY, sum = 0;
      for (int64_t c = 0; c < 64; ++c) mx = std::max(mx, xs[r * 64 + c]), mn = std::min(mn, xs[r * 64 + c]);
      for (int64_t c = 0; c < 64; ++c) sum += std::exp(xs[r * 64 + c] - mx);
      for (int64_t c = 0; c < 64; ++c) {
        const double want = std::exp(xs[r * 64 + c] - mx) / sum;
        EXPECT_NEAR(os[r * 64 + c], want, want * (dt == DType::BF16 ? 4e-3 : 1e-5) + 1e-7) << r << ", " << c;
      }
      EXPECT_NEAR(rs[r], 2 * sum + mn, 1e-4 * sum) << r;
    }
    if (!gpu::Nvrtc::unavailable_reason().empty()) continue;
    for (const char* arch : {"sm_90a", "sm_80"})
      EXPECT_TRUE(gpu::Nvrtc::get().compile(k.source, "blocked.cu", arch).is_cubin) << arch;
  }
}

// Columns in registers too (the blocked layout's columns layout: lane c % 32 of every warp holds
// column c): an (n) block's load (layer_norm's gamma), elementwise ops on it, its broadcast along
// a tile's columns, a reduction of a tile's columns (each thread's rows, the warps' partials
// through the arena) into registers or, for a use reading it otherwise, into a tile, and a total.
TEST(GpuCodegenOps, PallasCallColumnsStayInRegisters) {
  auto kernel = [](const pl::Ref& x, const pl::Ref& g, const pl::Ref& o, const pl::Ref& sums, const pl::Ref& grid,
                   const pl::Ref& total) {
    pl::Value v = x[pl::all];                                     // (16, 64)
    pl::Value gv = g[pl::all];                                    // (64): columns
    pl::Value y = v * pl::broadcast_to(gv, {16, 64}) + pl::broadcast_to(gv * 2.0f, {16, 64});
    pl::Value s = pl::sum(y, {0});                                // (64): columns, in registers
    o[pl::all] = y - pl::broadcast_to(pl::expand_dims(s * (1.0f / 16), {0}), {16, 64});
    sums[pl::all] = s;                                            // the first warp stores it
    grid[pl::all] = pl::reshape(pl::max(v, {0}), {8, 8});         // another index: a tile
    total[pl::all] = pl::sum(gv, {0});                            // every warp has it: one counts
  };
  PallasCall call = pl::pallas_call(kernel,
                                    {ShapeDtype({16, 64}, DType::F32), ShapeDtype({64}, DType::F32),
                                     ShapeDtype({8, 8}, DType::F32), ShapeDtype({}, DType::F32)},
                                    opts({}, {}, {}));
  const Array x = Array::random_normal({16, 64}, DType::F32, 9);
  const Array g = Array::random_normal({64}, DType::F32, 10);
  expect_same(call, {x, g}, 1e-5, 1e-5);
  std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype(), g.shape_dtype()});
  const gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, {});
  EXPECT_GE(k.register_tiles, 6);  // v, gv, gv * 2, y, s, s / 16
  const std::vector<Array> got =
      gpu::run_host_emulation(*tc, k, {x.clone(), g.clone()}, tc->grid_mapping.grid, k.threads_per_cta);
  const std::vector<double> xs = x.to_doubles(), gs = g.to_doubles();
  const std::vector<double> os = got[0].to_doubles(), ss = got[1].to_doubles(), ms = got[2].to_doubles();
  double gsum = 0;
  for (int64_t c = 0; c < 64; ++c) {
    double s = 0, mx = -INFINITY;
    for (int64_t r = 0; r < 16; ++r) s += xs[r * 64 + c] * gs[c] + 2 * gs[c], mx = std::max(mx, xs[r * 64 + c]);
    EXPECT_NEAR(ss[c], s, 1e-4) << c;
    EXPECT_EQ(ms[c], mx) << c;
    for (int64_t r = 0; r < 16; ++r) EXPECT_NEAR(os[r * 64 + c], xs[r * 64 + c] * gs[c] + 2 * gs[c] - s / 16, 1e-4) << r << ", " << c;
    gsum += gs[c];
  }
  EXPECT_NEAR(got[3].to_doubles()[0], gsum, 1e-4);
  // A 1-D block's values alone stay in the arena: in the columns layout every warp would compute
  // all of them.
  auto flat = [](const pl::Ref& x, const pl::Ref& o, const pl::Ref& o2) {
    pl::Value y = x[pl::all] * 2.0f;
    o[pl::all] = y;
    o2[pl::all] = y + 1.0f;
  };
  PallasCall flat_call =
      pl::pallas_call(flat, {ShapeDtype({256}, DType::F32), ShapeDtype({256}, DType::F32)}, opts({}, {}, {}));
  expect_same(flat_call, {Array::random_normal({256}, DType::F32, 11)});
  std::shared_ptr<const TracedCall> ftc = flat_call.trace({ShapeDtype({256}, DType::F32)});
  EXPECT_EQ(gpu::generate_cuda(*ftc, ftc->grid_mapping.grid, {}).register_tiles, 0);
  if (!gpu::Nvrtc::unavailable_reason().empty()) return;
  for (const char* arch : {"sm_90a", "sm_80"})
    EXPECT_TRUE(gpu::Nvrtc::get().compile(k.source, "columns.cu", arch).is_cubin) << arch;
}

// A pallas_call's loop carries its blocked tiles in registers (a fori_loop whose body loads a
// block and updates the carry; a run_scoped's result): no arena holder, no copy through shared
// memory per iteration. Against plain C++ and the reference interpreter.
TEST(GpuCodegenOps, PallasCallLoopsCarryBlocksInRegisters) {
  auto kernel = [](const pl::Ref& x, const pl::Ref& y, const pl::Ref& o) {
    pl::Value v = x[pl::all];  // (8, 64)
    std::vector<pl::Value> c = pl::fori_loop(0, 4, {v}, [&](pl::Value i, std::vector<pl::Value> c) {
      return std::vector<pl::Value>{c[0] * 0.5f + y[pl::all] * pl::convert(i, DType::F32)};
    });
    o[pl::all] = c[0] - pl::broadcast_to(pl::expand_dims(pl::max(c[0], {1}), {1}), {8, 64});
  };
  PallasCall call = pl::pallas_call(kernel, ShapeDtype({8, 64}, DType::F32), opts({}, {}, {}));
  const Array x = Array::random_normal({8, 64}, DType::F32, 12), y = Array::random_normal({8, 64}, DType::F32, 13);
  expect_same(call, {x, y}, 1e-6, 1e-6);
  std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype(), y.shape_dtype()});
  const gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, {});
  const std::string point = grid_point_function(k.source);
  EXPECT_EQ(count_of(point, "float* v"), 0) << point;  // no arena tile: the carry's holder is registers
  const std::vector<Array> got = gpu::run_host_emulation(*tc, k, {x.clone(), y.clone()}, tc->grid_mapping.grid, k.threads_per_cta);
  const std::vector<double> xs = x.to_doubles(), ys = y.to_doubles(), os = got[0].to_doubles();
  for (int64_t r = 0; r < 8; ++r) {
    std::vector<double> c(xs.begin() + r * 64, xs.begin() + r * 64 + 64);
    for (int i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 64; ++j) c[j] = c[j] * 0.5 + ys[r * 64 + j] * i;
    const double mx = *std::max_element(c.begin(), c.end());
    for (int64_t j = 0; j < 64; ++j) EXPECT_NEAR(os[r * 64 + j], c[j] - mx, 1e-5) << r << ", " << j;
  }
}

// A while_loop carries blocks in registers as a fori_loop does, its condition reading them there
// too: halve an (8, 64) block (plus y) until its largest magnitude drops under a bound, counting
// the rounds in a scalar carry; and a loop whose condition reads only the count. Against plain
// C++; the grid point's unit has no arena tile (the carries' holders are registers).
TEST(GpuCodegenOps, PallasCallWhileLoopsCarryBlocksInRegisters) {
  for (const bool cond_reads_block : {true, false}) {
    SCOPED_TRACE(cond_reads_block ? "the condition reads the block" : "the condition reads the count");
    auto kernel = [cond_reads_block](const pl::Ref& x, const pl::Ref& y, const pl::Ref& o, const pl::Ref& n,
                                     const pl::Ref& raw) {
      pl::Value v = x[pl::all];  // (8, 64)
      std::vector<pl::Value> c = pl::while_loop(
          {v, pl::scalar(0, DType::I32)},
          [&](const std::vector<pl::Value>& c) {
            return cond_reads_block ? pl::max(pl::abs(c[0])) > 0.25f : c[1] < 5;
          },
          [&](const std::vector<pl::Value>& c) {
            return std::vector<pl::Value>{c[0] * 0.5f + y[pl::all] * 0.01f, c[1] + 1};
          });
      o[pl::all] = c[0] - pl::broadcast_to(pl::expand_dims(pl::max(c[0], {1}), {1}), {8, 64});
      n[0] = c[1];
      raw[pl::all] = c[0];
    };
    PallasCall call = pl::pallas_call(
        kernel, {ShapeDtype({8, 64}, DType::F32), ShapeDtype({1}, DType::I32), ShapeDtype({8, 64}, DType::F32)}, opts({}, {}, {}));
    const Array x = Array::random_normal({8, 64}, DType::F32, 14), y = Array::random_normal({8, 64}, DType::F32, 15);
    const gpu::GeneratedKernel k = expect_same(call, {x, y}, 1e-6, 1e-6);
    std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype(), y.shape_dtype()});
    const std::string point = grid_point_function(k.source);
    EXPECT_CONTAINS(point, "while (true) {");
    EXPECT_EQ(k.register_carries, 1);  // (the block; the count is a scalar)
    EXPECT_EQ(count_of(point, "float* v"), 0) << point;
    const std::vector<Array> got = gpu::run_host_emulation(*tc, k, {x.clone(), y.clone()}, tc->grid_mapping.grid, k.threads_per_cta);
    const std::vector<double> xs = x.to_doubles(), ys = y.to_doubles(), os = got[0].to_doubles();
    std::vector<double> c = xs;
    int rounds = 0;
    auto largest = [&] {
      double m = 0;
      for (double e : c) m = std::max(m, std::abs(e));
      return m;
    };
    while (cond_reads_block ? largest() > 0.25 : rounds < 5) {
      for (size_t e = 0; e < c.size(); ++e) c[e] = c[e] * 0.5 + ys[e] * 0.01;
      ++rounds;
    }
    ASSERT_GT(rounds, 1);
    EXPECT_EQ(got[1].get_flat(0), rounds);
    for (int64_t r = 0; r < 8; ++r) {
      const double mx = *std::max_element(c.begin() + r * 64, c.begin() + r * 64 + 64);
      for (int64_t j = 0; j < 64; ++j) {
        EXPECT_NEAR(os[r * 64 + j], c[r * 64 + j] - mx, 1e-5) << r << ", " << j;
        EXPECT_NEAR(got[2].get_flat(r * 64 + j), c[r * 64 + j], 1e-5) << r << ", " << j;
      }
    }
  }
}

// A cond's or switch's results are register tiles where every branch yields them in one layout:
// each branch computes its block in registers and copies it into the result's registers, no arena
// tile. Three (8, 64) blocks: the cond's predicate is the sign of a block's total (both ways are
// taken over the seeds), the switch's index the program id (each branch once). Against plain C++.
TEST(GpuCodegenOps, PallasCallBranchResultsStayInRegisters) {
  std::set<int> cond_taken;
  for (const int branches : {2, 3}) {
    for (const uint64_t seed : {21, 22}) {
      SCOPED_TRACE(std::to_string(branches) + " branches, seed " + std::to_string(seed));
      auto kernel = [branches](const pl::Ref& x, const pl::Ref& y, const pl::Ref& o, const pl::Ref& raw) {
        const pl::Value b =
            branches == 2
                ? pl::cond(pl::sum(x[pl::all]) > 0.0f, [&] { return x[pl::all] * 2.0f + y[pl::all]; },
                           [&] { return x[pl::all] - y[pl::all]; })
                : pl::switch_case(pl::program_id(0), {[&] { return std::vector<pl::Value>{x[pl::all] * 2.0f}; },
                                                      [&] { return std::vector<pl::Value>{x[pl::all] + y[pl::all]}; },
                                                      [&] { return std::vector<pl::Value>{pl::exp(x[pl::all] * 0.1f)}; }})
                      .at(0);
        o[pl::all] = b - pl::broadcast_to(pl::expand_dims(pl::max(b, {1}), {1}), {8, 64});
        raw[pl::all] = b;
      };
      const BlockSpec block({8, 64}, [](Value i) { return Indices{i, 0}; });
      PallasCall call = pl::pallas_call(kernel, {ShapeDtype({24, 64}, DType::F32), ShapeDtype({24, 64}, DType::F32)},
                                        opts({3}, {block, block}, {block, block}));
      const Array x = Array::random_normal({24, 64}, DType::F32, seed), y = Array::random_normal({24, 64}, DType::F32, seed + 10);
      const gpu::GeneratedKernel k = expect_same(call, {x, y}, 1e-5, 1e-5);
      std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype(), y.shape_dtype()});
      const std::string point = grid_point_function(k.source);
      EXPECT_EQ(k.register_carries, 1);
      EXPECT_EQ(count_of(point, "float* v"), 0) << point;
      const std::vector<Array> got = gpu::run_host_emulation(*tc, k, {x.clone(), y.clone()}, tc->grid_mapping.grid, k.threads_per_cta);
      const std::vector<double> xs = x.to_doubles(), ys = y.to_doubles(), os = got[0].to_doubles();
      for (int64_t blk = 0; blk < 3; ++blk) {
        const size_t first = static_cast<size_t>(blk) * 512;
        double total = 0;
        for (size_t e = first; e < first + 512; ++e) total += xs[e];
        const int taken = branches == 2 ? (total > 0 ? 0 : 1) : static_cast<int>(blk);
        if (branches == 2) cond_taken.insert(taken);
        std::vector<double> b(512);
        for (size_t e = 0; e < 512; ++e) {
          const double xv = xs[first + e], yv = ys[first + e];
          b[e] = branches == 2 ? (taken == 0 ? xv * 2 + yv : xv - yv) : (taken == 0 ? xv * 2 : taken == 1 ? xv + yv : std::exp(xv * 0.1));
        }
        for (size_t r = 0; r < 8; ++r) {
          const double mx = *std::max_element(b.begin() + static_cast<long>(r * 64), b.begin() + static_cast<long>(r * 64 + 64));
          for (size_t j = 0; j < 64; ++j) {
            EXPECT_NEAR(os[first + r * 64 + j], b[r * 64 + j] - mx, 1e-4) << blk << ": " << r << ", " << j;
            EXPECT_NEAR(got[1].get_flat(static_cast<int64_t>(first + r * 64 + j)), b[r * 64 + j], 1e-4) << blk << ": " << r << ", " << j;
          }
        }
      }
    }
  }
  EXPECT_EQ(cond_taken, (std::set<int>{0, 1}));  // (the seeds take both ways)
}

// A register tile made before a loop or a branch and read inside it stays in its registers (a
// captured tile, Emitter::captured_offers_): x * 2 read by a fori_loop's body, by both branches of
// a cond (whose results then stay in registers too), by a `when` without results, and by a cond
// inside a loop (two levels); such loops, writing nothing, run without barriers. Where a read
// inside cannot take registers — a reversal of rows, or the body yielding the tile itself — it is
// an arena tile as before. Against plain C++.
TEST(GpuCodegenOps, PallasCallCapturedTilesStayInRegisters) {
  enum Case { kLoop, kBranches, kWhen, kNested, kRowReversal, kYielded };
  for (const Case c : {kLoop, kBranches, kWhen, kNested, kRowReversal, kYielded}) {
    SCOPED_TRACE("case " + std::to_string(static_cast<int>(c)));
    auto kernel = [c](const pl::Ref& x, const pl::Ref& y, const pl::Ref& o) {
      const pl::Value xv = x[pl::all] * 2.0f;  // (16, 64): made outside, read inside
      const pl::Value yv = y[pl::all];
      pl::Value r;
      switch (c) {
        case kLoop: r = pl::fori_loop(0, 3, yv, [&](pl::Value, pl::Value acc) { return acc * 0.5f + xv; }); break;
        case kBranches:
          r = pl::cond(pl::sum(yv) > 0.0f, [&] { return xv + 1.0f; }, [&] { return xv * y[pl::all]; });
          break;
        case kWhen:
          pl::when(pl::sum(yv) > 0.0f, [&] { o[pl::all] = pl::exp(xv * 0.25f); });
          pl::when(pl::sum(yv) <= 0.0f, [&] { o[pl::all] = xv - 1.0f; });
          return;
        case kNested:
          r = pl::fori_loop(0, 3, yv, [&](pl::Value i, pl::Value acc) {
            return pl::cond(i % 2 == 0, [&] { return acc + xv; }, [&] { return acc - xv * 0.5f; });
          });
          break;
        case kRowReversal: r = pl::fori_loop(0, 2, yv, [&](pl::Value, pl::Value acc) { return acc + pl::rev(xv, {0}); }); break;
        case kYielded: r = pl::fori_loop(0, 2, yv, [&](pl::Value, pl::Value) { return xv; }); break;
      }
      o[pl::all] = r - pl::broadcast_to(pl::expand_dims(pl::max(r, {1}), {1}), {16, 64});
    };
    PallasCall call = pl::pallas_call(kernel, ShapeDtype({16, 64}, DType::F32), opts({}, {}, {}));
    for (const double y_mean : {0.5, -0.5}) {  // (the branches' predicate both ways)
      const Array x = Array::random_normal({16, 64}, DType::F32, 71), y = Array::random_normal({16, 64}, DType::F32, 72, y_mean);
      const gpu::GeneratedKernel k = expect_same(call, {x, y}, 1e-5, 1e-5);
      const bool in_registers = c != kRowReversal && c != kYielded;
      EXPECT_EQ(k.register_captures, !in_registers ? 0 : c == kNested ? 2 : 1);  // (nested: x * 2, and acc in the cond)
      const std::string point = grid_point_function(k.source);
      if (in_registers) {
        EXPECT_EQ(count_of(point, "float* v"), 0) << point;  // no arena tile
      }
      if (c == kLoop || c == kNested) {
        // A loop of registers and reads only needs no barrier at its start or in its iterations.
        const size_t from = point.find("// for "), to = point.find("// reduce_max");
        ASSERT_NE(from, std::string::npos);
        EXPECT_EQ(count_of(point.substr(from, to - from), "pl_sync()"), 0) << point;
      }
      std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype(), y.shape_dtype()});
      const std::vector<Array> got = gpu::run_host_emulation(*tc, k, {x.clone(), y.clone()}, tc->grid_mapping.grid, k.threads_per_cta);
      const std::vector<double> xs = x.to_doubles(), ys = y.to_doubles(), os = got[0].to_doubles();
      double total = 0;
      for (double e : ys) total += e;
      std::vector<double> want(1024);
      for (size_t e = 0; e < 1024; ++e) {
        const double xv = 2 * xs[e], xr = 2 * xs[(15 - e / 64) * 64 + e % 64];
        double acc = ys[e];
        switch (c) {
          case kLoop: for (int i = 0; i < 3; ++i) acc = acc * 0.5 + xv; break;
          case kBranches: acc = total > 0 ? xv + 1 : xv * ys[e]; break;
          case kWhen: acc = total > 0 ? std::exp(xv * 0.25) : xv - 1; break;
          case kNested: for (int i = 0; i < 3; ++i) acc = i % 2 == 0 ? acc + xv : acc - xv * 0.5; break;
          case kRowReversal: acc += 2 * xr; break;
          case kYielded: acc = xv; break;
        }
        want[e] = acc;
      }
      for (size_t row = 0; row < 16; ++row) {
        const double mx = *std::max_element(want.begin() + static_cast<long>(row * 64), want.begin() + static_cast<long>(row * 64 + 64));
        for (size_t j = 0; j < 64; ++j) {
          const double w = c == kWhen ? want[row * 64 + j] : want[row * 64 + j] - mx;
          EXPECT_NEAR(os[row * 64 + j], w, 1e-4 * (1 + std::abs(w))) << y_mean << ": " << row << ", " << j;
        }
      }
    }
  }
}

// Slices and concatenates of blocked register tiles that move whole registers stay in registers:
// rows in whole bands of the layout (8 rows of a (16, 64) f32 block at 256 threads), columns in
// whole runs of a row's lanes (32). Each thread keeps its elements: register moves, no barrier.
// Pieces that cut a band or a run, and a concatenate of a register tile with an arena tile, go
// through the arena; a register piece whose result a transpose reads is written to the arena by
// the threads holding it. Against the interpreter and plain C++.
TEST(GpuCodegenOps, PallasCallSlicesAndConcatenatesOfWholeRegisters) {
  enum Case { kRowHalvesSwapped, kColumnHalvesSwapped, kRowsAndColumns, kCutsABand, kCutsARun, kWithAnArenaTile, kIntoTheArena };
  for (const Case c : {kRowHalvesSwapped, kColumnHalvesSwapped, kRowsAndColumns, kCutsABand, kCutsARun, kWithAnArenaTile, kIntoTheArena}) {
    SCOPED_TRACE("case " + std::to_string(static_cast<int>(c)));
    auto kernel = [c](const pl::Ref& x, const pl::Ref& o) {
      const pl::Value a = x[pl::all] * 2.0f;  // (16, 64), a register tile
      pl::Value r;
      switch (c) {
        case kRowHalvesSwapped: r = pl::concatenate({pl::slice(a, {8, 0}, {16, 64}), pl::slice(a, {0, 0}, {8, 64})}, 0); break;
        case kColumnHalvesSwapped: r = pl::concatenate({pl::slice(a, {0, 32}, {16, 64}), pl::slice(a, {0, 0}, {16, 32})}, 1); break;
        case kRowsAndColumns: {  // (a corner, and the tile with its rows in another order)
          const pl::Value corner = pl::slice(a, {8, 32}, {16, 64});  // (8, 32)
          const pl::Value top = pl::concatenate({corner, pl::slice(a, {0, 0}, {8, 32})}, 1);  // (8, 64)
          r = pl::concatenate({top, pl::slice(a, {0, 0}, {8, 64})}, 0);
          break;
        }
        case kCutsABand: r = pl::concatenate({pl::slice(a, {4, 0}, {16, 64}), pl::slice(a, {0, 0}, {4, 64})}, 0); break;
        case kCutsARun: r = pl::concatenate({pl::slice(a, {0, 16}, {16, 64}), pl::slice(a, {0, 0}, {16, 16})}, 1); break;
        case kWithAnArenaTile: r = pl::concatenate({pl::slice(a, {0, 0}, {8, 64}), pl::rev(x(pl::ds(0, 8), pl::all), {0})}, 0); break;
        case kIntoTheArena: r = pl::transpose(pl::reshape(pl::slice(a, {8, 0}, {16, 64}), {64, 8}), {1, 0}); break;
      }
      if (c == kIntoTheArena) {
        o(pl::ds(0, 8), pl::all) = r;
        o(pl::ds(8, 8), pl::all) = pl::slice(a, {8, 0}, {16, 64});
        return;
      }
      o[pl::all] = r - pl::broadcast_to(pl::expand_dims(pl::max(r, {1}), {1}), {16, 64});
    };
    PallasCall call = pl::pallas_call(kernel, ShapeDtype({16, 64}, DType::F32), opts({}, {}, {}));
    const Array x = Array::random_normal({16, 64}, DType::F32, 91);
    const gpu::GeneratedKernel k = expect_same(call, {x}, 1e-6, 1e-6);
    const std::string point = grid_point_function(k.source);
    if (c == kRowHalvesSwapped || c == kColumnHalvesSwapped || c == kRowsAndColumns) {
      EXPECT_EQ(count_of(point, "float* v"), 0) << point;  // (no arena tile)
      EXPECT_EQ(count_of(point.substr(point.find("// slice")), "pl_sync()"), 1) << point;  // (the point's last)
    } else if (c == kIntoTheArena) {
      EXPECT_CONTAINS(point, "float v4[4];  // a register tile");  // (a: the slice reads its registers)
    } else {
      EXPECT_GT(count_of(point, "float* v"), 0) << point;
    }
    std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype()});
    const std::vector<Array> got = gpu::run_host_emulation(*tc, k, {x.clone()}, tc->grid_mapping.grid, k.threads_per_cta);
    const std::vector<double> xs = x.to_doubles(), os = got[0].to_doubles();
    auto a = [&](int64_t i, int64_t j) { return 2 * xs[static_cast<size_t>(i * 64 + j)]; };
    std::vector<double> want(1024);
    for (int64_t i = 0; i < 16; ++i)
      for (int64_t j = 0; j < 64; ++j) {
        double w = 0;
        switch (c) {
          case kRowHalvesSwapped: w = a((i + 8) % 16, j); break;
          case kColumnHalvesSwapped: w = a(i, (j + 32) % 64); break;
          case kRowsAndColumns: w = i < 8 ? (j < 32 ? a(i + 8, j + 32) : a(i, j - 32)) : a(i - 8, j); break;
          case kCutsABand: w = a((i + 4) % 16, j); break;
          case kCutsARun: w = a(i, (j + 16) % 64); break;
          case kWithAnArenaTile: w = i < 8 ? a(i, j) : xs[static_cast<size_t>((15 - i) * 64 + j)]; break;
          case kIntoTheArena: {  // (rows 8-15 of a, read as (64, 8) and transposed; then those rows)
            const int64_t flat = j * 8 + i;  // (element (j, i) of the (64, 8) reshape)
            w = i < 8 ? a(8 + flat / 64, flat % 64) : a(i, j);
            break;
          }
        }
        want[static_cast<size_t>(i * 64 + j)] = w;
      }
    for (int64_t i = 0; i < 16; ++i) {
      const double mx = *std::max_element(want.begin() + i * 64, want.begin() + i * 64 + 64);
      for (int64_t j = 0; j < 64; ++j) {
        const double w = c == kIntoTheArena ? want[static_cast<size_t>(i * 64 + j)] : want[static_cast<size_t>(i * 64 + j)] - mx;
        EXPECT_NEAR(os[static_cast<size_t>(i * 64 + j)], w, 1e-5 * (1 + std::abs(w))) << i << ", " << j;
      }
    }
  }
}

// A loop whose body writes nothing by kind starts without a barrier while reads are pending (its
// body only reads); when its emitted body writes anyway (the arena tile of a row reversal) its
// iterations end with one — but a loop of no iterations runs none, so those reads are still
// pending after it: a write after the loop must sync first. Thread 255 reads s[15, 63] into its
// registers before the loop, thread 0 writes it after (a race ThreadSanitizer reports in host
// emulation, and a wrong r when thread 0 is first). Against the interpreter and plain C++.
TEST(GpuCodegenOps, ALoopOfNoIterationsLeavesTheReadsBeforeItPending) {
  auto kernel = [](const pl::Ref& x, const pl::Ref& n, const pl::Ref& o, const pl::Ref& s) {
    s[pl::all] = x[pl::all] * 2.0f;
    const pl::Value count = n[0];
    const pl::Value v = s[pl::all];  // (a register tile: each thread reads its own elements)
    const pl::Value r = pl::fori_loop(0, count, v, [&](pl::Value, pl::Value acc) { return acc * 0.5f + pl::rev(acc * 0.25f, {0}); });
    s(15, 63) = pl::scalar(7.0, DType::F32);
    o[pl::all] = s[pl::all] + r;
  };
  PallasCall call = pl::pallas_call(kernel, ShapeDtype({16, 64}, DType::F32),
                                    opts({}, {BlockSpec(), BlockSpec(MemorySpace::Smem)}, {}, {{{16, 64}, DType::F32, MemorySpace::Vmem}}));
  const Array x = Array::random_normal({16, 64}, DType::F32, 81);
  for (const int32_t count : {0, 2}) {
    SCOPED_TRACE(count);
    Array n = Array::full({1}, DType::I32, count);
    const gpu::GeneratedKernel k = expect_same(call, {x, n}, 1e-6, 1e-6);
    // The loop's carry is a register tile; after the loop, a barrier before the scalar store.
    const std::string point = grid_point_function(k.source);
    const size_t loop = point.find("for (pl_i64 it"), store = point.find("if (pl_tid() == 0)", loop);
    ASSERT_NE(store, std::string::npos) << point;
    const size_t loop_end = point.rfind("\n  }\n", store);
    ASSERT_GT(loop_end, loop) << point;
    EXPECT_EQ(count_of(point.substr(loop_end, store - loop_end), "pl_sync()"), 1) << point;
    std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype(), n.shape_dtype()});
    for (int round = 0; round < 3; ++round) {  // (the race, were it there, goes either way)
      const std::vector<Array> got = gpu::run_host_emulation(*tc, k, {x.clone(), n.clone()}, tc->grid_mapping.grid, k.threads_per_cta);
      const std::vector<double> xs = x.to_doubles(), os = got[0].to_doubles();
      std::vector<double> r(1024);
      for (size_t e = 0; e < 1024; ++e) r[e] = 2 * xs[e];
      for (int i = 0; i < count; ++i) {
        std::vector<double> next(1024);
        for (size_t e = 0; e < 1024; ++e) next[e] = r[e] * 0.5 + r[(15 - e / 64) * 64 + e % 64] * 0.25;
        r = next;
      }
      for (size_t e = 0; e < 1024; ++e) {
        const double want = (e == 15 * 64 + 63 ? 7.0 : 2 * xs[e]) + r[e];
        EXPECT_NEAR(os[e], want, 1e-5 * (1 + std::abs(want))) << e;
      }
    }
  }
}

// Control flow nested deeper than the planner follows carries (Emitter::kCarryPlanningDepth):
// planning an op's carries plans its regions two or three times over and theirs inside each, so
// 12 conds nested in each other's branches took 11 s to generate, about three times more per
// level; past depth 6 the results stay in the arena and 16 generate quickly (an unbounded plan
// would pass the test's time limit). Against the interpreter; the whiles' outer six levels still
// carry registers.
TEST(GpuCodegenOps, DeeplyNestedControlFlowPlansInBoundedTime) {
  for (const bool use_while : {false, true}) {
    SCOPED_TRACE(use_while ? "while_loops" : "conds");
    auto kernel = [use_while](const pl::Ref& x, const pl::Ref& y, const pl::Ref& o) {
      std::function<pl::Value(int)> nest = [&](int d) -> pl::Value {
        if (d == 0) return x[pl::all] * 2.0f;
        if (use_while)
          return pl::while_loop(
                     {x[pl::all] + static_cast<float>(d), pl::scalar(0, DType::I32)},
                     [&](const std::vector<pl::Value>& c) { return c[1] < 2; },
                     [&](const std::vector<pl::Value>& c) { return std::vector<pl::Value>{nest(d - 1) + c[0] * 0.5f, c[1] + 1}; })
              .at(0);
        return pl::cond(pl::sum(y[pl::all]) > static_cast<float>(d), [&] { return nest(d - 1) + 1.0f; },
                        [&] { return x[pl::all] - static_cast<float>(d); });
      };
      o[pl::all] = nest(16);
    };
    PallasCall call = pl::pallas_call(kernel, ShapeDtype({16, 64}, DType::F32), opts({}, {}, {}));
    const Array x = Array::random_normal({16, 64}, DType::F32, 61), y = Array::random_normal({16, 64}, DType::F32, 62, 1.0, 0.1);  // (sum 1024: every level nests)
    std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype(), y.shape_dtype()});
    const gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, {});
    // (The outer six levels of whiles carry registers; the conds' results all go to the arena: a
    // branch's yield reads the arena result of the level inside it.)
    EXPECT_EQ(k.register_carries, use_while ? 6 : 0);
    if (!use_while) expect_same(call, {x, y}, 1e-4, 1e-4);  // (the whiles run 2^16 bodies: generation only)
  }
}

// Register tiles beside tensor-core products (a helper review's two findings): a block that a
// wgmma product reads from its ring slot and a blocked register tile loads too (the slot keeps
// the row-major layout the load reads: view() records the load's use), and a rows value scaling
// the register accumulator's scratch (`acc = acc * m`, attention's rescale: the store runs in
// memory, the rows go to the arena for it — it hit an internal check).
TEST(GpuCodegenOps, PallasCallRegisterTilesBesideTensorCoreProducts) {
  const int64_t M = 64, N = 64, K = 256, bk = 32;
  auto kernel = [](const pl::Ref& x, const pl::Ref& y, const pl::Ref& w, const pl::Ref& z, const pl::Ref& r,
                   const pl::Ref& acc) {
    pl::when(pl::program_id(0) == 0, [&] { acc[pl::all] = 0.0f; });
    acc[pl::all] += pl::dot(x[pl::all], y[pl::all], {.preferred = DType::F32});
    pl::Value xv = x[pl::all];  // the slot's block, also a register tile
    r[pl::all] = xv + xv;
    pl::Value rm = pl::max(w[pl::all], {1});
    acc[pl::all] = acc[pl::all] * pl::broadcast_to(pl::expand_dims(rm, {1}), {M, N});
    pl::when(pl::program_id(0) == pl::num_programs(0) - 1, [&] { z[pl::all] = acc[pl::all]; });
  };
  PallasCall call = pl::pallas_call(
      kernel, {ShapeDtype({M, N}, DType::F32), ShapeDtype({M, K}, DType::BF16)},
      opts({K / bk},
           {BlockSpec({M, bk}, [](Value k) { return Indices{0, k}; }), BlockSpec({bk, N}, [](Value k) { return Indices{k, 0}; }),
            BlockSpec({M, N}, [](Value) { return Indices{0, 0}; })},
           {BlockSpec({M, N}, [](Value) { return Indices{0, 0}; }), BlockSpec({M, bk}, [](Value k) { return Indices{0, k}; })},
           {ScratchShape{{M, N}, DType::F32, MemorySpace::Vmem}}));
  const Array x = Array::random_normal({M, K}, DType::BF16, 91), y = Array::random_normal({K, N}, DType::BF16, 92);
  const Array w = Array::random_uniform({M, N}, DType::F32, 93, 0.5, 1.0);
  gpu::CodegenOptions one_warpgroup;  // (x's slot takes wgmma's layout only then)
  one_warpgroup.threads_per_cta = 128;
  for (const gpu::CodegenOptions& o : {gpu::CodegenOptions{}, one_warpgroup}) expect_same(call, {x, y, w}, 1e-3, 1e-3, o, {128});
  std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype(), y.shape_dtype(), w.shape_dtype()});
  const gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, one_warpgroup);
  EXPECT_GT(k.register_tiles, 0);
  EXPECT_EQ(k.tensor_core_slots, std::vector<int>{1});  // y's slot; x's stays row-major
  // r = 2 x, by plain C++ (bf16 doubling is exact).
  const std::vector<Array> got =
      gpu::run_host_emulation(*tc, k, {x.clone(), y.clone(), w.clone()}, tc->grid_mapping.grid, k.threads_per_cta);
  const std::vector<double> xs = x.to_doubles(), rs = got[1].to_doubles();
  for (size_t i = 0; i < xs.size(); ++i) ASSERT_EQ(rs[i], 2 * xs[i]) << i;
}

// Blocks of fewer rows than the CTA's 8 warps: a row's columns spread over 8 / m warps (the
// blocked layout's warps_per_row), its reductions the warps' shuffles then their partial results
// through the arena. A row-wise softmax and layer-norm-like kernel over (1, 512), (2, 256) and
// (4, 128) blocks, a column reduction and a total; against plain C++ and the reference
// interpreter.
// Blocks whose rows spread over several warps ((1, 512): P = 8; (6, 128): P = 4 and three bands of
// rows), and blocks whose rows share a warp ((64, 16): two rows a warp, (128, 4): eight; (16, 48):
// three registers of 16 lanes; (32, 8)).
TEST(GpuCodegenOps, PallasCallRowsSpreadOverWarpsOrShareThem) {
  struct Case {
    int64_t m, n;
    int lanes;  // the row reductions' shuffle width
  };
  for (const auto& [m, n, lanes] : std::vector<Case>{
           {1, 512, 32}, {2, 256, 32}, {4, 128, 32}, {6, 128, 32}, {12, 64, 32}, {64, 16, 16}, {128, 4, 4}, {16, 48, 16}, {32, 8, 8}}) {
    SCOPED_TRACE(std::to_string(m) + " x " + std::to_string(n));
    auto kernel = [m = m, n = n](const pl::Ref& x, const pl::Ref& g, const pl::Ref& o, const pl::Ref& cols,
                                 const pl::Ref& total) {
      pl::Value v = x[pl::all];
      pl::Value e = pl::exp(v - pl::broadcast_to(pl::expand_dims(pl::max(v, {1}), {1}), {m, n}));
      pl::Value s = pl::expand_dims(pl::sum(e, {1}), {1});
      o[pl::all] = e / pl::broadcast_to(s, {m, n}) * pl::broadcast_to(g[pl::all], {m, n});
      cols[pl::all] = pl::sum(e, {0});
      total[pl::all] = pl::sum(v, {0, 1});
    };
    const int64_t blocks = 3;
    auto rows = [](Value i) { return Indices{i, 0}; };
    PallasCall call = pl::pallas_call(
        kernel, {ShapeDtype({blocks * m, n}, DType::F32), ShapeDtype({blocks, n}, DType::F32), ShapeDtype({blocks}, DType::F32)},
        opts({blocks}, {BlockSpec({m, n}, rows), BlockSpec()},
             {BlockSpec({m, n}, rows), BlockSpec({pl::squeezed, n}, rows), BlockSpec({pl::squeezed}, [](Value i) { return Indices{i}; })}));
    const Array x = Array::random_normal({blocks * m, n}, DType::F32, 21), g = Array::random_normal({n}, DType::F32, 22);
    expect_same(call, {x, g}, 1e-5, 1e-5);
    std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype(), g.shape_dtype()});
    const gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, {});
    EXPECT_GE(k.register_tiles, 4);  // v, the max, e, s (at least)
    EXPECT_EQ(count_of(k.source, "pl_team_combine<false>(pl_r, " + std::to_string(lanes) + ","), 2);  // max and sum
    const std::vector<Array> got =
        gpu::run_host_emulation(*tc, k, {x.clone(), g.clone()}, tc->grid_mapping.grid, k.threads_per_cta);
    const std::vector<double> xs = x.to_doubles(), gs = g.to_doubles(), os = got[0].to_doubles(), cs = got[1].to_doubles(),
                              ts = got[2].to_doubles();
    for (int64_t b = 0; b < blocks; ++b) {
      std::vector<double> col(static_cast<size_t>(n), 0);
      double total = 0;
      for (int64_t r = b * m; r < (b + 1) * m; ++r) {
        const double* row = &xs[static_cast<size_t>(r * n)];
        const double mx = *std::max_element(row, row + n);
        double sum = 0;
        for (int64_t c = 0; c < n; ++c) sum += std::exp(row[c] - mx), col[c] += std::exp(row[c] - mx), total += row[c];
        for (int64_t c = 0; c < n; ++c)
          ASSERT_NEAR(os[r * n + c], std::exp(row[c] - mx) / sum * gs[c], 1e-5) << r << ", " << c;
      }
      for (int64_t c = 0; c < n; ++c) ASSERT_NEAR(cs[b * n + c], col[c], 1e-4) << b << ", " << c;
      EXPECT_NEAR(ts[b], total, 1e-3) << b;
    }
  }
}

// A layer norm of a matrix product (a fused epilogue): the product is an arena tile, and so its
// row sums; `d = s - mean` reads both, but leads to a reduction (the variance), so it starts a
// blocked register tile after one barrier, and the variance, the scale and the store follow in
// registers. Fewer barriers than the kernel without register tiles; values against plain C++.
TEST(GpuCodegenOps, PallasCallProductsFeedRegisterReductions) {
  const int64_t M = 64, K = 32, N = 128;
  auto kernel = [&](const pl::Ref& x, const pl::Ref& w, const pl::Ref& o) {
    pl::Value s = pl::dot(x[pl::all], w[pl::all]);
    pl::Value mean = pl::sum(s, {1}, true) * (1.0f / N);
    pl::Value d = s - mean;
    pl::Value var = pl::sum(d * d, {1}, true) * (1.0f / N);
    o[pl::all] = d * pl::rsqrt(var + 1e-5f);
  };
  PallasCall call = pl::pallas_call(kernel, ShapeDtype({M, N}, DType::F32), opts({}, {}, {}));
  const Array x = test_util::random_f32({M, K}, 31), w = test_util::random_f32({K, N}, 32);
  expect_same(call, {x, w}, 1e-4, 1e-4);
  std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype(), w.shape_dtype()});
  const gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, {});
  gpu::CodegenOptions in_the_arena;
  in_the_arena.register_tiles = false;
  const gpu::GeneratedKernel a = gpu::generate_cuda(*tc, tc->grid_mapping.grid, in_the_arena);
  EXPECT_GE(k.register_tiles, 3);  // d, d * d (or its fusion), var, the output's loop
  EXPECT_LT(count_of(k.source, "pl_sync();"), count_of(a.source, "pl_sync();"));
  const std::vector<Array> got = gpu::run_host_emulation(*tc, k, {x.clone(), w.clone()}, tc->grid_mapping.grid, k.threads_per_cta);
  const float *xs = x.data<float>(), *ws = w.data<float>(), *os = got[0].data<float>();
  for (int64_t r = 0; r < M; ++r) {
    std::vector<double> row(N, 0.0);
    for (int64_t c = 0; c < N; ++c)
      for (int64_t j = 0; j < K; ++j) row[c] += double{xs[r * K + j]} * ws[j * N + c];
    double mean = 0, var = 0;
    for (double v : row) mean += v / N;
    for (double v : row) var += (v - mean) * (v - mean) / N;
    for (int64_t c = 0; c < N; ++c) ASSERT_NEAR(os[r * N + c], (row[c] - mean) / std::sqrt(var + 1e-5), 1e-3) << r << ", " << c;
  }
}

// A product's f32 result stays in registers, in wgmma's accumulator layout (plan_fragments: a
// register tile made by pl_tc_dot_fragment): attention written as a pallas_call, s = q k^T in
// registers, its row max and sum, p = exp(s - max) and p v with p taken from its registers.
// (64, 64) blocks over 128 and 256 threads (one block: the second warpgroup has none of it, holds
// zeros in its registers and skips only what writes memory), (128, 64) over 128 (two
// blocks a thread in two rounds) and (128, 128) over 256. Against plain C++ from the bf16 inputs,
// and the interpreter.
TEST(GpuCodegenOps, PallasCallProductsStayInRegisters) {
  struct Case {
    int64_t m, n, d;
    int threads;
  };
  for (const Case& c : std::vector<Case>{{64, 64, 64, 128}, {64, 64, 32, 256}, {128, 64, 64, 128}, {128, 128, 64, 256}}) {
    SCOPED_TRACE(std::to_string(c.m) + " x " + std::to_string(c.n) + " x " + std::to_string(c.d) + ", " +
                 std::to_string(c.threads) + " threads");
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    auto kernel = [&](const pl::Ref& q, const pl::Ref& k, const pl::Ref& v, const pl::Ref& o, const pl::Ref& lse) {
      pl::Value s = pl::dot(q[pl::all], k[pl::all], {.trans_b = true, .preferred = DType::F32}) * scale;
      pl::Value mx = pl::max(s, {1}, true);
      pl::Value p = pl::exp(s - mx);
      pl::Value l = pl::sum(p, {1}, true);
      o[pl::all] = pl::dot(p.astype(DType::BF16), v[pl::all], {.preferred = DType::F32}) / l;
      lse[pl::all] = pl::squeeze(mx + pl::log(l), {1});
    };
    PallasCall call = pl::pallas_call(kernel, {ShapeDtype({c.m, c.d}, DType::F32), ShapeDtype({c.m}, DType::F32)},
                                      opts({}, {}, {}));
    const Array q = Array::random_normal({c.m, c.d}, DType::BF16, 41), k = Array::random_normal({c.n, c.d}, DType::BF16, 42),
                v = Array::random_normal({c.n, c.d}, DType::BF16, 43);
    gpu::CodegenOptions o;
    o.threads_per_cta = c.threads;
    expect_same(call, {q, k, v}, 2e-3, 2e-3, o);
    std::shared_ptr<const TracedCall> tc = call.trace({q.shape_dtype(), k.shape_dtype(), v.shape_dtype()});
    const gpu::GeneratedKernel g = gpu::generate_cuda(*tc, tc->grid_mapping.grid, o);
    EXPECT_EQ(g.register_dots, 2);  // s, and p v (o's store reads it in its registers)
    // p v takes p from its registers: one warpgroup, or blocks as wide as p and the result.
    EXPECT_EQ(g.register_a_products, 1);
    EXPECT_EQ(count_of(g.source, "pl_tc_dot_fragment<"), g.register_dots);
    // (A skip per op leaves each register tile defined on one side of a branch: ptxas took 171
    // registers for the (64, 64) case at 256 threads so, 82 without.)
    EXPECT_EQ(register_writes_a_warpgroup_skips(g.source), std::vector<std::string>{});
    if (c.m == 64 && c.threads == 256) {
      EXPECT_CONTAINS(g.source, "if (pl_blk >= 1) continue;");  // (o's, lse's stores)
    }
    const std::vector<Array> got = gpu::run_host_emulation(*tc, g, {q.clone(), k.clone(), v.clone()}, tc->grid_mapping.grid,
                                                           g.threads_per_cta);
    const std::vector<double> qs = q.to_doubles(), ks = k.to_doubles(), vs = v.to_doubles();
    for (int64_t r = 0; r < c.m; ++r) {
      std::vector<double> s(static_cast<size_t>(c.n));
      double mx = -INFINITY, l = 0;
      for (int64_t j = 0; j < c.n; ++j) {
        for (int64_t e = 0; e < c.d; ++e) s[j] += qs[r * c.d + e] * ks[j * c.d + e];
        s[j] *= scale, mx = std::max(mx, s[j]);
      }
      for (double& x : s) x = std::exp(x - mx), l += x;
      ASSERT_NEAR(got[1].get_flat(r), mx + std::log(l), 1e-3) << r;
      for (int64_t e = 0; e < c.d; ++e) {
        double want = 0;
        for (int64_t j = 0; j < c.n; ++j) want += s[j] * vs[j * c.d + e];
        ASSERT_NEAR(got[0].get_flat(r * c.d + e), want / l, 2e-2) << r << ", " << e;  // (p rounded to bf16)
      }
    }
  }
}

// Scans along a blocked tile's rows in registers: each register's T lanes by a butterfly, the
// earlier registers' carry added (a reverse scan from the last register, its higher lanes first).
// cumsum, cummax and cumprod (of values near 1), and a reverse cumsum and cummin, over blocks of
// one row a warp, two ((64, 16)), three registers a row ((16, 48)); a (2, 256) block (a row over
// four warps) takes the arena's code. Against plain C++.
TEST(GpuCodegenOps, PallasCallScansOfRegisterTiles) {
  for (const auto& [m, n] : std::vector<std::pair<int64_t, int64_t>>{{8, 64}, {64, 16}, {16, 48}, {2, 256}}) {
    SCOPED_TRACE(std::to_string(m) + " x " + std::to_string(n));
    auto kernel = [](const pl::Ref& x, const pl::Ref& sum, const pl::Ref& mx, const pl::Ref& prod, const pl::Ref& rev,
                     const pl::Ref& rev_min) {
      pl::Value v = x[pl::all];
      sum[pl::all] = pl::cumsum(v, 1) * 0.5f;
      mx[pl::all] = pl::cummax(v, 1);
      prod[pl::all] = pl::cumprod(v * 0.01f + 1.0f, 1);
      rev[pl::all] = pl::cumsum(v, 1, /*reverse=*/true);
      rev_min[pl::all] = pl::cummin(v, 1, /*reverse=*/true);
    };
    const ShapeDtype t({m, n}, DType::F32);
    PallasCall call = pl::pallas_call(kernel, {t, t, t, t, t}, opts({}, {}, {}));
    const Array x = test_util::random_f32({m, n}, static_cast<uint32_t>(m * n));
    expect_same(call, {x}, 1e-5, 1e-5);
    std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype()});
    const gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, {});
    EXPECT_EQ(count_of(k.source, "pl_carry = pl_comb(pl_carry, pl_total)"), m == 2 ? 0 : 5);
    EXPECT_EQ(count_of(k.source, "if (!(pl_tid() & pl_m)) pl_before"), m == 2 ? 0 : 2);  // (the reverse scans')
    const std::vector<Array> got = gpu::run_host_emulation(*tc, k, {x.clone()}, tc->grid_mapping.grid,
                                                           k.register_tiles ? k.threads_per_cta : 3);
    const float* xs = x.data<float>();
    for (int64_t r = 0; r < m; ++r) {
      double s = 0, p = 1, mxv = -INFINITY, rs = 0, rmin = INFINITY;
      for (int64_t c = 0; c < n; ++c) {
        const int64_t e = r * n + c;
        s += xs[e], p *= xs[e] * 0.01 + 1, mxv = std::max<double>(mxv, xs[e]);
        ASSERT_NEAR(got[0].data<float>()[e], s * 0.5, 1e-4) << r << ", " << c;
        ASSERT_EQ(got[1].data<float>()[e], static_cast<float>(mxv)) << r << ", " << c;
        ASSERT_NEAR(got[2].data<float>()[e], p, 1e-4) << r << ", " << c;
      }
      for (int64_t c = n; c-- > 0;) {
        rs += xs[r * n + c], rmin = std::min<double>(rmin, xs[r * n + c]);
        ASSERT_NEAR(got[3].data<float>()[r * n + c], rs, 1e-4) << r << ", " << c;
        ASSERT_EQ(got[4].data<float>()[r * n + c], static_cast<float>(rmin)) << r << ", " << c;
      }
    }
  }
}

// A reversal of a blocked tile's columns reads its registers where each row lies in one warp: a
// shuffle within the row's T lanes (lane t ^ (T - 1)), the registers in reverse order. Blocks of
// one row a warp ((8, 64): T 32, two registers a row), two ((64, 16)), three registers a row
// ((16, 48)), an (n) value broadcast along the block's rows (the columns layout, every warp
// alike); a (2, 256) block (a row over four warps) reverses in the arena. Against plain C++.
TEST(GpuCodegenOps, PallasCallColumnReversalsStayInRegisters) {
  for (const auto& [m, n] : std::vector<std::pair<int64_t, int64_t>>{{8, 64}, {64, 16}, {16, 48}, {2, 256}}) {
    SCOPED_TRACE(std::to_string(m) + " x " + std::to_string(n));
    auto kernel = [m, n](const pl::Ref& x, const pl::Ref& y, const pl::Ref& o, const pl::Ref& r, const pl::Ref& z) {
      pl::Value v = x[pl::all];
      pl::Value flipped = pl::rev(v, {1});
      o[pl::all] = flipped * 2.0f + v;  // (in registers)
      r[pl::all] = pl::rev(v * 0.5f, {1});  // (stored from registers)
      z[pl::all] = v * pl::broadcast_to(pl::rev(y[pl::all], {0}), {m, n});
    };
    PallasCall call = pl::pallas_call(
        kernel, {ShapeDtype({m, n}, DType::F32), ShapeDtype({m, n}, DType::F32), ShapeDtype({m, n}, DType::F32)},
        opts({}, {}, {}));
    const Array x = Array::random_normal({m, n}, DType::F32, 51), y = Array::random_normal({n}, DType::F32, 52);
    const gpu::GeneratedKernel k = expect_same(call, {x, y}, 1e-6, 1e-6);
    std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype(), y.shape_dtype()});
    const std::string point = grid_point_function(k.source);
    if (m != 2) {
      EXPECT_EQ(count_of(point, "float* v"), 0) << point;  // no arena tile
    }
    EXPECT_EQ(count_of(point, "] = pl_shfl_xor("), m == 2 ? 0 : 3) << point;
    const std::vector<Array> got = gpu::run_host_emulation(*tc, k, {x.clone(), y.clone()}, tc->grid_mapping.grid, k.threads_per_cta);
    const std::vector<double> xs = x.to_doubles(), ys = y.to_doubles();
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const double flipped = xs[static_cast<size_t>(i * n + n - 1 - j)];
        ASSERT_NEAR(got[0].get_flat(i * n + j), flipped * 2 + xs[static_cast<size_t>(i * n + j)], 1e-5) << i << ", " << j;
        ASSERT_EQ(got[1].get_flat(i * n + j), flipped * 0.5) << i << ", " << j;
        ASSERT_NEAR(got[2].get_flat(i * n + j), xs[static_cast<size_t>(i * n + j)] * ys[static_cast<size_t>(n - 1 - j)], 1e-6)
            << i << ", " << j;
      }
  }
}

// An elementwise op reading an arena tile (here a reversal's) starts a register tile when a
// forward row scan takes its result, as when a reduction does: the scan runs on the registers
// (shuffles) instead of writing the op's tile to the arena and scanning it there. Against plain C++.
TEST(GpuCodegenOps, PallasCallScansStartRegisterTilesAtArenaReads) {
  const int64_t m = 16, n = 64;
  auto kernel = [](const pl::Ref& x, const pl::Ref& o) {
    pl::Value t = pl::rev(x[pl::all], {0});  // (an arena tile: rows of other warps)
    o[pl::all] = pl::cumsum(t * 2.0f + 1.0f, 1);
  };
  PallasCall call = pl::pallas_call(kernel, ShapeDtype({m, n}, DType::F32), opts({}, {}, {}));
  const Array x = test_util::random_f32({m, n}, 29);
  expect_same(call, {x}, 1e-5, 1e-5);
  std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype()});
  const gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, {});
  EXPECT_EQ(count_of(k.source, "pl_carry = pl_comb(pl_carry, pl_total)"), 1);  // (the register scan's)
  const Array got = gpu::run_host_emulation(*tc, k, {x.clone()}, tc->grid_mapping.grid, k.threads_per_cta).at(0);
  const float* xs = x.data<float>();
  for (int64_t r = 0; r < m; ++r) {
    double s = 0;
    for (int64_t c = 0; c < n; ++c) {
      s += xs[(m - 1 - r) * n + c] * 2.0 + 1.0;
      ASSERT_NEAR(got.data<float>()[r * n + c], s, 1e-4) << r << ", " << c;
    }
  }
}

// Attention over one block: p = exp(s - max s) is read by its row sums (in registers) and by the
// product p v (as a tile). p keeps its registers and gets a copy in the arena for the product
// (Triton's convert_layout) instead of going to the arena wholly. Against plain C++.
TEST(GpuCodegenOps, PallasCallRegisterTilesKeepAnArenaCopyForOtherUses) {
  const int64_t M = 32, N = 64, D = 32;
  auto kernel = [&](const pl::Ref& q, const pl::Ref& k, const pl::Ref& v, const pl::Ref& o) {
    pl::Value s = pl::dot(q[pl::all], k[pl::all], {.trans_b = true});
    pl::Value p = pl::exp(s - pl::max(s, {1}, true));
    o[pl::all] = pl::dot(p, v[pl::all]) / pl::sum(p, {1}, true);
  };
  PallasCall call = pl::pallas_call(kernel, ShapeDtype({M, D}, DType::F32), opts({}, {}, {}));
  const Array q = test_util::random_f32({M, D}, 51), k = test_util::random_f32({N, D}, 52), v = test_util::random_f32({N, D}, 53);
  expect_same(call, {q, k, v}, 1e-4, 1e-5);
  std::shared_ptr<const TracedCall> tc = call.trace({q.shape_dtype(), k.shape_dtype(), v.shape_dtype()});
  const gpu::GeneratedKernel g = gpu::generate_cuda(*tc, tc->grid_mapping.grid, {});
  EXPECT_GE(g.register_tiles, 2);                   // p, its row sums
  EXPECT_EQ(count_of(g.source, "its copy in the arena"), 1);  // p's, for p v
  const std::vector<Array> got = gpu::run_host_emulation(*tc, g, {q.clone(), k.clone(), v.clone()}, tc->grid_mapping.grid,
                                                         g.threads_per_cta);
  const float *qs = q.data<float>(), *ks = k.data<float>(), *vs = v.data<float>(), *os = got[0].data<float>();
  for (int64_t r = 0; r < M; ++r) {
    std::vector<double> e(N);
    double mx = -INFINITY, sum = 0;
    for (int64_t c = 0; c < N; ++c) {
      e[c] = 0;
      for (int64_t j = 0; j < D; ++j) e[c] += double{qs[r * D + j]} * ks[c * D + j];
      mx = std::max(mx, e[c]);
    }
    for (double& x : e) x = std::exp(x - mx), sum += x;
    for (int64_t j = 0; j < D; ++j) {
      double want = 0;
      for (int64_t c = 0; c < N; ++c) want += e[c] * vs[c * D + j];
      ASSERT_NEAR(os[r * D + j], want / sum, 1e-4) << r << ", " << j;
    }
  }
}

// argmax / argmin of a blocked tile's rows and columns in registers: the candidates carry their
// column (row) through the shuffles and the warps' arena scratch. Values are small integers (many
// ties: the first index wins) and some NaNs (the first NaN wins), over blocks whose rows take a
// warp, spread over several, or share one.
TEST(GpuCodegenOps, PallasCallArgmaxOfRegisterTiles) {
  for (const auto& [m, n] : std::vector<std::pair<int64_t, int64_t>>{{8, 64}, {1, 512}, {64, 16}, {6, 128}}) {
    SCOPED_TRACE(std::to_string(m) + " x " + std::to_string(n));
    auto kernel = [](const pl::Ref& x, const pl::Ref& row_max, const pl::Ref& col_min, const pl::Ref& y) {
      pl::Value v = x[pl::all] * 2.0f;
      row_max[pl::all] = pl::argmax(v, 1);
      col_min[pl::all] = pl::argmin(v, 0);
      y[pl::all] = v + 1.0f;  // (v stays a register tile)
    };
    PallasCall call = pl::pallas_call(kernel,
                                      {ShapeDtype({m}, DType::I32), ShapeDtype({n}, DType::I32), ShapeDtype({m, n}, DType::F32)},
                                      opts({}, {}, {}));
    Array x = Array::zeros({m, n}, DType::F32);
    std::mt19937 rng(static_cast<uint32_t>(m * 1000 + n));
    float* xs = x.data<float>();
    for (int64_t i = 0; i < m * n; ++i) xs[i] = static_cast<float>(rng() % 7) - 3.0f;
    for (int64_t i = 0; i < m * n; i += 37) xs[(i * 13) % (m * n)] = rng() % 3 == 0 ? NAN : xs[(i * 13) % (m * n)];
    expect_same(call, {x});
    std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype()});
    const gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, {});
    EXPECT_GE(k.register_tiles, 3);  // v and both results
    EXPECT_EQ(count_of(k.source, "pl_arg_better<"), 2);
    EXPECT_EQ(count_of(k.source, "pl_team_combine<false>(pl_r, "), 1);  // the rows' shuffles
    const std::vector<Array> got = gpu::run_host_emulation(*tc, k, {x.clone()}, tc->grid_mapping.grid, k.threads_per_cta);
    // The first maximum of each row and minimum of each column, a NaN first of all.
    auto better = [](float a, float b, bool max) { return std::isnan(a) ? !std::isnan(b) : !std::isnan(b) && (max ? a > b : a < b); };
    for (int64_t r = 0; r < m; ++r) {
      int64_t best = 0;
      for (int64_t c = 1; c < n; ++c)
        if (better(xs[r * n + c], xs[r * n + best], true)) best = c;
      EXPECT_EQ(got[0].data<int32_t>()[r], best) << "row " << r;
    }
    for (int64_t c = 0; c < n; ++c) {
      int64_t best = 0;
      for (int64_t r = 1; r < m; ++r)
        if (better(xs[r * n + c], xs[best * n + c], false)) best = r;
      EXPECT_EQ(got[1].data<int32_t>()[c], best) << "column " << c;
    }
  }
}

// A second helper review's probes: a (1, 512) tile reshaped and broadcast along an (8, 512) one
// (a conflict two broadcasts deep: it hit an internal check), a (1, n) gamma block broadcast along
// a tile (its columns layout: the tile stays in registers), and a softmax scaled by a broadcast
// scalar (not an arena read: the values stay in registers).
TEST(GpuCodegenOps, PallasCallRegisterTilesSettleLayoutConflicts) {
  auto twouse = [](const pl::Ref& x, const pl::Ref& y, const pl::Ref& o, const pl::Ref& o2) {
    pl::Value a = x[pl::all];
    o[pl::all] = a * 2.0f;
    o2[pl::all] = y[pl::all] * pl::broadcast_to(pl::reshape(a, {512}), {8, 512});
  };
  expect_same(pl::pallas_call(twouse, {ShapeDtype({1, 512}, DType::F32), ShapeDtype({8, 512}, DType::F32)}, opts({}, {}, {})),
              {Array::random_normal({1, 512}, DType::F32, 2), Array::random_normal({8, 512}, DType::F32, 3)});
  auto tiles_of = [](const PallasCall& c, const std::vector<Array>& args) {
    std::vector<ShapeDtype> sig;
    for (const Array& a : args) sig.push_back(a.shape_dtype());
    std::shared_ptr<const TracedCall> tc = c.trace(sig);
    return gpu::generate_cuda(*tc, tc->grid_mapping.grid, {}).register_tiles;
  };
  auto gamma = [](const pl::Ref& x, const pl::Ref& g, const pl::Ref& o) {
    pl::Value v = x[pl::all];
    o[pl::all] = (v - pl::broadcast_to(pl::expand_dims(pl::max(v, {1}), {1}), {8, 256})) * pl::broadcast_to(g[pl::all], {8, 256});
  };
  PallasCall gamma_call = pl::pallas_call(gamma, ShapeDtype({8, 256}, DType::F32), opts({}, {}, {}));
  const std::vector<Array> gamma_args{Array::random_normal({8, 256}, DType::F32, 1), Array::random_normal({1, 256}, DType::F32, 2)};
  expect_same(gamma_call, gamma_args);
  EXPECT_EQ(tiles_of(gamma_call, gamma_args), 3);  // v, its maxima, g
  auto scaled = [](const pl::Ref& x, const pl::Ref& o) {
    pl::Value s = pl::convert(pl::program_id(0) + 2, DType::F32);
    pl::Value v = x[pl::all] * pl::broadcast_to(s, {8, 256});
    pl::Value e = pl::exp(v - pl::broadcast_to(pl::expand_dims(pl::max(v, {1}), {1}), {8, 256}));
    o[pl::all] = e / pl::broadcast_to(pl::expand_dims(pl::sum(e, {1}), {1}), {8, 256});
  };
  auto at0 = [](Value) { return Indices{0, 0}; };
  PallasCall scaled_call = pl::pallas_call(scaled, ShapeDtype({8, 256}, DType::F32),
                                           opts({1}, {BlockSpec({8, 256}, at0)}, {BlockSpec({8, 256}, at0)}));
  const std::vector<Array> scaled_args{Array::random_normal({8, 256}, DType::F32, 4)};
  expect_same(scaled_call, scaled_args, 1e-6, 1e-7);
  EXPECT_EQ(tiles_of(scaled_call, scaled_args), 4);  // v, its maxima, e, its sums
}

// Where a use cannot read the blocked layout (a slice, a transpose), the value is a tile in the
// arena, written by the registers' layout where an op reading register tiles makes it (then a
// barrier), and the rest stays in registers. Rows of 8 rows over 8 warps: one each; a block 20
// columns wide (not a multiple of 32): the arena only.
TEST(GpuCodegenOps, PallasCallBlocksLeaveRegistersForOtherUses) {
  auto kernel = [](const pl::Ref& x, const pl::Ref& y, const pl::Ref& o, const pl::Ref& cols, const pl::Ref& t,
                   const pl::Ref& z) {
    pl::Value v = x[pl::all];                       // (8, 32) i32: a register tile
    pl::Value w = v * 3 - pl::broadcast_to(pl::expand_dims(pl::max(v, {1}), {1}), {8, 32});
    o[pl::all] = w + 1;                             // in registers
    cols[pl::all] = pl::sum(pl::slice(w, {0, 0}, {8, 32}, {2, 1}), {0}) + pl::sum(w, {0});  // w's copy in the arena
    t[pl::all] = pl::transpose(v + 1, {1, 0});      // (v + 1) read at other indices: a tile
    pl::Value u = y[pl::all];                       // (24, 20): no blocked layout
    z[pl::all] = u - pl::broadcast_to(pl::expand_dims(pl::min(u, {1}), {1}), {24, 20});
  };
  PallasCall call = pl::pallas_call(kernel,
                                    {ShapeDtype({8, 32}, DType::I32), ShapeDtype({32}, DType::I32),
                                     ShapeDtype({32, 8}, DType::I32), ShapeDtype({24, 20}, DType::I32)},
                                    opts({}, {}, {}));
  const Array x = Array::random_normal({8, 32}, DType::I32, 7, 0, 100);
  const Array y = Array::random_normal({24, 20}, DType::I32, 8, 0, 100);
  expect_same(call, {x, y}, 0, 0, {}, {1, 3});
  std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype(), y.shape_dtype()});
  const gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, {});
  EXPECT_GE(k.register_tiles, 2);  // v, max(v)
  EXPECT_EQ(count_of(k.source, "its copy in the arena"), 1);  // w's, for the slice
  // Independent of the interpreter: o = 3 x - rowmax + 1 (w + 1), cols the column sums of w's even
  // rows and of all its rows, t.
  const std::vector<Array> got = gpu::run_host_emulation(*tc, k, {x.clone(), y.clone()}, tc->grid_mapping.grid, 256);
  const std::vector<double> xs = x.to_doubles(), os = got[0].to_doubles(), cs = got[1].to_doubles(), ts = got[2].to_doubles();
  std::vector<double> col(32, 0);
  for (int64_t r = 0; r < 8; ++r) {
    double mx = xs[r * 32];
    for (int64_t c = 0; c < 32; ++c) mx = std::max(mx, xs[r * 32 + c]);
    for (int64_t c = 0; c < 32; ++c) {
      EXPECT_EQ(os[r * 32 + c], 3 * xs[r * 32 + c] - mx + 1);
      EXPECT_EQ(ts[c * 8 + r], xs[r * 32 + c] + 1);
      col[c] += (3 * xs[r * 32 + c] - mx) * (r % 2 == 0 ? 2 : 1);
    }
  }
  for (int64_t c = 0; c < 32; ++c) EXPECT_EQ(cs[c], col[c]) << c;
}

TEST(GpuCodegenOps, ShapeOps) {
  auto kernel = [](const pl::Ref& x, const pl::Ref& i, const pl::Ref& o1, const pl::Ref& o2, const pl::Ref& o3) {
    pl::Value v = x[pl::all];  // (8, 12)
    pl::Value t = pl::transpose(v, {1, 0});                      // (12, 8)
    pl::Value r = pl::reshape(t, {4, 24});
    pl::Value s = pl::slice(v, {1, 2}, {7, 12}, {2, 3});         // (3, 4)
    pl::Value d = pl::dynamic_slice(v, {i[0], i[1]}, {3, 4});    // clamped starts
    o1[pl::all] = pl::concatenate({r, pl::rev(r, {0, 1})}, 0);   // (8, 24)
    o2[pl::all] = s * d + pl::broadcast_to(pl::expand_dims(pl::sum(s, {1}), {1}), {3, 4}) +
                  pl::iota(DType::F32, {3, 4}, 1);
    o3[pl::all] = pl::squeeze(pl::reshape(v, {1, 96}), {0}) + pl::bitcast(pl::bitcast(pl::reshape(v, {96}), DType::I32), DType::F32);
  };
  for (int start : {0, 3, 100, -5}) {
    SCOPED_TRACE(start);
    PallasCall call = pl::pallas_call(kernel, {ShapeDtype({8, 24}, DType::F32), ShapeDtype({3, 4}, DType::F32), ShapeDtype({96}, DType::F32)},
                                      opts({}, {BlockSpec(), BlockSpec(MemorySpace::Smem)}, {}));
    Array idx = Array::full({2}, DType::I32, 0);
    idx.data<int32_t>()[0] = start;
    idx.data<int32_t>()[1] = start + 1;
    expect_same(call, {Array::random_normal({8, 12}, DType::F32, 8), idx});
  }
}

TEST(GpuCodegenOps, DotGeneralLayoutsAndDtypes) {
  for (DType dt : {DType::F32, DType::BF16, DType::I32}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    auto kernel = [dt](const pl::Ref& x, const pl::Ref& y, const pl::Ref& o, const pl::Ref& ob) {
      DType acc = dt == DType::I32 ? DType::I32 : DType::F32;
      o[pl::all] = pl::dot(x[pl::all], y[pl::all], {.preferred = acc});
      // Batched, contracting lhs dim 1 with rhs dim 1 (x^T-style layouts).
      pl::Value xb = pl::reshape(x[pl::all], {2, 8, 16});
      pl::Value yb = pl::reshape(pl::transpose(y[pl::all], {1, 0}), {2, 6, 16});
      ob[pl::all] = pl::dot_general(xb, yb, pl::DotDims{{2}, {2}, {0}, {0}}, acc);
    };
    DType out = dt == DType::I32 ? DType::I32 : DType::F32;
    PallasCall call = pl::pallas_call(kernel, {ShapeDtype({16, 12}, out), ShapeDtype({2, 8, 6}, out)}, opts({}, {}, {}));
    double sd = dt == DType::I32 ? 20 : 1;
    expect_same(call, {Array::random_normal({16, 16}, dt, 9, 0, sd), Array::random_normal({16, 12}, dt, 10, 0, sd)},
                dt == DType::I32 ? 0 : 1e-5, dt == DType::I32 ? 0 : 1e-5);
  }
}

// Every element of `got` (M x N) against a double-precision C++ product of x (M x K) and y (K x N,
// or N x K when b_nk): f32 accumulation of exact products in any order, then the result's rounding.
void expect_plain_product(const Array& x, const Array& y, bool b_nk, DType out, const Array& got) {
  const int64_t M = x.shape()[0], K = x.shape()[1], N = got.shape()[1];
  int bad = 0;
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double want = 0, magnitude = 0;
      for (int64_t kk = 0; kk < K; ++kk) {
        const double t = x.get({i, kk}) * (b_nk ? y.get({j, kk}) : y.get({kk, j}));
        want += t;
        magnitude += std::fabs(t);
      }
      const double tol = static_cast<double>(K) * std::ldexp(magnitude, -23) +
                         (out == DType::BF16 ? std::ldexp(std::fabs(want), -8) : 0);
      const double v = got.get({i, j});
      if (!(std::fabs(v - want) <= tol) && bad++ < 5)
        ADD_FAILURE() << "element (" << i << ", " << j << "): got " << v << ", want " << want << " within " << tol;
    }
  }
}

// A pallas_call of one product: o = x . y, or x . y^T (dot_general contracting the rhs's dim 1).
PallasCall tensor_core_product(DType out, bool b_nk, int64_t M, int64_t N) {
  auto kernel = [out, b_nk](const pl::Ref& x, const pl::Ref& y, const pl::Ref& o) {
    o[pl::all] = b_nk ? pl::dot_general(x[pl::all], y[pl::all], pl::DotDims{{1}, {1}, {}, {}}, out)
                      : pl::dot(x[pl::all], y[pl::all], {.preferred = out});
  };
  return pl::pallas_call(kernel, {ShapeDtype({M, N}, out)}, opts({}, {}, {}));
}

// bf16 / f16 matrix products go to the tensor cores (mma.sync.m16n8k16 fed by ldmatrix; host
// emulation executes both from their PTX definitions, lane by lane). Checked against a plain C++
// product of the same inputs, for both rhs layouts, f32 and bf16 results, and warp counts that
// split the 16x8 blocks evenly and unevenly, fragments through ldmatrix (shared memory) and
// straight from global memory; the emulator's count of mma instructions shows the tensor-core
// path ran (and that 4 threads, not a whole warp, fall back to the CUDA-core loop).
TEST(GpuCodegenOps, TensorCoreDotsMatchThePlainProduct) {
  const int64_t M = 32, N = 24, K = 48;
  struct Case { DType in, out; bool b_nk; };
  for (Case c : {Case{DType::BF16, DType::F32, false}, Case{DType::BF16, DType::BF16, true},
                 Case{DType::F16, DType::F32, true}, Case{DType::F16, DType::BF16, false}}) {
    SCOPED_TRACE(std::string(dtype_name(c.in)) + " -> " + std::string(dtype_name(c.out)) +
                 (c.b_nk ? ", rhs n x k" : ", rhs k x n"));
    PallasCall call = tensor_core_product(c.out, c.b_nk, M, N);
    const Array x = Array::random_normal({M, K}, c.in, 21);
    const Array y = c.b_nk ? Array::random_normal({N, K}, c.in, 22) : Array::random_normal({K, N}, c.in, 22);
    std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype(), y.shape_dtype()});
    const std::vector<int64_t> grid = tc->grid_mapping.grid;
    // 96 threads: 3 warps share the 6 blocks evenly; 128: the second round has 2 idle warps.
    // With the arena in global memory the fragments load without ldmatrix.
    struct Run { bool arena_in_shared; int threads; };
    for (Run run : {Run{true, 4}, Run{true, 96}, Run{true, 128}, Run{false, 96}}) {
      const int threads = run.threads;
      SCOPED_TRACE(std::to_string(threads) + " threads, arena in " + (run.arena_in_shared ? "shared" : "global") + " memory");
      gpu::CodegenOptions options;
      if (!run.arena_in_shared) options.max_shared_arena_bytes = 0;
      gpu::GeneratedKernel k = gpu::generate_cuda(*tc, grid, options);
      EXPECT_EQ(k.tensor_core_dots, 1);
      EXPECT_EQ(k.arena_in_shared, run.arena_in_shared);
      gpu::HostEmulationStats stats;
      std::vector<Array> got = gpu::run_host_emulation(*tc, k, {x, y}, grid, threads, &stats);
      const int64_t warps = threads / 32, blocks = (M / 16) * (N / 8);
      EXPECT_EQ(stats.mma_instructions, warps == 0 ? 0 : (blocks + warps - 1) / warps * warps * (K / 16));
      EXPECT_EQ(stats.wgmma_instructions, 0);  // m = 32: not a wgmma shape
      expect_plain_product(x, y, c.b_nk, c.out, got[0]);
    }
  }
}

// With whole warpgroups the same products run on wgmma (sm_90a): each warpgroup stages its 64-row
// slice of x and its slice of y in the instruction's shared-memory layout and issues m64nNk16
// operations on descriptors; host emulation executes them from the descriptors. Shapes cover
// each instruction width the runtime picks (N = 24 -> n8, 64 -> n64, 256 -> n128), a K that
// leaves a 16-column last stage, one and two warpgroups (with an idle one redoing a block), both
// rhs layouts, bf16 and f16 into f32 and bf16, and operands in shared and in global memory.
TEST(GpuCodegenOps, TensorCoreDotsRunOnWgmmaWithWholeWarpgroups) {
  struct Case { DType in, out; bool b_nk; int64_t M, N, K; int threads; bool arena_in_shared; };
  for (Case c : {Case{DType::BF16, DType::F32, false, 64, 24, 48, 128, true},
                 Case{DType::F16, DType::BF16, true, 128, 64, 32, 256, true},
                 Case{DType::BF16, DType::F32, true, 192, 256, 16, 256, false},
                 Case{DType::F16, DType::F32, false, 192, 32, 80, 256, true}}) {
    SCOPED_TRACE(std::string(dtype_name(c.in)) + " -> " + std::string(dtype_name(c.out)) + (c.b_nk ? ", rhs n x k" : ", rhs k x n") +
                 ", " + std::to_string(c.M) + "x" + std::to_string(c.N) + "x" + std::to_string(c.K) + ", " +
                 std::to_string(c.threads) + " threads");
    PallasCall call = tensor_core_product(c.out, c.b_nk, c.M, c.N);
    const Array x = Array::random_normal({c.M, c.K}, c.in, 31);
    const Array y = c.b_nk ? Array::random_normal({c.N, c.K}, c.in, 32) : Array::random_normal({c.K, c.N}, c.in, 32);
    std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype(), y.shape_dtype()});
    gpu::CodegenOptions options;
    options.threads_per_cta = c.threads;
    if (!c.arena_in_shared) options.max_shared_arena_bytes = 64 * 1024;  // room for the staging only
    gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, options);
    EXPECT_EQ(k.arena_in_shared, c.arena_in_shared);
    EXPECT_EQ(k.wgmma_staging_bytes, c.threads / 128 * gpu::wgmma_stage_bytes());
    gpu::HostEmulationStats stats;
    std::vector<Array> got = gpu::run_host_emulation(*tc, k, {x, y}, tc->grid_mapping.grid, c.threads, &stats);
    const int64_t nc = c.N % 128 == 0 ? 128 : c.N % 64 == 0 ? 64 : c.N % 32 == 0 ? 32 : c.N % 16 == 0 ? 16 : 8;
    const int64_t blocks = c.M / 64 * (c.N / nc), groups = c.threads / 128;
    EXPECT_EQ(stats.wgmma_instructions, (blocks + groups - 1) / groups * groups * (c.K / 16));
    EXPECT_EQ(stats.mma_instructions, 0);
    expect_plain_product(x, y, c.b_nk, c.out, got[0]);
  }
}

// The tensor-core path is real PTX for the GPUs: ptxas accepts it for Hopper and Ampere (cubins),
// the PTX for sm_80 has the ldmatrix and mma.sync instructions, and sm_75 (no bf16 mma.sync)
// compiles the CUDA-core loop alone.
TEST(GpuCodegenOps, TensorCoreDotsCompileWithNvrtc) {
  if (std::string why = gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  auto kernel = [](const pl::Ref& x, const pl::Ref& y, const pl::Ref& o, const pl::Ref& o2) {
    o[pl::all] = pl::dot(x[pl::all], y[pl::all], {.preferred = DType::F32});
    o2[pl::all] = pl::dot_general(x[pl::all], pl::transpose(y[pl::all], {1, 0}), pl::DotDims{{1}, {1}, {}, {}}, DType::BF16);
  };
  PallasCall call = pl::pallas_call(kernel, {ShapeDtype({64, 16}, DType::F32), ShapeDtype({64, 16}, DType::BF16)}, opts({}, {}, {}));
  std::shared_ptr<const TracedCall> tc = call.trace({ShapeDtype({64, 64}, DType::BF16), ShapeDtype({64, 16}, DType::BF16)});
  gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid);
  EXPECT_EQ(k.tensor_core_dots, 2);
  const gpu::Nvrtc& nvrtc = gpu::Nvrtc::get();
  for (const char* arch : {"sm_90a", "sm_80"}) EXPECT_TRUE(nvrtc.compile(k.source, "mma.cu", arch).is_cubin) << arch;
  auto ptx = [&](const char* arch) {
    gpu::CompiledKernel c = nvrtc.compile(k.source, "mma.cu", arch);
    return std::string(c.image.begin(), c.image.end());
  };
  const std::string ampere = ptx("compute_80"), turing = ptx("compute_75");
  EXPECT_CONTAINS(ampere, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32");
  EXPECT_CONTAINS(ampere, "ldmatrix.sync.aligned.m8n8.x4.shared.b16");
  EXPECT_CONTAINS(ampere, "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16");  // rhs k x n
  EXPECT_CONTAINS(ampere, "ldmatrix.sync.aligned.m8n8.x2.shared.b16");        // rhs n x k
  EXPECT_EQ(turing.find("mma.sync"), std::string::npos);
  // Hopper's PTX also has the wgmma path (n = 16 for these 16-wide results); Ampere's not.
  const std::string hopper = ptx("compute_90a");
  EXPECT_CONTAINS(hopper, "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16");
  EXPECT_CONTAINS(hopper, "fence.proxy.async.shared::cta");
  EXPECT_EQ(ampere.find("wgmma"), std::string::npos);
}

// The staging needs room beside the arena under the CTA's shared-memory limit; without it the
// kernel keeps mma.sync on Hopper too (same results). Launches ask for the staging after the
// arena only on sm_90 devices.
TEST(GpuCodegenOps, WgmmaStagingNeedsRoomBesideTheArena) {
  PallasCall call = tensor_core_product(DType::F32, false, 64, 32);
  const Array x = Array::random_normal({64, 32}, DType::BF16, 41), y = Array::random_normal({32, 32}, DType::BF16, 42);
  std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype(), y.shape_dtype()});
  gpu::GeneratedKernel roomy = gpu::generate_cuda(*tc, tc->grid_mapping.grid);
  ASSERT_TRUE(roomy.arena_in_shared);
  const int64_t offset = (roomy.arena_bytes + 127) / 128 * 128, staging = 2 * gpu::wgmma_stage_bytes();
  EXPECT_EQ(roomy.wgmma_staging_bytes, staging);  // 256 threads: two warpgroups
  EXPECT_EQ(roomy.dynamic_shared_bytes(true), offset + staging);
  EXPECT_EQ(roomy.dynamic_shared_bytes(false), roomy.arena_bytes);
  gpu::CodegenOptions tight;
  tight.max_shared_bytes = offset + staging - 1;
  gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, tight);
  EXPECT_TRUE(k.arena_in_shared);
  EXPECT_EQ(k.wgmma_staging_bytes, 0);
  EXPECT_EQ(k.dynamic_shared_bytes(true), k.arena_bytes);
  EXPECT_EQ(k.source.find("#define PL_WGMMA_STAGES"), std::string::npos);
  gpu::HostEmulationStats stats;
  // (Its threads: the product is a register tile laid out over them; mma.sync computes it in the
  // arena, which they read.)
  std::vector<Array> got = gpu::run_host_emulation(*tc, k, {x, y}, tc->grid_mapping.grid, k.threads_per_cta, &stats);
  EXPECT_EQ(stats.wgmma_instructions, 0);
  EXPECT_EQ(stats.mma_instructions, (4 * 4 + 7) / 8 * 8 * 2);  // 16 blocks of 16x8 over 8 warps, 2 k-steps
  expect_plain_product(x, y, false, DType::F32, got[0]);
}

// The machine code: NVRTC's sm_90a cubin of a bf16 matmul has HGMMA (wgmma) instructions, its
// sm_80 cubin HMMA (mma.sync) and none (test_util::sass_of).
TEST(GpuCodegenOps, SassShowsTheTensorCoreInstructions) {
  if (std::string why = gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  if (test_util::find_cuobjdump().empty()) GTEST_SKIP() << "no cuobjdump (run scripts/get_cuda_tools.sh, or set PALLAS_CUOBJDUMP)";
  PallasCall call = tensor_core_product(DType::F32, false, 128, 128);
  std::shared_ptr<const TracedCall> tc = call.trace({ShapeDtype({128, 64}, DType::BF16), ShapeDtype({64, 128}, DType::BF16)});
  gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid);
  ASSERT_GT(k.wgmma_staging_bytes, 0);
  const std::string hopper = test_util::sass_of(k.source, "sm_90a"), ampere = test_util::sass_of(k.source, "sm_80");
  EXPECT_CONTAINS(hopper, "HGMMA.64x128x16.F32.BF16");  // the 128-wide block of this product
  EXPECT_CONTAINS(hopper, "WARPGROUP.DEPBAR");          // wgmma.wait_group
  EXPECT_CONTAINS(ampere, "HMMA.16816.F32.BF16");
  EXPECT_EQ(ampere.find("HGMMA"), std::string::npos);
}

// acc[...] += dot of two pipelined bf16 blocks, the accumulator in registers: a step's wgmma are
// issued back to back (one WARPGROUP.ARRIVE before the first, none between) and left running
// while the next step's copies land — the step waits only for the previous step's group
// (DEPBAR.LE gsb0, 0x1). With async_wgmma off each step waits for its own (0x0 only). Either
// way the slots are filled by TMA (UTMALDG).
TEST(GpuCodegenOps, WgmmaOfTheRegisterAccumulatorRunsIntoTheNextStep) {
  if (std::string why = gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  if (test_util::find_cuobjdump().empty()) GTEST_SKIP() << "no cuobjdump (run scripts/get_cuda_tools.sh, or set PALLAS_CUOBJDUMP)";
  const int64_t M = 128, N = 128, K = 512, bk = 64;
  auto kernel = [](const pl::Ref& x, const pl::Ref& y, const pl::Ref& z, const pl::Ref& acc) {
    pl::when(pl::program_id(0) == 0, [&] { acc[pl::all] = 0.0f; });
    acc[pl::all] += pl::dot(x[pl::all], y[pl::all], {.preferred = DType::F32});
    pl::when(pl::program_id(0) == pl::num_programs(0) - 1, [&] { z[pl::all] = acc[pl::all]; });
  };
  PallasCall call = pl::pallas_call(
      kernel, ShapeDtype({M, N}, DType::F32),
      opts({K / bk}, {BlockSpec({M, bk}, [](Value k) { return Indices{0, k}; }), BlockSpec({bk, N}, [](Value k) { return Indices{k, 0}; })},
           {BlockSpec({M, N}, [](Value) { return Indices{0, 0}; })}, {ScratchShape{{M, N}, DType::F32, MemorySpace::Vmem}}));
  std::shared_ptr<const TracedCall> tc = call.trace({ShapeDtype({M, K}, DType::BF16), ShapeDtype({K, N}, DType::BF16)});
  for (bool async : {true, false}) {
    SCOPED_TRACE(async ? "async" : "sync");
    gpu::CodegenOptions options;
    options.async_wgmma = async;
    gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, options);
    ASSERT_EQ(k.register_accumulator, 0);
    const std::string sass = test_util::sass_of(k.source, "sm_90a");
    const size_t first = sass.find("HGMMA.64x128x16.F32.BF16"), wait = sass.find("WARPGROUP.DEPBAR", first);
    ASSERT_NE(first, std::string::npos) << sass;
    ASSERT_NE(wait, std::string::npos) << sass;
    const std::string group = sass.substr(first, wait - first);
    EXPECT_EQ(count_of(group, "HGMMA."), 4) << group;  // K = 64: 4 k16 steps, one group
    EXPECT_EQ(count_of(group, "WARPGROUP.ARRIVE"), 0) << group;
    EXPECT_EQ(sass.find("WARPGROUP.DEPBAR.LE gsb0, 0x1") != std::string::npos, async) << sass;
    // The ring's blocks come by TMA (RingBlocksThatAreBoxesComeByTheTmaUnit): the tensor copies
    // and thread 0's expect-tx arrival on the slot's barrier.
    EXPECT_CONTAINS(sass, "UTMALDG.2D");
    EXPECT_CONTAINS(sass, "SYNCS.ARRIVE.TRANS");
    // The kernel's entry prefetches both tensor maps into the TMA unit's cache.
    EXPECT_EQ(count_of(sass, "UTMACCTL.PF"), 2) << sass.substr(0, 3000);
  }
}

TEST(GpuCodegenOps, SortIsStableOverSeveralKeysAndDescending) {
  auto kernel = [](const pl::Ref& k1, const pl::Ref& k2, const pl::Ref& v, const pl::Ref& o1, const pl::Ref& o2,
                   const pl::Ref& o3, const pl::Ref& d) {
    std::vector<pl::Value> s = pl::sort({k1[pl::all], k2[pl::all], v[pl::all]}, 2);
    o1[pl::all] = s[0];
    o2[pl::all] = s[1];
    o3[pl::all] = s[2];
    d[pl::all] = pl::sort({k2[pl::all], v[pl::all]}, 1, /*descending=*/true)[1];  // ties keep their order
  };
  Array k1 = Array::random_uniform({4, 50}, DType::I32, 11, 0, 4);
  // Few distinct keys, so that both keys tie often and the values carried along show stability.
  std::vector<double> k2_values;
  for (int64_t i = 0; i < 200; ++i) k2_values.push_back(static_cast<double>((i * 37) % 7 - 3) * 0.5);
  Array k2 = Array::from_values({4, 50}, DType::F32, k2_values);
  k2.data<float>()[3] = NAN;
  k2.data<float>()[7] = -0.0f;
  Array v = Array::random_normal({4, 50}, DType::F32, 13);
  PallasCall call = pl::pallas_call(kernel,
                                    {ShapeDtype({4, 50}, DType::I32), ShapeDtype({4, 50}, DType::F32),
                                     ShapeDtype({4, 50}, DType::F32), ShapeDtype({4, 50}, DType::F32)},
                                    opts({}, {}, {}));
  // 1 and 3 threads sort each row by insertion; 8 and 64 rank every element (fewer rows than threads).
  expect_same(call, {k1, k2, v}, 0, 0, {}, {1, 3, 8, 64});
}

TEST(GpuCodegenOps, ControlFlowLoopsBranchesAndScopedScratch) {
  auto kernel = [](const pl::Ref& x, const pl::Ref& o, const pl::Ref& n) {
    pl::Value v = x[pl::all];
    // A tile carry and a scalar carry through a loop with a dynamic trip count.
    std::vector<pl::Value> c = pl::fori_loop(0, pl::program_id(0) + 3, {v, pl::scalar(0.0, DType::F32)},
                                             [](pl::Value i, std::vector<pl::Value> c) {
                                               pl::Value t = c[0] * 0.5f + pl::convert(i, DType::F32);
                                               return std::vector<pl::Value>{t, c[1] + pl::sum(t, {0, 1})};
                                             });
    pl::Value w = pl::while_loop(pl::scalar(1, DType::I32), [](pl::Value k) { return k < 100; }, [](pl::Value k) { return k * 3; });
    pl::Value sel = pl::cond(pl::program_id(0) == 1, [&] { return c[0] + 1.0f; }, [&] { return c[0] - 1.0f; });
    std::vector<pl::Value> sw = pl::switch_case(pl::program_id(0), {[&] { return std::vector<pl::Value>{sel * 2.0f}; },
                                                                     [&] { return std::vector<pl::Value>{sel * 3.0f}; }});
    pl::run_scoped({ScopedAlloc{{8, 16}, DType::F32, MemorySpace::Vmem}}, [&](std::vector<pl::Ref> tmp) {
      tmp[0][pl::all] = sw[0];
      o[pl::all] = tmp[0][pl::all] + c[1];
      return std::vector<pl::Value>{};
    });
    pl::when(pl::program_id(0) == 0, [&] { n[pl::all] = pl::broadcast_to(pl::convert(w, DType::F32), {1, 1}); });
  };
  auto row = [](Value i) { return Indices{i, 0}; };
  PallasCall call = pl::pallas_call(kernel, {ShapeDtype({24, 16}, DType::F32), ShapeDtype({1, 1}, DType::F32)},
                                    opts({3}, {BlockSpec({8, 16}, row)},
                                         {BlockSpec({8, 16}, row), BlockSpec({1, 1}, [](Value) { return Indices{0, 0}; })}));
  expect_same(call, {Array::random_normal({24, 16}, DType::F32, 14)}, 1e-6, 1e-5);
}

// Tile carries: a yield computed in the body is copied straight into its carry once every thread
// is done reading the carries (one barrier; the body's reversal reads other threads' elements of
// the carry it replaces), and yields that swap carries go through staging (the copy into one
// carry must not overwrite the other before it is read). 64 threads check both orders.
TEST(GpuCodegenOps, TileCarriesAreReplacedAfterEveryThreadHasReadThem) {
  auto kernel = [](const pl::Ref& x, const pl::Ref& o, const pl::Ref& o2) {
    pl::Value v = x[pl::all];  // (4, 32)
    std::vector<pl::Value> direct = pl::fori_loop(0, 3, {v}, [](pl::Value, std::vector<pl::Value> c) {
      return std::vector<pl::Value>{c[0] * 2 + pl::rev(c[0], {1})};
    });
    o[pl::all] = direct[0];
    std::vector<pl::Value> swapped = pl::fori_loop(0, 5, {v, v * 3}, [](pl::Value i, std::vector<pl::Value> c) {
      return std::vector<pl::Value>{c[1], c[0] + pl::rev(c[1], {1}) + i};
    });
    o2[pl::all] = swapped[0] * 1000 + swapped[1];
  };
  PallasCall call = pl::pallas_call(kernel, {ShapeDtype({4, 32}, DType::I32), ShapeDtype({4, 32}, DType::I32)},
                                    opts({}, {}, {}));
  Array x = Array::random_normal({4, 32}, DType::I32, 5, 0, 20);
  expect_same(call, {x}, 0, 0, {}, {1, 3, 64});
  // The emitter's staging tiles, `T* stageN = (T*)(arena + ...)`, in the unit of a call.
  auto staging_tiles = [&](const PallasCall& c) {
    std::shared_ptr<const TracedCall> tc = c.trace({x.shape_dtype()});
    const std::string src = gpu::generate_cuda(*tc, tc->grid_mapping.grid, {}).source;
    int n = 0;
    for (size_t at = src.find("* stage"); at != std::string::npos; at = src.find("* stage", at + 1))
      n += std::isdigit(static_cast<unsigned char>(src[at + 7])) ? 1 : 0;
    return n;
  };
  EXPECT_GT(staging_tiles(call), 0);  // the swapping loop's yields
  auto direct_only = [](const pl::Ref& x, const pl::Ref& o) {
    o[pl::all] = pl::fori_loop(0, 3, {x[pl::all]}, [](pl::Value, std::vector<pl::Value> c) {
                   return std::vector<pl::Value>{c[0] * 2 + pl::rev(c[0], {1})};
                 })[0];
  };
  EXPECT_EQ(staging_tiles(pl::pallas_call(direct_only, ShapeDtype({4, 32}, DType::I32), opts({}, {}, {}))), 0);
}

// What a loop's body, a branch or a run_scoped yields is its own tile until the parent has copied
// it into the op's result: then its arena bytes are free for what comes after (they were held to
// the kernel's end), as are the tiles the body made (free past a loop's last barrier). Branches of
// a cond take the same bytes (one of them runs). Each kernel below makes (64, 64) f32 tiles of
// 16 KiB (reversals: they read other threads' elements, so they are tiles, not fused) and yields
// one, and then needs two more at once while the result is still read. Counted by hand, the most
// live at once is four: the input, the result's holder, and two of the region's (or of the code
// after it); a kept yield or branches side by side made six (nested, below: six, had been ten). Register tiles off, so every tile is
// the arena's; the outputs against the interpreter at 1, 3 and 64 threads (a reuse without its
// barrier would race).
TEST(GpuCodegenOps, WhatARegionYieldsIsFreedOnceItsParentCopiedIt) {
  constexpr int64_t kTile = 64 * 64 * 4;
  auto after = [](pl::Value r) {
    pl::Value a = pl::rev(r, {1}) * 2.0f;  // (a tile: rev reads across threads)
    pl::Value b = pl::rev(a, {0}) + 1.0f;
    return r + a + b;  // (r, a and b live at once)
  };
  struct Case {
    std::string name;
    std::function<void(const pl::Ref&, const pl::Ref&)> kernel;
    int64_t most_tiles;
  };
  const std::vector<Case> kernels = {
      {"fori_loop", [&](const pl::Ref& x, const pl::Ref& o) {
         pl::Value r = pl::fori_loop(0, 3, {x[pl::all]}, [](pl::Value, std::vector<pl::Value> c) {
                         return std::vector<pl::Value>{c[0] * 0.5f + pl::rev(c[0], {1})};
                       })[0];
         o[pl::all] = after(r);
       }, 4},
      {"cond", [&](const pl::Ref& x, const pl::Ref& o) {
         pl::Value v = x[pl::all];
         pl::Value r = pl::cond(pl::program_id(0) == 0, [&] { return pl::rev(v, {1}) * 3.0f; }, [&] { return pl::rev(v, {0}) - 1.0f; });
         o[pl::all] = after(r);
       }, 4},
      // (Six: the input, the result's holder, the loop's carry, the inner cond's result and two of
      // its branch's tiles; each branch takes the bytes of the one before it.)
      {"a cond in a loop in a cond", [&](const pl::Ref& x, const pl::Ref& o) {
         pl::Value v = x[pl::all];
         pl::Value r = pl::cond(
             pl::program_id(0) == 1,
             [&] {
               return pl::fori_loop(0, pl::program_id(0) + 1, {v}, [](pl::Value i, std::vector<pl::Value> c) {
                        return std::vector<pl::Value>{pl::cond(i == 0, [&] { return pl::rev(c[0], {0}) + 2.0f; },
                                                               [&] { return pl::rev(c[0], {1}) * 0.5f; })};
                      })[0];
             },
             [&] { return pl::rev(v, {0}) - 1.0f; });
         o[pl::all] = after(r);
       }, 6},
      {"run_scoped", [&](const pl::Ref& x, const pl::Ref& o) {
         std::vector<pl::Value> r = pl::run_scoped({ScopedAlloc{{8, 64}, DType::F32, MemorySpace::Vmem}}, [&](std::vector<pl::Ref> tmp) {
           tmp[0][pl::all] = x.at(pl::ds(0, 8), pl::all)[pl::all];
           return std::vector<pl::Value>{pl::rev(x[pl::all], {1}) + tmp[0].at(pl::ds(0, 1), pl::all)[pl::all]};
         });
         o[pl::all] = after(r[0]);
       }, 4}};
  for (const auto& [name, kernel, most_tiles] : kernels) {
    SCOPED_TRACE(name);
    auto row = [](Value i) { return Indices{i, 0}; };
    PallasCall call = pl::pallas_call(kernel, ShapeDtype({128, 64}, DType::F32),
                                      opts({2}, {BlockSpec({64, 64}, row)}, {BlockSpec({64, 64}, row)}));
    const Array x = Array::random_normal({128, 64}, DType::F32, 17);
    gpu::CodegenOptions arena_only;
    arena_only.register_tiles = false;
    expect_same(call, {x}, 1e-5, 1e-5, arena_only, {1, 3, 64});
    std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype()});
    const gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, arena_only);
    EXPECT_TRUE(k.arena_in_shared);
    EXPECT_LE(k.arena_bytes, most_tiles * kTile + 4096);  // (+ the scoped (8, 64) scratch)
  }
}

// A while_loop whose condition reads a ref leaves through its break after the body's last
// barrier: the write after the loop waits for every thread's last condition (a thread still
// reading it would see the new value, go round once more and wait at a barrier the others never
// reach — a hang on the GPU, and under host emulation with enough threads).
TEST(GpuCodegenOps, AWhileConditionThatReadsARefIsOrderedBeforeTheWritesAfterTheLoop) {
  auto kernel = [](const pl::Ref& x, const pl::Ref& o, const pl::Ref& s) {
    s.store({0}, pl::scalar(0, DType::I32));
    pl::Value w = pl::while_loop(
        pl::scalar(0, DType::I32), [&](pl::Value) { return s.load({0}) < 5; },
        [&](pl::Value k) {
          s.store({0}, s.load({0}) + 1);
          return k + 1;
        });
    s.store({0}, pl::scalar(0, DType::I32));  // (what a late condition would read: 0 < 5)
    o[pl::all] = x[pl::all] + pl::convert(w, DType::F32);
  };
  PallasCall call = pl::pallas_call(kernel, {ShapeDtype({8, 128}, DType::F32)},
                                    opts({}, {BlockSpec()}, {BlockSpec()}, {ScratchShape{{1}, DType::I32}}));
  const Array x = Array::random_normal({8, 128}, DType::F32, 3);
  std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype()});
  const gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid);
  // In the source: a barrier between the loop's end and the store after it.
  const std::string& src = k.source;
  const size_t exit = src.find("break;", src.find("PL_DEV bool pl_grid_point"));
  ASSERT_NE(exit, std::string::npos);
  const size_t after_loop = src.find("\n  }\n", exit);  // (the loop's closing brace, at the body's indent)
  ASSERT_NE(after_loop, std::string::npos) << src;
  const size_t store = src.find("pl_tid() == 0", after_loop);
  ASSERT_NE(store, std::string::npos) << src;
  ASSERT_NE(src.substr(after_loop, store - after_loop).find("pl_sync();"), std::string::npos)
      << src.substr(exit, store + 40 - exit);
  // And run with 64 threads: every element is x + 5.
  for (int rep = 0; rep < 3; ++rep) {
    const std::vector<Array> got = gpu::run_host_emulation(*tc, k, {x.clone()}, tc->grid_mapping.grid, 64);
    for (int64_t i = 0; i < 8 * 128; ++i)
      ASSERT_EQ(got[0].data<float>()[i], x.data<float>()[i] + 5.0f) << "element " << i << ", run " << rep;
  }
}

// Static view starts times strides are 64-bit products: a view of rows from 600000 on of a
// 4096-column block starts at element 2457600000, past 2^31 (as int literals the product would
// wrap; nvcc warns "integer operation result is out of range").
TEST(GpuCodegenOps, StaticViewOffsetsPast2To31AreSixtyFourBit) {
  auto kernel = [](const pl::Ref& x, const pl::Ref& o) { o[pl::all] = x.at(pl::ds(600000, 8), pl::ds(0, 128))[pl::all]; };
  PallasCall call = pl::pallas_call(kernel, {ShapeDtype({8, 128}, DType::F32)},
                                    opts({}, {BlockSpec()}, {BlockSpec()}));
  std::shared_ptr<const TracedCall> tc = call.trace({ShapeDtype({int64_t{1} << 20, 4096}, DType::F32)});
  const std::string src = gpu::generate_cuda(*tc, tc->grid_mapping.grid).source;
  EXPECT_CONTAINS(src, "600000 * 4096LL");
  if (std::string why = gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  const gpu::CompiledKernel ptx = gpu::Nvrtc::get().compile(src, "big.cu", "compute_90a");
  EXPECT_EQ(ptx.log.find("out of range"), std::string::npos) << ptx.log;
}

TEST(GpuCodegenOps, RefViewsStridedLoadsMaskedStoresSwapsAndAtomics) {
  auto kernel = [](const pl::Ref& x, const pl::Ref& o, const pl::Ref& cnt) {
    pl::Value i = pl::program_id(0);
    o[pl::all] = pl::zeros({8, 16}, DType::F32);
    pl::Value strided = x.at(pl::ds(0, 4, 2), pl::ds(i, 8, 1)).load();           // (4, 8)
    o.at(pl::ds(1, 4), pl::ds(0, 8)).store({}, strided * 2.0f);
    pl::Value mask = pl::iota(DType::I32, {8, 16}, 1) < 5;
    o.store_masked({pl::all}, x.at(pl::ds(0, 8), pl::ds(0, 16)).load() + 100.0f, mask);
    pl::Value old = o.swap({pl::ds(7, 1), pl::ds(0, 16)}, pl::full({1, 16}, DType::F32, -1.0));
    o.at(pl::ds(6, 1)).store({}, old + 0.25f);
    cnt.atomic_add({0}, pl::scalar(1, DType::I32));
    cnt.atomic_rmw("max", {1}, pl::convert(i, DType::I32) * 7);
    cnt.atomic_cas({2}, pl::scalar(0, DType::I32), pl::scalar(5, DType::I32));
  };
  auto row = [](Value i) { return Indices{i, 0}; };
  CallOptions o = opts({3}, {BlockSpec(), BlockSpec()}, {BlockSpec({8, 16}, row), BlockSpec()});
  o.input_output_aliases = {{1, 1}};
  PallasCall call = pl::pallas_call(
      [&](const pl::Ref& x, const pl::Ref&, const pl::Ref& out, const pl::Ref& cnt) { kernel(x, out, cnt); },
      {ShapeDtype({24, 16}, DType::F32), ShapeDtype({3}, DType::I32)}, o);
  // The counter (aliased in and out) is shared by every grid point: a sequential axis on the GPU.
  expect_same(call, {Array::random_normal({8, 24}, DType::F32, 15), Array::full({3}, DType::I32, 0)});
}

TEST(GpuCodegenOps, RaggedEdgeBlocksReadTheUninitializedValueAndDropWrites) {
  // (20, 50) in (8, 16) blocks: the last row and column blocks overhang.
  auto kernel = [](const pl::Ref& x, const pl::Ref& o) {
    pl::Value v = x[pl::all];
    o[pl::all] = pl::where(v != v, pl::full({8, 16}, DType::F32, 7.0), v * 3.0f);  // NaN padding -> 7
  };
  auto blk = [](Value i, Value j) { return Indices{i, j}; };
  PallasCall call = pl::pallas_call(kernel, ShapeDtype({20, 50}, DType::F32),
                                    opts({3, 4}, {BlockSpec({8, 16}, blk)}, {BlockSpec({8, 16}, blk)}));
  expect_same(call, {Array::random_normal({20, 50}, DType::F32, 16)});
}

TEST(GpuCodegenOps, AccumulationAxisRunsInOrderInsideTheCta) {
  // Output block (i,) is revisited along j: j must be a sequential axis.
  auto kernel = [](const pl::Ref& x, const pl::Ref& o) {
    pl::when(pl::program_id(1) == 0, [&] { o[pl::all] = pl::zeros({8, 32}, DType::F32); });
    o[pl::all] = o[pl::all] + x[pl::all];
  };
  PallasCall call = pl::pallas_call(kernel, ShapeDtype({16, 32}, DType::F32),
                                    opts({2, 5}, {BlockSpec({8, 32}, [](Value i, Value j) { return Indices{j, i}; })},
                                         {BlockSpec({8, 32}, [](Value i, Value) { return Indices{i, 0}; })}));
  std::shared_ptr<const TracedCall> tc = call.trace({ShapeDtype({40, 64}, DType::F32)});
  gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid);
  EXPECT_EQ(k.parallel_axes, std::vector<int>{0});
  EXPECT_EQ(k.sequential_axes, std::vector<int>{1});
  expect_same(call, {Array::random_normal({40, 64}, DType::F32, 17)}, 1e-6, 1e-6);
  // Marked by the user: both axes sequential.
  gpu::CodegenOptions seq;
  seq.dimension_semantics = {"arbitrary", "arbitrary"};
  EXPECT_EQ(gpu::generate_cuda(*tc, tc->grid_mapping.grid, seq).parallel_axes, std::vector<int>{});
  seq.dimension_semantics = {"parallel"};
  EXPECT_THROW(gpu::generate_cuda(*tc, tc->grid_mapping.grid, seq), Error);
}

// The canonical blocked matmul (acc += x[i, k] @ y[k, j] over a sequential k, z = acc at the
// last k) with x's blocks asking for `depth` buffers.
PallasCall blocked_matmul(int64_t M, int64_t N, int64_t K, int64_t bm, int64_t bn, int64_t bk, int depth) {
  auto kernel = [](const pl::Ref& x, const pl::Ref& y, const pl::Ref& z, const pl::Ref& acc) {
    pl::when(pl::program_id(2) == 0, [&] { acc[pl::all] = 0.0f; });
    acc[pl::all] += pl::dot(x[pl::all], y[pl::all], {.preferred = DType::F32});
    pl::when(pl::program_id(2) == pl::num_programs(2) - 1, [&] { z[pl::all] = acc[pl::all]; });
  };
  return pl::pallas_call(
      kernel, ShapeDtype({M, N}, DType::F32),
      opts({M / bm, N / bn, K / bk},
           {BlockSpec({bm, bk}, [](Value i, Value, Value k) { return Indices{i, k}; }).with_pipeline_mode(Buffered{depth}),
            BlockSpec({bk, bn}, [](Value, Value j, Value k) { return Indices{k, j}; })},
           {BlockSpec({bm, bn}, [](Value i, Value j, Value) { return Indices{i, j}; })},
           {ScratchShape{{bm, bn}, DType::F32, MemorySpace::Vmem}}));
}

// The block shapes bench_gpu.cpp times against cuBLAS (x (bm, bk), y (bk, bn), Buffered(depth)
// for both) at a small size, generated for the GPU as the benchmark's are (default options: two
// warpgroups): both inputs come by TMA into 128-byte swizzled slots that wgmma reads in place,
// with a slot more than the depth for the wgmma left running; the accumulator stays in registers
// (256 columns: two rounds of 64 x 128 blocks per warpgroup); the CTA's shared memory fits an
// H100's 227 KiB. Run in host emulation with those threads against a plain product.
TEST(GpuCodegenOps, TheBenchmarksMatmulBlockShapesTakeTheTmaAndWgmmaPath) {
  struct Case { int64_t bm, bn, bk; int depth; };
  for (Case c : {Case{128, 128, 128, 2}, Case{128, 128, 64, 4}, Case{128, 256, 64, 3}}) {
    SCOPED_TRACE(std::to_string(c.bm) + " x " + std::to_string(c.bn) + " x " + std::to_string(c.bk) + ", depth " +
                 std::to_string(c.depth));
    const int64_t M = 256, N = 512, K = 3 * c.bk;
    PallasCall call = blocked_matmul(M, N, K, c.bm, c.bn, c.bk, c.depth);
    const Array x = Array::random_normal({M, K}, DType::BF16, 91), y = Array::random_normal({K, N}, DType::BF16, 92);
    std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype(), y.shape_dtype()});
    const gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid);
    EXPECT_EQ(k.threads_per_cta, 256);
    EXPECT_EQ(k.pipeline_depth, c.depth);
    EXPECT_EQ(k.pipeline_slots, c.depth + 1);
    EXPECT_EQ(k.pipeline_slot_bytes, (c.depth + 1) * (c.bm * c.bk + c.bk * c.bn) * 2);
    EXPECT_EQ(k.tma_inputs, (std::vector<int>{0, 1}));
    EXPECT_EQ(k.tensor_core_slots, (std::vector<int>{0, 1}));
    EXPECT_EQ(k.register_accumulator, 0);
    EXPECT_CONTAINS(k.source, "#define PL_SLOT_LAYOUT_0 (PL_HAS_WGMMA ? 3 : 0)");  // 128-byte swizzle, K-major
    EXPECT_CONTAINS(k.source, "#define PL_SLOT_LAYOUT_1 (PL_HAS_WGMMA ? 4 : 0)");  // 128-byte swizzle, N-major
    EXPECT_LE(k.dynamic_shared_bytes(true), 227 * 1024);
    gpu::HostEmulationStats stats;
    const std::vector<Array> got = gpu::run_host_emulation(*tc, k, {x, y}, tc->grid_mapping.grid, 256, &stats);
    const int64_t steps = (M / c.bm) * (N / c.bn) * (K / c.bk);
    EXPECT_EQ(stats.tma_boxes, steps * (c.bk / 64 + c.bn / 64));  // a box per 64-column panel
    EXPECT_EQ(stats.wgmma_instructions, steps * (c.bm / 64) * (c.bn / 128) * (c.bk / 16));  // 64 x 128 x 16 each
    expect_plain_product(x, y, false, DType::F32, got[0]);
  }
}

// Blocks that move along the innermost sequential axis come through a ring of shared-memory slots,
// copied ahead (cp.async on the GPU): x's and y's blocks of a blocked matmul, with rings of 2 to 4
// slots, K axes of 1 to 5 steps (shorter and longer than the ring), an outer sequential axis (the
// ring starts over for each j), the CUDA-core loop (f32, or bf16 with 3 or 4 threads) and wgmma
// (bf16, one warpgroup). A step reading another step's slot gives a wrong product.
TEST(GpuCodegenOps, BlocksMovingAlongTheSequentialAxisComeThroughARingOfSlots) {
  struct Case { DType in; int64_t steps; int depth; int threads; bool j_sequential; };
  for (Case c : {Case{DType::F32, 1, 2, 3, false}, Case{DType::F32, 5, 3, 3, true}, Case{DType::BF16, 4, 2, 128, false},
                 Case{DType::BF16, 3, 4, 4, true}, Case{DType::BF16, 2, 3, 128, true}}) {
    SCOPED_TRACE(std::string(dtype_name(c.in)) + ", " + std::to_string(c.steps) + " steps, depth " + std::to_string(c.depth) +
                 ", " + std::to_string(c.threads) + " threads" + (c.j_sequential ? ", j sequential" : ""));
    const int64_t bm = 64, bn = 32, bk = 16, M = 128, N = 64, K = bk * c.steps;
    PallasCall call = blocked_matmul(M, N, K, bm, bn, bk, c.depth);
    const Array x = Array::random_normal({M, K}, c.in, 41), y = Array::random_normal({K, N}, c.in, 42);
    std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype(), y.shape_dtype()});
    ASSERT_EQ(tc->grid_mapping.grid, (std::vector<int64_t>{M / bm, N / bn, c.steps}));
    gpu::CodegenOptions options;
    options.threads_per_cta = c.threads;
    if (c.j_sequential) options.dimension_semantics = {"parallel", "arbitrary", "arbitrary"};
    gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, options);
    EXPECT_EQ(k.sequential_axes, c.j_sequential ? (std::vector<int>{1, 2}) : std::vector<int>{2});
    EXPECT_EQ(k.pipelined_inputs, (std::vector<int>{0, 1}));
    EXPECT_EQ(k.pipeline_depth, c.depth);
    // A ring that may feed wgmma (bf16 operands) has a slot more than its depth (see
    // AWgmmaLeftRunningKeepsItsSlotsUntilTheNextStepRetiresIt).
    const int slots = c.depth + (c.in == DType::BF16 ? 1 : 0);
    EXPECT_EQ(k.pipeline_slots, slots);
    EXPECT_EQ(k.pipeline_slot_bytes, slots * (bm * bk + bk * bn) * itemsize(c.in));
    EXPECT_CONTAINS(k.source, "pl_cp_async16(");
    gpu::HostEmulationStats stats;
    std::vector<Array> got = gpu::run_host_emulation(*tc, k, {x, y}, tc->grid_mapping.grid, c.threads, &stats);
    if (c.in == DType::BF16 && c.threads == 128) {
      EXPECT_GT(stats.wgmma_instructions, 0u);
    }
    expect_plain_product(x, y, false, DType::F32, got[0]);
  }
}

// A slot whose block the body reads only as an operand of tensor-core products is kept in wgmma's
// canonical layout (K-major for x and for an n x k y, MN-major for a k x n y, read with the
// transpose flag): wgmma reads it in place, no staging copy. Run with the warpgroup the kernel
// was generated for (wgmma, emulated from its descriptors) and with 64 threads (the CUDA-core
// product that reads the same layouts); a slot also read another way stays row-major. Each
// checked against a plain product in double.
TEST(GpuCodegenOps, TensorCoreOperandsAreKeptInWgmmaLayoutInTheirSlots) {
  struct Case { bool b_nk; bool y_also_summed; int run_threads; };
  for (Case c : {Case{false, false, 128}, Case{true, false, 128}, Case{false, false, 64}, Case{true, false, 64},
                 Case{false, true, 128}}) {
    SCOPED_TRACE(std::string(c.b_nk ? "y n x k" : "y k x n") + (c.y_also_summed ? ", y also summed" : "") + ", " +
                 std::to_string(c.run_threads) + " threads");
    const int64_t M = 128, N = 32, K = 96, bm = 64, bk = 32;
    auto kernel = [c](const pl::Ref& x, const pl::Ref& y, const pl::Ref& z, const pl::Ref& acc) {
      pl::when(pl::program_id(1) == 0, [&] { acc[pl::all] = 0.0f; });
      const pl::Value p = c.b_nk ? pl::dot_general(x[pl::all], y[pl::all], pl::DotDims{{1}, {1}, {}, {}}, DType::F32)
                                 : pl::dot(x[pl::all], y[pl::all], {.preferred = DType::F32});
      acc[pl::all] += p;
      // A second read of y's block, which adds 0 (y is finite): its slot must stay row-major.
      if (c.y_also_summed)
        acc.at(pl::ds(0, 1), pl::ds(0, 1)).store({}, acc.at(pl::ds(0, 1), pl::ds(0, 1)).load() +
                                                       y.at(pl::ds(0, 1), pl::ds(0, 1)).load().astype(DType::F32) * 0.0f);
      pl::when(pl::program_id(1) == pl::num_programs(1) - 1, [&] { z[pl::all] = acc[pl::all]; });
    };
    const BlockSpec y_spec = c.b_nk ? BlockSpec({N, bk}, [](Value, Value k) { return Indices{0, k}; })
                                    : BlockSpec({bk, N}, [](Value, Value k) { return Indices{k, 0}; });
    PallasCall call = pl::pallas_call(
        kernel, ShapeDtype({M, N}, DType::F32),
        opts({M / bm, K / bk}, {BlockSpec({bm, bk}, [](Value i, Value k) { return Indices{i, k}; }), y_spec},
             {BlockSpec({bm, N}, [](Value i, Value) { return Indices{i, 0}; })},
             {ScratchShape{{bm, N}, DType::F32, MemorySpace::Vmem}}));
    const Array x = Array::random_normal({M, K}, DType::BF16, 71);
    const Array y = Array::random_normal(c.b_nk ? Shape{N, K} : Shape{K, N}, DType::BF16, 72);
    std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype(), y.shape_dtype()});
    gpu::CodegenOptions options;
    options.threads_per_cta = 128;
    gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, options);
    EXPECT_EQ(k.pipelined_inputs, (std::vector<int>{0, 1}));
    EXPECT_EQ(k.tensor_core_slots, c.y_also_summed ? std::vector<int>{0} : (std::vector<int>{0, 1}));
    EXPECT_EQ(k.register_accumulator, c.y_also_summed ? -1 : 0);  // (a view of acc, .at: no registers)
    gpu::HostEmulationStats stats;
    std::vector<Array> got = gpu::run_host_emulation(*tc, k, {x, y}, tc->grid_mapping.grid, c.run_threads, &stats);
    EXPECT_EQ(stats.wgmma_instructions > 0, c.run_threads == 128);
    expect_plain_product(x, y, c.b_nk, DType::F32, got[0]);
  }
}

// `acc[...] += dot(x, y)` into a whole f32 scratch keeps the accumulator in wgmma's registers
// across the K steps; every other access to acc (halving it between two products, writing it
// out) finds it current, and a product after one reloads it. Setting it to one value (0.25 here,
// so that a fill of zeros would show) sets the registers (pl_acc_fill), or the scratch where the
// products run in memory. Generated for one
// warpgroup (two rounds of 64 rows each) or two (one round), run with those threads (wgmma,
// emulated) or with 64 (the registers unused: the product in memory). Checked against the
// reference interpreter.
TEST(GpuCodegenOps, AnAccumulatorStaysInRegistersAcrossTheSteps) {
  struct Case { int threads, run_threads; };
  for (Case c : {Case{128, 128}, Case{256, 256}, Case{128, 64}}) {
    SCOPED_TRACE(std::to_string(c.threads) + " threads, run with " + std::to_string(c.run_threads));
    const int64_t M = 128, N = 64, K = 128, bk = 32;
    auto kernel = [](const pl::Ref& x, const pl::Ref& y, const pl::Ref& z, const pl::Ref& acc) {
      pl::when(pl::program_id(0) == 0, [&] { acc[pl::all] = 0.25f; });
      acc[pl::all] += pl::dot(x[pl::all], y[pl::all], {.preferred = DType::F32});
      pl::when(pl::program_id(0) == 1, [&] { acc[pl::all] = acc[pl::all] * 0.5f; });
      pl::when(pl::program_id(0) == pl::num_programs(0) - 1, [&] { z[pl::all] = acc[pl::all]; });
    };
    PallasCall call = pl::pallas_call(
        kernel, ShapeDtype({M, N}, DType::F32),
        opts({K / bk}, {BlockSpec({M, bk}, [](Value k) { return Indices{0, k}; }), BlockSpec({bk, N}, [](Value k) { return Indices{k, 0}; })},
             {BlockSpec({M, N}, [](Value) { return Indices{0, 0}; })}, {ScratchShape{{M, N}, DType::F32, MemorySpace::Vmem}}));
    const std::vector<Array> args = {Array::random_normal({M, K}, DType::BF16, 81), Array::random_normal({K, N}, DType::BF16, 82)};
    std::shared_ptr<const TracedCall> tc = call.trace({args[0].shape_dtype(), args[1].shape_dtype()});
    gpu::CodegenOptions options;
    options.threads_per_cta = c.threads;
    gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, options);
    EXPECT_EQ(k.register_accumulator, 0);
    EXPECT_CONTAINS(k.source, "PlAccRegs<64, " + std::to_string(c.threads == 128 ? 2 : 1) + "> pl_acc;");
    EXPECT_CONTAINS(k.source, "if (!pl_acc_fill(pl_acc, (float)(");
    const std::vector<Array> want = interpret::run_reference(*tc, clone_all(args), tc->grid_mapping.grid, nullptr);
    gpu::HostEmulationStats stats;
    const std::vector<Array> got = gpu::run_host_emulation(*tc, k, clone_all(args), tc->grid_mapping.grid, c.run_threads, &stats);
    EXPECT_EQ(stats.wgmma_instructions > 0, c.run_threads % 128 == 0);
    const AllCloseResult r = allclose(got[0], want[0], 1e-5, 1e-4);
    EXPECT_TRUE(r.ok) << r.message;
  }
}

// wgmma is asynchronous: a step's products of the register accumulator are left running into the
// next step, still reading that step's ring slots. So such a ring has depth + 1 slots and a slot
// is refilled two steps after its use. Host emulation computes a wgmma when a wait retires it
// (its operands read at the latest moment the hardware may read them): the kernel is right with
// the extra slot and wrong when the same source refills the slot a step early — the race a GPU
// run would have. With async_wgmma off each step waits for its own products: depth slots; there
// the source edited to wait for one copy group fewer reads slots before their copies land.
TEST(GpuCodegenOps, AWgmmaLeftRunningKeepsItsSlotsUntilTheNextStepRetiresIt) {
  const int64_t M = 64, N = 64, K = 256, bk = 32;
  auto kernel = [](const pl::Ref& x, const pl::Ref& y, const pl::Ref& z, const pl::Ref& acc) {
    pl::when(pl::program_id(0) == 0, [&] { acc[pl::all] = 0.0f; });
    acc[pl::all] += pl::dot(x[pl::all], y[pl::all], {.preferred = DType::F32});
    pl::when(pl::program_id(0) == pl::num_programs(0) - 1, [&] { z[pl::all] = acc[pl::all]; });
  };
  for (int depth : {2, 3}) {
    PallasCall call = pl::pallas_call(
        kernel, ShapeDtype({M, N}, DType::F32),
        opts({K / bk},
             {BlockSpec({M, bk}, [](Value k) { return Indices{0, k}; }).with_pipeline_mode(Buffered{depth}),
              BlockSpec({bk, N}, [](Value k) { return Indices{k, 0}; })},
             {BlockSpec({M, N}, [](Value) { return Indices{0, 0}; })}, {ScratchShape{{M, N}, DType::F32, MemorySpace::Vmem}}));
    const Array x = Array::random_normal({M, K}, DType::BF16, 91), y = Array::random_normal({K, N}, DType::BF16, 92);
    std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype(), y.shape_dtype()});
    for (bool async : {true, false}) {
      SCOPED_TRACE("depth " + std::to_string(depth) + (async ? ", async" : ", sync"));
      gpu::CodegenOptions options;
      options.threads_per_cta = 128;
      options.async_wgmma = async;
      // (Synchronous, the ring's copies are cp.async, whose early-read edit is below; the TMA
      // copies have theirs in RingBlocksThatAreBoxesComeByTheTmaUnit.)
      options.tma = async;
      gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, options);
      ASSERT_EQ(k.register_accumulator, 0);
      ASSERT_EQ(k.tensor_core_slots, (std::vector<int>{0, 1}));
      EXPECT_EQ(k.pipeline_depth, depth);
      EXPECT_EQ(k.pipeline_slots, depth + (async ? 1 : 0));
      gpu::HostEmulationStats stats;
      expect_plain_product(x, y, false, DType::F32, gpu::run_host_emulation(*tc, k, {x, y}, tc->grid_mapping.grid, 128, &stats)[0]);
      EXPECT_GT(stats.wgmma_instructions, 0u);
      const Array want = interpret::run_reference(*tc, {x, y}, tc->grid_mapping.grid, nullptr)[0];
      if (!async) {
        // And the copies: waiting for one group fewer, a step reads slots whose cp.async have not
        // landed (emulated: they land at the wait, the slot reads as NaN before).
        const std::string wait = "pl_cp_async_wait<" + std::to_string(depth) + " - 1>()";
        gpu::GeneratedKernel early = k;
        const size_t at = early.source.find(wait);
        ASSERT_NE(at, std::string::npos);
        early.source.replace(at, wait.size(), "pl_cp_async_wait<" + std::to_string(depth) + ">()");
        const Array got = gpu::run_host_emulation(*tc, early, {x, y}, tc->grid_mapping.grid, 128)[0];
        EXPECT_FALSE(allclose(got, want, 1e-4, 1e-3).ok) << "the early read went unnoticed";
        continue;
      }
      // The same kernel with a ring of `depth` slots: each refill overwrites the slots of the step
      // whose wgmma is still running.
      const std::string slots = std::to_string(depth + 1), fewer = std::to_string(depth);
      std::string early = k.source;
      for (const std::string& use : {std::string("(int)(s % "), std::string("(int)(g[0] % ")}) {
        size_t at = early.find(use + slots + ")");
        ASSERT_NE(at, std::string::npos) << use;
        for (; at != std::string::npos; at = early.find(use + slots + ")", at))  // (the slot, its barrier)
          early.replace(at, use.size() + slots.size(), use + fewer);
      }
      gpu::GeneratedKernel racy = k;
      racy.source = early;
      const Array got = gpu::run_host_emulation(*tc, racy, {x, y}, tc->grid_mapping.grid, 128)[0];
      EXPECT_FALSE(allclose(got, want, 1e-4, 1e-3).ok) << "the early refill went unnoticed";
    }
  }
}

// On sm_90 the ring's blocks that are boxes of their arrays come by the TMA unit: a tensor map per
// input in the kernel's parameters, one mbarrier per slot that thread 0 arrives on with the slot's
// bytes before issuing the boxes. A row-major slot is one box (the block); a slot in wgmma's
// canonical layout is a box of 8 columns x all rows per 16-byte column chunk. Host emulation
// copies the boxes from its own encoding of the maps and lands them when a thread tests the
// slot's barrier. Checked: the maps (dims, byte strides, boxes, by hand), the boxes issued, the
// result against a plain product (or sum) in double; and three edits of the generated source:
// without the slot wait a step reads its slots before they land (NaN), without the arrival the
// wait gives up after the wait limit with an error instead of hanging, and without the maps
// (none encoded: an unaligned array, a device without TMA) the blocks come by cp.async.
TEST(GpuCodegenOps, RingBlocksThatAreBoxesComeByTheTmaUnit) {
  auto spec = [](int operand, int elem, std::vector<uint64_t> dims, std::vector<uint64_t> strides, std::vector<uint32_t> box) {
    gpu::TensorMapSpec s;
    s.operand = operand, s.elem_bytes = elem, s.dims = std::move(dims), s.strides = std::move(strides), s.box = std::move(box);
    return s;
  };
  // A generated kernel with every `from` replaced by `to` (it must be there).
  auto edited = [](const gpu::GeneratedKernel& k, const std::string& from, const std::string& to) {
    gpu::GeneratedKernel e = k;
    size_t at = e.source.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    for (; at != std::string::npos; at = e.source.find(from, at + to.size())) e.source.replace(at, from.size(), to);
    return e;
  };
  const std::string wait = "const bool pl_landed = pl_ring_wait(", expect = "if (pl_cta_tid() == 0) pl_expect_tx(pl_ring_mbar + slot, ";
  const std::string ok = "(p.tma_ok >> ";
  // x (128 x 64) @ y (64 x 64) in (64, 16) x (16, 32) blocks, 4 K steps: bf16 with one warpgroup
  // keeps both slots canonical (x K-major: 2 boxes of 8 x 64; y MN-major: 4 boxes of 8 x 16),
  // f32 row-major (a box each). (Without swizzle: these panels would take the 32- and 64-byte
  // swizzles, a box each — SlotsOfWholePanelsAreSwizzledForTmaAndWgmma.)
  for (DType in : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(dtype_name(in));
    const int64_t M = 128, N = 64, K = 64, bm = 64, bn = 32, bk = 16;
    const uint64_t e = static_cast<uint64_t>(itemsize(in));
    PallasCall call = blocked_matmul(M, N, K, bm, bn, bk, 2);
    const Array x = Array::random_normal({M, K}, in, 43), y = Array::random_normal({K, N}, in, 44);
    std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype(), y.shape_dtype()});
    gpu::CodegenOptions options;
    options.threads_per_cta = 128;
    options.swizzle = false;
    const gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, options);
    EXPECT_EQ(k.tma_inputs, (std::vector<int>{0, 1}));
    ASSERT_EQ(k.tensor_maps.size(), 2u);
    const bool canonical = in == DType::BF16;
    EXPECT_EQ(k.tensor_core_slots, canonical ? (std::vector<int>{0, 1}) : std::vector<int>{});
    // wgmma reads the slots in place with no fence of its own: every thread fences its copies
    // (cp.async, elements) for the async proxy once per step, before the step's barrier.
    EXPECT_EQ(count_of(k.source, "pl_cp_async_wait<2 - 1>();\n    pl_fence_proxy_async();"), canonical ? 1 : 0);
    EXPECT_EQ(k.tensor_maps[0], spec(0, static_cast<int>(e), {64, 128}, {64 * e}, {canonical ? 8u : 16u, 64}));
    EXPECT_EQ(k.tensor_maps[1], spec(1, static_cast<int>(e), {64, 64}, {64 * e}, {canonical ? 8u : 32u, 16}));
    EXPECT_CONTAINS(k.source, "const __grid_constant__ PlParams p");
    gpu::HostEmulationStats stats;
    expect_plain_product(x, y, false, DType::F32, gpu::run_host_emulation(*tc, k, {x, y}, tc->grid_mapping.grid, 128, &stats)[0]);
    // 4 CTA points (i, j) x 4 steps, each step a box per chunk of 8 columns or a box per block.
    EXPECT_EQ(stats.tma_boxes, 16 * (canonical ? 2 + 4 : 2));
    EXPECT_EQ(stats.wgmma_instructions > 0, canonical);
    const Array want = interpret::run_reference(*tc, {x, y}, tc->grid_mapping.grid, nullptr)[0];
    const Array early = gpu::run_host_emulation(*tc, edited(k, wait, "const bool pl_landed = true || pl_ring_wait("), {x, y},
                                                tc->grid_mapping.grid, 128)[0];
    EXPECT_FALSE(allclose(early, want, 1e-4, 1e-3).ok) << "a read before the slot's barrier went unnoticed";
    gpu::HostEmulationStats cp;
    const Array by_cp_async = gpu::run_host_emulation(*tc, edited(k, ok, "(0 >> "), {x, y}, tc->grid_mapping.grid, 128, &cp)[0];
    EXPECT_EQ(cp.tma_boxes, 0);
    expect_plain_product(x, y, false, DType::F32, by_cp_async);
    if (in == DType::F32) {
      setenv("PALLAS_GPU_WAIT_TIMEOUT_MS", "200", 1);
      std::string err = "no error";
      try {  // (a fault of the backend, not of the user's kernel: an InternalError)
        gpu::run_host_emulation(*tc, edited(k, expect, "if (false) pl_expect_tx(pl_ring_mbar + slot, "), {x, y}, tc->grid_mapping.grid, 128);
      } catch (const InternalError& e) {
        err = e.what();
      }
      unsetenv("PALLAS_GPU_WAIT_TIMEOUT_MS");
      EXPECT_CONTAINS(err, "the TMA copies of a pipeline step of pallas_call");
      EXPECT_CONTAINS(err, "did not land within the wait limit");
    }
  }
  // A 3-D array whose blocks squeeze its first dim (the sequential axis): boxes of rank 3 with a 1
  // in it; and TMA off (CodegenOptions::tma, PALLAS_GPU_NO_TMA=1): no maps, cp.async.
  auto kernel = [](const pl::Ref& x, const pl::Ref& o) {
    pl::when(pl::program_id(1) == 0, [&] { o[pl::all] = pl::zeros({16, 64}, DType::F32); });
    o[pl::all] = o[pl::all] + x[pl::all];
  };
  PallasCall call = pl::pallas_call(
      kernel, ShapeDtype({32, 64}, DType::F32),
      opts({2, 4}, {BlockSpec({pl::squeezed, 16, 64}, [](Value i, Value k) { return Indices{k, i, 0}; })},
           {BlockSpec({16, 64}, [](Value i, Value) { return Indices{i, 0}; })}));
  const Array x = Array::random_normal({4, 32, 64}, DType::F32, 45);
  std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype()});
  for (bool tma : {true, false}) {
    SCOPED_TRACE(tma ? "3-D, TMA" : "3-D, TMA off");
    gpu::CodegenOptions options;
    options.tma = tma;
    const gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, options);
    EXPECT_EQ(k.pipelined_inputs, std::vector<int>{0});
    EXPECT_EQ(k.tma_inputs, tma ? std::vector<int>{0} : std::vector<int>{});
    ASSERT_EQ(k.tensor_maps.size(), tma ? 1u : 0u);
    if (tma) {
      EXPECT_EQ(k.tensor_maps[0], spec(0, 4, {64, 32, 4}, {256, 32 * 256}, {64, 16, 1}));
    }
    EXPECT_EQ(k.source.find("pl_tma_load<3>(dst") != std::string::npos, tma);
    // One barrier per step before the point (the TMA wait's vote, or a CTA sync), none after it
    // (the point ends with one) and none at its start — besides those of the paths that leave
    // the point on an error.
    const size_t loop = k.source.find("for (pl_i64 s = 0;");
    ASSERT_NE(loop, std::string::npos);
    const std::string step = k.source.substr(loop, k.source.find("\n  }\n", loop) - loop);
    EXPECT_EQ(count_of(step, "pl_cta_sync();\n"), tma ? 0 : 1) << step;
    EXPECT_EQ(count_of(step, "pl_group_all(pl_landed)"), tma ? 1 : 0) << step;
    EXPECT_EQ(count_of(step, "pl_cta_sync(); return;"), tma ? 2 : 1) << step;
    const size_t point = k.source.find("PL_DEV bool pl_grid_point(");
    EXPECT_EQ(k.source.find("pl_sync();", point), k.source.find("pl_sync();", k.source.find("// cond ", point)))
        << "a barrier before the body's first op";
    gpu::HostEmulationStats stats;
    const Array got = gpu::run_host_emulation(*tc, k, {x}, tc->grid_mapping.grid, 64, &stats)[0];
    EXPECT_EQ(stats.tma_boxes, tma ? 8 : 0);  // 2 points x 4 steps
    int bad = 0;
    for (int64_t r = 0; r < 32; ++r)
      for (int64_t c = 0; c < 64; ++c) {
        double sum = 0;
        for (int64_t s = 0; s < 4; ++s) sum += x.get({s, r, c});
        if (std::abs(got.get({r, c}) - sum) > 1e-5 && ++bad <= 3)
          ADD_FAILURE() << "[" << r << ", " << c << "]: " << got.get({r, c}) << ", want " << sum;
      }
  }
}

// Slots of whole panels (8-row groups; panel rows of 128, 64 or 32 bytes: 64, 32 or 16 bf16
// columns, the widest that divides the block's rows) that wgmma reads in place take its swizzled
// layouts: one TMA box per panel with CU_TENSOR_MAP_SWIZZLE_128B / 64B / 32B, descriptors of
// layout type 1 / 2 / 3. The slot's three writers — the TMA unit (emulated from the map), the cp.async chunks
// (TMA off) and the element-wise copy of an unaligned array (the alignment test edited to fail) —
// and its two readers — wgmma (emulated from the descriptor) and the CUDA-core loop (64 threads)
// — must agree on where each element is: each combination against a plain product. x's slots are
// two panels along K (64 x 128), y's two along N (MN-major, 128 x 128, one 128-wide wgmma across
// both), one (128 x 64, a 64-wide wgmma) or, as n x k, two along K; with K blocks of 32, x's and y's
// (32 x 32) 64-byte panels; with K blocks of 16, y as n x k (16 x 16), 32-byte panels. Without
// swizzle (CodegenOptions::swizzle) the same products
// take the no-swizzle layouts and 8-column boxes; with a descriptor edited to no swizzle, wgmma
// reads the swizzled slot wrong.
TEST(GpuCodegenOps, SlotsOfWholePanelsAreSwizzledForTmaAndWgmma) {
  auto spec = [](int operand, std::vector<uint64_t> dims, std::vector<uint64_t> strides, std::vector<uint32_t> box, int swz) {
    gpu::TensorMapSpec s;
    s.operand = operand, s.elem_bytes = 2, s.dims = std::move(dims), s.strides = std::move(strides), s.box = std::move(box);
    s.swizzle_bytes = swz;
    return s;
  };
  auto edited = [](gpu::GeneratedKernel k, const std::string& from, const std::string& to) {
    size_t at = k.source.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    for (; at != std::string::npos; at = k.source.find(from, at + to.size())) k.source.replace(at, from.size(), to);
    return k;
  };
  const int64_t M = 64, N = 128, K = 256;
  struct Case { bool b_nk; int64_t bn, bk; };
  // The widest swizzle whose panel rows (bytes) divide a slot's rows of `elems` bf16.
  auto panel_bytes = [](int64_t elems) { return 2 * elems % 128 == 0 ? 128 : 2 * elems % 64 == 0 ? 64 : 32; };
  for (Case c : {Case{false, 128, 128}, Case{true, 64, 128}, Case{false, 64, 128}, Case{false, 32, 32}, Case{true, 16, 16}}) {
    const bool b_nk = c.b_nk;
    const int64_t bn = c.bn, bk = c.bk;
    SCOPED_TRACE(std::string(b_nk ? "y n x k" : "y k x n") + ", blocks of " + std::to_string(bn) + " columns, K " + std::to_string(bk));
    auto kernel = [b_nk](const pl::Ref& x, const pl::Ref& y, const pl::Ref& z, const pl::Ref& acc) {
      pl::when(pl::program_id(1) == 0, [&] { acc[pl::all] = 0.0f; });
      acc[pl::all] += b_nk ? pl::dot_general(x[pl::all], y[pl::all], pl::DotDims{{1}, {1}, {}, {}}, DType::F32)
                           : pl::dot(x[pl::all], y[pl::all], {.preferred = DType::F32});
      pl::when(pl::program_id(1) == pl::num_programs(1) - 1, [&] { z[pl::all] = acc[pl::all]; });
    };
    const BlockSpec y_spec = b_nk ? BlockSpec({bn, bk}, [](Value j, Value k) { return Indices{j, k}; })
                                  : BlockSpec({bk, bn}, [](Value j, Value k) { return Indices{k, j}; });
    PallasCall call = pl::pallas_call(
        kernel, ShapeDtype({M, N}, DType::F32),
        opts({N / bn, K / bk}, {BlockSpec({M, bk}, [](Value, Value k) { return Indices{0, k}; }), y_spec},
             {BlockSpec({M, bn}, [](Value j, Value) { return Indices{0, j}; })},
             {ScratchShape{{M, bn}, DType::F32, MemorySpace::Vmem}}));
    const Array x = Array::random_normal({M, K}, DType::BF16, 61);
    const Array y = Array::random_normal(b_nk ? Shape{N, K} : Shape{K, N}, DType::BF16, 62);
    std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype(), y.shape_dtype()});
    const int64_t steps = (N / bn) * (K / bk);  // (one CTA point per j, K / bk steps each)
    for (bool swizzle : {true, false}) {
      SCOPED_TRACE(swizzle ? "swizzled" : "no swizzle");
      gpu::CodegenOptions options;
      options.threads_per_cta = 128;
      options.swizzle = swizzle;
      const gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, options);
      ASSERT_EQ(k.tensor_core_slots, (std::vector<int>{0, 1}));
      ASSERT_EQ(k.tma_inputs, (std::vector<int>{0, 1}));
      ASSERT_EQ(k.tensor_maps.size(), 2u);
      // Panels: x's rows are bk elements; y's bk (n x k) or bn (k x n). Layouts 3/4 for 128-byte
      // panel rows, 5/6 for 64, 7/8 for 32 (K-major / MN-major).
      const int wx = swizzle ? panel_bytes(bk) : 0, wy = swizzle ? panel_bytes(b_nk ? bk : bn) : 0;
      const uint32_t cols_x = swizzle ? wx / 2 : 8, cols_y = swizzle ? wy / 2 : 8;
      const uint32_t ubk = static_cast<uint32_t>(bk), ubn = static_cast<uint32_t>(bn);
      EXPECT_EQ(k.tensor_maps[0], spec(0, {256, 64}, {512}, {cols_x, 64}, wx));
      EXPECT_EQ(k.tensor_maps[1], b_nk ? spec(1, {256, 128}, {512}, {cols_y, ubn}, wy) : spec(1, {128, 256}, {256}, {cols_y, ubk}, wy));
      auto layout = [](int w, bool mn_major) { return std::to_string((w == 128 ? 3 : w == 64 ? 5 : 7) + (mn_major ? 1 : 0)); };
      EXPECT_EQ(k.source.find("#define PL_SLOT_LAYOUT_0 (PL_HAS_WGMMA ? " + layout(wx, false) + " : 0)") != std::string::npos, swizzle);
      EXPECT_EQ(k.source.find("#define PL_SLOT_LAYOUT_1 (PL_HAS_WGMMA ? " + layout(wy, !b_nk) + " : 0)") != std::string::npos, swizzle);
      gpu::HostEmulationStats stats;
      expect_plain_product(x, y, b_nk, DType::F32, gpu::run_host_emulation(*tc, k, {x, y}, tc->grid_mapping.grid, 128, &stats)[0]);
      EXPECT_EQ(stats.tma_boxes, steps * (bk / cols_x + (b_nk ? bk : bn) / cols_y));  // (a box per panel or chunk)
      EXPECT_GT(stats.wgmma_instructions, 0u);
      if (!swizzle) continue;
      // The other writers and reader of the same slots.
      gpu::HostEmulationStats cp;
      const gpu::GeneratedKernel by_cp_async = edited(k, "(p.tma_ok >> ", "(0 >> ");
      expect_plain_product(x, y, b_nk, DType::F32, gpu::run_host_emulation(*tc, by_cp_async, {x, y}, tc->grid_mapping.grid, 128, &cp)[0]);
      EXPECT_EQ(cp.tma_boxes, 0);
      const gpu::GeneratedKernel by_elements = edited(by_cp_async, " & 15) == 0) {\n      #pragma unroll 1", " & 15) == 99) {\n      #pragma unroll 1");
      expect_plain_product(x, y, b_nk, DType::F32, gpu::run_host_emulation(*tc, by_elements, {x, y}, tc->grid_mapping.grid, 128)[0]);
      gpu::HostEmulationStats cuda_cores;
      expect_plain_product(x, y, b_nk, DType::F32, gpu::run_host_emulation(*tc, k, {x, y}, tc->grid_mapping.grid, 64, &cuda_cores)[0]);
      EXPECT_EQ(cuda_cores.wgmma_instructions, 0u);
      const Array want = interpret::run_reference(*tc, {x, y}, tc->grid_mapping.grid, nullptr)[0];
      const Array unswizzled = gpu::run_host_emulation(*tc, edited(k, "8 * WA, WA)", "8 * WA, 0)"), {x, y}, tc->grid_mapping.grid, 128)[0];
      EXPECT_FALSE(allclose(unswizzled, want, 1e-4, 1e-3).ok) << "wgmma read a swizzled slot through no-swizzle descriptors";
    }
  }
}

// The device runtime compiled as C++ for host emulation (one thread, shared memory as an arena),
// after `defines`, with `main_source` after it; runs it and returns what it printed.
std::string run_with_device_runtime(const std::string& name, const std::string& defines, const std::string& main_source) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("pallas-" + name + "-" + std::to_string(getpid()));
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "t.cc");
    f << "#define PL_NUM_GROUPS 1\n#define PL_CTA_THREADS 1\n#define PL_ARENA_IN_SHARED 1\n" << defines
      << gpu::device_runtime_source() << main_source;
  }
  const std::string cmd = gpu::host_compiler() + " -std=c++20 -w -pthread -o '" + (dir / "t").string() + "' '" +
                          (dir / "t.cc").string() + "' 2>&1 && '" + (dir / "t").string() + "'";
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[512];
    while (fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  fs::remove_all(dir);
  return out;
}

// The 128-byte swizzle (and the 64- and 32-byte ones after it) against numbers worked out by hand
// from its definition (CUTLASS's
// Swizzle<3, 4, 3>, the pattern of CU_TENSOR_MAP_SWIZZLE_128B and of wgmma's layout type 1: the
// 16-byte chunk bits 4-6 of a byte address XOR its bits 7-9, so chunk j of 128-byte row r lands
// at chunk j ^ (r % 8)), checked in the device runtime compiled as C++: where pl_slot_elem puts a
// block's elements, which source chunk pl_slot_chunk copies into each slot chunk (cp.async), and
// where the emulated TMA unit lands a box of a swizzled map (every element once, at the same
// places).
TEST(GpuCodegenOps, TheSwizzleOfSlotsIsTheHardwares128BytePattern) {
  const std::string out = run_with_device_runtime("swizzle", "", R"(
int main() {
  // A 16 x 128 bf16 block (two 64-column panels) in a swizzled slot.
  printf("elem %lld %lld %lld %lld\n", (long long)pl_slot_elem<3>(0, 0, 16, 16), (long long)pl_slot_elem<3>(1, 0, 16, 16),
         (long long)pl_slot_elem<4>(3, 9, 16, 16), (long long)pl_slot_elem<3>(9, 70, 16, 16));
  pl_i64 r1, q1, r2, q2;
  pl_slot_chunk<3>(9, 16, 16, r1, q1);
  pl_slot_chunk<4>(138, 16, 16, r2, q2);
  printf("chunk %lld %lld %lld %lld\n", (long long)r1, (long long)q1, (long long)r2, (long long)q2);
  // A rows x cols box of a rows x cols array whose element (r, c) holds r * cols + c, landed by
  // the TMA unit with a `swizzle`-byte swizzle into dst.
  auto land = [](pl_u16* dst, int rows, int cols, int swizzle) {
    static pl_u16 src[16 * 64];
    for (int e = 0; e < rows * cols; ++e) src[e] = (pl_u16)e;
    PlTensorMap map = {};
    map.w[0] = (pl_u64)src, map.w[1] = 2, map.w[2] = 2, map.w[3] = (pl_u64)cols, map.w[4] = (pl_u64)rows;
    map.w[8] = 2 * (pl_u64)cols, map.w[12] = (pl_u64)cols | ((pl_u64)rows << 32), map.w[15] = (pl_u64)swizzle;
    static pl_u64 bar = 0;
    const int c[2] = {0, 0};
    pl_tma_load<2>(dst, &map, c, &bar);
    pl_host_land_bulk_loads(&bar);
  };
  alignas(1024) static pl_u16 slot[16 * 64];
  land(slot, 16, 64, 128);
  printf("box %u %u %u %u\n", slot[72], slot[1 * 64 + 9], slot[3 * 64 + 8 * (1 ^ 3) + 1], slot[15 * 64 + 8 * (7 ^ 7) + 7]);
  int seen[16 * 64] = {0};
  for (int e = 0; e < 16 * 64; ++e) ++seen[slot[e] % (16 * 64)];
  int once = 0;
  for (int e = 0; e < 16 * 64; ++e) once += seen[e] == 1;
  printf("once %d\n", once);
  // The 64- and 32-byte swizzles of a gpu::kernel tile's elements (bf16: rows of 32 / 16 elements).
  printf("sw64 %lld %lld sw32 %lld %lld %lld\n", (long long)pl_smem_elem<64, pl_bf16>(2 * 32 + 8),
         (long long)pl_smem_elem<64, pl_bf16>(7 * 32 + 5), (long long)pl_smem_elem<32, pl_bf16>(4 * 16 + 3),
         (long long)pl_smem_elem<32, pl_bf16>(5 * 16 + 12), (long long)pl_smem_elem<32, pl_bf16>(3 * 16 + 12));
  // An 8 x 32 box of an 8 x 32 array (element (r, c) holds r * 32 + c) landed 64-byte swizzled.
  alignas(1024) static pl_u16 tile[8 * 32];
  land(tile, 8, 32, 64);
  printf("box64 %u %u\n", tile[2 * 32], tile[7 * 32 + 3 * 8 + 2]);
})");
  // Elements: (0, 0) at byte 0; (1, 0): row 1, chunk 0 ^ 1 = 1, byte 128 + 16 = 144 (element 72);
  // (3, 9) of layout 4 (the same storage): chunk 1 ^ 3 = 2, byte 384 + 32 + 2 = 418 (209); (9, 70):
  // panel 1 (16 rows x 128 bytes = 2048), row 9, chunk 0 ^ 1 = 1, byte 2048 + 1152 + 16 + 12 =
  // 3228 (1614).
  EXPECT_CONTAINS(out, "elem 0 72 209 1614\n");
  // Chunks: slot chunk 9 is row 1's physical chunk 1, so its chunk 1 ^ 1 = 0; slot chunk 138 is
  // in panel 1 (128 chunks a panel), row 1, physical chunk 2: the row's chunk 8 + (2 ^ 1) = 11.
  EXPECT_CONTAINS(out, "chunk 1 0 1 11\n");
  // The box: element 72 holds (1, 0) = 64; position (1, 9) holds row 1's chunk 1 ^ 1 = 0, element 1:
  // (1, 1) = 65; row 3's physical chunk 1 ^ 3 = 2, element 1 holds (3, 9) = 201; row 15's chunk 0,
  // element 7 holds (15, 7 * 8 + 7) = 1023.
  EXPECT_CONTAINS(out, "box 64 65 201 1023\n");
  EXPECT_CONTAINS(out, "once 1024\n");
  // 64 bytes (Swizzle<2, 4, 3>: chunk bits 4-5 XOR bits 7-8, so chunk j of 64-byte row r lands at
  // j ^ ((r / 2) % 4)): (2, 8) is row 2's chunk 1, at 1 ^ 1 = 0: byte 128, element 64; (7, 5)
  // chunk 0 at 0 ^ 3 = 3: byte 448 + 48 + 10 = 506 (253). 32 bytes (Swizzle<1, 4, 3>: chunk bit 4
  // XOR bit 7, j ^ ((r / 4) % 2)): (4, 3) at chunk 1: byte 128 + 16 + 6 = 150 (75); (5, 12) chunk
  // 1 at 0: byte 160 + 8 = 168 (84); (3, 12) stays: element 60.
  EXPECT_CONTAINS(out, "sw64 64 253 sw32 75 84 60\n");
  // The 64-byte box: row 2's physical chunk 0 holds its chunk 1, element (2, 8) = 72; row 7's
  // physical chunk 3 holds chunk 0, so its element 2 is (7, 2) = 226.
  EXPECT_CONTAINS(out, "box64 72 226\n");
}

// After a failed point, thread 0 lets the copies still landing on the kernel's barriers land
// before it invalidates them (pl_mbar_settle), for a bounded time: here, under host emulation,
// box copies in flight on a barrier in its first phase and on one in its second (the phase that
// pl_mbar_settle must wait for is found from the barrier), and an idle barrier whose phase never
// completes (the bound, shortened to 150 ms, ends the wait). Without an error recorded it returns
// at once, landing nothing.
TEST(GpuCodegenOps, AfterAFailureCopiesInFlightLandBeforeTheBarriersGo) {
  const std::string out = run_with_device_runtime("settle", "#define PL_SETTLE_NS 150000000ull\n", R"(
#include <chrono>
int main() {
  static pl_u16 src[16 * 64];
  for (int e = 0; e < 16 * 64; ++e) src[e] = (pl_u16)(e + 1);
  PlTensorMap map = {};
  map.w[0] = (pl_u64)src, map.w[1] = 2, map.w[2] = 2, map.w[3] = 64, map.w[4] = 16;
  map.w[8] = 128, map.w[12] = 64 | (16ull << 32), map.w[15] = 0;
  const int c[2] = {0, 0};
  static pl_u64 bars[3];
  pl_mbar_init(&bars[0], 1), pl_mbar_init(&bars[1], 1), pl_mbar_init(&bars[2], 2);
  pl_mbar_arrive(&bars[1]);  // its first phase completes: the copy below is in its second
  alignas(128) static pl_u16 dst0[16 * 64], dst1[16 * 64];
  pl_expect_tx(&bars[0], 2048), pl_tma_load<2>(dst0, &map, c, &bars[0]);
  pl_expect_tx(&bars[1], 2048), pl_tma_load<2>(dst1, &map, c, &bars[1]);
  pl_i64 err[2] = {0, 0};
  auto ms = [](auto t0) {
    return (long long)std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  };
  auto t0 = std::chrono::steady_clock::now();
  pl_mbar_settle(bars, 3, err);
  printf("quiet %lld %u %u\n", ms(t0), dst0[100], dst1[100]);
  err[0] = 1;
  t0 = std::chrono::steady_clock::now();
  pl_mbar_settle(bars, 2, err);
  printf("landed %lld %u %u phases %llu %llu\n", ms(t0), dst0[100], dst1[100], (unsigned long long)(bars[0] >> 40),
         (unsigned long long)(bars[1] >> 40));
  t0 = std::chrono::steady_clock::now();
  pl_mbar_settle(bars, 3, err);
  printf("bounded %lld\n", ms(t0));
})");
  // Nothing landed (the destination reads as before: zero) and nothing waited.
  long long quiet_ms = -1;
  unsigned a = 0, b = 0;
  ASSERT_EQ(std::sscanf(out.c_str(), "quiet %lld %u %u", &quiet_ms, &a, &b), 3) << out;
  EXPECT_LT(quiet_ms, 100);
  EXPECT_NE(a, 101u);
  EXPECT_NE(b, 101u);
  // Both copies landed (element 100 holds 101) and completed their barriers' phases: the first
  // barrier's first, the second's second. Copies that land at once are not waited for the bound.
  const size_t at = out.find("landed ");
  ASSERT_NE(at, std::string::npos) << out;
  long long landed_ms = -1;
  unsigned long long p0 = 0, p1 = 0;
  ASSERT_EQ(std::sscanf(out.c_str() + at, "landed %lld %u %u phases %llu %llu", &landed_ms, &a, &b, &p0, &p1), 5) << out;
  EXPECT_EQ(a, 101u);
  EXPECT_EQ(b, 101u);
  EXPECT_EQ(p0, 1u);
  EXPECT_EQ(p1, 2u);
  EXPECT_LT(landed_ms, 100);
  // The idle barrier: waited for the bound, and no longer.
  const size_t at2 = out.find("bounded ");
  ASSERT_NE(at2, std::string::npos) << out;
  long long bounded_ms = -1;
  ASSERT_EQ(std::sscanf(out.c_str() + at2, "bounded %lld", &bounded_ms), 1) << out;
  EXPECT_GE(bounded_ms, 150);
  EXPECT_LT(bounded_ms, 5000);
}

// The kernel's parameter words (pack_params): the fixed fields, then the word of encoded maps,
// then the maps from the next 64-byte boundary, 16 words each — PlParams' layout with its
// alignas(64) PlTensorMap. A map the encoder declines (here: an address that is not 16-byte
// aligned, as the driver's and the emulation's encoders decline) leaves its bit clear. The
// driver's encoder sits behind a cache (cached_tensor_map_encoder).
TEST(GpuCodegenOps, TensorMapsFollowTheFixedParametersFromA64ByteBoundary) {
  PallasCall call = blocked_matmul(128, 64, 64, 64, 32, 16, 2);
  std::shared_ptr<const TracedCall> tc = call.trace({ShapeDtype({128, 64}, DType::F32), ShapeDtype({64, 64}, DType::F32)});
  const gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid);
  ASSERT_EQ(k.tensor_maps.size(), 2u);
  std::vector<std::pair<int, uint64_t>> asked;
  const gpu::TensorMapEncoder encode = [&](const gpu::TensorMapSpec& spec, uint64_t address, uint64_t* map) {
    asked.emplace_back(spec.operand, address);
    if (address % 16 != 0) return false;
    for (int w = 0; w < 16; ++w) map[w] = 0xA0 + static_cast<uint64_t>(w);
    return true;
  };
  const std::vector<uint64_t> words = gpu::pack_params(k, {0x1000, 0x2004, 0x3000}, 0x4000, 0x5000, 0, k.grid, encode);
  // 3 operands, workspace, error record, profile, 3 grid sizes, the number of points: 10 words;
  // the encoded bits at 10; the maps from word 16 (128 bytes).
  ASSERT_EQ(words.size(), 16u + 2 * 16);
  EXPECT_EQ(words[9], 4u);          // parallel points: (128 / 64) x (64 / 32)
  EXPECT_EQ(words[10], 1u);         // x's map encoded, y's (unaligned) not
  EXPECT_EQ(words[16], 0xA0u);      // x's map
  EXPECT_EQ(words[16 + 15], 0xAFu);
  EXPECT_EQ(words[32], 0u);         // y's: left as zeros
  EXPECT_EQ(asked, (std::vector<std::pair<int, uint64_t>>{{0, 0x1000}, {1, 0x2004}}));
  EXPECT_CONTAINS(k.source, "  pl_i64 num_points;\n  pl_u64 tma_ok;  // bit m: tmap[m] is encoded\n  PlTensorMap tmap[2];\n};");
  // Without an encoder (or without maps) no map is used.
  const std::vector<uint64_t> none = gpu::pack_params(k, {0x1000, 0x2000, 0x3000}, 0x4000, 0x5000, 0, k.grid);
  EXPECT_EQ(none[10], 0u);
  // Behind the cache (the driver's encoder is), a launch over the same arrays encodes nothing
  // again, a refusal included, and gets the same words; another address is encoded anew.
  asked.clear();
  const gpu::TensorMapEncoder cached = gpu::cached_tensor_map_encoder(encode);
  const std::vector<uint64_t> first = gpu::pack_params(k, {0x1000, 0x2004, 0x3000}, 0x4000, 0x5000, 0, k.grid, cached);
  const std::vector<uint64_t> again = gpu::pack_params(k, {0x1000, 0x2004, 0x3000}, 0x4000, 0x5000, 0, k.grid, cached);
  EXPECT_EQ(first, words);
  EXPECT_EQ(again, words);
  EXPECT_EQ(asked.size(), 2u);
  const std::vector<uint64_t> moved = gpu::pack_params(k, {0x1000, 0x2010, 0x3000}, 0x4000, 0x5000, 0, k.grid, cached);
  EXPECT_EQ(moved[10], 3u);  // y now aligned: both encoded
  EXPECT_EQ(asked, (std::vector<std::pair<int, uint64_t>>{{0, 0x1000}, {1, 0x2004}, {1, 0x2010}}));
}

// What stays out of the ring, read in place as before: a block asking for Buffered(1), an input
// aliased to an output or written by the kernel (a slot would not carry the write to the array),
// rows that are not whole 16-byte chunks. (A block that does not move along the sequential axis
// is resident since stop 50: BlocksFixedAlongTheSequentialAxisAreCopiedOncePerRun.) Each still
// computes what the interpreter does.
TEST(GpuCodegenOps, BlocksTheRingCannotCarryStayInPlace) {
  auto kernel = [](const pl::Ref& a, const pl::Ref& b, const pl::Ref& c, const pl::Ref& d, const pl::Ref& e,
                   const pl::Ref& w, const pl::Ref& o) {
    pl::when(pl::program_id(1) == 0, [&] { o[pl::all] = pl::zeros({8, 16}, DType::F32); });
    d[pl::all] = d[pl::all] * 2.0f;  // a write to an input block
    o[pl::all] = o[pl::all] + a[pl::all] + b[pl::all] + c[pl::all] + d[pl::all] + w[pl::all];
    pl::when(pl::program_id(1) == 0, [&] { o.at(pl::ds(0, 1), pl::ds(0, 2)).store({}, pl::reshape(e[pl::all], {1, 2})); });
  };
  auto moving = [](Value i, Value k) { return Indices{k, i}; };
  CallOptions o = opts({2, 3},
                       {BlockSpec({8, 16}, moving),                                           // a: pipelined
                        BlockSpec({8, 16}, [](Value i, Value) { return Indices{0, i}; }),     // b: resident
                        BlockSpec({8, 16}, moving).with_pipeline_mode(Buffered{1}),            // c: Buffered(1)
                        BlockSpec({8, 16}, moving),                                           // d: written
                        BlockSpec({2}, [](Value, Value k) { return Indices{k}; }),             // e: 8-byte rows
                        BlockSpec({8, 16}, moving)},                                          // w: aliased
                       {BlockSpec({8, 16}, [](Value i, Value) { return Indices{0, i}; }),
                        BlockSpec({8, 16}, moving)});
  o.input_output_aliases = {{5, 1}};
  auto both = [kernel](const pl::Ref& a, const pl::Ref& b, const pl::Ref& c, const pl::Ref& d, const pl::Ref& e,
                       const pl::Ref& w, const pl::Ref& out, const pl::Ref& w_out) {
    kernel(a, b, c, d, e, w, out);
    w_out[pl::all] = w_out[pl::all] + 1.0f;
  };
  PallasCall call = pl::pallas_call(both, {ShapeDtype({8, 32}, DType::F32), ShapeDtype({24, 32}, DType::F32)}, o);
  std::vector<Array> args;
  for (int s = 0; s < 6; ++s)
    args.push_back(s == 4 ? Array::random_normal({6}, DType::F32, 50 + s) : Array::random_normal({24, 32}, DType::F32, 50 + s));
  std::vector<ShapeDtype> sig;
  for (const Array& a : args) sig.push_back(a.shape_dtype());
  std::shared_ptr<const TracedCall> tc = call.trace(sig);
  gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid);
  EXPECT_EQ(k.sequential_axes, std::vector<int>{1});
  EXPECT_EQ(k.pipelined_inputs, (std::vector<int>{0, 1}));
  EXPECT_EQ(k.resident_inputs, std::vector<int>{1});
  EXPECT_EQ(k.pipeline_depth, 2);
  expect_same(call, args, 1e-6, 1e-6);
}

// A block the same at every step of the ring's axis (its index map does not read it) is resident:
// one slot, copied with the axis's first step of each run, read by every step. o += x * w over
// (i, k) with w's block chosen by i; and over (i, j, k), j and k sequential, with w's by j (the
// ring restarts at each j: w refilled). TMA on and off, against the interpreter.
TEST(GpuCodegenOps, BlocksFixedAlongTheSequentialAxisAreCopiedOncePerRun) {
  for (const bool two_sequential : {false, true}) {
    SCOPED_TRACE(two_sequential ? "(i, j, k)" : "(i, k)");
    const int last = two_sequential ? 2 : 1;
    auto body = [last](const pl::Ref& x, const pl::Ref& w, const pl::Ref& o) {
      pl::when(pl::program_id(last) == 0, [&] { o[pl::all] = pl::zeros({8, 32}, DType::F32); });
      o[pl::all] = o[pl::all] + x[pl::all] * w[pl::all];
    };
    CallOptions o;
    if (two_sequential) {
      o = opts({2, 3, 4},
               {BlockSpec({8, 32}, [](Value i, Value, Value k) { return Indices{k, i}; }),
                BlockSpec({8, 32}, [](Value, Value j, Value) { return Indices{j, 0}; })},
               {BlockSpec({8, 32}, [](Value i, Value j, Value) { return Indices{j, i}; })});
    } else {
      o = opts({2, 4}, {BlockSpec({8, 32}, [](Value i, Value k) { return Indices{k, i}; }),
                        BlockSpec({8, 32}, [](Value i, Value) { return Indices{i, 0}; })},
               {BlockSpec({8, 32}, [](Value i, Value) { return Indices{0, i}; })});
    }
    const Shape xs = Shape{32, 64}, ws = two_sequential ? Shape{24, 32} : Shape{16, 32},
                os = two_sequential ? Shape{24, 64} : Shape{8, 64};
    PallasCall call = pl::pallas_call(body, ShapeDtype(os, DType::F32), o);
    const std::vector<Array> args = {Array::random_normal(xs, DType::F32, 61), Array::random_normal(ws, DType::F32, 62)};
    std::shared_ptr<const TracedCall> tc = call.trace({args[0].shape_dtype(), args[1].shape_dtype()});
    for (const bool tma : {true, false}) {
      SCOPED_TRACE(tma ? "TMA" : "cp.async");
      gpu::CodegenOptions co;
      co.tma = tma;
      if (two_sequential) co.dimension_semantics = {"parallel", "arbitrary", "arbitrary"};
      const gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, co);
      EXPECT_EQ(k.pipelined_inputs, (std::vector<int>{0, 1}));
      EXPECT_EQ(k.resident_inputs, std::vector<int>{1});
      EXPECT_CONTAINS(k.source, "if (first) {  // (resident)");
      gpu::HostEmulationStats stats;
      gpu::run_host_emulation(*tc, k, clone_all(args), tc->grid_mapping.grid, 4, &stats);
      // x's block every step, w's once a run of k: 2 points x 4 steps + 2 (i, k); 2 x 3 x (4 + 1).
      if (tma) {
        EXPECT_EQ(stats.tma_boxes, two_sequential ? 2 * 3 * (4 + 1) : 2 * (4 + 1));
      }
      expect_same(call, args, 1e-6, 1e-6, co);
    }
  }
}

// Two sequential axes (j, k) and the register accumulator's wgmma left running into the next
// step: the last step of a run of k leaves one running, which reads its slots (x's resident slot;
// or, with K = 4 over 3 ring slots, the slot the next run's first copy refills). The next run
// waits for every warpgroup's wgmma before any copy (a helper review's repro: thousands of wrong
// elements before). TMA and cp.async, against the interpreter.
TEST(GpuCodegenOps, ARunOfTheRingAfterAnotherWaitsForTheLastWgmma) {
  for (const bool resident : {true, false}) {
    SCOPED_TRACE(resident ? "x resident" : "x moving, K = 4");
    const int64_t K = resident ? 3 : 4;
    auto body = [](const pl::Ref& x, const pl::Ref& w, const pl::Ref& o, const pl::Ref& acc) {
      pl::when(pl::program_id(1) == 0, [&] { pl::when(pl::program_id(2) == 0, [&] { acc[pl::all] = 0.0f; }); });
      acc[pl::all] = acc[pl::all] + pl::dot(x[pl::all], w[pl::all], {.preferred = DType::F32});
      pl::when(pl::program_id(1) == 1,
               [&] { pl::when(pl::program_id(2) == pl::num_programs(2) - 1, [&] { o[pl::all] = acc[pl::all]; }); });
    };
    const BlockSpec x_spec = resident ? BlockSpec({64, 64}, [](Value i, Value j, Value) { return Indices{i, j}; })
                                      : BlockSpec({64, 64}, [](Value i, Value, Value k) { return Indices{i, k}; });
    CallOptions o = opts({1, 2, K}, {x_spec, BlockSpec({64, 64}, [](Value, Value, Value k) { return Indices{k, 0}; })},
                         {BlockSpec({64, 64}, [](Value i, Value, Value) { return Indices{i, 0}; })},
                         {{{64, 64}, DType::F32, MemorySpace::Vmem}});
    PallasCall call = pl::pallas_call(body, ShapeDtype({64, 64}, DType::F32), o);
    const std::vector<Array> args = {Array::random_normal({64, resident ? 128 : 64 * K}, DType::BF16, 71),
                                     Array::random_normal({64 * K, 64}, DType::BF16, 72)};
    std::shared_ptr<const TracedCall> tc = call.trace({args[0].shape_dtype(), args[1].shape_dtype()});
    for (const bool tma : {true, false}) {
      SCOPED_TRACE(tma ? "TMA" : "cp.async");
      gpu::CodegenOptions co;
      co.tma = tma;
      co.threads_per_cta = 128;
      co.dimension_semantics = {"parallel", "arbitrary", "arbitrary"};
      const gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, co);
      EXPECT_EQ(k.register_accumulator, 0);
      EXPECT_EQ(k.resident_inputs, resident ? std::vector<int>{0} : std::vector<int>{});
      EXPECT_CONTAINS(k.source, "pl_acc_drain(pl_acc); pl_cta_sync();");
      expect_same(call, args, 2e-2, 2e-2, co, {1});
    }
  }
}

// A fused load read where its user's loop runs, past ops of values only between (a reduction
// here): the read counts there, so the later store to the same scratch waits for it (a helper
// review's repro: the store's loop wrote elements the add's loop had not read yet, at 3 and 256
// threads without register tiles).
TEST(GpuCodegenOps, FusedLoadsAreReadWhereTheirUserRuns) {
  auto kernel = [](const pl::Ref& x, const pl::Ref& o, const pl::Ref& s) {
    s[pl::all] = x[pl::all] * 2.0f;
    pl::Value a = s[pl::all];
    pl::Value m = pl::sum(x[pl::all], {1}, true);
    pl::Value t = a + m;
    s(pl::all, pl::ds(0, 64)) = pl::zeros({64, 64}, DType::F32);
    o[pl::all] = t + pl::sum(t, {1}, true);
  };
  PallasCall call = pl::pallas_call(kernel, ShapeDtype({64, 128}, DType::F32),
                                    opts({}, {}, {}, {{{64, 128}, DType::F32, MemorySpace::Vmem}}));
  const Array x = Array::random_normal({64, 128}, DType::F32, 5);
  for (int rep = 0; rep < 3; ++rep) expect_same(call, {x}, 1e-5, 1e-4, {}, {3, 256});
}

// gpu::CompilerParams::max_concurrent_steps is the ring's depth for inputs without a Buffered(count)
// of their own (Mosaic GPU's knob): 3 slots, or 1 (no ring); a BlockSpec's Buffered(4) still wins.
// A cluster for a pallas_call, and a depth below 1, are errors.
TEST(GpuCodegenOps, MaxConcurrentStepsSetsThePipelineDepth) {
  auto kernel = [](const pl::Ref& a, const pl::Ref& b, const pl::Ref& o) {
    pl::when(pl::program_id(1) == 0, [&] { o[pl::all] = pl::zeros({8, 16}, DType::F32); });
    o[pl::all] = o[pl::all] + a[pl::all] * 2.0f + b[pl::all];
  };
  auto moving = [](Value i, Value k) { return Indices{k, i}; };
  const std::vector<Array> args = {Array::random_normal({40, 32}, DType::F32, 7), Array::random_normal({40, 32}, DType::F32, 8)};
  struct Case { std::optional<int> steps; std::optional<int> b_buffers; int depth; std::vector<int> pipelined; };
  for (const Case& c : {Case{std::nullopt, std::nullopt, 2, {0, 1}}, Case{3, std::nullopt, 3, {0, 1}}, Case{1, std::nullopt, 0, {}},
                        Case{1, 4, 4, {1}}}) {
    SCOPED_TRACE(c.steps ? *c.steps : -1);
    BlockSpec b_spec({8, 16}, moving);
    if (c.b_buffers) b_spec = b_spec.with_pipeline_mode(Buffered{*c.b_buffers});
    CallOptions o = opts({2, 5}, {BlockSpec({8, 16}, moving), b_spec}, {BlockSpec({8, 16}, [](Value i, Value) { return Indices{0, i}; })});
    gpu::CompilerParams params;
    params.max_concurrent_steps = c.steps;
    o.compiler_params = params;
    PallasCall call = pl::pallas_call(kernel, ShapeDtype({8, 32}, DType::F32), o);
    std::shared_ptr<const TracedCall> tc = call.trace({args[0].shape_dtype(), args[1].shape_dtype()});
    const gpu::CodegenOptions co = gpu::codegen_options(CompilerParamsMap{{"mosaic_gpu", params}});
    gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid, co);
    EXPECT_EQ(k.pipelined_inputs, c.pipelined);
    EXPECT_EQ(k.pipeline_depth, c.depth);
    expect_same(call, args, 1e-6, 1e-6, co);
  }
  for (auto [params, message] :
       {std::pair{gpu::CompilerParams{.cluster = std::vector<int64_t>{2}}, "not supported yet: gpu::CompilerParams::cluster (clusters of a pallas_call's CTAs)"},
        std::pair{gpu::CompilerParams{.max_concurrent_steps = 0}, "gpu::CompilerParams::max_concurrent_steps must be at least 1 (1: no pipeline), got 0"}}) {
    CallOptions o = opts({2, 5}, {BlockSpec({8, 16}, moving), BlockSpec({8, 16}, moving)}, {BlockSpec({8, 16}, [](Value i, Value) { return Indices{0, i}; })});
    o.compiler_params = params;
    EXPECT_CONTAINS(test_util::error_of([&] { pl::pallas_call(kernel, ShapeDtype({8, 32}, DType::F32), o); }), message);
  }
}

// `acc[...] += dot(x, y)` in f32 accumulates in place: the product is not a tile added to acc
// afterwards, the dot adds to acc (pl_tc_dot's accumulate flag; the CUDA-core loop adds its sum
// to the element). Either operand order of the add; not into a bf16 accumulator (the rounding of
// the separate product would change).
TEST(GpuCodegenOps, AnAccumulatorPlusADotIsAccumulatedInPlace) {
  struct Case { DType acc; bool dot_first; };
  for (Case c : {Case{DType::F32, false}, Case{DType::F32, true}, Case{DType::BF16, false}}) {
    SCOPED_TRACE(std::string(dtype_name(c.acc)) + (c.dot_first ? ", dot + acc" : ", acc + dot"));
    auto kernel = [c](const pl::Ref& x, const pl::Ref& y, const pl::Ref& o, const pl::Ref& acc) {
      pl::when(pl::program_id(0) == 0, [&] { acc[pl::all] = pl::zeros({32, 16}, c.acc); });
      pl::Value p = pl::dot(x[pl::all], y[pl::all], {.preferred = c.acc});
      acc[pl::all] = c.dot_first ? p + acc[pl::all] : acc[pl::all] + p;
      o[pl::all] = acc[pl::all];
    };
    PallasCall call = pl::pallas_call(
        kernel, ShapeDtype({32, 16}, c.acc),
        opts({3}, {BlockSpec({32, 16}, [](Value k) { return Indices{0, k}; }), BlockSpec({16, 16}, [](Value k) { return Indices{k, 0}; })},
             {BlockSpec({32, 16}, [](Value) { return Indices{0, 0}; })}, {ScratchShape{{32, 16}, c.acc, MemorySpace::Vmem}}));
    const std::vector<Array> args = {Array::random_normal({32, 48}, DType::BF16, 61), Array::random_normal({48, 16}, DType::BF16, 62)};
    std::shared_ptr<const TracedCall> tc = call.trace({args[0].shape_dtype(), args[1].shape_dtype()});
    gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid);
    const bool in_place = c.acc == DType::F32;
    EXPECT_EQ(count_of(k.source, "(part of the dot's accumulation in place)"), in_place ? 3 : 0);
    EXPECT_EQ(count_of(k.source, "16, 48, true)) {") + count_of(k.source, "16, 16, true)) {"), in_place ? 1 : 0);
    expect_same(call, args, 1e-5, c.acc == DType::BF16 ? 2e-2 : 1e-5);
  }
}

// The thread loops of a generated kernel's body (the grid point function).
int body_loops(const gpu::GeneratedKernel& k) {
  const size_t from = k.source.find("PL_DEV bool pl_grid_point");
  const std::string body = k.source.substr(from, k.source.find("\nPL_DEV void pl_cta(", from) - from);
  return count_of(body, "for (pl_i64 e");  // `e = ` rolled, `e0 = ` batched (batched_store_loop)
}

TEST(GpuCodegenOps, ElementwiseChainsAndAnAccumulationFuseIntoOneLoop) {
  // bf16: each op of the chain rounds its own result, fused or not (bit-exact against the
  // interpreter). o = o + (x * 2 + 1) along a sequential axis.
  auto kernel = [](const pl::Ref& x, const pl::Ref& o) {
    pl::when(pl::program_id(0) == 0, [&] { o[pl::all] = pl::zeros({8, 16}, DType::BF16); });
    o[pl::all] = o[pl::all] + (x[pl::all] * 2.0f + 1.0f);
  };
  PallasCall call = pl::pallas_call(kernel, ShapeDtype({8, 16}, DType::BF16),
                                    opts({3}, {BlockSpec({8, 16}, [](Value i) { return Indices{i, 0}; })},
                                         {BlockSpec({8, 16}, [](Value) { return Indices{0, 0}; })}));
  std::shared_ptr<const TracedCall> tc = call.trace({ShapeDtype({24, 16}, DType::BF16)});
  gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid);
  // The zeros into their store; everything else into the accumulating store, which reads and
  // writes the same view of o and reads x, another operand (without fusion: ten loops).
  EXPECT_EQ(body_loops(k), 2) << k.source.substr(k.source.find("PL_DEV bool pl_grid_point"));
  expect_same(call, {Array::random_normal({24, 16}, DType::BF16, 18)});
}

TEST(GpuCodegenOps, TheGridSizesAreConstantsOfTheSourceItRunsWith) {
  auto kernel = [](const pl::Ref& x, const pl::Ref& o) {
    o[pl::all] = x[pl::all] * pl::convert(pl::num_programs(0), DType::F32) + pl::convert(pl::program_id(0), DType::F32);
  };
  auto row = [](Value i) { return Indices{i, 0}; };
  std::vector<std::string> sources;
  for (int64_t blocks : {2, 5}) {
    PallasCall call = pl::pallas_call(kernel, ShapeDtype({8 * blocks, 8}, DType::F32),
                                      opts({blocks}, {BlockSpec({8, 8}, row)}, {BlockSpec({8, 8}, row)}));
    expect_same(call, {Array::random_normal({8 * blocks, 8}, DType::F32, 23)});
    std::shared_ptr<const TracedCall> tc = call.trace({ShapeDtype({8 * blocks, 8}, DType::F32)});
    gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid);
    EXPECT_CONTAINS(k.source, "const pl_i64 G[1] = {" + std::to_string(blocks) + "};");
    // A launch with other sizes than the source's is a bug of the caller, caught before it runs.
    std::string why;
    try {
      gpu::pack_params(k, {0, 0}, 0, 0, 0, {blocks + 1});
    } catch (const InternalError& e) {
      why = e.what();
    }
    EXPECT_CONTAINS(why, "generated for grid [" + std::to_string(blocks) + "]");
    sources.push_back(k.source);
  }
  EXPECT_NE(sources[0], sources[1]);
}

TEST(GpuCodegenOps, LoadsFuseOnlyWhereNoOtherThreadCanWriteWhatTheyRead) {
  auto kernel = [](const pl::Ref& x, const pl::Ref& o, const pl::Ref& p) {
    o[pl::all] = x[pl::all];
    // Rows shift up: the store's view is not the load's, so another thread may overwrite a row
    // before it is read — the load needs its own loop and a barrier.
    o.at(pl::ds(0, 7), pl::ds(0, 16)).store({}, o.at(pl::ds(1, 7), pl::ds(0, 16)).load() + 1.0f);
    // A store between the load and the loop that would read it.
    pl::Value v = o[pl::all];
    o[pl::all] = pl::zeros({8, 16}, DType::F32);
    pl::Value w = pl::exp(v);
    p[pl::all] = w + w;
  };
  auto row = [](Value i) { return Indices{i, 0}; };
  PallasCall call = pl::pallas_call(kernel, {ShapeDtype({24, 16}, DType::F32), ShapeDtype({24, 16}, DType::F32)},
                                    opts({3}, {BlockSpec({8, 16}, row)}, {BlockSpec({8, 16}, row), BlockSpec({8, 16}, row)}));
  std::shared_ptr<const TracedCall> tc = call.trace({ShapeDtype({24, 16}, DType::F32)});
  gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid);
  // In order: x's load (another operand's memory, which the store to o cannot reach: fused), the
  // shifted load of o, the load of o before the store of zeros.
  EXPECT_EQ(fused_loads(k.source), (std::vector<bool>{true, false, false}))
      << k.source.substr(k.source.find("PL_DEV bool pl_grid_point"));
  expect_same(call, {Array::random_normal({24, 16}, DType::F32, 19)}, 1e-6, 1e-6);
}

TEST(GpuCodegenOps, AStagedBlockThatNeverReachesTheEdgeIsReadInPlace) {
  // x is (3, 20, 16), ragged along its rows for blocks of 8, but the grid only visits the first
  // two row blocks: every point's block lies inside, so nothing is staged or tested at run time.
  // The first dim is squeezed (the block is a (8, 16) view of plane p).
  auto kernel = [](const pl::Ref& x, const pl::Ref& o) { o[pl::all] = x[pl::all] + 1.0f; };
  PallasCall call = pl::pallas_call(
      kernel, ShapeDtype({3, 16, 16}, DType::F32),
      opts({3, 2}, {BlockSpec({pl::squeezed, 8, 16}, [](Value p, Value i) { return Indices{p, i, 0}; })},
           {BlockSpec({pl::squeezed, 8, 16}, [](Value p, Value i) { return Indices{p, i, 0}; })}));
  std::shared_ptr<const TracedCall> tc = call.trace({ShapeDtype({3, 20, 16}, DType::F32)});
  const std::string src = gpu::generate_cuda(*tc, tc->grid_mapping.grid).source;
  const std::string body = src.substr(src.find("PL_DEV bool pl_grid_point"));
  EXPECT_EQ(count_of(body, "blk0_in_place[e]"), 1) << body;
  EXPECT_EQ(count_of(body, "p.op[0])["), 0) << body;  // no staging loop
  EXPECT_EQ(count_of(body, "for (pl_i64 e"), 1) << body;
  expect_same(call, {Array::random_normal({3, 20, 16}, DType::F32, 35)});
}

TEST(GpuCodegenOps, LoadsOfOtherOperandsFuseIntoAStoreUnlessAliasedToIt) {
  auto row = [](Value i) { return Indices{i, 0}; };
  auto kernel = [](const pl::Ref& x, const pl::Ref& y, const pl::Ref& o) {
    pl::Value twice = x[pl::all] * 2.0f;  // (statements: x is loaded first)
    o[pl::all] = twice + y[pl::all];
  };
  for (int64_t rows : {24, 20}) {  // blocks in place; and staged, the last one hanging over the edge
    PallasCall call = pl::pallas_call(kernel, ShapeDtype({rows, 16}, DType::F32),
                                      opts({3}, {BlockSpec({8, 16}, row), BlockSpec({8, 16}, row)}, {BlockSpec({8, 16}, row)}));
    std::shared_ptr<const TracedCall> tc = call.trace({ShapeDtype({rows, 16}, DType::F32), ShapeDtype({rows, 16}, DType::F32)});
    const std::string src = gpu::generate_cuda(*tc, tc->grid_mapping.grid).source;
    const std::string body = src.substr(src.find("PL_DEV bool pl_grid_point"));
    // Staged, the body is there twice: in place for the points whose blocks lie inside the arrays
    // (only the rows can overhang: the columns' test is left out), staged for the edge.
    const std::vector<bool> fused = fused_loads(src);
    EXPECT_EQ(fused, std::vector<bool>(rows == 24 ? 2 : 4, true)) << body;
    EXPECT_EQ(count_of(body, "if (st0[0] + 8 <= 20 && st1[0] + 8 <= 20 && st2[0] + 8 <= 20) {"), rows == 24 ? 0 : 1)
        << body;
    EXPECT_EQ(count_of(body, "blk2_in_place[e] = "), rows == 24 ? 0 : 1) << body;
    // In place the body is one loop; staged, three loops bring x and y in and take o out, and o's
    // block starts as the uninitialized value (a fourth loop) instead of being read from the array.
    EXPECT_EQ(count_of(body, "for (pl_i64 e"), rows == 24 ? 1 : 6) << body;
    EXPECT_EQ(count_of(body, "p.op[2])["), rows == 24 ? 0 : 1) << body;
    // Batched (a batch of values read, then written): the stores, and the staging but the fill.
    EXPECT_EQ(count_of(body, "pl_v[u] = "), rows == 24 ? 1 : 5) << body;
    expect_same(call, {Array::random_normal({rows, 16}, DType::F32, 31), Array::random_normal({rows, 16}, DType::F32, 32)});
  }
  // x aliased to o: the same memory, so x's load keeps its loop (and the aliased output's staged
  // block is read in: the kernel may leave part of it as the input had it).
  CallOptions o = opts({3}, {BlockSpec({8, 16}, row), BlockSpec({8, 16}, row)}, {BlockSpec({8, 16}, row)});
  o.input_output_aliases = {{0, 0}};
  PallasCall aliased = pl::pallas_call(kernel, ShapeDtype({20, 16}, DType::F32), o);
  std::shared_ptr<const TracedCall> tc = aliased.trace({ShapeDtype({20, 16}, DType::F32), ShapeDtype({20, 16}, DType::F32)});
  const std::string src = gpu::generate_cuda(*tc, tc->grid_mapping.grid).source;
  EXPECT_EQ(fused_loads(src), (std::vector<bool>{false, true, false, true}))
      << src.substr(src.find("PL_DEV bool pl_grid_point"));
  EXPECT_EQ(count_of(src.substr(src.find("PL_DEV bool pl_grid_point")), "p.op[2])["), 2);
  expect_same(aliased, {Array::random_normal({20, 16}, DType::F32, 33), Array::random_normal({20, 16}, DType::F32, 34)});
}

// Both runs must fail, the generated kernel with exactly the reference interpreter's message
// (which must contain `expected`).
void expect_same_error(const PallasCall& call, const std::vector<Array>& args, const std::string& expected) {
  std::shared_ptr<const TracedCall> tc = call.trace({args[0].shape_dtype()});
  std::string want =
      test_util::error_of([&] { interpret::run_reference(*tc, clone_all(args), tc->grid_mapping.grid, nullptr); });
  ASSERT_NE(want.find(expected), std::string::npos) << want;
  gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid);
  EXPECT_EQ(test_util::error_of([&] { gpu::run_host_emulation(*tc, k, clone_all(args), tc->grid_mapping.grid, 3); }),
            want);
}

TEST(GpuCodegenOps, DebugPrintShowsScalarsAndArraysAsTheInterpreterDoes) {
  // Scalars and arrays of several ranks and dtypes — a loaded tile, a fused expression, a 3-D
  // reshape, a bool comparison, an array past 1000 elements (summarized with "...") — printed at
  // each of 2 grid points. Values are small multiples of 0.25 and integers, whose %.9g text is
  // the interpreter's shortest text, so the outputs must be equal character for character.
  auto kernel = [](const pl::Ref& x, const pl::Ref& big, const pl::Ref& o) {
    pl::Value t = x[pl::all];
    pl::debug_print("point {}: x[0, 1] = {}\nx = {}", {pl::program_id(0), x(0, 1), t});
    pl::debug_print("twice {} | ints {} | positive {}",
                    {x(pl::all, pl::all) * 2.0f, pl::reshape(t.astype(DType::I32), {2, 2, 2}), t > 0.0f});
    pl::debug_print("big {} end", {big[pl::all]});
    o[pl::all] = t;
  };
  Array x = Array::zeros({2, 4}, DType::F32), big = Array::zeros({40, 50}, DType::F32);
  for (int64_t i = 0; i < 8; ++i) x.set_flat(i, 0.25 * (double)(i * 7 % 11) - 1.0);
  for (int64_t i = 0; i < 2000; ++i) big.set_flat(i, (double)(i % 97) - 40.0);
  PallasCall call = pl::pallas_call(kernel, ShapeDtype({2, 4}, DType::F32),
                                    opts({2}, {BlockSpec({2, 4}, [](Value) { return Indices{0, 0}; }),
                                               BlockSpec({40, 50}, [](Value) { return Indices{0, 0}; })},
                                         {BlockSpec({2, 4}, [](Value) { return Indices{0, 0}; })}));
  std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype(), big.shape_dtype()});
  const std::vector<int64_t> grid = tc->grid_mapping.grid;
  std::ostringstream want;
  interpret::run_reference(*tc, {x.clone(), big.clone()}, grid, &want);
  ASSERT_NE(want.str().find("..."), std::string::npos) << want.str();  // the big one is summarized
  ASSERT_NE(want.str().find("[[[-1, "), std::string::npos) << want.str();
  gpu::GeneratedKernel k = gpu::generate_cuda(*tc, grid);
  for (int threads : {1, 3}) {
    testing::internal::CaptureStdout();
    gpu::run_host_emulation(*tc, k, {x.clone(), big.clone()}, grid, threads);
    EXPECT_EQ(testing::internal::GetCapturedStdout(), want.str()) << threads << " threads";
  }
  if (std::string why = gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  for (const char* arch : {"sm_90a", "sm_80"})
    EXPECT_TRUE(gpu::Nvrtc::get().compile(k.source, "print.cu", arch).is_cubin) << arch;
}

TEST(GpuCodegenOps, OutOfBoundsBlockIndexIsTheInterpretersError) {
  auto kernel = [](const pl::Ref& x, const pl::Ref& o) { o[pl::all] = x[pl::all]; };
  PallasCall call = pl::pallas_call(kernel, ShapeDtype({16, 8}, DType::F32),
                                    opts({2}, {BlockSpec({8, 8}, [](Value i) { return Indices{i + 1, 0}; })},
                                         {BlockSpec({8, 8}, [](Value i) { return Indices{i, 0}; })}));
  expect_same_error(call, {Array::random_normal({16, 8}, DType::F32, 18)}, "Out-of-bounds block index (2, 0)");
}

TEST(GpuCodegenOps, BlockIndexChecksAreLeftOutOnlyWhereTheGridKeepsThemInBounds) {
  auto kernel = [](const pl::Ref& x, const pl::Ref& o) { o[pl::all] = x[pl::all]; };
  auto checks = [](const PallasCall& call) {
    std::shared_ptr<const TracedCall> tc = call.trace({ShapeDtype({16, 8}, DType::F32)});
    const std::string src = gpu::generate_cuda(*tc, tc->grid_mapping.grid).source;
    int n = 0;
    for (size_t at = src.find("pl_fail(p.err, "); at != std::string::npos; at = src.find("pl_fail(p.err, ", at + 1)) ++n;
    return n;
  };
  auto row = [](Value i) { return Indices{i, 0}; };
  // (i, 0) over a grid of 2 row blocks: in bounds whatever i is — no check is generated.
  PallasCall fits = pl::pallas_call(kernel, ShapeDtype({16, 8}, DType::F32),
                                    opts({2}, {BlockSpec({8, 8}, row)}, {BlockSpec({8, 8}, row)}));
  EXPECT_EQ(checks(fits), 0);
  expect_same(fits, {Array::random_normal({16, 8}, DType::F32, 20)});
  // The same maps over a grid of 3, and a constant column block past the edge: checked, and
  // failing as the interpreter does.
  PallasCall past = pl::pallas_call(kernel, ShapeDtype({16, 8}, DType::F32),
                                    opts({3}, {BlockSpec({8, 8}, row)}, {BlockSpec({8, 8}, row)}));
  EXPECT_EQ(checks(past), 2);
  expect_same_error(past, {Array::random_normal({16, 8}, DType::F32, 21)}, "Out-of-bounds block index (2, 0)");
  PallasCall column = pl::pallas_call(kernel, ShapeDtype({16, 8}, DType::F32),
                                      opts({2}, {BlockSpec({8, 8}, [](Value i) { return Indices{i, 1}; })},
                                           {BlockSpec({8, 8}, row)}));
  EXPECT_EQ(checks(column), 1);
  expect_same_error(column, {Array::random_normal({16, 8}, DType::F32, 22)}, "Out-of-bounds block index (0, 1)");
}

TEST(GpuCodegenOps, OutOfBoundsDynamicRefIndexNamesTheOpAndLine) {
  auto kernel = [](const pl::Ref& x, const pl::Ref& o) {
    o[pl::all] = x.at(pl::ds(pl::program_id(0) * 6, 8)).load();  // point 1 reads rows 6..13 of 8
  };
  PallasCall call = pl::pallas_call(kernel, ShapeDtype({8, 4}, DType::F32), opts({2}, {}, {}));
  expect_same_error(call, {Array::random_normal({8, 4}, DType::F32, 19)},
                    "ref index out of bounds: slice of 8 elements from 6 (stride 1) in dimension 0 of size 8");
}

// A kernel that writes its input block (not aliased to an output): the block is staged at every
// point, so the write changes neither the caller's array nor what other points (CTAs running at
// once) read. Every point of this grid shares x's one block: each sees x, doubles it, stores 2x.
// (The interpreters keep a block whose index repeats at the next point, write included, as
// Pallas' TPU pipeline does not copy it again: there the points see 2x, 4x, 8x, 16x. GPU.md.)
TEST(GpuCodegenOps, AWrittenInputBlockStartsFromTheArrayAtEveryPoint) {
  auto kernel = [](const pl::Ref& x, const pl::Ref& o) {
    x[pl::all] = x[pl::all] * 2.0f;
    o[pl::all] = x[pl::all];
  };
  PallasCall call = pl::pallas_call(kernel, ShapeDtype({32, 128}, DType::F32),
                                    opts({4}, {BlockSpec({8, 128}, [](Value) { return Indices{0, 0}; })},
                                         {BlockSpec({8, 128}, [](Value i) { return Indices{i, 0}; })}));
  const Array x = Array::random_normal({8, 128}, DType::F32, 5);
  std::shared_ptr<const TracedCall> tc = call.trace({x.shape_dtype()});
  gpu::GeneratedKernel k = gpu::generate_cuda(*tc, tc->grid_mapping.grid);
  for (int threads : {1, 3}) {
    const Array arg = x.clone();
    const Array got = gpu::run_host_emulation(*tc, k, {arg}, tc->grid_mapping.grid, threads)[0];
    for (int64_t r = 0; r < 32; ++r)
      for (int64_t c = 0; c < 128; ++c) ASSERT_EQ(got.get({r, c}), 2 * x.get({r % 8, c})) << r << "," << c;
    for (int64_t e = 0; e < x.size(); ++e) ASSERT_EQ(arg.data<float>()[e], x.data<float>()[e]) << "the input changed at " << e;
  }
}

// The bounds of teams wider than a warp: pl_reduce_team gives 64 threads or more to each result
// whenever 64 x results <= threads and the count is at least 64 — up to 16 results, from 64
// elements — and those teams must meet in scratch (a warp's butterfly alone leaves each warp its
// own partial). 16 rows of 64 and 100 elements at 1024 threads (teams of 64), one result of 100
// elements at 128 threads (a team of 64, then of 128 at 1024).
TEST(GpuCodegenOps, TeamsWiderThanAWarpMeetAtTheirBounds) {
  auto kernel = [](const pl::Ref& x, const pl::Ref& rows, const pl::Ref& narrow, const pl::Ref& one, const pl::Ref& arg) {
    pl::Value v = x[pl::all];  // (16, 100)
    rows[pl::all] = pl::sum(v, {1});
    narrow[pl::all] = pl::max(pl::slice(v, {0, 0}, {16, 64}), {1});
    one[pl::all] = pl::sum(pl::slice(v, {3, 0}, {4, 100}), {0, 1});
    arg[pl::all] = pl::argmin(v, 1, DType::I32);
  };
  PallasCall call = pl::pallas_call(kernel,
                                    {ShapeDtype({16}, DType::I32), ShapeDtype({16}, DType::I32), ShapeDtype({}, DType::I32),
                                     ShapeDtype({16}, DType::I32)},
                                    opts({}, {}, {}));
  Array x = Array::random_normal({16, 100}, DType::I32, 3, 0, 50);
  expect_same(call, {x}, 0, 0, {}, {128, 1024});
}

}  // namespace
}  // namespace pallas
