// Optimizer: the façade over its pieces (optimizer_impl.hpp): steps, hypers, state views,
// and the extension API. Construction lives in optimizer_build.cpp, checkpoints in
// checkpoint.cpp, statistics in optimizer_report.cpp.
#include <fmt/format.h>

#include <algorithm>

#include "fusedopt/error.hpp"
#include "fusedopt/extension.hpp"
#include "optimizer/optimizer_impl.hpp"
#include "support/check.hpp"

namespace fusedopt {

Optimizer::~Optimizer() = default;
Optimizer::Optimizer(Optimizer&&) noexcept = default;
Optimizer& Optimizer::operator=(Optimizer&&) noexcept = default;

// A moved-from Optimizer has no Impl: every method but destruction and assignment refuses.
Optimizer::Impl& Optimizer::live(const char* method) const {
  FUSEDOPT_CHECK_USAGE(impl_ != nullptr, "Optimizer::{}: this Optimizer was moved from", method);
  return *impl_;
}

StepResult Optimizer::step(void* stream) {
  Impl& m = live("step");
  Impl::Exclusive hold(m, "step");
  runtime::StepRequest request;
  request.stream = stream;
  return m.runner.run(request);
}

StepResult Optimizer::step_scaled(float inv_grad_scale, void* stream) {
  Impl& m = live("step_scaled");
  Impl::Exclusive hold(m, "step_scaled");
  runtime::StepRequest request;
  request.inv_grad_scale = inv_grad_scale;
  request.scaled = true;
  request.stream = stream;
  return m.runner.run(request);
}

StepResult Optimizer::step_amp(const float* grad_scale, const float* found_inf, void* stream) {
  Impl& m = live("step_amp");
  Impl::Exclusive hold(m, "step_amp");
  return m.runner.run_amp(grad_scale, found_inf, stream);
}

void Optimizer::set_step_count(std::int64_t count) {
  Impl& m = live("set_step_count");
  Impl::Exclusive hold(m, "set_step_count");
  FUSEDOPT_CHECK_USAGE(count >= 0 && count <= kMaxSteps,
                       "Optimizer::set_step_count: {} steps; the count must be in 0 to 2^53",
                       count);
  m.runner.set_steps_taken(count);
}

std::int64_t Optimizer::step_count() const { return live("step_count").runner.steps_taken(); }

void Optimizer::set_hyper(const std::string& name, double value, std::optional<int> group) {
  Impl& m = live("set_hyper");
  Impl::Exclusive hold(m, "set_hyper");
  const runtime::Hypers before = m.hypers;
  m.hypers.assign("set_hyper", name, value, group);
  try {
    m.runner.set_hypers(m.hypers.values());
  } catch (...) {
    m.hypers = before;  // refused (a matrix stage's iteration out of range): nothing changed
    throw;
  }
}

void Optimizer::set_hyper(const std::string& name, double value, std::optional<int> group,
                          void* stream) {
  Impl& m = live("set_hyper");
  Impl::Exclusive hold(m, "set_hyper");
  const runtime::Hypers before = m.hypers;
  m.hypers.assign("set_hyper", name, value, group);
  try {
    m.runner.set_hypers_on(m.hypers.values(), stream);
  } catch (...) {
    m.hypers = before;  // refused (a stream being captured): nothing changed
    throw;
  }
}

double Optimizer::hyper(const std::string& name, int group) const {
  return live("hyper").hypers.get("hyper", name, group);
}

std::vector<StateInfo> Optimizer::states() const {
  const Impl& m = live("states");
  // Element states and outputs of an optimizer of float64 params only are float64.
  const std::vector<runtime::ParamSlot>& params = m.store.params();
  const bool f64 = std::all_of(params.begin(), params.end(), [](const runtime::ParamSlot& s) {
    return s.param.dtype == DType::F64;
  });
  std::vector<StateInfo> out;
  for (const runtime::StateSpec& spec : m.store.specs()) {
    DType dtype = spec.dtype;
    if (spec.kind == StateKind::Element && spec.quant != Quant::None) {
      dtype = DType::U8;
    } else if (f64 && (spec.kind == StateKind::Element || spec.kind == StateKind::Output)) {
      dtype = DType::F64;
    }
    out.push_back({spec.name, spec.kind, dtype, spec.saved(), spec.quant});
  }
  return out;
}

Tensor Optimizer::state(const std::string& name, int param_index) const {
  const Impl& m = live("state");
  const runtime::StateSpec& spec = m.store.spec(name);
  const std::size_t n = m.store.params().size();
  FUSEDOPT_CHECK_USAGE(!(param_index < 0 || static_cast<std::size_t>(param_index) >= n),
                       "state('{}', {}): there is no param {} (the optimizer has {})", name,
                       param_index, param_index, n);
  return m.store.view(spec, static_cast<std::size_t>(param_index));
}

std::unique_ptr<Optimizer> OptimizerExtension::make(const Rule& rule,
                                                    std::vector<ParamGroup> groups,
                                                    OptimizerOptions options,
                                                    std::vector<PieceOrigin> origins) {
  return std::unique_ptr<Optimizer>(
      new Optimizer(Optimizer::Impl::build(rule, std::move(groups), options, std::move(origins))));
}

void OptimizerExtension::set_step_extension(Optimizer& opt, StepExtension* extension) {
  opt.live("set_step_extension").runner.set_extension(extension);
}

namespace {

/// A bare reduction hook as an extension: it only combines.
class HookExtension final : public StepExtension {
 public:
  explicit HookExtension(ReductionHook hook) : hook_(std::move(hook)) {}
  void begin(void*) override {}
  void combine(const ReductionPartials& totals) override { hook_(totals); }
  void publish(void*) override {}

 private:
  ReductionHook hook_;
};

}  // namespace

void OptimizerExtension::set_reduction_hook(Optimizer& opt, ReductionHook hook) {
  Optimizer::Impl& m = opt.live("set_reduction_hook");
  std::unique_ptr<StepExtension> own;
  if (hook) own = std::make_unique<HookExtension>(std::move(hook));
  StepExtension* const extension = own.get();
  m.runner.set_extension(extension, std::move(own));
}

Tensor OptimizerExtension::step_counter(const Optimizer& opt) {
  const Optimizer::Impl& m = opt.live("step_counter");
  return m.runner.step_counter(m.device);
}

}  // namespace fusedopt
