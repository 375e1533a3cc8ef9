// Name resolution and the rules of the language that grammar cannot express: one param,
// one grad, no duplicates, read-only grad/hypers/step, temporaries assigned before use,
// states and outputs written, something updated, booleans and numbers kept apart.
#include "lang/checker.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "lang/dump.hpp"
#include "lang/hints.hpp"
#include "lang/limits.hpp"
#include "lang/matrix_stage.hpp"
#include "lang/names.hpp"
#include "lang/types.hpp"

namespace fusedopt::lang {
namespace {

std::string where_declared(const Symbol& s) {
  return fmt::format("'{}' is declared as {} {} at line {}, column {}", s.name,
                     s.kind == SymKind::Hyper || s.kind == SymKind::Output ? "an" : "a",
                     to_string(s.kind), s.loc.line, s.loc.col);
}

class Checker {
 public:
  Checker(const Source& source, ParsedRule& parsed, Rule& rule)
      : src_(source),
        in_(parsed),
        rule_(rule),
        sym_of_name_(parsed.names.size(), -1),
        first_assign_(parsed.names.size(), -1) {}

  void run() {
    for (Decl& d : in_.decls) declare(d);
    const Loc missing_at = in_.stmts.empty() ? in_.end : in_.stmts.front().loc;
    if (rule_.param < 0) {
      src_.fail(missing_at, "the rule declares no param",
                "declare the tensor it updates before the first statement, e.g. 'param p'");
    }
    if (rule_.grad < 0) {
      src_.fail(missing_at, "the rule declares no grad",
                "declare the gradient before the first statement, e.g. 'grad g'");
    }
    rule_.step = add_symbol("step", SymKind::Step, Loc{0, 0, 4});
    for (std::size_t id = 0; id < in_.names.size(); ++id) {
      if (in_.names[id] == "step") sym_of_name_[id] = rule_.step;
    }
    // The built-in per-tensor values the rule names (only those: a rule's symbols are what
    // it uses).
    for (std::size_t id = 0; id < in_.names.size(); ++id) {
      for (int k = 0; k < kNumInfos; ++k) {
        if (in_.names[id] != kInfoNames[k]) continue;
        sym_of_name_[id] = add_symbol(kInfoNames[k], SymKind::Info, Loc{0, 0, 1});
        rule_.symbols[sym_of_name_[id]].index = k;
      }
    }

    for (std::size_t i = 0; i < in_.stmts.size(); ++i) {
      int& first = first_assign_[in_.stmts[i].target];
      if (first < 0) first = static_cast<int>(i);
    }
    for (Decl& d : in_.decls) {
      if (d.kind != SymKind::State && d.kind != SymKind::Scalar && d.kind != SymKind::RowState &&
          d.kind != SymKind::ColState) {
        continue;
      }
      Symbol& state = rule_.symbols[sym_of_name_[d.name]];
      resolve(*d.init, &state);
      if (d.init->boolean) {
        src_.fail(
            d.init->loc,
            fmt::format("{} '{}' holds a number, and its initial value '{}' is a boolean",
                        to_string(d.kind), state.name, source_form(rule_, *d.init)),
            fmt::format("start it from 'where({}, 1, 0)' (1 or 0)", source_form(rule_, *d.init)));
      }
      if (d.kind != SymKind::State && !d.init->uniform) {
        src_.fail(d.init->loc,
                  fmt::format("the initial value of {} '{}' reads the param", to_string(d.kind),
                              state.name),
                  fmt::format("a {} is not one value per element: start it from numbers and "
                              "hypers",
                              to_string(d.kind)));
      }
      state.init = std::move(d.init);
    }
    last_def_.assign(rule_.symbols.size(), -1);
    for (RawStmt& s : in_.stmts) statement(s);

    finish();
  }

 private:
  int add_symbol(std::string_view name, SymKind kind, const Loc& loc) {
    // A running count per kind keeps this O(1): rules may have many temporaries.
    const int index = kind_count_[static_cast<int>(kind)]++;
    Symbol sym;
    sym.name = std::string(name);
    sym.kind = kind;
    sym.loc = loc;
    sym.index = index;
    rule_.symbols.push_back(std::move(sym));
    return static_cast<int>(rule_.symbols.size()) - 1;
  }

  void declare(Decl& d) {
    const std::string_view name = in_.names[d.name];
    const char* reason = d.internal ? nullptr : reserved_reason(name);
    if (reason != nullptr) {
      src_.fail(d.loc, fmt::format("cannot declare '{}': {}", name, reason), "choose another name");
    }
    const Loc kw{d.keyword.line, d.keyword.col, d.kind == SymKind::Param ? 5 : 4};
    if (d.kind == SymKind::Param && rule_.param >= 0) {
      src_.fail(kw, "a rule has exactly one param", where_declared(rule_.symbols[rule_.param]));
    }
    if (d.kind == SymKind::Grad && rule_.grad >= 0) {
      src_.fail(kw, "a rule has exactly one grad", where_declared(rule_.symbols[rule_.grad]));
    }
    if (sym_of_name_[d.name] >= 0) {
      src_.fail(d.loc, fmt::format("'{}' is already declared", name),
                where_declared(rule_.symbols[sym_of_name_[d.name]]));
    }
    const int sym = add_symbol(name, d.kind, d.loc);
    sym_of_name_[d.name] = sym;
    rule_.symbols[sym].default_value = d.default_value;
    switch (d.kind) {
      case SymKind::Param:
        rule_.param = sym;
        break;
      case SymKind::Grad:
        rule_.grad = sym;
        break;
      case SymKind::State:
        rule_.states.push_back(sym);
        break;
      case SymKind::Scalar:
        rule_.scalars.push_back(sym);
        break;
      case SymKind::RowState:
        rule_.row_states.push_back(sym);
        break;
      case SymKind::ColState:
        rule_.col_states.push_back(sym);
        break;
      case SymKind::Hyper:
        rule_.hypers.push_back(sym);
        break;
      case SymKind::Output:
        rule_.outputs.push_back(sym);
        break;
      default:
        break;
    }
  }

  std::vector<std::string_view> known_names() const {
    std::vector<std::string_view> names;
    names.reserve(rule_.symbols.size());
    for (const Symbol& s : rule_.symbols) names.push_back(s.name);
    return names;
  }

  [[noreturn]] void unknown_name(const Expr& e, std::string_view name) const {
    std::string hint = did_you_mean(name, known_names());
    if (hint.empty()) {
      hint =
          "declare it (param, grad, state, scalar, hyper, output) or assign it in an earlier "
          "statement";
    }
    src_.fail(e.loc, fmt::format("unknown name '{}'", name), hint);
  }

  // Resolves the names under `e` and fills its derived flags. `state` is the state whose
  // initial value this is, or nullptr inside a statement. Depth is bounded by the parser.
  void resolve(Expr& e, const Symbol* state) {
    for (ExprPtr& a : e.args) resolve(*a, state);
    if (e.op == Op::Number) {
      e.uniform = true;
      e.level = Level::Uniform;
      return;
    }
    if (e.op == Op::Ref) {
      resolve_ref(e, state);
      return;
    }
    if (e.op == Op::Reduce) {
      reduce(e, state);
      return;
    }
    if (e.op == Op::Orthogonalize) {
      stage(e, state);
      return;
    }
    e.level = Level::Uniform;
    for (const ExprPtr& a : e.args) {
      e.level = join(e.level, a->level);
      e.phase = std::max(e.phase, a->phase);
      e.staged = e.staged || a->staged;
    }
    if (e.op == Op::Rand) {  // one value per element and step, whatever its (no) arguments
      if (state != nullptr) {
        src_.fail(e.loc, "rand() in an initial value",
                  "initial values are deterministic; draw the noise in a statement");
      }
      e.level = Level::Element;
    }
    e.uniform = e.level == Level::Uniform;
    e.elementwise = e.level == Level::Element;
    if (is_comparison_or_logic(e.op)) {
      e.boolean = true;
    } else if (e.op == Op::Where) {
      e.boolean = e.args[1]->boolean && e.args[2]->boolean;
    } else if (const FunctionInfo* fn = function_of(e.op)) {
      e.boolean = fn->boolean;
    }
    check_kinds(src_, rule_, e);
  }

  // A reduction call: its argument must vary per element; it runs in the pass where its
  // argument is first known, and its result is a scalar (per tensor or global) from the
  // next pass on.
  void reduce(Expr& e, const Symbol* state) {
    const FunctionInfo& fn = reduction_info(e.reduce_kind, e.reduce_scope);
    if (state != nullptr) {
      src_.fail(e.loc,
                fmt::format("the initial value of {} '{}' cannot use a reduction ('{}')",
                            to_string(state->kind), state->name, fn.name),
                "initial values are written once, element by element, before the first step; "
                "compute the reduction in a statement instead");
    }
    const Expr& arg = *e.args[0];
    check_number_operand(src_, rule_, arg, fn.name);
    check_not_staged(src_, e, arg, fn.name);
    if (e.reduce_scope == Scope::Matrix) {
      matrix_reduce(e, fn);
      return;
    }
    if (!arg.elementwise) {
      if (arg.uniform) {
        src_.fail(e.loc,
                  fmt::format("'{}' reduces a value that is the same for every element", fn.name),
                  "its argument uses only numbers, hypers, 'step' and global results; reduce an "
                  "expression of the param, the grad or a state");
      }
      // Per tensor (reductions, scalar states, built-ins such as numel), matrix, row or column.
      const char* per = arg.level == Level::Row      ? "row"
                        : arg.level == Level::Col    ? "column"
                        : arg.level == Level::Matrix ? "matrix"
                                                     : "tensor";
      src_.fail(e.loc,
                fmt::format("'{0}' reduces a value that is the same for every element of a {1} "
                            "(its argument reads only per-{1} values, not the elements)",
                            fn.name, per),
                fmt::format("it would add that value once per element; reduce an element "
                            "expression, e.g. '{}(p)', and combine the results afterwards",
                            fn.name));
    }
    if (arg.phase >= kMaxReductionPasses) {
      src_.fail(e.loc,
                fmt::format("'{}' would need reduction pass {}: a rule may use at most {} passes "
                            "of reductions",
                            fn.name, arg.phase + 1, kMaxReductionPasses),
                "its argument depends on a chain of reductions, each needing its own pass over "
                "the data; compute independent reductions from the same values so they share a "
                "pass");
    }
    add_reduction(e, fn, arg.phase);
    e.phase = arg.phase + 1;
  }

  /// Records reduction `e` (computed in pass `pass`, or for matrix_mean in the finalize of
  /// pass `pass`) and sets its level.
  void add_reduction(Expr& e, const FunctionInfo& fn, int pass) {
    Reduction r;
    r.kind = e.reduce_kind;
    r.scope = e.reduce_scope;
    r.pass = pass;
    int* counts[] = {&rule_.num_tensor_reductions, &rule_.num_global_reductions,
                     &rule_.num_row_reductions, &rule_.num_col_reductions,
                     &rule_.num_matrix_reductions};
    r.slot = (*counts[static_cast<int>(r.scope)])++;
    r.loc = e.loc;
    r.arg = e.args[0].get();
    r.name = fn.name;
    e.reduction = static_cast<int>(rule_.reductions.size());
    rule_.reductions.push_back(std::move(r));
    static constexpr Level kLevels[] = {Level::Tensor, Level::Uniform, Level::Row, Level::Col,
                                        Level::Matrix};
    e.level = kLevels[static_cast<int>(e.reduce_scope)];
    e.uniform = e.level == Level::Uniform;
    e.elementwise = false;
    e.boolean = fn.boolean;
  }

  // matrix_mean(x): x is a row (or column) value, averaged over the rows (columns) of its
  // matrix once the row (column) reductions it reads are known: in the finalize of the pass
  // that computed them, so the result is known in the same pass as x.
  void matrix_reduce(Expr& e, const FunctionInfo& fn) {
    const Expr& arg = *e.args[0];
    if (arg.level != Level::Row && arg.level != Level::Col) {
      src_.fail(
          e.loc,
          fmt::format("'{}' averages a row or a column value over its matrix; this "
                      "argument varies {}",
                      fn.name, arg.level == Level::Element ? "per element" : "less than per row"),
          "average a row state or an expression of row_mean (or the column forms), e.g. "
          "'matrix_mean(r)' for a 'row r'");
    }
    if (arg.phase == 0) {
      src_.fail(
          e.loc,
          fmt::format("'{}' of a value known before the first pass: not supported yet", fn.name),
          "average a value that reads a row_mean or col_mean of this step");
    }
    add_reduction(e, fn, arg.phase - 1);
    e.phase = arg.phase;
  }

  // orthogonalize(...): the stage (lang/matrix_stage.cpp checks it), its result an element
  // value from the pass after its argument's.
  void stage(Expr& e, const Symbol* state) {
    e.stage = static_cast<int>(rule_.stages.size());
    rule_.stages.push_back(check_matrix_stage(src_, rule_, e, state));
    e.level = Level::Element;
    e.elementwise = true;
    e.uniform = false;
    e.staged = true;
    e.phase = e.args[0]->phase + 1;
  }

  void resolve_ref(Expr& e, const Symbol* state) {
    const int id = e.sym;
    const std::string_view name = in_.names[id];
    const int sym = sym_of_name_[id];
    if (state != nullptr) {
      // A state's initial value is computed before any step, from the param and hypers.
      if (sym < 0 && first_assign_[id] < 0) unknown_name(e, name);
      const SymKind kind = sym < 0 ? SymKind::Temp : rule_.symbols[sym].kind;
      if (kind != SymKind::Param && kind != SymKind::Hyper) {
        const std::string what = kind == SymKind::Grad ? "the gradient" + fmt::format(" '{}'", name)
                                 : kind == SymKind::Step ? std::string("'step'")
                                 : kind == SymKind::Temp
                                     ? fmt::format("the temporary '{}'", name)
                                     : fmt::format("{} '{}'", to_string(kind), name);
        src_.fail(e.loc,
                  fmt::format("the initial value of {} '{}' cannot use {}", to_string(state->kind),
                              state->name, what),
                  state->kind == SymKind::State
                      ? "a state's initial value may use numbers, hypers and the param"
                      : fmt::format("a {}'s initial value may use numbers and hypers",
                                    to_string(state->kind)));
      }
    } else if (sym < 0) {
      if (first_assign_[id] >= 0) {
        src_.fail(e.loc, fmt::format("'{}' is used before it is assigned", name),
                  fmt::format("it is first assigned at line {}; to carry its value from one "
                              "step to the next, declare it: 'state {} = 0'",
                              in_.stmts[first_assign_[id]].loc.line, name));
      }
      unknown_name(e, name);
    }
    e.sym = sym;
    const Symbol& s = rule_.symbols[sym];
    if (s.kind == SymKind::Temp || s.kind == SymKind::Output) {
      e.def = last_def_[sym];
      if (e.def < 0) {
        src_.fail(e.loc, fmt::format("'{}' is used before it is assigned", name),
                  "assign the output before reading it");
      }
      const Expr& value = *rule_.stmts[e.def].value;
      e.level = s.kind == SymKind::Output ? Level::Element : value.level;
      e.uniform = e.level == Level::Uniform;
      e.boolean = value.boolean;
      e.elementwise = e.level == Level::Element;
      e.phase = value.phase;
    } else if (s.kind == SymKind::Scalar || s.kind == SymKind::RowState ||
               s.kind == SymKind::ColState) {
      // One value per tensor (row, column): neither uniform nor per element.
      e.level = s.kind == SymKind::Scalar     ? Level::Tensor
                : s.kind == SymKind::RowState ? Level::Row
                                              : Level::Col;
      e.def = last_def_[sym];
      if (e.def >= 0) e.phase = rule_.stmts[e.def].value->phase;
    } else if (s.kind == SymKind::Info) {
      // One value per tensor, known before the step: like a scalar state's start.
      e.level = Level::Tensor;
    } else {
      e.uniform = s.kind == SymKind::Hyper || s.kind == SymKind::Step;
      e.level = e.uniform ? Level::Uniform : Level::Element;
      if (!e.uniform) {  // a tensor: its current value (the latest assignment's, if any)
        e.elementwise = true;
        e.def = state == nullptr ? last_def_[sym] : -1;
        if (e.def >= 0) e.phase = rule_.stmts[e.def].value->phase;
      }
    }
    // A read of a statement's value depends on a matrix stage when that value does.
    if (e.def >= 0) e.staged = rule_.stmts[e.def].value->staged;
  }

  void statement(RawStmt& raw) {
    resolve(*raw.value, nullptr);
    const std::string_view name = in_.names[raw.target];
    int sym = sym_of_name_[raw.target];
    if (sym < 0) {
      if (const char* reason = raw.internal ? nullptr : reserved_reason(name)) {
        src_.fail(raw.loc, fmt::format("cannot assign to '{}': {}", name, reason),
                  "assign a temporary with another name");
      }
      sym = add_symbol(name, SymKind::Temp, raw.loc);
      sym_of_name_[raw.target] = sym;
      last_def_.push_back(-1);
    }
    Symbol& s = rule_.symbols[sym];
    if (raw.value->boolean && s.kind != SymKind::Temp && s.kind != SymKind::Grad &&
        s.kind != SymKind::Hyper && s.kind != SymKind::Step && s.kind != SymKind::Info) {
      src_.fail(raw.loc,
                fmt::format("{} '{}' holds a number, and '{}' is a boolean", to_string(s.kind),
                            name, source_form(rule_, *raw.value)),
                fmt::format("assign 1 or 0: '{} = where({}, 1, 0)'", name,
                            source_form(rule_, *raw.value)));
    }
    switch (s.kind) {
      case SymKind::Grad:
        src_.fail(raw.loc, fmt::format("cannot assign to the gradient '{}': it is read-only", name),
                  "assign a temporary instead, e.g. 'gc = ...', and use that");
      case SymKind::Hyper:
        src_.fail(raw.loc, fmt::format("cannot assign to hyper '{}': it is read-only", name),
                  "hypers are set per parameter group; assign a temporary instead");
      case SymKind::Step:
        src_.fail(raw.loc, fmt::format("cannot assign to 'step': {}", reserved_reason("step")),
                  "assign a temporary instead, e.g. 't = step + 1'");
      case SymKind::Info:
        src_.fail(raw.loc, fmt::format("cannot assign to '{}': {}", name, reserved_reason(name)),
                  "assign a temporary with another name");
      case SymKind::Scalar:
        if (raw.value->level > Level::Tensor) {
          src_.fail(
              raw.loc,
              fmt::format("scalar '{}' is one value per tensor: it cannot be assigned a value "
                          "that differs from element to element",
                          name),
              "assign it from hypers, 'step', other scalars and reductions (e.g. "
              "tensor_norm(p)), or make it a state");
        }
        break;
      case SymKind::RowState:
      case SymKind::ColState: {
        const bool row = s.kind == SymKind::RowState;
        const Level l = raw.value->level;
        if (l == Level::Element || l == (row ? Level::Col : Level::Row)) {
          src_.fail(raw.loc,
                    fmt::format("{} state '{}' is one value per {}: it cannot be assigned a "
                                "value that varies along the {}",
                                row ? "row" : "col", name, row ? "row" : "column",
                                row ? "row" : "column"),
                    fmt::format("assign it from {0} states and {0}_mean(...) of an element "
                                "expression (and per-tensor values), e.g. '{1} = lerp({1}, "
                                "{0}_mean(g * g), 0.1)'",
                                row ? "row" : "col", name));
        }
        break;
      }
      default:
        break;
    }
    s.written = true;
    Stmt stmt;
    stmt.target = sym;
    stmt.value = std::move(raw.value);
    stmt.loc = raw.loc;
    stmt.phase = stmt.value->phase;
    last_def_[sym] = static_cast<int>(rule_.stmts.size());
    rule_.stmts.push_back(std::move(stmt));
  }

  void finish() {
    bool updates = false;
    for (const Stmt& st : rule_.stmts) {
      SymKind k = rule_.symbols[st.target].kind;
      updates = updates || k == SymKind::Param || k == SymKind::State || k == SymKind::Output ||
                k == SymKind::Scalar || k == SymKind::RowState || k == SymKind::ColState;
    }
    const Symbol& param = rule_.symbols[rule_.param];
    if (!updates) {
      src_.fail(param.loc,
                fmt::format("the rule updates nothing: no statement assigns the param '{}', a "
                            "state or an output",
                            param.name),
                fmt::format("e.g. '{} = {} - lr * {}'", param.name, param.name,
                            rule_.symbols[rule_.grad].name));
    }
    for (int i : rule_.states) {
      const Symbol& s = rule_.symbols[i];
      if (!s.written) {
        src_.fail(s.loc, fmt::format("state '{}' is never updated", s.name),
                  "assign it in a statement, or remove it (a constant belongs in a hyper)");
      }
    }
    for (const std::vector<int>* list : {&rule_.scalars, &rule_.row_states, &rule_.col_states}) {
      for (int i : *list) {
        const Symbol& s = rule_.symbols[i];
        if (!s.written) {
          src_.fail(s.loc, fmt::format("{} '{}' is never updated", to_string(s.kind), s.name),
                    "assign it in a statement, or remove it (a constant belongs in a hyper)");
        }
      }
    }
    for (int i : rule_.outputs) {
      const Symbol& s = rule_.symbols[i];
      if (!s.written) {
        src_.fail(s.loc, fmt::format("output '{}' is never assigned", s.name),
                  fmt::format("assign it in a statement, e.g. '{} = ...'", s.name));
      }
    }
    // The limits before anything that walks the statements as a whole: a 1 MiB rule may
    // hold 150,000 of them.
    check_limits(src_, rule_);
    // The update runs after every reduction pass; element-wise rules have none.
    rule_.reduction_passes = 0;
    for (const Reduction& r : rule_.reductions) {
      rule_.reduction_passes = std::max(rule_.reduction_passes, r.pass + 1);
    }
    for (const MatrixStage& st : rule_.stages) {
      rule_.reduction_passes = std::max(rule_.reduction_passes, st.pass + 1);
    }
    check_stages_fit(src_, rule_);
    schedule_late();
  }

  // Reductions go to the earliest pass their argument allows. One that no other reduction
  // depends on feeds only the update, so it moves to the last reduction pass: that pass
  // already reads most tensors (LAMB's ||p|| joins ||u|| there instead of making the
  // global-norm pass read the params too). Phases are then recomputed.
  void schedule_late() {
    const int n = rule_.reduction_passes;
    if (n < 2) return;
    const std::size_t nr = rule_.reductions.size();
    // stmt_deps[i]: the reductions statement i's value depends on. A statement reads only
    // earlier ones, so one loop in text order fills them: no recursion along a chain of
    // definitions, however long.
    std::vector<std::vector<bool>> stmt_deps(rule_.stmts.size());
    for (std::size_t i = 0; i < rule_.stmts.size(); ++i) {
      stmt_deps[i].assign(nr, false);
      add_deps(*rule_.stmts[i].value, stmt_deps, stmt_deps[i]);
    }
    std::vector<bool> needed_by_reduction(nr, false);
    for (const Reduction& r : rule_.reductions) add_deps(*r.arg, stmt_deps, needed_by_reduction);
    for (const MatrixStage& st : rule_.stages) add_deps(*st.arg, stmt_deps, needed_by_reduction);
    for (std::size_t k = 0; k < nr; ++k) {
      if (!needed_by_reduction[k]) rule_.reductions[k].pass = n - 1;
    }
    for (Stmt& st : rule_.stmts) st.phase = rephase(*st.value);
  }

  // Marks in `out` the reductions e's value depends on: those it calls, and those of the
  // statements it reads (already in stmt_deps). Recurses over e's own tree only, whose
  // depth the parser bounds.
  static void add_deps(const Expr& e, const std::vector<std::vector<bool>>& stmt_deps,
                       std::vector<bool>& out) {
    if (e.op == Op::Reduce) {
      out[static_cast<std::size_t>(e.reduction)] = true;
      return;
    }
    if (e.op == Op::Ref && e.def >= 0) {
      const std::vector<bool>& d = stmt_deps[static_cast<std::size_t>(e.def)];
      for (std::size_t r = 0; r < d.size(); ++r) out[r] = out[r] || d[r];
    }
    for (const ExprPtr& a : e.args) add_deps(*a, stmt_deps, out);
  }

  int rephase(Expr& e) {
    int phase = 0;
    for (ExprPtr& a : e.args) phase = std::max(phase, rephase(*a));
    if (e.op == Op::Reduce) phase = rule_.reductions[e.reduction].pass + 1;
    if (e.op == Op::Orthogonalize) phase = rule_.stages[e.stage].pass + 1;
    if (e.op == Op::Ref && e.def >= 0) phase = rule_.stmts[e.def].phase;
    e.phase = phase;
    return phase;
  }

  const Source& src_;
  ParsedRule& in_;
  Rule& rule_;
  std::vector<int> sym_of_name_;   // name id -> symbol index, -1 until declared/assigned
  std::vector<int> first_assign_;  // name id -> first statement assigning it, or -1
  std::vector<int> last_def_;      // symbol index -> latest statement assigning it, or -1
  int kind_count_[static_cast<int>(SymKind::Temp) + 1] = {};
};

}  // namespace

void check_rule(const Source& source, ParsedRule& parsed, Rule& rule) {
  Checker(source, parsed, rule).run();
}

}  // namespace fusedopt::lang
