// The state store's views (state_store.hpp): each (param, state) pair as a Tensor over the
// store's memory, its storage, and the list of what a checkpoint holds.
#include <fmt/format.h>

#include "abi.h"
#include "fusedopt/checkpoint_format.hpp"
#include "fusedopt/error.hpp"
#include "optimizer/state_store.hpp"

namespace fusedopt::runtime {

const StateSpec& StateStore::spec(const std::string& name) const {
  for (const StateSpec& spec : specs_) {
    if (spec.name == name) return spec;
  }
  std::string known;
  for (const StateSpec& spec : specs_) known += (known.empty() ? "" : ", ") + spec.name;
  throw UsageError(fmt::format("rule '{}' has no state '{}' (it has: {})", rule_name_, name,
                               known.empty() ? "none" : known));
}

Quant StateStore::quant_of(const ParamSlot& slot, std::size_t k) const {
  if (slot.binding < 0) return Quant::None;
  const DTypeBinding& b = bindings_[static_cast<std::size_t>(slot.binding)];
  return k < b.quant.size() ? b.quant[k] : Quant::None;
}

KeptState StateStore::kept_state(std::size_t p, std::size_t k) const {
  const ParamSlot& slot = params_[p];
  KeptState kept;
  kept.storage = quant_of(slot, k);
  kept.numel = slot.param.numel;
  if (kept.storage != Quant::None) {
    kept.block = bindings_[static_cast<std::size_t>(slot.binding)].block();
  }
  return kept;
}

DType StateStore::element_dtype(const ParamSlot& slot) const {
  return slot.param.dtype == DType::F64 ? DType::F64 : options_.state_dtype;
}

Tensor StateStore::view(const StateSpec& spec, std::size_t p) const {
  using K = StateSpec::Kind;
  const ParamSlot& slot = params_[p];
  Tensor t;
  t.device = slot.param.device;
  t.dtype = spec.dtype;
  t.name = fusedopt::checkpoint::tensor_name(slot.name, spec.name);
  const auto k = static_cast<std::int64_t>(spec.index);
  switch (spec.kind) {
    case K::Element:
      t.data = slot.states[spec.index];
      t.numel = slot.param.numel;
      t.dtype = element_dtype(slot);
      if (const Quant q = quant_of(slot, spec.index); q != Quant::None) {
        t.dtype = DType::U8;  // the codes
        t.numel = fo_q_code_bytes(slot.param.numel, quant_bits(q));
      }
      break;
    case K::Absmax:
      if (const Quant q = quant_of(slot, spec.index); q != Quant::None) {
        const int block = bindings_[static_cast<std::size_t>(slot.binding)].block();
        t.data = static_cast<std::byte*>(slot.states[spec.index]) +
                 fo_q_absmax_offset(slot.param.numel, quant_bits(q));
        t.numel = fo_q_blocks(slot.param.numel, block);
      }  // else: the state is kept unquantized for this param: no absmax
      break;
    case K::Output:
      t.data = slot.states[num_states_ + spec.index];
      t.numel = slot.param.numel;
      t.dtype = element_dtype(slot);
      break;
    case K::Scalar:
      t.data = slot.scalars + k;  // one double per tensor, empty tensors included
      t.numel = 1;
      break;
    case K::Row:  // one float per row (column) of the param's matrices
      t.data = slot.rows.of_state(k);
      t.numel = slot.rows.count;
      break;
    case K::Col:
      t.data = slot.cols.of_state(k);
      t.numel = slot.cols.count;
      break;
    case K::Master:
      t.data = slot.master;
      // An fp32 param (or an empty one) has no master.
      t.numel = slot.master != nullptr ? slot.param.numel : 0;
      break;
  }
  return t;
}

std::size_t StateStore::stored_bytes(const StateSpec& spec, std::size_t p) const {
  const ParamSlot& slot = params_[p];
  const Quant q = spec.kind == StateKind::Element ? quant_of(slot, spec.index) : Quant::None;
  if (q != Quant::None) {
    return static_cast<std::size_t>(
        fo_q_bytes(slot.param.numel, quant_bits(q),
                   bindings_[static_cast<std::size_t>(slot.binding)].block()));
  }
  const Tensor t = view(spec, p);
  return static_cast<std::size_t>(t.numel) * dtype_size(t.dtype);
}

std::vector<CheckpointTensor> StateStore::checkpoint_tensors() const {
  // Not the per-step outputs. A master is expected for every 16-bit param when
  // master_weights is set, empty ones included, so the set does not depend on sizes.
  std::vector<CheckpointTensor> out;
  for (std::size_t p = 0; p < params_.size(); ++p) {
    for (const StateSpec& spec : specs_) {
      if (!spec.saved()) continue;
      // A master for every 16-bit param (empty ones too), none for an fp32 one.
      if (spec.kind == StateSpec::Kind::Master && params_[p].param.dtype == DType::F32) continue;
      // An absmax only where the state is quantized (not below quant_min_numel).
      if (spec.kind == StateSpec::Kind::Absmax && quant_of(params_[p], spec.index) == Quant::None) {
        continue;
      }
      const Tensor t = view(spec, p);
      out.push_back({t.name, t.dtype, t.numel, t.data});
    }
  }
  return out;
}

std::pair<std::string, std::string> StateStore::storage_text() const {
  // What the options ask for (every piece of a ShardedOptimizer writes the same), whichever
  // params are big enough.
  DTypeBinding b;
  b.quant = quant_;
  b.quant_block = options_.quant_block;
  if (!b.quantized()) return {};
  std::string storage;
  for (std::size_t k = 0; k < quant_.size(); ++k)
    storage += fmt::format("{}{}={}", k ? "," : "", state_names_[k], to_string(quant_[k]));
  return {storage, std::to_string(b.block())};
}

}  // namespace fusedopt::runtime
