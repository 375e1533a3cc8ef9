// Name resolution and the rules of the language that grammar cannot express: one param,
// one grad, no duplicates, read-only grad/hypers/step, temporaries assigned before use,
// states and outputs written, something updated.
#include "lang/checker.hpp"

#include <fmt/format.h>

#include <string>

#include "lang/hints.hpp"
#include "lang/names.hpp"

namespace fusedopt::lang {
namespace {

std::string where_declared(const Symbol& s) {
  return fmt::format("'{}' is declared as {} {} at line {}, column {}", s.name,
                     s.kind == SymKind::Hyper || s.kind == SymKind::Output ? "an" : "a",
                     to_string(s.kind), s.loc.line, s.loc.col);
}

bool is_comparison_or_logic(Op op) {
  switch (op) {
    case Op::Lt:
    case Op::Le:
    case Op::Gt:
    case Op::Ge:
    case Op::Eq:
    case Op::Ne:
    case Op::And:
    case Op::Or:
    case Op::Not: return true;
    default: return false;
  }
}

class Checker {
 public:
  Checker(const Source& source, ParsedRule& parsed, Rule& rule)
      : src_(source),
        in_(parsed),
        rule_(rule),
        sym_of_name_(parsed.names.size(), -1),
        first_assign_(parsed.names.size(), -1) {}

  void run() {
    for (Decl& d : in_.decls) declare(d);
    const Loc missing_at = in_.stmts.empty() ? in_.end : in_.stmts.front().loc;
    if (rule_.param < 0) {
      src_.fail(missing_at, "the rule declares no param",
                "declare the tensor it updates before the first statement, e.g. 'param p'");
    }
    if (rule_.grad < 0) {
      src_.fail(missing_at, "the rule declares no grad",
                "declare the gradient before the first statement, e.g. 'grad g'");
    }
    rule_.step = add_symbol("step", SymKind::Step, Loc{0, 0, 4});
    for (std::size_t id = 0; id < in_.names.size(); ++id) {
      if (in_.names[id] == "step") sym_of_name_[id] = rule_.step;
    }

    for (std::size_t i = 0; i < in_.stmts.size(); ++i) {
      int& first = first_assign_[in_.stmts[i].target];
      if (first < 0) first = static_cast<int>(i);
    }
    for (Decl& d : in_.decls) {
      if (d.kind != SymKind::State) continue;
      Symbol& state = rule_.symbols[sym_of_name_[d.name]];
      resolve(*d.init, &state);
      state.init = std::move(d.init);
    }
    last_def_.assign(rule_.symbols.size(), -1);
    for (RawStmt& s : in_.stmts) statement(s);

    finish();
  }

 private:
  int add_symbol(std::string_view name, SymKind kind, const Loc& loc) {
    // A running count per kind keeps this O(1): rules may have many temporaries.
    const int index = kind_count_[static_cast<int>(kind)]++;
    Symbol sym;
    sym.name = std::string(name);
    sym.kind = kind;
    sym.loc = loc;
    sym.index = index;
    rule_.symbols.push_back(std::move(sym));
    return static_cast<int>(rule_.symbols.size()) - 1;
  }

  void declare(Decl& d) {
    const std::string_view name = in_.names[d.name];
    if (const char* reason = reserved_reason(name)) {
      src_.fail(d.loc, fmt::format("cannot declare '{}': {}", name, reason), "choose another name");
    }
    const Loc kw{d.keyword.line, d.keyword.col, d.kind == SymKind::Param ? 5 : 4};
    if (d.kind == SymKind::Param && rule_.param >= 0) {
      src_.fail(kw, "a rule has exactly one param", where_declared(rule_.symbols[rule_.param]));
    }
    if (d.kind == SymKind::Grad && rule_.grad >= 0) {
      src_.fail(kw, "a rule has exactly one grad", where_declared(rule_.symbols[rule_.grad]));
    }
    if (sym_of_name_[d.name] >= 0) {
      src_.fail(d.loc, fmt::format("'{}' is already declared", name),
                where_declared(rule_.symbols[sym_of_name_[d.name]]));
    }
    const int sym = add_symbol(name, d.kind, d.loc);
    sym_of_name_[d.name] = sym;
    rule_.symbols[sym].default_value = d.default_value;
    switch (d.kind) {
      case SymKind::Param: rule_.param = sym; break;
      case SymKind::Grad: rule_.grad = sym; break;
      case SymKind::State: rule_.states.push_back(sym); break;
      case SymKind::Hyper: rule_.hypers.push_back(sym); break;
      case SymKind::Output: rule_.outputs.push_back(sym); break;
      default: break;
    }
  }

  std::vector<std::string_view> known_names() const {
    std::vector<std::string_view> names;
    names.reserve(rule_.symbols.size());
    for (const Symbol& s : rule_.symbols) names.push_back(s.name);
    return names;
  }

  [[noreturn]] void unknown_name(const Expr& e, std::string_view name) const {
    std::string hint = did_you_mean(name, known_names());
    if (hint.empty()) {
      hint = "declare it (param, grad, state, hyper, output) or assign it in an earlier statement";
    }
    src_.fail(e.loc, fmt::format("unknown name '{}'", name), hint);
  }

  // Resolves the names under `e` and fills its derived flags. `state` is the state whose
  // initial value this is, or nullptr inside a statement. Depth is bounded by the parser.
  void resolve(Expr& e, const Symbol* state) {
    for (ExprPtr& a : e.args) resolve(*a, state);
    if (e.op == Op::Number) {
      e.uniform = true;
      return;
    }
    if (e.op == Op::Ref) {
      resolve_ref(e, state);
      return;
    }
    e.uniform = true;
    for (const ExprPtr& a : e.args) e.uniform = e.uniform && a->uniform;
    if (is_comparison_or_logic(e.op)) {
      e.boolean = true;
    } else if (e.op == Op::Where) {
      e.boolean = e.args[1]->boolean && e.args[2]->boolean;
    } else if (const FunctionInfo* fn = function_of(e.op)) {
      e.boolean = fn->boolean;
    }
  }

  void resolve_ref(Expr& e, const Symbol* state) {
    const int id = e.sym;
    const std::string_view name = in_.names[id];
    const int sym = sym_of_name_[id];
    if (state != nullptr) {
      // A state's initial value is computed before any step, from the param and hypers.
      if (sym < 0 && first_assign_[id] < 0) unknown_name(e, name);
      const SymKind kind = sym < 0 ? SymKind::Temp : rule_.symbols[sym].kind;
      if (kind != SymKind::Param && kind != SymKind::Hyper) {
        const std::string what = kind == SymKind::Grad ? "the gradient" + fmt::format(" '{}'", name)
                                 : kind == SymKind::Step ? std::string("'step'")
                                 : kind == SymKind::Temp
                                     ? fmt::format("the temporary '{}'", name)
                                     : fmt::format("{} '{}'", to_string(kind), name);
        src_.fail(e.loc,
                  fmt::format("the initial value of state '{}' cannot use {}", state->name, what),
                  "a state's initial value may use numbers, hypers and the param");
      }
    } else if (sym < 0) {
      if (first_assign_[id] >= 0) {
        src_.fail(
            e.loc, fmt::format("'{}' is used before it is assigned", name),
            fmt::format("it is first assigned at line {}", in_.stmts[first_assign_[id]].loc.line));
      }
      unknown_name(e, name);
    }
    e.sym = sym;
    const Symbol& s = rule_.symbols[sym];
    if (s.kind == SymKind::Temp || s.kind == SymKind::Output) {
      e.def = last_def_[sym];
      if (e.def < 0) {
        src_.fail(e.loc, fmt::format("'{}' is used before it is assigned", name),
                  "assign the output before reading it");
      }
      const Expr& value = *rule_.stmts[e.def].value;
      e.uniform = s.kind == SymKind::Temp && value.uniform;
      e.boolean = value.boolean;
    } else {
      e.uniform = s.kind == SymKind::Hyper || s.kind == SymKind::Step;
    }
  }

  void statement(RawStmt& raw) {
    resolve(*raw.value, nullptr);
    const std::string_view name = in_.names[raw.target];
    int sym = sym_of_name_[raw.target];
    if (sym < 0) {
      if (const char* reason = reserved_reason(name)) {
        src_.fail(raw.loc, fmt::format("cannot assign to '{}': {}", name, reason),
                  "assign a temporary with another name");
      }
      sym = add_symbol(name, SymKind::Temp, raw.loc);
      sym_of_name_[raw.target] = sym;
      last_def_.push_back(-1);
    }
    Symbol& s = rule_.symbols[sym];
    switch (s.kind) {
      case SymKind::Grad:
        src_.fail(raw.loc, fmt::format("cannot assign to the gradient '{}': it is read-only", name),
                  "assign a temporary instead, e.g. 'gc = ...', and use that");
      case SymKind::Hyper:
        src_.fail(raw.loc, fmt::format("cannot assign to hyper '{}': it is read-only", name),
                  "hypers are set per parameter group; assign a temporary instead");
      case SymKind::Step:
        src_.fail(raw.loc, fmt::format("cannot assign to 'step': {}", reserved_reason("step")),
                  "assign a temporary instead, e.g. 't = step + 1'");
      default: break;
    }
    s.written = true;
    Stmt stmt;
    stmt.target = sym;
    stmt.value = std::move(raw.value);
    stmt.loc = raw.loc;
    stmt.phase = 0;
    last_def_[sym] = static_cast<int>(rule_.stmts.size());
    rule_.stmts.push_back(std::move(stmt));
  }

  void finish() {
    bool updates = false;
    for (const Stmt& st : rule_.stmts) {
      SymKind k = rule_.symbols[st.target].kind;
      updates = updates || k == SymKind::Param || k == SymKind::State || k == SymKind::Output;
    }
    const Symbol& param = rule_.symbols[rule_.param];
    if (!updates) {
      src_.fail(param.loc,
                fmt::format("the rule updates nothing: no statement assigns the param '{}', a "
                            "state or an output",
                            param.name),
                fmt::format("e.g. '{} = {} - lr * {}'", param.name, param.name,
                            rule_.symbols[rule_.grad].name));
    }
    for (int i : rule_.states) {
      const Symbol& s = rule_.symbols[i];
      if (!s.written) {
        src_.fail(s.loc, fmt::format("state '{}' is never updated", s.name),
                  "assign it in a statement, or remove it (a constant belongs in a hyper)");
      }
    }
    for (int i : rule_.outputs) {
      const Symbol& s = rule_.symbols[i];
      if (!s.written) {
        src_.fail(s.loc, fmt::format("output '{}' is never assigned", s.name),
                  fmt::format("assign it in a statement, e.g. '{} = ...'", s.name));
      }
    }
    // Element-wise rules run in a single pass; reductions will split here.
    rule_.phases.clear();
    rule_.phases.push_back(Phase{0, static_cast<int>(rule_.stmts.size())});
  }

  const Source& src_;
  ParsedRule& in_;
  Rule& rule_;
  std::vector<int> sym_of_name_;   // name id -> symbol index, -1 until declared/assigned
  std::vector<int> first_assign_;  // name id -> first statement assigning it, or -1
  std::vector<int> last_def_;      // symbol index -> latest statement assigning it, or -1
  int kind_count_[static_cast<int>(SymKind::Temp) + 1] = {};
};

}  // namespace

void check_rule(const Source& source, ParsedRule& parsed, Rule& rule) {
  Checker(source, parsed, rule).run();
}

}  // namespace fusedopt::lang
