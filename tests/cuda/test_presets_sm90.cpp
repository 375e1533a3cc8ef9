// Every preset and dtype binding through NVRTC for sm_90, no GPU needed (its own
// executable: see common/cuda_compile.hpp).
#include <doctest/doctest.h>

#include "common/cuda_compile.hpp"
#include "common/requirements.hpp"

namespace fusedopt::testing {

TEST_SUITE("cuda") {
  TEST_CASE("every preset and dtype binding compiles for sm_90 with all CUDA entry points" *
            fusedopt::testing::needs_nvrtc()) {
    fusedopt::testing::check_every_preset_compiles(90);
  }
}

}  // namespace fusedopt::testing
