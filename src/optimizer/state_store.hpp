// The optimizer's state store: the table of the states it keeps per param (built from the
// rule and options), each param's dtype binding, and the memory they live in (one arena per
// dtype, the scalar, row and column states), with a view of every (param, state) pair.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "device/backend.hpp"
#include "exec/binding.hpp"
#include "fusedopt/extension.hpp"
#include "fusedopt/optimizer.hpp"
#include "fusedopt/state_check.hpp"
#include "optimizer/params.hpp"

namespace fusedopt::runtime {

/// One allocation of the backend holding every state (or master) tensor of one dtype,
/// each view 64-byte aligned.
struct Arena {
  DType dtype = DType::F32;
  std::size_t bytes = 0;
  Buffer memory;
};

/// One state the optimizer keeps per parameter: a row of the table built from the rule
/// (StateStore::specs), which state(), the state views and checkpoints iterate. A new kind
/// of state is one more StateKind (optimizer.hpp) and its case in StateStore::view.
struct StateSpec {
  using Kind = StateKind;
  Kind kind;
  std::string name;
  DType dtype;
  std::size_t index = 0;      ///< its position among the states of its kind (Absmax: its state's)
  Quant quant = Quant::None;  ///< Element, Absmax: the state's storage where quantized

  /// Whether checkpoints hold it (everything but outputs).
  bool saved() const { return kind != Kind::Output; }
};

/// One tensor of a checkpoint: its name, storage and the optimizer's memory for it.
struct CheckpointTensor {
  std::string name;
  DType dtype;
  std::int64_t numel;
  void* data;  ///< null when numel is 0
};

class StateStore {
 public:
  StateStore() = default;
  /// The states of `rule` (its clipping applied) under `options` (checked): the table of
  /// specs, each state's storage.
  StateStore(const Rule& rule, const OptimizerOptions& options);

  /// Takes the params (validated: take_params) and, per param when given, the whole param
  /// it is a piece of (OptimizerExtension::make).
  void take_params(std::vector<ParamSlot> params, std::vector<PieceOrigin> origins);
  /// Groups the params by dtype binding and lays out their states in one arena per dtype,
  /// allocated on `backend` (zeroed).
  void lay_out(Backend& backend);
  /// Each binding's tensors, for its kernel: shapes, ids, role pointers, the scalar, row
  /// and column states (laid out here, on `backend`), the shared `global_totals`.
  std::vector<BindingTensors> binding_tensors(Backend& backend, void* global_totals);

  const std::vector<ParamSlot>& params() const { return params_; }
  /// For Optimizer::rebind, which swaps param and grad pointers and checks them again.
  std::vector<ParamSlot>& mutable_params() { return params_; }
  const std::vector<DTypeBinding>& bindings() const { return bindings_; }
  /// Per binding: the index of the param of each of its tensors.
  const std::vector<std::vector<int>>& binding_params() const { return binding_params_; }
  const std::vector<StateSpec>& specs() const { return specs_; }
  /// Every rule state's storage (Quant::None: unquantized).
  const std::vector<Quant>& quant() const { return quant_; }
  Device device() const { return params_.empty() ? Device{} : params_.front().param.device; }

  /// Binding `b`'s role pointers (role_pointers).
  std::vector<std::vector<void*>> binding_ptrs(std::size_t b) const;
  /// The spec of state `name`, or throws UsageError listing the states.
  const StateSpec& spec(const std::string& name) const;
  /// State k's storage for `slot` (its binding's: small params keep theirs unquantized).
  Quant quant_of(const ParamSlot& slot, std::size_t k) const;
  /// How param `p` keeps rule state k (its storage, block and elements): what a loaded state
  /// is checked against (check_loaded_state).
  KeptState kept_state(std::size_t p, std::size_t k) const;
  /// The view of state `spec` of param `p` (its numel is 0 where the param has none: an
  /// fp32 param's master, the absmax of a state kept unquantized).
  Tensor view(const StateSpec& spec, std::size_t p) const;
  /// The bytes of a state of `p` as stored (a quantized one: its codes and absmax).
  std::size_t stored_bytes(const StateSpec& spec, std::size_t p) const;
  /// Every saved state of every param, in the specs' order: what a checkpoint holds.
  std::vector<CheckpointTensor> checkpoint_tensors() const;
  /// The checkpoint's record of the states' storage: ("m=q8s,v=q8u", "256"), or empty
  /// strings when no state is quantized.
  std::pair<std::string, std::string> storage_text() const;
  /// The bytes of memory the states take (OptimizerStats::state_bytes).
  std::size_t bytes() const;

 private:
  /// The dtype binding of param `p`: its dtypes, the options' state dtype and master, and
  /// the quantized storage when it has at least quant_min_numel elements.
  DTypeBinding binding_of(std::size_t p) const;
  /// The storage of slot's element states and outputs: float64 for a float64 param, else
  /// state_dtype (where not quantized).
  DType element_dtype(const ParamSlot& slot) const;
  void lay_out_arenas(Backend& backend);
  /// Scalar states: one row of doubles per tensor, each binding's tensors adjacent.
  void lay_out_scalars(Backend& backend, std::vector<BindingTensors>& tensors);
  /// Row and column states: per binding, state-major, fp32.
  void lay_out_rc_states(Backend& backend, std::vector<BindingTensors>& tensors);

  std::string rule_name_;
  bool factored_ = false;
  OptimizerOptions options_;
  std::vector<std::string> state_names_;   ///< rule states, then outputs
  std::size_t num_states_ = 0;             ///< how many of state_names_ are rule states
  std::vector<std::string> scalar_names_;  ///< per-tensor scalar states (`scalar`)
  std::vector<std::string> row_names_;     ///< row states (`row`)
  std::vector<std::string> col_names_;     ///< column states (`col`)
  /// Per rule state: its block-quantized storage for params of at least
  /// options.quant_min_numel elements (optimizer/quant_states.hpp).
  std::vector<Quant> quant_;
  std::uint64_t quant_sr_ = 0;  ///< bit k: state k's codes rounded stochastically ("+sr")
  /// Every state per parameter, in that order (element states, outputs, scalars, rows,
  /// columns, the master copy when master_weights, the absmax of quantized states).
  std::vector<StateSpec> specs_;
  std::vector<ParamSlot> params_;
  /// Per param (when given): the whole param it is a piece of (its index and element offset
  /// key the random numbers; its size decides quantization); empty: every param is whole.
  std::vector<PieceOrigin> origins_;
  bool pieces_ = false;  ///< whether some param is a piece of a bigger tensor
  std::vector<DTypeBinding> bindings_;
  std::vector<std::vector<int>> binding_params_;
  std::vector<Arena> arenas_;
  Buffer rc_states_;  ///< every binding's row states, then its column states (fp32)
  Buffer scalars_;    ///< [binding's first tensor + index in binding][scalar], doubles
};

}  // namespace fusedopt::runtime
