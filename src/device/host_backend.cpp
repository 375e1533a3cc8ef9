// The host Backend: memory from the C++ heap, kernels from the host compiler (HostModule),
// launched on the calling thread and its OpenMP team.
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

#include "device/backend.hpp"
#include "device/host_module.hpp"
#include "fusedopt/error.hpp"

namespace fusedopt::runtime {

namespace {

constexpr std::size_t kHostAlign = 256;

class HostBackend final : public Backend {
 public:
  Device device() const override { return Device::host(); }

  Buffer allocate(std::size_t bytes) override {
    const std::size_t size =
        std::max(kHostAlign, (bytes + kHostAlign - 1) / kHostAlign * kHostAlign);
    void* data = std::aligned_alloc(kHostAlign, size);
    // Out of memory: the root Error (no narrower kind fits).
    if (!data) throw Error(fmt::format("cannot allocate {} bytes of host memory", bytes));
    std::memset(data, 0, size);
    return Buffer(this, data, bytes);
  }
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override {
    if (bytes) std::memcpy(host_dst, src, bytes);
  }
  void copy_from_host(void* dst, const void* host_src, std::size_t bytes) override {
    if (bytes) std::memcpy(dst, host_src, bytes);
  }
  void fill(void* dst, unsigned char value, std::size_t bytes, void*) override {
    if (bytes) std::memset(dst, value, bytes);
  }
  void copy_on_device(void* dst, const void* src, std::size_t bytes, void*) override {
    if (bytes) std::memmove(dst, src, bytes);
  }
  void synchronize() override {}  // host launches return when they are done
  void synchronize(void*) override {}
  const void* host_address(const void* p) const override { return p; }

  void copy_from_host_async(void* dst, const void* host_src, std::size_t bytes, void*) override {
    if (bytes) std::memcpy(dst, host_src, bytes);
  }

  DeviceImageKind image_kind() const override { return {}; }
  std::unique_ptr<Module> load(KernelImage image, std::string*) override {
    return load_host_module(std::move(image));
  }
  std::int64_t chunk_elems() const override { return kHostChunkElems; }
  /// A chunk's column sums and column values cost a pass over its columns (written in the
  /// reduction pass, combined by the finalize, computed before the rows): 256 rows make
  /// that under 1% of a BERT-base chunk's elements, where 42 rows of 768 columns (the
  /// 32 K-element chunk) kept came at 0.54-0.69 of its floor and 256 at 0.79-0.82
  /// (adafactor 0.77-0.80 -> 0.85-0.86; same runs, 2-core EPYC, BERT-base).
  std::int64_t factored_min_rows() const override { return 256; }
  std::size_t scratch_align() const override { return 64; }

 protected:
  void release(void* data, std::size_t) noexcept override { std::free(data); }
};

}  // namespace

std::unique_ptr<Backend> make_host_backend() { return std::make_unique<HostBackend>(); }

}  // namespace fusedopt::runtime
