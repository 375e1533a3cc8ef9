// The element passes of one rule: fo_reduce_element<pass> for each reduction pass and
// fo_element for the update, each made of its loads, its statements (and accumulations) and
// its stores, as the schedule (schedule.hpp) says.
#include <fmt/format.h>

#include <set>

#include "codegen/body_emitter.hpp"

namespace fusedopt::codegen {

using lang::Expr;
using lang::Op;
using lang::SymKind;

std::string BodyEmitter::pass_function(int pass) {
  const PassShape p{
      pass,
      s_.passes.at(pass),
      pass == rule_.reduction_passes,
      pass == s_.store_pass,
      pass == rule_.reduction_passes && s_.store_pass >= 0,
      std::set<int>(s_.passes.at(pass).stmts.begin(), s_.passes.at(pass).stmts.end())};
  em_.def_override_.clear();
  em_.orig_override_.clear();
  em_.rc_locals_ = factored_;
  em_.rc_hoist_ = factored_;
  em_.cur_pass_ = pass;
  Writer loads, body, stores;
  emit_loads(p, loads);
  emit_statements(p, body);
  emit_stores(p, stores);
  em_.rc_locals_ = false;
  em_.rc_hoist_ = false;
  return wrap_pass(p, loads, body, stores);
}

void BodyEmitter::emit_loads(const PassShape& p, Writer& loads) {
  // The update of the Store strategy reads what crossed through scratch tensors.
  if (p.update_after_store) emit_scratch_loads(p, loads);
  const std::set<int> originals = originals_read(p);
  emit_rc_loads(loads);
  for (std::size_t sym = 0; sym < rule_.symbols.size(); ++sym) {
    const lang::Symbol& x = rule_.symbols[sym];
    if (!is_tensor(x.kind) && !(x.kind == SymKind::Temp)) continue;
    const int s = static_cast<int>(sym);
    if (x.kind == SymKind::Temp) {
      loads.line(fmt::format("  {} v_{} = 0.0f;", em_.real(), x.name));
    } else if (originals.count(s)) {
      const std::string scale = x.kind == SymKind::Grad ? " * U.inv_grad_scale" : "";
      loads.line(fmt::format("  {}{} v_{} = fo_load(t.r{}, i){};",
                             x.kind == SymKind::Grad ? "const " : "", em_.real(), x.name,
                             role_of(rule_, s_, s), scale));
    } else {
      loads.line(fmt::format("  {} v_{} = 0.0f;", em_.real(), x.name));
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

void BodyEmitter::emit_scratch_loads(const PassShape& p, Writer& loads) {
  for (std::size_t c = 0; c < s_.crossings.size(); ++c) {
    const Crossing& x = s_.crossings[c];
    const std::string local = fmt::format("fo_x{}", c);
    loads.line(fmt::format("  const {} {} = fo_load(t.r{}, i);", em_.real(), local,
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
    loads.line(fmt::format("  const {} {} = fo_load(t.r{}, i);", em_.real(), local, role));
    em_.def_override_[last_def_.at(sym)] = local;
  }
}

std::set<int> BodyEmitter::originals_read(const PassShape& p) const {
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
  for (const lang::MatrixStage& st : rule_.stages) {
    if (!p.update && st.pass == p.pass) scan(*st.arg);
  }
  if (p.store) {
    for (const Crossing& x : s_.crossings) {
      if (x.def < 0) originals.insert(x.sym);
    }
  }
  return originals;
}

void BodyEmitter::emit_statements(const PassShape& p, Writer& body) {
  for (std::size_t i = 0; i < rule_.stmts.size(); ++i) {
    const lang::Stmt& st = rule_.stmts[i];
    em_.cur_stmt_ = static_cast<int>(i);
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
          // A row's sums in lanes (fo_stride apart: the host's vectorised column loop), a
          // column's in its own partials (distinct per element of a row; slot k at
          // k * X.cvs, the stride of the chunk's per-column arrays: the host's are slot-major).
          body.line(fmt::format(
              "  fo_{}r[{} * {}] += (double)({});", r.scope == lang::Scope::Row ? "r" : "c", r.slot,
              r.scope == lang::Scope::Row ? "fo_stride" : "X.cvs", em_.element(*r.arg)));
        }
      }
      // A matrix stage of this pass: its argument into the stage's scratch tensor.
      std::vector<const Expr*> stages;
      collect_stages(*st.value, stages);
      for (const Expr* call : stages) {
        const lang::MatrixStage& m = rule_.stages[static_cast<std::size_t>(call->stage)];
        if (m.pass != p.pass) continue;
        body.line_directive(call->loc.line, file_);
        body.line(fmt::format("  fo_store(t.r{}, i, {});",
                              s_.stage_roles.at(static_cast<std::size_t>(call->stage)),
                              em_.element(*m.arg)));
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

void BodyEmitter::emit_stores(const PassShape& p, Writer& stores) {
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
    if (x.kind == SymKind::Param && dtypes_.stochastic) {
      // Stochastic rounding: the param's 16-bit store takes word 0 of its element's random
      // numbers (prelude.h: fo_element_rand).
      stores.line(fmt::format(
          "  fo_store_sr(t.r0, i, v_{}, fo_element_rand(U.seed, U.rstep, t.pid, t.e0 + i).x[0]);",
          x.name));
      continue;
    }
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

void BodyEmitter::emit_rc_loads(Writer& loads) const {
  for (int s : rule_.row_states) {
    loads.line(fmt::format("  float v_{} = X.rs[{} * X.nrows + X.row];", rule_.symbols[s].name,
                           rule_.symbols[s].index));
  }
  for (int s : rule_.col_states) {
    loads.line(fmt::format("  float v_{} = X.cs[{} * X.ncols + fo_col];", rule_.symbols[s].name,
                           rule_.symbols[s].index));
  }
  // The row, column and matrix means, loaded unconditionally (ExprEmitter::rc_locals_); a
  // slot a later pass fills reads what is there and goes unused.
  for (const lang::Reduction& r : rule_.reductions) {
    const char* what = r.scope == lang::Scope::Row      ? "rmean"
                       : r.scope == lang::Scope::Col    ? "cmean"
                       : r.scope == lang::Scope::Matrix ? "mmean"
                                                        : nullptr;
    if (!what) continue;
    const std::string at = r.scope == lang::Scope::Row   ? "X.rt[X.row * FO_NUM_ROW_SLOTS"
                           : r.scope == lang::Scope::Col ? "X.ct[fo_col * FO_NUM_COL_SLOTS"
                                                         : "X.mt[X.mat * FO_NUM_MATRIX_SLOTS";
    loads.line(fmt::format("  const float fo_{}{} = (float){} + {}];", what, r.slot, at, r.slot));
    loads.line(fmt::format("  (void)fo_{}{};", what, r.slot));
  }
}

std::string BodyEmitter::wrap_pass(const PassShape& p, const Writer& loads, const Writer& body,
                                   const Writer& stores) {
  Writer w;
  // Factored rules: the element's row (fo_rcx) and column (fo_col: apart from X, so that a
  // loop over a row's columns passes one X and vectorises), and row/column sums.
  const char* rc = factored_ ? "_rc" : "";
  const char* x = factored_ ? ", const fo_rcx& X, long long fo_col" : "";
  if (p.update) {
    w.line(
        fmt::format("FO_FN void fo_element{}(const fo_tensor& t, long long i, const fo_uniform& U, "
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
  if (factored_) w.line("  (void)X; (void)fo_col;");
  if (!p.update) w.line("  (void)fo_a; (void)fo_stride; (void)fo_check;");
  if (!p.update && factored_) w.line("  (void)fo_rr; (void)fo_cr;");
  w.append(loads);
  w.append(body);
  w.append(stores);
  w.line("}");
  return w.str();
}

}  // namespace fusedopt::codegen
