// A step as a program: at construction the Optimizer compiles its schedule (reduction
// passes, where the grad check rides) into a list of ops for each kind of step (plain, or
// scaled: checked and skipped on a non-finite gradient), and one executor walks the list
// every step. The executor's only device difference is how `SkipIf` acts: the host reads
// the verdict and stops; CUDA hands it to every later launch, so that nothing waits.
#pragma once

#include <string>
#include <vector>

namespace fusedopt::runtime {

struct StepOp {
  enum class Kind {
    Begin,       ///< the extension's first op (e.g. the gradients' all-reduce finished)
    CheckGrads,  ///< the separate grad check: the verdict slot = 1 when a gradient is not finite
    CheckHook,   ///< hands the verdict slot to the reduction hook (pass -1: combined by max)
    SkipIf,      ///< the step is not taken when the verdict slot is set
    Reduce,      ///< reduction pass `pass` of every binding (pass 0 may fold the grad check)
    Finalize,    ///< pass `pass`'s partials into totals, bindings in a fixed order
    Stage,       ///< the matrix stages after pass `pass` (orthogonalize)
    Hook,        ///< hands pass `pass`'s totals to the reduction hook
    Update,      ///< the update pass of every binding (and its scalar states)
    End,         ///< counts the step (on the device where the count lives there)
    Publish,     ///< the extension's last op (e.g. the updated pieces gathered)
  };
  Kind kind;
  int pass = -1;             ///< Reduce, Finalize, Hook
  bool check_grads = false;  ///< Reduce: this pass also checks the gradients (pass 0)
  /// Pieces (Tensor::whole_shape) of a factored rule: Finalize 1 to 3 and Hook 0 or 1, the
  /// stages of a finalize with the sums that span pieces combined between them (abi.h's
  /// rc_stage); 0 otherwise: the whole finalize.
  int stage = 0;

  bool operator==(const StepOp& o) const {
    return kind == o.kind && pass == o.pass && check_grads == o.check_grads && stage == o.stage;
  }
};

using StepProgram = std::vector<StepOp>;

/// The program of one step over `passes` reduction passes. `scaled`: the gradients are
/// checked and the step skipped when one is not finite: the check is folded into pass 0
/// when `fold_check` (one read of the gradients; not when pass 0 writes), else it is its
/// own launch before anything else.
/// With `extended`, the program of an optimizer with a step extension: `begin` first and
/// `publish` last.
/// `stages[pass]` (when given): how many stages pass's finalize takes with pieces: 2 is
/// "finalize P (1 of 2), hook P, finalize P (2 of 2)", 3 adds "hook P (matrices), finalize P
/// (3 of 3)"; 1 or absent: one finalize.
/// `matrix_stages`: the passes after which matrix stages run (after the pass's hooks and,
/// when the check rides on the pass, its skip).
StepProgram compile_step(int passes, bool scaled, bool fold_check, bool extended = false,
                         const std::vector<int>& stages = {},
                         const std::vector<int>& matrix_stages = {});

/// "check grads, hook check, skip if, reduce 0 (+check), finalize 0, hook 0, update, end":
/// for logs and stats.
std::string describe(const StepProgram& program);

}  // namespace fusedopt::runtime
