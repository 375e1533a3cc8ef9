// fusedopt-comm-bench: the all-reduce of one data-parallel step's gradients (BERT-base: 201
// tensors, 109.5 M fp32) under mpirun, three ways: GradBucketer's buckets, one call per
// gradient, one call over the whole flat buffer. Each variant declares the bytes it must
// move (the gradients) and reports its time, its bus bandwidth, 2(n-1)/n x bytes / time,
// and that bandwidth's fraction of the measured single-process copy bandwidth, with the
// minor page faults of a step (the transport's temporary buffers touched for the first time).
//
// A plain timing loop, not Google Benchmark (whose loop is per process): an iteration is a
// collective step of every rank, from a barrier to the slowest rank's end (the max over
// ranks of each rank's time), from the input restored (untimed) before each; the variants
// take turns, iteration by iteration. The first iteration of each also checks the result,
// exactly: rank r's gradients hold base + r, so each element must become ranks x base +
// ranks(ranks-1)/2 (exit 1 otherwise, on every rank).
// The program uses only fusedopt's public API (fusedopt/comm.hpp).
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
#include <string>
#include <thread>
#include <vector>

#include "comm/bench_support.hpp"
#include "fusedopt/comm.hpp"
#include "fusedopt/optimizer.hpp"
#include "workloads.hpp"

using fusedopt::DType;
using fusedopt::Tensor;
using fusedopt::comm::Communicator;
using fusedopt::comm::GradBucketer;
using fusedopt::comm::ReduceOp;
using fusedopt::comm::Work;

namespace {

using fusedopt_bench::Args;
using fusedopt_bench::json_string;
using fusedopt_bench::minor_faults;
using fusedopt_bench::proc_field;
using fusedopt_bench::summarize;
using fusedopt_bench::Summary;

constexpr const char* kUsage =
    "usage: fusedopt-comm-bench [--iters N] [--warmup N] [--scale F] [--json FILE]\n"
    "  run under mpirun; --scale multiplies every BERT-base tensor's size (at least one\n"
    "  element each; 0.01 is a 4.4 MB smoke test); rank 0 prints the table and writes FILE";

/// Rank r's value of element k before the all-reduce: a multiple of 1/64 in [1/64, 16]
/// plus r, so that sums over 4 ranks are exact in fp32 (and never denormal).
float input_value(std::int64_t k, int rank) {
  return static_cast<float>((k * 7) % 1024 + 1) / 64.0f + static_cast<float>(rank);
}

struct Variant {
  std::string name;
  std::string description;
  std::function<void()> step;  ///< one step's all-reduce of every gradient
  std::int64_t collectives = 0;
  std::vector<double> seconds;  ///< per timed iteration: the slowest rank's time
  std::vector<double> faults;   ///< per timed iteration: the most minor page faults of a rank
};

/// One timed step of `v` from the input (restored untimed), kept when `timed`; when
/// `check`, its result is checked. Returns false (on every rank) when it is wrong.
bool run_step(Communicator& comm, Variant& v, bool timed, bool check, std::vector<float>& flat,
              const std::vector<float>& input) {
  const int ranks = comm.size();
  std::memcpy(flat.data(), input.data(), flat.size() * sizeof(float));
  comm.barrier().wait();
  const double faults0 = minor_faults();
  const auto t0 = std::chrono::steady_clock::now();
  v.step();
  float cost[2] = {std::chrono::duration<float>(std::chrono::steady_clock::now() - t0).count(),
                   static_cast<float>(minor_faults() - faults0)};
  comm.all_reduce(cost, 2, DType::F32, ReduceOp::Max).wait();
  if (timed) {
    v.seconds.push_back(cost[0]);
    v.faults.push_back(cost[1]);
  }
  if (!check) return true;
  // Exact: every partial sum is a multiple of 1/64 below 2^7.
  const auto expected = [&](std::int64_t k) {
    return static_cast<float>(ranks) * input_value(k, 0) +
           static_cast<float>(ranks * (ranks - 1) / 2);
  };
  std::int64_t first_bad = -1;
  for (std::size_t k = 0; k < flat.size() && first_bad < 0; ++k) {
    if (flat[k] != expected(static_cast<std::int64_t>(k))) first_bad = static_cast<std::int64_t>(k);
  }
  if (first_bad >= 0) {
    std::fprintf(stderr, "fusedopt-comm-bench: rank %d: %s: element %lld is %g, not %g\n",
                 comm.rank(), v.name.c_str(), static_cast<long long>(first_bad),
                 static_cast<double>(flat[static_cast<std::size_t>(first_bad)]),
                 static_cast<double>(expected(first_bad)));
  }
  float bad = first_bad >= 0 ? 1.0f : 0.0f;
  comm.all_reduce(&bad, 1, DType::F32, ReduceOp::Max).wait();
  return bad == 0;
}

int run(const Args& args) {
  Communicator comm = Communicator::mpi();
  const int ranks = comm.size();
  const bool root = comm.rank() == 0;

  fusedopt::bench::Workload w = fusedopt::bench::bert_base();
  for (std::int64_t& s : w.sizes) {
    s = std::max<std::int64_t>(1, std::llround(static_cast<double>(s) * args.scale));
  }
  const std::int64_t elements = w.elements();
  const double bytes = static_cast<double>(elements) * sizeof(float);

  // The gradients: views of one flat buffer, in parameter order, like FlatArena's.
  std::vector<float> flat(static_cast<std::size_t>(elements)), input(flat.size());
  for (std::size_t k = 0; k < input.size(); ++k)
    input[k] = input_value(static_cast<std::int64_t>(k), comm.rank());
  std::vector<Tensor> grads;
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < w.sizes.size(); ++i) {
    grads.push_back({flat.data() + offset, w.sizes[i], DType::F32, fusedopt::Device::host(),
                     "grad" + std::to_string(i)});
    offset += w.sizes[i];
  }

  // The copy floor, measured by rank 0 alone while the others wait in a barrier (which
  // polls with sleeps: they leave the cores to it).
  double copy_bw = 0;
  if (root) copy_bw = fusedopt::bench::copy_bandwidth(static_cast<std::size_t>(bytes));
  comm.barrier().wait();

  GradBucketer bucketer(comm, grads);  // default options: 25 MiB buckets, first 1 MiB
  std::vector<Variant> variants;
  auto add = [&](std::string name, std::string description, std::int64_t collectives,
                 std::function<void()> step) {
    variants.push_back(
        {std::move(name), std::move(description), std::move(step), collectives, {}, {}});
  };
  add("bucketed",
      "GradBucketer (25 MiB buckets, first 1 MiB): mark_ready in reverse order, then finish()",
      static_cast<std::int64_t>(bucketer.buckets().size()), [&] {
        for (int i = static_cast<int>(grads.size()) - 1; i >= 0; --i) bucketer.mark_ready(i);
        bucketer.finish();
      });
  add("per_grad", "one all_reduce per gradient, all started, then all waited",
      static_cast<std::int64_t>(grads.size()), [&] {
        std::vector<Work> work;
        work.reserve(grads.size());
        for (const Tensor& g : grads) work.push_back(comm.all_reduce(g.data, g.numel, DType::F32));
        for (Work& x : work) x.wait();
      });
  add("per_grad_serial", "one all_reduce per gradient, each waited before the next starts",
      static_cast<std::int64_t>(grads.size()), [&] {
        for (const Tensor& g : grads) comm.all_reduce(g.data, g.numel, DType::F32).wait();
      });
  add("whole_buffer", "one all_reduce over the whole flat buffer", 1,
      [&] { comm.all_reduce(flat.data(), elements, DType::F32).wait(); });

  // Round robin: iteration i of every variant, then i + 1, so that a change in the load of
  // this shared machine falls on every variant alike.
  for (int it = 0; it < args.warmup + args.iters; ++it) {
    for (Variant& v : variants) {
      const std::int64_t before = bucketer.collectives();
      if (!run_step(comm, v, it >= args.warmup, it == 0, flat, input)) {
        if (root) std::fprintf(stderr, "fusedopt-comm-bench: %s: wrong result\n", v.name.c_str());
        return 1;
      }
      // What the bucketer started, not what its layout says.
      if (v.name == "bucketed") v.collectives = bucketer.collectives() - before;
    }
  }
  if (!root) return 0;

  // The report.
  const double bus_factor = 2.0 * (ranks - 1) / ranks;
  const std::string cpu = proc_field("/proc/cpuinfo", "model name");
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const double mem_gib = std::atof(proc_field("/proc/meminfo", "MemTotal").c_str()) / 1048576.0;
  const std::string compiler =
#if defined(__clang__)
      std::string("clang++ ") + __clang_version__;
#elif defined(__GNUC__)
      std::string("g++ ") + __VERSION__;
#else
      "unknown";
#endif
  fmt::print("fusedopt-comm-bench: {} gradients ({} tensors, {} fp32 = {:.4g} MB), {} ranks, {}\n",
             w.name, w.sizes.size(), elements, bytes / 1e6, ranks, comm.backend());
  fmt::print("machine: {}, {} cores, {:.1f} GiB; {}\n", cpu, cores, mem_gib, compiler);
  fmt::print("{}; {} warmup + {} timed iterations, time = slowest rank, barrier before each\n",
             bucketer.report(), args.warmup, args.iters);
  fmt::print("copy bandwidth (one process, best of 5, read + write): {:.2f} GB/s\n", copy_bw / 1e9);
  fmt::print("busbw = 2(n-1)/n x {:.4g} MB / median time; of copy = busbw / copy bandwidth;\n",
             bytes / 1e6);
  fmt::print(
      "faults = minor page faults in a step, the most of a rank (median): first touches\n"
      "of memory the transport allocated for it\n\n");
  fmt::print("{:<16} {:>11} {:>10} {:>10} {:>10} {:>11} {:>8} {:>8}\n", "variant", "collectives",
             "median ms", "min ms", "max ms", "busbw GB/s", "of copy", "faults");
  for (const Variant& v : variants) {
    const Summary s = summarize(v.seconds);
    const double busbw = bus_factor * bytes / s.median;
    fmt::print("{:<16} {:>11} {:>10.3f} {:>10.3f} {:>10.3f} {:>11.3f} {:>7.1f}% {:>8.0f}\n", v.name,
               v.collectives, s.median * 1e3, s.min * 1e3, s.max * 1e3, busbw / 1e9,
               100.0 * busbw / copy_bw, summarize(v.faults).median);
  }
  std::fflush(stdout);

  if (!args.json.empty()) {
    std::string j = "{\n";
    j += fmt::format("  \"benchmark\": \"comm_allreduce\",\n  \"workload\": {},\n",
                     json_string(w.name));
    j += fmt::format("  \"scale\": {},\n  \"tensors\": {},\n  \"elements\": {},\n", args.scale,
                     w.sizes.size(), elements);
    j += fmt::format("  \"bytes\": {},\n  \"dtype\": \"f32\",\n  \"ranks\": {},\n",
                     static_cast<std::int64_t>(bytes), ranks);
    j += fmt::format("  \"backend\": {},\n  \"warmup\": {},\n  \"iters\": {},\n",
                     json_string(comm.backend()), args.warmup, args.iters);
    j += fmt::format(
        "  \"machine\": {{\"cpu\": {}, \"cores\": {}, \"memory_gib\": {:.1f}, \"compiler\": "
        "{}}},\n",
        json_string(cpu), cores, mem_gib, json_string(compiler));
    j += fmt::format("  \"copy_bandwidth_gbs\": {:.3f},\n  \"buckets\": {},\n", copy_bw / 1e9,
                     json_string(bucketer.report()));
    j += "  \"variants\": [\n";
    for (std::size_t i = 0; i < variants.size(); ++i) {
      const Variant& v = variants[i];
      const Summary s = summarize(v.seconds);
      const double busbw = bus_factor * bytes / s.median;
      std::string times;
      for (double t : v.seconds) times += fmt::format("{}{:.6f}", times.empty() ? "" : ", ", t);
      j += fmt::format(
          "    {{\"name\": {}, \"description\": {}, \"collectives\": {}, \"median_s\": {:.6f}, "
          "\"min_s\": {:.6f}, \"max_s\": {:.6f}, \"busbw_gbs\": {:.4f}, \"copy_fraction\": "
          "{:.4f}, \"minor_faults\": {:.0f}, \"seconds\": [{}]}}{}\n",
          json_string(v.name), json_string(v.description), v.collectives, s.median, s.min, s.max,
          busbw / 1e9, busbw / copy_bw, summarize(v.faults).median, times,
          i + 1 < variants.size() ? "," : "");
    }
    j += "  ]\n}\n";
    if (!fusedopt_bench::write_whole("fusedopt-comm-bench", args.json, j)) return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return fusedopt_bench::bench_main(argc, argv, "fusedopt-comm-bench", kUsage, run);
}
