// The step runner (step_runner.hpp): the kernels of the bindings, the step program run over
// them, the device's step counter and verdict, and the calls to the step extension.
#include "optimizer/step_runner.hpp"

#include <algorithm>
#include <cstddef>

#include "abi.h"
#include "compile/kernel_loader.hpp"
#include "compile/kernel_provider.hpp"
#include "fusedopt/error.hpp"
#include "rule_access.hpp"
#include "support/check.hpp"

namespace fusedopt {

/// A verdict still on the device: the runner's verdict slot, as of step `serial`.
struct StepResult::Pending {
  std::weak_ptr<runtime::Verdicts> source;
  std::int64_t serial = 0;
};

bool StepResult::taken() const {
  if (!pending_) return taken_;
  const std::shared_ptr<runtime::Verdicts> source = pending_->source.lock();
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

namespace runtime {

StepRunner::~StepRunner() {
  // Kernels first (their launches use the totals, the shard and the counter).
  kernels_.clear();
}

void StepRunner::start(Backend& backend, const Rule& rule) {
  const lang::Rule& r = detail::lang_rule(rule);
  backend_ = &backend;
  device_ = backend.device();
  num_global_reductions_ = r.num_global_reductions;
  reduction_passes_ = r.reduction_passes;
  // The global reduction totals: one row shared by every binding's kernel. Its last slot
  // is the grad check, which capturable steps also use as the device-side skip flag and
  // which a step_scaled's separate check hands to the extension (every rule has it).
  const auto slots = static_cast<std::size_t>(num_global_reductions_) + 1;
  global_totals_ = backend.allocate(slots * sizeof(double));
  steps_taken_ = backend.allocate(sizeof(double));  // zeroed: no step taken
}

void StepRunner::bind(const Rule& rule, const std::vector<BindingTensors>& tensors,
                      const std::vector<std::vector<double>>& hypers,
                      std::vector<std::vector<int>> binding_params) {
  binding_params_ = std::move(binding_params);
  for (const BindingTensors& t : tensors) {
    kernels_.push_back(
        std::make_unique<Binding>(*backend_,
                                  load_kernel(*backend_, RuleAccess::impl(rule), t.dtypes,
                                              t.strategy, provider::cache_at({})),
                                  t, hypers));
  }
  lay_out_shard(rule);
  for (auto& kernel : kernels_) kernel->init_states();
  // The grad check rides on pass 0 (one read of the gradient for the unscale, the check and
  // any norm) unless a pass 0 writes (the Store strategy with one reduction pass): the skip
  // must be known before anything is written.
  fold_check_ = true;
  for (const auto& kernel : kernels_) fold_check_ = fold_check_ && kernel->layout().store_pass != 0;
  compile_programs();
}

void StepRunner::lay_out_shard(const Rule& rule) {
  // Pieces of a factored rule: the sums that span pieces, every binding's in one buffer,
  // and the stages of each pass's finalize that reads them (abi.h's rc_stage).
  for (const auto& kernel : kernels_) num_shard_ += kernel->shard_size();
  if (num_shard_ == 0) return;
  shard_ = backend_->allocate(static_cast<std::size_t>(num_shard_) * sizeof(double));
  auto* at = static_cast<double*>(shard_.data());
  for (auto& kernel : kernels_) {
    kernel->set_shard(at);
    at += kernel->shard_size();
  }
  finalize_stages_.assign(static_cast<std::size_t>(reduction_passes_), 1);
  for (const lang::Reduction& r : detail::lang_rule(rule).reductions) {
    int& n = finalize_stages_.at(static_cast<std::size_t>(r.pass));
    if (r.scope == ReductionScope::Col) n = std::max(n, 2);
    if (r.scope == ReductionScope::Matrix)
      n = std::max(n, r.arg->level == lang::Level::Col ? 2 : 3);
  }
}

void StepRunner::compile_programs() {
  const bool extended = extension_ != nullptr;
  std::vector<int> matrix_stages;
  for (int pass = 0; pass < reduction_passes_; ++pass) {
    for (const auto& kernel : kernels_) {
      if (kernel->has_stage(pass)) {
        matrix_stages.push_back(pass);
        break;
      }
    }
  }
  plain_ = compile_step(reduction_passes_, false, fold_check_, extended, finalize_stages_,
                        matrix_stages);
  scaled_ =
      compile_step(reduction_passes_, true, fold_check_, extended, finalize_stages_, matrix_stages);
}

void StepRunner::set_extension(StepExtension* extension, std::unique_ptr<StepExtension> own) {
  extension_ = extension;
  own_extension_ = std::move(own);
  compile_programs();
}

double* StepRunner::verdict_flag() const {
  return static_cast<double*>(global_totals_.data()) + num_global_reductions_;
}

bool StepRunner::skipped_now(const void* flag) const {
  const auto* readable = static_cast<const double*>(backend_->host_address(flag));
  return readable != nullptr && *readable != 0.0;
}

StepArgs StepRunner::step_args(const StepRequest& request) const {
  // What every launch reads besides its tables: the count of steps taken (the launches'
  // step is one past it), the loss scale where the device holds it; the skip flag comes
  // with the verdict.
  StepArgs args;
  args.inv_grad_scale = request.inv_grad_scale;
  args.steps_taken = static_cast<const double*>(steps_taken_.data());
  args.device_scale = request.device_scale;
  if (request.scaler) {
    args.device_scale = reinterpret_cast<const float*>(
        static_cast<const std::byte*>(request.scaler->scaler) + offsetof(fo_scaler, scale));
  }
  return args;
}

StepResult StepRunner::run(const StepRequest& request) {
  FUSEDOPT_CHECK_USAGE(steps_launched_ < kMaxSteps,
                       "the optimizer has taken {} steps, the most it takes (2^53)",
                       steps_launched_);
  FUSEDOPT_CHECK_INTERNAL(request.scaler == nullptr || request.scaled,
                          "a device GradScaler's step is a scaled step");
  void* const stream = request.stream;
  double* const flag = verdict_flag();
  const std::int64_t serial = ++verdicts_->serial;
  StepArgs args = step_args(request);
  // A verdict made before the step (PyTorch's found_inf): as `SkipIf` below.
  if (request.skip_flag != nullptr) {
    if (skipped_now(request.skip_flag)) return StepResult(false);
    args.skip = static_cast<const double*>(request.skip_flag);
  }
  using K = StepOp::Kind;
  for (const StepOp& op : request.scaled ? scaled_ : plain_) {
    switch (op.kind) {
      case K::Begin:
        extension_->begin(stream);
        break;
      case K::CheckGrads:
        backend_->fill(flag, 0, sizeof(double), stream);
        for (auto& kernel : kernels_) {
          kernel->check_grads(request.inv_grad_scale, args.device_scale, flag, stream);
        }
        break;
      case K::CheckHook:
        if (extension_) call_check_hook(stream);  // combines the verdict across ranks (by max)
        break;
      case K::SkipIf:
        // The one place the devices differ: where the verdict can be read in place (host
        // memory) the step stops now; elsewhere every later launch (the count included)
        // reads it, and nothing waits.
        if (skipped_now(flag)) return StepResult(false);
        args.skip = flag;
        break;
      case K::Reduce:
        for (auto& kernel : kernels_) kernel->reduce(op.pass, args, op.check_grads, stream);
        break;
      case K::Finalize:
        // Fixed binding order: the global totals combine the same way every step.
        for (std::size_t b = 0; b < kernels_.size(); ++b) {
          kernels_[b]->finalize(op.pass, b > 0, args, stream, op.stage);
        }
        break;
      case K::Hook:
        if (extension_) call_hook(op.pass, op.stage, stream);
        break;
      case K::Stage:
        run_stage(op.pass, stream);
        break;
      case K::Update:
        for (auto& kernel : kernels_) kernel->update(args, stream);
        break;
      case K::End:
        count_step(args.skip, stream);
        if (const DeviceScaler* s = request.scaler) {
          kernels_.front()->update_scaler(s->scaler, flag, s->growth, s->backoff, s->interval,
                                          stream);
        }
        break;
      case K::Publish:
        extension_->publish(stream);
        break;
    }
  }
  ++steps_launched_;
  // The verdict is known now unless a launch still holds it.
  if (args.skip == nullptr || backend_->host_address(args.skip) != nullptr) {
    return StepResult(!skipped_now(args.skip));
  }
  verdicts_->backend = backend_;
  verdicts_->flag = args.skip;
  auto pending = std::make_shared<StepResult::Pending>();
  pending->source = verdicts_;
  pending->serial = serial;
  return StepResult(std::shared_ptr<const StepResult::Pending>(std::move(pending)));
}

StepResult StepRunner::run_amp(const float* grad_scale, const float* found_inf, void* stream) {
  // The fp32 found_inf becomes the step's skip flag (a double that is non-zero when it is):
  // its four bytes land in the flag's high word (little-endian: sign, exponent and the top
  // of the mantissa), the low word zeroed, so 0.0f (and -0.0f) reads as zero and anything
  // else as non-zero. Copies on the device only; the launches divide by *grad_scale.
  double* const flag = verdict_flag();
  if (found_inf) {
    backend_->fill(flag, 0, sizeof(double), stream);
    backend_->copy_on_device(reinterpret_cast<std::byte*>(flag) + sizeof(float), found_inf,
                             sizeof(float), stream);
  }
  StepRequest request;
  request.stream = stream;
  request.device_scale = grad_scale;
  request.skip_flag = found_inf ? flag : nullptr;
  return run(request);
}

void StepRunner::count_step(const double* skip, void* stream) {
  auto* const count = static_cast<double*>(steps_taken_.data());
  if (!kernels_.empty()) {
    kernels_.front()->count_step(count, skip, stream);
    return;
  }
  // Nothing to launch on (no binding): the count is written from here, after the queued
  // work (copy_from_host waits for it).
  double taken = 0;
  backend_->copy_to_host(&taken, count, sizeof taken);
  double skipped = 0;
  if (skip) backend_->copy_to_host(&skipped, skip, sizeof skipped);
  if (skipped == 0.0) taken += 1.0;
  backend_->copy_from_host(count, &taken, sizeof taken);
}

std::int64_t StepRunner::steps_taken() const {
  double taken = 0;
  backend_->copy_to_host(&taken, steps_taken_.data(), sizeof taken);  // after queued steps
  return static_cast<std::int64_t>(taken);
}

void StepRunner::set_steps_taken(std::int64_t count) {
  const auto taken = static_cast<double>(count);                        // exact: count <= 2^53
  backend_->copy_from_host(steps_taken_.data(), &taken, sizeof taken);  // after queued steps
  steps_launched_ = count;
}

Tensor StepRunner::step_counter(const Device& device) const {
  return Tensor(steps_taken_.data(), 1, DType::F64, device, "step");
}

void StepRunner::check_hypers(const std::vector<std::vector<double>>& hypers) const {
  for (const auto& kernel : kernels_) kernel->check_hypers(hypers);
}

void StepRunner::run_stage(int pass, void* stream) {
  bool pieces = false;
  for (const auto& kernel : kernels_) pieces = pieces || kernel->matrix_stages().pieces();
  if (pieces && extension_) {
    // Pieces of matrices: the extension gathers each whole (e.g. to one rank) for its stage.
    MatrixStageWork work;
    work.pass = pass;
    work.device = device_;
    work.stream = stream;
    for (const auto& kernel : kernels_)
      kernel->matrix_stages().add_work(pass, kernel->plan(), work);
    const Binding* first = kernels_.empty() ? nullptr : kernels_.front().get();
    work.orthogonalize = [first](int stage, int group, float* data, std::int64_t rows,
                                 std::int64_t cols) {
      FUSEDOPT_CHECK_INTERNAL(first != nullptr, "a matrix stage without a binding");
      matrix::orthogonalize(data, 1, rows, cols,
                            first->matrix_stages().iteration(stage, group, first->plan()));
    };
    backend_->synchronize(stream);  // the pieces' inputs written
    if (extension_->orthogonalize(work)) return;
  }
  for (auto& kernel : kernels_) kernel->stage(pass, stream);
}

void StepRunner::set_hypers(const std::vector<std::vector<double>>& hypers) {
  // The hyper tables are read by every launch: the copy waits for the queued steps (on any
  // stream), and the next step for the copy.
  backend_->synchronize();
  set_hypers_on(hypers, nullptr);
  backend_->synchronize();
}

void StepRunner::set_hypers_on(const std::vector<std::vector<double>>& hypers, void* stream) {
  check_hypers(hypers);  // before any binding takes them
  for (auto& kernel : kernels_) kernel->set_hypers(hypers, stream);
}

void StepRunner::rebind(const std::vector<std::vector<std::vector<void*>>>& ptrs, void* stream) {
  for (std::size_t b = 0; b < kernels_.size(); ++b) kernels_[b]->rebind(ptrs[b], stream);
}

void StepRunner::call_check_hook(void* stream) {
  ReductionPartials p;
  p.pass = -1;
  p.device = device_;
  p.stream = stream;
  p.global = static_cast<double*>(global_totals_.data());
  p.num_global = num_global_reductions_ + 1;
  ReductionSlotInfo info;
  info.name = "grad_check";
  info.slot = p.num_global - 1;
  info.pass = -1;
  info.max = true;
  p.slots.push_back(std::move(info));
  extension_->combine(p);
}

void StepRunner::call_hook(int pass, int stage, void* stream) {
  ReductionPartials p;
  p.pass = pass;
  p.stage = stage;
  p.device = device_;
  p.stream = stream;
  if (kernels_.empty()) return;
  // The shard in the calls of a pass whose finalize takes stages (its column or matrix
  // means span pieces).
  const bool staged = static_cast<std::size_t>(pass) < finalize_stages_.size() &&
                      finalize_stages_[static_cast<std::size_t>(pass)] > 1;
  if (num_shard_ > 0 && staged) {
    p.shard = static_cast<double*>(shard_.data());
    p.num_shard = num_shard_;
    p.shard_max.assign(static_cast<std::size_t>(num_shard_), 0);  // means: every one a sum
  }
  const KernelLayout& body = kernels_.front()->layout();
  p.global = static_cast<double*>(global_totals_.data());
  p.num_global = body.num_global_slots;
  if (stage > 0) {  // the shard's matrix sums only
    extension_->combine(p);
    return;
  }
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
  for (std::size_t b = 0; b < kernels_.size(); ++b) {
    const TensorTotalsView v = kernels_[b]->tensor_totals();
    ReductionPartials::TensorTotals t;
    t.data = v.data;
    t.num_tensors = v.num_tensors;
    t.stride = v.stride;
    t.params = binding_params_[b];
    p.tensors.push_back(std::move(t));
  }
  extension_->combine(p);
}

}  // namespace runtime
}  // namespace fusedopt
