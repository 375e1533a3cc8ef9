// What a GPU can load (compile/device_target.hpp), decided without a GPU: a CUBIN for the
// device's own architecture when NVRTC knows it, PTX when the device is newer than NVRTC, a
// PTX retry when the driver refuses a CUBIN, and an error naming both versions when the
// driver is too old for anything NVRTC makes.
#include <doctest/doctest.h>

#include <functional>
#include <string>

#include "compile/device_target.hpp"
#include "fusedopt/error.hpp"

namespace fusedopt::testing {

using fusedopt::Target;
using fusedopt::UnavailableError;
using fusedopt::runtime::choose_cuda_target;
using fusedopt::runtime::CudaVersions;
using fusedopt::runtime::ptx_fallback;

namespace {

CudaVersions versions(int driver, int major, int minor) {
  CudaVersions v;
  v.driver = driver;
  v.nvrtc_major = major;
  v.nvrtc_minor = minor;
  v.nvrtc_archs = {75, 80, 86, 87, 89, 90, 100, 103, 110, 120, 121};  // NVRTC 13.0's list
  return v;
}

std::string refusal(const std::function<void()>& f) {
  try {
    f();
  } catch (const UnavailableError& e) {
    return e.what();
  }
  FAIL("expected an UnavailableError");
  return "";
}

}  // namespace

TEST_SUITE("runtime") {
  TEST_CASE("a device NVRTC knows gets a CUBIN for its own architecture") {
    CHECK(choose_cuda_target(90, versions(13000, 13, 0)) == Target::cuda(90));
    CHECK(choose_cuda_target(80, versions(13020, 13, 0)) == Target::cuda(80));
    // Same major, older minor driver: CUBINs are compatible within a major version.
    CHECK(choose_cuda_target(90, versions(13000, 13, 2)) == Target::cuda(90));
  }

  TEST_CASE("a device newer than NVRTC gets PTX of the newest architecture below it") {
    const Target t = choose_cuda_target(130, versions(13020, 13, 0));
    CHECK(t == Target::cuda_ptx(121));
    CHECK(t.str() == "compute_121");
    CHECK(choose_cuda_target(95, versions(13000, 13, 0)) == Target::cuda_ptx(90));
    // PTX needs a driver at least as new as NVRTC.
    const std::string why = refusal([] { choose_cuda_target(130, versions(13000, 13, 1)); });
    CHECK(why.find("driver CUDA 13.0, NVRTC 13.1") != std::string::npos);
    CHECK(why.find("needs PTX") != std::string::npos);
  }

  TEST_CASE("a driver of an older major version than NVRTC is a clear error naming both") {
    const std::string why = refusal([] { choose_cuda_target(90, versions(12090, 13, 0)); });
    CHECK(why.find("driver CUDA 12.9, NVRTC 13.0") != std::string::npos);
    CHECK(why.find("install a driver for CUDA 13.0 or newer") != std::string::npos);
    CHECK(why.find("FUSEDOPT_NVRTC_LIBRARY") != std::string::npos);
  }

  TEST_CASE("a device older than every architecture NVRTC supports is a clear error") {
    const std::string why = refusal([] { choose_cuda_target(60, versions(13000, 13, 0)); });
    CHECK(why.find("NVRTC 13.0 cannot compile for this GPU (sm_60)") != std::string::npos);
    CHECK(why.find("oldest architecture is sm_75") != std::string::npos);
  }

  TEST_CASE("a refused CUBIN is retried as PTX when the driver can compile it, else named") {
    CHECK(ptx_fallback(90, versions(13000, 13, 0), "CUDA_ERROR_NO_BINARY_FOR_GPU") ==
          Target::cuda_ptx(90));
    const std::string why =
        refusal([] { ptx_fallback(90, versions(13000, 13, 2), "CUDA_ERROR_INVALID_IMAGE"); });
    CHECK(why.find("driver CUDA 13.0, NVRTC 13.2") != std::string::npos);
    CHECK(why.find("CUDA_ERROR_INVALID_IMAGE") != std::string::npos);
  }

  TEST_CASE("compute_XX parses as a PTX target and prints back") {
    const Target t = Target::parse("compute_90");
    CHECK(t.ptx);
    CHECK(t.sm == 90);
    CHECK(t.str() == "compute_90");
    CHECK_FALSE(t == Target::cuda(90));
    CHECK_THROWS_AS(Target::parse("compute_90a"), fusedopt::Error);
    CHECK_THROWS_AS(Target::parse("compute_"), fusedopt::Error);
  }
}

}  // namespace fusedopt::testing
