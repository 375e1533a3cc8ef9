// The CUDA Backend: memory of one device (cuMemAlloc in its primary context), kernels from
// NVRTC loaded into that context (a CudaKernel with an uploaded Plan), one launch per pass
// on the caller's stream. Every call makes the context current and then restores the
// caller's.
#include <fmt/format.h>

#include "fusedopt/error.hpp"
#include "runtime/backend.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/cuda_kernel.hpp"
#include "support/check.hpp"

namespace fusedopt::runtime {
namespace {

using cuda::DevicePtr;

DevicePtr dev(const void* p) { return static_cast<DevicePtr>(reinterpret_cast<std::uintptr_t>(p)); }
void* host_view(DevicePtr p) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)); }

class CudaBoundKernel final : public BoundKernel {
 public:
  CudaBoundKernel(Backend& backend, const cuda::PrimaryContext& context,
                  std::shared_ptr<const lang::Rule> rule, const BindingTensors& tensors,
                  const std::vector<std::vector<double>>& hypers)
      : context_(context),
        kernel_(std::move(rule), tensors.dtypes, context.device(), provider::cache_at({}),
                tensors.strategy) {
    PlanRequest request("CudaKernel", tensors.ptrs, tensors.numel, hypers, tensors.group,
                        kCudaChunk);
    request.shapes = &tensors.shapes;
    const Plan plan = plan_binding(backend, kernel_.body(), request, 256, &scratch_);
    if (tensors.global_totals) kernel_.share_global_totals(dev(tensors.global_totals));
    if (tensors.scalars) kernel_.share_scalars(dev(tensors.scalars));
    if (tensors.row_states || tensors.col_states) {
      kernel_.share_rc_states(dev(tensors.row_states), dev(tensors.col_states));
    }
    kernel_.set_tensor_names(tensors.names);
    kernel_.set_plan(plan);
    any_elements_ = !plan.empty();
    num_tensors_ = plan.num_tensors();
  }

  void init_states() override {
    cuda::ContextScope scope(context_);
    kernel_.init_states(nullptr);
    cuda::synchronize(nullptr);
  }

  // Every launch reads its step from the optimizer's count of steps taken (StepArgs), which
  // the step's last launch advances unless the device found a non-finite gradient: a step
  // (scaled or not) only launches, and any sequence of steps can be captured in a CUDA
  // graph and replayed.
  void reduce(int pass, const StepArgs& args, bool check_grads, void* stream) override {
    kernel_.run_pass(stream, pass, args, check_grads);
  }
  void finalize(int pass, bool accumulate, const StepArgs& args, void* stream) override {
    kernel_.finalize(stream, pass, accumulate, args);
  }
  TensorTotalsView tensor_totals() override {
    return {static_cast<double*>(host_view(kernel_.tensor_totals())), num_tensors_,
            kernel_.body().num_tensor_slots};
  }
  const codegen::KernelBody& body() const override { return kernel_.body(); }
  std::int64_t scratch_bytes() const override { return static_cast<std::int64_t>(scratch_.size()); }

  void update(const StepArgs& args, void* stream) override {
    kernel_.run_pass(stream, kernel_.reduction_passes(), args);
    kernel_.update_scalars(stream, args);  // before the count
  }
  void check_grads(float inv_grad_scale, const float* device_scale, void* flag,
                   void* stream) override {
    kernel_.check_grads_into(stream, inv_grad_scale, device_scale, dev(flag));
  }
  void count_step(double* steps_taken, const double* skip, void* stream) override {
    kernel_.advance_step(stream, dev(steps_taken), dev(skip));
  }
  void update_scaler(void* scaler, const void* flag, float growth, float backoff, int interval,
                     void* stream) override {
    cuda::ContextScope scope(context_);
    kernel_.update_scale(stream, dev(scaler), dev(flag), growth, backoff, interval);
  }
  void set_hypers(const std::vector<std::vector<double>>& hypers, void* stream) override {
    // Staged from pageable memory before the call returns, applied in `stream`'s order.
    cuda::ContextScope scope(context_);
    for (std::size_t g = 0; g < hypers.size(); ++g) {
      kernel_.set_hypers(static_cast<int>(g), hypers[g], stream);
    }
  }
  void rebind(const std::vector<std::vector<void*>>& ptrs, void* stream) override {
    cuda::ContextScope scope(context_);
    kernel_.rebind(ptrs, static_cast<cuda::Stream>(stream));
  }
  int launches_per_step(bool with_count) const override {
    // Every tensor's scalar, row and column states, after the update; the count.
    const int scalars = kernel_.body().writes_after_update() ? 1 : 0;
    const int count = with_count ? 1 : 0;
    if (!any_elements_) return scalars + count;
    return 1 + 2 * kernel_.reduction_passes() + scalars + count;  // passes, finalizes
  }
  std::string key() const override { return kernel_.key(); }
  std::string origin() const override { return kernel_.origin(); }
  double seconds() const override { return kernel_.seconds(); }

 private:
  const cuda::PrimaryContext& context_;  // the backend's: outlives this kernel
  CudaKernel kernel_;
  Buffer scratch_;
  std::int64_t num_tensors_ = 0;
  bool any_elements_ = false;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : context_(make_context(device)) {}

  ~CudaBackend() override {
    try {
      cuda::ContextScope scope(*context_);
      cuda::context_synchronize();
      owned_.clear();  // cuMemFree with the context current
    } catch (const Error&) {
      // A destructor must not throw; the memory goes with the context.
    }
  }

  Device device() const override { return Device::cuda(context_->device()); }

  Buffer allocate(std::size_t bytes) override {
    cuda::ContextScope scope(*context_);
    // cuMemAlloc returns 256-byte aligned memory; zeroed so unused padding is defined, by
    // 4-byte words: the allocation is whole words, so the memset stays inside it.
    cuda::DeviceBuffer b(std::max<std::size_t>((bytes + 3) / 4 * 4, 256));
    cuda::memset32_async(b.get(), 0, b.size() / 4, nullptr);
    cuda::synchronize(nullptr);
    const DevicePtr p = b.get();
    owned_.push_back(std::move(b));
    return Buffer(this, host_view(p), bytes);
  }

  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override {
    cuda::ContextScope scope(*context_);
    cuda::context_synchronize();
    cuda::copy_to_host(host_dst, dev(src), bytes);
  }

  void copy_from_host(void* dst, const void* host_src, std::size_t bytes) override {
    cuda::ContextScope scope(*context_);
    cuda::context_synchronize();
    cuda::copy_to_device(dev(dst), host_src, bytes);
    // A copy from pageable memory can return before it lands.
    cuda::context_synchronize();
  }

  void fill(void* dst, unsigned char value, std::size_t bytes, void* stream) override {
    cuda::ContextScope scope(*context_);
    cuda::memset8_async(dev(dst), value, bytes, stream);
  }

  void copy_on_device(void* dst, const void* src, std::size_t bytes, void* stream) override {
    cuda::ContextScope scope(*context_);
    cuda::copy_on_device_async(dev(dst), dev(src), bytes, stream);
  }

  void synchronize() override {
    cuda::ContextScope scope(*context_);
    cuda::context_synchronize();
  }

  void synchronize(void* stream) override {
    cuda::ContextScope scope(*context_);
    cuda::synchronize(stream);
  }

  std::unique_ptr<BoundKernel> bind(std::shared_ptr<const lang::Rule> rule,
                                    const BindingTensors& tensors,
                                    const std::vector<std::vector<double>>& hypers) override {
    cuda::ContextScope scope(*context_);
    return std::make_unique<CudaBoundKernel>(*this, *context_, std::move(rule), tensors, hypers);
  }

 protected:
  void release(void* data, std::size_t) noexcept override {
    try {
      cuda::ContextScope scope(*context_);
      for (auto it = owned_.begin(); it != owned_.end(); ++it) {
        if (it->get() == dev(data)) {
          owned_.erase(it);
          return;
        }
      }
    } catch (const Error&) {
      // The context could not be made current: the memory goes with the context.
    }
  }

 private:
  static std::unique_ptr<cuda::PrimaryContext> make_context(int device) {
    // PrimaryContext makes the device's context current: put the caller's back.
    cuda::SavedCurrentContext saved;
    return std::make_unique<cuda::PrimaryContext>(device);
  }

  std::unique_ptr<cuda::PrimaryContext> context_;  // outlives every buffer below
  std::vector<cuda::DeviceBuffer> owned_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device) {
  std::string why;
  FUSEDOPT_CHECK_AVAILABLE(cuda::cuda_device_available(&why), "no CUDA device can be used: {}",
                           why);
  const int count = cuda::device_count();
  FUSEDOPT_CHECK_AVAILABLE(!(device < 0 || device >= count),
                           "there is no cuda:{}: this machine has {} CUDA device{}", device, count,
                           count == 1 ? "" : "s");
  return std::make_unique<CudaBackend>(device);
}

bool cuda_backend_available(std::string* why) { return cuda::cuda_device_available(why); }

}  // namespace fusedopt::runtime
