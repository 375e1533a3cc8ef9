// The optimizer's params: each param and grad given in the groups, validated (errors name the
// tensor), with what the optimizer keeps for it; and the role pointers its binding's kernel
// reads them by.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fusedopt/optimizer.hpp"

namespace fusedopt::runtime {

/// One param's rows (or columns) of a row (column) state: state k's are at
/// base + k * stride + first, `count` of them (factored rules).
struct RcSlice {
  float* base = nullptr;
  std::int64_t stride = 0, first = 0, count = 0;
  float* of_state(std::int64_t k) const { return base + k * stride + first; }
};

/// One parameter and what the optimizer keeps for it.
struct ParamSlot {
  std::string name;
  int group = 0;
  int index_in_group = 0;
  Tensor param;
  Tensor grad;
  std::vector<void*> states;  ///< rule states, then outputs (null when empty)
  void* master = nullptr;     ///< fp32 master copy, or null
  double* scalars = nullptr;  ///< its scalar states (backend memory), or null: none
  RcSlice rows, cols;         ///< its row and column states (factored rules)
  int binding = -1;           ///< its dtype binding; -1 for an empty tensor of a rule without
                              ///< scalar states (one with them binds every tensor)
};

/// "group G, param I ('NAME')": how errors name a tensor.
std::string describe(const ParamSlot& slot);

/// Every param of `groups`, in order, each checked on its own (dtypes, sizes, shapes, a
/// dim-0 piece's whole, a name a checkpoint can carry) and against the others (unique names
/// and memory, one device, no shared bytes). Throws UsageError naming the tensor.
std::vector<ParamSlot> take_params(std::vector<ParamGroup>& groups);

/// Refuses params and grads that share any byte (the fused kernel would race on them).
void check_no_overlap(const std::vector<ParamSlot>& params);

/// The role pointers of the params `members` (indices into `params`), in kernel role
/// order: param, grad, states, outputs, then the master copy when `master`.
std::vector<std::vector<void*>> role_pointers(const std::vector<ParamSlot>& params,
                                              const std::vector<int>& members, bool master);

}  // namespace fusedopt::runtime
