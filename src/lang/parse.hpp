// Entry points of the rule language: text in, checked Rule out, or a RuleError.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "lang/ast.hpp"
#include "lang/limits.hpp"

namespace fusedopt::lang {

/// Changes applied to a rule while it is built.
struct ParseOptions {
  /// Clip the gradient by its global norm before the rule sees it (torch's
  /// clip_grad_norm_): the rule gains a hyper `max_grad_norm` (this default) and two
  /// statements in front, `fo_grad_norm = global_norm(G)` and
  /// `g = G * min(1, max_grad_norm / (fo_grad_norm + 1e-6))`, where G is the raw gradient.
  /// The rule's name gets "+clip".
  bool clip_grad_norm = false;
  double max_grad_norm = 1.0;
};

/// Lexes, parses and checks `text`. `file` names the source in diagnostics. Throws
/// fusedopt::RuleError for any malformed input.
std::shared_ptr<const Rule> parse_rule(std::string_view text, const std::string& file,
                                       const ParseOptions& options = {});

}  // namespace fusedopt::lang
