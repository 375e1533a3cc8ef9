// Optimizer step benchmarks on the host: AdamW over BERT-base shapes and over 5,000 small
// tensors, fused (one launch per step) vs one launch per tensor, and every preset over
// BERT-base. Each declares the bytes a step must move (stats().bytes_per_step) and reports
// floor_fraction: the time of an in-place stream of the same bytes (bench/floor.hpp; run
// before every timed step, untimed, its median) over the step's time; at most 1 up to noise
// (this VM's memory bandwidth drifts by 2x over minutes, so the two take turns).
// copy_fraction (a memcpy of the same bytes over the step's time) stays as a second column:
// the fused AdamW beats a copy, which pays for write-allocate, so it is no floor.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "floor.hpp"
#include "fusedopt/cuda.hpp"
#include "fusedopt/optimizer.hpp"
#include "matrix_case.hpp"
#include "step_timing.hpp"
#include "workloads.hpp"

using namespace fusedopt;

namespace {

using bench::DeviceModel;
using bench::Floors;
using bench::HostModel;
using bench::report;
using bench::skipped_without_gpu;
using bench::time_device_steps;
using bench::timed_with_floor;

bench::Workload workload(int64_t which) {
  return which == 0 ? bench::bert_base() : bench::small_tensors();
}

void BM_HostStepFused(benchmark::State& state) {
  const bench::Workload w = workload(state.range(0));
  HostModel model(w);
  Optimizer opt(Rule::preset("adamw"), {model.group(0, w.sizes.size())});
  opt.step();  // warm: first touch of the state pages
  const Floors floors = timed_with_floor(state, opt.stats(), [&] { opt.step(); });
  report(state, opt.stats(), opt.stats().launches_per_step, floors, w.name,
         "adamw fp32 " + w.name + " fused");
}

void BM_HostStepPerTensor(benchmark::State& state) {
  const bench::Workload w = workload(state.range(0));
  HostModel model(w);
  std::vector<Optimizer> per_tensor;
  OptimizerStats total;
  for (std::size_t i = 0; i < w.sizes.size(); ++i) {
    per_tensor.emplace_back(Rule::preset("adamw"), std::vector<ParamGroup>{model.group(i, i + 1)});
    OptimizerStats s = per_tensor.back().stats();
    total.bytes_per_step += s.bytes_per_step;
    total.tensors += s.tensors;
    total.elements += s.elements;
  }
  for (auto& o : per_tensor) o.step();
  // The floor of the same bytes as one fused stream (the fused step's traffic).
  total.traffic =
      Optimizer(Rule::preset("adamw"), {model.group(0, w.sizes.size())}).stats().traffic;
  const Floors floors = timed_with_floor(state, total, [&] {
    for (auto& o : per_tensor) o.step();
  });
  report(state, total, static_cast<std::int64_t>(per_tensor.size()), floors, w.name,
         "adamw fp32 " + w.name + " one launch per tensor");
}

/// Seconds per element of preset `name`'s step over a model small enough for its arrays to
/// stay in the caches, the best of `runs` steps, and its elements: the step's arithmetic
/// without DRAM traffic. 256 x 256 params, two per thread of the step's team and four at
/// least, so every thread has chunks (a factored param is one chunk, another two): on 2
/// threads four, 2.6 MB with 8-bit states, 4.2 MB with fp32 adamw's, 6.3 MB with adan's, on a
/// 32 MB L3. A step over BERT-base should not beat it per element; its launch's fixed cost
/// makes it err high. Where a step is bound by arithmetic, not memory, this is its floor.
std::pair<double, std::int64_t> resident_seconds_per_element(const std::string& name, int runs) {
  bench::Workload w;
  w.name = "resident";
  for (int i = 0; i < std::max(4, 2 * omp_get_max_threads()); ++i) {
    w.sizes.push_back(256 * 256);
    w.shapes.push_back({256, 256});
  }
  HostModel model(w);
  ParamGroup group = model.group(0, w.sizes.size());
  for (std::size_t i = 0; i < w.shapes.size(); ++i) group.params[i].shape = w.shapes[i];
  OptimizerOptions o;
  o.quant_min_numel = 0;  // quantized presets: every param quantized, as BERT-base's large ones
  Optimizer opt(Rule::preset(name), {group}, o);
  opt.step();
  opt.step();  // warm: the arrays in the caches
  double best = 1e30;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    opt.step();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return {best / static_cast<double>(w.elements()), w.elements()};
}

/// Preset `name` over BERT-base (torch's shapes) on the host, fused: the step time, the
/// fraction of its in-place floor (memory) and of its resident floor (arithmetic: the same
/// step's time per element with its arrays in the caches, times BERT-base's elements).
void BM_HostPresetStep(benchmark::State& state, const std::string& name) {
  const bench::Workload w = bench::bert_base();
  HostModel model(w);
  ParamGroup group = model.group(0, w.sizes.size());
  // Shapes matter to adafactor only (its row and column states); the others ignore them.
  for (std::size_t i = 0; i < w.shapes.size(); ++i) group.params[i].shape = w.shapes[i];
  Optimizer opt(Rule::preset(name), {group});
  opt.step();
  const Floors floors = timed_with_floor(state, opt.stats(), [&] { opt.step(); });
  report(state, opt.stats(), opt.stats().launches_per_step, floors, "preset",
         name + " fp32 " + w.name + " fused");
  const auto [per_element, resident_elements] = resident_seconds_per_element(name, 20);
  const double resident = per_element * static_cast<double>(opt.stats().elements);
  state.counters["resident_ms"] = resident * 1e3;
  state.counters["resident_elements"] = static_cast<double>(resident_elements);
  state.counters["resident_fraction"] =
      floors.step_seconds > 0 ? resident / floors.step_seconds : 0.0;
  state.counters["bytes_per_element"] =
      static_cast<double>(opt.stats().bytes_per_step) / static_cast<double>(opt.stats().elements);
  // Optimizer state per parameter element (the quantized presets: codes and absmax).
  state.counters["state_bytes_per_element"] =
      static_cast<double>(opt.stats().state_bytes) / static_cast<double>(opt.stats().elements);
}

/// Preset `name`, one with a matrix stage (muon), over GPT-2 small's 48 hidden matrices on
/// the host, fused, beside its GEMM floor (matrix_case.hpp).
void BM_HostMatrixPreset(benchmark::State& state, const std::string& name) {
  const bench::Workload w = bench::gpt2_small_matrices();
  bench::run_matrix_case(state, w, Rule::preset(name), {}, "preset",
                         name + " fp32 " + w.name + " fused");
}

/// The optimizer state of preset `name` over BERT-base (torch's shapes) with `storage` for
/// every state ("" for the preset's own): the bytes stats() counts (codes, absmax, row and
/// column states, the states of params below quant_min_numel). `block` > 0 sets
/// quant_block and quantizes every param (quant_min_numel 0). Nothing is timed; the
/// counters are the result.
void BM_StateMemory(benchmark::State& state, const std::string& name, const std::string& storage,
                    int block) {
  const bench::Workload w = bench::bert_base();
  HostModel model(w);
  ParamGroup group = model.group(0, w.sizes.size());
  for (std::size_t i = 0; i < w.shapes.size(); ++i) group.params[i].shape = w.shapes[i];
  OptimizerOptions o;
  if (!storage.empty()) o.state_storage = {{"*", storage}};
  if (block > 0) {
    o.quant_block = block;
    o.quant_min_numel = 0;
  }
  Optimizer opt(Rule::preset(name), {group}, o);
  const OptimizerStats s = opt.stats();
  for (auto _ : state) benchmark::DoNotOptimize(s.state_bytes);
  state.counters["state_MB"] = static_cast<double>(s.state_bytes) / 1e6;
  state.counters["state_bytes_per_element"] =
      static_cast<double>(s.state_bytes) / static_cast<double>(s.elements);
  state.SetLabel(name + (storage.empty() ? "" : " state_storage=" + storage) +
                 (block > 0 ? " quant_block=" + std::to_string(block) + " quant_min_numel=0" : "") +
                 " " + w.name);
}

const bool kPresetBenchmarks = [] {
  for (const std::string& name : Rule::presets()) {  // every preset, in the table's order
    if (bench::has_matrix_stage(Rule::preset(name))) {
      // muon: BERT-base's 1-D params are not its own; GPT-2 small's hidden matrices, beside
      // the GEMM floor of its Newton-Schulz iteration (a step of seconds: three of them).
      benchmark::RegisterBenchmark(("BM_HostPresetStep/" + name).c_str(), BM_HostMatrixPreset, name)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime()
          ->Iterations(3);
      continue;
    }
    benchmark::RegisterBenchmark(("BM_HostPresetStep/" + name).c_str(), BM_HostPresetStep, name)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->MinTime(1.0);
  }
  struct Memory {
    const char* name;
    const char* storage;
    int block;  // 0: the default block and quant_min_numel
  };
  const std::vector<Memory> memory = {
      {"adamw", "", 0},   {"adamw8bit", "", 0}, {"adamw8bit", "", 512}, {"adamw4bit", "", 0},
      {"adamw", "q8", 0}, {"lion", "", 0},      {"lion8bit", "", 0},    {"adafactor", "", 0},
      {"came", "", 0},    {"came", "q8", 0},    {"adam_mini", "", 0},   {"adam_mini", "q8", 0},
      {"adopt", "", 0},   {"adopt", "q8", 0},   {"adan", "", 0},        {"adan", "q8", 0}};
  for (const Memory& m : memory) {
    const std::string label = std::string(m.name) +
                              (*m.storage ? std::string("/") + m.storage : "") +
                              (m.block > 0 ? "/block" + std::to_string(m.block) + "_all" : "");
    benchmark::RegisterBenchmark(("BM_StateMemory/" + label).c_str(), BM_StateMemory,
                                 std::string(m.name), std::string(m.storage), m.block)
        ->Iterations(1);
  }
  return true;
}();

}  // namespace

BENCHMARK(BM_HostStepFused)
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(2.0);
BENCHMARK(BM_HostStepPerTensor)
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(2.0);

// CUDA: the same two workloads on device 0, fused vs one launch per tensor; each step is
// timed to completion (manual time). Skipped where there is no CUDA device.
namespace {

void BM_CudaStep(benchmark::State& state) {
  if (skipped_without_gpu(state)) return;
  const bench::Workload w = workload(state.range(0));
  const bool fused = state.range(1) != 0;
  DeviceModel model(w);
  std::vector<Optimizer> opts;
  OptimizerStats total;
  if (fused) {
    opts.emplace_back(Rule::preset("adamw"),
                      std::vector<ParamGroup>{model.group(0, w.sizes.size())});
    total = opts.back().stats();
  } else {
    for (std::size_t i = 0; i < w.sizes.size(); ++i) {
      opts.emplace_back(Rule::preset("adamw"), std::vector<ParamGroup>{model.group(i, i + 1)});
      total.bytes_per_step += opts.back().stats().bytes_per_step;
    }
  }
  time_device_steps(state, [&] {
    for (auto& o : opts) o.step();
  });
  state.SetBytesProcessed(total.bytes_per_step * state.iterations());
  state.counters["launches"] =
      static_cast<double>(fused ? opts[0].stats().launches_per_step : opts.size());
  state.SetLabel("adamw fp32 " + w.name + (fused ? " fused" : " one launch per tensor") +
                 " cuda:0");
}

/// One fused step of preset `name` on BERT-base on device 0 (its own storage: the quantized
/// presets against their fp32 forms, adamw4bit+sr's draws against adamw4bit's nearest codes).
void BM_CudaPresetStep(benchmark::State& state, const std::string& name) {
  if (skipped_without_gpu(state)) return;
  const bench::Workload w = workload(0);
  DeviceModel model(w);
  Optimizer opt(Rule::preset(name), std::vector<ParamGroup>{model.group(0, w.sizes.size())});
  time_device_steps(state, [&] { opt.step(); });
  const OptimizerStats s = opt.stats();
  state.SetBytesProcessed(s.bytes_per_step * state.iterations());
  state.counters["launches"] = static_cast<double>(s.launches_per_step);
  state.counters["state_bytes_per_element"] =
      static_cast<double>(s.state_bytes) / static_cast<double>(w.elements());
  state.SetLabel(name + " fp32 " + w.name + " cuda:0");
}

const bool kCudaPresetBenchmarks = [] {
  for (const char* name :
       {"adamw", "adamw8bit", "adam8bit", "adamw4bit", "adamw4bit+sr", "lion", "lion8bit"}) {
    benchmark::RegisterBenchmark((std::string("BM_CudaPresetStep/") + name).c_str(),
                                 BM_CudaPresetStep, std::string(name))
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  return true;
}();

}  // namespace

BENCHMARK(BM_CudaStep)
    ->Args({0, 1})
    ->Args({0, 0})
    ->Args({1, 1})
    ->Args({1, 0})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
