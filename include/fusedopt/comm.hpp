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

class Backend;   // a transport (MPI, NCCL): Communicator's, opaque
struct Pending;  // an operation in flight: Work's, opaque

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
  /// Waits until `timeout` from now (above 0, at most Communicator::kMaxTimeout).
  void wait(std::chrono::milliseconds timeout);
  /// Whether it is complete (does not wait); throws CommError if it failed.
  bool test();
  bool valid() const { return pending_ != nullptr; }
  /// (Made by the communicator.)
  explicit Work(std::shared_ptr<Pending> p) : pending_(std::move(p)) {}

 private:
  std::shared_ptr<Pending> pending_;
};

/// How Communicator::mpi moves data between the ranks of one node. Rank 0's settings (these,
/// or the environment variables named) apply to every rank.
struct MpiOptions {
  /// Collectives between the ranks of a node through MPI-3 shared memory (persistent
  /// segments, a fixed summation order in rank order); across nodes, hierarchically (a
  /// node-local reduce, an all-reduce among one leader per node over MPI, a node-local
  /// broadcast). FUSEDOPT_COMM_SHM=0 turns it off for every communicator (=1 leaves it on).
  bool shared_memory = true;
  /// Pretend nodes of this many consecutive ranks (each within one real node) instead of
  /// the nodes MPI finds: the hierarchical path on one machine. 0: FUSEDOPT_COMM_RANKS_PER_NODE,
  /// else the real nodes.
  int ranks_per_node = 0;
  /// KiB of one staging slot (a chunk in flight) per rank; 0: FUSEDOPT_COMM_SHM_SLOT_KIB,
  /// else 128 (the fastest of 16 to 4096 on the 2-core test machine: a chunk stays in the
  /// cache between its stages). Between 16 and 1048576.
  int slot_kib = 0;
};

/// One rank's end of a group of processes. Cheap to copy (copies share the connection).
/// Buffers are host memory (MPI) or device memory of the communicator's device (NCCL);
/// counts are elements, sizes in errors and reports are bytes. `stream` (NCCL only; MPI
/// takes none) is a CUstream of the communicator's device, nullptr its legacy default
/// stream: the operation is queued on it, and its Work is complete when the device has
/// done it. NCCL's max is not promised to propagate NaN (its sum does).
class FUSEDOPT_COMM_API Communicator {
 public:
  /// The longest timeout anything takes (7 days): a deadline past it would overflow the
  /// clock. Longer ones (FUSEDOPT_COMM_TIMEOUT, set_timeout, Work::wait) are UsageError.
  static constexpr std::chrono::milliseconds kMaxTimeout{7LL * 24 * 3600 * 1000};
  /// The default deadline of wait(): 5 minutes, or FUSEDOPT_COMM_TIMEOUT (seconds, finite,
  /// above 0, at most kMaxTimeout). Throws UsageError for another value.
  static std::chrono::milliseconds default_timeout();

  /// Every process of the job (MPI_COMM_WORLD). Initialises MPI if nobody has (and then
  /// finalises it at exit). UnavailableError if this build has no MPI.
  static Communicator mpi();
  /// The same with `options` (shared memory between a node's ranks, pretend nodes).
  static Communicator mpi(const MpiOptions& options);
  /// A caller's MPI communicator: `mpi_comm` points to an MPI_Comm, which is duplicated
  /// (fusedopt's traffic never mixes with the caller's).
  static Communicator mpi(const void* mpi_comm, const MpiOptions& options = {});
  /// NCCL on CUDA device `device`: rank 0's unique id is broadcast over `bootstrap` (an
  /// MPI communicator, within its deadline), whose rank, size and timeout this one takes;
  /// then every rank joins (ncclCommInitRank: it blocks until all have, under NCCL's own
  /// timeouts). check_same travels over the bootstrap. NCCL is loaded at run time
  /// (FUSEDOPT_NCCL_LIBRARY, else libnccl.so.2; read again at each attempt until one
  /// loads): UnavailableError saying how to get it, or that there is no CUDA device.
  static Communicator nccl(int device, const Communicator& bootstrap);
  /// Wraps a caller's ncclComm_t on CUDA device `device` (UsageError when it is on another).
  /// fusedopt never destroys it, but abort(), or an asynchronous NCCL error found while
  /// waiting, aborts it (ncclCommAbort, as PyTorch's watchdog does), which frees it: the
  /// caller must then neither use nor destroy it. It has no host channel (no check_same).
  static Communicator nccl_wrap(void* nccl_comm, int device);
  /// Whether backend "mpi" or "nccl" can be used here; `why` says why not.
  static bool available(const std::string& backend, std::string* why = nullptr);

  int rank() const;
  int size() const;
  /// "mpi" or "nccl".
  std::string backend() const;
  /// How it moves data: "nccl", "mpi (shared memory off: FUSEDOPT_COMM_SHM=0)", "mpi +
  /// shared memory: 1 node x 2 ranks; ..." and the like.
  std::string transport() const;
  /// Where its buffers live: host for MPI, the CUDA device for NCCL.
  Device device() const;
  std::chrono::milliseconds timeout() const;
  void set_timeout(std::chrono::milliseconds timeout);

  /// In place: every rank's `data` becomes the reduction over ranks.
  Work all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op = ReduceOp::Sum,
                  void* stream = nullptr);
  /// float64 values (host memory for MPI, device memory for NCCL), in place: reduction
  /// totals and counters that must combine exactly (a sharded optimizer's norms).
  Work all_reduce(double* data, std::int64_t count, ReduceOp op = ReduceOp::Sum,
                  void* stream = nullptr);
  /// In place: rank `root`'s `data` becomes the reduction over ranks; the others' `data`
  /// is only read (ZeRO-2: each bucket reduced to the rank that owns it).
  Work reduce(void* data, std::int64_t count, DType dtype, int root, ReduceOp op = ReduceOp::Sum,
              void* stream = nullptr);
  /// `send` holds size() × `recv_count` elements; rank r receives the reduction of the
  /// r-th block. `recv` lies apart from `send` or is this rank's block of it (`send` + rank ×
  /// `recv_count`, NCCL's in-place form; plain MPI writes that block from a scratch block when
  /// the call completes); any other overlap is a UsageError.
  Work reduce_scatter(const void* send, void* recv, std::int64_t recv_count, DType dtype,
                      ReduceOp op = ReduceOp::Sum, void* stream = nullptr);
  /// `recv` (size() × `send_count` elements) receives every rank's `send`, in rank order.
  /// `send` lies apart from `recv` or is this rank's block of it (`recv` + rank ×
  /// `send_count`, NCCL's in-place form; MPI_IN_PLACE over plain MPI); any other overlap is a
  /// UsageError.
  Work all_gather(const void* send, void* recv, std::int64_t send_count, DType dtype,
                  void* stream = nullptr);
  /// `data` of rank `root` to every rank.
  Work broadcast(void* data, std::int64_t count, DType dtype, int root, void* stream = nullptr);
  Work barrier();
  /// `bytes` of host memory (64-byte aligned, zeroed) that every rank of this node maps,
  /// for gradients and params (FlatArena::finalize, see docs/comm.md): an all_reduce, a
  /// reduce or a broadcast over a range of it, at the same offset on every rank, runs in place
  /// on the shared-memory path, reading the others' buffers and writing the results into them,
  /// with no copy in or out; so does a reduce_scatter or an all_gather whose send buffer lies
  /// in it (at any offset). Collective: every rank calls it, in the same order, with the same
  /// bytes (UsageError on every rank otherwise), best while none of this communicator's
  /// collectives is in flight (a rank blocked in it does not advance them). Valid until the last
  /// copy of this communicator goes. Ordinary host memory where there is no shared memory (plain
  /// MPI, one rank, one rank per node, NCCL); there, and across several nodes (hierarchical), the
  /// calls run as before.
  void* allocate_shared(std::size_t bytes);
  /// Ends the connection at once, without waiting for the other ranks: operations in flight
  /// are abandoned (NCCL: ncclCommAbort; MPI: the job is ended with MPI_Abort when
  /// `end_job`, as mpirun ends a job whose rank died; NCCL with `end_job`: its bootstrap's
  /// MPI_Abort, none for a wrapped one). Later calls throw CommError.
  void abort(bool end_job = false);
  /// Whether an earlier CommError (or abort) broke it.
  bool broken() const;

  /// Checks that every rank passes the same `fingerprint` (a description of its plan):
  /// otherwise CommError on every rank naming the first difference and the ranks.
  void check_same(const std::string& what, const std::string& fingerprint);

 private:
  explicit Communicator(std::shared_ptr<Backend> backend);
  std::shared_ptr<Backend> backend_;
};

/// How GradBucketer cuts gradients into buckets. Sizes are bytes.
struct BucketOptions {
  std::size_t bucket_bytes = std::size_t{25} << 20;       ///< cap of a bucket (DDP's 25 MiB)
  std::size_t first_bucket_bytes = std::size_t{1} << 20;  ///< cap of each dtype's first
                                                          ///< bucket: reduction starts early
  int max_tensors = 0;  ///< cap on gradients per bucket (Paddle's knob); 0: none
};

/// One collective: a contiguous range of one flat gradient buffer (a view, no copy).
struct Bucket {
  DType dtype = DType::F32;
  Device device;
  int root = -1;  ///< -1: all-reduced; else reduced to this rank only (a ShardedOptimizer's
                  ///< ZeRO-2 buckets, each within one rank's shard)
  std::vector<int> grads;  ///< gradient indices, in the order they join (last first)
  void* data = nullptr;    ///< start of the range (the lowest address of its gradients)
  std::int64_t count = 0;  ///< elements in the range (padding between gradients included)
  std::size_t bytes = 0;   ///< of its gradients alone
};

/// What a GradBucketer does per step and has done so far.
struct BucketStats {
  int gradients = 0;               ///< gradients it reduces (empty ones included)
  int buckets = 0;                 ///< all-reduces per step
  std::size_t bytes_per_step = 0;  ///< bytes of gradients all-reduced per step
  std::size_t largest_bucket = 0;  ///< bytes of the largest bucket's gradients
  std::int64_t steps = 0;          ///< finish() calls that completed
  std::int64_t collectives = 0;    ///< all-reduces started so far
  double wait_seconds = 0;         ///< time finish() waited, all steps: the communication
                                   ///< backward did not hide
  double last_wait_seconds = 0;    ///< the same, in the last step
  /// Minor page faults of the calling thread from a step's first mark_ready to the end of
  /// its finish() (the transport's work, and whatever that thread did in between: backward's
  /// own faults count too), per step after the first (which touches the transport's buffers
  /// for the first time); 0 before a second step. Two getrusage calls per step.
  double page_faults_per_step = 0;
  std::string transport;  ///< the communicator's transport()
  std::string report;     ///< report()
};

/// Bucketed gradient all-reduce for data-parallel training (PyTorch DDP's reducer): the
/// gradients of a parameter list live in one flat buffer per dtype (FlatArena's, or any
/// buffer holding them in parameter order, padding allowed); buckets are views of it,
/// built in reverse parameter order (the last layers' gradients are ready first) so that
/// each bucket is one contiguous range. A bucket holds one dtype and one device, at most
/// `bucket_bytes` (each dtype's first one at most `first_bucket_bytes`) and `max_tensors`
/// gradients, unless one gradient alone is bigger. Empty gradients belong to no bucket.
///
/// Each step: mark_ready(i) as gradient i is complete; a bucket's all-reduce starts when
/// its last gradient is ready and every bucket before it has started (so every rank starts
/// the same collectives in the same order, whatever order its gradients arrive in); then
/// finish() waits for them all (with the communicator's deadline) and the buffers hold the
/// SUM over ranks: step the optimizer with grad_scale() (1 / ranks) as its inverse gradient
/// scale, e.g. opt.step_scaled(bucketer.grad_scale()), so the average costs no extra pass.
///
/// At construction every rank checks that the others have the same gradients and buckets
/// (a CommError on every rank naming the first difference otherwise).
class FUSEDOPT_COMM_API GradBucketer {
 public:
  GradBucketer(Communicator comm, std::vector<Tensor> grads, BucketOptions options = {});
  /// Reduce-to-owner (ZeRO-2): gradient i is reduced to rank roots[i] instead of all-reduced
  /// (a bucket holds one root; equal roots form a contiguous run of gradients).
  GradBucketer(Communicator comm, std::vector<Tensor> grads, BucketOptions options,
               std::vector<int> roots);
  ~GradBucketer();
  GradBucketer(GradBucketer&&) noexcept;
  GradBucketer& operator=(GradBucketer&&) noexcept;

  /// The buckets of `grads` (no communication): what the constructor builds. Throws
  /// UsageError naming the gradient when the gradients of a dtype are not in one buffer in
  /// parameter order (more than 256 bytes apart, overlapping, or out of order).
  static std::vector<Bucket> layout(const std::vector<Tensor>& grads, const BucketOptions& options);

  const std::vector<Bucket>& buckets() const;
  /// The bucket of gradient `grad`, -1 for an empty one.
  int bucket_of(int grad) const;
  /// Gradient `grad` is complete for this step (on `stream`, for NCCL: the all-reduce is
  /// queued after the work there). Starts every bucket that can start and advances those
  /// in flight (on shared memory and MPI a reduction progresses only while its ranks call
  /// in: backward's mark_ready calls move the buckets along, so that finish() waits only
  /// for what is left).
  void mark_ready(int grad, void* stream = nullptr);
  /// Every gradient not marked yet is complete (a step whose backward marks nothing).
  void mark_all_ready(void* stream = nullptr);
  /// Waits for every bucket's all-reduce and readies the next step. UsageError naming the
  /// first gradient not marked ready; CommError when a rank stalls past the deadline.
  void finish();
  /// 1 / ranks: the inverse gradient scale that turns the sums into the average.
  float grad_scale() const;
  /// "201 gradients -> 9 all-reduces (25 MiB buckets, first 1 MiB)".
  std::string report() const;
  /// Collectives started so far (all steps).
  std::int64_t collectives() const;
  BucketStats stats() const;

 private:
  struct Impl;
  /// The Impl, or UsageError("GradBucketer::<method>: this GradBucketer was moved from").
  Impl& live(const char* method) const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fusedopt::comm
