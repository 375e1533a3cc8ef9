// check_limits: the counts of lang/limits.hpp, each reported at the first thing past it.
#include "lang/limits.hpp"

#include <fmt/format.h>

#include <string>
#include <vector>

#include "lang/source.hpp"

namespace fusedopt::lang {
namespace {

constexpr const char* kShortRuleHint =
    "a rule is a short per-element update; values that are the same for every element can "
    "be computed outside and passed as hypers";

// Counts operations (every node but literals and reads) in text order and fails at the
// first one past either limit.
class OperationCounter {
 public:
  explicit OperationCounter(const Source& source) : source_(source) {}

  void count(const Expr& e) {
    if (e.op != Op::Number && e.op != Op::Ref) {
      if (++all_ > kMaxOperations) {
        source_.fail(e.loc,
                     fmt::format("a rule may have at most {} operations (operators and "
                                 "function calls); this is operation {}",
                                 kMaxOperations, all_),
                     kShortRuleHint);
      }
      if (e.uniform && ++uniform_ > kMaxUniformOperations) {
        source_.fail(e.loc,
                     fmt::format("a rule may have at most {} operations on hypers, `step` and "
                                 "constants only; this is operation {} of them",
                                 kMaxUniformOperations, uniform_),
                     "they are computed once per launch into a table of that size; compute "
                     "such values outside and pass them as hypers");
      }
    }
    for (const ExprPtr& a : e.args) count(*a);
  }

 private:
  const Source& source_;
  int all_ = 0;
  int uniform_ = 0;
};

// Fails at the (limit + 1)-th symbol of `kinds`, in declaration order.
void check_symbol_count(const Source& source, const Rule& rule, std::vector<SymKind> kinds,
                        int limit, const char* what, const char* hint) {
  int n = 0;
  for (const Symbol& s : rule.symbols) {
    bool counted = false;
    for (SymKind k : kinds) counted = counted || s.kind == k;
    if (counted && ++n > limit) {
      source.fail(
          s.loc,
          fmt::format("a rule may have at most {} {}; `{}` is number {}", limit, what, s.name, n),
          hint);
    }
  }
}

}  // namespace

void check_limits(const Source& source, const Rule& rule) {
  if (rule.stmts.size() > static_cast<std::size_t>(kMaxStatements)) {
    source.fail(rule.stmts[kMaxStatements].loc,
                fmt::format("a rule may have at most {} statements; this is statement {} of {}",
                            kMaxStatements, kMaxStatements + 1, rule.stmts.size()),
                kShortRuleHint);
  }
  check_symbol_count(source, rule, {SymKind::Temp}, kMaxTemporaries, "temporaries",
                     "reuse a temporary's name once its value is no longer needed");
  check_symbol_count(source, rule, {SymKind::State, SymKind::Output}, kMaxStateTensors,
                     "state and output tensors", "each is one more tensor beside every parameter");
  check_symbol_count(source, rule, {SymKind::Hyper}, kMaxHypers, "hypers", "");
  check_symbol_count(source, rule, {SymKind::Scalar}, kMaxStateTensors, "scalar states", "");
  check_symbol_count(source, rule, {SymKind::RowState, SymKind::ColState}, kMaxStateTensors,
                     "row and column states",
                     "each is one more reduction over the gradient's rows or columns");
  OperationCounter ops(source);
  for (const Symbol& s : rule.symbols) {
    const bool stateful = s.kind == SymKind::State || s.kind == SymKind::Scalar ||
                          s.kind == SymKind::RowState || s.kind == SymKind::ColState;
    if (stateful && s.init) ops.count(*s.init);
  }
  for (const Stmt& st : rule.stmts) ops.count(*st.value);
}

}  // namespace fusedopt::lang
