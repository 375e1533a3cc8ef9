// Moved-from Optimizer, FlatArena, Rule and GradScaler: every public method either refuses
// with a UsageError that says the object was moved from, or (destruction, assignment, the
// value types Rule and GradScaler, whose moves copy) stays valid.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <utility>

#include "common/host_tensors.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/extension.hpp"

namespace fusedopt::testing {
namespace {

using fusedopt::DType;
using fusedopt::FlatArena;
using fusedopt::GradScaler;
using fusedopt::Optimizer;
using fusedopt::ParamGroup;
using fusedopt::Rule;
using fusedopt::UsageError;

/// One fp32 param and its grad on fresh random data, with a float64 copy of both.
struct OneParam {
  HostTensor p{37, DType::F32}, g{37, DType::F32};
  std::vector<double> p0, g0;
  OneParam() {
    std::mt19937 rng(fresh_seed());
    fill_normal(p, rng);
    fill_normal(g, rng);
    for (std::int64_t i = 0; i < p.numel(); ++i) {
      p0.push_back(p.get(i));
      g0.push_back(g.get(i));
    }
  }
  ParamGroup group(const std::string& name) {
    ParamGroup out;
    out.params.push_back(p.tensor(name));
    out.grads.push_back(g.tensor());
    return out;
  }
  /// Plain SGD (no momentum): p - lr * g, in float64.
  void check_sgd_step(double lr) const {
    for (std::int64_t i = 0; i < p.numel(); ++i) {
      const double want = p0[static_cast<std::size_t>(i)] - lr * g0[static_cast<std::size_t>(i)];
      CHECK(p.get(i) == doctest::Approx(want).epsilon(1e-6));
    }
  }
};

}  // namespace

TEST_SUITE("runtime") {
  TEST_CASE("every method of a moved-from Optimizer throws UsageError") {
    use_private_cache();
    OneParam x;
    Optimizer a(Rule::preset("sgd"), {x.group("w")});
    Optimizer b(std::move(a));
    const char* kWhat = "this Optimizer was moved from";
    auto msg = [&](const char* method) {
      return std::string("Optimizer::") + method + ": " + kWhat;
    };
    // NOLINTBEGIN(bugprone-use-after-move): using the moved-from object is the point.
    CHECK_THROWS_WITH_AS(a.step(), msg("step").c_str(), UsageError);
    CHECK_THROWS_WITH_AS(a.step_scaled(0.5f), msg("step_scaled").c_str(), UsageError);
    CHECK_THROWS_WITH_AS(fusedopt::OptimizerExtension::set_reduction_hook(a, {}),
                         msg("set_reduction_hook").c_str(), UsageError);
    CHECK_THROWS_WITH_AS(a.set_hyper("lr", 0.1), msg("set_hyper").c_str(), UsageError);
    CHECK_THROWS_WITH_AS(a.hyper("lr"), msg("hyper").c_str(), UsageError);
    CHECK_THROWS_WITH_AS(a.step_count(), msg("step_count").c_str(), UsageError);
    CHECK_THROWS_WITH_AS(a.stats(), msg("stats").c_str(), UsageError);
    CHECK_THROWS_WITH_AS(a.state("momentum_buffer", 0), msg("state").c_str(), UsageError);
    CHECK_THROWS_WITH_AS(a.save("never-written.safetensors"), msg("save").c_str(), UsageError);
    CHECK_FALSE(std::filesystem::exists("never-written.safetensors"));
    CHECK_THROWS_WITH_AS(a.load("never-read.safetensors"), msg("load").c_str(), UsageError);
    // The object it moved into works: one SGD step against the float64 reference.
    b.set_hyper("lr", 0.25);
    b.step();
    CHECK(b.step_count() == 1);
    x.check_sgd_step(0.25);
    // Assigning to the moved-from object makes it usable again; destroying it is fine too.
    a = std::move(b);
    CHECK(a.step_count() == 1);
    CHECK_THROWS_WITH_AS(b.step(), msg("step").c_str(), UsageError);
    // NOLINTEND(bugprone-use-after-move)
  }

  TEST_CASE("a moved-from Optimizer is destroyed quietly and a GradScaler on it throws") {
    use_private_cache();
    OneParam x;
    auto a =
        std::make_unique<Optimizer>(Rule::preset("sgd"), std::vector<ParamGroup>{x.group("w")});
    Optimizer b(std::move(*a));
    GradScaler scaler;
    // NOLINTNEXTLINE(bugprone-use-after-move)
    CHECK_THROWS_WITH_AS(scaler.step(*a), "Optimizer::step_scaled: this Optimizer was moved from",
                         UsageError);
    CHECK(scaler.scale() == 65536.0);  // the failed call changed nothing
    a.reset();                         // destruction of a moved-from Optimizer
    CHECK(b.step_count() == 0);
  }

  TEST_CASE("every method of a moved-from FlatArena throws UsageError; assignment revives it") {
    FlatArena a;
    a.add("w", 10, DType::F32);
    FlatArena b(std::move(a));
    auto msg = [](const char* method) {
      return std::string("FlatArena::") + method + ": this FlatArena was moved from";
    };
    // NOLINTBEGIN(bugprone-use-after-move)
    CHECK_THROWS_WITH_AS(a.add("v", 3, DType::F32), msg("add").c_str(), UsageError);
    CHECK_THROWS_WITH_AS(a.finalize(), msg("finalize").c_str(), UsageError);
    CHECK_THROWS_WITH_AS(a.param(0), msg("param").c_str(), UsageError);
    CHECK_THROWS_WITH_AS(a.grad(0), msg("grad").c_str(), UsageError);
    CHECK_THROWS_WITH_AS(a.size(), msg("size").c_str(), UsageError);
    b.finalize();
    REQUIRE(b.size() == 1);
    CHECK(b.param(0).numel == 10);
    FlatArena c;
    c = std::move(b);  // move assignment: c owns the views now, b is moved from
    CHECK(c.param(0).numel == 10);
    CHECK_THROWS_WITH_AS(b.size(), msg("size").c_str(), UsageError);
    b = FlatArena();  // assigning to a moved-from arena makes it usable again
    CHECK(b.size() == 0);
    b.add("u", 2, DType::BF16);
    b.finalize();
    CHECK(b.param(0).dtype == DType::BF16);
    // NOLINTEND(bugprone-use-after-move)
  }

  TEST_CASE("a moved-from Rule is the same rule: every method works and it still trains") {
    use_private_cache();
    Rule a = Rule::preset("adamw");
    const std::string text = a.text();
    Rule b(std::move(a));
    Rule c = Rule::preset("sgd");
    c = std::move(b);
    // NOLINTBEGIN(bugprone-use-after-move): using the moved-from objects is the point.
    for (const Rule* r : {&a, &b, &c}) {
      CHECK(r->name() == "adamw");
      CHECK(r->text() == text);
      CHECK(r->hypers().size() == 6);
      CHECK(r->states() == std::vector<std::string>{"m", "v"});
      CHECK(r->reduction_passes() == 0);
      CHECK(r->with_grad_clipping(1.0).name() == "adamw+clip");
      CHECK(r->describe().find("adamw") != std::string::npos);
    }
    Rule sgd = Rule::preset("sgd");
    Rule taken(std::move(sgd));
    OneParam x;
    Optimizer opt(sgd, {x.group("w")});  // built from the moved-from Rule
    opt.set_hyper("lr", 0.5);
    opt.step();
    x.check_sgd_step(0.5);
    // NOLINTEND(bugprone-use-after-move)
  }

  TEST_CASE("a moved-from GradScaler is a valid copy: same scale, same tracker, still steps") {
    use_private_cache();
    OneParam x;
    Optimizer opt(Rule::preset("sgd"), {x.group("w")});
    opt.set_hyper("lr", 0.5);
    GradScaler::Options o;
    o.init_scale = 4.0;
    o.growth_interval = 1;
    GradScaler a(o);
    GradScaler b(std::move(a));
    // NOLINTBEGIN(bugprone-use-after-move)
    CHECK(a.scale() == 4.0);
    CHECK(a.growth_tracker() == 0);
    CHECK(b.scale() == 4.0);
    // The grads are unscaled by 1/4 in the kernel: p - lr * g / 4 (grads here are unscaled
    // values already, so the reference divides them by the scale too).
    CHECK(a.step(opt));
    for (std::int64_t i = 0; i < x.p.numel(); ++i) {
      const auto k = static_cast<std::size_t>(i);
      CHECK(x.p.get(i) == doctest::Approx(x.p0[k] - 0.5 * x.g0[k] / 4.0).epsilon(1e-6));
    }
    CHECK(a.scale() == 8.0);  // growth_interval 1: one good step doubles it
    b = std::move(a);
    CHECK(b.scale() == 8.0);
    CHECK(a.scale() == 8.0);
    // NOLINTEND(bugprone-use-after-move)
  }
}

}  // namespace fusedopt::testing
