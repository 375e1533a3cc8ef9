// Runs the fusedopt-cache binary (FUSEDOPT_CACHE_CLI) with arguments, capturing stdout,
// stderr and the exit code.
#pragma once

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "support/temp_dir.hpp"

namespace fusedopt::testing {

struct CliResult {
  int code = -1;
  std::string out;
  std::string err;
};

/// Execs the CLI in a child with stdout/stderr in files; `env` adds NAME=VALUE pairs.
inline CliResult run_cli(const std::vector<std::string>& args,
                         const std::vector<std::string>& env = {}) {
  TempDir io;
  std::string out_path = (io.path() / "out").string(), err_path = (io.path() / "err").string();
  pid_t pid = fork();
  if (pid == 0) {
    int o = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int e = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(o, 1);
    dup2(e, 2);
    for (const std::string& kv : env) putenv(const_cast<char*>(kv.c_str()));
    std::vector<char*> argv;
    std::string cli = FUSEDOPT_CACHE_CLI;
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

}  // namespace fusedopt::testing
