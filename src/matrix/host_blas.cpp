// host_blas (host_blas.hpp): the first BLAS library that loads and has cblas_sgemm.
#include "matrix/host_blas.hpp"

#include <dlfcn.h>
#include <fmt/format.h>
#include <strings.h>

#include <cstdlib>
#include <vector>

#include "fusedopt/error.hpp"

namespace fusedopt::matrix {

namespace {

/// The OpenBLAS core to name for this CPU where OpenBLAS took it for a Prescott (SSE3), or
/// null: SkylakeX's kernels on a CPU with AVX-512 (F, BW, VL, DQ), Haswell's with AVX2 and FMA.
const char* core_for_this_cpu() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return nullptr;
}

/// dlopen(name), and where that is OpenBLAS loaded here for the first time, without
/// OPENBLAS_CORETYPE, on a CPU it does not know: OpenBLAS 0.3.21 (Debian 12) takes a Sapphire
/// or Emerald Rapids for a Prescott and runs SSE3 kernels, its sgemm 5x slower than with
/// SkylakeX's (20 against 110 GFLOP/s on the project's 2-core Xeon VM). Then it is closed and
/// opened again with OPENBLAS_CORETYPE naming the core its kernels fit (read by OpenBLAS as
/// it loads; unset again after), if closing unloaded it; else the first stays.
void* open_blas(const std::string& name) {
  void* resident = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (resident != nullptr) return resident;  // loaded by someone else: as it is
  void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr || std::getenv("OPENBLAS_CORETYPE") != nullptr) return handle;
  auto corename = reinterpret_cast<const char* (*)()>(dlsym(handle, "openblas_get_corename"));
  const char* core = core_for_this_cpu();
  if (corename == nullptr || core == nullptr || strcasecmp(corename(), "prescott") != 0) {
    return handle;
  }
  dlclose(handle);
  if (void* still = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) return still;
  setenv("OPENBLAS_CORETYPE", core, 0);
  handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  unsetenv("OPENBLAS_CORETYPE");
  return handle;
}

HostBlas load() {
  std::vector<std::string> names;
  if (const char* env = std::getenv("FUSEDOPT_BLAS_LIBRARY"); env != nullptr && *env != '\0') {
    names.push_back(env);
  } else {
    names = {"libopenblas.so.0", "libcblas.so.3", "libblas.so.3"};
  }
  std::string tried;
  for (const std::string& name : names) {
    void* handle = open_blas(name);
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
    blas.ssyrk = reinterpret_cast<decltype(blas.ssyrk)>(dlsym(handle, "cblas_ssyrk"));
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
