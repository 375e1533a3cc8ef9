// Runs a compiler in a process group of its own, under a small supervisor that takes the
// whole group down if we die (kill -9 included), so no compiler outlives the program that
// started it. fork() then only async-signal-safe calls in the children: safe in
// multithreaded processes.
#include "compile/process.hpp"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
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
        ::kill(-pid, SIGKILL);  // the supervisor, the compiler and everything it started
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

/// The file `command` names: as given when it holds a '/', else the first executable of
/// that name on PATH; "" when there is none.
std::string find_executable(const std::string& command) {
  if (command.find('/') != std::string::npos) return command;
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "/usr/local/bin:/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + command;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

/// The supervisor's answer to its parent's death (PR_SET_PDEATHSIG): the whole group dies.
void kill_group(int) { ::kill(0, SIGKILL); }

/// In the supervisor (a child of ours, leader of a new group): runs the compiler as its own
/// child and exits with its status. Only async-signal-safe calls.
[[noreturn]] void supervise(pid_t parent, const char* file, char* const* argv, char* const* envp,
                            const char* work_dir, const char* log_path, int report_fd) {
  ::setpgid(0, 0);
  struct sigaction plain {};
  plain.sa_handler = SIG_DFL;
  ::sigaction(SIGCHLD, &plain, nullptr);  // inherited SIG_IGN would lose the exit status
  struct sigaction on_death {};
  on_death.sa_handler = kill_group;
  ::sigaction(SIGTERM, &on_death, nullptr);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  if (::getppid() != parent) kill_group(0);  // we died before the death signal was armed
  const pid_t compiler = ::fork();
  if (compiler == 0) {
    ::sigaction(SIGTERM, &plain, nullptr);
    int err = 0;
    const int log = ::open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (log < 0 || null < 0 || ::chdir(work_dir) != 0 || ::dup2(null, 0) < 0 ||
        ::dup2(log, 1) < 0 || ::dup2(log, 2) < 0) {
      err = errno;
    } else {
      ::execve(file, argv, envp);
      err = errno;
    }
    (void)!::write(report_fd, &err, sizeof err);
    ::_exit(127);
  }
  if (compiler < 0) {
    const int err = errno;
    (void)!::write(report_fd, &err, sizeof err);
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(compiler, &status, 0) < 0 && errno == EINTR) {
  }
  ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}

}  // namespace

ProcessResult run_process(const std::vector<std::string>& argv, const std::string& work_dir,
                          double timeout_seconds) {
  ProcessResult result;
  const std::string log_path = work_dir + "/process.log";
  const std::string file = find_executable(argv.at(0));
  if (file.empty()) {
    result.output = "cannot start '" + argv[0] + "': " + std::strerror(ENOENT);
    return result;
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // The compiler's own temporaries go into the build folder, removed with it.
  std::vector<std::string> env_strings;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (std::strncmp(*e, "TMPDIR=", 7) != 0) env_strings.emplace_back(*e);
  }
  env_strings.push_back("TMPDIR=" + work_dir);
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  // The compiler reports a failure to start (errno) through this pipe.
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) {
    result.output = std::string("cannot start '") + argv[0] + "': " + std::strerror(errno);
    return result;
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(report[0]);
    supervise(parent, file.c_str(), args.data(), envp.data(), work_dir.c_str(), log_path.c_str(),
              report[1]);
  }
  ::close(report[1]);
  if (pid < 0) {
    ::close(report[0]);
    result.output = std::string("cannot start '") + argv[0] + "': " + std::strerror(errno);
    return result;
  }
  // The group exists from the child's setpgid; set it here too, so that a timeout's kill
  // reaches it even if the child has not run yet.
  ::setpgid(pid, pid);
  int status = 0;
  const bool waited = wait_for(pid, timeout_seconds, &status, &result.timed_out);
  int start_error = 0;
  const bool not_started = ::read(report[0], &start_error, sizeof start_error) ==
                           static_cast<ssize_t>(sizeof start_error);
  ::close(report[0]);
  if (not_started) {
    result.output = "cannot start '" + argv[0] + "': " + std::strerror(start_error);
    return result;
  }
  if (waited && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  std::ifstream in(log_path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  result.output = ss.str();
  return result;
}

}  // namespace fusedopt::jit
