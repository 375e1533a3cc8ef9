// The host's BLAS, loaded at run time as NVRTC and the CUDA driver are (dlopen): fusedopt
// builds and runs without one, and a matrix stage asks for it only when it runs. Only what
// the Newton-Schulz iteration needs: single-precision GEMM, row-major.
#pragma once

#include <cstdint>
#include <string>

namespace fusedopt::matrix {

/// C = alpha * op(A) op(B) + beta * C, row-major (cblas_sgemm), where op(X) is X or its
/// transpose: C is m x n, op(A) m x k, op(B) k x n; lda, ldb, ldc are the row strides.
struct HostBlas {
  void (*sgemm)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                const float* a, int lda, const float* b, int ldb, float beta, float* c,
                int ldc) = nullptr;
  /// C = alpha * op(A) op(A)^T + beta * C on C's `uplo` triangle (cblas_ssyrk; op(A) n x k),
  /// where the library has it (null: sgemm does it all).
  void (*ssyrk)(int order, int uplo, int trans, int n, int k, float alpha, const float* a, int lda,
                float beta, float* c, int ldc) = nullptr;
  std::string library;  ///< the file it came from
};

/// The process's BLAS: $FUSEDOPT_BLAS_LIBRARY, else OpenBLAS (libopenblas.so.0), else the
/// reference CBLAS (libcblas.so.3, libblas.so.3), the first that has cblas_sgemm. Throws
/// UnavailableError naming what it tried and how to install one.
const HostBlas& host_blas();

/// CBLAS's enum values (cblas.h), fixed by the standard.
inline constexpr int kRowMajor = 101;
inline constexpr int kNoTrans = 111;
inline constexpr int kTrans = 112;
inline constexpr int kUpper = 121;

}  // namespace fusedopt::matrix
