// Rule -> per-element C++ body. Uniform subexpressions (hypers, step and constants only)
// are hoisted into fo_prepare, which runs once per launch and group (per block on the
// GPU), and identical ones share a slot.
#include "codegen/codegen.hpp"

#include <fmt/format.h>

#include <map>

#include "codegen/writer.hpp"
#include "fusedopt/error.hpp"

namespace fusedopt::codegen {
namespace {

using lang::Expr;
using lang::Op;
using lang::Rule;
using lang::SymKind;

const char* function_name(Op op) {
  switch (op) {
    case Op::Sqrt: return "fo_sqrt";
    case Op::Rsqrt: return "fo_rsqrt";
    case Op::Exp: return "fo_exp";
    case Op::Log: return "fo_log";
    case Op::Abs: return "fo_abs";
    case Op::Sign: return "fo_sign";
    case Op::Min: return "fo_min";
    case Op::Max: return "fo_max";
    case Op::Clamp: return "fo_clamp";
    case Op::PowFn: return "fo_pow";
    case Op::Tanh: return "fo_tanh";
    case Op::Log1p: return "fo_log1p";
    case Op::Expm1: return "fo_expm1";
    case Op::Floor: return "fo_floor";
    default: return nullptr;
  }
}

const char* binary_operator(Op op) {
  switch (op) {
    case Op::Add: return "+";
    case Op::Sub: return "-";
    case Op::Mul: return "*";
    case Op::Div: return "/";
    case Op::Lt: return "<";
    case Op::Le: return "<=";
    case Op::Gt: return ">";
    case Op::Ge: return ">=";
    case Op::Eq: return "==";
    case Op::Ne: return "!=";
    default: return nullptr;
  }
}

/// Emits the expressions of one rule. Two contexts: "uniform" (inside fo_prepare, where
/// only hypers, step and hoisted values exist) and "element" (inside fo_element).
class ExprEmitter {
 public:
  explicit ExprEmitter(const Rule& rule) : rule_(rule) {}

  /// Element-context text of `e`; every non-trivial uniform subtree becomes U.u[k].
  std::string element(const Expr& e) { return emit(e); }
  /// Records that statement `stmt` (a uniform temporary) lives in a slot.
  void define_uniform_temp(int stmt, const Expr& value) {
    temp_slot_[stmt] = slot_for(node(value, true), value.loc);
  }

  /// Lines for fo_prepare, in dependency order.
  const std::vector<PrepareLine>& prepare_lines() const { return prepare_; }
  int num_slots() const { return static_cast<int>(prepare_.size()); }

 private:
  // Every non-trivial uniform node gets a slot, keyed by its text (whose children are
  // already slots): identical uniform subexpressions anywhere in the rule are computed once.
  int slot_for(const std::string& text, lang::Loc loc) {
    auto it = slot_by_text_.find(text);
    if (it != slot_by_text_.end()) return it->second;
    int slot = static_cast<int>(prepare_.size());
    prepare_.push_back({loc.line, fmt::format("U.u[{}] = {};", slot, text)});
    slot_by_text_.emplace(text, slot);
    return slot;
  }

  static bool trivial(const Expr& e) { return e.op == Op::Number || e.op == Op::Ref; }

  std::string ref(const Expr& e, bool uniform_ctx) {
    const lang::Symbol& s = rule_.symbols.at(e.sym);
    switch (s.kind) {
      case SymKind::Hyper: return fmt::format("U.h[{}]", s.index);
      case SymKind::Step: return "U.step";
      case SymKind::Temp: {
        auto it = temp_slot_.find(e.def);
        if (it != temp_slot_.end()) return fmt::format("U.u[{}]", it->second);
        if (uniform_ctx) throw InternalError("non-uniform temporary in a uniform expression");
        return "v_" + s.name;
      }
      default:
        if (uniform_ctx) throw InternalError("tensor in a uniform expression");
        return "v_" + s.name;
    }
  }

  /// The text of `e` as a value: a slot if it is uniform, else the node itself.
  std::string emit(const Expr& e) {
    if (e.uniform && !trivial(e)) return fmt::format("U.u[{}]", slot_for(node(e, true), e.loc));
    return node(e, e.uniform);
  }

  /// The text of `e` as a truth value.
  std::string cond(const Expr& e) {
    if (e.uniform && !trivial(e)) return fmt::format("({} != 0.0f)", emit(e));
    return cond_node(e);
  }

  /// The truth value of `e`'s own operator over its (emitted) operands.
  std::string cond_node(const Expr& e) {
    switch (e.op) {
      case Op::Lt:
      case Op::Le:
      case Op::Gt:
      case Op::Ge:
      case Op::Eq:
      case Op::Ne:
        return fmt::format("({} {} {})", emit(*e.args[0]), binary_operator(e.op), emit(*e.args[1]));
      // Bitwise on bools: no short-circuit branches, so the loop still vectorises.
      case Op::And: return fmt::format("({} & {})", cond(*e.args[0]), cond(*e.args[1]));
      case Op::Or: return fmt::format("({} | {})", cond(*e.args[0]), cond(*e.args[1]));
      case Op::Not: return fmt::format("(!{})", cond(*e.args[0]));
      case Op::IsFinite: return fmt::format("fo_isfinite({})", emit(*e.args[0]));
      default: return fmt::format("({} != 0.0f)", node(e, e.uniform));
    }
  }

  /// The operator of `e` applied to its (emitted) operands.
  std::string node(const Expr& e, bool uniform_ctx) {
    // A boolean operator (not a where or a reference that merely holds a truth value).
    if (e.boolean && e.op != Op::Where && !trivial(e)) return fmt::format("fo_bool({})", cond_node(e));
    switch (e.op) {
      case Op::Number: return float_literal(e.number);
      case Op::Ref: return ref(e, uniform_ctx);
      case Op::Neg: return fmt::format("(-{})", emit(*e.args[0]));
      case Op::Pow: {
        const Expr& exponent = *e.args[1];
        if (exponent.op == Op::Number && exponent.number == 2.0) {
          return fmt::format("fo_sq({})", emit(*e.args[0]));
        }
        if (exponent.op == Op::Number && exponent.number == 1.0) return emit(*e.args[0]);
        return fmt::format("fo_pow({}, {})", emit(*e.args[0]), emit(exponent));
      }
      case Op::Where:
        return fmt::format("({} ? {} : {})", cond(*e.args[0]), emit(*e.args[1]), emit(*e.args[2]));
      default: break;
    }
    if (const char* op = binary_operator(e.op)) {
      return fmt::format("({} {} {})", emit(*e.args[0]), op, emit(*e.args[1]));
    }
    if (const char* fn = function_name(e.op)) {
      std::string out = fmt::format("{}(", fn);
      for (std::size_t i = 0; i < e.args.size(); ++i) out += (i ? ", " : "") + emit(*e.args[i]);
      return out + ")";
    }
    throw InternalError(fmt::format("codegen has no emitter for operator {}", static_cast<int>(e.op)));
  }

  const Rule& rule_;
  std::map<int, int> temp_slot_;
  std::map<std::string, int> slot_by_text_;
  std::vector<PrepareLine> prepare_;
};

struct Role {
  std::string name;
  RoleDecl decl;
};

}  // namespace

KernelBody generate_body(const Rule& rule, const DTypeBinding& dtypes) {
  if (rule.phases.size() != 1) {
    throw InternalError("codegen handles single-phase rules only");
  }
  KernelBody body;
  body.kind = "rule";
  body.name = rule.name;
  std::string file = line_file_name(rule.file);

  // Roles in pointer order; remember which role index each tensor symbol loads from.
  const lang::Symbol& param = rule.symbols.at(rule.param);
  std::vector<Role> roles;
  roles.push_back({param.name, {storage_type(dtypes.param), param.written}});
  roles.push_back({rule.symbols.at(rule.grad).name, {storage_type(dtypes.grad), false}});
  for (int s : rule.states) roles.push_back({rule.symbols[s].name, {storage_type(dtypes.state), true}});
  for (int s : rule.outputs) roles.push_back({rule.symbols[s].name, {storage_type(dtypes.state), true}});
  const int master_role = dtypes.master ? static_cast<int>(roles.size()) : -1;
  if (dtypes.master) roles.push_back({param.name + "_master", {"float", true}});
  const int value_role = dtypes.master ? master_role : 0;  // where the param's fp32 value lives

  ExprEmitter em(rule);
  Writer el;  // fo_element
  for (std::size_t i = 0; i < rule.stmts.size(); ++i) {
    const lang::Stmt& st = rule.stmts[i];
    const lang::Symbol& target = rule.symbols.at(st.target);
    if (target.kind == SymKind::Temp && st.value->uniform) {
      em.define_uniform_temp(static_cast<int>(i), *st.value);
      continue;
    }
    std::string value = em.element(*st.value);
    el.line_directive(st.loc.line, file);
    el.line(fmt::format("  v_{} = {};", target.name, value));
  }

  Writer in;  // fo_init_element: state initial values
  for (int s : rule.states) {
    const lang::Symbol& sym = rule.symbols[s];
    if (!sym.init) throw InternalError("state '" + sym.name + "' has no initial value");
    std::string value = em.element(*sym.init);
    in.line_directive(sym.loc.line, file);
    in.line(fmt::format("  fo_store(t.r{}, i, {});", 2 + sym.index, value));
  }

  body.num_roles = static_cast<int>(roles.size());
  body.num_hypers = static_cast<int>(rule.hypers.size());
  body.num_uniforms = em.num_slots();
  for (const Role& r : roles) body.roles.push_back(r.name);
  for (int h : rule.hypers) body.hypers.push_back(rule.symbols[h].name);

  Writer w;
  w.line(fmt::format("// Generated by fusedopt from rule '{}' (dtypes {}).", sanitize_comment(rule.name),
                     dtypes.str()));
  emit_common_prologue(w, body);
  std::vector<RoleDecl> decls;
  for (const Role& r : roles) decls.push_back(r.decl);
  emit_tensor_binding(w, decls);
  emit_prepare(w, body, em.prepare_lines(), file);

  // Loads: every tensor the rule reads, as fp32 locals with the user's names prefixed.
  w.line("FO_FN void fo_element(const fo_tensor& t, long long i, const fo_uniform& U) {");
  w.line(fmt::format("  float v_{} = fo_load(t.r{}, i);", param.name, value_role));
  w.line(fmt::format("  const float v_{} = fo_load(t.r1, i) * U.inv_grad_scale;",
                     rule.symbols[rule.grad].name));
  for (int s : rule.states) {
    w.line(fmt::format("  float v_{} = fo_load(t.r{}, i);", rule.symbols[s].name,
                       2 + rule.symbols[s].index));
  }
  for (int s : rule.outputs) w.line(fmt::format("  float v_{} = 0.0f;", rule.symbols[s].name));
  for (std::size_t s = 0; s < rule.symbols.size(); ++s) {
    const lang::Symbol& sym = rule.symbols[s];
    if (sym.kind == SymKind::Temp) w.line(fmt::format("  float v_{} = 0.0f;", sym.name));
  }
  w.append(el);
  w.restore_line();
  if (param.written) {
    w.line(fmt::format("  fo_store(t.r{}, i, v_{});", value_role, param.name));
    if (dtypes.master) w.line(fmt::format("  fo_store(t.r0, i, v_{});", param.name));
  }
  for (int s : rule.states) {
    w.line(fmt::format("  fo_store(t.r{}, i, v_{});", 2 + rule.symbols[s].index, rule.symbols[s].name));
  }
  for (int s : rule.outputs) {
    w.line(fmt::format("  fo_store(t.r{}, i, v_{});", 2 + rule.states.size() + rule.symbols[s].index,
                       rule.symbols[s].name));
  }
  // Touch every temporary so unused ones draw no warnings.
  for (const lang::Symbol& sym : rule.symbols) {
    if (sym.kind == SymKind::Temp) w.line(fmt::format("  (void)v_{};", sym.name));
  }
  w.line("}");

  emit_grad_finite(w);
  w.line("FO_FN void fo_init_element(const fo_tensor& t, long long i, const fo_uniform& U) {");
  if (dtypes.master) {
    w.line(fmt::format("  fo_store(t.r{}, i, fo_load(t.r0, i));", master_role));
  }
  w.line(fmt::format("  const float v_{} = fo_load(t.r{}, i);", param.name, value_role));
  w.line(fmt::format("  (void)v_{};", param.name));
  w.append(in);
  w.restore_line();
  w.line("}");

  // The hoisted slots are known only now: declare fo_uniform ahead of everything.
  body.code = uniform_struct(body) + w.str();
  return body;
}

}  // namespace fusedopt::codegen
