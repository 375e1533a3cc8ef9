// libFuzzer entry for the rule language: any byte string must either parse into a rule
// whose internal links are consistent, or throw a fusedopt::Error with a sane location.
// Anything else (a crash, a sanitizer report, another exception type) is a finding.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fusedopt/error.hpp"
#include "lang/ast.hpp"
#include "lang/dump.hpp"
#include "lang/parse.hpp"

namespace {

using fusedopt::lang::Expr;
using fusedopt::lang::Rule;
using fusedopt::lang::SymKind;

// A finding: trap so libFuzzer saves the input.
void require(bool ok) {
  if (!ok) __builtin_trap();
}

void check_expr(const Rule& rule, const Expr& e, int stmt, int depth) {
  require(depth <= fusedopt::lang::kMaxExprDepth);
  if (e.op == fusedopt::lang::Op::Ref) {
    require(e.sym >= 0 && e.sym < static_cast<int>(rule.symbols.size()));
    const SymKind kind = rule.symbols[e.sym].kind;
    if (kind == SymKind::Temp || kind == SymKind::Output) {
      // Reads a definition from an earlier statement of the same symbol.
      require(stmt < 0 || (e.def >= 0 && e.def < stmt && rule.stmts[e.def].target == e.sym));
    }
  }
  if (e.op == fusedopt::lang::Op::Reduce) {
    require(e.reduction >= 0 && e.reduction < static_cast<int>(rule.reductions.size()));
    const auto& r = rule.reductions[e.reduction];
    require(r.arg == e.args.at(0).get());
    require(r.pass >= 0 && r.pass < rule.reduction_passes && r.arg->phase <= r.pass);
    require(e.phase == r.pass + 1);
  }
  require(e.phase >= 0 && e.phase <= rule.reduction_passes);
  require(e.loc.line >= 1 && e.loc.col >= 1 && e.loc.len >= 1);
  for (const auto& a : e.args) {
    require(a != nullptr);
    check_expr(rule, *a, stmt, depth + 1);
  }
}

void check_rule(const Rule& rule) {
  require(rule.param >= 0 && rule.grad >= 0 && rule.step >= 0);
  require(rule.reduction_passes >= 0 &&
          rule.reduction_passes <= fusedopt::lang::kMaxReductionPasses);
  require(rule.reduction_passes == 0 || !rule.reductions.empty());
  for (int s : rule.states) check_expr(rule, *rule.symbols[s].init, -1, 0);
  for (std::size_t i = 0; i < rule.stmts.size(); ++i) {
    const auto& st = rule.stmts[i];
    require(st.target >= 0 && st.target < static_cast<int>(rule.symbols.size()));
    const SymKind kind = rule.symbols[st.target].kind;
    require(kind != SymKind::Grad && kind != SymKind::Hyper && kind != SymKind::Step);
    check_expr(rule, *st.value, static_cast<int>(i), 0);
  }
  (void)fusedopt::lang::dump(rule);
}

// The diagnostic points into the text: an existing line, at most one past its end.
void check_error(std::string_view text, const fusedopt::RuleError& e) {
  int lines = 1;
  for (char c : text) lines += c == '\n' ? 1 : 0;
  require(e.line() >= 1 && e.line() <= lines);
  require(e.column() >= 1 && e.column() <= static_cast<int>(e.source_line().size()) + 1);
  require(!e.message().empty());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    auto rule = fusedopt::lang::parse_rule(text, "fuzz.rule");
    check_rule(*rule);
    // A valid rule also takes the clipping rewrite (or refuses it with a RuleError).
    fusedopt::lang::ParseOptions clip;
    clip.clip_grad_norm = true;
    auto clipped = fusedopt::lang::parse_rule(text, "fuzz.rule", clip);
    check_rule(*clipped);
    require(clipped->reduction_passes >= 1);
  } catch (const fusedopt::RuleError& e) {
    check_error(text, e);
  } catch (const fusedopt::Error&) {
    // Other library errors are acceptable outcomes too; only crashes are findings.
  }
  return 0;
}
