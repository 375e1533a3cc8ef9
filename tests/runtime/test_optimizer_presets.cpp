// Every preset through the Optimizer (plan once, one launch per step) against its float64
// reference: several tensors in two param groups with different hypers, 100 steps, and the
// edge layouts (empty tensors anywhere, 10,000 small tensors, misaligned pointers).
#include <doctest/doctest.h>

#include <random>

#include "common/host_tensors.hpp"

namespace fusedopt::testing {
namespace {

/// Group 1 trains more slowly than group 0 (and, where the preset has it, decays less).
Hypers second_group(const Hypers& h) {
  Hypers out = h;
  out["lr"] = h.at("lr") * 0.3;
  if (out.count("weight_decay")) out["weight_decay"] = h.at("weight_decay") * 0.5;
  return out;
}

}  // namespace

TEST_SUITE("runtime") {
  TEST_CASE("every preset through Optimizer matches its float64 reference over 100 steps") {
    const std::vector<std::int64_t> sizes = {1000, 4099, 7, 1, 0, 33};
    const std::vector<int> group_of = {0, 1, 0, 1, 0, 1};
    for (const PresetRef& pr : preset_refs()) {
      INFO("preset " << pr.name);
      run_preset_through_optimizer(pr.name, sizes, group_of, {pr.hypers, second_group(pr.hypers)},
                                   100);
    }
  }

  TEST_CASE("empty tensors first, in the middle and last are skipped and the rest still match") {
    const Hypers h = preset_ref("adamw").hypers;
    run_preset_through_optimizer("adamw", {0, 5, 0, 300, 0}, {0, 0, 0, 0, 0}, {h}, 10);
    run_preset_through_optimizer("adamw", {0, 0, 70000}, {0, 1, 1}, {h, second_group(h)}, 3);
  }

  TEST_CASE("10,000 tensors of random sizes take one launch per step and match the reference") {
    std::mt19937 rng(fresh_seed());
    std::uniform_int_distribution<std::int64_t> size(0, 300);
    std::vector<std::int64_t> sizes(10000);
    std::vector<int> group_of(sizes.size());
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      sizes[k] = size(rng);
      group_of[k] = static_cast<int>(k % 3 == 0);
    }
    const Hypers h = preset_ref("adamw").hypers;
    const fusedopt::OptimizerStats st =
        run_preset_through_optimizer("adamw", sizes, group_of, {h, second_group(h)}, 3);
    CHECK(st.tensors == 10000);
    CHECK(st.launches_per_step == 1);
  }

  TEST_CASE("fp32 tensors one float past an aligned address match the reference") {
    const Hypers h = preset_ref("adam").hypers;
    run_preset_through_optimizer("adam", {1, 17, 1000, 4099}, {0, 1, 0, 1}, {h, second_group(h)},
                                 10, 1);
  }
}

}  // namespace fusedopt::testing
