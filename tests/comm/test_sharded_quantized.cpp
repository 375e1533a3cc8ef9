// Block-quantized states under ZeRO (this suite runs at 1 to 4 ranks): a param with quantized
// states is cut only on its blocks' boundaries, so each rank's pieces hold exactly the codes
// and absmax of plain data parallel's whole params (8-bit and 4-bit, ZeRO-1 and ZeRO-2);
// their sharded checkpoints load at every world size up to W, merge into one file a plain
// Optimizer loads, and split back for any world size, bit for bit.
#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/comm_world.hpp"
#include "fusedopt/comm.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/optimizer.hpp"
#include "fusedopt/safetensors.hpp"
#include "fusedopt/sharded.hpp"

using fusedopt::FlatArena;
using fusedopt::Optimizer;
using fusedopt::OptimizerOptions;
using fusedopt::ParamGroup;
using fusedopt::Rule;
using fusedopt::Tensor;
using fusedopt::comm::Communicator;
using fusedopt::comm::GradBucketer;
using fusedopt::comm::ShardedOptimizer;
using fusedopt::comm::ShardOptions;

namespace fusedopt::testing {
namespace {

// 9,478 elements; with quant_min_numel 3000 only w3 (8,191) is quantized, every shard
// boundary at 2 to 4 ranks falls inside it, off its blocks, and at 3 and 4 ranks some of
// its pieces are below 3000 elements (quantized all the same, as their param).
const std::vector<std::int64_t> kSizes = {1009, 0, 17, 8191, 3, 257, 1};

/// The storage of a case: adamw8bit's (q8s/q8u, blocks of 256) or AdamW with 4-bit states
/// (q4s/q4u, blocks of 128).
struct Storage {
  const char* name;
  const char* rule;
  std::vector<std::pair<std::string, std::string>> state_storage;
  int block;
};

const std::vector<Storage> kStorages = {
    {"8-bit", "adamw8bit", {}, 256},
    {"4-bit", "adamw", {{"*", "q4"}}, 128},
};

OptimizerOptions options_of(const Storage& s) {
  OptimizerOptions o;
  o.state_storage = s.state_storage;
  o.quant_min_numel = 3000;
  return o;
}

FlatArena filled_arena(std::uint32_t seed) {
  FlatArena a = make_arena(kSizes);
  std::mt19937 init(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::size_t i = 0; i < a.size(); ++i) {
    for (std::int64_t k = 0; k < kSizes[i]; ++k) data(a.param(i))[k] = normal(init);
  }
  return a;
}

/// Plain data parallel over its own arena: all-reduced gradients, the whole params.
struct DataParallel {
  FlatArena arena;
  Optimizer opt;
  GradBucketer bucketer;
  DataParallel(Communicator& comm, const Storage& s, std::uint32_t seed)
      : arena(filled_arena(seed)),
        opt(Rule::preset(s.rule), group_of(arena), options_of(s)),
        bucketer(comm, grads_of(arena)) {}
  static std::vector<Tensor> grads_of(FlatArena& a) {
    std::vector<Tensor> g;
    for (std::size_t i = 0; i < a.size(); ++i) g.push_back(a.grad(i));
    return g;
  }
  void step(std::uint32_t seed, int rank, int step) {
    fill_grads(arena, seed, rank, step);
    bucketer.mark_all_ready();
    bucketer.finish();
    REQUIRE(opt.step_scaled(bucketer.grad_scale()));
  }
};

/// Bytes [first, last) of `t`'s data (a state view: codes, absmax or values).
std::vector<unsigned char> bytes(const Tensor& t, std::int64_t first, std::int64_t last) {
  const auto* p = static_cast<const unsigned char*>(t.data);
  return std::vector<unsigned char>(p + first, p + last);
}

/// Every state of every piece `sharded` owns (codes, absmax, unquantized values) equals the
/// bytes of the whole param's state in `whole` that hold the same elements.
void check_pieces(const ShardedOptimizer& sharded, const Optimizer& whole, const Storage& s) {
  for (int i = 0; i < static_cast<int>(kSizes.size()); ++i) {
    const auto [begin, end] = sharded.owned_range(i);
    if (begin == end) continue;
    CAPTURE(i);
    CAPTURE(begin);
    const bool quantized = kSizes[static_cast<std::size_t>(i)] >= 3000;
    if (quantized) CHECK(begin % s.block == 0);  // cut on the blocks
    for (const char* state : {"m", "v"}) {
      CAPTURE(state);
      const Tensor mine = sharded.state(state, i), all = whole.state(state, i);
      // Codes: one byte per element (8-bit) or per two (4-bit); values: 4 bytes each.
      const std::int64_t per_byte = !quantized ? 1 : s.block == 128 ? 2 : 1;
      const std::int64_t size = quantized ? 1 : 4;
      const std::int64_t first = begin / per_byte * size;
      REQUIRE(mine.numel == (end - begin + per_byte - 1) / per_byte);
      CHECK(bytes(mine, 0, mine.numel * size) == bytes(all, first, first + mine.numel * size));
      if (!quantized) continue;
      const std::string absmax = std::string(state) + ".absmax";
      const Tensor a = sharded.state(absmax, i), b = whole.state(absmax, i);
      REQUIRE(a.numel == (end - begin + s.block - 1) / s.block);
      CHECK(bytes(a, 0, a.numel * 4) ==
            bytes(b, begin / s.block * 4, (begin / s.block + a.numel) * 4));
    }
  }
}

/// `path` rewritten in place after `edit(tensor, bytes)` saw each tensor and `meta(metadata)`
/// the metadata (the writer recomputes the checksum); returns the new checksum.
template <class Edit, class Meta>
std::string rewrite(const std::filesystem::path& path, Edit edit, Meta meta) {
  std::vector<std::vector<unsigned char>> data;
  std::vector<SafetensorsTensor> tensors;
  std::map<std::string, std::string> metadata;
  {
    const SafetensorsReader r(path);
    metadata = r.metadata();
    for (const std::string& n : r.names()) {
      const auto e = r.entry(n);
      data.emplace_back(e.bytes);
      if (e.bytes > 0) r.read(n, 0, e.bytes, data.back().data());
      tensors.push_back({n, *dtype_of_safetensors_name(e.dtype), e.shape.empty() ? 1 : e.shape[0],
                         data.back().data()});
    }
  }
  for (std::size_t k = 0; k < tensors.size(); ++k) edit(tensors[k], data[k]);
  meta(metadata);
  write_safetensors(path, tensors, metadata);
  return SafetensorsReader(path).checksum();
}

/// Every byte of every state `sharded` keeps, to tell that a refused load changed nothing.
std::vector<unsigned char> all_states(const ShardedOptimizer& sharded) {
  std::vector<unsigned char> out;
  for (int i = 0; i < static_cast<int>(kSizes.size()); ++i) {
    for (const char* state : {"m", "v", "m.absmax", "v.absmax"}) {
      if (kSizes[static_cast<std::size_t>(i)] < 3000 && std::strchr(state, '.')) continue;
      const Tensor t = sharded.state(state, i);
      const std::vector<unsigned char> b =
          bytes(t, 0, t.numel * static_cast<std::int64_t>(dtype_size(t.dtype)));
      out.insert(out.end(), b.begin(), b.end());
    }
  }
  return out;
}

}  // namespace

TEST_SUITE("comm") {
  TEST_CASE("quantized states under ZeRO-1 and ZeRO-2 hold plain data parallel's codes") {
    Communicator& comm = world();
    for (const Storage& s : kStorages) {
      for (const int stage : {1, 2}) {
        CAPTURE(s.name);
        CAPTURE(stage);
        const std::uint32_t seed = shared_seed();
        FlatArena arena = filled_arena(seed);
        ShardOptions options;
        options.stage = stage;
        options.buckets.first_bucket_bytes = 4096;
        options.buckets.bucket_bytes = 16384;
        options.optimizer = options_of(s);
        ShardedOptimizer sharded(comm, Rule::preset(s.rule), group_of(arena), options);
        DataParallel dp(comm, s, seed);
        for (int step = 0; step < 6; ++step) {
          fill_grads(arena, seed, comm.rank(), step);
          REQUIRE(sharded.step());
          dp.step(seed, comm.rank(), step);
        }
        // The same codes from the same all-reduced gradients: the same params, bit for bit.
        const std::vector<float> a = params_of(arena), b = params_of(dp.arena);
        CHECK(same_bytes(a.data(), b.data(), a.size() * 4));
        check_pieces(sharded, dp.opt, s);
        // Summed over the ranks, the whole params' state bytes: each piece's two states may
        // add an arena's 64-byte alignment.
        double state = static_cast<double>(sharded.stats().state_bytes);
        comm.all_reduce(&state, 1).wait();
        const auto whole = static_cast<double>(dp.opt.stats().state_bytes);
        CHECK(state >= whole);
        CHECK(state <= whole + 2 * 64 * 3 * (comm.size() - 1));
      }
    }
  }

  TEST_CASE("a quantized sharded checkpoint loads at any world size, merges and splits") {
    Communicator& comm = world();
    for (const Storage& s : kStorages) {
      CAPTURE(s.name);
      const std::uint32_t seed = shared_seed();
      const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                        ("fusedopt-sharded-quant-" + std::to_string(seed));
      ShardOptions options;
      options.optimizer = options_of(s);
      FlatArena arena = filled_arena(seed);
      ShardedOptimizer sharded(comm, Rule::preset(s.rule), group_of(arena), options);
      DataParallel dp(comm, s, seed);
      for (int step = 0; step < 3; ++step) {
        fill_grads(arena, seed, comm.rank(), step);
        REQUIRE(sharded.step());
        dp.step(seed, comm.rank(), step);
      }
      sharded.save(dir / "sharded");
      // Loaded by groups of 1..W ranks: each one's pieces are the whole params' bytes.
      for (int k = 1; k <= comm.size(); ++k) {
        CAPTURE(k);
        MPI_Comm group = MPI_COMM_NULL;
        MPI_Comm_split(MPI_COMM_WORLD, comm.rank() < k ? 0 : MPI_UNDEFINED, comm.rank(), &group);
        if (group != MPI_COMM_NULL) {
          Communicator sub = Communicator::mpi(&group);
          FlatArena fresh = filled_arena(seed);
          ShardedOptimizer loaded(sub, Rule::preset(s.rule), group_of(fresh), options);
          loaded.load(dir / "sharded");
          CHECK(loaded.step_count() == 3);
          check_pieces(loaded, dp.opt, s);
          MPI_Comm_free(&group);
        }
        comm.barrier().wait();
      }
      // Merged: one file a plain Optimizer loads with the whole params' states; split again
      // for 3 ranks, the W-rank optimizer loads it.
      if (comm.rank() == 0) {
        ShardedOptimizer::merge_checkpoint(dir / "sharded", dir / "merged.safetensors");
        FlatArena plain_arena = filled_arena(seed);
        Optimizer plain(Rule::preset(s.rule), group_of(plain_arena), options_of(s));
        plain.load(dir / "merged.safetensors");
        CHECK(plain.step_count() == 3);
        for (int i = 0; i < static_cast<int>(kSizes.size()); ++i) {
          for (const char* state : {"m", "v", "m.absmax", "v.absmax"}) {
            if (kSizes[static_cast<std::size_t>(i)] < 3000 && std::strchr(state, '.')) continue;
            const Tensor a = plain.state(state, i), b = dp.opt.state(state, i);
            REQUIRE(a.numel == b.numel);
            CHECK(same_bytes(a.data, b.data,
                             static_cast<std::size_t>(a.numel) * fusedopt::dtype_size(a.dtype)));
          }
        }
        ShardedOptimizer::split_checkpoint(dir / "merged.safetensors", dir / "split", 3);
      }
      comm.barrier().wait();
      FlatArena again_arena = filled_arena(seed);
      ShardedOptimizer again(comm, Rule::preset(s.rule), group_of(again_arena), options);
      again.load(dir / "split");
      check_pieces(again, dp.opt, s);
      // Another storage refuses the checkpoint, naming both.
      ShardOptions other = options;
      other.optimizer.state_storage = {{"m", "q8s"}, {"v", "q8s"}};
      FlatArena other_arena = filled_arena(seed);
      ShardedOptimizer wrong(comm, Rule::preset(s.rule), group_of(other_arena), other);
      CHECK_THROWS_WITH_AS(wrong.load(dir / "sharded"), doctest::Contains("states are stored as"),
                           fusedopt::Error);
      comm.barrier().wait();
      if (comm.rank() == 0) std::filesystem::remove_all(dir);
    }
  }

  TEST_CASE("an absmax made NaN in one rank's pieces is refused on every rank, none loading") {
    Communicator& comm = world();
    const Storage& s = kStorages[0];
    const std::uint32_t seed = shared_seed();
    const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                      ("fusedopt-sharded-absmax-" + std::to_string(seed));
    ShardOptions options;
    options.optimizer = options_of(s);
    FlatArena arena = filled_arena(seed);
    ShardedOptimizer sharded(comm, Rule::preset(s.rule), group_of(arena), options);
    for (int step = 0; step < 3; ++step) {
      fill_grads(arena, seed, comm.rank(), step);
      REQUIRE(sharded.step());
    }
    sharded.save(dir);
    // The last rank's shard gets a NaN absmax, its checksum and the index's record of it
    // recomputed: every file is as a writer made it.
    if (comm.rank() == 0) {
      std::string last, digest;
      auto keep = [](const SafetensorsTensor&, std::vector<unsigned char>&) {};
      auto same_meta = [](std::map<std::string, std::string>&) {};
      rewrite(dir / "index.safetensors", keep, [&](std::map<std::string, std::string>& meta) {
        const std::string files = meta.at("files");
        const std::size_t begin = files.size() < 2 ? 0 : files.rfind('\n', files.size() - 2) + 1;
        last = files.substr(begin, files.find('\t', begin) - begin);
      });
      digest = rewrite(
          dir / last,
          [](const SafetensorsTensor& t, std::vector<unsigned char>& b) {
            const std::string tail = "/m.absmax";
            if (t.name.size() > tail.size() &&
                t.name.compare(t.name.size() - tail.size(), tail.size(), tail) == 0 &&
                t.numel > 0) {
              const float nan = std::nanf("");
              std::memcpy(b.data(), &nan, 4);
            }
          },
          same_meta);
      rewrite(dir / "index.safetensors", keep, [&](std::map<std::string, std::string>& meta) {
        std::string& files = meta.at("files");
        const std::size_t at = files.find(last + "\t") + last.size() + 1;
        files.replace(at, digest.size(), digest);
      });
    }
    comm.barrier().wait();
    FlatArena fresh = filled_arena(seed);
    ShardedOptimizer loaded(comm, Rule::preset(s.rule), group_of(fresh), options);
    fill_grads(fresh, seed + 1, comm.rank(), 0);
    REQUIRE(loaded.step());
    const std::vector<unsigned char> before = all_states(loaded);
    const bool holder = comm.rank() == comm.size() - 1;
    const std::string expected =
        holder ? "state 'm' of param 'w3': the absmax of block 0 (elements 0 to 255) is nan"
               : "1 of " + std::to_string(comm.size()) + " ranks failed";
    CHECK_THROWS_WITH_AS(loaded.load(dir), doctest::Contains(expected.c_str()),
                         fusedopt::UsageError);
    CHECK(all_states(loaded) == before);
    CHECK(loaded.step_count() == 1);
    comm.barrier().wait();
    if (comm.rank() == 0) std::filesystem::remove_all(dir);
  }
}

}  // namespace fusedopt::testing
