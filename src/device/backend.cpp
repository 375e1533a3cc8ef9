// Buffers and the one backend factory: the host always, CUDA where this build has it.
#include "device/backend.hpp"

#include <fmt/format.h>

#include <map>
#include <mutex>
#include <utility>

#include "fusedopt/error.hpp"

namespace fusedopt::runtime {

std::unique_ptr<Backend> make_host_backend();  // host_backend.cpp
#if FUSEDOPT_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(int device);  // cuda_backend.cpp
bool cuda_backend_available(std::string* why);
#endif

namespace {

constexpr const char* kNoCuda =
    "this fusedopt was built without CUDA: install the CUDA toolkit (headers at "
    "/usr/local/cuda/include, or CUDA_HOME) and reconfigure with -DFUSEDOPT_CUDA=ON";

}  // namespace

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    owner_ = o.owner_;
    data_ = o.data_;
    bytes_ = o.bytes_;
    o.owner_ = nullptr;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void Buffer::reset() {
  if (owner_ && data_) owner_->release(data_, bytes_);
  owner_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

std::string device_name(const Device& d) {
  return d.kind == Device::Kind::Host ? std::string("host") : fmt::format("cuda:{}", d.index);
}

std::string Backend::name() const { return device_name(device()); }

std::unique_ptr<Backend> make_backend(const Device& device) {
  if (device.kind == Device::Kind::Host) return make_host_backend();
#if FUSEDOPT_HAVE_CUDA
  return make_cuda_backend(device.index);
#else
  (void)device;
  throw UnavailableError(kNoCuda);
#endif
}

Backend& process_backend(const Device& device) {
  // Never destroyed: a backend outliving main() must not call into a driver that static
  // destruction may already have unloaded; the memory goes with the process.
  static std::mutex lock;
  static auto* backends = new std::map<std::pair<int, int>, std::unique_ptr<Backend>>();
  const std::lock_guard<std::mutex> hold(lock);
  std::unique_ptr<Backend>& b = (*backends)[{static_cast<int>(device.kind), device.index}];
  if (!b) b = make_backend(device);
  return *b;
}

bool backend_available(const Device& device, std::string* why) {
  if (device.kind == Device::Kind::Host) return true;
#if FUSEDOPT_HAVE_CUDA
  return cuda_backend_available(why);
#else
  if (why) *why = kNoCuda;
  return false;
#endif
}

}  // namespace fusedopt::runtime
