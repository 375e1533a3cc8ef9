// The preset rules shipped in templates/rules/ (embedded at build time).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lang/ast.hpp"

namespace fusedopt {

/// Names of the presets, sorted ("adagrad", "adam", "adamw", ...).
std::vector<std::string> preset_names();
/// The text of preset `name`; throws fusedopt::Error naming the known presets otherwise.
std::string preset_text(const std::string& name);
/// The checked rule of preset `name` (file name "presets/NAME.rule" in diagnostics).
std::shared_ptr<const lang::Rule> preset_rule(const std::string& name);

}  // namespace fusedopt
