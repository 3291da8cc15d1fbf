// Every validation error of pallas_call: a pallas::Error with the seed's wording, naming the
// operand by its origin (args[1], outputs[0]).
#include <gtest/gtest.h>

#include "tests/test_util.h"
#include "pallas/pallas.h"

namespace pl = pallas;

namespace {

using test_util::error_of;

auto copy_kernel = [](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all]; };
pl::Array x8x128() { return pl::Array::zeros({8, 128}, pl::f32); }

}  // namespace

TEST(PallasCallErrors, BlockShapeRankDiffersFromArrayRank) {
  std::string msg = error_of([] {
    pl::pallas_call(copy_kernel, pl::ShapeDtype({8, 128}, pl::f32),
                    {.in_specs = {pl::BlockSpec({8}, [](pl::Value) { return pl::Indices{0}; })}, .interpret = true})(x8x128());
  });
  EXPECT_CONTAINS(msg, "Block shape for args[0] (= (Blocked(8),)) must have the same number of dimensions as the array shape (8, 128).");
}

TEST(PallasCallErrors, IndexMapReturnsTheWrongNumberOfValues) {
  std::string msg = error_of([] {
    pl::pallas_call(copy_kernel, pl::ShapeDtype({8, 128}, pl::f32),
                    {.grid = {1},
                     .in_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i}; })},
                     .interpret = true})(x8x128());
  });
  EXPECT_CONTAINS(msg, "for args[0] must return 2 values to match block_shape=(Blocked(8), Blocked(128)). Currently returning 1 values.");
  EXPECT_CONTAINS(msg, "pallas_call_errors_test.cpp");
}

TEST(PallasCallErrors, IndexMapReturnsANonIntegerValue) {
  std::string msg = error_of([] {
    pl::pallas_call(copy_kernel, pl::ShapeDtype({8, 128}, pl::f32),
                    {.grid = {1},
                     .in_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i.astype(pl::f32), 0}; })},
                     .interpret = true})(x8x128());
  });
  EXPECT_CONTAINS(msg, "for args[0] must return integer scalars. Output[0] has type f32[].");
}

TEST(PallasCallErrors, IndexMapReturnsANonScalar) {
  std::string msg = error_of([] {
    pl::pallas_call(copy_kernel, pl::ShapeDtype({8, 128}, pl::f32),
                    {.grid = {1},
                     .out_specs = {pl::BlockSpec({8, 128}, [](pl::Value) { return pl::Indices{pl::iota(pl::i32, {2}, 0), 0}; })},
                     .interpret = true})(x8x128());
  });
  EXPECT_CONTAINS(msg, "for outputs[0] must return integer scalars. Output[0] has type i32[2].");
}

TEST(PallasCallErrors, IndexMapCapturesConstants) {
  pl::Array table = pl::Array::zeros({4}, pl::i32);
  std::string msg = error_of([&] {
    pl::pallas_call(copy_kernel, pl::ShapeDtype({8, 128}, pl::f32),
                    {.grid = {1},
                     .in_specs = {pl::BlockSpec({8, 128}, [&](pl::Value) {
                       (void)pl::constant(table);
                       return pl::Indices{0, 0};
                     })},
                     .interpret = true})(x8x128());
  });
  EXPECT_CONTAINS(msg, "for args[0] must not capture constants: [i32[4]]");
}

TEST(PallasCallErrors, KernelCapturesNonScalarConstants) {
  pl::Array bias = pl::Array::zeros({8, 128}, pl::f32);
  std::string msg = error_of([&] {
    pl::pallas_call([&](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all] + pl::constant(bias); },
                    pl::ShapeDtype({8, 128}, pl::f32), {.interpret = true, .name = "biased"})(x8x128());
  });
  EXPECT_CONTAINS(msg, "The kernel function in the pallas_call biased at pallas_call_errors_test.cpp");
  EXPECT_CONTAINS(msg, "captures constants [f32[8, 128]]. You should pass them as inputs.");
}

TEST(PallasCallErrors, BoundedSliceIndexMapMustReturnASlice) {
  std::string msg = error_of([] {
    pl::pallas_call(copy_kernel, pl::ShapeDtype({8}, pl::f32),
                    {.grid = {1},
                     .in_specs = {pl::BlockSpec({pl::BoundedSlice{4}}, [](pl::Value i) { return pl::Indices{i}; })},
                     .interpret = true})(pl::Array::zeros({8}, pl::f32));
  });
  EXPECT_CONTAINS(msg, "index_map returned a value of type Value at position 0 with block dimension BoundedSlice(4) when it should be pl.Slice");
}

TEST(PallasCallErrors, SliceWhereAScalarIsExpected) {
  std::string msg = error_of([] {
    pl::pallas_call(copy_kernel, pl::ShapeDtype({8}, pl::f32),
                    {.grid = {1},
                     .in_specs = {pl::BlockSpec({4}, [](pl::Value) { return pl::Indices{pl::ds(0, 4)}; })},
                     .interpret = true})(pl::Array::zeros({8}, pl::f32));
  });
  EXPECT_CONTAINS(msg, "with block dimension Blocked(4) when it should be a scalar");
}

TEST(PallasCallErrors, GridSpecConflictsWithGridSpecsAndScratch) {
  pl::GridSpec gs{.grid = {2}};
  EXPECT_CONTAINS(error_of([&] {
                    pl::pallas_call(copy_kernel, pl::ShapeDtype({8}, pl::f32),
                                    {.grid = {2}, .grid_spec = gs, .interpret = true});
                  }),
                  "If `grid_spec` is specified, then `grid` must be `()`. It is (2,)");
  EXPECT_CONTAINS(error_of([&] {
                    pl::pallas_call(copy_kernel, pl::ShapeDtype({8}, pl::f32),
                                    {.in_specs = {pl::BlockSpec()}, .grid_spec = gs, .interpret = true});
                  }),
                  "If `grid_spec` is specified, then `in_specs` must be `no_block_spec`");
  EXPECT_CONTAINS(error_of([&] {
                    pl::pallas_call(copy_kernel, pl::ShapeDtype({8}, pl::f32),
                                    {.out_specs = {pl::BlockSpec()}, .grid_spec = gs, .interpret = true});
                  }),
                  "If `grid_spec` is specified, then `out_specs` must be `no_block_spec`");
  EXPECT_CONTAINS(error_of([&] {
                    pl::pallas_call(copy_kernel, pl::ShapeDtype({8}, pl::f32),
                                    {.scratch_shapes = {{{8}, pl::f32}}, .grid_spec = gs, .interpret = true});
                  }),
                  "If `grid_spec` is specified, then `scratch_shapes` must be `()`");
}

TEST(PallasCallErrors, InSpecsDoNotMatchInputs) {
  std::string msg = error_of([] {
    pl::pallas_call(copy_kernel, pl::ShapeDtype({8, 128}, pl::f32),
                    {.in_specs = {pl::BlockSpec(), pl::BlockSpec()}, .interpret = true})(x8x128());
  });
  EXPECT_CONTAINS(msg, "Pytree for `in_specs` and `inputs` do not match. There are 1 mismatches, including:");
  EXPECT_CONTAINS(msg, "`in_specs` is a list of 2 BlockSpecs but `inputs` is a list of 1 arrays");
}

TEST(PallasCallErrors, OutSpecsDoNotMatchOutShape) {
  std::string msg = error_of([] {
    pl::pallas_call(copy_kernel, pl::ShapeDtype({8, 128}, pl::f32),
                    {.out_specs = {pl::BlockSpec(), pl::BlockSpec()}, .interpret = true})(x8x128());
  });
  EXPECT_CONTAINS(msg, "Pytree for `out_specs` and `out_shape` do not match.");
}

TEST(PallasCallErrors, InputOutputAliasesOutOfRangeOrMismatched) {
  auto run = [](std::map<int, int> aliases, pl::ShapeDtype out) {
    return error_of([&] {
      pl::pallas_call(copy_kernel, out, {.input_output_aliases = aliases, .interpret = true})(x8x128());
    });
  };
  EXPECT_CONTAINS(run({{1, 0}}, {{8, 128}, pl::f32}),
                  "input_output_aliases contains the mapping '1:0' with input index 1 outside the range [0, 1)");
  EXPECT_CONTAINS(run({{0, 1}}, {{8, 128}, pl::f32}),
                  "input_output_aliases contains the mapping '0:1' with output index 1 outside the range [0, 1)");
  EXPECT_CONTAINS(run({{0, 0}}, {{8, 64}, pl::f32}),
                  "input_output_aliases contains the mapping '0:0' referring to input[0] with abstract value "
                  "f32[8, 128] and to output[0] with a different abstract value f32[8, 64].");
}

TEST(PallasCallErrors, MeshShapeMustMatchGrid) {
  std::string msg = error_of([] {
    pl::pallas_call(copy_kernel, pl::ShapeDtype({8}, pl::f32),
                    {.grid = {4}, .interpret = true, .mesh_shape = std::vector<int64_t>{2}});
  });
  EXPECT_CONTAINS(msg, "Mesh shape (2,) does not match grid shape (4,).");
}

TEST(PallasCallErrors, CompilerParamsBackendChecks) {
  EXPECT_CONTAINS(error_of([] {
                    pl::pallas_call(copy_kernel, pl::ShapeDtype({8}, pl::f32),
                                    {.compiler_params_by_backend = {{"cuda_magic", pl::tpu::CompilerParams{}}},
                                     .interpret = true});
                  }),
                  "Unknown backend in compiler_params: cuda_magic");
  EXPECT_CONTAINS(error_of([] {
                    pl::pallas_call(copy_kernel, pl::ShapeDtype({8}, pl::f32),
                                    {.compiler_params_by_backend = {{"mosaic_gpu", pl::tpu::CompilerParams{}}},
                                     .interpret = true});
                  }),
                  "Inconsistent backend in compiler_params: mosaic_tpu != mosaic_gpu");
}

TEST(PallasCallErrors, NoBackendWithoutInterpret) {
  EXPECT_CONTAINS(error_of([] { pl::pallas_call(copy_kernel, pl::ShapeDtype({8}, pl::f32)); }),
                  "pass .interpret = true");
}

TEST(PallasCallErrors, OutOfBoundsBlockIndexNamesOperandAndIteration) {
  std::string msg = error_of([] {
    pl::pallas_call(copy_kernel, pl::ShapeDtype({16}, pl::f32),
                    {.grid = {3},
                     .in_specs = {pl::BlockSpec({8}, [](pl::Value i) { return pl::Indices{i}; })},
                     .out_specs = {pl::BlockSpec({8}, [](pl::Value i) { return pl::Indices{i}; })},
                     .interpret = true})(pl::Array::zeros({16}, pl::f32));
  });
  EXPECT_CONTAINS(msg, "Out-of-bounds block index (2,) for input \"args[0]\" in iteration (2,): reading [16:24] but input has shape (16,).");
}

TEST(PallasCallErrors, DynamicGridNeedsItsSizes) {
  auto call = pl::pallas_call([](pl::Ref o) { o[pl::all] = 0; }, pl::ShapeDtype({8}, pl::i32),
                              {.grid = {pl::dynamic}, .interpret = true});
  EXPECT_CONTAINS(error_of([&] { call(); }), "the grid has 1 dynamic dimensions");
  EXPECT_CONTAINS(error_of([&] { call(pl::Array::zeros({2}, pl::i32)); }),
                  "must be an integer scalar (the size of dynamic grid dimension 0)");
}

TEST(PallasCallErrors, KernelArityDoesNotMatchOperands) {
  std::string msg = error_of([] {
    pl::pallas_call([](pl::Ref x) { (void)x; }, pl::ShapeDtype({8, 128}, pl::f32), {.interpret = true})(x8x128());
  });
  EXPECT_CONTAINS(msg, "cannot be called with 2 Refs");
}

TEST(PallasCallErrors, AfterAnErrorTheNextCallWorks) {
  auto bad = pl::pallas_call(copy_kernel, pl::ShapeDtype({8, 128}, pl::f32),
                             {.in_specs = {pl::BlockSpec({8}, [](pl::Value) { return pl::Indices{0}; })}, .interpret = true});
  EXPECT_THROW(bad(x8x128()), pl::Error);
  EXPECT_EQ(bad.cache_size(), 0);
  auto good = pl::pallas_call(copy_kernel, pl::ShapeDtype({8, 128}, pl::f32), {.interpret = true});
  pl::Array x = pl::Array::full({8, 128}, pl::f32, 3);
  EXPECT_EQ(good(x)[0].get({7, 127}), 3.0);
}
