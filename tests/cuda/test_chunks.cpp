// The chunk table builder, host only: exact coverage with 64-bit offsets (tensors past
// 2^31 elements, never allocated), empty tensors anywhere, group order and bad input.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <map>
#include <vector>

#include "exec/chunks.hpp"
#include "fusedopt/error.hpp"

namespace fusedopt::testing {

using fusedopt::Error;
using fusedopt::runtime::build_chunks;

namespace {

/// Every element of every tensor in exactly one chunk, no chunk crossing a tensor, each at
/// most `chunk` long and starting at a multiple of it. Checked per tensor by walking the
/// tensor's chunks in table order (they are emitted in ascending order).
void check_coverage(const std::vector<std::int64_t>& numel, const std::vector<fo_chunk>& table,
                    std::int64_t chunk) {
  std::map<int, std::int64_t> covered;  // tensor -> next uncovered element
  for (const fo_chunk& c : table) {
    REQUIRE(c.tensor >= 0);
    REQUIRE(static_cast<std::size_t>(c.tensor) < numel.size());
    const std::int64_t next = covered.count(c.tensor) ? covered[c.tensor] : 0;
    CHECK(c.begin == next);  // no gap, no overlap
    CHECK(c.begin < c.end);
    CHECK(c.end <= numel[c.tensor]);
    CHECK(c.end - c.begin <= chunk);
    CHECK(c.begin % chunk == 0);
    covered[c.tensor] = c.end;
  }
  for (std::size_t t = 0; t < numel.size(); ++t) {
    INFO("tensor " << t);
    if (numel[t] == 0) {
      CHECK(covered.count(static_cast<int>(t)) == 0);
    } else {
      CHECK(covered[static_cast<int>(t)] == numel[t]);
    }
  }
}

}  // namespace

TEST_SUITE("cuda") {
  TEST_CASE("chunk table covers tensors past 2^31 elements exactly with 64-bit offsets") {
    const std::vector<std::int64_t> numel = {3'000'000'000LL, 5, (1LL << 31) + 1};
    const std::int64_t chunk = 1 << 16;
    std::vector<fo_chunk> table = build_chunks(numel, {}, chunk);
    CHECK(table.size() == static_cast<std::size_t>((3'000'000'000LL + chunk - 1) / chunk + 1 +
                                                   ((1LL << 31) + 1 + chunk - 1) / chunk));
    check_coverage(numel, table, chunk);
    // The last chunk of the 3e9 tensor ends at 3e9 (past INT_MAX), the 2^31+1 tensor's last
    // chunk is exactly one element.
    std::int64_t max_end0 = 0;
    const fo_chunk* last2 = nullptr;
    for (const fo_chunk& c : table) {
      if (c.tensor == 0) max_end0 = std::max<std::int64_t>(max_end0, c.end);
      if (c.tensor == 2) last2 = &c;
    }
    CHECK(max_end0 == 3'000'000'000LL);
    REQUIRE(last2);
    CHECK(last2->begin == (1LL << 31));
    CHECK(last2->end == (1LL << 31) + 1);
  }

  TEST_CASE("chunk table skips empty tensors in the middle and at the end") {
    const std::vector<std::int64_t> numel = {1, 7, 1000, 65537, 0, 3, 0};
    std::vector<fo_chunk> table = build_chunks(numel, {}, 1 << 16);
    check_coverage(numel, table, 1 << 16);
    CHECK(table.size() == 6);  // 1, 7, 1000, 65536 + 1, 3
    CHECK(table.back().tensor == 5);
    CHECK(build_chunks({0, 0}, {}, 4).empty());
    CHECK(build_chunks({}, {}, 4).empty());
  }

  TEST_CASE("chunk table is ordered by group, tensor order kept within a group") {
    const std::vector<std::int64_t> numel = {10, 3, 0, 9, 4};
    const std::vector<int> group = {1, 0, 1, 1, 0};
    std::vector<fo_chunk> table = build_chunks(numel, group, 4, 2);
    check_coverage(numel, table, 4);
    std::vector<int> tensors;
    for (std::size_t i = 0; i < table.size(); ++i) {
      if (i) CHECK(table[i - 1].group <= table[i].group);
      CHECK(table[i].group == group[table[i].tensor]);
      if (tensors.empty() || tensors.back() != table[i].tensor) tensors.push_back(table[i].tensor);
    }
    CHECK(tensors == std::vector<int>{1, 4, 0, 3});
  }

  TEST_CASE("chunk table handles sizes near INT64_MAX without overflow") {
    const std::int64_t big = std::numeric_limits<std::int64_t>::max();
    const std::int64_t chunk = 1LL << 62;
    std::vector<fo_chunk> table = build_chunks({big}, {}, chunk);
    REQUIRE(table.size() == 2);
    CHECK(table[0].end == chunk);
    CHECK(table[1].begin == chunk);
    CHECK(table[1].end == big);
  }

  TEST_CASE("chunk table rejects bad input") {
    CHECK_THROWS_WITH_AS(build_chunks({4, -1}, {}, 4), "tensor 1 has a negative size (-1)", Error);
    CHECK_THROWS_WITH_AS(build_chunks({4}, {2}, 4, 2),
                         "tensor 0 is in group 2, but there are 2 groups", Error);
    CHECK_THROWS_WITH_AS(build_chunks({4}, {-1}, 4), "tensor 0 has a negative group (-1)", Error);
    CHECK_THROWS_WITH_AS(build_chunks({4, 4}, {0}, 4), "2 tensors but 1 group indices", Error);
    CHECK_THROWS_WITH_AS(build_chunks({4}, {}, 0), "chunk size 0 is below 1", Error);
  }
}

}  // namespace fusedopt::testing
