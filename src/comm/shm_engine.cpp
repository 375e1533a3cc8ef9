// The shared-memory engine (shm_engine.hpp): the segment, the chunk pipeline and its
// counters. The combining kernels are in shm_combine.cpp, the topology in shm_topology.cpp.
#include "shm_engine.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <new>
#include <thread>

#include "mpi_types.hpp"
#include "shm_combine.hpp"
#include "support/check.hpp"

namespace fusedopt::comm::detail {

namespace {

/// Slices start on 16 elements (64 bytes of fp32): whole cache lines, vector loops.
constexpr std::int64_t kAlign = 16;

std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

int element_bytes(const Collective& c) { return c.f64 ? 8 : static_cast<int>(dtype_size(c.dtype)); }

bool is_reduction(Collective::Kind k) {
  return k == Collective::Kind::AllReduce || k == Collective::Kind::Reduce ||
         k == Collective::Kind::ReduceScatter;
}

/// One rank's counter, alone on its cache line.
struct alignas(64) Counter {
  std::atomic<std::int64_t> value{-1};
};
static_assert(std::atomic<std::int64_t>::is_always_lock_free,
              "the shared-memory counters need lock-free 64-bit atomics");

enum Flag { kArrived, kReduced, kGlobal, kDone, kClosing, kFlags };

}  // namespace

/// The head of each rank's segment: its counters (the highest chunk it has passed through
/// each stage) and the descriptors of its last chunks, then its slots.
struct ShmEngine::Control {
  Counter flag[kFlags];
  ShmDesc desc[kShmMaxSlots];
};

namespace {
constexpr std::size_t kControlBytes =
    (sizeof(Counter) * kFlags + sizeof(ShmDesc) * kShmMaxSlots + 4095) / 4096 * 4096;
/// An in-place collective's chunk: its slices are big enough that the counters cost nothing
/// beside them, small enough that a rank's mark_ready does a bounded piece of work.
constexpr std::int64_t kInPlaceChunkBytes = std::int64_t{8} << 20;
}  // namespace

ShmEngine::ShmEngine(int world_rank, ShmTopology topology, std::size_t slot_bytes, int slots)
    : world_rank_(world_rank),
      topo_(std::move(topology)),
      slot_bytes_(slot_bytes),
      slot_stride_(slot_bytes + static_cast<std::size_t>(topo_.local_size * kAlign * 8) + 64),
      slots_(slots),
      leader_(topo_.local == 0),
      hierarchical_(topo_.nodes > 1) {
  // 64 bytes more: MPI does not align the segments (UBSan saw one 8 bytes past a line).
  const auto bytes =
      static_cast<MPI_Aint>(kControlBytes + slot_stride_ * static_cast<std::size_t>(slots_) + 64);
  MPI_Info info;
  MPI_Info_create(&info);
  MPI_Info_set(info, "alloc_shared_noncontig", "true");
  char* mine = nullptr;
  const int rc = MPI_Win_allocate_shared(bytes, 1, info, topo_.node, &mine, &window_);
  MPI_Info_free(&info);
  if (rc != MPI_SUCCESS) {
    throw CommError(world_rank_, "MPI_Win_allocate_shared", static_cast<std::size_t>(bytes),
                    mpi_error_text(rc) + " (FUSEDOPT_COMM_SHM=0 uses plain MPI)");
  }
  // Each segment's start rounded up to a cache line: the mappings are page-aligned in every
  // process and a segment sits at the same offset in each, so every rank rounds alike.
  static_assert(sizeof(Control) <= kControlBytes, "the control block outgrew its pages");
  FUSEDOPT_CHECK_INTERNAL(slots_ >= 1 && slots_ <= kShmMaxSlots, "shared memory: {} slots", slots_);
  new (shm_line_up(mine)) Control();
  base_.resize(static_cast<std::size_t>(topo_.local_size));
  for (int r = 0; r < topo_.local_size; ++r) {
    MPI_Aint size = 0;
    int unit = 0;
    void* ptr = nullptr;
    MPI_Win_shared_query(window_, r, &size, &unit, &ptr);
    base_[static_cast<std::size_t>(r)] = shm_line_up(ptr);
  }
  sources_.resize(static_cast<std::size_t>(std::max(topo_.local_size, topo_.nodes)));
  outs_.resize(static_cast<std::size_t>(topo_.local_size));
  world_of_.assign(static_cast<std::size_t>(topo_.local_size), -1);
  for (std::size_t w = 0; w < topo_.local_of.size(); ++w) {
    if (topo_.node_of[w] == topo_.node_index)
      world_of_[static_cast<std::size_t>(topo_.local_of[w])] = static_cast<int>(w);
  }
  if (leader_ && hierarchical_) {
    const auto parts = static_cast<std::size_t>(slots_) * static_cast<std::size_t>(topo_.nodes);
    scratch_.resize(slot_stride_ * parts);
    requests_.assign(
        static_cast<std::size_t>(slots_) * 2 * static_cast<std::size_t>(topo_.nodes - 1),
        MPI_REQUEST_NULL);
  }
  // Every rank's counters are set before anyone reads them.
  MPI_Barrier(topo_.node);
}

ShmEngine::~ShmEngine() = default;

ShmEngine::Control& ShmEngine::control(int local) const {
  return *reinterpret_cast<Control*>(base_[static_cast<std::size_t>(local)]);
}

ShmDesc& ShmEngine::desc(int local, std::int64_t seq) const {
  return control(local).desc[seq % slots_];
}

char* ShmEngine::slot(int local, std::int64_t seq) const {
  return base_[static_cast<std::size_t>(local)] + kControlBytes +
         slot_stride_ * static_cast<std::size_t>(seq % slots_);
}

bool ShmEngine::all_reached(int flag, std::int64_t seq) const {
  for (int r = 0; r < topo_.local_size; ++r) {
    if (control(r).flag[flag].value.load(std::memory_order_acquire) < seq) return false;
  }
  return true;
}

bool ShmEngine::takes(const Collective& c) const {
  using K = Collective::Kind;
  if (c.kind == K::Barrier) return false;
  if (c.count <= 0) return true;  // nothing to move: complete at once
  if (!c.f64 && c.dtype == DType::U8 && is_reduction(c.kind)) return false;
  if (hierarchical_) return c.kind == K::AllReduce || c.kind == K::Reduce || c.kind == K::Broadcast;
  return true;
}

// An operation nobody but the pool holds (its Work dropped, out of the queue), reset; or a
// new one. The pool grows to the most operations a step has alive at once.
std::shared_ptr<ShmOp> ShmEngine::fresh_op() {
  for (std::size_t n = 0; n < pool_.size(); ++n) {
    std::shared_ptr<ShmOp>& o = pool_[pool_next_];
    pool_next_ = (pool_next_ + 1) % pool_.size();
    if (o.use_count() == 1) {
      *o = ShmOp();
      return o;
    }
  }
  pool_.push_back(std::make_shared<ShmOp>());
  return pool_.back();
}

std::shared_ptr<ShmOp> ShmEngine::start(const Collective& c) {
  std::shared_ptr<ShmOp> op = fresh_op();
  op->c = c;
  op->element = element_bytes(c);
  const std::int64_t w = topo_.local_size;
  const auto slot_elements = static_cast<std::int64_t>(slot_bytes_) / op->element;
  const bool blocks =
      c.kind == Collective::Kind::ReduceScatter || c.kind == Collective::Kind::AllGather;
  if (!hierarchical_ && c.count > 0 && (blocks || c.send == c.recv)) {
    // Where the ranks read each other: the data (all_reduce, reduce, broadcast) or the send
    // buffer (reduce_scatter: size() blocks, all_gather: one). One node: w is size(). A
    // reduce_scatter's or an all_gather's receive buffer lies apart from its send buffer or is
    // this rank's own block of it (Communicator checks): the only part this rank writes while
    // the others read.
    const std::int64_t n = c.kind == Collective::Kind::ReduceScatter ? c.count * w : c.count;
    op->region = locate(c.send, shm_bytes(n, op->element), &op->offset);
  }
  if (op->region >= 0 && blocks) {
    op->block = c.count;
    op->slice = round_up(std::max(slot_elements, kInPlaceChunkBytes / op->element) / w, kAlign);
    op->chunks = (c.count + op->slice - 1) / op->slice;
    ++in_place_;
  } else if (op->region >= 0) {
    op->span = std::max(slot_elements, kInPlaceChunkBytes / op->element);
    op->slice = round_up((op->span + w - 1) / w, kAlign);
    op->chunks = (c.count + op->span - 1) / op->span;
    ++in_place_;
  } else if (blocks) {
    op->block = c.count;
    op->slice = std::max(kAlign, slot_elements / w / kAlign * kAlign);
    op->chunks = (c.count + op->slice - 1) / op->slice;
  } else {
    op->span = slot_elements;
    op->slice = round_up((slot_elements + w - 1) / w, kAlign);
    op->chunks = (c.count + slot_elements - 1) / slot_elements;
  }
  if (c.kind == Collective::Kind::Reduce || c.kind == Collective::Kind::Broadcast) {
    op->root_node = topo_.node_of[static_cast<std::size_t>(c.root)];
    if (op->root_node == topo_.node_index)
      op->root_local = topo_.local_of[static_cast<std::size_t>(c.root)];
  }
  op->first = next_seq_;
  if (op->chunks == 0) {
    op->finished = true;
    return op;
  }
  next_seq_ += op->chunks;
  if (queue_empty()) {
    queue_.clear();  // keeps its capacity
    head_ = 0;
  } else if (head_ > 0 && queue_.size() == queue_.capacity()) {
    queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(head_));
    head_ = 0;
  }
  queue_.push_back(op);
  progress();
  return op;
}

ShmOp& ShmEngine::op_at(std::int64_t seq) {
  auto it = std::upper_bound(
      queue_.begin() + static_cast<std::ptrdiff_t>(head_), queue_.end(), seq,
      [](std::int64_t s, const std::shared_ptr<ShmOp>& o) { return s < o->first; });
  FUSEDOPT_CHECK_INTERNAL(it != queue_.begin() + static_cast<std::ptrdiff_t>(head_),
                          "shared-memory chunk {} has no operation", seq);
  return **(it - 1);
}

void ShmEngine::do_in(ShmOp& op, std::int64_t k, char* mine) {
  using K = Collective::Kind;
  const int me = topo_.local, el = op.element;
  switch (op.c.kind) {
    case K::AllReduce:
    case K::Reduce:
    case K::ReduceScatter:
      for (int j = 0; j < topo_.local_size; ++j) {
        if (j == me) continue;
        const ShmPiece p = shm_piece(op, k, j);
        if (p.length > 0)
          std::memcpy(mine + shm_bytes(j * op.slice, el), shm_at(op.c.send, p.offset, el),
                      shm_bytes(p.length, el));
      }
      break;
    case K::Broadcast:
      if (world_rank_ == op.c.root) {
        const ShmPiece p = shm_whole(op, k);
        std::memcpy(mine, shm_at(op.c.send, p.offset, el), shm_bytes(p.length, el));
      }
      break;
    case K::AllGather: {
      const std::int64_t from = k * op.slice;
      const std::int64_t n = std::min(op.slice, op.block - from);
      std::memcpy(mine + shm_bytes(me * op.slice, el), shm_at(op.c.send, from, el),
                  shm_bytes(n, el));
      break;
    }
    case K::Barrier:
      break;
  }
}

void ShmEngine::do_reduce(ShmOp& op, std::int64_t k, std::int64_t seq) {
  using K = Collective::Kind;
  if (!is_reduction(op.c.kind)) return;
  const int me = topo_.local, el = op.element;
  const ShmPiece p = shm_piece(op, k, me);
  if (p.length <= 0) return;
  const void** src = sources_.data();
  for (int r = 0; r < topo_.local_size; ++r) {
    src[r] =
        r == me ? shm_at(op.c.send, p.offset, el) : slot(r, seq) + shm_bytes(me * op.slice, el);
  }
  char* staged = slot(me, seq) + shm_bytes(me * op.slice, el);
  void* out[2] = {staged, nullptr};
  int outs = 1;
  if (op.c.kind == K::ReduceScatter) {
    out[0] = shm_at(op.c.recv, k * op.slice, el);
  } else if (!hierarchical_ && (op.c.kind == K::AllReduce || world_rank_ == op.c.root)) {
    out[outs++] = shm_at(op.c.recv, p.offset, el);  // this rank's slice of the result, in place
  }
  shm_combine(op.c.dtype, op.c.f64, op.c.op, src, topo_.local_size, out, outs, p.length);
}

void ShmEngine::do_out(ShmOp& op, std::int64_t k, std::int64_t seq) {
  using K = Collective::Kind;
  const int me = topo_.local, el = op.element;
  const bool receives = op.c.kind == K::AllReduce || op.c.kind == K::AllGather ||
                        (op.c.kind == K::Reduce && world_rank_ == op.c.root) ||
                        (op.c.kind == K::Broadcast && world_rank_ != op.c.root);
  if (!receives) return;
  if (op.c.kind == K::AllGather) {
    for (int j = 0; j < topo_.local_size; ++j) {
      const ShmPiece p = shm_piece(op, k, j);
      const char* from = j == me ? shm_at(op.c.send, k * op.slice, el)
                                 : slot(j, seq) + shm_bytes(j * op.slice, el);
      char* to = shm_at(op.c.recv, p.offset, el);
      if (to != from) std::memcpy(to, from, shm_bytes(p.length, el));  // send = recv + me x block
    }
    return;
  }
  if (hierarchical_ || op.c.kind == K::Broadcast) {
    // The whole chunk: from the leader's slot (hierarchical), or the root's.
    const ShmPiece p = shm_whole(op, k);
    const char* from = slot(hierarchical_ ? 0 : op.root_local, seq);
    std::memcpy(shm_at(op.c.recv, p.offset, el), from, shm_bytes(p.length, el));
    return;
  }
  for (int j = 0; j < topo_.local_size; ++j) {
    if (j == me) continue;
    const ShmPiece p = shm_piece(op, k, j);
    if (p.length > 0)
      std::memcpy(shm_at(op.c.recv, p.offset, el), slot(j, seq) + shm_bytes(j * op.slice, el),
                  shm_bytes(p.length, el));
  }
}

bool ShmEngine::step_in(std::int64_t seq) {
  if (!all_reached(kDone, seq - slots_)) return false;  // the slot is still being read
  ShmOp& op = op_at(seq);
  publish(op, seq);
  if (op.region < 0) do_in(op, seq - op.first, slot(topo_.local, seq));
  control(topo_.local).flag[kArrived].value.store(seq, std::memory_order_release);
  return true;
}

bool ShmEngine::step_reduce(std::int64_t seq) {
  if (!all_reached(kArrived, seq)) return false;
  ShmOp& op = op_at(seq);
  check_agree(op, seq);
  if (op.region >= 0 && op.c.kind == Collective::Kind::AllGather) {
    gather_in_place(op, seq - op.first, seq);
  } else if (op.region >= 0) {
    if (is_reduction(op.c.kind)) reduce_in_place(op, seq - op.first, seq);
  } else {
    do_reduce(op, seq - op.first, seq);
  }
  control(topo_.local).flag[kReduced].value.store(seq, std::memory_order_release);
  return true;
}

char* ShmEngine::scratch(std::int64_t seq, int node) {
  const auto part = static_cast<std::size_t>(seq % slots_) * static_cast<std::size_t>(topo_.nodes) +
                    static_cast<std::size_t>(node);
  return scratch_.data() + slot_stride_ * part;
}

// The leader's part of a hierarchical chunk: the node's result (or the root's data) into its
// scratch part, sent to every other leader while theirs arrive (MPI_Isend/Irecv of bytes
// between buffers allocated once: no MPI scratch, no page faults), then added in node order
// (the same bits whatever MPI's timing) into its slot for the node's ranks. Up to one chunk
// per slot in flight; the leaders post them in chunk order, and MPI keeps the order of the
// messages between two ranks.
bool ShmEngine::post_global(std::int64_t seq) {
  if (!hierarchical_ || !leader_) return true;
  // The scratch is free once the chunk that last used it has been combined.
  if (global_ <= seq - slots_ || !all_reached(kReduced, seq)) return false;
  ShmOp& op = op_at(seq);
  const std::int64_t k = seq - op.first;
  const ShmPiece chunk = shm_whole(op, k);
  const int el = op.element;
  const bool bcast = op.c.kind == Collective::Kind::Broadcast;
  const int me = topo_.node_index;
  char* mine = scratch(seq, me);
  if (!bcast) {
    for (int j = 0; j < topo_.local_size; ++j) {
      const ShmPiece p = shm_piece(op, k, j);
      if (p.length > 0) {
        std::memcpy(mine + shm_bytes(j * op.slice, el), slot(j, seq) + shm_bytes(j * op.slice, el),
                    shm_bytes(p.length, el));
      }
    }
  } else if (op.root_node == me) {
    const char* from =
        op.root_local == 0 ? shm_at(op.c.send, chunk.offset, el) : slot(op.root_local, seq);
    std::memcpy(mine, from, shm_bytes(chunk.length, el));
  }
  const int n = static_cast<int>(shm_bytes(chunk.length, el));
  MPI_Request* r = &requests_[static_cast<std::size_t>(seq % slots_) * 2 *
                              static_cast<std::size_t>(topo_.nodes - 1)];
  int rc = MPI_SUCCESS;
  for (int node = 0; node < topo_.nodes && rc == MPI_SUCCESS; ++node) {
    if (node == me) continue;
    const bool sends = !bcast || me == op.root_node;
    const bool receives = !bcast || node == op.root_node;
    *r = MPI_REQUEST_NULL;
    if (receives) rc = MPI_Irecv(scratch(seq, node), n, MPI_BYTE, node, 0, topo_.leaders, r);
    ++r;
    *r = MPI_REQUEST_NULL;
    if (sends && rc == MPI_SUCCESS) rc = MPI_Isend(mine, n, MPI_BYTE, node, 0, topo_.leaders, r);
    ++r;
  }
  if (rc != MPI_SUCCESS) {
    throw CommError(world_rank_, "shared memory: the leaders' exchange",
                    static_cast<std::size_t>(n), mpi_error_text(rc));
  }
  return true;
}

bool ShmEngine::step_global(std::int64_t seq) {
  if (!hierarchical_ || !leader_) return true;
  ShmOp& op = op_at(seq);
  const ShmPiece chunk = shm_whole(op, seq - op.first);
  const int count = 2 * (topo_.nodes - 1);
  int flag = 0;
  const int rc = MPI_Testall(
      count, &requests_[static_cast<std::size_t>(seq % slots_) * static_cast<std::size_t>(count)],
      &flag, MPI_STATUSES_IGNORE);
  if (rc != MPI_SUCCESS) {
    throw CommError(world_rank_, "shared memory: the leaders' exchange",
                    shm_bytes(chunk.length, op.element), mpi_error_text(rc));
  }
  if (!flag) return false;
  if (op.c.kind == Collective::Kind::Broadcast) {
    std::memcpy(slot(0, seq), scratch(seq, op.root_node), shm_bytes(chunk.length, op.element));
  } else {
    const void** src = sources_.data();
    for (int node = 0; node < topo_.nodes; ++node) src[node] = scratch(seq, node);
    void* out = slot(0, seq);
    shm_combine(op.c.dtype, op.c.f64, op.c.op, src, topo_.nodes, &out, 1, chunk.length);
  }
  control(0).flag[kGlobal].value.store(seq, std::memory_order_release);
  return true;
}

bool ShmEngine::step_out(std::int64_t seq) {
  if (hierarchical_) {
    if (control(0).flag[kGlobal].value.load(std::memory_order_acquire) < seq) return false;
  } else if (!all_reached(kReduced, seq)) {
    return false;
  }
  ShmOp& op = op_at(seq);
  if (op.region < 0) {
    do_out(op, seq - op.first, seq);
  } else if (op.c.kind == Collective::Kind::Broadcast && world_rank_ != op.c.root) {
    copy_in_place(op, seq - op.first);
  }
  control(topo_.local).flag[kDone].value.store(seq, std::memory_order_release);
  return true;
}

// A broadcast's root runs in place from its own buffer, which the others read until their
// out stage: it is complete only when every rank is done with its last chunk (otherwise the
// root could write its buffer again while they copy). Any other operation: at once (an
// in-place reduce_scatter or all_gather is done only when every rank has passed its reduce
// stage, so no rank still reads this one's send buffer).
bool ShmEngine::released(const ShmOp& op) const {
  return op.region < 0 || op.c.kind != Collective::Kind::Broadcast ||
         all_reached(kDone, op.first + op.chunks - 1);
}

void ShmEngine::progress() {
  for (bool moved = true; moved;) {
    moved = false;
    while (out_ < global_ && step_out(out_)) {
      ++out_;
      moved = true;
    }
    while (!queue_empty() && queue_[head_]->first + queue_[head_]->chunks <= out_ &&
           released(*queue_[head_])) {
      queue_[head_]->finished = true;
      queue_[head_++].reset();
    }
    while (global_ < post_ && step_global(global_)) {
      ++global_;
      moved = true;
    }
    while (post_ < reduce_ && post_global(post_)) {
      ++post_;
      moved = true;
    }
    while (reduce_ < in_ && step_reduce(reduce_)) {
      ++reduce_;
      moved = true;
    }
    while (in_ < next_seq_ && step_in(in_)) {
      ++in_;
      moved = true;
    }
  }
}

std::string ShmEngine::describe() const {
  std::string s = topo_.nodes == 1
                      ? fmt::format("shared memory: 1 node x {} ranks", topo_.local_size)
                      : fmt::format("shared memory: {} nodes, {} rank{} on this one", topo_.nodes,
                                    topo_.local_size, topo_.local_size == 1 ? "" : "s");
  if (hierarchical_)
    s += ", hierarchical (node-local reduce, leaders over MPI, node-local broadcast)";
  if (!topo_.pretend.empty()) s += ", pretend nodes (" + topo_.pretend + ")";
  s += fmt::format("; {} slots of {} KiB per rank", slots_, slot_bytes_ >> 10);
  if (!regions_.empty()) {
    std::size_t total = 0;
    for (const Region& r : regions_) total += r.bytes;
    s += fmt::format("; {} shared buffer{} ({:.1f} MiB), {} collective{} in place so far",
                     regions_.size(), regions_.size() == 1 ? "" : "s",
                     static_cast<double>(total) / (1 << 20), in_place_, in_place_ == 1 ? "" : "s");
  }
  return s;
}

void ShmEngine::close(std::chrono::milliseconds timeout) {
  if (window_ == MPI_WIN_NULL || mpi_finalized()) return;
  // Operations abandoned after a CommError still complete once their late ranks join, as
  // they would under MPI: the others are waiting for this rank's part.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool ready = true;
  try {
    while (!queue_empty()) {
      progress();
      if (queue_empty()) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        ready = false;
        break;
      }
      std::this_thread::yield();
    }
  } catch (const CommError&) {
    ready = false;
  }
  if (ready) {
    control(topo_.local).flag[kClosing].value.store(1, std::memory_order_release);
    while (!all_reached(kClosing, 1)) {
      if (std::chrono::steady_clock::now() >= deadline) {
        ready = false;
        break;
      }
      std::this_thread::yield();
    }
  }
  if (!ready) {
    std::fprintf(stderr,
                 "fusedopt: rank %d: the shared-memory collectives did not end together on "
                 "this node; their segment is left to MPI_Finalize\n",
                 world_rank_);
    return;
  }
  for (Region& r : regions_) MPI_Win_free(&r.window);
  regions_.clear();
  MPI_Win_free(&window_);
  if (topo_.leaders != MPI_COMM_NULL) MPI_Comm_free(&topo_.leaders);
  MPI_Comm_free(&topo_.node);
}

}  // namespace fusedopt::comm::detail
