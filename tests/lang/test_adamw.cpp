// The AdamW rule of docs (RULES.md) end to end: symbols, statements, flags and phases.
#include <doctest/doctest.h>

#include <string>

#include "common/rule_errors.hpp"

namespace fusedopt::testing {

using fusedopt::lang::dump;
using fusedopt::lang::Op;
using fusedopt::lang::parse_rule;
using fusedopt::lang::SymKind;

namespace {

const char* const kAdamW =
    R"(# AdamW: decoupled weight decay (Loshchilov & Hutter), in torch.optim.AdamW's formulation
param  p
grad   g
state  m = 0, v = 0
hyper  lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2

p = p * (1 - lr * weight_decay)
m = beta1 * m + (1 - beta1) * g
v = beta2 * v + (1 - beta2) * g * g
step_size = lr / (1 - beta1 ^ step)              # uniform: computed once per launch
denom = sqrt(v) / sqrt(1 - beta2 ^ step) + eps
p = p - step_size * m / denom
)";

}  // namespace

TEST_SUITE("lang") {
  TEST_CASE("AdamW from RULES.md parses with the expected symbols") {
    auto rule = parse_rule(kAdamW, "presets/adamw.rule");
    CHECK(rule->name == "adamw");
    CHECK(rule->file == "presets/adamw.rule");
    REQUIRE(rule->symbols.size() == 12);
    const char* names[] = {
        "p",    "g",         "m",    "v", "lr", "beta1", "beta2", "eps", "weight_decay",
        "step", "step_size", "denom"};
    const SymKind kinds[] = {SymKind::Param, SymKind::Grad,  SymKind::State, SymKind::State,
                             SymKind::Hyper, SymKind::Hyper, SymKind::Hyper, SymKind::Hyper,
                             SymKind::Hyper, SymKind::Step,  SymKind::Temp,  SymKind::Temp};
    for (int i = 0; i < 12; ++i) {
      CAPTURE(i);
      CHECK(rule->symbols[i].name == names[i]);
      CHECK(rule->symbols[i].kind == kinds[i]);
    }
    CHECK(rule->param == 0);
    CHECK(rule->grad == 1);
    CHECK(rule->step == 9);
    CHECK(rule->states == std::vector<int>{2, 3});
    CHECK(rule->hypers == std::vector<int>{4, 5, 6, 7, 8});
    CHECK(rule->outputs.empty());
    CHECK(rule->symbols[rule->hypers[3]].default_value == 1e-8);
    CHECK(rule->symbols[rule->hypers[4]].default_value == 1e-2);
    CHECK(rule->symbols[rule->hypers[4]].index == 4);
    CHECK(rule->symbols[rule->hypers[4]].loc.line == 5);
    CHECK(rule->symbols[rule->hypers[4]].loc.col == 59);
    CHECK(rule->symbols[2].init->op == Op::Number);
    CHECK(rule->symbols[2].init->number == 0.0);
    for (int s : {0, 2, 3, 10, 11}) CHECK(rule->symbols[s].written);
    CHECK_FALSE(rule->symbols[1].written);
  }

  TEST_CASE("AdamW from RULES.md has the expected statements, phases and uniform flags") {
    auto rule = parse_rule(kAdamW, "adamw.rule");
    CHECK(dump(*rule) ==
          "p = (* p (- 1 (* lr weight_decay)))\n"
          "m = (+ (* beta1 m) (* (- 1 beta1) g))\n"
          "v = (+ (* beta2 v) (* (* (- 1 beta2) g) g))\n"
          "step_size = (/ lr (- 1 (^ beta1 step)))\n"
          "denom = (+ (/ (sqrt v) (sqrt (- 1 (^ beta2 step)))) eps)\n"
          "p = (- p (/ (* step_size m) denom))\n");
    CHECK(rule->reduction_passes == 0);
    CHECK(rule->reductions.empty());
    const auto& s = rule->stmts;
    CHECK(s[3].loc.line == 10);
    CHECK(s[3].loc.col == 1);
    // lr / (1 - beta1 ^ step) is uniform; anything touching m, v, p or g is not.
    CHECK(s[3].value->uniform);
    CHECK(s[3].value->args[1]->args[1]->uniform);  // beta1 ^ step
    CHECK(s[0].value->args[1]->uniform);           // 1 - lr * weight_decay
    CHECK_FALSE(s[0].value->uniform);
    CHECK_FALSE(s[1].value->uniform);
    CHECK_FALSE(s[1].value->args[0]->args[1]->uniform);  // the ref to m
    CHECK(s[1].value->args[1]->args[0]->uniform);        // 1 - beta1
    CHECK_FALSE(s[4].value->uniform);
    CHECK(s[4].value->args[0]->args[1]->uniform);  // sqrt(1 - beta2 ^ step)
    // The last statement reads step_size (statement 3, uniform) and denom (statement 4).
    const auto& product = *s[5].value->args[1]->args[0];
    CHECK(product.args[0]->op == Op::Ref);
    CHECK(product.args[0]->def == 3);
    CHECK(product.args[0]->uniform);
    CHECK(s[5].value->args[1]->args[1]->def == 4);
    CHECK_FALSE(s[5].value->args[1]->args[1]->uniform);
    for (const auto& st : s) CHECK_FALSE(st.value->boolean);
    // Operators carry the operator's location; references the name's.
    CHECK(s[3].value->loc.col == 16);
    CHECK(s[3].value->args[1]->args[1]->args[1]->loc.col == 31);
    CHECK(s[3].value->args[1]->args[1]->args[1]->loc.len == 4);
  }
}

}  // namespace fusedopt::testing
