// Opening the cache's folders and entries without trusting what others may have planted
// (see trusted_open.hpp and the threat model in docs/cache.md).
#include "trusted_open.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "fusedopt/error.hpp"
#include "support/file_io.hpp"

namespace fusedopt::cache::detail {

namespace {

using support::errno_text;
using support::UniqueFd;

std::string octal_mode(mode_t mode) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

int openat_retry(int dir_fd, const char* name, int flags, mode_t mode = 0) {
  int fd;
  do {
    fd = ::openat(dir_fd, name, flags, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

/// The refusals of the top folder; the messages predate the sub-folder checks.
void check_cache_folder(const std::filesystem::path& dir, const struct stat& st) {
  if (!S_ISDIR(st.st_mode)) {
    throw CacheError("cache folder " + dir.string() +
                     " is not a folder: remove it or set FUSEDOPT_CACHE_DIR");
  }
  if (st.st_uid != ::geteuid()) {
    throw CacheError("cache folder " + dir.string() + " is owned by uid " +
                     std::to_string(st.st_uid) + ", not by you (uid " +
                     std::to_string(::geteuid()) +
                     "): use a folder you own by setting FUSEDOPT_CACHE_DIR");
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    throw CacheError("cache folder " + dir.string() + " is writable by group or others (mode " +
                     octal_mode(st.st_mode) + "): run `chmod go-w " + dir.string() +
                     "` or set FUSEDOPT_CACHE_DIR");
  }
}

}  // namespace

std::string untrusted_reason(const struct stat& st) {
  if (st.st_uid != ::geteuid()) {
    return "owned by uid " + std::to_string(st.st_uid) + ", not by you (uid " +
           std::to_string(::geteuid()) + ")";
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return "writable by group or others (mode " + octal_mode(st.st_mode) + ")";
  }
  return {};
}

UniqueFd open_cache_folder(const std::filesystem::path& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    int err = errno;
    throw CacheError("cannot open cache folder " + dir.string() + ": " + errno_text(err));
  }
  check_cache_folder(dir, st);
  UniqueFd fd(support::open_retry(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) {
    int err = errno;
    throw CacheError("cannot open cache folder " + dir.string() + ": " + errno_text(err));
  }
  // Judge the folder actually opened, not the one stat() saw a moment before.
  if (::fstat(fd.get(), &st) != 0) {
    int err = errno;
    throw CacheError("cannot open cache folder " + dir.string() + ": " + errno_text(err));
  }
  check_cache_folder(dir, st);
  return fd;
}

std::string unsafe_sub_folder_message(const std::filesystem::path& path, const std::string& why) {
  return "cache sub-folder " + path.string() + " is " + why +
         ": another user may have planted entries in it, and a chmod does not remove them; "
         "delete it with `rm -rf " +
         path.string() + "` (the cache recreates it)";
}

UniqueFd open_sub_folder(int dir_fd, const std::filesystem::path& dir, const std::string& name,
                         bool create) {
  const std::filesystem::path path = dir / name;
  constexpr int kFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
  UniqueFd fd(openat_retry(dir_fd, name.c_str(), kFlags));
  if (!fd && errno == ENOENT && create) {
    if (::mkdirat(dir_fd, name.c_str(), 0700) != 0 && errno != EEXIST) {
      int err = errno;
      throw CacheError("cannot create cache folder " + path.string() + ": " + errno_text(err));
    }
    fd.reset(openat_retry(dir_fd, name.c_str(), kFlags));  // checked below like any other
  }
  if (!fd) {
    int err = errno;
    if (err == ENOENT) return fd;
    if (err == ELOOP || err == ENOTDIR) {
      struct stat st {};
      bool link =
          ::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode);
      throw CacheError(
          unsafe_sub_folder_message(path, link ? "a symbolic link, not a folder"
                                               : "not a folder (" + errno_text(ENOTDIR) + ")"));
    }
    throw CacheError("cannot open cache folder " + path.string() + ": " + errno_text(err));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    int err = errno;
    throw CacheError("cannot open cache folder " + path.string() + ": " + errno_text(err));
  }
  if (std::string why = untrusted_reason(st); !why.empty()) {
    throw CacheError(unsafe_sub_folder_message(path, why));
  }
  return fd;
}

OpenedEntry open_entry(int dir_fd, const std::string& name) {
  OpenedEntry entry;
  // O_NONBLOCK: a planted FIFO must not hang the open; it is refused below as not regular.
  entry.fd.reset(
      openat_retry(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (!entry.fd) {
    entry.err = errno;
    entry.problem = entry.err == ELOOP ? "a symbolic link, not a cache entry (not followed)"
                                       : "unreadable: " + support::errno_text(entry.err);
    return entry;
  }
  if (::fstat(entry.fd.get(), &entry.st) != 0) {
    entry.err = errno;
    entry.problem = "unreadable: " + support::errno_text(entry.err);
    entry.fd.reset();
    return entry;
  }
  if (!S_ISREG(entry.st.st_mode)) {
    entry.problem = "not a regular file (not read)";
  } else if (std::string why = untrusted_reason(entry.st); !why.empty()) {
    entry.problem = why +
                    ": not loaded; delete it (or, for a cache you copied here, chown it to "
                    "yourself and chmod go-w)";
  }
  if (entry.problem.empty()) {
    // Back to blocking reads for the regular file we are about to read.
    int flags = ::fcntl(entry.fd.get(), F_GETFL);
    if (flags >= 0) ::fcntl(entry.fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  }
  return entry;
}

int remove_stray(int dir_fd, const std::string& name, const std::filesystem::path& path) {
  struct stat st {};
  if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return errno == ENOENT ? 0 : errno;
  }
  if (S_ISREG(st.st_mode)) return EEXIST;  // a file: its owner's checks decide, not this
  if (S_ISDIR(st.st_mode)) {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);  // removes links, does not follow them
    return ec ? ec.value() : 0;
  }
  return ::unlinkat(dir_fd, name.c_str(), 0) == 0 || errno == ENOENT ? 0 : errno;
}

void unlink_at_if_same(int dir_fd, const std::string& name, const struct stat& opened) {
  struct stat now {};
  if (::fstatat(dir_fd, name.c_str(), &now, AT_SYMLINK_NOFOLLOW) != 0) return;
  if (now.st_dev == opened.st_dev && now.st_ino == opened.st_ino) {
    ::unlinkat(dir_fd, name.c_str(), 0);
  }
}

}  // namespace fusedopt::cache::detail
