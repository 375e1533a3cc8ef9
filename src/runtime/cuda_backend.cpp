// The CUDA backend of the Optimizer: a CudaKernel planned once over the tensors of one
// dtype binding (device-resident tables), one launch per step on the caller's stream.
#include <fmt/format.h>

#include "cache/kernel_cache.hpp"
#include "fusedopt/error.hpp"
#include "runtime/backend.hpp"
#include "runtime/cuda_kernel.hpp"

namespace fusedopt::runtime {
namespace {

class CudaBackend final : public Backend {
 public:
  CudaBackend(std::shared_ptr<const lang::Rule> rule, const BindingTensors& tensors,
              const std::vector<std::vector<float>>& hypers, int device, bool capturable)
      : kernel_(std::move(rule), tensors.dtypes, device, cache::KernelCache::global()),
        capturable_(capturable) {
    std::vector<std::vector<cuda::DevicePtr>> ptrs;
    for (const auto& roles : tensors.ptrs) {
      std::vector<cuda::DevicePtr> row;
      for (void* p : roles) row.push_back(reinterpret_cast<cuda::DevicePtr>(p));
      ptrs.push_back(std::move(row));
    }
    kernel_.set_tensors(ptrs, tensors.numel, hypers, tensors.group);
    for (std::int64_t n : tensors.numel) any_elements_ |= n > 0;
  }

  void init_states() override {
    kernel_.init_states(nullptr);
    cuda::synchronize(nullptr);
  }

  void step(float step, float inv_grad_scale, void* stream) override {
    if (!capturable_) {
      kernel_.step(stream, step, inv_grad_scale);
      return;
    }
    // Capturable: the step count lives on the device and advances there, so a captured
    // graph replays correctly. Resynchronise when the host's count moved on its own (a
    // checkpoint load) or the grad scale changed.
    const auto taken = static_cast<std::int64_t>(step) - 1;
    if (taken != device_steps_ || inv_grad_scale != capturable_inv_scale_) {
      // Steps still queued on the stream read the device state: let them finish first.
      cuda::synchronize(stream);
      kernel_.set_capturable_state(static_cast<float>(taken), inv_grad_scale);
      capturable_inv_scale_ = inv_grad_scale;
      device_steps_ = taken;
    }
    kernel_.step_capturable(stream);
    ++device_steps_;
  }

  bool grads_finite(float inv_grad_scale, void* stream) override {
    return kernel_.grads_finite(stream, inv_grad_scale);
  }

  void set_hypers(const std::vector<std::vector<float>>& hypers) override {
    for (std::size_t g = 0; g < hypers.size(); ++g) {
      kernel_.set_hypers(static_cast<int>(g), hypers[g], nullptr);
    }
  }

  int launches_per_step() const override { return any_elements_ ? (capturable_ ? 2 : 1) : 0; }
  std::string key() const override { return kernel_.key(); }
  std::string origin() const override { return kernel_.origin(); }
  double seconds() const override { return kernel_.seconds(); }
  std::int64_t device_steps() const override {
    if (!capturable_) return -1;
    return static_cast<std::int64_t>(kernel_.capturable_steps_taken());
  }

 private:
  CudaKernel kernel_;
  bool capturable_;
  bool any_elements_ = false;
  float capturable_inv_scale_ = 1.0f;
  std::int64_t device_steps_ = 0;  ///< host mirror of the device's steps taken
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(std::shared_ptr<const lang::Rule> rule,
                                           const BindingTensors& tensors,
                                           const std::vector<std::vector<float>>& hypers,
                                           int device, bool capturable) {
  return std::make_unique<CudaBackend>(std::move(rule), tensors, hypers, device, capturable);
}

}  // namespace fusedopt::runtime
