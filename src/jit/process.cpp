// posix_spawn with stdout/stderr sent to a file: safe in multithreaded processes.
#include "jit/process.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

extern char** environ;

namespace fusedopt::jit {

ProcessResult run_process(const std::vector<std::string>& argv, const std::string& work_dir) {
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
  int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    result.output = "cannot start '" + argv[0] + "': " + std::strerror(rc);
    return result;
  }
  int status = 0;
  bool waited = true;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      waited = false;  // e.g. SIGCHLD ignored: the exit status is lost, never "success"
      break;
    }
  }
  if (waited && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  std::ifstream in(log_path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  result.output = ss.str();
  return result;
}

}  // namespace fusedopt::jit
