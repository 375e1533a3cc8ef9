// posix_spawn with stdout/stderr sent to a file: safe in multithreaded processes.
#include "jit/process.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace fusedopt::jit {

namespace {

/// Waits for `pid`; kills its process group at `timeout_seconds` (> 0). False when the exit
/// status is lost (SIGCHLD ignored): never "success".
bool wait_for(pid_t pid, double timeout_seconds, int* status, bool* timed_out) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(timeout_seconds > 0 ? timeout_seconds : 0);
  auto nap = std::chrono::milliseconds(1);
  while (true) {
    const pid_t r = waitpid(pid, status, timeout_seconds > 0 ? WNOHANG : 0);
    if (r == pid) return true;
    if (r < 0 && errno != EINTR) return false;
    if (timeout_seconds > 0 && r == 0) {
      if (std::chrono::steady_clock::now() >= deadline) {
        ::kill(-pid, SIGKILL);  // the compiler and everything it started
        *timed_out = true;
        while (waitpid(pid, status, 0) < 0 && errno == EINTR) {
        }
        return false;
      }
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::milliseconds(50));
    }
  }
}

}  // namespace

ProcessResult run_process(const std::vector<std::string>& argv, const std::string& work_dir,
                          double timeout_seconds) {
  ProcessResult result;
  const std::string log_path = work_dir + "/process.log";
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawn_file_actions_addclose(&actions, 0);
  // Compilers write temporaries next to their output: run the child in work_dir.
  pid_t pid = 0;
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 29))
  posix_spawn_file_actions_addchdir_np(&actions, work_dir.c_str());
#endif
  // A group of its own, so that a timeout kills the compiler's own children too.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  int rc = posix_spawnp(&pid, args[0], &actions, &attr, args.data(), environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    result.output = "cannot start '" + argv[0] + "': " + std::strerror(rc);
    return result;
  }
  int status = 0;
  const bool waited = wait_for(pid, timeout_seconds, &status, &result.timed_out);
  if (waited && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  std::ifstream in(log_path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  result.output = ss.str();
  return result;
}

}  // namespace fusedopt::jit
