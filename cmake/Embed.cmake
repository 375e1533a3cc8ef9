# fusedopt_embed(OUTPUT out.cpp FILES f... BASE dir): turns files into a table of
# (relative path, bytes) that fusedopt::embedded_file() looks up (src/embedded.hpp).
function(fusedopt_embed)
  cmake_parse_arguments(E "" "OUTPUT;BASE" "FILES" ${ARGN})
  # A CMake list would be split into separate shell words: pass it joined with '|'.
  string(REPLACE ";" "|" joined "${E_FILES}")
  add_custom_command(
    OUTPUT ${E_OUTPUT}
    COMMAND ${CMAKE_COMMAND} -DOUTPUT=${E_OUTPUT} -DBASE=${E_BASE} "-DFILES=${joined}"
            -P ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/EmbedScript.cmake
    DEPENDS ${E_FILES} ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/EmbedScript.cmake
    COMMENT "Embedding templates"
    VERBATIM)
endfunction()
