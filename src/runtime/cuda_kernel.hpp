// A rule compiled for one CUDA device and loaded, plus the device-resident plan of one
// tensor list: the CUDA counterpart of HostKernel. Each step is ONE kernel launch whatever
// the number of tensors (the chunk table, pointer table and hypers live in device memory,
// uploaded once; the launch passes only a small fo_launch by value).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "abi.h"
#include "codegen/codegen.hpp"
#include "fusedopt/dtype.hpp"
#include "lang/ast.hpp"
#include "provider/kernel_provider.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/plan.hpp"
#include "runtime/step_args.hpp"

namespace fusedopt::runtime {

/// Threads per block of the CUDA kernels: FO_CUDA_BLOCK of abi.h, which the kernels use.
constexpr int kCudaBlock = FO_CUDA_BLOCK;
/// Elements per chunk of the CUDA plan (a multiple of 4, so every chunk can take the
/// vector path): 32 iterations of 512 threads x 4 elements.
constexpr std::int64_t kCudaChunk = 1 << 16;

class CudaKernel {
 public:
  /// Generates the kernel of `rule`, compiles it for device `device`'s sm_XX with NVRTC
  /// (or takes it from `cache`) and loads it into the device's primary context.
  /// Throws fusedopt::Error / CudaError (no driver, no device, compile failure).
  CudaKernel(std::shared_ptr<const lang::Rule> rule, DTypeBinding dtypes, int device,
             cache::KernelCache& cache, codegen::Strategy strategy = codegen::Strategy::Auto);
  /// The same with the kernel from `provide(target)`: a CUBIN for the device, or PTX
  /// (device_target.hpp); called again with a PTX target if the driver refuses the CUBIN.
  CudaKernel(std::shared_ptr<const lang::Rule> rule, DTypeBinding dtypes, int device,
             const std::function<provider::ProvidedKernel(const Target&)>& provide);
  ~CudaKernel();
  CudaKernel(const CudaKernel&) = delete;
  CudaKernel& operator=(const CudaKernel&) = delete;

  /// Pointers per tensor: param, grad, each state, each output, then the fp32 master.
  int num_roles() const;
  int device() const;
  int sm() const;  ///< the compute capability the kernel was compiled for (90: sm_90)

  /// Builds the device plan for a tensor list, replacing any previous one: `ptrs[t]` holds
  /// tensor t's num_roles() device pointers, `numel[t]` its size (0 allowed: skipped),
  /// `hypers[g]` group g's values in Rule::hypers order, `group[t]` tensor t's group
  /// (empty: all 0). Uploads the chunk table, the pointer table, per-tensor alignment flags
  /// (every role aligned to 4 of its elements: the vector path) and the hypers, synchronously
  /// (complete on return, so a launch on any stream sees them). Do not call it while a step that
  /// uses the previous plan may still run: its buffers are freed here. Resets
  /// the capturable step to 0 steps taken.
  void set_tensors(const std::vector<std::vector<cuda::DevicePtr>>& ptrs,
                   const std::vector<std::int64_t>& numel,
                   const std::vector<std::vector<double>>& hypers,
                   const std::vector<int>& group = {});

  /// How errors name the plan's tensor t: `names[t]` ("group 1, param 0 ('w')") and the
  /// role's name, instead of "tensor t role r" (this kernel's own indices, which an
  /// optimizer's user cannot map back: a binding holds only some of the params).
  void set_tensor_names(std::vector<std::string> names) { tensor_names_ = std::move(names); }

  /// Uploads `plan` (built for this kernel's body with chunks of kCudaChunk elements and
  /// device pointers), replacing any previous one, as set_tensors() does.
  void set_plan(const Plan& plan);
  /// New role pointers for every tensor of the plan (Plan::rebind), checked like
  /// set_plan's; the pointer and alignment tables are copied in `stream`'s order (staged
  /// before the call returns, no waiting). Launches queued on other streams are not
  /// ordered with it.
  void rebind(const std::vector<std::vector<void*>>& ptrs, cuda::Stream stream);

  /// Replaces group `group`'s hyper values, ordered on `stream` after the work already
  /// queued there (not allowed while `stream` is being captured).
  void set_hypers(int group, const std::vector<double>& values, cuda::Stream stream = nullptr);

  /// One optimizer step over the plan: ONE launch for an element-wise rule (none when every
  /// tensor is empty); a rule with reductions runs each reduction pass and its finalize
  /// first (its global totals are this kernel's alone); a rule with scalar states writes
  /// them after the update (update_scalars). `step` is 1-based; the gradient
  /// is multiplied by `inv_grad_scale` before the rule.
  void step(cuda::Stream stream, double step, float inv_grad_scale = 1.0f);

  // Reductions, pass by pass (the Optimizer interleaves the kernels of several bindings).
  /// Reduction passes before the update (0: element-wise).
  int reduction_passes() const;
  /// Launches pass `pass`: a reduction pass (below reduction_passes(); `check_grads`: pass
  /// 0 also counts non-finite unscaled gradients) or the update (pass == reduction_passes()),
  /// with the step, scale and skip flag of `args` (device pointers).
  void run_pass(cuda::Stream stream, int pass, const StepArgs& args, bool check_grads = false);
  /// Launches the finalize of reduction pass `pass` (combine into the global totals with
  /// `accumulate`, else replace them); `args` as the pass's (a factored rule's matrix means
  /// evaluate row values of the step).
  void finalize(cuda::Stream stream, int pass, bool accumulate, const StepArgs& args);
  /// Uses `rows` and `cols` (device memory: row states then column states, state-major,
  /// an optimizer's) for a factored rule's row and column states. Before set_plan.
  void share_rc_states(cuda::DevicePtr rows, cuda::DevicePtr cols);
  /// Uses `totals` (device memory, body().num_global_slots doubles) as the global totals.
  void share_global_totals(cuda::DevicePtr totals);
  cuda::DevicePtr global_totals() const;
  /// The per-tensor totals (device memory): [tensor * body().num_tensor_slots + slot].
  cuda::DevicePtr tensor_totals() const;
  /// Synchronizes `stream` and reads whether the grad check found a non-finite value.
  bool found_nonfinite(cuda::Stream stream);
  /// Counts a step on the device (one tiny launch after the step's last pass): the double at
  /// `steps_taken` grows by one, unless `skip` is non-zero and the double there is too.
  void advance_step(cuda::Stream stream, cuda::DevicePtr steps_taken, cuda::DevicePtr skip);
  /// What codegen said about the kernel (no code).
  const codegen::KernelBody& body() const { return info_.body; }
  /// Writes every state tensor's initial value (one launch), and every tensor's scalar
  /// states (one more, for a rule that declares `scalar`).
  void init_states(cuda::Stream stream);
  /// After the update pass, before advance_step: each tensor's scalar states as the step
  /// (`args`) computed them (one launch, one thread per tensor, skipped with the step;
  /// nothing for a rule without scalar states).
  void update_scalars(cuda::Stream stream, const StepArgs& args);
  /// Uses `scalars` (device memory, num_tensors * body().num_scalars doubles: an
  /// optimizer's state) for the per-tensor scalar states instead of this kernel's own.
  /// Call before set_plan / set_tensors.
  void share_scalars(cuda::DevicePtr scalars);
  /// The per-tensor scalar states: [tensor * body().num_scalars + k] (device memory).
  cuda::DevicePtr scalars() const;
  /// Whether every gradient element times `inv_grad_scale` is finite: zeroes a device
  /// flag, launches the check, synchronizes `stream` and reads the flag back.
  bool grads_finite(cuda::Stream stream, float inv_grad_scale);

  // Capturable mode: the step count lives in device memory, so a
  // sequence of step_capturable() calls can be captured into a CUDA graph and replayed.
  // It costs one extra tiny launch per step (fusedopt_advance_step), as PyTorch's
  // capturable optimizers pay for their device-side step increment.

  /// Runs the step with the device step (steps taken + 1), then counts it (advance_step):
  /// no host synchronisation, no host-side state, safe to capture and replay.
  void step_capturable(cuda::Stream stream);
  /// Sets the number of steps already taken (the next step_capturable uses steps_taken+1).
  /// Synchronous (complete on return); not while a stream is being captured.
  void set_capturable_state(double steps_taken);
  /// Device-side grad check: launches the check on `stream`, setting the double at `flag`
  /// to 1 if a gradient times `inv_grad_scale` (over the fp32 at `device_scale` when
  /// non-null: abi.h's fo_unscale_factor) is not finite (the caller zeroes it first).
  /// Nothing waits.
  void check_grads_into(cuda::Stream stream, float inv_grad_scale, const float* device_scale,
                        cuda::DevicePtr flag);
  /// A device GradScaler's update (fusedopt_update_scale, one thread): the fo_scaler at
  /// `scaler` from the step's grad-check flag at `found` (torch's _amp_update_scale_).
  void update_scale(cuda::Stream stream, cuda::DevicePtr scaler, cuda::DevicePtr found,
                    float growth, float backoff, int interval);
  /// The number of steps taken by step_capturable (synchronous read: not while capturing).
  double capturable_steps_taken() const;
  /// Device address of the capturable step (double, steps taken).
  cuda::DevicePtr capturable_step_ptr() const;

  /// The plan's number of chunks and the grid a step launch uses: min(chunks, one wave:
  /// the step kernel's occupancy at 512 threads times the SMs).
  std::int64_t num_chunks() const;
  unsigned grid_size() const;
  /// Tensors of the plan that take the vector path (each role aligned to 4 of its elements).
  int num_aligned_tensors() const;

  const lang::Rule& rule() const { return *rule_; }
  /// Where the binary came from ("compiled", "memory", "disk").
  const std::string& origin() const { return info_.origin; }
  /// The kernel's cache key (32 hex digits) and the time it took to get the binary.
  const std::string& key() const { return info_.key; }
  double seconds() const { return info_.seconds; }

 private:
  /// Refuses host memory and memory of another device in `plan`'s pointer table.
  void check_device_pointers(const Plan& plan) const;
  /// fusedopt_scalars over every tensor: initial values (`init` 1) or the step's (0).
  void run_scalars(cuda::Stream stream, const StepArgs& args, int init);
  struct Impl;
  std::shared_ptr<const lang::Rule> rule_;
  DTypeBinding dtypes_;
  provider::KernelInfo info_;
  std::unique_ptr<Impl> impl_;
  std::vector<std::string> tensor_names_;  ///< set_tensor_names()
};

}  // namespace fusedopt::runtime
