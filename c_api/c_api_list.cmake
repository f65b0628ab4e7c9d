# Reads the functions of a C ABI header (include/stepgraph/c_api/c_api.h, c_session.h) so that the
# header is the one list of them: every declaration of the form
#   STEPGRAPH_C_EXPORT|STEPGRAPH_C_HOST <return type> stepgraph_<name>(<params>) STEPGRAPH_C_NOEXCEPT;
# becomes one line of an X-macro file that the entry points, the tests and the header
# check expand:
#   <MACRO>(<CamelName>, <c_name>, <return type>, (<params>), (<argument names>))
# with <MACRO> the `export_macro` argument for STEPGRAPH_C_EXPORT and `host_macro` for
# STEPGRAPH_C_HOST. The names go to `names_var` (for the export check). The file is
# rewritten only when it changes, and the header is a configure dependency, so editing it
# regenerates the list.
function(sg_c_api_list header output export_macro host_macro names_var)
  if(NOT CMAKE_SCRIPT_MODE_FILE)
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${header}")
  endif()
  file(READ "${header}" text)
  # Comments out, then one line: declarations span several lines.
  string(REGEX REPLACE "//[^\n]*" "" text "${text}")
  string(REGEX REPLACE "/\\*([^*]|\\*+[^*/])*\\*+/" "" text "${text}")
  string(REGEX REPLACE "[ \t\r\n]+" " " text "${text}")
  # A ';' would split CMake's lists: each declaration ends in "@END" instead.
  string(REPLACE ";" "@END" text "${text}")
  string(REGEX MATCHALL "STEPGRAPH_C_(EXPORT|HOST) [^@#]*STEPGRAPH_C_NOEXCEPT@END" decls "${text}")
  set(lines "")
  set(names "")
  foreach(decl IN LISTS decls)
    if(NOT decl MATCHES "^STEPGRAPH_C_(EXPORT|HOST) (.*[ *])(stepgraph_[a-z0-9_]+) ?\\((.*)\\) STEPGRAPH_C_NOEXCEPT@END$")
      message(FATAL_ERROR "${header}: cannot read the declaration '${decl}'")
    endif()
    set(kind "${CMAKE_MATCH_1}")
    string(STRIP "${CMAKE_MATCH_2}" ret)
    set(name "${CMAKE_MATCH_3}")
    string(STRIP "${CMAKE_MATCH_4}" params)
    # Argument names: the last identifier of each parameter ("void" alone has none).
    set(args "")
    if(NOT params STREQUAL "void")
      string(REPLACE "," ";" param_list "${params}")
      foreach(p IN LISTS param_list)
        if(NOT p MATCHES "([A-Za-z_][A-Za-z0-9_]*) *$")
          message(FATAL_ERROR "${header}: ${name}: a parameter without a name: '${p}'")
        endif()
        list(APPEND args "${CMAKE_MATCH_1}")
      endforeach()
    endif()
    list(JOIN args ", " arg_text)
    # stepgraph_attention_workspace_bytes -> AttentionWorkspaceBytes
    string(REGEX REPLACE "^stepgraph_" "" short "${name}")
    string(REPLACE "_" ";" parts "${short}")
    set(camel "")
    foreach(part IN LISTS parts)
      string(SUBSTRING "${part}" 0 1 head)
      string(SUBSTRING "${part}" 1 -1 tail)
      string(TOUPPER "${head}" head)
      string(APPEND camel "${head}${tail}")
    endforeach()
    if(kind STREQUAL "HOST")
      set(macro "${host_macro}")
    else()
      set(macro "${export_macro}")
    endif()
    string(APPEND lines "${macro}(${camel}, ${name}, ${ret}, (${params}), (${arg_text}))\n")
    list(APPEND names "${name}")
  endforeach()
  if(NOT names)
    message(FATAL_ERROR "${header}: no STEPGRAPH_C_EXPORT declarations found")
  endif()
  get_filename_component(header_name "${header}" NAME)
  # Written beside, then copied only when different, so that nothing rebuilds needlessly.
  file(WRITE "${output}.new"
       "// Generated from ${header_name} by c_api/c_api_list.cmake; do not edit.\n${lines}")
  configure_file("${output}.new" "${output}" COPYONLY)
  set(${names_var} "${names}" PARENT_SCOPE)
endfunction()
