// The IR text form: golden output, print -> parse -> print round trips over kernels that use
// every op, exact scalars, parse errors with line:column, and a mutation fuzz.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <random>
#include <set>

#include "ir/builder.h"
#include "pallas/pallas.h"
#include "pallas/gpu.h"
#include "pallas/sparse_core.h"
#include "pallas/tpu.h"

namespace pl = pallas;
namespace ir = pallas::ir;
using ir::AttrKey;
using ir::OpCode;
using ir::Type;

namespace {

Type ref(pl::Shape s, pl::DType t, pl::MemorySpace m = pl::MemorySpace::Vmem) {
  return Type::ref(std::move(s), t, m);
}

pl::Scalar f32_bits(uint32_t bits) {
  return pl::Scalar::of_float(static_cast<double>(std::bit_cast<float>(bits)), pl::f32);
}

// ---- Test kernels -----------------------------------------------------------------------------

ir::Kernel add_one_kernel() {
  return pl::trace_kernel([](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all] + 1.0f; },
                          {ref({8, 128}, pl::f32), ref({8, 128}, pl::f32, pl::MemorySpace::Any)},
                          "add_one");
}

ir::Kernel elementwise_kernel() {
  return pl::trace_kernel(
      [](pl::Ref xf, pl::Ref xi, pl::Ref xu, pl::Ref of, pl::Ref oi, pl::Ref ob) {
        pl::Value f = xf[pl::all];
        pl::Value g = pl::neg(pl::abs(pl::sign(f)));
        g = pl::floor(g) + pl::ceil(g) + pl::round(g, pl::RoundingMethod::ToNearestEven);
        g = g + pl::exp(f) + pl::exp2(f) + pl::log(f) + pl::log1p(f) + pl::sqrt(f);
        g = g + pl::rsqrt(f) + pl::reciprocal(f) + pl::tanh(f) + pl::logistic(f);
        g = g + pl::sin(f) + pl::cos(f) + pl::erf(f) + pl::integer_pow(f, -2);
        g = g - f * f / f;
        g = pl::pow(g, f);
        g = pl::maximum(g, f) + pl::minimum(g, f);
        pl::Value fin = pl::is_finite(g);
        g = pl::where(fin, g, f);
        of[pl::all] = g;

        pl::Value i = xi[pl::all];
        pl::Value j = (i + 1) - i * 3 / i % 5;
        j = (j & i) | (j ^ i);
        j = pl::shift_left(j, i) + pl::shift_right_arithmetic(j, i) +
            pl::shift_right_logical(j, i);
        j = ~j;
        j = pl::multiple_of(j, 8);
        j = j + pl::bitcast(f, pl::i32) + pl::convert(f, pl::i32);
        oi[pl::all] = j;

        pl::Value u = xu[pl::all];
        pl::Value b = (u == 1u) && (u != 2u);
        b = b || ((u < 3u) && (u <= 4u)) || ((u > 5u) && (u >= 6u));
        b = pl::logical_not(b);
        ob[pl::all] = b;
      },
      {ref({8}, pl::f32), ref({8}, pl::i32), ref({8}, pl::u32), ref({8}, pl::f32),
       ref({8}, pl::i32), ref({8}, pl::bool_)},
      "elementwise");
}

ir::Kernel shapes_kernel() {
  return pl::trace_kernel(
      [](pl::Ref x, pl::Ref o, pl::Ref idx) {
        pl::Value v = x[pl::all];  // f32[4,8]
        pl::Value b = pl::broadcast_in_dim(pl::sum(v, {1}), {4, 8}, {0});
        pl::Value t = pl::transpose(v, {1, 0});
        pl::Value r = pl::reshape(t, {4, 8});
        pl::Value e = pl::expand_dims(r, {0});
        pl::Value s = pl::squeeze(e, {0});
        pl::Value c = pl::concatenate({s, b}, 0);  // [8,8]
        pl::Value sl = pl::slice(c, {0, 0}, {8, 8}, {2, 1});  // [4,8]
        pl::Value ds = pl::dynamic_slice(c, {idx[0], 0}, {4, 8});
        pl::Value rv = pl::rev(sl + ds, {0, 1});
        pl::Value io = pl::iota(pl::f32, {4, 8}, 1);
        o[pl::all] = rv + io;
      },
      {ref({4, 8}, pl::f32), ref({4, 8}, pl::f32), ref({2}, pl::i32, pl::MemorySpace::Smem)},
      "shapes");
}

ir::Kernel reductions_kernel() {
  return pl::trace_kernel(
      [](pl::Ref x, pl::Ref k, pl::Ref m, pl::Ref o, pl::Ref oi) {
        pl::Value v = x[pl::all];  // f32[4,8]
        pl::Value bits = k[pl::all];  // i32[4,8]
        pl::Value s = pl::sum(v, {1}) + pl::max(v, {1}) + pl::min(v, {-1}) + pl::prod(v, {1});
        pl::Value a = pl::reduce_and(bits, {1}) + pl::reduce_or(bits, {1});
        pl::Value am = pl::argmax(v, 1) + pl::argmin(v, 1, pl::i32);
        pl::Value cs = pl::cumsum(v, 1) + pl::cumprod(v, 1, true) + pl::cummax(v, 0) +
                       pl::cummin(v, 1);
        std::vector<pl::Value> sorted = pl::sort({v, bits, cs}, 2, true);
        pl::Value d = pl::dot(m[pl::all], sorted[0]);  // [4,4] x [4,8]
        pl::Value dg = pl::dot_general(v, v, pl::DotDims{{1}, {1}, {}, {}}, pl::f32);  // [4,4]
        pl::Value row = pl::reshape(s + pl::sum(dg, {1}), {4, 1});
        o[pl::all] = d + pl::broadcast_to(row, {4, 8});
        oi[pl::all] = sorted[1] + pl::broadcast_to(pl::reshape(a + am, {4, 1}), {4, 8});
      },
      {ref({4, 8}, pl::f32), ref({4, 8}, pl::i32), ref({4, 4}, pl::f32), ref({4, 8}, pl::f32),
       ref({4, 8}, pl::i32)},
      "reductions");
}

ir::Kernel refs_kernel() {
  return pl::trace_kernel(
      [](pl::Ref x, pl::Ref o, pl::Ref cnt, pl::Ref flag) {
        pl::Value pid = pl::program_id(0);
        pl::Value n = pl::num_programs(1);
        // A view with a dynamic ds start, then a strided static slice of it.
        pl::Ref row = x.at(pl::ds(pid * 2, 2)).at(1, pl::ds(0, 8, 2));
        pl::Value v = row.load();
        pl::Value mask = pl::iota(pl::i32, {8}, 0) < n;
        pl::Value w = x.load_masked({pid, pl::ds(0, 8)}, mask, 0.0f);
        o.store_masked({pl::ds(pid, 1, 1), pl::all}, pl::reshape(v + w, {1, 8}), pl::reshape(mask, {1, 8}));
        pl::Value old = o.swap({0, pl::ds(n, 8)}, v);
        o[pl::all] = pl::broadcast_to(old, {4, 8});
        pl::Value c0 = cnt.atomic_add({pid}, 1);
        pl::Value c1 = cnt.atomic_rmw("max", {3}, c0);
        pl::Value c2 = cnt.atomic_cas({2}, c1, 7);
        flag[0] = c2;
        // Transforms: o's transpose, x reshaped (and a view of that).
        o.T().at(pl::ds(0, 4), 1)[pl::all] = pl::zeros({4}, pl::f32);
        x.reshape({2, -1, 16}).at(1)[0] = pl::zeros({16}, pl::f32);
        x.bitcast(pl::i32).at(2)[pl::all] = pl::zeros({16}, pl::i32);
      },
      {ref({8, 16}, pl::f32, pl::MemorySpace::Any), ref({4, 8}, pl::f32), ref({4}, pl::i32, pl::MemorySpace::Smem),
       ref({1}, pl::i32, pl::MemorySpace::Smem)},
      "refs");
}

ir::Kernel control_kernel() {
  return pl::trace_kernel(
      [](pl::Ref x, pl::Ref o) {
        pl::Value v = x[pl::all];  // f32[8]
        // for with two carries, a nested cond inside it and a nested for without carries.
        std::vector<pl::Value> carries = pl::fori_loop(
            0, 4, std::vector<pl::Value>{v, pl::scalar(0, pl::i32)},
            [&](pl::Value i, std::vector<pl::Value> c) {
              pl::Value next = pl::cond(i > 1, [&] { return c[0] * 2.0f; }, [&] { return c[0]; });
              pl::fori_loop(i, 4, [&](pl::Value j) { o[pl::ds(j, 1)] = pl::reshape(pl::sum(next), {1}); });
              return std::vector<pl::Value>{next, c[1] + i};
            });
        pl::Value w = pl::while_loop(
            carries[1], [](pl::Value c) { return c < 100; }, [](pl::Value c) { return c * 2; });
        pl::when(w > 3, [&] { o[pl::all] = carries[0]; });
        std::vector<pl::Value> sw = pl::switch_case(
            w, {[&] { return std::vector<pl::Value>{v}; },
                [&] { return std::vector<pl::Value>{v + 1.0f}; },
                [&] { return std::vector<pl::Value>{pl::exp(v)}; }});
        std::vector<pl::Value> scoped = pl::run_scoped(
            {{{8}, pl::f32, pl::MemorySpace::Vmem}, {{2}, pl::i32, pl::MemorySpace::Smem}},
            [&](std::vector<pl::Ref> scratch) {
              scratch[0][pl::all] = sw[0];
              scratch[1][0] = w;
              return std::vector<pl::Value>{scratch[0][pl::all] + 1.0f};
            });
        o[pl::all] = scoped[0];
        pl::debug_print("w = {} \"quoted\"\n\tand a tab \\ {}", {w, carries[1]});
        pl::debug_check(w > 0, "w must be \"positive\" {}\n");
      },
      {ref({8}, pl::f32), ref({8}, pl::f32)}, "control");
}

// Constants with exact scalars of every (non-semaphore) dtype, including the awkward ones.
ir::Kernel scalars_kernel() {
  using S = pl::Scalar;
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<S> values = {
      S::of_int(1, pl::bool_), S::of_int(0, pl::bool_),
      S::of_int(-128, pl::i8), S::of_int(127, pl::i8), S::of_int(-32768, pl::i16),
      S::of_int(std::numeric_limits<int32_t>::min(), pl::i32),
      S::of_int(std::numeric_limits<int64_t>::min(), pl::i64),
      S::of_int(std::numeric_limits<int64_t>::max(), pl::i64),
      S::of_uint(255, pl::u8), S::of_uint(65535, pl::u16), S::of_uint(4294967295u, pl::u32),
      S::of_uint(std::numeric_limits<uint64_t>::max(), pl::u64),
      S::of_float(65504.0, pl::f16), S::of_float(-0.0, pl::f16), S::of_float(std::ldexp(1.0, -24), pl::f16),
      S::of_float(nan, pl::f16), S::of_float(inf, pl::f16),
      S::of_float(static_cast<double>(pl::bfloat16::from_bits(0x7f7f)), pl::bf16),
      S::of_float(-inf, pl::bf16), S::of_float(0.1, pl::bf16).convert_to(pl::bf16),
      S::from_double(0.1, pl::bf16),
      S::of_float(-0.0, pl::f32), S::of_float(inf, pl::f32), S::of_float(-inf, pl::f32),
      S::of_float(nan, pl::f32), S::of_float(-nan, pl::f32), f32_bits(0x7fc00001),
      S::from_double(0.1, pl::f32), S::of_float(std::numeric_limits<float>::max(), pl::f32),
      S::of_float(std::numeric_limits<float>::denorm_min(), pl::f32),
      S::of_float(0.1, pl::f64), S::of_float(-0.0, pl::f64), S::of_float(nan, pl::f64),
      S::of_float(std::bit_cast<double>(uint64_t{0xfff0000000000123}), pl::f64),
      S::of_float(std::numeric_limits<double>::denorm_min(), pl::f64),
      S::of_float(1e300, pl::f64),
  };
  return pl::trace_kernel(
      [&](pl::Ref) {
        for (const S& s : values) pl::full({2}, s);
      },
      {ref({1}, pl::f32)}, "scalars");
}

// Built with ir::Builder: what tracing does not produce (an odd kernel name, scalar parameters,
// strings with control bytes, non-canonical Scalars, a region-less op after nested regions).
ir::Kernel builder_kernel() {
  ir::Builder b("my kernel \"v2\"", pl::SourceLoc("/tmp/dir with space/k\"q.cc", 7, 0));
  pl::SourceLoc loc("x.cc", 1, 2);
  ir::ValueId p = b.add_param(Type::scalar(pl::i32));
  ir::ValueId r = b.add_param(ref({4}, pl::f32, pl::MemorySpace::Hbm));
  ir::Attrs fmt;
  fmt.set(AttrKey::Format, std::string("ctl \x01\x1f\x7f bytes \xc3\xa9 {}\r"));
  b.add(OpCode::DebugPrint, {p}, fmt, loc);
  // A Scalar holding an i8 outside its range: not canonical, printed as its raw storage.
  pl::Scalar odd = pl::Scalar::of_int(300, pl::i8);
  ir::Attrs c;
  c.set(AttrKey::Value, odd).set(AttrKey::ShapeAttr, ir::Ints{});
  b.add(OpCode::Constant, {}, c, pl::SourceLoc("x.cc", 3, 0));
  // An f32 Scalar holding a double that no f32 equals.
  ir::Attrs c2;
  c2.set(AttrKey::Value, pl::Scalar::of_float(0.1, pl::f32)).set(AttrKey::ShapeAttr, ir::Ints{3});
  b.add(OpCode::Constant, {}, c2, loc);
  ir::Attrs ld;
  ir::Indexer ix;
  ix.entries.push_back(ir::IndexEntry{true, 0, 1, 2, 1});
  ld.set(AttrKey::Index, ix);
  b.add(OpCode::Load, {r, p}, ld, loc);
  // Switch with a region that has no ops and yields nothing.
  b.begin_region({});
  ir::Region empty = b.end_region();
  b.add(OpCode::Switch, {p}, {}, loc, {std::move(empty)});
  return b.finish();
}

// The TPU ops: DMAs (local and remote, logical and named mesh ids), semaphores, axis indices.
ir::Kernel tpu_kernel() {
  namespace pltpu = pallas::tpu;
  return pl::trace_kernel(
      [](pl::Ref x, pl::Ref o, pl::Ref sems, pl::Ref buf, pl::Ref idx) {
        pl::Value me = pltpu::axis_index("x");
        auto local = pltpu::make_async_copy(x.at(pl::ds(0, 4, 2)), buf, sems.at(0));
        local.start();
        local.wait();
        auto remote = pltpu::make_async_remote_copy(buf, o, sems.at(0), sems.at(1),
                                                    pltpu::DeviceId::named({{"x", me + 1}}));
        remote.start();
        remote.wait();
        auto logical = pltpu::make_async_remote_copy(buf, o, sems.at(0), sems.at(1), me,
                                                     pltpu::DeviceIdType::LOGICAL);
        logical.start();
        logical.wait_send();
        logical.wait_recv();
        pl::Ref barrier = pltpu::get_barrier_semaphore();
        pltpu::semaphore_signal(barrier, 1, {.device_id = pltpu::DeviceId(std::vector<pl::Operand>{me, 0}),
                                             .core_index = 0});
        pltpu::semaphore_signal(sems.at(2), 2);
        pltpu::semaphore_wait(sems.at(2), pltpu::semaphore_read(sems.at(2)));
        // SparseCore: indirect DMAs (index ref, index vector, add) and the subcore barrier.
        pltpu::make_async_copy(x.at(idx), buf, sems.at(0)).start();
        pltpu::make_async_copy(buf, x.at(idx[pl::all]), sems.at(1), {.add = true}).start();
        pallas::tpu_sc::subcore_barrier();
      },
      {ref({8, 16}, pl::f32, pl::MemorySpace::Any), ref({4, 16}, pl::f32, pl::MemorySpace::Any),
       ref({3}, pl::DType::DmaSemaphore, pl::MemorySpace::Semaphore), ref({4, 16}, pl::f32),
       ref({4}, pl::i32)},
      "tpu");
}

// The SparseCore vector subcore ops (every sc_ op, masked and unmasked forms, a parallel loop).
ir::Kernel sparse_core_kernel() {
  namespace plsc = pallas::tpu_sc;
  return pl::trace_kernel(
      [](pl::Ref x, pl::Ref idx, pl::Ref o, pl::Ref smem) {
        pl::Value i = idx[pl::all];
        pl::Value m = i > 3;
        pl::Value g = plsc::load_gather(x, {i}, m);
        plsc::store_scatter(x, {i}, g);
        plsc::addupdate_scatter(x, {i}, g, m);
        pl::Value e = plsc::load_expanded(o, m);
        plsc::store_compressed(o, e, m);
        plsc::addupdate(o, e);
        plsc::addupdate_compressed(o, e, m);
        pl::Value old = plsc::fetch_and_add(smem.at(0), 2);
        plsc::fetch_and_add(smem.at(0), old, 0);
        pl::Value s = plsc::cumsum(g, m) + plsc::cummax(g, m) + plsc::cummin(g);
        auto [counts, last] = plsc::scan_count(s, m);
        pl::Value n = plsc::all_reduce_population_count(last) + plsc::all_reduce_ffs(m);
        std::vector<pl::Value> sorted = plsc::sort_key_val(counts, {s, n}, {.mask = m, .descending = true});
        plsc::sort_key_val(counts, s);
        pl::Value p = plsc::pack(s, s, plsc::PackFormat::INTERLEAVED);
        auto [a, b] = plsc::unpack(plsc::pack(n, n, plsc::PackFormat::COMPRESSED), plsc::PackFormat::COMPRESSED);
        o[pl::all] = plsc::dynamic_gather(sorted[1], a + b) + plsc::bitcast(plsc::unpack(p, plsc::PackFormat::INTERLEAVED).first, pl::f32);
        plsc::parallel_loop(0, 4, [&](pl::Value k) { o[k] = o[k] * 2.0f; }, {.step = 2, .unroll = 2});
      },
      {ref({64}, pl::f32), ref({16}, pl::i32), ref({16}, pl::f32), ref({2}, pl::i32, pl::MemorySpace::Smem)},
      "sparse_core");
}

// The gpu::kernel primitives (barriers, copies, wgmma, waits, registers, named regions).
ir::Kernel gpu_kernel() {
  namespace plgpu = pallas::gpu;
  return pl::trace_kernel(
      [](pl::Ref x, pl::Ref o, pl::Ref a, pl::Ref b, pl::Ref acc, pl::Ref bars) {
        plgpu::copy_gmem_to_smem(x.at(pl::ds(0, 64)), a, bars.at(0));
        plgpu::barrier_wait(bars.at(0));
        plgpu::barrier_arrive(bars.at(1));
        plgpu::set_max_registers(232, true);
        plgpu::wgmma(acc, a, b);
        plgpu::wgmma_wait(0);
        plgpu::named_region("store \"out\"", [&] { plgpu::commit_smem(); });
        plgpu::copy_smem_to_gmem(a, o);
        plgpu::wait_smem_to_gmem(1, true);
      },
      {ref({128, 16}, pl::bf16, pl::MemorySpace::Gmem), ref({64, 16}, pl::bf16, pl::MemorySpace::Gmem),
       ref({64, 16}, pl::bf16, pl::MemorySpace::GpuShared), ref({16, 32}, pl::bf16, pl::MemorySpace::GpuShared),
       ref({64, 32}, pl::f32, pl::MemorySpace::GpuAcc), ref({2}, pl::DType::GpuBarrier, pl::MemorySpace::GpuShared)},
      "gpu");
}

// pl::get_global adds kernel parameters while the body is traced: after ops, inside a loop body.
ir::Kernel get_global_kernel() {
  namespace plgpu = pallas::gpu;
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref out) {
        pl::Ref first = pl::get_global(plgpu::Semaphore{});
        plgpu::semaphore_signal(first);
        pl::fori_loop(0, 2, [&](pl::Value k) {
          pl::Ref second = pl::get_global(plgpu::Semaphore{.shape = {2}});
          plgpu::semaphore_signal(second.at(k));
          out[k] = plgpu::semaphore_read(first);
        });
      },
      {pl::ShapeDtype({2}, pl::i32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"i"}}, {.interpret = true});
  return call.trace({})->kernel;
}

// gpu::cluster_ref in a kernel with a cluster axis; async_prefetch.
ir::Kernel cluster_ref_kernel() {
  namespace plgpu = pallas::gpu;
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref out, pl::Ref buf) {
        const pl::Value c = plgpu::axis_index("c");
        out[pl::ds(c * 8, 8)] = plgpu::cluster_ref(buf, "c", 1 - c)[pl::all];
        plgpu::async_prefetch(out, {"c"});
        plgpu::copy_smem_to_gmem(buf, out.at(pl::ds(c * 8, 8)), {.reduction_op = "add", .commit_group = false});
        plgpu::commit_smem_to_gmem_group();
      },
      {pl::ShapeDtype({16}, pl::f32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"g"}, .cluster = {2}, .cluster_names = {"c"}},
      {.scratch_shapes = {plgpu::SMEM({8}, pl::f32)}, .interpret = true});
  return call.trace({})->kernel;
}

// run_scoped with barriers (their arrivals) shared by a gpu::kernel's threads (its axis).
ir::Kernel scoped_gpu_kernel() {
  namespace plgpu = pallas::gpu;
  pl::PallasCall call = plgpu::kernel(
      [](pl::Ref x, pl::Ref out) {
        pl::run_scoped(
            {plgpu::SMEM({64}, pl::f32), plgpu::Barrier{.num_arrivals = 2, .num_barriers = 3}},
            [&](std::vector<pl::Ref> s) {
              plgpu::copy_gmem_to_smem(x, s[0], s[1].at(2));
              plgpu::barrier_wait(s[1].at(2));
              out[pl::all] = s[0][pl::all];
              return std::vector<pl::Value>{};
            },
            {.collective_axes = {"wg"}});
      },
      {pl::ShapeDtype({64}, pl::f32)}, plgpu::Mesh{.grid = {1}, .grid_names = {"i"}, .num_threads = 2, .thread_name = "wg"},
      {.interpret = true});
  return call.trace({pl::ShapeDtype({64}, pl::f32)})->kernel;
}

std::vector<std::pair<std::string, ir::Kernel>> all_kernels() {
  std::vector<std::pair<std::string, ir::Kernel>> out;
  out.emplace_back("tpu", tpu_kernel());
  out.emplace_back("scoped_gpu", scoped_gpu_kernel());
  out.emplace_back("add_one", add_one_kernel());
  out.emplace_back("elementwise", elementwise_kernel());
  out.emplace_back("shapes", shapes_kernel());
  out.emplace_back("reductions", reductions_kernel());
  out.emplace_back("refs", refs_kernel());
  out.emplace_back("control", control_kernel());
  out.emplace_back("scalars", scalars_kernel());
  out.emplace_back("builder", builder_kernel());
  out.emplace_back("sparse_core", sparse_core_kernel());
  out.emplace_back("gpu", gpu_kernel());
  out.emplace_back("get_global", get_global_kernel());
  out.emplace_back("cluster_ref", cluster_ref_kernel());
  return out;
}

// ---- Checks -----------------------------------------------------------------------------------

// Structural equality up to value renumbering (ids are allocated in a different order by the
// parser): codes, attributes (Scalars bit for bit), types, locations, region shapes.
class SameKernel {
 public:
  SameKernel(const ir::Kernel& a, const ir::Kernel& b, bool locs) : a_(a), b_(b), locs_(locs) {}
  void check() {
    EXPECT_EQ(a_.name, b_.name);
    if (locs_) {
      EXPECT_EQ(a_.loc, b_.loc);
    }
    region(a_.body, b_.body);
  }

 private:
  void value(ir::ValueId x, ir::ValueId y) {
    auto [it, fresh] = map_.emplace(x, y);
    EXPECT_EQ(it->second, y) << "value %" << x << " maps to two parsed values";
    if (fresh) {
      EXPECT_EQ(a_.type(x), b_.type(y));
    }
  }
  void region(const ir::Region& x, const ir::Region& y) {
    ASSERT_EQ(x.args.size(), y.args.size());
    for (size_t i = 0; i < x.args.size(); ++i) value(x.args[i], y.args[i]);
    ASSERT_EQ(x.ops.size(), y.ops.size());
    for (size_t i = 0; i < x.ops.size(); ++i) op(x.ops[i], y.ops[i]);
  }
  void op(const ir::Op& x, const ir::Op& y) {
    ASSERT_EQ(x.code, y.code);
    EXPECT_TRUE(x.attrs == y.attrs) << x.info().name;
    if (locs_) {
      EXPECT_EQ(x.loc, y.loc) << x.info().name;
    } else {
      EXPECT_FALSE(y.loc.known());
    }
    ASSERT_EQ(x.operands.size(), y.operands.size());
    for (size_t i = 0; i < x.operands.size(); ++i) value(x.operands[i], y.operands[i]);
    ASSERT_EQ(x.results.size(), y.results.size());
    for (size_t i = 0; i < x.results.size(); ++i) value(x.results[i], y.results[i]);
    ASSERT_EQ(x.regions.size(), y.regions.size());
    for (size_t i = 0; i < x.regions.size(); ++i) region(x.regions[i], y.regions[i]);
  }
  const ir::Kernel& a_;
  const ir::Kernel& b_;
  bool locs_;
  std::map<ir::ValueId, ir::ValueId> map_;
};

void expect_round_trip(const std::string& name, const ir::Kernel& k) {
  for (bool locs : {false, true}) {
    SCOPED_TRACE(name + (locs ? " with locations" : ""));
    ir::PrintOptions opts{.locations = locs};
    std::string text = ir::print(k, opts);
    ir::Kernel parsed;
    try {
      parsed = ir::parse(text);
    } catch (const pl::Error& e) {
      ADD_FAILURE() << e.what() << "\n" << text;
      continue;
    }
    EXPECT_EQ(ir::print(parsed, opts), text);
    SameKernel(k, parsed, locs).check();
    if (locs) {
      EXPECT_EQ(ir::print(parsed), ir::print(k));  // the locs do not disturb the rest
    }
  }
}

void collect_codes(const ir::Region& r, std::set<OpCode>& seen) {
  for (const ir::Op& op : r.ops) {
    seen.insert(op.code);
    for (const ir::Region& inner : op.regions) collect_codes(inner, seen);
  }
}

std::string parse_error(std::string_view text) {
  try {
    ir::parse(text);
  } catch (const pl::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

// ---- Printer ----------------------------------------------------------------------------------

TEST(Printer, GoldenAddOne) {
  EXPECT_EQ(ir::print(add_one_kernel()),
            "kernel @add_one(%0: ref<f32[8,128], vmem>, %1: ref<f32[8,128], any>) {\n"
            "  %2 = load(%0) {index = [ds(0, 8), ds(0, 128)]} : f32[8,128]\n"
            "  %3 = constant() {value = 1 : f32, shape = [8, 128]} : f32[8,128]\n"
            "  %4 = add(%2, %3) : f32[8,128]\n"
            "  store(%1, %4) {index = [ds(0, 8), ds(0, 128)]}\n"
            "}\n");
}

TEST(Printer, GoldenRegionsAndLocations) {
  ir::Builder b("loop", pl::SourceLoc("/src/k.cc", 10, 1));
  pl::SourceLoc at("/src/k.cc", 12, 5);
  ir::ValueId o = b.add_param(ref({}, pl::f32));
  ir::Attrs zero;
  zero.set(AttrKey::Value, pl::Scalar::of_int(0, pl::i32)).set(AttrKey::ShapeAttr, ir::Ints{});
  ir::ValueId lo = b.add1(OpCode::Constant, {}, zero, at);
  ir::Attrs ten;
  ten.set(AttrKey::Value, pl::Scalar::of_int(10, pl::i32)).set(AttrKey::ShapeAttr, ir::Ints{});
  ir::ValueId hi = b.add1(OpCode::Constant, {}, ten, at);
  std::vector<ir::ValueId> args = b.begin_region({Type::scalar(pl::i32), Type::scalar(pl::i32)});
  ir::ValueId sum = b.add1(OpCode::Add, {args[0], args[1]}, {}, at);
  b.add(OpCode::Yield, {sum}, {}, at);
  ir::Region body = b.end_region();
  ir::ValueId total = b.add(OpCode::For, {lo, hi, lo}, {}, at, {std::move(body)}).at(0);
  ir::ValueId f = b.add1(OpCode::Convert, {total}, ir::Attrs().set(AttrKey::DTypeAttr, pl::f32), at);
  b.add(OpCode::Store, {o, f}, ir::Attrs().set(AttrKey::Index, ir::Indexer{}), at);
  ir::Kernel k = b.finish();
  EXPECT_EQ(ir::print(k),
            "kernel @loop(%0: ref<f32[], vmem>) {\n"
            "  %1 = constant() {value = 0 : i32, shape = []} : i32[]\n"
            "  %2 = constant() {value = 10 : i32, shape = []} : i32[]\n"
            "  %3 = for(%1, %2, %1) ({\n"
            "  ^(%4: i32[], %5: i32[]):\n"
            "    %6 = add(%4, %5) : i32[]\n"
            "    yield(%6)\n"
            "  }) : i32[]\n"
            "  %7 = convert(%3) {dtype = f32} : f32[]\n"
            "  store(%0, %7) {index = []}\n"
            "}\n");
  const std::string l = " loc(\"/src/k.cc\":12:5)";
  EXPECT_EQ(ir::print(k, {.locations = true}),
            "kernel @loop(%0: ref<f32[], vmem>) loc(\"/src/k.cc\":10:1) {\n"
            "  %1 = constant() {value = 0 : i32, shape = []} : i32[]" + l + "\n"
            "  %2 = constant() {value = 10 : i32, shape = []} : i32[]" + l + "\n"
            "  %3 = for(%1, %2, %1) ({\n"
            "  ^(%4: i32[], %5: i32[]):\n"
            "    %6 = add(%4, %5) : i32[]" + l + "\n"
            "    yield(%6)" + l + "\n"
            "  }) : i32[]" + l + "\n"
            "  %7 = convert(%3) {dtype = f32} : f32[]" + l + "\n"
            "  store(%0, %7) {index = []}" + l + "\n"
            "}\n");
}

TEST(Printer, ScalarsPrintExactly) {
  std::string text = ir::print(scalars_kernel());
  for (const char* want :
       {"value = true : bool", "value = -128 : i8", "value = -9223372036854775808 : i64",
        "value = 18446744073709551615 : u64", "value = 65500 : f16", "value = -0 : f16",
        "value = nan : f16", "value = inf : f16", "value = -inf : bf16", "value = -0 : f32",
        "value = nan : f32", "value = 0xffc00000 : f32", "value = 0x7fc00001 : f32",
        "value = 0.1 : f32", "value = 0.1 : f64", "value = 0xfff0000000000123 : f64"})
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  std::string odd = ir::print(builder_kernel());
  // Non-canonical Scalars fall back to their raw 64-bit storage.
  EXPECT_NE(odd.find("value = 0x000000000000012c : i8"), std::string::npos) << odd;
  EXPECT_NE(odd.find("kernel @\"my kernel \\\"v2\\\"\"(%0: i32[]"), std::string::npos) << odd;
  EXPECT_NE(odd.find("format = \"ctl \\u0001\\u001f\\u007f bytes \xc3\xa9 {}\\r\""),
            std::string::npos)
      << odd;
}

TEST(Printer, DynamicIndexersAndStrings) {
  std::string text = ir::print(refs_kernel());
  EXPECT_NE(text.find("ref_view(%0, %"), std::string::npos) << text;
  EXPECT_NE(text.find("{index = [ds($1, 2), ds(0, 16)]}"), std::string::npos) << text;
  EXPECT_NE(text.find("{index = [1, ds(0, 8, 2)]}"), std::string::npos) << text;
  EXPECT_NE(text.find("{index = [$1, ds(0, 8)], masked = 1}"), std::string::npos) << text;
  EXPECT_NE(text.find("{index = [$1], kind = \"add\"}"), std::string::npos) << text;
  EXPECT_NE(text.find("ref_transpose(%1) {permutation = [1, 0]} : ref<f32[8,4]"), std::string::npos) << text;
  EXPECT_NE(text.find("ref_reshape(%0) {shape = [2, 4, 16]} : ref<f32[2,4,16]"), std::string::npos) << text;
  EXPECT_NE(text.find("ref_bitcast(%0) {dtype = i32} : ref<i32[8,16]"), std::string::npos) << text;
  std::string control = ir::print(control_kernel());
  EXPECT_NE(control.find("{format = \"w = {} \\\"quoted\\\"\\n\\tand a tab \\\\ {}\"}"),
            std::string::npos)
      << control;
}

// ---- Round trips ------------------------------------------------------------------------------

TEST(RoundTrip, EveryTestKernel) {
  for (const auto& [name, k] : all_kernels()) expect_round_trip(name, k);
}

TEST(RoundTrip, EveryOpCodeAppearsInARoundTrippedKernel) {
  std::set<OpCode> seen;
  for (const auto& [name, k] : all_kernels()) collect_codes(k.body, seen);
  for (int c = 0; c < ir::kNumOpCodes; ++c)
    EXPECT_TRUE(seen.count(static_cast<OpCode>(c)))
        << ir::op_info(static_cast<OpCode>(c)).name << " is not covered by the round-trip kernels";
  // "loc" follows an op's types; an op of that name would make the grammar ambiguous.
  EXPECT_FALSE(ir::op_from_name("loc").has_value());
}

TEST(RoundTrip, SwitchHasThreeBranchesAndRunScopedHasScopedRefs) {
  ir::Kernel k = control_kernel();
  bool switch3 = false, scoped = false;
  for (const ir::Op& op : k.body.ops) {
    if (op.code == OpCode::Switch) switch3 = op.regions.size() == 3;
    if (op.code == OpCode::RunScoped)
      scoped = op.regions.at(0).args.size() == 2 && k.type(op.regions[0].args[0]).is_ref;
  }
  EXPECT_TRUE(switch3);
  EXPECT_TRUE(scoped);
}

TEST(RoundTrip, AScopesBarriersAndCollectiveAxisArePrinted) {
  const std::string text = ir::print(scoped_gpu_kernel());
  EXPECT_NE(text.find("run_scoped() {axes = [1], axis_names = \"wg\", arrivals = [0, 2]}"), std::string::npos) << text;
}

TEST(RoundTrip, HandWrittenTextWithCommentsAndNames) {
  const char* text = R"(// a comment
kernel @k(%x: ref<f32[4], vmem>,
          %n: i32[]) {
  %v = load(%x) {index = [ds(0, 4)]} : f32[4]   // trailing comment
  %c = constant() {shape = [4], value = 2.5 : f32} : f32[4]
  %m = mul(%v, %c) : f32[4]
  store(%x, %m) {index = [ds(0, 4)]}
}
)";
  ir::Kernel k = ir::parse(text);
  EXPECT_EQ(ir::print(k),
            "kernel @k(%0: ref<f32[4], vmem>, %1: i32[]) {\n"
            "  %2 = load(%0) {index = [ds(0, 4)]} : f32[4]\n"
            "  %3 = constant() {value = 2.5 : f32, shape = [4]} : f32[4]\n"
            "  %4 = mul(%2, %3) : f32[4]\n"
            "  store(%0, %4) {index = [ds(0, 4)]}\n"
            "}\n");
  EXPECT_EQ(ir::parse(ir::print(k)).values.size(), k.values.size());
}

TEST(RoundTrip, ParsedLocationsAreRestored) {
  ir::Kernel k = ir::parse(ir::print(control_kernel(), {.locations = true}));
  EXPECT_NE(k.loc.file.find("ir_print_parse_test.cpp"), std::string::npos);
  EXPECT_GT(k.loc.line, 0);
  ASSERT_FALSE(k.body.ops.empty());
  EXPECT_NE(k.body.ops[0].loc.file.find("ir_print_parse_test.cpp"), std::string::npos);
  ir::Kernel bare = ir::parse(ir::print(control_kernel()));
  EXPECT_FALSE(bare.loc.known());
  EXPECT_FALSE(bare.body.ops[0].loc.known());
}

// ---- Parse errors -----------------------------------------------------------------------------

TEST(Parser, ErrorsNameLineColumnAndWhatWasExpected) {
  struct Case {
    std::string text;
    std::string message;
  };
  const std::string head = "kernel @k(%0: ref<f32[4], vmem>) {\n";
  const std::string load = "  %1 = load(%0) {index = [ds(0, 4)]} : f32[4]\n";
  std::vector<Case> cases = {
      {"", "parse error at 1:1: expected 'kernel', got end of input"},
      {"kernal @k() {}", "parse error at 1:1: expected 'kernel', got 'kernal'"},
      {head + "  %1 = load(%0 {index = [ds(0, 4)]} : f32[4]\n}",
       "parse error at 2:16: expected ')' after operands, got '{'"},
      {head + "  %1 = lode(%0) : f32[4]\n}", "parse error at 2:8: unknown op 'lode'"},
      {head + "  %1 = load(%0) {indx = [ds(0, 4)]} : f32[4]\n}",
       "parse error at 2:18: unknown attribute 'indx'"},
      {head + "  %1 = load(%7) {index = [ds(0, 4)]} : f32[4]\n}",
       "parse error at 2:13: %7 is not defined"},
      {head + load + "  %1 = neg(%1) : f32[4]\n}", "parse error at 3:3: redefinition of %1"},
      {head + "  %1 = load(%0) {index = [ds(0, 4)]} : f33[4]\n}",
       "parse error at 2:40: unknown dtype 'f33'"},
      {"kernel @k(%0: ref<f32[4], vram>) {\n}", "parse error at 1:27: unknown memory space 'vram'"},
      {head + load + "  %2 = neg(%1) : f32[5]\n}",
       "parse error at 3:3: neg: result 0 is written as f32[5] but the op's rule gives f32[4]"},
      {head + load + "  %2 = add(%1) : f32[4]\n}",
       "parse error at 3:3: add: expected 2 operands, got 1"},
      {head + load + "  %2 = neg(%1)\n}", "parse error at 4:1: expected ':' and the result types, got '}'"},
      {head + load + "  neg(%1) : f32[4]\n}",
       "parse error at 3:11: result types given for an op without results"},
      {head + load + "  %2 = constant() {shape = [4], value = 1.5 : i32} : i32[4]\n}",
       "parse error at 3:41: Scalar::parse: '1.5' is not a valid i32 literal"},
      {head + load + "  %2 = constant() {shape = [4], value = 300 : i8} : i8[4]\n}",
       "parse error at 3:41: Scalar::parse: '300' is not a valid i8 literal (out of range"},
      {head + load + "  %2 = constant() {shape = [4], value = 0x7fc : f32} : f32[4]\n}",
       "parse error at 3:41: a hex scalar of dtype f32 needs 8 (or 16) hex digits"},
      {head + load + "  %2 = iota() {axis = [0], dtype = i32, shape = [4]} : i32[4]\n}",
       "parse error at 3:23: expected an integer for 'axis', got '['"},
      {head + load + "  %2 = iota() {axis = 0, axis = 0} : i32[4]\n}",
       "parse error at 3:26: attribute 'axis' is given twice"},
      {head + "  debug_print() {format = \"abc}\n}", "parse error at 2:32: newline inside a string"},
      {head + "  debug_print() {format = \"a\\qb\"}\n}", "parse error at 2:29: unknown escape '\\q'"},
      {head + "  yield()\n}", "parse error at 2:3: the kernel body cannot yield"},
      {head + "  %1 = for(%2) ({\n  ^(%2: i32[]):\n  }) : i32[]\n}",
       "parse error at 2:12: %2 is not defined"},
      {head + load + "  %p = constant() {value = true : bool, shape = []} : bool[]\n"
                     "  %2 = cond(%p) ({\n  ^():\n    %3 = neg(%1) : f32[4]\n    yield(%3)\n"
                     "  }, {\n  ^():\n    yield(%1)\n  }) : f32[4]\n  %4 = neg(%3) : f32[4]\n}",
       "parse error at 12:12: %3 is not visible here (it is defined in a region that has ended)"},
      {head + load + "  %2 = run_scoped() ({\n  ^():\n    yield(%1)\n    yield(%1)\n  }) : f32[4]\n}",
       "parse error at 6:5: yield must be the last op of its region"},
      {head + load + "  %2 = run_scoped() ({\n  ^():\n    yield(%2)\n  }) : f32[4]\n}",
       "parse error at 5:11: %2 is used before it is defined"},
      {head + "  %1 = load(%0) {index = [$-1]} : f32[]\n}",
       "parse error at 2:27: an operand number cannot be negative"},
      {head + load + "}\nextra", "parse error at 4:1: expected end of input after the kernel, got 'extra'"},
      {head + "  %1 = load(%0) {index = [ds(0, 4)]} : f32[4] loc(\"a.cc\":x:1)\n}",
       "parse error at 2:58: expected a line number, got 'x'"},
      {head + "  %1 = load(%0) {index = [ds(0, 4)]} : f32[99999999999999999999]\n}",
       "parse error at 2:44: a dimension size is out of range"},
  };
  for (const Case& c : cases) {
    std::string got = parse_error(c.text);
    EXPECT_EQ(got.substr(0, c.message.size()), c.message) << "text:\n" << c.text;
  }
}

TEST(Parser, TypeRuleErrorsAreReportedAtTheOp) {
  std::string text =
      "kernel @k(%0: ref<f32[4], vmem>) {\n"
      "  %1 = load(%0) {index = [ds(0, 4)]} : f32[4]\n"
      "  %2 = iota() {axis = 0, dtype = i32, shape = [4]} : i32[4]\n"
      "  %3 = add(%1, %2) : f32[4]\n"
      "}\n";
  std::string got = parse_error(text);
  EXPECT_EQ(got.rfind("parse error at 4:3: add: operand types differ", 0), 0u) << got;
}

TEST(Parser, AcceptsTheWholeDtypeAndMemorySpaceTables) {
  for (int d = 0; d < pl::kNumDTypes; ++d) {
    pl::DType t = static_cast<pl::DType>(d);
    for (pl::MemorySpace m : {pl::MemorySpace::Any, pl::MemorySpace::Smem, pl::MemorySpace::Semaphore,
                              pl::MemorySpace::GpuShared, pl::MemorySpace::Host}) {
      ir::Builder b("k", {});
      b.add_param(ref({2, 3}, t, m));
      ir::Kernel k = b.finish();
      std::string text = ir::print(k);
      EXPECT_EQ(ir::print(ir::parse(text)), text);
    }
  }
}

// Random truncations, byte flips, insertions and deletions of valid text: parse either returns
// a kernel or throws pallas::Error; it never crashes, hangs or throws anything else.
TEST(Parser, FuzzedTextParsesOrThrowsPallasError) {
  std::vector<std::string> seeds;
  for (const auto& [name, k] : all_kernels()) {
    seeds.push_back(ir::print(k));
    seeds.push_back(ir::print(k, {.locations = true}));
  }
  const std::string alphabet = "%$@^(){}[]<>,:=\"\\ \n0123456789-+.xabcdefinrs_";
  const char* seed_env = std::getenv("PALLAS_FUZZ_SEED");
  std::mt19937 rng(seed_env ? static_cast<unsigned>(std::atoi(seed_env)) : 12345u);
  int parsed = 0, errors = 0;
  // PALLAS_FUZZ_ITERS / PALLAS_FUZZ_SEED run a longer campaign by hand (e.g. under the
  // address sanitizer).
  const char* env = std::getenv("PALLAS_FUZZ_ITERS");
  const int iters = env ? std::atoi(env) : 2000;
  for (int iter = 0; iter < iters; ++iter) {
    std::string text = seeds[rng() % seeds.size()];
    int mutations = 1 + static_cast<int>(rng() % 3);
    for (int m = 0; m < mutations && !text.empty(); ++m) {
      size_t at = rng() % text.size();
      switch (rng() % 6) {
        case 0: text.resize(at); break;
        case 5: {  // an extreme number where a digit was: shapes, axes, indices, counts
          // Numbers near INT64_MAX are left out for now: the slice bound arithmetic in
          // type_rules.cpp (check_indexer, the slice rule) overflows on them (UBSan).
          static const char* kExtremes[] = {"-1", "0", "65536", "2147483648", "-2147483649"};
          size_t digit = text.find_first_of("0123456789", at);
          if (digit == std::string::npos) break;
          size_t end = text.find_first_not_of("0123456789", digit);
          text.replace(digit, (end == std::string::npos ? text.size() : end) - digit,
                       kExtremes[rng() % std::size(kExtremes)]);
          break;
        }
        case 1: text[at] = static_cast<char>(rng() % 256); break;
        case 2: text[at] = alphabet[rng() % alphabet.size()]; break;
        case 3: text.insert(at, 1, alphabet[rng() % alphabet.size()]); break;
        case 4: text.erase(at, 1 + rng() % 8); break;
      }
    }
    try {
      ir::parse(text);
      ++parsed;
    } catch (const pl::Error&) {
      ++errors;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "non-pallas exception: " << e.what() << "\ntext:\n" << text;
    }
  }
  // Most mutations break the text; some (in a string, a number) leave it valid.
  EXPECT_GT(errors, iters / 2);
  EXPECT_GT(parsed, 0);
}

TEST(Parser, DeepNestingIsAnErrorNotACrash) {
  std::string text = "kernel @k() {\n";
  for (int i = 0; i < 100000; ++i) text += "run_scoped() ({ ^(): ";
  std::string got = parse_error(text);
  EXPECT_NE(got.find("nested too deeply"), std::string::npos) << got.substr(0, 200);
}
