// shm_topology (shm_engine.hpp): which ranks share a node, from MPI_Comm_split_type or from
// pretend nodes of consecutive ranks (the hierarchical path tested on one machine).
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <optional>

#include "mpi_types.hpp"
#include "shm_engine.hpp"
#include "support/check.hpp"
#include "support/parse_number.hpp"

namespace fusedopt::comm::detail {

ShmTopology shm_topology(MPI_Comm world, int ranks_per_node) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  ShmTopology t;
  MPI_Comm real = MPI_COMM_NULL;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &real);
  if (ranks_per_node > 0) {
    MPI_Comm_split(world, rank / ranks_per_node, rank, &t.node);
    // A pretend node must lie within one real node (its ranks must share memory).
    MPI_Comm within = MPI_COMM_NULL;
    MPI_Comm_split_type(t.node, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &within);
    int node_size = 0, within_size = 0;
    MPI_Comm_size(t.node, &node_size);
    MPI_Comm_size(within, &within_size);
    MPI_Comm_free(&within);
    int ok = node_size == within_size ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, world);
    MPI_Comm_free(&real);
    if (!ok) {
      MPI_Comm_free(&t.node);
      throw UsageError(fmt::format(
          "FUSEDOPT_COMM_RANKS_PER_NODE={}: a pretend node of {} consecutive ranks spans "
          "machines that share no memory; use a divisor of the ranks per real node",
          ranks_per_node, ranks_per_node));
    }
    t.pretend = fmt::format("FUSEDOPT_COMM_RANKS_PER_NODE={}", ranks_per_node);
  } else {
    t.node = real;
  }
  MPI_Comm_rank(t.node, &t.local);
  MPI_Comm_size(t.node, &t.local_size);
  int leader = rank;
  MPI_Bcast(&leader, 1, MPI_INT, 0, t.node);
  std::vector<int> all(static_cast<std::size_t>(2 * size));
  int mine[2] = {t.local, leader};
  MPI_Allgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, world);
  std::vector<int> leaders;
  for (int r = 0; r < size; ++r) leaders.push_back(all[static_cast<std::size_t>(2 * r + 1)]);
  std::sort(leaders.begin(), leaders.end());
  leaders.erase(std::unique(leaders.begin(), leaders.end()), leaders.end());
  t.nodes = static_cast<int>(leaders.size());
  for (int r = 0; r < size; ++r) {
    const int l = all[static_cast<std::size_t>(2 * r + 1)];
    t.node_of.push_back(
        static_cast<int>(std::lower_bound(leaders.begin(), leaders.end(), l) - leaders.begin()));
    t.local_of.push_back(all[static_cast<std::size_t>(2 * r)]);
  }
  t.node_index = t.node_of[static_cast<std::size_t>(rank)];
  MPI_Comm_split(world, t.local == 0 ? 0 : MPI_UNDEFINED, rank, &t.leaders);
  if (t.nodes == 1 && t.leaders != MPI_COMM_NULL) MPI_Comm_free(&t.leaders);
  return t;
}

namespace {

/// Slots per rank: a chunk being filled, one being combined, one being read back, one spare.
constexpr int kSlots = 4;

/// The integer in environment variable `name` within [lo, hi] (as support::parse_int_strict
/// reads it), `fallback` when unset or empty; `error` gets a message when it is anything else.
int env_int(const char* name, int lo, int hi, int fallback, std::string& error) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  const std::optional<std::int64_t> x = support::parse_int_strict(v);
  if (!x || *x < lo || *x > hi) {
    error = fmt::format("{}='{}': expected an integer from {} to {}", name, v, lo, hi);
    return fallback;
  }
  return static_cast<int>(*x);
}

}  // namespace

std::unique_ptr<ShmEngine> make_shm_engine(MPI_Comm world, const MpiOptions& options,
                                           std::string* transport) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  // Settings: rank 0's, after every rank has checked its own (so that a bad one is an
  // error on every rank, never some ranks waiting in a collective for the others).
  std::string error;
  if (options.ranks_per_node < 0 || options.slot_kib < 0 || options.slot_kib > (1 << 20)) {
    error = fmt::format(
        "MpiOptions: ranks_per_node {} and slot_kib {} must be >= 0 (slot_kib at most 1048576)",
        options.ranks_per_node, options.slot_kib);
  }
  // FUSEDOPT_COMM_SHM=0 turns shared memory off; it never turns on what the options turned off.
  const bool env_shm = env_int("FUSEDOPT_COMM_SHM", 0, 1, 1, error) != 0;
  int settings[3] = {
      options.shared_memory && env_shm ? 1 : 0,
      options.ranks_per_node > 0 ? options.ranks_per_node
                                 : env_int("FUSEDOPT_COMM_RANKS_PER_NODE", 1, 1 << 20, 0, error),
      options.slot_kib > 0 ? std::max(16, options.slot_kib)
                           : env_int("FUSEDOPT_COMM_SHM_SLOT_KIB", 16, 1 << 20, 128, error)};
  int bad = error.empty() ? 0 : 1;
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, world);
  if (bad) {
    throw UsageError(error.empty() ? "another rank's FUSEDOPT_COMM_* setting is wrong" : error);
  }
  MPI_Bcast(settings, 3, MPI_INT, 0, world);
  if (!settings[0]) {
    *transport = options.shared_memory ? "mpi (shared memory off: FUSEDOPT_COMM_SHM=0)"
                                       : "mpi (shared memory off: MpiOptions)";
    return nullptr;
  }
  if (size == 1) {
    *transport = "mpi (one rank)";
    return nullptr;
  }
  ShmTopology topo = shm_topology(world, settings[1]);
  int most = topo.local_size;
  MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_INT, MPI_MAX, world);
  if (most == 1) {
    *transport = "mpi (one rank per node: nothing to share)";
    if (topo.leaders != MPI_COMM_NULL) MPI_Comm_free(&topo.leaders);
    MPI_Comm_free(&topo.node);
    return nullptr;
  }
  auto engine = std::make_unique<ShmEngine>(rank, std::move(topo),
                                            static_cast<std::size_t>(settings[2]) << 10, kSlots);
  *transport = "mpi + " + engine->describe();
  return engine;
}

}  // namespace fusedopt::comm::detail
