// `storage` declarations and the non-negativity proof (storage.hpp).
#include "lang/storage.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fusedopt::lang {
namespace {

/// Proves values never negative, with every state in `assumed` taken as non-negative (the
/// induction over steps: a state is non-negative if its initial value is and every
/// assignment keeps it so, given the states that are). Hypers and the data may be anything;
/// NaN is not a sign (a NaN state is already lost). Each statement's value is proven once
/// and remembered, so a chain of temporaries that each read the one before twice (x = x + x)
/// takes linear time, not 2^length.
class SignProof {
 public:
  SignProof(const Rule& rule, const std::vector<bool>& assumed)
      : rule_(rule), assumed_(assumed), proven_(rule.stmts.size(), kUnknown) {}

  bool nonneg(const Expr& e) const {
    auto arg = [&](std::size_t k) -> const Expr& { return *e.args[k]; };
    switch (e.op) {
      case Op::Number:
        return e.number >= 0;
      case Op::Ref:
        return ref(e);
      case Op::Add:
      case Op::Div:
      case Op::Min:
      case Op::Where:
        return all_from(e, e.op == Op::Where ? 1 : 0);
      case Op::Mul:
        return same(arg(0), arg(1)) || (nonneg(arg(0)) && nonneg(arg(1)));
      case Op::Pow:
      case Op::PowFn:
        return nonneg(arg(0)) || even_integer(arg(1));
      case Op::Sqrt:
      case Op::Rsqrt:
      case Op::Exp:
      case Op::Abs:
      case Op::Rand:
        return true;
      case Op::Sign:
      case Op::Tanh:
      case Op::Log1p:
      case Op::Expm1:
      case Op::Floor:
        return nonneg(arg(0));
      case Op::Max:
        return nonneg(arg(0)) || nonneg(arg(1));
      case Op::Clamp:
        // fo_clamp(x, lo, hi) = min(max(x, lo), hi): hi whenever hi < max(x, lo) (hi < lo
        // included), so both hi and max(x, lo) must be non-negative.
        return nonneg(arg(2)) && (nonneg(arg(0)) || nonneg(arg(1)));
      case Op::Fma:
        return (same(arg(0), arg(1)) || (nonneg(arg(0)) && nonneg(arg(1)))) && nonneg(arg(2));
      case Op::Reduce:
        return e.reduce_kind == ReduceKind::SumSq || e.reduce_kind == ReduceKind::Norm ||
               e.reduce_kind == ReduceKind::MaxAbs || nonneg(arg(0));
      default:
        return false;
    }
  }

 private:
  bool all_from(const Expr& e, std::size_t first) const {
    for (std::size_t k = first; k < e.args.size(); ++k) {
      if (!nonneg(*e.args[k])) return false;
    }
    return true;
  }

  bool ref(const Expr& e) const {
    const Symbol& s = rule_.symbols[static_cast<std::size_t>(e.sym)];
    switch (s.kind) {
      case SymKind::Step:
      case SymKind::Info:
        return true;
      case SymKind::State:
        return assumed_[static_cast<std::size_t>(e.sym)];
      case SymKind::Temp:
      case SymKind::Output:
        return e.def >= 0 && statement(static_cast<std::size_t>(e.def));
      default:
        return false;
    }
  }

  /// Statement `k`'s value, proven at its first read (it reads only earlier statements).
  bool statement(std::size_t k) const {
    if (proven_[k] == kUnknown) proven_[k] = nonneg(*rule_.stmts[k].value) ? kYes : kNo;
    return proven_[k] == kYes;
  }

  /// The same value twice (x * x): one symbol read at one definition.
  static bool same(const Expr& a, const Expr& b) {
    return a.op == Op::Ref && b.op == Op::Ref && a.sym == b.sym && a.def == b.def;
  }

  static bool even_integer(const Expr& e) {
    return e.op == Op::Number &&
           e.number == static_cast<double>(static_cast<long long>(e.number)) &&
           static_cast<long long>(e.number) % 2 == 0;
  }

  static constexpr std::int8_t kUnknown = -1;
  static constexpr std::int8_t kNo = 0;
  static constexpr std::int8_t kYes = 1;

  const Rule& rule_;
  const std::vector<bool>& assumed_;
  mutable std::vector<std::int8_t> proven_;  // statement index -> kUnknown, kNo or kYes
};

void prove_nonnegative(Rule& rule) {
  std::vector<bool> assumed(rule.symbols.size(), false);
  for (int s : rule.states) assumed[static_cast<std::size_t>(s)] = true;
  // The greatest fixed point: drop a state whose initial value or an assignment is not
  // proven under the current assumptions, until nothing changes. A drop leaves the round's
  // remembered proofs too hopeful, never wrong the other way; the next round starts afresh.
  for (bool changed = true; changed;) {
    changed = false;
    const SignProof proof(rule, assumed);
    for (int s : rule.states) {
      const auto k = static_cast<std::size_t>(s);
      if (!assumed[k]) continue;
      bool ok = rule.symbols[k].init && proof.nonneg(*rule.symbols[k].init);
      for (const Stmt& st : rule.stmts) ok = ok && (st.target != s || proof.nonneg(*st.value));
      if (!ok) {
        assumed[k] = false;
        changed = true;
      }
    }
  }
  for (int s : rule.states) {
    rule.symbols[static_cast<std::size_t>(s)].nonnegative = assumed[static_cast<std::size_t>(s)];
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
