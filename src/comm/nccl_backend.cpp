// The NCCL transport: CUDA device memory, collectives launched on the caller's stream and
// tracked by a CudaEvent recorded after each launch, so that Communicator's deadline loop
// polls them without blocking. NCCL is loaded at run time (nccl_api.hpp) and never linked:
// fusedopt builds and runs where NCCL or a GPU is absent. Through the core's public API only
// (CudaEvent, CudaBuffer, CudaDeviceScope, cuda_device_available).
#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "fusedopt/cuda.hpp"
#include "nccl_api.hpp"
#include "support/check.hpp"

namespace fusedopt::comm::detail {

#if !FUSEDOPT_HAVE_NCCL

namespace {
constexpr const char* kNoNccl =
    "this fusedopt was built without NCCL: install NCCL's header (nccl.h, from the CUDA "
    "toolkit or apt-get install libnccl-dev) and reconfigure with -DFUSEDOPT_NCCL=ON (NCCL "
    "also needs -DFUSEDOPT_CUDA=ON)";
}

bool nccl_available(std::string* why) {
  if (why) *why = kNoNccl;
  return false;
}
std::shared_ptr<Backend> make_nccl(int, Backend&) { throw UnavailableError(kNoNccl); }
std::shared_ptr<Backend> wrap_nccl(void*, int) { throw UnavailableError(kNoNccl); }

#else

namespace {

/// "0.25 s" for an error message.
std::string seconds_text(std::chrono::milliseconds t) {
  return fmt::format("{:g} s", static_cast<double>(t.count()) / 1000.0);
}

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::F32:
      return ncclFloat32;
    case DType::F16:
      return ncclFloat16;
    case DType::BF16:
      return ncclBfloat16;
    case DType::F64:
      return ncclFloat64;
    case DType::U8:
      return ncclUint8;
  }
  return ncclFloat32;
}

/// NCCL's max follows the device's fmax for floats: unlike the MPI transport, it is not
/// promised to propagate NaN (a sum does).
ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Max ? ncclMax : ncclSum; }

/// UnavailableError, saying why, unless `device` is a CUDA device here.
void require_device(int device) {
  std::string why;
  FUSEDOPT_CHECK_AVAILABLE(cuda_device_available(&why),
                           "an NCCL communicator needs a CUDA device and there is none: {}", why);
  FUSEDOPT_CHECK_USAGE(device >= 0, "CUDA device {} is negative", device);
}

class NcclBackend;

struct NcclPending : Pending {
  std::unique_ptr<CudaEvent> event;  ///< recorded after the launch
  ~NcclPending() override;
};

class NcclBackend final : public Backend {
 public:
  /// `comm` (rank `rank` of `size`) on `device`, all checked; destroyed at the end when
  /// `owned`. `bootstrap`: the MPI communicator that made it (the control channel), null
  /// for a wrapped one.
  NcclBackend(const NcclApi& api, ncclComm_t comm, int rank, int size, int device, bool owned,
              std::shared_ptr<Backend> bootstrap)
      : api_(api),
        comm_(comm),
        rank_(rank),
        size_(size),
        device_(device),
        owned_(owned),
        bootstrap_(std::move(bootstrap)) {
    if (bootstrap_) timeout = bootstrap_->timeout;
  }

  ~NcclBackend() override {
    // An owned communicator is destroyed (ncclCommDestroy waits for its operations), once
    // operations dropped before they completed have had one more timeout; it is aborted
    // instead when one is still in flight then, or when it is broken (ncclCommDestroy could
    // wait forever): ncclCommAbort stops NCCL's kernels, so nothing touches the abandoned
    // buffers afterwards. A wrapped one is left to its owner; when it is broken its kernels
    // may never end, and freeing device memory would wait for them (the core synchronises
    // the device first), so the barrier's float is left allocated instead.
    if (comm_ && !owned_ && broken && barrier_) (void)barrier_.release();
    if (!comm_ || !owned_) return;
    if (broken || !wait_for_orphans()) {
      abort_comm();
      return;
    }
    try {
      CudaDeviceScope scope(device_);
      api_.CommDestroy(comm_);
    } catch (...) {
      api_.CommDestroy(comm_);  // NCCL makes its device current itself
    }
    comm_ = nullptr;
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }
  Device device() const override { return Device::cuda(device_); }
  std::shared_ptr<Backend> control() override { return bootstrap_; }

  std::shared_ptr<Pending> start(const Collective& c) override {
    if (!comm_) {
      throw CommError(rank_, describe(c), bytes_of(c, size_), "the NCCL communicator was aborted");
    }
    auto p = std::make_shared<NcclPending>();
    p->event = take_event();
    const auto n = static_cast<std::size_t>(c.count);
    const auto stream = static_cast<cudaStream_t>(c.stream);
    const ncclDataType_t type = c.f64 ? ncclFloat64 : nccl_type(c.dtype);
    ncclResult_t r = ncclSuccess;
    {
      // NCCL launches on its communicator's device; the scope also makes a null stream
      // that device's legacy default stream, the one the event is recorded on.
      CudaDeviceScope scope(device_);
      switch (c.kind) {
        case Collective::Kind::AllReduce:
          r = api_.AllReduce(c.send, c.recv, n, type, nccl_op(c.op), comm_, stream);
          break;
        case Collective::Kind::Reduce:
          r = api_.Reduce(c.send, c.recv, n, type, nccl_op(c.op), c.root, comm_, stream);
          break;
        case Collective::Kind::ReduceScatter:
          r = api_.ReduceScatter(c.send, c.recv, n, type, nccl_op(c.op), comm_, stream);
          break;
        case Collective::Kind::AllGather:
          r = api_.AllGather(c.send, c.recv, n, type, comm_, stream);
          break;
        case Collective::Kind::Broadcast:
          r = api_.Broadcast(c.send, c.recv, n, type, c.root, comm_, stream);
          break;
        case Collective::Kind::Barrier:
          // One float summed over the ranks, in memory of ours (made at the first barrier),
          // on the default stream.
          if (!barrier_) barrier_ = std::make_unique<CudaBuffer>(sizeof(float), device_);
          r = api_.AllReduce(barrier_->data(), barrier_->data(), 1, ncclFloat32, ncclSum, comm_,
                             stream);
          break;
      }
    }
    // A non-blocking communicator may still be enqueueing (ncclInProgress, for example
    // while it connects to a peer the first time): the launch is on the stream only once
    // that is done, so the event is recorded after it, within the deadline.
    if (r == ncclInProgress) {
      r = nccl_settle(api_, comm_, r, std::chrono::steady_clock::now() + timeout);
      if (r == ncclInProgress) {
        abort_comm();
        fail_start(c, fmt::format("NCCL did not finish enqueueing it within the deadline of {}; "
                                  "the communicator was aborted (ncclCommAbort)",
                                  seconds_text(timeout)));
      }
    }
    if (r != ncclSuccess) fail_start(c, nccl_error_text(api_, r, comm_));
    try {
      p->event->record(c.stream);
    } catch (const Error& e) {
      fail_start(c, fmt::format("launched, but its completion cannot be tracked: {}", e.what()));
    }
    p->owner = shared_from_this();
    return p;
  }

  bool test(Pending& pending) override {
    auto& p = static_cast<NcclPending&>(pending);
    check_async_error(p);
    try {
      return p.event->query();
    } catch (const Error& e) {
      throw CommError(rank_, p.operation(), p.bytes,
                      fmt::format("the device reported an error: {}", e.what()));
    }
  }

  void abort(bool end_job) override {
    // Wrapped communicators are aborted too, as PyTorch's watchdog does: NCCL offers no
    // other way to stop operations in flight. Their handle is then freed (see nccl_wrap).
    abort_comm();
    // The job ends as the MPI transport ends it, through the bootstrap (a wrapped
    // communicator has none: its launcher ends the job).
    if (end_job && bootstrap_) bootstrap_->abort(true);
  }

  /// An event back for reuse, or, still in flight, kept until the communicator goes.
  void give_back(std::unique_ptr<CudaEvent> event, bool complete) {
    std::lock_guard<std::mutex> lock(events_mutex_);
    (complete ? free_events_ : orphans_).push_back(std::move(event));
  }

 private:
  [[noreturn]] void fail_start(const Collective& c, const std::string& cause) {
    broken = true;
    broken_by = describe(c) + ": " + cause;
    throw CommError(rank_, describe(c), bytes_of(c, size_), cause);
  }

  /// A communicator that failed in the background (a peer died, a network error) is
  /// aborted, so no later call waits on it; CommError naming NCCL's error.
  void check_async_error(const Pending& p) {
    if (!comm_) throw CommError(rank_, p.operation(), p.bytes, "the NCCL communicator was aborted");
    ncclResult_t async = ncclSuccess;
    const ncclResult_t r = api_.CommGetAsyncError(comm_, &async);
    if (r != ncclSuccess) {
      const std::string cause =
          fmt::format("ncclCommGetAsyncError failed: {}", nccl_error_text(api_, r, comm_));
      abort_comm();
      throw CommError(rank_, p.operation(), p.bytes, cause + "; the communicator was aborted");
    }
    if (async == ncclSuccess || async == ncclInProgress) return;
    const std::string cause =
        fmt::format("NCCL reported an asynchronous error, {}", nccl_error_text(api_, async, comm_));
    abort_comm();
    throw CommError(rank_, p.operation(), p.bytes,
                    cause + "; the communicator was aborted (ncclCommAbort)");
  }

  /// ncclCommAbort once; the communicator is unusable afterwards.
  void abort_comm() noexcept {
    if (!comm_) return;
    try {
      CudaDeviceScope scope(device_);
      api_.CommAbort(comm_);
    } catch (...) {
      api_.CommAbort(comm_);  // NCCL makes its device current itself
    }
    comm_ = nullptr;
    broken = true;
    if (broken_by.empty()) broken_by = "the NCCL communicator was aborted";
  }

  /// An event from the pool, or a new one on the communicator's device.
  std::unique_ptr<CudaEvent> take_event() {
    {
      std::lock_guard<std::mutex> lock(events_mutex_);
      if (!free_events_.empty()) {
        std::unique_ptr<CudaEvent> e = std::move(free_events_.back());
        free_events_.pop_back();
        return e;
      }
    }
    return std::make_unique<CudaEvent>(device_);
  }

  /// Whether every abandoned operation completed within one more timeout.
  bool wait_for_orphans() noexcept {
    std::lock_guard<std::mutex> lock(events_mutex_);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!orphans_.empty()) {
      try {
        if (comm_) {
          ncclResult_t async = ncclSuccess;
          if (api_.CommGetAsyncError(comm_, &async) != ncclSuccess ||
              (async != ncclSuccess && async != ncclInProgress))
            return false;
        }
        if (orphans_.back()->query()) {
          orphans_.pop_back();
          continue;
        }
      } catch (...) {
        return false;
      }
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }

  const NcclApi& api_;
  ncclComm_t comm_;  ///< null once aborted or destroyed
  int rank_;
  int size_;
  int device_;
  bool owned_;
  std::shared_ptr<Backend> bootstrap_;
  std::unique_ptr<CudaBuffer> barrier_;  ///< the barrier's float
  std::mutex events_mutex_;
  std::vector<std::unique_ptr<CudaEvent> > free_events_;
  std::vector<std::unique_ptr<CudaEvent> > orphans_;  ///< of operations dropped in flight
};

NcclPending::~NcclPending() {
  if (!event || !owner) return;
  bool complete = done;
  if (!complete) {
    try {
      complete = event->query();
    } catch (...) {
      complete = false;  // kept with the orphans; the communicator decides at its end
    }
  }
  static_cast<NcclBackend&>(*owner).give_back(std::move(event), complete);
}

/// The Backend over `comm`, with its rank and size from NCCL. An owned `comm` is aborted
/// when this fails, so it never leaks.
std::shared_ptr<Backend> make_nccl_backend(const NcclApi& api, ncclComm_t comm, int device,
                                           bool owned, std::shared_ptr<Backend> bootstrap) {
  auto give_up = [&]() noexcept {
    if (!owned) return;
    try {
      CudaDeviceScope scope(device);
      api.CommAbort(comm);
    } catch (...) {
      api.CommAbort(comm);  // NCCL makes its device current itself
    }
  };
  int size = 0, rank = 0;
  ncclResult_t r = api.CommCount(comm, &size);
  if (r == ncclSuccess) r = api.CommUserRank(comm, &rank);
  if (r != ncclSuccess) {
    const std::string cause = nccl_error_text(api, r, comm);
    give_up();
    throw CommError(-1, "ncclCommCount/ncclCommUserRank", 0, cause);
  }
  try {
    return std::make_shared<NcclBackend>(api, comm, rank, size, device, owned,
                                         std::move(bootstrap));
  } catch (...) {
    give_up();
    throw;
  }
}

/// Rank 0's unique id, on every rank: it goes over the bootstrap, each byte as one fp32
/// value (exact), with a last value saying whether rank 0 could make one: a failure there is
/// an error on every rank, not a wait for an id that never comes.
ncclUniqueId share_unique_id(const NcclApi& api, const std::shared_ptr<Backend>& boot) {
  const int rank = boot->rank();
  constexpr std::size_t kIdBytes = sizeof(ncclUniqueId);
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  std::string rank0_failure;
  if (rank == 0) {
    const ncclResult_t r = api.GetUniqueId(&id);
    if (r != ncclSuccess) rank0_failure = nccl_error_text(api, r, nullptr);
  }
  std::vector<float> values(kIdBytes + 1, 0.0f);
  const auto* id_bytes = reinterpret_cast<const unsigned char*>(&id);
  for (std::size_t i = 0; i < kIdBytes; ++i) values[i] = static_cast<float>(id_bytes[i]);
  values[kIdBytes] = rank0_failure.empty() ? 0.0f : 1.0f;
  const Collective c =
      collective(Collective::Kind::Broadcast, values.data(), values.data(),
                 static_cast<std::int64_t>(values.size()), DType::F32, ReduceOp::Sum, 0, nullptr);
  try {
    start(boot, c).wait();
  } catch (const CommError& e) {
    throw CommError(rank, "Communicator::nccl: broadcast of NCCL's unique id over the bootstrap",
                    values.size() * sizeof(float), e.cause());
  }
  if (values[kIdBytes] != 0.0f) {
    throw CommError(rank, "ncclGetUniqueId", 0,
                    rank == 0 ? rank0_failure
                              : std::string("rank 0 could not make NCCL's unique id (its "
                                            "error names the cause)"));
  }
  auto* out_bytes = reinterpret_cast<unsigned char*>(&id);
  for (std::size_t i = 0; i < kIdBytes; ++i) out_bytes[i] = static_cast<unsigned char>(values[i]);
  return id;
}

/// This rank's communicator over `id`, on the current device (`device`). Every rank has
/// passed the id's broadcast, so all of them are joining. From NCCL 2.14 the communicator is
/// non-blocking: the join is polled against the bootstrap's deadline, and a rank that never
/// joins (or a network that never connects) is a CommError with the communicator aborted,
/// not a hang. Older NCCL blocks in ncclCommInitRank.
ncclComm_t join(const NcclApi& api, const Backend& boot, const ncclUniqueId& id, int device) {
  const int rank = boot.rank();
  const std::string what = fmt::format("ncclCommInitRank({} ranks, cuda:{})", boot.size(), device);
  ncclComm_t comm = nullptr;
  if (api.CommInitRankConfig && api.version >= kNcclNonBlockingVersion) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const auto deadline = std::chrono::steady_clock::now() + boot.timeout;
    ncclResult_t r = api.CommInitRankConfig(&comm, boot.size(), id, rank, &config);
    if (comm != nullptr) r = nccl_settle(api, comm, r, deadline);
    if (r != ncclSuccess) {
      const std::string cause =
          r == ncclInProgress
              ? fmt::format(
                    "not every rank joined within the deadline of {} (a rank that "
                    "did not call Communicator::nccl, or a network NCCL cannot use: "
                    "NCCL_DEBUG=INFO says which); the communicator was aborted",
                    seconds_text(boot.timeout))
              : nccl_error_text(api, r, comm);
      if (comm != nullptr) api.CommAbort(comm);
      throw CommError(rank, what, 0, cause);
    }
  } else {
    const ncclResult_t r = api.CommInitRank(&comm, boot.size(), id, rank);
    if (r != ncclSuccess) throw CommError(rank, what, 0, nccl_error_text(api, r, nullptr));
  }
  return comm;
}

}  // namespace

bool nccl_available(std::string* why) {
  // Never throws: every reason becomes a sentence of `why`.
  std::string reasons;
  try {
    std::string no_device;
    if (!cuda_device_available(&no_device)) reasons = "there is no CUDA device: " + no_device;
    try {
      (void)load_nccl();
    } catch (const Error& e) {
      reasons += (reasons.empty() ? "" : "; and ") + std::string(e.what());
    }
  } catch (const std::exception& e) {
    reasons += (reasons.empty() ? "" : "; and ") + std::string(e.what());
  }
  if (reasons.empty()) return true;
  if (why) *why = reasons;
  return false;
}

std::shared_ptr<Backend> make_nccl(int device, Backend& bootstrap) {
  FUSEDOPT_CHECK_USAGE(bootstrap.device().kind == Device::Kind::Host,
                       "Communicator::nccl: the bootstrap must be a host-memory (MPI) "
                       "communicator, not an '{}' one",
                       bootstrap.name());
  const NcclApi& api = load_nccl();
  require_device(device);
  const std::shared_ptr<Backend> boot = bootstrap.shared_from_this();
  // NCCL makes its id and joins on the current device: `device`'s primary context, current
  // until the end (which also checks that the device exists, on every rank, before the
  // broadcast).
  CudaDeviceScope scope(device);
  const ncclUniqueId id = share_unique_id(api, boot);
  ncclComm_t comm = join(api, *boot, id, device);
  return make_nccl_backend(api, comm, device, /*owned=*/true, boot);
}

std::shared_ptr<Backend> wrap_nccl(void* nccl_comm, int device) {
  FUSEDOPT_CHECK_USAGE(nccl_comm != nullptr, "Communicator::nccl_wrap: null ncclComm_t");
  const NcclApi& api = load_nccl();
  require_device(device);
  auto comm = static_cast<ncclComm_t>(nccl_comm);
  int comm_device = -1;
  const ncclResult_t r = api.CommCuDevice(comm, &comm_device);
  if (r != ncclSuccess) throw CommError(-1, "ncclCommCuDevice", 0, nccl_error_text(api, r, comm));
  FUSEDOPT_CHECK_USAGE(comm_device == device,
                       "Communicator::nccl_wrap: the ncclComm_t is on cuda:{}, not cuda:{}",
                       comm_device, device);
  return make_nccl_backend(api, comm, device, /*owned=*/false, nullptr);
}

#endif

}  // namespace fusedopt::comm::detail
