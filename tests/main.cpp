// doctest's main for every suite executable. A case that needs something absent here
// (common/skip.hpp) is skipped by doctest and named on stdout as "[SKIP] <case>: <why>";
// a failing case always fails the executable (exit 1), whatever it printed. Where
// FUSEDOPT_TEST_SKIP_RETURN_CODE is set (GPU-only suites, with the same CTest
// SKIP_RETURN_CODE: cmake/FusedoptTests.cmake) the executable exits with that code instead
// of 0 when it ran no case at all because something was absent. Where FUSEDOPT_TEST_NO_SKIPS
// is 1 (the GPU suite on the CUDA emulator, which must run every case) a skipped case fails
// the executable.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace {

struct RunSummary {
  unsigned ran = 0;
  unsigned failed = 0;
  unsigned absent = 0;  ///< cases skipped because something they need is absent
};

RunSummary& summary() {
  static RunSummary s;
  return s;
}

/// Names every case skipped for an absent requirement, and keeps the run's counts.
class SkipListener : public doctest::IReporter {
 public:
  explicit SkipListener(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& stats) override {
    summary().ran = stats.numTestCasesPassingFilters;
    summary().failed = stats.numTestCasesFailed;
  }
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData& tc) override {
    // Cases left out by command-line filters are not "skipped" in this sense.
    if (!tc.m_skip) return;
    ++summary().absent;
    std::printf("[SKIP] %s: %s\n", tc.m_name, tc.m_description ? tc.m_description : "skipped");
    std::fflush(stdout);
  }
};

}  // namespace

DOCTEST_REGISTER_LISTENER("fusedopt-skips", 1, SkipListener);

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int result = context.run();
  if (context.shouldExit()) return result;
  const RunSummary& s = summary();
  if (result != 0 || s.failed != 0) return 1;
  const char* no_skips = std::getenv("FUSEDOPT_TEST_NO_SKIPS");
  if (no_skips != nullptr && std::string(no_skips) == "1" && s.absent > 0) {
    std::printf("FUSEDOPT_TEST_NO_SKIPS=1: %u case(s) skipped, and none may be here\n", s.absent);
    return 1;
  }
  const char* code = std::getenv("FUSEDOPT_TEST_SKIP_RETURN_CODE");
  if (code != nullptr && *code != '\0' && s.ran == 0 && s.absent > 0) return std::atoi(code);
  return 0;
}
