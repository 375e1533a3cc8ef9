// The shared-memory path of the MPI transport (src/comm/shm_engine.hpp), under mpiexec at 1
// to 4 ranks, on one node, with pretend nodes (FUSEDOPT_COMM_RANKS_PER_NODE: hierarchical)
// and with it off (FUSEDOPT_COMM_SHM=0): sums in a fixed order give the same bits across
// runs and between bucketed, per-gradient, whole-buffer and ZeRO (reduce-to-owner) layouts,
// equal to a reference summed by hand in that order; plain MPI agrees within fp32 rounding;
// the transport says which path it takes; a step touches no fresh page after the first.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "common/comm_requirements.hpp"
#include "common/comm_world.hpp"
#include "fusedopt/comm.hpp"
#include "support/half.hpp"

using fusedopt::DType;
using fusedopt::FlatArena;
using fusedopt::Tensor;
using fusedopt::comm::BucketOptions;
using fusedopt::comm::Communicator;
using fusedopt::comm::GradBucketer;
using fusedopt::comm::MpiOptions;
using fusedopt::comm::ReduceOp;
using fusedopt::comm::Work;
namespace half = fusedopt::support;

// Every operator new of the test program is counted (not under AddressSanitizer, which
// has its own): what a step of the comm path allocates.
#if defined(__SANITIZE_ADDRESS__)
#define FUSEDOPT_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FUSEDOPT_TEST_ASAN 1
#endif
#endif
#ifndef FUSEDOPT_TEST_ASAN
namespace {
std::atomic<long> g_allocations{0};
}
void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#endif

namespace fusedopt::testing {
namespace {

// Sizes around the engine's slices and chunks (128 KiB slots: 32768 fp32): tiny, odd,
// one chunk, several chunks with a short last one.
const std::vector<std::int64_t> kShmSizes = {1, 17, 1000, 32768, 32769, 70001, 5, 200000};

/// The pretend node size from the environment (0: one real node).
int ranks_per_node() {
  const char* v = std::getenv("FUSEDOPT_COMM_RANKS_PER_NODE");
  return v == nullptr ? 0 : std::atoi(v);
}

bool shm_off() {
  const char* v = std::getenv("FUSEDOPT_COMM_SHM");
  return v != nullptr && std::string(v) == "0";
}

/// The shared-memory path's result for values v(r) of ranks 0..n-1: each node's ranks
/// summed in rank order in fp32, then the node sums in node order.
float shm_sum(const std::vector<float>& v, int per_node) {
  const int n = static_cast<int>(v.size());
  const int k = per_node > 0 ? per_node : n;
  std::vector<float> nodes;
  for (int first = 0; first < n; first += k) {
    float s = v[static_cast<std::size_t>(first)];
    for (int r = first + 1; r < std::min(n, first + k); ++r) s += v[static_cast<std::size_t>(r)];
    nodes.push_back(s);
  }
  float total = nodes[0];
  for (std::size_t i = 1; i < nodes.size(); ++i) total += nodes[i];
  return total;
}

FlatArena arena_of(Communicator& comm, bool in_shared) {
  if (!in_shared) return make_arena(kShmSizes);
  // docs:begin shared-arena
  FlatArena a;
  for (std::size_t i = 0; i < kShmSizes.size(); ++i)
    a.add("w" + std::to_string(i), kShmSizes[i], DType::F32);
  // The gradients in a shared buffer: every rank calls this, in the same order.
  a.finalize([&comm](std::size_t bytes) { return comm.allocate_shared(bytes); });
  // docs:end shared-arena
  return a;
}

/// Every rank's gradients of one step (rank r's from grad_value), and the expected sums.
struct Case {
  std::uint32_t seed = 0;
  FlatArena arena;
  std::vector<Tensor> grads;
  std::vector<float> expected;  ///< per element of the flat order

  /// `in_shared`: the gradients in a shared buffer of `comm` (Communicator::allocate_shared).
  explicit Case(Communicator& comm, bool in_shared = false)
      : seed(shared_seed()), arena(arena_of(comm, in_shared)) {
    for (std::size_t i = 0; i < arena.size(); ++i) grads.push_back(arena.grad(i));
    std::vector<float> v(static_cast<std::size_t>(comm.size()));
    for (std::size_t i = 0; i < grads.size(); ++i) {
      for (std::int64_t k = 0; k < kShmSizes[i]; ++k) {
        for (int r = 0; r < comm.size(); ++r)
          v[static_cast<std::size_t>(r)] = grad_value(seed, r, 0, i, k);
        expected.push_back(shm_sum(v, ranks_per_node()));
      }
    }
  }
  void fill(int rank) {
    for (std::size_t i = 0; i < grads.size(); ++i) {
      for (std::int64_t k = 0; k < kShmSizes[i]; ++k)
        data(grads[i])[k] = grad_value(seed, rank, 0, i, k);
    }
  }
  /// Elements of the result that differ from the expected bits (`tolerance` 0) or by more
  /// than `tolerance`, over the gradients this rank holds the result of.
  std::int64_t wrong(const std::vector<bool>& holds, double tolerance) const {
    std::int64_t bad = 0;
    std::size_t at = 0;
    for (std::size_t i = 0; i < grads.size(); ++i) {
      for (std::int64_t k = 0; k < kShmSizes[i]; ++k, ++at) {
        if (!holds[i]) continue;
        const float got = data(grads[i])[k], want = expected[at];
        const bool ok = tolerance == 0 ? got == want : std::fabs(got - want) <= tolerance;
        if (!ok) ++bad;
      }
    }
    return bad;
  }
};

/// The checks of one gradient layout after another (bucketed twice, per gradient, whole
/// buffer, ZeRO-2's reduce to owners): the expected bits on shared memory, within fp32
/// rounding on plain MPI; the other ranks' gradients only read by a reduce.
void check_layouts(Communicator& comm, Case& c) {
  const bool shm = comm.transport().find("shared memory:") != std::string::npos;
  // Plain MPI sums in its own order: within fp32 rounding of the reference.
  const double tolerance = shm ? 0.0 : 1e-6 * comm.size();
  const std::string how =
      comm.transport() + (tolerance == 0 ? ": bit for bit" : ": within fp32 rounding");
  MESSAGE(how);
  const std::vector<bool> all(c.grads.size(), true);
  BucketOptions o;
  o.first_bucket_bytes = 4096;
  o.bucket_bytes = 300000;
  GradBucketer bucketer(comm, c.grads, o);
  for (int run = 0; run < 2; ++run) {
    CAPTURE(run);
    c.fill(comm.rank());
    for (int i = static_cast<int>(c.grads.size()) - 1; i >= 0; --i) bucketer.mark_ready(i);
    bucketer.finish();
    CHECK(c.wrong(all, tolerance) == 0);
  }
  c.fill(comm.rank());
  std::vector<Work> work;
  for (const Tensor& g : c.grads) work.push_back(comm.all_reduce(g.data, g.numel, DType::F32));
  for (Work& w : work) w.wait();
  CHECK(c.wrong(all, tolerance) == 0);
  c.fill(comm.rank());
  const auto* first = data(c.grads.front());
  const auto* last = data(c.grads.back()) + c.grads.back().numel;
  comm.all_reduce(data(c.grads.front()), last - first, DType::F32).wait();
  CHECK(c.wrong(all, tolerance) == 0);
  // ZeRO-2's layout: gradient i reduced to its owner (i mod ranks) only.
  c.fill(comm.rank());
  std::vector<int> roots;
  std::vector<bool> mine;
  for (std::size_t i = 0; i < c.grads.size(); ++i) {
    roots.push_back(static_cast<int>(i) % comm.size());
    mine.push_back(roots.back() == comm.rank());
  }
  GradBucketer zero(comm, c.grads, o, roots);
  zero.mark_all_ready();
  zero.finish();
  CHECK(c.wrong(mine, tolerance) == 0);
  // The other ranks' gradients are only read.
  std::int64_t changed = 0;
  for (std::size_t i = 0; i < c.grads.size(); ++i) {
    for (std::int64_t k = 0; k < kShmSizes[i] && !mine[i]; ++k)
      changed += data(c.grads[i])[k] != grad_value(c.seed, comm.rank(), 0, i, k);
  }
  CHECK(changed == 0);
}

}  // namespace

TEST_SUITE("comm") {
  TEST_CASE("the transport says which path it takes") {
    Communicator& comm = world();
    const std::string t = comm.transport();
    MESSAGE(t);
    if (shm_off()) {
      CHECK(t == "mpi (shared memory off: FUSEDOPT_COMM_SHM=0)");
    } else if (comm.size() == 1) {
      CHECK(t == "mpi (one rank)");
    } else if (ranks_per_node() == 1) {
      CHECK(t.find("one rank per node") != std::string::npos);
    } else {
      CHECK(t.find("mpi + shared memory") != std::string::npos);
      CHECK((t.find("hierarchical") != std::string::npos) ==
            (ranks_per_node() > 0 && ranks_per_node() < comm.size()));
    }
    MpiOptions off;
    off.shared_memory = false;
    Communicator plain = Communicator::mpi(off);
    CHECK(plain.transport() == "mpi (shared memory off: MpiOptions)");
  }

  TEST_CASE(
      "shared-memory sums have fixed bits across runs and bucketed, per-gradient, whole and ZeRO "
      "layouts") {
    Communicator& comm = world();
    Case c(comm);
    check_layouts(comm, c);
  }

  TEST_CASE("gradients in a shared buffer are reduced in place, with the slots' bits") {
    Communicator& comm = world();
    const long before = in_place_so_far(comm);
    Case c(comm, true);
    check_layouts(comm, c);
    const long ran = in_place_so_far(comm) - before;
    MESSAGE(comm.transport());
    // Bucketed twice, per gradient, whole, ZeRO: every one in place where it can be.
    if (runs_in_place(comm)) {
      CHECK(ran >= 2 * 2 + static_cast<long>(kShmSizes.size()) + 1 + 1);
    } else {
      CHECK(ran == 0);
    }
    // f64 and bf16 in a shared buffer: rank-order sums, bit for bit, as through the slots.
    const std::int64_t n = 70001;
    auto* d = static_cast<double*>(comm.allocate_shared(static_cast<std::size_t>(n) * 8));
    auto* h = static_cast<std::uint16_t*>(comm.allocate_shared(static_cast<std::size_t>(n) * 2));
    for (std::int64_t k = 0; k < n; ++k) {
      d[k] = 1.0 / (3.0 + static_cast<double>(k % 97)) + comm.rank() * 1e-3;
      h[k] = half::float_to_bf16(grad_value(c.seed, comm.rank(), 1, 0, k));
    }
    comm.all_reduce(d, n).wait();
    comm.all_reduce(h, n, DType::BF16).wait();
    std::int64_t bad = 0;
    const bool exact = comm.transport().find("shared memory:") != std::string::npos;
    for (std::int64_t k = 0; k < n; ++k) {
      double want = 1.0 / (3.0 + static_cast<double>(k % 97));
      float want_h = half::bf16_to_float(half::float_to_bf16(grad_value(c.seed, 0, 1, 0, k)));
      float size_h = std::fabs(want_h);  // the sum of the magnitudes: rounding's scale
      for (int r = 1; r < comm.size(); ++r) {
        want += 1.0 / (3.0 + static_cast<double>(k % 97)) + r * 1e-3;
        const float v = half::bf16_to_float(half::float_to_bf16(grad_value(c.seed, r, 1, 0, k)));
        want_h += v;
        size_h += std::fabs(v);
      }
      const float got_h = half::bf16_to_float(h[k]);
      const float round_h = half::bf16_to_float(half::float_to_bf16(want_h));
      // One node's shared memory sums in rank order in fp32 and rounds once: the same bits.
      // Elsewhere (plain MPI, pretend nodes) partial sums round too.
      const bool same = exact && ranks_per_node() == 0;
      if (same ? (d[k] != want || got_h != round_h)
               : (std::fabs(d[k] - want) > 1e-12 || std::fabs(got_h - round_h) > 0.02f * size_h))
        ++bad;
    }
    CHECK(bad == 0);
    // A broadcast in place: the root writes its buffer again as soon as its wait returns, and
    // the others still hold its first values (its broadcast ends after their copies).
    const std::int64_t m = std::int64_t{3} << 20;  // 12 MiB: two chunks
    auto* b = static_cast<float*>(comm.allocate_shared(static_cast<std::size_t>(m) * 4));
    const int root = comm.size() - 1;
    for (std::int64_t k = 0; k < m; ++k)
      b[k] = comm.rank() == root ? static_cast<float>(k % 1000) : -1.0f;
    comm.broadcast(b, m, DType::F32, root).wait();
    if (comm.rank() == root) std::fill(b, b + m, -2.0f);
    std::int64_t wrong_b = 0;
    for (std::int64_t k = 0; k < m && comm.rank() != root; ++k)
      wrong_b += b[k] != static_cast<float>(k % 1000);
    CHECK(wrong_b == 0);
  }

  TEST_CASE("ranks that reduce different ranges of a shared buffer get an error, not a hang" *
            fusedopt::testing::needs_in_place_collectives()) {
    Communicator comm = Communicator::mpi();
    comm.set_timeout(std::chrono::seconds(20));
    auto* buf = static_cast<float*>(comm.allocate_shared(4096));
    REQUIRE_MESSAGE(runs_in_place(comm), comm.transport());
    // Rank 0 reduces bytes [0, 64), the others [64, 128): they would read each other's wrong
    // range. Every rank of the node is told, naming both.
    float* mine = buf + (comm.rank() == 0 ? 0 : 16);
    try {
      comm.all_reduce(mine, 16, DType::F32).wait();
      FAIL("different ranges were reduced");
    } catch (const fusedopt::comm::CommError& e) {
      const std::string what = e.what();
      MESSAGE(what);
      CHECK(what.find("run different collectives") != std::string::npos);
      CHECK(what.find("at byte 0") != std::string::npos);
      CHECK(what.find("at byte 64") != std::string::npos);
    }
  }

  TEST_CASE("in a shared buffer, a stalled rank gives the others a CommError within the deadline" *
            fusedopt::testing::needs_several_ranks()) {
    Communicator comm = Communicator::mpi();
    comm.set_timeout(std::chrono::seconds(20));
    auto* x = static_cast<float*>(comm.allocate_shared(4000));
    REQUIRE(comm.size() > 1);
    MESSAGE(comm.transport());
    for (int k = 0; k < 1000; ++k) x[k] = 1.0f;
    expect_stalled_rank_error(comm, [&] { return comm.all_reduce(x, 1000, DType::F32); });
    if (comm.rank() == 1) CHECK(x[0] == static_cast<float>(comm.size()));
  }

  TEST_CASE("ranks that ask for shared buffers of different sizes get a usage error, all of them" *
            fusedopt::testing::needs_several_ranks()) {
    Communicator comm = Communicator::mpi();
    REQUIRE(comm.size() > 1);
    CHECK_THROWS_WITH_AS(comm.allocate_shared(comm.rank() == 0 ? 128 : 256),
                         doctest::Contains("asked for different sizes"), fusedopt::UsageError);
    // The communicator still works.
    float x = 1.0f;
    comm.all_reduce(&x, 1, DType::F32).wait();
    CHECK(x == static_cast<float>(comm.size()));
  }

  TEST_CASE("a bad shared-memory setting is an error on every rank, never a hang") {
    Communicator& comm = world();
    using fusedopt::UsageError;
    // On every rank: the value is named.
    setenv("FUSEDOPT_COMM_SHM_SLOT_KIB", "12x", 1);
    try {
      (void)Communicator::mpi();
      FAIL("FUSEDOPT_COMM_SHM_SLOT_KIB=12x was accepted");
    } catch (const UsageError& e) {
      CHECK(std::string(e.what()).find("FUSEDOPT_COMM_SHM_SLOT_KIB='12x'") != std::string::npos);
    }
    unsetenv("FUSEDOPT_COMM_SHM_SLOT_KIB");
    // On the last rank only: the others say another rank's setting is wrong.
    const bool last = comm.rank() == comm.size() - 1;
    const char* before = std::getenv("FUSEDOPT_COMM_SHM");
    const std::string saved = before ? before : "";
    if (last) setenv("FUSEDOPT_COMM_SHM", "2", 1);
    try {
      (void)Communicator::mpi();
      FAIL("FUSEDOPT_COMM_SHM=2 on one rank was accepted");
    } catch (const UsageError& e) {
      const std::string want = last ? "FUSEDOPT_COMM_SHM='2'" : "another rank's";
      CHECK(std::string(e.what()).find(want) != std::string::npos);
    }
    if (last && before) setenv("FUSEDOPT_COMM_SHM", saved.c_str(), 1);
    if (last && !before) unsetenv("FUSEDOPT_COMM_SHM");
    MpiOptions negative;
    negative.slot_kib = -1;
    CHECK_THROWS_AS((void)Communicator::mpi(negative), UsageError);
    // The job's communicator still works.
    float x = 1.0f;
    comm.all_reduce(&x, 1, DType::F32).wait();
    CHECK(x == static_cast<float>(comm.size()));
  }

  TEST_CASE("shared memory agrees with plain MPI within rounding; bf16 and f64 sum in rank order") {
    Communicator& comm = world();
    Case c(comm);
    MpiOptions off;
    off.shared_memory = false;
    Communicator plain = Communicator::mpi(off);
    plain.set_timeout(comm.timeout());
    c.fill(comm.rank());
    std::vector<float> mpi_result;
    for (const Tensor& g : c.grads) {
      plain.all_reduce(g.data, g.numel, DType::F32).wait();
      mpi_result.insert(mpi_result.end(), data(g), data(g) + g.numel);
    }
    c.fill(comm.rank());
    for (const Tensor& g : c.grads) comm.all_reduce(g.data, g.numel, DType::F32).wait();
    std::size_t at = 0;
    double worst = 0;
    for (const Tensor& g : c.grads) {
      for (std::int64_t k = 0; k < g.numel; ++k, ++at)
        worst = std::max(worst, static_cast<double>(std::fabs(data(g)[k] - mpi_result[at])));
    }
    CHECK(worst <= 1e-6 * comm.size());
    // bf16: widened, summed in fp32 in the path's order, rounded once; f64 in that order.
    const std::int64_t n = 50000;
    std::vector<std::uint16_t> b(static_cast<std::size_t>(n));
    std::vector<double> d(static_cast<std::size_t>(n));
    auto value = [&](int r, std::int64_t k) { return grad_value(c.seed, r, 1, 0, k); };
    for (std::int64_t k = 0; k < n; ++k) {
      b[static_cast<std::size_t>(k)] = half::float_to_bf16(value(comm.rank(), k));
      d[static_cast<std::size_t>(k)] = static_cast<double>(value(comm.rank(), k)) / 3.0;
    }
    comm.all_reduce(b.data(), n, DType::BF16).wait();
    comm.all_reduce(d.data(), n).wait();
    const bool shm = comm.transport().find("shared memory:") != std::string::npos;
    const bool one_node = ranks_per_node() == 0 || ranks_per_node() >= comm.size();
    std::int64_t bad_b = 0, bad_d = 0;
    for (std::int64_t k = 0; k < n; ++k) {
      float sb = 0;
      double sd = 0;
      for (int r = 0; r < comm.size(); ++r) {
        sb += half::bf16_to_float(half::float_to_bf16(value(r, k)));
        sd += static_cast<double>(value(r, k)) / 3.0;
      }
      const float got_b = half::bf16_to_float(b[static_cast<std::size_t>(k)]);
      const double got_d = d[static_cast<std::size_t>(k)];
      if (shm && one_node) {
        bad_b += got_b != half::bf16_to_float(half::float_to_bf16(sb));
        bad_d += got_d != sd;
      } else {
        bad_b += std::fabs(got_b - sb) > 0.01 * comm.size();
        bad_d += std::fabs(got_d - sd) > 1e-15 * comm.size();
      }
    }
    CHECK(bad_b == 0);
    CHECK(bad_d == 0);
  }

#ifndef FUSEDOPT_TEST_ASAN
  TEST_CASE("a bucketed step on shared memory allocates one small object per collective") {
    Communicator& comm = world();
    FlatArena arena = make_arena({300000, 1000, 200000, 17, 5000, 70001});
    std::vector<Tensor> grads;
    for (std::size_t i = 0; i < arena.size(); ++i) grads.push_back(arena.grad(i));
    BucketOptions o;
    o.first_bucket_bytes = 4096;
    o.bucket_bytes = 1 << 19;
    GradBucketer bucketer(comm, grads, o);
    auto step = [&] {
      bucketer.mark_all_ready();
      bucketer.finish();
    };
    step();
    step();  // the engine's pool of operations has grown to what a step needs
    const long before = g_allocations.load();
    for (int i = 0; i < 3; ++i) step();
    const double per_step = static_cast<double>(g_allocations.load() - before) / 3.0;
    const auto buckets = static_cast<double>(bucketer.buckets().size());
    MESSAGE(comm.transport() << ": " << per_step << " allocations per step, " << buckets
                             << " buckets");
    // Each collective's Work holds one small Pending; nothing else is allocated per step
    // (no descriptions, no scratch, no requests).
    if (comm.transport().find("shared memory:") != std::string::npos) {
      CHECK(per_step <= buckets);
    }
  }
#endif

  TEST_CASE("a bucketed step touches no fresh page after the first on shared memory") {
    Communicator& comm = world();
    FlatArena arena = make_arena({300000, 1000, 200000, 17});
    std::vector<Tensor> grads;
    for (std::size_t i = 0; i < arena.size(); ++i) grads.push_back(arena.grad(i));
    BucketOptions o;
    o.first_bucket_bytes = 4096;
    o.bucket_bytes = 1 << 20;
    GradBucketer bucketer(comm, grads, o);
    for (int step = 0; step < 4; ++step) {
      bucketer.mark_all_ready();
      bucketer.finish();
    }
    const auto s = bucketer.stats();
    MESSAGE(s.transport << ": " << s.page_faults_per_step << " page faults per step");
    CHECK(s.steps == 4);
    CHECK(s.transport == comm.transport());
    if (s.transport.find("shared memory:") != std::string::npos) CHECK(s.page_faults_per_step < 10);
  }
}

}  // namespace fusedopt::testing
