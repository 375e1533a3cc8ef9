// Block-quantized states on a CUDA device (the emulator in CI): the same codes, absmax and
// params as the host optimizer, for 8-bit and 4-bit maps and a block that is not the default.
// Host and device fp32 differ by ulps (fma contraction, libm), which may move a value across
// a midpoint between two codes: such codes are counted, and must stay rare.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/device_model.hpp"
#include "common/quant_overflow.hpp"
#include "common/requirements.hpp"
#include "device/cuda_driver.hpp"
#include "fusedopt/optimizer.hpp"

namespace fusedopt::testing {

using namespace fusedopt;

namespace {

/// A state view's bytes, from the device or the host.
std::vector<unsigned char> bytes_of(const Tensor& t, bool device) {
  std::vector<unsigned char> out(static_cast<std::size_t>(t.numel) *
                                 static_cast<std::size_t>(dtype_size(t.dtype)));
  if (out.empty()) return out;
  if (device) {
    cu::copy_to_host(out.data(), reinterpret_cast<std::uintptr_t>(t.data), out.size());
  } else {
    std::memcpy(out.data(), t.data, out.size());
  }
  return out;
}

}  // namespace

TEST_SUITE("cuda_gpu") {
  TEST_CASE("quantized states on the device match the host's: q8 and q4, 10 AdamW steps" *
            testing::needs_cuda_device()) {
    cu::PrimaryContext ctx(0);
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    struct Case {
      std::vector<std::pair<std::string, std::string>> storage;
      int block;
    };
    // "+sr": codes rounded stochastically (the same random words on both sides).
    for (const Case& c :
         {Case{{{"m", "q8s"}, {"v", "q8u"}}, 0}, Case{{{"*", "q4"}}, 0},
          Case{{{"m", "q4s"}, {"v", "q8u"}}, 64}, Case{{{"m", "q8s+sr"}, {"v", "q4u+sr"}}, 0},
          Case{{{"*", "q4+sr"}}, 64}}) {
      // 70001: a partial last block (and an odd 4-bit tail); 1000 stays fp32.
      DeviceModel m = make_model(rng, {4096, 1000, 70001, 0, 131075});
      OptimizerOptions o;
      o.state_storage = c.storage;
      o.quant_block = c.block;
      o.seed = rng();
      ParamGroup dg = m.device_group(), hg = m.host_group();
      dg.hypers = hg.hypers = {{"weight_decay", 0.1}};
      Optimizer gpu(Rule::preset("adamw"), {dg}, o);
      Optimizer cpu(Rule::preset("adamw"), {hg}, o);
      std::int64_t differ = 0, total = 0, params_differ = 0, params = 0;
      for (int t = 0; t < 10; ++t) {
        m.fresh_grads([&] { return normal(rng); });
        gpu.step();
        cpu.step();
        cu::synchronize(nullptr);
        for (std::size_t i = 0; i < m.sizes.size(); ++i) {
          for (const char* name : {"m", "v"}) {
            const Tensor d = gpu.state(name, static_cast<int>(i));
            const Tensor h = cpu.state(name, static_cast<int>(i));
            REQUIRE(d.dtype == h.dtype);
            REQUIRE(d.numel == h.numel);
            if (d.dtype != DType::U8) continue;
            const std::vector<unsigned char> dc = bytes_of(d, true), hc = bytes_of(h, false);
            for (std::size_t k = 0; k < dc.size(); ++k) differ += dc[k] != hc[k] ? 1 : 0;
            total += static_cast<std::int64_t>(dc.size());
            const std::string absmax = std::string(name) + ".absmax";
            const std::vector<unsigned char> da =
                bytes_of(gpu.state(absmax, static_cast<int>(i)), true);
            const std::vector<unsigned char> ha =
                bytes_of(cpu.state(absmax, static_cast<int>(i)), false);
            REQUIRE(da.size() == ha.size());
            for (std::size_t k = 0; k < da.size(); k += 4) {
              float x, y;
              std::memcpy(&x, &da[k], 4);
              std::memcpy(&y, &ha[k], 4);
              REQUIRE(std::fabs(x - y) <= 1e-4f * std::fabs(y));
            }
          }
          const std::vector<float> got = m.download_param(i);
          for (std::size_t k = 0; k < got.size(); ++k) {
            const float want = m.hp[i][k];
            params_differ += std::fabs(got[k] - want) > 1e-5f * (1 + std::fabs(want)) ? 1 : 0;
            REQUIRE(std::fabs(got[k] - want) <= 1e-3f * (1 + std::fabs(want)));
          }
          params += static_cast<std::int64_t>(got.size());
        }
        // Each side steps from its own states: a code moved by an ulp stays moved, and the
        // counts below bound how often that happens.
      }
      MESSAGE(c.storage.front().second, "/", c.storage.back().second, " block ", c.block, ": ",
              differ, " of ", total, " code bytes and ", params_differ, " of ", params,
              " params differ host/device");
      CHECK(differ * 1000 <= total);
      CHECK(params_differ * 1000 <= params);
    }
  }
}

TEST_SUITE("cuda_gpu") {
  TEST_CASE("came and adam_mini with quantized m on the device match the host's" *
            testing::needs_cuda_device()) {
    cu::PrimaryContext ctx(0);
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    // Matrices of odd columns (whole-row chunks on whole blocks), a batch whose matrices
    // start on blocks, one whose do not (kept unquantized), a 1-D param with a tail.
    const std::vector<std::vector<std::int64_t>> shapes = {
        {40, 53}, {4, 64, 32}, {2, 5, 300}, {1031}, {521, 263}};
    std::vector<std::int64_t> sizes;
    for (const auto& s : shapes) {
      std::int64_t n = 1;
      for (std::int64_t d : s) n *= d;
      sizes.push_back(n);
    }
    for (const char* preset : {"came", "adam_mini"}) {
      for (const char* storage : {"q8", "q4"}) {
        CAPTURE(std::string(preset));
        CAPTURE(std::string(storage));
        DeviceModel m = make_model(rng, sizes);
        const std::vector<std::vector<float>> start = m.hp;
        ParamGroup dg = m.device_group(), hg = m.host_group();
        for (ParamGroup* g : {&dg, &hg}) {
          for (std::size_t i = 0; i < shapes.size(); ++i) g->params[i].shape = shapes[i];
          g->hypers = {{"lr", 1e-2}, {"weight_decay", 0.1}};
        }
        OptimizerOptions o;
        o.state_storage = {{"m", storage}};
        o.quant_min_numel = 0;
        Optimizer gpu(Rule::preset(preset), {dg}, o);
        Optimizer cpu(Rule::preset(preset), {hg}, o);
        std::int64_t differ = 0, total = 0;
        for (int t = 0; t < 5; ++t) {
          m.fresh_grads([&] { return normal(rng); });
          gpu.step();
          cpu.step();
          cu::synchronize(nullptr);
          for (std::size_t i = 0; i < sizes.size(); ++i) {
            const Tensor d = gpu.state("m", static_cast<int>(i));
            const Tensor h = cpu.state("m", static_cast<int>(i));
            REQUIRE(d.dtype == h.dtype);
            REQUIRE(d.dtype == (i == 2 ? DType::F32 : DType::U8));
            if (d.dtype != DType::U8) continue;
            const std::vector<unsigned char> dc = bytes_of(d, true), hc = bytes_of(h, false);
            REQUIRE(dc.size() == hc.size());
            for (std::size_t k = 0; k < dc.size(); ++k) differ += dc[k] != hc[k] ? 1 : 0;
            total += static_cast<std::int64_t>(dc.size());
          }
        }
        // Each side steps from its own codes: where fp32 ulps (the row and column sums'
        // chunking differs) moved a value across a midpoint, the code stays moved and its
        // param follows a step of lr times a code's gap. In adam_mini that stays with the
        // element: such params are counted, and must stay rare. In CAME the moved m enters the
        // factored confidence, so every param of its row and column moves a little (a
        // seed-dependent run moved 207 params by more than 1e-5 after one q4 code): there the
        // device's updates must agree with the host's as a whole (relative L2 of the
        // difference, which one wrong row of 263 would push to 0.04).
        std::int64_t params_differ = 0, params = 0;
        double diff2 = 0, step2 = 0;
        for (std::size_t i = 0; i < sizes.size(); ++i) {
          const std::vector<float> got = m.download_param(i);
          for (std::size_t k = 0; k < got.size(); ++k) {
            const float want = m.hp[i][k];
            REQUIRE(std::isfinite(got[k]));
            params_differ += std::fabs(got[k] - want) > 1e-5f * (1 + std::fabs(want)) ? 1 : 0;
            diff2 += (double(got[k]) - want) * (double(got[k]) - want);
            step2 += (double(want) - start[i][k]) * (double(want) - start[i][k]);
          }
          params += static_cast<std::int64_t>(got.size());
        }
        const double relative = std::sqrt(diff2 / step2);
        MESSAGE((std::string(preset) + " " + storage + ": "), differ, " of ", total,
                " code bytes of m and ", params_differ, " of ", params,
                " params differ host/device; relative L2 of the update difference ", relative);
        CHECK(differ * 1000 <= total);
        CHECK(relative <= 1e-2);
        if (std::string(preset) == "adam_mini") CHECK(params_differ * 1000 <= params);
      }
    }
  }

  TEST_CASE("stochastic rounding and rand() on the device give the host's bits" *
            testing::needs_cuda_device()) {
    cu::PrimaryContext ctx(0);
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const Rule noisy = Rule::parse(
        "param p\ngrad g\nstate m = 0\nhyper lr = 1e-2, noise = 0.1\n"
        "d = g + noise * (rand() - 0.5)\nm = 0.9 * m + d\np = p - lr * m\n",
        "noisy.rule");
    // bf16 params and grads (a tensor larger than a chunk, odd sizes), as bits.
    const std::vector<std::int64_t> sizes = {70001, 3, 1000};
    std::vector<std::vector<std::uint16_t>> hp, hg;
    std::vector<cu::DeviceBuffer> dp, dg;
    ParamGroup host, device;
    for (std::int64_t n : sizes) {
      hp.emplace_back(static_cast<std::size_t>(n));
      hg.emplace_back(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) {
        float p = normal(rng), g = normal(rng);
        std::uint32_t u, v;
        std::memcpy(&u, &p, 4);
        std::memcpy(&v, &g, 4);
        hp.back()[static_cast<std::size_t>(i)] = static_cast<std::uint16_t>(u >> 16);
        hg.back()[static_cast<std::size_t>(i)] = static_cast<std::uint16_t>(v >> 16);
      }
      dp.emplace_back(n * 2);
      dg.emplace_back(n * 2);
      cu::copy_to_device(dp.back().get(), hp.back().data(), n * 2);
      cu::copy_to_device(dg.back().get(), hg.back().data(), n * 2);
      host.params.push_back({hp.back().data(), n, DType::BF16});
      host.grads.push_back({hg.back().data(), n, DType::BF16});
      device.params.push_back(
          {reinterpret_cast<void*>(static_cast<std::uintptr_t>(dp.back().get())), n, DType::BF16,
           Device::cuda(0)});
      device.grads.push_back({reinterpret_cast<void*>(static_cast<std::uintptr_t>(dg.back().get())),
                              n, DType::BF16, Device::cuda(0)});
    }
    cu::synchronize(nullptr);
    OptimizerOptions o;
    o.stochastic_rounding = true;
    o.seed = 12345;
    Optimizer gpu(noisy, {device}, o), cpu(noisy, {host}, o);
    for (int t = 0; t < 5; ++t) {
      gpu.step();
      cpu.step();
    }
    cu::synchronize(nullptr);
    std::int64_t differ = 0, total = 0;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      std::vector<std::uint16_t> got(static_cast<std::size_t>(sizes[k]));
      cu::copy_to_host(got.data(), dp[k].get(), sizes[k] * 2);
      for (std::size_t i = 0; i < got.size(); ++i) differ += got[i] != hp[k][i] ? 1 : 0;
      total += sizes[k];
    }
    // The same fp32 results, then the same random words: the same bits (an fp32 result an
    // ulp apart on the two sides, from their libm, may round differently: rare).
    MESSAGE(differ, " of ", total, " bf16 params differ between the device and the host");
    CHECK(differ * 10000 <= total);
  }
}

TEST_SUITE("cuda_gpu") {
  TEST_CASE("a finite gradient whose square overflows loses one element on the device too" *
            testing::needs_cuda_device()) {
    // The skeleton's own restart (cuda_quant.cuh), against the fp32 twin on the host.
    cu::PrimaryContext ctx(0);
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> normal(0.0f, 0.1f);
    for (const QuantTwin& twin : {kQuantTwins[0], kQuantTwins[2]}) {  // adamw8bit, adamw4bit
      CAPTURE(std::string(twin.quantized));
      DeviceModel m = make_model(rng, {4096});
      Optimizer gpu(Rule::preset(twin.quantized), {m.device_group()});
      Optimizer cpu(Rule::preset(twin.fp32), {m.host_group()});
      for (int t = 1; t <= kOverflowSteps; ++t) {
        for (auto& x : m.hg[0]) x = normal(rng);
        if (t == kOverflowStep) m.hg[0][kOverflowElement] = static_cast<float>(kOverflowGrad);
        m.upload_grads();
        gpu.step();
        cpu.step();
      }
      cu::synchronize(nullptr);
      const int block = fusedopt::quant_bits(gpu.states().front().quant) == 8 ? 256 : 128;
      check_overflow_like_fp32(m.download_param(0), m.hp[0], block, gpu.hyper("lr"));
    }
  }
}

}  // namespace fusedopt::testing
