// The disk tier of the kernel cache: one file per entry in a private folder, published
// atomically, one compile per key across processes, corrupt entries are misses. On-disk
// format: docs/cache.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cache/entry_report.hpp"
#include "cache/image_check.hpp"
#include "cache/key.hpp"
#include "cache/origin.hpp"

namespace fusedopt::cache {

/// The disk tier: `<dir>/<2 hex>/<32 hex>.<ext>` files, each a header + payload.
class DiskStore {
 public:
  /// Opens (creating with mode 0700 if needed) the cache folder. Throws CacheError if the
  /// folder is writable by group or others, or owned by another user.
  explicit DiskStore(std::filesystem::path dir);

  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path entry_path(const Key& key, std::string_view ext) const;

  /// The payload stored for `record`, or nullopt. A corrupt, truncated or foreign file is
  /// deleted and reported as a miss, and so is one whose payload `check` refuses (with a
  /// warning: an older fusedopt stored what a broken compiler wrote). A hit refreshes the
  /// file's mtime (for LRU eviction).
  std::optional<std::string> load(const KeyRecord& record, std::string_view ext,
                                  const PayloadCheck& check = {}) const;

  /// Publishes atomically: temp file in the same folder, fsync, rename, fsync the folder.
  /// Throws CacheError, storing nothing, for a payload `check` refuses.
  void store(const KeyRecord& record, std::string_view ext, std::string_view payload,
             const PayloadCheck& check = {}) const;

  /// load(); on a miss, takes the per-key file lock, re-checks, and only then calls
  /// `compile` and stores its result. Exactly one process compiles a given key.
  std::pair<std::string, Origin> get_or_compile(const KeyRecord& record, std::string_view ext,
                                                const std::function<std::string()>& compile,
                                                const PayloadCheck& check = {}) const;

  /// Why the entry file for `key` is not one load() would return ("" when it is): missing
  /// (never stored, or removed by a prune or another process), in a sub-folder we do not
  /// trust, not ours, not a regular file, or corrupt. Reads and re-hashes the whole file.
  std::string entry_problem(const Key& key, std::string_view ext) const;

  std::vector<EntryInfo> list() const;
  /// Re-hashes every entry; returns the bad ones (and deletes them when `remove`), stale
  /// temp files and stale compiler build folders (remove_stale()) among them, and entries
  /// whose payload `check` refuses.
  std::vector<BadEntry> verify(bool remove = false, const PayloadCheck& check = {}) const;
  /// Removes what processes that died left: temp files of stores whose process is gone from
  /// this host (after a minute's grace, for hosts sharing the folder) or older than an hour,
  /// and this user's compiler build folders in the temporary folder whose process is gone
  /// (support/build_dirs.hpp). Run when a KernelCache opens the folder, and by prune().
  Removal remove_stale() const;
  /// remove_stale(), then removes least recently used entries until the total is at most
  /// `max_bytes`. An entry that cannot be removed (a read-only folder) is a leftover, and
  /// the next one is tried.
  Removal prune(std::uint64_t max_bytes) const;
  /// Removes every entry, temp and free lock file, and stale build folders. Entries that
  /// cannot be removed and sub-folders that are not trusted (not entered) are leftovers;
  /// files that are not the cache's are left alone.
  Removal clear() const;
  std::uint64_t total_bytes() const;

 private:
  std::filesystem::path dir_;
};

}  // namespace fusedopt::cache
