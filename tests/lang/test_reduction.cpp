// Reductions in rules: how many passes the presets and clipped rules need, where each
// reduction runs, and the errors for reductions that cannot be scheduled (a uniform or
// per-tensor argument, a state's initial value, a chain longer than the pass limit, and
// clipping added to a rule that already clips).
#include <doctest/doctest.h>

#include <string>

#include "common/rule_errors.hpp"
#include "fusedopt/kernel.hpp"
#include "presets.hpp"

namespace fusedopt::testing {

using fusedopt::RuleError;
using fusedopt::lang::kMaxReductionPasses;
using fusedopt::lang::parse_rule;
using fusedopt::lang::ReduceKind;
using fusedopt::lang::Scope;

namespace {

/// 1-based line and column of the first occurrence of `needle` on a line that starts with
/// `line_start` in `text` (so a test does not hard-code where a preset's comment ends).
std::pair<int, int> locate(const std::string& text, const std::string& line_start,
                           const std::string& needle) {
  int line = 1;
  std::size_t begin = 0;
  while (begin < text.size()) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    const std::string l = text.substr(begin, end - begin);
    if (l.rfind(line_start, 0) == 0) {
      const std::size_t col = l.find(needle);
      if (col != std::string::npos) return {line, static_cast<int>(col) + 1};
    }
    begin = end + 1;
    ++line;
  }
  return {0, 0};
}

}  // namespace

TEST_SUITE("lang") {
  TEST_CASE("LAMB needs two reduction passes, LARS one, and a clipped AdamW one") {
    CHECK(fusedopt::Rule::preset("lamb").reduction_passes() == 2);
    CHECK(fusedopt::Rule::preset("lars").reduction_passes() == 1);
    CHECK(fusedopt::Rule::preset("adamw").reduction_passes() == 0);
    const fusedopt::Rule clipped = fusedopt::Rule::preset("adamw").with_grad_clipping(0.25);
    CHECK(clipped.reduction_passes() == 1);
    CHECK(clipped.name() == "adamw+clip");
    bool found = false;
    for (const auto& [name, value] : clipped.hypers()) {
      if (name == "max_grad_norm") {
        found = true;
        CHECK(value == 0.25);
      }
    }
    CHECK(found);
    CHECK(fusedopt::Rule::preset("sgd").with_grad_clipping().reduction_passes() == 1);
    // Clipping a rule that already has reductions adds one pass in front of them.
    CHECK(fusedopt::Rule::preset("lars").with_grad_clipping().reduction_passes() == 2);
  }

  TEST_CASE("LAMB's parameter norm joins the update-direction norm in the second pass") {
    auto rule = fusedopt::preset_rule("lamb");
    REQUIRE(rule->reductions.size() == 3);
    const auto& r = rule->reductions;
    CHECK(r[0].name == "global_norm");
    CHECK(r[0].scope == Scope::Global);
    CHECK(r[0].kind == ReduceKind::Norm);
    CHECK(r[0].pass == 0);
    // ||p|| could run in pass 0, but only the update needs it: it moves to pass 1, which
    // reads p anyway for u.
    CHECK(r[1].name == "tensor_norm");
    CHECK(r[1].scope == Scope::Tensor);
    CHECK(r[1].pass == 1);
    CHECK(r[2].name == "tensor_norm");
    CHECK(r[2].pass == 1);
    CHECK(rule->num_global_reductions == 1);
    CHECK(rule->num_tensor_reductions == 2);
    const std::string text = fusedopt::preset_text("lamb");
    CHECK(r[0].loc.line == locate(text, "gn", "global_norm").first);
    CHECK(r[0].loc.col == locate(text, "gn", "global_norm").second);

    auto lars = fusedopt::preset_rule("lars");
    REQUIRE(lars->reductions.size() == 2);
    CHECK(lars->reductions[0].pass == 0);
    CHECK(lars->reductions[1].pass == 0);
  }

  TEST_CASE("every reduction function parses, global results are uniform and tensor ones not") {
    auto rule = parse_rule(kHeader +
                               "a = tensor_sum(g) + tensor_sumsq(g) + tensor_norm(p)\n"
                               "b = tensor_maxabs(g) + where(tensor_any_nonfinite(g), 1, 0)\n"
                               "c = global_sum(g) + global_sumsq(g) + global_norm(p)\n"
                               "d = global_maxabs(g) + where(global_any_nonfinite(g), 1, 0)\n"
                               "p = p - lr * (a + b + c + d) * g\n",
                           "all.rule");
    CHECK(rule->reduction_passes == 1);
    CHECK(rule->reductions.size() == 10);
    CHECK(rule->num_tensor_reductions == 5);
    CHECK(rule->num_global_reductions == 5);
    CHECK_FALSE(rule->stmts[0].value->uniform);
    CHECK(rule->stmts[2].value->uniform);
    CHECK(rule->stmts[0].phase == 1);
    CHECK(rule->stmts[4].phase == 1);
  }

  TEST_CASE("a chain of four dependent reductions takes four passes; a fifth is refused") {
    const std::string chain4 = kHeader +
                               "a = global_norm(g)\n"
                               "b = global_norm(g * a)\n"
                               "c = tensor_norm(g * b)\n"
                               "d = global_maxabs(p * c)\n";
    auto rule = parse_rule(chain4 + "p = p - lr * d * g\n", "chain4.rule");
    CHECK(rule->reduction_passes == kMaxReductionPasses);
    CHECK(rule->reductions[3].pass == 3);
    auto e = parse_error(chain4 + "e = global_sum(g * d)\np = p - lr * e * g\n");
    REQUIRE(e);
    CHECK(e->line() == 8);
    CHECK(e->column() == 5);
    CHECK(contains(e->message(), "at most 4"));
    CHECK(contains(e->message(), "'global_sum'"));
  }

  TEST_CASE("a reduction of a value that is the same for every element is refused") {
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = p - tensor_sum(lr)\n", 4, 9,
                              "reduces a value that is the same for every element");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "x = global_norm(g)\np = p - global_sum(x * lr) * g\n", 5,
                              9, "reduces a value that is the same for every element");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = p - lr * global_maxabs(step) * g\n", 4, 14,
                              "reduces a value that is the same for every element");
  }

  TEST_CASE("a reduction of a per-tensor value is refused") {
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "x = tensor_norm(p)\np = p - global_sum(x) * g\n", 5, 9,
                              "same for every element of a tensor");
    FUSEDOPT_CHECK_RULE_ERROR(
        kHeader + "x = tensor_norm(p)\ny = x * 2\np = p - tensor_norm(y) * g\n", 6, 9,
        "same for every element of a tensor");
  }

  TEST_CASE("a reduction of a row value, a scalar state or numel says what its argument is") {
    auto e = parse_error("param p\ngrad g\nrow r = 0\nr = row_mean(g)\np = p - row_mean(r) * g\n");
    REQUIRE(e);
    CHECK(e->line() == 5);
    CHECK(e->column() == 9);
    CHECK(e->message() ==
          "'row_mean' reduces a value that is the same for every element of a row (its "
          "argument reads only per-row values, not the elements)");
    CHECK(e->hint() ==
          "it would add that value once per element; reduce an element expression, e.g. "
          "'row_mean(p)', and combine the results afterwards");
    const std::string per_tensor =
        "'global_sum' reduces a value that is the same for every element of a tensor (its "
        "argument reads only per-tensor values, not the elements)";
    e = parse_error("param p\ngrad g\nscalar s = 0\ns = s + 1\np = p - global_sum(s) * g\n");
    REQUIRE(e);
    CHECK(e->message() == per_tensor);
    e = parse_error(kHeader + "p = p - global_sum(numel) * g\n");
    REQUIRE(e);
    CHECK(e->column() == 9);
    CHECK(e->message() == per_tensor);
  }

  TEST_CASE("a reduction in a state's initial value is refused") {
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g\nstate m = tensor_norm(p)\nm = m + g\np = p - m\n",
                              3, 11, "cannot use a reduction");
    FUSEDOPT_CHECK_RULE_ERROR(
        "param p\ngrad g\nstate m = 1 + global_sum(p)\nm = m + g\np = p - m\n", 3, 15,
        "the initial value of state 'm'");
  }

  TEST_CASE("with_grad_clipping refuses a rule that already declares max_grad_norm") {
    const std::string text = fusedopt::preset_text("lamb");
    const auto [line, col] = locate(text, "hyper", "max_grad_norm");
    REQUIRE(line > 0);
    try {
      (void)fusedopt::Rule::preset("lamb").with_grad_clipping();
      FAIL("with_grad_clipping on lamb did not throw");
    } catch (const RuleError& e) {
      CHECK(e.line() == line);
      CHECK(e.column() == col);
      CHECK(contains(e.message(), "max_grad_norm"));
      CHECK(contains(e.message(), "already declares"));
    }
    // A temporary of that name is refused too (it would be shadowed by the new hyper).
    try {
      (void)fusedopt::Rule::parse(kHeader + "max_grad_norm = 2\np = p - lr * max_grad_norm * g\n",
                                  "t.rule")
          .with_grad_clipping();
      FAIL("with_grad_clipping on a rule assigning max_grad_norm did not throw");
    } catch (const RuleError& e) {
      CHECK(e.line() == 4);
      CHECK(e.column() == 1);
    }
  }

  TEST_CASE("describe names every reduction pass, those of row and column means too") {
    const std::string mini = fusedopt::Rule::preset("adam_mini").describe();
    CHECK_MESSAGE(contains(mini, "pass 0: row, column and matrix means"), mini);
    CHECK_MESSAGE(!contains(mini, ": )"), mini);
    const std::string lamb = fusedopt::Rule::preset("lamb").describe();
    CHECK_MESSAGE(contains(lamb, "pass 0: global_norm"), lamb);
  }

  TEST_CASE("a rule that clipping pushes over a limit is told that clipping did it") {
    // 1024 statements: the most a rule may have; clipping adds two.
    std::string text = "param p\ngrad g\n";
    for (int k = 0; k < 1023; ++k) text += "t = g\n";
    text += "p = p - t\n";
    const fusedopt::Rule rule = fusedopt::Rule::parse(text, "full.rule");
    try {
      (void)rule.with_grad_clipping(1.0);
      FAIL("clipping a rule of 1024 statements did not throw");
    } catch (const RuleError& e) {
      CHECK(e.file() == "full.rule");
      CHECK(contains(e.message(), "at most 1024 statements"));
      CHECK(contains(e.message(), "with gradient clipping, which adds 2 statements"));
      CHECK(contains(e.hint(), "turn clipping off"));
    }
  }
}

}  // namespace fusedopt::testing
