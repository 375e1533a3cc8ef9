// Runs a program without a shell (so no argument is ever interpreted) and captures its
// output.
#pragma once

#include <string>
#include <vector>

namespace fusedopt::jit {

struct ProcessResult {
  int exit_code = -1;      ///< -1 when it could not start, died of a signal or timed out
  bool timed_out = false;  ///< killed (with everything it started) at the time limit
  std::string output;      ///< stdout and stderr together
};

/// Runs argv[0] (looked up in PATH) with `argv`, in `work_dir`, in a process group of its
/// own. With `timeout_seconds` > 0, the group is killed (SIGKILL) when it runs longer.
ProcessResult run_process(const std::vector<std::string>& argv, const std::string& work_dir,
                          double timeout_seconds = 0);

}  // namespace fusedopt::jit
