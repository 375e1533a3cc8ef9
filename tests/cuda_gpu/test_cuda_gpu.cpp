// One kernel on a real device, through the Optimizer's own Binding (testing::Kernel):
// AdamW against a float64 reference written here (fresh
// random data, empty tensors in the middle and at the end), misaligned pointers (scalar
// path) against aligned ones (vector path), bf16 params with an fp32 master, a captured
// CUDA graph of capturable steps against eager steps, the gradient check, and 10,000
// tensors in one launch. Where there is no usable device every case is skipped and named
// ("[SKIP] <case>: no CUDA device: <why>"), and CTest reports the suite skipped.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cache/kernel_cache.hpp"
#include "common/close.hpp"
#include "common/kernel_run.hpp"
#include "common/requirements.hpp"
#include "device/cuda_driver.hpp"
#include "device/cuda_module.hpp"
#include "fusedopt/error.hpp"
#include "presets.hpp"

namespace fusedopt::testing {

using namespace fusedopt;
using testing::Kernel;
namespace cuda = fusedopt::runtime::cuda;

namespace {

cache::KernelCache& test_cache() {
  static cache::KernelCache c([] {
    cache::KernelCache::Options o;
    o.mode = cache::KernelCache::Mode::Memory;
    return o;
  }());
  return c;
}

std::uint32_t fresh_seed() {
  if (const char* s = std::getenv("FUSEDOPT_TEST_SEED")) {
    return static_cast<std::uint32_t>(std::strtoul(s, nullptr, 10));
  }
  return std::random_device{}();
}

// ---- bf16 on the host (round to nearest even), independent of the prelude -------------

std::uint16_t to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + rounding) >> 16);
}
float from_bf16(std::uint16_t h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- AdamW in float64, after torch.optim.AdamW's single-tensor path ------------------

struct AdamW {
  double lr = 1e-2, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2;
  /// Kernel hyper values in the preset's declaration order.
  std::vector<double> hypers() const { return {lr, beta1, beta2, eps, weight_decay, 0.0}; }
  void step(std::vector<double>& p, std::vector<double>& m, std::vector<double>& v,
            const std::vector<double>& g, int t) const {
    const double bias1 = 1.0 - std::pow(beta1, t);
    const double bias2 = 1.0 - std::pow(beta2, t);
    for (std::size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1.0 - lr * weight_decay;
      m[i] += (1.0 - beta1) * (g[i] - m[i]);
      v[i] = beta2 * v[i] + (1.0 - beta2) * g[i] * g[i];
      const double denom = std::sqrt(v[i]) / std::sqrt(bias2) + eps;
      p[i] -= lr / bias1 * m[i] / denom;
    }
  }
};

/// One role of a tensor list in device memory. Each tensor's buffer is its own allocation
/// (256-byte aligned), or, with `misalign`, starts 4 bytes into it.
struct DeviceRole {
  std::vector<cuda::DeviceBuffer> buffers;
  std::vector<cuda::DevicePtr> ptrs;
  std::size_t elem = 4;

  DeviceRole(const std::vector<std::int64_t>& numel, std::size_t elem_size, bool misalign)
      : DeviceRole(numel, elem_size, std::size_t{misalign ? 4u : 0u}) {}
  /// Each tensor `offset` bytes past the start of its allocation (256-byte aligned).
  DeviceRole(const std::vector<std::int64_t>& numel, std::size_t elem_size, std::size_t offset)
      : elem(elem_size) {
    for (std::int64_t n : numel) {
      const std::size_t bytes = static_cast<std::size_t>(n) * elem + offset;
      buffers.emplace_back(std::max<std::size_t>(bytes, 16));
      ptrs.push_back(buffers.back().get() + offset);
    }
  }
  template <typename T>
  void upload(std::size_t t, const std::vector<T>& host) {
    REQUIRE(sizeof(T) == elem);
    cuda::copy_to_device(ptrs[t], host.data(), host.size() * sizeof(T));
  }
  template <typename T>
  std::vector<T> download(std::size_t t, std::size_t n) const {
    REQUIRE(sizeof(T) == elem);
    std::vector<T> out(n);
    cuda::copy_to_host(out.data(), ptrs[t], n * sizeof(T));
    return out;
  }
};

/// A device address as the pointer tables hold it.
void* as_ptr(cuda::DevicePtr p) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)); }

/// The pointer lists Kernel::prepare takes, from role-major lists.
std::vector<std::vector<void*>> pointer_lists(const std::vector<const DeviceRole*>& roles,
                                              std::size_t num_tensors) {
  std::vector<std::vector<void*>> out(num_tensors);
  for (std::size_t t = 0; t < num_tensors; ++t)
    for (const DeviceRole* r : roles) out[t].push_back(as_ptr(r->ptrs[t]));
  return out;
}

/// The grid of the plan's update launch.
unsigned grid_size(const runtime::Binding& b) {
  return runtime::cuda_step_grid(b.module(), b.plan().num_chunks());
}

std::vector<float> random_floats(std::mt19937& rng, std::size_t n, double sd) {
  std::normal_distribution<float> dist(0.0f, static_cast<float>(sd));
  std::vector<float> out(n);
  for (float& x : out) x = dist(rng);
  return out;
}

/// An fp32 AdamW run on the device next to its float64 reference.
struct Fp32AdamWRun {
  cuda::PrimaryContext ctx{0};  // first: current while the buffers below live
  std::vector<std::int64_t> numel;
  DeviceRole p, g, m, v;
  std::vector<std::vector<double>> rp, rm, rv;
  Kernel kernel;
  AdamW ref;
  std::unique_ptr<runtime::Binding> binding;

  Fp32AdamWRun(std::vector<std::int64_t> sizes, bool misalign)
      : numel(sizes),
        p(numel, 4, misalign),
        g(numel, 4, misalign),
        m(numel, 4, misalign),
        v(numel, 4, misalign),
        kernel(preset_rule("adamw"), DTypeBinding{}, test_cache(), Device::cuda(0)) {
    REQUIRE(kernel.num_roles() == 4);
    binding = kernel.prepare(pointer_lists({&p, &g, &m, &v}, numel.size()), numel, {ref.hypers()});
  }

  /// Fresh random params; states set to garbage first, then init_states must zero them.
  void init(std::mt19937& rng) {
    rp.assign(numel.size(), {});
    rm.assign(numel.size(), {});
    rv.assign(numel.size(), {});
    for (std::size_t t = 0; t < numel.size(); ++t) {
      const std::size_t n = static_cast<std::size_t>(numel[t]);
      std::vector<float> host = random_floats(rng, n, 1.0);
      p.upload(t, host);
      m.upload(t, random_floats(rng, n, 5.0));
      v.upload(t, random_floats(rng, n, 5.0));
      rp[t].assign(host.begin(), host.end());
      rm[t].assign(n, 0.0);
      rv[t].assign(n, 0.0);
    }
    binding->init_states();
  }

  /// Uploads `grads` and runs step `t` on the device and in the reference.
  void step(const std::vector<std::vector<float>>& grads, int t) {
    for (std::size_t i = 0; i < numel.size(); ++i) {
      g.upload(i, grads[i]);
      ref.step(rp[i], rm[i], rv[i], std::vector<double>(grads[i].begin(), grads[i].end()), t);
    }
    Kernel::step(*binding, t);  // legacy stream: ordered with the copies
  }

  void check(double tol) {
    const double sp = max_abs(rp), sm = max_abs(rm), sv = max_abs(rv);
    for (std::size_t t = 0; t < numel.size(); ++t) {
      INFO("tensor " << t << " of " << numel[t] << " elements");
      const std::size_t n = static_cast<std::size_t>(numel[t]);
      check_close("p", p.download<float>(t, n), rp[t], tol, sp);
      check_close("m", m.download<float>(t, n), rm[t], tol, sm);
      check_close("v", v.download<float>(t, n), rv[t], tol, sv);
    }
  }
};

std::vector<std::vector<float>> random_grads(std::mt19937& rng,
                                             const std::vector<std::int64_t>& numel) {
  std::vector<std::vector<float>> out;
  for (std::int64_t n : numel) out.push_back(random_floats(rng, static_cast<std::size_t>(n), 1.0));
  return out;
}

const std::vector<std::int64_t> kSizes = {1, 7, 1000, 65537, 0, 3, 0};

}  // namespace

namespace {

/// AdamW bf16:bf16:fp32+master over 100 steps against float64, with the bf16 roles
/// `offset16` bytes past their allocation.
void check_bf16_master(std::size_t offset16) {
  cuda::PrimaryContext ctx(0);  // current for the test's own buffers and copies
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const DTypeBinding d = DTypeBinding::parse("bf16:bf16:fp32+master");
  Kernel k(preset_rule("adamw"), d, test_cache(), Device::cuda(0));
  REQUIRE(k.num_roles() == 5);  // p, g, m, v, master
  const std::vector<std::int64_t>& numel = kSizes;
  const std::size_t nt = numel.size();
  DeviceRole p(numel, 2, offset16), g(numel, 2, offset16), m(numel, 4, false), v(numel, 4, false),
      master(numel, 4, false);
  AdamW ref;
  const auto b = k.prepare(pointer_lists({&p, &g, &m, &v, &master}, nt), numel, {ref.hypers()});
  CHECK(b->plan().num_aligned() == 5);
  std::vector<std::vector<double>> rp(nt), rm(nt), rv(nt);
  for (std::size_t t = 0; t < nt; ++t) {
    const std::size_t n = static_cast<std::size_t>(numel[t]);
    std::vector<std::uint16_t> bits(n);
    rp[t].resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      bits[i] = to_bf16(random_floats(rng, 1, 1.0)[0]);
      rp[t][i] = from_bf16(bits[i]);  // the master starts from the rounded param
    }
    p.upload(t, bits);
    rm[t].assign(n, 0.0);
    rv[t].assign(n, 0.0);
  }
  b->init_states();  // copies p into the master, zeroes m and v
  for (int step = 1; step <= 100; ++step) {
    for (std::size_t t = 0; t < nt; ++t) {
      const std::size_t n = static_cast<std::size_t>(numel[t]);
      std::vector<std::uint16_t> bits(n);
      std::vector<double> gd(n);
      for (std::size_t i = 0; i < n; ++i) {
        bits[i] = to_bf16(random_floats(rng, 1, 1.0)[0]);
        gd[i] = from_bf16(bits[i]);
      }
      g.upload(t, bits);
      ref.step(rp[t], rm[t], rv[t], gd, step);
    }
    Kernel::step(*b, step);
  }
  const double sp = max_abs(rp), sm = max_abs(rm), sv = max_abs(rv);
  for (std::size_t t = 0; t < nt; ++t) {
    INFO("tensor " << t);
    const std::size_t n = static_cast<std::size_t>(numel[t]);
    std::vector<float> mf = master.download<float>(t, n);
    check_close("master", mf, rp[t], 1e-4, sp);
    check_close("m", m.download<float>(t, n), rm[t], 1e-4, sm);
    check_close("v", v.download<float>(t, n), rv[t], 1e-4, sv);
    std::vector<std::uint16_t> pb = p.download<std::uint16_t>(t, n);
    for (std::size_t i = 0; i < n; ++i) CHECK(pb[i] == to_bf16(mf[i]));  // p = bf16(master)
  }
}

}  // namespace

TEST_SUITE("cuda_gpu") {
  TEST_CASE("AdamW fp32 on the GPU matches a float64 reference over 100 steps" *
            testing::needs_cuda_device()) {
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed << " (FUSEDOPT_TEST_SEED replays it)");
    std::mt19937 rng(seed);
    Fp32AdamWRun run(kSizes, false);
    CHECK(run.binding->plan().num_aligned() == 5);  // every non-empty tensor: the vector path
    CHECK(run.binding->plan().num_chunks() == 6);   // 65537 = 65536 + 1; empty tensors skipped
    CHECK(grid_size(*run.binding) == 6);
    run.init(rng);
    for (int t = 1; t <= 100; ++t) run.step(random_grads(rng, run.numel), t);
    run.check(1e-4);
  }

  TEST_CASE("the update runs a block per chunk; FUSEDOPT_CUDA_WAVES sets N waves instead" *
            testing::needs_cuda_device()) {
    struct Waves {  // sets FUSEDOPT_CUDA_WAVES for one construction, unset again after
      explicit Waves(const char* value) { ::setenv("FUSEDOPT_CUDA_WAVES", value, 1); }
      ~Waves() { ::unsetenv("FUSEDOPT_CUDA_WAVES"); }
    };
    const std::vector<std::int64_t> sizes(3000, 9);  // 3000 chunks, more than one wave
    unsigned wave = 0;
    {
      Waves env("1");
      wave = grid_size(*Fp32AdamWRun(sizes, false).binding);
    }
    REQUIRE(wave < 1500);
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed);
    for (const char* waves : {"", "2", "0"}) {  // "": unset, the default
      CAPTURE(waves);
      std::unique_ptr<Fp32AdamWRun> run;
      {
        Waves env(waves);
        run = std::make_unique<Fp32AdamWRun>(sizes, false);
      }
      CHECK(grid_size(*run->binding) == (waves[0] == '2' ? 2 * wave : 3000u));
      std::mt19937 rng(seed);
      run->init(rng);
      for (int t = 1; t <= 3; ++t) run->step(random_grads(rng, run->numel), t);
      run->check(1e-4);
    }
    for (const char* bad : {"-1", "x", "65"}) {
      Waves env(bad);
      CHECK_THROWS_WITH_AS(Fp32AdamWRun(sizes, false), doctest::Contains("FUSEDOPT_CUDA_WAVES"),
                           UsageError);
    }
  }

  TEST_CASE("misaligned pointers take the scalar path and give the aligned path's results" *
            testing::needs_cuda_device()) {
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937 rng_a(seed), rng_b(seed);
    Fp32AdamWRun aligned(kSizes, false);
    Fp32AdamWRun misaligned(kSizes, true);
    CHECK(aligned.binding->plan().num_aligned() == 5);
    CHECK(misaligned.binding->plan().num_aligned() == 0);
    aligned.init(rng_a);
    misaligned.init(rng_b);
    std::mt19937 grads(seed + 1);
    for (int t = 1; t <= 20; ++t) {
      auto gr = random_grads(grads, kSizes);
      aligned.step(gr, t);
      misaligned.step(gr, t);
    }
    aligned.check(1e-4);
    misaligned.check(1e-4);
    for (std::size_t t = 0; t < kSizes.size(); ++t) {
      const std::size_t n = static_cast<std::size_t>(kSizes[t]);
      std::vector<float> a = aligned.p.download<float>(t, n),
                         b = misaligned.p.download<float>(t, n);
      for (std::size_t i = 0; i < n; ++i) {
        // Same operations in the same order: equal up to FMA contraction choices.
        CHECK(std::abs(a[i] - b[i]) <= 1e-5f * (std::abs(a[i]) + 1.0f));
      }
    }
  }

  TEST_CASE("one misaligned role makes its tensor take the scalar path" *
            testing::needs_cuda_device()) {
    cuda::PrimaryContext ctx(0);  // current for the test's own buffers and copies
    std::mt19937 rng(fresh_seed());
    const std::vector<std::int64_t> sizes = {4096, 4096};
    DeviceRole p(sizes, 4, false), m(sizes, 4, false), v(sizes, 4, false);
    DeviceRole g_aligned(sizes, 4, false), g_off(sizes, 4, true);
    DeviceRole g = std::move(g_aligned);
    g.ptrs[1] = g_off.ptrs[1];  // tensor 1's gradient is 4 bytes off
    Kernel k(preset_rule("adamw"), DTypeBinding{}, test_cache(), Device::cuda(0));
    AdamW ref;
    const auto b = k.prepare(pointer_lists({&p, &g, &m, &v}, 2), sizes, {ref.hypers()});
    CHECK(b->plan().num_aligned() == 1);
    std::vector<std::vector<double>> rp(2), rm(2), rv(2);
    for (std::size_t t = 0; t < 2; ++t) {
      std::vector<float> host = random_floats(rng, 4096, 1.0);
      p.upload(t, host);
      rp[t].assign(host.begin(), host.end());
      rm[t].assign(4096, 0.0);
      rv[t].assign(4096, 0.0);
    }
    b->init_states();
    for (int t = 1; t <= 5; ++t) {
      for (std::size_t i = 0; i < 2; ++i) {
        std::vector<float> gr = random_floats(rng, 4096, 1.0);
        g.upload(i, gr);
        ref.step(rp[i], rm[i], rv[i], std::vector<double>(gr.begin(), gr.end()), t);
      }
      Kernel::step(*b, t);
    }
    for (std::size_t t = 0; t < 2; ++t)
      check_close("p", p.download<float>(t, 4096), rp[t], 1e-4, max_abs(rp));
  }

  TEST_CASE("bf16 params with an fp32 master on the GPU match a float64 reference" *
            testing::needs_cuda_device()) {
    // Offset 8: the bf16 roles sit 8 bytes past a 16-byte boundary, which is 4 of their
    // elements, so every tensor still takes the vector path.
    for (std::size_t offset16 : {std::size_t{0}, std::size_t{8}}) {
      CAPTURE(offset16);
      check_bf16_master(offset16);
    }
  }

  TEST_CASE("a captured graph of counted steps replayed 10 times matches 10 eager steps" *
            testing::needs_cuda_device()) {
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937 rng_a(seed), rng_b(seed);
    Fp32AdamWRun eager(kSizes, false);
    Fp32AdamWRun graph(kSizes, false);
    eager.init(rng_a);
    graph.init(rng_b);
    std::mt19937 grng(seed + 7);
    auto grads = random_grads(grng, kSizes);  // a graph replays the same gradients
    for (std::size_t t = 0; t < kSizes.size(); ++t) {
      eager.g.upload(t, grads[t]);
      graph.g.upload(t, grads[t]);
    }
    for (int t = 1; t <= 10; ++t) {
      Kernel::step(*eager.binding, t);
      for (std::size_t i = 0; i < kSizes.size(); ++i) {
        eager.ref.step(eager.rp[i], eager.rm[i], eager.rv[i],
                       std::vector<double>(grads[i].begin(), grads[i].end()), t);
      }
    }
    cuda::synchronize(nullptr);

    // The count of steps taken in device memory: each step reads it, then advances it.
    runtime::Buffer steps = graph.kernel.backend().allocate(sizeof(double));  // zeroed
    auto* const taken = static_cast<double*>(steps.data());
    cuda::Stream s = cuda::stream_create();
    cuda::begin_capture(s);
    Kernel::counted_step(*graph.binding, taken, s);
    cuda::Graph g = cuda::end_capture(s);
    cuda::GraphExec exec = cuda::graph_instantiate(g);
    for (int t = 1; t <= 10; ++t) cuda::graph_launch(exec, s);
    cuda::synchronize(s);
    double counted = 0;
    graph.kernel.backend().copy_to_host(&counted, taken, sizeof counted);
    CHECK(counted == 10.0);
    for (std::size_t t = 0; t < kSizes.size(); ++t) {
      const std::size_t n = static_cast<std::size_t>(kSizes[t]);
      std::vector<float> a = eager.p.download<float>(t, n), b = graph.p.download<float>(t, n);
      std::vector<float> am = eager.v.download<float>(t, n), bm = graph.v.download<float>(t, n);
      for (std::size_t i = 0; i < n; ++i) {
        CHECK(a[i] == b[i]);  // the same kernel on the same values: bit for bit
        CHECK(am[i] == bm[i]);
      }
    }
    eager.check(1e-4);
    cuda::graph_exec_destroy(exec);
    cuda::graph_destroy(g);
    cuda::stream_destroy(s);
  }

  TEST_CASE("the grad check finds a NaN, an overflow after unscaling, and passes finite grads" *
            testing::needs_cuda_device()) {
    std::mt19937 rng(fresh_seed());
    Fp32AdamWRun run(kSizes, false);
    run.init(rng);
    auto grads = random_grads(rng, kSizes);
    for (std::size_t t = 0; t < kSizes.size(); ++t) run.g.upload(t, grads[t]);
    CHECK(run.kernel.grads_finite(*run.binding, 1.0f));
    grads[3].back() = std::numeric_limits<float>::quiet_NaN();  // the 1-element tail chunk
    run.g.upload(3, grads[3]);
    CHECK_FALSE(run.kernel.grads_finite(*run.binding, 1.0f));
    grads[3].back() = 1.0f;
    grads[1][2] = 1e30f;  // finite, but not once multiplied by 1e10
    run.g.upload(3, grads[3]);
    run.g.upload(1, grads[1]);
    CHECK(run.kernel.grads_finite(*run.binding, 1.0f));
    CHECK_FALSE(run.kernel.grads_finite(*run.binding, 1e10f));
    // A non-blocking stream: the result is read after that stream's work.
    cuda::Stream s = cuda::stream_create();
    CHECK_FALSE(run.kernel.grads_finite(*run.binding, 1e10f, s));
    CHECK(run.kernel.grads_finite(*run.binding, 1.0f, s));
    cuda::stream_destroy(s);
  }

  TEST_CASE("10,000 tensors step in one launch and match the reference" *
            testing::needs_cuda_device()) {
    cuda::PrimaryContext ctx(0);  // current for the test's own buffers and copies
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    const std::size_t nt = 10000;
    std::vector<std::int64_t> numel(nt);
    std::uniform_int_distribution<int> size(0, 300);
    for (auto& n : numel) n = size(rng);
    numel.back() = 0;  // ends in an empty tensor
    // One arena per role; tensors 16-byte aligned except every 7th, 4 bytes off.
    std::vector<std::size_t> offset(nt);
    std::size_t total = 0;
    int expect_aligned = 0;
    for (std::size_t t = 0; t < nt; ++t) {
      total = (total + 3) / 4 * 4 + (t % 7 == 0 ? 1 : 0);
      offset[t] = total;
      total += static_cast<std::size_t>(numel[t]);
      expect_aligned += (t % 7 != 0) && numel[t] > 0;
    }
    std::vector<cuda::DeviceBuffer> arenas;
    for (int r = 0; r < 4; ++r) arenas.emplace_back((total + 4) * sizeof(float));
    std::vector<std::vector<void*>> ptrs(nt);
    for (std::size_t t = 0; t < nt; ++t)
      for (int r = 0; r < 4; ++r)
        ptrs[t].push_back(as_ptr(arenas[r].get() + offset[t] * sizeof(float)));
    AdamW ref;
    Kernel k(preset_rule("adamw"), DTypeBinding{}, test_cache(), Device::cuda(0));
    const auto b = k.prepare(ptrs, numel, {ref.hypers()});
    CHECK(b->plan().num_aligned() == expect_aligned);
    std::int64_t nonempty = 0;
    for (auto n : numel) nonempty += n > 0;
    CHECK(b->plan().num_chunks() == nonempty);
    std::vector<float> host_p(total + 4, 0.0f), host_g(total + 4, 0.0f);
    std::vector<std::vector<double>> rp(nt), rm(nt), rv(nt);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (std::size_t t = 0; t < nt; ++t) {
      for (std::int64_t i = 0; i < numel[t]; ++i) host_p[offset[t] + i] = dist(rng);
      rp[t].assign(host_p.begin() + offset[t], host_p.begin() + offset[t] + numel[t]);
      rm[t].assign(numel[t], 0.0);
      rv[t].assign(numel[t], 0.0);
    }
    cuda::copy_to_device(arenas[0].get(), host_p.data(), host_p.size() * sizeof(float));
    b->init_states();
    for (int step = 1; step <= 5; ++step) {
      for (std::size_t t = 0; t < nt; ++t) {
        std::vector<double> gd(numel[t]);
        for (std::int64_t i = 0; i < numel[t]; ++i) gd[i] = host_g[offset[t] + i] = dist(rng);
        ref.step(rp[t], rm[t], rv[t], gd, step);
      }
      cuda::copy_to_device(arenas[1].get(), host_g.data(), host_g.size() * sizeof(float));
      Kernel::step(*b, step);
    }
    std::vector<float> out(total + 4);
    cuda::copy_to_host(out.data(), arenas[0].get(), out.size() * sizeof(float));
    const double sp = max_abs(rp);
    int bad = 0;
    for (std::size_t t = 0; t < nt; ++t) {
      for (std::int64_t i = 0; i < numel[t]; ++i) {
        const double want = rp[t][i];
        if (!(std::abs(out[offset[t] + i] - want) <= 1e-4 * (std::abs(want) + sp))) ++bad;
      }
    }
    CHECK(bad == 0);
  }

  TEST_CASE("a CUDA binding refuses bad tensor lists and host memory with clear errors" *
            testing::needs_cuda_device()) {
    cuda::PrimaryContext ctx(0);  // current for the test's own buffers and copies
    Kernel k(preset_rule("adamw"), DTypeBinding{}, test_cache(), Device::cuda(0));
    AdamW ref;
    cuda::DeviceBuffer b(64);
    void* const d = as_ptr(b.get());
    CHECK_THROWS_WITH_AS(k.prepare({{d, d, d}}, {4}, {ref.hypers()}),
                         "Binding: tensor 0 has 3 pointers, the kernel needs 4", Error);
    CHECK_THROWS_WITH_AS(k.prepare({{d, nullptr, d, d}}, {4}, {ref.hypers()}),
                         "Binding: tensor 0 role 1 is a null pointer", Error);
    CHECK_THROWS_WITH_AS(k.prepare({{d, d, d, d}}, {4}, {{1.0f}}),
                         "Binding: group 0 has 1 hyper values, the rule has 6", Error);
    std::vector<float> host(4);
    CHECK_THROWS_WITH_AS(k.prepare({{d, d, host.data(), d}}, {4}, {ref.hypers()}),
                         doctest::Contains("tensor 0 role 2"), UsageError);
    // Empty tensors only: a valid plan with nothing to launch.
    const auto empty = k.prepare({{nullptr, nullptr, nullptr, nullptr}}, {0}, {ref.hypers()});
    CHECK(empty->plan().num_chunks() == 0);
    Kernel::step(*empty, 1.0);
    CHECK(k.grads_finite(*empty, 1.0f));
    CHECK_THROWS_WITH_AS(empty->set_hypers({ref.hypers(), ref.hypers()}, nullptr),
                         "set_hypers: 2 groups given, the plan has 1", Error);
  }

  TEST_CASE("cuda_device_available explains itself and device queries agree" *
            testing::needs_cuda_device()) {
    CHECK(cuda::device_count() > 0);
    CHECK(cuda::device_sm(0) >= 50);
    CHECK(cuda::device_sm_count(0) > 0);
    CHECK_THROWS_AS(cuda::PrimaryContext(cuda::device_count()), Error);
  }
}

}  // namespace fusedopt::testing
