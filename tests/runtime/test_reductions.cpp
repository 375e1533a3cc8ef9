// Rules with reductions through the Optimizer, against float64 references written here from
// the rules' comments: LAMB (apex FusedLAMB) with every reduction strategy, LARS (MLPerf),
// clipping by global norm (torch's clip_grad_norm_) in front of AdamW and SGD, per-tensor
// norms over a FlatArena, bits that do not depend on the thread count, step_scaled with
// reductions, the reduction hook as an in-process all-reduce between two optimizers, and
// bf16 params with an fp32 master.
//
// Tolerances (fp32 math against a float64 trajectory that starts from the same values and
// never looks at the optimizer again; over a few dozen seeds the worst error measured was
// 0.27 of its bound, AdamW's params, and under 0.2 elsewhere):
//   params: |got - ref| <= kParamTol * (1 + |ref|). Per step the param is rounded once
//     (half an ulp, 3e-8 relative), and AdamW's decay factor 1 - lr * weight_decay is
//     rounded to fp32 once and applied every step: that error is systematic, up to 3e-8
//     relative per step, 3e-6 after 100 (measured: 2.5e-6, a quarter of the bound at
//     |p| = 2). The rest of an update is lr times a ratio of fp32 values good to a few ulps.
//     The norms' fp32 lane sums (2048 squares per lane and chunk, then double) are good to
//     about 1e-7 relative for fp32 grads and 4e-6 for bf16 ones (squares of 8-bit
//     mantissas round with a bias); they scale the clip factor and trust ratios, so the
//     update, by that fraction: far below the bound.
//   states: |got - ref| <= kStateTol * (|ref| + max |ref| of that state at that step). m
//     and v are a few roundings from the (clipped) grads, plus the clip factor's error
//     (v: the sum of squares', so up to 4e-6 relative with bf16 grads, a fifth of the
//     bound at the largest v); their magnitudes follow the grad scale over orders of magnitude,
//     and an m near zero is the difference of larger terms, so the bound is relative to
//     the state's scale (the preset tests' rule).
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>

#include "common/close.hpp"
#include "common/host_tensors.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/extension.hpp"

namespace fusedopt::testing {
namespace {

using fusedopt::DType;
using fusedopt::Optimizer;
using fusedopt::OptimizerOptions;
using fusedopt::ParamGroup;
using fusedopt::ReductionStrategy;
using fusedopt::Rule;

using Vec = std::vector<double>;
using Vecs = std::vector<Vec>;

constexpr double kParamTol = 1e-5;
constexpr double kStateTol = 1e-5;

/// One element, odd sizes, an empty tensor, exactly one 32768-element host chunk, and
/// tensors over two and three chunks (65537, 70000).
const std::vector<std::int64_t> kSizes = {1, 3,     17,    1000, 4099, 70000,
                                          0, 32768, 65537, 257,  5000, 131};

// apex FusedLAMB's and the MLPerf LARS reference's defaults, written out (not read from the
// rules).
const Hypers kLambDefaults = {{"lr", 1e-3},     {"beta1", 0.9},         {"beta2", 0.999},
                              {"eps", 1e-6},    {"weight_decay", 0.01}, {"max_grad_norm", 1.0},
                              {"use_nvlamb", 0}};
const Hypers kLarsDefaults = {{"lr", 0.1},
                              {"momentum", 0.9},
                              {"weight_decay", 1e-4},
                              {"trust_coefficient", 1e-3},
                              {"eps", 1e-9}};

std::int64_t total(const std::vector<std::int64_t>& sizes) {
  std::int64_t n = 0;
  for (std::int64_t s : sizes) n += s;
  return n;
}

Vec values(const HostTensor& t) {
  Vec out(static_cast<std::size_t>(t.numel()));
  for (std::int64_t i = 0; i < t.numel(); ++i) out[static_cast<std::size_t>(i)] = t.get(i);
  return out;
}

Vec values(const fusedopt::Tensor& t) {
  Vec out(static_cast<std::size_t>(t.numel));
  for (std::int64_t i = 0; i < t.numel; ++i) out[static_cast<std::size_t>(i)] = at(t, i);
  return out;
}

Vecs values(const std::vector<HostTensor>& ts) {
  Vecs out;
  for (const HostTensor& t : ts) out.push_back(values(t));
  return out;
}

double norm_sq(const Vec& x) {
  double s = 0;
  for (double e : x) s += e * e;
  return s;
}

/// The bytes of a tensor view (empty for an empty tensor).
std::string bytes_of(const fusedopt::Tensor& t) {
  if (t.numel == 0 || t.data == nullptr) return {};
  return {static_cast<const char*>(t.data),
          static_cast<std::size_t>(t.numel * fusedopt::dtype_size(t.dtype))};
}

/// Normal values, tensor k times factor[k], all scaled so that the global norm of the
/// double values is `norm` (the stored values round to the tensor's dtype). Every call
/// draws fresh values.
void fill_grads(std::vector<HostTensor>& g, std::mt19937& rng, double norm, const Vec& factor) {
  std::normal_distribution<double> normal(0.0, 1.0);
  Vecs raw(g.size());
  double sq = 0;
  for (std::size_t k = 0; k < g.size(); ++k) {
    for (std::int64_t i = 0; i < g[k].numel(); ++i) {
      raw[k].push_back(normal(rng) * factor[k]);
      sq += raw[k].back() * raw[k].back();
    }
  }
  const double scale = norm / std::sqrt(sq);
  for (std::size_t k = 0; k < g.size(); ++k) {
    for (std::int64_t i = 0; i < g[k].numel(); ++i)
      g[k].set(i, raw[k][static_cast<std::size_t>(i)] * scale);
  }
}

/// A log-uniform draw in [lo, hi].
double log_uniform(std::mt19937& rng, double lo, double hi) {
  return std::exp(std::uniform_real_distribution<double>(std::log(lo), std::log(hi))(rng));
}

/// Per-tensor grad magnitudes spread over two orders of magnitude.
Vec tensor_factors(std::mt19937& rng, std::size_t n) {
  Vec out;
  for (std::size_t k = 0; k < n; ++k) out.push_back(log_uniform(rng, 0.1, 10.0));
  return out;
}

/// Normal(0, scale[k]) initial params.
Vecs random_params(std::mt19937& rng, const std::vector<std::int64_t>& sizes,
                   const Vec& scale = {}) {
  std::normal_distribution<double> normal(0.0, 1.0);
  Vecs out(sizes.size());
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    for (std::int64_t i = 0; i < sizes[k]; ++i) {
      out[k].push_back(normal(rng) * (scale.empty() ? 1.0 : scale[k]));
    }
  }
  return out;
}

/// `x` as stored in fp32 (or another dtype): the reference starts from what the optimizer
/// starts from.
Vecs rounded(const Vecs& x, DType d) {
  Vecs out = x;
  for (Vec& v : out) {
    for (double& e : v)
      e = d == DType::F32 ? static_cast<double>(static_cast<float>(e)) : round_to(d, e);
  }
  return out;
}

Vecs zeros_like(const Vecs& x) {
  Vecs out;
  for (const Vec& v : x) out.emplace_back(v.size(), 0.0);
  return out;
}

// ---------------------------------------------------------------------------------------
// The float64 references.

/// LAMB as templates/rules/lamb.rule documents it (apex FusedLAMB: grad_averaging,
/// adam_w_mode, bias_correction), one step over every tensor; h[k] is tensor k's hypers.
/// `one_norm` computes ||p|| and ||u|| over all tensors together, as if they were one flat
/// buffer (Bagua's flattened-LAMB bug), instead of per tensor. Returns whether the
/// gradients were clipped (against tensor 0's max_grad_norm).
bool lamb_reference(int t, const std::vector<Hypers>& h, Vecs& p, Vecs& m, Vecs& v, const Vecs& g,
                    bool one_norm = false) {
  double gsq = 0;
  for (const Vec& x : g) gsq += norm_sq(x);
  const double gn = std::sqrt(gsq);
  Vecs u(p.size());
  bool clipped = false;
  for (std::size_t k = 0; k < p.size(); ++k) {
    const double b1 = hyper(h[k], "beta1"), b2 = hyper(h[k], "beta2"), eps = hyper(h[k], "eps");
    const double wd = hyper(h[k], "weight_decay"), mgn = hyper(h[k], "max_grad_norm");
    const double div = mgn > 0 && gn > mgn ? gn / mgn : 1.0;
    if (k == 0) clipped = div != 1.0;
    const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    u[k].reserve(p[k].size());
    for (std::size_t i = 0; i < p[k].size(); ++i) {
      const double gc = g[k][i] / div;
      m[k][i] = b1 * m[k][i] + (1 - b1) * gc;
      v[k][i] = b2 * v[k][i] + (1 - b2) * gc * gc;
      u[k].push_back((m[k][i] / bc1) / (std::sqrt(v[k][i] / bc2) + eps) + wd * p[k][i]);
    }
  }
  double all_p = 0, all_u = 0;
  for (std::size_t k = 0; k < p.size(); ++k) {
    all_p += norm_sq(p[k]);
    all_u += norm_sq(u[k]);
  }
  for (std::size_t k = 0; k < p.size(); ++k) {
    const double lr = hyper(h[k], "lr"), wd = hyper(h[k], "weight_decay");
    const bool nvlamb = hyper(h[k], "use_nvlamb") != 0;
    const double pn = std::sqrt(one_norm ? all_p : norm_sq(p[k]));
    const double un = std::sqrt(one_norm ? all_u : norm_sq(u[k]));
    const double trust = pn > 0 && un > 0 && (wd != 0 || nvlamb) ? pn / un : 1.0;
    for (std::size_t i = 0; i < p[k].size(); ++i) p[k][i] = p[k][i] - lr * trust * u[k][i];
  }
  return clipped;
}

/// LARS as templates/rules/lars.rule documents it (MLPerf ResNet-50, torchlars), one step
/// of tensor k with its hypers h.
void lars_reference(const Hypers& h, Vec& p, Vec& v, const Vec& g) {
  const double lr = hyper(h, "lr"), momentum = hyper(h, "momentum");
  const double wd = hyper(h, "weight_decay"), tc = hyper(h, "trust_coefficient");
  const double eps = hyper(h, "eps");
  const double pn = std::sqrt(norm_sq(p)), gn = std::sqrt(norm_sq(g));
  const double local_lr = pn > 0 && gn > 0 ? tc * pn / (gn + wd * pn + eps) : 1.0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    v[i] = momentum * v[i] + lr * local_lr * (g[i] + wd * p[i]);
    p[i] = p[i] - v[i];
  }
}

/// torch.nn.utils.clip_grad_norm_(params, max_norm) (norm_type 2): the total norm over
/// every gradient, clip_coef = max_norm / (total_norm + 1e-6) clamped to at most 1, every
/// gradient multiplied by it. Returns whether it scaled them down.
bool clip_reference(Vecs& g, double max_norm) {
  double sq = 0;
  for (const Vec& x : g) sq += norm_sq(x);
  const double coef = std::min(1.0, max_norm / (std::sqrt(sq) + 1e-6));
  for (Vec& x : g) {
    for (double& e : x) e *= coef;
  }
  return coef < 1.0;
}

// ---------------------------------------------------------------------------------------
// Comparison.

/// Counts values outside their bound, remembering the first one. `what` is a string or a
/// callable that returns one: the tests check millions of elements, so they pass a lambda
/// and the label is only built for the first value out of bounds.
struct Tally {
  long long bad = 0;
  std::string first;
  template <typename What>
  void check(const What& what, double got, double want, double allowed) {
    const double d = std::abs(got - want);
    if (!(d <= allowed) && bad++ == 0) {  // NaN fails too
      first = label_of(what) + ": got " + fmt_double(got) + ", reference " + fmt_double(want) +
              ", allowed " + fmt_double(allowed);
    }
  }

 private:
  static std::string label_of(const std::string& what) { return what; }
  template <typename F>
  static std::string label_of(const F& what) {
    return what();
  }
};

/// Params against the reference: kParamTol * (1 + |ref|).
void check_params(Tally& tally, const std::string& label, const Vecs& got, const Vecs& ref,
                  double tol = kParamTol) {
  for (std::size_t k = 0; k < ref.size(); ++k) {
    for (std::size_t i = 0; i < ref[k].size(); ++i) {
      tally.check(
          [&] {
            return label + " param of tensor " + std::to_string(k) + ", element " +
                   std::to_string(i);
          },
          got[k][i], ref[k][i], tol * (1 + std::abs(ref[k][i])));
    }
  }
}

/// A state against the reference: kStateTol * (|ref| + max |ref| of the state).
void check_state(Tally& tally, const std::string& label, const Vecs& got, const Vecs& ref) {
  const double scale = max_abs(ref);
  for (std::size_t k = 0; k < ref.size(); ++k) {
    for (std::size_t i = 0; i < ref[k].size(); ++i) {
      tally.check(
          [&] {
            return label + " of tensor " + std::to_string(k) + ", element " + std::to_string(i);
          },
          got[k][i], ref[k][i], kStateTol * (std::abs(ref[k][i]) + scale));
    }
  }
}

// ---------------------------------------------------------------------------------------
// Fixtures.

/// Params with their own memory (initial values `init`, rounded to dtypes[k], or to
/// dtypes[0] for all), the optimizer over them and grads the caller owns. Tensor k goes to group
/// group_of[k] (empty: all in group 0); index[k] is its parameter index in the optimizer.
struct Net {
  std::vector<HostTensor> p;
  std::vector<int> index;
  std::unique_ptr<Optimizer> opt;

  Net(const Rule& rule, const Vecs& init, const std::vector<DType>& dtypes,
      std::vector<HostTensor>& g, const std::vector<int>& group_of,
      const std::vector<Hypers>& groups, OptimizerOptions options = {}, std::size_t first = 0,
      std::size_t count = SIZE_MAX) {
    count = std::min(count, init.size() - first);
    std::vector<ParamGroup> pg(groups.size());
    for (std::size_t gr = 0; gr < groups.size(); ++gr) pg[gr].hypers = overrides(groups[gr]);
    for (std::size_t k = first; k < first + count; ++k) {
      p.emplace_back(static_cast<std::int64_t>(init[k].size()),
                     dtypes.size() == 1 ? dtypes[0] : dtypes[k]);
      for (std::size_t i = 0; i < init[k].size(); ++i)
        p.back().set(static_cast<std::int64_t>(i), init[k][i]);
    }
    index.assign(count, 0);
    int next = 0;
    for (std::size_t gr = 0; gr < groups.size(); ++gr) {
      for (std::size_t j = 0; j < count; ++j) {
        const std::size_t k = first + j;
        if (static_cast<std::size_t>(group_of.empty() ? 0 : group_of[k]) != gr) continue;
        pg[gr].params.push_back(p[j].tensor("t" + std::to_string(k)));
        pg[gr].grads.push_back(g[k].tensor());
        index[j] = next++;
      }
    }
    opt = std::make_unique<Optimizer>(rule, std::move(pg), options);
  }

  Vecs params() const { return values(p); }
  Vecs state(const std::string& name) const {
    Vecs out;
    for (std::size_t j = 0; j < p.size(); ++j) out.push_back(values(opt->state(name, index[j])));
    return out;
  }
  /// Every byte a step may change: params and the named states.
  std::vector<std::string> snapshot(const std::vector<std::string>& states) const {
    std::vector<std::string> out;
    for (std::size_t j = 0; j < p.size(); ++j) {
      out.push_back(bytes_of(const_cast<HostTensor&>(p[j]).tensor()));
      for (const std::string& s : states) out.push_back(bytes_of(opt->state(s, index[j])));
    }
    return out;
  }
};

std::vector<HostTensor> make_grads(const std::vector<std::int64_t>& sizes,
                                   DType dtype = DType::F32) {
  std::vector<HostTensor> g;
  for (std::int64_t n : sizes) g.emplace_back(n, dtype);
  return g;
}

/// Per-tensor hypers from per-group ones.
std::vector<Hypers> per_tensor(const std::vector<Hypers>& groups, const std::vector<int>& group_of,
                               std::size_t n) {
  std::vector<Hypers> out;
  for (std::size_t k = 0; k < n; ++k) out.push_back(groups[group_of.empty() ? 0 : group_of[k]]);
  return out;
}

OptimizerOptions with_strategy(ReductionStrategy s) {
  OptimizerOptions o;
  o.reduction_strategy = s;
  return o;
}

/// A barrier for two threads with a deadline, so a hook that one rank never calls fails
/// the test instead of hanging it.
class Barrier2 {
 public:
  explicit Barrier2(std::chrono::seconds deadline) : deadline_(deadline) {}
  /// False when the other thread did not arrive within the deadline.
  bool wait() {
    if (timed_out) return false;  // fail fast once the ranks are out of step
    std::unique_lock<std::mutex> lock(mu_);
    const long gen = generation_;
    if (++arrived_ == 2) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return true;
    }
    const bool ok = cv_.wait_for(lock, deadline_, [&] { return generation_ != gen; });
    if (!ok) {
      arrived_ = 0;  // let later waits fail fast rather than pair up wrongly
      timed_out = true;
    }
    return ok;
  }
  std::atomic<bool> timed_out{false};

 private:
  std::chrono::seconds deadline_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  long generation_ = 0;
};

double max_nan(double a, double b) { return (b > a || b != b) ? b : a; }

/// An in-process stand-in for an all-reduce of the global slots of the current pass
/// between two ranks (threads): each publishes its raw totals, waits for the other, and
/// writes the combination (the same order on both ranks, so both get the same bits).
class AllReduce2 {
 public:
  explicit AllReduce2(std::chrono::seconds deadline = std::chrono::seconds(60))
      : barrier_(deadline) {}
  void operator()(int rank, const fusedopt::ReductionPartials& rp) {
    buf_[rank].assign(rp.global, rp.global + rp.num_global);
    if (!barrier_.wait()) return;
    for (const fusedopt::ReductionSlotInfo& s : rp.slots) {
      if (s.per_tensor) continue;
      const auto i = static_cast<std::size_t>(s.slot);
      const double a = buf_[0].at(i), b = buf_[1].at(i);
      rp.global[s.slot] = s.max ? max_nan(a, b) : a + b;
    }
    barrier_.wait();  // nobody republishes before both have read
  }
  bool timed_out() const { return barrier_.timed_out; }

 private:
  Barrier2 barrier_;
  Vec buf_[2];
};

/// What the first hook calls of rank 0 saw.
struct HookCall {
  int pass = -1;
  fusedopt::Device::Kind device = fusedopt::Device::Kind::Cuda;
  int num_global = 0;
  std::vector<fusedopt::ReductionSlotInfo> slots;
  Vec global;                    ///< raw, before the exchange
  std::vector<Vec> tensor_data;  ///< per binding: the raw per-tensor totals
  std::vector<std::vector<int>> tensor_params;
  std::vector<int> tensor_stride;
  std::vector<std::int64_t> tensor_count;
};

}  // namespace

TEST_SUITE("runtime") {
  TEST_CASE("LAMB matches its float64 reference over 100 steps with every reduction strategy") {
    use_private_cache();
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed << " (FUSEDOPT_TEST_SEED=" << seed << " replays it)");
    std::mt19937 rng(seed);
    const std::size_t nt = kSizes.size();
    const std::vector<Hypers> groups = {with(kLambDefaults, {{"lr", 1e-2}}),
                                        with(kLambDefaults, {{"lr", 4e-3}, {"weight_decay", 0.1}})};
    std::vector<int> group_of;
    for (std::size_t k = 0; k < nt; ++k) group_of.push_back(k % 3 == 2);
    const std::vector<Hypers> h = per_tensor(groups, group_of, nt);
    const Vec factor = tensor_factors(rng, nt);
    const Vecs init = random_params(rng, kSizes);
    std::vector<HostTensor> g = make_grads(kSizes);

    const Rule lamb = Rule::preset("lamb");
    const ReductionStrategy strategies[] = {ReductionStrategy::Auto, ReductionStrategy::Recompute,
                                            ReductionStrategy::Store};
    const char* names[] = {"auto", "recompute", "store"};
    std::vector<std::unique_ptr<Net>> nets;
    for (ReductionStrategy s : strategies) {
      nets.push_back(std::make_unique<Net>(lamb, init, std::vector<DType>{DType::F32}, g, group_of,
                                           groups, with_strategy(s)));
    }
    const std::int64_t elements = total(kSizes);
    for (std::size_t r = 0; r < 3; ++r) {
      INFO("strategy " << names[r]);
      const fusedopt::OptimizerStats st = nets[r]->opt->stats();
      CHECK(st.reduction_passes == 2);
      CHECK(st.elements == elements);
      CHECK(st.tensors == static_cast<std::int64_t>(nt));
      // fp32 LAMB per element. Recompute: pass 0 reads g (4), pass 1 reads g, p, m, v for
      // ||p|| and ||u|| (16), the update reads them again and writes p, m, v (28): 48.
      // Store: pass 1 also writes m, v and u (12), the update reads p and u and writes p
      // (12): 4 + 28 + 12 = 44.
      CHECK(st.bytes_recompute == 48 * elements);
      CHECK(st.bytes_store == 44 * elements);
      CHECK(st.bytes_store < st.bytes_recompute);
      CHECK_FALSE(st.schedule_report.empty());
    }
    CHECK(nets[0]->opt->stats().reduction_strategy == ReductionStrategy::Store);
    CHECK(nets[0]->opt->stats().bytes_per_step == 44 * elements);
    CHECK(nets[1]->opt->stats().reduction_strategy == ReductionStrategy::Recompute);
    CHECK(nets[1]->opt->stats().bytes_per_step == 48 * elements);
    CHECK(nets[2]->opt->stats().reduction_strategy == ReductionStrategy::Store);

    Vecs rp = rounded(init, DType::F32), rm = zeros_like(init), rv = zeros_like(init);
    int clipped = 0;
    for (int t = 1; t <= 100; ++t) {
      // The global norm is log-uniform in [0.2, 5]: clipped (> max_grad_norm = 1) about half
      // the time.
      fill_grads(g, rng, log_uniform(rng, 0.2, 5.0), factor);
      clipped += lamb_reference(t, h, rp, rm, rv, values(g));
      for (auto& n : nets) n->opt->step();
      bool any_bad = false;
      for (std::size_t r = 0; r < 3; ++r) {
        Tally tally;
        const std::string label = std::string(names[r]) + ", step " + std::to_string(t) + ",";
        check_params(tally, label, nets[r]->params(), rp);
        check_state(tally, label + " m", nets[r]->state("m"), rm);
        check_state(tally, label + " v", nets[r]->state("v"), rv);
        if (tally.bad) {
          FAIL_CHECK(tally.bad << " values out of tolerance; first: " << tally.first);
          any_bad = true;
        }
        CHECK(nets[r]->opt->step_count() == t);
      }
      // Recompute and Store do the same fp32 arithmetic in different passes: they may
      // differ by an ulp where the compiler contracts differently, no more.
      Tally pair;
      const Vecs a = nets[1]->params(), b = nets[2]->params();
      check_params(pair, "recompute vs store, step " + std::to_string(t) + ",", b, a, 1e-6);
      check_state(pair, "recompute vs store m", nets[2]->state("m"), nets[1]->state("m"));
      if (pair.bad) {
        FAIL_CHECK(pair.bad << " values differ between recompute and store; first: " << pair.first);
        any_bad = true;
      }
      if (any_bad) break;
    }
    // Both sides of the clip were exercised.
    CHECK(clipped >= 10);
    CHECK(clipped <= 90);
  }

  TEST_CASE("LARS matches its float64 reference over 100 steps, zero params and grads included") {
    use_private_cache();
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed << " (FUSEDOPT_TEST_SEED=" << seed << " replays it)");
    std::mt19937 rng(seed);
    std::vector<std::int64_t> sizes = kSizes;
    sizes.push_back(513);  // all-zero params: ||p|| = 0 takes the fallback local_lr = 1
    const std::size_t nt = sizes.size();
    const std::size_t zero_param = nt - 1,
                      zero_grad = 9;  // tensor 9's grads are zero every third step
    const std::vector<Hypers> groups = {
        with(kLarsDefaults, {{"trust_coefficient", 0.02}}),
        with(kLarsDefaults, {{"lr", 0.05}, {"trust_coefficient", 0.01}, {"weight_decay", 5e-4}})};
    std::vector<int> group_of;
    for (std::size_t k = 0; k < nt; ++k) group_of.push_back(k % 2);
    const std::vector<Hypers> h = per_tensor(groups, group_of, nt);
    const Vec factor = tensor_factors(rng, nt);
    Vecs init = random_params(rng, sizes);
    std::fill(init[zero_param].begin(), init[zero_param].end(), 0.0);
    std::vector<HostTensor> g = make_grads(sizes);
    Net net(Rule::preset("lars"), init, {DType::F32}, g, group_of, groups);
    CHECK(net.opt->stats().reduction_passes == 1);

    Vecs rp = rounded(init, DType::F32), rv = zeros_like(init);
    for (int t = 1; t <= 100; ++t) {
      fill_grads(g, rng, log_uniform(rng, 0.01, 10.0), factor);
      if (t % 3 == 0) {
        for (std::int64_t i = 0; i < g[zero_grad].numel(); ++i) g[zero_grad].set(i, 0.0);
      }
      const Vecs gv = values(g);
      for (std::size_t k = 0; k < nt; ++k) lars_reference(h[k], rp[k], rv[k], gv[k]);
      net.opt->step();
      Tally tally;
      const std::string label = "step " + std::to_string(t) + ",";
      check_params(tally, label, net.params(), rp);
      check_state(tally, label + " v", net.state("v"), rv);
      if (tally.bad) {
        FAIL_CHECK(tally.bad << " values out of tolerance; first: " << tally.first);
        break;
      }
      if (t == 1) {
        // The zero tensor moved by lr * 1 * g (the fallback), not by trust * 0 = 0.
        CHECK(max_abs({net.params()[zero_param]}) > 0);
      }
    }
  }

  TEST_CASE("AdamW with max_grad_norm matches torch's clip_grad_norm_ then AdamW over 100 steps") {
    use_private_cache();
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed << " (FUSEDOPT_TEST_SEED=" << seed << " replays it)");
    std::mt19937 rng(seed);
    const std::size_t nt = kSizes.size();
    const std::vector<Hypers> groups = {
        with(kAdamWDefaults, {{"lr", 1e-2}}),
        with(kAdamWDefaults, {{"lr", 3e-3}, {"weight_decay", 0.05}})};
    std::vector<int> group_of;
    for (std::size_t k = 0; k < nt; ++k) group_of.push_back(k % 2);
    std::vector<RefStep> refs;
    for (const Hypers& gh : groups) refs.push_back(adam_reference(gh, true, false));
    const Vec factor = tensor_factors(rng, nt);
    const Vecs init = random_params(rng, kSizes);
    std::vector<HostTensor> g = make_grads(kSizes);
    OptimizerOptions options;
    options.max_grad_norm = 1.0;
    Net net(Rule::preset("adamw"), init, {DType::F32}, g, group_of, groups, options);
    CHECK(net.opt->stats().reduction_passes == 1);
    CHECK(net.opt->hyper("max_grad_norm", 0) == 1.0);
    CHECK(net.opt->hyper("max_grad_norm", 1) == 1.0);

    Vecs rp = rounded(init, DType::F32), rs(nt);
    for (std::size_t k = 0; k < nt; ++k) rs[k].assign(2 * rp[k].size(), 0.0);
    double max_norm = 1.0;
    int clipped_before = 0, clipped_after = 0, between = 0;
    for (int t = 1; t <= 100; ++t) {
      if (t == 51) {
        net.opt->set_hyper("max_grad_norm", 0.5);
        CHECK(net.opt->hyper("max_grad_norm", 1) == 0.5);
        max_norm = 0.5;
      }
      const double norm = log_uniform(rng, 0.2, 3.0);
      fill_grads(g, rng, norm, factor);
      Vecs gv = values(g);
      const bool clipped = clip_reference(gv, max_norm);  // on the unscaled gradient
      (t <= 50 ? clipped_before : clipped_after) += clipped;
      between += t > 50 && norm > 0.5 && norm < 1.0;  // clipped only under the new threshold
      for (std::size_t k = 0; k < nt; ++k) {
        for (std::size_t i = 0; i < rp[k].size(); ++i)
          refs[group_of[k]](t, rp[k][i], gv[k][i], &rs[k][2 * i]);
      }
      net.opt->step();
      Vecs rm(nt), rv(nt);
      for (std::size_t k = 0; k < nt; ++k) {
        for (std::size_t i = 0; i < rp[k].size(); ++i) {
          rm[k].push_back(rs[k][2 * i]);
          rv[k].push_back(rs[k][2 * i + 1]);
        }
      }
      Tally tally;
      const std::string label = "step " + std::to_string(t) + ",";
      check_params(tally, label, net.params(), rp);
      check_state(tally, label + " m", net.state("m"), rm);
      check_state(tally, label + " v", net.state("v"), rv);
      if (tally.bad) {
        FAIL_CHECK(tally.bad << " values out of tolerance; first: " << tally.first);
        break;
      }
    }
    CHECK(clipped_before >= 5);
    CHECK(clipped_before <= 45);
    CHECK(clipped_after >= 5);
    CHECK(between >= 1);
  }

  TEST_CASE("SGD with momentum and with_grad_clipping matches clip_grad_norm_ then SGD") {
    use_private_cache();
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed << " (FUSEDOPT_TEST_SEED=" << seed << " replays it)");
    std::mt19937 rng(seed);
    const std::vector<std::int64_t> sizes = {1000, 0, 4099, 7, 70000};
    const Hypers hs = with(kSgdDefaults, {{"lr", 0.05}, {"momentum", 0.9}, {"weight_decay", 0.01}});
    const RefStep ref = sgd_reference(hs);
    const Rule rule = Rule::preset("sgd").with_grad_clipping(0.7);
    CHECK(rule.name() == "sgd+clip");
    CHECK(rule.reduction_passes() == 1);
    const Vec factor = tensor_factors(rng, sizes.size());
    const Vecs init = random_params(rng, sizes);
    std::vector<HostTensor> g = make_grads(sizes);
    Net net(rule, init, {DType::F32}, g, {}, {hs});
    CHECK(net.opt->hyper("max_grad_norm") == 0.7);
    const double max_norm = static_cast<float>(0.7);  // hypers reach the kernel as fp32
    Vecs rp = rounded(init, DType::F32), rb = zeros_like(init);
    const double norms[] = {2.0, 0.3, 5.0, 0.69, 1.5, 0.1};
    for (int t = 1; t <= 6; ++t) {
      fill_grads(g, rng, norms[t - 1], factor);
      Vecs gv = values(g);
      clip_reference(gv, max_norm);
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        for (std::size_t i = 0; i < rp[k].size(); ++i) ref(t, rp[k][i], gv[k][i], &rb[k][i]);
      }
      net.opt->step();
      Tally tally;
      check_params(tally, "step " + std::to_string(t) + ",", net.params(), rp);
      check_state(tally, "step " + std::to_string(t) + ", momentum_buffer",
                  net.state("momentum_buffer"), rb);
      CHECK_MESSAGE(tally.bad == 0,
                    tally.bad << " values out of tolerance; first: " << tally.first);
    }
  }

  TEST_CASE("max_grad_norm is refused for a rule that already has that hyper") {
    use_private_cache();
    std::vector<HostTensor> g = make_grads({10, 20});
    OptimizerOptions options;
    options.max_grad_norm = 1.0;
    const Vecs init = {Vec(10, 0.5), Vec(20, -0.25)};
    CHECK_THROWS_WITH_AS(Net(Rule::preset("lamb"), init, {DType::F32}, g, {}, {Hypers{}}, options),
                         doctest::Contains("max_grad_norm"), fusedopt::Error);
  }

  TEST_CASE("LAMB over a FlatArena keeps its norms per tensor, not over the flat buffer") {
    use_private_cache();
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed << " (FUSEDOPT_TEST_SEED=" << seed << " replays it)");
    std::mt19937 rng(seed);
    const std::vector<std::int64_t> sizes = {1000, 0, 4099, 3, 70000, 17, 40000};
    // Param scales apart by orders of magnitude, as layers' are: one trust ratio for the
    // whole buffer would move the small tensors far too much.
    const Vec scale = {1.0, 1.0, 0.01, 5.0, 1.0, 0.1, 20.0};
    fusedopt::FlatArena arena;
    for (std::size_t k = 0; k < sizes.size(); ++k)
      arena.add("w" + std::to_string(k), sizes[k], DType::F32);
    arena.finalize();
    const Vecs init = random_params(rng, sizes, scale);
    ParamGroup group;
    const Hypers hl = with(kLambDefaults, {{"lr", 1e-2}});
    group.hypers = overrides(hl);
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      group.params.push_back(arena.param(k));
      group.grads.push_back(arena.grad(k));
      for (std::int64_t i = 0; i < sizes[k]; ++i) {
        HostTensor::write(DType::F32, static_cast<float*>(arena.param(k).data) + i,
                          init[k][static_cast<std::size_t>(i)]);
      }
    }
    Optimizer opt(Rule::preset("lamb"), {group});
    const std::vector<Hypers> h(sizes.size(), hl);
    const Vec factor = tensor_factors(rng, sizes.size());
    Vecs rp = rounded(init, DType::F32), rm = zeros_like(init), rv = zeros_like(init);
    Vecs fp = rp, fm = rm, fv = rm;  // the flat-buffer-norm reference
    std::normal_distribution<double> normal(0.0, 1.0);
    auto arena_values = [&](bool grads) {
      Vecs out;
      for (std::size_t k = 0; k < sizes.size(); ++k)
        out.push_back(values(grads ? arena.grad(k) : arena.param(k)));
      return out;
    };
    double flat_gap = 0;
    for (int t = 1; t <= 10; ++t) {
      const double norm = log_uniform(rng, 0.3, 3.0);
      Vecs raw(sizes.size());
      double sq = 0;
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        for (std::int64_t i = 0; i < sizes[k]; ++i) {
          raw[k].push_back(normal(rng) * factor[k]);
          sq += raw[k].back() * raw[k].back();
        }
      }
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        for (std::int64_t i = 0; i < sizes[k]; ++i) {
          HostTensor::write(DType::F32, static_cast<float*>(arena.grad(k).data) + i,
                            raw[k][static_cast<std::size_t>(i)] * norm / std::sqrt(sq));
        }
      }
      const Vecs gv = arena_values(true);
      lamb_reference(t, h, rp, rm, rv, gv);
      lamb_reference(t, h, fp, fm, fv, gv, true);
      opt.step();
      const Vecs got = arena_values(false);
      Tally tally;
      check_params(tally, "step " + std::to_string(t) + ",", got, rp);
      Vecs m;
      for (std::size_t k = 0; k < sizes.size(); ++k)
        m.push_back(values(opt.state("m", static_cast<int>(k))));
      check_state(tally, "step " + std::to_string(t) + ", m", m, rm);
      if (tally.bad) {
        FAIL_CHECK(tally.bad << " values out of tolerance; first: " << tally.first);
        break;
      }
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        for (std::size_t i = 0; i < got[k].size(); ++i) {
          flat_gap = std::max(flat_gap, std::abs(got[k][i] - fp[k][i]) / (1 + std::abs(fp[k][i])));
        }
      }
    }
    // The per-tensor reference fits within kParamTol; a reference with one norm over the
    // flat buffer is hundreds of tolerances away, so this test catches that bug.
    CHECK(flat_gap > 100 * kParamTol);
  }

  TEST_CASE("LAMB and clipped AdamW give the same bits on every run and at 1, 2 and 3 threads") {
    use_private_cache();
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed << " (FUSEDOPT_TEST_SEED=" << seed << " replays it)");
    const int saved_threads = omp_get_max_threads();
    // 20 steps from data drawn from `seed`; every param and state byte.
    auto run = [&](const Rule& rule, OptimizerOptions options,
                   const std::vector<std::string>& states) {
      std::mt19937 rng(seed);
      const Vec factor = tensor_factors(rng, kSizes.size());
      const Vecs init = random_params(rng, kSizes);
      std::vector<HostTensor> g = make_grads(kSizes);
      Net net(rule, init, {DType::F32}, g, {}, {Hypers{}}, options);
      for (int t = 0; t < 20; ++t) {
        fill_grads(g, rng, log_uniform(rng, 0.2, 5.0), factor);
        net.opt->step();
      }
      return net.snapshot(states);
    };
    OptimizerOptions clip;
    clip.max_grad_norm = 1.0;
    struct Case {
      const char* name;
      Rule rule;
      OptimizerOptions options;
    };
    const Case cases[] = {
        {"lamb", Rule::preset("lamb"), {}},
        {"lamb recompute", Rule::preset("lamb"), with_strategy(ReductionStrategy::Recompute)},
        {"adamw+clip", Rule::preset("adamw"), clip}};
    for (const Case& c : cases) {
      INFO(c.name);
      const std::vector<std::string> states = {"m", "v"};
      const auto first = run(c.rule, c.options, states);
      CHECK(run(c.rule, c.options, states) == first);
      for (int threads : {1, 2, 3}) {
        INFO(threads << " threads");
        omp_set_num_threads(threads);
        REQUIRE(omp_get_max_threads() == threads);
        CHECK(run(c.rule, c.options, states) == first);
      }
      omp_set_num_threads(saved_threads);
    }
  }

  TEST_CASE("step_scaled unscales before the norms and skips a non-finite step bit for bit") {
    use_private_cache();
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed << " (FUSEDOPT_TEST_SEED=" << seed << " replays it)");
    std::mt19937 rng(seed);
    const std::size_t nt = kSizes.size();
    OptimizerOptions clip;
    clip.max_grad_norm = 1.0;
    struct Case {
      const char* name;
      Rule rule;
      Hypers hypers;
      OptimizerOptions options;
    };
    const Case cases[] = {
        {"lamb", Rule::preset("lamb"), with(kLambDefaults, {{"lr", 1e-2}}), {}},
        {"adamw+clip", Rule::preset("adamw"), with(kAdamWDefaults, {{"lr", 1e-2}}), clip}};
    for (const Case& c : cases) {
      INFO(c.name);
      const Vec factor = tensor_factors(rng, nt);
      const Vecs init = random_params(rng, kSizes);
      std::vector<HostTensor> g = make_grads(kSizes), g_scaled = make_grads(kSizes);
      Net plain(c.rule, init, {DType::F32}, g, {}, {c.hypers}, c.options);
      Net scaled(c.rule, init, {DType::F32}, g_scaled, {}, {c.hypers}, c.options);
      auto scale_grads = [&] {
        for (std::size_t k = 0; k < nt; ++k) {
          for (std::int64_t i = 0; i < g[k].numel(); ++i)
            g_scaled[k].set(i, g[k].get(i) * 1024);  // exact
        }
      };
      const double norms[] = {3.0, 0.4, 1.7, 0.8, 2.5};
      for (int t = 1; t <= 5; ++t) {
        fill_grads(g, rng, norms[t - 1], factor);
        scale_grads();
        plain.opt->step();
        REQUIRE(scaled.opt->step_scaled(1.0f / 1024));
        // The norm of the scaled grads is 1024 times larger: clipping by it would clip
        // every step (and by far too much), so this only holds if the kernel unscales first.
        Tally tally;
        check_params(tally, "step " + std::to_string(t) + ",", scaled.params(), plain.params(),
                     1e-6);
        check_state(tally, "step " + std::to_string(t) + ", m", scaled.state("m"),
                    plain.state("m"));
        check_state(tally, "step " + std::to_string(t) + ", v", scaled.state("v"),
                    plain.state("v"));
        CHECK_MESSAGE(tally.bad == 0, tally.bad << " values apart; first: " << tally.first);
      }
      const double bad_values[] = {std::numeric_limits<double>::quiet_NaN(),
                                   std::numeric_limits<double>::infinity(),
                                   -std::numeric_limits<double>::infinity()};
      for (int trial = 0; trial < 9; ++trial) {
        fill_grads(g, rng, 1.0, factor);
        scale_grads();
        std::size_t k = 0;
        do {
          k = std::uniform_int_distribution<std::size_t>(0, nt - 1)(rng);
        } while (g_scaled[k].numel() == 0);
        const std::int64_t i =
            std::uniform_int_distribution<std::int64_t>(0, g_scaled[k].numel() - 1)(rng);
        g_scaled[k].set(i, bad_values[trial % 3]);
        INFO("trial " << trial << ": " << bad_values[trial % 3] << " at tensor " << k
                      << ", element " << i);
        const std::vector<std::string> before = scaled.snapshot({"m", "v"});
        CHECK_FALSE(scaled.opt->step_scaled(1.0f / 1024));
        CHECK(scaled.opt->step_count() == 5);
        CHECK(scaled.snapshot({"m", "v"}) == before);
      }
      fill_grads(g, rng, 1.0, factor);
      scale_grads();
      CHECK(scaled.opt->step_scaled(1.0f / 1024));
      CHECK(scaled.opt->step_count() == 6);
    }
  }

  TEST_CASE(
      "two optimizers whose hooks all-reduce the global totals reproduce one over every tensor") {
    use_private_cache();
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed << " (FUSEDOPT_TEST_SEED=" << seed << " replays it)");
    std::mt19937 rng(seed);
    const std::size_t nt = kSizes.size(), half = nt / 2;
    const Hypers hl = with(kLambDefaults, {{"lr", 1e-2}});
    const Vec factor = tensor_factors(rng, nt);
    const Vecs init = random_params(rng, kSizes);
    std::vector<HostTensor> g = make_grads(kSizes);  // read-only: every optimizer shares them
    const Rule lamb = Rule::preset("lamb");
    Net whole(lamb, init, {DType::F32}, g, {}, {hl});
    Net ranks[2] = {Net(lamb, init, {DType::F32}, g, {}, {hl}, {}, 0, half),
                    Net(lamb, init, {DType::F32}, g, {}, {hl}, {}, half, nt - half)};
    // Without the exchange each rank clips by the norm of its own half: the test must see that.
    Net alone[2] = {Net(lamb, init, {DType::F32}, g, {}, {hl}, {}, 0, half),
                    Net(lamb, init, {DType::F32}, g, {}, {hl}, {}, half, nt - half)};

    AllReduce2 all_reduce;
    std::mutex record_mu;
    std::vector<HookCall> calls;  // rank 0's calls during the first step
    int step_now = 0;
    for (int r = 0; r < 2; ++r) {
      fusedopt::OptimizerExtension::set_reduction_hook(
          *ranks[r].opt, [&, r](const fusedopt::ReductionPartials& rp) {
            if (r == 0 && step_now == 1) {
              HookCall c;
              c.pass = rp.pass;
              c.device = rp.device.kind;
              c.num_global = rp.num_global;
              c.slots = rp.slots;
              c.global.assign(rp.global, rp.global + rp.num_global);
              for (const auto& tt : rp.tensors) {
                c.tensor_data.emplace_back(tt.data, tt.data + tt.num_tensors * tt.stride);
                c.tensor_params.push_back(tt.params);
                c.tensor_stride.push_back(tt.stride);
                c.tensor_count.push_back(tt.num_tensors);
              }
              std::lock_guard<std::mutex> lock(record_mu);
              calls.push_back(std::move(c));
            }
            all_reduce(r, rp);
          });
    }
    // What rank 0's first pass must total: sum g^2 over its tensors; its second: sum p^2 per
    // tensor.
    double rank0_gsq = 0;
    Vec rank0_psq;
    double alone_gap = 0;
    for (int t = 1; t <= 20; ++t) {
      step_now = t;
      fill_grads(g, rng, log_uniform(rng, 0.5, 4.0), factor);
      if (t == 1) {
        for (std::size_t k = 0; k < half; ++k) {
          rank0_gsq += norm_sq(values(g[k]));
          rank0_psq.push_back(norm_sq(values(ranks[0].p[k])));
        }
      }
      whole.opt->step();
      std::thread threads[2];
      for (int r = 0; r < 2; ++r) threads[r] = std::thread([&, r] { ranks[r].opt->step(); });
      for (std::thread& th : threads) th.join();
      REQUIRE_FALSE(all_reduce.timed_out());
      for (Net& n : alone) n.opt->step();

      const Vecs want = whole.params();
      Vecs got = ranks[0].params(), got_alone = alone[0].params();
      for (const Vec& v : ranks[1].params()) got.push_back(v);
      for (const Vec& v : alone[1].params()) got_alone.push_back(v);
      Tally tally;
      // Only the order of the double sum of the global total differs (half + half instead
      // of chunk by chunk): within a few ulps of the single optimizer.
      check_params(tally, "step " + std::to_string(t) + ",", got, want, 1e-6);
      if (tally.bad) {
        FAIL_CHECK(tally.bad << " values apart from the single optimizer; first: " << tally.first);
        break;
      }
      for (std::size_t k = 0; k < nt; ++k) {
        for (std::size_t i = 0; i < want[k].size(); ++i) {
          alone_gap = std::max(alone_gap,
                               std::abs(got_alone[k][i] - want[k][i]) / (1 + std::abs(want[k][i])));
        }
      }
    }
    CHECK(alone_gap > 100 * 1e-6);

    // Rank 0's first step: one call per reduction pass, in order.
    REQUIRE(calls.size() == 2);
    const HookCall& c0 = calls[0];
    CHECK(c0.pass == 0);
    CHECK(c0.device == fusedopt::Device::Kind::Host);
    // The global norm, and the built-in non-finite count of step_scaled (written as 0 by a
    // plain step), which ranks combine by max.
    const fusedopt::ReductionSlotInfo* norm_slot = nullptr;
    for (const auto& s : c0.slots) {
      if (s.name == "grad_check") {
        CHECK_FALSE(s.per_tensor);
        CHECK(s.max);
        CHECK(s.line == 0);
      } else {
        CHECK(norm_slot == nullptr);
        norm_slot = &s;
      }
    }
    REQUIRE(norm_slot != nullptr);
    CHECK(c0.slots.size() <= 2);
    const fusedopt::ReductionSlotInfo& gs = *norm_slot;
    CHECK(gs.name == "global_norm");
    CHECK_FALSE(gs.per_tensor);
    CHECK(gs.pass == 0);
    CHECK_FALSE(gs.max);
    CHECK(gs.line > 0);
    REQUIRE(gs.slot >= 0);
    REQUIRE(gs.slot < c0.num_global);
    // Raw: the sum of squares of rank 0's grads (the square root comes after the exchange).
    CHECK(c0.global[static_cast<std::size_t>(gs.slot)] == doctest::Approx(rank0_gsq).epsilon(1e-5));

    const HookCall& c1 = calls[1];
    CHECK(c1.pass == 1);
    REQUIRE(c1.slots.size() == 2);
    for (const auto& s : c1.slots) {
      CHECK(s.name == "tensor_norm");
      CHECK(s.per_tensor);
      CHECK(s.pass == 1);
      CHECK_FALSE(s.max);
      CHECK(s.line > gs.line);
    }
    // ||p|| is the earlier line of the two (pn = tensor_norm(p), then un = tensor_norm(u)).
    const fusedopt::ReductionSlotInfo& pn =
        c1.slots[0].line < c1.slots[1].line ? c1.slots[0] : c1.slots[1];
    REQUIRE(c1.tensor_data.size() == 1);  // one dtype binding
    const std::vector<int>& params = c1.tensor_params[0];
    CHECK(static_cast<std::int64_t>(params.size()) == c1.tensor_count[0]);
    CHECK(c1.tensor_stride[0] >= 2);
    int seen = 0;
    for (std::size_t t = 0; t < params.size(); ++t) {
      const int k = params[t];
      REQUIRE(k >= 0);
      REQUIRE(k < static_cast<int>(half));
      ++seen;
      const double got = c1.tensor_data[0][t * static_cast<std::size_t>(c1.tensor_stride[0]) +
                                           static_cast<std::size_t>(pn.slot)];
      CHECK(got == doctest::Approx(rank0_psq[static_cast<std::size_t>(k)]).epsilon(1e-5));
    }
    CHECK(seen == static_cast<int>(half));  // rank 0 has no empty tensor
  }

  TEST_CASE("a non-finite gradient on one rank makes every rank skip step_scaled") {
    // Ranks of a sharded optimizer must agree on skipping, as torch's GradScaler does by
    // all-reducing found_inf: the hook combines the grad_check slot of pass 0 by max (its
    // `max` flag), so the skip must be decided on the combined count. Otherwise the rank
    // with the NaN returns before its hook while the other waits in the all-reduce (here:
    // for 5 s, then it goes on alone and takes the step).
    use_private_cache();
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed << " (FUSEDOPT_TEST_SEED=" << seed << " replays it)");
    std::mt19937 rng(seed);
    const std::size_t nt = kSizes.size(), half = nt / 2;
    const Hypers hl = with(kLambDefaults, {{"lr", 1e-2}});
    const Vec factor = tensor_factors(rng, nt);
    const Vecs init = random_params(rng, kSizes);
    std::vector<HostTensor> g = make_grads(kSizes);
    const Rule lamb = Rule::preset("lamb");
    Net ranks[2] = {Net(lamb, init, {DType::F32}, g, {}, {hl}, {}, 0, half),
                    Net(lamb, init, {DType::F32}, g, {}, {hl}, {}, half, nt - half)};
    AllReduce2 all_reduce(std::chrono::seconds(5));
    for (int r = 0; r < 2; ++r) {
      fusedopt::OptimizerExtension::set_reduction_hook(
          *ranks[r].opt, [&, r](const fusedopt::ReductionPartials& rp) { all_reduce(r, rp); });
    }
    auto step_both = [&](bool taken[2]) {
      std::thread threads[2];
      for (int r = 0; r < 2; ++r) {
        threads[r] = std::thread([&, r] { taken[r] = ranks[r].opt->step_scaled(1.0f / 1024); });
      }
      for (std::thread& th : threads) th.join();
    };
    bool taken[2] = {false, false};
    fill_grads(g, rng, 1024.0, factor);
    step_both(taken);
    REQUIRE(taken[0]);
    REQUIRE(taken[1]);
    REQUIRE_FALSE(all_reduce.timed_out());

    fill_grads(g, rng, 1024.0, factor);
    const std::int64_t i = std::uniform_int_distribution<std::int64_t>(0, g[5].numel() - 1)(rng);
    g[5].set(i, std::numeric_limits<double>::quiet_NaN());  // tensor 5 belongs to rank 0
    const std::vector<std::string> before[2] = {ranks[0].snapshot({"m", "v"}),
                                                ranks[1].snapshot({"m", "v"})};
    step_both(taken);
    CHECK_FALSE(taken[0]);
    CHECK_FALSE(taken[1]);
    CHECK_FALSE(all_reduce.timed_out());
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r);
      CHECK(ranks[r].opt->step_count() == 1);
      CHECK(ranks[r].snapshot({"m", "v"}) == before[r]);
    }
  }

  TEST_CASE(
      "LAMB's global norm spans fp32 and bf16 params (two kernels) and matches the reference") {
    use_private_cache();
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed << " (FUSEDOPT_TEST_SEED=" << seed << " replays it)");
    std::mt19937 rng(seed);
    const std::size_t nt = kSizes.size();
    std::vector<DType> dtypes;
    std::vector<HostTensor> g;
    for (std::size_t k = 0; k < nt; ++k) {
      dtypes.push_back(k % 2 ? DType::BF16 : DType::F32);
      g.emplace_back(kSizes[k], dtypes.back());
    }
    const Hypers hl = with(kLambDefaults, {{"lr", 1e-2}});
    const std::vector<Hypers> h(nt, hl);
    const Vec factor = tensor_factors(rng, nt);
    const Vecs init = random_params(rng, kSizes);
    OptimizerOptions options;
    options.master_weights = true;
    Net net(Rule::preset("lamb"), init, dtypes, g, {}, {hl}, options);
    CHECK(net.opt->stats().kernel_keys.size() == 2);
    Vecs rp = init, rm = zeros_like(init), rv = zeros_like(init);
    for (std::size_t k = 0; k < nt; ++k) rp[k] = rounded({init[k]}, dtypes[k])[0];
    int clipped = 0;
    for (int t = 1; t <= 30; ++t) {
      // Neither half alone decides the clip: the norm is over both kernels' tensors.
      fill_grads(g, rng, log_uniform(rng, 0.3, 3.0), factor);
      clipped += lamb_reference(t, h, rp, rm, rv, values(g));
      net.opt->step();
      const Vecs params = net.params(), master = net.state("master");
      Vecs got(nt);
      for (std::size_t k = 0; k < nt; ++k)
        got[k] = dtypes[k] == DType::BF16 ? master[k] : params[k];
      Tally tally;
      const std::string label = "step " + std::to_string(t) + ",";
      check_params(tally, label, got, rp);
      check_state(tally, label + " m", net.state("m"), rm);
      check_state(tally, label + " v", net.state("v"), rv);
      if (tally.bad) {
        FAIL_CHECK(tally.bad << " values out of tolerance; first: " << tally.first);
        break;
      }
    }
    CHECK(clipped >= 3);
    CHECK(clipped <= 27);
  }

  TEST_CASE("LAMB on bf16 params with an fp32 master matches the reference on the master") {
    use_private_cache();
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed << " (FUSEDOPT_TEST_SEED=" << seed << " replays it)");
    std::mt19937 rng(seed);
    const std::vector<std::int64_t> sizes = {1000, 1, 4099, 0, 70000, 77};
    const std::size_t nt = sizes.size();
    const Hypers hl = with(kLambDefaults, {{"lr", 1e-2}});
    const std::vector<Hypers> h(nt, hl);
    const Vec factor = tensor_factors(rng, nt);
    const Vecs init = random_params(rng, sizes);
    std::vector<HostTensor> g = make_grads(sizes, DType::BF16);
    OptimizerOptions options;
    options.master_weights = true;
    Net net(Rule::preset("lamb"), init, {DType::BF16}, g, {}, {hl}, options);
    // The master starts as the bf16 param; the rule's p is the master (fp32), so the
    // reference runs on it with the fp32 bounds; the grads are bf16 values, read exactly.
    Vecs rp = rounded(init, DType::BF16), rm = zeros_like(init), rv = zeros_like(init);
    for (int t = 1; t <= 20; ++t) {
      fill_grads(g, rng, log_uniform(rng, 0.3, 3.0), factor);
      lamb_reference(t, h, rp, rm, rv, values(g));
      net.opt->step();
      Tally tally;
      const std::string label = "step " + std::to_string(t) + ",";
      const Vecs master = net.state("master");
      check_params(tally, label + " master", master, rp);
      check_state(tally, label + " m", net.state("m"), rm);
      check_state(tally, label + " v", net.state("v"), rv);
      // The stored param is its master rounded to nearest even, exactly.
      const Vecs stored = net.params();
      for (std::size_t k = 0; k < nt; ++k) {
        for (std::size_t i = 0; i < stored[k].size(); ++i) {
          tally.check(
              [&] {
                return label + " bf16 param of tensor " + std::to_string(k) + ", element " +
                       std::to_string(i);
              },
              stored[k][i], round_to(DType::BF16, master[k][i]), 0.0);
        }
      }
      if (tally.bad) {
        FAIL_CHECK(tally.bad << " values out of tolerance; first: " << tally.first);
        break;
      }
    }
  }
}

}  // namespace fusedopt::testing
