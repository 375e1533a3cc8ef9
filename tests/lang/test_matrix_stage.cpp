// Matrix stages in rules (orthogonalize): where the checker schedules one (the pass its
// argument is known in, its result an element value of the next), the iteration's numbers
// (literals or hypers; 1, 5 or 3 + 3k arguments), and the errors: a non-matrix argument, a
// stage inside a reduction or of another stage, a state's initial value, out-of-range
// numbers, factored rules.
#include <doctest/doctest.h>

#include <string>

#include "common/rule_errors.hpp"
#include "presets.hpp"

namespace fusedopt::testing {

using fusedopt::lang::parse_rule;

TEST_SUITE("lang") {
  TEST_CASE("muon: one stage after pass 0, its argument there, the update reading its result") {
    const auto rule = parse_rule(fusedopt::preset_text("muon"), "muon.rule");
    REQUIRE(rule->stages.size() == 1);
    CHECK(rule->reduction_passes == 1);
    const auto& st = rule->stages[0];
    CHECK(st.pass == 0);
    CHECK(st.steps.hyper >= 0);
    CHECK(st.steps.number == 5);
    REQUIRE(st.coefficients.size() == 1);
    CHECK(st.coefficients[0][1].number == doctest::Approx(-4.775));
    CHECK(st.eps.hyper >= 0);
  }

  TEST_CASE("orthogonalize's numbers: Muon's by default, one triple, or one per step") {
    auto one = parse_rule(kHeader + "u = orthogonalize(g)\np = p - lr * u\n", "t.rule");
    REQUIRE(one->stages.size() == 1);
    CHECK(one->stages[0].steps.number == 5);
    CHECK(one->stages[0].coefficients[0][0].number == doctest::Approx(3.4445));
    CHECK(one->stages[0].eps.number == doctest::Approx(1e-7));
    auto five =
        parse_rule(kHeader + "u = orthogonalize(g, 3, 2, -1.5, 0.5)\np = p - lr * u\n", "t.rule");
    CHECK(five->stages[0].steps.number == 3);
    CHECK(five->stages[0].coefficients[0][1].number == -1.5);
    CHECK(five->stages[0].eps.number == doctest::Approx(1e-7));
    auto schedule = parse_rule(
        kHeader + "u = orthogonalize(g, 2, 4, -6.9, 2.9, 3.9, -6.3, 2.6, 1e-6)\np = p - lr * u\n",
        "t.rule");
    REQUIRE(schedule->stages[0].coefficients.size() == 2);
    CHECK(schedule->stages[0].coefficients[1][2].number == doctest::Approx(2.6));
    CHECK(schedule->stages[0].eps.number == doctest::Approx(1e-6));
  }

  TEST_CASE("a stage's argument may read a reduction: the stage runs a pass later") {
    auto rule = parse_rule(
        kHeader + "n = tensor_norm(g)\nu = orthogonalize(g / n)\np = p - lr * u * tensor_norm(p)\n",
        "t.rule");
    REQUIRE(rule->stages.size() == 1);
    CHECK(rule->stages[0].pass == 1);
    CHECK(rule->reduction_passes == 2);
  }

  TEST_CASE("orthogonalize errors: not a matrix, inside a reduction, of a stage, bad numbers") {
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "u = orthogonalize(lr)\np = p - u\n", 4, 19,
                              "orthogonalize() takes a matrix");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "u = orthogonalize(tensor_norm(g))\np = p - u\n", 4, 19,
                              "takes a matrix");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "n = tensor_norm(orthogonalize(g))\np = p - lr * n\n", 4, 5,
                              "reduces a value that depends on orthogonalize()");
    FUSEDOPT_CHECK_RULE_ERROR(
        kHeader + "u = orthogonalize(g)\nn = tensor_sum(u * u)\np = p - lr * n * u\n", 5, 5,
        "depends on orthogonalize()");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "u = orthogonalize(orthogonalize(g))\np = p - u\n", 4, 5,
                              "another orthogonalize()");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "u = orthogonalize(g, 5)\np = p - u\n", 4, 5,
                              "takes 1, 5 or 3 + 3k arguments, got 2");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "u = orthogonalize(g, 0, 1, 1, 1)\np = p - u\n", 4, 22,
                              "steps is 0: a whole number from 1 to 100");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "u = orthogonalize(g, 2.5, 1, 1, 1)\np = p - u\n", 4, 22,
                              "a whole number");
    FUSEDOPT_CHECK_RULE_ERROR(
        kHeader + "u = orthogonalize(g, 3, 1, 1, 1, 2, 2, 2, 1e-7)\np = p - u\n", 4, 22,
        "3 steps and 2 coefficient triples");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "u = orthogonalize(g, 5, 1, 1, 1, 1e-7, 0)\np = p - u\n", 4,
                              5, "takes 1, 5 or 3 + 3k arguments, got 7");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "u = orthogonalize(g, 5, 1, 1, 1, 0)\np = p - u\n", 4, 34,
                              "eps is 0");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "u = orthogonalize(g, 1, 1, 1, 1, 1, 1, 1, 0)\np = p - u\n",
                              4, 43, "eps is 0: it must be positive");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "u = orthogonalize(g, lr * 2, 1, 1, 1)\np = p - u\n", 4, 25,
                              "a number or a hyper, not 'lr * 2'");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "u = orthogonalize(g, step, 1, 1, 1)\np = p - u\n", 4, 22,
                              "a number or a hyper, not 'step'");
    FUSEDOPT_CHECK_RULE_ERROR(
        "param p\ngrad g\nhyper ns = 0\nu = orthogonalize(g, ns, 1, 1, 1)\np = p - u\n", 4, 22,
        "steps is 0");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "state m = orthogonalize(p)\nm = g\np = p - m\n", 4, 11,
                              "cannot use orthogonalize()");
    FUSEDOPT_CHECK_RULE_ERROR(
        kHeader + "row r = 0\nr = row_mean(g * g)\nu = orthogonalize(g)\np = p - lr * u * r\n", 6,
        5, "row or column values: not supported");
  }
}

}  // namespace fusedopt::testing
