// The Optimizer API on a CUDA device, each against the host Optimizer stepping the same
// numbers (the host is held to float64 references in tests/runtime): torch's AMP protocol
// (step_amp, eager and in a captured graph with a skipped replay), rebind (grads and params
// moved to new device memory, the plan kept), set_hyper ordered on a stream (an lr schedule
// with no synchronisation), step_scaled's StepResult read back when asked, and checkpoints
// of device tensors (a device optimizer loaded from one takes the saver's next step bit for
// bit; host and device load each other's). The model (common/twin_tensors.hpp) has odd tensors, an
// empty one, a vector body with a tail and a misaligned view.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common/requirements.hpp"
#include "common/temp_dir.hpp"
#include "common/twin_tensors.hpp"
#include "fusedopt/error.hpp"

namespace fusedopt::testing {

using namespace fusedopt;

namespace {

/// Device against host, as in test_presets_cuda.cpp: the same fp32 body on the same inputs,
/// apart by FMA contraction, CUDA's libm and reduction order, a few ulps per step.
constexpr double kTol = 1e-5;

/// The device's bytes of every param, state and master of `opt` (fp32 views unless the
/// state says otherwise), for bit-for-bit comparisons.
std::vector<std::vector<unsigned char>> device_bits(const Optimizer& opt, const Rule& rule,
                                                    TwinModel& m, bool master) {
  std::vector<std::vector<unsigned char>> out;
  std::vector<std::string> names = state_names(rule);
  if (master) names.emplace_back("master");
  for (std::size_t k = 0; k < m.size(); ++k) {
    out.push_back(m.p[k].device_bits());
    for (const std::string& name : names) {
      const Tensor t = opt.state(name, static_cast<int>(k));
      std::vector<unsigned char> raw(static_cast<std::size_t>(t.numel * dtype_size(t.dtype)));
      if (!raw.empty()) cu::copy_to_host(raw.data(), as_device(t.data), raw.size());
      out.push_back(std::move(raw));
    }
  }
  return out;
}

/// Every state (and scalar, row and column state) of `gpu` within kTol of `cpu`'s.
void check_states_close(const Optimizer& gpu, const Optimizer& cpu, const Rule& rule,
                        std::size_t num_tensors) {
  for (const std::string& name : state_names(rule)) {
    std::vector<std::vector<double>> got, want;
    for (std::size_t k = 0; k < num_tensors; ++k) {
      got.push_back(read_view(gpu.state(name, static_cast<int>(k)), true));
      want.push_back(read_view(cpu.state(name, static_cast<int>(k)), false));
    }
    check_close(name, got, want, kTol);
  }
}

void* device_float(const cu::DeviceBuffer& b) { return as_pointer(b.get()); }

void set_device_float(const cu::DeviceBuffer& b, float x, cu::Stream stream) {
  cu::copy_to_device_async(b.get(), &x, sizeof x, stream);  // staged: `x` may go
}

}  // namespace

TEST_SUITE("cuda_gpu") {
  TEST_CASE(
      "step_amp on the device: grad_scale and found_inf in device memory, eager and in "
      "a captured graph with a skipped replay, match the host" *
      testing::needs_cuda_device()) {
    cu::PrimaryContext ctx(0);
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed << " (FUSEDOPT_TEST_SEED replays it)");
    std::mt19937 rng(seed);
    for (const char* preset : {"adamw", "lamb"}) {  // lamb: reduction passes read the scale
      CAPTURE(preset);
      const Rule rule = Rule::preset(preset);
      TwinModel m(rng);
      Optimizer gpu(rule, m.groups(true));
      Optimizer cpu(rule, m.groups(false));
      // torch's GradScaler hands its fp32 scale and found_inf tensors, on the device.
      cu::DeviceBuffer scale(4), found(4);
      const auto* scale_d = static_cast<const float*>(device_float(scale));
      const auto* found_d = static_cast<const float*>(device_float(found));
      cu::Stream s = cu::stream_create();
      const float scale_h = 1024.0f, zero = 0.0f, one = 1.0f;

      // Eager: a scaled step, a step the scaler found an inf for, an unscaled one.
      m.set_grads(rng, scale_h);
      set_device_float(scale, scale_h, s);
      set_device_float(found, 0.0f, s);
      StepResult r = gpu.step_amp(scale_d, found_d, s);
      CHECK_FALSE(r.known());  // on the device until asked
      CHECK(cpu.step_amp(&scale_h, &zero).taken());
      CHECK(r.taken());
      const auto before = m.device_params();
      const Tensor v0 = gpu.state("v", 3);
      const std::vector<double> v_before = read_view(v0, true);
      m.set_grads(rng, scale_h);
      set_device_float(found, 1.0f, s);
      r = gpu.step_amp(scale_d, found_d, s);
      CHECK_FALSE(cpu.step_amp(&scale_h, &one).taken());
      CHECK_FALSE(r.taken());
      CHECK(gpu.step_count() == 1);
      CHECK(m.device_params() == before);  // nothing moved, bit for bit
      CHECK(read_view(v0, true) == v_before);
      m.set_grads(rng);
      CHECK(gpu.step_amp(nullptr, nullptr, s).taken());
      CHECK(cpu.step_amp(nullptr, nullptr).taken());
      cu::synchronize(s);
      CHECK(gpu.step_count() == 2);
      check_close("param", m.device_params(), m.host_params(), kTol);

      // Captured once, replayed with the scale and found_inf torch's scaler would write
      // between iterations: replay 3 is skipped on the device.
      cu::begin_capture(s);
      (void)gpu.step_amp(scale_d, found_d, s);
      cu::Graph graph = cu::end_capture(s);
      cu::GraphExec exec = cu::graph_instantiate(graph);
      const float scales[] = {512.0f, 2048.0f, 2048.0f, 4096.0f};
      const float founds[] = {0.0f, 0.0f, 1.0f, 0.0f};
      for (int i = 0; i < 4; ++i) {
        CAPTURE(i);
        cu::synchronize(s);  // the previous replay has read the grads
        m.set_grads(rng, scales[i]);
        set_device_float(scale, scales[i], s);
        set_device_float(found, founds[i], s);
        cu::graph_launch(exec, s);
        CHECK(cpu.step_amp(&scales[i], &founds[i]).taken() == (founds[i] == 0.0f));
      }
      cu::synchronize(s);
      CHECK(cpu.step_count() == 5);
      CHECK(gpu.step_count() == 5);
      check_close("param", m.device_params(), m.host_params(), kTol);
      check_states_close(gpu, cpu, rule, m.size());
      cu::graph_exec_destroy(exec);
      cu::graph_destroy(graph);
      cu::stream_destroy(s);
    }
  }

  TEST_CASE(
      "rebind on the device: grads and params moved to new device memory keep the plan "
      "and match the host; bad pointers are refused and change nothing" *
      testing::needs_cuda_device()) {
    cu::PrimaryContext ctx(0);
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed << " (FUSEDOPT_TEST_SEED replays it)");
    std::mt19937 rng(seed);
    const Rule rule = Rule::preset("adamw");
    TwinModel m(rng);
    Optimizer gpu(rule, m.groups(true));
    Optimizer cpu(rule, m.groups(false));
    const OptimizerStats stats = gpu.stats();
    cu::Stream s = cu::stream_create();
    m.set_grads(rng);
    gpu.step(s);
    cpu.step();
    // Grads in new memory each step, as a .grad that zero_grad(set_to_none=True) freed and
    // backward allocated again; their alignment flips each time (aligned tensors take the
    // scalar path, the misaligned one the vector path).
    for (int t = 2; t <= 4; ++t) {
      CAPTURE(t);
      std::vector<TwinTensor> moved;
      std::vector<void*> dptrs, hptrs;
      for (std::size_t k = 0; k < m.size(); ++k) {
        const std::int64_t offset = (TwinModel::specs()[k].offset + t) % 2;
        moved.emplace_back(m.g[k].numel(), DType::F32, offset);
      }
      cu::synchronize(s);  // the last step has read the old grads
      for (TwinTensor& x : moved) {
        x.set(random_values(rng, x.numel()));
        dptrs.push_back(x.device_data());
        hptrs.push_back(x.host_data());
      }
      gpu.rebind({}, dptrs, s);
      cpu.rebind({}, hptrs);
      gpu.step(s);
      cpu.step();
      cu::synchronize(s);
      std::vector<std::vector<double>> got = m.device_params(), want = m.host_params();
      check_close("param after a grad rebind", got, want, kTol);
      m.g = std::move(moved);  // keep the bound memory alive; the old grads are freed
    }
    // The params move too: their values copied into new memory (each side its own), then
    // rebound and stepped there; the old memory is left alone.
    std::vector<TwinTensor> moved;
    std::vector<void*> dptrs, hptrs;
    const auto old_bits = m.device_params();
    for (std::size_t k = 0; k < m.size(); ++k) {
      moved.emplace_back(m.p[k].numel(), DType::F32, 1 - TwinModel::specs()[k].offset);
      moved.back().set(m.p[k].device_values());
      moved.back().set_host(m.p[k].host_values());
      dptrs.push_back(moved.back().device_data());
      hptrs.push_back(moved.back().host_data());
    }
    gpu.rebind(dptrs, {}, s);
    cpu.rebind(hptrs, {});
    m.set_grads(rng);
    gpu.step(s);
    cpu.step();
    cu::synchronize(s);
    CHECK(m.device_params() == old_bits);
    std::vector<std::vector<double>> got, want;
    for (TwinTensor& x : moved) {
      got.push_back(x.device_values());
      want.push_back(x.host_values());
    }
    check_close("param after a param rebind", got, want, kTol);
    check_states_close(gpu, cpu, rule, m.size());
    CHECK(gpu.step_count() == 5);
    // The plan was kept: the same kernel, the same launches.
    CHECK(gpu.stats().kernel_keys == stats.kernel_keys);
    CHECK(gpu.stats().launches_per_step == stats.launches_per_step);

    // Refusals: a wrong list, a grad overlapping a param, host memory. Nothing changes:
    // the next step still uses the moved params and the current grads.
    std::vector<void*> bad(m.size(), nullptr);
    CHECK_THROWS_WITH_AS(gpu.rebind({}, {m.g[1].device_data()}, s),
                         doctest::Contains("1 grad pointers for 5 params"), UsageError);
    bad[3] = dptrs[1];
    CHECK_THROWS_WITH_AS(gpu.rebind({}, bad, s), doctest::Contains("overlaps"), UsageError);
    // Host memory: named as the param it belongs to (group 1, param 0, 't3'), not by an
    // index of the kernel's own.
    bad[3] = m.g[3].host_data();
    CHECK_THROWS_WITH_AS(gpu.rebind({}, bad, s),
                         doctest::Contains("group 1, param 0 ('t3'), role g"), UsageError);
    m.set_grads(rng);
    gpu.step(s);
    cpu.step();
    cu::synchronize(s);
    got.clear();
    want.clear();
    for (TwinTensor& x : moved) {
      got.push_back(x.device_values());
      want.push_back(x.host_values());
    }
    check_close("param after refused rebinds", got, want, kTol);
    // The same check at construction names the param too.
    std::vector<ParamGroup> host_memory = m.groups(true);
    host_memory[1].grads[1].data = m.g[4].host_data();
    CHECK_THROWS_WITH_AS(Optimizer(rule, host_memory),
                         doctest::Contains("group 1, param 1 ('t4'), role g"), UsageError);
    cu::stream_destroy(s);
  }

  TEST_CASE(
      "set_hyper on a stream: an lr schedule and a per-group weight decay, set before "
      "each step on a non-blocking stream without waiting, match the host" *
      testing::needs_cuda_device()) {
    cu::PrimaryContext ctx(0);
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed << " (FUSEDOPT_TEST_SEED replays it)");
    std::mt19937 rng(seed);
    const Rule rule = Rule::preset("adamw");
    TwinModel m(rng);
    Optimizer gpu(rule, m.groups(true));
    Optimizer cpu(rule, m.groups(false));
    cu::Stream s = cu::stream_create();
    double lr = 0;
    for (int t = 1; t <= 6; ++t) {
      // Cosine decay from 0.05; group 1's weight decay grows. Each value is queued on the
      // stream: the step queued before it keeps the old value, the one after sees it.
      lr = 0.025 * (1 + std::cos(3.14159265358979 * t / 7));
      gpu.set_hyper("lr", lr, std::nullopt, s);
      cpu.set_hyper("lr", lr);
      gpu.set_hyper("weight_decay", 0.05 * t, 1, s);
      cpu.set_hyper("weight_decay", 0.05 * t, 1);
      for (std::size_t k = 0; k < m.size(); ++k) {
        const std::vector<double> grad = random_values(rng, m.g[k].numel());
        m.g[k].set_host(grad);
        m.g[k].set_device_async(grad, s);  // in the stream's order too: nothing waits
      }
      gpu.step(s);
      cpu.step();
    }
    cu::synchronize(s);
    check_close("param", m.device_params(), m.host_params(), kTol);
    check_states_close(gpu, cpu, rule, m.size());
    CHECK(gpu.hyper("lr", 0) == lr);
    CHECK(gpu.hyper("lr", 1) == lr);
    CHECK(gpu.hyper("weight_decay", 0) == 1e-2);
    CHECK(gpu.hyper("weight_decay", 1) == 0.05 * 6);
    // Refused, changing nothing: an unknown hyper, a group that does not exist.
    CHECK_THROWS_WITH_AS(gpu.set_hyper("lrr", 1.0, std::nullopt, s), doctest::Contains("lrr"),
                         Error);
    CHECK_THROWS_WITH_AS(gpu.set_hyper("lr", 1.0, 2, s), doctest::Contains("there is no group 2"),
                         UsageError);
    // On a stream being captured: the graph would copy from host memory that is gone when
    // it replays (a real GPU would read garbage), so it is refused.
    cu::begin_capture(s);
    CHECK_THROWS_WITH_AS(gpu.set_hyper("lr", 1.0, 0, s), doctest::Contains("being captured"),
                         UsageError);
    cu::graph_destroy(cu::end_capture(s));
    CHECK(gpu.hyper("lr", 0) == lr);
    cu::stream_destroy(s);
  }

  TEST_CASE(
      "step_scaled on the device: the StepResult is read back when asked, matches the "
      "host, and is refused once stale or orphaned" *
      testing::needs_cuda_device()) {
    cu::PrimaryContext ctx(0);
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed << " (FUSEDOPT_TEST_SEED replays it)");
    std::mt19937 rng(seed);
    const Rule rule = Rule::preset("adamw");
    TwinModel m(rng);
    Optimizer gpu(rule, m.groups(true));
    Optimizer cpu(rule, m.groups(false));
    cu::Stream s = cu::stream_create();
    const float inv = 1.0f / 256;
    m.set_grads(rng, 256);
    StepResult r1 = gpu.step_scaled(inv, s);
    const StepResult h1 = cpu.step_scaled(inv);
    CHECK_FALSE(r1.known());
    CHECK(h1.known());
    CHECK(r1.taken());
    CHECK(r1.known());
    CHECK(r1.taken());  // kept
    cu::synchronize(s);
    std::vector<std::vector<double>> grads = m.set_grads(rng, 256);
    m.g[4].set([&] {  // an inf in the misaligned tensor, after unscaling too
      std::vector<double> x = grads[4];
      for (double& e : x) e *= 256;
      x[100] = std::numeric_limits<double>::infinity();
      return x;
    }());
    const auto before = m.device_params();
    StepResult r2 = gpu.step_scaled(inv, s);
    CHECK_FALSE(cpu.step_scaled(inv).taken());
    CHECK_FALSE(r2.taken());
    CHECK(m.device_params() == before);
    m.set_grads(rng, 256);
    StepResult r3 = gpu.step_scaled(inv, s);
    CHECK(cpu.step_scaled(inv).taken());
    cu::synchronize(s);
    m.set_grads(rng, 256);
    StepResult r4 = gpu.step_scaled(inv, s);
    CHECK(cpu.step_scaled(inv).taken());
    // r3 was never asked before the next step: the device keeps only the last verdict.
    CHECK_THROWS_WITH_AS(r3.taken(), doctest::Contains("stepped again"), UsageError);
    CHECK(static_cast<bool>(r4));
    cu::synchronize(s);
    CHECK(gpu.step_count() == 3);
    check_close("param", m.device_params(), m.host_params(), kTol);
    check_states_close(gpu, cpu, rule, m.size());
    {
      TwinModel other(rng);
      StepResult orphan;
      {
        Optimizer gone(rule, other.groups(true));
        other.set_grads(rng);
        orphan = gone.step_scaled(1.0f, s);
      }
      CHECK_THROWS_WITH_AS(orphan.taken(), doctest::Contains("gone"), UsageError);
    }
    cu::stream_destroy(s);
  }

  TEST_CASE(
      "checkpoints of device tensors: a device optimizer loaded from one takes the "
      "saver's next step bit for bit, and host and device load each other's" *
      testing::needs_cuda_device()) {
    cu::PrimaryContext ctx(0);
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed << " (FUSEDOPT_TEST_SEED replays it)");
    std::mt19937 rng(seed);
    testing::TempDir dir;
    struct Case {
      const char* preset;
      DType param, grad;
      bool master;
    };
    // A master copy; scalar states (F64 on the device); row and column states.
    const Case cases[] = {{"adamw", DType::BF16, DType::BF16, true},
                          {"nadam", DType::F32, DType::F32, false},
                          {"adafactor", DType::F32, DType::F32, false}};
    for (const Case& c : cases) {
      CAPTURE(c.preset);
      const Rule rule = Rule::preset(c.preset);
      OptimizerOptions options;
      options.master_weights = c.master;
      TwinModel a(rng, c.param, c.grad);
      Optimizer saver(rule, a.groups(true), options);
      for (int t = 0; t < 3; ++t) {
        a.set_grads(rng);
        saver.step();
      }
      const auto file = dir.path() / (std::string(c.preset) + ".safetensors");
      saver.save(file);

      // A fresh device optimizer on other memory, its params copied from the saver's.
      TwinModel b(rng, c.param, c.grad);
      for (std::size_t k = 0; k < b.size(); ++k) b.p[k].set(a.p[k].device_values());
      Optimizer loaded(rule, b.groups(true), options);
      loaded.load(file);
      CHECK(loaded.step_count() == 3);
      CHECK(device_bits(loaded, rule, b, c.master) == device_bits(saver, rule, a, c.master));
      const auto grads = a.set_grads(rng);
      for (std::size_t k = 0; k < b.size(); ++k) b.g[k].set(grads[k]);
      saver.step();
      loaded.step();
      cu::synchronize(nullptr);
      CHECK(loaded.step_count() == 4);
      CHECK(device_bits(loaded, rule, b, c.master) == device_bits(saver, rule, a, c.master));
      if (c.master) continue;  // the host's bf16 kernel is not the point here

      // Device checkpoint into a host optimizer, and the host's back into a device one:
      // each then steps as the other within the device-against-host tolerance.
      saver.save(file);
      TwinModel h(rng, c.param, c.grad);
      for (std::size_t k = 0; k < h.size(); ++k) h.p[k].set(a.p[k].device_values());
      Optimizer host(rule, h.groups(false), options);
      host.load(file);
      CHECK(host.step_count() == 4);
      const auto g5 = a.set_grads(rng);
      for (std::size_t k = 0; k < h.size(); ++k) h.g[k].set(g5[k]);
      saver.step();
      host.step();
      cu::synchronize(nullptr);
      check_close("param, device checkpoint on the host", a.device_params(), h.host_params(), kTol);
      check_states_close(saver, host, rule, a.size());
      host.save(file);
      TwinModel d(rng, c.param, c.grad);
      for (std::size_t k = 0; k < d.size(); ++k) d.p[k].set(h.p[k].host_values());
      Optimizer from_host(rule, d.groups(true), options);
      from_host.load(file);
      CHECK(from_host.step_count() == 5);
      const auto g6 = d.set_grads(rng);
      for (std::size_t k = 0; k < h.size(); ++k) h.g[k].set(g6[k]);
      from_host.step();
      host.step();
      cu::synchronize(nullptr);
      check_close("param, host checkpoint on the device", d.device_params(), h.host_params(), kTol);
      check_states_close(from_host, host, rule, d.size());
    }
  }
}

}  // namespace fusedopt::testing
