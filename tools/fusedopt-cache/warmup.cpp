// fusedopt-cache warmup: rules/presets x targets x dtypes into the cache, in parallel.
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "cli.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/kernel.hpp"
#include "fusedopt/optimizer.hpp"

namespace fusedopt::cli {
namespace {

constexpr const char* kHelp = R"(usage: fusedopt-cache warmup [OPTIONS] [RULE_FILE...]

Compile rules or presets for every target and dtype binding given, into the cache.
Works without a GPU: a CPU build box can fill a cache for any sm_XX.

options:
  --preset NAME     a preset rule, NAME or NAME+OPTION (repeatable; 'all' for every preset)
  --all-presets     every preset, options included
  --rule FILE       a rule file (repeatable; bare arguments are rule files too)
  --target T        host, emu (the CUDA emulator), sm_80, sm_90, sm_90a, ...
                    (repeatable or comma-separated; default: host)
  --dtypes D        PARAM:GRAD:STATE[+master|+sr][+q=Q/Q/...[@B]] or one dtype for all,
                    e.g. fp32, bf16:bf16:fp32+master, bf16+sr (stochastic rounding),
                    fp32+q=q8s/q8u@256 (each state's storage: -, q8s, q8u, q4s, q4u),
                    fp64 (float64 params, grads and states; element-wise rules only)
                    (repeatable or comma-separated; default: fp32); a rule with
                    `storage` declarations (adamw8bit, adamw4bit, ...) is warmed with
                    its quantized binding too, as its params of quant_min_numel
                    elements or more step
  --jobs N          compile N kernels at once (default: the number of cores)
  --json            print the results as JSON
  --cache-dir DIR   the cache folder (default: $FUSEDOPT_CACHE_DIR)
)";

struct Item {
  Rule rule;
  Target target;
  DTypeBinding dtypes;
  // results
  std::string status;  // "compiled", "cached", "failed"
  double seconds = 0;
  std::string key;
  std::string error;
  std::filesystem::path entry;  ///< its disk entry when the cache kept it
  bool bad_input = false;       ///< failed on a bad environment value: the run exits 2
};

class Progress {
 public:
  Progress(std::size_t total, bool enabled) : total_(total), enabled_(enabled) {}
  void update(std::size_t done, const std::string& what) {
    if (!enabled_) return;
    const int width = 30;
    int filled = total_ ? static_cast<int>(width * done / total_) : width;
    fmt::print(stderr, "\r[{}{}] {}/{} {:<40.40}", std::string(filled, '#'),
               std::string(width - filled, '.'), done, total_, what);
    std::fflush(stderr);
  }
  void finish() {
    if (enabled_) fmt::print(stderr, "\r{:<90}\r", "");
  }

 private:
  std::size_t total_;
  bool enabled_;
};

}  // namespace

namespace {

/// The command line of warmup, as given.
struct WarmupArgs {
  std::optional<std::string> cache_dir;
  std::vector<std::string> presets, rule_files, targets, dtypes;
  bool json = false;
  bool help = false;
  unsigned jobs = std::max(1u, std::thread::hardware_concurrency());
};

WarmupArgs parse_warmup_args(Args& args) {
  WarmupArgs w;
  while (!args.done()) {
    if (args.flag("--help") || args.flag("-h")) {
      w.help = true;
      return w;
    }
    if (auto v = args.option("--cache-dir"))
      w.cache_dir = v;
    else if (auto p = args.option("--preset"))
      for (auto& x : split_commas(*p)) w.presets.push_back(x);
    else if (args.flag("--all-presets"))
      w.presets.push_back("all");
    else if (auto r = args.option("--rule"))
      w.rule_files.push_back(*r);
    else if (auto t = args.option("--target"))
      for (auto& x : list_value("--target", *t)) w.targets.push_back(x);
    else if (auto d = args.option("--dtypes"))
      for (auto& x : list_value("--dtypes", *d)) w.dtypes.push_back(x);
    else if (auto j = args.option("--jobs")) {
      try {
        std::size_t used = 0;
        int n = std::stoi(*j, &used);
        // All of it a number: std::stoi alone reads "2abc" as 2.
        if (used != j->size() || !std::isdigit(static_cast<unsigned char>((*j)[0])) || n < 1 ||
            n > 256) {
          throw std::out_of_range("jobs");
        }
        w.jobs = static_cast<unsigned>(n);
      } catch (const std::exception&) {
        throw UsageError{"--jobs needs a number from 1 to 256, got '" + *j + "'"};
      }
    } else if (args.flag("--json"))
      w.json = true;
    else if (args.peek().rfind("-", 0) == 0)
      throw UsageError{"unknown option '" + args.peek() + "'"};
    else
      w.rule_files.push_back(args.next());
  }
  if (w.presets.empty() && w.rule_files.empty()) {
    throw UsageError{"nothing to warm: give --preset NAME, --all-presets or rule files"};
  }
  if (w.targets.empty()) w.targets.push_back("host");
  if (w.dtypes.empty()) w.dtypes.push_back("fp32");
  return w;
}

/// Every rule x target x dtype binding, parsed and checked before anything compiles: bad
/// input exits 2 early.
std::vector<Item> expand_items(const WarmupArgs& w) {
  std::vector<Rule> rules;
  for (const std::string& p : w.presets) {
    if (p == "all") {
      for (const std::string& name : Rule::presets()) rules.push_back(Rule::preset(name));
    } else {
      try {
        rules.push_back(Rule::preset(p));
      } catch (const fusedopt::UsageError& e) {
        throw UsageError{e.what()};
      }
    }
  }
  for (const std::string& f : w.rule_files) rules.push_back(Rule::parse(read_rule_file(f), f));
  std::vector<Target> targets;
  std::vector<DTypeBinding> dtypes;
  try {
    for (const std::string& t : w.targets) targets.push_back(Target::parse(t));
    for (const std::string& d : w.dtypes) dtypes.push_back(DTypeBinding::parse(d));
  } catch (const Error& e) {
    throw UsageError{e.what()};
  }
  std::vector<Item> items;
  for (const auto& rule : rules) {
    for (const Target& t : targets) {
      for (const DTypeBinding& d : dtypes) {
        items.push_back({rule, t, d, "", 0, "", "", {}, false});
        // A rule with `storage` declarations (adamw8bit, ...): its params of
        // quant_min_numel elements or more step in the quantized binding.
        if (auto q = quantized_binding(rule, d))
          items.push_back({rule, t, *q, "", 0, "", "", {}, false});
      }
    }
  }
  return items;
}

/// Gets one item's kernel into the cache. Never throws: every failure is the item's.
void warm_one(Item& it, const CompileOptions& options) {
  try {
    const CompiledKernel k = compile_kernel(it.rule, it.target, it.dtypes, options);
    it.status = k.origin == "compiled" ? "compiled" : "cached";
    it.seconds = k.seconds;
    it.key = k.key;
    it.entry = k.disk_entry;
    // Filling the cache is warmup's only job: a kernel the disk did not keep is a
    // failure (the library itself carries on without its disk tier).
    if (k.disk_entry.empty()) {
      it.error = it.status + " but not stored in the cache: " +
                 (k.cache_note.empty() ? "the cache did not say why" : k.cache_note);
      it.status = "failed";
    }
  } catch (const fusedopt::UsageError& e) {
    // A bad FUSEDOPT_HOST_CXX or FUSEDOPT_COMPILE_TIMEOUT (the messages start with the
    // variable's name) is the same for every kernel: bad input. Any other (a dtype binding
    // this rule cannot take) fails this kernel only.
    const std::string what = e.what();
    it.status = "failed";
    it.error = what;
    it.bad_input =
        what.rfind("FUSEDOPT_HOST_CXX=", 0) == 0 || what.rfind("FUSEDOPT_COMPILE_TIMEOUT=", 0) == 0;
  } catch (const Error& e) {
    it.status = "failed";
    it.error = e.what();
  } catch (const std::exception& e) {
    // Nothing may escape a worker thread (std::terminate).
    it.status = "failed";
    it.error = std::string("unexpected error: ") + e.what();
  } catch (...) {
    it.status = "failed";
    it.error = "unexpected error";
  }
}

/// Warms every item on `jobs` threads, printing each result as it lands (unless JSON).
void warm_all(std::vector<Item>& items, const CompileOptions& options, unsigned jobs, bool json) {
  Progress progress(items.size(), !json && isatty(STDERR_FILENO));
  std::mutex out_mutex;
  std::atomic<std::size_t> next{0}, done{0};
  auto worker = [&] {
    for (std::size_t i; (i = next++) < items.size();) {
      Item& it = items[i];
      warm_one(it, options);
      std::lock_guard<std::mutex> lock(out_mutex);
      ++done;
      if (it.bad_input) {
        next = items.size();  // bad input, not a failed kernel: stop, cmd_warmup exits 2
        continue;
      }
      if (!json) {
        progress.finish();
        fmt::print("{:<9} {:<12} {:<7} {:<22} {:>8.3f} s  {}\n", it.status, it.rule.name(),
                   it.target.str(), it.dtypes.str(), it.seconds, it.key.substr(0, 12));
        if (!it.error.empty()) fmt::print(stderr, "{}\n", it.error);
        std::fflush(stdout);
        progress.update(done, it.rule.name() + " " + it.target.str());
      }
    }
  };
  std::vector<std::thread> threads;
  for (unsigned j = 1; j < std::min<std::size_t>(jobs, items.size()); ++j)
    threads.emplace_back(worker);
  worker();
  for (auto& t : threads) t.join();
  progress.finish();
}

/// Fails each warmed item whose entry is no longer a good file in `store`: one stored early
/// can be evicted by a later store's prune (FUSEDOPT_CACHE_MAX_BYTES below the warm set).
void recheck(std::vector<Item>& items, const cache::DiskStore& store, bool json) {
  for (Item& it : items) {
    const std::optional<cache::Key> key = cache::Key::from_hex(it.key);
    if (it.status == "failed" || !key || it.entry.empty()) continue;
    const std::string problem = store.entry_problem(*key, it.entry.extension().string().substr(1));
    if (problem.empty()) continue;
    it.status = "failed";
    it.error = "stored, then no longer in the cache at the end of warmup: " + problem;
    if (!json) {
      fmt::print("{:<9} {:<12} {:<7} {:<22} {:>8.3f} s  {}\n", it.status, it.rule.name(),
                 it.target.str(), it.dtypes.str(), it.seconds, it.key.substr(0, 12));
      fmt::print(stderr, "{}\n", it.error);
    }
  }
}

/// The summary, as text or JSON; returns the number of failed items.
std::size_t report(const std::vector<Item>& items, const std::string& cache_dir, double wall,
                   bool json) {
  std::size_t compiled = 0, cached = 0, failed = 0;
  double compile_seconds = 0;
  for (const Item& it : items) {
    if (it.status == "compiled") {
      ++compiled;
      compile_seconds += it.seconds;
    } else if (it.status == "cached") {
      ++cached;
    } else {
      ++failed;
    }
  }
  if (json) {
    std::string out = "{\"kernels\": [";
    for (std::size_t i = 0; i < items.size(); ++i) {
      const Item& it = items[i];
      out += fmt::format(
          "{}\n  {{\"rule\": {}, \"target\": {}, \"dtypes\": {}, \"status\": {}, "
          "\"seconds\": {:.6f}, \"key\": {}, \"error\": {}}}",
          i ? "," : "", json_string(it.rule.name()), json_string(it.target.str()),
          json_string(it.dtypes.str()), json_string(it.status), it.seconds, json_string(it.key),
          json_string(it.error));
    }
    out += fmt::format(
        "\n], \"compiled\": {}, \"cached\": {}, \"failed\": {}, "
        "\"compile_seconds\": {:.6f}, \"wall_seconds\": {:.6f}, \"cache_dir\": {}}}\n",
        compiled, cached, failed, compile_seconds, wall, json_string(cache_dir));
    fmt::print("{}", out);
  } else {
    fmt::print(
        "warmup: {} {} in {:.2f} s: {} compiled ({:.2f} s of compiling), {} already "
        "cached, {} failed\ncache: {}\n",
        items.size(), items.size() == 1 ? "kernel" : "kernels", wall, compiled, compile_seconds,
        cached, failed, cache_dir);
  }
  return failed;
}

}  // namespace

int cmd_warmup(Args& args) {
  const WarmupArgs w = parse_warmup_args(args);
  if (w.help) {
    std::fputs(kHelp, stdout);
    std::fputs(kExitCodesHelp, stdout);
    return kExitOk;
  }
  return json_errors(w.json, [&] {
    std::vector<Item> items = expand_items(w);
    CompileOptions options;
    // On disk, whatever FUSEDOPT_CACHE says; an unusable folder is refused before compiling.
    const cache::DiskStore store = open_store(w.cache_dir, true);
    options.cache_dir = store.dir();
    const auto start = std::chrono::steady_clock::now();
    warm_all(items, options, w.jobs, w.json);
    for (const Item& it : items) {
      if (it.bad_input) throw UsageError{it.error};
    }
    recheck(items, store, w.json);
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return report(items, options.cache_dir.string(), wall, w.json) ? kExitFailed : kExitOk;
  });
}

}  // namespace fusedopt::cli
