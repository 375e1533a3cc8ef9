// The optimizer's hypers (hypers.hpp) and check_hyper_value, the one check of a hyper's
// value every entry point applies.
#include "optimizer/hypers.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <set>

#include "fusedopt/error.hpp"
#include "support/check.hpp"

namespace fusedopt {

void check_hyper_value(const std::string& where, const std::string& name, int group, double value) {
  constexpr double kMax = static_cast<double>(std::numeric_limits<float>::max());
  FUSEDOPT_CHECK_USAGE(std::isfinite(value) && std::fabs(value) <= kMax,
                       "{}: hyper '{}' of group {} is {}: a hyper must be a finite number within "
                       "fp32's range (|x| <= {:.8g}), as the kernels read it",
                       where, name, group, value, kMax);
}

namespace runtime {

Hypers::Hypers(const Rule& rule, const std::vector<ParamGroup>& groups) : rule_name_(rule.name()) {
  std::vector<double> defaults;
  for (const auto& [name, value] : rule.hypers()) {
    names_.push_back(name);
    defaults.push_back(value);
  }
  for (std::size_t g = 0; g < groups.size(); ++g) {
    values_.push_back(defaults);
    std::set<std::size_t> given;
    for (const auto& [name, value] : groups[g].hypers) {
      std::size_t k = 0;
      try {
        k = index(name);
      } catch (const Error& e) {
        throw UsageError(fmt::format("group {}: {}", g, e.what()));
      }
      FUSEDOPT_CHECK_USAGE(given.insert(k).second,
                           "group {}: hyper '{}' is given twice (which one should win?)", g, name);
      check_hyper_value("Optimizer", name, static_cast<int>(g), value);
      values_[g][k] = value;
    }
  }
}

std::size_t Hypers::index(const std::string& name) const {
  for (std::size_t k = 0; k < names_.size(); ++k) {
    if (names_[k] == name) return k;
  }
  std::string known;
  for (const std::string& h : names_) known += (known.empty() ? "" : ", ") + h;
  throw UsageError(fmt::format("rule '{}' has no hyper '{}' (it has: {})", rule_name_, name,
                               known.empty() ? "none" : known));
}

double Hypers::get(const char* method, const std::string& name, int group) const {
  const std::size_t k = index(name);
  FUSEDOPT_CHECK_USAGE(!(group < 0 || group >= groups()),
                       "{}('{}'): there is no group {} (the optimizer has {} group{})", method,
                       name, group, groups(), groups() == 1 ? "" : "s");
  return values_[static_cast<std::size_t>(group)][k];
}

void Hypers::assign(const char* method, const std::string& name, double value,
                    std::optional<int> group) {
  const std::size_t k = index(name);
  FUSEDOPT_CHECK_USAGE(!(group && (*group < 0 || *group >= groups())),
                       "{}('{}'): there is no group {} (the optimizer has {} group{})", method,
                       name, *group, groups(), groups() == 1 ? "" : "s");
  check_hyper_value(method, name, group.value_or(0), value);
  for (int g = 0; g < groups(); ++g) {
    if (!group || *group == g) values_[static_cast<std::size_t>(g)][k] = value;
  }
}

std::string Hypers::text() const {
  std::string out;
  for (std::size_t g = 0; g < values_.size(); ++g) {
    out += fmt::format("{}group{}:", g ? ";" : "", g);
    for (std::size_t k = 0; k < names_.size(); ++k) {
      out += fmt::format("{}{}={:.17g}", k ? "," : "", names_[k], values_[g][k]);
    }
  }
  return out;
}

}  // namespace runtime
}  // namespace fusedopt
