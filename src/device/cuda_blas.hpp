// cuBLAS, loaded at run time as NVRTC and the driver are (dlopen): the GEMMs of a matrix
// stage on a CUDA device. Only what the Newton-Schulz iteration needs, declared here (no
// cuBLAS header at build time): fp32 GEMM, norm and scale, column-major as cuBLAS is.
#pragma once

#include <string>

namespace fusedopt::runtime::cuda {

struct Cublas {
  using Handle = void*;
  int (*create)(Handle*) = nullptr;
  int (*destroy)(Handle) = nullptr;
  int (*set_stream)(Handle, void*) = nullptr;
  int (*set_pointer_mode)(Handle, int) = nullptr;
  int (*sgemm)(Handle, int trans_a, int trans_b, int m, int n, int k, const float* alpha,
               const float* a, int lda, const float* b, int ldb, const float* beta, float* c,
               int ldc) = nullptr;
  int (*snrm2)(Handle, int n, const float* x, int incx, float* result) = nullptr;
  int (*sscal)(Handle, int n, const float* alpha, float* x, int incx) = nullptr;
  std::string library;  ///< the file it came from
};

/// cuBLAS's enum values (cublas_api.h), fixed by its ABI.
inline constexpr int kCublasOpN = 0;
inline constexpr int kCublasOpT = 1;
inline constexpr int kCublasPointerModeHost = 0;

/// The process's cuBLAS: $FUSEDOPT_CUBLAS_LIBRARY, else libcublas.so.13, .12 or .so (the
/// loader's path, then /usr/local/cuda's lib64). Throws UnavailableError naming what it
/// tried.
const Cublas& cublas();

/// Throws CudaError naming `what` when a cuBLAS call returned `status` (non-zero).
void check_cublas(int status, const char* what);

}  // namespace fusedopt::runtime::cuda
