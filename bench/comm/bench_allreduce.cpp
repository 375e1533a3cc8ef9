// fusedopt-comm-bench: the all-reduce of one data-parallel step's gradients (BERT-base: 201
// tensors, 109.5 M fp32) under mpirun, over each transport the communicator has (plain MPI,
// and MPI with shared memory between a node's ranks: MpiOptions; with shared memory also
// "shmbuf", the same gradients kept in Communicator::allocate_shared memory, reduced in place
// with no copies), four ways: GradBucketer's buckets, one call per gradient, one call over
// the whole flat buffer, and a reduce_scatter then an all_gather of it (ZeRO's all-reduce).
// Each variant declares
// the bytes it must move (the gradients) and reports its time, its bus bandwidth, 2(n-1)/n x
// bytes / time, and that bandwidth's fraction of the measured single-process copy bandwidth,
// with the minor page faults of a step (memory the transport touched for the first time).
// Then the same with a backward pass in front: the gradients written one by one in reverse
// order (a memory-bound stand-in for backward: each is copied from its saved input), each
// handed to the reduction as it is written; "exposed" is the step's time beyond backward's
// alone (what the reduction added to the step).
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
#include <memory>
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
    "                           [--transport both|mpi|shm] [--bucket-mib M]\n"
    "  run under mpirun; --scale multiplies every BERT-base tensor's size (at least one\n"
    "  element each; 0.01 is a 4.4 MB smoke test); --transport: plain MPI, MPI with shared\n"
    "  memory, or both (default); --bucket-mib: GradBucketer's bucket cap (default 25, DDP's;\n"
    "  the first bucket stays 1 MiB); rank 0 prints the table and writes FILE";

/// Rank r's value of element k before the all-reduce: a multiple of 1/64 in [1/64, 16]
/// plus r, so that sums over 4 ranks are exact in fp32 (and never denormal).
float input_value(std::int64_t k, int rank) {
  return static_cast<float>((k * 7) % 1024 + 1) / 64.0f + static_cast<float>(rank);
}

/// The gradients and their saved input, views of one flat buffer in parameter order (like
/// FlatArena's): in memory of its own, or in a shared buffer (Communicator::allocate_shared).
struct Grads {
  std::vector<float> owned;  ///< the buffer, unless it is shared
  float* flat = nullptr;
  std::size_t n = 0;
  const std::vector<float>* input = nullptr;
  std::vector<Tensor> tensors;
  /// Backward's stand-in: gradient i written (copied from its input).
  void write(std::size_t i) const {
    const Tensor& g = tensors[i];
    const auto offset = static_cast<float*>(g.data) - flat;
    std::memcpy(g.data, input->data() + offset, static_cast<std::size_t>(g.numel) * sizeof(float));
  }
};

struct Variant {
  std::string name;
  std::string transport;  ///< "mpi", "shm" or "shmbuf"
  std::string description;
  std::function<void()> step;  ///< one step's all-reduce of every gradient
  bool backward = false;       ///< the step writes the gradients itself (no untimed restore)
  std::int64_t collectives = 0;
  std::vector<double> seconds;  ///< per timed iteration: the slowest rank's time
  std::vector<double> faults;   ///< per timed iteration: the most minor page faults of a rank
  Grads* grads = nullptr;       ///< the buffer it reduces
};

/// One timed step of `v` from the input (restored untimed, unless the step writes it), kept
/// when `timed`; when `check`, its result is checked. Returns false (on every rank) when it
/// is wrong.
bool run_step(Communicator& comm, Variant& v, bool timed, bool check) {
  const int ranks = comm.size();
  const float* flat = v.grads->flat;
  const std::size_t n = v.grads->n;
  if (!v.backward) std::memcpy(v.grads->flat, v.grads->input->data(), n * sizeof(float));
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
  if (!check || v.collectives == 0) return true;
  // Exact: every partial sum is a multiple of 1/64 below 2^7.
  const auto expected = [&](std::int64_t k) {
    return static_cast<float>(ranks) * input_value(k, 0) +
           static_cast<float>(ranks * (ranks - 1) / 2);
  };
  std::int64_t first_bad = -1;
  for (std::size_t k = 0; k < n && first_bad < 0; ++k) {
    if (flat[k] != expected(static_cast<std::int64_t>(k))) first_bad = static_cast<std::int64_t>(k);
  }
  if (first_bad >= 0) {
    std::fprintf(stderr, "fusedopt-comm-bench: rank %d: %s/%s: element %lld is %g, not %g\n",
                 comm.rank(), v.transport.c_str(), v.name.c_str(),
                 static_cast<long long>(first_bad),
                 static_cast<double>(flat[static_cast<std::size_t>(first_bad)]),
                 static_cast<double>(expected(first_bad)));
  }
  float bad = first_bad >= 0 ? 1.0f : 0.0f;
  comm.all_reduce(&bad, 1, DType::F32, ReduceOp::Max).wait();
  return bad == 0;
}

/// One transport's communicator, gradients, bucketer and variants.
struct Transport {
  std::string label;  ///< "mpi" (shared memory off), "shm" or "shmbuf" (in a shared buffer)
  Communicator comm;
  Grads* grads = nullptr;
  std::unique_ptr<GradBucketer> bucketer;
};

void add_variants(Transport& t, std::vector<Variant>& out) {
  Communicator& comm = t.comm;
  Grads& g = *t.grads;
  GradBucketer& bucketer = *t.bucketer;
  const auto n = static_cast<std::int64_t>(g.tensors.size());
  const auto buckets = static_cast<std::int64_t>(bucketer.buckets().size());
  const int last = static_cast<int>(n) - 1;
  auto add = [&](std::string name, std::string description, std::int64_t collectives, bool backward,
                 std::function<void()> step) {
    out.push_back({std::move(name),
                   t.label,
                   std::move(description),
                   std::move(step),
                   backward,
                   collectives,
                   {},
                   {},
                   &g});
  };
  auto per_grad = [&g, &comm, last](bool backward) {
    std::vector<Work> work;
    work.reserve(g.tensors.size());
    for (int i = last; i >= 0; --i) {
      const Tensor& x = g.tensors[static_cast<std::size_t>(i)];
      if (backward) g.write(static_cast<std::size_t>(i));
      work.push_back(comm.all_reduce(x.data, x.numel, DType::F32));
    }
    for (Work& x : work) x.wait();
  };
  auto whole = [&g, &comm]() {
    comm.all_reduce(g.flat, static_cast<std::int64_t>(g.n), DType::F32).wait();
  };
  add("bucketed",
      "GradBucketer (--bucket-mib buckets, first 1 MiB): mark_ready in reverse order, then "
      "finish()",
      buckets, false, [&bucketer, last] {
        for (int i = last; i >= 0; --i) bucketer.mark_ready(i);
        bucketer.finish();
      });
  add("per_grad", "one all_reduce per gradient (reverse order), all started, then all waited", n,
      false, [per_grad] { per_grad(false); });
  add("per_grad_serial", "one all_reduce per gradient, each waited before the next starts", n,
      false, [&g, &comm] {
        for (const Tensor& x : g.tensors) comm.all_reduce(x.data, x.numel, DType::F32).wait();
      });
  add("whole_buffer", "one all_reduce over the whole flat buffer", 1, false, whole);
  // ZeRO's all-reduce: each rank reduces its block of the buffer, then all gather the blocks;
  // in place (each rank's block of the buffer its own shard) except over plain MPI, which
  // takes no aliased buffers: there through a separate shard. A tail of fewer elements than
  // ranks is all-reduced.
  const std::int64_t block = static_cast<std::int64_t>(g.n) / comm.size();
  const std::int64_t tail = static_cast<std::int64_t>(g.n) - block * comm.size();
  auto shard =
      std::make_shared<std::vector<float>>(static_cast<std::size_t>(t.label == "mpi" ? block : 0));
  add("rs_ag", "reduce_scatter of the flat buffer, one block per rank, then all_gather",
      tail > 0 ? 3 : 2, false, [&g, &comm, block, tail, shard] {
        float* mine = shard->empty() ? g.flat + comm.rank() * block : shard->data();
        Work reduced = comm.reduce_scatter(g.flat, mine, block, DType::F32);
        if (tail > 0) comm.all_reduce(g.flat + block * comm.size(), tail, DType::F32).wait();
        reduced.wait();
        comm.all_gather(mine, g.flat, block, DType::F32).wait();
      });
  add("backward+bucketed", "backward (gradients written in reverse order), mark_ready after each",
      buckets, true, [&g, &bucketer, last] {
        for (int i = last; i >= 0; --i) {
          g.write(static_cast<std::size_t>(i));
          bucketer.mark_ready(i);
        }
        bucketer.finish();
      });
  add("backward+per_grad", "backward, each gradient's all_reduce started after it is written", n,
      true, [per_grad] { per_grad(true); });
  add("backward+whole", "backward, then one all_reduce over the whole buffer", 1, true,
      [&g, whole, last] {
        for (int i = last; i >= 0; --i) g.write(static_cast<std::size_t>(i));
        whole();
      });
}

std::string machine_json(const std::string& cpu, unsigned cores, double mem_gib,
                         const std::string& compiler) {
  return fmt::format("{{\"cpu\": {}, \"cores\": {}, \"memory_gib\": {:.1f}, \"compiler\": {}}}",
                     json_string(cpu), cores, mem_gib, json_string(compiler));
}

/// Rank 0's table and JSON.
struct Bandwidths {
  double copy = 0;     ///< copy_bandwidth()
  double handoff = 0;  ///< handoff_bandwidth()
};

int report(const Args& args, const fusedopt::bench::Workload& w, std::int64_t elements,
           double bytes, int ranks, Bandwidths bw, const std::string& buckets,
           const std::vector<std::string>& transports, const std::vector<Variant>& variants) {
  const double bus_factor = 2.0 * (ranks - 1) / ranks;
  const double copy_bw = bw.copy;
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
  double backward = 0, floor = 0;
  for (const Variant& v : variants) {
    if (v.name == "backward") backward = summarize(v.seconds).median;
    if (v.name == "floor") floor = summarize(v.seconds).median;
  }
  fmt::print("fusedopt-comm-bench: {} gradients ({} tensors, {} fp32 = {:.4g} MB), {} ranks\n",
             w.name, w.sizes.size(), elements, bytes / 1e6, ranks);
  fmt::print("machine: {}, {} cores, {:.1f} GiB; {}\n", cpu, cores, mem_gib, compiler);
  for (const std::string& t : transports) fmt::print("{}\n", t);
  fmt::print("{}; {} warmup + {} timed iterations, time = slowest rank, barrier before each\n",
             buckets, args.warmup, args.iters);
  fmt::print("copy bandwidth (one process, best of 5, read + write): {:.2f} GB/s\n", copy_bw / 1e9);
  fmt::print(
      "core-to-core handoff (CPU 1 writes 256 KiB, CPU 0 copies it, in turns; written + read):"
      " {:.2f} GB/s\n",
      bw.handoff / 1e9);
  fmt::print("busbw = 2(n-1)/n x {:.4g} MB / median time; of copy = busbw / copy bandwidth;\n",
             bytes / 1e6);
  fmt::print(
      "of floor = floor's median / median: the floor is every rank's in-place pass over its\n"
      "gradients at once ({:.3f} ms, {:.2f} GB/s of reads + writes over the node);\n"
      "faults = minor page faults in a step, the most of a rank (median): first touches\n"
      "of memory the transport allocated for it; backward+: exposed = median - backward's\n\n",
      floor * 1e3, 2.0 * ranks * bytes / floor / 1e9);
  fmt::print("{:<18} {:>4} {:>11} {:>10} {:>10} {:>10} {:>11} {:>8} {:>8} {:>8} {:>10}\n",
             "variant", "via", "collectives", "median ms", "min ms", "max ms", "busbw GB/s",
             "of copy", "of floor", "faults", "exposed ms");
  std::string rows;
  for (std::size_t i = 0; i < variants.size(); ++i) {
    const Variant& v = variants[i];
    const Summary s = summarize(v.seconds);
    const bool plain = !v.backward && v.collectives > 0;
    const double busbw = plain ? bus_factor * bytes / s.median : 0;
    const double exposed = v.backward && v.collectives > 0 ? s.median - backward : 0;
    const std::string na = "-";
    fmt::print(
        "{:<18} {:>4} {:>11} {:>10.3f} {:>10.3f} {:>10.3f} {:>11} {:>8} {:>8} {:>8.0f} {:>10}\n",
        v.name, v.transport, v.collectives, s.median * 1e3, s.min * 1e3, s.max * 1e3,
        plain ? fmt::format("{:.3f}", busbw / 1e9) : na,
        plain ? fmt::format("{:.1f}%", 100.0 * busbw / copy_bw) : na,
        plain ? fmt::format("{:.1f}%", 100.0 * floor / s.median) : na, summarize(v.faults).median,
        v.backward && v.collectives > 0 ? fmt::format("{:.3f}", exposed * 1e3) : na);
    std::string times;
    for (double t : v.seconds) times += fmt::format("{}{:.6f}", times.empty() ? "" : ", ", t);
    rows += fmt::format(
        "    {{\"name\": {}, \"transport\": {}, \"description\": {}, \"collectives\": {}, "
        "\"median_s\": {:.6f}, \"min_s\": {:.6f}, \"max_s\": {:.6f}, \"busbw_gbs\": {:.4f}, "
        "\"copy_fraction\": {:.4f}, \"floor_fraction\": {:.4f}, \"exposed_s\": {:.6f}, "
        "\"minor_faults\": {:.0f}, \"seconds\": [{}]}}{}\n",
        json_string(v.name), json_string(v.transport), json_string(v.description), v.collectives,
        s.median, s.min, s.max, busbw / 1e9, plain ? busbw / copy_bw : 0.0,
        plain ? floor / s.median : 0.0, exposed, summarize(v.faults).median, times,
        i + 1 < variants.size() ? "," : "");
  }
  std::fflush(stdout);
  if (args.json.empty()) return 0;
  std::string j = "{\n";
  j += fmt::format("  \"benchmark\": \"comm_allreduce\",\n  \"workload\": {},\n",
                   json_string(w.name));
  j += fmt::format("  \"scale\": {},\n  \"tensors\": {},\n  \"elements\": {},\n", args.scale,
                   w.sizes.size(), elements);
  j += fmt::format("  \"bytes\": {},\n  \"dtype\": \"f32\",\n  \"ranks\": {},\n",
                   static_cast<std::int64_t>(bytes), ranks);
  std::string ts;
  for (const std::string& t : transports) ts += (ts.empty() ? "" : ", ") + json_string(t);
  j += fmt::format("  \"transports\": [{}],\n  \"warmup\": {},\n  \"iters\": {},\n", ts,
                   args.warmup, args.iters);
  j += fmt::format("  \"machine\": {},\n", machine_json(cpu, cores, mem_gib, compiler));
  j += fmt::format(
      "  \"copy_bandwidth_gbs\": {:.3f},\n  \"handoff_bandwidth_gbs\": {:.3f},\n  \"floor_s\": "
      "{:.6f},\n",
      copy_bw / 1e9, bw.handoff / 1e9, floor);
  j += fmt::format("  \"buckets\": {},\n", json_string(buckets));
  j += "  \"variants\": [\n" + rows + "  ]\n}\n";
  return fusedopt_bench::write_whole("fusedopt-comm-bench", args.json, j) ? 0 : 1;
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

  std::vector<float> input(static_cast<std::size_t>(elements));
  for (std::size_t k = 0; k < input.size(); ++k)
    input[k] = input_value(static_cast<std::int64_t>(k), comm.rank());
  auto grads_in = [&](Grads& g, float* flat) {
    g.flat = flat != nullptr ? flat : (g.owned.resize(input.size()), g.owned.data());
    g.n = input.size();
    g.input = &input;
    std::int64_t offset = 0;
    for (std::size_t i = 0; i < w.sizes.size(); ++i) {
      g.tensors.push_back({g.flat + offset, w.sizes[i], DType::F32, fusedopt::Device::host(),
                           "grad" + std::to_string(i)});
      offset += w.sizes[i];
    }
  };
  Grads g, shared;
  grads_in(g, nullptr);

  // The copy floor, measured by rank 0 alone while the others wait in a barrier (which
  // polls with sleeps: they leave the cores to it).
  double copy_bw = 0, handoff_bw = 0;
  if (root) {
    copy_bw = fusedopt::bench::copy_bandwidth(static_cast<std::size_t>(bytes));
    handoff_bw = fusedopt_bench::handoff_bandwidth();
  }
  comm.barrier().wait();

  // Plain MPI and the default communicator (shared memory, unless FUSEDOPT_COMM_SHM=0).
  std::vector<Transport> transports;
  fusedopt::comm::MpiOptions plain;
  plain.shared_memory = false;
  if (args.transport != "shm") transports.push_back({"mpi", Communicator::mpi(plain), &g, nullptr});
  if (args.transport != "mpi" && comm.transport().find("shared memory:") != std::string::npos) {
    transports.push_back({"shm", comm, &g, nullptr});
    // The same gradients in a shared buffer: all-reduced in place, no copy in or out.
    grads_in(shared, static_cast<float*>(comm.allocate_shared(input.size() * sizeof(float))));
    transports.push_back({"shmbuf", comm, &shared, nullptr});
  }
  std::vector<Variant> variants;
  auto local = [&variants, &g](std::string name, std::string description, bool backward,
                               std::function<void()> step) {
    variants.push_back(
        {std::move(name), "-", std::move(description), std::move(step), backward, 0, {}, {}, &g});
  };
  // The floor no all-reduce can beat on one node: every rank reads and writes each of its
  // gradients once (an in-place pass, all ranks at once: the memory system shared as in an
  // all-reduce). The values stay (x 1 + 0 from volatiles the compiler cannot see through).
  static volatile float one = 1.0f, zero = 0.0f;
  local("floor", "in-place pass over the gradients, every rank at once", false, [&g] {
    const float a = one, b = zero;
    float* x = g.flat;
    for (std::size_t k = 0; k < g.n; ++k) x[k] = x[k] * a + b;
  });
  local("backward", "backward alone: the gradients written in reverse order", true, [&g] {
    for (std::size_t i = g.tensors.size(); i-- > 0;) g.write(i);
  });
  for (Transport& t : transports) {
    fusedopt::comm::BucketOptions buckets;  // first 1 MiB
    buckets.bucket_bytes = static_cast<std::size_t>(args.bucket_mib * double(1 << 20));
    t.bucketer = std::make_unique<GradBucketer>(t.comm, t.grads->tensors, buckets);
    add_variants(t, variants);
  }

  // Round robin: iteration i of every variant, then i + 1, so that a change in the load of
  // this shared machine falls on every variant alike.
  for (int it = 0; it < args.warmup + args.iters; ++it) {
    for (Variant& v : variants) {
      if (!run_step(comm, v, it >= args.warmup, it == 0)) {
        if (root) std::fprintf(stderr, "fusedopt-comm-bench: %s: wrong result\n", v.name.c_str());
        return 1;
      }
    }
  }
  if (!root) return 0;
  std::vector<std::string> transport_lines;
  for (const Transport& t : transports) {
    const fusedopt::comm::BucketStats b = t.bucketer->stats();
    transport_lines.push_back(fmt::format(
        "{}: {}; bucketed: {:.0f} page faults per step after the first, finish() waited "
        "{:.3f} ms in the last step",
        t.label, t.comm.transport(), b.page_faults_per_step, b.last_wait_seconds * 1e3));
  }
  const std::string buckets_report = transports.empty() ? "" : transports[0].bucketer->report();
  return report(args, w, elements, bytes, ranks, {copy_bw, handoff_bw}, buckets_report,
                transport_lines, variants);
}

}  // namespace

int main(int argc, char** argv) {
  return fusedopt_bench::bench_main(argc, argv, "fusedopt-comm-bench", kUsage, run);
}
