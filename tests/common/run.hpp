// Runs the fusedopt-cache binary (FUSEDOPT_CACHE_CLI) with arguments, capturing stdout,
// stderr and the exit code.
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <optional>
#include <string>
#include <vector>

#include "common/temp_dir.hpp"

namespace fusedopt::testing {

struct CliResult {
  int code = -1;
  std::string out;
  std::string err;
};

/// How to run it: extra environment, and optionally another binary and another user.
struct RunOptions {
  std::vector<std::string> env;  ///< NAME=VALUE pairs added to the environment
  std::string binary;            ///< default: FUSEDOPT_CACHE_CLI
  std::optional<uid_t> as_user;  ///< run as this uid and gid (needs root)
};

/// Execs the CLI in a child with stdout/stderr in files.
inline CliResult run_cli(const std::vector<std::string>& args, const RunOptions& options) {
  TempDir io;
  std::string out_path = (io.path() / "out").string(), err_path = (io.path() / "err").string();
  pid_t pid = fork();
  if (pid == 0) {
    int o = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int e = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(o, 1);
    dup2(e, 2);
    // A TMPDIR of its own (unless the test gives one): what the CLI finds there (build
    // folders left by killed processes, which verify reports) is the test's alone.
    const std::string tmpdir = "TMPDIR=" + io.str();
    putenv(const_cast<char*>(tmpdir.c_str()));
    for (const std::string& kv : options.env) putenv(const_cast<char*>(kv.c_str()));
    if (options.as_user) {
      const uid_t id = *options.as_user;
      if (setgroups(0, nullptr) != 0 || setgid(id) != 0 || setuid(id) != 0) _exit(126);
    }
    std::vector<char*> argv;
    std::string cli = options.binary.empty() ? std::string(FUSEDOPT_CACHE_CLI) : options.binary;
    argv.push_back(cli.data());
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CliResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_file(out_path);
  r.err = read_file(err_path);
  return r;
}

/// run_cli with `env` (NAME=VALUE pairs) added to the environment.
inline CliResult run_cli(const std::vector<std::string>& args,
                         const std::vector<std::string>& env = {}) {
  RunOptions options;
  options.env = env;
  return run_cli(args, options);
}

}  // namespace fusedopt::testing
