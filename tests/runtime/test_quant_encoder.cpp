// The host's quantization encoder at every decision it makes: each midpoint of each map (a tie,
// which takes the even code), the fp32 values on either side of it, the map's own values, the
// signed zeros, values below the encoder table's lowest bucket, and blocks that are all zero,
// hold a NaN or an infinity (whose element restarts at 0), and a last block of an odd count (4-bit:
// the pad nibble is 0). Every code must be the kernels' definition (nearest_f32: the linear count
// of fp32 midpoints, ties to even, q8s's sign fix).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "codegen/quant.hpp"
#include "common/host_tensors.hpp"
#include "common/quant_reference.hpp"
#include "fusedopt/optimizer.hpp"

TEST_SUITE_BEGIN("runtime");

using fusedopt::DType;
using fusedopt::Optimizer;
using fusedopt::OptimizerOptions;
using fusedopt::ParamGroup;
using fusedopt::Quant;
using fusedopt::Rule;
using fusedopt::testing::absmax_of;
using fusedopt::testing::codes_of;
using fusedopt::testing::HostTensor;
using fusedopt::testing::nearest_f32;

namespace {

/// Every value where the encoder decides something, as a fraction of the block's absmax: the
/// midpoints, one fp32 step either side of each, the map's values, both signs of each; then
/// the signed zeros and magnitudes around the table's lowest bucket (2^-23).
std::vector<float> boundary_values(const std::vector<float>& map) {
  std::vector<float> out;
  auto both = [&](float x) {
    out.push_back(x);
    out.push_back(-x);
  };
  for (std::size_t k = 0; k + 1 < map.size(); ++k) {
    const float mid = (map[k] + map[k + 1]) * 0.5f;
    both(mid);
    both(std::nextafter(mid, 2.0f));
    both(std::nextafter(mid, -2.0f));
  }
  for (float x : map) both(x);
  for (float x : {0.0f, 1e-30f, 1.1920929e-7f, 1.1920929e-7f * 1.0078125f, 2.4e-7f, 1e-6f}) both(x);
  return out;
}

}  // namespace

TEST_CASE("quantized codes at every midpoint, beside it, at signed zeros and tiny values") {
  fusedopt::testing::use_private_cache();
  const Rule copy = Rule::parse("param p\ngrad g\nstate s = 0\ns = g\n", "copy.rule");
  const std::size_t block = 256;
  for (Quant q : {Quant::Q8S, Quant::Q8U, Quant::Q4S, Quant::Q4U}) {
    const std::string storage = fusedopt::to_string(q);
    CAPTURE(storage);
    const std::vector<float>& map = fusedopt::codegen::quant_map(q);
    const std::vector<float> fractions = boundary_values(map);
    // Blocks of absmax 1 and 2^-20 (y = v / absmax is then the fraction exactly: the ties are
    // ties) and 0.3 (near ties), each block's first value its absmax; then a block of zeros
    // (-0 among them), one with a NaN and one with an infinity.
    std::vector<float> values;
    for (float scale : {1.0f, 9.5367432e-7f, 0.3f}) {
      for (std::size_t i = 0; i < fractions.size(); ++i) {
        if (values.size() % block == 0) values.push_back(scale);
        values.push_back(fractions[i] * scale);
      }
      while (values.size() % block != 0) values.push_back(0.0f);
    }
    for (std::size_t j = 0; j < block; ++j) values.push_back(j % 2 ? -0.0f : 0.0f);
    for (float special : {std::numeric_limits<float>::quiet_NaN(), INFINITY}) {
      for (std::size_t j = 0; j < block; ++j)
        values.push_back(j == 7 ? special : fractions[j % fractions.size()] * 0.5f);
    }
    // A last block of an odd count of large values (47: its last 16 values hold the pad, as
    // 15, 31, ... do): 4-bit codes' pad nibble must be 0.
    for (std::size_t j = 0; j < 47; ++j) values.push_back(j % 3 ? 0.9f : -0.7f);
    const auto n = static_cast<std::int64_t>(values.size());
    HostTensor p(n, DType::F32), g(n, DType::F32);
    for (std::int64_t i = 0; i < n; ++i) g.set(i, values[static_cast<std::size_t>(i)]);
    OptimizerOptions o;
    o.state_storage = {{"s", storage}};
    o.quant_block = static_cast<int>(block);
    o.quant_min_numel = 0;
    Optimizer opt(copy, {ParamGroup{{p.tensor("w")}, {g.tensor()}, {}}}, o);
    opt.step();
    const std::vector<int> got = codes_of(opt.state("s", 0), n, q);
    const std::vector<float> absmax = absmax_of(opt.state("s.absmax", 0));
    REQUIRE(absmax.size() == (values.size() + block - 1) / block);
    if (fusedopt::quant_bits(q) == 4) {
      const auto* bytes = static_cast<const unsigned char*>(opt.state("s", 0).data);
      CHECK((bytes[n >> 1] & 15) == 0);
    }
    // The NaN's and the infinity's elements restart (stored as 0: docs/rules.md), and their
    // blocks keep the others' absmax.
    std::vector<float> kept = values, block_max(absmax.size(), 0.0f);
    for (std::size_t at = 0; at < kept.size(); ++at) {
      if (!std::isfinite(kept[at])) kept[at] = 0.0f;
      block_max[at / block] = std::max(block_max[at / block], std::abs(kept[at]));
    }
    std::int64_t off = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const auto at = static_cast<std::size_t>(i);
      const float a = absmax[at / block];
      const int want = nearest_f32(map, kept[at], a, q == Quant::Q8S);
      if (got[at] != want && off++ < 5) {
        MESSAGE("element ", i, ": ", values[at], " in a block of absmax ", a, ": code ", got[at],
                ", the search's ", want);
      }
    }
    CHECK(off == 0);
    CHECK(absmax[0] == 1.0f);
    CHECK(absmax == block_max);
  }
}

TEST_SUITE_END();
