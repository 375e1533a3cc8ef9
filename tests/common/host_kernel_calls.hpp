// One-shot kernel calls for the tests: plan a tensor list, then run, initialise or check it
// once. The library plans once (a runtime::Binding) and launches many times.
#pragma once

#include <fmt/format.h>

#include <string>
#include <vector>

#include "common/kernel_run.hpp"
#include "fusedopt/error.hpp"

namespace fusedopt::testing {

/// The hyper values of the rule's defaults, in Rule::hypers order.
inline std::vector<double> default_hypers(const testing::Kernel& k) {
  std::vector<double> out;
  for (int h : k.rule().hypers) out.push_back(k.rule().symbols[h].default_value);
  return out;
}

/// `hypers` with `name` set to `value`; throws fusedopt::Error for an unknown name.
inline std::vector<double> with_hyper(const testing::Kernel& k, std::vector<double> hypers,
                                      const std::string& name, double value) {
  const lang::Rule& rule = k.rule();
  for (std::size_t i = 0; i < rule.hypers.size(); ++i) {
    if (rule.symbols[rule.hypers[i]].name == name) {
      if (hypers.size() != rule.hypers.size()) {
        throw Error(fmt::format("with_hyper: {} values given, rule '{}' has {} hypers",
                                hypers.size(), rule.name, rule.hypers.size()));
      }
      hypers[i] = value;
      return hypers;
    }
  }
  throw Error(fmt::format("rule '{}' has no hyper '{}'", rule.name, name));
}

/// One step over a temporary plan (the arguments of Kernel::prepare).
inline void run(const testing::Kernel& k, const std::vector<std::vector<void*>>& ptrs,
                const std::vector<std::int64_t>& numel,
                const std::vector<std::vector<double>>& hypers, double step,
                const std::vector<int>& group = {}, float inv_grad_scale = 1.0f) {
  testing::Kernel::step(*k.prepare(ptrs, numel, hypers, group), step, inv_grad_scale);
}

/// Writes every state's initial value over a temporary plan.
inline void init_states(const testing::Kernel& k, const std::vector<std::vector<void*>>& ptrs,
                        const std::vector<std::int64_t>& numel,
                        const std::vector<std::vector<double>>& hypers,
                        const std::vector<int>& group = {}) {
  k.prepare(ptrs, numel, hypers, group)->init_states();
}

/// Whether every gradient times `inv_grad_scale` is finite, over a temporary plan.
inline bool grads_finite(const testing::Kernel& k, const std::vector<std::vector<void*>>& ptrs,
                         const std::vector<std::int64_t>& numel,
                         const std::vector<std::vector<double>>& hypers, float inv_grad_scale,
                         const std::vector<int>& group = {}) {
  return k.grads_finite(*k.prepare(ptrs, numel, hypers, group), inv_grad_scale);
}

}  // namespace fusedopt::testing
