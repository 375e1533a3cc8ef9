// fusedopt-cache: warm, list, verify, prune and clear the kernel cache; check rules.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>

#include "cli.hpp"
#include "fusedopt/error.hpp"

namespace {

constexpr const char* kUsage = R"(usage: fusedopt-cache COMMAND [OPTIONS]

Manage fusedopt's kernel cache and check optimizer rules.

commands:
  warmup    compile rules or presets for targets and dtypes into the cache
  list      show the entries of the cache (a table, or --json)
  verify    re-hash every entry; exit 1 naming each bad one
  prune     evict least recently used entries down to --max-bytes
  clear     remove every entry
  check     parse and check rule files only
  presets   list the preset rules

Every command takes --cache-dir DIR (default: $FUSEDOPT_CACHE_DIR, else
${XDG_CACHE_HOME:-$HOME/.cache}/fusedopt) and --help.
)";

}  // namespace

int main(int argc, char** argv) {
  using namespace fusedopt::cli;
  std::vector<std::string> all(argv + 1, argv + argc);
  if (all.empty() || all[0] == "--help" || all[0] == "-h" || all[0] == "help") {
    std::FILE* out = all.empty() ? stderr : stdout;
    std::fputs(kUsage, out);
    std::fputs(kExitCodesHelp, out);
    return all.empty() ? kExitBadInput : kExitOk;
  }
  const std::map<std::string, std::function<int(Args&)>> commands = {
      {"warmup", cmd_warmup}, {"list", cmd_list},   {"verify", cmd_verify},  {"prune", cmd_prune},
      {"clear", cmd_clear},   {"check", cmd_check}, {"presets", cmd_presets}};
  auto it = commands.find(all[0]);
  if (it == commands.end()) {
    fmt::print(stderr, "fusedopt-cache: error: unknown command '{}'\n\n{}", all[0], kUsage);
    return kExitBadInput;
  }
  Args args(std::vector<std::string>(all.begin() + 1, all.end()));
  try {
    return it->second(args);
  } catch (const UsageError& e) {
    fmt::print(stderr, "fusedopt-cache {}: error: {}\n(see fusedopt-cache {} --help)\n", all[0],
               e.message, all[0]);
    return kExitBadInput;
  } catch (const fusedopt::RuleError& e) {
    fmt::print(stderr, "{}\n", e.what());
    return kExitBadInput;
  } catch (const fusedopt::UsageError& e) {
    fmt::print(stderr, "fusedopt-cache {}: error: {}\n", all[0], e.what());
    return kExitBadInput;
  } catch (const fusedopt::Error& e) {
    // A failed operation (an unusable cache folder, a disk error, a missing compiler), not
    // bad input.
    fmt::print(stderr, "fusedopt-cache {}: error: {}\n", all[0], e.what());
    return kExitFailed;
  } catch (const std::exception& e) {
    fmt::print(stderr, "fusedopt-cache {}: internal error: {}\n", all[0], e.what());
    return kExitFailed;
  }
}
