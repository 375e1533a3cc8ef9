// Booleans and numbers kept apart (lang/types.hpp).
#include "lang/types.hpp"

#include <fmt/format.h>

#include <string>

#include "lang/dump.hpp"

namespace fusedopt::lang {

void check_number_operand(const Source& src, const Rule& rule, const Expr& a, std::string_view op) {
  if (!a.boolean) return;
  src.fail(
      a.loc,
      fmt::format("'{}' computes with numbers, and '{}' is a boolean", op, source_form(rule, a)),
      fmt::format("make it a number: 'where({}, 1, 0)' is 1 or 0", source_form(rule, a)));
}

void check_kinds(const Source& src, const Rule& rule, const Expr& e) {
  const char* op = e.op == Op::Neg ? "-" : op_name(e.op);  // "neg" in dumps only
  switch (e.op) {
    case Op::And:
    case Op::Or:
    case Op::Not:
      for (const ExprPtr& a : e.args) {
        if (!a->boolean) {
          src.fail(
              a->loc,
              fmt::format("'{}' takes booleans, and '{}' is a number", op, source_form(rule, *a)),
              fmt::format("compare it: '{} != 0'", source_form(rule, *a)));
        }
      }
      return;
    case Op::Where:
      if (!e.args[0]->boolean) {
        src.fail(e.args[0]->loc,
                 fmt::format("the condition of where() is a boolean, and '{}' is a number",
                             source_form(rule, *e.args[0])),
                 fmt::format("compare it: 'where({} != 0, ...)'", source_form(rule, *e.args[0])));
      }
      if (e.args[1]->boolean != e.args[2]->boolean) {
        const Expr& b = e.args[1]->boolean ? *e.args[1] : *e.args[2];
        src.fail(
            b.loc,
            fmt::format("where() chooses between a boolean ('{}') and a number",
                        source_form(rule, b)),
            fmt::format("make both numbers: 'where({}, 1, 0)' is 1 or 0", source_form(rule, b)));
      }
      return;
    case Op::Eq:
    case Op::Ne:
      if (e.args[0]->boolean != e.args[1]->boolean) {
        src.fail(e.loc, fmt::format("'{}' compares a boolean with a number", op),
                 "compare booleans with booleans and numbers with numbers; 'where(c, 1, 0)' "
                 "is a boolean c as 1 or 0");
      }
      return;
    default:
      break;
  }
  for (const ExprPtr& a : e.args) check_number_operand(src, rule, *a, op);
}

}  // namespace fusedopt::lang
