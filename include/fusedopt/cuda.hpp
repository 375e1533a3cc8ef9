// Device memory and synchronisation for programs with no CUDA runtime of their own (the
// examples, quick experiments) and for fusedopt's own libraries (the comm module, which sees
// the core only through this API): thin wrappers over the CUDA driver fusedopt loads anyway.
// Frameworks that own their memory (PyTorch, JAX) hand their pointers to Tensor instead.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "fusedopt/export.hpp"

namespace fusedopt {

/// True when the CUDA driver loads and there is at least one device; otherwise false with
/// the reason in `*why` (never throws; always false in a build without CUDA).
FUSEDOPT_API bool cuda_device_available(std::string* why = nullptr);

/// True when the CUDA driver fusedopt loaded is its CPU emulator (libfusedopt-cuda-emu.so,
/// through FUSEDOPT_CUDA_DRIVER_LIBRARY), which runs kernels correctly but says nothing about
/// speed. Never throws; false where there is no CUDA device.
FUSEDOPT_API bool cuda_device_emulated();

/// Waits for the work queued on `stream` (a CUstream; nullptr: the default stream) of the
/// calling thread's current context. Throws CudaError.
FUSEDOPT_API void cuda_synchronize(void* stream = nullptr);

/// Copies `bytes` bytes of device memory of `device` at `src` to host memory at `dst`, after
/// every launch queued on the device (any stream); complete on return. Throws CudaError.
FUSEDOPT_API void cuda_copy_to_host(void* dst, const void* src, std::size_t bytes, int device = 0);
/// Copies `bytes` bytes of host memory at `src` to device memory of `device` at `dst`, after
/// every launch queued on the device; complete (visible to any stream) on return.
FUSEDOPT_API void cuda_copy_to_device(void* dst, const void* src, std::size_t bytes,
                                      int device = 0);

/// Device memory (cuMemAlloc) on one device. It retains the device's primary context for
/// its lifetime and makes it current on the calling thread when created. Throws CudaError,
/// or Error in a build without CUDA.
class FUSEDOPT_API CudaBuffer {
 public:
  explicit CudaBuffer(std::size_t bytes, int device = 0);
  ~CudaBuffer();
  CudaBuffer(CudaBuffer&&) noexcept;
  CudaBuffer& operator=(CudaBuffer&&) noexcept;

  /// The device address, for Tensor::data.
  void* data() const;
  std::size_t size() const;
  int device() const;
  /// Synchronous copies of the first `bytes` bytes (on the default stream).
  void copy_from_host(const void* src, std::size_t bytes);
  void copy_to_host(void* dst, std::size_t bytes) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// An event (cuEventCreate with CU_EVENT_DISABLE_TIMING) in the primary context of one
/// device, which it retains for its lifetime: it tells when the work queued on a stream
/// before record() is done, without waiting for it. Every call leaves the calling thread's
/// current context as it was. Throws CudaError, or UnavailableError where this build or
/// machine has no CUDA device.
class FUSEDOPT_API CudaEvent {
 public:
  explicit CudaEvent(int device = 0);
  ~CudaEvent();
  CudaEvent(CudaEvent&&) noexcept;
  CudaEvent& operator=(CudaEvent&&) noexcept;

  /// Records the event after the work queued so far on `stream` (a CUstream of this
  /// device; nullptr: the device's legacy default stream).
  void record(void* stream = nullptr);
  /// True when the recorded work is complete (or nothing was recorded yet), false while it
  /// is not; throws CudaError when the device reports an error.
  bool query() const;
  /// Waits until the recorded work is complete.
  void synchronize() const;
  int device() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Makes the primary context of `device` current on the calling thread for the scope (so
/// libraries that work on the current device, such as NCCL or the CUDA runtime, use that
/// device) and puts the thread's previous context back at its end. Throws CudaError, or
/// UnavailableError where this build or machine has no such device.
class FUSEDOPT_API CudaDeviceScope {
 public:
  explicit CudaDeviceScope(int device = 0);
  ~CudaDeviceScope();
  CudaDeviceScope(const CudaDeviceScope&) = delete;
  CudaDeviceScope& operator=(const CudaDeviceScope&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fusedopt
