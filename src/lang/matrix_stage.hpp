// The checks of a matrix stage call, orthogonalize(x[, steps, a, b, c, ..., eps]): x varies
// per element (each tensor's matrix) and depends on no other stage; the iteration's numbers
// are literals or hypers, 1 argument (Muon's iteration), 5 (steps and one triple; eps 1e-7)
// or 3 + 3k (steps, k triples, eps), in range as written (hypers: their defaults; the
// runtime checks the values groups set).
#pragma once

#include "lang/ast.hpp"
#include "lang/source.hpp"

namespace fusedopt::lang {

/// The stage of call `e` (its arguments resolved), scheduled in the pass where its argument
/// is first known. `state`: the state whose initial value holds the call, or nullptr.
/// Throws RuleError at the offending argument.
MatrixStage check_matrix_stage(const Source& src, const Rule& rule, const Expr& e,
                               const Symbol* state);

/// Refuses reduction `e` (function `name`) of an argument that depends on a stage's result.
void check_not_staged(const Source& src, const Expr& e, const Expr& arg, const char* name);

/// Refuses stages in a factored rule (one with row or column values).
void check_stages_fit(const Source& src, const Rule& rule);

}  // namespace fusedopt::lang
