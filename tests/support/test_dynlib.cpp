// support::DynLib, the one dlopen wrapper behind NVRTC, the CUDA driver, NCCL and the host
// kernels. It lives in the cache suite with the other support tests (the suite links
// fusedopt::support).
#include <doctest/doctest.h>

#include <string>

#include "support/dynlib.hpp"

namespace fusedopt::testing {

using fusedopt::support::DynLib;

TEST_SUITE("support") {
  TEST_CASE("DynLib::open loads a library by name and finds its symbols") {
    std::string error = "untouched";
    std::unique_ptr<DynLib> libc = DynLib::open("libc.so.6", &error);
    REQUIRE(libc);
    CHECK(error == "untouched");
    CHECK(libc->path() == "libc.so.6");
    CHECK(libc->symbol("malloc") != nullptr);
    CHECK(libc->symbol("fusedopt_no_such_symbol") == nullptr);
  }

  TEST_CASE("DynLib::open of a missing library is null, with dlerror's message") {
    std::string error;
    CHECK_FALSE(DynLib::open("/nonexistent/libfusedopt-test.so", &error));
    CHECK(error.find("/nonexistent/libfusedopt-test.so") != std::string::npos);
    CHECK_FALSE(DynLib::open("/nonexistent/libfusedopt-test.so", nullptr));
  }

  TEST_CASE("DynLib::open_first skips empty names and takes the first that loads") {
    std::string error = "untouched";
    std::unique_ptr<DynLib> lib =
        DynLib::open_first({"", "/nonexistent/a.so", "libc.so.6", "libm.so.6"}, &error);
    REQUIRE(lib);
    CHECK(lib->path() == "libc.so.6");
    CHECK(error == "untouched");
    CHECK_FALSE(DynLib::open_first({"/nonexistent/a.so", "", "/nonexistent/b.so"}, &error));
    // One line per name tried, each "\n  NAME: dlerror()".
    CHECK(error.rfind("\n  /nonexistent/a.so: ", 0) == 0);
    CHECK(error.find("\n  /nonexistent/b.so: ") != std::string::npos);
    CHECK(error.find("\n  : ") == std::string::npos);
  }
}

}  // namespace fusedopt::testing
