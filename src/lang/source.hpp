// The rule text as diagnostics see it: turns a Loc into a RuleError with the file name, the
// (sanitized) source line, a caret span and a hint. Every lang error goes through here.
#pragma once

#include <string>
#include <string_view>

#include "lang/ast.hpp"

namespace fusedopt::lang {

class Source {
 public:
  Source(std::string_view text, std::string file) : text_(text), file_(std::move(file)) {}

  std::string_view text() const { return text_; }
  const std::string& file() const { return file_; }

  /// Line `line` (1-based) without its line end. Control and non-ASCII bytes become '?'
  /// so a diagnostic can never carry terminal escapes; tabs stay, so carets line up.
  std::string line_text(int line) const;

  /// Throws the RuleError for `loc`.
  [[noreturn]] void fail(const Loc& loc, const std::string& message,
                         const std::string& hint = {}) const;

 private:
  std::string_view text_;
  std::string file_;
};

}  // namespace fusedopt::lang
