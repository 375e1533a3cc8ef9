// Block-quantized states with stochastically rounded codes ("q4u+sr": DTypeBinding::quant_sr):
// the codes against a float64 reference that draws the same random words (Philox, checked
// against its published answers in test_stochastic.cpp), the mean kept where round-to-nearest
// loses it, the same codes on any thread count, and the spelling in bindings, rules and
// options. The AVX-512 and portable encoders both run this file (runtime_quant_portable); the
// CUDA encoder is compared with the host's in tests/cuda_gpu/test_quant_cuda.cpp.
#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "codegen/quant.hpp"
#include "common/host_tensors.hpp"
#include "common/quant_reference.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/optimizer.hpp"
#include "prelude.h"

TEST_SUITE_BEGIN("runtime");

using fusedopt::DType;
using fusedopt::DTypeBinding;
using fusedopt::Optimizer;
using fusedopt::OptimizerOptions;
using fusedopt::ParamGroup;
using fusedopt::Quant;
using fusedopt::Rule;
using fusedopt::testing::absmax_of;
using fusedopt::testing::codes_of;
using fusedopt::testing::fresh_seed;
using fusedopt::testing::HostTensor;
using fusedopt::testing::use_private_cache;

namespace {

const Quant kAll[] = {Quant::Q8S, Quant::Q8U, Quant::Q4S, Quant::Q4U};

/// The random word of element e of the rule's state `state` (0-based) at `step`, as the
/// documentation states it: word e % 4 of the Philox draw of counter (e / 4, param, step)
/// under the key seed ^ (state + 1) * 0x9E3779B97F4A7C15.
std::uint32_t state_word(std::uint64_t seed, std::uint32_t step, std::uint32_t param,
                         std::int64_t e, int state) {
  const std::uint64_t key = seed ^ (static_cast<std::uint64_t>(state + 1) * 0x9E3779B97F4A7C15ull);
  const std::uint64_t group = static_cast<std::uint64_t>(e) / 4;
  const fo_rand4 r =
      fo_philox(static_cast<std::uint32_t>(group), static_cast<std::uint32_t>(group >> 32), param,
                step, static_cast<std::uint32_t>(key), static_cast<std::uint32_t>(key >> 32));
  return r.x[e % 4];
}

/// The stochastically rounded code of x (a value over its block's absmax, float64) with the
/// random word r: between the largest map value <= x and the next, up with probability
/// (x - lower) / (upper - lower); below the map's smallest value, its code.
int sr_code_f64(const std::vector<float>& map, double x, std::uint32_t r) {
  int lo = 0;
  for (int k = 1; k < static_cast<int>(map.size()); ++k) {
    if (x >= map[static_cast<std::size_t>(k)]) lo = k;
  }
  if (lo + 1 == static_cast<int>(map.size())) return lo;
  const double lower = map[static_cast<std::size_t>(lo)];
  const double p = (x - lower) / (map[static_cast<std::size_t>(lo) + 1] - lower);
  return std::ldexp(static_cast<double>(r >> 8), -24) < p ? lo + 1 : lo;
}

const char* const kCopy = "param p\ngrad g\nstate s = 0\ns = g\n";

}  // namespace

TEST_CASE("stochastically rounded codes are the float64 reference's draws, each block's absmax") {
  use_private_cache();
  const std::uint32_t data_seed = fresh_seed();
  std::mt19937 rng(data_seed);
  const std::uint64_t seed = (static_cast<std::uint64_t>(rng()) << 32) | rng();
  for (Quant q : kAll) {
    const std::string storage = std::string(fusedopt::to_string(q)) + "+sr";
    CAPTURE(storage);
    const int block = 128;
    const std::int64_t n = 70001;  // a partial last block
    HostTensor p(n, DType::F32), g(n, DType::F32);
    const std::vector<double> values = fusedopt::testing::block_test_values(rng, n, block, q);
    for (std::int64_t i = 0; i < n; ++i) g.set(i, values[static_cast<std::size_t>(i)]);
    OptimizerOptions o;
    o.state_storage = {{"s", storage}};
    o.quant_block = block;
    o.seed = seed;
    Optimizer opt(Rule::parse(kCopy, "copy.rule"), {ParamGroup{{p.tensor("w")}, {g.tensor()}, {}}},
                  o);
    opt.step();  // step 1
    const std::vector<int> got = codes_of(opt.state("s", 0), n, q);
    const std::vector<float> absmax = absmax_of(opt.state("s.absmax", 0));
    const std::vector<float>& map = fusedopt::codegen::quant_map(q);
    std::int64_t differ = 0, up = 0, between = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const double a = absmax[static_cast<std::size_t>(i / block)];
      const double x = a != 0 ? values[static_cast<std::size_t>(i)] / a : 0.0;
      const int want = sr_code_f64(map, x, state_word(seed, 1, 0, i, 0));
      differ += got[static_cast<std::size_t>(i)] != want ? 1 : 0;
      const int floor = sr_code_f64(map, x, 0xffffffffu);  // u near 1: never up
      between += map[static_cast<std::size_t>(floor)] != x ? 1 : 0;
      up += got[static_cast<std::size_t>(i)] > floor ? 1 : 0;
    }
    for (std::size_t b = 0; b < absmax.size(); ++b) {
      double ref = 0;
      for (std::int64_t i = static_cast<std::int64_t>(b) * block;
           i < std::min<std::int64_t>(n, static_cast<std::int64_t>(b + 1) * block); ++i)
        ref = std::max(ref, std::abs(values[static_cast<std::size_t>(i)]));
      CHECK(absmax[b] == ref);
    }
    MESSAGE(storage, ": ", differ, " codes of ", n, " differ from the float64 draw; ", up, " of ",
            between, " values between two codes rounded up");
    // fp32 rounding of y = v / absmax and of the fraction moves a draw only where the random
    // fraction lies within an ulp of it.
    CHECK(differ <= n / 1000);
    CHECK(up > between / 4);  // drawn, not truncated (about half go up)
    CHECK(up < between * 3 / 4);
  }
}

TEST_CASE("stochastically rounded codes keep the mean where nearest codes lose it") {
  use_private_cache();
  // Every block: one element at 1 (its absmax), the others 0.3 of the way from a code to the
  // next; the nearest code is always the lower one (mean error -0.3 of a code's spacing).
  const std::int64_t n = 1 << 20;
  for (Quant q : kAll) {
    const std::string storage = std::string(fusedopt::to_string(q)) + "+sr";
    CAPTURE(storage);
    const std::vector<float>& map = fusedopt::codegen::quant_map(q);
    const std::size_t k = map.size() * 3 / 4;
    const double spacing = map[k + 1] - map[k];
    const double x0 = map[k] + 0.3 * spacing;
    HostTensor p(n, DType::F32), g(n, DType::F32);
    for (std::int64_t i = 0; i < n; ++i) g.set(i, i % 128 == 0 ? 1.0 : x0);
    OptimizerOptions o;
    o.state_storage = {{"s", storage}};
    o.quant_block = 128;
    o.seed = fresh_seed();
    Optimizer opt(Rule::parse(kCopy, "copy.rule"), {ParamGroup{{p.tensor("w")}, {g.tensor()}, {}}},
                  o);
    opt.step();
    const std::vector<float> v = opt.state_values("s", 0);
    double sum = 0, sum2 = 0;
    std::int64_t count = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      if (i % 128 == 0) continue;
      const double e = (v[static_cast<std::size_t>(i)] - g.get(i)) / spacing;
      sum += e;
      sum2 += e * e;
      ++count;
    }
    const double mean = sum / count;
    const double se = std::sqrt((sum2 / count - mean * mean) / (count - 1));
    MESSAGE(storage, ": mean error ", mean, " of a code's spacing (standard error ", se,
            "; nearest: -0.3)");
    CHECK(std::abs(mean) <= 4 * se);
  }
}

TEST_CASE("stochastically rounded codes do not depend on the thread count") {
  use_private_cache();
  const std::int64_t n = 300001;
  const std::uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  HostTensor p0(n, DType::F32), g0(n, DType::F32);
  for (std::int64_t i = 0; i < n; ++i) {
    p0.set(i, normal(rng));
    g0.set(i, normal(rng));
  }
  std::vector<std::vector<int>> runs;
  for (int threads : {1, 2}) {
    HostTensor p(n, DType::F32), g(n, DType::F32);
    for (std::int64_t i = 0; i < n; ++i) {
      p.set(i, p0.get(i));
      g.set(i, g0.get(i));
    }
    OptimizerOptions o;
    o.seed = seed;
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    Optimizer opt(Rule::preset("adamw4bit+sr"), {ParamGroup{{p.tensor("w")}, {g.tensor()}, {}}}, o);
    for (int s = 0; s < 3; ++s) opt.step();
    omp_set_num_threads(saved);
    runs.push_back(codes_of(opt.state("v", 0), n, Quant::Q4U));
    std::vector<int> params;
    for (std::int64_t i = 0; i < n; ++i) params.push_back(static_cast<int>(p.get(i) * 1e6));
    runs.back().insert(runs.back().end(), params.begin(), params.end());
  }
  CHECK(runs[0] == runs[1]);
}

TEST_CASE("+sr storage reads back in bindings, rules and options; bad uses are clear errors") {
  const DTypeBinding b = DTypeBinding::parse("fp32:fp32:fp32+q=q4s/q4u+sr@128");
  CHECK(b.quant == std::vector<Quant>{Quant::Q4S, Quant::Q4U});
  CHECK(b.quant_sr == 2u);
  CHECK(b.str() == "fp32:fp32:fp32+q=q4s/q4u+sr@128");
  CHECK_FALSE(b == DTypeBinding::parse("fp32:fp32:fp32+q=q4s/q4u@128"));
  CHECK_THROWS_WITH_AS(DTypeBinding::parse("fp32+q=-+sr/q8s"), doctest::Contains("'-+sr'"),
                       fusedopt::UsageError);
  // A rule's own declaration and the options' spelling.
  std::uint64_t sr = 0;
  const Rule r = Rule::parse(
      "param p\ngrad g\nstate m = 0, v = 0\nstorage m = q8, v = q4+sr\n"
      "m = g\nv = g * g\np = p - m / (sqrt(v) + 1)\n",
      "r.rule");
  std::vector<Quant> q = fusedopt::resolve_state_storage(r, OptimizerOptions{}, &sr);
  CHECK(q == std::vector<Quant>{Quant::Q8S, Quant::Q4U});
  CHECK(sr == 2u);
  OptimizerOptions o;
  o.state_storage = {{"*", "q8+sr"}};
  q = fusedopt::resolve_state_storage(r, o, &sr);
  CHECK(q == std::vector<Quant>{Quant::Q8S, Quant::Q8U});
  CHECK(sr == 3u);
  o.state_storage = {{"m", "-+sr"}};
  CHECK_THROWS_WITH_AS(fusedopt::resolve_state_storage(r, o), doctest::Contains("keeps no codes"),
                       fusedopt::UsageError);
  CHECK_THROWS_WITH_AS(
      Rule::parse("param p\ngrad g\nstate m = 0\nstorage m = q8+rs\nm = g\n", "bad.rule"),
      doctest::Contains("bad.rule:4:16: error: expected 'sr' after 'q8+'"), fusedopt::Error);
}

TEST_SUITE_END();
