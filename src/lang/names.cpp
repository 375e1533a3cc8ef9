// The function table, keywords and reserved names of the rule language.
#include "lang/names.hpp"

#include <algorithm>
#include <cctype>
#include <iterator>

namespace fusedopt::lang {
namespace {

// C++ keywords and CUDA built-in variables: a rule's names may end up as identifiers in
// generated code, so they are kept out even though the code generator also mangles.
constexpr std::string_view kCxxReserved[] = {
    "alignas",       "alignof",     "asm",       "auto",      "bool",         "break",
    "case",          "catch",       "char",      "char8_t",   "char16_t",     "char32_t",
    "class",         "co_await",    "co_return", "co_yield",  "concept",      "const",
    "const_cast",    "consteval",   "constexpr", "constinit", "continue",     "decltype",
    "default",       "delete",      "do",        "double",    "dynamic_cast", "else",
    "enum",          "explicit",    "export",    "extern",    "false",        "float",
    "for",           "friend",      "goto",      "if",        "inline",       "int",
    "long",          "mutable",     "namespace", "new",       "noexcept",     "nullptr",
    "operator",      "private",     "protected", "public",    "register",     "reinterpret_cast",
    "requires",      "return",      "short",     "signed",    "sizeof",       "static",
    "static_assert", "static_cast", "struct",    "switch",    "template",     "this",
    "thread_local",  "throw",       "true",      "try",       "typedef",      "typeid",
    "typename",      "union",       "unsigned",  "using",     "virtual",      "void",
    "volatile",      "wchar_t",     "while",     "and_eq",    "bitand",       "bitor",
    "compl",         "not_eq",      "or_eq",     "xor",       "xor_eq",       "threadIdx",
    "blockIdx",      "blockDim",    "gridDim",   "warpSize",  "half",         "NULL",
    "INFINITY",      "NAN",         "restrict",  "main",      "std"};

constexpr std::string_view kKeywords[] = {"param",  "grad", "state", "hyper",
                                          "output", "and",  "or",    "not"};

template <std::size_t N>
bool contains(const std::string_view (&table)[N], std::string_view name) {
  return std::find(std::begin(table), std::end(table), name) != std::end(table);
}

}  // namespace

const std::vector<FunctionInfo>& functions() {
  // clang-format off
  static const std::vector<FunctionInfo> table = {
      // name      op            arity  signature           boolean reduction
      {"where",    Op::Where,    3, "where(cond, a, b)",  false, false},
      {"sqrt",     Op::Sqrt,     1, "sqrt(x)",            false, false},
      {"rsqrt",    Op::Rsqrt,    1, "rsqrt(x)",           false, false},
      {"exp",      Op::Exp,      1, "exp(x)",             false, false},
      {"log",      Op::Log,      1, "log(x)",             false, false},
      {"abs",      Op::Abs,      1, "abs(x)",             false, false},
      {"sign",     Op::Sign,     1, "sign(x)",            false, false},
      {"min",      Op::Min,      2, "min(a, b)",          false, false},
      {"max",      Op::Max,      2, "max(a, b)",          false, false},
      {"clamp",    Op::Clamp,    3, "clamp(x, lo, hi)",   false, false},
      {"isfinite", Op::IsFinite, 1, "isfinite(x)",        true,  false},
      {"pow",      Op::PowFn,    2, "pow(a, b)",          false, false},
      {"tanh",     Op::Tanh,     1, "tanh(x)",            false, false},
      {"log1p",    Op::Log1p,    1, "log1p(x)",           false, false},
      {"expm1",    Op::Expm1,    1, "expm1(x)",           false, false},
      {"floor",    Op::Floor,    1, "floor(x)",           false, false},
      // reductions: per tensor, then over every tensor of the step
      {"tensor_sum",           Op::Reduce, 1, "tensor_sum(x)",           false, true, ReduceKind::Sum,          Scope::Tensor},
      {"tensor_sumsq",         Op::Reduce, 1, "tensor_sumsq(x)",         false, true, ReduceKind::SumSq,        Scope::Tensor},
      {"tensor_norm",          Op::Reduce, 1, "tensor_norm(x)",          false, true, ReduceKind::Norm,         Scope::Tensor},
      {"tensor_maxabs",        Op::Reduce, 1, "tensor_maxabs(x)",        false, true, ReduceKind::MaxAbs,       Scope::Tensor},
      {"tensor_any_nonfinite", Op::Reduce, 1, "tensor_any_nonfinite(x)", true,  true, ReduceKind::AnyNonFinite, Scope::Tensor},
      {"global_sum",           Op::Reduce, 1, "global_sum(x)",           false, true, ReduceKind::Sum,          Scope::Global},
      {"global_sumsq",         Op::Reduce, 1, "global_sumsq(x)",         false, true, ReduceKind::SumSq,        Scope::Global},
      {"global_norm",          Op::Reduce, 1, "global_norm(x)",          false, true, ReduceKind::Norm,         Scope::Global},
      {"global_maxabs",        Op::Reduce, 1, "global_maxabs(x)",        false, true, ReduceKind::MaxAbs,       Scope::Global},
      {"global_any_nonfinite", Op::Reduce, 1, "global_any_nonfinite(x)", true,  true, ReduceKind::AnyNonFinite, Scope::Global},
  };
  // clang-format on
  return table;
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
  if (find_function(name) != nullptr) return "it is a built-in function";
  if (contains(kCxxReserved, name)) return "it is reserved (a C++ or CUDA name)";
  if (name.size() >= 3 && std::tolower(static_cast<unsigned char>(name[0])) == 'f' &&
      std::tolower(static_cast<unsigned char>(name[1])) == 'o' && name[2] == '_') {
    return "names starting with 'fo_' are reserved for generated code";
  }
  return nullptr;
}

}  // namespace fusedopt::lang
