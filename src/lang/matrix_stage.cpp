// check_matrix_stage (matrix_stage.hpp).
#include "lang/matrix_stage.hpp"

#include <fmt/format.h>

#include <cmath>

#include "lang/dump.hpp"
#include "lang/types.hpp"

namespace fusedopt::lang {
namespace {

// One number of the iteration: a literal (possibly negated) or a hyper.
StageValue stage_value(const Source& src, const Rule& rule, const Expr& a, const char* what) {
  if (a.op == Op::Number) return StageValue{a.number};
  if (a.op == Op::Neg && a.args[0]->op == Op::Number) return StageValue{-a.args[0]->number};
  if (a.op == Op::Ref && rule.symbols[a.sym].kind == SymKind::Hyper) {
    return StageValue{rule.symbols[a.sym].default_value, rule.symbols[a.sym].index};
  }
  src.fail(a.loc,
           fmt::format("orthogonalize()'s {} is a number or a hyper, not '{}'", what,
                       source_form(rule, a)),
           "the iteration's numbers are set per param group: declare a hyper, e.g. "
           "'hyper ns_steps = 5'");
}

// The iteration's numbers as written (hypers: their defaults; the runtime checks the
// values each group sets).
void check_numbers(const Source& src, const Expr& e, const MatrixStage& st) {
  const double steps = st.steps.number;
  const Loc& at = e.args[1]->loc;
  if (!(steps >= 1 && steps <= 100) || steps != static_cast<double>(static_cast<int>(steps))) {
    src.fail(at, fmt::format("orthogonalize()'s steps is {}: a whole number from 1 to 100", steps),
             "Muon takes 5");
  }
  if (st.coefficients.size() > 1 && static_cast<double>(st.coefficients.size()) < steps) {
    src.fail(at,
             fmt::format("orthogonalize() has {} steps and {} coefficient triples", steps,
                         st.coefficients.size()),
             "give one (a, b, c) for all the steps, or one for each of them");
  }
  for (std::size_t k = 0; k < st.coefficients.size(); ++k) {
    for (int j = 0; j < 3; ++j) {
      const double v = st.coefficients[k][static_cast<std::size_t>(j)].number;
      if (!std::isfinite(v)) {
        src.fail(e.args[2 + 3 * k + static_cast<std::size_t>(j)]->loc,
                 fmt::format("orthogonalize()'s coefficient is {}: it must be finite", v),
                 "Muon's are 3.4445, -4.7750, 2.0315");
      }
    }
  }
  if (!(st.eps.number > 0) || !std::isfinite(st.eps.number)) {
    src.fail(
        e.args.back()->loc,
        fmt::format("orthogonalize()'s eps is {}: it must be positive and finite", st.eps.number),
        "Muon's is 1e-7");
  }
}

}  // namespace

MatrixStage check_matrix_stage(const Source& src, const Rule& rule, const Expr& e,
                               const Symbol* state) {
  if (state != nullptr) {
    src.fail(e.loc,
             fmt::format("the initial value of {} '{}' cannot use orthogonalize()",
                         to_string(state->kind), state->name),
             "initial values are written once, element by element; orthogonalize in a "
             "statement");
  }
  const int n = static_cast<int>(e.args.size());
  if (n == 0 || (n > 1 && n != 5 && (n < 6 || n % 3 != 0))) {
    src.fail(e.loc, fmt::format("'orthogonalize' takes 1, 5 or 3 + 3k arguments, got {}", n),
             "orthogonalize(x), orthogonalize(x, steps, a, b, c) (eps 1e-7), or "
             "orthogonalize(x, steps, a1, b1, c1, ..., ak, bk, ck, eps) with one (a, b, c) "
             "for each of the steps");
  }
  const Expr& arg = *e.args[0];
  check_number_operand(src, rule, arg, "orthogonalize");
  if (!arg.elementwise) {
    src.fail(arg.loc,
             fmt::format("orthogonalize() takes a matrix: a value of every element of the "
                         "tensor, and '{}' is the same for {}",
                         source_form(rule, arg),
                         arg.uniform ? "every element" : "a whole row, column or tensor"),
             "orthogonalize an expression of the grad, the param or a state, e.g. "
             "'orthogonalize(g)'");
  }
  if (arg.staged) {
    src.fail(e.loc,
             "orthogonalize() of a value that depends on another orthogonalize(): "
             "not supported",
             "a rule's matrix stages each take values the element code computes");
  }
  if (arg.phase >= kMaxReductionPasses) {
    src.fail(e.loc,
             fmt::format("orthogonalize() would need pass {}: a rule may use at most {} "
                         "passes before its update",
                         arg.phase + 1, kMaxReductionPasses),
             "its argument depends on a chain of reductions, each needing its own pass");
  }
  MatrixStage st;
  st.pass = arg.phase;
  st.loc = e.loc;
  st.arg = &arg;
  st.steps.number = 5;
  st.coefficients = {{StageValue{3.4445}, StageValue{-4.7750}, StageValue{2.0315}}};
  st.eps.number = 1e-7;
  if (n > 1) {
    st.steps = stage_value(src, rule, *e.args[1], "steps");
    st.coefficients.clear();
    const int triples = n == 5 ? 1 : (n - 3) / 3;
    for (int k = 0; k < triples; ++k) {
      st.coefficients.push_back({stage_value(src, rule, *e.args[2 + 3 * k], "a"),
                                 stage_value(src, rule, *e.args[3 + 3 * k], "b"),
                                 stage_value(src, rule, *e.args[4 + 3 * k], "c")});
    }
    if (n > 5) st.eps = stage_value(src, rule, *e.args[n - 1], "eps");
    check_numbers(src, e, st);
  }
  return st;
}

void check_not_staged(const Source& src, const Expr& e, const Expr& arg, const char* name) {
  if (!arg.staged) return;
  src.fail(e.loc,
           fmt::format("'{}' reduces a value that depends on orthogonalize(): not supported", name),
           "a matrix stage's result is read by the element code of the update; reduce its "
           "argument instead, or compute the reduction from other values");
}

void check_stages_fit(const Source& src, const Rule& rule) {
  if (rule.stages.empty() || !rule.factored()) return;
  src.fail(rule.stages.front().loc,
           "orthogonalize() in a rule with row or column values: not supported",
           "a factored rule walks whole rows; give the matrix stage its own rule");
}

}  // namespace fusedopt::lang
