// What the launches of one step read besides a binding's planned tables: the step, the
// gradient factor, and where the device keeps the rest (the steps taken, a loss scale, the
// skip flag). One struct for the host and CUDA: each field is an fo_launch field (abi.h),
// and the pointers are memory of the kernel's device.
#pragma once

#include "abi.h"

namespace fusedopt::runtime {

struct StepArgs {
  /// The 1-based step, used when `steps_taken` is null.
  double step = 0.0;
  /// What gradients are multiplied by before the rule.
  float inv_grad_scale = 1.0f;
  /// Non-null: the steps taken so far (one double); the launches' step is one past it, so a
  /// step needs nothing from the host (a CUDA graph replays it).
  const double* steps_taken = nullptr;
  /// Non-null: gradients are also divided by the fp32 loss scale here (a device GradScaler's,
  /// or torch's AMP scale).
  const float* device_scale = nullptr;
  /// Non-null: every launch of the step does nothing when the double here is non-zero.
  const double* skip = nullptr;

  /// Writes these fields into `L`.
  void apply(fo_launch& L) const {
    L.step = step;
    L.inv_grad_scale = inv_grad_scale;
    L.step_ptr = steps_taken;
    L.grad_scale_ptr = device_scale;
    L.skip_if_set = skip;
  }
};

}  // namespace fusedopt::runtime
