# cmake -DAGOQ_INFO=<agoq-info> -DDOC=<docs/configuration.md> -DMODE=check|write -P config_doc.cmake
# check: fail when DOC differs from `agoq-info -c --markdown`; write: regenerate DOC.
foreach(var AGOQ_INFO DOC MODE)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "config_doc.cmake: -D${var}=... is required")
  endif()
endforeach()

execute_process(
  COMMAND ${AGOQ_INFO} -c --markdown
  OUTPUT_VARIABLE generated
  ERROR_VARIABLE errors
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "'${AGOQ_INFO} -c --markdown' failed (${rc}): ${errors}")
endif()

if(MODE STREQUAL "write")
  file(WRITE ${DOC} "${generated}")
  message(STATUS "wrote ${DOC}")
elseif(MODE STREQUAL "check")
  if(NOT EXISTS ${DOC})
    message(FATAL_ERROR "${DOC} is missing; generate it with tools/gen-config-doc.sh <build dir>")
  endif()
  file(READ ${DOC} committed)
  if(NOT committed STREQUAL generated)
    file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/configuration.md.generated "${generated}")
    execute_process(COMMAND diff -u ${DOC} ${CMAKE_CURRENT_BINARY_DIR}/configuration.md.generated)
    message(FATAL_ERROR "docs/configuration.md is stale; regenerate with "
                        "tools/gen-config-doc.sh <build dir> (or build the config-doc target)")
  endif()
else()
  message(FATAL_ERROR "config_doc.cmake: MODE must be check or write, not '${MODE}'")
endif()
