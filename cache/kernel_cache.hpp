// The kernel cache: compiled binaries (CUBIN, shared objects) stored by a 128-bit hash of a
// canonical record of everything that went into them. A memory tier (per-key once across
// threads) sits in front of a disk tier (atomic publish, one compile per key across
// processes, corrupt entries are misses). Knows nothing of CUDA. On-disk format:
// cache/README.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fusedopt::cache {

/// Version of the on-disk entry format and of the key record layout.
/// Bump when you change this: the header layout, the record encoding or the folder naming.
inline constexpr std::uint32_t kFormatVersion = 2;

/// A 128-bit key (XXH3-128).
struct Key {
  std::uint64_t hi = 0;
  std::uint64_t lo = 0;
  /// 32 lowercase hex digits, high half first.
  std::string hex() const;
  static std::optional<Key> from_hex(std::string_view hex);
  bool operator==(const Key& o) const { return hi == o.hi && lo == o.lo; }
  bool operator!=(const Key& o) const { return !(*this == o); }
};

/// The canonical record a key is computed from: ordered (name, value) fields, encoded
/// length-prefixed so that no two different records have the same bytes.
class KeyRecord {
 public:
  KeyRecord& add(std::string name, std::string value);
  const std::vector<std::pair<std::string, std::string>>& fields() const { return fields_; }
  /// The value of the first field called `name`, or "" when there is none.
  std::string get(std::string_view name) const;
  /// Canonical bytes: for each field, u64 LE length + name bytes, u64 LE length + value bytes.
  std::string serialize() const;
  /// Inverse of serialize(); nullopt for malformed bytes.
  static std::optional<KeyRecord> deserialize(std::string_view bytes);
  /// XXH3-128 of serialize().
  Key key() const;

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

enum class Origin { Memory, Disk, Compiled };
const char* to_string(Origin origin);

/// What `list` reports about one entry.
struct EntryInfo {
  Key key;
  std::string ext;  ///< "cubin", "so", ...
  std::filesystem::path path;
  std::uint64_t file_bytes = 0;
  std::uint64_t payload_bytes = 0;
  std::int64_t last_used = 0;  ///< seconds since the epoch (file mtime; refreshed on hits)
  KeyRecord record;            ///< empty if the header could not be read
};

/// What `verify` found wrong with one file.
struct BadEntry {
  std::filesystem::path path;
  std::string reason;  ///< e.g. "truncated: payload is 812 bytes, header says 6960"
};

/// The disk tier: `<dir>/<2 hex>/<32 hex>.<ext>` files, each a header + payload.
class DiskStore {
 public:
  /// Opens (creating with mode 0700 if needed) the cache folder. Throws CacheError if the
  /// folder is writable by group or others, or owned by another user.
  explicit DiskStore(std::filesystem::path dir);

  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path entry_path(const Key& key, std::string_view ext) const;

  /// The payload stored for `record`, or nullopt. A corrupt, truncated or foreign file is
  /// deleted and reported as a miss. A hit refreshes the file's mtime (for LRU eviction).
  std::optional<std::string> load(const KeyRecord& record, std::string_view ext) const;

  /// Publishes atomically: temp file in the same folder, fsync, rename, fsync the folder.
  void store(const KeyRecord& record, std::string_view ext, std::string_view payload) const;

  /// load(); on a miss, takes the per-key file lock, re-checks, and only then calls
  /// `compile` and stores its result. Exactly one process compiles a given key.
  std::pair<std::string, Origin> get_or_compile(const KeyRecord& record, std::string_view ext,
                                                const std::function<std::string()>& compile) const;

  std::vector<EntryInfo> list() const;
  /// Re-hashes every entry; returns the bad ones (and deletes them when `remove`).
  std::vector<BadEntry> verify(bool remove = false) const;
  /// Removes least recently used entries until the total is at most `max_bytes`.
  /// Returns the number of bytes removed.
  std::uint64_t prune(std::uint64_t max_bytes) const;
  /// Removes every entry (and leftover temp and lock files). Returns bytes removed.
  std::uint64_t clear() const;
  std::uint64_t total_bytes() const;

 private:
  std::filesystem::path dir_;
};

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
  Result get_or_compile(const KeyRecord& record, std::string_view ext,
                        const std::function<std::string()>& compile);

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
