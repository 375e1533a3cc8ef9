// The body around a trusted functor: C++ handed over by the caller, compiled as written,
// with the same ABI as a rule's body (no reductions, no hoisted values).
#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "codegen/body_parts.hpp"
#include "codegen/codegen.hpp"
#include "codegen/writer.hpp"
#include "fusedopt/error.hpp"

namespace fusedopt::codegen {

namespace {

bool valid_identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

/// Refuses hyper names that are not C++ identifiers (or are the reserved 'step') and a
/// functor without code.
void check_functor(const TrustedFunctor& functor) {
  for (const auto& [name, value] : functor.hypers) {
    if (!valid_identifier(name) || name == "step") {
      throw UsageError(
          fmt::format("trusted functor '{}': hyper name '{}' is not a C++ identifier "
                      "(or is the reserved 'step')",
                      functor.name, name));
    }
  }
  if (functor.code.empty()) throw UsageError("trusted functor '" + functor.name + "' has no code");
}

/// Where a functor's tensors are: p, g, the states (from role 2), then the fp32 master.
struct FunctorRoles {
  int nstates = 0;
  int master_role = -1;  ///< -1: no master
  int value_role = 0;    ///< where p's fp32 value lives: the master, else the param
};

FunctorRoles functor_roles(const TrustedFunctor& functor, const DTypeBinding& dtypes) {
  FunctorRoles r;
  r.nstates = static_cast<int>(functor.states.size());
  r.master_role = dtypes.master ? 2 + r.nstates : -1;
  r.value_role = dtypes.master ? r.master_role : 0;
  return r;
}

/// fo_hypers (the functor's view of the hypers and step) and the functor's code, as
/// written, in namespace fo_user under a #line naming the functor.
void emit_user_code(Writer& w, const TrustedFunctor& functor) {
  w.line("struct fo_hypers {");
  for (const auto& h : functor.hypers) w.line(fmt::format("  float {};", h.first));
  w.line("  float step;");
  w.line("};");
  w.line("namespace fo_user {");
  w.line_directive(1, line_file_name(functor.name));
  w.line(functor.code);
  w.restore_line();
  w.line("}  // namespace fo_user");
}

/// What a body without reductions or per-tensor values defines: empty accumulator tables,
/// fo_tensor_values, fo_scalar_init and the fo_reduce_element template.
void emit_no_reductions(Writer& w) {
  w.line("FO_FN int fo_acc_count(int) { return 0; }");
  w.line("FO_FN int fo_acc_max(int, int) { return 0; }");
  w.line("FO_FN int fo_acc_slot(int, int) { return 0; }");
  w.line(
      "FO_FN void fo_tensor_values(const double*, const double*, const double*, double, "
      "const double*, const double*, fo_tvals& T, double*) { T.v[0] = 0.0f; }");
  w.line("FO_FN void fo_scalar_init(const double*, double*) {}");
  w.line("template <int kPass>");
  w.line(
      "FO_FN void fo_reduce_element(const fo_tensor&, long long, const fo_uniform&, "
      "const fo_tvals&, float*, int, bool) {}");
}

/// fo_element: loads p, g and the states, calls the functor, stores p (and the master)
/// and the states.
void emit_functor_element(Writer& w, const TrustedFunctor& functor, const FunctorRoles& roles,
                          bool master) {
  w.line(
      "FO_FN void fo_element(const fo_tensor& t, long long i, const fo_uniform& U, const "
      "fo_tvals&) {");
  w.line("  fo_hypers h;");
  for (std::size_t k = 0; k < functor.hypers.size(); ++k) {
    w.line(fmt::format("  h.{} = U.h[{}];", functor.hypers[k].first, k));
  }
  w.line("  h.step = U.step;");
  w.line(fmt::format("  float p = fo_load(t.r{}, i);", roles.value_role));
  w.line("  const float g = fo_load(t.r1, i) * U.inv_grad_scale;");
  std::string args = "p";
  for (int s = 0; s < roles.nstates; ++s) {
    w.line(fmt::format("  float s{0} = fo_load(t.r{1}, i);", s, 2 + s));
    args += fmt::format(", s{}", s);
  }
  w.line(fmt::format("  fo_user::Functor()({}, g, h);", args));
  w.line(fmt::format("  fo_store(t.r{}, i, p);", roles.value_role));
  if (master) w.line("  fo_store(t.r0, i, p);");
  for (int s = 0; s < roles.nstates; ++s) {
    w.line(fmt::format("  fo_store(t.r{0}, i, s{1});", 2 + s, s));
  }
  w.line("}");
}

/// fo_init_element: the master from the param, the states' initial values.
void emit_functor_init(Writer& w, const TrustedFunctor& functor, const FunctorRoles& roles,
                       bool master) {
  w.line("FO_FN void fo_init_element(const fo_tensor& t, long long i, const fo_uniform& U) {");
  w.line("  (void)U;");
  if (master) w.line(fmt::format("  fo_store(t.r{}, i, fo_load(t.r0, i));", roles.master_role));
  for (int s = 0; s < roles.nstates; ++s) {
    w.line(
        fmt::format("  fo_store(t.r{}, i, {});", 2 + s, float_literal(functor.states[s].second)));
  }
  w.line("}");
}

}  // namespace

KernelBody generate_functor_body(const TrustedFunctor& functor, const DTypeBinding& dtypes) {
  check_functor(functor);
  if (dtypes.param == DType::F64) {
    throw UsageError(fmt::format(
        "trusted functor '{}': fp64 params (dtypes {}) are not bound to trusted functors "
        "(their Functor takes float&)",
        functor.name, dtypes.str()));
  }
  const FunctorRoles roles = functor_roles(functor, dtypes);
  KernelBody body;
  body.kind = "trusted-functor";
  body.name = functor.name;
  body.num_hypers = static_cast<int>(functor.hypers.size());
  body.num_uniforms = 0;
  body.roles.push_back("p");
  body.roles.push_back("g");
  for (const auto& s : functor.states) body.roles.push_back(s.first);
  if (dtypes.master) body.roles.push_back("p_master");
  body.num_roles = static_cast<int>(body.roles.size());
  for (const auto& h : functor.hypers) body.hypers.push_back(h.first);

  Writer w;
  w.line("// TRUSTED FUNCTOR: the code below was handed over as C++ and compiled as written.");
  emit_common_prologue(w, body);
  emit_user_code(w, functor);
  std::vector<RoleDecl> decls = {{storage_type(dtypes.param), true},
                                 {storage_type(dtypes.grad), false}};
  for (int s = 0; s < roles.nstates; ++s) decls.push_back({storage_type(dtypes.state), true});
  if (dtypes.master) decls.push_back({"float", true});
  emit_tensor_binding(w, decls);
  emit_prepare(w, body, {}, {}, "");
  emit_no_reductions(w);
  emit_functor_element(w, functor, roles, dtypes.master);
  emit_grad_finite(w);
  emit_functor_init(w, functor, roles, dtypes.master);
  body.code = uniform_struct(body) + w.str();
  body.code += staging_macros(body.code, 0);
  return body;
}

}  // namespace fusedopt::codegen
