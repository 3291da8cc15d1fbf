// The compiled-kernel cache of the GPU backend: NVRTC costs 20-70 ms per kernel (more with
// headers), so a compiled image is kept in memory for the process and on disk across processes.
// An entry is found by a SHA-256 key over everything that determines the image (the generated
// source, the arch, the options and the compiler's version); a hit compares the stored source,
// arch and options with the request, so a hash collision (or a forged file) is an error, never a
// wrong kernel. The on-disk format, atomicity and failure handling are described in
// docs/DECISIONS.md ("The compiled-kernel cache").
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "gpu/cuda_libs.h"

namespace pallas::gpu {

// SHA-256 of `data` (OpenSSL libcrypto), as 64 lower-case hex digits.
std::string sha256_hex(std::string_view data);

struct KernelCacheStats {
  int64_t memory_hits = 0;
  int64_t disk_hits = 0;
  int64_t compiles = 0;             // calls of the `compile` function that returned
  int64_t disk_writes = 0;          // entries written to disk
  int64_t disk_write_failures = 0;  // entries (or the directory) that could not be written
  int64_t disk_rejected = 0;        // entry files ignored as corrupt, truncated or of another format
};

class KernelCache {
 public:
  // `dir` empty: memory only. A directory that cannot be created disables the disk layer; a
  // write that fails turns off further writes (entries already there are still read). Neither
  // throws: the failure is counted in disk_write_failures and explained by disk_disabled_reason().
  explicit KernelCache(std::string dir);
  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;

  // The process-wide cache, created on first use in default_dir() (never destroyed, so kernels
  // may still be requested from static destructors). It prints one warning to stderr when its
  // directory cannot be used.
  static KernelCache& global();
  // $PALLAS_CACHE_DIR when set ("" or "off": no disk cache), else $XDG_CACHE_HOME/pallas/kernels
  // (when absolute), else $HOME/.cache/pallas/kernels, else "". Reads the environment each call.
  static std::string default_dir();

  // The hex SHA-256 key of a request: length-prefixed fields, so no two different requests
  // frame to the same bytes.
  static std::string key(const std::string& source, const std::string& arch,
                         const std::vector<std::string>& options, std::pair<int, int> compiler_version);

  // The image for (source, arch, options, compiler_version): from memory, else from disk, else
  // from `compile()` (then stored in both). `compile` must depend on these four alone (the
  // source must be self-contained: included headers are not part of the key). Thread-safe:
  // concurrent requests for one key run `compile` once, the others wait for it; an exception
  // from `compile` reaches its caller and the waiters retry. A stored entry with this key but a
  // different source, arch or options throws pallas::Error "Kernel hash collision! ...".
  std::shared_ptr<const CompiledKernel> get_or_compile(const std::string& source, const std::string& arch,
                                                       const std::vector<std::string>& options,
                                                       std::pair<int, int> compiler_version,
                                                       const std::function<CompiledKernel()>& compile);

  KernelCacheStats stats() const;
  const std::string& dir() const { return dir_; }
  // "" when the disk layer reads and writes; otherwise why it does not (for a memory-only
  // cache: that no directory was given).
  std::string disk_disabled_reason() const;
  // The file holding `key`'s entry ("" for a memory-only cache).
  std::string entry_path(const std::string& key) const;

 private:
  struct Entry {
    std::string source, arch;
    std::vector<std::string> options;
    std::pair<int, int> compiler_version;
    std::shared_ptr<const CompiledKernel> kernel;
  };
  std::shared_ptr<const CompiledKernel> read_disk(const std::string& key, const Entry& request);
  void write_disk(const std::string& key, const Entry& entry);
  void disable_writes(const std::string& reason);  // with mu_ held

  const std::string dir_;
  bool warn_ = false;  // the global cache says on stderr when its disk layer goes off
  mutable std::mutex mu_;
  std::condition_variable compiled_;          // signalled when a key leaves in_flight_
  std::unordered_map<std::string, Entry> memory_;
  std::unordered_set<std::string> in_flight_;  // keys being read from disk or compiled
  bool disk_read_ = false, disk_write_ = false;
  std::string disabled_reason_;
  KernelCacheStats stats_;
};

}  // namespace pallas::gpu
