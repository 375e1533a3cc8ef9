// The seam between the Optimizer (and, next, the comm module) and a device. A Backend is
// one device, host or CUDA: memory (allocate, free, copy to and from the host, fill,
// synchronise) and loaded kernels (load() of a compiled binary -> Module, module.hpp). It
// knows no compiler and no rule: kernel_loader.hpp compiles for the target the backend's
// image_kind() asks for, and the backend loads what it is given. Everything else, the
// tables of a plan and the step's launches over them, is the same code for every device
// (runtime::Binding, the step program). Nothing above this seam knows which device it runs
// on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device/module.hpp"
#include "fusedopt/dtype.hpp"
#include "fusedopt/optimizer.hpp"
#include "kernel_layout.hpp"
#include "matrix/newton_schulz.hpp"

namespace fusedopt::runtime {

class Backend;

/// Memory a Backend allocated: freed through it when the Buffer goes (the Backend must
/// outlive its Buffers). Host or device addresses, as the Backend's device says.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend* owner, void* data, std::size_t bytes)
      : owner_(owner), data_(data), bytes_(bytes) {}
  ~Buffer() { reset(); }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  std::byte* bytes_data() const { return static_cast<std::byte*>(data_); }
  std::size_t size() const { return bytes_; }
  void reset();

 private:
  Backend* owner_ = nullptr;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

/// The pointers a device's kernels will read and write, for Backend::check_pointers:
/// ptrs[t * stride + r] is role r of tensor t (null: an empty tensor), for the first `roles`
/// roles; errors name tensor t by tensor_names[t] (else its index) and role r by
/// role_names[r].
struct PointerTable {
  const std::vector<void*>& ptrs;
  std::int64_t tensors = 0;
  int stride = 0;
  int roles = 0;
  const std::vector<std::string>& tensor_names;
  const std::vector<std::string>& role_names;
};

/// What binary a device loads: a shared object for the host CPU, an emulator image for
/// fusedopt's CUDA emulator, or for a GPU a CUBIN or PTX its driver takes (the compile side
/// chooses which from its compute capability, the driver's version and NVRTC's).
struct DeviceImageKind {
  enum class Kind { Host, Cuda, CudaEmulator };
  Kind kind = Kind::Host;
  int sm = 0;              ///< Cuda: the compute capability, e.g. 90
  int driver_version = 0;  ///< Cuda: cuDriverGetVersion's (0 when it did not answer)
};

/// "host", "cuda:0": how errors and logs name a device.
std::string device_name(const Device& device);

/// One device: its memory and its kernels. Every call makes the device current for its
/// duration and leaves the caller's current device (CUDA context) as it was.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  /// "host", "cuda:0".
  std::string name() const;

  /// `bytes` of zeroed memory, aligned to at least 256 bytes. Throws Error when there is
  /// not enough.
  virtual Buffer allocate(std::size_t bytes) = 0;
  /// Synchronous copies between this device's memory and host memory; they wait for every
  /// launch queued on the device first, so they see (and are seen by) completed steps.
  virtual void copy_to_host(void* host_dst, const void* src, std::size_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* host_src, std::size_t bytes) = 0;
  /// Sets `bytes` bytes at `dst` to `value`, ordered on `stream`.
  virtual void fill(void* dst, unsigned char value, std::size_t bytes, void* stream) = 0;
  /// Copies `bytes` bytes between two places of this device's memory, ordered on `stream`.
  virtual void copy_on_device(void* dst, const void* src, std::size_t bytes, void* stream) = 0;
  /// Waits for every launch and copy queued on the device, on every stream.
  virtual void synchronize() = 0;
  /// Waits for the work queued on `stream` (nullptr: the device's default stream).
  virtual void synchronize(void* stream) = 0;
  /// `p` (memory of this device) as the host can read it in place, or null when it must be
  /// copied with copy_to_host.
  virtual const void* host_address(const void* p) const { return nullptr; }

  /// Copies `bytes` from host memory to this device's memory, ordered on `stream` after the
  /// work queued there, without waiting; `host_src` may be reused on return.
  virtual void copy_from_host_async(void* dst, const void* host_src, std::size_t bytes,
                                    void* stream) = 0;
  /// Whether `stream` is being captured into a CUDA graph (a copy from host memory then
  /// would read that memory when the graph replays).
  virtual bool capturing(void* stream) const {
    (void)stream;
    return false;
  }

  /// What binary this device loads, for the compile side to choose a target by.
  virtual DeviceImageKind image_kind() const = 0;
  /// `image` loaded on this device (its binary was compiled for image.target). Null when the
  /// driver refuses a CUBIN it could take as PTX (`*refusal` says why: the caller may compile
  /// PTX instead); throws (CudaError, Error) when it cannot load it otherwise.
  virtual std::unique_ptr<Module> load(KernelImage image, std::string* refusal) = 0;
  /// Elements per chunk of a plan for this device's kernels.
  virtual std::int64_t chunk_elems() const = 0;
  /// The fewest rows of a matrix one chunk of a factored rule covers (at least 1).
  virtual std::int64_t factored_min_rows() const { return 1; }
  /// Alignment of the Store strategy's scratch views, in bytes.
  virtual std::size_t scratch_align() const = 0;
  /// Refuses (UsageError) pointers this device's kernels cannot use (CUDA: host memory,
  /// another device's), naming the tensor and role.
  virtual void check_pointers(const PointerTable& table) const { (void)table; }

  /// A matrix stage: each of `matrices` (row-major fp32 rows x cols, this device's memory)
  /// replaced by its Newton-Schulz iteration (matrix/newton_schulz.hpp), ordered on
  /// `stream`. This one runs the host's BLAS: in place where the host reads the memory,
  /// else on a host copy (waiting for `stream`).
  virtual void orthogonalize(const std::vector<float*>& matrices, std::int64_t rows,
                             std::int64_t cols, const matrix::NewtonSchulz& ns, void* stream);

 protected:
  friend class Buffer;
  virtual void release(void* data, std::size_t bytes) noexcept = 0;
};

/// The backend of `device`. Throws UnavailableError when this build or machine cannot
/// serve it (fusedopt built without CUDA, no driver, no such device), saying why and how
/// to get it.
std::unique_ptr<Backend> make_backend(const Device& device);

/// The process's one backend of `device`, made on first use (make_backend's errors) and
/// kept for the life of the process: for helpers that need a device's memory calls and no
/// optimizer (fusedopt/cuda.hpp). Thread-safe.
Backend& process_backend(const Device& device);

/// Whether make_backend(device) can work here; `why` says why not.
bool backend_available(const Device& device, std::string* why = nullptr);

}  // namespace fusedopt::runtime
