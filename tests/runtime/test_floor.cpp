// bench/floor.hpp's in-place stream moves exactly the bytes it claims: every updated word is
// incremented once per run, every written word set, over every element (partial blocks and
// groups included), on both of its paths (one fused loop for 32-bit roles, groups of 32
// elements for the others).
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "floor.hpp"

TEST_SUITE_BEGIN("runtime");

using fusedopt::PassTraffic;
using fusedopt::bench::InPlaceFloor;

namespace {

PassTraffic pass(std::int64_t elements, std::vector<int> read, std::vector<int> update,
                 std::vector<int> write) {
  PassTraffic p;
  p.elements = elements;
  p.read_bits = std::move(read);
  p.update_bits = std::move(update);
  p.write_bits = std::move(write);
  return p;
}

/// Runs `floor` `runs` times, then checks each role's words against `p` (the only pass).
void check_words(InPlaceFloor& floor, const PassTraffic& p, int runs) {
  for (int r = 0; r < runs; ++r) floor.seconds();
  const std::vector<int>* kinds[3] = {&p.read_bits, &p.update_bits, &p.write_bits};
  for (int k = 1; k < 3; ++k) {
    for (std::size_t r = 0; r < kinds[k]->size(); ++r) {
      CAPTURE(k);
      CAPTURE(r);
      const std::vector<std::uint32_t>& w = floor.slot(k, r);
      const auto words = static_cast<std::size_t>((p.elements * (*kinds[k])[r] + 31) / 32);
      REQUIRE(w.size() == words);
      std::size_t wrong = 0;
      for (std::size_t j = 0; j < words; ++j) {
        const std::uint32_t want =
            k == 1 ? 1u + static_cast<std::uint32_t>(runs) : static_cast<std::uint32_t>(j);
        wrong += w[j] != want ? 1 : 0;
      }
      CHECK(wrong == 0);
    }
  }
}

}  // namespace

TEST_CASE("the in-place floor touches every word of every role, as many bytes as it says") {
  // 32-bit roles (the fused loop), a partial last block and group.
  const PassTraffic f32 = pass(10007, {32, 32}, {32, 32, 32}, {32});
  InPlaceFloor a({f32});
  CHECK(a.bytes() == 10007 * (4 * 2 + 8 * 3 + 4));
  check_words(a, f32, 3);
  // Mixed widths (the group loop): 16-bit grads, 8- and 4-bit codes.
  const PassTraffic mixed = pass(10007, {16}, {32, 8, 4}, {16});
  InPlaceFloor b({mixed});
  CHECK(b.bytes() == 10007 * 2 + 10007 * 4 * 2 + 10007 * 2 + 10007 / 2 * 2 + 10007 * 2);
  check_words(b, mixed, 2);
  // More roles than the fused loop takes: the group loop, still every word.
  const PassTraffic many = pass(5000, {32, 32, 32, 32, 32}, {32}, {});
  InPlaceFloor c({many});
  check_words(c, many, 1);
  // Two passes share the first slots of each kind: the update's words count both passes.
  InPlaceFloor d({pass(4099, {32, 32}, {}, {}), pass(4099, {32}, {32, 32}, {})});
  CHECK(d.bytes() == 4099 * 8 + 4099 * 4 + 4099 * 16);
  d.seconds();
  for (std::uint32_t w : d.slot(1, 0)) REQUIRE(w == 2u);
}

TEST_SUITE_END();
