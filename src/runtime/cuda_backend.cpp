// The CUDA backend of the Optimizer: a CudaKernel planned once over the tensors of one
// dtype binding (device-resident tables), one launch per pass on the caller's stream, plus
// the fp32 scratch tensors of the Store strategy.
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
      : kernel_(std::move(rule), tensors.dtypes, device, cache::KernelCache::global(),
                tensors.strategy),
        capturable_(capturable) {
    std::vector<std::vector<cuda::DevicePtr>> ptrs;
    for (const auto& roles : tensors.ptrs) {
      std::vector<cuda::DevicePtr> row;
      for (void* p : roles) row.push_back(reinterpret_cast<cuda::DevicePtr>(p));
      ptrs.push_back(std::move(row));
    }
    // Scratch tensors of the Store strategy: one fp32 view per value and tensor, 256-byte
    // aligned, in one allocation.
    const std::size_t k = kernel_.body().scratch.size();
    if (k > 0) {
      auto padded = [](std::int64_t n) {
        return (static_cast<std::size_t>(n) * 4 + 255) / 256 * 256;
      };
      std::size_t total = 0;
      for (std::int64_t n : tensors.numel) total += k * padded(n);
      scratch_ = cuda::DeviceBuffer(std::max<std::size_t>(total, 256));
      scratch_bytes_ = static_cast<std::int64_t>(total);
      std::size_t offset = 0;
      for (std::size_t t = 0; t < ptrs.size(); ++t) {
        for (std::size_t j = 0; j < k; ++j) {
          ptrs[t].push_back(scratch_.get() + offset);
          offset += padded(tensors.numel[t]);
        }
      }
    }
    if (tensors.global_totals) {
      kernel_.share_global_totals(reinterpret_cast<cuda::DevicePtr>(tensors.global_totals));
    }
    kernel_.set_tensors(ptrs, tensors.numel, hypers, tensors.group);
    for (std::int64_t n : tensors.numel) any_elements_ |= n > 0;
    num_tensors_ = static_cast<std::int64_t>(tensors.numel.size());
  }

  void init_states() override {
    kernel_.init_states(nullptr);
    cuda::synchronize(nullptr);
  }

  void begin_step(float step, float inv_grad_scale, void* stream) override {
    if (!capturable_) return;
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
    // The step is advanced even with no chunk, so the count stays the number of steps.
    kernel_.advance_step(stream);
    ++device_steps_;
  }

  void reduce(int pass, float step, float inv_grad_scale, bool check_grads, void* stream) override {
    kernel_.run_pass(stream, pass, step, inv_grad_scale, check_grads, capturable_);
  }
  void finalize(int pass, bool accumulate, void* stream) override {
    kernel_.finalize(stream, pass, accumulate);
  }
  bool found_nonfinite(void* stream) override { return kernel_.found_nonfinite(stream); }
  TensorTotalsView tensor_totals() override {
    return {reinterpret_cast<double*>(static_cast<std::uintptr_t>(kernel_.tensor_totals())),
            num_tensors_, kernel_.body().num_tensor_slots};
  }
  const codegen::KernelBody& body() const override { return kernel_.body(); }
  std::int64_t scratch_bytes() const override { return scratch_bytes_; }

  void step(float step, float inv_grad_scale, void* stream) override {
    kernel_.run_pass(stream, kernel_.reduction_passes(), step, inv_grad_scale, false, capturable_);
  }

  bool grads_finite(float inv_grad_scale, void* stream) override {
    return kernel_.grads_finite(stream, inv_grad_scale);
  }

  void set_hypers(const std::vector<std::vector<float>>& hypers) override {
    for (std::size_t g = 0; g < hypers.size(); ++g) {
      kernel_.set_hypers(static_cast<int>(g), hypers[g], nullptr);
    }
  }

  int launches_per_step() const override {
    if (!any_elements_) return 0;
    return 1 + 2 * kernel_.reduction_passes() + (capturable_ ? 1 : 0);
  }
  std::string key() const override { return kernel_.key(); }
  std::string origin() const override { return kernel_.origin(); }
  double seconds() const override { return kernel_.seconds(); }
  std::int64_t device_steps() const override {
    if (!capturable_) return -1;
    return static_cast<std::int64_t>(kernel_.capturable_steps_taken());
  }

 private:
  CudaKernel kernel_;
  cuda::DeviceBuffer scratch_;
  std::int64_t scratch_bytes_ = 0;
  std::int64_t num_tensors_ = 0;
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
