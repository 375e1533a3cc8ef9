// host_blas (host_blas.hpp): the first BLAS library that loads and has cblas_sgemm.
#include "matrix/host_blas.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <vector>

#include "fusedopt/error.hpp"

namespace fusedopt::matrix {

namespace {

HostBlas load() {
  std::vector<std::string> names;
  if (const char* env = std::getenv("FUSEDOPT_BLAS_LIBRARY"); env != nullptr && *env != '\0') {
    names.push_back(env);
  } else {
    names = {"libopenblas.so.0", "libcblas.so.3", "libblas.so.3"};
  }
  std::string tried;
  for (const std::string& name : names) {
    void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      tried += fmt::format("\n  {}: {}", name, why ? why : "cannot be loaded");
      continue;
    }
    void* sym = dlsym(handle, "cblas_sgemm");
    if (sym == nullptr) {
      tried += fmt::format("\n  {}: has no cblas_sgemm", name);
      dlclose(handle);
      continue;
    }
    HostBlas blas;  // the handle stays open for the process's life
    blas.sgemm = reinterpret_cast<decltype(blas.sgemm)>(sym);
    blas.library = name;
    return blas;
  }
  throw UnavailableError(fmt::format(
      "no BLAS with cblas_sgemm could be loaded for the matrix stage's GEMMs; tried:{}\n"
      "install one (Debian: apt-get install libopenblas0) or name it in "
      "FUSEDOPT_BLAS_LIBRARY",
      tried));
}

}  // namespace

const HostBlas& host_blas() {
  static const HostBlas blas = load();  // a failed load throws again at the next call
  return blas;
}

}  // namespace fusedopt::matrix
