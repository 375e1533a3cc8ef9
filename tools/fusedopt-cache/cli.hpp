// Shared pieces of the fusedopt-cache commands: argument parsing, exit codes, output.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cache/kernel_cache.hpp"

namespace fusedopt::cli {

/// Exit codes (STYLE.md), the same for every command: success, a failed operation, bad
/// input. kExitCodesHelp says so at the end of every --help.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr const char* kExitCodesHelp = R"(
exit codes (every command):
  0  success
  1  a failed operation: a bad entry found, a compile that failed, an entry
     that could not be stored or removed, a disk error
  2  bad input: arguments, rule files (errors at FILE:LINE:COL), an unusable
     cache folder, a bad FUSEDOPT_CACHE* value
)";

/// Bad command-line input: reported as "fusedopt-cache: error: ..." with exit 2.
struct UsageError {
  std::string message;
};

/// A tiny argument cursor: `--name value`, `--name=value` and flags.
class Args {
 public:
  explicit Args(std::vector<std::string> args) : args_(std::move(args)) {}
  bool done() const { return pos_ >= args_.size(); }
  const std::string& peek() const { return args_[pos_]; }
  std::string next() { return args_[pos_++]; }
  /// If the current argument is `--name` or `--name=...`, consumes it (and its value)
  /// and returns the value.
  std::optional<std::string> option(const std::string& name);
  /// If the current argument is `--name`, consumes it.
  bool flag(const std::string& name);

 private:
  std::vector<std::string> args_;
  std::size_t pos_ = 0;
};

/// Parses "123", "64K", "10m", "2GiB" (binary units; support::parse_size, the parser
/// FUSEDOPT_CACHE_MAX_BYTES uses too). Throws UsageError naming `what`.
std::uint64_t parse_bytes(const std::string& text, const std::string& what);
/// The text of a rule file. A missing file, a folder or a read failure is a UsageError that
/// names the file and says which.
std::string read_rule_file(const std::string& path);
/// The non-empty comma-separated parts of `s`.
std::vector<std::string> split_commas(const std::string& s);
/// The comma-separated items of `--name value`; an empty list is bad input, not a default.
std::vector<std::string> list_value(const char* name, const std::string& value);
/// "1.5 MiB"-style sizes.
std::string human_bytes(std::uint64_t bytes);
/// Runs `body`; when it throws and `json` is set, first prints {"error": MESSAGE} on stdout,
/// so that --json always prints JSON, then lets the exception go on to main (exit code and
/// message as without --json).
int json_errors(bool json, const std::function<int()>& body);
/// JSON string literal.
std::string json_string(const std::string& s);

/// The cache options: the environment, then `--cache-dir` if given. Always mode On.
cache::KernelCache::Options cache_options(const std::optional<std::string>& cache_dir);
/// The disk store of cache_options(cache_dir). A folder that cannot be used (unsafe
/// permissions, not a folder) is bad input: UsageError. Failures after that are not.
/// The cache folder's store; `create` (warmup) makes the folder, the other commands never
/// do: a folder that does not exist is a UsageError (a mistyped --cache-dir).
cache::DiskStore open_store(const std::optional<std::string>& cache_dir, bool create = false);

int cmd_warmup(Args& args);
int cmd_list(Args& args);
int cmd_verify(Args& args);
int cmd_prune(Args& args);
int cmd_clear(Args& args);
int cmd_check(Args& args);
int cmd_presets(Args& args);

/// Parses the options every command shares (--help, --cache-dir); `extra` handles the rest:
/// it takes what it knows from `args` and returns true, else false (an unexpected argument).
template <typename Extra>
std::optional<std::string> parse_common(Args& args, const char* help, bool* wants_help,
                                        Extra extra) {
  std::optional<std::string> cache_dir;
  *wants_help = false;
  while (!args.done()) {
    if (args.flag("--help") || args.flag("-h")) {
      std::fputs(help, stdout);
      std::fputs(kExitCodesHelp, stdout);
      *wants_help = true;
      return cache_dir;
    }
    if (auto v = args.option("--cache-dir")) {
      cache_dir = v;
    } else if (!extra(args)) {
      throw UsageError{"unexpected argument '" + args.peek() + "'"};
    }
  }
  return cache_dir;
}

}  // namespace fusedopt::cli
