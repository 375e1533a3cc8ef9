// Per-tensor scalar states (`scalar NAME = INIT`) through the Optimizer on the host: one
// double per tensor (empty tensors included), updated exactly once per step, untouched by
// a skipped scaled step, visible through state(), counted by stats(), and round-tripped
// through a checkpoint; NAdam on a scalar moves Adam's bytes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/host_tensors.hpp"
#include "common/temp_dir.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/optimizer.hpp"
#include "io/safetensors.hpp"

namespace fusedopt::testing {
namespace {

using fusedopt::DType;
using fusedopt::Optimizer;
using fusedopt::Rule;

/// Counts its steps in `count`, keeps f^t in `prod` (f per group) and steps the param by
/// lr * count * g, so a count off by one shows in the params as well as in the state.
const char* kCounter = R"(
param p
grad  g
state m = 0
scalar count = 0, prod = start
hyper lr = 0.1, f = 0.5, start = 1
count = count + 1
prod = prod * f
m = m + g
p = p - lr * count * g
)";

/// A scalar state's value for param `i`.
double scalar(const Optimizer& opt, const std::string& name, int i) {
  const fusedopt::Tensor t = opt.state(name, i);
  REQUIRE(t.dtype == DType::F64);
  REQUIRE(t.numel == 1);
  double x = 0;
  std::memcpy(&x, t.data, sizeof x);
  return x;
}

/// Params of several sizes (one empty, one empty of a dtype no other param has) and dtypes
/// (fp32 and bf16: two kernels), in two groups.
struct Params {
  std::vector<HostTensor> p, g;
  std::vector<int> group;
  Params() {
    const std::vector<std::int64_t> sizes = {7, 0, 4099, 1009, 0, 2};
    const std::vector<DType> dtypes = {DType::F32, DType::F32, DType::BF16,
                                       DType::F32, DType::F16, DType::BF16};
    std::mt19937 rng(fresh_seed());
    std::normal_distribution<double> normal(0.0, 1.0);
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      p.emplace_back(sizes[k], dtypes[k]);
      g.emplace_back(sizes[k], dtypes[k]);
      for (std::int64_t i = 0; i < sizes[k]; ++i) p[k].set(i, normal(rng));
      group.push_back(static_cast<int>(k % 2));
    }
  }
  /// Group 1 has f = 0.25 and prod starting at 2.
  std::vector<fusedopt::ParamGroup> groups() {
    std::vector<fusedopt::ParamGroup> out(2);
    for (std::size_t k = 0; k < p.size(); ++k) {
      out[static_cast<std::size_t>(group[k])].params.push_back(
          p[k].tensor("t" + std::to_string(k)));
      out[static_cast<std::size_t>(group[k])].grads.push_back(g[k].tensor());
    }
    out[1].hypers = {{"f", 0.25}, {"start", 2}};
    return out;
  }
  /// Param index in the optimizer (group order) of tensor k.
  int index(std::size_t k) const {
    int n = 0;
    for (int gr = 0; gr < 2; ++gr) {
      for (std::size_t j = 0; j < p.size(); ++j) {
        if (group[j] != gr) continue;
        if (j == k) return n;
        ++n;
      }
    }
    return -1;
  }
  void fill_grads(std::mt19937& rng) {
    for (HostTensor& x : g) fill_normal(x, rng);
  }
};

/// Checks every tensor's scalars after `t` steps.
void check_scalars(const Optimizer& opt, const Params& m, int t) {
  for (std::size_t k = 0; k < m.p.size(); ++k) {
    INFO("tensor " << k << " (" << m.p[k].numel() << " elements), after " << t << " steps");
    const int i = m.index(k);
    CHECK(scalar(opt, "count", i) == t);
    const double f = m.group[k] == 0 ? 0.5 : 0.25, start = m.group[k] == 0 ? 1 : 2;
    CHECK(scalar(opt, "prod", i) == start * std::pow(f, t));  // exact: powers of two
  }
}

}  // namespace

TEST_SUITE("runtime") {
  TEST_CASE("a scalar state is one double per tensor, updated once per step, empty ones too") {
    use_private_cache();
    Params m;
    const Rule counter = Rule::parse(kCounter, "counter.rule");
    CHECK(counter.scalars() == std::vector<std::string>{"count", "prod"});
    CHECK(counter.states() == std::vector<std::string>{"m"});
    Optimizer opt(counter, m.groups());
    check_scalars(opt, m, 0);  // the initial values, per group
    const fusedopt::Tensor view = opt.state("count", m.index(2));
    CHECK(view.name == "t2/count");
    CHECK(view.device == fusedopt::Device::host());

    std::mt19937 rng(fresh_seed());
    std::vector<std::vector<double>> ref(m.p.size());
    for (std::size_t k = 0; k < m.p.size(); ++k) {
      for (std::int64_t i = 0; i < m.p[k].numel(); ++i) ref[k].push_back(m.p[k].get(i));
    }
    for (int t = 1; t <= 5; ++t) {
      m.fill_grads(rng);
      opt.step();
      check_scalars(opt, m, t);
      // The update read this step's count (1, 2, ...): p -= lr * t * g.
      for (std::size_t k = 0; k < m.p.size(); ++k) {
        for (std::int64_t i = 0; i < m.p[k].numel(); ++i) {
          auto& r = ref[k][static_cast<std::size_t>(i)];
          r -= 0.1 * t * m.g[k].get(i);
          if (m.p[k].dtype() == DType::F32) {
            CHECK(std::abs(m.p[k].get(i) - r) <= 1e-5 * (1 + std::abs(r)));
          } else {
            r = m.p[k].get(i);  // 16-bit params (no master): follow the stored value
          }
        }
      }
    }
    // A scalar is a state like any other: 16 bytes per tensor here, in stats().
    fusedopt::OptimizerStats st = opt.stats();
    Optimizer without(Rule::parse(R"(
param p
grad  g
state m = 0
hyper lr = 0.1, f = 0.5, start = 1
m = m + g * f * start
p = p - lr * g
)",
                                  "no-scalars.rule"),
                      Params().groups());
    CHECK(st.state_bytes == without.stats().state_bytes + m.p.size() * 2 * sizeof(double));
    CHECK(st.bytes_per_step == without.stats().bytes_per_step);
  }

  TEST_CASE("a skipped scaled step leaves scalar states as they were") {
    use_private_cache();
    Params m;
    Optimizer opt(Rule::parse(kCounter, "counter.rule"), m.groups());
    std::mt19937 rng(fresh_seed());
    m.fill_grads(rng);
    CHECK(opt.step_scaled(0.5f).taken());
    check_scalars(opt, m, 1);
    m.g[3].set(17, std::numeric_limits<double>::infinity());
    CHECK_FALSE(opt.step_scaled(0.5f).taken());
    CHECK(opt.step_count() == 1);
    check_scalars(opt, m, 1);
    m.fill_grads(rng);
    CHECK(opt.step_scaled(0.5f).taken());
    check_scalars(opt, m, 2);
  }

  TEST_CASE("scalar states round-trip through a checkpoint") {
    use_private_cache();
    fusedopt::testing::TempDir dir;
    const std::string path = (dir.path() / "counter.safetensors").string();
    Params a;
    Optimizer opt(Rule::parse(kCounter, "counter.rule"), a.groups());
    std::mt19937 rng(fresh_seed());
    for (int t = 0; t < 3; ++t) {
      a.fill_grads(rng);
      opt.step();
    }
    opt.save(path);
    // In the file: one F64 of shape [1] per tensor and scalar, empty tensors included.
    const fusedopt::io::SafetensorsFile file = fusedopt::io::read_safetensors(path);
    for (std::size_t k = 0; k < a.p.size(); ++k) {
      const std::string name = "t" + std::to_string(k) + "/count";
      REQUIRE(file.tensors.count(name) == 1);
      CHECK(file.tensors.at(name).dtype == "F64");
      CHECK(file.tensors.at(name).shape == std::vector<std::int64_t>{1});
      double x = 0;
      std::memcpy(&x, file.tensor_data(name), sizeof x);
      CHECK(x == 3);
    }

    Params b;
    for (std::size_t k = 0; k < a.p.size(); ++k) {
      for (std::int64_t i = 0; i < a.p[k].numel(); ++i) b.p[k].set(i, a.p[k].get(i));
    }
    Optimizer loaded(Rule::parse(kCounter, "counter.rule"), b.groups());
    check_scalars(loaded, b, 0);
    loaded.load(path);
    check_scalars(loaded, b, 3);
    // The same next step, bit for bit.
    a.fill_grads(rng);
    for (std::size_t k = 0; k < a.p.size(); ++k) {
      for (std::int64_t i = 0; i < a.p[k].numel(); ++i) b.g[k].set(i, a.g[k].get(i));
    }
    opt.step();
    loaded.step();
    check_scalars(loaded, b, 4);
    for (std::size_t k = 0; k < a.p.size(); ++k) {
      for (std::int64_t i = 0; i < a.p[k].numel(); ++i) {
        INFO("tensor " << k << ", element " << i);
        CHECK(a.p[k].get(i) == b.p[k].get(i));
      }
    }
  }

  TEST_CASE("a scalar state assigned from a per-tensor reduction: the step's norm, kept") {
    use_private_cache();
    // peak: the largest gradient norm seen so far, per tensor; the update scales by it.
    const Rule rule = Rule::parse(R"(
param p
grad  g
scalar peak = 0
hyper lr = 0.1
peak = max(peak, tensor_norm(g))
p = p - lr * g / (peak + 1)
)",
                                  "peak.rule");
    CHECK(rule.reduction_passes() == 1);
    std::mt19937 rng(fresh_seed());
    const std::vector<std::int64_t> sizes = {3, 0, 70000, 1009};
    std::vector<HostTensor> p, g;
    fusedopt::ParamGroup group;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      p.emplace_back(sizes[k], DType::F32);
      g.emplace_back(sizes[k], DType::F32);
      fill_normal(p[k], rng);
      group.params.push_back(p[k].tensor("w" + std::to_string(k)));
      group.grads.push_back(g[k].tensor());
    }
    Optimizer opt(rule, {group});
    std::vector<double> peak(sizes.size(), 0.0);
    std::vector<std::vector<double>> ref(sizes.size());
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      for (std::int64_t i = 0; i < sizes[k]; ++i) ref[k].push_back(p[k].get(i));
    }
    std::uniform_real_distribution<double> spread(0.1, 3.0);
    for (int t = 1; t <= 6; ++t) {
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        const double s = spread(rng);  // norms that rise and fall between steps
        double sq = 0;
        for (std::int64_t i = 0; i < sizes[k]; ++i) {
          g[k].set(i, s * std::normal_distribution<double>()(rng));
          sq += g[k].get(i) * g[k].get(i);
        }
        peak[k] = std::max(peak[k], std::sqrt(sq));
        for (std::int64_t i = 0; i < sizes[k]; ++i) {
          ref[k][static_cast<std::size_t>(i)] -= 0.1 * g[k].get(i) / (peak[k] + 1);
        }
      }
      opt.step();
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        INFO("step " << t << ", tensor " << k);
        CHECK(std::abs(scalar(opt, "peak", static_cast<int>(k)) - peak[k]) <= 1e-5 * peak[k]);
        for (std::int64_t i = 0; i < sizes[k]; ++i) {
          const double r = ref[k][static_cast<std::size_t>(i)];
          REQUIRE(std::abs(p[k].get(i) - r) <= 1e-5 * (1 + std::abs(r)));
        }
      }
    }
  }

  TEST_CASE("nadam keeps mu_prod per tensor and moves Adam's bytes per element") {
    use_private_cache();
    HostTensor p(1000, DType::F32), g(1000, DType::F32);
    auto stats_of = [&](const char* preset) {
      std::vector<fusedopt::ParamGroup> groups(1);
      groups[0].params.push_back(p.tensor("w"));
      groups[0].grads.push_back(g.tensor());
      return Optimizer(Rule::preset(preset), groups).stats();
    };
    const fusedopt::OptimizerStats nadam = stats_of("nadam"), adamw = stats_of("adamw");
    CHECK(nadam.bytes_per_step == adamw.bytes_per_step);
    CHECK(nadam.bytes_per_step == 28 * 1000);
    CHECK(nadam.state_bytes == adamw.state_bytes + sizeof(double));
  }
}

}  // namespace fusedopt::testing
