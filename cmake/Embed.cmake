# fusedopt_embed(OUTPUT out.cpp FILES f... BASE dir): turns files into a table of
# (relative path, bytes) that fusedopt::embedded_file() looks up (src/embedded.hpp).
function(fusedopt_embed)
  cmake_parse_arguments(E "" "OUTPUT;BASE" "FILES" ${ARGN})
  add_custom_command(
    OUTPUT ${E_OUTPUT}
    COMMAND ${CMAKE_COMMAND} -DOUTPUT=${E_OUTPUT} -DBASE=${E_BASE} "-DFILES=${E_FILES}"
            -P ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/EmbedScript.cmake
    DEPENDS ${E_FILES} ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/EmbedScript.cmake
    COMMENT "Embedding templates")
endfunction()
