// Presets are the embedded files templates/rules/NAME.rule.
#include "presets.hpp"

#include <fmt/format.h>

#include <map>
#include <mutex>

#include "embedded.hpp"
#include "fusedopt/error.hpp"
#include "lang/parse.hpp"

namespace fusedopt {

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const std::string& path : embedded_paths("rules/")) {
    if (path.size() > 11 && path.substr(path.size() - 5) == ".rule") {
      names.push_back(path.substr(6, path.size() - 11));
    }
  }
  return names;
}

std::string preset_text(const std::string& name) {
  for (const std::string& known : preset_names()) {
    if (known == name) return std::string(embedded_file("rules/" + name + ".rule"));
  }
  std::string list;
  for (const std::string& known : preset_names()) list += (list.empty() ? "" : ", ") + known;
  throw UsageError(fmt::format("unknown preset '{}' (presets: {})", name, list));
}

std::shared_ptr<const lang::Rule> preset_rule(const std::string& name) {
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
