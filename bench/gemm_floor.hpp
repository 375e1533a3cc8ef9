// The GEMM floor of a matrix stage (orthogonalize: the Newton-Schulz iteration of Muon): the
// iteration's GEMMs alone, on the exact shapes fusedopt runs them, timed on the BLAS fusedopt
// itself loaded. Per matrix of rows x cols (m the smaller side, n the larger), per round:
// X X^T (m x m, inner n; by cblas_ssyrk, half the flops, where the BLAS has it), A A (m x m,
// inner m) and B X (m x n, inner m), as src/matrix/newton_schulz.cpp calls the BLAS; the floor is
// the sum over the matrices and rounds of each shape's best time. A step's time below it means the
// floor is wrong.
//
// The BLAS is found as fusedopt's host_blas() finds it ($FUSEDOPT_BLAS_LIBRARY, else
// libopenblas.so.0, libcblas.so.3, libblas.so.3: the first with cblas_sgemm) and opened by the
// same name after fusedopt's first step has loaded it: the dynamic loader hands back the
// library already in the process, so these GEMMs run on the same code and thread pool as the
// step's (the benchmarks see fusedopt's public headers only, not host_blas() itself).
#pragma once

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace fusedopt::bench {

class GemmFloor {
 public:
  /// The floor of `steps` rounds on each matrix of `matrices` (rows, cols).
  GemmFloor(const std::vector<std::pair<std::int64_t, std::int64_t>>& matrices, int steps)
      : steps_(steps) {
    load();
    for (const auto& [rows, cols] : matrices) {
      const auto m = static_cast<int>(std::min(rows, cols));
      const auto n = static_cast<int>(std::max(rows, cols));
      ++count_[{m, n}];
      flops_ += 2.0 * steps * (2.0 * m * m * n + static_cast<double>(m) * m * m);
    }
    for (const auto& [shape, count] : count_) {
      const auto [m, n] = shape;
      Buffers b;
      // |x| ~ 1/sqrt(n), as after the normalization: no overflow, no denormals.
      const float v = 1.0f / static_cast<float>(n);
      b.x.assign(static_cast<std::size_t>(m) * n, v);
      b.next.assign(b.x.size(), v);
      b.gram.assign(static_cast<std::size_t>(m) * m, v);
      b.poly.assign(b.gram.size(), v);
      buffers_.emplace(shape, std::move(b));
    }
  }

  /// Seconds of the iteration's GEMMs over every matrix: each shape's three GEMMs timed
  /// `runs` times in a row, the best, times its matrices and rounds.
  double seconds(int runs = 2) {
    double total = 0;
    for (auto& [shape, b] : buffers_) {
      const auto [m, n] = shape;
      double best = 1e30;
      for (int r = 0; r < runs; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        // the calls of newton_schulz.cpp's iterate(), coefficients as torch.optim.Muon's
        if (ssyrk_ != nullptr) {  // as the stage: X X^T by ssyrk where the BLAS has it
          ssyrk_(kRowMajor, kUpper, kNoTrans, m, n, 1.0f, b.x.data(), n, 0.0f, b.gram.data(), m);
        } else {
          sgemm_(kRowMajor, kNoTrans, kTrans, m, m, n, 1.0f, b.x.data(), n, b.x.data(), n, 0.0f,
                 b.gram.data(), m);
        }
        sgemm_(kRowMajor, kNoTrans, kNoTrans, m, m, m, 2.0315f, b.gram.data(), m, b.gram.data(), m,
               -4.7750f, b.poly.data(), m);
        sgemm_(kRowMajor, kNoTrans, kNoTrans, m, n, m, 1.0f, b.poly.data(), m, b.x.data(), n,
               3.4445f, b.next.data(), n);
        best = std::min(
            best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        // keep the values bounded run after run
        std::fill(b.gram.begin(), b.gram.end(), 1.0f / static_cast<float>(n));
        std::fill(b.poly.begin(), b.poly.end(), 1.0f / static_cast<float>(n));
        std::fill(b.next.begin(), b.next.end(), 1.0f / static_cast<float>(n));
      }
      total += best * count_.at(shape) * steps_;
    }
    return total;
  }

  double flops() const { return flops_; }  ///< the iteration's, every matrix and round
  const std::string& library() const { return library_; }
  /// OpenBLAS's thread count (openblas_get_num_threads), 0 for another BLAS.
  int threads() const { return threads_; }
  /// Whether the library was in the process before the floor opened it (fusedopt's own).
  bool shared_with_fusedopt() const { return already_loaded_; }

 private:
  static constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112, kUpper = 121;
  using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int,
                         float, float*, int);

  void load() {
    std::vector<std::string> names;
    if (const char* env = std::getenv("FUSEDOPT_BLAS_LIBRARY"); env != nullptr && *env != '\0') {
      names.push_back(env);
    } else {
      names = {"libopenblas.so.0", "libcblas.so.3", "libblas.so.3"};
    }
    for (const std::string& name : names) {
      void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
      already_loaded_ = handle != nullptr;
      if (handle == nullptr) handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) continue;
      void* sym = dlsym(handle, "cblas_sgemm");
      if (sym == nullptr) continue;  // the handle stays open: fusedopt's may be the same
      sgemm_ = reinterpret_cast<Sgemm>(sym);
      ssyrk_ = reinterpret_cast<Ssyrk>(dlsym(handle, "cblas_ssyrk"));
      library_ = name;
      if (void* t = dlsym(handle, "openblas_get_num_threads")) {
        threads_ = reinterpret_cast<int (*)()>(t)();
      }
      if (void* c = dlsym(handle, "openblas_get_corename")) {
        library_ += std::string(" (") + reinterpret_cast<const char* (*)()>(c)() + " kernels)";
      }
      return;
    }
    throw std::runtime_error("the GEMM floor found no BLAS with cblas_sgemm");
  }

  struct Buffers {
    std::vector<float> x, gram, poly, next;
  };
  int steps_;
  double flops_ = 0;
  std::map<std::pair<int, int>, std::int64_t> count_;
  std::map<std::pair<int, int>, Buffers> buffers_;
  using Ssyrk = void (*)(int, int, int, int, int, float, const float*, int, float, float*, int);
  Sgemm sgemm_ = nullptr;
  Ssyrk ssyrk_ = nullptr;
  std::string library_;
  int threads_ = 0;
  bool already_loaded_ = false;
};

}  // namespace fusedopt::bench
