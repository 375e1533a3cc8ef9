# A command whose output the documentation shows: runs it and compares what it prints with
# the file the docs copy (scripts/check-docs holds the docs to that file byte for byte).
#   cmake -DPROGRAM=<exe> -DSHOWN=<name shown for it> -DARGS=<arg;arg...> -DDIR=<working dir>
#         -DEXPECTED=<file> [-DEXIT=<code>] -P expect_output.cmake
# EXPECTED's first line is the command as the docs show it, "$ SHOWN ARG ARG...", and must
# be exactly that; the rest is the output (stdout and stderr merged, in the order printed).
# The exit code must be EXIT (default 0). Runs with FUSEDOPT_CACHE=memory.
if(NOT DEFINED EXIT)
  set(EXIT 0)
endif()
file(READ ${EXPECTED} expected)
string(FIND "${expected}" "\n" newline)
string(SUBSTRING "${expected}" 0 ${newline} shown_line)
math(EXPR rest_start "${newline} + 1")
string(SUBSTRING "${expected}" ${rest_start} -1 expected_output)
string(REPLACE ";" " " shown_args "${ARGS}")
if(NOT shown_line STREQUAL "$ ${SHOWN} ${shown_args}")
  message(FATAL_ERROR "${EXPECTED}: its first line is '${shown_line}', but the test runs "
                      "'$ ${SHOWN} ${shown_args}'")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env FUSEDOPT_CACHE=memory ${PROGRAM} ${ARGS}
                WORKING_DIRECTORY ${DIR} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE out)
if(NOT rc STREQUAL EXIT)
  message(FATAL_ERROR "'${SHOWN} ${shown_args}' exited ${rc}, not ${EXIT}:\n${out}")
endif()
if(NOT out STREQUAL expected_output)
  message(FATAL_ERROR "'${SHOWN} ${shown_args}' printed\n${out}\nand ${EXPECTED} says\n"
                      "${expected_output}")
endif()
message(STATUS "${shown_line}\n${out}(as ${EXPECTED} says)")
