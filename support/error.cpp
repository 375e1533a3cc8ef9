// Formatting of the exception types declared in include/fusedopt/error.hpp.
#include "fusedopt/error.hpp"

#include <algorithm>

namespace fusedopt {
namespace {

std::string format_rule_error(const std::string& file, int line, int column,
                              const std::string& message, const std::string& source_line,
                              int length, const std::string& hint) {
  std::string out =
      file + ":" + std::to_string(line) + ":" + std::to_string(column) + ": error: " + message;
  if (!source_line.empty() || column > 0) {
    out += "\n  " + source_line + "\n  ";
    // The caret line keeps tabs so it lines up under the source line in a terminal.
    int col = std::max(column, 1);
    for (int i = 0; i + 1 < col; ++i) {
      out += (i < static_cast<int>(source_line.size()) && source_line[i] == '\t') ? '\t' : ' ';
    }
    out += '^';
    for (int i = 1; i < length; ++i) out += '~';
  }
  if (!hint.empty()) out += "\nhint: " + hint;
  return out;
}

}  // namespace

RuleError::RuleError(std::string file, int line, int column, std::string message,
                     std::string source_line, int length, std::string hint)
    : Error(format_rule_error(file, line, column, message, source_line, length, hint)),
      file_(std::move(file)),
      line_(line),
      column_(column),
      message_(std::move(message)),
      source_line_(std::move(source_line)),
      hint_(std::move(hint)) {}

CompileError::CompileError(std::string summary, std::string log, std::vector<std::string> options,
                           std::string source)
    : Error(summary + (log.empty() ? std::string() : "\n" + log)),
      log_(std::move(log)),
      options_(std::move(options)),
      source_(std::move(source)) {}

CudaError::CudaError(std::string call, int code, std::string result_name, std::string site)
    : Error(call + " failed: " + result_name + " (" + std::to_string(code) + ") at " + site),
      call_(std::move(call)),
      code_(code) {}

}  // namespace fusedopt
