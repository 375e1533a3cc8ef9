// GradScaler: torch.cuda.amp.GradScaler's update rule on top of Optimizer::step_scaled.
#include <fmt/format.h>

#include <cfloat>
#include <cmath>

#include "fusedopt/error.hpp"
#include "fusedopt/optimizer.hpp"
#include "support/check.hpp"

namespace fusedopt {

GradScaler::GradScaler(Options options)
    : options_(options), scale_(static_cast<float>(options.init_scale)) {
  FUSEDOPT_CHECK_USAGE(!(!(options.init_scale > 0) || !std::isfinite(options.init_scale)),
                       "GradScaler: init_scale must be positive and finite, not {}",
                       options.init_scale);
  if (!(options.growth_factor > 1)) {
    throw UsageError(
        fmt::format("GradScaler: growth_factor must be > 1, not {}", options.growth_factor));
  }
  FUSEDOPT_CHECK_USAGE((options.backoff_factor > 0 && options.backoff_factor < 1),
                       "GradScaler: backoff_factor must be in (0, 1), not {}",
                       options.backoff_factor);
  FUSEDOPT_CHECK_USAGE(options.growth_interval >= 1,
                       "GradScaler: growth_interval must be at least 1, not {}",
                       options.growth_interval);
}

bool GradScaler::step(Optimizer& opt, void* stream) {
  // torch computes the inverse in double and hands the kernel an fp32 value.
  const auto inv = static_cast<float>(1.0 / scale_);
  // A capturable CUDA optimizer checks and skips on the device and returns true without
  // waiting; its step count, read from the device, says whether the step was taken (one
  // synchronisation each: keeping the scale on the device too is not done yet).
  const std::int64_t before = opt.step_count();
  const bool taken = opt.step_scaled(inv, stream) && opt.step_count() > before;
  // torch keeps the scale in an fp32 tensor and multiplies it in fp32 by the factor (a
  // Python float rounded to fp32), so every value here is an fp32 value too.
  if (!taken) {
    scale_ = static_cast<float>(static_cast<float>(scale_) *
                                static_cast<float>(options_.backoff_factor));
    good_steps_ = 0;
    return false;
  }
  if (++good_steps_ == options_.growth_interval) {
    // ... and grows it only while the result stays finite.
    const float grown = static_cast<float>(scale_) * static_cast<float>(options_.growth_factor);
    if (std::isfinite(grown)) scale_ = grown;
    good_steps_ = 0;
  }
  return true;
}

}  // namespace fusedopt
