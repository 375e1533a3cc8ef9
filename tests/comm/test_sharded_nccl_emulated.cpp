// ShardedOptimizer over NCCL with CUDA tensors, end to end without a GPU: under mpiexec (2
// to 4 ranks) every rank's device is fusedopt's CUDA emulator (FUSEDOPT_CUDA_DRIVER_LIBRARY)
// and NCCL is the fake one (FUSEDOPT_NCCL_LIBRARY, tests/cuda_fake/fake_libnccl.cpp), whose
// collectives move the ranks' device memory (host memory here) over MPI. The kernels run,
// the collectives carry real data, and the results are checked against an unsharded
// Optimizer on the same emulated device, fed the whole batch's gradient.
//
// Exactness: the fake NCCL sums in rank order in fp32 (as the reference below does), and the
// kernels of the sharded and unsharded optimizers are the same code, so element-wise rules
// (AdamW, ZeRO-1 and ZeRO-2) must give the same bits; LAMB with clipping adds norms of
// pieces in float64 in another order (a tolerance); so do the 16-bit cases. Where the device
// is not the emulator the bit-exact checks are left out (the tolerances stay). One case
// drives the fake's peer timeout, so the suite needs the fake NCCL.
#include <dlfcn.h>
#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "common/comm_requirements.hpp"
#include "common/comm_world.hpp"
#include "common/requirements.hpp"
#include "device/cuda_driver.hpp"
#include "fusedopt/comm.hpp"
#include "fusedopt/cuda.hpp"
#include "fusedopt/optimizer.hpp"
#include "fusedopt/sharded.hpp"

using fusedopt::CudaBuffer;
using fusedopt::Device;
using fusedopt::DType;
using fusedopt::Optimizer;
using fusedopt::ParamGroup;
using fusedopt::Rule;
using fusedopt::comm::Communicator;
using fusedopt::comm::ReduceOp;
using fusedopt::comm::ShardedOptimizer;
using fusedopt::comm::ShardOptions;
namespace testing = fusedopt::testing;

namespace fusedopt::testing {
namespace {

// 3,362 elements (every kernel launch on the emulator runs each CUDA thread as a fiber, so
// small): at 4 ranks a shard is 841, so 2,053 spans three shards, and an empty and a
// one-element parameter sit between them.
const std::vector<std::int64_t> kSizes = {1031, 0, 17, 2053, 3, 257, 1};

std::int64_t total_of(const std::vector<std::int64_t>& sizes) {
  std::int64_t n = 0;
  for (std::int64_t s : sizes) n += s;
  return n;
}

/// Parameters and gradients of kSizes in two device buffers (of one dtype, in parameter
/// order, as ShardedOptimizer needs them), in two groups: 0-3 with the rule's hypers, 4-6
/// with lr 3e-3. Host values are element bits: floats, or uint16 for fp16 and bf16.
template <typename Bits = float>
struct DeviceModel {
  explicit DeviceModel(DType d = DType::F32) : dtype(d) {}
  DType dtype;
  std::int64_t total = total_of(kSizes);
  CudaBuffer params{bytes()};
  CudaBuffer grads{bytes()};

  std::vector<ParamGroup> groups() const {
    std::vector<ParamGroup> g(2);
    std::int64_t at = 0;
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      auto view = [&](const CudaBuffer& b) {
        return static_cast<void*>(static_cast<char*>(b.data()) + at * sizeof(Bits));
      };
      const std::string name = "w" + std::to_string(i);
      ParamGroup& group = g[i < 4 ? 0 : 1];
      group.params.push_back({view(params), kSizes[i], dtype, Device::cuda(0), name});
      group.grads.push_back({view(grads), kSizes[i], dtype, Device::cuda(0), name});
      at += kSizes[i];
    }
    g[1].hypers = {{"lr", 3e-3}};
    return g;
  }
  void set_params(const std::vector<Bits>& host) { params.copy_from_host(host.data(), bytes()); }
  void set_grads(const std::vector<Bits>& host) { grads.copy_from_host(host.data(), bytes()); }
  std::vector<Bits> get_params() const {
    std::vector<Bits> host(static_cast<std::size_t>(total));
    params.copy_to_host(host.data(), bytes());
    return host;
  }
  std::size_t bytes() const { return static_cast<std::size_t>(total) * sizeof(Bits); }
};

// fp16 and bf16 by hand (round to nearest even), for the 16-bit case's reference.
float half_to_float(DType d, std::uint16_t h) {
  if (d == DType::BF16) {
    const std::uint32_t u = std::uint32_t{h} << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double magnitude = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  const double v = e == 31 ? (m ? NAN : INFINITY) : magnitude;
  return static_cast<float>((h & 0x8000) ? -v : v);
}
std::uint16_t float_to_half(DType d, float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if (d == DType::BF16) {
    if (std::isnan(f)) return 0x7fc0;
    return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  if (std::isnan(f)) return 0x7e00;
  // fp16: the nearest multiple of its spacing at f's magnitude, ties to even (the values
  // here are far from overflow).
  const std::uint16_t sign = f < 0 ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  int e = 0;
  (void)std::frexp(a, &e);                                // a = [0.5, 1) * 2^e
  const int exponent = std::max(e - 1, -14);              // of the leading bit
  const double spacing = std::ldexp(1.0, exponent - 10);  // 10 mantissa bits
  const double units = std::nearbyint(a / spacing);       // ties to even
  const double rounded = units * spacing;
  if (rounded == 0) return sign;
  int re = 0;
  (void)std::frexp(rounded, &re);
  if (re - 1 < -14) return static_cast<std::uint16_t>(sign | static_cast<int>(units));  // subnormal
  const int biased = re - 1 + 15;
  const int mantissa = static_cast<int>(std::ldexp(rounded, -(re - 1)) * 1024) - 1024;
  return static_cast<std::uint16_t>(sign | (biased << 10) | mantissa);
}

std::vector<float> initial_params(std::uint32_t seed) {
  std::mt19937 init(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> p(static_cast<std::size_t>(total_of(kSizes)));
  for (float& x : p) x = normal(init);
  return p;
}

/// Rank r's gradient at `step`, every parameter end to end.
std::vector<float> rank_grads(std::uint32_t seed, int r, int step) {
  std::vector<float> g;
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    for (std::int64_t k = 0; k < kSizes[i]; ++k) g.push_back(grad_value(seed, r, step, i, k));
  }
  return g;
}

/// The whole batch's gradient, summed over ranks 0, 1, ... in fp32 (the fake NCCL's order).
std::vector<float> summed_grads(std::uint32_t seed, int ranks, int step) {
  std::vector<float> sum = rank_grads(seed, 0, step);
  for (int r = 1; r < ranks; ++r) {
    const std::vector<float> g = rank_grads(seed, r, step);
    for (std::size_t k = 0; k < sum.size(); ++k) sum[k] += g[k];
  }
  return sum;
}

/// The job's NCCL communicator on emulated device 0, over the MPI bootstrap.
Communicator nccl_world() {
  Communicator comm = Communicator::nccl(0, world());
  REQUIRE(comm.backend() == "nccl");
  REQUIRE(comm.size() == world().size());
  REQUIRE(comm.rank() == world().rank());
  return comm;
}

/// Whether sums follow the fake NCCL's order (bit-exact comparisons hold).
bool exact() { return fusedopt::cuda_device_emulated(); }

void require_close(const std::vector<float>& got, const std::vector<float>& want, float rel) {
  REQUIRE(got.size() == want.size());
  for (std::size_t k = 0; k < got.size(); ++k) {
    CAPTURE(k);
    REQUIRE(std::fabs(got[k] - want[k]) <= rel * (1 + std::fabs(want[k])));
  }
}

/// Every rank holds rank 0's bits.
void require_replicas_agree(const std::vector<float>& mine) {
  std::vector<float> root = mine;
  world().broadcast(root.data(), static_cast<std::int64_t>(root.size()), DType::F32, 0).wait();
  CHECK(same_bytes(root.data(), mine.data(), mine.size() * 4));
}

}  // namespace

TEST_SUITE("comm") {
  TEST_CASE("the fake NCCL's collectives move every rank's device memory" * testing::needs_mpi() *
            testing::needs_cuda_device()) {
    Communicator comm = nccl_world();
    const int n = comm.size(), me = comm.rank();
    constexpr std::int64_t kCount = 1001;  // per rank; odd
    // Small integers: every sum is exact in fp16, bf16, fp32 and fp64.
    auto value = [](int r, std::int64_t k) { return static_cast<double>((r + 1) * (k % 7) - 3); };
    auto bits_of = [](DType d, double v, void* out, std::int64_t k) {
      const float f = static_cast<float>(v);
      std::uint32_t u;
      std::memcpy(&u, &f, 4);
      if (d == DType::F64) {
        std::memcpy(static_cast<char*>(out) + k * 8, &v, 8);
      } else if (d == DType::F32) {
        std::memcpy(static_cast<char*>(out) + k * 4, &f, 4);
      } else if (d == DType::BF16) {
        const auto h = static_cast<std::uint16_t>(u >> 16);  // exact for these integers
        std::memcpy(static_cast<char*>(out) + k * 2, &h, 2);
      } else {
        // fp16 of a small integer: sign, exponent, the top 10 mantissa bits (exact).
        std::uint16_t h = 0;
        if (f != 0) {
          const int e = static_cast<int>((u >> 23) & 0xff) - 127 + 15;
          h = static_cast<std::uint16_t>(((u >> 16) & 0x8000u) | (e << 10) | ((u >> 13) & 0x3ffu));
        }
        std::memcpy(static_cast<char*>(out) + k * 2, &h, 2);
      }
    };
    for (const DType d : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
      CAPTURE(fusedopt::to_string(d));
      const std::size_t es = fusedopt::dtype_size(d);
      std::vector<char> host(static_cast<std::size_t>(kCount * n) * es), want(host.size());
      CudaBuffer dev(host.size());
      for (const ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
        for (std::int64_t k = 0; k < kCount; ++k) {
          bits_of(d, value(me, k), host.data(), k);
          double w = op == ReduceOp::Sum ? 0.0 : value(0, k);
          for (int r = 0; r < n; ++r)
            w = op == ReduceOp::Sum ? w + value(r, k) : std::max(w, value(r, k));
          bits_of(d, w, want.data(), k);
        }
        dev.copy_from_host(host.data(), static_cast<std::size_t>(kCount) * es);
        comm.all_reduce(dev.data(), kCount, d, op).wait();
        std::vector<char> got(static_cast<std::size_t>(kCount) * es);
        dev.copy_to_host(got.data(), got.size());
        CHECK(same_bytes(got.data(), want.data(), got.size()));
      }
      // Reduce-scatter: block q of every rank's n blocks, summed, lands on rank q.
      for (int q = 0; q < n; ++q) {
        for (std::int64_t k = 0; k < kCount; ++k)
          bits_of(d, value(me, k + q), host.data(), q * kCount + k);
      }
      for (std::int64_t k = 0; k < kCount; ++k) {
        double w = 0;
        for (int r = 0; r < n; ++r) w += value(r, k + me);
        bits_of(d, w, want.data(), k);
      }
      dev.copy_from_host(host.data(), host.size());
      CudaBuffer block(static_cast<std::size_t>(kCount) * es);
      comm.reduce_scatter(dev.data(), block.data(), kCount, d).wait();
      std::vector<char> got(static_cast<std::size_t>(kCount) * es);
      block.copy_to_host(got.data(), got.size());
      CHECK(same_bytes(got.data(), want.data(), got.size()));
      // All-gather, in place: rank r's block r reaches every rank.
      for (int r = 0; r < n; ++r) {
        for (std::int64_t k = 0; k < kCount; ++k)
          bits_of(d, value(r, k), want.data(), r * kCount + k);
      }
      std::vector<char> gathered(host.size());
      {
        // Every block but this rank's holds garbage before the gather.
        std::vector<char> staged(host.size(), 0x11);
        std::memcpy(staged.data() + static_cast<std::size_t>(me * kCount) * es,
                    want.data() + static_cast<std::size_t>(me * kCount) * es,
                    static_cast<std::size_t>(kCount) * es);
        dev.copy_from_host(staged.data(), staged.size());
      }
      void* mine = static_cast<char*>(dev.data()) + static_cast<std::size_t>(me * kCount) * es;
      comm.all_gather(mine, dev.data(), kCount, d).wait();
      dev.copy_to_host(gathered.data(), gathered.size());
      CHECK(same_bytes(gathered.data(), want.data(), gathered.size()));
      // Broadcast from the last rank.
      for (std::int64_t k = 0; k < kCount; ++k) bits_of(d, value(me, k), host.data(), k);
      for (std::int64_t k = 0; k < kCount; ++k) bits_of(d, value(n - 1, k), want.data(), k);
      dev.copy_from_host(host.data(), static_cast<std::size_t>(kCount) * es);
      comm.broadcast(dev.data(), kCount, d, n - 1).wait();
      dev.copy_to_host(got.data(), got.size());
      CHECK(same_bytes(got.data(), want.data(), got.size()));
    }
    // NCCL's max is fmax: a NaN beside a number gives the number (unlike MPI's).
    {
      double v[2] = {me == 0 ? std::nan("") : 1.0, static_cast<double>(me)};
      CudaBuffer d(sizeof v);
      d.copy_from_host(v, sizeof v);
      comm.all_reduce(d.data(), 2, DType::F64, ReduceOp::Max).wait();
      d.copy_to_host(v, sizeof v);
      CHECK(v[0] == 1.0);
      CHECK(v[1] == static_cast<double>(n - 1));
    }
    comm.barrier().wait();
  }

  TEST_CASE(
      "sharded AdamW (ZeRO-1, ZeRO-2) and LAMB with clipping on emulated devices equal "
      "the unsharded optimizer" *
      testing::needs_mpi() * testing::needs_cuda_device()) {
    Communicator comm = nccl_world();
    const int ranks = comm.size(), me = comm.rank();
    const std::uint32_t seed = shared_seed();
    CAPTURE(seed);
    struct Case {
      const char* preset;
      int stage;
      double max_grad_norm;
    };
    for (const Case c : {Case{"adamw", 1, 0.0}, Case{"adamw", 2, 0.0}, Case{"lamb", 1, 0.05},
                         Case{"lamb", 2, 0.05}}) {
      CAPTURE(c.preset);
      CAPTURE(c.stage);
      DeviceModel<> sharded_model, dp_model;
      sharded_model.set_params(initial_params(seed));
      dp_model.set_params(initial_params(seed));
      ShardOptions options;
      options.stage = c.stage;
      options.buckets.first_bucket_bytes = 2048;  // several buckets, cut inside parameters
      options.buckets.bucket_bytes = 4096;
      ShardedOptimizer sharded(comm, Rule::preset(c.preset), sharded_model.groups(), options);
      // The reference: one optimizer over every parameter on this rank's (emulated) device,
      // stepped on the sum of every rank's gradient times 1/ranks.
      Optimizer dp(Rule::preset(c.preset), dp_model.groups());
      if (c.max_grad_norm > 0) {
        sharded.set_hyper("max_grad_norm", c.max_grad_norm);
        dp.set_hyper("max_grad_norm", c.max_grad_norm);
      }
      for (int step = 0; step < 6; ++step) {
        CAPTURE(step);
        // At step 3 a NaN in the last rank's gradient, in the shard of rank 0: every rank
        // skips the step (ZeRO-2: only rank 0 sees it after the reduce).
        const bool poisoned = step == 3;
        std::vector<float> mine = rank_grads(seed, me, step);
        std::vector<float> sum = summed_grads(seed, ranks, step);
        if (poisoned) {
          if (me == ranks - 1) mine[5] = NAN;
          sum[5] = NAN;
        }
        sharded_model.set_grads(mine);
        dp_model.set_grads(sum);
        const std::vector<float> before = sharded_model.get_params();
        // Backward's order: the last parameter's gradient first.
        for (int i = static_cast<int>(kSizes.size()) - 1; i >= 0; --i) sharded.mark_ready(i);
        CHECK(sharded.step() == !poisoned);
        CHECK(dp.step_scaled(1.0f / static_cast<float>(ranks)) == !poisoned);
        if (poisoned) CHECK(sharded_model.get_params() == before);
      }
      CHECK(sharded.step_count() == dp.step_count());
      const std::vector<float> a = sharded_model.get_params(), b = dp_model.get_params();
      REQUIRE(a.size() == b.size());
      if (std::string(c.preset) == "adamw" && exact()) {
        // Element-wise on the same summed gradients, by the same kernel code: the same bits.
        CHECK(same_bytes(a.data(), b.data(), a.size() * 4));
      }
      // LAMB's norms add the pieces' float64 totals in another order: a few ulps per step.
      require_close(a, b, 1e-5f);
      require_replicas_agree(a);
    }
  }

  TEST_CASE(
      "sharded AdamW over NCCL on bf16 and fp16 parameters with fp32 masters equals the "
      "unsharded optimizer, on a stream" *
      testing::needs_mpi() * testing::needs_cuda_device()) {
    // 16-bit gradients travel as 16-bit (the fake NCCL widens them to fp32, sums in rank
    // order and rounds once, as the reference below does); the owners broadcast 16-bit
    // parameters, rounded from their fp32 masters. ZeRO-2: the gradient buckets are reduced
    // to their owners.
    Communicator comm = nccl_world();
    const int ranks = comm.size(), me = comm.rank();
    const std::uint32_t seed = shared_seed();
    CAPTURE(seed);
    void* stream = nullptr;
    {
      fusedopt::CudaDeviceScope scope(0);
      stream = fusedopt::runtime::cuda::stream_create();
    }
    for (const DType d : {DType::BF16, DType::F16}) {
      CAPTURE(fusedopt::to_string(d));
      auto narrow = [&](const std::vector<float>& v) {
        std::vector<std::uint16_t> out;
        for (float x : v) out.push_back(float_to_half(d, x));
        return out;
      };
      DeviceModel<std::uint16_t> sharded_model(d), dp_model(d);
      sharded_model.set_params(narrow(initial_params(seed)));
      dp_model.set_params(narrow(initial_params(seed)));
      ShardOptions options;
      options.stage = 2;
      options.buckets.first_bucket_bytes = 1024;
      options.buckets.bucket_bytes = 2048;
      options.optimizer.master_weights = true;
      ShardedOptimizer sharded(comm, Rule::preset("adamw"), sharded_model.groups(), options);
      Optimizer dp(Rule::preset("adamw"), dp_model.groups(), options.optimizer);
      for (int step = 0; step < 5; ++step) {
        CAPTURE(step);
        const bool poisoned = step == 2;
        std::vector<std::uint16_t> mine = narrow(rank_grads(seed, me, step));
        std::vector<float> wide(mine.size(), 0.0f);
        for (int r = 0; r < ranks; ++r) {
          const std::vector<std::uint16_t> g = narrow(rank_grads(seed, r, step));
          for (std::size_t k = 0; k < wide.size(); ++k) wide[k] += half_to_float(d, g[k]);
        }
        std::vector<std::uint16_t> sum = narrow(wide);
        if (poisoned) {
          if (me == ranks - 1) mine[1500] = float_to_half(d, NAN);  // inside w3
          sum[1500] = float_to_half(d, NAN);
        }
        sharded_model.set_grads(mine);
        dp_model.set_grads(sum);
        const std::vector<std::uint16_t> before = sharded_model.get_params();
        for (int i = static_cast<int>(kSizes.size()) - 1; i >= 0; --i)
          sharded.mark_ready(i, stream);
        CHECK(sharded.step(stream) == !poisoned);
        CHECK(dp.step_scaled(1.0f / static_cast<float>(ranks), stream) == !poisoned);
        if (poisoned) CHECK(sharded_model.get_params() == before);
      }
      const std::vector<std::uint16_t> a = sharded_model.get_params(), b = dp_model.get_params();
      REQUIRE(a.size() == b.size());
      if (exact()) CHECK(a == b);  // the same summed gradients into the same kernel code
      for (std::size_t k = 0; k < a.size(); ++k) {
        // Elsewhere, a sum in another order may round a gradient the other way: one ulp of
        // the parameter (2^-8 for bf16) at most.
        const float x = half_to_float(d, a[k]), y = half_to_float(d, b[k]);
        REQUIRE(std::fabs(x - y) <= 0.004f * (1 + std::fabs(y)));
      }
      std::vector<std::uint16_t> root = a;
      world().broadcast(root.data(), static_cast<std::int64_t>(root.size()), d, 0).wait();
      CHECK(root == a);  // every replica holds the same bits
    }
    {
      fusedopt::CudaDeviceScope scope(0);
      fusedopt::runtime::cuda::stream_destroy(stream);
    }
  }

  TEST_CASE("a sharded GradScaler step over NCCL: one verdict and one scale on every rank" *
            testing::needs_mpi() * testing::needs_cuda_device()) {
    // ZeRO-2 SGD with momentum (an update proportional to the gradient, so a wrong factor
    // shows); the reference is the unsharded optimizer under its own GradScaler.
    Communicator comm = nccl_world();
    const int ranks = comm.size(), me = comm.rank();
    const std::uint32_t seed = shared_seed();
    CAPTURE(seed);
    DeviceModel<> sharded_model, dp_model;
    sharded_model.set_params(initial_params(seed));
    dp_model.set_params(initial_params(seed));
    std::vector<ParamGroup> g_sharded = sharded_model.groups(), g_dp = dp_model.groups();
    for (auto* groups : {&g_sharded, &g_dp}) {
      for (ParamGroup& g : *groups) g.hypers = {{"lr", 0.5}, {"momentum", 0.9}};
    }
    ShardOptions options;
    options.stage = 2;
    options.buckets.first_bucket_bytes = 2048;
    options.buckets.bucket_bytes = 4096;
    ShardedOptimizer sharded(comm, Rule::preset("sgd"), g_sharded, options);
    Optimizer dp(Rule::preset("sgd"), g_dp);
    fusedopt::GradScaler::Options so;
    so.init_scale = 1024;
    so.growth_interval = 2;
    fusedopt::GradScaler scaler_sharded(so), scaler_dp(so);
    for (int step = 0; step < 5; ++step) {
      CAPTURE(step);
      const bool poisoned = step == 2;
      const double scale = scaler_sharded.scale();
      REQUIRE(scaler_dp.scale() == scale);
      std::vector<float> mine = rank_grads(seed, me, step), sum(mine.size(), 0.0f);
      for (int r = 0; r < ranks; ++r) {
        const std::vector<float> g = rank_grads(seed, r, step);
        for (std::size_t k = 0; k < sum.size(); ++k)
          sum[k] += static_cast<float>(g[k] * scale);  // in rank order, as the fake sums
      }
      for (float& x : mine) x = static_cast<float>(x * scale);
      if (poisoned) {
        if (me == ranks - 1) mine[0] = NAN;  // rank 0's shard
        sum[0] = NAN;
      }
      sharded_model.set_grads(mine);
      dp_model.set_grads(sum);
      const std::vector<float> before = sharded_model.get_params();
      CHECK(sharded.step(scaler_sharded) == !poisoned);
      CHECK(scaler_dp.step(dp, nullptr, 1.0f / static_cast<float>(ranks)) == !poisoned);
      CHECK(scaler_sharded.scale() == scaler_dp.scale());
      if (poisoned) {
        CHECK(sharded_model.get_params() == before);
        CHECK(scaler_sharded.scale() == scale / 2);
      }
      double highest = scaler_sharded.scale();
      world().all_reduce(&highest, 1, DType::F64, ReduceOp::Max).wait();
      CHECK(highest == scaler_sharded.scale());
    }
    CHECK(sharded.step_count() == dp.step_count());
    require_close(sharded_model.get_params(), dp_model.get_params(), 1e-5f);
    require_replicas_agree(sharded_model.get_params());
  }

  TEST_CASE(
      "a sharded checkpoint of device tensors loads at every world size up to W and "
      "merged into a plain Optimizer" *
      testing::needs_mpi() * testing::needs_cuda_device()) {
    // Gradients the same on every rank, so the average does not depend on the world size.
    // 4 steps at W ranks, save, one more step: the reference. Then a fresh optimizer on
    // groups of 1..W ranks (a new NCCL communicator each) loads the checkpoint and takes the
    // same step; and the checkpoint merged into one file loads into a plain device Optimizer,
    // whose step equals it too.
    const int ranks = world().size(), me = world().rank();
    const std::uint32_t seed = shared_seed();
    CAPTURE(seed);
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("fusedopt-sharded-nccl-" + std::to_string(seed));
    for (const int stage : {1, 2}) {
      for (const char* preset : {"adamw", "lamb"}) {
        CAPTURE(stage);
        CAPTURE(preset);
        const bool elementwise = std::string(preset) == "adamw";
        ShardOptions options;
        options.stage = stage;
        options.buckets.first_bucket_bytes = 2048;
        options.buckets.bucket_bytes = 4096;
        // The gradient every rank feeds at `step`, and the whole batch's sum at k ranks.
        auto grads = [&](int step) { return rank_grads(seed, 0, step); };
        auto summed = [&](int step, int k) {
          std::vector<float> g = grads(step), s = g;
          for (int r = 1; r < k; ++r) {
            for (std::size_t e = 0; e < s.size(); ++e) s[e] += g[e];
          }
          return s;
        };
        std::vector<float> saved_params, reference;
        {
          Communicator comm = nccl_world();
          DeviceModel<> model;
          model.set_params(initial_params(seed));
          ShardedOptimizer sharded(comm, Rule::preset(preset), model.groups(), options);
          sharded.set_hyper("weight_decay", 0.125, 1);  // hypers travel too
          for (int step = 0; step < 4; ++step) {
            model.set_grads(grads(step));
            REQUIRE(sharded.step());
          }
          sharded.save(dir);
          saved_params = model.get_params();
          model.set_grads(grads(4));
          REQUIRE(sharded.step());
          reference = model.get_params();
          require_replicas_agree(reference);
        }
        for (int k = 1; k <= ranks; ++k) {
          CAPTURE(k);
          MPI_Comm group = MPI_COMM_NULL;
          MPI_Comm_split(MPI_COMM_WORLD, me < k ? 0 : MPI_UNDEFINED, me, &group);
          if (group != MPI_COMM_NULL) {
            Communicator bootstrap = Communicator::mpi(&group);
            bootstrap.set_timeout(std::chrono::seconds(20));
            Communicator sub = Communicator::nccl(0, bootstrap);  // the ranks of one id
            REQUIRE(sub.size() == k);
            DeviceModel<> fresh;
            fresh.set_params(saved_params);
            ShardedOptimizer loaded(sub, Rule::preset(preset), fresh.groups(), options);
            loaded.load(dir);
            CHECK(loaded.step_count() == 4);
            CHECK(loaded.hyper("weight_decay", 1) == 0.125);
            fresh.set_grads(grads(4));
            REQUIRE(loaded.step());
            const std::vector<float> got = fresh.get_params();
            if (k == ranks && exact()) {
              // The same pieces, sums and norms as the run that saved: the same bits.
              CHECK(same_bytes(got.data(), reference.data(), got.size() * 4));
            }
            // The sum of k equal gradients times 1/k (exact for k a power of two), and
            // LAMB's norms from pieces cut elsewhere: within a few ulps.
            require_close(got, reference, 1e-6f);
            MPI_Comm_free(&group);
          }
          world().barrier().wait();
        }
        if (me == 0) {
          // One file for a plain Optimizer over the same parameters on the device.
          const std::filesystem::path merged = dir.string() + "-merged.safetensors";
          ShardedOptimizer::merge_checkpoint(dir, merged);
          DeviceModel<> plain_model;
          plain_model.set_params(saved_params);
          Optimizer plain(Rule::preset(preset), plain_model.groups());
          plain.load(merged);
          CHECK(plain.step_count() == 4);
          CHECK(plain.hyper("weight_decay", 1) == 0.125);
          plain_model.set_grads(summed(4, ranks));
          REQUIRE(plain.step_scaled(1.0f / static_cast<float>(ranks)));
          const std::vector<float> got = plain_model.get_params();
          if (elementwise && exact()) {
            CHECK(same_bytes(got.data(), reference.data(), got.size() * 4));
          }
          require_close(got, reference, 1e-6f);
          std::filesystem::remove(merged);
        }
        world().barrier().wait();
      }
    }
    if (me == 0) std::filesystem::remove_all(dir);
  }
}

}  // namespace fusedopt::testing
