// run_matrix_case (matrix_case.hpp).
#include "matrix_case.hpp"

#include <algorithm>
#include <chrono>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "fusedopt/error.hpp"
#include "gemm_floor.hpp"
#include "step_timing.hpp"

namespace fusedopt::bench {

namespace {

/// `text` without its comments ('#' to the end of a line).
std::string code_of(const std::string& text) {
  std::istringstream in(text);
  std::string line, out;
  while (std::getline(in, line)) out += line.substr(0, line.find('#')) + "\n";
  return out;
}

/// The rule's code with every orthogonalize(x, ...) replaced by (x); nullopt when a call
/// does not close.
std::optional<std::string> without_stages(std::string code) {
  const std::string call = "orthogonalize(";
  for (std::size_t at = code.find(call); at != std::string::npos; at = code.find(call, at)) {
    const std::size_t open = at + call.size();
    int depth = 1;
    std::size_t comma = std::string::npos, i = open;
    for (; i < code.size() && depth > 0; ++i) {
      if (code[i] == '(') ++depth;
      if (code[i] == ')') --depth;
      if (code[i] == ',' && depth == 1 && comma == std::string::npos) comma = i;
    }
    if (depth != 0) return std::nullopt;
    const std::size_t close = i - 1;
    const std::string arg = code.substr(open, (comma == std::string::npos ? close : comma) - open);
    code.replace(at, close + 1 - at, "(" + arg + ")");
  }
  return code;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double seconds_of(Optimizer& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  opt.step();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

bool has_matrix_stage(const Rule& rule) {
  return code_of(rule.text()).find("orthogonalize(") != std::string::npos;
}

void run_matrix_case(benchmark::State& state, const Workload& w, const Rule& rule,
                     const OptimizerOptions& options, const std::string& case_name,
                     const std::string& what) {
  HostModel model(w);
  Optimizer opt(rule, {model.group(0, w.sizes.size())}, options);
  opt.step();     // warm: the state's pages, and the BLAS loaded
  int steps = 5;  // orthogonalize()'s default; the rule's ns_steps where it has one
  for (const auto& hyper : rule.hypers()) {
    if (hyper.first == "ns_steps") steps = static_cast<int>(opt.hyper("ns_steps"));
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> matrices;
  for (std::size_t i = 0; i < w.sizes.size(); ++i) {
    if (i < w.shapes.size() && w.shapes[i].size() >= 2 && w.sizes[i] > 0) {
      matrices.emplace_back(w.shapes[i][0], w.sizes[i] / w.shapes[i][0]);
    }
  }
  GemmFloor floor(matrices, steps);
  floor.seconds(1);  // warm: the BLAS's threads and buffers
  std::vector<double> ratios, step_times, floor_times;
  for (auto _ : state) {
    state.PauseTiming();
    const double floor_seconds = floor.seconds();
    state.ResumeTiming();
    const double seconds = seconds_of(opt);
    ratios.push_back(floor_seconds / std::max(seconds, 1e-12));
    step_times.push_back(seconds);
    floor_times.push_back(floor_seconds);
  }
  Floors f;
  f.fraction = median(ratios);
  f.step_seconds = median(step_times);
  f.floor_seconds = median(floor_times);
  const OptimizerStats s = opt.stats();
  report(state, s, s.launches_per_step, f, case_name,
         what + ", GEMM floor: " + floor.library() +
             (floor.threads() > 0 ? " " + std::to_string(floor.threads()) + " threads" : "") +
             (floor.shared_with_fusedopt() ? "" : " (not the step's: loaded by the floor)"));
  state.counters["gemm_floor_ms"] = f.floor_seconds * 1e3;
  state.counters["step_gflops"] = f.step_seconds > 0 ? floor.flops() / f.step_seconds / 1e9 : 0;
  state.counters["blas_gflops"] = f.floor_seconds > 0 ? floor.flops() / f.floor_seconds / 1e9 : 0;
  state.counters["blas_threads"] = floor.threads();

  // The element-wise part alone: the same rule without its stages, same tensors and options.
  const std::optional<std::string> code = without_stages(code_of(rule.text()));
  if (!code) return;
  try {
    HostModel twin(w);
    Optimizer elementwise(Rule::parse(*code, rule.name() + " without orthogonalize"),
                          {twin.group(0, w.sizes.size())}, options);
    elementwise.step();
    std::vector<double> times;
    for (int r = 0; r < 5; ++r) times.push_back(seconds_of(elementwise));
    const double e = median(times);
    const double iteration = f.step_seconds - e;
    state.counters["elementwise_ms"] = e * 1e3;
    state.counters["iteration_floor_fraction"] = iteration > 0 ? f.floor_seconds / iteration : 0;
    Result r;
    r.case_name = case_name;
    r.what = what + ": the element-wise passes alone (" + rule.name() + " without orthogonalize)";
    r.device = "cpu";
    r.seconds = e;
    r.bytes = elementwise.stats().bytes_per_step;
    r.tensors = elementwise.stats().tensors;
    r.elements = elementwise.stats().elements;
    r.launches = elementwise.stats().launches_per_step;
    for (Result& old : results()) {
      if (old.case_name == r.case_name && old.what == r.what) {
        old = r;
        return;
      }
    }
    results().push_back(r);
  } catch (const Error& e) {
    state.counters["elementwise_ms"] = 0;  // the rule needs its stage (not measured)
  }
}

}  // namespace fusedopt::bench
