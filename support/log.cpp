// FUSEDOPT_LOG: read once; one line per message, written with a single fputs so lines from
// several threads do not interleave.
#include "support/log.hpp"

#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>

namespace fusedopt::support {

namespace {

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::Warn:
      return "warning";
    case LogLevel::Info:
      return "info";
    case LogLevel::Debug:
      return "debug";
  }
  return "?";
}

std::atomic<int> g_override{-1};

LogLevel env_level() {
  static const LogLevel level = [] {
    const char* text = std::getenv("FUSEDOPT_LOG");
    if (text == nullptr || *text == '\0') return LogLevel::Warn;
    if (std::optional<LogLevel> parsed = parse_log_level(text)) return *parsed;
    // Not an exception: a typo in a logging variable must not stop a training run.
    std::fprintf(stderr,
                 "fusedopt: warning: FUSEDOPT_LOG=%s is not valid (use warn, info or "
                 "debug); using warn\n",
                 text);
    return LogLevel::Warn;
  }();
  return level;
}

}  // namespace

std::optional<LogLevel> parse_log_level(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())))
    text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
    text.remove_suffix(1);
  std::string lower(text);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "warn" || lower == "warning") return LogLevel::Warn;
  if (lower == "info") return LogLevel::Info;
  if (lower == "debug") return LogLevel::Debug;
  return std::nullopt;
}

LogLevel log_level() {
  const int o = g_override.load(std::memory_order_relaxed);
  return o >= 0 ? static_cast<LogLevel>(o) : env_level();
}

void set_log_level(LogLevel level) {
  g_override.store(static_cast<int>(level), std::memory_order_relaxed);
}

void log(LogLevel level, const std::string& message) {
  if (!log_enabled(level)) return;
  const std::string line = std::string("fusedopt: ") + level_name(level) + ": " + message + "\n";
  std::fputs(line.c_str(), stderr);
}

}  // namespace fusedopt::support
