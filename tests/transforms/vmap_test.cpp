// pl::vmap against the unbatched call run once per batch element (itself tested against
// independent references elsewhere), on the reference interpreter, the TPU interpret mode and
// gpu_emulate (the GPU backend's generated CUDA, run on the host).
// The per-element slicing and stacking here is element by element, independent of vmap's own.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "tests/test_util.h"
#include "pallas/pallas.h"
#include "pallas/tpu.h"

namespace pl = pallas;
namespace pltpu = pallas::tpu;

namespace {

using test_util::error_of;

pl::Array random_f32(pl::Shape s, uint64_t seed) {
  return pl::Array::random_normal(std::move(s), pl::f32, seed);
}

// Every multi-index of `shape`, row-major.
void for_each_index(const pl::Shape& shape, const std::function<void(std::vector<int64_t>&)>& f) {
  for (int64_t d : shape)
    if (d == 0) return;
  std::vector<int64_t> idx(shape.size(), 0);
  while (true) {
    f(idx);
    int k = static_cast<int>(shape.size()) - 1;
    while (k >= 0 && ++idx[k] == shape[k]) idx[k--] = 0;
    if (k < 0) return;
  }
}

pl::Array slice_at(const pl::Array& a, int axis, int64_t b) {
  pl::Shape s = a.shape();
  s.erase(s.begin() + axis);
  pl::Array out(s, a.dtype());
  for_each_index(s, [&](std::vector<int64_t>& i) {
    std::vector<int64_t> src = i;
    src.insert(src.begin() + axis, b);
    out.set(i, a.get(src));
  });
  return out;
}

pl::Array stack_at(const std::vector<pl::Array>& parts, int axis) {
  pl::Shape s = parts.at(0).shape();
  s.insert(s.begin() + axis, static_cast<int64_t>(parts.size()));
  pl::Array out(s, parts[0].dtype());
  for_each_index(s, [&](std::vector<int64_t>& i) {
    std::vector<int64_t> src = i;
    int64_t b = src[axis];
    src.erase(src.begin() + axis);
    out.set(i, parts[b].get(src));
  });
  return out;
}

// The unbatched call run per batch element, outputs stacked at out_axes.
std::vector<pl::Array> per_element(const pl::PallasCall& call, const std::vector<pl::Array>& args,
                                   const std::vector<std::optional<int>>& in_axes,
                                   std::vector<int> out_axes, int64_t size) {
  std::vector<std::vector<pl::Array>> outs;
  for (int64_t b = 0; b < size; ++b) {
    std::vector<pl::Array> a;
    for (size_t i = 0; i < args.size(); ++i)
      a.push_back(in_axes[i] ? slice_at(args[i], (*in_axes[i] + args[i].rank()) % args[i].rank(), b)
                             : args[i].clone());
    std::vector<pl::Array> o = call(a);
    if (outs.empty()) outs.resize(o.size());
    for (size_t k = 0; k < o.size(); ++k) outs[k].push_back(o[k]);
  }
  if (out_axes.empty()) out_axes.assign(outs.size(), 0);
  std::vector<pl::Array> result;
  for (size_t k = 0; k < outs.size(); ++k) {
    const int rank = outs[k].at(0).rank() + 1;
    result.push_back(stack_at(outs[k], (out_axes[k] + rank) % rank));
  }
  return result;
}

void expect_same(const std::vector<pl::Array>& actual, const std::vector<pl::Array>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t k = 0; k < actual.size(); ++k) {
    EXPECT_EQ(actual[k].shape_dtype(), expected[k].shape_dtype()) << "output " << k;
    if (actual[k].shape_dtype() == expected[k].shape_dtype()) {
      pl::AllCloseResult r = pl::allclose(actual[k], expected[k], 0, 0);
      EXPECT_TRUE(r.ok) << "output " << k << ": " << r.message;
    }
  }
}

std::vector<pl::Array> clones(const std::vector<pl::Array>& a) {
  std::vector<pl::Array> out;
  for (const pl::Array& x : a) out.push_back(x.clone());
  return out;
}

// Runs the vmapped call and the per-element loop on the same (cloned) arguments.
void check_vmap(const pl::PallasCall& call, const std::vector<pl::Array>& args,
                const std::vector<std::optional<int>>& in_axes, const std::vector<int>& out_axes,
                int64_t size, int64_t axis_size = -1) {
  pl::PallasCall batched = pl::vmap(call, in_axes, out_axes, axis_size);
  std::vector<pl::Array> actual = batched(clones(args));
  expect_same(actual, per_element(call, clones(args), in_axes, out_axes, size));
}

// The options' fields that choose where a call runs: "reference" (the reference interpreter),
// "tpu_interpret" (the TPU interpret mode) or "gpu_emulate" (the generated CUDA, run on the host).
pl::InterpretMode interpret_on(const std::string& where) {
  if (where == "tpu_interpret") return pltpu::InterpretParams{};
  return pl::InterpretMode(where == "reference");
}
std::optional<std::string> backend_on(const std::string& where) {
  return where == "gpu_emulate" ? std::optional<std::string>(where) : std::nullopt;
}

class Vmap : public ::testing::TestWithParam<std::string> {
 protected:
  pl::InterpretMode mode() const { return interpret_on(GetParam()); }
  std::optional<std::string> backend() const { return backend_on(GetParam()); }
};

pl::PallasCall add_call(const std::string& where = "reference") {
  return pl::pallas_call(
      [](pl::Ref x, pl::Ref y, pl::Ref o) { o[pl::all] = x[pl::all] + y[pl::all]; },
      pl::ShapeDtype({32, 64}, pl::f32),
      {.grid = {4, 2},
       .in_specs = {pl::BlockSpec({8, 32}, [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; }),
                    pl::BlockSpec({8, 32}, [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; })},
       .out_specs = {pl::BlockSpec({8, 32}, [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; })},
       .interpret = interpret_on(where),
       .backend = backend_on(where)});
}

// z = x @ y with a (m, n, k) grid accumulating into the output block.
pl::PallasCall matmul_call(const std::string& where = "reference") {
  return pl::pallas_call(
      [](pl::Ref x, pl::Ref y, pl::Ref z) {
        pl::when(pl::program_id(2) == 0, [&] { z[pl::all] = pl::full({16, 8}, pl::f32, 0.0); });
        z[pl::all] = z[pl::all] + pl::dot(x[pl::all], y[pl::all]);
      },
      pl::ShapeDtype({32, 24}, pl::f32),
      {.grid = {2, 3, 2},
       .in_specs = {pl::BlockSpec({16, 8}, [](pl::Value i, pl::Value, pl::Value k) { return pl::Indices{i, k}; }),
                    pl::BlockSpec({8, 8}, [](pl::Value, pl::Value j, pl::Value k) { return pl::Indices{k, j}; })},
       .out_specs = {pl::BlockSpec({16, 8}, [](pl::Value i, pl::Value j, pl::Value) { return pl::Indices{i, j}; })},
       .interpret = interpret_on(where),
       .backend = backend_on(where)});
}

}  // namespace

INSTANTIATE_TEST_SUITE_P(Modes, Vmap, ::testing::Values("reference", "tpu_interpret", "gpu_emulate"),
                         [](const auto& info) { return info.param; });

TEST_P(Vmap, ElementwiseAddWithGrid) {
  pl::PallasCall call = add_call(GetParam());
  check_vmap(call, {random_f32({3, 32, 64}, 1), random_f32({3, 32, 64}, 2)}, {0, 0}, {}, 3);
}

TEST_P(Vmap, MatmulWithAnUnbatchedOperand) {
  pl::PallasCall call = matmul_call(GetParam());
  check_vmap(call, {random_f32({4, 32, 16}, 3), random_f32({16, 24}, 4)}, {0, std::nullopt}, {}, 4);
  check_vmap(call, {random_f32({32, 16}, 5), random_f32({16, 24, 2}, 6)}, {std::nullopt, 2}, {}, 2);
}

TEST_P(Vmap, ProgramIdAndNumProgramsReferToTheOriginalAxes) {
  auto kernel = [](pl::Ref x, pl::Ref o) {
    pl::Value code = pl::program_id(0) * 100 + pl::program_id(1) * 10 + pl::num_programs(0) * 1000 +
                     pl::num_programs(1) * 10000;
    o[pl::all] = x[pl::all] + code.astype(pl::f32);
  };
  pl::PallasCall call = pl::pallas_call(
      kernel, pl::ShapeDtype({16, 24}, pl::f32),
      {.grid = {2, 3},
       .in_specs = {pl::BlockSpec({8, 8}, [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; })},
       .out_specs = {pl::BlockSpec({8, 8}, [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; })},
       .interpret = mode(),
       .backend = backend()});
  pl::Array xs = pl::Array::zeros({5, 16, 24}, pl::f32);
  pl::Array o = pl::vmap(call, {0})(xs)[0];
  // Element (b, r, c) is in block (r / 8, c / 8) of the ORIGINAL grid (2, 3), whatever b is.
  for (int64_t b = 0; b < 5; ++b)
    for (int64_t r = 0; r < 16; ++r)
      for (int64_t c = 0; c < 24; ++c)
        ASSERT_EQ(o.get({b, r, c}), (r / 8) * 100 + (c / 8) * 10 + 2 * 1000 + 3 * 10000)
            << b << " " << r << " " << c;
  check_vmap(call, {random_f32({5, 16, 24}, 7)}, {0}, {}, 5);
}

TEST_P(Vmap, NamedGridAxesKeepTheirMeaning) {
  pl::PallasCall call = pl::pallas_call(
      [](pl::Ref x, pl::Ref o) {
        o[pl::all] = x[pl::all] + (pl::program_id("rows") * 10 + pl::num_programs("cols")).astype(pl::f32);
      },
      pl::ShapeDtype({16, 16}, pl::f32),
      {.grid = pl::Grid{{"rows", 2}, {"cols", 2}},
       .in_specs = {pl::BlockSpec({8, 8}, [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; })},
       .out_specs = {pl::BlockSpec({8, 8}, [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; })},
       .interpret = mode(),
       .backend = backend()});
  check_vmap(call, {random_f32({3, 16, 16}, 8)}, {0}, {}, 3);
}

TEST_P(Vmap, BatchAxisNotZero) {
  pl::PallasCall call = add_call(GetParam());
  // x batched on its last axis, y on its middle one; the output batched on axis 1, then 2.
  check_vmap(call, {random_f32({32, 64, 3}, 9), random_f32({32, 3, 64}, 10)}, {2, 1}, {1}, 3);
  check_vmap(call, {random_f32({32, 64, 3}, 11), random_f32({32, 3, 64}, 12)}, {-1, 1}, {-1}, 3);
  pl::PallasCall batched = pl::vmap(call, {2, 1}, {1});
  EXPECT_EQ(batched(random_f32({32, 64, 3}, 9), random_f32({32, 3, 64}, 10))[0].shape(),
            (pl::Shape{32, 3, 64}));
}

TEST_P(Vmap, BatchSizeOne) {
  pl::PallasCall call = matmul_call(GetParam());
  check_vmap(call, {random_f32({1, 32, 16}, 13), random_f32({16, 24}, 14)}, {0, std::nullopt}, {}, 1);
  check_vmap(call, {random_f32({32, 1, 16}, 15), random_f32({16, 1, 24}, 16)}, {1, 1}, {2}, 1);
}

TEST_P(Vmap, UnbatchedArgumentsWithAxisSize) {
  pl::PallasCall call = add_call(GetParam());
  check_vmap(call, {random_f32({32, 64}, 17), random_f32({32, 64}, 18)},
             {std::nullopt, std::nullopt}, {}, 2, /*axis_size=*/2);
}

TEST_P(Vmap, NestedVmap) {
  pl::PallasCall call = matmul_call(GetParam());
  pl::PallasCall inner = pl::vmap(call, {0, std::nullopt});
  // The outer batch: x on axis 1 of the inner-batched x, y batched on its last axis.
  pl::PallasCall outer = pl::vmap(inner, {1, 2}, {1});
  pl::Array x = random_f32({3, 2, 32, 16}, 19), y = random_f32({16, 24, 2}, 20);
  std::vector<pl::Array> actual = outer(x.clone(), y.clone());
  // Expected: out[b, c] = call(x[b, c], y[..., c]) for inner batch b, outer batch c.
  std::vector<pl::Array> rows;
  for (int64_t b = 0; b < 3; ++b) {
    std::vector<pl::Array> cols;
    for (int64_t c = 0; c < 2; ++c)
      cols.push_back(call(slice_at(slice_at(x, 0, b), 0, c), slice_at(y, 2, c))[0]);
    rows.push_back(stack_at(cols, 0));
  }
  expect_same(actual, {stack_at(rows, 0)});
  std::shared_ptr<const pl::TracedCall> tc = outer.trace({x.shape_dtype(), y.shape_dtype()});
  EXPECT_EQ(tc->grid_mapping.grid, (std::vector<int64_t>{2, 3, 2, 3, 2}));
  EXPECT_EQ(tc->grid_mapping.vmapped_dims, (std::vector<int>{0, 1}));
  EXPECT_EQ(inner.trace({pl::ShapeDtype({3, 32, 16}, pl::f32), pl::ShapeDtype({16, 24}, pl::f32)})->grid_mapping.vmapped_dims,
            (std::vector<int>{0}));
}

TEST_P(Vmap, AliasedInputs) {
  pl::PallasCall call = pl::pallas_call(
      [](pl::Ref, pl::Ref y, pl::Ref o) { o[pl::all] = o[pl::all] * 2.0f + y[pl::all]; },
      pl::ShapeDtype({16, 8}, pl::f32),
      {.grid = {2},
       .in_specs = {pl::BlockSpec({8, 8}, [](pl::Value i) { return pl::Indices{i, 0}; }),
                    pl::BlockSpec({8, 8}, [](pl::Value i) { return pl::Indices{i, 0}; })},
       .out_specs = {pl::BlockSpec({8, 8}, [](pl::Value i) { return pl::Indices{i, 0}; })},
       .input_output_aliases = {{0, 0}},
       .interpret = mode(),
       .backend = backend()});
  // Batched on the output's axis: updated in place.
  pl::Array x = random_f32({3, 16, 8}, 21);
  pl::Array y = random_f32({3, 16, 8}, 22);
  check_vmap(call, {x, y}, {0, 0}, {}, 3);
  pl::Array xc = x.clone();
  pl::Array o = pl::vmap(call, {0, 0})(xc, y)[0];
  EXPECT_TRUE(o.shares_buffer_with(xc));
  // Unbatched: broadcast, so every batch element starts from the same x.
  check_vmap(call, {random_f32({16, 8}, 23), random_f32({3, 16, 8}, 24)}, {std::nullopt, 0}, {}, 3);
  // Batched on another axis than the output: moved there.
  check_vmap(call, {random_f32({16, 3, 8}, 25), random_f32({3, 16, 8}, 26)}, {1, 0}, {}, 3);
  check_vmap(call, {random_f32({16, 8, 3}, 27), random_f32({16, 8}, 28)}, {2, std::nullopt}, {1}, 3);
}

TEST_P(Vmap, BatchedScalarPrefetchRunsOneCallPerElement) {
  pl::PallasCall call = pl::pallas_call(
      [](pl::Ref table, pl::Ref x, pl::Ref o) {
        o[pl::all] = x[pl::all] + table[pl::program_id(0)].astype(pl::f32) * 1000.0f;
      },
      pl::ShapeDtype({4, 8}, pl::f32),
      {.grid_spec = pl::PrefetchScalarGridSpec(
           1, {4},
           {pl::BlockSpec({1, 8}, [](pl::Value i, pl::Ref t) { return pl::Indices{t[i], 0}; })},
           {pl::BlockSpec({1, 8}, [](pl::Value i, pl::Ref) { return pl::Indices{i, 0}; })}),
       .interpret = mode(),
       .backend = backend()});
  pl::Array tables = pl::Array::from_vector<int32_t>({2, 4}, {2, 0, 3, 2, 1, 1, 0, 3});
  pl::Array table = pl::Array::from_vector<int32_t>({4}, {3, 1, 0, 2});
  pl::Array xs = random_f32({2, 4, 8}, 29);
  check_vmap(call, {tables, xs}, {0, 0}, {}, 2);
  // An unbatched table batches as one kernel.
  check_vmap(call, {table, xs}, {std::nullopt, 0}, {}, 2);
  pl::PallasCall batched = pl::vmap(call, {0, 0});
  EXPECT_CONTAINS(error_of([&] { batched.trace({tables.shape_dtype(), xs.shape_dtype()}); }),
                  "a batched scalar-prefetch operand");
}

TEST_P(Vmap, DynamicGridRunsOneCallPerElement) {
  pl::PallasCall call = pl::pallas_call(
      [](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all] + pl::program_id(0).astype(pl::f32); },
      pl::ShapeDtype({32, 8}, pl::f32),
      {.grid = {pl::dynamic},
       .in_specs = {pl::BlockSpec({8, 8}, [](pl::Value i) { return pl::Indices{i, 0}; })},
       .out_specs = {pl::BlockSpec({8, 8}, [](pl::Value i) { return pl::Indices{i, 0}; })},
       .interpret = mode(),
       .backend = backend()});
  pl::Array n = pl::Array::full({}, pl::i32, 4);
  check_vmap(call, {n, random_f32({32, 3, 8}, 30)}, {std::nullopt, 1}, {}, 3);
  // A batched grid size: one call per element with its own grid.
  pl::Array sizes = pl::Array::from_vector<int32_t>({2}, {2, 4});
  pl::Array xs = random_f32({2, 32, 8}, 31);
  check_vmap(call, {sizes, xs}, {0, 0}, {}, 2);
  // Its cost is the sum of the per-element calls': grids of 2 and 4 points, each reading an
  // (8, 8) f32 block of x and writing one of o, and adding 64 elements.
  pl::CostEstimate c = pl::estimate_cost(pl::vmap(call, {0, 0}), sizes, xs);
  EXPECT_EQ(c.bytes_accessed, (2 + 4) * 2 * 64 * 4);
  EXPECT_EQ(c.flops, (2 + 4) * 64);
  EXPECT_EQ(c.transcendentals, 0);
}

TEST_P(Vmap, DimensionSemanticsGetTheBatchAxis) {
  pl::PallasCall call = pl::pallas_call(
      [](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all] * 3.0f; }, pl::ShapeDtype({16, 8}, pl::f32),
      {.grid = {2},
       .in_specs = {pl::BlockSpec({8, 8}, [](pl::Value i) { return pl::Indices{i, 0}; })},
       .out_specs = {pl::BlockSpec({8, 8}, [](pl::Value i) { return pl::Indices{i, 0}; })},
       .compiler_params = pltpu::CompilerParams{.dimension_semantics = {"arbitrary"}},
       .interpret = mode(),
       .backend = backend()});
  check_vmap(call, {random_f32({4, 16, 8}, 32)}, {0}, {}, 4);
}

TEST(VmapCost, EstimateScalesWithTheBatch) {
  pl::PallasCall call = matmul_call();
  pl::Array x = random_f32({32, 16}, 33), y = random_f32({16, 24}, 34);
  pl::CostEstimate one = pl::estimate_cost(call, x, y);
  pl::CostEstimate five = pl::estimate_cost(pl::vmap(call, {0, 0}), random_f32({5, 32, 16}, 35),
                                            random_f32({5, 16, 24}, 36));
  EXPECT_EQ(five.flops, 5 * one.flops);
  EXPECT_EQ(five.transcendentals, 5 * one.transcendentals);
  EXPECT_EQ(five.bytes_accessed, 5 * one.bytes_accessed);
  // From shapes alone, too.
  EXPECT_EQ(pl::estimate_cost(pl::vmap(call, {0, 0}), pl::ShapeDtype({5, 32, 16}, pl::f32),
                              pl::ShapeDtype({5, 16, 24}, pl::f32)),
            five);
  // A given cost_estimate is per call, so it is scaled by the batch too.
  pl::PallasCall given = pl::pallas_call(
      [](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all]; }, pl::ShapeDtype({8}, pl::f32),
      {.interpret = true, .cost_estimate = pl::CostEstimate{10, 2, 64, 0}});
  auto tc = pl::vmap(given, {0}).trace({pl::ShapeDtype({3, 8}, pl::f32)});
  ASSERT_TRUE(tc->cost_estimate.has_value());
  EXPECT_EQ(*tc->cost_estimate, (pl::CostEstimate{30, 6, 192, 0}));
}

TEST(VmapErrors, BadInput) {
  pl::PallasCall call = add_call();
  pl::Array a = random_f32({3, 32, 64}, 37), b = random_f32({4, 32, 64}, 38);
  EXPECT_CONTAINS(error_of([&] { pl::vmap(call, {0, 0})(a, b); }), "inconsistent batch sizes");
  EXPECT_CONTAINS(error_of([&] { pl::vmap(call, {0, 0})(a, b); }),
                  "argument 1 f32[4, 32, 64] has 4 along axis 0");
  EXPECT_CONTAINS(error_of([&] { pl::vmap(call, {0, std::nullopt}, {}, 4)(a, a); }),
                  "inconsistent batch sizes");
  EXPECT_CONTAINS(error_of([&] { pl::vmap(call, {3, 0})(a, a); }),
                  "in_axes[0] = 3 is out of range for argument 0 of type f32[3, 32, 64] (valid axes: -3 to 2)");
  EXPECT_CONTAINS(error_of([&] { pl::vmap(call, {0}); }), "in_axes has 1 entries but the call takes 2 arguments");
  EXPECT_CONTAINS(error_of([&] { pl::vmap(call, {0, 0}, {3}); }),
                  "out_axes[0] = 3 is out of range for output 0, which has rank 3 once batched");
  EXPECT_CONTAINS(error_of([&] { pl::vmap(call, {0, 0}, {0, 0}); }), "out_axes has 2 entries but the call has 1 outputs");
  EXPECT_CONTAINS(error_of([&] { pl::vmap(call, {std::nullopt, std::nullopt})(a, a); }),
                  "no argument is batched");
  EXPECT_CONTAINS(error_of([&] { pl::vmap(call, {std::nullopt, std::nullopt})(a, a); }), "pass axis_size");
  // Whole-array specs (no in_specs): the count is checked when called.
  pl::PallasCall whole = pl::pallas_call([](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all]; },
                                         pl::ShapeDtype({8}, pl::f32), {.interpret = true});
  EXPECT_CONTAINS(error_of([&] { pl::vmap(whole, {0, 0})(random_f32({2, 8}, 39)); }),
                  "in_axes has 2 entries but the call got 1 arguments");
  // After the errors, the same calls work.
  check_vmap(call, {a, a}, {0, 0}, {}, 3);
  check_vmap(whole, {random_f32({2, 8}, 40)}, {0}, {}, 2);
}
