// Row and column values of factored rules on the host: the subexpressions of element code
// that vary only per row (or per matrix or tensor) or per column are computed once per row
// and once per chunk column (codegen: ExprEmitter::RcValue). Checked against a float64
// reference written here, with the same text read before and after its state's update, in a
// reduction pass and the update, over a batch of matrices split into several chunks, a wide
// matrix and a 1-D param.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/host_tensors.hpp"
#include "fusedopt/optimizer.hpp"

TEST_SUITE_BEGIN("runtime");

namespace fusedopt::testing {
namespace {

using fusedopt::DType;
using fusedopt::Optimizer;
using fusedopt::Rule;

// `sqrt(r) * rsqrt(c)` appears before r and c are updated (a) and after (b): two values of
// the same text. tensor_norm(b) is a second reduction pass that reads the updated states.
constexpr const char* kRule = R"(
param p
grad  g
row r = 4
col c = 3
hyper lr = 0.01
a = g * (sqrt(r) * rsqrt(c))
r = 0.9 * r + 0.1 * row_mean(g * g)
c = 0.9 * c + 0.1 * col_mean(a * a)
b = g * (sqrt(r) * rsqrt(c))
n = tensor_norm(b)
p = p - lr * (a + b / max(n, 1e-6))
)";

/// One param in float64: B matrices of R x C (a 1-D param: numel rows of one column).
struct Ref {
  std::int64_t B, R, C;
  std::vector<double> p, r, c;

  Ref(std::int64_t b, std::int64_t rows, std::int64_t cols)
      : B(b), R(rows), C(cols), r(b * rows, 4.0), c(b * cols, 3.0) {}

  void step(const std::vector<double>& g) {
    std::vector<double> a(g.size()), b(g.size()), r1(r.size()), c1(c.size());
    for (std::int64_t m = 0; m < B; ++m) {
      for (std::int64_t i = 0; i < R; ++i) {
        for (std::int64_t j = 0; j < C; ++j) {
          const std::int64_t e = (m * R + i) * C + j;
          a[e] = g[e] * std::sqrt(r[m * R + i]) / std::sqrt(c[m * C + j]);
        }
      }
      for (std::int64_t i = 0; i < R; ++i) {
        double s = 0;
        for (std::int64_t j = 0; j < C; ++j) s += g[(m * R + i) * C + j] * g[(m * R + i) * C + j];
        r1[m * R + i] = 0.9 * r[m * R + i] + 0.1 * s / C;
      }
      for (std::int64_t j = 0; j < C; ++j) {
        double s = 0;
        for (std::int64_t i = 0; i < R; ++i) s += a[(m * R + i) * C + j] * a[(m * R + i) * C + j];
        c1[m * C + j] = 0.9 * c[m * C + j] + 0.1 * s / R;
      }
    }
    double n = 0;
    for (std::int64_t m = 0; m < B; ++m) {
      for (std::int64_t i = 0; i < R; ++i) {
        for (std::int64_t j = 0; j < C; ++j) {
          const std::int64_t e = (m * R + i) * C + j;
          b[e] = g[e] * std::sqrt(r1[m * R + i]) / std::sqrt(c1[m * C + j]);
          n += b[e] * b[e];
        }
      }
    }
    n = std::max(std::sqrt(n), 1e-6);
    for (std::size_t e = 0; e < p.size(); ++e) p[e] -= 0.01 * (a[e] + b[e] / n);
    r = r1;
    c = c1;
  }
};

TEST_CASE("row and column values: one text before and after its states' updates, in each pass") {
  use_private_cache();
  const Rule rule = Rule::parse(kRule, "values.rule");
  std::mt19937 rng(fresh_seed());
  std::normal_distribution<double> normal(0.0, 1.0);
  // A batch of two 8000 x 5 matrices (host chunks of 32 K elements: two per matrix), a
  // 3 x 4097 matrix (one chunk of three rows) and a 1-D param.
  struct Shape {
    std::vector<std::int64_t> dims;
    std::int64_t B, R, C;
  };
  const std::vector<Shape> shapes = {
      {{2, 8000, 5}, 2, 8000, 5}, {{3, 4097}, 1, 3, 4097}, {{1000}, 1, 1000, 1}};
  std::vector<HostTensor> ps, gs;
  std::vector<Ref> refs;
  fusedopt::ParamGroup group;
  for (const Shape& s : shapes) {
    const std::int64_t n = s.B * s.R * s.C;
    ps.emplace_back(n, DType::F32);
    gs.emplace_back(n, DType::F32);
    refs.emplace_back(s.B, s.R, s.C);
    for (std::int64_t i = 0; i < n; ++i) {
      ps.back().set(i, normal(rng));
      refs.back().p.push_back(ps.back().get(i));
    }
  }
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    fusedopt::Tensor t = ps[k].tensor("w" + std::to_string(k));
    t.shape = shapes[k].dims;
    group.params.push_back(t);
    group.grads.push_back(gs[k].tensor());
  }
  Optimizer opt(rule, {group});
  for (int step = 1; step <= 3; ++step) {
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      std::vector<double> g(static_cast<std::size_t>(gs[k].numel()));
      for (std::size_t i = 0; i < g.size(); ++i) {
        gs[k].set(static_cast<std::int64_t>(i), normal(rng));
        g[i] = gs[k].get(static_cast<std::int64_t>(i));
      }
      refs[k].step(g);
    }
    opt.step();
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      INFO("param ", k, ", step ", step);
      int bad = 0;
      for (std::size_t i = 0; i < refs[k].r.size(); ++i) {
        bad += at(opt.state("r", static_cast<int>(k)), static_cast<std::int64_t>(i)) !=
               doctest::Approx(refs[k].r[i]).epsilon(1e-5);
      }
      for (std::size_t i = 0; i < refs[k].c.size(); ++i) {
        bad += at(opt.state("c", static_cast<int>(k)), static_cast<std::int64_t>(i)) !=
               doctest::Approx(refs[k].c[i]).epsilon(1e-5);
      }
      for (std::size_t i = 0; i < refs[k].p.size(); ++i) {
        bad += ps[k].get(static_cast<std::int64_t>(i)) !=
               doctest::Approx(refs[k].p[i]).epsilon(1e-5).scale(1.0);
      }
      CHECK(bad == 0);
    }
  }
}

}  // namespace
}  // namespace fusedopt::testing

TEST_SUITE_END();
