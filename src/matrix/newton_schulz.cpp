// orthogonalize (newton_schulz.hpp): per matrix, the transpose where it is tall, the
// Frobenius normalization, then per round three GEMMs: A = X X^T, B = b A + c A A, and
// X' = a X + B X, with two m x m and one m x n workspace (m the smaller side).
#include "matrix/newton_schulz.hpp"

#include <cmath>
#include <cstdint>
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

/// `x` rounded to the nearest bfloat16 (ties to even; NaN stays NaN).
float round_bf16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return x;  // NaN
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&x, &u, sizeof u);
  return x;
}

void round_all(float* x, std::size_t n, bool bf16) {
  if (!bf16) return;
  for (std::size_t i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
}

/// One matrix of m x n (m <= n) at x, in place; gram and poly (m x m) and next (m x n) are
/// the workspaces.
void iterate(const HostBlas& blas, float* x, int m, int n, const NewtonSchulz& ns, float* gram,
             float* poly, float* next) {
  const std::size_t mn = static_cast<std::size_t>(m) * static_cast<std::size_t>(n);
  const std::size_t mm = static_cast<std::size_t>(m) * static_cast<std::size_t>(m);
  round_all(x, mn, ns.bf16);
  double sumsq = 0;
  for (std::size_t i = 0; i < mn; ++i) sumsq += static_cast<double>(x[i]) * x[i];
  float norm = static_cast<float>(std::sqrt(sumsq));
  if (ns.bf16) norm = round_bf16(norm);
  const float denom = std::max(norm, ns.eps);  // norm.clamp(min=eps)
  if (ns.bf16) {
    for (std::size_t i = 0; i < mn; ++i) x[i] = round_bf16(x[i] / denom);
  } else {
    const float scale = 1.0f / denom;
    for (std::size_t i = 0; i < mn; ++i) x[i] *= scale;
  }
  for (int s = 0; s < ns.steps; ++s) {
    const std::array<float, 3>& k = ns.coefficients[ns.coefficients.size() == 1 ? 0 : s];
    // gram = X X^T
    blas.sgemm(kRowMajor, kNoTrans, kTrans, m, m, n, 1.0f, x, n, x, n, 0.0f, gram, m);
    round_all(gram, mm, ns.bf16);
    // poly = b gram + c gram gram
    std::memcpy(poly, gram, sizeof(float) * mm);
    blas.sgemm(kRowMajor, kNoTrans, kNoTrans, m, m, m, k[2], gram, m, gram, m, k[1], poly, m);
    round_all(poly, mm, ns.bf16);
    // next = a X + poly X
    std::memcpy(next, x, sizeof(float) * mn);
    blas.sgemm(kRowMajor, kNoTrans, kNoTrans, m, n, m, 1.0f, poly, m, x, n, k[0], next, n);
    round_all(next, mn, ns.bf16);
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
