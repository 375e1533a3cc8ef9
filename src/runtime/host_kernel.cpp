// HostKernel: generate -> cache/compile -> dlopen -> run over a chunk table.
#include "runtime/host_kernel.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "abi.h"
#include "cache/kernel_cache.hpp"
#include "codegen/codegen.hpp"
#include "fusedopt/error.hpp"
#include "jit/dynlib.hpp"
#include "jit/kernel_builder.hpp"

namespace fusedopt::runtime {

namespace {
/// Elements per chunk: large enough to amortise the per-chunk work, small enough to
/// balance a few large tensors across cores.
constexpr std::int64_t kHostChunk = 1 << 15;
using EntryPoint = void (*)(const fo_launch*);
using CheckPoint = int (*)(const fo_launch*);
}  // namespace

struct HostKernel::Impl {
  std::shared_ptr<const jit::DynLib> lib;
  EntryPoint step = nullptr;
  EntryPoint init = nullptr;
  CheckPoint check = nullptr;
  int num_roles = 0;
  int num_hypers = 0;

  /// Builds the launch (validating every argument) and hands it to `call`; nothing is
  /// called when there is no element at all.
  template <typename Call>
  void launch(Call call, const std::vector<std::vector<void*>>& ptrs,
              const std::vector<std::int64_t>& numel, const std::vector<std::vector<float>>& hypers,
              float step_value, const std::vector<int>& group, float inv_grad_scale) const {
    const std::size_t n = ptrs.size();
    if (numel.size() != n) {
      throw Error(fmt::format("HostKernel: {} pointer lists but {} sizes", n, numel.size()));
    }
    if (!group.empty() && group.size() != n) {
      throw Error(fmt::format("HostKernel: {} tensors but {} group indices", n, group.size()));
    }
    if (hypers.empty()) throw Error("HostKernel: no hyper group given");
    for (std::size_t g = 0; g < hypers.size(); ++g) {
      if (static_cast<int>(hypers[g].size()) != num_hypers) {
        throw Error(fmt::format("HostKernel: group {} has {} hyper values, the rule has {}", g,
                                hypers[g].size(), num_hypers));
      }
    }
    std::vector<void*> table(n * num_roles);
    for (std::size_t t = 0; t < n; ++t) {
      if (static_cast<int>(ptrs[t].size()) != num_roles) {
        throw Error(fmt::format("HostKernel: tensor {} has {} pointers, the kernel needs {}", t,
                                ptrs[t].size(), num_roles));
      }
      if (numel[t] < 0) throw Error(fmt::format("HostKernel: tensor {} has a negative size", t));
      for (int r = 0; r < num_roles; ++r) {
        if (numel[t] > 0 && !ptrs[t][r]) {
          throw Error(fmt::format("HostKernel: tensor {} role {} is a null pointer", t, r));
        }
        table[t * num_roles + r] = ptrs[t][r];
      }
    }
    std::vector<float> flat_hypers;
    for (const auto& h : hypers) flat_hypers.insert(flat_hypers.end(), h.begin(), h.end());
    flat_hypers.push_back(0.0f);  // never an empty array
    // Chunks sorted by group so each thread recomputes uniforms rarely; empty tensors skipped.
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    auto group_of = [&](std::size_t t) { return group.empty() ? 0 : group[t]; };
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return group_of(a) < group_of(b); });
    std::vector<fo_chunk> chunks;
    for (std::size_t t : order) {
      int g = group_of(t);
      if (g < 0 || g >= static_cast<int>(hypers.size())) {
        throw Error(fmt::format("HostKernel: tensor {} is in group {}, but there are {} groups", t,
                                g, hypers.size()));
      }
      for (std::int64_t b = 0; b < numel[t]; b += kHostChunk) {
        chunks.push_back({static_cast<int>(t), g, b, std::min(numel[t], b + kHostChunk)});
      }
    }
    if (chunks.empty()) return;
    fo_launch L{};
    L.chunks = chunks.data();
    L.num_chunks = static_cast<long long>(chunks.size());
    L.ptrs = table.data();
    L.hypers = flat_hypers.data();
    L.step = step_value;
    L.inv_grad_scale = inv_grad_scale;
    call(&L);
  }
};

HostKernel::HostKernel(std::shared_ptr<const lang::Rule> rule, DTypeBinding dtypes,
                       cache::KernelCache& cache)
    : rule_(std::move(rule)), dtypes_(dtypes), impl_(std::make_unique<Impl>()) {
  codegen::KernelBody body = codegen::generate_body(*rule_, dtypes_);
  jit::BuiltKernel built = jit::build_kernel(body, dtypes_, Target::host(), cache);
  origin_ = cache::to_string(built.origin);
  impl_->lib = jit::load_host_module(built.key.hex(), *built.binary, "fusedopt-" + rule_->name);
  auto abi = reinterpret_cast<int (*)()>(impl_->lib->symbol("fusedopt_abi_version"));
  impl_->step = reinterpret_cast<EntryPoint>(impl_->lib->symbol("fusedopt_step_host"));
  impl_->init = reinterpret_cast<EntryPoint>(impl_->lib->symbol("fusedopt_init_host"));
  impl_->check = reinterpret_cast<CheckPoint>(impl_->lib->symbol("fusedopt_check_host"));
  if (!abi || !impl_->step || !impl_->init || !impl_->check) {
    throw InternalError("host kernel for '" + rule_->name + "' lacks its entry points");
  }
  if (abi() != FO_ABI_VERSION) {
    throw InternalError(fmt::format("host kernel ABI {} != runtime ABI {}", abi(), FO_ABI_VERSION));
  }
  impl_->num_roles = body.num_roles;
  impl_->num_hypers = body.num_hypers;
}

HostKernel::~HostKernel() = default;

int HostKernel::num_roles() const { return impl_->num_roles; }

void HostKernel::run(const std::vector<std::vector<void*>>& ptrs,
                     const std::vector<std::int64_t>& numel,
                     const std::vector<std::vector<float>>& hypers, float step,
                     const std::vector<int>& group, float inv_grad_scale) const {
  impl_->launch(impl_->step, ptrs, numel, hypers, step, group, inv_grad_scale);
}

void HostKernel::init_states(const std::vector<std::vector<void*>>& ptrs,
                             const std::vector<std::int64_t>& numel,
                             const std::vector<std::vector<float>>& hypers,
                             const std::vector<int>& group) const {
  impl_->launch(impl_->init, ptrs, numel, hypers, 0.0f, group, 1.0f);
}

bool HostKernel::grads_finite(const std::vector<std::vector<void*>>& ptrs,
                              const std::vector<std::int64_t>& numel,
                              const std::vector<std::vector<float>>& hypers, float inv_grad_scale,
                              const std::vector<int>& group) const {
  int finite = 1;
  impl_->launch([&](const fo_launch* L) { finite = impl_->check(L); }, ptrs, numel, hypers, 0.0f,
                group, inv_grad_scale);
  return finite != 0;
}

std::vector<float> HostKernel::default_hypers() const {
  std::vector<float> out;
  for (int h : rule_->hypers) out.push_back(static_cast<float>(rule_->symbols[h].default_value));
  return out;
}

std::vector<float> HostKernel::with_hyper(std::vector<float> hypers, const std::string& name,
                                          float value) const {
  for (std::size_t k = 0; k < rule_->hypers.size(); ++k) {
    if (rule_->symbols[rule_->hypers[k]].name == name) {
      if (hypers.size() != rule_->hypers.size()) {
        throw Error(fmt::format("with_hyper: {} values given, rule '{}' has {} hypers",
                                hypers.size(), rule_->name, rule_->hypers.size()));
      }
      hypers[k] = value;
      return hypers;
    }
  }
  std::string known;
  for (int h : rule_->hypers) known += (known.empty() ? "" : ", ") + rule_->symbols[h].name;
  throw Error(fmt::format("rule '{}' has no hyper '{}' (it has: {})", rule_->name, name, known));
}

}  // namespace fusedopt::runtime
