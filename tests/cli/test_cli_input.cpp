// fusedopt-cache's handling of unexpected arguments, bad values and odd inputs (review of the
// kernel cache, issues 1, 2, 3, 11, 12, 13, 15, 16): each is refused with exit 2 or fails
// with exit 1 and a reason, and none hangs. Commands that could hang run under timeout(1),
// whose exit 124 then fails the test instead of CI.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/run.hpp"

namespace fusedopt::testing {

namespace fs = std::filesystem;

namespace {

constexpr int kTimedOut = 124;  // timeout(1)'s exit code

/// The CLI with `args` and `env`, killed after `seconds` (exit 124).
CliResult run_limited(int seconds, const std::vector<std::string>& args,
                      const std::vector<std::string>& env = {}) {
  RunOptions options;
  options.env = env;
  options.binary = "/usr/bin/timeout";
  std::vector<std::string> all = {"-s", "KILL", std::to_string(seconds), FUSEDOPT_CACHE_CLI};
  all.insert(all.end(), args.begin(), args.end());
  CliResult r = run_cli(all, options);
  if (r.code == 128 + 9 || r.code == 137) r.code = kTimedOut;
  return r;
}

bool has(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

fs::path write_script(const fs::path& path, const std::string& text) {
  std::ofstream(path) << text;
  fs::permissions(path, fs::perms::owner_all);
  return path;
}

std::vector<fs::path> so_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().extension() == ".so") out.push_back(e.path());
  }
  return out;
}

}  // namespace

TEST_SUITE("cli") {
  TEST_CASE("a stray argument or a repeated flag after --json or --remove never spins") {
    TempDir d;
    const std::string dir = (d.path() / "cache").string();
    const std::vector<std::vector<std::string>> stray = {
        {"list", "--json", "--cache-dir", dir, "bogus"},
        {"list", "--json", "--cache-dir", dir, "-x"},
        {"verify", "--remove", "--cache-dir", dir, "bogus"},
        {"clear", "--json", "--cache-dir", dir, "--remove"},
        {"presets", "--json", "extra"}};
    for (const auto& args : stray) {
      CAPTURE(args[0]);
      CliResult r = run_limited(20, args);
      CHECK(r.code == 2);
      CHECK(has(r.err, "unexpected argument '" + args.back() + "'"));
    }
    // A flag given twice means what it means once (in a cache folder that exists: these
    // commands never create one).
    fs::create_directory(dir);
    fs::permissions(dir, fs::perms::owner_all);
    for (const auto& args : std::vector<std::vector<std::string>>{
             {"list", "--cache-dir", dir, "--json", "--json"},
             {"verify", "--remove", "--remove", "--cache-dir", dir},
             {"clear", "--json", "--json", "--cache-dir", dir},
             {"presets", "--json", "--json"}}) {
      CAPTURE(args[0]);
      CHECK(run_limited(20, args).code == 0);
    }
  }

  TEST_CASE("a host compiler that stalls on --version is stopped at FUSEDOPT_COMPILE_TIMEOUT") {
    TempDir d;
    const fs::path cxx = write_script(d.path() / "stall-cxx", "#!/bin/sh\nexec sleep 300\n");
    CliResult r = run_limited(
        60, {"warmup", "--preset", "sgd", "--jobs", "1", "--cache-dir", (d.path() / "c").string()},
        {"FUSEDOPT_HOST_CXX=" + cxx.string(), "FUSEDOPT_COMPILE_TIMEOUT=1"});
    INFO(r.err);
    CHECK(r.code == 1);
    CHECK(has(r.err, "did not answer '" + cxx.string() +
                         " --version' within 1 s (FUSEDOPT_COMPILE_TIMEOUT)"));
  }

  TEST_CASE("warmup replaces a folder at an entry's name, and fails a kernel a prune evicted") {
    TempDir d;
    const std::string dir = (d.path() / "cache").string();
    REQUIRE(run_cli({"warmup", "--preset", "lion", "--cache-dir", dir}).code == 0);
    const std::vector<fs::path> so = so_files(dir);
    REQUIRE(so.size() == 1);
    fs::remove(so[0]);
    fs::create_directories(so[0] / "inner");  // would fail every store's rename: removed
    CliResult healed = run_cli({"warmup", "--preset", "lion", "--cache-dir", dir});
    INFO(healed.out << healed.err);
    CHECK(healed.code == 0);
    CHECK(has(healed.out, "compiled  lion"));
    CHECK(fs::is_regular_file(so[0]));

    // A bound that holds any two of these kernels and no three (their sizes depend on the
    // compiler and the CPU: measured first): the first two stored are evicted by the last two.
    const std::vector<std::string> warm4 = {"warmup", "--preset", "sgd,adamw,lion,adam",
                                            "--jobs", "1",        "--cache-dir"};
    const std::string sizes = (d.path() / "sizes").string();
    std::vector<std::string> args = warm4;
    args.push_back(sizes);
    REQUIRE(run_cli(args).code == 0);
    std::vector<std::uintmax_t> bytes;
    for (const fs::path& f : so_files(sizes)) bytes.push_back(fs::file_size(f));
    REQUIRE(bytes.size() == 4);
    std::sort(bytes.begin(), bytes.end());
    const std::uintmax_t bound = bytes[2] + bytes[3];
    REQUIRE(bound < bytes[0] + bytes[1] + bytes[2]);
    const std::string small = (d.path() / "small").string();
    args = warm4;
    args.push_back(small);
    CliResult evicted = run_cli(args, {"FUSEDOPT_CACHE_MAX_BYTES=" + std::to_string(bound)});
    INFO(evicted.out << evicted.err);
    CHECK(evicted.code == 1);
    CHECK(has(evicted.out, "failed    sgd"));
    CHECK(has(evicted.err,
              "stored, then no longer in the cache at the end of warmup: there is "
              "no entry file"));
    CHECK(so_files(small).size() == 2);
    CHECK(has(evicted.out, "2 compiled"));
  }

  TEST_CASE("a dtype binding one rule cannot take fails that kernel only, not the warmup") {
    TempDir d;
    const std::string dir = (d.path() / "cache").string();
    // Two quantized states: adamw has two (m, v), sgd one.
    CliResult r = run_cli({"warmup", "--preset", "sgd,adamw", "--dtypes",
                           "fp32:fp32:fp32+q=q8s/q8u@256", "--jobs", "1", "--cache-dir", dir});
    INFO(r.out << r.err);
    CHECK(r.code == 1);
    CHECK(has(r.out, "failed    sgd"));
    CHECK(has(r.out, "compiled  adamw"));
    CHECK(so_files(dir).size() == 1);
  }

  TEST_CASE("bad values are refused with exit 2: sizes, --jobs and the compiler variables") {
    TempDir d;
    const std::string dir = (d.path() / "cache").string();
    const std::vector<std::string> warm = {"warmup", "--preset",    "sgd,adamw", "--jobs",
                                           "1",      "--cache-dir", dir};
    CliResult size = run_cli({"prune", "--max-bytes", "10bb", "--cache-dir", dir});
    CHECK(size.code == 2);
    CHECK(has(size.err, "--max-bytes '10bb' has an unknown unit"));
    CliResult env_size = run_cli(warm, {"FUSEDOPT_CACHE_MAX_BYTES=10bib"});
    CHECK(env_size.code == 2);
    CliResult jobs = run_cli({"warmup", "--preset", "sgd", "--jobs", "2abc", "--cache-dir", dir});
    CHECK(jobs.code == 2);
    CHECK(has(jobs.err, "--jobs needs a number from 1 to 256, got '2abc'"));
    for (const char* t : {"abc", " 5", "0x10", "-1", "inf"}) {
      CAPTURE(t);
      CliResult r = run_cli(warm, {std::string("FUSEDOPT_COMPILE_TIMEOUT=") + t});
      CHECK(r.code == 2);
      CHECK(has(r.err, "fusedopt-cache warmup: error: FUSEDOPT_COMPILE_TIMEOUT="));
      CHECK_FALSE(has(r.out, "failed"));  // one bad-input error, not a failure per kernel
    }
    CliResult blank = run_cli(warm, {"FUSEDOPT_HOST_CXX=   "});
    CHECK(blank.code == 2);
    CHECK(has(blank.err, "FUSEDOPT_HOST_CXX='   ' is blank"));
    const bool compiled = fs::exists(dir) && !so_files(dir).empty();
    CHECK_FALSE(compiled);
  }

  TEST_CASE("check refuses a FIFO, a device and an oversized rule file without reading them") {
    TempDir d;
    const fs::path fifo = d.path() / "rule.fifo";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    CliResult f = run_limited(20, {"check", fifo.string()});
    CHECK(f.code == 2);
    CHECK(has(f.err, "is not a regular file"));
    CliResult warm = run_limited(
        20, {"warmup", "--rule", fifo.string(), "--cache-dir", (d.path() / "c").string()});
    CHECK(warm.code == 2);
    CHECK(has(warm.err, "is not a regular file"));
    CliResult dev = run_limited(20, {"check", "/dev/zero"});
    CHECK(dev.code == 2);
    CHECK(has(dev.err, "is not a regular file"));
    const fs::path big = d.path() / "big.rule";
    {
      std::ofstream out(big);
      out.seekp((8 << 20) - 1);
      out.put('\n');  // 8 MiB, mostly a hole
    }
    CliResult b = run_limited(20, {"check", big.string()});
    CHECK(b.code == 2);
    CHECK(has(b.err, "is 8388608 bytes, more than the limit of 1048576 bytes"));
  }
}

}  // namespace fusedopt::testing
