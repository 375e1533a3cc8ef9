// What is not a file at a cache file's name (a symbolic link, a folder, a FIFO at an entry's or
// a lock's name): reported and removed by verify(true), clear() and remove_stale(), never
// followed, and healed by the next load or lock so that the key caches again; and a store in
// progress that a concurrent clear() must leave alone.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cache/kernel_cache.hpp"
#include "common/cache_entries.hpp"
#include "support/atomic_write.hpp"

namespace fusedopt::testing {

namespace fs = std::filesystem;
using fusedopt::cache::DiskStore;
using fusedopt::cache::KeyRecord;
using fusedopt::cache::Origin;

namespace {

void write_text(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

/// Plants a symbolic link (to `outside`), a folder holding a file and a link, and a FIFO at
/// the names of three entries' files of `store`; returns their paths.
std::vector<fs::path> plant_strays(const DiskStore& store, const fs::path& outside) {
  std::vector<fs::path> out;
  for (const char* what : {"link", "folder", "fifo"}) {
    const KeyRecord r = make_record(std::string("stray-") + what);
    const fs::path path = store.entry_path(r.key(), "so");
    fs::create_directories(path.parent_path());
    fs::permissions(path.parent_path(), fs::perms::owner_all);
    if (what == std::string("link")) {
      fs::create_symlink(outside, path);
    } else if (what == std::string("folder")) {
      fs::create_directories(path / "inner");
      write_text(path / "inner" / "file", "x");
      fs::create_symlink(outside, path / "inner" / "link");
    } else {
      REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
    }
    out.push_back(path);
  }
  return out;
}

}  // namespace

TEST_SUITE("cache") {
  TEST_CASE("a link, folder or FIFO at an entry's name is named and removed, never followed") {
    TempDir tmp;
    DiskStore store(tmp.path() / "c");
    const fs::path outside = tmp.path() / "precious";
    write_text(outside, "keep me");
    std::vector<fs::path> strays = plant_strays(store, outside);
    // (verify also names stale compiler build folders of the temporary folder: not counted.)
    auto in_cache = [&](bool remove) {
      std::vector<fusedopt::cache::BadEntry> out;
      for (auto& b : store.verify(remove)) {
        if (b.path.string().rfind(store.dir().string(), 0) == 0) out.push_back(b);
      }
      return out;
    };
    const auto bad = in_cache(false);
    REQUIRE(bad.size() == 3);
    for (const auto& b : bad) {
      CAPTURE(b.path);
      CHECK(b.reason.find("at a cache file's name, not a cache file (never followed)") !=
            std::string::npos);
    }
    for (const auto& b : in_cache(true)) CHECK(b.removed);
    for (const fs::path& p : strays) CHECK_FALSE(fs::exists(fs::symlink_status(p)));
    CHECK(in_cache(false).empty());
    // clear() removes them too, and remove_stale() (a KernelCache start, prune).
    strays = plant_strays(store, outside);
    CHECK(store.clear().leftovers.empty());
    for (const fs::path& p : strays) CHECK_FALSE(fs::exists(fs::symlink_status(p)));
    strays = plant_strays(store, outside);
    CHECK(store.remove_stale().leftovers.empty());
    for (const fs::path& p : strays) CHECK_FALSE(fs::exists(fs::symlink_status(p)));
    CHECK(fs::exists(outside));  // never followed
    CHECK(fs::file_size(outside) == 7);
  }

  TEST_CASE("a folder at an entry's or a lock's name does not keep its key from caching") {
    TempDir tmp;
    DiskStore store(tmp.path() / "c");
    const KeyRecord r = make_record("k");
    const fs::path entry = store.entry_path(r.key(), "so");
    fs::create_directories(entry / "inner");
    fs::create_directories(fs::path(entry.string() + ".lock") / "inner");
    int compiles = 0;
    auto compile = [&] {
      ++compiles;
      return binary_payload(100);
    };
    CHECK(store.get_or_compile(r, "so", compile).second == Origin::Compiled);
    CHECK(store.get_or_compile(r, "so", compile).second == Origin::Disk);
    CHECK(compiles == 1);
    CHECK(fs::is_regular_file(entry));
    CHECK(fs::is_regular_file(entry.string() + ".lock"));
  }

  TEST_CASE("clear leaves the temp file of a store in progress, and removes a dead one's") {
    TempDir tmp;
    DiskStore store(tmp.path() / "c");
    const KeyRecord r = make_record("k");
    store.store(r, "so", "x");
    const fs::path shard = store.entry_path(r.key(), "so").parent_path();
    // This process's own temp name: a store in progress.
    const fs::path live =
        shard / ("." + r.key().hex() + "." + std::to_string(::getpid()) + ".0123456789abcdef.tmp");
    write_text(live, "half");
    pid_t pid = 0;
    REQUIRE(fusedopt::support::parse_temp_name(live.filename().string(), &pid));
    const fs::path old = shard / (".x." + std::to_string(::getpid()) + ".0123456789abcdef.tmp");
    write_text(old, "old");
    set_age(old, 2 * 3600);
    store.clear();
    CHECK(fs::exists(live));
    CHECK_FALSE(fs::exists(old));
    CHECK_FALSE(fs::exists(store.entry_path(r.key(), "so")));
  }
}

}  // namespace fusedopt::testing
