// The disk tier's maintenance operations (list, verify, prune, clear), the face of the
// `fusedopt-cache` CLI. They tolerate a folder in use: files that vanish mid-scan are
// skipped, and a lock file is only deleted while we hold its lock.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <optional>

#include "cache/disk_store.hpp"
#include "disk_layout.hpp"
#include "entry_format.hpp"
#include "file_lock.hpp"
#include "fusedopt/error.hpp"
#include "support/atomic_write.hpp"
#include "support/build_dirs.hpp"
#include "support/file_io.hpp"
#include "trusted_open.hpp"

namespace fusedopt::cache {

namespace {

// When a temp file is stale: the rule every atomic write follows (support/atomic_write.hpp:
// kDeadWriterGraceSeconds for a writer whose pid is gone from this host, kStaleTempSeconds
// whoever wrote it), so the cache and checkpoint saves cannot drift apart.
using support::kDeadWriterGraceSeconds;
using support::kStaleTempSeconds;

/// Why temp file `file` is stale ("" while it may be in use).
std::string stale_temp_reason(const detail::ScannedFile& file, std::time_t now) {
  const std::time_t age = now - file.st.st_mtim.tv_sec;
  pid_t pid = 0;
  if (age >= kDeadWriterGraceSeconds &&
      support::parse_temp_name(file.path.filename().string(), &pid) && pid != ::getpid() &&
      !support::process_alive(pid)) {
    return "stale temp file left by process " + std::to_string(pid) +
           ", which is gone (an interrupted store)";
  }
  if (age >= kStaleTempSeconds) {
    return "stale temp file left by an interrupted store (" + std::to_string(age / 60) +
           " minutes old)";
  }
  return "";
}

std::string build_dir_reason(const support::StaleBuildDir& dir) {
  const std::string owner = dir.pid != 0 ? "process " + std::to_string(dir.pid) + ", which is gone"
                                         : "an older fusedopt, untouched for a day";
  return "stale compiler build folder of " + owner + " (" + std::to_string(dir.bytes) + " bytes)";
}

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

/// An entry found by scan(), opened again through descriptors: its sub-folder (re-checked,
/// without following links) and the file itself (checked on the descriptor that is read).
struct ReopenedEntry {
  support::UniqueFd shard;
  std::string name;
  detail::OpenedEntry entry;
};

ReopenedEntry reopen(int top_fd, const std::filesystem::path& dir,
                     const std::filesystem::path& path) {
  ReopenedEntry out;
  out.name = path.filename().string();
  try {
    out.shard = detail::open_sub_folder(top_fd, dir, path.parent_path().filename().string(), false);
  } catch (const CacheError& e) {
    out.entry.problem = std::string("in an unsafe sub-folder: ") + e.what();
    return out;
  }
  if (!out.shard) {
    out.entry.err = ENOENT;  // the sub-folder vanished: a concurrent clear()
    return out;
  }
  out.entry = detail::open_entry(out.shard.get(), out.name);
  return out;
}

/// verify(true)'s removal of bad file `name` in the folder open on `dir_fd` (AT_FDCWD with a
/// path), if it is still the file `st` describes: sets `b.removed` only when that file is
/// really gone, else adds to `b.reason` why it is still there (a read-only folder).
void remove_bad(int dir_fd, const std::string& name, const struct stat& st, BadEntry& b) {
  errno = 0;
  detail::unlink_at_if_same(dir_fd, name, st);
  const int err = errno;
  struct stat now {};
  b.removed = ::fstatat(dir_fd, name.c_str(), &now, AT_SYMLINK_NOFOLLOW) != 0 ||
              now.st_dev != st.st_dev || now.st_ino != st.st_ino;
  if (!b.removed) b.reason += "; could not remove it: " + support::errno_text(err ? err : EPERM);
}

/// Removes stray `file` (FileKind::Stray); "" when it is gone, else why it is not.
std::string remove_stray_file(const detail::ScannedFile& file) {
  const int err = detail::remove_stray(AT_FDCWD, file.path.string(), file.path);
  return err == 0 ? "" : support::errno_text(err);
}

/// Whether temp file `file` belongs to a store in progress in a live process of this host
/// (its name's pid), which clear() must leave for the store to publish.
bool store_in_progress(const detail::ScannedFile& file, std::time_t now) {
  pid_t pid = 0;
  return now - file.st.st_mtim.tv_sec < kStaleTempSeconds &&
         support::parse_temp_name(file.path.filename().string(), &pid) &&
         support::process_alive(pid);
}

/// verify()'s judgement of entry `file`: nullopt when it is good (or gone meanwhile).
std::optional<BadEntry> verify_entry(int top_fd, const std::filesystem::path& dir,
                                     const detail::ScannedFile& file, bool remove,
                                     const PayloadCheck& payload_check) {
  ReopenedEntry opened = reopen(top_fd, dir, file.path);
  detail::OpenedEntry& entry = opened.entry;
  if (entry.err == ENOENT) return std::nullopt;  // removed meanwhile
  if (!entry.problem.empty()) {
    // Not ours, writable by others, a link, not a regular file: never read.
    BadEntry b{file.path, entry.problem};
    if (remove && opened.shard && entry.err != ENOENT) {
      if (entry.fd) {
        detail::unlink_at_if_same(opened.shard.get(), opened.name, entry.st);
      } else if (entry.err == ELOOP) {
        ::unlinkat(opened.shard.get(), opened.name.c_str(), 0);
      }
      struct stat left {};
      b.removed =
          ::fstatat(opened.shard.get(), opened.name.c_str(), &left, AT_SYMLINK_NOFOLLOW) != 0;
    }
    return b;
  }
  detail::EntryCheck check =
      detail::read_entry(entry.fd.get(), static_cast<std::uint64_t>(entry.st.st_size), file.key,
                         detail::ReadDepth::Full);
  std::string problem = check.problem;
  if (problem.empty() && payload_check) {
    // Whole, but not a binary anyone can load (a compiler that exited 0 with bad output).
    problem = payload_check(file.ext, check.payload);
  }
  if (problem.empty()) return std::nullopt;
  BadEntry b{file.path, problem};
  if (remove) remove_bad(opened.shard.get(), opened.name, entry.st, b);
  return b;
}

}  // namespace

std::vector<EntryInfo> DiskStore::list() const {
  std::vector<EntryInfo> entries;
  support::UniqueFd top = detail::open_cache_folder(dir_);
  for (const detail::ScannedFile& file : detail::scan(dir_)) {
    if (file.kind != detail::FileKind::Entry) continue;
    EntryInfo info;
    info.key = file.key;
    info.ext = file.ext;
    info.path = file.path;
    info.file_bytes = static_cast<std::uint64_t>(file.st.st_size);
    info.last_used = static_cast<std::int64_t>(file.st.st_mtim.tv_sec);
    ReopenedEntry opened = reopen(top.get(), dir_, file.path);
    const detail::OpenedEntry& entry = opened.entry;
    if (entry.fd) {
      info.file_bytes = static_cast<std::uint64_t>(entry.st.st_size);
      info.last_used = static_cast<std::int64_t>(entry.st.st_mtim.tv_sec);
    }
    // An entry we must not trust is listed, but its header is not read.
    if (entry.fd && entry.problem.empty()) {
      detail::EntryCheck check =
          detail::read_entry(entry.fd.get(), info.file_bytes, file.key, detail::ReadDepth::Header);
      if (check.problem.empty()) {
        info.payload_bytes = check.payload_bytes;
        if (auto record = KeyRecord::deserialize(check.record_bytes)) info.record = *record;
      }
    }
    entries.push_back(std::move(info));
  }
  return entries;
}

std::vector<BadEntry> DiskStore::verify(bool remove, const PayloadCheck& check) const {
  std::vector<BadEntry> bad;
  std::time_t now = std::time(nullptr);
  support::UniqueFd top = detail::open_cache_folder(dir_);
  for (const detail::ScannedFile& file : detail::scan(dir_)) {
    switch (file.kind) {
      case detail::FileKind::Lock:
        break;
      case detail::FileKind::Entry:
        if (auto b = verify_entry(top.get(), dir_, file, remove, check))
          bad.push_back(std::move(*b));
        break;
      case detail::FileKind::Stray: {
        BadEntry b{file.path, file.reason +
                                  " at a cache file's name, not a cache file (never "
                                  "followed)"};
        if (remove) {
          const std::string left = remove_stray_file(file);
          b.removed = left.empty();
          if (!b.removed) b.reason += "; could not remove it: " + left;
        }
        bad.push_back(std::move(b));
        break;
      }
      case detail::FileKind::Unsafe:
        // Left in place: it may hold another user's files, and only a person should decide.
        bad.push_back({file.path, detail::unsafe_sub_folder_message(file.path, file.reason) +
                                      " (left in place; its contents were not examined)"});
        break;
      case detail::FileKind::Temp: {
        std::string reason = stale_temp_reason(file, now);
        if (reason.empty()) break;
        BadEntry b{file.path, std::move(reason)};
        if (remove) remove_bad(AT_FDCWD, file.path.string(), file.st, b);
        bad.push_back(std::move(b));
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
  // Build folders of compiles whose process died (in the temporary folder, not the cache).
  for (const support::StaleBuildDir& dir : support::stale_build_dirs()) {
    BadEntry b{dir.path, build_dir_reason(dir)};
    if (remove) {
      support::remove_build_dir(dir.path);
      std::error_code ec;
      b.removed = !std::filesystem::exists(dir.path, ec) && !ec;
      if (!b.removed) b.reason += "; could not remove it";
    }
    bad.push_back(std::move(b));
  }
  return bad;
}

Removal DiskStore::remove_stale() const {
  Removal out;
  const std::time_t now = std::time(nullptr);
  for (const detail::ScannedFile& file : detail::scan(dir_)) {
    if (file.kind == detail::FileKind::Stray) {
      // A link, folder or FIFO at a cache file's name: it would make its key uncacheable.
      if (std::string left = remove_stray_file(file); !left.empty()) {
        out.leftovers.push_back({file.path, std::move(left)});
      }
      continue;
    }
    if (file.kind != detail::FileKind::Temp || stale_temp_reason(file, now).empty()) continue;
    if (::unlink(file.path.c_str()) == 0) {
      out.removed_bytes += static_cast<std::uint64_t>(file.st.st_size);
    } else if (errno != ENOENT) {
      out.leftovers.push_back({file.path, support::errno_text(errno)});
    }
  }
  for (const support::StaleBuildDir& dir : support::stale_build_dirs()) {
    support::remove_build_dir(dir.path);
    std::error_code ec;
    if (std::filesystem::exists(dir.path, ec)) {
      out.leftovers.push_back({dir.path, "cannot remove the stale build folder"});
    } else {
      out.removed_bytes += dir.bytes;
    }
  }
  return out;
}

Removal DiskStore::prune(std::uint64_t max_bytes) const {
  Removal out = remove_stale();
  std::vector<detail::ScannedFile> entries;
  std::uint64_t total = 0;
  for (detail::ScannedFile& file : detail::scan(dir_)) {
    if (file.kind != detail::FileKind::Entry) continue;
    total += static_cast<std::uint64_t>(file.st.st_size);
    entries.push_back(std::move(file));
  }
  if (total <= max_bytes) return out;
  std::sort(entries.begin(), entries.end(), mtime_before);
  for (const detail::ScannedFile& file : entries) {
    if (total <= max_bytes) break;
    auto size = static_cast<std::uint64_t>(file.st.st_size);
    // A file someone else already removed no longer counts either.
    if (::unlink(file.path.c_str()) == 0) {
      out.removed_bytes += size;
    } else if (errno != ENOENT) {
      out.leftovers.push_back({file.path, support::errno_text(errno)});
      continue;
    }
    total -= size;
    remove_lock_if_free(detail::lock_path_for(file.path));
  }
  return out;
}

Removal DiskStore::clear() const {
  Removal out;
  const std::time_t now = std::time(nullptr);
  for (const detail::ScannedFile& file : detail::scan(dir_)) {
    switch (file.kind) {
      case detail::FileKind::Stray:
        if (std::string left = remove_stray_file(file); !left.empty()) {
          out.leftovers.push_back({file.path, std::move(left)});
        }
        break;
      case detail::FileKind::Temp:
        // A store in progress publishes its entry after the clear: left for it.
        if (store_in_progress(file, now)) break;
        [[fallthrough]];
      case detail::FileKind::Entry:
        if (::unlink(file.path.c_str()) == 0) {
          out.removed_bytes += static_cast<std::uint64_t>(file.st.st_size);
        } else if (errno != ENOENT) {
          out.leftovers.push_back({file.path, support::errno_text(errno)});
        }
        break;
      case detail::FileKind::Lock:
        remove_lock_if_free(file.path);
        break;
      case detail::FileKind::Unsafe:
        // Not entered: it may hold another user's files (see verify).
        out.leftovers.push_back(
            {file.path, detail::unsafe_sub_folder_message(file.path, file.reason)});
        break;
      case detail::FileKind::Unexpected:
        break;
    }
  }
  for (const std::filesystem::path& shard : detail::shard_dirs(dir_)) {
    ::rmdir(shard.c_str());  // fails, harmlessly, unless the sub-folder is now empty
  }
  for (const support::StaleBuildDir& dir : support::stale_build_dirs()) {
    support::remove_build_dir(dir.path);
    out.removed_bytes += dir.bytes;
  }
  return out;
}

std::uint64_t DiskStore::total_bytes() const {
  std::uint64_t total = 0;
  for (const detail::ScannedFile& file : detail::scan(dir_)) {
    if (file.kind == detail::FileKind::Entry) total += static_cast<std::uint64_t>(file.st.st_size);
  }
  return total;
}

}  // namespace fusedopt::cache
