// The function table, keywords and reserved names of the rule language.
#include "lang/names.hpp"

#include <algorithm>
#include <cctype>
#include <iterator>

namespace fusedopt::lang {
namespace {

// C++ and CUDA names (std, int, float, half, class, ...) are fine: codegen never pastes a
// user name, it emits each as `v_NAME` (hypers by index), and the lexer refuses '__' and a
// leading '_'. Only the language's own words and the generated prefix are kept out.
constexpr std::string_view kKeywords[] = {"param", "grad",   "state",   "scalar", "row", "col",
                                          "hyper", "output", "storage", "and",    "or",  "not"};

template <std::size_t N>
bool contains(const std::string_view (&table)[N], std::string_view name) {
  return std::find(std::begin(table), std::end(table), name) != std::end(table);
}

}  // namespace

const std::vector<FunctionInfo>& functions() {
  // clang-format off
  static const std::vector<FunctionInfo> table = {
      // name, op, arity, signature, emitted as (the prelude function), boolean, reduction
      {"where", Op::Where, 3, "where(cond, a, b)", nullptr, false, false},
      {"sqrt", Op::Sqrt, 1, "sqrt(x)", "fo_sqrt", false, false},
      {"rsqrt", Op::Rsqrt, 1, "rsqrt(x)", "fo_rsqrt", false, false},
      {"exp", Op::Exp, 1, "exp(x)", "fo_exp", false, false},
      {"log", Op::Log, 1, "log(x)", "fo_log", false, false},
      {"abs", Op::Abs, 1, "abs(x)", "fo_abs", false, false},
      {"sign", Op::Sign, 1, "sign(x)", "fo_sign", false, false},
      {"min", Op::Min, 2, "min(a, b)", "fo_min", false, false},
      {"max", Op::Max, 2, "max(a, b)", "fo_max", false, false},
      {"clamp", Op::Clamp, 3, "clamp(x, lo, hi)", "fo_clamp", false, false},
      {"isfinite", Op::IsFinite, 1, "isfinite(x)", nullptr, true, false},
      {"pow", Op::PowFn, 2, "pow(a, b)", "fo_pow", false, false},
      {"tanh", Op::Tanh, 1, "tanh(x)", "fo_tanh", false, false},
      {"log1p", Op::Log1p, 1, "log1p(x)", "fo_log1p", false, false},
      {"expm1", Op::Expm1, 1, "expm1(x)", "fo_expm1", false, false},
      {"floor", Op::Floor, 1, "floor(x)", "fo_floor", false, false},
      {"mod", Op::Mod, 2, "mod(a, b)", "fo_mod", false, false},
      {"lerp", Op::Lerp, 3, "lerp(a, b, w)", "fo_lerp", false, false},
      {"fma", Op::Fma, 3, "fma(a, b, c)", "fo_fma", false, false},
      {"rand", Op::Rand, 0, "rand()", nullptr, false, false},
      // the matrix stage: 1, 5 or 3 + 3 k arguments (the checker counts them)
      {"orthogonalize", Op::Orthogonalize, -1, "orthogonalize(x[, steps, a, b, c, eps])", nullptr, false, false},
      // reductions: per tensor, then over every tensor of the step
      {"tensor_sum",           Op::Reduce, 1, "tensor_sum(x)", nullptr,           false, true, ReduceKind::Sum,          Scope::Tensor},
      {"tensor_sumsq",         Op::Reduce, 1, "tensor_sumsq(x)", nullptr,         false, true, ReduceKind::SumSq,        Scope::Tensor},
      {"tensor_norm",          Op::Reduce, 1, "tensor_norm(x)", nullptr,          false, true, ReduceKind::Norm,         Scope::Tensor},
      {"tensor_maxabs",        Op::Reduce, 1, "tensor_maxabs(x)", nullptr,        false, true, ReduceKind::MaxAbs,       Scope::Tensor},
      {"tensor_any_nonfinite", Op::Reduce, 1, "tensor_any_nonfinite(x)", nullptr, true,  true, ReduceKind::AnyNonFinite, Scope::Tensor},
      {"global_sum",           Op::Reduce, 1, "global_sum(x)", nullptr,           false, true, ReduceKind::Sum,          Scope::Global},
      {"global_sumsq",         Op::Reduce, 1, "global_sumsq(x)", nullptr,         false, true, ReduceKind::SumSq,        Scope::Global},
      {"global_norm",          Op::Reduce, 1, "global_norm(x)", nullptr,          false, true, ReduceKind::Norm,         Scope::Global},
      {"global_maxabs",        Op::Reduce, 1, "global_maxabs(x)", nullptr,        false, true, ReduceKind::MaxAbs,       Scope::Global},
      {"global_any_nonfinite", Op::Reduce, 1, "global_any_nonfinite(x)", nullptr, true,  true, ReduceKind::AnyNonFinite, Scope::Global},
      // factored: the mean over each row / each column of a tensor's matrices, and a row
      // or column value's mean over the rows / columns of its matrix
      {"row_mean",             Op::Reduce, 1, "row_mean(x)", nullptr,             false, true, ReduceKind::Mean,         Scope::Row},
      {"col_mean",             Op::Reduce, 1, "col_mean(x)", nullptr,             false, true, ReduceKind::Mean,         Scope::Col},
      {"matrix_mean",          Op::Reduce, 1, "matrix_mean(x)", nullptr,          false, true, ReduceKind::Mean,         Scope::Matrix},
  };
  // clang-format on
  return table;
}

const std::vector<OperatorInfo>& operators() {
  // clang-format off
  static const std::vector<OperatorInfo> table = {
      // op       rule   C++ (binary operators emitted as such)
      {Op::Neg,   "neg", nullptr},
      {Op::Not,   "not", nullptr},
      {Op::Add,   "+",   "+"},
      {Op::Sub,   "-",   "-"},
      {Op::Mul,   "*",   "*"},
      {Op::Div,   "/",   "/"},
      {Op::Mod,   "%",   nullptr},  // emitted as fo_mod (its function's row)
      {Op::Pow,   "^",   nullptr},
      {Op::Lt,    "<",   "<"},
      {Op::Le,    "<=",  "<="},
      {Op::Gt,    ">",   ">"},
      {Op::Ge,    ">=",  ">="},
      {Op::Eq,    "==",  "=="},
      {Op::Ne,    "!=",  "!="},
      {Op::And,   "and", nullptr},
      {Op::Or,    "or",  nullptr},
  };
  // clang-format on
  return table;
}

bool is_comparison_or_logic(Op op) {
  switch (op) {
    case Op::Lt:
    case Op::Le:
    case Op::Gt:
    case Op::Ge:
    case Op::Eq:
    case Op::Ne:
    case Op::And:
    case Op::Or:
    case Op::Not:
      return true;
    default:
      return false;
  }
}

const OperatorInfo* operator_of(Op op) {
  for (const OperatorInfo& o : operators()) {
    if (o.op == op) return &o;
  }
  return nullptr;
}

const FunctionInfo* find_function(std::string_view name) {
  for (const FunctionInfo& f : functions()) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

const FunctionInfo* function_of(Op op) {
  if (op == Op::Reduce) return nullptr;  // many rows: see reduction_info
  for (const FunctionInfo& f : functions()) {
    if (f.op == op) return &f;
  }
  return nullptr;
}

const FunctionInfo& reduction_info(ReduceKind kind, Scope scope) {
  for (const FunctionInfo& f : functions()) {
    if (f.reduction && f.reduce == kind && f.scope == scope) return f;
  }
  return functions().front();  // unreachable: every pair has a row
}

bool is_keyword(std::string_view name) { return contains(kKeywords, name); }

const char* reserved_reason(std::string_view name) {
  if (is_keyword(name)) return "it is a keyword";
  if (name == "step") return "it is built in (the step count) and read-only";
  for (const char* info : kInfoNames) {
    if (name == info) return "it is built in (a per-tensor value) and read-only";
  }
  if (find_function(name) != nullptr) return "it is a built-in function";
  if (name.size() >= 3 && std::tolower(static_cast<unsigned char>(name[0])) == 'f' &&
      std::tolower(static_cast<unsigned char>(name[1])) == 'o' && name[2] == '_') {
    return "names starting with 'fo_' are reserved for generated code";
  }
  return nullptr;
}

}  // namespace fusedopt::lang
