// Emits the expressions of one checked rule as C++ text: element expressions (inside
// fo_element) and uniform ones hoisted into fo_prepare slots (identical ones share a slot).
// Names come from the checked AST with a prefix; functions and operators from lang/names.
// The emission itself: expr_emitter.cpp.
#pragma once

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "codegen/body_parts.hpp"
#include "codegen/writer.hpp"
#include "lang/ast.hpp"

namespace fusedopt::codegen {

/// Emits the expressions of one rule. Two contexts: "uniform" (inside fo_prepare, where
/// only hypers, step and hoisted values exist) and "element" (inside fo_element).
class ExprEmitter {
 public:
  /// `f64`: an fp64 binding's element code, whose math is double (locals, literals, the
  /// values it reads from fo_uniform and fo_tvals); else float.
  explicit ExprEmitter(const lang::Rule& rule, bool f64 = false) : rule_(rule), f64_(f64) {}

  /// The element math's type ("float", or "double" for an fp64 binding).
  const char* real() const { return f64_ ? "double" : "float"; }
  /// The cast of a double into the element math's type ("(float)", or none in double).
  const char* narrow() const { return f64_ ? "" : "(float)"; }
  bool f64() const { return f64_; }

  /// Element-context text of `e`; every non-trivial uniform subtree becomes U.u[k].
  std::string element(const lang::Expr& e) { return emit(e); }
  /// Records that statement `stmt` (a uniform temporary) lives in a slot.
  void define_uniform_temp(int stmt, const lang::Expr& value) { temp_slot_[stmt] = hoist(value); }

  /// Tensor-context text of `e` (inside fo_tensor_values, in double): hypers, step, global
  /// and per-tensor reduction results, scalar states and temporaries read from its locals.
  std::string tensor_value(const lang::Expr& e);

  /// Where element code reads per-tensor values: scalar state `sym`'s value before the
  /// step, and statement `stmt`'s result (a scalar assignment), as indices into fo_tvals.
  void set_scalar_slots(std::map<int, int> original, std::map<int, int> assigned) {
    scalar_orig_ = std::move(original);
    scalar_def_ = std::move(assigned);
  }
  /// Tensor-context text of each reduction result (by Rule::reductions index).
  void set_reduction_texts(std::map<int, std::string> texts) { reduce_text_ = std::move(texts); }
  /// Per-tensor subexpressions of element code hoisted into fo_tvals: (slot, double text),
  /// for fo_tensor_values to compute once per tensor.
  const std::vector<std::pair<int, std::string>>& tensor_hoisted() const { return hoisted_; }
  /// The first fo_tvals slot per-tensor hoisting may use; count after emission.
  void set_first_hoist_slot(int slot) { next_tval_ = slot; }
  int tval_count() const { return next_tval_; }

  /// A row or column value of factored element code (rc_hoist_): a subexpression that varies
  /// per row (or only per matrix or tensor) or per column, which element code reads from
  /// X.rv[slot] or X.cv[...] and fo_row_values / fo_col_values compute (the host: once per
  /// row, and per column once per chunk). One per statement and text: the same text in
  /// another statement may read other values.
  struct RcValue {
    bool col = false;
    int slot = 0;          ///< among the row values, or among the column values
    int stmt = 0;          ///< computed before this statement runs
    std::string text;      ///< its element-context text (rc_hoist_ off inside)
    std::set<int> passes;  ///< the passes whose element code reads it
  };
  const std::vector<RcValue>& rc_values() const { return rc_values_; }
  int num_rc_values(bool col) const { return rc_count_[col ? 1 : 0]; }

  /// Lines for fo_prepare, in dependency order.
  const std::vector<PrepareLine>& prepare_lines() const { return prepare_; }
  int num_slots() const { return static_cast<int>(prepare_.size()); }

 private:
  // Every non-trivial uniform node gets a slot, keyed by its text (whose children are
  // already slots): identical uniform subexpressions anywhere in the rule are computed once.
  // fo_prepare computes each slot in double (from the double hypers and step), as torch
  // computes its Python-float scalars, and rounds it to float once for the element loop.
  int slot_for(const std::string& text, lang::Loc loc);

  /// The slot of uniform `e`, its text built in fo_prepare's double context.
  int hoist(const lang::Expr& e);

  /// A slot as the current context reads it: the double in fo_prepare, the float after.
  std::string slot_ref(int slot) const;

  /// Whether `e` reads a per-tensor value (a scalar state or a built-in such as numel),
  /// directly or through temporaries.
  bool reads_scalar(const lang::Expr& e);

  /// A per-tensor subexpression of element code that reads a scalar state: computed once
  /// per tensor in double (fo_tensor_values), read from fo_tvals.
  bool per_tensor_hoist(const lang::Expr& e);

  /// The fo_tvals slot that holds per-tensor `e` (identical texts share one), as T.v[k].
  std::string tensor_slot_ref(const lang::Expr& e);

  static bool trivial(const lang::Expr& e) {
    return e.op == lang::Op::Number || e.op == lang::Op::Ref || e.op == lang::Op::Reduce ||
           e.op == lang::Op::Orthogonalize;
  }

  /// A symbol reference as the current context reads it.
  std::string ref(const lang::Expr& e, bool uniform_ctx);

  /// Whether element code reads `e` as a row or column value (rc_hoist_).
  bool rc_hoisted(const lang::Expr& e) const;
  /// The X.rv / X.cv read of row or column value `e`, its slot made on first use.
  std::string rc_value_ref(const lang::Expr& e);

  /// The text of `e` as a value: a slot if it is uniform, else the node itself.
  std::string emit(const lang::Expr& e);

  /// The text of `e` as a truth value.
  std::string cond(const lang::Expr& e);

  /// The truth value of `e`'s own operator over its (emitted) operands.
  std::string cond_node(const lang::Expr& e);

  /// The operator of `e` applied to its (emitted) operands.
  std::string node(const lang::Expr& e, bool uniform_ctx);

  const lang::Rule& rule_;
  bool f64_ = false;
  std::map<int, int> temp_slot_;

 public:
  /// Element-context reads redirected to other locals (scratch values in the update pass
  /// of the Store strategy): by reaching definition, or by symbol for original values.
  std::map<int, std::string> def_override_;
  std::map<int, std::string> orig_override_;
  /// The scratch role of each matrix stage (Schedule::stage_roles).
  std::vector<int> stage_roles_;
  /// Row, column and matrix means as the locals an element function loads at its top
  /// (fo_rmean<slot>, fo_cmean<slot>, fo_mmean<slot>: BodyEmitter::emit_rc_loads), not as
  /// loads where they are used: a load under a `where` would be masked, which keeps the
  /// host's column loops scalar. The row and column stages read them in place.
  bool rc_locals_ = false;
  /// Factored element code: row-level (and matrix- and tensor-level) subexpressions read as
  /// row values, column-level ones as column values (RcValue); cur_stmt_ and cur_pass_ say
  /// where the code being emitted is.
  bool rc_hoist_ = false;
  int cur_stmt_ = 0;
  int cur_pass_ = 0;

 private:
  std::map<std::string, int> slot_by_text_;
  std::vector<PrepareLine> prepare_;
  bool in_prepare_ = false;         ///< emitting a uniform value for fo_prepare (double context)
  bool in_tensor_ = false;          ///< emitting a per-tensor value for fo_tensor_values (double)
  std::map<int, int> scalar_orig_;  ///< scalar symbol -> fo_tvals slot (before)
  std::map<int, int> scalar_def_;   ///< scalar statement -> fo_tvals slot
  std::map<int, std::string> reduce_text_;   ///< reduction -> its tensor-context text
  std::map<int, bool> temp_reads_scalar_;    ///< memo of reads_scalar per temporary def
  std::map<std::string, int> tval_by_text_;  ///< hoisted per-tensor text -> slot
  std::vector<std::pair<int, std::string>> hoisted_;
  int next_tval_ = 0;
  std::map<std::tuple<bool, int, std::string>, std::size_t> rc_by_key_;  ///< -> rc_values_
  std::vector<RcValue> rc_values_;
  int rc_count_[2] = {0, 0};  ///< row values, column values
};

}  // namespace fusedopt::codegen
