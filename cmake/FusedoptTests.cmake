# How every fusedopt test suite is registered with CTest; tests/skip_honesty checks these
# same rules from a nested project, so keep test properties here and nowhere else.
#
# A skip is never read from a test's output (no SKIP_REGULAR_EXPRESSION): a case that needs
# NVRTC or a device that is absent is skipped by doctest itself (tests/common/skip.hpp), and
# any failing case fails its suite.
#
#   fusedopt_add_test_suite(<name> COMMAND <exe> [<arg>...] [LABELS <label>...]
#                           [SKIP_WHEN_ABSENT] [TIMEOUT <seconds>] [COST <n>])
#
# COST: the run time in seconds measured from a cold kernel cache on the 2-core VM, so that
# ctest -j starts the longest suites first even before it has timed them once.
#
# SKIP_WHEN_ABSENT (GPU-only suites): the suite's main exits with
# FUSEDOPT_TEST_SKIP_RETURN_CODE, which CTest reports as skipped, only when it ran no case
# at all because what they need is absent; after any failure it exits 1.

set(FUSEDOPT_TEST_SKIP_RETURN_CODE 77)

# The build folder's kernel cache for tests. The suites that compile kernels to run them share
# it, so each kernel compiles once per build, and no test touches the user's cache; what the
# cache itself does is tested with caches of their own. FUSEDOPT_TEST_SHARED_CACHE is the
# library's own settings (suites whose kernels come from KernelCache::global(): the emulated
# GPU suite, every rank of the MPI and NCCL-emulated ones, the MPI benchmarks' smoke runs);
# FUSEDOPT_TEST_KERNEL_CACHE is read by the host suites' fixtures (common/host_tensors.cpp,
# common/kernel_cache.hpp).
set(FUSEDOPT_TEST_CACHE_DIR "${PROJECT_BINARY_DIR}/tests/shared-kernel-cache")
set(FUSEDOPT_TEST_SHARED_CACHE FUSEDOPT_CACHE=on "FUSEDOPT_CACHE_DIR=${FUSEDOPT_TEST_CACHE_DIR}")
set(FUSEDOPT_TEST_KERNEL_CACHE "FUSEDOPT_TEST_KERNEL_CACHE=${FUSEDOPT_TEST_CACHE_DIR}")

function(fusedopt_add_test_suite name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "SKIP_WHEN_ABSENT" "TIMEOUT;COST" "COMMAND;LABELS")
  if(NOT arg_COMMAND)
    message(FATAL_ERROR "fusedopt_add_test_suite(${name}): COMMAND is required")
  endif()
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT 1800)
  endif()
  add_test(NAME ${name} COMMAND ${arg_COMMAND})
  # Host kernels run under OpenMP; with two suites sharing the cores, spinning idle threads
  # only steal time from the other suite.
  set(env OMP_WAIT_POLICY=PASSIVE)
  if(arg_SKIP_WHEN_ABSENT)
    list(APPEND env FUSEDOPT_TEST_SKIP_RETURN_CODE=${FUSEDOPT_TEST_SKIP_RETURN_CODE})
    set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE ${FUSEDOPT_TEST_SKIP_RETURN_CODE})
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${arg_TIMEOUT} ENVIRONMENT "${env}")
  if(arg_COST)
    set_tests_properties(${name} PROPERTIES COST ${arg_COST})
  endif()
  if(arg_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${arg_LABELS}")
  endif()
endfunction()
