// The library's diagnostics on stderr, filtered by FUSEDOPT_LOG=warn|info|debug (read once,
// default warn): "fusedopt: info: <message>".
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace fusedopt::support {

enum class LogLevel { Warn = 0, Info = 1, Debug = 2 };

/// "warn", "info", "debug" (any case, surrounding blanks ignored); nullopt otherwise.
std::optional<LogLevel> parse_log_level(std::string_view text);
/// The level from FUSEDOPT_LOG, read on first use (an unknown value warns once and means
/// warn), unless set_log_level() overrode it.
LogLevel log_level();
/// Overrides the level for the rest of the process (tests, embedding applications).
void set_log_level(LogLevel level);
/// Whether a message of `level` would be printed.
inline bool log_enabled(LogLevel level) { return level <= log_level(); }
/// Prints "fusedopt: <level>: <message>" to stderr when `level` is enabled.
void log(LogLevel level, const std::string& message);

}  // namespace fusedopt::support
