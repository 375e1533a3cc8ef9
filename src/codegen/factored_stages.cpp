// The row and column stages of factored rules (rules with `row`/`col` states or row_mean,
// col_mean, matrix_mean): which pass computes each row, column and matrix slot,
// fo_row_stage / fo_col_stage and fo_rc_init.
#include <fmt/format.h>

#include <algorithm>

#include "codegen/body_emitter.hpp"

namespace fusedopt::codegen {

using lang::SymKind;

namespace {

/// `FO_FN int fn(int s)`: value(r) of each reduction r of `scope`, by slot; -1 for others.
template <typename Value>
void slot_table(Writer& w, const lang::Rule& rule, const char* fn, lang::Scope scope, Value value) {
  w.line(fmt::format("FO_FN int {}(int s) {{", fn));
  for (const lang::Reduction& r : rule.reductions) {
    if (r.scope == scope) w.line(fmt::format("  if (s == {}) return {};", r.slot, value(r)));
  }
  w.line("  (void)s;");
  w.line("  return -1;");
  w.line("}");
}

}  // namespace

std::string BodyEmitter::rc_functions() {
  Writer w;
  if (!factored_) return "";
  auto pass_of = [](const lang::Reduction& r) { return r.pass; };
  slot_table(w, rule_, "fo_row_slot_pass", lang::Scope::Row, pass_of);
  slot_table(w, rule_, "fo_col_slot_pass", lang::Scope::Col, pass_of);
  slot_table(w, rule_, "fo_matrix_slot_pass", lang::Scope::Matrix, pass_of);
  slot_table(w, rule_, "fo_matrix_slot_col", lang::Scope::Matrix,
             [](const lang::Reduction& r) { return r.arg->level == lang::Level::Col ? 1 : 0; });
  em_.def_override_.clear();
  em_.orig_override_.clear();
  for (const bool row : {true, false}) emit_rc_stage(w, row);
  emit_rc_init(w);
  w.line(fmt::format("#define FO_NUM_ROWV {}", std::max(em_.num_rc_values(false), 1)));
  w.line(fmt::format("#define FO_NUM_COLV {}", std::max(em_.num_rc_values(true), 1)));
  for (const bool col : {false, true}) emit_rc_values(w, col);
  return w.str();
}

void BodyEmitter::emit_rc_values(Writer& w, bool col) {
  const char* fn = col ? "fo_col_values" : "fo_row_values";
  w.line("template <int kPass>");
  w.line(
      fmt::format("FO_FN void {}(const fo_rcx&, long long, const fo_uniform&, const fo_tvals&, "
                  "float*, long long) {{}}",
                  fn));
  em_.rc_locals_ = true;
  for (int pass = 0; pass <= rule_.reduction_passes; ++pass) {
    w.line("template <>");
    w.line(
        fmt::format("FO_FN void {}<{}>(const fo_rcx& X, long long fo_col, const fo_uniform& U, "
                    "const fo_tvals& T, float* fo_out, long long fo_os) {{",
                    fn, pass));
    w.line("  (void)X; (void)fo_col; (void)U; (void)T; (void)fo_out; (void)fo_os;");
    Writer loads;
    emit_rc_loads(loads);
    w.append(loads);
    for (const lang::Symbol& x : rule_.symbols) {
      if (x.kind == SymKind::Temp) w.line(fmt::format("  float v_{} = 0.0f;", x.name));
    }
    // The statements of this level in order (as fo_row_stage / fo_col_stage), each value
    // just before the statement it was found in.
    for (std::size_t i = 0; i < rule_.stmts.size(); ++i) {
      for (const ExprEmitter::RcValue& v : em_.rc_values()) {
        if (v.col == col && v.stmt == static_cast<int>(i) && v.passes.count(pass)) {
          w.line(fmt::format("  fo_out[{} * fo_os] = {};", v.slot, v.text));
        }
      }
      emit_stage_stmt(w, rule_.stmts[i], !col);
    }
    w.restore_line();
    for (const lang::Symbol& x : rule_.symbols) {
      if (x.kind == SymKind::Temp || is_rc(x.kind)) w.line(fmt::format("  (void)v_{};", x.name));
    }
    w.line("}");
  }
  em_.rc_locals_ = false;
}

void BodyEmitter::emit_stage_stmt(Writer& w, const lang::Stmt& st, bool row) {
  const SymKind k = rule_.symbols[st.target].kind;
  const lang::Level l = st.value->level;
  const bool temp = k == SymKind::Temp && !st.value->uniform &&
                    (l == lang::Level::Tensor || l == lang::Level::Matrix ||
                     l == (row ? lang::Level::Row : lang::Level::Col));
  if (k != (row ? SymKind::RowState : SymKind::ColState) && !temp) return;
  w.line_directive(st.loc.line, file_);
  w.line(fmt::format("  v_{} = {};", rule_.symbols[st.target].name, em_.element(*st.value)));
}

void BodyEmitter::emit_rc_stage(Writer& w, bool row) {
  const lang::Level level = row ? lang::Level::Row : lang::Level::Col;
  const std::vector<int>& states = row ? rule_.row_states : rule_.col_states;
  w.line(
      fmt::format("FO_FN void fo_{}_stage(const fo_rcx& X, const fo_uniform& U, const fo_tvals& T, "
                  "float* fo_out, double* fo_m) {{",
                  row ? "row" : "col"));
  w.line("  (void)X; (void)U; (void)T; (void)fo_out; (void)fo_m;");
  w.line("  const long long fo_col = X.col;  // the column, as element code names it");
  w.line("  (void)fo_col;");
  for (int s : states) {
    w.line(fmt::format("  float v_{} = X.{}s[{} * X.n{}s + X.{}];", rule_.symbols[s].name,
                       row ? "r" : "c", rule_.symbols[s].index, row ? "row" : "col",
                       row ? "row" : "col"));
  }
  for (const lang::Symbol& x : rule_.symbols) {
    if (x.kind == SymKind::Temp) w.line(fmt::format("  float v_{} = 0.0f;", x.name));
  }
  for (const lang::Stmt& st : rule_.stmts) emit_stage_stmt(w, st, row);
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

void BodyEmitter::emit_rc_init(Writer& w) {
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
}

}  // namespace fusedopt::codegen
