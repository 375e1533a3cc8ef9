// Which states are quantized, and their values read back (quant_states.hpp).
#include "optimizer/quant_states.hpp"

#include <fmt/format.h>

#include <cstring>
#include <map>

#include "abi.h"
#include "codegen/quant.hpp"
#include "fusedopt/error.hpp"
#include "support/check.hpp"
#include "support/half.hpp"

namespace fusedopt::runtime {
namespace {

/// The storage a name asks for; "q8"/"q4" take the sign from the rule's proof. A "+sr"
/// suffix (stochastic rounding of the codes) sets *sr.
Quant parse_storage(std::string text, bool nonnegative, const std::string& state, bool* sr) {
  constexpr std::string_view kSr = "+sr";
  *sr = text.size() > kSr.size() && std::string_view(text).substr(text.size() - kSr.size()) == kSr;
  if (*sr) text.resize(text.size() - kSr.size());
  FUSEDOPT_CHECK_USAGE(!(*sr && (text == "-" || text == "none")),
                       "OptimizerOptions::state_storage: state '{}': '{}+sr' rounds codes "
                       "stochastically, and '{}' keeps no codes (add +sr to q8, q4, q8s, ...)",
                       state, text, text);
  if (text == "-" || text == "none") return Quant::None;
  if (text == "q8") return nonnegative ? Quant::Q8U : Quant::Q8S;
  if (text == "q4") return nonnegative ? Quant::Q4U : Quant::Q4S;
  if (text == "q8s") return Quant::Q8S;
  if (text == "q8u") return Quant::Q8U;
  if (text == "q4s") return Quant::Q4S;
  if (text == "q4u") return Quant::Q4U;
  throw UsageError(fmt::format(
      "OptimizerOptions::state_storage: state '{}': unknown storage '{}' (expected q8, q4, "
      "q8s, q8u, q4s, q4u or -; the quantized ones with +sr for stochastic rounding)",
      state, text));
}

}  // namespace

std::vector<Quant> resolve_quant(const OptimizerOptions& options, const lang::Rule& rule,
                                 std::uint64_t* sr_out) {
  std::vector<std::string> names;
  std::vector<Quant> out;
  std::vector<bool> sr;
  for (int s : rule.states) {
    names.push_back(rule.symbols[static_cast<std::size_t>(s)].name);
    out.push_back(Quant::None);
    sr.push_back(false);
  }
  auto nonnegative = [&](std::size_t k) {
    return rule.symbols[static_cast<std::size_t>(rule.states[k])].nonnegative;
  };
  auto set = [&](std::size_t k, const std::string& text) {
    bool stochastic = false;
    out[k] = parse_storage(text, nonnegative(k), names[k], &stochastic);
    FUSEDOPT_CHECK_USAGE(!stochastic || k < 64,
                         "OptimizerOptions::state_storage: state '{}' is the rule's state {}; "
                         "stochastic rounding (+sr) takes the first 64",
                         names[k], k + 1);
    sr[k] = stochastic;
  };
  // The rule's own declarations first, then the options' "*", then the options' names.
  for (const auto& [sym, text] : rule.storage) {
    for (std::size_t k = 0; k < names.size(); ++k) {
      if (rule.states[k] == sym) set(k, text);
    }
  }
  std::map<std::string, std::string> given;
  for (const auto& [name, text] : options.state_storage) {
    FUSEDOPT_CHECK_USAGE(given.emplace(name, text).second,
                         "OptimizerOptions::state_storage: state '{}' is given twice", name);
    bool known = name == "*";
    for (const std::string& n : names) known = known || n == name;
    if (!known) {
      std::string list;
      for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
      throw UsageError(fmt::format(
          "OptimizerOptions::state_storage: rule '{}' has no state '{}' (its states: {}; "
          "\"*\" names them all)",
          rule.name, name, list.empty() ? "none" : list));
    }
  }
  for (std::size_t k = 0; k < names.size(); ++k) {
    auto it = given.find(names[k]);
    if (it == given.end()) it = given.find("*");
    if (it != given.end()) set(k, it->second);
  }
  if (sr_out != nullptr) {
    *sr_out = 0;
    for (std::size_t k = 0; k < sr.size() && k < 64; ++k) *sr_out |= sr[k] ? 1ull << k : 0ull;
  }
  check_options(options);
  return out;
}

std::vector<float> dequantize(const std::byte* piece, std::int64_t numel, Quant quant, int block) {
  const int bits = quant_bits(quant);
  const std::vector<float>& map = codegen::quant_map(quant);
  const auto* codes = reinterpret_cast<const unsigned char*>(piece);
  std::vector<float> absmax(static_cast<std::size_t>(fo_q_blocks(numel, block)));
  std::memcpy(absmax.data(), piece + fo_q_absmax_offset(numel, bits), absmax.size() * 4);
  std::vector<float> out(static_cast<std::size_t>(numel));
  for (std::int64_t i = 0; i < numel; ++i) {
    const int code = bits == 8 ? codes[i] : (codes[i >> 1] >> ((~i & 1) * 4)) & 15;
    out[static_cast<std::size_t>(i)] =
        map[static_cast<std::size_t>(code)] * absmax[static_cast<std::size_t>(i / block)];
  }
  return out;
}

std::vector<float> widen(const std::byte* data, std::int64_t numel, DType dtype) {
  std::vector<float> out(static_cast<std::size_t>(numel));
  for (std::int64_t i = 0; i < numel; ++i) {
    float v = 0;
    if (dtype == DType::F32) {
      std::memcpy(&v, data + 4 * i, 4);
    } else if (dtype == DType::F64) {
      double d = 0;
      std::memcpy(&d, data + 8 * i, 8);
      v = static_cast<float>(d);
    } else {
      std::uint16_t h = 0;
      std::memcpy(&h, data + 2 * i, 2);
      v = dtype == DType::BF16 ? support::bf16_to_float(h) : support::f16_to_float(h);
    }
    out[static_cast<std::size_t>(i)] = v;
  }
  return out;
}

}  // namespace fusedopt::runtime
