// plan_schedule: dependencies between statements, what each pass computes, and the
// recompute-or-store choice by bytes moved.
#include "codegen/schedule.hpp"

#include <algorithm>
#include <map>

#include "fusedopt/error.hpp"

namespace fusedopt::codegen {

using lang::Expr;
using lang::Op;
using lang::Rule;
using lang::SymKind;

void collect_reductions(const Expr& e, std::vector<const Expr*>& out) {
  for (const lang::ExprPtr& a : e.args) collect_reductions(*a, out);
  if (e.op == Op::Reduce) out.push_back(&e);
}

void collect_stages(const Expr& e, std::vector<const Expr*>& out) {
  for (const lang::ExprPtr& a : e.args) collect_stages(*a, out);
  if (e.op == Op::Orthogonalize) out.push_back(&e);
}

namespace {

bool is_tensor(SymKind k) {
  return k == SymKind::Param || k == SymKind::Grad || k == SymKind::State || k == SymKind::Output;
}

class Planner {
 public:
  Planner(const Rule& rule, const DTypeBinding& dtypes) : rule_(rule), dtypes_(dtypes) {
    const int num_states = static_cast<int>(rule.states.size());
    const int num_outputs = static_cast<int>(rule.outputs.size());
    s_.role_bits.push_back(8 * dtype_size(dtypes.param));
    s_.role_bits.push_back(8 * dtype_size(dtypes.grad));
    for (int i = 0; i < num_states + num_outputs; ++i) {
      // A quantized state moves its codes (8 or 4 bits) and an absmax per block, which
      // rounds away (32 bits per 128 to 512 elements).
      const Quant q = i < num_states && static_cast<std::size_t>(i) < dtypes.quant.size()
                          ? dtypes.quant[static_cast<std::size_t>(i)]
                          : Quant::None;
      s_.role_bits.push_back(q != Quant::None ? quant_bits(q) : 8 * dtype_size(dtypes.state));
    }
    if (dtypes.master) {
      s_.master_role = static_cast<int>(s_.role_bits.size());
      s_.role_bits.push_back(32);
    }
    s_.value_role = dtypes.master ? s_.master_role : 0;
    s_.first_scratch_role = static_cast<int>(s_.role_bits.size());
    element_.assign(rule.stmts.size(), false);
    for (std::size_t i = 0; i < rule.stmts.size(); ++i) {
      const lang::Stmt& st = rule.stmts[i];
      // Uniform temporaries live in fo_prepare, scalar states in fo_tensor_values.
      const SymKind k = rule.symbols[st.target].kind;
      element_[i] = !((k == SymKind::Temp && st.value->uniform) || k == SymKind::Scalar);
      if (is_tensor(rule.symbols[st.target].kind)) last_def_[st.target] = static_cast<int>(i);
    }
  }

  Schedule plan(Strategy wanted) {
    Schedule s = plan_passes(wanted);
    add_stages(s);
    return s;
  }

 private:
  // The matrix stages' scratch roles (the last roles): written by the stage's pass, read by
  // every pass whose statements evaluate the stage's result.
  void add_stages(Schedule& s) const {
    const int first = s.first_scratch_role + static_cast<int>(s.crossings.size());
    for (std::size_t j = 0; j < rule_.stages.size(); ++j) {
      const int role = first + static_cast<int>(j);
      s.stage_roles.push_back(role);
      s.role_bits.push_back(32);
      s.passes.at(static_cast<std::size_t>(rule_.stages[j].pass)).writes.insert(role);
    }
    for (PassPlan& p : s.passes) {
      for (int i : p.stmts) {
        visit_evaluated(*rule_.stmts[i].value, [&](const Expr& x) {
          if (x.op == Op::Orthogonalize) p.reads.insert(s.stage_roles[x.stage]);
        });
      }
    }
    // Each stage moves its scratch twice (written once, read once) under either strategy.
    const std::int64_t stage_bits = 64 * static_cast<std::int64_t>(rule_.stages.size());
    s.bits_recompute += stage_bits;
    s.bits_store += stage_bits;
  }

  Schedule plan_passes(Strategy wanted) {
    const int n = rule_.reduction_passes;
    std::vector<PassPlan> recompute;
    for (int k = 0; k < n; ++k) recompute.push_back(reduction_pass(k));
    recompute.push_back(update_pass_recompute());
    s_.bits_recompute = bits(recompute);
    s_.bits_store = s_.bits_recompute;
    if (n == 0) {
      s_.passes = std::move(recompute);
      s_.strategy = Strategy::Recompute;
      return s_;
    }
    Schedule store = s_;
    std::vector<PassPlan> stored(recompute.begin(), recompute.end() - 2);
    plan_store(store, stored, n - 1);
    s_.bits_store = bits(stored);
    const bool use_store = wanted == Strategy::Store ||
                           (wanted == Strategy::Auto && s_.bits_store < s_.bits_recompute);
    if (use_store) {
      store.bits_recompute = s_.bits_recompute;
      store.bits_store = s_.bits_store;
      store.strategy = Strategy::Store;
      store.store_pass = n - 1;
      store.passes = std::move(stored);
      return store;
    }
    s_.strategy = Strategy::Recompute;
    s_.passes = std::move(recompute);
    return s_;
  }

  int role(int sym) const { return role_of(rule_, s_, sym); }

  // The element statements `e` reads (their results) and the tensors it reads as they
  // were before the step (original values), without entering reduction arguments.
  void deps(const Expr& e, std::set<int>& stmts, std::set<int>& originals) const {
    visit_evaluated(e, [&](const Expr& x) {
      if (x.op != Op::Ref) return;
      const SymKind k = rule_.symbols[x.sym].kind;
      if (x.def >= 0) {
        if (element_[x.def]) stmts.insert(x.def);
      } else if (is_tensor(k)) {
        originals.insert(x.sym);
      }
    });
  }

  // Closes `stmts` over dependencies; collects the original tensors read.
  void close(std::set<int>& stmts, std::set<int>& originals) const {
    std::vector<int> work(stmts.begin(), stmts.end());
    while (!work.empty()) {
      const int i = work.back();
      work.pop_back();
      std::set<int> more;
      deps(*rule_.stmts[i].value, more, originals);
      for (int d : more) {
        if (stmts.insert(d).second) work.push_back(d);
      }
    }
  }

  void add_reduction_args(int pass, PassPlan& p, std::set<int>& stmts,
                          std::set<int>& originals) const {
    for (std::size_t r = 0; r < rule_.reductions.size(); ++r) {
      if (rule_.reductions[r].pass != pass) continue;
      p.reductions.push_back(static_cast<int>(r));
      deps(*rule_.reductions[r].arg, stmts, originals);
    }
    for (const lang::MatrixStage& st : rule_.stages) {
      if (st.pass == pass) deps(*st.arg, stmts, originals);
    }
  }

  PassPlan reduction_pass(int pass) const {
    PassPlan p;
    std::set<int> stmts, originals;
    add_reduction_args(pass, p, stmts, originals);
    close(stmts, originals);
    p.stmts.assign(stmts.begin(), stmts.end());
    for (int sym : originals) p.reads.insert(role(sym));
    return p;
  }

  void add_writes(PassPlan& p, int sym) const {
    p.writes.insert(role(sym));
    if (rule_.symbols[sym].kind == SymKind::Param && dtypes_.master) p.writes.insert(0);
  }

  PassPlan update_pass_recompute() const {
    PassPlan p;
    std::set<int> stmts, originals;
    for (std::size_t i = 0; i < rule_.stmts.size(); ++i) {
      if (element_[i]) stmts.insert(static_cast<int>(i));
    }
    close(stmts, originals);
    p.stmts.assign(stmts.begin(), stmts.end());
    for (int sym : originals) p.reads.insert(role(sym));
    for (const auto& [sym, def] : last_def_) add_writes(p, sym);
    return p;
  }

  void plan_store(Schedule& out, std::vector<PassPlan>& passes, int sp) const {
    auto early = [&](int i) { return rule_.stmts[i].phase <= sp; };
    std::set<int> early_final;  // tensor symbols whose last assignment is early
    for (const auto& [sym, def] : last_def_) {
      if (early(def)) early_final.insert(sym);
    }
    PassPlan update;
    std::map<std::pair<int, int>, int> crossing_index;
    std::set<int> late_originals;
    for (std::size_t i = 0; i < rule_.stmts.size(); ++i) {
      if (!element_[i] || early(static_cast<int>(i))) continue;
      update.stmts.push_back(static_cast<int>(i));
      visit_evaluated(*rule_.stmts[i].value, [&](const Expr& x) {
        if (x.op != Op::Ref) return;
        const SymKind k = rule_.symbols[x.sym].kind;
        if (x.def >= 0) {
          if (!element_[x.def] || !early(x.def)) return;
          // The final value of a tensor finished early, stored exactly (fp32): read it back.
          const int target = rule_.stmts[x.def].target;
          if (early_final.count(target) && last_def_.at(target) == x.def &&
              s_.role_bits[role(target)] == 32 &&
              (rule_.symbols[target].kind != SymKind::Param || dtypes_.master ||
               dtypes_.param == DType::F32)) {
            update.reads.insert(role(target));
            return;
          }
          crossing_index.emplace(std::make_pair(x.def, target), 0);
        } else if (is_tensor(k)) {
          if (early_final.count(x.sym)) {
            crossing_index.emplace(std::make_pair(-1, x.sym), 0);
          } else {
            update.reads.insert(role(x.sym));
          }
        }
      });
    }
    for (auto& [key, index] : crossing_index) {
      index = static_cast<int>(out.crossings.size());
      Crossing c;
      c.def = key.first;
      c.sym = key.second;
      c.name = rule_.symbols[c.sym].name;
      out.crossings.push_back(c);
      out.role_bits.push_back(32);
    }
    for (std::size_t c = 0; c < out.crossings.size(); ++c) {
      update.reads.insert(out.first_scratch_role + static_cast<int>(c));
    }
    for (const auto& [sym, def] : last_def_) {
      if (!early_final.count(sym)) add_writes(update, sym);
    }
    out.early_syms = early_final;

    PassPlan store;
    std::set<int> stmts, originals;
    add_reduction_args(sp, store, stmts, originals);
    for (std::size_t i = 0; i < rule_.stmts.size(); ++i) {
      if (element_[i] && early(static_cast<int>(i))) stmts.insert(static_cast<int>(i));
    }
    close(stmts, originals);
    for (const Crossing& c : out.crossings) {
      if (c.def < 0) originals.insert(c.sym);
    }
    store.stmts.assign(stmts.begin(), stmts.end());
    for (int sym : originals) store.reads.insert(role(sym));
    for (int sym : early_final) {
      store.writes.insert(role(sym));
      if (rule_.symbols[sym].kind == SymKind::Param && dtypes_.master) store.writes.insert(0);
    }
    for (std::size_t c = 0; c < out.crossings.size(); ++c) {
      store.writes.insert(out.first_scratch_role + static_cast<int>(c));
    }
    passes.push_back(std::move(store));
    passes.push_back(std::move(update));
  }

  std::int64_t bits(const std::vector<PassPlan>& passes) const {
    std::int64_t total = 0;
    for (const PassPlan& p : passes) {
      for (int r : p.reads)
        total += r < static_cast<int>(s_.role_bits.size()) ? s_.role_bits[r] : 32;
      for (int r : p.writes)
        total += r < static_cast<int>(s_.role_bits.size()) ? s_.role_bits[r] : 32;
    }
    return total;
  }

  const Rule& rule_;
  const DTypeBinding& dtypes_;
  Schedule s_;
  std::vector<bool> element_;
  std::map<int, int> last_def_;  // tensor symbol -> its last assigning statement
};

}  // namespace

int role_of(const Rule& rule, const Schedule& s, int sym) {
  const lang::Symbol& x = rule.symbols.at(sym);
  switch (x.kind) {
    case SymKind::Param:
      return s.value_role;
    case SymKind::Grad:
      return 1;
    case SymKind::State:
      return 2 + x.index;
    case SymKind::Output:
      return 2 + static_cast<int>(rule.states.size()) + x.index;
    default:
      throw InternalError("role_of: '" + x.name + "' is not a tensor");
  }
}

Schedule plan_schedule(const Rule& rule, const DTypeBinding& dtypes, Strategy wanted) {
  return Planner(rule, dtypes).plan(wanted);
}

}  // namespace fusedopt::codegen
