// Stochastic rounding of 16-bit params (OptimizerOptions::stochastic_rounding) and the rule
// built-in rand(): the generator against Philox's published answers, rounding that keeps the
// mean where round-to-nearest loses the update, and bits that do not depend on the thread
// count or the memory layout.
#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/host_tensors.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/optimizer.hpp"
#include "prelude.h"

TEST_SUITE_BEGIN("runtime");

using fusedopt::DType;
using fusedopt::Optimizer;
using fusedopt::OptimizerOptions;
using fusedopt::ParamGroup;
using fusedopt::Rule;
using fusedopt::testing::fresh_seed;
using fusedopt::testing::HostTensor;
using fusedopt::testing::use_private_cache;

namespace {

/// p = p - lr * g in fp32, then the store: what the kernel computes before rounding.
float fp32_result(float p, float g, float lr) { return p - lr * g; }

/// The mean and standard error of `x`.
std::pair<double, double> mean_and_se(const std::vector<double>& x) {
  double s = 0, s2 = 0;
  for (double v : x) s += v;
  const double mean = s / static_cast<double>(x.size());
  for (double v : x) s2 += (v - mean) * (v - mean);
  return {mean, std::sqrt(s2 / static_cast<double>(x.size() - 1) / static_cast<double>(x.size()))};
}

const char* const kDescent = "param p\ngrad g\nhyper lr = 1\np = p - lr * g\n";

}  // namespace

TEST_CASE("Philox4x32-10 gives the published answers") {
  // Random123's known-answer tests (kat_vectors): counter, key, result.
  fo_rand4 r = fo_philox(0, 0, 0, 0, 0, 0);
  CHECK(r.x[0] == 0x6627e8d5u);
  CHECK(r.x[1] == 0xe169c58du);
  CHECK(r.x[2] == 0xbc57ac4cu);
  CHECK(r.x[3] == 0x9b00dbd8u);
  r = fo_philox(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu);
  CHECK(r.x[0] == 0x408f276du);
  CHECK(r.x[1] == 0x41c83b0eu);
  CHECK(r.x[2] == 0xa20bc7c6u);
  CHECK(r.x[3] == 0x6d5451fdu);
}

TEST_CASE("stochastic rounding keeps the mean where round-to-nearest loses the update") {
  use_private_cache();
  // 10^7 elements whose fp32 result lies 0.3 of a last place above a 16-bit value:
  // round-to-nearest always drops it (mean error -0.3 ulp), stochastic rounding must not.
  const std::int64_t n = 10000000;
  for (DType dtype : {DType::BF16, DType::F16}) {
    for (const double base : {1.0, 3.0e-6}) {  // fp16: 3e-6 is among its subnormals
      if (dtype == DType::BF16 && base < 1) continue;
      const std::string name = fusedopt::to_string(dtype);
      CAPTURE(name);
      CAPTURE(base);
      const double ulp = dtype == DType::BF16
                             ? std::ldexp(1.0, -7)
                             : (base < 6.1e-5 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -10));
      HostTensor p(n, dtype), g(n, DType::F32);
      for (std::int64_t i = 0; i < n; ++i) {
        p.set(i, base);
        g.set(i, -1.0);
      }
      const double start = p.get(0);
      const auto lr = static_cast<float>(0.3 * ulp);
      OptimizerOptions o;
      o.stochastic_rounding = true;
      o.seed = fresh_seed();
      Optimizer opt(Rule::parse(kDescent, "descent.rule"),
                    {ParamGroup{{p.tensor("w")}, {g.tensor()}, {{"lr", lr}}}}, o);
      opt.step();
      const double want = fp32_result(static_cast<float>(start), -1.0f, lr);
      std::vector<double> err(static_cast<std::size_t>(n));
      std::int64_t up = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        err[static_cast<std::size_t>(i)] = (p.get(i) - want) / ulp;
        up += p.get(i) > start ? 1 : 0;
      }
      const auto [mean, se] = mean_and_se(err);
      MESSAGE(name, " at ", base, ": ", up, " of ", n, " rounded up; mean error ", mean,
              " ulp (standard error ", se, "; round-to-nearest: -0.3)");
      CHECK(std::abs(mean) <= 4 * se);
      CHECK(up > 0);
      CHECK(up < n);
    }
  }
}

namespace {

/// bf16 AdamW with a noisy gradient (rand()) and stochastic rounding: params after 5 steps.
const char* const kNoisyAdamW =
    "param p\ngrad g\nstate m = 0, v = 0\n"
    "hyper lr = 1e-2, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, noise = 0.1\n"
    "d = g + noise * (rand() - 0.5)\n"
    "m = lerp(m, d, 1 - beta1)\nv = beta2 * v + (1 - beta2) * d * d\n"
    "p = p - lr / (1 - beta1 ^ step) * m / (sqrt(v / (1 - beta2 ^ step)) + eps)\n";

const std::vector<std::int64_t> kSizes = {70001, 5, 0, 40000, 1};

/// Runs kNoisyAdamW over params at `p` and grads at `g` (tensors, in order) for 5 steps.
std::vector<std::uint16_t> run(std::vector<fusedopt::Tensor> p, std::vector<fusedopt::Tensor> g,
                               std::uint64_t seed) {
  OptimizerOptions o;
  o.stochastic_rounding = true;
  o.seed = seed;
  ParamGroup a, b;
  for (std::size_t k = 0; k < p.size(); ++k) {
    ParamGroup& grp = k < 2 ? a : b;
    grp.params.push_back(p[k]);
    grp.grads.push_back(g[k]);
  }
  b.hypers = {{"lr", 3e-3}};
  Optimizer opt(Rule::parse(kNoisyAdamW, "noisy.rule"), {a, b}, o);
  for (int t = 0; t < 5; ++t) opt.step();
  std::vector<std::uint16_t> out;
  for (const fusedopt::Tensor& t : p) {
    const auto* x = static_cast<const std::uint16_t*>(t.data);
    out.insert(out.end(), x, x + t.numel);
  }
  return out;
}

}  // namespace

TEST_CASE("stochastic rounding and rand() give the same bits on any thread count and layout") {
  use_private_cache();
  const std::uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<std::vector<double>> pv, gv;
  for (std::int64_t n : kSizes) {
    pv.emplace_back();
    gv.emplace_back();
    for (std::int64_t i = 0; i < n; ++i) {
      pv.back().push_back(normal(rng));
      gv.back().push_back(normal(rng));
    }
  }
  // Separate tensors, at 1, 2 and 3 threads.
  auto separate = [&](int threads) {
    std::vector<HostTensor> p, g;
    std::vector<fusedopt::Tensor> pt, gt;
    for (std::size_t k = 0; k < kSizes.size(); ++k) {
      p.emplace_back(kSizes[k], DType::BF16);
      g.emplace_back(kSizes[k], DType::BF16);
      for (std::int64_t i = 0; i < kSizes[k]; ++i) {
        p.back().set(i, pv[k][static_cast<std::size_t>(i)]);
        g.back().set(i, gv[k][static_cast<std::size_t>(i)]);
      }
    }
    for (std::size_t k = 0; k < kSizes.size(); ++k) {
      pt.push_back(p[k].tensor("w" + std::to_string(k)));
      gt.push_back(g[k].tensor());
    }
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    std::vector<std::uint16_t> out = run(pt, gt, seed);
    omp_set_num_threads(saved);
    return out;
  };
  const std::vector<std::uint16_t> one = separate(1);
  CHECK(separate(2) == one);
  CHECK(separate(3) == one);
  // The same params laid end to end in one arena.
  fusedopt::FlatArena arena;
  for (std::size_t k = 0; k < kSizes.size(); ++k) {
    arena.add("w" + std::to_string(k), kSizes[k], DType::BF16);
  }
  arena.finalize();
  std::vector<fusedopt::Tensor> pt, gt;
  for (std::size_t k = 0; k < kSizes.size(); ++k) {
    pt.push_back(arena.param(k));
    gt.push_back(arena.grad(k));
    for (std::int64_t i = 0; i < kSizes[k]; ++i) {
      HostTensor::write(DType::BF16, static_cast<std::uint16_t*>(pt.back().data) + i,
                        pv[k][static_cast<std::size_t>(i)]);
      HostTensor::write(DType::BF16, static_cast<std::uint16_t*>(gt.back().data) + i,
                        gv[k][static_cast<std::size_t>(i)]);
    }
  }
  CHECK(run(pt, gt, seed) == one);
  // Another seed: other bits (the seed is part of the key).
  CHECK(separate(2) != run(pt, gt, seed + 1));
}

TEST_CASE("stochastic rounding: fp32 params are unaffected, and master weights are refused") {
  use_private_cache();
  HostTensor p(100, DType::F32), g(100, DType::F32), q(100, DType::F32);
  for (std::int64_t i = 0; i < 100; ++i) {
    p.set(i, 1.0 + i);
    q.set(i, 1.0 + i);
    g.set(i, 0.25);
  }
  OptimizerOptions o;
  o.stochastic_rounding = true;
  Optimizer a(Rule::preset("sgd"), {ParamGroup{{p.tensor()}, {g.tensor()}, {}}}, o);
  Optimizer b(Rule::preset("sgd"), {ParamGroup{{q.tensor()}, {g.tensor()}, {}}});
  a.step();
  b.step();
  CHECK(std::memcmp(p.data(), q.data(), 400) == 0);
  HostTensor h(100, DType::BF16), hg(100, DType::BF16);
  o.master_weights = true;
  CHECK_THROWS_WITH_AS(
      Optimizer(Rule::preset("sgd"), {ParamGroup{{h.tensor()}, {hg.tensor()}, {}}}, o),
      doctest::Contains("stochastic_rounding and master_weights are both set"),
      fusedopt::UsageError);
  CHECK_THROWS_WITH_AS(Rule::parse("param p\ngrad g\nstate m = rand()\nm = g\n", "r.rule"),
                       doctest::Contains("r.rule:3:11: error: rand() in an initial value"),
                       fusedopt::RuleError);
}

TEST_SUITE_END();
