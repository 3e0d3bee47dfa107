# SPDX-License-Identifier: Apache-2.0
# cmake -P script: configure, build and run the consumer project in one mode.
# Inputs: MODE, SOURCE_DIR (accel), WORK_DIR, BUILD_DIR (accel's, for find_package), CXX.
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "${what}: ok")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()
set(extra "")
if(MODE STREQUAL "find_package")
  run_step("install accel" "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${WORK_DIR}/prefix")
  set(extra "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix")
endif()
run_step("configure consumer (${MODE})" "${CMAKE_COMMAND}" -S "${SOURCE_DIR}/tests/package/consumer"
  -B "${WORK_DIR}/build" -DACCEL_CONSUME_MODE=${MODE} -DACCEL_SOURCE_DIR=${SOURCE_DIR}
  -DCMAKE_CXX_COMPILER=${CXX} -DACCEL_WITH_CUDA=${WITH_CUDA} -DACCEL_WITH_NCCL=${WITH_NCCL} ${extra})
run_step("build consumer" "${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
run_step("run consumer" "${WORK_DIR}/build/consumer")
if(NOT step_output MATCHES "consumer ok: process=0/1")
  message(FATAL_ERROR "consumer printed an unexpected line: ${step_output}")
endif()
