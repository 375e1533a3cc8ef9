// Stochastic rounding under ZeRO: a ShardedOptimizer's pieces draw the random numbers of the
// elements of their whole params, so bf16 params round exactly as plain data parallel's do,
// at any number of ranks (this suite runs at 1 to 4); so do stochastically rounded codes of
// quantized states.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/comm_world.hpp"
#include "fusedopt/comm.hpp"
#include "fusedopt/optimizer.hpp"
#include "fusedopt/sharded.hpp"

using fusedopt::DType;
using fusedopt::FlatArena;
using fusedopt::Optimizer;
using fusedopt::OptimizerOptions;
using fusedopt::ParamGroup;
using fusedopt::Rule;
using fusedopt::comm::BucketOptions;
using fusedopt::comm::Communicator;
using fusedopt::comm::GradBucketer;
using fusedopt::comm::ShardedOptimizer;
using fusedopt::comm::ShardOptions;

namespace fusedopt::testing {
namespace {

// Pieces cut inside params at 2 to 4 ranks (the shards of 9,478 elements).
const std::vector<std::int64_t> kSizes = {1009, 0, 17, 8191, 3, 257, 1};

std::uint16_t bf16_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<std::uint16_t>(u >> 16);
}

FlatArena bf16_arena(std::uint32_t seed) {
  FlatArena a;
  for (std::size_t i = 0; i < kSizes.size(); ++i)
    a.add("w" + std::to_string(i), kSizes[i], DType::BF16);
  a.finalize();
  std::mt19937 init(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::size_t i = 0; i < a.size(); ++i) {
    auto* p = static_cast<std::uint16_t*>(a.param(i).data);
    for (std::int64_t k = 0; k < kSizes[i]; ++k) p[k] = bf16_of(normal(init));
  }
  return a;
}

void fill_bf16_grads(FlatArena& a, std::uint32_t seed, int rank, int step) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    auto* g = static_cast<std::uint16_t*>(a.grad(i).data);
    for (std::int64_t k = 0; k < kSizes[i]; ++k) g[k] = bf16_of(grad_value(seed, rank, step, i, k));
  }
}

/// The bits of every param of `a` (T: a type of the params' size), in order.
template <typename T>
std::vector<T> bits_of(FlatArena& a) {
  std::vector<T> out;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto* p = static_cast<const T*>(a.param(i).data);
    out.insert(out.end(), p, p + kSizes[i]);
  }
  return out;
}

/// An fp32 arena of kSizes, filled from `seed`.
FlatArena f32_arena(std::uint32_t seed) {
  FlatArena a = make_arena(kSizes);
  std::mt19937 init(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::size_t i = 0; i < a.size(); ++i) {
    float* p = data(a.param(i));
    for (std::int64_t k = 0; k < kSizes[i]; ++k) p[k] = normal(init);
  }
  return a;
}

/// Five steps of a ShardedOptimizer (ZeRO `stage`) over `sharded_arena` and of plain data
/// parallel (an Optimizer over `dp_arena`, its grads all-reduced by a GradBucketer), each
/// after fill(step) wrote both arenas' gradients; the same small buckets for both.
template <typename Fill>
void step_zero_and_dp(const Rule& rule, const OptimizerOptions& o, int stage,
                      FlatArena& sharded_arena, FlatArena& dp_arena, Fill fill) {
  Communicator& comm = world();
  BucketOptions buckets;
  buckets.first_bucket_bytes = 4096;
  buckets.bucket_bytes = 16384;
  ShardOptions options;
  options.stage = stage;
  options.buckets = buckets;
  options.optimizer = o;
  ShardedOptimizer sharded(comm, rule, group_of(sharded_arena), options);
  Optimizer dp(rule, group_of(dp_arena), o);
  std::vector<fusedopt::Tensor> dp_grads;
  for (std::size_t i = 0; i < dp_arena.size(); ++i) dp_grads.push_back(dp_arena.grad(i));
  GradBucketer bucketer(comm, dp_grads, buckets);
  for (int step = 0; step < 5; ++step) {
    fill(step);
    for (int i = static_cast<int>(kSizes.size()) - 1; i >= 0; --i) sharded.mark_ready(i);
    CHECK(sharded.step());
    bucketer.mark_all_ready();
    bucketer.finish();
    CHECK(dp.step_scaled(bucketer.grad_scale()));
  }
}

/// How many elements of a and b differ.
template <typename T>
std::size_t differing(const std::vector<T>& a, const std::vector<T>& b) {
  std::size_t n = 0;
  for (std::size_t k = 0; k < a.size(); ++k) n += a[k] != b[k] ? 1 : 0;
  return n;
}

}  // namespace

TEST_SUITE("comm") {
  TEST_CASE("stochastically rounded quantized states under ZeRO-2 give plain data parallel's") {
    Communicator& comm = world();
    const std::uint32_t seed = shared_seed();
    FlatArena sharded_arena = f32_arena(seed), dp_arena = f32_arena(seed);
    OptimizerOptions o;
    o.seed = seed;
    o.quant_min_numel = 200;  // 1009, 8191 and 257 elements: quantized, cut at blocks
    // adamw4bit+sr: v in q4u+sr, blocks of 128.
    step_zero_and_dp(Rule::preset("adamw4bit+sr"), o, 2, sharded_arena, dp_arena, [&](int step) {
      for (FlatArena* a : {&sharded_arena, &dp_arena}) {
        for (std::size_t i = 0; i < a->size(); ++i) {
          float* g = data(a->grad(i));
          for (std::int64_t k = 0; k < kSizes[i]; ++k)
            g[k] = grad_value(seed, comm.rank(), step, i, k);
        }
      }
    });
    // The params move with v's codes: a code drawn with another element's random word would
    // change them.
    const std::vector<std::uint32_t> a = bits_of<std::uint32_t>(sharded_arena),
                                     b = bits_of<std::uint32_t>(dp_arena);
    const std::size_t differ = differing(a, b);
    INFO(differ << " of " << a.size() << " fp32 params differ at " << comm.size() << " ranks");
    CHECK(differ == 0);
  }

  TEST_CASE("stochastic rounding under ZeRO-1 gives plain data parallel's bf16 bits") {
    Communicator& comm = world();
    const std::uint32_t seed = shared_seed();
    const Rule noisy = Rule::parse(
        "param p\ngrad g\nstate m = 0\nhyper lr = 1e-2, noise = 0.05\n"
        "d = g + noise * (rand() - 0.5)\nm = 0.9 * m + d\np = p - lr * m\n",
        "noisy.rule");
    FlatArena sharded_arena = bf16_arena(seed), dp_arena = bf16_arena(seed);
    OptimizerOptions o;
    o.stochastic_rounding = true;
    o.seed = seed;
    step_zero_and_dp(noisy, o, 1, sharded_arena, dp_arena, [&](int step) {
      fill_bf16_grads(sharded_arena, seed, comm.rank(), step);
      fill_bf16_grads(dp_arena, seed, comm.rank(), step);
    });
    // Element-wise on the same all-reduced gradients, the same random words per element:
    // the same bits, whatever the number of ranks.
    const std::vector<std::uint16_t> a = bits_of<std::uint16_t>(sharded_arena),
                                     b = bits_of<std::uint16_t>(dp_arena);
    const std::size_t differ = differing(a, b);
    INFO(differ << " of " << a.size() << " bf16 params differ at " << comm.size() << " ranks");
    CHECK(differ == 0);
  }
}

}  // namespace fusedopt::testing
