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

namespace {

/// How tightly an expression binds as an operand: higher binds tighter (the grammar's
/// precedence, atoms and calls highest).
int binding(Op op) {
  switch (op) {
    case Op::Or:
      return 1;
    case Op::And:
      return 2;
    case Op::Not:
      return 3;
    case Op::Lt:
    case Op::Le:
    case Op::Gt:
    case Op::Ge:
    case Op::Eq:
    case Op::Ne:
      return 4;
    case Op::Add:
    case Op::Sub:
      return 5;
    case Op::Mul:
    case Op::Div:
    case Op::Mod:
      return 6;
    case Op::Neg:
      return 7;
    case Op::Pow:
      return 8;
    default:
      return 9;
  }
}

}  // namespace

std::string source_form(const Rule& rule, const Expr& e) {
  if (e.op == Op::Number) return fmt::format("{}", e.number);
  if (e.op == Op::Ref) {
    if (e.sym < 0 || e.sym >= static_cast<int>(rule.symbols.size())) return "?";
    return rule.symbols[e.sym].name;
  }
  const int mine = binding(e.op);
  // `a` as an operand that needs at least `need` to stand without parentheses.
  auto operand = [&](const Expr& a, int need) {
    const std::string text = source_form(rule, a);
    return binding(a.op) < need ? "(" + text + ")" : text;
  };
  switch (e.op) {
    case Op::Neg:
      return "-" + operand(*e.args[0], mine);
    case Op::Not:
      return "not " + operand(*e.args[0], mine);
    case Op::Pow:  // right-associative
      return operand(*e.args[0], mine + 1) + " ^ " + operand(*e.args[1], mine);
    default:
      break;
  }
  if (mine < 9) {  // binary, left-associative; comparisons do not chain
    const bool comparison = mine == 4;
    return operand(*e.args[0], comparison ? mine + 1 : mine) + " " + op_name(e.op) + " " +
           operand(*e.args[1], mine + 1);
  }
  std::string out = e.op == Op::Reduce && e.reduction >= 0 ? rule.reductions[e.reduction].name
                                                           : std::string(op_name(e.op));
  out += "(";
  for (std::size_t i = 0; i < e.args.size(); ++i) {
    out += (i ? ", " : "") + source_form(rule, *e.args[i]);
  }
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
