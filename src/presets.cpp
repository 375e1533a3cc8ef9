// Presets are the embedded files templates/rules/NAME.rule.
#include "presets.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "embedded.hpp"
#include "fusedopt/error.hpp"
#include "lang/parse.hpp"

namespace fusedopt {
namespace {

/// Other names of presets: amsgrad, before it became an option of adam; sgd+exact, the option
/// exact of sgd, whose default form is already torch's operation order (the option exists so
/// that exact=True means the same for sgd, adam and adamw).
const std::map<std::string, std::string>& aliases() {
  static const std::map<std::string, std::string> a = {{"amsgrad", "adam+amsgrad"},
                                                       {"sgd+exact", "sgd"}};
  return a;
}

std::string canonical(const std::string& name) {
  auto it = aliases().find(name);
  return it == aliases().end() ? name : it->second;
}

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const std::string& path : embedded_paths("rules/")) {
    if (path.size() > 11 && path.substr(path.size() - 5) == ".rule") {
      names.push_back(path.substr(6, path.size() - 11));
    }
  }
  std::sort(names.begin(), names.end());  // by name: "adam" before "adam+amsgrad"
  return names;
}

std::vector<std::string> preset_options(const std::string& name) {
  std::vector<std::string> options;
  const std::string prefix = name + "+";
  for (const std::string& known : preset_names()) {
    if (known.rfind(prefix, 0) == 0) options.push_back(known.substr(prefix.size()));
  }
  for (const auto& [alias, target] : aliases()) {
    if (alias.rfind(prefix, 0) == 0) options.push_back(alias.substr(prefix.size()));
  }
  std::sort(options.begin(), options.end());
  return options;
}

std::string preset_text(const std::string& requested) {
  const std::string name = canonical(requested);
  for (const std::string& known : preset_names()) {
    if (known == name) return std::string(embedded_file("rules/" + name + ".rule"));
  }
  std::string list;
  for (const std::string& known : preset_names()) list += (list.empty() ? "" : ", ") + known;
  throw UsageError(fmt::format("unknown preset '{}' (presets: {})", requested, list));
}

std::shared_ptr<const lang::Rule> preset_rule(const std::string& requested) {
  const std::string name = canonical(requested);
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<const lang::Rule>> parsed;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = parsed.find(name);
  if (it != parsed.end()) return it->second;
  auto rule = lang::parse_rule(preset_text(name), "presets/" + name + ".rule");
  parsed.emplace(name, rule);
  return rule;
}

}  // namespace fusedopt
