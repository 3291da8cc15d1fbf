// SparseCore meshes and indirect DMAs in the TPU interpret mode: scalar/vector subcore meshes,
// per-SparseCore VMEM_SHARED, subcore_barrier (ordering, races, deadlock), gathers, scatters,
// gather-add and scatter-add (atomic between DMAs), and every error of the DMA rules.
#include "pallas/sparse_core.h"
#include "tests/tpu/tpu_test_util.h"

using namespace tpu_test;
namespace plsc = pallas::tpu_sc;

namespace {

// A table whose row r holds r * 100 + column.
pl::Array table_f32(int64_t rows, int64_t cols) {
  pl::Array a = pl::Array::zeros({rows, cols}, pl::f32);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) a.data<float>()[r * cols + c] = static_cast<float>(r * 100 + c);
  return a;
}

pl::Array ids_i32(std::vector<int32_t> v) {
  pl::Array a = pl::Array::zeros({static_cast<int64_t>(v.size())}, pl::i32);
  std::copy(v.begin(), v.end(), a.data<int32_t>());
  return a;
}

pl::Value worker(int subcores) {
  return pltpu::axis_index("core") * subcores + pltpu::axis_index("subcore");
}

}  // namespace

// ---- Meshes ------------------------------------------------------------------------------------
TEST(TpuSparseCore, VectorMeshRunsEverySubcoreWithItsAxisIndices) {
  // 2 cores x 4 subcores: row w of the output holds (core, subcore, w) from that subcore.
  auto body = [](pl::Ref o_hbm, pl::Ref row) {
    pl::Value core = pltpu::axis_index("core"), sub = pltpu::axis_index("subcore");
    pl::Value lane = pl::iota(pl::i32, {1, 8}, 1);
    row[pl::all] = pl::where(lane == 0, core, pl::where(lane == 1, sub, core * 4 + sub));
    pltpu::sync_copy(row, o_hbm.at(pl::ds(core * 4 + sub, 1)));
  };
  std::vector<std::pair<std::vector<int64_t>, int>> seen;
  pltpu::InterpretParams p;
  std::mutex mu;
  p.grid_point_recorder = [&](const std::vector<int64_t>& pt, int core) {
    std::lock_guard<std::mutex> lock(mu);
    seen.emplace_back(pt, core);
  };
  auto call = plsc::kernel(body, {pl::ShapeDtype({8, 8}, pl::i32)},
                           plsc::VectorSubcoreMesh{.num_cores = 2, .num_subcores = 4},
                           {.scratch_shapes = {pltpu::VMEM({1, 8}, pl::i32)}, .interpret = p});
  pl::Array o = call()[0];
  for (int w = 0; w < 8; ++w) {
    EXPECT_EQ(o.data<int32_t>()[w * 8 + 0], w / 4);
    EXPECT_EQ(o.data<int32_t>()[w * 8 + 1], w % 4);
    EXPECT_EQ(o.data<int32_t>()[w * 8 + 5], w);
  }
  ASSERT_EQ(seen.size(), 8u);
  for (const auto& [pt, thread] : seen) EXPECT_EQ(pt[0] * 4 + pt[1], thread);
}

TEST(TpuSparseCore, DefaultsComeFromSparseCoreInfo) {
  plsc::SparseCoreInfo info = plsc::sparse_core_info();
  EXPECT_EQ(info.num_cores, 2);
  EXPECT_EQ(info.num_subcores, 16);
  EXPECT_EQ(info.num_lanes, 16);
  // The default mesh is 2 x 16: 32 threads, each writing its worker id.
  auto body = [](pl::Ref o_hbm, pl::Ref v) {
    v[pl::all] = pl::full({1, 8}, pl::i32, 0) + worker(16);
    pltpu::sync_copy(v, o_hbm.at(pl::ds(worker(16), 1)));
  };
  auto call = plsc::kernel(body, {pl::ShapeDtype({32, 8}, pl::i32)}, plsc::VectorSubcoreMesh{},
                           {.scratch_shapes = {pltpu::VMEM({1, 8}, pl::i32)}});
  pl::Array o = call()[0];
  for (int w = 0; w < 32; ++w) EXPECT_EQ(o.data<int32_t>()[w * 8 + 3], w);
}

TEST(TpuSparseCore, VmemSharedIsSharedByTheSubcoresOfOneSparseCore) {
  // Subcore 0 of each SparseCore writes 1000 * (core + 1) to VMEM_SHARED; after the barrier
  // every subcore reads its own SparseCore's value.
  auto body = [](pl::Ref o_hbm, pl::Ref shared, pl::Ref v) {
    pl::Value core = pltpu::axis_index("core");
    pl::when(pltpu::axis_index("subcore") == 0, [&] {
      v[pl::all] = pl::full({1, 8}, pl::i32, 0) + (core + 1) * 1000;
      pltpu::sync_copy(v, shared);
    });
    plsc::subcore_barrier();
    pltpu::sync_copy(shared, v);
    pltpu::sync_copy(v, o_hbm.at(pl::ds(worker(4), 1)));
  };
  for (const char* mode : kModes) {
    std::shared_ptr<std::vector<pltpu::RaceReport>> races;
    auto call = plsc::kernel(body, {pl::ShapeDtype({8, 8}, pl::i32)},
                             plsc::VectorSubcoreMesh{.num_cores = 2, .num_subcores = 4},
                             {.scratch_shapes = {pltpu::VMEM_SHARED({1, 8}, pl::i32),
                                                 pltpu::VMEM({1, 8}, pl::i32)},
                              .interpret = race_params(races, mode)});
    pl::Array o = call()[0];
    for (int w = 0; w < 8; ++w) EXPECT_EQ(o.data<int32_t>()[w * 8], (w / 4 + 1) * 1000) << mode;
    EXPECT_TRUE(races->empty()) << all_reports(*races);
  }
}

TEST(TpuSparseCore, MissingSubcoreBarrierIsARace) {
  const int write_line = __LINE__ + 5;
  auto body = [](pl::Ref o_hbm, pl::Ref shared, pl::Ref v) {
    pl::Value core = pltpu::axis_index("core");
    pl::when(pltpu::axis_index("subcore") == 0, [&] {
      v[pl::all] = pl::full({1, 8}, pl::i32, 0) + core;
      pltpu::sync_copy(v, shared);
    });
    pltpu::sync_copy(shared, v);  // no subcore_barrier before this read
    pltpu::sync_copy(v, o_hbm.at(pl::ds(worker(2), 1)));
  };
  std::shared_ptr<std::vector<pltpu::RaceReport>> races;
  auto call = plsc::kernel(body, {pl::ShapeDtype({4, 8}, pl::i32)},
                           plsc::VectorSubcoreMesh{.num_cores = 2, .num_subcores = 2},
                           {.scratch_shapes = {pltpu::VMEM_SHARED({1, 8}, pl::i32),
                                               pltpu::VMEM({1, 8}, pl::i32)},
                            .interpret = race_params(races, "eager")});
  call();
  ASSERT_FALSE(races->empty());
  std::string all = all_reports(*races);
  EXPECT_CONTAINS(all, "scratch 0 (vmem_shared, device 0, SparseCore");
  EXPECT_CONTAINS(all, line_ref(__FILE__, write_line));
  EXPECT_CONTAINS(all, "subcore 1");
}

TEST(TpuSparseCore, SubcoreBarrierThatOneSubcoreSkipsIsADeadlock) {
  HangGuard guard(20);
  auto body = [](pl::Ref o_hbm) {
    (void)o_hbm;
    pl::when(pltpu::axis_index("subcore") != 1, [&] { plsc::subcore_barrier(); });
  };
  auto call = plsc::kernel(body, {pl::ShapeDtype({8}, pl::i32)},
                           plsc::VectorSubcoreMesh{.num_cores = 1, .num_subcores = 3});
  std::string msg = error_of<pltpu::DeadlockError>([&] { call(); });
  EXPECT_CONTAINS(msg, "deadlock");
  EXPECT_CONTAINS(msg, "device 0, core 0, subcore 0: at subcore_barrier");
  EXPECT_CONTAINS(msg, "which 2 of 3 subcores have reached");
  EXPECT_CONTAINS(msg, "device 0, core 0, subcore 1: finished");
}

TEST(TpuSparseCore, ScalarMeshRunsOneThreadPerSparseCore) {
  // Each scalar subcore copies row `core` of x through VMEM_SHARED, adding nothing.
  auto body = [](pl::Ref x_hbm, pl::Ref o_hbm, pl::Ref shared) {
    pl::Value core = pltpu::axis_index("sc");
    pltpu::sync_copy(x_hbm.at(pl::ds(core, 1)), shared);
    pltpu::sync_copy(shared, o_hbm.at(pl::ds(core, 1)));
  };
  // Each SparseCore has its own VMEM_SHARED: no race between the two.
  std::shared_ptr<std::vector<pltpu::RaceReport>> races;
  auto call = plsc::kernel(body, {pl::ShapeDtype({2, 16}, pl::f32)},
                           plsc::ScalarSubcoreMesh{.axis_name = "sc"},
                           {.scratch_shapes = {pltpu::VMEM_SHARED({1, 16}, pl::f32)},
                            .interpret = race_params(races, "eager")});
  pl::Array x = iota_f32({2, 16}, 5);
  pl::Array o = call(x)[0];
  for (int i = 0; i < 32; ++i) EXPECT_EQ(o.data<float>()[i], x.data<float>()[i]);
  EXPECT_TRUE(races->empty()) << all_reports(*races);
}

TEST(TpuSparseCore, MeshErrors) {
  auto body = [](pl::Ref o) { (void)o; };
  std::vector<pl::ShapeDtype> out = {pl::ShapeDtype({8}, pl::f32)};
  EXPECT_CONTAINS(error_of<pl::Error>([&] {
                    plsc::kernel(body, out, plsc::VectorSubcoreMesh{.core_axis_name = "x", .subcore_axis_name = "x"});
                  }),
                  "the core and subcore axes need different names, both are 'x'");
  EXPECT_CONTAINS(error_of<pl::Error>([&] {
                    plsc::kernel(body, out, plsc::VectorSubcoreMesh{.num_subcores = -2});
                  }),
                  "VectorSubcoreMesh: axis 'subcore' has size -2");
  EXPECT_CONTAINS(error_of<pl::Error>([&] {
                    plsc::kernel(body, out, plsc::ScalarSubcoreMesh{},
                                 {.compiler_params = pltpu::CompilerParams{.dimension_semantics = {"parallel"}}});
                  }),
                  "dimension_semantics cannot be given for a kernel on a ScalarSubcoreMesh");
  EXPECT_CONTAINS(error_of<pl::Error>([&] {
                    plsc::kernel(body, out, plsc::VectorSubcoreMesh{}, {.grid = {4}});
                  }),
                  "a kernel on a VectorSubcoreMesh takes no grid or BlockSpecs");
  EXPECT_CONTAINS(error_of<pl::Error>([&] {
                    plsc::kernel(body, out, plsc::ScalarSubcoreMesh{},
                                 {.scratch_shapes = {pltpu::VMEM({8}, pl::f32)}});
                  }),
                  "scratch_shapes[0]: a ScalarSubcoreMesh kernel has no VMEM");
  EXPECT_CONTAINS(error_of<pl::Error>([&] {
                    plsc::kernel(body, out, plsc::VectorSubcoreMesh{}, {.interpret = true});
                  }),
                  "runs in the TPU interpret mode");
  EXPECT_CONTAINS(error_of<pl::Error>([&] {
                    plsc::kernel(body, out, plsc::VectorSubcoreMesh{.num_cores = 3});
                  }),
                  "VectorSubcoreMesh has 3 cores, but the simulated chip has only 2 SparseCores");
  EXPECT_CONTAINS(error_of<pl::Error>([&] {
                    plsc::kernel(body, out, plsc::VectorSubcoreMesh{.num_subcores = 17});
                  }),
                  "VectorSubcoreMesh has 17 subcores per core, but each simulated SparseCore has only 16");
  EXPECT_CONTAINS(error_of<pl::Error>([&] { plsc::kernel(body, out, plsc::ScalarSubcoreMesh{.num_cores = 4}); }),
                  "ScalarSubcoreMesh has 4 cores, but the simulated chip has only 2 SparseCores");
  // Mesh compatibility.
  plsc::check_compatible(plsc::ScalarSubcoreMesh{}, plsc::VectorSubcoreMesh{});
  plsc::check_compatible(pltpu::TensorCoreMesh{"tc", 2}, plsc::VectorSubcoreMesh{});
  EXPECT_CONTAINS(error_of<pl::Error>([&] {
                    plsc::check_compatible(plsc::ScalarSubcoreMesh{.axis_name = "sc"}, plsc::VectorSubcoreMesh{});
                  }),
                  "ScalarSubcoreMesh axis 'sc' must be the VectorSubcoreMesh's core axis 'core'");
  EXPECT_CONTAINS(error_of<pl::Error>([&] {
                    plsc::check_compatible(plsc::ScalarSubcoreMesh{.num_cores = 1}, plsc::VectorSubcoreMesh{});
                  }),
                  "ScalarSubcoreMesh has 1 cores but the VectorSubcoreMesh 2");
  EXPECT_CONTAINS(error_of<pl::Error>([&] {
                    plsc::check_compatible(pltpu::TensorCoreMesh{"core", 2}, plsc::ScalarSubcoreMesh{});
                  }),
                  "TensorCoreMesh and ScalarSubcoreMesh both name an axis 'core'");
  EXPECT_CONTAINS(error_of<pl::Error>([&] {
                    plsc::check_compatible(pltpu::TensorCoreMesh{"subcore", 2}, plsc::VectorSubcoreMesh{});
                  }),
                  "TensorCoreMesh and VectorSubcoreMesh both name an axis 'subcore'");
  // subcore_barrier outside a vector-subcore kernel.
  auto barrier_body = [](pl::Ref o) {
    (void)o;
    plsc::subcore_barrier();
  };
  const int line = __LINE__ - 2;
  std::string msg = error_of<pl::Error>([&] { plsc::kernel(barrier_body, out, plsc::ScalarSubcoreMesh{})(); });
  EXPECT_CONTAINS(msg, "subcore_barrier() is only available in a kernel on a VectorSubcoreMesh");
  EXPECT_CONTAINS(msg, line_ref(__FILE__, line));
  EXPECT_CONTAINS(error_of<pl::Error>([&] {
                    pltpu::core_map(barrier_body, out, pltpu::TensorCoreMesh{"core", 2})();
                  }),
                  "subcore_barrier() is only available in a kernel on a VectorSubcoreMesh");
  EXPECT_CONTAINS(error_of<pl::NotSupportedError>([&] {
                    pl::pallas_call(barrier_body, pl::ShapeDtype({8}, pl::f32), {.interpret = true})();
                  }),
                  "subcore_barrier outside the TPU interpret mode");
}

// ---- Gathers -------------------------------------------------------------------------------------
TEST(TpuSparseCore, GatherByIndexRefAndByIndexVector) {
  // Worker w gathers rows ids[w*8 : w*8+8] of the table; half the workers index by the VMEM
  // ref, half by the loaded vector.
  const std::vector<int32_t> ids = {3, 0, 63, 3, 17, 17, 42, 1, 5, 6, 7, 8, 60, 61, 62, 2,
                                    9, 9, 9, 9, 10, 11, 12, 13, 0, 1, 2, 3, 4, 5, 6, 7};
  auto body = [](pl::Ref table, pl::Ref ids_hbm, pl::Ref o_hbm, pl::Ref idx, pl::Ref rows) {
    pl::Value w = worker(2);
    pltpu::sync_copy(ids_hbm.at(pl::ds(w * 8, 8)), idx);
    pl::cond(w % 2 == 0, [&] { pltpu::sync_copy(table.at(idx), rows); },
             [&] { pltpu::sync_copy(table.at(idx[pl::all]), rows); });
    pltpu::sync_copy(rows, o_hbm.at(pl::ds(w * 8, 8)));
  };
  pl::Array table = table_f32(64, 16);
  for (const char* mode : kModes) {
    std::shared_ptr<std::vector<pltpu::RaceReport>> races;
    auto call = plsc::kernel(body, {pl::ShapeDtype({32, 16}, pl::f32)},
                             plsc::VectorSubcoreMesh{.num_cores = 2, .num_subcores = 2},
                             {.scratch_shapes = {pltpu::VMEM({8}, pl::i32), pltpu::VMEM({8, 16}, pl::f32)},
                              .interpret = race_params(races, mode)});
    pl::Array o = call(table, ids_i32(ids))[0];
    for (int i = 0; i < 32; ++i)
      for (int c = 0; c < 16; ++c)
        ASSERT_EQ(o.data<float>()[i * 16 + c], static_cast<float>(ids[i] * 100 + c)) << mode << " row " << i;
    EXPECT_TRUE(races->empty()) << all_reports(*races);
  }
}

TEST(TpuSparseCore, AsyncGatherAddAccumulatesIntoVmem) {
  // acc = 1 + table[ids[0..4]] + table[ids[4..8]] with two gather-adds in flight at once.
  auto body = [](pl::Ref table, pl::Ref ids_hbm, pl::Ref o_hbm, pl::Ref idx, pl::Ref acc, pl::Ref sems) {
    pltpu::sync_copy(ids_hbm, idx);
    acc[pl::all] = pl::full({4, 16}, pl::f32, 1.0f);
    auto a = pltpu::async_copy(table.at(idx.at(pl::ds(0, 4))), acc, sems.at(0), {.add = true});
    auto b = pltpu::async_copy(table.at(idx.at(pl::ds(4, 4))), acc, sems.at(1), {.add = true});
    a.wait();
    b.wait();
    pltpu::sync_copy(acc, o_hbm);
  };
  const std::vector<int32_t> ids = {1, 2, 3, 4, 10, 20, 30, 4};
  for (const char* mode : kModes) {
    std::shared_ptr<std::vector<pltpu::RaceReport>> races;
    auto call = plsc::kernel(body, {pl::ShapeDtype({4, 16}, pl::f32)},
                             plsc::VectorSubcoreMesh{.num_cores = 1, .num_subcores = 1},
                             {.scratch_shapes = {pltpu::VMEM({8}, pl::i32), pltpu::VMEM({4, 16}, pl::f32),
                                                 pltpu::semaphores(pltpu::SemaphoreType::DMA, {2})},
                              .interpret = race_params(races, mode)});
    pl::Array o = call(table_f32(32, 16), ids_i32(ids))[0];
    for (int i = 0; i < 4; ++i)
      for (int c = 0; c < 16; ++c)
        ASSERT_EQ(o.data<float>()[i * 16 + c],
                  1.0f + static_cast<float>(ids[i] * 100 + c) + static_cast<float>(ids[i + 4] * 100 + c))
            << mode;
    EXPECT_TRUE(races->empty()) << all_reports(*races);
  }
}

// ---- Scatters ------------------------------------------------------------------------------------
TEST(TpuSparseCore, ScatterWritesRowsAndLeavesTheOthers) {
  // o starts as x (aliased); worker w scatters 4 rows of value 1000 + w to rows ids[w*4 ...].
  const std::vector<int32_t> ids = {0, 5, 9, 13, 1, 6, 10, 14, 2, 7, 11, 15, 3, 8, 12, 4};
  auto body = [](pl::Ref ids_hbm, pl::Ref x, pl::Ref o_hbm, pl::Ref idx, pl::Ref rows) {
    (void)x;
    pl::Value w = worker(2);
    pltpu::sync_copy(ids_hbm.at(pl::ds(w * 4, 4)), idx);
    rows[pl::all] = pl::full({4, 8}, pl::f32, 1000.0f) + w.astype(pl::f32);
    pltpu::sync_copy(rows, o_hbm.at(idx));
  };
  pl::Array x = iota_f32({20, 8});
  std::shared_ptr<std::vector<pltpu::RaceReport>> races;
  auto call = plsc::kernel(body, {pl::ShapeDtype({20, 8}, pl::f32)},
                           plsc::VectorSubcoreMesh{.num_cores = 2, .num_subcores = 2},
                           {.scratch_shapes = {pltpu::VMEM({4}, pl::i32), pltpu::VMEM({4, 8}, pl::f32)},
                            .input_output_aliases = {{1, 0}},
                            .interpret = race_params(races, "on_wait")});
  pl::Array o = call(ids_i32(ids), x)[0];
  for (int r = 0; r < 20; ++r) {
    int writer = -1;
    for (int i = 0; i < 16; ++i)
      if (ids[i] == r) writer = i / 4;
    for (int c = 0; c < 8; ++c) {
      float want = writer < 0 ? static_cast<float>(r * 8 + c) : 1000.0f + static_cast<float>(writer);
      ASSERT_EQ(o.data<float>()[r * 8 + c], want) << "row " << r;
    }
  }
  EXPECT_TRUE(races->empty()) << all_reports(*races);
}

TEST(TpuSparseCore, ConcurrentScatterAddsAreAtomicButPlainScattersRace) {
  // A histogram: each of 8 workers scatter-adds ones to the bins of its 8 ids (with repeats,
  // within one DMA and across workers). No race; counts exact.
  std::vector<int32_t> ids(64);
  for (int i = 0; i < 64; ++i) ids[static_cast<size_t>(i)] = (i * 7 + i / 9) % 5;
  auto body = [](pl::Ref ids_hbm, pl::Ref zeros, pl::Ref bins, pl::Ref idx, pl::Ref ones) {
    (void)zeros;
    pltpu::sync_copy(ids_hbm.at(pl::ds(worker(4) * 8, 8)), idx);
    ones[pl::all] = pl::full({8, 8}, pl::i32, 1);
    pltpu::sync_copy(ones, bins.at(idx), {.add = true});
  };
  for (const char* mode : kModes) {
    std::shared_ptr<std::vector<pltpu::RaceReport>> races;
    auto call = plsc::kernel(body, {pl::ShapeDtype({5, 8}, pl::i32)},
                             plsc::VectorSubcoreMesh{.num_cores = 2, .num_subcores = 4},
                             {.scratch_shapes = {pltpu::VMEM({8}, pl::i32), pltpu::VMEM({8, 8}, pl::i32)},
                              .input_output_aliases = {{1, 0}},
                              .interpret = race_params(races, mode)});
    pl::Array o = call(ids_i32(ids), pl::Array::zeros({5, 8}, pl::i32))[0];
    std::vector<int> want(5, 0);
    for (int32_t i : ids) ++want[static_cast<size_t>(i)];
    for (int b = 0; b < 5; ++b)
      for (int c = 0; c < 8; ++c) ASSERT_EQ(o.data<int32_t>()[b * 8 + c], want[b]) << mode << " bin " << b;
    EXPECT_TRUE(races->empty()) << all_reports(*races);
  }
  // Plain scatters of two workers to one row race.
  auto racy = [](pl::Ref o_hbm, pl::Ref idx, pl::Ref rows) {
    idx[pl::all] = pl::iota(pl::i32, {2}, 0) * 0 + 3;  // both rows to row 3
    rows[pl::all] = pl::full({2, 8}, pl::f32, 1.0f);
    pltpu::sync_copy(rows, o_hbm.at(idx));
  };
  const int scatter_line = __LINE__ - 2;
  std::shared_ptr<std::vector<pltpu::RaceReport>> races;
  auto call = plsc::kernel(racy, {pl::ShapeDtype({4, 8}, pl::f32)},
                           plsc::VectorSubcoreMesh{.num_cores = 1, .num_subcores = 2},
                           {.scratch_shapes = {pltpu::VMEM({2}, pl::i32), pltpu::VMEM({2, 8}, pl::f32)},
                            .interpret = race_params(races, "eager")});
  call();
  ASSERT_FALSE(races->empty());
  std::string all = all_reports(*races);
  EXPECT_CONTAINS(all, "(scatter DMA write)");
  EXPECT_CONTAINS(all, line_ref(__FILE__, scatter_line));
  EXPECT_CONTAINS(all, "elements [3:4, 0:8]");
}

TEST(TpuSparseCore, ScatterAddRacesWithAPlainWrite) {
  auto body = [](pl::Ref o_hbm, pl::Ref idx, pl::Ref rows) {
    idx[pl::all] = pl::full({2}, pl::i32, 1);
    rows[pl::all] = pl::full({2, 8}, pl::i32, 1);
    pl::cond(pltpu::axis_index("subcore") == 0, [&] { pltpu::sync_copy(rows, o_hbm.at(idx), {.add = true}); },
             [&] { pltpu::sync_copy(rows, o_hbm.at(idx)); });
  };
  std::shared_ptr<std::vector<pltpu::RaceReport>> races;
  auto call = plsc::kernel(body, {pl::ShapeDtype({4, 8}, pl::i32)},
                           plsc::VectorSubcoreMesh{.num_cores = 1, .num_subcores = 2},
                           {.scratch_shapes = {pltpu::VMEM({2}, pl::i32), pltpu::VMEM({2, 8}, pl::i32)},
                            .interpret = race_params(races, "eager")});
  call();
  ASSERT_FALSE(races->empty());
  std::string all = all_reports(*races);
  EXPECT_CONTAINS(all, "(scatter-add DMA write)");
  EXPECT_CONTAINS(all, "(scatter DMA write)");
  EXPECT_CONTAINS(all, "elements [1:2, 0:8]");
}

// ---- Errors ----------------------------------------------------------------------------------------
namespace {
struct DmaCase {
  std::function<void(pl::Ref, pl::Ref, pl::Ref, pl::Ref, pl::Ref, pl::Ref, pl::Ref, pl::Ref)> body;
  const char* expected;
};
// Refs: table (hbm 16x8 f32), o (hbm), idx (vmem i32[4]), fidx (vmem f32[4]), sidx (smem
// i32[4]), rows (vmem 4x8 f32), rows5 (vmem 5x8 f32), sems (dma[2]).
std::string dma_error(const DmaCase& c) {
  auto body = [&c](pl::Ref table, pl::Ref o, pl::Ref idx, pl::Ref fidx, pl::Ref sidx, pl::Ref rows,
                   pl::Ref rows5, pl::Ref sems) { c.body(table, o, idx, fidx, sidx, rows, rows5, sems); };
  return error_of<pl::Error>([&] {
    plsc::kernel(body, {pl::ShapeDtype({16, 8}, pl::f32)},
                 plsc::VectorSubcoreMesh{.num_cores = 1, .num_subcores = 1},
                 {.scratch_shapes = {pltpu::VMEM({4}, pl::i32), pltpu::VMEM({4}, pl::f32),
                                     pltpu::SMEM({4}, pl::i32), pltpu::VMEM({4, 8}, pl::f32),
                                     pltpu::VMEM({5, 8}, pl::f32),
                                     pltpu::semaphores(pltpu::SemaphoreType::DMA, {2})}})(
        table_f32(16, 8));
  });
}
using R = pl::Ref;
}  // namespace

TEST(TpuSparseCore, IndirectDmaErrors) {
  const std::vector<DmaCase> cases = {
      {[](R t, R, R idx, R, R, R rows, R, R) { pltpu::sync_copy(t, rows.at(idx)); },
       "only the source can be indexed in a gather"},
      {[](R, R o, R idx, R, R, R rows, R, R) { pltpu::sync_copy(rows.at(idx), o); },
       "only the destination can be indexed in a scatter"},
      {[](R t, R o, R idx, R, R, R, R, R) { pltpu::sync_copy(t.at(idx), o.at(pl::ds(0, 4))); },
       "not supported yet: a gather/scatter DMA from HBM to HBM"},
      {[](R t, R, R, R, R, R rows, R, R) { pltpu::sync_copy(t.at(pl::ds(0, 4)), rows, {.add = true}); },
       "not supported yet: a DMA with add = true whose major dimension is not indexed"},
      {[](R t, R o, R, R, R, R, R, R) { pltpu::sync_copy(t, o, {.add = true}); },
       "DMAs with add = true only run between VMEM and HBM/VMEM_SHARED; this one copies HBM to HBM"},
      {[](R t, R, R, R fidx, R, R rows, R, R) { pltpu::sync_copy(t.at(fidx), rows); },
       "gather/scatter indices of dtype f32 (only int32 indices)"},
      {[](R t, R, R, R, R sidx, R rows, R, R) { pltpu::sync_copy(t.at(sidx), rows); },
       "gather/scatter indices in SMEM (they must be in VMEM)"},
      {[](R t, R, R idx, R, R, R, R rows5, R) { pltpu::sync_copy(t.at(idx), rows5); },
       "the indexed source has shape (4, 8) but the destination has shape (5, 8)"},
      {[](R t, R, R idx, R, R, R, R, R) {
         pl::Value v = t.at(idx)[0];
         (void)v;
       },
       "can only be the source of a DMA (a gather) or its destination (a scatter)"},
      {[](R t, R, R idx, R, R, R, R, R) { (void)t.at(idx).at(0); }, "cannot be indexed further"},
      {[](R t, R, R idx, R, R, R rows, R, R) { pltpu::sync_copy(t.at(idx[pl::all], 2), rows); },
       "only indexing along the major dimension is supported"},
      {[](R t, R, R idx, R, R, R rows, R, R sems) {
         pltpu::async_remote_copy(t.at(idx), rows, sems.at(0), sems.at(1), 0);
       },
       "not supported yet: a gather/scatter DMA to or from a remote device"},
      {[](R t, R, R idx, R, R, R rows, R, R) {
         idx[pl::all] = pl::iota(pl::i32, {4}, 0) * 5;  // 0, 5, 10, 15: fine
         pltpu::sync_copy(t.at(idx), rows);
         idx[pl::all] = pl::iota(pl::i32, {4}, 0) * 6;  // 18 is past the 16 rows
         pltpu::sync_copy(t.at(idx), rows);
       },
       "gather index 18 (at position 3 of the indices) is out of bounds for the major dimension of "
       "input args[0] (hbm, device 0), of size 16"},
  };
  for (const DmaCase& c : cases) EXPECT_CONTAINS(dma_error(c), c.expected);
  // The line of the failing copy is named.
  const int line = __LINE__ + 1;
  DmaCase bad{[](R t, R, R idx, R, R, R rows, R, R) { pltpu::sync_copy(t, rows.at(idx)); }, ""};
  EXPECT_CONTAINS(dma_error(bad), line_ref(__FILE__, line));
}

TEST(TpuSparseCore, AddOfUnsupportedDtypeIsRefused) {
  auto body = [](pl::Ref t, pl::Ref o, pl::Ref idx, pl::Ref rows) {
    (void)o;
    pltpu::sync_copy(t.at(idx), rows, {.add = true});
  };
  EXPECT_CONTAINS(error_of<pl::NotSupportedError>([&] {
                    plsc::kernel(body, {pl::ShapeDtype({4}, pl::f32)},
                                 plsc::VectorSubcoreMesh{.num_cores = 1, .num_subcores = 1},
                                 {.scratch_shapes = {pltpu::VMEM({2}, pl::i32), pltpu::VMEM({2, 8}, pl::bf16)}})(
                        pl::Array::zeros({4, 8}, pl::bf16));
                  }),
                  "a DMA with add = true on bf16 data");
}

// ---- SparseCore pallas_call block rules --------------------------------------------------------
TEST(TpuSparseCore, PallasCallBlockRules) {
  auto kernel = [](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all] + 1.0f; };
  auto run = [&](pl::BlockShape block, pltpu::KernelType type) {
    pl::CallOptions opts;
    opts.grid = {2};
    opts.in_specs = {pl::BlockSpec(block, [](pl::Value i) { return pl::Indices{i, 0}; })};
    opts.out_specs = {pl::BlockSpec(block, [](pl::Value i) { return pl::Indices{i, 0}; })};
    opts.compiler_params = pltpu::CompilerParams{.kernel_type = type};
    opts.interpret = pltpu::InterpretParams{};
    return pl::pallas_call(kernel, pl::ShapeDtype({16, 12}, pl::f32), opts)(iota_f32({16, 12}))[0];
  };
  // A TensorCore kernel may use a 12-wide block; a SparseCore kernel may not.
  pl::Array o = run({8, 12}, pltpu::KernelType::TC);
  EXPECT_EQ(o.data<float>()[5], 6.0f);
  std::string msg = error_of<pl::Error>([&] { run({8, 12}, pltpu::KernelType::SC_VECTOR_SUBCORE); });
  EXPECT_CONTAINS(msg, "the minor-most dimension of a block of args[0] must be a multiple of 8 on a "
                       "SparseCore, got block shape (8, 12)");
  EXPECT_CONTAINS(error_of<pl::NotSupportedError>([&] {
                    run({pl::squeezed, 12}, pltpu::KernelType::SC_SCALAR_SUBCORE);
                  }),
                  "a Squeezed block dimension (dimension 0 of args[0]) in a SparseCore kernel");
  // With a legal block the SparseCore kernel runs.
  pl::CallOptions opts;
  opts.grid = {2};
  opts.in_specs = {pl::BlockSpec({8, 16}, [](pl::Value i) { return pl::Indices{i, 0}; })};
  opts.out_specs = {pl::BlockSpec({8, 16}, [](pl::Value i) { return pl::Indices{i, 0}; })};
  opts.compiler_params = pltpu::CompilerParams{.kernel_type = pltpu::KernelType::SC_VECTOR_SUBCORE};
  opts.interpret = pltpu::InterpretParams{};
  pl::Array y = pl::pallas_call(kernel, pl::ShapeDtype({16, 16}, pl::f32), opts)(iota_f32({16, 16}))[0];
  for (int i = 0; i < 256; ++i) ASSERT_EQ(y.data<float>()[i], static_cast<float>(i) + 1.0f);
}

// ---- fetch_and_add across subcores -----------------------------------------------------------------
TEST(TpuSparseCore, FetchAndAddOnAnotherSubcoresSmemIsAtomic) {
  // Subcore 0's counter starts at 0; every subcore adds w + 1 to it through subcore_id 0 and
  // records the old value; after a barrier subcore 0 publishes the total.
  auto body = [](pl::Ref olds_hbm, pl::Ref total_hbm, pl::Ref counter, pl::Ref v) {
    pl::Value sub = pltpu::axis_index("subcore");
    pl::when(sub == 0, [&] { counter[0] = 0; });
    plsc::subcore_barrier();
    pl::Value old = plsc::fetch_and_add(counter.at(pl::ds(0, 1)), sub + 1, pl::Operand(0));
    v[pl::all] = pl::full({1, 8}, pl::i32, 0) + old;
    pltpu::sync_copy(v, olds_hbm.at(pl::ds(sub, 1)));
    plsc::subcore_barrier();
    pl::when(sub == 0, [&] {
      v[pl::all] = pl::full({1, 8}, pl::i32, 0) + counter[0];
      pltpu::sync_copy(v, total_hbm);
    });
  };
  for (const char* mode : kModes) {
    std::shared_ptr<std::vector<pltpu::RaceReport>> races;
    auto call = plsc::kernel(body, {pl::ShapeDtype({4, 8}, pl::i32), pl::ShapeDtype({1, 8}, pl::i32)},
                             plsc::VectorSubcoreMesh{.num_cores = 1, .num_subcores = 4},
                             {.scratch_shapes = {pltpu::SMEM({1}, pl::i32), pltpu::VMEM({1, 8}, pl::i32)},
                              .interpret = race_params(races, mode)});
    std::vector<pl::Array> out = call();
    EXPECT_EQ(out[1].data<int32_t>()[0], 1 + 2 + 3 + 4);
    // The old values are the partial sums of some order of the adds: each distinct, each the
    // sum of the increments of the subcores that came before.
    std::set<int32_t> olds;
    for (int s = 0; s < 4; ++s) olds.insert(out[0].data<int32_t>()[s * 8]);
    EXPECT_EQ(olds.size(), 4u);
    EXPECT_TRUE(olds.count(0));
    EXPECT_TRUE(races->empty()) << all_reports(*races);
  }
  // subcore_id out of range.
  auto bad = [](pl::Ref o, pl::Ref counter) {
    (void)o;
    (void)plsc::fetch_and_add(counter.at(pl::ds(0, 1)), 1, pl::Operand(5));
  };
  EXPECT_CONTAINS(error_of<pl::Error>([&] {
                    plsc::kernel(bad, {pl::ShapeDtype({8}, pl::i32)},
                                 plsc::VectorSubcoreMesh{.num_cores = 1, .num_subcores = 4},
                                 {.scratch_shapes = {pltpu::SMEM({1}, pl::i32)}})();
                  }),
                  "fetch_and_add on subcore 5: subcore_id out of range; this SparseCore has 4 vector subcores");
}

// ---- lax sort / rev on a vector subcore ------------------------------------------------------------
TEST(TpuSparseCore, SortAndRevFollowTheSparseCoreRules) {
  // One key, (16,) vectors: runs (descending by reversing the ascending sort).
  auto ok = [](pl::Ref x_hbm, pl::Ref o_hbm, pl::Ref v) {
    pltpu::sync_copy(x_hbm, v);
    std::vector<pl::Value> s = pl::sort(std::vector<pl::Value>{v[pl::all]});
    v[pl::all] = pl::rev(s[0], {0});
    pltpu::sync_copy(v, o_hbm);
  };
  pl::Array x = iota_f32({16});
  for (int i = 0; i < 16; ++i) x.data<float>()[i] = static_cast<float>((i * 7) % 16);
  pl::Array o = plsc::kernel(ok, {pl::ShapeDtype({16}, pl::f32)},
                             plsc::VectorSubcoreMesh{.num_cores = 1, .num_subcores = 1},
                             {.scratch_shapes = {pltpu::VMEM({16}, pl::f32)}})(x)[0];
  for (int i = 0; i < 16; ++i) EXPECT_EQ(o.data<float>()[i], static_cast<float>(15 - i));
  // Two keys, a (32,) vector, rev of a (2, 16) tile: refused, naming the line.
  auto two_keys = [](pl::Ref o, pl::Ref v) {
    (void)o;
    pl::Value a = v[pl::all];
    (void)pl::sort(std::vector<pl::Value>{a, a}, 2);
  };
  EXPECT_CONTAINS(error_of<pl::NotSupportedError>([&] {
                    plsc::kernel(two_keys, {pl::ShapeDtype({16}, pl::f32)},
                                 plsc::VectorSubcoreMesh{.num_cores = 1, .num_subcores = 1},
                                 {.scratch_shapes = {pltpu::VMEM({16}, pl::f32)}})();
                  }),
                  "a sort with 2 keys on a SparseCore vector subcore (one key only)");
  auto wide = [](pl::Ref o, pl::Ref v) {
    (void)o;
    (void)pl::sort(std::vector<pl::Value>{v[pl::all]});
  };
  const int line = __LINE__ - 2;
  std::string msg = error_of<pl::NotSupportedError>([&] {
    plsc::kernel(wide, {pl::ShapeDtype({16}, pl::f32)},
                 plsc::VectorSubcoreMesh{.num_cores = 1, .num_subcores = 1},
                 {.scratch_shapes = {pltpu::VMEM({32}, pl::f32)}})();
  });
  EXPECT_CONTAINS(msg, "operand 0 of a sort on a SparseCore vector subcore has shape (32,) (only (16,) vectors)");
  EXPECT_CONTAINS(msg, line_ref(__FILE__, line));
  auto rev2d = [](pl::Ref o, pl::Ref v) {
    (void)o;
    (void)pl::rev(v[pl::all], {1});
  };
  EXPECT_CONTAINS(error_of<pl::NotSupportedError>([&] {
                    plsc::kernel(rev2d, {pl::ShapeDtype({16}, pl::f32)},
                                 plsc::VectorSubcoreMesh{.num_cores = 1, .num_subcores = 1},
                                 {.scratch_shapes = {pltpu::VMEM({2, 16}, pl::f32)}})();
                  }),
                  "rev of (2, 16) on a SparseCore vector subcore (only dimension 0 of a (16,) vector)");
  // The same kernels run on the TensorCore (a plain TPU-interpret core_map).
  pltpu::core_map(wide, {pl::ShapeDtype({16}, pl::f32)}, pltpu::TensorCoreMesh{"core", 1},
                  {.scratch_shapes = {pltpu::VMEM({32}, pl::f32)}})();
}
