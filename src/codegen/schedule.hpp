// How a rule with reductions runs: which statements each pass computes, which tensors it
// reads and writes, and, for the pass before the update, whether values the update needs
// are recomputed there or stored into scratch tensors (whichever moves fewer bytes).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "fusedopt/dtype.hpp"
#include "fusedopt/kernel.hpp"
#include "lang/ast.hpp"

namespace fusedopt::codegen {

/// How values computed by the last reduction pass reach the update pass: the public
/// ReductionStrategy (Auto: whichever moves fewer bytes per element, ties recompute).
using Strategy = ReductionStrategy;
using fusedopt::to_string;  // of ReductionStrategy (fusedopt/kernel.hpp)

/// A value that crosses from the store pass to the update pass through a scratch tensor:
/// statement `def`'s result, or (def == -1) the original value of tensor symbol `sym`.
struct Crossing {
  int def = -1;
  int sym = -1;
  std::string name;  ///< for reports: the symbol's name
};

/// One pass over the data.
struct PassPlan {
  std::vector<int> stmts;       ///< element statements computed, in order
  std::set<int> reads;          ///< roles read
  std::set<int> writes;         ///< roles written
  std::vector<int> reductions;  ///< indices into Rule::reductions accumulated in this pass
};

struct Schedule {
  Strategy strategy = Strategy::Recompute;  ///< the one chosen (never Auto)
  int store_pass = -1;                      ///< the pass that stores (Store), else -1
  std::vector<PassPlan> passes;             ///< reduction passes, then the update pass
  std::vector<Crossing> crossings;          ///< Store: scratch tensors, in role order
  std::set<int> early_syms;                 ///< Store: tensor symbols finished in store_pass
  int first_scratch_role = 0;               ///< role index of the first scratch tensor
  /// Role of each matrix stage's fp32 scratch tensor (Rule::stages order): after the
  /// crossings, the last roles. Its pass writes the argument there, the stage replaces it
  /// with its result, later passes read that.
  std::vector<int> stage_roles;
  int value_role = 0;  ///< where the param's fp32 value lives
  int master_role = -1;
  /// Bits per element of one step (fixed role sizes of the binding) under each strategy;
  /// for element-wise rules both are the single pass's. Bits, as a 4-bit state moves half a
  /// byte per element.
  std::int64_t bits_recompute = 0;
  std::int64_t bits_store = 0;
  /// Bits per element each role moves once (index: role): 8 x its dtype's size, or 8 or 4
  /// for a quantized state's codes.
  std::vector<int> role_bits;
};

/// Role index of tensor symbol `sym` (param: its value role).
int role_of(const lang::Rule& rule, const Schedule& s, int sym);

/// Plans `rule` for the binding. Element-wise rules get one pass.
Schedule plan_schedule(const lang::Rule& rule, const DTypeBinding& dtypes, Strategy wanted);

/// Calls f on every node of `e` that a pass evaluates when it computes `e` (reduction and
/// matrix stage arguments are not entered: a pass reads their results, not the argument).
template <typename F>
void visit_evaluated(const lang::Expr& e, const F& f) {
  f(e);
  if (e.op == lang::Op::Reduce || e.op == lang::Op::Orthogonalize) return;
  for (const lang::ExprPtr& a : e.args) visit_evaluated(*a, f);
}

/// The Reduce nodes under `e` in evaluation order (arguments before the call), entering
/// reduction and stage arguments too.
void collect_reductions(const lang::Expr& e, std::vector<const lang::Expr*>& out);
/// The same for the matrix stages (Orthogonalize nodes).
void collect_stages(const lang::Expr& e, std::vector<const lang::Expr*>& out);

}  // namespace fusedopt::codegen
