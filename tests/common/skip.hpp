// Per-case requirements: a doctest decorator that skips a case only where something it
// needs is really absent, with the reason; tests/main.cpp prints "[SKIP] <case>: <why>"
// for it. Nothing else skips: a case that runs and fails is reported failed.
#pragma once

#include <doctest/doctest.h>

#include <string>

namespace fusedopt::testing {

/// Whether something a test case needs is here, and if not, why.
struct Availability {
  bool present = true;
  std::string why;
};

/// `TEST_CASE("name" * Requires(availability))`: decided when the case is registered. The
/// availability must outlive the run (a function-local static); the first absent
/// requirement of a case gives its reason.
class Requires {
 public:
  explicit Requires(const Availability& availability) : availability_(&availability) {}
  void fill(doctest::detail::TestCase& tc) const { apply(tc); }
  void fill(doctest::detail::TestSuite& ts) const { apply(ts); }

 private:
  template <typename T>
  void apply(T& t) const {
    if (availability_->present || t.m_skip) return;
    t.m_skip = true;
    t.m_description = availability_->why.c_str();
  }
  const Availability* availability_;
};

}  // namespace fusedopt::testing
