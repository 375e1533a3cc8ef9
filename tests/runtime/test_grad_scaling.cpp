// Grad scaling: a step with a non-finite gradient anywhere changes nothing, bit for bit; a
// finite scaled step equals an unscaled step on the divided gradients; GradScaler follows
// torch's growth and backoff rule.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "common/host_tensors.hpp"
#include "fusedopt/error.hpp"

namespace fusedopt::testing {
namespace {

using fusedopt::DType;

/// Params of two dtypes (so two kernels), in two groups, with grads; every byte of what a
/// step may change can be snapshotted.
struct Model {
  std::vector<HostTensor> p, g;
  std::unique_ptr<fusedopt::Optimizer> opt;

  Model(std::mt19937& rng, const std::vector<std::int64_t>& sizes) {
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const DType d = k % 2 ? DType::BF16 : DType::F32;
      p.emplace_back(sizes[k], d);
      g.emplace_back(sizes[k], d);
      fill_normal(p.back(), rng);
    }
    std::vector<fusedopt::ParamGroup> groups(2);
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      groups[k % 3 == 0].params.push_back(p[k].tensor("t" + std::to_string(k)));
      groups[k % 3 == 0].grads.push_back(g[k].tensor());
    }
    groups[1].hypers = {{"lr", 3e-3}};
    fusedopt::OptimizerOptions options;
    options.master_weights = true;
    opt = std::make_unique<fusedopt::Optimizer>(fusedopt::Rule::preset("adamw"), groups, options);
  }

  /// Params, states and masters, as bytes.
  std::vector<std::string> snapshot() const {
    std::vector<std::string> out;
    for (int i = 0; i < static_cast<int>(p.size()); ++i) {
      for (const char* s : {"m", "v", "master"}) {
        const fusedopt::Tensor t = opt->state(s, i);
        const auto* d = static_cast<const char*>(t.data);
        out.emplace_back(d ? d : "", t.numel * fusedopt::dtype_size(t.dtype));
      }
    }
    for (const HostTensor& t : p) {
      const auto* d = static_cast<const char*>(const_cast<HostTensor&>(t).data());
      out.emplace_back(d ? d : "", t.numel() * fusedopt::dtype_size(t.dtype()));
    }
    return out;
  }

  void fill_grads(std::mt19937& rng, double scale) {
    std::normal_distribution<double> normal(0.0, 1.0);
    for (HostTensor& t : g) {
      for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, normal(rng) * scale);
    }
  }
};

}  // namespace

TEST_SUITE("runtime") {
  TEST_CASE("a scaled step with a NaN or inf anywhere changes nothing, bit for bit") {
    use_private_cache();
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    Model model(rng, {300, 1, 0, 4099, 70000, 17});
    for (int t = 0; t < 3; ++t) {
      model.fill_grads(rng, 1024.0);
      REQUIRE(model.opt->step_scaled(1.0f / 1024));
    }
    const double bad_values[] = {std::numeric_limits<double>::quiet_NaN(),
                                 std::numeric_limits<double>::infinity(),
                                 -std::numeric_limits<double>::infinity()};
    for (int trial = 0; trial < 24; ++trial) {
      model.fill_grads(rng, 1024.0);
      std::size_t k = 0;
      do {
        k = std::uniform_int_distribution<std::size_t>(0, model.g.size() - 1)(rng);
      } while (model.g[k].numel() == 0);
      const std::int64_t i =
          std::uniform_int_distribution<std::int64_t>(0, model.g[k].numel() - 1)(rng);
      const double bad = bad_values[trial % 3];
      model.g[k].set(i, bad);
      INFO("trial " << trial << ": " << bad << " at tensor " << k << ", element " << i);
      const std::vector<std::string> before = model.snapshot();
      const fusedopt::StepResult result = model.opt->step_scaled(1.0f / 1024);
      CHECK(result.known());  // the host knows its verdict when the step returns
      CHECK_FALSE(result.taken());
      CHECK(model.opt->step_count() == 3);
      CHECK(model.snapshot() == before);
    }
    model.fill_grads(rng, 1024.0);
    CHECK(model.opt->step_scaled(1.0f / 1024));
    CHECK(model.opt->step_count() == 4);
  }

  TEST_CASE("a finite scaled step equals an unscaled step on pre-divided gradients") {
    use_private_cache();
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937 rng_a(seed), rng_b(seed);
    const std::vector<std::int64_t> sizes = {1000, 3, 0, 4099};
    Model a(rng_a, sizes), b(rng_b, sizes);  // identical params
    REQUIRE(a.snapshot() == b.snapshot());
    for (int t = 0; t < 5; ++t) {
      // The same gradients, scaled by a power of two (so the unscale is exact).
      a.fill_grads(rng_a, 4096.0);
      b.fill_grads(rng_b, 1.0);
      REQUIRE(a.opt->step_scaled(1.0f / 4096));
      b.opt->step();
      CHECK(a.snapshot() == b.snapshot());
    }
    CHECK(a.opt->step_count() == 5);
  }

  TEST_CASE("GradScaler backs off on a skipped step and grows after growth_interval good ones") {
    use_private_cache();
    std::mt19937 rng(fresh_seed());
    Model model(rng, {100, 50});
    fusedopt::GradScaler::Options o;
    o.init_scale = 1024;
    o.growth_interval = 3;
    fusedopt::GradScaler scaler(o);
    CHECK(scaler.scale() == 1024);
    auto step = [&](bool finite) {
      model.fill_grads(rng, scaler.scale());
      if (!finite) model.g[1].set(7, NAN);
      return scaler.step(*model.opt);
    };
    // (finite?, taken, scale after, growth tracker after), as torch's GradScaler.update.
    struct Expect {
      bool finite, taken;
      double scale;
      int tracker;
    };
    const Expect sequence[] = {
        {true, true, 1024, 1},   {true, true, 1024, 2}, {true, true, 2048, 0},
        {false, false, 1024, 0}, {true, true, 1024, 1}, {false, false, 512, 0},
        {false, false, 256, 0},  {true, true, 256, 1},  {true, true, 256, 2},
        {true, true, 512, 0},    {true, true, 512, 1},
    };
    std::int64_t taken = 0;
    for (const Expect& e : sequence) {
      CHECK(step(e.finite) == e.taken);
      CHECK(scaler.scale() == e.scale);
      CHECK(scaler.growth_tracker() == e.tracker);
      CHECK(scaler.last_step_taken() == e.taken);
      taken += e.taken;
    }
    CHECK(model.opt->step_count() == taken);
    CHECK_FALSE(scaler.is_on_device());
    CHECK(scaler.device_scale() == nullptr);
  }

  TEST_CASE("GradScaler's grad_factor is folded into the one inverse scale") {
    // Data parallel: the gradients hold the sum over 3 ranks of scaled gradients; one
    // multiplication by float(factor / scale) (in double, rounded once) unscales and
    // averages them, exactly what step_scaled does with that value.
    use_private_cache();
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937 rng_a(seed), rng_b(seed);
    const std::vector<std::int64_t> sizes = {1000, 3, 4099};
    Model a(rng_a, sizes), b(rng_b, sizes);
    fusedopt::GradScaler::Options o;
    o.init_scale = 3000;  // not a power of two: the rounding is checked too
    fusedopt::GradScaler scaler(o);
    const float factor = 1.0f / 3;
    const auto expected = static_cast<float>(static_cast<double>(factor) / 3000.0);
    for (int t = 0; t < 4; ++t) {
      a.fill_grads(rng_a, 3 * 3000.0);
      b.fill_grads(rng_b, 3 * 3000.0);
      REQUIRE(scaler.step(*a.opt, nullptr, factor));
      REQUIRE(b.opt->step_scaled(expected));
      CHECK(a.snapshot() == b.snapshot());
    }
    // A NaN skips the step and backs the scale off, as without a factor.
    a.fill_grads(rng_a, 1.0);
    a.g[0].set(5, NAN);
    const std::vector<std::string> before = a.snapshot();
    CHECK_FALSE(scaler.step(*a.opt, nullptr, factor));
    CHECK(a.snapshot() == before);
    CHECK(scaler.scale() == 1500);
    for (const float bad : {0.0f, -1.0f, INFINITY, NAN}) {
      CHECK_THROWS_WITH_AS(scaler.step(*a.opt, nullptr, bad),
                           doctest::Contains("GradScaler::step: grad_factor must be positive and "
                                             "finite"),
                           fusedopt::UsageError);
    }
  }

  TEST_CASE("a device GradScaler needs a CUDA optimizer and says so") {
    use_private_cache();
    std::mt19937 rng(fresh_seed());
    Model model(rng, {100, 50});
    CHECK_THROWS_WITH_AS(fusedopt::GradScaler::on_device(*model.opt),
                         "GradScaler::on_device: the optimizer must be a CUDA one (its scale "
                         "lives in device memory); this one runs on host",
                         fusedopt::UsageError);
  }

  TEST_CASE("GradScaler rejects options torch rejects") {
    using O = fusedopt::GradScaler::Options;
    O o;
    o.growth_factor = 1.0;
    CHECK_THROWS_WITH_AS(fusedopt::GradScaler{o},
                         "GradScaler: growth_factor must be > 1 and finite in fp32, not 1",
                         fusedopt::Error);
    o = O{};
    o.backoff_factor = 1.5;
    CHECK_THROWS_WITH_AS(fusedopt::GradScaler{o},
                         "GradScaler: backoff_factor must be in (0, 1) in fp32, not 1.5",
                         fusedopt::Error);
    o = O{};
    o.init_scale = 0;
    CHECK_THROWS_WITH_AS(fusedopt::GradScaler{o},
                         "GradScaler: init_scale must be positive and finite in fp32, with a "
                         "finite inverse (2.9e-39 to 3.4e+38), not 0",
                         fusedopt::Error);
    o = O{};
    o.growth_interval = 0;
    CHECK_THROWS_WITH_AS(fusedopt::GradScaler{o},
                         "GradScaler: growth_interval must be at least 1, not 0", fusedopt::Error);
  }

  TEST_CASE("GradScaler refuses settings that fp32 rounds to inf, to 0 or to no change") {
    // Stored as fp32: 1e39 became an inf scale and 1e-50 a zero one, and every step was
    // then skipped with no error; a growth of 1 + 1e-10 is 1 in fp32 (never grows).
    using O = fusedopt::GradScaler::Options;
    for (double bad : {1e39, 1e-50, 1e-39, 4e38}) {
      O o;
      o.init_scale = bad;
      CAPTURE(bad);
      CHECK_THROWS_WITH_AS(fusedopt::GradScaler{o},
                           doctest::Contains("GradScaler: init_scale must be positive and "
                                             "finite in fp32"),
                           fusedopt::UsageError);
    }
    for (double bad : {1e39, 1.0 + 1e-10}) {
      O o;
      o.growth_factor = bad;
      CAPTURE(bad);
      CHECK_THROWS_WITH_AS(fusedopt::GradScaler{o},
                           doctest::Contains("GradScaler: growth_factor must be > 1 and finite "
                                             "in fp32"),
                           fusedopt::UsageError);
    }
    for (double bad : {1e-50, 1.0 - 1e-10}) {
      O o;
      o.backoff_factor = bad;
      CAPTURE(bad);
      CHECK_THROWS_WITH_AS(
          fusedopt::GradScaler{o},
          doctest::Contains("GradScaler: backoff_factor must be in (0, 1) in fp32"),
          fusedopt::UsageError);
    }
    // The edges that fit are taken as given.
    O o;
    o.init_scale = 3e38;
    CHECK(fusedopt::GradScaler{o}.scale() == static_cast<double>(3e38f));
    o.init_scale = 1e-38;
    CHECK(fusedopt::GradScaler{o}.scale() == static_cast<double>(1e-38f));
  }
}

}  // namespace fusedopt::testing
