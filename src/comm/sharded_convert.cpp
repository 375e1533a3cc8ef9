// ShardedOptimizer's conversions between a sharded checkpoint and the single file of
// Optimizer::save: merge_checkpoint (the pieces the index lists, put together) and
// split_checkpoint (cut as a ShardedOptimizer of that world size cuts, on the blocks of
// quantized states). Everything read is checked whole before anything is written.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "fusedopt/checkpoint_format.hpp"
#include "fusedopt/safetensors.hpp"
#include "fusedopt/sharded.hpp"
#include "shard_files.hpp"
#include "support/check.hpp"

namespace fusedopt::comm {

using detail::block_of;
using detail::check_claimed;
using detail::check_tiling;
using detail::cut_into_shards;
using detail::cut_of;
using detail::Index;
using detail::OldPiece;
using detail::Overlap;
using detail::overlap;
using detail::parse_params;
using detail::Piece;
using detail::read_index;
using detail::read_pieces;
using detail::refuse_input_as_output;
using detail::shard_file;
using detail::ShardReaders;
using detail::st_bytes;
using detail::st_to_dtype;
using detail::state_dtype_of;
using detail::StateCut;
using detail::states_of;
using detail::to_int;
using detail::verify_whole;
using detail::write_index;
namespace ck = fusedopt::checkpoint;
using ck::Refusal;

void ShardedOptimizer::merge_checkpoint(const std::filesystem::path& dir,
                                        const std::filesystem::path& file) {
  // Everything is checked whole before anything is written.
  const Refusal refusal{fmt::format("cannot merge sharded checkpoint {}", dir.string())};
  const Index index = read_index(dir);
  std::vector<std::filesystem::path> inputs{index.reader->path()};
  for (const auto& [name, digest] : index.files) inputs.push_back(dir / name);
  refuse_input_as_output("merge_checkpoint", file, inputs);
  std::vector<std::string> names;
  std::vector<std::pair<std::int64_t, DType>> sizes;
  parse_params(index.meta(ck::kParamsKey), index.reader->path().string(), &names, &sizes);
  std::vector<std::int64_t> numel;
  for (const auto& [n, d] : sizes) numel.push_back(n);
  const std::vector<std::vector<OldPiece>> old = read_pieces(index, numel, refusal);
  ShardReaders reader(dir, index);
  for (std::size_t f = 0; f < index.files.size(); ++f) reader(f);
  const std::map<std::string, std::string>& saved = reader(0).metadata();
  const std::int64_t block = block_of(saved);
  // Each param's states as its pieces hold them; an empty param (no piece) has the rule's
  // states unquantized in state_dtype, and a master when the others have one.
  std::vector<Overlap> overlaps;
  for (std::size_t i = 0; i < names.size(); ++i)
    overlaps.push_back(overlap(names[i], 0, numel[i], old[i], reader, block));
  std::vector<std::pair<std::string, std::string>> empty_states;
  for (const Overlap& o : overlaps) {
    for (const auto& [state, st] : o.states) {
      if (state.find('.') != std::string::npos || state == "master") continue;
      empty_states.emplace_back(
          state, st == safetensors_name(DType::U8) ? safetensors_name(state_dtype_of(saved)) : st);
    }
    if (!o.states.empty()) break;
  }
  const bool masters =
      saved.count(ck::kMasterWeightsKey) && saved.at(ck::kMasterWeightsKey) == "true";
  struct Out {
    std::size_t param;
    std::string state, st;
    StateCut cut;
  };
  std::vector<Out> plan;
  std::vector<SafetensorsTensor> tensors;
  for (std::size_t i = 0; i < names.size(); ++i) {
    std::vector<std::pair<std::string, std::string>> own = overlaps[i].states;
    std::vector<StateCut> cuts = overlaps[i].cuts;
    if (numel[i] == 0) {
      own = empty_states;
      if (masters && sizes[i].second != DType::F32)
        own.emplace_back("master", safetensors_name(DType::F32));
      cuts.assign(own.size(), StateCut{});
    }
    for (std::size_t k = 0; k < own.size(); ++k) {
      plan.push_back({i, own[k].first, own[k].second, cuts[k]});
      tensors.push_back({ck::tensor_name(names[i], own[k].first), st_to_dtype(own[k].second),
                         cuts[k].range(0, numel[i]).second, nullptr});
    }
  }
  for (std::size_t i = 0; i < names.size(); ++i) check_tiling(names[i], numel[i], old[i], refusal);
  // Every tensor of every shard is some param's piece of a state.
  std::vector<std::set<std::string>> claimed(index.files.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    for (const OldPiece& p : old[i]) {
      for (const auto& [state, st] : overlaps[i].states)
        claimed[p.file].insert(ck::tensor_name(names[i], state));
    }
  }
  for (std::size_t f = 0; f < index.files.size(); ++f) check_claimed(reader(f), claimed[f]);
  std::map<std::string, std::string> metadata = saved;
  metadata[ck::kParamsKey] = index.meta(ck::kParamsKey);
  write_safetensors(file, tensors, metadata, [&](std::size_t k, void* out) {
    const Out& o = plan[k];
    const std::size_t es = st_bytes(o.st);
    for (const OldPiece& p : old[o.param]) {
      const auto [from, to] = o.cut.range(p.begin, p.end);
      reader(p.file).read(ck::tensor_name(names[o.param], o.state), 0,
                          static_cast<std::uint64_t>(to - from) * es,
                          static_cast<char*>(out) + static_cast<std::size_t>(from) * es);
    }
  });
}

namespace {

/// Writes rank `r`'s shard of a split (the pieces `cut` gives it, each state cut as `cuts`
/// says) at `shard`; returns its checksum.
std::string write_split_shard(
    const SafetensorsReader& in, const std::filesystem::path& shard, int r,
    const std::vector<std::string>& names,
    const std::vector<std::vector<std::pair<std::string, std::string>>>& states,
    const std::vector<std::vector<StateCut>>& cuts, const std::vector<std::vector<Piece>>& cut) {
  struct Out {
    std::string name;
    std::size_t bytes_begin;
    std::size_t bytes;
  };
  std::vector<Out> plan;
  std::vector<SafetensorsTensor> tensors;
  for (std::size_t i = 0; i < names.size(); ++i) {
    for (const Piece& p : cut[i]) {
      if (p.rank != r) continue;
      for (std::size_t k = 0; k < states[i].size(); ++k) {
        const auto& [state, st] = states[i][k];
        const std::size_t es = st_bytes(st);
        const auto [from, to] = cuts[i][k].range(p.begin, p.end);
        plan.push_back({ck::tensor_name(names[i], state), static_cast<std::size_t>(from) * es,
                        static_cast<std::size_t>(to - from) * es});
        tensors.push_back({ck::tensor_name(names[i], state), st_to_dtype(st), to - from, nullptr});
      }
    }
  }
  write_safetensors(shard, tensors, in.metadata(), [&](std::size_t k, void* out) {
    in.read(plan[k].name, plan[k].bytes_begin, plan[k].bytes, out);
  });
  return SafetensorsReader(shard).checksum();
}

}  // namespace

void ShardedOptimizer::split_checkpoint(const std::filesystem::path& file,
                                        const std::filesystem::path& dir, int world_size) {
  FUSEDOPT_CHECK_USAGE(world_size >= 1, "split_checkpoint: world size {} is not positive",
                       world_size);
  const SafetensorsReader in(file);
  verify_whole(in);  // before anything is written
  auto it = in.metadata().find(ck::kParamsKey);
  if (it == in.metadata().end()) {
    throw IoError(fmt::format(
        "{}: no parameter list in its metadata (written by a fusedopt older than 2026-11): "
        "load it into an Optimizer and save it again",
        file.string()));
  }
  std::vector<std::string> names;
  std::vector<std::pair<std::int64_t, DType>> sizes;
  parse_params(it->second, file.string(), &names, &sizes);
  // Each param's states and their cuts; a param with quantized states is cut on its blocks.
  const std::int64_t block = block_of(in.metadata());
  std::vector<std::vector<std::pair<std::string, std::string>>> states;
  std::vector<std::vector<StateCut>> cuts(names.size());
  std::vector<std::int64_t> align(names.size(), 1);
  bool aligned = false;
  for (std::size_t i = 0; i < names.size(); ++i) {
    states.push_back(states_of(in, names[i]));
    for (const auto& [state, st] : states.back()) {
      cuts[i].push_back(cut_of(in, names[i], state, st, sizes[i].first, block));
      align[i] = std::max(align[i], cuts[i].back().per);
      aligned = aligned || align[i] > 1;
    }
  }
  std::set<std::string> claimed;
  for (std::size_t i = 0; i < names.size(); ++i) {
    for (const auto& [state, st] : states[i]) claimed.insert(ck::tensor_name(names[i], state));
  }
  check_claimed(in, claimed);  // a tensor no param claims would be in no shard
  const std::vector<std::vector<Piece>> cut =
      cut_into_shards(sizes, world_size, aligned ? align : std::vector<std::int64_t>{});
  const std::string step = in.metadata().count(ck::kStepKey) ? in.metadata().at(ck::kStepKey) : "0";
  const std::string tag = fmt::format("{}-split{}", step, world_size);
  for (int r = 0; r <= world_size; ++r) {
    refuse_input_as_output(
        "split_checkpoint",
        dir / (r < world_size ? shard_file(tag, r, world_size) : detail::kIndexFile), {file});
  }
  // A failure partway leaves no partial set: the files this split created are removed (a
  // file it replaced is not restored; the index, written last, commits the set).
  std::vector<std::filesystem::path> created;
  std::error_code ec;
  auto note = [&](const std::filesystem::path& out) {
    if (!std::filesystem::exists(std::filesystem::symlink_status(out, ec))) created.push_back(out);
    return out;
  };
  const bool new_dir = std::filesystem::create_directories(dir);
  try {
    std::vector<std::string> digests;
    for (int r = 0; r < world_size; ++r) {
      const std::filesystem::path shard = note(dir / shard_file(tag, r, world_size));
      digests.push_back(write_split_shard(in, shard, r, names, states, cuts, cut));
    }
    note(dir / detail::kIndexFile);
    write_index(dir, tag, world_size, 1, to_int(step, "step"), names, sizes, cut, digests);
  } catch (...) {
    for (const std::filesystem::path& p : created) std::filesystem::remove(p, ec);
    if (new_dir) std::filesystem::remove(dir, ec);  // only if empty
    throw;
  }
}

}  // namespace fusedopt::comm
