// Text that tries to smuggle C++ into generated code: each attempt is a RuleError at the
// offending character, or (for '#' lines) a comment that never reaches the AST.
#include <doctest/doctest.h>

#include <string>

#include "codegen/codegen.hpp"
#include "common/rule_errors.hpp"

namespace fusedopt::testing {

using fusedopt::RuleError;
using fusedopt::lang::dump;
using fusedopt::lang::parse_rule;

TEST_SUITE("lang") {
  TEST_CASE("injection: a statement closing the kernel is refused at the ';'") {
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = p - g; } __global__ void x() {\n", 4, 10,
                              "unexpected character ';'");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = p - g } \n", 4, 11, "unexpected character '}'");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "{\n", 4, 1, "unexpected character '{'");
  }

  TEST_CASE("injection: #include and #define are comments and reach nothing") {
    auto rule = parse_rule(
        "#include <cstdlib>\n#define p system(\"x\")\nparam p\ngrad g\n"
        "p = p - g #include \"evil.h\"\n",
        "inc.rule");
    CHECK(dump(*rule) == "p = (- p g)\n");
    CHECK(rule->symbols.size() == 3);  // p, g and step
  }

  TEST_CASE("injection: backslashes and quotes are refused at their column") {
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = p - g \\\n", 4, 11, "unexpected character '\\'");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = p - \"g\"\n", 4, 9, "strings and character literals");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = p - 'g'\n", 4, 9, "strings and character literals");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = p - g\\nx = 1\n", 4, 10, "unexpected character '\\'");
  }

  TEST_CASE("injection: names containing '__' are reserved") {
    auto e = parse_error(kHeader + "p = __builtin_trap(p)\n");
    REQUIRE(e);
    CHECK(e->line() == 4);
    CHECK(e->column() == 5);
    CHECK(e->message() == "names containing '__' are reserved");
    CHECK(contains(e->what(), "^" + std::string(13, '~') + "\n"));  // spans the whole name
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = p - a__b\n", 4, 9, "names containing '__'");
    FUSEDOPT_CHECK_RULE_ERROR("param p__\n", 1, 7, "names containing '__'");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "x__ = 1\n", 4, 1, "names containing '__'");
  }

  TEST_CASE("injection: indexing, members and pointers are refused at their column") {
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = p[0]\n", 4, 6, "indexing ('[') is not supported");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = p - g.x\n", 4, 10,
                              "member access ('.') is not supported");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = p - g->x\n", 4, 11, "expected an expression, got '>'");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = *p\n", 4, 5, "expected an expression, got '*'");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = &p\n", 4, 5, "'&' is not an operator");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = p && g\n", 4, 7, "'&' is not an operator");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = p || g\n", 4, 7, "'|' is not an operator");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = !p\n", 4, 5, "'!' is not an operator");
    // '%' is mod (emitted as fo_mod, never as itself); a second one is no operand.
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = p % % g\n", 4, 9, "expected an expression, got '%'");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = p ? g : 0\n", 4, 7, "unexpected character '?'");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = p - g.\n", 4, 10, "unexpected character '.'");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = (float)p\n", 4, 12, "expected an operator");
    FUSEDOPT_CHECK_RULE_ERROR(kHeader + "p = p - lr*g, x = 1\n", 4, 13, "expected an operator");
  }

  TEST_CASE("injection: C++ keywords and CUDA names are plain names, never pasted") {
    // A rule name becomes v_NAME in generated code (hypers are read by index), so 'asm',
    // 'blockIdx' or 'return' cannot reach C++ as themselves (tests/jit compiles such a rule).
    auto rule = parse_rule(
        "param p\ngrad g\nhyper asm = 1\nblockIdx = g * asm\nreturn = p\n"
        "p = return - blockIdx\n",
        "names.rule");
    REQUIRE(rule);
    auto body = fusedopt::codegen::generate_body(*rule, {});
    CHECK(!contains(body.code, " asm"));
    CHECK(contains(body.code, "v_blockIdx"));
    CHECK(contains(body.code, "v_return"));
  }
}

}  // namespace fusedopt::testing
