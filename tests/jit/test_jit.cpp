// Compilation: host -> .so that runs and matches a float64 reference, compile errors (host
// and NVRTC), source dumps and the key record. Every preset through NVRTC for sm_80/sm_90
// is tests/cuda/test_cuda_compile.cpp.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>

#include "cache/kernel_cache.hpp"
#include "codegen/codegen.hpp"
#include "common/host_kernel_calls.hpp"
#include "common/kernel_cache.hpp"
#include "common/requirements.hpp"
#include "common/sized_rule.hpp"
#include "common/temp_dir.hpp"
#include "compile/compiler.hpp"
#include "compile/kernel_provider.hpp"
#include "device/backend.hpp"
#include "device/host_module.hpp"
#include "exec/binding.hpp"
#include "fusedopt/error.hpp"
#include "lang/parse.hpp"
#include "presets.hpp"

namespace fusedopt::testing {

using namespace fusedopt;

namespace {

cache::KernelCache::Options no_cache() {
  cache::KernelCache::Options o;
  o.mode = cache::KernelCache::Mode::Off;
  return o;
}

bool is_elf(const std::string& bytes) {
  return bytes.size() > 4 && bytes.compare(0, 4,
                                           "\x7f"
                                           "ELF") == 0;
}

/// The cache of the cases that are not about caching (common/kernel_cache.hpp).
cache::KernelCache& shared_cache() { return testing::test_kernel_cache(); }

codegen::TrustedFunctor functor_sgd() {
  codegen::TrustedFunctor f;
  f.name = "functor_sgd";
  f.code =
      "struct Functor {\n  FO_FN void operator()(float& p, float& m, float g, fo_hypers h) const "
      "{\n"
      "    m = h.mu * m + g;\n    p -= h.lr * m;\n  }\n};";
  f.states = {{"m", 0.5}};
  f.hypers = {{"lr", 0.1}, {"mu", 0.9}};
  return f;
}

/// Compiles a functor that uses an undefined name for `target`: the CompileError carries
/// the log (mapped to the functor's line), the options and the source.
void check_compile_error(const Target& target) {
  codegen::TrustedFunctor f;
  f.name = "broken_functor";
  f.code =
      "struct Functor {\n  FO_FN void operator()(float& p, float g, fo_hypers h) const {\n"
      "    p -= h.lr * undefined_thing;\n  }\n};";
  f.hypers = {{"lr", 0.1}};
  cache::KernelCache cache(no_cache());
  auto body = codegen::generate_functor_body(f, DTypeBinding{});
  INFO(target.str());
  try {
    provider::provide_body(body, DTypeBinding{}, target, cache);
    FAIL("expected a CompileError");
  } catch (const CompileError& e) {
    CHECK(e.log().find("undefined_thing") != std::string::npos);
    // g++ says "broken_functor:3:", NVRTC says "broken_functor(3):".
    bool mapped = e.log().find("broken_functor:3:") != std::string::npos ||
                  e.log().find("broken_functor(3)") != std::string::npos;
    CHECK(mapped);
    CHECK(!e.options().empty());
    CHECK(e.source().find("undefined_thing") != std::string::npos);
  }
}

}  // namespace

TEST_SUITE("jit") {
  TEST_CASE("every preset compiles for the host and exports its entry points") {
    cache::KernelCache& cache = shared_cache();
    for (const std::string& name : preset_names()) {
      INFO(name);
      testing::Kernel k(preset_rule(name), DTypeBinding{}, cache);
      CHECK(k.num_roles() >= 2);
    }
  }

  TEST_CASE("the largest legal rule compiles for the host and loads, in seconds") {
    // lang/limits.hpp bounds rules so that this stays a few seconds (docs/rules.md#limits); the
    // time is reported, not asserted.
    cache::KernelCache cache(no_cache());
    auto rule = lang::parse_rule(testing::sized_rule({}), "largest.rule");
    const auto start = std::chrono::steady_clock::now();
    testing::Kernel k(rule, DTypeBinding{}, cache);
    MESSAGE("host compile of the largest legal rule: ",
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), " s");
    CHECK(k.num_roles() == 2 + 32);  // param, grad, 31 states and one output
  }

  TEST_CASE("the largest legal rule compiles with NVRTC, in seconds" * testing::needs_nvrtc()) {
    cache::KernelCache cache(no_cache());
    auto rule = lang::parse_rule(testing::sized_rule({}), "largest.rule");
    const auto start = std::chrono::steady_clock::now();
    auto body = codegen::generate_body(*rule, DTypeBinding{});
    CHECK(is_elf(*provider::provide_body(body, DTypeBinding{}, Target::cuda(90), cache).binary));
    MESSAGE("sm_90 compile of the largest legal rule: ",
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), " s");
  }

  TEST_CASE("a user rule on the host matches a float64 reference, with groups, init and scaling") {
    // A rule of our own (not a preset): momentum with an EMA weight average as an output,
    // a state initialised from the param, and a clamp.
    auto rule = lang::parse_rule(R"(param w
grad d
state buf = 0, avg = w
hyper lr = 0.01, mu = 0.9, decay = 0.99, limit = 0.5
output delta
buf = mu * buf + clamp(d, -limit, limit)
delta = -lr * buf
w = w + delta
avg = decay * avg + (1 - decay) * w
)",
                                 "mine.rule");
    testing::TempDir dir;
    cache::KernelCache cache(no_cache());
    testing::Kernel k(rule, DTypeBinding{}, cache);
    REQUIRE(k.num_roles() == 5);
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const std::vector<std::int64_t> sizes = {1, 0, 70000, 33, 65537};
    const std::vector<int> groups = {0, 1, 1, 0, 1};
    std::vector<std::vector<double>> hypers = {default_hypers(k),
                                               with_hyper(k, default_hypers(k), "lr", 0.05f)};
    hypers[1] = with_hyper(k, hypers[1], "limit", 2.0f);
    const float inv_scale = 0.25f;
    std::vector<std::vector<float>> w(5), d(5), buf(5), avg(5), delta(5);
    std::vector<std::vector<double>> rw(5), rbuf(5), ravg(5);
    std::vector<std::vector<void*>> ptrs(5);
    for (int t = 0; t < 5; ++t) {
      std::size_t n = static_cast<std::size_t>(sizes[t]);
      w[t].resize(n);
      d[t].resize(n);
      buf[t].assign(n, 123.0f);  // init must overwrite
      avg[t].assign(n, 123.0f);
      delta[t].assign(n, 0.0f);
      for (auto& x : w[t]) x = normal(rng);
      rw[t].assign(w[t].begin(), w[t].end());
      rbuf[t].assign(n, 0.0);
      ravg[t] = rw[t];
      ptrs[t] = {w[t].data(), d[t].data(), buf[t].data(), avg[t].data(), delta[t].data()};
    }
    init_states(k, ptrs, sizes, hypers, groups);
    for (int step = 1; step <= 20; ++step) {
      for (int t = 0; t < 5; ++t) {
        for (auto& x : d[t]) x = 4.0f * normal(rng);
      }
      run(k, ptrs, sizes, hypers, static_cast<float>(step), groups, inv_scale);
      for (int t = 0; t < 5; ++t) {
        const std::vector<double>& h = hypers[groups[t]];
        double lr = h[0], mu = h[1], decay = h[2], limit = h[3];
        for (std::size_t i = 0; i < rw[t].size(); ++i) {
          double g = static_cast<double>(d[t][i]) * inv_scale;
          rbuf[t][i] = mu * rbuf[t][i] + std::min(std::max(g, -limit), limit);
          double dl = -lr * rbuf[t][i];
          rw[t][i] += dl;
          ravg[t][i] = decay * ravg[t][i] + (1 - decay) * rw[t][i];
          // fp32 vs fp64 over 20 steps: relative 1e-5 of the magnitude, plus a small floor.
          REQUIRE(std::fabs(w[t][i] - rw[t][i]) <= 1e-5 * (1 + std::fabs(rw[t][i])));
          REQUIRE(std::fabs(buf[t][i] - rbuf[t][i]) <= 1e-5 * (1 + std::fabs(rbuf[t][i])));
          REQUIRE(std::fabs(avg[t][i] - ravg[t][i]) <= 1e-5 * (1 + std::fabs(ravg[t][i])));
          // delta = -lr * buf carries buf's error scaled by lr.
          REQUIRE(std::fabs(delta[t][i] - dl) <= 1e-5 * lr * (1 + std::fabs(rbuf[t][i])));
        }
      }
    }
  }

  TEST_CASE("host kernels loaded one after another each run their own code") {
    // Regression: modules load from /proc/self/fd/N; when the descriptor was closed, the
    // next kernel got the same N and dlopen returned the previous, different kernel.
    cache::KernelCache cache(no_cache());
    for (int round = 0; round < 3; ++round) {
      for (float sign : {-1.0f, 1.0f}) {
        std::string text = fmt::format("param p\ngrad g\np = p + {} * g + {}\n", sign, round);
        testing::Kernel k(lang::parse_rule(text, "r.rule"), DTypeBinding{}, cache);
        std::vector<float> p = {1.0f, 2.0f}, g = {0.5f, 0.25f};
        run(k, {{p.data(), g.data()}}, {2}, {default_hypers(k)}, 1.0f);
        CHECK(p[0] == 1.0f + sign * 0.5f + round);
        CHECK(p[1] == 2.0f + sign * 0.25f + round);
      }
    }
  }

  TEST_CASE("the host kernel's gradient check finds a non-finite element anywhere") {
    cache::KernelCache& cache = shared_cache();
    testing::Kernel k(preset_rule("sgd"), DTypeBinding{}, cache);
    std::mt19937 rng(std::random_device{}());
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    const std::vector<std::int64_t> sizes = {5, 0, 100000, 3};
    std::vector<std::vector<float>> p(4), g(4), buf(4);
    std::vector<std::vector<void*>> ptrs(4);
    for (int t = 0; t < 4; ++t) {
      p[t].resize(sizes[t]);
      buf[t].resize(sizes[t]);
      g[t].resize(sizes[t]);
      for (auto& x : g[t]) x = uniform(rng);
      ptrs[t] = {p[t].data(), g[t].data(), buf[t].data()};
    }
    std::vector<std::vector<double>> h = {default_hypers(k)};
    CHECK(grads_finite(k, ptrs, sizes, h, 1.0f));
    std::size_t at = std::uniform_int_distribution<std::size_t>(0, g[2].size() - 1)(rng);
    g[2][at] = NAN;
    CHECK_FALSE(grads_finite(k, ptrs, sizes, h, 1.0f));
    g[2][at] = 0.5f;
    g[3][2] = INFINITY;
    CHECK_FALSE(grads_finite(k, ptrs, sizes, h, 1.0f));
    g[3][2] = 0.5f;
    CHECK(grads_finite(k, ptrs, sizes, h, 1.0f));
    // Finite gradients that overflow once unscaled count as non-finite.
    CHECK(grads_finite(k, ptrs, sizes, h, 1e38f));  // |g| <= 1: still finite
    g[0][4] = 8.0f;
    CHECK_FALSE(grads_finite(k, ptrs, sizes, h, 1e38f));
  }

  TEST_CASE("lerp is torch.lerp bit for bit in fp32, for a weight below 0.5 and above") {
    // torch.lerp(a, b, w): a + w (b - a) when |w| < 0.5, else b - (b - a) (1 - w); its CPU
    // vector kernel and its CUDA kernel compute each branch as one fused multiply-add.
    cache::KernelCache cache(no_cache());
    testing::Kernel k(
        lang::parse_rule("param p\ngrad g\nhyper w = 0.1\np = lerp(p, g, w)\n", "lerp.rule"),
        DTypeBinding{}, cache);
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (const double w : {0.1, 0.001, 0.4999, 0.5, 0.7, 0.999, -0.3, -0.6, 1.5}) {
      const std::int64_t n = 4099;
      std::vector<float> p(n), g(n);
      for (std::int64_t i = 0; i < n; ++i) {
        p[i] = normal(rng);
        g[i] = normal(rng) * 3.0f;
      }
      const std::vector<float> p0 = p;
      std::vector<std::vector<void*>> ptrs = {{p.data(), g.data()}};
      run(k, ptrs, {n}, {{w}}, 1.0f);
      const float wf = static_cast<float>(w);
      std::int64_t wrong = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const float d = g[i] - p0[i];
        const float want =
            std::fabs(wf) < 0.5f ? std::fma(wf, d, p0[i]) : std::fma(wf - 1.0f, d, g[i]);
        wrong += std::memcmp(&p[i], &want, sizeof(float)) != 0;
      }
      CHECK_MESSAGE(wrong == 0, "weight " << w << ": " << wrong << " of " << n << " differ");
    }
  }

  TEST_CASE("the host rounds each operation as the rule writes it: a * b + c twice, fma once") {
    // The host compiler must not contract p * g + c into a fused multiply-add (g++ does by
    // default for C++, across statements): the option exact of the presets relies on it.
    cache::KernelCache cache(no_cache());
    testing::Kernel k(lang::parse_rule("param p\ngrad g\nstate f = 0\nhyper c = 0.3\n"
                                       "t = p * g\nf = fma(p, g, c)\np = t + c\n",
                                       "contract.rule"),
                      DTypeBinding{}, cache);
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const std::int64_t n = 4099;
    std::vector<float> p(n), g(n), f(n, 0.0f);
    for (std::int64_t i = 0; i < n; ++i) {
      p[i] = normal(rng);
      g[i] = normal(rng);
    }
    const std::vector<float> p0 = p;
    std::vector<std::vector<void*>> ptrs = {{p.data(), g.data(), f.data()}};
    run(k, ptrs, {n}, {{0.3}}, 1.0f);
    const float c = 0.3f;
    std::int64_t twice = 0, once = 0, fused_differs = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const float product = p0[i] * g[i];
      const float rounded_twice = product + c;
      const float rounded_once = std::fma(p0[i], g[i], c);
      twice += std::memcmp(&p[i], &rounded_twice, sizeof(float)) != 0;
      once += std::memcmp(&f[i], &rounded_once, sizeof(float)) != 0;
      fused_differs += rounded_once != rounded_twice;
    }
    CHECK_MESSAGE(twice == 0, twice << " of " << n << " elements of t + c were fused");
    CHECK_MESSAGE(once == 0, once << " of " << n << " elements of fma(p, g, c) differ");
    CHECK(fused_differs > 0);  // the data tells the two apart
  }

  TEST_CASE("max, min and clamp are fmaxf, fminf and their composition, NaN operands too") {
    // The host prelude writes them as selects (so the element loop vectorises): a NaN
    // operand yields the other one, as fmaxf/fminf, in whichever position it is.
    cache::KernelCache cache(no_cache());
    testing::Kernel k(lang::parse_rule("param p\ngrad g\nstate a = 0, b = 0\n"
                                       "hyper lo = -0.5, hi = 0.75\n"
                                       "a = max(p, g)\nb = min(g, p)\n"
                                       "p = clamp(p + g, lo, hi)\n",
                                       "minmax.rule"),
                      DTypeBinding{}, cache);
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const std::int64_t n = 4099;
    std::vector<float> p(n), g(n), a(n), b(n);
    const float nan = std::nanf(""), inf = INFINITY;
    for (std::int64_t i = 0; i < n; ++i) {
      p[i] = normal(rng);
      g[i] = normal(rng);
      switch (i % 11) {  // NaN, infinities and equal values, in either operand
        case 1:
          p[i] = nan;
          break;
        case 2:
          g[i] = nan;
          break;
        case 3:
          p[i] = g[i] = nan;
          break;
        case 4:
          p[i] = inf;
          break;
        case 5:
          g[i] = -inf;
          break;
        case 6:
          g[i] = p[i];
          break;
        default:
          break;
      }
    }
    const std::vector<float> p0 = p;
    std::vector<std::vector<void*>> ptrs = {{p.data(), g.data(), a.data(), b.data()}};
    run(k, ptrs, {n}, {{-0.5, 0.75}}, 1.0f);
    std::int64_t wrong = 0;
    auto same = [](float x, float y) {
      return std::memcmp(&x, &y, sizeof x) == 0 || (x != x && y != y);
    };
    for (std::int64_t i = 0; i < n; ++i) {
      const float want_p = std::fmin(std::fmax(p0[i] + g[i], -0.5f), 0.75f);
      wrong += !same(a[i], std::fmax(p0[i], g[i])) + !same(b[i], std::fmin(g[i], p0[i])) +
               !same(p[i], want_p);
    }
    CHECK_MESSAGE(wrong == 0, wrong << " of " << 3 * n << " values differ from fmaxf/fminf");
  }

  // User names are emitted with a prefix, so C++ and CUDA names are ordinary rule names.
  const char* const kCxxNamesRule = R"(param float
grad  int
state half = 0, auto = 0
hyper class = 0.1, lr = 1e-3
double = int * int
half = lerp(half, int, class)
auto = auto + double
std = sqrt(auto) + 1e-8
float = float - lr * half / std
)";

  TEST_CASE("C++ and CUDA names are rule names: std, int, float, half, auto, class on the host") {
    cache::KernelCache cache(no_cache());
    testing::Kernel k(lang::parse_rule(kCxxNamesRule, "names.rule"), DTypeBinding{}, cache);
    // One step over 3 elements against the same formula written out here.
    std::vector<float> p = {1.0f, -2.0f, 0.5f}, g = {0.5f, 1.0f, -3.0f};
    std::vector<float> half(3, 0.0f), aut(3, 0.0f);
    std::vector<std::vector<void*>> ptrs = {{p.data(), g.data(), half.data(), aut.data()}};
    init_states(k, ptrs, {3}, {{0.1, 1e-3}});
    const std::vector<float> p0 = p;
    run(k, ptrs, {3}, {{0.1, 1e-3}}, 1.0f);
    for (int i = 0; i < 3; ++i) {
      const double h = 0.1 * g[i], a = double(g[i]) * g[i], s = std::sqrt(a) + 1e-8;
      CHECK(p[i] == doctest::Approx(p0[i] - 1e-3 * h / s).epsilon(1e-6));
      CHECK(half[i] == doctest::Approx(h).epsilon(1e-6));
    }
  }

  TEST_CASE("C++ and CUDA names are rule names: the same rule with NVRTC for sm_90" *
            testing::needs_nvrtc()) {
    cache::KernelCache cache(no_cache());
    auto body = codegen::generate_body(*lang::parse_rule(kCxxNamesRule, "names.rule"), {});
    CHECK(is_elf(*provider::provide_body(body, DTypeBinding{}, Target::cuda(90), cache).binary));
  }

  TEST_CASE("a trusted functor compiles for the host and runs") {
    cache::KernelCache cache(no_cache());
    auto body = codegen::generate_functor_body(functor_sgd(), DTypeBinding{});
    provider::ProvidedKernel k =
        provider::provide_body(body, DTypeBinding{}, Target::host(), cache);
    REQUIRE(is_elf(*k.binary));
    // Loaded as the Optimizer loads a host kernel, its states initialised, then two steps
    // over fresh random data against the functor's formula in float64.
    auto backend = runtime::make_backend(Device::host());
    std::shared_ptr<const std::string> binary = k.binary;
    std::shared_ptr<runtime::Module> module = backend->load(
        runtime::KernelImage{Target::host(), std::move(binary), k.take_info()}, nullptr);
    REQUIRE(module != nullptr);
    const std::int64_t n = 1000;
    std::mt19937 rng(std::random_device{}());
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> p(n), g(n), m(n, -7.0f);
    for (std::int64_t i = 0; i < n; ++i) p[i] = u(rng), g[i] = u(rng);
    runtime::BindingTensors t;
    t.ptrs = {{p.data(), g.data(), m.data()}};  // p, g, then the states (functor roles)
    t.numel = {n};
    const double lr = 0.25, mu = 0.5;  // fo_hypers in the functor's order: lr, mu
    runtime::Binding b(*backend, module, t, {{lr, mu}});
    b.init_states();
    std::vector<double> want_p(p.begin(), p.end()), want_m(n, 0.5);  // m's initial value
    for (int step = 1; step <= 2; ++step) {
      testing::Kernel::step(b, step);
      for (std::int64_t i = 0; i < n; ++i) {
        want_m[i] = mu * want_m[i] + g[i];
        want_p[i] -= lr * want_m[i];
      }
    }
    std::int64_t wrong = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      wrong += std::abs(m[i] - want_m[i]) > 1e-6 * (1 + std::abs(want_m[i])) ||
               std::abs(p[i] - want_p[i]) > 1e-6 * (1 + std::abs(want_p[i]));
    }
    CHECK_MESSAGE(wrong == 0, wrong << " of " << 2 * n << " values differ from the reference");
  }

  TEST_CASE("a trusted functor compiles with NVRTC" * testing::needs_nvrtc()) {
    cache::KernelCache cache(no_cache());
    auto body = codegen::generate_functor_body(functor_sgd(), DTypeBinding{});
    CHECK(is_elf(*provider::provide_body(body, DTypeBinding{}, Target::cuda(90), cache).binary));
  }

  TEST_CASE(
      "a compile error carries the log, the options and the source, mapped to the functor's "
      "lines") {
    check_compile_error(Target::host());
  }

  TEST_CASE("an NVRTC compile error carries the log, the options and the source, mapped too" *
            testing::needs_nvrtc()) {
    check_compile_error(Target::cuda(90));
  }

  TEST_CASE("FUSEDOPT_DUMP_SOURCE writes every generated source") {
    testing::TempDir dir;
    setenv("FUSEDOPT_DUMP_SOURCE", (dir.path() / "dump").c_str(), 1);
    // The source is dumped before the cache is asked, so a cached kernel is dumped too.
    cache::KernelCache& cache = shared_cache();
    auto body = codegen::generate_body(*preset_rule("sgd"), DTypeBinding{});
    provider::ProvidedKernel k =
        provider::provide_body(body, DTypeBinding{}, Target::host(), cache);
    unsetenv("FUSEDOPT_DUMP_SOURCE");
    int files = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir.path() / "dump")) {
      ++files;
      CHECK(e.path().extension() == ".cpp");
      CHECK(testing::read_file(e.path()) == k.source);
    }
    CHECK(files == 1);
  }

  TEST_CASE("the cache key changes with the source, the dtypes and the target") {
    auto rule = preset_rule("adamw");
    auto body32 = codegen::generate_body(*rule, DTypeBinding{});
    auto body16 = codegen::generate_body(*rule, DTypeBinding::parse("bf16"));
    auto key = [](const codegen::KernelBody& b, const char* d, Target t) {
      DTypeBinding dt = DTypeBinding::parse(d);
      return provider::kernel_record(b, dt, t, codegen::generate_source(b, t)).key();
    };
    cache::Key a = key(body32, "fp32", Target::host());
    CHECK(a == key(body32, "fp32", Target::host()));
    CHECK(a != key(body16, "bf16", Target::host()));
    cache::KeyRecord r = provider::kernel_record(body32, DTypeBinding{}, Target::host(),
                                                 codegen::generate_source(body32, Target::host()));
    for (const char* field : {"source", "options", "target", "compiler", "fusedopt_version",
                              "format_version", "target_fingerprint", "dtypes"}) {
      INFO(field);
      CHECK(!r.get(field).empty());
    }
  }

  TEST_CASE("the cache key changes with the CUDA architecture" * testing::needs_nvrtc()) {
    auto body32 = codegen::generate_body(*preset_rule("adamw"), DTypeBinding{});
    auto key = [&](Target t) {
      DTypeBinding dt = DTypeBinding::parse("fp32");
      return provider::kernel_record(body32, dt, t, codegen::generate_source(body32, t)).key();
    };
    cache::Key a = key(Target::host());
    cache::Key c80 = key(Target::cuda(80));
    cache::Key c90 = key(Target::cuda(90));
    CHECK(c80 != c90);
    CHECK(a != c90);
  }

  TEST_CASE("the emulator's target: the CUDA source unchanged, its own key, its header keyed") {
    CHECK(Target::parse("emu") == Target::emu());
    CHECK(Target::emu().str() == "emu");
    CHECK(Target::emu().cuda_source());
    CHECK_FALSE(Target::host().cuda_source());
    auto body = codegen::generate_body(*preset_rule("adamw"), DTypeBinding{});
    // Byte for byte what NVRTC compiles for sm_90, but for the first line, a comment
    // naming the target.
    auto after_first_line = [](const std::string& text) { return text.substr(text.find('\n')); };
    CHECK(after_first_line(codegen::generate_source(body, Target::emu())) ==
          after_first_line(codegen::generate_source(body, Target::cuda(90))));
    const std::string src = codegen::generate_source(body, Target::emu());
    cache::KeyRecord emu = provider::kernel_record(body, DTypeBinding{}, Target::emu(), src);
    cache::KeyRecord host = provider::kernel_record(body, DTypeBinding{}, Target::host(), src);
    CHECK(emu.key() != host.key());
    CHECK(emu.get("headers").find("FO_EMU_ABI_VERSION") != std::string::npos);
    CHECK(emu.get("options").find("-fsanitize=kernel-address") != std::string::npos);
    // The image: its header, then a shared object exporting an entry per kernel.
    const std::string image =
        jit::compiler_for(Target::emu()).compile(src, "fusedopt_adamw.cu", Target::emu());
    REQUIRE(image.size() > 24);
    CHECK(image.compare(0, 8, "FOEMUIMG") == 0);
    CHECK(image.compare(24, 4,
                        "\x7f"
                        "ELF") == 0);
    for (const char* entry : {"fo_emu_entry_fusedopt_step", "fo_emu_entry_fusedopt_init",
                              "fo_emu_entry_fusedopt_check", "fo_emu_entry_fusedopt_finalize",
                              "fo_emu_sizes_fusedopt_advance_step", "fo_emu_module_init"}) {
      CHECK_MESSAGE(image.find(entry) != std::string::npos, entry);
    }
  }

  TEST_CASE("bad targets and dtypes are clear errors") {
    CHECK_THROWS_WITH_AS(Target::parse("sm_9x"), doctest::Contains("bad target 'sm_9x'"), Error);
    CHECK_THROWS_WITH_AS(Target::parse("gpu"), doctest::Contains("sm_80"), Error);
    CHECK_THROWS_WITH_AS(Target::parse("gpu"), doctest::Contains("'emu'"), Error);
    // Too many digits is a bad target, not an int overflow (UBSan).
    CHECK_THROWS_WITH_AS(Target::parse("sm_99999999999"),
                         doctest::Contains("bad target 'sm_99999999999'"), UsageError);
    CHECK_THROWS_WITH_AS(DTypeBinding::parse("fp8"), doctest::Contains("bad dtype 'fp8'"), Error);
    CHECK_THROWS_WITH_AS(DTypeBinding::parse("fp32+master"), doctest::Contains("master"), Error);
    CHECK(DTypeBinding::parse("bf16:fp16:fp32+master").str() == "bf16:fp16:fp32+master");
    CHECK(Target::parse("sm_90a").str() == "sm_90a");
  }
}

}  // namespace fusedopt::testing
