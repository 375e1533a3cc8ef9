// orthogonalize (newton_schulz.hpp): per matrix, the Frobenius normalization,
// then per round three GEMMs: A = X X^T, B = b A + c A A, and X' = a X + B X (a
// tall matrix as its transpose, through the GEMMs' transpose flags: no copy of
// it), with two m x m and one m x n workspace (m the smaller side) kept per
// thread, the rounds alternating between the matrix and the m x n one.
#include "matrix/newton_schulz.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

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

/// The workspaces of this thread's iterations, kept from call to call (the
/// matrix stage calls once per matrix: fresh buffers each time cost their page
/// faults again).
struct Workspace {
  std::vector<float> gram, poly, next;
};

Workspace& workspace(std::size_t mm, std::size_t mn) {
  thread_local Workspace w;
  if (w.gram.size() < mm) w.gram.resize(mm);
  if (w.poly.size() < mm) w.poly.resize(mm);
  if (w.next.size() < mn) w.next.resize(mn);
  return w;
}

/// One matrix at x, in place: wide (m x n, m <= n, row-major) or tall (n x m
/// stored row-major, iterated as its transpose Y = X^T without moving it: A = Y
/// Y^T = X^T X and Y' = a Y + B Y, that is X' = a X + X B^T). The rounds
/// alternate between x and the workspace; the result ends in x.
void iterate(const HostBlas& blas, float* const x, int m, int n, bool tall,
             const NewtonSchulz& ns) {
  const std::size_t mn = static_cast<std::size_t>(m) * static_cast<std::size_t>(n);
  const std::size_t mm = static_cast<std::size_t>(m) * static_cast<std::size_t>(m);
  Workspace& w = workspace(mm, mn);
  float* const gram = w.gram.data();
  float* const poly = w.poly.data();
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
  float* cur = x;
  float* next = w.next.data();
  for (int s = 0; s < ns.steps; ++s) {
    const std::array<float, 3>& k = ns.coefficients[ns.coefficients.size() == 1 ? 0 : s];
    // gram = X X^T (tall: X^T X): symmetric, so ssyrk's half of the flops where the BLAS has
    // it, its upper triangle mirrored into the lower
    if (blas.ssyrk != nullptr) {
      blas.ssyrk(kRowMajor, kUpper, tall ? kTrans : kNoTrans, m, n, 1.0f, cur, tall ? m : n, 0.0f,
                 gram, m);
      for (int i = 1; i < m; ++i) {
        for (int j = 0; j < i; ++j)
          gram[static_cast<std::size_t>(i) * m + j] = gram[static_cast<std::size_t>(j) * m + i];
      }
    } else if (tall) {
      blas.sgemm(kRowMajor, kTrans, kNoTrans, m, m, n, 1.0f, cur, m, cur, m, 0.0f, gram, m);
    } else {
      blas.sgemm(kRowMajor, kNoTrans, kTrans, m, m, n, 1.0f, cur, n, cur, n, 0.0f, gram, m);
    }
    round_all(gram, mm, ns.bf16);
    // poly = b gram + c gram gram
    std::memcpy(poly, gram, sizeof(float) * mm);
    blas.sgemm(kRowMajor, kNoTrans, kNoTrans, m, m, m, k[2], gram, m, gram, m, k[1], poly, m);
    round_all(poly, mm, ns.bf16);
    // next = a X + poly X (tall: a X + X poly^T)
    std::memcpy(next, cur, sizeof(float) * mn);
    if (tall) {
      blas.sgemm(kRowMajor, kNoTrans, kTrans, n, m, m, 1.0f, cur, m, poly, m, k[0], next, m);
    } else {
      blas.sgemm(kRowMajor, kNoTrans, kNoTrans, m, n, m, 1.0f, poly, m, cur, n, k[0], next, n);
    }
    round_all(next, mn, ns.bf16);
    std::swap(cur, next);
  }
  if (cur != x) std::memcpy(x, cur, sizeof(float) * mn);
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
  for (std::int64_t i = 0; i < batch; ++i) {
    iterate(blas, data + static_cast<std::size_t>(i) * mn, m, n, tall, ns);
  }
}

}  // namespace fusedopt::matrix
