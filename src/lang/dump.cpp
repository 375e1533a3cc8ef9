// S-expression dumps of checked rules.
#include "lang/dump.hpp"

#include <fmt/format.h>

#include "lang/names.hpp"

namespace fusedopt::lang {

const char* op_name(Op op) {
  if (op == Op::Number) return "number";
  if (op == Op::Ref) return "ref";
  if (const OperatorInfo* o = operator_of(op)) return o->text;
  const FunctionInfo* fn = function_of(op);
  return fn != nullptr ? fn->name : "?";
}

std::string dump(const Rule& rule, const Expr& e) {
  if (e.op == Op::Number) return fmt::format("{}", e.number);
  if (e.op == Op::Ref) {
    if (e.sym < 0 || e.sym >= static_cast<int>(rule.symbols.size())) return "?";
    return rule.symbols[e.sym].name;
  }
  std::string out = "(";
  out += e.op == Op::Reduce && e.reduction >= 0 ? rule.reductions[e.reduction].name.c_str()
                                                : op_name(e.op);
  for (const ExprPtr& a : e.args) out += " " + dump(rule, *a);
  return out + ")";
}

std::string dump(const Rule& rule) {
  std::string out;
  for (const Stmt& s : rule.stmts) {
    out += rule.symbols[s.target].name + " = " + dump(rule, *s.value) + "\n";
  }
  return out;
}

}  // namespace fusedopt::lang
