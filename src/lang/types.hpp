// The rule language's two types: booleans (comparisons, and/or/not, isfinite,
// *_any_nonfinite, where() of two booleans, temporaries holding one) and numbers. Each
// operator takes its own; a mix is a RuleError whose hint names the fix.
#pragma once

#include <string_view>

#include "lang/ast.hpp"
#include "lang/source.hpp"

namespace fusedopt::lang {

/// Checks the operands of `e` (resolved, with their boolean flags) against what its operator
/// takes: booleans for and/or/not and where()'s condition, one kind for both branches of
/// where() and both sides of == and !=, numbers for everything else.
void check_kinds(const Source& src, const Rule& rule, const Expr& e);

/// `a` is an operand of `op`, which computes with numbers.
void check_number_operand(const Source& src, const Rule& rule, const Expr& a, std::string_view op);

}  // namespace fusedopt::lang
