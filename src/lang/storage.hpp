// A rule's `storage` declarations (default block-quantized storage of its states) and the
// proof of which states are never negative (Symbol::nonnegative), which picks the unsigned
// map for "q8" and "q4".
#pragma once

#include <vector>

#include "lang/ast.hpp"
#include "lang/parser.hpp"
#include "lang/source.hpp"

namespace fusedopt::lang {

/// After check_rule: resolves `decls` into rule.storage (RuleError at the name or the kind:
/// not a state, an unknown kind, a state given twice) and marks the states proven
/// non-negative.
void check_storage(const Source& source, const std::vector<StorageDecl>& decls, Rule& rule);

}  // namespace fusedopt::lang
