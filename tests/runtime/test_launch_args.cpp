// StepArgs on the host: a launch reads its step as one past the count it points at and does
// nothing when its skip flag is set, as a CUDA launch does (abi.h), so the Optimizer's step
// is the same program on both devices.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cache/kernel_cache.hpp"
#include "common/host_kernel_calls.hpp"
#include "common/host_tensors.hpp"
#include "common/kernel_run.hpp"
#include "presets.hpp"

namespace fusedopt::testing {
namespace {

using fusedopt::runtime::StepArgs;

/// One tensor's roles (param, grad, states) as fresh normal values, and their bits.
struct Roles {
  std::vector<std::vector<float>> v;
  std::vector<std::vector<void*>> ptrs() {
    std::vector<void*> out;
    for (auto& r : v) out.push_back(r.data());
    return {out};
  }
};

Roles make_roles(int roles, std::size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Roles r;
  r.v.assign(static_cast<std::size_t>(roles), std::vector<float>(n));
  for (auto& role : r.v) {
    for (float& x : role) x = normal(rng);
  }
  for (float& x : r.v[2]) x = 0.0f;  // first state: zero, like the rules' initial values
  if (roles > 3) {
    for (float& x : r.v[3]) x = std::abs(x);  // a second moment is not negative
  }
  return r;
}

/// One step of `kernel` over `roles` with `args`: every reduction pass, the update, the
/// scalar states.
void step(const Kernel& kernel, Roles& roles, const StepArgs& args) {
  const std::vector<std::int64_t> numel = {static_cast<std::int64_t>(roles.v[0].size())};
  Kernel::step(*kernel.prepare(roles.ptrs(), numel, {fusedopt::testing::default_hypers(kernel)}),
               args);
}

}  // namespace

TEST_SUITE("runtime") {
  TEST_CASE("a host launch's step is one past its count, and its skip flag skips it") {
    use_private_cache();
    std::mt19937 rng(fresh_seed());
    // Bias corrections read the step; lamb has reduction passes.
    for (const char* name : {"adamw", "lamb", "nadam"}) {
      CAPTURE(name);
      Kernel kernel(fusedopt::preset_rule(name), fusedopt::DTypeBinding{},
                    fusedopt::cache::KernelCache::global());
      const Roles start = make_roles(kernel.num_roles(), 5000, rng);
      const double taken = 6.0;
      Roles by_value = start, by_count = start, skipped = start, not_skipped = start;
      StepArgs value;
      value.step = taken + 1.0;
      step(kernel, by_value, value);
      StepArgs count;
      count.step = 1000.0;  // ignored: the count is read
      count.steps_taken = &taken;
      step(kernel, by_count, count);
      CHECK(by_count.v == by_value.v);
      CHECK(by_value.v != start.v);
      const double set = 1.0, clear = 0.0;
      StepArgs skip = count;
      skip.skip = &set;
      step(kernel, skipped, skip);
      CHECK(skipped.v == start.v);
      skip.skip = &clear;
      step(kernel, not_skipped, skip);
      CHECK(not_skipped.v == by_value.v);
    }
  }
}

}  // namespace fusedopt::testing
