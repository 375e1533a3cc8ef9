// The host Backend: memory from the C++ heap, kernels from the host compiler (a HostKernel
// and a Plan used in place), launched on the calling thread and its OpenMP team.
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

#include "fusedopt/error.hpp"
#include "runtime/backend.hpp"
#include "runtime/host_kernel.hpp"

namespace fusedopt::runtime {

namespace {

constexpr std::size_t kHostAlign = 256;

class HostBoundKernel final : public BoundKernel {
 public:
  HostBoundKernel(Backend& backend, std::shared_ptr<const lang::Rule> rule,
                  const BindingTensors& tensors, const std::vector<std::vector<double>>& hypers)
      : kernel_(std::move(rule), tensors.dtypes, provider::cache_at({}), tensors.strategy) {
    PlanRequest request = kernel_.plan_request(tensors.ptrs, tensors.numel, hypers, tensors.group);
    request.shapes = &tensors.shapes;
    prepared_ = HostKernel::Prepared(plan_binding(backend, kernel_.body(), request, 64, &scratch_));
    if (tensors.global_totals) {
      prepared_.share_global_totals(static_cast<double*>(tensors.global_totals));
    }
    if (tensors.scalars) prepared_.share_scalars(static_cast<double*>(tensors.scalars));
    if (tensors.row_states || tensors.col_states) {
      prepared_.share_rc_states(static_cast<float*>(tensors.row_states),
                                static_cast<float*>(tensors.col_states));
    }
  }

  void init_states() override { kernel_.init_states(prepared_); }
  void reduce(int pass, const StepArgs& args, bool check_grads, void*) override {
    kernel_.run_pass(prepared_, pass, args, check_grads);
  }
  void finalize(int pass, bool accumulate, const StepArgs& args, void*) override {
    kernel_.finalize(prepared_, pass, accumulate, args);
  }
  TensorTotalsView tensor_totals() override {
    return {prepared_.tensor_totals(), prepared_.num_tensors(), kernel_.body().num_tensor_slots};
  }
  const codegen::KernelBody& body() const override { return kernel_.body(); }
  std::int64_t scratch_bytes() const override { return static_cast<std::int64_t>(scratch_.size()); }
  void update(const StepArgs& args, void*) override {
    kernel_.run_pass(prepared_, kernel_.reduction_passes(), args);
    kernel_.update_scalars(prepared_, args);
  }
  void check_grads(float inv_grad_scale, const float* device_scale, void* flag, void*) override {
    if (!kernel_.grads_finite(prepared_, inv_grad_scale, device_scale)) {
      *static_cast<double*>(flag) = 1.0;
    }
  }
  // The count and the scaler's update: a few instructions on the calling thread, as the
  // CUDA kernels' one-thread launches do them.
  void count_step(double* steps_taken, const double* skip, void*) override {
    if (skip == nullptr || *skip == 0.0) *steps_taken += 1.0;
  }
  void update_scaler(void* scaler, const void* flag, float growth, float backoff, int interval,
                     void*) override {
    fo_update_scale(static_cast<fo_scaler*>(scaler), *static_cast<const double*>(flag) != 0.0,
                    growth, backoff, interval);
  }
  void set_hypers(const std::vector<std::vector<double>>& hypers, void*) override {
    prepared_.set_hypers(hypers);
  }
  void rebind(const std::vector<std::vector<void*>>& ptrs, void*) override {
    prepared_.rebind(kernel_.body(), ptrs);
  }
  int launches_per_step(bool) const override {
    // Every tensor's scalar, row and column states, after the update; the count is no launch.
    const int scalars = kernel_.body().writes_after_update() ? 1 : 0;
    return (prepared_.empty() ? 0 : 1 + 2 * kernel_.reduction_passes()) + scalars;
  }
  std::string key() const override { return kernel_.key(); }
  std::string origin() const override { return kernel_.origin(); }
  double seconds() const override { return kernel_.seconds(); }

 private:
  HostKernel kernel_;
  Buffer scratch_;
  HostKernel::Prepared prepared_;
};

class HostBackend final : public Backend {
 public:
  Device device() const override { return Device::host(); }

  Buffer allocate(std::size_t bytes) override {
    const std::size_t size =
        std::max(kHostAlign, (bytes + kHostAlign - 1) / kHostAlign * kHostAlign);
    void* data = std::aligned_alloc(kHostAlign, size);
    // Out of memory: the root Error (no narrower kind fits).
    if (!data) throw Error(fmt::format("cannot allocate {} bytes of host memory", bytes));
    std::memset(data, 0, size);
    return Buffer(this, data, bytes);
  }
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override {
    if (bytes) std::memcpy(host_dst, src, bytes);
  }
  void copy_from_host(void* dst, const void* host_src, std::size_t bytes) override {
    if (bytes) std::memcpy(dst, host_src, bytes);
  }
  void fill(void* dst, unsigned char value, std::size_t bytes, void*) override {
    if (bytes) std::memset(dst, value, bytes);
  }
  void copy_on_device(void* dst, const void* src, std::size_t bytes, void*) override {
    if (bytes) std::memmove(dst, src, bytes);
  }
  void synchronize() override {}  // host launches return when they are done
  void synchronize(void*) override {}
  const void* host_address(const void* p) const override { return p; }

  std::unique_ptr<BoundKernel> bind(std::shared_ptr<const lang::Rule> rule,
                                    const BindingTensors& tensors,
                                    const std::vector<std::vector<double>>& hypers) override {
    return std::make_unique<HostBoundKernel>(*this, std::move(rule), tensors, hypers);
  }

 protected:
  void release(void* data, std::size_t) noexcept override { std::free(data); }
};

}  // namespace

std::unique_ptr<Backend> make_host_backend() { return std::make_unique<HostBackend>(); }

}  // namespace fusedopt::runtime
