// Optimizer construction, in named steps over its pieces: take the rule (its clipping
// applied) and its hypers, validate the params (errors name the tensor), make the device's
// backend, lay out the states, bind one planned kernel per dtype binding, report. And
// Optimizer::rebind, which points the built kernels at other params and grads.
#include <fmt/format.h>

#include <utility>

#include "fusedopt/error.hpp"
#include "optimizer/optimizer_impl.hpp"
#include "optimizer/params.hpp"
#include "support/check.hpp"

namespace fusedopt {

Optimizer::Optimizer(const Rule& rule, std::vector<ParamGroup> groups, OptimizerOptions options)
    : impl_(Impl::build(rule, std::move(groups), options, {})) {}

Optimizer::Optimizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<Optimizer::Impl> Optimizer::Impl::build(const Rule& user_rule,
                                                        std::vector<ParamGroup> groups,
                                                        const OptimizerOptions& options,
                                                        std::vector<PieceOrigin> origins) {
  check_options(options);
  const Rule rule =
      options.max_grad_norm > 0.0 ? user_rule.with_grad_clipping(options.max_grad_norm) : user_rule;
  auto impl = std::make_unique<Impl>(rule);
  Impl& m = *impl;
  m.options = options;
  m.store = runtime::StateStore(rule, options);
  m.hypers = runtime::Hypers(rule, groups);
  m.store.take_params(runtime::take_params(groups), std::move(origins));
  m.device = m.store.device();
  try {
    m.backend = runtime::make_backend(m.device);
  } catch (const UnavailableError& e) {
    throw UnavailableError(fmt::format("{}: param is on {} but {}",
                                       runtime::describe(m.store.params().front()),
                                       runtime::device_name(m.device), e.what()));
  }
  m.store.lay_out(*m.backend);
  m.runner.start(*m.backend, rule);
  const std::vector<runtime::BindingTensors> tensors =
      m.store.binding_tensors(*m.backend, m.runner.global_totals());
  m.runner.bind(rule, tensors, m.hypers.values(), m.store.binding_params());
  m.reports = runtime::make_reports(rule, m.store, m.runner, *m.backend);
  return impl;
}

void Optimizer::rebind(const std::vector<void*>& param_data, const std::vector<void*>& grad_data,
                       void* stream) {
  Impl& m = live("rebind");
  Impl::Exclusive hold(m, "rebind");
  std::vector<runtime::ParamSlot>& params = m.store.mutable_params();
  const std::size_t n = params.size();
  for (const auto* list : {&param_data, &grad_data}) {
    FUSEDOPT_CHECK_USAGE(list->empty() || list->size() == n,
                         "Optimizer::rebind: {} {} pointers for {} params (give one per param, "
                         "or none)",
                         list->size(), list == &param_data ? "param" : "grad", n);
  }
  // The new pointers in place (each old one kept), checked, then handed to the kernels; any
  // refusal puts the old ones back.
  std::vector<std::pair<Tensor*, void*>> old;
  for (std::size_t p = 0; p < n; ++p) {
    for (const bool grad : {false, true}) {
      const std::vector<void*>& list = grad ? grad_data : param_data;
      Tensor& t = grad ? params[p].grad : params[p].param;
      if (list.empty() || list[p] == nullptr || list[p] == t.data) continue;
      old.emplace_back(&t, t.data);
      t.data = list[p];
    }
  }
  if (old.empty()) return;
  auto restore = [&] {
    for (const auto& [t, data] : old) t->data = data;
  };
  auto pointers = [&] {
    std::vector<std::vector<std::vector<void*>>> ptrs;
    for (std::size_t b = 0; b < m.store.bindings().size(); ++b) {
      ptrs.push_back(m.store.binding_ptrs(b));
    }
    return ptrs;
  };
  try {
    runtime::check_no_overlap(params);
  } catch (...) {
    restore();
    throw;
  }
  try {
    m.runner.rebind(pointers(), stream);
  } catch (...) {
    // A kernel refused (a host pointer for a CUDA optimizer): back to the old pointers.
    restore();
    m.runner.rebind(pointers(), stream);
    throw;
  }
}

}  // namespace fusedopt
