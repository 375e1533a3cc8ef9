// Optimizer: steps (one launch per dtype binding), hypers, state views and statistics.
// Construction lives in optimizer_build.cpp, checkpoints in checkpoint.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <optional>

#include "abi.h"
#include "fusedopt/checkpoint_format.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/extension.hpp"
#include "optimizer/optimizer_impl.hpp"
#include "rule_access.hpp"
#include "support/check.hpp"

namespace fusedopt {

std::size_t Optimizer::Impl::hyper_index(const std::string& name) const {
  for (std::size_t k = 0; k < hyper_names.size(); ++k) {
    if (hyper_names[k] == name) return k;
  }
  std::string known;
  for (const std::string& h : hyper_names) known += (known.empty() ? "" : ", ") + h;
  throw UsageError(fmt::format("rule '{}' has no hyper '{}' (it has: {})", rule.name(), name,
                               known.empty() ? "none" : known));
}

std::vector<std::vector<double>> Optimizer::Impl::hyper_values() const {
  std::vector<std::vector<double>> out;
  for (const auto& group : hypers) out.emplace_back(group.begin(), group.end());
  return out;
}

void Optimizer::Impl::push_hypers() {
  // The hyper tables are read by every launch: the copy waits for the queued steps (on any
  // stream), and the next step for the copy.
  backend->synchronize();
  push_hypers_on(nullptr);
  backend->synchronize();
}

void Optimizer::Impl::push_hypers_on(void* stream) {
  const std::vector<std::vector<double>> h = hyper_values();
  for (auto& kernel : kernels) kernel->set_hypers(h, stream);
}

const runtime::StateSpec& Optimizer::Impl::state_spec(const std::string& name) const {
  for (const runtime::StateSpec& spec : specs) {
    if (spec.name == name) return spec;
  }
  std::string known;
  for (const runtime::StateSpec& spec : specs) known += (known.empty() ? "" : ", ") + spec.name;
  throw UsageError(fmt::format("rule '{}' has no state '{}' (it has: {})", rule.name(), name,
                               known.empty() ? "none" : known));
}

Quant Optimizer::Impl::quant_of(const runtime::ParamSlot& slot, std::size_t k) const {
  if (slot.binding < 0) return Quant::None;
  const DTypeBinding& b = bindings[static_cast<std::size_t>(slot.binding)];
  return k < b.quant.size() ? b.quant[k] : Quant::None;
}

DType Optimizer::Impl::element_dtype(const runtime::ParamSlot& slot) const {
  return slot.param.dtype == DType::F64 ? DType::F64 : options.state_dtype;
}

Tensor Optimizer::Impl::state_view(const runtime::StateSpec& spec, std::size_t p) const {
  using K = runtime::StateSpec::Kind;
  const runtime::ParamSlot& slot = params[p];
  Tensor t;
  t.device = device;
  t.dtype = spec.dtype;
  t.name = fusedopt::checkpoint::tensor_name(slot.name, spec.name);
  const auto k = static_cast<std::int64_t>(spec.index);
  switch (spec.kind) {
    case K::Element:
      t.data = slot.states[spec.index];
      t.numel = slot.param.numel;
      t.dtype = element_dtype(slot);
      if (const Quant q = quant_of(slot, spec.index); q != Quant::None) {
        t.dtype = DType::U8;  // the codes
        t.numel = fo_q_code_bytes(slot.param.numel, quant_bits(q));
      }
      break;
    case K::Absmax:
      if (const Quant q = quant_of(slot, spec.index); q != Quant::None) {
        const int block = bindings[static_cast<std::size_t>(slot.binding)].block();
        t.data = static_cast<std::byte*>(slot.states[spec.index]) +
                 fo_q_absmax_offset(slot.param.numel, quant_bits(q));
        t.numel = fo_q_blocks(slot.param.numel, block);
      }  // else: the state is kept unquantized for this param: no absmax
      break;
    case K::Output:
      t.data = slot.states[num_states + spec.index];
      t.numel = slot.param.numel;
      t.dtype = element_dtype(slot);
      break;
    case K::Scalar:
      t.data = slot.scalars + k;  // one double per tensor, empty tensors included
      t.numel = 1;
      break;
    case K::Row:
      // One float per row (column) of the param's matrices.
      t.data = slot.row_base + k * slot.row_stride + slot.row_first;
      t.numel = slot.row_count;
      break;
    case K::Col:
      t.data = slot.col_base + k * slot.col_stride + slot.col_first;
      t.numel = slot.col_count;
      break;
    case K::Master:
      t.data = slot.master;
      // An fp32 param (or an empty one) has no master.
      t.numel = slot.master != nullptr ? slot.param.numel : 0;
      break;
  }
  return t;
}

Optimizer::~Optimizer() = default;

Optimizer::Impl::~Impl() {
  // Kernels first (their launches use the arenas), then the memory, then the backend.
  kernels.clear();
  global_totals.reset();
  scalars.reset();
  rc_states.reset();
  arenas.clear();
}

std::int64_t Optimizer::Impl::current_step_count() const {
  double taken = 0;
  backend->copy_to_host(&taken, steps_taken.data(), sizeof taken);  // after queued steps
  return static_cast<std::int64_t>(taken);
}

void Optimizer::Impl::set_steps_taken(std::int64_t count) {
  const auto taken = static_cast<double>(count);                      // exact: count <= 2^53
  backend->copy_from_host(steps_taken.data(), &taken, sizeof taken);  // after queued steps
  steps_launched = count;
}
Optimizer::Optimizer(Optimizer&&) noexcept = default;
Optimizer& Optimizer::operator=(Optimizer&&) noexcept = default;

// A moved-from Optimizer has no Impl: every method but destruction and assignment refuses.
Optimizer::Impl& Optimizer::live(const char* method) const {
  FUSEDOPT_CHECK_USAGE(impl_ != nullptr, "Optimizer::{}: this Optimizer was moved from", method);
  return *impl_;
}

/// A verdict still on the device: the optimizer's verdict slot, as of step `serial`.
struct StepResult::Pending {
  std::weak_ptr<Optimizer::Impl::Verdicts> source;
  std::int64_t serial = 0;
};

bool StepResult::taken() const {
  if (!pending_) return taken_;
  const std::shared_ptr<Optimizer::Impl::Verdicts> source = pending_->source.lock();
  FUSEDOPT_CHECK_USAGE(source != nullptr,
                       "StepResult::taken: the optimizer of this step is gone; ask before it is "
                       "destroyed (or moved from)");
  FUSEDOPT_CHECK_USAGE(source->serial == pending_->serial,
                       "StepResult::taken: the optimizer has stepped again since (step {} of "
                       "this result, now {}): the device keeps the last verdict only; ask "
                       "before the next step, or use step_count() or a GradScaler",
                       pending_->serial, source->serial);
  double found = 0;
  source->backend->copy_to_host(&found, source->flag, sizeof found);  // waits for the step
  taken_ = found == 0.0;
  pending_.reset();
  return taken_;
}

bool Optimizer::Impl::skipped_now(const void* flag) const {
  const auto* readable = static_cast<const double*>(backend->host_address(flag));
  return readable != nullptr && *readable != 0.0;
}

runtime::StepArgs Optimizer::Impl::step_args(float inv_grad_scale, const DeviceScaler* scaler,
                                             const float* device_scale) const {
  // What every launch reads besides its tables: the count of steps taken (the launches'
  // step is one past it), the loss scale where the device holds it; the skip flag comes
  // with the verdict.
  runtime::StepArgs args;
  args.inv_grad_scale = inv_grad_scale;
  args.steps_taken = static_cast<const double*>(steps_taken.data());
  args.device_scale = device_scale;
  if (scaler) {
    args.device_scale = reinterpret_cast<const float*>(
        static_cast<const std::byte*>(scaler->scaler) + offsetof(fo_scaler, scale));
  }
  return args;
}

StepResult Optimizer::Impl::run_step(float inv_grad_scale, bool scaled, void* stream,
                                     const DeviceScaler* scaler, const float* device_scale,
                                     const void* skip_flag) {
  FUSEDOPT_CHECK_USAGE(steps_launched < kMaxSteps,
                       "the optimizer has taken {} steps, the most it takes (2^53)",
                       steps_launched);
  FUSEDOPT_CHECK_INTERNAL(scaler == nullptr || scaled,
                          "a device GradScaler's step is a scaled step");
  // The verdict slot: the last global total (0, or non-zero when a gradient is not finite).
  auto* const flag =
      static_cast<double*>(global_totals.data()) + detail::lang_rule(rule).num_global_reductions;
  const std::int64_t serial = ++verdicts->serial;
  runtime::StepArgs args = step_args(inv_grad_scale, scaler, device_scale);
  // A verdict made before the step (PyTorch's found_inf): as `SkipIf` below.
  if (skip_flag != nullptr) {
    if (skipped_now(skip_flag)) return StepResult(false);
    args.skip = static_cast<const double*>(skip_flag);
  }
  using K = runtime::StepOp::Kind;
  for (const runtime::StepOp& op : scaled ? scaled_program : plain_program) {
    switch (op.kind) {
      case K::Begin:
        extension->begin(stream);
        break;
      case K::CheckGrads:
        backend->fill(flag, 0, sizeof(double), stream);
        for (auto& kernel : kernels) {
          kernel->check_grads(inv_grad_scale, args.device_scale, flag, stream);
        }
        break;
      case K::CheckHook:
        if (extension) call_check_hook(stream);  // combines the verdict across ranks (by max)
        break;
      case K::SkipIf:
        // The one place the devices differ: where the verdict can be read in place (host
        // memory) the step stops now; elsewhere every later launch (the count included)
        // reads it, and nothing waits.
        if (skipped_now(flag)) return StepResult(false);
        args.skip = flag;
        break;
      case K::Reduce:
        for (auto& kernel : kernels) kernel->reduce(op.pass, args, op.check_grads, stream);
        break;
      case K::Finalize:
        // Fixed binding order: the global totals combine the same way every step.
        for (std::size_t b = 0; b < kernels.size(); ++b) {
          kernels[b]->finalize(op.pass, b > 0, args, stream, op.stage);
        }
        break;
      case K::Hook:
        if (extension) call_hook(op.pass, op.stage, stream);
        break;
      case K::Update:
        for (auto& kernel : kernels) kernel->update(args, stream);
        break;
      case K::End:
        count_step(args.skip, stream);
        if (scaler) {
          kernels.front()->update_scaler(scaler->scaler, flag, scaler->growth, scaler->backoff,
                                         scaler->interval, stream);
        }
        break;
      case K::Publish:
        extension->publish(stream);
        break;
    }
  }
  ++steps_launched;
  // The verdict is known now unless a launch still holds it.
  if (args.skip == nullptr || backend->host_address(args.skip) != nullptr) {
    return StepResult(!skipped_now(args.skip));
  }
  verdicts->backend = backend.get();
  verdicts->flag = args.skip;
  auto pending = std::make_shared<StepResult::Pending>();
  pending->source = verdicts;
  pending->serial = serial;
  return StepResult(std::shared_ptr<const StepResult::Pending>(std::move(pending)));
}

void Optimizer::Impl::count_step(const double* skip, void* stream) {
  auto* const count = static_cast<double*>(steps_taken.data());
  if (!kernels.empty()) {
    kernels.front()->count_step(count, skip, stream);
    return;
  }
  // Nothing to launch on (no binding): the count is written from here, after the queued
  // work (copy_from_host waits for it).
  double taken = 0;
  backend->copy_to_host(&taken, count, sizeof taken);
  double skipped = 0;
  if (skip) backend->copy_to_host(&skipped, skip, sizeof skipped);
  if (skipped == 0.0) taken += 1.0;
  backend->copy_from_host(count, &taken, sizeof taken);
}

void Optimizer::Impl::compile_programs() {
  const bool extended = extension != nullptr;
  plain_program =
      runtime::compile_step(reduction_passes, false, fold_check, extended, finalize_stages);
  scaled_program =
      runtime::compile_step(reduction_passes, true, fold_check, extended, finalize_stages);
}

void Optimizer::Impl::call_check_hook(void* stream) {
  ReductionPartials p;
  p.pass = -1;
  p.device = device;
  p.stream = stream;
  p.global = static_cast<double*>(global_totals.data());
  p.num_global = detail::lang_rule(rule).num_global_reductions + 1;
  ReductionSlotInfo info;
  info.name = "grad_check";
  info.slot = p.num_global - 1;
  info.pass = -1;
  info.max = true;
  p.slots.push_back(std::move(info));
  extension->combine(p);
}

void Optimizer::Impl::call_hook(int pass, int stage, void* stream) {
  ReductionPartials p;
  p.pass = pass;
  p.stage = stage;
  p.device = device;
  p.stream = stream;
  if (kernels.empty()) return;
  // The shard in the calls of a pass whose finalize takes stages (its column or matrix
  // means span pieces).
  const bool staged = static_cast<std::size_t>(pass) < finalize_stages.size() &&
                      finalize_stages[static_cast<std::size_t>(pass)] > 1;
  if (num_shard > 0 && staged) {
    p.shard = static_cast<double*>(shard.data());
    p.num_shard = num_shard;
    p.shard_max.assign(static_cast<std::size_t>(num_shard), 0);  // means: every one a sum
  }
  if (stage > 0) {  // the shard's matrix sums only
    p.global = static_cast<double*>(global_totals.data());
    p.num_global = kernels.front()->layout().num_global_slots;
    extension->combine(p);
    return;
  }
  const KernelLayout& body = kernels.front()->layout();
  p.num_global = body.num_global_slots;
  p.global = static_cast<double*>(global_totals.data());
  for (const ReductionSlot& s : body.slots) {
    if (s.pass != pass) continue;
    ReductionSlotInfo info;
    info.name = s.name;
    info.per_tensor = s.scope == ReductionScope::Tensor;
    info.slot = s.slot;
    info.pass = s.pass;
    info.max = s.max;
    info.line = s.line;
    p.slots.push_back(std::move(info));
  }
  for (std::size_t b = 0; b < kernels.size(); ++b) {
    const runtime::TensorTotalsView v = kernels[b]->tensor_totals();
    ReductionPartials::TensorTotals t;
    t.data = v.data;
    t.num_tensors = v.num_tensors;
    t.stride = v.stride;
    t.params = binding_params[b];
    p.tensors.push_back(std::move(t));
  }
  extension->combine(p);
}

StepResult Optimizer::Impl::run_amp_step(const float* grad_scale, const float* found_inf,
                                         void* stream) {
  // The fp32 found_inf becomes the step's skip flag (a double that is non-zero when it is):
  // its four bytes land in the flag's high word (little-endian: sign, exponent and the top
  // of the mantissa), the low word zeroed, so 0.0f (and -0.0f) reads as zero and anything
  // else as non-zero. Copies on the device only; the launches divide by *grad_scale.
  auto* const flag =
      static_cast<double*>(global_totals.data()) + detail::lang_rule(rule).num_global_reductions;
  if (found_inf) {
    backend->fill(flag, 0, sizeof(double), stream);
    backend->copy_on_device(reinterpret_cast<std::byte*>(flag) + sizeof(float), found_inf,
                            sizeof(float), stream);
  }
  return run_step(1.0f, false, stream, nullptr, grad_scale, found_inf ? flag : nullptr);
}

StepResult Optimizer::step_amp(const float* grad_scale, const float* found_inf, void* stream) {
  Impl& m = live("step_amp");
  Impl::Exclusive hold(m, "step_amp");
  return m.run_amp_step(grad_scale, found_inf, stream);
}

void Optimizer::set_step_count(std::int64_t count) {
  Impl& m = live("set_step_count");
  Impl::Exclusive hold(m, "set_step_count");
  FUSEDOPT_CHECK_USAGE(count >= 0 && count <= kMaxSteps,
                       "Optimizer::set_step_count: {} steps; the count must be in 0 to 2^53",
                       count);
  m.set_steps_taken(count);
}

StepResult Optimizer::step(void* stream) {
  Impl& m = live("step");
  Impl::Exclusive hold(m, "step");
  return m.run_step(1.0f, false, stream);
}

StepResult Optimizer::step_scaled(float inv_grad_scale, void* stream) {
  Impl& m = live("step_scaled");
  Impl::Exclusive hold(m, "step_scaled");
  return m.run_step(inv_grad_scale, true, stream);
}

std::unique_ptr<Optimizer> OptimizerExtension::make(const Rule& rule,
                                                    std::vector<ParamGroup> groups,
                                                    OptimizerOptions options,
                                                    std::vector<PieceOrigin> origins) {
  return std::unique_ptr<Optimizer>(
      new Optimizer(Optimizer::Impl::build(rule, std::move(groups), options, std::move(origins))));
}

void OptimizerExtension::set_step_extension(Optimizer& opt, StepExtension* extension) {
  Optimizer::Impl& m = opt.live("set_step_extension");
  m.own_extension.reset();
  m.extension = extension;
  m.compile_programs();
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

Tensor OptimizerExtension::step_counter(const Optimizer& opt) {
  const Optimizer::Impl& m = opt.live("step_counter");
  return Tensor(m.steps_taken.data(), 1, DType::F64, m.device, "step");
}

void OptimizerExtension::set_reduction_hook(Optimizer& opt, ReductionHook hook) {
  Optimizer::Impl& m = opt.live("set_reduction_hook");
  std::unique_ptr<StepExtension> own;
  if (hook) own = std::make_unique<HookExtension>(std::move(hook));
  m.extension = own.get();
  m.own_extension = std::move(own);
  m.compile_programs();
}

void check_hyper_value(const std::string& where, const std::string& name, int group, double value) {
  constexpr double kMax = static_cast<double>(std::numeric_limits<float>::max());
  FUSEDOPT_CHECK_USAGE(std::isfinite(value) && std::fabs(value) <= kMax,
                       "{}: hyper '{}' of group {} is {}: a hyper must be a finite number within "
                       "fp32's range (|x| <= {:.8g}), as the kernels read it",
                       where, name, group, value, kMax);
}

void Optimizer::Impl::assign_hyper(const char* method, const std::string& name, double value,
                                   std::optional<int> group) {
  const std::size_t k = hyper_index(name);
  const int groups = static_cast<int>(hypers.size());
  FUSEDOPT_CHECK_USAGE(!(group && (*group < 0 || *group >= groups)),
                       "{}('{}'): there is no group {} (the optimizer has {} group{})", method,
                       name, *group, groups, groups == 1 ? "" : "s");
  check_hyper_value(method, name, group.value_or(0), value);
  for (int g = 0; g < groups; ++g) {
    if (!group || *group == g) hypers[static_cast<std::size_t>(g)][k] = value;
  }
}

void Optimizer::set_hyper(const std::string& name, double value, std::optional<int> group) {
  Impl& m = live("set_hyper");
  Impl::Exclusive hold(m, "set_hyper");
  m.assign_hyper("set_hyper", name, value, group);
  m.push_hypers();
}

void Optimizer::set_hyper(const std::string& name, double value, std::optional<int> group,
                          void* stream) {
  Impl& m = live("set_hyper");
  Impl::Exclusive hold(m, "set_hyper");
  const auto before = m.hypers;
  m.assign_hyper("set_hyper", name, value, group);
  try {
    m.push_hypers_on(stream);
  } catch (...) {
    m.hypers = before;  // refused (a stream being captured): nothing changed
    throw;
  }
}

double Optimizer::hyper(const std::string& name, int group) const {
  live("hyper");
  const std::size_t k = impl_->hyper_index(name);
  const int groups = static_cast<int>(impl_->hypers.size());
  FUSEDOPT_CHECK_USAGE(!(group < 0 || group >= groups),
                       "hyper('{}'): there is no group {} (the optimizer has {} group{})", name,
                       group, groups, groups == 1 ? "" : "s");
  return impl_->hypers[static_cast<std::size_t>(group)][k];
}

std::int64_t Optimizer::step_count() const { return live("step_count").current_step_count(); }

std::vector<StateInfo> Optimizer::states() const {
  const Impl& m = live("states");
  // Element states and outputs of an optimizer of float64 params only are float64.
  const bool f64 = std::all_of(m.params.begin(), m.params.end(), [](const runtime::ParamSlot& s) {
    return s.param.dtype == DType::F64;
  });
  std::vector<StateInfo> out;
  for (const runtime::StateSpec& spec : m.specs) {
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
  const runtime::StateSpec& spec = live("state").state_spec(name);
  FUSEDOPT_CHECK_USAGE(
      !(param_index < 0 || static_cast<std::size_t>(param_index) >= impl_->params.size()),
      "state('{}', {}): there is no param {} (the optimizer has {})", name, param_index,
      param_index, impl_->params.size());
  return impl_->state_view(spec, static_cast<std::size_t>(param_index));
}

}  // namespace fusedopt
