// The runtime tests' shared fixtures and the preset runner (see host_tensors.hpp).
#include "common/host_tensors.hpp"

#include <doctest/doctest.h>
#include <stdlib.h>  // setenv

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <stdexcept>

#include "common/temp_dir.hpp"

namespace fusedopt::testing {

namespace {

struct PrivateCacheDir {
  fusedopt::testing::TempDir dir;
  PrivateCacheDir() {
    // Under CTest, the build folder's kernel cache for tests (FUSEDOPT_TEST_KERNEL_CACHE):
    // each kernel compiled once per build rather than once per suite; the user's cache
    // never.
    const char* shared = std::getenv("FUSEDOPT_TEST_KERNEL_CACHE");
    setenv("FUSEDOPT_CACHE_DIR", shared && *shared ? shared : dir.path().c_str(), 1);
    setenv("FUSEDOPT_CACHE", "on", 1);
  }
};

}  // namespace

void use_private_cache() {
  // Constructed before the first Optimizer (so before KernelCache::global() reads the
  // environment), destroyed at exit.
  static PrivateCacheDir dir;
  (void)dir;
}

std::uint32_t fresh_seed() {
  if (const char* s = std::getenv("FUSEDOPT_TEST_SEED")) {
    return static_cast<std::uint32_t>(std::strtoul(s, nullptr, 10));
  }
  return std::random_device{}();
}

std::vector<std::pair<std::string, double>> overrides(const Hypers& h) {
  return {h.begin(), h.end()};
}

const std::vector<PresetRef>& preset_refs() {
  auto zeros = [](std::size_t n) {
    return [n](const Hypers&) { return std::vector<double>(n, 0.0); };
  };
  static const std::vector<PresetRef> table = {
      {"sgd",
       with(kSgdDefaults, {{"lr", 1e-2}, {"momentum", 0.9}, {"weight_decay", 0.01}}),
       {"momentum_buffer"},
       zeros(1),
       sgd_reference},
      {"adam",
       with(kAdamDefaults, {{"lr", 1e-2}, {"weight_decay", 0.1}}),
       {"m", "v"},
       zeros(2),
       [](const Hypers& h) { return adam_reference(h, false, false); }},
      {"adamw",
       with(kAdamWDefaults, {{"lr", 1e-2}}),
       {"m", "v"},
       zeros(2),
       [](const Hypers& h) { return adam_reference(h, true, false); }},
      {"adam+amsgrad",
       with(kAdamDefaults, {{"lr", 1e-2}, {"beta2", 0.9}}),
       {"m", "v", "max_v"},
       zeros(3),
       [](const Hypers& h) { return adam_reference(h, false, true); }},
      {"adamw+amsgrad",
       with(kAdamWDefaults, {{"lr", 1e-2}, {"beta2", 0.9}}),
       {"m", "v", "max_v"},
       zeros(3),
       [](const Hypers& h) { return adam_reference(h, true, true); }},
      {"adagrad",
       with(kAdagradDefaults, {{"lr_decay", 0.05}, {"initial_accumulator_value", 0.5}}),
       {"sum"},
       [](const Hypers& h) { return std::vector<double>{hyper(h, "initial_accumulator_value")}; },
       adagrad_reference},
      {"rmsprop",
       with(kRmspropDefaults, {{"lr", 1e-3}, {"centered", 1}, {"momentum", 0.9}}),
       {"square_avg", "grad_avg", "momentum_buffer"},
       zeros(3),
       rmsprop_reference},
      {"adamax",
       with(kAdamaxDefaults, {{"lr", 1e-2}}),
       {"m", "exp_inf"},
       zeros(2),
       adamax_reference},
      {"nadam",
       with(kNadamDefaults, {{"lr", 1e-2}, {"weight_decay", 0.1}}),
       {"m", "v", "mu_prod"},
       [](const Hypers&) {
         return std::vector<double>{0, 0, 1};
       },
       nadam_reference},
      {"lion",
       with(kLionDefaults, {{"lr", 1e-3}, {"weight_decay", 0.1}}),
       {"m"},
       zeros(1),
       lion_reference},
      {"bertadam",
       with(kBertAdamDefaults, {{"lr", 1e-2}}),
       {"m", "v"},
       zeros(2),
       bertadam_reference},
  };
  return table;
}

const PresetRef& preset_ref(const std::string& name) {
  for (const PresetRef& r : preset_refs()) {
    if (r.name == name) return r;
  }
  throw std::logic_error("no reference for preset '" + name + "'");
}

fusedopt::OptimizerStats run_preset_through_optimizer(const std::string& name,
                                                      const std::vector<std::int64_t>& sizes,
                                                      const std::vector<int>& group_of,
                                                      const std::vector<Hypers>& groups, int steps,
                                                      std::int64_t misalign) {
  use_private_cache();
  const PresetRef& pr = preset_ref(name);
  const std::uint32_t seed = fresh_seed();
  INFO("preset " << name << " through Optimizer, " << sizes.size() << " tensors, seed " << seed
                 << " (FUSEDOPT_TEST_SEED=" << seed << " replays it)");
  std::mt19937 rng(seed);
  const std::size_t nt = sizes.size();
  const std::size_t ns = pr.states.size();

  std::vector<HostTensor> p, g;
  p.reserve(nt);
  g.reserve(nt);
  std::vector<fusedopt::ParamGroup> pg(groups.size());
  for (std::size_t k = 0; k < groups.size(); ++k) pg[k].hypers = overrides(groups[k]);
  std::vector<std::vector<double>> rp(nt), rs(nt), slack(nt);
  std::vector<int> param_index(nt);  // tensor k's index in the optimizer (group order)
  for (std::size_t k = 0; k < nt; ++k) {
    p.emplace_back(sizes[k], fusedopt::DType::F32, misalign);
    g.emplace_back(sizes[k], fusedopt::DType::F32, misalign);
    fill_normal(p[k], rng);
    const int gr = group_of[k];
    rp[k].resize(static_cast<std::size_t>(sizes[k]));
    for (std::int64_t i = 0; i < sizes[k]; ++i) rp[k][static_cast<std::size_t>(i)] = p[k].get(i);
    const std::vector<double> init = pr.init(groups[static_cast<std::size_t>(gr)]);
    rs[k].resize(static_cast<std::size_t>(sizes[k]) * ns);
    for (std::int64_t i = 0; i < sizes[k]; ++i) {
      for (std::size_t j = 0; j < ns; ++j) rs[k][static_cast<std::size_t>(i) * ns + j] = init[j];
    }
    slack[k].assign(static_cast<std::size_t>(sizes[k]), 0.0);
    pg[static_cast<std::size_t>(gr)].params.push_back(p[k].tensor("t" + std::to_string(k)));
    pg[static_cast<std::size_t>(gr)].grads.push_back(g[k].tensor());
  }
  int next = 0;
  for (std::size_t gr = 0; gr < groups.size(); ++gr) {
    for (std::size_t k = 0; k < nt; ++k) {
      if (static_cast<std::size_t>(group_of[k]) == gr) param_index[k] = next++;
    }
  }
  fusedopt::Optimizer opt(fusedopt::Rule::preset(name), pg);
  // One launch, plus the per-tensor scalar states' write for a rule that has them.
  const int scalar_launch = fusedopt::Rule::preset(name).scalars().empty() ? 0 : 1;
  REQUIRE(opt.stats().launches_per_step <= 1 + scalar_launch);
  std::vector<RefStep> refs;
  for (const Hypers& h : groups) refs.push_back(pr.reference(h));

  for (int t = 1; t <= steps; ++t) {
    for (HostTensor& x : g) fill_normal(x, rng);
    opt.step();
    REQUIRE(opt.step_count() == t);
    std::vector<double> p_scale(groups.size(), 0.0);
    std::vector<std::vector<double>> s_scale(groups.size(), std::vector<double>(ns, 0.0));
    for (std::size_t k = 0; k < nt; ++k) {
      const auto gr = static_cast<std::size_t>(group_of[k]);
      for (std::int64_t i = 0; i < sizes[k]; ++i) {
        const auto e = static_cast<std::size_t>(i);
        slack[k][e] += refs[gr](t, rp[k][e], g[k].get(i), &rs[k][e * ns]);
        p_scale[gr] = std::max(p_scale[gr], std::abs(rp[k][e]));
        for (std::size_t j = 0; j < ns; ++j) {
          s_scale[gr][j] = std::max(s_scale[gr][j], std::abs(rs[k][e * ns + j]));
        }
      }
    }
    long long bad = 0;
    std::string first_bad;
    auto check = [&](const std::string& what, std::size_t k, std::int64_t i, double got,
                     double want, double allowed) {
      if (std::abs(got - want) <= allowed) return;
      if (bad++ == 0) {
        first_bad = "step " + std::to_string(t) + ", tensor " + std::to_string(k) + ", element " +
                    std::to_string(i) + ", " + what + ": fused " + fmt_double(got) +
                    ", reference " + fmt_double(want) + ", allowed " + fmt_double(allowed);
      }
    };
    for (std::size_t k = 0; k < nt; ++k) {
      const auto gr = static_cast<std::size_t>(group_of[k]);
      std::vector<fusedopt::Tensor> states;
      for (const std::string& s : pr.states) states.push_back(opt.state(s, param_index[k]));
      for (std::int64_t i = 0; i < sizes[k]; ++i) {
        const auto e = static_cast<std::size_t>(i);
        check("param", k, i, p[k].get(i), rp[k][e],
              kTol * (std::abs(rp[k][e]) + p_scale[gr]) + slack[k][e]);
        for (std::size_t j = 0; j < ns; ++j) {
          const double want = rs[k][e * ns + j];
          check(pr.states[j], k, i, at(states[j], i), want,
                kTol * (std::abs(want) + s_scale[gr][j]));
        }
      }
    }
    if (bad) {
      FAIL_CHECK(bad << " values out of tolerance; first: " << first_bad);
      break;
    }
  }
  return opt.stats();
}

}  // namespace fusedopt::testing
