// The language's fixed vocabulary in one place: the function table (name, Op, arity), the
// keywords, and the names a rule may not declare. Adding a function is adding a row here.
#pragma once

#include <string_view>
#include <vector>

#include "lang/ast.hpp"

namespace fusedopt::lang {

/// One built-in function. Reductions are rows with `reduction = true` (Op::Reduce); the
/// checker splits the rule into passes at them.
struct FunctionInfo {
  const char* name;
  Op op;
  int arity;                            ///< -1: the checker counts the arguments (orthogonalize)
  const char* signature;                ///< for arity hints: "clamp(x, lo, hi)"
  const char* emit;                     ///< the prelude function codegen calls ("fo_sqrt"),
                                        ///< or nullptr where codegen has its own form
  bool boolean;                         ///< returns a truth value (isfinite, *_any_nonfinite)
  bool reduction;                       ///< reduces over a tensor or over all tensors of the step
  ReduceKind reduce = ReduceKind::Sum;  ///< reductions: what it computes
  Scope scope = Scope::Tensor;          ///< reductions: over what
};

/// One operator: how rules spell it and, for the binary operators C++ has too, how codegen
/// emits it.
struct OperatorInfo {
  Op op;
  const char* text;  ///< in rules and dumps ("neg" for unary minus)
  const char* cxx;   ///< emitted as this binary operator, or nullptr (codegen's own form)
};

/// Every operator.
const std::vector<OperatorInfo>& operators();
/// The operator row of `op`, or nullptr (Number, Ref and functions have none).
const OperatorInfo* operator_of(Op op);

/// Whether `op` is a comparison or a logical operator (its value is a truth value).
bool is_comparison_or_logic(Op op);

/// Every built-in function, in the order hints list them.
const std::vector<FunctionInfo>& functions();
/// The function called `name`, or nullptr.
const FunctionInfo* find_function(std::string_view name);
/// The function whose Op is `op`, or nullptr (Number, Ref, operators and Reduce have none).
const FunctionInfo* function_of(Op op);
/// The reduction row for `kind` over `scope`.
const FunctionInfo& reduction_info(ReduceKind kind, Scope scope);

/// Why `name` may not name a symbol (keyword, built-in function, `step`, the generated
/// prefix `fo_`), or nullptr when it may. Worded to follow "cannot declare 'x': ",
/// e.g. "it is a built-in function".
const char* reserved_reason(std::string_view name);

/// Language keywords (param grad state scalar hyper output and or not).
bool is_keyword(std::string_view name);

}  // namespace fusedopt::lang
