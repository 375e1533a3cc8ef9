// GradScaler: torch.amp.GradScaler's update rule (abi.h's fo_update_scale, the same code on
// the host and the device) on top of Optimizer::step_scaled, with the state on the host or
// in device memory.
#include <fmt/format.h>

#include <cmath>
#include <cstddef>

#include "abi.h"
#include "fusedopt/error.hpp"
#include "fusedopt/optimizer.hpp"
#include "optimizer/optimizer_impl.hpp"
#include "support/check.hpp"

namespace fusedopt {

/// A device GradScaler's state: an fo_scaler in memory of the optimizer's backend, which it
/// keeps alive (declared first: outlives the memory).
struct GradScaler::DeviceState {
  std::shared_ptr<runtime::Backend> backend;
  runtime::Buffer block;  ///< one fo_scaler
  Device device;

  fo_scaler read() const {
    fo_scaler s{};
    backend->copy_to_host(&s, block.data(), sizeof s);  // waits for every queued launch
    return s;
  }
};

GradScaler::GradScaler(Options options)
    : options_(options), scale_(static_cast<float>(options.init_scale)) {
  // Each setting is used as an fp32 value (abi.h's fo_scaler): one that fp32 rounds to inf,
  // to 0 or to the edge of its range (1e39, 1e-50; a growth of 1 + 1e-9) would skip every
  // step, or never grow, without an error. The scale's inverse must be finite in fp32 too.
  const auto scale = static_cast<float>(options.init_scale);
  const auto growth = static_cast<float>(options.growth_factor);
  const auto backoff = static_cast<float>(options.backoff_factor);
  FUSEDOPT_CHECK_USAGE(scale > 0 && std::isfinite(scale) && std::isfinite(1.0f / scale),
                       "GradScaler: init_scale must be positive and finite in fp32, with a "
                       "finite inverse (2.9e-39 to 3.4e+38), not {}",
                       options.init_scale);
  FUSEDOPT_CHECK_USAGE(growth > 1 && std::isfinite(growth),
                       "GradScaler: growth_factor must be > 1 and finite in fp32, not {}",
                       options.growth_factor);
  FUSEDOPT_CHECK_USAGE(backoff > 0 && backoff < 1,
                       "GradScaler: backoff_factor must be in (0, 1) in fp32, not {}",
                       options.backoff_factor);
  FUSEDOPT_CHECK_USAGE(options.growth_interval >= 1,
                       "GradScaler: growth_interval must be at least 1, not {}",
                       options.growth_interval);
}

GradScaler::~GradScaler() = default;

namespace {

/// The fo_scaler of `scale` and `tracker`.
fo_scaler make_scaler(double scale, int tracker, bool last_taken) {
  fo_scaler s{};
  s.scale = static_cast<float>(scale);
  s.growth_tracker = tracker;
  s.found_inf = last_taken ? 0 : 1;
  return s;
}

}  // namespace

GradScaler GradScaler::on_device(const Optimizer& opt, Options options) {
  GradScaler scaler(options);
  const Optimizer::Impl& m = opt.live("GradScaler::on_device");
  FUSEDOPT_CHECK_USAGE(m.device.kind == Device::Kind::Cuda,
                       "GradScaler::on_device: the optimizer must be a CUDA one (its scale "
                       "lives in device memory); this one runs on {}",
                       m.backend->name());
  FUSEDOPT_CHECK_USAGE(!m.runner.kernels().empty(),
                       "GradScaler::on_device: the optimizer has no elements to step (every "
                       "tensor is empty)");
  auto state = std::make_shared<DeviceState>();
  state->backend = m.backend;
  state->device = m.device;
  state->block = m.backend->allocate(sizeof(fo_scaler));
  const fo_scaler initial = make_scaler(scaler.scale_, 0, true);
  m.backend->copy_from_host(state->block.data(), &initial, sizeof initial);
  scaler.device_ = std::move(state);
  return scaler;
}

double GradScaler::scale() const { return device_ ? device_->read().scale : scale_; }

int GradScaler::growth_tracker() const {
  return device_ ? device_->read().growth_tracker : good_steps_;
}

bool GradScaler::last_step_taken() const {
  return device_ ? device_->read().found_inf == 0 : last_taken_;
}

const float* GradScaler::device_scale() const {
  if (!device_) return nullptr;
  return reinterpret_cast<const float*>(device_->block.bytes_data() + offsetof(fo_scaler, scale));
}

StepResult GradScaler::step(Optimizer& opt, void* stream, float grad_factor) {
  FUSEDOPT_CHECK_USAGE(grad_factor > 0 && std::isfinite(grad_factor),
                       "GradScaler::step: grad_factor must be positive and finite, not {}",
                       grad_factor);
  const auto growth = static_cast<float>(options_.growth_factor);
  const auto backoff = static_cast<float>(options_.backoff_factor);
  if (device_) {
    Optimizer::Impl& m = opt.live("GradScaler::step");
    Optimizer::Impl::Exclusive hold(m, "step");
    FUSEDOPT_CHECK_USAGE(m.device == device_->device && !m.runner.kernels().empty(),
                         "GradScaler::step: this device GradScaler lives on {} and steps only "
                         "optimizers there with at least one element; this optimizer runs on {}",
                         device_->backend->name(), m.backend->name());
    const runtime::DeviceScaler launch{device_->block.data(), growth, backoff,
                                       options_.growth_interval};
    runtime::StepRequest request;
    request.inv_grad_scale = grad_factor;
    request.scaled = true;
    request.stream = stream;
    request.scaler = &launch;
    return m.runner.run(request);
  }
  // torch computes the inverse in double and hands the kernel an fp32 value; the device
  // GradScaler's launches compute the same (abi.h's fo_unscale_factor).
  fo_scaler s = make_scaler(scale_, good_steps_, last_taken_);
  const float inv = fo_unscale_factor(grad_factor, &s.scale);
  // The next scale depends on the verdict: on CUDA, asking for it waits for the step.
  const bool taken = opt.step_scaled(inv, stream).taken();
  fo_update_scale(&s, taken ? 0 : 1, growth, backoff, options_.growth_interval);
  scale_ = s.scale;
  good_steps_ = s.growth_tracker;
  last_taken_ = taken;
  return StepResult(taken);
}

}  // namespace fusedopt
