// ShardedOptimizer's checkpoints: save (each rank's pieces, one file per rank, committed
// by rank 0's index) and load at any world size (the files: shard_files.hpp; the
// conversions to and from one file: sharded_convert.cpp). Every file is checked whole
// against its checksum, and each shard against the one its index recorded, before any of
// it is used.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <map>
#include <random>
#include <utility>

#include "fusedopt/checkpoint_format.hpp"
#include "fusedopt/safetensors.hpp"
#include "shard_files.hpp"
#include "sharded_impl.hpp"
#include "support/check.hpp"

namespace fusedopt::comm {

using detail::block_of;
using detail::host_all_reduce;
using detail::Index;
using detail::kIndexFile;
using detail::OldPiece;
using detail::Overlap;
using detail::overlap;
using detail::read_index;
using detail::read_pieces;
using detail::shard_file;
using detail::ShardReaders;
using detail::st_bytes;
using detail::st_to_dtype;
using detail::StateCut;
using detail::write_index;
namespace ck = fusedopt::checkpoint;

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

/// How many ranks report a failure (every rank learns it, so all of them throw or none).
int failures(Communicator& comm, bool failed) {
  double n = failed ? 1.0 : 0.0;
  host_all_reduce(comm, &n, 1);
  return static_cast<int>(n);
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
      write_index(dir, tag, m.ranks, m.options.stage, m.local->step_count(), names, sizes, m.cut,
                  digests);
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
  const std::vector<std::string> saved = ck::lines(index.meta(ck::kParamsKey));
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

/// One parameter's states over elements [a, b), read from the saved pieces they overlap.
struct Assembled {
  std::vector<std::vector<char>> buffers;  ///< one per state tensor
  std::vector<SafetensorsTensor> tensors;  ///< their views, as a checkpoint of [a, b)
};

void assemble_param(const std::string& name, std::int64_t a, std::int64_t b,
                    const std::vector<OldPiece>& old, const Index& index, ShardReaders& reader,
                    std::int64_t block, Assembled& out, const Refusal& r) {
  const Overlap over = overlap(name, a, b, old, reader, block);
  const std::size_t first = out.buffers.size();
  for (std::size_t k = 0; k < over.states.size(); ++k) {
    const std::int64_t count = over.cuts[k].range(0, b - a).second;
    out.buffers.emplace_back(static_cast<std::size_t>(count) * st_bytes(over.states[k].second));
  }
  std::int64_t covered = 0;
  for (const OldPiece* o : over.pieces) {
    const std::int64_t lo = std::max(a, o->begin), hi = std::min(b, o->end);
    for (std::size_t k = 0; k < over.states.size(); ++k) {
      const auto& [state, st] = over.states[k];
      const StateCut& c = over.cuts[k];
      if ((lo - o->begin) % c.per != 0 || (lo - a) % c.per != 0) {
        r.malformed(
            fmt::format("{}: the piece [{}, {}) of '{}' is not cut on the blocks of its "
                        "state '{}' ({} elements)",
                        index.files[o->file].first, o->begin, o->end, name, state, c.per));
      }
      const std::size_t es = st_bytes(st);
      const auto [from, to] = c.range(lo - o->begin, hi - o->begin);
      reader(o->file).read(ck::tensor_name(name, state), static_cast<std::uint64_t>(from) * es,
                           static_cast<std::uint64_t>(to - from) * es,
                           out.buffers[first + k].data() +
                               static_cast<std::size_t>(c.range(lo - a, hi - a).first) * es);
    }
    covered += hi - lo;
  }
  if (covered != b - a) {
    r.malformed(
        fmt::format("the pieces of '{}' cover {} of its elements [{}, {})", name, covered, a, b));
  }
  for (std::size_t k = 0; k < over.states.size(); ++k) {
    const auto& [state, st] = over.states[k];
    out.tensors.push_back({ck::tensor_name(name, state), st_to_dtype(st),
                           over.cuts[k].range(0, b - a).second, out.buffers[first + k].data()});
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
    std::vector<std::int64_t> numel;
    for (const Tensor& p : m.params) numel.push_back(p.numel);
    const std::vector<std::vector<OldPiece>> old = read_pieces(index, numel, refusal);
    // Every shard is checked whole before anything is read from it: those this rank reads,
    // and every (this rank + k * ranks)-th, so that each is checked by some rank.
    ShardReaders reader(dir, index);
    for (std::size_t f = static_cast<std::size_t>(m.rank); f < index.files.size();
         f += static_cast<std::size_t>(m.ranks)) {
      reader(f);
    }
    // The saver's metadata (rule, step, hypers, storage: the same in every file).
    metadata = reader(0).metadata();
    // This rank's pieces, assembled from the ranges of the old pieces they overlap.
    for (std::size_t i = 0; i < m.params.size(); ++i) {
      const auto [a, b] = m.owned[i];
      if (a < b) {
        assemble_param(m.params[i].name, a, b, old[i], index, reader, block_of(metadata), mine,
                       refusal);
      }
    }
    // The checks of the load below, each state's values included (this rank's pieces
    // alone may hold a bad absmax), on every rank before any rank loads.
    fusedopt::OptimizerExtension::check_tensors(*m.local, metadata, mine.tensors, dir.string());
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
  fusedopt::OptimizerExtension::load_tensors(*m.local, metadata, mine.tensors, dir.string());
}

}  // namespace fusedopt::comm
