# Runs tests/comm/sharded_kill.cpp twice under mpiexec (see there): the save job must die
# (rank 0 killed before the index is written), then the check job must load the previous
# checkpoint; then the same through fusedopt-ckpt merge and split. -DPROGRAM= -DCKPT=
# -DMPIEXEC= -DDIR= -DPRELOAD= (the MPIEXEC_* flags come in FLAGS). PRELOAD is
# kill_at_index.cpp's library: the kill comes from the test, not from a hook in the library.
file(REMOVE_RECURSE ${DIR})
# A sanitizer runtime must come first in the library list unless told not to check.
execute_process(COMMAND ${CMAKE_COMMAND} -E env LD_PRELOAD=${PRELOAD}
                        "ASAN_OPTIONS=$ENV{ASAN_OPTIONS}:verify_asan_link_order=0"
                        ${MPIEXEC} ${FLAGS} ${PROGRAM} save ${DIR}
                RESULT_VARIABLE save_rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(save_rc EQUAL 0)
  message(FATAL_ERROR "the save job was not killed:\n${out}\n${err}")
endif()
if(NOT EXISTS ${DIR}/index.safetensors)
  message(FATAL_ERROR "no committed checkpoint in ${DIR} after the job:\n${out}\n${err}")
endif()
execute_process(COMMAND ${MPIEXEC} ${FLAGS} ${PROGRAM} check ${DIR}
                RESULT_VARIABLE check_rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT check_rc EQUAL 0)
  file(REMOVE_RECURSE ${DIR})
  message(FATAL_ERROR "the previous checkpoint did not load:\n${out}\n${err}")
endif()
message(STATUS "save killed (rc ${save_rc}); ${out}")
# The same checkpoint through fusedopt-ckpt: merged into one file, split again for the 2
# ranks, checked again.
execute_process(COMMAND ${CKPT} merge ${DIR} ${DIR}.safetensors RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "fusedopt-ckpt merge failed (${rc}):\n${out}\n${err}")
endif()
execute_process(COMMAND ${CKPT} split ${DIR}.safetensors ${DIR}-split --ranks 2 RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "fusedopt-ckpt split failed (${rc}):\n${out}\n${err}")
endif()
execute_process(COMMAND ${MPIEXEC} ${FLAGS} ${PROGRAM} check ${DIR}-split
                RESULT_VARIABLE check_rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(REMOVE_RECURSE ${DIR} ${DIR}-split)
file(REMOVE ${DIR}.safetensors)
if(NOT check_rc EQUAL 0)
  message(FATAL_ERROR "the merged and split checkpoint did not load:\n${out}\n${err}")
endif()
execute_process(COMMAND ${CKPT} split ${DIR}.safetensors ${DIR}-x RESULT_VARIABLE rc
                OUTPUT_QUIET ERROR_QUIET)
if(NOT rc EQUAL 2)
  message(FATAL_ERROR "fusedopt-ckpt with bad usage exited ${rc}, not 2")
endif()
message(STATUS "merged, split and loaded again: ${out}")
