// ExprEmitter (expr_emitter.hpp): the text of each node in the element, uniform (fo_prepare)
// and per-tensor (fo_tensor_values) contexts, and the hoisting of uniform and per-tensor
// subexpressions into slots.
#include "codegen/expr_emitter.hpp"

#include <fmt/format.h>

#include "fusedopt/error.hpp"
#include "lang/names.hpp"

namespace fusedopt::codegen {
namespace {

// Both from the language's tables (lang/names): a new function or operator is one row there.
const char* function_name(lang::Op op) {
  const lang::FunctionInfo* fn = lang::function_of(op);
  return fn != nullptr ? fn->emit : nullptr;
}

const char* binary_operator(lang::Op op) {
  const lang::OperatorInfo* o = lang::operator_of(op);
  return o != nullptr ? o->cxx : nullptr;
}

}  // namespace

std::string ExprEmitter::tensor_value(const lang::Expr& e) {
  const bool outer = in_tensor_;
  in_tensor_ = true;
  std::string text = node(e, true);
  in_tensor_ = outer;
  return text;
}

int ExprEmitter::slot_for(const std::string& text, lang::Loc loc) {
  auto it = slot_by_text_.find(text);
  if (it != slot_by_text_.end()) return it->second;
  int slot = static_cast<int>(prepare_.size());
  prepare_.push_back({loc.line, fmt::format("const double fo_d{0} = {1}; U.u[{0}] = {2}fo_d{0};",
                                            slot, text, narrow())});
  slot_by_text_.emplace(text, slot);
  return slot;
}

int ExprEmitter::hoist(const lang::Expr& e) {
  const bool outer = in_prepare_;
  in_prepare_ = true;
  const std::string text = node(e, true);
  in_prepare_ = outer;
  return slot_for(text, e.loc);
}

std::string ExprEmitter::slot_ref(int slot) const {
  return in_prepare_ ? fmt::format("fo_d{}", slot) : fmt::format("U.u[{}]", slot);
}

bool ExprEmitter::reads_scalar(const lang::Expr& e) {
  if (e.op == lang::Op::Ref) {
    const lang::Symbol& s = rule_.symbols.at(e.sym);
    if (s.kind == lang::SymKind::Scalar || s.kind == lang::SymKind::Info) return true;
    if (s.kind == lang::SymKind::Temp && e.def >= 0) {
      auto it = temp_reads_scalar_.find(e.def);
      if (it != temp_reads_scalar_.end()) return it->second;
      const bool r = reads_scalar(*rule_.stmts.at(e.def).value);
      temp_reads_scalar_[e.def] = r;
      return r;
    }
    return false;
  }
  if (e.op == lang::Op::Reduce || e.op == lang::Op::Orthogonalize) return false;
  for (const lang::ExprPtr& a : e.args) {
    if (reads_scalar(*a)) return true;
  }
  return false;
}

bool ExprEmitter::per_tensor_hoist(const lang::Expr& e) {
  return !in_prepare_ && !in_tensor_ && e.level == lang::Level::Tensor && !trivial(e) &&
         reads_scalar(e);
}

std::string ExprEmitter::tensor_slot_ref(const lang::Expr& e) {
  const std::string text = tensor_value(e);
  auto it = tval_by_text_.find(text);
  if (it == tval_by_text_.end()) {
    it = tval_by_text_.emplace(text, next_tval_++).first;
    hoisted_.emplace_back(it->second, text);
  }
  return fmt::format("T.v[{}]", it->second);
}

std::string ExprEmitter::ref(const lang::Expr& e, bool uniform_ctx) {
  const lang::Symbol& s = rule_.symbols.at(e.sym);
  if (in_tensor_) {
    switch (s.kind) {
      case lang::SymKind::Hyper:
        return fmt::format("h[{}]", s.index);
      case lang::SymKind::Step:
        return "step";
      case lang::SymKind::Info:
        return fmt::format("I[{}]", s.index);
      case lang::SymKind::Scalar:
        return e.def >= 0 ? fmt::format("fo_s{}", e.def) : fmt::format("fo_so{}", s.index);
      case lang::SymKind::Temp:
        return fmt::format("fo_t{}", e.def);
      default:
        throw InternalError("tensor '" + s.name + "' in a per-tensor expression");
    }
  }
  if (s.kind == lang::SymKind::Info) {
    if (uniform_ctx || in_prepare_) throw InternalError("per-tensor value in a uniform expression");
    return tensor_slot_ref(e);  // read from fo_tvals, computed per tensor
  }
  if (s.kind == lang::SymKind::Scalar) {
    if (uniform_ctx) throw InternalError("scalar state in a uniform expression");
    const auto& slots = e.def >= 0 ? scalar_def_ : scalar_orig_;
    return fmt::format("T.v[{}]", slots.at(e.def >= 0 ? e.def : e.sym));
  }
  if (!uniform_ctx) {
    if (e.def >= 0) {
      if (auto it = def_override_.find(e.def); it != def_override_.end()) return it->second;
    } else if (auto it = orig_override_.find(e.sym); it != orig_override_.end()) {
      return it->second;
    }
  }
  switch (s.kind) {
    case lang::SymKind::Hyper:
      return in_prepare_ ? fmt::format("h[{}]", s.index) : fmt::format("U.h[{}]", s.index);
    case lang::SymKind::Step:
      return in_prepare_ ? "step" : "U.step";
    case lang::SymKind::Temp: {
      auto it = temp_slot_.find(e.def);
      if (it != temp_slot_.end()) return slot_ref(it->second);
      if (uniform_ctx) throw InternalError("non-uniform temporary in a uniform expression");
      return "v_" + s.name;
    }
    default:
      if (uniform_ctx) throw InternalError("tensor in a uniform expression");
      return "v_" + s.name;
  }
}

bool ExprEmitter::rc_hoisted(const lang::Expr& e) const {
  if (!rc_hoist_ || in_prepare_ || in_tensor_ || e.uniform || trivial(e)) return false;
  return e.level == lang::Level::Tensor || e.level == lang::Level::Matrix ||
         e.level == lang::Level::Row || e.level == lang::Level::Col;
}

std::string ExprEmitter::rc_value_ref(const lang::Expr& e) {
  const bool col = e.level == lang::Level::Col;
  rc_hoist_ = false;
  std::string text = node(e, false);
  rc_hoist_ = true;
  auto key = std::make_tuple(col, cur_stmt_, text);
  auto it = rc_by_key_.find(key);
  if (it == rc_by_key_.end()) {
    RcValue v;
    v.col = col;
    v.slot = rc_count_[col ? 1 : 0]++;
    v.stmt = cur_stmt_;
    v.text = std::move(text);
    rc_values_.push_back(std::move(v));
    it = rc_by_key_.emplace(std::move(key), rc_values_.size() - 1).first;
  }
  RcValue& v = rc_values_[it->second];
  v.passes.insert(cur_pass_);
  return col ? fmt::format("X.cv[{} * X.cvs + (fo_col - X.cv0)]", v.slot)
             : fmt::format("X.rv[{}]", v.slot);
}

std::string ExprEmitter::emit(const lang::Expr& e) {
  if (in_tensor_) return node(e, true);
  if (e.uniform && !trivial(e)) return slot_ref(hoist(e));
  if (per_tensor_hoist(e)) return tensor_slot_ref(e);
  if (rc_hoisted(e)) return rc_value_ref(e);
  return node(e, e.uniform);
}

std::string ExprEmitter::cond(const lang::Expr& e) {
  if (!in_tensor_ && (per_tensor_hoist(e) || (e.uniform && !trivial(e)))) {
    return fmt::format("({} != 0.0f)", emit(e));
  }
  return cond_node(e);
}

std::string ExprEmitter::cond_node(const lang::Expr& e) {
  switch (e.op) {
    case lang::Op::Lt:
    case lang::Op::Le:
    case lang::Op::Gt:
    case lang::Op::Ge:
    case lang::Op::Eq:
    case lang::Op::Ne:
      return fmt::format("({} {} {})", emit(*e.args[0]), binary_operator(e.op), emit(*e.args[1]));
    // Bitwise on bools: no short-circuit branches, so the loop still vectorises.
    case lang::Op::And:
      return fmt::format("({} & {})", cond(*e.args[0]), cond(*e.args[1]));
    case lang::Op::Or:
      return fmt::format("({} | {})", cond(*e.args[0]), cond(*e.args[1]));
    case lang::Op::Not:
      return fmt::format("(!{})", cond(*e.args[0]));
    case lang::Op::IsFinite:
      return fmt::format("fo_isfinite({})", emit(*e.args[0]));
    default:
      return fmt::format("({} != 0.0f)", node(e, e.uniform));
  }
}

std::string ExprEmitter::node(const lang::Expr& e, bool uniform_ctx) {
  // A boolean operator (not a where or a reference that merely holds a truth value).
  const bool in_double = in_prepare_ || in_tensor_ || f64_;
  if (e.boolean && e.op != lang::Op::Where && !trivial(e))
    return fmt::format(in_double ? "fo_bool_d({})" : "fo_bool({})", cond_node(e));
  switch (e.op) {
    case lang::Op::Number:
      return in_double ? double_literal(e.number) : float_literal(e.number);
    case lang::Op::Ref:
      return ref(e, uniform_ctx);
    case lang::Op::Neg:
      return fmt::format("(-{})", emit(*e.args[0]));
    case lang::Op::Pow: {
      const lang::Expr& exponent = *e.args[1];
      if (exponent.op == lang::Op::Number && exponent.number == 2.0) {
        return fmt::format("fo_sq({})", emit(*e.args[0]));
      }
      if (exponent.op == lang::Op::Number && exponent.number == 1.0) return emit(*e.args[0]);
      return fmt::format("fo_pow({}, {})", emit(*e.args[0]), emit(exponent));
    }
    case lang::Op::Where:
      // Element code on a uniform condition: fo_usel (a bit blend on the host), which g++
      // vectorises where a ?: on a loop-invariant truth value nested in a select stays
      // scalar (sgd's and rmsprop's loops were). The same value either way.
      if (!in_double && !uniform_ctx && e.args[0]->uniform) {
        return fmt::format("fo_usel({}, {}, {})", cond(*e.args[0]), emit(*e.args[1]),
                           emit(*e.args[2]));
      }
      return fmt::format("({} ? {} : {})", cond(*e.args[0]), emit(*e.args[1]), emit(*e.args[2]));
    case lang::Op::Rand:
      // Word 1 of the element's random numbers (word 0 rounds a stochastic param store).
      // (In double for an fp64 binding: fo_min(double, float) would be ambiguous.)
      return fmt::format("{}fo_unit(fo_element_rand(U.seed, U.rstep, t.pid, t.e0 + i).x[1])",
                         f64_ ? "(double)" : "");
    case lang::Op::Orthogonalize:  // the stage's result, in its scratch tensor
      return fmt::format("fo_load(t.r{}, i)", stage_roles_.at(static_cast<std::size_t>(e.stage)));
    case lang::Op::Reduce: {
      const lang::Reduction& r = rule_.reductions.at(e.reduction);
      // Row, column and matrix means: this element's row's, column's and matrix's.
      if (r.scope == lang::Scope::Row) {
        return rc_locals_ ? fmt::format("fo_rmean{}", r.slot)
                          : fmt::format("(float)X.rt[X.row * FO_NUM_ROW_SLOTS + {}]", r.slot);
      }
      if (r.scope == lang::Scope::Col) {
        return rc_locals_ ? fmt::format("fo_cmean{}", r.slot)
                          : fmt::format("(float)X.ct[fo_col * FO_NUM_COL_SLOTS + {}]", r.slot);
      }
      if (r.scope == lang::Scope::Matrix) {
        return rc_locals_ ? fmt::format("fo_mmean{}", r.slot)
                          : fmt::format("(float)X.mt[X.mat * FO_NUM_MATRIX_SLOTS + {}]", r.slot);
      }
      if (in_tensor_) return reduce_text_.at(e.reduction);
      if (r.scope == lang::Scope::Global) {
        return fmt::format(in_prepare_ ? "fo_g{}" : "U.g[{}]", r.slot);
      }
      if (uniform_ctx) throw InternalError("per-tensor reduction in a uniform expression");
      return fmt::format("T.v[{}]", r.slot);
    }
    default:
      break;
  }
  if (const char* op = binary_operator(e.op)) {
    return fmt::format("({} {} {})", emit(*e.args[0]), op, emit(*e.args[1]));
  }
  if (const char* fn = function_name(e.op)) {
    std::string out = fmt::format("{}(", fn);
    for (std::size_t i = 0; i < e.args.size(); ++i) out += (i ? ", " : "") + emit(*e.args[i]);
    return out + ")";
  }
  throw InternalError(
      fmt::format("codegen has no emitter for operator {}", static_cast<int>(e.op)));
}

}  // namespace fusedopt::codegen
