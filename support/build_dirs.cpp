// Build folders of compiles (see build_dirs.hpp).
#include "support/build_dirs.hpp"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <string_view>

#include "fusedopt/error.hpp"
#include "support/file_io.hpp"

namespace fusedopt::support {

namespace {

constexpr std::string_view kPrefix = "fusedopt-build-";
/// Folders of the older name carry no pid: one untouched this long is no longer in use.
constexpr std::time_t kOldNameStaleSeconds = 24 * 3600;

std::filesystem::path temp_base() {
  std::error_code ec;
  std::filesystem::path base = temp_folder(ec);
  if (ec) {
    throw IoError("no temporary folder for the compiler (check TMPDIR=" + base.string() +
                  "): " + ec.message());
  }
  return base;
}

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

/// The pid in a build folder's name (0 for the older name without one), or -1 when the name
/// is not a build folder's.
long long pid_in_name(std::string_view name) {
  if (name.substr(0, kPrefix.size()) != kPrefix) return -1;
  std::string_view rest = name.substr(kPrefix.size());
  if (rest.size() == 6 && rest.find('-') == std::string_view::npos) return 0;  // older name
  const std::size_t dash = rest.find('-');
  if (dash == std::string_view::npos || rest.size() - dash - 1 != 6) return -1;
  const std::string_view digits = rest.substr(0, dash);
  if (!all_digits(digits) || digits.size() > 9) return -1;
  return std::stoll(std::string(digits));
}

std::uint64_t tree_bytes(const std::filesystem::path& dir) {
  std::uint64_t total = 0;
  std::error_code ec;
  for (std::filesystem::recursive_directory_iterator
           it(dir, std::filesystem::directory_options::skip_permission_denied, ec),
       end;
       !ec && it != end; it.increment(ec)) {
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      total += static_cast<std::uint64_t>(st.st_size);
    }
  }
  return total;
}

}  // namespace

std::filesystem::path temp_folder(std::error_code& ec) {
  ec.clear();
  std::filesystem::path folder = "/tmp";
  // std::filesystem::temp_directory_path's variables, but an empty one is unset (POSIX's
  // convention: an empty TMPDIR means /tmp), where it refuses the empty path.
  for (const char* name : {"TMPDIR", "TMP", "TEMP", "TEMPDIR"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && *value != '\0') {
      folder = value;
      break;
    }
  }
  if (!std::filesystem::is_directory(folder, ec) && !ec) {
    ec = std::make_error_code(std::errc::not_a_directory);
  }
  return folder;
}

bool process_alive(pid_t pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  // A zombie (killed, not yet reaped: a container's init may never reap it) is gone too.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // no /proc: kill() said it exists
  const std::size_t paren = line.rfind(')');
  return paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'Z';
}

std::filesystem::path make_build_dir(const std::filesystem::path& base) {
  const std::filesystem::path folder = base.empty() ? temp_base() : base;
  std::string tmpl =
      (folder / (std::string(kPrefix) + std::to_string(::getpid()) + "-XXXXXX")).string();
  if (::mkdtemp(tmpl.data()) == nullptr) {
    throw IoError("cannot create a build folder for the compiler in " + folder.string() + ": " +
                  errno_text(errno));
  }
  return tmpl;
}

void remove_build_dir(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);  // removes links, does not follow them
}

std::vector<StaleBuildDir> stale_build_dirs(const std::filesystem::path& base) {
  std::vector<StaleBuildDir> out;
  std::filesystem::path folder = base;
  if (folder.empty()) {
    std::error_code ec;
    folder = temp_folder(ec);
    if (ec) return out;
  }
  const std::time_t now = std::time(nullptr);
  std::error_code ec;
  for (std::filesystem::directory_iterator it(folder, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const long long pid = pid_in_name(name);
    if (pid < 0) continue;
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) {
      continue;  // a link, a file, or another user's: not ours to judge
    }
    if (pid == 0 ? now - st.st_mtime < kOldNameStaleSeconds
                 : (pid == ::getpid() || process_alive(static_cast<pid_t>(pid)))) {
      continue;
    }
    out.push_back({it->path(), static_cast<pid_t>(pid), tree_bytes(it->path())});
  }
  return out;
}

}  // namespace fusedopt::support
