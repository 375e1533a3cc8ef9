// Mixed precision through the Optimizer: 16-bit params with and without an fp32 master,
// 16-bit grads, bf16 states, and misaligned 16-bit pointers, each against the float64
// AdamW reference taken one step at a time from the values the optimizer stored.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "common/host_tensors.hpp"

namespace fusedopt::testing {
namespace {

using fusedopt::DType;

struct StorageCase {
  DType param, grad, state;
  bool master;
  std::int64_t misalign = 0;  ///< elements past an aligned start, for params and grads
};

/// Each step starts the reference from what the optimizer stored (the master, or the
/// decoded param; the decoded states), so lossy storage cannot make the trajectories drift.
/// fp32 values must match within kTol * (|ref| + scale); 16-bit values must be the
/// reference rounded, or one ulp apart where the exact value is within fp32 rounding of a
/// rounding boundary (fp32 rounding of the operands, 2^-22 of the scale, is allowed on top). That
/// is rare, but not as rare as fp32's 16 extra bits suggest when the inputs are 16-bit too: m + 0.1
/// * (g - m) of two bf16 values lands a few fp32 ulps from a bf16 midpoint whenever g - m is 5
/// times a power of two. Since 1 - beta1 is computed in double and rounded once (float(0.1),
/// not 1 - float(0.9)), the fp32 product often lands exactly on the midpoint (measured: 1.1%
/// of the values with bf16 grads and states, under 0.05% otherwise). A store that truncated, or
/// rounded ties away from zero, sets far more apart (a quarter or more), so at most 2 in 100
/// may be. With a master, the param must be exactly the master rounded to nearest even.
void run_adamw_storage(const StorageCase& c, int steps = 30) {
  use_private_cache();
  const std::uint32_t seed = fresh_seed();
  INFO("adamw, params " << std::string(to_string(c.param)) << ", grads "
                        << std::string(to_string(c.grad)) << ", states "
                        << std::string(to_string(c.state)) << (c.master ? ", master" : "")
                        << ", misalign " << c.misalign << ", seed " << seed);
  std::mt19937 rng(seed);
  const std::vector<std::int64_t> sizes = {1000, 1, 4099, 0, 77};
  const Hypers h = with(kAdamWDefaults, {{"lr", 1e-2}, {"weight_decay", 0.1}});
  const RefStep ref = adam_reference(h, true, false);

  std::vector<HostTensor> p, g;
  fusedopt::ParamGroup group;
  group.hypers = overrides(h);
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    p.emplace_back(sizes[k], c.param, c.misalign);
    g.emplace_back(sizes[k], c.grad, c.misalign);
    fill_normal(p.back(), rng);
  }
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    group.params.push_back(p[k].tensor());
    group.grads.push_back(g[k].tensor());
  }
  fusedopt::OptimizerOptions options;
  options.state_dtype = c.state;
  options.master_weights = c.master;
  fusedopt::Optimizer opt(fusedopt::Rule::preset("adamw"), {group}, options);
  CHECK(opt.stats().launches_per_step == 1);

  const bool has_master = c.master && c.param != DType::F32;
  auto ulp = [](DType d, double a, double b) {
    return format_ulp(std::max(std::abs(a), std::abs(b)), mant_bits(d), min_exp(d));
  };
  long long apart = 0, values16 = 0, bad = 0;
  std::string first_bad;
  for (int t = 1; t <= steps && bad == 0; ++t) {
    // The reference's start: what the optimizer holds now.
    std::vector<std::vector<double>> rp(sizes.size()), rs(sizes.size());
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const int idx = static_cast<int>(k);
      const fusedopt::Tensor m = opt.state("m", idx), v = opt.state("v", idx);
      for (std::int64_t i = 0; i < sizes[k]; ++i) {
        rp[k].push_back(has_master ? at(opt.state("master", idx), i) : p[k].get(i));
        rs[k].push_back(at(m, i));
        rs[k].push_back(at(v, i));
      }
      fill_normal(g[k], rng);
    }
    opt.step();
    double scale[3] = {0, 0, 0};
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      for (std::int64_t i = 0; i < sizes[k]; ++i) {
        const auto e = static_cast<std::size_t>(i);
        ref(t, rp[k][e], g[k].get(i), &rs[k][2 * e]);
        scale[0] = std::max(scale[0], std::abs(rp[k][e]));
        scale[1] = std::max(scale[1], std::abs(rs[k][2 * e]));
        scale[2] = std::max(scale[2], std::abs(rs[k][2 * e + 1]));
      }
    }
    auto check = [&](const char* what, std::size_t k, std::int64_t i, DType d, double got,
                     double want, double s) {
      bool ok;
      if (d == DType::F32) {
        ok = std::abs(got - want) <= kTol * (std::abs(want) + s);
      } else {
        ++values16;
        const double rounded = round_to(d, want);
        // Plus fp32's rounding of the operands: the kernel computes in fp32, so where terms
        // of magnitude ~s nearly cancel (m = 0.9 m + 0.1 g), its value before the 16-bit
        // store can be a few fp32 ulps of s away from the exact one, which is more than a
        // 16-bit ulp of a tiny result (seed 4229465175: m = -1.6e-6 from terms of ~0.1).
        ok = std::abs(got - rounded) <= ulp(d, got, rounded) + 0x1p-22 * s;
        if (got != rounded) ++apart;
      }
      if (!ok && bad++ == 0) {
        first_bad = "step " + std::to_string(t) + ", tensor " + std::to_string(k) + ", element " +
                    std::to_string(i) + ", " + what + ": got " + fmt_double(got) + ", reference " +
                    fmt_double(want);
      }
    };
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const int idx = static_cast<int>(k);
      const fusedopt::Tensor m = opt.state("m", idx), v = opt.state("v", idx);
      for (std::int64_t i = 0; i < sizes[k]; ++i) {
        const auto e = static_cast<std::size_t>(i);
        if (has_master) {
          const double master = at(opt.state("master", idx), i);
          check("master", k, i, DType::F32, master, rp[k][e], scale[0]);
          const double want_bits = encode(c.param, master);
          const double got_bits = encode(c.param, p[k].get(i));  // exact: a stored value
          if (got_bits != want_bits && bad++ == 0) {
            first_bad = "param is not its master rounded to nearest even at tensor " +
                        std::to_string(k) + ", element " + std::to_string(i);
          }
        } else {
          check("param", k, i, c.param, p[k].get(i), rp[k][e], scale[0]);
        }
        check("m", k, i, c.state, at(m, i), rs[k][2 * e], scale[1]);
        check("v", k, i, c.state, at(v, i), rs[k][2 * e + 1], scale[2]);
      }
    }
  }
  CHECK_MESSAGE(bad == 0, bad << " values out of tolerance; first: " << first_bad);
  CHECK_MESSAGE(apart * 50 <= std::max(values16, 50LL),
                apart << " of " << values16 << " 16-bit values rounded one ulp apart");
}

}  // namespace

TEST_SUITE("runtime") {
  TEST_CASE("bf16 params and grads with an fp32 master match the float64 reference") {
    run_adamw_storage({DType::BF16, DType::BF16, DType::F32, true});
  }

  TEST_CASE("fp16 params and grads without a master match the reference rounded to fp16") {
    run_adamw_storage({DType::F16, DType::F16, DType::F32, false});
  }

  TEST_CASE("bf16 states with fp32 params match the reference rounded to bf16") {
    run_adamw_storage({DType::F32, DType::F32, DType::BF16, false});
  }

  TEST_CASE("fp16 states with fp32 params match the reference rounded to fp16") {
    run_adamw_storage({DType::F32, DType::F32, DType::F16, false});
  }

  TEST_CASE("fp16 params with bf16 states and an fp32 master match the reference") {
    run_adamw_storage({DType::F16, DType::BF16, DType::BF16, true});
  }

  TEST_CASE("fp16 tensors one element past an aligned address match the reference") {
    run_adamw_storage({DType::F16, DType::F16, DType::F32, false, 1});
    run_adamw_storage({DType::BF16, DType::F32, DType::F32, true, 1});
  }

  TEST_CASE("master_weights leaves fp32 params without a master copy") {
    use_private_cache();
    HostTensor p(10, DType::F32), g(10, DType::F32);
    fusedopt::OptimizerOptions options;
    options.master_weights = true;
    fusedopt::Optimizer opt(fusedopt::Rule::preset("sgd"), {{{p.tensor("w")}, {g.tensor()}, {}}},
                            options);
    CHECK(opt.state("master", 0).numel == 0);
    CHECK(opt.state("master", 0).data == nullptr);
  }
}

}  // namespace fusedopt::testing
