// gpu::nd_loop and gpu::planar_snake (Mosaic GPU's helpers) in gpu::kernels, on the
// interpreter, under host emulation and (with a GPU) compiled, against orders written out by
// hand.
#include <gtest/gtest.h>

#include <vector>

#include "pallas/gpu.h"
#include "pallas/pallas.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

namespace {

namespace pl = ::pallas;
namespace plgpu = ::pallas::gpu;
using test_util::run_on;

class Loops : public test_util::OnGpuBackends {};
INSTANTIATE_TEST_SUITE_P(Backends, Loops, testing::Values("interpret", "gpu_emulate", "mosaic_gpu"), test_util::backend_name);

// Stores the i32 scalar v at out[at].
void put(const pl::Ref& out, const pl::Value& at, const pl::Value& v) {
  out.at(pl::ds(at, 1))[pl::all] = pl::broadcast_to(v, {1});
}

std::vector<int32_t> ints(const pl::Array& a) { return std::vector<int32_t>(a.data<int32_t>(), a.data<int32_t>() + a.size()); }

// A (2, 3) grid shared by 4 CTAs along "sm": CTA a visits flat points a, a + 4 (so CTAs 2 and 3
// one point, 0 and 1 two). Each visit records 100 * CTA + its local step; each CTA its count.
TEST_P(Loops, NdLoopDealsTheGridOutToTheCtasInTurn) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref visits, pl::Ref counts) {
        const pl::Value sm = plgpu::axis_index("sm");
        plgpu::nd_loop({2, 3}, {"sm"}, [&](const plgpu::NDLoopInfo& info) {
          put(visits, info.index[0] * 3 + info.index[1], sm * 100 + info.local_index);
          pl::when(info.local_index == 0, [&] { put(counts, sm, info.num_local_steps); });
        });
      },
      {pl::ShapeDtype({6}, pl::i32), pl::ShapeDtype({4}, pl::i32)}, plgpu::Mesh{.grid = {4}, .grid_names = {"sm"}},
      run_on(GetParam(), {}));
  const std::vector<pl::Array> out = call();
  EXPECT_EQ(ints(out[0]), (std::vector<int32_t>{0, 100, 200, 300, 1, 101}));
  EXPECT_EQ(ints(out[1]), (std::vector<int32_t>{2, 2, 1, 1}));
}

// Tiling (2, 2) of a (4, 4) grid: the tiles in row-major order, each tile's points in row-major
// order; one CTA, so the local step is the visit's place in that order. A carry counts them.
TEST_P(Loops, NdLoopWalksTilesAndCarriesValues) {
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref order, pl::Ref count) {
        const std::vector<pl::Value> total = plgpu::nd_loop(
            {4, 4}, {"sm"}, {pl::full({}, pl::i32, 0)},
            [&](const plgpu::NDLoopInfo& info, const std::vector<pl::Value>& carry) {
              put(order, info.index[0] * 4 + info.index[1], info.local_index);
              return std::vector<pl::Value>{carry[0] + 1};
            },
            {.tiling = {2, 2}});
        put(count, pl::full({}, pl::i32, 0), total[0]);
      },
      {pl::ShapeDtype({16}, pl::i32), pl::ShapeDtype({1}, pl::i32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"sm"}},
      run_on(GetParam(), {}));
  const std::vector<pl::Array> out = call();
  EXPECT_EQ(ints(out[0]), (std::vector<int32_t>{0, 1, 4, 5,  //
                                                2, 3, 6, 7,  //
                                                8, 9, 12, 13,  //
                                                10, 11, 14, 15}));
  EXPECT_EQ(ints(out[1]), (std::vector<int32_t>{16}));
}

// planar_snake's order, written out: an (8, 8) grid in strips of 2 rows (minor_dim 0; Mosaic
// GPU's documented example), and a (4, 5) grid in strips of 2 columns (minor_dim 1) whose last
// strip is 1 column wide.
TEST_P(Loops, PlanarSnakeWalksStripsBackAndForth) {
  auto order_of = [&](int64_t rows, int64_t cols, int minor_dim, int64_t width) {
    pl::PallasCall call = plgpu::kernel(
        [=](pl::Ref order) {
          pl::fori_loop(0, static_cast<int32_t>(rows * cols), [&](pl::Value i) {
            const auto [r, c] = plgpu::planar_snake(i, {static_cast<int32_t>(rows), static_cast<int32_t>(cols)}, minor_dim, width);
            put(order, r * static_cast<int32_t>(cols) + c, i);
          });
        },
        {pl::ShapeDtype({rows * cols}, pl::i32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"b"}}, run_on(GetParam(), {}));
    return ints(call().at(0));
  };
  EXPECT_EQ(order_of(8, 8, 0, 2), (std::vector<int32_t>{0,  2,  4,  6,  8,  10, 12, 14,  //
                                                        1,  3,  5,  7,  9,  11, 13, 15,  //
                                                        30, 28, 26, 24, 22, 20, 18, 16,  //
                                                        31, 29, 27, 25, 23, 21, 19, 17,  //
                                                        32, 34, 36, 38, 40, 42, 44, 46,  //
                                                        33, 35, 37, 39, 41, 43, 45, 47,  //
                                                        62, 60, 58, 56, 54, 52, 50, 48,  //
                                                        63, 61, 59, 57, 55, 53, 51, 49}));
  EXPECT_EQ(order_of(4, 5, 1, 2), (std::vector<int32_t>{0, 1, 14, 15, 16,  //
                                                        2, 3, 12, 13, 17,  //
                                                        4, 5, 10, 11, 18,  //
                                                        6, 7, 8,  9,  19}));
}

TEST(LoopErrors, BadGridsTilingsAndAxesNameTheLine) {
  auto error_of = [](const std::function<void()>& body) {
    return test_util::error_of([&] {
      plgpu::kernel([&](pl::Ref) { body(); }, {pl::ShapeDtype({1}, pl::i32)}, plgpu::Mesh{.grid = {2}, .grid_names = {"sm"}},
                    run_on("interpret", {}))();
    });
  };
  const int line = __LINE__ + 1;
  const std::string zero = error_of([] { plgpu::nd_loop({0, 3}, {"sm"}, [](const plgpu::NDLoopInfo&) {}); });
  EXPECT_CONTAINS(zero, "nd_loop: grid sizes must be positive, got 0");
  EXPECT_CONTAINS(zero, "gpu_loops_test.cpp:" + std::to_string(line));
  EXPECT_CONTAINS(error_of([] { plgpu::nd_loop({4, 3}, {"sm"}, [](const plgpu::NDLoopInfo&) {}, {.tiling = {2, 2}}); }),
                  "nd_loop: the tile size 2 does not divide grid dim 1 (3)");
  EXPECT_CONTAINS(error_of([] { plgpu::nd_loop({4}, {}, [](const plgpu::NDLoopInfo&) {}); }), "nd_loop: collective_axes is empty");
  EXPECT_CONTAINS(error_of([] { plgpu::planar_snake(0, {8, 8}, 2, 2); }), "planar_snake: minor_dim must be 0 or 1, got 2");
  EXPECT_CONTAINS(error_of([] { plgpu::nd_loop({4}, {"nope"}, [](const plgpu::NDLoopInfo&) {}); }),
                  "nd_loop: collective_axes names 'nope', which is not an axis of the kernel's mesh (sm)");
  EXPECT_CONTAINS(error_of([] { plgpu::nd_loop({4}, {"sm", "sm"}, [](const plgpu::NDLoopInfo&) {}); }),
                  "nd_loop: collective_axes names 'sm' twice");
  EXPECT_CONTAINS(error_of([] { plgpu::nd_loop({65536, 65537}, {"sm"}, [](const plgpu::NDLoopInfo&) {}); }),
                  "nd_loop: the grid has more than 2^31 - 1 points");
}

}  // namespace
