// The kernel cache of the test cases that compile kernels to use them (not to test the
// cache): under CTest, the build folder's cache for tests (FUSEDOPT_TEST_KERNEL_CACHE,
// tests/CMakeLists.txt), so each kernel compiles once per build whichever suite needs it
// first; run by hand, a memory cache in a private temporary folder. Never the user's cache.
// What the cache itself does is tested with caches of their own.
#pragma once

#include <cstdlib>

#include "cache/kernel_cache.hpp"
#include "common/temp_dir.hpp"

namespace fusedopt::testing {

inline cache::KernelCache& test_kernel_cache() {
  static TempDir dir;  // constructed first, so destroyed after the cache
  static cache::KernelCache cache([] {
    cache::KernelCache::Options options;
    options.dir = dir.path();
    options.mode = cache::KernelCache::Mode::Memory;
    if (const char* shared = std::getenv("FUSEDOPT_TEST_KERNEL_CACHE"); shared && *shared) {
      options.dir = shared;
      options.mode = cache::KernelCache::Mode::On;
    }
    return options;
  }());
  return cache;
}

}  // namespace fusedopt::testing
