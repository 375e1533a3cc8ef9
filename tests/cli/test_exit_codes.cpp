// fusedopt-cache keeps one table of exit codes (0 success, 1 a failed operation, 2 bad
// input) in every command, says so in every --help, and clear/prune on a read-only cache
// exit 1 naming each file they could not remove.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "common/run.hpp"

namespace fusedopt::testing {

namespace fs = std::filesystem;

namespace {

/// The uid that owns the read-only cache when the test runs as root (root ignores modes, so
/// the CLI runs as this uid; no account is needed for a bare number).
constexpr uid_t kOwnerWhenRoot = 12345;

std::vector<fs::path> files_with(const fs::path& dir, const std::string& ext) {
  std::vector<fs::path> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() == ext) out.push_back(e.path());
  }
  return out;
}

bool has(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

/// A warmed cache whose sub-folders are then made read-only (mode 0500), and the way to
/// run the CLI as its owner: as ourselves, or as kOwnerWhenRoot from a copy of the CLI it
/// can reach when we are root.
class ReadOnlyCache {
 public:
  ReadOnlyCache() {
    dir_ = tmp_.path() / "cache";
    REQUIRE(run_cli({"warmup", "--preset", "sgd,lion", "--cache-dir", dir_.string()}).code == 0);
    entries_ = files_with(dir_, ".so");
    REQUIRE(entries_.size() == 2);
    if (::geteuid() == 0) {
      fs::permissions(tmp_.path(),
                      fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
      const fs::path bin = tmp_.path() / "fusedopt-cache";
      fs::copy_file(FUSEDOPT_CACHE_CLI, bin);
      fs::permissions(bin, fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
      options_.binary = bin.string();
      options_.as_user = kOwnerWhenRoot;
      for (const auto& e : fs::recursive_directory_iterator(dir_)) {
        REQUIRE(::lchown(e.path().c_str(), kOwnerWhenRoot, kOwnerWhenRoot) == 0);
      }
      REQUIRE(::chown(dir_.c_str(), kOwnerWhenRoot, kOwnerWhenRoot) == 0);
    }
    set_shard_mode(0500);
  }
  ~ReadOnlyCache() { set_shard_mode(0700); }
  ReadOnlyCache(const ReadOnlyCache&) = delete;
  ReadOnlyCache& operator=(const ReadOnlyCache&) = delete;

  CliResult run(std::vector<std::string> args) const {
    args.push_back("--cache-dir");
    args.push_back(dir_.string());
    return run_cli(args, options_);
  }
  void set_shard_mode(mode_t mode) const {
    for (const fs::path& e : entries_) ::chmod(e.parent_path().c_str(), mode);
  }
  const std::vector<fs::path>& entries() const { return entries_; }

 private:
  TempDir tmp_;
  fs::path dir_;
  std::vector<fs::path> entries_;
  RunOptions options_;
};

struct Case {
  Case(std::vector<std::string> a, int c, std::string s, std::vector<std::string> e = {})
      : args(std::move(a)), code(c), says(std::move(s)), env(std::move(e)) {}
  std::vector<std::string> args;
  int code;
  std::string says;  // in stdout or stderr
  std::vector<std::string> env;
};

}  // namespace

TEST_SUITE("cli") {
  TEST_CASE(
      "clear and prune on a read-only cache exit 1, naming each entry they could not remove") {
    ReadOnlyCache cache;
    CliResult clear = cache.run({"clear"});
    INFO("clear: " << clear.out << clear.err);
    CHECK(clear.code == 1);
    for (const fs::path& e : cache.entries()) {
      CHECK(has(clear.err, "clear: could not remove " + e.string() + ": Permission denied"));
      CHECK(fs::exists(e));
    }
    CliResult prune = cache.run({"prune", "--max-bytes", "0"});
    INFO("prune: " << prune.out << prune.err);
    CHECK(prune.code == 1);
    CHECK(has(prune.err, "prune: could not remove " + cache.entries()[0].string()));
    CHECK(has(prune.err, "more than the 0 B asked for"));
    // Writable again, the same commands succeed.
    cache.set_shard_mode(0700);
    CHECK(cache.run({"prune", "--max-bytes", "0"}).code == 0);
    CHECK(cache.run({"clear"}).code == 0);
    for (const fs::path& e : cache.entries()) CHECK_FALSE(fs::exists(e));
  }

  TEST_CASE("verify --remove says removed only for files it deleted, and why the rest stay") {
    ReadOnlyCache cache;
    cache.set_shard_mode(0700);
    const fs::path bad = cache.entries()[0];
    fs::resize_file(bad, 200);
    // A stale temp whoever wrote it: older than the hour after which any writer is gone
    // (its pid, 999999, may belong to a live process on this host).
    const fs::path temp =
        bad.parent_path() / ("." + bad.stem().string() + ".999999.0123456789abcdef.tmp");
    { std::ofstream(temp) << "an interrupted store"; }
    const struct timespec old[2] = {{0, UTIME_OMIT}, {std::time(nullptr) - 7200, 0}};
    REQUIRE(::utimensat(AT_FDCWD, temp.c_str(), old, AT_SYMLINK_NOFOLLOW) == 0);
    if (::geteuid() == 0) REQUIRE(::lchown(temp.c_str(), kOwnerWhenRoot, kOwnerWhenRoot) == 0);
    cache.set_shard_mode(0500);
    CliResult v = cache.run({"verify", "--remove"});
    INFO("verify: " << v.out << v.err);
    CHECK(v.code == 1);
    CHECK_FALSE(has(v.out, "(removed)"));
    CHECK(has(v.out, "; could not remove it: Permission denied"));
    CliResult json = cache.run({"verify", "--remove", "--json"});
    CHECK_FALSE(has(json.out, "\"removed\": true"));
    CHECK(fs::exists(bad));
    CHECK(fs::exists(temp));
    // prune: the leftover temp is named, but the cache is under 1 GiB, in text and JSON alike.
    CliResult prune = cache.run({"prune", "--max-bytes", "1G"});
    INFO("prune: " << prune.out << prune.err);
    CHECK(prune.code == 0);
    CHECK(has(prune.err, "prune: could not remove " + temp.string()));
    CHECK_FALSE(has(prune.err, "more than the"));
    CHECK(cache.run({"prune", "--max-bytes", "1G", "--json"}).code == 0);
    cache.set_shard_mode(0700);
    CliResult again = cache.run({"verify", "--remove"});
    CHECK(has(again.out, "(removed)"));
    CHECK_FALSE(fs::exists(bad));
    CHECK_FALSE(fs::exists(temp));
  }

  TEST_CASE("clear names a sub-folder it does not trust and exits 1") {
    TempDir d;
    const fs::path dir = d.path() / "cache";
    REQUIRE(run_cli({"warmup", "--preset", "sgd", "--cache-dir", dir.string()}).code == 0);
    const fs::path planted = dir / "7d";
    fs::create_directory(planted);
    ::chmod(planted.c_str(), 0777);
    CliResult r = run_cli({"clear", "--cache-dir", dir.string()});
    CHECK(r.code == 1);
    CHECK(has(r.err, "clear: could not remove " + planted.string()));
    CHECK(has(r.err, "rm -rf"));
    CHECK(files_with(dir, ".so").empty());  // everything else went
  }

  TEST_CASE("every command follows the one table of exit codes") {
    TempDir d;
    const std::string good = (d.path() / "good").string();
    const std::string corrupt = (d.path() / "corrupt").string();
    const std::string fresh = (d.path() / "fresh").string();
    const std::string planted = (d.path() / "planted").string();
    const std::string not_a_folder = (d.path() / "file").string();
    const std::string good_rule = (d.path() / "good.rule").string();
    const std::string bad_rule = (d.path() / "bad.rule").string();
    write_file(not_a_folder, "x");
    write_file(good_rule, "param p\ngrad g\nhyper lr = 0.1\np = p - lr * g\n");
    write_file(bad_rule, "param p\ngrad g\np = p - lr * g\n");
    REQUIRE(run_cli({"warmup", "--preset", "sgd", "--cache-dir", good}).code == 0);
    REQUIRE(run_cli({"warmup", "--preset", "sgd", "--cache-dir", corrupt}).code == 0);
    write_file(files_with(corrupt, ".so").at(0), "not an entry");
    REQUIRE(run_cli({"warmup", "--preset", "sgd", "--cache-dir", planted}).code == 0);
    fs::create_directory(fs::path(planted) / "7d");
    ::chmod((fs::path(planted) / "7d").c_str(), 0777);

    // `list`, `check` and `presets` have no operation that can fail once their input is
    // good, so they have no exit 1; every other command has all three.
    const std::vector<Case> cases = {
        {{"warmup", "--preset", "sgd", "--cache-dir", good}, 0, "1 already cached"},
        {{"warmup", "--preset", "lion", "--cache-dir", fresh},
         1,
         "failed",
         {"FUSEDOPT_HOST_CXX=/bin/false"}},
        {{"warmup", bad_rule, "--cache-dir", fresh}, 2, "bad.rule:3:9: error"},
        {{"warmup", "--preset", "sgd", "--cache-dir", not_a_folder}, 2, "not a folder"},
        {{"list", "--cache-dir", good}, 0, "1 entries"},
        {{"list", "--cache-dir", not_a_folder}, 2, "not a folder"},
        {{"list", "--cache-dir", good},
         2,
         "FUSEDOPT_CACHE_MAX_BYTES",
         {"FUSEDOPT_CACHE_MAX_BYTES=9Q"}},
        {{"verify", "--cache-dir", good}, 0, "all good"},
        {{"verify", "--cache-dir", corrupt}, 1, "1 bad entry"},
        {{"verify", "--bogus", "--cache-dir", good}, 2, "unexpected argument '--bogus'"},
        {{"prune", "--max-bytes", "1G", "--cache-dir", good}, 0, "removed 0 B"},
        {{"prune", "--cache-dir", good}, 2, "--max-bytes"},
        {{"clear", "--cache-dir", planted}, 1, "could not remove"},
        {{"clear", "extra", "--cache-dir", good}, 2, "unexpected argument 'extra'"},
        {{"clear", "--cache-dir", good}, 0, "clear: removed"},
        {{"check", good_rule}, 0, "ok: rule 'good'"},
        {{"check", bad_rule}, 2, "bad.rule:3:9: error"},
        {{"check", d.path().string()}, 2, "is a folder, not a rule file"},
        {{"presets"}, 0, "adamw"},
        {{"presets", "extra"}, 2, "unexpected argument 'extra'"},
    };
    for (const Case& c : cases) {
      CliResult r = run_cli(c.args, c.env);
      INFO(c.args[0] << " " << (c.args.size() > 1 ? c.args[1] : "") << " -> " << r.code << "\n"
                     << r.out << r.err);
      CHECK(r.code == c.code);
      CHECK(has(r.out + r.err, c.says));
    }
  }

  TEST_CASE("every --help ends with the same exit-code table") {
    const CliResult top = run_cli({"--help"});
    REQUIRE(top.code == 0);
    const auto at = top.out.find("exit codes (every command):");
    REQUIRE(at != std::string::npos);
    const std::string table = top.out.substr(at);
    CHECK(has(table, "1  a failed operation"));
    CHECK(has(table, "2  bad input"));
    for (const char* cmd : {"warmup", "list", "verify", "prune", "clear", "check", "presets"}) {
      INFO(cmd);
      CliResult r = run_cli({cmd, "--help"});
      CHECK(r.code == 0);
      CHECK(r.out.size() > table.size());
      CHECK(r.out.compare(r.out.size() - table.size(), table.size(), table) == 0);
    }
  }
}

}  // namespace fusedopt::testing
