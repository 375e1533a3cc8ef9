// Params and grads that share memory are refused at construction, naming both tensors:
// partial overlaps, a param that is its own grad, grads overlapping each other or a param,
// ranges nested in a longer one, and device tensors (addresses only). Touching ranges are
// fine and step like separate tensors.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "common/host_tensors.hpp"
#include "fusedopt/error.hpp"

namespace fusedopt::testing {
namespace {

using fusedopt::Device;
using fusedopt::DType;
using fusedopt::Optimizer;
using fusedopt::ParamGroup;
using fusedopt::Rule;
using fusedopt::Tensor;
using fusedopt::UsageError;

Tensor view(void* data, std::int64_t numel, const std::string& name = "") {
  Tensor t;
  t.data = data;
  t.numel = numel;
  t.name = name;
  return t;
}

/// One fp32 buffer on fresh random data that tests carve params and grads from.
struct Buffer {
  std::vector<float> v;
  explicit Buffer(std::size_t n) : v(n) {
    std::mt19937 rng(fresh_seed());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& x : v) x = normal(rng);
  }
  float* at(std::size_t i) { return v.data() + i; }
};

}  // namespace

TEST_SUITE("runtime") {
  TEST_CASE("params whose bytes partly overlap are refused, naming both") {
    use_private_cache();
    Buffer w(15), g(20);
    ParamGroup group;
    group.params = {view(w.at(0), 10, "a"), view(w.at(5), 10, "b")};  // bytes [0,40), [20,60)
    group.grads = {view(g.at(0), 10), view(g.at(10), 10)};
    CHECK_THROWS_WITH_AS(Optimizer(Rule::preset("sgd"), {group}),
                         "group 0, param 1 ('b'): param overlaps the param of group 0, param 0 "
                         "('a') in memory (params and grads must not share any byte)",
                         UsageError);
  }

  TEST_CASE("a param that is its own grad is refused") {
    use_private_cache();
    Buffer w(8);
    ParamGroup group;
    group.params = {view(w.at(0), 8, "w")};
    group.grads = {view(w.at(0), 8)};
    CHECK_THROWS_WITH_AS(Optimizer(Rule::preset("sgd"), {group}),
                         "group 0, param 0 ('w'): grad overlaps the param of group 0, param 0 "
                         "('w') in memory (params and grads must not share any byte)",
                         UsageError);
  }

  TEST_CASE("grads overlapping each other or another group's param are refused") {
    use_private_cache();
    Buffer p(20), g(20);
    ParamGroup g0, g1;
    g0.params = {view(p.at(0), 4, "a")};
    g0.grads = {view(g.at(0), 4)};
    g1.params = {view(p.at(4), 4, "b")};
    g1.grads = {view(g.at(3), 4)};  // shares element 3 with a's grad
    CHECK_THROWS_WITH_AS(Optimizer(Rule::preset("sgd"), {g0, g1}),
                         "group 1, param 0 ('b'): grad overlaps the grad of group 0, param 0 "
                         "('a') in memory (params and grads must not share any byte)",
                         UsageError);
    g1.grads = {view(p.at(1), 4)};  // b's grad inside a's param
    CHECK_THROWS_WITH_AS(Optimizer(Rule::preset("sgd"), {g0, g1}),
                         "group 1, param 0 ('b'): grad overlaps the param of group 0, param 0 "
                         "('a') in memory (params and grads must not share any byte)",
                         UsageError);
  }

  TEST_CASE("a param nested inside a longer param is refused") {
    use_private_cache();
    Buffer p(100), q(10), h(120);
    ParamGroup group;
    group.params = {view(p.at(0), 100, "a"), view(q.at(0), 10, "b"), view(p.at(60), 10, "c")};
    group.grads = {view(h.at(0), 100), view(h.at(100), 10), view(h.at(110), 10)};
    CHECK_THROWS_WITH_AS(Optimizer(Rule::preset("sgd"), {group}),
                         "group 0, param 2 ('c'): param overlaps the param of group 0, param 0 "
                         "('a') in memory (params and grads must not share any byte)",
                         UsageError);
  }

  TEST_CASE("device tensors that overlap are refused from their addresses alone") {
    use_private_cache();
    // Never dereferenced: the check runs before any backend is made.
    auto fake = [](std::uintptr_t a) { return reinterpret_cast<void*>(a); };
    ParamGroup group;
    group.params = {view(fake(0x100000), 64, "a"), view(fake(0x100000 + 128), 64, "b")};
    group.grads = {view(fake(0x200000), 64), view(fake(0x300000), 64)};
    for (Tensor& t : group.params) t.device = Device::cuda(0);
    for (Tensor& t : group.grads) t.device = Device::cuda(0);
    CHECK_THROWS_WITH_AS(Optimizer(Rule::preset("sgd"), {group}),
                         "group 0, param 1 ('b'): param overlaps the param of group 0, param 0 "
                         "('a') in memory (params and grads must not share any byte)",
                         UsageError);
  }

  TEST_CASE("params and grads that only touch are accepted and step like separate tensors") {
    use_private_cache();
    Buffer p(20), g(20);
    const std::vector<float> p0 = p.v, g0 = g.v;
    ParamGroup group;
    // a's param ends where b's begins; b's grad ends where a's grad begins.
    group.params = {view(p.at(0), 10, "a"), view(p.at(10), 10, "b")};
    group.grads = {view(g.at(10), 10), view(g.at(0), 10)};
    Optimizer opt(Rule::preset("sgd"), {group});
    opt.set_hyper("lr", 0.125);
    opt.step();
    for (std::size_t i = 0; i < 20; ++i) {
      const std::size_t gi = i < 10 ? i + 10 : i - 10;
      const double want = static_cast<double>(p0[i]) - 0.125 * static_cast<double>(g0[gi]);
      CHECK(static_cast<double>(p.v[i]) == doctest::Approx(want).epsilon(1e-6));
    }
  }
}

}  // namespace fusedopt::testing
