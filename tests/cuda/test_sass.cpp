// The SASS of the sm_90 CUBINs (cuobjdump from the CUDA packages on PyPI, which
// scripts/test installs) moves exactly what the planner counts: fusedopt_step's vector path
// has one wide global load per role the update reads and one wide global store per role it
// writes (16 bytes for fp32 roles, 8 for 16-bit ones); each reduction pass's own kernel
// stages exactly that pass's roles; the scalar path (tails) moves the same roles with 4- or
// 2-byte global accesses; no generic loads or stores remain; no kernel spills.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>

#include "cache/kernel_cache.hpp"
#include "codegen/codegen.hpp"
#include "common/kernel_cache.hpp"
#include "common/requirements.hpp"
#include "common/temp_dir.hpp"
#include "compile/kernel_provider.hpp"
#include "presets.hpp"

namespace fusedopt::testing {

using namespace fusedopt;

namespace {

/// cuobjdump from FUSEDOPT_CUOBJDUMP, else from the nvidia-cuda-cuobjdump wheel.
const testing::Availability& cuobjdump_availability() {
  static const testing::Availability a = [] {
    testing::Availability out;
    const std::string path = FUSEDOPT_CUOBJDUMP;
    out.present = !path.empty() && std::filesystem::exists(path);
    if (!out.present) {
      out.why =
          "cuobjdump is not installed (python3 -m pip install nvidia-cuda-cuobjdump; "
          "scripts/test does)";
    }
    return out;
  }();
  return a;
}

std::string run_capture(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buf[4096];
  for (std::size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  const int status = pclose(pipe);
  const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  REQUIRE_MESSAGE(ok, command);
  return out;
}

/// The SASS of each function in `cubin`, by name.
std::map<std::string, std::string> sass_by_function(const std::string& cubin) {
  testing::TempDir dir;
  const std::filesystem::path file = dir.path() / "k.cubin";
  std::ofstream(file, std::ios::binary) << cubin;
  const std::string all = run_capture(std::string(FUSEDOPT_CUOBJDUMP) + " -sass " + file.string());
  std::map<std::string, std::string> out;
  const std::regex header(R"(Function : (\S+))");
  std::sregex_iterator it(all.begin(), all.end(), header), end;
  for (; it != end; ++it) {
    const auto next = std::next(it);
    const std::size_t from = it->position() + it->length();
    const std::size_t to = next == end ? all.size() : static_cast<std::size_t>(next->position());
    out[(*it)[1]] = all.substr(from, to - from);
  }
  return out;
}

/// Elements a thread of a quantized update takes per iteration (FO_QE in
/// templates/kernels/cuda_quant.cuh), each with its own instructions.
constexpr int kSlices = 8;

int count(const std::string& text, const std::regex& re) {
  return static_cast<int>(
      std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

}  // namespace

TEST_SUITE("cuda") {
  TEST_CASE("fusedopt_step's vector path loads and stores exactly the update's roles, no spills" *
            testing::needs_nvrtc() * testing::Requires(cuobjdump_availability())) {
    cache::KernelCache& cache = testing::test_kernel_cache();
    struct Case {
      const char* preset;
      const char* dtypes;
      codegen::Strategy strategy;
    };
    const Case cases[] = {{"adamw", "fp32", codegen::Strategy::Auto},
                          {"adamw", "bf16:bf16:fp32+master", codegen::Strategy::Auto},
                          {"lamb", "fp32", codegen::Strategy::Store},
                          {"lamb", "fp32", codegen::Strategy::Recompute}};
    for (const Case& c : cases) {
      const std::string strategy = codegen::to_string(c.strategy);
      CAPTURE(c.preset);
      CAPTURE(c.dtypes);
      CAPTURE(strategy);
      const DTypeBinding d = DTypeBinding::parse(c.dtypes);
      const codegen::KernelBody body =
          codegen::generate_body(*preset_rule(c.preset), d, c.strategy);
      const provider::ProvidedKernel k = provider::provide_body(body, d, Target::cuda(90), cache);
      const auto sass = sass_by_function(*k.binary);
      REQUIRE(sass.count("fusedopt_step") == 1);
      const std::string& step = sass.at("fusedopt_step");
      if (std::getenv("FUSEDOPT_PRINT_SASS")) MESSAGE(step);
      // Expected wide accesses: one per role and direction, by the role's element size.
      std::map<int, int> want_loads, want_stores;  // access bits -> count
      for (int r : body.pass_reads.back()) ++want_loads[body.role_bits[r] == 32 ? 128 : 64];
      for (int r : body.pass_writes.back()) ++want_stores[body.role_bits[r] == 32 ? 128 : 64];
      for (int bits : {64, 128}) {
        CAPTURE(bits);
        const std::regex ldg("LDG\\.E\\.NA\\." + std::to_string(bits) + "[ .]");
        const std::regex stg("STG\\.E\\." + std::to_string(bits) + "[ .]");
        CHECK(count(step, ldg) == want_loads[bits]);
        CHECK(count(step, stg) == want_stores[bits]);
      }
      // The scalar path (tails, misaligned tensors): one global access per role and
      // direction too, 4 bytes for fp32 roles, 2 for 16-bit ones (LDG.E.NA / .U16).
      std::map<int, int> scalar_loads, scalar_stores;
      for (int r : body.pass_reads.back()) ++scalar_loads[body.role_bits[r] / 8];
      for (int r : body.pass_writes.back()) ++scalar_stores[body.role_bits[r] / 8];
      CHECK(count(step, std::regex(R"(LDG\.E\.NA )")) == scalar_loads[4]);
      CHECK(count(step, std::regex(R"(LDG\.E\.NA\.U16 )")) == scalar_loads[2]);
      CHECK(count(step, std::regex(R"(STG\.E )")) == scalar_stores[4]);
      CHECK(count(step, std::regex(R"(STG\.E\.U16 )")) == scalar_stores[2]);
      // Each reduction pass has its own kernel; its vector path stages the pass's roles once
      // per 4-element group it handles (two per loop iteration and one for an odd group:
      // the same multiple for every role), and nothing else wide.
      for (int pass = 0; pass < body.reduction_passes; ++pass) {
        const std::string name = "fusedopt_reduce_" + std::to_string(pass);
        CAPTURE(name);
        REQUIRE(sass.count(name) == 1);
        const std::string& text = sass.at(name);
        std::map<int, int> loads, stores;
        for (int r : body.pass_reads[pass]) ++loads[body.role_bits[r] == 32 ? 128 : 64];
        for (int r : body.pass_writes[pass]) ++stores[body.role_bits[r] == 32 ? 128 : 64];
        int groups = -1;  // the multiple, from the first role class present
        for (auto* want : {&loads, &stores}) {
          const char* op = want == &loads ? "LDG\\.E\\.NA\\." : "STG\\.E\\.";
          for (int bits : {64, 128}) {
            CAPTURE(bits);
            const int got = count(text, std::regex(op + std::to_string(bits) + "[ .]"));
            const int n = (*want)[bits];
            if (n == 0) {
              CHECK(got == 0);
              continue;
            }
            CHECK(got % n == 0);
            if (groups < 0) groups = got / n;
            CHECK(got == groups * n);
          }
        }
        CHECK(groups >= 1);
      }
      for (const auto& [fn, text] : sass) {
        CAPTURE(fn);
        CHECK(count(text, std::regex(R"(\b(STL|LDL)\b)")) == 0);  // no local memory: no spills
        if (fn == "fusedopt_step" || fn.rfind("fusedopt_reduce_", 0) == 0) {
          // Every access to tensor data is global: no generic LD/ST (which the compiler
          // emits for pointers it cannot place).
          CHECK(count(text, std::regex(R"(\b(LD|ST)\.E)")) == 0);
        }
      }
    }
  }
}

TEST_SUITE("cuda") {
  TEST_CASE("quantized states: one byte load and store per state and element, no spills" *
            testing::needs_nvrtc() * testing::Requires(cuobjdump_availability())) {
    // adamw with both states at 8 bits (bitsandbytes' layout): per element, the thread loads
    // each state's code once and stores it once (1-byte accesses), reads its block's absmax
    // once per state and writes it from one thread of the block; the maps go to shared memory
    // once per launch. Every access to tensor data is global (the plain roles staged as on the
    // fp32 path, codes and absmax by explicit global accesses): no generic LD/ST. A thread
    // takes kSlices elements per iteration, each with its own (unrolled) instructions.
    cache::KernelCache& cache = testing::test_kernel_cache();
    const DTypeBinding d = DTypeBinding::parse("fp32+q=q8s/q8u@256");
    const codegen::KernelBody body = codegen::generate_body(*preset_rule("adamw"), d);
    const provider::ProvidedKernel k = provider::provide_body(body, d, Target::cuda(90), cache);
    const auto sass = sass_by_function(*k.binary);
    REQUIRE(sass.count("fusedopt_step") == 1);
    const std::string& step = sass.at("fusedopt_step");
    if (std::getenv("FUSEDOPT_PRINT_SASS")) MESSAGE(step);
    CHECK(count(step, std::regex(R"(\bLDG\.E\.(U8\.NA|NA\.U8)\b)")) == 2 * kSlices);  // codes
    CHECK(count(step, std::regex(R"(\bSTG\.E\.U8\b)")) == 2 * kSlices);
    CHECK(count(step, std::regex(R"(\bLDG\.E\.NA )")) == 2 * kSlices);  // p and g
    CHECK(count(step, std::regex(R"(\bSTG\.E )")) == 3 * kSlices);      // p, each state's absmax
    CHECK(count(step, std::regex(R"(\b(LD|ST)\.E)")) == 0);             // no generic accesses
    CHECK(count(step, std::regex(R"(\b(STL|LDL)\b)")) == 0);            // no spills
  }

  TEST_CASE("factored rules with a quantized state: one byte load and store of its code" *
            testing::needs_nvrtc() * testing::Requires(cuobjdump_availability())) {
    // came and adam_mini with m at 8 bits: the update reads and writes m's code once per
    // element, as the element-wise rules do, and its row and column values beside it.
    cache::KernelCache& cache = testing::test_kernel_cache();
    const DTypeBinding d = DTypeBinding::parse("fp32+q=q8s@256");
    for (const char* preset : {"came", "adam_mini"}) {
      CAPTURE(std::string(preset));
      const codegen::KernelBody body = codegen::generate_body(*preset_rule(preset), d);
      const provider::ProvidedKernel k = provider::provide_body(body, d, Target::cuda(90), cache);
      const auto sass = sass_by_function(*k.binary);
      REQUIRE(sass.count("fusedopt_step") == 1);
      const std::string& step = sass.at("fusedopt_step");
      if (std::getenv("FUSEDOPT_PRINT_SASS")) MESSAGE(step);
      CHECK(count(step, std::regex(R"(\bLDG\.E\.(U8\.NA|NA\.U8)\b)")) == kSlices);
      CHECK(count(step, std::regex(R"(\bSTG\.E\.U8\b)")) == kSlices);
      CHECK(count(step, std::regex(R"(\b(STL|LDL)\b)")) == 0);  // no spills
    }
  }
}

}  // namespace fusedopt::testing
