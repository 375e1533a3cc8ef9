// BodyEmitter: emits the generated functions of one rule and dtype binding. Its parts live
// in one file each: the fo_tvals layout and fo_init_element (body_emitter.cpp), the element
// passes (element_passes.cpp), the per-tensor values (tensor_values.cpp) and the row and
// column stages of factored rules (factored_stages.cpp). generate_body (codegen.cpp) drives it.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "codegen/expr_emitter.hpp"
#include "codegen/schedule.hpp"
#include "codegen/writer.hpp"
#include "fusedopt/dtype.hpp"
#include "lang/ast.hpp"

namespace fusedopt::codegen {

/// What a reduction adds per element: its accumulator update.
std::string accumulate(lang::ReduceKind kind, int j, const std::string& x);

/// The value a later pass sees, in double, from a raw total `raw` (a double expression).
std::string finish_value_d(lang::ReduceKind kind, const std::string& raw);

/// The same value rounded to float, as the element loop uses it.
std::string finish_value(lang::ReduceKind kind, const std::string& raw);

/// Emits the generated functions of one rule and binding. The order of the calls matters:
/// every pass_function, then init_function, rc_functions and last tensor_functions (element
/// code may hoist per-tensor values into fo_tensor_values).
class BodyEmitter {
 public:
  /// Lays out the accumulators of each pass and the fo_tvals slots.
  BodyEmitter(const lang::Rule& rule, const DTypeBinding& dtypes, const Schedule& schedule);

  /// fo_tensor_values (after the passes: element code may hoist per-tensor values into it)
  /// and fo_scalar_init.
  std::string tensor_functions();

  /// Factored rules: which pass computes each row, column and matrix slot; fo_row_stage and
  /// fo_col_stage (a row's / column's statements: the new states, matrix_mean arguments);
  /// fo_rc_init (initial values). Before tensor_functions(): they may hoist per-tensor values.
  std::string rc_functions();

  ExprEmitter& em() { return em_; }
  const ExprEmitter& em() const { return em_; }
  const std::vector<int>& pass_acc_count() const { return pass_acc_count_; }
  int check_acc() const { return check_acc_; }
  int acc_of(int reduction) const { return acc_[reduction]; }

  /// fo_reduce_element<pass> (pass < reduction_passes) or fo_element (the update).
  std::string pass_function(int pass);

  /// fo_init_element: state initial values (and the master from the param).
  std::string init_function();

  /// Whether reduction `r` is summed in the pass's accumulator lanes (per-tensor and global
  /// totals); row_mean, col_mean and matrix_mean have their own sums.
  static bool lanes(const lang::Reduction& r) {
    return r.scope == lang::Scope::Tensor || r.scope == lang::Scope::Global;
  }
  bool factored() const { return factored_; }

 private:
  /// What one pass is: which statements it computes, and its role in the schedule.
  struct PassShape {
    int pass;
    const PassPlan& plan;
    bool update;              ///< the last pass
    bool store;               ///< the Store strategy's pass that writes scratch tensors
    bool update_after_store;  ///< the update of the Store strategy
    std::set<int> compute;    ///< statements this pass computes
  };

  /// The locals a pass starts from: scratch values, tensor reads, zeroed temporaries.
  void emit_loads(const PassShape& p, Writer& loads);
  /// The update of the Store strategy: the values that crossed through scratch tensors and
  /// the final values of fp32 tensors finished early, read back (element code reads them
  /// through the overrides of em_).
  void emit_scratch_loads(const PassShape& p, Writer& loads);
  /// The tensor symbols whose value before the step this pass reads (after the overrides of
  /// emit_scratch_loads): every evaluated reference without a definition.
  std::set<int> originals_read(const PassShape& p) const;
  /// The statements (and, in a reduction pass, the accumulations of its reductions).
  void emit_statements(const PassShape& p, Writer& body);
  /// What the pass writes back, and the grad check of pass 0.
  void emit_stores(const PassShape& p, Writer& stores);
  /// Row and column states as this element's row and column hold them (never stored by
  /// element code: the end of the step writes them, once per row and column).
  void emit_rc_loads(Writer& loads) const;
  /// fo_row_stage (`row`) or fo_col_stage: a row's or a column's new states and the
  /// arguments of the matrix_mean calls at its level.
  void emit_rc_stage(Writer& w, bool row);
  /// Statement `st` in the row (`row`) or column stage, if that stage replays it: it assigns
  /// a row (column) state, or a temporary of that level, a matrix's or the tensor's.
  void emit_stage_stmt(Writer& w, const lang::Stmt& st, bool row);
  /// fo_row_values<pass> (or fo_col_values<pass>, `col`): the row (column) values the pass's
  /// element code reads (ExprEmitter::RcValue), after the statements of their level before
  /// them, into fo_out[slot * fo_os].
  void emit_rc_values(Writer& w, bool col);
  /// fo_rc_init: the initial values of the row and column states.
  void emit_rc_init(Writer& w);
  /// The function around the three parts.
  std::string wrap_pass(const PassShape& p, const Writer& loads, const Writer& body,
                        const Writer& stores);

  static bool is_tensor(lang::SymKind k) {
    return k == lang::SymKind::Param || k == lang::SymKind::Grad || k == lang::SymKind::State ||
           k == lang::SymKind::Output;
  }
  static bool is_rc(lang::SymKind k) {
    return k == lang::SymKind::RowState || k == lang::SymKind::ColState;
  }

  const lang::Rule& rule_;
  const DTypeBinding& dtypes_;
  const Schedule& s_;
  ExprEmitter em_;
  std::string file_;
  std::map<int, int> last_def_;
  std::vector<int> acc_;
  std::vector<int> pass_acc_count_;
  int check_acc_ = -1;
  bool factored_ = false;
};

}  // namespace fusedopt::codegen
