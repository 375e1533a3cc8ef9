// The Optimizer's API: misuse errors that name the tensor, per-group hypers, state views,
// statistics (bytes per element, launches, the fusion report and its log line), and the
// plan's 64-bit index arithmetic.
#include <doctest/doctest.h>
#include <unistd.h>

#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

#include "cache/kernel_cache.hpp"
#include "common/host_kernel_calls.hpp"
#include "common/host_tensors.hpp"
#include "common/kernel_run.hpp"
#include "common/requirements.hpp"
#include "common/temp_dir.hpp"
#include "device/backend.hpp"
#include "device/host_module.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/extension.hpp"
#include "io/safetensors.hpp"
#include "presets.hpp"
#include "support/log.hpp"

namespace fusedopt::testing {
namespace {

using fusedopt::DType;
using fusedopt::Error;
using fusedopt::Optimizer;
using fusedopt::ParamGroup;
using fusedopt::Rule;

/// Owns the memory of a few fp32 params and grads of the given sizes.
struct Params {
  std::vector<HostTensor> p, g;
  explicit Params(const std::vector<std::int64_t>& sizes, DType dtype = DType::F32) {
    std::mt19937 rng(fresh_seed());
    for (std::int64_t n : sizes) {
      p.emplace_back(n, dtype);
      g.emplace_back(n, dtype);
      fill_normal(p.back(), rng);
      fill_normal(g.back(), rng);
    }
  }
  ParamGroup group(std::size_t first, std::size_t count, const std::string& prefix = "w") {
    ParamGroup out;
    for (std::size_t k = first; k < first + count; ++k) {
      out.params.push_back(p[k].tensor(prefix + std::to_string(k)));
      out.grads.push_back(g[k].tensor());
    }
    return out;
  }
};

/// Everything a failed stderr capture would hide: runs `f` with fd 2 sent to a file.
template <typename F>
std::string capture_stderr(F f) {
  std::fflush(stderr);
  char path[] = "/tmp/fusedopt-stderr-XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  const int saved = dup(2);
  dup2(fd, 2);
  f();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(fd);
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::remove(path);
  return ss.str();
}

}  // namespace

TEST_SUITE("runtime") {
  TEST_CASE("construction errors name the group, the param and the reason") {
    use_private_cache();
    const Rule adamw = Rule::preset("adamw");
    Params x({12, 12, 12, 12});
    HostTensor short_grad(10, DType::F32);

    ParamGroup g = x.group(0, 4);
    g.params[3].name = "layer1.bias";
    g.grads[3] = short_grad.tensor();
    CHECK_THROWS_WITH_AS(Optimizer(adamw, {g}),
                         "group 0, param 3 ('layer1.bias'): grad has 10 elements, param has 12",
                         Error);

    g = x.group(0, 4);
    g.grads.pop_back();
    CHECK_THROWS_WITH_AS(
        Optimizer(adamw, {g}),
        "group 0: 4 params but 3 grads (every param needs its grad, in the same order)", Error);

    ParamGroup g1 = x.group(2, 2);
    g1.params[1].data = nullptr;
    CHECK_THROWS_WITH_AS(Optimizer(adamw, {x.group(0, 2), g1}),
                         "group 1, param 1 ('w3'): param data is null (12 elements)", Error);
    g1 = x.group(2, 2);
    g1.grads[0].data = nullptr;
    CHECK_THROWS_WITH_AS(Optimizer(adamw, {x.group(0, 2), g1}),
                         "group 1, param 0 ('w2'): grad data is null (12 elements)", Error);

    g = x.group(0, 2);
    g.params[1].name = "w0";
    CHECK_THROWS_WITH_AS(Optimizer(adamw, {g}),
                         "group 0, param 1 ('w0'): the name is already used by group 0, param 0 "
                         "('w0') (names key checkpoints)",
                         Error);

    g = x.group(0, 2);
    g.params[1].data = g.params[0].data;
    CHECK_THROWS_WITH_AS(Optimizer(adamw, {g}),
                         "group 0, param 1 ('w1'): the same memory as group 0, param 0 ('w0') (a "
                         "param may appear only once)",
                         Error);

    g = x.group(0, 2);
    g.hypers = {{"learning_rate", 0.1}};
    CHECK_THROWS_WITH_AS(Optimizer(adamw, {g}),
                         "group 0: rule 'adamw' has no hyper 'learning_rate' (it has: lr, beta1, "
                         "beta2, eps, weight_decay, maximize)",
                         Error);

    g = x.group(0, 2);
    g.grads[1].device = fusedopt::Device::cuda(0);
    CHECK_THROWS_WITH_AS(Optimizer(adamw, {g}),
                         "group 0, param 1 ('w1'): grad is on cuda:0 but param is on host", Error);

    g = x.group(0, 2);
    for (auto& t : g.params) t.device = fusedopt::Device::cuda(0);
    for (auto& t : g.grads) t.device = fusedopt::Device::cuda(0);
    // (All on cuda:0 without a device: see "CUDA tensors without a usable CUDA device".)
    g.params[1].device = g.grads[1].device = fusedopt::Device::host();
    CHECK_THROWS_WITH_AS(Optimizer(adamw, {g}),
                         "group 0, param 1 ('w1'): param is on host but group 0, param 0 ('w0') "
                         "is on cuda:0 (one optimizer, one device)",
                         Error);

    CHECK_THROWS_WITH_AS(Optimizer(adamw, {}), "Optimizer: no param groups given", Error);
    CHECK_THROWS_WITH_AS(Optimizer(adamw, {ParamGroup{}}),
                         "Optimizer: the param groups hold no parameters", Error);
  }

  TEST_CASE("unnamed params are called param<i> in errors and state names") {
    use_private_cache();
    Params x({3, 4});
    ParamGroup g = x.group(0, 2);
    g.params[0].name.clear();
    g.params[1].name.clear();
    Optimizer opt(Rule::preset("adamw"), {g});
    CHECK(opt.state("m", 1).name == "param1/m");
    HostTensor bad(5, DType::F32);
    g.grads[1] = bad.tensor();
    CHECK_THROWS_WITH_AS(Optimizer(Rule::preset("adamw"), {g}),
                         "group 0, param 1 ('param1'): grad has 5 elements, param has 4", Error);
  }

  TEST_CASE("set_hyper changes one group or every group, and hyper reads it back exactly") {
    use_private_cache();
    Params x({50, 60, 70});
    ParamGroup g0 = x.group(0, 1), g1 = x.group(1, 2);
    g1.hypers = {{"lr", 0.25}};
    Optimizer opt(Rule::preset("sgd"), {g0, g1});
    CHECK(opt.hyper("lr", 0) == 1e-3);
    CHECK(opt.hyper("lr", 1) == 0.25);

    // Plain SGD: p -= lr * g, so each group's step size shows in its params.
    auto expect_step = [&](const std::vector<double>& lr_of_tensor) {
      std::vector<std::vector<double>> before(3);
      for (std::size_t k = 0; k < 3; ++k) {
        for (std::int64_t i = 0; i < x.p[k].numel(); ++i) before[k].push_back(x.p[k].get(i));
      }
      opt.step();
      for (std::size_t k = 0; k < 3; ++k) {
        const double lr = static_cast<float>(lr_of_tensor[k]);
        for (std::int64_t i = 0; i < x.p[k].numel(); ++i) {
          const double want = before[k][static_cast<std::size_t>(i)] - lr * x.g[k].get(i);
          REQUIRE(std::abs(x.p[k].get(i) - want) <= 1e-6 * (1 + std::abs(want)));
        }
      }
    };
    expect_step({1e-3, 0.25, 0.25});
    opt.set_hyper("lr", 0.5, 0);
    CHECK(opt.hyper("lr", 0) == 0.5);
    CHECK(opt.hyper("lr", 1) == 0.25);
    expect_step({0.5, 0.25, 0.25});
    opt.set_hyper("lr", 0.125);
    CHECK(opt.hyper("lr", 0) == 0.125);
    CHECK(opt.hyper("lr", 1) == 0.125);
    expect_step({0.125, 0.125, 0.125});
    opt.set_hyper("lr", 0.1 + 1e-12, 1);  // kept in double, handed to the kernel as fp32
    CHECK(opt.hyper("lr", 1) == 0.1 + 1e-12);

    CHECK_THROWS_WITH_AS(opt.set_hyper("lrr", 1.0),
                         "rule 'sgd' has no hyper 'lrr' (it has: lr, momentum, dampening, "
                         "weight_decay, nesterov, maximize)",
                         Error);
    CHECK_THROWS_WITH_AS(opt.set_hyper("lr", 1.0, 2),
                         "set_hyper('lr'): there is no group 2 (the optimizer has 2 groups)",
                         Error);
    CHECK_THROWS_WITH_AS(opt.hyper("lr", -1),
                         "hyper('lr'): there is no group -1 (the optimizer has 2 groups)", Error);
    CHECK(opt.step_count() == 3);
  }

  TEST_CASE(
      "a hyper must be finite and within fp32's range at construction, in set_hyper and in "
      "a checkpoint: refused naming hyper and group, changing nothing") {
    use_private_cache();
    Params x({50, 60, 70});
    ParamGroup g0 = x.group(0, 1), g1 = x.group(1, 2);
    const double inf = std::numeric_limits<double>::infinity();
    for (double bad : {std::nan(""), inf, -inf, 1e300, -1e39}) {
      CAPTURE(bad);
      g1.hypers = {{"lr", bad}};
      CHECK_THROWS_WITH_AS(Optimizer(Rule::preset("sgd"), {g0, g1}),
                           doctest::Contains("Optimizer: hyper 'lr' of group 1 is"),
                           fusedopt::UsageError);
    }
    g1.hypers = {{"lr", 0.25}};
    Optimizer opt(Rule::preset("sgd"), {g0, g1});
    for (double bad : {std::nan(""), inf, -inf, 1e300, -1e39}) {
      CAPTURE(bad);
      CHECK_THROWS_WITH_AS(opt.set_hyper("lr", bad, 1),
                           doctest::Contains("set_hyper: hyper 'lr' of group 1 is"),
                           fusedopt::UsageError);
      CHECK_THROWS_WITH_AS(opt.set_hyper("momentum", bad),
                           doctest::Contains("hyper 'momentum' of group 0 is"),
                           fusedopt::UsageError);
    }
    CHECK(opt.hyper("lr", 1) == 0.25);
    CHECK(opt.hyper("momentum", 0) == 0.0);
    opt.set_hyper("lr", 3.4e38, 1);  // the largest fp32s are fine
    opt.set_hyper("lr", 0.25, 1);
    // A checkpoint whose metadata says lr=-1e39 (a double, not an fp32), as a tool editing it
    // would write it (with a fresh checksum): refused, and the optimizer keeps its hypers.
    fusedopt::testing::TempDir dir;
    const auto path = dir.path() / "opt.safetensors";
    opt.save(path);
    {
      fusedopt::io::SafetensorsFile f = fusedopt::io::read_safetensors(path);
      std::vector<fusedopt::io::TensorView> views;
      for (const auto& [name, e] : f.tensors) {
        views.push_back({name, e.dtype, e.shape, f.tensor_data(name), e.end - e.begin});
      }
      std::string& hypers = f.metadata.at("hypers");
      const std::size_t at = hypers.find("lr=0.25");
      REQUIRE(at != std::string::npos);
      hypers.replace(at, 7, "lr=-1e39");
      fusedopt::io::write_safetensors(path, views, f.metadata);
    }
    Optimizer fresh(Rule::preset("sgd"), {g0, g1});
    CHECK_THROWS_WITH_AS(fresh.load(path), doctest::Contains("hyper 'lr' of group 1 is -1e+39"),
                         fusedopt::UsageError);
    CHECK(fresh.hyper("lr", 1) == 0.25);
  }

  TEST_CASE(
      "an optimizer is used by one thread at a time: a call during a step, from another "
      "thread or from its reduction hook, is refused naming both") {
    use_private_cache();
    Params x({50, 60, 70});
    fusedopt::OptimizerOptions options;
    options.max_grad_norm = 1.0;  // a reduction pass: the hook runs in the middle of the step
    Optimizer opt(Rule::preset("adamw"), {x.group(0, 3)}, options);
    fusedopt::testing::TempDir dir;
    const auto path = dir.path() / "opt.safetensors";
    std::string from_thread, from_hook;
    fusedopt::OptimizerExtension::set_reduction_hook(opt, [&](const fusedopt::ReductionPartials&) {
      std::thread other([&] {
        try {
          opt.save(path);
        } catch (const fusedopt::UsageError& e) {
          from_thread = e.what();
        }
      });
      other.join();
      try {
        opt.set_hyper("lr", 0.5);
      } catch (const fusedopt::UsageError& e) {
        from_hook = e.what();
      }
    });
    opt.step();
    CHECK(from_thread.find("Optimizer::save: called while step() is running") != std::string::npos);
    CHECK(from_hook.find("Optimizer::set_hyper: called while step() is running") !=
          std::string::npos);
    CHECK(opt.step_count() == 1);
    CHECK(opt.hyper("lr", 0) == Rule::preset("adamw").hypers()[0].second);
    CHECK_FALSE(std::filesystem::exists(path));
    // Between calls the optimizer is free again.
    fusedopt::OptimizerExtension::set_reduction_hook(opt, nullptr);
    opt.save(path);
    opt.set_hyper("lr", 0.5);
    opt.step();
    CHECK(opt.step_count() == 2);
  }

  TEST_CASE("state views name their tensor and reject unknown states and indices") {
    use_private_cache();
    Params x({8, 0});
    Optimizer opt(Rule::preset("adamw"), {x.group(0, 2)});
    const fusedopt::Tensor m = opt.state("m", 0);
    CHECK(m.name == "w0/m");
    CHECK(m.numel == 8);
    CHECK(m.dtype == DType::F32);
    CHECK(m.data != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(m.data) % 64 == 0);
    CHECK(opt.state("v", 1).numel == 0);
    CHECK_THROWS_WITH_AS(opt.state("mom", 0), "rule 'adamw' has no state 'mom' (it has: m, v)",
                         Error);
    CHECK_THROWS_WITH_AS(opt.state("m", 2),
                         "state('m', 2): there is no param 2 (the optimizer has 2)", Error);
  }

  TEST_CASE("stats count 28 bytes per element for fp32 AdamW and 20 with bf16 moments") {
    use_private_cache();
    Params x({1000, 0, 107});
    Optimizer opt(Rule::preset("adamw"), {x.group(0, 3)});
    fusedopt::OptimizerStats st = opt.stats();
    CHECK(st.tensors == 3);
    CHECK(st.elements == 1107);
    CHECK(st.launches_per_step == 1);
    CHECK(st.bytes_per_step == 28 * 1107);
    REQUIRE(st.kernel_keys.size() == 1);
    CHECK(st.kernel_keys[0].size() == 32);
    CHECK(st.kernel_origin.has_value());  // one kernel: whichever tier it came from
    CHECK(st.kernel_seconds >= 0);
    CHECK(st.fusion_report ==
          "adamw over 3 tensors (1107 elements): 1 launch per step instead of 2");

    fusedopt::OptimizerOptions bf16_moments;
    bf16_moments.state_dtype = DType::BF16;
    Params y({1000, 0, 107});
    CHECK(Optimizer(Rule::preset("adamw"), {y.group(0, 3)}, bf16_moments).stats().bytes_per_step ==
          20 * 1107);
    // AMSGrad reads and writes a third fp32 state: 36 bytes (PEERS.md).
    Params z({64});
    CHECK(Optimizer(Rule::preset("amsgrad"), {z.group(0, 1)}).stats().bytes_per_step == 36 * 64);
  }

  TEST_CASE("stats' traffic lists each pass's roles, and adds up to bytes_per_step") {
    use_private_cache();
    // AdamW: p, m, v updated in place, g read; 4-bit states move half a byte each way.
    Params x({1000, 0, 4096});
    const fusedopt::OptimizerStats a = Optimizer(Rule::preset("adamw"), {x.group(0, 3)}).stats();
    REQUIRE(a.traffic.size() == 1);
    CHECK(a.traffic[0].elements == 5096);
    CHECK(a.traffic[0].read_bits == std::vector<int>{32});
    CHECK(a.traffic[0].update_bits == std::vector<int>{32, 32, 32});
    CHECK(a.traffic[0].write_bits.empty());
    fusedopt::OptimizerOptions q4;
    q4.state_storage = {{"*", "q4"}};
    Params y({1000, 4096});  // 1000 stays fp32: two bindings
    const fusedopt::OptimizerStats b =
        Optimizer(Rule::preset("adamw"), {y.group(0, 2)}, q4).stats();
    CHECK(b.bytes_per_step == 28 * 1000 + 14 * 4096);
    // LAMB (a norm pass, then the update) and bf16 params with a master.
    Params z({300, 77});
    const fusedopt::OptimizerStats c = Optimizer(Rule::preset("lamb"), {z.group(0, 2)}).stats();
    CHECK(c.traffic.size() == static_cast<std::size_t>(c.reduction_passes + 1));
    fusedopt::OptimizerOptions master;
    master.master_weights = true;
    Params w({100}, DType::BF16);
    const fusedopt::OptimizerStats d =
        Optimizer(Rule::preset("adamw"), {w.group(0, 1)}, master).stats();
    CHECK(d.traffic[0].write_bits == std::vector<int>{16});  // the bf16 param, written only
    for (const fusedopt::OptimizerStats* s : {&a, &b, &c, &d}) {
      std::int64_t bits = 0;
      for (const fusedopt::PassTraffic& t : s->traffic) {
        std::int64_t per = 0;
        for (int r : t.read_bits) per += r;
        for (int r : t.update_bits) per += 2 * r;
        for (int r : t.write_bits) per += r;
        bits += per * t.elements;
      }
      CHECK(bits / 8 == s->bytes_per_step);
    }
  }

  TEST_CASE("bf16 params with a master cost master read and write plus a bf16 param write") {
    use_private_cache();
    Params x({100}, DType::BF16);
    fusedopt::OptimizerOptions options;
    options.master_weights = true;
    Optimizer opt(Rule::preset("adamw"), {x.group(0, 1)}, options);
    // master 4 + 4, param write 2, bf16 grad 2, m and v 8 + 8.
    CHECK(opt.stats().bytes_per_step == (4 + 4 + 2 + 2 + 16) * 100);
  }

  TEST_CASE("states() lists every state kept per param, in one order, as state() names them") {
    use_private_cache();
    Params x({12, 5}, DType::BF16);
    fusedopt::OptimizerOptions options;
    options.master_weights = true;
    for (const char* preset : {"nadam", "adafactor", "lamb"}) {
      CAPTURE(preset);
      const Rule rule = Rule::preset(preset);
      Optimizer opt(rule, {x.group(0, 2)}, options);
      std::vector<std::pair<std::string, fusedopt::StateKind>> want;
      for (const std::string& n : rule.states()) want.emplace_back(n, fusedopt::StateKind::Element);
      for (const std::string& n : rule.scalars()) want.emplace_back(n, fusedopt::StateKind::Scalar);
      for (const std::string& n : rule.row_states()) want.emplace_back(n, fusedopt::StateKind::Row);
      for (const std::string& n : rule.col_states()) want.emplace_back(n, fusedopt::StateKind::Col);
      want.emplace_back("master", fusedopt::StateKind::Master);
      std::vector<std::pair<std::string, fusedopt::StateKind>> got;
      for (const fusedopt::StateInfo& s : opt.states()) {
        got.emplace_back(s.name, s.kind);
        CHECK(s.saved);
        CHECK(opt.state(s.name, 0).numel > 0);  // each one viewable
        if (s.kind == fusedopt::StateKind::Scalar) CHECK(s.dtype == DType::F64);
        if (s.kind == fusedopt::StateKind::Master) CHECK(s.dtype == DType::F32);
      }
      CHECK(got == want);
    }
    CHECK(std::string(fusedopt::to_string(fusedopt::StateKind::Col)) == "col");
  }

  TEST_CASE("stats name the step program: LAMB's two passes, the check folded into pass 0") {
    use_private_cache();
    Params x({100, 7});
    Optimizer opt(Rule::preset("lamb"), {x.group(0, 2)});
    CHECK(opt.stats().step_program ==
          "reduce 0, finalize 0, hook 0, reduce 1, finalize 1, hook 1, update, end");
    CHECK(opt.stats().scaled_step_program ==
          "reduce 0 (+check), finalize 0, hook 0, skip if, reduce 1, finalize 1, hook 1, update, "
          "end");
  }

  TEST_CASE("the fusion report counts a per-tensor loop's launches against ours") {
    use_private_cache();
    std::vector<std::int64_t> sizes(201, 7500);
    Params x(sizes);
    Optimizer opt(Rule::preset("adamw"), {x.group(0, 100), x.group(100, 101)});
    CHECK(opt.stats().fusion_report ==
          "adamw over 201 tensors (1.5 M elements): 1 launch per step instead of 201");

    // Two dtype bindings: two launches, each named.
    Params a({10, 20}), b({30}, DType::BF16);
    ParamGroup mixed = a.group(0, 2);
    mixed.params.push_back(b.p[0].tensor("b0"));
    mixed.grads.push_back(b.g[0].tensor());
    fusedopt::OptimizerOptions options;
    options.master_weights = true;
    Optimizer two(Rule::preset("sgd"), {mixed}, options);
    CHECK(two.stats().launches_per_step == 2);
    CHECK(two.stats().kernel_keys.size() == 2);
    CHECK(two.stats().fusion_report ==
          "sgd over 3 tensors (60 elements): 2 launches per step instead of 3 (one per dtype "
          "binding: fp32:fp32:fp32, bf16:bf16:fp32+master)");
  }

  TEST_CASE("FUSEDOPT_LOG=info prints the fusion report at construction") {
    use_private_cache();
    using fusedopt::support::LogLevel;
    CHECK(fusedopt::support::parse_log_level("warn") == LogLevel::Warn);
    CHECK(fusedopt::support::parse_log_level(" INFO ") == LogLevel::Info);
    CHECK(fusedopt::support::parse_log_level("debug") == LogLevel::Debug);
    CHECK_FALSE(fusedopt::support::parse_log_level("verbose").has_value());

    const LogLevel before = fusedopt::support::log_level();
    Params x({5, 6});
    fusedopt::support::set_log_level(LogLevel::Info);
    const std::string info =
        capture_stderr([&] { Optimizer opt(Rule::preset("adamw"), {x.group(0, 2)}); });
    fusedopt::support::set_log_level(LogLevel::Warn);
    const std::string quiet =
        capture_stderr([&] { Optimizer opt(Rule::preset("adamw"), {x.group(0, 2)}); });
    fusedopt::support::set_log_level(before);
    CHECK(info ==
          "fusedopt: info: adamw over 2 tensors (11 elements): 1 launch per step instead of 2\n");
    CHECK(quiet.empty());
  }

  TEST_CASE("an optimizer whose tensors are all empty launches nothing but counts steps") {
    use_private_cache();
    Params x({0, 0});
    Optimizer opt(Rule::preset("adamw"), {x.group(0, 2)});
    CHECK(opt.stats().launches_per_step == 0);
    CHECK(opt.stats().kernel_keys.empty());
    opt.step();
    CHECK(opt.step_scaled(0.5f));
    CHECK(opt.step_count() == 2);
  }

  TEST_CASE("a prepared host plan covers tensors over 2^31 elements with 64-bit offsets") {
    // Planned without allocating a single element: the pointers are never dereferenced.
    // (build_chunks itself is tested with the CUDA runtime, in tests/cuda/test_chunks.cpp.)
    const std::int64_t huge = 3'000'000'123LL, big = (1LL << 31) + 1;
    const std::vector<std::int64_t> numel = {huge, 0, 5, big};
    const std::vector<int> group = {1, 0, 0, 1};
    const std::int64_t chunk = fusedopt::runtime::kHostChunkElems;
    const std::int64_t expect = 1 + (huge + chunk - 1) / chunk + (big + chunk - 1) / chunk;
    use_private_cache();
    fusedopt::testing::Kernel k(fusedopt::preset_rule("sgd"), fusedopt::DTypeBinding{},
                                fusedopt::cache::KernelCache::global());
    static float dummy[3];
    std::vector<std::vector<void*>> ptrs(4, {dummy, dummy + 1, dummy + 2});
    const std::vector<double> defaults = fusedopt::testing::default_hypers(k);
    const auto prepared = k.prepare(ptrs, numel, {defaults, defaults}, group);
    REQUIRE(prepared->plan().num_chunks() == expect);
    const std::vector<fo_chunk>& chunks = prepared->plan().chunks();
    CHECK(chunks.front().tensor == 2);  // group 0 first
    CHECK(chunks.back().begin == 1LL << 31);
    CHECK(chunks.back().end == big);
    const fo_chunk& huge_last =
        chunks[static_cast<std::size_t>(expect - 1 - (big + chunk - 1) / chunk)];
    CHECK(huge_last.tensor == 0);
    CHECK(huge_last.begin == (huge - 1) / chunk * chunk);
    CHECK(huge_last.begin > INT_MAX);
    CHECK(huge_last.end == huge);
    fusedopt::runtime::StepArgs args;
    args.step = 7.0;
    args.inv_grad_scale = 0.5f;
    const fo_launch L = prepared->launch_table(args);
    CHECK(L.num_chunks == expect);
    CHECK(L.step == 7.0f);
    CHECK(L.inv_grad_scale == 0.5f);
  }
}

}  // namespace fusedopt::testing

TEST_SUITE("runtime") {
  TEST_CASE("CUDA tensors without a usable CUDA device are a clear error, not a crash" *
            fusedopt::testing::needs_no_cuda_device()) {
    std::vector<float> p(4), g(4);
    fusedopt::ParamGroup group;
    group.params = {{p.data(), 4, fusedopt::DType::F32, fusedopt::Device::cuda(0), "w"}};
    group.grads = {{g.data(), 4, fusedopt::DType::F32, fusedopt::Device::cuda(0), "dw"}};
    CHECK_THROWS_WITH_AS(fusedopt::Optimizer(fusedopt::Rule::preset("sgd"), {group}),
                         doctest::Contains("param is on cuda:0 but no CUDA device can be used"),
                         fusedopt::Error);
  }
}

TEST_SUITE("runtime") {
  TEST_CASE(
      "a state called 'master' with master weights is refused (checkpoint names would collide)") {
    std::vector<std::uint16_t> p(4), g(4);
    fusedopt::ParamGroup group;
    group.params = {{p.data(), 4, fusedopt::DType::BF16, fusedopt::Device::host(), "w"}};
    group.grads = {{g.data(), 4, fusedopt::DType::BF16, fusedopt::Device::host(), "dw"}};
    fusedopt::Rule rule = fusedopt::Rule::parse(
        "param p\ngrad g\nstate master = 0\nmaster = master + g\np = p - master\n", "m.rule");
    fusedopt::OptimizerOptions options;
    options.master_weights = true;
    CHECK_THROWS_WITH_AS(fusedopt::Optimizer(rule, {group}, options),
                         doctest::Contains("has a state called 'master'"), fusedopt::Error);
    options.master_weights = false;
    CHECK_NOTHROW(fusedopt::Optimizer(rule, {group}, options));
  }

  TEST_CASE("a request of 2^62 elements is a fusedopt::Error, not an allocation failure") {
    fusedopt::testing::use_private_cache();
    // Addresses that are never touched: the request is refused while it is laid out.
    auto* p = reinterpret_cast<void*>(std::uintptr_t{1} << 12);
    auto* g = reinterpret_cast<void*>(std::uintptr_t{1} << 40);
    const std::int64_t huge = std::int64_t{1} << 62;
    fusedopt::ParamGroup group;
    group.params = {{p, huge, fusedopt::DType::F32, fusedopt::Device::host(), "w"}};
    group.grads = {{g, huge, fusedopt::DType::F32, fusedopt::Device::host(), "dw"}};
    // With states (their arena), and without (the chunk table).
    for (const char* text : {"param p\ngrad g\nstate m = 0\nhyper lr = 0.1\nm = m + g\n"
                             "p = p - lr * m\n",
                             "param p\ngrad g\nhyper lr = 0.1\np = p - lr * g\n"}) {
      INFO(std::string(text));
      bool refused = false;
      try {
        fusedopt::Optimizer opt(fusedopt::Rule::parse(text, "huge.rule"), {group});
      } catch (const fusedopt::Error& e) {
        refused = true;
        MESSAGE(std::string(e.what()));
      }
      CHECK(refused);
    }
  }

  TEST_CASE("a hyper given twice, or a clipping norm that is not positive and finite, is refused") {
    fusedopt::testing::use_private_cache();
    std::vector<float> p(4, 1.0f), g(4, 0.5f);
    fusedopt::ParamGroup group;
    group.params = {{p.data(), 4, fusedopt::DType::F32, fusedopt::Device::host(), "w"}};
    group.grads = {{g.data(), 4, fusedopt::DType::F32, fusedopt::Device::host(), "dw"}};
    group.hypers = {{"lr", 0.1}, {"lr", 0.2}};
    CHECK_THROWS_WITH_AS(fusedopt::Optimizer(fusedopt::Rule::preset("sgd"), {group}),
                         "group 0: hyper 'lr' is given twice (which one should win?)",
                         fusedopt::UsageError);
    const fusedopt::Rule sgd = fusedopt::Rule::preset("sgd");
    for (double bad : {std::nan(""), std::numeric_limits<double>::infinity(), 0.0, -1.0}) {
      INFO(bad);
      CHECK_THROWS_WITH_AS(sgd.with_grad_clipping(bad),
                           doctest::Contains("it must be positive and finite"),
                           fusedopt::UsageError);
    }
    CHECK_THROWS_WITH_AS(sgd.with_grad_clipping(1e39),
                         doctest::Contains("which must be within fp32's range"),
                         fusedopt::UsageError);
    group.hypers.clear();
    fusedopt::OptimizerOptions options;
    options.max_grad_norm = std::numeric_limits<double>::infinity();
    CHECK_THROWS_WITH_AS(fusedopt::Optimizer(sgd, {group}, options),
                         doctest::Contains("it must be 0 (off) or positive and finite"),
                         fusedopt::UsageError);
  }

  TEST_CASE(
      "check_options refuses each bad option alone, as the constructor does, before any param") {
    using fusedopt::OptimizerOptions;
    fusedopt::check_options(OptimizerOptions{});
    OptimizerOptions good;
    good.state_dtype = fusedopt::DType::BF16;
    good.quant_block = 512;
    good.quant_min_numel = 0;
    good.master_weights = true;
    good.max_grad_norm = 1.0;
    fusedopt::check_options(good);
    const std::vector<std::pair<void (*)(OptimizerOptions&), const char*>> bad = {
        {[](OptimizerOptions& o) { o.max_grad_norm = -1.0; }, "max_grad_norm is -1; it must be"},
        {[](OptimizerOptions& o) { o.max_grad_norm = std::nan(""); }, "max_grad_norm is nan"},
        {[](OptimizerOptions& o) { o.max_grad_norm = 1e39; }, "which must be within fp32's range"},
        {[](OptimizerOptions& o) { o.state_dtype = fusedopt::DType::F64; },
         "unsupported state_dtype"},
        {[](OptimizerOptions& o) { o.state_dtype = fusedopt::DType::U8; },
         "unsupported state_dtype"},
        {[](OptimizerOptions& o) { o.quant_block = 96; }, "quant_block is 96: a power of two"},
        {[](OptimizerOptions& o) { o.quant_block = 16; }, "quant_block is 16: a power of two"},
        {[](OptimizerOptions& o) { o.quant_block = 1024; }, "quant_block is 1024: a power of two"},
        {[](OptimizerOptions& o) { o.quant_min_numel = -1; }, "quant_min_numel is -1"},
        {[](OptimizerOptions& o) { o.stochastic_rounding = o.master_weights = true; },
         "stochastic_rounding and master_weights are both set"},
    };
    for (const auto& [spoil, message] : bad) {
      INFO(message);
      OptimizerOptions o;
      spoil(o);
      CHECK_THROWS_WITH_AS(fusedopt::check_options(o), doctest::Contains(message),
                           fusedopt::UsageError);
    }
  }
}
