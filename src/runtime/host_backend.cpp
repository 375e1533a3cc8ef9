// The host Backend: a HostKernel and its Prepared tables, built once at construction, plus
// the fp32 scratch tensors of the Store strategy.
#include <cstdlib>

#include "cache/kernel_cache.hpp"
#include "fusedopt/error.hpp"
#include "runtime/backend.hpp"
#include "runtime/host_kernel.hpp"

namespace fusedopt::runtime {

namespace {

constexpr std::size_t kScratchAlign = 64;

class HostBackend final : public Backend {
 public:
  HostBackend(std::shared_ptr<const lang::Rule> rule, const BindingTensors& tensors,
              const std::vector<std::vector<float>>& hypers)
      : kernel_(std::move(rule), tensors.dtypes, cache::KernelCache::global(), tensors.strategy),
        prepared_(kernel_.prepare(with_scratch(tensors), tensors.numel, hypers, tensors.group)) {
    if (tensors.global_totals)
      prepared_.share_global_totals(static_cast<double*>(tensors.global_totals));
  }

  void init_states() override { kernel_.init_states(prepared_); }
  void reduce(int pass, float step, float inv_grad_scale, bool check_grads, void*) override {
    kernel_.run_pass(prepared_, pass, step, inv_grad_scale, check_grads);
  }
  void finalize(int pass, bool accumulate, void*) override {
    kernel_.finalize(prepared_, pass, accumulate);
  }
  bool found_nonfinite(void*) override {
    return prepared_.global_totals()[kernel_.body().num_global_slots - 1] > 0.0;
  }
  TensorTotalsView tensor_totals() override {
    return {prepared_.tensor_totals(), prepared_.num_tensors(), kernel_.body().num_tensor_slots};
  }
  const codegen::KernelBody& body() const override { return kernel_.body(); }
  std::int64_t scratch_bytes() const override { return static_cast<std::int64_t>(scratch_bytes_); }
  void step(float step, float inv_grad_scale, void*) override {
    kernel_.run_pass(prepared_, kernel_.reduction_passes(), step, inv_grad_scale);
  }
  bool grads_finite(float inv_grad_scale, void*) override {
    return kernel_.grads_finite(prepared_, inv_grad_scale);
  }
  void set_hypers(const std::vector<std::vector<float>>& hypers) override {
    prepared_.set_hypers(hypers);
  }
  int launches_per_step() const override {
    return prepared_.empty() ? 0 : 1 + 2 * kernel_.reduction_passes();
  }
  std::string key() const override { return kernel_.key(); }
  std::string origin() const override { return kernel_.origin(); }
  double seconds() const override { return kernel_.seconds(); }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };

  // The pointer table with the scratch tensors appended (one fp32 view per scratch value
  // and tensor, in one allocation).
  std::vector<std::vector<void*>> with_scratch(const BindingTensors& tensors) {
    std::vector<std::vector<void*>> ptrs = tensors.ptrs;
    const std::size_t k = kernel_.body().scratch.size();
    if (k == 0) return ptrs;
    std::size_t total = 0;
    for (std::int64_t n : tensors.numel) {
      total += k * ((static_cast<std::size_t>(n) * 4 + kScratchAlign - 1) / kScratchAlign *
                    kScratchAlign);
    }
    scratch_bytes_ = total;
    scratch_.reset(static_cast<float*>(
        std::aligned_alloc(kScratchAlign, std::max<std::size_t>(total, kScratchAlign))));
    if (!scratch_)
      throw Error("Optimizer: cannot allocate the scratch memory of the store strategy");
    auto* base = reinterpret_cast<std::byte*>(scratch_.get());
    std::size_t offset = 0;
    for (std::size_t t = 0; t < ptrs.size(); ++t) {
      for (std::size_t j = 0; j < k; ++j) {
        ptrs[t].push_back(base + offset);
        offset += (static_cast<std::size_t>(tensors.numel[t]) * 4 + kScratchAlign - 1) /
                  kScratchAlign * kScratchAlign;
      }
    }
    return ptrs;
  }

  HostKernel kernel_;
  std::unique_ptr<float, Free> scratch_;
  std::size_t scratch_bytes_ = 0;
  HostKernel::Prepared prepared_;
};

}  // namespace

std::unique_ptr<Backend> make_host_backend(std::shared_ptr<const lang::Rule> rule,
                                           const BindingTensors& tensors,
                                           const std::vector<std::vector<float>>& hypers) {
  return std::make_unique<HostBackend>(std::move(rule), tensors, hypers);
}

}  // namespace fusedopt::runtime
