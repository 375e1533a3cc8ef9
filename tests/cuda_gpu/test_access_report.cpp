// How fusedopt's CUDA kernels touch device memory, from the CUDA emulator's access report
// (tests/common/access_report.hpp; tests/cuda_emu/test_access_report.cpp checks the report
// itself): AdamW's, Adafactor's and adamw8bit's kernels (Adafactor: row sums by a warp per
// row, column means by a thread per column, matrix means by a block per tensor; adamw8bit: 8
// slices of 512 elements a block per iteration, 1-byte codes), every kernel within 1.5x of
// the ideal sectors, loads and stores. Runs on the emulator only.
#include <doctest/doctest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/access_report.hpp"
#include "common/device_model.hpp"
#include "common/requirements.hpp"
#include "device/cuda_driver.hpp"
#include "fusedopt/optimizer.hpp"

namespace fusedopt::testing {

using namespace fusedopt;
namespace cu = fusedopt::runtime::cuda;

TEST_SUITE("cuda_gpu") {
  TEST_CASE("AdamW's, Adafactor's and adamw8bit's kernels make coalesced accesses" *
            testing::needs_cuda_emulator()) {
    cu::PrimaryContext ctx(0);
    std::mt19937 rng(std::random_device{}());
    for (const char* preset : {"adamw", "adafactor", "adamw8bit"}) {
      CAPTURE(preset);
      DeviceModel m = make_model(rng);
      ParamGroup g = m.device_group();
      g.params[2].shape = {10, 100};
      g.params[3].shape = {1, 65537};  // one row longer than a chunk
      std::vector<Launch> launches;
      {
        Optimizer opt(Rule::preset(preset), {g});
        Report report;
        for (int t = 0; t < 2; ++t) {
          m.upload_grads();
          opt.step();
        }
        cu::synchronize(nullptr);
        launches = report.read();
      }
      REQUIRE(launches.size() >= 2);
      std::map<std::string, int> kinds;
      for (const Launch& l : launches) ++kinds[l.kernel];
      // adamw8bit: the tensors under 4096 elements keep fp32 states, in a kernel of their own.
      CHECK(kinds["fusedopt_step"] == (std::string(preset) == "adamw8bit" ? 4 : 2));
      // Within 1.5x: short rows and small tensors start mid-sector (the ideal ignores where
      // a request starts); an uncoalesced pattern is 4-32x.
      check_coalesced(launches, 1.5);
    }
  }
}

}  // namespace fusedopt::testing
