// float64 params (DTypeBinding "fp64:fp64:fp64"): states kept in float64 and the element math
// in double, checked against float64 references written here to 1e-12 (fp32 math would be
// some 1e-7 off); f32 and f64 params in one optimizer; checkpoints; what fp64 refuses.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "codegen/codegen.hpp"
#include "common/host_tensors.hpp"
#include "common/requirements.hpp"
#include "common/temp_dir.hpp"
#include "fusedopt/error.hpp"
#include "presets.hpp"

namespace fusedopt::testing {
namespace {

using fusedopt::DType;

/// double-precision math must land this close: |fused - ref| <= kF64Tol * (|ref| + 1).
constexpr double kF64Tol = 1e-12;

/// One element's step of a rule in double: (p, g, states, step, per-tensor scalars) -> new
/// p and states.
using ElementStep = std::function<void(double& p, double g, std::vector<double>& s, int step)>;

/// torch.lerp as the prelude computes it (two fused multiply-adds).
double lerp(double a, double b, double w) {
  const double d = b - a;
  return std::abs(w) < 0.5 ? std::fma(w, d, a) : std::fma(w - 1.0, d, b);
}

ElementStep adam_step(double lr, double b1, double b2, double eps, double wd, bool decoupled) {
  return [=](double& p, double g, std::vector<double>& s, int t) {
    double d = g;
    if (decoupled) {
      p = p * (1 - lr * wd);
    } else {
      d = d + wd * p;
    }
    s[0] = lerp(s[0], d, 1 - b1);
    s[1] = b2 * s[1] + (1 - b2) * d * d;
    const double step_size = lr / (1 - std::pow(b1, t));
    const double denom = std::sqrt(s[1]) / std::sqrt(1 - std::pow(b2, t)) + eps;
    p = p - step_size * s[0] / denom;
  };
}

ElementStep sgd_step(double lr, double momentum, double dampening, double wd, bool nesterov) {
  return [=](double& p, double g, std::vector<double>& s, int t) {
    double d = g + wd * p;
    s[0] = t == 1 ? d : d * (1 - dampening) + s[0] * momentum;
    d = nesterov ? d + s[0] * momentum : s[0];
    p = p - lr * d;
  };
}

/// The user rule of kUserRule, its scalar `c` kept by the caller (index 2 of s).
constexpr const char* kUserRule = R"(param p
grad g
state a = 0, b = 1
scalar c = 1
hyper lr = 0.01, k = 0.5
c = c * (1 - 0.1 * k)
a = lerp(a, g, 0.2)
b = max(b * 0.9, abs(g))
u = a * rsqrt(b + 1e-3) + clamp(sign(g) * exp(-abs(p)), -0.5, 0.5)
u = where(p > 0, u, min(u, (abs(u) + 0.1) ^ 1.5))
u = u + mod(g, 0.7) * 0.01 + (p % -1.5) * 0.001 + where(step % 3 == 0, 0.002, 0)
p = p - lr * c * (u + tanh(p) * 0.01 + log1p(abs(g)) * 0.001)
)";

/// a % b as the rules define it (torch.remainder, Python): the sign of b.
double remainder(double a, double b) { return a - b * std::floor(a / b); }

ElementStep user_step(double lr, double k) {
  return [=](double& p, double g, std::vector<double>& s, int step) {
    const double c = s[2] * (1 - 0.1 * k);  // the step's scalar (the caller stores it)
    s[0] = lerp(s[0], g, 0.2);
    s[1] = std::max(s[1] * 0.9, std::abs(g));
    const double sign = static_cast<double>(g > 0) - static_cast<double>(g < 0);
    double u = s[0] * (1.0 / std::sqrt(s[1] + 1e-3)) +
               std::min(std::max(sign * std::exp(-std::abs(p)), -0.5), 0.5);
    u = p > 0 ? u : std::min(u, std::pow(std::abs(u) + 0.1, 1.5));
    u = u + remainder(g, 0.7) * 0.01 + remainder(p, -1.5) * 0.001 + (step % 3 == 0 ? 0.002 : 0);
    p = p - lr * c * (u + std::tanh(p) * 0.01 + std::log1p(std::abs(g)) * 0.001);
  };
}

/// Steps `rule` over float64 params of `sizes` for `steps` steps with fresh normal grads, and
/// checks params and element states against `ref` each step.
void run_f64(const fusedopt::Rule& rule, const std::vector<std::pair<std::string, double>>& hypers,
             const std::vector<double>& init, const ElementStep& ref, int steps = 10,
             bool scalar_c = false) {
  use_private_cache();
  const std::uint32_t seed = fresh_seed();
  INFO("rule " << rule.name() << ", seed " << seed);
  std::mt19937 rng(seed);
  const std::vector<std::int64_t> sizes = {1000, 1, 4099, 0, 77};
  std::vector<HostTensor> p, g;
  fusedopt::ParamGroup group;
  group.hypers = hypers;
  for (std::int64_t n : sizes) {
    p.emplace_back(n, DType::F64);
    g.emplace_back(n, DType::F64);
    fill_normal(p.back(), rng);
  }
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    group.params.push_back(p[k].tensor());
    group.grads.push_back(g[k].tensor());
  }
  fusedopt::Optimizer opt(rule, {group});
  // One launch (and one more that writes a scalar state's values after the update).
  CHECK(opt.stats().launches_per_step == (scalar_c ? 2 : 1));
  for (const fusedopt::StateInfo& s : opt.states()) {
    if (s.kind == fusedopt::StateKind::Element) CHECK(s.dtype == DType::F64);
  }
  // The reference's params and states, from the same start.
  std::vector<std::vector<double>> rp(sizes.size()), rs(sizes.size());
  std::vector<double> rc(sizes.size(), 1.0);
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    for (std::int64_t i = 0; i < sizes[k]; ++i) {
      rp[k].push_back(p[k].get(i));
      rs[k].insert(rs[k].end(), init.begin(), init.end());
    }
  }
  const double k_hyper = 0.5;
  double worst = 0;
  for (int t = 1; t <= steps; ++t) {
    for (auto& x : g) fill_normal(x, rng);
    opt.step();
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      for (std::int64_t i = 0; i < sizes[k]; ++i) {
        std::vector<double> s(rs[k].begin() + i * init.size(),
                              rs[k].begin() + (i + 1) * init.size());
        if (scalar_c) s.push_back(rc[k]);
        ref(rp[k][i], g[k].get(i), s, t);
        std::copy(s.begin(), s.begin() + init.size(), rs[k].begin() + i * init.size());
      }
      if (scalar_c) rc[k] *= 1 - 0.1 * k_hyper;
      for (std::int64_t i = 0; i < sizes[k]; ++i) {
        const double want = rp[k][i], got = p[k].get(i);
        worst = std::max(worst, std::abs(got - want) / (std::abs(want) + 1));
        REQUIRE(std::abs(got - want) <= kF64Tol * (std::abs(want) + 1));
        for (std::size_t j = 0; j < init.size(); ++j) {
          const fusedopt::Tensor st = opt.state(rule.states()[j], static_cast<int>(k));
          REQUIRE(st.dtype == DType::F64);
          const double ws = rs[k][i * init.size() + j];
          REQUIRE(std::abs(at(st, i) - ws) <= kF64Tol * (std::abs(ws) + 1));
        }
      }
    }
  }
  MESSAGE(rule.name() << ": worst relative error over " << steps << " steps " << worst);
}

}  // namespace

TEST_SUITE("runtime") {
  TEST_CASE("float64 adamw steps in double, matching a float64 reference to 1e-12") {
    run_f64(fusedopt::Rule::preset("adamw"), {{"lr", 1e-2}, {"weight_decay", 0.1}}, {0.0, 0.0},
            adam_step(1e-2, 0.9, 0.999, 1e-8, 0.1, true));
  }

  TEST_CASE("float64 adam with weight decay steps in double, matching a float64 reference") {
    run_f64(fusedopt::Rule::preset("adam"), {{"lr", 3e-2}, {"weight_decay", 0.05}}, {0.0, 0.0},
            adam_step(3e-2, 0.9, 0.999, 1e-8, 0.05, false));
  }

  TEST_CASE(
      "float64 sgd with momentum and nesterov steps in double, matching a float64 "
      "reference") {
    run_f64(fusedopt::Rule::preset("sgd"),
            {{"lr", 0.1}, {"momentum", 0.9}, {"dampening", 0.1}, {"weight_decay", 0.01}}, {0.0},
            sgd_step(0.1, 0.9, 0.1, 0.01, false));
    run_f64(fusedopt::Rule::preset("sgd"),
            {{"lr", 0.1}, {"momentum", 0.9}, {"weight_decay", 0.01}, {"nesterov", 1}}, {0.0},
            sgd_step(0.1, 0.9, 0.0, 0.01, true));
  }

  TEST_CASE("a float64 user rule's built-ins, uniform values and scalar state are double") {
    run_f64(fusedopt::Rule::parse(kUserRule, "f64_user.rule"), {}, {0.0, 1.0}, user_step(0.01, 0.5),
            10, true);
  }

  TEST_CASE(
      "float32 and float64 params in one optimizer step in two bindings, each at its "
      "precision") {
    use_private_cache();
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    HostTensor p32(513, DType::F32), g32(513, DType::F32), p64(700, DType::F64),
        g64(700, DType::F64);
    fill_normal(p32, rng);
    fill_normal(p64, rng);
    fusedopt::ParamGroup group;
    group.params = {p32.tensor("w32"), p64.tensor("w64")};
    group.grads = {g32.tensor(), g64.tensor()};
    group.hypers = {{"lr", 1e-2}, {"weight_decay", 0.1}};
    fusedopt::OptimizerOptions options;
    options.state_dtype = DType::BF16;  // the f32 param's; the f64 param's stay float64
    fusedopt::Optimizer opt(fusedopt::Rule::preset("adamw"), {group}, options);
    CHECK(opt.stats().launches_per_step == 2);
    CHECK(opt.state("m", 0).dtype == DType::BF16);
    CHECK(opt.state("m", 1).dtype == DType::F64);
    CHECK(opt.state("v", 1).numel == 700);
    const ElementStep ref = adam_step(1e-2, 0.9, 0.999, 1e-8, 0.1, true);
    std::vector<double> rp, rs(2 * 700, 0.0);
    for (std::int64_t i = 0; i < 700; ++i) rp.push_back(p64.get(i));
    for (int t = 1; t <= 10; ++t) {
      fill_normal(g32, rng);
      fill_normal(g64, rng);
      opt.step();
      for (std::int64_t i = 0; i < 700; ++i) {
        std::vector<double> s = {rs[2 * i], rs[2 * i + 1]};
        ref(rp[i], g64.get(i), s, t);
        rs[2 * i] = s[0];
        rs[2 * i + 1] = s[1];
        REQUIRE(std::abs(p64.get(i) - rp[i]) <= kF64Tol * (std::abs(rp[i]) + 1));
      }
    }
    // The f32 param stepped too (bf16 states: its own tests hold its precision).
    double moved = 0;
    for (std::int64_t i = 0; i < 513; ++i) moved += std::abs(at(opt.state("m", 0), i));
    CHECK(moved > 0);
  }

  TEST_CASE("a float64 optimizer's checkpoint holds float64 states and resumes bit for bit") {
    use_private_cache();
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    const fusedopt::Rule rule = fusedopt::Rule::parse(kUserRule, "f64_user.rule");
    auto make = [&](std::vector<HostTensor>& p, std::vector<HostTensor>& g) {
      fusedopt::ParamGroup group;
      for (std::size_t k = 0; k < p.size(); ++k) {
        group.params.push_back(p[k].tensor("t" + std::to_string(k)));
        group.grads.push_back(g[k].tensor());
      }
      return fusedopt::Optimizer(rule, {group});
    };
    std::vector<HostTensor> pa, ga, pb, gb;
    for (std::int64_t n : {300, 5}) {
      pa.emplace_back(n, DType::F64);
      ga.emplace_back(n, DType::F64);
      pb.emplace_back(n, DType::F64);
      gb.emplace_back(n, DType::F64);
      fill_normal(pa.back(), rng);
    }
    fusedopt::Optimizer a = make(pa, ga);
    auto fill_grads = [&] {
      for (std::size_t k = 0; k < ga.size(); ++k) {
        fill_normal(ga[k], rng);
        for (std::int64_t i = 0; i < ga[k].numel(); ++i) gb[k].set(i, ga[k].get(i));
      }
    };
    for (int t = 0; t < 3; ++t) {
      fill_grads();
      a.step();
    }
    fusedopt::testing::TempDir dir;
    const std::filesystem::path file = dir.path() / "f64.safetensors";
    a.save(file);
    for (std::size_t k = 0; k < pa.size(); ++k) {
      for (std::int64_t i = 0; i < pa[k].numel(); ++i) pb[k].set(i, pa[k].get(i));
    }
    fusedopt::Optimizer b = make(pb, gb);
    b.load(file);
    CHECK(b.step_count() == 3);
    for (int t = 0; t < 3; ++t) {
      fill_grads();
      a.step();
      b.step();
    }
    for (std::size_t k = 0; k < pa.size(); ++k) {
      for (std::int64_t i = 0; i < pa[k].numel(); ++i) REQUIRE(pa[k].get(i) == pb[k].get(i));
      const fusedopt::Tensor sa = a.state("a", static_cast<int>(k));
      const fusedopt::Tensor sb = b.state("a", static_cast<int>(k));
      CHECK(sa.dtype == DType::F64);
      CHECK(std::memcmp(sa.data, sb.data, static_cast<std::size_t>(sa.numel) * 8) == 0);
    }
    // The file's states are F64 tensors: a float32 optimizer of the same names refuses it.
    std::vector<HostTensor> pc, gc;
    for (std::int64_t n : {300, 5}) {
      pc.emplace_back(n, DType::F32);
      gc.emplace_back(n, DType::F32);
    }
    fusedopt::ParamGroup group;
    for (std::size_t k = 0; k < pc.size(); ++k) {
      group.params.push_back(pc[k].tensor("t" + std::to_string(k)));
      group.grads.push_back(gc[k].tensor());
    }
    fusedopt::Optimizer c(rule, {group});
    CHECK_THROWS_AS(c.load(file), fusedopt::Error);
  }

  TEST_CASE(
      "float64 params refuse rules with reductions or row/column states, quantized "
      "states, and a grad of another dtype") {
    use_private_cache();
    HostTensor p(64, DType::F64), g(64, DType::F64), g32(64, DType::F32);
    auto group_of = [&](HostTensor& grad) {
      fusedopt::ParamGroup group;
      group.params = {p.tensor("w")};
      group.grads = {grad.tensor()};
      return group;
    };
    CHECK_THROWS_WITH_AS(
        fusedopt::Optimizer(fusedopt::Rule::preset("lamb"), {group_of(g)}),
        "rule 'lamb' has reduction passes: fp64 params (dtypes fp64:fp64:fp64) step only rules "
        "without reductions and row/column states (their partial sums and row/column values "
        "are fp32)",
        fusedopt::UsageError);
    CHECK_THROWS_WITH_AS(
        fusedopt::Optimizer(fusedopt::Rule::preset("adafactor"), {group_of(g)}),
        "rule 'adafactor' has row/column states or means: fp64 params (dtypes fp64:fp64:fp64) "
        "step only rules without reductions and row/column states (their partial sums and "
        "row/column values are fp32)",
        fusedopt::UsageError);
    fusedopt::OptimizerOptions clip;
    clip.max_grad_norm = 1.0;
    CHECK_THROWS_AS(fusedopt::Optimizer(fusedopt::Rule::preset("adamw"), {group_of(g)}, clip),
                    fusedopt::UsageError);
    fusedopt::OptimizerOptions q8;
    q8.state_storage = {{"*", "q8"}};
    q8.quant_min_numel = 0;
    CHECK_THROWS_WITH_AS(
        fusedopt::Optimizer(fusedopt::Rule::preset("adamw"), {group_of(g)}, q8),
        "group 0, param 0 ('w'): a float64 param keeps its states in float64; quantized states "
        "(state_storage, or the rule's `storage`) are not bound to float64 params",
        fusedopt::UsageError);
    CHECK_THROWS_WITH_AS(fusedopt::Optimizer(fusedopt::Rule::preset("adamw"), {group_of(g32)}),
                         "group 0, param 0 ('w'): param is fp64 but grad is fp32 (a float64 "
                         "param steps with a float64 grad, and only it)",
                         fusedopt::UsageError);
  }

  TEST_CASE(
      "the fp64 binding parses as fp64:fp64:fp64 and refuses mixes, masters, sr and "
      "quantized states") {
    const fusedopt::DTypeBinding b = fusedopt::DTypeBinding::parse("fp64");
    CHECK(b.str() == "fp64:fp64:fp64");
    CHECK(fusedopt::DTypeBinding::parse("float64:f64:fp64") == b);
    CHECK_THROWS_WITH_AS(
        fusedopt::DTypeBinding::parse("fp64:fp32:fp64"),
        "bad dtypes 'fp64:fp32:fp64': fp64 binds params, grads and states together "
        "(fp64:fp64:fp64)",
        fusedopt::UsageError);
    CHECK_THROWS_AS(fusedopt::DTypeBinding::parse("fp32:fp32:fp64"), fusedopt::UsageError);
    for (const char* bad : {"fp64+master", "fp64+sr", "fp64+q=q8s/q8u"}) {
      INFO(bad);
      CHECK_THROWS_WITH_AS(fusedopt::DTypeBinding::parse(bad),
                           (std::string("bad dtypes '") + bad +
                            "': fp64 params take no master copy, stochastic rounding or "
                            "quantized states")
                               .c_str(),
                           fusedopt::UsageError);
    }
  }

  TEST_CASE(
      "an fp64 binding's element code is double, and an fp32 binding's source holds "
      "nothing of it") {
    const auto rule = fusedopt::preset_rule("adamw");
    const auto f64 = fusedopt::codegen::generate_body(*rule, fusedopt::DTypeBinding::parse("fp64"));
    const auto f32 = fusedopt::codegen::generate_body(*rule, fusedopt::DTypeBinding::parse("fp32"));
    CHECK(f64.f64);
    CHECK(!f32.f64);
    CHECK(f64.code.find("double v_p = fo_load(t.r0, i)") != std::string::npos);
    CHECK(f64.code.find("float v_") == std::string::npos);
    CHECK(f64.code.find("double u[") != std::string::npos);
    CHECK(f32.code.find("float v_p = fo_load(t.r0, i)") != std::string::npos);
    CHECK(f32.code.find("double v_") == std::string::npos);
    const std::string host64 = fusedopt::codegen::generate_source(f64, fusedopt::Target::host());
    const std::string host32 = fusedopt::codegen::generate_source(f32, fusedopt::Target::host());
    CHECK(host64.find("FUSEDOPT_F64_H") != std::string::npos);
    CHECK(host32.find("FUSEDOPT_F64_H") == std::string::npos);
    const std::string cuda64 = fusedopt::codegen::generate_source(f64, fusedopt::Target::cuda(80));
    CHECK(cuda64.find("fo_vec4<double>") != std::string::npos);
    CHECK(fusedopt::codegen::generate_source(f32, fusedopt::Target::cuda(80)).find("double>") ==
          std::string::npos);
  }

  TEST_CASE("an fp64 binding's CUDA kernel compiles for the CUDA emulator") {
    use_private_cache();
    const fusedopt::Rule rule = fusedopt::Rule::parse(kUserRule, "f64_user.rule");
    const fusedopt::CompiledKernel k = fusedopt::compile_kernel(
        rule, fusedopt::Target::emu(), fusedopt::DTypeBinding::parse("fp64"));
    REQUIRE(k.binary);
    CHECK(k.source.find("fo_vec4<double>") != std::string::npos);
  }

  TEST_CASE("an fp64 binding's CUDA kernel compiles with NVRTC for sm_80" *
            fusedopt::testing::needs_nvrtc()) {
    use_private_cache();
    for (const char* name : {"adamw", "sgd"}) {
      INFO(name);
      const fusedopt::CompiledKernel k =
          fusedopt::compile_kernel(fusedopt::Rule::preset(name), fusedopt::Target::cuda(80),
                                   fusedopt::DTypeBinding::parse("fp64"));
      REQUIRE(k.binary);
      CHECK(k.dtypes.str() == "fp64:fp64:fp64");
    }
    const fusedopt::CompiledKernel user =
        fusedopt::compile_kernel(fusedopt::Rule::parse(kUserRule, "f64_user.rule"),
                                 fusedopt::Target::cuda(80), fusedopt::DTypeBinding::parse("fp64"));
    REQUIRE(user.binary);
  }
}

}  // namespace fusedopt::testing
