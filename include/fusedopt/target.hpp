// Where a kernel runs: the host CPU, a CUDA architecture (sm_XX), or fusedopt's CUDA emulator
// ("emu": the CUDA source built by the host compiler for the emulating driver). Compiling
// needs only the target, never the device.
#pragma once

#include <string>
#include <string_view>

#include "fusedopt/export.hpp"

namespace fusedopt {

struct FUSEDOPT_API Target {
  /// Emu: the CUDA kernel source, byte for byte, compiled by the host compiler with the
  /// emulation header (templates/kernels/cuda_emu.h) into an image that fusedopt's emulating
  /// CUDA driver (libfusedopt-cuda-emu.so) loads and runs on the CPU.
  enum class Kind { Host, Cuda, Emu };
  Kind kind = Kind::Host;
  int sm = 0;                  ///< compute capability * 10 (e.g. 90) for Kind::Cuda
  bool arch_specific = false;  ///< "sm_90a": architecture-specific features
  /// "compute_90": PTX for the virtual architecture, which the driver compiles for the GPU
  /// it runs on (any GPU of that architecture or newer, with a driver as new as NVRTC).
  bool ptx = false;

  static Target host() { return Target{}; }
  static Target cuda(int sm) { return Target{Kind::Cuda, sm, false, false}; }
  static Target cuda_ptx(int sm) { return Target{Kind::Cuda, sm, false, true}; }
  static Target emu() { return Target{Kind::Emu, 0, false, false}; }
  /// CUDA source (the CUDA skeleton): a GPU architecture or the emulator.
  bool cuda_source() const { return kind != Kind::Host; }
  /// "host", "emu", "sm_80", "sm_90", "sm_90a", "compute_90", ... Throws fusedopt::Error otherwise.
  static Target parse(std::string_view text);
  std::string str() const;
  bool operator==(const Target& o) const {
    return kind == o.kind && sm == o.sm && arch_specific == o.arch_specific && ptx == o.ptx;
  }
};

}  // namespace fusedopt
