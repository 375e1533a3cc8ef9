// Block-quantized states in generated code (DTypeBinding::quant): the maps and the part of a
// body that templates/kernels/quant.h and the skeletons read.
#pragma once

#include <cstdint>
#include <vector>

#include "codegen/writer.hpp"
#include "fusedopt/dtype.hpp"

namespace fusedopt::codegen {

/// The quantization map of `q` (not Quant::None): its 256 (8-bit) or 16 (4-bit) values in
/// increasing order, as fp32, the same table the kernels and the runtime's views use.
const std::vector<float>& quant_map(Quant q);

/// Buckets of the host's encoder per sign: exponents 104 to 127 (|v / absmax| from 2^-23 to
/// below 2), 128 buckets each (the top 7 mantissa bits).
inline constexpr int kQuantBuckets = 24 * 128;

/// The host kernels' encoder of map `q` (templates/kernels/host_quant.hpp, fo_q_encode_block):
/// the same codes as the kernels' search (the count of fp32 midpoints below y, a tie to the
/// even code, then q8s's sign fix) from one table word per bucket of y = v / absmax: its sign
/// and |y|'s exponent and top 7 mantissa bits ([0, kQuantBuckets): y >= 0; then y < 0; |y|
/// below the lowest bucket clamps to it). Within a bucket y's key (the low 16 bits of its
/// bits, XOR 0xffff when y < 0) rises with y: the code is bits 0-7 of the word, plus one when
/// the key is at least bits 8-24 (0x10000: never). The sign fix and the tiny code are in the
/// words, so the kernel's loop is a gather, a compare and an add per value.
struct QuantEncoder {
  std::vector<std::uint32_t> table;
  int tiny = 0;  ///< the code of |y| below 2^-23 (no midpoint lies there)
  int zero = 0;  ///< the index of the map's 0 (bitsandbytes' sign fix)
};
/// Built once per map (6144 words), then shared.
const QuantEncoder& quant_encoder(Quant q);

/// Checks `dtypes.quant` against a rule of `num_states` states (one entry per state or none,
/// a block from 32 to 512); throws UsageError saying what is wrong.
void check_quant(const DTypeBinding& dtypes, int num_states);

/// For a binding with quantized states (nothing otherwise): FO_NUM_QUANT, FO_QUANT_BLOCK,
/// FO_QUANT_LIST, the maps it uses and fo_offset over `num_roles` roles, the rule's states
/// being roles `first_state_role` on.
void emit_quant(Writer& w, const DTypeBinding& dtypes, int first_state_role, int num_roles);

}  // namespace fusedopt::codegen
