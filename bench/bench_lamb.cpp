// LAMB step benchmarks on the host (issue 4), fp32 over BERT-base shapes: fusedopt's lamb
// preset (a reduction rule: the global gradient norm, then ||p|| and ||u||, then the update)
// under the Auto and Recompute reduction strategies, against our CPU re-implementation of
// apex FusedLAMB's five-sweep schedule; and AdamW clipped by global norm against plain
// AdamW, for the cost of the clipping pass. Each declares the bytes a step moves (every
// pass) and reports the fraction of the copy floor: the best plain copy of the same bytes,
// measured just before the benchmark. A few untimed steps after the timed ones give where
// a step's time goes: pass0_ms, pass1_ms, ... (medians; each pass with its finalize, the
// last one the update).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "fusedopt/extension.hpp"
#include "fusedopt/optimizer.hpp"
#include "workloads.hpp"

using namespace fusedopt;

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kBreakdownSteps = 7;

/// fp32 params and grads of a workload: p non-zero (||p|| > 0, so the trust ratio is
/// used); ||g|| over BERT-base is about 105, so LAMB's clipping to 1 is taken every step.
struct Fp32Model {
  std::vector<std::vector<float>> p, g;
  explicit Fp32Model(const std::vector<std::int64_t>& sizes) {
    for (std::int64_t n : sizes) {
      p.emplace_back(static_cast<std::size_t>(n), 0.5f);
      g.emplace_back(static_cast<std::size_t>(n), 0.01f);
    }
  }
  ParamGroup group() {
    ParamGroup pg;
    for (std::size_t i = 0; i < p.size(); ++i) {
      const auto n = static_cast<std::int64_t>(p[i].size());
      pg.params.push_back({p[i].data(), n, DType::F32, Device::host(), "p" + std::to_string(i)});
      pg.grads.push_back({g[i].data(), n, DType::F32, Device::host(), "g" + std::to_string(i)});
    }
    return pg;
  }
};

/// lamb.rule's hypers and defaults (apex FusedLAMB's).
struct LambHypers {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-6f, weight_decay = 0.01f;
  float max_grad_norm = 1.0f;
  bool use_nvlamb = false;
};

/// LAMB as apex FusedLAMB schedules it (apex/optimizers/fused_lamb.py and
/// csrc/multi_tensor_lamb.cu; adam_w_mode, grad_averaging and bias_correction on), with the
/// math of templates/rules/lamb.rule. This is our re-implementation of apex's schedule on
/// the CPU, not apex itself: the same five sweeps over memory, each an OpenMP loop with a
/// static schedule over a chunk table of apex's 65536-element chunks, inner loops the
/// compiler vectorises, and norms reduced in two deterministic stages like apex's (a
/// partial per chunk, then a serial cleanup in chunk order):
///   (0) ||g|| over every tensor            reads g              4 B/elt
///   (1) ||p|| per tensor                   reads p              4
///   (2) stage 1: m, v and u, u over g      reads g p m v,       28
///                                          writes m v u
///   (3) ||u|| per tensor                   reads u              4
///   (4) stage 2: p -= lr * trust * u       reads p u, writes p  12
///                                                               52 B/elt in all (fp32)
/// Like apex, stage 1 writes the update over the gradient, so after a step the grads hold u.
/// The benchmark tolerates that (it times steps; the next step's "gradient" is the last
/// update, still finite and of ordinary magnitude) instead of restoring g, which would add
/// a copy to every step that apex does not do.
class ApexLikeLamb {
 public:
  using Hypers = LambHypers;
  static constexpr std::int64_t kChunkElems = 65536;  // apex's chunk_size (2048 * 32)
  static constexpr std::int64_t kBytesPerElement = 4 + 4 + 28 + 4 + 12;
  static constexpr int kPasses = 5;
  // Counted as fusedopt counts launches: each sweep, plus a finalize after each norm.
  static constexpr int kLaunches = 5 + 3;

  ApexLikeLamb(std::vector<float*> p, std::vector<float*> g, const std::vector<std::int64_t>& numel,
               Hypers h = Hypers())
      : p_(std::move(p)), g_(std::move(g)), hypers_(h) {
    for (std::size_t t = 0; t < numel.size(); ++t) {
      first_chunk_.push_back(static_cast<std::int64_t>(chunks_.size()));
      for (std::int64_t b = 0; b < numel[t]; b += kChunkElems) {
        chunks_.push_back({static_cast<int>(t), b, std::min(numel[t], b + kChunkElems)});
      }
      num_chunks_.push_back(static_cast<std::int64_t>(chunks_.size()) - first_chunk_.back());
      // Exact size (not reserve): the first touch happens here, outside the timed steps.
      m_.emplace_back(static_cast<std::size_t>(numel[t]), 0.0f);
      v_.emplace_back(static_cast<std::size_t>(numel[t]), 0.0f);
      elements_ += numel[t];
    }
    for (std::size_t t = 0; t < m_.size(); ++t) {
      m_ptr_.push_back(m_[t].data());
      v_ptr_.push_back(v_[t].data());
    }
    partial_.assign(chunks_.size(), 0.0);
    param_norm_.assign(numel.size(), 0.0f);
    update_norm_.assign(numel.size(), 0.0f);
  }

  std::int64_t elements() const { return elements_; }
  /// When set, step() appends the time after each sweep but the last (with its finalize).
  void set_marks(std::vector<Clock::time_point>* marks) { marks_ = marks; }
  const std::vector<float>& m(std::size_t t) const { return m_[t]; }
  const std::vector<float>& v(std::size_t t) const { return v_[t]; }

  void step() {
    ++step_;
    const Hypers& h = hypers_;
    // (0) the global gradient norm (apex: multi_tensor_l2norm in fused_lamb.py).
    chunk_sums_of_squares(g_);
    double total = 0.0;
    for (double s : partial_) total += s;
    const auto grad_norm = static_cast<float>(std::sqrt(total));
    mark();
    // (1) per-tensor param norms.
    chunk_sums_of_squares(p_);
    tensor_norms(param_norm_);
    mark();
    // (2) stage 1.
    const float clip =
        h.max_grad_norm > 0.0f && grad_norm > h.max_grad_norm ? grad_norm / h.max_grad_norm : 1.0f;
    const float bc1 = 1.0f - std::pow(h.beta1, static_cast<float>(step_));
    const float bc2 = 1.0f - std::pow(h.beta2, static_cast<float>(step_));
    stage1(clip, bc1, bc2);
    mark();
    // (3) per-tensor update norms (u lives in g now).
    chunk_sums_of_squares(g_);
    tensor_norms(update_norm_);
    mark();
    // (4) stage 2.
    stage2();
  }

 private:
  struct Chunk {
    int tensor;
    std::int64_t begin, end;
  };

  void mark() {
    if (marks_) marks_->push_back(Clock::now());
  }

  // One sweep: each chunk's sum of squares of x, in fp32 (as apex's kernel accumulates),
  // into partial_. kLanes independent accumulators (several vector registers), so the sum
  // is not one chain of dependent adds: a single `omp simd reduction` accumulator ran this
  // sweep about 10% below the machine's read bandwidth; 64 lanes reach it.
  void chunk_sums_of_squares(const std::vector<float*>& x) {
    constexpr int kLanes = 64;
    const auto n = static_cast<std::int64_t>(chunks_.size());
#pragma omp parallel for schedule(static)
    for (std::int64_t c = 0; c < n; ++c) {
      const Chunk ch = chunks_[static_cast<std::size_t>(c)];
      const float* xs = x[static_cast<std::size_t>(ch.tensor)];
      float lanes[kLanes] = {};
      std::int64_t i = ch.begin;
      for (; i + kLanes <= ch.end; i += kLanes) {
#pragma omp simd
        for (int l = 0; l < kLanes; ++l) lanes[l] += xs[i + l] * xs[i + l];
      }
      float acc = 0.0f;
      for (; i < ch.end; ++i) acc += xs[i] * xs[i];
      for (float lane : lanes) acc += lane;
      partial_[static_cast<std::size_t>(c)] = acc;
    }
  }

  // The cleanup: per tensor, its chunks' partials in chunk order.
  void tensor_norms(std::vector<float>& out) const {
    for (std::size_t t = 0; t < out.size(); ++t) {
      double s = 0.0;
      for (std::int64_t c = first_chunk_[t]; c < first_chunk_[t] + num_chunks_[t]; ++c) {
        s += partial_[static_cast<std::size_t>(c)];
      }
      out[t] = static_cast<float>(std::sqrt(s));
    }
  }

  void stage1(float clip, float bc1, float bc2) {
    const float beta1 = hypers_.beta1, beta2 = hypers_.beta2, beta3 = 1.0f - hypers_.beta1;
    const float one_minus_beta2 = 1.0f - hypers_.beta2, eps = hypers_.eps,
                decay = hypers_.weight_decay;
    const auto n = static_cast<std::int64_t>(chunks_.size());
#pragma omp parallel for schedule(static)
    for (std::int64_t c = 0; c < n; ++c) {
      const Chunk ch = chunks_[static_cast<std::size_t>(c)];
      const auto t = static_cast<std::size_t>(ch.tensor);
      float* g = g_[t];
      const float* p = p_[t];
      float* m = m_ptr_[t];
      float* v = v_ptr_[t];
#pragma omp simd
      for (std::int64_t i = ch.begin; i < ch.end; ++i) {
        const float sg = g[i] / clip;
        const float mi = m[i] * beta1 + beta3 * sg;
        const float vi = v[i] * beta2 + one_minus_beta2 * sg * sg;
        m[i] = mi;
        v[i] = vi;
        g[i] = (mi / bc1) / (std::sqrt(vi / bc2) + eps) + decay * p[i];
      }
    }
  }

  void stage2() {
    const Hypers& h = hypers_;
    ratio_.resize(param_norm_.size());
    for (std::size_t t = 0; t < ratio_.size(); ++t) {
      const float pn = param_norm_[t], un = update_norm_[t];
      const bool adapt = (h.weight_decay != 0.0f || h.use_nvlamb) && pn > 0.0f && un > 0.0f;
      ratio_[t] = adapt ? h.lr * (pn / un) : h.lr;
    }
    const auto n = static_cast<std::int64_t>(chunks_.size());
#pragma omp parallel for schedule(static)
    for (std::int64_t c = 0; c < n; ++c) {
      const Chunk ch = chunks_[static_cast<std::size_t>(c)];
      const auto t = static_cast<std::size_t>(ch.tensor);
      const float r = ratio_[t];
      float* p = p_[t];
      const float* u = g_[t];
#pragma omp simd
      for (std::int64_t i = ch.begin; i < ch.end; ++i) p[i] = p[i] - r * u[i];
    }
  }

  std::vector<float*> p_, g_, m_ptr_, v_ptr_;
  std::vector<std::vector<float>> m_, v_;
  std::vector<Chunk> chunks_;
  std::vector<std::int64_t> first_chunk_, num_chunks_;
  std::vector<double> partial_;
  std::vector<float> param_norm_, update_norm_, ratio_;
  Hypers hypers_;
  std::int64_t elements_ = 0;
  std::int64_t step_ = 0;
  std::vector<Clock::time_point>* marks_ = nullptr;
};

/// Checks the baseline against fusedopt's lamb preset: three steps over random tensors
/// (sizes that are not multiples of a vector or a chunk), fresh gradients each step, with
/// clipping taken; p, m and v must agree within 1e-5 of each tensor's largest magnitude
/// (the two sum norms in different orders). lr is 0.1 here so that a step moves p by about
/// 10% (at 1e-3, an error in the update would hide below the tolerance). Returns "" or
/// what differs. A baseline that computed something else would make the timing comparison
/// meaningless.
std::string check_apex_like_against_fusedopt() {
  const std::vector<std::int64_t> sizes = {1000, 70001, 3, 768, 131077};
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> param(-1.0f, 1.0f), grad(-0.05f, 0.05f);
  Fp32Model ours(sizes), theirs(sizes);
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    for (float& x : ours.p[t]) x = param(rng);
    theirs.p[t] = ours.p[t];
  }
  LambHypers hypers;
  hypers.lr = 0.1f;
  Optimizer opt(Rule::preset("lamb"), {ours.group()});
  opt.set_hyper("lr", static_cast<double>(hypers.lr));
  std::vector<float*> p, g;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    p.push_back(theirs.p[t].data());
    g.push_back(theirs.g[t].data());
  }
  ApexLikeLamb apex(p, g, sizes, hypers);
  for (int s = 0; s < 3; ++s) {
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      for (float& x : ours.g[t]) x = grad(rng);
      theirs.g[t] = ours.g[t];  // apex's stage 1 overwrote them
    }
    opt.step();
    apex.step();
  }
  auto compare = [](const char* what, std::size_t t, const float* a, const float* b,
                    std::size_t n) -> std::string {
    float scale = 0.0f;
    for (std::size_t i = 0; i < n; ++i) scale = std::max(scale, std::abs(a[i]));
    for (std::size_t i = 0; i < n; ++i) {
      if (!(std::abs(a[i] - b[i]) <= 1e-5f * scale)) {
        char buf[160];
        std::snprintf(buf, sizeof buf,
                      "%s of tensor %zu, element %zu: fusedopt %.9g, apex-like %.9g", what, t, i,
                      static_cast<double>(a[i]), static_cast<double>(b[i]));
        return buf;
      }
    }
    return "";
  };
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    const auto n = static_cast<std::size_t>(sizes[t]);
    const auto* m = static_cast<const float*>(opt.state("m", static_cast<int>(t)).data);
    const auto* v = static_cast<const float*>(opt.state("v", static_cast<int>(t)).data);
    std::string why = compare("p", t, ours.p[t].data(), theirs.p[t].data(), n);
    if (why.empty()) why = compare("m", t, m, apex.m(t).data(), n);
    if (why.empty()) why = compare("v", t, v, apex.v(t).data(), n);
    if (!why.empty()) return why;
  }
  return "";
}

void report(benchmark::State& state, std::int64_t bytes, std::int64_t elements, std::int64_t passes,
            std::int64_t launches, double copy_bytes_per_second) {
  state.SetBytesProcessed(bytes * static_cast<std::int64_t>(state.iterations()));
  state.counters["bytes_per_step"] = static_cast<double>(bytes);
  state.counters["bytes_per_elt"] = static_cast<double>(bytes) / static_cast<double>(elements);
  state.counters["passes"] = static_cast<double>(passes);
  state.counters["launches"] = static_cast<double>(launches);
  // The copy floor's seconds per step as a rate over the measured time = its fraction.
  state.counters["copy_fraction"] =
      benchmark::Counter(static_cast<double>(bytes) / copy_bytes_per_second,
                         benchmark::Counter::kIsIterationInvariantRate);
}

/// Runs kBreakdownSteps untimed steps; `step` appends the time after each pass but the last
/// to `marks`. Sets counters pass<k>_ms to the median milliseconds of pass k (the last one
/// from the last mark to the step's end).
template <typename Step>
void report_pass_times(benchmark::State& state, std::vector<Clock::time_point>& marks, Step step) {
  std::vector<std::vector<double>> ms;  // [pass][step]
  for (int s = 0; s < kBreakdownSteps; ++s) {
    marks.clear();
    const Clock::time_point t0 = Clock::now();
    step();
    const Clock::time_point t1 = Clock::now();
    marks.push_back(t1);
    ms.resize(std::max(ms.size(), marks.size()));
    Clock::time_point prev = t0;
    for (std::size_t k = 0; k < marks.size(); ++k) {
      ms[k].push_back(std::chrono::duration<double, std::milli>(marks[k] - prev).count());
      prev = marks[k];
    }
  }
  for (std::size_t k = 0; k < ms.size(); ++k) {
    std::vector<double>& v = ms[k];
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    state.counters["pass" + std::to_string(k) + "_ms"] = v[v.size() / 2];
  }
}

/// The pass breakdown of a fusedopt optimizer: the reduction hook marks the end of each
/// reduction pass (after its finalize).
void report_pass_times(benchmark::State& state, Optimizer& opt) {
  std::vector<Clock::time_point> marks;
  fusedopt::OptimizerExtension::set_reduction_hook(
      opt, [&marks](const ReductionPartials&) { marks.push_back(Clock::now()); });
  report_pass_times(state, marks, [&] { opt.step(); });
  fusedopt::OptimizerExtension::set_reduction_hook(opt, {});
}

/// fusedopt's lamb preset; range(0): 0 = ReductionStrategy::Auto, 1 = Recompute.
void BM_HostLambFused(benchmark::State& state) {
  const bench::Workload w = bench::bert_base();
  Fp32Model model(w.sizes);
  OptimizerOptions options;
  const ReductionStrategy strategies[] = {ReductionStrategy::Auto, ReductionStrategy::Recompute};
  const char* names[] = {"auto", "recompute"};
  options.reduction_strategy = strategies[state.range(0)];
  Optimizer opt(Rule::preset("lamb"), {model.group()}, options);
  opt.step();  // warm: first touch of the state (and scratch) pages
  const OptimizerStats s = opt.stats();
  const double copy_bw = bench::copy_bandwidth(static_cast<std::size_t>(s.bytes_per_step));
  for (auto _ : state) opt.step();
  report(state, s.bytes_per_step, s.elements, s.reduction_passes + 1, s.launches_per_step, copy_bw);
  report_pass_times(state, opt);
  state.SetLabel("lamb fp32 " + w.name + " fusedopt " + names[state.range(0)] + "->" +
                 (s.reduction_strategy ? to_string(*s.reduction_strategy) : "none"));
}

/// The apex-like five-sweep LAMB over the same tensors.
void BM_HostLambApexLike(benchmark::State& state) {
  const std::string why = check_apex_like_against_fusedopt();
  if (!why.empty()) {
    state.SkipWithError(("the apex-like LAMB differs from fusedopt's: " + why).c_str());
    return;
  }
  const bench::Workload w = bench::bert_base();
  Fp32Model model(w.sizes);
  std::vector<float*> p, g;
  for (std::size_t t = 0; t < w.sizes.size(); ++t) {
    p.push_back(model.p[t].data());
    g.push_back(model.g[t].data());
  }
  ApexLikeLamb lamb(p, g, w.sizes);
  lamb.step();
  const std::int64_t bytes = ApexLikeLamb::kBytesPerElement * lamb.elements();
  const double copy_bw = bench::copy_bandwidth(static_cast<std::size_t>(bytes));
  for (auto _ : state) lamb.step();  // grads hold the last update from here on (see the class)
  report(state, bytes, lamb.elements(), ApexLikeLamb::kPasses, ApexLikeLamb::kLaunches, copy_bw);
  std::vector<Clock::time_point> marks;
  lamb.set_marks(&marks);
  report_pass_times(state, marks, [&] { lamb.step(); });
  state.SetLabel("lamb fp32 " + w.name + " apex-like five sweeps (OpenMP)");
}

/// fusedopt's adamw preset; range(0): 0 = plain, 1 = max_grad_norm = 1 (clip by global norm).
void BM_HostAdamWClip(benchmark::State& state) {
  const bench::Workload w = bench::bert_base();
  Fp32Model model(w.sizes);
  OptimizerOptions options;
  options.max_grad_norm = state.range(0) != 0 ? 1.0 : 0.0;
  Optimizer opt(Rule::preset("adamw"), {model.group()}, options);
  opt.step();
  const OptimizerStats s = opt.stats();
  const double copy_bw = bench::copy_bandwidth(static_cast<std::size_t>(s.bytes_per_step));
  for (auto _ : state) opt.step();
  report(state, s.bytes_per_step, s.elements, s.reduction_passes + 1, s.launches_per_step, copy_bw);
  report_pass_times(state, opt);
  state.SetLabel("adamw fp32 " + w.name +
                 (state.range(0) != 0 ? " max_grad_norm=1" : " no clipping"));
}

}  // namespace

BENCHMARK(BM_HostLambFused)
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(2.0);
BENCHMARK(BM_HostLambApexLike)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
BENCHMARK(BM_HostAdamWClip)
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(2.0);
