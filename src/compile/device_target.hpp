// Which CUDA binary a device can load: a CUBIN for its own architecture when NVRTC knows
// it, PTX for the driver to finish when the device is newer than NVRTC, and a clear error
// when the driver is too old for anything NVRTC makes. Pure (no driver calls), so the rules
// are tested without a GPU; load_kernel (kernel_loader.cpp) applies them.
#pragma once

#include <string>
#include <vector>

#include "fusedopt/target.hpp"

namespace fusedopt::runtime {

/// The versions that decide what loads.
struct CudaVersions {
  int driver = 0;       ///< cuDriverGetVersion: 1000 * major + 10 * minor (12040: 12.4)
  int nvrtc_major = 0;  ///< nvrtcVersion
  int nvrtc_minor = 0;
  std::vector<int> nvrtc_archs;  ///< nvrtcGetSupportedArchs (e.g. 75, 80, ..., 120)
  std::string describe() const;  ///< "driver CUDA 12.4, NVRTC 13.0"
};

/// What to compile for a device of compute capability `sm` (90 for 9.0):
/// - the driver's CUDA major version is older than NVRTC's: nothing NVRTC makes can load
///   (CUBINs are compatible within a major version, PTX needs a driver at least as new):
///   UnavailableError naming both versions;
/// - NVRTC supports sm_<sm>: a CUBIN for it;
/// - the device is newer than every architecture NVRTC knows: PTX for the newest one below
///   it (compute_XX), which needs a driver at least as new as NVRTC, else UnavailableError;
/// - the device is older than every architecture NVRTC supports: UnavailableError.
Target choose_cuda_target(int sm, const CudaVersions& v);

/// After a CUBIN for sm_<sm> failed to load (`load_error`): PTX for the driver to compile
/// (compute_<sm>, or the newest NVRTC knows below it) when the driver is at least as new as
/// NVRTC, else UnavailableError naming both versions and the load error.
Target ptx_fallback(int sm, const CudaVersions& v, const std::string& load_error);

}  // namespace fusedopt::runtime
