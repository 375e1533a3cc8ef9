// choose_cuda_target and ptx_fallback: see device_target.hpp.
#include "compile/device_target.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "fusedopt/error.hpp"

namespace fusedopt::runtime {
namespace {

int driver_major(const CudaVersions& v) { return v.driver / 1000; }
int driver_minor(const CudaVersions& v) { return (v.driver % 1000) / 10; }

/// The driver can JIT PTX from this NVRTC: it is at least as new.
bool driver_runs_ptx(const CudaVersions& v) {
  return driver_major(v) > v.nvrtc_major ||
         (driver_major(v) == v.nvrtc_major && driver_minor(v) >= v.nvrtc_minor);
}

/// The newest architecture NVRTC supports at or below `sm`, or 0.
int newest_at_or_below(int sm, const CudaVersions& v) {
  int best = 0;
  for (int a : v.nvrtc_archs) {
    if (a <= sm) best = std::max(best, a);
  }
  return best;
}

[[noreturn]] void too_old_driver(const CudaVersions& v, const std::string& more) {
  throw UnavailableError(fmt::format(
      "the CUDA driver cannot load what NVRTC compiles ({}){}: install a driver for CUDA "
      "{}.{} or newer, or point FUSEDOPT_NVRTC_LIBRARY at an NVRTC no newer than the driver",
      v.describe(), more, v.nvrtc_major, v.nvrtc_minor));
}

}  // namespace

std::string CudaVersions::describe() const {
  return fmt::format("driver CUDA {}.{}, NVRTC {}.{}", driver / 1000, (driver % 1000) / 10,
                     nvrtc_major, nvrtc_minor);
}

Target choose_cuda_target(int sm, const CudaVersions& v) {
  if (driver_major(v) < v.nvrtc_major) too_old_driver(v, "");
  if (std::find(v.nvrtc_archs.begin(), v.nvrtc_archs.end(), sm) != v.nvrtc_archs.end()) {
    return Target::cuda(sm);
  }
  const int below = newest_at_or_below(sm, v);
  if (below == 0) {
    const int oldest =
        v.nvrtc_archs.empty() ? 0 : *std::min_element(v.nvrtc_archs.begin(), v.nvrtc_archs.end());
    throw UnavailableError(fmt::format(
        "NVRTC {}.{} cannot compile for this GPU (sm_{}): its oldest architecture is sm_{}; "
        "point FUSEDOPT_NVRTC_LIBRARY at an older NVRTC",
        v.nvrtc_major, v.nvrtc_minor, sm, oldest));
  }
  if (!driver_runs_ptx(v)) {
    too_old_driver(v,
                   fmt::format(" for a GPU (sm_{}) newer than NVRTC knows, which needs PTX", sm));
  }
  return Target::cuda_ptx(below);
}

Target ptx_fallback(int sm, const CudaVersions& v, const std::string& load_error) {
  if (!driver_runs_ptx(v)) too_old_driver(v, "; loading the CUBIN failed: " + load_error);
  const int below = newest_at_or_below(sm, v);
  if (below == 0) {
    throw UnavailableError(
        fmt::format("loading the CUBIN for sm_{} failed ({}) and NVRTC has no "
                    "architecture to make PTX for: {}",
                    sm, v.describe(), load_error));
  }
  return Target::cuda_ptx(below);
}

}  // namespace fusedopt::runtime
