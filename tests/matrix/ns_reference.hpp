// The float64 reference of the Newton-Schulz iteration (torch.optim.Muon's
// _zeropower_via_newtonschulz, in double), shared by the matrix tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "matrix/newton_schulz.hpp"

namespace fusedopt::testing {

using Matrix = std::vector<double>;  // row-major

inline Matrix multiply(const Matrix& a, const Matrix& b, int m, int k, int n) {
  Matrix c(static_cast<std::size_t>(m) * n, 0.0);
  for (int i = 0; i < m; ++i) {
    for (int p = 0; p < k; ++p) {
      const double x = a[i * k + p];
      for (int j = 0; j < n; ++j) c[i * n + j] += x * b[p * n + j];
    }
  }
  return c;
}

inline Matrix transposed(const Matrix& a, int rows, int cols) {
  Matrix t(a.size());
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) t[c * rows + r] = a[r * cols + c];
  }
  return t;
}

/// One matrix, in double: transposed when tall, X / max(||X||, eps), then each round
/// X = a X + (b A + c A A) X with A = X X^T.
inline Matrix reference(Matrix x, int rows, int cols, const fusedopt::matrix::NewtonSchulz& ns) {
  const bool tall = rows > cols;
  if (tall) x = transposed(x, rows, cols);
  const int m = tall ? cols : rows, n = tall ? rows : cols;
  double sumsq = 0;
  for (double v : x) sumsq += v * v;
  const double norm = std::max(std::sqrt(sumsq), static_cast<double>(ns.eps));
  for (double& v : x) v /= norm;
  for (int s = 0; s < ns.steps; ++s) {
    const auto& k = ns.coefficients[ns.coefficients.size() == 1 ? 0 : s];
    const Matrix gram = multiply(x, transposed(x, m, n), m, n, m);
    Matrix poly = multiply(gram, gram, m, m, m);
    for (std::size_t i = 0; i < poly.size(); ++i) poly[i] = k[1] * gram[i] + k[2] * poly[i];
    Matrix next = multiply(poly, x, m, m, n);
    for (std::size_t i = 0; i < next.size(); ++i) next[i] += k[0] * x[i];
    x = next;
  }
  return tall ? transposed(x, m, n) : x;
}

}  // namespace fusedopt::testing
