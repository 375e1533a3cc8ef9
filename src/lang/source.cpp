// Diagnostics: locating the source line of an error and building the RuleError.
#include "lang/source.hpp"

#include "fusedopt/error.hpp"

namespace fusedopt::lang {

std::string Source::line_text(int line) const {
  // Scanning from the start costs O(n) once per error, which keeps the lexer free of a
  // line table it would only need on failure.
  std::size_t begin = 0;
  for (int l = 1; l < line; ++l) {
    std::size_t nl = text_.find('\n', begin);
    if (nl == std::string_view::npos) return {};
    begin = nl + 1;
  }
  std::size_t end = text_.find('\n', begin);
  if (end == std::string_view::npos) end = text_.size();
  if (end > begin && text_[end - 1] == '\r') --end;  // CRLF: the CR belongs to the line end
  std::string out(text_.substr(begin, end - begin));
  for (char& c : out) {
    auto u = static_cast<unsigned char>(c);
    if (c != '\t' && (u < 0x20 || u >= 0x7F)) c = '?';
  }
  return out;
}

void Source::fail(const Loc& loc, const std::string& message, const std::string& hint) const {
  throw RuleError(file_, loc.line, loc.col, message, line_text(loc.line), loc.len < 1 ? 1 : loc.len,
                  hint);
}

}  // namespace fusedopt::lang
