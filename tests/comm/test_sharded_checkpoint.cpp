// Sharded checkpoints under mpiexec (1 to 4 ranks): every file of a set is bound to its save
// (the index records each shard's checksum), so a shard of another save is refused; merge
// and split check everything before they write; and every single-bit flip of the index or
// of any shard is refused on every rank, with every rank's optimizer unchanged.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/comm_world.hpp"
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

namespace fusedopt::testing {
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

/// One step, a save into `dir`, then one more step: returns the state as saved.
std::string save_between_steps(ShardedOptimizer& opt, FlatArena& arena, std::uint32_t seed,
                               const fs::path& dir) {
  fill(arena, seed, 1, false);
  REQUIRE(opt.step());
  opt.save(dir);
  const std::string saved = snapshot(opt);
  fill(arena, seed, 2, false);
  REQUIRE(opt.step());
  return saved;
}

fs::path fresh_dir(const char* what, std::uint32_t seed) {
  return fs::temp_directory_path() / (std::string("fusedopt-") + what + "-" + std::to_string(seed));
}

}  // namespace

TEST_SUITE("comm") {
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

  TEST_CASE("a sharded load reads its pieces from memory: no temporary file, no such folder") {
    Communicator& comm = world();
    const std::uint32_t seed = shared_seed();
    const fs::path dir = fresh_dir("sharded-memory", seed);
    FlatArena arena = make_arena({37, 5, 64});
    fill(arena, seed, 0, true);
    ShardedOptimizer opt(comm, Rule::parse(kRule, "short.rule"), two_groups(arena));
    const std::string saved = save_between_steps(opt, arena, seed, dir);
    REQUIRE(snapshot(opt) != saved);
    // The temporary folder does not exist: a load that staged a file there would fail.
    const char* tmpdir = std::getenv("TMPDIR");
    const std::string old = tmpdir ? tmpdir : "";
    const fs::path gone = dir / "no-such-folder";
    ::setenv("TMPDIR", gone.c_str(), 1);
    const std::string what = load_error(opt, dir);
    if (tmpdir) {
      ::setenv("TMPDIR", old.c_str(), 1);
    } else {
      ::unsetenv("TMPDIR");
    }
    CHECK(what == "");
    CHECK(snapshot(opt) == saved);
    CHECK_FALSE(fs::exists(gone));
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
    const std::string at_save = save_between_steps(opt, arena, seed, dir);
    opt.set_hyper("beta", 0.5, 0);
    const std::string current = snapshot(opt);
    REQUIRE(current != at_save);
    comm.barrier().wait();

    const auto start = std::chrono::steady_clock::now();
    // Every bit of every file. Each rank flips the same bit in its own copy of the set and
    // loads that (load() takes each rank's path), so that a load costs one collective (its
    // all-or-none vote) and no barrier; the verdicts are compared across ranks in batches.
    struct Flip {
      std::size_t file, byte;
      int bit;
    };
    std::vector<Flip> all;
    const std::vector<fs::path> files = set_files(dir);
    const fs::path mine =
        dir.parent_path() / (dir.filename().string() + "-rank" + std::to_string(comm.rank()));
    fs::create_directories(mine);
    std::vector<std::string> good;
    for (std::size_t f = 0; f < files.size(); ++f) {
      good.push_back(read_all(files[f]));
      write_all(mine / files[f].filename(), good[f]);
      for (std::size_t i = 0; i < good[f].size(); ++i) {
        for (int bit = 0; bit < 8; ++bit) all.push_back({f, i, bit});
      }
    }
    std::vector<int> fds;  // this rank's copy, open for the flips
    for (const fs::path& f : files) {
      fds.push_back(::open((mine / f.filename()).c_str(), O_WRONLY | O_CLOEXEC));
      REQUIRE(fds.back() >= 0);
    }
    auto put = [&](const Flip& flip, char byte) {
      REQUIRE(::pwrite(fds[flip.file], &byte, 1, static_cast<off_t>(flip.byte)) == 1);
    };
    constexpr std::size_t kBatch = 1024;
    long refused = 0;
    for (std::size_t first = 0; first < all.size(); first += kBatch) {
      const std::size_t n = std::min(kBatch, all.size() - first);
      std::vector<double> loaded(n, 0.0);
      for (std::size_t k = 0; k < n; ++k) {
        const Flip& flip = all[first + k];
        INFO(files[flip.file].filename().string(), " byte ", flip.byte, " bit ", flip.bit);
        const char was = good[flip.file][flip.byte];
        put(flip, static_cast<char>(was ^ (1 << flip.bit)));
        const bool ok = load_error(opt, mine).empty();
        put(flip, was);
        if (!ok) {
          ++refused;
          REQUIRE(snapshot(opt) == current);
          continue;
        }
        // A flip a reader ignores: the set as saved, bit for bit; then back to the state
        // under test (the good set, the same step and hyper) on every rank.
        loaded[k] = 1;
        REQUIRE(snapshot(opt) == at_save);
        opt.load(dir);
        fill(arena, seed, 2, false);
        REQUIRE(opt.step());
        opt.set_hyper("beta", 0.5, 0);
        REQUIRE(snapshot(opt) == current);
      }
      // Refused on every rank, or loaded on every rank: never some of them.
      std::vector<double> sum = loaded;
      comm.all_reduce(sum.data(), static_cast<std::int64_t>(n)).wait();
      for (std::size_t k = 0; k < n; ++k) {
        CAPTURE(first + k);
        REQUIRE(sum[k] == loaded[k] * comm.size());
      }
    }
    for (int fd : fds) ::close(fd);
    fs::remove_all(mine);
    const long flips = static_cast<long>(all.size());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (comm.rank() == 0) {
      MESSAGE(comm.size(), " ranks: ", flips, " flips over ", files.size(), " files, ", refused,
              " refused on every rank, in ", seconds, " s");
    }
    CHECK(refused == flips);
    comm.barrier().wait();
    if (comm.rank() == 0) fs::remove_all(dir);
  }
}

}  // namespace fusedopt::testing
