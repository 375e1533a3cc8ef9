// The optimizer's step runner: one loaded kernel per dtype binding, the step as a program
// (step_program.hpp) over them, the counter of steps taken on the device, the verdict of a
// checked step, and the step extension (a library's ops around the reductions).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device/backend.hpp"
#include "exec/binding.hpp"
#include "exec/step_program.hpp"
#include "fusedopt/extension.hpp"
#include "fusedopt/optimizer.hpp"

namespace fusedopt {

/// The most steps an optimizer takes (2^53: every count is exact as a double, and the
/// counter can never overflow); a checkpoint claiming more is refused.
inline constexpr std::int64_t kMaxSteps = std::int64_t{1} << 53;

namespace runtime {

/// Where a step's device verdict is read (the grad-check slot of the global totals), and
/// the serial of the last step: a StepResult of an older step can no longer be read. Shared
/// with the StepResults (weakly: the runner's end expires them).
struct Verdicts {
  Backend* backend = nullptr;
  const void* flag = nullptr;
  std::int64_t serial = 0;
};

/// A device GradScaler's part in a step (capturable CUDA): its fo_scaler (device memory),
/// whose scale the step divides by and which is updated after the step, and its factors.
struct DeviceScaler {
  void* scaler = nullptr;
  float growth = 2.0f;
  float backoff = 0.5f;
  int interval = 2000;
};

/// What a step is asked to do besides the update (StepRunner::run).
struct StepRequest {
  float inv_grad_scale = 1.0f;  ///< the gradients are multiplied by it
  /// Checked: a non-finite unscaled gradient anywhere skips the step (not taken) and
  /// changes nothing.
  bool scaled = false;
  void* stream = nullptr;
  /// A device GradScaler (CUDA, scaled): the gradients are also divided by its scale, and
  /// it is updated after the step.
  const DeviceScaler* scaler = nullptr;
  /// PyTorch's AMP protocol (CUDA, device memory): the launches also divide by the fp32 at
  /// `device_scale`, and do nothing when the double at `skip_flag` is non-zero.
  const float* device_scale = nullptr;
  const void* skip_flag = nullptr;
};

class StepRunner {
 public:
  StepRunner() = default;
  ~StepRunner();
  StepRunner(const StepRunner&) = delete;
  StepRunner& operator=(const StepRunner&) = delete;

  /// Allocates the shared global reduction totals of `rule` (its last slot the grad check)
  /// and the step counter on `backend`, which must outlive the runner.
  void start(Backend& backend, const Rule& rule);
  void* global_totals() const { return global_totals_.data(); }
  /// Loads one kernel per binding of `tensors` (binding_params: the param of each tensor),
  /// writes the initial states and compiles the step programs.
  void bind(const Rule& rule, const std::vector<BindingTensors>& tensors,
            const std::vector<std::vector<double>>& hypers,
            std::vector<std::vector<int>> binding_params);

  /// One step: the reduction passes (if any), then the update, on every binding. On CUDA
  /// nothing waits: the verdict stays on the device until asked.
  StepResult run(const StepRequest& request);
  /// PyTorch's AMP protocol (Optimizer::step_amp).
  StepResult run_amp(const float* grad_scale, const float* found_inf, void* stream);

  /// The steps taken (the device's counter, read after the queued steps).
  std::int64_t steps_taken() const;
  /// Sets the steps taken, after the queued steps (a checkpoint load, set_step_count).
  void set_steps_taken(std::int64_t count);
  /// The counter as a tensor of one double (OptimizerExtension::step_counter).
  Tensor step_counter(const Device& device) const;
  /// UsageError, naming the group and hyper, for values a matrix stage refuses (changes
  /// nothing).
  void check_hypers(const std::vector<std::vector<double>>& hypers) const;
  /// Hands `hypers` to every kernel, after every queued step (on any stream) and before the
  /// next.
  void set_hypers(const std::vector<std::vector<double>>& hypers);
  /// The same, ordered on `stream` (no waiting).
  void set_hypers_on(const std::vector<std::vector<double>>& hypers, void* stream);
  /// Points the kernels at new role pointers (per binding), ordered on `stream`.
  void rebind(const std::vector<std::vector<std::vector<void*>>>& ptrs, void* stream);
  /// The step extension (null: none); `own` keeps one made here.
  void set_extension(StepExtension* extension, std::unique_ptr<StepExtension> own = nullptr);

  const std::vector<std::unique_ptr<Binding>>& kernels() const { return kernels_; }
  const StepProgram& plain_program() const { return plain_; }
  const StepProgram& scaled_program() const { return scaled_; }
  int reduction_passes() const { return reduction_passes_; }
  /// Pieces of a factored rule: per reduction pass, how many stages its finalize takes.
  const std::vector<int>& finalize_stages() const { return finalize_stages_; }

 private:
  /// What a step's launches read: the gradient factor, the count of steps taken, the loss
  /// scale of the scaler or device_scale (device memory) when given.
  StepArgs step_args(const StepRequest& request) const;
  /// Whether the verdict at `flag` can be read in place (host memory) and says skip.
  bool skipped_now(const void* flag) const;
  /// The Stage op: the matrix stages after pass `pass` (over pieces: the extension's).
  void run_stage(int pass, void* stream);
  /// The End op: counts the step unless `skip` says it was skipped.
  void count_step(const double* skip, void* stream);
  /// The step programs of the schedule and the extension.
  void compile_programs();
  /// Pieces of a factored rule: the shard and finalize_stages_ (after the kernels).
  void lay_out_shard(const Rule& rule);
  /// Hands pass `pass`'s totals to the extension: stage 0 its global and per-tensor totals
  /// (and the shard's column sums), stage 1 the shard's matrix sums (pieces).
  void call_hook(int pass, int stage, void* stream);
  /// Hands a scaled step's separate grad check to the extension as pass -1.
  void call_check_hook(void* stream);
  /// The grad-check slot of the global totals: 0, or non-zero when a gradient is not finite.
  double* verdict_flag() const;

  Backend* backend_ = nullptr;
  Device device_;
  int num_global_reductions_ = 0;
  int reduction_passes_ = 0;
  Buffer global_totals_;  ///< shared global reduction totals (backend memory)
  /// The steps taken (one double, backend memory): launches read their step from it (one
  /// past it) and a step's last launch counts it unless the step was skipped, so the count
  /// needs nothing from the host (graph replays advance it).
  Buffer steps_taken_;
  /// Pieces of a factored rule: the sums that span pieces (abi.h's shard), every binding's
  /// in binding order, handed to the extension; per reduction pass, how many stages its
  /// finalize takes (1: unstaged, else 2 or 3).
  Buffer shard_;
  std::int64_t num_shard_ = 0;
  std::vector<int> finalize_stages_;
  std::vector<std::unique_ptr<Binding>> kernels_;  ///< one per binding
  std::vector<std::vector<int>> binding_params_;   ///< per binding: the param of each tensor
  /// The step as a program: plain, and scaled (checked and skipped on a non-finite
  /// gradient).
  StepProgram plain_, scaled_;
  /// Whether the grad check may ride on pass 0 (no binding's pass 0 writes).
  bool fold_check_ = true;
  /// Steps launched since start or the last set_steps_taken (the 2^53 limit's count, kept
  /// on the host so that a step never waits for the device).
  std::int64_t steps_launched_ = 0;
  StepExtension* extension_ = nullptr;
  std::unique_ptr<StepExtension> own_extension_;
  std::shared_ptr<Verdicts> verdicts_ = std::make_shared<Verdicts>();
};

}  // namespace runtime
}  // namespace fusedopt
