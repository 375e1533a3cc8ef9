// Factored (row/column) state through the Optimizer on the host: the adafactor preset
// against a float64 reference written here from torch.optim.Adafactor's single-tensor path
// (torch >= 2.5), on matrices, a batch of matrices, 1-D and empty params; its state is
// O(rows + cols) (stats()); row/col states round-trip through a checkpoint.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/factored_reference.hpp"
#include "common/host_tensors.hpp"
#include "common/temp_dir.hpp"
#include "fusedopt/optimizer.hpp"

namespace fusedopt::testing {
namespace {

using fusedopt::DType;
using fusedopt::Optimizer;
using fusedopt::Rule;

struct AdafactorHypers {
  double lr = 1e-2, beta2_decay = -0.8, eps1 = 0, eps2 = 1e-3, d = 1, weight_decay = 0;
  bool maximize = false;
};

/// One param of torch's Adafactor in float64: row_var/col_var for 2+ dimensions (last two
/// are rows x cols, the leading ones batched), the full variance for 1-D.
struct RefParam {
  std::vector<std::int64_t> shape;
  std::vector<double> p, row_var, col_var, variance;
  std::int64_t B = 1, R = 0, C = 1;
  bool factored = false;

  RefParam(std::vector<std::int64_t> s, std::int64_t numel) : shape(std::move(s)) {
    factored = shape.size() >= 2;
    if (factored) {
      for (std::size_t k = 0; k + 2 < shape.size(); ++k) B *= shape[k];
      R = shape[shape.size() - 2];
      C = shape.back();
      row_var.assign(static_cast<std::size_t>(B * R), 0.0);
      col_var.assign(static_cast<std::size_t>(B * C), 0.0);
    } else {
      R = numel;
      variance.assign(static_cast<std::size_t>(numel), 0.0);
    }
    p.assign(static_cast<std::size_t>(numel), 0.0);
  }

  void step(double t, const std::vector<double>& g_in, const AdafactorHypers& h) {
    const auto n = static_cast<std::int64_t>(p.size());
    if (n == 0) return;
    const double eps1 = h.eps1 > 0 ? h.eps1 : 1.1920928955078125e-07;  // finfo(float32).eps
    std::vector<double> g = g_in;
    if (h.maximize) {
      for (double& x : g) x = -x;
    }
    const double beta2t = std::pow(t, h.beta2_decay);
    const double rho = std::min(h.lr, 1 / std::sqrt(t));
    double pn = 0;
    for (double x : p) pn += x * x;
    const double alpha = std::max(h.eps2, std::sqrt(pn) / std::sqrt(double(n))) * rho;
    if (h.weight_decay != 0) {
      for (double& x : p) x *= 1 - h.lr * h.weight_decay;
    }
    std::vector<double> var(static_cast<std::size_t>(n));
    if (factored) {
      for (std::int64_t b = 0; b < B; ++b) {
        for (std::int64_t r = 0; r < R; ++r) {
          double s = 0;
          for (std::int64_t c = 0; c < C; ++c) s += g[(b * R + r) * C + c] * g[(b * R + r) * C + c];
          double& v = row_var[b * R + r];
          v = v + beta2t * (s / C - v);
        }
        for (std::int64_t c = 0; c < C; ++c) {
          double s = 0;
          for (std::int64_t r = 0; r < R; ++r) s += g[(b * R + r) * C + c] * g[(b * R + r) * C + c];
          double& v = col_var[b * C + c];
          v = v + beta2t * (s / R - v);
        }
        double mean = 0;
        for (std::int64_t r = 0; r < R; ++r) mean += row_var[b * R + r];
        mean = std::max(mean / R, eps1);
        for (std::int64_t r = 0; r < R; ++r) {
          for (std::int64_t c = 0; c < C; ++c) {
            var[(b * R + r) * C + c] = row_var[b * R + r] * col_var[b * C + c] / mean;
          }
        }
      }
    } else {
      for (std::int64_t i = 0; i < n; ++i) {
        variance[i] = variance[i] + beta2t * (g[i] * g[i] - variance[i]);
        var[i] = variance[i];
      }
    }
    std::vector<double> u(static_cast<std::size_t>(n));
    double un = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      u[i] = g[i] / std::sqrt(std::max(var[i], eps1 * eps1));
      un += u[i] * u[i];
    }
    const double denom = std::max(1.0, std::sqrt(un) / (std::sqrt(double(n)) * h.d));
    for (std::int64_t i = 0; i < n; ++i) p[i] -= alpha / denom * u[i];
  }
};

std::int64_t numel_of(const std::vector<std::int64_t>& shape, std::int64_t given) {
  if (shape.empty()) return given;
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

/// Runs the adafactor preset for `steps` steps on `shapes` against RefParam; the worst
/// |err| / (tol (|ref| + max |ref|)) over params and states.
void run_adafactor(const std::vector<std::vector<std::int64_t>>& shapes,
                   const std::vector<std::int64_t>& flat_numel, const AdafactorHypers& h,
                   int steps) {
  use_private_cache();
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed << " (FUSEDOPT_TEST_SEED=" << seed << " replays it)");
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<HostTensor> p, g;
  std::vector<RefParam> ref;
  fusedopt::ParamGroup group;
  group.hypers = {{"lr", h.lr},
                  {"beta2_decay", h.beta2_decay},
                  {"eps1", h.eps1},
                  {"eps2", h.eps2},
                  {"d", h.d},
                  {"weight_decay", h.weight_decay},
                  {"maximize", h.maximize ? 1.0 : 0.0}};
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    const std::int64_t n = numel_of(shapes[k], flat_numel[k]);
    p.emplace_back(n, DType::F32);
    g.emplace_back(n, DType::F32);
    ref.emplace_back(shapes[k], n);
    for (std::int64_t i = 0; i < n; ++i) {
      p[k].set(i, normal(rng));
      ref[k].p[static_cast<std::size_t>(i)] = p[k].get(i);
    }
    fusedopt::Tensor t = p[k].tensor("w" + std::to_string(k));
    t.shape = shapes[k];
    group.params.push_back(t);
    group.grads.push_back(g[k].tensor());
  }
  Optimizer opt(Rule::preset("adafactor"), {group});
  constexpr double kTol = 1e-5;
  for (int t = 1; t <= steps; ++t) {
    std::vector<std::vector<double>> gd(shapes.size());
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      for (std::int64_t i = 0; i < g[k].numel(); ++i) {
        g[k].set(i, normal(rng) * (1 + static_cast<double>(k)));  // a scale per param
        gd[k].push_back(g[k].get(i));
      }
      ref[k].step(t, gd[k], h);
    }
    opt.step();
    if (!(t <= 3 || t % 10 == 0 || t == steps)) continue;
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      INFO("step " << t << ", param " << k);
      auto check = [&](const char* what, const fusedopt::Tensor& got,
                       const std::vector<double>& want) {
        INFO(what);
        REQUIRE(got.numel == static_cast<std::int64_t>(want.size()));
        double scale = 0;
        for (double x : want) scale = std::max(scale, std::abs(x));
        for (std::size_t i = 0; i < want.size(); ++i) {
          const double err = std::abs(at(got, static_cast<std::int64_t>(i)) - want[i]);
          if (!(err <= kTol * (std::abs(want[i]) + scale))) {
            FAIL_CHECK(what << " element " << i << ": fused " << at(got, i) << ", reference "
                            << want[i]);
            return;
          }
        }
      };
      check("param", p[k].tensor(), ref[k].p);
      if (ref[k].factored) {
        check("r (row_var)", opt.state("r", static_cast<int>(k)), ref[k].row_var);
        check("c (col_var)", opt.state("c", static_cast<int>(k)), ref[k].col_var);
      } else {
        check("r (variance)", opt.state("r", static_cast<int>(k)), ref[k].variance);
      }
    }
  }
}

}  // namespace

TEST_SUITE("runtime") {
  TEST_CASE("adafactor matches torch.optim.Adafactor on matrices, a batch and 1-D params") {
    // Primes; one matrix of 521 x 263 (five chunks of whole rows: 124 rows of 263 columns
    // fill a 2^15-element host chunk), a batch of 3 matrices, 1-D params of 2^17 + 3 (four
    // whole chunks and a tail) and 101 elements, empty ones of both kinds.
    run_adafactor({{37, 53}, {3, 11, 7}, {101}, {0, 5}, {}, {521, 263}, {(1 << 17) + 3}},
                  {0, 0, 0, 0, 0, 0, 0}, AdafactorHypers{}, 100);
  }

  TEST_CASE("adafactor with weight decay, maximize, its own eps1 and d, and lr below 1/sqrt(t)") {
    AdafactorHypers h;
    h.lr = 0.05;  // rho = min(lr, 1/sqrt(t)) switches from 1/sqrt(t) to lr at step 400 > 100
    h.lr = 0.2;   // ... and here at step 25: both branches within 100 steps
    h.weight_decay = 0.1;
    h.maximize = true;
    h.eps1 = 1e-20;
    h.eps2 = 1e-2;
    h.d = 0.5;
    h.beta2_decay = -0.5;
    run_adafactor({{13, 29}, {2, 3, 5, 7}, {211}}, {0, 0, 0}, h, 100);
  }

  TEST_CASE("row and column states: untouched by a skipped step, round-tripped by a checkpoint") {
    use_private_cache();
    fusedopt::testing::TempDir dir;
    const std::string path = (dir.path() / "adafactor.safetensors").string();
    std::mt19937 rng(fresh_seed());
    const std::vector<std::vector<std::int64_t>> shapes = {{19, 23}, {2, 5, 3}, {31}};
    struct Model {
      std::vector<HostTensor> p, g;
      fusedopt::ParamGroup group;
    };
    auto make = [&](Model& m) {
      for (std::size_t k = 0; k < shapes.size(); ++k) {
        const std::int64_t n = numel_of(shapes[k], 0);
        m.p.emplace_back(n, DType::F32);
        m.g.emplace_back(n, DType::F32);
      }
      for (std::size_t k = 0; k < shapes.size(); ++k) {
        fusedopt::Tensor t = m.p[k].tensor("w" + std::to_string(k));
        t.shape = shapes[k];
        m.group.params.push_back(t);
        m.group.grads.push_back(m.g[k].tensor());
      }
    };
    Model a, b;
    make(a);
    make(b);
    for (HostTensor& x : a.p) fill_normal(x, rng);
    Optimizer opt(Rule::preset("adafactor"), {a.group});
    for (int t = 0; t < 3; ++t) {
      for (HostTensor& x : a.g) fill_normal(x, rng);
      opt.step();
    }
    auto values = [](const fusedopt::Tensor& s) {
      std::vector<double> out;
      for (std::int64_t i = 0; i < s.numel; ++i) out.push_back(at(s, i));
      return out;
    };
    const std::vector<double> r0 = values(opt.state("r", 0)), c0 = values(opt.state("c", 0));
    a.g[1].set(4, std::nan(""));
    CHECK_FALSE(opt.step_scaled(0.5f).taken());
    CHECK(values(opt.state("r", 0)) == r0);
    CHECK(values(opt.state("c", 0)) == c0);
    opt.save(path);
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      for (std::int64_t i = 0; i < a.p[k].numel(); ++i) b.p[k].set(i, a.p[k].get(i));
    }
    Optimizer loaded(Rule::preset("adafactor"), {b.group});
    loaded.load(path);
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      CHECK(values(loaded.state("r", static_cast<int>(k))) ==
            values(opt.state("r", static_cast<int>(k))));
      CHECK(values(loaded.state("c", static_cast<int>(k))) ==
            values(opt.state("c", static_cast<int>(k))));
    }
    // The same next step, bit for bit.
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      fill_normal(a.g[k], rng);
      for (std::int64_t i = 0; i < a.g[k].numel(); ++i) b.g[k].set(i, a.g[k].get(i));
    }
    opt.step();
    loaded.step();
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      CHECK(values(a.p[k].tensor()) == values(b.p[k].tensor()));
    }
  }

  TEST_CASE("row and column temporaries: computed per element and in the row/column stages") {
    use_private_cache();
    const Rule rule = Rule::parse(R"(
param p
grad  g
row r = 0
col c = 1
hyper lr = 0.1
rv = lerp(r, row_mean(g * g), 0.5)
cv = c * 0.5 + col_mean(g) * 0.25
r = rv
c = cv
p = p - lr * g * rsqrt(rv * cv * cv + 1)
)",
                                  "temps.rule");
    std::mt19937 rng(fresh_seed());
    std::normal_distribution<double> normal(0.0, 1.0);
    const std::int64_t R = 7, C = 5;
    HostTensor p(R * C, DType::F32), g(R * C, DType::F32);
    for (std::int64_t i = 0; i < R * C; ++i) p.set(i, normal(rng));
    fusedopt::ParamGroup group;
    fusedopt::Tensor t = p.tensor("w");
    t.shape = {R, C};
    group.params.push_back(t);
    group.grads.push_back(g.tensor());
    Optimizer opt(rule, {group});
    std::vector<double> rp(R * C), r(R, 0.0), c(C, 1.0);
    for (std::int64_t i = 0; i < R * C; ++i) rp[i] = p.get(i);
    for (int step = 1; step <= 4; ++step) {
      for (std::int64_t i = 0; i < R * C; ++i) g.set(i, normal(rng));
      std::vector<double> rv(R), cv(C);
      for (std::int64_t a = 0; a < R; ++a) {
        double s = 0;
        for (std::int64_t b = 0; b < C; ++b) s += g.get(a * C + b) * g.get(a * C + b);
        rv[a] = r[a] + 0.5 * (s / C - r[a]);
      }
      for (std::int64_t b = 0; b < C; ++b) {
        double s = 0;
        for (std::int64_t a = 0; a < R; ++a) s += g.get(a * C + b);
        cv[b] = c[b] * 0.5 + s / R * 0.25;
      }
      for (std::int64_t a = 0; a < R; ++a) {
        for (std::int64_t b = 0; b < C; ++b) {
          rp[a * C + b] -= 0.1 * g.get(a * C + b) / std::sqrt(rv[a] * cv[b] * cv[b] + 1);
        }
      }
      r = rv;
      c = cv;
      opt.step();
      for (std::int64_t a = 0; a < R; ++a) {
        CHECK(at(opt.state("r", 0), a) == doctest::Approx(r[a]).epsilon(1e-5));
      }
      for (std::int64_t b = 0; b < C; ++b) {
        CHECK(at(opt.state("c", 0), b) == doctest::Approx(c[b]).epsilon(1e-5));
      }
      for (std::int64_t i = 0; i < R * C; ++i) {
        CHECK(p.get(i) == doctest::Approx(rp[i]).epsilon(1e-5));
      }
    }
  }

  TEST_CASE("a 4096 x 1024 param keeps (4096 + 1024) x 4 bytes of adafactor state") {
    use_private_cache();
    HostTensor p(4096 * 1024, DType::F32), g(4096 * 1024, DType::F32);
    fusedopt::ParamGroup group;
    fusedopt::Tensor t = p.tensor("w");
    t.shape = {4096, 1024};
    group.params.push_back(t);
    group.grads.push_back(g.tensor());
    Optimizer opt(Rule::preset("adafactor"), {group});
    CHECK(opt.stats().state_bytes == (4096 + 1024) * 4);
    CHECK(opt.state("r", 0).numel == 4096);
    CHECK(opt.state("c", 0).numel == 1024);
    // Without a shape it is a 1-D param: the full variance (and one unused column value).
    HostTensor q(1000, DType::F32), h(1000, DType::F32);
    fusedopt::ParamGroup flat;
    flat.params.push_back(q.tensor("v"));
    flat.grads.push_back(h.tensor());
    CHECK(Optimizer(Rule::preset("adafactor"), {flat}).stats().state_bytes == (1000 + 1) * 4);
  }

  TEST_CASE("an empty param whose rows or columns overflow 64 bits is refused, naming it") {
    use_private_cache();
    // {2^32, 2^32, 0}: no elements, but 2^64 rows: the layout's products overflowed (UB).
    const std::int64_t big = std::int64_t{1} << 32;
    HostTensor p(8, DType::F32), g(8, DType::F32);
    for (const char* preset : {"adafactor", "adamw"}) {
      CAPTURE(preset);
      fusedopt::ParamGroup group;
      fusedopt::Tensor t = p.tensor("w");
      t.numel = 0;
      t.shape = {big, big, 0};
      fusedopt::Tensor d = g.tensor();
      d.numel = 0;
      group.params.push_back(t);
      group.grads.push_back(d);
      CHECK_THROWS_WITH_AS(Optimizer(Rule::preset(preset), {group}),
                           doctest::Contains("param shape [4294967296, 4294967296, 0] has more "
                                             "rows or columns than 64 bits count"),
                           fusedopt::UsageError);
    }
    // Two params whose rows fit alone, not together.
    const std::int64_t half = std::int64_t{1} << 62;
    fusedopt::ParamGroup two;
    for (const char* name : {"a", "b"}) {
      fusedopt::Tensor t = p.tensor(name);
      t.numel = 0;
      t.shape = {half, 0};
      fusedopt::Tensor d = g.tensor();
      d.numel = 0;
      two.params.push_back(t);
      two.grads.push_back(d);
    }
    CHECK_THROWS_WITH_AS(Optimizer(Rule::preset("adafactor"), {two}),
                         doctest::Contains("overflow 64 bits"), fusedopt::UsageError);
  }
  TEST_CASE("adam_mini matches Adam-mini's per-row second moment over 100 steps") {
    use_private_cache();
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed << " (FUSEDOPT_TEST_SEED=" << seed << " replays it)");
    std::mt19937 rng(seed);
    std::normal_distribution<double> normal(0.0, 1.0);
    // A matrix longer than a chunk, a batch of matrices (rows of every matrix), 1-D params.
    const std::vector<std::vector<std::int64_t>> shapes = {
        {37, 53}, {2, 5, 300}, {1031}, {521, 263}};
    ShapedModel model(shapes, rng, {{"lr", 1e-2}, {"weight_decay", 0.1}});
    std::vector<HostTensor>& p = model.p;
    std::vector<HostTensor>& g = model.g;
    std::vector<MiniRef> ref(shapes.size());
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      ref[k].p = model.values(k);
      ref[k].cols = shapes[k].size() >= 2 ? shapes[k].back() : 1;
      ref[k].rows = p[k].numel() / ref[k].cols;
      ref[k].m.assign(ref[k].p.size(), 0.0);
      ref[k].v.assign(static_cast<std::size_t>(ref[k].rows), 0.0);
    }
    Optimizer opt(Rule::preset("adam_mini"), {model.group});
    for (int t = 1; t <= 100; ++t) {
      for (std::size_t k = 0; k < shapes.size(); ++k) {
        std::vector<double> gd;
        for (std::int64_t i = 0; i < g[k].numel(); ++i) {
          // Rows of different scales: a per-row second moment differs from a per-tensor one.
          g[k].set(i, normal(rng) * (1 + static_cast<double>((i / ref[k].cols) % 7)));
          gd.push_back(g[k].get(i));
        }
        ref[k].step(t, gd);
      }
      opt.step();
      if (!(t <= 3 || t % 25 == 0)) continue;
      for (std::size_t k = 0; k < shapes.size(); ++k) {
        INFO("step " << t << ", param " << k);
        const fusedopt::Tensor v = opt.state("v", static_cast<int>(k));
        REQUIRE(v.numel == ref[k].rows);
        for (std::int64_t r = 0; r < ref[k].rows; ++r) {
          REQUIRE(std::abs(at(v, r) - ref[k].v[r]) <= 1e-5 * ref[k].v[r]);
        }
        double scale = 0;
        for (double x : ref[k].p) scale = std::max(scale, std::abs(x));
        for (std::int64_t i = 0; i < p[k].numel(); ++i) {
          const double want = ref[k].p[static_cast<std::size_t>(i)];
          REQUIRE(std::abs(p[k].get(i) - want) <= 1e-5 * (std::abs(want) + scale));
        }
      }
    }
  }
  TEST_CASE("came matches CAME's factored moments and confidence over 100 steps") {
    use_private_cache();
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed << " (FUSEDOPT_TEST_SEED=" << seed << " replays it)");
    std::mt19937 rng(seed);
    std::normal_distribution<double> normal(0.0, 1.0);
    const std::vector<std::vector<std::int64_t>> shapes = {
        {37, 53}, {2, 5, 300}, {1031}, {521, 263}};
    ShapedModel model(shapes, rng, {{"lr", 1e-2}, {"weight_decay", 0.1}});
    std::vector<HostTensor>& p = model.p;
    std::vector<HostTensor>& g = model.g;
    std::vector<CameRef> ref(shapes.size());
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      const std::int64_t n = p[k].numel();
      CameRef& x = ref[k];
      x.p = model.values(k);
      x.factored = shapes[k].size() >= 2;
      x.C = x.factored ? shapes[k].back() : 1;
      x.R = x.factored ? shapes[k][shapes[k].size() - 2] : n;
      x.B = n / (x.R * x.C);
      x.m.assign(static_cast<std::size_t>(n), 0.0);
      x.r.assign(static_cast<std::size_t>(x.B * x.R), 0.0);
      x.rr = x.r;
      x.c.assign(static_cast<std::size_t>(x.B * x.C), 0.0);
      x.cc = x.c;
    }
    Optimizer opt(Rule::preset("came"), {model.group});
    for (int t = 1; t <= 100; ++t) {
      for (std::size_t k = 0; k < shapes.size(); ++k) {
        std::vector<double> gd;
        for (std::int64_t i = 0; i < g[k].numel(); ++i) {
          g[k].set(i, normal(rng) * (1 + static_cast<double>((i / ref[k].C) % 5)));
          gd.push_back(g[k].get(i));
        }
        ref[k].step(gd);
      }
      opt.step();
      if (!(t <= 3 || t % 25 == 0)) continue;
      for (std::size_t k = 0; k < shapes.size(); ++k) {
        INFO("step " << t << ", param " << k);
        auto check = [&](const char* what, const fusedopt::Tensor& got,
                         const std::vector<double>& want) {
          INFO(what);
          REQUIRE(got.numel == static_cast<std::int64_t>(want.size()));
          double scale = 0;
          for (double x : want) scale = std::max(scale, std::abs(x));
          for (std::size_t i = 0; i < want.size(); ++i) {
            REQUIRE(std::abs(at(got, static_cast<std::int64_t>(i)) - want[i]) <=
                    1e-5 * (std::abs(want[i]) + scale));
          }
        };
        check("param", p[k].tensor(), ref[k].p);
        check("m", opt.state("m", static_cast<int>(k)), ref[k].m);
        check("r", opt.state("r", static_cast<int>(k)), ref[k].r);
        if (ref[k].factored) {
          check("c", opt.state("c", static_cast<int>(k)), ref[k].c);
          check("rr", opt.state("rr", static_cast<int>(k)), ref[k].rr);
          check("cc", opt.state("cc", static_cast<int>(k)), ref[k].cc);
        }
      }
    }
  }
}

}  // namespace fusedopt::testing
