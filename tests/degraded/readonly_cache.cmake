# A read-only cache folder still trains, with exactly one warning that kernels are kept in
# memory only. PROGRAM is tests/degraded/readonly_cache.cpp.
#   cmake -DPROGRAM=<exe> -P readonly_cache.cmake
execute_process(COMMAND ${PROGRAM} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "training failed with a read-only cache folder (exit ${rc}):\n${out}${err}")
endif()
string(REGEX MATCHALL "kept in memory only" warnings "${err}")
list(LENGTH warnings count)
if(NOT count EQUAL 1)
  message(FATAL_ERROR "expected one warning about the memory-only cache, got ${count}:\n${err}")
endif()
message(STATUS "${out}trained with a read-only cache folder, one warning")
