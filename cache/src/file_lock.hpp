// An exclusive advisory lock on a lock file (flock), held for the lifetime of the object.
// The disk tier uses one per key so that exactly one process compiles a missing entry.
#pragma once

#include <filesystem>
#include <optional>

#include "support/unique_fd.hpp"

namespace fusedopt::cache::detail {

class FileLock {
 public:
  /// Creates `path` if needed and blocks until the lock is ours. Throws CacheError when the
  /// lock file cannot be opened or locked.
  explicit FileLock(const std::filesystem::path& path);
  /// The lock if it is free right now, else nullopt (also nullopt if `path` is missing).
  static std::optional<FileLock> try_lock_existing(const std::filesystem::path& path);

  FileLock(FileLock&&) noexcept = default;
  FileLock& operator=(FileLock&&) noexcept = default;
  /// Releases the lock (closing the descriptor drops the flock).
  ~FileLock() = default;

  const std::filesystem::path& path() const { return path_; }

 private:
  FileLock(std::filesystem::path path, support::UniqueFd fd)
      : path_(std::move(path)), fd_(std::move(fd)) {}
  std::filesystem::path path_;
  support::UniqueFd fd_;
};

}  // namespace fusedopt::cache::detail
