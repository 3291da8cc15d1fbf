// The compiled-kernel cache: memory and disk layers, keys, corrupt and forged entries, an
// unusable directory, concurrent requests. A fake compile function stands in for NVRTC except in
// the last test (skipped without NVRTC).
#include <gtest/gtest.h>

#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <latch>
#include <optional>
#include <thread>

#include "gpu/kernel_cache.h"
#include "pallas/error.h"
#include "tests/test_util.h"

namespace pl = pallas;
namespace gpu = pallas::gpu;
namespace fs = std::filesystem;

namespace {

struct TempDir : test_util::TempDir {
  TempDir() : test_util::TempDir("pallas_kernel_cache_") {}
};

// Counts its calls; the "image" is derived from the request so a wrong entry would show.
struct FakeCompiler {
  std::atomic<int> calls{0};
  std::function<gpu::CompiledKernel()> for_(const std::string& source, const std::string& arch) {
    return [this, source, arch] {
      ++calls;
      gpu::CompiledKernel k;
      std::string image = "\x7f" "ELF image of " + source + " for " + arch;
      k.image.assign(image.begin(), image.end());
      k.is_cubin = true;
      k.log = "fake warning for " + arch;
      return k;
    };
  }
};

const std::string kSrcA = "extern \"C\" __global__ void a(float* p) { p[0] = 1.f; }";
const std::string kSrcB = "extern \"C\" __global__ void b(float* p) { p[0] = 2.f; }";
const std::vector<std::string> kOpts = {"-lineinfo"};
const std::pair<int, int> kVersion = {13, 0};

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << bytes;
}
std::string image_of(const gpu::CompiledKernel& k) { return std::string(k.image.begin(), k.image.end()); }

TEST(KernelCache, Sha256KnownVectors) {
  // FIPS 180-2 examples.
  EXPECT_EQ(gpu::sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(gpu::sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(gpu::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(gpu::sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(KernelCache, MemoryHitNeverCompilesAgain) {
  gpu::KernelCache cache("");
  EXPECT_EQ(cache.dir(), "");
  EXPECT_NE(cache.disk_disabled_reason().find("memory only"), std::string::npos);
  FakeCompiler fc;
  auto first = cache.get_or_compile(kSrcA, "sm_80", kOpts, kVersion, fc.for_(kSrcA, "sm_80"));
  auto second = cache.get_or_compile(kSrcA, "sm_80", kOpts, kVersion, fc.for_(kSrcA, "sm_80"));
  EXPECT_EQ(fc.calls, 1);
  EXPECT_EQ(first, second);  // the same shared entry
  EXPECT_EQ(image_of(*second), "\x7f" "ELF image of " + kSrcA + " for sm_80");
  EXPECT_EQ(second->log, "fake warning for sm_80");
  gpu::KernelCacheStats s = cache.stats();
  EXPECT_EQ(s.compiles, 1);
  EXPECT_EQ(s.memory_hits, 1);
  EXPECT_EQ(s.disk_hits, 0);
  EXPECT_EQ(s.disk_writes, 0);
  EXPECT_EQ(s.disk_write_failures, 0);
}

TEST(KernelCache, DiskHitAcrossCacheObjects) {
  TempDir dir;
  FakeCompiler fc;
  std::string key = gpu::KernelCache::key(kSrcA, "sm_90a", kOpts, kVersion);
  {
    gpu::KernelCache cache(dir.path());
    EXPECT_EQ(cache.disk_disabled_reason(), "");
    cache.get_or_compile(kSrcA, "sm_90a", kOpts, kVersion, fc.for_(kSrcA, "sm_90a"));
    EXPECT_EQ(cache.stats().disk_writes, 1);
    EXPECT_EQ(cache.entry_path(key), dir.path() + "/" + key + ".bin");
  }
  // One file, named by the key, starting with the magic; no temp file left behind.
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename());
  ASSERT_EQ(names, std::vector<std::string>{key + ".bin"});
  EXPECT_EQ(read_bytes(dir.path() + "/" + key + ".bin").substr(0, 8), "PALLASK1");

  gpu::KernelCache fresh(dir.path());
  auto k = fresh.get_or_compile(kSrcA, "sm_90a", kOpts, kVersion, [&]() -> gpu::CompiledKernel {
    ADD_FAILURE() << "a warm disk cache must not compile";
    return {};
  });
  EXPECT_EQ(fc.calls, 1);
  EXPECT_TRUE(k->is_cubin);
  EXPECT_EQ(image_of(*k), "\x7f" "ELF image of " + kSrcA + " for sm_90a");
  EXPECT_EQ(k->log, "fake warning for sm_90a");
  EXPECT_EQ(fresh.stats().disk_hits, 1);
  EXPECT_EQ(fresh.stats().compiles, 0);
  // And now it is in memory too.
  fresh.get_or_compile(kSrcA, "sm_90a", kOpts, kVersion, fc.for_(kSrcA, "sm_90a"));
  EXPECT_EQ(fresh.stats().memory_hits, 1);
  EXPECT_EQ(fc.calls, 1);
}

TEST(KernelCache, KeyCoversSourceArchOptionsAndVersion) {
  TempDir dir;
  gpu::KernelCache cache(dir.path());
  FakeCompiler fc;
  auto get = [&](const std::string& src, const std::string& arch,
                 const std::vector<std::string>& opts, std::pair<int, int> v) {
    return cache.get_or_compile(src, arch, opts, v, fc.for_(src, arch));
  };
  get(kSrcA, "sm_80", kOpts, kVersion);
  get(kSrcB, "sm_80", kOpts, kVersion);
  get(kSrcA, "sm_90a", kOpts, kVersion);
  get(kSrcA, "sm_80", {}, kVersion);
  get(kSrcA, "sm_80", {"-lineinfo", "-O3"}, kVersion);
  get(kSrcA, "sm_80", kOpts, {13, 1});
  get(kSrcA, "sm_80", kOpts, {12, 0});
  EXPECT_EQ(fc.calls, 7);
  get(kSrcA, "sm_80", kOpts, kVersion);
  EXPECT_EQ(fc.calls, 7);
  EXPECT_EQ(cache.stats().disk_writes, 7);

  // The framing is unambiguous: splitting or joining fields gives another key.
  using K = gpu::KernelCache;
  EXPECT_NE(K::key("s", "sm_80", {"-a b"}, kVersion), K::key("s", "sm_80", {"-a", "b"}, kVersion));
  EXPECT_NE(K::key("s", "sm_80", {"", "x"}, kVersion), K::key("s", "sm_80", {"x", ""}, kVersion));
  EXPECT_NE(K::key("s", "sm_80", {}, kVersion), K::key("s", "sm_80", {""}, kVersion));
  EXPECT_NE(K::key("ssm_80", "", {}, kVersion), K::key("s", "sm_80", {}, kVersion));
  EXPECT_NE(K::key("s", "sm_80", {}, {1, 30}), K::key("s", "sm_80", {}, {13, 0}));
  EXPECT_EQ(K::key("s", "sm_80", {}, kVersion).size(), 64u);
}

TEST(KernelCache, CorruptEntriesAreRejectedAndRewritten) {
  TempDir dir;
  FakeCompiler fc;
  const std::string path =
      dir.path() + "/" + gpu::KernelCache::key(kSrcA, "sm_80", kOpts, kVersion) + ".bin";
  { gpu::KernelCache(dir.path()).get_or_compile(kSrcA, "sm_80", kOpts, kVersion, fc.for_(kSrcA, "sm_80")); }
  const std::string good = read_bytes(path);
  ASSERT_GT(good.size(), 100u);

  std::string flipped = good;
  flipped[good.size() - 40] ^= 0x20;  // in the image
  std::string flipped_size = good;
  flipped_size[24] ^= 1;  // the source's size in the header
  std::string bad_magic = good;
  bad_magic[0] = 'X';
  const std::vector<std::pair<std::string, std::string>> corruptions = {
      {"a flipped image byte", flipped},
      {"a flipped size", flipped_size},
      {"a bad magic", bad_magic},
      {"a truncated file", good.substr(0, good.size() / 2)},
      {"a file without its checksum", good.substr(0, good.size() - 32)},
      {"a file with a byte appended", good + "x"},
      {"an empty file", ""},
  };
  int expected_calls = 1;
  for (const auto& [what, bytes] : corruptions) {
    SCOPED_TRACE(what);
    write_bytes(path, bytes);
    gpu::KernelCache cache(dir.path());
    auto k = cache.get_or_compile(kSrcA, "sm_80", kOpts, kVersion, fc.for_(kSrcA, "sm_80"));
    EXPECT_EQ(image_of(*k), "\x7f" "ELF image of " + kSrcA + " for sm_80");
    EXPECT_EQ(fc.calls, ++expected_calls);
    gpu::KernelCacheStats s = cache.stats();
    EXPECT_EQ(s.disk_rejected, 1);
    EXPECT_EQ(s.compiles, 1);
    EXPECT_EQ(s.disk_writes, 1);
    EXPECT_EQ(read_bytes(path), good);  // rewritten
  }
  // The rewritten entry is a disk hit again.
  gpu::KernelCache cache(dir.path());
  cache.get_or_compile(kSrcA, "sm_80", kOpts, kVersion, fc.for_(kSrcA, "sm_80"));
  EXPECT_EQ(cache.stats().disk_hits, 1);
  EXPECT_EQ(fc.calls, expected_calls);
}

TEST(KernelCache, ForgedEntryIsAHashCollision) {
  TempDir dir;
  FakeCompiler fc;
  using K = gpu::KernelCache;
  const std::string key_a = K::key(kSrcA, "sm_80", kOpts, kVersion);
  {
    K cache(dir.path());
    cache.get_or_compile(kSrcB, "sm_80", kOpts, kVersion, fc.for_(kSrcB, "sm_80"));
    cache.get_or_compile(kSrcA, "sm_90a", kOpts, kVersion, fc.for_(kSrcA, "sm_90a"));
  }
  // A valid entry for B (or for A on another arch) filed under A's key.
  for (const auto& [from, what] : {std::pair{K::key(kSrcB, "sm_80", kOpts, kVersion),
                                             std::string("a different kernel source")},
                                   std::pair{K::key(kSrcA, "sm_90a", kOpts, kVersion),
                                             std::string("arch 'sm_90a' where 'sm_80' was requested")}}) {
    SCOPED_TRACE(what);
    fs::copy_file(dir.path() + "/" + from + ".bin", dir.path() + "/" + key_a + ".bin",
                  fs::copy_options::overwrite_existing);
    K cache(dir.path());
    const int calls = fc.calls;
    try {
      cache.get_or_compile(kSrcA, "sm_80", kOpts, kVersion, fc.for_(kSrcA, "sm_80"));
      FAIL() << "no error";
    } catch (const pl::Error& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("Kernel hash collision!"), std::string::npos) << m;
      EXPECT_NE(m.find(key_a), std::string::npos) << m;
      EXPECT_NE(m.find(what), std::string::npos) << m;
    }
    EXPECT_EQ(fc.calls, calls);  // never compiled, never returned B's image
    // The failed request left nothing behind: asking again fails the same way.
    EXPECT_THROW(cache.get_or_compile(kSrcA, "sm_80", kOpts, kVersion, fc.for_(kSrcA, "sm_80")),
                 pl::Error);
  }
}

TEST(KernelCache, UnusableDirectoryFallsBackToMemory) {
  // A directory under a regular file cannot be created, even by root.
  TempDir dir;
  write_bytes(dir.path() + "/file", "not a directory");
  const std::string bad = dir.path() + "/file/kernels";
  gpu::KernelCache cache(bad);
  EXPECT_EQ(cache.dir(), bad);
  std::string why = cache.disk_disabled_reason();
  EXPECT_NE(why.find("'" + bad + "' cannot be created"), std::string::npos) << why;
  EXPECT_NE(why.find("memory only"), std::string::npos) << why;
  EXPECT_EQ(cache.stats().disk_write_failures, 1);
  FakeCompiler fc;
  cache.get_or_compile(kSrcA, "sm_80", kOpts, kVersion, fc.for_(kSrcA, "sm_80"));
  auto k = cache.get_or_compile(kSrcA, "sm_80", kOpts, kVersion, fc.for_(kSrcA, "sm_80"));
  EXPECT_EQ(image_of(*k), "\x7f" "ELF image of " + kSrcA + " for sm_80");
  EXPECT_EQ(fc.calls, 1);
  gpu::KernelCacheStats s = cache.stats();
  EXPECT_EQ(s.memory_hits, 1);
  EXPECT_EQ(s.disk_writes, 0);
  EXPECT_EQ(s.disk_write_failures, 1);
}

TEST(KernelCache, DirectoryRemovedLaterTurnsWritesOff) {
  TempDir dir;
  const std::string sub = dir.path() + "/kernels";
  gpu::KernelCache cache(sub);
  ASSERT_EQ(cache.disk_disabled_reason(), "");
  fs::remove_all(sub);
  write_bytes(sub, "now a file");  // even root cannot write under it
  FakeCompiler fc;
  cache.get_or_compile(kSrcA, "sm_80", kOpts, kVersion, fc.for_(kSrcA, "sm_80"));
  cache.get_or_compile(kSrcB, "sm_80", kOpts, kVersion, fc.for_(kSrcB, "sm_80"));
  cache.get_or_compile(kSrcA, "sm_80", kOpts, kVersion, fc.for_(kSrcA, "sm_80"));
  gpu::KernelCacheStats s = cache.stats();
  EXPECT_EQ(s.compiles, 2);
  EXPECT_EQ(s.memory_hits, 1);
  EXPECT_EQ(s.disk_write_failures, 1);  // the first failure turns writing off
  std::string why = cache.disk_disabled_reason();
  EXPECT_NE(why.find("cannot write kernel cache entry"), std::string::npos) << why;
}

TEST(KernelCache, ConcurrentRequestsCompileOnce) {
  TempDir dir;
  gpu::KernelCache cache(dir.path());
  std::atomic<int> calls{0};
  auto slow_compile = [&] {
    ++calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gpu::CompiledKernel k;
    k.image = {'i', 'm', 'g'};
    return k;
  };
  constexpr int kThreads = 8;
  std::latch start(kThreads);
  std::vector<std::shared_ptr<const gpu::CompiledKernel>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      got[t] = cache.get_or_compile(kSrcA, "sm_80", kOpts, kVersion, slow_compile);
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(calls, 1);
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_TRUE(got[t]);
    EXPECT_EQ(got[t], got[0]);
  }
  gpu::KernelCacheStats s = cache.stats();
  EXPECT_EQ(s.compiles, 1);
  EXPECT_EQ(s.memory_hits, kThreads - 1);
  EXPECT_EQ(s.disk_writes, 1);
}

TEST(KernelCache, CompileErrorsReachTheCallerAndAreNotCached) {
  gpu::KernelCache cache("");
  int calls = 0;
  auto failing = [&]() -> gpu::CompiledKernel {
    ++calls;
    throw pl::Error("NVRTC failed to compile k for sm_80");
  };
  EXPECT_THROW(cache.get_or_compile(kSrcA, "sm_80", {}, kVersion, failing), pl::Error);
  EXPECT_THROW(cache.get_or_compile(kSrcA, "sm_80", {}, kVersion, failing), pl::Error);
  EXPECT_EQ(calls, 2);
  FakeCompiler fc;
  cache.get_or_compile(kSrcA, "sm_80", {}, kVersion, fc.for_(kSrcA, "sm_80"));
  EXPECT_EQ(fc.calls, 1);
  EXPECT_EQ(cache.stats().compiles, 1);
}

TEST(KernelCache, DefaultDirFollowsTheEnvironment) {
  // Restores the variables it changes.
  struct Saved {
    const char* name;
    std::optional<std::string> value;
    explicit Saved(const char* n) : name(n) {
      if (const char* v = std::getenv(n)) value = v;
    }
    ~Saved() { value ? setenv(name, value->c_str(), 1) : unsetenv(name); }
  } s1("PALLAS_CACHE_DIR"), s2("XDG_CACHE_HOME"), s3("HOME");
  setenv("HOME", "/home/u", 1);
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  setenv("PALLAS_CACHE_DIR", "/my/cache", 1);
  EXPECT_EQ(gpu::KernelCache::default_dir(), "/my/cache");
  setenv("PALLAS_CACHE_DIR", "off", 1);
  EXPECT_EQ(gpu::KernelCache::default_dir(), "");
  setenv("PALLAS_CACHE_DIR", "", 1);
  EXPECT_EQ(gpu::KernelCache::default_dir(), "");
  unsetenv("PALLAS_CACHE_DIR");
  EXPECT_EQ(gpu::KernelCache::default_dir(), "/xdg/pallas/kernels");
  setenv("XDG_CACHE_HOME", "relative", 1);  // invalid per the XDG spec
  EXPECT_EQ(gpu::KernelCache::default_dir(), "/home/u/.cache/pallas/kernels");
  unsetenv("XDG_CACHE_HOME");
  EXPECT_EQ(gpu::KernelCache::default_dir(), "/home/u/.cache/pallas/kernels");
  unsetenv("HOME");
  EXPECT_EQ(gpu::KernelCache::default_dir(), "");
}

TEST(KernelCache, NvrtcCubinThroughTheCache) {
  if (std::string why = gpu::Nvrtc::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  const gpu::Nvrtc& nvrtc = gpu::Nvrtc::get();
  const std::string src = "extern \"C\" __global__ void k(float* p) { p[0] = 1.f; }";
  int calls = 0;
  auto compile = [&] {
    ++calls;
    return nvrtc.compile(src, "k", "sm_80");
  };
  TempDir dir;
  gpu::KernelCache cache(dir.path());
  auto first = cache.get_or_compile(src, "sm_80", {}, nvrtc.version(), compile);
  auto second = cache.get_or_compile(src, "sm_80", {}, nvrtc.version(), compile);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(first, second);
  ASSERT_TRUE(first->is_cubin);
  ASSERT_GT(first->image.size(), 4u);
  EXPECT_EQ(std::string(first->image.data(), 4), "\x7f" "ELF");
  EXPECT_EQ(cache.stats().memory_hits, 1);

  gpu::KernelCache fresh(dir.path());
  auto third = fresh.get_or_compile(src, "sm_80", {}, nvrtc.version(), compile);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(fresh.stats().disk_hits, 1);
  EXPECT_TRUE(third->is_cubin);
  EXPECT_EQ(third->image, first->image);
  EXPECT_EQ(third->log, first->log);
}

}  // namespace
