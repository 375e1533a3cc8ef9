// fusedopt::comm: collectives between the ranks of a job (MPI on host memory, NCCL on CUDA
// device memory) and bucketed gradient all-reduce for data-parallel training. Its own
// library (fusedopt::comm); it uses the core only through its public API.
//
// Every operation is asynchronous and returns a Work whose wait() takes a deadline: a rank
// that stalls makes the others throw CommError naming the operation, never hang. After a
// CommError the communicator is broken (every later call throws) and should be abort()ed.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fusedopt/comm_export.hpp"
#include "fusedopt/dtype.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/optimizer.hpp"

namespace fusedopt::comm {

/// How a collective combines the ranks' values.
enum class ReduceOp { Sum, Max };

/// A collective failed or missed its deadline, or the ranks disagree (a plan mismatch).
/// `what()` reads "rank R: OPERATION (BYTES bytes): CAUSE".
class FUSEDOPT_COMM_API CommError : public Error {
 public:
  CommError(int rank, std::string operation, std::size_t bytes, std::string cause);
  int rank() const { return rank_; }
  const std::string& operation() const { return operation_; }
  std::size_t bytes() const { return bytes_; }
  const std::string& cause() const { return cause_; }

 private:
  int rank_;
  std::string operation_;
  std::size_t bytes_;
  std::string cause_;
};

namespace detail {
class Backend;
struct Pending;
}  // namespace detail

/// An operation in flight. wait() returns when it is complete (its output may be read and
/// its buffers reused) or throws CommError at the deadline. An operation dropped before it
/// completed (after a CommError, or a Work never waited for) is abandoned: the transport
/// may still read and write its buffers until the communicator is destroyed (which waits
/// one more timeout for them, then ends the job), so keep them alive that long, or end the
/// job with abort(true).
class FUSEDOPT_COMM_API Work {
 public:
  Work() = default;
  /// Waits until the communicator's timeout from now.
  void wait();
  /// Waits until `timeout` from now.
  void wait(std::chrono::milliseconds timeout);
  /// Whether it is complete (does not wait); throws CommError if it failed.
  bool test();
  bool valid() const { return pending_ != nullptr; }
  /// (Made by the communicator.)
  explicit Work(std::shared_ptr<detail::Pending> p) : pending_(std::move(p)) {}

 private:
  std::shared_ptr<detail::Pending> pending_;
};

/// One rank's end of a group of processes. Cheap to copy (copies share the connection).
/// Buffers are host memory (MPI) or device memory of the communicator's device (NCCL);
/// counts are elements, sizes in errors and reports are bytes.
class FUSEDOPT_COMM_API Communicator {
 public:
  /// The default deadline of wait(): 5 minutes, or FUSEDOPT_COMM_TIMEOUT (seconds).
  static std::chrono::milliseconds default_timeout();

  /// Every process of the job (MPI_COMM_WORLD). Initialises MPI if nobody has (and then
  /// finalises it at exit). UnavailableError if this build has no MPI.
  static Communicator mpi();
  /// A caller's MPI communicator: `mpi_comm` points to an MPI_Comm, which is duplicated
  /// (fusedopt's traffic never mixes with the caller's).
  static Communicator mpi(const void* mpi_comm);
  /// NCCL on CUDA device `device`: rank 0's unique id is broadcast over `bootstrap` (an
  /// MPI communicator), whose rank and size this one takes. NCCL is loaded at run time
  /// (FUSEDOPT_NCCL_LIBRARY, else libnccl.so.2): UnavailableError saying how to get it.
  static Communicator nccl(int device, const Communicator& bootstrap);
  /// Wraps a caller's ncclComm_t (not destroyed by fusedopt) on CUDA device `device`.
  static Communicator nccl_wrap(void* nccl_comm, int device);
  /// Whether backend "mpi" or "nccl" can be used here; `why` says why not.
  static bool available(const std::string& backend, std::string* why = nullptr);

  int rank() const;
  int size() const;
  /// "mpi" or "nccl".
  std::string backend() const;
  /// Where its buffers live: host for MPI, the CUDA device for NCCL.
  Device device() const;
  std::chrono::milliseconds timeout() const;
  void set_timeout(std::chrono::milliseconds timeout);

  /// In place: every rank's `data` becomes the reduction over ranks.
  Work all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op = ReduceOp::Sum,
                  void* stream = nullptr);
  /// `send` holds size() × `recv_count` elements; rank r receives the reduction of the
  /// r-th block.
  Work reduce_scatter(const void* send, void* recv, std::int64_t recv_count, DType dtype,
                      ReduceOp op = ReduceOp::Sum, void* stream = nullptr);
  /// `recv` (size() × `send_count` elements) receives every rank's `send`, in rank order.
  Work all_gather(const void* send, void* recv, std::int64_t send_count, DType dtype,
                  void* stream = nullptr);
  /// `data` of rank `root` to every rank.
  Work broadcast(void* data, std::int64_t count, DType dtype, int root, void* stream = nullptr);
  Work barrier();
  /// Ends the connection at once, without waiting for the other ranks: operations in flight
  /// are abandoned (NCCL: ncclCommAbort; MPI: the job is ended with MPI_Abort when
  /// `end_job`, as mpirun ends a job whose rank died). Later calls throw CommError.
  void abort(bool end_job = false);
  /// Whether an earlier CommError (or abort) broke it.
  bool broken() const;

  /// Checks that every rank passes the same `fingerprint` (a description of its plan):
  /// otherwise CommError on every rank naming the first difference and the ranks.
  void check_same(const std::string& what, const std::string& fingerprint);

 private:
  explicit Communicator(std::shared_ptr<detail::Backend> backend);
  std::shared_ptr<detail::Backend> backend_;
};

}  // namespace fusedopt::comm
