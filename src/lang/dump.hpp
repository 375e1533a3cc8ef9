// A compact, stable text form of checked rules (S-expressions), for tests and debugging:
// `-a^2` dumps as "(neg (^ a 2))".
#pragma once

#include <string>

#include "lang/ast.hpp"

namespace fusedopt::lang {

/// The spelling of an operator or function in dumps: "+", "neg", "sqrt", ...
const char* op_name(Op op);

/// `e` as an S-expression; names come from `rule`'s symbols.
std::string dump(const Rule& rule, const Expr& e);

/// `e` as rule text, for messages: operators infix, a child in parentheses where it binds
/// looser than its place needs (`where(g > 0, 1, 0)`, `(a + b) * c`, `-a ^ 2`).
std::string source_form(const Rule& rule, const Expr& e);

/// Every statement, one per line: "target = S-expression".
std::string dump(const Rule& rule);

}  // namespace fusedopt::lang
