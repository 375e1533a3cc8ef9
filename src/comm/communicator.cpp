// Communicator and Work: argument checks, deadlines and errors around a transport
// (comm/backend.hpp). Waiting polls the transport, yielding the core between polls, so that
// ranks oversubscribed on few cores still progress.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "backend.hpp"
#include "fusedopt/comm.hpp"
#include "support/check.hpp"

namespace fusedopt::comm {

CommError::CommError(int rank, std::string operation, std::size_t bytes, std::string cause)
    : Error(fmt::format("rank {}: {} ({} bytes): {}", rank, operation, bytes, cause)),
      rank_(rank),
      operation_(std::move(operation)),
      bytes_(bytes),
      cause_(std::move(cause)) {}

namespace detail {

std::string describe(const Collective& c) {
  const std::string type = c.f64 ? std::string("fp64") : to_string(c.dtype);
  switch (c.kind) {
    case Collective::Kind::AllReduce:
      return fmt::format("all_reduce({}, {})", c.op == ReduceOp::Sum ? "sum" : "max", type);
    case Collective::Kind::Reduce:
      return fmt::format("reduce({}, {}, root {})", c.op == ReduceOp::Sum ? "sum" : "max", type,
                         c.root);
    case Collective::Kind::ReduceScatter:
      return fmt::format("reduce_scatter({}, {})", c.op == ReduceOp::Sum ? "sum" : "max", type);
    case Collective::Kind::AllGather:
      return fmt::format("all_gather({})", type);
    case Collective::Kind::Broadcast:
      return fmt::format("broadcast({}, root {})", type, c.root);
    case Collective::Kind::Barrier:
      return "barrier";
  }
  return "?";
}

std::size_t bytes_of(const Collective& c, int size) {
  const auto elements = c.kind == Collective::Kind::ReduceScatter
                            ? c.count * static_cast<std::int64_t>(size)
                            : c.count;
  const std::size_t element = c.f64 ? sizeof(double) : dtype_size(c.dtype);
  return static_cast<std::size_t>(elements) * element;
}

BlockLayout block_layout(const Collective& c, int rank, int size) {
  // In 128 bits: a count near 2^63 elements must not wrap around into "apart".
  __extension__ typedef unsigned __int128 Wide;
  const bool scatter = c.kind == Collective::Kind::ReduceScatter;
  const Wide small = reinterpret_cast<std::uintptr_t>(scatter ? c.recv : c.send);
  const Wide big = reinterpret_cast<std::uintptr_t>(scatter ? c.send : c.recv);
  const Wide block = static_cast<Wide>(static_cast<std::uint64_t>(c.count)) *
                     (c.f64 ? sizeof(double) : dtype_size(c.dtype));
  if (small + block <= big || big + block * static_cast<Wide>(size) <= small)
    return BlockLayout::Apart;
  return small == big + block * static_cast<Wide>(rank) ? BlockLayout::OwnBlock
                                                        : BlockLayout::Overlap;
}

}  // namespace detail

namespace {

using detail::Collective;

[[noreturn]] void fail(Backend& b, const Pending& p, const std::string& cause) {
  if (!b.broken) {
    b.broken = true;
    b.broken_by = fmt::format("{} failed: {}", p.operation(), cause);
  }
  throw CommError(b.rank(), p.operation(), p.bytes, cause);
}

/// Polls `p` until it completes or `deadline` passes: a few quick polls, then polls spaced
/// by a growing sleep (at most 1 ms), so a waiting rank leaves the core to the others; a
/// transport that progresses only while polled (MPI) is polled continuously, yielding.
void wait_until(Pending& p, std::chrono::steady_clock::time_point deadline,
                std::chrono::milliseconds timeout) {
  if (p.done) return;
  Backend& b = *p.owner;
  if (b.broken)
    throw CommError(b.rank(), p.operation(), p.bytes, "the communicator is broken: " + b.broken_by);
  auto pause = std::chrono::microseconds(1);
  for (int polls = 0;; ++polls) {
    bool complete = false;
    try {
      complete = b.test(p);
    } catch (const CommError&) {
      b.broken = true;
      throw;
    }
    if (complete) {
      p.done = true;
      return;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      fail(b, p,
           fmt::format("not complete after {:.3g} s: a rank has stalled, died or called "
                       "another operation",
                       std::chrono::duration<double>(timeout).count()));
    }
    if (polls < 16 || b.progress_by_polling) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
    }
  }
}

}  // namespace

void Work::wait() {
  FUSEDOPT_CHECK_USAGE(pending_ != nullptr, "Work::wait: this Work holds no operation");
  wait(pending_->owner->timeout);
}

void Work::wait(std::chrono::milliseconds timeout) {
  FUSEDOPT_CHECK_USAGE(pending_ != nullptr, "Work::wait: this Work holds no operation");
  FUSEDOPT_CHECK_USAGE(timeout.count() > 0 && timeout <= Communicator::kMaxTimeout,
                       "Work::wait: {} ms is not a timeout above 0 and at most {} ms (7 days)",
                       timeout.count(), Communicator::kMaxTimeout.count());
  wait_until(*pending_, std::chrono::steady_clock::now() + timeout, timeout);
}

bool Work::test() {
  FUSEDOPT_CHECK_USAGE(pending_ != nullptr, "Work::test: this Work holds no operation");
  if (pending_->done) return true;
  Backend& b = *pending_->owner;
  if (b.broken) {
    throw CommError(b.rank(), pending_->operation(), pending_->bytes,
                    "the communicator is broken: " + b.broken_by);
  }
  pending_->done = b.test(*pending_);
  return pending_->done;
}

std::chrono::milliseconds Communicator::default_timeout() {
  if (const char* env = std::getenv("FUSEDOPT_COMM_TIMEOUT")) {
    char* end = nullptr;
    const double seconds = std::strtod(env, &end);
    // Finite and bounded before it becomes an integer: 1e10 s overflowed the clock's
    // deadline and inf the conversion, and every collective failed at once.
    const double max_seconds = static_cast<double>(kMaxTimeout.count()) / 1000.0;
    FUSEDOPT_CHECK_USAGE(end != env && *end == '\0' && seconds > 0 && seconds <= max_seconds,
                         "FUSEDOPT_COMM_TIMEOUT='{}': expected a number of seconds above 0 and "
                         "at most {} (7 days)",
                         env, max_seconds);
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000.0 + 0.5)));
  }
  return std::chrono::minutes(5);
}

Communicator::Communicator(std::shared_ptr<Backend> backend) : backend_(std::move(backend)) {}

Communicator Communicator::mpi() { return Communicator(detail::make_mpi_world({})); }
Communicator Communicator::mpi(const MpiOptions& options) {
  return Communicator(detail::make_mpi_world(options));
}
Communicator Communicator::mpi(const void* mpi_comm, const MpiOptions& options) {
  FUSEDOPT_CHECK_USAGE(mpi_comm != nullptr, "Communicator::mpi: null MPI_Comm pointer");
  return Communicator(detail::make_mpi(mpi_comm, options));
}
Communicator Communicator::nccl(int device, const Communicator& bootstrap) {
  return Communicator(detail::make_nccl(device, *bootstrap.backend_));
}
Communicator Communicator::nccl_wrap(void* nccl_comm, int device) {
  FUSEDOPT_CHECK_USAGE(nccl_comm != nullptr, "Communicator::nccl_wrap: null ncclComm_t");
  return Communicator(detail::wrap_nccl(nccl_comm, device));
}

bool Communicator::available(const std::string& backend, std::string* why) {
  if (backend == "mpi") return detail::mpi_available(why);
  if (backend == "nccl") return detail::nccl_available(why);
  if (why) *why = fmt::format("there is no comm backend '{}' (mpi, nccl)", backend);
  return false;
}

int Communicator::rank() const { return backend_->rank(); }
int Communicator::size() const { return backend_->size(); }
std::string Communicator::backend() const { return backend_->name(); }
std::string Communicator::transport() const { return backend_->transport(); }
Device Communicator::device() const { return backend_->device(); }
std::chrono::milliseconds Communicator::timeout() const { return backend_->timeout; }
void Communicator::set_timeout(std::chrono::milliseconds timeout) {
  FUSEDOPT_CHECK_USAGE(timeout.count() > 0 && timeout <= kMaxTimeout,
                       "Communicator::set_timeout: {} ms is not a timeout above 0 and at most {} "
                       "ms (7 days)",
                       timeout.count(), kMaxTimeout.count());
  backend_->timeout = timeout;
}
bool Communicator::broken() const { return backend_->broken; }

namespace detail {

Work start(const std::shared_ptr<Backend>& b, const Collective& c) {
  // Nothing is allocated here (the description is made only for an error): a transport
  // that reuses its operations makes a collective allocation-free.
  const std::size_t bytes = detail::bytes_of(c, b->size());
  if (b->broken) {
    throw CommError(b->rank(), describe(c), bytes, "the communicator is broken: " + b->broken_by);
  }
  FUSEDOPT_CHECK_USAGE(c.count >= 0, "{}: count {} is negative", describe(c), c.count);
  if (c.kind != Collective::Kind::Barrier && c.count > 0) {
    FUSEDOPT_CHECK_USAGE(c.recv != nullptr && c.send != nullptr, "{}: null buffer", describe(c));
  }
  std::shared_ptr<Pending> p = b->start(c);
  p->what = c;
  p->bytes = bytes;
  p->owner = b;
  return Work(std::move(p));
}

Collective collective(Collective::Kind kind, const void* send, void* recv, std::int64_t count,
                      DType dtype, ReduceOp op, int root, void* stream) {
  Collective c;
  c.kind = kind;
  c.send = send;
  c.recv = recv;
  c.count = count;
  c.dtype = dtype;
  c.op = op;
  c.root = root;
  c.stream = stream;
  return c;
}

}  // namespace detail

using detail::collective;
using detail::start;

Work Communicator::all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op,
                              void* stream) {
  return start(backend_,
               collective(Collective::Kind::AllReduce, data, data, count, dtype, op, 0, stream));
}

Work Communicator::all_reduce(double* data, std::int64_t count, ReduceOp op, void* stream) {
  Collective c =
      collective(Collective::Kind::AllReduce, data, data, count, DType::F32, op, 0, stream);
  c.f64 = true;
  return start(backend_, c);
}

Work Communicator::reduce(void* data, std::int64_t count, DType dtype, int root, ReduceOp op,
                          void* stream) {
  FUSEDOPT_CHECK_USAGE(root >= 0 && root < size(), "reduce: root {} is not a rank (size {})", root,
                       size());
  return start(backend_,
               collective(Collective::Kind::Reduce, data, data, count, dtype, op, root, stream));
}

namespace {
/// A reduce_scatter's or an all_gather's buffers lie apart, or the one-block buffer exactly at
/// this rank's own block of the other (the in-place form NCCL takes); any other overlap is a
/// UsageError naming the call.
void check_blocks(const detail::Collective& c, int rank, int size) {
  const bool gather = c.kind == detail::Collective::Kind::AllGather;
  FUSEDOPT_CHECK_USAGE(
      c.count <= 0 || detail::block_layout(c, rank, size) != detail::BlockLayout::Overlap,
      "{}: the receive and send buffers overlap other than at this rank's own "
      "block ({} + {} x {} elements): use separate buffers or that block",
      gather ? "all_gather" : "reduce_scatter", gather ? "recv" : "send", rank, c.count);
}
}  // namespace

Work Communicator::reduce_scatter(const void* send, void* recv, std::int64_t recv_count,
                                  DType dtype, ReduceOp op, void* stream) {
  const Collective c =
      collective(Collective::Kind::ReduceScatter, send, recv, recv_count, dtype, op, 0, stream);
  check_blocks(c, rank(), size());
  return start(backend_, c);
}

Work Communicator::all_gather(const void* send, void* recv, std::int64_t send_count, DType dtype,
                              void* stream) {
  const Collective c = collective(Collective::Kind::AllGather, send, recv, send_count, dtype,
                                  ReduceOp::Sum, 0, stream);
  check_blocks(c, rank(), size());
  return start(backend_, c);
}

Work Communicator::broadcast(void* data, std::int64_t count, DType dtype, int root, void* stream) {
  FUSEDOPT_CHECK_USAGE(root >= 0 && root < size(), "broadcast: root {} is not a rank (size {})",
                       root, size());
  return start(backend_, collective(Collective::Kind::Broadcast, data, data, count, dtype,
                                    ReduceOp::Sum, root, stream));
}

void* Communicator::allocate_shared(std::size_t bytes) {
  FUSEDOPT_CHECK_USAGE(!backend_->broken, "allocate_shared: the communicator is broken ({})",
                       backend_->broken_by);
  FUSEDOPT_CHECK_USAGE(bytes <= (std::size_t{1} << 46),
                       "allocate_shared: {} bytes is more than any host has", bytes);
  return backend_->allocate_shared(bytes);
}

void Backend::FreeHost::operator()(void* p) const { std::free(p); }

void* Backend::allocate_shared(std::size_t bytes) {
  constexpr std::size_t kLine = 64;
  const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + kLine - 1) / kLine * kLine;
  void* p = std::aligned_alloc(kLine, rounded);
  if (p == nullptr) throw Error(fmt::format("allocate_shared: cannot allocate {} bytes", bytes));
  std::memset(p, 0, rounded);
  host_buffers_.emplace_back(p);
  return p;
}

Work Communicator::barrier() {
  return start(backend_, collective(Collective::Kind::Barrier, nullptr, nullptr, 0, DType::F32,
                                    ReduceOp::Sum, 0, nullptr));
}

void Communicator::abort(bool end_job) {
  backend_->broken = true;
  if (backend_->broken_by.empty()) backend_->broken_by = "abort() was called";
  backend_->abort(end_job);
}

void Communicator::check_same(const std::string& what, const std::string& fingerprint) {
  // Fingerprints travel on the host side (for NCCL: its MPI bootstrap), each byte as one
  // fp32 value (exact): first every rank's length, then every rank's text padded to the
  // longest. Every rank compares them all, so either every rank passes or every rank
  // throws, naming the first rank that differs from rank 0 and the first line that differs.
  const std::shared_ptr<Backend> control = backend_->control();
  FUSEDOPT_CHECK_USAGE(control != nullptr,
                       "check_same: a wrapped NCCL communicator has no host-side channel; build "
                       "it with Communicator::nccl(device, bootstrap)");
  const int n = control->size();
  auto gather_bytes = [&](const std::string& in) {
    std::vector<float> send(in.begin(), in.end());
    std::vector<float> recv(send.size() * static_cast<std::size_t>(n));
    Collective c;
    c.kind = Collective::Kind::AllGather;
    c.send = send.data();
    c.recv = recv.data();
    c.count = static_cast<std::int64_t>(send.size());
    start(control, c).wait();
    std::string out(recv.size(), '\0');
    for (std::size_t i = 0; i < recv.size(); ++i)
      out[i] = static_cast<char>(static_cast<unsigned char>(recv[i]));
    return out;
  };
  std::string my_length(8, '\0');
  for (int i = 0; i < 8; ++i) {
    my_length[static_cast<std::size_t>(i)] =
        static_cast<char>((fingerprint.size() >> (8 * i)) & 0xff);
  }
  const std::string all_lengths = gather_bytes(my_length);
  std::vector<std::size_t> lengths(static_cast<std::size_t>(n), 0);
  std::size_t longest = 0;
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < 8; ++i) {
      lengths[static_cast<std::size_t>(r)] |= static_cast<std::size_t>(static_cast<unsigned char>(
                                                  all_lengths[static_cast<std::size_t>(r * 8 + i)]))
                                              << (8 * i);
    }
    longest = std::max(longest, lengths[static_cast<std::size_t>(r)]);
  }
  std::string padded = fingerprint;
  padded.resize(longest, '\0');
  const std::string all = gather_bytes(padded);
  auto text = [&](int r) {
    return all.substr(static_cast<std::size_t>(r) * longest, lengths[static_cast<std::size_t>(r)]);
  };
  const std::string reference = text(0);
  for (int r = 1; r < n; ++r) {
    const std::string other = text(r);
    if (other == reference) continue;
    std::size_t at = 0;
    while (at < reference.size() && at < other.size() && reference[at] == other[at]) ++at;
    const std::size_t newline = at == 0 ? std::string::npos : reference.rfind('\n', at - 1);
    const std::size_t from = newline == std::string::npos ? 0 : newline + 1;
    auto line_of = [&](const std::string& s) {
      if (from >= s.size()) return std::string("nothing");
      const std::size_t end = s.find('\n', from);
      return "'" + s.substr(from, end == std::string::npos ? std::string::npos : end - from) + "'";
    };
    const std::string cause =
        fmt::format("rank {} differs from rank 0: rank 0 has {}, rank {} has {}", r,
                    line_of(reference), r, line_of(other));
    backend_->broken = true;
    backend_->broken_by = what + ": " + cause;
    throw CommError(rank(), "check_same(" + what + ")", fingerprint.size(), cause);
  }
}

}  // namespace fusedopt::comm
