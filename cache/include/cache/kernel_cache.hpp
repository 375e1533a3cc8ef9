// The kernel cache: compiled binaries (CUBIN, shared objects) stored by a 128-bit hash of a
// canonical record of everything that went into them. A memory tier (per-key once across
// threads) sits in front of the disk tier (disk_store.hpp). Knows nothing of CUDA. On-disk
// format: docs/cache.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "cache/disk_store.hpp"
#include "cache/key.hpp"
#include "cache/origin.hpp"

namespace fusedopt::cache {

/// Memory tier + disk tier, configured from the environment by default.
class KernelCache {
 public:
  enum class Mode { Off, Memory, On };
  struct Options {
    std::filesystem::path dir;                  ///< FUSEDOPT_CACHE_DIR or the XDG default
    Mode mode = Mode::On;                       ///< FUSEDOPT_CACHE=off|memory|on
    std::uint64_t max_disk_bytes = 1ull << 30;  ///< FUSEDOPT_CACHE_MAX_BYTES (disk)
    std::uint64_t max_memory_bytes = 256ull << 20;
  };
  /// FUSEDOPT_CACHE_DIR (default ${XDG_CACHE_HOME:-$HOME/.cache}/fusedopt), FUSEDOPT_CACHE,
  /// FUSEDOPT_CACHE_MAX_BYTES. Throws CacheError for an unparsable value.
  static Options options_from_env();

  explicit KernelCache(Options options);
  /// The process-wide cache, built from options_from_env() on first use.
  static KernelCache& global();

  struct Result {
    std::shared_ptr<const std::string> payload;
    Origin origin = Origin::Compiled;
    Key key;
  };
  /// Per-key once: concurrent callers of a missing key wait for one compile. If `compile`
  /// throws, every waiter gets the exception and the next call tries again. After a
  /// store, the disk tier is pruned to max_disk_bytes. Callers that waited for another
  /// thread's compile get Origin::Memory. `compile` must not ask for its own key (it would
  /// wait for itself).
  /// `check` (when given) is the disk tier's: what it refuses is never stored, and an entry
  /// it refuses on load is dropped and compiled again (DiskStore::load).
  Result get_or_compile(const KeyRecord& record, std::string_view ext,
                        const std::function<std::string()>& compile,
                        const PayloadCheck& check = {});

  const Options& options() const { return options_; }
  /// The disk tier, or nullptr when the mode is not On.
  const DiskStore* disk() const { return disk_.get(); }
  /// Drops the memory tier (the disk is untouched). Compiles in flight are not cancelled:
  /// their results enter the memory tier when they finish.
  void clear_memory();
  /// The last disk-tier failure this cache worked around (unwritable folder, disk full...),
  /// or "" when there was none. Such failures never fail get_or_compile: the binary is
  /// compiled (or the compiled binary is returned) without being stored.
  std::string last_disk_error() const;

 private:
  struct Impl;
  Options options_;
  std::unique_ptr<DiskStore> disk_;
  std::shared_ptr<Impl> impl_;
};

}  // namespace fusedopt::cache
