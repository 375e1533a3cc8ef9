// The CUDA driver API, loaded with dlopen ("libcuda.so.1"), so fusedopt builds and runs on
// machines without a GPU. The upper half is free of <cuda.h> (callers such as tests need
// no CUDA include path): opaque handles, RAII device memory and a primary context, and
// thin wrappers that throw CudaError. The lower half, for fusedopt's own CUDA code, is the
// raw function table with <cuda.h> types and the FUSEDOPT_CU_CHECK helper.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fusedopt::runtime::cuda {

using DevicePtr = std::uint64_t;  ///< CUdeviceptr
using Stream = void*;             ///< CUstream (nullptr: the legacy default stream)
using Graph = void*;              ///< CUgraph
using GraphExec = void*;          ///< CUgraphExec
using Event = void*;              ///< CUevent

/// True when libcuda loads, cuInit succeeds and there is at least one device; otherwise
/// false with the reason in `*why` (never throws).
bool cuda_device_available(std::string* why = nullptr);
/// True when the loaded driver is fusedopt's CUDA emulator (libfusedopt-cuda-emu.so, through
/// FUSEDOPT_CUDA_DRIVER_LIBRARY): kernels are then built for Target::emu(), not for an
/// sm_XX. Throws like device_count when the driver is unusable.
bool driver_is_emulator();
/// Number of CUDA devices. Throws CudaError / Error when the driver is unusable.
int device_count();
/// Compute capability as major * 10 + minor (90 for a 9.0 device).
int device_sm(int device);
/// Number of streaming multiprocessors.
int device_sm_count(int device);

/// A retained primary context of one device (cuDevicePrimaryCtxRetain), released on
/// destruction. The constructor makes it current on the calling thread (so tests can
/// allocate right away); make_current() binds it again later.
class PrimaryContext {
 public:
  explicit PrimaryContext(int device);
  ~PrimaryContext();
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;
  /// Makes this context current on the calling thread (a no-op when it already is).
  void make_current() const;
  int device() const { return device_; }

 private:
  int device_;
  void* ctx_ = nullptr;  // CUcontext
};

/// Makes `context` current for a scope and puts the thread's previous context back at the
/// end, so library calls never leave the caller bound to a context it did not ask for.
class ContextScope {
 public:
  explicit ContextScope(const PrimaryContext& context);
  ~ContextScope();
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  void* previous_ = nullptr;  // CUcontext
};

/// Remembers the thread's current context and makes it current again at scope exit.
class SavedCurrentContext {
 public:
  SavedCurrentContext();
  ~SavedCurrentContext();
  SavedCurrentContext(const SavedCurrentContext&) = delete;
  SavedCurrentContext& operator=(const SavedCurrentContext&) = delete;

 private:
  void* previous_ = nullptr;  // CUcontext
};

/// Device memory from cuMemAlloc, freed on destruction. The primary context of the device
/// must be current when it is created and destroyed.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DevicePtr get() const { return ptr_; }
  std::size_t size() const { return bytes_; }

 private:
  DevicePtr ptr_ = 0;
  std::size_t bytes_ = 0;
};

// Synchronous and stream-ordered copies (throw CudaError). A synchronous copy runs on the
// legacy default stream: synchronize a non-blocking stream first.
void copy_to_device(DevicePtr dst, const void* src, std::size_t bytes);
void copy_to_host(void* dst, DevicePtr src, std::size_t bytes);
void copy_to_device_async(DevicePtr dst, const void* src, std::size_t bytes, Stream stream);
void copy_on_device_async(DevicePtr dst, DevicePtr src, std::size_t bytes, Stream stream);
void memset32_async(DevicePtr dst, unsigned value, std::size_t count, Stream stream);
void memset8_async(DevicePtr dst, unsigned char value, std::size_t count, Stream stream);
void synchronize(Stream stream);
/// Waits for all work of the current context, on every stream (cuCtxSynchronize).
void context_synchronize();
Stream stream_create();  ///< a non-blocking stream
void stream_destroy(Stream stream);

// Stream capture into a CUDA graph (cuStreamBeginCapture in global mode).
void begin_capture(Stream stream);
Graph end_capture(Stream stream);
GraphExec graph_instantiate(Graph graph);
void graph_launch(GraphExec exec, Stream stream);
void graph_destroy(Graph graph);
void graph_exec_destroy(GraphExec exec);

// Events, for telling when the work queued on a stream before them is done. Created in the
// current context, without timing (cheaper to record and query).
Event event_create();
void event_record(Event event, Stream stream);
/// True when the work the event was recorded after is complete (or it was never recorded),
/// false while it is not (CUDA_ERROR_NOT_READY); throws CudaError for any other result.
bool event_query(Event event);
void event_synchronize(Event event);
void event_destroy(Event event);

}  // namespace fusedopt::runtime::cuda

#if FUSEDOPT_HAVE_CUDA
#include <cuda.h>

namespace fusedopt::runtime::cuda {

/// The driver entry points fusedopt uses, with the ABI of the <cuda.h> it was built with
/// (cuMemAlloc is cuMemAlloc_v2, cuGraphInstantiate is cuGraphInstantiateWithFlags, ...).
struct DriverApi {
  int driver_version = 0;  ///< cuDriverGetVersion, e.g. 13000
  bool emulator = false;   ///< fusedopt's CUDA emulator (it exports fusedopt_cuda_emulator)
  decltype(&::cuInit) Init = nullptr;
  decltype(&::cuDriverGetVersion) DriverGetVersion = nullptr;
  decltype(&::cuDeviceGet) DeviceGet = nullptr;
  decltype(&::cuDeviceGetCount) DeviceGetCount = nullptr;
  decltype(&::cuDeviceGetAttribute) DeviceGetAttribute = nullptr;
  decltype(&::cuCtxGetCurrent) CtxGetCurrent = nullptr;
  decltype(&::cuCtxSetCurrent) CtxSetCurrent = nullptr;
  decltype(&::cuCtxSynchronize) CtxSynchronize = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) DevicePrimaryCtxRetain = nullptr;
  decltype(&::cuDevicePrimaryCtxRelease) DevicePrimaryCtxRelease = nullptr;
  decltype(&::cuModuleLoadData) ModuleLoadData = nullptr;
  decltype(&::cuModuleGetFunction) ModuleGetFunction = nullptr;
  decltype(&::cuModuleUnload) ModuleUnload = nullptr;
  decltype(&::cuLaunchKernel) LaunchKernel = nullptr;
  decltype(&::cuFuncSetAttribute) FuncSetAttribute = nullptr;
  decltype(&::cuOccupancyMaxActiveBlocksPerMultiprocessor)
      OccupancyMaxActiveBlocksPerMultiprocessor = nullptr;
  decltype(&::cuMemAlloc) MemAlloc = nullptr;
  decltype(&::cuMemFree) MemFree = nullptr;
  decltype(&::cuMemcpyHtoD) MemcpyHtoD = nullptr;
  decltype(&::cuMemcpyDtoH) MemcpyDtoH = nullptr;
  decltype(&::cuMemcpyHtoDAsync) MemcpyHtoDAsync = nullptr;
  decltype(&::cuMemcpyDtoDAsync) MemcpyDtoDAsync = nullptr;
  decltype(&::cuMemsetD32Async) MemsetD32Async = nullptr;
  decltype(&::cuMemsetD8Async) MemsetD8Async = nullptr;
  decltype(&::cuStreamCreate) StreamCreate = nullptr;
  decltype(&::cuStreamDestroy) StreamDestroy = nullptr;
  decltype(&::cuStreamSynchronize) StreamSynchronize = nullptr;
  decltype(&::cuPointerGetAttribute) PointerGetAttribute = nullptr;
  decltype(&::cuStreamBeginCapture) StreamBeginCapture = nullptr;
  decltype(&::cuStreamEndCapture) StreamEndCapture = nullptr;
  decltype(&::cuStreamIsCapturing) StreamIsCapturing = nullptr;
  decltype(&::cuGraphInstantiate) GraphInstantiate = nullptr;
  decltype(&::cuGraphLaunch) GraphLaunch = nullptr;
  decltype(&::cuGraphDestroy) GraphDestroy = nullptr;
  decltype(&::cuGraphExecDestroy) GraphExecDestroy = nullptr;
  decltype(&::cuEventCreate) EventCreate = nullptr;
  decltype(&::cuEventRecord) EventRecord = nullptr;
  decltype(&::cuEventQuery) EventQuery = nullptr;
  decltype(&::cuEventSynchronize) EventSynchronize = nullptr;
  decltype(&::cuEventDestroy) EventDestroy = nullptr;
  decltype(&::cuGetErrorName) GetErrorName = nullptr;
  decltype(&::cuGetErrorString) GetErrorString = nullptr;
};

/// The loaded and initialised driver (cuInit(0) done). Throws fusedopt::Error when libcuda
/// is missing or lacks an entry point, CudaError when cuInit fails.
const DriverApi& driver();

/// Throws CudaError(call, result, its name and description, site) unless r is CUDA_SUCCESS.
void check(CUresult r, const char* call, const char* file, int line);

}  // namespace fusedopt::runtime::cuda

/// Calls driver().NAME(args...) and throws CudaError naming cuNAME, the result and file:line.
#define FUSEDOPT_CU_CHECK(NAME, ...)                                                      \
  ::fusedopt::runtime::cuda::check(::fusedopt::runtime::cuda::driver().NAME(__VA_ARGS__), \
                                   "cu" #NAME, __FILE__, __LINE__)
#endif  // FUSEDOPT_HAVE_CUDA
