// Every preset under each dtype binding the GPU tests name (fp32; bf16 params with an fp32
// master; fp16 grads with fp32 params and states) on the device, each against the host
// Optimizer in fp32 stepping the same numbers (values the binding's dtypes hold exactly,
// decoded by the tests' own encoder: the device's loads and stores of 16-bit roles are
// checked too), over a few steps, on tensors that take every path of the CUDA kernel: odd
// (7 elements: one vector group and a 3-element tail), the vector path with a 2-element tail
// (1030), an empty tensor in the middle, and a view one element into its buffer (the
// scalar path), in two param groups.
// The host optimizer is itself held to float64 references (tests/runtime/
// test_optimizer_presets.cpp, test_optimizer_dtypes.cpp, test_reductions.cpp,
// test_factored.cpp, test_scalar_state.cpp), so the device is held to the host within the
// same tolerance. Every preset takes every one of these bindings (none refuses one).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/requirements.hpp"
#include "common/twin_tensors.hpp"
#include "fusedopt/cuda.hpp"
#include "fusedopt/kernel.hpp"

namespace fusedopt::testing {

using namespace fusedopt;

namespace {

/// The tolerance of device against host: |device - host| <= kTol * (|host| + the largest
/// |host| of the role). Both run the same generated fp32 body on the same inputs; they
/// differ where the compilers contract a * b + c into one rounding or not (NVRTC does by
/// default), in CUDA's libm (expf, powf, rsqrtf within 2 ulp of the host's) and in the
/// order of reductions (64 K-element chunks on the GPU, 32 K on the host, each summed in
/// double): a few fp32 ulps (2^-23 = 1.2e-7) per step, ~1e-6 of the role's size after 4
/// steps. 1e-5 is the host preset tests' tolerance against float64 (kTol there).
constexpr double kTol = 1e-5;
/// Per-tensor scalar states are doubles on both sides, computed from the same hypers and
/// step; only the two libm's pow differ (an ulp or so).
constexpr double kScalarTol = 1e-12;
constexpr int kSteps = 4;

struct Binding {
  const char* name;
  DType param;
  DType grad;
  bool master;
};

/// One tensor of the model: its size, shape (Adafactor factors the matrices), elements
/// past an aligned start, and param group.
struct Layout {
  std::int64_t numel;
  std::vector<std::int64_t> shape;
  std::int64_t offset;
  int group;
};

const std::vector<Layout>& layout() {
  static const std::vector<Layout> l = {
      {7, {}, 0, 0},            // odd: one 4-element group, then a 3-element tail
      {1000, {8, 125}, 0, 0},   // the vector path; a matrix
      {0, {}, 0, 0},            // empty, in the middle
      {1030, {10, 103}, 0, 1},  // > 4 and not a multiple of 4: vector body, 2-element tail
      {333, {}, 1, 1},          // one element past an aligned start: the scalar path
  };
  return l;
}

/// Hypers that exercise each preset's options (group 1 gets a third of the lr). Every
/// preset must be listed: a new one fails the case until it is added here.
const std::map<std::string, std::vector<std::pair<std::string, double>>>& preset_hypers() {
  static const std::map<std::string, std::vector<std::pair<std::string, double>>> h = {
      {"sgd", {{"lr", 1e-2}, {"momentum", 0.9}, {"weight_decay", 1e-2}, {"nesterov", 1}}},
      {"adam", {{"lr", 1e-2}, {"weight_decay", 0.1}}},
      {"adamw", {{"lr", 1e-2}, {"maximize", 1}}},
      {"adam+amsgrad", {{"lr", 1e-2}, {"beta2", 0.9}}},
      {"adam+exact", {{"lr", 1e-2}, {"weight_decay", 0.1}}},
      {"adamw+exact", {{"lr", 1e-2}, {"maximize", 1}}},
      {"adamw+amsgrad", {{"lr", 1e-2}, {"beta2", 0.9}}},
      // beta2 0.99 and steps 4 to 7: rho_t crosses 5 between steps 5 (4.96) and 6 (5.94),
      // so both branches of the rectification run.
      {"radam",
       {{"lr", 1e-2}, {"beta2", 0.99}, {"weight_decay", 0.1}, {"decoupled_weight_decay", 1}}},
      {"adadelta", {{"weight_decay", 1e-2}}},
      {"rprop", {{"lr", 1e-2}, {"etaplus", 1.3}}},
      {"adagrad", {{"lr_decay", 0.05}, {"initial_accumulator_value", 0.5}, {"weight_decay", 1e-2}}},
      {"rmsprop", {{"lr", 1e-3}, {"centered", 1}, {"momentum", 0.9}, {"weight_decay", 1e-2}}},
      {"adamax", {{"lr", 1e-2}, {"weight_decay", 1e-2}, {"maximize", 1}}},
      {"nadam",
       {{"lr", 1e-2},
        {"weight_decay", 0.1},
        {"momentum_decay", 0.1},
        {"decoupled_weight_decay", 1}}},
      // t0 1: mu = 1 / (step - 1) from step 3, so ax averages from step 4 on.
      {"asgd", {{"lambd", 1e-2}, {"t0", 1}, {"weight_decay", 1e-2}}},
      {"adafactor", {{"weight_decay", 0.1}}},
      {"adam_mini", {{"lr", 1e-2}, {"weight_decay", 0.1}}},
      {"came", {{"lr", 1e-2}, {"weight_decay", 0.1}}},
      {"lion", {{"lr", 1e-3}, {"weight_decay", 0.1}}},
      {"muon", {{"lr", 2e-2}}},  // its params are matrices: test_matrix_cuda.cpp runs it
      {"adopt", {{"lr", 1e-2}, {"weight_decay", 0.1}, {"decouple", 1}}},
      {"adan", {{"lr", 1e-2}, {"weight_decay", 0.1}}},
      {"bertadam", {{"lr", 1e-2}}},
      {"adamw8bit", {{"lr", 1e-2}, {"weight_decay", 0.1}}},
      {"adam8bit", {{"lr", 1e-2}}},
      {"lion8bit", {{"lr", 1e-3}, {"weight_decay", 0.1}}},
      {"adamw4bit", {{"lr", 1e-2}, {"weight_decay", 0.1}}},
      {"adamw4bit+sr", {{"lr", 1e-2}, {"weight_decay", 0.1}}},
      {"lamb", {{"lr", 1e-2}, {"max_grad_norm", 10}}},  // clips every other step: grad_sd()
      {"lars", {}},
  };
  return h;
}

/// `hypers` with a third of the learning rate (every preset has an lr).
std::vector<std::pair<std::string, double>> slower(
    const Rule& rule, const std::vector<std::pair<std::string, double>>& hypers) {
  double lr = 0;
  for (const auto& [name, value] : rule.hypers()) lr = name == "lr" ? value : lr;
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [name, value] : hypers) {
    if (name == "lr") {
      lr = value;
    } else {
      out.emplace_back(name, value);
    }
  }
  REQUIRE(lr > 0);
  out.emplace_back("lr", lr / 3);
  return out;
}

/// `n` random values (normal, sd `sd`) that `dtype` holds exactly (16-bit formats: rounded
/// to nearest even by the tests' encoder; magnitudes from 1e-3 sd to ~6 sd, inside fp16's
/// normal range for sd 0.1 and 1).
std::vector<double> values_of(DType dtype, std::mt19937& rng, std::int64_t n, double sd) {
  std::vector<double> out = random_values(rng, n, sd);
  for (double& x : out) {
    x = dtype == DType::F32 ? static_cast<double>(static_cast<float>(x))
                            : fusedopt::testing::round_to(dtype, x);
  }
  return out;
}

/// One binding of a comparison: its tensors on the device (the binding's dtypes) and the
/// same numbers in fp32 on the host, each stepped by its optimizer.
struct DeviceRun {
  const Binding* binding = nullptr;
  std::vector<TwinTensor> p, g;    ///< the device side is `gpu`'s
  std::vector<TwinTensor> hp, hg;  ///< fp32; the host side is `cpu`'s
  std::unique_ptr<Optimizer> gpu, cpu;
};

/// Compares every param, state, scalar and master of `run`'s device optimizer with its
/// host optimizer.
/// Lion moves each element by lr * sign(c). Where c is within rounding of 0 (an exact 0 from
/// the host's two roundings, a residual from the device's fused multiply-add) the two sides
/// take different signs and the element lands a whole multiple of lr apart (FUSEDOPT_TEST_SEED
/// =3331712232: one element of 1,030, fp16 grads). Such elements of `got`, at most 1 in 1,000
/// of a tensor, are counted and set to the host's; every other element is left to check_role.
void forgive_sign_jumps(const std::string& what, std::vector<double>& got,
                        const std::vector<double>& want, double lr, double scale) {
  std::size_t jumps = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double off = std::abs(got[i] - want[i]);
    const double tol = kTol * (std::abs(want[i]) + scale);
    const double k = std::round(off / lr);
    if (off > tol && k >= 1 && k <= 2 * kSteps && std::abs(off - k * lr) <= tol) {
      got[i] = want[i];
      ++jumps;
    }
  }
  if (jumps > 0) MESSAGE(what << ": " << jumps << " element(s) a whole lr step apart (sign at 0)");
  CHECK_MESSAGE(jumps <= std::max<std::size_t>(1, got.size() / 1000),
                what << ": " << jumps << " elements a whole lr step apart");
}

/// The lr of tensor `k` in `rule`'s comparison (group 1 has a third: slower()).
double lr_of(const Rule& rule, std::size_t k) {
  double lr = 0;
  for (const auto& [name, value] : preset_hypers().at(rule.name()))
    if (name == "lr") lr = value;
  return layout()[k].group == 1 ? lr / 3 : lr;
}

void compare_run(const Rule& rule, DeviceRun& run) {
  const Binding& b = *run.binding;
  INFO("binding " << std::string(b.name));
  const std::size_t nt = run.p.size();
  const bool master = b.master && b.param != DType::F32;
  std::vector<std::vector<double>> hp;
  double p_scale = 0;
  for (TwinTensor& t : run.hp) {
    hp.push_back(t.host_values());
    p_scale = max_abs(hp.back(), p_scale);
  }
  for (std::size_t k = 0; k < nt; ++k) {
    const std::string what = "param t" + std::to_string(k);
    std::vector<double> dp = run.p[k].device_values();
    const bool sign_update = rule.name() == "lion" || rule.name() == "lion8bit";
    if (!master) {
      if (sign_update) forgive_sign_jumps(what, dp, hp[k], lr_of(rule, k), p_scale);
      check_close(what, dp, hp[k], kTol, p_scale);
      continue;
    }
    // A 16-bit param with a master: exactly its master rounded to nearest even; the
    // master (fp32) against the host's fp32 param.
    const std::vector<double> m = read_view(run.gpu->state("master", static_cast<int>(k)), true);
    std::vector<double> rounded(m.size());
    for (std::size_t i = 0; i < m.size(); ++i) {
      rounded[i] = fusedopt::testing::round_to(b.param, m[i]);
    }
    check_close(what + " against its master rounded", dp, rounded, 0.0, 0.0);
    std::vector<double> master_values = m;
    if (sign_update) {
      forgive_sign_jumps("master of t" + std::to_string(k), master_values, hp[k], lr_of(rule, k),
                         p_scale);
    }
    check_close("master of t" + std::to_string(k), master_values, hp[k], kTol, p_scale);
  }
  const std::vector<std::string> scalars = rule.scalars();
  for (const std::string& name : state_names(rule)) {
    const bool scalar = std::find(scalars.begin(), scalars.end(), name) != scalars.end();
    std::vector<std::vector<double>> got, want;
    double scale = 0;
    for (std::size_t k = 0; k < nt; ++k) {
      got.push_back(read_view(run.gpu->state(name, static_cast<int>(k)), true));
      want.push_back(read_view(run.cpu->state(name, static_cast<int>(k)), false));
      scale = max_abs(want.back(), scale);
    }
    for (std::size_t k = 0; k < nt; ++k) {
      const std::string what = name + " of t" + std::to_string(k);
      if (scalar) {
        check_close(what, got[k], want[k], kScalarTol, 0.0);
      } else {
        check_close(what, got[k], want[k], kTol, scale);
      }
    }
  }
}

const Binding kBindings[] = {
    {"fp32", DType::F32, DType::F32, false},
    {"bf16 params with an fp32 master (bf16:bf16:fp32+master)", DType::BF16, DType::BF16, true},
    {"fp16 grads, fp32 params and states (fp32:fp16:fp32)", DType::F32, DType::F16, false},
};

/// What one comparison runs: a rule with its hypers and options, from which step.
struct Comparison {
  Comparison(std::string label_, Rule rule_, std::vector<std::pair<std::string, double>> hypers_)
      : label(std::move(label_)), rule(std::move(rule_)), hypers(std::move(hypers_)) {}

  std::string label;  ///< names it in failures
  Rule rule;          ///< before OptimizerOptions::max_grad_norm adds clipping
  std::vector<std::pair<std::string, double>> hypers;
  OptimizerOptions options;  ///< master_weights comes from each binding
  int first_step = 1;
  std::vector<std::size_t> bindings = {0, 1, 2};  ///< indices into kBindings
  std::optional<ReductionStrategy>
      strategy;  ///< the strategy stats() must report (none: not checked)

  /// The rule the optimizer compiles.
  Rule compiled() const {
    return options.max_grad_norm > 0 ? rule.with_grad_clipping(options.max_grad_norm) : rule;
  }
};

Comparison preset_comparison(const std::string& preset) {
  Comparison c("preset " + preset, Rule::preset(preset), preset_hypers().at(preset));
  if (preset == "radam") c.first_step = 4;  // steps 4 to 7: see preset_hypers()
  return c;
}

/// The standard deviation of step t's gradients: 1, then 0.1, alternately, so that a
/// global-norm clip at 10 (norm ~49 against ~4.9 over these tensors) acts on every other
/// step.
double grad_sd(int t) { return t % 2 != 0 ? 1.0 : 0.1; }

/// Runs `c` under each of its bindings on the device and in fp32 on the host, each pair
/// from the same numbers, for kSteps steps, and compares every param, state, scalar and
/// master.
void compare_on_device(const Comparison& c, std::mt19937& rng) {
  const std::size_t nt = layout().size();
  std::vector<std::pair<std::string, double>> hypers[2] = {c.hypers, slower(c.rule, c.hypers)};
  std::vector<DeviceRun> runs(c.bindings.size());
  for (std::size_t r = 0; r < runs.size(); ++r) {
    DeviceRun& run = runs[r];
    run.binding = &kBindings[c.bindings[r]];
    std::vector<ParamGroup> dev(2), host(2);
    for (int gr = 0; gr < 2; ++gr) dev[gr].hypers = host[gr].hypers = hypers[gr];
    for (auto* v : {&run.p, &run.g, &run.hp, &run.hg}) v->reserve(nt);
    for (std::size_t k = 0; k < nt; ++k) {
      const Layout& l = layout()[k];
      run.p.emplace_back(l.numel, run.binding->param, l.offset);
      run.g.emplace_back(l.numel, run.binding->grad, l.offset);
      run.hp.emplace_back(l.numel, DType::F32, l.offset);
      run.hg.emplace_back(l.numel, DType::F32, l.offset);
      const std::vector<double> x = values_of(run.binding->param, rng, l.numel, 1.0);
      run.p.back().set(x);
      run.hp.back().set_host(x);
      const std::string name = "t" + std::to_string(k);
      dev[l.group].params.push_back(run.p.back().device_tensor(name, l.shape));
      dev[l.group].grads.push_back(run.g.back().device_tensor(name + ".grad"));
      host[l.group].params.push_back(run.hp.back().host_tensor(name, l.shape));
      host[l.group].grads.push_back(run.hg.back().host_tensor(name + ".grad"));
    }
    OptimizerOptions options = c.options;
    options.master_weights = run.binding->master;
    run.gpu = std::make_unique<Optimizer>(c.rule, dev, options);
    run.cpu = std::make_unique<Optimizer>(c.rule, host, c.options);
    INFO("binding " << std::string(run.binding->name));
    CHECK(run.gpu->stats().reduction_passes == run.cpu->stats().reduction_passes);
    CHECK(run.gpu->stats().reduction_strategy == run.cpu->stats().reduction_strategy);
    if (c.strategy) CHECK(run.gpu->stats().reduction_strategy == c.strategy);
    run.gpu->set_step_count(c.first_step - 1);
    run.cpu->set_step_count(c.first_step - 1);
  }
  for (int t = c.first_step; t < c.first_step + kSteps; ++t) {
    for (DeviceRun& run : runs) {
      for (std::size_t k = 0; k < nt; ++k) {
        const std::vector<double> grad =
            values_of(run.binding->grad, rng, layout()[k].numel, grad_sd(t));
        run.g[k].set(grad);
        run.hg[k].set_host(grad);
      }
      run.gpu->step();
      run.cpu->step();
    }
  }
  cu::synchronize(nullptr);
  const std::int64_t steps = c.first_step - 1 + kSteps;
  for (DeviceRun& run : runs) {
    CHECK(run.cpu->step_count() == steps);
    CHECK(run.gpu->step_count() == steps);
    compare_run(c.rule, run);
  }
}

/// Compiles the kernels of `comparisons` (the host's fp32 one; on the emulator each
/// binding's too) into the process-wide cache on a few threads, so the optimizers built
/// one by one afterwards find them there: each compile is a compiler process, and a case
/// would otherwise wait for some 25 of them in a row. A kernel that fails here is left to
/// fail, with its own error, where its optimizer is built.
void warm_kernels(const std::vector<Comparison>& comparisons) {
  std::vector<std::pair<const Comparison*, std::pair<Target, DTypeBinding>>> jobs;
  for (const Comparison& c : comparisons) {
    jobs.push_back({&c, {Target::host(), DTypeBinding{}}});
    if (!cuda_device_emulated()) continue;
    for (std::size_t b : c.bindings) {
      const Binding& d = kBindings[b];
      DTypeBinding binding;
      binding.param = d.param;
      binding.grad = d.grad;
      binding.master = d.master;
      jobs.push_back({&c, {Target::emu(), binding}});
    }
  }
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t j = next++; j < jobs.size(); j = next++) {
      const Comparison& c = *jobs[j].first;
      const auto& [target, dtypes] = jobs[j].second;
      try {
        CompileOptions options;
        options.reduction_strategy = c.options.reduction_strategy;
        (void)compile_kernel(c.compiled(), target, dtypes, options);
      } catch (const std::exception&) {
        // Reported by the optimizer's construction.
      }
    }
  };
  std::vector<std::thread> threads;
  const unsigned n = std::max(2u, std::thread::hardware_concurrency());
  for (unsigned t = 0; t < n; ++t) threads.emplace_back(work);
  for (std::thread& t : threads) t.join();
}

/// Each comparison of `comparisons` under each binding; each failure names the
/// comparison, the binding and the seed, and one comparison's failure does not stop the
/// others.
void compare_all(const std::vector<Comparison>& comparisons) {
  warm_kernels(comparisons);
  cu::PrimaryContext ctx(0);  // current for the tensors' device memory
  for (const Comparison& c : comparisons) {
    const std::uint32_t seed = fresh_seed();
    INFO(c.label << ", seed " << seed << " (FUSEDOPT_TEST_SEED replays it)");
    std::mt19937 rng(seed);
    try {
      compare_on_device(c, rng);
    } catch (const std::exception& e) {
      FAIL_CHECK("threw: " << e.what());
    }
  }
}

void compare_presets(const std::vector<std::string>& names) {
  std::vector<Comparison> comparisons;
  comparisons.reserve(names.size());
  for (const std::string& name : names) comparisons.push_back(preset_comparison(name));
  compare_all(comparisons);
}

// The presets of each case below; together every preset (checked in the first case).
const std::vector<std::string> kAdamFamily = {
    "adam",        "adamw",     "adam+amsgrad", "adamw+amsgrad", "adam+exact",
    "adamw+exact", "adamax",    "nadam",        "radam",         "adopt",
    "adan",        "adamw8bit", "adam8bit",     "adamw4bit",     "adamw4bit+sr"};
const std::vector<std::string> kClassic = {"sgd",  "rmsprop", "adagrad",  "adadelta", "rprop",
                                           "asgd", "lion",    "lion8bit", "bertadam"};

/// The rules with reduction passes: lamb under each strategy (its update needs ||u||,
/// which the last reduction pass computes: Store keeps u in an fp32 scratch tensor, Recompute
/// computes it again; Auto picks Store), lars and adafactor (three passes, row and column
/// means) as Auto plans them (Recompute: lars has nothing to store, and rules with row or
/// column states always recompute), and adamw with global-norm clipping (10: acting every
/// other step) under each strategy. Each preset under every binding as Auto plans it; the
/// other strategy under the bindings where it reads or writes differently: bf16 params with
/// a master for lamb (the norm of p reads the master), fp16 grads for the clipping norm.
std::vector<Comparison> reducing_comparisons() {
  std::vector<Comparison> out;
  for (const char* name : {"lamb", "lars", "adafactor", "adam_mini", "came"}) {
    out.push_back(preset_comparison(name));
    out.back().label += " (auto)";
    out.back().strategy = out.back().label == "preset lamb (auto)" ? ReductionStrategy::Store
                                                                   : ReductionStrategy::Recompute;
  }
  Comparison lamb = preset_comparison("lamb");
  lamb.label += " (recompute)";
  lamb.options.reduction_strategy = ReductionStrategy::Recompute;
  lamb.strategy = ReductionStrategy::Recompute;
  lamb.bindings = {0, 1};
  out.push_back(lamb);
  for (const ReductionStrategy s : {ReductionStrategy::Recompute, ReductionStrategy::Store}) {
    Comparison clip = preset_comparison("adamw");
    clip.label = std::string("adamw with max_grad_norm 10 (") +
                 (s == ReductionStrategy::Store ? "store)" : "recompute)");
    clip.options.max_grad_norm = 10;
    clip.options.reduction_strategy = s;
    clip.strategy = s;
    clip.bindings = {0, 2};
    out.push_back(clip);
  }
  return out;
}

}  // namespace

TEST_SUITE("cuda_gpu") {
  TEST_CASE(
      "adam, adamw, their amsgrad forms, adamax, nadam, radam, adopt, adan and the quantized "
      "adams (in fp32 storage) on the device match "
      "the host under each dtype binding" *
      testing::needs_cuda_device()) {
    // Every preset is in one of the three cases and has its hypers here: a new preset
    // fails until it is added.
    std::vector<std::string> covered = kAdamFamily;
    covered.insert(covered.end(), kClassic.begin(), kClassic.end());
    for (const char* name : {"lamb", "lars", "adafactor", "adam_mini", "came"}) {
      covered.emplace_back(name);
    }
    covered.emplace_back("muon");  // matrices only: tests/cuda_gpu/test_matrix_cuda.cpp
    std::vector<std::string> all = Rule::presets();
    CHECK(all.size() == 30);
    std::sort(all.begin(), all.end());
    std::sort(covered.begin(), covered.end());
    CHECK(covered == all);
    for (const std::string& name : all) {
      CAPTURE(name);
      CHECK(preset_hypers().count(name) == 1);
    }
    compare_presets(kAdamFamily);
  }

  TEST_CASE(
      "sgd, rmsprop, adagrad, adadelta, rprop, asgd, lion, lion8bit and bertadam on the device "
      "match the host under each dtype binding" *
      testing::needs_cuda_device()) {
    compare_presets(kClassic);
  }

  TEST_CASE(
      "lamb, lars, adafactor and adamw with clipping on the device match the host under "
      "both reduction strategies and each dtype binding" *
      testing::needs_cuda_device()) {
    compare_all(reducing_comparisons());
  }
}

}  // namespace fusedopt::testing
