// fusedopt-zero-bench: one data-parallel AdamW step of BERT-base (201 tensors, 109.5 M fp32
// in a FlatArena) under mpirun, three ways, each timed whole (communication and the
// optimizer step together):
//   dp     GradBucketer (25 MiB buckets) + Optimizer::step_scaled over every parameter: every
//          rank holds the whole optimizer state;
//   zero1  ShardedOptimizer stage 1: gradients all-reduced, state sharded, parameters
//          broadcast back by their owners;
//   zero2  ShardedOptimizer stage 2: each gradient bucket reduced to its owner only.
// With shared memory, dp, zero1 and zero2 run again ("_shbuf") with the gradients and
// params in Communicator::allocate_shared buffers: reduced and broadcast in place, no copies.
// Two rows without communication tell the compute apart: the step alone over every
// parameter (dp's), and over this rank's 1/n shard (what each ZeRO rank steps).
// Each variant reports its time, its optimizer state per rank, its collectives and the bytes
// a rank moves per step (formulas in the report), with the minor page faults of a step.
//
// A plain timing loop, as in fusedopt-comm-bench: an iteration is a collective step of every
// rank, from a barrier to the slowest rank's end (the max over ranks), with the gradients
// refilled (untimed) before each. 109.5 M fp32 parameters, gradients and AdamW state are
// 1.75 GB a rank, so ONE variant lives at a time: built, run for every iteration, freed.
// The first step of each variant starts from the same parameters (rank-independent) and
// the same rank-dependent gradients and is checked: every rank must hold the same bits, and
// zero1 must equal dp bit for bit and zero2 within 1e-6 (the gradients are multiples of
// 2^-16 whose sums are exact in any order, so zero2 is expected to match bitwise too); exit
// 1 otherwise, on every rank. The program uses only fusedopt's public API.
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/bench_support.hpp"
#include "fusedopt/comm.hpp"
#include "fusedopt/optimizer.hpp"
#include "fusedopt/sharded.hpp"
#include "workloads.hpp"

using fusedopt::DType;
using fusedopt::FlatArena;
using fusedopt::Optimizer;
using fusedopt::ParamGroup;
using fusedopt::Rule;
using fusedopt::Tensor;
using fusedopt::comm::Communicator;
using fusedopt::comm::GradBucketer;
using fusedopt::comm::ReduceOp;
using fusedopt::comm::ShardedOptimizer;
using fusedopt::comm::ShardOptions;
using fusedopt::comm::ShardStats;

namespace {

using fusedopt_bench::Args;
using fusedopt_bench::json_string;
using fusedopt_bench::minor_faults;
using fusedopt_bench::proc_field;
using fusedopt_bench::summarize;
using fusedopt_bench::Summary;

constexpr const char* kUsage =
    "usage: fusedopt-zero-bench [--iters N] [--warmup N] [--scale F] [--json FILE]\n"
    "  run under mpirun; --scale multiplies every BERT-base tensor's size (at least one\n"
    "  element each; 0.01 is a 4.4 MB smoke test); rank 0 prints the table and writes FILE";

/// Element k of the model (over every parameter, in order) before the first step, the same
/// on every rank: in [0.5, 1.5).
float param_value(std::int64_t k) {
  return 0.5f + static_cast<float>((k * 2654435761LL) % 1000) / 1000.0f;
}

/// Rank r's gradient of element k: a multiple of 2^-16 in [-1023, 1023] x 2^-16, so that
/// sums over up to 16 ranks are exact in fp32 in any order (the all-reduce and the reduce
/// to an owner give the same bits).
float grad_value(std::int64_t k, int rank) {
  return static_cast<float>((k * 7919 + static_cast<std::int64_t>(rank) * 104729) % 2047 - 1023) /
         65536.0f;
}

/// Parameters and gradients of the workload in one FlatArena (one buffer each, in order).
struct Model {
  FlatArena arena;
  std::vector<Tensor> params, grads;
  /// `grad_memory`, `param_memory`: where they go (FlatArena::finalize), null for the
  /// arena's own memory.
  Model(const std::vector<std::int64_t>& sizes,
        const std::function<void*(std::size_t)>& grad_memory,
        const std::function<void*(std::size_t)>& param_memory) {
    for (std::size_t i = 0; i < sizes.size(); ++i)
      arena.add("w" + std::to_string(i), sizes[i], DType::F32);
    arena.finalize(grad_memory, param_memory);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      params.push_back(arena.param(i));
      grads.push_back(arena.grad(i));
    }
  }
  template <class Value>
  static void fill(const std::vector<Tensor>& ts, Value value) {
    std::int64_t k0 = 0;
    for (const Tensor& t : ts) {
      float* d = static_cast<float*>(t.data);
      for (std::int64_t k = 0; k < t.numel; ++k) d[k] = value(k0 + k);
      k0 += t.numel;
    }
  }
  void fill_params() { fill(params, param_value); }
  void fill_grads(int rank) {
    fill(grads, [rank](std::int64_t k) { return grad_value(k, rank); });
  }
  std::vector<ParamGroup> groups() const { return {ParamGroup{params, grads, {}}}; }
};

/// One row of the table.
struct Row {
  std::string name;
  std::string description;
  bool communicates = true;        ///< false: a reference row (the step alone)
  std::int64_t collectives = 0;    ///< per step
  std::string collectives_detail;  ///< what they are
  double state_bytes = 0;          ///< optimizer state, the most of a rank
  double comm_bytes = 0;           ///< sent (= received, on average) by a rank per step
  std::string comm_formula;        ///< how comm_bytes is computed
  std::vector<double> seconds;     ///< per timed iteration: the slowest rank's time
  std::vector<double> faults;      ///< per timed iteration: the most minor faults of a rank
};

Row make_row(std::string name, std::string description) {
  Row r;
  r.name = std::move(name);
  r.description = std::move(description);
  return r;
}

/// The largest value of `v` over ranks.
double max_over_ranks(Communicator& comm, double v) {
  comm.all_reduce(&v, 1, ReduceOp::Max).wait();
  return v;
}

/// One collective step `step` (returns whether the optimizer took it), timed from a barrier
/// to the slowest rank's end; kept in `row` when `keep`.
void time_step(Communicator& comm, Row& row, bool keep, const std::function<bool()>& step) {
  comm.barrier().wait();
  const double faults0 = minor_faults();
  const auto t0 = std::chrono::steady_clock::now();
  const bool taken = step();
  double cost[3] = {std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                    minor_faults() - faults0, taken ? 0.0 : 1.0};
  comm.all_reduce(cost, 3, ReduceOp::Max).wait();
  if (cost[2] != 0) throw std::runtime_error(row.name + ": the optimizer skipped a step");
  if (keep) {
    row.seconds.push_back(cost[0]);
    row.faults.push_back(cost[1]);
  }
}

/// A 64-bit hash of the parameters' bits (FNV-1a over 32-bit words).
std::uint64_t hash_params(const std::vector<Tensor>& params) {
  std::uint64_t h = 1469598103934665603ull;
  for (const Tensor& t : params) {
    const auto* w = static_cast<const std::uint32_t*>(t.data);
    for (std::int64_t k = 0; k < t.numel; ++k) h = (h ^ w[k]) * 1099511628211ull;
  }
  return h;
}

/// Whether every rank holds the same parameter bits (the same answer on every rank).
bool replicas_identical(Communicator& comm, const std::vector<Tensor>& params) {
  const std::uint64_t h = hash_params(params);
  const auto hi = static_cast<double>(h >> 32), lo = static_cast<double>(h & 0xffffffffu);
  double v[4] = {hi, lo, -hi, -lo};  // max and -min: equal everywhere iff max == min
  comm.all_reduce(v, 4, ReduceOp::Max).wait();
  return v[0] == -v[2] && v[1] == -v[3];
}

/// The first step of a variant against dp's: elements whose bits differ, and the largest
/// |a - b| / max(|b|, 1) (the most of a rank; the same on every rank).
struct Diff {
  double differing = 0;
  double worst = 0;
};

Diff compare(Communicator& comm, const std::vector<Tensor>& params,
             const std::vector<float>& reference) {
  Diff d;
  std::size_t k0 = 0;
  for (const Tensor& t : params) {
    const float* a = static_cast<const float*>(t.data);
    for (std::int64_t k = 0; k < t.numel; ++k) {
      const float b = reference[k0 + static_cast<std::size_t>(k)];
      if (std::memcmp(&a[k], &b, sizeof b) == 0) continue;
      d.differing += 1;
      const double rel = std::fabs(static_cast<double>(a[k]) - static_cast<double>(b)) /
                         std::max(1.0, std::fabs(static_cast<double>(b)));
      d.worst = std::max(d.worst, std::isnan(rel) ? HUGE_VAL : rel);
    }
    k0 += static_cast<std::size_t>(t.numel);
  }
  double v[2] = {d.differing, d.worst};
  comm.all_reduce(v, 2, ReduceOp::Max).wait();
  return {v[0], v[1]};
}

int run(const Args& args) {
  Communicator comm = Communicator::mpi();
  const int ranks = comm.size();
  const int rank = comm.rank();
  const bool root = rank == 0;

  fusedopt::bench::Workload w = fusedopt::bench::bert_base();
  for (std::int64_t& s : w.sizes) {
    s = std::max<std::int64_t>(1, std::llround(static_cast<double>(s) * args.scale));
  }
  const std::int64_t elements = w.elements();
  const double bytes = static_cast<double>(elements) * sizeof(float);
  const int params = static_cast<int>(w.sizes.size());
  const double n = ranks;

  // The copy floor, measured by rank 0 alone while the others wait in a barrier (which
  // polls with sleeps: they leave the cores to it), before any variant holds memory.
  double copy_bw = 0;
  if (root) copy_bw = fusedopt::bench::copy_bandwidth(static_cast<std::size_t>(bytes));
  comm.barrier().wait();

  const Rule adamw = Rule::preset("adamw");
  const float average = 1.0f / static_cast<float>(ranks);
  std::vector<float> reference(static_cast<std::size_t>(elements));  // dp's first step
  std::vector<Row> rows;
  std::vector<std::string> checks, plans;
  bool ok = true;
  const int total = args.warmup + args.iters;

  // The step alone (no communication) of an optimizer that already exists.
  auto time_alone = [&](Model& m, Optimizer& opt, Row row) {
    row.communicates = false;
    row.collectives_detail = "none";
    row.comm_formula = "0";
    for (int it = 0; it < total; ++it) {
      m.fill_grads(rank);
      time_step(comm, row, it >= args.warmup, [&] { return opt.step_scaled(average); });
    }
    row.state_bytes = max_over_ranks(comm, static_cast<double>(opt.stats().state_bytes));
    return row;
  };

  // The gradients in the arena's own memory, then (with shared memory) in one shared buffer
  // allocated once and reused by each variant: all-reduced and reduced in place.
  // Two shared buffers (gradients, params), each allocated once and reused by every variant.
  struct Shared {
    void* data = nullptr;
    std::size_t bytes = 0;
  } shared[2];
  auto in_shared = [&comm](Shared& s) {
    return [&comm, &s](std::size_t b) {
      if (s.data == nullptr) s = {comm.allocate_shared(b), b};
      if (b > s.bytes) throw std::runtime_error("a shared buffer is too small");
      return s.data;
    };
  };
  const bool has_shm = comm.transport().find("shared memory:") != std::string::npos;
  for (int memory = 0; memory < (has_shm ? 2 : 1); ++memory) {
    const std::string suffix = memory == 0 ? "" : "_shbuf";
    std::function<void*(std::size_t)> grad_memory, param_memory;
    if (memory == 1) {
      grad_memory = in_shared(shared[0]);
      param_memory = in_shared(shared[1]);
    }
    const std::string where =
        memory == 0 ? ""
                    : " (gradients and params in shared buffers: reduced and broadcast in "
                      "place, no copies)";
    // (a) data parallel.
    {
      Model m(w.sizes, grad_memory, param_memory);
      m.fill_params();
      Optimizer opt(adamw, m.groups());
      GradBucketer bucketer(comm, m.grads);  // default options: 25 MiB buckets, first 1 MiB
      Row row = make_row(
          "dp" + suffix,
          "data parallel: GradBucketer (25 MiB buckets, first 1 MiB), mark_ready in reverse "
          "order, finish(), Optimizer::step_scaled(grad_scale()) over every parameter" +
              where);
      for (int it = 0; it < total; ++it) {
        m.fill_grads(rank);
        const std::int64_t before = bucketer.collectives();
        time_step(comm, row, it >= args.warmup, [&] {
          for (int i = params - 1; i >= 0; --i) bucketer.mark_ready(i);
          bucketer.finish();
          return opt.step_scaled(bucketer.grad_scale());
        });
        row.collectives = bucketer.collectives() - before;  // what it started, not its layout
        if (it == 0 && memory == 0) {
          std::size_t k0 = 0;
          for (const Tensor& t : m.params) {
            std::memcpy(reference.data() + k0, t.data, static_cast<std::size_t>(t.numel) * 4);
            k0 += static_cast<std::size_t>(t.numel);
          }
        }
        if (it == 0) {
          const bool same = replicas_identical(comm, m.params);
          const Diff d = compare(comm, m.params, reference);
          checks.push_back(fmt::format("{}: replicas {}; against dp {} of {} elements differ: {}",
                                       row.name, same ? "identical" : "DIFFER", d.differing,
                                       elements, d.differing == 0 ? "ok" : "WRONG"));
          ok = ok && same && d.differing == 0;
        }
      }
      const double g = static_cast<double>(bucketer.stats().bytes_per_step);
      row.collectives_detail = fmt::format("{} all-reduces", row.collectives);
      row.state_bytes = max_over_ranks(comm, static_cast<double>(opt.stats().state_bytes));
      row.comm_bytes = 2 * (n - 1) / n * g;
      row.comm_formula =
          fmt::format("2(n-1)/n x G, G = {} (gradients all-reduced)", static_cast<std::int64_t>(g));
      plans.push_back(row.name + ": " + bucketer.report());
      rows.push_back(std::move(row));
      if (memory == 0)
        rows.push_back(
            time_alone(m, opt,
                       make_row("step_full",
                                "reference: Optimizer::step_scaled(1/n) over every parameter, "
                                "no communication (the compute of dp)")));
    }

    // (b), (c) ZeRO-1 and ZeRO-2.
    for (const int stage : {1, 2}) {
      Model m(w.sizes, grad_memory, param_memory);
      m.fill_params();
      ShardOptions options;
      options.stage = stage;
      ShardedOptimizer zero(comm, adamw, m.groups(), options);
      Row row = make_row(
          fmt::format("zero{}{}", stage, suffix),
          std::string(stage == 1
                          ? "ZeRO-1: ShardedOptimizer stage 1 (gradients all-reduced in 25 MiB "
                            "buckets, state sharded, parameters broadcast by their owners), "
                            "mark_ready in reverse order, step()"
                          : "ZeRO-2: ShardedOptimizer stage 2 (each 25 MiB gradient bucket reduced "
                            "to its owner, state sharded, parameters broadcast by their owners), "
                            "mark_ready in reverse order, step()") +
              where);
      for (int it = 0; it < total; ++it) {
        m.fill_grads(rank);
        time_step(comm, row, it >= args.warmup, [&] {
          for (int i = params - 1; i >= 0; --i) zero.mark_ready(i);
          return zero.step();
        });
        if (it == 0) {
          const bool same = replicas_identical(comm, m.params);
          const Diff d = compare(comm, m.params, reference);
          const bool equal = stage == 1 ? d.differing == 0 : d.worst <= 1e-6;
          checks.push_back(
              fmt::format("{}: replicas {}; against dp {} of {} elements differ bitwise, largest "
                          "|a-b|/max(|b|,1) "
                          "{:.3g} (must be {}): {}",
                          row.name, same ? "identical" : "DIFFER", d.differing, elements, d.worst,
                          stage == 1 ? "bitwise equal" : "<= 1e-6", equal ? "ok" : "WRONG"));
          ok = ok && same && equal;
        }
      }
      const ShardStats s = zero.stats();
      const double g = static_cast<double>(s.gradient_bytes);
      const double p = static_cast<double>(s.parameter_bytes);
      // The scaled step's grad check: one float64 all-reduce of a max (AdamW has no
      // reduction passes, so the reduction hook has nothing else to combine).
      const int hook_collectives = s.local.reduction_passes == 0 ? 1 : -1;
      if (hook_collectives < 0) throw std::runtime_error("AdamW with reduction passes?");
      row.collectives = s.reduce_collectives + s.gather_collectives + hook_collectives;
      row.collectives_detail = fmt::format(
          "{} gradient {} + {} parameter broadcasts + 1 float64 all-reduce (grad check)",
          s.reduce_collectives, stage == 1 ? "all-reduces" : "reduces to owners",
          s.gather_collectives);
      row.state_bytes = max_over_ranks(comm, static_cast<double>(s.state_bytes));
      row.comm_bytes = (stage == 1 ? 2 : 1) * (n - 1) / n * g + (n - 1) / n * p;
      row.comm_formula = fmt::format(
          "{}(n-1)/n x G + (n-1)/n x P, G = ShardStats::gradient_bytes = {}, P = "
          "ShardStats::parameter_bytes = {}",
          stage == 1 ? "2" : "", static_cast<std::int64_t>(g), static_cast<std::int64_t>(p));
      plans.push_back(fmt::format("{}: {}", row.name, s.report));
      rows.push_back(std::move(row));
      if (stage == 2 && memory == 0) {
        // The step alone over this rank's shard: a plain optimizer over views of the pieces
        // the sharded one owns (its own state; the sharded one's stays alive beside it).
        ParamGroup shard;
        for (int i = 0; i < params; ++i) {
          const std::pair<std::int64_t, std::int64_t> range = zero.owned_range(i);
          if (range.first == range.second) continue;
          const auto piece = [&range](Tensor t) {
            t.data = static_cast<float*>(t.data) + range.first;
            t.numel = range.second - range.first;
            return t;
          };
          shard.params.push_back(piece(m.params[static_cast<std::size_t>(i)]));
          shard.grads.push_back(piece(m.grads[static_cast<std::size_t>(i)]));
        }
        Optimizer local(adamw, {shard});
        rows.push_back(
            time_alone(m, local,
                       make_row("step_shard",
                                "reference: Optimizer::step_scaled(1/n) over this rank's 1/n "
                                "shard, no communication (the compute of zero1 and zero2)")));
      }
    }
  }
  // Peak resident memory of the run (kB in /proc/self/status), the most of a rank.
  const double peak_rss =
      max_over_ranks(comm, std::atof(proc_field("/proc/self/status", "VmHWM").c_str()) * 1024.0);
  if (!ok) {
    if (root) {
      for (const std::string& c : checks)
        std::fprintf(stderr, "fusedopt-zero-bench: %s\n", c.c_str());
      std::fprintf(stderr, "fusedopt-zero-bench: wrong result\n");
    }
    return 1;
  }
  if (!root) return 0;

  // The report, rows in this order: the three variants, then the references.
  std::stable_partition(rows.begin(), rows.end(), [](const Row& r) { return r.communicates; });
  const std::string cpu = proc_field("/proc/cpuinfo", "model name");
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const double mem_gib = std::atof(proc_field("/proc/meminfo", "MemTotal").c_str()) / 1048576.0;
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const std::string threads = omp != nullptr ? omp : "unset";
  const std::string compiler =
#if defined(__clang__)
      std::string("clang++ ") + __clang_version__;
#elif defined(__GNUC__)
      std::string("g++ ") + __VERSION__;
#else
      "unknown";
#endif
  const double dp_median = summarize(rows.front().seconds).median;
  fmt::print(
      "fusedopt-zero-bench: AdamW over {} ({} tensors, {} fp32 = {:.4g} MB of parameters), {} "
      "ranks, {}\n",
      w.name, w.sizes.size(), elements, bytes / 1e6, ranks, comm.transport());
  fmt::print("machine: {}, {} cores, {:.1f} GiB; {}; OMP_NUM_THREADS={}\n", cpu, cores, mem_gib,
             compiler, threads);
  fmt::print(
      "{} warmup + {} timed iterations per variant; one variant alive at a time (built, run, "
      "freed)\n  in this order: dp, step_full, zero1, zero2, step_shard, then with shared memory "
      "dp,\n  zero1, zero2 again with gradients and params in shared buffers (_shbuf); time = "
      "slowest "
      "rank, "
      "barrier\n  before each, gradients refilled (untimed) before each\n",
      args.warmup, args.iters);
  fmt::print("copy bandwidth (one process, best of 5, read + write): {:.2f} GB/s\n", copy_bw / 1e9);
  for (const std::string& p : plans) fmt::print("{}\n", p);
  fmt::print("peak resident memory of a rank (VmHWM, whole run, the most of a rank): {:.3g} GB\n",
             peak_rss / 1e9);
  fmt::print(
      "state MB = optimizer state a rank holds (Optimizer::stats().state_bytes for dp,\n"
      "  ShardStats::state_bytes for zero), the most of a rank\n"
      "comm MB = bytes a rank sends (= receives, on average) per step: all-reduce 2(n-1)/n x\n"
      "  its bytes (ring: reduce-scatter + all-gather); a reduce to an owner (n-1)/n (every\n"
      "  rank sends its part of the shards it does not own once); a broadcast from owners\n"
      "  (n-1)/n (every rank receives the shards it does not own once). G = gradient bytes\n"
      "  reduced per step, P = parameter bytes broadcast per step (GradBucketer::stats,\n"
      "  ShardStats). dp = 2(n-1)/n G, zero1 = 2(n-1)/n G + (n-1)/n P, zero2 = (n-1)/n G +\n"
      "  (n-1)/n P. The 8-byte float64 all-reduce of ZeRO's grad check is counted as a\n"
      "  collective, its bytes are not.\n"
      "faults = minor page faults in a step, the most of a rank (median)\n");
  fmt::print("check (first step, same parameters, rank-dependent gradients):\n");
  for (const std::string& c : checks) fmt::print("  {}\n", c);
  fmt::print("\n{:<11} {:>11} {:>10} {:>10} {:>10} {:>6} {:>9} {:>9} {:>8}\n", "variant",
             "collectives", "median ms", "min ms", "max ms", "x dp", "state MB", "comm MB",
             "faults");
  for (const Row& r : rows) {
    const Summary s = summarize(r.seconds);
    fmt::print("{:<11} {:>11} {:>10.3f} {:>10.3f} {:>10.3f} {:>6.2f} {:>9.4g} {:>9.4g} {:>8.0f}\n",
               r.name, r.collectives, s.median * 1e3, s.min * 1e3, s.max * 1e3,
               s.median / dp_median, r.state_bytes / 1e6, r.comm_bytes / 1e6,
               summarize(r.faults).median);
  }
  fmt::print("\n");
  for (const Row& r : rows) fmt::print("{}: {}; {}\n", r.name, r.description, r.collectives_detail);
  std::fflush(stdout);

  if (!args.json.empty()) {
    std::string j = "{\n";
    j += fmt::format("  \"benchmark\": \"zero\",\n  \"workload\": {},\n  \"rule\": \"adamw\",\n",
                     json_string(w.name));
    j += fmt::format("  \"scale\": {},\n  \"tensors\": {},\n  \"elements\": {},\n", args.scale,
                     w.sizes.size(), elements);
    j += fmt::format("  \"bytes\": {},\n  \"dtype\": \"f32\",\n  \"ranks\": {},\n",
                     static_cast<std::int64_t>(bytes), ranks);
    j += fmt::format(
        "  \"backend\": {},\n  \"transport\": {},\n  \"warmup\": {},\n  \"iters\": {},\n",
        json_string(comm.backend()), json_string(comm.transport()), args.warmup, args.iters);
    j += fmt::format(
        "  \"machine\": {{\"cpu\": {}, \"cores\": {}, \"memory_gib\": {:.1f}, \"compiler\": "
        "{}, \"omp_num_threads\": {}}},\n",
        json_string(cpu), cores, mem_gib, json_string(compiler), json_string(threads));
    j += fmt::format("  \"copy_bandwidth_gbs\": {:.3f},\n  \"peak_rss_bytes\": {:.0f},\n",
                     copy_bw / 1e9, peak_rss);
    std::string list;
    for (const std::string& p : plans) list += (list.empty() ? "" : ", ") + json_string(p);
    j += fmt::format("  \"plans\": [{}],\n", list);
    list.clear();
    for (const std::string& c : checks) list += (list.empty() ? "" : ", ") + json_string(c);
    j += fmt::format("  \"checks\": [{}],\n", list);
    j += "  \"variants\": [\n";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      const Summary s = summarize(r.seconds);
      std::string times;
      for (double t : r.seconds) times += fmt::format("{}{:.6f}", times.empty() ? "" : ", ", t);
      j += fmt::format(
          "    {{\"name\": {}, \"description\": {}, \"communicates\": {}, \"collectives\": {}, "
          "\"collectives_detail\": {}, \"median_s\": {:.6f}, \"min_s\": {:.6f}, \"max_s\": "
          "{:.6f}, \"vs_dp\": {:.4f}, \"state_bytes\": {:.0f}, \"comm_bytes\": {:.0f}, "
          "\"comm_formula\": {}, \"minor_faults\": {:.0f}, \"seconds\": [{}]}}{}\n",
          json_string(r.name), json_string(r.description), r.communicates ? "true" : "false",
          r.collectives, json_string(r.collectives_detail), s.median, s.min, s.max,
          s.median / dp_median, r.state_bytes, r.comm_bytes, json_string(r.comm_formula),
          summarize(r.faults).median, times, i + 1 < rows.size() ? "," : "");
    }
    j += "  ]\n}\n";
    if (!fusedopt_bench::write_whole("fusedopt-zero-bench", args.json, j)) return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return fusedopt_bench::bench_main(argc, argv, "fusedopt-zero-bench", kUsage, run);
}
