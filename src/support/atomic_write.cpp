// Atomic publish of a whole file (see atomic_write.hpp).
#include "support/atomic_write.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <random>

#include "support/file_io.hpp"
#include "support/unique_fd.hpp"

namespace fusedopt::support {

namespace {

std::string random_hex() {
  // The pid in temp names separates forked processes (which copy this state); the random
  // part separates threads and hosts sharing the folder.
  thread_local std::mt19937_64 rng = [] {
    std::random_device rd;
    std::seed_seq seed{rd(), rd(), rd(), rd(), static_cast<unsigned>(::getpid())};
    return std::mt19937_64(seed);
  }();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(rng()));
  return buf;
}

/// Removes the temp file unless it was published.
class TempFileGuard {
 public:
  explicit TempFileGuard(std::filesystem::path path) : path_(std::move(path)) {}
  ~TempFileGuard() {
    if (armed_) ::unlink(path_.c_str());
  }
  TempFileGuard(const TempFileGuard&) = delete;
  TempFileGuard& operator=(const TempFileGuard&) = delete;
  void disarm() { armed_ = false; }

 private:
  std::filesystem::path path_;
  bool armed_ = true;
};

}  // namespace

std::string AtomicWriteResult::message(const std::filesystem::path& target) const {
  if (ok()) return {};
  const std::filesystem::path& file =
      std::string_view(step) == "fsync folder" || std::string_view(step) == "mkdir" ? folder : temp;
  return "cannot write " + target.string() + " (" + step + " " + file.string() +
         "): " + errno_text(err);
}

AtomicWriteResult atomic_write(const std::filesystem::path& path, std::string_view bytes,
                               const AtomicWriteOptions& options) {
  return atomic_write(
      path, [bytes](int fd) { return write_all(fd, bytes.data(), bytes.size()); }, options);
}

AtomicWriteResult atomic_write(const std::filesystem::path& path, const FileWriter& writer,
                               const AtomicWriteOptions& options) {
  AtomicWriteResult result;
  result.folder = path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path();
  auto failed = [&](const char* step, int err) {
    result.step = step;
    result.err = err != 0 ? err : EIO;  // a failure must never read as success
    return result;
  };
  const std::string stem = options.temp_stem.empty() ? path.filename().string() : options.temp_stem;

  UniqueFd fd;
  for (int attempt = 0; !fd; ++attempt) {
    if (options.create_folder && !make_dir(result.folder, *options.create_folder)) {
      return failed("mkdir", errno);
    }
    result.temp = path.parent_path() /
                  ("." + stem + "." + std::to_string(::getpid()) + "." + random_hex() + ".tmp");
    fd.reset(open_retry(result.temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
                        options.mode));
    // ENOENT: someone removed the (empty) folder just after our mkdir; EEXIST: a name clash.
    bool retry = (errno == EEXIST || (errno == ENOENT && options.create_folder)) && attempt < 3;
    if (!fd && !retry) return failed("create", errno);
  }
  TempFileGuard guard(result.temp);
  if (!writer(fd.get())) return failed("write", errno);
  if (::fsync(fd.get()) != 0) return failed("fsync", errno);
  if (int err = fd.close_checked(); err != 0) return failed("close", err);
  if (::rename(result.temp.c_str(), path.c_str()) != 0) return failed("rename", errno);
  guard.disarm();
  if (!fsync_dir(result.folder)) return failed("fsync folder", errno);
  return result;
}

}  // namespace fusedopt::support
