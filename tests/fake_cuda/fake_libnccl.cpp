// A stand-in for libnccl.so.2 (loaded through FUSEDOPT_NCCL_LIBRARY, beside the fake driver)
// so that the host side of the NCCL transport runs on machines without a GPU: communicators
// of one rank on device 0 whose collectives copy send to receive where they differ (the
// fake driver's "device memory" is host memory; over one rank every collective is a copy),
// errors a test can inject (at launch, asynchronously, at init), and a log of every call
// (fake_nccl_log). It knows nothing of fusedopt.
#include <nccl.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>

struct ncclComm {
  int nranks = 1;
  int rank = 0;
  int device = 0;
};

namespace {

struct State {
  std::mutex mutex;
  std::string log;  // one line per call: "name arg..."
  /// version: ncclGetVersion's code; launch_error, async_error, init_error: an
  /// ncclResult_t the next launches, ncclCommGetAsyncError or ncclCommInitRank return;
  /// device: what ncclCommCuDevice says; in_progress: how many more ncclCommGetAsyncError
  /// calls answer ncclInProgress (a non-blocking call still running; -1: forever);
  /// launch_in_progress: launches return ncclInProgress (their copy done).
  std::map<std::string, long long> settings = {
      {"version", 22809}, {"launch_error", 0}, {"async_error", 0},       {"init_error", 0},
      {"device", 0},      {"in_progress", 0},  {"launch_in_progress", 0}};
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

const char* op_name(ncclRedOp_t op) {
  return op == ncclSum ? "sum" : op == ncclMax ? "max" : "other";
}

std::string where(cudaStream_t stream) { return stream ? "stream" : "legacy"; }

/// One rank: the result is the input.
ncclResult_t launch(const std::string& line, const void* send, void* recv, std::size_t bytes) {
  note(line);
  if (const auto e = setting("launch_error")) return static_cast<ncclResult_t>(e);
  if (send != recv && bytes) std::memmove(recv, send, bytes);
  return setting("launch_in_progress") ? ncclInProgress : ncclSuccess;
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
const char* ncclGetLastError(ncclComm_t) { return "fake last error"; }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  int n = 0;
  {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    n = s.next_id++;
  }
  std::memset(id->internal, 0, sizeof id->internal);
  const std::string text = "fake-id-" + std::to_string(n);
  std::memcpy(id->internal, text.data(), text.size());
  id->internal[sizeof id->internal - 1] = static_cast<char>(0xff);  // every byte travels
  note("ncclGetUniqueId " + text);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  const bool whole = static_cast<unsigned char>(id.internal[sizeof id.internal - 1]) == 0xff;
  note("ncclCommInitRank " + std::to_string(nranks) + " " + std::to_string(rank) + " " +
       std::string(id.internal) + (whole ? "" : " (last byte lost)"));
  if (const auto e = setting("init_error")) return static_cast<ncclResult_t>(e);
  *comm = new ncclComm{nranks, rank, static_cast<int>(setting("device"))};
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  ++s.live;
  return ncclSuccess;
}

/// Non-blocking when config->blocking is 0: then it answers ncclInProgress, and the join is
/// over when ncclCommGetAsyncError stops saying so (the in_progress setting).
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  const bool blocking = config == nullptr || config->blocking != 0;
  note(std::string("ncclCommInitRankConfig ") + (blocking ? "blocking" : "non-blocking"));
  const ncclResult_t r = ncclCommInitRank(comm, nranks, id, rank);
  if (r != ncclSuccess) return r;
  return blocking ? ncclSuccess : ncclInProgress;
}

/// The test's own communicator, for ncclCommInitAll-style wrapping.
ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int*) {
  if (ndev != 1) return ncclInvalidArgument;
  note("ncclCommInitAll 1");
  *comm = new ncclComm{1, 0, static_cast<int>(setting("device"))};
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  ++s.live;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  note("ncclCommDestroy");
  delete comm;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  --s.live;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  note("ncclCommAbort");
  delete comm;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  --s.live;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* error) {
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

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t, cudaStream_t stream) {
  return launch(std::string("ncclAllReduce ") + std::to_string(count) + " " + type_name(type) +
                    " " + op_name(op) + " " + where(stream) + (send == recv ? " in-place" : ""),
                send, recv, count * type_size(type));
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t, cudaStream_t stream) {
  return launch(std::string("ncclReduceScatter ") + std::to_string(count) + " " + type_name(type) +
                    " " + op_name(op) + " " + where(stream),
                send, recv, count * type_size(type));
}
ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclComm_t, cudaStream_t stream) {
  return launch(std::string("ncclAllGather ") + std::to_string(count) + " " + type_name(type) +
                    " " + where(stream),
                send, recv, count * type_size(type));
}
ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, ncclComm_t, cudaStream_t stream) {
  return launch(std::string("ncclReduce ") + std::to_string(count) + " " + type_name(type) + " " +
                    op_name(op) + " root " + std::to_string(root) + " " + where(stream) +
                    (send == recv ? " in-place" : ""),
                send, recv, count * type_size(type));
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t, cudaStream_t stream) {
  return launch(std::string("ncclBroadcast ") + std::to_string(count) + " " + type_name(type) +
                    " root " + std::to_string(root) + " " + where(stream) +
                    (send == recv ? " in-place" : ""),
                send, recv, count * type_size(type));
}

}  // extern "C"
