// Recursive descent over the token stream with precedence climbing for binary operators.
// Precedence, low to high: or, and, not (prefix), comparisons (non-associative), + -, * /,
// unary - +, ^ (right-associative; binds tighter than a unary minus on its left).
#include "lang/parser.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>

#include "lang/hints.hpp"
#include "lang/lexer.hpp"
#include "lang/names.hpp"
#include "lang/parse.hpp"

namespace fusedopt::lang {
namespace {

constexpr int kPrecOr = 1;
constexpr int kPrecAnd = 2;
constexpr int kPrecNot = 3;
constexpr int kPrecCmp = 4;
constexpr int kPrecAdd = 5;
constexpr int kPrecMul = 6;

struct BinaryOp {
  Op op;
  int prec;
};

// Binary operator of a token, or prec 0 when the token is none.
BinaryOp binary_op(Tok kind) {
  switch (kind) {
    case Tok::KwOr:
      return {Op::Or, kPrecOr};
    case Tok::KwAnd:
      return {Op::And, kPrecAnd};
    case Tok::Lt:
      return {Op::Lt, kPrecCmp};
    case Tok::Le:
      return {Op::Le, kPrecCmp};
    case Tok::Gt:
      return {Op::Gt, kPrecCmp};
    case Tok::Ge:
      return {Op::Ge, kPrecCmp};
    case Tok::EqEq:
      return {Op::Eq, kPrecCmp};
    case Tok::Ne:
      return {Op::Ne, kPrecCmp};
    case Tok::Plus:
      return {Op::Add, kPrecAdd};
    case Tok::Minus:
      return {Op::Sub, kPrecAdd};
    case Tok::Star:
      return {Op::Mul, kPrecMul};
    case Tok::Slash:
      return {Op::Div, kPrecMul};
    case Tok::Percent:
      return {Op::Mod, kPrecMul};
    default:
      return {Op::Number, 0};
  }
}

bool ends_line(Tok kind) { return kind == Tok::Newline || kind == Tok::End; }

bool is_decl_keyword(Tok kind) {
  return kind == Tok::KwParam || kind == Tok::KwGrad || kind == Tok::KwState ||
         kind == Tok::KwScalar || kind == Tok::KwRow || kind == Tok::KwCol ||
         kind == Tok::KwHyper || kind == Tok::KwOutput || kind == Tok::KwStorage;
}

constexpr const char* kTooDeepHint =
    "at most 256 levels of parentheses, operators and calls; split it with temporaries";

// An expression and its height (operator and call levels above the leaves), tracked so that
// long left-associative chains are refused before they grow a tree too deep to walk.
struct Parsed {
  ExprPtr expr;
  int height = 0;
};

class Parser {
 public:
  explicit Parser(const Source& source) : src_(source), lexer_(source) { advance(); }

  ParsedRule run() {
    while (true) {
      while (tok_.kind == Tok::Newline) advance();
      if (tok_.kind == Tok::End) break;
      if (is_decl_keyword(tok_.kind)) {
        if (!out_.stmts.empty()) {
          src_.fail(tok_.loc, "declarations must come before the first statement",
                    fmt::format("move this '{}' above line {}, where the statements start",
                                tok_.text, out_.stmts.front().loc.line));
        }
        parse_decl();
      } else if (tok_.kind == Tok::Name) {
        parse_stmt();
      } else if (tok_.kind == Tok::RParen) {
        src_.fail(tok_.loc, "unmatched ')'", "remove it, or add the '(' it closes");
      } else {
        src_.fail(tok_.loc, "expected a declaration or a statement, got " + describe(tok_),
                  "a statement is 'NAME = EXPRESSION'; declarations start with param, grad, "
                  "state, scalar, row, col, hyper, output or storage");
      }
      expect_line_end();
    }
    out_.end = tok_.loc;
    return std::move(out_);
  }

 private:
  void advance() { tok_ = lexer_.next(); }

  int intern(std::string_view name) {
    auto [it, inserted] = ids_.emplace(name, static_cast<int>(out_.names.size()));
    if (inserted) out_.names.push_back(name);
    return it->second;
  }

  void expect_line_end() {
    if (ends_line(tok_.kind)) return;
    if (tok_.kind == Tok::RParen) {
      src_.fail(tok_.loc, "unmatched ')'", "remove it, or add the '(' it closes");
    }
    src_.fail(tok_.loc, "expected an operator or the end of the line, got " + describe(tok_),
              "one statement or declaration per line");
  }

  // A name where a declaration needs one; keywords are refused here, other reserved names
  // by the checker (which words them the same way).
  Token expect_decl_name(const char* keyword) {
    if (tok_.kind == Tok::Name) {
      Token t = tok_;
      advance();
      return t;
    }
    if (is_keyword_token(tok_.kind)) {
      src_.fail(tok_.loc, fmt::format("cannot declare '{}': it is a keyword", tok_.text),
                "choose another name");
    }
    src_.fail(tok_.loc, fmt::format("expected a name after '{}', got {}", keyword, describe(tok_)),
              fmt::format("e.g. '{}'", decl_example(keyword)));
  }

  // A whole declaration of each kind, with its '= ...' where the kind needs one.
  static const char* decl_example(std::string_view keyword) {
    static constexpr std::pair<const char*, const char*> kExamples[] = {
        {"param", "param p"},         {"grad", "grad g"},     {"state", "state m = 0"},
        {"scalar", "scalar s = 0"},   {"row", "row r = 0"},   {"col", "col c = 0"},
        {"hyper", "hyper lr = 1e-3"}, {"output", "output u"}, {"storage", "storage m = q8"},
    };
    for (const auto& [kw, example] : kExamples) {
      if (keyword == kw) return example;
    }
    return "param p";
  }

  // `storage NAME = KIND, ...`: KIND a name (q8, q4, q8s, ...), with "+sr" for stochastic
  // rounding, checked after the rule.
  void parse_storage() {
    while (true) {
      const Token name = expect_decl_name("storage");
      if (tok_.kind != Tok::Assign) {
        src_.fail(name.loc, fmt::format("storage '{}' needs a kind", name.text),
                  fmt::format("e.g. 'storage {} = q8'", name.text));
      }
      advance();
      if (tok_.kind != Tok::Name) {
        src_.fail(tok_.loc, fmt::format("expected a storage kind, got {}", describe(tok_)),
                  "one of q8, q4 (the sign from the rule), q8s, q8u, q4s, q4u");
      }
      const Token kind = tok_;
      std::string text(kind.text);
      advance();
      if (tok_.kind == Tok::Plus) {  // "q4u+sr": rounded stochastically
        advance();
        if (tok_.kind != Tok::Name || tok_.text != "sr") {
          src_.fail(tok_.loc,
                    fmt::format("expected 'sr' after '{}+', got {}", text, describe(tok_)),
                    fmt::format("'{}+sr' rounds the codes stochastically", text));
        }
        text += "+sr";
        advance();
      }
      out_.storage.push_back({name.text, name.loc, std::move(text), kind.loc});
      if (tok_.kind != Tok::Comma) break;
      advance();
    }
  }

  void parse_decl() {
    const Token kw = tok_;
    advance();
    if (kw.kind == Tok::KwStorage) {
      parse_storage();
      return;
    }
    SymKind kind = SymKind::Param;
    switch (kw.kind) {
      case Tok::KwGrad:
        kind = SymKind::Grad;
        break;
      case Tok::KwState:
        kind = SymKind::State;
        break;
      case Tok::KwScalar:
        kind = SymKind::Scalar;
        break;
      case Tok::KwRow:
        kind = SymKind::RowState;
        break;
      case Tok::KwCol:
        kind = SymKind::ColState;
        break;
      case Tok::KwHyper:
        kind = SymKind::Hyper;
        break;
      case Tok::KwOutput:
        kind = SymKind::Output;
        break;
      default:
        break;
    }
    const std::string keyword(kw.text);
    while (true) {
      Token name = expect_decl_name(keyword.c_str());
      Decl d;
      d.kind = kind;
      d.name = intern(name.text);
      d.loc = name.loc;
      d.keyword = kw.loc;
      if (kind == SymKind::State || kind == SymKind::Scalar || kind == SymKind::RowState ||
          kind == SymKind::ColState) {
        if (tok_.kind != Tok::Assign) {
          src_.fail(name.loc, fmt::format("{} '{}' needs an initial value", keyword, name.text),
                    fmt::format("e.g. '{} {} = 0'", keyword, name.text));
        }
        advance();
        d.init = parse_expr().expr;
      } else if (kind == SymKind::Hyper) {
        if (tok_.kind != Tok::Assign) {
          src_.fail(name.loc, fmt::format("hyper '{}' needs a default value", name.text),
                    fmt::format("e.g. 'hyper {} = 1e-3'", name.text));
        }
        advance();
        d.default_value = parse_hyper_default(name.text);
      }
      out_.decls.push_back(std::move(d));
      if (tok_.kind != Tok::Comma) break;
      if (kind == SymKind::Param || kind == SymKind::Grad) {
        src_.fail(tok_.loc, fmt::format("'{}' declares exactly one name", keyword),
                  fmt::format("a rule updates one {} at a time",
                              keyword == "param" ? "parameter tensor" : "gradient"));
      }
      advance();
    }
    if (!ends_line(tok_.kind) && tok_.kind != Tok::RParen) {
      src_.fail(tok_.loc,
                fmt::format("expected ',' or the end of the line after the {} declaration, got {}",
                            keyword, describe(tok_)),
                kind == SymKind::Hyper ? "a hyper's default is a single number"
                                       : "separate several names with ','");
    }
  }

  double parse_hyper_default(std::string_view name) {
    bool negative = false;
    if (tok_.kind == Tok::Minus || tok_.kind == Tok::Plus) {
      negative = tok_.kind == Tok::Minus;
      advance();
    }
    if (tok_.kind != Tok::Number) {
      src_.fail(
          tok_.loc,
          fmt::format("the default of hyper '{}' must be a number, got {}", name, describe(tok_)),
          fmt::format("e.g. 'hyper {} = 1e-3'; compute derived values in statements", name));
    }
    double value = negative ? -tok_.number : tok_.number;
    advance();
    return value;
  }

  void parse_stmt() {
    const Token name = tok_;
    advance();
    if (tok_.kind != Tok::Assign) {
      src_.fail(tok_.loc, fmt::format("expected '=' after '{}', got {}", name.text, describe(tok_)),
                tok_.kind == Tok::EqEq ? "a statement assigns with a single '='"
                                       : "a statement is 'NAME = EXPRESSION'");
    }
    advance();
    RawStmt s;
    s.target = intern(name.text);
    s.loc = name.loc;
    s.value = parse_expr().expr;
    out_.stmts.push_back(std::move(s));
  }

  // Counts one level of recursion; deeper than kMaxExprDepth is an error at `at`.
  struct Nest {
    Nest(Parser& p, const Loc& at) : parser(p) {
      if (++parser.depth_ > kMaxExprDepth) {
        parser.src_.fail(at, "expression is nested too deeply", kTooDeepHint);
      }
    }
    ~Nest() { --parser.depth_; }
    Parser& parser;
  };

  Parsed make(Op op, const Loc& loc, std::vector<Parsed> operands) {
    Parsed out = leaf(op, loc);
    int height = 0;
    out.expr->args.reserve(operands.size());
    for (Parsed& o : operands) {
      height = std::max(height, o.height);
      out.expr->args.push_back(std::move(o.expr));
    }
    return finish(std::move(out), height, loc);
  }

  // Unary and binary nodes skip the operand vector: they are most of a big rule.
  Parsed make(Op op, const Loc& loc, Parsed a) {
    Parsed out = leaf(op, loc);
    out.expr->args.reserve(1);
    out.expr->args.push_back(std::move(a.expr));
    return finish(std::move(out), a.height, loc);
  }

  Parsed make(Op op, const Loc& loc, Parsed a, Parsed b) {
    Parsed out = leaf(op, loc);
    out.expr->args.reserve(2);
    out.expr->args.push_back(std::move(a.expr));
    out.expr->args.push_back(std::move(b.expr));
    return finish(std::move(out), std::max(a.height, b.height), loc);
  }

  static Parsed leaf(Op op, const Loc& loc) {
    Parsed out;
    out.expr = std::make_unique<Expr>();
    out.expr->op = op;
    out.expr->loc = loc;
    return out;
  }

  Parsed finish(Parsed out, int operand_height, const Loc& loc) {
    out.height = operand_height + 1;
    if (out.height > kMaxExprDepth) src_.fail(loc, "expression is nested too deeply", kTooDeepHint);
    return out;
  }

  Parsed parse_expr() { return parse_binary(kPrecOr); }

  Parsed parse_binary(int min_prec) {
    Parsed lhs;
    if (tok_.kind == Tok::KwNot && min_prec <= kPrecNot) {
      const Token op = tok_;
      Nest nest(*this, op.loc);
      advance();
      lhs = make(Op::Not, op.loc, parse_binary(kPrecNot));
    } else {
      lhs = parse_unary();
    }
    bool lhs_is_cmp = false;
    while (true) {
      BinaryOp bin = binary_op(tok_.kind);
      if (bin.prec == 0 || bin.prec < min_prec) return lhs;
      const Token op = tok_;
      if (bin.prec == kPrecCmp && lhs_is_cmp) {
        src_.fail(op.loc, "comparisons cannot be chained",
                  "write 'a < b and b < c', or parenthesize one comparison");
      }
      advance();
      Parsed rhs = parse_binary(bin.prec + 1);
      lhs = make(bin.op, op.loc, std::move(lhs), std::move(rhs));
      lhs_is_cmp = bin.prec == kPrecCmp;
    }
  }

  Parsed parse_unary() {
    if (tok_.kind == Tok::Minus || tok_.kind == Tok::Plus) {
      const Token op = tok_;
      Nest nest(*this, op.loc);
      advance();
      Parsed operand = parse_unary();
      if (op.kind == Tok::Plus) return operand;
      return make(Op::Neg, op.loc, std::move(operand));
    }
    return parse_power();
  }

  Parsed parse_power() {
    Parsed base = parse_primary();
    if (tok_.kind != Tok::Caret) return base;
    const Token op = tok_;
    Nest nest(*this, op.loc);
    advance();
    Parsed exponent = parse_unary();  // right-associative, and allows a ^ -b
    return make(Op::Pow, op.loc, std::move(base), std::move(exponent));
  }

  Parsed parse_primary() {
    const Token t = tok_;
    switch (t.kind) {
      case Tok::Number: {
        advance();
        Parsed p = leaf(Op::Number, t.loc);
        p.expr->number = t.number;
        return p;
      }
      case Tok::Name: {
        advance();
        if (tok_.kind == Tok::LParen) return parse_call(t);
        if (find_function(t.text) != nullptr) {
          src_.fail(t.loc, fmt::format("'{}' is a function and needs arguments", t.text),
                    fmt::format("call it: {}", find_function(t.text)->signature));
        }
        Parsed p = leaf(Op::Ref, t.loc);
        p.expr->sym = intern(t.text);
        return p;
      }
      case Tok::LParen: {
        Nest nest(*this, t.loc);
        advance();
        Parsed inner = parse_expr();
        expect_close(t, "the '(' ");
        return inner;
      }
      default:
        break;
    }
    std::string hint;
    switch (t.kind) {
      case Tok::Star:
        hint = "there are no pointers; '*' multiplies two values";
        break;
      case Tok::RParen:
        hint = "remove the ')', or put an expression before it";
        break;
      case Tok::Newline:
      case Tok::End:
        hint = "the expression is missing";
        break;
      case Tok::KwNot:
        hint = "parenthesize it: '(not x)'";
        break;
      default:
        break;
    }
    src_.fail(t.loc, "expected an expression, got " + describe(t), hint);
  }

  // After the contents of a '(' at `open`: a ')' must follow.
  void expect_close(const Token& open, const char* what) {
    if (tok_.kind == Tok::RParen) {
      advance();
      return;
    }
    if (ends_line(tok_.kind)) {
      src_.fail(open.loc, "'(' is never closed",
                "add the matching ')' before the end of the line; a statement cannot span lines");
    }
    src_.fail(tok_.loc,
              fmt::format("expected ')' to close {}at column {}, got {}", what, open.loc.col,
                          describe(tok_)),
              "is an operator missing?");
  }

  Parsed parse_call(const Token& name) {
    const FunctionInfo* fn = find_function(name.text);
    if (fn == nullptr) {
      std::vector<std::string_view> candidates;
      for (const FunctionInfo& f : functions()) candidates.push_back(f.name);
      std::string hint = did_you_mean(name.text, candidates);
      if (hint.empty()) {
        hint = "there are no user-defined functions; the built-ins are";
        for (const FunctionInfo& f : functions()) hint += std::string(" ") + f.name;
      }
      src_.fail(name.loc, fmt::format("unknown function '{}'", name.text), hint);
    }
    const Token open = tok_;
    Nest nest(*this, open.loc);
    advance();
    std::vector<Parsed> args;
    if (tok_.kind != Tok::RParen) {
      while (true) {
        args.push_back(parse_expr());
        if (tok_.kind != Tok::Comma) break;
        advance();
      }
    }
    if (tok_.kind != Tok::RParen && !ends_line(tok_.kind)) {
      src_.fail(
          tok_.loc,
          fmt::format("expected ',' or ')' in the call to '{}', got {}", name.text, describe(tok_)),
          fmt::format("usage: {}", fn->signature));
    }
    expect_close(open, "the call at ");
    const int got = static_cast<int>(args.size());
    if (fn->arity >= 0 && got != fn->arity) {
      src_.fail(name.loc,
                fmt::format("'{}' takes {} argument{}, got {}", name.text, fn->arity,
                            fn->arity == 1 ? "" : "s", got),
                fmt::format("usage: {}", fn->signature));
    }
    Parsed call = make(fn->op, name.loc, std::move(args));
    if (fn->reduction) {
      call.expr->reduce_kind = fn->reduce;
      call.expr->reduce_scope = fn->scope;
      call.expr->loc.len = static_cast<int>(name.text.size());
    }
    return call;
  }

  const Source& src_;
  Lexer lexer_;
  Token tok_;
  ParsedRule out_;
  std::unordered_map<std::string_view, int> ids_;
  int depth_ = 0;
};

}  // namespace

ParsedRule parse_syntax(const Source& source) { return Parser(source).run(); }

}  // namespace fusedopt::lang
