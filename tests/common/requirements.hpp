// What the NVRTC and GPU test cases need, probed once per process through the library
// itself: `TEST_CASE("..." * needs_nvrtc())`, `TEST_CASE("..." * needs_cuda_device())`.
// Only a real absence skips (NVRTC that cannot be loaded, a build without CUDA, no usable
// device); any other probe failure leaves the case to run and fail with the real error.
#pragma once

#include <exception>
#include <string>

#include "common/skip.hpp"
#include "compile/compiler.hpp"
#include "fusedopt/cuda.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/target.hpp"

namespace fusedopt::testing {

inline const Availability& nvrtc_availability() {
  static const Availability a = [] {
    Availability out;
    try {
      (void)jit::compiler_for(Target::cuda(90)).identity();
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.find("NVRTC could not be loaded") != std::string::npos ||
          what.find("built without CUDA") != std::string::npos) {
        out.present = false;
        out.why = "NVRTC is not installed: " + what;
      }
    } catch (const std::exception&) {
      // Not an absence: the case runs and reports the error.
    }
    return out;
  }();
  return a;
}

inline const Availability& cuda_device_availability() {
  static const Availability a = [] {
    Availability out;
    std::string why;
    // The public probe: it links in builds without CUDA too (saying how to get it).
    if (!fusedopt::cuda_device_available(&why)) {
      out.present = false;
      out.why = "no CUDA device: " + why;
    } else if (!fusedopt::cuda_device_emulated() && !nvrtc_availability().present) {
      // The CUDA emulator's kernels come from the host compiler: no NVRTC needed.
      out = nvrtc_availability();
    }
    return out;
  }();
  return a;
}

/// Decorator for a case that compiles with NVRTC (no GPU needed).
inline Requires needs_nvrtc() { return Requires(nvrtc_availability()); }
/// Decorator for a case that runs on a CUDA device (and so also needs NVRTC, unless the
/// device is fusedopt's CUDA emulator).
inline Requires needs_cuda_device() { return Requires(cuda_device_availability()); }

/// Decorator for a case about what happens without a usable CUDA device: a present one, real
/// or emulated, skips it, saying so.
inline Requires needs_no_cuda_device() {
  static const Availability a = [] {
    Availability out;
    if (fusedopt::cuda_device_available()) {
      out.present = false;
      out.why = "this machine has a CUDA device; the case checks what happens without one";
    }
    return out;
  }();
  return Requires(a);
}

/// Decorator for a case that needs fusedopt's CUDA emulator as the device (what only it
/// reports: the access pattern of a launch). A real GPU skips it, saying so.
inline Requires needs_cuda_emulator() {
  static const Availability a = [] {
    Availability out = cuda_device_availability();
    if (out.present && !fusedopt::cuda_device_emulated()) {
      out.present = false;
      out.why = "the device is a real GPU: the access report is the CUDA emulator's";
    }
    return out;
  }();
  return Requires(a);
}

}  // namespace fusedopt::testing
