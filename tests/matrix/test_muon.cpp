// The muon preset (orthogonalize in a rule: a matrix stage) against a float64 reference of
// torch.optim.Muon's step written here, over 50 steps of fresh random gradients: square,
// tall, wide and same-shape matrices (one batch) and a convolution-shaped param (its first
// dimension by the rest); the stage's errors (1-D params, iteration hypers out of range).
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/host_tensors.hpp"
#include "common/temp_dir.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/optimizer.hpp"
#include "io/safetensors.hpp"
#include "matrix/ns_reference.hpp"

namespace {

using fusedopt::DType;
using fusedopt::Optimizer;
using fusedopt::Rule;
using fusedopt::testing::fresh_seed;
using fusedopt::testing::HostTensor;
using fusedopt::testing::use_private_cache;

struct MuonHypers {
  double lr = 0.02, weight_decay = 0.1, momentum = 0.95;
  bool nesterov = true;
  int ns_steps = 5;
  double a = 3.4445, b = -4.7750, c = 2.0315, eps = 1e-7;
  int adjust_lr_fn = 0;  // 0 original, 1 match_rms_adamw, 2 spectral_unclamped
};

/// One param's Muon in double, as torch.optim.Muon's _single_tensor_muon.
struct RefParam {
  std::vector<std::int64_t> shape;
  std::vector<double> p, buf;

  void step(const std::vector<double>& g, const MuonHypers& h) {
    const std::size_t n = p.size();
    std::vector<double> u(n);
    for (std::size_t i = 0; i < n; ++i) {
      buf[i] += (1 - h.momentum) * (g[i] - buf[i]);
      u[i] = h.nesterov ? g[i] + h.momentum * (buf[i] - g[i]) : buf[i];
    }
    const auto rows = static_cast<int>(shape[0]);
    const auto cols = static_cast<int>(static_cast<std::int64_t>(n) / shape[0]);
    fusedopt::matrix::NewtonSchulz ns;
    ns.steps = h.ns_steps;
    ns.coefficients = {{static_cast<float>(h.a), static_cast<float>(h.b), static_cast<float>(h.c)}};
    ns.eps = static_cast<float>(h.eps);
    const fusedopt::testing::Matrix o = fusedopt::testing::reference(u, rows, cols, ns);
    // torch's _adjust_lr reads the first two dimensions of its 2-D params; the rule's rows
    // and cols are the last two (the same for a matrix; Keller Jordan's reference scales a
    // convolution by its last two).
    const double A = static_cast<double>(shape[shape.size() - 2]);
    const double B = static_cast<double>(shape.back());
    const double ratio = h.adjust_lr_fn == 1   ? 0.2 * std::sqrt(std::max(A, B))
                         : h.adjust_lr_fn == 2 ? std::sqrt(A / B)
                                               : std::sqrt(std::max(1.0, A / B));
    for (std::size_t i = 0; i < n; ++i) {
      p[i] = p[i] * (1 - h.lr * h.weight_decay) - h.lr * ratio * o[i];
    }
  }
};

std::int64_t numel_of(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

fusedopt::ParamGroup group_of(const MuonHypers& h) {
  fusedopt::ParamGroup group;
  group.hypers = {{"lr", h.lr},
                  {"weight_decay", h.weight_decay},
                  {"momentum", h.momentum},
                  {"nesterov", h.nesterov ? 1.0 : 0.0},
                  {"ns_steps", h.ns_steps},
                  {"ns_a", h.a},
                  {"ns_b", h.b},
                  {"ns_c", h.c},
                  {"eps", h.eps},
                  {"adjust_lr_fn", h.adjust_lr_fn}};
  return group;
}

/// Runs muon for `steps` steps on `shapes` against RefParam; fails on the first param or
/// momentum element off by more than `tol` (|ref| + max |ref|).
void run_muon(const std::vector<std::vector<std::int64_t>>& shapes, const MuonHypers& h, int steps,
              double tol) {
  use_private_cache();
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed << " (FUSEDOPT_TEST_SEED=" << seed << " replays it)");
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<HostTensor> p, g;
  std::vector<RefParam> ref;
  fusedopt::ParamGroup group = group_of(h);
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    const std::int64_t n = numel_of(shapes[k]);
    p.emplace_back(n, DType::F32);
    g.emplace_back(n, DType::F32);
    ref.push_back({shapes[k], std::vector<double>(static_cast<std::size_t>(n)),
                   std::vector<double>(static_cast<std::size_t>(n), 0.0)});
    for (std::int64_t i = 0; i < n; ++i) {
      p[k].set(i, normal(rng));
      ref[k].p[static_cast<std::size_t>(i)] = p[k].get(i);
    }
    fusedopt::Tensor t = p[k].tensor("w" + std::to_string(k));
    t.shape = shapes[k];
    group.params.push_back(t);
    group.grads.push_back(g[k].tensor());
  }
  fusedopt::OptimizerOptions options;
  Optimizer opt(Rule::preset("muon"), {group}, options);
  double worst = 0;
  for (int t = 1; t <= steps; ++t) {
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      std::vector<double> gd;
      for (std::int64_t i = 0; i < g[k].numel(); ++i) {
        g[k].set(i, normal(rng) * (1 + static_cast<double>(k)));
        gd.push_back(g[k].get(i));
      }
      ref[k].step(gd, h);
    }
    opt.step();
    if (!(t <= 2 || t % 10 == 0 || t == steps)) continue;
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      INFO("step " << t << ", param " << k);
      auto check = [&](const char* what, const std::vector<double>& got,
                       const std::vector<double>& want) {
        INFO(what);
        REQUIRE(got.size() == want.size());
        double scale = 0;
        for (double x : want) scale = std::max(scale, std::abs(x));
        for (std::size_t i = 0; i < want.size(); ++i) {
          const double err = std::abs(got[i] - want[i]);
          worst = std::max(worst, err / (std::abs(want[i]) + scale));
          if (!(err <= tol * (std::abs(want[i]) + scale))) {
            FAIL_CHECK(what << " element " << i << ": fused " << got[i] << ", reference "
                            << want[i]);
            return;
          }
        }
      };
      check("param", p[k].values(), ref[k].p);
      const fusedopt::Tensor b = opt.state("buf", static_cast<int>(k));
      std::vector<double> bv;
      for (std::int64_t i = 0; i < b.numel; ++i) bv.push_back(static_cast<const float*>(b.data)[i]);
      check("buf (momentum_buffer)", bv, ref[k].buf);
    }
  }
  MESSAGE("muon over " << steps << " steps: worst |fused - float64| / (|ref| + max |ref|) "
                       << worst);
}

}  // namespace

TEST_SUITE("matrix") {
  TEST_CASE("muon matches a float64 torch.optim.Muon: square, tall, wide, a batch, a conv") {
    // Two 32 x 32 (one batch), tall, wide, a conv's filters (16 by 4 * 3 * 3).
    run_muon({{32, 32}, {48, 20}, {32, 32}, {24, 56}, {16, 4, 3, 3}}, MuonHypers{}, 50, 2e-5);
  }

  TEST_CASE("muon without nesterov, with match_rms_adamw and other iteration hypers") {
    MuonHypers h;
    h.nesterov = false;
    h.adjust_lr_fn = 1;
    h.ns_steps = 3;
    h.a = 3.0;
    h.b = -3.2;
    h.c = 1.2;
    h.momentum = 0.9;
    h.weight_decay = 0.01;
    run_muon({{20, 36}, {40, 12}}, h, 20, 2e-5);
    h.adjust_lr_fn = 2;
    run_muon({{12, 40}}, h, 5, 2e-5);
  }

  TEST_CASE("orthogonalize refuses a 1-D param, naming it, and iteration hypers out of range") {
    use_private_cache();
    HostTensor w(64, DType::F32), gw(64, DType::F32), b(8, DType::F32), gb(8, DType::F32);
    fusedopt::ParamGroup group = group_of(MuonHypers{});
    fusedopt::Tensor wt = w.tensor("w");
    wt.shape = {8, 8};
    group.params = {wt, b.tensor("bias")};
    group.grads = {gw.tensor(), gb.tensor()};
    try {
      Optimizer opt(Rule::preset("muon"), {group});
      FAIL("a 1-D param was accepted");
    } catch (const fusedopt::UsageError& e) {
      const std::string what = e.what();
      INFO(what);
      CHECK(what.find("'bias'") != std::string::npos);
      CHECK(what.find("1-D") != std::string::npos);
    }
    group.params.pop_back();
    group.grads.pop_back();
    Optimizer opt(Rule::preset("muon"), {group});
    opt.step();
    auto refused = [&](const char* hyper, double value, const char* words) {
      INFO(hyper << " = " << value);
      try {
        opt.set_hyper(hyper, value);
        FAIL("accepted");
      } catch (const fusedopt::UsageError& e) {
        const std::string what = e.what();
        INFO(what);
        CHECK(what.find(words) != std::string::npos);
      }
    };
    refused("ns_steps", 0, "hyper 'ns_steps' is 0");
    refused("ns_steps", 2.5, "a whole number from 1 to 100");
    refused("ns_steps", 101, "a whole number from 1 to 100");
    refused("eps", 0, "hyper 'eps' is 0");
    refused("ns_b", 2e6, "hyper 'ns_b' is 2000000");
    refused("ns_b", INFINITY, "hyper 'ns_b' of group 0 is inf");
    CHECK(opt.hyper("ns_steps") == 5);
    opt.step();  // still steps with the values it had
  }

  TEST_CASE("a checkpoint whose iteration hypers are out of range is refused, changing nothing") {
    use_private_cache();
    fusedopt::testing::TempDir dir;
    const std::string good = (dir.path() / "good.safetensors").string();
    const std::string bad = (dir.path() / "bad.safetensors").string();
    HostTensor w(64, DType::F32), gw(64, DType::F32);
    for (int i = 0; i < 64; ++i) {
      w.set(i, 0.01 * i);
      gw.set(i, 1.0 - 0.02 * i);
    }
    fusedopt::ParamGroup group = group_of(MuonHypers{});
    fusedopt::Tensor wt = w.tensor("w");
    wt.shape = {8, 8};
    group.params = {wt};
    group.grads = {gw.tensor()};
    Optimizer opt(Rule::preset("muon"), {group});
    opt.step();
    opt.save(good);
    // The same file with ns_steps = 0 in its hypers, as a tool editing it would write it.
    fusedopt::io::SafetensorsFile f = fusedopt::io::read_safetensors(good);
    std::string& hypers = f.metadata.at("hypers");
    const std::size_t at = hypers.find("ns_steps=5");
    REQUIRE(at != std::string::npos);
    hypers.replace(at, 10, "ns_steps=0");
    std::vector<fusedopt::io::TensorView> views;
    for (const auto& [name, e] : f.tensors) {
      views.push_back({name, e.dtype, e.shape, f.tensor_data(name), e.end - e.begin});
    }
    fusedopt::io::write_safetensors(bad, views, f.metadata);
    opt.step();
    const std::vector<double> before = w.values();
    const std::int64_t steps = opt.step_count();
    try {
      opt.load(bad);
      FAIL("loaded");
    } catch (const fusedopt::Error& e) {
      const std::string what = e.what();
      INFO(what);
      CHECK(what.find("hyper 'ns_steps' is 0") != std::string::npos);
    }
    CHECK(w.values() == before);
    CHECK(opt.step_count() == steps);
    CHECK(opt.hyper("ns_steps") == 5);
    opt.load(good);  // a good one loads
    CHECK(opt.step_count() == 1);
  }
}
