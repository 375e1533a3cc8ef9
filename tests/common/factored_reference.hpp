// Float64 references of the factored presets for the tests, written from their sources:
// Adam-mini's per-row partition and CAME's factored moments and confidence, and the shaped
// params they run on.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/host_tensors.hpp"
#include "fusedopt/optimizer.hpp"

namespace fusedopt::testing {

/// Params of `shapes` (normal(0, 1)), their grads and one group with `hypers`: the models of
/// the adam_mini and came cases.
struct ShapedModel {
  std::vector<HostTensor> p, g;
  fusedopt::ParamGroup group;
  ShapedModel(const std::vector<std::vector<std::int64_t>>& shapes, std::mt19937& rng,
              std::vector<std::pair<std::string, double>> hypers) {
    std::normal_distribution<double> normal(0.0, 1.0);
    for (const std::vector<std::int64_t>& shape : shapes) {
      std::int64_t n = 1;
      for (std::int64_t d : shape) n *= d;
      p.emplace_back(n, fusedopt::DType::F32);
      g.emplace_back(n, fusedopt::DType::F32);
      for (std::int64_t i = 0; i < n; ++i) p.back().set(i, normal(rng));
    }
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      fusedopt::Tensor t = p[k].tensor("w" + std::to_string(k));
      t.shape = shapes[k];
      group.params.push_back(t);
      group.grads.push_back(g[k].tensor());
    }
    group.hypers = std::move(hypers);
  }
  /// Param k's values now.
  std::vector<double> values(std::size_t k) const {
    std::vector<double> out;
    for (std::int64_t i = 0; i < p[k].numel(); ++i) out.push_back(p[k].get(i));
    return out;
  }
};

/// Adam-mini's per-row partition (adam_mini.py v1.1.1) in float64: one second moment per row
/// of each matrix (the last two dimensions), per element for 1-D params.
struct MiniRef {
  double lr = 1e-2, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.1;
  std::int64_t rows = 0, cols = 1;
  std::vector<double> p, m, v;
  void step(double t, const std::vector<double>& g) {
    for (std::size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1 - lr * weight_decay;
      m[i] = m[i] + (1 - beta1) * (g[i] - m[i]);
    }
    for (std::int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (std::int64_t c = 0; c < cols; ++c) s += g[r * cols + c] * g[r * cols + c];
      v[r] = beta2 * v[r] + (1 - beta2) * s / cols;
    }
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) {
        const std::size_t i = static_cast<std::size_t>(r * cols + c);
        p[i] -= lr / (1 - std::pow(beta1, t)) * m[i] /
                (std::sqrt(v[r]) / std::sqrt(1 - std::pow(beta2, t)) + eps);
      }
    }
  }
};

/// CAME (came_pytorch/CAME.py) in float64: per matrix of the last two dimensions, row and
/// column second moments and instabilities; a 1-D param's full second moment and no
/// confidence.
struct CameRef {
  double lr = 1e-2, beta1 = 0.9, beta2 = 0.999, beta3 = 0.9999, eps1 = 1e-30, eps2 = 1e-16, d = 1,
         weight_decay = 0.1;
  bool factored = false;
  std::int64_t B = 1, R = 0, C = 1;
  std::vector<double> p, m, r, c, rr, cc;
  /// rsqrt(row / mean of row over the rows) * rsqrt(col), per element of each matrix.
  std::vector<double> approx(const std::vector<double>& row, const std::vector<double>& col) const {
    std::vector<double> out(p.size());
    for (std::int64_t b = 0; b < B; ++b) {
      double mean = 0;
      for (std::int64_t i = 0; i < R; ++i) mean += row[b * R + i];
      mean /= static_cast<double>(R);
      for (std::int64_t i = 0; i < R; ++i) {
        for (std::int64_t j = 0; j < C; ++j) {
          out[static_cast<std::size_t>((b * R + i) * C + j)] =
              1 / std::sqrt(row[b * R + i] / mean) / std::sqrt(col[b * C + j]);
        }
      }
    }
    return out;
  }
  void means(const std::vector<double>& x, std::vector<double>& row_mean,
             std::vector<double>& col_mean) const {
    row_mean.assign(static_cast<std::size_t>(B * R), 0.0);
    col_mean.assign(static_cast<std::size_t>(B * C), 0.0);
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t i = 0; i < R; ++i) {
        for (std::int64_t j = 0; j < C; ++j) {
          const double v = x[static_cast<std::size_t>((b * R + i) * C + j)];
          row_mean[b * R + i] += v / static_cast<double>(C);
          col_mean[b * C + j] += v / static_cast<double>(R);
        }
      }
    }
  }
  void step(const std::vector<double>& g) {
    const std::size_t n = p.size();
    std::vector<double> sq(n), u(n), rm, cm;
    for (std::size_t i = 0; i < n; ++i) sq[i] = g[i] * g[i] + eps1;
    means(sq, rm, cm);
    for (std::size_t i = 0; i < r.size(); ++i) r[i] = beta2 * r[i] + (1 - beta2) * rm[i];
    for (std::size_t i = 0; i < c.size(); ++i) c[i] = beta2 * c[i] + (1 - beta2) * cm[i];
    if (factored) {
      const std::vector<double> a = approx(r, c);
      for (std::size_t i = 0; i < n; ++i) u[i] = g[i] * a[i];
    } else {
      for (std::size_t i = 0; i < n; ++i) u[i] = g[i] / std::sqrt(r[i]);
    }
    double un = 0;
    for (double x : u) un += x * x;
    const double clip = std::max(1.0, std::sqrt(un) / std::sqrt(static_cast<double>(n)) / d);
    std::vector<double> res(n);
    for (std::size_t i = 0; i < n; ++i) {
      u[i] /= clip;
      m[i] = beta1 * m[i] + (1 - beta1) * u[i];
      res[i] = (u[i] - m[i]) * (u[i] - m[i]) + eps2;
    }
    std::vector<double> update = m;
    if (factored) {
      means(res, rm, cm);
      for (std::size_t i = 0; i < rr.size(); ++i) rr[i] = beta3 * rr[i] + (1 - beta3) * rm[i];
      for (std::size_t i = 0; i < cc.size(); ++i) cc[i] = beta3 * cc[i] + (1 - beta3) * cm[i];
      const std::vector<double> a = approx(rr, cc);
      for (std::size_t i = 0; i < n; ++i) update[i] = m[i] * a[i];
    }
    for (std::size_t i = 0; i < n; ++i) {
      p[i] -= lr * weight_decay * p[i];
      p[i] -= lr * update[i];
    }
  }
};

}  // namespace fusedopt::testing
