// The public pipeline API: Rule, compile_kernel and compile_trusted_functor over the
// process-wide cache configured from the environment.
#include <doctest/doctest.h>

#include <cstdlib>

#include "common/temp_dir.hpp"
#include "fusedopt/kernel.hpp"

namespace fusedopt::testing {

using namespace fusedopt;

TEST_SUITE("jit") {
  TEST_CASE("the public API parses, compiles once and then serves from the memory tier") {
    testing::TempDir dir;
    // The process-wide cache reads the environment on first use, which is here.
    setenv("FUSEDOPT_CACHE_DIR", (dir.path() / "cache").c_str(), 1);
    Rule rule = Rule::parse("param p\ngrad g\nhyper lr = 0.5\np = p - lr * g\n", "half.rule");
    CHECK(rule.name() == "half");
    CHECK(rule.hypers() == std::vector<std::pair<std::string, double>>{{"lr", 0.5}});
    CompiledKernel first = compile_kernel(rule, Target::host());
    CHECK(first.origin == "compiled");
    CHECK(first.key.size() == 32);
    CompiledKernel second = compile_kernel(rule, Target::host());
    CHECK(second.origin == "memory");
    CHECK(second.key == first.key);
    CHECK(second.binary == first.binary);
    CHECK(std::filesystem::exists(dir.path() / "cache" / first.key.substr(0, 2) /
                                  (first.key + ".so")));

    CHECK(Rule::preset("adamw").states() == std::vector<std::string>{"m", "v"});
    CHECK(Rule::presets().size() >= 10);
    CHECK_THROWS_WITH_AS(Rule::preset("adamm"), doctest::Contains("unknown preset 'adamm'"), Error);
    CHECK_THROWS_AS(Rule::parse("param p\ngrad g\np = p - q\n"), RuleError);

    TrustedFunctor f{"api_functor",
                     "struct Functor { FO_FN void operator()(float& p, float g, fo_hypers h) const "
                     "{ p -= h.lr * g; } };",
                     {},
                     {{"lr", 0.1}}};
    CHECK(compile_trusted_functor(f, Target::host()).origin == "compiled");
    unsetenv("FUSEDOPT_CACHE_DIR");
  }
}

}  // namespace fusedopt::testing
