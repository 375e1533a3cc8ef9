// Loading the CUDA driver with dlopen and the thin wrappers around it. Every driver call is
// checked; failures become CudaError (call, result name, file:line), never an abort.
#include "device/cuda_driver.hpp"

#include <cudaTypedefs.h>  // PFN_<name>_v<version>: each driver entry point's prototype
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "fusedopt/error.hpp"
#include "support/check.hpp"
#include "support/dynlib.hpp"

namespace fusedopt::runtime::cuda {

namespace {

// The symbol a <cuda.h> name stands for after its version macros (cuMemAlloc ->
// "cuMemAlloc_v2", cuGraphInstantiate -> "cuGraphInstantiateWithFlags").
#define FUSEDOPT_CU_STR2(x) #x
#define FUSEDOPT_CU_STR(x) FUSEDOPT_CU_STR2(x)

using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult*);

struct Loaded {
  std::unique_ptr<support::DynLib> lib;
  DriverApi api;
  std::string failure;  // empty when usable
  CUresult init_result = CUDA_SUCCESS;
};

/// The entry point of `base` (the driver's unversioned name) in the variant of CUDA `version`
/// (cuGetProcAddress), else dlsym of `versioned` (the name <cuda.h> maps it to). The version is
/// the one whose prototype <cuda.h> declares, never the headers' CUDA_VERSION: the driver
/// hands out the newest variant up to the version asked for, and a newer variant can take
/// other arguments (cuCtxSynchronize at 13000 takes a CUcontext, as cuCtxSynchronize_v2).
void* resolve(const support::DynLib& lib, GetProcAddress gpa, const char* base, int version,
              const char* versioned) {
  if (gpa) {
    // LEGACY_STREAM: a null stream means the legacy default stream, as with the dlsym names.
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (gpa(base, &fn, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status) == CUDA_SUCCESS &&
        status == CU_GET_PROC_ADDRESS_SUCCESS && fn) {
      return fn;
    }
  }
  return lib.symbol(versioned);
}

template <typename F>
void bind(const support::DynLib& lib, GetProcAddress gpa, const char* base, int version,
          const char* versioned, F* out) {
  *out = reinterpret_cast<F>(resolve(lib, gpa, base, version, versioned));
  if (!*out) {
    throw UnavailableError(
        fmt::format("{} has no entry point {} (CUDA {}.{}): the CUDA driver is older than "
                    "the CUDA {}.{} headers fusedopt was built with",
                    lib.path(), versioned, version / 1000, version % 1000 / 10, CUDA_VERSION / 1000,
                    CUDA_VERSION % 1000 / 10));
  }
}

// Binds api.MEMBER to the driver's BASE in the variant of CUDA VERSION; cudaTypedefs.h's
// PFN_<BASE>_v<VERSION> must be the prototype <cuda.h> declares for it (checked here, at
// compile time), so the version asked for and the arguments passed cannot disagree.
#define FUSEDOPT_CU_BIND_AS(MEMBER, BASE, VERSION, VERSIONED)                          \
  static_assert(std::is_same_v<decltype(l.api.MEMBER), PFN_##BASE##_v##VERSION>,       \
                #BASE " of CUDA " #VERSION " is not the prototype <cuda.h> declares"); \
  bind(*l.lib, gpa, #BASE, VERSION, VERSIONED, &l.api.MEMBER)
#define FUSEDOPT_CU_BIND(NAME, VERSION) \
  FUSEDOPT_CU_BIND_AS(NAME, cu##NAME, VERSION, FUSEDOPT_CU_STR(cu##NAME))

Loaded& loaded() {
  static std::once_flag once;
  // Never destroyed: the driver stays loaded for the life of the process.
  static Loaded& l = *new Loaded;
  std::call_once(once, [] {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("FUSEDOPT_CUDA_DRIVER_LIBRARY")) candidates.emplace_back(env);
    candidates.emplace_back("libcuda.so.1");
    candidates.emplace_back("libcuda.so");
    std::string errors;
    l.lib = support::DynLib::open_first(candidates, &errors);
    if (!l.lib) {
      l.failure = "the CUDA driver (libcuda.so.1) could not be loaded:" + errors;
      return;
    }
    try {
      auto gpa = reinterpret_cast<GetProcAddress>(l.lib->symbol("cuGetProcAddress_v2"));
      FUSEDOPT_CU_BIND(GetErrorName, 6000);
      FUSEDOPT_CU_BIND(GetErrorString, 6000);
      FUSEDOPT_CU_BIND(Init, 2000);
      FUSEDOPT_CU_BIND(DriverGetVersion, 2020);
      FUSEDOPT_CU_BIND(DeviceGet, 2000);
      FUSEDOPT_CU_BIND(DeviceGetCount, 2000);
      FUSEDOPT_CU_BIND(DeviceGetAttribute, 2000);
      FUSEDOPT_CU_BIND(CtxGetCurrent, 4000);
      FUSEDOPT_CU_BIND(CtxSetCurrent, 4000);
      FUSEDOPT_CU_BIND(CtxSynchronize, 2000);
      FUSEDOPT_CU_BIND(DevicePrimaryCtxRetain, 7000);
      FUSEDOPT_CU_BIND(DevicePrimaryCtxRelease, 11000);
      FUSEDOPT_CU_BIND(ModuleLoadData, 2000);
      FUSEDOPT_CU_BIND(ModuleGetFunction, 2000);
      FUSEDOPT_CU_BIND(ModuleUnload, 2000);
      FUSEDOPT_CU_BIND(LaunchKernel, 4000);
      FUSEDOPT_CU_BIND(FuncSetAttribute, 9000);
      FUSEDOPT_CU_BIND(OccupancyMaxActiveBlocksPerMultiprocessor, 6050);
      FUSEDOPT_CU_BIND(MemAlloc, 3020);
      FUSEDOPT_CU_BIND(MemFree, 3020);
      FUSEDOPT_CU_BIND(MemcpyHtoD, 3020);
      FUSEDOPT_CU_BIND(MemcpyDtoH, 3020);
      FUSEDOPT_CU_BIND(MemcpyHtoDAsync, 3020);
      FUSEDOPT_CU_BIND(MemcpyDtoDAsync, 3020);
      FUSEDOPT_CU_BIND(MemsetD32Async, 3020);
      FUSEDOPT_CU_BIND(MemsetD8Async, 3020);
      FUSEDOPT_CU_BIND(StreamCreate, 2000);
      FUSEDOPT_CU_BIND(StreamDestroy, 4000);
      FUSEDOPT_CU_BIND(StreamSynchronize, 2000);
      FUSEDOPT_CU_BIND(PointerGetAttribute, 4000);
      FUSEDOPT_CU_BIND(StreamBeginCapture, 10010);
      FUSEDOPT_CU_BIND(StreamEndCapture, 10000);
      FUSEDOPT_CU_BIND(StreamIsCapturing, 10000);
      FUSEDOPT_CU_BIND_AS(GraphInstantiate, cuGraphInstantiateWithFlags, 11040,
                          "cuGraphInstantiateWithFlags");
      FUSEDOPT_CU_BIND(GraphLaunch, 10000);
      FUSEDOPT_CU_BIND(GraphDestroy, 10000);
      FUSEDOPT_CU_BIND(GraphExecDestroy, 10000);
      FUSEDOPT_CU_BIND(EventCreate, 2000);
      FUSEDOPT_CU_BIND(EventRecord, 2000);
      FUSEDOPT_CU_BIND(EventQuery, 2000);
      FUSEDOPT_CU_BIND(EventSynchronize, 2000);
      FUSEDOPT_CU_BIND(EventDestroy, 4000);
    } catch (const Error& e) {
      l.failure = e.what();
      return;
    }
    // fusedopt's emulator says what it is: its modules are emulator images (Target::emu).
    l.api.emulator = l.lib->symbol("fusedopt_cuda_emulator") != nullptr;
    l.init_result = l.api.Init(0);
    if (l.init_result == CUDA_SUCCESS) {
      if (l.api.DriverGetVersion(&l.api.driver_version) != CUDA_SUCCESS) l.api.driver_version = 0;
    }
  });
  return l;
}

std::string result_name(const DriverApi& api, CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (!api.GetErrorName || api.GetErrorName(r, &name) != CUDA_SUCCESS || !name) {
    // The toolkit's stub libcuda.so cannot even name its own error.
    name = r == CUDA_ERROR_STUB_LIBRARY ? "CUDA_ERROR_STUB_LIBRARY" : "CUDA_ERROR_UNKNOWN_CODE";
    if (r == CUDA_ERROR_STUB_LIBRARY)
      text = "the CUDA toolkit's stub libcuda.so was loaded, not a driver";
  }
  if (!text && (!api.GetErrorString || api.GetErrorString(r, &text) != CUDA_SUCCESS || !text))
    text = "";
  return *text ? fmt::format("{}: {}", name, text) : std::string(name);
}

}  // namespace

const DriverApi& driver() {
  Loaded& l = loaded();
  if (!l.failure.empty()) throw UnavailableError(l.failure);
  if (l.init_result != CUDA_SUCCESS) {
    throw CudaError("cuInit", static_cast<int>(l.init_result), result_name(l.api, l.init_result),
                    "fusedopt CUDA driver loader");
  }
  return l.api;
}

void check(CUresult r, const char* call, const char* file, int line) {
  if (r == CUDA_SUCCESS) return;
  const Loaded& l = loaded();
  throw CudaError(call, static_cast<int>(r), result_name(l.api, r),
                  fmt::format("{}:{}", file, line));
}

bool cuda_device_available(std::string* why) {
  try {
    int count = device_count();
    if (count > 0) return true;
    if (why) *why = "the CUDA driver reports 0 devices";
  } catch (const Error& e) {
    if (why) *why = e.what();
  }
  return false;
}

bool driver_is_emulator() { return driver().emulator; }

int device_count() {
  int count = 0;
  FUSEDOPT_CU_CHECK(DeviceGetCount, &count);
  return count;
}

namespace {
int attribute(int device, CUdevice_attribute attr, const char* what) {
  CUdevice dev = 0;
  FUSEDOPT_CU_CHECK(DeviceGet, &dev, device);
  int value = 0;
  check(driver().DeviceGetAttribute(&value, attr, dev),
        fmt::format("cuDeviceGetAttribute({})", what).c_str(), __FILE__, __LINE__);
  return value;
}
}  // namespace

int device_sm(int device) {
  return attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                   "COMPUTE_CAPABILITY_MAJOR") *
             10 +
         attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                   "COMPUTE_CAPABILITY_MINOR");
}

int device_sm_count(int device) {
  return attribute(device, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "MULTIPROCESSOR_COUNT");
}

PrimaryContext::PrimaryContext(int device) : device_(device) {
  const int count = device_count();
  FUSEDOPT_CHECK_AVAILABLE(!(device < 0 || device >= count),
                           "CUDA device {} does not exist ({} device{})", device, count,
                           count == 1 ? "" : "s");
  CUdevice dev = 0;
  FUSEDOPT_CU_CHECK(DeviceGet, &dev, device);
  CUcontext ctx = nullptr;
  FUSEDOPT_CU_CHECK(DevicePrimaryCtxRetain, &ctx, dev);
  ctx_ = ctx;
  try {
    make_current();
  } catch (...) {
    driver().DevicePrimaryCtxRelease(dev);
    throw;
  }
}

PrimaryContext::~PrimaryContext() {
  // Never throws: a release failure at teardown has no one to report to.
  const DriverApi& api = loaded().api;
  CUdevice dev = 0;
  if (api.DeviceGet(&dev, device_) == CUDA_SUCCESS) api.DevicePrimaryCtxRelease(dev);
}

void PrimaryContext::make_current() const {
  CUcontext current = nullptr;
  FUSEDOPT_CU_CHECK(CtxGetCurrent, &current);
  if (current != static_cast<CUcontext>(ctx_))
    FUSEDOPT_CU_CHECK(CtxSetCurrent, static_cast<CUcontext>(ctx_));
}

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  CUdeviceptr p = 0;
  FUSEDOPT_CU_CHECK(MemAlloc, &p, bytes);
  ptr_ = p;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) loaded().api.MemFree(static_cast<CUdeviceptr>(ptr_));  // never throws
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, 0)), bytes_(std::exchange(o.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) loaded().api.MemFree(static_cast<CUdeviceptr>(ptr_));
    ptr_ = std::exchange(o.ptr_, 0);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void copy_to_device(DevicePtr dst, const void* src, std::size_t bytes) {
  if (bytes) FUSEDOPT_CU_CHECK(MemcpyHtoD, static_cast<CUdeviceptr>(dst), src, bytes);
}
void copy_to_host(void* dst, DevicePtr src, std::size_t bytes) {
  if (bytes) FUSEDOPT_CU_CHECK(MemcpyDtoH, dst, static_cast<CUdeviceptr>(src), bytes);
}
void copy_to_device_async(DevicePtr dst, const void* src, std::size_t bytes, Stream stream) {
  if (bytes) {
    FUSEDOPT_CU_CHECK(MemcpyHtoDAsync, static_cast<CUdeviceptr>(dst), src, bytes,
                      static_cast<CUstream>(stream));
  }
}
void copy_on_device_async(DevicePtr dst, DevicePtr src, std::size_t bytes, Stream stream) {
  if (bytes) {
    FUSEDOPT_CU_CHECK(MemcpyDtoDAsync, static_cast<CUdeviceptr>(dst), static_cast<CUdeviceptr>(src),
                      bytes, static_cast<CUstream>(stream));
  }
}
void memset32_async(DevicePtr dst, unsigned value, std::size_t count, Stream stream) {
  if (count) {
    FUSEDOPT_CU_CHECK(MemsetD32Async, static_cast<CUdeviceptr>(dst), value, count,
                      static_cast<CUstream>(stream));
  }
}
void memset8_async(DevicePtr dst, unsigned char value, std::size_t count, Stream stream) {
  if (count) {
    FUSEDOPT_CU_CHECK(MemsetD8Async, static_cast<CUdeviceptr>(dst), value, count,
                      static_cast<CUstream>(stream));
  }
}
void synchronize(Stream stream) {
  FUSEDOPT_CU_CHECK(StreamSynchronize, static_cast<CUstream>(stream));
}
void context_synchronize() {
  check(driver().CtxSynchronize(), "cuCtxSynchronize", __FILE__, __LINE__);
}

SavedCurrentContext::SavedCurrentContext() {
  CUcontext previous = nullptr;
  FUSEDOPT_CU_CHECK(CtxGetCurrent, &previous);
  previous_ = previous;
}
SavedCurrentContext::~SavedCurrentContext() {
  try {
    const DriverApi& api = driver();
    CUcontext now = nullptr;
    if (api.CtxGetCurrent(&now) == CUDA_SUCCESS && now != static_cast<CUcontext>(previous_)) {
      api.CtxSetCurrent(static_cast<CUcontext>(previous_));
    }
  } catch (const Error&) {
  }
}

ContextScope::ContextScope(const PrimaryContext& context) {
  CUcontext previous = nullptr;
  FUSEDOPT_CU_CHECK(CtxGetCurrent, &previous);
  previous_ = previous;
  context.make_current();
}
ContextScope::~ContextScope() {
  try {
    const DriverApi& api = driver();  // loaded: the constructor succeeded
    CUcontext now = nullptr;
    if (api.CtxGetCurrent(&now) == CUDA_SUCCESS && now != static_cast<CUcontext>(previous_)) {
      api.CtxSetCurrent(static_cast<CUcontext>(previous_));
    }
  } catch (const Error&) {
    // A destructor must not throw; the driver was loaded when the scope began.
  }
}

Stream stream_create() {
  CUstream s = nullptr;
  FUSEDOPT_CU_CHECK(StreamCreate, &s, CU_STREAM_NON_BLOCKING);
  return s;
}
void stream_destroy(Stream stream) {
  if (stream) FUSEDOPT_CU_CHECK(StreamDestroy, static_cast<CUstream>(stream));
}

void begin_capture(Stream stream) {
  FUSEDOPT_CU_CHECK(StreamBeginCapture, static_cast<CUstream>(stream),
                    CU_STREAM_CAPTURE_MODE_GLOBAL);
}
Graph end_capture(Stream stream) {
  CUgraph g = nullptr;
  FUSEDOPT_CU_CHECK(StreamEndCapture, static_cast<CUstream>(stream), &g);
  return g;
}
GraphExec graph_instantiate(Graph graph) {
  CUgraphExec e = nullptr;
  FUSEDOPT_CU_CHECK(GraphInstantiate, &e, static_cast<CUgraph>(graph), 0ULL);
  return e;
}
void graph_launch(GraphExec exec, Stream stream) {
  FUSEDOPT_CU_CHECK(GraphLaunch, static_cast<CUgraphExec>(exec), static_cast<CUstream>(stream));
}
void graph_destroy(Graph graph) {
  if (graph) FUSEDOPT_CU_CHECK(GraphDestroy, static_cast<CUgraph>(graph));
}
void graph_exec_destroy(GraphExec exec) {
  if (exec) FUSEDOPT_CU_CHECK(GraphExecDestroy, static_cast<CUgraphExec>(exec));
}

Event event_create() {
  CUevent e = nullptr;
  FUSEDOPT_CU_CHECK(EventCreate, &e, CU_EVENT_DISABLE_TIMING);
  return e;
}
void event_record(Event event, Stream stream) {
  FUSEDOPT_CU_CHECK(EventRecord, static_cast<CUevent>(event), static_cast<CUstream>(stream));
}
bool event_query(Event event) {
  const CUresult r = driver().EventQuery(static_cast<CUevent>(event));
  if (r == CUDA_ERROR_NOT_READY) return false;
  check(r, "cuEventQuery", __FILE__, __LINE__);
  return true;
}
void event_synchronize(Event event) {
  FUSEDOPT_CU_CHECK(EventSynchronize, static_cast<CUevent>(event));
}
void event_destroy(Event event) {
  if (event) FUSEDOPT_CU_CHECK(EventDestroy, static_cast<CUevent>(event));
}

}  // namespace fusedopt::runtime::cuda
