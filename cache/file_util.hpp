// POSIX helpers for the disk tier: an owning descriptor, reads and writes that retry on
// EINTR and short counts, directory creation and fsync, and errno text for CacheError.
#pragma once

#include <sys/stat.h>

#include <filesystem>
#include <string>

namespace fusedopt::cache::detail {

/// Owns a file descriptor; closes it (ignoring errors) when destroyed.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);
  /// Closes now and reports close()'s errno (0 on success); write-back errors surface here.
  int close_checked();

 private:
  int fd_ = -1;
};

/// strerror text for `err`, thread-safe.
std::string errno_text(int err);

/// Writes all `n` bytes; false (errno set) on failure.
bool write_all(int fd, const char* data, std::size_t n);
/// Reads until `n` bytes or end of file; the count read, or -1 (errno set) on an error.
long read_full(int fd, char* data, std::size_t n);

/// open(2) retried on EINTR.
int open_retry(const char* path, int flags, mode_t mode = 0);

/// mkdir(2) with `mode`; true when it was created or already is a folder. errno on failure.
bool make_dir(const std::filesystem::path& dir, mode_t mode);

/// fsyncs a folder so that a rename inside it survives a crash. false (errno set) on failure.
bool fsync_dir(const std::filesystem::path& dir);

/// Unlinks `path` only if it still names the file described by `opened` (same device and
/// inode), so that a reader never deletes an entry that a writer has just renamed into place.
void unlink_if_same(const std::filesystem::path& path, const struct stat& opened);

}  // namespace fusedopt::cache::detail
