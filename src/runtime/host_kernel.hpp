// A rule compiled for the host CPU and loaded: the smallest thing that runs a rule over a
// list of tensors. The Optimizer plans once (prepare()) and then launches the prepared
// tables every step; run() is the one-shot form the kernel tests use.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "abi.h"
#include "codegen/codegen.hpp"
#include "fusedopt/dtype.hpp"
#include "lang/ast.hpp"
#include "provider/kernel_provider.hpp"
#include "runtime/plan.hpp"
#include "runtime/step_args.hpp"

namespace fusedopt::runtime {

/// Elements per host work item (chunks come from build_chunks in chunks.hpp): large enough
/// to amortise the per-chunk work, small enough to balance a few large tensors across cores.
inline constexpr std::int64_t kHostChunkElems = 1 << 15;

class HostKernel {
 public:
  /// A Plan used in place, plus the reduction buffers its launches write. A step only
  /// fills a stack fo_launch from these (no allocation).
  class Prepared {
   public:
    Prepared() = default;
    explicit Prepared(Plan plan);
    /// Replaces the hyper table (`hypers[g]`: group g's values, Rule::hypers order).
    void set_hypers(const std::vector<std::vector<double>>& hypers) { plan_.set_hypers(hypers); }
    /// Sets one value of one group.
    void set_hyper(int group, int index, double value) { plan_.set_hyper(group, index, value); }
    /// New role pointers (Plan::rebind).
    void rebind(const codegen::KernelBody& body, const std::vector<std::vector<void*>>& ptrs) {
      plan_.rebind(body, ptrs);
    }
    std::int64_t num_chunks() const { return plan_.num_chunks(); }
    const std::vector<fo_chunk>& chunks() const { return plan_.chunks(); }
    /// Whether a launch has any work (false when every tensor is empty).
    bool empty() const { return plan_.empty(); }
    const Plan& plan() const { return plan_; }
    /// The launch for `args`, pointing into this object.
    fo_launch launch(const StepArgs& args) const;
    /// The launch for `step` and `inv_grad_scale`.
    fo_launch launch(double step, float inv_grad_scale) const {
      StepArgs args;
      args.step = step;
      args.inv_grad_scale = inv_grad_scale;
      return launch(args);
    }
    /// Uses `totals` (FO_NUM_GLOBAL_SLOTS doubles, shared with other kernels of one
    /// optimizer) for the global totals instead of this plan's own.
    void share_global_totals(double* totals) { global_ = totals; }
    /// Raw global totals (the last one: the grad check's count of non-finite values).
    const double* global_totals() const { return global_ ? global_ : own_global_.data(); }
    double* global_totals() { return global_ ? global_ : own_global_.data(); }
    /// Raw per-tensor totals: [tensor * stride + slot].
    double* tensor_totals() { return tensor_totals_.data(); }
    /// Uses `scalars` (plan().num_scalars() doubles, owned by the caller: an optimizer's
    /// state) for the per-tensor scalar states instead of this plan's own.
    void share_scalars(double* scalars) { scalars_ = scalars; }
    /// Uses `rows` and `cols` (plan().num_rows() / num_cols() floats per row / column
    /// state, state-major; owned by the caller) for the row and column states.
    void share_rc_states(float* rows, float* cols) {
      row_states_ = rows;
      col_states_ = cols;
    }
    /// The row and column states: [k * num_rows + row], [k * num_cols + col].
    float* row_states() const { return row_states_ ? row_states_ : own_rows_.data(); }
    float* col_states() const { return col_states_ ? col_states_ : own_cols_.data(); }
    /// The per-tensor scalar states: [tensor * scalar count + k] (null: the rule has none).
    double* scalars() const {
      return scalars_ ? scalars_ : own_scalars_.empty() ? nullptr : own_scalars_.data();
    }
    std::int64_t num_tensors() const { return plan_.num_tensors(); }

   private:
    Plan plan_;
    mutable std::vector<float> partials_;
    std::vector<double> tensor_totals_;
    std::vector<double> own_global_;
    double* global_ = nullptr;  ///< shared totals, or null: own_global_
    mutable std::vector<double> own_scalars_;
    double* scalars_ = nullptr;  ///< shared scalar states, or null: own_scalars_
    // Factored rules.
    mutable std::vector<double> row_totals_, col_totals_, matrix_totals_, col_partials_;
    mutable std::vector<float> own_rows_, own_cols_;
    float* row_states_ = nullptr;
    float* col_states_ = nullptr;
  };

  /// Generates, compiles (or loads from `cache`) and dlopens the host kernel of `rule`.
  HostKernel(std::shared_ptr<const lang::Rule> rule, DTypeBinding dtypes, cache::KernelCache& cache,
             codegen::Strategy strategy = codegen::Strategy::Auto);
  /// Loads a kernel the provider built for the host target.
  HostKernel(std::shared_ptr<const lang::Rule> rule, DTypeBinding dtypes,
             provider::ProvidedKernel kernel);
  ~HostKernel();
  HostKernel(const HostKernel&) = delete;
  HostKernel& operator=(const HostKernel&) = delete;

  /// Number of pointers per tensor: param, grad, each state (declaration order), each
  /// output (declaration order), then the fp32 master when dtypes.master.
  int num_roles() const;

  /// Validates the arguments and builds the tables. `ptrs[t]` holds tensor t's num_roles()
  /// pointers, `numel[t]` its element count. `hypers[g]` holds group g's hyper values in the
  /// rule's declaration order (Rule::hypers); `group[t]` is tensor t's group (empty: all
  /// group 0). The pointers must stay valid while the Prepared is used.
  Prepared prepare(const std::vector<std::vector<void*>>& ptrs,
                   const std::vector<std::int64_t>& numel,
                   const std::vector<std::vector<double>>& hypers,
                   const std::vector<int>& group = {}) const;
  /// The request of prepare() with this kernel's chunk size and name filled in.
  PlanRequest plan_request(const std::vector<std::vector<void*>>& ptrs,
                           const std::vector<std::int64_t>& numel,
                           const std::vector<std::vector<double>>& hypers,
                           const std::vector<int>& group) const;

  /// One step over the prepared tensors; `step` is 1-based. The gradient is multiplied by
  /// `inv_grad_scale` before the rule. A rule with reductions runs every reduction pass and
  /// its finalize, then the update (its global totals are this plan's alone).
  void step(const Prepared& prepared, double step, float inv_grad_scale = 1.0f) const;

  /// Reduction passes before the update (0: element-wise).
  int reduction_passes() const;
  /// Pass `pass` alone: a reduction pass (pass < reduction_passes(); with `check_grads`,
  /// pass 0 also counts non-finite unscaled gradients) or the update (the last pass).
  void run_pass(Prepared& prepared, int pass, const StepArgs& args, bool check_grads = false) const;
  /// Combines reduction pass `pass`'s chunk partials into the totals; with `accumulate`,
  /// the global totals are combined into (another kernel wrote them first), not replaced.
  /// A factored rule's matrix means evaluate row values of the step (`args`).
  void finalize(Prepared& prepared, int pass, bool accumulate, const StepArgs& args) const;
  /// What codegen said about the kernel (no code): schedule, slots, bytes per pass.
  const codegen::KernelBody& body() const { return info_.body; }
  /// Writes every state tensor's initial value (the rule's `state NAME = INIT`; with a
  /// master copy, the master from the param first) and every tensor's scalar states.
  void init_states(const Prepared& prepared) const;
  /// After a step's update pass: writes each tensor's scalar states (`scalar NAME`) as the
  /// step computed them (every tensor, empty ones included; nothing when the rule has none).
  void update_scalars(const Prepared& prepared, const StepArgs& args) const;
  /// Whether every gradient element times `inv_grad_scale` (over `*device_scale` when
  /// non-null) is finite (one pass over the gradients; run it before a grad-scaled step).
  bool grads_finite(const Prepared& prepared, float inv_grad_scale,
                    const float* device_scale = nullptr) const;

  const lang::Rule& rule() const { return *rule_; }
  const DTypeBinding& dtypes() const { return dtypes_; }
  /// Where the binary came from ("compiled", "memory", "disk").
  const std::string& origin() const { return info_.origin; }
  /// The cache key (32 hex digits) and the time it took to get the binary.
  const std::string& key() const { return info_.key; }
  double seconds() const { return info_.seconds; }

 private:
  struct Impl;
  std::shared_ptr<const lang::Rule> rule_;
  DTypeBinding dtypes_;
  provider::KernelInfo info_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fusedopt::runtime
