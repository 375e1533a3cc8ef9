// The public CUDA helpers of fusedopt/cuda.hpp, on the backend seam (memory) and on the
// driver (events, context scopes): a build without CUDA answers through make_backend, which
// says how to get it.
#include "device/backend.hpp"
#include "fusedopt/cuda.hpp"
#include "fusedopt/error.hpp"
#include "support/check.hpp"

#if FUSEDOPT_HAVE_CUDA
#include "device/cuda_driver.hpp"
#endif

namespace fusedopt {

namespace {

#if FUSEDOPT_HAVE_CUDA
/// The retained primary context of `device`, with the calling thread's current context
/// left as it was. UnavailableError, as CudaBuffer says it, when there is no such device.
std::unique_ptr<runtime::cuda::PrimaryContext> retain_primary_context(int device) {
  std::string why;
  FUSEDOPT_CHECK_AVAILABLE(runtime::cuda::cuda_device_available(&why),
                           "no CUDA device can be used: {}", why);
  // PrimaryContext makes the context current: put the caller's back.
  runtime::cuda::SavedCurrentContext saved;
  return std::make_unique<runtime::cuda::PrimaryContext>(device);
}
#else
/// A build without CUDA: make_backend's UnavailableError, which says how to get CUDA.
[[noreturn]] void no_cuda(int device) {
  (void)runtime::make_backend(Device::cuda(device));
  throw InternalError("make_backend made a CUDA backend in a build without CUDA");
}
#endif

}  // namespace

bool cuda_device_available(std::string* why) {
  return runtime::backend_available(Device::cuda(0), why);
}

bool cuda_device_emulated() {
#if FUSEDOPT_HAVE_CUDA
  try {
    return cuda_device_available() && runtime::cuda::driver_is_emulator();
  } catch (const Error&) {
    return false;
  }
#else
  return false;
#endif
}

void cuda_synchronize(void* stream) {
  runtime::process_backend(Device::cuda(0)).synchronize(stream);
}

void cuda_copy_to_host(void* dst, const void* src, std::size_t bytes, int device) {
  runtime::process_backend(Device::cuda(device)).copy_to_host(dst, src, bytes);
}

void cuda_copy_to_device(void* dst, const void* src, std::size_t bytes, int device) {
  runtime::process_backend(Device::cuda(device)).copy_from_host(dst, src, bytes);
}

struct CudaBuffer::Impl {
  runtime::Backend* backend = nullptr;  // the process's: outlives the memory
  runtime::Buffer buffer;
};

CudaBuffer::CudaBuffer(std::size_t bytes, int device) : impl_(std::make_unique<Impl>()) {
  impl_->backend = &runtime::process_backend(Device::cuda(device));
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

// ---- CudaEvent ----------------------------------------------------------------------------

struct CudaEvent::Impl {
  int device = 0;
#if FUSEDOPT_HAVE_CUDA
  std::unique_ptr<runtime::cuda::PrimaryContext> context;  // declared first: outlives the event
  runtime::cuda::Event event = nullptr;

  ~Impl() {
    if (!event) return;
    try {
      runtime::cuda::ContextScope scope(*context);
      runtime::cuda::event_destroy(event);
    } catch (const Error&) {
      // A destructor must not throw; the event goes with the context.
    }
  }
#endif
};

CudaEvent::CudaEvent(int device) : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
#if FUSEDOPT_HAVE_CUDA
  impl_->context = retain_primary_context(device);
  runtime::cuda::ContextScope scope(*impl_->context);
  impl_->event = runtime::cuda::event_create();
#else
  no_cuda(device);
#endif
}

CudaEvent::~CudaEvent() = default;
CudaEvent::CudaEvent(CudaEvent&&) noexcept = default;
CudaEvent& CudaEvent::operator=(CudaEvent&&) noexcept = default;

void CudaEvent::record(void* stream) {
  FUSEDOPT_CHECK_USAGE(impl_ != nullptr, "CudaEvent::record: the event was moved from");
#if FUSEDOPT_HAVE_CUDA
  // In the event's context, so that a null stream is its device's default stream.
  runtime::cuda::ContextScope scope(*impl_->context);
  runtime::cuda::event_record(impl_->event, stream);
#else
  (void)stream;
#endif
}

bool CudaEvent::query() const {
  FUSEDOPT_CHECK_USAGE(impl_ != nullptr, "CudaEvent::query: the event was moved from");
#if FUSEDOPT_HAVE_CUDA
  // cuEventQuery needs no current context: polling stays a single driver call.
  return runtime::cuda::event_query(impl_->event);
#else
  return true;
#endif
}

void CudaEvent::synchronize() const {
  FUSEDOPT_CHECK_USAGE(impl_ != nullptr, "CudaEvent::synchronize: the event was moved from");
#if FUSEDOPT_HAVE_CUDA
  runtime::cuda::event_synchronize(impl_->event);
#endif
}

int CudaEvent::device() const {
  FUSEDOPT_CHECK_USAGE(impl_ != nullptr, "CudaEvent::device: the event was moved from");
  return impl_->device;
}

// ---- CudaDeviceScope ----------------------------------------------------------------------

struct CudaDeviceScope::Impl {
#if FUSEDOPT_HAVE_CUDA
  // Destroyed in reverse: the previous context back, then the primary context released.
  std::unique_ptr<runtime::cuda::PrimaryContext> context;
  std::unique_ptr<runtime::cuda::ContextScope> scope;
#endif
};

CudaDeviceScope::CudaDeviceScope(int device) : impl_(std::make_unique<Impl>()) {
#if FUSEDOPT_HAVE_CUDA
  impl_->context = retain_primary_context(device);
  impl_->scope = std::make_unique<runtime::cuda::ContextScope>(*impl_->context);
#else
  no_cuda(device);
#endif
}

CudaDeviceScope::~CudaDeviceScope() = default;

}  // namespace fusedopt
