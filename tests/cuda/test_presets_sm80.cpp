// Every preset through NVRTC for sm_80, no GPU needed (its own executable: see
// cuda_compile_support.hpp). The generated source has no architecture-dependent code (no
// __CUDA_ARCH__ branch: one text for every sm_XX), so the full matrix of presets and dtype
// bindings is compiled for sm_90 (test_presets_sm90.cpp), and sm_80 compiles every preset
// in the two bindings an A100 runs, fp32 and bf16 with an fp32 master: what differs there
// is the instruction selection of NVRTC's back end.
#include <doctest/doctest.h>

#include "cuda/cuda_compile_support.hpp"
#include "support/requirements.hpp"

namespace fusedopt_tests {

TEST_SUITE("cuda") {
  TEST_CASE("every preset compiles for sm_80 in fp32 and in bf16 with an fp32 master" *
            fusedopt::testing::needs_nvrtc()) {
    fusedopt::testing::check_every_preset_compiles(80, {"fp32", "bf16:bf16:fp32+master"});
  }
}

}  // namespace fusedopt_tests
