// Argument parsing and formatting helpers of fusedopt-cache.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli.hpp"
#include "fusedopt/error.hpp"
#include "support/file_io.hpp"
#include "support/parse_size.hpp"
#include "support/text.hpp"
#include "support/unique_fd.hpp"

namespace fusedopt::cli {

namespace {
/// The rule language's limit on a rule's text (kMaxRuleBytes, src/lang/limits.hpp).
constexpr std::uint64_t kMaxRuleFileBytes = 1 << 20;
}  // namespace

std::optional<std::string> Args::option(const std::string& name) {
  if (done()) return std::nullopt;
  const std::string& a = args_[pos_];
  if (a == name) {
    if (pos_ + 1 >= args_.size()) throw UsageError{name + " needs a value"};
    pos_ += 2;
    return args_[pos_ - 1];
  }
  if (a.size() > name.size() && a.compare(0, name.size(), name) == 0 && a[name.size()] == '=') {
    ++pos_;
    return a.substr(name.size() + 1);
  }
  return std::nullopt;
}

bool Args::flag(const std::string& name) {
  if (!done() && args_[pos_] == name) {
    ++pos_;
    return true;
  }
  return false;
}

std::uint64_t parse_bytes(const std::string& text, const std::string& what) {
  std::string problem;
  if (std::optional<std::uint64_t> bytes = support::parse_size(text, &problem)) return *bytes;
  throw UsageError{what + " '" + text + "' " + problem};
}

std::string human_bytes(std::uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", v, units[u]);
}

std::string read_rule_file(const std::string& path) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(st)) {
    throw UsageError{"cannot read rule file '" + path + "': there is no such file"};
  }
  if (std::filesystem::is_directory(st)) {
    throw UsageError{"'" + path + "' is a folder, not a rule file"};
  }
  // O_NONBLOCK: a FIFO (refused below) must not block the open until a writer comes.
  support::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  struct stat info {};
  if (!fd || ::fstat(fd.get(), &info) != 0) {
    throw UsageError{"cannot read rule file '" + path + "': " + support::errno_text(errno)};
  }
  if (!S_ISREG(info.st_mode)) {
    throw UsageError{"'" + path + "' is not a regular file (a FIFO, a device or a socket), " +
                     "not a rule file"};
  }
  // Never more than the limit and one byte: a huge file is refused without being read.
  if (static_cast<std::uint64_t>(info.st_size) > kMaxRuleFileBytes) {
    throw UsageError{fmt::format("rule file '{}' is {} bytes, more than the limit of {} bytes",
                                 path, info.st_size, kMaxRuleFileBytes)};
  }
  std::string text(kMaxRuleFileBytes + 1, '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd.get(), &text[got], text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw UsageError{"cannot read rule file '" + path + "': " + support::errno_text(errno)};
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got > kMaxRuleFileBytes) {
    throw UsageError{
        fmt::format("rule file '{}' is more than the limit of {} bytes", path, kMaxRuleFileBytes)};
  }
  text.resize(got);
  return text;
}

int json_errors(bool json, const std::function<int()>& body) {
  try {
    return body();
  } catch (const UsageError& e) {
    if (json) fmt::print("{{\"error\": {}}}\n", json_string(e.message));
    throw;
  } catch (const std::exception& e) {
    if (json) fmt::print("{{\"error\": {}}}\n", json_string(e.what()));
    throw;
  }
}

std::string json_string(const std::string& s) {
  std::string out;
  support::append_json_string(out, s, true);  // paths need not be UTF-8: ASCII out
  return out;
}

cache::KernelCache::Options cache_options(const std::optional<std::string>& cache_dir) {
  cache::KernelCache::Options o;
  try {
    o = cache::KernelCache::options_from_env();
  } catch (const CacheError& e) {
    throw UsageError{e.what()};  // a bad FUSEDOPT_CACHE* value is bad input
  }
  if (cache_dir) {
    if (cache_dir->empty()) throw UsageError{"--cache-dir is empty"};
    o.dir = *cache_dir;
  }
  o.mode = cache::KernelCache::Mode::On;
  return o;
}

cache::DiskStore open_store(const std::optional<std::string>& cache_dir, bool create) {
  const std::filesystem::path dir = cache_options(cache_dir).dir;
  std::error_code ec;
  if (!create && !std::filesystem::exists(std::filesystem::symlink_status(dir, ec))) {
    throw UsageError{"cache folder " + dir.string() +
                     " does not exist: nothing was ever cached there (check --cache-dir or "
                     "FUSEDOPT_CACHE_DIR; `fusedopt-cache warmup` creates it)"};
  }
  try {
    return cache::DiskStore(dir);
  } catch (const CacheError& e) {
    throw UsageError{e.what()};
  }
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string part; std::getline(ss, part, ',');) {
    if (!part.empty()) out.push_back(part);
  }
  return out;
}

std::vector<std::string> list_value(const char* name, const std::string& value) {
  std::vector<std::string> items = split_commas(value);
  if (items.empty()) throw UsageError{std::string(name) + " needs a value, got ''"};
  return items;
}

}  // namespace fusedopt::cli
