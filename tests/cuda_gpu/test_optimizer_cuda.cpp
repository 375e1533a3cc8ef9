// Optimizer on a CUDA device: the same results as the host optimizer (float64-reference
// tolerance), a skipped grad-scaled step changes nothing, checkpoints round-trip between
// devices, capturable steps equal eager ones. Skips visibly without a device.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "common/device_model.hpp"
#include "common/requirements.hpp"
#include "common/temp_dir.hpp"
#include "device/cuda_driver.hpp"
#include "fusedopt/extension.hpp"
#include "fusedopt/optimizer.hpp"

namespace fusedopt::testing {

using namespace fusedopt;
namespace cu = fusedopt::runtime::cuda;

namespace {

/// The same floats bit for bit (NaNs included). Empty vectors have no data() to compare:
/// memcmp on their null pointers is undefined even for 0 bytes.
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

}  // namespace

TEST_SUITE("cuda_gpu") {
  TEST_CASE("a CUDA optimizer matches the host optimizer over 50 AdamW steps" *
            testing::needs_cuda_device()) {
    cu::PrimaryContext ctx(0);
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    DeviceModel m = make_model(rng);
    Optimizer gpu(Rule::preset("adamw"), {m.device_group()});
    Optimizer cpu(Rule::preset("adamw"), {m.host_group()});
    // The update, then the one-thread launch that counts the step on the device.
    CHECK(gpu.stats().launches_per_step == 2);
    for (int step = 0; step < 50; ++step) {
      m.fresh_grads([&] { return normal(rng); });
      gpu.step();
      cpu.step();
    }
    cu::synchronize(nullptr);
    m.require_params_match_host();
  }

  TEST_CASE("a step_scaled with a NaN is skipped on the device, bit for bit, capturable or not" *
            testing::needs_cuda_device()) {
    cu::PrimaryContext ctx(0);
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (bool capturable : {false, true}) {
      for (const char* preset : {"adamw", "lamb"}) {  // a separate check; one on pass 0
        CAPTURE(capturable);
        CAPTURE(preset);
        DeviceModel m = make_model(rng);
        OptimizerOptions options;
        options.capturable = capturable;
        Optimizer gpu(Rule::preset(preset), {m.device_group()}, options);
        GradScaler scaler;
        m.fresh_grads([&] { return normal(rng); });
        CHECK(scaler.step(gpu));  // a finite step is taken
        CHECK(gpu.step_count() == 1);
        std::vector<std::vector<float>> before;
        for (std::size_t i = 0; i < m.sizes.size(); ++i) before.push_back(m.download_param(i));
        m.hg[3][12345] = std::nanf("");
        m.upload_grads();
        const float scale = scaler.scale();
        CHECK_FALSE(scaler.step(gpu));  // skipped on the device; the scaler backs off
        CHECK(scaler.scale() == scale * 0.5f);
        CHECK(gpu.step_count() == 1);
        // The same through step_scaled: its result read on request, after the launches.
        StepResult skipped = gpu.step_scaled(0.5f);
        CHECK_FALSE(skipped.known());
        CHECK_FALSE(skipped.taken());
        CHECK(gpu.step_count() == 1);
        for (std::size_t i = 0; i < m.sizes.size(); ++i) CHECK(m.download_param(i) == before[i]);
        m.hg[3][12345] = 0.5f;
        m.upload_grads();
        CHECK(scaler.step(gpu));
        CHECK(gpu.step_count() == 2);
      }
    }
  }

  TEST_CASE("a whole device GradScaler step captured in a CUDA graph replays as host steps" *
            testing::needs_cuda_device()) {
    cu::PrimaryContext ctx(0);
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (const char* preset : {"adamw", "lamb"}) {
      CAPTURE(preset);
      DeviceModel m = make_model(rng);
      OptimizerOptions options;
      options.capturable = true;
      Optimizer gpu(Rule::preset(preset), {m.device_group()}, options);
      Optimizer cpu(Rule::preset(preset), {m.host_group()});
      GradScaler::Options so;
      so.init_scale = 256;
      so.growth_interval = 3;
      GradScaler on_device = GradScaler::on_device(gpu, so);
      GradScaler on_host(so);
      cu::Stream s = cu::stream_create();
      cu::begin_capture(s);
      on_device.step(gpu, s);  // the check, the skip, the step and the scale update
      cu::Graph graph = cu::end_capture(s);
      cu::GraphExec exec = cu::graph_instantiate(graph);
      for (int t = 1; t <= 12; ++t) {
        CAPTURE(t);
        const float scale = static_cast<float>(on_host.scale());
        for (auto& g : m.hg) {
          for (auto& x : g) x = scale * 0.1f * normal(rng);
        }
        if (t == 4 || t == 7) m.hg[3][t * 101] = std::nanf("");
        if (t == 8) m.hg[2][5] = INFINITY;
        m.upload_grads();  // the graph's last replay finished: synchronised below
        cu::graph_launch(exec, s);
        const bool taken = on_host.step(cpu);
        cu::synchronize(s);
        CHECK(on_device.last_step_taken() == taken);
        CHECK(on_device.scale() == on_host.scale());
        CHECK(on_device.growth_tracker() == on_host.growth_tracker());
      }
      CHECK(gpu.step_count() == cpu.step_count());
      CHECK(gpu.step_count() == 9);
      m.require_params_match_host();
      cu::graph_exec_destroy(exec);
      cu::graph_destroy(graph);
      cu::stream_destroy(s);
    }
  }

  TEST_CASE("scalar states on the device: once per step in a CUDA graph replayed 10 times" *
            testing::needs_cuda_device()) {
    cu::PrimaryContext ctx(0);
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (const char* preset : {"nadam", "asgd"}) {
      CAPTURE(preset);
      DeviceModel m = make_model(rng);  // an empty tensor among them: its scalars step too
      ParamGroup dg = m.device_group(), hg = m.host_group();
      if (std::string(preset) == "asgd") {
        dg.hypers = hg.hypers = {{"t0", 3}, {"lambd", 0.5}};  // mu != 1 from step 5
      } else {
        dg.hypers = hg.hypers = {{"momentum_decay", 0.1}};
      }
      Optimizer gpu(Rule::preset(preset), {dg});
      Optimizer cpu(Rule::preset(preset), {hg});
      GradScaler::Options so;
      so.init_scale = 256;
      GradScaler on_device = GradScaler::on_device(gpu, so);
      GradScaler on_host(so);
      cu::Stream s = cu::stream_create();
      cu::begin_capture(s);
      on_device.step(gpu, s);
      cu::Graph graph = cu::end_capture(s);
      cu::GraphExec exec = cu::graph_instantiate(graph);
      for (int t = 1; t <= 10; ++t) {
        CAPTURE(t);
        const float scale = static_cast<float>(on_host.scale());
        for (auto& g : m.hg) {
          for (auto& x : g) x = scale * 0.1f * normal(rng);
        }
        if (t == 6) m.hg[2][7] = std::nanf("");  // skipped: no scalar may move
        m.upload_grads();
        cu::graph_launch(exec, s);
        CHECK(on_host.step(cpu) == (t != 6));
        cu::synchronize(s);
      }
      CHECK(gpu.step_count() == 9);
      CHECK(cpu.step_count() == 9);
      for (const std::string& name : Rule::preset(preset).scalars()) {
        for (std::size_t i = 0; i < m.sizes.size(); ++i) {
          CAPTURE(name);
          CAPTURE(i);
          const Tensor view = gpu.state(name, static_cast<int>(i));
          REQUIRE(view.dtype == DType::F64);
          double on_gpu = 0, on_cpu = 0;
          cu::copy_to_host(&on_gpu, reinterpret_cast<std::uintptr_t>(view.data), sizeof on_gpu);
          std::memcpy(&on_cpu, cpu.state(name, static_cast<int>(i)).data, sizeof on_cpu);
          // Both in double from the same hypers and step count (9 steps taken).
          CHECK(std::fabs(on_gpu - on_cpu) <= 1e-12 * std::fabs(on_cpu));
        }
      }
      m.require_params_match_host();
      cu::graph_exec_destroy(exec);
      cu::graph_destroy(graph);
      cu::stream_destroy(s);
    }
  }

  TEST_CASE("the built-in per-tensor values (numel, dims, rows, cols) on the device" *
            testing::needs_cuda_device()) {
    cu::PrimaryContext ctx(0);
    std::mt19937 rng(std::random_device{}());
    DeviceModel m = make_model(rng);
    const Rule rule = Rule::parse(R"(
param p
grad  g
state a = 0
hyper lr = 0.1
a = (numel * 10 + dims) * 100000 + rows * 10 + cols
p = p - lr * g * tensor_norm(p) / sqrt(numel)
)",
                                  "info.rule");
    ParamGroup dg = m.device_group(), hg = m.host_group();
    for (ParamGroup* g : {&dg, &hg}) {
      g->params[2].shape = {10, 100};   // 1000
      g->params[3].shape = {1, 65537};  // 65537
      g->params[5].shape = {3, 1, 1};   // 3
    }
    Optimizer gpu(rule, {dg});
    Optimizer cpu(rule, {hg});
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int t = 0; t < 3; ++t) {
      m.fresh_grads([&] { return normal(rng); });
      gpu.step();
      cpu.step();
    }
    cu::synchronize(nullptr);
    m.require_params_match_host();
    for (std::size_t i = 0; i < m.sizes.size(); ++i) {
      CAPTURE(i);
      std::vector<float> a(m.sizes[i]);
      if (m.sizes[i]) {
        cu::copy_to_host(a.data(), reinterpret_cast<std::uintptr_t>(gpu.state("a", i).data),
                         m.sizes[i] * 4);
      }
      for (std::int64_t k = 0; k < m.sizes[i]; ++k) {
        CHECK(a[k] == static_cast<const float*>(cpu.state("a", i).data)[k]);
      }
    }
  }

  TEST_CASE("adafactor's row and column states on the device match the host's" *
            testing::needs_cuda_device()) {
    cu::PrimaryContext ctx(0);
    std::mt19937 rng(std::random_device{}());
    DeviceModel m = make_model(rng);
    ParamGroup dg = m.device_group(), hg = m.host_group();
    for (ParamGroup* g : {&dg, &hg}) {
      g->params[2].shape = {10, 100};
      g->params[3].shape = {1, 65537};  // one row longer than a chunk
      g->params[5].shape = {3, 1, 1};   // a batch of three 1 x 1 matrices
      g->hypers = {{"weight_decay", 0.1}};
    }
    Optimizer gpu(Rule::preset("adafactor"), {dg});
    Optimizer cpu(Rule::preset("adafactor"), {hg});
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int t = 0; t < 5; ++t) {
      m.fresh_grads([&] { return normal(rng); });
      gpu.step();
      cpu.step();
    }
    cu::synchronize(nullptr);
    m.require_params_match_host();
    for (const char* name : {"r", "c"}) {
      for (std::size_t i = 0; i < m.sizes.size(); ++i) {
        CAPTURE(name);
        CAPTURE(i);
        const Tensor d = gpu.state(name, static_cast<int>(i));
        const Tensor h = cpu.state(name, static_cast<int>(i));
        REQUIRE(d.numel == h.numel);
        std::vector<float> got(static_cast<std::size_t>(d.numel));
        if (d.numel) {
          cu::copy_to_host(got.data(), reinterpret_cast<std::uintptr_t>(d.data), d.numel * 4);
        }
        for (std::int64_t k = 0; k < d.numel; ++k) {
          const float want = static_cast<const float*>(h.data)[k];
          CHECK(std::fabs(got[k] - want) <= 1e-5f * (1 + std::fabs(want)));
        }
      }
    }
  }

  TEST_CASE("factored rules over pieces take the staged finalize on the device" *
            testing::needs_cuda_device()) {
    // One rank holding every param as a piece of itself (Tensor::whole_shape): the column
    // and matrix sums go through the shard and the finalize's three stages (abi.h), which
    // must give what the host's whole tensors give; tests/runtime/test_pieces.cpp combines
    // several ranks' on the host.
    cu::PrimaryContext ctx(0);
    std::mt19937 rng(std::random_device{}());
    for (const char* preset : {"adafactor", "came"}) {
      CAPTURE(preset);
      DeviceModel m = make_model(rng);
      ParamGroup dg = m.device_group(), hg = m.host_group();
      for (ParamGroup* g : {&dg, &hg}) {
        g->params[2].shape = {10, 100};
        g->params[3].shape = {1, 65537};  // one row longer than a chunk
        g->params[5].shape = {3, 1, 1};   // whole matrices: no shard
      }
      for (Tensor& p : dg.params) {
        p.whole_shape = p.shape.empty() ? std::vector<std::int64_t>{p.numel} : p.shape;
      }
      Optimizer gpu(Rule::preset(preset), {dg});
      Optimizer cpu(Rule::preset(preset), {hg});
      int shard_calls = 0;  // calls with the 1-D and 2-D params' column and matrix sums
      OptimizerExtension::set_reduction_hook(
          gpu, [&](const ReductionPartials& p) { shard_calls += p.num_shard > 0 ? 1 : 0; });
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (int t = 0; t < 3; ++t) {
        m.fresh_grads([&] { return normal(rng); });
        gpu.step();
        cpu.step();
      }
      cu::synchronize(nullptr);
      CHECK(shard_calls > 0);
      m.require_params_match_host();
    }
  }

  TEST_CASE("CUDA AdamW's second moment has no offset from float64: uniforms in double" *
            testing::needs_cuda_device()) {
    // tests/runtime/test_uniform_precision.cpp on the device: 1 - beta2 computed in double
    // and rounded once (float(0.001)), not 1 - float(0.999), which left v 1.25e-5 too small.
    cu::PrimaryContext ctx(0);
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    DeviceModel m = make_model(rng);
    Optimizer gpu(Rule::preset("adamw"), {m.device_group()});
    const double b2 = 0.999;
    std::vector<std::vector<double>> v64(m.sizes.size());
    for (std::size_t i = 0; i < m.sizes.size(); ++i) v64[i].assign(m.sizes[i], 0.0);
    for (int step = 0; step < 100; ++step) {
      for (std::size_t i = 0; i < m.sizes.size(); ++i) {
        for (std::size_t k = 0; k < m.hg[i].size(); ++k) {
          const float g = normal(rng);
          m.hg[i][k] = g;
          v64[i][k] = b2 * v64[i][k] + (1 - b2) * double(g) * g;
        }
      }
      m.upload_grads();
      gpu.step();
    }
    cu::synchronize(nullptr);
    double sum = 0;
    std::int64_t n = 0;
    for (std::size_t i = 0; i < m.sizes.size(); ++i) {
      if (m.sizes[i] == 0) continue;
      std::vector<float> v(m.sizes[i]);
      const Tensor t = gpu.state("v", static_cast<int>(i));
      cu::copy_to_host(v.data(),
                       static_cast<cu::DevicePtr>(reinterpret_cast<std::uintptr_t>(t.data)),
                       v.size() * 4);
      for (std::size_t k = 0; k < v.size(); ++k, ++n) sum += (v[k] - v64[i][k]) / v64[i][k];
    }
    // What remains is beta2 * v with float(0.999), as in torch: about 7e-7 after 100 steps.
    CHECK(std::fabs(sum / static_cast<double>(n)) < 2e-6);
  }

  TEST_CASE("a CUDA grad-scaled step with a NaN changes nothing, and checkpoints round-trip" *
            testing::needs_cuda_device()) {
    cu::PrimaryContext ctx(0);
    std::mt19937 rng(std::random_device{}());
    DeviceModel m = make_model(rng);
    Optimizer gpu(Rule::preset("adamw"), {m.device_group()});
    for (auto& g : m.hg) std::fill(g.begin(), g.end(), 0.5f);
    m.upload_grads();
    gpu.step();
    cu::synchronize(nullptr);
    std::vector<float> before = m.download_param(3);
    m.hg[3][123] = NAN;
    m.upload_grads();
    CHECK_FALSE(gpu.step_scaled(0.5f));
    CHECK(gpu.step_count() == 1);
    std::vector<float> after = m.download_param(3);
    CHECK(same_bits(before, after));

    testing::TempDir dir;
    gpu.save(dir.path() / "ckpt.safetensors");
    std::vector<std::vector<float>> hp;
    for (std::size_t i = 0; i < m.sizes.size(); ++i) hp.push_back(m.download_param(i));
    m.hp = hp;
    Optimizer cpu(Rule::preset("adamw"), {m.host_group()});
    cpu.load(dir.path() / "ckpt.safetensors");  // device states load into a host optimizer
    CHECK(cpu.step_count() == 1);
  }

  TEST_CASE("capturable CUDA steps equal eager steps" * testing::needs_cuda_device()) {
    cu::PrimaryContext ctx(0);
    std::mt19937 rng(std::random_device{}());
    DeviceModel a = make_model(rng);
    std::mt19937 rng2 = rng;
    DeviceModel b = make_model(rng2);
    for (std::size_t i = 0; i < a.sizes.size(); ++i) {
      if (a.sizes[i]) cu::copy_to_device(b.dp[i].get(), a.hp[i].data(), a.sizes[i] * 4);
      b.hg[i] = a.hg[i];
    }
    OptimizerOptions capturable;
    capturable.capturable = true;
    Optimizer eager(Rule::preset("adamw"), {a.device_group()});
    Optimizer graph(Rule::preset("adamw"), {b.device_group()}, capturable);
    for (int step = 0; step < 5; ++step) {
      for (auto& g : a.hg) std::fill(g.begin(), g.end(), 0.1f * (step + 1));
      b.hg = a.hg;
      a.upload_grads();
      b.upload_grads();
      eager.step();
      graph.step();
    }
    cu::synchronize(nullptr);
    for (std::size_t i = 0; i < a.sizes.size(); ++i) {
      std::vector<float> x = a.download_param(i), y = b.download_param(i);
      CHECK(same_bits(x, y));
    }
  }
}

// Rules with reductions on the device: the same results as the host (which
// tests/runtime/test_reductions.cpp checks against float64 references), under both
// strategies, with the grad check folded into pass 0, and capturable.
TEST_SUITE("cuda_gpu") {
  TEST_CASE("CUDA LAMB, LARS and AdamW with clipping match the host over 50 steps" *
            testing::needs_cuda_device()) {
    cu::PrimaryContext ctx(0);
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    struct Case {
      const char* preset;
      OptimizerOptions options;
    };
    OptimizerOptions store, recompute, clip;
    store.reduction_strategy = ReductionStrategy::Store;
    recompute.reduction_strategy = ReductionStrategy::Recompute;
    clip.max_grad_norm = 1.0;
    const Case cases[] = {{"lamb", store}, {"lamb", recompute}, {"lars", {}}, {"adamw", clip}};
    for (const Case& c : cases) {
      INFO(c.preset << " " << static_cast<int>(c.options.reduction_strategy));
      DeviceModel m = make_model(rng);
      Optimizer gpu(Rule::preset(c.preset), {m.device_group()}, c.options);
      Optimizer cpu(Rule::preset(c.preset), {m.host_group()}, c.options);
      CHECK(gpu.stats().reduction_passes == cpu.stats().reduction_passes);
      CHECK(gpu.stats().reduction_strategy == cpu.stats().reduction_strategy);
      for (int step = 0; step < 50; ++step) {
        const float scale = step % 3 == 0 ? 0.01f : 0.2f;  // clipping on some steps only
        for (auto& g : m.hg) {
          for (auto& x : g) x = scale * normal(rng);
        }
        m.upload_grads();
        REQUIRE(gpu.step_scaled(1.0f));
        REQUIRE(cpu.step_scaled(1.0f));
      }
      cu::synchronize(nullptr);
      m.require_params_match_host();
    }
  }

  TEST_CASE(
      "CUDA LAMB: a NaN gradient skips the step bit for bit; repeated runs give the same bits" *
      testing::needs_cuda_device()) {
    cu::PrimaryContext ctx(0);
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    DeviceModel m = make_model(rng);
    const std::vector<std::vector<float>> initial = m.hp;
    std::vector<std::vector<float>> first;
    for (int run = 0; run < 2; ++run) {
      DeviceModel r = make_model(rng);
      r.hp = initial;
      for (std::size_t i = 0; i < r.sizes.size(); ++i) {
        if (r.sizes[i]) cu::copy_to_device(r.dp[i].get(), r.hp[i].data(), r.sizes[i] * 4);
      }
      Optimizer gpu(Rule::preset("lamb"), {r.device_group()});
      std::mt19937 grads(7);
      for (int step = 0; step < 10; ++step) {
        for (auto& g : r.hg) {
          for (auto& x : g) x = normal(grads);
        }
        r.upload_grads();
        gpu.step();
      }
      cu::synchronize(nullptr);
      std::vector<std::vector<float>> now;
      for (std::size_t i = 0; i < r.sizes.size(); ++i) now.push_back(r.download_param(i));
      if (run == 0) {
        first = now;
        // A NaN anywhere: nothing changes.
        r.hg[2][5] = NAN;
        r.upload_grads();
        CHECK_FALSE(gpu.step_scaled(1.0f));
        CHECK(gpu.step_count() == 10);
        for (std::size_t i = 0; i < r.sizes.size(); ++i) {
          std::vector<float> after = r.download_param(i);
          CHECK(same_bits(after, now[i]));
        }
      } else {
        for (std::size_t i = 0; i < r.sizes.size(); ++i) {
          CHECK(same_bits(first[i], now[i]));
        }
      }
    }
  }

  TEST_CASE("capturable CUDA LAMB steps equal eager ones" * testing::needs_cuda_device()) {
    cu::PrimaryContext ctx(0);
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    DeviceModel a = make_model(rng);
    DeviceModel b = make_model(rng);
    b.hp = a.hp;
    for (std::size_t i = 0; i < b.sizes.size(); ++i) {
      if (b.sizes[i]) cu::copy_to_device(b.dp[i].get(), b.hp[i].data(), b.sizes[i] * 4);
    }
    OptimizerOptions capturable;
    capturable.capturable = true;
    Optimizer eager(Rule::preset("lamb"), {a.device_group()});
    Optimizer captured(Rule::preset("lamb"), {b.device_group()}, capturable);
    for (int step = 0; step < 5; ++step) {
      for (std::size_t i = 0; i < a.sizes.size(); ++i) {
        for (auto& x : a.hg[i]) x = normal(rng);
        b.hg[i] = a.hg[i];
      }
      a.upload_grads();
      b.upload_grads();
      eager.step();
      captured.step();
    }
    cu::synchronize(nullptr);
    CHECK(captured.step_count() == 5);
    for (std::size_t i = 0; i < a.sizes.size(); ++i) {
      std::vector<float> x = a.download_param(i), y = b.download_param(i);
      CHECK(same_bits(x, y));
    }
  }
}

}  // namespace fusedopt::testing
