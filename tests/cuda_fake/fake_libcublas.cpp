// A stand-in for libcublas.so (loaded through FUSEDOPT_CUBLAS_LIBRARY beside fusedopt's CUDA
// emulator, whose "device memory" is host memory) so that the matrix stages' CUDA path runs
// on machines without a GPU: the few entry points the stage calls, computed on the CPU in
// column-major order as cuBLAS defines them (sums in double). Under the emulator the work
// queued on the handle's stream runs first, as a real cuBLAS kernel runs after it. It knows
// nothing of fusedopt.
#include <cmath>
#include <cstdlib>
#include <vector>

#include "emulator_stream.hpp"

namespace {

struct Handle {
  void* stream = nullptr;
  int pointer_mode = 0;
};

constexpr int kSuccess = 0;
constexpr int kInvalidValue = 7;
constexpr int kNotInitialized = 1;

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int cublasCreate_v2(void** handle) {
  if (handle == nullptr) return kInvalidValue;
  *handle = new Handle;
  return kSuccess;
}

__attribute__((visibility("default"))) int cublasDestroy_v2(void* handle) {
  if (handle == nullptr) return kNotInitialized;
  delete static_cast<Handle*>(handle);
  return kSuccess;
}

__attribute__((visibility("default"))) int cublasSetStream_v2(void* handle, void* stream) {
  if (handle == nullptr) return kNotInitialized;
  static_cast<Handle*>(handle)->stream = stream;
  return kSuccess;
}

__attribute__((visibility("default"))) int cublasSetPointerMode_v2(void* handle, int mode) {
  if (handle == nullptr) return kNotInitialized;
  if (mode != 0) return kInvalidValue;  // host scalars only here
  static_cast<Handle*>(handle)->pointer_mode = mode;
  return kSuccess;
}

/// C = alpha op(A) op(B) + beta C, column-major: C is m x n, op(A) m x k, op(B) k x n.
__attribute__((visibility("default"))) int cublasSgemm_v2(void* handle, int ta, int tb, int m,
                                                          int n, int k, const float* alpha,
                                                          const float* a, int lda, const float* b,
                                                          int ldb, const float* beta, float* c,
                                                          int ldc) {
  if (handle == nullptr) return kNotInitialized;
  if (m < 0 || n < 0 || k < 0 || (ta != 0 && ta != 1) || (tb != 0 && tb != 1) || ldc < m ||
      lda < (ta ? k : m) || ldb < (tb ? n : k)) {
    return kInvalidValue;
  }
  fake_cuda::wait_for_stream(static_cast<Handle*>(handle)->stream);
  auto A = [&](int i, int p) {
    return ta ? a[p + static_cast<long>(i) * lda] : a[i + static_cast<long>(p) * lda];
  };
  auto B = [&](int p, int j) {
    return tb ? b[j + static_cast<long>(p) * ldb] : b[p + static_cast<long>(j) * ldb];
  };
  std::vector<double> col(static_cast<std::size_t>(m));
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) col[static_cast<std::size_t>(i)] = 0;
    for (int p = 0; p < k; ++p) {
      const double bv = B(p, j);
      for (int i = 0; i < m; ++i)
        col[static_cast<std::size_t>(i)] += static_cast<double>(A(i, p)) * bv;
    }
    for (int i = 0; i < m; ++i) {
      float& out = c[i + static_cast<long>(j) * ldc];
      const double prior =
          *beta == 0.0f ? 0.0 : static_cast<double>(*beta) * out;  // beta 0: C unread
      out = static_cast<float>(static_cast<double>(*alpha) * col[static_cast<std::size_t>(i)] +
                               prior);
    }
  }
  return kSuccess;
}

__attribute__((visibility("default"))) int cublasSnrm2_v2(void* handle, int n, const float* x,
                                                          int incx, float* result) {
  if (handle == nullptr) return kNotInitialized;
  if (result == nullptr) return kInvalidValue;
  fake_cuda::wait_for_stream(static_cast<Handle*>(handle)->stream);
  double s = 0;
  for (int i = 0; n > 0 && incx > 0 && i < n; ++i) {
    const double v = x[static_cast<long>(i) * incx];
    s += v * v;
  }
  *result = static_cast<float>(std::sqrt(s));
  return kSuccess;
}

__attribute__((visibility("default"))) int cublasSscal_v2(void* handle, int n, const float* alpha,
                                                          float* x, int incx) {
  if (handle == nullptr) return kNotInitialized;
  fake_cuda::wait_for_stream(static_cast<Handle*>(handle)->stream);
  for (int i = 0; n > 0 && incx > 0 && i < n; ++i) x[static_cast<long>(i) * incx] *= *alpha;
  return kSuccess;
}

}  // extern "C"
