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

void Backend::orthogonalize(const std::vector<float*>& matrices, std::int64_t rows,
                            std::int64_t cols, const matrix::NewtonSchulz& ns, void* stream) {
  const std::size_t bytes =
      static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols) * sizeof(float);
  std::vector<float> copy;
  for (float* m : matrices) {
    if (host_address(m) != nullptr) {
      matrix::orthogonalize(const_cast<float*>(static_cast<const float*>(host_address(m))), 1, rows,
                            cols, ns);
      continue;
    }
    synchronize(stream);
    copy.resize(bytes / sizeof(float));
    copy_to_host(copy.data(), m, bytes);
    matrix::orthogonalize(copy.data(), 1, rows, cols, ns);
    copy_from_host(m, copy.data(), bytes);
  }
}

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
