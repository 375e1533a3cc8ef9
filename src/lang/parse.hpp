// Entry points of the rule language: text in, checked Rule out, or a RuleError.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "lang/ast.hpp"

namespace fusedopt::lang {

/// Largest rule text accepted, in bytes (a clear RuleError beyond it).
inline constexpr std::size_t kMaxRuleBytes = 1 << 20;
/// Deepest expression tree accepted (parentheses, unary chains and operator chains all
/// count); deeper input is a RuleError, never a stack overflow.
inline constexpr int kMaxExprDepth = 256;

/// Lexes, parses and checks `text`. `file` names the source in diagnostics. Throws
/// fusedopt::RuleError for any malformed input.
std::shared_ptr<const Rule> parse_rule(std::string_view text, const std::string& file);

}  // namespace fusedopt::lang
