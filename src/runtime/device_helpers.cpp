// The public CUDA helpers of fusedopt/cuda.hpp, on the backend seam: a build without CUDA
// answers through make_backend, which says how to get it.
#include "fusedopt/cuda.hpp"
#include "fusedopt/error.hpp"
#include "runtime/backend.hpp"

namespace fusedopt {

bool cuda_device_available(std::string* why) {
  return runtime::backend_available(Device::cuda(0), why);
}

void cuda_synchronize(void* stream) { runtime::make_backend(Device::cuda(0))->synchronize(stream); }

struct CudaBuffer::Impl {
  std::unique_ptr<runtime::Backend> backend;  // declared first: outlives the memory
  runtime::Buffer buffer;
};

CudaBuffer::CudaBuffer(std::size_t bytes, int device) : impl_(std::make_unique<Impl>()) {
  impl_->backend = runtime::make_backend(Device::cuda(device));
  impl_->buffer = impl_->backend->allocate(bytes);
}

CudaBuffer::~CudaBuffer() = default;
CudaBuffer::CudaBuffer(CudaBuffer&&) noexcept = default;
CudaBuffer& CudaBuffer::operator=(CudaBuffer&&) noexcept = default;

void* CudaBuffer::data() const { return impl_->buffer.data(); }

std::size_t CudaBuffer::size() const { return impl_->buffer.size(); }

int CudaBuffer::device() const { return impl_->backend->device().index; }

void CudaBuffer::copy_from_host(const void* src, std::size_t bytes) {
  if (bytes > size()) {
    throw UsageError("CudaBuffer::copy_from_host: more bytes than the buffer holds");
  }
  impl_->backend->copy_from_host(impl_->buffer.data(), src, bytes);
}

void CudaBuffer::copy_to_host(void* dst, std::size_t bytes) const {
  if (bytes > size())
    throw UsageError("CudaBuffer::copy_to_host: more bytes than the buffer holds");
  impl_->backend->copy_to_host(dst, impl_->buffer.data(), bytes);
}

}  // namespace fusedopt
