// fusedopt-ckpt end to end (FUSEDOPT_CKPT_CLI): an output that is one of the inputs is
// refused with exit 2 before anything is written; a split that fails partway leaves none of
// the shards it wrote; a file or a set whose params table does not account for every tensor
// is refused (exit 1), never converted with tensors left out.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/run.hpp"
#include "fusedopt/optimizer.hpp"
#include "fusedopt/safetensors.hpp"

namespace fusedopt::testing {

namespace fs = std::filesystem;

namespace {

CliResult ckpt(const std::vector<std::string>& args) {
  RunOptions options;
  options.binary = FUSEDOPT_CKPT_CLI;
  return run_cli(args, options);
}

std::string bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

/// An adamw checkpoint of params "a" (5 elements) and "b" (3) after one step on fresh
/// random data, at `path`.
void save_checkpoint(const fs::path& path) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  static std::vector<float> p[2], g[2];
  const std::int64_t sizes[2] = {5, 3};
  fusedopt::ParamGroup group;
  for (int k = 0; k < 2; ++k) {
    p[k].resize(static_cast<std::size_t>(sizes[k]));
    g[k].resize(p[k].size());
    for (float& x : p[k]) x = normal(rng);
    for (float& x : g[k]) x = normal(rng);
    group.params.push_back(fusedopt::Tensor(p[k].data(), sizes[k], fusedopt::DType::F32,
                                            fusedopt::Device::host(), k == 0 ? "a" : "b"));
    group.grads.push_back(fusedopt::Tensor(g[k].data(), sizes[k], fusedopt::DType::F32,
                                           fusedopt::Device::host(), ""));
  }
  fusedopt::Optimizer opt(fusedopt::Rule::preset("adamw"), {group});
  opt.step();
  opt.save(path);
}

/// A copy of `from` at `to` with one more F32 tensor `extra` of 3 elements (the metadata,
/// params table included, as it was; the checksum recomputed by the writer).
void add_tensor(const fs::path& from, const fs::path& to, const std::string& extra) {
  const fusedopt::SafetensorsReader in(from);
  std::vector<std::vector<char>> data;
  std::vector<fusedopt::SafetensorsTensor> tensors;
  for (const std::string& name : in.names()) {
    const auto e = in.entry(name);
    data.emplace_back(e.bytes);
    in.read(name, 0, e.bytes, data.back().data());
    REQUIRE(e.dtype == "F32");  // adamw's states, unquantized
    tensors.push_back(
        {name, fusedopt::DType::F32, static_cast<std::int64_t>(e.bytes / 4), nullptr});
  }
  const float three[3] = {1.0f, 2.0f, 3.0f};
  tensors.push_back({extra, fusedopt::DType::F32, 3, three});
  for (std::size_t i = 0; i < data.size(); ++i) tensors[i].data = data[i].data();
  fusedopt::write_safetensors(to, tensors, in.metadata());
}

bool has(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

}  // namespace

TEST_SUITE("cli") {
  TEST_CASE("fusedopt-ckpt refuses an output that is one of its inputs, exit 2, input intact") {
    TempDir dir;
    const fs::path file = dir.path() / "ckpt.safetensors", set = dir.path() / "set";
    save_checkpoint(file);
    REQUIRE(ckpt({"split", file.string(), set.string(), "--ranks", "2"}).code == 0);
    std::vector<std::string> files = listing(set);
    REQUIRE(files.size() == 3);
    const fs::path index = set / "index.safetensors";
    const fs::path shard = set / files[1];  // files[0] is the index
    const std::string index_bytes = bytes_of(index), shard_bytes = bytes_of(shard);
    fs::create_hard_link(index, dir.path() / "alias.safetensors");
    // The index, a shard, and the index by another name: each is refused before writing.
    for (const fs::path& out :
         {index, shard, dir.path() / "alias.safetensors", set / "." / "index.safetensors"}) {
      CAPTURE(out);
      const CliResult r = ckpt({"merge", set.string(), out.string()});
      CHECK(r.code == 2);
      CHECK(has(r.err, "merge_checkpoint: the output " + out.string() + " is the input "));
      CHECK(has(r.err, "(writing it would destroy the input)"));
    }
    CHECK(bytes_of(index) == index_bytes);
    CHECK(bytes_of(shard) == shard_bytes);
    CHECK(listing(set) == files);
    CHECK(ckpt({"merge", set.string(), (dir.path() / "merged.safetensors").string()}).code == 0);
    // split: FILE is the index the split would write last.
    const fs::path into = dir.path() / "into";
    fs::create_directory(into);
    fs::copy_file(file, into / "index.safetensors");
    const CliResult r =
        ckpt({"split", (into / "index.safetensors").string(), into.string(), "--ranks", "2"});
    CHECK(r.code == 2);
    CHECK(has(r.err, "split_checkpoint: the output "));
    CHECK(listing(into) == std::vector<std::string>{"index.safetensors"});
    CHECK(bytes_of(into / "index.safetensors") == bytes_of(file));
  }

  TEST_CASE("a fusedopt-ckpt split that fails partway removes the shards it wrote") {
    TempDir dir;
    const fs::path file = dir.path() / "ckpt.safetensors";
    save_checkpoint(file);
    REQUIRE(ckpt({"split", file.string(), (dir.path() / "ok").string(), "--ranks", "2"}).code == 0);
    const std::vector<std::string> names = listing(dir.path() / "ok");
    REQUIRE(names.size() == 3);  // index, shard 0, shard 1
    // Rank 1's name is taken by a folder: shard 0 is written, then shard 1 fails.
    const fs::path partial = dir.path() / "partial";
    fs::create_directories(partial / names[2]);
    const CliResult r = ckpt({"split", file.string(), partial.string(), "--ranks", "2"});
    CHECK(r.code == 1);
    CHECK(has(r.err, names[2]));
    CHECK(listing(partial) == std::vector<std::string>{names[2]});
  }

  TEST_CASE("fusedopt-ckpt refuses a file or set with a tensor its params table leaves out") {
    TempDir dir;
    const fs::path file = dir.path() / "ckpt.safetensors";
    save_checkpoint(file);
    // split: "c/m" belongs to no param of the table; it would be in no shard.
    add_tensor(file, dir.path() / "extra.safetensors", "c/m");
    const fs::path out = dir.path() / "out";
    CliResult r =
        ckpt({"split", (dir.path() / "extra.safetensors").string(), out.string(), "--ranks", "2"});
    CHECK(r.code == 1);
    CHECK(has(r.err, "tensor 'c/m' belongs to no param of the params table"));
    CHECK_FALSE(fs::exists(out));
    // merge: the same tensor added to shard 0, and the index updated to its new checksum.
    const fs::path set = dir.path() / "set";
    REQUIRE(ckpt({"split", file.string(), set.string(), "--ranks", "2"}).code == 0);
    const std::string shard = listing(set)[1];
    const std::string old_sum = fusedopt::SafetensorsReader(set / shard).checksum();
    add_tensor(set / shard, dir.path() / "shard.tmp", "c/m");
    fs::rename(dir.path() / "shard.tmp", set / shard);
    const std::string new_sum = fusedopt::SafetensorsReader(set / shard).checksum();
    {
      const fusedopt::SafetensorsReader index(set / "index.safetensors");
      std::map<std::string, std::string> meta = index.metadata();
      const std::size_t at = meta.at("files").find(old_sum);
      REQUIRE(at != std::string::npos);
      meta.at("files").replace(at, old_sum.size(), new_sum);
      fusedopt::write_safetensors(dir.path() / "index.tmp", {}, meta);
    }
    fs::rename(dir.path() / "index.tmp", set / "index.safetensors");
    const fs::path merged = dir.path() / "merged.safetensors";
    r = ckpt({"merge", set.string(), merged.string()});
    CHECK(r.code == 1);
    CHECK(has(r.err, "tensor 'c/m' belongs to no param of the params table"));
    CHECK_FALSE(fs::exists(merged));
  }
}

}  // namespace fusedopt::testing
