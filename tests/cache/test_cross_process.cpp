// The disk tier across processes: forked children racing on the same missing keys compile
// each exactly once, and a reader racing a writer never sees a partial entry. Each test
// forks before it creates any thread.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

#include "cache/kernel_cache.hpp"
#include "common/cache_entries.hpp"

namespace fusedopt::testing {

using fusedopt::cache::DiskStore;
using fusedopt::cache::KeyRecord;
using namespace std::chrono_literals;

namespace {

/// Forks `count` children that each block until release() and then exit with body(i)'s
/// result. The parent never runs body.
class Children {
 public:
  template <class Body>
  Children(int count, Body body) {
    REQUIRE(::pipe(gate_) == 0);
    for (int i = 0; i < count; ++i) {
      pid_t pid = ::fork();
      REQUIRE(pid >= 0);
      if (pid == 0) {
        ::close(gate_[1]);
        char c;
        while (::read(gate_[0], &c, 1) < 0) {
        }  // end of file: released
        int rc = 3;
        try {
          rc = body(i);
        } catch (...) {
          rc = 2;
        }
        ::_exit(rc);
      }
      pids_.push_back(pid);
    }
    ::close(gate_[0]);
  }
  ~Children() {
    release();
    for (pid_t pid : pids_) {
      if (pid > 0) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
      }
    }
  }

  /// Closing the write end wakes every child at once.
  void release() {
    if (gate_[1] >= 0) ::close(gate_[1]);
    gate_[1] = -1;
  }

  /// True while child `i` has not exited.
  bool running(int i) {
    if (pids_[i] <= 0) return false;
    int status = 0;
    if (::waitpid(pids_[i], &status, WNOHANG) != pids_[i]) return true;
    statuses_[i] = status;
    pids_[i] = -1;
    return false;
  }

  /// Waits (at most a minute) for every child; their exit codes, -1 for a crash or hang.
  std::vector<int> wait_all() {
    auto deadline = std::chrono::steady_clock::now() + 60s;
    std::vector<int> codes(pids_.size(), -1);
    for (std::size_t i = 0; i < pids_.size(); ++i) {
      while (running(static_cast<int>(i)) && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(5ms);
      }
      if (pids_[i] == -1 && WIFEXITED(statuses_[i])) codes[i] = WEXITSTATUS(statuses_[i]);
    }
    return codes;
  }

 private:
  int gate_[2] = {-1, -1};
  std::vector<pid_t> pids_;
  std::map<int, int> statuses_;
};

std::string payload_for(int k) { return binary_payload(20000 + k, static_cast<unsigned>(k) + 11); }

}  // namespace

TEST_SUITE("cache") {
  TEST_CASE("eight processes compile each missing key exactly once") {
    fusedopt::testing::ScopedTmpdir own_tmpdir;  // verify reports build folders there
    TempDir tmp;
    auto dir = tmp.path() / "cache";
    auto log = tmp.path() / "compiles.log";
    Children children(8, [&](int child) {
      DiskStore store(dir);  // all eight create the folder at once, too
      for (int j = 0; j < 3; ++j) {
        int k = (child + j) % 3;  // start on different keys so that compiles also overlap
        auto [payload, origin] =
            store.get_or_compile(make_record("key " + std::to_string(k)), "so", [&] {
              std::this_thread::sleep_for(200ms);
              int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
              std::string line =
                  "key " + std::to_string(k) + " by child " + std::to_string(child) + "\n";
              bool ok = fd >= 0 &&
                        ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
              if (fd >= 0) ::close(fd);
              if (!ok) throw std::runtime_error("log write failed");
              return payload_for(k);
            });
        if (payload != payload_for(k)) return 1;
      }
      return 0;
    });
    children.release();
    for (int code : children.wait_all()) CHECK(code == 0);

    std::istringstream lines(read_file(log));
    std::map<std::string, int> per_key;
    int count = 0;
    for (std::string line; std::getline(lines, line); ++count) per_key[line.substr(0, 5)]++;
    CHECK(count == 3);
    CHECK(per_key == std::map<std::string, int>{{"key 0", 1}, {"key 1", 1}, {"key 2", 1}});
    DiskStore store(dir);
    CHECK(store.verify().empty());
    CHECK(store.list().size() == 3);
  }

  TEST_CASE("a reader never sees a partially written entry") {
    TempDir tmp;
    auto dir = tmp.path() / "cache";
    DiskStore reader(dir);
    KeyRecord record = make_record("big kernel");
    const std::string payload = binary_payload(8u << 20, 5);
    Children writer(1, [&](int) {
      DiskStore store(dir);
      for (int i = 0; i < 15; ++i) store.store(record, "so", payload);
      return 0;
    });
    writer.release();

    int loads = 0;
    int hits = 0;
    int bad = 0;
    bool published = false;
    int misses_after_publish = 0;
    while (writer.running(0) || loads == 0) {
      auto got = reader.load(record, "so");
      ++loads;
      if (got) {
        ++hits;
        published = true;
        if (*got != payload) ++bad;
      } else if (published) {
        ++misses_after_publish;  // the final name always holds a complete entry once published
      }
    }
    CHECK(writer.wait_all() == std::vector<int>{0});
    auto last = reader.load(record, "so");
    REQUIRE(last.has_value());
    CHECK(*last == payload);
    CHECK(bad == 0);
    CHECK(misses_after_publish == 0);
    MESSAGE(loads << " loads racing the writer, " << hits << " hits");
  }

}  // TEST_SUITE

}  // namespace fusedopt::testing
