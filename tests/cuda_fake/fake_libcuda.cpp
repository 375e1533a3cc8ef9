// A stand-in for libcuda.so.1 (loaded through FUSEDOPT_CUDA_DRIVER_LIBRARY) so that the host
// side of the CUDA runtime runs on machines without a GPU: one device of compute capability
// 9.0 with 132 SMs whose "device memory" is host memory, modules that are never executed
// (a launch does nothing), events that are complete as soon as they are recorded, and a log
// of every call for tests to inspect (fake_cuda_log).
// Of fusedopt it knows only the launch ABI (abi.h), to log what a fusedopt_* launch asks
// for: " check" (pass 0 counts non-finite gradients), " skip" (does nothing when the device
// flag is set), " scale" (divides by a device GradScaler's scale).
#include <cuda.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "abi.h"

namespace {

struct State {
  std::mutex mutex;
  std::string log;  // one line per call: "name arg..."
  std::map<std::string, long long> settings = {
      {"driver_version", 13000}, {"cc_major", 9},     {"cc_minor", 0},        {"sm_count", 132},
      {"blocks_per_sm", 2},      {"refuse_cubin", 0}, {"event_not_ready", 0}, {"event_error", 0}};
  std::set<CUdeviceptr> allocations;
  std::map<CUdeviceptr, size_t> sizes;
  std::map<CUfunction, std::string> function_names;
  std::set<CUstream> capturing;
  int next_handle = 1;
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

thread_local CUcontext current = nullptr;
CUcontext const kPrimary = reinterpret_cast<CUcontext>(0x1000);

bool owned(CUdeviceptr p) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.sizes.upper_bound(p);
  if (it == s.sizes.begin()) return false;
  --it;
  return p >= it->first && p < it->first + it->second;
}

/// What a fusedopt launch asks for, from its parameters (see the top of this file).
std::string launch_flags(const std::string& name, void** params) {
  if (params == nullptr || name.rfind("fusedopt_", 0) != 0) return "";
  if (name == "fusedopt_update_scale") return "";
  if (name == "fusedopt_advance_step") {
    return *static_cast<const CUdeviceptr*>(params[1]) != 0 ? " skip" : "";  // (step, skip)
  }
  const fo_launch& L = *static_cast<const fo_launch*>(params[0]);
  std::string out;
  if (L.check_grads) out += " check";
  if (L.skip_if_set) out += " skip";
  if (L.grad_scale_ptr) out += " scale";
  return out;
}

}  // namespace

extern "C" {

// ---- the test's side ---------------------------------------------------------------------

/// Every call since the last fake_cuda_reset(), one per line.
__attribute__((visibility("default"))) const char* fake_cuda_log() {
  static thread_local std::string copy;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  copy = s.log;
  return copy.c_str();
}
__attribute__((visibility("default"))) void fake_cuda_reset() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.log.clear();
}
/// driver_version, cc_major, cc_minor, sm_count, blocks_per_sm, refuse_cubin (1: a CUBIN
/// image fails to load with CUDA_ERROR_NO_BINARY_FOR_GPU; PTX text loads), event_not_ready
/// (1: cuEventQuery says CUDA_ERROR_NOT_READY, as for work still running), event_error (a
/// CUresult cuEventQuery returns instead, as after a failed kernel).
__attribute__((visibility("default"))) void fake_cuda_set(const char* name, long long value) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.settings[name] = value;
}

// ---- the driver API (the names <cuda.h> maps to: cuMemAlloc is cuMemAlloc_v2, ...) -------

CUresult CUDAAPI cuGetErrorName(CUresult error, const char** str) {
  *str = error == CUDA_ERROR_NO_BINARY_FOR_GPU ? "CUDA_ERROR_NO_BINARY_FOR_GPU"
         : error == CUDA_ERROR_LAUNCH_FAILED   ? "CUDA_ERROR_LAUNCH_FAILED"
                                               : "CUDA_ERROR_FAKE";
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuGetErrorString(CUresult, const char** str) {
  *str = "the fake driver refused";
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuInit(unsigned int) { return CUDA_SUCCESS; }
CUresult CUDAAPI cuDriverGetVersion(int* v) {
  *v = static_cast<int>(setting("driver_version"));
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDeviceGet(CUdevice* d, int ordinal) {
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *d = 0;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDeviceGetCount(int* n) {
  *n = 1;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice) {
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      *v = static_cast<int>(setting("cc_major"));
      break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      *v = static_cast<int>(setting("cc_minor"));
      break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      *v = static_cast<int>(setting("sm_count"));
      break;
    default:
      *v = 0;
  }
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuCtxGetCurrent(CUcontext* c) {
  *c = current;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuCtxSetCurrent(CUcontext c) {
  current = c;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuCtxSynchronize() {
  note("cuCtxSynchronize");
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice) {
  *c = kPrimary;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice) { return CUDA_SUCCESS; }
CUresult CUDAAPI cuModuleLoadData(CUmodule* m, const void* image) {
  const bool elf = std::memcmp(image,
                               "\x7f"
                               "ELF",
                               4) == 0;
  note(std::string("cuModuleLoadData ") + (elf ? "cubin" : "ptx"));
  if (elf && setting("refuse_cubin") != 0) return CUDA_ERROR_NO_BINARY_FOR_GPU;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  *m = reinterpret_cast<CUmodule>(static_cast<std::uintptr_t>(0x2000 + s.next_handle++));
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuModuleGetFunction(CUfunction* f, CUmodule, const char* name) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  *f = reinterpret_cast<CUfunction>(static_cast<std::uintptr_t>(0x100000 + s.next_handle++));
  s.function_names[*f] = name;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuModuleUnload(CUmodule) { return CUDA_SUCCESS; }
CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned gx, unsigned, unsigned, unsigned bx,
                                unsigned, unsigned, unsigned, CUstream stream, void** params,
                                void**) {
  std::string name;
  {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    name = s.function_names[f];
  }
  note("cuLaunchKernel " + name + " grid " + std::to_string(gx) + " block " + std::to_string(bx) +
       (stream ? " stream" : " legacy") + launch_flags(name, params));
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuFuncSetAttribute(CUfunction, CUfunction_attribute, int) { return CUDA_SUCCESS; }
CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessor(int* n, CUfunction, int, size_t) {
  *n = static_cast<int>(setting("blocks_per_sm"));
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemAlloc(CUdeviceptr* p, size_t bytes) {
  void* mem = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!mem) return CUDA_ERROR_OUT_OF_MEMORY;
  *p = reinterpret_cast<CUdeviceptr>(mem);
  {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.sizes[*p] = bytes;
  }
  note("cuMemAlloc " + std::to_string(bytes));
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemFree(CUdeviceptr p) {
  {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.sizes.erase(p);
  }
  std::free(reinterpret_cast<void*>(p));
  note("cuMemFree");
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dst, const void* src, size_t n) {
  std::memcpy(reinterpret_cast<void*>(dst), src, n);
  note("cuMemcpyHtoD " + std::to_string(n));
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t n) {
  std::memcpy(dst, reinterpret_cast<const void*>(src), n);
  note("cuMemcpyDtoH " + std::to_string(n));
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t n, CUstream) {
  std::memcpy(reinterpret_cast<void*>(dst), src, n);
  note("cuMemcpyHtoDAsync " + std::to_string(n));
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream) {
  std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
  note("cuMemcpyDtoDAsync " + std::to_string(n));
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream) {
  auto* p = reinterpret_cast<unsigned int*>(dst);
  for (size_t i = 0; i < n; ++i) p[i] = v;
  note("cuMemsetD32Async " + std::to_string(n));
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream) {
  std::memset(reinterpret_cast<void*>(dst), v, n);
  note("cuMemsetD8Async " + std::to_string(n));
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuStreamCreate(CUstream* s, unsigned int) {
  *s = reinterpret_cast<CUstream>(new char);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuStreamDestroy(CUstream s) {
  delete reinterpret_cast<char*>(s);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuStreamSynchronize(CUstream s) {
  note(s ? "cuStreamSynchronize stream" : "cuStreamSynchronize legacy");
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuPointerGetAttribute(void* data, CUpointer_attribute a, CUdeviceptr p) {
  if (!owned(p)) return CUDA_ERROR_INVALID_VALUE;
  if (a == CU_POINTER_ATTRIBUTE_MEMORY_TYPE) {
    *static_cast<unsigned int*>(data) = CU_MEMORYTYPE_DEVICE;
  } else if (a == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) {
    *static_cast<int*>(data) = 0;
  } else {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuStreamBeginCapture(CUstream s, CUstreamCaptureMode) {
  note("cuStreamBeginCapture");
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mutex);
  st.capturing.insert(s);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus* status) {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mutex);
  *status = st.capturing.count(s) ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuStreamEndCapture(CUstream s, CUgraph* g) {
  {
    State& st = state();
    std::lock_guard<std::mutex> lock(st.mutex);
    st.capturing.erase(s);
  }
  *g = reinterpret_cast<CUgraph>(new char);
  note("cuStreamEndCapture");
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuGraphInstantiate(CUgraphExec* e, CUgraph, unsigned long long) {
  *e = reinterpret_cast<CUgraphExec>(new char);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuGraphLaunch(CUgraphExec, CUstream) {
  note("cuGraphLaunch");
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuGraphDestroy(CUgraph g) {
  delete reinterpret_cast<char*>(g);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec e) {
  delete reinterpret_cast<char*>(e);
  return CUDA_SUCCESS;
}
// Nothing runs, so an event is complete as soon as it is recorded (unless a test says
// otherwise: event_not_ready, event_error).
CUresult CUDAAPI cuEventCreate(CUevent* e, unsigned int flags) {
  *e = reinterpret_cast<CUevent>(new char);
  note("cuEventCreate " + std::to_string(flags));
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuEventRecord(CUevent, CUstream stream) {
  note(stream ? "cuEventRecord stream" : "cuEventRecord legacy");
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuEventQuery(CUevent) {
  note("cuEventQuery");
  if (const long long e = setting("event_error")) return static_cast<CUresult>(e);
  return setting("event_not_ready") ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
CUresult CUDAAPI cuEventSynchronize(CUevent) {
  note("cuEventSynchronize");
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuEventDestroy(CUevent e) {
  delete reinterpret_cast<char*>(e);
  note("cuEventDestroy");
  return CUDA_SUCCESS;
}

}  // extern "C"
