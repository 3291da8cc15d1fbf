// InterpretParams of the TPU interpret mode: validation, uninitialized memory, out-of-bounds
// reads, skipped float ops, the grid point recorder, the parallel-dimension split across cores
// and the seeded permutation of parallel dimensions.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "tests/tpu/tpu_test_util.h"

using namespace tpu_test;

namespace {

auto copy_kernel = [](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all]; };

pl::Array run_copy(const pltpu::InterpretParams& p) {
  auto call = pl::pallas_call(copy_kernel, pl::ShapeDtype({8, 128}, pl::f32), {.interpret = p});
  return call(iota_f32({8, 128}))[0];
}

}  // namespace

// ---- Validation -------------------------------------------------------------------------------------
TEST(TpuParams, NumCoresMustBeAtLeastOne) {
  pltpu::InterpretParams p;
  p.num_cores_per_device = 0;
  EXPECT_CONTAINS(error_of([&] { run_copy(p); }),
                  "Number of cores or threads must be at least 1, but got 0.");
  p.num_cores_per_device = -3;
  EXPECT_CONTAINS(error_of([&] { run_copy(p); }),
                  "Number of cores or threads must be at least 1, but got -3.");
}

TEST(TpuParams, VectorClockSize) {
  pltpu::InterpretParams p;
  p.vector_clock_size = 0;
  EXPECT_CONTAINS(error_of([&] { run_copy(p); }), "Vector clock size must be at least 1, but got 0.");
  // One device with two cores: a size of 2 is not above the core count.
  p.num_cores_per_device = 2;
  p.vector_clock_size = 2;
  EXPECT_CONTAINS(error_of([&] { run_copy(p); }),
                  "Vector clock size (2) must be greater than the total number of cores/threads (2).");
  // Four devices of one core: the total is 4.
  p.num_cores_per_device = 1;
  p.vector_clock_size = 4;
  auto call = pl::pallas_call(copy_kernel, pl::ShapeDtype({8, 128}, pl::f32), {.interpret = p});
  std::vector<std::vector<pl::Array>> args(4, {iota_f32({8, 128})});
  EXPECT_CONTAINS(error_of([&] { pltpu::run_on_mesh(call, pltpu::Mesh{{"x"}, {4}}, args); }),
                  "Vector clock size (4) must be greater than the total number of cores/threads (4).");
  // Valid sizes run.
  p.vector_clock_size = 5;
  auto ok = pl::pallas_call(copy_kernel, pl::ShapeDtype({8, 128}, pl::f32), {.interpret = p});
  auto out = pltpu::run_on_mesh(ok, pltpu::Mesh{{"x"}, {4}}, args);
  EXPECT_EQ(out[3][0].data<float>()[77], 77.0f);
}

TEST(TpuParams, UnknownStringsAreRejected) {
  {
    pltpu::InterpretParams p;
    p.dma_execution_mode = "lazy";
    EXPECT_CONTAINS(error_of([&] { run_copy(p); }),
                    "InterpretParams.dma_execution_mode must be one of \"eager\", \"on_wait\", got \"lazy\"");
  }
  {
    pltpu::InterpretParams p;
    p.out_of_bounds_reads = "uninitialized_value";
    EXPECT_CONTAINS(error_of([&] { run_copy(p); }),
                    "InterpretParams.out_of_bounds_reads must be one of \"raise\", \"uninitialized\", "
                    "got \"uninitialized_value\"");
  }
  {
    pltpu::InterpretParams p;
    p.uninitialized_memory = "garbage";
    EXPECT_CONTAINS(error_of([&] { run_copy(p); }),
                    "InterpretParams.uninitialized_memory must be one of \"nan\", \"zero\", got \"garbage\"");
  }
  {
    pltpu::InterpretParams p;
    p.nonzero_semaphores_at_exit = "ignore";
    EXPECT_CONTAINS(error_of([&] { run_copy(p); }),
                    "InterpretParams.nonzero_semaphores_at_exit must be one of \"error\", \"warn\", got \"ignore\"");
  }
  {
    pltpu::InterpretParams p;
    p.buffer_bounds = "tiled";
    EXPECT_CONTAINS(error_of([&] { run_copy(p); }),
                    "InterpretParams.buffer_bounds must be one of \"logical\", \"padded\", got \"tiled\"");
  }
  // The defaults run.
  EXPECT_EQ(run_copy(pltpu::InterpretParams{}).data<float>()[1000], 1000.0f);
}

// ---- Uninitialized memory ----------------------------------------------------------------------------
TEST(TpuParams, UninitializedMemoryNanOrZero) {
  // Scratch read before it is written holds the fill value.
  auto kernel = [](pl::Ref of, pl::Ref oi, pl::Ref ob, pl::Ref sf, pl::Ref si, pl::Ref sb) {
    of[pl::all] = sf[pl::all];
    oi[pl::all] = si[pl::all];
    ob[pl::all] = sb[pl::all];
  };
  pl::CallOptions opts;
  opts.scratch_shapes = {pltpu::VMEM({8, 128}, pl::f32), pltpu::VMEM({8, 128}, pl::i32),
                         pltpu::VMEM({8, 128}, pl::bool_)};
  for (const char* fill : {"nan", "zero"}) {
    pltpu::InterpretParams p;
    p.uninitialized_memory = fill;
    opts.interpret = p;
    auto call = pl::pallas_call(kernel,
                                {pl::ShapeDtype({8, 128}, pl::f32), pl::ShapeDtype({8, 128}, pl::i32),
                                 pl::ShapeDtype({8, 128}, pl::bool_)},
                                opts);
    auto out = call();
    bool nan = std::string(fill) == "nan";
    for (int64_t i = 0; i < 8 * 128; ++i) {
      if (nan) {
        ASSERT_TRUE(std::isnan(out[0].data<float>()[i])) << i;
        ASSERT_EQ(out[1].data<int32_t>()[i], std::numeric_limits<int32_t>::max()) << i;
        ASSERT_EQ(out[2].get_flat(i), 1.0) << i;
      } else {
        ASSERT_EQ(out[0].data<float>()[i], 0.0f) << i;
        ASSERT_EQ(out[1].data<int32_t>()[i], 0) << i;
        ASSERT_EQ(out[2].get_flat(i), 0.0) << i;
      }
    }
  }
}

TEST(TpuParams, UninitializedMemoryFillsPaddingOfPartialBlocks) {
  // A (12, 128) input in (8, 128) blocks: the second block's last 4 rows are padding.
  auto kernel = [](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all]; };
  for (const char* fill : {"nan", "zero"}) {
    pltpu::InterpretParams p;
    p.uninitialized_memory = fill;
    pl::CallOptions opts;
    opts.grid = {2};
    opts.in_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })};
    opts.out_specs = {pl::BlockSpec({8, 128}, [](pl::Value i) { return pl::Indices{i, 0}; })};
    opts.interpret = p;
    auto call = pl::pallas_call(kernel, pl::ShapeDtype({16, 128}, pl::f32), opts);
    pl::Array o = call(iota_f32({12, 128}))[0];
    for (int64_t r = 0; r < 16; ++r)
      for (int64_t c = 0; c < 128; ++c) {
        float v = o.data<float>()[r * 128 + c];
        if (r < 12)
          ASSERT_EQ(v, static_cast<float>(r * 128 + c));
        else if (std::string(fill) == "nan")
          ASSERT_TRUE(std::isnan(v)) << r << "," << c;
        else
          ASSERT_EQ(v, 0.0f) << r << "," << c;
      }
  }
}

// ---- Out-of-bounds reads ------------------------------------------------------------------------------
namespace {
// Rows 4..11 of an (8, 4) VMEM scratch: rows 8..11 are outside. (The start is dynamic: static
// out-of-bounds indices are rejected when the kernel is traced.)
const int kOobReadLine = __LINE__ + 3;
auto oob_read_kernel = [](pl::Ref x, pl::Ref o, pl::Ref scratch) {
  scratch[pl::all] = x[pl::all];
  o[pl::all] = scratch[pl::ds(pl::program_id(0) + 4, 8)];
};
pl::PallasCall oob_read_call(const pltpu::InterpretParams& p) {
  pl::CallOptions opts;
  opts.grid = {1};
  opts.scratch_shapes = {pltpu::VMEM({8, 4}, pl::f32)};
  opts.interpret = p;
  return pl::pallas_call(oob_read_kernel, pl::ShapeDtype({8, 4}, pl::f32), opts);
}
}  // namespace

TEST(TpuParams, OutOfBoundsReadsUninitializedFillsTheOutsidePart) {
  for (const char* fill : {"nan", "zero"}) {
    pltpu::InterpretParams p;
    p.out_of_bounds_reads = "uninitialized";
    p.uninitialized_memory = fill;
    pl::Array x = iota_f32({8, 4}, 1.0f);
    pl::Array o = oob_read_call(p)(x)[0];
    for (int64_t r = 0; r < 8; ++r)
      for (int64_t c = 0; c < 4; ++c) {
        float v = o.data<float>()[r * 4 + c];
        if (r < 4)
          ASSERT_EQ(v, x.data<float>()[(r + 4) * 4 + c]) << r << "," << c;
        else if (std::string(fill) == "nan")
          ASSERT_TRUE(std::isnan(v)) << r << "," << c;
        else
          ASSERT_EQ(v, 0.0f) << r << "," << c;
      }
  }
}

TEST(TpuParams, OutOfBoundsReadsRaise) {
  pltpu::InterpretParams p;  // "raise" is the default
  std::string msg = error_of([&] { oob_read_call(p)(iota_f32({8, 4})); });
  // Buffer ids count from 100 per core: the HBM input and output (100, 101), their VMEM blocks
  // (102, 103), then the scratch (104).
  EXPECT_EQ(msg, "Out-of-bounds read of (device 0 core 0 vmem 104, scratch 0): reading [4:12, 0:4] but buffer "
                 "has shape (8, 4) at grid point (0). (at " + line_ref(__FILE__, kOobReadLine) + ")");
}

TEST(TpuParams, OutOfBoundsReadEntirelyOutsideRaisesEvenWhenUninitialized) {
  auto kernel = [](pl::Ref x, pl::Ref o, pl::Ref scratch) {
    scratch[pl::all] = x[pl::all];
    o[pl::all] = scratch[pl::ds(pl::program_id(0) + 8, 8)];
  };
  pltpu::InterpretParams p;
  p.out_of_bounds_reads = "uninitialized";
  pl::CallOptions opts;
  opts.grid = {1};
  opts.scratch_shapes = {pltpu::VMEM({8, 4}, pl::f32)};
  opts.interpret = p;
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 4}, pl::f32), opts);
  EXPECT_CONTAINS(error_of([&] { call(iota_f32({8, 4})); }),
                  "reading [8:16, 0:4] but buffer has shape (8, 4) at grid point (0).");
}

TEST(TpuParams, OutOfBoundsWritesAlwaysRaise) {
  const int line = __LINE__ + 3;
  auto kernel = [](pl::Ref x, pl::Ref o, pl::Ref scratch) {
    scratch[pl::all] = x[pl::all];
    scratch[pl::ds(pl::program_id(0) + 6, 4)] = x[pl::ds(0, 4)];
    o[pl::all] = scratch[pl::all];
  };
  pltpu::InterpretParams p;
  p.out_of_bounds_reads = "uninitialized";
  pl::CallOptions opts;
  opts.grid = {1};
  opts.scratch_shapes = {pltpu::VMEM({8, 4}, pl::f32)};
  opts.interpret = p;
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 4}, pl::f32), opts);
  std::string msg = error_of([&] { call(iota_f32({8, 4})); });
  EXPECT_CONTAINS(msg, "Out-of-bounds write of (device 0 core 0 vmem ");
  EXPECT_CONTAINS(msg, "): writing [6:10, 0:4] but buffer has shape (8, 4) at grid point (0).");
  EXPECT_CONTAINS(msg, "(at " + line_ref(__FILE__, line) + ")");
}

// ---- skip_floating_point_ops --------------------------------------------------------------------------
TEST(TpuParams, SkipFloatingPointOps) {
  auto kernel = [](pl::Ref a, pl::Ref b, pl::Ref xi, pl::Ref o, pl::Ref oi) {
    o[pl::all] = pl::dot(a[pl::all], b[pl::all]);
    oi[pl::all] = xi[pl::all] * 3 + 1;
  };
  pl::Array a = iota_f32({8, 16}), b = iota_f32({16, 8}, 1.0f), xi = iota_i32({8, 8}, -5);
  for (bool skip : {false, true}) {
    pltpu::InterpretParams p;
    p.skip_floating_point_ops = skip;
    auto call = pl::pallas_call(kernel, {pl::ShapeDtype({8, 8}, pl::f32), pl::ShapeDtype({8, 8}, pl::i32)},
                                {.interpret = p});
    auto out = call(a, b, xi);
    for (int64_t i = 0; i < 8; ++i)
      for (int64_t j = 0; j < 8; ++j) {
        double want = 0;
        for (int64_t k = 0; k < 16; ++k) want += a.data<float>()[i * 16 + k] * b.data<float>()[k * 8 + j];
        float got = out[0].data<float>()[i * 8 + j];
        if (skip)
          ASSERT_TRUE(std::isinf(got) && got > 0) << got;
        else
          ASSERT_EQ(got, static_cast<float>(want));
        // Integer ops run either way.
        ASSERT_EQ(out[1].data<int32_t>()[i * 8 + j], xi.data<int32_t>()[i * 8 + j] * 3 + 1);
      }
  }
}

// ---- Grid points: recorder, split across cores, permutation ----------------------------------------------
namespace {
struct Recorded {
  std::vector<std::pair<std::vector<int64_t>, int>> points;  // in call order
  std::vector<std::vector<int64_t>> of_core(int c) const {
    std::vector<std::vector<int64_t>> r;
    for (const auto& [p, core] : points)
      if (core == c) r.push_back(p);
    return r;
  }
};

// A kernel over `grid` that writes each point's program ids into its own output element, so the
// output also proves every point ran on the simulated cores.
std::vector<std::vector<int64_t>> run_grid(std::vector<int64_t> grid, std::vector<std::string> sem,
                                           int cores, std::optional<uint64_t> seed,
                                           Recorded* rec = nullptr) {
  pl::CallOptions opts;
  std::vector<pl::GridDim> dims(grid.begin(), grid.end());
  opts.grid = pl::Grid(dims);
  int64_t n = 1;
  for (int64_t g : grid) n *= g;
  const size_t rank = grid.size();
  // One (1, 8) output row per grid point: [id0, id1, ...].
  opts.out_specs = {pl::BlockSpec({1, 8}, [grid](const std::vector<pl::IndexMapArg>& ids) {
    pl::Value lin = ids[0];
    for (size_t d = 1; d < ids.size(); ++d) lin = lin * static_cast<int32_t>(grid[d]) + ids[d];
    return pl::Indices{lin, 0};
  })};
  opts.compiler_params = pltpu::CompilerParams{.dimension_semantics = sem};
  pltpu::InterpretParams p;
  p.num_cores_per_device = cores;
  p.random_seed = seed;
  if (rec)
    p.grid_point_recorder = [rec](const std::vector<int64_t>& pt, int core) {
      rec->points.emplace_back(pt, core);
    };
  opts.interpret = p;
  auto kernel = [rank](std::vector<pl::Ref>& refs) {
    pl::Value row = pl::zeros({1, 8}, pl::i32);
    pl::Value lane = pl::iota(pl::i32, {1, 8}, 1);
    for (size_t d = 0; d < rank; ++d) row = pl::where(lane == static_cast<int32_t>(d), pl::program_id(static_cast<int>(d)), row);
    refs[0][pl::all] = row;
  };
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({n, 8}, pl::i32), opts);
  pl::Array o = call()[0];
  std::vector<std::vector<int64_t>> rows;
  for (int64_t r = 0; r < n; ++r) {
    std::vector<int64_t> row;
    for (size_t d = 0; d < rank; ++d) row.push_back(o.data<int32_t>()[r * 8 + static_cast<int64_t>(d)]);
    rows.push_back(row);
  }
  return rows;
}

// Row-major linear index -> coordinates.
std::vector<int64_t> unravel(int64_t lin, const std::vector<int64_t>& grid) {
  std::vector<int64_t> idx(grid.size());
  for (int d = static_cast<int>(grid.size()) - 1; d >= 0; --d) {
    idx[d] = lin % grid[d];
    lin /= grid[d];
  }
  return idx;
}
}  // namespace

TEST(TpuParams, GridPointRecorderSeesEveryPointInOrder) {
  Recorded rec;
  std::vector<int64_t> grid = {2, 3, 2};
  auto rows = run_grid(grid, {"arbitrary", "arbitrary", "arbitrary"}, 1, std::nullopt, &rec);
  ASSERT_EQ(rec.points.size(), 12u);
  for (int64_t lin = 0; lin < 12; ++lin) {
    EXPECT_EQ(rec.points[lin].first, unravel(lin, grid)) << lin;
    EXPECT_EQ(rec.points[lin].second, 0);
    EXPECT_EQ(rows[lin], unravel(lin, grid)) << lin;  // each point wrote its own row
  }
}

TEST(TpuParams, NoParallelDimsEverythingRunsOnCoreZero) {
  Recorded rec;
  run_grid({3, 2}, {"arbitrary", "arbitrary"}, 4, std::nullopt, &rec);
  ASSERT_EQ(rec.points.size(), 6u);
  for (int64_t lin = 0; lin < 6; ++lin) {
    EXPECT_EQ(rec.points[lin].first, unravel(lin, {3, 2}));
    EXPECT_EQ(rec.points[lin].second, 0);
  }
}

TEST(TpuParams, ParallelDimsAreSplitAcrossCores) {
  // The permutation of the parallel dims depends only on the seed and the grid: learn it from
  // a one-core run, then check each core of a multi-core run gets its share of the linear
  // iterations: P = prod(parallel dims), per_core_points = ceil(P / cores), core c runs
  // [c * ipc, min((c + 1) * ipc, N)) with ipc = per_core_points * N / P.
  struct Case {
    std::vector<int64_t> grid;
    std::vector<std::string> sem;
    int cores;
  };
  const std::vector<Case> cases = {
      {{3, 2}, {"parallel", "arbitrary"}, 2},
      {{5}, {"parallel"}, 2},
      {{2, 3, 2}, {"parallel", "parallel", "arbitrary"}, 4},
      {{3, 4}, {"parallel", "arbitrary"}, 4},  // a spare core runs nothing
      {{2}, {"parallel"}, 4},
  };
  for (const Case& c : cases) {
    Recorded one;
    run_grid(c.grid, c.sem, 1, 7, &one);
    int64_t n = static_cast<int64_t>(one.points.size());
    Recorded many;
    auto rows = run_grid(c.grid, c.sem, c.cores, 7, &many);
    ASSERT_EQ(static_cast<int64_t>(many.points.size()), n);
    int64_t P = 1;
    for (size_t d = 0; d < c.sem.size(); ++d)
      if (c.sem[d] == "parallel") P *= c.grid[d];
    int64_t per_core_points = (P + c.cores - 1) / c.cores;
    int64_t ipc = per_core_points * (n / P);
    for (int core = 0; core < c.cores; ++core) {
      std::vector<std::vector<int64_t>> want;
      for (int64_t lin = core * ipc; lin < std::min((core + 1) * ipc, n); ++lin)
        want.push_back(one.points[static_cast<size_t>(lin)].first);
      EXPECT_EQ(many.of_core(core), want) << "core " << core << " of " << c.cores;
    }
    // Every point ran exactly once and wrote its own row.
    for (int64_t lin = 0; lin < n; ++lin) EXPECT_EQ(rows[lin], unravel(lin, c.grid));
  }
}

TEST(TpuParams, RandomSeedPermutesParallelDims) {
  std::vector<int64_t> grid = {8, 3};
  auto order = [&](std::optional<uint64_t> seed) {
    Recorded rec;
    run_grid(grid, {"parallel", "arbitrary"}, 1, seed, &rec);
    std::vector<int64_t> firsts;
    for (size_t i = 0; i < rec.points.size(); ++i) {
      const auto& pt = rec.points[i].first;
      // The arbitrary dim is not permuted: it runs 0, 1, 2 for each parallel index.
      EXPECT_EQ(pt[1], static_cast<int64_t>(i % 3));
      if (i % 3 == 0) firsts.push_back(pt[0]);
      else EXPECT_EQ(pt[0], firsts.back());
    }
    return firsts;
  };
  std::vector<int64_t> identity = {0, 1, 2, 3, 4, 5, 6, 7};
  std::set<std::vector<int64_t>> distinct;
  for (uint64_t seed : {0u, 1u, 2u, 12345u}) {
    std::vector<int64_t> o = order(seed);
    std::vector<int64_t> sorted = o;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, identity) << "not a permutation for seed " << seed;
    EXPECT_EQ(order(seed), o) << "the same seed gives the same order";
    distinct.insert(o);
  }
  EXPECT_GE(distinct.size(), 3u) << "different seeds should typically give different orders";
  // No seed means seed 0: still permuted, the same way.
  EXPECT_EQ(order(std::nullopt), order(0));
  EXPECT_NE(order(0), identity);
}

TEST(TpuParams, ArbitraryDimsAreNeverPermuted) {
  Recorded rec;
  run_grid({4, 4}, {"arbitrary", "arbitrary"}, 1, 99, &rec);
  for (int64_t lin = 0; lin < 16; ++lin) EXPECT_EQ(rec.points[lin].first, unravel(lin, {4, 4}));
}

TEST(TpuParams, ParallelDimsMustFormAPrefix) {
  std::string msg = error_of([] { run_grid({2, 2}, {"arbitrary", "parallel"}, 1, std::nullopt); });
  EXPECT_CONTAINS(msg, "Dimensions with parallel semantics must form a prefix of the grid.");
  msg = error_of([] { run_grid({2, 2, 2}, {"parallel", "arbitrary", "parallel"}, 2, std::nullopt); });
  EXPECT_CONTAINS(msg, "Dimensions with parallel semantics must form a prefix of the grid.");
}
