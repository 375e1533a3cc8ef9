// An owning POSIX file descriptor, so that every early return and throw closes it.
#pragma once

namespace fusedopt::support {

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

}  // namespace fusedopt::support
