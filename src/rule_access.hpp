// fusedopt's own components reach the checked rule behind the public Rule through here.
#pragma once

#include <memory>

#include "fusedopt/kernel.hpp"
#include "lang/ast.hpp"

namespace fusedopt {

/// Rule's friend (kernel.hpp names it, opaque).
struct RuleAccess {
  static const std::shared_ptr<const lang::Rule>& impl(const Rule& rule) { return rule.impl_; }
  static Rule make(std::shared_ptr<const lang::Rule> impl) { return Rule(std::move(impl)); }
};

namespace detail {

/// The checked rule behind `rule`.
inline const lang::Rule& lang_rule(const Rule& rule) { return *RuleAccess::impl(rule); }

}  // namespace detail
}  // namespace fusedopt
