// The on-device profiler (gpu::named_region, gpu::CompilerParams::profile_space / profile_dir):
// the trace a profiled call writes is read back with a small JSON parser of the test's own and
// checked for what the kernel did — one process per CTA, one thread per Pallas thread, every
// region once per thread and point, nested regions inside their parents, sequential steps in
// order — next to the kernel's values (plain C++). Runs under gpu_emulate (the generated CUDA on
// the CPU) and, where there is a GPU, on it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/call.h"
#include "gpu/codegen.h"
#include "gpu/cuda_libs.h"
#include "pallas/gpu.h"
#include "pallas/pallas.h"
#include "pallas/tpu.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

namespace pl = pallas;
namespace plgpu = pallas::gpu;
namespace fs = std::filesystem;
using test_util::error_of;

namespace {

// ---- A minimal JSON reader (objects, arrays, strings, numbers, literals) ----------------------
struct Json {
  enum class Kind { Null, Bool, Number, String, Array, Object } kind = Kind::Null;
  double number = 0;
  bool boolean = false;
  std::string string;
  std::vector<Json> array;
  std::vector<std::pair<std::string, Json>> object;
  bool has(const std::string& key) const {
    return std::any_of(object.begin(), object.end(), [&](const auto& kv) { return kv.first == key; });
  }
  const Json& operator[](const std::string& key) const {
    for (const auto& [k, v] : object)
      if (k == key) return v;
    throw std::runtime_error("JSON: no key " + key);
  }
};

class JsonReader {
 public:
  explicit JsonReader(const std::string& s) : s_(s) {}
  Json document() {
    Json v = value();
    space();
    if (i_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw std::runtime_error("JSON: " + why + " at offset " + std::to_string(i_));
  }
  void space() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  void expect(char c) {
    space();
    if (i_ >= s_.size() || s_[i_] != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  std::string string_literal() {
    expect('"');
    std::string out;
    while (true) {
      if (i_ >= s_.size()) fail("unterminated string");
      char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) fail("unterminated escape");
      c = s_[i_++];
      switch (c) {
        case '"': case '\\': case '/': out += c; break;
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {
          if (i_ + 4 > s_.size()) fail("short \\u escape");
          const long code = std::stol(s_.substr(i_, 4), nullptr, 16);
          if (code >= 0x80) fail("non-ASCII \\u escape (not used by the traces)");
          out += static_cast<char>(code);
          i_ += 4;
          break;
        }
        default: fail("bad escape");
      }
    }
  }
  Json value() {
    space();
    if (i_ >= s_.size()) fail("unexpected end");
    Json v;
    const char c = s_[i_];
    if (c == '{') {
      v.kind = Json::Kind::Object;
      ++i_;
      space();
      if (s_[i_] == '}') return ++i_, v;
      while (true) {
        std::string key = string_literal();
        expect(':');
        v.object.emplace_back(std::move(key), value());
        space();
        if (s_[i_] == '}') return ++i_, v;
        expect(',');
      }
    }
    if (c == '[') {
      v.kind = Json::Kind::Array;
      ++i_;
      space();
      if (s_[i_] == ']') return ++i_, v;
      while (true) {
        v.array.push_back(value());
        space();
        if (s_[i_] == ']') return ++i_, v;
        expect(',');
      }
    }
    if (c == '"') {
      v.kind = Json::Kind::String;
      v.string = string_literal();
      return v;
    }
    for (const char* lit : {"true", "false", "null"})
      if (s_.compare(i_, std::strlen(lit), lit) == 0) {
        i_ += std::strlen(lit);
        v.kind = lit[0] == 'n' ? Json::Kind::Null : Json::Kind::Bool;
        v.boolean = lit[0] == 't';
        return v;
      }
    size_t end = i_;
    while (end < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[end])) || std::strchr("+-.eE", s_[end]))) ++end;
    if (end == i_) fail("unexpected character");
    v.kind = Json::Kind::Number;
    v.number = std::stod(s_.substr(i_, end - i_));
    i_ = end;
    return v;
  }
  const std::string& s_;
  size_t i_ = 0;
};

// ---- The trace, read back ------------------------------------------------------------------------
struct Region {
  std::string name;
  double ts = 0, dur = 0;  // microseconds
  double end() const { return ts + dur; }
};
struct Trace {
  Json doc;
  std::string file;
  std::map<int, std::string> process_names;
  std::map<std::pair<int, int>, std::string> thread_names;
  std::map<std::pair<int, int>, std::vector<Region>> regions;  // (pid, tid) -> regions, in file order
};

// A fresh directory for one test's traces, removed afterwards.
struct TempDir : test_util::TempDir {
  fs::path dir;
  TempDir() : test_util::TempDir("pallas-profile-"), dir(path()) {}
  std::vector<fs::path> traces() const {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().string().ends_with("-trace.json")) out.push_back(e.path());
    std::sort(out.begin(), out.end());
    return out;
  }
};

Trace read_trace(const fs::path& file) {
  std::ifstream f(file);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  Trace t;
  t.file = file.filename().string();
  t.doc = JsonReader(text).document();
  for (const Json& e : t.doc["traceEvents"].array) {
    const std::string& ph = e["ph"].string;
    const int pid = static_cast<int>(e["pid"].number);
    if (ph == "M" && e["name"].string == "process_name") t.process_names[pid] = e["args"]["name"].string;
    if (ph == "M" && e["name"].string == "thread_name")
      t.thread_names[{pid, static_cast<int>(e["tid"].number)}] = e["args"]["name"].string;
    if (ph == "X")
      t.regions[{pid, static_cast<int>(e["tid"].number)}].push_back(
          {e["name"].string, e["ts"].number, e["dur"].number});
  }
  return t;
}

const Region& find_region(const std::vector<Region>& rs, const std::string& name) {
  for (const Region& r : rs)
    if (r.name == name) return r;
  throw std::runtime_error("no region " + name);
}

constexpr double kEps = 1e-6;  // microseconds: the trace's numbers are whole nanoseconds

pl::CallOptions profiled(const std::string& backend, std::vector<pl::ScratchShape> scratch, int space,
                         const fs::path& dir) {
  pl::CallOptions o;
  o.scratch_shapes = std::move(scratch);
  o.backend = backend;
  o.name = "scaled";
  o.compiler_params = plgpu::CompilerParams{.profile_space = space, .profile_dir = dir.string()};
  return o;
}

// 3 CTAs of 2 warpgroups; each warpgroup moves its own 64 elements through shared memory, in a
// region "all" holding "load" and "compute".
pl::PallasCall two_warpgroup_kernel(pl::CallOptions opts) {
  return plgpu::kernel(
      [](pl::Ref x, pl::Ref out, pl::Ref buf, pl::Ref bars) {
        pl::Value b = plgpu::axis_index("b"), t = plgpu::axis_index("t");
        plgpu::named_region("all", [&] {
          plgpu::named_region("load", [&] {
            plgpu::copy_gmem_to_smem(x.at(pl::ds(b * 128 + t * 64, 64)), buf.at(t), bars.at(t));
            plgpu::barrier_wait(bars.at(t));
          });
          plgpu::named_region("compute", [&] { buf.at(t)[pl::all] = buf.at(t)[pl::all] * 3.0f + 1.0f; });
          plgpu::commit_smem();
          plgpu::copy_smem_to_gmem(buf.at(t), out.at(pl::ds(b * 128 + t * 64, 64)));
          plgpu::wait_smem_to_gmem(0);
        });
      },
      {pl::ShapeDtype({384}, pl::f32)},
      plgpu::Mesh{.grid = {3}, .grid_names = {"b"}, .num_threads = 2, .thread_name = "t"}, std::move(opts));
}

std::vector<pl::ScratchShape> two_warpgroup_scratch() {
  return {plgpu::SMEM({2, 64}, pl::f32), plgpu::Barrier{.num_arrivals = 1, .num_barriers = 2}};
}

pl::Array iota_f32(int64_t n) {
  pl::Array a = pl::Array::zeros({n}, pl::f32);
  for (int64_t i = 0; i < n; ++i) a.data<float>()[i] = static_cast<float>(i % 97) - 40.0f;
  return a;
}

class GpuProfiler : public test_util::OnGpuBackends {};
INSTANTIATE_TEST_SUITE_P(Backends, GpuProfiler, testing::Values("gpu_emulate", "mosaic_gpu"),
                         test_util::backend_name);

TEST_P(GpuProfiler, EveryWarpgroupOfEveryCtaRecordsItsNestedRegions) {
  TempDir dir;
  pl::PallasCall call = two_warpgroup_kernel(profiled(GetParam(), two_warpgroup_scratch(), 8, dir.dir));
  pl::Array x = iota_f32(384);
  pl::Array out = call(x).at(0);
  for (int64_t i = 0; i < 384; ++i) ASSERT_EQ(out.data<float>()[i], 3.0f * x.data<float>()[i] + 1.0f) << i;

  std::vector<fs::path> files = dir.traces();
  ASSERT_EQ(files.size(), 1u);
  Trace t = read_trace(files[0]);
  EXPECT_TRUE(t.file.starts_with("scaled-")) << t.file;
  EXPECT_EQ(t.doc["otherData"]["kernel"].string, "scaled");
  EXPECT_EQ(t.doc["otherData"]["profile_space"].number, 8);
  EXPECT_EQ(t.doc["otherData"]["dropped_events"].number, 0);
  ASSERT_EQ(t.process_names.size(), 3u);
  for (int b = 0; b < 3; ++b) EXPECT_EQ(t.process_names[b], "CTA b=" + std::to_string(b));
  ASSERT_EQ(t.regions.size(), 6u);  // 3 CTAs x 2 warpgroups
  double earliest = 1e300;
  for (int b = 0; b < 3; ++b)
    for (int w = 0; w < 2; ++w) {
      EXPECT_EQ((t.thread_names[{b, w}]), "Pallas thread " + std::to_string(w) + " (warpgroup)");
      const std::vector<Region>& rs = t.regions[{b, w}];
      ASSERT_EQ(rs.size(), 3u) << b << "," << w;
      const Region &all = find_region(rs, "all"), &load = find_region(rs, "load"), &compute = find_region(rs, "compute");
      for (const Region* r : {&all, &load, &compute}) EXPECT_GE(r->dur, 0) << r->name;
      // Nested in "all", "load" before "compute".
      EXPECT_LE(all.ts, load.ts + kEps);
      EXPECT_LE(load.end(), compute.ts + kEps);
      EXPECT_LE(compute.end(), all.end() + kEps);
      earliest = std::min(earliest, all.ts);
    }
  EXPECT_EQ(earliest, 0.0);  // times count from the call's first event
}

// A pallas_call's CTA is one Pallas thread; a sequential axis records one region per step, in
// order, into its point's slot.
TEST_P(GpuProfiler, PallasCallRecordsEverySequentialStepInOrder) {
  TempDir dir;
  pl::CallOptions o;
  o.grid = {2, 3};
  o.in_specs = {pl::BlockSpec({1, 128}, [](pl::Value i, pl::Value j) { return pl::Indices{i, j}; })};
  o.out_specs = {pl::BlockSpec({1, 128}, [](pl::Value i, pl::Value) { return pl::Indices{i, 0}; })};
  o.backend = GetParam();
  o.name = "row sums";
  o.compiler_params = plgpu::CompilerParams{
      .dimension_semantics = {"parallel", "arbitrary"}, .profile_space = 6, .profile_dir = dir.dir.string()};
  pl::PallasCall call = pl::pallas_call(
      [](pl::Ref x, pl::Ref o) {
        plgpu::named_region("step", [&] {
          pl::when(pl::program_id(1) == 0, [&] { o[pl::all] = pl::zeros({1, 128}, pl::f32); });
          o[pl::all] = o[pl::all] + x[pl::all];
        });
      },
      pl::ShapeDtype({2, 128}, pl::f32), o);
  pl::Array x = pl::Array::zeros({2, 384}, pl::f32);
  for (int64_t i = 0; i < x.size(); ++i) x.data<float>()[i] = static_cast<float>(i % 13);
  pl::Array out = call(x).at(0);
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 128; ++c) {
      float want = 0;
      for (int j = 0; j < 3; ++j) want += x.data<float>()[r * 384 + j * 128 + c];
      ASSERT_EQ(out.data<float>()[r * 128 + c], want) << r << "," << c;
    }
  std::vector<fs::path> files = dir.traces();
  ASSERT_EQ(files.size(), 1u);
  Trace t = read_trace(files[0]);
  EXPECT_TRUE(t.file.starts_with("row_sums-")) << t.file;  // the name, made a file name
  ASSERT_EQ(t.regions.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(t.process_names[i], "CTA " + std::to_string(i));
    EXPECT_EQ((t.thread_names[{i, 0}]), "CTA");
    const std::vector<Region>& rs = t.regions[{i, 0}];
    ASSERT_EQ(rs.size(), 3u);
    for (size_t s = 0; s < 3; ++s) {
      EXPECT_EQ(rs[s].name, "step");
      if (s > 0) {
        EXPECT_LE(rs[s - 1].end(), rs[s].ts + kEps) << "steps overlap at " << s;
      }
    }
  }
}

TEST_P(GpuProfiler, EventsBeyondProfileSpaceAreLeftOutAndReported) {
  TempDir dir;
  // 6 events per warpgroup (3 regions), room for 3: all's entry, load's entry and load's exit.
  // Only "load" completes; "all" stays open and is left out.
  pl::PallasCall call = two_warpgroup_kernel(profiled(GetParam(), two_warpgroup_scratch(), 3, dir.dir));
  pl::Array x = iota_f32(384);
  testing::internal::CaptureStderr();
  pl::Array out = call(x).at(0);
  const std::string err = testing::internal::GetCapturedStderr();
  for (int64_t i = 0; i < 384; ++i) ASSERT_EQ(out.data<float>()[i], 3.0f * x.data<float>()[i] + 1.0f) << i;
  EXPECT_CONTAINS(err, "left out 18 region events");  // 3 of 6 per warpgroup, 6 warpgroups
  EXPECT_CONTAINS(err, "profile_space is 3 (raise it to 6)");
  std::vector<fs::path> files = dir.traces();
  ASSERT_EQ(files.size(), 1u);
  Trace t = read_trace(files[0]);
  EXPECT_EQ(t.doc["otherData"]["dropped_events"].number, 18);
  ASSERT_EQ(t.regions.size(), 6u);
  for (const auto& [who, rs] : t.regions) {
    ASSERT_EQ(rs.size(), 1u);
    EXPECT_EQ(rs[0].name, "load");
  }
}

// Every call writes a trace of its own; none is overwritten.
TEST(GpuProfilerEmulated, EachCallWritesItsOwnTrace) {
  TempDir dir;
  pl::PallasCall call = two_warpgroup_kernel(profiled("gpu_emulate", two_warpgroup_scratch(), 8, dir.dir));
  pl::Array x = iota_f32(384);
  for (int i = 0; i < 3; ++i) call(x);
  EXPECT_EQ(dir.traces().size(), 3u);
}

TEST(GpuProfilerEmulated, ParametersAreCheckedBeforeTheKernelRuns) {
  TempDir dir;
  pl::Array x = iota_f32(384);
  auto run = [&](int space, const std::string& where) {
    pl::CallOptions o = profiled("gpu_emulate", two_warpgroup_scratch(), space, where);
    two_warpgroup_kernel(o)(x);
  };
  EXPECT_CONTAINS(error_of([&] { run(4, ""); }),
                  "profile_space is set but profile_dir is empty: name the directory the trace goes to");
  EXPECT_CONTAINS(error_of([&] { run(0, dir.dir.string()); }), "profile_dir is set but profile_space is 0");
  EXPECT_CONTAINS(error_of([&] { run(-1, dir.dir.string()); }), "profile_space must be >= 0");
  const fs::path file = dir.dir / "a-file";
  std::ofstream(file) << "x";
  EXPECT_CONTAINS(error_of([&] { run(4, file.string()); }), "cannot create the directory for the profile trace");
  EXPECT_CONTAINS(error_of([&] { plgpu::named_region("", [] {}); }), "named_region: the region needs a name");
  EXPECT_EQ(dir.traces().size(), 0u);
  // A missing directory is created.
  run(4, (dir.dir / "new" / "sub").string());
  EXPECT_EQ(fs::directory_iterator(dir.dir / "new" / "sub") == fs::directory_iterator(), false);
}

// Named regions are annotations: the interpreter runs their bodies and records nothing; without
// profile_space the GPU code has no trace of them.
TEST(GpuProfilerEmulated, RegionsChangeNothingElse) {
  TempDir dir;
  pl::CallOptions o = profiled("gpu_emulate", two_warpgroup_scratch(), 8, dir.dir);
  o.backend.reset();
  o.interpret = true;
  pl::Array x = iota_f32(384);
  pl::Array out = two_warpgroup_kernel(o)(x).at(0);
  for (int64_t i = 0; i < 384; ++i) ASSERT_EQ(out.data<float>()[i], 3.0f * x.data<float>()[i] + 1.0f) << i;
  EXPECT_EQ(dir.traces().size(), 0u);

  pl::CallOptions off;
  off.scratch_shapes = two_warpgroup_scratch();
  off.backend = "mosaic_gpu";
  pl::PallasCall call = two_warpgroup_kernel(off);
  std::shared_ptr<const pl::TracedCall> tc = call.trace({pl::ShapeDtype({384}, pl::f32)});
  plgpu::GeneratedKernel plain = plgpu::generate_cuda(*tc, tc->grid_mapping.grid);
  EXPECT_EQ(plain.source.find("pl_prof_record(pl_prof"), std::string::npos);
  plgpu::CodegenOptions on;
  on.profile_space = 8;
  on.profile_dir = dir.dir.string();
  plgpu::GeneratedKernel profiled_k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid, on);
  EXPECT_CONTAINS(profiled_k.source, "pl_prof_record(pl_prof, 0ull);");  // "all" entered
  EXPECT_CONTAINS(profiled_k.source, "pl_prof_record(pl_prof, 5ull);");  // "compute" left
  EXPECT_EQ(profiled_k.region_names, (std::vector<std::string>{"all", "load", "compute"}));
}

// In a pallas_call on the reference interpreter and the TPU interpret mode, a region is its body.
TEST(GpuProfilerEmulated, NamedRegionsRunInEveryInterpreter) {
  for (int mode = 0; mode < 2; ++mode) {
    pl::CallOptions o;
    o.grid = {2};
    o.in_specs = {pl::BlockSpec({8}, [](pl::Value i) { return pl::Indices{i}; })};
    o.out_specs = {pl::BlockSpec({8}, [](pl::Value i) { return pl::Indices{i}; })};
    if (mode == 0)
      o.interpret = true;
    else
      o.interpret = pl::tpu::InterpretParams{.detect_races = true};
    pl::PallasCall call = pl::pallas_call(
        [](pl::Ref x, pl::Ref out) {
          plgpu::named_region("outer", [&] {
            plgpu::named_region("inner", [&] { out[pl::all] = x[pl::all] * 2.0f; });
            out[pl::all] = out[pl::all] - 1.0f;
          });
        },
        pl::ShapeDtype({16}, pl::f32), o);
    pl::Array x = iota_f32(16);
    pl::Array out = call(x).at(0);
    for (int64_t i = 0; i < 16; ++i) ASSERT_EQ(out.data<float>()[i], 2.0f * x.data<float>()[i] - 1.0f) << mode;
  }
}

// The profiled kernel is valid CUDA for the GPUs (%globaltimer, the slot arithmetic).
TEST(GpuProfilerEmulated, ProfiledKernelCompilesWithNvrtc) {
  if (std::string why = pl::gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  pl::CallOptions off;
  off.scratch_shapes = two_warpgroup_scratch();
  off.backend = "mosaic_gpu";
  pl::PallasCall call = two_warpgroup_kernel(off);
  std::shared_ptr<const pl::TracedCall> tc = call.trace({pl::ShapeDtype({384}, pl::f32)});
  plgpu::CodegenOptions on;
  on.profile_space = 8;
  on.profile_dir = "/tmp";
  plgpu::GeneratedKernel k = plgpu::generate_cuda(*tc, tc->grid_mapping.grid, on);
  EXPECT_CONTAINS(k.source, "%globaltimer");
  for (const char* arch : {"sm_90a", "sm_80"})
    EXPECT_TRUE(pl::gpu::Nvrtc::get().compile(k.source, "profiled.cu", arch).is_cubin) << arch;
}

}  // namespace
