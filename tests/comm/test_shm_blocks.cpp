// reduce_scatter and all_gather over shared buffers (Communicator::allocate_shared) under
// mpiexec at 1 to 4 ranks, on one node, on pretend nodes and on plain MPI (the suites of
// test_shm.cpp): on one node they run in place (each rank reads the others' send buffers
// where they lie) with the same bits as through the slots, equal to a reference summed by
// hand in rank order; elsewhere they run as before; ranks that disagree get an error.
// Buffers that overlap other than at this rank's own block are refused everywhere; the
// own-block forms run everywhere; a stalled rank gives the others a CommError in place too.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "common/comm_requirements.hpp"
#include "common/comm_world.hpp"
#include "fusedopt/comm.hpp"

using fusedopt::DType;
using fusedopt::comm::Communicator;
using fusedopt::comm::Work;

namespace fusedopt::testing {
namespace {

/// Rank r's element k of block j of a reduce_scatter's send buffer.
float block_value(std::uint32_t seed, int r, int j, std::int64_t k) {
  return grad_value(seed, r, 1, static_cast<std::size_t>(j), k);
}

TEST_SUITE("comm") {
  TEST_CASE("reduce_scatter and all_gather from shared send buffers run in place, exactly") {
    Communicator& comm = world();
    const int w = comm.size(), me = comm.rank();
    const std::uint32_t seed = shared_seed();
    const bool one_node = runs_in_place(comm);
    // Blocks around the in-place chunks (8 MiB over the ranks): tiny, odd, several chunks.
    for (const std::int64_t block :
         {std::int64_t{1}, std::int64_t{17}, std::int64_t{32769}, std::int64_t{2500001}}) {
      CAPTURE(block);
      const auto n = static_cast<std::size_t>(block) * static_cast<std::size_t>(w);
      auto* shared = static_cast<float*>(comm.allocate_shared(n * 4));
      std::vector<float> plain(n);
      for (int j = 0; j < w; ++j) {
        for (std::int64_t k = 0; k < block; ++k)
          plain[static_cast<std::size_t>(j * block + k)] = block_value(seed, me, j, k);
      }
      std::copy(plain.begin(), plain.end(), shared);
      std::vector<float> got(static_cast<std::size_t>(block)), slots(got.size());
      const long before = in_place_so_far(comm);
      comm.reduce_scatter(shared, got.data(), block, DType::F32).wait();
      comm.reduce_scatter(plain.data(), slots.data(), block, DType::F32).wait();
      std::int64_t wrong = 0;
      for (std::int64_t k = 0; k < block; ++k) {
        float want = block_value(seed, 0, me, k);  // rank order, fp32: the engine's sum
        double size = std::fabs(want);
        for (int r = 1; r < w; ++r) {
          want += block_value(seed, r, me, k);
          size += std::fabs(block_value(seed, r, me, k));
        }
        const auto i = static_cast<std::size_t>(k);
        const bool exact = one_node || w == 1;
        if (exact ? (got[i] != want || slots[i] != want)
                  : std::fabs(got[i] - want) > 1e-6 * size || got[i] != slots[i])
          ++wrong;
      }
      CHECK(wrong == 0);
      CHECK(same_bytes(shared, plain.data(), n * 4));  // the send buffer is only read
      // all_gather from send buffers at a different offset on each rank (block `me` of this
      // rank's shared buffer), into private memory: every rank's block, exactly.
      std::vector<float> gathered(n, std::numeric_limits<float>::quiet_NaN());
      comm.all_gather(shared + me * block, gathered.data(), block, DType::F32).wait();
      std::int64_t wrong_g = 0;
      for (int j = 0; j < w; ++j) {
        for (std::int64_t k = 0; k < block; ++k)
          wrong_g +=
              gathered[static_cast<std::size_t>(j * block + k)] != block_value(seed, j, j, k);
      }
      CHECK(wrong_g == 0);
      // The in-place form (send = recv + rank x block) where the engine reads shared memory.
      if (one_node) {
        comm.all_gather(shared + me * block, shared, block, DType::F32).wait();
        for (int j = 0; j < w; ++j) {
          for (std::int64_t k = 0; k < block; ++k)
            wrong_g +=
                shared[static_cast<std::size_t>(j * block + k)] != block_value(seed, j, j, k);
        }
        CHECK(wrong_g == 0);
      }
      const long ran = in_place_so_far(comm) - before;
      CHECK(ran == (one_node ? 3 : 0));
    }
  }

  TEST_CASE("reduce_scatter and all_gather take buffers apart or at this rank's own block") {
    Communicator& comm = world();
    const int w = comm.size(), me = comm.rank();
    const std::uint32_t seed = shared_seed();
    const std::int64_t block = 33;
    const auto n = static_cast<std::size_t>(block) * static_cast<std::size_t>(w);
    std::vector<float> buf(n);
    for (int j = 0; j < w; ++j) {
      for (std::int64_t k = 0; k < block; ++k)
        buf[static_cast<std::size_t>(j * block + k)] = block_value(seed, me, j, k);
    }
    const std::vector<float> sent = buf;
    float* const b = buf.data();
    // Any other overlap is refused on every transport, before anything starts.
    const char* overlap = "overlap other than at this rank's own block";
    CHECK_THROWS_WITH_AS(comm.reduce_scatter(b, b + 1, block, DType::F32),
                         doctest::Contains(overlap), fusedopt::UsageError);
    CHECK_THROWS_WITH_AS(comm.all_gather(b + 1, b, block, DType::F32), doctest::Contains(overlap),
                         fusedopt::UsageError);
    if (w > 1) {  // another rank's block
      const std::int64_t other = (me + 1) % w * block;
      CHECK_THROWS_WITH_AS(comm.reduce_scatter(b, b + other, block, DType::F32),
                           doctest::Contains(overlap), fusedopt::UsageError);
      CHECK_THROWS_WITH_AS(comm.all_gather(b + other, b, block, DType::F32),
                           doctest::Contains(overlap), fusedopt::UsageError);
    }
    CHECK(same_bytes(b, sent.data(), n * 4));
    // The own-block forms (NCCL's in-place ones) run on every transport (plain MPI: through
    // MPI_IN_PLACE and a scratch block): block `me` becomes the rank-order sum of every rank's
    // block `me` (exact on one node, within fp32 rounding through MPI), then every rank
    // gathers every rank's sum into its buffer.
    const bool exact = runs_in_place(comm) || w == 1;
    auto sum_of = [&](int j, std::int64_t k, double* size) {
      float s = block_value(seed, 0, j, k);
      *size = std::fabs(s);
      for (int r = 1; r < w; ++r) {
        s += block_value(seed, r, j, k);
        *size += std::fabs(block_value(seed, r, j, k));
      }
      return s;
    };
    comm.reduce_scatter(b, b + me * block, block, DType::F32).wait();
    std::int64_t wrong = 0;
    for (int j = 0; j < w; ++j) {
      for (std::int64_t k = 0; k < block; ++k) {
        const auto i = static_cast<std::size_t>(j * block + k);
        double size = 0;
        const float want = j == me ? sum_of(j, k, &size) : sent[i];
        wrong += exact || j != me ? buf[i] != want : std::fabs(buf[i] - want) > 1e-6 * size;
      }
    }
    CHECK(wrong == 0);  // this rank's block summed, the others untouched
    comm.all_gather(b + me * block, b, block, DType::F32).wait();
    for (int j = 0; j < w; ++j) {
      for (std::int64_t k = 0; k < block; ++k) {
        double size = 0;
        const float want = sum_of(j, k, &size);
        const float got = buf[static_cast<std::size_t>(j * block + k)];
        wrong += exact ? got != want : std::fabs(got - want) > 1e-6 * size;
      }
    }
    CHECK(wrong == 0);
  }

  TEST_CASE("reduce_scatter and all_gather in place: a stalled rank gives the others a CommError" *
            fusedopt::testing::needs_in_place_collectives()) {
    for (const bool gather : {false, true}) {
      CAPTURE(gather);
      // Before the communicator, so it outlives it: the abandoned call below writes it when
      // rank 1 joins, as late as the communicator's end.
      std::vector<float> out;
      Communicator comm = Communicator::mpi();
      comm.set_timeout(std::chrono::seconds(20));
      const int w = comm.size(), me = comm.rank();
      const std::int64_t block = 1000;
      const auto n = static_cast<std::size_t>(block) * static_cast<std::size_t>(w);
      auto* shared = static_cast<float*>(comm.allocate_shared(n * 4));
      REQUIRE_MESSAGE(runs_in_place(comm), comm.transport());
      for (std::size_t i = 0; i < n; ++i) shared[i] = 1.0f;
      out.resize(gather ? n : static_cast<std::size_t>(block));
      expect_stalled_rank_error(comm, [&] {
        return gather ? comm.all_gather(shared + me * block, out.data(), block, DType::F32)
                      : comm.reduce_scatter(shared, out.data(), block, DType::F32);
      });
      if (me == 1) CHECK(out[0] == (gather ? 1.0f : static_cast<float>(w)));
    }
  }

  TEST_CASE("a reduce_scatter from shared memory on one rank and not another is an error" *
            fusedopt::testing::needs_in_place_collectives()) {
    Communicator comm = Communicator::mpi();
    comm.set_timeout(std::chrono::seconds(20));
    const int w = comm.size();
    auto* shared = static_cast<float*>(comm.allocate_shared(static_cast<std::size_t>(w) * 64));
    REQUIRE_MESSAGE(runs_in_place(comm), comm.transport());
    std::vector<float> plain(static_cast<std::size_t>(w) * 16, 1.0f), out(16);
    const float* send = comm.rank() == 0 ? shared : plain.data();
    try {
      comm.reduce_scatter(send, out.data(), 16, DType::F32).wait();
      FAIL("a shared and a private send buffer were reduced together");
    } catch (const fusedopt::comm::CommError& e) {
      const std::string what = e.what();
      MESSAGE(what);
      CHECK(what.find("run different collectives") != std::string::npos);
      CHECK(what.find("in place in shared buffer") != std::string::npos);
      CHECK(what.find("through the slots") != std::string::npos);
    }
  }
}

}  // namespace
}  // namespace fusedopt::testing
