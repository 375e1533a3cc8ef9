// Size and depth limits: big rules parse in linear time, oversized ones are refused, and
// no nesting (parentheses, unary chains, operator chains) can overflow the stack.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <chrono>
#include <string>
#include <tuple>

#include "common/rule_errors.hpp"

namespace fusedopt::testing {

using fusedopt::RuleError;
using fusedopt::lang::kMaxExprDepth;
using fusedopt::lang::kMaxRuleBytes;
using fusedopt::lang::kMaxStatements;
using fusedopt::lang::kMaxTemporaries;
using fusedopt::lang::parse_rule;

namespace {

std::string repeat(const std::string& s, int n) {
  std::string out;
  out.reserve(s.size() * n);
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

const std::string kPrelude = "param p\ngrad g\n";
constexpr int kHuge = 100000;

}  // namespace

TEST_SUITE("lang") {
  TEST_CASE("a one-megabyte rule is refused at its statement 1025, in linear time") {
    std::string text = kPrelude + "hyper lr = 0.01\nstate m = 0\nt0 = g\n";
    int i = 1;
    while (text.size() < 1000000 - 64) {
      text += "t" + std::to_string(i) + " = t" + std::to_string(i - 1) + " * 0.5 + g * lr\n";
      ++i;
    }
    text += "m = m + t" + std::to_string(i - 1) + "\np = p - lr * m\n";
    REQUIRE(text.size() <= kMaxRuleBytes);
    CHECK(text.size() > 990000);
    const auto start = std::chrono::steady_clock::now();
    auto e = parse_error(text, "big.rule");
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    REQUIRE(e);
    // Statement 1 is on line 5; statement 1025 on line 1029, at its target name.
    CHECK(e->line() == 1029);
    CHECK(e->column() == 1);
    CHECK(e->message() ==
          fmt::format("a rule may have at most 1024 statements; this is statement 1025 of {}",
                      i + 2));
    // Speed is for benchmarks (STYLE.md), not asserted here; the time is only reported.
    MESSAGE("refused ", text.size(), " bytes, ", i + 2, " statements in ", seconds, " s");
  }

  TEST_CASE("150,000 chained statements with two reduction passes are refused, not a crash") {
    // Each statement reads the one before; the two chained norms make the checker schedule
    // reductions, which walked that chain recursively (a stack overflow) before counting
    // the statements.
    const int chain = 150000;
    const std::string text = kPrelude + "x=g\n" + repeat("x=x+g\n", chain) +
                             "a=tensor_norm(g)\nb=tensor_norm(g*a)\nc=tensor_sum(x)\np=p-b*c*g\n";
    REQUIRE(text.size() <= kMaxRuleBytes);
    auto e = parse_error(text, "deep.rule");
    REQUIRE(e);
    // Statement 1 is on line 3, so statement 1025 is on line 1027.
    CHECK(e->line() == 1027);
    CHECK(e->column() == 1);
    CHECK(e->message() ==
          fmt::format("a rule may have at most 1024 statements; this is statement 1025 of {}",
                      chain + 5));
  }

  TEST_CASE("at most 32 row and column states together, refused at the 33rd") {
    auto factored = [](int rows, int cols) {
      std::string text = "param p\ngrad g\n", update = "p = p - g";
      for (int k = 0; k < rows; ++k) text += "row r" + std::to_string(k) + " = 0\n";
      for (int k = 0; k < cols; ++k) text += "col c" + std::to_string(k) + " = 0\n";
      for (int k = 0; k < rows; ++k) {
        text += "r" + std::to_string(k) + " = r" + std::to_string(k) + " + row_mean(g * g)\n";
        update += " * r" + std::to_string(k);
      }
      for (int k = 0; k < cols; ++k) {
        text += "c" + std::to_string(k) + " = c" + std::to_string(k) + " + col_mean(g * g)\n";
        update += " * c" + std::to_string(k);
      }
      return text + update + "\n";
    };
    CHECK(parse_rule(factored(20, 12), "ok.rule")->row_states.size() == 20);
    for (const auto& [rows, cols, name] : {std::tuple<int, int, const char*>{20, 13, "c12"},
                                           std::tuple<int, int, const char*>{33, 0, "r32"}}) {
      auto e = parse_error(factored(rows, cols));
      REQUIRE(e);
      CHECK(e->line() == 2 + rows + cols);  // the 33rd declaration
      CHECK(e->column() == 5);              // its name
      CHECK(e->message() == fmt::format("a rule may have at most 32 row and column states; `{}` is "
                                        "number 33",
                                        name));
    }
  }

  TEST_CASE("a rule over kMaxRuleBytes is a clear error") {
    std::string text = kPrelude + "p = p - g\n";
    text += std::string(kMaxRuleBytes + 1 - text.size(), ' ');
    auto e = parse_error(text);
    REQUIRE(e);
    CHECK(e->line() == 1);
    CHECK(e->column() == 1);
    CHECK(e->message() == "the rule is 1048577 bytes, more than the limit of 1048576 bytes");
    // Exactly at the limit is fine.
    text.pop_back();
    CHECK(parse_rule(text, "limit.rule")->stmts.size() == 1);
  }

  TEST_CASE("100,000 nested parentheses are refused at the first one too deep") {
    const std::string text =
        kPrelude + "p = " + repeat("(", kHuge) + "g" + repeat(")", kHuge) + "\n";
    auto e = parse_error(text);
    REQUIRE(e);
    CHECK(e->line() == 3);
    CHECK(e->column() == 4 + kMaxExprDepth + 1);
    CHECK(e->message() == "expression is nested too deeply");
    // The limit itself is allowed.
    const std::string ok =
        kPrelude + "p = " + repeat("(", kMaxExprDepth) + "g" + repeat(")", kMaxExprDepth) + "\n";
    CHECK(parse_rule(ok, "ok.rule")->stmts.size() == 1);
  }

  TEST_CASE("100,000 unary minuses are refused without recursion trouble") {
    FUSEDOPT_CHECK_RULE_ERROR(kPrelude + "p = " + repeat("-", kHuge) + "g\n", 3,
                              4 + kMaxExprDepth + 1, "expression is nested too deeply");
    FUSEDOPT_CHECK_RULE_ERROR(kPrelude + "p = " + repeat("+", kHuge) + "g\n", 3,
                              4 + kMaxExprDepth + 1, "expression is nested too deeply");
    FUSEDOPT_CHECK_RULE_ERROR(kPrelude + "p = " + repeat("not ", kHuge) + "g\n", 3,
                              4 + 4 * kMaxExprDepth + 1, "expression is nested too deeply");
    CHECK(parse_rule(kPrelude + "p = " + repeat("-", kMaxExprDepth - 1) + "g\n", "ok.rule")
              ->stmts.size() == 1);
  }

  TEST_CASE("a 100,000-term a+a+a chain is refused because tree depth counts") {
    // The k-th '+' sits at column 4 + 2k and makes the tree k levels deep.
    FUSEDOPT_CHECK_RULE_ERROR(kPrelude + "p = " + repeat("g+", kHuge) + "g\n", 3,
                              4 + 2 * (kMaxExprDepth + 1), "expression is nested too deeply");
    FUSEDOPT_CHECK_RULE_ERROR(kPrelude + "p = " + repeat("g*", kHuge) + "g\n", 3,
                              4 + 2 * (kMaxExprDepth + 1), "expression is nested too deeply");
    CHECK(parse_rule(kPrelude + "p = " + repeat("g+", kMaxExprDepth) + "g\n", "ok.rule")
              ->stmts.size() == 1);
  }

  TEST_CASE("a 100,000-term a^a^a chain is refused at the first '^' too deep") {
    FUSEDOPT_CHECK_RULE_ERROR(kPrelude + "p = " + repeat("g^", kHuge) + "g\n", 3,
                              4 + 2 * (kMaxExprDepth + 1), "expression is nested too deeply");
    CHECK(parse_rule(kPrelude + "p = " + repeat("g^", kMaxExprDepth) + "g\n", "ok.rule")
              ->stmts.size() == 1);
  }

  TEST_CASE("100,000 nested calls are refused at the '(' too deep") {
    const std::string text =
        kPrelude + "p = " + repeat("abs(", kHuge) + "g" + repeat(")", kHuge) + "\n";
    FUSEDOPT_CHECK_RULE_ERROR(text, 3, 4 + 4 * (kMaxExprDepth + 1), "nested too deeply");
    // 50,000 levels: 100,000 would not fit in kMaxRuleBytes.
    const std::string where =
        kPrelude + "p = " + repeat("where(g, p, ", kHuge / 2) + "g" + repeat(")", kHuge / 2) + "\n";
    FUSEDOPT_CHECK_RULE_ERROR(where, 3, 4 + 12 * kMaxExprDepth + 6, "nested too deeply");
  }

  TEST_CASE("a 100,000-character name or number is handled in linear time") {
    const std::string name(kHuge, 'x');
    auto e = parse_error(kPrelude + "p = p - " + name + "\n");
    REQUIRE(e);
    CHECK(e->column() == 9);
    CHECK(e->message().size() < 200 + name.size());
    auto n = parse_error(kPrelude + "p = p - " + std::string(kHuge, '9') + "\n");
    REQUIRE(n);
    CHECK(n->message().size() < 100);
    CHECK(n->message().find("too large") != std::string::npos);
  }

  TEST_CASE("1,024 statements over 512 reused temporaries resolve to their reaching definition") {
    // a0..a511, then each name again: statement i assigns a<i % 512> from the one before.
    std::string text = kPrelude + "a0=g\n";
    for (int i = 1; i < kMaxStatements - 1; ++i) {
      text += "a" + std::to_string(i % kMaxTemporaries) + "=a" +
              std::to_string((i - 1) % kMaxTemporaries) + "\n";
    }
    text += "p = p - a" + std::to_string((kMaxStatements - 2) % kMaxTemporaries) + "\n";
    auto rule = parse_rule(text, "temps.rule");
    REQUIRE(rule->stmts.size() == static_cast<std::size_t>(kMaxStatements));
    for (int i = 1; i < kMaxStatements - 1; i += 97) {
      CHECK(rule->stmts[i].value->def == i - 1);  // defined one statement up
    }
    CHECK(rule->stmts.back().value->args[1]->def == kMaxStatements - 2);
  }
}

}  // namespace fusedopt::testing
