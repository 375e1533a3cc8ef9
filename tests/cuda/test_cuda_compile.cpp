// CUDA kernels compiled with NVRTC, no GPU needed: rules with reductions under both
// strategies, and kernels with more roles than the vector path stages still compile
// (scalar path). Every preset and dtype binding: test_presets_sm80.cpp, _sm90.cpp.
#include <doctest/doctest.h>

#include <string>

#include "cache/kernel_cache.hpp"
#include "codegen/codegen.hpp"
#include "common/cuda_compile.hpp"
#include "common/kernel_cache.hpp"
#include "common/requirements.hpp"
#include "compile/compiler.hpp"
#include "compile/kernel_provider.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/kernel.hpp"
#include "presets.hpp"
#include "rule_access.hpp"

namespace fusedopt::testing {

using namespace fusedopt;

namespace {

cache::KernelCache& shared_cache() { return testing::test_kernel_cache(); }

}  // namespace

TEST_SUITE("cuda") {
  TEST_CASE("rules with reductions compile for sm_90 under both strategies and with clipping" *
            testing::needs_nvrtc()) {
    cache::KernelCache& cache = shared_cache();
    const Rule clipped = Rule::preset("adamw").with_grad_clipping(1.0);
    std::vector<std::shared_ptr<const lang::Rule>> rules = {
        preset_rule("lamb"), preset_rule("lars"), RuleAccess::impl(clipped)};
    for (const auto& rule : rules) {
      for (codegen::Strategy s : {codegen::Strategy::Recompute, codegen::Strategy::Store}) {
        for (const char* dt : {"fp32", "bf16:bf16:fp32+master"}) {
          INFO(rule->name << " " << codegen::to_string(s) << " " << dt);
          DTypeBinding d = DTypeBinding::parse(dt);
          codegen::KernelBody body = codegen::generate_body(*rule, d, s);
          CHECK(body.reduction_passes >= 1);
          provider::ProvidedKernel k = provider::provide_body(body, d, Target::cuda(90), cache);
          REQUIRE(k.binary);
          CHECK(has_symbol(*k.binary, "fusedopt_reduce_0"));
          CHECK(has_symbol(*k.binary, "fusedopt_finalize"));
        }
      }
    }
  }

  TEST_CASE("kernels with many roles compile, the vector path staging each one the update touches" *
            testing::needs_nvrtc()) {
    cache::KernelCache& cache = shared_cache();
    // 2 + states (+ master) roles: up to 23 (the staging lists come from the code, not a
    // fixed table of 16 roles as before).
    for (int states : {0, 14, 15, 20}) {
      for (bool master : {false, true}) {
        INFO(states << " states, master " << master);
        TrustedFunctor f;
        f.name = "many_states_" + std::to_string(states);
        std::string params = "float& p";
        std::string body = "p -= h.lr * g;";
        for (int s = 0; s < states; ++s) {
          f.states.push_back({"s" + std::to_string(s), 0.0});
          params += ", float& s" + std::to_string(s);
          body += " s" + std::to_string(s) + " += g;";
        }
        f.hypers = {{"lr", 0.1}};
        f.code = "struct Functor { FO_FN void operator()(" + params +
                 ", float g, fo_hypers h) const { " + body + " } };";
        DTypeBinding d = master ? DTypeBinding::parse("bf16:bf16:fp32+master") : DTypeBinding{};
        codegen::KernelBody kb = codegen::generate_functor_body(f, d);
        provider::ProvidedKernel k = provider::provide_body(kb, d, Target::cuda(90), cache);
        for (const char* entry : kEntryPoints) CHECK(has_symbol(*k.binary, entry));
        CHECK(k.source.find("#define FO_UPDATE_STORES(STORE) STORE(0)") != std::string::npos);
      }
    }
  }
}

}  // namespace fusedopt::testing
