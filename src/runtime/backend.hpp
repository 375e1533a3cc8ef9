// The seam between the Optimizer and a device: one Backend runs one compiled kernel over
// the tensors of one dtype binding. The host backend is here; a CUDA backend (CudaKernel,
// device-resident tables) plugs in behind the same interface.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fusedopt/dtype.hpp"
#include "lang/ast.hpp"

namespace fusedopt::runtime {

/// The tensors of one binding, in kernel role order (param, grad, states, outputs, master).
struct BindingTensors {
  DTypeBinding dtypes;
  std::vector<std::vector<void*>> ptrs;
  std::vector<std::int64_t> numel;
  std::vector<int> group;  ///< param group of each tensor
};

class Backend {
 public:
  virtual ~Backend() = default;
  /// Writes every state's initial value (and the master copy).
  virtual void init_states() = 0;
  /// One launch: the step with `step` (1-based) and grads times `inv_grad_scale`.
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
