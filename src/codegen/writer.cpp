// The helpers of writer.hpp: #line directives, file names and comments safe in generated
// code, and float and double literals.
#include "codegen/writer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>

namespace fusedopt::codegen {

void Writer::line_directive(int line_no, const std::string& file) {
  line(fmt::format("#line {} \"{}\"", std::max(line_no, 1), file));
}

std::string line_file_name(const std::string& file) {
  std::string out;
  for (char c : file) {
    bool ok =
        std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '/' || c == '-';
    out += ok ? c : '_';
  }
  return out.empty() ? std::string("rule") : out;
}

std::string rule_file_label(const std::string& file) {
  const std::size_t slash = file.find_last_of('/');
  return line_file_name(slash == std::string::npos ? file : file.substr(slash + 1));
}

std::string float_literal(double value) {
  float f = static_cast<float>(value);
  if (std::isinf(f)) return f > 0 ? "fo_inf()" : "(-fo_inf())";
  if (std::isnan(f)) return "(fo_inf() - fo_inf())";
  std::string s = fmt::format("{:.9g}", f);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  s += 'f';
  return s[0] == '-' ? "(" + s + ")" : s;
}

std::string double_literal(double value) {
  if (std::isinf(value)) return value > 0 ? "fo_inf_d()" : "(-fo_inf_d())";
  if (std::isnan(value)) return "(fo_inf_d() - fo_inf_d())";
  std::string s = fmt::format("{}", value);  // shortest text that reads back exactly
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s[0] == '-' ? "(" + s + ")" : s;
}

std::string sanitize_comment(const std::string& text) {
  std::string out;
  for (char c : text) {
    bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == ' ' || c == '.' || c == '_' ||
              c == '-' || c == ':' || c == '+' || c == '/';
    out += ok ? c : '_';
  }
  return out;
}

}  // namespace fusedopt::codegen
