// The Newton-Schulz iteration of the matrix stage (src/matrix/newton_schulz.hpp) against a
// float64 reference written here (the same iteration as torch.optim.Muon's
// _zeropower_via_newtonschulz, in double), on fresh random matrices: square, wide, tall
// (iterated transposed), batches, one coefficient triple or one per round; and its checks.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "common/host_tensors.hpp"
#include "fusedopt/error.hpp"
#include "matrix/newton_schulz.hpp"
#include "matrix/ns_reference.hpp"

namespace {

using fusedopt::matrix::NewtonSchulz;
using fusedopt::testing::Matrix;
using fusedopt::testing::reference;

/// Orthogonalizes `batch` fresh random matrices of rows x cols in fp32 and compares each
/// with the float64 reference: within fp32 rounding of the iteration (2e-5 of the largest
/// value; 64 x 64 lands at about 2e-6).
void check_against_reference(int batch, int rows, int cols, const NewtonSchulz& ns) {
  const std::uint32_t seed = fusedopt::testing::fresh_seed();
  INFO(batch << " x " << rows << " x " << cols << ", " << ns.steps << " steps, seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const std::size_t each = static_cast<std::size_t>(rows) * cols;
  std::vector<float> data(each * batch);
  for (float& v : data) v = normal(rng);
  const std::vector<float> input = data;
  double ratio = 0;
  fusedopt::matrix::orthogonalize(data.data(), batch, rows, cols, ns);
  for (int b = 0; b < batch; ++b) {
    const Matrix x(input.begin() + b * each, input.begin() + (b + 1) * each);
    const Matrix want = reference(x, rows, cols, ns);
    double largest = 0, worst = 0;
    for (std::size_t i = 0; i < each; ++i) {
      largest = std::max(largest, std::abs(want[i]));
      worst = std::max(worst, std::abs(data[b * each + i] - want[i]));
    }
    INFO("matrix " << b << ": worst |fp32 - float64| " << worst << ", largest " << largest);
    CHECK(largest > 0.1);  // not a zero matrix
    CHECK(worst <= 2e-5 * largest);
    ratio = std::max(ratio, worst / largest);
  }
  MESSAGE(batch << " x " << rows << " x " << cols << ": worst |fp32 - float64| / largest "
                << ratio);
}

}  // namespace

TEST_SUITE("matrix") {
  TEST_CASE("Newton-Schulz matches a float64 reference: square, wide and tall, in batches") {
    const NewtonSchulz muon;  // torch.optim.Muon's defaults
    check_against_reference(1, 64, 64, muon);
    check_against_reference(3, 24, 80, muon);
    check_against_reference(2, 96, 40, muon);  // tall: iterated transposed
    check_against_reference(1, 1, 17, muon);
    check_against_reference(1, 33, 1, muon);
  }

  TEST_CASE("Newton-Schulz takes one coefficient triple per round and any round count") {
    NewtonSchulz ns;
    ns.steps = 4;
    ns.coefficients = {{{4.0848f, -6.8946f, 2.9270f},
                        {3.9505f, -6.3029f, 2.6377f},
                        {3.7418f, -5.5913f, 2.3037f},
                        {2.8769f, -3.1427f, 1.2046f}}};
    check_against_reference(2, 48, 32, ns);
    ns.steps = 9;
    ns.coefficients = {{2.0f, -1.5f, 0.5f}};
    check_against_reference(1, 20, 30, ns);
  }

  TEST_CASE("Newton-Schulz leaves a zero matrix zero (its norm clamped to eps)") {
    std::vector<float> zeros(12, 0.0f);
    fusedopt::matrix::orthogonalize(zeros.data(), 1, 3, 4, NewtonSchulz{});
    CHECK(std::all_of(zeros.begin(), zeros.end(), [](float v) { return v == 0.0f; }));
  }

  TEST_CASE("Newton-Schulz refuses iteration settings out of range, saying which") {
    std::vector<float> x(4, 1.0f);
    auto refused = [&](NewtonSchulz ns, const char* words) {
      INFO(words);
      try {
        fusedopt::matrix::orthogonalize(x.data(), 1, 2, 2, ns);
        FAIL("accepted");
      } catch (const fusedopt::UsageError& e) {
        CHECK(std::string(e.what()).find(words) != std::string::npos);
      }
    };
    NewtonSchulz ns;
    ns.steps = 0;
    refused(ns, "ns_steps is 0; it must be from 1 to 100");
    ns = NewtonSchulz{};
    ns.steps = 3;
    ns.coefficients.assign(2, {1.0f, 0.0f, 0.0f});
    refused(ns, "2 coefficient triples for 3 steps");
    ns = NewtonSchulz{};
    ns.coefficients[0][1] = NAN;
    refused(ns, "coefficient triple 0 holds nan");
    ns = NewtonSchulz{};
    ns.eps = 0;
    refused(ns, "eps is 0; it must be a finite number above 0");
    CHECK_THROWS_AS(fusedopt::matrix::orthogonalize(x.data(), 1, 0, 2, NewtonSchulz{}),
                    fusedopt::UsageError);
  }

  TEST_CASE("the iteration's flops are its three GEMMs per round") {
    // m = 2, n = 3: X X^T 2*2*3, A A 2*2*2, B X 2*3*2 multiply-adds per round.
    CHECK(fusedopt::matrix::orthogonalize_flops(3, 2, 5) == 5 * 2.0 * (12 + 8 + 12));
    CHECK(fusedopt::matrix::orthogonalize_flops(2, 3, 1) == 2.0 * (12 + 8 + 12));
  }
}
