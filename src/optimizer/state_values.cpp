// Optimizer::state_values and resolve_state_storage: an element state's values read back as
// fp32 (dequantized, widened), and what storage each state of a rule gets.
#include <cstddef>
#include <vector>

#include "optimizer/optimizer_impl.hpp"
#include "optimizer/quant_states.hpp"
#include "rule_access.hpp"
#include "support/check.hpp"

namespace fusedopt {

std::vector<Quant> resolve_state_storage(const Rule& rule, const OptimizerOptions& options,
                                         std::uint64_t* stochastic) {
  return runtime::resolve_quant(options, detail::lang_rule(rule), stochastic);
}

std::optional<DTypeBinding> quantized_binding(const Rule& rule, const DTypeBinding& plain,
                                              const OptimizerOptions& options) {
  if (!plain.quant.empty() || plain.param == DType::F64) return std::nullopt;
  DTypeBinding q = plain;
  q.quant = resolve_state_storage(rule, options, &q.quant_sr);
  q.quant_block = options.quant_block;
  if (!q.quantized()) return std::nullopt;
  return q;
}

std::vector<float> Optimizer::state_values(const std::string& name, int param_index) const {
  const Impl& m = live("state_values");
  const runtime::StateSpec& spec = m.store.spec(name);
  FUSEDOPT_CHECK_USAGE(spec.kind == StateKind::Element || spec.kind == StateKind::Output,
                       "state_values('{}'): it is a {} state; state_values reads element states "
                       "and outputs (view the others with state())",
                       name, to_string(spec.kind));
  const std::size_t n = m.store.params().size();
  FUSEDOPT_CHECK_USAGE(!(param_index < 0 || static_cast<std::size_t>(param_index) >= n),
                       "state_values('{}', {}): there is no param {} (the optimizer has {})", name,
                       param_index, param_index, n);
  const auto p = static_cast<std::size_t>(param_index);
  const runtime::ParamSlot& slot = m.store.params()[p];
  const Tensor t = m.store.view(spec, p);
  if (t.numel == 0 || t.data == nullptr) return {};
  const std::size_t bytes = m.store.stored_bytes(spec, p);
  std::vector<std::byte> host(bytes);
  m.backend->synchronize();
  m.backend->copy_to_host(host.data(), t.data, bytes);
  const Quant q =
      spec.kind == StateKind::Element ? m.store.quant_of(slot, spec.index) : Quant::None;
  if (q != Quant::None) {
    return runtime::dequantize(host.data(), slot.param.numel, q,
                               m.store.bindings()[static_cast<std::size_t>(slot.binding)].block());
  }
  return runtime::widen(host.data(), t.numel, t.dtype);
}

}  // namespace fusedopt
