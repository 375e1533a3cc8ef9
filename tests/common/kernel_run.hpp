// A rule's kernel loaded on one device, for the tests that drive kernels without an
// Optimizer: it plans tensor lists into runtime::Bindings (the Optimizer's own class, on the
// same Backend and Module) and runs whole steps of them. Nothing here is a second path
// through the kernels: a step is the Binding's ops in the step program's order.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache/kernel_cache.hpp"
#include "codegen/codegen.hpp"
#include "compile/kernel_loader.hpp"
#include "device/backend.hpp"
#include "exec/binding.hpp"
#include "exec/step_args.hpp"
#include "fusedopt/dtype.hpp"
#include "fusedopt/optimizer.hpp"
#include "lang/ast.hpp"

namespace fusedopt::testing {

class Kernel {
 public:
  /// Gets `rule`'s kernel for `dtypes` from `cache` (compiling it on a miss) and loads it on
  /// `device`.
  Kernel(std::shared_ptr<const lang::Rule> rule, DTypeBinding dtypes, cache::KernelCache& cache,
         Device device = Device::host(), codegen::Strategy strategy = codegen::Strategy::Auto)
      : rule_(std::move(rule)),
        dtypes_(dtypes),
        strategy_(strategy),
        backend_(runtime::make_backend(device)),
        module_(runtime::load_kernel(*backend_, rule_, dtypes_, strategy, cache)) {}

  /// Pointers per tensor a caller gives: param, grad, each state, each output, then the
  /// fp32 master (the Store strategy's scratch tensors are the binding's own).
  int num_roles() const { return body().num_roles - static_cast<int>(body().scratch.size()); }
  int reduction_passes() const { return body().reduction_passes; }
  const lang::Rule& rule() const { return *rule_; }
  const DTypeBinding& dtypes() const { return dtypes_; }
  const KernelLayout& body() const { return module_->layout(); }
  const std::string& key() const { return module_->info().key; }
  fusedopt::KernelOrigin origin() const { return module_->info().origin; }
  double seconds() const { return module_->info().seconds; }
  runtime::Backend& backend() const { return *backend_; }

  /// Plans the kernel over a tensor list (memory of the device): `ptrs[t]` holds tensor t's
  /// num_roles() pointers, `numel[t]` its size, `hypers[g]` group g's values (Rule::hypers
  /// order), `group[t]` its group (empty: all 0). The kernel must outlive the binding.
  std::unique_ptr<runtime::Binding> prepare(const std::vector<std::vector<void*>>& ptrs,
                                            const std::vector<std::int64_t>& numel,
                                            const std::vector<std::vector<double>>& hypers,
                                            const std::vector<int>& group = {}) const {
    runtime::BindingTensors t;
    t.dtypes = dtypes_;
    t.ptrs = ptrs;
    t.numel = numel;
    t.group = group;
    t.strategy = strategy_;
    return std::make_unique<runtime::Binding>(*backend_, module_, t, hypers);
  }

  /// One step: every reduction pass and its finalize, then the update (and the scalar
  /// states), with `args`, on `stream`.
  static void step(runtime::Binding& b, const runtime::StepArgs& args, void* stream = nullptr) {
    for (int pass = 0; pass < b.layout().reduction_passes; ++pass) {
      b.reduce(pass, args, false, stream);
      b.finalize(pass, false, args, stream);
    }
    b.update(args, stream);
  }
  /// Step `step` (1-based), gradients times `inv_grad_scale`.
  static void step(runtime::Binding& b, double step, float inv_grad_scale = 1.0f,
                   void* stream = nullptr) {
    runtime::StepArgs args;
    args.step = step;
    args.inv_grad_scale = inv_grad_scale;
    Kernel::step(b, args, stream);
  }
  /// A step that needs nothing from the host (a CUDA graph can capture it): its step is one
  /// past the count at `steps_taken` (device memory), which it then advances.
  static void counted_step(runtime::Binding& b, double* steps_taken, void* stream = nullptr) {
    runtime::StepArgs args;
    args.steps_taken = steps_taken;
    step(b, args, stream);
    b.count_step(steps_taken, nullptr, stream);
  }
  /// Whether every gradient times `inv_grad_scale` is finite: the grad check into a flag of
  /// the device, read back (waits for `stream`).
  bool grads_finite(runtime::Binding& b, float inv_grad_scale, void* stream = nullptr) const {
    runtime::Buffer flag = backend_->allocate(sizeof(double));  // zeroed
    b.check_grads(inv_grad_scale, nullptr, flag.data(), stream);
    backend_->synchronize(stream);
    double found = 0;
    backend_->copy_to_host(&found, flag.data(), sizeof found);
    return found == 0.0;
  }

 private:
  std::shared_ptr<const lang::Rule> rule_;
  DTypeBinding dtypes_;
  codegen::Strategy strategy_;
  std::unique_ptr<runtime::Backend> backend_;  // outlives the module and every binding
  std::shared_ptr<runtime::Module> module_;
};

}  // namespace fusedopt::testing
