// POSIX file helpers (see file_io.hpp).
#include "support/file_io.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace fusedopt::support {

std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r may return a static string instead of filling buf.
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
  const char* text = strerror_r(err, buf, sizeof buf);
  return text;
#else
  if (strerror_r(err, buf, sizeof buf) != 0) return "error " + std::to_string(err);
  return buf;
#endif
}

bool write_all(int fd, const char* data, std::size_t n) {
  while (n > 0) {
    ssize_t wrote = ::write(fd, data, n);
    if (wrote < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (wrote == 0) {
      errno = EIO;
      return false;
    }
    data += wrote;
    n -= static_cast<std::size_t>(wrote);
  }
  return true;
}

long read_full(int fd, char* data, std::size_t n) {
  std::size_t done = 0;
  while (done < n) {
    ssize_t got = ::read(fd, data + done, n - done);
    if (got < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  return static_cast<long>(done);
}

bool read_exact(int fd, char* data, std::size_t n) {
  long got = read_full(fd, data, n);
  if (got < 0) return false;
  if (static_cast<std::size_t>(got) != n) {
    errno = EIO;  // the file ended (or shrank while we read it)
    return false;
  }
  return true;
}

int open_retry(const char* path, int flags, mode_t mode) {
  int fd;
  do {
    fd = ::open(path, flags, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

bool make_dir(const std::filesystem::path& dir, mode_t mode) {
  if (::mkdir(dir.c_str(), mode) == 0) return true;
  if (errno != EEXIST) return false;
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return false;
  if (!S_ISDIR(st.st_mode)) {
    errno = ENOTDIR;
    return false;
  }
  return true;
}

bool fsync_dir(const std::filesystem::path& dir) {
  const std::filesystem::path folder = dir.empty() ? std::filesystem::path(".") : dir;
  UniqueFd fd(open_retry(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) return false;
  if (::fsync(fd.get()) != 0 && errno != EINVAL) return false;  // EINVAL: fs without dir fsync
  return true;
}

}  // namespace fusedopt::support
