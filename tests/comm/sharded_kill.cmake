# Runs tests/comm/sharded_kill.cpp twice under mpiexec (see there): the save job must die
# (rank 0 killed before the index is written), then the check job must load the previous
# checkpoint. -DPROGRAM= -DMPIEXEC= -DDIR= (the MPIEXEC_* flags come in FLAGS).
file(REMOVE_RECURSE ${DIR})
execute_process(COMMAND ${MPIEXEC} ${FLAGS} ${PROGRAM} save ${DIR}
                RESULT_VARIABLE save_rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(save_rc EQUAL 0)
  message(FATAL_ERROR "the save job was not killed:\n${out}\n${err}")
endif()
if(NOT EXISTS ${DIR}/index.safetensors)
  message(FATAL_ERROR "no committed checkpoint in ${DIR} after the job:\n${out}\n${err}")
endif()
execute_process(COMMAND ${MPIEXEC} ${FLAGS} ${PROGRAM} check ${DIR}
                RESULT_VARIABLE check_rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(REMOVE_RECURSE ${DIR})
if(NOT check_rc EQUAL 0)
  message(FATAL_ERROR "the previous checkpoint did not load:\n${out}\n${err}")
endif()
message(STATUS "save killed (rc ${save_rc}); ${out}")
