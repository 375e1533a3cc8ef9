# A cache folder that cannot be used still trains: the program exits 0, its output matches
# EXPECT, and stderr says exactly once that kernels are kept in memory only.
#   cmake -DPROGRAM=<exe> [-DCACHE_DIR=<folder for FUSEDOPT_CACHE_DIR>] [-DEXPECT=<regex>]
#         -P one_warning.cmake
# examples/ runs train_user_rule with CACHE_DIR=/dev/null/fusedopt (a folder that cannot be
# created); tests/ runs degraded_readonly_cache, which makes its own 0500 folder.
set(env FUSEDOPT_CACHE=on)
if(DEFINED CACHE_DIR)
  list(APPEND env FUSEDOPT_CACHE_DIR=${CACHE_DIR})
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env ${env} ${PROGRAM}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "training failed with an unusable cache folder (exit ${rc}):\n${out}${err}")
endif()
string(REGEX MATCHALL "kept in memory only" warnings "${err}")
list(LENGTH warnings count)
if(NOT count EQUAL 1)
  message(FATAL_ERROR "expected one warning about the memory-only cache, got ${count}:\n${err}")
endif()
if(DEFINED EXPECT AND NOT out MATCHES "${EXPECT}")
  message(FATAL_ERROR "the output does not match '${EXPECT}':\n${out}")
endif()
message(STATUS "${out}trained with an unusable cache folder, one warning")
