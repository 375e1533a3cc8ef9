// The syntax pass: tokens to declarations and statements, with names still unresolved
// (Expr::sym holds an index into ParsedRule::names until the checker resolves it).
// Recursion is bounded by kMaxExprDepth, so no input can overflow the stack.
#pragma once

#include <string_view>
#include <vector>

#include "lang/ast.hpp"
#include "lang/source.hpp"

namespace fusedopt::lang {

/// One declared name (`state m = 0, v = 0` gives two).
struct Decl {
  SymKind kind = SymKind::Param;
  int name = -1;             ///< index into ParsedRule::names
  Loc loc;                   ///< of the name
  Loc keyword;               ///< of the declaring keyword
  ExprPtr init;              ///< State, Scalar: the initial value, names unresolved
  double default_value = 0;  ///< Hyper
  bool internal = false;     ///< added by fusedopt (may use reserved names)
};

/// `NAME = EXPR`, names unresolved.
struct RawStmt {
  int target = -1;  ///< index into ParsedRule::names
  Loc loc;
  ExprPtr value;
  bool internal = false;  ///< added by fusedopt (may use reserved names)
};

/// `storage NAME = KIND`: a state's default block-quantized storage (names unresolved).
struct StorageDecl {
  std::string_view name;
  Loc loc;           ///< of the name
  std::string kind;  ///< "q8", ..., with "+sr" when written "q8+sr"
  Loc kind_loc;
};

struct ParsedRule {
  std::vector<std::string_view> names;  ///< every distinct name, by first appearance
  std::vector<Decl> decls;
  std::vector<StorageDecl> storage;
  std::vector<RawStmt> stmts;
  Loc end;  ///< where the text ends (for "missing ..." diagnostics)
};

/// Parses `source`; throws RuleError on the first syntax error.
ParsedRule parse_syntax(const Source& source);

}  // namespace fusedopt::lang
