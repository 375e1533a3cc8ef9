// The numeric tests' tolerance: a value is close to its float64 reference when
// |got - want| <= tol * (|want| + scale), scale being the largest |want| of what is compared
// (a role of one tensor, or of a whole model), so values near zero are judged against the
// size of their neighbours.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <sstream>
#include <string>
#include <vector>

namespace fusedopt::testing {

/// The largest |x| of `xs`, or `start` when that is larger.
inline double max_abs(const std::vector<double>& xs, double start = 0.0) {
  double m = start;
  for (double x : xs) m = std::max(m, std::abs(x));
  return m;
}

/// The largest |x| over every vector of `xs`.
inline double max_abs(const std::vector<std::vector<double>>& xs) {
  double m = 0.0;
  for (const auto& x : xs) m = max_abs(x, m);
  return m;
}

/// `x` to 9 significant digits (every digit a float has).
inline std::string fmt_double(double x) {
  std::ostringstream os;
  os.precision(9);
  os << x;
  return os.str();
}

/// Counts the elements of `got` farther than tol * (|want| + scale) from `want`, failing the
/// case with the first three and then the count.
template <typename T>
int check_close(const std::string& what, const std::vector<T>& got, const std::vector<double>& want,
                double tol, double scale) {
  if (got.size() != want.size()) {
    FAIL_CHECK(what << ": " << got.size() << " values, want " << want.size());
    return 1;
  }
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]);
    const double err = std::abs(g - want[i]);
    if (!(err <= tol * (std::abs(want[i]) + scale))) {
      if (bad++ < 3) {
        FAIL_CHECK(what << "[" << i << "]: got " << fmt_double(g) << ", want "
                        << fmt_double(want[i]) << " (error " << err << ", allowed "
                        << tol * (std::abs(want[i]) + scale) << ")");
      }
    }
  }
  if (bad > 3) FAIL_CHECK(what << ": " << bad << " values out of tolerance in all");
  return bad;
}

/// The same with scale = the largest |want|.
template <typename T>
int check_close(const std::string& what, const std::vector<T>& got, const std::vector<double>& want,
                double tol) {
  return check_close(what, got, want, tol, max_abs(want));
}

/// Every tensor k of `got` against `want[k]`, scale = the largest |want| over all of them.
inline void check_close(const std::string& what, const std::vector<std::vector<double>>& got,
                        const std::vector<std::vector<double>>& want, double tol) {
  REQUIRE(got.size() == want.size());
  const double scale = max_abs(want);
  for (std::size_t k = 0; k < got.size(); ++k) {
    check_close(what + " t" + std::to_string(k), got[k], want[k], tol, scale);
  }
}

}  // namespace fusedopt::testing
