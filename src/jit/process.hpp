// Runs a program without a shell (so no argument is ever interpreted) and captures its
// output.
#pragma once

#include <string>
#include <vector>

namespace fusedopt::jit {

struct ProcessResult {
  int exit_code = -1;  ///< -1 when it could not start or died of a signal
  std::string output;  ///< stdout and stderr together
};

/// Runs argv[0] (looked up in PATH) with `argv`, in `work_dir`.
ProcessResult run_process(const std::vector<std::string>& argv, const std::string& work_dir);

}  // namespace fusedopt::jit
