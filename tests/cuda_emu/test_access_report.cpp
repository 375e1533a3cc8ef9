// The CUDA emulator's access report (FUSEDOPT_EMU_ACCESS_REPORT) on two kernels of the
// test's own: a coalesced copy counts as many 32-byte sectors as the ideal, a gather with a
// 32-byte stride 8 times as many (tests/cuda_gpu/test_access_report.cpp then holds
// fusedopt's kernels to it).
#include <cuda.h>
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "common/access_report.hpp"
#include "common/requirements.hpp"
#include "compile/compiler.hpp"
#include "device/cuda_driver.hpp"
#include "fusedopt/target.hpp"

namespace fusedopt::testing {

using namespace fusedopt;
namespace cu = fusedopt::runtime::cuda;

namespace {

const char* const kKernels = R"(
extern "C" __global__ void copy(const float* x, float* y) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  y[i] = x[i];
}
extern "C" __global__ void gather(const float* x, float* y, int stride) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  y[i] = x[i * stride];
}
)";

}  // namespace

TEST_SUITE("cuda_emu") {
  TEST_CASE("the emulator's access report counts a coalesced copy at the ideal, a gather at 8x" *
            testing::needs_cuda_device()) {
    cu::PrimaryContext ctx(0);
    const std::string image =
        jit::compiler_for(Target::emu()).compile(kKernels, "access_test.cu", Target::emu());
    CUmodule module = nullptr;
    FUSEDOPT_CU_CHECK(ModuleLoadData, &module, image.data());
    CUfunction copy = nullptr, gather = nullptr;
    FUSEDOPT_CU_CHECK(ModuleGetFunction, &copy, module, "copy");
    FUSEDOPT_CU_CHECK(ModuleGetFunction, &gather, module, "gather");
    cu::DeviceBuffer x(256 * 8 * 4), y(256 * 4);
    CUdeviceptr px = x.get(), py = y.get();
    int stride = 8;
    std::vector<Launch> launches;
    {
      Report report;
      void* copy_args[] = {&px, &py};
      FUSEDOPT_CU_CHECK(LaunchKernel, copy, 1, 1, 1, 256, 1, 1, 0, nullptr, copy_args, nullptr);
      void* gather_args[] = {&px, &py, &stride};
      FUSEDOPT_CU_CHECK(LaunchKernel, gather, 1, 1, 1, 256, 1, 1, 0, nullptr, gather_args, nullptr);
      FUSEDOPT_CU_CHECK(StreamSynchronize, nullptr);
      launches = report.read();
    }
    cu::driver().ModuleUnload(module);
    REQUIRE(launches.size() == 2);
    // 8 warps, each 32 x 4 bytes: 4 sectors a request when contiguous.
    CHECK(launches[0].kernel == "copy");
    CHECK(launches[0].v["load_requests"] == 8);
    CHECK(launches[0].v["load_sectors"] == 32);
    CHECK(launches[0].v["load_ideal"] == 32);
    CHECK(launches[0].v["store_sectors"] == 32);
    // A stride of 32 bytes: a sector per lane.
    CHECK(launches[1].kernel == "gather");
    CHECK(launches[1].v["load_sectors"] == 256);
    CHECK(launches[1].v["load_ideal"] == 32);
    CHECK(launches[1].v["store_sectors"] == 32);
  }
}

}  // namespace fusedopt::testing
