// The shared-memory engine's in-place collectives (shm_engine.hpp): shared buffers, the
// descriptors the node's ranks check each other's chunks against, and the reduce that reads
// and writes every rank's buffer directly.
#include <fmt/format.h>

#include <cstring>

#include "comm/mpi_types.hpp"
#include "comm/shm_combine.hpp"
#include "comm/shm_engine.hpp"
#include "support/check.hpp"

namespace fusedopt::comm::detail {

void* ShmEngine::allocate(std::size_t bytes) {
  MPI_Info info;
  MPI_Info_create(&info);
  MPI_Info_set(info, "alloc_shared_noncontig", "true");
  char* mine = nullptr;
  Region r;
  r.bytes = bytes;
  const int rc = MPI_Win_allocate_shared(static_cast<MPI_Aint>(bytes + 64), 1, info, topo_.node,
                                         &mine, &r.window);
  MPI_Info_free(&info);
  if (rc != MPI_SUCCESS) {
    throw CommError(world_rank_, "allocate_shared (MPI_Win_allocate_shared)", bytes,
                    mpi_error_text(rc));
  }
  for (int k = 0; k < topo_.local_size; ++k) {
    MPI_Aint size = 0;
    int unit = 0;
    void* ptr = nullptr;
    MPI_Win_shared_query(r.window, k, &size, &unit, &ptr);
    r.base.push_back(shm_line_up(ptr));
  }
  char* data = r.base[static_cast<std::size_t>(topo_.local)];
  std::memset(data, 0, bytes);  // first touched by its owner
  regions_.push_back(std::move(r));
  MPI_Barrier(topo_.node);  // zeroed everywhere before anyone uses it
  return data;
}

int ShmEngine::locate(const void* p, std::size_t n, std::int64_t* offset) const {
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  for (std::size_t k = 0; k < regions_.size(); ++k) {
    const auto start =
        reinterpret_cast<std::uintptr_t>(regions_[k].base[static_cast<std::size_t>(topo_.local)]);
    if (at >= start && at - start <= regions_[k].bytes && n <= regions_[k].bytes - (at - start)) {
      *offset = static_cast<std::int64_t>(at - start);
      return static_cast<int>(k);
    }
  }
  return -1;
}

void ShmEngine::publish(const ShmOp& op, std::int64_t seq) {
  ShmDesc& d = desc(topo_.local, seq);
  d.seq = seq;
  d.count = op.c.count;
  d.offset = op.offset;
  d.kind = static_cast<std::int32_t>(op.c.kind);
  d.dtype = static_cast<std::int32_t>(op.c.dtype);
  d.op = static_cast<std::int32_t>(op.c.op);
  d.f64 = op.c.f64 ? 1 : 0;
  d.root = op.c.root;
  d.region = op.region;
}

namespace {
/// "all_reduce(sum, fp32) of 16 elements in place in shared buffer 0 at byte 64".
std::string describe_desc(const ShmDesc& d) {
  Collective c;
  c.kind = static_cast<Collective::Kind>(d.kind);
  c.dtype = static_cast<DType>(d.dtype);
  c.op = static_cast<ReduceOp>(d.op);
  c.f64 = d.f64 != 0;
  c.root = d.root;
  return fmt::format("{} of {} elements", describe(c), d.count) +
         (d.region >= 0
              ? fmt::format(" in place in shared buffer {} at byte {}", d.region, d.offset)
              : std::string(" through the slots (not in a shared buffer)"));
}
}  // namespace

// Every rank of the node must run the same collective as chunk `seq`: the same kind, count,
// root, and either all through the slots or all in the same shared buffer at the same offset
// (a rank reads the others' buffers at its own offset). Each rank checks every descriptor,
// so a mismatch is an error on every rank of the node, before anything is read.
void ShmEngine::check_agree(const ShmOp& op, std::int64_t seq) const {
  const ShmDesc& mine = desc(topo_.local, seq);
  for (int r = 0; r < topo_.local_size; ++r) {
    const ShmDesc& theirs = desc(r, seq);
    if (theirs == mine) continue;
    throw CommError(world_rank_, detail::describe(op.c), shm_bytes(op.c.count, op.element),
                    fmt::format("shared memory: the ranks of this node run different collectives "
                                "(chunk {} of this communicator): rank {} {}, rank {} {}",
                                seq, world_rank_, describe_desc(mine),
                                world_of_[static_cast<std::size_t>(r)], describe_desc(theirs)));
  }
}

// Slice `me` of chunk k, read from every rank's shared buffer in rank order and written into
// every rank's (all_reduce) or the root's (reduce): no copy in or out.
void ShmEngine::reduce_in_place(ShmOp& op, std::int64_t k) {
  const int me = topo_.local, el = op.element;
  const ShmPiece p = shm_piece(op, k, me);
  if (p.length <= 0) return;
  const Region& g = regions_[static_cast<std::size_t>(op.region)];
  const void** src = sources_.data();
  const std::size_t at = static_cast<std::size_t>(op.offset) + shm_bytes(p.offset, el);
  for (int r = 0; r < topo_.local_size; ++r) src[r] = g.base[static_cast<std::size_t>(r)] + at;
  int outs = 0;
  for (int r = 0; r < topo_.local_size; ++r) {
    if (op.c.kind == Collective::Kind::AllReduce || r == op.root_local)
      outs_[static_cast<std::size_t>(outs++)] = g.base[static_cast<std::size_t>(r)] + at;
  }
  shm_combine(op.c.dtype, op.c.f64, op.c.op, src, topo_.local_size, outs_.data(), outs, p.length);
}

// Chunk k of a broadcast in place: the whole chunk, from the root's shared buffer into this
// rank's, at the same offset.
void ShmEngine::copy_in_place(const ShmOp& op, std::int64_t k) {
  const ShmPiece p = shm_whole(op, k);
  const Region& g = regions_[static_cast<std::size_t>(op.region)];
  const std::size_t at = static_cast<std::size_t>(op.offset) + shm_bytes(p.offset, op.element);
  std::memcpy(g.base[static_cast<std::size_t>(topo_.local)] + at,
              g.base[static_cast<std::size_t>(op.root_local)] + at,
              shm_bytes(p.length, op.element));
}

}  // namespace fusedopt::comm::detail
