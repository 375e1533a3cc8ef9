// Optimizer: steps (one launch per dtype binding), hypers, state views and statistics.
// Construction lives in plan.cpp, checkpoints in checkpoint.cpp.
#include <fmt/format.h>

#include <cstring>

#include "fusedopt/error.hpp"
#include "runtime/optimizer_impl.hpp"

namespace fusedopt {

std::size_t Optimizer::Impl::hyper_index(const std::string& name) const {
  for (std::size_t k = 0; k < hyper_names.size(); ++k) {
    if (hyper_names[k] == name) return k;
  }
  std::string known;
  for (const std::string& h : hyper_names) known += (known.empty() ? "" : ", ") + h;
  throw Error(fmt::format("rule '{}' has no hyper '{}' (it has: {})", rule.name(), name,
                          known.empty() ? "none" : known));
}

std::vector<std::vector<float>> Optimizer::Impl::float_hypers() const {
  std::vector<std::vector<float>> out;
  for (const auto& group : hypers) out.emplace_back(group.begin(), group.end());
  return out;
}

void Optimizer::Impl::push_hypers() {
  const std::vector<std::vector<float>> h = float_hypers();
  if (!context) {
    for (auto& backend : backends) backend->set_hypers(h);
    return;
  }
  // The device hyper table is shared by every launch: wait for queued steps (on any
  // stream) before replacing it, and for the copy before the next step can start.
  runtime::cuda::ContextScope scope(*context);
  runtime::cuda::context_synchronize();
  for (auto& backend : backends) backend->set_hypers(h);
  runtime::cuda::context_synchronize();
}

int Optimizer::Impl::state_index(const std::string& name) const {
  for (std::size_t k = 0; k < state_names.size(); ++k) {
    if (state_names[k] == name) return static_cast<int>(k);
  }
  if (name == "master" && options.master_weights) return -1;
  std::string known;
  for (const std::string& s : state_names) known += (known.empty() ? "" : ", ") + s;
  if (options.master_weights) known += (known.empty() ? "" : ", ") + std::string("master");
  throw Error(fmt::format("rule '{}' has no state '{}' (it has: {})", rule.name(), name,
                          known.empty() ? "none" : known));
}

void Optimizer::Impl::read_memory(void* host_dst, const void* src, std::size_t bytes) const {
  if (device.kind == Device::Kind::Cuda) {
    runtime::cuda::ContextScope scope(*context);
    runtime::cuda::copy_to_host(host_dst, reinterpret_cast<runtime::cuda::DevicePtr>(src), bytes);
  } else {
    std::memcpy(host_dst, src, bytes);
  }
}

void Optimizer::Impl::write_memory(void* dst, const void* host_src, std::size_t bytes) const {
  if (device.kind == Device::Kind::Cuda) {
    runtime::cuda::ContextScope scope(*context);
    runtime::cuda::copy_to_device(reinterpret_cast<runtime::cuda::DevicePtr>(dst), host_src, bytes);
  } else {
    std::memcpy(dst, host_src, bytes);
  }
}

Tensor Optimizer::Impl::state_view(int s, std::size_t p) const {
  const runtime::ParamSlot& slot = params[p];
  Tensor t;
  t.numel = slot.param.numel;
  t.device = device;
  if (s < 0) {
    t.data = slot.master;
    t.dtype = DType::F32;
    t.name = slot.name + "/master";
    if (t.data == nullptr) t.numel = 0;  // an fp32 param (or an empty one) has no master
  } else {
    t.data = slot.states[static_cast<std::size_t>(s)];
    t.dtype = options.state_dtype;
    t.name = slot.name + "/" + state_names[static_cast<std::size_t>(s)];
  }
  return t;
}

Optimizer::~Optimizer() = default;

Optimizer::Impl::~Impl() {
  if (!context) return;
  try {
    runtime::cuda::ContextScope scope(*context);
    backends.clear();  // CudaKernels first: their launches use the arenas
    arenas.clear();
  } catch (const Error&) {
    // A destructor must not throw; the memory is lost with the context anyway.
  }
}

std::int64_t Optimizer::Impl::current_step_count() const {
  for (const auto& backend : backends) {
    const std::int64_t on_device = backend->device_steps();
    if (on_device >= 0) return on_device;
  }
  return step_count;
}
Optimizer::Optimizer(Optimizer&&) noexcept = default;
Optimizer& Optimizer::operator=(Optimizer&&) noexcept = default;

void Optimizer::step(void* stream) {
  const auto step = static_cast<float>(impl_->step_count + 1);
  for (auto& backend : impl_->backends) backend->step(step, 1.0f, stream);
  ++impl_->step_count;
}

bool Optimizer::step_scaled(float inv_grad_scale, void* stream) {
  // Every binding is checked before any is stepped: a non-finite gradient anywhere must
  // leave every tensor untouched.
  for (auto& backend : impl_->backends) {
    if (!backend->grads_finite(inv_grad_scale, stream)) return false;
  }
  const auto step = static_cast<float>(impl_->step_count + 1);
  for (auto& backend : impl_->backends) backend->step(step, inv_grad_scale, stream);
  ++impl_->step_count;
  return true;
}

void Optimizer::set_hyper(const std::string& name, double value, std::optional<int> group) {
  const std::size_t k = impl_->hyper_index(name);
  const int groups = static_cast<int>(impl_->hypers.size());
  if (group && (*group < 0 || *group >= groups)) {
    throw Error(fmt::format("set_hyper('{}'): there is no group {} (the optimizer has {} group{})",
                            name, *group, groups, groups == 1 ? "" : "s"));
  }
  for (int g = 0; g < groups; ++g) {
    if (!group || *group == g) impl_->hypers[static_cast<std::size_t>(g)][k] = value;
  }
  impl_->push_hypers();
}

double Optimizer::hyper(const std::string& name, int group) const {
  const std::size_t k = impl_->hyper_index(name);
  const int groups = static_cast<int>(impl_->hypers.size());
  if (group < 0 || group >= groups) {
    throw Error(fmt::format("hyper('{}'): there is no group {} (the optimizer has {} group{})",
                            name, group, groups, groups == 1 ? "" : "s"));
  }
  return impl_->hypers[static_cast<std::size_t>(group)][k];
}

std::int64_t Optimizer::step_count() const { return impl_->current_step_count(); }

OptimizerStats Optimizer::stats() const {
  const Impl& m = *impl_;
  const lang::Rule& r = *m.rule.impl();
  const bool param_written = r.symbols[r.param].written;
  const std::int64_t state_size = dtype_size(m.options.state_dtype);
  const auto num_states = static_cast<std::int64_t>(m.num_states);
  const auto num_outputs = static_cast<std::int64_t>(m.state_names.size() - m.num_states);
  OptimizerStats st;
  st.tensors = static_cast<std::int64_t>(m.params.size());
  for (const runtime::ParamSlot& s : m.params) {
    st.elements += s.param.numel;
    const std::int64_t psize = dtype_size(s.param.dtype);
    // With a master copy the kernel reads the fp32 master, not the 16-bit param, and
    // writes both.
    std::int64_t per = s.master ? 4 + (param_written ? 4 + psize : 0)
                                : psize + (param_written ? psize : 0);
    per += dtype_size(s.grad.dtype);                // grad read
    per += num_states * 2 * state_size;             // each state read and written
    per += num_outputs * state_size;                // outputs written
    st.bytes_per_step += per * s.param.numel;
  }
  static const char* kRank[] = {"memory", "disk", "compiled"};
  int slowest = -1;
  for (const auto& backend : m.backends) {
    st.launches_per_step += backend->launches_per_step();
    st.kernel_keys.push_back(backend->key());
    st.kernel_seconds += backend->seconds();
    for (int k = 0; k < 3; ++k) {
      if (backend->origin() == kRank[k] && k > slowest) slowest = k;
    }
  }
  st.kernel_origin = slowest >= 0 ? kRank[slowest] : "";
  st.fusion_report = m.fusion_report;
  return st;
}

Tensor Optimizer::state(const std::string& name, int param_index) const {
  const int s = impl_->state_index(name);
  if (param_index < 0 || static_cast<std::size_t>(param_index) >= impl_->params.size()) {
    throw Error(fmt::format("state('{}', {}): there is no param {} (the optimizer has {})", name,
                            param_index, param_index, impl_->params.size()));
  }
  return impl_->state_view(s, static_cast<std::size_t>(param_index));
}

}  // namespace fusedopt
