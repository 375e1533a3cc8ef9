// Lexical rules: numbers, comments, line ends, and the bytes a rule may not contain.
#include <doctest/doctest.h>

#include <string>

#include "common/rule_errors.hpp"

namespace fusedopt::testing {

using fusedopt::RuleError;
using fusedopt::lang::dump;
using fusedopt::lang::parse_rule;

namespace {

double number_of(const std::string& literal) {
  auto rule = parse_rule(kHeader + "x = " + literal + "\np = p - x * g\n", "t.rule");
  const auto& e = *rule->stmts.at(0).value;
  REQUIRE(e.op == fusedopt::lang::Op::Number);
  return e.number;
}

}  // namespace

TEST_SUITE("lang") {
  TEST_CASE("lexer reads decimal and scientific numbers") {
    CHECK(number_of("1") == 1.0);
    CHECK(number_of("1.5") == 1.5);
    CHECK(number_of(".5") == 0.5);
    CHECK(number_of("2.") == 2.0);
    CHECK(number_of("1e-8") == 1e-8);
    CHECK(number_of("2.5E+3") == 2500.0);
    CHECK(number_of("007") == 7.0);
    CHECK(number_of("1e-400") == 0.0);  // underflow rounds to zero, as fp32 would
  }

  TEST_CASE("lexer rejects malformed numbers as a whole token") {
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "x = 1.2.3\n", 4, 5, "malformed number '1.2.3'");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "x = 1e\n", 4, 5, "malformed number '1e'");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "x = 2 * 1e+\n", 4, 9, "malformed number '1e+'");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "x = 3abc\n", 4, 5, "malformed number '3abc'");
    auto e = parse_error(kHeader + "x = 0x1F\n");
    REQUIRE(e);
    CHECK(e->column() == 5);
    CHECK(e->message() == "malformed number '0x1F'");
    CHECK(fusedopt::testing::contains(e->hint(), "hexadecimal"));
    CHECK(fusedopt::testing::contains(e->what(), "^~~~"));
  }

  TEST_CASE("lexer rejects numbers beyond the fp32 range") {
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "x = 1e39\n", 4, 5, "too large");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "x = 1e99999999999999999999\n", 4, 5, "too large");
    CHECK(number_of("3e38") == 3e38);
  }

  TEST_CASE("a number that fp32 rounds to FLT_MAX (its %.8g form 3.4028235e38) is FLT_MAX") {
    const double flt_max = 340282346638528859811704183484516925440.0;
    CHECK(number_of("3.4028235e38") == flt_max);
    CHECK(number_of("3.40282356e38") == flt_max);
    CHECK(number_of("340282346638528859811704183484516925440") == flt_max);
    auto rule =
        parse_rule("param p\ngrad g\nhyper big = -3.4028235e38\np = p - big * g\n", "t.rule");
    CHECK(rule->symbols[rule->hypers.at(0)].default_value == -flt_max);
    // From the midpoint of FLT_MAX and 2^128 on, fp32 rounds to infinity.
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "x = 3.4028236e38\n", 4, 5, "too large");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "x = 340282356779733661637539395458142568448\n", 4, 5,
                              "too large");
  }

  TEST_CASE("a number fp32 rounds to 0 is 0, also where it is computed in double") {
    // Half of fp32's smallest subnormal (2^-150, about 7.006e-46) and below round to 0.
    CHECK(number_of("1e-46") == 0.0);
    CHECK(number_of("7e-46") == 0.0);
    CHECK(number_of("7.1e-46") == 7.1e-46);  // fp32 holds it as 2^-149: not 0
    CHECK(number_of("1e-45") == 1e-45);
    // A hyper's default and a uniform factor (computed once per launch, in double) too.
    auto rule =
        parse_rule("param p\ngrad g\nhyper e = 1e-46\np = p - 1e-46 * 1e38 * e * g\n", "t.rule");
    CHECK(rule->symbols[rule->hypers.at(0)].default_value == 0.0);
  }

  TEST_CASE("lexer treats '#' to the end of the line as a comment, #include included") {
    const std::string text =
        "#include <cstdio>\n"
        "param p   # the parameter\n"
        "grad g    #define g evil()\n"
        "hyper lr = 0.1 # ; } __global__ void x() { \"' \\\n"
        "p = p - lr * g # system(\"rm\")\n";
    auto rule = parse_rule(text, "comments.rule");
    CHECK(dump(*rule) == "p = (- p (* lr g))\n");
    for (const auto& s : rule->symbols) {
      CHECK(s.name.find("include") == std::string::npos);
      CHECK(s.name.find("define") == std::string::npos);
    }
  }

  TEST_CASE("lexer accepts CRLF line ends and keeps line numbers right") {
    std::string text = "param p\r\ngrad g\r\nhyper lr = 0.1\r\n\r\n# comment\r\np = p - lr * g\r\n";
    auto rule = parse_rule(text, "crlf.rule");
    CHECK(rule->stmts.at(0).loc.line == 6);
    CHECK(rule->stmts.at(0).loc.col == 1);
    // An error on line 7 of a CRLF file says line 7, and its source line has no CR.
    text += "x = p +\r\n";
    auto e = parse_error(text);
    REQUIRE(e);
    CHECK(e->line() == 7);
    CHECK(e->column() == 8);
    CHECK(e->source_line() == "x = p +");
    CHECK(e->message() == "expected an expression, got end of line");
  }

  TEST_CASE("lexer accepts tabs as whitespace") {
    auto rule = parse_rule("param\tp\ngrad\tg\n\tp\t=\tp -\tg\t# tab\tcomment\n", "tabs.rule");
    CHECK(rule->stmts.size() == 1);
    auto e = parse_error("param p\ngrad g\n\tp = p - q\n");
    REQUIRE(e);
    CHECK(e->column() == 10);  // columns count bytes, a tab is one
  }

  TEST_CASE("lexer reports control characters with their name at their column") {
    FUSEDOPT_CHECK_RULE_ERROR(std::string("param p\ngrad g\np = p -") + '\0' + " g\n", 3, 8,
                              "control character 0x00 (NUL)");
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g\rp = p - g\n", 2, 7, "control character 0x0D (CR)");
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g\np = p - g\x1b[2J\n", 3, 10,
                              "control character 0x1B (ESC)");
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g\np = p - g\x7f\n", 3, 10,
                              "control character 0x7F (DEL)");
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g\np = p - g\v\n", 3, 10,
                              "control character 0x0B (VT)");
    // Comments are held to the same rule: nothing invisible hides in a rule.
    FUSEDOPT_CHECK_RULE_ERROR(std::string("param p # a") + '\0' + "b\ngrad g\np = p - g\n", 1, 12,
                              "control character 0x00 (NUL)");
  }

  TEST_CASE("lexer never echoes control bytes into the diagnostic's source line") {
    auto e = parse_error("param p\ngrad g\np = p - g\x1b[2J\n");
    REQUIRE(e);
    CHECK(e->source_line() == "p = p - g?[2J");
    CHECK(std::string(e->what()).find('\x1b') == std::string::npos);
  }

  TEST_CASE("lexer reports a non-ASCII byte at its column, in code and in comments") {
    FUSEDOPT_CHECK_RULE_ERROR("param p\ngrad g\nhyper \xc3\x9f = 1\np = p - g\n", 3, 7,
                              "non-ASCII byte 0xC3");
    FUSEDOPT_CHECK_RULE_ERROR("# caf\xc3\xa9\nparam p\ngrad g\np = p - g\n", 1, 6,
                              "non-ASCII byte 0xC3");
    FUSEDOPT_CHECK_RULE_ERROR("\xef\xbb\xbfparam p\n", 1, 1, "non-ASCII byte 0xEF");
  }

  TEST_CASE("lexer rejects '**' and points to '^'") {
    auto e = parse_error(kHeader + "p = p ** 2\n");
    REQUIRE(e);
    CHECK(e->column() == 7);
    CHECK(e->message() == "'**' is not an operator");
    CHECK(fusedopt::testing::contains(e->hint(), "'^'"));
  }

  TEST_CASE("lexer rejects names with a leading underscore") {
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "_x = 1\n", 4, 1, "must start with a letter");
  }
}

}  // namespace fusedopt::testing
