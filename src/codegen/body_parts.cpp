// The parts every kernel body has (body_parts.hpp): prologue defines, fo_uniform,
// fo_tensor and fo_bind, fo_prepare, fo_grad_finite, and the staging macros read back from
// the generated code.
#include "codegen/body_parts.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <utility>

#include "codegen/codegen.hpp"
#include "fusedopt/error.hpp"

namespace fusedopt::codegen {

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
  // An fp64 binding's element code reads its uniform and per-tensor values as doubles.
  const char* real = body.f64 ? "double" : "float";
  return fmt::format(
      "struct fo_uniform {{\n  {4} h[{0}];\n  {4} step;\n  float inv_grad_scale;\n"
      "  {4} g[{1}];\n  {4} u[{2}];\n"
      "  unsigned int rstep;        // the step, the random numbers' counter\n"
      "  unsigned long long seed;   // their key (fo_launch::seed)\n}};\n"
      "struct fo_tvals {{\n  {4} v[{3}];\n}};\n"
      "// A row's and a column's values (factored rules): states [k * nrows + row], [k * ncols\n"
      "// + col]; row, column and matrix means [index * slots + slot]; the element code's row\n"
      "// values rv[k] and column values cv[k * cvs + col - cv0] (fo_row_values,\n"
      "// fo_col_values); a reduction pass's column sums at slot * cvs too.\n"
      "struct fo_rcx {{\n  const float* rs;\n  const float* cs;\n  const double* rt;\n"
      "  const double* ct;\n  const double* mt;\n  long long nrows, ncols, row, col, mat;\n"
      "  const float* rv;\n  const float* cv;\n  long long cvs, cv0;\n}};\n",
      std::max(body.num_hypers, 1), std::max(body.num_global_slots, 1),
      std::max(body.num_uniforms, 1), std::max(body.num_tvals, 1), real);
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
      return "double";  // an fp64 binding's roles (f64.h loads and stores them)
    case DType::U8:
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
  // Which param element index i is (the random numbers' counter): i + e0 of param pid.
  w.line("  long long e0;");
  w.line("  unsigned int pid;");
  w.line("};");
  w.line("FO_FN fo_tensor fo_bind(void* const* p) {");
  w.line("  fo_tensor t;");
  w.line("  t.e0 = 0;");
  w.line("  t.pid = 0;");
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
  const char* narrow = body.f64 ? "" : "(float)";
  for (int k = 0; k < body.num_hypers; ++k)
    w.line(fmt::format("  U.h[{}] = {}h[{}];", k, narrow, k));
  if (body.num_hypers == 0) w.line("  U.h[0] = 0.0f;");
  w.line(fmt::format("  U.step = {}step;", narrow));
  w.line("  U.inv_grad_scale = inv_grad_scale;");
  w.line("  U.rstep = (unsigned int)step;");
  w.line("  U.seed = 0;  // the skeleton sets the launch's");
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
        std::pair<const char*, std::set<int>*>{"fo_store(t.r", &stores},
        std::pair<const char*, std::set<int>*>{"fo_store_sr(t.r", &stores}}) {
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

}  // namespace fusedopt::codegen
