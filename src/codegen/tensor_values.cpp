// fo_tensor_values and fo_scalar_init: the per-tensor values of one rule (reduction
// results, scalar states and assignments, per-tensor subexpressions hoisted out of element
// code), computed once per tensor in double, and the scalar states' initial values.
#include <fmt/format.h>

#include <map>

#include "codegen/body_emitter.hpp"

namespace fusedopt::codegen {

using lang::SymKind;

std::string BodyEmitter::tensor_functions() {
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
      w.line(fmt::format("  T.v[{}] = {}{};", r.slot, em_.narrow(),
                         finish_value_d(r.kind, fmt::format("R[{}]", r.slot))));
    }
  }
  int slot = rule_.num_tensor_reductions;
  for (int s : rule_.scalars) {
    const int k = rule_.symbols[s].index;
    w.line(fmt::format("  const double fo_so{0} = S[{0}]; T.v[{1}] = {2}fo_so{0};", k, slot++,
                       em_.narrow()));
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
      w.line(fmt::format("  const double fo_s{0} = {1}; T.v[{2}] = {3}fo_s{0};", i,
                         em_.tensor_value(*st.value), slot++, em_.narrow()));
      final_value[target.index] = fmt::format("fo_s{}", i);
    }
  }
  for (const auto& [k, text] : em_.tensor_hoisted()) {
    w.line(fmt::format("  T.v[{}] = {}({});", k, em_.narrow(), text));
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

}  // namespace fusedopt::codegen
