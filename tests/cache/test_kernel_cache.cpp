// KernelCache: the memory tier's per-key once across threads, failure propagation and
// retry, LRU bound, the three modes, disk pruning, disk failures being worked around, and
// the environment variables.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "cache/kernel_cache.hpp"
#include "common/cache_entries.hpp"
#include "fusedopt/error.hpp"

namespace fusedopt::testing {

using fusedopt::CacheError;
using fusedopt::cache::KernelCache;
using fusedopt::cache::KeyRecord;
using fusedopt::cache::Origin;
using namespace std::chrono_literals;

namespace {

KernelCache::Options memory_options() {
  KernelCache::Options options;
  options.mode = KernelCache::Mode::Memory;
  return options;
}

KernelCache::Options disk_options(const std::filesystem::path& dir) {
  KernelCache::Options options;
  options.mode = KernelCache::Mode::On;
  options.dir = dir;
  return options;
}

/// Spins (briefly sleeping) until `done()` or ten seconds pass; a generous bound that only
/// a broken implementation reaches.
template <class Done>
void wait_until(Done done) {
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!done() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
}

}  // namespace

TEST_SUITE("cache") {
  TEST_CASE("eight threads asking for one missing key share one compile") {
    KernelCache cache(memory_options());
    KeyRecord record = make_record("shared");
    std::atomic<int> compiles{0};
    std::vector<std::string> got(8);
    std::vector<std::thread> threads;
    for (int i = 0; i < 8; ++i) {
      threads.emplace_back([&, i] {
        auto result = cache.get_or_compile(record, "cubin", [&] {
          ++compiles;
          std::this_thread::sleep_for(100ms);
          return std::string("the binary");
        });
        got[i] = *result.payload;
      });
    }
    for (auto& t : threads) t.join();
    CHECK(compiles == 1);
    for (const auto& payload : got) CHECK(payload == "the binary");
    auto again = cache.get_or_compile(record, "cubin", [&] { return std::string("recompiled"); });
    CHECK(again.origin == Origin::Memory);
    CHECK(*again.payload == "the binary");
    CHECK(again.key == record.key());
  }

  TEST_CASE("different keys compile at the same time") {
    KernelCache cache(memory_options());
    std::atomic<int> in_flight{0};
    std::atomic<int> most_in_flight{0};
    auto compile = [&](std::string payload) {
      int now = ++in_flight;
      int seen = most_in_flight.load();
      while (now > seen && !most_in_flight.compare_exchange_weak(seen, now)) {
      }
      // Stay in flight until the other compile has started too (or give up after 10 s).
      wait_until([&] { return most_in_flight.load() >= 2; });
      --in_flight;
      return payload;
    };
    std::thread a(
        [&] { cache.get_or_compile(make_record("a"), "so", [&] { return compile("A"); }); });
    std::thread b(
        [&] { cache.get_or_compile(make_record("b"), "so", [&] { return compile("B"); }); });
    a.join();
    b.join();
    CHECK(most_in_flight == 2);
  }

  TEST_CASE("a compile exception reaches every waiter and the next call retries") {
    KernelCache cache(memory_options());
    KeyRecord record = make_record("broken");
    std::atomic<int> entered{0};
    std::atomic<int> compiles{0};
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 8; ++i) {
      threads.emplace_back([&] {
        ++entered;
        try {
          cache.get_or_compile(record, "cubin", [&]() -> std::string {
            ++compiles;
            // Fail only once every caller has arrived, so they all wait on this compile.
            wait_until([&] { return entered.load() == 8; });
            std::this_thread::sleep_for(100ms);
            throw std::runtime_error("syntax error in rule");
          });
        } catch (const std::runtime_error& e) {
          if (std::string(e.what()) == "syntax error in rule") ++failures;
        }
      });
    }
    for (auto& t : threads) t.join();
    CHECK(failures == 8);
    CHECK(compiles == 1);

    auto retry = cache.get_or_compile(record, "cubin", [] { return std::string("fixed"); });
    CHECK(retry.origin == Origin::Compiled);
    CHECK(*retry.payload == "fixed");
  }

  TEST_CASE("mode off always compiles") {
    KernelCache::Options options;
    options.mode = KernelCache::Mode::Off;
    KernelCache cache(options);
    CHECK(cache.disk() == nullptr);
    KeyRecord record = make_record("k");
    int compiles = 0;
    for (int i = 0; i < 3; ++i) {
      auto result = cache.get_or_compile(record, "so", [&] {
        ++compiles;
        return std::string("bin");
      });
      CHECK(result.origin == Origin::Compiled);
      CHECK(*result.payload == "bin");
      CHECK(result.key == record.key());
    }
    CHECK(compiles == 3);
  }

  TEST_CASE("mode memory keeps binaries in memory and never touches the disk") {
    TempDir tmp;
    KernelCache::Options options = memory_options();
    options.dir = tmp.path() / "unused";
    KernelCache cache(options);
    CHECK(cache.disk() == nullptr);
    KeyRecord record = make_record("k");
    CHECK(cache.get_or_compile(record, "so", [] { return std::string("x"); }).origin ==
          Origin::Compiled);
    CHECK(cache.get_or_compile(record, "so", [] { return std::string("y"); }).origin ==
          Origin::Memory);
    CHECK_FALSE(std::filesystem::exists(tmp.path() / "unused"));

    cache.clear_memory();
    auto after = cache.get_or_compile(record, "so", [] { return std::string("z"); });
    CHECK(after.origin == Origin::Compiled);
    CHECK(*after.payload == "z");
  }

  TEST_CASE("mode on answers from memory, then from disk for a fresh cache object") {
    TempDir tmp;
    KeyRecord record = make_record("k");
    int compiles = 0;
    auto compile = [&] {
      ++compiles;
      return binary_payload(4096);
    };
    {
      KernelCache cache(disk_options(tmp.path()));
      REQUIRE(cache.disk() != nullptr);
      CHECK(cache.get_or_compile(record, "cubin", compile).origin == Origin::Compiled);
      CHECK(cache.get_or_compile(record, "cubin", compile).origin == Origin::Memory);
      cache.clear_memory();
      CHECK(cache.get_or_compile(record, "cubin", compile).origin == Origin::Disk);
    }
    KernelCache fresh(disk_options(tmp.path()));
    auto result = fresh.get_or_compile(record, "cubin", compile);
    CHECK(result.origin == Origin::Disk);
    CHECK(*result.payload == binary_payload(4096));
    CHECK(compiles == 1);
    CHECK(fresh.last_disk_error().empty());
  }

  TEST_CASE("the memory tier evicts the least recently used entry") {
    KernelCache::Options options = memory_options();
    // Room for two 1000-byte binaries with their records, not three.
    options.max_memory_bytes = 2500;
    KernelCache cache(options);
    auto get = [&](const char* name) {
      return cache.get_or_compile(make_record(name), "so", [] { return std::string(1000, 'x'); })
          .origin;
    };
    CHECK(get("a") == Origin::Compiled);
    CHECK(get("b") == Origin::Compiled);
    CHECK(get("a") == Origin::Memory);    // a is now more recent than b
    CHECK(get("c") == Origin::Compiled);  // evicts b
    CHECK(get("a") == Origin::Memory);
    CHECK(get("c") == Origin::Memory);
    CHECK(get("b") == Origin::Compiled);
  }

  TEST_CASE("a binary larger than the memory bound is returned but not kept") {
    KernelCache::Options options = memory_options();
    options.max_memory_bytes = 100;
    KernelCache cache(options);
    KeyRecord record = make_record("big");
    auto first = cache.get_or_compile(record, "so", [] { return std::string(1000, 'x'); });
    CHECK(first.payload->size() == 1000);
    CHECK(cache.get_or_compile(record, "so", [] { return std::string(1000, 'y'); }).origin ==
          Origin::Compiled);
  }

  TEST_CASE("mode on prunes the disk to max_disk_bytes after storing") {
    TempDir tmp;
    KernelCache::Options options = disk_options(tmp.path());
    options.max_disk_bytes = 25000;  // two 10000-byte binaries and their headers
    KernelCache cache(options);
    for (const char* name : {"a", "b", "c", "d"}) {
      cache.get_or_compile(make_record(name), "so", [] { return binary_payload(10000); });
    }
    CHECK(cache.disk()->total_bytes() <= 25000);
    CHECK(cache.disk()->list().size() == 2);
  }

  TEST_CASE("a disk tier that cannot store is worked around and noted") {
    TempDir tmp;
    KernelCache cache(disk_options(tmp.path()));
    KeyRecord record = make_record("k");
    auto shard = cache.disk()->entry_path(record.key(), "so").parent_path();
    write_file(shard, "a file where the sub-folder should be");
    auto result = cache.get_or_compile(record, "so", [] { return std::string("compiled anyway"); });
    CHECK(result.origin == Origin::Compiled);
    CHECK(*result.payload == "compiled anyway");
    CHECK(cache.last_disk_error().find(shard.string()) != std::string::npos);
    CHECK(cache.get_or_compile(record, "so", [] { return std::string("again"); }).origin ==
          Origin::Memory);
  }

  TEST_CASE("a compile error is not mistaken for a disk failure in mode on") {
    TempDir tmp;
    KernelCache cache(disk_options(tmp.path()));
    KeyRecord record = make_record("k");
    CHECK_THROWS_WITH_AS(
        cache.get_or_compile(record, "so",
                             []() -> std::string { throw fusedopt::CacheError("from compile"); }),
        "from compile", CacheError);
    CHECK(cache.last_disk_error().empty());
    CHECK(cache.disk()->list().empty());
  }

  TEST_CASE("options come from FUSEDOPT_CACHE, FUSEDOPT_CACHE_DIR and FUSEDOPT_CACHE_MAX_BYTES") {
    ScopedEnv mode("FUSEDOPT_CACHE", "memory");
    ScopedEnv dir("FUSEDOPT_CACHE_DIR", "/somewhere/cache");
    ScopedEnv max("FUSEDOPT_CACHE_MAX_BYTES", "512M");
    auto options = KernelCache::options_from_env();
    CHECK(options.mode == KernelCache::Mode::Memory);
    CHECK(options.dir == "/somewhere/cache");
    CHECK(options.max_disk_bytes == 512ull << 20);
  }

  TEST_CASE("the default cache folder follows XDG_CACHE_HOME, then HOME") {
    ScopedEnv mode("FUSEDOPT_CACHE", std::nullopt);
    ScopedEnv dir("FUSEDOPT_CACHE_DIR", std::nullopt);
    ScopedEnv max("FUSEDOPT_CACHE_MAX_BYTES", std::nullopt);
    ScopedEnv home("HOME", "/home/someone");
    {
      ScopedEnv xdg("XDG_CACHE_HOME", "/xdg/cache");
      auto options = KernelCache::options_from_env();
      CHECK(options.dir == "/xdg/cache/fusedopt");
      CHECK(options.mode == KernelCache::Mode::On);
      CHECK(options.max_disk_bytes == 1ull << 30);
    }
    {
      ScopedEnv xdg("XDG_CACHE_HOME", std::nullopt);
      CHECK(KernelCache::options_from_env().dir == "/home/someone/.cache/fusedopt");
    }
    {
      ScopedEnv xdg("XDG_CACHE_HOME", "relative/is/ignored");
      CHECK(KernelCache::options_from_env().dir == "/home/someone/.cache/fusedopt");
    }
  }

  TEST_CASE("FUSEDOPT_CACHE accepts off, memory and on and rejects anything else") {
    {
      ScopedEnv mode("FUSEDOPT_CACHE", "off");
      CHECK(KernelCache::options_from_env().mode == KernelCache::Mode::Off);
    }
    {
      ScopedEnv mode("FUSEDOPT_CACHE", "ON");
      CHECK(KernelCache::options_from_env().mode == KernelCache::Mode::On);
    }
    ScopedEnv mode("FUSEDOPT_CACHE", "of");
    CHECK_THROWS_WITH_AS(KernelCache::options_from_env(),
                         "FUSEDOPT_CACHE=of is not valid: use off, memory or on", CacheError);
  }

  TEST_CASE("FUSEDOPT_CACHE_MAX_BYTES takes bytes or a K, M or G suffix") {
    struct Case {
      const char* text;
      std::uint64_t bytes;
    };
    for (Case c : {Case{"0", 0}, Case{"12345", 12345}, Case{"4K", 4096}, Case{"3m", 3ull << 20},
                   Case{"2G", 2ull << 30}, Case{"1GiB", 1ull << 30}, Case{" 64MB ", 64ull << 20}}) {
      CAPTURE(c.text);
      ScopedEnv max("FUSEDOPT_CACHE_MAX_BYTES", c.text);
      CHECK(KernelCache::options_from_env().max_disk_bytes == c.bytes);
    }
    for (const char* bad :
         {"lots", "-1", "1.5G", "10X", "K", "99999999999999999999", "17179869184G"}) {
      CAPTURE(bad);
      ScopedEnv max("FUSEDOPT_CACHE_MAX_BYTES", bad);
      CHECK_THROWS_WITH_AS(KernelCache::options_from_env(),
                           ("FUSEDOPT_CACHE_MAX_BYTES=" + std::string(bad) +
                            " is not a size: use a number of bytes, optionally followed by K, M "
                            "or G (powers of 1024), e.g. 512M")
                               .c_str(),
                           CacheError);
    }
  }

  TEST_CASE("global() throws each time it is called while the environment is invalid") {
    ScopedEnv mode("FUSEDOPT_CACHE", "sometimes");
    CHECK_THROWS_AS(KernelCache::global(), CacheError);
    CHECK_THROWS_WITH_AS(KernelCache::global(),
                         "FUSEDOPT_CACHE=sometimes is not valid: use off, memory or on",
                         CacheError);
  }

  TEST_CASE("KernelCache refuses an open cache folder in mode on") {
    TempDir tmp;
    auto dir = tmp.path() / "open";
    std::filesystem::create_directory(dir);
    ::chmod(dir.c_str(), 0777);
    CHECK_THROWS_AS(KernelCache{disk_options(dir)}, CacheError);
  }

}  // TEST_SUITE

}  // namespace fusedopt::testing
