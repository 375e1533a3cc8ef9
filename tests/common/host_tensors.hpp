// Shared pieces of the runtime tests: a private kernel cache for the whole suite, fresh
// seeds, host tensors of any storage dtype, and the float64 references of every preset
// (from tests/common/preset_references.hpp) keyed by preset name.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/preset_references.hpp"
#include "fusedopt/optimizer.hpp"

namespace fusedopt::testing {

/// Points FUSEDOPT_CACHE_DIR at a fresh 0700 folder (removed at exit), or under CTest at the
/// build folder's kernel cache for tests (FUSEDOPT_TEST_KERNEL_CACHE), before the first
/// kernel is built: never the user's cache. Every test calls it first.
void use_private_cache();

/// A fresh seed per test, or FUSEDOPT_TEST_SEED to replay a failure.
std::uint32_t fresh_seed();

/// Host memory for one tensor of any storage dtype, `offset` elements past an aligned start
/// (to test misaligned pointers). Values are set and read as doubles (16-bit formats round
/// to nearest even, with the tests' own encoder).
class HostTensor {
 public:
  HostTensor(std::int64_t numel, fusedopt::DType dtype, std::int64_t offset = 0)
      : numel_(numel),
        dtype_(dtype),
        offset_(offset),
        storage_(static_cast<std::size_t>((numel + offset) * fusedopt::dtype_size(dtype) + 64)) {}
  void* data() { return numel_ == 0 ? nullptr : base() + offset_ * fusedopt::dtype_size(dtype_); }
  std::int64_t numel() const { return numel_; }
  fusedopt::DType dtype() const { return dtype_; }
  double get(std::int64_t i) const { return read(dtype_, ptr(i)); }
  /// Every value, as get() reads it.
  std::vector<double> values() const {
    std::vector<double> out(static_cast<std::size_t>(numel()));
    for (std::int64_t i = 0; i < numel(); ++i) out[static_cast<std::size_t>(i)] = get(i);
    return out;
  }
  void set(std::int64_t i, double x) { write(dtype_, const_cast<unsigned char*>(ptr(i)), x); }
  fusedopt::Tensor tensor(const std::string& name = "") {
    fusedopt::Tensor t;
    t.data = data();
    t.numel = numel_;
    t.dtype = dtype_;
    t.name = name;
    return t;
  }
  /// Reads element `i` of a tensor of `dtype` at `data`.
  static double read(fusedopt::DType dtype, const void* p) {
    if (dtype == fusedopt::DType::F64) {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
    if (dtype == fusedopt::DType::F32) {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    std::uint16_t bits;
    std::memcpy(&bits, p, 2);
    return decode(dtype, bits);
  }
  static void write(fusedopt::DType dtype, void* p, double x) {
    if (dtype == fusedopt::DType::F64) {
      std::memcpy(p, &x, 8);
      return;
    }
    if (dtype == fusedopt::DType::F32) {
      const auto f = static_cast<float>(x);
      std::memcpy(p, &f, 4);
      return;
    }
    const std::uint16_t bits = encode(dtype, x);
    std::memcpy(p, &bits, 2);
  }

 private:
  unsigned char* base() {
    auto addr = reinterpret_cast<std::uintptr_t>(storage_.data());
    return storage_.data() + ((64 - addr % 64) % 64);
  }
  const unsigned char* ptr(std::int64_t i) const {
    return const_cast<HostTensor*>(this)->base() + (offset_ + i) * fusedopt::dtype_size(dtype_);
  }
  std::int64_t numel_;
  fusedopt::DType dtype_;
  std::int64_t offset_;
  std::vector<unsigned char> storage_;
};

/// Element `i` of an optimizer-owned tensor view.
inline double at(const fusedopt::Tensor& t, std::int64_t i) {
  if (t.dtype == fusedopt::DType::F64) {
    // A per-tensor scalar state (one element: one value for all), or an element state of a
    // float64 param.
    double x;
    std::memcpy(&x, static_cast<const double*>(t.data) + (t.numel == 1 ? 0 : i), sizeof x);
    return x;
  }
  return HostTensor::read(
      t.dtype, static_cast<const unsigned char*>(t.data) + i * fusedopt::dtype_size(t.dtype));
}

/// A preset's float64 reference, state names (declaration order) and initial values.
struct PresetRef {
  std::string name;
  Hypers hypers;  ///< a setting that exercises the preset's options
  std::vector<std::string> states;
  std::function<std::vector<double>(const Hypers&)> init;
  std::function<RefStep(const Hypers&)> reference;
};
const std::vector<PresetRef>& preset_refs();
const PresetRef& preset_ref(const std::string& name);

/// A group's overrides for ParamGroup::hypers.
std::vector<std::pair<std::string, double>> overrides(const Hypers& h);

/// The preset tests' tolerance (tests/codegen/test_presets.cpp, allowed_error):
/// |fused - ref| <= tol * (|ref| + max |ref| of that role in that group at that step).
inline constexpr double kTol = 1e-5;

/// Runs preset `name` over tensors of `sizes` (tensor k in group group_of[k]) with the
/// groups' hypers, for `steps` steps in fp32 through Optimizer, against the float64
/// reference. Fails the test at the first bad step; returns the optimizer's stats.
fusedopt::OptimizerStats run_preset_through_optimizer(const std::string& name,
                                                      const std::vector<std::int64_t>& sizes,
                                                      const std::vector<int>& group_of,
                                                      const std::vector<Hypers>& groups, int steps,
                                                      std::int64_t misalign = 0);

/// Fills `t` with normal(0, 1) values.
inline void fill_normal(HostTensor& t, std::mt19937& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, normal(rng));
}

}  // namespace fusedopt::testing
