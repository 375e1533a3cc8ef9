// Binding: the Plan's tables in the backend's memory, one launch table over them, and each
// step op as module launches (binding.hpp).
#include "exec/binding.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "fusedopt/error.hpp"
#include "support/check.hpp"

namespace fusedopt::runtime {

namespace {

template <typename T>
T* as(const Buffer& b) {
  return static_cast<T*>(b.data());
}

/// The plan of one binding with the Store strategy's scratch tensors laid out and allocated
/// from `backend` into `*scratch` (views `scratch_align`-aligned).
Plan plan_binding(Backend& backend, const KernelLayout& layout, PlanRequest request,
                  Buffer* scratch) {
  request.lay_out_scratch = true;
  request.scratch_align = backend.scratch_align();
  Plan plan = Plan::build(layout, request);
  if (plan.scratch_bytes() > 0) {
    *scratch = backend.allocate(plan.scratch_bytes());
    plan.bind_scratch(scratch->data());
  }
  return plan;
}

/// `plan`'s pointers as Backend::check_pointers reads them (the caller's roles: not the
/// Store strategy's scratch, which the binding allocated).
void check_pointers(const Backend& backend, const Plan& plan, const KernelLayout& layout,
                    const std::vector<std::string>& names) {
  backend.check_pointers({plan.ptrs(), plan.num_tensors(), plan.num_roles(),
                          plan.num_roles() - static_cast<int>(layout.scratch.size()), names,
                          layout.roles});
}

}  // namespace

template <typename T>
Buffer Binding::upload(const std::vector<T>& values) {
  const std::size_t bytes = values.size() * sizeof(T);
  Buffer b = backend_.allocate(std::max<std::size_t>(bytes, 16));  // never 0 bytes
  if (bytes) backend_.copy_from_host(b.data(), values.data(), bytes);
  return b;
}

Binding::Binding(Backend& backend, std::shared_ptr<Module> module, const BindingTensors& tensors,
                 const std::vector<std::vector<double>>& hypers)
    : backend_(backend), module_(std::move(module)), names_(tensors.names) {
  PlanRequest request("Binding", tensors.ptrs, tensors.numel, hypers, tensors.group,
                      backend.chunk_elems());
  request.shapes = &tensors.shapes;
  request.factored_min_rows = backend.factored_min_rows();
  plan_ = plan_binding(backend, layout(), request, &scratch_);
  check_pointers(backend, plan_, layout(), names_);
  stages_ = MatrixStages(layout(), tensors, plan_);
  upload_tables(tensors);
}

void Binding::stage(int pass, void* stream) { stages_.run(pass, backend_, plan_, stream); }

Binding::~Binding() = default;

void Binding::upload_tables(const BindingTensors& tensors) {
  const KernelLayout& b = layout();
  chunks_ = upload(plan_.chunks());
  ptrs_ = upload(plan_.ptrs());
  hypers_ = upload(plan_.hypers());
  aligned_ = upload(plan_.aligned());
  tensor_info_ = upload(plan_.tensor_info());
  tensor_groups_ = upload(plan_.tensor_groups());
  base_.chunks = as<const fo_chunk>(chunks_);
  base_.num_chunks = static_cast<long long>(plan_.num_chunks());
  base_.ptrs = as<void* const>(ptrs_);
  base_.hypers = as<const double>(hypers_);
  base_.aligned = as<const unsigned char>(aligned_);
  base_.tensor_info = as<const double>(tensor_info_);
  base_.tensor_groups = as<const int>(tensor_groups_);
  if (!tensors.ids.empty()) {
    tensor_ids_ = upload(tensors.ids);
    base_.tensor_ids = as<const long long>(tensor_ids_);
  }
  base_.seed = tensors.seed;
  if (!tensors.whole_info.empty()) {
    tensor_whole_ = upload(tensors.whole_info);
    base_.tensor_whole = as<const double>(tensor_whole_);
  }
  base_.num_tensors = static_cast<long long>(plan_.num_tensors());
  if (b.reduction_passes > 0) {
    partials_ = backend_.allocate(std::max<std::size_t>(plan_.num_partials() * sizeof(float), 16));
    tensor_totals_ = upload(std::vector<double>(plan_.num_tensor_totals(), 0.0));
    tensor_chunks_ = upload(plan_.tensor_chunks());
    base_.partials = as<float>(partials_);
    base_.tensor_totals = as<double>(tensor_totals_);
    base_.tensor_chunks = as<const long long>(tensor_chunks_);
  }
  if (tensors.global_totals) {
    base_.global_totals = static_cast<double*>(tensors.global_totals);
  } else {
    own_global_ = upload(std::vector<double>(plan_.num_global_totals(), 0.0));
    base_.global_totals = as<double>(own_global_);
  }
  if (plan_.num_scalars() > 0) {
    if (tensors.scalars) {
      base_.scalars = static_cast<double*>(tensors.scalars);
    } else {
      own_scalars_ = upload(std::vector<double>(plan_.num_scalars(), 0.0));
      base_.scalars = as<double>(own_scalars_);
    }
  }
  if (b.factored) upload_factored(tensors);
}

void Binding::upload_factored(const BindingTensors& tensors) {
  const Plan::RcWidths& w = plan_.rc_widths();
  auto zeros = [](std::int64_t n, int width) {
    return std::max<std::size_t>(static_cast<std::size_t>(n), 1) * static_cast<std::size_t>(width);
  };
  rc_offsets_ = upload(plan_.rc_offsets());
  chunk_cols_ = upload(plan_.chunk_cols());
  row_totals_ = upload(std::vector<double>(zeros(plan_.num_rows(), w.row_slots), 0.0));
  col_totals_ = upload(std::vector<double>(zeros(plan_.num_cols(), w.col_slots), 0.0));
  matrix_totals_ = upload(std::vector<double>(zeros(plan_.num_matrices(), w.matrix_slots), 0.0));
  col_partials_ =
      upload(std::vector<double>(std::max<std::size_t>(plan_.num_col_partials(), 1), 0.0));
  base_.rc_offsets = as<const long long>(rc_offsets_);
  base_.chunk_cols = as<const long long>(chunk_cols_);
  base_.row_totals = as<double>(row_totals_);
  base_.col_totals = as<double>(col_totals_);
  base_.matrix_totals = as<double>(matrix_totals_);
  base_.col_partials = as<double>(col_partials_);
  if (!tensors.spans.empty()) {
    // Each spanning tensor's region of the shard: its columns' sums, then its matrix sums.
    std::vector<long long> offsets(static_cast<std::size_t>(plan_.num_tensors()), -1);
    const std::vector<long long>& o = plan_.rc_offsets();
    for (std::size_t t = 0; t < offsets.size() && t < tensors.spans.size(); ++t) {
      if (!tensors.spans[t]) continue;
      offsets[t] = shard_size_;
      shard_size_ += (o[3 * t + 4] - o[3 * t + 1]) * w.col_slots + w.matrix_slots;
    }
    shard_offsets_ = upload(offsets);
    base_.shard_offsets = as<const long long>(shard_offsets_);
  }
  if (tensors.row_states || tensors.col_states) {
    base_.row_states = static_cast<float*>(tensors.row_states);
    base_.col_states = static_cast<float*>(tensors.col_states);
  } else {
    own_rows_ = upload(std::vector<float>(zeros(plan_.num_rows(), w.row_states), 0.0f));
    own_cols_ = upload(std::vector<float>(zeros(plan_.num_cols(), w.col_states), 0.0f));
    base_.row_states = as<float>(own_rows_);
    base_.col_states = as<float>(own_cols_);
  }
}

fo_launch Binding::launch_table(const StepArgs& args) const {
  fo_launch L = base_;
  args.apply(L);
  return L;
}

void Binding::init_states() {
  // Initial values are not part of a step: nothing skips them. On the default stream,
  // complete on return.
  const fo_launch L = launch_table(StepArgs{});
  if (layout().writes_after_update()) module_->scalars(true, L, nullptr);
  module_->init(L, nullptr);
  backend_.synchronize(nullptr);
}

void Binding::reduce(int pass, const StepArgs& args, bool check_grads, void* stream) {
  FUSEDOPT_CHECK_INTERNAL(pass >= 0 && pass < layout().reduction_passes,
                          "reduction pass {}: the rule has {}", pass, layout().reduction_passes);
  fo_launch L = launch_table(args);
  L.check_grads = check_grads ? 1 : 0;
  module_->reduce(pass, L, stream);
}

void Binding::finalize(int pass, bool accumulate, const StepArgs& args, void* stream, int stage) {
  fo_launch L = launch_table(args);
  L.global_accumulate = accumulate ? 1 : 0;
  L.rc_stage = stage;
  module_->finalize(pass, L, stream);
}

void Binding::update(const StepArgs& args, void* stream) {
  const fo_launch L = launch_table(args);
  module_->step(L, stream);
  // Every tensor's, empty ones included: a scalar counts steps, not elements.
  if (layout().writes_after_update()) module_->scalars(false, L, stream);
}

void Binding::check_grads(float inv_grad_scale, const float* device_scale, void* flag,
                          void* stream) {
  StepArgs args;  // the check itself always runs: no skip flag
  args.inv_grad_scale = inv_grad_scale;
  args.device_scale = device_scale;
  module_->check(launch_table(args), static_cast<double*>(flag), stream);
}

void Binding::count_step(double* steps_taken, const double* skip, void* stream) {
  module_->advance_step(steps_taken, skip, stream);
}

void Binding::update_scaler(void* scaler, const void* flag, float growth, float backoff,
                            int interval, void* stream) {
  module_->update_scale(static_cast<fo_scaler*>(scaler), static_cast<const double*>(flag), growth,
                        backoff, interval, stream);
}

void Binding::set_hypers(const std::vector<std::vector<double>>& hypers, void* stream) {
  const int n = plan_.num_hypers();
  FUSEDOPT_CHECK_USAGE(static_cast<int>(hypers.size()) == plan_.num_groups(),
                       "set_hypers: {} groups given, the plan has {}", hypers.size(),
                       plan_.num_groups());
  for (std::size_t g = 0; g < hypers.size(); ++g) {
    FUSEDOPT_CHECK_USAGE(static_cast<int>(hypers[g].size()) == n,
                         "set_hypers: group {} has {} values, the rule has {} hypers", g,
                         hypers[g].size(), n);
  }
  if (n == 0) return;
  stages_.check_hypers(hypers);
  FUSEDOPT_CHECK_USAGE(!backend_.capturing(stream),
                       "set_hyper on a stream that is being captured: a captured copy reads its "
                       "host memory when the graph replays, and these values are gone by then; "
                       "set hypers before capturing or between replays (a captured step reads "
                       "the device's hypers each time it replays)");
  plan_.set_hypers(hypers);
  // One copy per group, from pageable memory: staged before the call returns.
  for (std::size_t g = 0; g < hypers.size(); ++g) {
    const std::size_t offset = g * static_cast<std::size_t>(n) * sizeof(double);
    backend_.copy_from_host_async(hypers_.bytes_data() + offset, hypers[g].data(),
                                  hypers[g].size() * sizeof(double), stream);
  }
}

void Binding::rebind(const std::vector<std::vector<void*>>& ptrs, void* stream) {
  Plan plan = plan_;
  plan.rebind(layout(), ptrs);
  check_pointers(backend_, plan, layout(), names_);
  // From pageable memory: staged before the call returns.
  backend_.copy_from_host_async(ptrs_.data(), plan.ptrs().data(),
                                plan.ptrs().size() * sizeof(void*), stream);
  backend_.copy_from_host_async(aligned_.data(), plan.aligned().data(), plan.aligned().size(),
                                stream);
  plan_ = std::move(plan);
}

TensorTotalsView Binding::tensor_totals() const {
  return {base_.tensor_totals, plan_.num_tensors(), layout().num_tensor_slots};
}

double* Binding::scalars() const { return base_.scalars; }

int Binding::launches_per_step(bool with_count) const {
  const int scalars = layout().writes_after_update() ? 1 : 0;  // scalar, row, column states
  const int count = with_count && module_->counts_by_launch() ? 1 : 0;
  const int passes = plan_.empty() ? 0 : 1 + 2 * layout().reduction_passes;
  return passes + scalars + count;
}

}  // namespace fusedopt::runtime
