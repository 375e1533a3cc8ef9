// The main job's step demo: AdamW over BERT-base parameter shapes (201 tensors, 109.5 M
// elements) for 20 steps on the host, fused (one launch per step) vs one launch per
// tensor: time per step, GB/s and the fraction of the copy floor (a plain copy of the same
// bytes, measured in this run).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "bench/workloads.hpp"
#include "fusedopt/optimizer.hpp"

using namespace fusedopt;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Result {
  double step_seconds;  // median of the timed steps
  std::int64_t launches;
};

template <typename StepFn>
Result time_steps(int steps, std::int64_t launches, StepFn step) {
  step();  // warm-up: first touch of the state
  std::vector<double> t;
  for (int s = 0; s < steps; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    step();
    t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], launches};
}

}  // namespace

int main() {
  try {
    const bench::Workload w = bench::bert_base();
    const int steps = 20;
    std::printf("AdamW (fp32) over BERT-base shapes: %zu tensors, %.1f M elements, %d steps, host\n",
                w.sizes.size(), static_cast<double>(w.elements()) / 1e6, steps);
    std::vector<std::vector<float>> p, g;
    for (std::int64_t n : w.sizes) {
      p.emplace_back(static_cast<std::size_t>(n), 0.5f);
      g.emplace_back(static_cast<std::size_t>(n), 0.01f);
    }
    auto group = [&](std::size_t first, std::size_t last) {
      ParamGroup pg;
      for (std::size_t i = first; i < last; ++i) {
        pg.params.push_back({p[i].data(), (std::int64_t)p[i].size(), DType::F32, Device::host(), "param" + std::to_string(i)});
        pg.grads.push_back({g[i].data(), (std::int64_t)g[i].size(), DType::F32, Device::host(), ""});
      }
      return pg;
    };
    Optimizer fused(Rule::preset("adamw"), {group(0, w.sizes.size())});
    const OptimizerStats s = fused.stats();
    std::printf("%s\nkernel %s (%s in %.3f s); %.1f bytes per element\n", s.fusion_report.c_str(),
                s.kernel_keys.empty() ? "?" : s.kernel_keys[0].c_str(), s.kernel_origin.c_str(),
                s.kernel_seconds, static_cast<double>(s.bytes_per_step) / static_cast<double>(s.elements));
    std::vector<Optimizer> per_tensor;
    for (std::size_t i = 0; i < w.sizes.size(); ++i) {
      per_tensor.emplace_back(Rule::preset("adamw"), std::vector<ParamGroup>{group(i, i + 1)});
    }
    const double bytes = static_cast<double>(s.bytes_per_step);
    const double copy_bw = bench::copy_bandwidth(static_cast<std::size_t>(bytes));
    const double floor_s = bytes / copy_bw;
    Result rf = time_steps(steps, s.launches_per_step, [&] { fused.step(); });
    Result rl = time_steps(steps, static_cast<std::int64_t>(per_tensor.size()), [&] {
      for (auto& o : per_tensor) o.step();
    });
    std::printf("copy floor: %.2f ms per step (best plain copy: %.2f GB/s)\n\n", floor_s * 1e3, copy_bw / 1e9);
    std::printf("%-24s %10s %12s %10s %12s\n", "host", "launches", "ms/step", "GB/s", "% of copy");
    for (const auto& [name, r] : {std::pair<const char*, Result>{"fused", rf}, {"one launch per tensor", rl}}) {
      std::printf("%-24s %10lld %12.2f %10.2f %11.0f%%\n", name, static_cast<long long>(r.launches),
                  r.step_seconds * 1e3, bytes / r.step_seconds / 1e9, 100.0 * floor_s / r.step_seconds);
    }
    std::printf("\nGPU: not run (the CUDA path of Optimizer is not wired yet)\n");
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
