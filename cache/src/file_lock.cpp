// Per-key lock files. Lock files may be deleted (by clear() and prune()) while other
// processes use them, so after flock() succeeds we check that the path still names the file
// we locked; if it was unlinked or replaced, we lock the new one instead. Together with
// deleting a lock file only while holding its lock, this keeps "one holder per key" true.
#include "file_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>

#include <cerrno>

#include "fusedopt/error.hpp"
#include "support/file_io.hpp"
#include "trusted_open.hpp"

namespace fusedopt::cache::detail {

using support::errno_text;
using support::make_dir;
using support::open_retry;
using support::UniqueFd;

namespace {

/// True when `fd` is still the file that `path` names.
bool still_linked(int fd, const std::filesystem::path& path) {
  struct stat held {};
  struct stat named {};
  if (::fstat(fd, &held) != 0 || ::lstat(path.c_str(), &named) != 0) return false;
  return held.st_dev == named.st_dev && held.st_ino == named.st_ino;
}

int flock_retry(int fd, int operation) {
  int rc;
  do {
    rc = ::flock(fd, operation);
  } while (rc != 0 && errno == EINTR);
  return rc;
}

}  // namespace

FileLock::FileLock(const std::filesystem::path& path) : path_(path) {
  int attempts = 0;
  for (;;) {
    UniqueFd fd(open_retry(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    // clear() may remove an empty sub-folder between our mkdir and this open.
    if (!fd && errno == ENOENT && attempts++ < 3 && make_dir(path.parent_path(), 0700)) continue;
    // A folder or a link at the lock's name (in our private sub-folder): removed, never
    // followed, so that the key is not compiled uncached by every process from now on.
    if (!fd && (errno == EISDIR || errno == ELOOP) && attempts++ < 3) {
      const int err = errno;
      const int left = remove_stray(AT_FDCWD, path.string(), path);
      if (left == 0) continue;
      throw CacheError("cannot open cache lock file " + path.string() + ": " + errno_text(err) +
                       ", and it could not be removed: " + errno_text(left) + "; remove it");
    }
    if (!fd) {
      int err = errno;
      throw CacheError("cannot open cache lock file " + path.string() + ": " + errno_text(err));
    }
    if (flock_retry(fd.get(), LOCK_EX) != 0) {
      int err = errno;
      throw CacheError("cannot lock cache lock file " + path.string() + ": " + errno_text(err));
    }
    if (still_linked(fd.get(), path)) {
      fd_ = std::move(fd);
      return;
    }
  }
}

std::optional<FileLock> FileLock::try_lock_existing(const std::filesystem::path& path) {
  UniqueFd fd(open_retry(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) return std::nullopt;
  if (flock_retry(fd.get(), LOCK_EX | LOCK_NB) != 0) return std::nullopt;
  if (!still_linked(fd.get(), path)) return std::nullopt;
  return FileLock(path, std::move(fd));
}

}  // namespace fusedopt::cache::detail
