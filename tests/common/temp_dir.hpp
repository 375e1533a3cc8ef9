// A private (mode 0700, as the kernel cache demands) temporary folder for one test, removed
// at the end, and the file helpers every suite shares: whole-file reads and writes, a file's
// mode bits, a pid that is gone (whose temp files count as stale).
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace fusedopt::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "fusedopt-test-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    // Some tests loosen the folder's permissions on purpose; removal must still work.
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all, ec);
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

/// TMPDIR pointed at a fresh private folder for one test, restored at the end: what a test
/// sees there (compiler build folders left by killed processes, which `verify` reports) is
/// its own, not what other programs on the machine left in /tmp. Not for MPI tests, whose
/// ranks share folders by name.
class ScopedTmpdir {
 public:
  ScopedTmpdir() {
    const char* old = std::getenv("TMPDIR");
    if (old != nullptr) old_ = old;
    had_ = old != nullptr;
    ::setenv("TMPDIR", dir_.str().c_str(), 1);
  }
  ~ScopedTmpdir() {
    if (had_) {
      ::setenv("TMPDIR", old_.c_str(), 1);
    } else {
      ::unsetenv("TMPDIR");
    }
  }
  ScopedTmpdir(const ScopedTmpdir&) = delete;
  ScopedTmpdir& operator=(const ScopedTmpdir&) = delete;
  const std::filesystem::path& path() const { return dir_.path(); }

 private:
  TempDir dir_;
  std::string old_;
  bool had_ = false;
};

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
}

/// The permission bits of `p` (07777); fails the test when it cannot be stat'ed.
inline mode_t mode_of(const std::filesystem::path& p) {
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

/// A pid that is certainly not alive: a child that exited and was reaped.
inline pid_t dead_pid() {
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) ::_exit(0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  return child;
}

}  // namespace fusedopt::testing
