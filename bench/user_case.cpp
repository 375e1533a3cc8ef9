// A user's own case for fusedopt-bench (harness.hpp): their workload (a named one or a
// shapes file), their rules (presets or rule files), host or CUDA, fused or one optimizer per
// tensor, each step timed beside its in-place floor and a copy of the same bytes (host).
#include <benchmark/benchmark.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>

#include "fusedopt/error.hpp"
#include "fusedopt/kernel.hpp"
#include "harness.hpp"
#include "matrix_case.hpp"
#include "shapes_file.hpp"
#include "step_timing.hpp"

namespace fusedopt::bench {

namespace {

/// `spec` as a rule: a preset name, or the file it names (its name: the file's).
Rule rule_of(const std::string& spec) {
  const bool file = spec.find('/') != std::string::npos ||
                    (spec.size() > 5 && spec.compare(spec.size() - 5, 5, ".rule") == 0);
  if (!file) return Rule::preset(spec);
  std::ifstream in(spec, std::ios::binary);
  if (!in) throw std::runtime_error(spec + ": error: cannot open the rule file");
  std::stringstream text;
  text << in.rdbuf();
  return Rule::parse(text.str(), spec);
}

Workload workload_of(const std::string& spec) {
  if (std::optional<Workload> w = named_workload(spec)) return *w;
  if (spec.find('/') == std::string::npos && spec.find(".json") == std::string::npos) {
    std::string names;
    for (const std::string& n : workload_names()) names += (names.empty() ? "" : ", ") + n;
    throw std::runtime_error("no workload '" + spec + "': give one of " + names +
                             ", or a shapes file (JSON)");
  }
  return read_shapes_file(spec);
}

/// The optimizers of one case: one over every tensor (fused), or one per tensor.
template <typename Model>
std::vector<std::unique_ptr<Optimizer>> optimizers(const Rule& rule, Model& model,
                                                   std::size_t tensors, bool fused,
                                                   const OptimizerOptions& options) {
  std::vector<std::unique_ptr<Optimizer>> out;
  if (fused) {
    out.push_back(std::make_unique<Optimizer>(
        rule, std::vector<ParamGroup>{model.group(0, tensors)}, options));
    return out;
  }
  for (std::size_t i = 0; i < tensors; ++i) {
    out.push_back(
        std::make_unique<Optimizer>(rule, std::vector<ParamGroup>{model.group(i, i + 1)}, options));
  }
  return out;
}

/// The stats of the whole step: the fused optimizer's, or the sum of the per-tensor ones
/// with the fused step's traffic (the floor streams the same bytes as one pass).
OptimizerStats total_stats(const std::vector<std::unique_ptr<Optimizer>>& opts,
                           const std::vector<PassTraffic>& fused_traffic) {
  if (opts.size() == 1) return opts.front()->stats();
  OptimizerStats total;
  for (const auto& o : opts) {
    const OptimizerStats s = o->stats();
    total.bytes_per_step += s.bytes_per_step;
    total.tensors += s.tensors;
    total.elements += s.elements;
    total.launches_per_step += s.launches_per_step;
  }
  total.traffic = fused_traffic;
  return total;
}

void run_case(benchmark::State& state, const Workload& w, const Rule& rule, bool fused,
              const UserCase& c) {
  const std::string what = rule.name() + " on " + w.name + " (" + std::to_string(w.sizes.size()) +
                           " tensors), " + (fused ? "fused" : "one optimizer per tensor") +
                           (c.device == "cuda" ? ", cuda:0" : ", host") +
                           (c.options.matrix_precision == DType::BF16 ? ", bf16 iteration" : "");
  try {
    if (c.device == "cuda") {
      if (skipped_without_gpu(state)) return;
      DeviceModel model(w);
      auto opts = optimizers(rule, model, w.sizes.size(), fused, c.options);
      const OptimizerStats s = total_stats(opts, {});
      Floors floors;  // no floor on a GPU here: the step's time only
      floors.step_seconds = time_device_steps(state, [&] {
        for (auto& o : opts) o->step();
      });
      report(state, s, s.launches_per_step, floors, "case", what, "cuda");
      return;
    }
    if (has_matrix_stage(rule)) {
      // Its floor is the iteration's GEMMs (matrix_case.hpp), not the bytes it moves.
      if (!fused) {
        state.SkipWithError("a rule with orthogonalize() is measured fused only (--mode fused)");
        return;
      }
      run_matrix_case(state, w, rule, c.options, "case", what);
      return;
    }
    HostModel model(w);
    auto opts = optimizers(rule, model, w.sizes.size(), fused, c.options);
    for (auto& o : opts) o->step();  // warm: first touch of the state pages
    std::vector<PassTraffic> traffic;
    if (!fused) {
      HostModel twin(w);
      traffic = Optimizer(rule, {twin.group(0, w.sizes.size())}, c.options).stats().traffic;
    }
    const OptimizerStats s = total_stats(opts, traffic);
    const Floors floors = timed_with_floor(state, s, [&] {
      for (auto& o : opts) o->step();
    });
    report(state, s, s.launches_per_step, floors, "case", what);
  } catch (const Error& e) {
    state.SkipWithError(e.what());
  }
}

}  // namespace

std::string register_user_case(const UserCase& c) {
  if (c.device != "host" && c.device != "cuda") {
    throw std::runtime_error("--device " + c.device + ": give host or cuda");
  }
  if (c.mode != "fused" && c.mode != "per-tensor" && c.mode != "both") {
    throw std::runtime_error("--mode " + c.mode + ": give fused, per-tensor or both");
  }
  auto w = std::make_shared<const Workload>(workload_of(c.workload));
  std::vector<std::string> specs = c.rules.empty() ? std::vector<std::string>{"adamw"} : c.rules;
  for (const std::string& spec : specs) {
    Rule rule = [&] {
      try {
        return rule_of(spec);
      } catch (const Error& e) {
        throw std::runtime_error(e.what());
      }
    }();
    for (const bool fused : {true, false}) {
      if ((fused && c.mode == "per-tensor") || (!fused && c.mode == "fused")) continue;
      const std::string name = "case/" + rule.name() + (fused ? "/fused" : "/per-tensor");
      auto* b = benchmark::RegisterBenchmark(
          name.c_str(),
          [w, rule, fused, c](benchmark::State& state) { run_case(state, *w, rule, fused, c); });
      b->Unit(benchmark::kMillisecond);
      if (c.device == "cuda") {
        b->UseManualTime();
      } else {
        b->UseRealTime();
        // A step of seconds (Muon's iteration): a few, each beside its GEMM floor.
        if (has_matrix_stage(rule)) b->Iterations(3);
      }
    }
  }
  return "^case/";
}

}  // namespace fusedopt::bench
