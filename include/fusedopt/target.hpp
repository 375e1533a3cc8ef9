// Where a kernel runs: the host CPU or a CUDA architecture (sm_XX). Compiling needs only the
// target, never the device.
#pragma once

#include <string>
#include <string_view>

#include "fusedopt/export.hpp"

namespace fusedopt {

struct FUSEDOPT_API Target {
  enum class Kind { Host, Cuda };
  Kind kind = Kind::Host;
  int sm = 0;                  ///< compute capability * 10 (e.g. 90) for Kind::Cuda
  bool arch_specific = false;  ///< "sm_90a": architecture-specific features
  /// "compute_90": PTX for the virtual architecture, which the driver compiles for the GPU
  /// it runs on (any GPU of that architecture or newer, with a driver as new as NVRTC).
  bool ptx = false;

  static Target host() { return Target{}; }
  static Target cuda(int sm) { return Target{Kind::Cuda, sm, false, false}; }
  static Target cuda_ptx(int sm) { return Target{Kind::Cuda, sm, false, true}; }
  /// "host", "sm_80", "sm_90", "sm_90a", "compute_90", ... Throws fusedopt::Error otherwise.
  static Target parse(std::string_view text);
  std::string str() const;
  bool operator==(const Target& o) const {
    return kind == o.kind && sm == o.sm && arch_specific == o.arch_specific && ptx == o.ptx;
  }
};

}  // namespace fusedopt
