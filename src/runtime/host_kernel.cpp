// HostKernel: generate -> cache/compile -> dlopen; plan the tables once, then launch.
#include "runtime/host_kernel.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "cache/kernel_cache.hpp"
#include "codegen/codegen.hpp"
#include "fusedopt/error.hpp"
#include "support/check.hpp"
#include "support/dynlib.hpp"

namespace fusedopt::runtime {

namespace {
using EntryPoint = void (*)(const fo_launch*);
using CheckPoint = int (*)(const fo_launch*);
using PassPoint = void (*)(const fo_launch*, int);
}  // namespace

struct HostKernel::Impl {
  std::shared_ptr<const support::DynLib> lib;
  EntryPoint step = nullptr;
  EntryPoint init = nullptr;
  CheckPoint check = nullptr;
  PassPoint reduce = nullptr;
  PassPoint finalize = nullptr;
  PassPoint scalars = nullptr;
};

HostKernel::Prepared::Prepared(Plan plan) : plan_(std::move(plan)) {
  own_global_.assign(plan_.num_global_totals(), 0.0);
  partials_.assign(plan_.num_partials(), 0.0f);
  tensor_totals_.assign(plan_.num_tensor_totals(), 0.0);
  own_scalars_.assign(plan_.num_scalars(), 0.0);
  const auto rows = static_cast<std::size_t>(plan_.num_rows());
  const auto cols = static_cast<std::size_t>(plan_.num_cols());
  if (!plan_.rc_offsets().empty()) {
    const Plan::RcWidths& w = plan_.rc_widths();
    auto size = [](std::size_t n, int width) {
      return std::max<std::size_t>(n, 1) * static_cast<std::size_t>(width);
    };
    row_totals_.assign(size(rows, w.row_slots), 0.0);
    col_totals_.assign(size(cols, w.col_slots), 0.0);
    matrix_totals_.assign(size(static_cast<std::size_t>(plan_.num_matrices()), w.matrix_slots),
                          0.0);
    col_partials_.assign(std::max<std::size_t>(plan_.num_col_partials(), 1), 0.0);
    own_rows_.assign(size(rows, w.row_states), 0.0f);
    own_cols_.assign(size(cols, w.col_states), 0.0f);
  }
}

fo_launch HostKernel::Prepared::launch(const StepArgs& args) const {
  fo_launch L{};
  L.chunks = plan_.chunks().data();
  L.num_chunks = static_cast<long long>(plan_.num_chunks());
  L.ptrs = plan_.ptrs().data();
  L.hypers = plan_.hypers().data();
  args.apply(L);
  L.partials = partials_.empty() ? nullptr : partials_.data();
  L.tensor_totals = const_cast<double*>(tensor_totals_.empty() ? nullptr : tensor_totals_.data());
  L.global_totals = const_cast<double*>(global_totals());
  L.tensor_chunks = plan_.tensor_chunks().empty() ? nullptr : plan_.tensor_chunks().data();
  L.num_tensors = static_cast<long long>(plan_.num_tensors());
  L.scalars = scalars();
  L.tensor_groups = plan_.tensor_groups().data();
  L.tensor_info = plan_.tensor_info().data();
  if (!plan_.rc_offsets().empty()) {
    L.rc_offsets = plan_.rc_offsets().data();
    L.chunk_cols = plan_.chunk_cols().data();
    L.row_states = row_states();
    L.col_states = col_states();
    L.row_totals = row_totals_.data();
    L.col_totals = col_totals_.data();
    L.matrix_totals = matrix_totals_.data();
    L.col_partials = col_partials_.data();
  }
  return L;
}

HostKernel::HostKernel(std::shared_ptr<const lang::Rule> rule, DTypeBinding dtypes,
                       cache::KernelCache& cache, codegen::Strategy strategy)
    : HostKernel(rule, dtypes,
                 provider::provide({rule, nullptr, dtypes, Target::host(), strategy}, cache)) {}

HostKernel::HostKernel(std::shared_ptr<const lang::Rule> rule, DTypeBinding dtypes,
                       provider::ProvidedKernel built)
    : rule_(std::move(rule)), dtypes_(dtypes), impl_(std::make_unique<Impl>()) {
  impl_->lib = support::load_host_module(built.key.hex(), *built.binary, "fusedopt-" + rule_->name);
  auto abi = reinterpret_cast<int (*)()>(impl_->lib->symbol("fusedopt_abi_version"));
  impl_->step = reinterpret_cast<EntryPoint>(impl_->lib->symbol("fusedopt_step_host"));
  impl_->init = reinterpret_cast<EntryPoint>(impl_->lib->symbol("fusedopt_init_host"));
  impl_->check = reinterpret_cast<CheckPoint>(impl_->lib->symbol("fusedopt_check_host"));
  impl_->reduce = reinterpret_cast<PassPoint>(impl_->lib->symbol("fusedopt_reduce_host"));
  impl_->finalize = reinterpret_cast<PassPoint>(impl_->lib->symbol("fusedopt_finalize_host"));
  impl_->scalars = reinterpret_cast<PassPoint>(impl_->lib->symbol("fusedopt_scalars_host"));
  if (!abi || !impl_->step || !impl_->init || !impl_->check || !impl_->reduce || !impl_->finalize ||
      !impl_->scalars) {
    throw InternalError("host kernel for '" + rule_->name + "' lacks its entry points");
  }
  FUSEDOPT_CHECK_INTERNAL(abi() == FO_ABI_VERSION, "host kernel ABI {} != runtime ABI {}", abi(),
                          FO_ABI_VERSION);
  info_ = built.take_info();
}

int HostKernel::reduction_passes() const { return info_.body.reduction_passes; }

HostKernel::~HostKernel() = default;

int HostKernel::num_roles() const { return info_.body.num_roles; }

PlanRequest HostKernel::plan_request(const std::vector<std::vector<void*>>& ptrs,
                                     const std::vector<std::int64_t>& numel,
                                     const std::vector<std::vector<double>>& hypers,
                                     const std::vector<int>& group) const {
  return PlanRequest("HostKernel", ptrs, numel, hypers, group, kHostChunkElems);
}

HostKernel::Prepared HostKernel::prepare(const std::vector<std::vector<void*>>& ptrs,
                                         const std::vector<std::int64_t>& numel,
                                         const std::vector<std::vector<double>>& hypers,
                                         const std::vector<int>& group) const {
  return Prepared(Plan::build(info_.body, plan_request(ptrs, numel, hypers, group)));
}

void HostKernel::run_pass(Prepared& prepared, int pass, const StepArgs& args,
                          bool check_grads) const {
  const int n = info_.body.reduction_passes;
  if (pass < 0 || pass > n) {
    throw InternalError(
        fmt::format("HostKernel::run_pass({}): the rule has {} passes", pass, n + 1));
  }
  fo_launch L = prepared.launch(args);
  L.check_grads = check_grads ? 1 : 0;
  if (pass == n) {
    if (!prepared.empty()) impl_->step(&L);
  } else {
    impl_->reduce(&L, pass);
  }
}

void HostKernel::finalize(Prepared& prepared, int pass, bool accumulate,
                          const StepArgs& args) const {
  fo_launch L = prepared.launch(args);
  L.global_accumulate = accumulate ? 1 : 0;
  impl_->finalize(&L, pass);
}

void HostKernel::step(const Prepared& prepared, double step, float inv_grad_scale) const {
  auto& p = const_cast<Prepared&>(prepared);  // only the reduction scratch changes
  StepArgs args;
  args.step = step;
  args.inv_grad_scale = inv_grad_scale;
  if (!prepared.empty()) {
    for (int pass = 0; pass < info_.body.reduction_passes; ++pass) {
      run_pass(p, pass, args);
      finalize(p, pass, false, args);
    }
    run_pass(p, info_.body.reduction_passes, args);
  }
  update_scalars(prepared, args);  // empty tensors too: a scalar counts steps, not elements
}

void HostKernel::init_states(const Prepared& prepared) const {
  const fo_launch L = prepared.launch(0.0f, 1.0f);
  if (!prepared.empty()) impl_->init(&L);
  if (info_.body.writes_after_update()) impl_->scalars(&L, 1);
}

void HostKernel::update_scalars(const Prepared& prepared, const StepArgs& args) const {
  if (!info_.body.writes_after_update()) return;
  const fo_launch L = prepared.launch(args);
  impl_->scalars(&L, 0);
}

bool HostKernel::grads_finite(const Prepared& prepared, float inv_grad_scale,
                              const float* device_scale) const {
  if (prepared.empty()) return true;
  StepArgs args;
  args.inv_grad_scale = inv_grad_scale;
  args.device_scale = device_scale;
  const fo_launch L = prepared.launch(args);
  return impl_->check(&L) != 0;
}

}  // namespace fusedopt::runtime
