// Small helpers shared by the code generators: a line writer that knows about #line
// directives, and the name sanitising that keeps user text out of generated code.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "fusedopt/dtype.hpp"

namespace fusedopt::codegen {

struct KernelBody;

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
/// A C++ float literal for `value` rounded to fp32 ("1.0f", "9.99999994e-09f", fo_inf()).
std::string float_literal(double value);
/// A C++ double literal for `value`, exact ("0.999", "1.0000000000000001e-08", fo_inf_d()).
std::string double_literal(double value);
/// Text safe inside a // comment (no line breaks, no backslash at the end).
std::string sanitize_comment(const std::string& text);
/// `#define FO_NUM_ROLES ...` and `FO_NUM_HYPERS`.
void emit_common_prologue(Writer& w, const KernelBody& body);
/// The fo_uniform struct for the body's hyper and uniform counts.
std::string uniform_struct(const KernelBody& body);
/// FO_UPDATE_STAGE/STORES, FO_INIT_STAGE/STORES and FO_REDUCE<k>_STAGE/STORES for the CUDA
/// vector path: the roles that fo_element, fo_init_element and fo_reduce_element<k> in
/// `code` load and store (see cuda_kernel.cuh).
std::string staging_macros(const std::string& code, int reduction_passes);

/// C++ storage type of a dtype in generated code ("float", "fo_f16", "fo_bf16").
const char* storage_type(DType dtype);

/// One pointer of fo_tensor: its storage type and whether the kernel writes it.
struct RoleDecl {
  std::string type;
  bool writable = false;
};
/// struct fo_tensor (typed restrict pointers, in role order) and fo_bind.
void emit_tensor_binding(Writer& w, const std::vector<RoleDecl>& roles);

/// fo_grad_finite: whether the unscaled gradient element is finite (role 1 is the grad).
void emit_grad_finite(Writer& w);

/// A hoisted value computed in fo_prepare: the rule line it comes from and its statement.
struct PrepareLine {
  int rule_line = 0;
  std::string text;
};
/// fo_prepare: copies the hypers, step and grad scale, computes the global reduction
/// values (`globals`, statements over the raw totals G), then `lines` in order, each under
/// a #line pointing at `file`.
void emit_prepare(Writer& w, const KernelBody& body, const std::vector<std::string>& globals,
                  const std::vector<PrepareLine>& lines, const std::string& file);

}  // namespace fusedopt::codegen
