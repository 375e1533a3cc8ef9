// Optimizer construction: validate the groups (errors name the tensor), group tensors by
// dtype binding, lay out the state arenas, and plan one backend per binding, once.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "fusedopt/error.hpp"
#include "runtime/log.hpp"
#include "runtime/optimizer_impl.hpp"

namespace fusedopt {

namespace runtime {

std::string describe(const ParamSlot& slot) {
  return fmt::format("group {}, param {} ('{}')", slot.group, slot.index_in_group, slot.name);
}

}  // namespace runtime

namespace {

using runtime::ParamSlot;

constexpr std::size_t kArenaAlign = 64;

std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

bool valid_dtype(DType d) { return d == DType::F32 || d == DType::F16 || d == DType::BF16; }

std::string device_str(const Device& d) {
  return d.kind == Device::Kind::Host ? std::string("host") : fmt::format("cuda:{}", d.index);
}

/// Checks one param/grad pair on its own.
void validate_pair(const ParamSlot& s) {
  const std::string who = runtime::describe(s);
  if (!valid_dtype(s.param.dtype)) throw Error(who + ": param has an unsupported dtype");
  if (!valid_dtype(s.grad.dtype)) throw Error(who + ": grad has an unsupported dtype");
  if (s.param.numel < 0) {
    throw Error(fmt::format("{}: param has a negative size ({})", who, s.param.numel));
  }
  if (s.grad.numel != s.param.numel) {
    throw Error(
        fmt::format("{}: grad has {} elements, param has {}", who, s.grad.numel, s.param.numel));
  }
  if (s.param.numel > 0 && s.param.data == nullptr) {
    throw Error(fmt::format("{}: param data is null ({} elements)", who, s.param.numel));
  }
  if (s.param.numel > 0 && s.grad.data == nullptr) {
    throw Error(fmt::format("{}: grad data is null ({} elements)", who, s.grad.numel));
  }
  if (!(s.grad.device == s.param.device)) {
    throw Error(fmt::format("{}: grad is on {} but param is on {}", who, device_str(s.grad.device),
                            device_str(s.param.device)));
  }
}

std::string format_elements(std::int64_t n) {
  if (n < 10000) return fmt::format("{} element{}", n, n == 1 ? "" : "s");
  if (n < 1000000) return fmt::format("{:.1f} K elements", static_cast<double>(n) / 1e3);
  if (n < 1000000000) return fmt::format("{:.1f} M elements", static_cast<double>(n) / 1e6);
  return fmt::format("{:.2f} G elements", static_cast<double>(n) / 1e9);
}

std::string role_list(const codegen::KernelBody& body, const std::vector<int>& roles) {
  std::string out;
  for (int r : roles) out += (out.empty() ? "" : " ") + body.roles[static_cast<std::size_t>(r)];
  return out.empty() ? "-" : out;
}

/// What each pass reads and writes, and why the strategy was chosen, per binding.
std::string schedule_report(const lang::Rule& r,
                            const std::vector<std::unique_ptr<runtime::Backend>>& backends,
                            const std::vector<DTypeBinding>& bindings) {
  std::string out;
  for (std::size_t b = 0; b < backends.size(); ++b) {
    const codegen::KernelBody& body = backends[b]->body();
    out += fmt::format("{}{} [{}]:", out.empty() ? "" : "\n", r.name, bindings[b].str());
    for (std::size_t k = 0; k < body.pass_reads.size(); ++k) {
      std::string what;
      for (const codegen::ReductionSlot& s : body.slots) {
        if (s.pass == static_cast<int>(k) && s.name != "grad_check") {
          what += (what.empty() ? "" : ", ") + fmt::format("{} (line {})", s.name, s.line);
        }
      }
      const bool update = static_cast<int>(k) == body.reduction_passes;
      out +=
          fmt::format(" pass {} {}: reads {}, writes {};", k, update ? "update" : "[" + what + "]",
                      role_list(body, body.pass_reads[k]), role_list(body, body.pass_writes[k]));
    }
    if (body.store_pass >= 0) {
      std::string held;
      for (const std::string& s : body.scratch) held += (held.empty() ? "" : ", ") + s;
      out += fmt::format(
          " store: pass {} keeps {} in fp32 scratch ({} MB) for the update: {} B/element "
          "per step, against {} recomputing",
          body.store_pass, held.empty() ? "nothing" : held,
          static_cast<double>(backends[b]->scratch_bytes()) / 1e6, body.bytes_store,
          body.bytes_recompute);
    } else {
      out += fmt::format(
          " recompute: the update recomputes what it needs: {} B/element per step, "
          "against {} storing",
          body.bytes_recompute, body.bytes_store);
    }
  }
  return out;
}

}  // namespace

Optimizer::Optimizer(const Rule& user_rule, std::vector<ParamGroup> groups,
                     OptimizerOptions options)
    : impl_(std::make_unique<Impl>(user_rule)) {
  Impl& m = *impl_;
  m.options = options;
  if (!(options.max_grad_norm >= 0.0)) {
    throw Error(fmt::format("OptimizerOptions: max_grad_norm is {}; it must be 0 (off) or positive",
                            options.max_grad_norm));
  }
  if (options.max_grad_norm > 0.0) m.rule = user_rule.with_grad_clipping(options.max_grad_norm);
  const Rule& rule = m.rule;
  const lang::Rule& r = *rule.impl();
  m.reduction_passes = r.reduction_passes;
  for (int s : r.states) m.state_names.push_back(r.symbols[s].name);
  m.num_states = m.state_names.size();
  for (int s : r.outputs) m.state_names.push_back(r.symbols[s].name);
  std::vector<double> defaults;
  for (int h : r.hypers) {
    m.hyper_names.push_back(r.symbols[h].name);
    defaults.push_back(r.symbols[h].default_value);
  }
  if (!valid_dtype(options.state_dtype)) throw Error("OptimizerOptions: unsupported state_dtype");
  if (groups.empty()) throw Error("Optimizer: no param groups given");

  // Validate every group and tensor before anything is allocated or compiled.
  std::map<std::string, std::size_t> by_name;
  std::map<const void*, std::size_t> by_data;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    ParamGroup& group = groups[g];
    if (group.params.size() != group.grads.size()) {
      throw Error(
          fmt::format("group {}: {} params but {} grads (every param needs its grad, in "
                      "the same order)",
                      g, group.params.size(), group.grads.size()));
    }
    m.hypers.push_back(defaults);
    for (const auto& [name, value] : group.hypers) {
      std::size_t k = 0;
      try {
        k = m.hyper_index(name);
      } catch (const Error& e) {
        throw Error(fmt::format("group {}: {}", g, e.what()));
      }
      m.hypers[g][k] = value;
    }
    for (std::size_t i = 0; i < group.params.size(); ++i) {
      ParamSlot s;
      s.group = static_cast<int>(g);
      s.index_in_group = static_cast<int>(i);
      s.param = group.params[i];
      s.grad = group.grads[i];
      s.name = s.param.name.empty() ? fmt::format("param{}", m.params.size()) : s.param.name;
      validate_pair(s);
      const std::string who = runtime::describe(s);
      if (auto [it, fresh] = by_name.emplace(s.name, m.params.size()); !fresh) {
        throw Error(fmt::format("{}: the name is already used by {} (names key checkpoints)", who,
                                runtime::describe(m.params[it->second])));
      }
      if (s.param.numel > 0) {
        if (auto [it, fresh] = by_data.emplace(s.param.data, m.params.size()); !fresh) {
          throw Error(fmt::format("{}: the same memory as {} (a param may appear only once)", who,
                                  runtime::describe(m.params[it->second])));
        }
      }
      if (!m.params.empty() && !(s.param.device == m.params.front().param.device)) {
        throw Error(fmt::format("{}: param is on {} but {} is on {} (one optimizer, one device)",
                                who, device_str(s.param.device),
                                runtime::describe(m.params.front()),
                                device_str(m.params.front().param.device)));
      }
      m.params.push_back(std::move(s));
    }
  }
  if (m.params.empty()) throw Error("Optimizer: the param groups hold no parameters");
  m.device = m.params.front().param.device;
  const bool on_cuda = m.device.kind == Device::Kind::Cuda;
  std::optional<runtime::cuda::SavedCurrentContext> restore_context;
  if (on_cuda) {
    std::string why;
    if (!runtime::cuda::cuda_device_available(&why)) {
      throw Error(fmt::format("{}: param is on cuda:{} but no CUDA device can be used: {}",
                              runtime::describe(m.params.front()), m.device.index, why));
    }
    if (m.device.index < 0 || m.device.index >= runtime::cuda::device_count()) {
      throw Error(fmt::format("{}: param is on cuda:{} but there are {} CUDA devices",
                              runtime::describe(m.params.front()), m.device.index,
                              runtime::cuda::device_count()));
    }
    // The caller's current context comes back when construction ends (PrimaryContext
    // makes the device's context current).
    restore_context.emplace();
    m.context = std::make_unique<runtime::cuda::PrimaryContext>(m.device.index);
  }

  // Bindings (first-seen order) and arena layout: states and outputs in state_dtype, the
  // master copies in fp32 (sharing the fp32 arena when the states are fp32 too).
  std::map<DType, std::size_t> arena_bytes;
  std::vector<std::vector<std::size_t>> offsets(m.params.size());  // per state, then master
  for (std::size_t p = 0; p < m.params.size(); ++p) {
    ParamSlot& s = m.params[p];
    if (s.param.numel == 0) continue;
    DTypeBinding b;
    b.param = s.param.dtype;
    b.grad = s.grad.dtype;
    b.state = options.state_dtype;
    b.master = options.master_weights && s.param.dtype != DType::F32;
    auto it = std::find(m.bindings.begin(), m.bindings.end(), b);
    s.binding = static_cast<int>(it - m.bindings.begin());
    if (it == m.bindings.end()) m.bindings.push_back(b);
    const auto n = static_cast<std::size_t>(s.param.numel);
    for (std::size_t k = 0; k < m.state_names.size(); ++k) {
      std::size_t& cursor = arena_bytes[options.state_dtype];
      offsets[p].push_back(cursor);
      cursor = round_up(cursor + n * dtype_size(options.state_dtype), kArenaAlign);
    }
    if (b.master) {
      std::size_t& cursor = arena_bytes[DType::F32];
      offsets[p].push_back(cursor);
      cursor = round_up(cursor + n * 4, kArenaAlign);
    }
  }
  // Checkpoints name the master copy "<param>/master": a state of that name would collide.
  const bool any_master = std::any_of(m.bindings.begin(), m.bindings.end(),
                                      [](const DTypeBinding& b) { return b.master; });
  if (any_master &&
      std::find(m.state_names.begin(), m.state_names.end(), "master") != m.state_names.end()) {
    throw Error(
        fmt::format("Optimizer: rule '{}' has a state called 'master', which is the name "
                    "of the fp32 master copy in checkpoints; rename the state or turn "
                    "off master_weights",
                    rule.name()));
  }
  std::map<DType, std::byte*> base;
  for (const auto& [dtype, bytes] : arena_bytes) {
    runtime::Arena a;
    a.dtype = dtype;
    a.bytes = bytes;
    if (on_cuda) {
      // cuMemAlloc returns 256-byte aligned memory; zeroed so unused padding is defined.
      a.device_data = runtime::cuda::DeviceBuffer(std::max(bytes, kArenaAlign));
      runtime::cuda::memset32_async(a.device_data.get(), 0, (std::max(bytes, kArenaAlign) + 3) / 4,
                                    nullptr);
      runtime::cuda::synchronize(nullptr);
      base[dtype] = reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(a.device_data.get()));
    } else {
      a.data.reset(
          static_cast<std::byte*>(std::aligned_alloc(kArenaAlign, std::max(bytes, kArenaAlign))));
      if (!a.data) throw Error(fmt::format("Optimizer: cannot allocate {} bytes of state", bytes));
      std::memset(a.data.get(), 0, bytes);
      base[dtype] = a.data.get();
    }
    m.arenas.push_back(std::move(a));
  }
  // The global reduction totals: one row shared by every binding's kernel.
  void* global_totals = nullptr;
  if (m.reduction_passes > 0) {
    const std::size_t slots = static_cast<std::size_t>(r.num_global_reductions) + 1;
    if (on_cuda) {
      m.device_global = runtime::cuda::DeviceBuffer(slots * sizeof(double));
      runtime::cuda::memset32_async(m.device_global.get(), 0, slots * 2, nullptr);
      runtime::cuda::synchronize(nullptr);
      global_totals = reinterpret_cast<void*>(static_cast<std::uintptr_t>(m.device_global.get()));
    } else {
      m.host_global.assign(slots, 0.0);
      global_totals = m.host_global.data();
    }
  }
  codegen::Strategy strategy = codegen::Strategy::Auto;
  if (options.reduction_strategy == ReductionStrategy::Recompute)
    strategy = codegen::Strategy::Recompute;
  if (options.reduction_strategy == ReductionStrategy::Store) strategy = codegen::Strategy::Store;
  std::vector<runtime::BindingTensors> tensors(m.bindings.size());
  m.binding_params.assign(m.bindings.size(), {});
  for (std::size_t b = 0; b < m.bindings.size(); ++b) {
    tensors[b].dtypes = m.bindings[b];
    tensors[b].global_totals = global_totals;
    tensors[b].strategy = strategy;
  }
  for (std::size_t p = 0; p < m.params.size(); ++p) {
    ParamSlot& s = m.params[p];
    s.states.assign(m.state_names.size(), nullptr);
    if (s.binding < 0) continue;
    for (std::size_t k = 0; k < m.state_names.size(); ++k) {
      s.states[k] = base[options.state_dtype] + offsets[p][k];
    }
    if (m.bindings[s.binding].master) s.master = base[DType::F32] + offsets[p].back();
    runtime::BindingTensors& t = tensors[s.binding];
    std::vector<void*> ptrs = {s.param.data, s.grad.data};
    ptrs.insert(ptrs.end(), s.states.begin(), s.states.end());
    if (s.master) ptrs.push_back(s.master);
    t.ptrs.push_back(std::move(ptrs));
    t.numel.push_back(s.param.numel);
    t.group.push_back(s.group);
    m.binding_params[static_cast<std::size_t>(s.binding)].push_back(static_cast<int>(p));
  }

  const std::vector<std::vector<float>> hypers = m.float_hypers();
  for (std::size_t b = 0; b < m.bindings.size(); ++b) {
    m.backends.push_back(on_cuda ? runtime::make_cuda_backend(rule.impl(), tensors[b], hypers,
                                                              m.device.index, options.capturable)
                                 : runtime::make_host_backend(rule.impl(), tensors[b], hypers));
  }
  for (auto& backend : m.backends) backend->init_states();

  // What fusing bought: the launches a per-tensor loop would make against ours.
  std::int64_t elements = 0, nonempty = 0, launches = 0;
  for (const ParamSlot& s : m.params) {
    elements += s.param.numel;
    nonempty += s.param.numel > 0 ? 1 : 0;
  }
  for (const auto& backend : m.backends) launches += backend->launches_per_step();
  m.fusion_report =
      fmt::format("{} over {} tensor{} ({}): {} launch{} per step instead of {}", rule.name(),
                  m.params.size(), m.params.size() == 1 ? "" : "s", format_elements(elements),
                  launches, launches == 1 ? "" : "es", nonempty);
  if (m.bindings.size() > 1) {
    std::string list;
    for (const DTypeBinding& b : m.bindings) list += (list.empty() ? "" : ", ") + b.str();
    m.fusion_report += fmt::format(" (one per dtype binding: {})", list);
  }
  if (m.reduction_passes > 0) {
    m.fusion_report += fmt::format(" ({} reduction pass{} + update{})", m.reduction_passes,
                                   m.reduction_passes == 1 ? "" : "es",
                                   m.bindings.size() > 1 ? " per binding" : "");
    m.schedule_report = schedule_report(r, m.backends, m.bindings);
  }
  runtime::log(runtime::LogLevel::Info, m.fusion_report);
  if (!m.schedule_report.empty()) runtime::log(runtime::LogLevel::Info, m.schedule_report);
  if (runtime::log_enabled(runtime::LogLevel::Debug)) {
    for (std::size_t b = 0; b < m.backends.size(); ++b) {
      runtime::log(
          runtime::LogLevel::Debug,
          fmt::format("kernel {} ({}): {} tensors, {} from {} in {:.3f} s", m.bindings[b].str(),
                      rule.name(), tensors[b].numel.size(), m.backends[b]->key(),
                      m.backends[b]->origin(), m.backends[b]->seconds()));
    }
  }
}

}  // namespace fusedopt
