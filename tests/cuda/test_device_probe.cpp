// The device probe the GPU suites skip on: it runs everywhere, device or not.
#include <doctest/doctest.h>

#include <string>

#include "device/cuda_driver.hpp"

namespace fusedopt::testing {

TEST_SUITE("cuda") {
  TEST_CASE("cuda_device_available gives a reason whenever it finds no device") {
    std::string why;
    const bool available = fusedopt::runtime::cuda::cuda_device_available(&why);
    INFO(why);
    CHECK((available || !why.empty()));
  }
}

}  // namespace fusedopt::testing
