// The counts of lang/limits.hpp: the largest legal rule (every count at its limit at once)
// parses, and one more of anything is a RuleError at the first thing past the limit.
#include <doctest/doctest.h>

#include <string>

#include "common/rule_errors.hpp"
#include "common/sized_rule.hpp"

namespace fusedopt::testing {

namespace {

using fusedopt::lang::Expr;
using fusedopt::lang::Op;
using fusedopt::lang::parse_rule;
using fusedopt::lang::Rule;
using fusedopt::lang::SymKind;

struct Counts {
  int statements = 0;
  int temporaries = 0;
  int tensors = 0;
  int hypers = 0;
  int operations = 0;
  int uniform_operations = 0;
};

void count_operations(const Expr& e, Counts& c) {
  if (e.op != Op::Number && e.op != Op::Ref) {
    ++c.operations;
    if (e.uniform) ++c.uniform_operations;
  }
  for (const auto& a : e.args) count_operations(*a, c);
}

// Counted here from the parsed rule, independently of lang/limits.cpp.
Counts count(const Rule& rule) {
  Counts c;
  c.statements = static_cast<int>(rule.stmts.size());
  for (const auto& s : rule.symbols) {
    if (s.kind == SymKind::Temp) ++c.temporaries;
    if (s.kind == SymKind::State || s.kind == SymKind::Output) ++c.tensors;
    if (s.kind == SymKind::Hyper) ++c.hypers;
    if (s.kind == SymKind::State && s.init) count_operations(*s.init, c);
  }
  for (const auto& st : rule.stmts) count_operations(*st.value, c);
  return c;
}

// The refusal of `size`, which must name `what`.
void check_refused(const RuleSize& size, const std::string& what) {
  CAPTURE(what);
  auto e = parse_error(sized_rule(size), "big.rule");
  REQUIRE(e);
  CHECK_MESSAGE(contains(e->message(), what), e->what());
  CHECK(e->line() > 0);
  CHECK(e->column() > 0);
}

}  // namespace

TEST_SUITE("lang") {
  TEST_CASE("the largest legal rule has every count at its limit and parses") {
    const RuleSize size;
    auto rule = parse_rule(sized_rule(size), "largest.rule");
    const Counts c = count(*rule);
    CHECK(c.statements == fusedopt::lang::kMaxStatements);
    CHECK(c.temporaries == fusedopt::lang::kMaxTemporaries);
    CHECK(c.tensors == fusedopt::lang::kMaxStateTensors);
    CHECK(c.hypers == fusedopt::lang::kMaxHypers);
    CHECK(c.operations == fusedopt::lang::kMaxOperations);
    CHECK(c.uniform_operations == fusedopt::lang::kMaxUniformOperations);
    CHECK(size.statements == c.statements);
    CHECK(size.temporaries == c.temporaries);
    CHECK(size.tensors == c.tensors);
    CHECK(size.hypers == c.hypers);
    CHECK(size.operations == c.operations);
    CHECK(size.uniform_operations == c.uniform_operations);
  }

  TEST_CASE("one more of any count is refused, naming the limit") {
    RuleSize z;
    z.statements += 1;
    check_refused(z, "a rule may have at most 1024 statements; this is statement 1025 of 1025");
    z = RuleSize{};
    z.temporaries += 1;
    check_refused(z, "a rule may have at most 512 temporaries; `t256` is number 513");
    z = RuleSize{};
    z.tensors += 1;
    check_refused(z, "a rule may have at most 32 state and output tensors; `o` is number 33");
    z = RuleSize{};
    z.hypers += 1;
    check_refused(z, "a rule may have at most 256 hypers; `h256` is number 257");
    z = RuleSize{};
    z.operations += 1;
    check_refused(z,
                  "a rule may have at most 2048 operations (operators and function calls); "
                  "this is operation 2049");
    z = RuleSize{};
    z.uniform_operations += 1;
    z.operations += 1;
    check_refused(z,
                  "a rule may have at most 1024 operations on hypers, `step` and constants "
                  "only; this is operation 1025 of them");
  }

  TEST_CASE("the error points at the thing past the limit") {
    RuleSize z;
    z.hypers += 1;
    auto e = parse_error(sized_rule(z), "big.rule");
    REQUIRE(e);
    CHECK(e->line() == 2 + 257);  // param, grad, then h0 .. h256
    CHECK(e->column() == 7);      // "hyper h256": the name
  }

  TEST_CASE("clipping counts what it adds: the largest rule cannot be clipped, a smaller one can") {
    fusedopt::lang::ParseOptions clip;
    clip.clip_grad_norm = true;
    try {
      parse_rule(sized_rule(RuleSize{}), "largest.rule", clip);
      FAIL("the largest legal rule parsed with clipping");
    } catch (const fusedopt::RuleError& e) {
      CHECK_MESSAGE(contains(e.message(), "this is statement 1025 of 1026"), e.what());
    }
    // Room for two statements, two temporaries, one hyper and five operations.
    RuleSize z;
    z.statements -= 2;
    z.temporaries -= 2;
    z.hypers -= 1;
    z.operations -= 6;
    z.uniform_operations -= 6;
    auto rule = parse_rule(sized_rule(z), "clipped.rule", clip);
    const Counts c = count(*rule);
    CHECK(c.statements == z.statements + 2);
    CHECK(c.hypers == z.hypers + 1);
    CHECK(c.operations <= fusedopt::lang::kMaxOperations);
  }
}

}  // namespace fusedopt::testing
