// support::atomic_write, the one atomic publish behind the disk cache, safetensors
// checkpoints and FUSEDOPT_DUMP_SOURCE: the new file or the old one, never half a file, and
// no temp file left behind, whatever fails. In the cache suite, its first user.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <cerrno>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/temp_dir.hpp"
#include "support/atomic_write.hpp"
#include "support/file_io.hpp"

namespace fusedopt::testing {

namespace fs = std::filesystem;
using fusedopt::support::atomic_write;
using fusedopt::support::AtomicWriteOptions;
using fusedopt::support::AtomicWriteResult;

namespace {

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  return names;
}

}  // namespace

TEST_SUITE("support") {
  TEST_CASE("atomic_write publishes the bytes and leaves no temp file") {
    TempDir tmp;
    fs::path target = tmp.path() / "out.bin";
    AtomicWriteOptions options;
    options.mode = 0600;
    AtomicWriteResult r = atomic_write(target, std::string("first\0bytes", 11), options);
    REQUIRE(r.ok());
    CHECK(r.published());
    CHECK(r.message(target).empty());
    CHECK(read_file(target) == std::string("first\0bytes", 11));
    CHECK(mode_of(target) == 0600);
    CHECK(names_in(tmp.path()) == std::vector<std::string>{"out.bin"});
    // The temp file was named after the target, beside it.
    CHECK(r.temp.parent_path() == tmp.path());
    CHECK(r.temp.filename().string().rfind(".out.bin.", 0) == 0);
    CHECK(r.temp.extension() == ".tmp");
  }

  TEST_CASE("atomic_write replaces an existing file whole, through a writer callback") {
    TempDir tmp;
    fs::path target = tmp.path() / "ckpt";
    write_file(target, "an older, longer file");
    AtomicWriteResult r = atomic_write(target, [](int fd) {
      return fusedopt::support::write_all(fd, "new ", 4) &&
             fusedopt::support::write_all(fd, "data", 4);
    });
    REQUIRE(r.ok());
    CHECK(read_file(target) == "new data");
    CHECK(names_in(tmp.path()) == std::vector<std::string>{"ckpt"});
  }

  TEST_CASE("a failing writer leaves the old file and removes the temp file") {
    TempDir tmp;
    fs::path target = tmp.path() / "keep";
    write_file(target, "old");
    AtomicWriteResult r = atomic_write(target, [](int fd) {
      fusedopt::support::write_all(fd, "partial", 7);
      errno = ENOSPC;
      return false;
    });
    CHECK_FALSE(r.ok());
    CHECK_FALSE(r.published());
    CHECK(std::string(r.step) == "write");
    CHECK(r.err == ENOSPC);
    CHECK(r.message(target) == "cannot write " + target.string() + " (write " + r.temp.string() +
                                   "): " + fusedopt::support::errno_text(ENOSPC));
    CHECK(read_file(target) == "old");
    CHECK(names_in(tmp.path()) == std::vector<std::string>{"keep"});
  }

  TEST_CASE("a writer that fails without setting errno still reports a failure") {
    TempDir tmp;
    AtomicWriteResult r = atomic_write(tmp.path() / "x", [](int) {
      errno = 0;
      return false;
    });
    CHECK_FALSE(r.ok());
    CHECK(r.err == EIO);
    CHECK(fs::is_empty(tmp.path()));
  }

  TEST_CASE("a throwing writer's exception passes through and the temp file is removed") {
    TempDir tmp;
    fs::path target = tmp.path() / "t";
    CHECK_THROWS_WITH_AS(
        (void)atomic_write(target, [](int) -> bool { throw std::runtime_error("boom"); }), "boom",
        std::runtime_error);
    CHECK(fs::is_empty(tmp.path()));
  }

  TEST_CASE("a missing folder is an error unless create_folder is set") {
    TempDir tmp;
    fs::path target = tmp.path() / "sub" / "file";
    AtomicWriteResult r = atomic_write(target, "x");
    CHECK(std::string(r.step) == "create");
    CHECK(r.err == ENOENT);
    CHECK(fs::is_empty(tmp.path()));

    AtomicWriteOptions options;
    options.create_folder = 0700;
    options.temp_stem = "stem";
    r = atomic_write(target, "x", options);
    REQUIRE(r.ok());
    CHECK(read_file(target) == "x");
    CHECK(mode_of(tmp.path() / "sub") == 0700);
    CHECK(r.temp.filename().string().rfind(".stem.", 0) == 0);
  }

}  // TEST_SUITE

}  // namespace fusedopt::testing
