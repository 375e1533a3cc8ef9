// The public CUDA helpers of fusedopt/cuda.hpp, on top of runtime/cuda_driver.
#include <cstdint>

#include "fusedopt/cuda.hpp"
#include "fusedopt/error.hpp"
#include "runtime/cuda_driver.hpp"

namespace fusedopt {

namespace cu = runtime::cuda;

bool cuda_device_available(std::string* why) { return cu::cuda_device_available(why); }

void cuda_synchronize(void* stream) { cu::synchronize(stream); }

struct CudaBuffer::Impl {
  // Declared first so that it is released last, after the memory.
  cu::PrimaryContext context;
  cu::DeviceBuffer buffer;
  Impl(std::size_t bytes, int device) : context(device), buffer(bytes) {}
};

CudaBuffer::CudaBuffer(std::size_t bytes, int device)
    : impl_(std::make_unique<Impl>(bytes, device)) {}

CudaBuffer::~CudaBuffer() {
  if (!impl_) return;
  try {
    // cuMemFree needs the buffer's context current; put the caller's back afterwards.
    cu::ContextScope scope(impl_->context);
    impl_->buffer = cu::DeviceBuffer();
  } catch (const Error&) {
    // A destructor cannot report it; the context release below still runs.
  }
}

CudaBuffer::CudaBuffer(CudaBuffer&&) noexcept = default;
CudaBuffer& CudaBuffer::operator=(CudaBuffer&&) noexcept = default;

void* CudaBuffer::data() const {
  return reinterpret_cast<void*>(static_cast<std::uintptr_t>(impl_->buffer.get()));
}

std::size_t CudaBuffer::size() const { return impl_->buffer.size(); }

int CudaBuffer::device() const { return impl_->context.device(); }

void CudaBuffer::copy_from_host(const void* src, std::size_t bytes) {
  if (bytes > size()) throw Error("CudaBuffer::copy_from_host: more bytes than the buffer holds");
  cu::ContextScope scope(impl_->context);
  cu::copy_to_device(impl_->buffer.get(), src, bytes);
}

void CudaBuffer::copy_to_host(void* dst, std::size_t bytes) const {
  if (bytes > size()) throw Error("CudaBuffer::copy_to_host: more bytes than the buffer holds");
  cu::ContextScope scope(impl_->context);
  cu::copy_to_host(dst, impl_->buffer.get(), bytes);
}

}  // namespace fusedopt
