// Sharded checkpoints under mpiexec (1 to 4 ranks): every file of a set is bound to its save
// (the index records each shard's checksum), so a shard of another save is refused; merge
// and split check everything before they write; and every single-bit flip of the index or
// of any shard is refused on every rank, with every rank's optimizer unchanged.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "comm/comm_support.hpp"
#include "fusedopt/comm.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/optimizer.hpp"
#include "fusedopt/safetensors.hpp"
#include "fusedopt/sharded.hpp"

using fusedopt::FlatArena;
using fusedopt::ParamGroup;
using fusedopt::Rule;
using fusedopt::comm::Communicator;
using fusedopt::comm::ShardedOptimizer;

namespace fs = std::filesystem;

namespace fusedopt_tests {
namespace {

// A short rule keeps the headers, and so the number of bits to flip, small.
constexpr const char* kRule =
    "param p\ngrad g\nstate m = 0\nhyper lr = 0.01, beta = 0.9\n"
    "m = beta * m + g\np = p - lr * m\n";

std::vector<ParamGroup> two_groups(FlatArena& a) {
  std::vector<ParamGroup> g(2);
  for (std::size_t i = 0; i < a.size(); ++i) {  // the last param in a group of its own
    g[i + 1 < a.size() ? 0 : 1].params.push_back(a.param(i));
    g[i + 1 < a.size() ? 0 : 1].grads.push_back(a.grad(i));
  }
  g[1].hypers = {{"lr", 0.03125}};
  return g;
}

void fill(FlatArena& a, std::uint32_t seed, int step, bool params) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    const fusedopt::Tensor t = params ? a.param(i) : a.grad(i);
    for (std::int64_t k = 0; k < t.numel; ++k) data(t)[k] = grad_value(seed, 0, step, i, k);
  }
}

/// Everything a load may change on this rank: the local state, step and hypers.
std::string snapshot(const ShardedOptimizer& opt) {
  std::string out = std::to_string(opt.step_count());
  for (int g = 0; g < 2; ++g) {
    for (const char* h : {"lr", "beta"}) out += "," + std::to_string(opt.hyper(h, g));
  }
  const fusedopt::Optimizer& local = opt.local();
  for (int i = 0; i < static_cast<int>(local.stats().tensors); ++i) {
    const fusedopt::Tensor m = local.state("m", i);
    out.append(static_cast<const char*>(m.data), static_cast<std::size_t>(m.numel) * 4);
  }
  return out;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_all(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// The set's files, index first, in the same order on every rank.
std::vector<fs::path> set_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  std::stable_partition(out.begin(), out.end(),
                        [](const fs::path& p) { return p.filename() == "index.safetensors"; });
  return out;
}

std::string load_error(ShardedOptimizer& opt, const fs::path& dir) {
  try {
    opt.load(dir);
  } catch (const fusedopt::Error& e) {
    return e.what();
  }
  return "";
}

fs::path fresh_dir(const char* what, std::uint32_t seed) {
  return fs::temp_directory_path() / (std::string("fusedopt-") + what + "-" + std::to_string(seed));
}

}  // namespace

TEST_SUITE("comm_mpi") {
  TEST_CASE("a shard of another save put in a set's place is refused, on every rank") {
    Communicator& comm = world();
    const std::uint32_t seed = shared_seed();
    const fs::path dir = fresh_dir("sharded-other", seed);
    FlatArena arena = make_arena({37, 5, 64});
    fill(arena, seed, 0, true);
    ShardedOptimizer opt(comm, Rule::parse(kRule, "short.rule"), two_groups(arena));
    fill(arena, seed, 1, false);
    REQUIRE(opt.step());
    opt.save(dir / "a");
    fill(arena, seed, 2, false);
    REQUIRE(opt.step());
    opt.save(dir / "b");
    fill(arena, seed, 3, false);
    REQUIRE(opt.step());
    opt.set_hyper("lr", 0.5);
    const std::string before = snapshot(opt);
    comm.barrier().wait();
    // Shard k of save b copied over shard k of set a, under a's name: the same names, a
    // valid file, another save.
    const std::vector<fs::path> a = set_files(dir / "a"), b = set_files(dir / "b");
    REQUIRE(a.size() == static_cast<std::size_t>(comm.size()) + 1);
    for (std::size_t k = 1; k < a.size(); ++k) {
      CAPTURE(k);
      comm.barrier().wait();
      const std::string saved = read_all(a[k]);
      if (comm.rank() == 0) write_all(a[k], read_all(b[k]));
      comm.barrier().wait();
      const std::string what = load_error(opt, dir / "a");
      CAPTURE(what);
      // Every rank refuses; the ranks that checked the file name it, the others the count.
      const bool named = what.find(a[k].string() +
                                   ": it holds step 2, the index's set step 1: "
                                   "it is a shard of another save") != std::string::npos;
      CHECK((named || what.find("ranks failed") != std::string::npos));
      CHECK(snapshot(opt) == before);
      double naming = named ? 1 : 0;
      comm.all_reduce(&naming, 1).wait();
      CHECK(naming >= 1);
      comm.barrier().wait();
      if (comm.rank() == 0) write_all(a[k], saved);
    }
    // A shard of another save at the same step (another lr): the index's record of the
    // checksum refuses it.
    comm.barrier().wait();
    opt.load(dir / "a");
    opt.set_hyper("lr", 0.25);
    opt.save(dir / "c");  // step 1 again, another tag
    comm.barrier().wait();
    const std::vector<fs::path> c = set_files(dir / "c");
    if (comm.rank() == 0) write_all(a.back(), read_all(c.back()));
    comm.barrier().wait();
    fill(arena, seed, 4, false);
    REQUIRE(opt.step());
    const std::string later = snapshot(opt);
    const std::string what = load_error(opt, dir / "a");
    CAPTURE(what);
    const bool named = what.find(a.back().string() + ": its checksum is ") != std::string::npos &&
                       what.find("the index recorded") != std::string::npos;
    CHECK((named || what.find("ranks failed") != std::string::npos));
    double naming = named ? 1 : 0;
    comm.all_reduce(&naming, 1).wait();
    CHECK(naming >= 1);
    CHECK(snapshot(opt) == later);
    comm.barrier().wait();
    if (comm.rank() == 0) fs::remove_all(dir);
  }

  TEST_CASE("merge and split check every file whole before they write anything") {
    Communicator& comm = world();
    const std::uint32_t seed = shared_seed();
    const fs::path dir = fresh_dir("sharded-merge-check", seed);
    FlatArena arena = make_arena({37, 5, 64});
    fill(arena, seed, 0, true);
    ShardedOptimizer opt(comm, Rule::parse(kRule, "short.rule"), two_groups(arena));
    fill(arena, seed, 1, false);
    REQUIRE(opt.step());
    opt.save(dir / "set");
    comm.barrier().wait();
    if (comm.rank() == 0) {
      ShardedOptimizer::merge_checkpoint(dir / "set", dir / "merged.safetensors");
      const std::string merged = read_all(dir / "merged.safetensors");
      fs::remove(dir / "merged.safetensors");
      // A flipped bit in the last shard's data (the end of the file) or in the index.
      for (const fs::path& damaged :
           {set_files(dir / "set").back(), dir / "set" / "index.safetensors"}) {
        CAPTURE(damaged);
        const std::string good = read_all(damaged);
        std::string bad = good;
        bad[bad.size() - 3] = static_cast<char>(bad[bad.size() - 3] ^ 4);
        write_all(damaged, bad);
        CHECK_THROWS_AS(ShardedOptimizer::merge_checkpoint(dir / "set", dir / "out.safetensors"),
                        fusedopt::IoError);
        CHECK_FALSE(fs::exists(dir / "out.safetensors"));
        write_all(damaged, good);
      }
      // split: a damaged merged file writes no shard and no index.
      std::string bad = merged;
      bad[bad.size() - 1] = static_cast<char>(bad[bad.size() - 1] ^ 1);
      write_all(dir / "bad.safetensors", bad);
      CHECK_THROWS_AS(ShardedOptimizer::split_checkpoint(dir / "bad.safetensors", dir / "split", 2),
                      fusedopt::IoError);
      CHECK_FALSE(fs::exists(dir / "split"));
      write_all(dir / "good.safetensors", merged);
      ShardedOptimizer::split_checkpoint(dir / "good.safetensors", dir / "split", 2);
      CHECK(fs::exists(dir / "split" / "index.safetensors"));
    }
    comm.barrier().wait();
    if (comm.rank() == 0) fs::remove_all(dir);
  }

  TEST_CASE("every single-bit flip of the index or of any shard is refused on every rank") {
    Communicator& comm = world();
    const std::uint32_t seed = shared_seed();
    const fs::path dir = fresh_dir("sharded-flips", seed);
    FlatArena arena = make_arena({13, 0, 6});
    fill(arena, seed, 0, true);
    ShardedOptimizer opt(comm, Rule::parse(kRule, "short.rule"), two_groups(arena));
    fill(arena, seed, 1, false);
    REQUIRE(opt.step());
    opt.save(dir);
    const std::string at_save = snapshot(opt);
    fill(arena, seed, 2, false);
    REQUIRE(opt.step());
    opt.set_hyper("beta", 0.5, 0);
    const std::string current = snapshot(opt);
    REQUIRE(current != at_save);
    comm.barrier().wait();

    const auto start = std::chrono::steady_clock::now();
    long flips = 0, refused = 0;
    for (const fs::path& file : set_files(dir)) {
      const std::string good = read_all(file);
      for (std::size_t i = 0; i < good.size(); ++i) {
        for (int bit = 0; bit < 8; ++bit) {
          // Rank 0 flips one bit in place; every rank loads; rank 0 puts it back.
          if (comm.rank() == 0) {
            const int fd = ::open(file.c_str(), O_WRONLY);
            REQUIRE(fd >= 0);
            const char c = static_cast<char>(good[i] ^ (1 << bit));
            REQUIRE(::pwrite(fd, &c, 1, static_cast<off_t>(i)) == 1);
            ::close(fd);
          }
          comm.barrier().wait();
          INFO(file.filename().string(), " byte ", i, " bit ", bit);
          const bool loaded = load_error(opt, dir).empty();
          // Refused on every rank, or (a flip a reader ignores) loaded on every rank.
          double n = loaded ? 1 : 0;
          comm.all_reduce(&n, 1).wait();
          REQUIRE((n == 0 || n == comm.size()));
          ++flips;
          if (loaded) {
            REQUIRE(snapshot(opt) == at_save);
          } else {
            ++refused;
            REQUIRE(snapshot(opt) == current);
          }
          comm.barrier().wait();
          if (comm.rank() == 0) {
            const int fd = ::open(file.c_str(), O_WRONLY);
            REQUIRE(fd >= 0);
            REQUIRE(::pwrite(fd, &good[i], 1, static_cast<off_t>(i)) == 1);
            ::close(fd);
          }
          if (loaded) {
            // Back to the state under test: the good set, then the same step and hyper.
            comm.barrier().wait();
            opt.load(dir);
            fill(arena, seed, 2, false);
            REQUIRE(opt.step());
            opt.set_hyper("beta", 0.5, 0);
            REQUIRE(snapshot(opt) == current);
          }
        }
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (comm.rank() == 0) {
      MESSAGE(comm.size(), " ranks: ", flips, " flips over ", set_files(dir).size(), " files, ",
              refused, " refused on every rank, in ", seconds, " s");
    }
    CHECK(refused == flips);
    comm.barrier().wait();
    if (comm.rank() == 0) fs::remove_all(dir);
  }
}

}  // namespace fusedopt_tests
