// The seam between the Optimizer (and, next, the comm module) and a device. A Backend is
// one device, host or CUDA: it owns memory (allocate, free, copy to and from the host,
// fill, synchronise) and makes BoundKernels. A BoundKernel runs one compiled kernel over
// the tensors of one dtype binding, planned once (runtime::Plan). Nothing above this seam
// knows which device it runs on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "codegen/codegen.hpp"
#include "fusedopt/dtype.hpp"
#include "fusedopt/optimizer.hpp"
#include "lang/ast.hpp"
#include "runtime/plan.hpp"
#include "runtime/step_args.hpp"

namespace fusedopt::runtime {

class Backend;

/// Memory a Backend allocated: freed through it when the Buffer goes (the Backend must
/// outlive its Buffers). Host or device addresses, as the Backend's device says.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend* owner, void* data, std::size_t bytes)
      : owner_(owner), data_(data), bytes_(bytes) {}
  ~Buffer() { reset(); }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  std::byte* bytes_data() const { return static_cast<std::byte*>(data_); }
  std::size_t size() const { return bytes_; }
  void reset();

 private:
  Backend* owner_ = nullptr;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

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
  codegen::Strategy strategy = codegen::Strategy::Auto;
};

/// A kernel's per-tensor reduction totals: data[t * stride + slot] (backend memory).
struct TensorTotalsView {
  double* data = nullptr;
  std::int64_t num_tensors = 0;
  int stride = 0;
};

/// One compiled kernel planned over one binding's tensors. Every launch is ordered on
/// `stream` and reads its step, gradient factor and skip flag from StepArgs: the same calls
/// on the host (where a launch is done when it returns) and on CUDA (where nothing waits).
class BoundKernel {
 public:
  virtual ~BoundKernel() = default;
  /// Writes every state's initial value (and the master copy); done on return.
  virtual void init_states() = 0;
  /// Reduction pass `pass` (below body().reduction_passes); `check_grads` also counts
  /// non-finite unscaled gradients in pass 0.
  virtual void reduce(int pass, const StepArgs& args, bool check_grads, void* stream) = 0;
  /// Combines pass `pass`'s partials into the totals; with `accumulate` the shared global
  /// totals are combined into rather than replaced (a kernel before this one wrote them).
  /// A factored rule's matrix means read values of the step (`args`).
  virtual void finalize(int pass, bool accumulate, const StepArgs& args, void* stream) = 0;
  virtual TensorTotalsView tensor_totals() = 0;
  /// What codegen said about the kernel (schedule, slots, bytes per pass); no code.
  virtual const codegen::KernelBody& body() const = 0;
  /// Scratch memory of the Store strategy, in bytes.
  virtual std::int64_t scratch_bytes() const = 0;
  /// The update pass; then, for a rule with scalar, row or column states, every tensor's
  /// new values of them (one more launch).
  virtual void update(const StepArgs& args, void* stream) = 0;
  /// The separate grad check: sets the double at `flag` (the verdict slot, zeroed by the
  /// caller) to 1 when a gradient times `inv_grad_scale` (over `device_scale` when
  /// non-null) is not finite.
  virtual void check_grads(float inv_grad_scale, const float* device_scale, void* flag,
                           void* stream) = 0;
  /// Counts a step: the double at `steps_taken` grows by one unless `skip` is non-null and
  /// the double there is non-zero (the step was not taken).
  virtual void count_step(double* steps_taken, const double* skip, void* stream) = 0;
  /// A GradScaler's update after a step: the fo_scaler at `scaler` from the step's
  /// grad-check flag at `flag` (abi.h's fo_update_scale).
  virtual void update_scaler(void* scaler, const void* flag, float growth, float backoff,
                             int interval, void* stream) = 0;
  /// Replaces the hyper table (`hypers[g]`: group g's values in Rule::hypers order), ordered
  /// on `stream` after the work queued there, without waiting: the launches queued on
  /// `stream` after it read the new values.
  virtual void set_hypers(const std::vector<std::vector<double>>& hypers, void* stream) = 0;
  /// New role pointers for the binding's tensors (BindingTensors::ptrs' form, sizes
  /// unchanged), ordered on `stream` without waiting.
  virtual void rebind(const std::vector<std::vector<void*>>& ptrs, void* stream) = 0;
  /// Launches per step (0 when every tensor is empty), the step's count included when
  /// `with_count` and the count is a launch on this device.
  virtual int launches_per_step(bool with_count) const = 0;
  virtual std::string key() const = 0;
  virtual std::string origin() const = 0;
  virtual double seconds() const = 0;
};

/// "host", "cuda:0": how errors and logs name a device.
std::string device_name(const Device& device);

/// One device: its memory and its kernels. Every call makes the device current for its
/// duration and leaves the caller's current device (CUDA context) as it was.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  /// "host", "cuda:0".
  std::string name() const;

  /// `bytes` of zeroed memory, aligned to at least 256 bytes. Throws Error when there is
  /// not enough.
  virtual Buffer allocate(std::size_t bytes) = 0;
  /// Synchronous copies between this device's memory and host memory; they wait for every
  /// launch queued on the device first, so they see (and are seen by) completed steps.
  virtual void copy_to_host(void* host_dst, const void* src, std::size_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* host_src, std::size_t bytes) = 0;
  /// Sets `bytes` bytes at `dst` to `value`, ordered on `stream`.
  virtual void fill(void* dst, unsigned char value, std::size_t bytes, void* stream) = 0;
  /// Copies `bytes` bytes between two places of this device's memory, ordered on `stream`.
  virtual void copy_on_device(void* dst, const void* src, std::size_t bytes, void* stream) = 0;
  /// Waits for every launch and copy queued on the device, on every stream.
  virtual void synchronize() = 0;
  /// Waits for the work queued on `stream` (nullptr: the device's default stream).
  virtual void synchronize(void* stream) = 0;
  /// `p` (memory of this device) as the host can read it in place, or null when it must be
  /// copied with copy_to_host.
  virtual const void* host_address(const void* p) const { return nullptr; }

  /// Gets the kernel of `rule` for `tensors.dtypes` from the kernel provider, loads it and
  /// plans it over `tensors` (memory of this device).
  virtual std::unique_ptr<BoundKernel> bind(std::shared_ptr<const lang::Rule> rule,
                                            const BindingTensors& tensors,
                                            const std::vector<std::vector<double>>& hypers) = 0;

 protected:
  friend class Buffer;
  virtual void release(void* data, std::size_t bytes) noexcept = 0;
};

/// The plan of one binding with the Store strategy's scratch tensors laid out and allocated
/// from `backend` into `*scratch` (views `scratch_align`-aligned).
Plan plan_binding(Backend& backend, const codegen::KernelBody& body, PlanRequest request,
                  std::size_t scratch_align, Buffer* scratch);

/// The backend of `device`. Throws UnavailableError when this build or machine cannot
/// serve it (fusedopt built without CUDA, no driver, no such device), saying why and how
/// to get it.
std::unique_ptr<Backend> make_backend(const Device& device);

/// Whether make_backend(device) can work here; `why` says why not.
bool backend_available(const Device& device, std::string* why = nullptr);

}  // namespace fusedopt::runtime
