// Checkpoint files at scale and at the edges: header parsing stays linear in the number of
// tensors, the stated limits are refused with a clear message, numbers from the file are
// range-checked, and saves use short temp names, clean up after crashed writers and keep an
// overwritten file's mode.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/safetensors_files.hpp"
#include "common/temp_dir.hpp"
#include "fusedopt/error.hpp"
#include "io/safetensors.hpp"
#include "support/atomic_write.hpp"

namespace fusedopt::testing {

namespace fs = std::filesystem;
using fusedopt::IoError;
using fusedopt::io::read_safetensors;
using fusedopt::io::TensorView;
using fusedopt::io::write_safetensors;

namespace {

/// `n` one-element F32 tensors with fresh random values, written by write_safetensors.
std::vector<float> write_many(const fs::path& path, std::size_t n, std::mt19937& rng) {
  std::vector<float> values(n);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (float& v : values) v = uniform(rng);
  std::vector<TensorView> views;
  views.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    views.push_back({"layer" + std::to_string(i) + "/m", "F32", {1}, &values[i], 4});
  }
  write_safetensors(path, views, {{"step", "1"}});
  return values;
}

/// The fastest of `runs` reads of `path`, in seconds (the minimum rejects noise from other
/// processes on the machine).
/// The calling thread's CPU time, in seconds: unlike wall time, it does not grow when other
/// processes (ctest -j) share the cores.
double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// The least CPU time of `runs` reads of `path`.
double read_seconds(const fs::path& path, int runs) {
  double best = 1e30;
  for (int r = 0; r < runs; ++r) {
    const double t0 = thread_cpu_seconds();
    const auto file = read_safetensors(path);
    best = std::min(best, thread_cpu_seconds() - t0);
    CHECK(!file.tensors.empty());
  }
  return best;
}

std::string error_of(const fs::path& p) {
  try {
    read_safetensors(p);
  } catch (const IoError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_SUITE("io") {
  TEST_CASE("a 100 k tensor file loads and 4x the tensors costs less than 8x the time") {
    TempDir dir;
    std::mt19937 rng(std::random_device{}());
    const fs::path small = dir.path() / "small.safetensors";
    const fs::path large = dir.path() / "large.safetensors";
    write_many(small, 25'000, rng);
    const std::vector<float> values = write_many(large, 100'000, rng);
    const auto file = read_safetensors(large);
    REQUIRE(file.tensors.size() == 100'000);
    for (std::size_t i : {std::size_t{0}, std::size_t{4321}, std::size_t{99'999}}) {
      float got = 0;
      std::memcpy(&got, file.tensor_data("layer" + std::to_string(i) + "/m"), 4);
      CHECK(got == values[i]);  // bytes are copied verbatim: exact
    }
    // Quadratic duplicate detection made 4x the keys 16x the time; linear work is ~4x (a
    // sort and a map insert add a log factor). 8x leaves room for noise. CPU time, the least
    // of 5 reads: wall time under ctest -j made a loaded large read look 8.4x a quiet small
    // one.
    const double t_small = read_seconds(small, 5);
    const double t_large = read_seconds(large, 5);
    MESSAGE("25 k tensors: " << t_small << " s, 100 k: " << t_large << " s of CPU");
    CHECK(t_large < 8 * t_small);
  }

  TEST_CASE("more tensors or dimensions than the stated limits are refused by name") {
    TempDir dir;
    const fs::path p = dir.path() / "x.safetensors";
    // 65 dimensions of size 1: a valid product, but beyond the limit of 64.
    std::string shape = "[1";
    for (int i = 1; i < 65; ++i) shape += ",1";
    shape += "]";
    write_file(
        p, raw_safetensors(R"({"t":{"dtype":"U8","shape":)" + shape + R"(,"data_offsets":[0,1]}})",
                           "x"));
    CHECK(error_of(p) ==
          p.string() + ": tensor 't': shape has 65 dimensions, above the limit of 64");
    // Writing more than 1 M tensors is refused before anything is written.
    std::vector<TensorView> views(1'000'001, TensorView{"", "F32", {0}, nullptr, 0});
    for (std::size_t i = 0; i < views.size(); ++i) views[i].name = std::to_string(i);
    CHECK_THROWS_WITH_AS(write_safetensors(p, views, {}),
                         (p.string() + ": 1000001 tensors, above the limit of 1000000").c_str(),
                         IoError);
  }

  TEST_CASE("a shape whose nonzero dimensions overflow int64 is refused even with a zero") {
    TempDir dir;
    const fs::path p = dir.path() / "x.safetensors";
    // 2^62 * 2^62 elements (times 0): zero bytes, but no element count fits in int64.
    write_file(p, raw_safetensors(
                      R"({"t":{"dtype":"U8","shape":[0,4611686018427387904,4611686018427387904],)"
                      R"("data_offsets":[0,0]}})",
                      ""));
    CHECK(error_of(p) ==
          p.string() +
              ": tensor 't': shape [0, 4611686018427387904, 4611686018427387904] overflows");
    // Offsets past int64 are refused by the JSON reader before they are used.
    write_file(
        p, raw_safetensors(
               R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,9223372036854775808]}})", "x"));
    CHECK(error_of(p).find("integer out of range") != std::string::npos);
  }

  TEST_CASE("a target with a 255-byte name saves and loads") {
    TempDir dir;
    const std::string name = std::string(255 - 12, 'n') + ".safetensors";
    REQUIRE(name.size() == 255);
    const fs::path p = dir.path() / name;
    std::mt19937 rng(std::random_device{}());
    const float v = std::uniform_real_distribution<float>(1.0f, 2.0f)(rng);
    write_safetensors(p, {{"w", "F32", {1}, &v, 4}}, {});
    float got = 0;
    std::memcpy(&got, read_safetensors(p).tensor_data("w"), 4);
    CHECK(got == v);
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename());
    CHECK(names == std::vector<std::string>{name});  // no temp left behind
  }

  TEST_CASE("a save removes a dead writer's temp after a minute's grace, and keeps live ones") {
    TempDir dir;
    const pid_t dead = dead_pid();
    const std::string hex = "0123456789abcdef";
    auto temp = [&](const std::string& stem, pid_t pid) {
      return dir.path() / ("." + stem + ".safetensors." + std::to_string(pid) + "." + hex + ".tmp");
    };
    // Aged by setting its modification time back: a writer keeps its temp's fresh.
    auto age = [](const fs::path& p, long seconds) {
      const timespec times[2] = {{std::time(nullptr) - seconds, 0},
                                 {std::time(nullptr) - seconds, 0}};
      REQUIRE(::utimensat(AT_FDCWD, p.c_str(), times, 0) == 0);
    };
    const fs::path stale = temp("old", dead);
    // A fresh temp whose pid is not running here: a save in progress on another host that
    // shares the folder (a sharded save's ranks on several nodes). It must survive.
    const fs::path other_host = temp("shard", dead);
    const fs::path live = temp("old", ::getppid());
    const fs::path abandoned = temp("older", ::getppid());  // an hour old, whoever wrote it
    const fs::path other = dir.path() / ".notes.txt";       // not a temp name: never touched
    for (const fs::path& p : {stale, other_host, live, abandoned, other}) write_file(p, "x");
    age(stale, fusedopt::support::kDeadWriterGraceSeconds + 5);
    age(other_host, fusedopt::support::kDeadWriterGraceSeconds - 20);
    age(abandoned, fusedopt::support::kStaleTempSeconds + 5);
    pid_t parsed = 0;
    CHECK(fusedopt::support::parse_temp_name(stale.filename().string(), &parsed));
    CHECK(parsed == dead);
    CHECK_FALSE(fusedopt::support::parse_temp_name(".x.1.2.tmp", &parsed));
    const float v = 1.5f;
    write_safetensors(dir.path() / "new.safetensors", {{"w", "F32", {1}, &v, 4}}, {});
    CHECK_FALSE(fs::exists(stale));
    CHECK(fs::exists(other_host));
    CHECK(fs::exists(live));
    CHECK_FALSE(fs::exists(abandoned));
    CHECK(fs::exists(other));
  }

  TEST_CASE("a save refuses a target that is a FIFO, a symbolic link or a folder") {
    // Never a device node here: a save as root once replaced /dev/null with a file.
    TempDir dir;
    const float v = 2.5f;
    const fs::path fifo = dir.path() / "fifo", link = dir.path() / "link",
                   target = dir.path() / "target.txt", folder = dir.path() / "folder";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    write_file(target, "keep");
    fs::create_symlink(target, link);
    fs::create_directory(folder);
    const std::vector<std::pair<fs::path, std::string>> cases = {
        {fifo, "it is a FIFO, not a regular file"},
        {link, "it is a symbolic link (to " + target.string() +
                   "): save to the file it points to, not a regular file"},
        {folder, "it is a folder, not a regular file"}};
    for (const auto& [p, what] : cases) {
      CAPTURE(p);
      CHECK_THROWS_WITH_AS(
          write_safetensors(p, {{"w", "F32", {1}, &v, 4}}, {}),
          (p.string() + ": cannot write: " + what + " (a save replaces only a regular file)")
              .c_str(),
          IoError);
    }
    CHECK(fs::is_fifo(fs::symlink_status(fifo)));
    CHECK(fs::is_symlink(fs::symlink_status(link)));
    CHECK(fs::is_directory(fs::symlink_status(folder)));
    std::ifstream in(target);
    CHECK(std::string(std::istreambuf_iterator<char>(in), {}) == "keep");
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename());
    CHECK(names.size() == 4);  // no temp left behind
    // A regular file is replaced as before.
    write_safetensors(target, {{"w", "F32", {1}, &v, 4}}, {});
    CHECK(read_safetensors(target).tensors.size() == 1);
  }

  TEST_CASE("an overwritten file keeps its mode: 0600 stays 0600, 0640 stays 0640") {
    TempDir dir;
    const fs::path p = dir.path() / "ckpt.safetensors";
    const float v = 2.5f;
    write_safetensors(p, {{"w", "F32", {1}, &v, 4}}, {});
    for (mode_t mode : {mode_t{0600}, mode_t{0640}}) {
      REQUIRE(::chmod(p.c_str(), mode) == 0);
      write_safetensors(p, {{"w", "F32", {1}, &v, 4}}, {});
      CHECK(mode_of(p) == mode);
    }
  }

  TEST_CASE(
      "saves killed with SIGKILL 20 times leave the last good file and, after the next "
      "save, no temporary") {
    TempDir dir;
    const fs::path p = dir.path() / "ckpt.safetensors";
    std::mt19937 rng(std::random_device{}());
    // 8 MB a save, so that a kill often lands inside one: two versions, told apart by value.
    std::vector<float> a(1 << 21), b(1 << 21);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& x : a) x = u(rng);
    for (float& x : b) x = u(rng);
    auto save = [&](const std::vector<float>& v, const char* version) {
      write_safetensors(
          p, {{"w", "F32", {static_cast<std::int64_t>(v.size())}, v.data(), v.size() * 4}},
          {{"version", version}});
    };
    save(a, "a");
    for (int round = 0; round < 20; ++round) {
      const pid_t child = ::fork();
      REQUIRE(child >= 0);
      if (child == 0) {  // saves b, a, b, ... until killed; never returns to doctest
        for (int k = 0;; ++k) {
          try {
            save(k % 2 ? a : b, k % 2 ? "a" : "b");
          } catch (...) {
            ::_exit(3);
          }
        }
      }
      std::this_thread::sleep_for(
          std::chrono::microseconds(std::uniform_int_distribution<int>(0, 60'000)(rng)));
      ::kill(child, SIGKILL);
      int status = 0;
      REQUIRE(::waitpid(child, &status, 0) == child);
      REQUIRE(WIFSIGNALED(status));
      // Whatever the kill interrupted, the file is one whole version.
      const auto file = read_safetensors(p);
      const std::string version = file.metadata.at("version");
      const std::vector<float>& want = version == "a" ? a : b;
      INFO("round " << round << ", version " << version);
      CHECK(std::memcmp(file.tensor_data("w"), want.data(), want.size() * 4) == 0);
    }
    int left = 0;
    for (const auto& entry : fs::directory_iterator(dir.path())) {
      left += entry.path().filename() != "ckpt.safetensors";
    }
    MESSAGE(left << " temporary files left by the killed saves");
    // Removed once past the grace a dead writer's temp gets (it may be another host's).
    for (const auto& entry : fs::directory_iterator(dir.path())) {
      const timespec old[2] = {{std::time(nullptr) - 120, 0}, {std::time(nullptr) - 120, 0}};
      REQUIRE(::utimensat(AT_FDCWD, entry.path().c_str(), old, 0) == 0);
    }
    save(a, "a");  // removes what the killed saves left behind
    for (const auto& entry : fs::directory_iterator(dir.path())) {
      CHECK(entry.path().filename() == "ckpt.safetensors");
    }
  }
}

}  // namespace fusedopt::testing
