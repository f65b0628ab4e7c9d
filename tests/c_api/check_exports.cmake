# Fails unless a C ABI library (libstepgraph_c, libstepgraph_session_c) exports exactly the
# functions of its header (c_api.h, c_session.h): the kernels, the core and any static
# library linked in must stay hidden, so that the library can sit beside another copy of
# stepgraph (or of its dependencies) in one process.
# The expected names are the list the build read from the header(s), one per line in
# NAMES_FILE.
# Usage: cmake -DNM=<nm> -DLIBRARY=<path> -DNAMES_FILE=<file> -P check_exports.cmake
execute_process(COMMAND ${NM} -D --defined-only ${LIBRARY}
                OUTPUT_VARIABLE listing RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} -D ${LIBRARY} failed (${rc})")
endif()
string(REPLACE "\n" ";" lines "${listing}")
file(STRINGS "${NAMES_FILE}" expected)
set(api "")
set(foreign "")
foreach(line IN LISTS lines)
  if(line MATCHES "^[0-9a-fA-F]* *[A-Za-z] +([^ ]+)$")
    set(name "${CMAKE_MATCH_1}")
    if(name MATCHES "^stepgraph_")
      list(APPEND api "${name}")
    elseif(NOT name MATCHES "^(_init|_fini|_edata|_end|__bss_start)$")  # from the linker
      list(APPEND foreign "${name}")
    endif()
  endif()
endforeach()
if(foreign)
  list(LENGTH foreign n)
  list(SUBLIST foreign 0 10 some)
  message(FATAL_ERROR "${LIBRARY} exports ${n} symbols beside the C ABI, e.g. ${some}")
endif()
set(missing ${expected})
list(REMOVE_ITEM missing ${api})
set(extra ${api})
list(REMOVE_ITEM extra ${expected})
if(missing OR extra)
  message(FATAL_ERROR "${LIBRARY}: not exported though declared: '${missing}'; exported "
                      "though not declared: '${extra}'")
endif()
list(LENGTH api n)
message(STATUS "${LIBRARY}: the ${n} declared stepgraph_ functions, nothing else")
