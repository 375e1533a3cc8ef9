// Matrix stages under ZeRO (mpiexec, 1 to 4 ranks): sharded muon (ZeRO-1 and ZeRO-2), whose
// shard boundaries cut matrices, equals the unsharded data-parallel muon on the same
// gradients over 20 steps, in two groups with their own iteration hypers, a conv-shaped
// param among them; every matrix is orthogonalized whole on one owner rank. A 1-D param is
// refused on every rank, naming it.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/comm_requirements.hpp"
#include "common/comm_world.hpp"
#include "fusedopt/comm.hpp"
#include "fusedopt/optimizer.hpp"
#include "fusedopt/sharded.hpp"

using fusedopt::DType;
using fusedopt::FlatArena;
using fusedopt::Optimizer;
using fusedopt::ParamGroup;
using fusedopt::Rule;
using fusedopt::comm::BucketOptions;
using fusedopt::comm::Communicator;
using fusedopt::comm::GradBucketer;
using fusedopt::comm::ShardedOptimizer;
using fusedopt::comm::ShardOptions;

namespace fusedopt::testing {
namespace {

// 2,088 elements: at 4 ranks a shard is 522, so every boundary falls inside a matrix.
const std::vector<std::vector<std::int64_t>> kShapes = {{24, 20},     {16, 32}, {40, 12},
                                                        {8, 3, 3, 3}, {6, 50},  {2, 2}};

std::vector<std::int64_t> sizes() {
  std::vector<std::int64_t> out;
  for (const auto& s : kShapes) {
    std::int64_t n = 1;
    for (std::int64_t d : s) n *= d;
    out.push_back(n);
  }
  return out;
}

/// Two groups: params 0-2 with lr 0.02, 3-5 with lr 0.01 and 4 rounds of other coefficients.
std::vector<ParamGroup> groups_of(FlatArena& a) {
  std::vector<ParamGroup> g(2);
  for (std::size_t i = 0; i < a.size(); ++i) {
    ParamGroup& group = g[i < 3 ? 0 : 1];
    fusedopt::Tensor p = a.param(i);
    p.shape = kShapes[i];
    group.params.push_back(p);
    group.grads.push_back(a.grad(i));
  }
  g[0].hypers = {{"lr", 0.02}};
  g[1].hypers = {{"lr", 0.01}, {"ns_steps", 4}, {"ns_a", 3.0}, {"ns_b", -3.2}, {"ns_c", 1.2}};
  return g;
}

}  // namespace

TEST_SUITE("comm") {
  TEST_CASE("sharded muon (ZeRO-1, ZeRO-2) equals the unsharded optimizer, matrices cut apart") {
    Communicator& comm = world();
    const std::uint32_t seed = shared_seed();
    for (int stage : {1, 2}) {
      CAPTURE(stage);
      FlatArena sharded_arena = make_arena(sizes());
      FlatArena dp_arena = make_arena(sizes());
      fill_params(sharded_arena, seed);
      fill_params(dp_arena, seed);
      BucketOptions buckets;
      buckets.first_bucket_bytes = 2048;
      buckets.bucket_bytes = 4096;
      ShardOptions options;
      options.stage = stage;
      options.buckets = buckets;
      ShardedOptimizer sharded(comm, Rule::preset("muon"), groups_of(sharded_arena), options);
      CHECK(sharded.local().stats().step_program.find("stage 0") != std::string::npos);
      Optimizer dp(Rule::preset("muon"), groups_of(dp_arena));
      std::vector<fusedopt::Tensor> dp_grads;
      for (std::size_t i = 0; i < dp_arena.size(); ++i) dp_grads.push_back(dp_arena.grad(i));
      GradBucketer bucketer(comm, dp_grads, buckets);
      for (int step = 0; step < 20; ++step) {
        fill_grads(sharded_arena, seed, comm.rank(), step);
        fill_grads(dp_arena, seed, comm.rank(), step);
        for (int i = static_cast<int>(kShapes.size()) - 1; i >= 0; --i) sharded.mark_ready(i);
        CHECK(sharded.step());
        bucketer.mark_all_ready();
        bucketer.finish();
        CHECK(dp.step_scaled(bucketer.grad_scale()));
      }
      const std::vector<float> a = params_of(sharded_arena), b = params_of(dp_arena);
      REQUIRE(a.size() == b.size());
      double worst = 0;
      for (std::size_t k = 0; k < a.size(); ++k) {
        worst = std::max(worst, std::fabs(double(a[k]) - b[k]) / (1 + std::fabs(b[k])));
        REQUIRE(std::fabs(a[k] - b[k]) <= 1e-5f * (1 + std::fabs(b[k])));
      }
      if (comm.rank() == 0) MESSAGE("ZeRO-" << stage << " muon: worst relative gap " << worst);
      std::vector<float> root = a;
      comm.broadcast(root.data(), static_cast<std::int64_t>(root.size()), DType::F32, 0).wait();
      CHECK(same_bytes(root.data(), a.data(), a.size() * 4));
    }
  }

  TEST_CASE("sharded muon refuses a 1-D param on every rank, naming it") {
    Communicator& comm = world();
    FlatArena arena = make_arena({64, 8});
    std::vector<ParamGroup> g(1);
    fusedopt::Tensor w = arena.param(0);
    w.shape = {8, 8};
    g[0].params = {w, arena.param(1)};
    g[0].grads = {arena.grad(0), arena.grad(1)};
    try {
      ShardedOptimizer sharded(comm, Rule::preset("muon"), g, ShardOptions{});
      FAIL("a 1-D param was accepted");
    } catch (const fusedopt::UsageError& e) {
      const std::string what = e.what();
      INFO(what);
      CHECK(what.find("param 1") != std::string::npos);
      CHECK(what.find("takes a matrix") != std::string::npos);
    }
  }
}

}  // namespace fusedopt::testing
