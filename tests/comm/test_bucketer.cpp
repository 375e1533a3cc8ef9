// GradBucketer and data-parallel steps under mpiexec (1 to 4 ranks): buckets start in
// bucket order whatever order a rank's gradients become ready in, the buffers hold the sum
// over ranks, and 20 data-parallel AdamW and LAMB-with-clipping steps equal one process
// stepping on the whole batch's gradient (summed in float64 by hand); a NaN on one rank
// skips the step on every rank; replicas stay bit-identical; a plan mismatch is a
// CommError on every rank.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/comm_requirements.hpp"
#include "common/comm_world.hpp"
#include "fusedopt/comm.hpp"
#include "fusedopt/optimizer.hpp"

using fusedopt::DType;
using fusedopt::FlatArena;
using fusedopt::Optimizer;
using fusedopt::ParamGroup;
using fusedopt::Rule;
using fusedopt::comm::BucketOptions;
using fusedopt::comm::CommError;
using fusedopt::comm::Communicator;
using fusedopt::comm::GradBucketer;

namespace fusedopt::testing {
namespace {

const std::vector<std::int64_t> kSizes = {300, 5000, 17, 0, 2048, 999, 4096, 1};

}  // namespace

TEST_SUITE("comm") {
  TEST_CASE("buckets start in bucket order whatever order gradients become ready in") {
    Communicator& comm = world();
    const std::uint32_t seed = shared_seed();
    FlatArena arena = make_arena(kSizes);
    std::vector<fusedopt::Tensor> grads;
    for (std::size_t i = 0; i < arena.size(); ++i) grads.push_back(arena.grad(i));
    BucketOptions o;
    o.first_bucket_bytes = 4096;
    o.bucket_bytes = 16384;
    GradBucketer bucketer(comm, grads, o);
    REQUIRE(bucketer.buckets().size() >= 3);
    std::mt19937 order_rng(seed + 17u * static_cast<std::uint32_t>(comm.rank()));
    std::int64_t started_before = 0;
    for (int step = 0; step < 3; ++step) {
      for (std::size_t i = 0; i < grads.size(); ++i) {
        for (std::int64_t k = 0; k < kSizes[i]; ++k)
          data(grads[i])[k] = grad_value(seed, comm.rank(), step, i, k);
      }
      std::vector<int> order(grads.size());
      for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
      std::shuffle(order.begin(), order.end(), order_rng);  // a different order on each rank
      std::vector<char> ready(grads.size(), 0);
      for (int g : order) {
        bucketer.mark_ready(g);
        ready[static_cast<std::size_t>(g)] = 1;
        // Started: the leading buckets whose gradients are all ready.
        std::int64_t leading = 0;
        for (const auto& b : bucketer.buckets()) {
          bool all = true;
          for (int m : b.grads) all = all && ready[static_cast<std::size_t>(m)];
          if (!all) break;
          ++leading;
        }
        REQUIRE(bucketer.collectives() - started_before == leading);
      }
      bucketer.finish();
      started_before = bucketer.collectives();
      for (std::size_t i = 0; i < grads.size(); ++i) {
        for (std::int64_t k = 0; k < kSizes[i]; ++k) {
          double want = 0;
          for (int r = 0; r < comm.size(); ++r) want += grad_value(seed, r, step, i, k);
          REQUIRE(std::fabs(data(grads[i])[k] - want) <= 1e-6 * comm.size());
        }
      }
    }
    CHECK(bucketer.report().find(std::to_string(grads.size()) + " gradients -> " +
                                 std::to_string(bucketer.buckets().size()) + " all-reduces") == 0);
    const fusedopt::comm::BucketStats st = bucketer.stats();
    CHECK(st.gradients == static_cast<int>(kSizes.size()));
    CHECK(st.buckets == static_cast<int>(bucketer.buckets().size()));
    std::size_t bytes = 0, largest = 0;
    for (const fusedopt::comm::Bucket& b : bucketer.buckets()) {
      std::size_t mine = 0;
      for (int g : b.grads)
        mine += static_cast<std::size_t>(kSizes[static_cast<std::size_t>(g)]) * 4;
      bytes += mine;
      largest = std::max(largest, mine);
    }
    std::size_t all = 0;
    for (std::int64_t n : kSizes) all += static_cast<std::size_t>(n) * 4;
    CHECK(bytes == all);  // every gradient in exactly one bucket
    CHECK(st.bytes_per_step == all);
    CHECK(st.largest_bucket == largest);
    CHECK(st.steps == 3);
    CHECK(st.collectives == 3 * st.buckets);
    CHECK(st.wait_seconds >= 0);
    CHECK(st.report == bucketer.report());
  }

  TEST_CASE("data-parallel AdamW and LAMB with clipping equal one process on the whole batch") {
    Communicator& comm = world();
    const std::uint32_t seed = shared_seed();
    struct Case {
      const char* preset;
      double max_grad_norm;
    };
    for (const Case c : {Case{"adamw", 0.0}, Case{"lamb", 0.05}}) {
      CAPTURE(c.preset);
      FlatArena dp = make_arena(kSizes), single = make_arena(kSizes);
      std::mt19937 init(seed);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (std::size_t i = 0; i < kSizes.size(); ++i) {
        for (std::int64_t k = 0; k < kSizes[i]; ++k)
          data(dp.param(i))[k] = data(single.param(i))[k] = normal(init);
      }
      ParamGroup g_dp, g_single;
      std::vector<fusedopt::Tensor> grads;
      for (std::size_t i = 0; i < kSizes.size(); ++i) {
        g_dp.params.push_back(dp.param(i));
        g_dp.grads.push_back(dp.grad(i));
        grads.push_back(dp.grad(i));
        g_single.params.push_back(single.param(i));
        g_single.grads.push_back(single.grad(i));
      }
      Optimizer opt_dp(Rule::preset(c.preset), {g_dp});
      Optimizer opt_single(Rule::preset(c.preset), {g_single});
      if (c.max_grad_norm > 0) {  // LAMB's own clipping by global norm (its hyper)
        opt_dp.set_hyper("max_grad_norm", c.max_grad_norm);
        opt_single.set_hyper("max_grad_norm", c.max_grad_norm);
      }
      BucketOptions o;
      o.first_bucket_bytes = 4096;
      o.bucket_bytes = 16384;
      GradBucketer bucketer(comm, grads, o);
      for (int step = 0; step < 20; ++step) {
        const bool poisoned = step == 7 && comm.size() > 1;
        // Gradients on a grid of 2^-22 (|g| < 0.1: under 2^19 steps), so that any order of
        // fp32 sums over up to 8 ranks is exact: with grad_value's own values, a sum that
        // nearly cancels kept an ulp of fp32 rounding that Adam's normalisation magnified past
        // the bound below (5.2e-5 at 3 ranks, once in CI).
        auto grid = [&](int r, std::size_t i, std::int64_t k) {
          return std::ldexp(std::nearbyint(std::ldexp(grad_value(seed, r, step, i, k), 22)), -22);
        };
        for (std::size_t i = 0; i < kSizes.size(); ++i) {
          for (std::int64_t k = 0; k < kSizes[i]; ++k) {
            data(dp.grad(i))[k] = static_cast<float>(grid(comm.rank(), i, k));
            double sum = 0;  // the whole batch: every rank's gradient, summed in float64
            for (int r = 0; r < comm.size(); ++r) sum += grid(r, i, k);
            data(single.grad(i))[k] = static_cast<float>(sum);
          }
        }
        // A NaN on the last rank only: the sum carries it to every rank.
        if (poisoned && comm.rank() == comm.size() - 1) data(dp.grad(4))[100] = NAN;
        for (int g = static_cast<int>(kSizes.size()) - 1; g >= 0; --g) bucketer.mark_ready(g);
        bucketer.finish();
        const bool taken = opt_dp.step_scaled(bucketer.grad_scale());
        CHECK(taken == !poisoned);
        if (!poisoned) CHECK(opt_single.step_scaled(bucketer.grad_scale()));
      }
      CHECK(opt_dp.step_count() == opt_single.step_count());
      for (std::size_t i = 0; i < kSizes.size(); ++i) {
        for (std::int64_t k = 0; k < kSizes[i]; ++k) {
          const float a = data(dp.param(i))[k], b = data(single.param(i))[k];
          // The ranks sum in fp32 in their own order, one process in float64: the same sums
          // on the grid above, so only the kernels' own order could part them.
          REQUIRE(std::fabs(a - b) <= 1e-5f * (1 + std::fabs(b)));
        }
      }
      // Every replica holds the same bits: rank 0's params, broadcast, equal everyone's.
      for (std::size_t i = 0; i < kSizes.size(); ++i) {
        std::vector<float> mine(data(dp.param(i)), data(dp.param(i)) + kSizes[i]);
        std::vector<float> root = mine;
        comm.broadcast(root.data(), kSizes[i], DType::F32, 0).wait();
        CHECK(same_bytes(root.data(), mine.data(), mine.size() * 4));
      }
    }
  }

  TEST_CASE("data-parallel SGD under a GradScaler: one factor 1/(scale x ranks), skips agree") {
    // Each rank's gradient is scaled by the GradScaler's scale (as a scaled loss makes it);
    // the buckets sum them; GradScaler::step(opt, stream, grad_scale()) unscales and
    // averages in one multiplication. The reference: one process stepping on the average
    // gradient (float64 by hand), unscaled. SGD with momentum, whose update is proportional
    // to the gradient (Adam's is nearly scale-free, so it would not see a missing factor).
    // A NaN on one rank skips the step and backs the scale off on every rank.
    Communicator& comm = world();
    const std::uint32_t seed = shared_seed();
    FlatArena dp = make_arena(kSizes), single = make_arena(kSizes);
    std::mt19937 init(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    ParamGroup g_dp, g_single;
    std::vector<fusedopt::Tensor> grads;
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      for (std::int64_t k = 0; k < kSizes[i]; ++k)
        data(dp.param(i))[k] = data(single.param(i))[k] = normal(init);
      g_dp.params.push_back(dp.param(i));
      g_dp.grads.push_back(dp.grad(i));
      grads.push_back(dp.grad(i));
      g_single.params.push_back(single.param(i));
      g_single.grads.push_back(single.grad(i));
    }
    g_dp.hypers = g_single.hypers = {{"lr", 0.5}, {"momentum", 0.9}};
    Optimizer opt_dp(Rule::preset("sgd"), {g_dp});
    Optimizer opt_single(Rule::preset("sgd"), {g_single});
    fusedopt::GradScaler::Options so;
    so.init_scale = 1024;
    so.growth_interval = 4;
    fusedopt::GradScaler scaler(so);
    BucketOptions o;
    o.first_bucket_bytes = 4096;
    o.bucket_bytes = 16384;
    GradBucketer bucketer(comm, grads, o);
    const int poisoned_step = 6;
    for (int step = 0; step < 15; ++step) {
      const bool poisoned = step == poisoned_step && comm.size() > 1;
      const double scale = scaler.scale();
      for (std::size_t i = 0; i < kSizes.size(); ++i) {
        for (std::int64_t k = 0; k < kSizes[i]; ++k) {
          data(dp.grad(i))[k] =
              static_cast<float>(grad_value(seed, comm.rank(), step, i, k) * scale);
          double sum = 0;
          for (int r = 0; r < comm.size(); ++r) sum += grad_value(seed, r, step, i, k);
          data(single.grad(i))[k] = static_cast<float>(sum / comm.size());
        }
      }
      if (poisoned && comm.rank() == 0) data(dp.grad(1))[42] = INFINITY;
      for (int g = static_cast<int>(kSizes.size()) - 1; g >= 0; --g) bucketer.mark_ready(g);
      bucketer.finish();
      CHECK(scaler.step(opt_dp, nullptr, bucketer.grad_scale()) == !poisoned);
      if (!poisoned) opt_single.step();
      // The scale each rank uses next is the same everywhere.
      float next[1] = {static_cast<float>(scaler.scale())};
      float highest[1] = {next[0]};
      comm.all_reduce(highest, 1, DType::F32, fusedopt::comm::ReduceOp::Max).wait();
      CHECK(highest[0] == next[0]);
      if (poisoned) CHECK(scaler.scale() == scale / 2);
    }
    CHECK(opt_dp.step_count() == opt_single.step_count());
    CHECK(scaler.scale() > 1024);  // grown again after the back-off
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      for (std::int64_t k = 0; k < kSizes[i]; ++k) {
        const float a = data(dp.param(i))[k], b = data(single.param(i))[k];
        // fp32 sums of scaled gradients in the ranks' order against a float64 average: a
        // few ulps of gradient per step, through 15 steps.
        REQUIRE(std::fabs(a - b) <= 1e-5f * (1 + std::fabs(b)));
      }
    }
  }

  TEST_CASE("a moved-from GradBucketer refuses every call, naming it; the new one works") {
    Communicator& comm = world();
    FlatArena arena = make_arena(kSizes);
    std::vector<fusedopt::Tensor> grads;
    for (std::size_t i = 0; i < arena.size(); ++i) grads.push_back(arena.grad(i));
    GradBucketer first(comm, grads);
    GradBucketer second = std::move(first);
    CHECK_THROWS_WITH_AS(first.mark_ready(0),  // NOLINT(bugprone-use-after-move): the point
                         "GradBucketer::mark_ready: this GradBucketer was moved from",
                         fusedopt::UsageError);
    CHECK_THROWS_AS((void)first.buckets(), fusedopt::UsageError);
    CHECK_THROWS_AS(first.finish(), fusedopt::UsageError);
    second.mark_all_ready();
    second.finish();
    CHECK(second.stats().steps == 1);
  }

  TEST_CASE("ranks with different gradients fail at construction, every one of them" *
            fusedopt::testing::needs_several_ranks()) {
    Communicator comm = Communicator::mpi();
    comm.set_timeout(std::chrono::seconds(20));
    REQUIRE(comm.size() > 1);
    std::vector<std::int64_t> sizes = kSizes;
    if (comm.rank() == comm.size() - 1) sizes[2] = 18;
    FlatArena arena = make_arena(sizes);
    std::vector<fusedopt::Tensor> grads;
    for (std::size_t i = 0; i < arena.size(); ++i) grads.push_back(arena.grad(i));
    try {
      GradBucketer bucketer(comm, grads);
      FAIL("a GradBucketer was built over different gradients");
    } catch (const CommError& e) {
      CHECK(e.cause().find("rank 0 has 'gradient 2: 17 x fp32', rank " +
                           std::to_string(comm.size() - 1) + " has 'gradient 2: 18 x fp32'") !=
            std::string::npos);
    }
  }
}

}  // namespace fusedopt::testing
