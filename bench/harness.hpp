// fusedopt-bench's parts as bench_main.cpp puts them together: the compile benchmarks
// (bench_compile.cpp) and a user's own case (user_case.cpp: a workload, rules, a device and
// a mode given on the command line).
#pragma once

#include <string>
#include <vector>

#include "fusedopt/optimizer.hpp"

namespace fusedopt::bench {

void register_compile_benchmarks();
/// `fusedopt-bench --probe-disk-hit TARGET DIR`: the fresh process a disk-hit benchmark runs.
int probe_compile_disk_hit(const std::string& target, const std::string& dir);
void remove_compile_dir();

/// A case of the user's own (--workload, --preset, --rule, --device, --mode).
struct UserCase {
  std::string workload;            ///< a name (workload_names()) or a shapes file
  std::vector<std::string> rules;  ///< presets, or rule files (a path with '/' or ".rule")
  std::string device = "host";     ///< host or cuda
  std::string mode = "fused";      ///< fused, per-tensor or both
  OptimizerOptions options;
};

/// Registers the benchmarks of `c` (one per rule and mode), named "case/RULE/MODE", and
/// returns the filter that selects them. Throws std::runtime_error (a bad workload, rule
/// or option) with a message for the user.
std::string register_user_case(const UserCase& c);

}  // namespace fusedopt::bench
