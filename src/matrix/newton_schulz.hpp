// The Newton-Schulz iteration of Muon's matrix stage (orthogonalize): each matrix of a batch
// replaced by an approximation of U V^T of its SVD, as torch.optim.Muon computes it, with
// the GEMMs on the host's BLAS (host_blas.hpp), in fp32.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace fusedopt::matrix {

/// The iteration: `steps` rounds of X <- a X + (b A + c A A) X with A = X X^T, after
/// X <- X / max(||X||_F, eps). `coefficients` holds one (a, b, c) for every round, or one
/// for all of them (torch.optim.Muon: 5 rounds of (3.4445, -4.7750, 2.0315), eps 1e-7).
struct NewtonSchulz {
  int steps = 5;
  std::vector<std::array<float, 3>> coefficients = {{3.4445f, -4.7750f, 2.0315f}};
  float eps = 1e-7f;
  /// The iteration in bfloat16 as torch.optim.Muon runs it: the input, its norm, the
  /// normalized matrix and every GEMM's result rounded to bf16 (the GEMMs accumulate in
  /// fp32); else fp32 throughout.
  bool bf16 = false;

  bool operator==(const NewtonSchulz& o) const {
    return steps == o.steps && coefficients == o.coefficients && eps == o.eps && bf16 == o.bf16;
  }
};

/// Checks `ns` (steps from 1 to 100, one triple or `steps` of them, finite, eps > 0);
/// throws UsageError saying which.
void check(const NewtonSchulz& ns);

/// Orthogonalizes `batch` row-major fp32 matrices of `rows` x `cols`, one after another at
/// `data`, in place. A tall matrix (rows > cols) is iterated transposed, as Muon does (the
/// Gram matrix is the smaller side). Throws UnavailableError without a BLAS.
void orthogonalize(float* data, std::int64_t batch, std::int64_t rows, std::int64_t cols,
                   const NewtonSchulz& ns);

/// The floating-point operations of orthogonalize() on one matrix (the GEMMs: 2 m n k each).
double orthogonalize_flops(std::int64_t rows, std::int64_t cols, int steps);

}  // namespace fusedopt::matrix
