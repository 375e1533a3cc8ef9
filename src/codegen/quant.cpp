// The quantization maps and the generated part of a binding with quantized states
// (quant.hpp).
#include "codegen/quant.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "fusedopt/error.hpp"
#include "support/check.hpp"

namespace fusedopt::codegen {
namespace {

/// torch.linspace(start, end, n) in fp32: a float step, the first half counted up from
/// `start`, the second half down from `end`, each element rounded once (an fma). torch builds
/// differ in the last bit or two here (some fuse, some do not); this is the form whose
/// dynamic maps equal the table printed by a bitsandbytes install (docs/rules.md).
std::vector<float> linspace(float start, float end, int n) {
  std::vector<float> out(static_cast<std::size_t>(n));
  const float step = (end - start) / static_cast<float>(n - 1);
  const int half = n / 2;
  for (int k = 0; k < n; ++k) {
    out[static_cast<std::size_t>(k)] = k < half
                                           ? std::fma(step, static_cast<float>(k), start)
                                           : std::fma(-step, static_cast<float>(n - k - 1), end);
  }
  return out;
}

/// torchao's 4-bit map of non-negative states: linspace(0, 1, 17) without its 0.
std::vector<float> linear_map_without_zero() {
  std::vector<float> all = linspace(0.0f, 1.0f, 17);
  return std::vector<float>(all.begin() + 1, all.end());
}

/// bitsandbytes' dynamic map (create_dynamic_map(signed, max_exponent_bits, total_bits) since
/// 0.42; torchao's copy for 4 bits), its fp32 values as torch computes them: for each exponent e =
/// 10^(i - (E - 1)), the midpoints of linspace(0.1, 1, F_i) scaled by e (and negated, signed),
/// where F_i doubles with each i; then 0 and 1, zeros up to 2^total_bits entries, sorted.
std::vector<float> dynamic_map(bool is_signed, int max_exponent_bits, int total_bits) {
  std::vector<float> data;
  const int non_sign_bits = total_bits - 1;
  const int additional = (1 << (non_sign_bits - max_exponent_bits)) - 1;
  auto add = [&](int i, int items) {
    const std::vector<float> b = linspace(0.1f, 1.0f, items);
    const float scale = static_cast<float>(std::pow(10.0, i - (max_exponent_bits - 1)));
    for (std::size_t k = 0; k + 1 < b.size(); ++k) {
      const float mean = (b[k] + b[k + 1]) / 2.0f;
      data.push_back(scale * mean);
      if (is_signed) data.push_back(-scale * mean);
    }
  };
  for (int i = 0; i < max_exponent_bits; ++i) {
    const int shift = i + non_sign_bits - max_exponent_bits + (is_signed ? 0 : 1);
    add(i, (1 << shift) + 1);
  }
  if (additional > 0) add(max_exponent_bits - 1, additional + 1);
  data.push_back(0.0f);
  data.push_back(1.0f);
  const auto want = static_cast<std::size_t>(1) << total_bits;
  if (data.size() > want) throw InternalError("quant: dynamic map has too many values");
  data.resize(want, 0.0f);
  std::sort(data.begin(), data.end());
  return data;
}

/// fp32 bits.
std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

QuantEncoder build_encoder(Quant q) {
  const std::vector<float>& map = quant_map(q);
  const int n = static_cast<int>(map.size());
  // The midpoints as the kernels compute them: (map[k] + map[k + 1]) * 0.5f.
  std::vector<float> mid;
  for (int k = 0; k + 1 < n; ++k) {
    mid.push_back((map[static_cast<std::size_t>(k)] + map[static_cast<std::size_t>(k) + 1]) * 0.5f);
  }
  auto below = [&](float y) {  // midpoints below y
    return static_cast<int>(std::lower_bound(mid.begin(), mid.end(), y) - mid.begin());
  };
  QuantEncoder e;
  e.tiny = below(0.0f);
  e.zero = static_cast<int>(std::lower_bound(map.begin(), map.end(), 0.0f) - map.begin());
  const bool fix = q == Quant::Q8S;  // bitsandbytes' sign fix (quant.h: fo_q_encode)
  e.table.assign(2 * kQuantBuckets, 0);
  for (std::uint32_t neg = 0; neg < 2; ++neg) {
    for (std::uint32_t b = 0; b < static_cast<std::uint32_t>(kQuantBuckets); ++b) {
      // The bucket's magnitudes: exponent 104 + b / 128, the top 7 mantissa bits b % 128.
      const std::uint32_t low = ((104 + b / 128) << 23) | ((b % 128) << 16);
      const float lo_mag = from_bits(low), hi_mag = from_bits(low | 0xffffu);
      // Its values in increasing order: [lo_mag, hi_mag], or [-hi_mag, -lo_mag].
      const float first = neg ? -hi_mag : lo_mag, last = neg ? -lo_mag : hi_mag;
      int code = below(first);
      // Midpoints in [first, last]: at most one (the bucket is narrower than any gap).
      const auto m0 = std::lower_bound(mid.begin(), mid.end(), first);
      const auto m1 = std::upper_bound(mid.begin(), mid.end(), last);
      if (m1 - m0 > 1) throw InternalError("quant: two midpoints in one encoder bucket");
      std::uint32_t up_from = 0x10000;  // no key reaches it: no midpoint here
      if (m1 - m0 == 1) {
        // y's key (its low 16 bits, reversed for y < 0) rises with y through the bucket: y
        // passes the midpoint at key km, and a tie there takes the even code of the two.
        const std::uint32_t km = (bits_of(*m0) & 0xffffu) ^ (neg ? 0xffffu : 0u);
        const bool tie_up = (m0 - mid.begin() + 1) % 2 == 0;
        up_from = km + (tie_up ? 0 : 1);
      }
      if (fix && neg && code + (up_from < 0x10000 ? 1 : 0) == e.zero) {
        code = e.zero - 1;  // every y of the bucket ends on code zero - 1
        up_from = 0x10000;
      }
      if (b == 0 && (up_from != 0x10000 || code != (fix && neg ? e.zero - 1 : e.tiny)))
        throw InternalError("quant: the encoder's lowest bucket is not all the tiny code");
      e.table[neg * kQuantBuckets + b] = static_cast<std::uint32_t>(code) | up_from << 8;
    }
  }
  return e;
}

}  // namespace

const QuantEncoder& quant_encoder(Quant q) {
  static const QuantEncoder q8s = build_encoder(Quant::Q8S);
  static const QuantEncoder q8u = build_encoder(Quant::Q8U);
  static const QuantEncoder q4s = build_encoder(Quant::Q4S);
  static const QuantEncoder q4u = build_encoder(Quant::Q4U);
  switch (q) {
    case Quant::Q8S:
      return q8s;
    case Quant::Q8U:
      return q8u;
    case Quant::Q4S:
      return q4s;
    case Quant::Q4U:
      return q4u;
    case Quant::None:
      break;
  }
  throw InternalError("quant_encoder: not a quantized storage");
}

const std::vector<float>& quant_map(Quant q) {
  static const std::vector<float> q8s = dynamic_map(true, 7, 8);
  static const std::vector<float> q8u = dynamic_map(false, 7, 8);
  static const std::vector<float> q4s = dynamic_map(true, 3, 4);
  static const std::vector<float> q4u = linear_map_without_zero();
  switch (q) {
    case Quant::Q8S:
      return q8s;
    case Quant::Q8U:
      return q8u;
    case Quant::Q4S:
      return q4s;
    case Quant::Q4U:
      return q4u;
    case Quant::None:
      break;
  }
  throw InternalError("quant_map: not a quantized storage");
}

void check_quant(const DTypeBinding& dtypes, int num_states) {
  if (!dtypes.quantized()) return;
  FUSEDOPT_CHECK_USAGE(static_cast<int>(dtypes.quant.size()) == num_states,
                       "dtypes '{}': {} quantized storages given for a rule of {} states (one "
                       "per state, '-' for one kept in the state dtype)",
                       dtypes.str(), dtypes.quant.size(), num_states);
  for (std::size_t s = 0; s < 64; ++s) {
    FUSEDOPT_CHECK_USAGE((dtypes.quant_sr >> s & 1) == 0 ||
                             (s < dtypes.quant.size() && dtypes.quant[s] != Quant::None),
                         "dtypes '{}': state {} is rounded stochastically (quant_sr) but not "
                         "quantized",
                         dtypes.str(), s + 1);
  }
  const int b = dtypes.block();
  FUSEDOPT_CHECK_USAGE(b >= 32 && b <= 512 && (b & (b - 1)) == 0,
                       "dtypes '{}': the quantization block is {}; it must be a power of two from "
                       "32 to 512",
                       dtypes.str(), b);
}

void emit_quant(Writer& w, const DTypeBinding& dtypes, int first_state_role, int num_roles) {
  if (!dtypes.quantized()) return;
  std::string list = "#define FO_QUANT_LIST(X)";
  std::vector<Quant> used;
  int k = 0;
  for (std::size_t s = 0; s < dtypes.quant.size(); ++s) {
    const Quant q = dtypes.quant[s];
    if (q == Quant::None) continue;
    const bool sr = s < 64 && (dtypes.quant_sr >> s & 1) != 0;
    list += fmt::format(" X({}, {}, {}, fo_qmap_{}, {}, fo_qenc_{}, {}, {}, {})", k++,
                        first_state_role + static_cast<int>(s), quant_bits(q), to_string(q),
                        q == Quant::Q8S ? 1 : 0, to_string(q), quant_encoder(q).tiny,
                        quant_encoder(q).zero, sr ? static_cast<int>(s) + 1 : 0);
    if (std::find(used.begin(), used.end(), q) == used.end()) used.push_back(q);
  }
  w.line(fmt::format("#define FO_NUM_QUANT {}", k));
  unsigned long long mask = 0;  // bit r: role r is a quantized state
  for (std::size_t s = 0; s < dtypes.quant.size(); ++s) {
    if (dtypes.quant[s] != Quant::None) mask |= 1ull << (first_state_role + static_cast<int>(s));
  }
  w.line(fmt::format("#define FO_QROLE_MASK {:#x}ull", mask));
  w.line(fmt::format("#define FO_QUANT_BLOCK {}", dtypes.block()));
  w.line(list);
  w.line("#ifdef __CUDACC__");
  w.line("#define FO_QMAP_STORAGE static __device__ const");
  w.line("#else");
  w.line("#define FO_QMAP_STORAGE static const");
  w.line("#endif");
  for (Quant q : used) {
    const std::vector<float>& map = quant_map(q);
    std::string values;
    for (std::size_t j = 0; j < map.size(); ++j) {
      values += fmt::format("{}{:.8e}f", j == 0 ? "" : (j % 8 == 0 ? ",\n  " : ", "), map[j]);
    }
    w.line(fmt::format("FO_QMAP_STORAGE float fo_qmap_{}[{}] = {{\n  {}}};", to_string(q),
                       map.size(), values));
    // The encoder table (quant.hpp: QuantEncoder), for the host and CUDA alike.
    const QuantEncoder& enc = quant_encoder(q);
    std::string words;
    for (std::size_t j = 0; j < enc.table.size(); ++j) {
      words += fmt::format("{}{:#x}", j == 0 ? "" : (j % 8 == 0 ? ",\n  " : ", "), enc.table[j]);
    }
    w.line(fmt::format("FO_QMAP_STORAGE unsigned int fo_qenc_{}[{}] = {{\n  {}}};", to_string(q),
                       enc.table.size(), words));
  }
  w.line("FO_FN fo_tensor fo_offset(const fo_tensor& t, long long i) {");
  w.line("  fo_tensor s;");
  w.line("  s.e0 = t.e0 + i;");
  w.line("  s.pid = t.pid;");
  for (int r = 0; r < num_roles; ++r) w.line(fmt::format("  s.r{0} = t.r{0} + i;", r));
  w.line("  return s;");
  w.line("}");
}

}  // namespace fusedopt::codegen
