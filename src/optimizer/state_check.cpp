// The check of a state before it is loaded (fusedopt/state_check.hpp): every entry point
// that takes a state from outside hands it here.
#include "fusedopt/state_check.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string_view>
#include <vector>

#include "abi.h"
#include "codegen/quant.hpp"
#include "fusedopt/error.hpp"

namespace fusedopt {
namespace {

/// The storage a record names ("+sr" codes are their kind's), or nullopt.
std::optional<Quant> recorded_quant(std::string_view text) {
  constexpr std::string_view kSr = "+sr";
  if (text.size() > kSr.size() && text.substr(text.size() - kSr.size()) == kSr) {
    text.remove_suffix(kSr.size());
  }
  for (Quant q : {Quant::None, Quant::Q8S, Quant::Q8U, Quant::Q4S, Quant::Q4U}) {
    if (text == to_string(q)) return q;
  }
  return std::nullopt;
}

std::string describe(Quant q, std::int64_t block) {
  if (q == Quant::None) return "values (unquantized)";
  return fmt::format("{} codes (blocks of {})", to_string(q), block);
}

/// The codes the kernels store for a value of 0 in a block of absmax 0: the code nearest 0
/// and, for q8s (bitsandbytes' sign fix), the one below it, which a -0 takes.
std::vector<int> zero_codes(Quant q) {
  const std::vector<float>& map = codegen::quant_map(q);
  std::size_t zero = 0;
  for (std::size_t j = 1; j < map.size(); ++j) {
    if (std::fabs(map[j]) < std::fabs(map[zero])) zero = j;
  }
  std::vector<int> out = {static_cast<int>(zero)};
  if (q == Quant::Q8S && zero > 0) out.push_back(static_cast<int>(zero) - 1);
  return out;
}

/// The absmax values: finite and >= 0, and a block of absmax 0 holds only zero codes.
void check_blocks(const std::string& who, const KeptState& kept, const unsigned char* codes,
                  const float* absmax) {
  const int bits = quant_bits(kept.storage);
  const std::vector<int> zeros = zero_codes(kept.storage);
  const std::int64_t blocks = fo_q_blocks(kept.numel, kept.block);
  for (std::int64_t b = 0; b < blocks; ++b) {
    float a = 0;
    std::memcpy(&a, absmax + b, sizeof a);
    if (!(a >= 0.0f) || std::isinf(a)) {
      throw UsageError(fmt::format(
          "{}: the absmax of block {} (elements {} to {}) is {}; an absmax is its block's "
          "largest |value|, finite and >= 0 (a state that is not finite cannot be stored)",
          who, b, b * kept.block, std::min(kept.numel, (b + 1) * kept.block) - 1, a));
    }
    if (a != 0.0f) continue;
    for (std::int64_t i = b * kept.block; i < std::min(kept.numel, (b + 1) * kept.block); ++i) {
      // 4-bit: element 2j in the high nibble of byte j (the kernels' fo_q_code).
      const int code = bits == 8 ? codes[i] : (codes[i >> 1] >> ((~i & 1) * 4)) & 15;
      bool ok = false;
      for (int z : zeros) ok = ok || code == z;
      if (!ok) {
        throw UsageError(fmt::format(
            "{}: block {} has absmax 0 (all its values 0) but element {} has code {}; an "
            "all-zero {} block holds code {}{} (the codes or the absmax were changed)",
            who, b, i, code, to_string(kept.storage), zeros[0],
            zeros.size() > 1 ? fmt::format(" or {}", zeros[1]) : std::string()));
      }
    }
  }
}

}  // namespace

void check_loaded_state(const std::string& who, const KeptState& kept, const LoadedState& loaded) {
  Quant saved = kept.storage;
  if (!loaded.storage.empty()) {
    const std::optional<Quant> q = recorded_quant(loaded.storage);
    if (!q) {
      throw UsageError(fmt::format(
          "{}: its recorded storage '{}' is none fusedopt writes (-, q8s, q8u, q4s, q4u)", who,
          loaded.storage));
    }
    saved = *q;
  }
  const std::int64_t block = loaded.block != 0 || saved == Quant::None ? loaded.block : kept.block;
  const bool same_block = saved == Quant::None || block == kept.block;
  if (saved != kept.storage || !same_block) {
    throw UsageError(
        fmt::format("{}: it was saved as {}, this optimizer keeps it as {}{}", who,
                    describe(saved, block), describe(kept.storage, kept.block),
                    kept.storage == Quant::None || saved == Quant::None
                        ? " (which states are quantized: state_storage, and params of at least "
                          "quant_min_numel elements)"
                    : saved != kept.storage ? " (codes of another map are other values)"
                                            : ""));
  }
  if (kept.storage == Quant::None) return;
  const int bits = quant_bits(kept.storage);
  const std::int64_t code_bytes = fo_q_code_bytes(kept.numel, bits);
  const std::int64_t blocks = fo_q_blocks(kept.numel, kept.block);
  if (loaded.codes_dtype != "U8" || loaded.codes_numel != code_bytes) {
    throw UsageError(fmt::format(
        "{}: its codes are {} {}; {} codes of {} elements are {} U8 (one byte per {})", who,
        loaded.codes_numel, loaded.codes_dtype, to_string(kept.storage), kept.numel, code_bytes,
        bits == 8 ? "code, 0 to 255" : "two codes, 0 to 15 each"));
  }
  if (loaded.absmax_dtype != "F32" || loaded.absmax_numel != blocks) {
    throw UsageError(fmt::format(
        "{}: its absmax is {} {}; {} elements in blocks of {} keep {} F32 (one per block)", who,
        loaded.absmax_numel, loaded.absmax_dtype, kept.numel, kept.block, blocks));
  }
  if (kept.numel == 0) return;
  check_blocks(who, kept, static_cast<const unsigned char*>(loaded.codes),
               static_cast<const float*>(loaded.absmax));
}

}  // namespace fusedopt
