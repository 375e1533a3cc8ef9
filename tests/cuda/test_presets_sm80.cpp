// Every preset through NVRTC for sm_80, no GPU needed (its own executable: see
// common/cuda_compile.hpp). The generated source has no architecture-dependent code (no
// __CUDA_ARCH__ branch: one text for every sm_XX), so the full matrix of presets and dtype
// bindings is compiled for sm_90 (test_presets_sm90.cpp), and sm_80 compiles every preset
// in the two bindings an A100 runs, fp32 and bf16 with an fp32 master: what differs there
// is the instruction selection of NVRTC's back end.
#include <doctest/doctest.h>

#include "common/cuda_compile.hpp"
#include "common/requirements.hpp"

namespace fusedopt::testing {

TEST_SUITE("cuda") {
  TEST_CASE("every preset compiles for sm_80 in fp32 and in bf16 with an fp32 master" *
            fusedopt::testing::needs_nvrtc()) {
    fusedopt::testing::check_every_preset_compiles(80, {"fp32", "bf16:bf16:fp32+master"});
  }
}

}  // namespace fusedopt::testing
