// ShardedOptimizer's checkpoints: save (each rank's pieces, one file per rank, committed
// by rank 0's index), load at any world size, and the conversions to and from the single
// file of Optimizer::save (merge_checkpoint, split_checkpoint). Every file is checked whole
// against its checksum, and each shard against the one its index recorded, before any of
// it is used.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <map>
#include <random>
#include <sstream>
#include <utility>

#include "comm/sharded_impl.hpp"
#include "fusedopt/safetensors.hpp"
#include "io/checkpoint_format.hpp"
#include "support/check.hpp"
#include "support/parse_number.hpp"

namespace fusedopt::comm {

using detail::cut_into_shards;
using detail::host_all_reduce;
namespace ck = io::checkpoint;

namespace detail {

void host_all_reduce(Communicator& comm, double* values, std::size_t n) {
  const Device d = comm.device();
  if (d.kind != Device::Kind::Cuda) {
    comm.all_reduce(values, static_cast<std::int64_t>(n)).wait();
    return;
  }
  CudaBuffer buffer(n * sizeof(double), d.index);
  cuda_copy_to_device(buffer.data(), values, n * sizeof(double), d.index);
  comm.all_reduce(static_cast<double*>(buffer.data()), static_cast<std::int64_t>(n)).wait();
  cuda_copy_to_host(values, buffer.data(), n * sizeof(double), d.index);
}

}  // namespace detail

namespace {

constexpr const char* kIndexFile = "index.safetensors";
/// 2: each "files" line is "<file><TAB><its checksum>", every shard's checksum (16 hex
/// digits, over the whole file) as it was written by this save. 1 (before 2026-11-26): file
/// names alone; still read.
constexpr const char* kShardedFormat = "2";
constexpr const char* kOldestShardedFormat = "1";

std::string shard_file(const std::string& tag, int rank, int ranks) {
  return fmt::format("shard-{}-{:05}-of-{:05}.safetensors", tag, rank, ranks);
}

/// How many ranks report a failure (every rank learns it, so all of them throw or none).
int failures(Communicator& comm, bool failed) {
  double n = failed ? 1.0 : 0.0;
  host_all_reduce(comm, &n, 1);
  return static_cast<int>(n);
}

bool is_hex_digest(const std::string& text) {
  return text.size() == 16 && text.find_first_not_of("0123456789abcdef") == std::string::npos;
}

/// Every rank's `digest` (16 hex digits), in rank order: exchanged as two exact 32-bit
/// halves per rank.
std::vector<std::string> gather_digests(Communicator& comm, const std::string& digest) {
  const auto ranks = static_cast<std::size_t>(comm.size());
  const auto rank = static_cast<std::size_t>(comm.rank());
  std::vector<double> halves(2 * ranks, 0.0);
  const std::uint64_t v = std::stoull(digest, nullptr, 16);
  halves[2 * rank] = static_cast<double>(v >> 32);
  halves[2 * rank + 1] = static_cast<double>(v & 0xffffffffu);
  host_all_reduce(comm, halves.data(), halves.size());
  std::vector<std::string> out;
  for (std::size_t r = 0; r < ranks; ++r) {
    const std::uint64_t hi = static_cast<std::uint64_t>(halves[2 * r]);
    const std::uint64_t lo = static_cast<std::uint64_t>(halves[2 * r + 1]);
    out.push_back(fmt::format("{:016x}", (hi << 32) | lo));
  }
  return out;
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

using ck::fields;
using ck::lines;

/// An integer of the index; IoError (a malformed file) otherwise.
std::int64_t to_int(const std::string& text, const std::string& what) {
  const std::optional<std::int64_t> v = support::parse_int_strict(text);
  if (!v) throw IoError(fmt::format("{} '{}' is not an integer", what, text));
  return *v;
}

/// The DType of a stored state's safetensors dtype; IoError for one no checkpoint holds.
DType st_to_dtype(const std::string& st) {
  const std::optional<DType> d = ck::from_st_dtype(st);
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
  // Every rank's pieces follow from the sizes; written out so that a reader needs no
  // sharding arithmetic of its own.
  const std::vector<std::vector<Piece>> cut = cut_into_shards(sizes, ranks);
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
    if (t.rfind(name + "/", 0) == 0 && t.find('/', name.size() + 1) == std::string::npos) {
      // Block-quantized states (codes and NAME.absmax) are cut by blocks, not by elements.
      const bool absmax = t.size() >= 7 && t.compare(t.size() - 7, 7, ".absmax") == 0;
      FUSEDOPT_CHECK_USAGE(r.entry(t).dtype != "U8" && !absmax,
                           "tensor '{}' is a block-quantized state: checkpoints of quantized "
                           "states are not split into or merged from shards yet (they load "
                           "into an Optimizer with the same storage)",
                           t);
      out.emplace_back(t.substr(name.size() + 1), r.entry(t).dtype);
    }
  }
  return out;
}

}  // namespace

void ShardedOptimizer::save(const std::filesystem::path& dir) const {
  Impl& m = live("save");
  // A fresh tag for this set's file names, drawn by rank 0: a save that dies halfway never
  // overwrites a file the committed index names.
  double draw = 0;
  if (m.rank == 0) draw = static_cast<double>(std::random_device{}() & 0xffffffu);
  host_all_reduce(m.comm, &draw, 1);
  const std::string tag =
      fmt::format("{}-{:06x}", m.local->step_count(), static_cast<unsigned>(draw));
  std::string error, digest(16, '0');
  try {
    std::filesystem::create_directories(dir);
    const std::filesystem::path shard = dir / shard_file(tag, m.rank, m.ranks);
    m.local->save(shard);  // atomic
    digest = SafetensorsReader(shard).checksum();
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (const int n = failures(m.comm, !error.empty())) {
    throw IoError(fmt::format(
        "ShardedOptimizer::save: {} of {} ranks could not write their shard to {} (this rank: "
        "{}); the previous checkpoint there is untouched",
        n, m.ranks, dir.string(), error.empty() ? "written" : error));
  }
  // Every shard is on disk; the index records each one's checksum, which binds it to this
  // save. A save killed before the index is renamed into place leaves the previous
  // checkpoint loadable (comm_sharded_kill).
  const std::vector<std::string> digests = gather_digests(m.comm, digest);
  if (m.rank == 0) {
    try {
      std::vector<std::pair<std::int64_t, DType>> sizes;
      std::vector<std::string> names;
      for (const Tensor& p : m.params) {
        sizes.emplace_back(p.numel, p.dtype);
        names.push_back(p.name);
      }
      write_index(dir, tag, m.ranks, m.options.stage, m.local->step_count(), names, sizes, digests);
      // The previous sets' files are garbage now.
      for (const auto& f : std::filesystem::directory_iterator(dir)) {
        const std::string name = f.path().filename().string();
        if (name.rfind("shard-", 0) == 0 && name.rfind("shard-" + tag + "-", 0) != 0) {
          std::error_code ec;
          std::filesystem::remove(f.path(), ec);
        }
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (failures(m.comm, !error.empty())) {
    throw IoError(fmt::format("ShardedOptimizer::save: rank 0 could not commit {}/{}: {}",
                              dir.string(), kIndexFile, m.rank == 0 ? error : "see rank 0"));
  }
}

namespace {

using ck::Refusal;

/// The index's params table must list exactly `params`, in order.
void check_params(const Index& index, const std::vector<Tensor>& params, const Refusal& r) {
  const std::vector<std::string> saved = lines(index.meta(ck::kParamsKey));
  if (saved.size() != params.size()) {
    r.misfit(
        fmt::format("it holds {} parameters, this optimizer has {}", saved.size(), params.size()));
  }
  for (std::size_t i = 0; i < saved.size(); ++i) {
    const std::string mine =
        ck::format_params({{params[i].name, params[i].numel, params[i].dtype}});
    if (saved[i] + "\n" != mine) {
      r.misfit(fmt::format("parameter {} was '{}', here it is '{}'", i, saved[i],
                           mine.substr(0, mine.size() - 1)));
    }
  }
}

/// A piece of a parameter in the saved set: elements [begin, end) in file `file`.
struct OldPiece {
  std::size_t file;
  std::int64_t begin, end;
};

/// The index's pieces, per parameter.
std::vector<std::vector<OldPiece>> read_pieces(const Index& index,
                                               const std::vector<Tensor>& params,
                                               const Refusal& r) {
  const std::int64_t files = static_cast<std::int64_t>(index.files.size());
  const auto old_ranks = to_int(index.meta("world_size"), "world_size");
  if (old_ranks < 1 || old_ranks != files) {
    r.malformed(fmt::format("world size {} with {} files", old_ranks, files));
  }
  std::vector<std::vector<OldPiece>> old(params.size());
  for (const std::string& line : lines(index.meta("pieces"))) {
    const std::vector<std::string> f = fields(line);
    if (f.size() != 4) r.malformed(fmt::format("piece '{}' is malformed", line));
    const auto file = to_int(f[0], "piece file"), param = to_int(f[1], "piece param");
    const auto begin = to_int(f[2], "piece begin"), end = to_int(f[3], "piece end");
    if (file < 0 || file >= files || param < 0 ||
        static_cast<std::size_t>(param) >= params.size() || begin < 0 || end < begin ||
        end > params[static_cast<std::size_t>(param)].numel) {
      r.malformed(fmt::format("piece '{}' is out of range", line));
    }
    old[static_cast<std::size_t>(param)].push_back({static_cast<std::size_t>(file), begin, end});
  }
  return old;
}

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

/// One parameter's states over elements [a, b), read from the saved pieces they overlap.
struct Assembled {
  std::vector<std::vector<char>> buffers;  ///< one per state tensor
  std::vector<SafetensorsTensor> tensors;  ///< their views, as a checkpoint of [a, b)
};

void assemble_param(const std::string& name, std::int64_t a, std::int64_t b,
                    const std::vector<OldPiece>& old, const Index& index, ShardReaders& reader,
                    Assembled& out, const Refusal& r) {
  // The tensors of a piece: "<name>/<state>" (and "/master"), as the saver wrote them.
  std::vector<std::pair<std::string, std::string>> kinds;  // (tensor name, st dtype)
  std::int64_t covered = 0;
  for (const OldPiece& o : old) {
    const std::int64_t lo = std::max(a, o.begin), hi = std::min(b, o.end);
    if (lo >= hi) continue;
    SafetensorsReader& file = reader(o.file);
    if (kinds.empty()) {
      for (const auto& [state, st] : states_of(file, name)) {
        kinds.emplace_back(ck::tensor_name(name, state), st);
        out.buffers.emplace_back(static_cast<std::size_t>(b - a) * st_bytes(st));
      }
    }
    const std::size_t first = out.buffers.size() - kinds.size();
    for (std::size_t k = 0; k < kinds.size(); ++k) {
      const std::size_t es = st_bytes(kinds[k].second);
      const SafetensorsReader::Entry e = file.entry(kinds[k].first);  // IoError if absent
      if (e.dtype != kinds[k].second ||
          e.bytes != static_cast<std::uint64_t>(o.end - o.begin) * es) {
        r.malformed(fmt::format("{}: tensor '{}' does not match its piece [{}, {})",
                                index.files[o.file].first, kinds[k].first, o.begin, o.end));
      }
      file.read(kinds[k].first, static_cast<std::uint64_t>(lo - o.begin) * es,
                static_cast<std::uint64_t>(hi - lo) * es,
                out.buffers[first + k].data() + static_cast<std::size_t>(lo - a) * es);
    }
    covered += hi - lo;
  }
  if (covered != b - a) {
    r.malformed(
        fmt::format("the pieces of '{}' cover {} of its elements [{}, {})", name, covered, a, b));
  }
  const std::size_t first = out.buffers.size() - kinds.size();
  for (std::size_t k = 0; k < kinds.size(); ++k) {
    out.tensors.push_back(
        {kinds[k].first, st_to_dtype(kinds[k].second), b - a, out.buffers[first + k].data()});
  }
}

}  // namespace

void ShardedOptimizer::load(const std::filesystem::path& dir) {
  Impl& m = live("load");
  const Refusal refusal{fmt::format("cannot load sharded checkpoint {}", dir.string())};
  std::exception_ptr error;
  Assembled mine;
  std::map<std::string, std::string> metadata;
  try {
    const Index index = read_index(dir);
    check_params(index, m.params, refusal);
    const std::vector<std::vector<OldPiece>> old = read_pieces(index, m.params, refusal);
    // Every shard is checked whole before anything is read from it: those this rank reads,
    // and every (this rank + k * ranks)-th, so that each is checked by some rank.
    ShardReaders reader(dir, index);
    for (std::size_t f = static_cast<std::size_t>(m.rank); f < index.files.size();
         f += static_cast<std::size_t>(m.ranks)) {
      reader(f);
    }
    // This rank's pieces, assembled from the ranges of the old pieces they overlap.
    for (std::size_t i = 0; i < m.params.size(); ++i) {
      const auto [a, b] = m.owned[i];
      if (a < b) assemble_param(m.params[i].name, a, b, old[i], index, reader, mine, refusal);
    }
    // The saver's metadata (rule, step, hypers: the same in every file).
    metadata = reader(0).metadata();
  } catch (...) {
    error = std::current_exception();
  }
  // Every rank has its pieces, or none loads.
  if (const int n = failures(m.comm, error != nullptr)) {
    if (error) std::rethrow_exception(error);
    throw UsageError(
        fmt::format("cannot load sharded checkpoint {}: {} of {} ranks failed "
                    "(their errors name the cause); nothing was loaded",
                    dir.string(), n, m.ranks));
  }
  // With this rank's pieces, through the checks of Optimizer::load, from memory.
  fusedopt::detail::OptimizerAccess::load_tensors(*m.local, metadata, mine.tensors, dir.string());
}

namespace {

/// The params table of `where` as names and (elements, dtype) pairs.
void parse_params(const std::string& text, const std::string& where,
                  std::vector<std::string>* names,
                  std::vector<std::pair<std::int64_t, DType>>* sizes) {
  for (const ck::ParamEntry& p : ck::parse_params(text, where)) {
    names->push_back(p.name);
    sizes->emplace_back(p.numel, p.dtype);
  }
}

}  // namespace

void ShardedOptimizer::merge_checkpoint(const std::filesystem::path& dir,
                                        const std::filesystem::path& file) {
  // Everything is checked whole before anything is written.
  const Index index = read_index(dir);
  auto meta = [&](const char* key) -> const std::string& { return index.meta(key); };
  std::vector<std::string> names;
  std::vector<std::pair<std::int64_t, DType>> sizes;
  parse_params(meta(ck::kParamsKey), index.reader->path().string(), &names, &sizes);
  std::vector<std::unique_ptr<SafetensorsReader>> shards;
  for (std::size_t f = 0; f < index.files.size(); ++f) shards.push_back(open_shard(dir, index, f));
  const std::size_t world = index.files.size();
  const std::map<std::string, std::string>& saved = shards.front()->metadata();
  const bool masters =
      saved.count(ck::kMasterWeightsKey) && saved.at(ck::kMasterWeightsKey) == "true";
  const std::vector<std::vector<Piece>> cut = cut_into_shards(sizes, static_cast<int>(world));
  // The rule's states (and master) as the shard files hold them.
  std::vector<std::pair<std::string, std::string>> states;
  for (std::size_t i = 0; i < names.size() && states.empty(); ++i) {
    if (cut[i].empty()) continue;
    for (const auto& st : states_of(*shards[static_cast<std::size_t>(cut[i][0].rank)], names[i]))
      if (st.first != "master") states.push_back(st);
  }
  struct Out {
    std::size_t param;
    std::string state, st_dtype;
  };
  std::vector<Out> plan;
  std::vector<SafetensorsTensor> tensors;
  for (std::size_t i = 0; i < names.size(); ++i) {
    std::vector<std::pair<std::string, std::string>> own = states;
    if (masters && sizes[i].second != DType::F32) own.emplace_back("master", "F32");
    for (const auto& [state, st] : own) {
      plan.push_back({i, state, st});
      tensors.push_back(
          {ck::tensor_name(names[i], state), st_to_dtype(st), sizes[i].first, nullptr});
    }
  }
  std::map<std::string, std::string> metadata = saved;
  metadata[ck::kParamsKey] = meta(ck::kParamsKey);
  write_safetensors(file, tensors, metadata, [&](std::size_t k, void* out) {
    const Out& o = plan[k];
    const std::size_t es = st_bytes(o.st_dtype);
    for (const Piece& p : cut[o.param]) {
      shards[static_cast<std::size_t>(p.rank)]->read(
          ck::tensor_name(names[o.param], o.state), 0,
          static_cast<std::uint64_t>(p.end - p.begin) * es,
          static_cast<char*>(out) + static_cast<std::size_t>(p.begin) * es);
    }
  });
}

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
  const std::vector<std::vector<Piece>> cut = cut_into_shards(sizes, world_size);
  const std::string step = in.metadata().count(ck::kStepKey) ? in.metadata().at(ck::kStepKey) : "0";
  const std::string tag = fmt::format("{}-split{}", step, world_size);
  std::filesystem::create_directories(dir);
  std::vector<std::string> digests;
  for (int r = 0; r < world_size; ++r) {
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
        for (const auto& [state, st] : states_of(in, names[i])) {
          const std::size_t es = st_bytes(st);
          plan.push_back({ck::tensor_name(names[i], state), static_cast<std::size_t>(p.begin) * es,
                          static_cast<std::size_t>(p.end - p.begin) * es});
          tensors.push_back(
              {ck::tensor_name(names[i], state), st_to_dtype(st), p.end - p.begin, nullptr});
        }
      }
    }
    const std::filesystem::path shard = dir / shard_file(tag, r, world_size);
    write_safetensors(shard, tensors, in.metadata(), [&](std::size_t k, void* out) {
      in.read(plan[k].name, plan[k].bytes_begin, plan[k].bytes, out);
    });
    digests.push_back(SafetensorsReader(shard).checksum());
  }
  write_index(dir, tag, world_size, 1, to_int(step, "step"), names, sizes, digests);
}

}  // namespace fusedopt::comm
