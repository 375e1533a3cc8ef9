// Data-parallel training under mpirun, as PyTorch DDP does it, in plain C++ on the host: a
// small MLP (16 -> 64 -> 64 -> 1, tanh, mean squared error; forward and backward written
// here) learns a fixed random "teacher" function from synthetic data. Every rank holds the
// whole model and takes its contiguous slice of each global batch; a GradBucketer all-reduces
// the gradients in a few buckets, each started as soon as backward has produced its last
// gradient (the last layer's first), and the fused optimizer step (AdamW, or SGD with
// momentum) folds the average over ranks into its gradient scale. With --zero 1 or 2 a
// ShardedOptimizer (ZeRO-1 or ZeRO-2, as DeepSpeed and torch's ZeroRedundancyOptimizer do
// it) takes the bucketer's and the optimizer's place: each rank keeps the optimizer state
// of 1/ranks of the parameters only, the gradients are all-reduced (ZeRO-1) or each bucket
// reduced to the rank that owns it (ZeRO-2), every rank steps its own shard and broadcasts
// it to the others. Rank 0 prints the loss per epoch, then trains the same model in one
// process on the whole batches and checks that its final parameters match, and that every
// rank holds bit-identical parameters.
// Exit code: 0 on a match, 1 otherwise, 2 for bad arguments.
//
//   mpirun -np 2 dp_mlp [--epochs N] [--batch N] [--samples N] [--seed N]
//                       [--optimizer adamw|sgd] [--zero 0|1|2]
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "fusedopt/comm.hpp"
#include "fusedopt/optimizer.hpp"
#include "fusedopt/sharded.hpp"

using namespace fusedopt;
using comm::BucketOptions;
using comm::Communicator;
using comm::GradBucketer;
using comm::ShardedOptimizer;

namespace {

constexpr int kIn = 16, kHidden = 64;
// Data-parallel and single-process parameters differ by fp32 rounding, so the tolerance is
// not zero: each rank sums its slice's per-sample gradients, the all-reduce sums the ranks'
// results and the step multiplies by 1 / ranks, while one process sums the whole batch in
// one pass. The same values added in another order round differently (about 1e-7 relative
// per gradient), and every later step carries the difference on. Measured after the
// default 320 steps, seeds 1 to 5: 0 at 1 rank (same order, same bits), 1e-7 to 1.4e-6 at
// 2 to 4 ranks with either optimizer. It grows with the steps (4.5e-6 after 2,560 steps of
// batch 16), hence the margin. Real errors land far above: a rank training on the wrong
// slice moves the parameters by 0.04 to 0.1, a missing 1 / ranks by 0.08 under SGD (under
// AdamW by only 1.4e-5: see Args::optimizer). The sharded runs (--zero 1 and 2) sum the
// same gradients and take the same element-wise step over each rank's piece: measured at
// 2 to 4 ranks with either optimizer (seeds 1 and 3), their final parameters are
// bit-identical to --zero 0's, so the same tolerance holds.
constexpr double kTolerance = 1e-5;

// The parameters in forward order: W1 [64 x 16], b1, W2 [64 x 64], b2, W3 [1 x 64], b3.
// Gradient i belongs to parameter i; backward produces them from the last to the first.
enum Param { kW1, kB1, kW2, kB2, kW3, kB3, kNumParams };
const char* const kNames[kNumParams] = {"W1", "b1", "W2", "b2", "W3", "b3"};
constexpr std::int64_t kNumel[kNumParams] = {
    std::int64_t{kHidden} * kIn, kHidden, std::int64_t{kHidden} * kHidden, kHidden, kHidden, 1};

struct Args {
  int epochs = 20;
  int batch = 0;  // global batch, split evenly across the ranks; 0: 64 rounded down to them
  int samples = 1024;
  unsigned seed = 1;
  // AdamW shows the usual case. SGD with momentum makes the check sharper: its step is
  // linear in the gradient, so a wrong average over ranks moves the parameters by a lot,
  // while AdamW divides the gradient's scale out (m / sqrt(v)) and barely notices it.
  std::string optimizer = "adamw";
  // 0: every rank holds the whole optimizer state (GradBucketer + Optimizer); 1 or 2: the
  // ZeRO stage of a ShardedOptimizer.
  int zero = 0;
};

struct Dataset {
  std::vector<float> x;  // [samples x kIn]
  std::vector<float> y;  // [samples]
};

float* f32(const Tensor& t) { return static_cast<float*>(t.data); }

// Inputs from N(0, 1); targets from a random two-layer tanh network (the teacher) plus a
// little noise. Every rank builds the same data from the seed (no I/O, no broadcast).
Dataset make_data(int samples, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int teacher_hidden = 32;
  std::vector<float> t1(teacher_hidden * kIn), t2(teacher_hidden);
  for (auto& v : t1) v = normal(rng) / std::sqrt(static_cast<float>(kIn));
  for (auto& v : t2) v = normal(rng) / std::sqrt(static_cast<float>(teacher_hidden));
  Dataset d;
  d.x.resize(static_cast<std::size_t>(samples) * kIn);
  d.y.resize(static_cast<std::size_t>(samples));
  for (int i = 0; i < samples; ++i) {
    float* x = &d.x[static_cast<std::size_t>(i) * kIn];
    for (int k = 0; k < kIn; ++k) x[k] = normal(rng);
    float y = 0;
    for (int j = 0; j < teacher_hidden; ++j) {
      float h = 0;
      for (int k = 0; k < kIn; ++k) h += t1[j * kIn + k] * x[k];
      y += t2[j] * std::tanh(h);
    }
    d.y[i] = y + 0.05f * normal(rng);
  }
  return d;
}

/// The model's params and grads in one arena; with `comm`, in its shared buffers
/// (allocate_shared), where the ranks of a node reduce the gradients and broadcast ZeRO's
/// params in place, without copies.
FlatArena make_model(unsigned seed, Communicator* comm = nullptr) {
  FlatArena arena;
  for (int i = 0; i < kNumParams; ++i) arena.add(kNames[i], kNumel[i], DType::F32);
  if (comm != nullptr) {
    const auto shared = [comm](std::size_t bytes) { return comm->allocate_shared(bytes); };
    arena.finalize(shared, shared);  // every rank, in the same order; zeroed
  } else {
    arena.finalize();  // zeroed: the biases start at 0
  }
  std::mt19937 rng(seed + 1000u);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int i : {kW1, kW2, kW3}) {
    const float fan_in = static_cast<float>(i == kW1 ? kIn : kHidden);
    for (std::int64_t k = 0; k < kNumel[i]; ++k)
      f32(arena.param(i))[k] = normal(rng) / std::sqrt(fan_in);
  }
  return arena;
}

// Forward and backward over the samples idx[0, count): writes into the arena's gradients
// the gradient of the mean loss over these samples, 0.5 (pred - y)^2 averaged, and calls
// ready(i) as soon as gradient i is complete. Returns the sum of their losses.
//
// With equal slices of one global batch, the mean over the ranks of these per-slice
// gradients is the gradient of the global batch's mean loss: the bucketer sums them over
// the ranks, and the step multiplies by 1 / ranks (GradBucketer::grad_scale()); under
// --zero the ShardedOptimizer's step does both.
double forward_backward(const FlatArena& model, const Dataset& data, const int* idx, int count,
                        const std::function<void(int)>& ready) {
  const float *w1 = f32(model.param(kW1)), *b1 = f32(model.param(kB1));
  const float *w2 = f32(model.param(kW2)), *b2 = f32(model.param(kB2));
  const float *w3 = f32(model.param(kW3)), *b3 = f32(model.param(kB3));
  const std::size_t n = static_cast<std::size_t>(count);
  std::vector<float> h1(n * kHidden), h2(n * kHidden), delta3(n);
  double loss = 0;
  const float inv_count = 1.0f / static_cast<float>(count);
  for (std::size_t s = 0; s < n; ++s) {
    const float* x = &data.x[static_cast<std::size_t>(idx[s]) * kIn];
    float* a1 = &h1[s * kHidden];
    float* a2 = &h2[s * kHidden];
    for (int j = 0; j < kHidden; ++j) {
      float z = b1[j];
      for (int k = 0; k < kIn; ++k) z += w1[j * kIn + k] * x[k];
      a1[j] = std::tanh(z);
    }
    for (int j = 0; j < kHidden; ++j) {
      float z = b2[j];
      for (int k = 0; k < kHidden; ++k) z += w2[j * kHidden + k] * a1[k];
      a2[j] = std::tanh(z);
    }
    float pred = b3[0];
    for (int k = 0; k < kHidden; ++k) pred += w3[k] * a2[k];
    const float err = pred - data.y[static_cast<std::size_t>(idx[s])];
    loss += 0.5 * static_cast<double>(err) * err;
    delta3[s] = err * inv_count;  // d(mean loss) / d(pred)
  }

  // Layer 3: its gradients are the first ready, so their bucket starts while layers 2 and
  // 1 are still being differentiated.
  float *gw3 = f32(model.grad(kW3)), *gb3 = f32(model.grad(kB3));
  std::fill(gw3, gw3 + kHidden, 0.0f);
  gb3[0] = 0;
  std::vector<float> delta2(n * kHidden);
  for (std::size_t s = 0; s < n; ++s) {
    const float* a2 = &h2[s * kHidden];
    for (int k = 0; k < kHidden; ++k) {
      gw3[k] += delta3[s] * a2[k];
      delta2[s * kHidden + k] = delta3[s] * w3[k] * (1 - a2[k] * a2[k]);  // tanh' = 1 - tanh^2
    }
    gb3[0] += delta3[s];
  }
  ready(kB3);
  ready(kW3);

  float *gw2 = f32(model.grad(kW2)), *gb2 = f32(model.grad(kB2));
  std::fill(gw2, gw2 + kHidden * kHidden, 0.0f);
  std::fill(gb2, gb2 + kHidden, 0.0f);
  std::vector<float> delta1(n * kHidden, 0.0f);
  for (std::size_t s = 0; s < n; ++s) {
    const float* a1 = &h1[s * kHidden];
    const float* d2 = &delta2[s * kHidden];
    float* d1 = &delta1[s * kHidden];
    for (int j = 0; j < kHidden; ++j) {
      for (int k = 0; k < kHidden; ++k) {
        gw2[j * kHidden + k] += d2[j] * a1[k];
        d1[k] += d2[j] * w2[j * kHidden + k];
      }
      gb2[j] += d2[j];
    }
    for (int k = 0; k < kHidden; ++k) d1[k] *= 1 - a1[k] * a1[k];
  }
  ready(kB2);
  ready(kW2);

  float *gw1 = f32(model.grad(kW1)), *gb1 = f32(model.grad(kB1));
  std::fill(gw1, gw1 + kHidden * kIn, 0.0f);
  std::fill(gb1, gb1 + kHidden, 0.0f);
  for (std::size_t s = 0; s < n; ++s) {
    const float* x = &data.x[static_cast<std::size_t>(idx[s]) * kIn];
    const float* d1 = &delta1[s * kHidden];
    for (int j = 0; j < kHidden; ++j) {
      for (int k = 0; k < kIn; ++k) gw1[j * kIn + k] += d1[j] * x[k];
      gb1[j] += d1[j];
    }
  }
  ready(kB1);
  ready(kW1);
  return loss;
}

// Each epoch visits the samples in an order drawn from the seed and the epoch, the same
// on every rank and in the single-process run; the last samples % batch are left out
// (drop_last), so every step has a full global batch.
std::vector<int> epoch_order(int samples, unsigned seed, int epoch) {
  std::vector<int> order(static_cast<std::size_t>(samples));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(seed * 7919u + static_cast<unsigned>(epoch));
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

// The model's six tensors and their gradients (views of the arena's two flat buffers, in
// parameter order, as GradBucketer and ShardedOptimizer need them) with the optimizer's
// hyperparameters.
ParamGroup make_group(const FlatArena& model, const std::string& name) {
  ParamGroup g;
  for (int i = 0; i < kNumParams; ++i) {
    g.params.push_back(model.param(i));
    g.grads.push_back(model.grad(i));
  }
  if (name == "adamw")
    g.hypers = {{"lr", 3e-3}};
  else
    g.hypers = {{"lr", 0.05}, {"momentum", 0.9}};
  return g;
}

// The fused optimizer over the model's six tensors: one kernel launch per step.
Optimizer make_optimizer(const FlatArena& model, const std::string& name) {
  return Optimizer(Rule::preset(name), {make_group(model, name)});
}

// The same training in one process: every step's gradient is computed over the whole
// global batch by the same forward_backward, and the optimizer takes a plain step.
FlatArena train_single(const Args& args, const Dataset& data) {
  FlatArena model = make_model(args.seed);
  Optimizer opt = make_optimizer(model, args.optimizer);
  const int steps = args.samples / args.batch;
  double loss = 0;
  for (int epoch = 1; epoch <= args.epochs; ++epoch) {
    const std::vector<int> order = epoch_order(args.samples, args.seed, epoch);
    loss = 0;
    for (int s = 0; s < steps; ++s) {
      loss += forward_backward(model, data, order.data() + s * args.batch, args.batch, [](int) {});
      opt.step();
    }
  }
  std::printf("single process, whole batches: epoch %d loss %.6f\n", args.epochs,
              loss / (static_cast<double>(steps) * args.batch));
  return model;
}

bool parse_int(const char* text, int min, int* out) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < min || v > 1000000000L) return false;
  *out = static_cast<int>(v);
  return true;
}

// Empty when the arguments are good, else the error message.
std::string parse_args(int argc, char** argv, int ranks, Args* args) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--optimizer") {
      if (i + 1 == argc ||
          (std::strcmp(argv[i + 1], "adamw") != 0 && std::strcmp(argv[i + 1], "sgd") != 0))
        return "--optimizer needs 'adamw' or 'sgd'";
      args->optimizer = argv[++i];
      continue;
    }
    if (flag == "--zero") {
      if (i + 1 == argc ||
          (std::strcmp(argv[i + 1], "0") != 0 && std::strcmp(argv[i + 1], "1") != 0 &&
           std::strcmp(argv[i + 1], "2") != 0))
        return "--zero needs 0 (no sharding), 1 (ZeRO-1) or 2 (ZeRO-2)";
      args->zero = argv[++i][0] - '0';
      continue;
    }
    int* target = flag == "--epochs"    ? &args->epochs
                  : flag == "--batch"   ? &args->batch
                  : flag == "--samples" ? &args->samples
                                        : nullptr;
    int seed = 0;
    if (flag == "--seed") target = &seed;
    if (!target) return "unknown argument '" + flag + "'";
    if (i + 1 == argc || !parse_int(argv[i + 1], flag == "--seed" ? 0 : 1, target))
      return flag + " needs a " + (flag == "--seed" ? "non-negative" : "positive") + " integer";
    if (flag == "--seed") args->seed = static_cast<unsigned>(seed);
    ++i;
  }
  // The default works at any world size: 64 samples, rounded down to a multiple of the ranks
  // (63 at 3 ranks), at least one per rank.
  if (args->batch == 0) args->batch = std::max(ranks, 64 / ranks * ranks);
  if (args->batch % ranks != 0)
    return "the global batch (--batch " + std::to_string(args->batch) +
           ") must divide evenly across the " + std::to_string(ranks) + " ranks";
  if (args->batch > args->samples)
    return "the global batch (--batch " + std::to_string(args->batch) +
           ") is larger than the data set (--samples " + std::to_string(args->samples) + ")";
  return "";
}

int run(int argc, char** argv) {
  Communicator comm = Communicator::mpi();
  const int rank = comm.rank(), ranks = comm.size();
  const bool root = rank == 0;
  Args args;
  const std::string bad = parse_args(argc, argv, ranks, &args);
  if (!bad.empty()) {  // every rank sees the same arguments and stops alike
    if (root) {
      std::fprintf(stderr, "dp_mlp: error: %s\n", bad.c_str());
      std::fprintf(stderr,
                   "usage: mpirun -np RANKS dp_mlp [--epochs N] [--batch N] [--samples N] "
                   "[--seed N] [--optimizer adamw|sgd] [--zero 0|1|2]\n");
    }
    return 2;
  }
  const int shard = args.batch / ranks, steps = args.samples / args.batch;
  const Dataset data = make_data(args.samples, args.seed);

  // Every rank starts from the same parameters (the same seed), as DDP's broadcast of
  // rank 0's module would make them.
  FlatArena model = make_model(args.seed, &comm);
  // docs:begin setup
  // Caps far below DDP's 25 MiB, so that this 21 KB model still has several buckets:
  // {b3, W3, b2}, {W2}, {b1}, {W1} (ZeRO-2 also cuts them at the shard boundaries).
  BucketOptions buckets;
  buckets.first_bucket_bytes = 1024;
  buckets.bucket_bytes = 4096;
  // --zero 0: the whole optimizer on every rank, its gradients summed by the bucketer.
  // --zero 1|2: the sharded optimizer, which reduces the gradients itself.
  std::optional<Optimizer> opt;
  std::optional<GradBucketer> bucketer;
  std::optional<ShardedOptimizer> sharded;
  if (args.zero == 0) {
    opt.emplace(make_optimizer(model, args.optimizer));
    std::vector<Tensor> grads;
    for (int i = 0; i < kNumParams; ++i) grads.push_back(model.grad(i));
    bucketer.emplace(comm, grads, buckets);
  } else {
    comm::ShardOptions options;
    options.stage = args.zero;
    options.buckets = buckets;
    sharded.emplace(comm, Rule::preset(args.optimizer),
                    std::vector<ParamGroup>{make_group(model, args.optimizer)}, options);
  }
  // docs:end setup
  if (root) {
    std::int64_t params = 0;
    for (std::int64_t n : kNumel) params += n;
    std::printf(
        "dp_mlp: %d ranks, MLP %d-%d-%d-1 (%lld parameters), %d samples, global batch "
        "%d (%d per rank), %d steps per epoch\n",
        ranks, kIn, kHidden, kHidden, static_cast<long long>(params), args.samples, args.batch,
        shard, steps);
    std::printf("transport: %s\n", comm.transport().c_str());
    if (sharded) {
      const comm::ShardStats stats = sharded->stats();
      std::printf("this rank's shard: %s\n", stats.local.fusion_report.c_str());
      std::printf("sharded: %s\n", stats.report.c_str());
    } else {
      std::printf("%s\n", opt->stats().fusion_report.c_str());
      std::printf("gradients: %s\n", bucketer->report().c_str());
    }
  }

  for (int epoch = 1; epoch <= args.epochs; ++epoch) {
    const std::vector<int> order = epoch_order(args.samples, args.seed, epoch);
    double loss = 0;
    for (int s = 0; s < steps; ++s) {
      // docs:begin step
      // This rank's contiguous slice of the step's global batch.
      const int* mine = order.data() + s * args.batch + rank * shard;
      loss += forward_backward(model, data, mine, shard, [&](int i) {
        if (sharded)
          sharded->mark_ready(i);
        else
          bucketer->mark_ready(i);
      });
      bool taken = false;
      if (sharded) {
        // Waits for the reductions, steps this rank's shard with the 1 / ranks average
        // folded in, and broadcasts every shard: the parameters are whole again everywhere.
        taken = sharded->step();
      } else {
        bucketer->finish();  // the gradients now hold the sum over ranks
        taken = opt->step_scaled(bucketer->grad_scale());
      }
      // docs:end step
      if (!taken) {
        // The sum carries a NaN or an infinity to every rank (the sharded optimizer combines
        // its owners' checks): all of them stop here.
        if (root) std::fprintf(stderr, "dp_mlp: non-finite gradient at epoch %d\n", epoch);
        return 1;
      }
    }
    // The epoch's loss: every sample's loss, measured before its step, summed over the
    // ranks (fp32 is plenty for printing) and averaged.
    float total = static_cast<float>(loss);
    comm.all_reduce(&total, 1, DType::F32).wait();
    if (root)
      std::printf("epoch %3d  loss %.6f\n", epoch,
                  total / (static_cast<double>(steps) * args.batch));
  }
  if (root && sharded) {
    const comm::ShardStats stats = sharded->stats();
    const long long taken = sharded->step_count();
    std::printf("%lld gradient %s and %lld parameter broadcasts in %lld steps\n",
                taken * stats.reduce_collectives, args.zero == 1 ? "all-reduces" : "reduces",
                taken * stats.gather_collectives, taken);
  } else if (root) {
    std::printf("%lld gradient all-reduces in %d steps\n",
                static_cast<long long>(bucketer->collectives()), steps * args.epochs);
  }

  // Replicas: every rank compares its parameters with rank 0's, bit for bit.
  float differs = 0;
  for (int i = 0; i < kNumParams; ++i) {
    const Tensor p = model.param(i);
    std::vector<float> root_copy(f32(p), f32(p) + p.numel);
    comm.broadcast(root_copy.data(), p.numel, DType::F32, 0).wait();
    if (std::memcmp(root_copy.data(), p.data, root_copy.size() * sizeof(float)) != 0) differs = 1;
  }
  comm.all_reduce(&differs, 1, DType::F32, comm::ReduceOp::Max).wait();

  // Rank 0 against the single-process run; the verdict goes to every rank so that all of
  // them exit alike.
  float ok = 0;
  if (root) {
    if (differs == 0)
      std::printf("replicas: all %d ranks hold bit-identical parameters\n", ranks);
    else
      std::printf("replicas: MISMATCH, some rank's parameters differ from rank 0's\n");
    const FlatArena single = train_single(args, data);
    double max_abs = 0, max_rel = 0;
    for (int i = 0; i < kNumParams; ++i) {
      const float *a = f32(model.param(i)), *b = f32(single.param(i));
      double diff = 0, scale = 0;
      for (std::int64_t k = 0; k < kNumel[i]; ++k) {
        diff = std::max(diff, std::fabs(static_cast<double>(a[k]) - b[k]));
        scale = std::max(scale, std::fabs(static_cast<double>(b[k])));
      }
      max_abs = std::max(max_abs, diff);
      if (scale > 0) max_rel = std::max(max_rel, diff / scale);
    }
    std::printf(
        "rank 0 vs single process: max |diff| %.3g, max relative diff %.3g (of each "
        "tensor's largest |parameter|)\n",
        max_abs, max_rel);
    const bool match = max_abs <= kTolerance && differs == 0;
    if (max_abs <= kTolerance)
      std::printf(
          "final parameters match single-process training (max |diff| %.2g <= "
          "tolerance %.0e: fp32 sums in another order)\n",
          max_abs, kTolerance);
    else
      std::printf(
          "MISMATCH: final parameters differ from single-process training (max |diff| "
          "%.2g > tolerance %.0e)\n",
          max_abs, kTolerance);
    ok = match ? 1.0f : 0.0f;
    std::printf("transport at the end: %s\n", comm.transport().c_str());
  }
  comm.broadcast(&ok, 1, DType::F32, 0).wait();
  return ok == 1.0f ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {  // before MPI starts: a plain process answers
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf(
          "usage: mpirun -np RANKS dp_mlp [--epochs N] [--batch N] [--samples N] [--seed N] "
          "[--optimizer adamw|sgd] [--zero 0|1|2]\n"
          "Data-parallel training of a small MLP: gradients all-reduced in buckets (or, with "
          "--zero, the optimizer state sharded across the ranks).\n");
      return 0;
    }
  }
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // fusedopt::Error (CommError names the rank) and others
    std::fprintf(stderr, "dp_mlp: error: %s\n", e.what());
    return 1;
  }
}
