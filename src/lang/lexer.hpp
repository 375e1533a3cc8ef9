// Splits rule text into tokens on demand, so errors come out in text order. Rejects, at
// their exact column, every byte the language has no use for (control characters,
// non-ASCII, C/C++ punctuation such as ; { } [ ] . & " ' \).
#pragma once

#include <string_view>

#include "lang/ast.hpp"
#include "lang/source.hpp"

namespace fusedopt::lang {

enum class Tok {
  End,
  Newline,
  Name,
  Number,
  LParen,
  RParen,
  Comma,
  Assign,  // =
  Plus,
  Minus,
  Star,
  Slash,
  Percent,
  Caret,
  Lt,
  Le,
  Gt,
  Ge,
  EqEq,
  Ne,
  KwParam,
  KwGrad,
  KwState,
  KwScalar,
  KwRow,
  KwCol,
  KwHyper,
  KwOutput,
  KwStorage,
  KwAnd,
  KwOr,
  KwNot,
};

struct Token {
  Tok kind = Tok::End;
  std::string_view text;  ///< a view into the rule text ("" for End)
  Loc loc;
  double number = 0;  ///< Tok::Number
};

/// True for the keyword tokens (param grad state scalar row col hyper output storage and or
/// not).
inline bool is_keyword_token(Tok kind) {
  switch (kind) {
    case Tok::KwParam:
    case Tok::KwGrad:
    case Tok::KwState:
    case Tok::KwScalar:
    case Tok::KwRow:
    case Tok::KwCol:
    case Tok::KwHyper:
    case Tok::KwOutput:
    case Tok::KwStorage:
    case Tok::KwAnd:
    case Tok::KwOr:
    case Tok::KwNot:
      return true;
    default:
      return false;
  }
}

/// How a token reads in a diagnostic: "'x'", "end of line", "end of file".
std::string describe(const Token& token);

class Lexer {
 public:
  explicit Lexer(const Source& source) : src_(source), text_(source.text()) {}

  /// The next token; Tok::End forever once the text is used up. Throws RuleError.
  Token next();

 private:
  Loc here(std::size_t len) const;
  [[noreturn]] void fail_at(std::size_t pos, std::size_t len, const std::string& message,
                            const std::string& hint = {}) const;
  void skip_comment();
  Token lex_name();
  Token lex_number();
  [[noreturn]] void fail_char(char c) const;
  Token make(Tok kind, std::size_t len);

  const Source& src_;
  std::string_view text_;
  std::size_t pos_ = 0;
  std::size_t line_start_ = 0;
  int line_ = 1;
  Tok prev_ = Tok::Newline;
};

}  // namespace fusedopt::lang
