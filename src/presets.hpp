// The preset rules shipped in templates/rules/ (embedded at build time).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lang/ast.hpp"

namespace fusedopt {

/// Names of the presets, sorted ("adagrad", "adam", "adam+amsgrad", "adamw", ...). A name
/// "BASE+OPTION" is preset BASE with an option chosen when the rule is compiled (its own
/// rule file: e.g. adam+amsgrad carries the max_v state that plain adam does not).
std::vector<std::string> preset_names();
/// The options of preset `name` ("amsgrad" for "adam"): the OPTION of each "name+OPTION".
std::vector<std::string> preset_options(const std::string& name);
/// The text of preset `name` ("amsgrad" is the old name of "adam+amsgrad"); throws fusedopt::Error
/// naming the known presets otherwise.
std::string preset_text(const std::string& name);
/// The checked rule of preset `name` (file name "presets/NAME.rule" in diagnostics).
std::shared_ptr<const lang::Rule> preset_rule(const std::string& name);

}  // namespace fusedopt
