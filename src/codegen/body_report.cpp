// The kernel-body report (body_report.hpp): role names and declarations in pointer order,
// and the counts, schedule, bytes and reduction slots of a KernelBody.
#include "codegen/body_report.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace fusedopt::codegen {

using lang::Rule;

void lay_out_roles(const Rule& rule, const DTypeBinding& dtypes, const Schedule& schedule,
                   KernelBody& body, std::vector<std::string>& role_names,
                   std::vector<RoleDecl>& decls) {
  const lang::Symbol& param = rule.symbols.at(rule.param);
  // With clipping the gradient symbol is the internal fo_grad_raw: reports say "grad".
  const std::string& grad_name = rule.symbols.at(rule.grad).name;
  role_names = {param.name, grad_name.rfind("fo_", 0) == 0 ? "grad" : grad_name};
  decls = {{storage_type(dtypes.param), param.written}, {storage_type(dtypes.grad), false}};
  for (std::size_t k = 0; k < rule.states.size(); ++k) {
    role_names.push_back(rule.symbols[static_cast<std::size_t>(rule.states[k])].name);
    // A quantized state's element code sees fp32 (the skeleton's dequantized values).
    const bool quantized = k < dtypes.quant.size() && dtypes.quant[k] != Quant::None;
    decls.push_back({quantized ? "float" : storage_type(dtypes.state), true});
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
  for (std::size_t j = 0; j < rule.stages.size(); ++j) {
    const lang::MatrixStage& st = rule.stages[j];
    role_names.push_back(fmt::format("stage_{}", j));
    decls.push_back({"float", true});
    body.scratch.push_back(fmt::format("orthogonalize() at line {}", st.loc.line));
    MatrixStageLayout m;
    m.pass = st.pass;
    m.role = schedule.stage_roles.at(j);
    m.line = st.loc.line;
    m.steps = st.steps;
    m.coefficients = st.coefficients;
    m.eps = st.eps;
    body.stages.push_back(std::move(m));
  }
}

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
  body.bits_recompute = schedule.bits_recompute;
  body.bits_store = schedule.bits_store;
  body.role_bits = schedule.role_bits;
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

}  // namespace fusedopt::codegen
