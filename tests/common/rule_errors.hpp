// Shared helpers for the lang tests: parse a rule expecting failure and hand back the
// RuleError so a test can check its line, column, message and hint.
#pragma once

#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <string_view>

#include "fusedopt/error.hpp"
#include "lang/dump.hpp"
#include "lang/parse.hpp"

namespace fusedopt::testing {

/// The declarations most tests start from.
inline const std::string kHeader = "param p\ngrad g\nhyper lr = 0.1\n";

/// The RuleError that parsing `text` throws, or nothing (and a failed check) when it parses.
inline std::optional<RuleError> parse_error(std::string_view text,
                                            const std::string& file = "test.rule") {
  try {
    lang::parse_rule(text, file);
  } catch (const RuleError& e) {
    return e;
  }
  FAIL_CHECK("expected a RuleError, but the rule parsed: ", std::string(text.substr(0, 200)));
  return std::nullopt;
}

/// True when `haystack` contains `needle` (doctest prints both on failure via CHECK).
inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace fusedopt::testing

/// Checks that parsing `text` fails at LINE:COL with a message containing `substr`.
#define FUSEDOPT_CHECK_RULE_ERROR(text, line_, col_, substr)                                     \
  do {                                                                                           \
    auto fo_err_ = ::fusedopt::testing::parse_error(text);                                       \
    if (fo_err_) {                                                                               \
      CHECK(fo_err_->line() == (line_));                                                         \
      CHECK(fo_err_->column() == (col_));                                                        \
      CHECK_MESSAGE(::fusedopt::testing::contains(fo_err_->message(), substr), fo_err_->what()); \
    }                                                                                            \
  } while (0)
