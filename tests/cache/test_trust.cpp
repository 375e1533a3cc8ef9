// The cache trusts nothing it did not write: a planted or linked sub-folder is refused with
// the fix (remove it), an entry file that is not ours or is writable by others is a miss
// that is never loaded, and verify names each. A copied cache that belongs to the user loads.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "cache/kernel_cache.hpp"
#include "common/cache_entries.hpp"
#include "common/skip.hpp"
#include "fusedopt/error.hpp"

namespace fusedopt::testing {

using fusedopt::CacheError;
using fusedopt::cache::BadEntry;
using fusedopt::cache::DiskStore;
using fusedopt::cache::KernelCache;
using fusedopt::cache::KeyRecord;
using fusedopt::cache::Origin;
namespace fs = std::filesystem;

namespace {

/// The uid that plays the other user (no such account is needed: chown takes any number).
constexpr uid_t kOtherUid = 12345;

const Availability& root_availability() {
  static const Availability a = [] {
    Availability out;
    out.present = ::geteuid() == 0;
    if (!out.present) out.why = "not root: cannot give a file to another user (chown)";
    return out;
  }();
  return a;
}

/// What the other user plants: a real, well-formed entry for `record` whose payload is
/// theirs. Written by a DiskStore of its own, so the header and both hashes are correct.
std::string forged_entry(const KeyRecord& record, const std::string& ext) {
  TempDir theirs;
  DiskStore forge(theirs.path());
  forge.store(record, ext, "PLANTED payload");
  return read_file(forge.entry_path(record.key(), ext));
}

std::string sub_folder_message(const fs::path& shard, const std::string& why) {
  return "cache sub-folder " + shard.string() + " is " + why +
         ": another user may have planted entries in it, and a chmod does not remove them; "
         "delete it with `rm -rf " +
         shard.string() + "` (the cache recreates it)";
}

/// The reason verify gives for `path`, or "" when it does not name it.
std::string verify_reason(const DiskStore& store, const fs::path& path, bool remove = false) {
  for (const BadEntry& b : store.verify(remove)) {
    if (b.path == path) return b.reason;
  }
  return {};
}

/// A cache in `dir` (mode on) must compile, and hand back, its own binary for `record`.
void check_compiles_its_own(const fs::path& dir, const KeyRecord& record) {
  KernelCache cache(KernelCache::Options{dir});
  int compiles = 0;
  KernelCache::Result got = cache.get_or_compile(record, "so", [&] {
    ++compiles;
    return std::string("OURS");
  });
  CHECK(compiles == 1);
  CHECK(got.origin == Origin::Compiled);
  CHECK(*got.payload == "OURS");
}

/// Plants `bytes` as `record`'s entry in a fresh sub-folder, as the other user would.
fs::path plant_sub_folder(const DiskStore& store, const KeyRecord& record,
                          const std::string& bytes) {
  fs::path entry = store.entry_path(record.key(), "so");
  fs::create_directory(entry.parent_path());
  write_file(entry, bytes);
  ::chmod(entry.parent_path().c_str(), 0777);
  if (::geteuid() == 0) {
    REQUIRE(::chown(entry.parent_path().c_str(), kOtherUid, kOtherUid) == 0);
    REQUIRE(::chown(entry.c_str(), kOtherUid, kOtherUid) == 0);
  }
  return entry;
}

}  // namespace

TEST_SUITE("cache") {
  TEST_CASE("a planted 0777 sub-folder is refused even after chmod go-w of the cache folder") {
    fusedopt::testing::ScopedTmpdir own_tmpdir;  // verify reports build folders there
    TempDir tmp;
    fs::path dir = tmp.path() / "cache";
    DiskStore store(dir);
    KeyRecord record = make_record("kernel");
    std::string planted = forged_entry(record, "so");
    ::chmod(dir.c_str(), 0777);  // the mistake that let the other user in
    fs::path entry = plant_sub_folder(store, record, planted);
    fs::path shard = entry.parent_path();
    CHECK_THROWS_AS(DiskStore{dir}, CacheError);

    ::chmod(dir.c_str(), 0700);  // exactly what the old message told the victim to run
    std::string why = ::geteuid() == 0 ? "owned by uid 12345, not by you (uid 0)"
                                       : "writable by group or others (mode 0777)";
    CHECK_THROWS_WITH_AS(store.load(record, "so"), sub_folder_message(shard, why).c_str(),
                         CacheError);
    CHECK_THROWS_WITH_AS(store.get_or_compile(record, "so", [] { return std::string("OURS"); }),
                         sub_folder_message(shard, why).c_str(), CacheError);
    CHECK_THROWS_AS(store.store(record, "so", "OURS"), CacheError);
    CHECK(read_file(entry) == planted);  // nothing of ours went into their folder

    // The kernel cache works around the refusal: its own binary, never theirs.
    check_compiles_its_own(dir, record);
    {
      KernelCache cache(KernelCache::Options{dir});
      (void)cache.get_or_compile(record, "so", [] { return std::string("OURS"); });
      CHECK(cache.last_disk_error() == sub_folder_message(shard, why));
    }

    CHECK(verify_reason(store, shard) ==
          sub_folder_message(shard, why) + " (left in place; its contents were not examined)");
    CHECK(verify_reason(store, shard, true) != "");
    CHECK(fs::exists(entry));  // verify --remove leaves another user's folder alone
    CHECK(store.list().empty());
    CHECK(store.total_bytes() == 0);

    fs::remove_all(shard);  // the fix the message gives
    check_compiles_its_own(dir, record);
    CHECK(store.load(record, "so") == std::optional<std::string>("OURS"));
    CHECK(mode_of(shard) == 0700);
  }

  TEST_CASE("a sub-folder that is a symbolic link to another folder is refused, not followed") {
    fusedopt::testing::ScopedTmpdir own_tmpdir;  // verify reports build folders there
    TempDir tmp;
    DiskStore store(tmp.path() / "cache");
    KeyRecord record = make_record("kernel");
    fs::path entry = store.entry_path(record.key(), "so");
    fs::path elsewhere = tmp.path() / "theirs";
    fs::create_directory(elsewhere);
    ::chmod(elsewhere.c_str(), 0700);  // private and ours: the link alone is the problem
    write_file(elsewhere / entry.filename(), forged_entry(record, "so"));
    ::chmod((elsewhere / entry.filename()).c_str(), 0600);
    fs::create_directory_symlink(elsewhere, entry.parent_path());

    std::string message = sub_folder_message(entry.parent_path(), "a symbolic link, not a folder");
    CHECK_THROWS_WITH_AS(store.load(record, "so"), message.c_str(), CacheError);
    CHECK_THROWS_AS(store.store(record, "so", "OURS"), CacheError);
    CHECK(read_file(elsewhere / entry.filename()) == forged_entry(record, "so"));
    check_compiles_its_own(store.dir(), record);
    CHECK(verify_reason(store, entry.parent_path()) ==
          message + " (left in place; its contents were not examined)");

    fs::remove(entry.parent_path());
    check_compiles_its_own(store.dir(), record);
    CHECK(store.load(record, "so") == std::optional<std::string>("OURS"));
  }

  TEST_CASE("an entry file owned by another user is a miss, never loaded, and verify names it" *
            Requires(root_availability())) {
    fusedopt::testing::ScopedTmpdir own_tmpdir;  // verify reports build folders there
    TempDir tmp;
    DiskStore store(tmp.path());
    KeyRecord record = make_record("kernel");
    store.store(record, "so", "OURS");  // creates our private sub-folder
    fs::path entry = store.entry_path(record.key(), "so");
    write_file(entry, forged_entry(record, "so"));
    ::chmod(entry.c_str(), 0600);
    REQUIRE(::chown(entry.c_str(), kOtherUid, kOtherUid) == 0);

    std::string reason = verify_reason(store, entry);
    CHECK(reason.find("owned by uid 12345, not by you (uid 0): not loaded") == 0);
    CHECK(fs::exists(entry));  // verify without --remove only reports

    CHECK_FALSE(store.load(record, "so").has_value());
    CHECK_FALSE(fs::exists(entry));  // our folder, so ours to clean
    check_compiles_its_own(store.dir(), record);
    CHECK(store.load(record, "so") == std::optional<std::string>("OURS"));
  }

  TEST_CASE(
      "an entry file writable by group or others is a miss, never loaded, and verify "
      "names it") {
    fusedopt::testing::ScopedTmpdir own_tmpdir;  // verify reports build folders there
    for (mode_t mode : {mode_t{0666}, mode_t{0620}, mode_t{0602}}) {
      TempDir tmp;
      DiskStore store(tmp.path());
      KeyRecord record = make_record("kernel");
      store.store(record, "so", "OURS");
      fs::path entry = store.entry_path(record.key(), "so");
      write_file(entry, forged_entry(record, "so"));
      ::chmod(entry.c_str(), mode);
      char octal[8];
      std::snprintf(octal, sizeof octal, "%04o", static_cast<unsigned>(mode));
      INFO("mode ", octal);

      CHECK(verify_reason(store, entry)
                .find("writable by group or others (mode " + std::string(octal) +
                      "): not loaded") == 0);
      std::vector<BadEntry> removed = store.verify(true);
      REQUIRE(removed.size() == 1);
      CHECK(removed[0].removed);
      CHECK_FALSE(fs::exists(entry));

      write_file(entry, forged_entry(record, "so"));
      ::chmod(entry.c_str(), mode);
      CHECK_FALSE(store.load(record, "so").has_value());
      CHECK_FALSE(fs::exists(entry));
      check_compiles_its_own(store.dir(), record);
      CHECK(store.load(record, "so") == std::optional<std::string>("OURS"));
      CHECK(mode_of(entry) == 0600);
    }
  }

  TEST_CASE("a cache copied from a build box loads once the copy belongs to the user") {
    fusedopt::testing::ScopedTmpdir own_tmpdir;  // verify reports build folders there
    TempDir tmp;
    fs::path built = tmp.path() / "buildbox";
    KeyRecord a = make_record("a"), b = make_record("b");
    {
      DiskStore box(built);
      box.store(a, "so", "binary a");
      box.store(b, "cubin", "binary b");
    }
    fs::path here = tmp.path() / "here";
    fs::copy(built, here, fs::copy_options::recursive);
    // A plain copy under umask 022: folders 0755, files 0644. Not writable by others: fine.
    for (const auto& e : fs::recursive_directory_iterator(here)) {
      ::chmod(e.path().c_str(), e.is_directory() ? 0755 : 0644);
    }
    ::chmod(here.c_str(), 0755);
    if (::geteuid() == 0) {
      // As copied by another account: refused (folder and entries) until it is chown'ed.
      REQUIRE(::chown(here.c_str(), kOtherUid, kOtherUid) == 0);
      for (const auto& e : fs::recursive_directory_iterator(here)) {
        REQUIRE(::chown(e.path().c_str(), kOtherUid, kOtherUid) == 0);
      }
      CHECK_THROWS_AS(DiskStore{here}, CacheError);
      REQUIRE(::chown(here.c_str(), ::geteuid(), ::getegid()) == 0);
      for (const auto& e : fs::recursive_directory_iterator(here)) {
        REQUIRE(::chown(e.path().c_str(), ::geteuid(), ::getegid()) == 0);
      }
    }
    DiskStore store(here);
    CHECK(store.verify().empty());
    CHECK(store.load(a, "so") == std::optional<std::string>("binary a"));
    CHECK(store.load(b, "cubin") == std::optional<std::string>("binary b"));
    CHECK(store.list().size() == 2);
  }
}  // TEST_SUITE

}  // namespace fusedopt::testing
