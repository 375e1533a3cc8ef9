// What the cache takes for a loadable binary (cache/image_check.hpp): a real shared object of
// this system passes; text, a truncated ELF file and the wrong kind of ELF file do not, each
// named; and a DiskStore given the check stores none of them, drops one an older fusedopt
// stored (a miss that compiles again) and verify names it.
#include <doctest/doctest.h>
#include <link.h>

#include <fstream>
#include <iterator>
#include <string>

#include "cache/image_check.hpp"
#include "cache/kernel_cache.hpp"
#include "common/cache_entries.hpp"
#include "fusedopt/error.hpp"

namespace fusedopt::testing {

using fusedopt::cache::DiskStore;
using fusedopt::cache::image_problem;
using fusedopt::cache::KeyRecord;
using fusedopt::cache::Origin;

namespace {

/// A shared object this process has loaded (libc or whatever comes first), whole.
std::string loaded_shared_object() {
  std::string path;
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t, void* out) {
        const std::string name = info->dlpi_name ? info->dlpi_name : "";
        if (name.find(".so") == std::string::npos || name.find("vdso") != std::string::npos) {
          return 0;
        }
        *static_cast<std::string*>(out) = name;
        return 1;
      },
      &path);
  REQUIRE_FALSE(path.empty());
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void put_u16(std::string& bytes, std::size_t at, unsigned v) {
  bytes[at] = static_cast<char>(v & 0xff);
  bytes[at + 1] = static_cast<char>(v >> 8);
}

}  // namespace

TEST_SUITE("cache") {
  TEST_CASE("a real shared object is a loadable image; text and truncated ELF files are not") {
    const std::string so = loaded_shared_object();
    CHECK(image_problem("so", so) == "");
    CHECK(image_problem("bin", "anything") == "");  // a kind the check does not know
    CHECK(image_problem("so", "") == "not an ELF file: it is empty");
    CHECK(image_problem("so", "garbage\n") == "not an ELF file: 8 bytes beginning 'garbage\\x0a'");
    CHECK(image_problem("so", so.substr(0, 40)) ==
          "a truncated ELF file: 40 bytes, less than its header");
    const std::string cut = so.substr(0, so.size() / 2);
    CHECK(image_problem("so", cut).rfind("a truncated ELF file: " + std::to_string(cut.size()) +
                                             " bytes, its header tables "
                                             "end at byte ",
                                         0) == 0);
    std::string far = so;  // section headers said to start near 2^64: no wrap-around
    for (int i = 0; i < 8; ++i) far[40 + i] = static_cast<char>(i == 0 ? 0x00 : 0xff);
    CHECK(image_problem("so", far).rfind("a truncated ELF file: ", 0) == 0);
    std::string exec = so;
    put_u16(exec, 16, 2);  // ET_EXEC
    CHECK(image_problem("so", exec) == "an ELF file of type 2, not a shared object");
    CHECK(image_problem("cubin", so).find("not a CUBIN (EM_CUDA, 190)") != std::string::npos);
    std::string cubin = so;
    put_u16(cubin, 18, 190);
    CHECK(image_problem("cubin", cubin) == "");
    CHECK(image_problem("ptx", "//\n.version 8.0\n.target sm_80\n") == "");
    CHECK(image_problem("ptx", "garbage") ==
          "not PTX: 7 bytes beginning 'garbage', without a .target directive");
    // The emulator's image: 24 bytes of header (its last 8 the object's size), the object.
    std::string emu(24, '\0');
    const std::uint64_t size = so.size();
    for (int i = 0; i < 8; ++i) emu[16 + i] = static_cast<char>((size >> (8 * i)) & 0xff);
    CHECK(image_problem("emu", emu + so) == "");
    CHECK(image_problem("emu", emu + exec) ==
          "a CUDA emulator image around an ELF file of type 2, not a shared object");
    CHECK(image_problem("emu", so).rfind("not a CUDA emulator image", 0) == 0);
  }

  TEST_CASE("a store checked by image_problem refuses text, and a load drops what it refuses") {
    TempDir tmp;
    DiskStore store(tmp.path());
    const KeyRecord record = make_record("kernel", "host");
    const std::string so = loaded_shared_object();
    CHECK_THROWS_WITH_AS(
        store.store(record, "so", "not an object\n", image_problem),
        ("refusing to store cache entry " + store.entry_path(record.key(), "so").string() +
         ": not an ELF file: 14 bytes beginning 'not an o'")
            .c_str(),
        fusedopt::CacheError);
    CHECK(store.list().empty());
    // What an older fusedopt stored (unchecked): whole, so an unchecked load returns it...
    store.store(record, "so", "not an object\n");
    CHECK(store.load(record, "so") == std::optional<std::string>("not an object\n"));
    // ...verify with the check names it, and a checked load drops it: a miss, compiled again.
    const auto bad = store.verify(false, image_problem);
    REQUIRE(bad.size() == 1);
    CHECK(bad[0].reason == "not an ELF file: 14 bytes beginning 'not an o'");
    int compiles = 0;
    auto [got, origin] = store.get_or_compile(
        record, "so",
        [&] {
          ++compiles;
          return so;
        },
        image_problem);
    CHECK(compiles == 1);
    CHECK(origin == Origin::Compiled);
    CHECK(store.load(record, "so", image_problem) == std::optional<std::string>(so));
    CHECK(store.verify(false, image_problem).empty());
    // Through the KernelCache: a compile whose output the check refuses is not stored.
    fusedopt::cache::KernelCache::Options options;
    options.dir = tmp.path() / "kc";
    fusedopt::cache::KernelCache cache(options);
    const KeyRecord other = make_record("other", "host");
    CHECK_THROWS_AS(cache.get_or_compile(
                        other, "so", [] { return std::string("text"); }, image_problem),
                    fusedopt::CacheError);
    CHECK(cache.disk()->list().empty());
  }
}

}  // namespace fusedopt::testing
