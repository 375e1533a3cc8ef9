// A rule compiled for the host CPU and loaded: the smallest thing that runs a rule over a
// list of tensors. The full Optimizer (plans, groups, checkpoints) builds on it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fusedopt/dtype.hpp"
#include "lang/ast.hpp"

namespace fusedopt::cache {
class KernelCache;
}

namespace fusedopt::runtime {

class HostKernel {
 public:
  /// Generates, compiles (or loads from `cache`) and dlopens the host kernel of `rule`.
  HostKernel(std::shared_ptr<const lang::Rule> rule, DTypeBinding dtypes,
             cache::KernelCache& cache);
  ~HostKernel();
  HostKernel(const HostKernel&) = delete;
  HostKernel& operator=(const HostKernel&) = delete;

  /// Number of pointers per tensor: param, grad, each state (declaration order), each
  /// output (declaration order), then the fp32 master when dtypes.master.
  int num_roles() const;

  /// One step over every tensor. `ptrs[t]` holds tensor t's num_roles() pointers,
  /// `numel[t]` its element count. `hypers[g]` holds group g's hyper values in the rule's
  /// declaration order (Rule::hypers); `group[t]` is tensor t's group (empty: all group 0).
  /// `step` is 1-based. The gradient is multiplied by `inv_grad_scale` before the rule.
  void run(const std::vector<std::vector<void*>>& ptrs, const std::vector<std::int64_t>& numel,
           const std::vector<std::vector<float>>& hypers, float step,
           const std::vector<int>& group = {}, float inv_grad_scale = 1.0f) const;

  /// Writes every state tensor's initial value (the rule's `state NAME = INIT`; with a
  /// master copy, the master from the param first). Same arguments as run().
  void init_states(const std::vector<std::vector<void*>>& ptrs,
                   const std::vector<std::int64_t>& numel,
                   const std::vector<std::vector<float>>& hypers,
                   const std::vector<int>& group = {}) const;

  /// Whether every gradient element times `inv_grad_scale` is finite (one pass over the
  /// gradients; run it before a grad-scaled step). Same arguments as run().
  bool grads_finite(const std::vector<std::vector<void*>>& ptrs,
                    const std::vector<std::int64_t>& numel,
                    const std::vector<std::vector<float>>& hypers, float inv_grad_scale,
                    const std::vector<int>& group = {}) const;

  /// The hyper values of the rule's defaults, in Rule::hypers order.
  std::vector<float> default_hypers() const;
  /// Copies `hypers` with `name` set to `value`; throws fusedopt::Error for an unknown name.
  std::vector<float> with_hyper(std::vector<float> hypers, const std::string& name,
                                float value) const;

  const lang::Rule& rule() const { return *rule_; }
  /// Where the binary came from ("compiled", "memory", "disk").
  const std::string& origin() const { return origin_; }

 private:
  struct Impl;
  std::shared_ptr<const lang::Rule> rule_;
  DTypeBinding dtypes_;
  std::string origin_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fusedopt::runtime
