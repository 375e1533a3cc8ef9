// Runs a program without a shell (so no argument is ever interpreted) and captures its
// output.
#pragma once

#include <string>
#include <vector>

namespace fusedopt::jit {

struct ProcessResult {
  /// Its exit status; 128 + the signal when a signal ended it; -1 when it could not start or
  /// timed out.
  int exit_code = -1;
  bool timed_out = false;  ///< killed (with everything it started) at the time limit
  std::string output;      ///< stdout and stderr together
};

/// Runs argv[0] (looked up in PATH) with `argv`, in `work_dir` with TMPDIR=`work_dir`, in a
/// process group of its own under a supervisor that kills the group when this process dies
/// (even by SIGKILL). With `timeout_seconds` > 0, the group is killed (SIGKILL) when it
/// runs longer.
ProcessResult run_process(const std::vector<std::string>& argv, const std::string& work_dir,
                          double timeout_seconds = 0);

}  // namespace fusedopt::jit
