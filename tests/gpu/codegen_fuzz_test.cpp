// Random pallas_call kernels against the reference interpreter. The GPU code generator decides per
// value where it lives (a register tile in one of several layouts, or the shared-memory arena),
// which barriers it needs, and which loads it fuses, by rules that interact; each hand-written test
// checks the cases its author thought of. These kernels mix elementwise ops, row and column
// reductions, broadcasts, totals, loops carrying tiles, scratch round trips, masks, transposes and
// slices over blocks of many shapes, from a seed, and every output of the generated CUDA (run under
// host emulation, with register tiles and without) must match the interpreter's; each unit also
// compiles with NVRTC for sm_90a and sm_80 (PALLAS_TEST_NVRTC=0 leaves that out), and where the
// process has a GPU it runs there too (tests/gpu/emulation_check.h).
//
// PALLAS_FUZZ_SEEDS=N runs N more seeds per case (a longer search than CI's); a failure prints the
// seed and the kernel's steps, and PALLAS_FUZZ_SEED=S (PALLAS_FUZZ_GRID_SEED=S for the products
// over grids, PALLAS_FUZZ_ATTENTION_SEED, PALLAS_FUZZ_CONTROL_FLOW_SEED) runs that one alone.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "pallas/pallas.h"
#include "tests/gpu/emulation_check.h"

namespace pallas {
namespace {

namespace pl = ::pallas;

// Every unit (with register tiles and without) also compiles with NVRTC for both GPU paths:
// host emulation does not build the device side of the runtime's `#if` branches, or run ptxas.
const std::vector<std::string> kNvrtcArchs = {"sm_90a", "sm_80"};

// Block shapes: every blocked-layout case (rows over warps, several rows of registers, a single
// warp row, columns over several warps, several rows a warp) and shapes no layout takes (the
// arena's code).
const std::vector<std::pair<int64_t, int64_t>> kBlocks = {
    {1, 32}, {1, 128}, {1, 256}, {2, 64}, {4, 128}, {8, 32}, {8, 64}, {16, 64}, {32, 32},
    {8, 128}, {16, 128}, {24, 32}, {64, 16}, {8, 20}, {3, 64}, {16, 48}, {32, 64}, {16, 16}, {32, 8},
    {128, 4}, {6, 128}, {12, 64}, {2, 256}, {48, 24}};

// The kernel a seed makes. Tracing replays the same random choices (the generator is reseeded
// per trace), and `steps` records them for a failure message.
struct RandomKernel {
  uint32_t seed;
  int64_t m, n, blocks;
  DType in_dtype;
  std::shared_ptr<std::string> steps = std::make_shared<std::string>();

  void operator()(std::vector<Ref>& refs) const;
};

void RandomKernel::operator()(std::vector<Ref>& refs) const {
  // refs: x, y (blocks of (m, n)), g (n, whole), then outputs o (m, n), cols (n), rows (m),
  // total (), then the scratch (m, n).
  const Ref &x = refs[0], &y = refs[1], &g = refs[2], &o = refs[3], &o_cols = refs[4], &o_rows = refs[5],
            &o_total = refs[6], &scratch = refs[7];
  std::mt19937 rng(seed * 2654435761u + 17);
  auto pick = [&](int k) { return std::uniform_int_distribution<int>(0, k - 1)(rng); };
  std::string& log = *steps;
  log.clear();
  const Shape tile{m, n};
  auto load = [&](const Ref& r) { return in_dtype == DType::F32 ? r[pl::all] : pl::convert(r[pl::all], DType::F32); };

  std::vector<Value> tiles{load(x)}, rows, cols, totals;
  log += "t0 = x; ";
  auto any = [&](std::vector<Value>& pool) -> Value& { return pool[static_cast<size_t>(pick(static_cast<int>(pool.size())))]; };
  auto add_tile = [&](Value v, const std::string& what) {
    log += "t" + std::to_string(tiles.size()) + " = " + what + "; ";
    tiles.push_back(std::move(v));
  };
  auto row_vector = [&]() -> Value {  // an (m) value: one made before, or a fresh row reduction
    if (!rows.empty() && pick(2)) return any(rows);
    return pl::sum(any(tiles), {1}) * (1.0f / static_cast<float>(n));
  };
  auto col_vector = [&]() -> Value {  // an (n) value: one made before, gamma, or a column reduction
    if (!cols.empty() && pick(2)) return any(cols);
    if (pick(2)) return g[pl::all];
    return pl::max(any(tiles), {0});
  };

  const int count = 3 + pick(10);
  for (int s = 0; s < count; ++s) {
    switch (pick(30)) {
      case 0:
        add_tile(load(pick(2) ? y : x), "load");
        break;
      case 1: {
        Value a = any(tiles);
        switch (pick(4)) {
          case 0: add_tile(pl::tanh(a), "tanh"); break;
          case 1: add_tile(pl::abs(a) * 0.5f, "abs*0.5"); break;
          case 2: add_tile(-a, "neg"); break;
          default: add_tile(pl::exp(pl::tanh(a)), "exp(tanh)"); break;
        }
        break;
      }
      case 2: {
        Value a = any(tiles), b = any(tiles);
        switch (pick(5)) {
          case 0: add_tile(a + b, "add"); break;
          case 1: add_tile(a - b, "sub"); break;
          case 2: add_tile(pl::tanh(a * b), "tanh(mul)"); break;
          case 3: add_tile(pl::maximum(a, b), "maximum"); break;
          default: add_tile(pl::minimum(a, b), "minimum"); break;
        }
        break;
      }
      case 3: {
        Value a = any(tiles), b = any(tiles);
        add_tile(pl::where(a > b, a, b * 0.5f), "where");
        break;
      }
      case 4: {  // a row reduction, with or without keepdims
        Value a = any(tiles);
        const bool keep = pick(2);
        Value r = pick(2) ? pl::sum(a, {1}, keep) * (1.0f / static_cast<float>(n)) : pl::max(a, {1}, keep);
        if (keep) r = pl::reshape(r, {m});
        log += std::string("rows += reduce(keepdims ") + (keep ? "1" : "0") + "); ";
        rows.push_back(r);
        break;
      }
      case 5: {
        Value a = any(tiles);
        Value c = pick(2) ? pl::sum(a, {0}) * (1.0f / static_cast<float>(m)) : pl::max(a, {0});
        log += "cols += reduce; ";
        cols.push_back(c);
        break;
      }
      case 6: {  // a tile against its rows: three spellings of the broadcast
        Value a = any(tiles), r = row_vector();
        switch (pick(3)) {
          case 0: add_tile(a - pl::broadcast_to(pl::expand_dims(r, {1}), tile), "sub rows (expand_dims)"); break;
          case 1: add_tile(a * pl::broadcast_in_dim(r, tile, {0}), "mul rows (broadcast_in_dim)"); break;
          default: add_tile(a + pl::reshape(r, {m, 1}), "add rows (implicit)"); break;
        }
        break;
      }
      case 7: {
        Value a = any(tiles), c = col_vector();
        if (pick(2))
          add_tile(a * pl::broadcast_to(c, tile), "mul cols");
        else
          add_tile(a - pl::broadcast_to(pl::reshape(c, {1, n}), tile), "sub cols (1, n)");
        break;
      }
      case 8: {
        Value t = pl::sum(any(tiles)) * (1.0f / static_cast<float>(m * n));
        totals.push_back(t);
        add_tile(any(tiles) + t, "add total");
        break;
      }
      case 9: {
        if (rows.empty()) break;
        Value a = any(rows), b = row_vector();
        rows.push_back(pick(2) ? pl::tanh(a + b) : pl::maximum(a, b));
        log += "rows += op; ";
        break;
      }
      case 10: {
        if (cols.empty()) break;
        Value a = any(cols), b = col_vector();
        cols.push_back(pick(2) ? a * b : pl::minimum(a, b));
        log += "cols += op; ";
        break;
      }
      case 11: {  // a loop carrying a tile (and a row vector, sometimes), reading a tile of outside
        Value init = any(tiles), other = any(tiles);
        const int trips = 1 + pick(3);
        const bool reads_x = pick(2);
        if (pick(2)) {
          Value r0 = row_vector();
          std::vector<Value> c = pl::fori_loop(0, trips, {init, r0}, [&](Value, std::vector<Value> c) {
            Value t = c[0] * 0.5f + pl::tanh(other);
            if (reads_x) t = t + load(x);
            Value r = c[1] * 0.5f + pl::max(t, {1});
            return std::vector<Value>{t - pl::broadcast_to(pl::expand_dims(r, {1}), tile) * 0.25f, r};
          });
          rows.push_back(c[1]);
          add_tile(c[0], "loop(tile, rows)");
        } else {
          Value c = pl::fori_loop(0, trips, init, [&](Value, Value c) {
            Value t = c * 0.5f + pl::tanh(other);
            return reads_x ? t + load(x) : t;
          });
          add_tile(c, "loop(tile)");
        }
        break;
      }
      case 12: {
        scratch[pl::all] = any(tiles);
        add_tile(scratch[pl::all] + 1.0f, "scratch round trip");
        break;
      }
      case 13: {
        if (m != n) break;
        add_tile(pl::transpose(any(tiles), {1, 0}), "transpose");
        break;
      }
      case 14: {  // a roll of the rows (or columns), by slices and a concatenate
        Value a = any(tiles);
        if (m >= 2 && pick(2)) {
          add_tile(pl::concatenate({pl::slice(a, {m / 2, 0}, {m, n}), pl::slice(a, {0, 0}, {m / 2, n})}, 0),
                   "roll rows");
        } else if (n >= 2) {
          add_tile(pl::concatenate({pl::slice(a, {0, n / 2}, {m, n}), pl::slice(a, {0, 0}, {m, n / 2})}, 1),
                   "roll cols");
        }
        break;
      }
      case 15: {  // a causal mask from iotas and the program id
        Value r = pl::iota(DType::I32, tile, 0) + pl::program_id(0) * static_cast<int32_t>(m);
        Value c = pl::iota(DType::I32, tile, 1);
        add_tile(pl::where(c <= r, any(tiles), pl::full(tile, DType::F32, -1.0)), "causal mask");
        break;
      }
      case 16: {
        Value a = any(tiles);
        add_tile(a * pl::convert(pl::program_id(0) + 1, DType::F32), "times program id");
        break;
      }
      case 17: {  // (a b^T) c, scaled: products of tiles (the tensor-core or CUDA-core paths)
        Value a = any(tiles), b = any(tiles), c = any(tiles);
        Value p = pl::dot(a, b, {.trans_b = true}) * (1.0f / static_cast<float>(n));
        add_tile(pl::dot(p, c) * (1.0f / static_cast<float>(m)), "dot(dot(a, b^T), c)");
        break;
      }
      case 18: {
        Value a = any(tiles);
        if (pick(2))
          add_tile(pl::tanh(pl::cumsum(a, 1, pick(2))), "tanh(cumsum cols)");
        else
          add_tile(pl::cummax(a, 0), "cummax rows");
        break;
      }
      case 19: {
        Value a = any(tiles);
        rows.push_back(pl::convert(pl::argmax(a, 1), DType::F32) * (1.0f / static_cast<float>(n)));
        log += "rows += argmax; ";
        break;
      }
      case 20: {
        add_tile(pl::rev(any(tiles), {pick(2)}), "rev");
        break;
      }
      case 21: {  // a branch on the program id, each side making a tile (one a reduction's)
        Value a = any(tiles), b = any(tiles);
        Value t = pl::cond(
            pl::program_id(0) % 2 == 0, [&] { return pl::tanh(a) + b; },
            [&] { return a - pl::broadcast_to(pl::max(b, {1}, true), tile); });
        add_tile(t, "cond");
        break;
      }
      case 22: {  // the output written, read back, and (later) written again
        o[pl::all] = any(tiles);
        add_tile(o[pl::all] * 0.5f, "output round trip");
        break;
      }
      case 23: {  // half the scratch written by rows, then the whole read
        if (m < 2) break;
        scratch[pl::all] = any(tiles);
        Value a = any(tiles);
        scratch(pl::ds(0, m / 2), pl::all) = pl::slice(a, {m / 2, 0}, {m / 2 * 2, n});
        add_tile(scratch[pl::all], "half scratch");
        break;
      }
      case 25: {  // integer tiles: truncation, bit ops, shifts, remainders
        Value i = pl::convert(any(tiles) * 4.0f, DType::I32);
        Value j = ((i & 7) ^ (i >> 1)) + i % 3;
        add_tile(pl::convert(j, DType::F32) * 0.25f, "integer ops");
        break;
      }
      case 26: {  // boolean tiles: masks combined, reduced along the rows, selecting
        Value a = any(tiles), b = any(tiles);
        Value mask = (a > 0.0f) && (b < 0.5f);
        rows.push_back(pl::convert(pl::reduce_or(mask, {1}), DType::F32) - pl::convert(pl::reduce_and(a > -1.0f, {1}), DType::F32));
        add_tile(pl::where(mask || (a < -1.0f), a, b), "masks");
        break;
      }
      case 27: {  // arithmetic in bf16 (rounded after each op, as the interpreter rounds), of the
                  // inputs (a computed value's last f32 bit, which may differ, could flip a rounding)
        Value a = pl::convert(load(x), DType::BF16), b = pl::convert(load(y), DType::BF16);
        add_tile(pl::convert(a * b + a, DType::F32), "bf16 arithmetic");
        break;
      }
      case 28: {
        add_tile(pl::sort(any(tiles)), "sort rows");
        break;
      }
      default: {  // a column of the scratch written (a strided store), then the whole read
        scratch[pl::all] = any(tiles);
        scratch(pl::all, pl::ds(0, 1)) = pl::sum(any(tiles), {1}, true) * (1.0f / static_cast<float>(n));
        add_tile(scratch[pl::all], "scratch column");
        break;
      }
    }
  }
  o[pl::all] = tiles.back();
  o_cols[pl::all] = cols.empty() ? pl::sum(tiles.back(), {0}) : cols.back();
  o_rows[pl::all] = rows.empty() ? pl::max(tiles.back(), {1}) : rows.back();
  o_total[pl::all] = totals.empty() ? pl::sum(tiles.back()) : totals.back();
}

// PALLAS_FUZZ_SEEDS: how many seeds each case runs beyond CI's.
uint32_t extra_seeds() {
  const char* more = std::getenv("PALLAS_FUZZ_SEEDS");
  return more ? static_cast<uint32_t>(std::stoul(more)) : 0;
}

// Returns how many register tiles the generated kernel has.
int run_seed(uint32_t seed) {
  std::mt19937 rng(seed);
  const auto [m, n] = kBlocks[std::uniform_int_distribution<size_t>(0, kBlocks.size() - 1)(rng)];
  const int64_t blocks = 1 + static_cast<int64_t>(rng() % 3);
  const DType in = rng() % 4 == 0 ? DType::BF16 : DType::F32;
  RandomKernel kernel{seed, m, n, blocks, in};
  auto rows_of = [](Value i) { return Indices{i, 0}; };
  auto one = [](Value i) { return Indices{i}; };
  CallOptions o;
  o.grid = {blocks};
  o.in_specs = {BlockSpec({m, n}, rows_of), BlockSpec({m, n}, rows_of), BlockSpec()};
  o.out_specs = {BlockSpec({m, n}, rows_of), BlockSpec({pl::squeezed, n}, rows_of), BlockSpec({m}, one),
                 BlockSpec({pl::squeezed}, one)};
  o.scratch_shapes = {ScratchShape{{m, n}, DType::F32, MemorySpace::Vmem}};
  o.interpret = true;
  PallasCall call = pl::pallas_call(kernel,
                                    {ShapeDtype({blocks * m, n}, DType::F32), ShapeDtype({blocks, n}, DType::F32),
                                     ShapeDtype({blocks * m}, DType::F32), ShapeDtype({blocks}, DType::F32)},
                                    o);
  const std::vector<Array> args = {Array::random_normal({blocks * m, n}, in, seed + 1),
                                   Array::random_normal({blocks * m, n}, in, seed + 2),
                                   Array::random_normal({n}, in, seed + 3)};
  std::string context;
  try {
    call.trace({args[0].shape_dtype(), args[1].shape_dtype(), args[2].shape_dtype()});
  } catch (const Error& e) {
    ADD_FAILURE() << "seed " << seed << " (" << m << " x " << n << "): tracing failed: " << e.what() << "\n" << *kernel.steps;
    return 0;
  }
  context = "seed " + std::to_string(seed) + ", block " + std::to_string(m) + " x " + std::to_string(n) + ", grid " +
            std::to_string(blocks) + ", " + std::string(dtype_name(in)) + ", steps: " + *kernel.steps + "\n";
  SCOPED_TRACE(context);
  const int tiles = test_util::expect_same(call, args, 1e-4, 3e-4, {}, {1, 3}, context).register_tiles;
  if (std::getenv("PALLAS_FUZZ_VERBOSE")) std::printf("%d register tiles: %s", tiles, context.c_str());
  return tiles;
}

// Seeds [first, first + count), plus PALLAS_FUZZ_SEEDS more each; or PALLAS_FUZZ_SEED alone.
// A quarter of the kernels at least must keep some values in registers: a planner that gave up on
// them all would still compute right, and these tests would no longer check its layouts.
void run_seeds(uint32_t first, uint32_t count) {
  const test_util::NvrtcChecks nvrtc(kNvrtcArchs);
  if (const char* one = std::getenv("PALLAS_FUZZ_SEED")) {
    if (first == 0) run_seed(static_cast<uint32_t>(std::stoul(one)));
    return;
  }
  count += extra_seeds();
  uint32_t ran = 0, in_registers = 0;
  for (uint32_t s = first; s < first + count && !testing::Test::HasFailure(); ++s, ++ran)
    in_registers += run_seed(s) > 0;
  std::printf("%u random kernels, %u with register tiles\n", ran, in_registers);
  if (!testing::Test::HasFailure()) {
    EXPECT_GE(in_registers * 4, ran);
  }
}

// Random blocked products over random grids: block shapes, steps of the sequential k axis,
// ragged edges (rows and columns of blocks past the arrays), y as (k, n) or (n, k), the
// accumulator a scratch or the output itself, a bias and an activation in the epilogue, j
// parallel or sequential, ring depths, and the code generator's switches (threads per CTA: the
// CUDA-core loop, a warp's mma.sync, a warpgroup's wgmma; TMA or cp.async; asynchronous wgmma).
void run_grid_seed(uint32_t seed) {
  std::mt19937 rng(seed);
  auto pick = [&](int k) { return std::uniform_int_distribution<int>(0, k - 1)(rng); };
  const DType in = pick(2) ? DType::BF16 : DType::F32;
  const int64_t bm = std::vector<int64_t>{16, 32, 64}[static_cast<size_t>(pick(3))];
  const int64_t bn = std::vector<int64_t>{16, 32, 64}[static_cast<size_t>(pick(3))];
  const int64_t bk = std::vector<int64_t>{16, 32}[static_cast<size_t>(pick(2))];
  const int64_t gi = 1 + pick(2), gj = 1 + pick(2), steps = 1 + pick(3);
  const int64_t M = bm * gi - (pick(3) == 0 ? 5 : 0), N = bn * gj - (pick(3) == 0 ? 3 : 0), K = bk * steps;
  const bool b_nk = pick(2), into_output = pick(2), bias = pick(2), j_sequential = pick(3) == 0;
  const int activation = pick(3), depth = 1 + pick(3);
  const int threads = std::vector<int>{1, 3, 32, 128}[static_cast<size_t>(pick(4))];
  gpu::CodegenOptions options;
  options.threads_per_cta = threads;
  options.default_buffer_count = depth;
  options.tma = pick(2);
  options.async_wgmma = pick(2);
  if (j_sequential) options.dimension_semantics = {"parallel", "arbitrary", "arbitrary"};
  const std::string context = "grid seed " + std::to_string(seed) + ": " + std::string(dtype_name(in)) + " M N K " +
                              std::to_string(M) + " " + std::to_string(N) + " " + std::to_string(K) + ", blocks " +
                              std::to_string(bm) + " " + std::to_string(bn) + " " + std::to_string(bk) + (b_nk ? ", y (n, k)" : "") +
                              (into_output ? ", into the output" : ", into a scratch") + (bias ? ", bias" : "") +
                              ", activation " + std::to_string(activation) + ", depth " + std::to_string(depth) + ", " +
                              std::to_string(threads) + " threads" + (options.tma ? ", tma" : "") +
                              (options.async_wgmma ? ", async wgmma" : "") + (j_sequential ? ", j sequential" : "") + "\n";
  SCOPED_TRACE(context);
  auto epilogue = [=](Value z, const Ref* b) {
    if (b) z = z + pl::broadcast_to((*b)[pl::all], {bm, bn});
    if (activation == 1) z = pl::maximum(z, 0.0f);
    if (activation == 2) z = pl::tanh(z * 0.25f);
    return z;
  };
  auto kernel = [=](std::vector<Ref>& refs) {
    const Ref &x = refs[0], &y = refs[1];
    const Ref* b = bias ? &refs[2] : nullptr;
    const Ref& o = refs[bias ? 3 : 2];
    const Ref& acc = into_output ? o : refs[bias ? 4 : 3];
    pl::Value first = pl::program_id(2) == 0, last = pl::program_id(2) == pl::num_programs(2) - 1;
    pl::when(first, [&] { acc[pl::all] = 0.0f; });
    acc[pl::all] += pl::dot(x[pl::all], y[pl::all], {.trans_b = b_nk, .preferred = DType::F32});
    if (into_output) {
      if (bias || activation) pl::when(last, [&] { o[pl::all] = epilogue(o[pl::all], b); });
    } else {
      pl::when(last, [&] { o[pl::all] = epilogue(acc[pl::all], b); });
    }
  };
  CallOptions o;
  o.grid = {gi, gj, steps};
  std::vector<BlockSpec> in_specs = {BlockSpec({bm, bk}, [](Value i, Value, Value k) { return Indices{i, k}; }),
                                     b_nk ? BlockSpec({bn, bk}, [](Value, Value j, Value k) { return Indices{j, k}; })
                                          : BlockSpec({bk, bn}, [](Value, Value j, Value k) { return Indices{k, j}; })};
  if (bias) in_specs.push_back(BlockSpec({bn}, [](Value, Value j, Value) { return Indices{j}; }));
  o.in_specs = std::move(in_specs);
  o.out_specs = {BlockSpec({bm, bn}, [](Value i, Value j, Value) { return Indices{i, j}; })};
  if (!into_output) o.scratch_shapes = {ScratchShape{{bm, bn}, DType::F32, MemorySpace::Vmem}};
  o.interpret = true;
  PallasCall call = pl::pallas_call(kernel, ShapeDtype({M, N}, DType::F32), o);
  std::vector<Array> args = {Array::random_normal({M, K}, in, seed + 1),
                             b_nk ? Array::random_normal({N, K}, in, seed + 2) : Array::random_normal({K, N}, in, seed + 2)};
  if (bias) args.push_back(Array::random_normal({N}, DType::F32, seed + 3));
  test_util::expect_same(call, args, 1e-4, 1e-3, options, {threads}, context);
}

// Seeds [first, first + count) of `run_one`, plus PALLAS_FUZZ_SEEDS more; or the seed in the
// environment variable `one_seed` alone (the first case of a kind runs it).
// Returns how many seeds ran.
uint32_t run_seed_range(const char* one_seed, uint32_t first, uint32_t count, void (*run_one)(uint32_t)) {
  const test_util::NvrtcChecks nvrtc(kNvrtcArchs);
  if (const char* one = std::getenv(one_seed)) {
    if (first != 0) return 0;
    run_one(static_cast<uint32_t>(std::stoul(one)));
    return 1;
  }
  count += extra_seeds();
  uint32_t ran = 0;
  for (uint32_t s = first; s < first + count && !testing::Test::HasFailure(); ++s) run_one(s), ++ran;
  return ran;
}

void run_grid_seeds(uint32_t first, uint32_t count) { run_seed_range("PALLAS_FUZZ_GRID_SEED", first, count, run_grid_seed); }

// Random attention kernels written as pallas_calls (products whose results stay in registers,
// plan_fragments' wgmma-layout tiles): q blocks of 64 or 128 rows over a parallel axis, k and v
// blocks of 16-128 rows, head dims 16-64, k given as (n, d) (q k^T) or (d, n); one k block, or a
// sequential axis over them with the online softmax (the running max and sum in (m) or (m, 1)
// scratch, the output accumulator rescaled); a causal mask from iotas and the program ids; p and
// v as bf16 or f16; the scores also stored (a use outside registers), the log-sum-exp stored; 128 or
// 256 threads. Every output against the interpreter, and without register tiles at 3 threads.
void run_attention_seed(uint32_t seed) {
  std::mt19937 rng(seed);
  auto pick = [&](int k) { return std::uniform_int_distribution<int>(0, k - 1)(rng); };
  const int64_t bm = pick(2) ? 64 : 128, bn = std::vector<int64_t>{16, 32, 64, 128}[static_cast<size_t>(pick(4))];
  const int64_t d = std::vector<int64_t>{16, 32, 64}[static_cast<size_t>(pick(3))];
  const int64_t gi = 1 + pick(2), gk = pick(2) ? 1 : 1 + pick(3);
  const bool k_dn = pick(3) == 0, causal = pick(2), keep_dims = pick(2), store_s = pick(4) == 0, lse = pick(2);
  const DType pt = pick(3) == 0 ? DType::F16 : DType::BF16;
  const int threads = pick(2) ? 128 : 256;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const std::string context = "attention seed " + std::to_string(seed) + ": q blocks " + std::to_string(bm) + " x " +
                              std::to_string(d) + " (" + std::to_string(gi) + "), k blocks " + std::to_string(bn) + " (" +
                              std::to_string(gk) + ")" + (k_dn ? ", k as (d, n)" : "") + (causal ? ", causal" : "") +
                              (keep_dims ? ", (m, 1) scratch" : ", (m) scratch") + (store_s ? ", s stored" : "") +
                              (lse ? ", lse" : "") + ", p " + std::string(dtype_name(pt)) + ", " + std::to_string(threads) + " threads\n";
  SCOPED_TRACE(context);
  const Shape line = keep_dims ? Shape{bm, 1} : Shape{bm};
  auto as_line = [&](Value v) { return keep_dims ? v : pl::squeeze(v, {1}); };   // (m, 1) -> the scratch's shape
  auto as_col = [&](Value v) { return keep_dims ? v : pl::expand_dims(v, {1}); };  // the scratch's -> (m, 1)
  auto kernel = [=](std::vector<Ref>& refs) {
    const Ref &q = refs[0], &k = refs[1], &v = refs[2], &o = refs[3];
    size_t next = 4;
    const Ref* s_out = store_s ? &refs[next++] : nullptr;
    const Ref* lse_out = lse ? &refs[next++] : nullptr;
    const Ref &m_scr = refs[next], &l_scr = refs[next + 1], &acc = refs[next + 2];
    Value kj = pl::program_id(1);
    Value s = pl::dot(q[pl::all], k[pl::all], {.trans_b = !k_dn, .preferred = DType::F32}) * scale;
    if (causal) {
      Value r = pl::iota(DType::I32, {bm, bn}, 0) + pl::program_id(0) * static_cast<int32_t>(bm);
      Value c = pl::iota(DType::I32, {bm, bn}, 1) + kj * static_cast<int32_t>(bn);
      s = pl::where(c <= r, s, pl::full({bm, bn}, DType::F32, -1e30));
    }
    if (s_out) (*s_out)[pl::all] = s;
    if (gk == 1) {
      Value mx = pl::max(s, {1}, true);
      Value p = pl::exp(s - mx);
      Value l = pl::sum(p, {1}, true);
      o[pl::all] = pl::dot(p.astype(pt), v[pl::all], {.preferred = DType::F32}) / l;
      if (lse_out) (*lse_out)[pl::all] = as_line(mx + pl::log(l));
      return;
    }
    pl::when(kj == 0, [&] {
      m_scr[pl::all] = pl::full(line, DType::F32, -1e30);
      l_scr[pl::all] = pl::full(line, DType::F32, 0.0);
      acc[pl::all] = 0.0f;
    });
    Value m_prev = as_col(m_scr[pl::all]), l_prev = as_col(l_scr[pl::all]);
    Value m_new = pl::maximum(m_prev, pl::max(s, {1}, true));
    Value alpha = pl::exp(m_prev - m_new);
    Value p = pl::exp(s - m_new);
    l_scr[pl::all] = as_line(alpha * l_prev + pl::sum(p, {1}, true));
    acc[pl::all] = acc[pl::all] * alpha + pl::dot(p.astype(pt), v[pl::all], {.preferred = DType::F32});
    m_scr[pl::all] = as_line(m_new);
    pl::when(kj == static_cast<int32_t>(gk - 1), [&] {
      Value l = as_col(l_scr[pl::all]);
      o[pl::all] = acc[pl::all] / l;
      if (lse_out) (*lse_out)[pl::all] = as_line(as_col(m_scr[pl::all]) + pl::log(l));
    });
  };
  CallOptions o;
  o.grid = {gi, gk};
  o.in_specs = {BlockSpec({bm, d}, [](Value i, Value) { return Indices{i, 0}; }),
                k_dn ? BlockSpec({d, bn}, [](Value, Value j) { return Indices{0, j}; })
                     : BlockSpec({bn, d}, [](Value, Value j) { return Indices{j, 0}; }),
                BlockSpec({bn, d}, [](Value, Value j) { return Indices{j, 0}; })};
  std::vector<ShapeDtype> outs = {ShapeDtype({gi * bm, d}, DType::F32)};
  std::vector<BlockSpec> out_specs = {BlockSpec({bm, d}, [](Value i, Value) { return Indices{i, 0}; })};
  if (store_s) {
    outs.push_back(ShapeDtype({gi * bm, gk * bn}, DType::F32));
    out_specs.push_back(BlockSpec({bm, bn}, [](Value i, Value j) { return Indices{i, j}; }));
  }
  if (lse) {
    outs.push_back(ShapeDtype(keep_dims ? Shape{gi * bm, 1} : Shape{gi * bm}, DType::F32));
    out_specs.push_back(keep_dims ? BlockSpec({bm, 1}, [](Value i, Value) { return Indices{i, 0}; })
                                  : BlockSpec({bm}, [](Value i, Value) { return Indices{i}; }));
  }
  o.out_specs = std::move(out_specs);
  o.scratch_shapes = {ScratchShape{line, DType::F32, MemorySpace::Vmem}, ScratchShape{line, DType::F32, MemorySpace::Vmem},
                      ScratchShape{{bm, d}, DType::F32, MemorySpace::Vmem}};
  o.interpret = true;
  PallasCall call = pl::pallas_call(kernel, outs, o);
  const std::vector<Array> args = {Array::random_normal({gi * bm, d}, DType::BF16, seed + 1),
                                   k_dn ? Array::random_normal({d, gk * bn}, DType::BF16, seed + 2)
                                        : Array::random_normal({gk * bn, d}, DType::BF16, seed + 2),
                                   Array::random_normal({gk * bn, d}, pt, seed + 3)};
  gpu::CodegenOptions options;
  options.threads_per_cta = threads;
  options.dimension_semantics = {"parallel", "arbitrary"};
  const gpu::GeneratedKernel g = test_util::expect_same(call, args, 2e-3, 2e-3, options, {3}, context);
  if (std::getenv("PALLAS_FUZZ_VERBOSE")) std::printf("%d register tiles: %s", g.register_tiles, context.c_str());
  // (The scores' product keeps its registers: q k^T runs on wgmma whatever the rest does.)
  EXPECT_GE(g.register_dots, store_s ? 0 : 1) << context;
  if (const char* path = std::getenv("PALLAS_FUZZ_DUMP")) std::ofstream(path) << g.source;  // (to read one)
}

void run_attention_seeds(uint32_t first, uint32_t count) {
  run_seed_range("PALLAS_FUZZ_ATTENTION_SEED", first, count, run_attention_seed);
}

// Random nests of control flow (stop 51: the arena releases what a region yields, frees a loop
// body's tiles past the loop, and lets a cond's branches share bytes, where a reuse without its
// barrier would race): fori_loops (trip counts 0-2, from program_id or an enclosing loop's index;
// carries swapped, yielded twice, or unchanged), while_loops (their conditions may compute and
// reduce tiles), conds and 3-way switches yielding 0-2 values (outer values or their own), run_scoped
// scratch, `when` writing a scratch, all around ops that read other threads' elements (reversals,
// row max, cumsum, slices and concatenates), and (stop 52) steps that read only what their region
// makes (a load of x's block, the newest value), whose loops' carries and branches' results may
// stay in registers. Tiles of (16, 32) f32 over a grid of 2, every value kept live to the output;
// with register tiles and without, at 1, 3 and 64 threads.
struct ControlFlowKernel {
  uint32_t seed;
  int64_t m = 16, n = 32;
  std::shared_ptr<std::string> steps = std::make_shared<std::string>();

  struct Gen {
    std::mt19937 rng;
    int64_t m, n;
    std::string& log;
    const Ref& scratch;
    const Ref& x;
    std::vector<Value> loop_index;  // (the enclosing loops' indices, innermost last)

    int pick(int k) { return std::uniform_int_distribution<int>(0, k - 1)(rng); }
    Value any(const std::vector<Value>& pool) { return pool[static_cast<size_t>(pick(static_cast<int>(pool.size())))]; }
    Value trip() {
      if (!loop_index.empty() && pick(3) == 0) return pick(2) ? loop_index.back() : 2 - loop_index.back();
      switch (pick(6)) {
        case 0: return pl::scalar(0, DType::I32);
        case 1: return pl::scalar(1, DType::I32);
        case 2: return pl::scalar(2, DType::I32);
        case 3: return pl::program_id(0);
        case 4: return pl::program_id(0) + 1;
        default: return 1 - pl::program_id(0);
      }
    }
    Value predicate() {
      if (!loop_index.empty() && pick(2)) return loop_index.back() % 2 == 0;
      switch (pick(3)) {
        case 0: return pl::program_id(0) == 0;
        case 1: return pl::program_id(0) == 1;
        default: return pl::program_id(0) < 5;
      }
    }
    Value across(Value a) {  // (reads other threads' elements)
      switch (pick(5)) {
        case 0: return pl::rev(a, {0});
        case 1: return pl::rev(a, {1});
        case 2: return a - pl::broadcast_to(pl::max(a, {1}, true), {m, n});
        case 3: return pl::tanh(pl::cumsum(a, 1));
        default: return pl::concatenate({pl::slice(a, {m / 2, 0}, {m, n}), pl::slice(a, {0, 0}, {m / 2, n})}, 0);
      }
    }
    void region(std::vector<Value>& pool, int depth, int count) {
      for (int s = 0; s < count; ++s) step(pool, depth);
    }
    // `count` values a region yields: mostly ones it made, some from outside it.
    std::vector<Value> yields(const std::vector<Value>& pool, const std::vector<Value>& made, int count) {
      std::vector<Value> out;
      for (int i = 0; i < count; ++i) out.push_back(made.empty() || pick(3) == 0 ? any(pool) : any(made));
      return out;
    }
    void step(std::vector<Value>& pool, int depth) {
      // A quarter of the steps read only what the region makes (x's block loaded here, the newest
      // value): values that may stay in registers, through the loops and branches that yield them.
      if (pick(4) == 0) {
        if (pick(2)) log += "load; ", pool.push_back(x[pl::all] * 0.5f + 0.25f);
        else log += "newest; ", pool.push_back(pl::tanh(pool.back() * 0.75f) + 0.125f);
        return;
      }
      const int choice = pick(depth > 0 ? 12 : 5);
      switch (choice) {
        case 0:
        case 1: log += "across; "; pool.push_back(across(any(pool))); return;
        case 2: log += "elementwise; "; pool.push_back(pl::tanh(any(pool) * 0.5f + any(pool))); return;
        case 3: {
          log += "row sum; ";
          Value a = any(pool);
          pool.push_back(pl::tanh(a + pl::broadcast_to(pl::sum(a, {1}, true), {m, n}) * 0.1f));
          return;
        }
        case 4: log += "scratch; "; scratch[pl::all] = any(pool); pool.push_back(pl::rev(scratch[pl::all], {0}) * 0.5f); return;
        case 5:
        case 6: {
          const int carries = 1 + pick(2);
          std::vector<Value> init;
          for (int i = 0; i < carries; ++i) init.push_back(any(pool));
          log += "fori_loop(" + std::to_string(carries) + ") { ";
          const std::vector<Value> outer = pool;
          Value hi = trip();
          std::vector<Value> r = pl::fori_loop(pl::scalar(0, DType::I32), hi, init, [&](Value i, std::vector<Value> c) {
            loop_index.push_back(i);
            std::vector<Value> p = outer;
            p.insert(p.end(), c.begin(), c.end());
            const size_t before = p.size();
            region(p, depth - 1, 1 + pick(3));
            const std::vector<Value> made(p.begin() + static_cast<long>(before), p.end());
            std::vector<Value> ys;
            const int how = pick(4);
            for (int k = 0; k < carries; ++k) {
              if (how == 0) ys.push_back(c[static_cast<size_t>((k + 1) % carries)]);  // swapped, or unchanged
              else if (how == 1 && !made.empty()) ys.push_back(made.back());        // one value twice
              else ys.push_back(made.empty() || pick(4) == 0 ? any(p) : any(made));
            }
            loop_index.pop_back();
            return ys;
          });
          log += "} ";
          pool.insert(pool.end(), r.begin(), r.end());
          return;
        }
        case 7: {
          const bool tile_condition = pick(2);
          log += std::string("while_loop") + (tile_condition ? " (a tile in its condition)" : "") + " { ";
          const std::vector<Value> outer = pool;
          Value init = any(pool), limit = trip();
          std::vector<Value> r = pl::while_loop(
              {init, pl::scalar(0, DType::I32)},
              [&](std::vector<Value> c) {
                if (!tile_condition) return c[1] < limit;
                std::vector<Value> p = outer;
                p.push_back(c[0]);
                const size_t before = p.size();
                region(p, 0, 1 + pick(2));
                Value t = p.size() > before ? p.back() : across(c[0]);
                return pl::convert(pl::sum(t) * 0.0f, DType::I32) + c[1] < limit;
              },
              [&](std::vector<Value> c) {
                loop_index.push_back(c[1]);
                std::vector<Value> p = outer;
                p.push_back(c[0]);
                const size_t before = p.size();
                region(p, depth - 1, 1 + pick(3));
                const std::vector<Value> made(p.begin() + static_cast<long>(before), p.end());
                Value y = made.empty() || pick(4) == 0 ? any(p) : any(made);
                loop_index.pop_back();
                return std::vector<Value>{y, c[1] + 1};
              });
          log += "} ";
          pool.push_back(r[0]);
          return;
        }
        case 8:
        case 9: {
          const int branches = choice == 8 ? 2 : 3, results = pick(3);
          log += (branches == 2 ? "cond(" : "switch(") + std::to_string(results) + ") { ";
          const std::vector<Value> outer = pool;
          std::vector<std::function<std::vector<Value>()>> fs;
          for (int b = 0; b < branches; ++b)
            fs.push_back([&] {
              std::vector<Value> p = outer;
              const size_t before = p.size();
              if (pick(4)) region(p, depth - 1, 1 + pick(3));
              const std::vector<Value> made(p.begin() + static_cast<long>(before), p.end());
              log += "| ";
              return yields(p, made, results);
            });
          std::vector<Value> r = branches == 2 ? pl::cond(predicate(), fs[0], fs[1])
                                               : pl::switch_case(pick(2) ? pl::program_id(0) : pl::program_id(0) + 1, fs);
          log += "} ";
          pool.insert(pool.end(), r.begin(), r.end());
          return;
        }
        case 10: {
          log += "run_scoped { ";
          const std::vector<Value> outer = pool;
          const int results = 1 + pick(2);
          std::vector<Value> r = pl::run_scoped({ScopedAlloc{{m, n}, DType::F32, MemorySpace::Vmem}}, [&](std::vector<Ref> tmp) {
            std::vector<Value> p = outer;
            tmp[0][pl::all] = any(p);
            p.push_back(pl::rev(tmp[0][pl::all], {1}));
            const size_t before = p.size() - 1;
            region(p, depth - 1, pick(3));
            const std::vector<Value> made(p.begin() + static_cast<long>(before), p.end());
            return yields(p, made, results);
          });
          log += "} ";
          pool.insert(pool.end(), r.begin(), r.end());
          return;
        }
        default: {
          log += "when { ";
          const std::vector<Value> outer = pool;
          pl::when(predicate(), [&] {
            std::vector<Value> p = outer;
            region(p, depth - 1, 1 + pick(2));
            scratch[pl::all] = p.back();
          });
          log += "} ";
          pool.push_back(scratch[pl::all] * 0.5f);
          return;
        }
      }
    }
  };

  void operator()(std::vector<Ref>& refs) const {
    const Ref &x = refs[0], &o = refs[1], &scratch = refs[2];
    steps->clear();
    Gen g{std::mt19937(seed * 2654435761u + 7), m, n, *steps, scratch, x, {}};
    std::vector<Value> pool{x[pl::all]};
    pool.push_back(pl::rev(pool[0], {0}));
    g.region(pool, 3, 3 + g.pick(5));
    Value out = pool.back();
    for (size_t i = 0; i + 1 < pool.size(); i += 3) out = out + pool[i] * 0.25f;
    o[pl::all] = out;
  }
};

uint32_t control_flow_kernels_carrying_registers = 0;  // (of a run of seeds: GeneratedKernel::register_carries > 0)
uint32_t control_flow_kernels_capturing_registers = 0;  // (GeneratedKernel::register_captures > 0)

void run_control_flow_seed(uint32_t seed) {
  ControlFlowKernel kernel{seed};
  CallOptions o;
  o.grid = {2};
  o.in_specs = {BlockSpec({kernel.m, kernel.n}, [](Value i) { return Indices{i, 0}; })};
  o.out_specs = {BlockSpec({kernel.m, kernel.n}, [](Value i) { return Indices{i, 0}; })};
  o.scratch_shapes = {ScratchShape{{kernel.m, kernel.n}, DType::F32, MemorySpace::Vmem}};
  o.interpret = true;
  PallasCall call = pl::pallas_call(kernel, ShapeDtype({2 * kernel.m, kernel.n}, DType::F32), o);
  const Array x = Array::random_normal({2 * kernel.m, kernel.n}, DType::F32, seed + 1);
  call.trace({x.shape_dtype()});  // (fills steps for the message)
  const std::string context = "control-flow seed " + std::to_string(seed) + ": " + *kernel.steps + "\n";
  SCOPED_TRACE(context);
  const gpu::GeneratedKernel k = test_util::expect_same(call, {x}, 2e-3, 2e-3, {}, {1, 3, 64}, context);
  control_flow_kernels_carrying_registers += k.register_carries > 0 ? 1 : 0;
  control_flow_kernels_capturing_registers += k.register_captures > 0 ? 1 : 0;
  if (std::getenv("PALLAS_FUZZ_VERBOSE"))
    std::printf("%d control-flow results and %d captured tiles in registers: %s", k.register_carries, k.register_captures,
                context.c_str());
}

void run_control_flow_seeds(uint32_t first, uint32_t count) {
  control_flow_kernels_carrying_registers = control_flow_kernels_capturing_registers = 0;
  const uint32_t ran = run_seed_range("PALLAS_FUZZ_CONTROL_FLOW_SEED", first, count, run_control_flow_seed);
  std::printf("%u of %u control-flow kernels hold loop carries or branch results in registers, %u read captured "
              "register tiles\n",
              control_flow_kernels_carrying_registers, ran, control_flow_kernels_capturing_registers);
  // (Else the plans of loop carries and branch results in registers, and of tiles read inside
  // control flow, would go unchecked: of the first 8 seeds 5 hold carries and 5 capture tiles, of
  // the first 108, 68 and 41.)
  if (ran > 1 && !testing::Test::HasFailure()) {
    EXPECT_GE(control_flow_kernels_carrying_registers * 4, ran) << "too few kernels hold control-flow results in registers";
    EXPECT_GE(control_flow_kernels_capturing_registers * 4, ran) << "too few kernels read captured register tiles";
  }
}

TEST(GpuCodegenFuzz, RandomKernelsMatchTheInterpreterA) { run_seeds(0, 6); }
TEST(GpuCodegenFuzz, RandomKernelsMatchTheInterpreterB) { run_seeds(1000, 6); }
TEST(GpuCodegenFuzz, RandomKernelsMatchTheInterpreterC) { run_seeds(2000, 6); }
TEST(GpuCodegenFuzz, RandomKernelsMatchTheInterpreterD) { run_seeds(3000, 6); }
TEST(GpuCodegenFuzz, RandomProductsOverGridsMatchTheInterpreterA) { run_grid_seeds(0, 5); }
TEST(GpuCodegenFuzz, RandomProductsOverGridsMatchTheInterpreterB) { run_grid_seeds(1000, 5); }
TEST(GpuCodegenFuzz, RandomAttentionMatchesTheInterpreterA) { run_attention_seeds(0, 4); }
TEST(GpuCodegenFuzz, RandomAttentionMatchesTheInterpreterB) { run_attention_seeds(1000, 4); }
TEST(GpuCodegenFuzz, RandomControlFlowMatchesTheInterpreter) { run_control_flow_seeds(0, 8); }

}  // namespace
}  // namespace pallas
