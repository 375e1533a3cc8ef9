// A finite gradient whose square overflows (g = 1e38) in a quantized block, on the host:
// the quantized presets against their fp32 twins (common/quant_overflow.hpp).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/host_tensors.hpp"
#include "common/quant_overflow.hpp"
#include "fusedopt/optimizer.hpp"

TEST_SUITE_BEGIN("runtime");

using fusedopt::DType;
using fusedopt::Optimizer;
using fusedopt::ParamGroup;
using fusedopt::Rule;
using fusedopt::testing::HostTensor;

TEST_CASE("a finite gradient whose square overflows loses one element, never its block") {
  fusedopt::testing::use_private_cache();
  std::mt19937 rng(fusedopt::testing::fresh_seed());
  std::normal_distribution<double> normal(0.0, 1.0);
  constexpr std::int64_t kNumel = 8192;  // quantized: 32 blocks of 256, 64 of 128
  for (const fusedopt::testing::QuantTwin& twin : fusedopt::testing::kQuantTwins) {
    CAPTURE(std::string(twin.quantized));
    HostTensor pq(kNumel, DType::F32), pf(kNumel, DType::F32), g(kNumel, DType::F32);
    for (std::int64_t i = 0; i < kNumel; ++i) {
      pq.set(i, normal(rng));
      pf.set(i, pq.get(i));
    }
    Optimizer quant(Rule::preset(twin.quantized), {ParamGroup{{pq.tensor()}, {g.tensor()}, {}}});
    Optimizer fp32(Rule::preset(twin.fp32), {ParamGroup{{pf.tensor()}, {g.tensor()}, {}}});
    for (int t = 1; t <= fusedopt::testing::kOverflowSteps; ++t) {
      for (std::int64_t i = 0; i < kNumel; ++i) g.set(i, normal(rng) * 0.1);
      if (t == fusedopt::testing::kOverflowStep) {
        g.set(fusedopt::testing::kOverflowElement, fusedopt::testing::kOverflowGrad);
      }
      quant.step();
      fp32.step();
    }
    int block = 0;
    for (const fusedopt::StateInfo& s : quant.states()) {
      if (s.kind != fusedopt::StateKind::Element) continue;
      block = fusedopt::quant_bits(s.quant) == 8 ? 256 : 128;
      const fusedopt::Tensor absmax = quant.state(s.name + ".absmax", 0);
      REQUIRE(absmax.numel == kNumel / block);
      for (std::int64_t b = 0; b < absmax.numel; ++b) {
        float a;
        std::memcpy(&a, static_cast<const float*>(absmax.data) + b, 4);
        CAPTURE(s.name);
        CAPTURE(b);
        REQUIRE(std::isfinite(a));
      }
    }
    REQUIRE(block > 0);
    std::vector<float> q(kNumel), f(kNumel);
    for (std::int64_t i = 0; i < kNumel; ++i) {
      q[static_cast<std::size_t>(i)] = static_cast<float>(pq.get(i));
      f[static_cast<std::size_t>(i)] = static_cast<float>(pf.get(i));
    }
    fusedopt::testing::check_overflow_like_fp32(q, f, block, quant.hyper("lr"));
  }
}

TEST_SUITE_END();
