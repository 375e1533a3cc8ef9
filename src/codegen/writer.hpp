// Small helpers shared by the code generators: a line writer that knows about #line
// directives, the name sanitising that keeps user text out of generated code, and literals.
#pragma once

#include <string>

namespace fusedopt::codegen {

/// Marker that generate_source() replaces with `#line <next line> "<generated file>"`.
inline constexpr const char* kRestoreLineMarker = "#line @FUSEDOPT_RESTORE@";

class Writer {
 public:
  void line(const std::string& text) {
    out_ += text;
    out_ += '\n';
  }
  /// Maps the following lines to `line` of `file` (already sanitised).
  void line_directive(int line, const std::string& file);
  /// Maps the following lines back to the generated file itself.
  void restore_line() { line(kRestoreLineMarker); }
  void append(const Writer& other) { out_ += other.out_; }
  void append_text(const std::string& text) { out_ += text; }
  const std::string& str() const { return out_; }

 private:
  std::string out_;
};

/// A file name safe inside a #line directive: only [A-Za-z0-9._/-], others become '_'.
std::string line_file_name(const std::string& file);
/// What the generated source calls a rule's file in its #line directives: its base name,
/// made safe (line_file_name). Never the path: the source is part of the cache key, which
/// depends on what the kernel is, not on how the program named the file ("x.rule",
/// "./x.rule" and "/abs/x.rule" are one kernel).
std::string rule_file_label(const std::string& file);
/// A C++ float literal for `value` rounded to fp32 ("1.0f", "9.99999994e-09f", fo_inf()).
std::string float_literal(double value);
/// A C++ double literal for `value`, exact ("0.999", "1.0000000000000001e-08", fo_inf_d()).
std::string double_literal(double value);
/// Text safe inside a // comment (no line breaks, no backslash at the end).
std::string sanitize_comment(const std::string& text);

}  // namespace fusedopt::codegen
