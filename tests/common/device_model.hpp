// Params and grads on a CUDA device mirrored by host copies, so that a CUDA Optimizer and
// the host Optimizer can step the same data and be compared (the cuda_gpu suite's tests).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "device/cuda_driver.hpp"
#include "fusedopt/optimizer.hpp"

namespace fusedopt::testing {

namespace cu = fusedopt::runtime::cuda;

/// Params and grads on the device, mirrored by host copies.
struct DeviceModel {
  using ParamGroup = fusedopt::ParamGroup;
  using DType = fusedopt::DType;
  using Device = fusedopt::Device;
  std::vector<std::int64_t> sizes;
  std::vector<std::vector<float>> hp, hg;
  std::vector<cu::DeviceBuffer> dp, dg;
  ParamGroup device_group() {
    ParamGroup g;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      g.params.push_back({reinterpret_cast<void*>(static_cast<std::uintptr_t>(dp[i].get())),
                          sizes[i], DType::F32, Device::cuda(0), "p" + std::to_string(i)});
      g.grads.push_back({reinterpret_cast<void*>(static_cast<std::uintptr_t>(dg[i].get())),
                         sizes[i], DType::F32, Device::cuda(0), "g" + std::to_string(i)});
    }
    return g;
  }
  ParamGroup host_group() {
    ParamGroup g;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      g.params.push_back(
          {hp[i].data(), sizes[i], DType::F32, Device::host(), "p" + std::to_string(i)});
      g.grads.push_back(
          {hg[i].data(), sizes[i], DType::F32, Device::host(), "g" + std::to_string(i)});
    }
    return g;
  }
  /// Copies the host grads to the device. From pageable memory a synchronous copy returns
  /// before its bytes land, and a non-blocking stream does not wait for the legacy stream:
  /// the legacy stream is synchronised, so any stream's next launch reads these grads.
  void upload_grads() {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i]) cu::copy_to_device(dg[i].get(), hg[i].data(), sizes[i] * 4);
    }
    cu::synchronize(nullptr);
  }
  /// Fills every host grad from `draw()` (a distribution over the test's generator) and
  /// uploads them: the fresh gradients of one step.
  template <typename Draw>
  void fresh_grads(Draw&& draw) {
    for (auto& g : hg) {
      for (auto& x : g) x = draw();
    }
    upload_grads();
  }
  std::vector<float> download_param(std::size_t i) const {
    std::vector<float> out(sizes[i]);
    if (sizes[i]) cu::copy_to_host(out.data(), dp[i].get(), sizes[i] * 4);
    return out;
  }
  /// Every device param within 1e-5 relative of its host copy: both fp32 against the same
  /// formulation, where GPU and host libm (and reduction orders) differ by ulps per step.
  void require_params_match_host() const {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const std::vector<float> got = download_param(i);
      for (std::int64_t k = 0; k < sizes[i]; ++k) {
        CAPTURE(i);
        CAPTURE(k);
        REQUIRE(std::fabs(got[k] - hp[i][k]) <= 1e-5f * (1 + std::fabs(hp[i][k])));
      }
    }
  }
};

/// The suite's usual sizes (empty and odd ones among them), or `sizes`, normal(0, 1) params.
inline DeviceModel make_model(std::mt19937& rng,
                              std::vector<std::int64_t> sizes = {1, 7, 1000, 65537, 0, 3}) {
  DeviceModel m;
  m.sizes = std::move(sizes);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::int64_t n : m.sizes) {
    m.hp.emplace_back(n);
    m.hg.emplace_back(n);
    for (auto& x : m.hp.back()) x = normal(rng);
    m.dp.emplace_back(std::max<std::int64_t>(n, 1) * 4);
    m.dg.emplace_back(std::max<std::int64_t>(n, 1) * 4);
    if (n) cu::copy_to_device(m.dp.back().get(), m.hp.back().data(), n * 4);
  }
  cu::synchronize(nullptr);  // landed before any stream's launch (see upload_grads)
  return m;
}

}  // namespace fusedopt::testing
