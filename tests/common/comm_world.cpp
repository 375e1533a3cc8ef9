#include "common/comm_world.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

namespace fusedopt::testing {

fusedopt::comm::Communicator& world() {
  static fusedopt::comm::Communicator comm = [] {
    fusedopt::comm::Communicator c = fusedopt::comm::Communicator::mpi();
    c.set_timeout(std::chrono::seconds(20));
    return c;
  }();
  return comm;
}

std::uint32_t shared_seed() {
  // 24 bits travel exactly in one fp32.
  float seed = static_cast<float>(std::random_device{}() & 0xffffffu);
  world().broadcast(&seed, 1, fusedopt::DType::F32, 0).wait();
  return static_cast<std::uint32_t>(seed);
}

fusedopt::FlatArena make_arena(const std::vector<std::int64_t>& sizes) {
  fusedopt::FlatArena a;
  for (std::size_t i = 0; i < sizes.size(); ++i)
    a.add("w" + std::to_string(i), sizes[i], fusedopt::DType::F32);
  a.finalize();
  return a;
}

fusedopt::FlatArena make_shared_arena(fusedopt::comm::Communicator& comm,
                                      const std::vector<std::int64_t>& sizes) {
  fusedopt::FlatArena a;
  for (std::size_t i = 0; i < sizes.size(); ++i)
    a.add("w" + std::to_string(i), sizes[i], fusedopt::DType::F32);
  const auto shared = [&comm](std::size_t bytes) { return comm.allocate_shared(bytes); };
  a.finalize(shared, shared);
  return a;
}

std::vector<fusedopt::ParamGroup> group_of(fusedopt::FlatArena& a) {
  fusedopt::ParamGroup g;
  for (std::size_t i = 0; i < a.size(); ++i) {
    g.params.push_back(a.param(i));
    g.grads.push_back(a.grad(i));
  }
  return {g};
}

std::optional<fusedopt::comm::CommError> expect_stalled_rank_error(
    fusedopt::comm::Communicator& comm, const std::function<fusedopt::comm::Work()>& start) {
  if (comm.rank() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    start().wait();
    return std::nullopt;
  }
  const auto t0 = std::chrono::steady_clock::now();
  fusedopt::comm::Work work = start();
  std::optional<fusedopt::comm::CommError> error;
  try {
    work.wait(std::chrono::milliseconds(300));
    FAIL_CHECK(
        "the collective completed though rank 1 stalled");  // not fatal: the ranks go on together
  } catch (const fusedopt::comm::CommError& e) {
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(waited >= 0.3);
    CHECK(waited < 1.4);  // before rank 1 woke up
    CHECK(e.cause().find("not complete after 0.3 s") != std::string::npos);
    error = e;
  }
  CHECK(comm.broken());
  return error;  // `work` abandoned: it completes once rank 1 joins, before `comm` goes
}

bool runs_in_place(const fusedopt::comm::Communicator& comm) {
  const std::string t = comm.transport();
  return t.find("shared memory: 1 node") != std::string::npos &&
         t.find("hierarchical") == std::string::npos;
}

long in_place_so_far(const fusedopt::comm::Communicator& comm) {
  const std::string t = comm.transport();
  const auto end = t.find(" collective");
  const auto at = t.rfind(' ', end == std::string::npos ? 0 : end - 1);
  return end == std::string::npos || at == std::string::npos ? 0 : std::atol(t.c_str() + at + 1);
}

float grad_value(std::uint32_t seed, int r, int step, std::size_t i, std::int64_t k) {
  std::uint32_t h = seed ^ (static_cast<std::uint32_t>(r) * 0x9e3779b9u) ^
                    (static_cast<std::uint32_t>(step) * 0x85ebca6bu) ^
                    (static_cast<std::uint32_t>(i) * 0xc2b2ae35u) ^
                    static_cast<std::uint32_t>(k * 2654435761u);
  h ^= h >> 16;
  h *= 0x7feb352du;
  h ^= h >> 15;
  return (static_cast<float>(h & 0xffffff) / 16777216.0f - 0.5f) * 0.2f;
}

void fill_grads(fusedopt::FlatArena& a, std::uint32_t seed, int rank, int step) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    for (std::int64_t k = 0; k < a.grad(i).numel; ++k)
      data(a.grad(i))[k] = grad_value(seed, rank, step, i, k);
  }
}

void fill_params(fusedopt::FlatArena& a, std::uint32_t seed) {
  std::mt19937 init(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::size_t i = 0; i < a.size(); ++i) {
    for (std::int64_t k = 0; k < a.param(i).numel; ++k) data(a.param(i))[k] = normal(init);
  }
}

std::vector<float> params_of(fusedopt::FlatArena& a) {
  std::vector<float> out;
  for (std::size_t i = 0; i < a.size(); ++i)
    out.insert(out.end(), data(a.param(i)), data(a.param(i)) + a.param(i).numel);
  return out;
}

}  // namespace fusedopt::testing
