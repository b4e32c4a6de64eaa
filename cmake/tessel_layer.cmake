# tessel_layer(NAME SOURCES ... [DEPS layer...] [LIBS target...])
#
# Declares the static library tessel_<NAME> for src/tessel/<NAME>/. Its headers are exposed
# through a private include root, <build>/layer-include/<NAME>/tessel/<NAME> -> the source
# folder, so `#include "tessel/<NAME>/x.h"` resolves only in targets that link this layer
# (directly or through a layer above it). Including a header of a higher layer therefore
# fails to compile, which is how the layering of ARCHITECTURE.md is enforced.
function(tessel_layer name)
  cmake_parse_arguments(L "" "" "SOURCES;DEPS;LIBS" ${ARGN})
  set(root ${CMAKE_BINARY_DIR}/layer-include/${name})
  file(MAKE_DIRECTORY ${root}/tessel)
  if(NOT EXISTS ${root}/tessel/${name})
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/src/tessel/${name} ${root}/tessel/${name} SYMBOLIC)
  endif()
  add_library(tessel_${name} STATIC ${L_SOURCES})
  target_include_directories(tessel_${name} PUBLIC ${root})
  foreach(dep IN LISTS L_DEPS)
    target_link_libraries(tessel_${name} PUBLIC tessel_${dep})
  endforeach()
  target_link_libraries(tessel_${name} PUBLIC ${L_LIBS})
  add_library(tessel::${name} ALIAS tessel_${name})
endfunction()
