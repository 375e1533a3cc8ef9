// fusedopt's CUDA emulator: a CUDA driver (libfusedopt-cuda-emu.so, loaded in place of
// libcuda.so.1 through FUSEDOPT_CUDA_DRIVER_LIBRARY) that RUNS kernels on the CPU. One
// device, "sm_90-like": compute capability 9.0, FUSEDOPT_EMU_SMS multiprocessors (default 4),
// H100 limits for blocks, grids and shared memory. Its device memory is host memory, tracked
// so that every kernel access and copy is checked; streams run in program order (every
// operation is complete when its call returns); stream capture records operations and a
// graph launch replays them, as the real driver does. Modules are emulator images
// (Target::emu: the CUDA source compiled by the host compiler with cuda_emu.h); a CUBIN or
// PTX is refused as a real GPU refuses another architecture's code. Errors come back as the
// CUresult the real driver gives (bad handles, launches past limits, use after free, calls
// without a current context, unsafe calls during a global capture), and a kernel that
// reads or writes outside every live allocation, makes a misaligned vector access or
// leaves a barrier unmatched fails its launch with a report (cuGetErrorString and stderr)
// naming kernel, block, thread and address.
//
// Limits: nothing about timing, occupancy or the memory model (warps, races between
// threads between barriers, caches) is emulated; math comes from the host's libm.
#include <cuda.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "emu/executor.hpp"
#include "emu/memory.hpp"

#define FO_EMU_DRIVER 1
#include "cuda_emu.h"

#define FO_EMU_API extern "C" __attribute__((visibility("default")))

namespace fusedopt::emu {
namespace {

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
  std::set<CUevent> events;
  std::map<CUresult, std::string> details;  // the last report for each error code
  int global_captures = 0;
  bool seed_said = false;

  Driver() : executor(std::make_unique<Executor>(memory)) {}
};

Driver& driver() {
  static Driver* d = new Driver;  // never destroyed: calls may come from static destructors
  return *d;
}

char primary_storage;
CUcontext const kPrimary = reinterpret_cast<CUcontext>(&primary_storage);
thread_local CUcontext current_context = nullptr;

long long env_number(const char* name, long long fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  return (*end == '\0' && n > 0) ? n : fallback;
}

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
  return op();
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

}  // namespace
}  // namespace fusedopt::emu

using fusedopt::emu::driver;
using fusedopt::emu::Driver;
namespace emu = fusedopt::emu;

#define FO_LOCK         \
  Driver& d = driver(); \
  std::lock_guard<std::mutex> lock(d.mutex)

extern "C" {

// ---- what the emulator adds ----------------------------------------------------------------

/// Present only in the emulator: fusedopt's runtime builds emulator images for it. Returns
/// the image ABI version it loads.
FO_EMU_API int fusedopt_cuda_emulator() { return FO_EMU_ABI_VERSION; }
/// The seed of this process's block and thread orders (FUSEDOPT_EMU_SEED replays it).
FO_EMU_API unsigned long long fusedopt_emu_seed() {
  FO_LOCK;
  return d.executor->seed();
}
/// Restarts the block and thread orders from `seed`, as FUSEDOPT_EMU_SEED does at start.
FO_EMU_API void fusedopt_emu_set_seed(unsigned long long seed) {
  FO_LOCK;
  d.executor->set_seed(seed);
}
/// The last report for error `code` (a launch that failed, a refused call), or "".
FO_EMU_API const char* fusedopt_emu_error_report(int code) {
  FO_LOCK;
  static thread_local std::string copy;
  auto it = d.details.find(static_cast<CUresult>(code));
  copy = it == d.details.end() ? std::string() : it->second;
  return copy.c_str();
}
/// Live device allocations (for leak checks in tests).
FO_EMU_API long long fusedopt_emu_live_allocations() {
  FO_LOCK;
  return static_cast<long long>(d.memory.live_count());
}

// ---- errors, initialisation, device ---------------------------------------------------------

FO_EMU_API CUresult CUDAAPI cuGetErrorName(CUresult error, const char** str) {
  const char* name = emu::error_name(error);
  if (!str) return CUDA_ERROR_INVALID_VALUE;
  *str = name;
  return name ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FO_EMU_API CUresult CUDAAPI cuGetErrorString(CUresult error, const char** str) {
  if (!str) return CUDA_ERROR_INVALID_VALUE;
  FO_LOCK;
  static std::map<CUresult, std::string> texts;  // stable pointers, one per code
  auto it = d.details.find(error);
  std::string text = emu::error_text(error);
  if (it != d.details.end()) text += ": " + it->second;
  std::string& slot = texts[error];
  if (slot != text) slot = text;
  *str = slot.c_str();
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  FO_LOCK;
  d.initialised = true;
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuDriverGetVersion(int* v) {
  if (!v) return CUDA_ERROR_INVALID_VALUE;
  *v = CUDA_VERSION;
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuDeviceGet(CUdevice* dev, int ordinal) {
  FO_LOCK;
  if (CUresult r = emu::need_init(d)) return r;
  if (!dev) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *dev = 0;
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuDeviceGetCount(int* n) {
  FO_LOCK;
  if (CUresult r = emu::need_init(d)) return r;
  if (!n) return CUDA_ERROR_INVALID_VALUE;
  *n = 1;
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice dev) {
  FO_LOCK;
  if (CUresult r = emu::need_init(d)) return r;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(name, static_cast<std::size_t>(len),
                "fusedopt CUDA emulator (sm_90-like, %d SMs, emulated on the CPU)",
                emu::sm_count());
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuDeviceTotalMem(std::size_t* bytes, CUdevice dev) {
  FO_LOCK;
  if (CUresult r = emu::need_init(d)) return r;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  *bytes = static_cast<std::size_t>(pages) * static_cast<std::size_t>(page);
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice dev) {
  FO_LOCK;
  if (CUresult r = emu::need_init(d)) return r;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  if (!v) return CUDA_ERROR_INVALID_VALUE;
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      *v = 9;
      break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      *v = 0;
      break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      *v = emu::sm_count();
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y:
      *v = 1024;
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z:
      *v = 64;
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X:
      *v = 2147483647;
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z:
      *v = 65535;
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK:
      *v = 48 * 1024;
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
      *v = 227 * 1024;
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR:
      *v = 228 * 1024;
      break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
      *v = 32;
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR:
      *v = 2048;
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR:
      *v = 32;
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK:
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR:
      *v = 65536;
      break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
      *v = 1;
      break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE:
      *v = 1980000;
      break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH:
      *v = 5120;
      break;
    default:
      if (static_cast<int>(a) <= 0 ||
          static_cast<int>(a) >= static_cast<int>(CU_DEVICE_ATTRIBUTE_MAX))
        return CUDA_ERROR_INVALID_VALUE;
      *v = 0;
  }
  return CUDA_SUCCESS;
}

// ---- contexts ---------------------------------------------------------------------------------

FO_EMU_API CUresult CUDAAPI cuCtxGetCurrent(CUcontext* c) {
  FO_LOCK;
  if (CUresult r = emu::need_init(d)) return r;
  if (!c) return CUDA_ERROR_INVALID_VALUE;
  *c = emu::current_context;
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuCtxSetCurrent(CUcontext c) {
  FO_LOCK;
  if (CUresult r = emu::need_init(d)) return r;
  if (c != nullptr && c != emu::kPrimary) return CUDA_ERROR_INVALID_CONTEXT;
  emu::current_context = c;
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuCtxSynchronize() {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  return emu::refuse_if_capturing(d, "cuCtxSynchronize");
}

FO_EMU_API CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice dev) {
  FO_LOCK;
  if (CUresult r = emu::need_init(d)) return r;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  if (!c) return CUDA_ERROR_INVALID_VALUE;
  ++d.primary_refs;
  *c = emu::kPrimary;
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) {
  FO_LOCK;
  if (CUresult r = emu::need_init(d)) return r;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  if (d.primary_refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
  // The last release destroys the context and, with it, its memory.
  if (--d.primary_refs == 0) d.memory.free_all();
  return CUDA_SUCCESS;
}

// ---- modules -----------------------------------------------------------------------------------

FO_EMU_API CUresult CUDAAPI cuModuleLoadData(CUmodule* m, const void* image) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (!m || !image) return CUDA_ERROR_INVALID_VALUE;
  const auto* bytes = static_cast<const unsigned char*>(image);
  if (std::memcmp(bytes, FO_EMU_IMAGE_MAGIC, 8) != 0) {
    const bool elf = std::memcmp(bytes,
                                 "\x7f"
                                 "ELF",
                                 4) == 0;
    return emu::report(d, CUDA_ERROR_NO_BINARY_FOR_GPU,
                       std::string("the CUDA emulator runs emulator images (fusedopt target "
                                   "'emu'), not ") +
                           (elf ? "a CUBIN" : "PTX or other code"));
  }
  std::uint32_t abi = 0;
  std::uint64_t size = 0;
  std::memcpy(&abi, bytes + 8, 4);
  std::memcpy(&size, bytes + 16, 8);
  if (abi != FO_EMU_ABI_VERSION) {
    return emu::report(d, CUDA_ERROR_INVALID_IMAGE,
                       "an emulator image of ABI " + std::to_string(abi) +
                           ", this emulator loads " + std::to_string(FO_EMU_ABI_VERSION));
  }
  auto mod = std::make_unique<emu::Module>();
  mod->fd = memfd_create("fusedopt-emu-image", MFD_CLOEXEC);
  if (mod->fd < 0) return emu::report(d, CUDA_ERROR_OUT_OF_MEMORY, "memfd_create failed");
  const unsigned char* p = bytes + FO_EMU_IMAGE_HEADER_BYTES;
  for (std::uint64_t left = size; left > 0;) {
    const ssize_t n = write(mod->fd, p, left);
    if (n <= 0) {
      close(mod->fd);
      return emu::report(d, CUDA_ERROR_OUT_OF_MEMORY, "cannot write the image to a memfd");
    }
    p += n;
    left -= static_cast<std::uint64_t>(n);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(mod->fd);
  mod->handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!mod->handle) {
    const char* why = dlerror();
    close(mod->fd);
    return emu::report(d, CUDA_ERROR_INVALID_IMAGE,
                       std::string("the emulator image does not load: ") + (why ? why : "?"));
  }
  using Init = fo_emu_module* (*)(int);
  auto init = reinterpret_cast<Init>(dlsym(mod->handle, "fo_emu_module_init"));
  mod->state = init ? init(FO_EMU_ABI_VERSION) : nullptr;
  if (!mod->state) {
    dlclose(mod->handle);
    close(mod->fd);
    return emu::report(d, CUDA_ERROR_INVALID_IMAGE,
                       "the emulator image has no usable fo_emu_module_init");
  }
  *m = reinterpret_cast<CUmodule>(mod.get());
  d.modules.insert(mod.release());
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  auto* mod = reinterpret_cast<emu::Module*>(m);
  if (!d.modules.count(mod)) return CUDA_ERROR_INVALID_HANDLE;
  if (!f || !name) return CUDA_ERROR_INVALID_VALUE;
  using Entry = void (*)(void**);
  using Sizes = int (*)(unsigned long*, int);
  auto entry =
      reinterpret_cast<Entry>(dlsym(mod->handle, (std::string("fo_emu_entry_") + name).c_str()));
  auto sizes =
      reinterpret_cast<Sizes>(dlsym(mod->handle, (std::string("fo_emu_sizes_") + name).c_str()));
  if (!entry || !sizes) return CUDA_ERROR_NOT_FOUND;
  auto fn = std::make_unique<emu::Function>();
  fn->module = mod;
  fn->kernel.name = name;
  fn->kernel.module = mod->state;
  fn->kernel.entry = entry;
  unsigned long s[64];
  const int n = sizes(s, 64);
  for (int k = 0; k < n && k < 64; ++k) fn->kernel.param_sizes.push_back(s[k]);
  *f = reinterpret_cast<CUfunction>(fn.get());
  d.functions.insert(fn.release());
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuModuleUnload(CUmodule m) {
  FO_LOCK;
  if (CUresult r = emu::need_init(d)) return r;
  auto* mod = reinterpret_cast<emu::Module*>(m);
  if (!d.modules.count(mod)) return CUDA_ERROR_INVALID_HANDLE;
  for (auto it = d.functions.begin(); it != d.functions.end();) {
    if ((*it)->module == mod) {
      delete *it;
      it = d.functions.erase(it);
    } else {
      ++it;
    }
  }
  d.modules.erase(mod);
  dlclose(mod->handle);
  close(mod->fd);
  delete mod;
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuFuncSetAttribute(CUfunction f, CUfunction_attribute, int) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  return d.functions.count(reinterpret_cast<emu::Function*>(f)) ? CUDA_SUCCESS
                                                                : CUDA_ERROR_INVALID_HANDLE;
}

FO_EMU_API CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessor(int* n, CUfunction f,
                                                                        int block_size,
                                                                        std::size_t smem) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (!d.functions.count(reinterpret_cast<emu::Function*>(f))) return CUDA_ERROR_INVALID_HANDLE;
  if (!n || block_size <= 0 || block_size > 1024) return CUDA_ERROR_INVALID_VALUE;
  // Threads limit the blocks per multiprocessor (registers and shared memory are not
  // modelled): 2048 threads, at most 32 blocks.
  int blocks = 2048 / block_size;
  if (smem > 0) blocks = std::min<int>(blocks, static_cast<int>((228 * 1024) / smem));
  *n = std::max(1, std::min(blocks, 32));
  return CUDA_SUCCESS;
}

// ---- launches
// ------------------------------------------------------------------------------------

FO_EMU_API CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                           unsigned bx, unsigned by, unsigned bz, unsigned smem,
                                           CUstream stream, void** params, void** extra) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  auto* fn = reinterpret_cast<emu::Function*>(f);
  if (!d.functions.count(fn)) return CUDA_ERROR_INVALID_HANDLE;
  const emu::Dim3 grid{gx, gy, gz}, block{bx, by, bz};
  if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0 || bx > 1024 || by > 1024 ||
      bz > 64 || block.count() > 1024 || gy > 65535 || gz > 65535 || gx > 2147483647u) {
    return emu::report(d, CUDA_ERROR_INVALID_VALUE,
                       "cuLaunchKernel " + fn->kernel.name + ": grid (" + std::to_string(gx) + "," +
                           std::to_string(gy) + "," + std::to_string(gz) + ") block (" +
                           std::to_string(bx) + "," + std::to_string(by) + "," +
                           std::to_string(bz) + ") is past the device's limits");
  }
  if (smem > 48 * 1024) return CUDA_ERROR_INVALID_VALUE;
  if (extra != nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  if (!params && !fn->kernel.param_sizes.empty()) return CUDA_ERROR_INVALID_VALUE;
  if (emu::capturing(d, stream) == nullptr) {
    // Run now, unless the launch is refused (legacy work during a global capture).
    return emu::enqueue(d, stream, [&d, fn, grid, block, params] {
      return emu::launch_now(d, *fn, grid, block, params);
    });
  }
  // Captured: the argument values as they are now (a graph replays with these).
  auto values = std::make_shared<std::vector<std::vector<char>>>();
  for (std::size_t k = 0; k < fn->kernel.param_sizes.size(); ++k) {
    const char* p = static_cast<const char*>(params[k]);
    values->emplace_back(p, p + fn->kernel.param_sizes[k]);
  }
  return emu::enqueue(d, stream, [&d, fn, grid, block, values] {
    if (!d.functions.count(fn)) return CUDA_ERROR_INVALID_HANDLE;
    std::vector<void*> ptrs;
    for (auto& v : *values) ptrs.push_back(v.data());
    return emu::launch_now(d, *fn, grid, block, ptrs.data());
  });
}

// ---- memory
// --------------------------------------------------------------------------------------

FO_EMU_API CUresult CUDAAPI cuMemAlloc(CUdeviceptr* p, std::size_t bytes) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (!p || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = emu::refuse_if_capturing(d, "cuMemAlloc")) return r;
  const std::uintptr_t a = d.memory.allocate(bytes);
  if (!a) return CUDA_ERROR_OUT_OF_MEMORY;
  *p = static_cast<CUdeviceptr>(a);
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuMemFree(CUdeviceptr p) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (p == 0) return CUDA_SUCCESS;
  if (CUresult r = emu::refuse_if_capturing(d, "cuMemFree")) return r;
  if (!d.memory.free(static_cast<std::uintptr_t>(p))) {
    return emu::report(d, CUDA_ERROR_INVALID_VALUE,
                       "cuMemFree of " + emu::hex(p) + ", not a live allocation (" +
                           d.memory.describe(static_cast<std::uintptr_t>(p), 1) + ")");
  }
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dst, const void* src, std::size_t n) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (CUresult r = emu::refuse_if_capturing(d, "cuMemcpyHtoD")) return r;
  if (CUresult r = emu::check_range(d, "cuMemcpyHtoD", dst, n)) return r;
  if (n) std::memcpy(reinterpret_cast<void*>(dst), src, n);
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuMemcpyDtoH(void* dst, CUdeviceptr src, std::size_t n) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (CUresult r = emu::refuse_if_capturing(d, "cuMemcpyDtoH")) return r;
  if (CUresult r = emu::check_range(d, "cuMemcpyDtoH", src, n)) return r;
  if (n) std::memcpy(dst, reinterpret_cast<const void*>(src), n);
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, std::size_t n,
                                              CUstream stream) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (CUresult r = emu::check_range(d, "cuMemcpyHtoDAsync", dst, n)) return r;
  return emu::enqueue(d, stream, [&d, dst, src, n] {
    if (CUresult r = emu::check_range(d, "cuMemcpyHtoDAsync", dst, n)) return r;
    if (n) std::memcpy(reinterpret_cast<void*>(dst), src, n);
    return CUDA_SUCCESS;
  });
}

FO_EMU_API CUresult CUDAAPI cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, std::size_t n,
                                              CUstream stream) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (CUresult r = emu::check_range(d, "cuMemcpyDtoDAsync (destination)", dst, n)) return r;
  if (CUresult r = emu::check_range(d, "cuMemcpyDtoDAsync (source)", src, n)) return r;
  return emu::enqueue(d, stream, [&d, dst, src, n] {
    if (CUresult r = emu::check_range(d, "cuMemcpyDtoDAsync (destination)", dst, n)) return r;
    if (CUresult r = emu::check_range(d, "cuMemcpyDtoDAsync (source)", src, n)) return r;
    if (n) std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
    return CUDA_SUCCESS;
  });
}

FO_EMU_API CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dst, unsigned int v, std::size_t n,
                                             CUstream stream) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (dst % 4 != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = emu::check_range(d, "cuMemsetD32Async", dst, n * 4)) return r;
  return emu::enqueue(d, stream, [&d, dst, v, n] {
    if (CUresult r = emu::check_range(d, "cuMemsetD32Async", dst, n * 4)) return r;
    auto* p = reinterpret_cast<unsigned int*>(dst);
    for (std::size_t i = 0; i < n; ++i) p[i] = v;
    return CUDA_SUCCESS;
  });
}

FO_EMU_API CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dst, unsigned char v, std::size_t n,
                                            CUstream stream) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (CUresult r = emu::check_range(d, "cuMemsetD8Async", dst, n)) return r;
  return emu::enqueue(d, stream, [&d, dst, v, n] {
    if (CUresult r = emu::check_range(d, "cuMemsetD8Async", dst, n)) return r;
    if (n) std::memset(reinterpret_cast<void*>(dst), v, n);
    return CUDA_SUCCESS;
  });
}

FO_EMU_API CUresult CUDAAPI cuPointerGetAttribute(void* data, CUpointer_attribute a,
                                                  CUdeviceptr p) {
  FO_LOCK;
  if (CUresult r = emu::need_init(d)) return r;
  if (!data) return CUDA_ERROR_INVALID_VALUE;
  if (!d.memory.find(static_cast<std::uintptr_t>(p), 1)) return CUDA_ERROR_INVALID_VALUE;
  if (a == CU_POINTER_ATTRIBUTE_MEMORY_TYPE) {
    *static_cast<unsigned int*>(data) = CU_MEMORYTYPE_DEVICE;
  } else if (a == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) {
    *static_cast<int*>(data) = 0;
  } else if (a == CU_POINTER_ATTRIBUTE_CONTEXT) {
    *static_cast<CUcontext*>(data) = emu::kPrimary;
  } else {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

// ---- streams, capture, graphs
// ---------------------------------------------------------------------

FO_EMU_API CUresult CUDAAPI cuStreamCreate(CUstream* s, unsigned int flags) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (!s || (flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING)) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  auto* rec = new emu::StreamRecord;
  rec->flags = flags;
  d.streams.insert(rec);
  *s = reinterpret_cast<CUstream>(rec);
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuStreamDestroy(CUstream s) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  auto* rec = reinterpret_cast<emu::StreamRecord*>(s);
  if (!d.streams.count(rec)) return CUDA_ERROR_INVALID_HANDLE;
  if (rec->capturing && rec->mode == CU_STREAM_CAPTURE_MODE_GLOBAL) --d.global_captures;
  d.streams.erase(rec);
  delete rec;
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuStreamSynchronize(CUstream s) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (!emu::valid_stream(d, s)) return CUDA_ERROR_INVALID_HANDLE;
  if (emu::capturing(d, s) || ((s == nullptr || s == CU_STREAM_LEGACY) && d.global_captures > 0))
    return emu::refuse_if_capturing(d, "cuStreamSynchronize");
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuStreamBeginCapture(CUstream s, CUstreamCaptureMode mode) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  // the legacy stream cannot be captured
  auto* rec = reinterpret_cast<emu::StreamRecord*>(s);
  if (!d.streams.count(rec)) return CUDA_ERROR_INVALID_HANDLE;
  if (rec->capturing) return CUDA_ERROR_ILLEGAL_STATE;
  rec->capturing = true;
  rec->invalidated = false;
  rec->mode = mode;
  rec->captured.clear();
  if (mode == CU_STREAM_CAPTURE_MODE_GLOBAL) ++d.global_captures;
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuStreamEndCapture(CUstream s, CUgraph* g) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  auto* rec = reinterpret_cast<emu::StreamRecord*>(s);
  if (!d.streams.count(rec) || !g) return CUDA_ERROR_INVALID_VALUE;
  if (!rec->capturing) return CUDA_ERROR_ILLEGAL_STATE;
  rec->capturing = false;
  if (rec->mode == CU_STREAM_CAPTURE_MODE_GLOBAL) --d.global_captures;
  std::vector<emu::Operation> ops;
  ops.swap(rec->captured);
  if (rec->invalidated) {
    *g = nullptr;
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  auto* graph = new emu::GraphRecord;
  graph->operations = std::make_shared<const std::vector<emu::Operation>>(std::move(ops));
  d.graphs.insert(graph);
  *g = reinterpret_cast<CUgraph>(graph);
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec* e, CUgraph g,
                                                        unsigned long long) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  auto* graph = reinterpret_cast<emu::GraphRecord*>(g);
  if (!d.graphs.count(graph)) return CUDA_ERROR_INVALID_HANDLE;
  if (!e) return CUDA_ERROR_INVALID_VALUE;
  auto* exec = new emu::GraphRecord{graph->operations};
  d.graph_execs.insert(exec);
  *e = reinterpret_cast<CUgraphExec>(exec);
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuGraphLaunch(CUgraphExec e, CUstream stream) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  auto* exec = reinterpret_cast<emu::GraphRecord*>(e);
  if (!d.graph_execs.count(exec)) return CUDA_ERROR_INVALID_HANDLE;
  auto ops = exec->operations;
  return emu::enqueue(d, stream, [ops] {
    for (const emu::Operation& op : *ops) {
      if (CUresult r = op()) return r;
    }
    return CUDA_SUCCESS;
  });
}

FO_EMU_API CUresult CUDAAPI cuGraphDestroy(CUgraph g) {
  FO_LOCK;
  auto* graph = reinterpret_cast<emu::GraphRecord*>(g);
  if (!d.graphs.count(graph)) return CUDA_ERROR_INVALID_HANDLE;
  d.graphs.erase(graph);
  delete graph;
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec e) {
  FO_LOCK;
  auto* exec = reinterpret_cast<emu::GraphRecord*>(e);
  if (!d.graph_execs.count(exec)) return CUDA_ERROR_INVALID_HANDLE;
  d.graph_execs.erase(exec);
  delete exec;
  return CUDA_SUCCESS;
}

// ---- events (the work before a record is done when the record returns)
// ----------------------------

FO_EMU_API CUresult CUDAAPI cuEventCreate(CUevent* e, unsigned int) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (!e) return CUDA_ERROR_INVALID_VALUE;
  *e = reinterpret_cast<CUevent>(new char);
  d.events.insert(*e);
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuEventRecord(CUevent e, CUstream stream) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (!d.events.count(e)) return CUDA_ERROR_INVALID_HANDLE;
  return emu::enqueue(d, stream, [] { return CUDA_SUCCESS; });
}

FO_EMU_API CUresult CUDAAPI cuEventQuery(CUevent e) {
  FO_LOCK;
  if (CUresult r = emu::need_init(d)) return r;
  return d.events.count(e) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

FO_EMU_API CUresult CUDAAPI cuEventSynchronize(CUevent e) {
  FO_LOCK;
  if (CUresult r = emu::need_init(d)) return r;
  return d.events.count(e) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

FO_EMU_API CUresult CUDAAPI cuEventDestroy(CUevent e) {
  FO_LOCK;
  if (CUresult r = emu::need_init(d)) return r;
  if (!d.events.erase(e)) return CUDA_ERROR_INVALID_HANDLE;
  delete reinterpret_cast<char*>(e);
  return CUDA_SUCCESS;
}

}  // extern "C"
