# Proves that a skip cannot hide a failure: configures tests/skip_honesty/project (the
# fixtures registered through cmake/FusedoptTests.cmake, as the real suites are), runs it
# with a nested ctest and asserts that the suites that print "[SKIP]" and then fail are
# reported failed while the one that ran nothing for an absence is reported skipped. Then
# asserts that no test of the real build reads skips from output (SKIP_REGULAR_EXPRESSION).
#
# cmake -DSOURCE_DIR=<repo> -DWORK_DIR=<dir> -DGENERATOR=<gen> -DLIES=<exe> -DABSENT=<exe>
#       -DMAIN_BUILD=<build dir> -P check.cmake

function(fail what)
  message(FATAL_ERROR "skip honesty: ${what}")
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
execute_process(
  COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}/tests/skip_honesty/project" -B "${WORK_DIR}"
          -G "${GENERATOR}" "-DFUSEDOPT_SOURCE_DIR=${SOURCE_DIR}" "-DLIES=${LIES}"
          "-DABSENT=${ABSENT}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  fail("the nested project did not configure:\n${out}")
endif()

execute_process(COMMAND "${CMAKE_CTEST_COMMAND}" --test-dir "${WORK_DIR}" --verbose
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
message("${out}")
if(rc EQUAL 0)
  fail("the nested ctest passed although two suites failed")
endif()
foreach(name lies_gpu lies_nvrtc)
  if(NOT out MATCHES "Test +#[0-9]+: ${name} [.]+[*]+Failed")
    fail("${name} printed [SKIP] and failed, but ctest did not report it failed")
  endif()
endforeach()
if(NOT out MATCHES "\\[SKIP\\] no CUDA device")
  fail("the lying case's [SKIP] line is not in the output (is the fixture still lying?)")
endif()
if(NOT out MATCHES "Test +#[0-9]+: absent_gpu [.]+[*]+Skipped")
  fail("absent_gpu ran nothing because of an absence, but ctest did not report it skipped")
endif()
if(NOT out MATCHES "\\[SKIP\\] every case of this suite needs something absent: the honesty")
  fail("the skipped case was not named with its reason")
endif()

# The real build: no test may turn output into a skip.
execute_process(COMMAND "${CMAKE_CTEST_COMMAND}" --test-dir "${MAIN_BUILD}" --show-only=json-v1
                RESULT_VARIABLE rc OUTPUT_VARIABLE json ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  fail("ctest --show-only=json-v1 failed on ${MAIN_BUILD}: ${err}")
endif()
string(JSON count LENGTH "${json}" tests)
if(count LESS 1)
  fail("no tests listed in ${MAIN_BUILD}")
endif()
math(EXPR last "${count} - 1")
foreach(i RANGE ${last})
  string(JSON name GET "${json}" tests ${i} name)
  string(JSON nprops ERROR_VARIABLE no_props LENGTH "${json}" tests ${i} properties)
  if(no_props)
    continue()
  endif()
  if(nprops GREATER 0)
    math(EXPR plast "${nprops} - 1")
    foreach(j RANGE ${plast})
      string(JSON prop GET "${json}" tests ${i} properties ${j} name)
      if(prop STREQUAL "SKIP_REGULAR_EXPRESSION")
        fail("test ${name} has SKIP_REGULAR_EXPRESSION: a failing case that prints [SKIP] "
             "would be reported skipped")
      endif()
    endforeach()
  endif()
endforeach()
message("skip honesty: ${count} tests checked, none reads skips from output")
