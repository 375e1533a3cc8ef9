// support::parse_int_strict and parse_double_strict, the parsers of the numbers in checkpoint
// metadata and sharded-checkpoint indexes: every value the writers print reads back exactly,
// and every other spelling (spaces, '+', hex, nan, inf, out of range) is refused.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "support/parse_number.hpp"

namespace fusedopt::testing {

using fusedopt::support::parse_double_strict;
using fusedopt::support::parse_int_strict;

TEST_SUITE("io") {
  TEST_CASE("parse_int_strict reads what std::to_string writes, and nothing else") {
    std::mt19937_64 rng(std::random_device{}());
    for (int i = 0; i < 1000; ++i) {
      const auto v = static_cast<std::int64_t>(rng()) >> (rng() % 64);
      CAPTURE(v);
      REQUIRE(parse_int_strict(std::to_string(v)).has_value());
      CHECK(*parse_int_strict(std::to_string(v)) == v);
    }
    CHECK(*parse_int_strict("0") == 0);
    CHECK(*parse_int_strict("9223372036854775807") == INT64_MAX);
    CHECK(*parse_int_strict("-9223372036854775808") == INT64_MIN);
    for (const char* bad : {"", "-", "+1", " 1", "1 ", "01", "-0", "0x10", "1e3", "1.0",
                            "9223372036854775808", "-9223372036854775809", "1\n", "nan"}) {
      CAPTURE(bad);
      CHECK_FALSE(parse_int_strict(bad).has_value());
    }
  }

  TEST_CASE("parse_double_strict reads what %.17g writes exactly, and refuses other spellings") {
    std::mt19937_64 rng(std::random_device{}());
    for (int i = 0; i < 2000; ++i) {
      double x = 0;
      do {
        const std::uint64_t bits = rng();
        std::memcpy(&x, &bits, sizeof x);
      } while (!std::isfinite(x));
      char text[64];
      std::snprintf(text, sizeof text, "%.17g", x);
      CAPTURE(text);
      REQUIRE(parse_double_strict(text).has_value());
      const double y = *parse_double_strict(text);
      CHECK(std::memcmp(&x, &y, sizeof x) == 0);
    }
    CHECK(*parse_double_strict("0.001") == 0.001);
    CHECK(*parse_double_strict("-1e-08") == -1e-08);
    CHECK(*parse_double_strict(".5") == 0.5);
    CHECK(*parse_double_strict("5.") == 5.0);
    CHECK(*parse_double_strict("1.7976931348623157e+308") == std::numeric_limits<double>::max());
    for (const char* bad : {"",       "-",     ".",    "e5",  "1e",   "1e+",  "+1",       " 1",
                            "1 ",     "0x1p3", "nan",  "NaN", "inf",  "-inf", "infinity", "1e400",
                            "-1e400", "1,5",   "1.5.", "--1", "1e5x", "\t2"}) {
      CAPTURE(bad);
      CHECK_FALSE(parse_double_strict(bad).has_value());
    }
  }
}

}  // namespace fusedopt::testing
