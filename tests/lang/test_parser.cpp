// Grammar: precedence and associativity, calls, declarations, and syntax diagnostics.
#include <doctest/doctest.h>

#include <string>
#include <utility>

#include "common/rule_errors.hpp"

namespace fusedopt::testing {

using fusedopt::RuleError;
using fusedopt::lang::dump;
using fusedopt::lang::parse_rule;

namespace {

const std::string kVars = kHeader + "hyper a = 1, b = 2, c = 3, d = 4\n";

/// `expr` as the statement `x = expr` after the booleans A and B, used as its type asks (a
/// number, or else a condition), dumped.
std::string expr_dump(const std::string& expr) {
  const std::string head = kVars + "A = a > 0\nB = b > 0\nx = " + expr + "\n";
  auto rule = [&] {
    try {
      return parse_rule(head + "p = p - x * g\n", "t.rule");
    } catch (const RuleError& e) {
      if (!contains(e.message(), "is a boolean")) throw;
      return parse_rule(head + "p = where(x, p - g, p)\n", "t.rule");
    }
  }();
  return dump(*rule, *rule->stmts.at(2).value);
}

}  // namespace

TEST_SUITE("lang") {
  TEST_CASE("parser gives * and / precedence over + and -, all left-associative") {
    CHECK(expr_dump("a + b * c") == "(+ a (* b c))");
    CHECK(expr_dump("a - b - c") == "(- (- a b) c)");
    CHECK(expr_dump("a / b / c") == "(/ (/ a b) c)");
    CHECK(expr_dump("a * b + c * d") == "(+ (* a b) (* c d))");
    CHECK(expr_dump("(a + b) * c") == "(* (+ a b) c)");
  }

  TEST_CASE("parser makes ^ right-associative and tighter than a unary minus on its left") {
    CHECK(expr_dump("a ^ b ^ c") == "(^ a (^ b c))");
    CHECK(expr_dump("-a ^ 2") == "(neg (^ a 2))");
    CHECK(expr_dump("a ^ -b") == "(^ a (neg b))");
    CHECK(expr_dump("2 * a ^ b") == "(* 2 (^ a b))");
    CHECK(expr_dump("(-a) ^ 2") == "(^ (neg a) 2)");
    CHECK(expr_dump("- - a") == "(neg (neg a))");
    CHECK(expr_dump("+a") == "a");
    CHECK(expr_dump("a * -b") == "(* a (neg b))");
  }

  TEST_CASE("parser orders or below and below not below comparisons") {
    CHECK(expr_dump("a < b or c < d and a > b") == "(or (< a b) (and (< c d) (> a b)))");
    CHECK(expr_dump("not a < b") == "(not (< a b))");
    CHECK(expr_dump("not not A") == "(not (not A))");
    CHECK(expr_dump("not A and B") == "(and (not A) B)");
    CHECK(expr_dump("a + b <= c * d") == "(<= (+ a b) (* c d))");
    CHECK(expr_dump("(a == b) != (c >= d)") == "(!= (== a b) (>= c d))");
  }

  TEST_CASE("parser rejects chained comparisons") {
    FUSEDOPT_CHECK_RULE_ERROR(kVars + "x = a < b < c\n", 5, 11, "comparisons cannot be chained");
    FUSEDOPT_CHECK_RULE_ERROR(kVars + "x = a == b == c\n", 5, 12, "comparisons cannot be chained");
    CHECK(expr_dump("(a < b) == B") == "(== (< a b) B)");
  }

  TEST_CASE("parser reads calls of every built-in function") {
    CHECK(expr_dump("where(a > 0, sqrt(b), rsqrt(c))") == "(where (> a 0) (sqrt b) (rsqrt c))");
    CHECK(expr_dump("clamp(exp(a), log(b), abs(sign(c)))") ==
          "(clamp (exp a) (log b) (abs (sign c)))");
    CHECK(expr_dump("min(a, max(b, c))") == "(min a (max b c))");
    CHECK(expr_dump("pow(a, tanh(b))") == "(pow a (tanh b))");
    CHECK(expr_dump("isfinite(a) or B") == "(or (isfinite a) B)");
    CHECK(expr_dump("log1p(expm1(floor(a)))") == "(log1p (expm1 (floor a)))");
    CHECK(expr_dump("mod(a, b)") == "(% a b)");
  }

  TEST_CASE("parser reads '%' as mod, at the precedence of '*' and '/', left to right") {
    CHECK(expr_dump("a + b % c") == "(+ a (% b c))");
    CHECK(expr_dump("a % b * c") == "(* (% a b) c)");
    CHECK(expr_dump("a / b % c") == "(% (/ a b) c)");
    CHECK(expr_dump("-a % b ^ 2") == "(% (neg a) (^ b 2))");
  }

  TEST_CASE("parser reports the '(' that is never closed") {
    auto e = parse_error(kHeader + "p = p - (lr * (g + 1)\n");
    REQUIRE(e);
    CHECK(e->line() == 4);
    CHECK(e->column() == 9);
    CHECK(e->message() == "'(' is never closed");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = p - sqrt(g\n", 4, 13, "'(' is never closed");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = p - max(g, (1", 4, 16, "'(' is never closed");
  }

  TEST_CASE("parser reports a stray ')'") {
    CHECK_THROWS_WITH_AS(parse_rule(kHeader + "p = p - g)\n", "stray.rule"),
                         doctest::Contains("stray.rule:4:10: error: unmatched ')'"), RuleError);
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + ")\n", 4, 1, "unmatched ')'");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = (p - g))\n", 4, 12, "unmatched ')'");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = p - )\n", 4, 9, "expected an expression, got ')'");
  }

  TEST_CASE("parser reports a missing operator inside parentheses") {
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = (p g)\n", 4, 8, "expected ')' to close");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = p g\n", 4, 7, "expected an operator");
  }

  TEST_CASE("parser reports an unknown function with the nearest name") {
    auto e = parse_error(kHeader + "p = p - lr * sqr(g)\n");
    REQUIRE(e);
    CHECK(e->column() == 14);
    CHECK(e->message() == "unknown function 'sqr'");
    CHECK(e->hint() == "did you mean 'sqrt'?");
    e = parse_error(kHeader + "p = p - lr * clmap(g, 0, 1)\n");
    REQUIRE(e);
    CHECK(e->hint() == "did you mean 'clamp'?");
    e = parse_error(kHeader + "p = p - lr * frobnicate(g)\n");
    REQUIRE(e);
    CHECK(contains(e->hint(), "no user-defined functions"));
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = p(1)\n", 4, 5, "unknown function 'p'");
    e = parse_error(kHeader + "p = p - lr * tensor_nrom(g)\n");
    REQUIRE(e);
    CHECK(e->line() == 4);
    CHECK(e->column() == 14);
    CHECK(e->hint() == "did you mean 'tensor_norm'?");
  }

  TEST_CASE("parser reports a wrong argument count with the expected count") {
    auto e = parse_error(kHeader + "p = clamp(p, 0)\n");
    REQUIRE(e);
    CHECK(e->column() == 5);
    CHECK(e->message() == "'clamp' takes 3 arguments, got 2");
    CHECK(e->hint() == "usage: clamp(x, lo, hi)");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = sqrt()\n", 4, 5, "'sqrt' takes 1 argument, got 0");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = max(p, g, lr)\n", 4, 5,
                              "'max' takes 2 arguments, got 3");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = where(p > 0, p)\n", 4, 5,
                              "'where' takes 3 arguments, got 2");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = max(p, )\n", 4, 12, "expected an expression, got ')'");
  }

  TEST_CASE("parser rejects a function name used without a call") {
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = p - sqrt * g\n", 4, 9, "'sqrt' is a function");
  }

  TEST_CASE("parser reads signed hyper defaults and multi-name declarations") {
    auto rule = parse_rule(
        "param p\ngrad g\nhyper a = -1e-3, b = +2, c = .5\n"
        "state m = 0, v = p * a, w = sqrt(abs(p)) + b\noutput o, q\n"
        "m = m + g\nv = v\nw = w\np = p - a * m\no = p\nq = 2 * o\n",
        "decls.rule");
    REQUIRE(rule->hypers.size() == 3);
    CHECK(rule->symbols[rule->hypers[0]].default_value == -1e-3);
    CHECK(rule->symbols[rule->hypers[1]].default_value == 2.0);
    CHECK(rule->symbols[rule->hypers[2]].default_value == 0.5);
    REQUIRE(rule->states.size() == 3);
    CHECK(dump(*rule, *rule->symbols[rule->states[1]].init) == "(* p a)");
    CHECK(rule->outputs.size() == 2);
  }

  TEST_CASE("parser requires a number for a hyper's default") {
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g\nhyper lr = p\n", 3, 12, "must be a number");
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g\nhyper lr = 1 * 2\n", 3, 14,
                              "expected ',' or the end of the line");
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g\nhyper lr\n", 3, 7, "needs a default value");
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g\nstate m\n", 3, 7, "needs an initial value");
  }

  TEST_CASE("parser rejects declarations after the first statement") {
    auto e = parse_error("param p\ngrad g\np = p - g\nstate m = 0\n");
    REQUIRE(e);
    CHECK(e->line() == 4);
    CHECK(e->column() == 1);
    CHECK(e->message() == "declarations must come before the first statement");
    CHECK(contains(e->hint(), "line 3"));
  }

  TEST_CASE("parser rejects a second name on a param or grad line") {
    FUSEDOPT_CHECK_RULE_ERROR("param p, q\n", 1, 8, "'param' declares exactly one name");
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g, h\n", 2, 7, "'grad' declares exactly one name");
  }

  TEST_CASE("parser requires '=' in a statement") {
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p == g\n", 4, 3, "expected '=' after 'p'");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p\n", 4, 2, "expected '=' after 'p'");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = \n", 4, 5, "expected an expression");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = p = g\n", 4, 7, "expected an operator");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "+ p\n", 4, 1, "expected a declaration or a statement");
  }

  TEST_CASE("parser rejects a keyword where a name is declared") {
    FUSEDOPT_CHECK_RULE_ERROR("param and\n", 1, 7, "cannot declare 'and': it is a keyword");
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g\nstate not = 0\n", 3, 7,
                              "cannot declare 'not': it is a keyword");
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g\nhyper lr = 1, state = 2\n", 3, 15,
                              "cannot declare 'state': it is a keyword");
  }

  TEST_CASE("a declaration without a name gets a whole declaration of its kind as the example") {
    const std::pair<const char*, const char*> cases[] = {
        {"param", "param p"},         {"grad", "grad g"},     {"state", "state m = 0"},
        {"scalar", "scalar s = 0"},   {"row", "row r = 0"},   {"col", "col c = 0"},
        {"hyper", "hyper lr = 1e-3"}, {"output", "output u"}, {"storage", "storage m = q8"},
    };
    for (const auto& [keyword, example] : cases) {
      CAPTURE(keyword);
      auto e = parse_error(std::string(keyword) + " = 1\n");
      REQUIRE(e);
      CHECK(e->line() == 1);
      CHECK(e->message() == "expected a name after '" + std::string(keyword) + "', got '='");
      CHECK(e->hint() == "e.g. '" + std::string(example) + "'");
    }
  }

  TEST_CASE("parser skips blank and comment-only lines and accepts a missing final newline") {
    auto rule = parse_rule("\n\n# c\nparam p\n\n   \ngrad g\n# c\n\np = p - g", "t.rule");
    CHECK(rule->stmts.size() == 1);
    CHECK(rule->stmts[0].loc.line == 10);
  }
}

}  // namespace fusedopt::testing
