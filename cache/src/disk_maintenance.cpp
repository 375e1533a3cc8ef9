// The disk tier's maintenance operations (list, verify, prune, clear), the face of the
// `fusedopt-cache` CLI. They tolerate a folder in use: files that vanish mid-scan are
// skipped, and a lock file is only deleted while we hold its lock.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>

#include "cache/disk_store.hpp"
#include "disk_layout.hpp"
#include "entry_format.hpp"
#include "file_lock.hpp"
#include "support/file_io.hpp"

namespace fusedopt::cache {

namespace {

/// A temp file older than this was left by a store that died; younger ones may be in use.
constexpr std::time_t kStaleTempSeconds = 3600;

/// Deletes a lock file if nobody holds it; the lock is held across the unlink so that a
/// waiter which later gets it notices the file is gone and locks the new one.
void remove_lock_if_free(const std::filesystem::path& lock_path) {
  if (auto lock = detail::FileLock::try_lock_existing(lock_path)) ::unlink(lock_path.c_str());
}

bool mtime_before(const detail::ScannedFile& a, const detail::ScannedFile& b) {
  if (a.st.st_mtim.tv_sec != b.st.st_mtim.tv_sec) return a.st.st_mtim.tv_sec < b.st.st_mtim.tv_sec;
  if (a.st.st_mtim.tv_nsec != b.st.st_mtim.tv_nsec) {
    return a.st.st_mtim.tv_nsec < b.st.st_mtim.tv_nsec;
  }
  return a.path < b.path;
}

}  // namespace

std::vector<EntryInfo> DiskStore::list() const {
  std::vector<EntryInfo> entries;
  for (const detail::ScannedFile& file : detail::scan(dir_)) {
    if (file.kind != detail::FileKind::Entry) continue;
    EntryInfo info;
    info.key = file.key;
    info.ext = file.ext;
    info.path = file.path;
    info.file_bytes = static_cast<std::uint64_t>(file.st.st_size);
    info.last_used = static_cast<std::int64_t>(file.st.st_mtim.tv_sec);
    support::UniqueFd fd(support::open_retry(file.path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    struct stat st {};
    if (fd && ::fstat(fd.get(), &st) == 0) {
      info.file_bytes = static_cast<std::uint64_t>(st.st_size);
      info.last_used = static_cast<std::int64_t>(st.st_mtim.tv_sec);
      detail::EntryCheck check =
          detail::read_entry(fd.get(), info.file_bytes, file.key, detail::ReadDepth::Header);
      if (check.problem.empty()) {
        info.payload_bytes = check.payload_bytes;
        if (auto record = KeyRecord::deserialize(check.record_bytes)) info.record = *record;
      }
    }
    entries.push_back(std::move(info));
  }
  return entries;
}

std::vector<BadEntry> DiskStore::verify(bool remove) const {
  std::vector<BadEntry> bad;
  std::time_t now = std::time(nullptr);
  for (const detail::ScannedFile& file : detail::scan(dir_)) {
    switch (file.kind) {
      case detail::FileKind::Lock:
        break;
      case detail::FileKind::Entry: {
        support::UniqueFd fd(
            support::open_retry(file.path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
        struct stat st {};
        if (!fd || ::fstat(fd.get(), &st) != 0) {
          int err = errno;
          if (err != ENOENT) bad.push_back({file.path, "unreadable: " + support::errno_text(err)});
          break;
        }
        detail::EntryCheck check = detail::read_entry(
            fd.get(), static_cast<std::uint64_t>(st.st_size), file.key, detail::ReadDepth::Full);
        if (!check.problem.empty()) {
          bad.push_back({file.path, check.problem});
          if (remove) support::unlink_if_same(file.path, st);
        }
        break;
      }
      case detail::FileKind::Temp: {
        std::time_t age = now - file.st.st_mtim.tv_sec;
        if (age < kStaleTempSeconds) break;
        bad.push_back({file.path, "stale temp file left by an interrupted store (" +
                                      std::to_string(age / 60) + " minutes old)"});
        if (remove) support::unlink_if_same(file.path, file.st);
        break;
      }
      case detail::FileKind::Unexpected:
        // Never deleted: a mistaken FUSEDOPT_CACHE_DIR must not cost the user their files.
        bad.push_back({file.path, file.is_dir ? "unexpected folder in the cache (left in place)"
                                              : "unexpected file name: not a fusedopt cache entry "
                                                "(left in place)"});
        break;
    }
  }
  return bad;
}

std::uint64_t DiskStore::prune(std::uint64_t max_bytes) const {
  std::vector<detail::ScannedFile> entries;
  std::uint64_t total = 0;
  for (detail::ScannedFile& file : detail::scan(dir_)) {
    if (file.kind != detail::FileKind::Entry) continue;
    total += static_cast<std::uint64_t>(file.st.st_size);
    entries.push_back(std::move(file));
  }
  if (total <= max_bytes) return 0;
  std::sort(entries.begin(), entries.end(), mtime_before);
  std::uint64_t removed = 0;
  for (const detail::ScannedFile& file : entries) {
    if (total <= max_bytes) break;
    auto size = static_cast<std::uint64_t>(file.st.st_size);
    // A file someone else already removed no longer counts either.
    if (::unlink(file.path.c_str()) == 0) {
      removed += size;
    } else if (errno != ENOENT) {
      continue;
    }
    total -= size;
    remove_lock_if_free(detail::lock_path_for(file.path));
  }
  return removed;
}

std::uint64_t DiskStore::clear() const {
  std::uint64_t removed = 0;
  for (const detail::ScannedFile& file : detail::scan(dir_)) {
    switch (file.kind) {
      case detail::FileKind::Entry:
      case detail::FileKind::Temp:
        if (::unlink(file.path.c_str()) == 0)
          removed += static_cast<std::uint64_t>(file.st.st_size);
        break;
      case detail::FileKind::Lock:
        remove_lock_if_free(file.path);
        break;
      case detail::FileKind::Unexpected:
        break;
    }
  }
  for (const std::filesystem::path& shard : detail::shard_dirs(dir_)) {
    ::rmdir(shard.c_str());  // fails, harmlessly, unless the sub-folder is now empty
  }
  return removed;
}

std::uint64_t DiskStore::total_bytes() const {
  std::uint64_t total = 0;
  for (const detail::ScannedFile& file : detail::scan(dir_)) {
    if (file.kind == detail::FileKind::Entry) total += static_cast<std::uint64_t>(file.st.st_size);
  }
  return total;
}

}  // namespace fusedopt::cache
