// What a framework front end (PyTorch's) needs of the Optimizer on the host: rebind()
// points params and grads at new memory between steps (a .grad that moved), set_step_count()
// restores a count kept elsewhere, step_amp() takes torch's GradScaler protocol (grad_scale,
// found_inf). Each against a float64 reference written here, on fresh random data.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/close.hpp"
#include "common/host_tensors.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/optimizer.hpp"

TEST_SUITE_BEGIN("runtime");

namespace fusedopt::testing {
namespace {

using fusedopt::DType;
using fusedopt::Optimizer;
using fusedopt::Rule;

/// Momentum whose step size grows with the step, so a wrong count shows in the params.
const char* kRule = R"(
param p
grad  g
state m = 0
hyper lr = 0.01, beta = 0.9
m = beta * m + g
p = p - lr * step * m
)";

/// The float64 reference of kRule for one tensor.
struct Reference {
  std::vector<double> p, m;
  void step(const std::vector<double>& g, double t, double lr = 0.01, double beta = 0.9) {
    for (std::size_t i = 0; i < p.size(); ++i) {
      m[i] = beta * m[i] + g[i];
      p[i] -= lr * t * m[i];
    }
  }
};

/// Sizes that take the vector and the scalar paths, and an empty tensor.
const std::vector<std::int64_t> kSizes = {1031, 0, 64, 5};

struct Setup {
  std::mt19937 rng{fresh_seed()};
  std::vector<HostTensor> p, g;
  std::vector<Reference> ref;
  Setup() {
    for (std::int64_t n : kSizes) {
      p.emplace_back(n, DType::F32);
      g.emplace_back(n, DType::F32);
      Reference r;
      std::normal_distribution<double> d;
      for (std::int64_t i = 0; i < n; ++i) {
        p.back().set(i, d(rng));
        r.p.push_back(p.back().get(i));
      }
      r.m.assign(static_cast<std::size_t>(n), 0.0);
      ref.push_back(std::move(r));
    }
  }
  Optimizer make() {
    fusedopt::ParamGroup group;
    for (std::size_t i = 0; i < p.size(); ++i) {
      group.params.push_back(p[i].tensor("p" + std::to_string(i)));
      group.grads.push_back(g[i].tensor());
    }
    return Optimizer(Rule::parse(kRule, "rebind.rule"), {group});
  }
  /// Fresh gradients written into `into` (one per tensor), returned as doubles.
  std::vector<std::vector<double>> fill(std::vector<HostTensor>& into) {
    std::vector<std::vector<double>> out;
    std::normal_distribution<double> d;
    for (HostTensor& t : into) {
      std::vector<double> v;
      for (std::int64_t i = 0; i < t.numel(); ++i) {
        t.set(i, d(rng));
        v.push_back(t.get(i));
      }
      out.push_back(std::move(v));
    }
    return out;
  }
};

TEST_CASE("rebind points the grads (and params) at new memory between steps") {
  use_private_cache();
  Setup s;
  Optimizer opt = s.make();
  // Grads in new memory each step, some misaligned (the scalar path), as a .grad that
  // zero_grad(set_to_none=True) freed and backward allocated again.
  for (int t = 1; t <= 6; ++t) {
    std::vector<HostTensor> grads;
    for (std::int64_t n : kSizes) grads.emplace_back(n, DType::F32, t % 2);
    const auto gv = s.fill(grads);
    std::vector<void*> ptrs;
    for (HostTensor& h : grads) ptrs.push_back(h.data());
    opt.rebind({}, ptrs);
    opt.step();
    for (std::size_t i = 0; i < kSizes.size(); ++i) s.ref[i].step(gv[i], t);
    for (std::size_t i = 0; i < kSizes.size(); ++i)
      check_close("p", s.p[i].values(), s.ref[i].p, 1e-5);
  }
  // The params move too: copied into new memory, rebound, stepped there.
  std::vector<HostTensor> moved;
  std::vector<void*> pptrs, gptrs;
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    moved.emplace_back(kSizes[i], DType::F32, 1);
    for (std::int64_t e = 0; e < kSizes[i]; ++e) moved.back().set(e, s.p[i].get(e));
    pptrs.push_back(moved.back().data());
    gptrs.push_back(s.g[i].data());
  }
  const auto gv = s.fill(s.g);
  opt.rebind(pptrs, gptrs);
  opt.step();
  for (std::size_t i = 0; i < kSizes.size(); ++i) s.ref[i].step(gv[i], 7);
  for (std::size_t i = 0; i < kSizes.size(); ++i)
    check_close("moved p", moved[i].values(), s.ref[i].p, 1e-5);
}

TEST_CASE("rebind refuses overlaps and wrong lists, and changes nothing then") {
  use_private_cache();
  Setup s;
  Optimizer opt = s.make();
  CHECK_THROWS_WITH_AS(opt.rebind({}, {s.g[0].data()}),
                       doctest::Contains("1 grad pointers for 4 params"), fusedopt::UsageError);
  // Grad 2 pointed at param 0's memory: refused, naming both.
  std::vector<void*> bad(kSizes.size(), nullptr);
  bad[2] = s.p[0].data();
  CHECK_THROWS_WITH_AS(opt.rebind({}, bad), doctest::Contains("overlaps"), fusedopt::UsageError);
  // The old pointers still hold: a step updates the params from their own grads.
  const auto gv = s.fill(s.g);
  opt.step();
  for (std::size_t i = 0; i < kSizes.size(); ++i) s.ref[i].step(gv[i], 1);
  for (std::size_t i = 0; i < kSizes.size(); ++i)
    check_close("p", s.p[i].values(), s.ref[i].p, 1e-5);
}

TEST_CASE("set_step_count: the next step's step is the count plus one") {
  use_private_cache();
  Setup s;
  Optimizer opt = s.make();
  opt.set_step_count(41);
  CHECK(opt.step_count() == 41);
  const auto gv = s.fill(s.g);
  opt.step();
  CHECK(opt.step_count() == 42);
  for (std::size_t i = 0; i < kSizes.size(); ++i) s.ref[i].step(gv[i], 42);
  for (std::size_t i = 0; i < kSizes.size(); ++i)
    check_close("p", s.p[i].values(), s.ref[i].p, 1e-5);
  CHECK_THROWS_AS(opt.set_step_count(-1), fusedopt::UsageError);
  CHECK_THROWS_AS(opt.set_step_count((std::int64_t{1} << 53) + 1), fusedopt::UsageError);
  CHECK(opt.step_count() == 42);
}

TEST_CASE("step_amp: torch's GradScaler protocol on the host (grad_scale, found_inf)") {
  use_private_cache();
  Setup s;
  Optimizer opt = s.make();
  const float scale = 1024.0f, no_inf = 0.0f, inf_found = 1.0f;
  // Scaled gradients: the step divides them by the scale.
  auto gv = s.fill(s.g);
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    for (std::int64_t e = 0; e < kSizes[i]; ++e) s.g[i].set(e, gv[i][e] * scale);
  }
  CHECK(opt.step_amp(&scale, &no_inf).taken());
  for (std::size_t i = 0; i < kSizes.size(); ++i) s.ref[i].step(gv[i], 1);
  for (std::size_t i = 0; i < kSizes.size(); ++i)
    check_close("p", s.p[i].values(), s.ref[i].p, 1e-5);
  // found_inf set: nothing changes, not even the count.
  s.fill(s.g);
  std::vector<std::vector<double>> before;
  for (HostTensor& t : s.p) {
    before.emplace_back();
    for (std::int64_t e = 0; e < t.numel(); ++e) before.back().push_back(t.get(e));
  }
  CHECK_FALSE(opt.step_amp(&scale, &inf_found).taken());
  CHECK(opt.step_count() == 1);
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    for (std::int64_t e = 0; e < kSizes[i]; ++e) REQUIRE(s.p[i].get(e) == before[i][e]);
  }
  // No scale (unscaled already) and no found_inf: a plain step, the second.
  gv = s.fill(s.g);
  CHECK(opt.step_amp(nullptr, nullptr).taken());
  for (std::size_t i = 0; i < kSizes.size(); ++i) s.ref[i].step(gv[i], 2);
  for (std::size_t i = 0; i < kSizes.size(); ++i)
    check_close("p", s.p[i].values(), s.ref[i].p, 1e-5);
}

}  // namespace
}  // namespace fusedopt::testing

TEST_SUITE_END();
