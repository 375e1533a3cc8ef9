// support::temp_folder, where compilers' build folders go: TMPDIR as everyone reads it, an
// empty TMPDIR (or TMP, TEMP, TEMPDIR) meaning unset, and a TMPDIR that is not a folder named
// in the error.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "common/scoped_env.hpp"
#include "common/temp_dir.hpp"
#include "fusedopt/error.hpp"
#include "support/build_dirs.hpp"

namespace fusedopt::testing {

TEST_SUITE("support") {
  TEST_CASE("an empty TMPDIR means /tmp, for the compilers' build folders too") {
    TempDir d;  // before the variables change: TempDir reads them through std::filesystem
    ScopedEnv tmp("TMP", std::nullopt), temp("TEMP", std::nullopt), tempdir("TEMPDIR", "");
    std::error_code ec;
    {
      ScopedEnv empty("TMPDIR", "");
      CHECK(support::temp_folder(ec) == std::filesystem::path("/tmp"));
      CHECK_FALSE(ec);
      const std::filesystem::path dir = support::make_build_dir();
      CHECK(dir.parent_path() == std::filesystem::path("/tmp"));
      CHECK(std::filesystem::is_directory(dir));
      support::remove_build_dir(dir);
    }
    {
      ScopedEnv set("TMPDIR", d.str());
      CHECK(support::temp_folder(ec) == d.path());
      CHECK_FALSE(ec);
    }
    {
      const std::string missing = (d.path() / "no-such-folder").string();
      ScopedEnv set("TMPDIR", missing);
      CHECK(support::temp_folder(ec) == std::filesystem::path(missing));
      CHECK(ec);
      const std::string want =
          "no temporary folder for the compiler (check TMPDIR=" + missing + ")";
      CHECK_THROWS_WITH_AS(support::make_build_dir(), doctest::Contains(want.c_str()),
                           fusedopt::IoError);
    }
  }
}

}  // namespace fusedopt::testing
