// The main job's step demo: AdamW over BERT-base parameter shapes (201 tensors, 109.5 M
// elements) for 20 steps on the host, fused (one launch per step) vs one launch per
// tensor: time per step, GB/s and the fraction of the floor: an in-place stream of the same
// bytes (bench/floor.hpp: what the step reads and writes, role by role, with trivial math),
// measured in this run, taking turns with the steps. A plain copy of the same bytes is shown
// too, labelled as such: an in-place update does not pay for a copy's write-allocate, so it
// can beat a copy, and a copy is no floor.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "floor.hpp"
#include "fusedopt/cuda.hpp"
#include "fusedopt/optimizer.hpp"
#include "workloads.hpp"

using namespace fusedopt;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void print_row(const char* name, std::int64_t launches, double seconds, double bytes,
               double floor_s, double copy_s) {
  std::printf("%-24s %10lld %12.2f %10.2f", name, static_cast<long long>(launches), seconds * 1e3,
              bytes / seconds / 1e9);
  if (floor_s > 0)
    std::printf(" %11.0f%% %10.0f%%", 100.0 * floor_s / seconds, 100.0 * copy_s / seconds);
  std::printf("\n");
}

/// Fused vs one launch per tensor on CUDA device 0 (where there is one): params and grads
/// copied to the device, each step timed to completion.
void run_gpu(const bench::Workload& w, int steps, double bytes) {
  std::string why;
  if (!cuda_device_available(&why)) {
    std::string first = why.substr(0, why.find('\n'));
    if (!first.empty() && first.back() == ':') first.pop_back();
    std::printf("\nGPU: not run: no CUDA device (%s)\n", first.c_str());
    std::printf(
        "(the CUDA path runs on the CPU, for correctness only, with "
        "FUSEDOPT_CUDA_DRIVER_LIBRARY=<build>/src/emu/libfusedopt-cuda-emu.so)\n");
    return;
  }
  if (cuda_device_emulated()) {
    std::printf(
        "\nGPU: not run: the CUDA device is fusedopt's emulator, which checks what kernels "
        "do but says nothing of their speed\n");
    return;
  }
  std::vector<CudaBuffer> p, g;
  std::vector<float> host;
  for (std::int64_t n : w.sizes) {
    host.assign(static_cast<std::size_t>(n), 0.5f);
    p.emplace_back(static_cast<std::size_t>(n) * 4);
    p.back().copy_from_host(host.data(), host.size() * 4);
    std::fill(host.begin(), host.end(), 0.01f);
    g.emplace_back(static_cast<std::size_t>(n) * 4);
    g.back().copy_from_host(host.data(), host.size() * 4);
  }
  auto group = [&](std::size_t first, std::size_t last) {
    ParamGroup pg;
    for (std::size_t i = first; i < last; ++i) {
      pg.params.push_back(
          {p[i].data(), w.sizes[i], DType::F32, Device::cuda(0), "param" + std::to_string(i)});
      pg.grads.push_back({g[i].data(), w.sizes[i], DType::F32, Device::cuda(0), ""});
    }
    return pg;
  };
  Optimizer fused(Rule::preset("adamw"), {group(0, w.sizes.size())});
  std::vector<Optimizer> per_tensor;
  for (std::size_t i = 0; i < w.sizes.size(); ++i) {
    per_tensor.emplace_back(Rule::preset("adamw"), std::vector<ParamGroup>{group(i, i + 1)});
  }
  std::vector<double> tf, tl;
  for (int s = 0; s <= steps; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    fused.step();
    cuda_synchronize();
    if (s) tf.push_back(seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    for (auto& o : per_tensor) o.step();
    cuda_synchronize();
    if (s) tl.push_back(seconds_since(t0));
  }
  std::printf("\n%-24s %10s %12s %10s\n", "GPU (device 0)", "launches", "ms/step", "GB/s");
  print_row("fused", fused.stats().launches_per_step, median(tf), bytes, 0, 0);
  print_row("one launch per tensor", static_cast<std::int64_t>(per_tensor.size()), median(tl),
            bytes, 0, 0);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) {  // no options: the demo's workload is fixed (about 5 GB of host memory)
    const bool help = std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0;
    std::fprintf(help ? stdout : stderr,
                 "usage: bert_step_demo\n"
                 "AdamW (fp32) over BERT-base shapes (201 tensors, 109.5 M elements, about 5 GB "
                 "of host memory) for 20 steps, fused vs one launch per tensor, against an "
                 "in-place stream of the same bytes (the floor). No options.\n");
    return help ? 0 : 2;
  }
  try {
    const bench::Workload w = bench::bert_base();
    const int steps = 20;
    std::printf(
        "AdamW (fp32) over BERT-base shapes: %zu tensors, %.1f M elements, %d steps, host\n",
        w.sizes.size(), static_cast<double>(w.elements()) / 1e6, steps);
    std::vector<std::vector<float>> p, g;
    for (std::int64_t n : w.sizes) {
      p.emplace_back(static_cast<std::size_t>(n), 0.5f);
      g.emplace_back(static_cast<std::size_t>(n), 0.01f);
    }
    auto group = [&](std::size_t first, std::size_t last) {
      ParamGroup pg;
      for (std::size_t i = first; i < last; ++i) {
        pg.params.push_back({p[i].data(), (std::int64_t)p[i].size(), DType::F32, Device::host(),
                             "param" + std::to_string(i)});
        pg.grads.push_back(
            {g[i].data(), (std::int64_t)g[i].size(), DType::F32, Device::host(), ""});
      }
      return pg;
    };
    Optimizer fused(Rule::preset("adamw"), {group(0, w.sizes.size())});
    const OptimizerStats s = fused.stats();
    std::printf("%s\nkernel %s (%s in %.3f s); %.1f bytes per element\n", s.fusion_report.c_str(),
                s.kernel_keys.empty() ? "?" : s.kernel_keys[0].c_str(),
                s.kernel_origin ? to_string(*s.kernel_origin) : "?", s.kernel_seconds,
                static_cast<double>(s.bytes_per_step) / static_cast<double>(s.elements));
    std::vector<Optimizer> per_tensor;
    for (std::size_t i = 0; i < w.sizes.size(); ++i) {
      per_tensor.emplace_back(Rule::preset("adamw"), std::vector<ParamGroup>{group(i, i + 1)});
    }
    const double bytes = static_cast<double>(s.bytes_per_step);
    // Floor, copy, fused and per-tensor take turns every step and the medians are reported,
    // so a drift in a shared machine's memory bandwidth hits all of them alike.
    bench::InPlaceFloor floor(s.traffic);
    const std::size_t half = static_cast<std::size_t>(bytes) / 2;
    std::vector<char> src(half, 1), dst(half, 2);
    std::vector<double> tfloor, tc, tf, tl;
    for (int step = 0; step <= steps; ++step) {
      const double floor_s = floor.seconds();
      const double copy_s = bench::copy_seconds(dst.data(), src.data(), half);
      auto t0 = std::chrono::steady_clock::now();
      fused.step();
      const double fused_s = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
      for (auto& o : per_tensor) o.step();
      const double loop_s = seconds_since(t0);
      if (step == 0) continue;  // warm-up: first touch of every page
      tfloor.push_back(floor_s);
      tc.push_back(copy_s);
      tf.push_back(fused_s);
      tl.push_back(loop_s);
    }
    const double floor_s = median(tfloor), copy_s = median(tc);
    std::printf(
        "floor: %.2f ms per step (an in-place stream of the same %.2f GB: %.2f GB/s; %d "
        "threads)\ncopy, for comparison: %.2f ms (a plain copy of the same bytes: %.2f GB/s; it "
        "pays for write-allocate, so it is no floor)\n\n",
        floor_s * 1e3, bytes / 1e9, bytes / floor_s / 1e9, omp_get_max_threads(), copy_s * 1e3,
        bytes / copy_s / 1e9);
    std::printf("%-24s %10s %12s %10s %12s %11s\n", "host", "launches", "ms/step", "GB/s",
                "% of floor", "% of copy");
    print_row("fused", s.launches_per_step, median(tf), bytes, floor_s, copy_s);
    print_row("one launch per tensor", static_cast<std::int64_t>(per_tensor.size()), median(tl),
              bytes, floor_s, copy_s);
    std::printf(
        "(one launch per tensor is %zu OpenMP fork/joins a step: at the floor on idle cores; "
        "when other processes compete for them, each join waits for a descheduled thread, "
        "docs/results.md)\n",
        per_tensor.size());
    run_gpu(w, steps, bytes);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
