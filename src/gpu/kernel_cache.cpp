#include "gpu/kernel_cache.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <random>

#include "pallas/error.h"

namespace pallas::gpu {

namespace {

// Bumping this changes every key (so an older Pallas sharing the directory keeps its entries
// and never reads ours) and the version in every file header.
constexpr uint32_t kFormatVersion = 1;
constexpr char kMagic[8] = {'P', 'A', 'L', 'L', 'A', 'S', 'K', '1'};
constexpr size_t kHeaderSize = 64;  // magic, version, flags, compiler version, 5 sizes
constexpr size_t kDigestSize = 32;
constexpr uint32_t kFlagCubin = 1;

// Incremental SHA-256 over OpenSSL's EVP interface, so large sources are hashed in place.
class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) {
    if (!ctx_ || EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1)
      throw Error("OpenSSL could not initialise SHA-256 for the kernel cache");
  }
  ~Sha256() { EVP_MD_CTX_free(ctx_); }
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(std::string_view data) {
    if (!data.empty()) EVP_DigestUpdate(ctx_, data.data(), data.size());
  }
  std::string digest() {  // 32 raw bytes
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_DigestFinal_ex(ctx_, md, &n);
    return std::string(reinterpret_cast<const char*>(md), n);
  }

 private:
  EVP_MD_CTX* ctx_;
};

std::string to_hex(std::string_view bytes) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) {
    auto b = static_cast<unsigned char>(c);
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

// Little-endian fixed-width integers, so a file reads the same on every host.
void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}
void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}
uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// Options as one length-prefixed blob: the count, then each option's length and bytes.
std::string frame_options(const std::vector<std::string>& options) {
  std::string out;
  put_u64(out, options.size());
  for (const std::string& o : options) {
    put_u64(out, o.size());
    out += o;
  }
  return out;
}
bool unframe_options(std::string_view blob, std::vector<std::string>& out) {
  if (blob.size() < 8) return false;
  uint64_t count = get_u64(blob.data());
  blob.remove_prefix(8);
  for (uint64_t i = 0; i < count; ++i) {
    if (blob.size() < 8) return false;
    uint64_t n = get_u64(blob.data());
    blob.remove_prefix(8);
    if (n > blob.size()) return false;
    out.emplace_back(blob.substr(0, n));
    blob.remove_prefix(n);
  }
  return blob.empty();
}

std::string errno_text(int err) { return std::strerror(err); }

// The whole file, or false with errno set.
bool read_whole(const std::string& path, std::string& out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      errno = err;
      return false;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return true;
}

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// A temp-file name no other process or thread (here or on another host sharing the directory)
// will pick: pid, a per-process random tag and a counter.
std::string temp_suffix() {
  static const uint64_t tag = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }();
  static std::atomic<uint64_t> counter{0};
  return "." + std::to_string(::getpid()) + "." + to_hex(std::string_view(
                                                       reinterpret_cast<const char*>(&tag), 8)) +
         "." + std::to_string(counter++) + ".tmp";
}

std::string describe_options(const std::vector<std::string>& options) {
  std::string out = "[";
  for (size_t i = 0; i < options.size(); ++i) out += (i ? ", '" : "'") + options[i] + "'";
  return out + "]";
}

}  // namespace

std::string sha256_hex(std::string_view data) {
  Sha256 h;
  h.update(data);
  return to_hex(h.digest());
}

std::string KernelCache::key(const std::string& source, const std::string& arch,
                             const std::vector<std::string>& options,
                             std::pair<int, int> compiler_version) {
  // Every field is length-prefixed (and the option count too), so e.g. options {"-a b"} and
  // {"-a", "b"}, or a source ending in the arch's text, can never frame to the same bytes.
  Sha256 h;
  std::string frame;
  auto field = [&](std::string_view s) {
    frame.clear();
    put_u64(frame, s.size());
    h.update(frame);
    h.update(s);
  };
  field("pallas.gpu.KernelCache/" + std::to_string(kFormatVersion));
  field(source);
  field(arch);
  field(frame_options(options));
  field(std::to_string(compiler_version.first) + "." + std::to_string(compiler_version.second));
  return to_hex(h.digest());
}

std::string KernelCache::default_dir() {
  if (const char* d = std::getenv("PALLAS_CACHE_DIR")) {
    std::string s = d;
    return s == "off" ? std::string() : s;
  }
  // The XDG spec says a relative $XDG_CACHE_HOME is invalid and must be ignored.
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && x[0] == '/')
    return std::string(x) + "/pallas/kernels";
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::string(home) + "/.cache/pallas/kernels";
  return "";
}

KernelCache::KernelCache(std::string dir) : dir_(std::move(dir)) {
  if (dir_.empty()) {
    disabled_reason_ = "no cache directory was given: kernels are cached in memory only";
    return;
  }
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (!ec && !std::filesystem::is_directory(dir_, ec) && !ec)
    ec = std::make_error_code(std::errc::not_a_directory);
  if (ec) {
    disabled_reason_ = "the kernel cache directory '" + dir_ + "' cannot be created (" +
                       ec.message() + "): kernels are cached in memory only; set PALLAS_CACHE_DIR "
                       "to a writable directory, or to 'off'";
    stats_.disk_write_failures = 1;
    return;
  }
  disk_read_ = true;
  disk_write_ = true;
  // A read-only directory (a shared, pre-filled cache) is still read; root passes this check
  // whatever the mode, and then a failed write turns writing off instead.
  if (::access(dir_.c_str(), W_OK | X_OK) != 0) {
    stats_.disk_write_failures = 1;
    disable_writes("the kernel cache directory '" + dir_ + "' is not writable (" +
                   errno_text(errno) + ")");
  }
}

KernelCache& KernelCache::global() {
  static KernelCache* cache = [] {
    auto* c = new KernelCache(default_dir());
    c->warn_ = true;
    if (!c->dir_.empty() && !c->disabled_reason_.empty())
      std::cerr << "warning: " << c->disabled_reason_ << "\n";
    return c;
  }();
  return *cache;
}

void KernelCache::disable_writes(const std::string& reason) {
  if (!disk_write_) return;
  disk_write_ = false;
  disabled_reason_ = reason + ": new kernels are cached in memory only (existing entries are "
                              "still read); set PALLAS_CACHE_DIR to a writable directory, or to 'off'";
}

KernelCacheStats KernelCache::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

std::string KernelCache::disk_disabled_reason() const {
  std::lock_guard lock(mu_);
  return disabled_reason_;
}

std::string KernelCache::entry_path(const std::string& key) const {
  return dir_.empty() ? std::string() : dir_ + "/" + key + ".bin";
}

namespace {

// Throws the collision error when `stored` is not the request, naming what differs.
void check_same(const std::string& key, const std::string& where, const std::string& source,
                const std::string& arch, const std::vector<std::string>& options,
                std::pair<int, int> version, const std::string& req_source,
                const std::string& req_arch, const std::vector<std::string>& req_options,
                std::pair<int, int> req_version) {
  std::string what;
  if (source != req_source)
    what = "a different kernel source (" + std::to_string(source.size()) + " bytes stored, " +
           std::to_string(req_source.size()) + " requested)";
  else if (arch != req_arch)
    what = "arch '" + arch + "' where '" + req_arch + "' was requested";
  else if (options != req_options)
    what = "options " + describe_options(options) + " where " + describe_options(req_options) +
           " were requested";
  else if (version != req_version)
    what = "compiler version " + std::to_string(version.first) + "." + std::to_string(version.second) +
           " where " + std::to_string(req_version.first) + "." + std::to_string(req_version.second) +
           " was requested";
  else
    return;
  throw Error("Kernel hash collision! The kernel cache entry " + key + " (" + where + ") holds " +
              what + ". Either two kernels share a SHA-256 or the entry was altered or copied "
              "under another name; delete it, or set PALLAS_CACHE_DIR=off to bypass the disk cache");
}

}  // namespace

std::shared_ptr<const CompiledKernel> KernelCache::read_disk(const std::string& key,
                                                             const Entry& request) {
  const std::string path = entry_path(key);
  std::string bytes;
  // A missing or unreadable file is a plain miss; the compile that follows rewrites it.
  if (!read_whole(path, bytes)) return nullptr;
  auto reject = [&] {
    std::lock_guard lock(mu_);
    ++stats_.disk_rejected;
    return nullptr;
  };
  if (bytes.size() < kHeaderSize + kDigestSize || std::memcmp(bytes.data(), kMagic, 8) != 0)
    return reject();
  const char* p = bytes.data();
  const uint32_t version = get_u32(p + 8), flags = get_u32(p + 12);
  if (version != kFormatVersion || (flags & ~kFlagCubin) != 0) return reject();
  const std::pair<int, int> compiler{static_cast<int32_t>(get_u32(p + 16)),
                                     static_cast<int32_t>(get_u32(p + 20))};
  uint64_t sizes[5];
  uint64_t total = 0;
  const uint64_t body = bytes.size() - kHeaderSize - kDigestSize;
  for (int i = 0; i < 5; ++i) {
    sizes[i] = get_u64(p + 24 + 8 * i);
    if (sizes[i] > body - total) return reject();  // also rules out overflow
    total += sizes[i];
  }
  if (total != body) return reject();
  Sha256 h;
  h.update(std::string_view(p, bytes.size() - kDigestSize));
  if (h.digest() != std::string_view(p + bytes.size() - kDigestSize, kDigestSize)) return reject();

  std::string_view fields[5];
  size_t at = kHeaderSize;
  for (int i = 0; i < 5; ++i) {
    fields[i] = std::string_view(p + at, sizes[i]);
    at += sizes[i];
  }
  std::vector<std::string> options;
  if (!unframe_options(fields[2], options)) return reject();
  check_same(key, path, std::string(fields[0]), std::string(fields[1]), options, compiler,
             request.source, request.arch, request.options, request.compiler_version);
  auto k = std::make_shared<CompiledKernel>();
  k->is_cubin = (flags & kFlagCubin) != 0;
  k->log = std::string(fields[3]);
  k->image.assign(fields[4].begin(), fields[4].end());
  return k;
}

void KernelCache::write_disk(const std::string& key, const Entry& e) {
  {
    std::lock_guard lock(mu_);
    if (!disk_write_) return;  // another thread's write failed meanwhile
  }
  const std::string path = entry_path(key);
  std::string tmp;
  int err = 0;
  try {
    const std::string options = frame_options(e.options);
    const CompiledKernel& k = *e.kernel;
    std::string bytes(kMagic, 8);
    bytes.reserve(kHeaderSize + e.source.size() + e.arch.size() + options.size() + k.log.size() +
                  k.image.size() + kDigestSize);
    put_u32(bytes, kFormatVersion);
    put_u32(bytes, k.is_cubin ? kFlagCubin : 0);
    put_u32(bytes, static_cast<uint32_t>(e.compiler_version.first));
    put_u32(bytes, static_cast<uint32_t>(e.compiler_version.second));
    for (size_t n : {e.source.size(), e.arch.size(), options.size(), k.log.size(), k.image.size()})
      put_u64(bytes, n);
    bytes += e.source;
    bytes += e.arch;
    bytes += options;
    bytes += k.log;
    bytes.append(k.image.data(), k.image.size());
    Sha256 h;
    h.update(bytes);
    bytes += h.digest();

    // Write a private temp file, then rename it over the entry: readers (other threads and
    // processes) see the old file or the whole new one, never a torn one. No fsync: a file torn
    // by a power cut fails its checksum and is recompiled.
    tmp = dir_ + "/." + key + temp_suffix();
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
      err = errno;
      tmp.clear();
    } else {
      errno = 0;
      bool ok = write_all(fd, bytes);
      if (!ok) err = errno ? errno : EIO;
      if (::close(fd) != 0 && ok) {
        ok = false;
        err = errno;
      }
      if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
      if (!ok || err) ::unlink(tmp.c_str());
    }
  } catch (const std::exception&) {  // e.g. out of memory: the cache stays usable in memory
    err = ENOMEM;
    if (!tmp.empty()) ::unlink(tmp.c_str());
  }
  std::lock_guard lock(mu_);
  if (!err) {
    ++stats_.disk_writes;
    return;
  }
  ++stats_.disk_write_failures;
  const bool was_on = disk_write_;
  disable_writes("cannot write kernel cache entry " + path + " (" + errno_text(err) + ")");
  if (was_on && warn_) std::cerr << "warning: " << disabled_reason_ << "\n";
}

std::shared_ptr<const CompiledKernel> KernelCache::get_or_compile(
    const std::string& source, const std::string& arch, const std::vector<std::string>& options,
    std::pair<int, int> compiler_version, const std::function<CompiledKernel()>& compile) {
  const std::string k = key(source, arch, options, compiler_version);
  bool disk_read = false, disk_write = false;
  {
    std::unique_lock lock(mu_);
    for (;;) {
      if (auto it = memory_.find(k); it != memory_.end()) {
        const Entry& e = it->second;
        check_same(k, "in memory", e.source, e.arch, e.options, e.compiler_version, source, arch,
                   options, compiler_version);
        ++stats_.memory_hits;
        return e.kernel;
      }
      // The first request for a key reads the disk / compiles; the others wait for it.
      if (in_flight_.insert(k).second) break;
      compiled_.wait(lock);
    }
    disk_read = disk_read_;
    disk_write = disk_write_;
  }
  Entry e{source, arch, options, compiler_version, nullptr};
  bool compiled = false;
  try {
    if (disk_read) e.kernel = read_disk(k, e);
    if (!e.kernel) {
      e.kernel = std::make_shared<const CompiledKernel>(compile());
      compiled = true;
    }
  } catch (...) {
    // Waiters retry: one of them compiles (and most likely meets the same error itself).
    std::lock_guard lock(mu_);
    in_flight_.erase(k);
    compiled_.notify_all();
    throw;
  }
  std::shared_ptr<const CompiledKernel> kernel = e.kernel;
  {
    std::lock_guard lock(mu_);
    ++(compiled ? stats_.compiles : stats_.disk_hits);
    memory_.emplace(k, e);
    in_flight_.erase(k);
    compiled_.notify_all();
  }
  // After publishing, so waiters need not wait for the file.
  if (compiled && disk_write) write_disk(k, e);
  return kernel;
}

}  // namespace pallas::gpu
