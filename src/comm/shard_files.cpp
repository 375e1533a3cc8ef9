// The files of a sharded checkpoint (see shard_files.hpp).
#include "shard_files.hpp"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <optional>

#include "support/check.hpp"
#include "support/parse_number.hpp"

namespace fusedopt::comm::detail {

namespace ck = fusedopt::checkpoint;
using ck::fields;
using ck::lines;
using ck::Refusal;

namespace {

bool is_hex_digest(const std::string& text) {
  return text.size() == 16 && text.find_first_not_of("0123456789abcdef") == std::string::npos;
}

}  // namespace

std::string shard_file(const std::string& tag, int rank, int ranks) {
  return fmt::format("shard-{}-{:05}-of-{:05}.safetensors", tag, rank, ranks);
}

/// Reads all of `r` and checks it against its checksum; a file that carries the current
/// checkpoint format must have one. IoError naming the file otherwise.
void verify_whole(const SafetensorsReader& r) {
  if (r.verify()) return;
  auto it = r.metadata().find("fusedopt_checkpoint_format");
  const bool current = it != r.metadata().end() && it->second != "1";
  if (current || r.metadata().count("fusedopt_sharded_format")) {
    throw IoError(
        fmt::format("{}: it has no checksum, which every file fusedopt writes carries: "
                    "the file was changed or damaged after it was written",
                    r.path().string()));
  }
}

/// An integer of the index; IoError (a malformed file) otherwise.
std::int64_t to_int(const std::string& text, const std::string& what) {
  const std::optional<std::int64_t> v = support::parse_int_strict(text);
  if (!v) throw IoError(fmt::format("{} '{}' is not an integer", what, text));
  return *v;
}

/// The DType of a stored state's safetensors dtype; IoError for one no checkpoint holds.
DType st_to_dtype(const std::string& st) {
  const std::optional<DType> d = dtype_of_safetensors_name(st);
  if (!d) throw IoError(fmt::format("a state is stored as {}, which no checkpoint holds", st));
  return *d;
}

std::size_t st_bytes(const std::string& st) {
  return static_cast<std::size_t>(dtype_size(st_to_dtype(st)));
}

Index read_index(const std::filesystem::path& dir) {
  Index index;
  index.reader = std::make_unique<SafetensorsReader>(dir / kIndexFile);
  verify_whole(*index.reader);
  const std::string& format = index.meta("fusedopt_sharded_format");
  if (format != kShardedFormat && format != kOldestShardedFormat) {
    throw IoError(fmt::format("{}: format {} is not one this fusedopt reads ({} to {})",
                              index.reader->path().string(), format, kOldestShardedFormat,
                              kShardedFormat));
  }
  for (const std::string& line : lines(index.meta("files"))) {
    const std::vector<std::string> f = fields(line);
    const bool ok =
        format == kOldestShardedFormat ? f.size() == 1 : f.size() == 2 && is_hex_digest(f[1]);
    if (!ok || f[0].empty() || f[0].find('/') != std::string::npos) {
      throw IoError(
          fmt::format("{}: file line '{}' is malformed", index.reader->path().string(), line));
    }
    index.files.emplace_back(f[0], f.size() == 2 ? f[1] : std::string());
  }
  if (index.files.empty()) {
    throw IoError(fmt::format("{}: the index names no shard files", dir.string()));
  }
  return index;
}

/// Opens shard `f` of `index` and checks all of it: its own checksum, the one the index
/// recorded for it (a shard of another save, or a file put in its place, is refused), and
/// its step against the index's.
std::unique_ptr<SafetensorsReader> open_shard(const std::filesystem::path& dir, const Index& index,
                                              std::size_t f) {
  const auto& [name, digest] = index.files[f];
  auto r = std::make_unique<SafetensorsReader>(dir / name);
  verify_whole(*r);
  auto step = r->metadata().find(ck::kStepKey);
  if (step == r->metadata().end() || step->second != index.meta(ck::kStepKey)) {
    throw IoError(
        fmt::format("{}: it holds step {}, the index's set step {}: it is a shard of "
                    "another save",
                    r->path().string(), step == r->metadata().end() ? "(none)" : step->second,
                    index.meta(ck::kStepKey)));
  }
  if (!digest.empty() && r->checksum() != digest) {
    throw IoError(
        fmt::format("{}: its checksum is {}, the index recorded {}: it is not the "
                    "file this save wrote",
                    r->path().string(), r->checksum().empty() ? "(none)" : r->checksum(), digest));
  }
  return r;
}

/// Commits a set of shard files: `dir`/index.safetensors, written atomically.
void write_index(const std::filesystem::path& dir, const std::string& tag, int ranks, int stage,
                 std::int64_t step, const std::vector<std::string>& names,
                 const std::vector<std::pair<std::int64_t, DType>>& sizes,
                 const std::vector<std::vector<Piece>>& cut,
                 const std::vector<std::string>& digests) {
  std::string pieces, files;
  std::vector<ck::ParamEntry> params;
  for (std::size_t i = 0; i < names.size(); ++i) {
    params.push_back({names[i], sizes[i].first, sizes[i].second});
  }
  for (int r = 0; r < ranks; ++r) {
    files +=
        fmt::format("{}\t{}\n", shard_file(tag, r, ranks), digests[static_cast<std::size_t>(r)]);
  }
  // Every rank's pieces, written out so that a reader needs no sharding arithmetic of its
  // own (the cut depends on the states' blocks too).
  for (std::size_t i = 0; i < cut.size(); ++i) {
    for (const Piece& p : cut[i])
      pieces += fmt::format("{}\t{}\t{}\t{}\n", p.rank, i, p.begin, p.end);
  }
  const std::map<std::string, std::string> metadata = {
      {"fusedopt_sharded_format", kShardedFormat},
      {"world_size", std::to_string(ranks)},
      {"stage", std::to_string(stage)},
      {"tag", tag},
      {ck::kStepKey, std::to_string(step)},
      {ck::kParamsKey, ck::format_params(params)},
      {"files", files},
      {"pieces", pieces},
  };
  write_safetensors(dir / kIndexFile, {}, metadata);  // atomic: this commits the set
}

/// The state tensors of parameter `name` in a checkpoint file: "<name>/<state>" (a state
/// name has no '/'), with their safetensors dtypes.
std::vector<std::pair<std::string, std::string>> states_of(const SafetensorsReader& r,
                                                           const std::string& name) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& t : r.names()) {
    if (t.rfind(name + "/", 0) == 0 && t.find('/', name.size() + 1) == std::string::npos)
      out.emplace_back(t.substr(name.size() + 1), r.entry(t).dtype);
  }
  return out;
}

/// The quantization block a file's metadata records (0: none recorded).
std::int64_t block_of(const std::map<std::string, std::string>& metadata) {
  auto it = metadata.find(ck::kQuantBlockKey);
  return it == metadata.end() ? 0 : to_int(it->second, "quant_block");
}

/// How state `state` (safetensors dtype `st`) of parameter `name`, as `file` holds it for
/// `numel` of its elements, is cut; IoError when its size fits no cut.
StateCut cut_of(const SafetensorsReader& file, const std::string& name, const std::string& state,
                const std::string& st, std::int64_t numel, std::int64_t block) {
  const std::string tensor = ck::tensor_name(name, state);
  const SafetensorsReader::Entry e = file.entry(tensor);  // IoError if absent
  const std::size_t es = st_bytes(st);
  const std::optional<StateCut> cut =
      e.dtype == st && e.bytes % es == 0
          ? state_cut(state, static_cast<std::int64_t>(e.bytes / es), numel, block)
          : std::nullopt;
  if (!cut) {
    throw IoError(
        fmt::format("{}: tensor '{}' ({} bytes of {}) does not fit {} elements of its "
                    "param{}",
                    file.path().string(), tensor, e.bytes, e.dtype, numel,
                    block ? fmt::format(" (blocks of {})", block) : ""));
  }
  return *cut;
}

/// The index's pieces, per parameter (of `numel` elements each).
std::vector<std::vector<OldPiece>> read_pieces(const Index& index,
                                               const std::vector<std::int64_t>& numel,
                                               const Refusal& r) {
  const std::int64_t files = static_cast<std::int64_t>(index.files.size());
  const auto old_ranks = to_int(index.meta("world_size"), "world_size");
  if (old_ranks < 1 || old_ranks != files) {
    r.malformed(fmt::format("world size {} with {} files", old_ranks, files));
  }
  std::vector<std::vector<OldPiece>> old(numel.size());
  for (const std::string& line : lines(index.meta("pieces"))) {
    const std::vector<std::string> f = fields(line);
    if (f.size() != 4) r.malformed(fmt::format("piece '{}' is malformed", line));
    const auto file = to_int(f[0], "piece file"), param = to_int(f[1], "piece param");
    const auto begin = to_int(f[2], "piece begin"), end = to_int(f[3], "piece end");
    if (file < 0 || file >= files || param < 0 || static_cast<std::size_t>(param) >= numel.size() ||
        begin < 0 || end < begin || end > numel[static_cast<std::size_t>(param)]) {
      r.malformed(fmt::format("piece '{}' is out of range", line));
    }
    old[static_cast<std::size_t>(param)].push_back({static_cast<std::size_t>(file), begin, end});
  }
  return old;
}

Overlap overlap(const std::string& name, std::int64_t a, std::int64_t b,
                const std::vector<OldPiece>& old, ShardReaders& reader, std::int64_t block) {
  Overlap out;
  for (const OldPiece& o : old) {
    if (std::max(a, o.begin) < std::min(b, o.end)) out.pieces.push_back(&o);
  }
  if (out.pieces.empty()) return out;
  out.states = states_of(reader(out.pieces.front()->file), name);
  out.cuts.assign(out.states.size(), StateCut{});
  for (const OldPiece* o : out.pieces) {
    for (std::size_t k = 0; k < out.states.size(); ++k) {
      const auto& [state, st] = out.states[k];
      const StateCut c = cut_of(reader(o->file), name, state, st, o->end - o->begin, block);
      out.cuts[k].per = std::max(out.cuts[k].per, c.per);
    }
  }
  // Every piece's tensors hold exactly what the coarsest cut gives it.
  for (const OldPiece* o : out.pieces) {
    for (std::size_t k = 0; k < out.states.size(); ++k) {
      const auto& [state, st] = out.states[k];
      const std::string tensor = ck::tensor_name(name, state);
      const std::uint64_t bytes = reader(o->file).entry(tensor).bytes;
      if (bytes != static_cast<std::uint64_t>(out.cuts[k].range(0, o->end - o->begin).second) *
                       st_bytes(st)) {
        throw IoError(fmt::format("{}: tensor '{}' ({} bytes) does not fit its piece [{}, {})",
                                  reader(o->file).path().string(), tensor, bytes, o->begin,
                                  o->end));
      }
    }
  }
  return out;
}

/// The pieces of a param of `numel` elements (each checked against its states' cut by
/// assemble_param or overlap) must tile it: [0, numel) once, in order.
void check_tiling(const std::string& name, std::int64_t numel, std::vector<OldPiece> pieces,
                  const Refusal& r) {
  std::sort(pieces.begin(), pieces.end(),
            [](const OldPiece& x, const OldPiece& y) { return x.begin < y.begin; });
  std::int64_t at = 0;
  bool tiled = true;
  for (const OldPiece& p : pieces) {
    tiled = tiled && p.begin == at;
    at = p.end;
  }
  if (!tiled || at != numel) {
    r.malformed(fmt::format("the pieces of '{}' do not cover its {} elements once", name, numel));
  }
}

/// The state dtype a checkpoint's metadata records; IoError when missing or unknown.
DType state_dtype_of(const std::map<std::string, std::string>& metadata) {
  auto it = metadata.find(ck::kStateDtypeKey);
  for (DType d : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
    if (it != metadata.end() && it->second == to_string(d)) return d;
  }
  throw IoError(fmt::format("metadata '{}' is missing or not a state dtype", ck::kStateDtypeKey));
}

void refuse_input_as_output(const std::string& command, const std::filesystem::path& out,
                            const std::vector<std::filesystem::path>& inputs) {
  struct stat o {};
  if (::stat(out.c_str(), &o) != 0) return;  // nothing there yet: nothing to destroy
  for (const std::filesystem::path& in : inputs) {
    struct stat i {};
    if (::stat(in.c_str(), &i) == 0 && i.st_dev == o.st_dev && i.st_ino == o.st_ino) {
      throw UsageError(fmt::format(
          "{}: the output {} is the input {} (writing it would destroy the input): choose "
          "another output path",
          command, out.string(), in.string()));
    }
  }
}

void check_claimed(const SafetensorsReader& r, const std::set<std::string>& claimed) {
  for (const std::string& t : r.names()) {
    if (claimed.count(t) == 0) {
      throw IoError(
          fmt::format("{}: tensor '{}' belongs to no param of the params table (the table "
                      "does not describe the file; nothing was written)",
                      r.path().string(), t));
    }
  }
}

void parse_params(const std::string& text, const std::string& where,
                  std::vector<std::string>* names,
                  std::vector<std::pair<std::int64_t, DType>>* sizes) {
  std::set<std::string> seen;
  for (const ck::ParamEntry& p : ck::parse_params(text, where)) {
    if (!seen.insert(p.name).second) {
      throw IoError(
          fmt::format("{}: param '{}' is listed twice in the params table", where, p.name));
    }
    names->push_back(p.name);
    sizes->emplace_back(p.numel, p.dtype);
  }
}

}  // namespace fusedopt::comm::detail
