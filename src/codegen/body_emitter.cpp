// BodyEmitter's layout of one rule (the accumulator of each reduction in its pass, the
// fo_tvals slots of per-tensor values) and fo_init_element; the reduction texts the passes
// share.
#include "codegen/body_emitter.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "fusedopt/error.hpp"

namespace fusedopt::codegen {

using lang::SymKind;

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

std::string finish_value(lang::ReduceKind kind, const std::string& raw) {
  return fmt::format("(float){}", finish_value_d(kind, raw));
}

BodyEmitter::BodyEmitter(const lang::Rule& rule, const DTypeBinding& dtypes,
                         const Schedule& schedule)
    : rule_(rule),
      dtypes_(dtypes),
      s_(schedule),
      em_(rule, dtypes.param == DType::F64),
      file_(rule_file_label(rule.file)) {
  em_.stage_roles_ = schedule.stage_roles;
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

std::string BodyEmitter::init_function() {
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
  w.line(
      fmt::format("  const {} v_{} = fo_load(t.r{}, i);", em_.real(), param.name, s_.value_role));
  w.line(fmt::format("  (void)v_{};", param.name));
  w.append(in);
  w.restore_line();
  w.line("}");
  return w.str();
}

}  // namespace fusedopt::codegen
