// cublas() (cuda_blas.hpp).
#include "device/cuda_blas.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#include "fusedopt/error.hpp"

namespace fusedopt::runtime::cuda {
namespace {

template <typename F>
bool bind(void* handle, const char* name, F& out) {
  out = reinterpret_cast<F>(dlsym(handle, name));
  return out != nullptr;
}

Cublas load(std::string* tried) {
  std::vector<std::string> names;
  if (const char* env = std::getenv("FUSEDOPT_CUBLAS_LIBRARY"); env && *env) {
    names.push_back(env);
  } else {
    for (const char* n : {"libcublas.so.13", "libcublas.so.12", "libcublas.so"}) {
      names.push_back(n);
      names.push_back(std::string("/usr/local/cuda/lib64/") + n);
    }
  }
  for (const std::string& name : names) {
    void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      *tried += fmt::format("\n  {}: {}", name, dlerror());
      continue;
    }
    Cublas c;
    c.library = name;
    if (bind(h, "cublasCreate_v2", c.create) && bind(h, "cublasDestroy_v2", c.destroy) &&
        bind(h, "cublasSetStream_v2", c.set_stream) &&
        bind(h, "cublasSetPointerMode_v2", c.set_pointer_mode) &&
        bind(h, "cublasSgemm_v2", c.sgemm) && bind(h, "cublasSnrm2_v2", c.snrm2) &&
        bind(h, "cublasSscal_v2", c.sscal)) {
      return c;
    }
    *tried += fmt::format("\n  {}: lacks the cuBLAS v2 entry points", name);
    dlclose(h);
  }
  return {};
}

}  // namespace

const Cublas& cublas() {
  static std::string tried;
  static const Cublas c = load(&tried);
  if (c.sgemm == nullptr) {
    throw UnavailableError(fmt::format(
        "a matrix stage on a CUDA device needs cuBLAS, and none loaded (tried:{}); install "
        "the CUDA toolkit's cuBLAS (/usr/local/cuda/lib64) or set FUSEDOPT_CUBLAS_LIBRARY",
        tried));
  }
  return c;
}

void check_cublas(int status, const char* what) {
  if (status != 0) {
    throw CudaError(what, status, fmt::format("cuBLAS status {}", status), "a matrix stage");
  }
}

}  // namespace fusedopt::runtime::cuda
