// Block-quantized states in generated code (DTypeBinding::quant): the maps and the part of a
// body that templates/kernels/quant.h and the skeletons read.
#pragma once

#include <vector>

#include "codegen/writer.hpp"
#include "fusedopt/dtype.hpp"

namespace fusedopt::codegen {

/// The quantization map of `q` (not Quant::None): its 256 (8-bit) or 16 (4-bit) values in
/// increasing order, as fp32, the same table the kernels and the runtime's views use.
const std::vector<float>& quant_map(Quant q);

/// Checks `dtypes.quant` against a rule of `num_states` states (one entry per state or none,
/// a block from 32 to 512, no row/column states); throws UsageError saying what is wrong.
void check_quant(const DTypeBinding& dtypes, int num_states, bool factored);

/// For a binding with quantized states (nothing otherwise): FO_NUM_QUANT, FO_QUANT_BLOCK,
/// FO_QUANT_LIST, the maps it uses and fo_offset over `num_roles` roles, the rule's states
/// being roles `first_state_role` on.
void emit_quant(Writer& w, const DTypeBinding& dtypes, int first_state_role, int num_roles);

}  // namespace fusedopt::codegen
