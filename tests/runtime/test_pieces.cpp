// Params that are dim-0 pieces of bigger tensors (Tensor::whole_shape, PyTorch FSDP2): R
// optimizers, one per simulated rank, each over its pieces of the same params (uneven, one
// rank's piece empty), stepped in R threads whose reduction hooks combine their partials as
// the collectives would (in rank order); their params must match one optimizer over the
// whole params.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/host_tensors.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/extension.hpp"
#include "fusedopt/optimizer.hpp"

using fusedopt::DType;
using fusedopt::Optimizer;
using fusedopt::OptimizerOptions;
using fusedopt::ParamGroup;
using fusedopt::ReductionPartials;
using fusedopt::Rule;
using fusedopt::Tensor;
using fusedopt::UsageError;
using fusedopt::testing::fresh_seed;
using fusedopt::testing::HostTensor;
using fusedopt::testing::use_private_cache;

namespace {

/// A barrier for a fixed number of threads (C++17 has none). break_all() releases every
/// waiter with an exception, so that one rank's failure does not hang the others.
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (broken_) throw std::runtime_error("barrier broken");
    const long generation = generation_;
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation || broken_; });
    if (broken_) throw std::runtime_error("barrier broken");
  }
  void break_all() {
    std::lock_guard<std::mutex> lock(mutex_);
    broken_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int count_;
  int arrived_ = 0;
  long generation_ = 0;
  bool broken_ = false;
};

/// What a hook must combine, in one flat order: the global slots of the call, the
/// per-tensor columns of the call (binding by binding, tensor by tensor), the shard.
struct Flat {
  std::vector<double*> at;
  std::vector<char> max;
};

Flat flatten(const ReductionPartials& p) {
  Flat f;
  for (const fusedopt::ReductionSlotInfo& s : p.slots) {
    if (!s.per_tensor) {
      f.at.push_back(p.global + s.slot);
      f.max.push_back(s.max ? 1 : 0);
      continue;
    }
    for (const ReductionPartials::TensorTotals& t : p.tensors) {
      for (std::int64_t k = 0; k < t.num_tensors; ++k) {
        f.at.push_back(t.data + k * t.stride + s.slot);
        f.max.push_back(s.max ? 1 : 0);
      }
    }
  }
  for (std::int64_t i = 0; i < p.num_shard; ++i) {
    f.at.push_back(p.shard + i);
    f.max.push_back(p.shard_max[static_cast<std::size_t>(i)]);
  }
  return f;
}

/// The collectives of R ranks in one process: each rank's hook posts its partials, rank 0
/// combines them in rank order (sum, or max where flagged), every rank takes the result.
class Combiner {
 public:
  explicit Combiner(int ranks) : barrier_(ranks), posted_(static_cast<std::size_t>(ranks)) {}
  void combine(int rank, const ReductionPartials& p) {
    posted_[static_cast<std::size_t>(rank)] = flatten(p);
    calls_[static_cast<std::size_t>(rank)].push_back(
        {p.pass, p.stage, posted_[static_cast<std::size_t>(rank)].at.size()});
    barrier_.wait();
    if (rank == 0) {
      const Flat& first = posted_[0];
      result_.assign(first.at.size(), 0.0);
      for (std::size_t i = 0; i < first.at.size(); ++i) result_[i] = *first.at[i];
      for (std::size_t r = 1; r < posted_.size(); ++r) {
        const Flat& f = posted_[r];
        if (f.at.size() != first.at.size() || f.max != first.max) {
          layout_error_ = "rank " + std::to_string(r) + " handed a different layout";
          continue;
        }
        for (std::size_t i = 0; i < f.at.size(); ++i) {
          result_[i] = first.max[i] ? std::max(result_[i], *f.at[i]) : result_[i] + *f.at[i];
        }
      }
    }
    barrier_.wait();
    Flat& mine = posted_[static_cast<std::size_t>(rank)];
    for (std::size_t i = 0; i < mine.at.size() && i < result_.size(); ++i) *mine.at[i] = result_[i];
    barrier_.wait();
  }
  Barrier& barrier() { return barrier_; }
  /// Per rank, each call: pass, stage and how many doubles it combined.
  struct Call {
    int pass, stage;
    std::size_t values;
    bool operator==(const Call& o) const {
      return pass == o.pass && stage == o.stage && values == o.values;
    }
  };
  std::vector<std::vector<Call>> calls_ = std::vector<std::vector<Call>>(8);
  std::string layout_error_;

 private:
  Barrier barrier_;
  std::vector<Flat> posted_;
  std::vector<double> result_;
};

/// One param: its whole shape, and the rows of dim 0 each rank holds.
struct WholeParam {
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> rows;  ///< per rank
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    return n;
  }
  std::int64_t row_elems() const { return numel() / shape[0]; }
  std::int64_t first_row(int rank) const {
    std::int64_t r = 0;
    for (int k = 0; k < rank; ++k) r += rows[static_cast<std::size_t>(k)];
    return r;
  }
};

/// Uneven dim-0 splits of `shapes` over `ranks`: param k's piece on rank (k + 1) % ranks is
/// empty (at 2 ranks only param 1's: the others are split), the others get one row or more
/// each, at random.
std::vector<WholeParam> split(const std::vector<std::vector<std::int64_t>>& shapes, int ranks,
                              std::mt19937& rng) {
  std::vector<WholeParam> out;
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    WholeParam w;
    w.shape = shapes[k];
    w.rows.assign(static_cast<std::size_t>(ranks), 0);
    const int empty = ranks > 2 || k == 1 ? static_cast<int>(k + 1) % ranks : -1;
    std::int64_t left = w.shape[0];
    for (int r = 0; r < ranks; ++r) {
      if (r != empty) w.rows[static_cast<std::size_t>(r)] = 1, --left;
    }
    std::uniform_int_distribution<int> pick(0, ranks - 1);
    while (left > 0) {
      const int r = pick(rng);
      if (r == empty) continue;
      ++w.rows[static_cast<std::size_t>(r)];
      --left;
    }
    out.push_back(std::move(w));
  }
  return out;
}

/// The piece of shape `w` that rank `rank` holds, as a Tensor over `memory`.
Tensor piece_tensor(HostTensor& memory, const WholeParam& w, int rank, const std::string& name) {
  Tensor t = memory.tensor(name);
  t.shape = w.shape;
  t.shape[0] = w.rows[static_cast<std::size_t>(rank)];
  t.whole_shape = w.shape;
  t.whole_offset = w.first_row(rank);
  return t;
}

struct Outcome {
  double max_error = 0;  ///< max |sharded - whole| / max(1, max |whole|), over every param
  std::string failure;   ///< a rank's exception or a layout mismatch
  std::vector<std::vector<Combiner::Call>> calls;
};

/// `steps` steps of `rule` over params of `shapes` (fresh normal values and gradients of
/// `dtype`): once whole, once as `ranks` optimizers over pieces with a combining hook.
Outcome run_sharded(const Rule& rule, const OptimizerOptions& options,
                    const std::vector<std::pair<std::string, double>>& hypers,
                    const std::vector<std::vector<std::int64_t>>& shapes, DType dtype, int ranks,
                    int steps, std::uint32_t seed, const char* scalar = nullptr) {
  std::mt19937 rng(seed);
  const std::vector<WholeParam> params = split(shapes, ranks, rng);
  std::normal_distribution<double> normal(0.0, 1.0);
  // The whole optimizer.
  std::vector<HostTensor> whole_p, whole_g;
  ParamGroup whole_group;
  whole_group.hypers = hypers;
  for (std::size_t k = 0; k < params.size(); ++k) {
    whole_p.emplace_back(params[k].numel(), dtype);
    whole_g.emplace_back(params[k].numel(), dtype);
  }
  for (std::size_t k = 0; k < params.size(); ++k) {
    for (std::int64_t i = 0; i < params[k].numel(); ++i) whole_p[k].set(i, normal(rng));
    Tensor p = whole_p[k].tensor("w" + std::to_string(k));
    p.shape = params[k].shape;
    whole_group.params.push_back(p);
    whole_group.grads.push_back(whole_g[k].tensor());
  }
  // The ranks' pieces: copies of their rows.
  std::vector<std::vector<HostTensor>> piece_p(static_cast<std::size_t>(ranks)),
      piece_g(static_cast<std::size_t>(ranks));
  std::vector<ParamGroup> rank_groups(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    auto& pp = piece_p[static_cast<std::size_t>(r)];
    auto& pg = piece_g[static_cast<std::size_t>(r)];
    for (const WholeParam& w : params) {
      const std::int64_t n = w.rows[static_cast<std::size_t>(r)] * w.row_elems();
      pp.emplace_back(n, dtype);
      pg.emplace_back(n, dtype);
    }
    ParamGroup& group = rank_groups[static_cast<std::size_t>(r)];
    group.hypers = hypers;
    for (std::size_t k = 0; k < params.size(); ++k) {
      const std::int64_t e0 = params[k].first_row(r) * params[k].row_elems();
      for (std::int64_t i = 0; i < pp[k].numel(); ++i) pp[k].set(i, whole_p[k].get(e0 + i));
      group.params.push_back(piece_tensor(pp[k], params[k], r, "w" + std::to_string(k)));
      group.grads.push_back(pg[k].tensor());
    }
  }
  Optimizer whole(rule, {whole_group}, options);
  std::vector<std::unique_ptr<Optimizer>> opts;
  Combiner combiner(ranks);
  for (int r = 0; r < ranks; ++r) {
    opts.push_back(std::make_unique<Optimizer>(
        rule, std::vector<ParamGroup>{rank_groups[static_cast<std::size_t>(r)]}, options));
    fusedopt::OptimizerExtension::set_reduction_hook(
        *opts.back(), [&combiner, r](const ReductionPartials& p) { combiner.combine(r, p); });
  }
  Outcome out;
  std::mutex failure_mutex;
  for (int s = 0; s < steps; ++s) {
    // Fresh gradients, the same values whole and in pieces.
    for (std::size_t k = 0; k < params.size(); ++k) {
      for (std::int64_t i = 0; i < params[k].numel(); ++i) whole_g[k].set(i, normal(rng));
      for (int r = 0; r < ranks; ++r) {
        HostTensor& g = piece_g[static_cast<std::size_t>(r)][k];
        const std::int64_t e0 = params[k].first_row(r) * params[k].row_elems();
        for (std::int64_t i = 0; i < g.numel(); ++i) g.set(i, whole_g[k].get(e0 + i));
      }
    }
    whole.step();
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        try {
          opts[static_cast<std::size_t>(r)]->step();
        } catch (const std::exception& e) {
          {
            std::lock_guard<std::mutex> lock(failure_mutex);
            if (out.failure.empty()) out.failure = "rank " + std::to_string(r) + ": " + e.what();
          }
          combiner.barrier().break_all();
        }
      });
    }
    for (std::thread& t : threads) t.join();
    if (!out.failure.empty()) return out;
  }
  out.failure = combiner.layout_error_;
  // A per-tensor scalar state: the whole tensor's on every rank, the empty piece's too.
  for (std::size_t k = 0; k < params.size() && scalar; ++k) {
    const double want = fusedopt::testing::at(whole.state(scalar, static_cast<int>(k)), 0);
    for (const auto& opt : opts) {
      const double got = fusedopt::testing::at(opt->state(scalar, static_cast<int>(k)), 0);
      out.max_error =
          std::max(out.max_error, std::fabs(got - want) / std::max(1.0, std::fabs(want)));
    }
  }
  out.calls.assign(combiner.calls_.begin(), combiner.calls_.begin() + ranks);
  for (std::size_t k = 0; k < params.size(); ++k) {
    double scale = 1.0;
    for (std::int64_t i = 0; i < params[k].numel(); ++i) {
      scale = std::max(scale, std::fabs(whole_p[k].get(i)));
    }
    for (int r = 0; r < ranks; ++r) {
      const HostTensor& p = piece_p[static_cast<std::size_t>(r)][k];
      const std::int64_t e0 = params[k].first_row(r) * params[k].row_elems();
      for (std::int64_t i = 0; i < p.numel(); ++i) {
        const double err = std::fabs(p.get(i) - whole_p[k].get(e0 + i)) / scale;
        out.max_error = std::isnan(err) ? INFINITY : std::max(out.max_error, err);
      }
    }
  }
  return out;
}

/// 1-D, 2-D and 3-D params (the 1-D and 2-D ones' column and matrix means span pieces).
const std::vector<std::vector<std::int64_t>> kShapes = {{53}, {23, 12}, {7, 4, 5}};

/// Runs `rule` at 2, 3 and 4 ranks and checks the params against the whole run's.
void check_all_ranks(const Rule& rule, const OptimizerOptions& options,
                     const std::vector<std::pair<std::string, double>>& hypers, DType dtype,
                     double tol, const std::vector<std::vector<std::int64_t>>& shapes = kShapes,
                     const char* scalar = nullptr) {
  for (int ranks : {2, 3, 4}) {
    const std::uint32_t seed = fresh_seed();
    CAPTURE(ranks);
    CAPTURE(seed);
    const Outcome o = run_sharded(rule, options, hypers, shapes, dtype, ranks, 6, seed, scalar);
    REQUIRE(o.failure.empty());
    CAPTURE(o.max_error);
    if (tol == 0.0) {
      CHECK(o.max_error == 0.0);
    } else {
      CHECK(o.max_error <= tol);
    }
    // Every rank got the same calls, of the same sizes.
    for (const auto& calls : o.calls) CHECK(calls == o.calls.front());
  }
}

// fp32 tolerance of the rules with reductions: the pieces' sums are added in another order
// (each piece's chunks in fp32 lanes, then the ranks' totals in double) than the whole
// tensor's, so norms and means differ by a few fp32 ulps, which 6 steps carry into the
// params at about that relative size.
constexpr double kTol = 2e-6;

}  // namespace

TEST_SUITE("runtime") {
  TEST_CASE("element-wise presets over pieces match the whole params bit for bit") {
    use_private_cache();
    check_all_ranks(Rule::preset("adamw"), {}, {{"weight_decay", 0.1}}, DType::F32, 0.0);
    check_all_ranks(Rule::preset("lion"), {}, {}, DType::F32, 0.0);
  }

  TEST_CASE("presets with global and per-tensor norms over pieces match the whole params") {
    use_private_cache();
    OptimizerOptions clip;
    clip.max_grad_norm = 5.0;  // below the gradients' norm (about 15): it clips
    check_all_ranks(Rule::preset("adamw"), clip, {}, DType::F32, kTol);
    check_all_ranks(Rule::preset("lamb"), {}, {{"weight_decay", 0.01}}, DType::F32, kTol);
    check_all_ranks(Rule::preset("lars"), {}, {{"weight_decay", 0.01}}, DType::F32, kTol);
  }

  TEST_CASE("factored presets over pieces match the whole params") {
    use_private_cache();
    check_all_ranks(Rule::preset("adafactor"), {}, {}, DType::F32, kTol);
    check_all_ranks(Rule::preset("came"), {}, {{"lr", 1e-2}}, DType::F32, kTol);
    check_all_ranks(Rule::preset("adam_mini"), {}, {}, DType::F32, kTol);
  }

  TEST_CASE("means over pieces and the built-ins read the whole tensor") {
    use_private_cache();
    // A mean through numel, every built-in in the update, and a per-tensor scalar state
    // (compared too: the whole tensor's on every rank): each is the whole tensor's.
    const Rule rule = Rule::parse(
        "param p\n"
        "grad g\n"
        "state m = 0\n"
        "scalar ms = 0\n"
        "hyper lr = 0.05\n"
        "mean = tensor_sum(g) / numel\n"
        "ms = 0.5 * ms + tensor_sum(g * g) / numel\n"
        "m = 0.9 * m + (g - mean) / sqrt(ms)\n"
        "p = p - lr * m * (rows + 2 * cols + 3 * dims) / (rows + 2 * cols + 3 * dims + numel)\n",
        "centred.rule");
    check_all_ranks(rule, {}, {}, DType::F32, kTol, kShapes, "ms");
  }

  TEST_CASE("a factored rule's column and matrix means over pieces match the whole tensor's") {
    use_private_cache();
    // Every kind of mean that spans pieces, in two passes: column means, matrix means over
    // rows and over columns, and a matrix mean over rows that reads a tensor norm.
    const Rule rule = Rule::parse(
        "param p\n"
        "grad g\n"
        "row r = 1\n"
        "col c = 1\n"
        "hyper lr = 0.01\n"
        "r = 0.5 * r + row_mean(g * g)\n"
        "c = 0.5 * c + col_mean(g * g)\n"
        "u = g * rsqrt(r * c / matrix_mean(r)) * rsqrt(matrix_mean(c))\n"
        "n = tensor_norm(u) / sqrt(numel)\n"
        "p = p - lr * u / max(n, 1e-3)\n",
        "means.rule");
    check_all_ranks(rule, {}, {}, DType::F32, kTol);
  }

  TEST_CASE("stochastic rounding over bf16 pieces draws the whole params' bits") {
    use_private_cache();
    OptimizerOptions sr;
    sr.stochastic_rounding = true;
    sr.seed = 1234;
    check_all_ranks(Rule::preset("adamw"), sr, {{"lr", 1e-2}}, DType::BF16, 0.0);
  }

  TEST_CASE("8-bit states over pieces match the whole params within their blocks' rounding") {
    use_private_cache();
    // Whole params of 384 to 640 elements, quantized (quant_min_numel 256, decided on the
    // whole numel: every rank's pieces, the empty one too, are quantized) in blocks of 64
    // within each piece: a piece's blocks start at its first element, so their absmax differ
    // from the whole run's and m and v carry a different 8-bit rounding (about 1% of the
    // block's absmax). Each step then moves an element by lr * m / sqrt(v) (at most about lr
    // for Adam) give or take that 1% (and more where v is small), so 6 steps of lr 1e-3 stay
    // within 6 x 1e-3 x 0.25 (a quarter of a step: rounding of m and sqrt(v) combined, with
    // margin).
    OptimizerOptions q;
    q.quant_min_numel = 256;
    q.quant_block = 64;
    const double tol = 6 * 1e-3 * 0.25;
    check_all_ranks(Rule::preset("adamw8bit"), q, {}, DType::F32, tol,
                    {{400}, {40, 16}, {6, 8, 8}});
    // A factored rule with a quantized state: CAME's m in 8 bits (its blocks within the
    // piece too; the chunks of its rows start on them). Its update reads m twice, once
    // through the confidence (u - m)^2, whose row and column means amplify m's rounding
    // where u and m are close: the params stay within a step's size (lr) per step (seen:
    // up to about 0.3 lr per step, relative to the largest param).
    OptimizerOptions qm = q;
    qm.state_storage = {{"m", "q8"}};
    check_all_ranks(Rule::preset("came"), qm, {{"lr", 1e-3}}, DType::F32, 6 * 1e-3,
                    {{400}, {40, 16}, {6, 8, 8}});
  }

  TEST_CASE("pieces add hook calls only for a factored rule's means") {
    use_private_cache();
    const std::uint32_t seed = fresh_seed();
    // Adafactor: pass 0 has column means and a matrix mean over rows (two calls), pass 1 a
    // tensor norm (one call).
    const Outcome o =
        run_sharded(Rule::preset("adafactor"), {}, {}, kShapes, DType::F32, 2, 1, seed);
    REQUIRE(o.failure.empty());
    REQUIRE(o.calls.size() == 2);
    REQUIRE(o.calls[0].size() == 3);
    CHECK(o.calls[0][0].pass == 0);
    CHECK(o.calls[0][0].stage == 0);
    CHECK(o.calls[0][1].pass == 0);
    CHECK(o.calls[0][1].stage == 1);
    CHECK(o.calls[0][2].pass == 1);
    CHECK(o.calls[0][2].stage == 0);
    // Element-wise adamw over pieces: no reduction, no call.
    const Outcome e = run_sharded(Rule::preset("adamw"), {}, {}, kShapes, DType::F32, 2, 1, seed);
    REQUIRE(e.failure.empty());
    CHECK(e.calls[0].empty());
  }

  TEST_CASE("bad pieces are refused, naming the tensor") {
    use_private_cache();
    HostTensor p(6, DType::F32), g(6, DType::F32);
    auto make = [&](std::vector<std::int64_t> shape, std::vector<std::int64_t> whole,
                    std::int64_t offset) {
      Tensor t = p.tensor("w");
      t.shape = std::move(shape);
      t.whole_shape = std::move(whole);
      t.whole_offset = offset;
      return Optimizer(Rule::preset("adamw"), {ParamGroup{{t}, {g.tensor()}, {}}});
    };
    CHECK_THROWS_WITH_AS(make({2, 3}, {8, 4}, 0),
                         "group 0, param 0 ('w'): shape [2, 3] is not a dim-0 piece of "
                         "whole_shape [8, 4] (a piece has the whole's shape but in dim 0)",
                         UsageError);
    CHECK_THROWS_WITH_AS(make({2, 3}, {8, 3, 1}, 0),
                         "group 0, param 0 ('w'): shape [2, 3] is not a dim-0 piece of "
                         "whole_shape [8, 3, 1] (a piece has the whole's shape but in dim 0)",
                         UsageError);
    CHECK_THROWS_WITH_AS(make({2, 3}, {7, 3}, 6),
                         "group 0, param 0 ('w'): rows [6, 8) of dim 0 are not within "
                         "whole_shape [7, 3] (whole_offset 6 + 2 rows must be at most 7)",
                         UsageError);
    CHECK_THROWS_WITH_AS(make({}, {5}, 0),
                         "group 0, param 0 ('w'): rows [0, 6) of dim 0 are not within "
                         "whole_shape [5] (whole_offset 0 + 6 rows must be at most 5)",
                         UsageError);
    CHECK_THROWS_WITH_AS(make({2, 3}, {7, 3}, -1),
                         "group 0, param 0 ('w'): rows [-1, 1) of dim 0 are not within "
                         "whole_shape [7, 3] (whole_offset -1 + 2 rows must be at most 7)",
                         UsageError);
    CHECK_THROWS_WITH_AS(make({2, 3}, {}, 4),
                         "group 0, param 0 ('w'): whole_offset is 4 but whole_shape is empty (a "
                         "piece gives the whole tensor's shape; an empty one means the tensor is "
                         "whole)",
                         UsageError);
    CHECK_THROWS_WITH_AS(make({2, 3}, {-7, 3}, 0),
                         "group 0, param 0 ('w'): whole_shape [-7, 3] has a negative dimension",
                         UsageError);
    CHECK_THROWS_WITH_AS(make({}, {7, 4}, 0),
                         "group 0, param 0 ('w'): shape [6] is not a dim-0 piece of "
                         "whole_shape [7, 4] (a piece has the whole's shape but in dim 0)",
                         UsageError);
    // Accepted: a piece at the end, a 1-D element range, a piece without a shape (2 rows of
    // 3: the whole's shape but in dim 0), an empty piece.
    CHECK_NOTHROW(make({2, 3}, {7, 3}, 5));
    CHECK_NOTHROW(make({}, {9}, 3));
    CHECK_NOTHROW(make({}, {7, 3}, 5));
    HostTensor none(0, DType::F32), none_g(0, DType::F32);
    Tensor t = none.tensor("e");  // no shape: 0 rows of 3
    t.whole_shape = {7, 3};
    t.whole_offset = 7;
    CHECK_NOTHROW(Optimizer(Rule::preset("adafactor"), {ParamGroup{{t}, {none_g.tensor()}, {}}}));
  }
}
