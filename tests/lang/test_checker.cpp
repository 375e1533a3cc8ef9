// Semantic rules: names, declarations, read-only symbols, assignment before use, and what
// the checker derives (reaching definitions, uniform and boolean flags, phases).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "common/rule_errors.hpp"
#include "fusedopt/dtype.hpp"
#include "fusedopt/kernel.hpp"
#include "fusedopt/optimizer.hpp"

namespace fusedopt::testing {

using fusedopt::RuleError;
using fusedopt::lang::Op;
using fusedopt::lang::parse_rule;
using fusedopt::lang::SymKind;

namespace {

/// Whether the checker proves state `name` of `rule` never negative (Symbol::nonnegative).
bool proven_nonnegative(const fusedopt::lang::Rule& rule, const std::string& name) {
  const int sym = rule.find(name);
  REQUIRE(sym >= 0);
  return rule.symbols[static_cast<std::size_t>(sym)].nonnegative;
}

}  // namespace

TEST_SUITE("lang") {
  TEST_CASE("checker reports an unknown name with the nearest declared name") {
    auto e = parse_error("param p\ngrad g\nhyper beta1 = 0.9\np = p - bta1 * g\n");
    REQUIRE(e);
    CHECK(e->line() == 4);
    CHECK(e->column() == 9);
    CHECK(e->message() == "unknown name 'bta1'");
    CHECK(e->hint() == "did you mean 'beta1'?");
    e = parse_error(kHeader + "tmp = g\np = p - lr * tpm\n");
    REQUIRE(e);
    CHECK(e->hint() == "did you mean 'tmp'?");
    e = parse_error(kHeader + "p = p - lr * zzz_unrelated\n");
    REQUIRE(e);
    CHECK(contains(e->hint(), "declare it"));
    CHECK_THROWS_WITH_AS(parse_rule("param p\ngrad g\np = p - stpe\n", "x.rule"),
                         doctest::Contains("hint: did you mean 'step'?"), RuleError);
  }

  TEST_CASE("checker refuses assignment to the gradient, a hyper and step") {
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "g = g * 2\np = p - g\n", 4, 1,
                              "cannot assign to the gradient 'g'");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = p - g\nlr = 2\n", 5, 1, "cannot assign to hyper 'lr'");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "step = step + 1\np = p - g\n", 4, 1,
                              "cannot assign to 'step'");
  }

  TEST_CASE("checker refuses assignment to function and reserved names") {
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "sqrt = 2\n", 4, 1,
                              "cannot assign to 'sqrt': it is a built-in function");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "lerp = 2\n", 4, 1,
                              "cannot assign to 'lerp': it is a built-in function");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "fo_load = 2\n", 4, 1, "reserved for generated code");
  }

  TEST_CASE("checker reports a temporary used before it is assigned") {
    auto e = parse_error(kHeader + "p = p - lr * u\nu = g * 2\n");
    REQUIRE(e);
    CHECK(e->line() == 4);
    CHECK(e->column() == 14);
    CHECK(e->message() == "'u' is used before it is assigned");
    CHECK(e->hint() ==
          "it is first assigned at line 5; to carry its value from one step to the next, "
          "declare it: 'state u = 0'");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "u = u + 1\np = p - u\n", 4, 5,
                              "'u' is used before it is assigned");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "output o\np = p - o\no = p\n", 5, 9,
                              "'o' is used before it is assigned");
  }

  TEST_CASE("a value carried to the next step without a state: the hint says to declare one") {
    // The newcomer's previous-gradient rule: 'prev' is read before this step assigns it.
    auto e = parse_error(kHeader + "d = g - prev\np = p - lr * d\nprev = g\n");
    REQUIRE(e);
    CHECK(e->message() == "'prev' is used before it is assigned");
    CHECK(contains(e->hint(), "declare it: 'state prev = 0'"));
    // Declared as a state, the same rule is accepted.
    CHECK_NOTHROW(
        parse_rule("param p\ngrad g\nstate prev = 0\nhyper lr = 0.1\n"
                   "d = g - prev\np = p - lr * d\nprev = g\n",
                   "prev.rule"));
  }

  TEST_CASE(
      "booleans and numbers are distinct types: a boolean used as a number is a "
      "RuleError whose hint names the fix") {
    const std::string h = "param p\ngrad g\nstate m = 0\nhyper lr = 0.1\n";
    auto e = parse_error(h + "m = g > 0\np = p - lr * m\n");
    REQUIRE(e);
    CHECK(e->line() == 5);
    CHECK(e->message() == "state 'm' holds a number, and 'g > 0' is a boolean");
    CHECK(e->hint() == "assign 1 or 0: 'm = where(g > 0, 1, 0)'");
    e = parse_error(h + "p = where(g, p - lr, p)\n");
    REQUIRE(e);
    CHECK(e->message() == "the condition of where() is a boolean, and 'g' is a number");
    CHECK(contains(e->hint(), "where(g != 0, ...)"));
    e = parse_error(h + "p = p - lr * (g > 0)\n");
    REQUIRE(e);
    CHECK(e->message() == "'*' computes with numbers, and 'g > 0' is a boolean");
    CHECK(contains(e->hint(), "where(g > 0, 1, 0)"));
    e = parse_error(h + "p = p - -(g > 0)\n");  // a unary minus is '-' as written
    REQUIRE(e);
    CHECK(e->message() == "'-' computes with numbers, and 'g > 0' is a boolean");
    e = parse_error(h + "c = g > 0\np = p - lr * c\n");
    REQUIRE(e);
    CHECK(e->message() == "'*' computes with numbers, and 'c' is a boolean");
    e = parse_error(h + "p = where(g > 0 and lr, p - lr, p)\n");
    REQUIRE(e);
    CHECK(e->message() == "'and' takes booleans, and 'lr' is a number");
    CHECK(contains(e->hint(), "lr != 0"));
    e = parse_error(h + "p = where((g > 0) == 1, p - lr, p)\n");
    REQUIRE(e);
    CHECK(e->message() == "'==' compares a boolean with a number");
    e = parse_error(h + "p = p - lr * where(g > 0, g < 1, 2)\n");
    REQUIRE(e);
    CHECK(contains(e->message(), "where() chooses between a boolean"));
    e = parse_error(h + "p = p - lr * tensor_sum(g > 0)\n");
    REQUIRE(e);
    CHECK(e->message() == "'tensor_sum' computes with numbers, and 'g > 0' is a boolean");
    e = parse_error("param p\ngrad g\nstate m = p > 0\nhyper lr = 0.1\np = p - lr * m\n");
    REQUIRE(e);
    CHECK(e->message() == "state 'm' holds a number, and its initial value 'p > 0' is a boolean");
    e = parse_error(h + "p = p - lr * -isfinite(g)\n");
    REQUIRE(e);
    CHECK(contains(e->message(), "is a boolean"));
    // Booleans where they belong: conditions, and/or/not, temporaries, where() of two.
    CHECK_NOTHROW(parse_rule(h + "c = g > 0 and not (g > 1)\nok = isfinite(g) or c\n"
                                 "b = where(c, ok, c == ok)\np = where(b, p - lr * g, p)\n"
                                 "m = m + 1\n",
                             "booleans.rule"));
  }

  TEST_CASE("checker reports a rule that updates nothing") {
    auto e = parse_error("param p\ngrad g\nx = g * 2\n");
    REQUIRE(e);
    CHECK(e->line() == 1);
    CHECK(e->column() == 7);
    CHECK(contains(e->message(), "the rule updates nothing"));
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g\n", 1, 7, "the rule updates nothing");
  }

  TEST_CASE("checker reports a state that is never updated and an output never assigned") {
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g\nstate m = 0, v = 0\nm = g\np = p - m\n", 3, 14,
                              "state 'v' is never updated");
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g\noutput o, q\np = p - g\nq = p\n", 3, 8,
                              "output 'o' is never assigned");
  }

  TEST_CASE("checker reports duplicate declarations with the first one in the hint") {
    auto e = parse_error("param p\ngrad g\nstate m = 0\nhyper m = 1\np = p - g\n");
    REQUIRE(e);
    CHECK(e->line() == 4);
    CHECK(e->column() == 7);
    CHECK(e->message() == "'m' is already declared");
    CHECK(e->hint() == "'m' is declared as a state at line 3, column 7");
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad p\n", 2, 6, "'p' is already declared");
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g\nstate m = 0, m = 1\n", 3, 14,
                              "'m' is already declared");
  }

  TEST_CASE("checker requires exactly one param and one grad") {
    FUSEDOPT_CHECK_RULE_ERROR("param p\nparam q\ngrad g\np = p - g\n", 2, 1,
                              "a rule has exactly one param");
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g\ngrad h\np = p - g\n", 3, 1,
                              "a rule has exactly one grad");
    FUSEDOPT_CHECK_RULE_ERROR("grad g\nhyper lr = 1\n\np = p - g\n", 4, 1,
                              "the rule declares no param");
    FUSEDOPT_CHECK_RULE_ERROR("param p\np = p - 1\n", 2, 1, "the rule declares no grad");
    FUSEDOPT_CHECK_RULE_ERROR("", 1, 1, "the rule declares no param");
  }

  TEST_CASE("checker refuses to declare keywords, functions and step") {
    FUSEDOPT_CHECK_RULE_ERROR("param sqrt\n", 1, 7,
                              "cannot declare 'sqrt': it is a built-in function");
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g\nhyper step = 1\n", 3, 7, "cannot declare 'step'");
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g\nstate where = 0\n", 3, 7, "cannot declare 'where'");
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g\noutput scalar\n", 3, 8, "cannot declare 'scalar'");
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g\nhyper tensor_norm = 1\n", 3, 7,
                              "cannot declare 'tensor_norm': it is a built-in function");
  }

  TEST_CASE("checker limits a state's initial value to numbers, hypers and the param") {
    auto rule = parse_rule(
        "param p\nstate m = lr * p + 1\nhyper lr = 0.5\ngrad g\nm = m\np = p - g\n", "init.rule");
    const auto& init = *rule->symbols[rule->states.at(0)].init;
    CHECK(init.op == Op::Add);
    CHECK_FALSE(init.uniform);
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g\nstate m = g\n", 3, 11,
                              "the initial value of state 'm' cannot use the gradient 'g'");
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g\nstate m = 0, v = m\n", 3, 18,
                              "cannot use state 'm'");
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g\nstate m = step\n", 3, 11, "cannot use 'step'");
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g\nstate m = t\nt = 1\n", 3, 11,
                              "cannot use the temporary 't'");
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g\nstate m = lrr\nhyper lr = 1\n", 3, 11,
                              "unknown name 'lrr'");
  }

  TEST_CASE("checker links each temporary read to the assignment that reaches it") {
    auto rule =
        parse_rule(kHeader + "t = g\nt = t * 2\np = p - lr * t\noutput_x = t\n", "def.rule");
    REQUIRE(rule->stmts.size() == 4);
    // t = t * 2 reads the first t (statement 0); p = ... reads the second (statement 1).
    CHECK(rule->stmts[1].value->args[0]->def == 0);
    CHECK(rule->stmts[2].value->args[1]->args[1]->def == 1);
    const int t = rule->find("t");
    REQUIRE(t >= 0);
    CHECK(rule->symbols[t].kind == SymKind::Temp);
    CHECK(rule->symbols[t].written);
    CHECK(rule->symbols[t].loc.line == 4);
    CHECK(rule->find("output_x") >= 0);
    CHECK(rule->find("nope") == -1);
    // Params and states read their current value, not a definition.
    CHECK(rule->stmts[2].value->args[0]->def == -1);
  }

  TEST_CASE("checker marks uniform and boolean expressions") {
    auto rule = parse_rule(kHeader +
                               "c = lr * 2 ^ step\n"
                               "d = c + p\n"
                               "e = where(isfinite(g), c, 0)\n"
                               "f = g > 0 and not (lr < 1)\n"
                               "k = c\n"
                               "p = where(f, p - k * d * e, p)\n",
                           "flags.rule");
    const auto& s = rule->stmts;
    CHECK(s[0].value->uniform);
    CHECK_FALSE(s[0].value->boolean);
    CHECK_FALSE(s[1].value->uniform);
    CHECK(s[1].value->args[0]->uniform);  // the temporary c has a uniform definition
    CHECK_FALSE(s[1].value->args[1]->uniform);
    CHECK_FALSE(s[2].value->uniform);
    CHECK(s[2].value->args[0]->boolean);
    CHECK_FALSE(s[2].value->args[0]->uniform);
    CHECK(s[3].value->boolean);
    CHECK(s[3].value->args[1]->boolean);
    CHECK(s[3].value->args[1]->uniform);
    CHECK(s[4].value->uniform);
    CHECK(s[5].value->args[0]->boolean);  // reads f, a boolean temporary
  }

  TEST_CASE("checker gives every symbol kind an index and one phase covering all statements") {
    auto rule = parse_rule(
        "param p\ngrad g\nstate a = 0, b = 1\nhyper x = 1, y = 2\noutput o\n"
        "a = g\nb = a\nt = 1\no = t\np = p - x * a * b\n",
        "kinds.rule");
    CHECK(rule->symbols[rule->states[1]].index == 1);
    CHECK(rule->symbols[rule->hypers[1]].index == 1);
    CHECK(rule->symbols[rule->outputs[0]].index == 0);
    REQUIRE(rule->step >= 0);
    CHECK(rule->symbols[rule->step].kind == SymKind::Step);
    CHECK(rule->symbols[rule->step].name == "step");
    CHECK(rule->reduction_passes == 0);
    for (const auto& st : rule->stmts) CHECK(st.phase == 0);
    CHECK(std::string(fusedopt::lang::to_string(SymKind::Output)) == "output");
    CHECK(std::string(fusedopt::lang::to_string(SymKind::Temp)) == "temporary");
  }

  TEST_CASE("checker names the rule after its file") {
    CHECK(parse_rule("param p\ngrad g\np = p - g\n", "dir/sub/my_sgd.rule")->name == "my_sgd");
    CHECK(parse_rule("param p\ngrad g\np = p - g\n", "C:\\rules\\lion.rule")->name == "lion");
    CHECK(parse_rule("param p\ngrad g\np = p - g\n", "plain")->name == "plain");
    auto rule = parse_rule("param p\ngrad g\np = p - g\n", "a/b.rule");
    CHECK(rule->file == "a/b.rule");
    CHECK(rule->text == "param p\ngrad g\np = p - g\n");
  }

  TEST_CASE("a scalar state is one value per tensor: uniform start, per-tensor updates") {
    using fusedopt::lang::SymKind;
    auto rule = parse_rule(
        "param p\ngrad g\nscalar eta = lr, n = 0\nhyper lr = 0.1\n"
        "n = n + 1\neta = lr / sqrt(n) + tensor_norm(g)\np = p - eta * g\n",
        "scalars.rule");
    REQUIRE(rule->scalars.size() == 2);
    CHECK(rule->symbols[rule->scalars[0]].name == "eta");
    CHECK(rule->symbols[rule->scalars[0]].kind == SymKind::Scalar);
    CHECK(rule->symbols[rule->scalars[1]].name == "n");
    CHECK(rule->states.empty());
    // Refused, each at the offending place:
    const std::string head = "param p\ngrad g\nhyper lr = 0.1\n";
    FUSEDOPT_CHECK_RULE_ERROR(head + "scalar s = p\ns = s + 1\np = p - g\n", 4, 12, "scalar 's'");
    FUSEDOPT_CHECK_RULE_ERROR(head + "scalar s = 1\ns = s * g\np = p - s * g\n", 5, 1,
                              "scalar 's' is one value per tensor");
    FUSEDOPT_CHECK_RULE_ERROR(head + "scalar s = 1\np = p - s * g\n", 4, 8,
                              "scalar 's' is never updated");
    FUSEDOPT_CHECK_RULE_ERROR(head + "scalar s\ns = 1\np = p - g\n", 4, 8,
                              "scalar 's' needs an initial value");
  }

  TEST_CASE("row and col states: one value per row or column, from row_mean and col_mean") {
    using fusedopt::lang::Level;
    using fusedopt::lang::Scope;
    // torch's Adafactor, factored second moment.
    auto rule = parse_rule(
        "param p\ngrad g\nrow r = 0\ncol c = 0\nhyper b = 0.1, eps1 = 1e-30\n"
        "r = lerp(r, row_mean(g * g), b)\nc = lerp(c, col_mean(g * g), b)\n"
        "v = where(dims >= 2, r * c / max(matrix_mean(r), eps1), r)\n"
        "p = p - g * rsqrt(v)\n",
        "factored.rule");
    REQUIRE(rule->row_states.size() == 1);
    REQUIRE(rule->col_states.size() == 1);
    CHECK(rule->num_row_reductions == 1);
    CHECK(rule->num_col_reductions == 1);
    CHECK(rule->num_matrix_reductions == 1);
    CHECK(rule->reduction_passes == 1);  // row_mean and col_mean in pass 0
    for (const auto& red : rule->reductions) {
      // matrix_mean is computed in pass 0's finalize, after the row means it reads.
      CHECK(red.pass == 0);
    }
    CHECK(rule->stmts[0].value->level == Level::Row);
    CHECK(rule->stmts[1].value->level == Level::Col);
    CHECK(rule->stmts[2].value->level == Level::Element);  // a row value times a column value
    const std::string head = "param p\ngrad g\nrow r = 0\ncol c = 0\n";
    const std::string tail = "p = p - g * r * c\n";
    FUSEDOPT_CHECK_RULE_ERROR(head + "r = r + g\nc = c + 1\n" + tail, 5, 1,
                              "row state 'r' is one value per row");
    FUSEDOPT_CHECK_RULE_ERROR(head + "r = r + c\nc = c + 1\n" + tail, 5, 1,
                              "row state 'r' is one value per row");
    FUSEDOPT_CHECK_RULE_ERROR(head + "r = r + 1\nc = c + row_mean(g)\n" + tail, 6, 1,
                              "col state 'c' is one value per column");
    FUSEDOPT_CHECK_RULE_ERROR(head + "r = r + 1\n" + tail, 4, 5, "col state 'c' is never updated");
    FUSEDOPT_CHECK_RULE_ERROR(head + "r = r + matrix_mean(g)\nc = c + 1\n" + tail, 5, 9,
                              "'matrix_mean' averages a row or a column value");
    FUSEDOPT_CHECK_RULE_ERROR(head + "r = r + matrix_mean(r)\nc = c + 1\n" + tail, 5, 9,
                              "of a value known before the first pass");
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g\nrow r = p\nr = r + 1\np = p - g\n", 3, 9,
                              "the initial value of row state 'r'");
    FUSEDOPT_CHECK_RULE_ERROR(
        "param p\ngrad g\nscalar s = 0\nrow r = 0\nr = r + 1\n"
        "s = s + r\np = p - g\n",
        6, 1, "scalar 's' is one value per tensor");
  }

  TEST_CASE("the sign proof reads each temporary once: a 60-line chain of x = x + x parses") {
    // Each line reads the line before twice; proving the definition again at every read
    // took 2^60 steps. y = max(y, y) is the same chain with a value not proven (max tries
    // both arguments then).
    std::string text = "param p\ngrad g\nstate m = 0, n = 0\nx = abs(g)\ny = g\n";
    for (int i = 0; i < 60; ++i) text += "x = x + x\ny = max(y, y)\n";
    text += "m = x\nn = y\np = p - m - n\n";
    auto rule = parse_rule(text, "chain.rule");
    CHECK(rule->stmts.size() == 125);
    CHECK(proven_nonnegative(*rule, "m"));        // abs(g) * 2^60
    CHECK_FALSE(proven_nonnegative(*rule, "n"));  // g
    // A temporary read by b depends on a, which one of its assignments makes negative: b
    // falls with a, although t was proven while a was still assumed non-negative.
    const std::string ab = "param p\ngrad g\nstate b = 0, a = 0\nt = a + abs(g)\nb = b + t + t\n";
    rule = parse_rule(ab + "a = a - g\np = p - a - b\n", "ab.rule");
    CHECK_FALSE(proven_nonnegative(*rule, "a"));
    CHECK_FALSE(proven_nonnegative(*rule, "b"));
    rule = parse_rule(ab + "a = a + g * g\np = p - a - b\n", "ab.rule");
    CHECK(proven_nonnegative(*rule, "a"));
    CHECK(proven_nonnegative(*rule, "b"));
  }

  TEST_CASE("clamp(x, lo, hi) is proven non-negative only with hi too: hi < lo gives hi") {
    using fusedopt::Quant;
    // clamp = min(max(x, lo), hi): with hi = -1 this adds -1 every step.
    const std::string text =
        "param p\ngrad g\nstate v = 0\nhyper hi = -1\nstorage v = q8\n"
        "v = v + clamp(g, 0, hi)\np = p - v\n";
    CHECK_FALSE(proven_nonnegative(*parse_rule(text, "clampq2.rule"), "v"));
    // So 'q8' is the signed map, which keeps the sign (the unsigned one stored 0).
    CHECK(fusedopt::resolve_state_storage(fusedopt::Rule::parse(text, "clampq2.rule"),
                                          fusedopt::OptimizerOptions{}) ==
          std::vector<Quant>{Quant::Q8S});
    const std::string head = "param p\ngrad g\nstate v = 0\nhyper lo = 0, hi = 1\nv = v + ";
    auto proven = [&](const std::string& value) {
      return proven_nonnegative(*parse_rule(head + value + "\np = p - v\n", "c.rule"), "v");
    };
    CHECK(proven("clamp(g, 0, 1)"));
    CHECK(proven("clamp(g, 1e-8, g * g)"));
    // fo_max(NaN, lo) is lo: abs(g) is NaN for a NaN g, abs(lo) for a NaN lo.
    CHECK_FALSE(proven("clamp(abs(g), lo, 1)"));
    CHECK_FALSE(proven("clamp(g, abs(lo), g * g)"));
    CHECK_FALSE(proven("clamp(g, 0, hi)"));
    CHECK_FALSE(proven("clamp(g, 0, -1)"));
    CHECK_FALSE(proven("clamp(g, lo, 1)"));  // lo may be negative, and g
    CHECK_FALSE(proven("clamp(abs(g), 0, g)"));
  }

  TEST_CASE("the sign proof follows NaN through max and min, and -0 through sqrt and division") {
    using fusedopt::Quant;
    // fmaxf(NaN, -1) is -1: sqrt(g) is NaN for g < 0, so v goes negative.
    const std::string text =
        "param p\ngrad g\nstate v = 0\nstorage v = q8\n"
        "v = max(sqrt(g), 0 - 1) + 0.5 * v\np = p - 0.01 * v\n";
    CHECK_FALSE(proven_nonnegative(*parse_rule(text, "maxnan.rule"), "v"));
    CHECK(fusedopt::resolve_state_storage(fusedopt::Rule::parse(text, "maxnan.rule"),
                                          fusedopt::OptimizerOptions{}) ==
          std::vector<Quant>{Quant::Q8S});
    const std::string head = "param p\ngrad g\nstate v = 0\nhyper h = 1\nv = ";
    auto proven = [&](const std::string& value) {
      return proven_nonnegative(*parse_rule(head + value + "\np = p - v\n", "s.rule"), "v");
    };
    CHECK(proven("max(g, 0)"));  // a bound that is never NaN
    CHECK(proven("max(v, g * g)"));
    CHECK(proven("min(v, abs(g)) + sqrt(g)"));
    CHECK(proven("v + where(g > h, 1, v)"));
    CHECK_FALSE(proven("max(g, abs(h))"));   // abs(h) is NaN for a NaN h
    CHECK_FALSE(proven("max(sqrt(g), g)"));  // so is sqrt(g) for g < 0
    CHECK_FALSE(proven("min(abs(g), g)"));
    CHECK_FALSE(proven("1 / sqrt(g)"));        // sqrt(-0) is -0, and 1 / -0 is -inf
    CHECK_FALSE(proven("rsqrt(sqrt(g))"));     // rsqrt(-0) is -inf
    CHECK_FALSE(proven("sqrt(g) ^ (0 - 1)"));  // powf(-0, -1) is -inf
    CHECK(proven("1 / sqrt(g * g)"));
    CHECK(proven("rsqrt(abs(g)) + g ^ 2 + g ^ 4 + sqrt(g) ^ 3"));
    CHECK(proven("g ^ 1e20"));  // an even integer (no cast of 1e20 to an integer)
    CHECK_FALSE(proven("g ^ 3"));
  }
}

}  // namespace fusedopt::testing
