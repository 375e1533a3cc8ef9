// The shared-memory engine's in-place collectives (shm_engine.hpp): shared buffers, the
// descriptors the node's ranks check each other's chunks against, and the reduce that reads
// and writes every rank's buffer directly.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "mpi_types.hpp"
#include "shm_combine.hpp"
#include "shm_engine.hpp"
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
// (a rank reads the others' buffers at its own offset; a reduce_scatter's or an all_gather's
// send buffer may sit at a different offset on each rank: the others read it from its
// descriptor). Each rank checks every descriptor, so a mismatch is an error on every rank of
// the node, before anything is read.
void ShmEngine::check_agree(const ShmOp& op, std::int64_t seq) const {
  const ShmDesc& mine = desc(topo_.local, seq);
  for (int r = 0; r < topo_.local_size; ++r) {
    ShmDesc theirs = desc(r, seq);
    if (op.block > 0 && mine.region >= 0 && theirs.region == mine.region)
      theirs.offset = mine.offset;
    if (theirs == mine) continue;
    throw CommError(
        world_rank_, detail::describe(op.c), shm_bytes(op.c.count, op.element),
        fmt::format("shared memory: the ranks of this node run different collectives "
                    "(chunk {} of this communicator): rank {} {}, rank {} {}",
                    seq, world_rank_, describe_desc(mine), world_of_[static_cast<std::size_t>(r)],
                    describe_desc(desc(r, seq))));
  }
}

char* ShmEngine::in_region(const ShmOp& op, int local, std::int64_t seq) const {
  return regions_[static_cast<std::size_t>(op.region)].base[static_cast<std::size_t>(local)] +
         desc(local, seq).offset;
}

// Slice `me` of chunk k (reduce_scatter: part k of block `me`), read from every rank's shared
// buffer in rank order and written into every rank's (all_reduce), the root's (reduce) or
// this rank's receive buffer (reduce_scatter): no copy in or out.
void ShmEngine::reduce_in_place(ShmOp& op, std::int64_t k, std::int64_t seq) {
  const int me = topo_.local, el = op.element;
  const ShmPiece p = shm_piece(op, k, me);
  if (p.length <= 0) return;
  const void** src = sources_.data();
  const std::size_t at = shm_bytes(p.offset, el);
  for (int r = 0; r < topo_.local_size; ++r) src[r] = in_region(op, r, seq) + at;
  int outs = 0;
  if (op.c.kind == Collective::Kind::ReduceScatter) {
    outs_[static_cast<std::size_t>(outs++)] = shm_at(op.c.recv, k * op.slice, el);
  }
  for (int r = 0; r < topo_.local_size; ++r) {
    if (op.c.kind == Collective::Kind::AllReduce || r == op.root_local)
      outs_[static_cast<std::size_t>(outs++)] = in_region(op, r, seq) + at;
  }
  shm_combine(op.c.dtype, op.c.f64, op.c.op, src, topo_.local_size, outs_.data(), outs, p.length);
}

// Chunk k of an all_gather whose send buffers are shared: part k of every rank's send buffer,
// read where it lies, into block j of this rank's receive buffer (nothing to copy where the
// send buffer already is that block: the in-place form, send = recv + rank x count).
void ShmEngine::gather_in_place(const ShmOp& op, std::int64_t k, std::int64_t seq) {
  const int el = op.element;
  const std::int64_t from = k * op.slice;
  const std::int64_t n = std::min(op.slice, op.block - from);
  for (int j = 0; j < topo_.local_size; ++j) {
    const char* src = in_region(op, j, seq) + shm_bytes(from, el);
    char* dst = shm_at(op.c.recv, j * op.block + from, el);
    if (src != dst) std::memmove(dst, src, shm_bytes(n, el));
  }
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
