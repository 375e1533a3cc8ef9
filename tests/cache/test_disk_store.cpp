// DiskStore's read and write paths: round trips, every kind of bad entry being a deleted
// miss, atomic publish leaving no temp files, errors that name the path, and the folder
// permission rule.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <stdexcept>

#include "cache/kernel_cache.hpp"
#include "common/cache_entries.hpp"
#include "fusedopt/error.hpp"

namespace fusedopt::testing {

using fusedopt::CacheError;
using fusedopt::cache::DiskStore;
using fusedopt::cache::KeyRecord;
using fusedopt::cache::Origin;

namespace {

/// Stores one entry, damages its file with `damage`, and checks that load misses, the file
/// is gone and get_or_compile compiles again.
void check_damage_is_a_miss(const std::function<void(const std::filesystem::path&)>& damage) {
  TempDir tmp;
  DiskStore store(tmp.path());
  KeyRecord record = make_record("kernel");
  std::string payload = binary_payload(5000);
  store.store(record, "cubin", payload);
  auto path = store.entry_path(record.key(), "cubin");
  REQUIRE(std::filesystem::exists(path));

  damage(path);
  CHECK_FALSE(store.load(record, "cubin").has_value());
  CHECK_FALSE(std::filesystem::exists(path));

  store.store(record, "cubin", payload);
  damage(path);  // again, for get_or_compile's own first look
  int compiles = 0;
  auto [got, origin] = store.get_or_compile(record, "cubin", [&] {
    ++compiles;
    return payload;
  });
  CHECK(compiles == 1);
  CHECK(origin == Origin::Compiled);
  CHECK(got == payload);
  CHECK(store.load(record, "cubin") == std::optional<std::string>(payload));
}

std::string writable_message(const std::filesystem::path& dir, const char* mode) {
  return "cache folder " + dir.string() + " is writable by group or others (mode " + mode +
         "): run `chmod go-w " + dir.string() + "` or set FUSEDOPT_CACHE_DIR";
}

}  // namespace

TEST_SUITE("cache") {
  TEST_CASE("a stored entry loads back byte for byte") {
    TempDir tmp;
    DiskStore store(tmp.path());
    KeyRecord record = make_record("kernel a");
    std::string payload = binary_payload(100000);
    store.store(record, "cubin", payload);
    CHECK(store.load(record, "cubin") == std::optional<std::string>(payload));

    KeyRecord empty = make_record("kernel with an empty binary");
    store.store(empty, "so", "");
    CHECK(store.load(empty, "so") == std::optional<std::string>(""));
  }

  TEST_CASE("entries live at <dir>/<2 hex>/<32 hex>.<ext>") {
    TempDir tmp;
    DiskStore store(tmp.path());
    KeyRecord record = make_record("kernel");
    std::string hex = record.key().hex();
    CHECK(store.entry_path(record.key(), "so") == tmp.path() / hex.substr(0, 2) / (hex + ".so"));
    store.store(record, "so", "payload");
    CHECK(std::filesystem::is_regular_file(tmp.path() / hex.substr(0, 2) / (hex + ".so")));
    CHECK(mode_of(tmp.path() / hex.substr(0, 2)) == 0700);
  }

  TEST_CASE("the extension is part of the entry: a cubin is not an so") {
    TempDir tmp;
    DiskStore store(tmp.path());
    KeyRecord record = make_record("kernel");
    store.store(record, "cubin", "gpu");
    CHECK_FALSE(store.load(record, "so").has_value());
    CHECK(store.load(record, "cubin") == std::optional<std::string>("gpu"));
  }

  TEST_CASE("a second DiskStore on the same folder hits") {
    TempDir tmp;
    KeyRecord record = make_record("kernel");
    DiskStore(tmp.path()).store(record, "cubin", "binary bytes");
    DiskStore fresh(tmp.path());
    CHECK(fresh.load(record, "cubin") == std::optional<std::string>("binary bytes"));
    auto [payload, origin] = fresh.get_or_compile(record, "cubin", [&]() -> std::string {
      FAIL("compile must not run on a disk hit");
      return {};
    });
    CHECK(origin == Origin::Disk);
    CHECK(payload == "binary bytes");
  }

  TEST_CASE("a missing entry is a miss and creates no files") {
    TempDir tmp;
    DiskStore store(tmp.path());
    CHECK_FALSE(store.load(make_record("absent"), "cubin").has_value());
    CHECK(std::filesystem::is_empty(tmp.path()));
  }

  TEST_CASE("a truncated payload is a miss, the file is deleted and get_or_compile recompiles") {
    check_damage_is_a_miss([](const std::filesystem::path& path) {
      if (!std::filesystem::exists(path)) return;
      std::filesystem::resize_file(path, std::filesystem::file_size(path) - 10);
    });
  }

  TEST_CASE("an entry truncated inside its header is a miss") {
    check_damage_is_a_miss([](const std::filesystem::path& path) {
      if (!std::filesystem::exists(path)) return;
      std::filesystem::resize_file(path, 20);
    });
  }

  TEST_CASE("an empty entry file is a miss") {
    check_damage_is_a_miss([](const std::filesystem::path& path) { write_file(path, ""); });
  }

  TEST_CASE("a flipped payload byte is a miss") {
    check_damage_is_a_miss([](const std::filesystem::path& path) {
      std::string bytes = read_file(path);
      if (bytes.empty()) return;
      bytes[bytes.size() - 100] ^= 0x01;
      write_file(path, bytes);
    });
  }

  TEST_CASE("a foreign file under an entry's name is a miss") {
    check_damage_is_a_miss(
        [](const std::filesystem::path& path) { write_file(path, binary_payload(4096, 7)); });
  }

  TEST_CASE("an entry of another format version is a miss") {
    check_damage_is_a_miss([](const std::filesystem::path& path) {
      std::string bytes = read_file(path);
      if (bytes.size() < 12) return;
      bytes[8] = 99;  // the u32 version follows the 8-byte magic
      write_file(path, bytes);
    });
  }

  TEST_CASE("bytes after the payload make an entry a miss") {
    check_damage_is_a_miss([](const std::filesystem::path& path) {
      std::string bytes = read_file(path);
      if (bytes.empty()) return;
      write_file(path, bytes + "x");
    });
  }

  TEST_CASE("a header whose record belongs to another key is a miss") {
    TempDir tmp;
    DiskStore store(tmp.path());
    KeyRecord mine = make_record("mine");
    KeyRecord other = make_record("other");
    store.store(other, "cubin", "other's binary");
    auto path = store.entry_path(mine.key(), "cubin");
    std::filesystem::create_directories(path.parent_path());
    std::filesystem::copy_file(store.entry_path(other.key(), "cubin"), path);

    CHECK_FALSE(store.load(mine, "cubin").has_value());
    CHECK_FALSE(std::filesystem::exists(path));
    CHECK(store.load(other, "cubin") == std::optional<std::string>("other's binary"));
  }

  TEST_CASE("a symbolic link in place of an entry is a miss") {
    TempDir tmp;
    DiskStore store(tmp.path());
    KeyRecord record = make_record("kernel");
    store.store(record, "so", "real");
    auto path = store.entry_path(record.key(), "so");
    std::filesystem::rename(path, tmp.path() / "elsewhere");
    std::filesystem::create_symlink(tmp.path() / "elsewhere", path);
    CHECK_FALSE(store.load(record, "so").has_value());
    CHECK_FALSE(std::filesystem::is_symlink(path));
  }

  TEST_CASE("a hit refreshes the entry's modification time") {
    TempDir tmp;
    DiskStore store(tmp.path());
    KeyRecord record = make_record("kernel");
    store.store(record, "so", "x");
    auto path = store.entry_path(record.key(), "so");
    set_age(path, 3600 * 24);
    auto before = std::filesystem::last_write_time(path);
    REQUIRE(store.load(record, "so").has_value());
    CHECK(std::filesystem::last_write_time(path) > before);
  }

  TEST_CASE("store publishes a private file and leaves no temp file behind") {
    TempDir tmp;
    DiskStore store(tmp.path());
    KeyRecord record = make_record("kernel");
    store.store(record, "so", binary_payload(1000));
    store.store(record, "so", binary_payload(1000));  // replacing is fine too
    auto path = store.entry_path(record.key(), "so");
    CHECK((mode_of(path) & 077) == 0);
    int files = 0;
    for (const auto& e : std::filesystem::directory_iterator(path.parent_path())) {
      ++files;
      CHECK(e.path() == path);
    }
    CHECK(files == 1);
  }

  TEST_CASE("a store that cannot write throws a CacheError naming the path") {
    TempDir tmp;
    DiskStore store(tmp.path());
    KeyRecord record = make_record("kernel");
    auto path = store.entry_path(record.key(), "so");
    write_file(path.parent_path(), "a file where the sub-folder should be");
    try {
      store.store(record, "so", "payload");
      FAIL("store should have thrown");
    } catch (const CacheError& e) {
      std::string what = e.what();
      CHECK(what.find(path.parent_path().string()) != std::string::npos);
      CHECK(what.find("ot a directory") != std::string::npos);
    }
    CHECK_THROWS_AS(store.get_or_compile(record, "so", [] { return std::string("x"); }),
                    CacheError);
  }

  TEST_CASE("a compile that throws propagates, stores nothing and releases the lock") {
    TempDir tmp;
    DiskStore store(tmp.path());
    KeyRecord record = make_record("kernel");
    CHECK_THROWS_WITH_AS(
        store.get_or_compile(record, "cubin",
                             []() -> std::string { throw std::runtime_error("nvrtc said no"); }),
        "nvrtc said no", std::runtime_error);
    CHECK_FALSE(store.load(record, "cubin").has_value());
    // The lock was released: the next call (same process, new lock) does not block.
    auto [payload, origin] =
        store.get_or_compile(record, "cubin", [] { return std::string("ok"); });
    CHECK(payload == "ok");
    CHECK(origin == Origin::Compiled);
  }

  TEST_CASE("invalid extensions are refused") {
    TempDir tmp;
    DiskStore store(tmp.path());
    KeyRecord record = make_record("kernel");
    for (const char* ext : {"", "lock", "tmp", "a/b", "so.1", "..", "x y"}) {
      CAPTURE(ext);
      CHECK_THROWS_AS(store.store(record, ext, "x"), CacheError);
      CHECK_THROWS_AS(store.load(record, ext), CacheError);
    }
  }

  TEST_CASE("the cache folder and its missing parents are created with mode 0700") {
    TempDir tmp;
    auto dir = tmp.path() / "a" / "b" / "cache";
    DiskStore store(dir);
    CHECK(store.dir() == dir);
    CHECK(std::filesystem::is_directory(dir));
    CHECK(mode_of(tmp.path() / "a") == 0700);
    CHECK(mode_of(dir) == 0700);
    DiskStore trailing_slash(dir.string() + "/");
    CHECK(trailing_slash.dir() == dir);
  }

  TEST_CASE("a cache folder writable by everyone (0777) is refused with a fix") {
    TempDir tmp;
    auto dir = tmp.path() / "open";
    std::filesystem::create_directory(dir);
    ::chmod(dir.c_str(), 0777);
    CHECK_THROWS_WITH_AS(DiskStore{dir}, writable_message(dir, "0777").c_str(), CacheError);
  }

  TEST_CASE("a cache folder writable by its group (0770) is refused with a fix") {
    TempDir tmp;
    auto dir = tmp.path() / "group";
    std::filesystem::create_directory(dir);
    ::chmod(dir.c_str(), 0770);
    CHECK_THROWS_WITH_AS(DiskStore{dir}, writable_message(dir, "0770").c_str(), CacheError);
    ::chmod(dir.c_str(), 0750);
    CHECK_NOTHROW(DiskStore{dir});
  }

  TEST_CASE("a symbolic link to an open folder is judged by the folder it points to") {
    TempDir tmp;
    auto target = tmp.path() / "target";
    auto link = tmp.path() / "link";
    std::filesystem::create_directory(target);
    std::filesystem::create_directory_symlink(target, link);
    ::chmod(target.c_str(), 0777);
    CHECK_THROWS_WITH_AS(DiskStore{link}, writable_message(link, "0777").c_str(), CacheError);
    ::chmod(target.c_str(), 0700);
    DiskStore store(link);
    store.store(make_record("k"), "so", "via link");
    CHECK(store.load(make_record("k"), "so") == std::optional<std::string>("via link"));
  }

  TEST_CASE("a cache folder owned by another user is refused") {
    TempDir tmp;
    std::filesystem::path dir = "/";  // owned by root: someone else's unless we are root
    uid_t owner = 0;
    if (::geteuid() == 0) {
      dir = tmp.path() / "theirs";
      std::filesystem::create_directory(dir);
      owner = 65534;
      REQUIRE(::chown(dir.c_str(), owner, owner) == 0);
    }
    CHECK_THROWS_WITH_AS(
        DiskStore{dir},
        ("cache folder " + dir.string() + " is owned by uid " + std::to_string(owner) +
         ", not by you (uid " + std::to_string(::geteuid()) +
         "): use a folder you own by setting FUSEDOPT_CACHE_DIR")
            .c_str(),
        CacheError);
  }

  TEST_CASE("a cache path that is a file is refused") {
    TempDir tmp;
    write_file(tmp.path() / "file", "x");
    CHECK_THROWS_AS(DiskStore{tmp.path() / "file"}, CacheError);
    CHECK_THROWS_AS(DiskStore{tmp.path() / "file" / "below"}, CacheError);
  }

}  // TEST_SUITE

}  // namespace fusedopt::testing
