// Assembles whole translation units (prelude + ABI + body + skeleton) and generates the
// body around a trusted functor.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <set>
#include <utility>

#include "codegen/codegen.hpp"
#include "codegen/writer.hpp"
#include "embedded.hpp"
#include "fusedopt/error.hpp"
#include "support/check.hpp"

namespace fusedopt::codegen {

void Writer::line_directive(int line_no, const std::string& file) {
  line(fmt::format("#line {} \"{}\"", std::max(line_no, 1), file));
}

std::string line_file_name(const std::string& file) {
  std::string out;
  for (char c : file) {
    bool ok =
        std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '/' || c == '-';
    out += ok ? c : '_';
  }
  return out.empty() ? std::string("rule") : out;
}

std::string float_literal(double value) {
  float f = static_cast<float>(value);
  if (std::isinf(f)) return f > 0 ? "fo_inf()" : "(-fo_inf())";
  if (std::isnan(f)) return "(fo_inf() - fo_inf())";
  std::string s = fmt::format("{:.9g}", f);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  s += 'f';
  return s[0] == '-' ? "(" + s + ")" : s;
}

std::string double_literal(double value) {
  if (std::isinf(value)) return value > 0 ? "fo_inf_d()" : "(-fo_inf_d())";
  if (std::isnan(value)) return "(fo_inf_d() - fo_inf_d())";
  std::string s = fmt::format("{}", value);  // shortest text that reads back exactly
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s[0] == '-' ? "(" + s + ")" : s;
}

std::string sanitize_comment(const std::string& text) {
  std::string out;
  for (char c : text) {
    bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == ' ' || c == '.' || c == '_' ||
              c == '-' || c == ':' || c == '+' || c == '/';
    out += ok ? c : '_';
  }
  return out;
}

void emit_common_prologue(Writer& w, const KernelBody& body) {
  w.line("#define FO_GENERATED 1");
  w.line(fmt::format("#define FO_NUM_ROLES {}", body.num_roles));
  w.line(fmt::format("#define FO_NUM_HYPERS {}", body.num_hypers));
  w.line(fmt::format("#define FO_REDUCTION_PASSES {}", body.reduction_passes));
  // The kernels' pass dispatch: exactly the rule's reduction passes, from the same count
  // the runtime launches (fo_reduce_run is the skeleton's).
  std::string cases;
  for (int k = 0; k < body.reduction_passes; ++k) {
    cases += fmt::format(" case {0}: fo_reduce_run<{0}>(L); break;", k);
  }
  w.line("#define FO_REDUCE_DISPATCH(L, pass) switch (pass) {" + cases + " default: break; }");
  // CUDA: one kernel per reduction pass (fusedopt_reduce_<k>), so one pass's register use
  // does not limit another's occupancy.
  std::string kernels = "#define FO_REDUCE_KERNELS(X)";
  for (int k = 0; k < body.reduction_passes; ++k) kernels += fmt::format(" X({})", k);
  w.line(kernels);
  w.line(fmt::format("#define FO_NUM_TENSOR_SLOTS {}", body.num_tensor_slots));
  w.line(fmt::format("#define FO_NUM_GLOBAL_SLOTS {}", body.num_global_slots));
  w.line(fmt::format("#define FO_MAX_ACC {}", body.max_acc));
  w.line(fmt::format("#define FO_NUM_SCALARS {}", body.num_scalars));
  w.line(fmt::format("#define FO_FACTORED {}", body.factored ? 1 : 0));
  w.line(fmt::format("#define FO_NUM_ROW_STATES {}", body.num_row_states));
  w.line(fmt::format("#define FO_NUM_COL_STATES {}", body.num_col_states));
  w.line(fmt::format("#define FO_NUM_ROW_SLOTS {}", std::max(body.num_row_slots, 1)));
  w.line(fmt::format("#define FO_NUM_COL_SLOTS {}", std::max(body.num_col_slots, 1)));
  w.line(fmt::format("#define FO_NUM_MATRIX_SLOTS {}", std::max(body.num_matrix_slots, 1)));
}

std::string uniform_struct(const KernelBody& body) {
  return fmt::format(
      "struct fo_uniform {{\n  float h[{}];\n  float step;\n  float inv_grad_scale;\n"
      "  float g[{}];\n  float u[{}];\n}};\n"
      "struct fo_tvals {{\n  float v[{}];\n}};\n"
      "// A row's and a column's values (factored rules): states [k * nrows + row], [k * ncols\n"
      "// + col]; row, column and matrix means [index * slots + slot].\n"
      "struct fo_rcx {{\n  const float* rs;\n  const float* cs;\n  const double* rt;\n"
      "  const double* ct;\n  const double* mt;\n  long long nrows, ncols, row, col, mat;\n}};\n",
      std::max(body.num_hypers, 1), std::max(body.num_global_slots, 1),
      std::max(body.num_uniforms, 1), std::max(body.num_tvals, 1));
}

const char* storage_type(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "float";
    case DType::F16:
      return "fo_f16";
    case DType::BF16:
      return "fo_bf16";
    case DType::F64:
      break;  // not a tensor role's dtype (DTypeBinding::parse refuses it)
  }
  return "float";
}

void emit_tensor_binding(Writer& w, const std::vector<RoleDecl>& roles) {
  w.line("struct fo_tensor {");
  for (std::size_t r = 0; r < roles.size(); ++r) {
    w.line(fmt::format("  {}{}* FO_RESTRICT r{};", roles[r].writable ? "" : "const ", roles[r].type,
                       r));
  }
  w.line("};");
  w.line("FO_FN fo_tensor fo_bind(void* const* p) {");
  w.line("  fo_tensor t;");
  for (std::size_t r = 0; r < roles.size(); ++r) {
    w.line(fmt::format("  t.r{} = ({}{}*)p[{}];", r, roles[r].writable ? "" : "const ",
                       roles[r].type, r));
  }
  w.line("  return t;");
  w.line("}");
}

void emit_prepare(Writer& w, const KernelBody& body, const std::vector<std::string>& globals,
                  const std::vector<PrepareLine>& lines, const std::string& file) {
  w.line(
      "FO_FN fo_uniform fo_prepare(const double* FO_RESTRICT h, double step, "
      "float inv_grad_scale, const double* FO_RESTRICT G) {");
  w.line("  fo_uniform U;");
  w.line("  (void)h;");
  w.line("  (void)G;");
  for (int k = 0; k < body.num_hypers; ++k) w.line(fmt::format("  U.h[{}] = (float)h[{}];", k, k));
  if (body.num_hypers == 0) w.line("  U.h[0] = 0.0f;");
  w.line("  U.step = (float)step;");
  w.line("  U.inv_grad_scale = inv_grad_scale;");
  for (int k = 0; k < body.num_global_slots; ++k) w.line(fmt::format("  U.g[{}] = 0.0f;", k));
  for (const std::string& g : globals) w.line("  " + g);
  if (lines.empty()) w.line("  U.u[0] = 0.0f;");
  for (const PrepareLine& l : lines) {
    w.line_directive(l.rule_line, file);
    w.line("  " + l.text);
  }
  if (!lines.empty()) w.restore_line();
  w.line("  return U;");
  w.line("}");
}

void emit_grad_finite(Writer& w) {
  w.line("FO_FN bool fo_grad_finite(const fo_tensor& t, long long i, const fo_uniform& U) {");
  w.line("  return fo_isfinite(fo_load(t.r1, i) * U.inv_grad_scale);");
  w.line("}");
}

namespace {

/// The roles `fn` (one generated function's text) loads and stores, from its fo_load(t.rK
/// and fo_store(t.rK calls.
void scan_roles(const std::string& fn, std::set<int>& loads, std::set<int>& stores) {
  for (const auto& [call, out] :
       {std::pair<const char*, std::set<int>*>{"fo_load(t.r", &loads},
        std::pair<const char*, std::set<int>*>{"fo_store(t.r", &stores}}) {
    const std::string needle = call;
    for (std::size_t at = fn.find(needle); at != std::string::npos; at = fn.find(needle, at + 1)) {
      out->insert(std::atoi(fn.c_str() + at + needle.size()));
    }
  }
}

/// `#define NAME_STAGE(LOAD, DECL)`: LOAD(k) for each role `fn` loads, DECL(k) for each it
/// only stores; `#define NAME_STORES(STORE)`: STORE(k) for each it stores.
void emit_staging(Writer& w, const std::string& name, const std::string& code,
                  const std::string& signature) {
  const std::size_t begin = code.find(signature);
  if (begin == std::string::npos) throw InternalError("codegen: no " + signature);
  const std::size_t end = code.find("\n}\n", begin);
  std::set<int> loads, stores;
  scan_roles(code.substr(begin, end - begin), loads, stores);
  std::string stage = fmt::format("#define {}_STAGE(LOAD, DECL)", name);
  std::string store = fmt::format("#define {}_STORES(STORE)", name);
  for (int r : loads) stage += fmt::format(" LOAD({})", r);
  for (int r : stores) {
    if (!loads.count(r)) stage += fmt::format(" DECL({})", r);
    store += fmt::format(" STORE({})", r);
  }
  w.line(stage);
  w.line(store);
}

}  // namespace

std::string staging_macros(const std::string& code, int reduction_passes) {
  Writer w;
  w.line("// The roles each vector-path function loads and stores, read from its code above:");
  w.line("// a pass moves exactly these.");
  // Factored rules name them fo_element_rc / fo_reduce_element_rc.
  const std::string rc = code.find("FO_FN void fo_element_rc(") != std::string::npos ? "_rc" : "";
  emit_staging(w, "FO_UPDATE", code, "FO_FN void fo_element" + rc + "(");
  emit_staging(w, "FO_INIT", code, "FO_FN void fo_init_element(");
  for (int k = 0; k < reduction_passes; ++k) {
    emit_staging(w, fmt::format("FO_REDUCE{}", k), code,
                 fmt::format("FO_FN void fo_reduce_element{}<{}>(", rc, k));
  }
  return w.str();
}

std::string source_file_name(const KernelBody& body, const Target& target) {
  return "fusedopt_" + line_file_name(body.name) + (target.cuda_source() ? ".cu" : ".cpp");
}

std::string generate_source(const KernelBody& body, const Target& target) {
  std::string skeleton(
      embedded_file(target.cuda_source() ? "kernels/cuda_kernel.cuh" : "kernels/host_kernel.hpp"));
  // The skeleton's "#ifndef FO_GENERATED" block only serves compiling it on its own.
  const std::string standalone = "#ifndef FO_GENERATED\n";
  if (std::size_t a = skeleton.find(standalone); a != std::string::npos) {
    std::size_t b = skeleton.find("#endif\n", a);
    if (b == std::string::npos)
      throw InternalError("kernel skeleton: unterminated FO_GENERATED block");
    skeleton.erase(a, b + 7 - a);
  }
  std::string text;
  text += "// fusedopt kernel '" + sanitize_comment(body.name) + "' for " + target.str() + "\n";
  text += "#define FO_GENERATED 1\n";
  text += embedded_file("kernels/prelude.h");
  text += embedded_file("kernels/abi.h");
  text += body.code;
  text += embedded_file("kernels/factored.h");
  text += skeleton;
  // Resolve the restore markers now that absolute line numbers are known.
  const std::string file = source_file_name(body, target);
  std::string out;
  out.reserve(text.size() + 256);
  int line_no = 1;
  std::size_t pos = 0;
  const std::string marker = kRestoreLineMarker;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view ln(text.data() + pos, end - pos);
    if (ln == marker) {
      out += fmt::format("#line {} \"{}\"", line_no + 1, file);
    } else {
      out.append(ln);
    }
    out += '\n';
    ++line_no;
    pos = end + 1;
  }
  return out;
}

namespace {

bool valid_identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

}  // namespace

KernelBody generate_functor_body(const TrustedFunctor& functor, const DTypeBinding& dtypes) {
  for (const auto& [name, value] : functor.hypers) {
    if (!valid_identifier(name) || name == "step") {
      throw UsageError(
          fmt::format("trusted functor '{}': hyper name '{}' is not a C++ identifier "
                      "(or is the reserved 'step')",
                      functor.name, name));
    }
  }
  if (functor.code.empty()) throw UsageError("trusted functor '" + functor.name + "' has no code");
  KernelBody body;
  body.kind = "trusted-functor";
  body.name = functor.name;
  body.num_hypers = static_cast<int>(functor.hypers.size());
  body.num_uniforms = 0;
  const int nstates = static_cast<int>(functor.states.size());
  body.roles.push_back("p");
  body.roles.push_back("g");
  for (const auto& s : functor.states) body.roles.push_back(s.first);
  const int master_role = dtypes.master ? 2 + nstates : -1;
  if (dtypes.master) body.roles.push_back("p_master");
  body.num_roles = static_cast<int>(body.roles.size());
  const int value_role = dtypes.master ? master_role : 0;
  for (const auto& h : functor.hypers) body.hypers.push_back(h.first);

  Writer w;
  w.line("// TRUSTED FUNCTOR: the code below was handed over as C++ and compiled as written.");
  emit_common_prologue(w, body);
  w.line("struct fo_hypers {");
  for (const auto& h : functor.hypers) w.line(fmt::format("  float {};", h.first));
  w.line("  float step;");
  w.line("};");
  w.line("namespace fo_user {");
  w.line_directive(1, line_file_name(functor.name));
  w.line(functor.code);
  w.restore_line();
  w.line("}  // namespace fo_user");
  std::vector<RoleDecl> roles = {{storage_type(dtypes.param), true},
                                 {storage_type(dtypes.grad), false}};
  for (int s = 0; s < nstates; ++s) roles.push_back({storage_type(dtypes.state), true});
  if (dtypes.master) roles.push_back({"float", true});
  emit_tensor_binding(w, roles);
  emit_prepare(w, body, {}, {}, "");
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
  w.line(
      "FO_FN void fo_element(const fo_tensor& t, long long i, const fo_uniform& U, const "
      "fo_tvals&) {");
  w.line("  fo_hypers h;");
  for (int k = 0; k < body.num_hypers; ++k) {
    w.line(fmt::format("  h.{} = U.h[{}];", functor.hypers[k].first, k));
  }
  w.line("  h.step = U.step;");
  w.line(fmt::format("  float p = fo_load(t.r{}, i);", value_role));
  w.line("  const float g = fo_load(t.r1, i) * U.inv_grad_scale;");
  std::string args = "p";
  for (int s = 0; s < nstates; ++s) {
    w.line(fmt::format("  float s{0} = fo_load(t.r{1}, i);", s, 2 + s));
    args += fmt::format(", s{}", s);
  }
  w.line(fmt::format("  fo_user::Functor()({}, g, h);", args));
  w.line(fmt::format("  fo_store(t.r{}, i, p);", value_role));
  if (dtypes.master) w.line("  fo_store(t.r0, i, p);");
  for (int s = 0; s < nstates; ++s) w.line(fmt::format("  fo_store(t.r{0}, i, s{1});", 2 + s, s));
  w.line("}");
  emit_grad_finite(w);
  w.line("FO_FN void fo_init_element(const fo_tensor& t, long long i, const fo_uniform& U) {");
  w.line("  (void)U;");
  if (dtypes.master) w.line(fmt::format("  fo_store(t.r{}, i, fo_load(t.r0, i));", master_role));
  for (int s = 0; s < nstates; ++s) {
    w.line(
        fmt::format("  fo_store(t.r{}, i, {});", 2 + s, float_literal(functor.states[s].second)));
  }
  w.line("}");
  body.code = uniform_struct(body) + w.str();
  body.code += staging_macros(body.code, 0);
  return body;
}

}  // namespace fusedopt::codegen
