// The optimizer's hypers: one value per (group, hyper of the rule), in double precision as
// set, checked as the kernels read them; and their text in checkpoints.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "fusedopt/optimizer.hpp"

namespace fusedopt::runtime {

class Hypers {
 public:
  Hypers() = default;
  /// The rule's hypers for each of `groups`: the rule's defaults, then the group's own
  /// (each checked, errors naming the group).
  Hypers(const Rule& rule, const std::vector<ParamGroup>& groups);

  /// The rule's hyper names, in Rule::hypers order.
  const std::vector<std::string>& names() const { return names_; }
  /// [group][hyper], as the kernels read them (double: fo_prepare rounds each use once).
  const std::vector<std::vector<double>>& values() const { return values_; }
  /// Replaces every value (a checkpoint's, checked by its reader).
  void replace(std::vector<std::vector<double>> values) { values_ = std::move(values); }
  int groups() const { return static_cast<int>(values_.size()); }

  /// Index of hyper `name`; throws UsageError listing the rule's hypers otherwise.
  std::size_t index(const std::string& name) const;
  /// Hyper `name` of `group` (`method` names the caller in errors).
  double get(const char* method, const std::string& name, int group) const;
  /// Sets hyper `name` of one group (or all); `method` names the caller in errors.
  void assign(const char* method, const std::string& name, double value, std::optional<int> group);
  /// "group0:lr=0.001,beta1=0.90000000000000002;group1:...", 17 significant digits so
  /// every double reads back exactly (checkpoint metadata).
  std::string text() const;

 private:
  std::string rule_name_;
  std::vector<std::string> names_;
  std::vector<std::vector<double>> values_;
};

}  // namespace fusedopt::runtime
