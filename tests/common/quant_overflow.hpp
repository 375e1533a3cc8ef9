// One finite gradient element whose square overflows fp32 (g = 1e38) in the middle of a
// quantized block: what the quantized presets must do with it, judged against their fp32
// twins stepped on the same gradients (fp32 AdamW keeps v = inf for that element and never
// moves it again; every other element goes on as before).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace fusedopt::testing {

/// A quantized preset and its fp32 twin (the same algorithm, states in fp32).
struct QuantTwin {
  const char* quantized;
  const char* fp32;
};
inline const QuantTwin kQuantTwins[] = {{"adamw8bit", "adamw"},
                                        {"adam8bit", "adam"},
                                        {"adamw4bit", "adamw"},
                                        {"adamw4bit+sr", "adamw"}};

/// The element hit by the huge gradient, the step it comes at and the steps in all.
inline constexpr std::int64_t kOverflowElement = 1000;  // inside a block, not at its edge
inline constexpr int kOverflowStep = 3, kOverflowSteps = 8;
inline constexpr double kOverflowGrad = 1e38;

/// The quantized run's params `quant` against the fp32 twin's `twin` after kOverflowSteps
/// steps (lr each): every param finite; the hit element's block (its other elements) as
/// close to the twin as the blocks the huge gradient never saw are (quantization's own
/// error); the hit element itself within a few updates of the twin's (which froze it).
inline void check_overflow_like_fp32(const std::vector<float>& quant,
                                     const std::vector<float>& twin, int block, double lr) {
  REQUIRE(quant.size() == twin.size());
  const std::int64_t b0 = kOverflowElement / block * block;
  double hit_block = 0, others = 0;
  for (std::size_t i = 0; i < quant.size(); ++i) {
    CAPTURE(i);
    REQUIRE(std::isfinite(quant[i]));
    REQUIRE(std::isfinite(twin[i]));
    const double d = std::abs(static_cast<double>(quant[i]) - twin[i]);
    const auto k = static_cast<std::int64_t>(i);
    if (k == kOverflowElement) continue;
    double& worst = k >= b0 && k < b0 + block ? hit_block : others;
    worst = std::max(worst, d);
  }
  MESSAGE("largest |quantized - fp32| in the hit block ", hit_block, ", elsewhere ", others);
  CHECK(hit_block <= 2 * others + 1e-7);
  const auto hit = static_cast<std::size_t>(kOverflowElement);
  CHECK(std::abs(static_cast<double>(quant[hit]) - twin[hit]) <= 10 * lr * kOverflowSteps);
}

}  // namespace fusedopt::testing
