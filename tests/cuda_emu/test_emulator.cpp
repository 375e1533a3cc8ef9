// fusedopt's CUDA emulator (src/emu, loaded through FUSEDOPT_CUDA_DRIVER_LIBRARY) on test
// kernels of its own, compiled for Target::emu: what it reports (an access past an
// allocation, a misaligned vector access, a use after free, a barrier not every thread
// reaches), what it computes (block and thread indices in three dimensions, a shared-memory
// tree reduction against float64, __syncthreads_or), its block and thread orders (a seed
// replays them, other seeds change them, a missing barrier shows as NaN), stream capture
// and graph replay, and the CUresults the real driver gives for bad calls.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/requirements.hpp"
#include "compile/compiler.hpp"
#include "device/cuda_driver.hpp"
#include "fusedopt/cuda.hpp"
#include "fusedopt/target.hpp"

namespace fusedopt::testing {

using namespace fusedopt;
namespace cu = fusedopt::runtime::cuda;

namespace {

const char* const kKernels = R"(
extern "C" __global__ void copy_upto(const float* x, float* y, int last) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= last) {
    const float v = x[i];
    y[i] = v;
  }
}

struct alignas(16) v4 {
  float v[4];
};
extern "C" __global__ void load4(const float* x, float* y, int offset) {
  if (threadIdx.x == 0) {
    FO_VECTOR_ACCESS(x + offset, 16, 0);
    const v4 r = *(const v4*)(x + offset);
    y[0] = r.v[0] + r.v[1] + r.v[2] + r.v[3];
  }
}

extern "C" __global__ void early_exit(float* y) {
  if (threadIdx.x < 10) return;
  __syncthreads();
  y[threadIdx.x] = 1.0f;
}

extern "C" __global__ void split_barriers(float* y) {
  if (threadIdx.x % 2) {
    y[threadIdx.x] = 1.0f;
    __syncthreads();
  } else {
    __syncthreads();
    y[threadIdx.x] = 2.0f;
  }
}

extern "C" __global__ void block_sums(const float* x, double* out, long long n) {
  __shared__ double red[256];
  double acc = 0.0;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    acc += x[i];
  red[threadIdx.x] = acc;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = red[0];
}

// block_sums without the barrier between filling `red` and reading it.
extern "C" __global__ void block_sums_racy(const float* x, double* out, long long n) {
  __shared__ double red[256];
  double acc = 0.0;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    acc += x[i];
  red[threadIdx.x] = acc;
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = red[0];
}

extern "C" __global__ void any_flag(const int* flags, int* out) {
  const int r = __syncthreads_or(flags[blockIdx.x * blockDim.x + threadIdx.x]);
  if (threadIdx.x == 0) out[blockIdx.x] = r;
}

extern "C" __global__ void indices(unsigned* out) {
  const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned i = b * (blockDim.x * blockDim.y * blockDim.z) + t;
  out[4 * i + 0] = blockIdx.x | blockIdx.y << 8 | blockIdx.z << 16;
  out[4 * i + 1] = threadIdx.x | threadIdx.y << 8 | threadIdx.z << 16;
  out[4 * i + 2] = gridDim.x | gridDim.y << 8 | gridDim.z << 16;
  out[4 * i + 3] = blockDim.x | blockDim.y << 8 | blockDim.z << 16;
}

extern "C" __global__ void last_writer(int* out) {
  out[0] = blockIdx.x * blockDim.x + threadIdx.x;
}

// `s` is written only when `write` is set (never here): a static the compiler cannot prove
// stays zero.
extern "C" __global__ void uninitialised_shared(unsigned* out, int write) {
  __shared__ unsigned s[4];
  if (write) s[threadIdx.x % 4] = 1;
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = s[1];
}

extern "C" __global__ void add(float* y, float v, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += v;
}
)";

std::string error_text(CUresult r) {
  const char* s = nullptr;
  cu::driver().GetErrorString(r, &s);
  return s ? s : "";
}

std::string hex(std::uintptr_t a) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(a));
  return buf;
}

/// The test kernels, compiled once for the emulator and loaded in the primary context.
struct Kernels {
  cu::PrimaryContext ctx{0};
  CUmodule module = nullptr;
  Kernels() {
    const std::string image =
        jit::compiler_for(Target::emu()).compile(kKernels, "emu_test_kernels.cu", Target::emu());
    FUSEDOPT_CU_CHECK(ModuleLoadData, &module, image.data());
  }
  ~Kernels() { cu::driver().ModuleUnload(module); }
  CUfunction operator[](const char* name) const {
    CUfunction f = nullptr;
    FUSEDOPT_CU_CHECK(ModuleGetFunction, &f, module, name);
    return f;
  }
};

Kernels& kernels() {
  static Kernels k;
  return k;
}

/// Launches, then (unless `wait` is false) waits for the stream: the emulator's streams are
/// lazy, so a kernel runs, and reports what it did wrong, when something waits for it.
CUresult launch(CUfunction f, unsigned grid, unsigned block, std::vector<void*> args,
                CUstream stream = nullptr, bool wait = true) {
  const CUresult r =
      cu::driver().LaunchKernel(f, grid, 1, 1, block, 1, 1, 0, stream, args.data(), nullptr);
  if (r != CUDA_SUCCESS || !wait) return r;
  return cu::driver().StreamSynchronize(stream);
}
CUresult launch(CUfunction f, unsigned grid, unsigned block, std::vector<void*> args,
                cu::Stream stream, bool wait = true) {
  return launch(f, grid, block, std::move(args), static_cast<CUstream>(stream), wait);
}

template <typename T>
std::vector<T> download(const cu::DeviceBuffer& b, std::size_t n) {
  std::vector<T> out(n);
  cu::copy_to_host(out.data(), b.get(), n * sizeof(T));
  return out;
}

template <typename T>
cu::DeviceBuffer upload(const std::vector<T>& v) {
  cu::DeviceBuffer b(v.size() * sizeof(T));
  cu::copy_to_device(b.get(), v.data(), v.size() * sizeof(T));
  return b;
}

std::vector<float> random_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

/// The emulator's own controls (the library the runtime loaded: same path, same handle).
template <typename F>
F emu_symbol(const char* name) {
  void* lib = dlopen(FUSEDOPT_CUDA_EMU, RTLD_NOW | RTLD_NOLOAD);
  REQUIRE_MESSAGE(lib != nullptr, "the emulator is not the loaded driver");
  auto f = reinterpret_cast<F>(dlsym(lib, name));
  REQUIRE_MESSAGE(reinterpret_cast<void*>(f) != nullptr, name);
  return f;
}

}  // namespace

TEST_SUITE("cuda_emu") {
  TEST_CASE("the driver is the emulator and says so" * testing::needs_cuda_device()) {
    (void)kernels();
    CHECK(cuda_device_emulated());
    CHECK(cu::driver_is_emulator());
    auto name = emu_symbol<CUresult (*)(char*, int, CUdevice)>("cuDeviceGetName");
    char text[128] = {};
    REQUIRE(name(text, sizeof text, 0) == CUDA_SUCCESS);
    CHECK(std::string(text).find("emulat") != std::string::npos);
    CHECK(cu::device_sm(0) == 90);
  }

  TEST_CASE(
      "entry points come in the variant of the CUDA version asked for, and the runtime asks "
      "for the one whose arguments it passes" *
      testing::needs_cuda_device()) {
    // A real driver answered cuGetProcAddress("cuCtxSynchronize", 13000) with CUDA 13's
    // variant, which takes a CUcontext: the runtime, asking at the headers' CUDA_VERSION and
    // calling it without one, synchronised garbage (CUDA_ERROR_CONTEXT_IS_DESTROYED on an
    // H200). The emulator answers as that driver does.
    (void)kernels();
    auto gpa = emu_symbol<PFN_cuGetProcAddress_v12000>("cuGetProcAddress_v2");
    const auto lookup = [&](const char* name, int version, CUdriverProcAddressQueryResult* st) {
      void* fn = nullptr;
      const CUresult r = gpa(name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, st);
      return r == CUDA_SUCCESS ? fn : nullptr;
    };
    CUdriverProcAddressQueryResult st{};
    void* const sync_v1 = emu_symbol<void*>("cuCtxSynchronize");
    void* const sync_v2 = emu_symbol<void*>("cuCtxSynchronize_v2");
    CHECK(lookup("cuCtxSynchronize", 13000, &st) == sync_v2);
    CHECK(st == CU_GET_PROC_ADDRESS_SUCCESS);
    CHECK(lookup("cuCtxSynchronize", 12090, &st) == sync_v1);
    CHECK(lookup("cuMemAlloc", 13000, &st) == emu_symbol<void*>("cuMemAlloc_v2"));
    CHECK(lookup("cuMemAlloc", 3000, &st) == nullptr);
    CHECK(st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    CHECK(lookup("cuNoSuchEntry", 13000, &st) == nullptr);
    CHECK(st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    // The runtime's table: the prototypes <cuda.h> declares, so the variants they name.
    const cu::DriverApi& api = cu::driver();
    CHECK(reinterpret_cast<void*>(api.CtxSynchronize) == sync_v1);
    CHECK(reinterpret_cast<void*>(api.MemAlloc) == emu_symbol<void*>("cuMemAlloc_v2"));
    CHECK(reinterpret_cast<void*>(api.DevicePrimaryCtxRelease) ==
          emu_symbol<void*>("cuDevicePrimaryCtxRelease_v2"));
    CHECK(reinterpret_cast<void*>(api.GraphInstantiate) ==
          emu_symbol<void*>("cuGraphInstantiateWithFlags"));
    // And CUDA 13's variant does what it says: a null context is the current one; another
    // context is refused.
    cu::PrimaryContext ctx(0);
    auto sync13 = reinterpret_cast<PFN_cuCtxSynchronize_v13000>(sync_v2);
    CHECK(sync13(nullptr) == CUDA_SUCCESS);
    CHECK(sync13(reinterpret_cast<CUcontext>(&st)) == CUDA_ERROR_INVALID_CONTEXT);
    CHECK_NOTHROW(cu::context_synchronize());
  }

  TEST_CASE(
      "a kernel reading one element past its allocation is reported: kernel, block, "
      "thread, address and the allocation" *
      testing::needs_cuda_device()) {
    const Kernels& k = kernels();
    const int n = 50;
    cu::DeviceBuffer x = upload(random_floats(n, 1));
    cu::DeviceBuffer y(n * sizeof(float));
    int last = n - 1;  // in bounds first: the same kernel works
    void* xp = reinterpret_cast<void*>(x.get());
    void* yp = reinterpret_cast<void*>(y.get());
    REQUIRE(launch(k["copy_upto"], 1, 64, {&xp, &yp, &last}) == CUDA_SUCCESS);
    CHECK(download<float>(y, n) == random_floats(n, 1));
    last = n;  // thread 50 reads x[50]
    const CUresult r = launch(k["copy_upto"], 1, 64, {&xp, &yp, &last});
    CHECK(r == CUDA_ERROR_ILLEGAL_ADDRESS);
    const std::string text = error_text(r);
    INFO(text);
    CHECK(text.find("copy_upto block (0,0,0) thread (50,0,0)") != std::string::npos);
    CHECK(text.find("4-byte load at " + hex(x.get() + n * sizeof(float))) != std::string::npos);
    CHECK(text.find("0 bytes past the end of a 200-byte allocation at " + hex(x.get())) !=
          std::string::npos);
    CHECK(text.find("FUSEDOPT_EMU_SEED=") != std::string::npos);
  }

  TEST_CASE(
      "a misaligned 16-byte vector load is reported with kernel, block, thread and "
      "address" *
      testing::needs_cuda_device()) {
    const Kernels& k = kernels();
    std::vector<float> v = random_floats(16, 2);
    cu::DeviceBuffer x = upload(v);
    cu::DeviceBuffer y(sizeof(float));
    void* xp = reinterpret_cast<void*>(x.get());
    void* yp = reinterpret_cast<void*>(y.get());
    int offset = 4;  // 16 bytes in: aligned
    REQUIRE(launch(k["load4"], 1, 32, {&xp, &yp, &offset}) == CUDA_SUCCESS);
    CHECK(download<float>(y, 1)[0] == doctest::Approx(v[4] + v[5] + v[6] + v[7]));
    offset = 1;
    const CUresult r = launch(k["load4"], 1, 32, {&xp, &yp, &offset});
    CHECK(r == CUDA_ERROR_MISALIGNED_ADDRESS);
    const std::string text = error_text(r);
    INFO(text);
    CHECK(text.find("load4 block (0,0,0) thread (0,0,0): 16-byte vector load at " +
                    hex(x.get() + 4) +
                    " is not aligned to 16 bytes, 4 bytes into a 64-byte "
                    "allocation") != std::string::npos);
  }

  TEST_CASE("reading freed device memory is a use after free" * testing::needs_cuda_device()) {
    const Kernels& k = kernels();
    auto x = std::make_unique<cu::DeviceBuffer>(upload(random_floats(8, 3)));
    cu::DeviceBuffer y(8 * sizeof(float));
    void* xp = reinterpret_cast<void*>(x->get());
    void* yp = reinterpret_cast<void*>(y.get());
    x.reset();
    int last = 7;
    const CUresult r = launch(k["copy_upto"], 1, 8, {&xp, &yp, &last});
    CHECK(r == CUDA_ERROR_ILLEGAL_ADDRESS);
    INFO(error_text(r));
    CHECK(error_text(r).find("use after free") != std::string::npos);
  }

  TEST_CASE(
      "a barrier that some threads never reach, or threads at different barriers, fail "
      "the launch" *
      testing::needs_cuda_device()) {
    const Kernels& k = kernels();
    cu::DeviceBuffer y(64 * sizeof(float));
    void* yp = reinterpret_cast<void*>(y.get());
    CUresult r = launch(k["early_exit"], 2, 64, {&yp});
    CHECK(r == CUDA_ERROR_LAUNCH_FAILED);
    INFO(error_text(r));
    CHECK(error_text(r).find("is reached by 54 of 64 threads") != std::string::npos);
    r = launch(k["split_barriers"], 1, 64, {&yp});
    CHECK(r == CUDA_ERROR_LAUNCH_FAILED);
    INFO(error_text(r));
    CHECK(error_text(r).find("split_barriers block (0,0,0): threads wait at different "
                             "barriers") != std::string::npos);
  }

  TEST_CASE("fresh device memory and shared memory read as NaN bytes" *
            testing::needs_cuda_device()) {
    const Kernels& k = kernels();
    cu::DeviceBuffer fresh(1000);
    for (unsigned char c : download<unsigned char>(fresh, 1000)) REQUIRE(c == 0xff);
    cu::DeviceBuffer out(3 * sizeof(unsigned));
    void* op = reinterpret_cast<void*>(out.get());
    int write = 0;
    REQUIRE(launch(k["uninitialised_shared"], 3, 32, {&op, &write}) == CUDA_SUCCESS);
    for (unsigned u : download<unsigned>(out, 3)) CHECK(u == 0xffffffffu);
  }

  TEST_CASE("block and thread indices in three dimensions" * testing::needs_cuda_device()) {
    const Kernels& k = kernels();
    const unsigned gx = 3, gy = 2, gz = 2, bx = 4, by = 3, bz = 2;
    const unsigned threads = gx * gy * gz * bx * by * bz;
    cu::DeviceBuffer out(4 * threads * sizeof(unsigned));
    void* op = reinterpret_cast<void*>(out.get());
    void* args[] = {&op};
    REQUIRE(cu::driver().LaunchKernel(k["indices"], gx, gy, gz, bx, by, bz, 0, nullptr, args,
                                      nullptr) == CUDA_SUCCESS);
    const std::vector<unsigned> got = download<unsigned>(out, 4 * threads);
    unsigned i = 0;
    for (unsigned z = 0; z < gz; ++z)
      for (unsigned y = 0; y < gy; ++y)
        for (unsigned x = 0; x < gx; ++x)
          for (unsigned tz = 0; tz < bz; ++tz)
            for (unsigned ty = 0; ty < by; ++ty)
              for (unsigned tx = 0; tx < bx; ++tx, ++i) {
                CHECK(got[4 * i + 0] == (x | y << 8 | z << 16));
                CHECK(got[4 * i + 1] == (tx | ty << 8 | tz << 16));
                CHECK(got[4 * i + 2] == (gx | gy << 8 | gz << 16));
                CHECK(got[4 * i + 3] == (bx | by << 8 | bz << 16));
              }
  }

  TEST_CASE("a shared-memory tree reduction matches float64, bit for bit across seeds" *
            testing::needs_cuda_device()) {
    const Kernels& k = kernels();
    const std::uint32_t seed = std::random_device{}();
    INFO("data seed " << seed);
    const long long n = 100003;
    const std::vector<float> v = random_floats(static_cast<std::size_t>(n), seed);
    cu::DeviceBuffer x = upload(v);
    const unsigned blocks = 6;
    cu::DeviceBuffer out(blocks * sizeof(double));
    void* xp = reinterpret_cast<void*>(x.get());
    void* op = reinterpret_cast<void*>(out.get());
    auto set_seed = emu_symbol<void (*)(unsigned long long)>("fusedopt_emu_set_seed");
    std::vector<double> first;
    for (unsigned long long order = 1; order <= 3; ++order) {
      set_seed(order);
      long long nn = n;
      REQUIRE(launch(k["block_sums"], blocks, 256, {&xp, &op, &nn}) == CUDA_SUCCESS);
      const std::vector<double> sums = download<double>(out, blocks);
      if (first.empty()) first = sums;
      CHECK(sums == first);  // a fixed tree: the order of threads changes nothing
    }
    double got = 0.0, want = 0.0;
    for (double s : first) got += s;
    for (float f : v) want += f;
    CHECK(got == doctest::Approx(want).epsilon(1e-12));
  }

  TEST_CASE("a reduction missing a barrier reads shared memory before it is written" *
            testing::needs_cuda_device()) {
    const Kernels& k = kernels();
    const long long n = 4096;
    cu::DeviceBuffer x = upload(random_floats(static_cast<std::size_t>(n), 4));
    cu::DeviceBuffer out(2 * sizeof(double));
    void* xp = reinterpret_cast<void*>(x.get());
    void* op = reinterpret_cast<void*>(out.get());
    long long nn = n;
    REQUIRE(launch(k["block_sums_racy"], 2, 256, {&xp, &op, &nn}) == CUDA_SUCCESS);
    bool nan = false;
    for (double s : download<double>(out, 2)) nan |= std::isnan(s);
    CHECK_MESSAGE(nan, "some thread should read its partner's slot before the partner wrote it");
  }

  TEST_CASE("__syncthreads_or gives every thread the block's OR" * testing::needs_cuda_device()) {
    const Kernels& k = kernels();
    std::vector<int> flags(3 * 64, 0);
    flags[64 + 17] = 5;      // block 1
    flags[2 * 64 + 63] = 1;  // block 2
    cu::DeviceBuffer f = upload(flags);
    cu::DeviceBuffer out(3 * sizeof(int));
    void* fp = reinterpret_cast<void*>(f.get());
    void* op = reinterpret_cast<void*>(out.get());
    REQUIRE(launch(k["any_flag"], 3, 64, {&fp, &op}) == CUDA_SUCCESS);
    CHECK(download<int>(out, 3) == std::vector<int>{0, 1, 1});
  }

  TEST_CASE("a seed replays the block and thread orders; other seeds change them" *
            testing::needs_cuda_device()) {
    const Kernels& k = kernels();
    cu::DeviceBuffer out(sizeof(int));
    void* op = reinterpret_cast<void*>(out.get());
    auto set_seed = emu_symbol<void (*)(unsigned long long)>("fusedopt_emu_set_seed");
    auto last_writer = [&](unsigned long long seed) {
      set_seed(seed);
      REQUIRE(launch(k["last_writer"], 4, 64, {&op}) == CUDA_SUCCESS);
      return download<int>(out, 1)[0];
    };
    const int first = last_writer(42);
    CHECK(last_writer(42) == first);
    std::set<int> seen;
    for (unsigned long long s = 1; s <= 20; ++s) seen.insert(last_writer(s));
    CHECK(seen.size() > 1);
  }

  TEST_CASE("a captured stream runs nothing until its graph is launched, then replays" *
            testing::needs_cuda_device()) {
    const Kernels& k = kernels();
    const int n = 100;
    const std::vector<float> y0 = random_floats(n, 5);
    cu::DeviceBuffer y = upload(y0);
    cu::Stream s = cu::stream_create();
    void* yp = reinterpret_cast<void*>(y.get());
    float v = 0.5f;
    int nn = n;
    cu::begin_capture(s);
    REQUIRE(launch(k["add"], 1, 128, {&yp, &v, &nn}, s, false) == CUDA_SUCCESS);
    v = 100.0f;  // the graph keeps the value at capture
    cu::Graph g = cu::end_capture(s);
    CHECK(download<float>(y, n) == y0);
    cu::GraphExec e = cu::graph_instantiate(g);
    cu::graph_launch(e, s);
    cu::graph_launch(e, s);
    cu::synchronize(s);
    const std::vector<float> got = download<float>(y, n);
    for (int i = 0; i < n; ++i) CHECK(got[i] == y0[i] + 0.5f + 0.5f);
    cu::graph_exec_destroy(e);
    cu::graph_destroy(g);

    // An allocation while capturing in global mode is refused and spoils the capture.
    cu::begin_capture(s);
    CUdeviceptr p = 0;
    CHECK(cu::driver().MemAlloc(&p, 64) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CUgraph bad = nullptr;
    CHECK(cu::driver().StreamEndCapture(static_cast<CUstream>(s), &bad) ==
          CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    cu::stream_destroy(s);
  }

  TEST_CASE(
      "streams are lazy: work on a non-blocking stream lands when something waits for "
      "it, and a synchronous upload lands before it only after the legacy stream's sync" *
      testing::needs_cuda_device()) {
    const Kernels& k = kernels();
    const char* mode = std::getenv("FUSEDOPT_EMU_STREAMS");
    const bool lazy = mode == nullptr || std::string(mode) != "eager";
    const int n = 64;
    const std::vector<float> y0 = random_floats(n, 6);
    cu::DeviceBuffer y = upload(y0);
    cu::synchronize(nullptr);
    cu::Stream s = cu::stream_create();
    void* yp = reinterpret_cast<void*>(y.get());
    float v = 1.0f;
    int nn = n;
    REQUIRE(launch(k["add"], 1, 64, {&yp, &v, &nn}, s, false) == CUDA_SUCCESS);
    // A synchronous copy waits for the legacy stream, not for a non-blocking one.
    std::vector<float> want = y0;
    for (float& x : want) x += 1.0f;
    CHECK(download<float>(y, n) == (lazy ? y0 : want));
    cu::synchronize(s);
    CHECK(download<float>(y, n) == want);

    // A synchronous copy from pageable memory returns before its bytes land: a kernel on a
    // non-blocking stream may still read the old values...
    const std::vector<float> fresh = random_floats(n, 7);
    cu::DeviceBuffer out(n * sizeof(float));
    void* op = reinterpret_cast<void*>(out.get());
    int last = n - 1;
    cu::copy_to_device(y.get(), fresh.data(), n * sizeof(float));
    REQUIRE(launch(k["copy_upto"], 1, 64, {&yp, &op, &last}, s) == CUDA_SUCCESS);
    CHECK(download<float>(out, n) == (lazy ? want : fresh));
    // ... unless the legacy stream is synchronised first.
    cu::synchronize(nullptr);
    REQUIRE(launch(k["copy_upto"], 1, 64, {&yp, &op, &last}, s) == CUDA_SUCCESS);
    CHECK(download<float>(out, n) == fresh);
    cu::stream_destroy(s);
  }

  TEST_CASE("bad calls get the real driver's CUresults" * testing::needs_cuda_device()) {
    const Kernels& k = kernels();
    const cu::DriverApi& api = cu::driver();
    cu::DeviceBuffer y(64 * sizeof(float));
    void* yp = reinterpret_cast<void*>(y.get());
    float v = 1.0f;
    int n = 64;
    CHECK(launch(k["add"], 1, 2048, {&yp, &v, &n}) == CUDA_ERROR_INVALID_VALUE);
    CHECK(launch(k["add"], 0, 64, {&yp, &v, &n}) == CUDA_ERROR_INVALID_VALUE);
    void* args[] = {&yp, &v, &n};
    CHECK(api.LaunchKernel(reinterpret_cast<CUfunction>(&n), 1, 1, 1, 1, 1, 1, 0, nullptr, args,
                           nullptr) == CUDA_ERROR_INVALID_HANDLE);
    CUfunction missing = nullptr;
    CHECK(api.ModuleGetFunction(&missing, k.module, "no_such_kernel") == CUDA_ERROR_NOT_FOUND);
    const float host[65] = {};
    CHECK(api.MemcpyHtoD(y.get(), host, 65 * sizeof(float)) == CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr p = 0;
    REQUIRE(api.MemAlloc(&p, 16) == CUDA_SUCCESS);
    CHECK(api.MemFree(p) == CUDA_SUCCESS);
    CHECK(api.MemFree(p) == CUDA_ERROR_INVALID_VALUE);
    CHECK(api.MemAlloc(&p, 0) == CUDA_ERROR_INVALID_VALUE);
    cu::Stream s = cu::stream_create();
    cu::stream_destroy(s);
    CHECK(launch(k["add"], 1, 64, {&yp, &v, &n}, s) == CUDA_ERROR_INVALID_HANDLE);
    CUmodule m = nullptr;
    const char cubin[64] =
        "\x7f"
        "ELF";
    CHECK(api.ModuleLoadData(&m, cubin) == CUDA_ERROR_NO_BINARY_FOR_GPU);
    {
      const CUfunction add = k["add"];
      cu::SavedCurrentContext saved;
      REQUIRE(api.CtxSetCurrent(nullptr) == CUDA_SUCCESS);
      CHECK(api.MemAlloc(&p, 16) == CUDA_ERROR_INVALID_CONTEXT);
      CHECK(launch(add, 1, 64, {&yp, &v, &n}) == CUDA_ERROR_INVALID_CONTEXT);
    }
  }
}

}  // namespace fusedopt::testing
