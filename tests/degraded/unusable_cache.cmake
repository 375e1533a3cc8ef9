# A cache folder that cannot be created still trains: the Optimizer falls back to the
# memory cache and says so once. Runs PROGRAM with FUSEDOPT_CACHE_DIR below a file.
#   cmake -DPROGRAM=<exe> -P unusable_cache.cmake
execute_process(COMMAND ${CMAKE_COMMAND} -E env FUSEDOPT_CACHE_DIR=/dev/null/fusedopt
                        FUSEDOPT_CACHE=on ${PROGRAM}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "training failed with an unusable cache folder (exit ${rc}):\n${out}${err}")
endif()
string(REGEX MATCHALL "kept in memory only" warnings "${err}")
list(LENGTH warnings count)
if(NOT count EQUAL 1)
  message(FATAL_ERROR "expected one warning about the memory-only cache, got ${count}:\n${err}")
endif()
if(NOT out MATCHES "loss [0-9.]+ -> 0[.]0000")
  message(FATAL_ERROR "training did not converge:\n${out}")
endif()
message(STATUS "trained with a memory-only cache, one warning")
