// Rule -> per-element C++ body. Uniform subexpressions (hypers, step and constants only)
// are hoisted into fo_prepare, which runs once per launch and group (per block on the
// GPU), and identical ones share a slot.
#include "codegen/codegen.hpp"

#include <fmt/format.h>

#include <map>

#include "codegen/expr_emitter.hpp"
#include "codegen/writer.hpp"
#include "fusedopt/error.hpp"
#include "lang/names.hpp"

namespace fusedopt::codegen {
namespace {

using lang::Expr;
using lang::Op;
using lang::Rule;
using lang::SymKind;

bool is_tensor(SymKind k) {
  return k == SymKind::Param || k == SymKind::Grad || k == SymKind::State || k == SymKind::Output;
}

/// What a reduction adds per element: its accumulator update.
std::string accumulate(lang::ReduceKind kind, int j, const std::string& x) {
  const std::string a = fmt::format("fo_a[{} * fo_stride]", j);
  switch (kind) {
    case lang::ReduceKind::Sum:
      return fmt::format("{} += {};", a, x);
    case lang::ReduceKind::SumSq:
    case lang::ReduceKind::Norm:
      return fmt::format("{} += fo_sq({});", a, x);
    case lang::ReduceKind::MaxAbs:
      return fmt::format("{0} = fo_maxnan({0}, fo_abs({1}));", a, x);
    case lang::ReduceKind::AnyNonFinite:
      return fmt::format("{0} = fo_max({0}, fo_isfinite({1}) ? 0.0f : 1.0f);", a, x);
    case lang::ReduceKind::Mean:
      break;  // row_mean, col_mean, matrix_mean: summed outside the lanes
  }
  return "";
}

/// The value a later pass sees, in double, from a raw total `raw` (a double expression).
std::string finish_value_d(lang::ReduceKind kind, const std::string& raw) {
  switch (kind) {
    case lang::ReduceKind::Norm:
      return fmt::format("fo_sqrt_d({})", raw);
    case lang::ReduceKind::AnyNonFinite:
      return fmt::format("({} > 0.0 ? 1.0 : 0.0)", raw);
    default:
      return raw;
  }
}

/// The same value rounded to float, as the element loop uses it.
std::string finish_value(lang::ReduceKind kind, const std::string& raw) {
  return fmt::format("(float){}", finish_value_d(kind, raw));
}

/// Emits the generated functions of one rule and binding.
class BodyEmitter {
 public:
  BodyEmitter(const Rule& rule, const DTypeBinding& dtypes, const Schedule& schedule)
      : rule_(rule), dtypes_(dtypes), s_(schedule), em_(rule), file_(line_file_name(rule.file)) {
    for (std::size_t i = 0; i < rule.stmts.size(); ++i) {
      const lang::Stmt& st = rule.stmts[i];
      if (rule.symbols[st.target].kind == SymKind::Temp && st.value->uniform) {
        em_.define_uniform_temp(static_cast<int>(i), *st.value);
      }
      if (is_tensor(rule.symbols[st.target].kind)) last_def_[st.target] = static_cast<int>(i);
    }
    // Accumulator index of each reduction within its pass; the grad check follows pass 0's.
    std::vector<int> count(std::max(rule.reduction_passes, 1), 0);
    for (const lang::Reduction& r : rule.reductions) {
      acc_.push_back(lanes(r) ? count[r.pass]++ : -1);  // row/col/matrix: their own sums
    }
    factored_ = rule.factored();
    pass_acc_count_ = count;
    if (rule.reduction_passes > 0) check_acc_ = pass_acc_count_[0]++;
    // fo_tvals: per-tensor reduction values, each scalar state before the step, each scalar
    // assignment's result, then per-tensor subexpressions hoisted out of element code.
    std::map<int, int> original, assigned;
    int slot = rule.num_tensor_reductions;
    for (int s : rule.scalars) original[s] = slot++;
    for (std::size_t i = 0; i < rule.stmts.size(); ++i) {
      if (rule.symbols[rule.stmts[i].target].kind == SymKind::Scalar) {
        assigned[static_cast<int>(i)] = slot++;
      }
    }
    em_.set_scalar_slots(original, assigned);
    em_.set_first_hoist_slot(slot);
    std::map<int, std::string> texts;
    for (std::size_t r = 0; r < rule.reductions.size(); ++r) {
      const lang::Reduction& red = rule.reductions[r];
      if (!lanes(red)) continue;  // not per-tensor values
      texts[static_cast<int>(r)] = finish_value_d(
          red.kind, fmt::format("{}[{}]", red.scope == lang::Scope::Tensor ? "R" : "G", red.slot));
    }
    em_.set_reduction_texts(std::move(texts));
  }

  /// fo_tensor_values (after the passes: element code may hoist per-tensor values into it)
  /// and fo_scalar_init.
  std::string tensor_functions() {
    Writer w;
    const bool scalars = !rule_.scalars.empty();
    // One compiled body for the element passes and the end-of-step write (fusedopt_scalars):
    // the scalar values the update used are the ones stored, bit for bit.
    w.line(
        fmt::format("{} void fo_tensor_values(const double* FO_RESTRICT R, const double* S, "
                    "const double* FO_RESTRICT h, double step, const double* FO_RESTRICT G, "
                    "const double* FO_RESTRICT I, fo_tvals& T, double* S_out) {{",
                    scalars ? "FO_FN_NOINLINE" : "FO_FN"));
    w.line("  (void)R; (void)S; (void)h; (void)step; (void)G; (void)I; (void)S_out;");
    w.line("  T.v[0] = 0.0f;");
    for (const lang::Reduction& r : rule_.reductions) {
      if (r.scope == lang::Scope::Tensor) {
        w.line(fmt::format("  T.v[{}] = {};", r.slot,
                           finish_value(r.kind, fmt::format("R[{}]", r.slot))));
      }
    }
    int slot = rule_.num_tensor_reductions;
    for (int s : rule_.scalars) {
      const int k = rule_.symbols[s].index;
      w.line(
          fmt::format("  const double fo_so{0} = S[{0}]; T.v[{1}] = (float)fo_so{0};", k, slot++));
    }
    std::map<int, std::string> final_value;  // scalar index -> the local holding it at the end
    for (int s : rule_.scalars) {
      final_value[rule_.symbols[s].index] = fmt::format("fo_so{}", rule_.symbols[s].index);
    }
    // Per-tensor temporaries (and uniform ones, again in double) for the per-tensor values
    // that read them; unused ones are dead code the compiler drops.
    bool directed = false;
    for (std::size_t i = 0; i < rule_.stmts.size(); ++i) {
      const lang::Stmt& st = rule_.stmts[i];
      const lang::Symbol& target = rule_.symbols[st.target];
      // Per-tensor context: uniform and per-tensor values only (row, column and matrix
      // values are computed per element and in the row/column stages).
      if (st.value->level > lang::Level::Tensor) continue;
      directed = true;
      if (target.kind == SymKind::Temp) {
        w.line_directive(st.loc.line, file_);
        w.line(fmt::format("  const double fo_t{} = {};", i, em_.tensor_value(*st.value)));
      } else if (target.kind == SymKind::Scalar) {
        w.line_directive(st.loc.line, file_);
        w.line(fmt::format("  const double fo_s{0} = {1}; T.v[{2}] = (float)fo_s{0};", i,
                           em_.tensor_value(*st.value), slot++));
        final_value[target.index] = fmt::format("fo_s{}", i);
      }
    }
    for (const auto& [k, text] : em_.tensor_hoisted()) {
      w.line(fmt::format("  T.v[{}] = (float)({});", k, text));
    }
    if (directed) w.restore_line();
    w.line("  if (S_out) {");
    for (const auto& [k, local] : final_value) w.line(fmt::format("    S_out[{}] = {};", k, local));
    w.line("  }");
    w.line("}");
    w.line("FO_FN void fo_scalar_init(const double* FO_RESTRICT h, double* FO_RESTRICT S) {");
    w.line("  (void)h; (void)S;");
    for (int s : rule_.scalars) {
      const lang::Symbol& sym = rule_.symbols[s];
      w.line(fmt::format("  S[{}] = {};", sym.index, em_.tensor_value(*sym.init)));
    }
    w.line("}");
    return w.str();
  }

  /// Factored rules: which pass computes each row, column and matrix slot; fo_row_stage and
  /// fo_col_stage (a row's / column's statements: the new states, matrix_mean arguments);
  /// fo_rc_init (initial values). Before tensor_functions(): they may hoist per-tensor values.
  std::string rc_functions() {
    Writer w;
    if (!factored_) return "";
    auto slot_table = [&](const char* fn, lang::Scope scope, auto value) {
      w.line(fmt::format("FO_FN int {}(int s) {{", fn));
      for (const lang::Reduction& r : rule_.reductions) {
        if (r.scope == scope) w.line(fmt::format("  if (s == {}) return {};", r.slot, value(r)));
      }
      w.line("  (void)s;");
      w.line("  return -1;");
      w.line("}");
    };
    auto pass_of = [](const lang::Reduction& r) { return r.pass; };
    slot_table("fo_row_slot_pass", lang::Scope::Row, pass_of);
    slot_table("fo_col_slot_pass", lang::Scope::Col, pass_of);
    slot_table("fo_matrix_slot_pass", lang::Scope::Matrix, pass_of);
    slot_table("fo_matrix_slot_col", lang::Scope::Matrix,
               [](const lang::Reduction& r) { return r.arg->level == lang::Level::Col ? 1 : 0; });
    em_.def_override_.clear();
    em_.orig_override_.clear();
    for (const bool row : {true, false}) {
      const SymKind kind = row ? SymKind::RowState : SymKind::ColState;
      const lang::Level level = row ? lang::Level::Row : lang::Level::Col;
      const std::vector<int>& states = row ? rule_.row_states : rule_.col_states;
      w.line(fmt::format(
          "FO_FN void fo_{}_stage(const fo_rcx& X, const fo_uniform& U, const fo_tvals& T, "
          "float* fo_out, double* fo_m) {{",
          row ? "row" : "col"));
      w.line("  (void)X; (void)U; (void)T; (void)fo_out; (void)fo_m;");
      for (int s : states) {
        w.line(fmt::format("  float v_{} = X.{}s[{} * X.n{}s + X.{}];", rule_.symbols[s].name,
                           row ? "r" : "c", rule_.symbols[s].index, row ? "row" : "col",
                           row ? "row" : "col"));
      }
      for (const lang::Symbol& x : rule_.symbols) {
        if (x.kind == SymKind::Temp) w.line(fmt::format("  float v_{} = 0.0f;", x.name));
      }
      for (std::size_t i = 0; i < rule_.stmts.size(); ++i) {
        const lang::Stmt& st = rule_.stmts[i];
        const SymKind k = rule_.symbols[st.target].kind;
        const lang::Level l = st.value->level;
        const bool temp = k == SymKind::Temp && !st.value->uniform &&
                          (l == lang::Level::Tensor || l == lang::Level::Matrix || l == level);
        if (k != kind && !temp) continue;
        w.line_directive(st.loc.line, file_);
        w.line(fmt::format("  v_{} = {};", rule_.symbols[st.target].name, em_.element(*st.value)));
      }
      for (const lang::Reduction& r : rule_.reductions) {
        if (r.scope == lang::Scope::Matrix && r.arg->level == level) {
          w.line_directive(r.loc.line, file_);
          w.line(fmt::format("  fo_m[{}] = (double)({});", r.slot, em_.element(*r.arg)));
        }
      }
      w.restore_line();
      for (int s : states) {
        w.line(fmt::format("  fo_out[{}] = v_{};", rule_.symbols[s].index, rule_.symbols[s].name));
      }
      for (const lang::Symbol& x : rule_.symbols) {
        if (x.kind == SymKind::Temp) w.line(fmt::format("  (void)v_{};", x.name));
      }
      w.line("}");
    }
    w.line("FO_FN void fo_rc_init(const double* h, float* fo_rs, float* fo_cs) {");
    w.line("  (void)h; (void)fo_rs; (void)fo_cs;");
    for (const bool row : {true, false}) {
      for (int s : row ? rule_.row_states : rule_.col_states) {
        const lang::Symbol& sym = rule_.symbols[s];
        w.line(fmt::format("  fo_{}s[{}] = (float)({});", row ? "r" : "c", sym.index,
                           em_.tensor_value(*sym.init)));
      }
    }
    w.line("}");
    return w.str();
  }

  ExprEmitter& em() { return em_; }
  const ExprEmitter& em() const { return em_; }
  const std::vector<int>& pass_acc_count() const { return pass_acc_count_; }
  int check_acc() const { return check_acc_; }
  int acc_of(int reduction) const { return acc_[reduction]; }

  /// fo_reduce_element<pass> (pass < reduction_passes) or fo_element (the update).
  std::string pass_function(int pass) {
    const PassShape p{
        pass,
        s_.passes.at(pass),
        pass == rule_.reduction_passes,
        pass == s_.store_pass,
        pass == rule_.reduction_passes && s_.store_pass >= 0,
        std::set<int>(s_.passes.at(pass).stmts.begin(), s_.passes.at(pass).stmts.end())};
    em_.def_override_.clear();
    em_.orig_override_.clear();
    Writer loads, body, stores;
    emit_loads(p, loads);
    emit_statements(p, body);
    emit_stores(p, stores);
    return wrap_pass(p, loads, body, stores);
  }

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
  void emit_loads(const PassShape& p, Writer& loads) {
    // The update of the Store strategy reads what crossed through scratch tensors.
    if (p.update_after_store) {
      for (std::size_t c = 0; c < s_.crossings.size(); ++c) {
        const Crossing& x = s_.crossings[c];
        const std::string local = fmt::format("fo_x{}", c);
        loads.line(fmt::format("  const float {} = fo_load(t.r{}, i);", local,
                               s_.first_scratch_role + static_cast<int>(c)));
        if (x.def >= 0) {
          em_.def_override_[x.def] = local;
        } else {
          em_.orig_override_[x.sym] = local;
        }
      }
      // Final values of fp32 tensors finished early are read back from the tensors.
      for (int sym : s_.early_syms) {
        const int role = role_of(rule_, s_, sym);
        if (!p.plan.reads.count(role)) continue;
        const std::string local = fmt::format("fo_r_{}", rule_.symbols[sym].name);
        loads.line(fmt::format("  const float {} = fo_load(t.r{}, i);", local, role));
        em_.def_override_[last_def_.at(sym)] = local;
      }
    }

    // Originals this pass reads: every evaluated tensor reference without a definition.
    std::set<int> originals;
    auto scan = [&](const Expr& e) {
      visit_evaluated(e, [&](const Expr& x) {
        if (x.op == Op::Ref && x.def < 0 && is_tensor(rule_.symbols[x.sym].kind) &&
            !em_.orig_override_.count(x.sym)) {
          originals.insert(x.sym);
        }
      });
    };
    for (int i : p.plan.stmts) scan(*rule_.stmts[i].value);
    for (int r : p.plan.reductions) scan(*rule_.reductions[r].arg);
    if (p.store) {
      for (const Crossing& x : s_.crossings) {
        if (x.def < 0) originals.insert(x.sym);
      }
    }
    emit_rc_loads(loads);
    for (std::size_t sym = 0; sym < rule_.symbols.size(); ++sym) {
      const lang::Symbol& x = rule_.symbols[sym];
      if (!is_tensor(x.kind) && !(x.kind == SymKind::Temp)) continue;
      const int s = static_cast<int>(sym);
      if (x.kind == SymKind::Temp) {
        loads.line(fmt::format("  float v_{} = 0.0f;", x.name));
      } else if (originals.count(s)) {
        const std::string scale = x.kind == SymKind::Grad ? " * U.inv_grad_scale" : "";
        loads.line(fmt::format("  {}float v_{} = fo_load(t.r{}, i){};",
                               x.kind == SymKind::Grad ? "const " : "", x.name,
                               role_of(rule_, s_, s), scale));
      } else {
        loads.line(fmt::format("  float v_{} = 0.0f;", x.name));
      }
    }
    if (p.store) {
      for (std::size_t c = 0; c < s_.crossings.size(); ++c) {
        const Crossing& x = s_.crossings[c];
        if (x.def < 0) {
          loads.line(fmt::format("  fo_store(t.r{}, i, v_{});",
                                 s_.first_scratch_role + static_cast<int>(c), x.name));
        }
      }
    }
  }

  /// The statements (and, in a reduction pass, the accumulations of its reductions).
  void emit_statements(const PassShape& p, Writer& body) {
    for (std::size_t i = 0; i < rule_.stmts.size(); ++i) {
      const lang::Stmt& st = rule_.stmts[i];
      if (!p.update) {
        std::vector<const Expr*> calls;
        collect_reductions(*st.value, calls);
        for (const Expr* call : calls) {
          const lang::Reduction& r = rule_.reductions[call->reduction];
          if (r.pass != p.pass || r.scope == lang::Scope::Matrix) continue;
          body.line_directive(call->loc.line, file_);
          if (lanes(r)) {
            body.line("  " + accumulate(r.kind, acc_[call->reduction], em_.element(*r.arg)));
          } else {  // row_mean / col_mean: summed per row / per column, divided at the end
            body.line(fmt::format("  fo_{}r[{}] += (double)({});",
                                  r.scope == lang::Scope::Row ? "r" : "c", r.slot,
                                  em_.element(*r.arg)));
          }
        }
      }
      if (!p.compute.count(static_cast<int>(i))) continue;
      const lang::Symbol& target = rule_.symbols.at(st.target);
      body.line_directive(st.loc.line, file_);
      body.line(fmt::format("  v_{} = {};", target.name, em_.element(*st.value)));
      if (p.store) {
        for (std::size_t c = 0; c < s_.crossings.size(); ++c) {
          if (s_.crossings[c].def == static_cast<int>(i)) {
            body.line(fmt::format("  fo_store(t.r{}, i, v_{});",
                                  s_.first_scratch_role + static_cast<int>(c), target.name));
          }
        }
      }
    }
    body.restore_line();
  }

  /// What the pass writes back, and the grad check of pass 0.
  void emit_stores(const PassShape& p, Writer& stores) {
    // Stores: the update stores what it finished; the store pass what it finished early.
    std::set<int> finished;
    if (p.update) {
      for (const auto& [sym, def] : last_def_) {
        if (!p.update_after_store || !s_.early_syms.count(sym)) finished.insert(sym);
      }
    } else if (p.store) {
      finished = s_.early_syms;
    }
    for (int sym : finished) {
      const lang::Symbol& x = rule_.symbols[sym];
      stores.line(fmt::format("  fo_store(t.r{}, i, v_{});", role_of(rule_, s_, sym), x.name));
      if (x.kind == SymKind::Param && dtypes_.master) {
        stores.line(fmt::format("  fo_store(t.r0, i, v_{});", x.name));
      }
    }
    if (p.pass == 0 && check_acc_ >= 0) {
      stores.line(fmt::format("  if (fo_check) {{ {} }}",
                              accumulate(lang::ReduceKind::AnyNonFinite, check_acc_,
                                         fmt::format("fo_load(t.r1, i) * U.inv_grad_scale"))));
    }
    for (const lang::Symbol& x : rule_.symbols) {
      if (is_tensor(x.kind) || x.kind == SymKind::Temp || is_rc(x.kind))
        stores.line(fmt::format("  (void)v_{};", x.name));
    }
  }

  static bool is_rc(SymKind k) { return k == SymKind::RowState || k == SymKind::ColState; }

  /// Row and column states as this element's row and column hold them (never stored by
  /// element code: the end of the step writes them, once per row and column).
  void emit_rc_loads(Writer& loads) const {
    for (int s : rule_.row_states) {
      loads.line(fmt::format("  float v_{} = X.rs[{} * X.nrows + X.row];", rule_.symbols[s].name,
                             rule_.symbols[s].index));
    }
    for (int s : rule_.col_states) {
      loads.line(fmt::format("  float v_{} = X.cs[{} * X.ncols + X.col];", rule_.symbols[s].name,
                             rule_.symbols[s].index));
    }
  }

  /// The function around the three parts.
  std::string wrap_pass(const PassShape& p, const Writer& loads, const Writer& body,
                        const Writer& stores) {
    Writer w;
    // Factored rules: the element's row and column (fo_rcx), and row/column sums.
    const char* rc = factored_ ? "_rc" : "";
    const char* x = factored_ ? ", const fo_rcx& X" : "";
    if (p.update) {
      w.line(fmt::format(
          "FO_FN void fo_element{}(const fo_tensor& t, long long i, const fo_uniform& U, "
          "const fo_tvals& T{}) {{",
          rc, x));
    } else {
      w.line("template <>");
      w.line(
          fmt::format("FO_FN void fo_reduce_element{}<{}>(const fo_tensor& t, long long i, "
                      "const fo_uniform& U, const fo_tvals& T{}, float* fo_a, int fo_stride, "
                      "bool fo_check{}) {{",
                      rc, p.pass, x, factored_ ? ", double* fo_rr, double* fo_cr" : ""));
    }
    w.line("  (void)T;");
    if (factored_) w.line("  (void)X;");
    if (!p.update) w.line("  (void)fo_a; (void)fo_stride; (void)fo_check;");
    if (!p.update && factored_) w.line("  (void)fo_rr; (void)fo_cr;");
    w.append(loads);
    w.append(body);
    w.append(stores);
    w.line("}");
    return w.str();
  }

 public:
  /// fo_init_element: state initial values (and the master from the param).
  std::string init_function() {
    em_.def_override_.clear();
    em_.orig_override_.clear();
    Writer in;
    for (int s : rule_.states) {
      const lang::Symbol& sym = rule_.symbols[s];
      if (!sym.init) throw InternalError("state '" + sym.name + "' has no initial value");
      std::string value = em_.element(*sym.init);
      in.line_directive(sym.loc.line, file_);
      in.line(fmt::format("  fo_store(t.r{}, i, {});", 2 + sym.index, value));
    }
    const lang::Symbol& param = rule_.symbols.at(rule_.param);
    Writer w;
    w.line("FO_FN void fo_init_element(const fo_tensor& t, long long i, const fo_uniform& U) {");
    if (dtypes_.master)
      w.line(fmt::format("  fo_store(t.r{}, i, fo_load(t.r0, i));", s_.master_role));
    w.line(fmt::format("  const float v_{} = fo_load(t.r{}, i);", param.name, s_.value_role));
    w.line(fmt::format("  (void)v_{};", param.name));
    w.append(in);
    w.restore_line();
    w.line("}");
    return w.str();
  }

 private:
  const Rule& rule_;
  const DTypeBinding& dtypes_;
  const Schedule& s_;
  ExprEmitter em_;
  std::string file_;
  std::map<int, int> last_def_;
  std::vector<int> acc_;
  std::vector<int> pass_acc_count_;
  int check_acc_ = -1;
  bool factored_ = false;

 public:
  /// Whether reduction `r` is summed in the pass's accumulator lanes (per-tensor and global
  /// totals); row_mean, col_mean and matrix_mean have their own sums.
  static bool lanes(const lang::Reduction& r) {
    return r.scope == lang::Scope::Tensor || r.scope == lang::Scope::Global;
  }
  bool factored() const { return factored_; }
};

}  // namespace

namespace {

/// The roles of `rule` for `dtypes` in pointer order: names for reports, declarations for
/// fo_tensor; the Store strategy's scratch tensors are described in body.scratch.
void lay_out_roles(const Rule& rule, const DTypeBinding& dtypes, const Schedule& schedule,
                   KernelBody& body, std::vector<std::string>& role_names,
                   std::vector<RoleDecl>& decls) {
  const lang::Symbol& param = rule.symbols.at(rule.param);
  // With clipping the gradient symbol is the internal fo_grad_raw: reports say "grad".
  const std::string& grad_name = rule.symbols.at(rule.grad).name;
  role_names = {param.name, grad_name.rfind("fo_", 0) == 0 ? "grad" : grad_name};
  decls = {{storage_type(dtypes.param), param.written}, {storage_type(dtypes.grad), false}};
  for (int s : rule.states) {
    role_names.push_back(rule.symbols[s].name);
    decls.push_back({storage_type(dtypes.state), true});
  }
  for (int s : rule.outputs) {
    role_names.push_back(rule.symbols[s].name);
    decls.push_back({storage_type(dtypes.state), true});
  }
  if (dtypes.master) {
    role_names.push_back(param.name + "_master");
    decls.push_back({"float", true});
  }
  for (const Crossing& c : schedule.crossings) {
    role_names.push_back(fmt::format("scratch_{}", c.name));
    decls.push_back({"float", true});
    body.scratch.push_back(
        c.def >= 0 ? fmt::format("'{}' as assigned at line {}", c.name, rule.stmts[c.def].loc.line)
                   : fmt::format("'{}' before the step", c.name));
  }
}

/// What the runtime and reports need to know: counts, the schedule, bytes and the slots.
void describe(const Rule& rule, const Schedule& schedule, const BodyEmitter& be,
              const std::vector<std::string>& role_names, std::size_t num_roles, KernelBody& body) {
  body.num_roles = static_cast<int>(num_roles);
  body.num_hypers = static_cast<int>(rule.hypers.size());
  body.num_uniforms = be.em().num_slots();
  body.roles = role_names;
  for (int h : rule.hypers) body.hypers.push_back(rule.symbols[h].name);
  body.reduction_passes = rule.reduction_passes;
  body.num_tensor_slots = std::max(rule.num_tensor_reductions, 1);
  body.num_global_slots = rule.num_global_reductions + 1;
  body.num_scalars = static_cast<int>(rule.scalars.size());
  body.num_tvals = std::max(be.em().tval_count(), 1);
  body.strategy = schedule.strategy;
  body.store_pass = schedule.store_pass;
  body.bytes_recompute = schedule.bytes_recompute;
  body.bytes_store = schedule.bytes_store;
  body.role_bytes = schedule.role_bytes;
  for (const PassPlan& p : schedule.passes) {
    body.pass_reads.emplace_back(p.reads.begin(), p.reads.end());
    body.pass_writes.emplace_back(p.writes.begin(), p.writes.end());
  }
  body.factored = be.factored();
  body.num_row_states = static_cast<int>(rule.row_states.size());
  body.num_col_states = static_cast<int>(rule.col_states.size());
  body.num_row_slots = rule.num_row_reductions;
  body.num_col_slots = rule.num_col_reductions;
  body.num_matrix_slots = rule.num_matrix_reductions;
  for (std::size_t r = 0; r < rule.reductions.size(); ++r) {
    const lang::Reduction& red = rule.reductions[r];
    if (!BodyEmitter::lanes(red)) continue;  // not a total the runtime or a hook combines
    ReductionSlot slot;
    slot.name = red.name;
    slot.scope = red.scope;
    slot.slot = red.slot;
    slot.pass = red.pass;
    slot.max = red.kind == lang::ReduceKind::MaxAbs || red.kind == lang::ReduceKind::AnyNonFinite;
    slot.line = red.loc.line;
    body.slots.push_back(slot);
  }
  if (be.check_acc() >= 0) {
    ReductionSlot check;
    check.name = "grad_check";
    check.scope = lang::Scope::Global;
    check.slot = rule.num_global_reductions;
    check.pass = 0;
    check.max = true;
    body.slots.push_back(check);
  }
  for (int c : be.pass_acc_count()) body.max_acc = std::max(body.max_acc, c);
}

/// fo_acc_count, fo_acc_max and fo_acc_slot: which accumulator of which pass feeds which
/// total, and how it combines.
Writer accumulator_tables(const Rule& rule, const KernelBody& body, const BodyEmitter& be) {
  Writer meta;
  meta.line("FO_FN int fo_acc_count(int pass) {");
  for (std::size_t k = 0; k < be.pass_acc_count().size() && rule.reduction_passes > 0; ++k) {
    meta.line(fmt::format("  if (pass == {}) return {};", k, be.pass_acc_count()[k]));
  }
  meta.line("  (void)pass;");
  meta.line("  return 0;");
  meta.line("}");
  auto acc_table = [&](const char* fn, auto value) {
    meta.line(fmt::format("FO_FN int {}(int pass, int j) {{", fn));
    std::size_t k = 0;  // body.slots holds the lane reductions, in rule order
    for (std::size_t r = 0; r < rule.reductions.size(); ++r) {
      if (!BodyEmitter::lanes(rule.reductions[r])) continue;
      meta.line(fmt::format("  if (pass == {} && j == {}) return {};", rule.reductions[r].pass,
                            be.acc_of(static_cast<int>(r)), value(body.slots[k++])));
    }
    if (be.check_acc() >= 0) {
      meta.line(fmt::format("  if (pass == 0 && j == {}) return {};", be.check_acc(),
                            value(body.slots.back())));
    }
    meta.line("  (void)pass; (void)j;");
    meta.line("  return 0;");
    meta.line("}");
  };
  acc_table("fo_acc_max", [](const ReductionSlot& s) { return s.max ? 1 : 0; });
  acc_table("fo_acc_slot", [](const ReductionSlot& s) {
    return s.scope == lang::Scope::Tensor ? s.slot : -1 - s.slot;
  });

  return meta;
}

}  // namespace

KernelBody generate_body(const Rule& rule, const DTypeBinding& dtypes, Strategy strategy) {
  // Factored rules recompute: their reduction passes then write nothing, so the CUDA
  // kernel may read an element twice (once for its row's sums, once for its column's).
  if (rule.factored()) strategy = Strategy::Recompute;
  const Schedule schedule = plan_schedule(rule, dtypes, strategy);
  KernelBody body;
  body.kind = "rule";
  body.name = rule.name;
  const std::string file = line_file_name(rule.file);

  std::vector<std::string> role_names;
  std::vector<RoleDecl> decls;
  lay_out_roles(rule, dtypes, schedule, body, role_names, decls);

  BodyEmitter be(rule, dtypes, schedule);
  std::vector<std::string> passes;
  for (int k = 0; k <= rule.reduction_passes; ++k) passes.push_back(be.pass_function(k));
  const std::string init = be.init_function();
  const std::string rc_fns = be.rc_functions();
  const std::string tensor_fns = be.tensor_functions();

  describe(rule, schedule, be, role_names, decls.size(), body);

  Writer w;
  w.line(
      fmt::format("// Generated by fusedopt from rule '{}' (dtypes {}, {} reduction pass{}, {}).",
                  sanitize_comment(rule.name), dtypes.str(), rule.reduction_passes,
                  rule.reduction_passes == 1 ? "" : "es", to_string(schedule.strategy)));
  emit_common_prologue(w, body);

  w.append(accumulator_tables(rule, body, be));

  emit_tensor_binding(w, decls);
  std::vector<std::string> globals;
  for (const lang::Reduction& r : rule.reductions) {
    if (r.scope == lang::Scope::Global) {
      // fo_g<slot>: the double that uniform values in fo_prepare compute from.
      globals.push_back(fmt::format("const double fo_g{0} = {1}; U.g[{0}] = (float)fo_g{0};",
                                    r.slot, finish_value_d(r.kind, fmt::format("G[{}]", r.slot))));
    }
  }
  emit_prepare(w, body, globals, be.em().prepare_lines(), file);
  w.append_text(tensor_fns);
  w.line("template <int kPass>");
  if (body.factored) {
    w.line(
        "FO_FN void fo_reduce_element_rc(const fo_tensor&, long long, const fo_uniform&, "
        "const fo_tvals&, const fo_rcx&, float*, int, bool, double*, double*) {}");
  } else {
    w.line(
        "FO_FN void fo_reduce_element(const fo_tensor&, long long, const fo_uniform&, "
        "const fo_tvals&, float*, int, bool) {}");
  }
  for (const std::string& p : passes) w.line(p);
  w.append_text(rc_fns);
  emit_grad_finite(w);
  w.line(init);

  // The hoisted slots are known only now: declare fo_uniform ahead of everything.
  body.code = uniform_struct(body) + w.str();
  body.code += staging_macros(body.code, rule.reduction_passes);
  return body;
}

}  // namespace fusedopt::codegen
