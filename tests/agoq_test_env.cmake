# Tests must not depend on the caller's environment: an AGOQ_TRANSPORT=ib or NCCL_DEBUG=INFO
# in the shell that runs ctest must not change what a test sees.
#
# agoq_test_env_isolate() is called once, at the end of the top-level CMakeLists.txt, after
# every folder has registered its tests. It writes <build>/agoq-test-env.cmake, which
# removes from ctest's own environment, before any test starts:
#   - every AGOQ_* parameter (plugin/core/agoq_params.def, each row AGOQ_PARAM(ID, ...) is
#     AGOQ_<ID>) and the NCCL variable a row names as its fallback (7th argument);
#   - the variables of plugin/core/agoq_env_other.def that agoq itself reads: every NCCL_*
#     row (NCCL_DEBUG included) and each AGOQ_* row without '*' whose reader is not "never
#     the plugin" (AGOQ_DEBUG, AGOQ_PLUGIN_PATH);
#   - any other AGOQ_* name in neither table (a typo or a removed parameter, which the plugin
#     WARNs about on stderr).
# The switches of tests and tools (the other rows of agoq_env_other.def: AGOQ_TEST_*,
# AGOQ_IBV_EMU_*, AGOQ_ABI_*, AGOQ_COLLNET_DEVICE, AGOQ_UPDATE_GOLDEN, AGOQ_SKIP_*, ...) stay:
# they are how a developer asks for a test's variant.
# The names are parsed from the two tables at configure time, and editing either re-runs
# the configuration (CMAKE_CONFIGURE_DEPENDS), so the list follows the tables.
#
# How: the file is added to TEST_INCLUDE_FILES of the top-level build folder and of every
# folder that has tests, so ctest includes it while it reads the tests (from the top or
# from any one folder), and unset(ENV{...}) there removes the variables from ctest's process.
# Each test's environment is built from that process's afterwards: its own ENVIRONMENT,
# then its ENVIRONMENT_MODIFICATION (applied after ENVIRONMENT, CMake 3.25 documentation),
# so whatever a test sets itself is untouched and everything else it reads is unset.
# Not one ENVIRONMENT_MODIFICATION "NAME=unset:" per test: CMake 3.25 reads and sets a
# test's properties only in the folder that added it (get_property/set_property of TEST
# take a DIRECTORY only from CMake 3.28), so a walk from here cannot see the tests' own
# ENVIRONMENT nor add to it.

# agoq_test_env_names(<out-var>): the names to clear, sorted, parsed from the two tables.
function(agoq_test_env_names out)
  set(params ${PROJECT_SOURCE_DIR}/plugin/core/agoq_params.def)
  set(other ${PROJECT_SOURCE_DIR}/plugin/core/agoq_env_other.def)
  set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${params} ${other})
  set(names "")

  # AGOQ_PARAM(ID, TYPE, DEFAULT, MIN, MAX, CHOICES, NCCL_FALLBACK, DOC): the rows up to
  # NCCL_FALLBACK, which may span lines (DOC, last, is never matched: it may hold anything).
  file(READ ${params} text)
  string(REGEX REPLACE "[\r\n\t]" " " text "${text}")
  string(REGEX REPLACE ";" "," text "${text}")
  set(ws "[ ]*")
  set(arg "[^\",]+")
  set(str "\"[^\"]*\"")
  string(REGEX MATCHALL
         "AGOQ_PARAM\\(${ws}[A-Z0-9_]+${ws},${ws}${arg},${ws}${str}${ws},${ws}${arg},${ws}${arg},${ws}(NULL|${str})${ws},${ws}(NULL|${str})"
         rows "${text}")
  file(STRINGS ${params} heads REGEX "^AGOQ_PARAM\\(")
  list(LENGTH heads nheads)
  list(LENGTH rows nrows)
  if(nheads EQUAL 0 OR NOT nheads EQUAL nrows)
    message(FATAL_ERROR "agoq_test_env: ${params}: ${nheads} AGOQ_PARAM rows, ${nrows} parsed "
                        "(its row format changed: update tests/agoq_test_env.cmake)")
  endif()
  foreach(row IN LISTS rows)
    string(REGEX REPLACE "^AGOQ_PARAM\\(${ws}([A-Z0-9_]+).*" "AGOQ_\\1" name "${row}")
    list(APPEND names ${name})
    if(row MATCHES ",${ws}\"(NCCL_[A-Z0-9_]+)\"$")
      list(APPEND names ${CMAKE_MATCH_1})
    endif()
  endforeach()

  # AGOQ_ENV_OTHER("NAME", "READ_BY", DOC): NAME and READ_BY are on the row's first line.
  file(STRINGS ${other} lines REGEX "^AGOQ_ENV_OTHER\\(")
  set(keep "")
  foreach(line IN LISTS lines)
    if(NOT line MATCHES "^AGOQ_ENV_OTHER\\(${ws}\"([A-Z0-9_]+\\*?)\"${ws},${ws}\"([^\"]*)\"")
      message(FATAL_ERROR "agoq_test_env: ${other}: cannot read the row '${line}'")
    endif()
    set(name ${CMAKE_MATCH_1})
    set(reader ${CMAKE_MATCH_2})
    if(name MATCHES "^NCCL_" OR (NOT name MATCHES "\\*$" AND NOT reader MATCHES "never the plugin"))
      list(APPEND names ${name})
    elseif(name MATCHES "^AGOQ_")
      string(REPLACE "*" ".*" pattern "${name}")
      list(APPEND keep "${pattern}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES names)
  list(SORT names)
  list(JOIN keep "|" keep)
  set(${out} ${names} PARENT_SCOPE)
  set(${out}_KEEP "${keep}" PARENT_SCOPE)
endfunction()

# _agoq_test_env_dirs(<dir> <out-var>): <dir> and every folder below it, depth first.
function(_agoq_test_env_dirs dir out)
  set(all ${dir})
  get_property(subs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subs)
    _agoq_test_env_dirs(${sub} below)
    list(APPEND all ${below})
  endforeach()
  set(${out} ${all} PARENT_SCOPE)
endfunction()

function(agoq_test_env_isolate)
  agoq_test_env_names(names)
  set(file ${PROJECT_BINARY_DIR}/agoq-test-env.cmake)
  list(JOIN names "\n  " list)
  file(CONFIGURE OUTPUT ${file} @ONLY CONTENT [=[
# Generated by tests/agoq_test_env.cmake at configure time from plugin/core/agoq_params.def
# and plugin/core/agoq_env_other.def. ctest includes it (TEST_INCLUDE_FILES) while it reads
# the tests: the variables agoq reads are removed from ctest's own environment, so a test
# sees only what its ENVIRONMENT and ENVIRONMENT_MODIFICATION set, whatever the caller's
# shell holds.
foreach(name
  @list@)
  unset(ENV{${name}})
endforeach()
# Any other AGOQ_* name, except the switches of tests and tools.
execute_process(COMMAND "@CMAKE_COMMAND@" -E environment OUTPUT_VARIABLE agoq_env RESULT_VARIABLE agoq_rc)
if(agoq_rc EQUAL 0)
  string(REGEX MATCHALL "\nAGOQ_[A-Za-z0-9_]*=" agoq_env "\n${agoq_env}")
  foreach(name IN LISTS agoq_env)
    string(REGEX REPLACE "^\n(.*)=$" "\\1" name "${name}")
    if(NOT name MATCHES "^(@names_KEEP@)$")
      unset(ENV{${name}})
    endif()
  endforeach()
endif()
]=])
  # The top-level folder first (ctest from the top reads it before any other), then every
  # folder with tests (ctest run from inside one of them).
  _agoq_test_env_dirs(${PROJECT_SOURCE_DIR} dirs)
  set(ntests 0)
  foreach(dir IN LISTS dirs)
    get_property(tests DIRECTORY ${dir} PROPERTY TESTS)
    list(LENGTH tests n)
    math(EXPR ntests "${ntests} + ${n}")
    if(dir STREQUAL PROJECT_SOURCE_DIR OR n GREATER 0)
      set_property(DIRECTORY ${dir} APPEND PROPERTY TEST_INCLUDE_FILES ${file})
    endif()
  endforeach()
  list(LENGTH names nnames)
  message(STATUS "agoq: ${ntests} tests run without ${nnames} variables of the caller (${file})")
endfunction()
