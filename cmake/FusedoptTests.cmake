# How every fusedopt test suite is registered with CTest; tests/skip_honesty checks these
# same rules from a nested project, so keep test properties here and nowhere else.
#
# A skip is never read from a test's output (no SKIP_REGULAR_EXPRESSION): a case that needs
# NVRTC or a device that is absent is skipped by doctest itself (tests/support/skip.hpp), and
# any failing case fails its suite.
#
#   fusedopt_add_test_suite(<name> COMMAND <exe> [<arg>...] [LABELS <label>...]
#                           [SKIP_WHEN_ABSENT] [TIMEOUT <seconds>] [COST <n>])
#
# COST: a rough run time in seconds, so that ctest -j starts the longest suites first even
# before it has timed them once.
#
# SKIP_WHEN_ABSENT (GPU-only suites): the suite's main exits with
# FUSEDOPT_TEST_SKIP_RETURN_CODE, which CTest reports as skipped, only when it ran no case
# at all because what they need is absent; after any failure it exits 1.

set(FUSEDOPT_TEST_SKIP_RETURN_CODE 77)

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
