// Atomic publish of a whole file (see atomic_write.hpp).
#include "support/atomic_write.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <optional>
#include <random>
#include <string_view>

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

/// Removes `.<stem>.<pid>.<16 hex>.tmp` files in `folder` that are stale (see
/// AtomicWriteOptions::remove_stale_temps). Best effort: a file another process removes
/// first, or one we may not remove, is left alone.
void remove_stale_temps(const std::filesystem::path& folder) {
  std::error_code ec;
  const std::time_t now = std::time(nullptr);
  for (std::filesystem::directory_iterator it(folder, ec), end; !ec && it != end;
       it.increment(ec)) {
    pid_t pid = 0;
    struct stat st {};
    if (!parse_temp_name(it->path().filename().string(), &pid) || pid == ::getpid() ||
        ::lstat(it->path().c_str(), &st) != 0) {
      continue;
    }
    const long age = static_cast<long>(now - st.st_mtim.tv_sec);
    const bool gone = ::kill(pid, 0) != 0 && errno == ESRCH;
    if ((gone && age >= kDeadWriterGraceSeconds) || age >= kStaleTempSeconds) {
      ::unlink(it->path().c_str());
    }
  }
}

/// Whether something that is not a regular file is at `path` (not following a link).
bool non_regular_at(const std::filesystem::path& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode);
}

/// The permission bits of the file at `path`, if a regular file is there.
std::optional<mode_t> existing_mode(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  return st.st_mode & 07777;
}

}  // namespace

bool parse_temp_name(const std::string& name, pid_t* pid) {
  // From the right: ".tmp", 16 hex digits, '.', the pid's digits, '.', then a stem after a
  // leading '.'.
  constexpr std::string_view kTail = ".tmp";
  if (name.size() < 1 + 1 + 1 + 1 + 16 + kTail.size() || name.front() != '.') return false;
  if (name.compare(name.size() - kTail.size(), kTail.size(), kTail) != 0) return false;
  const std::size_t hex_end = name.size() - kTail.size(), hex_begin = hex_end - 16;
  for (std::size_t i = hex_begin; i < hex_end; ++i) {
    if (!std::isxdigit(static_cast<unsigned char>(name[i]))) return false;
  }
  if (name[hex_begin - 1] != '.') return false;
  const std::size_t pid_end = hex_begin - 1;
  std::size_t pid_begin = pid_end;
  while (pid_begin > 1 && std::isdigit(static_cast<unsigned char>(name[pid_begin - 1]))) {
    --pid_begin;
  }
  // 1 to 9 digits: every pid Linux hands out (at most 2^22) fits, and so does an int.
  if (pid_begin == pid_end || pid_end - pid_begin > 9 || pid_begin < 2) return false;
  if (name[pid_begin - 1] != '.') return false;
  const long value = std::stol(name.substr(pid_begin, pid_end - pid_begin));
  if (value <= 0) return false;
  *pid = static_cast<pid_t>(value);
  return true;
}

std::string AtomicWriteResult::message(const std::filesystem::path& target) const {
  if (ok()) return {};
  if (std::string_view(step) == "target") {
    return "cannot write " + target.string() +
           ": it exists and is not a regular file (a link, FIFO, device or folder), which a "
           "write does not replace";
  }
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
  const std::string stem =
      (options.temp_stem.empty() ? path.filename().string() : options.temp_stem)
          .substr(0, kMaxTempStemBytes);
  if (options.regular_target_only && non_regular_at(path)) return failed("target", EEXIST);
  if (options.remove_stale_temps) remove_stale_temps(result.folder);
  // An overwritten file keeps its permissions (a 0600 checkpoint stays private); the temp is
  // created with them so that the new contents are never more widely readable.
  const std::optional<mode_t> kept = existing_mode(path);

  UniqueFd fd;
  for (int attempt = 0; !fd; ++attempt) {
    if (options.create_folder && !make_dir(result.folder, *options.create_folder)) {
      return failed("mkdir", errno);
    }
    result.temp = path.parent_path() /
                  ("." + stem + "." + std::to_string(::getpid()) + "." + random_hex() + ".tmp");
    fd.reset(open_retry(result.temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
                        kept.value_or(options.mode)));
    // ENOENT: someone removed the (empty) folder just after our mkdir; EEXIST: a name clash.
    bool retry = (errno == EEXIST || (errno == ENOENT && options.create_folder)) && attempt < 3;
    if (!fd && !retry) return failed("create", errno);
  }
  TempFileGuard guard(result.temp);
  // The umask narrowed the create mode; the kept mode is restored exactly.
  if (kept && ::fchmod(fd.get(), *kept) != 0) return failed("chmod", errno);
  if (!writer(fd.get())) return failed("write", errno);
  if (::fsync(fd.get()) != 0) return failed("fsync", errno);
  if (int err = fd.close_checked(); err != 0) return failed("close", err);
  // Again just before the rename: a FIFO or link made meanwhile is not replaced either.
  if (options.regular_target_only && non_regular_at(path)) return failed("target", EEXIST);
  if (::rename(result.temp.c_str(), path.c_str()) != 0) return failed("rename", errno);
  guard.disarm();
  if (!fsync_dir(result.folder)) return failed("fsync folder", errno);
  return result;
}

}  // namespace fusedopt::support
