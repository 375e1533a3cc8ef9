// A suite that lies: one case prints the skip marker and then fails, beside a case skipped
// because what it needs is absent. tests/skip_honesty/check.cmake asserts that CTest
// reports it failed.
#include <doctest/doctest.h>

#include <cstdio>

#include "common/skip.hpp"

namespace {

const fusedopt::testing::Availability& absent() {
  static const fusedopt::testing::Availability a{false, "the honesty check's device is absent"};
  return a;
}

}  // namespace

TEST_SUITE("skip_honesty") {
  TEST_CASE("a case whose requirement is absent is skipped" *
            fusedopt::testing::Requires(absent())) {
    FAIL("a case with an absent requirement ran");
  }

  TEST_CASE("a case that prints the skip marker and then fails is a failure") {
    std::printf("[SKIP] no CUDA device: printed by a case that goes on to fail\n");
    MESSAGE("[SKIP] no CUDA device");
    CHECK(1 + 1 == 3);
  }
}
