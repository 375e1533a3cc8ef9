// fusedopt's CUDA emulator: a CUDA driver (libfusedopt-cuda-emu.so, loaded in place of
// libcuda.so.1 through FUSEDOPT_CUDA_DRIVER_LIBRARY) that RUNS kernels on the CPU. One
// device, "sm_90-like": compute capability 9.0, FUSEDOPT_EMU_SMS multiprocessors (default 4),
// H100 limits for blocks, grids and shared memory. Its device memory is host memory, tracked
// so that every kernel access and copy is checked. Streams are lazy: work queued on a
// stream runs only when something waits for it (a stream or event synchronisation, a
// synchronous copy on the legacy stream, the implicit order between the legacy stream and
// blocking streams, a free), the latest a GPU may run it, so a missing synchronisation shows
// as stale data (FUSEDOPT_EMU_STREAMS=eager runs each operation when it is issued). A
// synchronous copy from the host returns with its bytes staged and the copy queued on the
// legacy stream, as from pageable memory on a GPU. Stream capture records operations and a
// graph launch replays them. Modules are emulator images (Target::emu: the CUDA source
// compiled by the host compiler with cuda_emu.h); a CUBIN or PTX is refused as a real GPU
// refuses another architecture's code. Errors come back as the CUresult the real driver
// gives (bad handles, launches past limits, use after free, calls without a current context,
// unsafe calls during a global capture), and a kernel that reads or writes outside every
// live allocation, makes a misaligned vector access or leaves a barrier unmatched fails with
// a report (cuGetErrorString and stderr) naming kernel, block, thread and address; like a
// GPU's, the failure is returned by the call that ran the work (a synchronisation).
//
// Limits: nothing about timing, occupancy or the memory model (warps, races between
// threads between barriers, caches) is emulated; math comes from the host's libm.
#include <cuda.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "emu/driver_state.hpp"

#define FO_EMU_DRIVER 1
#include "cuda_emu.h"

namespace emu = fusedopt::emu;

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

// ---- entry points by version (cuGetProcAddress) --------------------------------------------

namespace {
/// The entry points whose variant depends on the CUDA version asked for, as the real driver
/// hands them out (cudaTypedefs.h's PFN_<name>_v<version>): the newest variant up to that
/// version. Every other name is its own one variant. The pre-3.2 32-bit memory calls and
/// the like are not emulated: asked for below their first emulated version, they are missing.
struct Variant {
  const char* base;
  int since;  // CUDA version, 1000 * major + 10 * minor
  const char* exported;
};
constexpr Variant kVariants[] = {
    {"cuCtxSynchronize", 2000, "cuCtxSynchronize"},
    {"cuCtxSynchronize", 13000, "cuCtxSynchronize_v2"},  // takes the CUcontext
    {"cuDevicePrimaryCtxRelease", 11000, "cuDevicePrimaryCtxRelease_v2"},
    {"cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2"},
    {"cuMemAlloc", 3020, "cuMemAlloc_v2"},
    {"cuMemFree", 3020, "cuMemFree_v2"},
    {"cuMemcpyHtoD", 3020, "cuMemcpyHtoD_v2"},
    {"cuMemcpyDtoH", 3020, "cuMemcpyDtoH_v2"},
    {"cuMemcpyHtoDAsync", 3020, "cuMemcpyHtoDAsync_v2"},
    {"cuMemcpyDtoDAsync", 3020, "cuMemcpyDtoDAsync_v2"},
    {"cuStreamDestroy", 4000, "cuStreamDestroy_v2"},
    {"cuEventDestroy", 4000, "cuEventDestroy_v2"},
    {"cuStreamBeginCapture", 10010, "cuStreamBeginCapture_v2"},
};
}  // namespace

/// cuGetProcAddress (cuGetProcAddress_v2): `symbol` (the unversioned name) in the variant of
/// CUDA `version`, looked up among this library's own exports.
FO_EMU_API CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int version,
                                             cuuint64_t /*flags*/,
                                             CUdriverProcAddressQueryResult* status) {
  if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  const char* name = symbol;
  bool versioned = false;
  int best = -1;
  for (const Variant& v : kVariants) {
    if (std::strcmp(v.base, symbol) != 0) continue;
    versioned = true;
    if (v.since <= version && v.since > best) {
      best = v.since;
      name = v.exported;
    }
  }
  const auto answer = [&](CUdriverProcAddressQueryResult st) {
    if (status) *status = st;
    return st == CU_GET_PROC_ADDRESS_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
  };
  if (versioned && best < 0) return answer(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  Dl_info self{};
  if (dladdr(reinterpret_cast<void*>(&fusedopt_cuda_emulator), &self) == 0 || !self.dli_fname)
    return answer(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  void* lib = dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  if (!lib) return answer(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  *pfn = dlsym(lib, name);
  dlclose(lib);  // RTLD_NOLOAD took a reference: give it back (the library stays loaded)
  return answer(*pfn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
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
  if (CUresult r = emu::refuse_if_capturing(d, "cuCtxSynchronize")) return r;
  return emu::wait_all(d);
}

/// CUDA 13's cuCtxSynchronize (cuCtxSynchronize_v2): `ctx`, or the current context when null.
FO_EMU_API CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
  if (ctx == nullptr) return cuCtxSynchronize();
  FO_LOCK;
  if (CUresult r = emu::need_init(d)) return r;
  if (ctx != emu::kPrimary) return CUDA_ERROR_INVALID_CONTEXT;
  if (d.primary_refs == 0) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  if (CUresult r = emu::refuse_if_capturing(d, "cuCtxSynchronize")) return r;
  return emu::wait_all(d);
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
  // The last release destroys the context and, with it, its memory (after its work).
  if (--d.primary_refs == 0) {
    (void)emu::wait_all(d);
    d.memory.free_all();
  }
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
  (void)emu::wait_all(d);  // queued launches of its kernels run first
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

// ---- launches -------------------------------------------------------------------------------

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
  if (!d.lazy && emu::capturing(d, stream) == nullptr) {
    // Eager streams: run now, unless the launch is refused (legacy work during a global
    // capture).
    return emu::enqueue(d, stream, [&d, fn, grid, block, params] {
      return emu::launch_now(d, *fn, grid, block, params);
    });
  }
  // Queued or captured: the argument values as they are now (as the real driver copies
  // them; a graph replays with these).
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

}  // extern "C"
