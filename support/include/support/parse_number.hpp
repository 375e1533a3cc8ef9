// Strict parsers for numbers that programs wrote (checkpoint metadata, index files): one
// spelling per value, nothing a damaged or hand-edited file could slip past. Header-only:
// the comm library uses it too.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>
#include <system_error>

namespace fusedopt::support {

namespace strict_detail {

inline bool is_digit(char c) { return c >= '0' && c <= '9'; }

/// Digits from `*pos`; how many.
inline std::size_t digits(std::string_view text, std::size_t* pos) {
  const std::size_t begin = *pos;
  while (*pos < text.size() && is_digit(text[*pos])) ++*pos;
  return *pos - begin;
}

}  // namespace strict_detail

/// A decimal integer as std::to_string writes it: an optional '-', then digits without a
/// leading zero (except "0" itself); no spaces, no '+', no hex; nullopt for anything else or
/// a value outside int64.
inline std::optional<std::int64_t> parse_int_strict(std::string_view text) {
  std::size_t pos = text.size() > 0 && text[0] == '-' ? 1 : 0;
  const std::size_t first = pos;
  const std::size_t n = strict_detail::digits(text, &pos);
  if (n == 0 || pos != text.size()) return std::nullopt;
  if (n > 1 && text[first] == '0') return std::nullopt;
  if (text == "-0") return std::nullopt;
  std::int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

/// A finite decimal floating-point number as printf's %g or %.17g writes it: an optional
/// '-', digits with an optional '.' and fraction (or a '.' and digits), an optional exponent
/// 'e' or 'E' with an optional sign and digits; no spaces, no '+' in front, no hex, no
/// nan or inf; nullopt for anything else or a value that does not fit a double (1e400).
inline std::optional<double> parse_double_strict(std::string_view text) {
  std::size_t pos = text.size() > 0 && text[0] == '-' ? 1 : 0;
  std::size_t mantissa = strict_detail::digits(text, &pos);
  if (pos < text.size() && text[pos] == '.') {
    ++pos;
    mantissa += strict_detail::digits(text, &pos);
  }
  if (mantissa == 0) return std::nullopt;
  if (pos < text.size() && (text[pos] == 'e' || text[pos] == 'E')) {
    ++pos;
    if (pos < text.size() && (text[pos] == '+' || text[pos] == '-')) ++pos;
    if (strict_detail::digits(text, &pos) == 0) return std::nullopt;
  }
  if (pos != text.size()) return std::nullopt;
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

}  // namespace fusedopt::support
