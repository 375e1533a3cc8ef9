// The host Backend: a HostKernel and its Prepared tables, built once at construction.
#include "cache/kernel_cache.hpp"
#include "runtime/backend.hpp"
#include "runtime/host_kernel.hpp"

namespace fusedopt::runtime {

namespace {

class HostBackend final : public Backend {
 public:
  HostBackend(std::shared_ptr<const lang::Rule> rule, const BindingTensors& tensors,
              const std::vector<std::vector<float>>& hypers)
      : kernel_(std::move(rule), tensors.dtypes, cache::KernelCache::global()),
        prepared_(kernel_.prepare(tensors.ptrs, tensors.numel, hypers, tensors.group)) {}

  void init_states() override { kernel_.init_states(prepared_); }
  void step(float step, float inv_grad_scale, void*) override {
    kernel_.step(prepared_, step, inv_grad_scale);
  }
  bool grads_finite(float inv_grad_scale, void*) override {
    return kernel_.grads_finite(prepared_, inv_grad_scale);
  }
  void set_hypers(const std::vector<std::vector<float>>& hypers) override {
    prepared_.set_hypers(hypers);
  }
  int launches_per_step() const override { return prepared_.empty() ? 0 : 1; }
  std::string key() const override { return kernel_.key(); }
  std::string origin() const override { return kernel_.origin(); }
  double seconds() const override { return kernel_.seconds(); }

 private:
  HostKernel kernel_;
  HostKernel::Prepared prepared_;
};

}  // namespace

std::unique_ptr<Backend> make_host_backend(std::shared_ptr<const lang::Rule> rule,
                                           const BindingTensors& tensors,
                                           const std::vector<std::vector<float>>& hypers) {
  return std::make_unique<HostBackend>(std::move(rule), tensors, hypers);
}

}  // namespace fusedopt::runtime
