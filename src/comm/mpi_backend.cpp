// The MPI transport: host memory, non-blocking collectives (MPI_Iallreduce and friends)
// on a duplicate of the caller's communicator, tested by Communicator's deadline loop.
// fp16 and bf16 travel as 2-byte elements reduced by our own MPI_Ops (widened to fp32,
// rounded once). Errors return (MPI_ERRORS_RETURN) and become CommErrors. Between the ranks
// of a node, collectives go through MPI-3 shared memory (shm_engine.hpp) unless turned off.
#include <fmt/format.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "backend.hpp"
#include "support/check.hpp"

#if FUSEDOPT_HAVE_MPI
#include <mpi.h>

#include "mpi_types.hpp"
#include "shm_engine.hpp"
#include "support/half.hpp"
#include "support/log.hpp"
#endif

namespace fusedopt::comm::detail {

#if !FUSEDOPT_HAVE_MPI

namespace {
constexpr const char* kNoMpi =
    "this fusedopt was built without MPI: install OpenMPI (apt-get install libopenmpi-dev "
    "openmpi-bin) and reconfigure with -DFUSEDOPT_MPI=ON";
}

bool mpi_available(std::string* why) {
  if (why) *why = kNoMpi;
  return false;
}
std::shared_ptr<Backend> make_mpi_world(const MpiOptions&) { throw UnavailableError(kNoMpi); }
std::shared_ptr<Backend> make_mpi(const void*, const MpiOptions&) {
  throw UnavailableError(kNoMpi);
}

#else

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return fmt::format("MPI error {}", code);
  return std::string(text, static_cast<std::size_t>(length));
}

namespace {

// ---- 16-bit types and their reductions ---------------------------------------------------

using support::bf16_to_float;
using support::f16_to_float;
using support::float_to_bf16;
using support::float_to_f16;

template <float (*kWiden)(std::uint16_t), std::uint16_t (*kNarrow)(float), bool kMax>
void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = kWiden(a[i]), y = kWiden(b[i]);
    // Max propagates NaN, as a non-finite check needs.
    const float r = kMax ? (x != x || y != y ? x + y : (x > y ? x : y)) : x + y;
    b[i] = kNarrow(r);
  }
}

/// The 2-byte element type and the four ops, made once per process (after MPI_Init).
struct HalfTypes {
  MPI_Datatype half = MPI_DATATYPE_NULL;
  MPI_Op bf16_sum = MPI_OP_NULL, bf16_max = MPI_OP_NULL;
  MPI_Op f16_sum = MPI_OP_NULL, f16_max = MPI_OP_NULL;
};

const HalfTypes& half_types() {
  static HalfTypes t = [] {
    HalfTypes h;
    MPI_Type_contiguous(2, MPI_BYTE, &h.half);
    MPI_Type_commit(&h.half);
    MPI_Op_create(&half_op<bf16_to_float, float_to_bf16, false>, 1, &h.bf16_sum);
    MPI_Op_create(&half_op<bf16_to_float, float_to_bf16, true>, 1, &h.bf16_max);
    MPI_Op_create(&half_op<f16_to_float, float_to_f16, false>, 1, &h.f16_sum);
    MPI_Op_create(&half_op<f16_to_float, float_to_f16, true>, 1, &h.f16_max);
    return h;
  }();
  return t;
}

}  // namespace

MPI_Datatype mpi_type(DType d, bool f64) {
  if (f64 || d == DType::F64) return MPI_DOUBLE;
  if (d == DType::U8) return MPI_UNSIGNED_CHAR;
  return d == DType::F32 ? MPI_FLOAT : half_types().half;
}

MPI_Op mpi_op(DType d, bool f64, ReduceOp op) {
  const bool max = op == ReduceOp::Max;
  if (f64) return max ? MPI_MAX : MPI_SUM;
  switch (d) {
    case DType::F32:
    case DType::F64:
    case DType::U8:
      return max ? MPI_MAX : MPI_SUM;
    case DType::BF16:
      return max ? half_types().bf16_max : half_types().bf16_sum;
    case DType::F16:
      return max ? half_types().f16_max : half_types().f16_sum;
  }
  return MPI_OP_NULL;
}

bool mpi_finalized() {
  int done = 0;
  MPI_Finalized(&done);
  return done != 0;
}

namespace {

bool finalized() { return mpi_finalized(); }

/// A collective in the shared-memory engine (which keeps it until it completes).
struct ShmPending : Pending {
  std::shared_ptr<ShmOp> op;
};

struct MpiPending : Pending {
  MPI_Request request = MPI_REQUEST_NULL;
  /// A reduce_scatter into this rank's own block of its send buffer: MPI writes the block
  /// here (it takes no aliased buffers), copied to `own_block` when the request completes.
  std::vector<unsigned char> scratch;
  void* own_block = nullptr;
  ~MpiPending() override;
};

class MpiBackend final : public Backend {
 public:
  MpiBackend(MPI_Comm parent, const MpiOptions& options) {
    FUSEDOPT_CHECK_AVAILABLE(!finalized(), "MPI was finalised: no communicator can be made");
    const int rc = MPI_Comm_dup(parent, &comm_);
    if (rc != MPI_SUCCESS) throw CommError(-1, "MPI_Comm_dup", 0, mpi_error_text(rc));
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    half_types();
    // Open MPI's non-blocking collectives advance only inside MPI calls (a 438 MB reduce in
    // 8 KB rounds took 13 s with sleeps between polls, 0.6 s without).
    progress_by_polling = true;
    try {
      shm_ = make_shm_engine(comm_, options, &transport_);
    } catch (...) {
      MPI_Comm_free(&comm_);  // the destructor does not run for a constructor that threw
      throw;
    }
    if (rank_ == 0 && support::log_enabled(support::LogLevel::Info))
      support::log(support::LogLevel::Info, "fusedopt comm: " + transport_);
  }

  ~MpiBackend() override {
    if (finalized()) return;
    if (shm_) shm_->close(timeout);
    // Operations abandoned after a failure must end before their communicator goes (MPI
    // forbids freeing a collective's request): give them one more timeout, then end the
    // job rather than hang it.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::lock_guard<std::mutex> lock(orphans_mutex_);
    while (!orphans_.empty()) {
      int flag = 0;
      MPI_Testall(static_cast<int>(orphans_.size()), orphans_.data(), &flag, MPI_STATUSES_IGNORE);
      if (flag) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        std::fprintf(stderr,
                     "fusedopt: rank %d: %zu abandoned collective(s) still in flight at "
                     "shutdown: ending the job (MPI_Abort)\n",
                     rank_, orphans_.size());
        std::fflush(stderr);
        MPI_Abort(comm_, 1);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }
  std::string transport() const override { return shm_ ? "mpi + " + shm_->describe() : transport_; }
  void* allocate_shared(std::size_t bytes) override {
    // Every rank asks for the same size, or none gets one (whatever the transport: a job
    // that errs on one machine errs on all).
    unsigned long long want[2] = {bytes, ~static_cast<unsigned long long>(bytes)};
    unsigned long long got[2] = {0, 0};
    const int rc = MPI_Allreduce(want, got, 2, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm_);
    if (rc != MPI_SUCCESS) throw CommError(rank_, "allocate_shared", bytes, mpi_error_text(rc));
    FUSEDOPT_CHECK_USAGE(got[0] == bytes && ~got[1] == bytes,
                         "allocate_shared: the ranks asked for different sizes (rank {}: {} "
                         "bytes, another: {}): every rank must ask for the same",
                         rank_, bytes, got[0] == bytes ? ~got[1] : got[0]);
    return shm_ ? shm_->allocate(bytes) : Backend::allocate_shared(bytes);
  }
  Device device() const override { return Device::host(); }

  std::shared_ptr<Pending> start(const Collective& c) override {
    FUSEDOPT_CHECK_USAGE(c.count <= INT_MAX,
                         "{}: {} elements in one call; MPI takes at most {} (split the buffer)",
                         describe(c), c.count, INT_MAX);
    FUSEDOPT_CHECK_USAGE(c.stream == nullptr, "{}: an MPI communicator takes no stream",
                         describe(c));
    if (shm_ && shm_->takes(c)) {
      auto shm = std::make_shared<ShmPending>();
      shm->op = shm_->start(c);
      return shm;
    }
    // Communicator allows a reduce_scatter's or an all_gather's in-place form (its own block,
    // as NCCL takes it); MPI's collectives take no aliased buffers, so the all_gather's form
    // is MPI_IN_PLACE (the same layout) and the reduce_scatter's goes through a scratch block.
    const BlockLayout layout =
        (c.kind == Collective::Kind::ReduceScatter || c.kind == Collective::Kind::AllGather) &&
                c.count > 0
            ? block_layout(c, rank_, size_)
            : BlockLayout::Apart;
    const bool own_block = layout == BlockLayout::OwnBlock;
    FUSEDOPT_CHECK_USAGE(layout != BlockLayout::Overlap,
                         "{}: the receive and send buffers overlap other than at this rank's "
                         "own block ({})",
                         describe(c), transport());
    auto p = std::make_shared<MpiPending>();
    const int n = static_cast<int>(c.count);
    const MPI_Datatype type = mpi_type(c.dtype, c.f64);
    const MPI_Op op = mpi_op(c.dtype, c.f64, c.op);
    int rc = MPI_SUCCESS;
    switch (c.kind) {
      case Collective::Kind::AllReduce:
        rc = MPI_Iallreduce(MPI_IN_PLACE, c.recv, n, type, op, comm_, &p->request);
        break;
      case Collective::Kind::Reduce:
        // In place at the root; the others only send.
        rc = MPI_Ireduce(rank_ == c.root ? MPI_IN_PLACE : c.send, c.recv, n, type, op, c.root,
                         comm_, &p->request);
        break;
      case Collective::Kind::ReduceScatter:
        if (own_block) {
          p->scratch.resize(bytes_of(c, size_) / static_cast<std::size_t>(size_));
          p->own_block = c.recv;
        }
        rc = MPI_Ireduce_scatter_block(c.send, own_block ? p->scratch.data() : c.recv, n, type, op,
                                       comm_, &p->request);
        break;
      case Collective::Kind::AllGather:
        rc = own_block ? MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, c.recv, n, type, comm_,
                                        &p->request)
                       : MPI_Iallgather(c.send, n, type, c.recv, n, type, comm_, &p->request);
        break;
      case Collective::Kind::Broadcast:
        rc = MPI_Ibcast(c.recv, n, type, c.root, comm_, &p->request);
        break;
      case Collective::Kind::Barrier:
        rc = MPI_Ibarrier(comm_, &p->request);
        break;
    }
    if (rc != MPI_SUCCESS) {
      broken = true;
      broken_by = describe(c) + ": " + mpi_error_text(rc);
      throw CommError(rank_, describe(c), bytes_of(c, size_), mpi_error_text(rc));
    }
    p->owner = shared_from_this();
    return p;
  }

  bool test(Pending& pending) override {
    // Every wait advances the shared-memory operations too: a rank waiting on one
    // operation must not hold back the others' operations queued before it.
    if (shm_) shm_->progress();
    if (auto* shm = dynamic_cast<ShmPending*>(&pending)) return shm->op->finished;
    auto& p = static_cast<MpiPending&>(pending);
    if (p.request == MPI_REQUEST_NULL) return true;
    int flag = 0;
    MPI_Status status;
    const int rc = MPI_Test(&p.request, &flag, &status);
    if (rc != MPI_SUCCESS) throw CommError(rank_, p.operation(), p.bytes, mpi_error_text(rc));
    if (flag != 0 && p.own_block != nullptr) {
      std::memcpy(p.own_block, p.scratch.data(), p.scratch.size());
      p.own_block = nullptr;
    }
    return flag != 0;
  }

  void abort(bool end_job) override {
    if (end_job && !finalized()) MPI_Abort(comm_, 1);
  }

  /// An operation dropped before it completed: kept until the communicator goes, with the
  /// scratch MPI may still write.
  void orphan(MPI_Request r, std::vector<unsigned char> scratch) {
    std::lock_guard<std::mutex> lock(orphans_mutex_);
    orphans_.push_back(r);
    if (!scratch.empty()) orphan_scratch_.push_back(std::move(scratch));
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::mutex orphans_mutex_;
  std::vector<MPI_Request> orphans_;
  std::vector<std::vector<unsigned char> > orphan_scratch_;
  std::unique_ptr<ShmEngine> shm_;
  std::string transport_;
};

MpiPending::~MpiPending() {
  if (request == MPI_REQUEST_NULL || !owner || finalized()) return;
  int flag = 0;
  MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
  if (!flag) static_cast<MpiBackend&>(*owner).orphan(request, std::move(scratch));
}

/// MPI_Init_thread when nobody initialised MPI; then MPI_Finalize at exit.
void ensure_initialized() {
  static std::once_flag once;
  std::call_once(once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;
    FUSEDOPT_CHECK_AVAILABLE(!finalized(), "MPI was finalised: it cannot be initialised again");
    int provided = 0;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) {
      throw UnavailableError("MPI_Init_thread failed: " + mpi_error_text(rc) +
                             " (run the program under mpirun)");
    }
    std::atexit([] {
      if (!finalized()) MPI_Finalize();
    });
  });
}

}  // namespace

bool mpi_available(std::string* why) {
  (void)why;
  return true;
}

std::shared_ptr<Backend> make_mpi_world(const MpiOptions& options) {
  ensure_initialized();
  return std::make_shared<MpiBackend>(MPI_COMM_WORLD, options);
}

std::shared_ptr<Backend> make_mpi(const void* mpi_comm, const MpiOptions& options) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  FUSEDOPT_CHECK_USAGE(initialized != 0,
                       "Communicator::mpi(comm): MPI is not initialised; call MPI_Init first "
                       "or use Communicator::mpi()");
  return std::make_shared<MpiBackend>(*static_cast<const MPI_Comm*>(mpi_comm), options);
}

#endif

}  // namespace fusedopt::comm::detail
