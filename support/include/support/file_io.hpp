// POSIX file helpers shared by the kernel cache and the checkpoint writer: reads and writes
// that retry on EINTR and short counts, open retried on EINTR, folder creation and fsync,
// and thread-safe errno text for error messages.
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <filesystem>
#include <string>

#include "support/unique_fd.hpp"

namespace fusedopt::support {

/// strerror text for `err`, thread-safe.
std::string errno_text(int err);

/// Writes all `n` bytes; false (errno set) on failure.
bool write_all(int fd, const char* data, std::size_t n);
/// Reads until `n` bytes or end of file; the count read, or -1 (errno set) on an error.
long read_full(int fd, char* data, std::size_t n);
/// Reads exactly `n` bytes; false (errno set; EIO when the file ends first) otherwise.
bool read_exact(int fd, char* data, std::size_t n);

/// open(2) retried on EINTR.
int open_retry(const char* path, int flags, mode_t mode = 0);

/// mkdir(2) with `mode`; true when it was created or already is a folder. errno on failure.
bool make_dir(const std::filesystem::path& dir, mode_t mode);

/// fsyncs a folder so that a rename inside it survives a crash ("" means the current
/// folder). false (errno set) on failure; file systems without folder fsync count as success.
bool fsync_dir(const std::filesystem::path& dir);

}  // namespace fusedopt::support
