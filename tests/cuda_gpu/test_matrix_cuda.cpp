// Matrix stages on a CUDA device: muon's params and momentum on the device match the host
// optimizer's over 20 steps (square, tall, wide, same-shape and conv-shaped params), in fp32
// and in bf16. Runs on a GPU and on fusedopt's CUDA emulator.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "common/device_model.hpp"
#include "common/requirements.hpp"
#include "device/cuda_driver.hpp"
#include "fusedopt/optimizer.hpp"

namespace fusedopt::testing {

using namespace fusedopt;
namespace cu = fusedopt::runtime::cuda;

TEST_SUITE("cuda_gpu") {
  TEST_CASE("muon on the device matches the host: square, tall, wide, a batch, a conv" *
            testing::needs_cuda_device()) {
    cu::PrimaryContext ctx(0);
    const std::vector<std::vector<std::int64_t>> shapes = {
        {24, 24}, {40, 16}, {24, 24}, {12, 44}, {8, 3, 3, 3}};
    std::vector<std::int64_t> sizes;
    for (const auto& s : shapes) {
      std::int64_t n = 1;
      for (std::int64_t d : s) n *= d;
      sizes.push_back(n);
    }
    for (DType precision : {DType::F32, DType::BF16}) {
      CAPTURE(to_string(precision));
      std::mt19937 rng(std::random_device{}());
      std::normal_distribution<float> normal(0.0f, 1.0f);
      DeviceModel m = make_model(rng, sizes);
      ParamGroup dg = m.device_group(), hg = m.host_group();
      for (ParamGroup* g : {&dg, &hg}) {
        for (std::size_t i = 0; i < shapes.size(); ++i) g->params[i].shape = shapes[i];
        g->hypers = {{"lr", 0.02}};
      }
      OptimizerOptions options;
      options.matrix_precision = precision;
      Optimizer gpu(Rule::preset("muon"), {dg}, options);
      Optimizer cpu(Rule::preset("muon"), {hg}, options);
      for (int t = 0; t < 20; ++t) {
        m.fresh_grads([&] { return normal(rng); });
        gpu.step();
        cpu.step();
      }
      cu::synchronize(nullptr);
      m.require_params_match_host();
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        CAPTURE(i);
        const Tensor d = gpu.state("buf", static_cast<int>(i));
        const Tensor h = cpu.state("buf", static_cast<int>(i));
        REQUIRE(d.numel == h.numel);
        std::vector<float> got(static_cast<std::size_t>(d.numel));
        cu::copy_to_host(got.data(), reinterpret_cast<std::uintptr_t>(d.data), d.numel * 4);
        for (std::int64_t k = 0; k < d.numel; ++k) {
          const float want = static_cast<const float*>(h.data)[k];
          REQUIRE(std::fabs(got[k] - want) <= 1e-5f * (1 + std::fabs(want)));
        }
      }
    }
  }
}

}  // namespace fusedopt::testing
