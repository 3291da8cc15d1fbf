// The SparseCore vector subcore ops (pallas/sparse_core_ops.h): every op against a plain C++
// reference, in the reference interpreter and in the TPU interpret mode; the race detector and
// the access locks seeing their memory accesses; and every trace-time and run-time error.
#include <algorithm>
#include <bit>
#include <cstring>
#include <numeric>
#include <random>

#include "gpu/codegen.h"
#include "core/call.h"
#include "pallas/sparse_core_ops.h"
#include "pallas/transforms.h"
#include "tests/tpu/tpu_test_util.h"

namespace plsc = pallas::tpu_sc;
namespace ir = pallas::ir;
using namespace tpu_test;

namespace {

constexpr int64_t L = 16;  // the default number of lanes

enum class Mode { Reference, Tpu };

template <class T> pl::Array random_array(pl::Shape shape, pl::DType dtype, uint32_t seed, int lo, int hi) {
  pl::Array a = pl::Array::zeros(shape, dtype);
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(lo, hi - 1);
  for (int64_t i = 0; i < a.size(); ++i) a.data<T>()[i] = static_cast<T>(dist(gen));
  return a;
}
pl::Array random_i32(pl::Shape s, uint32_t seed, int lo, int hi) { return random_array<int32_t>(s, pl::i32, seed, lo, hi); }
pl::Array random_f32(pl::Shape s, uint32_t seed) {
  pl::Array a = random_array<float>(s, pl::f32, seed, -1000, 1000);
  for (int64_t i = 0; i < a.size(); ++i) a.data<float>()[i] *= 0.125f;
  return a;
}
// A mask given to kernels as i32 0/1 (kernels compare it with 0).
pl::Array random_mask(int64_t n, uint32_t seed) { return random_i32({n}, seed, 0, 2); }
pl::Array all_ones(int64_t n) { return pl::Array::full({n}, pl::i32, 1); }

template <class T> std::vector<T> values(const pl::Array& a) { return a.to_vector<T>(); }

class ScOps : public testing::TestWithParam<Mode> {
 protected:
  pl::CallOptions options(std::vector<pl::ScratchShape> scratch = {}) const {
    pl::CallOptions o;
    o.scratch_shapes = std::move(scratch);
    if (GetParam() == Mode::Reference)
      o.interpret = true;
    else
      o.interpret = pltpu::InterpretParams{};
    return o;
  }
  template <class K>
  std::vector<pl::Array> run(K kernel, std::vector<pl::ShapeDtype> outs, const std::vector<pl::Array>& ins,
                             std::vector<pl::ScratchShape> scratch = {}) const {
    return pl::pallas_call(kernel, std::move(outs), options(std::move(scratch)))(ins);
  }
};

std::string mode_name(const testing::TestParamInfo<Mode>& i) {
  return i.param == Mode::Reference ? "Reference" : "TpuInterpret";
}

}  // namespace

INSTANTIATE_TEST_SUITE_P(Modes, ScOps, testing::Values(Mode::Reference, Mode::Tpu), mode_name);

// ---- SparseCore info ----------------------------------------------------------------------------------

TEST(ScInfo, DefaultsAndVectorShapes) {
  plsc::SparseCoreInfo info = plsc::sparse_core_info();
  EXPECT_EQ(info.num_cores, 2);
  EXPECT_EQ(info.num_subcores, 16);
  EXPECT_EQ(info.num_lanes, 16);
  EXPECT_EQ(plsc::vector_shapes(pl::f32), std::vector<pl::Shape>({{16}}));
  EXPECT_EQ(plsc::vector_shapes(pl::u32), std::vector<pl::Shape>({{16}}));
  EXPECT_EQ(plsc::vector_shapes(pl::bf16), std::vector<pl::Shape>({{32}, {2, 16}}));
  EXPECT_EQ(plsc::vector_shapes(pl::i8), std::vector<pl::Shape>({{64}, {4, 16}}));
  EXPECT_TRUE(plsc::vector_shapes(pl::f64).empty());
  EXPECT_TRUE(plsc::vector_shapes(pl::DType::DmaSemaphore).empty());
  EXPECT_EQ(plsc::vector_shapes(pl::DType::Bool), std::vector<pl::Shape>({{16}, {32}, {2, 16}, {64}, {4, 16}}));
}

TEST(ScInfo, SetValidatesAndKeepsTheOldValueOnError) {
  EXPECT_CONTAINS(error_of([] { plsc::set_sparse_core_info({.num_cores = 0}); }), "num_cores must be >= 1, got 0");
  EXPECT_CONTAINS(error_of([] { plsc::set_sparse_core_info({.num_subcores = -2}); }), "num_subcores must be >= 1");
  EXPECT_CONTAINS(error_of([] { plsc::set_sparse_core_info({.num_lanes = 12}); }),
                  "num_lanes must be a power of two, got 12");
  EXPECT_EQ(plsc::sparse_core_info().num_lanes, 16);
}

TEST(ScInfo, ShapesFollowTheConfiguredLaneCount) {
  plsc::set_sparse_core_info({.num_cores = 1, .num_subcores = 4, .num_lanes = 8});
  struct Restore {
    ~Restore() { plsc::set_sparse_core_info({}); }
  } restore;
  EXPECT_EQ(plsc::vector_shapes(pl::i32), std::vector<pl::Shape>({{8}}));
  EXPECT_EQ(plsc::vector_shapes(pl::i16), std::vector<pl::Shape>({{16}, {2, 8}}));
  // An 8-lane gather traces and runs; a 16-lane one is now the wrong shape.
  auto gather = [](pl::Ref x, pl::Ref idx, pl::Ref o) { o[pl::all] = plsc::load_gather(x, {idx[pl::all]}); };
  pl::CallOptions opts;
  opts.interpret = true;
  pl::Array x = iota_i32({32}, 100);
  pl::Array idx = pl::Array::from_vector<int32_t>({8}, {31, 0, 5, 5, 7, 30, 1, 2});
  pl::Array o = pl::pallas_call(gather, pl::ShapeDtype({8}, pl::i32), opts)(x, idx)[0];
  EXPECT_EQ(values<int32_t>(o), std::vector<int32_t>({131, 100, 105, 105, 107, 130, 101, 102}));
  const int line = __LINE__ + 1;
  auto gather16 = [](pl::Ref x, pl::Ref idx, pl::Ref o) { o[pl::all] = plsc::load_gather(x, {idx[pl::all]}); };
  EXPECT_EQ(error_of([&] {
              pl::pallas_call(gather16, pl::ShapeDtype({16}, pl::i32), opts)(x, iota_i32({16}));
            }),
            "load_gather: only supports i32 arrays of shapes [(8,)], got (16,) (the SparseCore has 8 lanes) (at " +
                line_ref(__FILE__, line) + ")");
}

// ---- Gathers and scatters -----------------------------------------------------------------------------

TEST_P(ScOps, LoadGather1DWithAndWithoutMask) {
  pl::Array x = random_f32({64}, 1);
  pl::Array idx = random_i32({L}, 2, 0, 64);
  idx.data<int32_t>()[3] = idx.data<int32_t>()[9];  // a repeated index
  for (bool masked : {false, true}) {
    pl::Array mask = masked ? random_mask(L, 3) : all_ones(L);
    auto kernel = [masked](pl::Ref x, pl::Ref idx, pl::Ref m, pl::Ref o) {
      std::optional<pl::Value> mask;
      if (masked) mask = m[pl::all] != 0;
      o[pl::all] = plsc::load_gather(x, {idx[pl::all]}, mask);
    };
    pl::Array o = run(kernel, {pl::ShapeDtype({L}, pl::f32)}, {x, idx, mask})[0];
    for (int64_t i = 0; i < L; ++i) {
      float want = mask.data<int32_t>()[i] ? x.data<float>()[idx.data<int32_t>()[i]] : 0.0f;
      EXPECT_EQ(o.data<float>()[i], want) << "lane " << i << " masked " << masked;
    }
  }
}

TEST_P(ScOps, LoadGather2DAndFromAView) {
  pl::Array x = random_i32({8, 32}, 4, -50, 50);
  pl::Array rows = random_i32({L}, 5, 0, 8), cols = random_i32({L}, 6, 0, 32);
  auto kernel = [](pl::Ref x, pl::Ref r, pl::Ref c, pl::Ref o2, pl::Ref o1) {
    o2[pl::all] = plsc::load_gather(x, {r[pl::all], c[pl::all]});
    // Row 5, columns 8..23 as a 1-D view.
    o1[pl::all] = plsc::load_gather(x.at(5, pl::ds(8, 16)), {c[pl::all] % 16});
  };
  auto out = run(kernel, {pl::ShapeDtype({L}, pl::i32), pl::ShapeDtype({L}, pl::i32)}, {x, rows, cols});
  for (int64_t i = 0; i < L; ++i) {
    const int32_t r = rows.data<int32_t>()[i], c = cols.data<int32_t>()[i];
    EXPECT_EQ(out[0].data<int32_t>()[i], x.data<int32_t>()[r * 32 + c]) << i;
    EXPECT_EQ(out[1].data<int32_t>()[i], x.data<int32_t>()[5 * 32 + 8 + c % 16]) << i;
  }
}

TEST_P(ScOps, StoreScatterLastLaneWinsAndMaskedLanesWriteNothing) {
  pl::Array x = random_f32({L}, 7);
  pl::Array idx = random_i32({L}, 8, 0, 24);
  idx.data<int32_t>()[2] = idx.data<int32_t>()[11] = 5;  // lanes 2 and 11 both store to 5
  for (bool masked : {false, true}) {
    pl::Array mask = masked ? random_mask(L, 9) : all_ones(L);
    auto kernel = [masked](pl::Ref x, pl::Ref idx, pl::Ref m, pl::Ref o) {
      o[pl::all] = pl::full({24}, pl::f32, -1.0);
      std::optional<pl::Value> mask;
      if (masked) mask = m[pl::all] != 0;
      plsc::store_scatter(o, {idx[pl::all]}, x[pl::all], mask);
    };
    pl::Array o = run(kernel, {pl::ShapeDtype({24}, pl::f32)}, {x, idx, mask})[0];
    std::vector<float> want(24, -1.0f);
    for (int64_t i = 0; i < L; ++i)
      if (mask.data<int32_t>()[i]) want[static_cast<size_t>(idx.data<int32_t>()[i])] = x.data<float>()[i];
    EXPECT_EQ(values<float>(o), want) << "masked " << masked;
  }
}

TEST_P(ScOps, StoreScatter2DRowByRow) {
  pl::Array x = random_i32({4, L}, 10, -9, 9);
  std::vector<int32_t> perm(L);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(11));
  pl::Array p = pl::Array::from_vector<int32_t>({L}, perm);
  auto kernel = [](pl::Ref x, pl::Ref p, pl::Ref o) {
    for (int r = 0; r < 4; ++r)
      plsc::store_scatter(o, {pl::full({L}, pl::i32, r), p[pl::all]}, x[r]);
  };
  pl::Array o = run(kernel, {pl::ShapeDtype({4, L}, pl::i32)}, {x, p})[0];
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t i = 0; i < L; ++i) EXPECT_EQ(o.data<int32_t>()[r * L + perm[i]], x.data<int32_t>()[r * L + i]);
}

TEST_P(ScOps, AddupdateScatterAddsEveryActiveLane) {
  for (pl::DType dt : {pl::i32, pl::f32}) {
    pl::Array x = dt == pl::i32 ? random_i32({L}, 12, -100, 100) : random_f32({L}, 12);
    pl::Array idx = random_i32({L}, 13, 0, 6);  // many repeats
    pl::Array mask = random_mask(L, 14);
    auto kernel = [dt](pl::Ref x, pl::Ref idx, pl::Ref m, pl::Ref o) {
      o[pl::all] = pl::full({8}, dt, 1.0);
      plsc::addupdate_scatter(o, {idx[pl::all]}, x[pl::all], m[pl::all] != 0);
    };
    pl::Array o = run(kernel, {pl::ShapeDtype({8}, dt)}, {x, idx, mask})[0];
    for (int64_t j = 0; j < 8; ++j) {
      double want = 1;  // lane order, as the op adds
      if (dt == pl::f32) {
        float acc = 1.0f;
        for (int64_t i = 0; i < L; ++i)
          if (mask.data<int32_t>()[i] && idx.data<int32_t>()[i] == j) acc += x.data<float>()[i];
        EXPECT_EQ(o.data<float>()[j], acc) << j;
      } else {
        for (int64_t i = 0; i < L; ++i)
          if (mask.data<int32_t>()[i] && idx.data<int32_t>()[i] == j) want += x.data<int32_t>()[i];
        EXPECT_EQ(o.data<int32_t>()[j], static_cast<int32_t>(want)) << j;
      }
    }
  }
}

// ---- Expanded and compressed accesses -----------------------------------------------------------------

TEST_P(ScOps, LoadExpandedFillsActiveLanesFromConsecutiveElements) {
  pl::Array x = random_i32({L}, 15, -99, 99);
  pl::Array mask = random_mask(L, 16);
  auto kernel = [](pl::Ref x, pl::Ref m, pl::Ref o) { o[pl::all] = plsc::load_expanded(x, m[pl::all] != 0); };
  pl::Array o = run(kernel, {pl::ShapeDtype({L}, pl::i32)}, {x, mask})[0];
  for (int64_t i = 0, k = 0; i < L; ++i)
    EXPECT_EQ(o.data<int32_t>()[i], mask.data<int32_t>()[i] ? x.data<int32_t>()[k++] : 0) << i;
}

TEST_P(ScOps, LoadExpandedOfAPackedTwoDimensionalVector) {
  // bf16 vectors are (32,) or (2, 16); lanes pair with elements in row-major order.
  pl::Array x = pl::Array::zeros({2, L}, pl::bf16);
  for (int64_t i = 0; i < 2 * L; ++i) x.data<pl::bfloat16>()[i].bits = static_cast<uint16_t>(0x3f80 + i);
  pl::Array mask = random_i32({2, L}, 17, 0, 2);
  auto kernel = [](pl::Ref x, pl::Ref m, pl::Ref o) { o[pl::all] = plsc::load_expanded(x, m[pl::all] != 0); };
  pl::Array o = run(kernel, {pl::ShapeDtype({2, L}, pl::bf16)}, {x, mask})[0];
  for (int64_t i = 0, k = 0; i < 2 * L; ++i)
    EXPECT_EQ(o.data<pl::bfloat16>()[i].bits, mask.data<int32_t>()[i] ? x.data<pl::bfloat16>()[k++].bits : 0) << i;
}

TEST_P(ScOps, StoreCompressedWritesActiveLanesConsecutively) {
  pl::Array x = random_f32({L}, 18);
  pl::Array mask = random_mask(L, 19);
  auto kernel = [](pl::Ref x, pl::Ref m, pl::Ref o) {
    o[pl::all] = pl::full({L}, pl::f32, -7.0);
    plsc::store_compressed(o, x[pl::all], m[pl::all] != 0);
  };
  pl::Array o = run(kernel, {pl::ShapeDtype({L}, pl::f32)}, {x, mask})[0];
  std::vector<float> want(L, -7.0f);
  size_t k = 0;
  for (int64_t i = 0; i < L; ++i)
    if (mask.data<int32_t>()[i]) want[k++] = x.data<float>()[i];
  EXPECT_EQ(values<float>(o), want);
}

TEST_P(ScOps, AddupdateAddsTheWholeVector) {
  // As JAX's test: 16 adds of a broadcast i.
  auto kernel = [](pl::Ref o) {
    o[pl::all] = pl::zeros({L}, pl::i32);
    pl::fori_loop(0, static_cast<int>(L), [&](pl::Value i) { plsc::addupdate(o, pl::broadcast_to(i, {L})); });
  };
  pl::Array o = run(kernel, {pl::ShapeDtype({L}, pl::i32)}, {})[0];
  EXPECT_EQ(values<int32_t>(o), std::vector<int32_t>(L, static_cast<int32_t>(L * (L - 1) / 2)));
}

TEST_P(ScOps, AddupdateCompressedAddsActiveLanesToAPrefix) {
  pl::Array x = random_f32({L}, 20);
  pl::Array mask = random_mask(L, 21);
  auto kernel = [](pl::Ref x, pl::Ref m, pl::Ref o) {
    o[pl::all] = pl::full({L}, pl::f32, 0.5);
    plsc::addupdate_compressed(o, x[pl::all], m[pl::all] != 0);
    plsc::addupdate_compressed(o, x[pl::all], m[pl::all] != 0);
  };
  pl::Array o = run(kernel, {pl::ShapeDtype({L}, pl::f32)}, {x, mask})[0];
  std::vector<float> want(L, 0.5f);
  for (int rep = 0; rep < 2; ++rep) {
    size_t k = 0;
    for (int64_t i = 0; i < L; ++i)
      if (mask.data<int32_t>()[i]) want[k++] += x.data<float>()[i];
  }
  EXPECT_EQ(values<float>(o), want);
}

// ---- Lane ops -----------------------------------------------------------------------------------------

TEST_P(ScOps, BitcastKeepsTheRankAndTheBytes) {
  pl::Array x = random_i32({L}, 22, -1 << 30, 1 << 30);
  auto kernel = [](pl::Ref x, pl::Ref o8, pl::Ref o16, pl::Ref of, pl::Ref back) {
    pl::Value v = x[pl::all];
    o8[pl::all] = plsc::bitcast(v, pl::i8);
    o16[pl::all] = plsc::bitcast(v, pl::i16);
    of[pl::all] = plsc::bitcast(v, pl::f32);
    back[pl::all] = plsc::bitcast(plsc::bitcast(v, pl::u8), pl::i32);
  };
  auto out = run(kernel,
                 {pl::ShapeDtype({4 * L}, pl::i8), pl::ShapeDtype({2 * L}, pl::i16), pl::ShapeDtype({L}, pl::f32),
                  pl::ShapeDtype({L}, pl::i32)},
                 {x});
  for (const pl::Array& o : out) EXPECT_EQ(std::memcmp(o.raw_data(), x.raw_data(), L * 4), 0) << pl::dtype_name(o.dtype());
}

// Plain references of the masked scans (docs/SPARSE_CORE.md).
template <class T> std::vector<T> ref_scan(const std::vector<T>& x, const std::vector<int32_t>& m, char kind) {
  std::vector<T> out(x.size());
  bool seen = false;
  T acc = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (m[i]) {
      if (kind == 's') acc = seen ? static_cast<T>(acc + x[i]) : x[i];
      else if (kind == 'M') acc = seen ? std::max(acc, x[i]) : x[i];
      else acc = seen ? std::min(acc, x[i]) : x[i];
      seen = true;
    }
    out[i] = seen ? acc : (kind == 's' ? T(0) : x[i]);
  }
  return out;
}

TEST_P(ScOps, MaskedAndUnmaskedCumsumCummaxCummin) {
  for (pl::DType dt : {pl::i32, pl::u32, pl::f32}) {
    pl::Array x = dt == pl::f32 ? random_f32({L}, 23) : random_i32({L}, 23, -1000, 1000).astype(dt);
    for (bool masked : {false, true}) {
      pl::Array mask = masked ? random_mask(L, 24) : all_ones(L);
      mask.data<int32_t>()[0] = 0;  // lane 0 inactive: pass-through (max, min) and 0 (sum)
      if (!masked) mask = all_ones(L);
      auto kernel = [masked](pl::Ref x, pl::Ref m, pl::Ref s, pl::Ref mx, pl::Ref mn) {
        std::optional<pl::Value> mask;
        if (masked) mask = m[pl::all] != 0;
        s[pl::all] = plsc::cumsum(x[pl::all], mask);
        mx[pl::all] = plsc::cummax(x[pl::all], mask);
        mn[pl::all] = plsc::cummin(x[pl::all], mask);
      };
      auto out = run(kernel, {pl::ShapeDtype({L}, dt), pl::ShapeDtype({L}, dt), pl::ShapeDtype({L}, dt)}, {x, mask});
      std::vector<int32_t> m = values<int32_t>(mask);
      SCOPED_TRACE(std::string(pl::dtype_name(dt)) + (masked ? " masked" : ""));
      if (dt == pl::f32) {
        EXPECT_EQ(values<float>(out[0]), ref_scan(values<float>(x), m, 's'));
        EXPECT_EQ(values<float>(out[1]), ref_scan(values<float>(x), m, 'M'));
        EXPECT_EQ(values<float>(out[2]), ref_scan(values<float>(x), m, 'm'));
      } else if (dt == pl::u32) {
        EXPECT_EQ(values<uint32_t>(out[0]), ref_scan(values<uint32_t>(x), m, 's'));
        EXPECT_EQ(values<uint32_t>(out[1]), ref_scan(values<uint32_t>(x), m, 'M'));
        EXPECT_EQ(values<uint32_t>(out[2]), ref_scan(values<uint32_t>(x), m, 'm'));
      } else {
        EXPECT_EQ(values<int32_t>(out[0]), ref_scan(values<int32_t>(x), m, 's'));
        EXPECT_EQ(values<int32_t>(out[1]), ref_scan(values<int32_t>(x), m, 'M'));
        EXPECT_EQ(values<int32_t>(out[2]), ref_scan(values<int32_t>(x), m, 'm'));
      }
    }
  }
}

TEST_P(ScOps, ScanCountCountsRunningDuplicates) {
  for (pl::DType dt : {pl::i32, pl::f32}) {
    pl::Array x = random_i32({L}, 25, 0, 5).astype(dt);
    for (bool masked : {false, true}) {
      pl::Array mask = masked ? random_mask(L, 26) : all_ones(L);
      auto kernel = [masked](pl::Ref x, pl::Ref m, pl::Ref counts, pl::Ref last) {
        std::optional<pl::Value> mask;
        if (masked) mask = m[pl::all] != 0;
        auto [c, l] = plsc::scan_count(x[pl::all], mask);
        counts[pl::all] = c;
        last[pl::all] = l.astype(pl::i32);
      };
      auto out = run(kernel, {pl::ShapeDtype({L}, pl::i32), pl::ShapeDtype({L}, pl::i32)}, {x, mask});
      std::vector<double> xs = x.to_doubles();
      for (int64_t i = 0; i < L; ++i) {
        int32_t count = 0, later = 0;
        const bool active = mask.data<int32_t>()[i] != 0;
        for (int64_t j = 0; j <= i; ++j) count += mask.data<int32_t>()[j] && xs[j] == xs[i];
        for (int64_t j = i + 1; j < L; ++j) later += mask.data<int32_t>()[j] && xs[j] == xs[i];
        EXPECT_EQ(out[0].data<int32_t>()[i], active ? count : 0) << i;
        EXPECT_EQ(out[1].data<int32_t>()[i], active && later == 0 ? 1 : 0) << i;
      }
    }
  }
}

TEST_P(ScOps, AllReducePopulationCountAndFindFirstSet) {
  for (uint32_t seed : {27u, 28u}) {
    pl::Array x = random_i32({L}, seed, 0, 100);
    auto kernel = [](pl::Ref x, pl::Ref pop, pl::Ref ffs, pl::Ref none, pl::Ref pop2) {
      pl::Value m = x[pl::all] < 30;
      pop[pl::all] = plsc::all_reduce_population_count(m);
      ffs[pl::all] = plsc::all_reduce_ffs(m);
      none[pl::all] = plsc::all_reduce_ffs(x[pl::all] < 0);
      // A mask of a packed (32,) vector, reduced by 2.
      pop2[pl::all] = plsc::all_reduce_population_count(pl::concatenate({m, m}, 0), 2);
    };
    auto out = run(kernel,
                   {pl::ShapeDtype({L}, pl::i32), pl::ShapeDtype({L}, pl::i32), pl::ShapeDtype({L}, pl::i32),
                    pl::ShapeDtype({L}, pl::i32)},
                   {x});
    int32_t count = 0, first = -1;
    for (int64_t i = 0; i < L; ++i)
      if (x.data<int32_t>()[i] < 30) {
        ++count;
        if (first < 0) first = static_cast<int32_t>(i);
      }
    if (first < 0) first = L;
    EXPECT_EQ(values<int32_t>(out[0]), std::vector<int32_t>(L, count));
    EXPECT_EQ(values<int32_t>(out[1]), std::vector<int32_t>(L, first));
    EXPECT_EQ(values<int32_t>(out[2]), std::vector<int32_t>(L, static_cast<int32_t>(L)));
    EXPECT_EQ(values<int32_t>(out[3]), std::vector<int32_t>(L, 2 * count));
  }
}

// The reference of sort_key_val: valid lanes first, by key (stable), then the invalid lanes in
// their original order.
std::vector<int64_t> ref_sort_order(const std::vector<double>& keys, const std::vector<int32_t>& mask, bool desc) {
  std::vector<int64_t> order(keys.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    if (mask[a] != mask[b]) return mask[a] > mask[b];
    if (!mask[a]) return false;
    return desc ? keys[a] > keys[b] : keys[a] < keys[b];
  });
  return order;
}

TEST_P(ScOps, SortKeyValIsStableAndPutsInvalidLanesLast) {
  for (pl::DType kt : {pl::i32, pl::u32, pl::f32}) {
    pl::Array keys = random_i32({L}, 29, -8, 8);  // many equal keys
    keys = kt == pl::u32 ? random_i32({L}, 29, 0, 8).astype(kt) : keys.astype(kt);
    pl::Array vals = iota_i32({L}, 100);
    pl::Array fvals = iota_f32({L}, 0.5f);
    for (bool masked : {false, true}) {
      for (bool desc : {false, true}) {
        SCOPED_TRACE(std::string(pl::dtype_name(kt)) + (masked ? " masked" : "") + (desc ? " descending" : ""));
        pl::Array mask = masked ? random_mask(L, 30) : all_ones(L);
        auto kernel = [masked, desc](pl::Ref k, pl::Ref v, pl::Ref f, pl::Ref m, pl::Ref ok, pl::Ref ov, pl::Ref of,
                                     pl::Ref om) {
          plsc::SortOptions so{.descending = desc};
          if (masked) so.mask = m[pl::all] != 0;
          std::vector<pl::Value> r = plsc::sort_key_val(k[pl::all], {v[pl::all], f[pl::all]}, so);
          ok[pl::all] = r[0];
          ov[pl::all] = r[1];
          of[pl::all] = r[2];
          om[pl::all] = masked ? r.at(3).astype(pl::i32) : pl::full({L}, pl::i32, 7.0);
        };
        auto out = run(kernel,
                       {pl::ShapeDtype({L}, kt), pl::ShapeDtype({L}, pl::i32), pl::ShapeDtype({L}, pl::f32),
                        pl::ShapeDtype({L}, pl::i32)},
                       {keys, vals, fvals, mask});
        std::vector<int64_t> order = ref_sort_order(keys.to_doubles(), values<int32_t>(mask), desc);
        int32_t valid = 0;
        for (int64_t i = 0; i < L; ++i) valid += mask.data<int32_t>()[i];
        for (int64_t i = 0; i < L; ++i) {
          EXPECT_EQ(out[0].get_flat(i), keys.get_flat(order[i])) << i;
          EXPECT_EQ(out[1].data<int32_t>()[i], vals.data<int32_t>()[order[i]]) << i;
          EXPECT_EQ(out[2].data<float>()[i], fvals.data<float>()[order[i]]) << i;
          EXPECT_EQ(out[3].data<int32_t>()[i], masked ? (i < valid ? 1 : 0) : 7) << i;
        }
      }
    }
  }
}

TEST_P(ScOps, SortKeyValWithOneValueVector) {
  pl::Array keys = pl::Array::from_vector<float>({L}, {3, -1, 2, 2, 0, -5, 9, 1, 1, 4, -2, 7, 6, 8, -3, 5});
  pl::Array vals = iota_i32({L});
  auto kernel = [](pl::Ref k, pl::Ref v, pl::Ref ok, pl::Ref ov) {
    std::vector<pl::Value> r = plsc::sort_key_val(k[pl::all], v[pl::all]);
    ASSERT_EQ(r.size(), 2u);
    ok[pl::all] = r[0];
    ov[pl::all] = r[1];
  };
  auto out = run(kernel, {pl::ShapeDtype({L}, pl::f32), pl::ShapeDtype({L}, pl::i32)}, {keys, vals});
  std::vector<int64_t> order = ref_sort_order(keys.to_doubles(), std::vector<int32_t>(L, 1), false);
  for (int64_t i = 0; i < L; ++i) {
    EXPECT_EQ(out[0].data<float>()[i], keys.data<float>()[order[i]]);
    EXPECT_EQ(out[1].data<int32_t>()[i], static_cast<int32_t>(order[i]));
  }
}

TEST_P(ScOps, DynamicGatherOnLanesWithNegativeIndices) {
  pl::Array x = random_f32({L}, 31);
  pl::Array idx = random_i32({L}, 32, -static_cast<int>(L), static_cast<int>(L));
  auto kernel = [](pl::Ref x, pl::Ref i, pl::Ref o, pl::Ref r) {
    o[pl::all] = plsc::dynamic_gather(x[pl::all], i[pl::all]);
    r[pl::all] = pl::rev(x[pl::all], {0});  // lax.rev on lanes: the generic op
  };
  auto out = run(kernel, {pl::ShapeDtype({L}, pl::f32), pl::ShapeDtype({L}, pl::f32)}, {x, idx});
  for (int64_t i = 0; i < L; ++i) {
    int32_t j = idx.data<int32_t>()[i];
    EXPECT_EQ(out[0].data<float>()[i], x.data<float>()[j < 0 ? j + L : j]) << i;
    EXPECT_EQ(out[1].data<float>()[i], x.data<float>()[L - 1 - i]) << i;
  }
}

// ---- Packing ------------------------------------------------------------------------------------------

TEST_P(ScOps, PackLayoutsAndUnpackRoundTrip) {
  // Small integers: exact in bf16 and i16, so the reference needs no rounding.
  for (pl::DType dt : {pl::f32, pl::i32}) {
    pl::Array a = random_i32({L}, 33, -200, 200).astype(dt);
    pl::Array b = random_i32({L}, 34, -200, 200).astype(dt);
    for (plsc::PackFormat f : {plsc::PackFormat::INTERLEAVED, plsc::PackFormat::COMPRESSED}) {
      const bool inter = f == plsc::PackFormat::INTERLEAVED;
      SCOPED_TRACE(std::string(pl::dtype_name(dt)) + (inter ? " interleaved" : " compressed"));
      const pl::DType packed = dt == pl::f32 ? pl::bf16 : pl::i16;
      const pl::Shape packed_shape = inter ? pl::Shape{2 * L} : pl::Shape{L, 2};
      auto kernel = [f](pl::Ref a, pl::Ref b, pl::Ref ab, pl::Ref oa, pl::Ref ob) {
        pl::Value p = plsc::pack(a[pl::all], b[pl::all], f);
        ab[pl::all] = p;
        auto [ua, ub] = plsc::unpack(p, f);
        oa[pl::all] = ua;
        ob[pl::all] = ub;
      };
      auto out = run(kernel, {pl::ShapeDtype(packed_shape, packed), pl::ShapeDtype({L}, dt), pl::ShapeDtype({L}, dt)},
                     {a, b});
      // The packed element of a source value: bf16 is the top half of the f32 bits (exact here).
      auto packed_bits = [&](const pl::Array& src, int64_t i) -> uint16_t {
        if (dt == pl::f32) return static_cast<uint16_t>(std::bit_cast<uint32_t>(src.data<float>()[i]) >> 16);
        return static_cast<uint16_t>(static_cast<int16_t>(src.data<int32_t>()[i]));
      };
      const auto* bits = static_cast<const uint16_t*>(out[0].raw_data());
      for (int64_t i = 0; i < L; ++i) {
        EXPECT_EQ(bits[inter ? 2 * i : i], packed_bits(a, i)) << i;
        EXPECT_EQ(bits[inter ? 2 * i + 1 : L + i], packed_bits(b, i)) << i;
      }
      EXPECT_EQ(std::memcmp(out[1].raw_data(), a.raw_data(), L * 4), 0);
      EXPECT_EQ(std::memcmp(out[2].raw_data(), b.raw_data(), L * 4), 0);
    }
  }
}

TEST_P(ScOps, PackWithAPreferredElementType) {
  pl::Array a = iota_f32({L}, -3), b = iota_f32({L}, 40);
  auto kernel = [](pl::Ref a, pl::Ref b, pl::Ref o, pl::Ref ua) {
    pl::Value p = plsc::pack(a[pl::all], b[pl::all], plsc::PackFormat::INTERLEAVED, pl::f16);
    o[pl::all] = p;
    ua[pl::all] = plsc::unpack(p, plsc::PackFormat::INTERLEAVED, pl::f32).first;
  };
  auto out = run(kernel, {pl::ShapeDtype({2 * L}, pl::f16), pl::ShapeDtype({L}, pl::f32)}, {a, b});
  EXPECT_EQ(out[0].dtype(), pl::f16);
  EXPECT_EQ(values<float>(out[1]), values<float>(a));
}

// ---- SMEM atomics -------------------------------------------------------------------------------------

TEST_P(ScOps, FetchAndAddReturnsTheOldValue) {
  auto kernel = [](pl::Ref o, pl::Ref smem) {
    smem[0] = 10;
    smem[1] = 100;
    pl::Value a = plsc::fetch_and_add(smem.at(0), 5);
    pl::Value b = plsc::fetch_and_add(smem.at(0), 7, 0);  // subcore 0: this one
    pl::Value c = plsc::fetch_and_add(smem.at(pl::ds(1, 1)), -1);
    pl::Value d = pl::fori_loop(0, 4, pl::Value(pl::scalar(0, pl::i32)), [&](pl::Value i, pl::Value acc) {
      return acc + plsc::fetch_and_add(smem.at(1), i);
    });
    o[0] = a;
    o[1] = b;
    o[2] = c;
    o[3] = d;
    o[4] = smem[0];
    o[5] = smem[1];
  };
  pl::Array o = run(kernel, {pl::ShapeDtype({6}, pl::i32)}, {}, {pltpu::SMEM({2}, pl::i32)})[0];
  // smem[1]: 100 -> 99, then + 0, 1, 2, 3 with olds 99, 99, 100, 102.
  EXPECT_EQ(values<int32_t>(o), std::vector<int32_t>({10, 15, 100, 99 + 99 + 100 + 102, 22, 105}));
}

// ---- Parallel loops -----------------------------------------------------------------------------------

TEST_P(ScOps, ParallelLoopStepsAndCarries) {
  const int64_t n = 4 * L;
  pl::Array x = random_i32({n}, 35, -50, 50);
  auto kernel = [](pl::Ref x, pl::Ref o, pl::Ref sums, pl::Ref misc) {
    // No carry: independent chunks.
    plsc::parallel_loop(0, static_cast<int>(n), [&](pl::Value i) {
      o[pl::ds(i, L)] = x[pl::ds(i, L)] * 2;
    }, {.step = L, .unroll = 2});
    // A scalar and a vector carry (JAX's test_parallel_loop_with_carry, in short).
    std::vector<pl::Value> res = plsc::parallel_loop(
        0, static_cast<int>(n), {pl::scalar(0, pl::i32), pl::zeros({L}, pl::i32)},
        [&](pl::Value i, std::vector<pl::Value> c) {
          return std::vector<pl::Value>{c[0] + 10, c[1] + x[pl::ds(i, L)]};
        },
        {.step = L});
    sums[pl::all] = res[1];
    misc[0] = res[0];
    // One carry, a step that does not divide the range: 3, 7, 11, 15, 19.
    misc[1] = plsc::parallel_loop(3, 20, pl::scalar(0, pl::i32), [](pl::Value i, pl::Value acc) { return acc + i; },
                                  {.step = 4});
    // Traced bounds, and an empty range.
    pl::Value hi = x[0] * 0 + 5;
    misc[2] = plsc::parallel_loop(1, hi, pl::scalar(1, pl::i32), [](pl::Value i, pl::Value acc) { return acc * i; },
                                  {.step = 2});
    misc[3] = plsc::parallel_loop(hi, 2, pl::scalar(42, pl::i32), [](pl::Value i, pl::Value acc) { return acc + i; },
                                  {.step = 3});
  };
  auto out = run(kernel, {pl::ShapeDtype({n}, pl::i32), pl::ShapeDtype({L}, pl::i32), pl::ShapeDtype({4}, pl::i32)}, {x});
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(out[0].data<int32_t>()[i], 2 * x.data<int32_t>()[i]) << i;
  for (int64_t j = 0; j < L; ++j) {
    int32_t s = 0;
    for (int64_t c = 0; c < 4; ++c) s += x.data<int32_t>()[c * L + j];
    EXPECT_EQ(out[1].data<int32_t>()[j], s) << j;
  }
  EXPECT_EQ(values<int32_t>(out[2]), std::vector<int32_t>({40, 3 + 7 + 11 + 15 + 19, 1 * 3, 42}));
}

TEST(ScParallelLoop, IsAForMarkedParallelWithItsUnrollFactor) {
  ir::Kernel k = pl::trace_kernel(
      [](pl::Ref o) {
        plsc::parallel_loop(0, 8, [&](pl::Value i) { o[i] = i; }, {.unroll = 4});
        pl::fori_loop(0, 8, [&](pl::Value i) { o[i] = i; });
      },
      {ir::Type::ref({8}, pl::i32, pl::MemorySpace::Vmem)});
  std::string text = ir::print(k);
  EXPECT_CONTAINS(text, "for(%");
  EXPECT_CONTAINS(text, "{parallel = 1, unroll = 4}");
  EXPECT_EQ(text.find("parallel"), text.rfind("parallel")) << "only the first loop is parallel:\n" << text;
}

// ---- The TPU machine sees the accesses ----------------------------------------------------------------

TEST(ScTpu, AGatherFromADmaDestinationInFlightIsARaceOnlyWhereTheyOverlap) {
  const int read_line = __LINE__ + 5;
  auto kernel = [](pl::Ref x_hbm, pl::Ref idx, pl::Ref o, pl::Ref buf, pl::Ref sem) {
    auto copy = pltpu::async_copy(x_hbm.at(pl::ds(0, 32)), buf.at(pl::ds(0, 32)), sem);
    pl::Value i = idx[pl::all];
    o[pl::all] = plsc::load_gather(buf, {i}, i >= 32);  // only lanes outside the DMA: no race
    o[pl::all] = plsc::load_gather(buf, {i});
    copy.wait();
  };
  pl::Array x = iota_f32({64});
  pl::Array idx = pl::Array::from_vector<int32_t>({L}, {40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 7});
  for (const char* mode : kModes) {
    std::shared_ptr<std::vector<pltpu::RaceReport>> races;
    pl::CallOptions opts;
    opts.in_specs = {pl::BlockSpec(pltpu::ANY), pl::BlockSpec()};
    opts.scratch_shapes = {pltpu::VMEM({64}, pl::f32), pltpu::semaphores(pltpu::SemaphoreType::DMA)};
    opts.interpret = race_params(races, mode);
    pl::pallas_call(kernel, pl::ShapeDtype({L}, pl::f32), opts)(x, idx);
    ASSERT_EQ(races->size(), 1u) << mode << "\n" << all_reports(*races);
    const pltpu::RaceReport& r = races->front();
    EXPECT_EQ(r.overlap, (std::vector<std::pair<int64_t, int64_t>>{{7, 8}})) << r.to_string();
    const pltpu::RaceAccess& core_side = std::string(mode) == "eager" ? r.second : r.first;
    EXPECT_FALSE(core_side.is_write);
    EXPECT_EQ(core_side.loc.to_string(), line_ref(__FILE__, read_line));
  }
}

TEST(ScTpu, ScatterIntoADmaSourceInFlightIsAWriteRace) {
  auto kernel = [](pl::Ref x, pl::Ref o_hbm, pl::Ref sem) {
    auto copy = pltpu::async_copy(x, o_hbm, sem);
    plsc::store_scatter(x, {pl::iota(pl::i32, {L}, 0)}, pl::zeros({L}, pl::f32));
    copy.wait();
  };
  std::shared_ptr<std::vector<pltpu::RaceReport>> races;
  pl::CallOptions opts;
  opts.out_specs = {pl::BlockSpec(pltpu::ANY)};
  opts.scratch_shapes = {pltpu::semaphores(pltpu::SemaphoreType::DMA)};
  opts.interpret = race_params(races, "eager");
  pl::pallas_call(kernel, pl::ShapeDtype({L}, pl::f32), opts)(iota_f32({L}));
  ASSERT_FALSE(races->empty());
  EXPECT_TRUE(races->front().second.is_write) << races->front().to_string();
}

// ---- Run-time errors ----------------------------------------------------------------------------------

TEST_P(ScOps, OutOfBoundsIndicesAreErrorsAndTouchNothing) {
  pl::Array idx = iota_i32({L});
  idx.data<int32_t>()[5] = 64;
  const int gather_line = __LINE__ + 2;
  auto gather = [](pl::Ref x, pl::Ref idx, pl::Ref o) {
    o[pl::all] = plsc::load_gather(x, {idx[pl::all]});
  };
  EXPECT_EQ(error_of([&] { run(gather, {pl::ShapeDtype({L}, pl::f32)}, {iota_f32({64}), idx}); }),
            "sc_load_gather: lane 5 indexes (64,), out of bounds for the ref of shape (64,) (at " +
                line_ref(__FILE__, gather_line) + ")");
  // A masked-off lane's index is never checked.
  auto masked = [](pl::Ref x, pl::Ref idx, pl::Ref o) {
    o[pl::all] = plsc::load_gather(x, {idx[pl::all]}, idx[pl::all] < 64);
  };
  EXPECT_EQ(run(masked, {pl::ShapeDtype({L}, pl::f32)}, {iota_f32({64}), idx})[0].data<float>()[5], 0.0f);

  const int scatter_line = __LINE__ + 2;
  auto scatter = [](pl::Ref rows, pl::Ref o) {
    plsc::store_scatter(o, {rows[pl::all] % 4, rows[pl::all]}, pl::full({L}, pl::i32, 1.0));
  };
  pl::Array rows = iota_i32({L});
  rows.data<int32_t>()[9] = -1;
  EXPECT_EQ(error_of([&] { run(scatter, {pl::ShapeDtype({4, L}, pl::i32)}, {rows}); }),
            "sc_store_scatter: lane 9 indexes (-1, -1), out of bounds for the ref of shape (4, 16) (at " +
                line_ref(__FILE__, scatter_line) + ")");
  // Every lane is checked before any is written: the buffer is untouched.
  ir::Kernel k = pl::trace_kernel(scatter, {ir::Type::ref({L}, pl::i32, pl::MemorySpace::Vmem),
                                            ir::Type::ref({4, L}, pl::i32, pl::MemorySpace::Vmem)});
  std::vector<pl::Array> buffers = {rows, pl::Array::zeros({4, L}, pl::i32)};
  EXPECT_CONTAINS(error_of([&] { pl::evaluate(k, buffers); }), "lane 9 indexes (-1, -1)");
  EXPECT_EQ(values<int32_t>(buffers[1]), std::vector<int32_t>(4 * L, 0));

  const int dg_line = __LINE__ + 2;
  auto dyn = [](pl::Ref x, pl::Ref idx, pl::Ref o) {
    o[pl::all] = plsc::dynamic_gather(x[pl::all], idx[pl::all] + 16);
  };
  EXPECT_EQ(error_of([&] { run(dyn, {pl::ShapeDtype({L}, pl::f32)}, {iota_f32({L}), iota_i32({L})}); }),
            "sc_dynamic_gather: lane 0 has index 16, out of range for a vector of 16 lanes (at " +
                line_ref(__FILE__, dg_line) + ")");
}

TEST_P(ScOps, FetchAndAddOnAnotherSubcoreNeedsASubcoreMesh) {
  const int line = __LINE__ + 3;
  auto kernel = [](pl::Ref o, pl::Ref smem) {
    smem[0] = 0;
    o[0] = plsc::fetch_and_add(smem.at(0), 1, 3);
  };
  std::string e = error_of([&] { run(kernel, {pl::ShapeDtype({1}, pl::i32)}, {}, {pltpu::SMEM({1}, pl::i32)}); });
  EXPECT_CONTAINS(e, "sc_fetch_and_add: subcore_id 3 names another vector subcore's SMEM");
  EXPECT_CONTAINS(e, "(at " + line_ref(__FILE__, line) + ")");
}

// ---- Trace-time errors --------------------------------------------------------------------------------

namespace {
// The error of tracing `kernel` over Refs of these types.
template <class K> std::string trace_error(K kernel, std::vector<ir::Type> params) {
  return error_of([&] { pl::trace_kernel(kernel, params); });
}
ir::Type vmem(pl::Shape s, pl::DType t) { return ir::Type::ref(std::move(s), t, pl::MemorySpace::Vmem); }
ir::Type smem(pl::Shape s, pl::DType t) { return ir::Type::ref(std::move(s), t, pl::MemorySpace::Smem); }
std::string at(int line) { return " (at " + line_ref(__FILE__, line) + ")"; }
}  // namespace

TEST(ScErrors, GatherAndScatter) {
  const ir::Type x = vmem({64}, pl::f32), idx = vmem({L}, pl::i32);
  int l = __LINE__ + 1;
  auto smem_gather = [](pl::Ref x, pl::Ref i) { plsc::load_gather(x, {i[pl::all]}); };
  EXPECT_EQ(trace_error(smem_gather, {smem({64}, pl::f32), idx}),
            "sc_load_gather: only VMEM refs are supported, got ref<f32[64], smem> (copy the data to VMEM first, e.g. "
            "with pltpu::sync_copy)" + at(l));
  l = __LINE__ + 1;
  auto bf16_gather = [](pl::Ref x, pl::Ref i) { plsc::load_gather(x, {i[pl::all]}); };
  EXPECT_EQ(trace_error(bf16_gather, {vmem({64}, pl::bf16), idx}),
            "sc_load_gather: the ref's dtype must be i32 or f32, got ref<bf16[64], vmem>" + at(l));
  l = __LINE__ + 1;
  auto two_indices = [](pl::Ref x, pl::Ref i) { plsc::load_gather(x, {i[pl::all], i[pl::all]}); };
  EXPECT_EQ(trace_error(two_indices, {x, idx}),
            "sc_load_gather: needs one index vector per dimension of the ref ref<f32[64], vmem>, got 2" + at(l));
  l = __LINE__ + 1;
  auto no_indices = [](pl::Ref x, pl::Ref o) { plsc::store_scatter(x, {}, o[pl::all]); };
  EXPECT_EQ(trace_error(no_indices, {x, vmem({L}, pl::f32)}),
            "sc_store_scatter: needs one index vector per dimension of the ref ref<f32[64], vmem>, got 0" + at(l));
  l = __LINE__ + 1;
  auto unequal = [](pl::Ref x, pl::Ref i) { plsc::load_gather(x, {i[pl::all], i[pl::ds(0, 8)]}); };
  EXPECT_EQ(trace_error(unequal, {vmem({8, 8}, pl::i32), idx}),
            "sc_load_gather: index vectors must have the same length, got 16 and 8" + at(l));
  l = __LINE__ + 1;
  auto f32_index = [](pl::Ref x, pl::Ref i) { plsc::load_gather(x, {i[pl::all]}); };
  EXPECT_EQ(trace_error(f32_index, {x, vmem({L}, pl::f32)}),
            "sc_load_gather: indices must be i32, got an index of type f32[16]" + at(l));
  l = __LINE__ + 1;
  auto index_2d = [](pl::Ref x, pl::Ref i) { plsc::load_gather(x, {i[pl::all]}); };
  EXPECT_EQ(trace_error(index_2d, {x, vmem({2, 8}, pl::i32)}),
            "sc_load_gather: indices must be 1-D vectors, got an index of type i32[2,8]" + at(l));
  l = __LINE__ + 1;
  auto int_mask = [](pl::Ref x, pl::Ref i) { plsc::load_gather(x, {i[pl::all]}, i[pl::all]); };
  EXPECT_EQ(trace_error(int_mask, {x, idx}), "sc_load_gather: the mask must be a bool array, got i32[16]" + at(l));
  l = __LINE__ + 1;
  auto short_mask = [](pl::Ref x, pl::Ref i) { plsc::load_gather(x, {i[pl::all]}, i[pl::ds(0, 8)] > 0); };
  EXPECT_EQ(trace_error(short_mask, {x, idx}),
            "sc_load_gather: the mask must have the shape [16], got bool[8]" + at(l));
  l = __LINE__ + 1;
  auto eight_lanes = [](pl::Ref x, pl::Ref i) { plsc::load_gather(x, {i[pl::ds(0, 8)]}); };
  EXPECT_EQ(trace_error(eight_lanes, {x, idx}),
            "load_gather: only supports f32 arrays of shapes [(16,)], got (8,) (the SparseCore has 16 lanes)" + at(l));
  l = __LINE__ + 1;
  auto wrong_dtype = [](pl::Ref x, pl::Ref i) { plsc::store_scatter(x, {i[pl::all]}, i[pl::all]); };
  EXPECT_EQ(trace_error(wrong_dtype, {x, idx}),
            "sc_store_scatter: the value's dtype i32 differs from the ref's ref<f32[64], vmem>" + at(l));
  l = __LINE__ + 1;
  auto wrong_shape = [](pl::Ref x, pl::Ref i) { plsc::addupdate_scatter(x, {i[pl::all]}, x[pl::ds(0, 8)]); };
  EXPECT_EQ(trace_error(wrong_shape, {x, idx}),
            "sc_addupdate_scatter: the value must have the indices' shape [16], got f32[8]" + at(l));
}

TEST(ScErrors, ExpandedAndCompressed) {
  int l = __LINE__ + 1;
  auto shape8 = [](pl::Ref x) { plsc::load_expanded(x, x[pl::all] > 0); };
  EXPECT_EQ(trace_error(shape8, {vmem({8}, pl::i32)}),
            "load_expanded: only supports i32 arrays of shapes [(16,)], got (8,) (the SparseCore has 16 lanes)" + at(l));
  l = __LINE__ + 1;
  auto hbm = [](pl::Ref x, pl::Ref m) { plsc::load_expanded(x, m[pl::all] > 0); };
  EXPECT_CONTAINS(trace_error(hbm, {ir::Type::ref({L}, pl::i32, pl::MemorySpace::Hbm), vmem({L}, pl::i32)}),
                  "sc_load_expanded: only VMEM refs are supported, got ref<i32[16], hbm>");
  l = __LINE__ + 1;
  auto mask_shape = [](pl::Ref x, pl::Ref m) { plsc::load_expanded(x, m[pl::all] > 0); };
  EXPECT_EQ(trace_error(mask_shape, {vmem({L}, pl::i32), vmem({2, L}, pl::i32)}),
            "sc_load_expanded: the mask must have the shape [16], got bool[2,16]" + at(l));
  l = __LINE__ + 1;
  auto dtype = [](pl::Ref x, pl::Ref y) { plsc::store_compressed(x, y[pl::all], y[pl::all] > 0); };
  EXPECT_EQ(trace_error(dtype, {vmem({L}, pl::i32), vmem({L}, pl::f32)}),
            "sc_store_compressed: the ref and the value must have the same dtype, got ref<i32[16], vmem> and "
            "f32[16]" + at(l));
  l = __LINE__ + 1;
  auto shape = [](pl::Ref x, pl::Ref y) { plsc::addupdate(x, y[pl::all]); };
  EXPECT_EQ(trace_error(shape, {vmem({2, L}, pl::bf16), vmem({32}, pl::bf16)}),
            "sc_addupdate: the value must have the ref's shape [2, 16], got bf16[32]" + at(l));
  l = __LINE__ + 1;
  auto bool_ref = [](pl::Ref x, pl::Ref y) { plsc::addupdate_compressed(x, y[pl::all], y[pl::all]); };
  EXPECT_EQ(trace_error(bool_ref, {vmem({L}, pl::DType::Bool), vmem({L}, pl::DType::Bool)}),
            "sc_addupdate_compressed: the ref must have a numeric dtype, got bool" + at(l));
}

TEST(ScErrors, LaneOps) {
  const ir::Type v = vmem({L}, pl::i32);
  int l = __LINE__ + 1;
  auto scalar = [](pl::Ref x) { plsc::bitcast(x[0], pl::i8); };
  EXPECT_EQ(trace_error(scalar, {v}), "bitcast: cannot bitcast the scalar i32[] to i8 (32 bits to 8)" + at(l));
  l = __LINE__ + 1;
  auto odd = [](pl::Ref x) { plsc::bitcast(x[pl::all], pl::i32); };
  EXPECT_EQ(trace_error(odd, {vmem({6}, pl::i8)}),
            "bitcast: cannot bitcast i8[6] to i32: the last dimension holds 6 x 8 bits, not a multiple of 32" + at(l));
  l = __LINE__ + 1;
  auto to_bool = [](pl::Ref x) { plsc::bitcast(x[pl::all], pl::DType::Bool); };
  EXPECT_EQ(trace_error(to_bool, {v}), "bitcast: needs numeric dtypes, got i32 -> bool" + at(l));

  l = __LINE__ + 1;
  auto rank2 = [](pl::Ref x) { plsc::cumsum(x[pl::all]); };
  EXPECT_EQ(trace_error(rank2, {vmem({2, 8}, pl::i32)}), "cumsum: x must be rank 1, got i32[2,8]" + at(l));
  l = __LINE__ + 1;
  auto bf16 = [](pl::Ref x) { plsc::cummax(x[pl::all]); };
  EXPECT_EQ(trace_error(bf16, {vmem({32}, pl::bf16)}), "cummax: x's dtype must be u32, i32 or f32, got bf16" + at(l));
  l = __LINE__ + 1;
  auto lanes = [](pl::Ref x) { plsc::cummin(x[pl::ds(0, 8)], x[pl::ds(0, 8)] > 0); };
  EXPECT_EQ(trace_error(lanes, {v}),
            "cummin: only supports i32 arrays of shapes [(16,)], got (8,) (the SparseCore has 16 lanes)" + at(l));
  l = __LINE__ + 1;
  auto int_mask = [](pl::Ref x) { plsc::cumsum(x[pl::all], x[pl::all]); };
  EXPECT_EQ(trace_error(int_mask, {v}), "sc_masked_scan: the mask must be a bool array, got i32[16]" + at(l));

  l = __LINE__ + 1;
  auto count_dtype = [](pl::Ref x) { plsc::scan_count(x[pl::all]); };
  EXPECT_EQ(trace_error(count_dtype, {vmem({32}, pl::i16)}), "sc_scan_count: x must be u32, i32 or f32, got i16" + at(l));

  l = __LINE__ + 1;
  auto not_bool = [](pl::Ref x) { plsc::all_reduce_population_count(x[pl::all]); };
  EXPECT_EQ(trace_error(not_bool, {v}), "sc_all_reduce_population_count: needs a bool vector, got i32[16]" + at(l));
  l = __LINE__ + 1;
  auto reduce0 = [](pl::Ref x) { plsc::all_reduce_ffs(x[pl::all] > 0, 0); };
  EXPECT_EQ(trace_error(reduce0, {v}), "sc_all_reduce_ffs: reduce must be >= 1, got 0" + at(l));
  l = __LINE__ + 1;
  auto reduce3 = [](pl::Ref x) { plsc::all_reduce_population_count(x[pl::all] > 0, 3); };
  EXPECT_EQ(trace_error(reduce3, {v}),
            "sc_all_reduce_population_count: reduce=3 must divide the vector's length 16" + at(l));

  l = __LINE__ + 1;
  auto short_keys = [](pl::Ref x) { plsc::sort_key_val(x[pl::ds(0, 8)], x[pl::ds(0, 8)]); };
  EXPECT_EQ(trace_error(short_keys, {v}), "sort_key_val: keys shape (8,) must be (16,)" + at(l));
  l = __LINE__ + 1;
  auto short_mask = [](pl::Ref x) { plsc::sort_key_val(x[pl::all], x[pl::all], {.mask = x[pl::ds(0, 8)] > 0}); };
  EXPECT_EQ(trace_error(short_mask, {v}), "sort_key_val: mask shape (8,) must be (16,)" + at(l));
  l = __LINE__ + 1;
  auto key_dtype = [](pl::Ref k, pl::Ref x) { plsc::sort_key_val(k[pl::all], x[pl::all]); };
  EXPECT_EQ(trace_error(key_dtype, {vmem({L}, pl::i16), v}),
            "sc_sort_key_val: the keys must be u32, i32 or f32, got i16" + at(l));
  l = __LINE__ + 1;
  auto value_dtype = [](pl::Ref k, pl::Ref x) { plsc::sort_key_val(k[pl::all], x[pl::all]); };
  EXPECT_EQ(trace_error(value_dtype, {v, vmem({L}, pl::bf16)}),
            "sc_sort_key_val: values must have a 32-bit dtype, got bf16[16]" + at(l));
  l = __LINE__ + 1;
  auto int_sort_mask = [](pl::Ref x) { plsc::sort_key_val(x[pl::all], x[pl::all], {.mask = x[pl::all]}); };
  EXPECT_EQ(trace_error(int_sort_mask, {v}), "sc_sort_key_val: the mask must be a bool array, got i32[16]" + at(l));

  l = __LINE__ + 1;
  auto gather_idx = [](pl::Ref x, pl::Ref f) { plsc::dynamic_gather(x[pl::all], f[pl::all]); };
  EXPECT_EQ(trace_error(gather_idx, {v, vmem({L}, pl::f32)}),
            "sc_dynamic_gather: the indices must be i32 with the vector's shape [16], got f32[16]" + at(l));
}

TEST(ScErrors, PackAndUnpack) {
  const ir::Type v = vmem({L}, pl::f32);
  int l = __LINE__ + 1;
  auto bf16_pack = [](pl::Ref x) { plsc::pack(x[pl::all], x[pl::all], plsc::PackFormat::INTERLEAVED); };
  EXPECT_EQ(trace_error(bf16_pack, {vmem({32}, pl::bf16)}),
            "pack: only f32 and i32 arrays pack without preferred_element_type, got bf16" + at(l));
  l = __LINE__ + 1;
  auto wide = [](pl::Ref x) { plsc::pack(x[pl::all], x[pl::all], plsc::PackFormat::COMPRESSED, pl::f32); };
  EXPECT_EQ(trace_error(wide, {v}),
            "sc_pack: the packed dtype must have half the bit width of f32 (16 bits), got f32" + at(l));
  l = __LINE__ + 1;
  auto mixed = [](pl::Ref x, pl::Ref y) { plsc::pack(x[pl::all], y[pl::all], plsc::PackFormat::COMPRESSED); };
  EXPECT_EQ(trace_error(mixed, {v, vmem({L}, pl::i32)}),
            "sc_pack: operand types differ: f32[16] vs i32[16]" + at(l));
  l = __LINE__ + 1;
  auto f32_unpack = [](pl::Ref x) { plsc::unpack(x[pl::all], plsc::PackFormat::INTERLEAVED); };
  EXPECT_EQ(trace_error(f32_unpack, {v}),
            "unpack: only bf16 and i16 arrays unpack without preferred_element_type, got f32" + at(l));
  l = __LINE__ + 1;
  auto odd = [](pl::Ref x) { plsc::unpack(x[pl::ds(0, 7)], plsc::PackFormat::INTERLEAVED); };
  EXPECT_EQ(trace_error(odd, {vmem({32}, pl::bf16)}),
            "sc_unpack: an interleaved unpack needs a 1-D array of even length, got bf16[7]" + at(l));
  l = __LINE__ + 1;
  auto not_pairs = [](pl::Ref x) { plsc::unpack(x[pl::all], plsc::PackFormat::COMPRESSED); };
  EXPECT_EQ(trace_error(not_pairs, {vmem({2, L}, pl::bf16)}),
            "sc_unpack: a compressed unpack needs an array of shape [n, 2], got bf16[2,16]" + at(l));
  l = __LINE__ + 1;
  auto narrow = [](pl::Ref x) { plsc::unpack(x[pl::all], plsc::PackFormat::INTERLEAVED, pl::bf16); };
  EXPECT_EQ(trace_error(narrow, {vmem({32}, pl::bf16)}),
            "sc_unpack: the unpacked dtype must have twice the bit width of bf16 (32 bits), got bf16" + at(l));
}

TEST(ScErrors, FetchAndAdd) {
  int l = __LINE__ + 1;
  auto vmem_ref = [](pl::Ref x) { plsc::fetch_and_add(x.at(0), 1); };
  EXPECT_EQ(trace_error(vmem_ref, {vmem({4}, pl::i32)}),
            "sc_fetch_and_add: only SMEM refs are supported, got ref<i32[], vmem>" + at(l));
  l = __LINE__ + 1;
  auto f32_ref = [](pl::Ref x) { plsc::fetch_and_add(x.at(0), 1); };
  EXPECT_EQ(trace_error(f32_ref, {smem({4}, pl::f32)}),
            "sc_fetch_and_add: only i32 refs are supported, got ref<f32[], smem>" + at(l));
  l = __LINE__ + 1;
  auto whole = [](pl::Ref x) { plsc::fetch_and_add(x, 1); };
  EXPECT_EQ(trace_error(whole, {smem({4}, pl::i32)}),
            "sc_fetch_and_add: expected a ref of one element (index it: ref.at(i)), got ref<i32[4], smem>" + at(l));
  l = __LINE__ + 1;
  auto float_value = [](pl::Ref x) { plsc::fetch_and_add(x.at(0), 1.5); };
  EXPECT_EQ(trace_error(float_value, {smem({4}, pl::i32)}), "fetch_and_add: the value must be an i32 scalar" + at(l));
  l = __LINE__ + 1;
  auto vector_value = [](pl::Ref x, pl::Ref v) { plsc::fetch_and_add(x.at(0), v[pl::all]); };
  EXPECT_EQ(trace_error(vector_value, {smem({4}, pl::i32), vmem({L}, pl::i32)}),
            "sc_fetch_and_add: the value must be an i32 scalar, got i32[16]" + at(l));
  l = __LINE__ + 1;
  auto i64_subcore = [](pl::Ref x) { plsc::fetch_and_add(x.at(0), 1, pl::Value(pl::scalar(1, pl::i64))); };
  EXPECT_EQ(trace_error(i64_subcore, {smem({4}, pl::i32)}),
            "sc_fetch_and_add: subcore_id must be an i32 scalar, got i64[]" + at(l));
}

TEST(ScErrors, ParallelLoop) {
  int l = __LINE__ + 1;
  auto step0 = [](pl::Ref) { plsc::parallel_loop(0, 8, [](pl::Value) {}, {.step = 0}); };
  EXPECT_EQ(trace_error(step0, {vmem({L}, pl::i32)}), "parallel_loop: step must be >= 1, got 0" + at(l));
  l = __LINE__ + 1;
  auto unroll0 = [](pl::Ref) { plsc::parallel_loop(0, 8, [](pl::Value) {}, {.unroll = 0}); };
  EXPECT_EQ(trace_error(unroll0, {vmem({L}, pl::i32)}), "parallel_loop: unroll must be >= 1, got 0" + at(l));
  l = __LINE__ + 1;
  auto ref_carry = [](pl::Ref x) {
    plsc::parallel_loop(0, 8, std::vector<pl::Value>{x.handle()}, [](pl::Value, std::vector<pl::Value> c) { return c; });
  };
  EXPECT_EQ(trace_error(ref_carry, {vmem({L}, pl::i32)}),
            "parallel_loop: carried values may not be Refs, got ref<i32[16], vmem>" + at(l + 1));
  l = __LINE__ + 2;
  auto wrong_carry = [](pl::Ref) {
    plsc::parallel_loop(0, 8, pl::scalar(0, pl::i32), [](pl::Value i, pl::Value) { return i.astype(pl::f32); });
  };
  EXPECT_CONTAINS(trace_error(wrong_carry, {vmem({L}, pl::i32)}), "the loop body yields (f32[]), expected (i32[])");
}

// ---- The GPU backend refuses them ---------------------------------------------------------------------

TEST(ScGpu, TheCudaEmitterRefusesSparseCoreOps) {
  auto kernel = [](pl::Ref x, pl::Ref idx, pl::Ref o) { o[pl::all] = plsc::load_gather(x, {idx[pl::all]}); };
  pl::CallOptions opts;
  opts.backend = "mosaic_gpu";
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({L}, pl::f32), opts);
  std::shared_ptr<const pl::TracedCall> tc = call.trace({pl::ShapeDtype({64}, pl::f32), pl::ShapeDtype({L}, pl::i32)});
  std::string e = error_of<pl::NotSupportedError>([&] { pl::gpu::generate_cuda(*tc, tc->grid_mapping.grid); });
  EXPECT_CONTAINS(e, "not supported yet: sc_load_gather on the GPU backend (a TPU SparseCore operation");
  for (int c = 0; c < ir::kNumOpCodes; ++c) {
    const ir::OpInfo& info = ir::op_info(static_cast<ir::OpCode>(c));
    if (info.name.starts_with("sc_")) {
      EXPECT_FALSE(pl::gpu::cuda_emitter_supports(info.code)) << info.name;
    }
  }
}

// ---- Transforms ---------------------------------------------------------------------------------------

TEST(ScTransforms, JvpRefusesAGatherOfAFloatInputAndCostCountsOnChipAccessesAsFree) {
  auto kernel = [](pl::Ref x, pl::Ref idx, pl::Ref o) {
    pl::Value g = plsc::load_gather(x, {idx[pl::all]});
    o[pl::all] = g;
    plsc::addupdate_scatter(o, {idx[pl::all]}, g);
  };
  pl::CallOptions opts;
  opts.interpret = true;
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({L}, pl::f32), opts);
  pl::Array x = iota_f32({L}), idx = iota_i32({L});
  std::string e = error_of<pl::NotSupportedError>(
      [&] { pl::jvp(call, {x, idx}, {iota_f32({L}), pl::Array()}); });
  EXPECT_CONTAINS(e, "the kernel op `sc_load_gather` has no derivative rule");
  // The gather moves data (free); the scatter-add costs one flop per lane; the blocks move once.
  pl::CostEstimate c = pl::estimate_cost(call, x, idx);
  EXPECT_EQ(c.flops, L);
  EXPECT_EQ(c.bytes_accessed, 3 * L * 4);
}
