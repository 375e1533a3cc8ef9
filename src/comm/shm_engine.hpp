// Node-local collectives through MPI-3 shared memory (MPI_Win_allocate_shared): the ranks of
// a node exchange data through persistent staging slots, allocated once and reused every
// step, and synchronise through counters in the same segment. An operation is cut into
// chunks of at most one slot; each chunk passes four stages on every rank, in chunk order:
//   in:     the rank copies what the others need of its input into its own slot;
//   reduce: the rank combines slice i (its own) of every rank's input in fixed rank order
//           (deterministic, whatever the timing), into its slot and, for an all-reduce,
//           its own buffer;
//   global: (hierarchical only) each node's leader sends the node's result to the other
//           leaders and receives theirs over MPI (point to point, into buffers allocated
//           once), adds them in node order and publishes the sum in its slot;
//   out:    the rank copies the results it lacks into its buffer.
// A collective over a range of a shared buffer (allocate(); the same offset on every rank)
// skips the slots: all_reduce and reduce copy nothing in or out, the reduce stage reading
// slice i of every rank's buffer and writing the result into every rank's buffer (all_reduce)
// or the root's (reduce); a broadcast's ranks copy from the root's buffer, and the root's
// broadcast completes when they are done. A reduce_scatter or an all_gather whose send buffer
// is shared (at any offset: each rank reads the others' from their descriptors) likewise: the
// reduce stage reads block i of every rank's send buffer into rank i's receive buffer
// (reduce_scatter) or every rank's send buffer into its block of this rank's receive buffer
// (all_gather), and the operation completes when every rank is done reading. Chunks of
// kInPlaceChunkBytes. Every chunk's
// arrival publishes what the rank runs (kind, count, root, where), and the reduce stage
// checks that the node's ranks agree.
// A rank never waits inside the engine: progress() does what the counters allow and
// returns, so waiting (with its deadline) stays in Communicator, and an operation advances
// whenever its ranks call in (start, test, wait; GradBucketer's mark_ready).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"

namespace fusedopt::comm::detail {

/// Where the ranks of a job sit: this rank's node (a communicator of its ranks, in world
/// rank order) and, with several nodes, the communicator of the nodes' leaders (local
/// index 0), in node order.
struct ShmTopology {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm leaders = MPI_COMM_NULL;  ///< null on a non-leader or with one node
  int nodes = 1;
  int node_index = 0;
  int local = 0;              ///< this rank's index in its node
  int local_size = 1;         ///< ranks on this node
  std::vector<int> node_of;   ///< world rank -> node index
  std::vector<int> local_of;  ///< world rank -> index in its node
  std::string pretend;        ///< "FUSEDOPT_COMM_RANKS_PER_NODE=2" when the split is made up
};

/// One collective inside the engine. The engine keeps every one it made and reuses one that
/// nobody else holds any more (its Work's Pending holds it), so that a step allocates only
/// that small Pending per collective. It holds no communicator: an operation abandoned in the
/// queue does not keep its communicator alive.
struct ShmOp {
  Collective c;
  int element = 4;         ///< bytes per element
  std::int64_t first = 0;  ///< sequence number of its first chunk
  std::int64_t chunks = 0;
  std::int64_t span = 0;   ///< elements of a chunk (all_reduce, reduce, broadcast)
  std::int64_t slice = 0;  ///< elements of one rank's slice of a chunk
  std::int64_t block = 0;  ///< reduce_scatter / all_gather: elements per rank's block
  int root_local = -1;     ///< the root's index in its node, when on this node
  int root_node = 0;
  int region = -1;          ///< the shared buffer it runs in place in (-1: the slots)
  std::int64_t offset = 0;  ///< its bytes' offset in that buffer
  bool finished = false;
};

/// What a rank runs as chunk `seq` (published with its arrival): the node's ranks must agree.
struct ShmDesc {
  std::int64_t seq = -1;
  std::int64_t count = 0;
  std::int64_t offset = 0;  ///< in the shared buffer `region`
  std::int32_t kind = 0;    ///< Collective::Kind, and the other fields of the Collective:
  std::int32_t dtype = 0;
  std::int32_t op = 0;
  std::int32_t f64 = 0;
  std::int32_t root = 0;
  std::int32_t region = -1;  ///< -1: through the slots
  bool operator==(const ShmDesc& o) const {
    return seq == o.seq && count == o.count && offset == o.offset && kind == o.kind &&
           dtype == o.dtype && op == o.op && f64 == o.f64 && root == o.root && region == o.region;
  }
};

/// The most slots a rank has (the ring of descriptors has one per slot).
constexpr int kShmMaxSlots = 16;

/// Elements [offset, offset + length) of `op`'s buffer in slice `j` of chunk `k`: a
/// contiguous chunk cut into slices (all_reduce, reduce, broadcast), or part k of block j
/// (reduce_scatter's input, all_gather's output).
struct ShmPiece {
  std::int64_t offset = 0, length = 0;
};

inline ShmPiece shm_piece(const ShmOp& op, std::int64_t k, int j) {
  if (op.block > 0) {
    const std::int64_t at = k * op.slice;
    return {j * op.block + at, std::min(op.slice, op.block - at)};
  }
  const std::int64_t base = k * op.span;
  const std::int64_t n = std::min(op.span, op.c.count - base);
  const std::int64_t at = j * op.slice;
  return {base + at, std::clamp<std::int64_t>(n - at, 0, op.slice)};
}

/// The whole chunk `k` of a contiguous operation.
inline ShmPiece shm_whole(const ShmOp& op, std::int64_t k) {
  const std::int64_t base = k * op.span;
  return {base, std::min(op.span, op.c.count - base)};
}

inline char* shm_at(const void* p, std::int64_t elements, int element) {
  return static_cast<char*>(const_cast<void*>(p)) + elements * element;
}

inline std::size_t shm_bytes(std::int64_t elements, int element) {
  return static_cast<std::size_t>(elements) * static_cast<std::size_t>(element);
}

/// p rounded up to a cache line.
inline char* shm_line_up(void* p) {
  const auto a = (reinterpret_cast<std::uintptr_t>(p) + 63) & ~std::uintptr_t{63};
  return reinterpret_cast<char*>(a);
}

class ShmEngine {
 public:
  /// Collective over the job (every rank of `world` calls it): allocates the segment of
  /// `slots` slots of `slot_bytes` per rank. Takes ownership of the topology's
  /// communicators.
  ShmEngine(int world_rank, ShmTopology topology, std::size_t slot_bytes, int slots);
  ~ShmEngine();
  ShmEngine(const ShmEngine&) = delete;
  ShmEngine& operator=(const ShmEngine&) = delete;

  /// Whether the engine runs `c` (else the caller uses plain MPI): with several nodes only
  /// all_reduce, reduce and broadcast; no sum or max of bytes; no barrier.
  bool takes(const Collective& c) const;
  /// Queues `c` (every rank queues the same collectives in the same order) and progresses.
  std::shared_ptr<ShmOp> start(const Collective& c);
  /// Does every stage the counters allow, for every queued operation; never waits. Throws
  /// CommError when a leader's MPI call fails.
  void progress();
  /// `bytes` of host memory (64-byte aligned, zeroed) that every rank of the node maps: a
  /// new segment, collective over the node (every rank asks for the same bytes: the caller
  /// checks); freed with the engine.
  void* allocate(std::size_t bytes);
  /// Collectives this rank ran in place in shared buffers so far.
  std::int64_t in_place() const { return in_place_; }
  /// "shared memory: 1 node x 2 ranks" and the like.
  std::string describe() const;
  /// Before the communicator goes: finishes what is queued (abandoned operations included)
  /// and frees the segment together with the node's other ranks, within `timeout`;
  /// otherwise leaves it (a peer that stalled would make the collective free hang) and
  /// says so on stderr.
  void close(std::chrono::milliseconds timeout);

 private:
  struct Control;
  Control& control(int local) const;
  /// Local rank `local`'s descriptor of chunk `seq`.
  ShmDesc& desc(int local, std::int64_t seq) const;
  char* slot(int local, std::int64_t seq) const;
  ShmOp& op_at(std::int64_t seq);
  bool all_reached(int flag, std::int64_t seq) const;
  bool step_in(std::int64_t seq);
  bool step_reduce(std::int64_t seq);
  bool post_global(std::int64_t seq);
  bool step_global(std::int64_t seq);
  /// The leader's copy of node `node`'s part of chunk `seq`.
  char* scratch(std::int64_t seq, int node);
  bool step_out(std::int64_t seq);
  /// The shared buffer holding [p, p + bytes) of this rank, with p's offset in it; or -1.
  int locate(const void* p, std::size_t bytes, std::int64_t* offset) const;
  void publish(const ShmOp& op, std::int64_t seq);
  void check_agree(const ShmOp& op, std::int64_t seq) const;
  /// Local rank `local`'s bytes of `op` in its shared buffer, from its descriptor of `seq`.
  char* in_region(const ShmOp& op, int local, std::int64_t seq) const;
  void reduce_in_place(ShmOp& op, std::int64_t k, std::int64_t seq);
  void gather_in_place(const ShmOp& op, std::int64_t k, std::int64_t seq);
  void copy_in_place(const ShmOp& op, std::int64_t k);
  bool released(const ShmOp& op) const;
  void do_in(ShmOp& op, std::int64_t k, char* mine);
  void do_reduce(ShmOp& op, std::int64_t k, std::int64_t seq);
  void do_out(ShmOp& op, std::int64_t k, std::int64_t seq);

  int world_rank_;
  ShmTopology topo_;
  std::size_t slot_bytes_;
  std::size_t slot_stride_;  ///< slot_bytes_ plus room for every slice's alignment
  int slots_;
  MPI_Win window_ = MPI_WIN_NULL;
  std::vector<char*> base_;  ///< each local rank's segment
  /// The shared buffers (allocate()): their windows, each local rank's start, their size.
  struct Region {
    MPI_Win window = MPI_WIN_NULL;
    std::vector<char*> base;
    std::size_t bytes = 0;
  };
  std::vector<Region> regions_;
  std::int64_t in_place_ = 0;
  std::vector<void*> outs_;    ///< the outputs of an in-place combine, sized once
  std::vector<int> world_of_;  ///< local index -> world rank
  bool leader_;
  bool hierarchical_;
  /// The leader's chunks in flight among the leaders: per slot, one part per node.
  /// The sources of a combine (a node's ranks, or the nodes), sized once.
  std::vector<const void*> sources_;
  std::vector<char> scratch_;
  /// Their sends and receives: per slot, 2 x (nodes - 1).
  std::vector<MPI_Request> requests_;
  /// The operations not finished, in order: queue_[head_..]; a vector reused in place (a
  /// deque allocated a block every 32 operations).
  std::vector<std::shared_ptr<ShmOp>> queue_;
  std::size_t head_ = 0;
  bool queue_empty() const { return head_ == queue_.size(); }
  std::vector<std::shared_ptr<ShmOp>> pool_;  ///< every operation made, for reuse
  std::size_t pool_next_ = 0;                 ///< where the search for a free one starts
  std::shared_ptr<ShmOp> fresh_op();
  std::int64_t next_seq_ = 0;  ///< the first chunk of the next operation
  /// The next chunk of each stage (post: the leader's MPI operation started; global: done).
  std::int64_t in_ = 0, reduce_ = 0, post_ = 0, global_ = 0, out_ = 0;
};

/// The engine `options` and the environment (FUSEDOPT_COMM_SHM, _RANKS_PER_NODE,
/// _SHM_SLOT_KIB; rank 0's settings apply to every rank) ask for over `world` (collective),
/// or null: then `transport` says why ("mpi (shared memory off: FUSEDOPT_COMM_SHM=0)");
/// else it describes the engine.
std::unique_ptr<ShmEngine> make_shm_engine(MPI_Comm world, const MpiOptions& options,
                                           std::string* transport);

/// The topology of `world` (collective): MPI_Comm_split_type(SHARED), or pretend nodes of
/// `ranks_per_node` consecutive ranks (each within one real node; UsageError otherwise).
ShmTopology shm_topology(MPI_Comm world, int ranks_per_node);

}  // namespace fusedopt::comm::detail
