// Code generation: hoisting, name prefixing, #line mapping, sanitising, trusted functors.
#include <doctest/doctest.h>

#include <regex>

#include "cache/kernel_cache.hpp"
#include "codegen/codegen.hpp"
#include "compile/kernel_provider.hpp"
#include "fusedopt/error.hpp"
#include "lang/parse.hpp"

namespace fusedopt::testing {

using namespace fusedopt;

namespace {

constexpr const char* kAdamW = R"(# AdamW
param  p
grad   g
state  m = 0, v = 0
hyper  lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2

p = p * (1 - lr * weight_decay)
m = beta1 * m + (1 - beta1) * g
v = beta2 * v + (1 - beta2) * g * g
step_size = lr / (1 - beta1 ^ step)
denom = sqrt(v) / sqrt(1 - beta2 ^ step) + eps
p = p - step_size * m / denom
)";

std::string function_text(const std::string& code, const std::string& signature_start) {
  std::size_t a = code.find(signature_start);
  REQUIRE(a != std::string::npos);
  std::size_t b = code.find("\n}\n", a);
  return code.substr(a, b - a);
}

std::size_t count(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

}  // namespace

TEST_SUITE("codegen") {
  TEST_CASE("codegen hoists uniform subexpressions out of the element function") {
    auto rule = lang::parse_rule(kAdamW, "adamw.rule");
    codegen::KernelBody body = codegen::generate_body(*rule, DTypeBinding{});
    std::string element = function_text(body.code, "FO_FN void fo_element(");
    std::string prepare = function_text(body.code, "FO_FN fo_uniform fo_prepare(");
    // Both bias corrections, 1 - lr*wd, 1 - beta1 and 1 - beta2 depend on hypers and step only.
    CHECK(element.find("fo_pow") == std::string::npos);
    CHECK(element.find("fo_sqrt(U.u") == std::string::npos);
    CHECK(count(prepare, "fo_pow(h[") == 2);  // in double, from the double hypers
    CHECK(body.num_uniforms >= 5);
    // The element function reads only the hoisted values, the hypers and its tensors.
    CHECK(element.find("v_v") != std::string::npos);
    CHECK(element.find("fo_sqrt(v_v)") != std::string::npos);
  }

  TEST_CASE("codegen gives identical uniform subexpressions one slot") {
    auto rule = lang::parse_rule(R"(param p
grad g
hyper lr = 0.1, b = 0.9
p = p - lr / (1 - b ^ step) * g + g / (1 - b ^ step)
)",
                                 "twice.rule");
    codegen::KernelBody body = codegen::generate_body(*rule, DTypeBinding{});
    CHECK(count(body.code, "fo_pow(") == 1);
  }

  TEST_CASE("codegen maps each statement to its rule line with #line") {
    auto rule = lang::parse_rule(kAdamW, "adamw.rule");
    codegen::KernelBody body = codegen::generate_body(*rule, DTypeBinding{});
    CHECK(body.code.find("#line 8 \"adamw.rule\"\n  v_m = ") != std::string::npos);
    CHECK(body.code.find("#line 12 \"adamw.rule\"\n  v_p = ") != std::string::npos);
    std::string source = codegen::generate_source(body, Target::cuda(90));
    // After the rule's lines, #line points back into the generated file at the right line.
    std::regex restore("#line ([0-9]+) \"fusedopt_adamw.cu\"");
    int restores = 0;
    std::size_t line_no = 1, pos = 0;
    while (pos < source.size()) {
      std::size_t end = source.find('\n', pos);
      std::string ln = source.substr(pos, end - pos);
      std::smatch m;
      if (std::regex_match(ln, m, restore)) {
        CHECK(std::stoul(m[1]) == line_no + 1);
        ++restores;
      }
      ++line_no;
      pos = end + 1;
    }
    CHECK(restores >= 2);
    CHECK(source.find("#line @") == std::string::npos);
  }

  TEST_CASE("codegen re-emits every user name with a prefix, so names of generated code are safe") {
    // U, i, t and h are the generated code's own locals; v_t its name for t.
    auto rule = lang::parse_rule(R"(param t
grad h
state U = 0, i = 0
hyper load = 0.5
v_t = h * load
U = U + v_t
i = i + 1
t = t - U
)",
                                 "names.rule");
    codegen::KernelBody body = codegen::generate_body(*rule, DTypeBinding{});
    CHECK(body.code.find("float v_t = fo_load(t.r0, i);") != std::string::npos);
    CHECK(body.code.find("const float v_h = fo_load(t.r1, i)") != std::string::npos);
    CHECK(body.code.find("v_v_t") != std::string::npos);
    CHECK(body.code.find("v_U = (v_U + v_v_t);") != std::string::npos);
    CHECK(body.roles == std::vector<std::string>{"t", "h", "U", "i"});
    cache::KernelCache cache(cache::KernelCache::Options{{}, cache::KernelCache::Mode::Off});
    CHECK_NOTHROW(provider::provide_body(body, DTypeBinding{}, Target::host(), cache));
  }

  TEST_CASE("codegen keeps a hostile file name out of the #line directive") {
    auto rule = lang::parse_rule("param p\ngrad g\np = p - g\n", "a\"b\\c\n#include <x>.rule");
    codegen::KernelBody body = codegen::generate_body(*rule, DTypeBinding{});
    CHECK(body.code.find("#line 3 \"a_b_c__include__x_.rule\"") != std::string::npos);
    CHECK(body.code.find("<x>") == std::string::npos);
  }

  TEST_CASE("codegen emits loads and stores for each dtype binding") {
    auto rule = lang::parse_rule(kAdamW, "adamw.rule");
    auto body = codegen::generate_body(*rule, DTypeBinding::parse("bf16:fp16:bf16+master"));
    CHECK(body.num_roles == 5);
    CHECK(body.roles.back() == "p_master");
    CHECK(body.code.find("fo_bf16* FO_RESTRICT r0;") != std::string::npos);
    CHECK(body.code.find("const fo_f16* FO_RESTRICT r1;") != std::string::npos);
    CHECK(body.code.find("float* FO_RESTRICT r4;") != std::string::npos);
    // The math reads the fp32 master and stores both the master and the rounded param.
    CHECK(body.code.find("float v_p = fo_load(t.r4, i);") != std::string::npos);
    CHECK(body.code.find("fo_store(t.r4, i, v_p);") != std::string::npos);
    CHECK(body.code.find("fo_store(t.r0, i, v_p);") != std::string::npos);
  }

  TEST_CASE("codegen marks a trusted functor as trusted and maps its lines to the functor") {
    codegen::TrustedFunctor f;
    f.name = "my_sgd";
    f.code =
        "struct Functor {\n  FO_FN void operator()(float& p, float g, fo_hypers h) const {\n"
        "    p -= h.lr * g;\n  }\n};";
    f.hypers = {{"lr", 0.1}};
    codegen::KernelBody body = codegen::generate_functor_body(f, DTypeBinding{});
    CHECK(body.kind == "trusted-functor");
    CHECK(body.code.find("TRUSTED FUNCTOR") != std::string::npos);
    CHECK(body.code.find("#line 1 \"my_sgd\"\nstruct Functor") != std::string::npos);
    f.hypers = {{"lr; } int x; {", 0.1}};
    CHECK_THROWS_AS(codegen::generate_functor_body(f, DTypeBinding{}), Error);
  }
}

}  // namespace fusedopt::testing
