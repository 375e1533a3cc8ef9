// fusedopt-bench's command line: its own options and help (workloads, rules, device, mode,
// --json), then Google Benchmark's flags; its own console header (the machine and the
// fusedopt version, without Debian's Google Benchmark's note that it was built for
// debugging, which is about that library, not about fusedopt); --json writes every step's
// result in bench/torch_step.py's schema.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "fusedopt/dtype.hpp"
#include "fusedopt/kernel.hpp"
#include "fusedopt/version.hpp"
#include "harness.hpp"
#include "step_timing.hpp"
#include "workloads.hpp"

namespace fb = fusedopt::bench;

namespace {

const char* const kHelp = R"(fusedopt-bench: fusedopt's optimizer-step harness.

Each case times an optimizer step over a model's parameter shapes and reports it against
floors measured in the same run: the in-place floor (the bytes the step moves, per pass,
streamed in place by a loop compiled like the kernels: what the step could at best take on
this machine's memory) and a plain copy of the same bytes. A floor_fraction above 1 means
the floor is wrong, not that the step beats memory.

Usage:
  fusedopt-bench                        every built-in benchmark (AdamW fused and one launch
                                        per tensor, every preset, state memory, compiles)
  fusedopt-bench --workload W [--preset P | --rule FILE]... [--device D] [--mode M]
                                        a case of your own
  fusedopt-bench --list                 the workloads and presets

Options:
  --workload W       bert-base (201 tensors, 109.5 M elements), gpt2-small (148, 124.4 M),
                     gpt2-small-matrices (its 48 hidden matrices, 84.9 M: for muon),
                     small-5000 (5,000 tensors of 1-64 K elements), or a shapes file:
                     {"name": "m", "tensors": [{"name": "wte", "shape": [50257, 768],
                                                "dtype": "bf16"}, ...]}  (dtype: fp32 when
                     not given; fp16, bf16, fp64)
  --preset P         a preset rule (repeatable; default adamw)
  --rule FILE        a rule file (repeatable)
  --device D         host (default) or cuda (device 0; no floor is measured there)
  --mode M           fused (default: one optimizer, one launch per pass), per-tensor (one
                     optimizer per tensor, the loop torch's foreach=False makes), or both
  --state-dtype T    OptimizerOptions::state_dtype (fp32, bf16, fp16)
  --storage S        every state's storage (q8, q8s, q8u, q4, ...: OptimizerOptions::state_storage)
  --master-weights   keep fp32 master copies of 16-bit params
  --matrix-precision T
                     OptimizerOptions::matrix_precision: fp32 (default) or bf16 (the
                     Newton-Schulz iteration rounded to bf16 as torch.optim.Muon runs it)
  --json FILE        also write every step's result there (bench/torch_step.py's schema:
                     machine, results[case, what, device, seconds, floor_seconds,
                     copy_seconds, bytes, tensors, elements, launches])
  --help             this text, then Google Benchmark's flags

A rule with orthogonalize() (muon) is measured against its GEMM floor instead: the
Newton-Schulz iteration's GEMMs alone, on the same shapes, through the BLAS the step loaded
(floor_fraction: GEMM floor / step; gemm_floor_ms, step_gflops, blas_gflops, blas_threads;
elementwise_ms: the same rule with orthogonalize(x, ...) replaced by x, and
iteration_floor_fraction: the floor over the step less that). Three steps (seconds each).

Counters (per step; none has a unit but bytes_per_second):
  floor_fraction     in-place floor time / step time, the median over the iterations (each
                     step timed right after a floor run: the memory's speed drifts)
  copy_fraction      copy time / step time (a copy pays write-allocate: no floor)
  launches           kernel launches per step; tensors: the tensors it steps
  bytes_per_second   the bytes the step must move (stats().bytes_per_step) per second

Examples:
  fusedopt-bench --workload gpt2-small --preset adamw --preset adamw8bit --mode both
  fusedopt-bench --workload my_model.json --rule my.rule --json out.json
  fusedopt-bench --workload gpt2-small-matrices --preset muon
  fusedopt-bench --benchmark_filter=BM_HostPresetStep/lion --benchmark_min_time=2

Google Benchmark's flags:
)";

void print_help() {
  std::fputs(kHelp, stdout);
  benchmark::PrintDefaultHelp();
}

/// The console reporter with fusedopt's own header.
class Reporter : public benchmark::ConsoleReporter {
 public:
  using ConsoleReporter::ConsoleReporter;
  bool ReportContext(const Context& context) override {
    name_field_width_ = context.name_field_width;
    printed_header_ = false;
    prev_counters_.clear();
    const benchmark::CPUInfo& cpu = context.cpu_info;
    std::cerr << "fusedopt " << FUSEDOPT_VERSION_STRING << " on " << cpu.num_cpus << " CPUs ("
              << cpu.cycles_per_second / 1e6 << " MHz), " << context.sys_info.name << "\n";
    return true;
  }
};

struct Args {
  fb::UserCase user;
  bool user_case = false, list = false, help = false;
  std::string json;
};

/// Takes fusedopt-bench's own options out of argv (Google Benchmark's stay).
Args take_args(int& argc, char** argv) {
  Args a;
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      const std::size_t eq = arg.find('=');
      if (eq != std::string::npos) return arg.substr(eq + 1);
      if (i + 1 >= argc) throw std::runtime_error(arg + " needs a value");
      return argv[++i];
    };
    const std::string key = arg.substr(0, arg.find('='));
    if (key == "--help" || key == "-h") {
      a.help = true;
    } else if (key == "--list") {
      a.list = true;
    } else if (key == "--workload") {
      a.user.workload = value();
      a.user_case = true;
    } else if (key == "--preset" || key == "--rule") {
      a.user.rules.push_back(value());
    } else if (key == "--device") {
      a.user.device = value();
    } else if (key == "--mode") {
      a.user.mode = value();
    } else if (key == "--state-dtype") {
      const std::string t = value();
      bool known = false;
      for (fusedopt::DType d :
           {fusedopt::DType::F32, fusedopt::DType::BF16, fusedopt::DType::F16}) {
        if (t == fusedopt::to_string(d)) {
          a.user.options.state_dtype = d;
          known = true;
        }
      }
      if (!known) throw std::runtime_error("--state-dtype " + t + ": give fp32, bf16 or fp16");
    } else if (key == "--storage") {
      a.user.options.state_storage = {{"*", value()}};
    } else if (key == "--matrix-precision") {
      const std::string t = value();
      if (t != "fp32" && t != "bf16") {
        throw std::runtime_error("--matrix-precision " + t + ": give fp32 or bf16");
      }
      a.user.options.matrix_precision = t == "bf16" ? fusedopt::DType::BF16 : fusedopt::DType::F32;
    } else if (key == "--master-weights") {
      a.user.options.master_weights = true;
    } else if (key == "--json") {
      a.json = value();
    } else {
      rest.push_back(argv[i]);
    }
  }
  if (!a.user_case &&
      (!a.user.rules.empty() || a.user.device != "host" || a.user.mode != "fused")) {
    throw std::runtime_error(
        "--preset, --rule, --device and --mode describe a case: give "
        "--workload too");
  }
  argc = static_cast<int>(rest.size());
  for (int i = 0; i < argc; ++i) argv[i] = rest[static_cast<std::size_t>(i)];
  return a;
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out + "\"";
}

/// The results as bench/torch_step.py writes its own: {"machine": ..., "results": [...]}.
void write_json(const std::string& path) {
  char date[16];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  const benchmark::CPUInfo& cpu = benchmark::CPUInfo::Get();
  std::ofstream out(path + ".tmp");
  out << "{\n  \"machine\": {\"device\": " << quoted(benchmark::SystemInfo::Get().name)
      << ", \"cpus\": " << cpu.num_cpus << ", \"fusedopt\": " << quoted(FUSEDOPT_VERSION_STRING)
      << ", \"date\": " << quoted(date) << "},\n  \"results\": [";
  const std::vector<fb::Result>& all = fb::results();
  for (std::size_t i = 0; i < all.size(); ++i) {
    const fb::Result& r = all[i];
    out << (i ? "," : "") << "\n    {\"case\": " << quoted(r.case_name)
        << ", \"what\": " << quoted(r.what) << ", \"device\": " << quoted(r.device)
        << ", \"seconds\": " << r.seconds << ", \"floor_seconds\": " << r.floor_seconds
        << ", \"copy_seconds\": " << r.copy_seconds << ", \"bytes\": " << r.bytes
        << ", \"tensors\": " << r.tensors << ", \"elements\": " << r.elements
        << ", \"launches\": " << r.launches << "}";
  }
  out << "\n  ]\n}\n";
  out.close();
  if (!out || std::rename((path + ".tmp").c_str(), path.c_str()) != 0) {
    throw std::runtime_error("cannot write " + path);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--probe-disk-hit")
    return fb::probe_compile_disk_hit(argv[2], argv[3]);
  try {
    Args args = take_args(argc, argv);
    if (args.help) {
      print_help();
      return 0;
    }
    if (args.list) {
      std::cout << "workloads:";
      for (const std::string& w : fb::workload_names()) std::cout << " " << w;
      std::cout << "\npresets:";
      for (const std::string& p : fusedopt::Rule::presets()) std::cout << " " << p;
      std::cout << "\n";
      return 0;
    }
    std::string filter;
    if (args.user_case) filter = fb::register_user_case(args.user);
    fb::register_compile_benchmarks();
    benchmark::Initialize(&argc, argv, print_help);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
    Reporter reporter(isatty(1) ? benchmark::ConsoleReporter::OO_ColorTabular
                                : benchmark::ConsoleReporter::OO_Tabular);
    // A case of one's own runs alone unless --benchmark_filter says otherwise.
    bool filtered = false;
    for (int i = 1; i < argc; ++i) filtered |= std::strncmp(argv[i], "--benchmark_filter", 18) == 0;
    if (!filter.empty() && !filtered) {
      benchmark::RunSpecifiedBenchmarks(&reporter, filter);
    } else {
      benchmark::RunSpecifiedBenchmarks(&reporter);
    }
    benchmark::Shutdown();
    fb::remove_compile_dir();
    if (!args.json.empty()) write_json(args.json);
  } catch (const std::exception& e) {
    std::cerr << "fusedopt-bench: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
