#include "gpu/host_emulation.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string_view>

#include "gpu/codegen.h"
#include "gpu/kernel_cache.h"
#include "gpu/profiler.h"
#include "ir/analysis.h"
#include "pallas/error.h"

namespace pallas::gpu {

void evict_unused_precompiled_headers(const std::filesystem::path& dir, std::chrono::hours max_age) {
  namespace fs = std::filesystem;
  const fs::file_time_type now = fs::file_time_type::clock::now();
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    const std::string name = p.filename().string();
    const bool tmp = name.size() > 4 && name.ends_with(".tmp");
    if (!tmp && !name.ends_with(".h.gch")) continue;
    std::error_code time_ec;
    const fs::file_time_type t = fs::last_write_time(p, time_ec);
    if (time_ec || now - t < (tmp ? std::chrono::hours(1) : max_age)) continue;
    std::error_code rm_ec;
    fs::remove(p, rm_ec);
    if (!tmp) fs::remove(p.parent_path() / p.stem(), rm_ec);  // its header (NAME.h of NAME.h.gch)
  }
}

namespace {

using EntryFn = void (*)(const uint64_t*, int);
using CountFn = uint64_t (*)();

// Compiled units stay loaded for the life of the process, one per distinct source.
struct Loaded {
  void* handle = nullptr;
  EntryFn entry = nullptr;
  CountFn mma_count = nullptr, wgmma_count = nullptr, tma_count = nullptr, shuffles = nullptr, acc_flushes = nullptr;
};

std::string run_command(const std::string& cmd, int& status) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) {
    status = -1;
    return "could not start: " + cmd;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  status = pclose(p);
  return out;
}

// A directory of this user's own under the temp directory (created 0700; an existing one must be
// a real directory owned by this user and writable by no one else), or "" when there is none.
std::filesystem::path private_temp_dir(const std::filesystem::path& temp) {
  const std::filesystem::path dir = temp / ("pallas-host-emulation-" + std::to_string(::getuid()));
  ::mkdir(dir.c_str(), 0700);
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::getuid() ||
      (st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
    return {};
  return dir;
}

// " -include '<header>'" naming a precompiled copy of the standard headers the device runtime
// includes under host emulation (its `#include <...>` lines), or "" when there is none. Those
// headers are about a third of the compile of a generated unit (1.1-1.4 of 3.3-3.9 s on a 2-core
// machine; <thread>, <mutex>, <chrono> and <atomic> in C++20), and a test process compiles dozens
// of units, each in its own process of the compiler. The precompiled header is built once per
// compiler, compiler version, flags and header text (its file name is a hash of all four) and
// shared by every process of this user: written under a temporary name and renamed into place,
// so processes building it at once each leave a whole file. It is only a speed-up: when it cannot
// be built, or the compiler rejects it (it then reads the header itself), the unit compiles the
// same without it.
std::string precompiled_headers(const std::string& compiler, const std::string& flags, const std::filesystem::path& temp) {
  static std::map<std::string, std::string> built;  // (under load's lock)
  const std::string request = compiler + '\0' + flags;
  if (auto it = built.find(request); it != built.end()) return it->second;
  std::string& result = built[request];
  std::string headers;
  for (std::string_view rt = device_runtime_source(); !rt.empty();) {
    const size_t end = std::min(rt.find('\n'), rt.size());
    if (rt.substr(0, 10) == "#include <") headers += std::string(rt.substr(0, end)) + "\n";
    rt.remove_prefix(std::min(end + 1, rt.size()));
  }
  int status = 0;
  const std::string version = run_command(compiler + " --version", status);
  const std::filesystem::path dir = private_temp_dir(temp);
  if (status != 0 || dir.empty() || headers.empty()) return result;
  const std::string name = sha256_hex(compiler + '\0' + version + '\0' + flags + '\0' + headers).substr(0, 24);
  const std::filesystem::path header = dir / (name + ".h"), pch = dir / (name + ".h.gch");
  std::error_code ec;
  if (!std::filesystem::is_regular_file(pch, ec) || !std::filesystem::is_regular_file(header, ec)) {
    evict_unused_precompiled_headers(dir, std::chrono::hours(24 * 7));
    const std::string unique = "." + std::to_string(::getpid()) + ".tmp";
    const std::filesystem::path header_tmp = header.string() + unique, pch_tmp = pch.string() + unique;
    {
      std::ofstream f(header_tmp);
      f << headers;
    }
    std::filesystem::rename(header_tmp, header, ec);
    if (!ec) run_command(compiler + flags + " -x c++-header -o '" + pch_tmp.string() + "' '" + header.string() + "'", status);
    if (ec || status != 0) {
      std::filesystem::remove(header_tmp, ec);
      std::filesystem::remove(pch_tmp, ec);
      return result;
    }
    std::filesystem::rename(pch_tmp, pch, ec);
    if (ec) return result;
  } else {
    // In use: its time says so to evict_unused_precompiled_headers.
    std::filesystem::last_write_time(pch, std::filesystem::file_time_type::clock::now(), ec);
  }
  return result = " -include '" + header.string() + "'";
}

Loaded load(const GeneratedKernel& k) {
  static std::mutex mu;
  static std::map<std::string, Loaded> loaded;
  std::lock_guard<std::mutex> lock(mu);
  auto it = loaded.find(k.source);
  if (it != loaded.end()) return it->second;

  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path dir = fs::temp_directory_path(ec);
  if (ec) dir = "/tmp";
  char tmpl[] = "pallas-emu-XXXXXX";
  std::string pattern = (dir / tmpl).string();
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) throw Error("host emulation: cannot create a temporary directory under " + dir.string());
  fs::path work(buf.data());
  fs::path src = work / "kernel.cc", lib = work / "kernel.so";
  {
    std::ofstream f(src);
    f << k.source;
  }
  int status = 0;
  // The kernel's threads share the test process's sanitizer: under ThreadSanitizer a missing
  // barrier in the generated code is reported as a race; under AddressSanitizer an access past
  // an emulated buffer (shared memory, a tensor map's box) as an error.
  // Debug information (for their reports' line numbers) only there: it is a fifth of the compile.
  // -Og rather than -O1: compiling is most of a test's time, and -Og compiles faster while the
  // kernels run about as fast (three host-emulation tests: 15-18 s with -O1 -g, 10-12 s with -Og;
  // docs/PERFORMANCE.md, stop 32).
#if defined(__SANITIZE_THREAD__)
  const std::string sanitize = " -g -fsanitize=thread";
#elif defined(__SANITIZE_ADDRESS__)
  const std::string sanitize = " -g -fsanitize=address,undefined -fno-sanitize-recover=undefined";
#else
  const std::string sanitize;
#endif
  const std::string compiler = host_compiler(), flags = " -std=c++20 -Og -fPIC -pthread -w" + sanitize;
  auto compile = [&](const std::string& include) {
    return run_command(compiler + flags + include + " -shared -o '" + lib.string() + "' '" + src.string() + "'", status);
  };
  const std::string pch = precompiled_headers(compiler, flags, dir);
  std::string log = compile(pch);
  if (status != 0 && !pch.empty()) log = compile("");  // (in case the temp directory was cleaned since)
  if (status != 0) {
    throw Error("host emulation: the generated kernel does not compile as C++ (kept in " + src.string() + "):\n" + log);
  }
  void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) throw Error(std::string("host emulation: cannot load the compiled kernel: ") + dlerror());
  auto entry = reinterpret_cast<EntryFn>(dlsym(h, k.host_entry.c_str()));
  if (!entry) throw Error("host emulation: the compiled kernel has no " + k.host_entry);
  auto counter = [&](const char* name) {
    auto f = reinterpret_cast<CountFn>(dlsym(h, name));
    if (!f) throw Error(std::string("host emulation: the compiled kernel has no ") + name);
    return f;
  };
  Loaded l{h, entry, counter("pl_host_mma_instructions"), counter("pl_host_wgmma_instructions"),
           counter("pl_host_tma_boxes"), counter("pl_host_shuffles"), counter("pl_host_acc_flushes")};
  fs::remove_all(work, ec);  // the library stays mapped
  return loaded[k.source] = l;
}

}  // namespace

std::string host_compiler() {
  for (const char* var : {"PALLAS_HOST_CXX", "CXX"})
    if (const char* v = std::getenv(var); v && *v) return v;
  return "c++";
}

// The emulated tensor map the device runtime's pl_tma_load reads (its comment has the layout):
// the array's address, rank, element bytes, dims, byte strides, box. As on the GPU, only an
// address aligned to 16 bytes is encoded.
static bool emulated_tensor_map(const TensorMapSpec& spec, uint64_t address, uint64_t* map) {
  if (address % 16 != 0) return false;
  map[0] = address;
  map[1] = spec.dims.size();
  map[2] = static_cast<uint64_t>(spec.elem_bytes);
  for (size_t i = 0; i < spec.dims.size(); ++i) {
    map[3 + i] = spec.dims[i];
    if (i > 0) map[7 + i] = spec.strides[i - 1];
    map[12 + i / 2] |= static_cast<uint64_t>(spec.box[i]) << (32 * (i % 2));
  }
  map[15] = static_cast<uint64_t>(spec.swizzle_bytes);
  return true;
}

std::vector<Array> run_host_emulation(const TracedCall& call, const GeneratedKernel& k,
                                      const std::vector<Array>& args, const std::vector<int64_t>& grid,
                                      int threads, HostEmulationStats* stats, std::exception_ptr* deferred_error) {
  const GridMapping& gm = call.grid_mapping;
  const int num_index = gm.num_index_operands, num_in = gm.num_inputs, num_out = gm.num_outputs;
  if (static_cast<int>(args.size()) != num_index + num_in)
    throw InternalError("host emulation: wrong argument count");
  const Loaded kernel = load(k);

  // Operands: inputs the kernel may write (and does not alias to an output) are private copies,
  // as in the interpreters; an aliased input is the output.
  std::vector<bool> written = ir::params_written(call.kernel);
  std::map<int, int> alias_of_output;
  std::set<int> aliased_inputs;
  for (auto [i, o] : call.input_output_aliases) {
    alias_of_output[o] = i;
    aliased_inputs.insert(i);
  }
  std::vector<Array> operands;
  for (int i = 0; i < num_index + num_in; ++i) {
    const Array& a = args[static_cast<size_t>(i)];
    operands.push_back(written[static_cast<size_t>(i)] && !aliased_inputs.count(i) ? a.clone() : a);
  }
  std::vector<Array> outputs;
  for (int o = 0; o < num_out; ++o) {
    auto a = alias_of_output.find(o);
    if (a != alias_of_output.end()) {
      outputs.push_back(operands[static_cast<size_t>(a->second)]);
    } else {
      const BlockMapping& bm = gm.block_mappings[static_cast<size_t>(num_in + o)];
      outputs.push_back(Array::uninitialized(bm.array.shape, bm.array.dtype));
    }
  }
  std::vector<uint64_t> ptrs;
  for (Array& a : operands) ptrs.push_back(reinterpret_cast<uint64_t>(a.raw_data()));
  for (Array& a : outputs) ptrs.push_back(reinterpret_cast<uint64_t>(a.raw_data()));
  // The semaphores (zero), then one arena per CTA that runs at once (a cluster's, or every one
  // when co-resident), 8-byte aligned: the widest element.
  // Every group gets the same number of host threads.
  const int groups = std::max(1, k.num_groups);
  const int per_cta = (std::max(1, threads) + groups - 1) / groups * groups;
  if (k.register_tiles > 0 && per_cta != k.threads_per_cta)
    throw Error("host emulation: this kernel keeps arrays in registers laid out over its CTA's " +
                std::to_string(k.threads_per_cta) + " threads (register tiles), which it takes as host threads, not " +
                std::to_string(per_cta) + " (generate it with CodegenOptions::register_tiles = false for other counts)");
  if (k.host_ctas * per_cta > kMaxHostEmulationThreads)
    throw Error("host emulation runs " +
                    (k.co_resident() ? "all " + std::to_string(k.host_ctas) +
                                           " CTAs of a gpu::kernel with pl::get_global semaphores at once"
                                     : "the " + std::to_string(k.host_ctas) + " CTAs of a cluster at once") +
                    ", here with " + std::to_string(per_cta) + " host threads each: more than " +
                    std::to_string(kMaxHostEmulationThreads) + " threads (use a smaller " +
                    (k.co_resident() ? "grid" : "cluster") + ", or fewer threads per CTA)",
                call.kernel.loc);
  // (From a 128-byte boundary, as dynamic shared memory is: TMA copies check their addresses.)
  std::vector<uint64_t> arena_words(
      static_cast<size_t>(k.arena_offset() + (k.arena_bytes + k.acc_memory_bytes) * k.host_ctas) / 8 + 2 + 16);
  uint64_t* arena = arena_words.data() + (16 - reinterpret_cast<uintptr_t>(arena_words.data()) / 8 % 16) % 16;
  int64_t err[kErrorRecordWords] = {};
  prepare_profile_dir(k, call.kernel.loc);
  std::vector<uint64_t> profile(profile_buffer_words(k, grid));
  std::vector<uint64_t> words = pack_params(k, ptrs, reinterpret_cast<uint64_t>(arena),
                                            reinterpret_cast<uint64_t>(err),
                                            reinterpret_cast<uint64_t>(profile.empty() ? nullptr : profile.data()), grid,
                                            emulated_tensor_map);
  {
    // The unit's emulation state (thread count, barrier) is global to its library: one run at a time.
    static std::mutex run_mu;
    std::lock_guard<std::mutex> lock(run_mu);
    kernel.entry(words.data(), per_cta);
    if (stats) {
      stats->mma_instructions = static_cast<int64_t>(kernel.mma_count());
      stats->wgmma_instructions = static_cast<int64_t>(kernel.wgmma_count());
      stats->tma_boxes = static_cast<int64_t>(kernel.tma_count());
      stats->shuffles = static_cast<int64_t>(kernel.shuffles());
      stats->acc_flushes = static_cast<int64_t>(kernel.acc_flushes());
    }
  }
  if (err[0] != 0) {
    if (!deferred_error) throw_kernel_error(call, k, err);
    *deferred_error = kernel_error(call, k, err);
    return outputs;
  }
  if (!profile.empty()) write_profile_trace(call, k, grid, profile.data());
  return outputs;
}

}  // namespace pallas::gpu
