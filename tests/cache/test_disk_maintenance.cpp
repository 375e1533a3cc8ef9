// DiskStore's maintenance operations: list, verify (naming every bad file and why), prune
// (least recently used first), clear, total_bytes, and remove_stale (what killed processes
// left: temp files, compiler build folders).
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <map>

#include "cache/kernel_cache.hpp"
#include "common/cache_entries.hpp"

namespace fusedopt::testing {

using fusedopt::cache::BadEntry;
using fusedopt::cache::DiskStore;
using fusedopt::cache::EntryInfo;
using fusedopt::cache::KeyRecord;

namespace {

std::uint64_t entry_bytes(const std::filesystem::path& path) {
  return static_cast<std::uint64_t>(std::filesystem::file_size(path));
}

std::map<std::filesystem::path, std::string> by_path(const std::vector<BadEntry>& bad) {
  std::map<std::filesystem::path, std::string> out;
  for (const BadEntry& b : bad) out[b.path] = b.reason;
  return out;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

TEST_SUITE("cache") {
  TEST_CASE("list reports every entry with its record and sizes, and skips lock and temp files") {
    TempDir tmp;
    DiskStore store(tmp.path());
    KeyRecord a = make_record("a");
    KeyRecord b = make_record("b", "host-avx2");
    store.store(a, "cubin", binary_payload(300));
    store.get_or_compile(b, "so", [] { return binary_payload(500); });  // leaves a .lock file
    write_file(store.entry_path(a.key(), "cubin").parent_path() / ".x.1.2.tmp", "partial");

    std::vector<EntryInfo> entries = store.list();
    REQUIRE(entries.size() == 2);
    std::sort(entries.begin(), entries.end(),
              [](const EntryInfo& x, const EntryInfo& y) { return x.ext < y.ext; });
    CHECK(entries[0].key == a.key());
    CHECK(entries[0].ext == "cubin");
    CHECK(entries[0].path == store.entry_path(a.key(), "cubin"));
    CHECK(entries[0].payload_bytes == 300);
    CHECK(entries[0].file_bytes == entry_bytes(entries[0].path));
    CHECK(entries[0].record.fields() == a.fields());
    CHECK(entries[0].last_used > 0);
    CHECK(entries[1].key == b.key());
    CHECK(entries[1].ext == "so");
    CHECK(entries[1].payload_bytes == 500);
    CHECK(entries[1].record.get("target") == "host-avx2");
  }

  TEST_CASE("list shows an unreadable header as an entry with an empty record") {
    TempDir tmp;
    DiskStore store(tmp.path());
    KeyRecord a = make_record("a");
    store.store(a, "so", "x");
    write_file(store.entry_path(a.key(), "so"), "garbage");
    auto entries = store.list();
    REQUIRE(entries.size() == 1);
    CHECK(entries[0].record.fields().empty());
    CHECK(entries[0].payload_bytes == 0);
    CHECK(entries[0].file_bytes == 7);
  }

  TEST_CASE("verify returns nothing for a healthy cache") {
    fusedopt::testing::ScopedTmpdir own_tmpdir;  // verify reports build folders there
    TempDir tmp;
    DiskStore store(tmp.path());
    CHECK(store.verify().empty());
    for (int i = 0; i < 5; ++i) {
      store.get_or_compile(make_record("k" + std::to_string(i)), "cubin",
                           [i] { return binary_payload(1000 + i, i); });
    }
    CHECK(store.verify().empty());
    CHECK(store.verify(true).empty());
    CHECK(store.list().size() == 5);
  }

  TEST_CASE("verify names each bad entry with its reason and removes them when asked") {
    fusedopt::testing::ScopedTmpdir own_tmpdir;  // verify reports build folders there
    TempDir tmp;
    DiskStore store(tmp.path());
    KeyRecord good = make_record("good");
    KeyRecord truncated = make_record("truncated");
    KeyRecord flipped = make_record("flipped");
    KeyRecord foreign = make_record("foreign");
    KeyRecord misplaced = make_record("misplaced");
    for (const KeyRecord* r : {&good, &truncated, &flipped, &misplaced}) {
      store.store(*r, "cubin", binary_payload(6960));
    }
    auto path = [&](const KeyRecord& r) { return store.entry_path(r.key(), "cubin"); };

    std::filesystem::resize_file(path(truncated), entry_bytes(path(truncated)) - (6960 - 812));
    std::string bytes = read_file(path(flipped));
    bytes[bytes.size() / 2 + 1000] ^= 0x40;
    write_file(path(flipped), bytes);
    std::filesystem::create_directories(path(foreign).parent_path());
    write_file(path(foreign), binary_payload(4000, 3));
    // A valid entry under another key's name: its header record hashes elsewhere.
    auto wrong_name = path(foreign);
    wrong_name.replace_filename(foreign.key().hex() + ".so");
    std::filesystem::copy_file(path(misplaced), wrong_name);
    auto shard = path(good).parent_path();
    auto stale_temp = shard / ".deadbeef.123.abc.tmp";
    auto fresh_temp = shard / ".deadbeef.124.abd.tmp";
    write_file(stale_temp, "half");
    set_age(stale_temp, 2 * 3600);
    write_file(fresh_temp, "in progress");
    auto stray = shard / "notes.txt";
    write_file(stray, "not ours");

    auto bad = by_path(store.verify());
    CHECK(bad.size() == 6);
    CHECK(bad[path(truncated)] == "truncated: payload is 812 bytes, header says 6960");
    CHECK(bad[path(flipped)] == "payload hash mismatch");
    CHECK(bad[path(foreign)] == "not a fusedopt cache entry (bad magic)");
    CHECK(bad[wrong_name] == "key mismatch: header record hashes to " + misplaced.key().hex());
    CHECK(starts_with(bad[stale_temp], "stale temp file"));
    CHECK(starts_with(bad[stray], "unexpected file name"));
    CHECK(bad.count(path(good)) == 0);
    CHECK(bad.count(fresh_temp) == 0);
    CHECK(std::filesystem::exists(path(truncated)));  // reporting alone deletes nothing

    CHECK(store.verify(true).size() == 6);
    CHECK_FALSE(std::filesystem::exists(path(truncated)));
    CHECK_FALSE(std::filesystem::exists(path(flipped)));
    CHECK_FALSE(std::filesystem::exists(path(foreign)));
    CHECK_FALSE(std::filesystem::exists(wrong_name));
    CHECK_FALSE(std::filesystem::exists(stale_temp));
    CHECK(std::filesystem::exists(fresh_temp));
    CHECK(std::filesystem::exists(stray));  // files that are not ours are never deleted
    CHECK(std::filesystem::exists(path(misplaced)));
    CHECK(store.load(good, "cubin") == std::optional<std::string>(binary_payload(6960)));

    auto after = store.verify();
    REQUIRE(after.size() == 1);
    CHECK(after[0].path == stray);
  }

  TEST_CASE("verify reports unexpected files at the top of the cache folder") {
    fusedopt::testing::ScopedTmpdir own_tmpdir;  // verify reports build folders there
    TempDir tmp;
    DiskStore store(tmp.path());
    write_file(tmp.path() / "README", "hello");
    std::filesystem::create_directory(tmp.path() / "zz");
    auto bad = by_path(store.verify(true));
    CHECK(bad.size() == 2);
    CHECK(bad.count(tmp.path() / "README") == 1);
    CHECK(starts_with(bad[tmp.path() / "zz"], "unexpected folder"));
    CHECK(std::filesystem::exists(tmp.path() / "README"));
  }

  TEST_CASE("prune removes the least recently used entries first") {
    TempDir tmp;
    DiskStore store(tmp.path());
    KeyRecord a = make_record("a");
    KeyRecord b = make_record("b");
    KeyRecord c = make_record("c");
    for (const KeyRecord* r : {&a, &b, &c}) store.store(*r, "so", binary_payload(10000));
    auto path = [&](const KeyRecord& r) { return store.entry_path(r.key(), "so"); };
    set_age(path(a), 300);
    set_age(path(b), 200);
    set_age(path(c), 100);
    REQUIRE(store.load(a, "so").has_value());  // a is now the most recently used

    std::uint64_t each = entry_bytes(path(a));
    CHECK(store.total_bytes() == 3 * each);
    CHECK(store.prune(2 * each).removed_bytes == each);
    CHECK_FALSE(std::filesystem::exists(path(b)));
    CHECK(std::filesystem::exists(path(a)));
    CHECK(std::filesystem::exists(path(c)));
    CHECK(store.total_bytes() == 2 * each);

    CHECK(store.prune(2 * each).removed_bytes == 0);  // already within the limit
    CHECK(store.prune(each).removed_bytes == each);
    CHECK_FALSE(std::filesystem::exists(path(c)));
    CHECK(std::filesystem::exists(path(a)));
    CHECK(store.prune(0).removed_bytes == each);
    CHECK(store.list().empty());
  }

  TEST_CASE("prune counts entry files only") {
    TempDir tmp;
    DiskStore store(tmp.path());
    KeyRecord a = make_record("a");
    store.get_or_compile(a, "so", [] { return binary_payload(1000); });
    auto path = store.entry_path(a.key(), "so");
    write_file(path.parent_path() / ".big.1.2.tmp", binary_payload(100000));
    CHECK(store.total_bytes() == entry_bytes(path));
    CHECK(store.prune(entry_bytes(path)).removed_bytes == 0);
    CHECK(std::filesystem::exists(path));
  }

  TEST_CASE("clear removes entries, temp and lock files and empty sub-folders") {
    TempDir tmp;
    DiskStore store(tmp.path());
    std::uint64_t expected = 0;
    for (int i = 0; i < 6; ++i) {
      KeyRecord r = make_record("k" + std::to_string(i));
      store.get_or_compile(r, "cubin", [i] { return binary_payload(777, i); });
      expected += entry_bytes(store.entry_path(r.key(), "cubin"));
    }
    auto shard = store.entry_path(make_record("k0").key(), "cubin").parent_path();
    write_file(shard / ".old.1.2.tmp", "12345");
    expected += 5;

    CHECK(store.clear().removed_bytes == expected);
    CHECK(store.list().empty());
    CHECK(store.total_bytes() == 0);
    CHECK(std::filesystem::is_directory(tmp.path()));
    CHECK(std::filesystem::is_empty(tmp.path()));
    CHECK(store.clear().removed_bytes == 0);

    // The cache still works after a clear.
    KeyRecord r = make_record("again");
    store.store(r, "so", "x");
    CHECK(store.load(r, "so") == std::optional<std::string>("x"));
  }

  TEST_CASE("clear leaves files that are not the cache's") {
    TempDir tmp;
    DiskStore store(tmp.path());
    KeyRecord r = make_record("a");
    store.store(r, "so", "x");
    auto shard = store.entry_path(r.key(), "so").parent_path();
    write_file(shard / "mine.txt", "keep me");
    write_file(tmp.path() / "README", "keep me too");
    CHECK(store.clear().leftovers.empty());  // not the cache's: left alone, not leftovers
    CHECK(std::filesystem::exists(shard / "mine.txt"));
    CHECK(std::filesystem::exists(tmp.path() / "README"));
    CHECK(store.list().empty());
  }

}  // TEST_SUITE

namespace {

/// A temp name atomic_write() makes for `pid`.
std::string temp_name(const std::string& stem, pid_t pid) {
  return "." + stem + "." + std::to_string(pid) + ".0123456789abcdef.tmp";
}

}  // namespace

TEST_SUITE("cache") {
  TEST_CASE(
      "what killed processes left (temps of dead writers, their compiler build folders) is "
      "shown by verify, and removed by remove_stale, prune, clear and a KernelCache start") {
    fusedopt::testing::ScopedTmpdir tmpdir;
    const std::filesystem::path builds = tmpdir.path();
    TempDir tmp;
    DiskStore store(tmp.path());
    const KeyRecord r = make_record("r");
    store.store(r, "so", binary_payload(100));
    const std::filesystem::path shard = store.entry_path(r.key(), "so").parent_path();
    const pid_t dead = dead_pid();
    const std::string hex = r.key().hex();
    struct Planted {
      std::filesystem::path path;
      bool stale;
    };
    auto plant = [&]() {
      std::vector<Planted> p = {
          // A dead writer's temp, two minutes old: stale. One second old: it may be another
          // host's store in progress, not yet. Ours (alive), old: in use.
          {shard / temp_name(hex, dead), true},
          {shard / temp_name(hex + "1", dead), false},
          {shard / temp_name(hex + "2", ::getpid()), false},
          // A dead process's build folder with the compiler's leftovers in it: stale. A
          // live one (ours): in use.
          {builds / ("fusedopt-build-" + std::to_string(dead) + "-Ab12Cd"), true},
          {builds / ("fusedopt-build-" + std::to_string(::getpid()) + "-Ef34Gh"), false},
          // Not ours to judge: a file, and a name of another shape.
          {builds / ("fusedopt-build-" + std::to_string(dead) + "-file00"), false},
          {builds / "fusedopt-build-x-yyyyyy", false},
      };
      write_file(p[0].path, "half an entry");
      write_file(p[1].path, "in progress");
      write_file(p[2].path, "ours");
      set_age(p[0].path, 120);
      set_age(p[2].path, 120);
      for (std::size_t k : {3u, 4u, 6u}) {
        std::filesystem::create_directories(p[k].path / "sub");
        write_file(p[k].path / "sub" / "cc1plus-tmp.s", std::string(1000, 'x'));
      }
      write_file(p[5].path, "a file");
      return p;
    };
    auto check_left = [&](const std::vector<Planted>& planted) {
      for (const Planted& p : planted) {
        CAPTURE(p.path);
        CHECK(std::filesystem::exists(p.path) == !p.stale);
      }
      CHECK(store.load(r, "so") == std::optional<std::string>(binary_payload(100)));
    };
    auto cleanup = [&](const std::vector<Planted>& planted) {
      for (const Planted& p : planted) std::filesystem::remove_all(p.path);
    };

    std::vector<Planted> planted = plant();
    auto bad = by_path(store.verify());
    CHECK(bad.size() == 2);
    CHECK(bad[planted[0].path] == "stale temp file left by process " + std::to_string(dead) +
                                      ", which is gone (an interrupted store)");
    CHECK(bad[planted[3].path] == "stale compiler build folder of process " + std::to_string(dead) +
                                      ", which is gone (1000 bytes)");
    for (const Planted& p : planted) CHECK(std::filesystem::exists(p.path));  // shown only
    const fusedopt::cache::Removal removed = store.remove_stale();
    CHECK(removed.removed_bytes == 13 + 1000);
    CHECK(removed.leftovers.empty());
    check_left(planted);
    cleanup(planted);

    planted = plant();
    (void)store.prune(1 << 30);
    check_left(planted);
    cleanup(planted);

    planted = plant();
    CHECK(store.verify(true).size() == 2);
    check_left(planted);
    cleanup(planted);

    planted = plant();
    {
      fusedopt::cache::KernelCache::Options options;
      options.dir = tmp.path();
      fusedopt::cache::KernelCache cache(options);  // its start removes them
    }
    check_left(planted);
    cleanup(planted);
  }
}

}  // namespace fusedopt::testing
