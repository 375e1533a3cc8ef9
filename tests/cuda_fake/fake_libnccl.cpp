// A stand-in for libnccl.so.2 (loaded through FUSEDOPT_NCCL_LIBRARY, beside the fake driver
// or fusedopt's CUDA emulator) so that the NCCL transport runs on machines without a GPU.
// "Device memory" is host memory under both, so the collectives move the bytes themselves:
// - a communicator of one rank copies send to receive where they differ (every collective
//   is a copy over one rank);
// - a communicator of N > 1 ranks (one per MPI process: the ranks that join one unique id)
//   moves real data between the processes over MPI point-to-point messages on
//   MPI_COMM_WORLD, synchronously inside the call (the emulator's streams are complete in
//   program order anyway). Reductions fold the ranks' contributions in rank order, 16-bit
//   types widened to fp32 and rounded once, so every rank gets the same bits; max is
//   NCCL's (fmax: a NaN beside a number gives the number).
// Errors a test can inject (at launch, asynchronously, at init) and a log of every call
// (fake_nccl_log) apply to both. It knows nothing of fusedopt.
//
// Multi-rank communicators need MPI initialised by the program (fusedopt's bootstrap does
// it) and the rank that made the id (ncclGetUniqueId) must join it: the others send it
// their world ranks and it answers with the table of all. Joins are non-blocking
// (ncclCommInitRankConfig with blocking = 0: ncclCommGetAsyncError says ncclInProgress until
// every rank has joined). A peer that never arrives within the "peer_timeout_ms" setting is
// ncclSystemError, never a hang.
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "emulator_stream.hpp"

#if FAKE_NCCL_HAVE_MPI
#include <mpi.h>
#endif

#if !defined(__FLT16_MAX__)
#error "the fake NCCL converts fp16 with the compiler's _Float16"
#endif

namespace {

#if FAKE_NCCL_HAVE_MPI
/// A communicator's join over MPI: its messages and their buffers, kept until complete.
struct Join {
  int message[3] = {0, 0, 0};        ///< this rank's: NCCL rank, world rank, nranks
  std::vector<int> joins;            ///< the id's maker: 3 ints per rank that joined
  std::vector<int> table;            ///< [status, world rank of NCCL rank 0, 1, ...]
  std::vector<MPI_Request> collect;  ///< the maker: one receive per rank
  std::vector<MPI_Request> others;   ///< this rank's join and table messages
  bool published = false;            ///< the maker sent the table
};
#endif

}  // namespace

struct ncclComm {
  int nranks = 1;
  int rank = 0;
  int device = 0;
  // Over MPI (nranks > 1):
  int maker = -1;          ///< world rank that made the id (it collects the joins)
  int tag = 0;             ///< this communicator's tags: tag (joins), tag + 1 (the table),
                           ///< tag + 2 (data)
  std::vector<int> world;  ///< world rank of each NCCL rank, once joined
  bool joined = true;
  ncclResult_t failed = ncclSuccess;  ///< sticky: a failed join or a peer that never came
  std::string last_error;
  std::chrono::steady_clock::time_point join_deadline;
#if FAKE_NCCL_HAVE_MPI
  std::unique_ptr<Join> join;
  /// Buffers MPI may still read or write: the join's table (the maker's), and those of
  /// messages given up at a deadline.
  std::vector<std::shared_ptr<std::vector<char> > > kept;
#endif
};

namespace {

struct State {
  std::mutex mutex;
  std::string log;  // one line per call: "name arg..."
  /// version: ncclGetVersion's code; launch_error, async_error, init_error: an
  /// ncclResult_t the next launches, ncclCommGetAsyncError or ncclCommInitRank return;
  /// device: what ncclCommCuDevice says; in_progress: how many more ncclCommGetAsyncError
  /// calls answer ncclInProgress (a non-blocking call still running; -1: forever);
  /// launch_in_progress: launches return ncclInProgress (their copy done);
  /// peer_timeout_ms: how long a rank of a multi-rank communicator waits for its peers
  /// (in a join or a collective) before ncclSystemError.
  std::map<std::string, long long> settings = {{"version", 22809},
                                               {"launch_error", 0},
                                               {"async_error", 0},
                                               {"init_error", 0},
                                               {"device", 0},
                                               {"in_progress", 0},
                                               {"launch_in_progress", 0},
                                               {"peer_timeout_ms", 60000}};
  int next_id = 1;
  int live = 0;  // communicators made and not yet destroyed or aborted
};

State& state() {
  static State* s = new State;  // never destroyed: calls may come from static destructors
  return *s;
}

void note(const std::string& line) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.log += line + "\n";
}

long long setting(const char* name) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.settings[name];
}

void count_live(int delta) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.live += delta;
}

const char* type_name(ncclDataType_t t) {
  switch (t) {
    case ncclFloat32:
      return "f32";
    case ncclFloat16:
      return "f16";
    case ncclBfloat16:
      return "bf16";
    case ncclFloat64:
      return "f64";
    default:
      return "other";
  }
}

std::size_t type_size(ncclDataType_t t) { return t == ncclFloat64 ? 8 : t == ncclFloat32 ? 4 : 2; }

bool known_type(ncclDataType_t t) {
  return t == ncclFloat32 || t == ncclFloat16 || t == ncclBfloat16 || t == ncclFloat64;
}

const char* op_name(ncclRedOp_t op) {
  return op == ncclSum ? "sum" : op == ncclMax ? "max" : "other";
}

std::string where(cudaStream_t stream) { return stream ? "stream" : "legacy"; }

std::chrono::steady_clock::time_point peer_deadline() {
  return std::chrono::steady_clock::now() + std::chrono::milliseconds(setting("peer_timeout_ms"));
}

// ---- what a unique id holds ------------------------------------------------------------
// internal[0..63]: "fake-id-N@R", NUL-terminated (the log's name for it); [64..75]: a magic,
// the world rank R of its maker (-1: made without MPI) and N, its number there; the last
// byte 0xff (so a test sees that every byte travelled).

constexpr std::size_t kIdFields = 64;
constexpr char kIdMagic[4] = {'F', 'N', 'C', 'L'};

struct IdFields {
  bool valid = false;
  std::int32_t maker = -1;
  std::int32_t number = 0;
};

IdFields fields_of(const ncclUniqueId& id) {
  IdFields f;
  if (std::memcmp(id.internal + kIdFields, kIdMagic, 4) != 0) return f;
  std::memcpy(&f.maker, id.internal + kIdFields + 4, 4);
  std::memcpy(&f.number, id.internal + kIdFields + 8, 4);
  f.valid = true;
  return f;
}

// ---- reductions ----------------------------------------------------------------------------

float bf16_to_float(std::uint16_t h) {
  const std::uint32_t u = std::uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint16_t float_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return static_cast<std::uint16_t>((u >> 16) | 0x40);     // quiet
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // nearest even
}
float f16_to_float(std::uint16_t h) {
  _Float16 x;
  std::memcpy(&x, &h, 2);
  return static_cast<float>(x);
}
std::uint16_t float_to_f16(float f) {
  const _Float16 x = static_cast<_Float16>(f);  // nearest even
  std::uint16_t h;
  std::memcpy(&h, &x, 2);
  return h;
}

template <typename T>
T combine(ncclRedOp_t op, T acc, T x) {
  return op == ncclMax ? std::fmax(acc, x) : acc + x;
}

/// out[i] = parts[0][i] op parts[1][i] op ... in rank order; fp16 and bf16 in fp32, rounded
/// once.
void fold(ncclDataType_t type, ncclRedOp_t op, const std::vector<const char*>& parts, void* out,
          std::size_t count) {
  auto each = [&](auto wide, auto load, auto store) {
    using Wide = decltype(wide);
    for (std::size_t i = 0; i < count; ++i) {
      Wide acc = load(parts[0], i);
      for (std::size_t r = 1; r < parts.size(); ++r) acc = combine(op, acc, load(parts[r], i));
      store(out, i, acc);
    }
  };
  switch (type) {
    case ncclFloat64:
      each(
          0.0,
          [](const char* p, std::size_t i) {
            double v;
            std::memcpy(&v, p + i * 8, 8);
            return v;
          },
          [](void* o, std::size_t i, double v) {
            std::memcpy(static_cast<char*>(o) + i * 8, &v, 8);
          });
      break;
    case ncclFloat32:
      each(
          0.0f,
          [](const char* p, std::size_t i) {
            float v;
            std::memcpy(&v, p + i * 4, 4);
            return v;
          },
          [](void* o, std::size_t i, float v) {
            std::memcpy(static_cast<char*>(o) + i * 4, &v, 4);
          });
      break;
    case ncclFloat16:
    case ncclBfloat16: {
      const bool bf16 = type == ncclBfloat16;
      each(
          0.0f,
          [bf16](const char* p, std::size_t i) {
            std::uint16_t h;
            std::memcpy(&h, p + i * 2, 2);
            return bf16 ? bf16_to_float(h) : f16_to_float(h);
          },
          [bf16](void* o, std::size_t i, float v) {
            const std::uint16_t h = bf16 ? float_to_bf16(v) : float_to_f16(v);
            std::memcpy(static_cast<char*>(o) + i * 2, &h, 2);
          });
      break;
    }
    default:
      break;
  }
}

#if FAKE_NCCL_HAVE_MPI

bool mpi_usable() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

int world_rank() {
  int r = -1;
  if (mpi_usable()) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

/// The first of a communicator's 3 tags, from its id (distinct for ids of different makers
/// or numbers, below MPI_TAG_UB).
int tag_of(const IdFields& id) {
  int* ub = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &found);
  const long long upper = found && ub ? *ub : 32767;
  const long long base = 1 << 12;
  const long long slots = std::max(1LL, (upper - base) / 4);
  const long long key = (static_cast<long long>(id.maker) << 16) + (id.number & 0xffff);
  return static_cast<int>(base + (key % slots) * 4);
}

/// Waits for `requests`; false when `deadline` passed first.
bool wait_all(std::vector<MPI_Request>& requests, std::chrono::steady_clock::time_point deadline) {
  for (int polls = 0;; ++polls) {
    int done = 0;
    MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
    if (done) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    // Ranks may share cores (oversubscribed): give a waiting peer the core.
    if (polls < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

/// Stops `requests` that will never complete: receives are cancelled; sends are left to
/// MPI (their buffers are kept by the caller).
void give_up(std::vector<MPI_Request>& requests) {
  for (MPI_Request& r : requests) {
    if (r == MPI_REQUEST_NULL) continue;
    int done = 0;
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    if (done) continue;
    MPI_Cancel(&r);
    MPI_Request_free(&r);
  }
  requests.clear();
}

/// Messages of `bytes` bytes in pieces of at most 1 GiB (MPI counts are ints).
void post(std::vector<MPI_Request>& requests, bool send, const void* buffer, std::size_t bytes,
          int peer, int tag) {
  constexpr std::size_t kPiece = std::size_t{1} << 30;
  std::size_t at = 0;
  do {
    const std::size_t n = std::min(kPiece, bytes - at);
    MPI_Request r = MPI_REQUEST_NULL;
    char* p = const_cast<char*>(static_cast<const char*>(buffer)) + at;
    if (send) {
      MPI_Isend(p, static_cast<int>(n), MPI_BYTE, peer, tag, MPI_COMM_WORLD, &r);
    } else {
      MPI_Irecv(p, static_cast<int>(n), MPI_BYTE, peer, tag, MPI_COMM_WORLD, &r);
    }
    requests.push_back(r);
    at += n;
  } while (at < bytes);
}

ncclResult_t fail(ncclComm* c, ncclResult_t r, const std::string& why) {
  c->failed = r;
  c->last_error = why;
  return r;
}

/// Advances a join: ncclInProgress until every rank has joined, then ncclSuccess (or the
/// join's error).
ncclResult_t progress_join(ncclComm* c) {
  if (c->failed != ncclSuccess) return c->failed;
  if (c->joined) return ncclSuccess;
  Join& j = *c->join;
  if (!j.collect.empty() && !j.published) {
    // The maker: every rank's join received? Then the table goes to each of them.
    int done = 0;
    MPI_Testall(static_cast<int>(j.collect.size()), j.collect.data(), &done, MPI_STATUSES_IGNORE);
    if (done) {
      std::string problem;
      std::vector<int> world(static_cast<std::size_t>(c->nranks), -1);
      for (int k = 0; k < c->nranks; ++k) {
        const int rank = j.joins[3 * k], w = j.joins[3 * k + 1], n = j.joins[3 * k + 2];
        if (n != c->nranks) {
          problem = "world rank " + std::to_string(w) + " joined as one of " + std::to_string(n) +
                    " ranks, the maker's rank as one of " + std::to_string(c->nranks);
        } else if (rank < 0 || rank >= n || world[static_cast<std::size_t>(rank)] != -1) {
          problem = "NCCL rank " + std::to_string(rank) + " joined twice or is out of range";
        } else {
          world[static_cast<std::size_t>(rank)] = w;
        }
      }
      std::vector<int> answer(static_cast<std::size_t>(c->nranks) + 1);
      answer[0] = problem.empty() ? 0 : 1;
      std::copy(world.begin(), world.end(), answer.begin() + 1);
      auto kept = std::make_shared<std::vector<char> >(answer.size() * sizeof(int));
      std::memcpy(kept->data(), answer.data(), kept->size());
      c->kept.push_back(kept);  // alive until the communicator goes
      for (int k = 0; k < c->nranks; ++k)
        post(j.others, true, kept->data(), kept->size(), j.joins[3 * k + 1], c->tag + 1);
      j.published = true;
      if (!problem.empty()) c->last_error = "fake NCCL join: " + problem;
    } else if (std::chrono::steady_clock::now() >= c->join_deadline) {
      give_up(j.collect);
      give_up(j.others);
      return fail(c, ncclSystemError,
                  "fake NCCL: not every rank joined within peer_timeout_ms (the id's maker "
                  "collects the joins)");
    }
    if (!j.published) return ncclInProgress;
  }
  int done = 0;
  MPI_Testall(static_cast<int>(j.others.size()), j.others.data(), &done, MPI_STATUSES_IGNORE);
  if (!done) {
    if (std::chrono::steady_clock::now() >= c->join_deadline) {
      give_up(j.collect);
      give_up(j.others);
      return fail(c, ncclSystemError,
                  "fake NCCL: the id's maker (world rank " + std::to_string(c->maker) +
                      ") did not answer the join within peer_timeout_ms");
    }
    return ncclInProgress;
  }
  if (j.table[0] != 0) {
    return fail(c, ncclInvalidUsage,
                c->last_error.empty() ? "fake NCCL join: the ranks disagree (see the maker's error)"
                                      : c->last_error);
  }
  c->world.assign(j.table.begin() + 1, j.table.end());
  c->joined = true;
  c->join.reset();
  return ncclSuccess;
}

/// Starts the join of `c` (rank `rank` of `nranks`, over the id's maker).
ncclResult_t start_join(ncclComm* c, const IdFields& id) {
  c->maker = id.maker;
  c->tag = tag_of(id);
  c->joined = false;
  c->join_deadline = peer_deadline();
  c->join = std::make_unique<Join>();
  Join& j = *c->join;
  const int me = world_rank();
  j.message[0] = c->rank;
  j.message[1] = me;
  j.message[2] = c->nranks;
  j.table.assign(static_cast<std::size_t>(c->nranks) + 1, 0);
  if (me == id.maker) {
    j.joins.assign(static_cast<std::size_t>(3 * c->nranks), 0);
    for (int k = 0; k < c->nranks; ++k) {
      MPI_Request r = MPI_REQUEST_NULL;
      MPI_Irecv(j.joins.data() + 3 * k, 3, MPI_INT, MPI_ANY_SOURCE, c->tag, MPI_COMM_WORLD, &r);
      j.collect.push_back(r);
    }
  }
  post(j.others, false, j.table.data(), j.table.size() * sizeof(int), id.maker, c->tag + 1);
  post(j.others, true, j.message, sizeof j.message, id.maker, c->tag);
  return progress_join(c);
}

/// Waits for a join still running (a collective on a non-blocking communicator that was
/// not polled to the end).
ncclResult_t finish_join(ncclComm* c) {
  ncclResult_t r = progress_join(c);
  while (r == ncclInProgress) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    r = progress_join(c);
  }
  return r;
}

/// Runs one collective's messages to the end; ncclSystemError when a peer does not take
/// part within peer_timeout_ms.
ncclResult_t finish(ncclComm* c, std::vector<MPI_Request>& requests,
                    std::vector<std::vector<char> >& buffers, const std::string& what) {
  if (wait_all(requests, peer_deadline())) return ncclSuccess;
  give_up(requests);
  for (std::vector<char>& b : buffers)
    c->kept.push_back(std::make_shared<std::vector<char> >(std::move(b)));
  return fail(c, ncclSystemError,
              "fake NCCL: rank " + std::to_string(c->rank) + " of " + std::to_string(c->nranks) +
                  ": " + what + ": a peer did not take part within peer_timeout_ms");
}

enum class Kind { AllReduce, Reduce, ReduceScatter, AllGather, Broadcast };

/// One collective over N > 1 ranks: `count` is per rank (the receive count of a
/// reduce-scatter, the send count of an all-gather).
ncclResult_t exchange(ncclComm* c, Kind kind, const void* send, void* recv, std::size_t count,
                      ncclDataType_t type, ncclRedOp_t op, int root, const std::string& what) {
  if (const ncclResult_t r = finish_join(c); r != ncclSuccess) return r;
  if (!known_type(type)) return fail(c, ncclInvalidArgument, "fake NCCL: unknown data type");
  if ((kind == Kind::AllReduce || kind == Kind::Reduce || kind == Kind::ReduceScatter) &&
      op != ncclSum && op != ncclMax)
    return fail(c, ncclInvalidArgument, "fake NCCL: only sum and max");
  if ((kind == Kind::Reduce || kind == Kind::Broadcast) && (root < 0 || root >= c->nranks))
    return fail(c, ncclInvalidArgument, "fake NCCL: root " + std::to_string(root));
  const std::size_t n = static_cast<std::size_t>(c->nranks);
  const auto me = static_cast<std::size_t>(c->rank);
  const std::size_t bytes = count * type_size(type);
  const int tag = c->tag + 2;
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  std::vector<MPI_Request> requests;
  std::vector<std::vector<char> > parts(n);
  auto reduce_into = [&](void* target) {
    std::vector<const char*> order;
    for (const std::vector<char>& p : parts) order.push_back(p.data());
    fold(type, op, order, target, count);
  };
  switch (kind) {
    case Kind::AllReduce:
    case Kind::ReduceScatter: {
      // Rank q's part of the result: block q of every rank's input (all of it for an
      // all-reduce).
      const std::size_t stride = kind == Kind::ReduceScatter ? bytes : 0;
      parts[me].assign(in + me * stride, in + me * stride + bytes);
      for (std::size_t q = 0; q < n; ++q) {
        if (q == me) continue;
        parts[q].resize(bytes);
        post(requests, false, parts[q].data(), bytes, c->world[q], tag);
        post(requests, true, in + q * stride, bytes, c->world[q], tag);
      }
      if (const ncclResult_t r = finish(c, requests, parts, what); r != ncclSuccess) return r;
      reduce_into(out);
      break;
    }
    case Kind::Reduce: {
      const auto top = static_cast<std::size_t>(root);
      if (me != top) {
        post(requests, true, in, bytes, c->world[top], tag);
        if (const ncclResult_t r = finish(c, requests, parts, what); r != ncclSuccess) return r;
        break;
      }
      parts[me].assign(in, in + bytes);
      for (std::size_t q = 0; q < n; ++q) {
        if (q == me) continue;
        parts[q].resize(bytes);
        post(requests, false, parts[q].data(), bytes, c->world[q], tag);
      }
      if (const ncclResult_t r = finish(c, requests, parts, what); r != ncclSuccess) return r;
      reduce_into(out);
      break;
    }
    case Kind::AllGather: {
      parts[me].assign(in, in + bytes);  // in place, `in` is block `me` of `out`
      for (std::size_t q = 0; q < n; ++q) {
        if (q == me) continue;
        post(requests, false, out + q * bytes, bytes, c->world[q], tag);
        post(requests, true, parts[me].data(), bytes, c->world[q], tag);
      }
      if (const ncclResult_t r = finish(c, requests, parts, what); r != ncclSuccess) return r;
      if (bytes) std::memcpy(out + me * bytes, parts[me].data(), bytes);
      break;
    }
    case Kind::Broadcast: {
      const auto top = static_cast<std::size_t>(root);
      if (me == top) {
        for (std::size_t q = 0; q < n; ++q) {
          if (q != me) post(requests, true, in, bytes, c->world[q], tag);
        }
      } else {
        post(requests, false, out, bytes, c->world[top], tag);
      }
      if (const ncclResult_t r = finish(c, requests, parts, what); r != ncclSuccess) return r;
      if (me == top && in != out && bytes) std::memmove(out, in, bytes);
      break;
    }
  }
  return ncclSuccess;
}

/// Ends what a communicator still has in flight (a join given up by an abort); its buffers
/// are kept for the process's life, since MPI may not be done with them.
void drop(ncclComm* c) {
  if (c->join && mpi_usable()) {
    give_up(c->join->collect);
    give_up(c->join->others);
  }
  static std::mutex mutex;
  static auto* graveyard = new std::vector<std::shared_ptr<void> >;  // never destroyed
  std::lock_guard<std::mutex> lock(mutex);
  if (c->join) graveyard->push_back(std::shared_ptr<Join>(std::move(c->join)));
  if (c->joined && c->failed == ncclSuccess) return;  // every message of it completed
  for (auto& b : c->kept) graveyard->push_back(std::move(b));
}

#else  // no MPI: one-rank communicators only

ncclResult_t fail(ncclComm* c, ncclResult_t r, const std::string& why) {
  c->failed = r;
  c->last_error = why;
  return r;
}
int world_rank() { return -1; }
ncclResult_t progress_join(ncclComm* c) { return c->failed; }
void drop(ncclComm*) {}

#endif

/// A collective: logged, then the injected error if any, then the data moved (one rank: the
/// result is the input).
ncclResult_t launch(const std::string& line, ncclComm_t comm, const void* send, void* recv,
                    std::size_t bytes, const std::function<ncclResult_t()>& over_ranks,
                    cudaStream_t stream) {
  note(line);
  fake_cuda::wait_for_stream(stream);  // emulator_stream.hpp
  if (const auto e = setting("launch_error")) return static_cast<ncclResult_t>(e);
  if (comm != nullptr && comm->failed != ncclSuccess) return comm->failed;
  if (comm == nullptr || comm->nranks == 1) {
    if (send != recv && bytes) std::memmove(recv, send, bytes);
  } else {
    if (const ncclResult_t r = over_ranks(); r != ncclSuccess) return r;
  }
  return setting("launch_in_progress") ? ncclInProgress : ncclSuccess;
}

/// Makes rank `rank` of `nranks` over `id`: one rank at once, more through a join.
ncclResult_t init(ncclComm_t* comm, int nranks, const ncclUniqueId& id, int rank, bool blocking) {
  const bool whole = static_cast<unsigned char>(id.internal[sizeof id.internal - 1]) == 0xff;
  note("ncclCommInitRank " + std::to_string(nranks) + " " + std::to_string(rank) + " " +
       std::string(id.internal) + (whole ? "" : " (last byte lost)"));
  if (const auto e = setting("init_error")) return static_cast<ncclResult_t>(e);
  if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  auto* c = new ncclComm;
  c->nranks = nranks;
  c->rank = rank;
  c->device = static_cast<int>(setting("device"));
  ncclResult_t r = ncclSuccess;
  if (nranks > 1) {
#if FAKE_NCCL_HAVE_MPI
    const IdFields fields = fields_of(id);
    if (!mpi_usable()) {
      r = fail(c, ncclInvalidUsage,
               "fake NCCL: a communicator of more than one rank moves data over MPI, and MPI "
               "is not initialised");
    } else if (!fields.valid || fields.maker < 0) {
      r = fail(c, ncclInvalidUsage,
               "fake NCCL: this id was not made by ncclGetUniqueId under MPI, so no rank "
               "collects the joins");
    } else {
      r = start_join(c, fields);
      if (blocking) r = finish_join(c);
    }
#else
    r = fail(c, ncclInvalidUsage, "fake NCCL: built without MPI, so one rank only");
#endif
  }
  if (blocking && r != ncclSuccess) {
    drop(c);
    delete c;
    return r;
  }
  *comm = c;
  count_live(1);
  return (r == ncclInProgress || r == ncclSuccess) ? ncclSuccess : r;
}

}  // namespace

extern "C" {

// ---- the test's side ---------------------------------------------------------------------

__attribute__((visibility("default"))) const char* fake_nccl_log() {
  static thread_local std::string copy;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  copy = s.log;
  return copy.c_str();
}
__attribute__((visibility("default"))) void fake_nccl_reset() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.log.clear();
}
__attribute__((visibility("default"))) void fake_nccl_set(const char* name, long long value) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.settings[name] = value;
}
/// Communicators made and not yet destroyed or aborted.
__attribute__((visibility("default"))) int fake_nccl_live() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.live;
}

// ---- NCCL's API ---------------------------------------------------------------------------

ncclResult_t ncclGetVersion(int* version) {
  *version = static_cast<int>(setting("version"));
  return ncclSuccess;
}
const char* ncclGetErrorString(ncclResult_t) { return "the fake NCCL refused"; }
const char* ncclGetLastError(ncclComm_t comm) {
  if (comm != nullptr && !comm->last_error.empty()) return comm->last_error.c_str();
  return "fake last error";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  int n = 0;
  {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    n = s.next_id++;
  }
  const std::int32_t maker = world_rank();
  std::memset(id->internal, 0, sizeof id->internal);
  const std::string text = "fake-id-" + std::to_string(n) + "@" + std::to_string(maker);
  std::memcpy(id->internal, text.data(), text.size());
  std::memcpy(id->internal + kIdFields, kIdMagic, 4);
  std::memcpy(id->internal + kIdFields + 4, &maker, 4);
  const std::int32_t number = n;
  std::memcpy(id->internal + kIdFields + 8, &number, 4);
  id->internal[sizeof id->internal - 1] = static_cast<char>(0xff);  // every byte travels
  note("ncclGetUniqueId " + text);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return init(comm, nranks, id, rank, /*blocking=*/true);
}

/// Non-blocking when config->blocking is 0: then it answers ncclInProgress, and the join is
/// over when ncclCommGetAsyncError stops saying so (every rank joined, then the
/// in_progress setting).
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  const bool blocking = config == nullptr || config->blocking != 0;
  note(std::string("ncclCommInitRankConfig ") + (blocking ? "blocking" : "non-blocking"));
  const ncclResult_t r = init(comm, nranks, id, rank, blocking);
  if (r != ncclSuccess) return r;
  return blocking ? ncclSuccess : ncclInProgress;
}

/// The test's own communicator, for ncclCommInitAll-style wrapping.
ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int*) {
  if (ndev != 1) return ncclInvalidArgument;
  note("ncclCommInitAll 1");
  auto* c = new ncclComm;
  c->device = static_cast<int>(setting("device"));
  *comm = c;
  count_live(1);
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  note("ncclCommDestroy");
  drop(comm);
  delete comm;
  count_live(-1);
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  note("ncclCommAbort");
  drop(comm);
  delete comm;
  count_live(-1);
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  if (comm != nullptr) {
    // A multi-rank join first: in progress until every rank has joined.
    const ncclResult_t joined = progress_join(comm);
    if (joined != ncclSuccess) {
      *error = joined;
      return ncclSuccess;
    }
  }
  {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    long long& pending = s.settings["in_progress"];
    if (pending != 0) {
      if (pending > 0) --pending;
      *error = ncclInProgress;
      return ncclSuccess;
    }
  }
  *error = static_cast<ncclResult_t>(setting("async_error"));
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  *count = comm->nranks;
  return ncclSuccess;
}
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  *device = comm->device;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  *rank = comm->rank;
  return ncclSuccess;
}

#if FAKE_NCCL_HAVE_MPI
#define FAKE_NCCL_OVER_RANKS(...) [&] { return exchange(comm, __VA_ARGS__); }
#else
#define FAKE_NCCL_OVER_RANKS(...) [&] { return fail(comm, ncclInvalidUsage, "no MPI"); }
#endif

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  const std::string line = std::string("ncclAllReduce ") + std::to_string(count) + " " +
                           type_name(type) + " " + op_name(op) + " " + where(stream) +
                           (send == recv ? " in-place" : "");
  return launch(line, comm, send, recv, count * type_size(type),
                FAKE_NCCL_OVER_RANKS(Kind::AllReduce, send, recv, count, type, op, 0, line),
                stream);
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  const std::string line = std::string("ncclReduceScatter ") + std::to_string(count) + " " +
                           type_name(type) + " " + op_name(op) + " " + where(stream);
  return launch(line, comm, send, recv, count * type_size(type),
                FAKE_NCCL_OVER_RANKS(Kind::ReduceScatter, send, recv, count, type, op, 0, line),
                stream);
}
ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  const std::string line = std::string("ncclAllGather ") + std::to_string(count) + " " +
                           type_name(type) + " " + where(stream);
  return launch(line, comm, send, recv, count * type_size(type),
                FAKE_NCCL_OVER_RANKS(Kind::AllGather, send, recv, count, type, ncclSum, 0, line),
                stream);
}
ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  const std::string line = std::string("ncclReduce ") + std::to_string(count) + " " +
                           type_name(type) + " " + op_name(op) + " root " + std::to_string(root) +
                           " " + where(stream) + (send == recv ? " in-place" : "");
  return launch(line, comm, send, recv, count * type_size(type),
                FAKE_NCCL_OVER_RANKS(Kind::Reduce, send, recv, count, type, op, root, line),
                stream);
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  const std::string line = std::string("ncclBroadcast ") + std::to_string(count) + " " +
                           type_name(type) + " root " + std::to_string(root) + " " + where(stream) +
                           (send == recv ? " in-place" : "");
  return launch(line, comm, send, recv, count * type_size(type),
                FAKE_NCCL_OVER_RANKS(Kind::Broadcast, send, recv, count, type, ncclSum, root, line),
                stream);
}

}  // extern "C"
