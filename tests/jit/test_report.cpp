// report_kernel (and `fusedopt-cache check --target`): what each pass of a kernel reads and
// writes, the bytes per element, and for CUDA the registers and spills of every entry point,
// all without a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/requirements.hpp"
#include "common/run.hpp"
#include "compile/compiler.hpp"
#include "fusedopt/kernel.hpp"

namespace fusedopt::testing {

using namespace fusedopt;

namespace {

using Names = std::vector<std::string>;

/// LAMB fp32 with the Store strategy, as its rule and schedule say (docs/rules.md, lamb.rule):
/// the global norm reads g; the norms pass reads p g m v and keeps m, v and u; the update
/// reads p and u and writes p.
void check_lamb_store(const KernelReport& r) {
  CHECK(r.strategy == ReductionStrategy::Store);
  REQUIRE(r.passes.size() == 3);
  CHECK_FALSE(r.passes[0].update);
  CHECK(r.passes[0].reads == Names{"g"});
  CHECK(r.passes[0].writes.empty());
  CHECK(r.passes[0].bytes_per_element == 4);
  CHECK(r.passes[1].reads == Names{"p", "g", "m", "v"});
  CHECK(r.passes[1].writes == Names{"m", "v", "scratch_u"});
  CHECK(r.passes[1].bytes_per_element == 28);
  CHECK(r.passes[2].update);
  CHECK(r.passes[2].reads == Names{"p", "scratch_u"});
  CHECK(r.passes[2].writes == Names{"p"});
  CHECK(r.passes[2].bytes_per_element == 12);
  CHECK(r.bytes_per_element == 44);
}

}  // namespace

TEST_SUITE("jit") {
  TEST_CASE("report_kernel: LAMB's passes, their tensors and bytes; the host has no ptxas") {
    const KernelReport r = report_kernel(Rule::preset("lamb"), Target::host());
    check_lamb_store(r);
    CHECK(r.functions.empty());
    // Recompute: the update reads p g m v and writes p m v (48 B in all, Auto's loser).
    const KernelReport rc =
        report_kernel(Rule::preset("lamb"), Target::host(), {}, ReductionStrategy::Recompute);
    CHECK(rc.bytes_per_element == 48);
    CHECK(rc.passes.back().writes == Names{"p", "m", "v"});
  }

  TEST_CASE("report_kernel for sm_90: every entry point, its registers, and no spills" *
            testing::needs_nvrtc()) {
    for (const char* preset : {"adamw", "lamb"}) {
      CAPTURE(preset);
      const KernelReport r = report_kernel(Rule::preset(preset), Target::cuda(90));
      if (std::string(preset) == "lamb") check_lamb_store(r);
      Names names;
      for (const KernelFunction& f : r.functions) {
        CAPTURE(f.name);
        names.push_back(f.name);
        CHECK(f.registers > 0);
        CHECK(f.registers <= 128);  // 512 threads per block must fit in 64 K registers
        CHECK(f.spill_store_bytes == 0);
        CHECK(f.spill_load_bytes == 0);
      }
      for (const char* entry :
           {"fusedopt_step", "fusedopt_init", "fusedopt_finalize", "fusedopt_check"}) {
        CHECK(std::find(names.begin(), names.end(), entry) != names.end());
      }
      // One reduction kernel per pass: LAMB has two, AdamW none.
      const bool lamb = std::string(preset) == "lamb";
      CHECK((std::find(names.begin(), names.end(), "fusedopt_reduce_1") != names.end()) == lamb);
      CHECK((std::find(names.begin(), names.end(), "fusedopt_reduce_0") != names.end()) == lamb);
    }
  }

  TEST_CASE("fusedopt-cache check --target prints each pass and each entry point" *
            testing::needs_nvrtc()) {
    testing::TempDir d;
    const std::string rule = (d.path() / "lamb.rule").string();
    testing::write_file(rule, Rule::preset("lamb").text());
    testing::CliResult r = testing::run_cli({"check", rule, "--target", "sm_90,host"});
    INFO(r.out << r.err);
    CHECK(r.code == 0);
    CHECK(r.out.find("  sm_90 fp32:fp32:fp32: 44 B/element per step (store)") != std::string::npos);
    CHECK(r.out.find("    pass 2 (update): reads p scratch_u; writes p; 12 B/element") !=
          std::string::npos);
    CHECK(r.out.find("    fusedopt_step: ") != std::string::npos);
    CHECK(r.out.find("B spill stores") != std::string::npos);
    CHECK(r.out.find("  host fp32:fp32:fp32: 44 B/element per step (store)") != std::string::npos);
    testing::CliResult bad = testing::run_cli({"check", rule, "--dtypes", "fp32"});
    CHECK(bad.code == 2);
    CHECK(bad.err.find("--dtypes needs --target") != std::string::npos);
  }

  TEST_CASE("NVRTC reports its version and architectures, and compiles PTX for compute_XX" *
            testing::needs_nvrtc()) {
    const auto [major, minor] = jit::nvrtc_version();
    CHECK(major >= 12);
    CHECK(minor >= 0);
    const std::vector<int> archs = jit::nvrtc_supported_archs();
    CHECK(std::find(archs.begin(), archs.end(), 90) != archs.end());
    testing::TempDir d;
    CompileOptions options;
    options.cache_dir = d.path();
    const CompiledKernel ptx =
        compile_kernel(Rule::preset("adamw"), Target::cuda_ptx(90), {}, options);
    const CompiledKernel cubin =
        compile_kernel(Rule::preset("adamw"), Target::cuda(90), {}, options);
    CHECK(ptx.key != cubin.key);  // the cache key records which
    CHECK(ptx.disk_entry.extension() == ".ptx");
    CHECK(ptx.binary->find(".target sm_90") != std::string::npos);
    CHECK(ptx.binary->find(".entry fusedopt_step(") != std::string::npos);
  }
}

}  // namespace fusedopt::testing
