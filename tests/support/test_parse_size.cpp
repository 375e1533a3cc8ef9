// support::parse_size, the one size parser behind FUSEDOPT_CACHE_MAX_BYTES and
// `fusedopt-cache prune --max-bytes`. It lives in the cache suite because the cache is its
// user; the suite links fusedopt::support.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "support/parse_size.hpp"

namespace fusedopt::testing {

using fusedopt::support::parse_size;

TEST_SUITE("support") {
  TEST_CASE("parse_size reads bytes and K, M, G suffixes in powers of 1024, in any case") {
    struct Case {
      const char* text;
      std::uint64_t bytes;
    };
    for (Case c : {Case{"0", 0}, Case{"12345", 12345}, Case{"7b", 7}, Case{"4K", 4096},
                   Case{"4k", 4096}, Case{"4KiB", 4096}, Case{"512m", 512ull << 20},
                   Case{"512M", 512ull << 20}, Case{"512MB", 512ull << 20},
                   Case{"512MiB", 512ull << 20}, Case{"2G", 2ull << 30}, Case{"1gib", 1ull << 30},
                   Case{" 64MB ", 64ull << 20}, Case{"16777215G", 16777215ull << 30}}) {
      CAPTURE(c.text);
      std::string problem = "untouched";
      REQUIRE(parse_size(c.text, &problem).has_value());
      CHECK(*parse_size(c.text, &problem) == c.bytes);
      CHECK(problem == "untouched");
    }
    CHECK(*parse_size("18446744073709551615") == UINT64_MAX);
  }

  TEST_CASE("parse_size refuses anything else and says why") {
    struct Case {
      const char* text;
      const char* problem;
    };
    for (Case c :
         {Case{"", "is not a size (e.g. 512M, 2G, 1048576)"},
          Case{"lots", "is not a size (e.g. 512M, 2G, 1048576)"},
          Case{"-1", "is not a size (e.g. 512M, 2G, 1048576)"},
          Case{"K", "is not a size (e.g. 512M, 2G, 1048576)"},
          Case{"1.5G", "has an unknown unit (use K, M or G)"},
          Case{"10X", "has an unknown unit (use K, M or G)"},
          Case{"12Q", "has an unknown unit (use K, M or G)"},
          Case{"1 G", "has an unknown unit (use K, M or G)"},
          Case{"5T", "has an unknown unit (use K, M or G)"},
          // A unit's "B"/"iB" after a bare number is a typo, not bytes (review #11).
          Case{"10bb", "has an unknown unit (use K, M or G)"},
          Case{"10bib", "has an unknown unit (use K, M or G)"},
          Case{"10xb", "has an unknown unit (use K, M or G)"},
          Case{"99999999999999999999", "is too large"},
          Case{"18446744073709551616", "is too large"}, Case{"17179869184G", "is too large"}}) {
      CAPTURE(c.text);
      std::string problem;
      CHECK_FALSE(parse_size(c.text, &problem).has_value());
      CHECK(problem == c.problem);
      CHECK_FALSE(parse_size(c.text).has_value());  // the reason is optional
    }
  }

}  // TEST_SUITE

}  // namespace fusedopt::testing
