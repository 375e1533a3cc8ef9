// The emulating driver's state and the checks its entry points share: see driver_state.hpp.
#include "emu/driver_state.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace fusedopt::emu {

Driver::Driver() : executor(std::make_unique<Executor>(memory)) {
  if (const char* v = std::getenv("FUSEDOPT_EMU_STREAMS")) lazy = std::string(v) != "eager";
}

Driver& driver() {
  static Driver* d = new Driver;  // never destroyed: calls may come from static destructors
  return *d;
}

namespace {
char primary_storage;
}  // namespace

CUcontext const kPrimary = reinterpret_cast<CUcontext>(&primary_storage);
thread_local CUcontext current_context = nullptr;

namespace {
long long env_number(const char* name, long long fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  return (*end == '\0' && n > 0) ? n : fallback;
}

}  // namespace

int sm_count() {
  static const int n = static_cast<int>(env_number("FUSEDOPT_EMU_SMS", 4));
  return n;
}

std::string hex(std::uint64_t a) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(a));
  return buf;
}

/// A failure with a report: kept for cuGetErrorString and printed on stderr.
CUresult report(Driver& d, CUresult code, const std::string& message) {
  d.details[code] = message;
  std::fprintf(stderr, "fusedopt-cuda-emu: %s\n", message.c_str());
  return code;
}

// The checks at the top of each call (the lock is held).
CUresult need_init(const Driver& d) {
  return d.initialised ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}
CUresult need_context(const Driver& d) {
  if (!d.initialised) return CUDA_ERROR_NOT_INITIALIZED;
  if (current_context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (d.primary_refs == 0) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  return CUDA_SUCCESS;
}

/// A call the real driver refuses while a stream captures in global mode (memory
/// allocation, synchronous copies, synchronisation): the capture is invalidated too.
CUresult refuse_if_capturing(Driver& d, const char* call) {
  if (d.global_captures == 0) return CUDA_SUCCESS;
  for (StreamRecord* s : d.streams) {
    if (s->capturing) s->invalidated = true;
  }
  return report(d, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                std::string(call) +
                    " during a stream capture in global mode (the capture is "
                    "invalidated)");
}

bool valid_stream(const Driver& d, CUstream s) {
  return s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD ||
         d.streams.count(reinterpret_cast<StreamRecord*>(s)) != 0;
}

StreamRecord* capturing(const Driver& d, CUstream s) {
  if (s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return nullptr;
  auto* r = reinterpret_cast<StreamRecord*>(s);
  return d.streams.count(r) && r->capturing ? r : nullptr;
}

/// An asynchronous operation on `stream`: recorded while it captures, else run now (every
/// operation completes before its call returns: program order is stream order).
CUresult enqueue(Driver& d, CUstream stream, Operation op) {
  if (!valid_stream(d, stream)) return CUDA_ERROR_INVALID_HANDLE;
  if (StreamRecord* s = capturing(d, stream)) {
    s->captured.push_back(std::move(op));
    return CUDA_SUCCESS;
  }
  if (stream == nullptr || stream == CU_STREAM_LEGACY) {
    // The legacy stream waits for every blocking stream: for a capturing one, that is an
    // implicit dependency the real driver refuses.
    bool blocking_capture = false;
    for (StreamRecord* s : d.streams) {
      blocking_capture |= s->capturing && (s->flags & CU_STREAM_NON_BLOCKING) == 0;
    }
    if (blocking_capture) {
      for (StreamRecord* s : d.streams) {
        if (s->capturing) s->invalidated = true;
      }
      return report(d, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
                    "work on the legacy default stream while a blocking stream captures (the "
                    "capture is invalidated)");
    }
  }
  if (!d.lazy) return op();
  StreamRecord& s = record_of(d, stream);
  if (&s == &d.legacy) {
    for (StreamRecord* b : d.streams) {
      if ((b->flags & CU_STREAM_NON_BLOCKING) == 0) {
        if (CUresult r = run_pending(d, *b)) return r;
      }
    }
  } else if ((s.flags & CU_STREAM_NON_BLOCKING) == 0) {
    if (CUresult r = run_pending(d, d.legacy)) return r;
  }
  s.pending.push_back(std::move(op));
  return CUDA_SUCCESS;
}

StreamRecord& record_of(Driver& d, CUstream s) {
  if (s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return d.legacy;
  return *reinterpret_cast<StreamRecord*>(s);
}

CUresult run_pending(Driver& d, StreamRecord& s) {
  while (!s.pending.empty()) {
    Operation op = std::move(s.pending.front());
    s.pending.pop_front();
    if (CUresult r = op()) {
      s.pending.clear();
      return r;
    }
  }
  return CUDA_SUCCESS;
}

CUresult wait_legacy(Driver& d) {
  for (StreamRecord* b : d.streams) {
    if ((b->flags & CU_STREAM_NON_BLOCKING) == 0) {
      if (CUresult r = run_pending(d, *b)) return r;
    }
  }
  return run_pending(d, d.legacy);
}

CUresult wait_all(Driver& d) {
  CUresult first = run_pending(d, d.legacy);
  for (StreamRecord* s : d.streams) {
    const CUresult r = run_pending(d, *s);
    if (first == CUDA_SUCCESS) first = r;
  }
  return first;
}

CUresult check_range(Driver& d, const char* call, CUdeviceptr p, std::size_t bytes) {
  if (bytes == 0) return CUDA_SUCCESS;
  if (d.memory.find(static_cast<std::uintptr_t>(p), bytes)) return CUDA_SUCCESS;
  return report(d, CUDA_ERROR_INVALID_VALUE,
                std::string(call) + ": " + std::to_string(bytes) + " bytes at device address " +
                    hex(p) + " are not inside one live allocation (" +
                    d.memory.describe(static_cast<std::uintptr_t>(p), bytes) + ")");
}

CUresult launch_now(Driver& d, const Function& f, Dim3 grid, Dim3 block, void** params) {
  if (!d.seed_said) {
    d.seed_said = true;
    std::fprintf(stderr, "fusedopt-cuda-emu: block and thread orders from FUSEDOPT_EMU_SEED=%llu\n",
                 static_cast<unsigned long long>(d.executor->seed()));
  }
  const LaunchResult r = d.executor->run(f.kernel, grid, block, params);
  if (r.code == 0) return CUDA_SUCCESS;
  return report(d, static_cast<CUresult>(r.code), r.message);
}

const char* error_name(CUresult r) {
  switch (r) {
#define FO_NAME(x) \
  case x:          \
    return #x;
    FO_NAME(CUDA_SUCCESS)
    FO_NAME(CUDA_ERROR_INVALID_VALUE)
    FO_NAME(CUDA_ERROR_OUT_OF_MEMORY)
    FO_NAME(CUDA_ERROR_NOT_INITIALIZED)
    FO_NAME(CUDA_ERROR_DEINITIALIZED)
    FO_NAME(CUDA_ERROR_NO_DEVICE)
    FO_NAME(CUDA_ERROR_INVALID_DEVICE)
    FO_NAME(CUDA_ERROR_INVALID_IMAGE)
    FO_NAME(CUDA_ERROR_INVALID_CONTEXT)
    FO_NAME(CUDA_ERROR_NO_BINARY_FOR_GPU)
    FO_NAME(CUDA_ERROR_INVALID_HANDLE)
    FO_NAME(CUDA_ERROR_ILLEGAL_STATE)
    FO_NAME(CUDA_ERROR_NOT_FOUND)
    FO_NAME(CUDA_ERROR_NOT_READY)
    FO_NAME(CUDA_ERROR_ILLEGAL_ADDRESS)
    FO_NAME(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)
    FO_NAME(CUDA_ERROR_CONTEXT_IS_DESTROYED)
    FO_NAME(CUDA_ERROR_MISALIGNED_ADDRESS)
    FO_NAME(CUDA_ERROR_LAUNCH_FAILED)
    FO_NAME(CUDA_ERROR_NOT_SUPPORTED)
    FO_NAME(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
    FO_NAME(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
    FO_NAME(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
    FO_NAME(CUDA_ERROR_UNKNOWN)
#undef FO_NAME
    default:
      return nullptr;
  }
}

const char* error_text(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS:
      return "no error";
    case CUDA_ERROR_INVALID_VALUE:
      return "invalid argument";
    case CUDA_ERROR_OUT_OF_MEMORY:
      return "out of memory";
    case CUDA_ERROR_NOT_INITIALIZED:
      return "initialization error";
    case CUDA_ERROR_INVALID_DEVICE:
      return "invalid device ordinal";
    case CUDA_ERROR_INVALID_CONTEXT:
      return "invalid device context";
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
      return "no kernel image is available for execution on the device";
    case CUDA_ERROR_INVALID_HANDLE:
      return "invalid resource handle";
    case CUDA_ERROR_NOT_FOUND:
      return "named symbol not found";
    case CUDA_ERROR_NOT_READY:
      return "device not ready";
    case CUDA_ERROR_ILLEGAL_ADDRESS:
      return "an illegal memory access was encountered";
    case CUDA_ERROR_MISALIGNED_ADDRESS:
      return "misaligned address";
    case CUDA_ERROR_LAUNCH_FAILED:
      return "unspecified launch failure";
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
      return "context is destroyed";
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
      return "operation not permitted when stream is capturing";
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
      return "operation failed due to a previous error during capture";
    case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT:
      return "operation would make the legacy stream depend on a capturing blocking stream";
    default:
      return "an error of the emulated CUDA driver";
  }
}

}  // namespace fusedopt::emu
