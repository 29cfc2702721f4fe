# Installs the build tree into a fresh prefix, then configures, builds and runs an outside
# project that finds fsdplab with find_package and links fsdplab::core.
file(REMOVE_RECURSE "${WORK}")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${WORK}/prefix"
  RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed: ${rc}")
endif()
foreach(f bin/fsdplab include/fsdplab/core/scheduler.h share/fsdplab/python/fsdplab/__init__.py
    share/fsdplab/python/fsdplab/torch/recorder.py share/fsdplab/python/fsdplab/torch/apply.py)
  if(NOT EXISTS "${WORK}/prefix/${f}")
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()
# The installed package imports without its compiled extension (only a wheel has one), and
# says so when a function needs it.
find_program(python3 NAMES python3 REQUIRED)
execute_process(COMMAND "${CMAKE_COMMAND}" -E env
  "PYTHONPATH=${WORK}/prefix/share/fsdplab/python" "${python3}" -c
  "import fsdplab\ntry:\n  fsdplab.validate('t.json')\nexcept ImportError as e:\n  print(e)"
  WORKING_DIRECTORY "${WORK}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "fsdplab._fsdplab could not be imported")
  message(FATAL_ERROR "the installed fsdplab package did not import (${rc}):\n${out}\n${err}")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${WORK}/build"
  "-DCMAKE_PREFIX_PATH=${WORK}/prefix" -DCMAKE_BUILD_TYPE=Release
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the consumer failed:\n${out}\n${err}")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" --build "${WORK}/build"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building the consumer failed:\n${out}\n${err}")
endif()
execute_process(COMMAND "${WORK}/build/consumer" RESULT_VARIABLE rc OUTPUT_VARIABLE out)
# Registration order of a root with one child, printed by the installed library.
set(expected "forward:  model -> model.layers.0\nbackward: model -> model.layers.0\n")
if(NOT rc EQUAL 0 OR NOT out STREQUAL expected)
  message(FATAL_ERROR "consumer printed:\n${out}\nexpected:\n${expected}")
endif()
message(STATUS "installed fsdplab found and linked by an outside project")
