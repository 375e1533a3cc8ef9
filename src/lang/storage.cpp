// `storage` declarations and the non-negativity proof (storage.hpp).
#include "lang/storage.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "lang/names.hpp"

namespace fusedopt::lang {
namespace {

/// What the proof knows of a value, from what the generated code computes (prelude.h):
/// fo_max/fo_min return the other operand when one is NaN (fmaxf(NaN, -1) is -1), and their
/// choice between -0 and +0 is unspecified; x / -0 and rsqrt(-0) are -inf, sqrt(-0) is -0.
/// Every level but kAny admits NaN (a NaN element's code is lost whatever the map).
enum Level : std::int8_t {
  kAny = 0,       ///< may be negative
  kNotNeg = 1,    ///< never < 0: >= +-0, +inf or NaN
  kClear = 2,     ///< kNotNeg and never -0 (its sign bit is clear unless it is NaN)
  kPositive = 3,  ///< > 0 or NaN
};

struct Sign {
  Level level = kAny;
  bool notnan = false;  ///< never NaN whatever the inputs
};

constexpr Sign kAnything{kAny, false};

/// fo_min(a, b): one of a and b (the other when one is NaN).
Sign min_of(Sign a, Sign b) {
  if (a.level < kNotNeg || b.level < kNotNeg) return {kAny, a.notnan || b.notnan};
  return {std::min(a.level, b.level), a.notnan || b.notnan};
}

/// fo_max(a, b): one of a and b, never below a (b) when a (b) is not NaN; the other when
/// one is NaN, so a non-negative operand that may be NaN proves nothing alone.
Sign max_of(Sign a, Sign b) {
  Level level = a.level >= kNotNeg && b.level >= kNotNeg ? std::min(a.level, b.level) : kAny;
  for (const Sign& s : {a, b}) {
    // max(+0, -0) may be -0: only a positive bound clears the sign.
    if (s.notnan && s.level >= kNotNeg)
      level = std::max(level, s.level == kPositive ? kPositive : kNotNeg);
  }
  return {level, a.notnan || b.notnan};
}

/// a + b (fma's addend too): +0 + -0 is +0, so one operand with a clear sign clears it.
Sign add_of(Sign a, Sign b) {
  if (a.level < kNotNeg || b.level < kNotNeg) return kAnything;
  return {std::max(a.level, b.level), a.notnan && b.notnan};  // no -inf, so no inf - inf
}

/// a * b: a product of positives may underflow to +0, and 0 * inf is NaN.
Sign mul_of(Sign a, Sign b, bool same) {
  if (same) return {kClear, false};  // x * x: +0 for -0, NaN for NaN, else > 0 or +0
  if (a.level < kNotNeg || b.level < kNotNeg) return kAnything;
  return {std::min({a.level, b.level, kClear}), false};
}

/// Proves values never negative, with each state in `assumed` taken at its level (the
/// induction over steps: a state keeps a level if its initial value and every assignment
/// do, given the states' levels). Hypers and the data may be anything, NaN and infinities
/// included. Each statement's value is proven once and remembered, so a chain of temporaries
/// that each read the one before twice (x = x + x) takes linear time, not 2^length.
class SignProof {
 public:
  SignProof(const Rule& rule, const std::vector<Level>& assumed)
      : rule_(rule), assumed_(assumed), proven_(rule.stmts.size()), done_(rule.stmts.size()) {}

  Sign sign(const Expr& e) const {
    auto arg = [&](std::size_t k) { return sign(*e.args[k]); };
    // A truth value is fo_bool's 1 or +0.
    if (is_comparison_or_logic(e.op)) return {kClear, true};
    switch (e.op) {
      case Op::Number:
        return number(e.number);
      case Op::Ref:
        return ref(e);
      case Op::IsFinite:
      case Op::Rand:  // fo_bool's 1 or +0; fo_unit's [+0, 1)
        return {kClear, true};
      case Op::Add:
        return add_of(arg(0), arg(1));
      case Op::Mul:
        return mul_of(arg(0), arg(1), same(*e.args[0], *e.args[1]));
      case Op::Fma:
        return add_of(mul_of(arg(0), arg(1), same(*e.args[0], *e.args[1])), arg(2));
      case Op::Div: {
        const Sign a = arg(0), b = arg(1);  // x / -0 is -inf
        if (a.level < kNotNeg || b.level < kClear) return kAnything;
        return {std::min(a.level, kClear), false};
      }
      case Op::Min:
        return min_of(arg(0), arg(1));
      case Op::Max:
        return max_of(arg(0), arg(1));
      case Op::Clamp:  // fo_clamp(x, lo, hi) = fo_min(fo_max(x, lo), hi)
        return min_of(max_of(arg(0), arg(1)), arg(2));
      case Op::Where:  // one of the two, as they are
        return {min_of(arg(1), arg(2)).level, arg(1).notnan && arg(2).notnan};
      default:
        return function(e);
    }
  }

 private:
  /// The functions of one argument, pow and the reductions.
  Sign function(const Expr& e) const {
    const Sign a = e.args.empty() ? kAnything : sign(*e.args[0]);
    switch (e.op) {
      case Op::Pow:
      case Op::PowFn:
        return power(a, *e.args[1]);
      case Op::Sqrt:  // sqrt(-0) is -0, sqrt(x < 0) NaN
        return {a.level >= kClear ? kClear : kNotNeg, false};
      case Op::Rsqrt:  // rsqrt(-0) is -inf, rsqrt(+0) +inf, rsqrt(inf) +0
        return {a.level >= kClear ? kClear : kAny, false};
      case Op::Exp:
      case Op::Abs:
        return {kClear, e.op == Op::Abs && a.notnan};
      case Op::Sign:  // fo_sign: (x > 0) - (x < 0), 0 for NaN
        return {a.level >= kNotNeg ? kClear : kAny, true};
      case Op::Tanh:
      case Op::Log1p:
      case Op::Expm1:
      case Op::Floor:  // each keeps -0, and may round or underflow a positive to +0
        return {std::min(a.level, kClear), false};
      case Op::Reduce:
        switch (e.reduce_kind) {
          case ReduceKind::SumSq:
          case ReduceKind::Norm:
          case ReduceKind::MaxAbs:
            return {kClear, false};
          case ReduceKind::AnyNonFinite:
            return {kClear, true};
          default:  // a sum or a mean of the values
            return {a.level >= kNotNeg ? kNotNeg : kAny, false};
        }
      default:  // Neg, Sub, Log, Lerp, Mod (the sign of b, but a - b * floor(a / b) may round)
        return kAnything;
    }
  }

  /// a ^ b and pow(a, b): powf, or x * x for b = 2 and x for b = 1 (the emitter's forms).
  Sign power(Sign a, const Expr& b) const {
    if (b.op == Op::Number && b.number == 1.0) return a;
    if (even_integer(b)) return {kClear, false};  // powf(-0, 2k) is +0 or +inf
    if (a.level >= kClear) return {kClear, false};
    // powf(-0, y) is -0 for an odd y > 0, -inf for an odd y < 0.
    if (a.level == kNotNeg && b.op == Op::Number && b.number >= 0) return {kNotNeg, false};
    return kAnything;
  }

  static Sign number(double x) {
    const auto f = static_cast<float>(x);  // as emitted in float code (double keeps it)
    if (std::isnan(x)) return kAnything;
    if (x > 0 && f > 0) return {kPositive, true};
    if (x >= 0 && !std::signbit(x)) return {kClear, true};
    return {x >= 0 ? kNotNeg : kAny, true};
  }

  Sign ref(const Expr& e) const {
    const Symbol& s = rule_.symbols[static_cast<std::size_t>(e.sym)];
    switch (s.kind) {
      case SymKind::Step:
      case SymKind::Info:
        return {kClear, true};
      case SymKind::State:
        return {assumed_[static_cast<std::size_t>(e.sym)], false};
      case SymKind::Temp:
      case SymKind::Output:
        return e.def >= 0 ? statement(static_cast<std::size_t>(e.def)) : kAnything;
      default:
        return kAnything;
    }
  }

  /// Statement `k`'s value, proven at its first read (it reads only earlier statements).
  Sign statement(std::size_t k) const {
    if (!done_[k]) {
      proven_[k] = sign(*rule_.stmts[k].value);
      done_[k] = true;
    }
    return proven_[k];
  }

  /// The same value twice (x * x): one symbol read at one definition.
  static bool same(const Expr& a, const Expr& b) {
    return a.op == Op::Ref && b.op == Op::Ref && a.sym == b.sym && a.def == b.def;
  }

  /// An even integer, as a double and as the float it is emitted as (every float from
  /// 2^24 up is even; infinity, which it may round to, gives pow >= 0 too).
  static bool even_integer(const Expr& e) {
    return e.op == Op::Number && std::isfinite(e.number) && std::fmod(e.number, 2.0) == 0.0;
  }

  const Rule& rule_;
  const std::vector<Level>& assumed_;
  mutable std::vector<Sign> proven_;  // statement index -> its value's sign, once done_
  mutable std::vector<bool> done_;
};

void prove_nonnegative(Rule& rule) {
  std::vector<Level> assumed(rule.symbols.size(), kAny);
  for (int s : rule.states) assumed[static_cast<std::size_t>(s)] = kPositive;
  // The greatest fixed point: lower a state to the least level of its initial value and its
  // assignments under the current assumptions, until nothing changes. A drop leaves the
  // round's remembered proofs too hopeful, never wrong the other way; the next round starts
  // afresh.
  for (bool changed = true; changed;) {
    changed = false;
    const SignProof proof(rule, assumed);
    for (int s : rule.states) {
      const auto k = static_cast<std::size_t>(s);
      Level level = rule.symbols[k].init ? proof.sign(*rule.symbols[k].init).level : kAny;
      for (const Stmt& st : rule.stmts) {
        if (st.target == s) level = std::min(level, proof.sign(*st.value).level);
      }
      if (level < assumed[k]) {
        assumed[k] = level;
        changed = true;
      }
    }
  }
  for (int s : rule.states) {
    rule.symbols[static_cast<std::size_t>(s)].nonnegative =
        assumed[static_cast<std::size_t>(s)] >= kNotNeg;
  }
}

}  // namespace

void check_storage(const Source& source, const std::vector<StorageDecl>& decls, Rule& rule) {
  prove_nonnegative(rule);
  for (const StorageDecl& d : decls) {
    const int sym = rule.find(std::string(d.name));
    if (sym < 0 || rule.symbols[static_cast<std::size_t>(sym)].kind != SymKind::State) {
      source.fail(d.loc,
                  sym < 0
                      ? fmt::format("storage of '{}': the rule declares no such state", d.name)
                      : fmt::format("storage of '{}': only a state (one value per element) "
                                    "can be quantized; '{}' is a {}",
                                    d.name, d.name,
                                    to_string(rule.symbols[static_cast<std::size_t>(sym)].kind)),
                  "declare it with 'state NAME = INIT' first");
    }
    for (const auto& [other, kind] : rule.storage) {
      if (other == sym) {
        source.fail(d.loc, fmt::format("storage of '{}' is declared twice", d.name),
                    "keep one declaration");
      }
    }
    std::string kind = d.kind;
    const bool sr = kind.size() > 3 && kind.compare(kind.size() - 3, 3, "+sr") == 0;
    if (sr) kind.resize(kind.size() - 3);
    if (kind != "q8" && kind != "q4" && kind != "q8s" && kind != "q8u" && kind != "q4s" &&
        kind != "q4u") {
      source.fail(d.kind_loc, fmt::format("unknown storage kind '{}'", kind),
                  "one of q8, q4 (the map's sign from the rule), q8s, q8u (signed, unsigned "
                  "8-bit), q4s, q4u; with +sr for stochastic rounding (q4u+sr)");
    }
    rule.storage.emplace_back(sym, d.kind);
  }
}

}  // namespace fusedopt::lang
