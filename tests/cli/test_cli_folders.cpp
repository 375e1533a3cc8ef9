// fusedopt-cache's commands that only read or tidy the cache (list, verify, prune, clear)
// never create its folder: a mistyped --cache-dir is an error that names it (exit 2), and
// nothing appears on disk.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "common/run.hpp"

namespace fusedopt::testing {

TEST_SUITE("cli") {
  TEST_CASE("list, verify, prune and clear never create a cache folder that is not there") {
    TempDir d;
    const std::filesystem::path typo = d.path() / "cahce" / "deep" / "er";
    for (std::vector<std::string> args :
         std::vector<std::vector<std::string>>{{"list"},
                                               {"verify"},
                                               {"verify", "--remove"},
                                               {"prune", "--max-bytes", "1M"},
                                               {"clear"}}) {
      CAPTURE(args.front());
      args.push_back("--cache-dir");
      args.push_back(typo.string());
      CliResult r = run_cli(args);
      CHECK(r.code == 2);
      CHECK(r.err.find("cache folder " + typo.string() +
                       " does not exist: nothing was ever cached there") != std::string::npos);
      CHECK_FALSE(std::filesystem::exists(d.path() / "cahce"));
    }
    // warmup makes it.
    CHECK(run_cli({"warmup", "--preset", "sgd", "--target", "host", "--cache-dir", typo.string()})
              .code == 0);
    CHECK(run_cli({"list", "--cache-dir", typo.string()}).code == 0);
  }
}

}  // namespace fusedopt::testing
