// Tensors held twice, in device memory and in host memory with the same bits, so a CUDA
// Optimizer and the host Optimizer can step the same data and be compared: any storage
// dtype, optionally one element past an aligned start (the CUDA kernel must then refuse its
// vector path for that tensor), values written and read as doubles (16-bit formats through
// the tests' own encoder, tests/common/preset_references.hpp, not the library's).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/close.hpp"
#include "common/preset_references.hpp"
#include "device/cuda_driver.hpp"
#include "fusedopt/optimizer.hpp"

namespace fusedopt::testing {

using fusedopt::DType;
namespace cu = fusedopt::runtime::cuda;

/// A fresh seed per case, or FUSEDOPT_TEST_SEED to replay a failure.
inline std::uint32_t fresh_seed() {
  if (const char* s = std::getenv("FUSEDOPT_TEST_SEED")) {
    return static_cast<std::uint32_t>(std::strtoul(s, nullptr, 10));
  }
  return std::random_device{}();
}

inline void* as_pointer(cu::DevicePtr p) {
  return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p));
}
inline cu::DevicePtr as_device(const void* p) {
  return static_cast<cu::DevicePtr>(reinterpret_cast<std::uintptr_t>(p));
}

/// Element `i` of `bytes` holding values of `dtype`, as a double.
inline double read_value(DType dtype, const unsigned char* bytes, std::int64_t i) {
  const unsigned char* p = bytes + i * fusedopt::dtype_size(dtype);
  if (dtype == DType::F64) {
    double d = 0;
    std::memcpy(&d, p, 8);
    return d;
  }
  if (dtype == DType::F32) {
    float f = 0;
    std::memcpy(&f, p, 4);
    return f;
  }
  std::uint16_t bits = 0;
  std::memcpy(&bits, p, 2);
  return fusedopt::testing::decode(dtype, bits);
}

/// `x` stored as `dtype` (16-bit formats rounded to nearest even) at element `i`.
inline void write_value(DType dtype, unsigned char* bytes, std::int64_t i, double x) {
  unsigned char* p = bytes + i * fusedopt::dtype_size(dtype);
  if (dtype == DType::F32) {
    const auto f = static_cast<float>(x);
    std::memcpy(p, &f, 4);
    return;
  }
  const std::uint16_t bits = fusedopt::testing::encode(dtype, x);
  std::memcpy(p, &bits, 2);
}

/// The values of an optimizer's tensor view (a state, a master, a scalar), on the device
/// when `on_device`, else in host memory. Call after the device's work (a synchronize).
inline std::vector<double> read_view(const fusedopt::Tensor& t, bool on_device) {
  const std::size_t bytes =
      static_cast<std::size_t>(t.numel) * static_cast<std::size_t>(fusedopt::dtype_size(t.dtype));
  std::vector<unsigned char> raw(bytes);
  if (bytes != 0) {
    if (on_device) {
      cu::copy_to_host(raw.data(), as_device(t.data), bytes);
    } else {
      std::memcpy(raw.data(), t.data, bytes);
    }
  }
  std::vector<double> out(static_cast<std::size_t>(t.numel));
  for (std::int64_t i = 0; i < t.numel; ++i) out[i] = read_value(t.dtype, raw.data(), i);
  return out;
}

/// One tensor in device memory and in host memory, `offset` elements past the start of
/// each allocation (device allocations are 256-byte aligned, the host one 64-byte).
/// Construct while a context of device 0 is current.
class TwinTensor {
 public:
  TwinTensor(std::int64_t numel, DType dtype, std::int64_t offset = 0)
      : numel_(numel),
        dtype_(dtype),
        offset_bytes_(static_cast<std::size_t>(offset * fusedopt::dtype_size(dtype))),
        bytes_(static_cast<std::size_t>(numel * fusedopt::dtype_size(dtype))),
        device_(std::max<std::size_t>(bytes_ + offset_bytes_, 16)),
        host_storage_(bytes_ + offset_bytes_ + 64) {}

  std::int64_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }
  void* host_data() { return numel_ == 0 ? nullptr : host_bytes(); }
  void* device_data() const {
    return numel_ == 0 ? nullptr : as_pointer(device_.get() + offset_bytes_);
  }
  fusedopt::Tensor host_tensor(const std::string& name, std::vector<std::int64_t> shape = {}) {
    return {host_data(), numel_, dtype_, fusedopt::Device::host(), name, std::move(shape)};
  }
  fusedopt::Tensor device_tensor(const std::string& name,
                                 std::vector<std::int64_t> shape = {}) const {
    return {device_data(), numel_, dtype_, fusedopt::Device::cuda(0), name, std::move(shape)};
  }

  /// Stores `values` on both sides (the same bits), the device copy on the legacy stream.
  void set(const std::vector<double>& values) {
    REQUIRE(static_cast<std::int64_t>(values.size()) == numel_);
    for (std::int64_t i = 0; i < numel_; ++i) write_value(dtype_, host_bytes(), i, values[i]);
    upload();
  }
  /// Stores `values` on the device side only, in `stream`'s order (staged from pageable
  /// memory before the call returns).
  void set_device_async(const std::vector<double>& values, cu::Stream stream) {
    REQUIRE(static_cast<std::int64_t>(values.size()) == numel_);
    std::vector<unsigned char> raw(bytes_);
    for (std::int64_t i = 0; i < numel_; ++i) write_value(dtype_, raw.data(), i, values[i]);
    if (bytes_ != 0) {
      cu::copy_to_device_async(device_.get() + offset_bytes_, raw.data(), bytes_, stream);
    }
  }
  /// Stores `values` on the host side only.
  void set_host(const std::vector<double>& values) {
    REQUIRE(static_cast<std::int64_t>(values.size()) == numel_);
    for (std::int64_t i = 0; i < numel_; ++i) write_value(dtype_, host_bytes(), i, values[i]);
  }
  /// Copies the host side to the device, then waits for the legacy stream: a synchronous
  /// copy from pageable memory may return before its bytes land, and work on a
  /// non-blocking stream is not ordered after it.
  void upload() {
    if (bytes_ == 0) return;
    cu::copy_to_device(device_.get() + offset_bytes_, host_bytes(), bytes_);
    cu::synchronize(nullptr);
  }
  std::vector<double> host_values() {
    std::vector<double> out(static_cast<std::size_t>(numel_));
    for (std::int64_t i = 0; i < numel_; ++i) out[i] = read_value(dtype_, host_bytes(), i);
    return out;
  }
  std::vector<double> device_values() const {
    std::vector<unsigned char> raw(bytes_);
    if (bytes_ != 0) cu::copy_to_host(raw.data(), device_.get() + offset_bytes_, bytes_);
    std::vector<double> out(static_cast<std::size_t>(numel_));
    for (std::int64_t i = 0; i < numel_; ++i) out[i] = read_value(dtype_, raw.data(), i);
    return out;
  }
  /// The device bytes, for bit-for-bit comparisons.
  std::vector<unsigned char> device_bits() const {
    std::vector<unsigned char> raw(bytes_);
    if (bytes_ != 0) cu::copy_to_host(raw.data(), device_.get() + offset_bytes_, bytes_);
    return raw;
  }

 private:
  unsigned char* host_bytes() {
    const auto addr = reinterpret_cast<std::uintptr_t>(host_storage_.data());
    return host_storage_.data() + (64 - addr % 64) % 64 + offset_bytes_;
  }
  std::int64_t numel_;
  DType dtype_;
  std::size_t offset_bytes_;
  std::size_t bytes_;
  cu::DeviceBuffer device_;
  std::vector<unsigned char> host_storage_;
};

/// The model the API tests step: params and grads in device and host memory, tensors of 7
/// elements (a vector group and a 3-element tail), 1000 (the vector path; a matrix), 0 (empty, in
/// the middle), 1030
/// (> 4 and not a multiple of 4: vector body and tail; a matrix) and 333 one element past
/// an aligned start (the scalar path), in two groups (the first three, the last two).
struct TwinModel {
  struct Spec {
    std::int64_t numel;
    std::vector<std::int64_t> shape;
    std::int64_t offset;
    int group;
  };
  static const std::vector<Spec>& specs() {
    static const std::vector<Spec> s = {{7, {}, 0, 0},
                                        {1000, {8, 125}, 0, 0},
                                        {0, {}, 0, 0},
                                        {1030, {10, 103}, 0, 1},
                                        {333, {}, 1, 1}};
    return s;
  }

  std::vector<TwinTensor> p, g;

  /// Random params (the same bits on both sides); grads unset.
  TwinModel(std::mt19937& rng, DType param = DType::F32, DType grad = DType::F32);
  std::size_t size() const { return p.size(); }
  /// The two param groups over the device (or host) side, with `hypers` in both.
  std::vector<fusedopt::ParamGroup> groups(
      bool device, const std::vector<std::pair<std::string, double>>& hypers = {});
  /// Fresh random gradients times `factor` on both sides (the legacy stream); returns
  /// them without the factor.
  std::vector<std::vector<double>> set_grads(std::mt19937& rng, double factor = 1.0);
  std::vector<std::vector<double>> device_params() const;
  std::vector<std::vector<double>> host_params();
};

/// `n` normal(0, sd) values, none zero (a zero would hide a missing update).
inline std::vector<double> random_values(std::mt19937& rng, std::int64_t n, double sd = 1.0) {
  std::normal_distribution<double> normal(0.0, sd);
  std::vector<double> out(static_cast<std::size_t>(n));
  for (double& x : out) {
    do {
      x = normal(rng);
    } while (std::abs(x) < 1e-3 * sd);
  }
  return out;
}

/// Every state `rule` keeps per param, as Optimizer::state() names them: the state tensors,
/// the row and column states, then the per-tensor scalars.
inline std::vector<std::string> state_names(const fusedopt::Rule& rule) {
  std::vector<std::string> out = rule.states();
  for (const auto& s : rule.row_states()) out.push_back(s);
  for (const auto& s : rule.col_states()) out.push_back(s);
  for (const auto& s : rule.scalars()) out.push_back(s);
  return out;
}

inline TwinModel::TwinModel(std::mt19937& rng, DType param, DType grad) {
  p.reserve(specs().size());
  g.reserve(specs().size());
  for (const Spec& s : specs()) {
    p.emplace_back(s.numel, param, s.offset);
    g.emplace_back(s.numel, grad, s.offset);
    p.back().set(random_values(rng, s.numel));
  }
}

inline std::vector<fusedopt::ParamGroup> TwinModel::groups(
    bool device, const std::vector<std::pair<std::string, double>>& hypers) {
  std::vector<fusedopt::ParamGroup> out(2);
  for (fusedopt::ParamGroup& gr : out) gr.hypers = hypers;
  for (std::size_t k = 0; k < p.size(); ++k) {
    const Spec& s = specs()[k];
    const std::string name = "t" + std::to_string(k);
    fusedopt::ParamGroup& gr = out[static_cast<std::size_t>(s.group)];
    gr.params.push_back(device ? p[k].device_tensor(name, s.shape)
                               : p[k].host_tensor(name, s.shape));
    gr.grads.push_back(device ? g[k].device_tensor(name + ".grad")
                              : g[k].host_tensor(name + ".grad"));
  }
  return out;
}

inline std::vector<std::vector<double>> TwinModel::set_grads(std::mt19937& rng, double factor) {
  std::vector<std::vector<double>> out;
  for (TwinTensor& t : g) {
    out.push_back(random_values(rng, t.numel()));
    std::vector<double> scaled = out.back();
    for (double& x : scaled) x *= factor;
    t.set(scaled);
  }
  return out;
}

inline std::vector<std::vector<double>> TwinModel::device_params() const {
  std::vector<std::vector<double>> out;
  for (const TwinTensor& t : p) out.push_back(t.device_values());
  return out;
}

inline std::vector<std::vector<double>> TwinModel::host_params() {
  std::vector<std::vector<double>> out;
  for (TwinTensor& t : p) out.push_back(t.host_values());
  return out;
}

}  // namespace fusedopt::testing
