// The files of a sharded checkpoint, shared by ShardedOptimizer's save and load
// (sharded_checkpoint.cpp) and the conversions to and from one file (sharded_convert.cpp):
// the index (format, files and their checksums, every piece), the shards, and how each
// saved state is cut with its param's elements (comm/shard_layout.hpp's StateCut).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fusedopt/checkpoint_format.hpp"
#include "fusedopt/dtype.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/safetensors.hpp"
#include "shard_layout.hpp"

namespace fusedopt::comm::detail {

inline constexpr const char* kIndexFile = "index.safetensors";
/// 2: each "files" line is "<file><TAB><its checksum>", every shard's checksum (16 hex
/// digits, over the whole file) as it was written by this save. 1 (before 2026-11-26): file
/// names alone; still read.
inline constexpr const char* kShardedFormat = "2";
inline constexpr const char* kOldestShardedFormat = "1";

/// A shard's file name: "shard-<tag>-<rank>-of-<ranks>.safetensors".
std::string shard_file(const std::string& tag, int rank, int ranks);

/// Reads all of `r` and checks it against its checksum; a file that carries the current
/// checkpoint format must have one. IoError naming the file otherwise.
void verify_whole(const SafetensorsReader& r);

/// An index, read and checked whole: its checksum, format, and the "files" lines as
/// (file, checksum; "" for format 1).
struct Index {
  std::unique_ptr<SafetensorsReader> reader;
  std::vector<std::pair<std::string, std::string>> files;
  const std::string& meta(const char* key) const {
    auto it = reader->metadata().find(key);
    if (it == reader->metadata().end()) {
      throw IoError(
          fmt::format("{}: index metadata '{}' is missing", reader->path().string(), key));
    }
    return it->second;
  }
};

/// An integer of the index; IoError (a malformed file) otherwise.
std::int64_t to_int(const std::string& text, const std::string& what);

/// The DType of a stored state's safetensors dtype; IoError for one no checkpoint holds.
DType st_to_dtype(const std::string& st);

/// Bytes per element of a stored state's safetensors dtype.
std::size_t st_bytes(const std::string& st);

/// The index of the set in `dir`, read and checked whole (IoError otherwise).
Index read_index(const std::filesystem::path& dir);

/// Opens shard `f` of `index` and checks all of it: its own checksum, the one the index
/// recorded for it (a shard of another save, or a file put in its place, is refused), and
/// its step against the index's.
std::unique_ptr<SafetensorsReader> open_shard(const std::filesystem::path& dir, const Index& index,
                                              std::size_t f);

/// Commits a set of shard files: `dir`/index.safetensors, written atomically.
void write_index(const std::filesystem::path& dir, const std::string& tag, int ranks, int stage,
                 std::int64_t step, const std::vector<std::string>& names,
                 const std::vector<std::pair<std::int64_t, DType>>& sizes,
                 const std::vector<std::vector<Piece>>& cut,
                 const std::vector<std::string>& digests);

/// The state tensors of parameter `name` in a checkpoint file: "<name>/<state>" (a state
/// name has no '/'), with their safetensors dtypes.
std::vector<std::pair<std::string, std::string>> states_of(const SafetensorsReader& r,
                                                           const std::string& name);

/// The quantization block a file's metadata records (0: none recorded).
std::int64_t block_of(const std::map<std::string, std::string>& metadata);

/// How state `state` (safetensors dtype `st`) of parameter `name`, as `file` holds it for
/// `numel` of its elements, is cut; IoError when its size fits no cut.
StateCut cut_of(const SafetensorsReader& file, const std::string& name, const std::string& state,
                const std::string& st, std::int64_t numel, std::int64_t block);

/// A piece of a parameter in the saved set: elements [begin, end) in file `file`.
struct OldPiece {
  std::size_t file;
  std::int64_t begin, end;
};

/// The index's pieces, per parameter (of `numel` elements each).
std::vector<std::vector<OldPiece>> read_pieces(const Index& index,
                                               const std::vector<std::int64_t>& numel,
                                               const fusedopt::checkpoint::Refusal& r);

/// The shards of a set, each opened and checked whole (open_shard) on first use.
class ShardReaders {
 public:
  ShardReaders(const std::filesystem::path& dir, const Index& index) : dir_(dir), index_(index) {}
  SafetensorsReader& operator()(std::size_t f) {
    auto& r = readers_[f];
    if (!r) r = open_shard(dir_, index_, f);
    return *r;
  }

 private:
  const std::filesystem::path& dir_;
  const Index& index_;
  std::map<std::size_t, std::unique_ptr<SafetensorsReader>> readers_;
};

/// The saved pieces of a parameter that overlap its elements [a, b), and how each of its
/// states is cut: per state, the coarsest cut its pieces show (a piece of one element shows
/// 4-bit codes as one per element).
struct Overlap {
  std::vector<const OldPiece*> pieces;
  std::vector<std::pair<std::string, std::string>> states;  ///< (state, st dtype)
  std::vector<StateCut> cuts;                               ///< per state
};

/// The Overlap of a param's pieces `old` with its elements [a, b); each piece's tensors are
/// checked against their cut (IoError otherwise). `block`: the file's quant_block (0: none).
Overlap overlap(const std::string& name, std::int64_t a, std::int64_t b,
                const std::vector<OldPiece>& old, ShardReaders& reader, std::int64_t block);

/// The pieces of a param of `numel` elements (each checked against its states' cut by
/// assemble_param or overlap) must tile it: [0, numel) once, in order.
void check_tiling(const std::string& name, std::int64_t numel, std::vector<OldPiece> pieces,
                  const fusedopt::checkpoint::Refusal& r);

/// The state dtype a checkpoint's metadata records; IoError when missing or unknown.
DType state_dtype_of(const std::map<std::string, std::string>& metadata);

/// Refuses (UsageError, before anything is written) an output path `out` that is the same
/// file as one of `inputs` (by device and inode, so another spelling of the path, a hard
/// link or a symbolic link count too): writing it would destroy the input.
void refuse_input_as_output(const std::string& command, const std::filesystem::path& out,
                            const std::vector<std::filesystem::path>& inputs);

/// Checks that `claimed` (the tensors the params table accounts for) holds every tensor of
/// `r`: IoError naming the first one that no param of the table claims (a table that does
/// not describe the file, which a conversion would otherwise leave out without a word).
void check_claimed(const SafetensorsReader& r, const std::set<std::string>& claimed);

/// The params table of `where` as names and (elements, dtype) pairs; IoError for a
/// malformed line or a name given twice.
void parse_params(const std::string& text, const std::string& where,
                  std::vector<std::string>* names,
                  std::vector<std::pair<std::int64_t, DType>>* sizes);

}  // namespace fusedopt::comm::detail
