# fsdplab_warnings: the warning flags every target of the project links (INTERFACE only, not
# exported). fsdplab_sanitizers: the sanitizer chosen by FSDPLAB_SANITIZE.
add_library(fsdplab_warnings INTERFACE)
target_compile_options(fsdplab_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wnon-virtual-dtor -Wshadow
    -Wcast-align -Wunused -Woverloaded-virtual -Wimplicit-fallthrough -Wmisleading-indentation>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wduplicated-cond -Wlogical-op>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${FSDPLAB_WERROR}>>:-Werror>
  $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${FSDPLAB_WERROR}>>:-Werror=all-warnings>)
# Not in the sanitizer builds: at -O1 (TSan's), GCC's -Wnull-dereference flags simdjson's inlined
# headers (a false positive that depends on the optimisation level); the Release build keeps the
# warning, and the sanitizers check every dereference at run time.
if(NOT FSDPLAB_SANITIZE)
  target_compile_options(fsdplab_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-Wnull-dereference>)
endif()

add_library(fsdplab_sanitizers INTERFACE)
if(FSDPLAB_SANITIZE)
  target_compile_options(fsdplab_sanitizers INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${FSDPLAB_SANITIZE} -fno-omit-frame-pointer>)
  target_link_options(fsdplab_sanitizers INTERFACE -fsanitize=${FSDPLAB_SANITIZE})
  # UBSan reports and carries on by default: make a finding fail the test that hit it.
  if(FSDPLAB_SANITIZE MATCHES "undefined")
    target_compile_options(fsdplab_sanitizers INTERFACE
      $<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=undefined>)
  endif()
endif()
if(FSDPLAB_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "FSDPLAB_FUZZ needs clang (libFuzzer); the replay drivers build anywhere")
  endif()
  target_compile_options(fsdplab_sanitizers INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>)
endif()

# fsdplab_add_library(NAME ALIAS SOURCES ...): a component library with its public include dir.
function(fsdplab_add_library name alias)
  cmake_parse_arguments(ARG "" "" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(${name} ${ARG_SOURCES})
  add_library(fsdplab::${alias} ALIAS ${name})
  set_target_properties(${name} PROPERTIES EXPORT_NAME ${alias} POSITION_INDEPENDENT_CODE ON)
  target_include_directories(${name} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(${name} PUBLIC ${ARG_PUBLIC_DEPS}
    PRIVATE ${ARG_PRIVATE_DEPS} $<BUILD_INTERFACE:fsdplab_warnings>
    $<BUILD_INTERFACE:fsdplab_sanitizers>)
  install(TARGETS ${name} EXPORT fsdplabTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(DIRECTORY include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endfunction()
