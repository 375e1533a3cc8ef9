// Device memory and synchronisation for programs with no CUDA runtime of their own (the
// examples, quick experiments): thin wrappers over the CUDA driver fusedopt loads anyway.
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

/// Waits for the work queued on `stream` (a CUstream; nullptr: the default stream) of the
/// calling thread's current context. Throws CudaError.
FUSEDOPT_API void cuda_synchronize(void* stream = nullptr);

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

}  // namespace fusedopt
