// The sign proof (lang/storage.cpp) against what the generated host code computes: random
// rules of many states, each set to a random expression, stepped on data full of NaN,
// infinities, signed zeros and denormals; every state the proof calls non-negative (which
// makes "q8" and "q4" the unsigned maps) must never hold a negative value.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/host_tensors.hpp"
#include "fusedopt/optimizer.hpp"
#include "lang/ast.hpp"
#include "lang/parse.hpp"

TEST_SUITE_BEGIN("runtime");

namespace {

/// Random expressions over the grad, the param, two hypers, step, literals and the states,
/// biased toward what the proof reasons about (max, min, clamp, sqrt, squares, division).
class ExprGen {
 public:
  ExprGen(std::mt19937& rng, int states) : rng_(rng), states_(states) {}

  std::string expr(int depth) {
    if (depth == 0 || pick(5) == 0) return leaf();
    const std::string a = expr(depth - 1), b = expr(depth - 1);
    switch (pick(22)) {
      case 0:
        return "(" + a + " + " + b + ")";
      case 1:
        return "(" + a + " - " + b + ")";
      case 2:
        return "(" + a + " * " + b + ")";
      case 3:
        return "(" + a + " / " + b + ")";
      case 4:
        return "(" + a + " * " + a + ")";
      case 5: {
        static const char* const kExp[] = {"2", "3", "0.5", "1", "4", "1e20", "(0 - 1)", "(0 - 2)"};
        return "(" + a + " ^ " + kExp[pick(8)] + ")";
      }
      case 6:
      case 7:
        return "max(" + a + ", " + b + ")";
      case 8:
        return "min(" + a + ", " + b + ")";
      case 9:
        return "clamp(" + a + ", " + b + ", " + expr(depth - 1) + ")";
      case 10:
      case 11:
        return "sqrt(" + a + ")";
      case 12:
        return "rsqrt(" + a + ")";
      case 13:
        return "abs(" + a + ")";
      case 14: {
        static const char* const kFn[] = {"exp", "log", "sign", "tanh", "log1p", "expm1", "floor"};
        return std::string(kFn[pick(7)]) + "(" + a + ")";
      }
      case 15:
        return "where(" + a + " < " + b + ", " + b + ", " + expr(depth - 1) + ")";
      case 16:
        return "fma(" + a + ", " + b + ", " + expr(depth - 1) + ")";
      case 17:
        return "lerp(" + a + ", " + b + ", " + leaf() + ")";
      case 18:
        return "where(isfinite(" + a + "), " + a + ", " + b + ")";
      case 19:
        return "pow(" + a + ", " + b + ")";
      case 20: {
        static const char* const kRed[] = {"tensor_sum", "tensor_sumsq", "tensor_norm",
                                           "tensor_maxabs"};
        return std::string(kRed[pick(4)]) + "(" + grad_expr() + ")";
      }
      default:
        return "max(" + a + ", " + literal() + ")";
    }
  }

 private:
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }

  std::string literal() {
    static const char* const kLit[] = {"0",    "1",     "2",       "0.5",     "1e-8",       "1e30",
                                       "3e38", "1e-45", "(0 - 1)", "(0 - 0)", "(0 - 1e-45)"};
    return kLit[pick(11)];
  }

  std::string leaf() {
    switch (pick(8)) {
      case 0:
      case 1:
        return "g";
      case 2:
        return "p";
      case 3:
        return pick(2) ? "h0" : "h1";
      case 4:
        return "step";
      case 5:
        return literal();
      case 6:
        return "rand()";
      default:
        return "s" + std::to_string(pick(states_));
    }
  }

  /// An element expression of the grad alone, for reductions.
  std::string grad_expr() {
    static const char* const kG[] = {"g", "abs(g)", "g * g", "sqrt(g)", "max(g, 0)", "(0 - g)"};
    return kG[pick(6)];
  }

  std::mt19937& rng_;
  int states_;
};

/// A value from a pool of the awkward ones, or an ordinary one.
double awkward(std::mt19937& rng) {
  const double inf = std::numeric_limits<double>::infinity();
  static const double kPool[] = {std::nan(""), inf,    -inf, 0.0,   -0.0, 1e-45, -1e-45,
                                 1e-40,        -1e-40, 3e38, -3e38, 1e20, -1e20, 1.0,
                                 -1.0,         0.5,    -0.5, 2.0,   -2.0, 1e-30, -1e-30};
  std::uniform_int_distribution<int> pick(0, 2 * static_cast<int>(std::size(kPool)) - 1);
  const int k = pick(rng);
  if (k < static_cast<int>(std::size(kPool))) return kPool[k];
  return std::normal_distribution<double>(0.0, 3.0)(rng);
}

}  // namespace

TEST_CASE("every state the sign proof calls non-negative stays so on NaN, inf and -0 data") {
  fusedopt::testing::use_private_cache();
  const std::uint32_t seed = fusedopt::testing::fresh_seed();
  std::mt19937 rng(seed);
  constexpr int kStates = 30, kRules = 3, kSteps = 3;
  constexpr std::int64_t kNumel = 512;
  int proven = 0, checked = 0;
  for (int r = 0; r < kRules; ++r) {
    ExprGen gen(rng, kStates);
    std::string text = "param p\ngrad g\nstate ";
    for (int k = 0; k < kStates; ++k) text += (k ? ", s" : "s") + std::to_string(k) + " = 0";
    // Hypers: any finite fp32 value (check_hyper_value refuses the rest).
    static const char* const kHyper[] = {"0", "1", "-1", "0.5", "-3e38", "3e38", "1e-45"};
    std::uniform_int_distribution<int> hyper(0, 6);
    text += std::string("\nhyper h0 = ") + kHyper[hyper(rng)] + ", h1 = " + kHyper[hyper(rng)];
    text += "\n";
    for (int k = 0; k < kStates; ++k) text += "s" + std::to_string(k) + " = " + gen.expr(3) + "\n";
    text += "p = p - 1e-3 * (s0 - s1)\n";
    CAPTURE(text);
    const fusedopt::Rule rule = fusedopt::Rule::parse(text, "random.rule");
    const auto checked_rule = fusedopt::lang::parse_rule(text, "random.rule");
    std::vector<bool> nonneg(kStates);
    for (int k = 0; k < kStates; ++k) {
      const int sym = checked_rule->find("s" + std::to_string(k));
      REQUIRE(sym >= 0);
      nonneg[k] = checked_rule->symbols[static_cast<std::size_t>(sym)].nonnegative;
      proven += nonneg[k] ? 1 : 0;
    }
    fusedopt::testing::HostTensor p(kNumel, fusedopt::DType::F32), g(kNumel, fusedopt::DType::F32);
    for (std::int64_t i = 0; i < kNumel; ++i) p.set(i, awkward(rng));
    fusedopt::Optimizer opt(rule, {fusedopt::ParamGroup{{p.tensor()}, {g.tensor()}, {}}}, {});
    for (int t = 1; t <= kSteps; ++t) {
      for (std::int64_t i = 0; i < kNumel; ++i) g.set(i, awkward(rng));
      opt.step();
      for (int k = 0; k < kStates; ++k) {
        if (!nonneg[k]) continue;
        const std::vector<float> v = opt.state_values("s" + std::to_string(k), 0);
        for (std::size_t i = 0; i < v.size(); ++i) {
          CAPTURE(t);
          CAPTURE(k);
          CAPTURE(i);
          REQUIRE_FALSE(v[i] < 0.0f);  // NaN allowed: a NaN loses its element whatever the map
          ++checked;
        }
      }
    }
  }
  MESSAGE(proven, " of ", kRules * kStates, " random states proven non-negative; ", checked,
          " values checked");
  CHECK(proven * 5 >= kRules * kStates);  // the proof is not vacuous here
}

TEST_SUITE_END();
