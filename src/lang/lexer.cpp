// The lexer: whitespace, comments, line ends (LF and CRLF), names, keywords, numbers and
// operators; everything else is a RuleError at its column.
#include "lang/lexer.hpp"

#include <fmt/format.h>

#include <cfloat>
#include <charconv>
#include <cmath>

#include "lang/hints.hpp"
#include "lang/names.hpp"

namespace fusedopt::lang {
namespace {

bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_char(char c) { return is_alpha(c) || is_digit(c) || c == '_'; }

struct Keyword {
  std::string_view name;
  Tok kind;
};
constexpr Keyword kKeywordTokens[] = {
    {"param", Tok::KwParam},   {"grad", Tok::KwGrad},     {"state", Tok::KwState},
    {"scalar", Tok::KwScalar}, {"row", Tok::KwRow},       {"col", Tok::KwCol},
    {"hyper", Tok::KwHyper},   {"output", Tok::KwOutput}, {"storage", Tok::KwStorage},
    {"and", Tok::KwAnd},       {"or", Tok::KwOr},         {"not", Tok::KwNot}};

// Roughly log10 of a well-formed decimal number, only to tell overflow from underflow when
// from_chars reports "out of range". Saturates instead of overflowing on absurd exponents.
long long decimal_magnitude(std::string_view s) {
  std::size_t i = 0;
  long long int_digits = 0;
  bool seen_nonzero = false;
  for (; i < s.size() && is_digit(s[i]); ++i) {
    if (s[i] != '0') seen_nonzero = true;
    if (seen_nonzero) ++int_digits;
  }
  long long mag = int_digits - 1;
  if (i < s.size() && s[i] == '.') {
    ++i;
    long long zeros = 0;
    for (; i < s.size() && is_digit(s[i]); ++i) {
      if (!seen_nonzero && s[i] == '0') ++zeros;
      if (!seen_nonzero && s[i] != '0') {
        seen_nonzero = true;
        mag = -zeros - 1;
      }
    }
  }
  long long exp = 0;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    bool neg = i < s.size() && s[i] == '-';
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    for (; i < s.size() && is_digit(s[i]); ++i) {
      if (exp < 1000000000) exp = exp * 10 + (s[i] - '0');
    }
    if (neg) exp = -exp;
  }
  return mag + exp;
}

constexpr const char* kNumberHint = "numbers are decimal: 3, 0.5, .5, 1e-8 or 2.5E+3";

}  // namespace

std::string describe(const Token& token) {
  switch (token.kind) {
    case Tok::End:
      return "end of file";
    case Tok::Newline:
      return "end of line";
    default:
      break;
  }
  // Long names and numbers are cut so a diagnostic stays one readable line.
  if (token.text.size() > 40) return "'" + std::string(token.text.substr(0, 37)) + "...'";
  return "'" + std::string(token.text) + "'";
}

Loc Lexer::here(std::size_t len) const {
  Loc loc;
  loc.line = line_;
  loc.col = static_cast<int>(pos_ - line_start_) + 1;
  loc.len = static_cast<int>(len);
  return loc;
}

void Lexer::fail_at(std::size_t pos, std::size_t len, const std::string& message,
                    const std::string& hint) const {
  Loc loc;
  loc.line = line_;
  loc.col = static_cast<int>(pos - line_start_) + 1;
  loc.len = static_cast<int>(len);
  src_.fail(loc, message, hint);
}

Token Lexer::make(Tok kind, std::size_t len) {
  Token t;
  t.kind = kind;
  t.text = text_.substr(pos_, len);
  t.loc = here(len);
  pos_ += len;
  prev_ = kind;
  return t;
}

Token Lexer::next() {
  while (pos_ < text_.size()) {
    const char c = text_[pos_];
    const auto u = static_cast<unsigned char>(c);
    if (c == ' ' || c == '\t') {
      ++pos_;
      continue;
    }
    if (c == '#') {
      skip_comment();
      continue;
    }
    if (c == '\n' || (c == '\r' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '\n')) {
      Token t = make(Tok::Newline, c == '\r' ? 2 : 1);
      t.loc.len = 1;
      ++line_;
      line_start_ = pos_;
      return t;
    }
    if (u >= 0x80) {
      fail_at(pos_, 1, fmt::format("non-ASCII byte 0x{:02X}", u),
              "rules are plain ASCII, comments included");
    }
    if (u < 0x20 || u == 0x7F) {
      fail_at(pos_, 1, fmt::format("control character 0x{:02X} ({})", u, control_name(u)),
              c == '\r' ? "line ends are LF or CRLF; a lone CR is not one"
                        : "only spaces and tabs may separate tokens");
    }
    if (is_alpha(c) || c == '_') return lex_name();
    if (is_digit(c) || (c == '.' && pos_ + 1 < text_.size() && is_digit(text_[pos_ + 1]))) {
      return lex_number();
    }
    const char n = pos_ + 1 < text_.size() ? text_[pos_ + 1] : '\0';
    switch (c) {
      case '(':
        return make(Tok::LParen, 1);
      case ')':
        return make(Tok::RParen, 1);
      case ',':
        return make(Tok::Comma, 1);
      case '+':
        return make(Tok::Plus, 1);
      case '-':
        return make(Tok::Minus, 1);
      case '/':
        return make(Tok::Slash, 1);
      case '%':
        return make(Tok::Percent, 1);
      case '^':
        return make(Tok::Caret, 1);
      case '*':
        if (n == '*') {
          fail_at(pos_, 2, "'**' is not an operator", "write powers with '^', e.g. 'x ^ 2'");
        }
        return make(Tok::Star, 1);
      case '=':
        return n == '=' ? make(Tok::EqEq, 2) : make(Tok::Assign, 1);
      case '<':
        return n == '=' ? make(Tok::Le, 2) : make(Tok::Lt, 1);
      case '>':
        return n == '=' ? make(Tok::Ge, 2) : make(Tok::Gt, 1);
      case '!':
        if (n == '=') return make(Tok::Ne, 2);
        break;
      default:
        break;
    }
    fail_char(c);
  }
  Token t;
  t.kind = Tok::End;
  t.loc = here(1);
  prev_ = Tok::End;
  return t;
}

void Lexer::skip_comment() {
  // Comments end at the line end; their bytes are held to the same rules as code so that
  // nothing invisible or non-ASCII hides in a rule.
  while (pos_ < text_.size()) {
    const char c = text_[pos_];
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n' || (c == '\r' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '\n')) return;
    if (u >= 0x80) {
      fail_at(pos_, 1, fmt::format("non-ASCII byte 0x{:02X}", u),
              "rules are plain ASCII, comments included");
    }
    if ((u < 0x20 && c != '\t') || u == 0x7F) {
      fail_at(pos_, 1, fmt::format("control character 0x{:02X} ({})", u, control_name(u)),
              c == '\r' ? "line ends are LF or CRLF; a lone CR is not one"
                        : "comments may hold printable ASCII and tabs only");
    }
    ++pos_;
  }
}

Token Lexer::lex_name() {
  std::size_t end = pos_;
  while (end < text_.size() && is_name_char(text_[end])) ++end;
  const std::size_t len = end - pos_;
  std::string_view name = text_.substr(pos_, len);
  if (name.find("__") != std::string_view::npos) {
    fail_at(pos_, len, "names containing '__' are reserved",
            "'__' belongs to C++ implementations and generated code; rename it");
  }
  if (name[0] == '_') {
    fail_at(pos_, len, "names must start with a letter",
            "a leading '_' is reserved for generated code; rename it");
  }
  for (const Keyword& k : kKeywordTokens) {
    if (name == k.name) return make(k.kind, len);
  }
  return make(Tok::Name, len);
}

Token Lexer::lex_number() {
  // The maximal run that could belong to a number ("1.2.3", "0x1F", "1e+"), so a malformed
  // number is reported whole rather than as a number followed by a puzzling name.
  std::size_t run = pos_;
  while (run < text_.size()) {
    char c = text_[run];
    if (is_name_char(c) || c == '.') {
      ++run;
    } else if ((c == '+' || c == '-') && (text_[run - 1] == 'e' || text_[run - 1] == 'E')) {
      ++run;
    } else {
      break;
    }
  }
  // The strict grammar: digits [. digits*] [e [+-] digits+] | . digits+ [e [+-] digits+].
  std::size_t p = pos_;
  while (p < run && is_digit(text_[p])) ++p;
  if (p < run && text_[p] == '.') {
    ++p;
    while (p < run && is_digit(text_[p])) ++p;
  }
  if (p < run && (text_[p] == 'e' || text_[p] == 'E')) {
    std::size_t q = p + 1;
    if (q < run && (text_[q] == '+' || text_[q] == '-')) ++q;
    std::size_t digits = q;
    while (q < run && is_digit(text_[q])) ++q;
    if (q > digits) p = q;
  }
  const std::size_t len = run - pos_;
  std::string_view spelled = text_.substr(pos_, len);
  if (p != run) {
    std::string shown =
        len > 40 ? std::string(spelled.substr(0, 37)) + "..." : std::string(spelled);
    bool hex = len > 1 && spelled[0] == '0' && (spelled[1] == 'x' || spelled[1] == 'X');
    fail_at(pos_, len, "malformed number '" + shown + "'",
            hex ? "hexadecimal numbers are not supported; " + std::string(kNumberHint)
                : std::string(kNumberHint));
  }
  double value = 0;
  auto [ptr, ec] = std::from_chars(spelled.data(), spelled.data() + len, value);
  // Underflow is harmless (the value rounds to zero in fp32 anyway); overflow is not.
  if (ec == std::errc::result_out_of_range && ptr == spelled.data() + len &&
      decimal_magnitude(spelled) < 0) {
    value = 0;
    ec = std::errc();
  }
  // fp32 rounds everything below the midpoint of FLT_MAX and 2^128 to FLT_MAX (so "%.8g"
  // of FLT_MAX, 3.4028235e38, reads back): such a number is FLT_MAX, as fp32 holds it.
  constexpr double kFloatOverflow = 0x1.ffffffp+127;
  if (ec == std::errc() && value > FLT_MAX && value < kFloatOverflow) value = FLT_MAX;
  if (ec != std::errc() || ptr != spelled.data() + len || !(value <= FLT_MAX)) {
    std::string shown =
        len > 40 ? std::string(spelled.substr(0, 37)) + "..." : std::string(spelled);
    fail_at(pos_, len, "number '" + shown + "' is too large", "rule math is fp32: at most 3.4e38");
  }
  // A number fp32 rounds to 0 is 0 everywhere: per-element code computes in fp32, code that
  // runs once per launch in double, and the two must read the same literal.
  if (static_cast<float>(value) == 0.0f) value = 0;
  Token t = make(Tok::Number, len);
  t.number = value;
  return t;
}

void Lexer::fail_char(char c) const {
  const char n = pos_ + 1 < text_.size() ? text_[pos_ + 1] : '\0';
  switch (c) {
    case '.':
      if ((prev_ == Tok::Name || prev_ == Tok::RParen || prev_ == Tok::Number) &&
          (is_alpha(n) || n == '_')) {
        fail_at(pos_, 1, "member access ('.') is not supported",
                "a rule works on single elements: there are no members or methods");
      }
      fail_at(pos_, 1, "unexpected character '.'", kNumberHint);
    case '[':
      fail_at(pos_, 1, "indexing ('[') is not supported",
              "a rule works on single elements: there is no indexing");
    case ']':
      fail_at(pos_, 1, "unexpected character ']'", "there is no indexing");
    case '{':
    case '}':
      fail_at(pos_, 1, fmt::format("unexpected character '{}'", c),
              "there are no blocks: one statement per line");
    case ';':
      fail_at(pos_, 1, "unexpected character ';'",
              "a statement ends at the end of its line; there is no ';'");
    case '"':
    case '\'':
      fail_at(pos_, 1, "strings and character literals are not supported",
              "comments start with '#'");
    case '\\':
      fail_at(pos_, 1, "unexpected character '\\'",
              "there are no escapes or line continuations; write each statement on one line");
    case '&':
      fail_at(pos_, n == '&' ? 2 : 1, "'&' is not an operator",
              "write 'and' for logical and; there are no pointers or references");
    case '|':
      fail_at(pos_, n == '|' ? 2 : 1, "'|' is not an operator", "write 'or' for logical or");
    case '!':
      fail_at(pos_, 1, "'!' is not an operator", "write 'not x' to negate, 'a != b' to compare");
    case '%':
      fail_at(pos_, 1, "'%' is not an operator", "there is no modulo");
    default:
      break;
  }
  fail_at(pos_, 1, fmt::format("unexpected character '{}'", c),
          "a rule holds names, numbers, ( ) , = + - * / ^ < <= > >= == != and # comments");
}

}  // namespace fusedopt::lang
