// Every preset rule against its reference optimizer: each test runs a preset through the
// host kernel for 100 steps on tensors of several sizes, with fresh random params and
// gradients, and compares params and states with a float64 reference written by hand here
// from the reference implementation (torch.optim's single-tensor path, lion-pytorch,
// BertAdam), independent of the rule text.
#include <doctest/doctest.h>
#include <stdlib.h>  // mkdtemp

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cache/kernel_cache.hpp"
#include "common/host_kernel_calls.hpp"
#include "common/kernel_cache.hpp"
#include "common/preset_references.hpp"
#include "common/temp_dir.hpp"
#include "fusedopt/dtype.hpp"
#include "lang/ast.hpp"
#include "presets.hpp"

using fusedopt::testing::default_hypers;
using fusedopt::testing::grads_finite;
using fusedopt::testing::init_states;
using fusedopt::testing::run;
using fusedopt::testing::with_hyper;

namespace fusedopt::testing {
namespace {

using fusedopt::DTypeBinding;

// ---------------------------------------------------------------------------------------
// Fixtures: a private kernel cache, seeds.

fusedopt::cache::KernelCache& test_cache() { return fusedopt::testing::test_kernel_cache(); }

/// A fresh seed per test, or FUSEDOPT_TEST_SEED to replay a failure.
std::uint32_t fresh_seed() {
  if (const char* s = std::getenv("FUSEDOPT_TEST_SEED")) {
    return static_cast<std::uint32_t>(std::strtoul(s, nullptr, 10));
  }
  return std::random_device{}();
}

bool verbose() { return std::getenv("FUSEDOPT_TEST_VERBOSE") != nullptr; }

// ---------------------------------------------------------------------------------------
// What each preset is checked against.

/// The test for every param and state value after every step:
///   |fused - ref| <= tol * (|ref| + max |ref|)
/// where the max runs over that role's values, at that step, in every tensor of the param
/// group. The kernel computes in fp32, so its values drift from the float64 reference by
/// rounding, and the rounding error of a value is relative to the magnitude of the terms it
/// was computed from (the data's scale), not to the value itself, which may be a small
/// difference of large terms (e.g. RMSprop's momentum buffer, or a param crossing zero).
/// With tol = 1e-5, the worst drift measured over 100 steps (six runs of every setting) is
/// 0.2 of the allowed error for params (Lion, whose sign slack comes on top) and 0.05 for
/// states, except NAdam's mu_prod with momentum_decay 0.1: 0.39, the same every run, since
/// the rule computes mu = beta1 * (1 - 0.5 * 0.96^(t * momentum_decay)) in fp32 (0.96 itself
/// rounded) where torch uses float64, and the product over steps carries the difference.
/// A wrong constant, operand or order in a rule shows up far above the tolerance.
double allowed_error(double tol, double ref, double scale) { return tol * (std::abs(ref) + scale); }

struct PresetSpec {
  std::string name;
  Hypers defaults;
  std::vector<std::string> states;                         ///< the rule's declaration order
  std::function<std::vector<double>(const Hypers&)> init;  ///< initial state values
  std::function<RefStep(const Hypers&)> reference;
  double tol;  ///< see allowed_error
};

std::vector<double> zeros(std::size_t n) { return std::vector<double>(n, 0.0); }

const std::vector<PresetSpec>& specs() {
  // One tolerance fits all presets; see allowed_error for what was measured.
  constexpr double kDefault = 1e-5;
  static const std::vector<PresetSpec> table = {
      {"sgd",
       kSgdDefaults,
       {"momentum_buffer"},
       [](const Hypers&) { return zeros(1); },
       sgd_reference,
       kDefault},
      {"adam",
       kAdamDefaults,
       {"m", "v"},
       [](const Hypers&) { return zeros(2); },
       [](const Hypers& h) { return adam_reference(h, false, false); },
       kDefault},
      {"adamw",
       kAdamWDefaults,
       {"m", "v"},
       [](const Hypers&) { return zeros(2); },
       [](const Hypers& h) { return adam_reference(h, true, false); },
       kDefault},
      // The option exact: the same math in torch 1.13's operation order (bit for bit against
      // torch 1.13 in python/tests/test_torch_exact.py), the same float64 references.
      {"adam+exact",
       kAdamDefaults,
       {"m", "v"},
       [](const Hypers&) { return zeros(2); },
       [](const Hypers& h) { return adam_reference(h, false, false); },
       kDefault},
      {"adamw+exact",
       kAdamWDefaults,
       {"m", "v"},
       [](const Hypers&) { return zeros(2); },
       [](const Hypers& h) { return adam_reference(h, true, false); },
       kDefault},
      {"sgd+exact",
       kSgdDefaults,
       {"momentum_buffer"},
       [](const Hypers&) { return zeros(1); },
       sgd_reference,
       kDefault},
      {"adam+amsgrad",
       kAdamDefaults,
       {"m", "v", "max_v"},
       [](const Hypers&) { return zeros(3); },
       [](const Hypers& h) { return adam_reference(h, false, true); },
       kDefault},
      {"adamw+amsgrad",
       kAdamWDefaults,
       {"m", "v", "max_v"},
       [](const Hypers&) { return zeros(3); },
       [](const Hypers& h) { return adam_reference(h, true, true); },
       kDefault},
      {"adagrad",
       kAdagradDefaults,
       {"sum"},
       [](const Hypers& h) { return std::vector<double>{hyper(h, "initial_accumulator_value")}; },
       adagrad_reference,
       kDefault},
      {"rmsprop",
       kRmspropDefaults,
       {"square_avg", "grad_avg", "momentum_buffer"},
       [](const Hypers&) { return zeros(3); },
       rmsprop_reference,
       kDefault},
      {"adamax",
       kAdamaxDefaults,
       {"m", "exp_inf"},
       [](const Hypers&) { return zeros(2); },
       adamax_reference,
       kDefault},
      {"nadam",
       kNadamDefaults,
       {"m", "v", "mu_prod"},
       [](const Hypers&) {
         return std::vector<double>{0, 0, 1};
       },
       nadam_reference,
       kDefault},
      {"radam",
       kRadamDefaults,
       {"m", "v"},
       [](const Hypers&) { return zeros(2); },
       radam_reference,
       kDefault},
      {"adadelta",
       kAdadeltaDefaults,
       {"square_avg", "acc_delta"},
       [](const Hypers&) { return zeros(2); },
       adadelta_reference,
       kDefault},
      {"rprop",
       kRpropDefaults,
       {"prev", "step_size"},
       [](const Hypers& h) {
         return std::vector<double>{0, hyper(h, "lr")};
       },
       rprop_reference,
       kDefault},
      {"asgd",
       kAsgdDefaults,
       {"ax", "eta", "mu"},
       [](const Hypers& h) {
         return std::vector<double>{0, hyper(h, "lr"), 1};
       },
       asgd_reference,
       kDefault},
      {"adan",
       kAdanDefaults,
       {"m", "m_diff", "n", "pre_grad"},
       [](const Hypers&) { return zeros(4); },
       adan_reference,
       kDefault},
      {"adopt",
       kAdoptDefaults,
       {"m", "v"},
       [](const Hypers&) { return zeros(2); },
       adopt_reference,
       kDefault},
      {"lion",
       kLionDefaults,
       {"m"},
       [](const Hypers&) { return zeros(1); },
       lion_reference,
       kDefault},
      {"bertadam",
       kBertAdamDefaults,
       {"m", "v"},
       [](const Hypers&) { return zeros(2); },
       bertadam_reference,
       kDefault},
      // The quantized presets in fp32 storage (their algorithm; the storage is a binding's).
      {"adamw8bit",
       kAdamW8bitDefaults,
       {"m", "v"},
       [](const Hypers&) { return zeros(2); },
       bnb_adam_reference,
       kDefault},
      {"adam8bit",
       kAdam8bitDefaults,
       {"m", "v"},
       [](const Hypers&) { return zeros(2); },
       bnb_adam_reference,
       kDefault},
      {"lion8bit",
       kLionDefaults,
       {"m"},
       [](const Hypers&) { return zeros(1); },
       lion_reference,
       kDefault},
      {"adamw4bit",
       kAdamW4bitDefaults,
       {"m", "v"},
       [](const Hypers&) { return zeros(2); },
       torchao_adamw_reference,
       kDefault},
      {"adamw4bit+sr",  // adamw4bit's math; only its codes round otherwise
       kAdamW4bitDefaults,
       {"m", "v"},
       [](const Hypers&) { return zeros(2); },
       torchao_adamw_reference,
       kDefault},
  };
  return table;
}

const PresetSpec& spec(const std::string& name) {
  for (const PresetSpec& s : specs()) {
    if (s.name == name) return s;
  }
  throw std::logic_error("no spec for preset '" + name + "'");
}

// ---------------------------------------------------------------------------------------
// Reading the rule: names, and the value of a state's initial expression.

std::vector<std::string> names_of(const fusedopt::lang::Rule& rule, const std::vector<int>& syms) {
  std::vector<std::string> out;
  for (int s : syms) out.push_back(rule.symbols[s].name);
  return out;
}

/// Evaluates a state's initial value: constants and hypers with + - * / and unary minus.
double eval_init(const fusedopt::lang::Rule& rule, const fusedopt::lang::Expr& e, const Hypers& h) {
  using fusedopt::lang::Op;
  auto arg = [&](int i) { return eval_init(rule, *e.args.at(i), h); };
  switch (e.op) {
    case Op::Number:
      return e.number;
    case Op::Ref: {
      const auto& sym = rule.symbols.at(e.sym);
      if (sym.kind != fusedopt::lang::SymKind::Hyper) {
        throw std::runtime_error("initial value reads '" + sym.name + "', not a hyper");
      }
      return hyper(h, sym.name.c_str());
    }
    case Op::Neg:
      return -arg(0);
    case Op::Add:
      return arg(0) + arg(1);
    case Op::Sub:
      return arg(0) - arg(1);
    case Op::Mul:
      return arg(0) * arg(1);
    case Op::Div:
      return arg(0) / arg(1);
    default:
      throw std::runtime_error("initial value uses an operator this test does not evaluate");
  }
}

/// The initial values of the rule's state tensors, then of its scalar states.
std::vector<double> rule_init(const fusedopt::lang::Rule& rule, const Hypers& h) {
  std::vector<double> out;
  std::vector<int> declared = rule.states;
  declared.insert(declared.end(), rule.scalars.begin(), rule.scalars.end());
  for (int s : declared) {
    const auto& init = rule.symbols[s].init;
    if (!init)
      throw std::runtime_error("state '" + rule.symbols[s].name + "' has no initial value");
    out.push_back(eval_init(rule, *init, h));
  }
  return out;
}

/// The kernel's hyper vector for `h`, after checking the rule has exactly those hypers.
std::vector<double> kernel_hypers(const Kernel& kernel, const Hypers& h) {
  std::vector<std::string> names = names_of(kernel.rule(), kernel.rule().hypers);
  std::sort(names.begin(), names.end());
  std::vector<std::string> expected;
  for (const auto& kv : h) expected.push_back(kv.first);  // std::map: sorted
  REQUIRE(names == expected);
  std::vector<double> values = default_hypers(kernel);
  for (const auto& [name, value] : h) values = with_hyper(kernel, values, name, value);
  return values;
}

// ---------------------------------------------------------------------------------------
// Comparison bookkeeping: counts violations and remembers the worst one.

struct Comparison {
  int step = 0;
  long long bad = 0;
  double worst_ratio = 0;  ///< largest |err| / allowed seen (bad or not)
  double worst_bad_ratio = 0;
  std::string worst_bad;

  void check(const char* what, std::size_t tensor, std::size_t i, double got, double want,
             double allowed) {
    const double err = std::abs(got - want);
    const double ratio = allowed > 0 ? err / allowed : (err > 0 ? INFINITY : 0);
    if (ratio > worst_ratio || std::isnan(ratio))
      worst_ratio = std::isnan(ratio) ? INFINITY : ratio;
    if (!(err <= allowed)) {  // NaN fails too
      ++bad;
      if (!(ratio <= worst_bad_ratio)) {
        worst_bad_ratio = std::isnan(ratio) ? INFINITY : ratio;
        worst_bad = "step " + std::to_string(step) + ", tensor " + std::to_string(tensor) +
                    ", element " + std::to_string(i) + ", " + what + ": fused " + fmt_double(got) +
                    ", reference " + fmt_double(want) + ", allowed error " + fmt_double(allowed);
      }
    }
  }
};

constexpr int kSteps = 100;
const std::vector<std::int64_t> kSizes = {1, 7, 1000, 4099};
/// The sizes of the presets and options of rule language 2 (issue 14): primes, an empty
/// tensor and 2^17 + 3 elements: four whole host chunks (kHostChunkElems, 2^15) and a
/// 3-element tail, so chunks split across threads and a tensor ends mid-chunk.
const std::vector<std::int64_t> kWideSizes = {0, 2, 7, 4099, (1 << 17) + 3};
const std::vector<std::int64_t> kPrimeSizes = {0, 2, 7, 1009, 4099};

/// Runs preset `name` with param group g's hypers `groups[g]` (tensor k is in group
/// k % groups.size()) for kSteps steps in fp32, against the float64 reference. States
/// named in `unchecked` are scratch in this setting (the reference has no such state).
void run_case(const std::string& name, const std::string& label, const std::vector<Hypers>& groups,
              const std::vector<std::string>& unchecked = {},
              const std::vector<std::int64_t>& sizes = kSizes) {
  const PresetSpec& sp = spec(name);
  const std::uint32_t seed = fresh_seed();
  std::string setting;
  for (const Hypers& h : groups) setting += (setting.empty() ? "{" : "; {") + describe(h) + "}";
  INFO("preset " << name << ", " << label << ": " << setting);
  INFO("seed " << seed << " (FUSEDOPT_TEST_SEED=" << seed << " replays it)");
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);

  Kernel kernel(fusedopt::preset_rule(name), DTypeBinding{}, test_cache());
  const auto& rule = kernel.rule();
  // The spec's states: the rule's state tensors, then its per-tensor scalar states (the
  // reference keeps a scalar per element: every element's copy must equal the tensor's).
  std::vector<std::string> declared = names_of(rule, rule.states);
  for (const std::string& s : names_of(rule, rule.scalars)) declared.push_back(s);
  REQUIRE(declared == sp.states);
  REQUIRE(rule.outputs.empty());
  const std::size_t ns = sp.states.size();
  const std::size_t n_tensor_states = rule.states.size();  // j >= this: scalar j - this
  const std::size_t n_scalars = rule.scalars.size();
  REQUIRE(kernel.num_roles() == static_cast<int>(2 + n_tensor_states));

  std::vector<std::vector<double>> hypers;
  std::vector<RefStep> refs;
  std::vector<std::vector<double>> inits;
  for (const Hypers& h : groups) {
    hypers.push_back(kernel_hypers(kernel, h));
    refs.push_back(sp.reference(h));
    inits.push_back(sp.init(h));
  }

  const std::size_t nt = sizes.size();
  // fp32 tensors for the kernel: p, g, each state; float64 copies for the reference.
  std::vector<std::vector<float>> p(nt), g(nt);
  std::vector<std::vector<std::vector<float>>> s(nt, std::vector<std::vector<float>>(ns));
  std::vector<std::vector<double>> rp(nt), rs(nt), slack(nt);
  std::vector<std::vector<void*>> ptrs(nt);
  std::vector<int> group(nt);
  for (std::size_t k = 0; k < nt; ++k) {
    const std::size_t n = static_cast<std::size_t>(sizes[k]);
    group[k] = static_cast<int>(k % groups.size());
    p[k].resize(n);
    g[k].resize(n);
    rp[k].resize(n);
    rs[k].resize(n * ns);
    slack[k].assign(n, 0.0);
    for (std::size_t i = 0; i < n; ++i) {
      p[k][i] = normal(rng);
      rp[k][i] = p[k][i];
    }
    for (std::size_t j = 0; j < ns; ++j) {
      s[k][j].assign(n, NAN);  // init_states must overwrite every element
      for (std::size_t i = 0; i < n; ++i) rs[k][i * ns + j] = inits[group[k]][j];
    }
    ptrs[k] = {p[k].data(), g[k].data()};
    for (std::size_t j = 0; j < n_tensor_states; ++j) ptrs[k].push_back(s[k][j].data());
  }
  // Planned once (the scalar states live in the plan); the tensors stay where they are.
  const std::unique_ptr<fusedopt::runtime::Binding> prepared =
      kernel.prepare(ptrs, sizes, hypers, group);
  // A tensor's scalar state j (j >= n_tensor_states) as the kernel keeps it.
  auto scalar_of = [&](std::size_t k, std::size_t j) {
    return prepared->scalars()[k * n_scalars + (j - n_tensor_states)];
  };
  // The rule's `state NAME = INIT`, written by the kernel, must be the reference's start.
  prepared->init_states();
  for (std::size_t k = 0; k < nt; ++k) {
    for (std::size_t j = n_tensor_states; j < ns; ++j) {
      // Scalar states start in double from the double hypers; the reference's hypers are
      // fp32-rounded (hyper()): equal within that rounding.
      CHECK_MESSAGE(
          std::abs(scalar_of(k, j) - inits[group[k]][j]) <= 0x1p-24 * std::abs(inits[group[k]][j]),
          "scalar " << sp.states[j] << " of tensor " << k << " starts at " << scalar_of(k, j)
                    << ", not " << inits[group[k]][j]);
    }
    for (std::size_t j = 0; j < n_tensor_states; ++j) {
      const float want = static_cast<float>(inits[group[k]][j]);
      const auto wrong =
          std::count_if(s[k][j].begin(), s[k][j].end(), [&](float x) { return !(x == want); });
      CHECK_MESSAGE(wrong == 0, "state " << sp.states[j] << " of tensor " << k << ": " << wrong
                                         << " elements are not its initial value " << want);
    }
  }

  // Gradients: windows at random offsets into a pool of fresh normal values (drawing 2^20
  // normals every step would dominate the test's time).
  std::vector<float> pool(std::size_t{1} << 21);
  for (float& x : pool) x = normal(rng);
  std::uniform_int_distribution<std::size_t> offset(0, pool.size() - 1);

  const double tol = sp.tol;
  double worst_p = 0, worst_s = 0;
  for (int t = 1; t <= kSteps; ++t) {
    for (std::size_t k = 0; k < nt; ++k) {
      const std::size_t at = offset(rng);
      for (std::size_t i = 0; i < g[k].size(); ++i) g[k][i] = pool[(at + i) & (pool.size() - 1)];
    }
    Kernel::step(*prepared, static_cast<float>(t));
    // Every value is compared after the first steps, every tenth and the last.
    const bool compare = t <= 3 || t % 10 == 0 || t == kSteps;
    Comparison cmp;
    cmp.step = t;
    Comparison scmp;
    scmp.step = t;
    // Reference step, then each group's scale per role (see allowed_error).
    std::vector<double> p_scale(groups.size(), 0.0);
    std::vector<std::vector<double>> s_scale(groups.size(), std::vector<double>(ns, 0.0));
    for (std::size_t k = 0; k < nt; ++k) {
      const RefStep& ref = refs[group[k]];
      for (std::size_t i = 0; i < p[k].size(); ++i) {
        slack[k][i] += ref(static_cast<double>(t), rp[k][i], g[k][i], &rs[k][i * ns]);
        p_scale[group[k]] = std::max(p_scale[group[k]], std::abs(rp[k][i]));
        for (std::size_t j = 0; j < ns; ++j) {
          s_scale[group[k]][j] = std::max(s_scale[group[k]][j], std::abs(rs[k][i * ns + j]));
        }
      }
    }
    for (std::size_t k = 0; k < nt && compare; ++k) {
      for (std::size_t i = 0; i < p[k].size(); ++i) {
        cmp.check("param", k, i, p[k][i], rp[k][i],
                  allowed_error(tol, rp[k][i], p_scale[group[k]]) + slack[k][i]);
        for (std::size_t j = 0; j < ns; ++j) {
          if (std::find(unchecked.begin(), unchecked.end(), sp.states[j]) != unchecked.end()) {
            continue;
          }
          const double want = rs[k][i * ns + j];
          const double got = j < n_tensor_states ? s[k][j][i] : scalar_of(k, j);
          scmp.check(sp.states[j].c_str(), k, i, got, want,
                     allowed_error(tol, want, s_scale[group[k]][j]));
        }
      }
      // An empty tensor's scalar states step too: as those of a tensor of its group with
      // elements (the reference's value does not depend on the elements).
      for (std::size_t j = n_tensor_states; j < ns && p[k].empty(); ++j) {
        for (std::size_t o = 0; o < nt; ++o) {
          if (group[o] != group[k] || p[o].empty()) continue;
          const double want = rs[o][j];
          scmp.check(sp.states[j].c_str(), k, 0, scalar_of(k, j), want,
                     allowed_error(tol, want, s_scale[group[k]][j]));
          break;
        }
      }
    }
    worst_p = std::max(worst_p, cmp.worst_ratio);
    worst_s = std::max(worst_s, scmp.worst_ratio);
    if (cmp.bad || scmp.bad) {
      FAIL_CHECK("after step " << t << ": " << cmp.bad << " param and " << scmp.bad
                               << " state values out of tolerance; worst param: "
                               << (cmp.bad ? cmp.worst_bad : "-")
                               << "; worst state: " << (scmp.bad ? scmp.worst_bad : "-"));
      return;
    }
  }
  if (verbose()) {
    MESSAGE(name << ", " << label << ": worst |err|/allowed param " << worst_p << ", states "
                 << worst_s);
  }
}

void run_case(const std::string& name, const std::string& label, const Hypers& h) {
  run_case(name, label, std::vector<Hypers>{h});
}

/// The same over kWideSizes (one setting of each preset and option of issue 14, the one
/// with the most options on), or kPrimeSizes.
void run_wide(const std::string& name, const std::string& label, const Hypers& h) {
  run_case(name, label, std::vector<Hypers>{h}, {}, kWideSizes);
}
void run_primes(const std::string& name, const std::string& label, const Hypers& h) {
  run_case(name, label, std::vector<Hypers>{h}, {}, kPrimeSizes);
}

/// AdamW with 16-bit params and grads and fp32 states, against the float64 reference.
/// With a master copy the reference follows the fp32 master (compared like the fp32 tests)
/// and the 16-bit param must be exactly the master rounded to nearest even. Without one,
/// the reference steps from the kernel's stored param and rounds its result to the storage
/// format, as the kernel does: the two must be equal, or one ulp apart where the exact
/// value lies near a rounding boundary (rarely: at most 1 in 1000 values).
void run_adamw_storage(const std::string& binding) {
  const DTypeBinding b = DTypeBinding::parse(binding);
  REQUIRE(b.param != DType::F32);
  REQUIRE(b.grad != DType::F32);
  REQUIRE(b.state == DType::F32);
  const std::uint32_t seed = fresh_seed();
  INFO("adamw with " << binding << ", seed " << seed << " (FUSEDOPT_TEST_SEED=" << seed
                     << " replays it)");
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);

  Kernel kernel(fusedopt::preset_rule("adamw"), b, test_cache());
  REQUIRE(kernel.num_roles() == (b.master ? 5 : 4));
  const Hypers h = with(kAdamWDefaults, {{"lr", 1e-2}, {"weight_decay", 0.1}});
  const std::vector<std::vector<double>> hypers = {kernel_hypers(kernel, h)};
  const RefStep ref = adam_reference(h, true, false);
  const double tol = spec("adamw").tol;

  const std::size_t nt = kSizes.size();
  std::vector<std::vector<std::uint16_t>> p(nt), g(nt);
  std::vector<std::vector<float>> m(nt), v(nt), master(nt);
  std::vector<std::vector<double>> rp(nt), rs(nt);
  std::vector<std::vector<void*>> ptrs(nt);
  for (std::size_t k = 0; k < nt; ++k) {
    const std::size_t n = static_cast<std::size_t>(kSizes[k]);
    p[k].resize(n);
    g[k].resize(n);
    m[k].assign(n, NAN);  // init_states must overwrite these
    v[k].assign(n, NAN);
    master[k].assign(n, NAN);
    rp[k].resize(n);
    rs[k].assign(2 * n, 0.0);
    for (std::size_t i = 0; i < n; ++i) {
      p[k][i] = encode(b.param, normal(rng));
      rp[k][i] = decode(b.param, p[k][i]);
    }
    ptrs[k] = {p[k].data(), g[k].data(), m[k].data(), v[k].data()};
    if (b.master) ptrs[k].push_back(master[k].data());
  }
  // init_states zeroes m and v and, with a master, copies the param into it.
  init_states(kernel, ptrs, kSizes, hypers);
  for (std::size_t k = 0; k < nt; ++k) {
    for (std::size_t i = 0; i < p[k].size(); ++i) {
      INFO("tensor " << k << ", element " << i);
      REQUIRE(m[k][i] == 0.0f);
      REQUIRE(v[k][i] == 0.0f);
      if (b.master) REQUIRE(master[k][i] == rp[k][i]);
    }
  }

  long long rounded_apart = 0;  // fp16 without master: param values one ulp from the reference
  for (int t = 1; t <= kSteps; ++t) {
    std::vector<std::vector<double>> gd(nt);
    for (std::size_t k = 0; k < nt; ++k) {
      gd[k].resize(g[k].size());
      for (std::size_t i = 0; i < g[k].size(); ++i) {
        g[k][i] = encode(b.grad, normal(rng));
        gd[k][i] = decode(b.grad, g[k][i]);  // what the kernel reads, exactly
        // Without a master the stored param is the whole state: the reference steps from
        // the kernel's stored value (a param one ulp apart after a near-tie rounding would
        // otherwise make the trajectories drift apart by that ulp for good).
        if (!b.master) rp[k][i] = decode(b.param, p[k][i]);
      }
    }
    run(kernel, ptrs, kSizes, hypers, static_cast<float>(t));
    Comparison cmp;
    cmp.step = t;
    double p_scale = 0, m_scale = 0, v_scale = 0;
    for (std::size_t k = 0; k < nt; ++k) {
      for (std::size_t i = 0; i < p[k].size(); ++i) {
        ref(static_cast<double>(t), rp[k][i], gd[k][i], &rs[k][2 * i]);
        if (!b.master) rp[k][i] = round_to(b.param, rp[k][i]);
        p_scale = std::max(p_scale, std::abs(rp[k][i]));
        m_scale = std::max(m_scale, std::abs(rs[k][2 * i]));
        v_scale = std::max(v_scale, std::abs(rs[k][2 * i + 1]));
      }
    }
    for (std::size_t k = 0; k < nt; ++k) {
      for (std::size_t i = 0; i < p[k].size(); ++i) {
        if (b.master) {
          cmp.check("master", k, i, master[k][i], rp[k][i], allowed_error(tol, rp[k][i], p_scale));
          const std::uint16_t want = encode(b.param, master[k][i]);
          cmp.check("param bits (the master rounded)", k, i, p[k][i], want, 0.0);
        } else {
          // fp32 and float64 results round to the same 16-bit value unless they straddle a
          // rounding boundary: then they are one ulp apart.
          const double got = decode(b.param, p[k][i]);
          const double ulp = format_ulp(std::max(std::abs(got), std::abs(rp[k][i])),
                                        mant_bits(b.param), min_exp(b.param));
          cmp.check("param", k, i, got, rp[k][i], ulp);
          if (got != rp[k][i]) ++rounded_apart;
        }
        cmp.check("m", k, i, m[k][i], rs[k][2 * i], allowed_error(tol, rs[k][2 * i], m_scale));
        cmp.check("v", k, i, v[k][i], rs[k][2 * i + 1],
                  allowed_error(tol, rs[k][2 * i + 1], v_scale));
      }
    }
    if (cmp.bad) {
      FAIL_CHECK("after step " << t << ": " << cmp.bad
                               << " values out of tolerance; worst: " << cmp.worst_bad);
      return;
    }
  }
  // Near-boundary values are rare (fp32 carries 13 bits more than fp16); rounding that is
  // not to nearest even, or an update computed differently, would set far more apart.
  const long long values = kSteps * std::accumulate(kSizes.begin(), kSizes.end(), 0LL);
  CHECK_MESSAGE(rounded_apart * 1000 <= values,
                rounded_apart << " of " << values << " param values rounded one ulp apart");
  if (verbose())
    MESSAGE("adamw " << binding << ": " << rounded_apart << " of " << values
                     << " param values one ulp apart");
}

}  // namespace

TEST_SUITE("codegen") {
  TEST_CASE(
      "the presets are the element-wise optimizers this file checks, plus lamb, lars and "
      "adafactor") {
    const std::vector<std::string> expected = {
        "adadelta",  "adafactor",    "adagrad",   "adam",    "adam+amsgrad",  "adam+exact",
        "adam8bit",  "adam_mini",    "adamax",    "adamw",   "adamw+amsgrad", "adamw+exact",
        "adamw4bit", "adamw4bit+sr", "adamw8bit", "adan",    "adopt",         "asgd",
        "bertadam",  "came",         "lamb",      "lars",    "lion",          "lion8bit",
        "muon",      "nadam",        "radam",     "rmsprop", "rprop",         "sgd"};
    // A new preset needs a reference test before it ships: element-wise ones here, rules
    // with reductions in tests/runtime/test_reductions.cpp (lamb, lars) and factored state
    // in tests/runtime/test_factored.cpp (adafactor, adam_mini, came), matrix stages in
    // tests/matrix/test_muon.cpp (muon).
    CHECK(fusedopt::preset_names() == expected);
    for (const std::string& name : expected) {
      if (name != "lamb" && name != "lars" && name != "adafactor" && name != "adam_mini" &&
          name != "came" && name != "muon") {
        CHECK_NOTHROW(spec(name));
      }
    }
  }

  TEST_CASE("every preset parses and declares its reference's hypers with their defaults") {
    for (const PresetSpec& sp : specs()) {
      INFO("preset " << sp.name);
      std::shared_ptr<const fusedopt::lang::Rule> rule;
      REQUIRE_NOTHROW(rule = fusedopt::preset_rule(sp.name));
      std::map<std::string, double> declared;
      for (int h : rule->hypers) declared[rule->symbols[h].name] = rule->symbols[h].default_value;
      CHECK(describe(declared) == describe(sp.defaults));
    }
  }

  TEST_CASE("every preset declares its reference's states and initial values") {
    for (const PresetSpec& sp : specs()) {
      INFO("preset " << sp.name);
      const auto rule = fusedopt::preset_rule(sp.name);
      std::vector<std::string> declared = names_of(*rule, rule->states);
      for (const std::string& s : names_of(*rule, rule->scalars)) declared.push_back(s);
      CHECK(declared == sp.states);
      CHECK(rule->outputs.empty());
      CHECK(rule_init(*rule, sp.defaults) == sp.init(sp.defaults));
    }
  }

  // Each setting below exercises options of one preset; a failure names the setting, the
  // worst element and the seed. A large eps (0.1, against O(1) gradients) in one setting
  // of each preset that has one makes where eps enters the formula matter. (Settings are
  // plain calls, not SUBCASEs: doctest 2.4.9 crashes while reporting a failed subcase.)
  TEST_CASE("sgd matches torch.optim.SGD") {
    // torch keeps no momentum buffer when momentum == 0; the rule's is scratch then.
    run_case("sgd", "plain", {with(kSgdDefaults, {{"lr", 1e-2}})}, {"momentum_buffer"});
    run_case("sgd", "momentum with dampening",
             with(kSgdDefaults, {{"lr", 1e-2}, {"momentum", 0.9}, {"dampening", 0.1}}));
    run_case("sgd", "nesterov momentum with weight decay",
             with(kSgdDefaults,
                  {{"lr", 1e-2}, {"momentum", 0.9}, {"nesterov", 1}, {"weight_decay", 0.05}}));
    run_case("sgd", "maximize with momentum and weight decay",
             with(kSgdDefaults,
                  {{"lr", 1e-2}, {"momentum", 0.5}, {"maximize", 1}, {"weight_decay", 0.01}}));
  }

  TEST_CASE("adam matches torch.optim.Adam") {
    run_case("adam", "without weight decay", with(kAdamDefaults, {{"lr", 1e-2}}));
    run_case("adam", "with L2 weight decay",
             with(kAdamDefaults, {{"lr", 1e-2}, {"weight_decay", 0.1}}));
    run_case("adam", "maximize with other betas and a large eps",
             with(kAdamDefaults,
                  {{"lr", 1e-2}, {"beta1", 0.8}, {"beta2", 0.99}, {"eps", 0.1}, {"maximize", 1}}));
  }

  TEST_CASE("adamw matches torch.optim.AdamW") {
    run_case("adamw", "default weight decay", with(kAdamWDefaults, {{"lr", 1e-2}}));
    run_case("adamw", "strong weight decay",
             with(kAdamWDefaults, {{"lr", 1e-2}, {"weight_decay", 0.5}}));
    run_case("adamw", "maximize with other betas and a large eps",
             with(kAdamWDefaults,
                  {{"lr", 1e-2}, {"beta1", 0.5}, {"beta2", 0.95}, {"eps", 0.1}, {"maximize", 1}}));
  }

  TEST_CASE("adam+amsgrad matches torch.optim.Adam with amsgrad") {
    run_primes("adam+amsgrad", "without weight decay", with(kAdamDefaults, {{"lr", 1e-2}}));
    run_primes("adam+amsgrad", "with L2 weight decay and maximize",
               with(kAdamDefaults, {{"lr", 1e-2}, {"weight_decay", 0.1}, {"maximize", 1}}));
    // With beta2 = 0.999 the second moment mostly grows over 100 steps, so max_v == v;
    // a fast beta2 makes v fall often, and the max matter.
    run_wide("adam+amsgrad", "a fast second moment and a large eps",
             with(kAdamDefaults, {{"lr", 1e-2}, {"beta2", 0.9}, {"eps", 0.1}}));
  }

  TEST_CASE("adamw+amsgrad matches torch.optim.AdamW with amsgrad") {
    run_primes("adamw+amsgrad", "default weight decay", with(kAdamWDefaults, {{"lr", 1e-2}}));
    run_primes("adamw+amsgrad", "strong weight decay and maximize",
               with(kAdamWDefaults, {{"lr", 1e-2}, {"weight_decay", 0.5}, {"maximize", 1}}));
    // beta1 below 0.5 takes lerp's other branch; a fast beta2 makes the max matter.
    run_wide("adamw+amsgrad", "lerp's large-weight branch, a fast second moment, a large eps",
             with(kAdamWDefaults, {{"lr", 1e-2}, {"beta1", 0.3}, {"beta2", 0.9}, {"eps", 0.1}}));
  }

  TEST_CASE("radam matches torch.optim.RAdam") {
    // With beta2 = 0.999, rho_t passes 5 at step 6: both branches run.
    run_primes("radam", "plain", with(kRadamDefaults, {{"lr", 1e-2}}));
    run_primes("radam", "L2 weight decay and maximize",
               with(kRadamDefaults, {{"lr", 1e-2}, {"weight_decay", 0.1}, {"maximize", 1}}));
    run_wide("radam", "decoupled weight decay, lerp's other branch, a fast beta2, a large eps",
             with(kRadamDefaults, {{"lr", 1e-2},
                                   {"weight_decay", 0.1},
                                   {"decoupled_weight_decay", 1},
                                   {"beta1", 0.4},
                                   {"beta2", 0.9},
                                   {"eps", 0.1}}));
  }

  TEST_CASE("adadelta matches torch.optim.Adadelta") {
    run_primes("adadelta", "plain", kAdadeltaDefaults);
    run_wide(
        "adadelta", "weight decay, maximize, another rho and a large eps",
        with(kAdadeltaDefaults,
             {{"lr", 0.5}, {"weight_decay", 0.1}, {"maximize", 1}, {"rho", 0.5}, {"eps", 0.1}}));
  }

  TEST_CASE("rprop matches torch.optim.Rprop") {
    run_primes("rprop", "plain", kRpropDefaults);
    // Tight bounds make the clamp bite on both sides within 100 steps.
    run_wide("rprop", "other etas, tight step-size bounds and maximize",
             with(kRpropDefaults, {{"lr", 1e-3},
                                   {"etaminus", 0.3},
                                   {"etaplus", 1.5},
                                   {"step_size_min", 5e-4},
                                   {"step_size_max", 4e-3},
                                   {"maximize", 1}}));
  }

  TEST_CASE("the old preset name amsgrad is adam+amsgrad, and adam and adamw list the option") {
    CHECK(fusedopt::preset_rule("amsgrad") == fusedopt::preset_rule("adam+amsgrad"));
    CHECK(fusedopt::preset_options("adam") == std::vector<std::string>{"amsgrad", "exact"});
    CHECK(fusedopt::preset_options("adamw") == std::vector<std::string>{"amsgrad", "exact"});
    CHECK(fusedopt::preset_options("sgd") == std::vector<std::string>{"exact"});
    CHECK(fusedopt::preset_rule("sgd+exact") == fusedopt::preset_rule("sgd"));
    CHECK(fusedopt::preset_options("rmsprop").empty());
  }

  TEST_CASE("the option exact (torch 1.13's operation order) matches the same references") {
    run_case("adam+exact", "L2 weight decay",
             with(kAdamDefaults, {{"lr", 1e-2}, {"weight_decay", 0.1}}));
    run_case("adam+exact", "maximize with other betas and a large eps",
             with(kAdamDefaults,
                  {{"lr", 1e-2}, {"beta1", 0.8}, {"beta2", 0.99}, {"eps", 0.1}, {"maximize", 1}}));
    run_case("adamw+exact", "strong weight decay",
             with(kAdamWDefaults, {{"lr", 1e-2}, {"weight_decay", 0.5}}));
    run_case("adamw+exact", "maximize with other betas and a large eps",
             with(kAdamWDefaults,
                  {{"lr", 1e-2}, {"beta1", 0.5}, {"beta2", 0.95}, {"eps", 0.1}, {"maximize", 1}}));
    run_case("sgd+exact", "momentum, dampening and weight decay",
             with(kSgdDefaults,
                  {{"lr", 1e-2}, {"momentum", 0.9}, {"dampening", 0.1}, {"weight_decay", 1e-2}}));
    run_case(
        "sgd+exact", "nesterov and maximize",
        with(kSgdDefaults, {{"lr", 1e-2}, {"momentum", 0.9}, {"nesterov", 1}, {"maximize", 1}}));
  }

  TEST_CASE("adagrad matches torch.optim.Adagrad") {
    run_case("adagrad", "plain", kAdagradDefaults);
    run_case("adagrad", "lr decay and an initial accumulator value",
             with(kAdagradDefaults, {{"lr_decay", 0.05}, {"initial_accumulator_value", 0.5}}));
    run_case("adagrad", "weight decay, maximize and a large eps",
             with(kAdagradDefaults, {{"weight_decay", 0.1}, {"maximize", 1}, {"eps", 0.1}}));
  }

  TEST_CASE("rmsprop matches torch.optim.RMSprop") {
    run_case("rmsprop", "plain", kRmspropDefaults);
    run_case("rmsprop", "centered with momentum",
             with(kRmspropDefaults, {{"lr", 1e-3}, {"centered", 1}, {"momentum", 0.9}}));
    run_case("rmsprop", "centered", with(kRmspropDefaults, {{"centered", 1}}));
    run_case("rmsprop", "momentum", with(kRmspropDefaults, {{"lr", 1e-3}, {"momentum", 0.5}}));
    run_case("rmsprop", "weight decay, maximize, another alpha and a large eps",
             with(kRmspropDefaults,
                  {{"weight_decay", 0.1}, {"maximize", 1}, {"alpha", 0.9}, {"eps", 0.1}}));
    run_case(
        "rmsprop", "centered with momentum and a large eps",
        with(kRmspropDefaults, {{"lr", 1e-3}, {"centered", 1}, {"momentum", 0.9}, {"eps", 0.1}}));
  }

  TEST_CASE("adamax matches torch.optim.Adamax") {
    run_case("adamax", "plain", with(kAdamaxDefaults, {{"lr", 1e-2}}));
    run_case("adamax", "weight decay and maximize",
             with(kAdamaxDefaults, {{"lr", 1e-2}, {"weight_decay", 0.1}, {"maximize", 1}}));
    run_case("adamax", "other betas and a large eps",
             with(kAdamaxDefaults, {{"lr", 1e-2}, {"beta1", 0.5}, {"beta2", 0.9}, {"eps", 0.1}}));
  }

  TEST_CASE("asgd matches torch.optim.ASGD") {
    // Large lambd and lr make eta decay visibly within 100 steps; t0 = 20 starts the
    // averaging (mu != 1) at step 22.
    run_primes("asgd", "plain", kAsgdDefaults);
    run_wide("asgd", "averaging from step 21, fast decay, weight decay and maximize",
             with(kAsgdDefaults, {{"lr", 0.05},
                                  {"lambd", 0.5},
                                  {"alpha", 0.6},
                                  {"t0", 20},
                                  {"weight_decay", 0.1},
                                  {"maximize", 1}}));
  }

  TEST_CASE("nadam matches torch.optim.NAdam") {
    run_case("nadam", "plain", with(kNadamDefaults, {{"lr", 1e-2}}));
    run_case("nadam", "L2 weight decay",
             with(kNadamDefaults, {{"lr", 1e-2}, {"weight_decay", 0.1}}));
    run_case(
        "nadam", "decoupled weight decay and maximize",
        with(
            kNadamDefaults,
            {{"lr", 1e-2}, {"weight_decay", 0.1}, {"decoupled_weight_decay", 1}, {"maximize", 1}}));
    run_case("nadam", "a faster momentum decay, other betas and a large eps",
             with(kNadamDefaults, {{"lr", 1e-2},
                                   {"momentum_decay", 0.1},
                                   {"beta1", 0.8},
                                   {"beta2", 0.99},
                                   {"eps", 0.1}}));
  }

  TEST_CASE("adan matches the authors' Adan") {
    run_case("adan", "defaults", with(kAdanDefaults, {{"lr", 1e-2}}));
    run_case("adan", "weight decay by the proximal step, other betas",
             with(kAdanDefaults,
                  {{"lr", 1e-2}, {"weight_decay", 0.1}, {"beta1", 0.9}, {"beta3", 0.999}}));
    run_case("adan", "decoupled weight decay (no_prox)",
             with(kAdanDefaults, {{"lr", 1e-2}, {"weight_decay", 0.1}, {"no_prox", 1}}));
  }

  TEST_CASE("adopt matches the authors' ADOPT") {
    run_case("adopt", "defaults", with(kAdoptDefaults, {{"lr", 1e-2}}));
    run_case("adopt", "L2 weight decay, maximize, a fast second moment",
             with(kAdoptDefaults,
                  {{"lr", 1e-2}, {"weight_decay", 0.1}, {"maximize", 1}, {"beta2", 0.9}}));
    run_case("adopt", "decoupled weight decay, lerp's other branch, no clipping",
             with(kAdoptDefaults, {{"lr", 1e-2},
                                   {"weight_decay", 0.1},
                                   {"decouple", 1},
                                   {"beta1", 0.3},
                                   {"clip_exponent", -1}}));
  }

  TEST_CASE("lion matches lion-pytorch") {
    run_case("lion", "plain", with(kLionDefaults, {{"lr", 1e-2}}));
    run_case("lion", "weight decay and other betas",
             with(kLionDefaults,
                  {{"lr", 1e-3}, {"weight_decay", 0.1}, {"beta1", 0.95}, {"beta2", 0.98}}));
  }

  TEST_CASE("adamw8bit and adam8bit match bitsandbytes' 8-bit Adam kernel, in fp32 storage") {
    run_case("adamw8bit", "defaults", with(kAdamW8bitDefaults, {{"lr", 1e-2}}));
    run_case("adamw8bit", "strong decay, other betas",
             with(kAdamW8bitDefaults,
                  {{"lr", 1e-2}, {"weight_decay", 0.3}, {"beta1", 0.5}, {"beta2", 0.9}}));
    run_case("adam8bit", "defaults", with(kAdam8bitDefaults, {{"lr", 1e-2}}));
  }

  TEST_CASE("lion8bit matches lion-pytorch and bitsandbytes' Lion kernel, in fp32 storage") {
    run_case("lion8bit", "weight decay",
             with(kLionDefaults, {{"lr", 1e-3}, {"weight_decay", 0.1}}));
  }

  TEST_CASE("adamw4bit matches torchao's AdamW, in fp32 storage") {
    run_case("adamw4bit", "defaults", with(kAdamW4bitDefaults, {{"lr", 1e-2}}));
    run_case("adamw4bit", "strong decay, lerp's other branch",
             with(kAdamW4bitDefaults, {{"lr", 1e-2}, {"weight_decay", 0.3}, {"beta1", 0.3}}));
    run_case("adamw4bit+sr", "defaults", with(kAdamW4bitDefaults, {{"lr", 1e-2}}));
  }

  TEST_CASE("bertadam matches pytorch_pretrained_bert's BertAdam") {
    run_case("bertadam", "default weight decay", with(kBertAdamDefaults, {{"lr", 1e-2}}));
    run_case("bertadam", "without weight decay",
             with(kBertAdamDefaults, {{"lr", 1e-2}, {"weight_decay", 0}}));
    run_case(
        "bertadam", "other betas and a large eps",
        with(kBertAdamDefaults, {{"lr", 1e-2}, {"beta1", 0.8}, {"beta2", 0.99}, {"eps", 0.1}}));
  }

  TEST_CASE("each param group's hypers apply to its own tensors") {
    run_case("adamw", "two groups",
             std::vector<Hypers>{
                 with(kAdamWDefaults, {{"lr", 1e-2}, {"weight_decay", 0.1}}),
                 with(kAdamWDefaults, {{"lr", 3e-3}, {"weight_decay", 0}}),
             });
    run_case("rmsprop", "two groups",
             std::vector<Hypers>{
                 with(kRmspropDefaults, {{"centered", 1}, {"momentum", 0.9}, {"lr", 1e-3}}),
                 kRmspropDefaults,
             });
  }

  TEST_CASE("adamw with bf16 params and grads and an fp32 master matches float64") {
    run_adamw_storage("bf16:bf16:fp32+master");
  }

  TEST_CASE("adamw with fp16 params and grads and fp32 states matches float64 rounded to fp16") {
    run_adamw_storage("fp16:fp16:fp32");
  }
}

}  // namespace fusedopt::testing
