# stepgraph as a CMake package: the libraries installed and exported as stepgraph::<name>
# targets, with stepgraphConfig.cmake and its version file, so that another project writes
#   find_package(stepgraph 0.2 REQUIRED)
#   target_link_libraries(app PRIVATE stepgraph::runtime)
# In this tree the same names are aliases, so code written against the package builds here.
# tools/package_test.sh installs a build and builds tests/package_consumer against it.
include(CMakePackageConfigHelpers)

# Library targets and their exported names (stepgraph_<name> -> stepgraph::<name>), one
# per room (README.md, Layout):
#   base, graph, dispatch   dtypes; the IR, builder, passes, planner; the executor, the CPU
#                           reference and the mock
#   capture                 capture policy (CUDA-graph capture with CUDA)
#   text                    tokenizers and chat templates
#   models                  Llama graphs, config.json, safetensors and GGUF loading
#   runtime                 the step runner and DecodeSession
#   c, session_c            the C ABI (libstepgraph_c.so, libstepgraph_session_c.so)
#   kernels, cuda           the CUDA kernels and dispatcher (builds with CUDA only)
set(_sg_package_targets stepgraph_base stepgraph_graph stepgraph_dispatch stepgraph_capture
                        stepgraph_text stepgraph_models stepgraph_runtime stepgraph_c
                        stepgraph_session_c)
if(STEPGRAPH_WITH_CUDA)
  list(APPEND _sg_package_targets stepgraph_kernels stepgraph_cuda)
endif()
foreach(_t IN LISTS _sg_package_targets)
  string(REGEX REPLACE "^stepgraph_" "" _name ${_t})
  set_target_properties(${_t} PROPERTIES EXPORT_NAME ${_name})
  add_library(stepgraph::${_name} ALIAS ${_t})
endforeach()

set(SG_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/stepgraph)
install(TARGETS ${_sg_package_targets} EXPORT stepgraphTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS stepgraph RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# include/stepgraph is the whole public API. The CUDA headers (CudaDispatch, capture) name
# cudart types and have no library behind them in a build without CUDA.
if(STEPGRAPH_WITH_CUDA)
  install(DIRECTORY include/stepgraph DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
          FILES_MATCHING PATTERN "*.h")
else()
  install(DIRECTORY include/stepgraph DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
          FILES_MATCHING PATTERN "*.h"
          PATTERN "cuda_dispatch.h" EXCLUDE PATTERN "cuda_graph.h" EXCLUDE)
endif()
install(EXPORT stepgraphTargets NAMESPACE stepgraph:: DESTINATION ${SG_INSTALL_CMAKEDIR})

set(SG_PACKAGE_WITH_CUDA ${STEPGRAPH_WITH_CUDA})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/stepgraphConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/stepgraphConfig.cmake
                              INSTALL_DESTINATION ${SG_INSTALL_CMAKEDIR})
# 0.x: a minor version may break the API, so only the same minor version is compatible.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/stepgraphConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/stepgraphConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/stepgraphConfigVersion.cmake
        DESTINATION ${SG_INSTALL_CMAKEDIR})
