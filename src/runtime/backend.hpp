// The seam between the Optimizer and a device: one Backend runs one compiled kernel over
// the tensors of one dtype binding. The host backend is here; a CUDA backend (CudaKernel,
// device-resident tables) plugs in behind the same interface.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "codegen/codegen.hpp"
#include "fusedopt/dtype.hpp"
#include "lang/ast.hpp"

namespace fusedopt::runtime {

/// The tensors of one binding, in kernel role order (param, grad, states, outputs, master).
struct BindingTensors {
  DTypeBinding dtypes;
  std::vector<std::vector<void*>> ptrs;
  std::vector<std::int64_t> numel;
  std::vector<int> group;  ///< param group of each tensor
  /// Raw global reduction totals shared by every backend of one optimizer (host: double*,
  /// CUDA: a device address); null: the backend keeps its own.
  void* global_totals = nullptr;
  codegen::Strategy strategy = codegen::Strategy::Auto;
};

/// A backend's per-tensor reduction totals: data[t * stride + slot] (host or device memory).
struct TensorTotalsView {
  double* data = nullptr;
  std::int64_t num_tensors = 0;
  int stride = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  /// Writes every state's initial value (and the master copy).
  virtual void init_states() = 0;
  /// Before any pass of a step (capturable CUDA: advances the device step). Default: nothing.
  virtual void begin_step(float step, float inv_grad_scale, void* stream) {
    (void)step, (void)inv_grad_scale, (void)stream;
  }
  /// Reduction pass `pass` (below body().reduction_passes); `check_grads` also counts
  /// non-finite unscaled gradients in pass 0.
  virtual void reduce(int pass, float step, float inv_grad_scale, bool check_grads,
                      void* stream) = 0;
  /// Combines pass `pass`'s partials into the totals; with `accumulate` the shared global
  /// totals are combined into rather than replaced (a backend before this one wrote them).
  virtual void finalize(int pass, bool accumulate, void* stream) = 0;
  /// Whether the grad check counted a non-finite value (after pass 0's finalize of every
  /// backend). Synchronous on CUDA.
  virtual bool found_nonfinite(void* stream) = 0;
  virtual TensorTotalsView tensor_totals() = 0;
  /// What codegen said about the kernel (schedule, slots, bytes per pass); no code.
  virtual const codegen::KernelBody& body() const = 0;
  /// Scratch memory of the Store strategy, in bytes.
  virtual std::int64_t scratch_bytes() const = 0;
  /// The update pass: `step` (1-based) and grads times `inv_grad_scale`.
  virtual void step(float step, float inv_grad_scale, void* stream) = 0;
  /// Whether every gradient times `inv_grad_scale` is finite.
  virtual bool grads_finite(float inv_grad_scale, void* stream) = 0;
  /// Replaces the hyper table: `hypers[g]` is group g's values in Rule::hypers order.
  virtual void set_hypers(const std::vector<std::vector<float>>& hypers) = 0;
  /// Launches per step (0 when every tensor is empty).
  virtual int launches_per_step() const = 0;
  virtual std::string key() const = 0;
  virtual std::string origin() const = 0;
  virtual double seconds() const = 0;
  /// Capturable CUDA backends: the steps taken as the device counts them (a replayed graph
  /// advances it without the host). Synchronous; not while capturing. -1: not capturable.
  virtual std::int64_t device_steps() const { return -1; }
};

/// A HostKernel (from the process-wide kernel cache) planned once over `tensors`.
std::unique_ptr<Backend> make_host_backend(std::shared_ptr<const lang::Rule> rule,
                                           const BindingTensors& tensors,
                                           const std::vector<std::vector<float>>& hypers);

/// A CudaKernel on device `device` planned once over `tensors` (device pointers); with
/// `capturable`, the step lives in device memory (two launches per step).
std::unique_ptr<Backend> make_cuda_backend(std::shared_ptr<const lang::Rule> rule,
                                           const BindingTensors& tensors,
                                           const std::vector<std::vector<float>>& hypers,
                                           int device, bool capturable);

}  // namespace fusedopt::runtime
