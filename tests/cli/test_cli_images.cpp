// fusedopt-cache end to end with binaries that are not loadable images: a compiler that exits
// 0 with anything but a shared object caches nothing, and an entry an older fusedopt stored
// from one is named by verify and replaced by the next load.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cache/disk_store.hpp"
#include "cache/image_check.hpp"
#include "common/run.hpp"

namespace fusedopt::testing {

namespace fs = std::filesystem;

namespace {

/// A compiler at `path` that answers --version as the real one does (so the cache key does
/// not change when it is mended) and, when `broken`, writes text where the object should go
/// and exits 0; mended, it runs the real compiler.
void write_compiler(const fs::path& path, bool broken) {
  const std::string real = "c++";
  {
    std::ofstream f(path.string() + ".new");
    f << "#!/bin/sh\n";
    f << "if [ \"$1\" = --version ]; then exec " << real << " --version; fi\n";
    if (broken) {
      f << "while [ $# -gt 0 ]; do if [ \"$1\" = -o ]; then echo 'not an object' > \"$2\"; fi; "
           "shift; done\nexit 0\n";
    } else {
      f << "exec " << real << " \"$@\"\n";
    }
  }
  fs::permissions(path.string() + ".new", fs::perms::owner_all);
  fs::rename(path.string() + ".new", path);
}

int json_int(const std::string& json, const std::string& field) {
  const std::string key = "\"" + field + "\": ";
  const std::size_t at = json.find(key);
  REQUIRE(at != std::string::npos);
  return std::stoi(json.substr(at + key.size()));
}

}  // namespace

TEST_SUITE("cli") {
  TEST_CASE("a compiler that exits 0 without a shared object caches nothing, then heals") {
    TempDir d;
    const std::string dir = (d.path() / "cache").string();
    const fs::path cxx = d.path() / "cxx";
    write_compiler(cxx, true);
    const std::vector<std::string> env = {"FUSEDOPT_HOST_CXX=" + cxx.string()};
    const std::vector<std::string> warm = {"warmup", "--preset",    "sgd", "--target",
                                           "host",   "--cache-dir", dir,   "--json"};
    CliResult bad =
        run_cli({"warmup", "--preset", "sgd", "--target", "host", "--cache-dir", dir}, env);
    INFO(bad.out, bad.err);
    CHECK(bad.code == 1);
    CHECK(bad.err.find("reported success for fusedopt_sgd.cpp, but its output is not an ELF "
                       "file: 14 bytes beginning 'not an o'; nothing was cached") !=
          std::string::npos);
    CliResult listed = run_cli({"verify", "--cache-dir", dir});
    CHECK(listed.code == 0);
    CHECK(listed.out.find("verify: 0 entries, all good") != std::string::npos);
    // Mended at the same path: the same key, compiled now and cached.
    write_compiler(cxx, false);
    CliResult good = run_cli(warm, env);
    INFO(good.out, good.err);
    REQUIRE(good.code == 0);
    CHECK(json_int(good.out, "compiled") == 1);
    CHECK(run_cli({"verify", "--cache-dir", dir}).code == 0);
  }

  TEST_CASE("verify names an entry that is not a loadable image, and the next load replaces it") {
    TempDir d;
    const std::string dir = (d.path() / "cache").string();
    const std::vector<std::string> warm = {"warmup", "--preset",    "sgd", "--target",
                                           "host",   "--cache-dir", dir,   "--json"};
    REQUIRE(run_cli(warm).code == 0);
    // What an older fusedopt stored from a compiler that exited 0 with text: a whole entry
    // (its checksum right) whose payload is no shared object.
    cache::DiskStore store(dir);
    const std::vector<cache::EntryInfo> entries = store.list();
    REQUIRE(entries.size() == 1);
    store.store(entries[0].record, entries[0].ext, "not an object\n");
    CHECK_FALSE(cache::image_problem("so", "not an object\n").empty());
    CliResult bad = run_cli({"verify", "--cache-dir", dir});
    CHECK(bad.code == 1);
    CHECK(bad.out.find("bad: " + entries[0].path.string() +
                       ": not an ELF file: 14 bytes beginning 'not an o'") != std::string::npos);
    // The next load drops it, says so, and compiles again.
    CliResult healed = run_cli(warm);
    INFO(healed.out, healed.err);
    REQUIRE(healed.code == 0);
    CHECK(json_int(healed.out, "compiled") == 1);
    CHECK(healed.err.find("dropped cache entry " + entries[0].path.string() +
                          ": not an ELF file") != std::string::npos);
    CHECK(run_cli({"verify", "--cache-dir", dir}).code == 0);
    // verify --remove removes such an entry.
    store.store(entries[0].record, entries[0].ext, "not an object\n");
    CliResult removed = run_cli({"verify", "--remove", "--cache-dir", dir});
    CHECK(removed.code == 1);
    CHECK(removed.out.find("(removed)") != std::string::npos);
    CHECK_FALSE(fs::exists(entries[0].path));
  }
}

}  // namespace fusedopt::testing
