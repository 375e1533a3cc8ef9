// Block quantization in float64 for the tests: the nearest code of a value among a map's
// fp32 values (bitsandbytes' rule: ties to the even code, the sign fix of q8s), a block's
// codes and absmax, and the codes and absmax an optimizer's state views hold.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "codegen/quant.hpp"
#include "fusedopt/dtype.hpp"
#include "fusedopt/optimizer.hpp"

namespace fusedopt::testing {

/// The nearest code of x (float64) among the fp32 map's values; a tie goes to the even
/// code; with `fix`, a value whose sign bit is set (`negative`) on the code of 0 takes the one
/// below.
inline int nearest_f64(const std::vector<float>& map, double x, bool fix, bool negative) {
  int best = 0;
  for (int k = 1; k < static_cast<int>(map.size()); ++k) {
    const double d = std::abs(x - map[static_cast<std::size_t>(k)]);
    const double e = std::abs(x - map[static_cast<std::size_t>(best)]);
    if (d < e || (d == e && k % 2 == 0)) best = k;
  }
  if (fix && negative && map[static_cast<std::size_t>(best)] >= 0 && best > 0) best -= 1;
  return best;
}

/// The code the kernels define for fp32 value v in a block of fp32 absmax a: y = v / a in
/// fp32 (0 when a is 0), the count of the map's fp32 midpoints (map[k] + map[k + 1]) * 0.5f
/// below y, y on a midpoint taking the even of its two codes, NaN code 0; then q8s's sign fix.
/// A linear scan, apart from the kernels' encoder table and halving search: the host's loops
/// (portable and AVX-512) must give these bits.
inline int nearest_f32(const std::vector<float>& map, float v, float a, bool fix) {
  const float y = a != 0.0f ? v / a : 0.0f;
  int code = 0;
  for (std::size_t k = 0; k + 1 < map.size(); ++k) {
    const float mid = (map[k] + map[k + 1]) * 0.5f;
    if (y > mid || (y == mid && (k + 1) % 2 == 0)) code = static_cast<int>(k) + 1;
  }
  if (fix && std::signbit(v) && map[static_cast<std::size_t>(code)] >= 0 && code > 0) code -= 1;
  return code;
}

/// n values for a state of storage q in blocks of `block`, each as fp32 holds it: blocks of
/// very different scales, some all zero, some with one sign only (every block for an unsigned
/// map), and some of tiny values beside one large one (on the code of 0, where q8s's sign fix
/// acts).
inline std::vector<double> block_test_values(std::mt19937& rng, std::int64_t n, int block,
                                             fusedopt::Quant q) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> values(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t b = i / block;
    double x = normal(rng) * std::pow(10.0, static_cast<double>(b % 7) - 3);
    if (b % 11 == 3) x = 0;
    if (b % 13 == 5 || q == fusedopt::Quant::Q8U || q == fusedopt::Quant::Q4U) x = std::abs(x);
    if (b % 17 == 9) x = i % block == 0 ? 1.0 : -1e-9 * std::abs(x);
    values[static_cast<std::size_t>(i)] = static_cast<float>(x);
  }
  return values;
}

/// Codes (one per element, unpacked) and absmax of `values` quantized in float64.
struct RefQuant {
  std::vector<int> codes;
  std::vector<double> absmax;
};
inline RefQuant quantize_f64(const std::vector<double>& values, fusedopt::Quant q, int block) {
  const std::vector<float>& map = fusedopt::codegen::quant_map(q);
  RefQuant r;
  for (std::size_t b = 0; b < values.size(); b += static_cast<std::size_t>(block)) {
    const std::size_t end = std::min(values.size(), b + static_cast<std::size_t>(block));
    double a = 0;
    for (std::size_t j = b; j < end; ++j) a = std::max(a, std::abs(values[j]));
    r.absmax.push_back(a);
    for (std::size_t j = b; j < end; ++j) {
      r.codes.push_back(nearest_f64(map, a != 0 ? values[j] / a : 0.0, q == fusedopt::Quant::Q8S,
                                    std::signbit(values[j])));
    }
  }
  return r;
}

/// The codes of a quantized state's view (unpacked).
inline std::vector<int> codes_of(const fusedopt::Tensor& t, std::int64_t numel, fusedopt::Quant q) {
  const auto* c = static_cast<const unsigned char*>(t.data);
  std::vector<int> out;
  for (std::int64_t i = 0; i < numel; ++i) {
    out.push_back(fusedopt::quant_bits(q) == 8 ? c[i] : (c[i >> 1] >> ((~i & 1) * 4)) & 15);
  }
  return out;
}

/// The absmax of a quantized state's NAME.absmax view.
inline std::vector<float> absmax_of(const fusedopt::Tensor& t) {
  std::vector<float> out(static_cast<std::size_t>(t.numel));
  std::memcpy(out.data(), t.data, out.size() * 4);
  return out;
}

}  // namespace fusedopt::testing
