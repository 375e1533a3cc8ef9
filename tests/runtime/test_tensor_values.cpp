// The built-in per-tensor values numel, dims, rows and cols: a param's shape given at
// construction (Tensor::shape) as a rule reads it, on the host, against values written out
// here; bad shapes are refused naming the tensor.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/host_tensors.hpp"
#include "common/requirements.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/kernel.hpp"
#include "fusedopt/optimizer.hpp"

namespace fusedopt::testing {
namespace {

using fusedopt::DType;
using fusedopt::Optimizer;
using fusedopt::Rule;

/// Stores each tensor's built-ins in two states and steps by g times the param's RMS
/// (torch's Adafactor scales by ||p|| / sqrt(numel)).
const char* kInfoRule = R"(
param p
grad  g
state a = 0, b = 0
hyper lr = 0.1
a = numel * 10 + dims
b = rows * 1000 + cols
rms = tensor_norm(p) / sqrt(numel)
p = p - lr * g * rms
)";

struct Case {
  std::vector<std::int64_t> shape;  ///< empty: not given
  std::int64_t numel;
  double dims, rows, cols;
};

}  // namespace

TEST_SUITE("runtime") {
  TEST_CASE("numel, dims, rows and cols are each tensor's, from its shape") {
    use_private_cache();
    const std::vector<Case> cases = {
        {{}, 7, 1, 7, 1},                  // no shape: 1-D, numel rows of one column
        {{3, 5}, 15, 2, 3, 5},             // a matrix
        {{2, 3, 4}, 24, 3, 3, 4},          // batched: the last two dimensions
        {{4099}, 4099, 1, 4099, 1},        // 1-D given
        {{0, 4}, 0, 2, 0, 4},              // empty
        {{301, 233}, 70133, 2, 301, 233},  // many chunks (values exact in fp32)
    };
    std::mt19937 rng(fresh_seed());
    std::vector<HostTensor> p, g;
    fusedopt::ParamGroup group;
    for (std::size_t k = 0; k < cases.size(); ++k) {
      p.emplace_back(cases[k].numel, DType::F32);
      g.emplace_back(cases[k].numel, DType::F32);
      fill_normal(p[k], rng);
      fill_normal(g[k], rng);
      fusedopt::Tensor t = p[k].tensor("w" + std::to_string(k));
      t.shape = cases[k].shape;
      group.params.push_back(t);
      group.grads.push_back(g[k].tensor());
    }
    Optimizer opt(Rule::parse(kInfoRule, "info.rule"), {group});
    std::vector<std::vector<double>> want(cases.size());
    for (std::size_t k = 0; k < cases.size(); ++k) {
      double sq = 0;
      for (std::int64_t i = 0; i < cases[k].numel; ++i) sq += p[k].get(i) * p[k].get(i);
      const double rms = std::sqrt(sq / static_cast<double>(cases[k].numel));
      for (std::int64_t i = 0; i < cases[k].numel; ++i) {
        want[k].push_back(p[k].get(i) - 0.1 * g[k].get(i) * rms);
      }
    }
    opt.step();
    for (std::size_t k = 0; k < cases.size(); ++k) {
      INFO("tensor " << k << " (" << cases[k].numel << " elements)");
      const fusedopt::Tensor a = opt.state("a", static_cast<int>(k));
      const fusedopt::Tensor b = opt.state("b", static_cast<int>(k));
      for (std::int64_t i = 0; i < cases[k].numel; ++i) {
        REQUIRE(at(a, i) == static_cast<double>(cases[k].numel) * 10 + cases[k].dims);
        REQUIRE(at(b, i) == cases[k].rows * 1000 + cases[k].cols);
        const double w = want[k][static_cast<std::size_t>(i)];
        REQUIRE(std::abs(p[k].get(i) - w) <= 1e-6 * (1 + std::abs(w)));
      }
    }
  }

  TEST_CASE("a shape that does not fit the tensor is refused, naming it") {
    use_private_cache();
    HostTensor p(15, DType::F32), g(15, DType::F32);
    auto make = [&](std::vector<std::int64_t> pshape, std::vector<std::int64_t> gshape) {
      fusedopt::ParamGroup group;
      fusedopt::Tensor pt = p.tensor("w"), gt = g.tensor();
      pt.shape = std::move(pshape);
      gt.shape = std::move(gshape);
      group.params.push_back(pt);
      group.grads.push_back(gt);
      return Optimizer(Rule::parse(kInfoRule, "info.rule"), {group});
    };
    CHECK_NOTHROW(make({3, 5}, {3, 5}));
    CHECK_NOTHROW(make({3, 5}, {}));
    CHECK_THROWS_WITH_AS(make({4, 4}, {}),
                         "group 0, param 0 ('w'): param shape [4, 4] has 16 elements, but numel "
                         "is 15",
                         fusedopt::UsageError);
    CHECK_THROWS_WITH_AS(make({3, -5}, {}),
                         doctest::Contains("param shape has a negative dimension (-5)"),
                         fusedopt::UsageError);
    CHECK_THROWS_WITH_AS(make({3, 5}, {5, 3}),
                         doctest::Contains("('w'): grad shape differs from the param's [3, 5]"),
                         fusedopt::UsageError);
  }

  TEST_CASE("the built-ins are read-only and reserved") {
    CHECK_THROWS_WITH_AS(Rule::parse("param p\ngrad g\nnumel = 3\np = p - g\n", "x.rule"),
                         doctest::Contains("cannot assign to 'numel'"), fusedopt::RuleError);
    CHECK_THROWS_WITH_AS(Rule::parse("param p\ngrad g\nstate rows = 0\np = p - g\n", "x.rule"),
                         doctest::Contains("cannot declare 'rows'"), fusedopt::RuleError);
    CHECK_THROWS_WITH_AS(
        Rule::parse("param p\ngrad g\nstate m = cols\nm = m + g\np = p - m\n", "x.rule"),
        doctest::Contains("cannot use built-in 'cols'"), fusedopt::RuleError);
  }

  TEST_CASE("a rule reading the built-ins compiles with NVRTC for sm_90" *
            fusedopt::testing::needs_nvrtc()) {
    const fusedopt::CompiledKernel k =
        fusedopt::compile_kernel(Rule::parse(kInfoRule, "info.rule"), fusedopt::Target::cuda(90));
    CHECK(!k.key.empty());
    REQUIRE(k.binary != nullptr);
    CHECK(k.binary->compare(0, 4,
                            "\x7f"
                            "ELF") == 0);  // a CUBIN
  }
}

}  // namespace fusedopt::testing
