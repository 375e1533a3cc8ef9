// parse_rule: the size limit, then the lexer/parser, then the checker.
#include "lang/parse.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "fusedopt/error.hpp"
#include "lang/checker.hpp"
#include "lang/parser.hpp"
#include "lang/source.hpp"
#include "lang/storage.hpp"

namespace fusedopt::lang {
namespace {

// "dir/adamw.rule" -> "adamw"; both separators, since rules may name Windows paths.
std::string stem(const std::string& file) {
  std::size_t slash = file.find_last_of("/\\");
  std::string base = slash == std::string::npos ? file : file.substr(slash + 1);
  std::size_t dot = base.rfind('.');
  if (dot != std::string::npos && dot > 0) base.resize(dot);
  return base;
}

int name_id(ParsedRule& p, std::string_view name) {
  for (std::size_t i = 0; i < p.names.size(); ++i) {
    if (p.names[i] == name) return static_cast<int>(i);
  }
  p.names.push_back(name);  // string literals only: ParsedRule holds views
  return static_cast<int>(p.names.size()) - 1;
}

ExprPtr node(Op op, const Loc& loc, std::vector<ExprPtr> args) {
  auto e = std::make_unique<Expr>();
  e->op = op;
  e->loc = loc;
  e->args = std::move(args);
  return e;
}

ExprPtr ref(int id, const Loc& loc) {
  ExprPtr e = node(Op::Ref, loc, {});
  e->sym = id;
  return e;
}

ExprPtr number(double v, const Loc& loc) {
  ExprPtr e = node(Op::Number, loc, {});
  e->number = v;
  return e;
}

template <typename... A>
std::vector<ExprPtr> list(A... a) {
  std::vector<ExprPtr> out;
  (out.push_back(std::move(a)), ...);
  return out;
}

// Gradient clipping by global norm, as a rewrite of the parsed rule: the gradient is
// renamed, and its old name becomes a temporary holding the clipped gradient, so the
// checker schedules the norm like any other reduction.
void add_grad_clipping(const Source& src, ParsedRule& p, double max_grad_norm) {
  auto grad = std::find_if(p.decls.begin(), p.decls.end(),
                           [](const Decl& d) { return d.kind == SymKind::Grad; });
  if (grad == p.decls.end()) return;  // the checker reports the missing grad
  for (std::string_view taken : {"max_grad_norm"}) {
    for (const Decl& d : p.decls) {
      if (p.names[d.name] == taken) {
        src.fail(d.loc,
                 fmt::format("cannot add gradient clipping: the rule already declares '{}'", taken),
                 "the rule clips by itself; set its hyper instead of the clipping option");
      }
    }
    for (const RawStmt& st : p.stmts) {
      if (p.names[st.target] == taken) {
        src.fail(st.loc, fmt::format("cannot add gradient clipping: the rule assigns '{}'", taken),
                 "rename the temporary");
      }
    }
  }
  const Loc at = grad->loc;
  const int user_grad = grad->name;
  const int raw = name_id(p, "fo_grad_raw");
  const int norm = name_id(p, "fo_grad_norm");
  const int limit = name_id(p, "max_grad_norm");
  grad->name = raw;
  grad->internal = true;
  Decl hyper;
  hyper.kind = SymKind::Hyper;
  hyper.name = limit;
  hyper.loc = at;
  hyper.keyword = grad->keyword;
  hyper.default_value = max_grad_norm;
  p.decls.push_back(std::move(hyper));

  RawStmt norm_stmt;
  norm_stmt.target = norm;
  norm_stmt.loc = at;
  norm_stmt.internal = true;
  norm_stmt.value = node(Op::Reduce, at, list(ref(raw, at)));
  norm_stmt.value->reduce_kind = ReduceKind::Norm;
  norm_stmt.value->reduce_scope = Scope::Global;
  RawStmt clip_stmt;
  clip_stmt.target = user_grad;
  clip_stmt.loc = at;
  clip_stmt.internal = true;
  // torch.nn.utils.clip_grad_norm_: coef = max_norm / (total_norm + 1e-6), at most 1.
  ExprPtr coef = node(
      Op::Min, at,
      list(number(1.0, at),
           node(Op::Div, at,
                list(ref(limit, at), node(Op::Add, at, list(ref(norm, at), number(1e-6, at)))))));
  clip_stmt.value = node(Op::Mul, at, list(ref(raw, at), std::move(coef)));
  std::vector<RawStmt> stmts;
  stmts.push_back(std::move(norm_stmt));
  stmts.push_back(std::move(clip_stmt));
  for (RawStmt& st : p.stmts) stmts.push_back(std::move(st));
  p.stmts = std::move(stmts);
}

}  // namespace

std::shared_ptr<const Rule> parse_rule(std::string_view text, const std::string& file,
                                       const ParseOptions& options) {
  if (text.size() > kMaxRuleBytes) {
    throw RuleError(file, 1, 1,
                    fmt::format("the rule is {} bytes, more than the limit of {} bytes",
                                text.size(), kMaxRuleBytes),
                    "", 1, "a rule is a short per-element update; is this the right file?");
  }
  auto rule = std::make_shared<Rule>();
  rule->name = stem(file);
  rule->file = file;
  rule->text = std::string(text);
  // The Source views the rule's own copy of the text, which lives as long as the parse.
  const Source source(rule->text, file);
  ParsedRule parsed = parse_syntax(source);
  if (options.clip_grad_norm) {
    // Check the rule as written first, so errors speak of the user's text only.
    {
      ParsedRule plain = parse_syntax(source);
      Rule scratch;
      check_rule(source, plain, scratch);
    }
    add_grad_clipping(source, parsed, options.max_grad_norm);
    rule->name += "+clip";
  }
  check_rule(source, parsed, *rule);  // the limits too
  check_storage(source, parsed.storage, *rule);
  return rule;
}

}  // namespace fusedopt::lang
