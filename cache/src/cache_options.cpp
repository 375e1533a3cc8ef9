// KernelCache::options_from_env(): FUSEDOPT_CACHE, FUSEDOPT_CACHE_DIR and
// FUSEDOPT_CACHE_MAX_BYTES. A value we cannot parse is an error, never silently ignored:
// a typo in FUSEDOPT_CACHE=of must not leave caching on.
#include <pwd.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <vector>

#include "cache/kernel_cache.hpp"
#include "fusedopt/error.hpp"
#include "support/parse_size.hpp"
#include "support/text.hpp"

namespace fusedopt::cache {

namespace {

using support::trimmed_lower;

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

KernelCache::Mode parse_mode(const std::string& text) {
  std::string value = trimmed_lower(text);
  if (value == "off") return KernelCache::Mode::Off;
  if (value == "memory") return KernelCache::Mode::Memory;
  if (value == "on") return KernelCache::Mode::On;
  throw CacheError("FUSEDOPT_CACHE=" + text + " is not valid: use off, memory or on");
}

std::uint64_t parse_max_bytes(const std::string& text) {
  if (std::optional<std::uint64_t> bytes = support::parse_size(text)) return *bytes;
  throw CacheError("FUSEDOPT_CACHE_MAX_BYTES=" + text +
                   " is not a size: use a number of bytes, optionally followed by K, M or G "
                   "(powers of 1024), e.g. 512M");
}

/// ${XDG_CACHE_HOME:-$HOME/.cache}/fusedopt; "" when neither can be found.
std::filesystem::path default_dir() {
  // The XDG spec says a relative XDG_CACHE_HOME is invalid and must be ignored.
  std::string xdg = env("XDG_CACHE_HOME");
  if (!xdg.empty() && xdg.front() == '/') return std::filesystem::path(xdg) / "fusedopt";
  std::string home = env("HOME");
  if (home.empty()) {
    std::vector<char> buf(16384);
    passwd pw{};
    passwd* found = nullptr;
    if (::getpwuid_r(::geteuid(), &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr &&
        found->pw_dir != nullptr) {
      home = found->pw_dir;
    }
  }
  if (home.empty()) return {};
  return std::filesystem::path(home) / ".cache" / "fusedopt";
}

}  // namespace

KernelCache::Options KernelCache::options_from_env() {
  Options options;
  if (std::string mode = env("FUSEDOPT_CACHE"); !mode.empty()) options.mode = parse_mode(mode);
  if (std::string max = env("FUSEDOPT_CACHE_MAX_BYTES"); !max.empty()) {
    options.max_disk_bytes = parse_max_bytes(max);
  }
  if (std::string dir = env("FUSEDOPT_CACHE_DIR"); !dir.empty()) {
    options.dir = dir;
  } else {
    options.dir = default_dir();
  }
  if (options.dir.empty() && options.mode == Mode::On) {
    throw CacheError(
        "cannot choose a cache folder: neither XDG_CACHE_HOME nor HOME is set; set "
        "FUSEDOPT_CACHE_DIR (or FUSEDOPT_CACHE=memory)");
  }
  return options;
}

}  // namespace fusedopt::cache
