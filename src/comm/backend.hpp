// The seam between Communicator (the public front: argument checks, deadlines, errors) and
// a transport (MPI on host memory, NCCL on device memory). A Backend starts operations and
// tells whether one is complete; it never waits without a deadline.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fusedopt/comm.hpp"

namespace fusedopt::comm::detail {

/// The arguments of a collective, in elements of `dtype`.
struct Collective {
  enum class Kind { AllReduce, Reduce, ReduceScatter, AllGather, Broadcast, Barrier };
  Kind kind = Kind::Barrier;
  const void* send = nullptr;  ///< AllReduce and Broadcast: == recv (in place)
  void* recv = nullptr;
  std::int64_t count = 0;  ///< AllReduce/Broadcast: count; ReduceScatter: recv count;
                           ///< AllGather: send count
  DType dtype = DType::F32;
  bool f64 = false;  ///< float64 elements (dtype is then ignored)
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
  void* stream = nullptr;
};

}  // namespace fusedopt::comm::detail

namespace fusedopt::comm {

/// A transport behind a Communicator (comm.hpp names it, opaque).
class Backend : public std::enable_shared_from_this<Backend> {
 public:
  virtual ~Backend() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;
  /// How it moves data (Communicator::transport): its name unless it says more.
  virtual std::string transport() const { return name(); }
  virtual Device device() const = 0;
  /// Starts `c`; the Pending's `what`, bytes and owner are filled in by the caller.
  virtual std::shared_ptr<Pending> start(const detail::Collective& c) = 0;
  /// Whether `p` is complete (progresses it); throws CommError when it failed.
  virtual bool test(Pending& p) = 0;
  /// Ends the connection at once (see Communicator::abort).
  virtual void abort(bool end_job) = 0;
  /// Communicator::allocate_shared: by default ordinary host memory, kept until the
  /// backend goes (a transport without shared memory).
  virtual void* allocate_shared(std::size_t bytes);
  /// The host-memory channel for small control messages (plan fingerprints): itself for
  /// MPI, the bootstrap for NCCL; null when there is none (a wrapped ncclComm_t).
  virtual std::shared_ptr<Backend> control() { return shared_from_this(); }

  /// True when operations advance only while this process calls into the transport (MPI
  /// without a progress thread: a large reduce is thousands of rounds, each needing a
  /// call): waiting then polls without sleeping, yielding the core between polls.
  bool progress_by_polling = false;
  std::chrono::milliseconds timeout = Communicator::default_timeout();
  bool broken = false;
  std::string broken_by;  ///< the error that broke it

 private:
  struct FreeHost {
    void operator()(void* p) const;
  };
  std::vector<std::unique_ptr<void, FreeHost>> host_buffers_;  ///< allocate_shared's
};

}  // namespace fusedopt::comm

namespace fusedopt::comm::detail {

/// The transports (mpi_backend.cpp, nccl_backend.cpp); each throws UnavailableError, saying
/// how to get it, when this build or machine lacks it.
std::shared_ptr<Backend> make_mpi_world(const MpiOptions& options);
std::shared_ptr<Backend> make_mpi(const void* mpi_comm, const MpiOptions& options);
std::shared_ptr<Backend> make_nccl(int device, Backend& bootstrap);
std::shared_ptr<Backend> wrap_nccl(void* nccl_comm, int device);
bool mpi_available(std::string* why);
bool nccl_available(std::string* why);

/// Starts `c` on `b` after Communicator's checks (a broken backend, a negative count, a
/// null buffer): the Work names the operation and its bytes and waits with b's deadline.
/// Transports use it for their own control traffic (NCCL's unique id over its bootstrap).
Work start(const std::shared_ptr<Backend>& b, const Collective& c);
/// The Collective of one Communicator call.
Collective collective(Collective::Kind kind, const void* send, void* recv, std::int64_t count,
                      DType dtype, ReduceOp op, int root, void* stream);

/// "all_reduce(sum, fp32)" and friends.
std::string describe(const Collective& c);

}  // namespace fusedopt::comm::detail

namespace fusedopt::comm {

/// One operation in flight: what it is (for errors, described only when one is raised: no
/// allocation per call) and the transport's handle (comm.hpp's Work holds it, opaque).
struct Pending {
  detail::Collective what;
  std::size_t bytes = 0;  ///< what this rank sends or reduces
  bool done = false;
  std::shared_ptr<Backend> owner;
  virtual ~Pending() = default;
  /// "all_reduce(sum, fp32)"
  std::string operation() const { return detail::describe(what); }
};

}  // namespace fusedopt::comm

namespace fusedopt::comm::detail {

/// Bytes this rank contributes to `c`.
std::size_t bytes_of(const Collective& c, int size);

/// Where a reduce_scatter's or an all_gather's one-block buffer lies against its buffer of
/// `size` blocks (the recv and the send of a reduce_scatter, the send and the recv of an
/// all_gather): apart, exactly at this rank's own block (NCCL's in-place form), or
/// overlapping otherwise.
enum class BlockLayout { Apart, OwnBlock, Overlap };
BlockLayout block_layout(const Collective& c, int rank, int size);

}  // namespace fusedopt::comm::detail
