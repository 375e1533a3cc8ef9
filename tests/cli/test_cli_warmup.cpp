// fusedopt-cache warmup warms what an Optimizer then loads: for a rule with `storage`
// declarations, the quantized binding its large params step with too, not only the plain
// one of its small params.
#include <doctest/doctest.h>

#include <regex>
#include <set>
#include <string>
#include <vector>

#include "common/run.hpp"
#include "common/scoped_env.hpp"
#include "fusedopt/optimizer.hpp"

namespace fusedopt::testing {

TEST_SUITE("cli") {
  TEST_CASE("warmup --preset adamw8bit warms every kernel its optimizer loads, quantized too") {
    TempDir d;
    for (const char* preset : {"adamw8bit", "adamw4bit+sr"}) {
      CAPTURE(std::string(preset));
      CliResult warm = run_cli({"warmup", "--preset", preset, "--target", "host", "--json",
                                "--cache-dir", (d.path() / "c").string()});
      INFO(warm.out, warm.err);
      REQUIRE(warm.code == 0);
      std::set<std::string> warmed;
      const std::regex key("\"key\": \"([0-9a-f]{32})\"");
      for (auto it = std::sregex_iterator(warm.out.begin(), warm.out.end(), key);
           it != std::sregex_iterator(); ++it) {
        warmed.insert((*it)[1]);
      }
      // The optimizer's own kernels (from a memory-only cache here): a param above
      // quant_min_numel (quantized states) and one below it (fp32 states).
      ScopedEnv memory("FUSEDOPT_CACHE", "memory");
      std::vector<float> p1(8192, 0.5f), g1(8192, 0.1f), p2(100, 0.5f), g2(100, 0.1f);
      ParamGroup group;
      group.params = {Tensor(p1.data(), 8192, DType::F32, Device::host(), "big"),
                      Tensor(p2.data(), 100, DType::F32, Device::host(), "small")};
      group.grads = {Tensor(g1.data(), 8192, DType::F32, Device::host(), ""),
                     Tensor(g2.data(), 100, DType::F32, Device::host(), "")};
      Optimizer opt(Rule::preset(preset), {group});
      const std::vector<std::string> keys = opt.stats().kernel_keys;
      REQUIRE(keys.size() == 2);
      for (const std::string& k : keys) {
        CAPTURE(k);
        CHECK(warmed.count(k) == 1);
      }
    }
  }
}

}  // namespace fusedopt::testing
