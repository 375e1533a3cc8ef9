// A suite whose only case needs something absent: it runs no case, and
// tests/skip_honesty/check.cmake asserts that CTest reports it skipped, not passed.
#include <doctest/doctest.h>

#include "common/skip.hpp"

namespace {

const fusedopt::testing::Availability& absent() {
  static const fusedopt::testing::Availability a{false, "the honesty check's device is absent"};
  return a;
}

}  // namespace

TEST_SUITE("skip_honesty") {
  TEST_CASE("every case of this suite needs something absent" *
            fusedopt::testing::Requires(absent())) {
    FAIL("a case with an absent requirement ran");
  }
}
