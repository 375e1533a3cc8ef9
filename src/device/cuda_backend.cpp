// The CUDA Backend: memory of one device (cuMemAlloc in its primary context), kernels from
// NVRTC loaded into that context (CudaModule), launched on the caller's stream. Every call
// makes the context current and then restores the caller's.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <mutex>

#include "device/backend.hpp"
#include "device/cuda_blas.hpp"
#include "device/cuda_driver.hpp"
#include "device/cuda_module.hpp"
#include "fusedopt/error.hpp"
#include "support/check.hpp"

namespace fusedopt::runtime {
namespace {

using cuda::DevicePtr;

DevicePtr dev(const void* p) { return static_cast<DevicePtr>(reinterpret_cast<std::uintptr_t>(p)); }
void* host_view(DevicePtr p) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)); }

/// Refuses host memory and memory of another device in `plan`'s pointer table: the kernel
/// would fault (an unrecoverable context error).
void check_device_pointers(int device, const PointerTable& table) {
  for (std::int64_t t = 0; t < table.tensors; ++t) {
    for (int r = 0; r < table.roles; ++r) {
      const auto p = reinterpret_cast<std::uintptr_t>(
          table.ptrs[static_cast<std::size_t>(t * table.stride + r)]);
      if (p == 0) continue;  // an empty tensor (Plan::build refused null pointers otherwise)
      // Formatted only for an error: rebind checks every pointer of every step that moves.
      const auto who = [&] {
        const auto ti = static_cast<std::size_t>(t);
        return ti < table.tensor_names.size()
                   ? fmt::format("{}, role {}", table.tensor_names[ti],
                                 table.role_names.at(static_cast<std::size_t>(r)))
                   : fmt::format("tensor {} role {}", t, r);
      };
      unsigned int memory_type = 0;
      CUresult res = cuda::driver().PointerGetAttribute(
          &memory_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, static_cast<CUdeviceptr>(p));
      if (res != CUDA_SUCCESS) {
        throw UsageError(fmt::format(
            "cuda:{}: {} (0x{:x}) is not memory the CUDA driver knows (cuPointerGetAttribute "
            "failed with {})",
            device, who(), p, static_cast<int>(res)));
      }
      // Pinned host memory is known to the driver too, and a pointer of another device
      // would fault the same way: only device (or managed) memory of this device.
      FUSEDOPT_CHECK_USAGE(
          !(memory_type != CU_MEMORYTYPE_DEVICE && memory_type != CU_MEMORYTYPE_UNIFIED),
          "cuda:{}: {} (0x{:x}) is host memory, not device memory", device, who(), p);
      int ordinal = -1;
      if (cuda::driver().PointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                             static_cast<CUdeviceptr>(p)) == CUDA_SUCCESS &&
          memory_type == CU_MEMORYTYPE_DEVICE && ordinal != device) {
        throw UsageError(
            fmt::format("cuda:{}: {} (0x{:x}) is memory of cuda:{}", device, who(), p, ordinal));
      }
    }
  }
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : context_(make_context(device)) {}

  ~CudaBackend() override {
    try {
      cuda::ContextScope scope(*context_);
      cuda::context_synchronize();
      if (handle_ != nullptr) cuda::cublas().destroy(handle_);
      stage_work_ = Buffer();
      owned_.clear();  // cuMemFree with the context current
    } catch (const Error&) {
      // A destructor must not throw; the memory goes with the context.
    }
  }

  Device device() const override { return Device::cuda(context_->device()); }

  Buffer allocate(std::size_t bytes) override {
    cuda::ContextScope scope(*context_);
    // cuMemAlloc returns 256-byte aligned memory; zeroed so unused padding is defined, by
    // 4-byte words: the allocation is whole words, so the memset stays inside it.
    cuda::DeviceBuffer b(std::max<std::size_t>((bytes + 3) / 4 * 4, 256));
    cuda::memset32_async(b.get(), 0, b.size() / 4, nullptr);
    cuda::synchronize(nullptr);
    const DevicePtr p = b.get();
    const std::lock_guard<std::mutex> hold(owned_lock_);
    owned_.push_back(std::move(b));
    return Buffer(this, host_view(p), bytes);
  }

  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override {
    cuda::ContextScope scope(*context_);
    cuda::context_synchronize();
    cuda::copy_to_host(host_dst, dev(src), bytes);
  }

  void copy_from_host(void* dst, const void* host_src, std::size_t bytes) override {
    cuda::ContextScope scope(*context_);
    cuda::context_synchronize();
    cuda::copy_to_device(dev(dst), host_src, bytes);
    // A copy from pageable memory can return before it lands.
    cuda::context_synchronize();
  }

  void fill(void* dst, unsigned char value, std::size_t bytes, void* stream) override {
    cuda::ContextScope scope(*context_);
    cuda::memset8_async(dev(dst), value, bytes, stream);
  }

  void copy_on_device(void* dst, const void* src, std::size_t bytes, void* stream) override {
    cuda::ContextScope scope(*context_);
    cuda::copy_on_device_async(dev(dst), dev(src), bytes, stream);
  }

  void synchronize() override {
    cuda::ContextScope scope(*context_);
    cuda::context_synchronize();
  }

  void synchronize(void* stream) override {
    cuda::ContextScope scope(*context_);
    cuda::synchronize(stream);
  }

  void copy_from_host_async(void* dst, const void* host_src, std::size_t bytes,
                            void* stream) override {
    cuda::ContextScope scope(*context_);
    // From pageable memory: the driver stages the bytes before returning.
    cuda::copy_to_device_async(dev(dst), host_src, bytes, stream);
  }

  bool capturing(void* stream) const override {
    cuda::ContextScope scope(*context_);
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    FUSEDOPT_CU_CHECK(StreamIsCapturing, static_cast<CUstream>(stream), &capture);
    return capture != CU_STREAM_CAPTURE_STATUS_NONE;
  }

  DeviceImageKind image_kind() const override {
    DeviceImageKind k;
    if (cuda::driver_is_emulator()) {
      k.kind = DeviceImageKind::Kind::CudaEmulator;
      return k;
    }
    k.kind = DeviceImageKind::Kind::Cuda;
    k.sm = cuda::device_sm(context_->device());
    // Asked each time (not the value cached at cuInit): cheap, and exact if it ever changes.
    if (cuda::driver().DriverGetVersion(&k.driver_version) != CUDA_SUCCESS) k.driver_version = 0;
    return k;
  }
  std::unique_ptr<Module> load(KernelImage image, std::string* refusal) override {
    cuda::SavedCurrentContext saved;
    return load_cuda_module(*context_, std::move(image), refusal);
  }
  std::int64_t chunk_elems() const override { return kCudaChunk; }
  std::size_t scratch_align() const override { return 256; }

  /// fp32 on cuBLAS (bf16: the host's BLAS through a copy, for now). The memory holds the
  /// row-major matrix X (rows x cols), which cuBLAS reads as its transpose Y (cols x rows,
  /// column-major): a wide X iterates A = Y^T Y, Y' = a Y + Y B; a tall one (iterated as
  /// X^T, the smaller Gram side) A = Y Y^T, Y' = a Y + B Y. No transposes either way.
  void orthogonalize(const std::vector<float*>& matrices, std::int64_t rows, std::int64_t cols,
                     const matrix::NewtonSchulz& ns, void* stream) override {
    if (ns.bf16 || matrices.empty()) {
      Backend::orthogonalize(matrices, rows, cols, ns, stream);
      return;
    }
    matrix::check(ns);
    FUSEDOPT_CHECK_USAGE(rows <= (1 << 30) && cols <= (1 << 30) && rows * cols <= (1LL << 31) - 1,
                         "orthogonalize: a {} x {} matrix is larger than cuBLAS indexes", rows,
                         cols);
    cuda::ContextScope scope(*context_);
    const std::lock_guard<std::mutex> hold(stage_lock_);
    const cuda::Cublas& blas = cuda::cublas();
    if (handle_ == nullptr) cuda::check_cublas(blas.create(&handle_), "cublasCreate");
    cuda::check_cublas(blas.set_stream(handle_, stream), "cublasSetStream");
    cuda::check_cublas(blas.set_pointer_mode(handle_, cuda::kCublasPointerModeHost),
                       "cublasSetPointerMode");
    const bool tall = rows > cols;
    const int m = static_cast<int>(tall ? cols : rows);  // the Gram matrix's side
    const int r = static_cast<int>(rows), c = static_cast<int>(cols);
    const std::size_t mn = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
    const std::size_t mm = static_cast<std::size_t>(m) * static_cast<std::size_t>(m);
    const std::size_t need = (2 * mm + mn) * sizeof(float);
    if (stage_work_.size() < need) stage_work_ = allocate(need);
    float* gram = static_cast<float*>(stage_work_.data());
    float* poly = gram + mm;
    float* next = poly + mm;
    const float one = 1.0f, zero = 0.0f;
    for (float* x : matrices) {
      float norm = 0;
      cuda::check_cublas(blas.snrm2(handle_, static_cast<int>(mn), x, 1, &norm), "cublasSnrm2");
      const float scale = 1.0f / std::max(norm, ns.eps);
      cuda::check_cublas(blas.sscal(handle_, static_cast<int>(mn), &scale, x, 1), "cublasSscal");
      for (int s = 0; s < ns.steps; ++s) {
        const std::array<float, 3>& k = ns.coefficients[ns.coefficients.size() == 1 ? 0 : s];
        // A = Y^T Y (wide) or Y Y^T (tall); Y is c x r with leading dimension c.
        if (tall) {
          cuda::check_cublas(blas.sgemm(handle_, cuda::kCublasOpN, cuda::kCublasOpT, m, m, r, &one,
                                        x, c, x, c, &zero, gram, m),
                             "cublasSgemm");
        } else {
          cuda::check_cublas(blas.sgemm(handle_, cuda::kCublasOpT, cuda::kCublasOpN, m, m, c, &one,
                                        x, c, x, c, &zero, gram, m),
                             "cublasSgemm");
        }
        // B = b A + c A A (symmetric)
        copy_on_device(poly, gram, mm * sizeof(float), stream);
        cuda::check_cublas(blas.sgemm(handle_, cuda::kCublasOpN, cuda::kCublasOpN, m, m, m, &k[2],
                                      gram, m, gram, m, &k[1], poly, m),
                           "cublasSgemm");
        // Y' = a Y + Y B (wide) or a Y + B Y (tall)
        copy_on_device(next, x, mn * sizeof(float), stream);
        if (tall) {
          cuda::check_cublas(blas.sgemm(handle_, cuda::kCublasOpN, cuda::kCublasOpN, c, r, c, &one,
                                        poly, m, x, c, &k[0], next, c),
                             "cublasSgemm");
        } else {
          cuda::check_cublas(blas.sgemm(handle_, cuda::kCublasOpN, cuda::kCublasOpN, c, r, r, &one,
                                        x, c, poly, m, &k[0], next, c),
                             "cublasSgemm");
        }
        copy_on_device(x, next, mn * sizeof(float), stream);
      }
    }
  }
  void check_pointers(const PointerTable& table) const override {
    cuda::ContextScope scope(*context_);
    check_device_pointers(context_->device(), table);
  }

 protected:
  void release(void* data, std::size_t) noexcept override {
    try {
      cuda::ContextScope scope(*context_);
      const std::lock_guard<std::mutex> hold(owned_lock_);
      for (auto it = owned_.begin(); it != owned_.end(); ++it) {
        if (it->get() == dev(data)) {
          owned_.erase(it);
          return;
        }
      }
    } catch (const Error&) {
      // The context could not be made current: the memory goes with the context.
    }
  }

 private:
  static std::unique_ptr<cuda::PrimaryContext> make_context(int device) {
    // PrimaryContext makes the device's context current: put the caller's back.
    cuda::SavedCurrentContext saved;
    return std::make_unique<cuda::PrimaryContext>(device);
  }

  std::unique_ptr<cuda::PrimaryContext> context_;  // outlives every buffer below
  // One backend may serve several threads (process_backend): its list of allocations is
  // guarded.
  std::mutex owned_lock_;
  std::vector<cuda::DeviceBuffer> owned_;
  // The matrix stages' cuBLAS handle and workspace (grown on demand), one stage at a time.
  std::mutex stage_lock_;
  void* handle_ = nullptr;
  Buffer stage_work_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device) {
  std::string why;
  FUSEDOPT_CHECK_AVAILABLE(cuda::cuda_device_available(&why), "no CUDA device can be used: {}",
                           why);
  const int count = cuda::device_count();
  FUSEDOPT_CHECK_AVAILABLE(!(device < 0 || device >= count),
                           "there is no cuda:{}: this machine has {} CUDA device{}", device, count,
                           count == 1 ? "" : "s");
  return std::make_unique<CudaBackend>(device);
}

bool cuda_backend_available(std::string* why) { return cuda::cuda_device_available(why); }

}  // namespace fusedopt::runtime
