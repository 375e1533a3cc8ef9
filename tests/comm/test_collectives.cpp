// The Communicator over MPI, run by CTest under mpiexec at 1, 2, 3 and 4 ranks: every
// collective against a reference each rank computes by hand in float64 from the shared
// seed (it can regenerate every rank's data), fp16 and bf16 reductions rounded once, a plan
// mismatch is a CommError on every rank, a stalled rank is a CommError on the others
// within the deadline, and bad arguments are clear errors.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/comm_requirements.hpp"
#include "common/comm_world.hpp"
#include "fusedopt/comm.hpp"
#include "support/half.hpp"

using fusedopt::DType;
using fusedopt::UsageError;
using fusedopt::comm::CommError;
using fusedopt::comm::Communicator;
using fusedopt::comm::ReduceOp;
using fusedopt::comm::Work;
namespace half = fusedopt::support;

namespace fusedopt::testing {
namespace {

/// Rank r's `n` values for the seed: normal, with a few exact small integers mixed in.
std::vector<double> rank_values(std::uint32_t seed, int r, std::int64_t n) {
  std::mt19937 rng(seed * 7919u + static_cast<std::uint32_t>(r));
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = normal(rng);
  return v;
}

/// `x` as stored in `d` and read back.
double stored(double x, DType d) {
  const auto f = static_cast<float>(x);
  switch (d) {
    case DType::F32:
      return f;
    case DType::BF16:
      return half::bf16_to_float(half::float_to_bf16(f));
    case DType::F16:
      return half::f16_to_float(half::float_to_f16(f));
    case DType::F64:
      return x;
    case DType::U8:
      break;  // not a gradient dtype
  }
  return f;
}

/// Host buffer of `d` elements.
struct Buffer {
  DType dtype;
  std::vector<unsigned char> bytes;
  Buffer(DType d, std::int64_t n)
      : dtype(d),
        bytes(static_cast<std::size_t>(n) * static_cast<std::size_t>(fusedopt::dtype_size(d))) {}
  void* data() { return bytes.data(); }
  void set(std::int64_t i, double x) {
    const auto f = static_cast<float>(x);
    if (dtype == DType::F32) {
      std::memcpy(bytes.data() + 4 * i, &f, 4);
    } else {
      const std::uint16_t h = dtype == DType::BF16 ? half::float_to_bf16(f) : half::float_to_f16(f);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
  }
  double get(std::int64_t i) const {
    if (dtype == DType::F32) {
      float f;
      std::memcpy(&f, bytes.data() + 4 * i, 4);
      return f;
    }
    std::uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    return dtype == DType::BF16 ? half::bf16_to_float(h) : half::f16_to_float(h);
  }
};

/// The tolerance of a reduction over `n` ranks stored in `d` (fp32 accumulation, one
/// rounding to the storage type per combine).
double tolerance(DType d, int n) {
  const double eps = d == DType::F32 ? 6e-8 : d == DType::BF16 ? 4e-3 : 5e-4;
  return 4.0 * n * eps;
}

}  // namespace

TEST_SUITE("comm") {
  TEST_CASE("all_reduce sums and maxes fp32, bf16 and fp16 like a float64 reference") {
    Communicator& comm = world();
    const int n = comm.size();
    const std::uint32_t seed = shared_seed();
    for (DType d : {DType::F32, DType::BF16, DType::F16}) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
        CAPTURE(fusedopt::to_string(d));
        CAPTURE(op == ReduceOp::Sum);
        const std::int64_t count = 1000 + 37 * n;
        Buffer b(d, count);
        const std::vector<double> mine = rank_values(seed, comm.rank(), count);
        for (std::int64_t i = 0; i < count; ++i) b.set(i, mine[static_cast<std::size_t>(i)]);
        comm.all_reduce(b.data(), count, d, op).wait();
        std::vector<double> want(static_cast<std::size_t>(count),
                                 op == ReduceOp::Sum ? 0.0 : -1e300);
        for (int r = 0; r < n; ++r) {
          const std::vector<double> v = rank_values(seed, r, count);
          for (std::int64_t i = 0; i < count; ++i) {
            const double x = stored(v[static_cast<std::size_t>(i)], d);
            auto& w = want[static_cast<std::size_t>(i)];
            w = op == ReduceOp::Sum ? w + x : std::max(w, x);
          }
        }
        for (std::int64_t i = 0; i < count; ++i) {
          const double w = want[static_cast<std::size_t>(i)];
          if (op == ReduceOp::Max) {
            REQUIRE(b.get(i) == stored(w, d));  // a max is exact
          } else {
            REQUIRE(std::fabs(b.get(i) - w) <= tolerance(d, n) * (1 + std::fabs(w)) * 4);
          }
        }
      }
    }
  }

  TEST_CASE("reduce gives each root the reduction and leaves the other ranks' data alone") {
    Communicator& comm = world();
    const int n = comm.size();
    const std::uint32_t seed = shared_seed();
    for (DType d : {DType::F32, DType::BF16}) {
      for (int root = 0; root < n; ++root) {
        CAPTURE(fusedopt::to_string(d));
        CAPTURE(root);
        const std::int64_t count = 517 + root;
        Buffer b(d, count);
        const std::vector<double> mine = rank_values(seed + 3u * root, comm.rank(), count);
        for (std::int64_t i = 0; i < count; ++i) b.set(i, mine[static_cast<std::size_t>(i)]);
        const std::vector<unsigned char> before = b.bytes;
        comm.reduce(b.data(), count, d, root).wait();
        if (comm.rank() != root) {
          CHECK(b.bytes == before);
          continue;
        }
        for (std::int64_t i = 0; i < count; ++i) {
          double w = 0;
          for (int r = 0; r < n; ++r)
            w += stored(rank_values(seed + 3u * root, r, count)[static_cast<std::size_t>(i)], d);
          REQUIRE(std::fabs(b.get(i) - w) <= tolerance(d, n) * (1 + std::fabs(w)) * 4);
        }
      }
    }
    CHECK_THROWS_WITH_AS(
        comm.reduce(nullptr, 0, DType::F32, n),
        doctest::Contains(("reduce: root " + std::to_string(n) + " is not a rank").c_str()),
        fusedopt::UsageError);
  }

  TEST_CASE("float64 all_reduce sums and maxes exactly") {
    Communicator& comm = world();
    const int n = comm.size();
    // Integers and halves: every partial sum is exact in double, whatever the order.
    std::vector<double> sum(300), max(300);
    for (std::size_t i = 0; i < sum.size(); ++i) {
      sum[i] = static_cast<double>(i) * 0.5 + comm.rank() * 1e9;
      max[i] = comm.rank() == static_cast<int>(i) % n ? 1e300 : -static_cast<double>(i);
    }
    comm.all_reduce(sum.data(), static_cast<std::int64_t>(sum.size())).wait();
    comm.all_reduce(max.data(), static_cast<std::int64_t>(max.size()), ReduceOp::Max).wait();
    for (std::size_t i = 0; i < sum.size(); ++i) {
      CHECK(sum[i] == n * (static_cast<double>(i) * 0.5) + 1e9 * (n * (n - 1) / 2));
      CHECK(max[i] == 1e300);
    }
  }

  TEST_CASE("a non-finite value anywhere survives a sum and a max on every rank") {
    Communicator& comm = world();
    for (DType d : {DType::F32, DType::BF16, DType::F16}) {
      CAPTURE(fusedopt::to_string(d));
      Buffer s(d, 4), m(d, 4);
      for (int i = 0; i < 4; ++i) {
        s.set(i, 1.0);
        m.set(i, 1.0);
      }
      if (comm.rank() == comm.size() - 1) {
        s.set(1, NAN);
        m.set(1, NAN);
        s.set(2, INFINITY);
      }
      comm.all_reduce(s.data(), 4, d, ReduceOp::Sum).wait();
      comm.all_reduce(m.data(), 4, d, ReduceOp::Max).wait();
      CHECK(std::isnan(s.get(1)));
      CHECK(std::isinf(s.get(2)));
      CHECK(std::isnan(m.get(1)));
      CHECK(s.get(0) == comm.size());
    }
  }

  TEST_CASE("timeouts past 7 days are refused before they overflow a deadline") {
    Communicator& comm = world();
    const auto before = comm.timeout();
    const auto too_long = Communicator::kMaxTimeout + std::chrono::milliseconds(1);
    CHECK_THROWS_WITH_AS(comm.set_timeout(too_long), doctest::Contains("at most 604800000 ms"),
                         UsageError);
    CHECK_THROWS_WITH_AS(comm.set_timeout(std::chrono::milliseconds(0)),
                         doctest::Contains("above 0"), UsageError);
    CHECK(comm.timeout() == before);
    Work w = comm.barrier();
    CHECK_THROWS_WITH_AS(w.wait(std::chrono::milliseconds::max()),
                         doctest::Contains("at most 604800000 ms"), UsageError);
    w.wait();  // the refusal waited for nothing: the barrier still completes
  }

  TEST_CASE("reduce_scatter, all_gather and broadcast move the right blocks") {
    Communicator& comm = world();
    const int n = comm.size();
    const std::uint32_t seed = shared_seed();
    const std::int64_t block = 333;
    // reduce_scatter: rank r gets the sum of everyone's r-th block.
    std::vector<float> send(static_cast<std::size_t>(block * n)),
        recv(static_cast<std::size_t>(block));
    const std::vector<double> mine = rank_values(seed, comm.rank(), block * n);
    for (std::size_t i = 0; i < send.size(); ++i) send[i] = static_cast<float>(mine[i]);
    comm.reduce_scatter(send.data(), recv.data(), block, DType::F32).wait();
    for (std::int64_t i = 0; i < block; ++i) {
      double want = 0;
      for (int r = 0; r < n; ++r) {
        want += static_cast<float>(
            rank_values(seed, r, block * n)[static_cast<std::size_t>(comm.rank() * block + i)]);
      }
      REQUIRE(std::fabs(recv[static_cast<std::size_t>(i)] - want) <= 1e-5 * (1 + std::fabs(want)));
    }
    // all_gather: every rank's block, in rank order, exactly.
    std::vector<float> gathered(static_cast<std::size_t>(block * n));
    comm.all_gather(recv.data(), gathered.data(), block, DType::F32).wait();
    std::vector<float> everyone(static_cast<std::size_t>(block * n));
    comm.all_gather(recv.data(), everyone.data(), block, DType::F32).wait();
    CHECK(gathered == everyone);
    for (std::int64_t i = 0; i < block; ++i) {
      CHECK(gathered[static_cast<std::size_t>(comm.rank() * block + i)] ==
            recv[static_cast<std::size_t>(i)]);
    }
    // broadcast from the last rank.
    std::vector<float> b(17, static_cast<float>(comm.rank()));
    comm.broadcast(b.data(), 17, DType::F32, n - 1).wait();
    CHECK(b == std::vector<float>(17, static_cast<float>(n - 1)));
    comm.barrier().wait();
  }

  TEST_CASE("check_same passes equal plans and fails on every rank, naming the difference") {
    Communicator comm = Communicator::mpi();  // its own: a mismatch breaks it
    comm.set_timeout(std::chrono::seconds(20));
    comm.check_same("plan", "tensors 3\nsizes 10 20 30\n");
    if (comm.size() == 1) return;
    std::string plan = "tensors 3\nsizes 10 20 30\n";
    if (comm.rank() == comm.size() - 1) plan = "tensors 3\nsizes 10 21 30\n";
    try {
      comm.check_same("plan", plan);
      FAIL("check_same accepted different plans");
    } catch (const CommError& e) {
      const std::string want = "rank " + std::to_string(comm.size() - 1) +
                               " differs from rank 0: rank 0 has 'sizes 10 20 30', rank " +
                               std::to_string(comm.size() - 1) + " has 'sizes 10 21 30'";
      CHECK(e.cause() == want);
      CHECK(e.rank() == comm.rank());
      CHECK(std::string(e.what()).find("check_same(plan)") != std::string::npos);
    }
    CHECK(comm.broken());
    CHECK_THROWS_AS(comm.barrier(), CommError);
  }

  TEST_CASE("a stalled rank gives the others a CommError within the deadline, naming the call" *
            fusedopt::testing::needs_several_ranks()) {
    // Declared first: an abandoned operation still writes `x` when rank 1 joins, until the
    // communicator is destroyed.
    std::vector<float> x(1000, 1.0f);
    Communicator comm = Communicator::mpi();
    comm.set_timeout(std::chrono::seconds(20));
    REQUIRE(comm.size() > 1);
    const auto error = expect_stalled_rank_error(
        comm, [&] { return comm.all_reduce(x.data(), 1000, DType::F32); });
    if (comm.rank() == 1) {
      CHECK(x[0] == static_cast<float>(comm.size()));
    } else if (error) {
      CHECK(error->operation() == "all_reduce(sum, fp32)");
      CHECK(error->bytes() == 4000);
    }
  }

  TEST_CASE("bad arguments and absent backends are clear errors") {
    Communicator& comm = world();
    float x = 0;
    CHECK_THROWS_WITH_AS(comm.broadcast(&x, 1, DType::F32, comm.size()),
                         doctest::Contains("broadcast: root"), fusedopt::UsageError);
    CHECK_THROWS_WITH_AS(comm.all_reduce(&x, -1, DType::F32), doctest::Contains("is negative"),
                         fusedopt::UsageError);
    CHECK_THROWS_WITH_AS(comm.all_reduce(nullptr, 4, DType::F32), doctest::Contains("null buffer"),
                         fusedopt::UsageError);
    std::string why;
    CHECK_FALSE(Communicator::available("gloo", &why));
    CHECK(why == "there is no comm backend 'gloo' (mpi, nccl)");
    CHECK(Communicator::available("mpi"));
  }
}

}  // namespace fusedopt::testing
