// What fusedopt-bench's step benchmarks share: params and grads of a workload on the host
// or a CUDA device (each tensor in its dtype), a step timed beside its in-place floor and
// the copy of the same bytes, the counters every step reports, and the results --json
// writes (bench_main.cpp).
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "floor.hpp"
#include "fusedopt/cuda.hpp"
#include "fusedopt/optimizer.hpp"
#include "workloads.hpp"

namespace fusedopt::bench {

/// One line of --json, in bench/torch_step.py's schema (its --plot and docs/results.md's
/// tables read both): what ran, its median step and the floors measured in the same run
/// (0: not measured).
struct Result {
  std::string case_name, what, device;
  double seconds = 0, floor_seconds = 0, copy_seconds = 0;
  std::int64_t bytes = 0, tensors = 0, elements = 0, launches = 0;
};

/// The results of this run, in order (every step benchmark adds its own).
inline std::vector<Result>& results() {
  static std::vector<Result> all;
  return all;
}

/// The bits of 0.5 and 0.01 in `dtype`, for filling params and grads without a converter.
inline void fill_value(std::byte* data, std::int64_t n, DType dtype, bool grad) {
  auto fill = [&](auto value) {
    for (std::int64_t i = 0; i < n; ++i) std::memcpy(data + i * sizeof value, &value, sizeof value);
  };
  switch (dtype) {
    case DType::F64:
      fill(grad ? 0.01 : 0.5);
      break;
    case DType::F16:
      fill(static_cast<std::uint16_t>(grad ? 0x211F : 0x3800));  // 0.01000, 0.5
      break;
    case DType::BF16:
      fill(static_cast<std::uint16_t>(grad ? 0x3C24 : 0x3F00));  // 0.01001, 0.5
      break;
    default:
      fill(grad ? 0.01f : 0.5f);
  }
}

/// Host params and grads for a workload (grads 0.01, params 0.5, in each tensor's dtype).
struct HostModel {
  const Workload& w;
  std::vector<std::vector<std::byte>> p, g;
  explicit HostModel(const Workload& workload) : w(workload) {
    for (std::size_t i = 0; i < w.sizes.size(); ++i) {
      const auto bytes = static_cast<std::size_t>(w.sizes[i]) * dtype_size(w.dtype(i));
      p.emplace_back(bytes);
      g.emplace_back(bytes);
      fill_value(p.back().data(), w.sizes[i], w.dtype(i), false);
      fill_value(g.back().data(), w.sizes[i], w.dtype(i), true);
    }
  }
  /// Tensors [first, last) as one group, with their shapes.
  ParamGroup group(std::size_t first, std::size_t last) {
    ParamGroup pg;
    for (std::size_t i = first; i < last; ++i) {
      const std::string name = i < w.names.size() ? w.names[i] : "p" + std::to_string(i);
      Tensor param(p[i].data(), w.sizes[i], w.dtype(i), Device::host(), name);
      if (i < w.shapes.size()) param.shape = w.shapes[i];
      pg.params.push_back(param);
      pg.grads.push_back({g[i].data(), w.sizes[i], w.dtype(i), Device::host(), name + ".grad"});
    }
    return pg;
  }
};

/// The floors of a step: the median of floor / step over the iterations, the copy of the
/// same bytes, the median step.
struct Floors {
  double fraction = 0, copy_seconds = 0, floor_seconds = 0;
  double step_seconds = 0;  ///< the median step
};

/// Runs `step` under `state`'s timer, the in-place floor of `s` (untimed) just before each
/// step. The fraction of the floor is the median over the iterations of floor / step, each
/// pair measured a moment apart: this VM's memory bandwidth drifts by up to 2x within
/// seconds, and a ratio of two medians taken over the whole run read from 0.66 to 0.85 for
/// the same step (adafactor), 1.24 for rmsprop. The copy is measured before.
template <typename Step>
Floors timed_with_floor(benchmark::State& state, const OptimizerStats& s, Step step) {
  Floors f;
  const auto bytes = static_cast<std::size_t>(s.bytes_per_step);
  f.copy_seconds = static_cast<double>(bytes) / copy_bandwidth(bytes);
  InPlaceFloor floor(s.traffic);
  floor.seconds();  // warm
  std::vector<double> ratios, steps, floors;
  for (auto _ : state) {
    state.PauseTiming();
    const double floor_seconds = floor.seconds();
    state.ResumeTiming();
    const auto t0 = std::chrono::steady_clock::now();
    step();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ratios.push_back(floor_seconds / std::max(seconds, 1e-12));
    steps.push_back(seconds);
    floors.push_back(floor_seconds);
  }
  auto median = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  f.fraction = median(ratios);
  f.step_seconds = median(steps);
  f.floor_seconds = median(floors);
  return f;
}

/// The counters of a step (all unitless ratios or counts, or the bytes Google Benchmark
/// turns into bytes_per_second), and its line in results().
inline void report(benchmark::State& state, const OptimizerStats& s, std::int64_t launches,
                   const Floors& floors, const std::string& case_name, const std::string& what,
                   const std::string& device = "cpu") {
  state.SetBytesProcessed(s.bytes_per_step * state.iterations());
  state.counters["floor_fraction"] = floors.fraction;
  state.counters["copy_fraction"] =
      floors.step_seconds > 0 ? floors.copy_seconds / floors.step_seconds : 0.0;
  state.counters["launches"] = static_cast<double>(launches);
  state.counters["tensors"] = static_cast<double>(s.tensors);
  state.SetLabel(what);
  Result r;
  r.case_name = case_name;
  r.what = what;
  r.device = device;
  r.seconds = floors.step_seconds;
  r.floor_seconds = floors.floor_seconds;
  r.copy_seconds = floors.copy_seconds;
  r.bytes = s.bytes_per_step;
  r.tensors = s.tensors;
  r.elements = s.elements;
  r.launches = launches;
  // Google Benchmark calls a benchmark again with more iterations until its time is long
  // enough: the last call is the measurement.
  for (Result& old : results()) {
    if (old.case_name == r.case_name && old.what == r.what) {
      old = r;
      return;
    }
  }
  results().push_back(r);
}

/// Params and grads of a workload on CUDA device 0 (as HostModel's).
struct DeviceModel {
  const Workload& w;
  std::vector<CudaBuffer> p, g;
  explicit DeviceModel(const Workload& workload) : w(workload) {
    for (std::size_t i = 0; i < w.sizes.size(); ++i) {
      const auto bytes = static_cast<std::size_t>(w.sizes[i]) * dtype_size(w.dtype(i));
      std::vector<std::byte> host(bytes);
      fill_value(host.data(), w.sizes[i], w.dtype(i), false);
      p.emplace_back(bytes);
      p.back().copy_from_host(host.data(), bytes);
      fill_value(host.data(), w.sizes[i], w.dtype(i), true);
      g.emplace_back(bytes);
      g.back().copy_from_host(host.data(), bytes);
    }
  }
  ParamGroup group(std::size_t first, std::size_t last) const {
    ParamGroup pg;
    for (std::size_t i = first; i < last; ++i) {
      const std::string name = i < w.names.size() ? w.names[i] : "p" + std::to_string(i);
      Tensor param(p[i].data(), w.sizes[i], w.dtype(i), Device::cuda(0), name);
      if (i < w.shapes.size()) param.shape = w.shapes[i];
      pg.params.push_back(param);
      pg.grads.push_back({g[i].data(), w.sizes[i], w.dtype(i), Device::cuda(0), name + ".grad"});
    }
    return pg;
  }
};

/// Times each step to completion (manual time), after one untimed step.
template <typename Step>
double time_device_steps(benchmark::State& state, Step step) {
  step();
  cuda_synchronize();
  std::vector<double> times;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    step();
    cuda_synchronize();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    state.SetIterationTime(times.back());
  }
  std::sort(times.begin(), times.end());
  return times.empty() ? 0.0 : times[times.size() / 2];
}

/// Skips `state`, saying why, where there is no real CUDA device (none, or the emulator).
inline bool skipped_without_gpu(benchmark::State& state) {
  std::string why;
  if (!cuda_device_available(&why)) {
    state.SkipWithError(("no CUDA device: " + why.substr(0, why.find('\n'))).c_str());
    return true;
  }
  if (cuda_device_emulated()) {
    state.SkipWithError("the CUDA device is fusedopt's emulator: it has no speed to measure");
    return true;
  }
  return false;
}

}  // namespace fusedopt::bench
