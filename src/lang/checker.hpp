// The semantic pass: resolves names to symbols, enforces the declaration and assignment
// rules, and derives what code generation needs (reaching definitions, uniform and
// boolean flags, phases).
#pragma once

#include "lang/ast.hpp"
#include "lang/parser.hpp"
#include "lang/source.hpp"

namespace fusedopt::lang {

/// Checks `parsed` (consuming its expressions) into `rule`'s symbols, statements and
/// phases. Throws RuleError on the first semantic error, in text order where possible, then
/// for the first count past a limit (check_limits, limits.hpp).
void check_rule(const Source& source, ParsedRule& parsed, Rule& rule);

}  // namespace fusedopt::lang
