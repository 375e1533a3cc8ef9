// ShardedOptimizer under mpiexec (1 to 4 ranks): 20 steps of sharded AdamW (ZeRO-1 and
// ZeRO-2) and sharded LAMB with clipping equal the unsharded data-parallel optimizer on the
// same gradients, with parameters that straddle shards (prime sizes, an empty one, one
// bigger than a shard) in two groups with their own hypers; a NaN on one rank skips the
// step on every rank and changes nothing; the state each rank holds is its share; a plan
// mismatch is a CommError on every rank.
#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
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
using fusedopt::comm::CommError;
using fusedopt::comm::Communicator;
using fusedopt::comm::GradBucketer;
using fusedopt::comm::ShardedOptimizer;
using fusedopt::comm::ShardOptions;

namespace fusedopt::testing {
namespace {

// 9,478 elements: at 4 ranks a shard is 2,370, so 8,191 spans four shards and every
// boundary falls inside a parameter.
const std::vector<std::int64_t> kSizes = {1009, 0, 17, 8191, 3, 257, 1};

/// Two groups over an arena: params 0-3 with the rule's hypers, 4-6 with lr 3e-3.
std::vector<ParamGroup> groups_of(FlatArena& a) {
  std::vector<ParamGroup> g(2);
  for (std::size_t i = 0; i < a.size(); ++i) {
    ParamGroup& group = g[i < 4 ? 0 : 1];
    group.params.push_back(a.param(i));
    group.grads.push_back(a.grad(i));
  }
  g[1].hypers = {{"lr", 3e-3}};
  return g;
}

}  // namespace

TEST_SUITE("comm") {
  TEST_CASE("sharded AdamW (ZeRO-1, ZeRO-2) and LAMB with clipping equal the unsharded optimizer") {
    Communicator& comm = world();
    const std::uint32_t seed = shared_seed();
    struct Case {
      const char* preset;
      int stage;
      double max_grad_norm;
      bool in_shared;
    };
    // The sharded optimizer's params and grads also in shared buffers: reduced and broadcast
    // in place on the shared-memory path (ordinary memory elsewhere), with the same results.
    for (const Case c :
         {Case{"adamw", 1, 0.0, false}, Case{"adamw", 2, 0.0, false}, Case{"lamb", 1, 0.05, false},
          Case{"lamb", 2, 0.05, false}, Case{"adamw", 1, 0.0, true}, Case{"adamw", 2, 0.0, true}}) {
      CAPTURE(c.preset);
      CAPTURE(c.stage);
      CAPTURE(c.in_shared);
      FlatArena sharded_arena = c.in_shared ? make_shared_arena(comm, kSizes) : make_arena(kSizes);
      FlatArena dp_arena = make_arena(kSizes);
      fill_params(sharded_arena, seed);
      fill_params(dp_arena, seed);
      BucketOptions buckets;
      buckets.first_bucket_bytes = 4096;
      buckets.bucket_bytes = 16384;
      ShardOptions options;
      options.stage = c.stage;
      options.buckets = buckets;
      ShardedOptimizer sharded(comm, Rule::preset(c.preset), groups_of(sharded_arena), options);
      // Its step is the local optimizer's program with the sharded ops: the gradients'
      // reduction finished first, each pass's totals combined, the pieces gathered last.
      const std::string program = sharded.local().stats().step_program;
      CHECK(program.rfind("begin, ", 0) == 0);
      CHECK(program.find(", update, end, publish") == program.size() - 22);
      CHECK((program.find("hook 0") != std::string::npos) == (std::string(c.preset) == "lamb"));
      // The reference: plain data parallel, every rank holding the whole state.
      Optimizer dp(Rule::preset(c.preset), groups_of(dp_arena));
      CHECK(dp.stats().step_program.find("begin") == std::string::npos);
      std::vector<fusedopt::Tensor> dp_grads;
      for (std::size_t i = 0; i < dp_arena.size(); ++i) dp_grads.push_back(dp_arena.grad(i));
      GradBucketer bucketer(comm, dp_grads, buckets);
      if (c.max_grad_norm > 0) {
        sharded.set_hyper("max_grad_norm", c.max_grad_norm);
        dp.set_hyper("max_grad_norm", c.max_grad_norm);
      }
      for (int step = 0; step < 20; ++step) {
        const bool poisoned = step == 7 && comm.size() > 1;
        fill_grads(sharded_arena, seed, comm.rank(), step);
        fill_grads(dp_arena, seed, comm.rank(), step);
        if (poisoned && comm.rank() == comm.size() - 1) {
          data(sharded_arena.grad(3))[5000] = NAN;  // in another rank's shard
          data(dp_arena.grad(3))[5000] = NAN;
        }
        const std::vector<float> before = params_of(sharded_arena);
        // Backward's order: the last parameter's gradient first.
        for (int i = static_cast<int>(kSizes.size()) - 1; i >= 0; --i) sharded.mark_ready(i);
        const bool taken = sharded.step();
        CHECK(taken == !poisoned);
        bucketer.mark_all_ready();
        bucketer.finish();
        CHECK(dp.step_scaled(bucketer.grad_scale()) == !poisoned);
        if (poisoned) CHECK(params_of(sharded_arena) == before);  // bit for bit
      }
      CHECK(sharded.step_count() == dp.step_count());
      const std::vector<float> a = params_of(sharded_arena), b = params_of(dp_arena);
      REQUIRE(a.size() == b.size());
      if (std::string(c.preset) == "adamw" && c.stage == 1) {
        // Element-wise on the same all-reduced gradients: the same bits.
        CHECK(same_bytes(a.data(), b.data(), a.size() * 4));
      }
      for (std::size_t k = 0; k < a.size(); ++k) {
        // ZeRO-2 sums each bucket in the reduce's order, and LAMB's norms add pieces in
        // float64 in another order: a few ulps per step through 20 steps.
        REQUIRE(std::fabs(a[k] - b[k]) <= 1e-5f * (1 + std::fabs(b[k])));
      }
      // Every replica holds the same bits.
      std::vector<float> root = a;
      comm.broadcast(root.data(), static_cast<std::int64_t>(root.size()), DType::F32, 0).wait();
      CHECK(same_bytes(root.data(), a.data(), a.size() * 4));
    }
  }

  TEST_CASE("a sharded GradScaler step: one factor, the same verdict and scale on every rank") {
    // ZeRO-2, so each rank sees only the gradients it owns: a NaN in one rank's shard must
    // still skip the step on every rank and back every rank's scale off. The reference is
    // data parallel under its own GradScaler on the same scaled gradients; SGD, whose update
    // is proportional to the gradient (a wrong factor shows).
    Communicator& comm = world();
    const std::uint32_t seed = shared_seed();
    FlatArena sharded_arena = make_arena(kSizes), dp_arena = make_arena(kSizes);
    fill_params(sharded_arena, seed);
    fill_params(dp_arena, seed);
    std::vector<ParamGroup> g_sharded = groups_of(sharded_arena), g_dp = groups_of(dp_arena);
    for (auto* groups : {&g_sharded, &g_dp}) {
      for (ParamGroup& g : *groups) g.hypers = {{"lr", 0.5}, {"momentum", 0.9}};
    }
    ShardOptions options;
    options.stage = 2;
    options.buckets.first_bucket_bytes = 4096;
    options.buckets.bucket_bytes = 16384;
    ShardedOptimizer sharded(comm, Rule::preset("sgd"), g_sharded, options);
    Optimizer dp(Rule::preset("sgd"), g_dp);
    std::vector<fusedopt::Tensor> dp_grads;
    for (std::size_t i = 0; i < dp_arena.size(); ++i) dp_grads.push_back(dp_arena.grad(i));
    GradBucketer bucketer(comm, dp_grads, options.buckets);
    fusedopt::GradScaler::Options so;
    so.init_scale = 1024;
    so.growth_interval = 3;
    fusedopt::GradScaler scaler_sharded(so), scaler_dp(so);
    for (int step = 0; step < 12; ++step) {
      const bool poisoned = step == 4 && comm.size() > 1;
      const double scale = scaler_sharded.scale();
      REQUIRE(scaler_dp.scale() == scale);
      for (FlatArena* a : {&sharded_arena, &dp_arena}) {
        for (std::size_t i = 0; i < a->size(); ++i) {
          for (std::int64_t k = 0; k < a->grad(i).numel; ++k)
            data(a->grad(i))[k] =
                static_cast<float>(grad_value(seed, comm.rank(), step, i, k) * scale);
        }
      }
      if (poisoned && comm.rank() == comm.size() - 1) {
        // Element 0 of w0 belongs to rank 0's shard: only rank 0 sees the reduced NaN.
        data(sharded_arena.grad(0))[0] = NAN;
        data(dp_arena.grad(0))[0] = NAN;
      }
      const std::vector<float> before = params_of(sharded_arena);
      for (int i = static_cast<int>(kSizes.size()) - 1; i >= 0; --i) sharded.mark_ready(i);
      // One face: scaler.step(sharded) is sharded.step(scaler) (alternated here).
      const bool taken =
          step % 2 == 0 ? sharded.step(scaler_sharded) : scaler_sharded.step(sharded);
      CHECK(taken == !poisoned);
      bucketer.mark_all_ready();
      bucketer.finish();
      CHECK(scaler_dp.step(dp, nullptr, bucketer.grad_scale()) == !poisoned);
      if (poisoned) {
        CHECK(params_of(sharded_arena) == before);
        CHECK(scaler_sharded.scale() == scale / 2);
      }
      float mine[1] = {static_cast<float>(scaler_sharded.scale())};
      float highest[1] = {mine[0]};
      comm.all_reduce(highest, 1, DType::F32, fusedopt::comm::ReduceOp::Max).wait();
      CHECK(highest[0] == mine[0]);
    }
    CHECK(sharded.step_count() == dp.step_count());
    const std::vector<float> a = params_of(sharded_arena), b = params_of(dp_arena);
    for (std::size_t k = 0; k < a.size(); ++k)
      REQUIRE(std::fabs(a[k] - b[k]) <= 1e-5f * (1 + std::fabs(b[k])));
  }

  TEST_CASE("each rank holds its share of the optimizer state") {
    Communicator& comm = world();
    std::vector<std::int64_t> sizes;
    for (std::int64_t n : kSizes) sizes.push_back(n * 101);  // 957 K elements
    FlatArena sharded_arena = make_arena(sizes), full_arena = make_arena(sizes);
    std::vector<ParamGroup> g_sharded(1), g_full(1);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      g_sharded[0].params.push_back(sharded_arena.param(i));
      g_sharded[0].grads.push_back(sharded_arena.grad(i));
      g_full[0].params.push_back(full_arena.param(i));
      g_full[0].grads.push_back(full_arena.grad(i));
    }
    ShardOptions options;
    options.buckets.bucket_bytes = 64 << 10;
    ShardedOptimizer sharded(comm, Rule::preset("adamw"), g_sharded, options);
    Optimizer full(Rule::preset("adamw"), g_full);
    const std::size_t total = full.stats().state_bytes;
    const fusedopt::comm::ShardStats s = sharded.stats();
    CAPTURE(s.report);
    CHECK(s.state_bytes <=
          total / static_cast<std::size_t>(comm.size()) + options.buckets.bucket_bytes);
    // Every element's state lives on exactly one rank.
    double sum[2] = {static_cast<double>(s.state_bytes), static_cast<double>(s.owned_elements)};
    comm.all_reduce(sum, 2).wait();
    CHECK(sum[1] == static_cast<double>(s.elements));
    CHECK(sum[0] >= static_cast<double>(total) - 64.0 * 2 * static_cast<double>(sizes.size()));
    CHECK(sum[0] <=
          static_cast<double>(total) + 64.0 * 2 * static_cast<double>(sizes.size() + comm.size()));
    CHECK(s.ranks == comm.size());
    CHECK(s.gather_collectives >= comm.size());
    // state(name, param): this rank's piece of the param's state, as owned_range says.
    for (int i = 0; i < static_cast<int>(sizes.size()); ++i) {
      CAPTURE(i);
      const auto [begin, end] = sharded.owned_range(i);
      for (const char* name : {"m", "v"}) {
        const fusedopt::Tensor t = sharded.state(name, i);
        CHECK(t.numel == end - begin);
        CHECK((t.numel == 0) == (t.data == nullptr));
        double n = static_cast<double>(t.numel);
        comm.all_reduce(&n, 1).wait();
        CHECK(n == static_cast<double>(sizes[static_cast<std::size_t>(i)]));
      }
    }
    CHECK_THROWS_AS((void)sharded.state("momentum", 0), fusedopt::UsageError);
    CHECK_THROWS_AS((void)sharded.state("m", static_cast<int>(sizes.size())), fusedopt::UsageError);
  }

  TEST_CASE("rules with scalar or row/column states are refused, naming them") {
    Communicator& comm = world();
    FlatArena arena = make_arena(kSizes);
    CHECK_THROWS_WITH_AS(ShardedOptimizer(comm, Rule::preset("nadam"), groups_of(arena)),
                         doctest::Contains("row/column states (mu_prod), which are not sharded"),
                         fusedopt::UsageError);
    CHECK_THROWS_WITH_AS(ShardedOptimizer(comm, Rule::preset("adafactor"), groups_of(arena)),
                         doctest::Contains("row/column states (r, c), which are not sharded"),
                         fusedopt::UsageError);
  }

  TEST_CASE("ranks with different parameters fail at construction, every one of them" *
            fusedopt::testing::needs_several_ranks()) {
    Communicator comm = Communicator::mpi();
    comm.set_timeout(std::chrono::seconds(20));
    REQUIRE(comm.size() > 1);
    std::vector<std::int64_t> sizes = kSizes;
    if (comm.rank() == comm.size() - 1) sizes[2] = 18;
    FlatArena arena = make_arena(sizes);
    try {
      ShardedOptimizer sharded(comm, Rule::preset("adamw"), groups_of(arena));
      FAIL("a ShardedOptimizer was built over different parameters");
    } catch (const CommError& e) {
      CHECK(e.cause().find("rank 0 has 'param 2: 'w2' 17 x fp32 [], grad fp32', rank " +
                           std::to_string(comm.size() - 1) +
                           " has 'param 2: 'w2' 18 x fp32 [], grad fp32'") != std::string::npos);
    }
  }

  TEST_CASE(
      "ranks whose params differ only in a name, or whose groups differ in a hyper, fail "
      "at construction, every one of them" *
      fusedopt::testing::needs_several_ranks()) {
    Communicator comm = Communicator::mpi();
    comm.set_timeout(std::chrono::seconds(20));
    REQUIRE(comm.size() > 1);
    const bool odd_one = comm.rank() == comm.size() - 1;
    {
      FlatArena arena;
      for (std::size_t i = 0; i < kSizes.size(); ++i) {
        arena.add(odd_one && i == 1 ? "renamed" : "w" + std::to_string(i), kSizes[i],
                  fusedopt::DType::F32);
      }
      arena.finalize();
      try {
        ShardedOptimizer sharded(comm, Rule::preset("adamw"), groups_of(arena));
        FAIL("a ShardedOptimizer was built over params of other names");
      } catch (const CommError& e) {
        CHECK(e.cause().find("'renamed'") != std::string::npos);
      }
    }
    {
      Communicator again = Communicator::mpi();  // the first one is broken now
      again.set_timeout(std::chrono::seconds(20));
      FlatArena arena = make_arena(kSizes);
      std::vector<ParamGroup> groups = groups_of(arena);
      if (odd_one) groups[1].hypers = {{"lr", 0.5}};
      try {
        ShardedOptimizer sharded(again, Rule::preset("adamw"), groups);
        FAIL("a ShardedOptimizer was built with another lr in one group");
      } catch (const CommError& e) {
        CHECK(e.cause().find("lr=0.5 ") != std::string::npos);
      }
    }
    // A hyper given on one rank and defaulted on another is the same plan.
    FlatArena arena = make_arena(kSizes);
    std::vector<ParamGroup> groups = groups_of(arena);
    if (odd_one) groups[0].hypers = {{"lr", Rule::preset("adamw").hypers()[0].second}};
    Communicator third = Communicator::mpi();
    third.set_timeout(std::chrono::seconds(20));
    ShardedOptimizer sharded(third, Rule::preset("adamw"), groups);
    CHECK(sharded.stats().ranks == comm.size());
  }

  TEST_CASE("a sharded checkpoint saved at W ranks loads at every world size up to W") {
    // Gradients the same on every rank, so the average (and so the next step) does not
    // depend on the world size. 5 steps at W, save, one more step: the reference. Then
    // groups of 1..W ranks load the checkpoint into fresh optimizers (params as saved) and
    // take the same next step.
    Communicator& comm = world();
    const std::uint32_t seed = shared_seed();
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("fusedopt-sharded-" + std::to_string(seed));
    for (const int stage : {1, 2}) {
      for (const char* preset : {"adamw", "lamb"}) {
        CAPTURE(stage);
        CAPTURE(preset);
        ShardOptions options;
        options.stage = stage;
        options.buckets.first_bucket_bytes = 4096;
        options.buckets.bucket_bytes = 16384;
        FlatArena arena = make_arena(kSizes);
        fill_params(arena, seed);
        std::vector<float> saved_params, reference;
        {
          ShardedOptimizer sharded(comm, Rule::preset(preset), groups_of(arena), options);
          sharded.set_hyper("weight_decay", 0.125, 1);  // hypers travel too
          for (int step = 0; step < 5; ++step) {
            fill_grads(arena, seed, 0, step);
            REQUIRE(sharded.step());
          }
          sharded.save(dir);
          saved_params = params_of(arena);
          fill_grads(arena, seed, 0, 5);
          REQUIRE(sharded.step());
          reference = params_of(arena);
        }
        for (int k = 1; k <= comm.size(); ++k) {
          CAPTURE(k);
          MPI_Comm group = MPI_COMM_NULL;
          MPI_Comm_split(MPI_COMM_WORLD, comm.rank() < k ? 0 : MPI_UNDEFINED, comm.rank(), &group);
          if (group != MPI_COMM_NULL) {
            Communicator sub = Communicator::mpi(&group);
            FlatArena fresh = make_arena(kSizes);
            std::vector<float> p = saved_params;
            for (std::size_t i = 0, at = 0; i < fresh.size(); at += fresh.param(i).numel, ++i)
              if (fresh.param(i).numel > 0)
                std::memcpy(data(fresh.param(i)), p.data() + at, fresh.param(i).numel * 4);
            ShardedOptimizer loaded(sub, Rule::preset(preset), groups_of(fresh), options);
            loaded.load(dir);
            CHECK(loaded.step_count() == 5);
            CHECK(loaded.hyper("weight_decay", 1) == 0.125);
            fill_grads(fresh, seed, 0, 5);
            REQUIRE(loaded.step());
            const std::vector<float> got = params_of(fresh);
            for (std::size_t e = 0; e < got.size(); ++e) {
              // The sum of k equal gradients times 1/k (exact for k a power of two), and
              // LAMB's norms from pieces cut elsewhere: within a few ulps.
              REQUIRE(std::fabs(got[e] - reference[e]) <= 1e-6f * (1 + std::fabs(reference[e])));
            }
            MPI_Comm_free(&group);
          }
          comm.barrier().wait();
        }
      }
    }
    comm.barrier().wait();
    if (comm.rank() == 0) std::filesystem::remove_all(dir);
  }

  TEST_CASE("a sharded save that died before its index leaves the previous checkpoint") {
    Communicator& comm = world();
    const std::uint32_t seed = shared_seed();
    const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                      ("fusedopt-sharded-partial-" + std::to_string(seed));
    FlatArena arena = make_arena(kSizes);
    fill_params(arena, seed);
    ShardedOptimizer sharded(comm, Rule::preset("adamw"), groups_of(arena));
    for (int step = 0; step < 3; ++step) {
      fill_grads(arena, seed, comm.rank(), step);
      REQUIRE(sharded.step());
    }
    sharded.save(dir);
    const fusedopt::Tensor m = sharded.local().state("m", 0);
    const std::vector<float> m_saved(data(m), data(m) + m.numel);
    fill_grads(arena, seed, comm.rank(), 3);
    REQUIRE(sharded.step());
    // What a save killed after its shards leaves: new shard files (another tag), a stray
    // temp file, and the old index.
    comm.barrier().wait();
    std::ofstream(dir / ("shard-4-dead00-" + std::to_string(comm.rank()) + "-of-" +
                         std::to_string(comm.size()) + ".safetensors"))
        << "half a file";
    std::ofstream(dir / ".index.safetensors.tmp") << "junk";
    comm.barrier().wait();
    sharded.load(dir);
    CHECK(sharded.step_count() == 3);
    const fusedopt::Tensor m2 = sharded.local().state("m", 0);
    CHECK(std::vector<float>(data(m2), data(m2) + m2.numel) == m_saved);
    // A load that cannot work changes nothing, on every rank.
    comm.barrier().wait();
    if (comm.rank() == 0) std::filesystem::remove(dir / "index.safetensors");
    comm.barrier().wait();
    CHECK_THROWS_AS(sharded.load(dir), fusedopt::Error);
    CHECK(sharded.step_count() == 3);
    comm.barrier().wait();
    if (comm.rank() == 0) std::filesystem::remove_all(dir);
  }

  TEST_CASE("a sharded checkpoint merged into one file loads into a plain Optimizer, and back") {
    // ZeRO-1 AdamW and plain data parallel on the same gradients hold the same bits, so the
    // merged checkpoint must equal the plain optimizer's state exactly; split again for W
    // ranks it must give every rank its own state back.
    Communicator& comm = world();
    const std::uint32_t seed = shared_seed();
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("fusedopt-sharded-merge-" + std::to_string(seed));
    FlatArena sharded_arena = make_arena(kSizes), dp_arena = make_arena(kSizes);
    fill_params(sharded_arena, seed);
    fill_params(dp_arena, seed);
    ShardedOptimizer sharded(comm, Rule::preset("adamw"), groups_of(sharded_arena));
    Optimizer dp(Rule::preset("adamw"), groups_of(dp_arena));
    std::vector<fusedopt::Tensor> dp_grads;
    for (std::size_t i = 0; i < dp_arena.size(); ++i) dp_grads.push_back(dp_arena.grad(i));
    GradBucketer bucketer(comm, dp_grads);
    for (int step = 0; step < 3; ++step) {
      fill_grads(sharded_arena, seed, comm.rank(), step);
      fill_grads(dp_arena, seed, comm.rank(), step);
      REQUIRE(sharded.step());
      bucketer.mark_all_ready();
      bucketer.finish();
      REQUIRE(dp.step_scaled(bucketer.grad_scale()));
    }
    sharded.save(dir / "sharded");
    if (comm.rank() == 0) {
      ShardedOptimizer::merge_checkpoint(dir / "sharded", dir / "merged.safetensors");
      FlatArena plain_arena = make_arena(kSizes);
      Optimizer plain(Rule::preset("adamw"), groups_of(plain_arena));
      plain.load(dir / "merged.safetensors");
      CHECK(plain.step_count() == 3);
      for (int i = 0; i < static_cast<int>(kSizes.size()); ++i) {
        for (const char* st : {"m", "v"}) {
          const fusedopt::Tensor a = plain.state(st, i), b = dp.state(st, i);
          REQUIRE(a.numel == b.numel);
          CHECK(same_bytes(a.data, b.data, static_cast<std::size_t>(a.numel) * 4));
        }
      }
      ShardedOptimizer::split_checkpoint(dir / "merged.safetensors", dir / "split", comm.size());
    }
    comm.barrier().wait();
    FlatArena again_arena = make_arena(kSizes);
    ShardedOptimizer again(comm, Rule::preset("adamw"), groups_of(again_arena));
    again.load(dir / "split");
    CHECK(again.step_count() == 3);
    const fusedopt::Optimizer& mine = sharded.local();
    for (int i = 0; i < static_cast<int>(mine.stats().tensors); ++i) {
      const fusedopt::Tensor a = again.local().state("v", i), b = mine.state("v", i);
      REQUIRE(a.numel == b.numel);
      CHECK(same_bytes(a.data, b.data, static_cast<std::size_t>(a.numel) * 4));
    }
    comm.barrier().wait();
    if (comm.rank() == 0) std::filesystem::remove_all(dir);
  }

  TEST_CASE("bad ShardedOptimizer arguments are clear errors") {
    Communicator& comm = world();
    FlatArena arena = make_arena(kSizes);
    ShardOptions options;
    options.stage = 3;
    CHECK_THROWS_WITH_AS(ShardedOptimizer(comm, Rule::preset("adamw"), groups_of(arena), options),
                         "ShardedOptimizer: stage 3 is neither 1 (ZeRO-1) nor 2 (ZeRO-2)",
                         fusedopt::UsageError);
  }
}

}  // namespace fusedopt::testing
