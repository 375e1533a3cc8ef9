// orthogonalize (newton_schulz.hpp): per matrix, the transpose where it is tall, the
// Frobenius normalization, then per round three GEMMs: A = X X^T, B = b A + c A A, and
// X' = a X + B X, with two m x m and one m x n workspace (m the smaller side).
#include "matrix/newton_schulz.hpp"

#include <cmath>
#include <cstring>
#include <limits>

#include "fusedopt/error.hpp"
#include "matrix/host_blas.hpp"
#include "support/check.hpp"

namespace fusedopt::matrix {

void check(const NewtonSchulz& ns) {
  FUSEDOPT_CHECK_USAGE(ns.steps >= 1 && ns.steps <= 100,
                       "orthogonalize: ns_steps is {}; it must be from 1 to 100", ns.steps);
  const std::size_t n = ns.coefficients.size();
  FUSEDOPT_CHECK_USAGE(n == 1 || n == static_cast<std::size_t>(ns.steps),
                       "orthogonalize: {} coefficient triples for {} steps (give one triple, or "
                       "one per step)",
                       n, ns.steps);
  for (std::size_t i = 0; i < n; ++i) {
    for (float x : ns.coefficients[i]) {
      FUSEDOPT_CHECK_USAGE(std::isfinite(x), "orthogonalize: coefficient triple {} holds {}", i, x);
    }
  }
  FUSEDOPT_CHECK_USAGE(std::isfinite(ns.eps) && ns.eps > 0,
                       "orthogonalize: eps is {}; it must be a finite number above 0", ns.eps);
}

double orthogonalize_flops(std::int64_t rows, std::int64_t cols, int steps) {
  const double m = static_cast<double>(std::min(rows, cols));
  const double n = static_cast<double>(std::max(rows, cols));
  // X X^T (m m n), A A (m m m), B X (m n m), each 2 flops per multiply-add.
  return steps * 2.0 * (m * m * n + m * m * m + m * n * m);
}

namespace {

void transpose(const float* in, float* out, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
  }
}

/// One matrix of m x n (m <= n) at x, in place; gram and poly (m x m) and next (m x n) are
/// the workspaces.
void iterate(const HostBlas& blas, float* x, int m, int n, const NewtonSchulz& ns, float* gram,
             float* poly, float* next) {
  double sumsq = 0;
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(m) * n; ++i) {
    sumsq += static_cast<double>(x[i]) * x[i];
  }
  const float scale =
      1.0f / std::max(static_cast<float>(std::sqrt(sumsq)), ns.eps);  // norm.clamp(min=eps)
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(m) * n; ++i) x[i] *= scale;
  const std::size_t mn = static_cast<std::size_t>(m) * static_cast<std::size_t>(n);
  for (int s = 0; s < ns.steps; ++s) {
    const std::array<float, 3>& k = ns.coefficients[ns.coefficients.size() == 1 ? 0 : s];
    // gram = X X^T
    blas.sgemm(kRowMajor, kNoTrans, kTrans, m, m, n, 1.0f, x, n, x, n, 0.0f, gram, m);
    // poly = b gram + c gram gram
    std::memcpy(poly, gram, sizeof(float) * static_cast<std::size_t>(m) * m);
    blas.sgemm(kRowMajor, kNoTrans, kNoTrans, m, m, m, k[2], gram, m, gram, m, k[1], poly, m);
    // next = a X + poly X
    std::memcpy(next, x, sizeof(float) * mn);
    blas.sgemm(kRowMajor, kNoTrans, kNoTrans, m, n, m, 1.0f, poly, m, x, n, k[0], next, n);
    std::memcpy(x, next, sizeof(float) * mn);
  }
}

}  // namespace

void orthogonalize(float* data, std::int64_t batch, std::int64_t rows, std::int64_t cols,
                   const NewtonSchulz& ns) {
  check(ns);
  FUSEDOPT_CHECK_USAGE(batch >= 0 && rows >= 1 && cols >= 1,
                       "orthogonalize: {} matrices of {} x {}", batch, rows, cols);
  constexpr std::int64_t kMaxSide = std::numeric_limits<int>::max() / 2;
  FUSEDOPT_CHECK_USAGE(rows <= kMaxSide && cols <= kMaxSide,
                       "orthogonalize: a {} x {} matrix is larger than BLAS indexes", rows, cols);
  if (batch == 0) return;
  const HostBlas& blas = host_blas();
  const bool tall = rows > cols;
  const auto m = static_cast<int>(tall ? cols : rows);
  const auto n = static_cast<int>(tall ? rows : cols);
  const std::size_t mn = static_cast<std::size_t>(m) * static_cast<std::size_t>(n);
  std::vector<float> gram(static_cast<std::size_t>(m) * m), poly(gram.size()), next(mn);
  std::vector<float> flipped(tall ? mn : 0);
  for (std::int64_t i = 0; i < batch; ++i) {
    float* x = data + static_cast<std::size_t>(i) * mn;
    if (tall) {
      transpose(x, flipped.data(), rows, cols);
      iterate(blas, flipped.data(), m, n, ns, gram.data(), poly.data(), next.data());
      transpose(flipped.data(), x, cols, rows);
    } else {
      iterate(blas, x, m, n, ns, gram.data(), poly.data(), next.data());
    }
  }
}

}  // namespace fusedopt::matrix
