// A compiled kernel loaded on one device: its entry points, each launched over a launch
// table (abi.h's fo_launch, whose pointers are memory of the device) and ordered on a
// stream. One class per device: HostModule (a dlopen'ed shared object, run on the calling
// thread and its OpenMP team) and CudaModule (a CUBIN or PTX image in the device's primary
// context, one grid per entry). Everything above this (the tables, the step) is the same
// for both: runtime::Binding.
#pragma once

#include <memory>
#include <string>

#include "abi.h"
#include "fusedopt/target.hpp"
#include "kernel_layout.hpp"

namespace fusedopt::runtime {

/// A compiled kernel as a device loads it: the binary (a shared object for the host, a
/// CUBIN, PTX or emulator image for CUDA), the target it was compiled for, and what a loaded
/// kernel keeps (its key, origin and layout).
struct KernelImage {
  Target target;
  std::shared_ptr<const std::string> binary;
  KernelInfo info;
};

class Module {
 public:
  explicit Module(KernelInfo info) : info_(std::move(info)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  /// Its cache key, where the binary came from and how long it took, and its layout (what
  /// codegen said about it: schedule, slots, roles).
  const KernelInfo& info() const { return info_; }
  const KernelLayout& layout() const { return info_.layout; }

  /// The update pass over every chunk of `L` (nothing when it has none).
  virtual void step(const fo_launch& L, void* stream) = 0;
  /// Every state's initial value (and the master copy from the param).
  virtual void init(const fo_launch& L, void* stream) = 0;
  /// Reduction pass `pass`: every chunk's partials.
  virtual void reduce(int pass, const fo_launch& L, void* stream) = 0;
  /// Pass `pass`'s partials into the per-tensor and global totals (L.global_accumulate).
  virtual void finalize(int pass, const fo_launch& L, void* stream) = 0;
  /// Every tensor's scalar, row and column states: initial values (`init`) or the step's.
  virtual void scalars(bool init, const fo_launch& L, void* stream) = 0;
  /// Sets the double at `flag` (device memory) to 1 when a gradient of `L`, unscaled, is not
  /// finite; leaves it otherwise.
  virtual void check(const fo_launch& L, double* flag, void* stream) = 0;
  /// The double at `steps_taken` grows by one unless `skip` is non-null and non-zero there.
  virtual void advance_step(double* steps_taken, const double* skip, void* stream) = 0;
  /// A GradScaler's update (abi.h's fo_update_scale) from the verdict at `found`.
  virtual void update_scale(fo_scaler* scaler, const double* found, float growth, float backoff,
                            int interval, void* stream) = 0;
  /// Whether advance_step is a launch of its own (CUDA) or done in place (the host).
  virtual bool counts_by_launch() const = 0;

 private:
  KernelInfo info_;
};

}  // namespace fusedopt::runtime
