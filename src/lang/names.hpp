// The language's fixed vocabulary in one place: the function table (name, Op, arity), the
// keywords, and the names a rule may not declare. Adding a function is adding a row here.
#pragma once

#include <string_view>
#include <vector>

#include "lang/ast.hpp"

namespace fusedopt::lang {

/// One built-in function. Reductions will be rows with `reduction = true`; the checker
/// splits the rule into phases at them.
struct FunctionInfo {
  const char* name;
  Op op;
  int arity;
  const char* signature;  ///< for arity hints: "clamp(x, lo, hi)"
  bool boolean;           ///< returns a truth value (isfinite)
  bool reduction;         ///< reduces over a tensor or all tensors (not yet: always false)
};

/// Every built-in function, in the order hints list them.
const std::vector<FunctionInfo>& functions();
/// The function called `name`, or nullptr.
const FunctionInfo* find_function(std::string_view name);
/// The function whose Op is `op`, or nullptr (Number, Ref and operators have none).
const FunctionInfo* function_of(Op op);

/// Names of reductions the language reserves for the reductions issue (not callable yet).
bool is_future_reduction(std::string_view name);

/// Why `name` may not name a symbol (keyword, built-in function, `step`, C++ keyword,
/// reserved prefix), or nullptr when it may. Worded to follow "cannot declare 'x': ",
/// e.g. "it is a built-in function".
const char* reserved_reason(std::string_view name);

/// Language keywords (param grad state hyper output and or not).
bool is_keyword(std::string_view name);

}  // namespace fusedopt::lang
