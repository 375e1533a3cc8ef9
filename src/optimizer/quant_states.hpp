// Block-quantized states in the runtime (OptimizerOptions::state_storage): which states are
// quantized and how, and their values read back on the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fusedopt/dtype.hpp"
#include "fusedopt/optimizer.hpp"
#include "lang/ast.hpp"

namespace fusedopt::runtime {

/// Each of the rule's states' storage: the rule's own `storage` declarations, overridden by
/// `options.state_storage` ("*" for every state not named); *sr (when given) gets bit k for
/// each state k whose storage asks for stochastic rounding ("q4u+sr"). Throws UsageError
/// naming an unknown state or storage.
std::vector<Quant> resolve_quant(const OptimizerOptions& options, const lang::Rule& rule,
                                 std::uint64_t* sr = nullptr);

/// The values of a quantized state of `numel` elements from its piece (codes, then absmax:
/// abi.h's layout), as fp32.
std::vector<float> dequantize(const std::byte* piece, std::int64_t numel, Quant quant, int block);

/// The values of `numel` elements of `dtype` (F32, F16 or BF16) as fp32.
std::vector<float> widen(const std::byte* data, std::int64_t numel, DType dtype);

}  // namespace fusedopt::runtime
