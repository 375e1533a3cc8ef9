// The emulating driver's state and the checks every entry point makes (driver.cpp: errors,
// device, contexts, modules, launches; driver_memory.cpp: memory, streams, capture, graphs,
// events). One lock guards it all: the lock is held for the whole of each call, a launch
// included, so kernels run one at a time.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "emu/executor.hpp"
#include "emu/memory.hpp"

#define FO_EMU_API extern "C" __attribute__((visibility("default")))

namespace fusedopt::emu {

struct Module {
  void* handle = nullptr;  // dlopen
  int fd = -1;             // the memfd the image was loaded from (kept: its path is unique)
  fo_emu_module* state = nullptr;
};

struct Function {
  Kernel kernel;
  Module* module = nullptr;
};

using Operation = std::function<CUresult()>;

struct StreamRecord {
  unsigned flags = 0;  // CU_STREAM_NON_BLOCKING: no implicit order with the legacy stream
  bool capturing = false;
  bool invalidated = false;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  std::vector<Operation> captured;
  /// Issued, not yet run (lazy streams): run in order when something waits for them.
  std::deque<Operation> pending;
};

struct GraphRecord {
  std::shared_ptr<const std::vector<Operation>> operations;
};

struct Driver {
  std::mutex mutex;
  bool initialised = false;
  DeviceMemory memory;
  std::unique_ptr<Executor> executor;
  int primary_refs = 0;
  std::set<Module*> modules;
  std::set<Function*> functions;
  std::set<StreamRecord*> streams;
  std::set<GraphRecord*> graphs;
  std::set<GraphRecord*> graph_execs;
  /// Each event and the stream it was last recorded on (null: never recorded).
  std::map<CUevent, StreamRecord*> events;
  /// The legacy default stream (a null stream, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD).
  StreamRecord legacy;
  /// Lazy streams (the default; FUSEDOPT_EMU_STREAMS=eager turns them off): work runs only
  /// when something waits for it, the latest a GPU may run it, so a missing
  /// synchronisation shows as stale data.
  bool lazy = true;
  std::map<CUresult, std::string> details;  // the last report for each error code
  int global_captures = 0;
  bool seed_said = false;

  Driver();
};

/// The process's emulated driver (never destroyed: calls may come from static destructors).
Driver& driver();

/// The primary context of the one device, and the calling thread's current context.
extern CUcontext const kPrimary;
extern thread_local CUcontext current_context;

/// FUSEDOPT_EMU_SMS, else 4.
int sm_count();
std::string hex(std::uint64_t a);
/// A failure with a report: kept for cuGetErrorString and printed on stderr.
CUresult report(Driver& d, CUresult code, const std::string& message);
// The checks at the top of each call (the lock is held).
CUresult need_init(const Driver& d);
CUresult need_context(const Driver& d);
/// A call the real driver refuses while a stream captures in global mode (memory
/// allocation, synchronous copies, synchronisation): the capture is invalidated too.
CUresult refuse_if_capturing(Driver& d, const char* call);
bool valid_stream(const Driver& d, CUstream s);
/// The stream's record when it is capturing, else null.
StreamRecord* capturing(const Driver& d, CUstream s);
/// An asynchronous operation on `stream`: recorded while it captures; else queued on the
/// stream (lazy streams), after the work it implicitly waits for (the legacy stream waits
/// for every blocking stream, a blocking stream for the legacy one) has run; or, with eager
/// streams, run now. Returns an error of work it ran.
CUresult enqueue(Driver& d, CUstream stream, Operation op);
/// The record of a valid stream handle (the legacy stream's for the null stream).
StreamRecord& record_of(Driver& d, CUstream s);
/// Runs the work queued on `s`, in order; the first failure is returned and drops the rest.
CUresult run_pending(Driver& d, StreamRecord& s);
/// What a synchronous call on the legacy stream waits for: the blocking streams, then the
/// legacy stream. Non-blocking streams are not waited for, as on a GPU.
CUresult wait_legacy(Driver& d);
/// Every stream's work (cuCtxSynchronize, and calls that synchronise the device).
CUresult wait_all(Driver& d);
/// INVALID_VALUE with a report unless [p, p + bytes) lies inside one live allocation.
CUresult check_range(Driver& d, const char* call, CUdeviceptr p, std::size_t bytes);
/// Runs a kernel now.
CUresult launch_now(Driver& d, const Function& f, Dim3 grid, Dim3 block, void** params);
/// The real driver's name and description of a result.
const char* error_name(CUresult r);
const char* error_text(CUresult r);

/// Deletes a handle the driver made, or says it is not one.
template <typename T>
CUresult destroy(std::set<T*>& live, T* handle) {
  if (!live.erase(handle)) return CUDA_ERROR_INVALID_HANDLE;
  delete handle;
  return CUDA_SUCCESS;
}

}  // namespace fusedopt::emu

/// Every entry point begins with this: `d` is the driver, its lock held to the end.
#define FO_LOCK                                           \
  ::fusedopt::emu::Driver& d = ::fusedopt::emu::driver(); \
  std::lock_guard<std::mutex> lock(d.mutex)
