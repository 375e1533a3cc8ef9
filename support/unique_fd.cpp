// An owning POSIX file descriptor (see unique_fd.hpp).
#include "support/unique_fd.hpp"

#include <unistd.h>

#include <cerrno>

namespace fusedopt::support {

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

void UniqueFd::reset(int fd) {
  // close() is not retried on EINTR: on Linux the descriptor is released either way.
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

int UniqueFd::close_checked() {
  if (fd_ < 0) return 0;
  int rc = ::close(fd_);
  fd_ = -1;
  return rc == 0 ? 0 : errno;
}

}  // namespace fusedopt::support
