// Shared by the NVRTC compile tests: the entry points a CUBIN must export, and the check
// that every preset and dtype binding compiles for one architecture (one executable per
// architecture, so that ctest -j runs them side by side).
#pragma once

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cache/kernel_cache.hpp"
#include "codegen/codegen.hpp"
#include "common/kernel_cache.hpp"
#include "compile/kernel_provider.hpp"
#include "fusedopt/target.hpp"
#include "presets.hpp"

namespace fusedopt::testing {

/// Whether the ELF image defines a symbol named exactly `name` (its string table holds
/// NUL-terminated names).
inline bool has_symbol(const std::string& elf, const std::string& name) {
  return elf.find(std::string(1, '\0') + name + std::string(1, '\0')) != std::string::npos;
}

inline const char* const kEntryPoints[] = {"fusedopt_step", "fusedopt_init", "fusedopt_check",
                                           "fusedopt_advance_step", "fusedopt_finalize"};

/// The dtype bindings the NVRTC preset suites compile: fp32, bf16 with an fp32 master, and
/// the mixed fp16 params and grads with bf16 states.
inline const std::vector<const char*> kAllBindings = {"fp32", "bf16:bf16:fp32+master",
                                                      "fp16:fp16:bf16"};

/// Every preset in each of `bindings` compiles for sm_<sm> to a CUBIN with all CUDA entry
/// points, from a self-contained source with the vector path compiled in.
inline void check_every_preset_compiles(int sm,
                                        const std::vector<const char*>& bindings = kAllBindings) {
  cache::KernelCache& cache = test_kernel_cache();
  for (const std::string& name : preset_names()) {
    for (const char* dt : bindings) {
      INFO(name << " sm_" << sm << " " << dt);
      DTypeBinding d = DTypeBinding::parse(dt);
      codegen::KernelBody body = codegen::generate_body(*preset_rule(name), d);
      provider::ProvidedKernel k = provider::provide_body(body, d, Target::cuda(sm), cache);
      REQUIRE(k.binary);
      CHECK(k.binary->compare(0, 4,
                              "\x7f"
                              "ELF") == 0);
      CHECK(k.ext == "cubin");
      // Generated sources are self-contained: NVRTC needs no toolkit headers.
      CHECK(k.source.find("#include") == std::string::npos);
      for (const char* entry : kEntryPoints) {
        INFO(entry);
        CHECK(has_symbol(*k.binary, entry));
      }
      // One reduction kernel per pass of the rule, and no other.
      for (int pass = 0; pass <= body.reduction_passes; ++pass) {
        INFO("fusedopt_reduce_" << pass);
        CHECK(has_symbol(*k.binary, "fusedopt_reduce_" + std::to_string(pass)) ==
              (pass < body.reduction_passes));
      }
      // The vector path is compiled in, with the staging lists of the update.
      CHECK(k.source.find("fo_element_n<kInit, 4>") != std::string::npos);
      CHECK(k.source.find("#define FO_UPDATE_STAGE(LOAD, DECL)") != std::string::npos);
    }
  }
}

}  // namespace fusedopt::testing
