// runtime::Binding: one loaded kernel (a Module) planned over the tensors of one dtype
// binding, the same class on every device. It uploads the Plan's tables (chunks, pointers,
// hypers, per-tensor ranges and values) and the reduction scratch into the backend's memory
// once, keeps one launch table (abi.h's fo_launch) pointing at them, and launches each step
// op through the module with the step's StepArgs: the executor's ops on one binding.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "abi.h"
#include "device/backend.hpp"
#include "device/module.hpp"
#include "exec/matrix_stages.hpp"
#include "exec/plan.hpp"
#include "exec/step_args.hpp"
#include "kernel_layout.hpp"

namespace fusedopt::runtime {

/// The tensors of one binding, in kernel role order (param, grad, states, outputs, master).
struct BindingTensors {
  DTypeBinding dtypes;
  std::vector<std::vector<void*>> ptrs;
  std::vector<std::int64_t> numel;
  std::vector<int> group;                         ///< param group of each tensor
  std::vector<std::vector<std::int64_t>> shapes;  ///< each tensor's shape (empty: 1-D)
  /// Each tensor as errors name it ("group 1, param 0 ('w')"); empty: by its index here.
  std::vector<std::string> names;
  /// Raw global reduction totals shared by every kernel of one optimizer (memory of the
  /// backend's device); null: the kernel keeps its own.
  void* global_totals = nullptr;
  /// The tensors' per-tensor scalar states, [tensor * scalar count + k] doubles (memory of
  /// the backend's device, owned by the caller: optimizer state); null: the kernel keeps
  /// its own (or the rule has none).
  void* scalars = nullptr;
  /// Factored rules: the tensors' row and column states, [k * rows of the binding + row]
  /// and [k * columns + column] floats (caller's memory); null: the kernel keeps its own.
  void* row_states = nullptr;
  void* col_states = nullptr;
  ReductionStrategy strategy = ReductionStrategy::Auto;
  /// [2 * tensor]: which param each tensor is and the index of its first element there, and
  /// the seed: the key of the random numbers (stochastic rounding, rand()); empty: tensor t,
  /// element 0.
  std::vector<long long> ids;
  unsigned long long seed = 0;
  /// [tensor * 4]: the whole tensor's numel, dims, rows, cols of each tensor that is a piece
  /// (Tensor::whole_shape; a whole one's own): the rule's built-ins; empty: no pieces.
  std::vector<double> whole_info;
  /// Per tensor: 1 where a factored rule's column sums and matrix sums over rows span pieces
  /// (a piece of a 1-D or 2-D tensor): they go through the shard (abi.h); empty: none.
  std::vector<char> spans;
  /// Matrix stages (orthogonalize) iterate in bf16 as torch.optim.Muon does; else fp32.
  bool stage_bf16 = false;
  /// Each tensor's whole param's shape (Tensor::whole_shape, else its shape): a matrix
  /// stage's matrix; a tensor of fewer elements is a piece of it (ids: where).
  std::vector<std::vector<std::int64_t>> whole_shapes;
};

/// A kernel's per-tensor reduction totals: data[t * stride + slot] (backend memory).
struct TensorTotalsView {
  double* data = nullptr;
  std::int64_t num_tensors = 0;
  int stride = 0;
};

class Binding {
 public:
  /// Plans `module` over `tensors` (memory of `backend`'s device; `hypers[g]` is group g's
  /// values in Rule::hypers order) and uploads the tables, complete on return. Errors name
  /// the tensor (BindingTensors::names) and role. `backend` must outlive the binding.
  Binding(Backend& backend, std::shared_ptr<Module> module, const BindingTensors& tensors,
          const std::vector<std::vector<double>>& hypers);
  ~Binding();
  Binding(const Binding&) = delete;
  Binding& operator=(const Binding&) = delete;

  /// Writes every state's initial value (and the master copy); complete on return.
  void init_states();
  /// Reduction pass `pass` (below layout().reduction_passes); `check_grads` also counts
  /// non-finite unscaled gradients in pass 0.
  void reduce(int pass, const StepArgs& args, bool check_grads, void* stream);
  /// Combines pass `pass`'s partials into the totals; with `accumulate` the shared global
  /// totals are combined into rather than replaced (a binding before this one wrote them).
  /// A factored rule's matrix means read values of the step (`args`).
  /// `stage`: 0 the whole finalize; with pieces 1 to 3 (abi.h's rc_stage), the reduction
  /// hook combining the shard between them.
  void finalize(int pass, bool accumulate, const StepArgs& args, void* stream, int stage = 0);
  /// The matrix stages after pass `pass` (orthogonalize), if any.
  void stage(int pass, void* stream);
  bool has_stage(int pass) const { return stages_.after(pass); }
  const MatrixStages& matrix_stages() const { return stages_; }
  /// Doubles of the sums that span pieces (BindingTensors::spans; 0: none), which the
  /// kernel writes at the memory set_shard() gives (backend memory, the size of this).
  std::int64_t shard_size() const { return shard_size_; }
  void set_shard(double* shard) { base_.shard = shard; }
  /// The update pass; then, for a rule with scalar, row or column states, every tensor's
  /// new values of them (one more launch).
  void update(const StepArgs& args, void* stream);
  /// The separate grad check: sets the double at `flag` (the verdict slot, zeroed by the
  /// caller) to 1 when a gradient times `inv_grad_scale` (over `*device_scale` when non-null)
  /// is not finite.
  void check_grads(float inv_grad_scale, const float* device_scale, void* flag, void* stream);
  /// Counts a step: the double at `steps_taken` grows by one unless `skip` is non-null and
  /// the double there is non-zero (the step was not taken).
  void count_step(double* steps_taken, const double* skip, void* stream);
  /// A GradScaler's update after a step: the fo_scaler at `scaler` from the step's
  /// grad-check flag at `flag` (abi.h's fo_update_scale).
  void update_scaler(void* scaler, const void* flag, float growth, float backoff, int interval,
                     void* stream);
  /// Replaces the hyper table (`hypers[g]`: group g's values), one copy per group ordered
  /// on `stream` after the work queued there, without waiting: the launches queued on
  /// `stream` after it read the new values. UsageError, changing nothing, for a wrong table
  /// or while `stream` is being captured (the copy would read host memory gone by the replay).
  void set_hypers(const std::vector<std::vector<double>>& hypers, void* stream);
  /// UsageError, naming the group and hyper, for values the matrix stages refuse.
  void check_hypers(const std::vector<std::vector<double>>& hypers) const {
    stages_.check_hypers(hypers);
  }
  /// New role pointers for the tensors (BindingTensors::ptrs' form, sizes unchanged),
  /// checked as at construction; the pointer and alignment tables are copied in `stream`'s
  /// order without waiting. Nothing changes when it throws.
  void rebind(const std::vector<std::vector<void*>>& ptrs, void* stream);

  /// The launch table of `args` (pointers of the device's memory).
  fo_launch launch_table(const StepArgs& args) const;
  /// Per-tensor reduction totals: [t * stride + slot] (the device's memory).
  TensorTotalsView tensor_totals() const;
  /// The per-tensor scalar states: [tensor * layout().num_scalars + k] (the device's memory;
  /// null when the rule has none).
  double* scalars() const;
  const Plan& plan() const { return plan_; }
  const Module& module() const { return *module_; }
  const KernelLayout& layout() const { return module_->layout(); }
  /// Scratch memory of the Store strategy, in bytes.
  std::int64_t scratch_bytes() const { return static_cast<std::int64_t>(scratch_.size()); }
  /// Launches per step (0 when every tensor is empty and the rule has no scalar states),
  /// the step's count included when `with_count` and the count is a launch on this device.
  int launches_per_step(bool with_count) const;
  const std::string& key() const { return module_->info().key; }
  KernelOrigin origin() const { return module_->info().origin; }
  double seconds() const { return module_->info().seconds; }

 private:
  /// `values` in a new buffer of the backend (at least 16 bytes), complete on return.
  template <typename T>
  Buffer upload(const std::vector<T>& values);
  /// The tables of every launch in base_ (and the buffers behind them).
  void upload_tables(const BindingTensors& tensors);
  void upload_factored(const BindingTensors& tensors);

  Backend& backend_;
  std::shared_ptr<Module> module_;  ///< shared by the bindings of one loaded kernel
  std::vector<std::string> names_;
  Plan plan_;
  Buffer scratch_;  ///< the Store strategy's and the matrix stages' scratch tensors
  MatrixStages stages_;
  // The tables, and the reduction and state buffers the launches use.
  Buffer chunks_, ptrs_, hypers_, aligned_, tensor_info_, tensor_groups_, tensor_chunks_,
      tensor_ids_;
  Buffer partials_, tensor_totals_, own_global_, own_scalars_;
  Buffer rc_offsets_, chunk_cols_, row_totals_, col_totals_, matrix_totals_, col_partials_;
  Buffer own_rows_, own_cols_;
  Buffer tensor_whole_, shard_offsets_;
  std::int64_t shard_size_ = 0;
  fo_launch base_{};
};

}  // namespace fusedopt::runtime
