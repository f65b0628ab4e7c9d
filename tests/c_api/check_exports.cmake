# Fails unless libstepgraph_c exports exactly the functions of c_api.h: the kernels, the
# core and any static library linked in must stay hidden, so that the library can sit
# beside another copy of stepgraph (or of its dependencies) in one process.
# Usage: cmake -DNM=<nm> -DLIBRARY=<path> -DEXPECTED=<count> -P check_exports.cmake
execute_process(COMMAND ${NM} -D --defined-only ${LIBRARY}
                OUTPUT_VARIABLE listing RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} -D ${LIBRARY} failed (${rc})")
endif()
string(REPLACE "\n" ";" lines "${listing}")
set(api 0)
set(foreign "")
foreach(line IN LISTS lines)
  if(line MATCHES "^[0-9a-fA-F]* *[A-Za-z] +([^ ]+)$")
    set(name "${CMAKE_MATCH_1}")
    if(name MATCHES "^stepgraph_")
      math(EXPR api "${api} + 1")
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
if(NOT api EQUAL EXPECTED)
  message(FATAL_ERROR "${LIBRARY} exports ${api} stepgraph_ functions, c_api.h has ${EXPECTED}")
endif()
message(STATUS "${LIBRARY}: ${api} stepgraph_ functions, nothing else")
